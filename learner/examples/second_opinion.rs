//! Would a second model's opinion make `plan`'s guard safer? Per task of a
//! suite, what `guard_diag` prints (each candidate's member predictions
//! and its `sim` measurement), and beside it the member predictions of a
//! second model (the pre-trained one, say), for replaying guard rules that
//! consult both. docs/results.md, "The main job over five seeds", gives
//! what one such rule did.
//!
//! cargo run --release --example second_opinion -- RUN SECOND_RUN SUITE
fn main() -> anyhow::Result<()> {
    tch::set_num_threads(1);
    let args: Vec<String> = std::env::args().skip(1).collect();
    let run = std::path::Path::new(&args[0]);
    let (cfg, model) = learner::checkpoint::load_run(run)?;
    let (_, second) = learner::checkpoint::load_run(std::path::Path::new(&args[1]))?;
    let shapes = model::shapes::TrainedShapes::read(run);
    let suite = common::Suite::load(std::path::Path::new(&args[2]), &cfg.memory)?;
    let mut oracle = benchworker::build(benchworker::Backend::Sim, &cfg)?;
    for task in &suite.tasks {
        let mut g = model::guard::plan(&model, shapes.as_ref(), task, &cfg.memory)?;
        let chosen = g.chosen;
        model::guard::verify(&mut g, &task.tables, oracle.as_mut())?;
        let plans: Vec<&common::Plan> = g.candidates.iter().map(|c| &c.plan).collect();
        let other = second.member_costs(&task.tables, &plans);
        println!(
            "  {} ({} tables, {} devices): chose {}",
            task.name,
            task.tables.len(),
            task.devices,
            g.candidates[chosen].method
        );
        for (c, o) in g.candidates.iter().zip(other) {
            println!(
                "    {:12} predicted {:9.3} (max {:9.3}) measured {:9.3} members {:?} second {:?}",
                c.method,
                c.mean(),
                c.pessimistic(),
                c.measured.unwrap_or(f64::NAN),
                c.predicted,
                o
            );
        }
    }
    Ok(())
}
