//! `learner plan`: a trained model's placement of the user's tables.

use std::io::Write;
use std::path::{Path, PathBuf};

use common::DeviceCost;
use model::baselines::Method;
use model::guard::{Candidate, Guarded};
use rand::SeedableRng;

use super::{PlanArgs, PlanFormat};
use crate::run::RunDir;

pub(super) fn plan(args: PlanArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    // One episode's tensors are tiny: a thread pool only adds latency.
    tch::set_num_threads(1);
    let dirs = match args.checkpoint.as_slice() {
        [] => {
            let shipped = default_model()?;
            tracing::info!("placing with the shipped model in {}", shipped.display());
            vec![shipped]
        }
        given => given.to_vec(),
    };
    let mut runs = crate::checkpoint::Runs::load(&dirs, !args.no_second_opinion)?;
    if let Some(n) = args.plan_search {
        let own = runs.set_plan_search(n);
        match args.method {
            // `search` starts from the guard's choice.
            Method::Policy | Method::Search => {
                tracing::info!("{}", super::plan_search_note(n, &own))
            }
            m => tracing::warn!(
                "--plan-search {n} changes only the learned plan; --method {} places with a \
                 heuristic",
                m.name()
            ),
        }
    }
    if runs.dirs.len() > 1 {
        tracing::info!(
            "placing with {} runs together: each run's guard chooses, and all their cost \
             networks judge between the choices",
            runs.dirs.len()
        );
    }
    let mut run_cfg = runs.cfg.clone();
    if let Some(p) = args.precision.filter(|&p| p != run_cfg.memory.precision) {
        tracing::warn!(
            "--precision {}: memory is counted with {} weights, but the model learned its \
             costs with {} weights, so its predicted times are for those",
            p.name(),
            p.name(),
            run_cfg.memory.precision.name()
        );
        run_cfg.memory.precision = p;
    }
    if let Some(o) = args.optimizer.filter(|&o| o != run_cfg.memory.optimizer) {
        tracing::info!(
            "--optimizer {}: memory is counted with its state; the model learned its costs \
             with {}",
            o.name(),
            run_cfg.memory.optimizer.name()
        );
        run_cfg.memory.optimizer = o;
    }
    let task = user_task(&args, &run_cfg.memory)?;
    // libtorch prepares each kind of operation on its first call; one tiny
    // placement first keeps that out of the placement's own time (both are
    // logged).
    let warm = std::time::Instant::now();
    let tiny = common::Task {
        name: "warm-up".into(),
        devices: args.devices,
        memory_gb: 1e6,
        tables: task.tables.iter().take(2).cloned().collect(),
    };
    runs.plan(&tiny, &run_cfg.memory)?;
    let warm = warm.elapsed();
    let start = std::time::Instant::now();
    let mut guarded = runs.plan(&task, &run_cfg.memory)?;
    let elapsed = start.elapsed();
    if args.method == Method::Policy {
        warn_of_doubts(&guarded, &task.tables);
    }
    // `search` measures as it goes: on --verify's oracle, else `sim`.
    let backend = match (args.verify, args.method) {
        (Some(b), _) => Some(b),
        (None, Method::Search) => {
            tracing::info!("`search` measures on `sim` (--verify BACKEND picks another)");
            Some(benchworker::Backend::Sim)
        }
        (None, _) => None,
    };
    let mut oracle = backend
        .map(|b| benchworker::build(b, &run_cfg))
        .transpose()?;
    let mut noise = None;
    if let (Some(o), Some(b)) = (oracle.as_mut(), args.verify) {
        if args.method == Method::Policy {
            let added = model::guard::add_basins(&mut guarded, &runs.trained(), &task);
            tracing::info!(
                "--verify {}: measuring {}, {} of them `basin`: other ends of `plan`'s \
                 searches on the cost network",
                b.name(),
                common::count(guarded.candidates.len(), "candidate"),
                added
            );
        }
        noise = model::guard::verify(&mut guarded, &task.tables, o.as_mut())?;
    }
    if args.method == Method::Policy {
        match (args.verify, guarded.narrow_win()) {
            (Some(b), _) => log_verified(&guarded, b, noise, &run_cfg),
            (None, Some(narrow)) => tracing::warn!(
                "{narrow}; on held-out tasks about one such plan in five measured over 1 % \
                 slower than the heuristic's (docs/results.md, \"Fresh draws and other \
                 shapes\"): `--verify {}` measures the candidates on the oracle this model \
                 learned from (`--verify cuda` on your GPUs)",
                run_cfg
                    .cluster
                    .backend
                    .unwrap_or(benchworker::Backend::Sim)
                    .name()
            ),
            (None, None) => {}
        }
    } else {
        let oracle = oracle
            .as_mut()
            .map(|o| o.as_mut() as &mut dyn benchworker::Oracle);
        choose_method(&mut guarded, args.method, &task, &runs, &run_cfg, oracle)?;
    }
    let plan = guarded.plan().clone();
    let (per_device, cost) = runs.estimate(&task.tables, &plan);
    let per_device = predicted_devices(&per_device);
    tracing::info!(
        "placed {} on {} with `{}` in {:.2} ms after a {:.2} ms warm-up \
         (estimated iteration {cost:.3} ms, composed from the members' mean device costs)",
        common::count(task.tables.len(), "table"),
        common::count(args.devices, "device"),
        guarded.method(),
        elapsed.as_secs_f64() * 1e3,
        warm.as_secs_f64() * 1e3
    );
    let mut err = std::io::stderr().lock();
    write!(err, "{}", summary(&task, &guarded, &per_device, &run_cfg))?;
    if runs.dirs.len() > 1 && args.method == Method::Policy {
        let c = &guarded.candidates[guarded.chosen];
        let whose = match c.learned() {
            true => format!("`{}` of --run {}", c.method, runs.dirs[c.run].display()),
            false => format!("`{}`'s", c.method),
        };
        writeln!(
            err,
            "  {} runs placed together: the plan is {whose}, predicted {:.3} ms by all {} \
             members",
            runs.dirs.len(),
            c.mean(),
            c.predicted.len()
        )?;
    }
    if args.compare {
        write!(
            err,
            "{}",
            comparison(&guarded, args.method == Method::Policy)
        )?;
    }
    let doc = match args.format {
        PlanFormat::Placement => {
            placement_document(&task, &guarded, &per_device, cost, &runs.dirs)?
        }
        PlanFormat::Torchrec => serde_json::json!({
            "world_size": args.devices,
            "ranks": task
                .tables
                .iter()
                .zip(&plan.assignment)
                .map(|(t, &d)| (t.name.clone(), serde_json::json!(d)))
                .collect::<serde_json::Map<_, _>>(),
        }),
    };
    let text = serde_json::to_string_pretty(&doc)? + "\n";
    match args.out {
        Some(path) => {
            common::fs::write_atomic(&path, text.as_bytes())?;
            let what = match args.format {
                PlanFormat::Placement => "the placement",
                PlanFormat::Torchrec => "TorchRec's ranks",
            };
            tracing::info!("wrote {what} to {}", path.display());
        }
        None => write!(out, "{text}")?,
    }
    Ok(())
}

