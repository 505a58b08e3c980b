//! The learner's side of asynchronous training (DESIGN §3, §9): a hub that
//! actors and benchworkers connect to, and one thread that owns the
//! networks and runs DreamShard's Algorithm 1 with the three loops
//! overlapped:
//!
//! - **measuring**: each idle benchworker gets a plan sampled from the
//!   current policy, until the round's `measure_per_iteration` are out;
//!   each measurement goes to the durable cost log before it counts;
//! - **fitting the cost network**: cost steps follow the measurements as
//!   they arrive (`cost_steps / measure_per_iteration` per measurement);
//! - **improving the policy**: once a round's cost steps are done, the
//!   weights are published with a new version and unrolls acted with older
//!   ones (a superseded cost network) are dropped; each later unroll is one
//!   V-trace update, and new weights go out after each. Unrolls more than
//!   `max_policy_lag` versions old are dropped and counted.
//!
//! The round — measurements, cost steps, policy updates in DreamShard's
//! proportions — is what checkpoints close. Actors send unrolls under
//! credits (one sent without a credit is dropped), so no queue grows
//! without bound: at most `max_policy_lag` unrolls are in flight over all
//! actors, an actor holds at most `actor_credits`, and the credit of an
//! unroll learned from or dropped goes to the actor with the fewest in
//! flight. More actors than that take turns rather than send unrolls
//! that would be too old by the time the learner reached them. New
//! weights go to actors that hold a credit, and to the others with their
//! next credit.
//!
//! [`train_cluster`] runs actors and benchworkers as threads on
//! `inproc://`; the same loop serves remote peers on `tcp://`.
//!
//! # Layout
//!
//! - `sessions`: a peer's hello and the envelope of its later messages.
//! - `credits`: which actor may send the next unroll (no I/O).
//! - `jobs`: plans to benchworkers, measurements and failures, groups.
//! - `cluster`: the run with its threads ([`train_cluster`]).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use model::mdp::Unroll;
use model::wire::{export, unroll_from_data, UnrollError};
mod cluster;
mod credits;
mod jobs;
mod sessions;

pub use cluster::{train_cluster, ClusterRun, ThreadsReport};
use jobs::{GroupId, Job, Requeued};

use net::link::{Hub, Incoming};
use net::protocol::{DropCounts, Header, Message, Role, UnrollData, Weights};

use crate::train::{Hooks, Trainer};

/// A connected peer.
#[derive(Debug)]
struct Peer {
    role: Role,
    id: u64,
    /// The process start its hello came from: its messages carry it.
    incarnation: u64,
    /// The sequence number of its latest message: the next is higher.
    last_seq: u64,
    /// The job a benchworker is measuring.
    job: Option<u64>,
    last_seen: Instant,
    /// Unrolls an actor may still send.
    credits: u64,
    /// The newest weights' version this actor was sent.
    version_sent: u64,
    /// The multi-host group whose NCCL unique id this group member waits for.
    awaits_group: Option<String>,
    /// When its hello came.
    joined: Instant,
    /// A benchworker that said [`Message::Ready`]: only those get jobs.
    ready: bool,
    /// The most devices a plan may have for this benchworker (said with
    /// its [`Message::Ready`]); `None`: any.
    max_devices: Option<usize>,
    /// Jobs this benchworker failed since its last measurement: from
    /// [`FAILING_AFTER`] on, each failure sets it aside for [`SIDELINED`].
    failed_in_a_row: usize,
    /// Until when it gets no job while another benchworker is sound.
    sidelined_until: Option<Instant>,
    /// When this benchworker's job timed out (it counts as busy until it
    /// answers, or for another `cluster.job_timeout_s`).
    late_since: Option<Instant>,
    /// A benchworker given work again after a late job and silent since: a
    /// second late job is not waited for again (it may hang).
    resynced: bool,
    /// When this actor's latest unroll came (or it joined).
    last_unroll: Instant,
    /// When this actor was last granted a credit: one that waited its turn
    /// for it is not silent with credits in hand.
    credited_at: Instant,
    /// An actor granted credits anew after a silence and silent since: not
    /// granted more (it may just be slow, or waiting for newer weights).
    credits_renewed: bool,
}

/// An unroll waiting for the learner: in flight until used or dropped.
struct Queued {
    /// The actor that sent it.
    from: Vec<u8>,
    /// When the actor's hello that the unroll's credit came under was
    /// welcomed: it counts among that session's unrolls in flight, not
    /// among those of a later one (which started with none).
    joined: Instant,
    /// The weights' version it was acted with.
    acted: u64,
    task: usize,
    unroll: Unroll,
}

/// What the runtime counted, beside the trainer's counters.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct RuntimeReport {
    pub unrolls_received: u64,
    /// Unrolls refused as malformed (wrong sizes, illegal actions, …).
    pub bad_unrolls: u64,
    /// Unrolls from an actor that held no credit for them: dropped, so
    /// that no peer grows the learner's queue beyond its credits.
    pub uncredited_unrolls: u64,
    /// Hellos with a wrong cluster token (from threads: over `tcp://` and
    /// `ipc://` a wrong token is refused at the handshake, see
    /// `refused_handshakes`).
    pub refused_peers: u64,
    /// Connections over `tcp://` or `ipc://` refused at their handshake: each
    /// that gave another cluster token, and each that gave none where
    /// libzmq reports it. None of their messages reached the learner.
    pub refused_handshakes: u64,
    pub failed_jobs: u64,
    /// Jobs handed to another benchworker (theirs went away or timed out).
    pub requeued_jobs: u64,
    /// Peers forgotten after `cluster.peer_timeout_s` of silence.
    pub lost_peers: u64,
    /// Benchworkers given work again though a late job never came back
    /// (the job or its answer lost on the way), and actors whose credits
    /// were shared anew after a silence with credits in hand (an unroll or
    /// a credit lost): nothing waits for a message that will not come.
    pub resyncs: u64,
    /// Frames that did not decode, by reason.
    pub drops: DropCounts,
    /// Messages from peers that never said hello, or of a kind the
    /// learner does not take.
    pub unexpected: u64,
    /// Messages whose envelope does not match their peer's (another sender
    /// id or incarnation than its hello's, or a sequence number not above
    /// its last): dropped.
    pub bad_envelopes: u64,
    /// How many unrolls were learned from at each policy lag (a count per
    /// lag, not a list that grows with the run).
    pub lags: BTreeMap<u64, u64>,
    /// Unrolls dropped as acted with weights more than
    /// `cluster.max_policy_lag` versions old (among the trainer's
    /// `dropped_unrolls`, with those acted on a superseded cost network).
    pub stale_unrolls: u64,
    /// Weight messages sent to actors.
    pub weights_sent: u64,
    /// NCCL unique ids handed to members of multi-host benchworker groups.
    pub group_ids_sent: u64,
}

impl RuntimeReport {
    /// The `q`-quantile of the policy lags (0 when there were none).
    pub fn lag_quantile(&self, q: f64) -> u64 {
        let n = self.learned_from();
        if n == 0 {
            return 0;
        }
        // The rank-th smallest lag, counting from 0.
        let rank = ((n - 1) as f64 * q).round() as u64;
        let mut seen = 0;
        for (&lag, &count) in &self.lags {
            seen += count;
            if seen > rank {
                return lag;
            }
        }
        self.lags.keys().next_back().copied().unwrap_or(0)
    }

    /// Unrolls learned from.
    pub fn learned_from(&self) -> u64 {
        self.lags.values().sum()
    }
}

/// The learner's loop over a bound hub.
pub struct Learner<'t, 'a> {
    trainer: &'t mut Trainer<'a>,
    hub: Hub,
    token: String,
    welcome_config: String,
    peers: HashMap<Vec<u8>, Peer>,
    next_peer: u64,
    /// Jobs out on benchworkers, by id.
    jobs: BTreeMap<u64, Job>,
    /// Jobs to hand out again (their benchworker went away).
    requeue: VecDeque<Requeued>,
    next_job: u64,
    job_failures: usize,
    /// Since when plans have waited for a benchworker wider than any
    /// connected one; cleared when a benchworker says how wide it is (the
    /// widest may have changed). Once `cluster.peer_timeout_s` old, such
    /// plans go to any benchworker, to fail there with the reason.
    wide_since: Option<Instant>,
    /// Unrolls waiting for an update.
    queue: VecDeque<Queued>,
    /// The version published when the current round's cost steps were done:
    /// older unrolls were acted on a superseded cost network.
    round_version: Option<u64>,
    weights_cache: Option<(u64, Rc<Message>)>,
    /// Multi-host benchworker groups by name.
    groups: HashMap<String, GroupId>,
    last_heartbeat: Instant,
    /// Whether the log said that actors wait for a credit because
    /// `cluster.max_policy_lag` unrolls are in flight (said once).
    said_credit_cap: bool,
    pub report: RuntimeReport,
}

