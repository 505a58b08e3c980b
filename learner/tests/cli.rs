//! The real `learner` binary: generate then eval end to end, suites that
//! cannot fit memory or be measured refused with a clear message, train
//! then plan, pretrain then fine-tune. Stopping and resuming is in
//! `resume.rs`.

mod support;

use support::{
    append, eval_methods, eval_methods_with, learner, learner_in, small_run_config, train_args,
};

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

/// `DIR/pool.csv` of cold tables (each row read once a batch), given as
/// `(name, rows, dim, pooling)`, each line ended by `eol`.
fn write_cold_pool(dir: &std::path::Path, tables: &[(&str, u64, u32, f64)], eol: &str) {
    let mut text = common::pool::header().join(",") + eol;
    for (name, rows, dim, pooling) in tables {
        text += &format!("{name},{rows},{dim},{pooling},1{}{eol}", ",0".repeat(16));
    }
    std::fs::write(dir.join("pool.csv"), text).unwrap();
}

/// `PATH`: a suite of one task, "t", over `DIR/pool.csv`, started by a
/// byte-order mark when `bom`.
fn write_one_task_suite(
    path: &std::path::Path,
    devices: usize,
    memory_gb: f64,
    tables: &[&str],
    bom: bool,
) {
    let suite = serde_json::json!({"pool": "pool.csv", "tasks": [
        {"name": "t", "devices": devices, "memory_gb": memory_gb, "tables": tables}
    ]});
    let mark = if bom { "\u{feff}" } else { "" };
    std::fs::write(path, format!("{mark}{suite}")).unwrap();
}

#[test]
fn a_suite_that_cannot_fit_memory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    write_cold_pool(dir.path(), &[("big", 100_000_000, 128, 1.0)], "\n");
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
fn an_eval_where_no_method_fits_any_task_fails_after_its_table() {
    // Three equal tables, two devices with room for one and a half each:
    // the total fits, so the suite loads, but no placement does.
    let dir = tempfile::tempdir().unwrap();
    let equal = [
        ("t0", 1_000_000, 64, 1.0),
        ("t1", 1_000_000, 64, 1.0),
        ("t2", 1_000_000, 64, 1.0),
    ];
    write_cold_pool(dir.path(), &equal, "\r\n");
    let table_gb = common::MemoryModel::default()
        .table_bytes(&common::Table::cold("t0", 1_000_000, 64, 1.0)) as f64
        / common::table::BYTES_PER_GB;
    let suite = dir.path().join("s.json");
    // Written by an editor that starts files with a byte-order mark.
    let names = ["t0", "t1", "t2"];
    write_one_task_suite(&suite, 2, 1.5 * table_gb, &names, true);
    let (ok, out, err) = learner(&[
        "eval",
        "--suite",
        suite.to_str().unwrap(),
        "--methods",
        "lookup,torchrec",
    ]);
    assert!(!ok, "{out}");
    assert!(out.contains("lookup") && out.contains("1/1"), "{out}");
    assert!(
        err.contains("nothing was measured on") && err.contains("s.json"),
        "{err}"
    );
    // With room for two tables on a device, the same files evaluate.
    write_one_task_suite(&suite, 2, 2.5 * table_gb, &names, true);
    let (ok, out, err) = learner(&[
        "eval",
        "--suite",
        suite.to_str().unwrap(),
        "--methods",
        "lookup",
    ]);
    assert!(ok, "{err}");
    assert!(out.contains("0/1"), "{out}");
}

#[test]
fn a_suite_the_oracle_cannot_measure_fails_eval_after_the_others_are_evaluated() {
    // On the `cpu` backend a table of 100000 lookups per sample draws
    // more lookups than one measurement may: every plan of `bad.json`
    // fails; `good.json` (two small tables) measures.
    let dir = tempfile::tempdir().unwrap();
    let tables = [
        ("hot", 1000, 8, 100_000.0),
        ("a", 1000, 8, 1.0),
        ("b", 1000, 8, 1.0),
    ];
    write_cold_pool(dir.path(), &tables, "\n");
    let suite = |name: &str, tables: &[&str]| {
        let p = dir.path().join(name);
        write_one_task_suite(&p, 2, 1.0, tables, false);
        p.to_str().unwrap().to_string()
    };
    let bad = suite("bad.json", &["hot", "a"]);
    let good = suite("good.json", &["a", "b"]);
    let (ok, out, err) = learner(&[
        "eval",
        "--backend",
        "cpu",
        "--suite",
        &bad,
        "--suite",
        &good,
        "--methods",
        "lookup",
    ]);
    assert!(!ok, "{out}");
    assert!(
        out.contains("good.json") && !out.contains("bad.json"),
        "{out}"
    );
    assert!(
        err.contains("nothing was measured on") && err.contains("bad.json (the oracle"),
        "{err}"
    );
}

