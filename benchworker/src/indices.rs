//! Synthetic lookups that follow a table's features, for the backends that
//! run a real kernel (`cpu` and `cuda`), generated with libtorch ops on the
//! device that looks them up.
//!
//! What a table's features promise, and how they are honoured:
//! - `pooling_factor`, the mean lookups per sample: a batch holds exactly
//!   `N = round(B · pooling)` lookups, each dropped into a uniformly chosen
//!   bag, so bag lengths are Binomial(N, 1/B) ≈ Poisson(pooling) and may be 0;
//! - `bin_0..bin_16`, the reuse histogram (DESIGN §1): unique rows take
//!   access counts drawn from the bins (`bin_0`: 1, `bin_k`: uniform in
//!   `(2^(k-1), 2^k]`), one after another, until the counts reach `N`, so
//!   there are about `N / mean_reuse` unique rows. The bins are measured at
//!   the trace's batch (65536); keeping the *ratio* of lookups to unique rows
//!   at a smaller batch keeps the share of lookups that hit hot rows, which is
//!   what locality costs depend on;
//! - `rows`: the unique rows are a random sample of `[0, min(rows, row_cap))`:
//!   the first rows of a pseudo-random permutation of the rows (a Feistel
//!   network over the next power of two, cycle-walked into range), so no two
//!   are the same and they are spread as a uniform sample is (pages and cache
//!   lines touched, which locality costs depend on). When the cap leaves fewer
//!   rows than the bins ask for, the remaining lookups repeat drawn lookups,
//!   so rows are repeated in proportion to their counts.
//!
//! The draws come from a counter-based generator: draw `i` of a stream is a
//! 32-bit hash of `i` and the stream's key, computed by integer tensor ops
//! that are exact on every device (a 32-bit value times a multiplier below
//! 2^31 stays below 2^63). So a GPU generates its lookups itself, without a
//! round trip through the host, and the `cpu` and `cuda` backends, running the
//! same ops, look up the same rows bit for bit for the same seed, batch and
//! row cap ([`same_on`] checks a device; the two backends' default batch and
//! row cap differ, `[cpu]` and `[cuda]` in the configuration).
//!
//! The lookups of a table depend only on the seed, the table and the batch
//! (see [`table_seed`]), never on the plan, so two plans are measured on the
//! same traffic.

use std::collections::HashMap;

use tch::{Device, Kind, TchError, Tensor};

use common::{Table, NUM_BINS};

/// Draws are 32-bit: `[0, SPAN)`.
const SPAN: i64 = 1 << 32;
const MASK: i64 = SPAN - 1;
/// The hash's multipliers: a xorshift-multiply hash shaped like Wellons'
/// `lowbias32` (shifts 16, 15, 15), with multipliers below 2^31 so that a
/// 32-bit value times one of them is exact in an i64 tensor; its uniformity
/// is tested below.
const MUL: [i64; 2] = [0x21f0_aaad, 0x735a_2d97];
/// Most lookups of one table in one batch: draws scaled to `[0, n)` multiply
/// a 32-bit draw by `n`, which must stay below 2^63.
pub const MAX_TABLE_LOOKUPS: i64 = i32::MAX as i64;
/// Rows beyond this many are not told apart (no weight is ever that large):
/// the row permutation's domain stays below 2^63.
const MAX_ROWS: u64 = 1 << 62;
/// Rounds of the row permutation's Feistel network.
const FEISTEL_ROUNDS: u64 = 4;

/// The independent streams of one table's draws.
#[derive(Debug, Clone, Copy)]
enum Stream {
    /// The bin of each unique row's access count.
    Bin = 1,
    /// The count within its bin.
    Count,
    /// Which drawn lookup a lookup beyond the capped rows repeats.
    Repeat,
    /// The bag of each lookup.
    Bag,
    /// The row permutation (one key per round).
    Rows,
    /// The order of the lookups within their bag.
    Place,
}

/// One batch of lookups on a device, in `embedding_bag`'s layout
/// (`include_last_offset = false`): bag `b` holds
/// `indices[offsets[b]..offsets[b + 1]]`, the last bag running to the end.
#[derive(Debug)]
pub struct Lookups {
    /// Row of each lookup, bag after bag, `[lookups]` i64.
    pub indices: Tensor,
    /// Start of each bag in `indices`, `[bags]` i64.
    pub offsets: Tensor,
    /// The bag of each lookup (`offset2bag`), `[lookups]` i64.
    pub bags: Tensor,
}

impl Lookups {
    /// Number of bags.
    pub fn bags(&self) -> i64 {
        self.offsets.size()[0]
    }

