//! The learner's live status page (`learner train --status ADDR`): an HTTP
//! server on a thread of its own, with a tokio runtime and axum. Training
//! never waits for it: the threads that train publish snapshots over
//! `tokio::sync::watch` channels ([`StatusFeed`]), which keep only the
//! latest value, and the server reads them when asked.
//!
//! - `/`: an HTML page that polls `/status` and draws the curves and the
//!   peers (all inline: nothing fetched from elsewhere);
//! - `/status`: the snapshot as JSON;
//! - `/metrics`: the same in Prometheus' text format.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use axum::http::header;
use axum::response::{Html, IntoResponse};
use axum::routing::get;
use serde::Serialize;
use tokio::sync::watch;

use crate::train::Metrics;

/// Most curve points kept: past it, every other one is dropped, so a long
/// run's page stays small and still spans the whole run.
const MAX_POINTS: usize = 2000;

/// One metrics line, as the curves draw it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Point {
    pub step: usize,
    pub iteration: usize,
    pub policy_loss: f64,
    pub mean_reward: f64,
    pub cost_loss: Option<f64>,
    pub measured_ms: Option<f64>,
    pub predicted_ms: Option<f64>,
    pub measurements: usize,
    pub env_steps: usize,
    pub policy_lag: u64,
    pub elapsed_s: f64,
}

impl Point {
    pub fn of(m: &Metrics) -> Point {
        Point {
            step: m.step,
            iteration: m.iteration,
            policy_loss: m.policy.loss,
            mean_reward: m.policy.mean_reward,
            cost_loss: m.cost_loss,
            measured_ms: m.mean_measured_ms,
            predicted_ms: m.mean_predicted_ms,
            measurements: m.measurements,
            env_steps: m.env_steps,
            policy_lag: m.policy_lag,
            elapsed_s: m.elapsed_s,
        }
    }
}

/// A peer of the cluster, as the coordinator sees it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PeerView {
    /// `actor` or `benchworker`.
    pub role: String,
    pub id: u64,
    /// What it is doing: `acting`, `measuring job N`, `idle`, …
    pub state: String,
    /// Seconds since its last message.
    pub seen_s_ago: f64,
    /// Policy versions its weights are behind (actors).
    pub lag: Option<u64>,
}

/// What `/status` answers.
#[derive(Debug, Clone, Serialize)]
pub struct Snapshot {
    pub run: String,
    /// Policy updates the run will make in all.
    pub total_updates: u64,
    pub points: Vec<Point>,
    pub peers: Vec<PeerView>,
}

/// The publishing end, cloned into whatever trains: each call replaces
/// what the server will show next, and never waits for it.
#[derive(Clone, Debug)]
pub struct StatusFeed {
    points: Arc<watch::Sender<Vec<Point>>>,
    peers: Arc<watch::Sender<Vec<PeerView>>>,
}

impl StatusFeed {
    /// A metrics line: one more curve point.
    pub fn point(&self, m: &Metrics) {
        self.points.send_modify(|v| {
            v.push(Point::of(m));
            if v.len() > MAX_POINTS {
                let mut k = 0;
                v.retain(|_| {
                    k += 1;
                    k % 2 == 1
                });
            }
        });
    }

    /// The cluster's peers now.
    pub fn peers(&self, peers: Vec<PeerView>) {
        self.peers.send_replace(peers);
    }
}

/// What the server reads.
#[derive(Clone)]
struct Shared {
    run: String,
    total_updates: u64,
    points: watch::Receiver<Vec<Point>>,
    peers: watch::Receiver<Vec<PeerView>>,
}

impl Shared {
    fn snapshot(&self) -> Snapshot {
        Snapshot {
            run: self.run.clone(),
            total_updates: self.total_updates,
            points: self.points.borrow().clone(),
            peers: self.peers.borrow().clone(),
        }
    }
}

