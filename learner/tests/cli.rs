//! The real `learner` binary: generate then eval end to end, and a suite
//! whose tasks cannot fit memory refused with a clear message.

use std::process::Command;

fn learner(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_learner"))
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!stderr.contains("panicked"), "{stderr}");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string(),
        stderr,
    )
}

#[test]
fn generate_then_eval_reports_every_method_as_json() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.toml");
    std::fs::write(
        &cfg,
        "[generate]\ntables = 200\n[data]\ntrain_tasks = 2\ntest_tasks = 3\nsuites = [{ tables = 20, devices = 4, memory_gb = 5.0 }]\n[eval]\nsearch_budget = 200\n",
    )
    .unwrap();
    let out = dir.path().join("data");
    let (ok, stdout, err) = learner(&[
        "generate",
        "--config",
        cfg.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert!(stdout.contains("unique rows used once"), "{stdout}");
    let suite = out.join("dlrm-20x4.test.json");
    let (ok, stdout, err) = learner(&[
        "eval",
        "--config",
        cfg.to_str().unwrap(),
        "--suite",
        suite.to_str().unwrap(),
        "--methods",
        "all",
        "--json",
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    for m in [
        "random",
        "round_robin",
        "size",
        "dim",
        "lookup",
        "size_lookup",
        "torchrec",
        "search",
    ] {
        let r = &v["methods"][m];
        assert_eq!(r["per_task_ms"].as_array().unwrap().len(), 3, "{m}");
        assert!(r["failures"].is_u64(), "{m}");
    }
}

#[test]
fn a_suite_that_cannot_fit_memory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let bins = "1,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0";
    std::fs::write(
        dir.path().join("pool.csv"),
        format!(
            "name,rows,dim,pooling_factor,bin_0,bin_1,bin_2,bin_3,bin_4,bin_5,bin_6,bin_7,bin_8,bin_9,bin_10,bin_11,bin_12,bin_13,bin_14,bin_15,bin_16\nbig,100000000,128,1,{bins}\n"
        ),
    )
    .unwrap();
    let suite = dir.path().join("s.json");
    std::fs::write(
        &suite,
        r#"{"pool": "pool.csv", "tasks": [{"name": "t0", "devices": 2, "memory_gb": 1.0, "tables": ["big"]}]}"#,
    )
    .unwrap();
    let (ok, _, err) = learner(&["eval", "--suite", suite.to_str().unwrap()]);
    assert!(!ok);
    assert!(
        err.contains("s.json") && err.contains("t0") && err.contains("cannot fit memory"),
        "{err}"
    );
    let (ok, _, err) = learner(&[
        "eval",
        "--suite",
        suite.to_str().unwrap(),
        "--methods",
        "best",
    ]);
    assert!(!ok && err.contains("unknown method `best`"), "{err}");
}

#[test]
fn train_then_plan_writes_a_placement_of_every_table() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let cfg = dir.path().join("c.toml");
    std::fs::write(
        &cfg,
        format!(
            "[generate]\ntables = 120\n[data]\ndir = {data:?}\ntrain_tasks = 4\ntest_tasks = 2\nsuites = [{{ tables = 12, devices = 3, memory_gb = 50.0 }}]\n[train]\nsuite = {:?}\niterations = 2\nmeasure_per_iteration = 3\ncost_steps = 5\npolicy_steps = 2\nepisodes = 4\n",
            data.join("dlrm-12x3.train.json")
        ),
    )
    .unwrap();
    let cfg = cfg.to_str().unwrap();
    let (ok, _, err) = learner(&["generate", "--config", cfg]);
    assert!(ok, "{err}");
    let run = dir.path().join("run");
    let (ok, _, err) = learner(&["train", "--config", cfg, "--run-dir", run.to_str().unwrap()]);
    assert!(ok, "{err}");
    let metrics = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    assert_eq!(metrics.lines().count(), 2);
    let last: serde_json::Value = serde_json::from_str(metrics.lines().last().unwrap()).unwrap();
    assert_eq!(last["measurements"], 6);

    let pool = data.join("pool.test.csv");
    let (ok, stdout, err) = learner(&[
        "plan",
        "--tables",
        pool.to_str().unwrap(),
        "--devices",
        "8",
        "--memory-gb",
        "64",
        "--checkpoint",
        run.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let placement: common::Placement = serde_json::from_str(&stdout).unwrap();
    let tables = common::pool::read(&pool).unwrap();
    let plan = placement.resolve(&tables, &pool).unwrap();
    assert_eq!(plan.devices, 8);
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v["estimate"]["devices"].as_array().unwrap().len(), 8);

    let (ok, stdout, err) = learner(&[
        "plan",
        "--tables",
        pool.to_str().unwrap(),
        "--devices",
        "8",
        "--memory-gb",
        "64",
        "--checkpoint",
        run.to_str().unwrap(),
        "--format",
        "torchrec",
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v["world_size"], 8);
    assert_eq!(v["ranks"].as_object().unwrap().len(), tables.len());

    let (ok, _, err) = learner(&[
        "plan",
        "--tables",
        pool.to_str().unwrap(),
        "--devices",
        "2",
        "--memory-gb",
        "0.001",
        "--checkpoint",
        run.to_str().unwrap(),
    ]);
    assert!(!ok && err.contains("cannot fit memory"), "{err}");
    let (ok, _, err) = learner(&[
        "plan",
        "--tables",
        pool.to_str().unwrap(),
        "--devices",
        "2",
        "--memory-gb",
        "64",
        "--checkpoint",
        dir.path().to_str().unwrap(),
    ]);
    assert!(!ok && err.contains("config.toml"), "{err}");
}