    /// Number of lookups.
    pub fn len(&self) -> i64 {
        self.indices.size()[0]
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The same lookups, their tensors shared.
    pub fn shallow_clone(&self) -> Lookups {
        Lookups {
            indices: self.indices.shallow_clone(),
            offsets: self.offsets.shallow_clone(),
            bags: self.bags.shallow_clone(),
        }
    }

    /// A copy in host memory.
    pub fn to_host(&self) -> Result<HostLookups, TchError> {
        let host = |t: &Tensor| Vec::<i64>::try_from(&t.f_to_device(Device::Cpu)?);
        Ok(HostLookups {
            indices: host(&self.indices)?,
            offsets: host(&self.offsets)?,
            bags: host(&self.bags)?,
        })
    }
}

/// [`Lookups`] copied to the host, to check or compare them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostLookups {
    pub indices: Vec<i64>,
    pub offsets: Vec<i64>,
    pub bags: Vec<i64>,
}

impl HostLookups {
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
}

/// SplitMix64's finaliser.
fn splitmix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

/// A stable seed for one table's lookups: FNV-1a of the name mixed with the
/// run's seed by SplitMix64 (std's hasher is not stable across releases).
pub fn table_seed(seed: u64, name: &str) -> u64 {
    splitmix(common::fs::fnv1a(name.as_bytes()) ^ seed.wrapping_mul(GOLDEN))
}

/// A stream's key: added to the counter before the first hash, and xored
/// between the two.
#[derive(Debug, Clone, Copy)]
struct Key {
    add: i64,
    xor: i64,
}

fn key(table_seed: u64, stream: Stream) -> Key {
    let z = splitmix(table_seed ^ (stream as u64).wrapping_mul(GOLDEN));
    Key {
        add: (z & MASK as u64) as i64,
        xor: (z >> 32) as i64,
    }
}

/// Rows a table's lookups may use: its hash size, capped.
pub fn capped_rows(table: &Table, row_cap: u64) -> u64 {
    table.rows.min(row_cap).max(1)
}

/// Lookups of `table` in a batch of `batch` samples: `round(B · pooling)`,
/// none for a pooling factor that is not a non-negative number.
pub fn lookups_per_batch(table: &Table, batch: u64) -> f64 {
    let pooling = if table.pooling_factor.is_finite() {
        table.pooling_factor.max(0.0)
    } else {
        0.0
    };
    (batch as f64 * pooling).round()
}

/// `v` as a 0-dim i64 tensor on `x`'s device: the constant of an op on `x`.
/// tch's ops that take a `Scalar` (`f_add_scalar`, `f_ge`, …) panic when
/// libtorch fails instead of returning the error (the `Scalar`'s drop
/// unwraps the error still pending), and failing to allocate a large
/// result is such a failure; with a tensor for the constant, it is an error.
fn constant(x: &Tensor, v: i64) -> Result<Tensor, TchError> {
    Tensor::f_from_slice(&[v])?
        .f_to_device(x.device())?
        .f_squeeze()
}

fn shift_right(x: &Tensor, bits: i64) -> Result<Tensor, TchError> {
    x.f_bitwise_right_shift(&constant(x, bits)?)
}

fn shift_left(x: &Tensor, bits: i64) -> Result<Tensor, TchError> {
    x.f_bitwise_left_shift(&constant(x, bits)?)
}

fn and(x: &Tensor, mask: i64) -> Result<Tensor, TchError> {
    x.f_bitwise_and_tensor(&constant(x, mask)?)
}

fn add(x: &Tensor, v: i64) -> Result<Tensor, TchError> {
    x.f_add(&constant(x, v)?)
}

fn xorshift(x: &Tensor, shift: i64) -> Result<Tensor, TchError> {
    x.f_bitwise_xor_tensor(&shift_right(x, shift)?)
}

/// `x · c mod 2^32` for `x < 2^32`, `c < 2^31`.
fn mul32(x: &Tensor, c: i64) -> Result<Tensor, TchError> {
    and(&x.f_mul(&constant(x, c)?)?, MASK)
}

/// A bijective 32-bit hash of values in `[0, 2^32)`.
fn hash(x: &Tensor) -> Result<Tensor, TchError> {
    let x = mul32(&xorshift(x, 16)?, MUL[0])?;
    let x = mul32(&xorshift(&x, 15)?, MUL[1])?;
    xorshift(&x, 15)
}

/// Draws `i` (an i64 tensor of counters below 2^32) of a stream: uniform
/// in `[0, 2^32)`.
fn draw(key: Key, i: &Tensor) -> Result<Tensor, TchError> {
    let x = and(&add(i, key.add)?, MASK)?;
    let h = hash(&x)?;
    hash(&h.f_bitwise_xor_tensor(&constant(&h, key.xor)?)?)
}

/// Draws `0..count` of a stream.
fn draws(key: Key, count: i64, device: Device) -> Result<Tensor, TchError> {
    draw(key, &Tensor::f_arange(count, (Kind::Int64, device))?)
}

/// A draw scaled to `[0, n)` for `n ≤ 2^31`: `⌊u · n / 2^32⌋`.
fn below(u: &Tensor, n: i64) -> Result<Tensor, TchError> {
    shift_right(&u.f_mul(&constant(u, n)?)?, 32)
}

