//! `sim`: a deterministic model of one training iteration's embedding work on
//! GPUs, built from how FBGEMM's fused table-batched embedding kernel and
//! NCCL's all-to-all behave (DESIGN §6). Nothing here looks at placement
//! methods. The constants ([`common::config::SimConfig`]'s defaults) come
//! from public sources where one exists; the others are stated assumptions:
//!
//! | constant | value | source |
//! |---|---|---|
//! | HBM bandwidth | 897 GiB/s | TorchRec planner `constants.py`, `HBM_MEM_BW` |
//! | gather efficiency | 0.59 | FBGEMM TBE benchmark README: 1198 GB/s forward, read as a share of an A100-80GB's 2039 GB/s peak (assumption: the README does not name the part) |
//! | all-to-all bandwidth | 600 GiB/s | TorchRec `INTRA_NODE_BANDWIDTH` |
//! | index bytes | 8 | TorchRec `BIGINT_DTYPE` |
//! | output bytes | 4 | FBGEMM TBE's default `output_dtype` (fp32) |
//! | block penalties | 1.15 (½ block), 1.75 (¼ block) | TorchRec `HALF_BLOCK_PENALTY`, `QUARTER_BLOCK_PENALTY` |
//! | backward multiplier | 2 | TorchRec `BWD_COMPUTE_MULTIPLIER` |
//! | kernel floor | 0.3 ms | TorchRec PR #2365: TBE calls flat at 0.29–0.32 ms from dim 16 to 1024 |
//! | L2 | 40 MiB | NVIDIA A100 data sheet |
//! | DRAM sector | 32 B | CUDA programming guide (global memory transactions) |
//! | L2 hit cost | 0.35 of an HBM read | assumption (L2 bandwidth is a few times HBM's) |
//! | hot-row contention | +25% backward per share of lookups on rows read > 1024 times | assumption |
//! | all-to-all latency | 0.05 ms | assumption (tens of µs per NCCL collective) |
//! | floor sharpness | 3 | assumption (how fast the floor gives way to work) |
//!
//! # The properties (each has a test below)
//!
//! 1. *Fusion is sub-additive*: a device runs its tables in one kernel call
//!    with one fixed floor; floor and work combine by a soft maximum
//!    (`(floor^k + work^k)^(1/k)`, a norm). Where the penalties of (2) and
//!    (3) would make the fused call slower than one call per table, the
//!    device runs them apart, so it never costs more than its tables alone.
//! 2. *Non-separable*: FBGEMM picks the threads per bag from the call's
//!    widest table (`kThreadGroupSize` from `max_D`), so a narrow table beside
//!    a wide one leaves lanes idle and pays TorchRec's block penalty for the
//!    wide block; the tables of one call share one L2 (3); and small groups
//!    sit under the floor, so adding a small table to a small group is almost
//!    free.
//! 3. *Locality*: a lookup that repeats a row already read this batch hits
//!    L2 with a probability that shrinks as the repeated rows of all tables in
//!    the call outgrow L2, and then costs `l2_hit_cost` of an HBM read.
//! 4. *Communication*: the forward all-to-all sends each peer its
//!    `B/D` samples of every local table, `(B/D)·Σdims·output_bytes` per peer
//!    pair; a rank's transfer takes the larger of what it sends and receives
//!    over its link. The forward collective starts when the slowest rank
//!    arrives, so a rank that finishes its lookups early waits (counted in its
//!    `fwd_comm`); the backward exchange starts together after the dense part.
//! 5. *Backward ≈ 2× forward*: gradient sort, accumulation and the optimizer
//!    update (TorchRec's multiplier), plus contention on very hot rows, whose
//!    long segments are reduced serially.
//! 6. *Deterministic*: no noise by default; with `noise > 0`, seeded
//!    multiplicative log-normal noise per phase.
//! 7. *Magnitude*: 50 DLRM-like tables at B = 65536 on 4 devices take ten to
//!    a few tens of milliseconds per iteration (DreamShard's Figure 1, on
//!    other hardware and tables, shows 36–57 ms).

use common::config::SimConfig;
use common::published::{
    gibps_to_bytes_per_ms, FULL_BLOCK_EMB_DIM, HALF_BLOCK_PENALTY, QUARTER_BLOCK_PENALTY,
};
use common::{DeviceCost, Measurement, MemoryModel, Plan, Table};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};

