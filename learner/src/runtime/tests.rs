//! The coordinator driven by hand: no sockets, no sleeps, time passed in.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::config::Config;
use common::{Plan, Task};
use model::loss::PickId;
use net::link::Incoming;
use net::protocol::{Header, Message, Role, UnrollData};

use super::core::{Coordinator, Peer, Setup};
use super::jobs::{Requeued, FAILING_AFTER, MAX_JOB_FAILURES, SIDELINED};
use super::*;

/// A coordinator, a clock and a mailbox per peer.
struct Bench {
    core: Coordinator,
    now: Instant,
    mail: HashMap<Vec<u8>, Vec<Message>>,
    /// Work handed to the networks' thread, in order.
    work: Vec<ToTrainer>,
    /// Each peer's id (0 before its welcome) and its last sequence number.
    peers: HashMap<Vec<u8>, (u64, u64)>,
}

impl Bench {
    fn new(cfg: &Config, tasks: &[Task]) -> Bench {
        let now = Instant::now();
        let setup = Setup {
            cluster: cfg.cluster.clone(),
            token: "right".into(),
            welcome_config: String::new(),
            rollout_tasks: tasks.to_vec(),
            task_devices: tasks.iter().map(|t| t.devices).collect(),
        };
        Bench {
            core: Coordinator::new(setup, now),
            now,
            mail: HashMap::new(),
            work: Vec::new(),
            peers: HashMap::new(),
        }
    }

    fn pass(&mut self, s: f64) {
        self.now += Duration::from_secs_f64(s);
    }

    /// Moves what the coordinator decided into the mailboxes.
    fn deliver(&mut self) {
        for o in self.core.take_outgoing() {
            self.mail
                .entry(o.to)
                .or_default()
                .push((*o.message).clone());
        }
        self.work.extend(self.core.take_for_trainer());
    }

    /// `who` sends `m` in an envelope with these fields.
    fn send_as(&mut self, who: &str, sender: u64, incarnation: u64, seq: u64, m: Message) {
        self.step(who, sender, incarnation, seq, m).unwrap();
    }

    /// The coordinator takes `m` from `who` in an envelope with these fields.
    fn step(
        &mut self,
        who: &str,
        sender: u64,
        incarnation: u64,
        seq: u64,
        m: Message,
    ) -> anyhow::Result<()> {
        let header = Header {
            sender,
            incarnation,
            seq,
            policy_version: self.core.version,
        };
        let incoming = Incoming {
            from: who.as_bytes().to_vec(),
            header,
            message: m,
        };
        let stepped = self.core.step(self.now, incoming);
        self.deliver();
        stepped
    }

    /// `who` sends `m` in its session's envelope.
    fn say(&mut self, who: &str, m: Message) {
        self.try_say(who, m).unwrap();
    }

    fn try_say(&mut self, who: &str, m: Message) -> anyhow::Result<()> {
        let (id, seq) = self.peers.entry(who.as_bytes().to_vec()).or_default();
        *seq += 1;
        let (id, seq) = (*id, *seq);
        self.step(who, id, 7, seq, m)
    }

    /// `who` says hello as `role`; returns the id it was welcomed with.
    fn hello(&mut self, who: &str, role: Role) -> u64 {
        let hello = Message::Hello {
            role,
            token: "right".into(),
        };
        self.say(who, hello);
        // The welcome is taken; what came with it stays to be read.
        let mail = self.mail.entry(who.as_bytes().to_vec()).or_default();
        let at = mail
            .iter()
            .position(|m| matches!(m, Message::Welcome { .. }));
        let Message::Welcome { peer: id, .. } = mail.remove(at.expect("a welcome")) else {
            unreachable!()
        };
        self.peers.get_mut(who.as_bytes()).unwrap().0 = id;
        id
    }

    /// A benchworker that said hello and that it is ready for plans of up
    /// to `max` devices.
    fn benchworker(&mut self, who: &str, max: Option<u32>) -> u64 {
        let id = self.hello(who, Role::Benchworker);
        self.say(who, Message::Ready { max_devices: max });
        id
    }

    /// What `who` was sent since the last read.
    fn read(&mut self, who: &str) -> Vec<Message> {
        self.deliver();
        self.mail.remove(who.as_bytes()).unwrap_or_default()
    }

    /// The jobs `who` was sent since the last read, as `(job, task)`.
    fn jobs(&mut self, who: &str) -> Vec<(u64, usize)> {
        let jobs = self.read(who).into_iter().filter_map(|m| match m {
            Message::MeasureJob { job, task, .. } => Some((job, task as usize)),
            _ => None,
        });
        jobs.collect()
    }

    /// The credits `who` was sent since the last read.
    fn credits(&mut self, who: &str) -> u32 {
        let credits = self.read(who).into_iter().filter_map(|m| match m {
            Message::Credit { n } => Some(n),
            _ => None,
        });
        credits.sum()
    }

    fn peer(&mut self, who: &str) -> &mut Peer {
        self.core.peers.get_mut(who.as_bytes()).expect("a peer")
    }

    fn dispatch(&mut self) -> bool {
        let sent = self.core.dispatch(self.now);
        self.deliver();
        sent
    }

    fn tick(&mut self) {
        self.core.tick(self.now);
        self.deliver();
    }

    fn update(&mut self, word: FromTrainer) {
        self.core.update(self.now, word);
        self.deliver();
    }

    /// Frees every benchworker and forgets every job out.
    fn reset_jobs(&mut self) {
        self.core.jobs.clear();
        self.core.requeue.clear();
        for p in self.core.peers.values_mut() {
            p.job = None;
        }
    }
}