#[test]
fn train_then_plan_writes_a_placement_of_every_table() {
    let dir = tempfile::tempdir().unwrap();
    let (cfg, data) = small_run_config(dir.path(), 2);
    let cfg = cfg.to_str().unwrap();
    let run = dir.path().join("run");
    let (ok, _, err) = learner(&["train", "--config", cfg, "--run-dir", run.to_str().unwrap()]);
    assert!(ok, "{err}");
    let metrics = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    assert_eq!(metrics.lines().count(), 6, "one line per policy update");
    let last: serde_json::Value = serde_json::from_str(metrics.lines().last().unwrap()).unwrap();
    assert_eq!(last["measurements"], 6);
    // The run keeps its oracle, in its config.toml: a resume on another
    // would mix measurements.
    let config = std::fs::read_to_string(run.join("config.toml")).unwrap();
    assert!(config.contains("backend = \"sim\""), "{config}");
    assert!(!run.join("backend").exists());
    let run_str = run.to_str().unwrap();
    let (ok, _, err) = learner(&[
        "train",
        "--run-dir",
        run_str,
        "--resume",
        "--backend",
        "cpu",
    ]);
    assert!(
        !ok && err.contains("measures with the sim backend"),
        "{err}"
    );
    assert_eq!(
        metrics,
        std::fs::read_to_string(run.join("metrics.jsonl")).unwrap()
    );
    // A finished run resumed says so, and learns nothing more.
    let (ok, said, err) = learner(&["train", "--run-dir", run_str, "--resume"]);
    assert!(ok, "{err}");
    assert!(err.contains("has already run all 2 iterations"), "{err}");
    assert!(
        said.starts_with("nothing to train") && !said.contains("env steps"),
        "{said}"
    );
    assert_eq!(
        metrics,
        std::fs::read_to_string(run.join("metrics.jsonl")).unwrap()
    );

    let pool = data.join("pool.test.csv");
    let plan_with = |devices: &str, memory_gb: &str, run: &std::path::Path, extra: &[&str]| {
        let mut args = vec![
            "plan",
            "--tables",
            pool.to_str().unwrap(),
            "--devices",
            devices,
            "--memory-gb",
            memory_gb,
            "--checkpoint",
            run.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        learner(&args)
    };
    let (ok, stdout, err) = plan_with("8", "64", &run, &[]);
    assert!(ok, "{err}");
    let placement: common::Placement = serde_json::from_str(&stdout).unwrap();
    let tables = common::pool::read(&pool).unwrap();
    let plan = placement.resolve(&tables, &pool).unwrap();
    assert_eq!(plan.devices, 8);
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v["estimate"]["devices"].as_array().unwrap().len(), 8);
    // Trained on 4 tables per device: 7.5 is far out, and said; 3.75 is not.
    assert!(
        err.contains("7.5 per device") && err.contains("trained on 4.0 (12 tables on 3 devices)"),
        "{err}"
    );
    let (ok, stdout, err) = plan_with("16", "64", &run, &[]);
    assert!(ok && !err.contains("per device"), "{err}");
    assert_no_negative_time(&stdout);
    let (ok, _, err) = eval_methods(&data.join("dlrm-12x3.test.json"), &run, "lookup,policy");
    assert!(ok && !err.contains("far outside"), "{err}");
    // The report: one page, charts inline, the evaluation in it.
    let (ok, stdout, err) = learner(&["report", run.to_str().unwrap()]);
    assert!(ok, "{err}");
    let html = std::fs::read_to_string(stdout.trim()).unwrap();
    assert!(html.starts_with("<!DOCTYPE html>") && html.matches("<svg").count() >= 5);
    assert!(html.contains("dlrm-12x3.test-sim") && html.contains("compute (fwd + bwd)"));
    assert!(!html.contains("src=\"http") && !html.contains("href=\"http"));
    let (ok, _, err) = learner(&["report", dir.path().to_str().unwrap()]);
    assert!(!ok && err.contains("holds no run"), "{err}");
    // The run keeps the evaluation: the table and the JSON.
    let saved = run.join("eval").join("dlrm-12x3.test-sim.json");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&saved).unwrap()).unwrap();
    assert!(v["methods"]["policy"].is_object() && v["methods"]["lookup"].is_object());
    let table = std::fs::read_to_string(saved.with_extension("txt")).unwrap();
    assert!(table.contains("policy"), "{table}");
    // A suite of 12 tables on one device, three times the density: said,
    // when the policy is among the methods.
    let dense = one_device_suite(&data, &tables[..12]);
    let (ok, _, err) = eval_methods(&dense, &run, "lookup,policy");
    assert!(
        ok && err.contains("1 of its 1 tasks lie far outside"),
        "{err}"
    );
    let (ok, _, err) = eval_methods(&dense, &run, "lookup");
    assert!(ok && !err.contains("far outside"), "{err}");

    let out = dir.path().join("plan.torchrec.json");
    let (ok, _, err) = plan_with(
        "8",
        "64",
        &run,
        &["--format", "torchrec", "--out", out.to_str().unwrap()],
    );
    assert!(ok, "{err}");
    let written = std::fs::read_to_string(&out).unwrap();
    assert!(
        written.ends_with("}\n"),
        "a text file ends its last line: {written:?}"
    );
    let v: serde_json::Value = serde_json::from_str(&written).unwrap();
    assert_eq!(v["world_size"], 8);
    assert_eq!(v["ranks"].as_object().unwrap().len(), tables.len());

    let (ok, _, err) = plan_with("2", "0.001", &run, &[]);
    assert!(!ok && err.contains("cannot fit memory"), "{err}");
    let (ok, _, err) = plan_with("2", "64", dir.path(), &[]);
    assert!(!ok && err.contains("config.toml"), "{err}");
    let (ok, stdout, err) = plan_with("8", "64", &run, &["--json"]);
    assert!(ok && stdout.starts_with('{'), "{err}");
    // One checkpoint's folder instead of the run's: said so.
    let one = learner::checkpoint::list(&run).remove(0);
    let (ok, _, err) = plan_with("8", "64", &one, &[]);
    assert!(!ok && err.contains("one checkpoint of a run"), "{err}");
    // A run whose config.toml no longer matches its networks: an error
    // saying why, not a damaged checkpoint.
    let edited = dir.path().join("edited");
    copy_with_narrower_policy(&run, &one, &edited);
    let (ok, _, err) = plan_with("8", "64", &edited, &[]);
    assert!(
        !ok && err.contains("intact but does not load")
            && err.contains("do not fit the run's [model] settings")
            && !err.contains("damaged"),
        "{err}"
    );
}

