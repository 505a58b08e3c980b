//! One device's share of an iteration, as FBGEMM's table-batched embedding
//! kernel does it: fused lookups over the device's tables, the pooled
//! output in the sample-major layout the all-to-all sends, and a backward
//! that reduces the output gradient per unique row and applies the
//! optimizer to those rows only. libtorch ops on any device: the `cuda`
//! backend runs it on a GPU, the tests here on the CPU.
//!
//! FBGEMM's kernel takes tables of any dims in one call and reads each
//! table's own dim. libtorch's `embedding_bag` takes one width, so the
//! device's tables of each dim are fused ([`DeviceLayout::dim_groups`]):
//! one weight `[Σ rows, dim]` and one call per distinct dim (DLRM pools
//! have a handful: 16, 32, 64, 128). Padding every table to the widest
//! instead reads the widest dim's bytes for every lookup: on an H100 that
//! made a fused call over 32 mixed tables about twice as slow as the 32
//! single-table calls (docs/gpu.md).
//!
//! - *forward*: per group, `embedding_bag` (sum) gives `[T_g·B, dim]`, made
//!   `[B, T_g·dim]`; the groups side by side, one column gather (by
//!   [`DeviceLayout::grouped_columns`], skipped when it is the identity)
//!   makes `[B, S]` in table order, in fp32 whatever the weight's precision
//!   (FBGEMM's default output);
//! - *backward*: the `[B, S]` gradient scattered back to the groups'
//!   `[T_g·B, dim]`, per group the lookups sorted by row, each unique row's
//!   segment of gradients summed (one `embedding_bag` over the gradient,
//!   each of its bags a piece of at most [`SEGMENT_PIECE`] lookups of one
//!   segment, the pieces then added into their rows), then the optimizer's
//!   update of those rows and their state (`sgd`, `rowwise_adagrad`,
//!   `adagrad`, `adam` without bias correction: the memory traffic of each,
//!   which is what the timing is about).

use common::{Optimizer, Precision};
use tch::{Device, Kind, TchError, Tensor};

use crate::indices::{self, Lookups};
use crate::layout::DeviceLayout;

/// `embedding_bag`'s mode for sum pooling.
const MODE_SUM: i64 = 0;
/// Initial weights: normal floats, whose values do not matter for timing.
const WEIGHT_INIT: f64 = 0.01;
const EPS: f64 = 1e-8;
const BETA1: f64 = 0.9;
const BETA2: f64 = 0.999;
/// Most lookups of one row summed by one bag of the backward's reduction.
/// `embedding_bag` sums each bag in one thread per column, serially, so a
/// hot row's segment (a large share of a table's lookups) left whole keeps
/// one thread busy for milliseconds while the GPU idles (on an H100, one
/// table's backward took 7.4 ms so, docs/gpu.md). Cut into pieces of this
/// many, added into their row afterwards, as FBGEMM's backward splits long
/// segments across warps (its `max_segment_length_per_warp`, 32).
pub const SEGMENT_PIECE: i64 = 32;

/// `embedding_bag` in sum mode: row `b` of the result sums the rows of
/// `weight` that `indices[offsets[b]..offsets[b + 1]]` name.
pub fn sum_bags(weight: &Tensor, indices: &Tensor, offsets: &Tensor) -> Result<Tensor, TchError> {
    let (out, _, _, _) = Tensor::f_embedding_bag(
        weight,
        indices,
        offsets,
        false,
        MODE_SUM,
        false,
        None::<Tensor>,
        false,
    )?;
    Ok(out)
}

/// Cuts sorted segments of `counts[u]` lookups each into pieces of at most
/// `piece` lookups: where each piece starts among the `Σ counts` lookups
/// (ascending, the first 0) and its segment `u`, both `[pieces]`.
pub fn segment_pieces(counts: &Tensor, piece: i64) -> Result<(Tensor, Tensor), TchError> {
    if piece < 1 {
        return Err(TchError::Kind(format!("pieces of {piece} lookups")));
    }
    let dev = counts.device();
    let segments = counts.size()[0];
    let lookups = counts.f_sum(Kind::Int64)?.int64_value(&[]);
    let starts = counts.f_cumsum(0, Kind::Int64)?.f_sub(counts)?;
    let segment = Tensor::f_arange(segments, (Kind::Int64, dev))?
        .f_repeat_interleave_self_tensor(counts, 0, lookups)?;
    let within = Tensor::f_arange(lookups, (Kind::Int64, dev))?
        .f_sub(&starts.f_index_select(0, &segment)?)?;
    let piece_starts = within
        .f_remainder(piece)?
        .f_eq(0)?
        .f_nonzero()?
        .f_squeeze_dim(1)?;
    let piece_rows = segment.f_index_select(0, &piece_starts)?;
    Ok((piece_starts, piece_rows))
}

