//! `eval`: every method on every task of a suite, measured by one oracle.
//! A method that finds no memory-feasible plan for a task, or whose plan the
//! oracle fails to measure (with a warning naming the task, the method and
//! the oracle's error), is counted as a failure for that task (`null` in
//! `per_task_ms`), never dropped; the other tasks' measurements stand. Only
//! an evaluation in which no measurement succeeded is an error.

use std::collections::BTreeMap;

use benchworker::{Oracle, OracleError};
use common::config::EvalConfig;
use common::fs::fnv1a;
use common::{MemoryModel, Suite};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use model::baselines::{place, Context, Method};
use model::search;

/// One method's results over a suite.
#[derive(Debug, Clone, Serialize)]
pub struct MethodResult {
    /// Mean over the tasks it solved; `None` if it solved none.
    pub mean_cost_ms: Option<f64>,
    pub failures: usize,
    pub per_task_ms: Vec<Option<f64>>,
    /// Its total cost over the tasks both it and the best heuristic solved,
    /// relative to the best heuristic's, in percent (negative is faster).
    pub vs_best_heuristic_pct: Option<f64>,
}

/// A whole evaluation, in the order the methods were asked for.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub suite: String,
    pub backend: String,
    pub tasks: Vec<String>,
    pub best_heuristic: Option<String>,
    pub methods: BTreeMap<String, MethodResult>,
    /// The best heuristic's results where it was not asked for (measured
    /// as the yardstick).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference: Option<MethodResult>,
    #[serde(skip)]
    pub order: Vec<String>,
}

/// What every task of an evaluation shares.
#[derive(Clone, Copy)]
pub struct Setting<'a> {
    pub mem: &'a MemoryModel,
    pub cfg: &'a EvalConfig,
    /// Global batch of the oracle, for TorchRec's estimator.
    pub batch: u64,
    /// The trained runs, with what each was trained on, for the method
    /// `policy` (`plan`'s guarded choice, [`model::guard::plan_jointly`]);
    /// none without a model.
    pub runs: &'a [model::guard::Trained<'a>],
    /// `policy` measures its candidates on the oracle and returns the
    /// measured best, as `learner plan --verify` does.
    pub verify: bool,
}

/// What became of the oracle's measurements over an evaluation.
#[derive(Default)]
struct Outcomes {
    measured: usize,
    /// The first failure, returned if nothing at all was measured.
    first_error: Option<OracleError>,
}

impl Outcomes {
    /// A measurement's cost, or `None` (a failure of `method` on `task`)
    /// with a warning when the oracle failed.
    fn cost(&mut self, task: &str, method: Method, r: Result<f64, OracleError>) -> Option<f64> {
        match r {
            Ok(c) => {
                self.measured += 1;
                Some(c)
            }
            Err(e) => {
                tracing::warn!(
                    "task `{task}`, method `{}`: measuring failed, counted as a failure of \
                     that method on that task: {e}",
                    method.name()
                );
                self.first_error.get_or_insert(e);
                None
            }
        }
    }
}