/// No time in a plan's estimate is negative, on a device left empty
/// either.
fn assert_no_negative_time(placement: &str) {
    let v: serde_json::Value = serde_json::from_str(placement).unwrap();
    for d in v["estimate"]["devices"].as_array().unwrap() {
        for phase in ["fwd_ms", "bwd_ms", "bwd_comm_ms"] {
            assert!(d[phase].as_f64().unwrap() >= 0.0, "{d}");
        }
    }
}

/// A suite in `data` of one task: `tables` (of `pool.test.csv`) on one
/// device.
fn one_device_suite(data: &std::path::Path, tables: &[common::Table]) -> std::path::PathBuf {
    let names: Vec<&str> = tables.iter().map(|t| t.name.as_str()).collect();
    let path = data.join("dense.json");
    std::fs::write(
        &path,
        serde_json::json!({"pool": "pool.test.csv", "tasks": [
            {"name": "dense", "devices": 1, "memory_gb": 1000.0, "tables": names}
        ]})
        .to_string(),
    )
    .unwrap();
    path
}

/// A run folder `to` holding checkpoint `one` of `run` under a
/// config.toml whose policy is narrower than its networks.
fn copy_with_narrower_policy(run: &std::path::Path, one: &std::path::Path, to: &std::path::Path) {
    let config = std::fs::read_to_string(run.join("config.toml")).unwrap();
    let narrower = config.replace("policy_table_out = 32", "policy_table_out = 16");
    assert_ne!(narrower, config);
    let name = one.file_name().unwrap();
    let into = to.join("checkpoints").join(name);
    std::fs::create_dir_all(&into).unwrap();
    std::fs::write(to.join("config.toml"), narrower).unwrap();
    for f in std::fs::read_dir(one).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, into.join(f.file_name().unwrap())).unwrap();
    }
}

