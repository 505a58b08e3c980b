//! What `plan`'s guard chose on each task of a suite, and what it would have
//! measured: per task, every candidate's mean and pessimistic prediction and
//! its `sim` measurement, the candidate chosen, and the doubts. Tasks where
//! the choice measured over 1 % above the best candidate are marked `!`.
//! The `moved` line counts the tables the learned plan places elsewhere
//! than each heuristic's plan, once devices are matched. The line under
//! each candidate gives its heaviest device's load, four ways. The
//! `basins` line gives what `plan --verify` measures best once the other
//! ends of the learned plan's searches join the candidates
//! ([`model::guard::add_basins`]); the next line sums it over the suite.
//! The last line judges the cost network where the guard relies on it:
//! over every pair of the learned plan and a heuristic's plan that differs
//! from it, the error of the predicted cost ratio (the members' mean)
//! against the measured one, and the pairs that every member predicted at least 2 % cheaper
//! for the learned plan yet measured over 1 % dearer.
//!
//! cargo run --release --example guard_diag -- RUN_DIR SUITE

fn main() -> anyhow::Result<()> {
    tch::set_num_threads(1);
    let args: Vec<String> = std::env::args().skip(1).collect();
    let run = std::path::Path::new(&args[0]);
    let (cfg, model) = learner::checkpoint::load_run(run)?;
    let shapes = model::shapes::TrainedShapes::read(run);
    let suite = common::Suite::load(std::path::Path::new(&args[1]), &cfg.memory)?;
    let mut oracle = benchworker::build(benchworker::Backend::Sim, &cfg)?;
    let (mut verified, mut with_basins) = (0.0, 0.0);
    let mut ratios = Ratios::default();
    for task in &suite.tasks {
        let mut g = model::guard::plan(&model, shapes.as_ref(), task, &cfg.memory)?;
        let chosen = g.chosen;
        model::guard::verify(&mut g, &task.tables, oracle.as_mut())?;
        let best = g.candidates[g.chosen].measured.unwrap_or(f64::NAN);
        let got = g.candidates[chosen].measured.unwrap_or(f64::NAN);
        let mark = if got > best * 1.01 { "!" } else { " " };
        println!(
            "{mark} {} ({} tables, {} devices): chose {} {:+.2} % vs the measured best",
            task.name,
            task.tables.len(),
            task.devices,
            g.candidates[chosen].method,
            (got / best - 1.0) * 100.0
        );
        for c in &g.candidates {
            println!(
                "    {:12} predicted {:9.3} (max {:9.3}) measured {:9.3} members {:?}",
                c.method,
                c.mean(),
                c.pessimistic(),
                c.measured.unwrap_or(f64::NAN),
                c.predicted
            );
            println!("      heaviest device: {}", load(&task.tables, &c.plan));
        }
        if g.candidates[0].method == model::guard::POLICY {
            let learned = &g.candidates[0].plan;
            let counts: Vec<String> = g.candidates[1..]
                .iter()
                .map(|c| format!("{} {}", c.method, moved(learned, &c.plan)))
                .collect();
            println!("    moved: {}", counts.join(", "));
        }
        for d in &g.doubts {
            println!("    doubt: {d}");
        }
        ratios.add(&g.candidates);
        let added = model::guard::add_basins(
            &mut g,
            &[model::guard::Trained::alone(&model, shapes.as_ref())],
            task,
        );
        model::guard::verify(&mut g, &task.tables, oracle.as_mut())?;
        let basins = g.candidates[g.chosen].measured.unwrap_or(f64::NAN);
        println!(
            "    basins: {added} more measured, best {basins:.3} ({:+.2} %)",
            (basins / best - 1.0) * 100.0
        );
        verified += best;
        with_basins += basins;
    }
    println!(
        "--verify: {verified:.3} ms over the suite; with the other basins {with_basins:.3} ms \
         ({:+.2} %)",
        (with_basins / verified - 1.0) * 100.0
    );
    println!("{}", ratios.summary());
    Ok(())
}