use crate::oracle::{check_plan, Oracle, OracleError};

/// DRAM sector: rows are read in 32-byte sectors.
const SECTOR_BYTES: f64 = 32.0;
/// Accesses per batch above which a row's gradient segment is "very hot".
const HOT_ROW_ACCESSES: f64 = 1024.0;

/// A table's figures that do not depend on its call: computed once per
/// measurement, so a step of the model costs a few multiplications.
#[derive(Debug, Clone)]
struct Prepared {
    dim: u32,
    lookups: f64,
    /// Bytes read per lookup from HBM on a miss (whole 32-byte sectors).
    row_bytes: f64,
    /// Share of lookups that repeat a row read earlier in the batch.
    repeats: f64,
    /// Bytes of the rows read more than once: what competes for L2.
    repeated_bytes: f64,
    /// Index reads and pooled-output writes, which no placement changes.
    fixed_bytes: f64,
    /// Backward bytes per forward byte.
    bwd_factor: f64,
}

/// The `sim` oracle.
pub struct SimOracle {
    cfg: SimConfig,
    weight_bytes: f64,
    /// Effective gather bandwidth, bytes per ms.
    gather_bw: f64,
    /// All-to-all bandwidth per rank, bytes per ms.
    link_bw: f64,
    /// Draws the optional noise; seeded, so a run's measurements repeat.
    rng: ChaCha8Rng,
}

/// TorchRec's block-usage penalty by the share of a block's lanes a table
/// uses: 1 for a full block, `HALF_BLOCK_PENALTY` (1.15) from half, and
/// `QUARTER_BLOCK_PENALTY` (1.75) below.
pub fn block_penalty(share: f64) -> f64 {
    if share >= 1.0 {
        1.0
    } else if share >= 0.5 {
        HALF_BLOCK_PENALTY
    } else {
        QUARTER_BLOCK_PENALTY
    }
}

/// Lanes of one bag's thread group: the next power of two of the group's
/// widest dim, between half a warp and a full warp of 4-wide vectors
/// (64 to 128 elements).
pub fn block_width(max_dim: u32) -> u32 {
    max_dim
        .next_power_of_two()
        .clamp(FULL_BLOCK_EMB_DIM / 2, FULL_BLOCK_EMB_DIM)
}

/// Share of its lanes a table of `dim` uses in blocks of `width`.
pub fn lane_share(dim: u32, width: u32) -> f64 {
    let passes = dim.div_ceil(width);
    dim as f64 / (passes * width) as f64
}

impl SimOracle {
    pub fn new(cfg: SimConfig, mem: MemoryModel) -> Self {
        SimOracle {
            weight_bytes: mem.precision.bytes() as f64,
            gather_bw: gibps_to_bytes_per_ms(cfg.hbm_gibps) * cfg.gather_efficiency,
            link_bw: gibps_to_bytes_per_ms(cfg.link_gibps),
            rng: ChaCha8Rng::seed_from_u64(cfg.seed),
            cfg,
        }
    }

    pub fn config(&self) -> &SimConfig {
        &self.cfg
    }

    /// What a call needs of a table, computed once per measurement.
    fn prepare(&self, t: &Table) -> Prepared {
        let n = self.cfg.batch as f64 * t.pooling_factor;
        let row_bytes = (t.dim as f64 * self.weight_bytes / SECTOR_BYTES).ceil() * SECTOR_BYTES;
        let reuse = t.mean_reuse();
        let unique = (n / reuse).min(t.rows as f64);
        let hot = t.lookup_share_above(HOT_ROW_ACCESSES);
        Prepared {
            dim: t.dim,
            lookups: n,
            row_bytes,
            repeats: 1.0 - 1.0 / reuse,
            repeated_bytes: unique * (1.0 - t.bins[0]).max(0.0) * row_bytes,
            fixed_bytes: n * self.cfg.index_bytes as f64
                + self.cfg.batch as f64 * t.dim as f64 * self.cfg.output_bytes as f64,
            bwd_factor: self.cfg.bwd_multiplier * (1.0 + self.cfg.hot_row_contention * hot),
        }
    }

    /// Soft maximum of the fixed floor and the work of one kernel call.
    fn with_floor(&self, work_ms: f64) -> f64 {
        let k = self.cfg.floor_sharpness;
        (self.cfg.kernel_floor_ms.powf(k) + work_ms.powf(k)).powf(1.0 / k)
    }

