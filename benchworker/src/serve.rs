//! The benchworker's loop (DESIGN §3): introduce itself to the learner,
//! build its oracle from the welcome's configuration, then measure one job
//! at a time and send back the measurement (or why it failed), with a
//! heartbeat while idle. The same loop runs as a thread beside the learner
//! (`inproc://`) and as `benchworker serve` (`tcp://`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::link::{sessions, End, Link, Welcome};
use common::protocol::{Message, Role};
use common::{Plan, Task};

use crate::oracle::{build, Backend, Oracle};

/// How to reach the learner and what to measure with.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub endpoint: String,
    pub token: String,
    pub backend: Backend,
    /// How long to keep saying hello before giving up.
    pub wait: Duration,
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

/// Checks a job against the welcome's tasks and builds its plan.
fn job_plan<'t>(
    tasks: &'t [Task],
    task: u32,
    assignment: &[u32],
) -> Result<(&'t Task, Plan), String> {
    let t = tasks
        .get(task as usize)
        .ok_or_else(|| format!("task {task} does not exist ({} tasks)", tasks.len()))?;
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
    report.rejoined = sessions(
        ctx,
        &opts.endpoint,
        Role::Benchworker,
        &opts.token,
        opts.wait,
        stop,
        |link, welcome| {
            let mut oracle = build(opts.backend, &welcome.config)?;
            session(link, welcome, oracle.as_mut(), &mut report, stop)
        },
    )?;
    Ok(report)
}

/// One stay with a learner: measure its jobs one at a time, in a thread
/// of their own so that heartbeats go on during a long measurement.
fn session(
    link: &mut Link,
    welcome: &Welcome,
    oracle: &mut dyn Oracle,
    report: &mut ServeReport,
    stop: &AtomicBool,
) -> anyhow::Result<End> {
    let heartbeat = Duration::from_secs_f64(welcome.config.cluster.heartbeat_s);
    let timeout = Duration::from_secs_f64(welcome.config.cluster.peer_timeout_s);
    let mut stopping = false;
    loop {
        if stop.load(Ordering::Relaxed) {
            return Ok(End::Stop);
        }
        if link.silence() > timeout {
            return Ok(End::LostLearner);
        }
        link.heartbeat(heartbeat)?;
        let Some((header, message)) = link.recv(100)? else {
            continue;
        };
        match message {
            Message::MeasureJob {
                job,
                task,
                assignment,
            } => {
                let result = match job_plan(&welcome.tasks, task, &assignment) {
                    Err(e) => Err(e),
                    Ok((t, plan)) => std::thread::scope(|s| {
                        let (done, result) = std::sync::mpsc::channel();
                        let o = &mut *oracle;
                        s.spawn(move || {
                            let _ = done.send(
                                o.measure(&t.tables, &plan)
                                    .map_err(|e| format!("{}: {e}", t.name)),
                            );
                        });
                        // Heartbeats while measuring; a shutdown waits for the job.
                        loop {
                            match result.recv_timeout(Duration::from_millis(50)) {
                                Ok(r) => return Ok(r),
                                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                                    anyhow::bail!("the oracle panicked measuring job {job}")
                                }
                                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                            }
                            link.heartbeat(heartbeat)?;
                            while let Some((_, m)) = link.recv(0)? {
                                match m {
                                    Message::Shutdown => stopping = true,
                                    Message::Ack { .. } => report.acked += 1,
                                    _ => {}
                                }
                            }
                        }
                    })?,
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
                link.send(header.policy_version, &reply)?;
                if stopping {
                    return Ok(End::Stop);
                }
            }
            Message::Ack { .. } => report.acked += 1,
            Message::Shutdown => return Ok(End::Stop),
            Message::Refused { reason, retry } => {
                anyhow::ensure!(retry, "the learner dropped this benchworker: {reason}");
                return Ok(End::LostLearner);
            }
            _ => {}
        }
    }
}