/// Where the bins' cumulative shares fall among 32-bit draws: draw `u`
/// picks bin `#{j : thresholds[j] ≤ u}`. Bins that are not positive
/// numbers have no share; past the last bin with one, the thresholds are
/// `2^32`, so rounding never picks an empty bin. No share at all: bin 0.
fn bin_thresholds(bins: &[f64; NUM_BINS]) -> [i64; NUM_BINS - 1] {
    let weights = bins.map(|b| if b.is_finite() && b > 0.0 { b } else { 0.0 });
    let total: f64 = weights.iter().sum();
    let mut out = [SPAN; NUM_BINS - 1];
    let Some(last) = weights.iter().rposition(|&w| w > 0.0) else {
        return out;
    };
    let mut acc = 0.0;
    for (j, t) in out.iter_mut().enumerate().take(last) {
        acc += weights[j];
        *t = ((acc / total) * SPAN as f64).floor().min(SPAN as f64) as i64;
    }
    out
}

/// Bits of the smallest power of two that is at least `rows` (≥ 1).
fn domain_bits(rows: u64) -> u32 {
    u64::BITS - (rows - 1).leading_zeros()
}

/// A Feistel network's pass over `x < 2^bits`: each round splits `x` into a
/// left and a right part, `(L, R) ↦ (R, L ⊕ F(R))` with `F` the stream's
/// hash cut to `L`'s width, which swaps the parts' widths; an even number of
/// rounds. Each round is a bijection, so the pass permutes `[0, 2^bits)`.
/// Parts are at most 31 bits for `bits ≤ 62`: every draw's counter is below
/// 2^32 and every value below 2^62.
fn feistel(x: &Tensor, bits: u32, table_seed: u64) -> Result<Tensor, TchError> {
    let (mut left, mut right) = (bits / 2, bits - bits / 2);
    let mut x = x.shallow_clone();
    for round in 0..FEISTEL_ROUNDS {
        let k = key(table_seed.wrapping_add(round), Stream::Rows);
        let l = shift_right(&x, i64::from(right))?;
        let r = and(&x, (1i64 << right) - 1)?;
        let f = and(&draw(k, &r)?, (1i64 << left) - 1)?;
        x = shift_left(&r, i64::from(left))?.f_bitwise_or_tensor(&l.f_bitwise_xor_tensor(&f)?)?;
        std::mem::swap(&mut left, &mut right);
    }
    Ok(x)
}

/// The first `count` rows of a pseudo-random permutation of `[0, rows)`: the
/// network over the next power of two, applied again to values outside the
/// rows until they fall inside (cycle walking: starting from a row, the walk
/// ends at a row, and two rows never end at the same one).
fn sample_rows(count: i64, rows: u64, table_seed: u64, device: Device) -> Result<Tensor, TchError> {
    let bits = domain_bits(rows);
    let mut y = feistel(
        &Tensor::f_arange(count, (Kind::Int64, device))?,
        bits,
        table_seed,
    )?;
    loop {
        let out = y
            .f_ge_tensor(&constant(&y, rows as i64)?)?
            .f_nonzero()?
            .f_squeeze_dim(1)?;
        if out.size()[0] == 0 {
            return Ok(y);
        }
        let walked = feistel(&y.f_index_select(0, &out)?, bits, table_seed)?;
        y = y.f_index_copy(0, &out, &walked)?;
    }
}

/// The lower end of each bin's counts: `[0, 1, 2, 4, …, 2^15]`, so bin
/// `k`'s count is `lo + 1 + ⌊u · lo / 2^32⌋`, 1 for bin 0 and in
/// `(lo, 2·lo]` otherwise.
fn bin_floors() -> [i64; NUM_BINS] {
    std::array::from_fn(|k| if k == 0 { 0 } else { 1 << (k - 1) })
}

