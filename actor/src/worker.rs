//! The actor's loop (DESIGN §3): introduce itself to the learner, take the
//! configuration and training tasks from its welcome, keep the newest
//! weights, and roll out one unroll per credit on a task drawn at random.
//! The same loop runs as a thread beside the learner (`inproc://`) and as
//! the `actor` process (`tcp://`).

use std::sync::atomic::AtomicBool;
use std::time::Duration;

use common::link::{sessions, End, Link, Welcome};
use common::protocol::{Message, Role};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tch::{nn, Device};

use crate::mdp::{rollout, MdpTask, Mode};
use crate::nets::{CostNet, PolicyNet};
use crate::wire::{import, unroll_to_data};

/// How to reach the learner.
#[derive(Debug, Clone)]
pub struct ActorOptions {
    pub endpoint: String,
    pub token: String,
    /// Seeds the task choice.
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
    anyhow::ensure!(
        !welcome.tasks.is_empty(),
        "the learner sent no training tasks"
    );
    let mdps: Vec<MdpTask> = welcome
        .tasks
        .iter()
        .map(|t| MdpTask::new(&t.tables, t.devices, t.cap_bytes(), &cfg.memory))
        .collect();
    let policy_vs = nn::VarStore::new(Device::Cpu);
    let cost_vs = nn::VarStore::new(Device::Cpu);
    let nets = Nets {
        policy: PolicyNet::new(&(policy_vs.root() / "policy"), &cfg.model),
        cost: CostNet::new(&(cost_vs.root() / "cost"), &cfg.model),
        policy_vs,
        cost_vs,
    };
    let heartbeat = Duration::from_secs_f64(cfg.cluster.heartbeat_s);
    let timeout = Duration::from_secs_f64(cfg.cluster.peer_timeout_s);
    let (mut version, mut credits) = (0u64, 0u64);
    loop {
        if let Some(end) = link.tend(stop, heartbeat, timeout)? {
            return Ok(end);
        }
        // Wait only when there is nothing to roll out.
        let ready = credits > 0 && version > 0;
        let mut wait = if ready { 0 } else { 100 };
        while let Some((header, message)) = link.recv(wait)? {
            wait = 0;
            match message {
                Message::Weights(w) => {
                    report.weights_received += 1;
                    if w.version <= version {
                        continue;
                    }
                    match import(&nets.policy_vs, &w.policy)
                        .and_then(|_| import(&nets.cost_vs, &w.cost))
                    {
                        Ok(()) => version = w.version,
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
        if credits == 0 || version == 0 {
            continue;
        }
        let k = rng.gen_range(0..mdps.len());
        let u = rollout(
            &nets.policy,
            &nets.cost,
            &mdps[k],
            cfg.train.episodes,
            Mode::Sample,
        );
        if link.send(version, &Message::Unroll(unroll_to_data(k as u32, &u)))? {
            credits -= 1;
            report.unrolls += 1;
            report.env_steps += (cfg.train.episodes * mdps[k].tables()) as u64;
        }
    }
}