#[test]
fn pretrain_then_fine_tune_then_plan_verified_on_sim() {
    let dir = tempfile::tempdir().unwrap();
    let (cfg, data) = small_run_config(dir.path(), 1);
    let pre_cfg = dir.path().join("pre.toml");
    std::fs::write(
        &pre_cfg,
        "[cluster]\nactors = 0\nbenchworkers = 0\n[pretrain]\ntasks = 6\nplans_per_task = 12\ncost_steps = 20\n[pretrain.space]\ndevices_max = 4\nper_device_max = 4\n[model]\ncost_members = 2\n[train]\ncost_loss = \"relative\"\niterations = 1\nmeasure_per_iteration = 2\ncost_steps = 3\npolicy_steps = 2\nepisodes = 4\n",
    )
    .unwrap();
    let pre = dir.path().join("pre");
    let (ok, stdout, err) = learner(&[
        "pretrain",
        "--config",
        pre_cfg.to_str().unwrap(),
        "--run-dir",
        pre.to_str().unwrap(),
        "--threads",
        "1",
    ]);
    assert!(ok, "{err}");
    assert!(stdout.contains("held-out relative error"), "{stdout}");
    assert!(stdout.contains("on 1 libtorch thread;"), "{stdout}");
    // Six tasks hold none out (every 20th is): said so, not a NaN.
    assert!(err.contains("holds out no task"), "{err}");
    assert!(
        stdout.contains("none (no task held out)") && !stdout.contains("NaN"),
        "{stdout}"
    );
    assert!(pre.join("stage1/checkpoints").is_dir() && pre.join("data/pretrain.json").is_file());
    // A second start on the same folder is refused; a resume of a finished
    // run has nothing left to do.
    let (ok, _, err) = learner(&[
        "pretrain",
        "--config",
        pre_cfg.to_str().unwrap(),
        "--run-dir",
        pre.to_str().unwrap(),
    ]);
    assert!(!ok && err.contains("--resume"), "{err}");
    let pre_shapes = model::shapes::TrainedShapes::read(&pre).unwrap();

    // Fine-tuning takes the pre-trained networks and their layer sizes.
    let tuned = dir.path().join("tuned");
    let (ok, _, err) = learner(&[
        "train",
        "--config",
        cfg.to_str().unwrap(),
        "--run-dir",
        tuned.to_str().unwrap(),
        "--init",
        pre.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert!(err.contains("starting from the networks of"), "{err}");
    let written = common::config::Config::load_run(&tuned.join("config.toml")).unwrap();
    assert_eq!(written.model.cost_members, 2, "the initial model's [model]");
    assert!(written
        .train
        .init
        .as_deref()
        .is_some_and(|p| p.ends_with("pre")));
    // Judged by its own training tasks (12 tables on 3 devices), not the
    // pre-training's.
    let shapes = model::shapes::TrainedShapes::read(&tuned).unwrap();
    assert_eq!((shapes.tables, shapes.devices), ([12, 12], [3, 3]));
    assert_ne!(shapes, pre_shapes);
    // --init on a folder that holds no run: named.
    let (ok, _, err) = learner(&[
        "train",
        "--config",
        cfg.to_str().unwrap(),
        "--run-dir",
        dir.path().join("other").to_str().unwrap(),
        "--init",
        data.to_str().unwrap(),
    ]);
    assert!(!ok && err.contains("train.init"), "{err}");

    let pool = data.join("pool.test.csv");
    let (ok, stdout, err) = learner(&[
        "plan",
        "--tables",
        pool.to_str().unwrap(),
        "--devices",
        "4",
        "--memory-gb",
        "64",
        "--checkpoint",
        tuned.to_str().unwrap(),
        "--verify",
        "sim",
    ]);
    assert!(ok, "{err}");
    assert!(
        err.contains("--verify sim") && err.contains("against the best heuristic"),
        "{err}"
    );
    // The log names how many basins joined; the JSON lists that many.
    let basins: usize = err
        .split(" of them `basin`: other ends of `plan`'s searches")
        .next()
        .and_then(|head| head.rsplit(", ").next())
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no count of basins in: {err}"));
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let candidates = v["candidates"].as_array().unwrap();
    assert_eq!(
        candidates.iter().filter(|c| c["method"] == "basin").count(),
        basins,
        "{v}"
    );
    assert!(basins > 0, "this seeded task has other basins: {err}");
    assert!(
        v.as_object().unwrap().contains_key("narrow_win") && v["narrow_win"].is_null(),
        "a measured choice is no narrow win: {v}"
    );
    assert!(candidates.len() >= 4, "{v}");
    let measured: Vec<f64> = candidates
        .iter()
        .map(|c| c["measured_ms"].as_f64().unwrap())
        .collect();
    let chosen = candidates
        .iter()
        .position(|c| c["method"] == v["method"])
        .unwrap();
    assert_eq!(
        measured[chosen],
        measured.iter().copied().fold(f64::INFINITY, f64::min),
        "the measured best is returned"
    );
}

/// A bad --devices or --memory-gb is named before anything is said of
/// the CSV (here: its missing columns).
#[test]
fn plan_names_a_bad_argument_before_the_csv() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("t.csv");
    std::fs::write(&csv, "name,rows,dim\na,1000,16\nb,2000,32\n").unwrap();
    let run = |devices: &str, memory: &str| {
        learner(&[
            "plan",
            "--tables",
            csv.to_str().unwrap(),
            "--devices",
            devices,
            "--memory-gb",
            memory,
        ])
    };
    for (devices, memory, says) in [
        ("2", "0", "--memory-gb must be a positive number"),
        ("2", "-1", "--memory-gb must be a positive number"),
        ("0", "16", "'--devices <DEVICES>': must be 1 or more"),
        ("100000", "16", "--devices must lie in"),
    ] {
        let (ok, _, err) = run(devices, memory);
        assert!(!ok && err.contains(says), "{devices} {memory}: {err}");
        assert!(!err.contains("no pooling_factor"), "{err}");
    }
    let (ok, _, err) = run("2", "16");
    assert!(ok && err.contains("no pooling_factor"), "{err}");
}

/// Memory is counted with the model's precision and optimizer unless
/// `--precision` and `--optimizer` say otherwise, and the summary says
/// which.
#[test]
fn plan_counts_memory_with_the_precision_and_optimizer_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("big.csv");
    // 10^8 rows of dim 64: 12.3 GiB at fp16 with rowwise Adagrad, 71.5 at
    // fp32 with Adam.
    std::fs::write(&csv, "name,rows,dim\nbig,100000000,64\nsmall,1000,16\n").unwrap();
    let args = |extra: &[&str]| plan_tables(&csv, "2", "16", extra);
    let (ok, _, err) = args(&[]);
    assert!(ok, "{err}");
    assert!(
        err.contains("memory counts fp16 weights and rowwise_adagrad state"),
        "{err}"
    );
    let (ok, _, err) = args(&["--precision", "fp32", "--optimizer", "adam"]);
    assert!(!ok && err.contains("cannot fit memory"), "{err}");
    assert!(err.contains("--precision fp32"), "{err}");
    let (ok, _, err) = args(&["--optimizer", "adam"]);
    assert!(!ok && err.contains("cannot fit memory"), "{err}");
    let (ok, _, err) = args(&["--precision", "fp64"]);
    assert!(!ok && err.contains("expected fp16 or fp32"), "{err}");
}

/// `learner plan --tables CSV --devices D --memory-gb M`, then `extra`.
fn plan_tables(
    csv: &std::path::Path,
    devices: &str,
    memory_gb: &str,
    extra: &[&str],
) -> (bool, String, String) {
    let mut a = vec![
        "plan",
        "--tables",
        csv.to_str().unwrap(),
        "--devices",
        devices,
        "--memory-gb",
        memory_gb,
    ];
    a.extend_from_slice(extra);
    learner(&a)
}