/// One batch of `batch` samples of `table` on `device`, deterministic for
/// `seed`, with rows in `[0, min(rows, row_cap))`.
pub fn for_table(
    seed: u64,
    table: &Table,
    batch: u64,
    row_cap: u64,
    device: Device,
) -> Result<Lookups, TchError> {
    let bad = |m: String| Err(TchError::Kind(m));
    let n = lookups_per_batch(table, batch);
    if n > MAX_TABLE_LOOKUPS as f64 {
        return bad(format!(
            "table `{}`: {n:.0} lookups in a batch of {batch}, more than the \
             {MAX_TABLE_LOOKUPS} one table may draw",
            table.name
        ));
    }
    if batch > MAX_TABLE_LOOKUPS as u64 {
        return bad(format!(
            "a batch of {batch} samples, more than the {MAX_TABLE_LOOKUPS} lookups may use"
        ));
    }
    let (n, batch) = (n as i64, batch as i64);
    let on = (Kind::Int64, device);
    if n == 0 {
        return Ok(Lookups {
            indices: Tensor::f_zeros([0], on)?,
            offsets: Tensor::f_zeros([batch], on)?,
            bags: Tensor::f_zeros([0], on)?,
        });
    }
    let seed = table_seed(seed, &table.name);
    let rows = capped_rows(table, row_cap).min(MAX_ROWS);
    // Every count is at least 1: at most `n` unique rows, and at most `rows`.
    let slots = n.min(rows as i64);

    // Each slot's access count, from its bin.
    let u = draws(key(seed, Stream::Bin), slots, device)?;
    let mut bin = Tensor::f_zeros([slots], on)?;
    for t in bin_thresholds(&table.bins)
        .into_iter()
        .filter(|&t| t < SPAN)
    {
        bin = bin.f_add(&u.f_ge_tensor(&constant(&u, t)?)?.f_to_kind(Kind::Int64)?)?;
    }
    let floors = Tensor::f_from_slice(&bin_floors())?.f_to_device(device)?;
    let lo = floors.f_index_select(0, &bin)?;
    let within = shift_right(
        &draws(key(seed, Stream::Count), slots, device)?.f_mul(&lo)?,
        32,
    )?;
    let count = add(&lo, 1)?.f_add(&within)?;
    // Counts run until they reach `n`: the one that crosses it is cut,
    // those after it are 0.
    let before = count.f_cumsum(0, Kind::Int64)?.f_sub(&count)?;
    let unique = before
        .f_lt_tensor(&constant(&before, n)?)?
        .f_sum(Kind::Int64)?
        .f_int64_value(&[])?;
    let used = add(&before.f_narrow(0, 0, unique)?.f_neg()?, n)?
        .f_minimum(&count.f_narrow(0, 0, unique)?)?;
    let drawn = used.f_sum(Kind::Int64)?.f_int64_value(&[])?;

    // The slots' rows, each repeated its count times, slot after slot.
    let mut looked_up = sample_rows(unique, rows, seed, device)?
        .f_repeat_interleave_self_tensor(&used, 0, drawn)?;
    if drawn < n {
        // Too few rows for the counts: repeat drawn lookups.
        let pick = below(&draws(key(seed, Stream::Repeat), n - drawn, device)?, drawn)?;
        let extra = looked_up.f_index_select(0, &pick)?;
        looked_up = Tensor::f_cat(&[looked_up, extra], 0)?;
    }

    // Each lookup into a uniformly chosen bag, in a random place there: the
    // lookups sorted by (bag, a draw), keys that are all distinct (the hash
    // is a bijection), so every device sorts them into the same order.
    let bag = below(&draws(key(seed, Stream::Bag), n, device)?, batch)?;
    let place = draws(key(seed, Stream::Place), n, device)?;
    let (sorted, order) = shift_left(&bag, 32)?
        .f_bitwise_or_tensor(&place)?
        .f_sort(0, false)?;
    let lengths = bag.f_bincount(None::<Tensor>, batch)?;
    Ok(Lookups {
        indices: looked_up.f_index_select(0, &order)?,
        offsets: lengths.f_cumsum(0, Kind::Int64)?.f_sub(&lengths)?,
        bags: shift_right(&sorted, 32)?,
    })
}

/// What a table's lookups depend on besides the seed, the batch and the row
/// cap (the name seeds them; rows, pooling and the reuse bins shape them):
/// two tables alike in all of it draw the same lookups. Floats by their bits.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LookupKey {
    name: String,
    rows: u64,
    pooling: u64,
    bins: [u64; NUM_BINS],
}

impl LookupKey {
    pub fn of(table: &Table) -> LookupKey {
        LookupKey {
            name: table.name.clone(),
            rows: table.rows,
            pooling: table.pooling_factor.to_bits(),
            bins: table.bins.map(f64::to_bits),
        }
    }
}

/// Tables' lookups generated once and kept, for one seed, batch, row cap
/// and device, up to `max_lookups` held (then emptied): a backend measuring
/// plans over the same tables generates each table's lookups once.
#[derive(Debug)]
pub struct LookupCache {
    seed: u64,
    batch: u64,
    row_cap: u64,
    device: Device,
    max_lookups: i64,
    held: i64,
    kept: HashMap<LookupKey, Lookups>,
}

impl LookupCache {
    pub fn new(seed: u64, batch: u64, row_cap: u64, device: Device, max_lookups: i64) -> Self {
        LookupCache {
            seed,
            batch,
            row_cap,
            device,
            max_lookups,
            held: 0,
            kept: HashMap::new(),
        }
    }

    /// `table`'s lookups ([`for_table`]), generated on first use.
    pub fn get(&mut self, table: &Table) -> Result<Lookups, TchError> {
        let key = LookupKey::of(table);
        if let Some(l) = self.kept.get(&key) {
            return Ok(l.shallow_clone());
        }
        let l = for_table(self.seed, table, self.batch, self.row_cap, self.device)?;
        if l.len() > self.max_lookups {
            return Ok(l); // more than the cache holds: not kept
        }
        if self.held + l.len() > self.max_lookups {
            self.kept.clear();
            self.held = 0;
        }
        self.held += l.len();
        self.kept.insert(key, l.shallow_clone());
        Ok(l)
    }