/// The small configuration and its tasks, in a folder that lives as long
/// as the returned guard.
fn small() -> (tempfile::TempDir, Config, Vec<Task>) {
    let dir = tempfile::tempdir().unwrap();
    let (cfg, suite) = crate::train::tests::small_data(dir.path());
    (dir, cfg, suite.tasks)
}

/// The round's `place`-th plan for task `task`: every table on device 0.
fn pick(tasks: &[Task], task: usize, place: usize) -> Pick {
    let t = &tasks[task];
    Pick {
        task,
        plan: Plan {
            devices: t.devices,
            assignment: vec![0; t.tables.len()],
        },
        predicted_ms: 1.0,
        id: PickId { round: 0, place },
    }
}

/// A valid unroll of one episode of task 0 (every table on device 0).
fn unroll(task: &Task) -> UnrollData {
    let (m, d) = (task.tables.len(), task.devices);
    UnrollData {
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
    }
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

/// Tasks of 4 devices and of 2, alternately, and a coordinator with a
/// benchworker `narrow` (2 devices) and one `wide` (4), both ready.
fn two_widths() -> (tempfile::TempDir, Config, Vec<Task>, Bench) {
    let (dir, cfg, mut tasks) = small();
    for t in tasks.iter_mut().skip(1).step_by(2) {
        t.devices = 2;
    }
    let mut b = Bench::new(&cfg, &tasks);
    b.hello("narrow", Role::Benchworker);
    b.hello("wide", Role::Benchworker);
    // Benchworkers setting up are no stall, unless it takes them longer
    // than a job may.
    assert!(b.core.measuring(b.now));
    let later = b.now + Duration::from_secs_f64(cfg.cluster.job_timeout_s + 1.0);
    assert!(!b.core.measuring(later));
    b.say("narrow", ready(2));
    b.say("wide", ready(4));
    assert!(!b.core.measuring(b.now), "both ready, no job out");
    (dir, cfg, tasks, b)
}

fn ready(max: u32) -> Message {
    Message::Ready {
        max_devices: Some(max),
    }
}

/// A plan of `tasks[0]` (4 devices) to measure again.
fn requeue_wide(b: &mut Bench, tasks: &[Task]) {
    b.core.requeue.push_back(Requeued {
        pick: pick(tasks, 0, 0),
        tried: Vec::new(),
    });
}

/// Plans go to benchworkers that can measure their width: a narrow one
/// gets the round's first plan it can take, and a wide plan waits for a
/// wide benchworker.
#[test]
fn plans_go_to_benchworkers_wide_enough_for_them() {
    let (_dir, _cfg, tasks, mut b) = two_widths();
    let widths = |jobs: Vec<(u64, usize)>| -> Vec<usize> {
        jobs.iter().map(|j| tasks[j.1].devices).collect()
    };
    // The wide one busy: the narrow one gets the round's first plan of a
    // 2-device task, though a 4-device one comes first.
    b.update(FromTrainer::Picks(
        (0..4).map(|j| pick(&tasks, j, j)).collect(),
    ));
    b.peer("wide").job = Some(u64::MAX);
    assert!(b.dispatch());
    let tasks_of = |jobs: Vec<(u64, usize)>| -> Vec<usize> { jobs.iter().map(|j| j.1).collect() };
    assert_eq!(tasks_of(b.jobs("narrow")), [1]);
    assert_eq!(b.core.picks.len(), 3);
    // Idle too, the wide one takes the 4-device plans in order, the
    // narrow one (free again) the 2-device one.
    b.reset_jobs();
    assert!(b.dispatch());
    assert_eq!(tasks_of(b.jobs("wide")), [0]);
    assert_eq!(tasks_of(b.jobs("narrow")), [3]);

    // A 4-device plan to measure again waits for the wide one ...
    b.reset_jobs();
    b.core.picks.clear();
    b.peer("wide").job = Some(u64::MAX);
    requeue_wide(&mut b, &tasks);
    b.update(FromTrainer::Picks(vec![pick(&tasks, 1, 1)]));
    assert!(!b.dispatch(), "nothing before the wide one is idle");
    assert!(b.jobs("narrow").is_empty(), "a requeued plan comes first");
    // ... and goes to it once it is idle; the narrow one gets the
    // 2-device plan.
    b.peer("wide").job = None;
    assert!(b.dispatch());
    assert!(b.core.requeue.is_empty());
    assert_eq!(widths(b.jobs("wide")), [4]);
    assert_eq!(widths(b.jobs("narrow")), [2]);
}

/// A plan that no benchworker is wide enough for waits
/// `cluster.peer_timeout_s` for one to join, then goes to any (to fail
/// there with the reason); the wait starts wherever the plan is in the
/// round, and not while a benchworker sets up.
#[test]
fn a_plan_too_wide_for_all_waits_then_goes_to_any() {
    let (_dir, cfg, tasks, mut b) = two_widths();
    b.say("wide", ready(2));
    requeue_wide(&mut b, &tasks);
    assert!(!b.dispatch());
    assert_eq!(b.core.wide_since, Some(b.now), "waiting for a wide one");
    b.pass(cfg.cluster.peer_timeout_s - 0.5);
    assert!(!b.dispatch(), "not yet");
    b.pass(1.0);
    assert!(b.dispatch());
    assert!(b.core.requeue.is_empty());
    let sent = [b.jobs("narrow"), b.jobs("wide")].concat();
    assert_eq!(
        sent.iter().map(|j| tasks[j.1].devices).collect::<Vec<_>>(),
        [4]
    );
    // The wait is over for the next one too (it failed, say) ...
    b.reset_jobs();
    requeue_wide(&mut b, &tasks);
    assert!(b.dispatch());
    // ... until a benchworker says a new width: the widest may be wider.
    b.say("wide", ready(3));
    assert!(b.core.wide_since.is_none());

    // Behind a plan that waits for a busy benchworker, a plan too wide
    // for all starts its wait at once.
    b.reset_jobs();
    b.say("wide", ready(4));
    b.say("narrow", ready(2));
    b.peer("wide").job = Some(u64::MAX);
    let mut too_wide = pick(&tasks, 0, 1);
    too_wide.plan.devices = 8;
    b.update(FromTrainer::Picks(vec![pick(&tasks, 0, 0), too_wide]));
    assert!(!b.dispatch());
    assert_eq!(b.core.wide_since, Some(b.now));

    // While a benchworker sets up, it may be the wide one: the wait does
    // not begin.
    b.reset_jobs();
    b.core.picks.clear();
    b.say("wide", ready(2));
    b.hello("late", Role::Benchworker);
    requeue_wide(&mut b, &tasks);
    assert!(!b.dispatch());
    assert!(b.core.wide_since.is_none());
}

/// A plan to measure again goes to a benchworker that has not failed it;
/// one that fails job after job sits out while a sound one is connected,
/// and too many failures in a row stop training.
#[test]
fn requeued_plans_avoid_who_failed_them_and_failing_benchworkers_sit_out() {
    let (_dir, cfg, tasks) = small();
    let mut b = Bench::new(&cfg, &tasks);
    // Only benchworkers that said they are ready get jobs.
    let id_a = b.hello("a", Role::Benchworker);
    let id_b = b.hello("b", Role::Benchworker);
    b.core.requeue.push_back(Requeued {
        pick: pick(&tasks, 0, 0),
        tried: Vec::new(),
    });
    assert!(!b.dispatch());
    b.say("a", Message::Ready { max_devices: None });
    b.say("b", Message::Ready { max_devices: None });
    b.reset_jobs();
    for (tried, want) in [
        (vec![id_a], Some(id_b)),
        (vec![id_b], Some(id_a)),
        (vec![id_a, id_b], None),
    ] {
        b.core.requeue.push_back(Requeued {
            pick: pick(&tasks, 0, 0),
            tried: tried.clone(),
        });
        b.update(FromTrainer::Picks(vec![pick(&tasks, 1, 1)]));
        assert!(b.dispatch());
        assert_eq!(b.jobs("a").len() + b.jobs("b").len(), 2, "both get work");
        // The requeued job went first, to the one that had not failed it.
        let first = b.core.jobs.values().next().unwrap();
        if let Some(want) = want {
            assert_eq!(first.worker, want);
        }
        assert_eq!(first.tried, tried);
        b.reset_jobs();
    }

    // `a` fails job after job (a GPU out of memory, fast): after
    // FAILING_AFTER in a row it sits out while `b` is sound.
    b.update(FromTrainer::Picks(
        (0..8).map(|j| pick(&tasks, 0, j)).collect(),
    ));
    for _ in 0..FAILING_AFTER {
        b.peer("b").job = Some(u64::MAX);
        assert!(b.dispatch(), "`a` is idle and not yet failing");
        let (job, _) = b.jobs("a")[0];
        let error = "out of memory".to_string();
        b.say("a", Message::JobFailed { job, error });
    }
    assert_eq!(b.core.job_failures, FAILING_AFTER);
    assert!(
        !b.dispatch(),
        "`a` idle but failing, `b` busy: nothing to `a`"
    );
    assert!(b.jobs("a").is_empty());
    b.peer("b").job = None;
    assert!(b.dispatch());
    assert_eq!(b.jobs("b").len(), 1);
    // With no sound benchworker left, the failing one gets jobs again.
    b.reset_jobs();
    let peer_b = b.core.peers.remove(b"b".as_slice()).unwrap();
    assert!(b.dispatch());
    assert_eq!(b.jobs("a").len(), 1);
    b.core.peers.insert(b"b".to_vec(), peer_b);
    // Its time out over, it is tried again beside a sound one.
    b.reset_jobs();
    b.pass(SIDELINED.as_secs_f64());
    assert!(b.dispatch());
    assert_eq!((b.jobs("a").len(), b.jobs("b").len()), (1, 1));

    // A malformed measurement is a failure too; failures enough in a row
    // stop training, naming the last.
    b.core.job_failures = MAX_JOB_FAILURES - 2;
    let job_of = |b: &Bench, id: u64| {
        let mut out = b.core.jobs.iter().filter(|(_, j)| j.worker == id);
        *out.next().expect("a job").0
    };
    let job = job_of(&b, id_a);
    let bad = common::Measurement {
        cost_ms: 1.0,
        devices: Vec::new(),
    };
    b.say(
        "a",
        Message::Measurement {
            job,
            measurement: bad,
        },
    );
    assert_eq!(b.core.job_failures, MAX_JOB_FAILURES - 1);
    assert!(b.work.is_empty(), "nothing for the trainer");
    let job = job_of(&b, id_b);
    let error = "cuda error".to_string();
    let e = b
        .try_say("b", Message::JobFailed { job, error })
        .unwrap_err();
    let e = e.to_string();
    assert!(
        e.contains("failed in a row") && e.contains("cuda error"),
        "{e}"
    );
}

/// Actors share at most `max_policy_lag` unrolls in flight, none holds
/// more than `actor_credits`, and a freed credit goes to the actor with
/// the fewest in flight: actors beyond the limit take turns. An unroll
/// sent without a credit is dropped before it is read.
#[test]
fn credits_are_shared_within_the_policy_lag() {
    let (_dir, mut cfg, tasks) = small();
    cfg.cluster.max_policy_lag = 3;
    cfg.cluster.actor_credits = 2;
    let mut b = Bench::new(&cfg, &tasks);
    b.update(FromTrainer::Weights(1, Arc::new(Message::Heartbeat)));
    for who in ["a0", "a1", "a2"] {
        b.hello(who, Role::Actor);
    }
    let held = |b: &mut Bench| ["a0", "a1", "a2"].map(|w| b.peer(w).credits);
    // The first two fill the three credits; the third waits.
    assert_eq!(held(&mut b), [2, 1, 0], "in order of hello");
    assert_eq!(b.core.in_flight(), 3);
    assert_eq!(
        b.core.report.weights_sent, 2,
        "weights with the first credit"
    );
    // With the trainer, an unroll is still in flight: nobody gets its credit.
    let good = unroll(&tasks[0]);
    b.say("a0", Message::Unroll(good.clone()));
    let [ToTrainer::Unroll(q)] = &b.work[..] else {
        panic!("one unroll for the trainer");
    };
    let (session, acted) = (q.session, q.acted);
    assert_eq!(acted, 1, "acted with the weights it was sent");
    b.work.clear();
    assert_eq!(held(&mut b), [1, 1, 0]);
    assert_eq!(b.core.in_flight(), 3);
    for who in ["a0", "a1", "a2"] {
        b.read(who);
    }
    // Learned from: its credit goes to the actor with none.
    b.update(FromTrainer::Consumed { session });
    assert_eq!(held(&mut b), [1, 1, 1]);
    assert_eq!((b.credits("a2"), b.credits("a0")), (1, 0));
    // A malformed unroll frees its credit too, and its actor, now with
    // none in flight, has it back.
    let bad = UnrollData {
        actions: vec![tasks[0].devices as u32; tasks[0].tables.len()],
        ..good.clone()
    };
    b.say("a1", Message::Unroll(bad));
    assert_eq!(b.core.report.bad_unrolls, 1);
    assert!(b.work.is_empty());
    assert_eq!(held(&mut b), [1, 1, 1]);
    assert_eq!(b.credits("a1"), 1);
    // An actor that leaves frees what it held. The first actor's unroll
    // with the trainer is its own in flight: with one each, the credit
    // goes to the actor whose last unroll came longest ago (the
    // second's, though the first has the lower id).
    b.pass(5.0);
    b.say("a1", Message::Heartbeat);
    b.say("a0", Message::Unroll(good.clone()));
    b.core.forget(b.now, b"a2");
    assert_eq!([b.peer("a0").credits, b.peer("a1").credits], [0, 2]);
    assert_eq!(b.core.in_flight(), 3);
    b.read("a0");
    b.read("a1");
    // An unroll beyond the credits is dropped before it is read, and
    // frees nothing.
    b.say("a0", Message::Unroll(good));
    assert_eq!(b.core.report.uncredited_unrolls, 1);
    assert_eq!(b.core.report.bad_unrolls, 1, "not read");
    assert_eq!(b.work.len(), 1, "only the credited one");
    assert_eq!(b.credits("a0") + b.credits("a1"), 0);
}

/// A job whose answer never comes (lost on the way) is requeued after
/// `job_timeout_s`, its benchworker busy another `job_timeout_s`, then
/// given work again; an actor silent with credits in hand gets them anew,
/// once per silence.
#[test]
fn lost_answers_and_lost_credits_are_not_waited_for() {
    let (_dir, mut cfg, tasks) = small();
    cfg.cluster.job_timeout_s = 1.0;
    cfg.cluster.peer_timeout_s = 10.0;
    cfg.cluster.heartbeat_s = 0.5;
    let mut b = Bench::new(&cfg, &tasks);
    b.benchworker("a", None);
    b.update(FromTrainer::Picks(
        (0..3).map(|j| pick(&tasks, 0, j)).collect(),
    ));
    b.tick();
    let [(late, _)] = b.jobs("a")[..] else {
        panic!("one job");
    };
    // Peers that heartbeat stay; a heartbeat goes to each in turn.
    let beat = |b: &mut Bench, s: f64| {
        b.pass(s);
        b.say("a", Message::Heartbeat);
        b.tick();
    };
    beat(&mut b, 1.5);
    assert!(!b.core.jobs.contains_key(&late), "requeued");
    assert_eq!(b.core.requeue.len(), 1);
    assert_eq!(b.peer("a").job, Some(late), "busy until it answers ...");
    assert!(b.jobs("a").is_empty());
    assert!(b.core.measuring(b.now), "a late job may still come back");
    beat(&mut b, 0.6);
    assert_eq!(b.core.report.resyncs, 0);
    beat(&mut b, 0.6);
    assert_eq!(b.core.report.resyncs, 1, "... or for another job_timeout_s");
    let jobs = b.jobs("a");
    assert_eq!(jobs.len(), 1);
    let id_a = b.peer("a").id;
    assert_eq!(b.core.jobs[&jobs[0].0].tried, [id_a], "the requeued plan");
    // A late answer to the old job is not counted.
    let mut sim = benchworker::sim::SimOracle::new(cfg.sim.clone(), cfg.memory);
    let p = pick(&tasks, 0, 0);
    let measurement = benchworker::Oracle::measure(&mut sim, &tasks[0].tables, &p.plan).unwrap();
    b.say(
        "a",
        Message::Measurement {
            job: late,
            measurement,
        },
    );
    assert_eq!(b.core.report.unexpected, 1);
    assert!(b.work.is_empty());

    // An actor silent with credits in hand (an unroll or a credit lost)
    // gets a fresh allotment; one without credits is waited for.
    b.reset_jobs();
    b.core.picks.clear();
    b.hello("actor", Role::Actor);
    let share = cfg.cluster.actor_credits as u32;
    assert_eq!(b.credits("actor"), share);
    let silence = 3.0 * cfg.cluster.peer_timeout_s;
    let quiet = |b: &mut Bench, s: f64| {
        // It heartbeats, and sends no unroll.
        for _ in 0..(s / 5.0).ceil() as usize {
            b.pass(5.0);
            b.say("actor", Message::Heartbeat);
            b.say("a", Message::Heartbeat);
            b.tick();
        }
    };
    quiet(&mut b, silence - 5.0);
    assert_eq!(b.credits("actor"), 0, "not yet");
    quiet(&mut b, 10.0);
    assert_eq!(b.credits("actor"), share);
    assert_eq!(b.core.report.resyncs, 2);
    // Not again while it stays silent (slow, or waiting for newer
    // weights): its credits would only pile up.
    quiet(&mut b, 2.0 * silence);
    assert_eq!(b.credits("actor"), 0);
    assert_eq!(b.core.report.resyncs, 2);
    // One that waited long for its credit and got it lately is not silent
    // with it in hand.
    b.peer("actor").credits_renewed = false;
    b.peer("actor").credited_at = b.now;
    quiet(&mut b, silence - 5.0);
    assert_eq!(b.credits("actor"), 0);
    // Peers silent past peer_timeout_s are forgotten, a job out requeued.
    b.update(FromTrainer::Picks(vec![pick(&tasks, 0, 5)]));
    b.tick();
    assert_eq!(b.jobs("a").len(), 1);
    b.pass(cfg.cluster.peer_timeout_s + 1.0);
    b.tick();
    assert!(b.core.peers.is_empty());
    assert_eq!(b.core.report.lost_peers, 2);
    assert!(b.core.jobs.is_empty());
    assert_eq!(b.core.requeue[0].pick.id.place, 5);
}

/// A measurement goes to the networks' thread; it is acknowledged only
/// once that thread made it durable. A duplicate is not counted.
#[test]
fn measurements_are_acknowledged_once_durable() {
    let (_dir, cfg, tasks) = small();
    let mut b = Bench::new(&cfg, &tasks);
    b.benchworker("w", None);
    b.update(FromTrainer::Picks(vec![
        pick(&tasks, 0, 0),
        pick(&tasks, 0, 1),
    ]));
    b.tick();
    let [(job, _)] = b.jobs("w")[..] else {
        panic!("one job");
    };
    let mut sim = benchworker::sim::SimOracle::new(cfg.sim.clone(), cfg.memory);
    let p = pick(&tasks, 0, 0);
    let measurement = benchworker::Oracle::measure(&mut sim, &tasks[0].tables, &p.plan).unwrap();
    let m = Message::Measurement {
        job,
        measurement: measurement.clone(),
    };
    b.say("w", m.clone());
    let [ToTrainer::Measured { job: j, pick, .. }] = &b.work[..] else {
        panic!("one measurement for the trainer");
    };
    assert_eq!((*j, pick.id), (job, p.id));
    // Free again: the next plan goes out, and no Ack yet.
    let got = b.read("w");
    assert!(
        !got.iter().any(|m| matches!(m, Message::Ack { .. })),
        "{got:?}"
    );
    b.tick();
    assert_eq!(b.jobs("w").len(), 1);
    b.update(FromTrainer::Durable {
        to: b"w".to_vec(),
        job,
    });
    assert_eq!(b.read("w"), [Message::Ack { job }]);
    // The same answer again: dropped and counted.
    b.say("w", m);
    assert_eq!(b.work.len(), 1);
    assert_eq!(b.core.report.unexpected, 1);
}

/// Strangers (a wrong token), messages from peers that never said hello
/// and messages whose envelope does not match their peer's are refused or
/// dropped, and counted; a hello said again keeps its id.
#[test]
fn strangers_and_bad_envelopes_are_refused_and_counted() {
    let (_dir, cfg, tasks) = small();
    let mut b = Bench::new(&cfg, &tasks);
    let hello = |token: &str| Message::Hello {
        role: Role::Actor,
        token: token.into(),
    };
    b.say("stranger", hello("wrong"));
    assert!(matches!(
        &b.read("stranger")[..],
        [Message::Refused { retry: false, .. }]
    ));
    assert_eq!(b.core.report.refused_peers, 1);
    assert!(b.core.peers.is_empty());
    b.say("nobody", Message::Heartbeat);
    assert!(matches!(
        &b.read("nobody")[..],
        [Message::Refused { retry: true, .. }]
    ));
    assert_eq!(b.core.report.unexpected, 1);
    // A hello said twice by one process keeps its id.
    let id = b.hello("misfit", Role::Actor);
    b.send_as("misfit", 0, 7, 2, hello("right"));
    let again = b.read("misfit").iter().find_map(|m| match m {
        Message::Welcome { peer, .. } => Some(*peer),
        _ => None,
    });
    assert_eq!(again, Some(id));
    // Each a Shutdown that, acted on, would forget the peer: replayed,
    // from another incarnation, from another sender.
    b.send_as("misfit", id, 7, 2, Message::Shutdown);
    b.send_as("misfit", id, 9, 3, Message::Shutdown);
    b.send_as("misfit", id + 100, 7, 4, Message::Shutdown);
    assert_eq!(b.core.report.bad_envelopes, 3);
    assert!(b.core.peers.contains_key(b"misfit".as_slice()));
    b.send_as("misfit", id, 7, 5, Message::Heartbeat);
    assert_eq!(b.core.report.bad_envelopes, 3);
    // A message of a kind the learner does not take.
    b.send_as("misfit", id, 7, 6, Message::Ready { max_devices: None });
    assert_eq!(b.core.report.unexpected, 2);
    b.send_as("misfit", id, 7, 7, Message::Shutdown);
    assert!(b.core.peers.is_empty(), "a right one is acted on");
}

/// A peer flooding bad messages is counted in full but logged at most
/// once a kind every ten seconds: it cannot fill the disk through the log
/// (it once wrote 590 MB in 60 s).
#[test]
fn a_flood_of_bad_messages_is_counted_but_rate_limited_in_the_log() {
    use std::sync::{Arc, Mutex};
    #[derive(Clone, Default)]
    struct Log(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Log {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let log = Log::default();
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let (_dir, cfg, tasks) = small();
    let mut b = Bench::new(&cfg, &tasks);
    let id = b.hello("flood", Role::Actor);
    let flood = |b: &mut Bench, from: u64| {
        for k in 0..3000 {
            // A replayed envelope; a kind the learner does not take; no hello.
            b.send_as("flood", id, 7, 1, Message::Heartbeat);
            b.send_as(
                "flood",
                id,
                7,
                from + k,
                Message::Ready { max_devices: None },
            );
            b.send_as("nobody", 0, 1, k, Message::Heartbeat);
        }
    };
    tracing::subscriber::with_default(subscriber, || {
        flood(&mut b, 10);
        b.pass(11.0);
        flood(&mut b, 10_000);
    });
    assert_eq!(b.core.report.bad_envelopes, 6000);
    assert_eq!(b.core.report.unexpected, 12_000);
    let text = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
    let lines = text.lines().filter(|l| l.contains("WARN")).count();
    assert_eq!(lines, 6, "{text}");
    assert_eq!(text.matches("and 2999 more like it").count(), 3, "{text}");
}

/// Rank 0 of a multi-host group posts its NCCL id; members that asked
/// before or after get exactly that id, and never a job; a malformed id
/// is refused; the id dies with rank 0.
#[test]
fn group_members_get_rank_zeros_nccl_id_and_no_jobs() {
    let (_dir, cfg, tasks) = small();
    let mut b = Bench::new(&cfg, &tasks);
    let id: Vec<u8> = (0..128u8).rev().collect();
    let join = Message::NcclJoin { group: "g".into() };
    let ids_in = |b: &mut Bench, who: &str| -> Vec<(Vec<u32>, Vec<u8>)> {
        let ids = b.read(who).into_iter().filter_map(|m| match m {
            Message::NcclId {
                group,
                ranks,
                unique_id,
            } if group == "g" => Some((ranks, unique_id)),
            _ => None,
        });
        ids.collect()
    };
    b.hello("early", Role::GroupMember);
    b.say("early", join.clone());
    b.hello("rank0", Role::Benchworker);
    let post = |ranks: Vec<u32>, unique_id: Vec<u8>| Message::NcclId {
        group: "g".into(),
        ranks,
        unique_id,
    };
    b.say("rank0", post(vec![1, 1], vec![1; 64]));
    assert_eq!(b.core.report.unexpected, 1, "the malformed id");
    assert!(ids_in(&mut b, "early").is_empty());
    b.say("rank0", post(vec![2, 1], id.clone()));
    let want = vec![(vec![2, 1], id.clone())];
    assert_eq!(ids_in(&mut b, "early"), want, "the member that asked first");
    b.hello("late", Role::GroupMember);
    b.say("late", join.clone());
    assert_eq!(ids_in(&mut b, "late"), want, "the member that asked after");
    assert_eq!(b.core.report.group_ids_sent, 2);
    // Jobs go to rank 0 only.
    let width = tasks[0].devices as u32;
    b.say(
        "rank0",
        Message::Ready {
            max_devices: Some(width),
        },
    );
    b.update(FromTrainer::Picks(
        (0..3).map(|j| pick(&tasks, 0, j)).collect(),
    ));
    b.tick();
    assert_eq!(b.jobs("rank0").len(), 1);
    assert!(b.jobs("early").is_empty() && b.jobs("late").is_empty());
    // Rank 0 gone, its id is no good: a member that asks now waits.
    b.core.forget(b.now, b"rank0");
    b.hello("after", Role::GroupMember);
    b.say("after", join);
    assert!(ids_in(&mut b, "after").is_empty());
    assert_eq!(b.peer("after").awaits_group.as_deref(), Some("g"));
}

/// Stalls are named: no progress and no job out for
/// `cluster.stall_timeout_s`; a job out is no stall until it is late.
#[test]
fn a_stall_is_said_with_what_is_connected() {
    let (_dir, cfg, tasks) = small();
    let mut b = Bench::new(&cfg, &tasks);
    let stall = cfg.cluster.stall_timeout_s;
    b.benchworker("w", None);
    b.update(FromTrainer::Picks(vec![pick(&tasks, 0, 0)]));
    b.tick();
    b.pass(stall + 1.0);
    assert!(b.core.stalled(b.now, 0).is_none(), "a job is out");
    b.pass(cfg.cluster.job_timeout_s);
    let why = b.core.stalled(b.now, 2).expect("a stall");
    for words in [
        "stall_timeout_s",
        "1 benchworkers connected (1 ready)",
        "1 jobs out",
        "2 connections refused",
    ] {
        assert!(why.contains(words), "{words:?} not in {why}");
    }
    b.update(FromTrainer::Stepped);
    assert!(b.core.stalled(b.now, 0).is_none(), "the trainer moved");
}

#[test]
fn networks_too_big_to_send_are_refused_before_training() {
    let (_dir, mut cfg, tasks) = small();
    cfg.model.cost_table_hidden = 4096;
    cfg.model.cost_table_out = 4096;
    let mut trainer = crate::train::Trainer::new(&cfg, &tasks);
    let ctx = zmq::Context::new();
    let hub = net::link::Hub::bind(&ctx, "inproc://too-big", Some("t")).unwrap();
    let e = Learner::new(&mut trainer, &ctx, hub, "t".into())
        .err()
        .expect("weights over the frame limit")
        .to_string();
    assert!(e.contains("weights") && e.contains("64 MiB"), "{e}");
}

/// The whole loop over real sockets, with actor and benchworker threads:
/// strangers (a wrong token in its hello between threads, at the
/// handshake over tcp), garbage and a message from a peer that never said
/// hello are refused or dropped, and counted; training goes on. While the
/// networks' thread is busy (a slow checkpoint), peers still get
/// heartbeats.
#[test]
fn over_sockets_strangers_are_refused_and_a_busy_learner_still_heartbeats() {
    use net::link::{Hub, Link};
    use std::sync::atomic::{AtomicBool, Ordering};
    let (_dir, mut cfg, tasks) = small();
    cfg.train.iterations = 2;
    cfg.train.policy_steps = 5;
    cfg.cluster.heartbeat_s = 0.05;
    let mut trainer = crate::train::Trainer::new(&cfg, &tasks);
    let ctx = zmq::Context::new();
    let endpoint = "inproc://strangers";
    let mut hub = Hub::bind(&ctx, endpoint, Some("right")).unwrap();
    let tcp = hub.bind_also("tcp://127.0.0.1:0").unwrap();
    let stop = AtomicBool::new(false);
    let wait = Duration::from_secs(30);
    let actor_opts = |endpoint: &str, token: &str, seed| actor::worker::ActorOptions {
        endpoint: endpoint.into(),
        token: token.into(),
        seed,
        wait,
    };
    // A stranger over tcp, as another process would be: refused at the
    // handshake (the hub answers that before the learner runs).
    let far_stranger = actor::worker::run(&ctx, &actor_opts(&tcp, "wrong", 3), &stop);
    // Garbage, then a well-formed message from a peer that never said hello.
    let junk = ctx.socket(zmq::DEALER).unwrap();
    junk.connect(endpoint).unwrap();
    junk.send(&b"EMBS\x01\x00\x05garbage"[..], 0).unwrap();
    junk.send(&b"hello?"[..], 0).unwrap();
    let mut raw = Link::connect(&ctx, endpoint, None).unwrap();
    raw.send(1, &Message::Heartbeat).unwrap();
    let (member_tx, member_rx) = std::sync::mpsc::channel::<Link>();
    // The first checkpoint is slow: meanwhile a group member (no jobs, no
    // credits) counts the heartbeats it gets.
    let mut hooks = crate::train::Hooks::none();
    let beats = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = beats.clone();
    let mut first = true;
    hooks.round_done = Box::new(move |_| {
        if !std::mem::take(&mut first) {
            return Ok(());
        }
        let mut link = member_rx.recv_timeout(wait)?;
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(1) {
            if let Some((_, Message::Heartbeat)) = link.recv(10)? {
                counted.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(())
    });
    let (report, stranger, unrolls, measured) = std::thread::scope(|s| {
        let actor = s.spawn(|| actor::worker::run(&ctx, &actor_opts(endpoint, "right", 1), &stop));
        let stranger =
            s.spawn(|| actor::worker::run(&ctx, &actor_opts(endpoint, "wrong", 2), &stop));
        let bench = s.spawn(|| {
            let opts = benchworker::serve::ServeOptions {
                endpoint: endpoint.into(),
                token: "right".into(),
                backend: benchworker::Backend::Sim,
                wait,
                group: None,
            };
            benchworker::serve::serve(&ctx, &opts, &stop)
        });
        s.spawn(|| {
            let mut link = Link::connect(&ctx, endpoint, None).unwrap();
            link.register(Role::GroupMember, "right", wait, &stop)
                .unwrap();
            member_tx.send(link).unwrap();
        });
        let learner = Learner::new(&mut trainer, &ctx, hub, "right".into()).unwrap();
        let report = learner.run(&mut hooks, &stop, false).unwrap();
        stop.store(true, Ordering::Relaxed);
        let unrolls = actor.join().unwrap().unwrap().unrolls;
        let measured = bench.join().unwrap().unwrap().measured;
        (report, stranger.join().unwrap(), unrolls, measured)
    });
    assert!(unrolls > 0);
    assert_eq!(measured as usize, 2 * cfg.train.measure_per_iteration);
    assert_eq!(trainer.counters.iteration, 2, "training went on");
    assert_eq!(trainer.counters.policy_updates, 10);
    let beats = beats.load(Ordering::Relaxed);
    assert!(beats >= 5, "{beats} heartbeats in 1 s of a busy learner");
    // The peer without a hello was told so.
    let told = raw.recv(1000).unwrap().map(|(_, m)| m);
    assert!(matches!(told, Some(Message::Refused { .. })), "{told:?}");
    assert_eq!(report.unexpected, 1);
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
}

/// The networks' thread, driven by hand: a measurement is durable (the
/// `measured` hook ran) before the socket thread may acknowledge it; once
/// the round's cost steps are done its weights go out and unrolls acted
/// on the previous cost network are dropped, each freeing its credit;
/// unrolls within `max_policy_lag` are learned from, older ones dropped
/// as stale.
#[test]
fn the_networks_thread_makes_measurements_durable_first_and_drops_old_unrolls() {
    use crossbeam::channel::Receiver;
    use std::rc::Rc;
    let (_dir, mut cfg, tasks) = small();
    cfg.train.measure_per_iteration = 2;
    cfg.train.cost_steps = 4;
    cfg.train.policy_steps = 4;
    cfg.cluster.max_policy_lag = 1;
    let mut trainer = crate::train::Trainer::new(&cfg, &tasks);
    let unrolls: Vec<(usize, model::mdp::Unroll)> =
        (0..5).map(|_| trainer.rollout().unwrap()).collect();
    let mut sim = benchworker::sim::SimOracle::new(cfg.sim.clone(), cfg.memory);
    let measured: Vec<(Pick, common::Measurement)> = (0..2)
        .map(|j| {
            let p = trainer.pick_plan(j);
            let m = benchworker::Oracle::measure(&mut sim, &tasks[p.task].tables, &p.plan);
            (p, m.unwrap())
        })
        .collect();
    trainer.counters.policy_version = 1;
    let ctx = zmq::Context::new();
    let wake = ctx.socket(zmq::PUSH).unwrap();
    let (to_io, heard) = crossbeam::channel::unbounded();
    let (_work, inbox) = crossbeam::channel::unbounded();
    let mut learn = learn::Learn::new(&mut trainer, to_io, wake, inbox);
    // In order: each measurement made durable, each word said to the
    // socket thread that it may be acknowledged.
    let log = Rc::new(std::cell::RefCell::new(Vec::<String>::new()));
    let said = |log: &std::cell::RefCell<Vec<String>>, words: &Receiver<FromTrainer>| {
        for w in words.try_iter() {
            if let FromTrainer::Durable { job, .. } = w {
                log.borrow_mut().push(format!("may ack {job}"));
            }
        }
    };
    let mut hooks = crate::train::Hooks::none();
    let (seen, ears) = (log.clone(), heard.clone());
    hooks.measured = Box::new(move |_| {
        said(&seen, &ears);
        seen.borrow_mut().push("durable".into());
        Ok(())
    });
    let queued = |acted: u64, (task, unroll): (usize, model::mdp::Unroll)| {
        ToTrainer::Unroll(Queued {
            session: acted,
            acted,
            task,
            unroll,
        })
    };
    let mut unrolls = unrolls.into_iter();
    // Two unrolls acted with version 1, before the round's cost network.
    for _ in 0..2 {
        learn
            .take(queued(1, unrolls.next().unwrap()), &mut hooks)
            .unwrap();
    }
    for (job, (pick, measurement)) in measured.into_iter().enumerate() {
        let from = b"w".to_vec();
        let m = ToTrainer::Measured {
            from,
            job: job as u64,
            pick,
            measurement,
        };
        learn.take(m, &mut hooks).unwrap();
    }
    said(&log, &heard);
    let want = ["durable", "may ack 0", "durable", "may ack 1"];
    assert_eq!(*log.borrow(), want);
    // Cost steps, then the round's weights (version 2) and the two old
    // unrolls dropped, each freeing its credit.
    while learn.trainer.counters.cost_steps < 4 {
        assert!(learn.learn(&mut hooks).unwrap());
    }
    assert!(!learn.learn(&mut hooks).unwrap(), "no unroll to learn from");
    let words: Vec<FromTrainer> = heard.try_iter().collect();
    assert!(matches!(
        words[..],
        [FromTrainer::Stepped, FromTrainer::Weights(2, _), ..]
    ));
    let freed = (words.iter()).filter(|w| matches!(w, FromTrainer::Consumed { session: 1 }));
    assert_eq!(freed.count(), 2);
    assert_eq!(learn.trainer.counters.dropped_unrolls, 2);
    // Three acted with version 2: lags 0 and 1 are learned from, the
    // third (lag 2) is stale.
    for _ in 0..3 {
        learn
            .take(queued(2, unrolls.next().unwrap()), &mut hooks)
            .unwrap();
        assert!(learn.learn(&mut hooks).unwrap());
    }
    assert_eq!(learn.lags, BTreeMap::from([(0, 1), (1, 1)]));
    assert_eq!(learn.stale_unrolls, 1);
    assert_eq!(learn.trainer.counters.dropped_unrolls, 3);
    let words: Vec<FromTrainer> = heard.try_iter().collect();
    let versions: Vec<u64> = (words.iter())
        .filter_map(|w| match w {
            FromTrainer::Weights(v, _) => Some(*v),
            _ => None,
        })
        .collect();
    assert_eq!(versions, [3, 4], "new weights after each update");
    let freed = (words.iter()).filter(|w| matches!(w, FromTrainer::Consumed { session: 2 }));
    assert_eq!(freed.count(), 3);
}
