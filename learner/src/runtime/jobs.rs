//! Jobs: which plan goes to which benchworker (requeued plans first,
//! never to one that failed them, plans wider than a benchworker wait for a
//! wider one), what a measurement or a failure does, benchworkers set
//! aside after failures, and multi-host groups' NCCL ids.

use std::time::{Duration, Instant};

use net::protocol::{Message, Role};

use super::core::{secs, Coordinator, Peer};
use super::ToTrainer;
use crate::train::Pick;

/// Jobs that fail this many times in a row stop training.
pub(super) const MAX_JOB_FAILURES: usize = 10;

/// Failures in a row after which a benchworker gets no job while another
/// one has not failed so (a host whose GPU runs out of memory fails fast
/// and would otherwise take every job, and stop the run).
pub(super) const FAILING_AFTER: usize = 3;

/// How long such a benchworker sits out after each failure: then it is
/// tried again (a transient fault passes; a wide plan that only it can
/// measure waits no longer).
pub(super) const SIDELINED: Duration = Duration::from_secs(30);

/// What [`Coordinator::dispatch`] left waiting for a benchworker's width.
pub(super) enum Waiting {
    /// Nothing, or nothing it could tell (no benchworker idle, or one
    /// still setting up that may be wide enough).
    No,
    /// A plan of this many devices, wider than every benchworker (the
    /// widest of them measures up to the second).
    TooWide(usize, usize),
}

/// A multi-host benchworker group's unique id, as its rank 0 posted it.
pub(super) struct GroupId {
    /// Rank 0's peer key: the id dies with it.
    pub(super) leader: Vec<u8>,
    pub(super) ranks: Vec<u32>,
    pub(super) unique_id: Vec<u8>,
}

/// Bytes of an NCCL unique id.
pub(super) const NCCL_ID_BYTES: usize = 128;

/// A measurement job out on a benchworker.
pub(super) struct Job {
    pub(super) pick: Pick,
    pub(super) sent: Instant,
    /// The benchworker measuring it, and those that failed it before.
    pub(super) worker: u64,
    pub(super) tried: Vec<u64>,
}

/// A plan to measure again, with the benchworkers that failed it.
pub(super) struct Requeued {
    pub(super) pick: Pick,
    pub(super) tried: Vec<u64>,
}

impl Job {
    /// This job's plan to measure again, its benchworker among those that
    /// failed it.
    pub(super) fn requeued(self) -> Requeued {
        let mut tried = self.tried;
        tried.push(self.worker);
        Requeued {
            pick: self.pick,
            tried,
        }
    }
}

impl Coordinator {
    /// A benchworker's measurement of `job`: checked, then handed to the
    /// trainer, which makes it durable before it is acknowledged.
    pub(super) fn on_measurement(
        &mut self,
        now: Instant,
        from: Vec<u8>,
        job: u64,
        measurement: common::Measurement,
    ) -> anyhow::Result<()> {
        self.release_job(job);
        // A job re-queued after its benchworker went quiet may come back
        // twice: the second result is not counted.
        let Some(j) = self.jobs.remove(&job) else {
            self.report.unexpected += 1;
            let said = || format!("a measurement for job {job}, which is not out: dropped");
            self.warner.warn("unknown job", now, said);
            return Ok(());
        };
        let devices = self.setup.task_devices[j.pick.task];
        if let Err(e) = measurement.validate(devices) {
            let said = || format!("job {job}: malformed measurement: {e}");
            self.warner.warn("malformed measurement", now, said);
            return self.job_failed(now, j, e.to_string());
        }
        self.last_progress = now;
        self.job_failures = 0;
        if let Some(p) = self.peers.get_mut(&from) {
            p.failed_in_a_row = 0;
            p.sidelined_until = None;
            p.resynced = false;
        }
        self.hand_to_trainer(ToTrainer::Measured {
            from,
            job,
            pick: j.pick,
            measurement,
        });
        Ok(())
    }