/// The user's task: the tables of `--tables` on `--devices` devices of
/// `--memory-gb`, checked to fit.
fn user_task(args: &PlanArgs, mem: &common::MemoryModel) -> anyhow::Result<common::Task> {
    // The arguments first: a bad one is named before any warning about
    // the CSV's columns.
    anyhow::ensure!(
        (1..=common::placement::MAX_DEVICES).contains(&args.devices),
        "--devices must lie in 1..={}",
        common::placement::MAX_DEVICES
    );
    anyhow::ensure!(
        args.memory_gb.is_finite() && args.memory_gb > 0.0,
        "--memory-gb must be a positive number"
    );
    let tables = common::pool::read(&args.tables)?;
    let task = common::Task {
        name: args.tables.display().to_string(),
        devices: args.devices,
        memory_gb: args.memory_gb,
        tables,
    };
    if let Some(why) = task.infeasibility(mem) {
        anyhow::bail!(
            "{}: cannot fit memory: {why} (counting {} weights and {} state: --precision, \
             --optimizer)",
            args.tables.display(),
            mem.precision.name(),
            mem.optimizer.name()
        );
    }
    Ok(task)
}

/// Whether the guard doubted reuse bins that are all the defaults a CSV
/// without bin columns takes (`common::generate::default_bins`): then the
/// user never gave the bins that lie outside.
fn doubts_default_bins(doubts: &[String], tables: &[common::Table]) -> bool {
    doubts.iter().any(|d| d.contains("bin_")) && tables.iter().all(common::Table::has_default_bins)
}

