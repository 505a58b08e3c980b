//! Where a trained model's plans lose to the `search` reference: for each
//! task of a suite, the model's `plan` and the reference's plan (local
//! search on the `sim` oracle from `torchrec`'s plan), each measured and
//! predicted by the model's cost network. A cost network that ranked plans
//! well would predict the reference's plan cheaper than its own. With
//! `--second RUN`, another run's cost network predicts the same three
//! plans too (the shipped model's second opinion, say), in a last column.
//!
//! cargo run --release --example gap -- RUN_DIR SUITE [SEARCH_BUDGET] [--second RUN]
use benchworker::sim::SimOracle;
use benchworker::Oracle;
use common::Suite;
use model::baselines::{place, Context, Method};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

fn main() -> anyhow::Result<()> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let second = match args.iter().position(|a| a == "--second") {
        Some(i) => {
            anyhow::ensure!(i + 1 < args.len(), "--second needs a run directory");
            let dir = args.remove(i + 1);
            args.remove(i);
            Some(learner::checkpoint::load_run(std::path::Path::new(&dir))?.1)
        }
        None => None,
    };
    anyhow::ensure!(
        args.len() >= 2,
        "usage: gap RUN_DIR SUITE [SEARCH_BUDGET] [--second RUN]"
    );
    let (cfg, model) = learner::checkpoint::load_run(std::path::Path::new(&args[0]))?;
    let suite = Suite::load(std::path::Path::new(&args[1]), &cfg.memory)?;
    let budget: usize = args.get(2).map(|b| b.parse()).transpose()?.unwrap_or(4000);
    let mut sim = SimOracle::new(cfg.sim.clone(), cfg.memory);
    // Mean measured and predicted cost of: torchrec, the model's plan, the
    // reference; then the second network's predictions of the three.
    let mut sums = [0.0f64; 9];
    println!(
        "task  torchrec (measured / predicted)  plan  reference{}",
        if second.is_some() {
            "  second's predictions of the three"
        } else {
            ""
        }
    );
    for task in &suite.tasks {
        let ctx = Context::for_task(task, &cfg.memory, cfg.sim.batch);
        let mut rng = ChaCha8Rng::seed_from_u64(cfg.eval.seed);
        let start = place(Method::Torchrec, &ctx, &mut rng)
            .ok_or_else(|| anyhow::anyhow!("{}: torchrec found no plan", task.name))?;
        let (own, _) = model.plan(task, &cfg.memory);
        let reference = model::search::search(
            &mut sim,
            &task.tables,
            &start,
            task.cap_bytes(),
            &cfg.memory,
            budget,
            &mut rng,
        )?
        .plan;
        let mut row = [0.0f64; 9];
        for (k, plan) in [&start, &own, &reference].into_iter().enumerate() {
            row[2 * k] = sim.measure(&task.tables, plan)?.cost_ms;
            row[2 * k + 1] = model.estimate(&task.tables, plan).1;
            if let Some(second) = &second {
                row[6 + k] = second.estimate(&task.tables, plan).1;
            }
        }
        println!("{}  {}", task.name, columns(&row, second.is_some()));
        for (s, r) in sums.iter_mut().zip(row) {
            *s += r / suite.tasks.len() as f64;
        }
    }
    println!("mean  {}", columns(&sums, second.is_some()));
    Ok(())
}

/// A row's figures: measured / predicted for each plan, then the second
/// network's predictions where there is one.
fn columns(r: &[f64; 9], second: bool) -> String {
    let mut s = format!(
        "{:.3} / {:.3}  {:.3} / {:.3}  {:.3} / {:.3}",
        r[0], r[1], r[2], r[3], r[4], r[5]
    );
    if second {
        s += &format!("  {:.3} {:.3} {:.3}", r[6], r[7], r[8]);
    }
    s
}
