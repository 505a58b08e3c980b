//! The coordinator: every decision of the learner's side of a cluster, and
//! no I/O. Its inputs are a peer's message ([`Coordinator::step`]), a word
//! from the thread that owns the networks ([`Coordinator::update`]) and
//! the passing of time ([`Coordinator::tick`]); each takes the time as an
//! argument. Its outputs are collected: messages for peers
//! ([`Coordinator::take_outgoing`]) and work for the networks' thread
//! ([`Coordinator::take_for_trainer`]). The thread that owns the socket
//! delivers both (`io.rs`).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::config::ClusterConfig;
use common::Task;
use model::wire::{unroll_from_data, UnrollError};
use net::link::Incoming;
use net::protocol::{Header, Message, Role, UnrollData};

use super::credits;
use super::jobs::{GroupId, Job, Requeued};
use super::{FromTrainer, Queued, RuntimeReport, ToTrainer};
use crate::train::Pick;

/// A connected peer.
#[derive(Debug)]
pub(super) struct Peer {
    pub(super) role: Role,
    pub(super) id: u64,
    /// This hello's number: unrolls sent under it are this session's.
    pub(super) session: u64,
    /// The process start its hello came from: its messages carry it.
    pub(super) incarnation: u64,
    /// The sequence number of its latest message: the next is higher.
    pub(super) last_seq: u64,
    /// The job a benchworker is measuring.
    pub(super) job: Option<u64>,
    pub(super) last_seen: Instant,
    /// Unrolls an actor may still send.
    pub(super) credits: u64,
    /// The newest weights' version this actor was sent.
    pub(super) version_sent: u64,
    /// The multi-host group whose NCCL unique id this group member waits for.
    pub(super) awaits_group: Option<String>,
    /// When its hello came.
    pub(super) joined: Instant,
    /// A benchworker that said [`Message::Ready`]: only those get jobs.
    pub(super) ready: bool,
    /// The most devices a plan may have for this benchworker (said with
    /// its [`Message::Ready`]); `None`: any.
    pub(super) max_devices: Option<usize>,
    /// Jobs this benchworker failed since its last measurement: from
    /// `FAILING_AFTER` on, each failure sets it aside for `SIDELINED`.
    pub(super) failed_in_a_row: usize,
    /// Until when it gets no job while another benchworker is sound.
    pub(super) sidelined_until: Option<Instant>,
    /// When this benchworker's job timed out (it counts as busy until it
    /// answers, or for another `cluster.job_timeout_s`).
    pub(super) late_since: Option<Instant>,
    /// A benchworker given work again after a late job and silent since: a
    /// second late job is not waited for again (it may hang).
    pub(super) resynced: bool,
    /// When this actor's latest unroll came (or it joined).
    pub(super) last_unroll: Instant,
    /// When this actor was last granted a credit: one that waited its turn
    /// for it is not silent with credits in hand.
    pub(super) credited_at: Instant,
    /// An actor granted credits anew after a silence and silent since: not
    /// granted more (it may just be slow, or waiting for newer weights).
    pub(super) credits_renewed: bool,
}

/// A message for a peer, with the weights' version its envelope carries.
pub(super) struct Outgoing {
    pub(super) to: Vec<u8>,
    pub(super) version: u64,
    pub(super) message: Arc<Message>,
}

/// What a coordinator is built from: the run's settings and tasks.
pub(super) struct Setup {
    pub(super) cluster: ClusterConfig,
    /// The cluster token every hello must carry.
    pub(super) token: String,
    /// The configuration peers are welcomed with.
    pub(super) welcome_config: String,
    /// The tasks actors roll out (welcome and unroll checks).
    pub(super) rollout_tasks: Vec<Task>,
    /// Devices of each training task (measurement checks).
    pub(super) task_devices: Vec<usize>,
}

