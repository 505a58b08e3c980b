//! The benchworker's loop (DESIGN §3): introduce itself to the learner,
//! build its oracle from the welcome's configuration, then measure one job
//! at a time and send back the measurement (or why it failed), with a
//! heartbeat while idle. The same loop runs as a thread beside the learner
//! (`inproc://`) and as `benchworker serve` (`tcp://`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use common::config::Config;
use common::link::Link;
use common::protocol::{Message, Role};
use common::{Plan, Task};

use crate::oracle::{build, Backend};

/// How to reach the learner and what to measure with.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub endpoint: String,
    pub token: String,
    pub backend: Backend,
    pub welcome_timeout: Duration,
    pub heartbeat: Duration,
}

/// What a benchworker did, when it stops.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServeReport {
    pub measured: u64,
    pub failed: u64,
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

/// Runs until the learner says `Shutdown` or `stop` is set.
pub fn serve(
    ctx: &zmq::Context,
    opts: &ServeOptions,
    stop: &AtomicBool,
) -> anyhow::Result<ServeReport> {
    let mut link = Link::connect(ctx, &opts.endpoint)?;
    link.send(
        0,
        &Message::Hello {
            role: Role::Benchworker,
            token: opts.token.clone(),
        },
    )?;
    let deadline = Instant::now() + opts.welcome_timeout;
    let (cfg, tasks) = loop {
        if stop.load(Ordering::Relaxed) {
            return Ok(ServeReport::default());
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
                anyhow::bail!("the learner refused this benchworker: {reason}")
            }
            Some((_, Message::Shutdown)) => return Ok(ServeReport::default()),
            _ => {}
        }
    };
    let mut oracle = build(opts.backend, &cfg)?;
    let mut report = ServeReport::default();
    let mut last_sent = Instant::now();
    loop {
        if stop.load(Ordering::Relaxed) {
            return Ok(report);
        }
        if last_sent.elapsed() >= opts.heartbeat {
            link.send(0, &Message::Heartbeat)?;
            last_sent = Instant::now();
        }
        let Some((header, message)) = link.recv(100)? else {
            continue;
        };
        match message {
            Message::MeasureJob {
                job,
                task,
                assignment,
            } => {
                let result = job_plan(&tasks, task, &assignment).and_then(|(t, plan)| {
                    oracle
                        .measure(&t.tables, &plan)
                        .map_err(|e| format!("{}: {e}", t.name))
                });
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
                last_sent = Instant::now();
            }
            Message::Shutdown => return Ok(report),
            Message::Refused { reason } => {
                anyhow::bail!("the learner dropped this benchworker: {reason}")
            }
            _ => {}
        }
    }
}