    /// Forward bytes of one table in a call of block `width` whose repeated
    /// rows hit L2 with probability `p_hit`.
    fn table_fwd_bytes(&self, t: &Prepared, width: u32, p_hit: f64) -> f64 {
        let locality = 1.0 - t.repeats * p_hit * (1.0 - self.cfg.l2_hit_cost);
        let penalty = block_penalty(lane_share(t.dim, width));
        t.lookups * t.row_bytes * locality * penalty + t.fixed_bytes
    }

    /// Block width and L2 hit probability of one call over `group`: the
    /// widest table sizes the block, and the repeated rows of every table
    /// in the call compete for one L2.
    fn call_shape(&self, group: &[&Prepared]) -> (u32, f64) {
        let max_dim = group.iter().map(|t| t.dim).max().unwrap_or(1);
        let repeated: f64 = group.iter().map(|t| t.repeated_bytes).sum();
        let l2 = self.cfg.l2_mib * (1u64 << 20) as f64;
        (block_width(max_dim), l2 / (l2 + repeated))
    }

    /// Forward and backward (with optimizer update) of one fused call over
    /// `group`, ms.
    fn one_call_ms(&self, group: &[&Prepared]) -> (f64, f64) {
        if group.is_empty() {
            return (0.0, 0.0);
        }
        let (width, p_hit) = self.call_shape(group);
        let (mut fwd, mut bwd) = (0.0, 0.0);
        for t in group {
            let b = self.table_fwd_bytes(t, width, p_hit);
            fwd += b;
            bwd += b * t.bwd_factor;
        }
        (
            self.with_floor(fwd / self.gather_bw),
            self.with_floor(bwd / self.gather_bw),
        )
    }

    /// Forward and backward of a device, from prepared tables.
    fn device_ms_prepared(&self, group: &[&Prepared]) -> (f64, f64) {
        let fused = self.one_call_ms(group);
        if group.len() < 2 {
            return fused;
        }
        let apart = group.iter().fold((0.0, 0.0), |acc, t| {
            let (f, b) = self.one_call_ms(&[t]);
            (acc.0 + f, acc.1 + b)
        });
        if apart.0 + apart.1 < fused.0 + fused.1 {
            apart
        } else {
            fused
        }
    }

    /// Forward and backward of a device holding `group`, ms: its tables run
    /// as one fused call (FBGEMM's table-batched kernel, TorchRec's default
    /// grouping), unless running them one call each would be faster, as a
    /// runtime that measured both would choose. Fusion is therefore never
    /// slower than no fusion.
    pub fn device_ms(&self, group: &[&Table]) -> (f64, f64) {
        let prepared: Vec<Prepared> = group.iter().map(|t| self.prepare(t)).collect();
        let refs: Vec<&Prepared> = prepared.iter().collect();
        self.device_ms_prepared(&refs)
    }

    /// Forward time of a device holding `group`, ms (0 for no table).
    pub fn fused_fwd_ms(&self, group: &[&Table]) -> f64 {
        self.device_ms(group).0
    }

    /// Backward time (with optimizer update) of a device holding `group`, ms.
    pub fn fused_bwd_ms(&self, group: &[&Table]) -> f64 {
        self.device_ms(group).1
    }

    /// Per-rank transfer time of one all-to-all of pooled rows, given each
    /// rank's sum of table dims, ms. One rank exchanges nothing.
    pub fn exchange_ms(&self, dim_sums: &[f64]) -> Vec<f64> {
        let d = dim_sums.len() as f64;
        if dim_sums.len() <= 1 {
            return vec![0.0; dim_sums.len()];
        }
        let total: f64 = dim_sums.iter().sum();
        let per_rank = self.cfg.batch as f64 / d;
        let ob = self.cfg.output_bytes as f64;
        dim_sums
            .iter()
            .map(|&mine| {
                let send = per_rank * (d - 1.0) * mine * ob;
                let recv = per_rank * (total - mine) * ob;
                self.cfg.a2a_latency_ms + send.max(recv) / self.link_bw
            })
            .collect()
    }

    /// The noiseless cost of a plan.
    pub fn evaluate(&self, tables: &[Table], plan: &Plan) -> Measurement {
        self.assemble(tables, plan, |_| 1.0)
    }