/// The running server; dropping it stops it.
pub struct StatusServer {
    pub addr: SocketAddr,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for StatusServer {
    fn drop(&mut self) {
        if let Some(s) = self.shutdown.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Where `--status` listens: `PORT` alone is on the loopback interface;
/// `HOST:PORT` binds that host (another interface only when asked).
pub fn listen_addr(arg: &str) -> anyhow::Result<SocketAddr> {
    let full = match arg.parse::<u16>() {
        Ok(port) => format!("127.0.0.1:{port}"),
        Err(_) => arg.to_string(),
    };
    full.parse().with_context(|| {
        format!("--status {arg}: give a port (on 127.0.0.1) or an address such as 0.0.0.0:8080")
    })
}

/// Starts the server on `addr` (port 0: any free one) for the run named
/// `run`, which makes `total_updates` policy updates in all.
pub fn serve(
    addr: SocketAddr,
    run: String,
    total_updates: u64,
) -> anyhow::Result<(StatusServer, StatusFeed)> {
    let listener = std::net::TcpListener::bind(addr)
        .with_context(|| format!("the status page cannot listen on {addr}"))?;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    let (points_tx, points) = watch::channel(Vec::new());
    let (peers_tx, peers) = watch::channel(Vec::new());
    let shared = Shared {
        run,
        total_updates,
        points,
        peers,
    };
    let (shutdown, stopped) = tokio::sync::oneshot::channel::<()>();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .context("starting the status page's runtime")?;
    let thread = std::thread::Builder::new()
        .name("status".into())
        .spawn(move || {
            runtime.block_on(async move {
                let app = router(shared);
                let listener = match tokio::net::TcpListener::from_std(listener) {
                    Ok(l) => l,
                    Err(e) => return tracing::warn!("the status page stopped: {e}"),
                };
                let served = axum::serve(listener, app)
                    .with_graceful_shutdown(async {
                        let _ = stopped.await;
                    })
                    .await;
                if let Err(e) = served {
                    tracing::warn!("the status page stopped: {e}");
                }
            })
        })?;
    let feed = StatusFeed {
        points: Arc::new(points_tx),
        peers: Arc::new(peers_tx),
    };
    let server = StatusServer {
        addr,
        shutdown: Some(shutdown),
        thread: Some(thread),
    };
    Ok((server, feed))
}

fn router(shared: Shared) -> axum::Router {
    let (a, b) = (shared.clone(), shared);
    axum::Router::new()
        .route("/", get(|| async { Html(PAGE) }))
        .route(
            "/status",
            get(move || async move { axum::Json(a.snapshot()) }),
        )
        .route(
            "/metrics",
            get(move || async move {
                (
                    [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
                    prometheus(&b.snapshot()),
                )
                    .into_response()
            }),
        )
}

/// The snapshot in Prometheus' text exposition format.
pub fn prometheus(s: &Snapshot) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let mut gauge = |name: &str, help: &str, value: Option<f64>| {
        if let Some(v) = value.filter(|v| v.is_finite()) {
            let _ = writeln!(out, "# HELP embshard_{name} {help}");
            let _ = writeln!(out, "# TYPE embshard_{name} gauge");
            let _ = writeln!(out, "embshard_{name} {v}");
        }
    };
    let last = s.points.last();
    gauge(
        "policy_updates",
        "Policy updates so far.",
        last.map(|p| p.step as f64),
    );
    gauge(
        "policy_updates_planned",
        "Policy updates the run makes in all.",
        Some(s.total_updates as f64),
    );
    gauge(
        "measurements",
        "Measured plans in the cost buffer.",
        last.map(|p| p.measurements as f64),
    );
    gauge(
        "env_steps",
        "Placement steps learned from.",
        last.map(|p| p.env_steps as f64),
    );
    gauge(
        "policy_loss",
        "The latest policy loss.",
        last.map(|p| p.policy_loss),
    );
    gauge(
        "cost_loss",
        "The latest cost-network loss.",
        s.points.iter().rev().find_map(|p| p.cost_loss),
    );
    gauge(
        "measured_ms",
        "Mean measured cost of the latest plans measured, ms.",
        s.points.iter().rev().find_map(|p| p.measured_ms),
    );
    gauge(
        "predicted_ms",
        "The cost network's prediction for those plans, ms.",
        s.points.iter().rev().find_map(|p| p.predicted_ms),
    );
    let _ = writeln!(out, "# HELP embshard_peers Peers connected, by role.");
    let _ = writeln!(out, "# TYPE embshard_peers gauge");
    for role in ["actor", "benchworker"] {
        let n = s.peers.iter().filter(|p| p.role == role).count();
        let _ = writeln!(out, "embshard_peers{{role=\"{role}\"}} {n}");
    }
    out
}

/// The page: it polls `/status` every two seconds and draws the curves as
/// SVG and the peers as a table.
const PAGE: &str = r##"<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>embshard learner</title>
<style>body{font-family:sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem}
svg{width:100%;height:auto;border:1px solid #ccc;margin:.5rem 0}
table{border-collapse:collapse}td,th{padding:.2rem .6rem;border-bottom:1px solid #ddd;text-align:left}</style>
</head><body>
<h1>embshard learner <code id="run"></code></h1>
<p id="progress">waiting for the first policy update…</p>
<h2>Curves</h2>
<div id="curves"></div>
<h2>Peers</h2>
<table id="peers"><thead><tr><th>role</th><th>id</th><th>state</th><th>seen (s ago)</th><th>policy lag</th></tr></thead><tbody></tbody></table>
<script>
const W = 640, H = 200, L = 56, B = 28, T = 24;
function chart(title, series) {
  const pts = series.flatMap(s => s.points);
  if (!pts.length) return `<p>${title}: nothing yet</p>`;
  const xs = pts.map(p => p[0]), ys = pts.map(p => p[1]);
  let [x0, x1, y0, y1] = [Math.min(...xs), Math.max(...xs), Math.min(...ys), Math.max(...ys)];
  if (x1 === x0) x1 = x0 + 1; if (y1 === y0) { y0 -= 1; y1 += 1; }
  const X = x => L + (x - x0) / (x1 - x0) * (W - L - 8), Y = y => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
  const colours = ['#1f77b4', '#d62728', '#2ca02c'];
  let svg = `<svg viewBox="0 0 ${W} ${H}" class="curve"><text x="${W / 2}" y="16" text-anchor="middle" font-weight="bold">${title}</text>`;
  svg += `<text x="${L - 4}" y="${T + 4}" text-anchor="end" font-size="10">${y1.toPrecision(4)}</text><text x="${L - 4}" y="${H - B}" text-anchor="end" font-size="10">${y0.toPrecision(4)}</text>`;
  svg += `<text x="${L}" y="${H - 8}" font-size="10">${x0}</text><text x="${W - 8}" y="${H - 8}" text-anchor="end" font-size="10">${x1} updates</text>`;
  series.forEach((s, i) => {
    const p = s.points.map(q => `${X(q[0]).toFixed(1)},${Y(q[1]).toFixed(1)}`).join(' ');
    svg += `<polyline fill="none" stroke="${colours[i]}" stroke-width="1.5" points="${p}"/>`;
    svg += `<text x="${L + 8}" y="${T + 12 + 12 * i}" font-size="11" fill="${colours[i]}">${s.name}</text>`;
  });
  return svg + '</svg>';
}
function series(points, name, key) {
  return { name, points: points.filter(p => p[key] !== null && isFinite(p[key])).map(p => [p.step, p[key]]) };
}
async function refresh() {
  try {
    const s = await (await fetch('/status')).json();
    document.getElementById('run').textContent = s.run;
    const last = s.points[s.points.length - 1];
    if (last) document.getElementById('progress').textContent =
      `update ${last.step}/${s.total_updates}, round ${last.iteration + 1}, ${last.measurements} measured plans, ${last.env_steps} env steps, ${last.elapsed_s.toFixed(0)} s`;
    document.getElementById('curves').innerHTML =
      chart('policy loss', [series(s.points, 'loss', 'policy_loss')]) +
      chart('cost-network loss', [series(s.points, 'loss', 'cost_loss')]) +
      chart('measured against predicted cost (ms)', [series(s.points, 'measured', 'measured_ms'), series(s.points, 'predicted', 'predicted_ms')]);
    document.querySelector('#peers tbody').innerHTML = s.peers.map(p =>
      `<tr class="peer"><td>${p.role}</td><td>${p.id}</td><td>${p.state}</td><td>${p.seen_s_ago.toFixed(1)}</td><td>${p.lag ?? ''}</td></tr>`).join('');
  } catch (e) {
    document.getElementById('progress').textContent = 'the learner does not answer: ' + e;
  }
}
refresh();
setInterval(refresh, 2000);
</script>
</body></html>
"##;

#[cfg(test)]
mod tests {
    use super::*;

    fn metrics(step: usize) -> Metrics {
        Metrics {
            step,
            iteration: step / 4,
            env_steps: 100 * step,
            measurements: 2 * step,
            cost_loss: (step % 2 == 0).then_some(0.5 / step as f64),
            mean_measured_ms: Some(10.0 + step as f64),
            mean_predicted_ms: Some(9.0 + step as f64),
            ..Default::default()
        }
    }

    /// Sends a GET for `path` and returns the body of the answer.
    pub(crate) fn get(addr: SocketAddr, path: &str) -> (String, String) {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        (head.to_string(), body.to_string())
    }

    /// Every sample line of a Prometheus text page, as (name with labels,
    /// value); a line that is neither a comment nor a sample fails.
    fn parse_prometheus(text: &str) -> Vec<(String, f64)> {
        text.lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .map(|l| {
                let (name, value) = l.rsplit_once(' ').unwrap_or_else(|| panic!("{l:?}"));
                let ok = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
                    && name
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || "_{}=\",".contains(c));
                assert!(ok, "a bad metric name: {l:?}");
                (name.to_string(), value.parse().unwrap())
            })
            .collect()
    }

    #[test]
    fn the_server_answers_what_the_feed_published() {
        let (server, feed) = serve("127.0.0.1:0".parse().unwrap(), "runs/x".into(), 40).unwrap();
        for step in 1..=5 {
            feed.point(&metrics(step));
        }
        feed.peers(vec![PeerView {
            role: "actor".into(),
            id: 3,
            state: "acting".into(),
            seen_s_ago: 0.2,
            lag: Some(1),
        }]);
        let (head, body) = get(server.addr, "/status");
        assert!(
            head.contains("200 OK") && head.contains("application/json"),
            "{head}"
        );
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["run"], "runs/x");
        assert_eq!(v["points"].as_array().unwrap().len(), 5);
        assert_eq!(v["peers"][0]["state"], "acting");
        let (head, body) = get(server.addr, "/metrics");
        assert!(head.contains("text/plain"), "{head}");
        let samples: std::collections::HashMap<String, f64> =
            parse_prometheus(&body).into_iter().collect();
        assert_eq!(samples["embshard_policy_updates"], 5.0);
        assert_eq!(samples["embshard_measurements"], 10.0);
        assert_eq!(samples["embshard_cost_loss"], 0.125);
        assert_eq!(samples["embshard_measured_ms"], 15.0);
        assert_eq!(samples["embshard_peers{role=\"actor\"}"], 1.0);
        assert_eq!(samples["embshard_peers{role=\"benchworker\"}"], 0.0);
        let (head, page) = get(server.addr, "/");
        assert!(head.contains("text/html") && page.contains("fetch('/status')"));
        assert!(!page.contains("http://") && !page.contains("https://"));
        let addr = server.addr;
        drop(server);
        assert!(
            std::net::TcpStream::connect(addr).is_err(),
            "stopped when dropped"
        );
    }

    #[test]
    fn a_long_run_keeps_a_bounded_curve_spanning_it() {
        let (_server, feed) = serve("127.0.0.1:0".parse().unwrap(), "r".into(), 1).unwrap();
        for step in 1..=5 * MAX_POINTS {
            feed.point(&metrics(step));
        }
        let points = feed.points.borrow();
        assert!(points.len() <= MAX_POINTS && points.len() > MAX_POINTS / 4);
        assert_eq!(points[0].step, 1);
        assert!(points.last().unwrap().step > 4 * MAX_POINTS);
    }

    #[test]
    fn status_listens_on_loopback_unless_told() {
        assert_eq!(
            listen_addr("8080").unwrap(),
            "127.0.0.1:8080".parse().unwrap()
        );
        assert_eq!(
            listen_addr("0.0.0.0:9").unwrap(),
            "0.0.0.0:9".parse().unwrap()
        );
        let e = listen_addr("example.com").unwrap_err().to_string();
        assert!(e.contains("give a port"), "{e}");
    }
}