/// The predicted gain of the ratio line's "rated cheaper by every member":
/// the shipped guard's margin (`model.plan_margin`).
const SURE: f64 = 0.02;

/// The cost network's errors on the cost ratios of the learned plan to the
/// heuristics' plans, over a suite.
#[derive(Default)]
struct Ratios {
    /// `ln(predicted ratio) − ln(measured ratio)` of each pair.
    errors: Vec<f64>,
    /// Pairs every member rated 2 % cheaper for the learned plan that
    /// measured over 1 % dearer.
    sure_and_wrong: usize,
}

impl Ratios {
    /// The pairs of a task's measured candidates (none without a learned
    /// plan), each heuristic's plan that differs from the learned one.
    fn add(&mut self, candidates: &[model::guard::Candidate]) {
        let Some((learned, others)) = candidates.split_first() else {
            return;
        };
        if learned.method != model::guard::POLICY {
            return;
        }
        let Some(ml) = learned.measured else {
            return;
        };
        // A heuristic's plan the learned one equals (a search that kept
        // its start) is no comparison: its error is zero by construction.
        let compared = others
            .iter()
            .filter(|c| c.method != model::guard::BASIN && c.plan != learned.plan);
        for h in compared {
            let Some(mh) = h.measured else {
                continue;
            };
            self.errors
                .push((learned.mean() / h.mean()).ln() - (ml / mh).ln());
            if model::guard::cheaper_by(learned, h, SURE) && ml > mh * 1.01 {
                self.sure_and_wrong += 1;
            }
        }
    }

    fn summary(&self) -> String {
        let n = self.errors.len().max(1) as f64;
        let mean = self.errors.iter().map(|e| e.abs()).sum::<f64>() / n;
        let rms = (self.errors.iter().map(|e| e * e).sum::<f64>() / n).sqrt();
        format!(
            "ratios: {} pairs of the learned plan and a differing heuristic plan, mean |error| {:.2} %, rms \
             {:.2} %; {} rated 2 % cheaper by every member, measured over 1 % dearer",
            self.errors.len(),
            mean * 100.0,
            rms * 100.0,
            self.sure_and_wrong
        )
    }
}

/// Tables that differ between two plans once devices are matched by
/// overlap (greedily, largest overlap first): an upper bound on the fewest
/// moves that turn one plan into the other.
fn moved(a: &common::Plan, b: &common::Plan) -> usize {
    let d = a.devices;
    let mut overlap = vec![vec![0usize; d]; d];
    for (&x, &y) in a.assignment.iter().zip(&b.assignment) {
        overlap[x][y] += 1;
    }
    let mut pairs: Vec<(usize, usize, usize)> = (0..d)
        .flat_map(|x| (0..d).map(move |y| (x, y)))
        .map(|(x, y)| (overlap[x][y], x, y))
        .collect();
    pairs.sort_unstable_by(|p, q| q.cmp(p));
    let (mut used_a, mut used_b, mut kept) = (vec![false; d], vec![false; d], 0);
    for (n, x, y) in pairs {
        if !used_a[x] && !used_b[y] {
            used_a[x] = true;
            used_b[y] = true;
            kept += n;
        }
    }
    a.assignment.len() - kept
}

/// The plan's heaviest device, four ways: lookups per sample (pooling
/// summed), lookup width (pooling × dim), unique rows' width (pooling × dim
/// / mean reuse), and tables.
fn load(tables: &[common::Table], plan: &common::Plan) -> String {
    let mut per = vec![[0.0f64; 4]; plan.devices];
    for (t, &d) in tables.iter().zip(&plan.assignment) {
        let width = t.pooling_factor * t.dim as f64;
        per[d][0] += t.pooling_factor;
        per[d][1] += width;
        per[d][2] += width / t.mean_reuse();
        per[d][3] += 1.0;
    }
    let max = |k: usize| per.iter().map(|p| p[k]).fold(0.0, f64::max);
    format!(
        "lookups {:.3}, width {:.3}, unique width {:.3}, tables {}",
        max(0),
        max(1),
        max(2),
        max(3)
    )
}