    fn assemble(
        &self,
        tables: &[Table],
        plan: &Plan,
        mut noise: impl FnMut(usize) -> f64,
    ) -> Measurement {
        let prepared: Vec<Prepared> = tables.iter().map(|t| self.prepare(t)).collect();
        let mut groups: Vec<Vec<&Prepared>> = vec![Vec::new(); plan.devices];
        for (t, &d) in prepared.iter().zip(&plan.assignment) {
            groups[d].push(t);
        }
        let (fwd, bwd): (Vec<f64>, Vec<f64>) = groups
            .iter()
            .map(|g| {
                let (f, b) = self.device_ms_prepared(g);
                (f * noise(0), b * noise(1))
            })
            .unzip();
        let dim_sums: Vec<f64> = groups
            .iter()
            .map(|g| g.iter().map(|t| t.dim as f64).sum())
            .collect();
        let exchange = self.exchange_ms(&dim_sums);
        let fwd_x: Vec<f64> = exchange.iter().map(|x| x * noise(2)).collect();
        let bwd_x: Vec<f64> = exchange.iter().map(|x| x * noise(3)).collect();
        let slowest = fwd.iter().copied().fold(0.0, f64::max);
        let devices = (0..plan.devices)
            .map(|d| DeviceCost::new(fwd[d], bwd[d], slowest - fwd[d] + fwd_x[d], bwd_x[d]))
            .collect();
        Measurement::from_devices(devices)
    }
}

