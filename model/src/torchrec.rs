//! TorchRec's planner, table-wise: its perf estimator and its
//! `GreedyPerfPartitioner`, rewritten from the public source
//! (`torchrec/distributed/planner/shard_estimators.py`, `constants.py`,
//! `partitioners.py`) for the one case embshard places: whole tables on the
//! HBM of one rank each, with the fused kernel.
//!
//! Estimator, per table with pooling `L`, dim `d`, local batch `b`, world `W`:
//! - input read `b·W·L·8` (int64 indices), lookups `b·W·L·max(d, 32)·bytes`,
//!   output `b·W·d·bytes`;
//! - block penalty 1 for `d ≥ 128`, 1.15 for `64 ≤ d < 128`, 1.75 below;
//! - `fwd_compute = (read + lookups + output)·penalty / HBM_MEM_BW`,
//!   `fwd_comms = output / INTRA_NODE_BANDWIDTH`,
//!   `bwd_compute = 2·fwd_compute`, `bwd_comms = fwd_comms`.
//!
//! Partitioner: tables by storage, largest first (stable); each goes to the
//! rank with the lowest accumulated perf (ties: lower rank) that still has
//! room; no room anywhere is a failure.

use common::{MemoryModel, Plan, Table};

pub use common::published::{
    BIGINT_DTYPE, BWD_COMPUTE_MULTIPLIER, FULL_BLOCK_EMB_DIM, HALF_BLOCK_PENALTY, HBM_MEM_BW,
    INTRA_NODE_BANDWIDTH, QUARTER_BLOCK_PENALTY,
};

/// TorchRec's estimate for one table-wise shard, in ms.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Perf {
    pub fwd_compute: f64,
    pub fwd_comms: f64,
    pub bwd_compute: f64,
    pub bwd_comms: f64,
}

impl Perf {
    pub fn total(&self) -> f64 {
        self.fwd_compute + self.bwd_compute + self.fwd_comms + self.bwd_comms
    }
}

/// Estimates one table placed whole on one of `world_size` ranks, each with
/// a local batch of `local_batch` samples; `dtype_bytes` for weights and
/// outputs alike (no communication quantisation).
pub fn estimate(t: &Table, local_batch: f64, world_size: usize, dtype_bytes: f64) -> Perf {
    let w = world_size as f64;
    let inputs = local_batch * t.pooling_factor;
    let outputs = local_batch;
    let input_read = (inputs * w * BIGINT_DTYPE).ceil();
    let lookup = inputs * w * t.dim.max(32) as f64 * dtype_bytes;
    let output_write = outputs * w * t.dim as f64 * dtype_bytes;
    let penalty = if t.dim >= FULL_BLOCK_EMB_DIM {
        1.0
    } else if t.dim >= 64 {
        HALF_BLOCK_PENALTY
    } else {
        QUARTER_BLOCK_PENALTY
    };
    let fwd_compute = (input_read + lookup + output_write) * penalty / HBM_MEM_BW;
    let fwd_comms = output_write / INTRA_NODE_BANDWIDTH;
    Perf {
        fwd_compute,
        fwd_comms,
        bwd_compute: fwd_compute * BWD_COMPUTE_MULTIPLIER,
        bwd_comms: fwd_comms,
    }
}

/// The greedy perf partitioner over a task; `None` when a table fits no rank.
pub fn partition(
    tables: &[Table],
    devices: usize,
    cap_bytes: u64,
    mem: &MemoryModel,
    global_batch: u64,
) -> Option<Plan> {
    let local_batch = global_batch as f64 / devices as f64;
    let bytes: Vec<u64> = tables.iter().map(|t| mem.table_bytes(t)).collect();
    let mut order: Vec<usize> = (0..tables.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(bytes[i]));
    let mut perf = vec![0.0f64; devices];
    let mut free = vec![cap_bytes; devices];
    let mut assignment = vec![0; tables.len()];
    for i in order {
        let p = estimate(
            &tables[i],
            local_batch,
            devices,
            mem.precision.bytes() as f64,
        )
        .total();
        let mut ranks: Vec<usize> = (0..devices).collect();
        ranks.sort_by(|&a, &b| perf[a].total_cmp(&perf[b]).then(a.cmp(&b)));
        let d = ranks.into_iter().find(|&d| free[d] >= bytes[i])?;
        free[d] -= bytes[i];
        perf[d] += p;
        assignment[i] = d;
    }
    Some(Plan {
        devices,
        assignment,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use common::{Optimizer, Precision};

    fn table(rows: u64, dim: u32, pooling: f64) -> Table {
        Table::cold(format!("r{rows}d{dim}"), rows, dim, pooling)
    }

    /// TorchRec's own unit test (`test_shard_estimators.py`, one table of
    /// 100 rows × dim 10, fp32, world 2, batch 512, pooling 1).
    #[test]
    fn matches_torchrecs_published_values() {
        let p = estimate(&table(100, 10, 1.0), 512.0, 2, 4.0);
        assert!((p.fwd_compute - 3.27460077428233e-4).abs() < 1e-15, "{p:?}");
        assert!((p.fwd_comms - 6.357828776041667e-5).abs() < 1e-15, "{p:?}");
        assert!((p.bwd_compute - 6.54920154856466e-4).abs() < 1e-15, "{p:?}");
        assert_eq!(p.bwd_comms, p.fwd_comms);
    }

    #[test]
    fn penalties_follow_the_block_width() {
        let at = |d| estimate(&table(100, d, 1.0), 512.0, 2, 4.0).fwd_compute / d.max(32) as f64;
        // Per lookup element, narrower tables pay the larger penalty.
        assert!(at(32) > at(64) && at(64) > at(128));
    }

    #[test]
    fn partitioner_places_the_largest_storage_first() {
        let mem = MemoryModel {
            precision: Precision::Fp32,
            optimizer: Optimizer::Sgd,
        };
        // Given small-to-large, it places t2 (largest) first on rank 0, then
        // t1 on the idle rank 1, then t0 on whichever has less perf so far.
        let tables = vec![
            table(100, 16, 50.0),
            table(2000, 16, 1.0),
            table(9000, 16, 1.0),
        ];
        let plan = partition(&tables, 2, u64::MAX, &mem, 1024).unwrap();
        assert_eq!(plan.assignment[2], 0);
        assert_eq!(plan.assignment[1], 1);
        assert_eq!(
            plan.assignment[0], 0,
            "rank 0 and 1 tie on perf: lower rank"
        );
    }

    #[test]
    fn partitioner_balances_perf_and_respects_memory() {
        let mem = MemoryModel {
            precision: Precision::Fp32,
            optimizer: Optimizer::Sgd,
        };
        let tables: Vec<Table> = (0..6).map(|i| table(1000, 16, 1.0 + i as f64)).collect();
        let plan = partition(&tables, 2, u64::MAX, &mem, 1024).unwrap();
        let groups = plan.groups();
        assert_eq!(groups[0].len(), 3);
        assert_eq!(groups[1].len(), 3);
        // Equal storage: placed in order 0..6, alternating by accumulated perf.
        assert_eq!(plan.assignment[0], 0);
        assert_eq!(plan.assignment[1], 1);
        // A cap of two tables per rank, three ranks: every rank holds two.
        let cap = 2 * mem.table_bytes(&tables[0]);
        let plan = partition(&tables, 3, cap, &mem, 1024).unwrap();
        assert!(plan.fits(&tables, &mem, cap));
        assert!(partition(&tables, 2, cap, &mem, 1024).is_none());
    }
}