/// Says why the guard doubted the learned plan, and what lies outside
/// the trained shapes.
fn warn_of_doubts(guarded: &Guarded, tables: &[common::Table]) {
    for note in &guarded.notes {
        tracing::warn!("{note}");
    }
    if !guarded.doubts.is_empty() {
        tracing::warn!(
            "not following the learned plan: {}; placed with `{}`'s plan (`--verify BACKEND` \
             measures every candidate)",
            guarded.doubts.join("; "),
            guarded.method()
        );
    }
    if doubts_default_bins(&guarded.doubts, tables) {
        tracing::warn!(
            "the reuse bins named are the defaults for a table of those rows and pooling, not \
             yours (the CSV has no bin columns); scripts/pool-from-trace.py derives them from a \
             lookup trace"
        );
    }
}

/// Logs the measured gain of the plan chosen over the best heuristic, a
/// tie where it is under the measurements' spread (`noise`), and on the
/// `cpu` backend that the tables were measured shrunk.
fn log_verified(
    guarded: &Guarded,
    backend: benchworker::Backend,
    noise: Option<f64>,
    cfg: &common::config::Config,
) {
    let chosen = &guarded.candidates[guarded.chosen];
    let Some(h) = guarded.best_heuristic() else {
        return;
    };
    let h = &guarded.candidates[h];
    if let (Some(c), Some(b)) = (chosen.measured, h.measured) {
        tracing::info!(
            "--verify {}: `{}` measured {c:.3} ms, {:+.2} % against the best heuristic \
             (`{}`, {b:.3} ms)",
            backend.name(),
            chosen.method,
            (c / b - 1.0) * 100.0,
            h.method
        );
        let tie = noise.filter(|&n| chosen.method != h.method && (c / b - 1.0).abs() < n);
        if let Some(n) = tie {
            tracing::info!(
                "--verify {}: that is within the measurements' spread (quartiles up to {:.1} % \
                 apart): a tie",
                backend.name(),
                n * 100.0
            );
        }
    }
    if backend == benchworker::Backend::Cpu {
        tracing::info!(
            "--verify cpu: measured at a batch of {} with each table's rows capped at {} \
             (cpu.batch, cpu.max_rows), on this CPU: it ranks plans, it does not time a GPU",
            cfg.cpu.batch,
            cfg.cpu.max_rows
        );
    }
}

