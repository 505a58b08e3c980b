//! The actor's loop (DESIGN §3): introduce itself to the learner, take the
//! configuration and rollout tasks from its welcome, keep the newest
//! weights, and roll out one unroll per credit on a task drawn at random.
//! The same loop runs as a thread beside the learner (`inproc://`) and as
//! the `actor` process (`tcp://`).

use std::sync::atomic::AtomicBool;
use std::time::Duration;

use common::table::FEATURE_NAMES;
use common::Task;
use net::link::{seconds, sessions, End, Link, Welcome};
use net::protocol::{encode, Header, Message, Role, UnrollData, MAX_FRAME_BYTES};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tch::{nn, Device};

use model::mdp::{try_rollout, MdpTask, Mode};
use model::nets::{CostNet, PolicyNet, DEVICE_FEATURES};
use model::wire::{import_all, unroll_to_data, MAX_EPISODES};

/// How to reach the learner.
#[derive(Debug, Clone)]
pub struct ActorOptions {
    pub endpoint: String,
    pub token: String,
    /// Seeds the task choice and each unroll's sampling.
    pub seed: u64,
    /// How long to keep saying hello before giving up.
    pub wait: Duration,
}

/// What an actor did, when it stops.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ActorReport {
    pub unrolls: u64,
    pub env_steps: u64,
    pub weights_received: u64,
    pub bad_weights: u64,
    /// Welcomes after the first: the learner restarted or lost this actor.
    pub rejoined: u64,
}

/// The actor's networks, loaded with whatever weights arrive.
struct Nets {
    policy_vs: nn::VarStore,
    cost_vs: nn::VarStore,
    policy: PolicyNet,
    cost: CostNet,
}

/// Runs until the learner says `Shutdown` or `stop` is set. A learner
/// that falls silent (a crash, a restart) is greeted again until it
/// answers.
pub fn run(
    ctx: &zmq::Context,
    opts: &ActorOptions,
    stop: &AtomicBool,
) -> anyhow::Result<ActorReport> {
    let mut rng = ChaCha8Rng::seed_from_u64(opts.seed);
    let mut report = ActorReport::default();
    report.rejoined = sessions(
        ctx,
        &opts.endpoint,
        Role::Actor,
        &opts.token,
        opts.wait,
        stop,
        |link, welcome| session(link, welcome, &mut rng, &mut report, stop),
    )?;
    Ok(report)
}

/// What a session takes from its welcome, checked.
struct Setup {
    mdps: Vec<MdpTask>,
    heartbeat: Duration,
    timeout: Duration,
}

/// Checks the welcome's configuration and rollout tasks (a bad one is an
/// error naming it, not a panic in the middle of a rollout) and builds the
/// tasks' MDPs.
fn setup(welcome: &Welcome) -> anyhow::Result<Setup> {
    let cfg = &welcome.config;
    anyhow::ensure!(
        !welcome.tasks.is_empty(),
        "the learner sent no rollout tasks"
    );
    let heartbeat = seconds("the learner's cluster.heartbeat_s", cfg.cluster.heartbeat_s)?;
    let timeout = seconds(
        "the learner's cluster.peer_timeout_s",
        cfg.cluster.peer_timeout_s,
    )?;
    let episodes = cfg.train.episodes;
    anyhow::ensure!(
        (1..=MAX_EPISODES).contains(&episodes),
        "the learner's train.episodes = {episodes}: an unroll holds 1 to {MAX_EPISODES} episodes"
    );
    check_rollout_tasks(&welcome.tasks, episodes)
        .map_err(|e| anyhow::anyhow!("the learner's {e}"))?;
    let mdps = welcome
        .tasks
        .iter()
        .map(|task| MdpTask::new(&task.tables, task.devices, task.cap_bytes(), &cfg.memory))
        .collect();
    Ok(Setup {
        mdps,
        heartbeat,
        timeout,
    })
}

/// Why a task of the learner's cannot be rolled out here (each message
/// follows the task's name).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BadTask {
    #[error("has no device")]
    NoDevice,
    #[error("has no table")]
    NoTable,
    #[error("has memory_gb = {0}, not a positive memory cap")]
    Memory(f64),
    #[error("has table `{table}` whose feature {feature} is not a finite number")]
    Feature {
        table: String,
        feature: &'static str,
    },
    #[error("has table `{table}` of {rows} rows × {dim}, too large to count its bytes")]
    TooLarge { table: String, rows: u64, dim: u32 },
    #[error(
        "({tables} tables on {devices} devices): an unroll of train.episodes = {episodes} \
         episodes takes {bytes} bytes on the wire, more than the {MAX_FRAME_BYTES} a frame \
         may have; lower train.episodes or use smaller tasks"
    )]
    UnrollTooBig {
        tables: usize,
        devices: usize,
        episodes: usize,
        bytes: String,
    },
}