/// A heuristic asked for by --method that finds no room says what packs:
/// first-fit decreasing's figure, and whether the default method (which
/// starts from that packing) places the tables at the memory given.
#[test]
fn a_heuristic_that_finds_no_room_names_what_packs() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("tight.csv");
    // 22 M rows of dim 64 on 2 devices: 2.705 GiB in all; first-fit
    // decreasing by bytes packs them at 1.476 GiB per device.
    std::fs::write(
        &csv,
        "name,rows,dim\na,5000000,64\nb,5000000,64\nc,4000000,64\nd,4000000,64\n\
         e,4000000,64\n",
    )
    .unwrap();
    let plan = |memory: &str, extra: &[&str]| plan_tables(&csv, "2", memory, extra);
    let (ok, _, err) = plan("1.476", &["--method", "size"]);
    assert!(!ok && err.contains("`size` found no placement"), "{err}");
    assert!(err.contains("packs them at 1.476 GiB"), "{err}");
    assert!(err.contains("default `--method policy`"), "{err}");
    let (ok, _, err) = plan("1.476", &[]);
    assert!(ok, "{err}");
    // Where nothing fits, the error says so for every method at once.
    let (ok, _, err) = plan("1.4", &["--method", "size"]);
    assert!(!ok && err.contains("at 1.476 GiB per device"), "{err}");
    assert!(!err.contains("--method policy"), "{err}");
}

/// A user who knows only `name,rows,dim`: one command places the tables
/// with the shipped model, prints a summary per device, and with
/// --compare --verify sim every candidate measured beside the chosen one;
/// --method picks a heuristic. The estimate's devices read as a
/// measurement's.
#[test]
fn three_columns_are_enough_to_place_and_compare() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("mine.csv");
    std::fs::write(
        &csv,
        "name,rows,dim\nuser,20000000,64\nitem,5000000,128\ncountry,200,16\nage,100,8\n\
         category,50000,32\nbrand,300000,32\n",
    )
    .unwrap();
    let with = |extra: &[&str]| plan_tables(&csv, "3", "16", extra);
    let (ok, stdout, err) = with(&["--compare", "--verify", "sim"]);
    assert!(ok, "{err}");
    assert!(
        err.contains("no pooling_factor and no reuse bins") && err.contains("pool-from-trace.py"),
        "{err}"
    );
    assert!(
        err.contains("<- bottleneck") && err.contains("memory GiB (cap)"),
        "{err}"
    );
    assert!(
        err.contains("candidates on these tables (measured"),
        "{err}"
    );
    for method in ["policy", "torchrec", "lookup", "size"] {
        assert!(
            err.contains(&format!("  {method} ")),
            "{method} not in {err}"
        );
    }
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let devices = v["estimate"]["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 3);
    let fields: Vec<&String> = devices[0].as_object().unwrap().keys().collect();
    assert_eq!(
        fields,
        ["bwd_comm_ms", "bwd_ms", "fwd_comm_ms", "fwd_ms", "total_ms"]
    );
    // The largest predicted total is the composed iteration cost.
    let total = |d: &serde_json::Value| d["total_ms"].as_f64().unwrap();
    let slowest = devices.iter().map(total).fold(0.0, f64::max);
    assert!(slowest > 0.0);
    let (ok, stdout, err) = with(&["--method", "round_robin"]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v["method"], "round_robin");
    let rr: Vec<u64> = v["assignment"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["device"].as_u64().unwrap())
        .collect();
    assert_eq!(rr.len(), 6);
    for list in ["lookup,size", "all"] {
        let (ok, _, err) = with(&["--method", list]);
        assert!(
            !ok && err.contains("one method, not a list; give one of random, ")
                && !err.contains("or all"),
            "{err}"
        );
    }
}

