//! The learner's side of asynchronous training (DESIGN §3, §9): a hub that
//! actors and benchworkers connect to, a coordinator that decides what
//! each peer gets, and a thread that owns the networks and runs
//! DreamShard's Algorithm 1 with the three loops overlapped:
//!
//! - **measuring**: at the start of a round the round's plans are drawn
//!   from the current policy (as many as the round lacks); each idle
//!   benchworker gets one; each measurement goes to the durable cost log
//!   before it counts;
//! - **fitting the cost network**: cost steps follow the measurements as
//!   they arrive (`cost_steps / measure_per_iteration` per measurement);
//! - **improving the policy**: once a round's cost steps are done, the
//!   weights are published with a new version and unrolls acted with older
//!   ones (a superseded cost network) are dropped; each later unroll is one
//!   policy update (V-trace or REINFORCE, `train.update`), and new
//!   weights go out after each. Unrolls more than `max_policy_lag`
//!   versions old are dropped and counted.
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
//! # Threads
//!
//! Two threads share the work, joined by crossbeam channels. The socket
//! thread (`io`) owns the hub and the coordinator: it answers hellos,
//! heartbeats, credits and jobs however long an update takes. The calling
//! thread (`learn`) owns the networks: it draws each round's plans, makes
//! measurements durable, takes cost steps and policy updates, and
//! publishes weights.
//!
//! # Layout
//!
//! - `core`: the coordinator, a function of `(now, message)` to outgoing
//!   messages, plus a tick; no I/O.
//! - `sessions`: a peer's hello and the envelope of its later messages.
//! - `credits`: which actor may send the next unroll.
//! - `jobs`: plans to benchworkers, measurements and failures, groups.
//! - `learn`: the networks' thread.
//! - `io`: the socket thread, and [`Learner`] that starts both.
//! - `cluster`: the run with its peer threads ([`train_cluster`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use model::mdp::Unroll;
use net::protocol::{DropCounts, Message};

mod cluster;
mod core;
mod credits;
mod io;
mod jobs;
mod learn;
mod sessions;

pub use cluster::{train_cluster, ClusterRun, ThreadsReport};
pub(crate) use io::welcome_config;
pub use io::Learner;

use crate::train::Pick;

/// An unroll on its way to an update: in flight until used or dropped.
pub(crate) struct Queued {
    /// The session (hello) of the actor that sent it, whose credit it spent.
    session: u64,
    /// The weights' version it was acted with.
    acted: u64,
    task: usize,
    unroll: Unroll,
}

/// Work the socket thread hands the networks' thread.
pub(crate) enum ToTrainer {
    /// An unroll that spent a credit and checks out.
    Unroll(Queued),
    /// A checked measurement of `job`: to make durable, then acknowledge.
    Measured {
        from: Vec<u8>,
        job: u64,
        pick: Pick,
        measurement: common::Measurement,
    },
}

/// What the networks' thread tells the socket thread.
pub(crate) enum FromTrainer {
    /// Weights of a new version, for actors.
    Weights(u64, Arc<Message>),
    /// More of the round's plans to measure.
    Picks(Vec<Pick>),
    /// An unroll of this session was learned from or dropped: its credit
    /// is free.
    Consumed { session: u64 },
    /// The measurement of `job` is durable: `to` may forget it.
    Durable { to: Vec<u8>, job: u64 },
    /// Cost steps were taken (progress, for the stall watch).
    Stepped,
    /// Training ended as asked: tell peers to stop; with `linger`, answer
    /// latecomers so for two heartbeat periods.
    Finish { linger: bool },
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
    /// Connections closed as they came because the learner's cap on open
    /// connections was reached (`Hub::connection_cap`).
    pub shed_connections: u64,
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

#[cfg(test)]
mod tests;
