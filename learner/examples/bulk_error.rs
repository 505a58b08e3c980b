//! A model's relative error of the iteration cost on a pre-training run's
//! bulk: on every 20th plan of the tasks the run trains on, and on every
//! plan of its held-out tasks (every 20th task). For a model pre-trained
//! on that bulk, close figures mean the network underfits; a far lower
//! first figure, that it overfits. The plans its search rounds added are
//! left out. The bulk is drawn again from `PRETRAIN_RUN`'s configuration
//! (`sim` is deterministic), so the model may come from another run: then
//! both figures are on tasks it may never have seen.
//!
//! cargo run --release --example bulk_error -- MODEL_RUN PRETRAIN_RUN
fn main() -> anyhow::Result<()> {
    tch::set_num_threads(1);
    let args: Vec<String> = std::env::args().skip(1).collect();
    anyhow::ensure!(args.len() == 2, "usage: bulk_error MODEL_RUN PRETRAIN_RUN");
    let run = std::path::Path::new(&args[0]);
    let (_, model) = learner::checkpoint::load_run(run)?;
    let (cfg, _) = learner::checkpoint::load_run(std::path::Path::new(&args[1]))?;
    let tasks = learner::pretrain::tasks(&cfg);
    let (bulk, held) = learner::pretrain::bulk(&cfg, &tasks, &|| {})?;
    let trained: Vec<_> = bulk.iter().step_by(20).cloned().collect();
    let (a, b) = learner::pretrain::relative_error(&model, &trained);
    let (c, d) = learner::pretrain::relative_error(&model, &held);
    println!(
        "{}: the run's training tasks {:.2} % (p90 {:.2} %), its held-out tasks {:.2} % (p90 {:.2} %)",
        run.display(),
        a * 100.0,
        b * 100.0,
        c * 100.0,
        d * 100.0
    );
    Ok(())
}