/// `--method` other than `policy`: the plan of that method becomes the
/// chosen one. A heuristic's plan is the guard's candidate where it made
/// one, else placed here; `search` starts from the guard's choice and
/// measures on `oracle`.
fn choose_method(
    guarded: &mut Guarded,
    method: Method,
    task: &common::Task,
    runs: &crate::checkpoint::Runs,
    cfg: &common::config::Config,
    oracle: Option<&mut dyn benchworker::Oracle>,
) -> anyhow::Result<()> {
    if let Some(i) = guarded
        .candidates
        .iter()
        .position(|c| c.method == method.name())
    {
        guarded.chosen = i;
        return Ok(());
    }
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(cfg.eval.seed);
    let (plan, measured) = match method {
        Method::Search => {
            let oracle = oracle.ok_or_else(|| anyhow::anyhow!("`search` needs an oracle"))?;
            let start = guarded.plan().clone();
            let found = model::search::search(
                oracle,
                &task.tables,
                &start,
                task.cap_bytes(),
                &cfg.memory,
                cfg.eval.search_budget,
                &mut rng,
            )?;
            tracing::info!(
                "`search` spent {} measurements from `{}`'s plan: {:.3} ms, from {:.3} ms",
                found.evaluations,
                guarded.method(),
                found.cost_ms,
                found.start_cost_ms
            );
            (found.plan, Some(found.cost_ms))
        }
        m => {
            let ctx = model::baselines::Context::for_task(task, &cfg.memory, runs.models[0].batch);
            let plan = model::baselines::place(m, &ctx, &mut rng).ok_or_else(|| {
                let packed = task.packed_memory_gb_shown(&cfg.memory);
                let hint = if packed <= task.memory_gb {
                    format!(
                        "first-fit decreasing by bytes packs them at {packed:.3} GiB, and the \
                         default `--method policy` starts from that packing"
                    )
                } else {
                    format!(
                        "first-fit decreasing by bytes needs {packed:.3} GiB per device, and \
                         `{}` may need more: give each device more, or use more devices",
                        m.name()
                    )
                };
                anyhow::anyhow!(
                    "`{}` found no placement that fits {} GiB per device; {hint}",
                    m.name(),
                    task.memory_gb
                )
            })?;
            let measured = match oracle {
                Some(o) => Some(o.measure(&task.tables, &plan)?.cost_ms),
                None => None,
            };
            (plan, measured)
        }
    };
    let (_, predicted) = runs.estimate(&task.tables, &plan);
    guarded.candidates.push(Candidate {
        method: method.name(),
        plan,
        predicted: vec![predicted],
        measured,
        run: 0,
    });
    guarded.chosen = guarded.candidates.len() - 1;
    Ok(())
}

/// The cost network's per-device `[fwd, bwd, comm]` as the phases a
/// measurement reports: the forward exchange waits for the slowest
/// forward and moves the bytes the backward one does, so `fwd_comm = max
/// fwd − fwd + comm` and the largest total is the composed iteration cost.
/// A time is not negative: a prediction below 0 (for an empty device,
/// where the network never learned) counts as 0.
fn predicted_devices(per_device: &[[f64; 3]]) -> Vec<DeviceCost> {
    let clamped: Vec<[f64; 3]> = per_device.iter().map(|d| d.map(|t| t.max(0.0))).collect();
    let slowest = clamped.iter().map(|d| d[0]).fold(0.0, f64::max);
    clamped
        .iter()
        .map(|&[fwd, bwd, comm]| DeviceCost::new(fwd, bwd, slowest - fwd + comm, comm))
        .collect()
}