/// `--measurements N` spreads a budget over the configured rounds: a
/// budget that does not split evenly is refused with the nearest ones that
/// do, one that does is what the run measures, and a resumed run keeps
/// its own.
#[test]
fn a_measurement_budget_is_spread_over_the_rounds() {
    let dir = tempfile::tempdir().unwrap();
    let (cfg, _) = small_run_config(dir.path(), 2);
    let run = dir.path().join("run");
    let train = |extra: &[&str]| {
        let mut a = vec![
            "train",
            "--config",
            cfg.to_str().unwrap(),
            "--run-dir",
            run.to_str().unwrap(),
            "--actors",
            "0",
            "--benchworkers",
            "0",
        ];
        a.extend_from_slice(extra);
        learner(&a)
    };
    // Negative counts are named as such, not taken for flags.
    let (ok, _, err) = train(&["--measurements", "-5"]);
    assert!(
        !ok && err.contains("'-5' for '--measurements <N>': must be 1 or more"),
        "{err}"
    );
    let (ok, _, err) = learner(&[&train_args(&cfg, &run)[..], &["--actors", "-1"]].concat());
    assert!(
        !ok && err.contains("'-1' for '--actors <ACTORS>': must be 0 or more"),
        "{err}"
    );
    let (ok, _, err) = train(&["--measurements", "7"]);
    assert!(!ok && err.contains("give 6 or 8"), "{err}");
    let (ok, _, err) = train(&["--measurements", "1"]);
    assert!(!ok && err.contains("give at least 2"), "{err}");
    // The largest budget has no multiple above it; a huge one that splits
    // is over a round's bound.
    let (ok, _, err) = train(&["--measurements", &u64::MAX.to_string()]);
    assert!(
        !ok && err.contains("give 18446744073709551614, or"),
        "{err}"
    );
    let (ok, _, err) = train(&["--measurements", "2000000000000"]);
    assert!(!ok && err.contains("must lie in 1..=1000000"), "{err}");
    let pretrain = |extra: &[&str]| {
        let mut a = vec![
            "pretrain",
            "--config",
            cfg.to_str().unwrap(),
            "--run-dir",
            run.to_str().unwrap(),
        ];
        a.extend_from_slice(extra);
        learner(&a)
    };
    let (ok, _, err) = pretrain(&["--measurements", "10"]);
    assert!(!ok && err.contains("drop --measurements"), "{err}");
    assert!(!run.exists(), "a refused run leaves no folder");
    // --threads is pretrain's: train refuses it, and none is not a count.
    let (ok, _, err) = train(&["--threads", "2"]);
    assert!(!ok && err.contains("drop --threads"), "{err}");
    assert!(!run.exists(), "a refused run leaves no folder");
    let (ok, _, err) = pretrain(&["--threads", "0"]);
    assert!(!ok && err.contains("must be 1 or more"), "{err}");
    let (ok, _, err) = pretrain(&["--threads", "5000000000"]);
    assert!(!ok && err.contains("more than libtorch takes"), "{err}");
    assert!(!run.exists(), "a refused run leaves no folder");
    // The config measures 3 a round; the budget makes it 5.
    let (ok, out, err) = train(&["--measurements", "10"]);
    assert!(ok, "{err}");
    assert!(out.contains("10 measurements"), "{out}");
    assert!(
        err.contains("5 in each of 2 rounds; 3 of a round's"),
        "{err}"
    );
    let log = learner::costlog::CostLog::read(&run.join("cost_buffer.jsonl")).unwrap();
    assert_eq!(log.samples.len(), 10);
    let resolved = std::fs::read_to_string(run.join("config.toml")).unwrap();
    assert!(resolved.contains("measure_per_iteration = 5"), "{resolved}");
    let (ok, _, err) = learner(&[
        "train",
        "--resume",
        run.to_str().unwrap(),
        "--measurements",
        "4",
    ]);
    assert!(!ok && err.contains("drop --measurements"), "{err}");
}

/// `learner train` of `cfg` into `run` with an actor and a benchworker
/// thread, which must fail: its error output.
fn refused_cluster_train(cfg: &std::path::Path, run: &std::path::Path) -> String {
    let args = train_args(cfg, run);
    let cluster = [&args[..], &["--actors", "1", "--benchworkers", "1"]].concat();
    let (ok, _, err) = learner(&cluster);
    assert!(!ok, "{err}");
    err
}

#[test]
fn a_cluster_its_actors_cannot_roll_out_for_is_refused_before_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let (cfg, _) = small_run_config(dir.path(), 2);
    // 12 tables on 3 devices: an unroll of 40,000 episodes fits a frame;
    // on the 6 devices of a copy at half the density it does not.
    let text = std::fs::read_to_string(&cfg).unwrap().replace(
        "episodes = 4\n",
        "episodes = 40000\nreshape_copies = 1\nreshape_density = [0.5, 0.5]\n",
    );
    std::fs::write(&cfg, text).unwrap();
    let run = dir.path().join("run");
    let err = refused_cluster_train(&cfg, &run);
    assert!(
        err.contains("actors cannot roll out this run's tasks: rollout task 4 (`")
            && err.contains("(reshaped 0)`) (12 tables on 6 devices)")
            && err.contains("train.episodes = 40000")
            && err.contains("train.reshape_density")
            && err.contains("A run alone"),
        "{err}"
    );
    assert!(!run.exists(), "a refused run leaves no folder");
    // Pre-training's stage 2 runs on the cluster too: refused before stage
    // 1 measures anything (16 tables on 4 devices here: 138 MB of floats).
    let pre_cfg = dir.path().join("pre.toml");
    std::fs::write(
        &pre_cfg,
        "[pretrain]\ntasks = 6\nplans_per_task = 12\ncost_steps = 20\n[pretrain.space]\ndevices_min = 4\ndevices_max = 4\nper_device_min = 4\nper_device_max = 4\n[train]\nepisodes = 65536\n",
    )
    .unwrap();
    let (ok, _, err) = learner(&[
        "pretrain",
        "--config",
        pre_cfg.to_str().unwrap(),
        "--run-dir",
        run.to_str().unwrap(),
        "--actors",
        "1",
        "--benchworkers",
        "1",
    ]);
    assert!(
        !ok && err.contains("actors cannot roll out this run's tasks: rollout task ")
            && err.contains("train.episodes = 65536"),
        "{err}"
    );
    assert!(!run.exists(), "a refused pre-training leaves no folder");
}

#[test]
fn a_cluster_whose_networks_no_message_can_carry_is_refused_before_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let (cfg, _) = small_run_config(dir.path(), 2);
    // A cost table MLP of 21 → 65,536 → 256: about 73 MB of weights,
    // over the 64 MiB a message may have.
    append(
        &cfg,
        "[model]\ncost_table_hidden = 65536\ncost_table_out = 256\n",
    );
    let run = dir.path().join("run");
    let err = refused_cluster_train(&cfg, &run);
    assert!(
        err.contains("no peer could join this run: the networks' weights")
            && err.contains("MiB on the wire, more than the 64 MiB")
            && err.contains("A run alone"),
        "{err}"
    );
    assert!(!run.exists(), "a refused run leaves no folder");
}