/// The learner's side of a cluster, without I/O.
pub(super) struct Coordinator {
    pub(super) setup: Setup,
    /// Per-message warnings, at most one of a kind every ten seconds: a
    /// flood of bad messages must not fill the disk through the log.
    pub(super) warner: net::warn::Warner,
    pub(super) peers: HashMap<Vec<u8>, Peer>,
    next_peer: u64,
    next_session: u64,
    /// Jobs out on benchworkers, by id.
    pub(super) jobs: BTreeMap<u64, Job>,
    /// Jobs to hand out again (their benchworker went away).
    pub(super) requeue: VecDeque<Requeued>,
    /// The round's plans not yet handed out, as the trainer drew them.
    pub(super) picks: VecDeque<Pick>,
    pub(super) next_job: u64,
    pub(super) job_failures: usize,
    /// Since when plans have waited for a benchworker wider than any
    /// connected one; cleared when a benchworker says how wide it is (the
    /// widest may have changed). Once `cluster.peer_timeout_s` old, such
    /// plans go to any benchworker, to fail there with the reason.
    pub(super) wide_since: Option<Instant>,
    /// Unrolls handed to the trainer and not yet learned from or dropped,
    /// in all and by session.
    queued: u64,
    queued_by: HashMap<u64, u64>,
    /// The newest weights the trainer published, and their version.
    pub(super) version: u64,
    weights: Option<Arc<Message>>,
    /// Multi-host benchworker groups by name.
    pub(super) groups: HashMap<String, GroupId>,
    pub(super) last_heartbeat: Instant,
    /// Whether the log said that actors wait for a credit because
    /// `cluster.max_policy_lag` unrolls are in flight (said once).
    said_credit_cap: bool,
    /// When training last moved: a measurement, an unroll, a step.
    pub(super) last_progress: Instant,
    outgoing: Vec<Outgoing>,
    for_trainer: Vec<ToTrainer>,
    pub(super) report: RuntimeReport,
}

impl Peer {
    /// A peer that said hello with `header` at `now`.
    pub(super) fn new(role: Role, id: u64, session: u64, header: &Header, now: Instant) -> Peer {
        Peer {
            role,
            id,
            session,
            incarnation: header.incarnation,
            last_seq: header.seq,
            job: None,
            last_seen: now,
            credits: 0,
            version_sent: 0,
            awaits_group: None,
            joined: now,
            ready: false,
            max_devices: None,
            failed_in_a_row: 0,
            sidelined_until: None,
            late_since: None,
            resynced: false,
            credits_renewed: false,
            last_unroll: now,
            credited_at: now,
        }
    }
}

impl Coordinator {
    pub(super) fn new(setup: Setup, now: Instant) -> Coordinator {
        Coordinator {
            warner: net::warn::Warner::default(),
            setup,
            peers: HashMap::new(),
            next_peer: 1,
            next_session: 1,
            jobs: BTreeMap::new(),
            requeue: VecDeque::new(),
            picks: VecDeque::new(),
            next_job: 1,
            job_failures: 0,
            wide_since: None,
            queued: 0,
            queued_by: HashMap::new(),
            version: 0,
            weights: None,
            groups: HashMap::new(),
            last_heartbeat: now,
            said_credit_cap: false,
            last_progress: now,
            outgoing: Vec::new(),
            for_trainer: Vec::new(),
            report: RuntimeReport::default(),
        }
    }

    /// Messages for peers since the last call, in order.
    pub(super) fn take_outgoing(&mut self) -> Vec<Outgoing> {
        std::mem::take(&mut self.outgoing)
    }

    /// Work for the networks' thread since the last call, in order.
    pub(super) fn take_for_trainer(&mut self) -> Vec<ToTrainer> {
        std::mem::take(&mut self.for_trainer)
    }

    /// Queues work for the networks' thread.
    pub(super) fn hand_to_trainer(&mut self, work: ToTrainer) {
        self.for_trainer.push(work);
    }

    /// A fresh number for a session.
    pub(super) fn new_session(&mut self) -> u64 {
        self.next_session += 1;
        self.next_session - 1
    }

    /// A fresh id for a peer.
    pub(super) fn new_peer_id(&mut self) -> u64 {
        self.next_peer += 1;
        self.next_peer - 1
    }

    /// Queues a message for a peer.
    pub(super) fn send(&mut self, to: &[u8], message: Message) {
        self.send_shared(to, Arc::new(message));
    }

    fn send_shared(&mut self, to: &[u8], message: Arc<Message>) {
        self.outgoing.push(Outgoing {
            to: to.to_vec(),
            version: self.version,
            message,
        });
    }