/// Evaluates `methods` on `suite`. Every heuristic runs on every task, asked
/// for or not: the best of them is the yardstick, and `search` starts from
/// it. `on_task` is called after each task (for a progress bar). A plan the
/// oracle fails to measure is its method's failure on that task; the
/// oracle's error is returned only when it measured nothing at all.
pub fn evaluate(
    suite: &Suite,
    methods: &[Method],
    oracle: &mut dyn Oracle,
    setting: &Setting,
    mut on_task: impl FnMut(),
) -> Result<Report, OracleError> {
    let Setting {
        mem,
        cfg,
        batch,
        runs,
        verify,
    } = *setting;
    let mut per_method: BTreeMap<Method, Vec<Option<f64>>> = BTreeMap::new();
    let mut outcomes = Outcomes::default();
    // `policy`'s choices: the learned plan, a heuristic's, with doubts,
    // and learned plans won by a narrow predicted gain.
    let mut guard_tally = [0usize; 4];
    // With `verify`: the tasks whose measured best was a learned plan
    // (the guard's or another search's end), and those it failed on.
    let (mut verified_learned, mut verify_failed) = (0usize, 0usize);
    for (k, task) in suite.tasks.iter().enumerate() {
        let ctx = Context::for_task(task, mem, batch);
        let task_seed = cfg.seed ^ fnv1a(task.name.as_bytes()) ^ k as u64;
        let mut best_start: Option<(common::Plan, f64)> = None;
        for m in Method::ALL.into_iter().filter(|m| m.is_heuristic()) {
            let mut rng = ChaCha8Rng::seed_from_u64(task_seed ^ fnv1a(m.name().as_bytes()));
            let cost = place(m, &ctx, &mut rng).and_then(|plan| {
                let measured = oracle.measure(&task.tables, &plan).map(|r| r.cost_ms);
                let c = outcomes.cost(&task.name, m, measured)?;
                if best_start.as_ref().is_none_or(|(_, b)| c < *b) {
                    best_start = Some((plan, c));
                }
                Some(c)
            });
            per_method.entry(m).or_default().push(cost);
        }
        if methods.contains(&Method::Search) {
            let cost = best_start.and_then(|(start, _)| {
                let mut rng = ChaCha8Rng::seed_from_u64(task_seed ^ 0x5ea7c4);
                let measured = search::search(
                    oracle,
                    &task.tables,
                    &start,
                    task.cap_bytes(),
                    mem,
                    cfg.search_budget,
                    &mut rng,
                )
                // Measured once more, like every other method: under noise
                // the search's own best figure is biased low.
                .and_then(|out| oracle.measure(&task.tables, &out.plan))
                .map(|r| r.cost_ms);
                outcomes.cost(&task.name, Method::Search, measured)
            });
            per_method.entry(Method::Search).or_default().push(cost);
        }
        if methods.contains(&Method::Policy) && !runs.is_empty() {
            let cost = match model::guard::plan_jointly(runs, task, mem) {
                Ok(mut g) => {
                    guard_tally[usize::from(g.method() != model::guard::POLICY)] += 1;
                    guard_tally[2] += usize::from(!g.doubts.is_empty());
                    guard_tally[3] += usize::from(g.narrow_win().is_some());
                    match verify.then(|| verified(&mut g, runs, task, oracle)) {
                        Some(Err(e)) => {
                            verify_failed += 1;
                            tracing::warn!(
                                "task `{}`, method `policy`: --verify failed, counted as a \
                                 failure of that method on that task: {e:#}",
                                task.name
                            );
                            None
                        }
                        _ => {
                            verified_learned +=
                                usize::from(verify && g.candidates[g.chosen].learned());
                            // Measured once more, like every other method:
                            // under noise the measured best is biased low.
                            let measured =
                                oracle.measure(&task.tables, g.plan()).map(|r| r.cost_ms);
                            outcomes.cost(&task.name, Method::Policy, measured)
                        }
                    }
                }
                Err(_) => None,
            };
            per_method.entry(Method::Policy).or_default().push(cost);
        }
        on_task();
    }
    if guard_tally[0] + guard_tally[1] > 0 {
        tracing::info!(
            "{}: `policy`{} returned the learned plan for {}{} and a heuristic's for {} ({} \
             of them for a doubt of the cost network)",
            suite.path.display(),
            match verify {
                true => "'s guard, before --verify measured,",
                false => "",
            },
            common::count(guard_tally[0], "task"),
            match guard_tally[3] {
                0 => String::new(),
                n => format!(
                    " ({n} of them predicted under {} % cheaper than the best heuristic's: \
                     a narrow win)",
                    model::guard::SURE_GAIN * 100.0
                ),
            },
            common::count(guard_tally[1], "task"),
            guard_tally[2]
        );
    }
    if verify && guard_tally[0] + guard_tally[1] > 0 {
        tracing::info!(
            "{}: --verify: the measured best was a learned plan (the guard's or another \
             search's end) for {} of {}{}",
            suite.path.display(),
            verified_learned,
            common::count(guard_tally[0] + guard_tally[1], "task"),
            match verify_failed {
                0 => String::new(),
                n => format!("; it measured no candidate of {}", common::count(n, "task")),
            }
        );
    }
    if outcomes.measured == 0 {
        if let Some(e) = outcomes.first_error {
            return Err(e);
        }
    }
    Ok(report(suite, oracle.name(), methods, per_method))
}

/// `plan --verify` on `oracle`: the other ends of the runs' searches join
/// `g`'s candidates, every candidate is measured, and the measured best
/// becomes `g`'s choice.
fn verified(
    g: &mut model::guard::Guarded,
    runs: &[model::guard::Trained],
    task: &common::Task,
    oracle: &mut dyn Oracle,
) -> anyhow::Result<()> {
    model::guard::add_basins(g, runs, task);
    model::guard::verify(g, &task.tables, oracle).map(|_| ())
}