/// Two runs of other seeds place together: `plan` says whose choice won
/// and lists both runs' learned plans; a run given twice, or one that
/// counts memory otherwise, is refused; `eval` of both saves into neither.
#[test]
fn two_runs_place_together() {
    let dir = tempfile::tempdir().unwrap();
    let (cfg, data) = small_run_config(dir.path(), 1);
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    let train_seed = |run: &std::path::Path, seed: &str| {
        let mut args = train_args(&cfg, run).to_vec();
        args.extend(["--seed", seed]);
        let (ok, _, err) = learner(&args);
        assert!(ok, "{err}");
        common::config::Config::load_run(&run.join("config.toml")).unwrap()
    };
    assert_eq!(train_seed(&a, "0").train.seed, 0);
    assert_eq!(train_seed(&b, "1").train.seed, 1);
    let (ok, _, err) = learner(&["train", "--resume", b.to_str().unwrap(), "--seed", "2"]);
    assert!(!ok && err.contains("--seed sets a new run's seed"), "{err}");
    let pool = data.join("pool.test.csv");
    let plan = |runs: &[&std::path::Path], extra: &[&str]| {
        let mut args = vec![
            "plan",
            "--tables",
            pool.to_str().unwrap(),
            "--devices",
            "4",
            "--memory-gb",
            "64",
            "--compare",
        ];
        for r in runs {
            args.extend(["--run", r.to_str().unwrap()]);
        }
        args.extend_from_slice(extra);
        learner(&args)
    };
    let (ok, stdout, err) = plan(&[&a, &b], &[]);
    assert!(ok, "{err}");
    assert!(
        err.contains("2 runs placed together: the plan is ") && err.contains("by all 2 members"),
        "{err}"
    );
    assert!(
        err.contains("policy (2)") && err.contains("proposed by the N-th --run"),
        "{err}"
    );
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let candidates = v["candidates"].as_array().unwrap();
    for run in [&a, &b] {
        let run = run.to_str().unwrap();
        assert!(
            candidates
                .iter()
                .any(|c| c["method"] == "policy" && c["run"] == run),
            "{v}"
        );
    }
    let members = |c: &serde_json::Value| c["predicted_ms_members"].as_array().unwrap().len();
    assert!(candidates.iter().all(|c| members(c) == 2), "{v}");
    // A learned plan won by under 6 % is called narrow in the log and the
    // JSON alike, against a candidate of the task.
    assert!(v.as_object().unwrap().contains_key("narrow_win"), "{v}");
    let narrow = &v["narrow_win"];
    assert_eq!(
        narrow.is_null(),
        !err.contains("within its error on tables it did not train on"),
        "{err}\n{v}"
    );
    if !narrow.is_null() {
        assert_eq!(v["method"], "policy", "{v}");
        let rival = narrow["rival"].as_str().unwrap();
        assert!(candidates.iter().any(|c| c["method"] == rival), "{v}");
        let lowest = narrow["predicted_change_pct"][0].as_f64().unwrap();
        assert!(
            err.contains(&format!("{lowest:+.1} % to")) && err.contains(&format!("`{rival}`'s")),
            "the log gives the JSON's figures: {err}\n{v}"
        );
    }
    let (ok, _, err) = plan(&[&a, &a], &[]);
    assert!(!ok && err.contains("is given twice"), "{err}");
    // Runs placed together must price the same memory.
    let fp32 = dir.path().join("fp32");
    train_seed(&fp32, "1");
    let config = fp32.join("config.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    assert!(text.contains("precision = \"fp16\""), "{text}");
    std::fs::write(
        &config,
        text.replace("precision = \"fp16\"", "precision = \"fp32\""),
    )
    .unwrap();
    let (ok, _, err) = plan(&[&a, &fp32], &[]);
    assert!(
        !ok && err.contains("learned its costs with another memory (fp32 weights"),
        "{err}"
    );
    // eval: both runs' `policy`, saved into neither.
    let suite = data.join("dlrm-12x3.test.json");
    let (ok, stdout, err) = learner(&[
        "eval",
        "--suite",
        suite.to_str().unwrap(),
        "--methods",
        "lookup,policy",
        "--json",
        "--run",
        a.to_str().unwrap(),
        "--run",
        b.to_str().unwrap(),
    ]);
    assert!(ok && err.contains("places with 2 runs together"), "{err}");
    let v: serde_json::Value = serde_json::from_str(stdout.lines().next().unwrap()).unwrap();
    assert!(
        v["methods"]["policy"]["mean_cost_ms"].as_f64().unwrap() > 0.0,
        "{v}"
    );
    assert!(!a.join("eval").exists() && !b.join("eval").exists());
    // Another search than a run's own: said, with the run's own, and the
    // results are not saved into it; with its own, they are.
    let own = common::config::Config::load_run(&a.join("config.toml"))
        .unwrap()
        .model
        .plan_search;
    let eval_a = |plans: usize| {
        let plans = plans.to_string();
        eval_methods_with(&suite, &a, "lookup,policy", &["--plan-search", &plans])
    };
    let (ok, _, err) = eval_a(own + 1000);
    assert!(
        ok && err.contains(&format!("searches predicts up to {} plans", own + 1000))
            && err.contains(&format!("(the run's own: {own})"))
            && err.contains("not saved into the run"),
        "{err}"
    );
    assert!(!a.join("eval").exists());
    let (ok, _, err) = eval_a(own);
    assert!(ok && !err.contains("not saved"), "{err}");
    assert!(a.join("eval").join("dlrm-12x3.test-sim.json").exists());
    // A report it can write only halfway (its JSON cannot be written):
    // the earlier table goes first, so no table outlives its JSON.
    let saved = a.join("eval").join("dlrm-12x3.test-sim.json");
    let table = a.join("eval").join("dlrm-12x3.test-sim.txt");
    assert!(table.exists());
    std::fs::remove_file(&saved).unwrap();
    std::fs::create_dir(&saved).unwrap();
    let (ok, _, err) = eval_a(own);
    assert!(ok && err.contains("are not saved into"), "{err}");
    assert!(!table.exists());
    std::fs::remove_dir(&saved).unwrap();
    // A run folder it cannot save into: the report still comes, and the
    // command still succeeds.
    std::fs::remove_dir_all(a.join("eval")).unwrap();
    std::fs::write(a.join("eval"), "in the way").unwrap();
    let (ok, stdout, err) = eval_a(own);
    assert!(
        ok && err.contains("are not saved into") && err.contains("report above holds them"),
        "{err}"
    );
    assert!(stdout.contains("policy"), "{stdout}");
    std::fs::remove_file(a.join("eval")).unwrap();
    let (ok, stdout, err) = plan(&[&a, &b], &["--plan-search", "0"]);
    assert!(
        ok && err.contains("`plan` runs no local search")
            && err.contains(&format!("(the runs' own: {own}, {own})")),
        "{err}"
    );
    assert!(serde_json::from_str::<common::Placement>(&stdout).is_ok());
    // It reaches the searches: without them, --verify has no other ends
    // of them (`basin`) to measure; with the run's own, it has.
    let basins = |extra: &[&str]| {
        let (ok, _, err) = plan(&[&a], &[&["--verify", "sim"], extra].concat());
        assert!(ok, "{err}");
        !err.contains(", 0 of them `basin`")
    };
    assert!(basins(&[]) && !basins(&["--plan-search", "0"]));
    let (ok, _, err) = plan(&[&a], &["--plan-search", "0", "--method", "lookup"]);
    assert!(ok && err.contains("changes only the learned plan"), "{err}");
    let (ok, _, err) = plan(&[&a], &["--plan-search", "-1"]);
    assert!(
        !ok && err.contains("'-1' for '--plan-search <N>': must be 0 or more"),
        "{err}"
    );
}