/// How a fused device is built.
#[derive(Debug, Clone, Copy)]
pub struct FusedSpec {
    pub device: Device,
    pub precision: Precision,
    pub optimizer: Optimizer,
    pub learning_rate: f64,
}

/// The optimizer's state of a fused weight.
#[derive(Debug)]
enum State {
    Sgd,
    /// `[rows]`: mean squared gradient, accumulated.
    RowwiseAdagrad(Tensor),
    /// `[rows, dim]`.
    Adagrad(Tensor),
    /// First and second moments, `[rows, dim]` each.
    Adam(Tensor, Tensor),
}

/// A device's tables of one dim, fused: their weight, optimizer state and
/// lookups.
#[derive(Debug)]
struct Group {
    tables: i64,
    dim: i64,
    /// How many rows of `weight` each of its tables has, one after another.
    rows: Vec<i64>,
    weight: Tensor,
    state: State,
    indices: Tensor,
    offsets: Tensor,
    /// What the backward sorts each iteration: the indices as 32-bit
    /// integers when the group's rows allow (half the bytes a radix sort
    /// moves; FBGEMM's sort likewise covers only the bits the rows need).
    sort_keys: Tensor,
    /// Bag of each lookup, `[lookups]`.
    bags: Tensor,
    /// The rows looked up, each once, ascending; where each piece of at
    /// most [`SEGMENT_PIECE`] lookups of one row's segment starts among the
    /// sorted lookups; and the piece's row, as a position in `unique`. The
    /// lookups are the same every iteration, so these are found once, and
    /// the backward needs no answer from the device before it can launch
    /// its work.
    unique: Tensor,
    piece_starts: Tensor,
    piece_rows: Tensor,
}

impl Group {
    fn build(
        lookups: Vec<Lookups>,
        rows: Vec<i64>,
        dim: i64,
        spec: FusedSpec,
    ) -> Result<Self, TchError> {
        let tables = lookups.len() as i64;
        let fused = indices::fuse(lookups, &rows)?;
        let total: i64 = rows.iter().sum();
        let dev = spec.device;
        let weight_kind = match spec.precision {
            Precision::Fp16 => Kind::Half,
            Precision::Fp32 => Kind::Float,
        };
        let f32_zeros = |shape: &[i64]| Tensor::f_zeros(shape, (Kind::Float, dev));
        let state = match spec.optimizer {
            Optimizer::Sgd => State::Sgd,
            Optimizer::RowwiseAdagrad => State::RowwiseAdagrad(f32_zeros(&[total])?),
            Optimizer::Adagrad => State::Adagrad(f32_zeros(&[total, dim])?),
            Optimizer::Adam => State::Adam(f32_zeros(&[total, dim])?, f32_zeros(&[total, dim])?),
        };
        let indices = fused.indices.shallow_clone();
        let sort_keys = if total <= i64::from(i32::MAX) {
            indices.f_to_kind(Kind::Int)?
        } else {
            indices.shallow_clone()
        };
        // Allocated, then filled in place: an op taking a `Scalar` panics
        // when its allocation fails, and a weight may be gigabytes.
        let mut weight = Tensor::f_empty([total, dim], (weight_kind, dev))?;
        let _ = weight.f_fill_(WEIGHT_INIT)?;
        let (sorted, _) = indices.f_sort(0, false)?;
        let (unique, _, counts) = sorted.f_unique_consecutive(false, true, None)?;
        let (piece_starts, piece_rows) = segment_pieces(&counts, SEGMENT_PIECE)?;
        Ok(Group {
            tables,
            dim,
            rows,
            weight,
            state,
            indices,
            offsets: fused.offsets,
            sort_keys,
            bags: fused.bags,
            unique,
            piece_starts,
            piece_rows,
        })
    }