    /// A peer's message at `now`.
    pub(super) fn step(&mut self, now: Instant, incoming: Incoming) -> anyhow::Result<()> {
        let Incoming {
            from,
            header,
            message,
        } = incoming;
        if let Message::Hello { role, token } = message {
            self.hello(now, from, &header, role, &token);
            return Ok(());
        }
        let Some(role) = self.check_envelope(now, &from, &header, &message) else {
            return Ok(());
        };
        match (role, message) {
            (Role::Actor, Message::Unroll(data)) => self.on_unroll(now, from, &header, data),
            (Role::Benchworker, Message::Measurement { job, measurement }) => {
                self.on_measurement(now, from, job, measurement)?
            }
            (Role::Benchworker, Message::JobFailed { job, error }) => {
                self.release_job(job);
                if let Some(j) = self.jobs.remove(&job) {
                    tracing::warn!("job {job} failed: {error}");
                    self.job_failed(now, j, error)?;
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
            (_, Message::Shutdown) => self.forget(now, &from),
            (role, other) => {
                self.report.unexpected += 1;
                let kind = other.kind();
                let said = || format!("dropped a {kind:?} from a {role:?}: not a kind it sends");
                self.warner.warn("unexpected kind", now, said);
            }
        }
        Ok(())
    }

    /// A word from the networks' thread at `now`.
    pub(super) fn update(&mut self, now: Instant, update: FromTrainer) {
        self.last_progress = now;
        match update {
            FromTrainer::Weights(version, weights) => {
                self.version = version;
                self.weights = Some(weights);
                self.broadcast();
            }
            FromTrainer::Picks(picks) => self.picks.extend(picks),
            FromTrainer::Consumed { session } => {
                self.queued = self.queued.saturating_sub(1);
                if let Some(n) = self.queued_by.get_mut(&session) {
                    *n -= 1;
                    if *n == 0 {
                        self.queued_by.remove(&session);
                    }
                }
                self.share_credits(now);
            }
            FromTrainer::Durable { to, job } => self.send(&to, Message::Ack { job }),
            FromTrainer::Stepped => {}
            // The socket thread lingers, if asked, after this.
            FromTrainer::Finish { .. } => self.shutdown(),
        }
    }

    /// A peer gone (a send to it failed, it said `Shutdown`, it was silent
    /// too long, or it said hello again): forgotten, its job handed to
    /// another benchworker, its credits to other actors.
    pub(super) fn forget(&mut self, now: Instant, who: &[u8]) {
        if let Some(peer) = self.peers.remove(who) {
            tracing::warn!("{:?} {} is gone", peer.role, peer.id);
            if peer.role == Role::Actor && peer.credits > 0 {
                // Its credits are free for the others.
                self.share_credits(now);
            }
            // A group's unique id is only good while its rank 0 lives.
            self.groups.retain(|_, g| g.leader != who);
            if let Some(job) = peer.job.and_then(|j| self.jobs.remove(&j)) {
                self.report.requeued_jobs += 1;
                self.requeue.push_back(job.requeued());
            }
        }
    }

    /// Sends the newest weights to every actor that holds a credit and has
    /// older ones. An actor without credits gets them with its next
    /// credit: weights it cannot act with yet would only load the network.
    fn broadcast(&mut self) {
        let version = self.version;
        let actors: Vec<Vec<u8>> = self
            .peers
            .iter()
            .filter(|(_, p)| p.role == Role::Actor && p.credits > 0 && p.version_sent < version)
            .map(|(k, _)| k.clone())
            .collect();
        for a in actors {
            self.send_weights(&a);
        }
    }

    /// Sends an actor the newest weights (if the trainer published any).
    fn send_weights(&mut self, to: &[u8]) {
        let Some(weights) = self.weights.clone() else {
            return;
        };
        if let Some(p) = self.peers.get_mut(to) {
            p.version_sent = self.version;
        }
        self.report.weights_sent += 1;
        self.send_shared(to, weights);
    }

    /// Unrolls in flight: the credits actors hold (an unroll being rolled
    /// out holds one) and the unrolls with the trainer.
    pub(super) fn in_flight(&self) -> u64 {
        let held: u64 = self
            .peers
            .values()
            .filter(|p| p.role == Role::Actor)
            .map(|p| p.credits)
            .sum();
        held + self.queued
    }

    /// Hands out the credits that are free, one at a time from the state as
    /// it is: see [`credits::next`].
    pub(super) fn share_credits(&mut self, now: Instant) {
        let limits = credits::Limits::of(&self.setup.cluster);
        loop {
            let (keys, actors) = self.actor_credits();
            let Some(i) = credits::next(&limits, now, self.in_flight(), &actors) else {
                break;
            };
            self.grant(now, &keys[i], 1);
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

    /// Every actor's key and what [`credits::next`] reads of it: its
    /// unrolls in flight are the credits it holds and the unrolls of its
    /// present session with the trainer (an older session's are not its
    /// own: it started with none).
    fn actor_credits(&self) -> (Vec<Vec<u8>>, Vec<credits::Actor>) {
        self.peers
            .iter()
            .filter(|(_, p)| p.role == Role::Actor)
            .map(|(k, p)| {
                let queued = self.queued_by.get(&p.session).copied().unwrap_or(0);
                let actor = credits::Actor {
                    id: p.id,
                    in_flight: p.credits + queued,
                    last_seen: p.last_seen,
                    last_unroll: p.last_unroll,
                };
                (k.clone(), actor)
            })
            .unzip()
    }

    /// Gives an actor `n` credits, with the newest weights first if it
    /// lacks them.
    fn grant(&mut self, now: Instant, to: &[u8], n: u64) {
        let version = self.version;
        let Some(p) = self.peers.get_mut(to) else {
            return; // gone
        };
        p.credits += n;
        p.credited_at = now;
        if p.version_sent < version {
            self.send_weights(to);
        }
        self.send(to, Message::Credit { n: n as u32 });
    }

    /// An actor's unroll: handed to the trainer if it spent a credit and
    /// checks out, else dropped and counted.
    fn on_unroll(&mut self, now: Instant, from: Vec<u8>, header: &Header, data: UnrollData) {
        self.report.unrolls_received += 1;
        self.last_progress = now;
        // The session whose credit it spends, if it had one.
        let session = self.peers.get_mut(&from).and_then(|p| {
            p.last_unroll = now;
            p.credits_renewed = false;
            p.credits = p.credits.checked_sub(1)?;
            Some(p.session)
        });
        let Some(session) = session else {
            self.report.uncredited_unrolls += 1;
            let said = || "an unroll sent without a credit dropped".to_string();
            self.warner.warn("uncredited unroll", now, said);
            return;
        };
        let task = data.task as usize;
        let checked = match self.setup.rollout_tasks.get(task) {
            Some(t) => unroll_from_data(&data, t.tables.len(), t.devices),
            None => Err(UnrollError::Task(task)),
        };
        match checked {
            Ok(unroll) => {
                self.queued += 1;
                *self.queued_by.entry(session).or_default() += 1;
                self.hand_to_trainer(ToTrainer::Unroll(Queued {
                    session,
                    acted: header.policy_version,
                    task,
                    unroll,
                }));
            }
            Err(e) => {
                self.report.bad_unrolls += 1;
                let said = || format!("malformed unroll dropped: {e}");
                self.warner.warn("malformed unroll", now, said);
                self.share_credits(now);
            }
        }
    }

    /// Heartbeats to every peer; peers silent too long are forgotten, jobs
    /// out too long handed to another benchworker; then idle benchworkers
    /// get plans.
    pub(super) fn tick(&mut self, now: Instant) {
        let c = &self.setup.cluster;
        if now.saturating_duration_since(self.last_heartbeat) >= secs(c.heartbeat_s) {
            self.last_heartbeat = now;
            self.keep_alive(now);
        }
        self.dispatch(now);
    }

    /// [`Coordinator::tick`]'s checks, once a heartbeat period.
    fn keep_alive(&mut self, now: Instant) {
        let c = &self.setup.cluster;
        let (timeout, job_timeout) = (secs(c.peer_timeout_s), secs(c.job_timeout_s));
        let since = |t: Instant| now.saturating_duration_since(t);
        let silent: Vec<Vec<u8>> = self
            .peers
            .iter()
            .filter(|(_, p)| since(p.last_seen) > timeout)
            .map(|(k, _)| k.clone())
            .collect();
        for k in silent {
            self.report.lost_peers += 1;
            self.forget(now, &k);
        }
        let late: Vec<u64> = self
            .jobs
            .iter()
            .filter(|(_, j)| since(j.sent) > job_timeout)
            .map(|(&id, _)| id)
            .collect();
        for id in late {
            if let Some(j) = self.jobs.remove(&id) {
                tracing::warn!("job {id} timed out; another benchworker gets it");
                self.report.requeued_jobs += 1;
                self.requeue.push_back(j.requeued());
                // Its benchworker stays busy until it answers (a late
                // answer is not counted, see `on_measurement`): new work
                // would only wait behind the late job.
                if let Some(p) = self.peers.values_mut().find(|p| p.job == Some(id)) {
                    p.late_since = Some(now);
                }
            }
        }
        if self.resync(now, job_timeout, 3 * timeout) {
            self.share_credits(now);
        }
        let all: Vec<Vec<u8>> = self.peers.keys().cloned().collect();
        for p in all {
            self.send(&p, Message::Heartbeat);
        }
    }

    /// Peers waited for in vain are waited for no more. A benchworker that
    /// still heartbeats `job_timeout` after its job was late lost the job
    /// or its answer on the way (a connection made again drops what was
    /// queued on the old one): it gets jobs again. An actor silent with
    /// credits in hand for `actor_silence` (since its last unroll and its
    /// last credit) may have lost an unroll or a credit: its credits are
    /// shared anew, once per silence. Returns whether credits were freed.
    fn resync(&mut self, now: Instant, job_timeout: Duration, actor_silence: Duration) -> bool {
        let since = |t: Instant| now.saturating_duration_since(t);
        let mut freed = false;
        for p in self.peers.values_mut() {
            if p.late_since.is_some_and(|t| since(t) > job_timeout) {
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
            // It has none in flight then, so it comes first; the count never
            // exceeds what was granted: an unroll beyond it is dropped and
            // counted.
            if p.role == Role::Actor
                && p.credits > 0
                && !p.credits_renewed
                && since(p.last_unroll.max(p.credited_at)) > actor_silence
            {
                tracing::info!(
                    "actor {} sent no unroll for {} s with credits in hand: credits shared anew",
                    p.id,
                    actor_silence.as_secs()
                );
                p.credits = 0;
                p.credits_renewed = true;
                self.report.resyncs += 1;
                freed = true;
            }
        }
        freed
    }

    /// Why training should stop at `now`, if it should: no progress for
    /// `cluster.stall_timeout_s` and no measurement job out within
    /// `cluster.job_timeout_s` (peers that will not come are not waited
    /// for). `refused`: connections refused at their handshake so far.
    /// The peers as the status page shows them, by id.
    pub(super) fn peer_views(&self, now: Instant) -> Vec<crate::status::PeerView> {
        let mut views: Vec<crate::status::PeerView> = self
            .peers
            .values()
            .map(|p| {
                let actor = p.role == Role::Actor;
                let state = match (actor, p.job, p.ready) {
                    (true, _, _) if p.credits > 0 => "acting".to_string(),
                    (true, _, _) => "waiting for a credit".to_string(),
                    (false, Some(job), _) => format!("measuring job {job}"),
                    (false, None, false) => "setting up".to_string(),
                    (false, None, true) if p.sidelined_until.is_some_and(|t| t > now) => {
                        "set aside after failures".to_string()
                    }
                    (false, None, true) => "idle".to_string(),
                };
                crate::status::PeerView {
                    role: if actor { "actor" } else { "benchworker" }.into(),
                    id: p.id,
                    state,
                    seen_s_ago: now.saturating_duration_since(p.last_seen).as_secs_f64(),
                    lag: actor.then(|| self.version.saturating_sub(p.version_sent)),
                }
            })
            .collect();
        views.sort_by_key(|v| v.id);
        views
    }

    pub(super) fn stalled(&self, now: Instant, refused: u64) -> Option<String> {
        let stall = self.setup.cluster.stall_timeout_s;
        if now.saturating_duration_since(self.last_progress) <= secs(stall) || self.measuring(now) {
            return None;
        }
        let count = |r: Role| self.peers.values().filter(|p| p.role == r).count();
        let ready = self
            .peers
            .values()
            .filter(|p| p.role == Role::Benchworker && p.ready)
            .count();
        let refused = match refused {
            0 => String::new(),
            n => format!(
                "; {n} connections refused at their handshake (no cluster token, or another)"
            ),
        };
        Some(format!(
            "no progress for {stall} s (cluster.stall_timeout_s): {} actors and {} \
             benchworkers connected ({ready} ready), {} jobs out{refused}",
            count(Role::Actor),
            count(Role::Benchworker),
            self.jobs.len()
        ))
    }

    /// Whether a benchworker is measuring a job that is not late yet, or
    /// setting up its backend since its hello for no longer than a job may
    /// take (a slow oracle, or a multi-host group forming, is not a stall).
    pub(super) fn measuring(&self, now: Instant) -> bool {
        let timeout = secs(self.setup.cluster.job_timeout_s);
        let since = |t: Instant| now.saturating_duration_since(t);
        self.jobs.values().any(|j| since(j.sent) <= timeout)
            // A late job may still come back: waited for once more.
            || self
                .peers
                .values()
                .any(|p| p.late_since.is_some() && !p.resynced)
            || self
                .peers
                .values()
                .any(|p| p.role == Role::Benchworker && !p.ready && since(p.joined) <= timeout)
    }

    /// Tells every peer to stop.
    pub(super) fn shutdown(&mut self) {
        let all: Vec<Vec<u8>> = self.peers.keys().cloned().collect();
        for p in all {
            self.send(&p, Message::Shutdown);
        }
    }
}

/// `s` seconds (a validated configuration value).
pub(super) fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}
