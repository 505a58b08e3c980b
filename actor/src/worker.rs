//! The actor's loop (DESIGN §3): introduce itself to the learner, take the
//! configuration and training tasks from its welcome, keep the newest
//! weights, and roll out one unroll per credit on a task drawn at random.
//! The same loop runs as a thread beside the learner (`inproc://`) and as
//! the `actor` process (`tcp://`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use common::config::Config;
use common::link::Link;
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
    /// Seeds the task choice and the action sampling.
    pub seed: u64,
    /// How long to wait for the learner's welcome.
    pub welcome_timeout: Duration,
}

/// What an actor did, when it stops.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ActorReport {
    pub unrolls: u64,
    pub env_steps: u64,
    pub weights_received: u64,
    pub bad_weights: u64,
}

/// The actor's networks, loaded with whatever weights arrive.
struct Nets {
    policy_vs: nn::VarStore,
    cost_vs: nn::VarStore,
    policy: PolicyNet,
    cost: CostNet,
}

/// Runs until the learner says `Shutdown` or `stop` is set.
pub fn run(
    ctx: &zmq::Context,
    opts: &ActorOptions,
    stop: &AtomicBool,
) -> anyhow::Result<ActorReport> {
    let mut link = Link::connect(ctx, &opts.endpoint)?;
    link.send(
        0,
        &Message::Hello {
            role: Role::Actor,
            token: opts.token.clone(),
        },
    )?;
    let deadline = Instant::now() + opts.welcome_timeout;
    let (cfg, tasks) = loop {
        if stop.load(Ordering::Relaxed) {
            return Ok(ActorReport::default());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "no welcome from the learner at {} within {:?}",
            opts.endpoint,
            opts.welcome_timeout
        );
        match link.recv(100)? {
            Some((
                _,
                Message::Welcome {
                    peer,
                    config_toml,
                    tasks,
                },
            )) => {
                link.set_sender(peer);
                let cfg = Config::from_toml(&config_toml, std::path::Path::new("<welcome>"))
                    .context("the learner's configuration")?;
                break (cfg, tasks);
            }
            Some((_, Message::Refused { reason })) => {
                anyhow::bail!("the learner refused this actor: {reason}")
            }
            Some((_, Message::Shutdown)) => return Ok(ActorReport::default()),
            _ => {}
        }
    };
    anyhow::ensure!(!tasks.is_empty(), "the learner sent no training tasks");
    let mdps: Vec<MdpTask> = tasks
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
    let mut rng = ChaCha8Rng::seed_from_u64(opts.seed);
    let mut report = ActorReport::default();
    let (mut version, mut credits) = (0u64, 0u64);
    loop {
        if stop.load(Ordering::Relaxed) {
            return Ok(report);
        }
        // Wait only when there is nothing to roll out.
        let ready = credits > 0 && version > 0;
        let mut timeout = if ready { 0 } else { 100 };
        while let Some((header, message)) = link.recv(timeout)? {
            timeout = 0;
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
                Message::Shutdown => return Ok(report),
                Message::Refused { reason } => {
                    anyhow::bail!("the learner dropped this actor: {reason}")
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
        link.send(version, &Message::Unroll(unroll_to_data(k as u32, &u)))?;
        credits -= 1;
        report.unrolls += 1;
        report.env_steps += (cfg.train.episodes * mdps[k].tables()) as u64;
    }
}
