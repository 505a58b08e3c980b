//! Each method's plans with their devices' compute measured one device at a
//! time: for a host with fewer GPUs than the suite's tasks have devices.
//! Every device's tables are measured as a one-device plan (its fused
//! forward and backward, no exchange) and a plan costs its slowest device's
//! compute. On `cuda` with one GPU this checks whether what a policy
//! trained on `sim` gains over the heuristics holds on real kernels; on
//! `sim` it gives the same figure from the model (docs/gpu.md).
//!
//! cargo run --release --example compute_check -- RUN_DIR SUITE.json sim|cpu|cuda [TASKS]
//!
//! TASKS: only the suite's first so many tasks.
use benchworker::{Backend, Oracle, OracleError};
use common::{DeviceCost, Measurement, Plan, Table};
use model::baselines::Method;

/// Measures a plan's devices one after another as one-device plans.
struct OneDeviceAtATime(Box<dyn Oracle>);

impl Oracle for OneDeviceAtATime {
    fn name(&self) -> &'static str {
        self.0.name()
    }

    fn measure(&mut self, tables: &[Table], plan: &Plan) -> Result<Measurement, OracleError> {
        let mut devices = Vec::with_capacity(plan.devices);
        for group in plan.groups() {
            let (fwd_ms, bwd_ms) = if group.is_empty() {
                (0.0, 0.0)
            } else {
                let mine: Vec<Table> = group.iter().map(|&t| tables[t].clone()).collect();
                let alone = Plan {
                    devices: 1,
                    assignment: vec![0; mine.len()],
                };
                let d = self.0.measure(&mine, &alone)?.devices[0];
                (d.fwd_ms, d.bwd_ms)
            };
            devices.push(DeviceCost::new(fwd_ms, bwd_ms, 0.0, 0.0));
        }
        Ok(Measurement::from_devices(devices))
    }
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    anyhow::ensure!(
        args.len() >= 3,
        "usage: compute_check RUN_DIR SUITE.json sim|cpu|cuda [TASKS]"
    );
    let (cfg, model) = learner::checkpoint::load_run(std::path::Path::new(&args[0]))?;
    let mut suite = common::Suite::load(std::path::Path::new(&args[1]), &cfg.memory)?;
    if let Some(n) = args.get(3) {
        suite.tasks.truncate(n.parse()?);
    }
    let (backend, batch) = match args[2].as_str() {
        "sim" => (Backend::Sim, cfg.sim.batch),
        "cpu" => (Backend::Cpu, cfg.cpu.batch),
        "cuda" => (Backend::Cuda, cfg.cuda.batch),
        other => anyhow::bail!("unknown backend `{other}`"),
    };
    let mut oracle = OneDeviceAtATime(benchworker::build(backend, &cfg)?);
    let methods: Vec<Method> = Method::ALL
        .into_iter()
        .filter(|m| m.is_heuristic())
        .chain([Method::Policy])
        .collect();
    let report = learner::eval::evaluate(
        &suite,
        &methods,
        &mut oracle,
        &learner::eval::Setting {
            mem: &cfg.memory,
            cfg: &cfg.eval,
            batch,
            runs: &[model::guard::Trained::alone(&model, None)],
            verify: false,
        },
        || eprint!("."),
    )?;
    eprintln!();
    println!(
        "{} (first {} tasks), compute only, one device at a time",
        args[1],
        suite.tasks.len()
    );
    println!("{report}");
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}
