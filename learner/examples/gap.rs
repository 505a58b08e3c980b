//! Where a trained model's plans lose to the `search` reference: for each
//! task of a suite, the model's `plan` and the reference's plan (local
//! search on the `sim` oracle from `torchrec`'s plan), each measured and
//! predicted by the model's cost network. A cost network that ranked plans
//! well would predict the reference's plan cheaper than its own.
//!
//! cargo run --release --example gap -- RUN_DIR SUITE [SEARCH_BUDGET]
use benchworker::sim::SimOracle;
use benchworker::Oracle;
use common::Suite;
use model::baselines::{place, Context, Method};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    anyhow::ensure!(args.len() >= 2, "usage: gap RUN_DIR SUITE [SEARCH_BUDGET]");
    let (cfg, model) = learner::checkpoint::load_run(std::path::Path::new(&args[0]))?;
    let suite = Suite::load(std::path::Path::new(&args[1]), &cfg.memory)?;
    let budget: usize = args.get(2).map(|b| b.parse()).transpose()?.unwrap_or(4000);
    let mut sim = SimOracle::new(cfg.sim.clone(), cfg.memory);
    // Mean measured and predicted cost of: torchrec, the model's plan, the reference.
    let mut sums = [0.0f64; 6];
    println!("task  torchrec (measured / predicted)  plan  reference");
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
        let mut row = [0.0f64; 6];
        for (k, plan) in [&start, &own, &reference].into_iter().enumerate() {
            row[2 * k] = sim.measure(&task.tables, plan)?.cost_ms;
            row[2 * k + 1] = model.estimate(&task.tables, plan).1;
        }
        println!(
            "{}  {:.3} / {:.3}  {:.3} / {:.3}  {:.3} / {:.3}",
            task.name, row[0], row[1], row[2], row[3], row[4], row[5]
        );
        for (s, r) in sums.iter_mut().zip(row) {
            *s += r / suite.tasks.len() as f64;
        }
    }
    println!(
        "mean  {:.3} / {:.3}  {:.3} / {:.3}  {:.3} / {:.3}",
        sums[0], sums[1], sums[2], sums[3], sums[4], sums[5]
    );
    Ok(())
}
