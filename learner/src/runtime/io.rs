//! The socket thread: the hub and the coordinator. It takes peers'
//! messages and the networks' thread's words as they come, ticks the
//! coordinator, and delivers what it decided. A long update on the
//! networks' thread delays neither heartbeats nor credits.

use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use crossbeam::channel::{unbounded, Receiver, Sender, TryRecvError};
use model::wire::export;
use net::link::Hub;
use net::protocol::{Header, Message, Weights};

use super::core::{Coordinator, Setup};
use super::learn::Learn;
use super::{FromTrainer, RuntimeReport, ToTrainer};
use crate::train::{Hooks, Trainer};

/// How long the socket thread waits for a frame when idle: the
/// coordinator's clock ticks at least this often.
const IDLE_WAIT_MS: i64 = 20;

/// Peers' messages taken per turn, before the coordinator ticks again.
const BATCH: usize = 256;

/// The learner's side of a cluster: a bound hub and the networks.
pub struct Learner<'t, 'a> {
    trainer: &'t mut Trainer<'a>,
    ctx: zmq::Context,
    hub: Hub,
    setup: Setup,
    status: Option<crate::status::StatusFeed>,
}

impl<'t, 'a> Learner<'t, 'a> {
    /// Checks that the networks and the welcome fit a frame (else no peer
    /// could ever get them), before anyone is told where to connect.
    pub fn new(
        trainer: &'t mut Trainer<'a>,
        ctx: &zmq::Context,
        hub: Hub,
        token: String,
    ) -> anyhow::Result<Self> {
        let welcome_config =
            welcome_config(trainer.config(), trainer.rollout_tasks(), &trainer.model)?;
        let setup = Setup {
            cluster: trainer.config().cluster.clone(),
            token,
            welcome_config,
            rollout_tasks: trainer.rollout_tasks().to_vec(),
            task_devices: trainer.tasks().iter().map(|t| t.devices).collect(),
        };
        Ok(Learner {
            trainer,
            ctx: ctx.clone(),
            hub,
            setup,
            status: None,
        })
    }

    /// Shows the cluster's peers on `feed`'s status page.
    pub fn with_status(mut self, feed: Option<crate::status::StatusFeed>) -> Self {
        self.status = feed;
        self
    }

