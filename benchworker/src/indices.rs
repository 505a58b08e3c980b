//! Synthetic lookups that follow a table's features, for the backends that
//! run a real kernel (`cpu` now, `cuda` later). Pure Rust, no libtorch, so
//! every backend draws the same lookups for the same seed.
//!
//! What a table's features promise, and how they are honoured:
//! - `pooling_factor`, the mean lookups per sample: a batch holds exactly
//!   `round(B · pooling)` lookups, each dropped into a uniformly chosen bag,
//!   so bag lengths are Binomial(N, 1/B) ≈ Poisson(pooling) and may be 0;
//! - `bin_0..bin_16`, the reuse histogram (DESIGN §1): unique rows are drawn
//!   one after another, each with an access count from the bins (`bin_0`: 1,
//!   `bin_k`: uniform in `(2^(k-1), 2^k]`), until the counts reach the batch's
//!   lookups, so there are about `N / mean_reuse` unique rows. The bins are
//!   measured at the trace's batch (65536); keeping the *ratio* of lookups to
//!   unique rows at a smaller batch keeps the share of lookups that hit hot
//!   rows, which is what locality costs depend on;
//! - `rows`: unique rows are a random sample of `[0, min(rows, row_cap))`.
//!   When the cap leaves fewer rows than the bins ask for, the remaining
//!   lookups repeat existing rows in proportion to their counts.
//!
//! The lookups of a table depend only on the seed, the table and the batch
//! (see [`table_seed`]), never on the plan, so two plans are measured on the
//! same traffic.

use rand::distributions::WeightedIndex;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use common::{Table, NUM_BINS};

/// One batch of lookups in `embedding_bag`'s layout (`include_last_offset =
/// false`): bag `b` holds `indices[offsets[b]..offsets[b + 1]]`, the last bag
/// running to the end.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Lookups {
    /// Row of each lookup, bag after bag.
    pub indices: Vec<i64>,
    /// Start of each bag in `indices`.
    pub offsets: Vec<i64>,
}

impl Lookups {
    /// Number of bags.
    pub fn bags(&self) -> usize {
        self.offsets.len()
    }

    /// Number of lookups.
    pub fn len(&self) -> usize {
        self.indices.len()
    }

    pub fn is_empty(&self) -> bool {
        self.indices.is_empty()
    }

    /// Length of each bag.
    pub fn bag_lengths(&self) -> Vec<usize> {
        let ends = self
            .offsets
            .iter()
            .skip(1)
            .copied()
            .chain(std::iter::once(self.indices.len() as i64));
        self.offsets
            .iter()
            .zip(ends)
            .map(|(&s, e)| (e - s) as usize)
            .collect()
    }

    /// `offset2bag`: the bag each lookup belongs to.
    pub fn bag_ids(&self) -> Vec<i64> {
        let mut bags = Vec::with_capacity(self.len());
        for (b, n) in self.bag_lengths().into_iter().enumerate() {
            bags.resize(bags.len() + n, b as i64);
        }
        bags
    }
}

