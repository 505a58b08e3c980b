//! Plans of one task among the cost network's training samples, for the
//! pair term of its loss (`train.cost_pair_weight`): each sample's task is
//! known by its tables' features, and [`SameTask`] finds a second measured
//! plan of it.

use model::loss::CostSample;
use rand::Rng;
use std::collections::HashMap;

/// The pools a cost batch draws from, in [`crate::train::Trainer`]'s order:
/// prior measurements, the run's buffer, the focus.
pub type Pools<'s> = [&'s [CostSample]; 3];

/// A key of a sample's task: its device count and its tables' features.
/// Two plans of one task share it; two tasks differ in it unless their
/// tables are the same.
pub fn task_key(s: &CostSample) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ s.placed.devices as u64;
    for table in &s.placed.features {
        for f in table {
            h = (h ^ u64::from(f.to_bits())).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

/// Where each task's samples lie in the pools, grown as they grow.
#[derive(Default)]
pub struct SameTask {
    /// Task key to (pool, index) of its samples.
    groups: HashMap<u64, Vec<(usize, usize)>>,
    /// Samples indexed per pool.
    indexed: [usize; 3],
    /// The task key of each pool's last indexed sample.
    last: [Option<u64>; 3],
}

/// Draws of a partner before settling for a plan equal to the sample's.
const TRIES: usize = 4;

impl SameTask {
    /// Indexes the samples the pools gained since the last call. A pool
    /// shorter than it was, or whose last indexed sample is of another
    /// task, has been replaced: the index starts over.
    pub fn update(&mut self, pools: Pools) {
        let replaced = |k: usize, pool: &[CostSample]| {
            let n = self.indexed[k];
            pool.len() < n || (n > 0 && Some(task_key(&pool[n - 1])) != self.last[k])
        };
        if pools.iter().enumerate().any(|(k, p)| replaced(k, p)) {
            *self = SameTask::default();
        }
        for (k, pool) in pools.iter().enumerate() {
            for (i, s) in pool.iter().enumerate().skip(self.indexed[k]) {
                self.groups.entry(task_key(s)).or_default().push((k, i));
            }
            self.indexed[k] = pool.len();
            self.last[k] = pool.last().map(task_key);
        }
    }

    /// Another measured plan of `s`'s task, drawn at random among those
    /// indexed; `None` if a few draws found none (always, for a task of
    /// one plan).
    pub fn partner<'s>(
        &self,
        s: &CostSample,
        pools: Pools<'s>,
        rng: &mut impl Rng,
    ) -> Option<&'s CostSample> {
        let group = self.groups.get(&task_key(s))?;
        (0..TRIES)
            .map(|_| {
                let (k, i) = group[rng.gen_range(0..group.len())];
                &pools[k][i]
            })
            .find(|p| p.placed.assignment != s.placed.assignment)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use common::{Measurement, Plan, Task};
    use rand::SeedableRng;

    fn sample(task: &Task, assignment: Vec<usize>) -> CostSample {
        let plan = Plan {
            devices: task.devices,
            assignment,
        };
        let m = Measurement {
            cost_ms: 1.0,
            devices: Vec::new(),
        };
        CostSample::new(task, &plan, m)
    }

    /// Four tables on two devices; `seed` sets their rows.
    fn task(seed: u64) -> Task {
        Task {
            name: format!("t{seed}"),
            devices: 2,
            memory_gb: 8.0,
            tables: (0..4)
                .map(|i| common::Table::cold(format!("e{i}"), 1000 * (seed + i), 16, 2.0))
                .collect(),
        }
    }

    #[test]
    fn partners_are_other_plans_of_the_same_task_in_any_pool() {
        let (a, b) = (task(1), task(2));
        let prior = vec![
            sample(&a, vec![0, 0, 1, 1]),
            sample(&b, vec![0, 1, 0, 1]),
            sample(&a, vec![0, 1, 0, 1]),
        ];
        let buffer = vec![sample(&b, vec![1, 1, 0, 0])];
        let focus = vec![sample(&a, vec![1, 0, 1, 0])];
        let mut index = SameTask::default();
        index.update([&prior, &[], &[]]);
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
        // Before the buffer is indexed, b's only plan has no partner.
        assert!(index
            .partner(&prior[1], [&prior, &buffer, &focus], &mut rng)
            .is_none());
        index.update([&prior, &buffer, &focus]);
        let pools: Pools = [&prior, &buffer, &focus];
        let mut seen = Vec::new();
        for _ in 0..64 {
            let p = index.partner(&prior[0], pools, &mut rng).unwrap();
            assert_eq!(task_key(p), task_key(&prior[0]));
            assert_ne!(p.placed.assignment, prior[0].placed.assignment);
            if !seen.contains(&p.placed.assignment) {
                seen.push(p.placed.assignment.clone());
            }
        }
        assert_eq!(
            seen.len(),
            2,
            "both other plans of a, in the prior and the focus"
        );
        let p = index.partner(&prior[1], pools, &mut rng).unwrap();
        assert_eq!(p.placed.assignment, buffer[0].placed.assignment);
        assert_ne!(task_key(&prior[0]), task_key(&prior[1]));
        // A replaced pool is indexed afresh: shorter, or as long with
        // another task's plans.
        let fresh = vec![sample(&b, vec![0, 0, 0, 1])];
        index.update([&fresh, &buffer, &focus]);
        let p = index
            .partner(&buffer[0], [&fresh, &buffer, &focus], &mut rng)
            .unwrap();
        assert_eq!(p.placed.assignment, fresh[0].placed.assignment);
        let other = vec![sample(&a, vec![1, 1, 1, 0])];
        let pools: Pools = [&other, &buffer, &focus];
        index.update(pools);
        let p = index.partner(&focus[0], pools, &mut rng).unwrap();
        assert_eq!(p.placed.assignment, other[0].placed.assignment);
        assert!(index.partner(&buffer[0], pools, &mut rng).is_none());
    }
}