    /// A group's rank 0 posted its NCCL unique id: kept, and handed to the
    /// ranks that wait for it.
    pub(super) fn on_nccl_id(
        &mut self,
        from: Vec<u8>,
        group: String,
        ranks: Vec<u32>,
        unique_id: Vec<u8>,
    ) {
        if unique_id.len() != NCCL_ID_BYTES || ranks.is_empty() || ranks.contains(&0) {
            self.report.unexpected += 1;
            tracing::warn!(
                "group {group}: malformed NCCL id ({} bytes, ranks {ranks:?}) dropped",
                unique_id.len()
            );
            return;
        }
        tracing::info!("group {group}: rank 0 posted its NCCL id (GPUs per rank {ranks:?})");
        self.groups.insert(
            group.clone(),
            GroupId {
                leader: from,
                ranks,
                unique_id,
            },
        );
        let waiting: Vec<Vec<u8>> = self
            .peers
            .iter()
            .filter(|(_, p)| p.awaits_group.as_deref() == Some(group.as_str()))
            .map(|(k, _)| k.clone())
            .collect();
        for member in waiting {
            self.hand_group_id(&member, &group);
        }
    }

    /// A benchworker is ready for jobs, of plans up to `max_devices` wide.
    pub(super) fn on_ready(&mut self, from: &[u8], max_devices: Option<usize>) {
        let Some(peer) = self.peers.get_mut(from) else {
            return;
        };
        if !peer.ready || peer.max_devices != max_devices {
            peer.ready = true;
            peer.max_devices = max_devices;
            self.wide_since = None;
            if let Some(m) = max_devices {
                tracing::info!(
                    "Benchworker {} measures plans of up to {m} devices",
                    peer.id
                );
            }
        }
    }

    /// The benchworker holding `job` is free again (a late answer to a job
    /// that timed out does not free it from the job it holds now).
    pub(super) fn release_job(&mut self, job: u64) {
        if let Some(p) = self.peers.values_mut().find(|p| p.job == Some(job)) {
            p.job = None;
            p.late_since = None;
        }
    }

    /// Sends a group member its group's NCCL unique id.
    pub(super) fn hand_group_id(&mut self, to: &[u8], group: &str) {
        let Some(g) = self.groups.get(group) else {
            return;
        };
        let message = Message::NcclId {
            group: group.to_string(),
            ranks: g.ranks.clone(),
            unique_id: g.unique_id.clone(),
        };
        if let Some(p) = self.peers.get_mut(to) {
            p.awaits_group = None;
        }
        self.report.group_ids_sent += 1;
        self.send(to, message);
    }

    /// A job failed: its benchworker may be set aside, and the plan is
    /// measured again elsewhere. An error once [`MAX_JOB_FAILURES`] jobs
    /// failed in a row.
    pub(super) fn job_failed(
        &mut self,
        now: Instant,
        job: Job,
        error: String,
    ) -> anyhow::Result<()> {
        self.report.failed_jobs += 1;
        self.job_failures += 1;
        if let Some(p) = self.peers.values_mut().find(|p| p.id == job.worker) {
            p.failed_in_a_row += 1;
            p.resynced = false;
            if p.failed_in_a_row >= FAILING_AFTER {
                p.sidelined_until = Some(now + SIDELINED);
                tracing::warn!(
                    "benchworker {} failed {} jobs in a row (the last: {error}): it gets none \
                     for {} s while another benchworker is sound",
                    p.id,
                    p.failed_in_a_row,
                    SIDELINED.as_secs()
                );
            }
        }
        self.requeue.push_back(job.requeued());
        anyhow::ensure!(
            self.job_failures < MAX_JOB_FAILURES,
            "{MAX_JOB_FAILURES} measurement jobs failed in a row; the last: {error}"
        );
        Ok(())
    }

