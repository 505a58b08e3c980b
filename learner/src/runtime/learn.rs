//! The networks' thread: DreamShard's Algorithm 1 with its three loops
//! overlapped, fed by the socket thread. Each round it draws the plans to
//! measure, makes each measurement durable before it counts, takes cost
//! steps as measurements arrive, publishes the round's cost network, and
//! learns from unrolls until the round's policy updates are done.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use crossbeam::channel::{Receiver, RecvTimeoutError, Sender, TryRecvError};
use model::loss::CostSample;
use model::wire::export;
use net::protocol::{Message, Weights};

use super::{FromTrainer, Queued, ToTrainer};
use crate::train::{Hooks, Trainer};

/// How long the thread waits for work when it has none.
const IDLE_WAIT: Duration = Duration::from_millis(20);

/// The networks' side of a cluster run.
pub(super) struct Learn<'t, 'a> {
    pub(super) trainer: &'t mut Trainer<'a>,
    to_io: Sender<FromTrainer>,
    /// Wakes the socket thread after each word sent to it.
    wake: zmq::Socket,
    inbox: Receiver<ToTrainer>,
    /// Unrolls waiting for an update.
    queue: VecDeque<Queued>,
    /// The version published when the current round's cost steps were done:
    /// older unrolls were acted on a superseded cost network.
    round_version: Option<u64>,
    /// The round whose plans the socket thread has.
    picks_sent: Option<usize>,
    /// Whether the socket thread has ended (its result says why).
    io_ended: bool,
    /// Unrolls learned from at each policy lag.
    pub(super) lags: BTreeMap<u64, u64>,
    /// Unrolls dropped as acted with weights too old.
    pub(super) stale_unrolls: u64,
}

impl<'t, 'a> Learn<'t, 'a> {
    pub(super) fn new(
        trainer: &'t mut Trainer<'a>,
        to_io: Sender<FromTrainer>,
        wake: zmq::Socket,
        inbox: Receiver<ToTrainer>,
    ) -> Self {
        Learn {
            trainer,
            to_io,
            wake,
            inbox,
            queue: VecDeque::new(),
            round_version: None,
            picks_sent: None,
            io_ended: false,
            lags: BTreeMap::new(),
            stale_unrolls: 0,
        }
    }

    /// Tells the socket thread, and wakes it. A socket thread that has
    /// ended is not waited for: its result says why.
    pub(super) fn tell(&mut self, word: FromTrainer) {
        if self.to_io.send(word).is_err() {
            self.io_ended = true;
            return;
        }
        let _ = self.wake.send(&[][..], zmq::DONTWAIT);
    }