    /// The first row of its `k`-th table in `weight`.
    fn first_row(&self, k: usize) -> i64 {
        self.rows[..k].iter().sum()
    }

    /// `[B, T_g·dim]`, its tables side by side, in the weight's precision.
    fn forward(&self, batch: i64) -> Result<Tensor, TchError> {
        let (t, d) = (self.tables, self.dim);
        sum_bags(&self.weight, &self.indices, &self.offsets)?
            .f_view([t, batch, d])?
            .f_permute([1, 0, 2])?
            .f_contiguous()?
            .f_view([batch, t * d])
    }

    /// Applies `grad`, `[B, T_g·dim]` fp32. The sort runs every iteration,
    /// as FBGEMM's does; its result is the same each time, so the pieces
    /// found at build time apply.
    fn backward(&mut self, grad: &Tensor, batch: i64, learning_rate: f64) -> Result<(), TchError> {
        let (t, d) = (self.tables, self.dim);
        let per_bag = grad
            .f_view([batch, t, d])?
            .f_permute([1, 0, 2])?
            .f_contiguous()?
            .f_view([t * batch, d])?;
        let (_, order) = self.sort_keys.f_sort(0, false)?;
        let bags = self.bags.f_index_select(0, &order)?;
        let pieces = sum_bags(&per_bag, &bags, &self.piece_starts)?;
        let mut g = Tensor::f_zeros([self.unique.size()[0], d], (Kind::Float, pieces.device()))?;
        let _ = g.f_index_add_(0, &self.piece_rows, &pieces)?;
        self.update(learning_rate, &g)
    }

    /// One optimizer step on the rows looked up, with their gradients `g`
    /// (`[unique, dim]`). FBGEMM does it in one kernel; here each
    /// libtorch op is a pass over the rows, so the passes are kept few: the
    /// row-wise mean square is a norm (no squared copy), and the step's sign
    /// rides on a scalar.
    fn update(&mut self, lr: f64, g: &Tensor) -> Result<(), TchError> {
        let unique = &self.unique;
        let step = match &mut self.state {
            State::Sgd => g.f_mul_scalar(-lr)?,
            State::RowwiseAdagrad(acc) => {
                let mean_square = g
                    .f_norm_scalaropt_dim(2, [1], false)?
                    .f_square()?
                    .f_div_scalar(self.dim as f64)?;
                let a = acc.f_index_select(0, unique)?.f_add(&mean_square)?;
                let _ = acc.f_index_copy_(0, unique, &a)?;
                let scale = a
                    .f_sqrt()?
                    .f_add_scalar(EPS)?
                    .f_reciprocal()?
                    .f_mul_scalar(-lr)?;
                g.f_mul(&scale.f_unsqueeze(1)?)?
            }
            State::Adagrad(acc) => {
                let a = acc.f_index_select(0, unique)?.f_add(&g.f_square()?)?;
                let _ = acc.f_index_copy_(0, unique, &a)?;
                g.f_div(&a.f_sqrt()?.f_add_scalar(EPS)?)?
                    .f_mul_scalar(-lr)?
            }
            State::Adam(m, v) => {
                let m_u = m
                    .f_index_select(0, unique)?
                    .f_mul_scalar(BETA1)?
                    .f_add(&g.f_mul_scalar(1.0 - BETA1)?)?;
                let v_u = v
                    .f_index_select(0, unique)?
                    .f_mul_scalar(BETA2)?
                    .f_add(&g.f_square()?.f_mul_scalar(1.0 - BETA2)?)?;
                let _ = m.f_index_copy_(0, unique, &m_u)?;
                let _ = v.f_index_copy_(0, unique, &v_u)?;
                m_u.f_div(&v_u.f_sqrt()?.f_add_scalar(EPS)?)?
                    .f_mul_scalar(-lr)?
            }
        };
        let kind = self.weight.kind();
        let _ = self
            .weight
            .f_index_add_(0, unique, &step.f_to_kind(kind)?)?;
        Ok(())
    }
}

/// One device's fused tables, lookups and buffers.
#[derive(Debug)]
pub struct FusedDevice {
    batch: i64,
    dim_sum: i64,
    learning_rate: f64,
    groups: Vec<Group>,
    /// Each table's group and its place there.
    place: Vec<(usize, usize)>,
    /// [`DeviceLayout::grouped_columns`], `[S]`, and its inverse; `None`
    /// when the groups side by side are already in table order.
    gather: Option<(Tensor, Tensor)>,
}