    /// Trains until every configured round is done or `stop` is set; then,
    /// if training ended as asked, tells every peer to stop (with
    /// `linger`, answers latecomers so for two heartbeat periods). After
    /// an error peers are not told: they keep saying hello, as after a
    /// crash, so that a resume on the same endpoint finds them.
    pub fn run(
        self,
        hooks: &mut Hooks,
        stop: &AtomicBool,
        linger: bool,
    ) -> anyhow::Result<RuntimeReport> {
        let Learner {
            trainer,
            ctx,
            mut hub,
            setup,
            status,
        } = self;
        let endpoint = format!("inproc://learner-wake-{:x}", rand::random::<u64>());
        let woken = ctx.socket(zmq::PULL)?;
        woken.bind(&endpoint)?;
        let wake = ctx.socket(zmq::PUSH)?;
        wake.connect(&endpoint)?;
        let (to_io, from_trainer) = unbounded();
        let (to_trainer, inbox) = unbounded();
        let mut core = Coordinator::new(setup, Instant::now());
        std::thread::scope(|s| {
            // The thread owns its ends of the channels: when it stops, the
            // networks' thread hears of it.
            let io = s.spawn(move || {
                let ends = (&woken, &from_trainer, &to_trainer);
                let ended = serve(&mut core, &mut hub, ends, status.as_ref());
                (ended, core, hub)
            });
            let mut learn = Learn::new(trainer, to_io, wake, inbox);
            let learned = learn.run(hooks, stop);
            // After an error, dropping the channels ends the socket thread
            // with peers untold.
            if learned.is_ok() {
                learn.tell(FromTrainer::Finish { linger });
            }
            let (lags, stale) = (std::mem::take(&mut learn.lags), learn.stale_unrolls);
            drop(learn);
            let joined = io.join();
            learned?;
            let (ended, core, hub) = joined.map_err(|panic| {
                let why = (panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                anyhow::anyhow!("the learner's socket thread panicked: {why}")
            })?;
            ended?;
            let mut report = core.report;
            report.lags = lags;
            report.stale_unrolls = stale;
            report.drops = hub.drops.clone();
            report.refused_handshakes = hub.refused_handshakes();
            report.shed_connections = hub.shed_connections();
            Ok(report)
        })
    }
}

/// The configuration peers are welcomed with, once the welcome and the
/// networks' weights are known to fit a frame: else no peer could ever
/// get them. The command line checks it before it makes a run folder
/// (the weights' size depends on the layer sizes alone), and [`Learner`]
/// again with the run's own networks.
pub(crate) fn welcome_config(
    config: &common::config::Config,
    rollout_tasks: &[common::Task],
    model: &model::Model,
) -> anyhow::Result<String> {
    // Peers take their backend from their own command line: the run's
    // record of it stays out of what they parse.
    let mut shared = config.clone();
    shared.cluster.backend = None;
    let welcome_config = toml::to_string(&shared)?;
    fits(
        "the networks' weights (the [model] widths and members)",
        &Message::Weights(Weights {
            version: 0,
            policy: export(&model.policy_vs),
            cost: export(&model.cost_vs),
        }),
    )?;
    fits(
        "the welcome (the configuration and every rollout task's tables: the training tasks \
         and the train.tight_memory and train.reshape_copies copies of each)",
        &Message::Welcome {
            peer: 0,
            config_toml: welcome_config.clone(),
            tasks: rollout_tasks.to_vec(),
        },
    )?;
    Ok(welcome_config)
}

/// How often the socket thread shows the peers on the status page.
const STATUS_EVERY: std::time::Duration = std::time::Duration::from_millis(500);

/// Fails naming `what` when `m` is bigger than a frame may be.
fn fits(what: &str, m: &Message) -> anyhow::Result<()> {
    let header = Header {
        sender: 0,
        incarnation: 0,
        seq: 0,
        policy_version: 0,
    };
    let bytes = net::protocol::encode(&header, m).len();
    anyhow::ensure!(
        bytes <= net::protocol::MAX_FRAME_BYTES,
        "{what} take {:.1} MiB on the wire, more than the {} MiB a message may have",
        bytes as f64 / (1 << 20) as f64,
        net::protocol::MAX_FRAME_BYTES >> 20
    );
    Ok(())
}

/// The socket thread's loop, until the networks' thread says training is
/// finished (then peers are told to stop) or goes away. An error when
/// training stalls, when too many jobs failed in a row, or when the
/// socket fails.
fn serve(
    core: &mut Coordinator,
    hub: &mut Hub,
    (woken, from_trainer, to_trainer): (&zmq::Socket, &Receiver<FromTrainer>, &Sender<ToTrainer>),
    status: Option<&crate::status::StatusFeed>,
) -> anyhow::Result<()> {
    let mut busy = false;
    let mut shown: Option<Instant> = None;
    loop {
        if !busy {
            hub.wait_with(woken, IDLE_WAIT_MS)?;
        }
        let now = Instant::now();
        busy = false;
        loop {
            match from_trainer.try_recv() {
                Ok(FromTrainer::Finish { linger }) => {
                    core.shutdown();
                    deliver(core, hub, to_trainer, now);
                    if linger {
                        answer_latecomers(core, hub);
                    }
                    return Ok(());
                }
                Ok(word) => core.update(now, word),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => return Ok(()),
            }
        }
        for _ in 0..BATCH {
            let Some(incoming) = hub.recv(0)? else {
                break;
            };
            busy = true;
            let stepped = core.step(now, incoming);
            deliver(core, hub, to_trainer, now);
            stepped?;
        }
        core.tick(now);
        deliver(core, hub, to_trainer, now);
        // The status page's peers, twice a second at most.
        if let Some(feed) = status {
            if shown.is_none_or(|t| now.saturating_duration_since(t) >= STATUS_EVERY) {
                shown = Some(now);
                feed.peers(core.peer_views(now));
            }
        }
        if let Some(why) = core.stalled(now, hub.refused_handshakes()) {
            anyhow::bail!(why);
        }
    }
}

/// Sends what the coordinator decided: messages to peers (a peer that is
/// gone is forgotten, which may decide more) and work to the networks'
/// thread (gone with an error of its own: nothing to do).
fn deliver(core: &mut Coordinator, hub: &mut Hub, to_trainer: &Sender<ToTrainer>, now: Instant) {
    loop {
        let out = core.take_outgoing();
        if out.is_empty() {
            break;
        }
        for o in out {
            if !hub.send(&o.to, o.version, &o.message) {
                core.forget(now, &o.to);
            }
        }
    }
    for work in core.take_for_trainer() {
        let _ = to_trainer.send(work);
    }
}

/// For two heartbeat periods, answers whoever still speaks (a remote peer
/// forgotten a moment ago, one saying hello again) with `Shutdown`, so
/// that no peer is left waiting.
fn answer_latecomers(core: &Coordinator, hub: &mut Hub) {
    let grace = Duration::from_secs_f64(2.0 * core.setup.cluster.heartbeat_s);
    let start = Instant::now();
    while let Some(left) = grace.checked_sub(start.elapsed()) {
        match hub.recv(left.as_millis() as i64) {
            Ok(Some(incoming)) => {
                let _ = hub.send(&incoming.from, core.version, &Message::Shutdown);
            }
            Ok(None) | Err(_) => break,
        }
    }
}
