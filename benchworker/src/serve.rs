//! The benchworker's loop (DESIGN §3): introduce itself to the learner,
//! build its oracle from the welcome's configuration, then measure one job
//! at a time and send back the measurement (or why it failed), with a
//! heartbeat while idle. The same loop runs as a thread beside the learner
//! (`inproc://`) and as `benchworker serve` (`tcp://`).

use std::collections::VecDeque;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use common::{Plan, Task};
use net::link::{sessions, End, Link, Welcome};
use net::protocol::{Header, Message, Role};

use crate::oracle::{build, Backend, Oracle};

/// How to reach the learner and what to measure with.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub endpoint: String,
    pub token: String,
    pub backend: Backend,
    /// How long to keep saying hello before giving up.
    pub wait: Duration,
    /// Its place in a multi-host `cuda` group, if it is in one.
    pub group: Option<GroupSpec>,
}

/// A benchworker's place in a multi-host group: rank 0 takes the learner's
/// jobs and measures them together with the other ranks over NCCL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupSpec {
    pub name: String,
    pub rank: usize,
    /// GPUs of each rank, rank after rank; the plan's devices are numbered
    /// in that order.
    pub gpus: Vec<usize>,
}

/// Why a `--group` cannot be formed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadGroup {
    #[error("the group needs a name")]
    NoName,
    #[error("GPUs per rank {0:?}: every rank needs at least one")]
    NoGpu(Vec<usize>),
    #[error("rank {rank} of a group of {ranks} ranks")]
    Rank { rank: usize, ranks: usize },
}

impl GroupSpec {
    pub fn validate(&self) -> Result<(), BadGroup> {
        if self.name.is_empty() {
            return Err(BadGroup::NoName);
        }
        if self.gpus.is_empty() || self.gpus.contains(&0) {
            return Err(BadGroup::NoGpu(self.gpus.clone()));
        }
        if self.rank >= self.gpus.len() {
            return Err(BadGroup::Rank {
                rank: self.rank,
                ranks: self.gpus.len(),
            });
        }
        Ok(())
    }
}

/// What a benchworker did, when it stops.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServeReport {
    pub measured: u64,
    pub failed: u64,
    /// Measurements the learner confirmed durable.
    pub acked: u64,
    /// Welcomes after the first: the learner restarted or lost us.
    pub rejoined: u64,
}

