//! The live status page of a real `learner train --status 0`: `/metrics`
//! parsed, and `/` rendered by a real headless browser (chromium from
//! Debian's packages; `scripts/test.sh` installs it where it can), whose
//! DOM must hold the curves and the peers; then the run's `learner report`,
//! rendered the same way.

mod support;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use support::{small_run_config, train_args, wait_for};

/// Set to make a missing browser fail the test (`scripts/test.sh` sets it).
const REQUIRE: &str = "EMBSHARD_REQUIRE_BROWSER";
/// Set to a file: the test saves its screenshot of the page there.
const SHOT: &str = "EMBSHARD_STATUS_SHOT";
/// Set to a file: the test saves its screenshot of the run's report there.
const REPORT_SHOT: &str = "EMBSHARD_REPORT_SHOT";

fn get(addr: &str, path: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    text.split_once("\r\n\r\n").unwrap().1.to_string()
}

/// `url` in the headless browser `b`, its scripts run: the DOM, and a
/// screenshot of `size` saved where the variable `shot` says, else at
/// `fallback`.
fn render(b: &str, url: &str, size: (u32, u32), shot: &str, fallback: &Path) -> String {
    let flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--virtual-time-budget=5000",
    ];
    let dom = Command::new(b)
        .args(flags)
        .args(["--dump-dom", url])
        .output()
        .unwrap();
    let path = std::env::var(shot).map_or_else(|_| fallback.to_path_buf(), PathBuf::from);
    let out = Command::new(b)
        .args(flags)
        .arg("--hide-scrollbars")
        .arg(format!("--window-size={},{}", size.0, size.1))
        .arg(format!("--screenshot={}", path.display()))
        .arg(url)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(std::fs::metadata(&path).unwrap().len() > 10_000);
    String::from_utf8_lossy(&dom.stdout).into_owned()
}

fn browser() -> Option<&'static str> {
    ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .find(|b| {
            Command::new(b)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        })
}

#[test]
fn the_status_page_shows_curves_and_peers_in_a_browser() {
    let dir = tempfile::tempdir().unwrap();
    let (cfg, _) = small_run_config(dir.path(), 400);
    let run = dir.path().join("run");
    let mut args: Vec<&str> = train_args(&cfg, &run).to_vec();
    args.extend(["--status", "0", "--actors", "1", "--benchworkers", "1"]);
    let mut child = Command::new(env!("CARGO_BIN_EXE_learner"))
        .args(&args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let url_file = run.join("status");
    wait_for("the status page", Duration::from_secs(60), || {
        std::fs::read_to_string(&url_file).is_ok_and(|u| u.ends_with("/\n"))
    });
    let url = std::fs::read_to_string(&url_file)
        .unwrap()
        .trim()
        .to_string();
    let addr = url
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    assert!(
        addr.starts_with("127.0.0.1:"),
        "loopback unless told: {addr}"
    );
    wait_for(
        "a few updates and both peers",
        Duration::from_secs(60),
        || {
            let m = get(&addr, "/metrics");
            let value = |name: &str| {
                m.lines()
                    .find_map(|l| l.strip_prefix(name)?.trim().parse::<f64>().ok())
                    .unwrap_or(0.0)
            };
            value("embshard_policy_updates ") >= 3.0
                && value("embshard_peers{role=\"actor\"}") >= 1.0
                && value("embshard_peers{role=\"benchworker\"}") >= 1.0
        },
    );
    // Every sample line of /metrics parses: a name, labels, a number.
    let metrics = get(&addr, "/metrics");
    for line in metrics.lines().filter(|l| !l.starts_with('#')) {
        let (name, value) = line.rsplit_once(' ').unwrap();
        assert!(name.starts_with("embshard_"), "{line}");
        assert!(value.parse::<f64>().is_ok(), "{line}");
    }
    let status: serde_json::Value = serde_json::from_str(&get(&addr, "/status")).unwrap();
    assert!(status["points"].as_array().unwrap().len() >= 3);

    match browser() {
        Some(b) => {
            let dom = render(b, &url, (1000, 1300), SHOT, &dir.path().join("status.png"));
            assert!(dom.matches("<polyline").count() >= 3, "curves drawn: {dom}");
            assert!(
                dom.contains("class=\"peer\"") && dom.contains("benchworker"),
                "{dom}"
            );
            assert!(dom.contains("measured plans"), "{dom}");
        }
        None => {
            assert!(
                std::env::var_os(REQUIRE).is_none(),
                "{REQUIRE} is set and no chromium"
            );
            eprintln!("no headless browser (chromium): the page's rendering is not checked");
        }
    }
    let _ = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status();
    child.wait().unwrap();

    // The run's report, rendered by the same browser.
    let (ok, stdout, err) = support::learner(&["report", run.to_str().unwrap()]);
    assert!(ok, "{err}");
    let page = format!("file://{}", stdout.trim());
    if let Some(b) = browser() {
        let dom = render(
            b,
            &page,
            (1100, 2600),
            REPORT_SHOT,
            &dir.path().join("report.png"),
        );
        assert!(dom.matches("<svg").count() >= 5, "charts drawn: {dom}");
        assert!(dom.contains("compute (fwd + bwd)"), "{dom}");
    }
}