impl FusedDevice {
    /// `lookups[i]`: one batch of the device's `i`-th table (rows within its
    /// capped rows), freed once fused. Nothing is built for a device with no
    /// table.
    pub fn build(
        layout: &DeviceLayout,
        lookups: Vec<Lookups>,
        batch: u64,
        spec: FusedSpec,
    ) -> Result<Self, TchError> {
        let bad = |m: String| Err(TchError::Kind(m));
        if layout.is_empty() {
            return bad("a fused device needs at least one table".into());
        }
        if lookups.len() != layout.tables.len() {
            return bad(format!(
                "{} lookup batches for {} tables",
                lookups.len(),
                layout.tables.len()
            ));
        }
        if let Some(l) = lookups.iter().find(|l| l.bags() as u64 != batch) {
            return bad(format!("{} bags for a batch of {batch}", l.bags()));
        }
        let mut place = vec![(0, 0); layout.tables.len()];
        let mut groups = Vec::new();
        let mut lookups: Vec<Option<Lookups>> = lookups.into_iter().map(Some).collect();
        for (g, group) in layout.dim_groups().into_iter().enumerate() {
            for (k, &i) in group.members.iter().enumerate() {
                place[i] = (g, k);
            }
            let of_group = group
                .members
                .iter()
                .map(|&i| {
                    lookups[i]
                        .take()
                        .ok_or_else(|| TchError::Kind(format!("table {i} in two dim groups")))
                })
                .collect::<Result<Vec<Lookups>, _>>()?;
            let rows = group
                .members
                .iter()
                .map(|&i| layout.rows[i] as i64)
                .collect();
            groups.push(Group::build(of_group, rows, group.dim as i64, spec)?);
        }
        let columns = layout.grouped_columns();
        let gather = if columns.iter().enumerate().all(|(c, &g)| g == c as i64) {
            None
        } else {
            let mut inverse = vec![0i64; columns.len()];
            for (c, &g) in columns.iter().enumerate() {
                inverse[g as usize] = c as i64;
            }
            let upload = |v: &[i64]| Tensor::f_from_slice(v)?.f_to_device(spec.device);
            Some((upload(&columns)?, upload(&inverse)?))
        };
        Ok(FusedDevice {
            batch: batch as i64,
            dim_sum: layout.dim_sum as i64,
            learning_rate: spec.learning_rate,
            groups,
            place,
            gather,
        })
    }

    /// Table `i`'s rows of its group's fused weight, `[rows, dim]` (a view).
    pub fn table_weight(&self, i: usize) -> Result<Tensor, TchError> {
        let (g, k) = self.place[i];
        let group = &self.groups[g];
        group.weight.f_narrow(0, group.first_row(k), group.rows[k])
    }

    /// The fused lookups: `[B, S]` fp32, sample-major, tables in order.
    pub fn forward(&self) -> Result<Tensor, TchError> {
        let mut parts = self
            .groups
            .iter()
            .map(|g| g.forward(self.batch))
            .collect::<Result<Vec<_>, _>>()?;
        // One group is the whole output already: no copy by `cat`.
        let side_by_side = match parts.len() {
            1 => parts.remove(0),
            _ => Tensor::f_cat(&parts, 1)?,
        };
        let packed = match &self.gather {
            Some((columns, _)) => side_by_side.f_index_select(1, columns)?,
            None => side_by_side,
        };
        packed.f_to_kind(Kind::Float)
    }

