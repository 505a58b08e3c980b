//! The fusion sweep: how much cheaper one fused call over `k` tables is than
//! `k` calls over one table each, on any backend. The figure FBGEMM's
//! table-batched kernel exists for, and the one the `sim` backend's fusion
//! model must agree with (docs/gpu.md records it on a GPU).

use rand::seq::index::sample;
use rand::SeedableRng;
use serde::Serialize;

use common::{Plan, Table};

use crate::oracle::{Oracle, OracleError};

/// One mix of `k` tables, measured fused and one by one on one device.
#[derive(Debug, Clone, Serialize)]
pub struct FusionRow {
    pub tables: usize,
    pub mix: usize,
    pub fused_fwd_ms: f64,
    pub fused_bwd_ms: f64,
    /// Sums over the tables measured alone.
    pub single_fwd_ms: f64,
    pub single_bwd_ms: f64,
}

impl FusionRow {
    /// Σ single / fused, forward.
    pub fn fwd_speedup(&self) -> f64 {
        self.single_fwd_ms / self.fused_fwd_ms
    }

    pub fn bwd_speedup(&self) -> f64 {
        self.single_bwd_ms / self.fused_bwd_ms
    }
}

fn one_device(tables: usize) -> Plan {
    Plan {
        devices: 1,
        assignment: vec![0; tables],
    }
}

/// For each size in `sizes`, `mixes` random mixes of that many distinct
/// tables of `pool` (seeded), each measured as one fused call and as one
/// call per table. `progress` is told after each mix.
pub fn fusion_sweep(
    oracle: &mut dyn Oracle,
    pool: &[Table],
    sizes: &[usize],
    mixes: usize,
    seed: u64,
    mut progress: impl FnMut(),
) -> Result<Vec<FusionRow>, OracleError> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut rows = Vec::new();
    for &k in sizes {
        if k == 0 || k > pool.len() {
            return Err(OracleError::Backend {
                backend: "sweep",
                message: format!("a mix of {k} tables from a pool of {}", pool.len()),
            });
        }
        for mix in 0..mixes {
            let tables: Vec<Table> = sample(&mut rng, pool.len(), k)
                .into_iter()
                .map(|i| pool[i].clone())
                .collect();
            let fused = oracle.measure(&tables, &one_device(k))?;
            let (mut single_fwd_ms, mut single_bwd_ms) = (0.0, 0.0);
            for t in &tables {
                let alone = oracle.measure(std::slice::from_ref(t), &one_device(1))?;
                single_fwd_ms += alone.devices[0].fwd_ms;
                single_bwd_ms += alone.devices[0].bwd_ms;
            }
            rows.push(FusionRow {
                tables: k,
                mix,
                fused_fwd_ms: fused.devices[0].fwd_ms,
                fused_bwd_ms: fused.devices[0].bwd_ms,
                single_fwd_ms,
                single_bwd_ms,
            });
            progress();
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use common::config::SimConfig;
    use common::MemoryModel;

    /// `sim` runs a device's tables apart when that is faster (as a runtime
    /// that measured both would): fusion never costs, and for small groups
    /// it saves the floors of the calls it merges.
    #[test]
    fn sim_fusion_is_free_for_one_table_and_a_speedup_for_many() {
        let pool = crate::test_pool(60, 1);
        let mut oracle = crate::sim::SimOracle::new(SimConfig::default(), MemoryModel::default());
        let mut told = 0;
        let rows = fusion_sweep(&mut oracle, &pool, &[1, 4, 32], 2, 0, || told += 1).unwrap();
        assert_eq!((rows.len(), told), (6, 6));
        let total =
            |r: &FusionRow| (r.single_fwd_ms + r.single_bwd_ms) / (r.fused_fwd_ms + r.fused_bwd_ms);
        for r in &rows {
            if r.tables == 1 {
                assert!((r.fwd_speedup() - 1.0).abs() < 1e-9, "{r:?}");
            } else {
                assert!(total(r) >= 1.0 - 1e-9, "{r:?}");
            }
        }
        assert!(
            rows.iter().any(|r| r.tables == 4 && total(r) > 1.2),
            "{rows:?}"
        );
        assert!(fusion_sweep(&mut oracle, &pool, &[61], 1, 0, || {}).is_err());
    }
}