    /// Lookups held now.
    pub fn held(&self) -> i64 {
        self.held
    }
}

/// Several tables' lookups as one fused call over their weights stacked in
/// one (table `j` has `rows[j]` rows, starting after those before it), on
/// one device. Bags are table-major (table 0's bags, then table 1's, …), so
/// the pooled output reshapes to `[tables, batch, dim]`. Each table's
/// lookups are freed once copied.
pub fn fuse(tables: Vec<Lookups>, rows: &[i64]) -> Result<Lookups, TchError> {
    if tables.is_empty() || tables.len() != rows.len() {
        return Err(TchError::Kind(format!(
            "fusing the lookups of {} tables with {} row counts",
            tables.len(),
            rows.len()
        )));
    }
    let (mut indices, mut offsets, mut bags) = (Vec::new(), Vec::new(), Vec::new());
    let (mut first_row, mut lookups, mut first_bag) = (0, 0, 0);
    for (l, r) in tables.into_iter().zip(rows) {
        indices.push(add(&l.indices, first_row)?);
        offsets.push(add(&l.offsets, lookups)?);
        bags.push(add(&l.bags, first_bag)?);
        first_row += r;
        lookups += l.len();
        first_bag += l.bags();
    }
    Ok(Lookups {
        indices: Tensor::f_cat(&indices, 0)?,
        offsets: Tensor::f_cat(&offsets, 0)?,
        bags: Tensor::f_cat(&bags, 0)?,
    })
}

/// A table of dim 16 (the lookups do not depend on the dim) with `bins` as
/// `(bin, share)` pairs.
fn table(name: &str, rows: u64, pooling: f64, bins: &[(usize, f64)]) -> Table {
    crate::test_table(name, rows, 16, pooling, bins)
}

/// Tables whose lookups [`same_on`] compares: every path of the generator
/// (a cold table, hot bins, rows capped below the counts, empty bins).
fn probe_tables() -> Vec<Table> {
    vec![
        table("probe_cold", 10_000_000, 3.0, &[(0, 0.9), (1, 0.1)]),
        table(
            "probe_hot",
            1_000_000,
            20.0,
            &[(0, 0.3), (6, 0.4), (15, 0.3)],
        ),
        table("probe_capped", 50, 8.0, &[(0, 0.5), (3, 0.5)]),
        table("probe_none", 1000, 2.0, &[]),
        table("probe_huge", 1 << 40, 4.0, &[(0, 0.5), (2, 0.5)]),
    ]
}

/// A device whose lookups are not the CPU's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotTheSame {
    #[error("lookups of `{table}` on {device}: {message}")]
    Failed {
        table: String,
        device: String,
        message: String,
    },
    #[error("the lookups of `{table}` generated on {device} differ from the CPU's")]
    Differ { table: String, device: String },
}

