//! `learner generate` and `learner eval`.

use std::io::Write;

use anyhow::Context;
use common::config::Config;
use common::Suite;

use super::{default_model, progress, EvalArgs, GenerateArgs};
use crate::eval::{evaluate, Report};
use model::baselines::Method;
use model::shapes::TrainedShapes;

pub(super) fn generate(args: GenerateArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let cfg = Config::load(args.config.as_deref())?;
    let dir = args.out.unwrap_or_else(|| cfg.data.dir.clone());
    let g = crate::data::generate(&cfg, &dir).with_context(|| match &cfg.data.pool {
        Some(pool) => format!(
            "generating data in {} from the tables of data.pool = {}{}",
            dir.display(),
            pool.display(),
            match pool.exists() {
                true => String::new(),
                false => common::fs::relative_hint(pool),
            }
        ),
        None => format!("generating data in {}", dir.display()),
    })?;
    write!(out, "{}", g.stats)?;
    for s in &g.suites {
        writeln!(out, "wrote {}", s.display())?;
    }
    Ok(())
}

pub(super) fn eval(args: EvalArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let mut cfg = Config::load(args.config.as_deref())?;
    if let Some(b) = args.search_budget {
        cfg.eval.search_budget = b;
    }
    let mut methods =
        Method::parse_list(&args.methods).map_err(|e| anyhow::anyhow!("--methods: {e}"))?;
    let mut runs = policy_runs(&args, &mut methods)?;
    // Results with another search than the run's own are not its `plan`'s.
    let mut own_plan_search = true;
    if let Some(n) = args.plan_search {
        match runs.as_mut().filter(|_| methods.contains(&Method::Policy)) {
            Some(r) => {
                let own = r.set_plan_search(n);
                own_plan_search = own.iter().all(|&o| o == n);
                let unsaved = match (own_plan_search, args.checkpoint.len()) {
                    (false, 1) => "; the results are not saved into the run",
                    _ => "",
                };
                tracing::info!("`policy`: {}{unsaved}", super::plan_search_note(n, &own));
            }
            None => tracing::warn!(
                "--plan-search {n} changes only `policy`, which --methods {} does not ask for",
                args.methods
            ),
        }
    }
    if args.verify {
        match methods.contains(&Method::Policy) {
            true => tracing::info!(
                "--verify: `policy` measures its candidates on `{}` and returns the measured \
                 best, as `learner plan --verify {}` does{}",
                args.backend.name(),
                args.backend.name(),
                match args.checkpoint.len() {
                    1 => "; the results are not saved into the run",
                    _ => "",
                }
            ),
            false => tracing::warn!(
                "--verify changes only `policy`, which --methods {} does not ask for",
                args.methods
            ),
        }
    }
    let suites = args
        .suite
        .iter()
        .map(|p| {
            Suite::load(p, &cfg.memory).with_context(|| {
                if p.exists() {
                    format!("--suite {}", p.display())
                } else {
                    format!(
                        "--suite {}: no such suite (`learner generate --config C` writes the \
                         suites of configuration C; the default's are under data/generated)",
                        p.display()
                    )
                }
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    warn_of_search_cost(&args, &cfg, &methods, &suites);
    let mut oracle = benchworker::build(args.backend, &cfg)?;
    let batch = match args.backend {
        benchworker::Backend::Sim => cfg.sim.batch,
        benchworker::Backend::Cpu => cfg.cpu.batch,
        benchworker::Backend::Cuda => cfg.cuda.batch,
    };
    // The shapes the model was trained on, to warn about suites far from
    // them when the policy is evaluated (the first run's).
    let shapes = runs
        .as_ref()
        .filter(|_| methods.contains(&Method::Policy))
        .and_then(|r| r.shapes[0].as_ref());
    let trained = runs.as_ref().map(|r| r.trained()).unwrap_or_default();
    let mut nothing_measured = Vec::new();
    for suite in &suites {
        if let Some(shapes) = shapes {
            warn_far_outside(suite, shapes);
        }
        let bar = progress(suite.tasks.len() as u64, &suite.path.display().to_string());
        // Without a terminal for the bar, a line every 10 s at most.
        let (tasks, mut done) = (suite.tasks.len(), 0usize);
        let mut said = std::time::Instant::now();
        if bar.is_hidden() {
            tracing::info!(
                "evaluating {} on {}: {}",
                methods
                    .iter()
                    .map(|m| m.name())
                    .collect::<Vec<_>>()
                    .join(", "),
                suite.path.display(),
                common::count(tasks, "task")
            );
        }
        let report: Result<Report, _> = evaluate(
            suite,
            &methods,
            oracle.as_mut(),
            &crate::eval::Setting {
                mem: &cfg.memory,
                cfg: &cfg.eval,
                batch,
                runs: &trained,
                verify: args.verify,
            },
            || {
                bar.inc(1);
                done += 1;
                if bar.is_hidden() && done < tasks && said.elapsed().as_secs() >= 10 {
                    said = std::time::Instant::now();
                    tracing::info!("{}: {done}/{tasks} tasks", suite.path.display());
                }
            },
        );
        bar.finish_and_clear();
        // The oracle failed every measurement of this suite: said, and the
        // other suites still evaluated.
        let report = match report {
            Ok(r) => r,
            Err(e) => {
                tracing::error!("evaluating {}: {e}", suite.path.display());
                nothing_measured.push(format!("{} (the oracle: {e})", suite.path.display()));
                continue;
            }
        };
        if args.json {
            serde_json::to_writer(&mut *out, &report)?;
            writeln!(out)?;
        } else {
            writeln!(out, "{report}")?;
        }
        // The evaluated run keeps its results (the shipped model's folder
        // is left as it is, and so are runs evaluated together: the
        // results are not one run's).
        // The report is out already: a run folder that cannot be written
        // (read-only, say) costs the saved copy only.
        // Nor are results without the second opinion the run ships, or
        // with measurements `plan` does not take unasked.
        let declined = args.verify
            || args.no_second_opinion
                && (args.checkpoint.iter())
                    .any(|d| d.join(crate::checkpoint::Runs::SECOND_OPINION).is_dir());
        if let ([run], true, false) = (args.checkpoint.as_slice(), own_plan_search, declined) {
            if let Err(e) = save_report(run, &suite.path, args.backend, &report) {
                tracing::warn!(
                    "the results of {} are not saved into {}: {e:#} (the report above holds them)",
                    suite.path.display(),
                    run.display()
                );
            }
        }
        let measured = |m: &crate::eval::MethodResult| m.per_task_ms.iter().any(Option::is_some);
        if !report.methods.values().any(measured) {
            nothing_measured.push(suite.path.display().to_string());
        }
    }
    // A table of failures only is no result: a script must not take it
    // for one.
    if !nothing_measured.is_empty() {
        anyhow::bail!(
            "nothing was measured on {}: no method asked for found a plan that fits memory \
             on any of its tasks, or the oracle failed every measurement",
            nothing_measured.join(", ")
        );
    }
    Ok(())
}

/// Writes `report` into `RUN/eval/` as `SUITE-BACKEND.txt` (the table) and
/// `.json`, replacing an earlier evaluation of the same suite and oracle.
/// The earlier table goes first: a write that fails halfway leaves the
/// earlier `.json` alone or the new one alone, never one beside the
/// other's table.
fn save_report(
    run: &std::path::Path,
    suite: &std::path::Path,
    backend: benchworker::Backend,
    report: &Report,
) -> anyhow::Result<()> {
    let dir = run.join("eval");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let stem = suite
        .file_name()
        .map(|n| n.to_string_lossy().trim_end_matches(".json").to_string())
        .unwrap_or_else(|| "suite".into());
    let base = format!("{stem}-{}", backend.name());
    let json = serde_json::to_string_pretty(report)? + "\n";
    let txt = dir.join(format!("{base}.txt"));
    match std::fs::remove_file(&txt) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(e).with_context(|| format!("removing the earlier {}", txt.display()));
        }
        _ => {}
    }
    common::fs::write_atomic(&dir.join(format!("{base}.json")), json.as_bytes())?;
    common::fs::write_atomic(&txt, format!("{report}\n").as_bytes())?;
    tracing::info!(
        "saved to {}",
        dir.join(format!("{base}.{{txt,json}}")).display()
    );
    Ok(())
}

/// The runs whose models place as `policy`: each `--checkpoint`, else the
/// shipped pre-trained model when `policy` is asked for (or `all`, which
/// then takes it in when there is one).
fn policy_runs(
    args: &EvalArgs,
    methods: &mut Vec<Method>,
) -> anyhow::Result<Option<crate::checkpoint::Runs>> {
    let dirs = match args.checkpoint.as_slice() {
        [] if methods.contains(&Method::Policy) => vec![default_model().map_err(|e| {
            anyhow::anyhow!("--methods: `policy` needs --checkpoint RUN_DIR ({e})")
        })?],
        [] if args.methods.trim() == "all" => default_model().into_iter().collect(),
        given => given.to_vec(),
    };
    if dirs.is_empty() {
        return Ok(None);
    }
    let runs = crate::checkpoint::Runs::load(&dirs, !args.no_second_opinion)?;
    if args.methods.trim() == "all" {
        methods.push(Method::Policy);
    }
    let names: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
    match names.as_slice() {
        [one] => tracing::info!("`policy` places with the model in {one}"),
        _ => tracing::info!(
            "`policy` places with {} runs together ({}); the results are not saved into them",
            names.len(),
            names.join(", ")
        ),
    }
    Ok(Some(runs))
}

/// `search` measures its budget of plans per task: cheap on `sim`, a real
/// measurement each on the others (said when it comes to more than a
/// thousand).
fn warn_of_search_cost(args: &EvalArgs, cfg: &Config, methods: &[Method], suites: &[Suite]) {
    let tasks: usize = suites.iter().map(|s| s.tasks.len()).sum();
    if args.backend != benchworker::Backend::Sim
        && methods.contains(&Method::Search)
        && cfg.eval.search_budget * tasks > 1000
    {
        tracing::warn!(
            "`search` measures eval.search_budget = {} plans per task on the {} backend: \
             about {} measurements for {tasks} tasks (a cpu measurement of 50 tables on 4 \
             devices takes about 0.65 s); lower it with --search-budget (scripts/launch.sh \
             --backend cpu uses 20)",
            cfg.eval.search_budget,
            args.backend.name(),
            cfg.eval.search_budget * tasks
        );
    }
}

/// Warns about a suite whose tasks lie far from the shapes the model was
/// trained on.
fn warn_far_outside(suite: &Suite, shapes: &TrainedShapes) {
    let far: Vec<String> = suite
        .tasks
        .iter()
        .filter_map(|t| shapes.outside(t.tables.len(), t.devices))
        .collect();
    if let Some(first) = far.first() {
        tracing::warn!(
            "{}: {} of its {} tasks lie far outside what the model was trained on (the \
             first: {first}), where the policy can lose to the heuristics; {}",
            suite.path.display(),
            far.len(),
            suite.tasks.len(),
            TrainedShapes::ADVICE
        );
    }
}