impl Oracle for SimOracle {
    fn name(&self) -> &'static str {
        "sim"
    }

    fn measure(&mut self, tables: &[Table], plan: &Plan) -> Result<Measurement, OracleError> {
        check_plan(tables, plan)?;
        if self.cfg.noise == 0.0 {
            return Ok(self.evaluate(tables, plan));
        }
        let sigma = self.cfg.noise;
        let mut rng = self.rng.clone();
        let m = self.assemble(tables, plan, |_| {
            let z: f64 = StandardNormal.sample(&mut rng);
            (sigma * z).exp()
        });
        self.rng = rng;
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use common::generate::{generate_pool, PoolGenConfig};
    use rand::seq::index::sample;
    use rand::Rng;

    fn sim() -> SimOracle {
        SimOracle::new(SimConfig::default(), MemoryModel::default())
    }

    impl SimOracle {
        /// One fused call over `group`, never split.
        fn call_ms(&self, group: &[&Table]) -> (f64, f64) {
            let p: Vec<Prepared> = group.iter().map(|t| self.prepare(t)).collect();
            self.one_call_ms(&p.iter().collect::<Vec<_>>())
        }
    }

    fn pool() -> Vec<Table> {
        generate_pool(&PoolGenConfig::default(), 0).unwrap()
    }

    fn table(dim: u32, pooling: f64, hot: bool) -> Table {
        let mut t = Table::cold(format!("d{dim}p{pooling}"), 10_000_000, dim, pooling);
        if hot {
            t.bins = [0.0; common::NUM_BINS];
            t.bins[12] = 1.0;
        }
        t
    }

    fn random_groups(n: usize, seed: u64) -> Vec<Vec<Table>> {
        let pool = pool();
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        (0..n)
            .map(|_| {
                let size = rng.gen_range(2..=16);
                sample(&mut rng, pool.len(), size)
                    .into_iter()
                    .map(|i| pool[i].clone())
                    .collect()
            })
            .collect()
    }

    /// Property 1 (FBGEMM TBE fuses all tables of a device into one kernel;
    /// DreamShard Fig. 12 measures 1×–3× fusion speedups over random mixes).
    #[test]
    fn fusion_is_sub_additive_with_one_to_three_times_speedups() {
        let s = sim();
        let mut speedups = Vec::new();
        for g in random_groups(1000, 1) {
            let refs: Vec<&Table> = g.iter().collect();
            let fused = s.fused_fwd_ms(&refs) + s.fused_bwd_ms(&refs);
            let singles: f64 = g
                .iter()
                .map(|t| s.fused_fwd_ms(&[t]) + s.fused_bwd_ms(&[t]))
                .sum();
            assert!(
                fused <= singles * (1.0 + 1e-12),
                "fused {fused} > singles {singles}"
            );
            speedups.push(singles / fused);
        }
        speedups.sort_by(f64::total_cmp);
        let n = speedups.len();
        let median = speedups[n / 2];
        let summary = format!(
            "min {:.3} p5 {:.3} median {:.3} p95 {:.3} max {:.3}",
            speedups[0],
            speedups[n / 20],
            median,
            speedups[n - n / 20 - 1],
            speedups[n - 1]
        );
        assert!((1.05..=3.0).contains(&median), "{summary}");
        assert!(speedups[n - n / 20 - 1] <= 4.0, "{summary}");
        eprintln!("fusion speedups: {summary}");
    }

    /// Property 2 (FBGEMM sizes the thread group from the widest table;
    /// TorchRec's HALF/QUARTER_BLOCK_PENALTY price the idle lanes).
    #[test]
    fn narrow_tables_cost_more_beside_wide_ones() {
        let s = sim();
        let narrow = table(32, 8.0, false);
        let narrow2 = table(32, 8.0, false);
        let wide = table(128, 8.0, false);
        let with_narrow = s.fused_fwd_ms(&[&narrow, &narrow2]) - s.fused_fwd_ms(&[&narrow2]);
        let with_wide = s.fused_fwd_ms(&[&narrow, &wide]) - s.fused_fwd_ms(&[&wide]);
        assert!(
            with_wide > 1.2 * with_narrow,
            "narrow beside wide {with_wide} vs beside narrow {with_narrow}"
        );
        // A device runs one fused call or, where that is slower, one call each.
        let (f_one, b_one) = s.call_ms(&[&narrow, &wide]);
        let (f_n, b_n) = s.call_ms(&[&narrow]);
        let (f_w, b_w) = s.call_ms(&[&wide]);
        let (f, b) = s.device_ms(&[&narrow, &wide]);
        assert_eq!(f + b, (f_one + b_one).min(f_n + f_w + b_n + b_w));
        // Hot tables in one call share L2: each costs more than beside a cold one.
        let hot = table(64, 50.0, true);
        let hot2 = table(64, 50.0, true);
        let cold = table(64, 50.0, false);
        let first_bytes = |group: &[&Table]| {
            let p: Vec<Prepared> = group.iter().map(|t| s.prepare(t)).collect();
            let refs: Vec<&Prepared> = p.iter().collect();
            let (width, p_hit) = s.call_shape(&refs);
            s.table_fwd_bytes(refs[0], width, p_hit)
        };
        let beside_hot = first_bytes(&[&hot, &hot2]);
        let beside_cold = first_bytes(&[&hot, &cold]);
        assert!(beside_hot > beside_cold, "{beside_hot} vs {beside_cold}");
        assert_eq!(block_width(16), 64);
        assert_eq!(block_width(100), 128);
        assert_eq!(block_width(512), 128);
        assert_eq!(lane_share(192, 128), 0.75);
        assert_eq!(block_penalty(1.0), 1.0);
        assert_eq!(block_penalty(0.5), 1.15);
        assert_eq!(block_penalty(0.25), 1.75);
    }

    /// Property 2, second half (TorchRec PR #2365: a TBE call has a flat floor).
    #[test]
    fn a_small_table_joins_a_small_group_almost_free() {
        let s = sim();
        let a = table(32, 1.0, false);
        let b = table(32, 1.0, false);
        let alone = s.fused_fwd_ms(&[&b]);
        let added = s.fused_fwd_ms(&[&a, &b]) - s.fused_fwd_ms(&[&a]);
        assert!(added < 0.1 * alone, "added {added} vs alone {alone}");
        // A heavy group has no floor to hide under: the same table costs its work.
        let heavy: Vec<Table> = (0..8).map(|_| table(32, 200.0, false)).collect();
        let mut refs: Vec<&Table> = heavy.iter().collect();
        let before = s.fused_fwd_ms(&refs);
        refs.push(&b);
        assert!(s.fused_fwd_ms(&refs) - before > 5.0 * added);
    }

    /// Property 3 (repeated rows hit in L2).
    #[test]
    fn hot_rows_are_cheaper() {
        let s = sim();
        let cold = table(64, 50.0, false);
        let hot = table(64, 50.0, true);
        assert!(s.fused_fwd_ms(&[&hot]) < 0.8 * s.fused_fwd_ms(&[&cold]));
        assert!(s.fused_bwd_ms(&[&hot]) < s.fused_bwd_ms(&[&cold]));
    }

    /// Property 4 (NCCL all-to-all: per-pair volume (B/D)·Σdims·bytes; the
    /// collective waits for its slowest participant).
    #[test]
    fn all_to_all_moves_pooled_rows_and_waits_for_the_slowest() {
        let s = sim();
        let cfg = s.config().clone();
        let x = s.exchange_ms(&[100.0, 300.0]);
        // Rank 1 sends (B/2)·300·4 bytes to rank 0 and receives (B/2)·100·4.
        let bytes = cfg.batch as f64 / 2.0 * 300.0 * cfg.output_bytes as f64;
        let expect = cfg.a2a_latency_ms + bytes / gibps_to_bytes_per_ms(cfg.link_gibps);
        assert!((x[1] - expect).abs() < 1e-9);
        assert!(x[0] == x[1], "rank 0 receives what rank 1 sends");
        assert_eq!(s.exchange_ms(&[500.0]), vec![0.0]);

        let heavy = table(64, 200.0, false);
        let light = table(64, 1.0, false);
        let tables = vec![heavy, light];
        let plan = Plan {
            devices: 2,
            assignment: vec![0, 1],
        };
        let m = s.evaluate(&tables, &plan);
        let (d0, d1) = (m.devices[0], m.devices[1]);
        assert!(d1.fwd_comm_ms > d0.fwd_comm_ms, "the light rank waits");
        assert!(((d0.fwd_ms + d0.fwd_comm_ms) - (d1.fwd_ms + d1.fwd_comm_ms)).abs() < 1e-9);
        assert_eq!(m.cost_ms, d0.total_ms.max(d1.total_ms));
    }

    /// Property 5 (TorchRec BWD_COMPUTE_MULTIPLIER = 2, plus hot-row contention).
    #[test]
    fn backward_is_one_and_a_half_to_two_and_a_half_forward() {
        let s = sim();
        let mut checked = 0;
        for g in random_groups(200, 2) {
            let refs: Vec<&Table> = g.iter().collect();
            let (f, b) = s.call_ms(&refs);
            if f > 2.0 * s.config().kernel_floor_ms {
                assert!((1.5..=2.5).contains(&(b / f)), "bwd/fwd = {}", b / f);
                checked += 1;
            }
            let (f, b) = s.device_ms(&refs);
            assert!(b >= f);
        }
        assert!(checked > 100, "only {checked} groups above the floor");
    }

    /// Property 6.
    #[test]
    fn deterministic_for_a_seed_with_optional_noise() {
        let pool = pool();
        let tables = &pool[..20];
        let plan = Plan {
            devices: 4,
            assignment: (0..20).map(|i| i % 4).collect(),
        };
        let mut exact = sim();
        let a = exact.measure(tables, &plan).unwrap();
        assert_eq!(a, exact.measure(tables, &plan).unwrap());
        let noisy = |seed| {
            let cfg = SimConfig {
                noise: 0.05,
                seed,
                ..Default::default()
            };
            SimOracle::new(cfg, MemoryModel::default())
        };
        let (mut n1, mut n2, mut n3) = (noisy(1), noisy(1), noisy(2));
        let m1 = n1.measure(tables, &plan).unwrap();
        assert_eq!(m1, n2.measure(tables, &plan).unwrap());
        assert_ne!(m1, n3.measure(tables, &plan).unwrap());
        assert_ne!(m1, a);
        assert!((m1.cost_ms / a.cost_ms - 1.0).abs() < 0.3);
    }

    /// Property 7 (DreamShard Fig. 1: 50 tables on 4 GPUs, tens of ms).
    #[test]
    fn fifty_tables_on_four_devices_take_tens_of_ms() {
        let s = sim();
        let pool = pool();
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let mut costs = Vec::new();
        for _ in 0..20 {
            let idx = sample(&mut rng, pool.len(), 50).into_vec();
            let tables: Vec<Table> = idx.iter().map(|&i| pool[i].clone()).collect();
            let plan = Plan {
                devices: 4,
                assignment: (0..50).map(|_| rng.gen_range(0..4)).collect(),
            };
            costs.push(s.evaluate(&tables, &plan).cost_ms);
        }
        let mean = costs.iter().sum::<f64>() / costs.len() as f64;
        assert!(
            (10.0..100.0).contains(&mean),
            "random plans average {mean} ms"
        );
    }

    #[test]
    fn bad_plans_are_errors() {
        let mut s = sim();
        let pool = pool();
        let plan = Plan {
            devices: 2,
            assignment: vec![0, 5],
        };
        assert!(s.measure(&pool[..2], &plan).is_err());
    }
}