/// Checks that each of `devices` generates the same lookups as the CPU
/// (integer ops that differ between devices would make two backends
/// measure different traffic). Names the first device and table that differ.
pub fn same_on(devices: &[Device]) -> Result<(), NotTheSame> {
    const SEED: u64 = 7;
    const BATCH: u64 = 4096;
    for t in probe_tables() {
        let host = |d| {
            for_table(SEED, &t, BATCH, u64::MAX, d)
                .and_then(|l| l.to_host())
                .map_err(|e| NotTheSame::Failed {
                    table: t.name.clone(),
                    device: format!("{d:?}"),
                    message: e.to_string(),
                })
        };
        let cpu = host(Device::Cpu)?;
        for &d in devices {
            if host(d)? != cpu {
                return Err(NotTheSame::Differ {
                    table: t.name.clone(),
                    device: format!("{d:?}"),
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(seed: u64, t: &Table, batch: u64, cap: u64) -> HostLookups {
        for_table(seed, t, batch, cap, Device::Cpu)
            .unwrap()
            .to_host()
            .unwrap()
    }

    /// The reuse histogram of a batch of lookups, in the bins' convention:
    /// the share of unique rows whose access count lies in `(2^(k-1), 2^k]`.
    fn reuse_histogram(indices: &[i64]) -> [f64; NUM_BINS] {
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

    fn unique_rows(indices: &[i64]) -> usize {
        let mut sorted = indices.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        sorted.len()
    }

    fn hash32(mut x: u32) -> u32 {
        x ^= x >> 16;
        x = x.wrapping_mul(MUL[0] as u32);
        x ^= x >> 15;
        x = x.wrapping_mul(MUL[1] as u32);
        x ^ (x >> 15)
    }

    /// Draw `i` of the stream with key `k`, with scalar arithmetic.
    fn draw_one(k: Key, i: u64) -> u64 {
        let x = (i as u32).wrapping_add(k.add as u32);
        u64::from(hash32(hash32(x) ^ k.xor as u32))
    }

    /// The `j`-th sampled row, with scalar arithmetic: the Feistel rounds,
    /// walked until the value is a row.
    fn reference_row(j: u64, rows: u64, seed: u64) -> u64 {
        let bits = domain_bits(rows);
        let pass = |mut x: u64| {
            let (mut left, mut right) = (bits / 2, bits - bits / 2);
            for round in 0..FEISTEL_ROUNDS {
                let k = key(seed.wrapping_add(round), Stream::Rows);
                let (l, r) = (x >> right, x & ((1 << right) - 1));
                let f = draw_one(k, r) & ((1 << left) - 1);
                x = (r << left) | (l ^ f);
                std::mem::swap(&mut left, &mut right);
            }
            x
        };
        let mut y = pass(j);
        while y >= rows {
            y = pass(y);
        }
        y
    }

    /// The generator written out with scalar arithmetic, draw by draw, the
    /// way the tensor ops must compute it on any device.
    fn reference(seed: u64, t: &Table, batch: u64, cap: u64) -> HostLookups {
        let draw = draw_one;
        let n = lookups_per_batch(t, batch) as u64;
        let seed = table_seed(seed, &t.name);
        let rows = capped_rows(t, cap).min(MAX_ROWS);
        let slots = n.min(rows);
        let thresholds = bin_thresholds(&t.bins);
        let floors = bin_floors();
        let mut counts = Vec::new();
        let mut sum = 0;
        for j in 0..slots {
            if sum >= n {
                break;
            }
            let u = draw(key(seed, Stream::Bin), j);
            let bin = thresholds.iter().filter(|&&th| th as u64 <= u).count();
            let lo = floors[bin] as u64;
            let c = lo + 1 + ((draw(key(seed, Stream::Count), j) * lo) >> 32);
            let c = c.min(n - sum);
            counts.push(c);
            sum += c;
        }
        let mut looked_up = Vec::new();
        for (j, &c) in counts.iter().enumerate() {
            let row = reference_row(j as u64, rows, seed);
            looked_up.extend(std::iter::repeat_n(row as i64, c as usize));
        }
        let drawn = looked_up.len() as u64;
        for i in 0..n - drawn {
            let pick = (draw(key(seed, Stream::Repeat), i) * drawn) >> 32;
            looked_up.push(looked_up[pick as usize]);
        }
        let bag: Vec<u64> = (0..n)
            .map(|i| (draw(key(seed, Stream::Bag), i) * batch) >> 32)
            .collect();
        let mut order: Vec<usize> = (0..n as usize).collect();
        order.sort_by_key(|&i| (bag[i], draw(key(seed, Stream::Place), i as u64)));
        let mut offsets = vec![0i64; batch as usize];
        for &b in &bag {
            for o in &mut offsets[b as usize + 1..] {
                *o += 1;
            }
        }
        HostLookups {
            indices: order.iter().map(|&i| looked_up[i]).collect(),
            offsets,
            bags: order.iter().map(|&i| bag[i] as i64).collect(),
        }
    }

    #[test]
    fn tensor_ops_draw_exactly_what_the_scalar_reference_draws() {
        let tables = [
            table("cold", 10_000_000, 3.0, &[(0, 0.9), (1, 0.1)]),
            table("hot", 100_000, 12.5, &[(0, 0.3), (6, 0.4), (16, 0.3)]),
            table("capped", 5000, 20.0, &[(0, 0.2), (4, 0.8)]),
            table("none", 1000, 2.0, &[]),
            table("huge", 1 << 40, 4.0, &[(0, 0.5), (2, 0.5)]),
        ];
        for t in &tables {
            for (seed, batch, cap) in [(1, 64, u64::MAX), (9, 300, 40), (2, 1, 7)] {
                let want = reference(seed, t, batch, cap);
                assert_eq!(
                    host(seed, t, batch, cap),
                    want,
                    "{} {seed} {batch} {cap}",
                    t.name
                );
                // Bags follow offsets.
                let mut bags = Vec::new();
                for (b, len) in want.bag_lengths().into_iter().enumerate() {
                    bags.extend(std::iter::repeat_n(b as i64, len));
                }
                assert_eq!(bags, want.bags);
            }
        }
    }

    #[test]
    fn the_hash_is_a_bijection_on_a_sample_and_looks_uniform() {
        let k = key(3, Stream::Bag);
        let u = Vec::<i64>::try_from(&draws(k, 1 << 16, Device::Cpu).unwrap()).unwrap();
        assert!(u.iter().all(|&x| (0..SPAN).contains(&x)));
        assert_eq!(unique_rows(&u), u.len());
        // Each of 16 equal slices of [0, 2^32) gets about 1/16 of the draws.
        let mut slices = [0usize; 16];
        u.iter().for_each(|&x| slices[(x >> 28) as usize] += 1);
        let expect = u.len() as f64 / 16.0;
        assert!(
            slices
                .iter()
                .all(|&s| (s as f64 / expect - 1.0).abs() < 0.05),
            "{slices:?}"
        );
    }

    #[test]
    fn bags_hold_the_pooling_factor_on_average() {
        let t = table("t", 1_000_000, 7.3, &[(0, 0.5), (3, 0.5)]);
        let l = host(1, &t, 1000, u64::MAX);
        assert_eq!(l.offsets.len(), 1000);
        assert_eq!(l.indices.len(), 7300);
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
            let l = host(2, &t, 256, cap);
            let rows = capped_rows(&t, cap) as i64;
            assert!(
                l.indices.iter().all(|&i| (0..rows).contains(&i)),
                "cap {cap}"
            );
            assert_eq!(l.indices.len(), 5120);
        }
        // With 100 rows for 5120 lookups, every row is used.
        assert_eq!(unique_rows(&host(2, &t, 256, 100).indices), 100);
        // A permutation: every count of 1 goes to its own row.
        assert_eq!(unique_rows(&host(2, &t, 256, 3000).indices), 3000);
    }

    #[test]
    fn hot_bins_mean_fewer_unique_rows() {
        let cold = table("c", 10_000_000, 10.0, &[(0, 0.95), (1, 0.05)]);
        let hot = table("h", 10_000_000, 10.0, &[(0, 0.3), (6, 0.4), (9, 0.3)]);
        let lc = host(3, &cold, 2048, u64::MAX);
        let lh = host(3, &hot, 2048, u64::MAX);
        assert_eq!(lc.indices.len(), lh.indices.len());
        let (uc, uh) = (unique_rows(&lc.indices), unique_rows(&lh.indices));
        assert!(uh * 20 < uc, "unique rows: cold {uc}, hot {uh}");
        // The measured histograms follow the bins.
        let hc = reuse_histogram(&lc.indices);
        assert!((hc[0] - 0.95).abs() < 0.02, "{hc:?}");
        let hh = reuse_histogram(&lh.indices);
        assert!(hh[0] > 0.2 && hh[6] > 0.25 && hh[9] > 0.15, "{hh:?}");
        // Unique rows ≈ lookups / mean reuse.
        let expect = lh.indices.len() as f64 / hot.mean_reuse();
        assert!((uh as f64 / expect - 1.0).abs() < 0.35, "{uh} vs {expect}");
    }

    #[test]
    fn empty_bins_are_never_drawn_even_when_shares_round() {
        // Shares that do not sum to exactly 1 in floating point.
        let mut bins = [0.0; NUM_BINS];
        bins[0] = 0.1;
        bins[2] = 0.2;
        bins[5] = 0.7;
        let th = bin_thresholds(&bins);
        assert!(th[5..].iter().all(|&t| t == SPAN), "{th:?}");
        assert_eq!(th[1], th[0]);
        assert_eq!(bin_thresholds(&[0.0; NUM_BINS]), [SPAN; NUM_BINS - 1]);
        assert_eq!(bin_thresholds(&[f64::NAN; NUM_BINS]), [SPAN; NUM_BINS - 1]);
        let t = table("t", 10_000_000, 0.625, &[(0, 0.1), (2, 0.2), (5, 0.7)]);
        let h = reuse_histogram(&host(4, &t, 8192, u64::MAX).indices);
        let nonzero: Vec<usize> = (0..NUM_BINS).filter(|&k| h[k] > 0.0).collect();
        // Counts up to 32, and the last row's count cut: never above bin 5.
        assert!(nonzero.iter().all(|&k| k <= 5), "{h:?}");
    }

    #[test]
    fn sampled_rows_are_distinct_rows_spread_like_a_uniform_sample() {
        let rows_of = |count: i64, rows: u64, seed: u64| {
            Vec::<i64>::try_from(&sample_rows(count, rows, seed, Device::Cpu).unwrap()).unwrap()
        };
        // Every row once, when all are drawn; the scalar walk agrees.
        for rows in [1u64, 2, 3, 5, 97, 1000, 4096] {
            let got = rows_of(rows as i64, rows, 11);
            assert_eq!(unique_rows(&got), rows as usize, "{rows} rows");
            assert!(got.iter().all(|&r| (0..rows as i64).contains(&r)));
            let want: Vec<i64> = (0..rows)
                .map(|j| reference_row(j, rows, 11) as i64)
                .collect();
            assert_eq!(got, want, "{rows} rows");
        }
        // Huge tables: in range and exact (values near 2^40).
        let big = rows_of(1000, 1 << 40, 3);
        assert!(big.iter().all(|&r| (0..1i64 << 40).contains(&r)));
        assert!(big.iter().any(|&r| r > 1 << 39));
        assert_eq!(unique_rows(&big), 1000);
        assert_eq!(big[7], reference_row(7, 1 << 40, 3) as i64);
        // 20 000 of 1 M rows touch the 4 KiB pages (128 rows of 32 B) a
        // uniform sample touches: N·(1 − (1 − 1/N)^s) of N pages, about 7208.
        for seed in 0..5 {
            let mut pages: Vec<i64> = rows_of(20_000, 1_000_000, seed)
                .iter()
                .map(|r| r / 128)
                .collect();
            pages.sort_unstable();
            pages.dedup();
            let n = 1_000_000f64 / 128.0;
            let expect = n * (1.0 - (1.0 - 1.0 / n).powi(20_000));
            let ratio = pages.len() as f64 / expect;
            assert!(
                (ratio - 1.0).abs() < 0.02,
                "seed {seed}: {} pages, {ratio}",
                pages.len()
            );
        }
    }

    #[test]
    fn same_seed_same_lookups_other_seed_other_lookups() {
        let t = table("t", 100_000, 4.0, &[(0, 0.6), (2, 0.4)]);
        assert_eq!(host(5, &t, 128, 1000), host(5, &t, 128, 1000));
        assert_ne!(host(5, &t, 128, 1000), host(6, &t, 128, 1000));
        let mut u = t.clone();
        u.name = "u".into();
        assert_ne!(host(5, &t, 128, 1000), host(5, &u, 128, 1000));
        assert_eq!(table_seed(0, "abc"), table_seed(0, "abc"));
        assert!(same_on(&[Device::Cpu]).is_ok());
    }

    #[test]
    fn the_cache_keys_on_everything_that_shapes_lookups_and_stays_bounded() {
        let base = table("t", 1000, 4.0, &[(0, 0.5), (3, 0.5)]);
        let key = LookupKey::of(&base);
        let mut wider = base.clone();
        wider.dim = 64; // the lookups do not depend on it
        assert_eq!(key, LookupKey::of(&wider));
        let mut hotter = base.clone();
        hotter.bins = table("t", 1000, 4.0, &[(0, 0.1), (3, 0.9)]).bins;
        let mut more_rows = base.clone();
        more_rows.rows = 2000;
        let mut busier = base.clone();
        busier.pooling_factor = 8.0;
        let mut renamed = base.clone();
        renamed.name = "u".into();
        for other in [&hotter, &more_rows, &busier, &renamed] {
            assert_ne!(key, LookupKey::of(other), "{other:?}");
        }
        // 64 samples: 256 lookups of `base`, 512 of `busier`; room for 600.
        let mut cache = LookupCache::new(2, 64, u64::MAX, Device::Cpu, 600);
        let first = cache.get(&base).unwrap();
        assert_eq!(cache.held(), 256);
        let again = cache.get(&base).unwrap();
        assert_eq!(
            first.indices.data_ptr(),
            again.indices.data_ptr(),
            "kept, not redrawn"
        );
        assert_eq!(again.to_host().unwrap(), host(2, &base, 64, u64::MAX));
        let busy = cache.get(&busier).unwrap().to_host().unwrap();
        assert_eq!(busy, host(2, &busier, 64, u64::MAX));
        assert_eq!(cache.held(), 512, "emptied before going over its bound");
        let redrawn = cache.get(&base).unwrap();
        assert_ne!(first.indices.data_ptr(), redrawn.indices.data_ptr());
        // A table bigger than the whole cache is handed out, not kept.
        let mut huge = base.clone();
        huge.pooling_factor = 20.0; // 1280 lookups
        assert_eq!(cache.get(&huge).unwrap().len(), 1280);
        assert_eq!(cache.held(), 256);
    }

    #[test]
    fn fused_lookups_shift_rows_offsets_and_bags() {
        let a = table("a", 30, 2.0, &[(0, 1.0)]);
        let b = table("b", 50, 1.0, &[(0, 1.0)]);
        let la = for_table(1, &a, 4, u64::MAX, Device::Cpu).unwrap();
        let lb = for_table(1, &b, 4, u64::MAX, Device::Cpu).unwrap();
        let (ha, hb) = (la.to_host().unwrap(), lb.to_host().unwrap());
        let f = fuse(vec![la, lb], &[30, 50]).unwrap().to_host().unwrap();
        let shifted = |v: &[i64], by: i64| v.iter().map(|x| x + by).collect::<Vec<_>>();
        assert_eq!(
            f.indices,
            [ha.indices.clone(), shifted(&hb.indices, 30)].concat()
        );
        assert_eq!(
            f.offsets,
            [ha.offsets.clone(), shifted(&hb.offsets, 8)].concat()
        );
        assert_eq!(f.bags, [ha.bags.clone(), shifted(&hb.bags, 4)].concat());
        assert!(fuse(Vec::new(), &[]).is_err());
    }

    #[test]
    fn zero_pooling_gives_empty_bags_and_too_many_lookups_are_refused() {
        let t = table("t", 100, 0.0, &[(0, 1.0)]);
        let l = host(0, &t, 8, 100);
        assert!(l.indices.is_empty() && l.bags.is_empty());
        assert_eq!(l.offsets, vec![0; 8]);
        let nan = table("nan", 100, f64::NAN, &[(0, 1.0)]);
        assert!(host(0, &nan, 8, 100).indices.is_empty());
        let busy = table("busy", 100, 1e5, &[(0, 1.0)]);
        let e = for_table(0, &busy, 65536, 100, Device::Cpu)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("table `busy`") && e.contains("6553600000"),
            "{e}"
        );
    }
}