/// The plan summary, in the manner of TorchRec's planner stats: per device
/// its tables, memory against the cap and predicted phases, the bottleneck
/// marked; the method that won and by how much; what the model learned
/// from.
fn summary(
    task: &common::Task,
    guarded: &Guarded,
    devices: &[DeviceCost],
    cfg: &common::config::Config,
) -> String {
    use std::fmt::Write as _;
    let plan = guarded.plan();
    let used = plan.device_bytes(&task.tables, &cfg.memory);
    let gb = |b: u64| b as f64 / common::table::BYTES_PER_GB;
    let bottleneck = (0..devices.len()).max_by(|&a, &b| {
        devices[a]
            .total_ms
            .total_cmp(&devices[b].total_ms)
            .then(b.cmp(&a))
    });
    let mut tables = vec![0usize; plan.devices];
    for &d in &plan.assignment {
        tables[d] += 1;
    }
    let mut s = String::new();
    let _ = writeln!(
        s,
        "plan: {} on {}, `{}`; predicted times in ms:",
        common::count(task.tables.len(), "table"),
        common::count(plan.devices, "device"),
        guarded.method()
    );
    let _ = writeln!(
        s,
        "  device  tables     memory GiB (cap)      fwd  fwd_comm  bwd_comm      bwd    total"
    );
    for (d, c) in devices.iter().enumerate() {
        let _ = writeln!(
            s,
            "  {d:>6}  {:>6}  {:>8.2} ({:>7.2})  {:>7.3}  {:>8.3}  {:>8.3}  {:>7.3}  {:>7.3}{}",
            tables[d],
            gb(used[d]),
            task.memory_gb,
            c.fwd_ms,
            c.fwd_comm_ms,
            c.bwd_comm_ms,
            c.bwd_ms,
            c.total_ms,
            if Some(d) == bottleneck {
                "  <- bottleneck"
            } else {
                ""
            }
        );
    }
    // Where the bottleneck also has the slowest forward, its time is its
    // own table's (the others wait for it).
    let slowest_fwd = |d: usize| devices.iter().all(|c| c.fwd_ms <= devices[d].fwd_ms);
    let lone = bottleneck
        .filter(|&d| slowest_fwd(d))
        .and_then(|d| lone_table(plan, d));
    if let Some(alone) = lone {
        let _ = writeln!(
            s,
            "  the bottleneck holds one table alone, `{}`, and has the slowest forward: moving \
             whole tables can do little for it; splitting the table (TorchRec's row-wise or \
             column-wise sharding) can",
            task.tables[alone].name
        );
    }
    let chosen = &guarded.candidates[guarded.chosen];
    if let Some(h) = guarded.best_heuristic().filter(|&h| h != guarded.chosen) {
        let h = &guarded.candidates[h];
        let (what, c, b) = match (chosen.measured, h.measured) {
            (Some(c), Some(b)) => ("measured", c, b),
            _ => ("predicted", chosen.mean(), h.mean()),
        };
        let _ = writeln!(
            s,
            "  `{}` {what} {c:.3} ms, {:+.2} % against the best heuristic, `{}` ({b:.3} ms)",
            chosen.method,
            (c / b - 1.0) * 100.0,
            h.method
        );
    }
    let backend = cfg.cluster.backend.unwrap_or(benchworker::Backend::Sim);
    let kernel = match backend {
        benchworker::Backend::Cpu => format!(", the {} kernel", cfg.cpu.kernel.name()),
        benchworker::Backend::Cuda => format!(", the {} kernel", cfg.cuda.kernel.name()),
        benchworker::Backend::Sim => String::new(),
    };
    let _ = writeln!(
        s,
        "  the model learned its costs from the `{}` backend{kernel}",
        backend.name()
    );
    let _ = writeln!(
        s,
        "  memory counts {} weights and {} state (--precision, --optimizer)",
        cfg.memory.precision.name(),
        cfg.memory.optimizer.name()
    );
    s
}

/// The table device `d` of `plan` holds, where it holds one alone and the
/// plan has other devices.
fn lone_table(plan: &common::Plan, d: usize) -> Option<usize> {
    let mut on = (0..plan.assignment.len()).filter(|&t| plan.assignment[t] == d);
    match (plan.devices > 1, on.next(), on.next()) {
        (true, Some(t), None) => Some(t),
        _ => None,
    }
}

