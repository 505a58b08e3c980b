//! How much of the cost network's error is the exchange? For every task of
//! each suite, the guard's candidates (the learned plan and the
//! heuristics') are predicted and measured on `sim`. Per suite it prints
//! the mean error of the predicted iteration cost, the same with each
//! device's measured exchange in place of the predicted one, the same
//! with the measured forward and backward in place of theirs, and the
//! exchanges' share of the measured cost (`2 × the slowest exchange`).
//!
//! cargo run --release --example exchange_error -- RUN_DIR SUITE...

fn main() -> anyhow::Result<()> {
    tch::set_num_threads(1);
    let args: Vec<String> = std::env::args().skip(1).collect();
    anyhow::ensure!(args.len() >= 2, "usage: exchange_error RUN_DIR SUITE...");
    let run = std::path::Path::new(&args[0]);
    let (cfg, model) = learner::checkpoint::load_run(run)?;
    let shapes = model::shapes::TrainedShapes::read(run);
    let mut oracle = benchworker::build(benchworker::Backend::Sim, &cfg)?;
    println!("| suite | plans | error | with the measured exchange | with the measured compute | exchange share |");
    println!("|---|---|---|---|---|---|");
    for path in &args[1..] {
        let suite = common::Suite::load(std::path::Path::new(path), &cfg.memory)?;
        // Sums of |relative error| as predicted, with the measured
        // exchange, with the measured compute; of the exchange's share.
        let mut sums = [0.0f64; 4];
        let mut plans = 0usize;
        for task in &suite.tasks {
            let g = model::guard::plan(&model, shapes.as_ref(), task, &cfg.memory)?;
            for c in &g.candidates {
                let m = oracle.measure(&task.tables, &c.plan)?;
                let (pred, overall) = model.estimate(&task.tables, &c.plan);
                // `max_d fwd + max_d (bwd + 2 · exchange)`, as composed.
                let compose = |cost: &dyn Fn(usize) -> [f64; 3]| {
                    let (mut fwd, mut rest) = (0.0f64, 0.0f64);
                    for d in 0..pred.len() {
                        let [f, b, x] = cost(d);
                        fwd = fwd.max(f);
                        rest = rest.max(b + 2.0 * x);
                    }
                    fwd + rest
                };
                let dev = &m.devices;
                let exchange = compose(&|d| [pred[d][0], pred[d][1], dev[d].bwd_comm_ms]);
                let compute = compose(&|d| [dev[d].fwd_ms, dev[d].bwd_ms, pred[d][2]]);
                let slowest = dev.iter().map(|d| d.bwd_comm_ms).fold(0.0, f64::max);
                let err = |x: f64| (x / m.cost_ms - 1.0).abs();
                for (s, v) in sums.iter_mut().zip([
                    err(overall),
                    err(exchange),
                    err(compute),
                    2.0 * slowest / m.cost_ms,
                ]) {
                    *s += v;
                }
                plans += 1;
            }
        }
        let pct = |s: f64| 100.0 * s / plans.max(1) as f64;
        println!(
            "| {path} | {plans} | {:.2} % | {:.2} % | {:.2} % | {:.1} % |",
            pct(sums[0]),
            pct(sums[1]),
            pct(sums[2]),
            pct(sums[3])
        );
    }
    Ok(())
}