/// Sends a job's answer, and while the connection is down (libzmq
/// reconnects by itself, and the learner knows this peer again by its
/// routing id) tries again for up to `patience`: a measurement is worth
/// the wait. False when it never went out; the learner then gives its job
/// to another benchworker once `cluster.job_timeout_s` has passed.
fn send_answer(
    link: &mut Link,
    version: u64,
    answer: &Message,
    patience: Duration,
) -> anyhow::Result<bool> {
    let start = Instant::now();
    loop {
        if link.send(version, answer)? {
            return Ok(true);
        }
        if start.elapsed() >= patience {
            tracing::warn!(
                "the learner was unreachable for {:.0} s: a {:?} is dropped",
                patience.as_secs_f64(),
                answer.kind()
            );
            return Ok(false);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A job for a task the welcome did not have.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("task {task} does not exist ({tasks} tasks)")]
struct UnknownTask {
    task: u32,
    tasks: usize,
}

/// Checks a job against the welcome's tasks and builds its plan.
fn job_plan<'t>(
    tasks: &'t [Task],
    task: u32,
    assignment: &[u32],
) -> Result<(&'t Task, Plan), UnknownTask> {
    let t = tasks.get(task as usize).ok_or(UnknownTask {
        task,
        tasks: tasks.len(),
    })?;
    let plan = Plan {
        devices: t.devices,
        assignment: assignment.iter().map(|&d| d as usize).collect(),
    };
    Ok((t, plan))
}

/// Runs until the learner says `Shutdown` or `stop` is set. A learner
/// that falls silent (a crash, a restart) is greeted again until it
/// answers.
pub fn serve(
    ctx: &zmq::Context,
    opts: &ServeOptions,
    stop: &AtomicBool,
) -> anyhow::Result<ServeReport> {
    let mut report = ServeReport::default();
    if let Some(g) = &opts.group {
        g.validate().map_err(|e| anyhow::anyhow!("--group: {e}"))?;
        anyhow::ensure!(
            opts.backend == Backend::Cuda,
            "--group: multi-host groups measure with the cuda backend"
        );
    }
    let role = match &opts.group {
        Some(g) if g.rank > 0 => Role::GroupMember,
        _ => Role::Benchworker,
    };
    report.rejoined = sessions(
        ctx,
        &opts.endpoint,
        role,
        &opts.token,
        opts.wait,
        stop,
        |link, welcome| match &opts.group {
            None => {
                let mut oracle = build(opts.backend, &welcome.config)?;
                session(
                    link,
                    welcome,
                    oracle.as_mut(),
                    &mut report,
                    stop,
                    Vec::new(),
                )
            }
            Some(group) => group_session(link, welcome, group, &mut report, stop),
        },
    )?;
    Ok(report)
}

/// What the learner said while a [`heartbeating`] piece of work ran.
#[derive(Default)]
struct Heard {
    /// A shutdown, to be honoured after the work.
    shutdown: bool,
    /// Jobs that arrived meanwhile, to be measured after it.
    jobs: Vec<(Header, Message)>,
}

/// Runs `work` in a thread of its own while this one keeps the learner's
/// link alive: heartbeats go on, acks are counted, shutdowns and jobs kept
/// for after the work. Past `deadline` (with what it is for) the process
/// exits with an error: work stuck in a call that cannot be interrupted
/// (joining a group whose ranks never come) would hold it forever.
fn heartbeating<T: Send>(
    link: &mut Link,
    heartbeat: Duration,
    report: &mut ServeReport,
    deadline: Option<(Instant, &str)>,
    work: impl FnOnce() -> T + Send,
) -> anyhow::Result<(T, Heard)> {
    let mut heard = Heard::default();
    std::thread::scope(|s| {
        let (done, result) = std::sync::mpsc::channel();
        s.spawn(move || {
            let _ = done.send(work());
        });
        loop {
            match result.recv_timeout(Duration::from_millis(50)) {
                Ok(r) => return Ok((r, heard)),
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    anyhow::bail!("the benchworker's work panicked")
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            }
            if let Some((at, what)) = deadline {
                if Instant::now() > at {
                    tracing::error!("{what}: timed out; exiting");
                    std::process::exit(1);
                }
            }
            link.heartbeat(heartbeat)?;
            while let Some((header, m)) = link.recv(0)? {
                match m {
                    Message::Shutdown => heard.shutdown = true,
                    Message::Ack { .. } => report.acked += 1,
                    Message::MeasureJob { .. } => heard.jobs.push((header, m)),
                    // A second welcome answers a repeated hello: its id is
                    // the one the learner now knows this benchworker by.
                    Message::Welcome { peer, .. } => link.set_sender(peer),
                    _ => {}
                }
            }
        }
    })
}

/// What to tell the user when some of the learner's training tasks have
/// more devices than this benchworker can measure (`most`): the learner
/// hands their plans to other benchworkers, wide enough ones.
fn too_wide(tasks: &[Task], most: usize) -> Option<String> {
    // The welcome's tight-memory and reshaped copies are only rolled out,
    // never measured.
    let tasks: Vec<&Task> = tasks.iter().filter(|t| !t.is_rollout_copy()).collect();
    let wide: Vec<&&Task> = tasks.iter().filter(|t| t.devices > most).collect();
    let widest = wide.iter().max_by_key(|t| t.devices)?;
    Some(format!(
        "{} of the learner's {} training tasks need more devices than the {most} this \
         benchworker measures on (up to {}, task `{}`): their plans go to wider \
         benchworkers (with none, they fail here and training stops on their failures)",
        wide.len(),
        tasks.len(),
        widest.devices,
        widest.name
    ))
}

/// One stay with a learner: measure its jobs one at a time, in a thread
/// of their own so that heartbeats go on during a long measurement.
/// The learner hands it jobs once it says it is ready, at the start.
/// `pending`: jobs that arrived before the session began (while a group
/// re-formed), measured first.
fn session(
    link: &mut Link,
    welcome: &Welcome,
    oracle: &mut dyn Oracle,
    report: &mut ServeReport,
    stop: &AtomicBool,
    pending: Vec<(Header, Message)>,
) -> anyhow::Result<End> {
    let heartbeat = Duration::from_secs_f64(welcome.config.cluster.heartbeat_s);
    let timeout = Duration::from_secs_f64(welcome.config.cluster.peer_timeout_s);
    let most = oracle.max_devices();
    if let Some(warning) = most.and_then(|most| too_wide(&welcome.tasks, most)) {
        tracing::warn!("{warning}");
    }
    // Jobs come from now on; plans wider than this go to others.
    let ready = Message::Ready {
        max_devices: most.map(|m| m as u32),
    };
    let mut said_ready = false;
    let mut pending: VecDeque<(Header, Message)> = pending.into();
    let mut stopping = false;
    loop {
        if !said_ready {
            // Not sent while the learner is unreachable: again next turn.
            said_ready = link.send(0, &ready)?;
        }
        if let Some(end) = link.tend(stop, heartbeat, timeout)? {
            return Ok(end);
        }
        let next = match pending.pop_front() {
            Some(job) => Some(job),
            None => link.recv(100)?,
        };
        let Some((header, message)) = next else {
            continue;
        };
        match message {
            Message::MeasureJob {
                job,
                task,
                assignment,
            } => {
                let result = match job_plan(&welcome.tasks, task, &assignment) {
                    Err(e) => Err(e.to_string()),
                    Ok((t, plan)) => {
                        let o = &mut *oracle;
                        let (result, heard) =
                            heartbeating(link, heartbeat, report, None, move || {
                                o.measure(&t.tables, &plan)
                                    .map_err(|e| format!("{}: {e}", t.name))
                            })?;
                        // A shutdown waits for the job.
                        stopping |= heard.shutdown;
                        pending.extend(heard.jobs);
                        result
                    }
                };
                let reply = match result {
                    Ok(measurement) => {
                        report.measured += 1;
                        Message::Measurement { job, measurement }
                    }
                    Err(error) => {
                        report.failed += 1;
                        tracing::warn!("job {job} failed: {error}");
                        Message::JobFailed { job, error }
                    }
                };
                send_answer(link, header.policy_version, &reply, timeout)?;
                if stopping {
                    return Ok(End::Stop);
                }
                if !oracle.healthy() {
                    tracing::warn!("the oracle cannot measure any more; starting afresh");
                    return Ok(End::LostLearner);
                }
            }
            Message::Ack { .. } => report.acked += 1,
            Message::Welcome { peer, .. } => link.set_sender(peer),
            Message::Shutdown => return Ok(End::Stop),
            Message::Refused { reason, retry } => {
                anyhow::ensure!(retry, "the learner dropped this benchworker: {reason}");
                return Ok(End::LostLearner);
            }
            _ => {}
        }
    }
}

/// A stay with the learner as part of a multi-host group.
///
/// Rank 0 makes the group's NCCL unique id, posts it to the learner, joins
/// the group (waiting for every rank) and then serves jobs like any
/// benchworker, measuring each together with the other ranks; when its stay
/// ends it releases them. A rank > 0 asks the learner for the id, joins,
/// and follows rank 0's jobs until released; then it says hello again, so a
/// group re-forms by itself after a learner or rank-0 restart.
#[cfg(feature = "cuda")]
fn group_session(
    link: &mut Link,
    welcome: &Welcome,
    group: &GroupSpec,
    report: &mut ServeReport,
    stop: &AtomicBool,
) -> anyhow::Result<End> {
    if group.rank == 0 {
        lead_group(link, welcome, group, report, stop)
    } else {
        follow_group(link, welcome, group, report, stop)
    }
}

/// When joining a group gives up (`cuda.join_timeout_s` from now), and what
/// it waits for.
#[cfg(feature = "cuda")]
fn joining(cfg: &common::config::Config) -> (Instant, &'static str) {
    let limit = Duration::from_secs_f64(cfg.cuda.join_timeout_s);
    (
        Instant::now() + limit,
        "joining the NCCL group (cuda.join_timeout_s)",
    )
}

/// This rank's GPUs joined to the group of NCCL unique id `id`.
#[cfg(feature = "cuda")]
fn join(
    cfg: &common::config::Config,
    group: &GroupSpec,
    id: &[u8],
) -> Result<crate::cuda::CudaOracle, crate::OracleError> {
    crate::cuda::CudaOracle::multi_host(
        cfg.cuda.clone(),
        cfg.memory,
        group.rank,
        group.gpus.clone(),
        id,
    )
}

/// What a stay ends as when the group could not form: asked to stop, or
/// to greet the learner again.
#[cfg(feature = "cuda")]
fn unformed(shutdown: bool, heartbeat: Duration) -> End {
    std::thread::sleep(heartbeat);
    if shutdown {
        End::Stop
    } else {
        End::LostLearner
    }
}

/// Rank 0: makes the unique id, posts it, joins, serves jobs with the
/// group, and releases the other ranks when its stay ends.
#[cfg(feature = "cuda")]
fn lead_group(
    link: &mut Link,
    welcome: &Welcome,
    group: &GroupSpec,
    report: &mut ServeReport,
    stop: &AtomicBool,
) -> anyhow::Result<End> {
    let cfg = &welcome.config;
    let heartbeat = Duration::from_secs_f64(cfg.cluster.heartbeat_s);
    let unique_id = crate::cuda::CudaOracle::unique_id()?;
    link.send(
        0,
        &Message::NcclId {
            group: group.name.clone(),
            ranks: group.gpus.iter().map(|&g| g as u32).collect(),
            unique_id: unique_id.clone(),
        },
    )?;
    tracing::info!(
        "group {}: waiting for {} ranks",
        group.name,
        group.gpus.len()
    );
    let (oracle, heard) = heartbeating(link, heartbeat, report, Some(joining(cfg)), || {
        join(cfg, group, &unique_id)
    })?;
    let mut oracle = match oracle {
        Ok(o) => o,
        Err(e) => {
            tracing::warn!("group {}: forming failed: {e}", group.name);
            return Ok(unformed(heard.shutdown, heartbeat));
        }
    };
    if heard.shutdown {
        oracle.release_group()?;
        return Ok(End::Stop);
    }
    tracing::info!("group {}: formed", group.name);
    // Jobs the learner sent while the group formed come first.
    let end = session(link, welcome, &mut oracle, report, stop, heard.jobs);
    if let Err(e) = oracle.release_group() {
        tracing::warn!("group {}: releasing the other ranks: {e}", group.name);
    }
    end
}

/// The unique id of rank 0's group, asked of the learner; or how the
/// stay ended before it came.
#[cfg(feature = "cuda")]
fn await_unique_id(
    link: &mut Link,
    group: &GroupSpec,
    stop: &AtomicBool,
    (heartbeat, timeout): (Duration, Duration),
) -> anyhow::Result<Result<Vec<u8>, End>> {
    let ranks: Vec<u32> = group.gpus.iter().map(|&g| g as u32).collect();
    link.send(
        0,
        &Message::NcclJoin {
            group: group.name.clone(),
        },
    )?;
    loop {
        if let Some(end) = link.tend(stop, heartbeat, timeout)? {
            return Ok(Err(end));
        }
        match link.recv(100)? {
            Some((
                _,
                Message::NcclId {
                    group: name,
                    ranks: theirs,
                    unique_id,
                },
            )) if name == group.name => {
                anyhow::ensure!(
                    theirs == ranks,
                    "group {name}: rank 0 says GPUs per rank {theirs:?}, this rank {ranks:?}"
                );
                return Ok(Ok(unique_id));
            }
            Some((_, Message::Shutdown)) => return Ok(Err(End::Stop)),
            Some((_, Message::Refused { reason, retry })) => {
                anyhow::ensure!(retry, "the learner dropped this group member: {reason}");
                return Ok(Err(End::LostLearner));
            }
            _ => {}
        }
    }
}

/// A rank > 0: asks for the id, joins, and follows rank 0's jobs until
/// released; then it says hello again, so a group re-forms by itself
/// after a learner or rank-0 restart.
#[cfg(feature = "cuda")]
fn follow_group(
    link: &mut Link,
    welcome: &Welcome,
    group: &GroupSpec,
    report: &mut ServeReport,
    stop: &AtomicBool,
) -> anyhow::Result<End> {
    let cfg = &welcome.config;
    let heartbeat = Duration::from_secs_f64(cfg.cluster.heartbeat_s);
    let timeout = Duration::from_secs_f64(cfg.cluster.peer_timeout_s);
    let unique_id = match await_unique_id(link, group, stop, (heartbeat, timeout))? {
        Ok(id) => id,
        Err(end) => return Ok(end),
    };
    let (oracle, heard) = heartbeating(link, heartbeat, report, Some(joining(cfg)), || {
        join(cfg, group, &unique_id)
    })?;
    let shutdown = heard.shutdown;
    let mut oracle = match oracle {
        Ok(o) => o,
        Err(e) => {
            // A stale id (rank 0 restarted since): ask again.
            tracing::warn!("group {}: joining failed: {e}", group.name);
            return Ok(unformed(shutdown, heartbeat));
        }
    };
    tracing::info!("group {}: rank {} joined", group.name, group.rank);
    let (followed, heard) = heartbeating(link, heartbeat, report, None, || oracle.follow(stop))?;
    match followed {
        Ok(jobs) => {
            report.measured += jobs;
            tracing::info!("group {}: released after {jobs} jobs", group.name)
        }
        Err(e) => tracing::warn!("group {}: {e}", group.name),
    }
    Ok(
        if shutdown || heard.shutdown || stop.load(std::sync::atomic::Ordering::Relaxed) {
            End::Stop
        } else {
            End::LostLearner
        },
    )
}

#[cfg(not(feature = "cuda"))]
fn group_session(
    _link: &mut Link,
    _welcome: &Welcome,
    _group: &GroupSpec,
    _report: &mut ServeReport,
    _stop: &AtomicBool,
) -> anyhow::Result<End> {
    Err(crate::oracle::not_built().into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_waits_for_the_connection_for_a_while_then_is_dropped() {
        let ctx = zmq::Context::new();
        // A free port, closed again at once: nobody listens there.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let endpoint = format!("tcp://127.0.0.1:{port}");
        let mut link = Link::connect(&ctx, &endpoint, Some("t")).unwrap();
        let answer = Message::JobFailed {
            job: 7,
            error: "x".into(),
        };
        let start = Instant::now();
        let sent = send_answer(&mut link, 0, &answer, Duration::from_millis(300)).unwrap();
        assert!(!sent && start.elapsed() >= Duration::from_millis(300));
        // The learner is back (libzmq reconnects within its retry
        // interval): the answer waits for the connection and goes out.
        let mut hub = net::link::Hub::bind(&ctx, &endpoint, Some("t")).unwrap();
        assert!(send_answer(&mut link, 0, &answer, Duration::from_secs(10)).unwrap());
        let got = hub.recv(5000).unwrap().map(|m| m.message);
        assert_eq!(got, Some(answer));
    }

    fn task(name: &str, devices: usize) -> Task {
        Task {
            name: name.into(),
            devices,
            memory_gb: 16.0,
            tables: vec![crate::test_table("t", 1000, 32, 4.0, &[(0, 1.0)])],
        }
    }

    /// A `cpu` benchworker asked to measure a plan whose weights no machine
    /// holds tells the learner the job failed, and measures the next one.
    #[test]
    fn a_measurement_that_cannot_fit_memory_is_a_failed_job_not_a_crash() {
        use net::link::Hub;
        use net::protocol::Role;
        let ctx = zmq::Context::new();
        let endpoint = "inproc://serve-too-large";
        let mut hub = Hub::bind(&ctx, endpoint, Some("t")).unwrap();
        let huge = Task {
            name: "huge".into(),
            devices: 1,
            memory_gb: 1e9,
            tables: vec![crate::test_table("h", 1 << 40, 1 << 16, 1.0, &[(0, 1.0)])],
        };
        let tasks = vec![huge, task("small", 1)];
        let config_toml = "[cpu]\nmax_rows = 1099511627776\nbatch = 16\nwarmup = 0\nrepeats = 1\n";
        let opts = ServeOptions {
            endpoint: endpoint.into(),
            token: "t".into(),
            backend: Backend::Cpu,
            wait: Duration::from_secs(60),
            group: None,
        };
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            let worker = s.spawn(|| serve(&ctx, &opts, &stop));
            // What the benchworker says next, heartbeats aside.
            let next = |hub: &mut Hub| loop {
                let m = hub.recv(30_000).unwrap().expect("the benchworker speaks");
                if m.message != Message::Heartbeat {
                    return m;
                }
            };
            let hello = next(&mut hub);
            assert!(
                matches!(
                    hello.message,
                    Message::Hello {
                        role: Role::Benchworker,
                        ..
                    }
                ),
                "{:?}",
                hello.message
            );
            let to = hello.from;
            let welcome = Message::Welcome {
                peer: 1,
                config_toml: config_toml.into(),
                tasks: tasks.clone(),
            };
            assert!(hub.send(&to, 0, &welcome));
            assert!(matches!(next(&mut hub).message, Message::Ready { .. }));
            for (job, task) in [(1, 0), (2, 1)] {
                let m = Message::MeasureJob {
                    job,
                    task,
                    assignment: vec![0],
                };
                assert!(hub.send(&to, 0, &m));
            }
            match next(&mut hub).message {
                Message::JobFailed { job: 1, error } => {
                    assert!(error.starts_with("huge: cpu backend: "), "{error}");
                    assert!(error.contains("lower cpu.max_rows"), "{error}");
                }
                m => panic!("{m:?}"),
            }
            assert!(matches!(
                next(&mut hub).message,
                Message::Measurement { job: 2, .. }
            ));
            assert!(hub.send(&to, 0, &Message::Shutdown));
            let report = worker.join().unwrap().unwrap();
            assert_eq!((report.measured, report.failed), (1, 1));
        });
    }

    #[test]
    fn tasks_wider_than_the_benchworker_are_named_once_at_welcome() {
        let mut tasks = vec![task("a", 4), task("b", 8), task("c", 4), task("d", 6)];
        // Tight-memory copies (rolled out, never measured) are not counted.
        let copies: Vec<Task> = tasks
            .iter()
            .map(|t| {
                let mut c = t.clone();
                c.name = Task::tight_copy_name(&t.name, 0);
                c
            })
            .collect();
        tasks.extend(copies);
        // Nor reshaped ones, even on more devices than any training task.
        let mut wide = task("b", 16);
        wide.name = Task::reshaped_copy_name("b", 0);
        tasks.push(wide);
        assert_eq!(too_wide(&tasks, 8), None);
        let w = too_wide(&tasks, 4).unwrap();
        assert!(w.contains("2 of the learner's 4 training tasks"), "{w}");
        assert!(
            w.contains("the 4 this") && w.contains("up to 8, task `b`"),
            "{w}"
        );
        // Any number of devices: nothing to say (sim and cpu).
        let sim = crate::sim::SimOracle::new(Default::default(), Default::default());
        assert_eq!(sim.max_devices(), None);
    }
}