/// A stable seed for one table's lookups: FNV-1a of the name mixed with the
/// run's seed by SplitMix64 (std's hasher is not stable across releases).
pub fn table_seed(seed: u64, name: &str) -> u64 {
    let mut z = common::fs::fnv1a(name.as_bytes()) ^ seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Rows a table's lookups may use: its hash size, capped.
pub fn capped_rows(table: &Table, row_cap: u64) -> u64 {
    table.rows.min(row_cap).max(1)
}

/// One batch of `batch` samples of `table`, deterministic for `seed`.
pub fn for_table(seed: u64, table: &Table, batch: usize, row_cap: u64) -> Lookups {
    let mut rng = ChaCha8Rng::seed_from_u64(table_seed(seed, &table.name));
    generate(&mut rng, table, batch, row_cap)
}

/// One batch of `batch` samples of `table` whose rows lie in
/// `[0, min(rows, row_cap))`.
pub fn generate<R: Rng>(rng: &mut R, table: &Table, batch: usize, row_cap: u64) -> Lookups {
    let pooling = if table.pooling_factor.is_finite() {
        table.pooling_factor.max(0.0)
    } else {
        0.0
    };
    let total = (batch as f64 * pooling).round() as usize;
    let lengths = bag_lengths(rng, batch, total);
    let mut indices = lookup_rows(rng, table, total, capped_rows(table, row_cap));
    indices.shuffle(rng);
    let mut offsets = Vec::with_capacity(batch);
    let mut start = 0i64;
    for len in lengths {
        offsets.push(start);
        start += len as i64;
    }
    Lookups { indices, offsets }
}

/// Lengths of `batch` bags holding `total` lookups together: each lookup
/// falls into a uniformly chosen bag.
fn bag_lengths<R: Rng>(rng: &mut R, batch: usize, total: usize) -> Vec<usize> {
    let mut lengths = vec![0usize; batch];
    if batch == 0 {
        return lengths;
    }
    for _ in 0..total {
        lengths[rng.gen_range(0..batch)] += 1;
    }
    lengths
}

/// The multiset of `total` looked-up rows (unshuffled), shaped by the bins.
fn lookup_rows<R: Rng>(rng: &mut R, table: &Table, total: usize, rows: u64) -> Vec<i64> {
    if total == 0 {
        return Vec::new();
    }
    let counts = access_counts(rng, &table.bins, total, rows);
    let unique = rand::seq::index::sample(rng, rows as usize, counts.len());
    let mut out = Vec::with_capacity(total);
    for (row, &c) in unique.iter().zip(&counts) {
        out.resize(out.len() + c, row as i64);
    }
    // The row cap left too few rows: repeat rows in proportion to their counts.
    let drawn = out.len();
    while out.len() < total {
        let pick = out[rng.gen_range(0..drawn)];
        out.push(pick);
    }
    out
}

/// Access counts of successive unique rows, drawn from the bins, summing to
/// `total` unless `rows` unique rows run out first (the last is truncated).
fn access_counts<R: Rng>(
    rng: &mut R,
    bins: &[f64; NUM_BINS],
    total: usize,
    rows: u64,
) -> Vec<usize> {
    let weights = bins.map(|b| if b.is_finite() && b > 0.0 { b } else { 0.0 });
    let pick = WeightedIndex::new(weights).ok();
    let mut counts = Vec::new();
    let mut sum = 0usize;
    while sum < total && (counts.len() as u64) < rows {
        let k = pick.as_ref().map_or(0, |w| rng.sample(w));
        let c = match k {
            0 => 1,
            _ => rng.gen_range((1usize << (k - 1)) + 1..=1usize << k),
        };
        let c = c.min(total - sum);
        counts.push(c);
        sum += c;
    }
    counts
}

/// The reuse histogram of a batch of lookups, in the bins' convention: the
/// share of unique rows whose access count lies in `(2^(k-1), 2^k]`.
pub fn reuse_histogram(indices: &[i64]) -> [f64; NUM_BINS] {
    let mut sorted = indices.to_vec();
    sorted.sort_unstable();
    let mut hist = [0.0; NUM_BINS];
    let mut unique = 0usize;
    for run in sorted.chunk_by(|a, b| a == b) {
        let c = run.len();
        // ceil(log2(c)) for c ≥ 1.
        let k = (usize::BITS - (c - 1).leading_zeros()) as usize;
        hist[k.min(NUM_BINS - 1)] += 1.0;
        unique += 1;
    }
    if unique > 0 {
        hist.iter_mut().for_each(|h| *h /= unique as f64);
    }
    hist
}

/// Number of distinct rows among `indices`.
pub fn unique_rows(indices: &[i64]) -> usize {
    let mut sorted = indices.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    sorted.len()
}

/// Several tables' lookups as one fused call over their concatenated weight:
/// `parts[j] = (lookups of table j, first row of table j in the weight)`.
/// Bags are table-major (table 0's bags, then table 1's, …), so the pooled
/// output reshapes to `[tables, batch, dim]`.
pub fn fuse(parts: &[(&Lookups, i64)]) -> Lookups {
    let n: usize = parts.iter().map(|(l, _)| l.len()).sum();
    let bags: usize = parts.iter().map(|(l, _)| l.bags()).sum();
    let mut out = Lookups {
        indices: Vec::with_capacity(n),
        offsets: Vec::with_capacity(bags),
    };
    for (l, row_offset) in parts {
        let base = out.indices.len() as i64;
        out.offsets.extend(l.offsets.iter().map(|o| o + base));
        out.indices.extend(l.indices.iter().map(|i| i + row_offset));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(name: &str, rows: u64, pooling: f64, bins: &[(usize, f64)]) -> Table {
        crate::test_table(name, rows, 16, pooling, bins)
    }

    #[test]
    fn bags_hold_the_pooling_factor_on_average() {
        let t = table("t", 1_000_000, 7.3, &[(0, 0.5), (3, 0.5)]);
        let l = for_table(1, &t, 1000, u64::MAX);
        assert_eq!(l.bags(), 1000);
        assert_eq!(l.len(), 7300);
        let lengths = l.bag_lengths();
        assert_eq!(lengths.iter().sum::<usize>(), 7300);
        // Poisson-like: spread around the mean, not all equal.
        assert!(lengths.iter().any(|&n| n < 5) && lengths.iter().any(|&n| n > 10));
        assert!(l.offsets.windows(2).all(|w| w[0] <= w[1]));
    }

    #[test]
    fn indices_stay_within_capped_rows() {
        let t = table("t", 5000, 20.0, &[(0, 1.0)]);
        for cap in [100u64, 3000, u64::MAX] {
            let l = for_table(2, &t, 256, cap);
            let rows = capped_rows(&t, cap) as i64;
            assert!(
                l.indices.iter().all(|&i| (0..rows).contains(&i)),
                "cap {cap}"
            );
            assert_eq!(l.len(), 5120);
        }
        // With 100 rows for 5120 lookups, every row is used.
        assert_eq!(unique_rows(&for_table(2, &t, 256, 100).indices), 100);
    }

    #[test]
    fn hot_bins_mean_fewer_unique_rows() {
        let cold = table("c", 10_000_000, 10.0, &[(0, 0.95), (1, 0.05)]);
        let hot = table("h", 10_000_000, 10.0, &[(0, 0.3), (6, 0.4), (9, 0.3)]);
        let lc = for_table(3, &cold, 2048, u64::MAX);
        let lh = for_table(3, &hot, 2048, u64::MAX);
        assert_eq!(lc.len(), lh.len());
        let (uc, uh) = (unique_rows(&lc.indices), unique_rows(&lh.indices));
        assert!(uh * 20 < uc, "unique rows: cold {uc}, hot {uh}");
        // The measured histograms follow the bins.
        let hc = reuse_histogram(&lc.indices);
        assert!((hc[0] - 0.95).abs() < 0.02, "{hc:?}");
        let hh = reuse_histogram(&lh.indices);
        assert!(hh[0] > 0.2 && hh[6] > 0.25 && hh[9] > 0.15, "{hh:?}");
        // Unique rows ≈ lookups / mean reuse.
        let expect = lh.len() as f64 / hot.mean_reuse();
        assert!((uh as f64 / expect - 1.0).abs() < 0.35, "{uh} vs {expect}");
    }

    #[test]
    fn same_seed_same_lookups_other_seed_other_lookups() {
        let t = table("t", 100_000, 4.0, &[(0, 0.6), (2, 0.4)]);
        assert_eq!(for_table(5, &t, 128, 1000), for_table(5, &t, 128, 1000));
        assert_ne!(for_table(5, &t, 128, 1000), for_table(6, &t, 128, 1000));
        let mut u = t.clone();
        u.name = "u".into();
        assert_ne!(for_table(5, &t, 128, 1000), for_table(5, &u, 128, 1000));
        assert_eq!(table_seed(0, "abc"), table_seed(0, "abc"));
    }

    #[test]
    fn fused_lookups_shift_rows_and_offsets() {
        let a = Lookups {
            indices: vec![0, 1, 2],
            offsets: vec![0, 2],
        };
        let b = Lookups {
            indices: vec![4, 0],
            offsets: vec![0, 0],
        };
        let f = fuse(&[(&a, 0), (&b, 10)]);
        assert_eq!(f.indices, vec![0, 1, 2, 14, 10]);
        assert_eq!(f.offsets, vec![0, 2, 3, 3]);
        assert_eq!(f.bag_lengths(), vec![2, 1, 0, 2]);
        assert_eq!(fuse(&[]), Lookups::default());
    }

    #[test]
    fn zero_pooling_gives_empty_bags() {
        let t = table("t", 100, 0.0, &[(0, 1.0)]);
        let l = for_table(0, &t, 8, 100);
        assert!(l.is_empty());
        assert_eq!(l.offsets, vec![0; 8]);
        assert_eq!(reuse_histogram(&[]), [0.0; NUM_BINS]);
    }
}