/// A learner's rollout task that an actor cannot roll out: which, and why.
/// It reads "rollout task K (`name`) ...", with the settings that give a
/// way out where there is one.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("rollout task {index} (`{name}`) {reason}{hint}")]
pub struct UnrollableTask {
    /// Its place among the rollout tasks.
    pub index: usize,
    pub name: String,
    pub reason: BadTask,
    hint: &'static str,
}

/// Whether an actor can roll out each of `tasks` (a learner's rollout
/// tasks, in order) with unrolls of `episodes` episodes: `Err` names the
/// first that it cannot and why. The learner asks before it starts a
/// cluster, the actor on each welcome.
pub fn check_rollout_tasks(tasks: &[Task], episodes: usize) -> Result<(), UnrollableTask> {
    for (k, task) in tasks.iter().enumerate() {
        check_task(task)
            .and_then(|()| check_unroll_size(k, task, episodes).map(drop))
            .map_err(|reason| {
                // Its training task fits on fewer devices: the copies'
                // settings are a way out too.
                let hint = match reason {
                    BadTask::UnrollTooBig { .. } if task.is_reshaped_copy() => {
                        "; it is a reshaped copy, on more devices than its training task: \
                         raise the low end of train.reshape_density toward 1, or set \
                         train.reshape_copies = 0"
                    }
                    _ => "",
                };
                UnrollableTask {
                    index: k,
                    name: task.name.clone(),
                    reason,
                    hint,
                }
            })?;
    }
    Ok(())
}

/// What a task needs for a rollout: a device, a table, a memory cap, and
/// features that are numbers.
fn check_task(task: &Task) -> Result<(), BadTask> {
    if task.devices == 0 {
        return Err(BadTask::NoDevice);
    }
    if task.tables.is_empty() {
        return Err(BadTask::NoTable);
    }
    if !(task.memory_gb.is_finite() && task.memory_gb > 0.0 && task.cap_bytes() > 0) {
        return Err(BadTask::Memory(task.memory_gb));
    }
    for t in &task.tables {
        let f = common::features::scaled(t);
        if let Some(i) = f.iter().position(|x| !x.is_finite()) {
            return Err(BadTask::Feature {
                table: t.name.clone(),
                feature: FEATURE_NAMES[i],
            });
        }
        // MemoryModel::table_bytes counts in u64: at most 4 bytes a weight
        // and 8 of optimizer state, 4 more a row.
        let widest = t.rows as u128 * (12 * t.dim as u128 + 4);
        if widest > u64::MAX as u128 {
            return Err(BadTask::TooLarge {
                table: t.name.clone(),
                rows: t.rows,
                dim: t.dim,
            });
        }
    }
    Ok(())
}

/// The most bytes the frame of an unroll of `episodes` episodes of `task`
/// (number `k` of the welcome) can take: the encoding of one with every
/// number at its widest (the header's counters at their maximum, every
/// action the last device, every table index the last). `Err` with the
/// reason when that exceeds [`MAX_FRAME_BYTES`] (libzmq drops a bigger
/// frame without a word, and the actor would roll out for ever).
fn check_unroll_size(k: usize, task: &Task, episodes: usize) -> Result<usize, BadTask> {
    let (m, d, e) = (task.tables.len(), task.devices, episodes);
    let too_big = |bytes: String| BadTask::UnrollTooBig {
        tables: m,
        devices: d,
        episodes: e,
        bytes,
    };
    // The floats alone, without building anything (a task can be huge).
    let floats = m
        .checked_mul(e)
        .and_then(|me| me.checked_mul(1 + d.checked_mul(DEVICE_FEATURES as usize)?))
        .and_then(|x| x.checked_add(e))
        .and_then(|x| x.checked_mul(4));
    match floats {
        Some(f) if f <= MAX_FRAME_BYTES => {}
        Some(f) => return Err(too_big(format!("at least {f}"))),
        None => return Err(too_big("more than 2^64".into())),
    }
    let (me, med) = (m * e, m * e * d);
    let widest = UnrollData {
        task: k as u32,
        episodes: e as u32,
        order: vec![(m - 1) as u32; m],
        actions: vec![(d - 1) as u32; me],
        behaviour_logp: vec![0.0; me],
        masks: vec![true; med],
        device_features: vec![0.0; med * DEVICE_FEATURES as usize],
        predicted_cost_ms: vec![0.0; e],
        reward_scale: 0.0,
        infeasible: vec![true; e],
    };
    let header = Header {
        sender: u64::MAX,
        incarnation: u64::MAX,
        seq: u64::MAX,
        policy_version: u64::MAX,
    };
    let bytes = encode(&header, &Message::Unroll(widest)).len();
    if bytes > MAX_FRAME_BYTES {
        return Err(too_big(bytes.to_string()));
    }
    Ok(bytes)
}