impl<'t, 'a> Learner<'t, 'a> {
    pub fn new(trainer: &'t mut Trainer<'a>, hub: Hub, token: String) -> anyhow::Result<Self> {
        // Peers take their backend from their own command line: the run's
        // record of it stays out of what they parse.
        let mut shared = trainer.config().clone();
        shared.cluster.backend = None;
        let welcome_config = toml::to_string(&shared)?;
        // The two biggest messages must fit a frame, or no peer could ever
        // get them (a bigger frame is dropped on the way): said now, once.
        let fits = |what: &str, m: &Message| {
            let header = net::protocol::Header {
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
        };
        fits(
            "the networks' weights (the [model] widths and members)",
            &Message::Weights(Weights {
                version: 0,
                policy: export(&trainer.model.policy_vs),
                cost: export(&trainer.model.cost_vs),
            }),
        )?;
        fits(
            "the welcome (the configuration and every rollout task's tables: the training tasks \
             and train.tight_memory copies of each)",
            &Message::Welcome {
                peer: 0,
                config_toml: welcome_config.clone(),
                tasks: trainer.rollout_tasks().to_vec(),
            },
        )?;
        Ok(Learner {
            trainer,
            hub,
            token,
            welcome_config,
            peers: HashMap::new(),
            next_peer: 1,
            jobs: BTreeMap::new(),
            requeue: VecDeque::new(),
            next_job: 1,
            job_failures: 0,
            wide_since: None,
            queue: VecDeque::new(),
            round_version: None,
            weights_cache: None,
            groups: HashMap::new(),
            last_heartbeat: Instant::now(),
            said_credit_cap: false,
            report: RuntimeReport::default(),
        })
    }

    /// The current networks as a message, exported once per version.
    fn weights(&mut self) -> Rc<Message> {
        let version = self.trainer.counters.policy_version;
        match &self.weights_cache {
            Some((v, m)) if *v == version => m.clone(),
            _ => {
                let m = Rc::new(Message::Weights(Weights {
                    version,
                    policy: export(&self.trainer.model.policy_vs),
                    cost: export(&self.trainer.model.cost_vs),
                }));
                self.weights_cache = Some((version, m.clone()));
                m
            }
        }
    }

    /// Sends to a peer; a peer that is gone is forgotten and its job
    /// handed to another.
    fn send(&mut self, to: &[u8], message: &Message) {
        let version = self.trainer.counters.policy_version;
        if !self.hub.send(to, version, message) {
            self.forget(to);
        }
    }

    fn forget(&mut self, who: &[u8]) {
        if let Some(peer) = self.peers.remove(who) {
            tracing::warn!("{:?} {} is gone", peer.role, peer.id);
            if peer.role == Role::Actor && peer.credits > 0 {
                // Its credits are free for the others.
                self.share_credits();
            }
            // A group's unique id is only good while its rank 0 lives.
            self.groups.retain(|_, g| g.leader != who);
            if let Some(job) = peer.job.and_then(|j| self.jobs.remove(&j)) {
                self.report.requeued_jobs += 1;
                self.requeue.push_back(job.requeued());
            }
        }
    }

    /// Sends the current networks to every actor that holds a credit and
    /// has older ones. An actor without credits gets them with its next
    /// credit: weights it cannot act with yet would only load the network.
    fn broadcast(&mut self) {
        let version = self.trainer.counters.policy_version;
        let actors: Vec<Vec<u8>> = self
            .peers
            .iter()
            .filter(|(_, p)| p.role == Role::Actor && p.credits > 0 && p.version_sent < version)
            .map(|(k, _)| k.clone())
            .collect();
        if actors.is_empty() {
            return;
        }
        let weights = self.weights();
        for a in actors {
            // A send that failed may have led to a grant, weights included.
            if self.peers.get(&a).is_some_and(|p| p.version_sent < version) {
                self.send_weights(&a, &weights, version);
            }
        }
    }

    fn send_weights(&mut self, to: &[u8], weights: &Message, version: u64) {
        if let Some(p) = self.peers.get_mut(to) {
            p.version_sent = version;
        }
        self.report.weights_sent += 1;
        self.send(to, weights);
    }

    /// Unrolls in flight: the credits actors hold (an unroll being rolled
    /// out holds one) and the unrolls queued for an update.
    fn in_flight(&self) -> u64 {
        let held: u64 = self
            .peers
            .values()
            .filter(|p| p.role == Role::Actor)
            .map(|p| p.credits)
            .sum();
        held + self.queue.len() as u64
    }

    /// This actor's unrolls in flight: the credits it holds and its
    /// unrolls queued under its present session (an older one's are not
    /// its own: it started with none).
    fn actor_in_flight(&self, key: &[u8], p: &Peer) -> u64 {
        let queued = self
            .queue
            .iter()
            .filter(|q| q.from == key && q.joined == p.joined)
            .count();
        p.credits + queued as u64
    }

    /// Hands out the credits that are free, one at a time from the state as
    /// it is (a grant that finds its actor gone frees that actor's credits
    /// too): see [`credits::next`].
    fn share_credits(&mut self) {
        let limits = credits::Limits::of(&self.trainer.config().cluster);
        loop {
            let (keys, actors) = self.actor_credits();
            let now = Instant::now();
            let Some(i) = credits::next(&limits, now, self.in_flight(), &actors) else {
                break;
            };
            self.grant(&keys[i], 1);
        }
        if self.said_credit_cap {
            return;
        }
        let (_, actors) = self.actor_credits();
        if credits::any_waiting(&limits, &actors) {
            self.said_credit_cap = true;
            tracing::info!(
                "an actor waits for a credit: at most cluster.max_policy_lag = {} unrolls are \
                 in flight at once (more would be too old when learned from), and {} actors \
                 share them",
                limits.cap,
                actors.len()
            );
        }
    }

    /// Every actor's key and what [`credits::next`] reads of it.
    fn actor_credits(&self) -> (Vec<Vec<u8>>, Vec<credits::Actor>) {
        self.peers
            .iter()
            .filter(|(_, p)| p.role == Role::Actor)
            .map(|(k, p)| {
                let actor = credits::Actor {
                    id: p.id,
                    in_flight: self.actor_in_flight(k, p),
                    last_seen: p.last_seen,
                    last_unroll: p.last_unroll,
                };
                (k.clone(), actor)
            })
            .unzip()
    }

    /// Gives an actor `n` credits, with the newest weights first if it
    /// lacks them.
    fn grant(&mut self, to: &[u8], n: u64) {
        let version = self.trainer.counters.policy_version;
        let Some(p) = self.peers.get_mut(to) else {
            return; // gone
        };
        p.credits += n;
        p.credited_at = Instant::now();
        if p.version_sent < version {
            let weights = self.weights();
            self.send_weights(to, &weights, version);
        }
        self.send(to, &Message::Credit { n: n as u32 });
    }

    fn handle(&mut self, incoming: Incoming, hooks: &mut Hooks) -> anyhow::Result<()> {
        let Incoming {
            from,
            header,
            message,
        } = incoming;
        if let Message::Hello { role, token } = message {
            self.hello(from, &header, role, &token);
            return Ok(());
        }
        let Some(role) = self.check_envelope(&from, &header, &message) else {
            return Ok(());
        };
        match (role, message) {
            (Role::Actor, Message::Unroll(data)) => self.on_unroll(from, &header, data),
            (Role::Benchworker, Message::Measurement { job, measurement }) => {
                self.on_measurement(from, job, measurement, hooks)?
            }
            (Role::Benchworker, Message::JobFailed { job, error }) => {
                self.release_job(job);
                if let Some(j) = self.jobs.remove(&job) {
                    tracing::warn!("job {job} failed: {error}");
                    self.job_failed(j, error)?;
                }
            }
            (
                Role::Benchworker,
                Message::NcclId {
                    group,
                    ranks,
                    unique_id,
                },
            ) => self.on_nccl_id(from, group, ranks, unique_id),
            (Role::Benchworker, Message::Ready { max_devices }) => {
                self.on_ready(&from, max_devices.map(|m| m as usize))
            }
            (Role::GroupMember, Message::NcclJoin { group }) => {
                if self.groups.contains_key(&group) {
                    self.hand_group_id(&from, &group);
                } else if let Some(p) = self.peers.get_mut(&from) {
                    tracing::info!("group {group}: rank waits for rank 0's NCCL id");
                    p.awaits_group = Some(group);
                }
            }
            (_, Message::Heartbeat) => {}
            (_, Message::Shutdown) => self.forget(&from),
            _ => self.report.unexpected += 1,
        }
        Ok(())
    }

    /// An actor's unroll: queued for an update if it spent a credit and
    /// checks out, else dropped and counted.
    fn on_unroll(&mut self, from: Vec<u8>, header: &Header, data: UnrollData) {
        self.report.unrolls_received += 1;
        // The session whose credit it spends, if it had one.
        let joined = self.peers.get_mut(&from).and_then(|p| {
            p.last_unroll = Instant::now();
            p.credits_renewed = false;
            p.credits = p.credits.checked_sub(1)?;
            Some(p.joined)
        });
        let Some(joined) = joined else {
            self.report.uncredited_unrolls += 1;
            tracing::warn!("an unroll sent without a credit dropped");
            return;
        };
        let task = data.task as usize;
        let checked = match self.trainer.rollout_tasks().get(task) {
            Some(t) => unroll_from_data(&data, t.tables.len(), t.devices),
            None => Err(UnrollError::Task(task)),
        };
        match checked {
            Ok(unroll) => self.queue.push_back(Queued {
                joined,
                from,
                acted: header.policy_version,
                task,
                unroll,
            }),
            Err(e) => {
                self.report.bad_unrolls += 1;
                tracing::warn!("malformed unroll dropped: {e}");
                self.share_credits();
            }
        }
    }

    /// Does the next piece of learning the round allows; false when there
    /// is nothing to do until a message arrives.
    fn learn(&mut self, hooks: &mut Hooks) -> anyhow::Result<bool> {
        let t = &self.trainer.config().train;
        let (m, cs, ps) = (t.measure_per_iteration, t.cost_steps, t.policy_steps);
        let round = self.trainer.counters.iteration;
        let measured = self.trainer.buffer.len().min((round + 1) * m);
        // Cost steps follow the measurements.
        let cost_due = measured * cs / m;
        if self.trainer.counters.cost_steps < cost_due {
            for _ in 0..(cost_due - self.trainer.counters.cost_steps).min(10) {
                self.trainer.cost_step();
            }
            return Ok(true);
        }
        if measured < (round + 1) * m {
            return Ok(false);
        }
        // The round's cost network is ready: publish it once.
        let round_version = match self.round_version {
            Some(v) => v,
            None => {
                self.trainer.counters.policy_version += 1;
                self.broadcast();
                let v = self.trainer.counters.policy_version;
                // Acted on the previous cost network: dropped.
                self.trainer.counters.dropped_unrolls += self.queue.len();
                self.queue.clear();
                self.share_credits();
                self.round_version = Some(v);
                v
            }
        };
        if self.trainer.counters.policy_updates < (round + 1) * ps {
            let Some(q) = self.queue.pop_front() else {
                return Ok(false);
            };
            let lag = self.trainer.counters.policy_version.saturating_sub(q.acted);
            let max_lag = self.trainer.config().cluster.max_policy_lag as u64;
            if q.acted < round_version || lag > max_lag {
                self.trainer.counters.dropped_unrolls += 1;
                if q.acted >= round_version {
                    self.report.stale_unrolls += 1;
                }
            } else {
                let line = self.trainer.policy_update(q.task, &q.unroll, lag);
                *self.report.lags.entry(lag).or_default() += 1;
                (hooks.metrics)(&line)?;
                self.broadcast();
            }
            // After the update: the credit comes with the new weights.
            self.share_credits();
            return Ok(true);
        }
        // The round is complete.
        self.trainer.finish_round();
        self.round_version = None;
        (hooks.round_done)(self.trainer)?;
        Ok(true)
    }

    /// Heartbeats to every peer; peers silent too long are forgotten, jobs
    /// out too long handed to another benchworker.
    fn keep_alive(&mut self) {
        let c = &self.trainer.config().cluster;
        if self.last_heartbeat.elapsed() < Duration::from_secs_f64(c.heartbeat_s) {
            return;
        }
        self.last_heartbeat = Instant::now();
        let timeout = Duration::from_secs_f64(c.peer_timeout_s);
        let silent: Vec<Vec<u8>> = self
            .peers
            .iter()
            .filter(|(_, p)| p.last_seen.elapsed() > timeout)
            .map(|(k, _)| k.clone())
            .collect();
        for k in silent {
            self.report.lost_peers += 1;
            self.forget(&k);
        }
        let late: Vec<u64> = self
            .jobs
            .iter()
            .filter(|(_, j)| j.sent.elapsed() > Duration::from_secs_f64(c.job_timeout_s))
            .map(|(&id, _)| id)
            .collect();
        for id in late {
            if let Some(j) = self.jobs.remove(&id) {
                tracing::warn!("job {id} timed out; another benchworker gets it");
                self.report.requeued_jobs += 1;
                self.requeue.push_back(j.requeued());
                // Its benchworker stays busy until it answers (a late
                // answer is not counted, see `handle`): new work would
                // only wait behind the late job.
                if let Some(p) = self.peers.values_mut().find(|p| p.job == Some(id)) {
                    p.late_since = Some(Instant::now());
                }
            }
        }
        // ... but not for ever: one that still heartbeats another
        // job_timeout_s on lost the job or its answer on the way (a
        // connection made again drops what was queued on the old one).
        // Work sent to it while it measures after all waits in its queue.
        let job_timeout = Duration::from_secs_f64(c.job_timeout_s);
        let actor_silence = 3 * timeout;
        let mut starved = false;
        for p in self.peers.values_mut() {
            if p.late_since.is_some_and(|t| t.elapsed() > job_timeout) {
                tracing::warn!(
                    "benchworker {} never answered its late job {}: it gets jobs again",
                    p.id,
                    p.job.unwrap_or_default()
                );
                p.job = None;
                p.late_since = None;
                p.resynced = true;
                self.report.resyncs += 1;
            }
            // An actor silent with credits in hand (since its last unroll
            // and its last credit): an unroll or a credit may have been
            // lost. Its credits are shared anew, once per silence (it has
            // none in flight then, so it comes first; the learner's count
            // never exceeds what it granted: an unroll beyond it is dropped
            // and counted).
            if p.role == Role::Actor
                && p.credits > 0
                && !p.credits_renewed
                && p.last_unroll.max(p.credited_at).elapsed() > actor_silence
            {
                tracing::info!(
                    "actor {} sent no unroll for {} s with credits in hand: credits shared anew",
                    p.id,
                    actor_silence.as_secs()
                );
                p.credits = 0;
                p.credits_renewed = true;
                self.report.resyncs += 1;
                starved = true;
            }
        }
        if starved {
            self.share_credits();
        }
        let all: Vec<Vec<u8>> = self.peers.keys().cloned().collect();
        for p in all {
            self.send(&p, &Message::Heartbeat);
        }
    }

    /// Runs until every configured round is done or `stop` is set.
    pub fn run(&mut self, hooks: &mut Hooks, stop: &AtomicBool) -> anyhow::Result<()> {
        // Actors take version 0 for "no weights yet".
        self.trainer.counters.policy_version += 1;
        let mut last_progress = Instant::now();
        let mut progress_mark = self.progress_mark();
        // Without progress for this long, and with no measurement job out
        // within `cluster.job_timeout_s`, training stops with an error
        // instead of waiting for peers that will not come.
        let stall_timeout = Duration::from_secs_f64(self.trainer.config().cluster.stall_timeout_s);
        while !self.trainer.done() && !stop.load(Ordering::Relaxed) {
            let turn = Instant::now();
            self.keep_alive();
            let mut busy = self.dispatch();
            busy |= self.learn(hooks)?;
            let mut timeout = if busy { 0 } else { 20 };
            while let Some(incoming) = self.hub.recv(timeout)? {
                self.handle(incoming, hooks)?;
                timeout = 0;
            }
            if turn.elapsed() > Duration::from_secs(2) {
                tracing::warn!(
                    "one turn of the learner's loop took {:.1} s: peers may time out",
                    turn.elapsed().as_secs_f64()
                );
            }
            let mark = self.progress_mark();
            if mark != progress_mark {
                progress_mark = mark;
                last_progress = Instant::now();
            } else if last_progress.elapsed() > stall_timeout && !self.measuring() {
                let count = |r: Role| self.peers.values().filter(|p| p.role == r).count();
                let ready = self
                    .peers
                    .values()
                    .filter(|p| p.role == Role::Benchworker && p.ready)
                    .count();
                let refused = match self.hub.refused_handshakes() {
                    0 => String::new(),
                    n => format!(
                        "; {n} connections refused at their handshake (no cluster token, \
                         or another)"
                    ),
                };
                anyhow::bail!(
                    "no progress for {} s (cluster.stall_timeout_s): {} actors and {} \
                     benchworkers connected ({ready} ready), {} jobs out{refused}",
                    stall_timeout.as_secs_f64(),
                    count(Role::Actor),
                    count(Role::Benchworker),
                    self.jobs.len()
                );
            }
        }
        self.report.drops = self.hub.drops.clone();
        self.report.refused_handshakes = self.hub.refused_handshakes();
        Ok(())
    }

    /// Whether a benchworker is measuring a job that is not late yet, or
    /// setting up its backend since its hello for no longer than a job may
    /// take (a slow oracle, or a multi-host group forming, is not a stall).
    fn measuring(&self) -> bool {
        let timeout = Duration::from_secs_f64(self.trainer.config().cluster.job_timeout_s);
        self.jobs.values().any(|j| j.sent.elapsed() <= timeout)
            // A late job may still come back: waited for once more.
            || self
                .peers
                .values()
                .any(|p| p.late_since.is_some() && !p.resynced)
            || self
                .peers
                .values()
                .any(|p| p.role == Role::Benchworker && !p.ready && p.joined.elapsed() <= timeout)
    }

    fn progress_mark(&self) -> (usize, usize, usize, u64) {
        let c = &self.trainer.counters;
        (
            self.trainer.buffer.len(),
            c.cost_steps,
            c.policy_updates,
            self.report.unrolls_received,
        )
    }

    /// Tells every peer to stop; with `linger`, then for two heartbeat
    /// periods answers whoever still speaks (a remote peer forgotten a
    /// moment ago, one saying hello again) with `Shutdown` too, so that no
    /// peer is left waiting.
    pub fn shutdown(&mut self, linger: bool) {
        let all: Vec<Vec<u8>> = self.peers.keys().cloned().collect();
        for p in all {
            self.send(&p, &Message::Shutdown);
        }
        if !linger {
            return;
        }
        let grace = Duration::from_secs_f64(2.0 * self.trainer.config().cluster.heartbeat_s);
        let start = Instant::now();
        while let Some(left) = grace.checked_sub(start.elapsed()) {
            match self.hub.recv(left.as_millis() as i64) {
                Ok(Some(incoming)) => {
                    let version = self.trainer.counters.policy_version;
                    let _ = self.hub.send(&incoming.from, version, &Message::Shutdown);
                }
                Ok(None) | Err(_) => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::jobs::FAILING_AFTER;
    use super::*;
    use model::loss::CostSample;
    use net::link::Link;

    /// Whatever the learner sent `socket` until it fell silent for 200 ms.
    fn received(socket: &zmq::Socket) -> Vec<Message> {
        let mut got = Vec::new();
        while socket.poll(zmq::POLLIN, 200).unwrap() > 0 {
            got.push(
                net::protocol::decode(&socket.recv_bytes(0).unwrap())
                    .unwrap()
                    .1,
            );
        }
        got
    }

    /// The credits in what the learner sent `socket` (see [`received`]).
    fn credits_in(socket: &zmq::Socket) -> Vec<u32> {
        received(socket)
            .into_iter()
            .filter_map(|m| match m {
                Message::Credit { n } => Some(n),
                _ => None,
            })
            .collect()
    }

    /// The peer id the learner's welcome to `socket` gave.
    fn id_of(socket: &zmq::Socket) -> u64 {
        received(socket)
            .into_iter()
            .find_map(|m| match m {
                Message::Welcome { peer, .. } => Some(peer),
                _ => None,
            })
            .expect("a welcome")
    }

    /// Sends `m` on `socket` in an envelope with these fields.
    /// The key (routing id) of the peer numbered `id`.
    fn key_of(l: &Learner, id: u64) -> Vec<u8> {
        l.peers.iter().find(|(_, p)| p.id == id).unwrap().0.clone()
    }

    /// The peer numbered `id`.
    fn peer_of<'l>(l: &'l mut Learner, id: u64) -> &'l mut Peer {
        l.peers.values_mut().find(|p| p.id == id).unwrap()
    }

    fn send_as(socket: &zmq::Socket, sender: u64, incarnation: u64, seq: u64, m: &Message) {
        let header = net::protocol::Header {
            sender,
            incarnation,
            seq,
            policy_version: 0,
        };
        socket.send(net::protocol::encode(&header, m), 0).unwrap();
    }

    #[test]
    fn lag_quantiles_from_counts_are_those_of_the_sorted_lags() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        for n in [1usize, 2, 7, 100, 1001] {
            let lags: Vec<u64> = (0..n).map(|_| rng.gen_range(0..9)).collect();
            let mut report = RuntimeReport::default();
            for &l in &lags {
                *report.lags.entry(l).or_default() += 1;
            }
            let mut sorted = lags.clone();
            sorted.sort_unstable();
            for q in [0.0, 0.25, 0.5, 0.9, 0.99, 1.0] {
                let want = sorted[((n - 1) as f64 * q).round() as usize];
                assert_eq!(report.lag_quantile(q), want, "n {n}, q {q}");
            }
            assert_eq!(report.learned_from(), n as u64);
        }
        assert_eq!(RuntimeReport::default().lag_quantile(0.5), 0);
    }

    /// Plans go to benchworkers that can measure their width: a narrow one
    /// gets the round's first pick it can take, a wide plan waits for a
    /// wide benchworker, and one that no benchworker is wide enough for
    /// goes to any (to fail there with the reason).
    #[test]
    fn plans_go_to_benchworkers_wide_enough_for_them() {
        let dir = tempfile::tempdir().unwrap();
        let (cfg, suite) = crate::train::tests::small_data(dir.path());
        // Tasks of 4 devices and of 2, alternately.
        let mut tasks = suite.tasks.clone();
        for t in tasks.iter_mut().skip(1).step_by(2) {
            t.devices = 2;
        }
        let mut trainer = Trainer::new(&cfg, &tasks);
        let ctx = zmq::Context::new();
        let endpoint = "inproc://by-width";
        let hub = Hub::bind(&ctx, endpoint, Some("right")).unwrap();
        let mut learner = Learner::new(&mut trainer, hub, "right".into()).unwrap();
        let mut hooks = Hooks::none();
        let hello = Message::Hello {
            role: Role::Benchworker,
            token: "right".into(),
        };
        let (narrow, wide) = (
            ctx.socket(zmq::DEALER).unwrap(),
            ctx.socket(zmq::DEALER).unwrap(),
        );
        for (socket, incarnation) in [(&narrow, 5), (&wide, 6)] {
            socket.connect(endpoint).unwrap();
            send_as(socket, 0, incarnation, 1, &hello);
            let incoming = learner.hub.recv(1000).unwrap().expect("a hello");
            learner.handle(incoming, &mut hooks).unwrap();
        }
        let (id_narrow, id_wide) = (id_of(&narrow), id_of(&wide));
        // Benchworkers setting up are no stall, unless it takes them longer
        // than a job may.
        assert!(learner.measuring());
        let long_ago = Instant::now() - Duration::from_secs_f64(cfg.cluster.job_timeout_s + 1.0);
        for p in learner.peers.values_mut() {
            p.joined = long_ago;
        }
        assert!(!learner.measuring());
        for p in learner.peers.values_mut() {
            p.joined = Instant::now();
        }
        let mut seq = 2;
        let mut say_width = |learner: &mut Learner, narrow_max: u32, wide_max: u32| {
            for (socket, id, incarnation, max) in [
                (&narrow, id_narrow, 5, narrow_max),
                (&wide, id_wide, 6, wide_max),
            ] {
                let ready = Message::Ready {
                    max_devices: Some(max),
                };
                send_as(socket, id, incarnation, seq, &ready);
                let incoming = learner.hub.recv(1000).unwrap().expect("a ready");
                learner.handle(incoming, &mut hooks).unwrap();
            }
            seq += 1;
        };
        say_width(&mut learner, 2, 4);
        assert!(!learner.measuring(), "both ready, no job out");
        let width = |task: u32| tasks[task as usize].devices;
        let jobs = |socket: &zmq::Socket| -> Vec<u32> {
            received(socket)
                .into_iter()
                .filter_map(|m| match m {
                    Message::MeasureJob { task, .. } => Some(task),
                    _ => None,
                })
                .collect()
        };
        let reset = |learner: &mut Learner| {
            learner.jobs.clear();
            for p in learner.peers.values_mut() {
                p.job = None;
            }
        };

        // The wide one busy: the narrow one gets the first pick of a
        // 2-device task.
        peer_of(&mut learner, id_wide).job = Some(u64::MAX);
        assert!(learner.dispatch());
        let sent = jobs(&narrow);
        assert_eq!(sent.len(), 1);
        assert_eq!(width(sent[0]), 2);
        let first_narrow = (0..)
            .find(|&j| learner.trainer.pick_devices(j) == 2)
            .unwrap();
        let job = learner.jobs.values().next().unwrap();
        assert_eq!((job.worker, job.pick.id.place), (id_narrow, first_narrow));

        // A 4-device plan to measure again waits for the wide one ...
        reset(&mut learner);
        peer_of(&mut learner, id_wide).job = Some(u64::MAX);
        let wide_place = (0..)
            .find(|&j| learner.trainer.pick_devices(j) == 4)
            .unwrap();
        // The plan of a 4-device pick, to measure again.
        let requeue_wide = |learner: &mut Learner| {
            let pick = learner.trainer.pick_plan(wide_place);
            learner.requeue.push_back(Requeued {
                pick,
                tried: Vec::new(),
            });
        };
        requeue_wide(&mut learner);
        assert!(
            !learner.dispatch(),
            "nothing to send before the wide one is idle"
        );
        assert!(jobs(&narrow).is_empty());
        assert_eq!(learner.requeue.len(), 1);
        // ... and goes to it first once it is idle; the narrow one gets
        // only 2-device plans.
        peer_of(&mut learner, id_wide).job = None;
        assert!(learner.dispatch());
        assert!(learner.requeue.is_empty());
        assert_eq!(width(jobs(&wide)[0]), 4);
        let to_narrow = jobs(&narrow);
        assert!(!to_narrow.is_empty());
        assert!(to_narrow.iter().all(|&t| width(t) == 2), "{to_narrow:?}");

        // No benchworker can take 4 devices any more: such a plan waits
        // for one to join, then goes to either, where it fails with the
        // reason.
        reset(&mut learner);
        say_width(&mut learner, 2, 2);
        requeue_wide(&mut learner);
        assert!(!learner.dispatch());
        assert!(learner.wide_since.is_some(), "waiting for a wide one");
        assert!([jobs(&narrow), jobs(&wide)].concat().is_empty());
        learner.wide_since = Some(Instant::now() - Duration::from_secs(3600));
        assert!(learner.dispatch());
        assert!(learner.requeue.is_empty());
        let first = [jobs(&narrow), jobs(&wide)].concat();
        assert!(first.iter().any(|&t| width(t) == 4), "{first:?}");
        // The wait is over for the next one too (it failed, say) ...
        reset(&mut learner);
        requeue_wide(&mut learner);
        assert!(learner.dispatch());
        assert!(learner.requeue.is_empty() && learner.wide_since.is_some());
        // ... until a benchworker says a new width: the widest may be wider.
        say_width(&mut learner, 2, 3);
        assert!(learner.wide_since.is_none());

        // While a benchworker sets up, it may be the wide one: the wait
        // does not begin.
        reset(&mut learner);
        let late = ctx.socket(zmq::DEALER).unwrap();
        late.connect(endpoint).unwrap();
        send_as(&late, 0, 7, 1, &hello);
        let incoming = learner.hub.recv(1000).unwrap().expect("a hello");
        learner.handle(incoming, &mut hooks).unwrap();
        requeue_wide(&mut learner);
        assert!(!learner.dispatch());
        assert!(learner.wide_since.is_none());
    }

    /// Raw peers of a learner driven by hand: an unroll beyond the credits
    /// is dropped, and a plan to measure again goes to a benchworker that
    /// has not failed it.
    #[test]
    fn uncredited_unrolls_are_dropped_and_requeued_plans_avoid_who_failed_them() {
        use net::protocol::{encode, Header};
        let dir = tempfile::tempdir().unwrap();
        let (mut cfg, suite) = crate::train::tests::small_data(dir.path());
        cfg.cluster.job_timeout_s = 1.0;
        let mut trainer = Trainer::new(&cfg, &suite.tasks);
        let ctx = zmq::Context::new();
        let endpoint = "inproc://by-hand";
        let hub = Hub::bind(&ctx, endpoint, Some("right")).unwrap();
        let mut learner = Learner::new(&mut trainer, hub, "right".into()).unwrap();
        let mut hooks = Hooks::none();
        let peer = |role: Role| {
            let socket = ctx.socket(zmq::DEALER).unwrap();
            socket.connect(endpoint).unwrap();
            let hello = Message::Hello {
                role,
                token: "right".into(),
            };
            let header = Header {
                sender: 0,
                incarnation: 5,
                seq: 1,
                policy_version: 0,
            };
            socket.send(encode(&header, &hello), 0).unwrap();
            socket
        };
        let (a, b, actor) = (
            peer(Role::Benchworker),
            peer(Role::Benchworker),
            peer(Role::Actor),
        );
        let mut welcomed = 0;
        while welcomed < 3 {
            let incoming = learner.hub.recv(1000).unwrap().expect("three hellos");
            learner.handle(incoming, &mut hooks).unwrap();
            welcomed += 1;
        }
        let (id_a, id_b, id_actor) = (id_of(&a), id_of(&b), id_of(&actor));
        // Only benchworkers that said they are ready get jobs.
        assert!(!learner.dispatch());
        for (socket, id) in [(&a, id_a), (&b, id_b)] {
            let ready = Message::Ready { max_devices: None };
            send_as(socket, id, 5, 2, &ready);
            let incoming = learner.hub.recv(1000).unwrap().expect("a ready");
            learner.handle(incoming, &mut hooks).unwrap();
        }

        let unroll = |seq: u64| {
            let header = Header {
                sender: id_actor,
                incarnation: 5,
                seq,
                policy_version: 1,
            };
            let data = UnrollData {
                task: 0,
                episodes: 0,
                order: Vec::new(),
                actions: Vec::new(),
                behaviour_logp: Vec::new(),
                masks: Vec::new(),
                device_features: Vec::new(),
                predicted_cost_ms: Vec::new(),
                reward_scale: 1.0,
                infeasible: Vec::new(),
            };
            encode(&header, &Message::Unroll(data))
        };
        // A queued unroll holds its credit: mark the actor's as spent.
        peer_of(&mut learner, id_actor).credits = 0;
        actor.send(unroll(2), 0).unwrap();
        let incoming = learner.hub.recv(1000).unwrap().unwrap();
        learner.handle(incoming, &mut hooks).unwrap();
        assert_eq!(learner.report.uncredited_unrolls, 1);
        assert_eq!(learner.report.bad_unrolls, 0, "dropped before it was read");
        assert!(learner.queue.is_empty());
        assert!(!received(&actor)
            .iter()
            .any(|m| matches!(m, Message::Credit { .. })));

        // `a` failed a plan: measured again, it goes to `b`, though `a`
        // is idle too, and the other way round; failed by both, it goes to
        // one of them all the same.
        for (tried, want) in [
            (vec![id_a], Some(id_b)),
            (vec![id_b], Some(id_a)),
            (vec![id_a, id_b], None),
        ] {
            let pick = learner.trainer.pick_plan(0);
            let tried_before = tried.clone();
            learner.requeue.push_back(Requeued { pick, tried });
            assert!(learner.dispatch());
            let jobs = |s: &zmq::Socket| {
                received(s)
                    .into_iter()
                    .filter(|m| matches!(m, Message::MeasureJob { .. }))
                    .count()
            };
            let (to_a, to_b) = (jobs(&a), jobs(&b));
            assert_eq!(to_a + to_b, 2, "both idle workers get work");
            // The requeued job went first, to the one that had not failed it.
            let first = learner.jobs.values().next().unwrap();
            if let Some(want) = want {
                assert_eq!(first.worker, want);
            }
            assert_eq!(first.tried, tried_before);
            learner.jobs.clear();
            for p in learner.peers.values_mut() {
                p.job = None;
            }
        }

        // `a` fails job after job (a GPU out of memory, fast): after
        // FAILING_AFTER in a row it sits out while `b` is sound, and the
        // run goes on.
        for seq in 3..3 + FAILING_AFTER as u64 {
            peer_of(&mut learner, id_b).job = Some(u64::MAX);
            assert!(learner.dispatch(), "`a` is idle and not yet failing");
            let job = *learner
                .jobs
                .iter()
                .find(|(_, j)| j.worker == id_a)
                .unwrap()
                .0;
            let failed = Message::JobFailed {
                job,
                error: "out of memory".into(),
            };
            send_as(&a, id_a, 5, seq, &failed);
            let incoming = learner.hub.recv(1000).unwrap().unwrap();
            learner.handle(incoming, &mut hooks).unwrap();
            received(&a);
        }
        assert_eq!(learner.job_failures, FAILING_AFTER);
        assert!(
            !learner.dispatch(),
            "`a` is idle but failing, `b` busy: nothing goes to `a`"
        );
        assert!(received(&a).is_empty());
        learner.jobs.clear();
        peer_of(&mut learner, id_b).job = None;
        assert!(learner.dispatch());
        assert!(learner.jobs.values().all(|j| j.worker == id_b));
        assert!(!received(&b).is_empty());
        // With no sound benchworker left, the failing one gets jobs again.
        learner.jobs.clear();
        learner.requeue.clear();
        let key_b = key_of(&learner, id_b);
        let peer_b = learner.peers.remove(&key_b).unwrap();
        assert!(learner.dispatch());
        assert!(learner.jobs.values().all(|j| j.worker == id_a));
        received(&a);
        learner.peers.insert(key_b, peer_b);
        // Its time out over, it is tried again beside a sound one.
        for p in learner.peers.values_mut() {
            p.job = None;
            if p.id == id_a {
                p.sidelined_until = Some(Instant::now());
            }
        }
        learner.jobs.clear();
        learner.requeue.clear();
        assert!(learner.dispatch());
        assert!(learner.jobs.values().any(|j| j.worker == id_a));
        received(&a);
        received(&b);
        for p in learner.peers.values_mut() {
            p.job = None;
            p.failed_in_a_row = 0;
            p.sidelined_until = None;
        }
        learner.jobs.clear();
        learner.requeue.clear();

        // A round resumed with only its second pick measured (the first
        // had not come back): the two idle workers get the first and third.
        let pick = learner.trainer.pick_plan(1);
        let task = &learner.trainer.tasks()[pick.task];
        let mut sim = benchworker::sim::SimOracle::new(cfg.sim.clone(), cfg.memory);
        let got = benchworker::Oracle::measure(&mut sim, &task.tables, &pick.plan).unwrap();
        let sample = CostSample::new(task, &pick.plan, got).of_pick(pick.id);
        learner.trainer.record(pick.predicted_ms, sample);
        assert!(learner.dispatch());
        let mut places: Vec<usize> = learner.jobs.values().map(|j| j.pick.id.place).collect();
        places.sort_unstable();
        assert_eq!(places, [0, 2]);

        // A job whose answer never comes (lost on the way): requeued after
        // job_timeout_s, its benchworker busy another job_timeout_s, then
        // given work again.
        let ago = |s: u64| Instant::now().checked_sub(Duration::from_secs(s)).unwrap();
        let tend = |learner: &mut Learner| {
            learner.last_heartbeat = ago(3600);
            for p in learner.peers.values_mut() {
                p.last_seen = Instant::now();
            }
            learner.keep_alive();
        };
        let (&late, _) = learner.jobs.iter().find(|(_, j)| j.worker == id_a).unwrap();
        learner.jobs.get_mut(&late).unwrap().sent = ago(2);
        tend(&mut learner);
        assert!(!learner.jobs.contains_key(&late), "requeued");
        let peer_a = |l: &Learner| l.peers.values().find(|p| p.id == id_a).unwrap().job;
        assert_eq!(peer_a(&learner), Some(late), "busy until it answers ...");
        received(&a);
        learner.dispatch();
        assert!(received(&a).is_empty());
        tend(&mut learner);
        assert_eq!(learner.report.resyncs, 0);
        peer_of(&mut learner, id_a).late_since = Some(ago(2));
        tend(&mut learner);
        assert_eq!(peer_a(&learner), None, "... or for another job_timeout_s");
        assert_eq!(learner.report.resyncs, 1);
        assert!(learner.dispatch());
        assert!(received(&a)
            .iter()
            .any(|m| matches!(m, Message::MeasureJob { .. })));

        // An actor silent with credits in hand (an unroll or a credit lost)
        // gets a fresh allotment; one without credits is waited for.
        received(&actor);
        peer_of(&mut learner, id_actor).credits = 0;
        peer_of(&mut learner, id_actor).last_unroll = ago(60);
        tend(&mut learner);
        assert!(credits_in(&actor).is_empty());
        // One that waited long for its credit and got it lately is not
        // silent with it in hand.
        peer_of(&mut learner, id_actor).credits = 1;
        peer_of(&mut learner, id_actor).credited_at = Instant::now();
        tend(&mut learner);
        assert!(credits_in(&actor).is_empty());
        assert_eq!(learner.report.resyncs, 1);
        peer_of(&mut learner, id_actor).credited_at = ago(60);
        tend(&mut learner);
        assert_eq!(
            credits_in(&actor).iter().sum::<u32>(),
            cfg.cluster.actor_credits as u32
        );
        assert_eq!(
            peer_of(&mut learner, id_actor).credits,
            cfg.cluster.actor_credits as u64
        );
        assert_eq!(learner.report.resyncs, 2);
        // Not again while it stays silent (slow, or waiting for newer
        // weights): its credits would only pile up.
        peer_of(&mut learner, id_actor).last_unroll = ago(120);
        peer_of(&mut learner, id_actor).credited_at = ago(120);
        tend(&mut learner);
        assert!(credits_in(&actor).is_empty());
        assert_eq!(learner.report.resyncs, 2);
    }

    /// Actors share at most `max_policy_lag` unrolls in flight, none holds
    /// more than `actor_credits`, and a freed credit goes to the actor with
    /// the fewest in flight: actors beyond the limit take turns.
    #[test]
    fn credits_are_shared_within_the_policy_lag() {
        use net::protocol::{encode, Header};
        let dir = tempfile::tempdir().unwrap();
        let (mut cfg, suite) = crate::train::tests::small_data(dir.path());
        cfg.cluster.max_policy_lag = 3;
        cfg.cluster.actor_credits = 2;
        let mut trainer = Trainer::new(&cfg, &suite.tasks);
        let task = trainer.rollout_tasks()[0].clone();
        let ctx = zmq::Context::new();
        let endpoint = "inproc://credits";
        let hub = Hub::bind(&ctx, endpoint, Some("right")).unwrap();
        let mut learner = Learner::new(&mut trainer, hub, "right".into()).unwrap();
        let mut hooks = Hooks::none();
        let mut seq = 1;
        // Sends `m` from `socket` (incarnation 7) and has the learner take it.
        let mut say = |learner: &mut Learner, socket: &zmq::Socket, id: u64, m: &Message| {
            seq += 1;
            let header = Header {
                sender: id,
                incarnation: 7,
                seq,
                policy_version: learner.trainer.counters.policy_version,
            };
            socket.send(encode(&header, m), 0).unwrap();
            let incoming = learner.hub.recv(1000).unwrap().expect("a message");
            learner.handle(incoming, &mut hooks).unwrap();
        };
        let hello = Message::Hello {
            role: Role::Actor,
            token: "right".into(),
        };
        let mut actors = Vec::new();
        for _ in 0..3 {
            let socket = ctx.socket(zmq::DEALER).unwrap();
            socket.connect(endpoint).unwrap();
            say(&mut learner, &socket, 0, &hello);
            let id = id_of(&socket);
            actors.push((socket, id));
        }
        let held = |learner: &mut Learner, i: usize| peer_of(learner, actors[i].1).credits;
        // The first two fill the three credits; the third waits.
        assert_eq!(
            [0, 1, 2].map(|i| held(&mut learner, i)),
            [2, 1, 0],
            "in order of hello"
        );
        assert_eq!(learner.in_flight(), 3);
        // A valid unroll of one episode, every table on device 0.
        let (m, d) = (task.tables.len(), task.devices);
        let unroll = Message::Unroll(UnrollData {
            task: 0,
            episodes: 1,
            order: (0..m as u32).collect(),
            actions: vec![0; m],
            behaviour_logp: vec![-0.5; m],
            masks: vec![true; m * d],
            device_features: vec![0.0; m * d * model::nets::DEVICE_FEATURES as usize],
            predicted_cost_ms: vec![10.0],
            reward_scale: 1.0,
            infeasible: vec![false],
        });
        // Queued, an unroll is still in flight: nobody gets its credit.
        let (a0, id0) = (&actors[0].0, actors[0].1);
        say(&mut learner, a0, id0, &unroll);
        assert_eq!(learner.queue.len(), 1);
        assert_eq!(held(&mut learner, 0), 1);
        assert_eq!(learner.in_flight(), 3);
        for (socket, _) in &actors {
            received(socket);
        }
        // Learned from: its credit goes to the actor with none.
        learner.queue.pop_front();
        learner.share_credits();
        assert_eq!([0, 1, 2].map(|i| held(&mut learner, i)), [1, 1, 1]);
        assert_eq!(credits_in(&actors[2].0).iter().sum::<u32>(), 1);
        assert_eq!(credits_in(&actors[0].0).iter().sum::<u32>(), 0);
        // A malformed unroll frees its credit too, and its actor, now with
        // none in flight, has it back.
        let (a1, id1) = (&actors[1].0, actors[1].1);
        let Message::Unroll(good) = &unroll else {
            unreachable!()
        };
        let bad = Message::Unroll(UnrollData {
            actions: vec![d as u32; m],
            ..good.clone()
        });
        say(&mut learner, a1, id1, &bad);
        assert_eq!(learner.report.bad_unrolls, 1);
        assert_eq!([0, 1, 2].map(|i| held(&mut learner, i)), [1, 1, 1]);
        assert_eq!(credits_in(a1).iter().sum::<u32>(), 1);
        // An actor that leaves frees what it held. The first actor's
        // queued unroll is its own in flight: with one each, the credit
        // goes to the actor whose last unroll came longest ago (the
        // second's, though the first has the lower id).
        say(&mut learner, a0, id0, &unroll);
        assert_eq!(learner.queue.len(), 1);
        peer_of(&mut learner, id1).last_unroll = Instant::now() - Duration::from_secs(5);
        let key2 = key_of(&learner, actors[2].1);
        learner.forget(&key2);
        assert_eq!([0, 1].map(|i| held(&mut learner, i)), [0, 2]);
        assert_eq!(learner.in_flight(), 3);
    }

    #[test]
    fn networks_too_big_to_send_are_refused_before_training() {
        let dir = tempfile::tempdir().unwrap();
        let (mut cfg, suite) = crate::train::tests::small_data(dir.path());
        cfg.model.cost_table_hidden = 4096;
        cfg.model.cost_table_out = 4096;
        let mut trainer = Trainer::new(&cfg, &suite.tasks);
        let ctx = zmq::Context::new();
        let hub = Hub::bind(&ctx, "inproc://too-big", Some("t")).unwrap();
        let e = Learner::new(&mut trainer, hub, "t".into())
            .err()
            .expect("weights over the frame limit")
            .to_string();
        assert!(e.contains("weights") && e.contains("64 MiB"), "{e}");
    }

    /// Strangers (a wrong token: in its hello between threads, at the
    /// handshake over tcp), garbage, messages from peers that never said
    /// hello and messages whose envelope does not match their peer's are
    /// refused or dropped, and counted; training goes on.
    #[test]
    fn strangers_and_garbage_are_refused_and_counted() {
        let dir = tempfile::tempdir().unwrap();
        let (mut cfg, suite) = crate::train::tests::small_data(dir.path());
        cfg.train.iterations = 2;
        cfg.train.policy_steps = 5;
        // The misfit below stays quiet after its messages: on a slow
        // machine it must not be forgotten for its silence.
        cfg.cluster.peer_timeout_s = 120.0;
        let mut trainer = Trainer::new(&cfg, &suite.tasks);
        let ctx = zmq::Context::new();
        let endpoint = "inproc://strangers";
        let mut hub = Hub::bind(&ctx, endpoint, Some("right")).unwrap();
        let tcp = hub.bind_also("tcp://127.0.0.1:0").unwrap();
        let stop = AtomicBool::new(false);
        let (misfit_sent, misfit_done) = std::sync::mpsc::channel::<()>();
        // A stranger over tcp, as another process would be: refused at the
        // handshake (the hub answers that before the learner runs).
        let opts = actor::worker::ActorOptions {
            endpoint: tcp,
            token: "wrong".into(),
            seed: 3,
            wait: Duration::from_secs(30),
        };
        let far_stranger = actor::worker::run(&zmq::Context::new(), &opts, &stop);
        let (report, stranger) = std::thread::scope(|s| {
            let actor = s.spawn(|| {
                let opts = actor::worker::ActorOptions {
                    endpoint: endpoint.into(),
                    token: "right".into(),
                    seed: 1,
                    wait: Duration::from_secs(30),
                };
                actor::worker::run(&ctx, &opts, &stop)
            });
            let bench = s.spawn(|| {
                let opts = benchworker::serve::ServeOptions {
                    endpoint: endpoint.into(),
                    token: "right".into(),
                    backend: benchworker::Backend::Sim,
                    wait: Duration::from_secs(30),
                    group: None,
                };
                benchworker::serve::serve(&ctx, &opts, &stop)
            });
            let stranger = s.spawn(|| {
                let opts = actor::worker::ActorOptions {
                    endpoint: endpoint.into(),
                    token: "wrong".into(),
                    seed: 2,
                    wait: Duration::from_secs(30),
                };
                actor::worker::run(&ctx, &opts, &stop)
            });

            // A peer that says hello twice, then sends messages whose
            // envelope is wrong: each a Shutdown, which acted on would make
            // the learner forget it; then a right one.
            let misfit = s.spawn(|| {
                use net::protocol::decode;
                let socket = ctx.socket(zmq::DEALER).unwrap();
                socket.connect(endpoint).unwrap();
                let incarnation = 77;
                let send = |sender, incarnation, seq, m: &Message| {
                    send_as(&socket, sender, incarnation, seq, m)
                };
                let hello = Message::Hello {
                    role: Role::Actor,
                    token: "right".into(),
                };
                send(0, incarnation, 1, &hello);
                send(0, incarnation, 2, &hello);
                let (mut welcomed, mut refused, mut told_to_stop) = (Vec::new(), 0, false);
                let start = Instant::now();
                while !told_to_stop && start.elapsed() < Duration::from_secs(60) {
                    if socket.poll(zmq::POLLIN, 100).unwrap() == 0 {
                        continue;
                    }
                    match decode(&socket.recv_bytes(0).unwrap()).unwrap().1 {
                        Message::Welcome { peer, .. } => {
                            welcomed.push(peer);
                            if welcomed.len() == 2 {
                                let id = welcomed[0];
                                send(id, incarnation, 2, &Message::Shutdown); // replayed
                                send(id, incarnation + 2, 3, &Message::Shutdown);
                                send(id + 100, incarnation, 4, &Message::Shutdown);
                                send(id, incarnation, 5, &Message::Heartbeat);
                                misfit_sent.send(()).unwrap();
                            }
                        }
                        Message::Refused { .. } => refused += 1,
                        Message::Shutdown => told_to_stop = true,
                        _ => {}
                    }
                }
                (welcomed, refused, told_to_stop)
            });
            // Garbage, then a well-formed unroll from a peer that never said hello.
            let mut raw = Link::connect(&ctx, endpoint, None).unwrap();
            let junk = ctx.socket(zmq::DEALER).unwrap();
            junk.connect(endpoint).unwrap();
            junk.send(&b"EMBS\x01\x00\x05garbage"[..], 0).unwrap();
            junk.send(&b"hello?"[..], 0).unwrap();
            let unroll = UnrollData {
                task: 0,
                episodes: 1,
                order: vec![],
                actions: vec![],
                behaviour_logp: vec![],
                masks: vec![],
                device_features: vec![],
                predicted_cost_ms: vec![1.0],
                reward_scale: 1.0,
                infeasible: vec![false],
            };
            raw.send(1, &Message::Unroll(unroll)).unwrap();
            let mut learner = Learner::new(&mut trainer, hub, "right".into()).unwrap();
            // The first round ends only once the misfit has sent everything:
            // the second one takes its messages.
            let mut hooks = Hooks::none();
            let mut waited = false;
            hooks.round_done = Box::new(move |_| {
                if !std::mem::replace(&mut waited, true) {
                    misfit_done.recv_timeout(Duration::from_secs(30))?;
                }
                Ok(())
            });
            learner.run(&mut hooks, &stop).unwrap();
            learner.shutdown(false);
            stop.store(true, Ordering::Relaxed);
            assert!(actor.join().unwrap().unwrap().unrolls > 0);
            assert_eq!(bench.join().unwrap().unwrap().measured, 20);
            // The peer without a hello was told so.
            let told = raw.recv(1000).unwrap().map(|(_, m)| m);
            assert!(matches!(told, Some(Message::Refused { .. })), "{told:?}");
            // The misfit got one id twice, was never refused and was still
            // known at the end (told to stop).
            let (welcomed, refused, told_to_stop) = misfit.join().unwrap();
            assert_eq!(welcomed.len(), 2);
            assert_eq!(welcomed[0], welcomed[1], "a hello said again keeps its id");
            assert_eq!(refused, 0);
            assert!(told_to_stop, "a message with a wrong envelope was acted on");
            (learner.report.clone(), stranger.join().unwrap())
        });
        assert_eq!(report.bad_envelopes, 3);
        let err = format!("{:#}", stranger.unwrap_err());
        assert!(err.contains("wrong cluster token"), "{err}");
        assert_eq!(report.refused_peers, 1, "the stranger between threads");
        let err = format!("{:#}", far_stranger.unwrap_err());
        assert!(
            err.contains("refused our cluster token at the connection's handshake")
                && err.contains("wrong cluster token"),
            "{err}"
        );
        assert_eq!(report.refused_handshakes, 1, "the stranger over tcp");
        assert_eq!(report.drops.total(), 2, "{:?}", report.drops);
        assert_eq!(report.unexpected, 1);
        assert_eq!(trainer.counters.iteration, 2, "training went on");
        assert_eq!(trainer.counters.policy_updates, 10);
    }

    /// What a fake group peer saw.
    #[derive(Debug, Default)]
    struct Seen {
        id: Option<(Vec<u32>, Vec<u8>)>,
        jobs: usize,
    }

    /// Rank 0 of a multi-host group posts its NCCL id; members that asked
    /// before or after get exactly that id, and never a job; a malformed id
    /// is refused. Rank 0 itself measures (with `sim`) like any benchworker.
    #[test]
    fn group_members_get_rank_zeros_nccl_id_and_no_jobs() {
        use std::sync::mpsc::channel;
        let dir = tempfile::tempdir().unwrap();
        let (mut cfg, suite) = crate::train::tests::small_data(dir.path());
        cfg.train.iterations = 1000; // stopped below
        let mut trainer = Trainer::new(&cfg, &suite.tasks);
        let ctx = zmq::Context::new();
        let endpoint = "inproc://group";
        let hub = Hub::bind(&ctx, endpoint, Some("t")).unwrap();
        let stop = AtomicBool::new(false);
        let id: Vec<u8> = (0..128u8).rev().collect();
        let wait = Duration::from_secs(30);
        let beat = Duration::from_millis(200);
        let (got_id, ids) = channel::<()>();
        // A member: join, then take messages until told to shut down.
        let member = |joined: std::sync::mpsc::Sender<()>, got_id: std::sync::mpsc::Sender<()>| {
            let mut link = Link::connect(&ctx, endpoint, Some("t")).unwrap();
            link.register(Role::GroupMember, "t", wait, &stop)
                .unwrap()
                .unwrap();
            link.send(0, &Message::NcclJoin { group: "g".into() })
                .unwrap();
            let _ = joined.send(());
            let mut seen = Seen::default();
            loop {
                link.heartbeat(beat).unwrap();
                match link.recv(50).unwrap().map(|(_, m)| m) {
                    Some(Message::NcclId {
                        group,
                        ranks,
                        unique_id,
                    }) => {
                        assert_eq!(group, "g");
                        assert!(seen.id.is_none(), "the id came twice");
                        seen.id = Some((ranks, unique_id));
                        let _ = got_id.send(());
                    }
                    Some(Message::MeasureJob { .. }) => seen.jobs += 1,
                    Some(Message::Shutdown) => return seen,
                    _ => {}
                }
            }
        };
        let (report, early, late, leader) = std::thread::scope(|s| {
            let (early_joined, early_in) = channel();
            let (posted, posted_rx) = channel();
            let (measured_tx, measured_rx) = channel::<()>();
            let got = got_id.clone();
            let early = s.spawn(move || member(early_joined, got));
            let (ctx, stop, id) = (&ctx, &stop, &id);
            let leader = s.spawn(move || {
                let mut link = Link::connect(ctx, endpoint, Some("t")).unwrap();
                let welcome = link
                    .register(Role::Benchworker, "t", wait, stop)
                    .unwrap()
                    .unwrap();
                early_in.recv().unwrap(); // the early member asked first
                let bad = Message::NcclId {
                    group: "g".into(),
                    ranks: vec![1, 1],
                    unique_id: vec![1; 64],
                };
                link.send(0, &bad).unwrap();
                let post = Message::NcclId {
                    group: "g".into(),
                    ranks: vec![2, 1],
                    unique_id: id.to_vec(),
                };
                link.send(0, &post).unwrap();
                link.send(
                    0,
                    &Message::Ready {
                        max_devices: Some(3),
                    },
                )
                .unwrap();
                posted.send(()).unwrap();
                let mut oracle =
                    benchworker::build(benchworker::Backend::Sim, &welcome.config).unwrap();
                let mut measured = 0usize;
                loop {
                    link.heartbeat(beat).unwrap();
                    match link.recv(50).unwrap().map(|(_, m)| m) {
                        Some(Message::MeasureJob {
                            job,
                            task,
                            assignment,
                        }) => {
                            let t = &welcome.tasks[task as usize];
                            let plan = common::Plan {
                                devices: t.devices,
                                assignment: assignment.iter().map(|&d| d as usize).collect(),
                            };
                            let measurement = oracle.measure(&t.tables, &plan).unwrap();
                            link.send(0, &Message::Measurement { job, measurement })
                                .unwrap();
                            measured += 1;
                            let _ = measured_tx.send(());
                        }
                        Some(Message::Shutdown) => return measured,
                        _ => {}
                    }
                }
            });
            let got = got_id.clone();
            let late = s.spawn(move || {
                posted_rx.recv().unwrap(); // joins after rank 0 posted
                member(channel().0, got)
            });
            // Stop once both members hold the id and rank 0 has measured.
            let stopper = s.spawn(move || {
                for _ in 0..2 {
                    ids.recv_timeout(wait).expect("a member got no id");
                }
                for _ in 0..3 {
                    measured_rx
                        .recv_timeout(wait)
                        .expect("rank 0 measured nothing");
                }
                stop.store(true, Ordering::Relaxed);
            });
            let mut learner = Learner::new(&mut trainer, hub, "t".into()).unwrap();
            learner.run(&mut Hooks::none(), stop).unwrap();
            learner.shutdown(false);
            stopper.join().unwrap();
            (
                learner.report.clone(),
                early.join().unwrap(),
                late.join().unwrap(),
                leader.join().unwrap(),
            )
        });
        let want = Some((vec![2, 1], id.clone()));
        assert_eq!(early.id, want, "the member that asked first");
        assert_eq!(late.id, want, "the member that asked after the post");
        assert_eq!((early.jobs, late.jobs), (0, 0), "members take no jobs");
        assert!(leader >= 3, "rank 0 measured {leader} plans");
        assert!(!trainer.buffer.is_empty() && trainer.buffer.len() <= leader);
        assert_eq!(report.group_ids_sent, 2);
        assert_eq!(report.unexpected, 1, "the malformed id");
    }
}