    /// Hands the round's plans to idle benchworkers, each to one that can
    /// measure a plan of its width (the narrowest such, so that wide ones
    /// stay free for wide plans): a plan to measure again first (it waits
    /// for such a benchworker to be idle), then the round's first plans
    /// whose tasks an idle one can take. A plan wider than every
    /// benchworker connected, none of them still setting up, waits
    /// `cluster.peer_timeout_s` for a wide one to join, then goes to any:
    /// it fails there with the reason, and failures enough in a row stop
    /// the training with it. Returns whether it sent a job.
    pub(super) fn dispatch(&mut self, now: Instant) -> bool {
        let patience = secs(self.setup.cluster.peer_timeout_s);
        let waited = self
            .wide_since
            .is_some_and(|t| now.saturating_duration_since(t) >= patience);
        let (sent, waiting) = self.dispatch_some(now, waited);
        if let (Waiting::TooWide(devices, widest), None) = (waiting, self.wide_since) {
            tracing::warn!(
                "a plan of {devices} devices waits for a benchworker that wide (those \
                 connected measure up to {widest}); in {:.0} s it goes to a narrower one \
                 and fails there",
                patience.as_secs_f64()
            );
            self.wide_since = Some(now);
        }
        sent
    }

    /// [`Coordinator::dispatch`]'s work: whether it sent a job, and what
    /// waits for a benchworker's width. `waited`: plans wider than every
    /// benchworker have waited long enough and go to any.
    fn dispatch_some(&mut self, now: Instant, waited: bool) -> (bool, Waiting) {
        // Which benchworkers are ready, and how wide, does not change while
        // jobs go out; only which are idle.
        let widest = self
            .peers
            .values()
            .filter(|p| p.role == Role::Benchworker && p.ready)
            .try_fold(0, |w, p| p.max_devices.map(|m| w.max(m)));
        let takes = |max: Option<usize>, devices: usize| takes(max, devices, widest, waited);
        // A benchworker still setting up may be the wide one.
        let setting_up = self
            .peers
            .values()
            .any(|p| p.role == Role::Benchworker && !p.ready);
        let too_wide = |devices: usize| match widest {
            Some(w) if devices > w && !setting_up => Waiting::TooWide(devices, w),
            _ => Waiting::No,
        };
        let mut sent = false;
        loop {
            let idle = self.idle_benchworkers(now);
            if idle.is_empty() {
                return (sent, Waiting::No);
            }
            let fits = |devices: usize| idle.iter().any(|w| takes(w.2, devices));
            let (pick, tried) = match self.requeue.front() {
                Some(r) if !fits(r.pick.plan.devices) => {
                    return (sent, too_wide(r.pick.plan.devices))
                }
                Some(_) => {
                    let r = self.requeue.pop_front().expect("a requeued plan");
                    (r.pick, r.tried)
                }
                None => match self.picks.iter().position(|p| fits(p.plan.devices)) {
                    Some(i) => (self.picks.remove(i).expect("a pick"), Vec::new()),
                    None => {
                        let mut wide = self.picks.iter().map(|p| too_wide(p.plan.devices));
                        let waiting = wide.find(|w| matches!(w, Waiting::TooWide(..)));
                        return (sent, waiting.unwrap_or(Waiting::No));
                    }
                },
            };
            // Among those that can take it, one that has not failed it, the
            // narrowest.
            let widths: Vec<(u64, Option<usize>)> = idle.iter().map(|w| (w.1, w.2)).collect();
            let chosen = choose(&widths, pick.plan.devices, &tried, takes);
            let i = chosen.expect("an idle benchworker takes it: checked above");
            self.send_job(now, &idle[i].0, idle[i].1, pick, tried);
            sent = true;
        }
    }

    /// Ready benchworkers without a job as `(key, id, max devices)`; while
    /// a sound one is among all ready ones, those failing job after job
    /// sit out.
    fn idle_benchworkers(&self, now: Instant) -> Vec<(Vec<u8>, u64, Option<usize>)> {
        let sound = |p: &Peer| p.sidelined_until.is_none_or(|t| now >= t);
        let any_sound = self
            .peers
            .values()
            .any(|p| p.role == Role::Benchworker && p.ready && sound(p));
        self.peers
            .iter()
            .filter(|(_, p)| p.role == Role::Benchworker && p.ready && p.job.is_none())
            .filter(|(_, p)| !any_sound || sound(p))
            .map(|(k, p)| (k.clone(), p.id, p.max_devices))
            .collect()
    }