/// `--compare`: every candidate's plan beside the chosen one, predicted
/// and, with `--verify`, measured. `by_guard`: the guard chose (`--method
/// policy`), not a method the user named.
fn comparison(guarded: &Guarded, by_guard: bool) -> String {
    use std::fmt::Write as _;
    let chosen = &guarded.candidates[guarded.chosen];
    // Measured costs are compared only where every candidate has one
    // (`--verify`); `--method search` measures its own plan alone.
    let measured = guarded.candidates.iter().all(|c| c.measured.is_some());
    let key = |c: &Candidate| if measured { c.measured } else { Some(c.mean()) };
    let mut s = String::new();
    let _ = writeln!(
        s,
        "candidates on these tables ({} cost against the chosen plan):",
        if measured { "measured" } else { "predicted" }
    );
    let _ = writeln!(
        s,
        "  method        predicted ms  worst member  measured ms  vs chosen"
    );
    let several = guarded.candidates.iter().any(|c| c.run > 0);
    for (i, c) in guarded.candidates.iter().enumerate() {
        let method = match several && c.learned() {
            true => format!("{} ({})", c.method, c.run + 1),
            false => c.method.to_string(),
        };
        let vs = match (key(c), key(chosen)) {
            (Some(x), Some(y)) if y > 0.0 => format!("{:+.2} %", (x / y - 1.0) * 100.0),
            _ => "-".into(),
        };
        let _ = writeln!(
            s,
            "  {:<12}  {:>12.3}  {:>12}  {:>11}  {:>9}{}",
            method,
            c.mean(),
            // A plan priced by the members' mean alone has no worst member.
            match c.predicted.len() {
                1 => "-".to_string(),
                _ => format!("{:.3}", c.pessimistic()),
            },
            c.measured.map_or("-".into(), |m| format!("{m:.3}")),
            vs,
            if i == guarded.chosen {
                "  (chosen)"
            } else {
                ""
            }
        );
    }
    // Methods without a candidate found no plan that fits memory: say so,
    // or the user reads a heuristic left out as one never tried.
    let names = std::iter::once(model::guard::POLICY)
        .chain(model::guard::HEURISTICS.iter().map(|m| m.name()));
    for name in names.filter(|&n| guarded.candidates.iter().all(|c| c.method != n)) {
        let _ = writeln!(s, "  {name:<12}  no plan that fits memory");
    }
    if several {
        let _ = writeln!(s, "  (N): proposed by the N-th --run");
    }
    // Equal up to how the devices are numbered: the same plan.
    let same = |a: &Candidate| {
        use model::mdp::numbered_by_first_use as numbered;
        numbered(&a.plan.assignment) == numbered(&chosen.plan.assignment)
    };
    if !chosen.learned() && guarded.candidates.iter().any(|c| c.learned() && same(c)) {
        let _ = writeln!(
            s,
            "  the learned plan is `{}`'s plan: it is named by the heuristic",
            chosen.method
        );
    }
    match (measured, by_guard, chosen.measured.is_some()) {
        (true, _, _) => {}
        (false, true, _) => {
            let _ = writeln!(
                s,
                "  (unmeasured, the guard ranks the heuristics' plans by their worst member's \
                 prediction, the highest)"
            );
        }
        (false, false, true) => {
            let _ = writeln!(
                s,
                "  (`{}` measured its own plan alone; --verify BACKEND measures every candidate)",
                chosen.method
            );
        }
        (false, false, false) => {
            let _ = writeln!(
                s,
                "  (unmeasured; `--method {}` placed the tables, not the guard)",
                chosen.method
            );
        }
    }
    s
}

/// The placement JSON with the plan's estimate, the method that won, the
/// guard's doubts and every candidate, with the run (of `runs`) that
/// proposed it.
fn placement_document(
    task: &common::Task,
    guarded: &Guarded,
    per_device: &[DeviceCost],
    cost: f64,
    runs: &[PathBuf],
) -> anyhow::Result<serde_json::Value> {
    let plan = guarded.plan();
    let mut v = serde_json::to_value(common::Placement::from_plan(plan, &task.tables))?;
    // The same fields as a measurement's (`benchworker measure --json`).
    v["estimate"] = serde_json::json!({
        "cost_ms": cost,
        "devices": per_device,
    });
    v["method"] = serde_json::json!(guarded.method());
    v["doubts"] = serde_json::json!(guarded.doubts);
    v["narrow_win"] = match guarded.narrow_win() {
        Some(n) => serde_json::json!({
            "rival": n.rival,
            "predicted_change_pct": n.change_pct,
        }),
        None => serde_json::Value::Null,
    };
    v["candidates"] = guarded
        .candidates
        .iter()
        .map(|c| {
            serde_json::json!({
                "method": c.method,
                "predicted_ms": c.mean(),
                "predicted_ms_members": c.predicted,
                "measured_ms": c.measured,
                "run": runs[c.run].display().to_string(),
            })
        })
        .collect();
    Ok(v)
}