/// A configuration's relative paths start at the folder `learner` runs
/// in: where one is missing, the error says which folder that was.
#[test]
fn a_missing_relative_path_names_the_folder_it_was_looked_for_in() {
    let dir = tempfile::tempdir().unwrap();
    let here = dir.path().canonicalize().unwrap();
    let cfg = here.join("c.toml");
    let named = format!("here {}", here.display());
    // Every call here is refused: its error output.
    let fails = |args: &[&str]| {
        let (ok, _, err) = learner_in(&here, args);
        assert!(!ok);
        err
    };
    let refused = |command: &str, text: &str| {
        std::fs::write(&cfg, text).unwrap();
        let mut args = vec![command, "--config", "c.toml"];
        if command == "train" {
            args.extend(["--run-dir", "run"]);
        }
        fails(&args)
    };
    // Names what was missing, and the folder a relative path starts at.
    let hinted = |err: &str, what: &str| {
        assert!(err.contains(what) && err.contains(&named), "{err}");
    };
    let train = |text: &str| refused("train", text);
    let err = train("[train]\nsuite = \"data/s.train.json\"\ninit = \"models/mine\"\n");
    hinted(&err, "train.init = models/mine: no such folder");
    let err = train("[train]\nsuite = \"data/s.train.json\"\n");
    hinted(&err, "train.suite = data/s.train.json");
    let err = train("[data]\ndir = \"d\"\n[train]\nsuite = \"d/s.train.json\"\n");
    hinted(&err, "writes its suites into data.dir = d;");
    let err = refused("generate", "[data]\npool = \"mine.csv\"\n");
    hinted(&err, "data.pool = mine.csv;");
    assert!(!here.join("run").exists(), "a refused run leaves no folder");
    // `plan --run`: a folder that is not there, then a file; `config
    // --run` shares the check.
    std::fs::write(here.join("t.csv"), "").unwrap();
    let plan = |run: &str| {
        fails(&[
            "plan",
            "--run",
            run,
            "--tables",
            "t.csv",
            "--devices",
            "2",
            "--memory-gb",
            "8",
        ])
    };
    let err = plan("runs/mine");
    hinted(&err, "runs/mine: no such folder");
    let err = plan("t.csv");
    assert!(
        err.contains("t.csv is a file; give a training run's folder"),
        "{err}"
    );
    let err = fails(&["config", "--run", "runs/mine"]);
    assert!(err.contains("runs/mine: no such folder"), "{err}");
}