    /// Runs until every configured round is done, `stop` is set, or the
    /// socket thread ends.
    pub(super) fn run(
        &mut self,
        hooks: &mut Hooks,
        stop: &std::sync::atomic::AtomicBool,
    ) -> anyhow::Result<()> {
        use std::sync::atomic::Ordering;
        // Actors take version 0 for "no weights yet".
        self.trainer.counters.policy_version += 1;
        self.publish();
        while !self.trainer.done() && !stop.load(Ordering::Relaxed) && !self.io_ended {
            self.stock_picks();
            loop {
                match self.inbox.try_recv() {
                    Ok(work) => self.take(work, hooks)?,
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        self.io_ended = true;
                        break;
                    }
                }
            }
            if self.io_ended || self.learn(hooks)? {
                continue;
            }
            match self.inbox.recv_timeout(IDLE_WAIT) {
                Ok(work) => self.take(work, hooks)?,
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => self.io_ended = true,
            }
        }
        Ok(())
    }

    /// Hands the socket thread the round's plans to measure, once a round,
    /// each as soon as it is drawn: the first places of the round not
    /// measured, as many as the round lacks (a round resumed after a crash
    /// measures exactly what it lacks).
    fn stock_picks(&mut self) {
        let round = self.trainer.counters.iteration;
        if self.picks_sent == Some(round) {
            return;
        }
        self.picks_sent = Some(round);
        let m = self.trainer.config().train.measure_per_iteration;
        let need = ((round + 1) * m).saturating_sub(self.trainer.buffer.len());
        for j in self.trainer.free_places(need) {
            let pick = self.trainer.pick_plan(j);
            self.tell(FromTrainer::Picks(vec![pick]));
        }
    }

    /// Work from the socket thread.
    pub(super) fn take(&mut self, work: ToTrainer, hooks: &mut Hooks) -> anyhow::Result<()> {
        match work {
            ToTrainer::Unroll(q) => self.queue.push_back(q),
            ToTrainer::Measured {
                from,
                job,
                pick,
                measurement,
            } => {
                let task = &self.trainer.tasks()[pick.task];
                let sample = CostSample::new(task, &pick.plan, measurement).of_pick(pick.id);
                (hooks.measured)(&sample)?;
                self.trainer.record(pick.predicted_ms, sample);
                // Durable now: the benchworker may forget it.
                self.tell(FromTrainer::Durable { to: from, job });
            }
        }
        Ok(())
    }

    /// Sends the current networks to the socket thread.
    fn publish(&mut self) {
        let version = self.trainer.counters.policy_version;
        let weights = Message::Weights(Weights {
            version,
            policy: export(&self.trainer.model.policy_vs),
            cost: export(&self.trainer.model.cost_vs),
        });
        self.tell(FromTrainer::Weights(version, Arc::new(weights)));
    }

    /// An unroll is done with: its credit is free.
    fn consumed(&mut self, q: &Queued) {
        self.tell(FromTrainer::Consumed { session: q.session });
    }

    /// Does the next piece of learning the round allows; false when there
    /// is nothing to do until work arrives.
    pub(super) fn learn(&mut self, hooks: &mut Hooks) -> anyhow::Result<bool> {
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
            self.tell(FromTrainer::Stepped);
            return Ok(true);
        }
        if measured < (round + 1) * m {
            return Ok(false);
        }
        let round_version = self.round_version.unwrap_or_else(|| self.publish_round());
        if self.trainer.counters.policy_updates < (round + 1) * ps {
            let Some(q) = self.queue.pop_front() else {
                return Ok(false);
            };
            self.learn_from(q, round_version, hooks)?;
            return Ok(true);
        }
        // The round is complete.
        self.trainer.finish_round();
        self.round_version = None;
        (hooks.round_done)(self.trainer)?;
        Ok(true)
    }

    /// The round's cost network is ready: published once, with a new
    /// version; unrolls acted on the previous one are dropped.
    fn publish_round(&mut self) -> u64 {
        self.trainer.counters.policy_version += 1;
        self.publish();
        let v = self.trainer.counters.policy_version;
        self.trainer.counters.dropped_unrolls += self.queue.len();
        for q in std::mem::take(&mut self.queue) {
            self.consumed(&q);
        }
        self.round_version = Some(v);
        v
    }

    /// One policy update from `q`, unless it is too old: acted on a
    /// superseded cost network or more than `cluster.max_policy_lag`
    /// versions ago.
    fn learn_from(
        &mut self,
        q: Queued,
        round_version: u64,
        hooks: &mut Hooks,
    ) -> anyhow::Result<()> {
        let lag = self.trainer.counters.policy_version.saturating_sub(q.acted);
        let max_lag = self.trainer.config().cluster.max_policy_lag as u64;
        if q.acted < round_version || lag > max_lag {
            self.trainer.counters.dropped_unrolls += 1;
            if q.acted >= round_version {
                self.stale_unrolls += 1;
            }
        } else {
            let before = self.trainer.counters.policy_version;
            let line = self.trainer.policy_update(q.task, &q.unroll, lag);
            *self.lags.entry(lag).or_default() += 1;
            (hooks.metrics)(&line)?;
            if self.trainer.counters.policy_version != before {
                self.publish();
            }
        }
        // After the update: the credit comes with the new weights.
        self.consumed(&q);
        Ok(())
    }
}