    /// Applies the output gradient `[B, S]` (fp32) to every group: its rows'
    /// gradients, then the optimizer step on them.
    pub fn backward(&mut self, grad: &Tensor) -> Result<(), TchError> {
        let grad = grad.f_view([self.batch, self.dim_sum])?;
        let grouped = match &self.gather {
            Some((_, inverse)) => grad.f_index_select(1, inverse)?,
            None => grad,
        };
        let (batch, lr) = (self.batch, self.learning_rate);
        let mut start = 0;
        for g in &mut self.groups {
            let width = g.tables * g.dim;
            g.backward(&grouped.f_narrow(1, start, width)?, batch, lr)?;
            start += width;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::indices::HostLookups;
    use crate::layout::PlanLayout;
    use crate::testing::test_device;
    use common::{Plan, Table};

    fn table(name: &str, rows: u64, dim: u32, pooling: f64) -> Table {
        crate::test_table(name, rows, dim, pooling, &[(0, 0.5), (3, 0.5)])
    }

    const BATCH: u64 = 16;

    /// Three tables fused on one device, the first and last of one dim (two
    /// groups, not in table order), their lookups, and weights whose every
    /// entry differs.
    fn setup(
        device: Device,
        precision: Precision,
        optimizer: Optimizer,
    ) -> (DeviceLayout, Vec<HostLookups>, FusedDevice) {
        setup_with(device, &three_tables(), precision, optimizer)
    }

    fn three_tables() -> Vec<Table> {
        vec![
            table("a", 40, 8, 3.0),
            table("b", 25, 4, 1.5),
            table("c", 60, 8, 5.0),
        ]
    }

    fn setup_with(
        device: Device,
        tables: &[Table],
        precision: Precision,
        optimizer: Optimizer,
    ) -> (DeviceLayout, Vec<HostLookups>, FusedDevice) {
        let plan = Plan {
            devices: 1,
            assignment: vec![0; tables.len()],
        };
        let layout = PlanLayout::new(tables, &plan, BATCH, 0).devices[0].clone();
        let lookups = lookups_of(tables, device);
        let spec = FusedSpec {
            device,
            precision,
            optimizer,
            learning_rate: 0.5,
        };
        let host = lookups.iter().map(|l| l.to_host().unwrap()).collect();
        let mut fused = FusedDevice::build(&layout, lookups, BATCH, spec).unwrap();
        let mut next = 0;
        for g in &mut fused.groups {
            let n = g.weight.numel() as i64;
            let w = Tensor::arange_start(next, next + n, (Kind::Float, device))
                .sin()
                .view([-1, g.dim])
                .to_kind(g.weight.kind());
            g.weight.copy_(&w);
            next += n;
        }
        (layout, host, fused)
    }

    fn lookups_of(tables: &[Table], device: Device) -> Vec<Lookups> {
        tables
            .iter()
            .map(|t| indices::for_table(3, t, BATCH, u64::MAX, device).unwrap())
            .collect()
    }

    fn values(t: &Tensor) -> Vec<f32> {
        let t = t.to_kind(Kind::Float).flatten(0, -1).to_device(Device::Cpu);
        Vec::<f32>::try_from(t).unwrap()
    }

    /// Each table's weight, `rows × dim` values.
    fn weights(fused: &FusedDevice, layout: &DeviceLayout) -> Vec<Vec<f32>> {
        (0..layout.tables.len())
            .map(|i| values(&fused.table_weight(i).unwrap()))
            .collect()
    }

    /// Each table looked up alone, its own rows and dim, concatenated.
    fn naive_forward(
        layout: &DeviceLayout,
        lookups: &[HostLookups],
        weights: &[Vec<f32>],
    ) -> Vec<f32> {
        let mut out = vec![0f32; BATCH as usize * layout.dim_sum as usize];
        for (i, l) in lookups.iter().enumerate() {
            let dim = layout.dims[i] as usize;
            let mut k = 0;
            for (b, n) in l.bag_lengths().into_iter().enumerate() {
                for &row in &l.indices[k..k + n] {
                    for c in 0..dim {
                        let col = layout.first_col[i] as usize + c;
                        out[b * layout.dim_sum as usize + col] +=
                            weights[i][row as usize * dim + c];
                    }
                }
                k += n;
            }
        }
        out
    }

    fn close(a: &[f32], b: &[f32], tol: f32) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= tol)
    }

