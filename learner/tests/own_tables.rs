//! A user's own tables: `scripts/pool-from-trace.py` turns a lookup trace
//! (dlrm_datasets' layout) into a pool CSV whose features are computed here
//! again, independently; `[data] pool` makes `learner generate` split that
//! pool and draw the suites from it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use rand::{Rng, SeedableRng};

mod support;

use support::learner;

/// The repository's root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The python that runs the script: `EMBSHARD_PYTHON`, else the project's
/// venv (scripts/setup.sh makes it, with PyTorch), else `python3`.
fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("EMBSHARD_PYTHON") {
        return p.into();
    }
    let venv = root().join(".venv/bin/python");
    if venv.exists() {
        venv
    } else {
        "python3".into()
    }
}

/// Runs a python program with `args`: (success, stdout, stderr).
fn run_python(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(python())
        .args(args)
        .output()
        .expect("python (set EMBSHARD_PYTHON, or run scripts/setup.sh for .venv)");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `scripts/NAME` run with `args`: (success, stdout, stderr).
fn run_script(name: &str, args: &[&str]) -> (bool, String, String) {
    let path = root().join("scripts").join(name);
    let mut all = vec![path.to_str().unwrap()];
    all.extend_from_slice(args);
    run_python(&all)
}

fn script(args: &[&str]) -> (bool, String, String) {
    let (ok, out, err) = run_script("pool-from-trace.py", args);
    assert!(!err.contains("Traceback"), "{err}");
    (ok, out, err)
}

/// The script on `trace` with `--dim dim`, writing `out`.
fn to_pool(trace: &Path, dim: &str, out: &Path) -> (bool, String, String) {
    script(&[
        trace.to_str().unwrap(),
        "--dim",
        dim,
        "--out",
        out.to_str().unwrap(),
    ])
}

/// A trace: `bags[t][s]` the rows table `t` looks up for sample `s`.
type Bags = Vec<Vec<Vec<i64>>>;

/// Saves `bags` as dlrm_datasets does: `torch.save((indices, offsets,
/// lengths))`, through the arrays written as text. `drop_last_offset`
/// leaves out the final offset (also accepted).
fn save_trace(dir: &Path, name: &str, bags: &Bags, drop_last_offset: bool) -> PathBuf {
    let (mut indices, mut offsets, mut lengths) = (Vec::new(), vec![0usize], Vec::new());
    for table in bags {
        for bag in table {
            indices.extend(bag.iter().map(i64::to_string));
            offsets.push(offsets.last().unwrap() + bag.len());
            lengths.push(bag.len().to_string());
        }
    }
    if drop_last_offset {
        offsets.pop();
    }
    let arrays = dir.join(format!("{name}.txt"));
    let offsets: Vec<String> = offsets.iter().map(usize::to_string).collect();
    std::fs::write(
        &arrays,
        format!(
            "{}\n{}\n{}\n",
            indices.join(" "),
            offsets.join(" "),
            lengths.join(" ")
        ),
    )
    .unwrap();
    let trace = dir.join(name);
    let program = format!(
        "import sys, torch\n\
         i, o, l = (torch.tensor([int(x) for x in line.split()], dtype=torch.int64) \
                    for line in open(sys.argv[1]).read().split('\\n')[:3])\n\
         torch.save((i, o, l.reshape({}, {})), sys.argv[2])\n",
        bags.len(),
        bags[0].len()
    );
    let (ok, _, err) = run_python(&[
        "-c",
        &program,
        arrays.to_str().unwrap(),
        trace.to_str().unwrap(),
    ]);
    assert!(ok, "saving a trace with torch: {err}");
    trace
}

/// Rows, pooling factor and the 17 reuse-bin shares of one table's bags,
/// counted here: bin k holds the unique rows read (2^(k-1), 2^k] times.
fn expected(bags: &[Vec<i64>], min_rows: u64) -> (u64, f64, [f64; 17]) {
    let mut counts: HashMap<i64, u64> = HashMap::new();
    for &row in bags.iter().flatten() {
        *counts.entry(row).or_default() += 1;
    }
    let lookups: usize = bags.iter().map(Vec::len).sum();
    let mut bins = [0.0; 17];
    for &c in counts.values() {
        let k = (0..16).find(|&k| c <= 1 << k).unwrap_or(16);
        bins[k] += 1.0 / counts.len() as f64;
    }
    let top = counts.keys().max().map_or(0, |&m| m as u64 + 1);
    (top.max(min_rows), lookups as f64 / bags.len() as f64, bins)
}

/// Six tables of 64 samples: skewed rows, one hot row read over 32768
/// times, a table never looked up, a wide vocabulary.
fn trace() -> Bags {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    let batch = 64;
    let mut bags: Bags = Vec::new();
    for t in 0..6 {
        let table = (0..batch)
            .map(|s| match t {
                // A hot row: 600 lookups per sample, 38400 in the batch.
                0 => vec![3; 600],
                // Never looked up.
                1 => vec![],
                // Skewed: small rows far more often, 0 to 9 per sample.
                2 => (0..rng.gen_range(0..10))
                    .map(|_| (rng.gen::<f64>().powi(3) * 500.0) as i64)
                    .collect(),
                // A wide vocabulary, mostly once.
                3 => (0..rng.gen_range(1..30))
                    .map(|_| rng.gen_range(0..5_000_000))
                    .collect(),
                // Every sample reads its own row and a shared one.
                4 => vec![s as i64, 40],
                _ => (0..rng.gen_range(0..4))
                    .map(|_| rng.gen_range(0..50))
                    .collect(),
            })
            .collect();
        bags.push(table);
    }
    bags
}

#[test]
fn a_trace_becomes_the_pool_its_features_describe() {
    let dir = tempfile::tempdir().unwrap();
    let bags = trace();
    // Both layouts: with the final offset, and without it.
    for (name, drop_last) in [("trace.pt", false), ("short.pt", true)] {
        let trace = save_trace(dir.path(), name, &bags, drop_last);
        let csv = dir.path().join(format!("{name}.csv"));
        let (ok, out, err) = to_pool(&trace, "32", &csv);
        assert!(ok, "{err}");
        assert!(
            out.contains("6 tables") && out.contains("batch                  64"),
            "{out}"
        );
        // The table without lookups is kept, and named.
        assert!(err.contains("no lookup") && err.contains("t1"), "{err}");
        let pool = common::pool::read(&csv).unwrap();
        assert_eq!(pool.len(), 6);
        for (t, table) in pool.iter().enumerate() {
            assert_eq!(table.name, format!("t{t}"));
            assert_eq!(table.dim, 32);
            if t == 1 {
                assert_eq!((table.rows, table.bins[0]), (100, 1.0));
                assert!((table.pooling_factor - 1.0 / 64.0).abs() < 1e-9);
                continue;
            }
            let (rows, pooling, bins) = expected(&bags[t], 100);
            assert_eq!(table.rows, rows, "{}", table.name);
            assert!(
                (table.pooling_factor - pooling).abs() < 1e-6,
                "{}",
                table.name
            );
            for (k, (got, want)) in table.bins.iter().zip(bins).enumerate() {
                assert!(
                    (got - want).abs() < 1e-5,
                    "{} bin_{k}: {got} vs {want}",
                    table.name
                );
            }
        }
        // The hot row is in bin_16; the wide table needs its own rows.
        assert_eq!(pool[0].bins[16], 1.0);
        assert!(pool[3].rows > 1_000_000);
    }
}

/// `scripts/synthetic-trace.py` writes a trace and its tables file that
/// `pool-from-trace.py` reads: reuse in one or two buckets around the
/// range asked for, almost no row read once, dims and sizes as written.
#[test]
fn a_synthetic_trace_has_the_reuse_it_promises() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("syn.pt");
    let (ok, out, err) = run_script(
        "synthetic-trace.py",
        &[
            "--out",
            trace.to_str().unwrap(),
            "--tables",
            "5",
            "--batch",
            "4096",
            "--reuse-lo",
            "5",
            "--reuse-hi",
            "6",
            "--seed",
            "3",
        ],
    );
    assert!(ok && out.contains("5 tables"), "{out}{err}");
    let tables = dir.path().join("syn.tables.csv");
    let csv = dir.path().join("syn.csv");
    let (ok, _, err) = script(&[
        trace.to_str().unwrap(),
        "--tables",
        tables.to_str().unwrap(),
        "--out",
        csv.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let pool = common::pool::read(&csv).unwrap();
    assert_eq!(pool.len(), 5);
    let written = std::fs::read_to_string(&tables).unwrap();
    for (table, line) in pool.iter().zip(written.lines().skip(1)) {
        assert_eq!(line, format!("{},{},{}", table.name, table.rows, table.dim));
        assert!(
            (16..=32).contains(&table.dim) && table.dim % 4 == 0,
            "{line}"
        );
        assert!(table.bins[0] < 0.01, "{}: {:?}", table.name, table.bins);
        // Rows read 2^5 to 2^6 times on average: buckets 5 to 7 hold them.
        let middle: f64 = table.bins[5..=7].iter().sum();
        let top_two = table
            .bins
            .windows(2)
            .map(|w| w[0] + w[1])
            .fold(0.0, f64::max);
        assert!(
            middle > 0.95 && top_two > 0.8,
            "{}: {:?}",
            table.name,
            table.bins
        );
    }
    // Bad ranges are refused with the rule.
    let (ok, _, err) = run_script(
        "synthetic-trace.py",
        &[
            "--out",
            trace.to_str().unwrap(),
            "--reuse-lo",
            "9",
            "--reuse-hi",
            "3",
        ],
    );
    assert!(!ok && err.contains("--reuse-lo <= --reuse-hi"), "{err}");
}

#[test]
fn table_names_and_sizes_come_from_a_file_and_bad_input_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let bags = trace();
    let trace = save_trace(dir.path(), "trace.pt", &bags, false);
    let tables = dir.path().join("tables.csv");
    let out = dir.path().join("pool.csv");
    let run = |tables_csv: &str| {
        std::fs::write(&tables, tables_csv).unwrap();
        script(&[
            trace.to_str().unwrap(),
            "--tables",
            tables.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ])
    };
    let good =
        "name,rows,dim\nhot,10,8\nidle,20,16\nskew,1000,64\nwide,6000000,128\nown,,4\nsmall,50,8\n";
    let (ok, _, err) = run(good);
    assert!(ok, "{err}");
    let pool = common::pool::read(&out).unwrap();
    let got: Vec<(&str, u64, u32)> = pool
        .iter()
        .map(|t| (t.name.as_str(), t.rows, t.dim))
        .collect();
    // An empty rows field takes the trace's (at least 100).
    let own = expected(&bags[4], 100).0;
    assert_eq!(
        got,
        [
            ("hot", 10, 8),
            ("idle", 20, 16),
            ("skew", 1000, 64),
            ("wide", 6_000_000, 128),
            ("own", own, 4),
            ("small", 50, 8)
        ]
    );
    // Columns in another order, TorchRec's names, and a column the trace
    // gives anyway: the same pool.
    let before = std::fs::read(&out).unwrap();
    let reordered =
        "Embedding_Dim, pooling_factor ,name,num_embeddings\n8,2.0,hot,10\n16,1,idle,20\n\
                     64,1,skew,1000\n128,1,wide,6000000\n4,1,own,\n8,1,small,50\n";
    let (ok, _, err) = run(reordered);
    assert!(ok, "{err}");
    assert_eq!(std::fs::read(&out).unwrap(), before);
    for (tables_csv, words) in [
        // The trace reads row 3 of `hot`.
        (
            good.replace("hot,10,8", "hot,3,8"),
            &["hot", "3 rows", "row 3"][..],
        ),
        (good.replace("idle", "hot"), &["tables.csv:3", "duplicate"]),
        (good.replace("small,50,8\n", ""), &["5 tables", "has 6"]),
        (good.replace("16", "x"), &["tables.csv:3", "`dim`", "`x`"]),
        (
            good.replace("name,rows,dim", "table,dim"),
            &["tables.csv:1:", "header", "missing: `name`, `rows`"][..],
        ),
        // Blank lines first: the error names the header's own line.
        (
            good.replace("name,rows,dim", "\n\ntable,dim"),
            &["tables.csv:3:", "header"][..],
        ),
        (
            good.replace("name,rows,dim", "name,rows,dim,num_embeddings"),
            &["twice"],
        ),
    ] {
        let (ok, _, err) = run(&tables_csv);
        assert!(!ok, "{tables_csv}");
        for w in words {
            assert!(err.contains(w), "{w:?} not in {err}");
        }
        // A refused run leaves the pool written before as it was.
        assert_eq!(std::fs::read(&out).unwrap(), before);
    }
}

#[test]
fn a_trace_whose_parts_disagree_is_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("pool.csv");
    let save = |name: &str, program: &str| {
        let path = dir.path().join(name);
        let (ok, _, err) = run_python(&[
            "-c",
            &format!("import torch, sys\nt = torch.tensor\ntorch.save({program}, sys.argv[1])"),
            path.to_str().unwrap(),
        ]);
        assert!(ok, "{err}");
        path
    };
    for (name, program, words) in [
        // Two tables of two samples: offsets for three bags only.
        (
            "short.pt",
            "(t([1, 2, 3]), t([0, 1, 2]), t([[1, 1], [1, 0]]))",
            &["offsets has 3 entries", "needs 5"][..],
        ),
        (
            "lengths.pt",
            "(t([1, 2, 3]), t([0, 1, 2, 3, 3]), t([[1, 1], [0, 1]]))",
            &["lengths[1][0] = 0", "1 lookups"],
        ),
        (
            "negative.pt",
            "(t([1, -2, 3]), t([0, 1, 2, 3, 3]), t([[1, 1], [1, 0]]))",
            &["negative row (-2)"],
        ),
        (
            "floats.pt",
            "(t([1.0]), t([0, 1]), t([[1]]))",
            &["indices holds torch.float32"],
        ),
        (
            "pair.pt",
            "(t([1]), t([0, 1]))",
            &["expected (indices, offsets, lengths)"],
        ),
        (
            "dict.pt",
            "{'indices': t([1])}",
            &["without offsets, lengths"],
        ),
    ] {
        let trace = save(name, program);
        let (ok, _, err) = to_pool(&trace, "16", &out);
        assert!(!ok, "{name}");
        assert!(err.contains(name), "{name}: {err}");
        for w in words {
            assert!(err.contains(w), "{name}: {w:?} not in {err}");
        }
        assert!(!out.exists(), "{name}: a refused trace writes no pool");
    }
    let (ok, _, err) = to_pool(Path::new("nowhere.pt"), "16", &out);
    assert!(!ok && err.contains("nowhere.pt: no such file"), "{err}");
}