/// The shipped pre-trained model (`models/pretrained`), for `plan` and
/// `eval` without `--checkpoint`: looked for under the current folder, then
/// beside the binary's build folder (`target/release/../../models`).
pub fn default_model() -> anyhow::Result<PathBuf> {
    let rel = Path::new("models").join("pretrained");
    let beside_binary = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.parent()?.join(&rel)));
    let tried: Vec<PathBuf> = std::iter::once(rel.clone()).chain(beside_binary).collect();
    tried
        .iter()
        .find(|p| p.join(RunDir::CONFIG).is_file())
        .cloned()
        .ok_or_else(|| {
            anyhow::anyhow!(
                "no --checkpoint given and the shipped model is not at {}: give a trained \
                 run's folder (`learner train --run-dir DIR` makes one)",
                tried
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(" or ")
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use common::Plan;

    fn candidate(method: &'static str, predicted: &[f64]) -> Candidate {
        let plan = Plan {
            devices: 2,
            assignment: vec![0, 1],
        };
        Candidate::new(method, plan, predicted.to_vec())
    }

    /// A doubt of bins the user never gave is told apart from one of
    /// bins the CSV gave.
    #[test]
    fn doubted_default_bins_are_told_apart() {
        let mut t = common::Table::cold("m14", 109, 128, 98.42);
        t.bins = common::generate::default_bins(t.rows, t.pooling_factor);
        let doubt = vec!["out of distribution: bin_16 of `m14` (0.984)".to_string()];
        assert!(doubts_default_bins(&doubt, std::slice::from_ref(&t)));
        assert!(!doubts_default_bins(
            &["rows of `m14`".to_string()],
            &[t.clone()]
        ));
        let given = common::Table::cold("m14", 109, 128, 98.42);
        assert!(!doubts_default_bins(&doubt, &[given]));
    }

    /// The summary's hint names a table alone on its device, and only
    /// where there are other devices.
    #[test]
    fn a_table_alone_on_its_device_is_found() {
        let plan = |devices: usize, assignment: Vec<usize>| Plan {
            devices,
            assignment,
        };
        assert_eq!(lone_table(&plan(3, vec![0, 1, 0, 2, 2]), 1), Some(1));
        assert_eq!(lone_table(&plan(3, vec![0, 1, 0, 2, 2]), 0), None);
        assert_eq!(lone_table(&plan(3, vec![0, 0, 0]), 1), None);
        assert_eq!(lone_table(&plan(1, vec![0]), 0), None);
    }

    /// `--compare` says when the learned plan is the heuristic's chosen.
    #[test]
    fn the_comparison_says_when_the_learned_plan_is_the_heuristics() {
        let mut guarded = Guarded {
            candidates: vec![
                candidate(model::guard::POLICY, &[9.0]),
                candidate("size", &[9.0]),
            ],
            chosen: 1,
            doubts: Vec::new(),
            notes: Vec::new(),
            basins: Vec::new(),
        };
        let text = comparison(&guarded, true);
        assert!(text.contains("the learned plan is `size`'s plan"), "{text}");
        // Devices numbered otherwise: still the same plan.
        guarded.candidates[0].plan.assignment = vec![1, 0];
        assert!(comparison(&guarded, true).contains("the learned plan is `size`'s plan"));
        guarded.candidates[0].plan.assignment = vec![0, 0];
        let text = comparison(&guarded, true);
        assert!(!text.contains("the learned plan is"), "{text}");
    }

    /// `--compare` compares measured costs only where every candidate was
    /// measured, and its last line says who chose.
    #[test]
    fn the_comparison_says_who_chose_and_what_was_measured() {
        let mut guarded = Guarded {
            candidates: vec![candidate("lookup", &[8.0]), candidate("search", &[10.0])],
            chosen: 1,
            doubts: Vec::new(),
            notes: Vec::new(),
            basins: Vec::new(),
        };
        guarded.candidates[1].measured = Some(7.0);
        let text = comparison(&guarded, false);
        assert!(text.contains("(predicted cost against"), "{text}");
        // lookup's prediction against search's: 8 against 10.
        assert!(text.contains("-20.00 %"), "{text}");
        assert!(
            text.contains("`search` measured its own plan alone"),
            "{text}"
        );
        assert!(!text.contains("the guard ranks"), "{text}");
        guarded.candidates[0].measured = Some(7.7);
        let text = comparison(&guarded, false);
        assert!(
            text.contains("(measured cost against") && text.contains("+10.00 %"),
            "{text}"
        );
        let mut named = guarded.clone();
        named.candidates.iter_mut().for_each(|c| c.measured = None);
        let text = comparison(&named, false);
        assert!(
            text.contains("`--method search` placed the tables"),
            "{text}"
        );
        assert!(comparison(&named, true).contains("the guard ranks"));
    }

    /// `--compare` names the methods that found no plan that fits memory,
    /// and only those.
    #[test]
    fn the_comparison_names_methods_without_a_plan_that_fits() {
        let guarded = Guarded {
            candidates: vec![candidate("size", &[9.0]), candidate("lookup", &[8.0])],
            chosen: 1,
            doubts: Vec::new(),
            notes: Vec::new(),
            basins: Vec::new(),
        };
        let text = comparison(&guarded, true);
        let missing: Vec<&str> = text
            .lines()
            .filter(|l| l.ends_with("no plan that fits memory"))
            .filter_map(|l| l.split_whitespace().next())
            .collect();
        assert_eq!(
            missing,
            ["policy", "size_lookup", "torchrec", "dim"],
            "{text}"
        );
    }

    /// The placement JSON names a narrow win with the guard's figures, and
    /// holds `null` once the learned plan wins widely.
    #[test]
    fn the_placement_names_a_narrow_win() {
        let cfg = common::config::Config::default();
        let tables = common::generate::generate_pool(&cfg.generate, 5).unwrap();
        let task = common::Task {
            name: "t".into(),
            devices: 2,
            memory_gb: 100.0,
            tables: tables[..2].to_vec(),
        };
        let mut guarded = Guarded {
            candidates: vec![
                candidate(model::guard::POLICY, &[9.7, 9.5]),
                candidate("lookup", &[10.0, 10.0]),
            ],
            chosen: 0,
            doubts: Vec::new(),
            notes: Vec::new(),
            basins: Vec::new(),
        };
        let per_device = predicted_devices(&[[1.0, 2.0, 0.5], [1.5, 2.0, 0.5]]);
        let runs = [PathBuf::from("run")];
        let doc = placement_document(&task, &guarded, &per_device, 9.6, &runs).unwrap();
        let narrow = &doc["narrow_win"];
        assert_eq!(narrow["rival"], "lookup", "{doc}");
        let change: Vec<f64> = narrow["predicted_change_pct"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g.as_f64().unwrap())
            .collect();
        assert!(
            (change[0] + 5.0).abs() < 1e-9 && (change[1] + 3.0).abs() < 1e-9,
            "cheaper is below zero, as in the warning: {doc}"
        );
        guarded.candidates[0].predicted = vec![9.0, 8.0];
        let doc = placement_document(&task, &guarded, &per_device, 8.5, &runs).unwrap();
        assert!(
            doc.as_object().unwrap().contains_key("narrow_win") && doc["narrow_win"].is_null(),
            "{doc}"
        );
    }
}