/// The best heuristic: fewest failures, then the lowest total over the tasks
/// that every heuristic with that many failures solved.
fn best_heuristic(per_method: &BTreeMap<Method, Vec<Option<f64>>>) -> Option<Method> {
    let failures = |v: &[Option<f64>]| v.iter().filter(|c| c.is_none()).count();
    let heuristics: Vec<(&Method, &Vec<Option<f64>>)> = per_method
        .iter()
        .filter(|(m, v)| m.is_heuristic() && v.iter().any(Option::is_some))
        .collect();
    let fewest = heuristics.iter().map(|(_, v)| failures(v)).min()?;
    let candidates: Vec<_> = heuristics
        .into_iter()
        .filter(|(_, v)| failures(v) == fewest)
        .collect();
    let tasks = candidates[0].1.len();
    let common: Vec<usize> = (0..tasks)
        .filter(|&t| candidates.iter().all(|(_, v)| v[t].is_some()))
        .collect();
    let total = |v: &[Option<f64>]| -> f64 { common.iter().filter_map(|&t| v[t]).sum() };
    candidates
        .into_iter()
        .min_by(|a, b| total(a.1).total_cmp(&total(b.1)))
        .map(|(m, _)| *m)
}

fn report(
    suite: &Suite,
    backend: &str,
    methods: &[Method],
    per_method: BTreeMap<Method, Vec<Option<f64>>>,
) -> Report {
    let best = best_heuristic(&per_method);
    let mut out = BTreeMap::new();
    let mut reference = None;
    // The best heuristic's row too, apart, where it was measured only as
    // the reference.
    let apart = best.filter(|b| !methods.contains(b));
    for m in methods.iter().chain(apart.as_ref()) {
        let Some(v) = per_method.get(m) else {
            continue;
        };
        let solved: Vec<f64> = v.iter().flatten().copied().collect();
        let vs = best.and_then(|b| {
            let (mut mine, mut theirs) = (0.0, 0.0);
            for (x, y) in v.iter().zip(&per_method[&b]) {
                if let (Some(x), Some(y)) = (x, y) {
                    mine += x;
                    theirs += y;
                }
            }
            (theirs > 0.0).then(|| 100.0 * (mine / theirs - 1.0))
        });
        let result = MethodResult {
            mean_cost_ms: (!solved.is_empty())
                .then(|| solved.iter().sum::<f64>() / solved.len() as f64),
            failures: v.len() - solved.len(),
            per_task_ms: v.clone(),
            vs_best_heuristic_pct: vs,
        };
        if Some(*m) == apart {
            reference = Some(result);
        } else {
            out.insert(m.name().to_string(), result);
        }
    }
    Report {
        suite: suite.path.display().to_string(),
        backend: backend.to_string(),
        tasks: suite.tasks.iter().map(|t| t.name.clone()).collect(),
        best_heuristic: best.map(|m| m.name().to_string()),
        methods: out,
        reference,
        order: methods.iter().map(|m| m.name().to_string()).collect(),
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "suite {} — {}, backend {}",
            self.suite,
            common::count(self.tasks.len(), "task"),
            self.backend
        )?;
        writeln!(
            f,
            "{:<12} {:>12} {:>8} {:>20}",
            "method", "mean_cost_ms", "failed", "vs_best_heuristic"
        )?;
        // Means over fewer tasks than the others' are not comparable as
        // they stand: marked, with a note.
        let fewest = self.methods.values().map(|r| r.failures).min().unwrap_or(0);
        let mut marked = false;
        for name in &self.order {
            let Some(r) = self.methods.get(name) else {
                continue;
            };
            let partial = r.failures > fewest && r.mean_cost_ms.is_some();
            marked |= partial;
            let mean = r.mean_cost_ms.map_or("-".to_string(), |x| {
                format!("{x:.3}{}", if partial { "*" } else { "" })
            });
            let vs = r
                .vs_best_heuristic_pct
                .map_or("-".to_string(), |x| format!("{x:+.2}%"));
            writeln!(
                f,
                "{name:<12} {mean:>12} {:>8} {vs:>20}",
                format!("{}/{}", r.failures, self.tasks.len())
            )?;
        }
        if let (Some(name), Some(r)) = (&self.best_heuristic, &self.reference) {
            if let Some(mean) = r.mean_cost_ms {
                writeln!(
                    f,
                    "{name:<12} {mean:>12.3} {:>8} {:>20}  (not asked for: the yardstick)",
                    format!("{}/{}", r.failures, self.tasks.len()),
                    "+0.00%"
                )?;
            }
        }
        if marked {
            writeln!(
                f,
                "* mean over the tasks the method solved, fewer than another's: \
                 compare by vs_best_heuristic (over the tasks both solved)"
            )?;
        }
        writeln!(
            f,
            "best heuristic: {}",
            self.best_heuristic
                .as_deref()
                .unwrap_or("none (no heuristic was run, or none placed any task)")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use benchworker::sim::SimOracle;
    use common::config::SimConfig;
    use common::generate::{generate_pool, PoolGenConfig};
    use common::suite::{generate, write, SuiteSpec};

    fn suite(dir: &std::path::Path, memory_gb: f64) -> Suite {
        let pool = generate_pool(
            &PoolGenConfig {
                tables: 60,
                ..Default::default()
            },
            2,
        )
        .unwrap();
        common::pool::write(&dir.join("pool.csv"), &pool).unwrap();
        let spec = SuiteSpec {
            name: "t".into(),
            tables_per_task: 12,
            devices: 3,
            memory: common::suite::SuiteMemory::Gb(memory_gb),
            tasks: 3,
        };
        let mem = MemoryModel::default();
        let file = generate(&spec, &pool, "pool.csv", &mem, 0).unwrap();
        write(&dir.join("s.json"), &file).unwrap();
        Suite::load(&dir.join("s.json"), &mem).unwrap()
    }

    fn budget(search_budget: usize) -> EvalConfig {
        EvalConfig {
            search_budget,
            seed: 0,
        }
    }

    /// An evaluation of the sim's batch, with no trained model.
    fn without_model<'a>(mem: &'a MemoryModel, cfg: &'a EvalConfig) -> Setting<'a> {
        Setting {
            mem,
            cfg,
            batch: 65536,
            runs: &[],
            verify: false,
        }
    }

    #[test]
    fn every_method_reports_every_task_and_search_is_best() {
        let dir = tempfile::tempdir().unwrap();
        let s = suite(dir.path(), 1000.0);
        let mem = MemoryModel::default();
        let mut sim = SimOracle::new(SimConfig::default(), mem);
        let cfg = budget(300);
        let setting = without_model(&mem, &cfg);
        let mut calls = 0;
        let r = evaluate(&s, &Method::ALL, &mut sim, &setting, || calls += 1).unwrap();
        assert_eq!(calls, 3);
        for m in Method::ALL {
            let res = &r.methods[m.name()];
            assert_eq!(res.per_task_ms.len(), 3, "{}", m.name());
            assert_eq!(res.failures, 0);
        }
        let best = r.best_heuristic.clone().unwrap();
        let best_tasks = &r.methods[&best].per_task_ms;
        let mut improved = 0;
        for (s, h) in r.methods["search"].per_task_ms.iter().zip(best_tasks) {
            assert!(s.unwrap() <= h.unwrap() + 1e-9);
            improved += usize::from(s.unwrap() < h.unwrap() - 1e-9);
        }
        assert!(
            improved > 0,
            "search improves on the best heuristic somewhere"
        );
        // The yardstick does not depend on which methods are asked for.
        let mut sim = SimOracle::new(SimConfig::default(), mem);
        let only = evaluate(&s, &[Method::Random], &mut sim, &setting, || {}).unwrap();
        assert_eq!(only.best_heuristic, r.best_heuristic);
        assert_eq!(only.methods.len(), 1);
        // The yardstick's own row is printed apart, and only then.
        let best = only.best_heuristic.clone().unwrap();
        assert!(
            only.to_string()
                .lines()
                .any(|l| l.starts_with(&best) && l.ends_with("(not asked for: the yardstick)")),
            "{only}"
        );
        assert!(!r.to_string().contains("not asked for"), "{r}");
        assert!(only.methods["random"].vs_best_heuristic_pct.unwrap() > 0.0);
        let json = serde_json::to_value(&r).unwrap();
        assert!(json["methods"]["size"]["per_task_ms"].is_array());
        assert!(r.to_string().contains("best heuristic"));
    }

    #[test]
    fn verify_returns_the_measured_best_of_the_policys_candidates() {
        let dir = tempfile::tempdir().unwrap();
        let s = suite(dir.path(), 1000.0);
        let mem = MemoryModel::default();
        let cfg = budget(0);
        // Untrained networks: their learned plans are as likely to lose
        // as to win, so only measuring keeps `policy` at the heuristics'
        // best.
        let model_cfg = common::config::Config::default();
        let model = model::Model::seeded(&model_cfg, 3);
        let runs = [model::guard::Trained::alone(&model, None)];
        let methods: Vec<Method> = Method::ALL
            .into_iter()
            .filter(|m| m.is_heuristic())
            .chain([Method::Policy])
            .collect();
        let mut results = Vec::new();
        for verify in [false, true] {
            let mut oracle = FailingOn::none(mem);
            let setting = Setting {
                runs: &runs,
                verify,
                ..without_model(&mem, &cfg)
            };
            let r = evaluate(&s, &methods, &mut oracle, &setting, || {}).unwrap();
            results.push((r, oracle.measured));
        }
        let ((plain, plain_n), (verified, verified_n)) = (&results[0], &results[1]);
        let policy = |r: &Report| r.methods["policy"].per_task_ms.clone();
        for (k, (v, p)) in policy(verified).iter().zip(policy(plain)).enumerate() {
            let v = v.expect("verified plan measured");
            assert!(v <= p.unwrap() + 1e-9, "task {k}: verified {v} above {p:?}");
            // The heuristics `plan` weighs (not `random` or `round_robin`).
            for m in model::guard::HEURISTICS {
                if let Some(h) = verified.methods[m.name()].per_task_ms[k] {
                    assert!(
                        v <= h + 1e-9,
                        "task {k}: verified {v} above {} {h}",
                        m.name()
                    );
                }
            }
        }
        // The other ends of the searches join the candidates, and every
        // candidate is measured.
        let task = &s.tasks[0];
        let mut g = runs[0].plan(task, &mem).unwrap();
        let known =
            |g: &model::guard::Guarded, p: &common::Plan| g.candidates.iter().any(|c| c.plan == *p);
        let mut new_ends: Vec<&common::Plan> = Vec::new();
        for (_, p) in &g.basins {
            if !known(&g, p) && !new_ends.contains(&p) {
                new_ends.push(p);
            }
        }
        let (before, added) = (g.candidates.len(), new_ends.len());
        assert!(
            added > 0,
            "the searches end in plans not among the candidates"
        );
        let mut oracle = FailingOn::none(mem);
        super::verified(&mut g, &runs, task, &mut oracle).unwrap();
        assert_eq!(g.candidates.len(), before + added);
        assert!(g.candidates.iter().all(|c| c.measured.is_some()));
        let best = (g.candidates.iter())
            .map(|c| c.measured.unwrap())
            .fold(f64::INFINITY, f64::min);
        assert_eq!(g.candidates[g.chosen].measured, Some(best));
        let gained = (policy(verified).iter().zip(policy(plain)))
            .filter(|(v, p)| v.unwrap() < p.unwrap() - 1e-9)
            .count();
        assert!(
            gained > 0,
            "an untrained network's plan lost somewhere, and --verify saw it"
        );
        assert!(
            verified_n > plain_n,
            "--verify measures candidates: {verified_n} against {plain_n} measurements"
        );
    }

    /// The sim oracle, failing every plan of the tasks with these tables,
    /// counting the plans it measured.
    struct FailingOn {
        sim: SimOracle,
        tasks: Vec<Vec<String>>,
        measured: usize,
    }

    impl FailingOn {
        fn none(mem: MemoryModel) -> FailingOn {
            FailingOn {
                sim: SimOracle::new(SimConfig::default(), mem),
                tasks: Vec::new(),
                measured: 0,
            }
        }
    }

    impl Oracle for FailingOn {
        fn name(&self) -> &'static str {
            "sim"
        }

        fn measure(
            &mut self,
            tables: &[common::Table],
            plan: &common::Plan,
        ) -> Result<common::Measurement, OracleError> {
            let names: Vec<String> = tables.iter().map(|t| t.name.clone()).collect();
            self.measured += 1;
            if self.tasks.contains(&names) {
                return Err(OracleError::Backend {
                    backend: "sim",
                    message: "can't allocate memory".into(),
                });
            }
            self.sim.measure(tables, plan)
        }
    }

    #[test]
    fn a_task_the_oracle_fails_on_fails_there_and_the_others_stand() {
        let dir = tempfile::tempdir().unwrap();
        let s = suite(dir.path(), 1000.0);
        let mem = MemoryModel::default();
        let cfg = budget(100);
        let setting = without_model(&mem, &cfg);
        let names = |k: usize| -> Vec<String> {
            s.tasks[k].tables.iter().map(|t| t.name.clone()).collect()
        };
        let mut sim = SimOracle::new(SimConfig::default(), mem);
        let whole = evaluate(&s, &Method::ALL, &mut sim, &setting, || {}).unwrap();
        let mut failing = FailingOn {
            tasks: vec![names(1)],
            ..FailingOn::none(mem)
        };
        let mut calls = 0;
        let r = evaluate(&s, &Method::ALL, &mut failing, &setting, || calls += 1).unwrap();
        assert_eq!(calls, 3, "every task is evaluated");
        assert_eq!(r.methods.len(), whole.methods.len());
        for (name, res) in &r.methods {
            let all = &whole.methods[name].per_task_ms;
            assert_eq!(res.per_task_ms[1], None, "{name}");
            assert_eq!(res.failures, 1, "{name}");
            assert_eq!(
                (res.per_task_ms[0], res.per_task_ms[2]),
                (all[0], all[2]),
                "{name}: the tasks measured are kept"
            );
            assert!(res.mean_cost_ms.is_some(), "{name}");
        }
        assert!(r.to_string().contains("1/3"));
        // Every method over the same tasks: no mean marked.
        assert!(!r.to_string().contains('*'), "{r}");
        // One over fewer: its mean is marked, and the note says why.
        let mut fewer = r.clone();
        fewer.methods.get_mut("lookup").unwrap().failures = 2;
        let text = fewer.to_string();
        let line = text.lines().find(|l| l.starts_with("lookup ")).unwrap();
        assert!(line.contains('*'), "{text}");
        assert!(
            text.contains("* mean over the tasks the method solved"),
            "{text}"
        );
        assert_eq!(text.matches('*').count(), 2, "{text}");
        // Nothing measured at all: the oracle's error.
        failing.tasks = (0..3).map(names).collect();
        let e = evaluate(&s, &Method::ALL, &mut failing, &setting, || {}).unwrap_err();
        assert!(e.to_string().contains("can't allocate memory"), "{e}");
    }

    #[test]
    fn failures_are_counted_not_dropped() {
        // Three tables on two devices of 10000 rows' room: A (6000 rows) must
        // sit alone. `lookup` places B and C first, one per device, and then
        // has no room for A; TorchRec's partitioner places A first.
        let dir = tempfile::tempdir().unwrap();
        let mem = MemoryModel::default();
        let mk = |name: &str, rows: u64, pooling: f64| common::Table::cold(name, rows, 16, pooling);
        let tables = vec![mk("A", 6000, 1.0), mk("B", 5000, 10.0), mk("C", 5000, 9.0)];
        common::pool::write(&dir.path().join("pool.csv"), &tables).unwrap();
        let cap_gb =
            (10_000 * mem.table_bytes(&tables[0]) / 6000) as f64 / common::table::BYTES_PER_GB;
        let task = common::suite::TaskSpec {
            name: "tight".into(),
            devices: 2,
            memory_gb: cap_gb,
            tables: vec!["A".into(), "B".into(), "C".into()],
        };
        let file = common::suite::SuiteFile {
            pool: "pool.csv".into(),
            tasks: vec![
                task.clone(),
                common::suite::TaskSpec {
                    name: "tight too".into(),
                    ..task
                },
            ],
        };
        write(&dir.path().join("s.json"), &file).unwrap();
        let s = Suite::load(&dir.path().join("s.json"), &mem).unwrap();
        let mut sim = SimOracle::new(SimConfig::default(), mem);
        let r = evaluate(
            &s,
            &[Method::Lookup, Method::Torchrec],
            &mut sim,
            &without_model(&mem, &EvalConfig::default()),
            || {},
        )
        .unwrap();
        assert_eq!(
            r.methods.len(),
            2,
            "only the methods asked for are reported"
        );
        let lookup = &r.methods["lookup"];
        assert_eq!(lookup.failures, 2);
        assert_eq!(lookup.per_task_ms, vec![None, None]);
        assert_eq!(lookup.mean_cost_ms, None);
        assert_eq!(r.methods["torchrec"].failures, 0);
        // A heuristic that failed is never the yardstick over one that did not.
        let best = r.best_heuristic.as_deref().unwrap();
        assert_ne!(best, "lookup");
        assert!(r.to_string().contains("2/2"));
    }
}