    fn the_fused_forward_is_each_table_looked_up_alone(device: Device) {
        for precision in [Precision::Fp32, Precision::Fp16] {
            let (layout, lookups, fused) = setup(device, precision, Optimizer::Sgd);
            assert_eq!(fused.groups.len(), 2);
            assert!(fused.gather.is_some(), "groups out of table order");
            let out = fused.forward().unwrap();
            assert_eq!(out.size(), vec![BATCH as i64, layout.dim_sum as i64]);
            assert_eq!(out.kind(), Kind::Float);
            let want = naive_forward(&layout, &lookups, &weights(&fused, &layout));
            let tol = if precision == Precision::Fp16 {
                2e-2
            } else {
                1e-4
            };
            assert!(close(&values(&out), &want, tol), "{precision:?}");
        }
        // Tables of one dim: one group, its output as it is.
        let one_dim = [table("a", 40, 8, 3.0), table("c", 60, 8, 5.0)];
        let (layout, lookups, fused) =
            setup_with(device, &one_dim, Precision::Fp32, Optimizer::Sgd);
        assert_eq!(fused.groups.len(), 1);
        assert!(fused.gather.is_none());
        let want = naive_forward(&layout, &lookups, &weights(&fused, &layout));
        assert!(close(&values(&fused.forward().unwrap()), &want, 1e-4));
    }
    test_device!(
        forward_alone,
        the_fused_forward_is_each_table_looked_up_alone
    );

    /// Each table's weight gradient (`rows × dim`) for output gradient
    /// `grad` (`[B, S]`).
    fn naive_weight_grad(
        layout: &DeviceLayout,
        lookups: &[HostLookups],
        grad: &[f32],
    ) -> Vec<Vec<f32>> {
        let mut g: Vec<Vec<f32>> = (0..lookups.len())
            .map(|i| vec![0f32; (layout.rows[i] * layout.dims[i]) as usize])
            .collect();
        for (i, l) in lookups.iter().enumerate() {
            let dim = layout.dims[i] as usize;
            let mut k = 0;
            for (b, n) in l.bag_lengths().into_iter().enumerate() {
                for &row in &l.indices[k..k + n] {
                    for c in 0..dim {
                        let col = layout.first_col[i] as usize + c;
                        g[i][row as usize * dim + c] += grad[b * layout.dim_sum as usize + col];
                    }
                }
                k += n;
            }
        }
        g
    }

    fn output_grad(layout: &DeviceLayout, device: Device) -> Tensor {
        let n = BATCH as i64 * layout.dim_sum as i64;
        Tensor::arange(n, (Kind::Float, device))
            .cos()
            .view([BATCH as i64, layout.dim_sum as i64])
    }

    /// SGD's step leaves `before - 0.5 · gradient` in every table.
    fn assert_sgd_step(layout: &DeviceLayout, lookups: &[HostLookups], fused: &mut FusedDevice) {
        let before = weights(fused, layout);
        let grad = output_grad(layout, fused.groups[0].weight.device());
        fused.backward(&grad).unwrap();
        let g = naive_weight_grad(layout, lookups, &values(&grad));
        assert!(
            g.iter().flatten().any(|&x| x != 0.0),
            "the test must touch rows"
        );
        for (i, (after, (w, g))) in weights(fused, layout)
            .iter()
            .zip(before.iter().zip(&g))
            .enumerate()
        {
            let want: Vec<f32> = w.iter().zip(g).map(|(w, g)| w - 0.5 * g).collect();
            assert!(close(after, &want, 1e-3), "table {i}");
        }
    }

    fn sgd_backward_subtracts_the_dense_gradient(device: Device) {
        let (layout, lookups, mut fused) = setup(device, Precision::Fp32, Optimizer::Sgd);
        assert_sgd_step(&layout, &lookups, &mut fused);
    }
    test_device!(sgd_step, sgd_backward_subtracts_the_dense_gradient);

    #[test]
    fn segments_are_cut_into_pieces_that_keep_their_row() {
        let counts = Tensor::from_slice(&[1i64, 5, 2]);
        let (starts, rows) = segment_pieces(&counts, 2).unwrap();
        assert_eq!(Vec::<i64>::try_from(&starts).unwrap(), [0, 1, 3, 5, 6]);
        assert_eq!(Vec::<i64>::try_from(&rows).unwrap(), [0, 1, 1, 1, 2]);
        let (starts, rows) = segment_pieces(&counts, 8).unwrap();
        assert_eq!(Vec::<i64>::try_from(&starts).unwrap(), [0, 1, 6]);
        assert_eq!(Vec::<i64>::try_from(&rows).unwrap(), [0, 1, 2]);
        // One long segment; none at all; no piece size.
        let (starts, rows) = segment_pieces(&Tensor::from_slice(&[70i64]), 32).unwrap();
        assert_eq!(Vec::<i64>::try_from(&starts).unwrap(), [0, 32, 64]);
        assert_eq!(Vec::<i64>::try_from(&rows).unwrap(), [0, 0, 0]);
        let (starts, rows) = segment_pieces(&Tensor::from_slice::<i64>(&[]), 32).unwrap();
        assert_eq!((starts.numel(), rows.numel()), (0, 0));
        assert!(segment_pieces(&counts, 0).is_err());
    }