/// One stay with a learner, from its welcome until it stops us or goes
/// silent.
fn session(
    link: &mut Link,
    welcome: &Welcome,
    rng: &mut ChaCha8Rng,
    report: &mut ActorReport,
    stop: &AtomicBool,
) -> anyhow::Result<End> {
    let cfg = &welcome.config;
    let Setup {
        mdps,
        heartbeat,
        timeout,
    } = setup(welcome)?;
    let policy_vs = nn::VarStore::new(Device::Cpu);
    let cost_vs = nn::VarStore::new(Device::Cpu);
    let nets = Nets {
        policy: PolicyNet::new(&(policy_vs.root() / "policy"), &cfg.model),
        cost: CostNet::new(&(cost_vs.root() / "cost"), &cfg.model),
        policy_vs,
        cost_vs,
    };
    let (mut version, mut credits) = (0u64, 0u64);
    // False after the weights of `version` failed a rollout: wait for newer.
    let mut usable = true;
    loop {
        if let Some(end) = link.tend(stop, heartbeat, timeout)? {
            return Ok(end);
        }
        // Wait only when there is nothing to roll out.
        let ready = credits > 0 && version > 0 && usable;
        let mut wait = if ready { 0 } else { 100 };
        while let Some((header, message)) = link.recv(wait)? {
            wait = 0;
            match message {
                Message::Weights(w) => {
                    report.weights_received += 1;
                    if w.version <= version {
                        continue;
                    }
                    // Both networks or neither: never a new policy with an old cost network.
                    match import_all(&[
                        ("policy", &nets.policy_vs, &w.policy),
                        ("cost", &nets.cost_vs, &w.cost),
                    ]) {
                        Ok(()) => {
                            version = w.version;
                            usable = true;
                        }
                        Err(e) => {
                            report.bad_weights += 1;
                            tracing::warn!("ignored weights v{}: {e}", header.policy_version);
                        }
                    }
                }
                Message::Credit { n } => credits += n as u64,
                // A second welcome answers a repeated hello: credits start over.
                Message::Welcome { peer, .. } => {
                    link.set_sender(peer);
                    credits = 0;
                }
                Message::Shutdown => return Ok(End::Stop),
                Message::Refused { reason, retry } => {
                    anyhow::ensure!(retry, "the learner dropped this actor: {reason}");
                    return Ok(End::LostLearner);
                }
                _ => {}
            }
        }
        if credits == 0 || version == 0 || !usable {
            continue;
        }
        let k = rng.gen_range(0..mdps.len());
        let u = match try_rollout(
            &nets.policy,
            &nets.cost,
            &mdps[k],
            cfg.train.episodes,
            Mode::Sample { seed: rng.gen() },
        ) {
            Ok(u) => u,
            Err(e) => {
                // Weights whose numbers overflow: no rollout until newer ones.
                report.bad_weights += 1;
                usable = false;
                tracing::warn!("weights v{version} fail on rollout task {k}: {e}");
                continue;
            }
        };
        if link.send(version, &Message::Unroll(unroll_to_data(k as u32, &u)))? {
            credits -= 1;
            report.unrolls += 1;
            report.env_steps += (cfg.train.episodes * mdps[k].tables()) as u64;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use common::config::{Config, ModelConfig};
    use common::generate::{generate_pool, PoolGenConfig};

    fn task(name: &str, tables: usize, devices: usize) -> Task {
        Task {
            name: name.into(),
            devices,
            memory_gb: 16.0,
            tables: generate_pool(
                &PoolGenConfig {
                    tables,
                    ..Default::default()
                },
                1,
            )
            .unwrap(),
        }
    }

    fn welcome(tasks: Vec<Task>) -> Welcome {
        Welcome {
            peer: 1,
            config: Config::default(),
            tasks,
        }
    }

    fn setup_error(w: &Welcome) -> String {
        match setup(w) {
            Ok(_) => panic!("a bad welcome was accepted"),
            Err(e) => format!("{e:#}"),
        }
    }

    #[test]
    fn a_welcome_with_a_bad_task_is_an_error_naming_it() {
        assert_eq!(
            setup(&welcome(vec![task("good", 5, 2)]))
                .unwrap()
                .mdps
                .len(),
            1
        );
        let mut cases: Vec<(Task, &str)> = Vec::new();
        cases.push((task("bad", 5, 0), "has no device"));
        let mut t = task("bad", 5, 2);
        t.tables.clear();
        cases.push((t, "has no table"));
        let mut t = task("bad", 5, 2);
        t.memory_gb = 0.0;
        cases.push((t, "memory_gb = 0"));
        let mut t = task("bad", 5, 2);
        t.memory_gb = f64::NAN;
        cases.push((t, "memory_gb = NaN"));
        let mut t = task("bad", 5, 2);
        t.tables[3].pooling_factor = f64::INFINITY;
        cases.push((t, "pooling_factor is not a finite number"));
        let mut t = task("bad", 5, 2);
        t.tables[0].bins[2] = f64::NAN;
        cases.push((t, "is not a finite number"));
        let mut t = task("bad", 5, 2);
        t.tables[1].rows = u64::MAX / 2;
        cases.push((t, "too large"));
        for (bad, fault) in cases {
            let e = setup_error(&welcome(vec![task("good", 5, 2), bad]));
            assert!(e.contains("rollout task 1 (`bad`)"), "{e}");
            assert!(e.contains(fault), "{e} (expected {fault})");
        }
        let e = setup_error(&welcome(vec![]));
        assert!(e.contains("no rollout tasks"), "{e}");
    }

    #[test]
    fn durations_that_a_duration_cannot_hold_are_errors() {
        assert_eq!(seconds("x", 1.5).unwrap(), Duration::from_millis(1500));
        for bad in [1e20, f64::INFINITY, f64::NAN, -1.0, 0.0] {
            let e = seconds("--wait-s", bad).unwrap_err().to_string();
            assert!(e.contains("--wait-s"), "{e}");
        }
        let mut w = welcome(vec![task("t", 5, 2)]);
        w.config.cluster.heartbeat_s = f64::INFINITY;
        assert!(setup_error(&w).contains("cluster.heartbeat_s"));
        let mut w = welcome(vec![task("t", 5, 2)]);
        w.config.cluster.peer_timeout_s = 1e20;
        assert!(setup_error(&w).contains("cluster.peer_timeout_s"));
        let mut w = welcome(vec![task("t", 5, 2)]);
        w.config.train.episodes = 0;
        assert!(setup_error(&w).contains("train.episodes"));
    }

    #[test]
    fn an_unroll_too_big_for_a_frame_is_an_error_before_any_rollout() {
        // The floats alone exceed the limit.
        let mut w = welcome(vec![task("t", 5, 2), task("big", 200, 8)]);
        w.config.train.episodes = 4096;
        let e = setup_error(&w);
        assert!(e.contains("rollout task 1 (`big`)"), "{e}");
        assert!(e.contains("train.episodes = 4096"), "{e}");
        assert!(e.contains("200 tables on 8 devices"), "{e}");
        // The floats fit; the masks and actions beside them do not.
        let big = task("big", 100, 8);
        let floats = 100 * 2570 * (1 + 8 * DEVICE_FEATURES as usize) * 4;
        assert!(floats < MAX_FRAME_BYTES);
        let e = check_unroll_size(0, &big, 2570).unwrap_err();
        assert!(!e.to_string().contains("at least"), "{e}");
        assert!(check_unroll_size(0, &big, 2400).is_ok());
        // A reshaped copy on more devices than its task outgrows the frame
        // first: the message says which settings made it.
        let mut copy = task(&Task::reshaped_copy_name("big", 0), 100, 16);
        let e = check_rollout_tasks(&[big.clone(), copy.clone()], 2400).unwrap_err();
        assert_eq!((e.index, e.name.as_str()), (1, copy.name.as_str()));
        assert!(matches!(
            e.reason,
            BadTask::UnrollTooBig { devices: 16, .. }
        ));
        let e = e.to_string();
        assert!(e.starts_with("rollout task 1 (`big (reshaped 0)`)"), "{e}");
        assert!(e.contains("train.reshape_density"), "{e}");
        copy.devices = 8;
        assert!(check_rollout_tasks(&[big.clone(), copy], 2400).is_ok());
        let e = check_rollout_tasks(&[big], 2570).unwrap_err().to_string();
        assert!(!e.contains("reshape"), "{e}");
    }

    #[test]
    fn the_size_bound_holds_for_a_real_unroll() {
        let t = task("t", 9, 3);
        let mdp = MdpTask::new(&t.tables, 3, t.cap_bytes(), &Default::default());
        tch::manual_seed(0);
        let vs = nn::VarStore::new(Device::Cpu);
        let cfg = ModelConfig::default();
        let policy = PolicyNet::new(&(vs.root() / "policy"), &cfg);
        let cost = CostNet::new(&(vs.root() / "cost"), &cfg);
        let u = try_rollout(&policy, &cost, &mdp, 7, Mode::Sample { seed: 1 }).unwrap();
        let header = Header {
            sender: 12,
            incarnation: u64::MAX - 5,
            seq: 1 << 40,
            policy_version: 3,
        };
        let real = encode(&header, &Message::Unroll(unroll_to_data(4, &u))).len();
        let bound = check_unroll_size(4, &t, 7).unwrap();
        assert!(real <= bound && bound - real < 64, "{real} vs {bound}");
    }
}