    /// Sends `pick` to the benchworker `to` (numbered `worker`).
    fn send_job(&mut self, now: Instant, to: &[u8], worker: u64, pick: Pick, tried: Vec<u64>) {
        let job = self.next_job;
        self.next_job += 1;
        let message = Message::MeasureJob {
            job,
            task: pick.task as u32,
            assignment: pick.plan.assignment.iter().map(|&d| d as u32).collect(),
        };
        self.jobs.insert(
            job,
            Job {
                pick,
                sent: now,
                worker,
                tried,
            },
        );
        if let Some(p) = self.peers.get_mut(to) {
            p.job = Some(job);
        }
        self.send(to, message);
    }
}

/// Whether a benchworker measuring plans of up to `max` devices (`None`:
/// any) takes a plan of `devices`: when it fits, or when the plan has
/// waited long enough (`waited`) for a benchworker wider than the widest
/// ready one (`widest`; `None`: one of any width), to fail there with the
/// reason.
pub(super) fn takes(
    max: Option<usize>,
    devices: usize,
    widest: Option<usize>,
    waited: bool,
) -> bool {
    let fits = |most: Option<usize>| most.is_none_or(|m| devices <= m);
    fits(max) || (waited && !fits(widest))
}

/// Among idle benchworkers `(id, max devices)`, the index of the one a
/// plan of `devices` goes to: of those that take it, one that has not
/// failed it (`tried`), then the narrowest (a wide one stays free for wide
/// plans), then the first.
pub(super) fn choose(
    idle: &[(u64, Option<usize>)],
    devices: usize,
    tried: &[u64],
    takes: impl Fn(Option<usize>, usize) -> bool,
) -> Option<usize> {
    idle.iter()
        .enumerate()
        .filter(|(_, w)| takes(w.1, devices))
        .min_by_key(|(_, w)| (tried.contains(&w.0), w.1.unwrap_or(usize::MAX)))
        .map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plan_goes_where_it_fits_or_anywhere_once_it_waited_for_a_wider_one() {
        // Fits: no limit, or within it.
        assert!(takes(None, 64, Some(8), false));
        assert!(takes(Some(8), 8, Some(8), false));
        assert!(!takes(Some(4), 8, Some(8), false));
        // Wider than every ready benchworker: waits, then goes to any.
        assert!(!takes(Some(4), 16, Some(8), false));
        assert!(takes(Some(4), 16, Some(8), true));
        // Having waited changes nothing while some benchworker fits it.
        assert!(!takes(Some(4), 8, Some(8), true));
        assert!(!takes(Some(4), 8, None, true));
    }

    #[test]
    fn the_narrowest_benchworker_that_has_not_failed_the_plan_measures_it() {
        let takes = |max: Option<usize>, devices: usize| takes(max, devices, Some(16), false);
        let idle = [(1, Some(16)), (2, Some(4)), (3, None), (4, Some(8))];
        // Narrowest that fits: 4 devices on the 4-wide one.
        assert_eq!(choose(&idle, 4, &[], takes), Some(1));
        // Eight: the 8-wide one, not the 16-wide or the unlimited one.
        assert_eq!(choose(&idle, 8, &[], takes), Some(3));
        // One that failed it comes after every other that takes it.
        assert_eq!(choose(&idle, 8, &[4], takes), Some(0));
        assert_eq!(choose(&idle, 8, &[4, 1], takes), Some(2));
        // All failed it: the narrowest still.
        assert_eq!(choose(&idle, 8, &[1, 3, 4], takes), Some(3));
        // None takes it.
        assert_eq!(choose(&idle[1..2], 8, &[], takes), None);
    }
}
