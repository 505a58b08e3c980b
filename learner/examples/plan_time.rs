//! Times `Model::plan` (after loading and one warm-up call) for a pool CSV
//! under several `model.plan_*` settings: min and median over 15 calls.
//! With a suite instead, times the run's own `plan` settings on each of its
//! tasks, alone and guarded (what `learner plan` runs, with the second
//! opinion the run ships): the median (the upper one, for an even count) over tasks of each
//! task's median of 5 calls, the range, and how many tasks took over 10 ms.
//! `--with RUN_B ...` adds the time of the runs placing together, one
//! after another (`model::guard::plan_jointly`) and a thread each (what
//! `learner plan --run RUN_DIR --run RUN_B` runs).
//!
//! cargo run --release --example plan_time -- RUN_DIR TABLES_CSV DEVICES MEMORY_GB
//! cargo run --release --example plan_time -- RUN_DIR --suite SUITE.json [--with RUN_B ...]
fn main() -> anyhow::Result<()> {
    tch::set_num_threads(1);
    let args: Vec<String> = std::env::args().skip(1).collect();
    let run = std::path::Path::new(&args[0]);
    let (cfg, mut model) = learner::checkpoint::load_run(run)?;
    if args[1] == "--suite" {
        let suite = common::Suite::load(std::path::Path::new(&args[2]), &cfg.memory)?;
        let mut dirs = vec![run.to_path_buf()];
        if args.get(3).map(String::as_str) == Some("--with") {
            dirs.extend(args[4..].iter().map(std::path::PathBuf::from));
        }
        let together = learner::checkpoint::Runs::load(&dirs, true)?;
        let threaded = std::cell::RefCell::new(learner::checkpoint::Runs::load(&dirs, true)?);
        let trained = together.trained();
        for (guarded, joint) in [(false, false), (true, false), (true, true), (false, true)] {
            if joint && dirs.len() == 1 {
                continue;
            }
            let mut per_task: Vec<f64> = suite
                .tasks
                .iter()
                .map(|task| {
                    median_of(5, || {
                        if joint && !guarded {
                            let g = threaded.borrow_mut().plan(task, &cfg.memory);
                            drop(g.expect("a plan that fits"));
                        } else if joint {
                            let g = model::guard::plan_jointly(&trained, task, &cfg.memory);
                            drop(g.expect("a plan that fits"));
                        } else if guarded {
                            let g = trained[0].plan(task, &cfg.memory);
                            drop(g.expect("a plan that fits"));
                        } else {
                            drop(model.plan(task, &cfg.memory));
                        }
                    })
                })
                .collect();
            per_task.sort_by(f64::total_cmp);
            println!(
                "{} ({}) {} tasks: median {:.2} ms, {:.2} to {:.2} ms, {} over 10 ms",
                args[2],
                match (guarded, joint) {
                    (true, true) => format!("{} runs together, one after another", dirs.len()),
                    (false, true) => format!("{} runs together, a thread each", dirs.len()),
                    (true, false) => "guarded, as `learner plan`".into(),
                    (false, false) => "Model::plan".into(),
                },
                per_task.len(),
                per_task[per_task.len() / 2],
                per_task[0],
                per_task[per_task.len() - 1],
                per_task.iter().filter(|&&t| t > 10.0).count()
            );
        }
        return Ok(());
    }
    let task = common::Task {
        name: args[1].clone(),
        devices: args[2].parse()?,
        memory_gb: args[3].parse()?,
        tables: common::pool::read(std::path::Path::new(&args[1]))?,
    };
    // (episodes, moves, heuristics, search budget, search from every candidate)
    for (k, moves, heur, search, every) in [
        (1, 0, false, 0, false),
        (1, 0, true, 0, false),
        (1, 0, true, 2000, false),
        (1, 0, true, 2000, true), // the default
        (1, 10, true, 2000, true),
        (4, 0, true, 2000, true),
    ] {
        model.plan_cfg.plan_search = search;
        model.plan_cfg.plan_search_every_candidate = every;
        model.plan_cfg.plan_samples = k;
        model.plan_cfg.plan_moves = moves;
        model.plan_cfg.plan_heuristics = heur;
        let (min, median) = timed(|| {
            model.plan(&task, &cfg.memory);
        });
        println!(
            "K={k} moves={moves:2} heuristics={heur:5} search={search:4} every={every:5}: \
             min {min:.2} ms, median {median:.2} ms"
        );
    }
    // The greedy episode alone: plain arrays (what `plan` runs) against the
    // batched libtorch rollout (what training runs).
    let mdp = model::mdp::MdpTask::new(&task.tables, task.devices, task.cap_bytes(), &cfg.memory);
    let (min, median) = timed(|| {
        model::mdp::greedy_episode(&model.policy, &model.cost, &mdp);
    });
    println!("greedy episode on plain arrays: min {min:.2} ms, median {median:.2} ms");
    let (min, median) = timed(|| {
        model::mdp::rollout(
            &model.policy,
            &model.cost,
            &mdp,
            1,
            model::mdp::Mode::Greedy,
        );
    });
    println!("greedy episode through libtorch: min {min:.2} ms, median {median:.2} ms");
    // One search on the cost network alone, from torchrec's plan.
    let ctx = model::baselines::Context::for_task(&task, &cfg.memory, cfg.sim.batch);
    let mut rng = <rand_chacha::ChaCha8Rng as rand::SeedableRng>::seed_from_u64(0);
    let start = model::baselines::place(model::baselines::Method::Torchrec, &ctx, &mut rng)
        .ok_or_else(|| anyhow::anyhow!("torchrec found no plan that fits"))?;
    let reps = tch::no_grad(|| model.cost.tables(&mdp.features));
    let heads = model.cost.device_heads(&reps, task.devices);
    let net = model::search::CostNetOracle::new(heads, &reps, 0);
    let budget = 2000;
    // A fresh copy of the oracle each time, as `plan` takes one per search.
    let (min, median) = timed(|| {
        let mut net = net.clone();
        let mut rng = <rand_chacha::ChaCha8Rng as rand::SeedableRng>::seed_from_u64(0);
        let cap = task.cap_bytes();
        model::search::search(
            &mut net,
            &task.tables,
            &start,
            cap,
            &cfg.memory,
            budget,
            &mut rng,
        )
        .expect("torchrec's plan fits");
    });
    println!(
        "one search of {budget} plans on the cost network: min {min:.2} ms, median {median:.2} ms \
         ({:.2} us per plan)",
        median * 1e3 / budget as f64
    );
    Ok(())
}

/// Median ms of `n` calls after one warm-up call.
fn median_of(n: usize, f: impl FnMut()) -> f64 {
    times(n, f)[n / 2]
}

/// Min and median ms of 15 calls after one warm-up call.
fn timed(f: impl FnMut()) -> (f64, f64) {
    let t = times(15, f);
    (t[0], t[7])
}

/// The ms of `n` calls after one warm-up call, sorted.
fn times(n: usize, mut f: impl FnMut()) -> Vec<f64> {
    f();
    let mut t: Vec<f64> = (0..n)
        .map(|_| {
            let s = std::time::Instant::now();
            f();
            s.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t
}
