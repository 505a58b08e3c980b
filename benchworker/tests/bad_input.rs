//! The real `benchworker` binary on bad input: a clear message naming the
//! file, line and field, a non-zero exit, and no panic.

use std::path::Path;
use std::process::Command;

const HEADER: &str = "name,rows,dim,pooling_factor,bin_0,bin_1,bin_2,bin_3,bin_4,bin_5,bin_6,bin_7,bin_8,bin_9,bin_10,bin_11,bin_12,bin_13,bin_14,bin_15,bin_16";
const BINS: &str = "1,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0";

fn measure(dir: &Path, csv: &str, placement: &str) -> (bool, String) {
    let t = dir.join("tables.csv");
    let p = dir.join("plan.json");
    std::fs::write(&t, csv).unwrap();
    std::fs::write(&p, placement).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_benchworker"))
        .args(["measure", "--backend", "sim", "--tables"])
        .arg(&t)
        .arg("--placement")
        .arg(&p)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!stderr.contains("panicked"), "{stderr}");
    (out.status.success(), stderr)
}

const PLAN: &str =
    r#"{"devices": 2, "assignment": [{"table": "a", "device": 0}, {"table": "b", "device": 1}]}"#;

#[test]
fn bad_csv_fields_fail_with_file_line_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (format!("a,10,8,1,{BINS}\nb,-3,8,1,{BINS}"), ":3", "`rows`"),
        (format!("a,10,0,1,{BINS}\nb,10,8,1,{BINS}"), ":2", "`dim`"),
        (
            format!("a,10,8,NaN,{BINS}\nb,10,8,1,{BINS}"),
            ":2",
            "`pooling_factor`",
        ),
        (
            format!("a,10,8,1,{BINS}\nb,10,8,1,0.5,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0"),
            ":3",
            "bins sum",
        ),
        (
            format!("a,10,8,1,{BINS}\na,10,8,1,{BINS}"),
            ":3",
            "duplicate",
        ),
    ];
    for (body, line, field) in cases {
        let (ok, err) = measure(dir.path(), &format!("{HEADER}\n{body}\n"), PLAN);
        assert!(!ok, "accepted: {body}");
        assert!(err.contains(&format!("tables.csv{line}")), "{err}");
        assert!(err.contains(field), "{err}");
    }
}

#[test]
fn bad_placements_fail_with_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let csv = format!("{HEADER}\na,10,8,1,{BINS}\nb,10,8,1,{BINS}\n");
    let unknown = r#"{"devices": 2, "assignment": [{"table": "a", "device": 0}, {"table": "zz", "device": 1}]}"#;
    let (ok, err) = measure(dir.path(), &csv, unknown);
    assert!(
        !ok && err.contains("plan.json") && err.contains("unknown table `zz`"),
        "{err}"
    );
    let bad_device = r#"{"devices": 2, "assignment": [{"table": "a", "device": 0}, {"table": "b", "device": 9}]}"#;
    let (ok, err) = measure(dir.path(), &csv, bad_device);
    assert!(!ok && err.contains("assignment[1].device"), "{err}");
    let (ok, err) = measure(dir.path(), &csv, "{not json");
    assert!(!ok && err.contains("plan.json"), "{err}");
    let (ok, _) = measure(dir.path(), &csv, PLAN);
    assert!(ok, "a valid placement is measured");
}

/// `benchworker serve` with these arguments and a token in the environment.
fn serve(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_benchworker"))
        .args(["serve", "--learner", "tcp://127.0.0.1:9", "--wait-s", "1"])
        .args(args)
        .env("EMBSHARD_TOKEN", "t")
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn bad_group_arguments_fail_with_what_is_wrong() {
    let cases: [(&str, &str); 4] = [
        ("--group g", "--rank"),
        (
            "--backend sim --group g --rank 0 --group-gpus 1",
            "cuda backend",
        ),
        (
            "--backend cuda --group g --rank 2 --group-gpus 1,1",
            "rank 2 of a group of 2 ranks",
        ),
        (
            "--backend cuda --group g --rank 0 --group-gpus 4,0",
            "at least one",
        ),
    ];
    for (args, want) in cases {
        let (ok, err) = serve(&args.split(' ').collect::<Vec<_>>());
        assert!(!ok && err.contains(want), "{args}: {err}");
    }
}

#[test]
fn a_wait_no_duration_can_hold_fails_with_the_option_named() {
    for wait in ["1e20", "inf", "NaN", "0"] {
        let out = Command::new(env!("CARGO_BIN_EXE_benchworker"))
            .args(["serve", "--learner", "tcp://127.0.0.1:9", "--wait-s", wait])
            .env("EMBSHARD_TOKEN", "t")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{wait}");
        assert!(
            err.contains("--wait-s") && !err.contains("panicked"),
            "{wait}: {err}"
        );
    }
}

/// A table the CSV check accepts but whose weights no machine holds (2^40
/// rows of dim 65536, with a row cap that keeps them): the `cpu` backend
/// refuses it with what to lower, before allocating anything.
#[test]
fn a_cpu_measurement_too_large_for_memory_fails_with_what_to_lower() {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path().join("tables.csv");
    let p = dir.path().join("plan.json");
    let c = dir.path().join("config.toml");
    std::fs::write(&t, format!("{HEADER}\nhuge,1099511627776,65536,1,{BINS}\n")).unwrap();
    std::fs::write(
        &p,
        r#"{"devices": 1, "assignment": [{"table": "huge", "device": 0}]}"#,
    )
    .unwrap();
    std::fs::write(&c, "[cpu]\nmax_rows = 1099511627776\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_benchworker"))
        .args(["measure", "--backend", "cpu", "--tables"])
        .arg(&t)
        .arg("--placement")
        .arg(&p)
        .arg("--config")
        .arg(&c)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(
        err.contains("plan.json: cpu backend: ")
            && err.contains("`huge`")
            && err.contains("lower cpu.max_rows"),
        "{err}"
    );
}
