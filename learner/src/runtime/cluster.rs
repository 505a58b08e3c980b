//! A cluster run: the learner's loop with actor and benchworker threads
//! beside it and, with `--bind`, processes that connect.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use net::link::Hub;

use super::{Learner, RuntimeReport};
use crate::train::{Hooks, Trainer};

/// How a training cluster is set up.
#[derive(Debug, Clone)]
pub struct ClusterRun {
    /// Endpoints for remote peers (e.g. `tcp://127.0.0.1:5555`), beside
    /// the `inproc://` one of the threads.
    pub bind: Vec<String>,
    /// The cluster token every hello must carry.
    pub token: String,
    /// Actor and benchworker threads to start beside the learner.
    pub actors: usize,
    pub benchworkers: usize,
    pub backend: benchworker::Backend,
    /// Where the peers are shown (`learner train --status`).
    pub status: Option<crate::status::StatusFeed>,
}

impl ClusterRun {
    /// Threads only, with a token of their own.
    pub fn threads(actors: usize, benchworkers: usize, backend: benchworker::Backend) -> Self {
        ClusterRun {
            bind: Vec::new(),
            token: net::link::random_token(),
            actors,
            benchworkers,
            backend,
            status: None,
        }
    }
}

/// What the in-process threads did.
#[derive(Debug, Default, Clone)]
pub struct ThreadsReport {
    pub actors: Vec<actor::worker::ActorReport>,
    pub benchworkers: Vec<benchworker::serve::ServeReport>,
}

/// Joins peer threads: the reports of those that stopped cleanly; the
/// others are logged.
fn join_all<R>(
    handles: Vec<std::thread::ScopedJoinHandle<'_, anyhow::Result<R>>>,
    what: &str,
) -> Vec<R> {
    handles
        .into_iter()
        .filter_map(|h| match h.join() {
            Ok(Ok(r)) => Some(r),
            Ok(Err(e)) => {
                tracing::warn!("{what} stopped with an error: {e:#}");
                None
            }
            Err(_) => {
                tracing::warn!("{what} panicked");
                None
            }
        })
        .collect()
}

/// Trains with the learner in this thread, `run.actors` and
/// `run.benchworkers` threads on `inproc://`, and whatever peers connect
/// to `run.bind`. `bound` is told the endpoints actually bound (a
/// `tcp://…:0` request gets its port). Returns when every round is done or
/// `stop` is set (the caller then checkpoints).
pub fn train_cluster(
    trainer: &mut Trainer,
    run: &ClusterRun,
    hooks: &mut Hooks,
    stop: &AtomicBool,
    bound: impl FnOnce(&[String]) -> anyhow::Result<()>,
) -> anyhow::Result<(RuntimeReport, ThreadsReport)> {
    let ctx = zmq::Context::new();
    let endpoint = format!(
        "inproc://learner-{}-{:x}",
        std::process::id(),
        rand::random::<u64>()
    );
    // Remote peers must give the token at their connection's handshake.
    let mut hub = Hub::bind(&ctx, &endpoint, Some(&run.token))?;
    let mut remote = Vec::new();
    for b in &run.bind {
        remote.push(hub.bind_also(b)?);
    }
    // Checked (the messages fit a frame) before anyone is told where to
    // connect.
    let seed = trainer.config().train.seed;
    let learner =
        Learner::new(trainer, &ctx, hub, run.token.clone())?.with_status(run.status.clone());
    bound(&remote)?;
    let threads_stop = AtomicBool::new(false);
    let wait = Duration::from_secs(30);
    std::thread::scope(|s| {
        let actors: Vec<_> = (0..run.actors)
            .map(|i| {
                let opts = actor::worker::ActorOptions {
                    endpoint: endpoint.clone(),
                    token: run.token.clone(),
                    seed: seed.wrapping_add(1 + i as u64),
                    wait,
                };
                let (ctx, stop) = (&ctx, &threads_stop);
                s.spawn(move || actor::worker::run(ctx, &opts, stop))
            })
            .collect();
        let benches: Vec<_> = (0..run.benchworkers)
            .map(|_| {
                let opts = benchworker::serve::ServeOptions {
                    endpoint: endpoint.clone(),
                    token: run.token.clone(),
                    backend: run.backend,
                    wait,
                    group: None,
                };
                let (ctx, stop) = (&ctx, &threads_stop);
                s.spawn(move || benchworker::serve::serve(ctx, &opts, stop))
            })
            .collect();
        // Peers are told to stop only when training ended as asked (threads
        // stop below in any case).
        let result = learner.run(hooks, stop, !run.bind.is_empty());
        threads_stop.store(true, Ordering::Relaxed);
        let report = ThreadsReport {
            actors: join_all(actors, "an actor"),
            benchworkers: join_all(benches, "a benchworker"),
        };
        result.map(|r| (r, report))
    })
}