    fn hot_rows_longer_than_a_piece_get_their_whole_gradient(device: Device) {
        // Two rows take about 16 · 40 lookups: segments of hundreds.
        let tables = vec![table("hot", 2, 8, 40.0), table("cold", 50, 4, 2.0)];
        let (layout, lookups, mut fused) =
            setup_with(device, &tables, Precision::Fp32, Optimizer::Sgd);
        let longest = lookups[0].indices.iter().filter(|&&r| r == 0).count();
        assert!(
            longest > 4 * SEGMENT_PIECE as usize,
            "{longest} lookups of row 0"
        );
        assert_sgd_step(&layout, &lookups, &mut fused);
    }
    test_device!(
        hot_rows,
        hot_rows_longer_than_a_piece_get_their_whole_gradient
    );

    fn adaptive_optimizers_change_only_the_rows_looked_up(device: Device) {
        for optimizer in [
            Optimizer::RowwiseAdagrad,
            Optimizer::Adagrad,
            Optimizer::Adam,
        ] {
            let (layout, lookups, mut fused) = setup(device, Precision::Fp32, optimizer);
            let before = weights(&fused, &layout);
            let grad = output_grad(&layout, device);
            fused.backward(&grad).unwrap();
            let after = weights(&fused, &layout);
            let g = naive_weight_grad(&layout, &lookups, &values(&grad));
            for i in 0..layout.tables.len() {
                let dim = layout.dims[i] as usize;
                for r in 0..layout.rows[i] as usize {
                    let cols = r * dim..(r + 1) * dim;
                    let touched = g[i][cols.clone()].iter().any(|&x| x != 0.0);
                    let moved = cols.clone().any(|c| after[i][c] != before[i][c]);
                    assert_eq!(touched, moved, "{optimizer:?} table {i} row {r}");
                    // Every step goes against the gradient.
                    for c in cols {
                        let (dw, dg) = (after[i][c] - before[i][c], g[i][c]);
                        assert!(dw * dg <= 0.0, "{optimizer:?} table {i} row {r} col {c}");
                    }
                }
            }
        }
        // Row-wise AdaGrad's accumulator holds each row's mean squared
        // gradient over the table's own dim.
        let (layout, lookups, mut fused) =
            setup(device, Precision::Fp32, Optimizer::RowwiseAdagrad);
        let grad = output_grad(&layout, device);
        fused.backward(&grad).unwrap();
        let g = naive_weight_grad(&layout, &lookups, &values(&grad));
        for (i, (&(gi, k), table_grad)) in fused.place.iter().zip(&g).enumerate() {
            let group = &fused.groups[gi];
            let State::RowwiseAdagrad(acc) = &group.state else {
                panic!("not row-wise AdaGrad")
            };
            let mine = acc.narrow(0, group.first_row(k), group.rows[k]);
            let dim = layout.dims[i] as usize;
            let want: Vec<f32> = table_grad
                .chunks(dim)
                .map(|row| row.iter().map(|x| x * x).sum::<f32>() / dim as f32)
                .collect();
            assert!(close(&values(&mine), &want, 1e-3), "table {i}");
        }
    }
    test_device!(adaptive, adaptive_optimizers_change_only_the_rows_looked_up);

    fn mismatched_lookups_are_errors(device: Device) {
        let (layout, _, _) = setup(device, Precision::Fp32, Optimizer::Sgd);
        let spec = FusedSpec {
            device,
            precision: Precision::Fp32,
            optimizer: Optimizer::Sgd,
            learning_rate: 0.1,
        };
        let mut two = lookups_of(&three_tables(), device);
        two.pop();
        assert!(FusedDevice::build(&layout, two, BATCH, spec).is_err());
        let all = lookups_of(&three_tables(), device);
        assert!(FusedDevice::build(&layout, all, BATCH + 1, spec).is_err());
    }
    test_device!(mismatched, mismatched_lookups_are_errors);
}