#[test]
fn generate_splits_the_users_pool_and_draws_the_suites_from_it() {
    let dir = tempfile::tempdir().unwrap();
    let pool: Vec<common::Table> = (0..30)
        .map(|i| common::Table::cold(format!("mine_{i}"), 1000 + 100 * i, 16, 2.0))
        .collect();
    let csv = dir.path().join("mine.csv");
    common::pool::write(&csv, &pool).unwrap();
    let cfg = dir.path().join("c.toml");
    let data = dir.path().join("data");
    let config = |pool: &Path, tables: usize| {
        std::fs::write(
            &cfg,
            format!(
                "[data]\ndir = {:?}\npool = {:?}\ntrain_tasks = 3\ntest_tasks = 2\n\
                 suites = [{{ tables = {tables}, devices = 2, memory_gb = 1.0 }}]\n",
                data.to_str().unwrap(),
                pool.to_str().unwrap()
            ),
        )
        .unwrap();
    };
    config(&csv, 10);
    let (ok, out, err) = learner(&["generate", "--config", cfg.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert!(out.contains("this pool") && out.contains("tables"), "{out}");
    // The pool is the user's, split in two disjoint halves.
    assert_eq!(common::pool::read(&data.join("pool.csv")).unwrap(), pool);
    let halves: Vec<Vec<String>> = ["train", "test"]
        .iter()
        .map(|h| {
            let half = common::pool::read(&data.join(format!("pool.{h}.csv"))).unwrap();
            let suite = common::Suite::load(
                &data.join(format!("dlrm-10x2.{h}.json")),
                &common::MemoryModel::default(),
            )
            .unwrap();
            for task in &suite.tasks {
                assert_eq!(task.tables.len(), 10);
                assert!(task.tables.iter().all(|t| half.contains(t)), "{h}");
            }
            half.into_iter().map(|t| t.name).collect()
        })
        .collect();
    assert_eq!(halves[0].len() + halves[1].len(), 30);
    assert!(halves[0].iter().all(|n| !halves[1].contains(n)));
    // A suite wider than a half says where the tables came from.
    config(&csv, 20);
    let (ok, _, err) = learner(&["generate", "--config", cfg.to_str().unwrap()]);
    assert!(!ok);
    for w in ["data.pool", "mine.csv", "30 tables", "15 for training"] {
        assert!(err.contains(w), "{w:?} not in {err}");
    }
    // A pool file that is not there is named with its setting.
    config(&dir.path().join("missing.csv"), 10);
    let (ok, _, err) = learner(&["generate", "--config", cfg.to_str().unwrap()]);
    assert!(!ok);
    assert!(
        err.contains("data.pool") && err.contains("missing.csv"),
        "{err}"
    );
}

/// `scripts/eval-summary.py` puts several suites together in a last row:
/// percentages averaged over the suites, the worst task of all, counts
/// summed (the cells docs/results.md gives for the held-out suites).
#[test]
fn eval_summary_puts_the_suites_together() {
    let dir = tempfile::tempdir().unwrap();
    let report = |suite: &str, best: &str, costs: [(&str, [f64; 2]); 4]| {
        let methods: serde_json::Map<String, serde_json::Value> = costs
            .iter()
            .map(|(m, c)| (m.to_string(), serde_json::json!({ "per_task_ms": c })))
            .collect();
        serde_json::json!({ "suite": suite, "best_heuristic": best, "methods": methods })
            .to_string()
    };
    // Suite a: level with lookup overall, one task 10 % behind it; 11.1 %
    // behind search. Suite b: 10 % ahead of torchrec, no task behind; level
    // with search.
    let a = report(
        "a.json",
        "lookup",
        [
            ("policy", [9.0, 11.0]),
            ("lookup", [10.0, 10.0]),
            ("torchrec", [10.0, 12.0]),
            ("search", [9.0, 9.0]),
        ],
    );
    let b = report(
        "b.json",
        "torchrec",
        [
            ("policy", [8.0, 10.0]),
            ("lookup", [12.0, 10.05]),
            ("torchrec", [10.0, 10.0]),
            ("search", [8.0, 10.0]),
        ],
    );
    let path = dir.path().join("eval.jsonl");
    std::fs::write(&path, format!("{a}\n{b}\n")).unwrap();
    let (ok, out, err) = run_script("eval-summary.py", &[path.to_str().unwrap()]);
    assert!(ok, "{err}");
    let row = |name: &str| {
        out.lines()
            .find(|l| l.starts_with(&format!("| {name}")))
            .unwrap_or_else(|| panic!("no row {name}: {out}"))
            .to_string()
    };
    assert!(
        row("a.json").contains("| +0.00 % | +11.11 % | +11.11 % | +10.00 % | 1 |"),
        "{out}"
    );
    assert_eq!(
        row("all"),
        "| all: 2 suites, 4 tasks | | -5.00 % | +5.56 % | +5.56 % | +10.00 % | 1 | +10.00 % | 1 | 0 |",
        "{out}"
    );
}
