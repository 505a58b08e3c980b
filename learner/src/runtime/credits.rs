//! Credits: which actor may send the next unroll. No I/O and no clock of
//! its own: the caller passes the time and each actor's state.
//!
//! Unrolls in flight (credits held, unrolls queued) never exceed
//! `cluster.max_policy_lag`: each update makes every unroll waiting behind
//! it a version older, so more would mostly be too old when learned from.
//! Nor does an actor have more than `cluster.actor_credits` in flight.

use std::time::{Duration, Instant};

/// The limits a credit is handed out within.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Unrolls in flight over all actors (`cluster.max_policy_lag`, at
    /// least 1).
    pub cap: u64,
    /// Unrolls in flight per actor (`cluster.actor_credits`).
    pub per_actor: u64,
    /// An actor silent this long may be gone: it comes after those heard
    /// from lately.
    pub quiet: Duration,
}

impl Limits {
    pub fn of(c: &common::config::ClusterConfig) -> Limits {
        Limits {
            cap: c.max_policy_lag.max(1) as u64,
            per_actor: c.actor_credits as u64,
            quiet: Duration::from_secs_f64(2.0 * c.heartbeat_s),
        }
    }
}

/// What the choice reads of an actor.
#[derive(Debug, Clone, Copy)]
pub struct Actor {
    pub id: u64,
    /// Its unrolls in flight: the credits it holds and its queued unrolls.
    pub in_flight: u64,
    pub last_seen: Instant,
    /// When its latest unroll came (or it joined).
    pub last_unroll: Instant,
}

/// The actor that gets the next free credit, by its index in `actors`, or
/// `None` when `in_flight` unrolls already reach the cap or every actor
/// has its share. The actor with the fewest in flight comes first; among
/// equals, one heard from lately before one that may be gone, then the one
/// whose last unroll came longest ago (actors beyond the cap take turns),
/// then the lowest id.
pub fn next(limits: &Limits, now: Instant, in_flight: u64, actors: &[Actor]) -> Option<usize> {
    if in_flight >= limits.cap {
        return None;
    }
    actors
        .iter()
        .enumerate()
        .filter(|(_, a)| a.in_flight < limits.per_actor)
        .min_by_key(|(_, a)| {
            let quiet = now.saturating_duration_since(a.last_seen) > limits.quiet;
            (a.in_flight, quiet, a.last_unroll, a.id)
        })
        .map(|(i, _)| i)
}

/// Whether some actor's share is not full. Asked once [`next`] finds
/// nobody: such an actor then waits because the cap is reached.
pub fn any_waiting(limits: &Limits, actors: &[Actor]) -> bool {
    actors.iter().any(|a| a.in_flight < limits.per_actor)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(cap: u64, per_actor: u64) -> Limits {
        Limits {
            cap,
            per_actor,
            quiet: Duration::from_secs(2),
        }
    }

    /// Actors heard from at `t0`, their last unrolls `unroll_s` after it.
    fn actors(t0: Instant, in_flight: &[u64], unroll_s: &[u64]) -> Vec<Actor> {
        in_flight
            .iter()
            .zip(unroll_s)
            .enumerate()
            .map(|(i, (&n, &s))| Actor {
                id: i as u64 + 1,
                in_flight: n,
                last_seen: t0,
                last_unroll: t0 + Duration::from_secs(s),
            })
            .collect()
    }

    /// Grants credits one by one, as the runtime does, until none is free:
    /// the actors' indices in order.
    fn grants(l: &Limits, now: Instant, mut a: Vec<Actor>) -> Vec<usize> {
        let mut out = Vec::new();
        let mut total: u64 = a.iter().map(|a| a.in_flight).sum();
        while let Some(i) = next(l, now, total, &a) {
            a[i].in_flight += 1;
            total += 1;
            out.push(i);
        }
        out
    }

    #[test]
    fn credits_go_to_the_fewest_in_flight_within_both_limits() {
        let t0 = Instant::now();
        // Cap 3, two each: the idle actors first, then the one with one.
        let a = actors(t0, &[1, 0, 0], &[0, 0, 0]);
        assert_eq!(grants(&limits(3, 2), t0, a.clone()), [1, 2]);
        // A cap of 5 fills every share (2 each) but the one left.
        assert_eq!(grants(&limits(5, 2), t0, a.clone()), [1, 2, 0, 1]);
        // The cap reached: nobody, though shares are free.
        assert_eq!(next(&limits(1, 2), t0, 1, &a), None);
        assert!(any_waiting(&limits(1, 2), &a));
        // Every share full: nobody, whatever the cap.
        let full = actors(t0, &[2, 2], &[0, 0]);
        assert_eq!(next(&limits(100, 2), t0, 4, &full), None);
        assert!(!any_waiting(&limits(100, 2), &full));
    }

    #[test]
    fn among_equals_the_heard_come_first_then_the_longest_waiting() {
        let t0 = Instant::now();
        let now = t0 + Duration::from_secs(10);
        // Equal in flight: the one whose last unroll is oldest.
        let a = actors(now, &[0, 0, 0], &[5, 1, 3]);
        assert_eq!(next(&limits(9, 2), now, 0, &a), Some(1));
        // The same, but that one silent past `quiet`: the next oldest.
        let mut b = a.clone();
        b[1].last_seen = t0;
        assert_eq!(next(&limits(9, 2), now, 0, &b), Some(2));
        // All else equal: the lowest id.
        let c = actors(now, &[0, 0], &[4, 4]);
        assert_eq!(next(&limits(9, 2), now, 0, &c), Some(0));
        // Taking turns: with one credit in all, each grant of a round goes
        // to the one that waited longest.
        let mut d = actors(now, &[0, 0, 0], &[3, 1, 2]);
        let l = limits(1, 1);
        let mut order = Vec::new();
        for round in 0..3u64 {
            let i = next(&l, now, 0, &d).unwrap();
            order.push(i);
            d[i].last_unroll = now + Duration::from_secs(10 + round);
        }
        assert_eq!(order, [1, 2, 0]);
    }
}
