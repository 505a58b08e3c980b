//! One device's share of an iteration, as FBGEMM's table-batched embedding
//! kernel does it: one fused lookup over all the device's tables, the pooled
//! output in the sample-major layout the all-to-all sends, and a backward
//! that reduces the output gradient per unique row and applies the
//! optimizer to those rows only. libtorch ops on any device: the `cuda`
//! backend runs it on a GPU, the tests here on the CPU.
//!
//! - *forward*: `embedding_bag` (sum) over the fused weight `[Σ rows,
//!   widest]` gives `[T·B, widest]`; a transpose and one column gather (by
//!   [`DeviceLayout::packed_columns`]) make it `[B, S]`, each table cut to its
//!   dim, in fp32 whatever the weight's precision (FBGEMM's default output);
//! - *backward*: the `[B, S]` gradient scattered back to `[T·B, widest]`,
//!   the lookups sorted by row, each unique row's segment of gradients summed
//!   (one `embedding_bag` over the gradient), then the optimizer's update of
//!   those rows and their state (`sgd`, `rowwise_adagrad`, `adagrad`,
//!   `adam` without bias correction: the memory traffic of each, which is
//!   what the timing is about).

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

/// How a fused device is built.
#[derive(Debug, Clone, Copy)]
pub struct FusedSpec {
    pub device: Device,
    pub precision: Precision,
    pub optimizer: Optimizer,
    pub learning_rate: f64,
}

/// The optimizer's state of the fused weight.
#[derive(Debug)]
enum State {
    Sgd,
    /// `[rows]`: mean squared gradient, accumulated.
    RowwiseAdagrad(Tensor),
    /// `[rows, widest]`.
    Adagrad(Tensor),
    /// First and second moments, `[rows, widest]` each.
    Adam(Tensor, Tensor),
}

/// One device's fused tables, lookups and buffers.
#[derive(Debug)]
pub struct FusedDevice {
    tables: usize,
    batch: i64,
    widest: i64,
    dim_sum: i64,
    learning_rate: f64,
    weight: Tensor,
    state: State,
    indices: Tensor,
    offsets: Tensor,
    /// Bag of each lookup, `[lookups]`.
    bags: Tensor,
    /// The rows looked up, each once, ascending, and where each one's
    /// segment starts among the sorted lookups: the lookups are the same
    /// every iteration, so these are found once, and the backward needs no
    /// answer from the device before it can launch its work.
    unique: Tensor,
    starts: Tensor,
    /// [`DeviceLayout::packed_columns`], `[S]`.
    columns: Tensor,
}

impl FusedDevice {
    /// `lookups[i]`: one batch of the device's `i`-th table (rows within its
    /// capped rows). Nothing is built for a device with no table.
    pub fn build(
        layout: &DeviceLayout,
        lookups: &[&Lookups],
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
        let parts: Vec<(&Lookups, i64)> = lookups
            .iter()
            .zip(&layout.first_row)
            .map(|(&l, &r)| (l, r as i64))
            .collect();
        let fused = indices::fuse(&parts);
        let (rows, widest) = (layout.total_rows() as i64, layout.widest as i64);
        let dev = spec.device;
        let weight_kind = match spec.precision {
            Precision::Fp16 => Kind::Half,
            Precision::Fp32 => Kind::Float,
        };
        let f32_zeros = |shape: &[i64]| Tensor::f_zeros(shape, (Kind::Float, dev));
        let state = match spec.optimizer {
            Optimizer::Sgd => State::Sgd,
            Optimizer::RowwiseAdagrad => State::RowwiseAdagrad(f32_zeros(&[rows])?),
            Optimizer::Adagrad => State::Adagrad(f32_zeros(&[rows, widest])?),
            Optimizer::Adam => {
                State::Adam(f32_zeros(&[rows, widest])?, f32_zeros(&[rows, widest])?)
            }
        };
        let upload = |v: &[i64]| Tensor::f_from_slice(v)?.f_to_device(dev);
        let indices = upload(&fused.indices)?;
        let (sorted, _) = indices.f_sort(0, false)?;
        let (unique, _, counts) = sorted.f_unique_consecutive(false, true, None)?;
        let starts = counts.f_cumsum(0, Kind::Int64)?.f_sub(&counts)?;
        Ok(FusedDevice {
            tables: layout.tables.len(),
            batch: batch as i64,
            widest,
            dim_sum: layout.dim_sum as i64,
            learning_rate: spec.learning_rate,
            weight: Tensor::f_full([rows, widest], WEIGHT_INIT, (weight_kind, dev))?,
            state,
            indices,
            offsets: upload(&fused.offsets)?,
            bags: upload(&fused.bag_ids())?,
            unique,
            starts,
            columns: upload(&layout.packed_columns())?,
        })
    }

    /// The fused weight `[Σ rows, widest]`.
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    /// The fused lookup: `[B, S]` fp32, sample-major, tables cut to their dims.
    pub fn forward(&self) -> Result<Tensor, TchError> {
        let (t, b, w) = (self.tables as i64, self.batch, self.widest);
        sum_bags(&self.weight, &self.indices, &self.offsets)?
            .f_view([t, b, w])?
            .f_permute([1, 0, 2])?
            .f_contiguous()?
            .f_view([b, t * w])?
            .f_index_select(1, &self.columns)?
            .f_to_kind(Kind::Float)
    }

    /// Applies the output gradient `[B, S]` (fp32): sort the lookups by
    /// row, sum each unique row's segment of gradients, then the optimizer
    /// step on those rows. The sort runs every iteration, as FBGEMM's does;
    /// its result is the same each time, so the segments found at build
    /// time apply.
    pub fn backward(&mut self, grad: &Tensor) -> Result<(), TchError> {
        let (t, b, w) = (self.tables as i64, self.batch, self.widest);
        let mut padded = Tensor::f_zeros([b, t * w], (Kind::Float, self.weight.device()))?;
        let _ = padded.f_index_copy_(1, &self.columns, &grad.f_view([b, self.dim_sum])?)?;
        let per_bag = padded
            .f_view([b, t, w])?
            .f_permute([1, 0, 2])?
            .f_contiguous()?
            .f_view([t * b, w])?;
        let (_, order) = self.indices.f_sort(0, false)?;
        let bags = self.bags.f_index_select(0, &order)?;
        let g = sum_bags(&per_bag, &bags, &self.starts)?;
        let unique = self.unique.shallow_clone();
        self.update(&unique, &g)
    }

    /// One optimizer step on rows `unique` with their gradients `g`.
    fn update(&mut self, unique: &Tensor, g: &Tensor) -> Result<(), TchError> {
        let lr = self.learning_rate;
        let step = match &mut self.state {
            State::Sgd => g.f_mul_scalar(lr)?,
            State::RowwiseAdagrad(acc) => {
                let a = acc
                    .f_index_select(0, unique)?
                    .f_add(&g.f_square()?.f_mean_dim(1, false, Kind::Float)?)?;
                let _ = acc.f_index_copy_(0, unique, &a)?;
                let scale = a
                    .f_sqrt()?
                    .f_add_scalar(EPS)?
                    .f_reciprocal()?
                    .f_mul_scalar(lr)?;
                g.f_mul(&scale.f_unsqueeze(1)?)?
            }
            State::Adagrad(acc) => {
                let a = acc.f_index_select(0, unique)?.f_add(&g.f_square()?)?;
                let _ = acc.f_index_copy_(0, unique, &a)?;
                g.f_div(&a.f_sqrt()?.f_add_scalar(EPS)?)?.f_mul_scalar(lr)?
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
                    .f_mul_scalar(lr)?
            }
        };
        let kind = self.weight.kind();
        let _ = self
            .weight
            .f_index_add_(0, unique, &step.f_neg()?.f_to_kind(kind)?)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::PlanLayout;
    use common::{Plan, Table};

    fn table(name: &str, rows: u64, dim: u32, pooling: f64) -> Table {
        crate::test_table(name, rows, dim, pooling, &[(0, 0.5), (3, 0.5)])
    }

    const BATCH: u64 = 16;

    /// Three tables of different dims fused on one device, their lookups,
    /// and weights whose every entry differs.
    fn setup(
        precision: Precision,
        optimizer: Optimizer,
    ) -> (DeviceLayout, Vec<Lookups>, FusedDevice) {
        let tables = vec![
            table("a", 40, 8, 3.0),
            table("b", 25, 4, 1.5),
            table("c", 60, 6, 5.0),
        ];
        let plan = Plan {
            devices: 1,
            assignment: vec![0, 0, 0],
        };
        let layout = PlanLayout::new(&tables, &plan, BATCH, 0).devices[0].clone();
        let lookups: Vec<Lookups> = tables
            .iter()
            .map(|t| indices::for_table(3, t, BATCH as usize, u64::MAX))
            .collect();
        let spec = FusedSpec {
            device: Device::Cpu,
            precision,
            optimizer,
            learning_rate: 0.5,
        };
        let refs: Vec<&Lookups> = lookups.iter().collect();
        let mut fused = FusedDevice::build(&layout, &refs, BATCH, spec).unwrap();
        let rows = layout.total_rows() as i64;
        let w = Tensor::arange(rows * 8, (Kind::Float, Device::Cpu))
            .view([rows, 8])
            .sin()
            .to_kind(fused.weight.kind());
        fused.weight.copy_(&w);
        (layout, lookups, fused)
    }

    fn values(t: &Tensor) -> Vec<f32> {
        Vec::<f32>::try_from(t.to_kind(Kind::Float).flatten(0, -1)).unwrap()
    }

    /// Each table looked up alone, its own rows and dim, concatenated.
    fn naive_forward(layout: &DeviceLayout, lookups: &[Lookups], weight: &[f32]) -> Vec<f32> {
        let w = layout.widest as usize;
        let mut out = vec![0f32; BATCH as usize * layout.dim_sum as usize];
        for (i, l) in lookups.iter().enumerate() {
            let lens = l.bag_lengths();
            let mut k = 0;
            for (b, &n) in lens.iter().enumerate() {
                for &row in &l.indices[k..k + n] {
                    let r = layout.first_row[i] as usize + row as usize;
                    for c in 0..layout.dims[i] as usize {
                        let col = layout.first_col[i] as usize + c;
                        out[b * layout.dim_sum as usize + col] += weight[r * w + c];
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

    #[test]
    fn the_fused_forward_is_each_table_looked_up_alone() {
        for precision in [Precision::Fp32, Precision::Fp16] {
            let (layout, lookups, fused) = setup(precision, Optimizer::Sgd);
            let out = fused.forward().unwrap();
            assert_eq!(out.size(), vec![BATCH as i64, layout.dim_sum as i64]);
            assert_eq!(out.kind(), Kind::Float);
            let want = naive_forward(&layout, &lookups, &values(fused.weight()));
            let tol = if precision == Precision::Fp16 {
                2e-2
            } else {
                1e-4
            };
            assert!(close(&values(&out), &want, tol), "{precision:?}");
        }
    }

    /// The gradient of the weight for output gradient `grad` ([B, S]).
    fn naive_weight_grad(layout: &DeviceLayout, lookups: &[Lookups], grad: &[f32]) -> Vec<f32> {
        let w = layout.widest as usize;
        let mut g = vec![0f32; layout.total_rows() as usize * w];
        for (i, l) in lookups.iter().enumerate() {
            let mut k = 0;
            for (b, n) in l.bag_lengths().into_iter().enumerate() {
                for &row in &l.indices[k..k + n] {
                    let r = layout.first_row[i] as usize + row as usize;
                    for c in 0..layout.dims[i] as usize {
                        let col = layout.first_col[i] as usize + c;
                        g[r * w + c] += grad[b * layout.dim_sum as usize + col];
                    }
                }
                k += n;
            }
        }
        g
    }

    fn output_grad(layout: &DeviceLayout) -> Tensor {
        let n = BATCH as i64 * layout.dim_sum as i64;
        Tensor::arange(n, (Kind::Float, Device::Cpu))
            .cos()
            .view([BATCH as i64, layout.dim_sum as i64])
    }

    #[test]
    fn sgd_backward_subtracts_the_dense_gradient() {
        let (layout, lookups, mut fused) = setup(Precision::Fp32, Optimizer::Sgd);
        let before = values(fused.weight());
        let grad = output_grad(&layout);
        fused.backward(&grad).unwrap();
        let g = naive_weight_grad(&layout, &lookups, &values(&grad));
        let want: Vec<f32> = before.iter().zip(&g).map(|(w, g)| w - 0.5 * g).collect();
        assert!(close(&values(fused.weight()), &want, 1e-4));
        assert!(g.iter().any(|&x| x != 0.0), "the test must touch rows");
    }

    #[test]
    fn adaptive_optimizers_change_only_the_rows_looked_up() {
        for optimizer in [
            Optimizer::RowwiseAdagrad,
            Optimizer::Adagrad,
            Optimizer::Adam,
        ] {
            let (layout, lookups, mut fused) = setup(Precision::Fp32, optimizer);
            let before = values(fused.weight());
            let grad = output_grad(&layout);
            fused.backward(&grad).unwrap();
            let after = values(fused.weight());
            let g = naive_weight_grad(&layout, &lookups, &values(&grad));
            let w = layout.widest as usize;
            for r in 0..layout.total_rows() as usize {
                let touched = g[r * w..(r + 1) * w].iter().any(|&x| x != 0.0);
                let moved = (0..w).any(|c| after[r * w + c] != before[r * w + c]);
                assert_eq!(touched, moved, "{optimizer:?} row {r}");
                // Every step goes against the gradient.
                for c in 0..w {
                    let (dw, dg) = (after[r * w + c] - before[r * w + c], g[r * w + c]);
                    assert!(dw * dg <= 0.0, "{optimizer:?} row {r} col {c}");
                }
            }
        }
        // Row-wise AdaGrad's accumulator holds each row's mean squared gradient.
        let (layout, lookups, mut fused) = setup(Precision::Fp32, Optimizer::RowwiseAdagrad);
        let grad = output_grad(&layout);
        fused.backward(&grad).unwrap();
        let g = naive_weight_grad(&layout, &lookups, &values(&grad));
        let w = layout.widest as usize;
        let State::RowwiseAdagrad(acc) = &fused.state else {
            panic!("not row-wise AdaGrad")
        };
        let want: Vec<f32> = g
            .chunks(w)
            .map(|row| row.iter().map(|x| x * x).sum::<f32>() / w as f32)
            .collect();
        assert!(close(&values(acc), &want, 1e-3));
    }

    #[test]
    fn mismatched_lookups_are_errors() {
        let (layout, lookups, _) = setup(Precision::Fp32, Optimizer::Sgd);
        let spec = FusedSpec {
            device: Device::Cpu,
            precision: Precision::Fp32,
            optimizer: Optimizer::Sgd,
            learning_rate: 0.1,
        };
        let two: Vec<&Lookups> = lookups.iter().take(2).collect();
        assert!(FusedDevice::build(&layout, &two, BATCH, spec).is_err());
        let all: Vec<&Lookups> = lookups.iter().collect();
        assert!(FusedDevice::build(&layout, &all, BATCH + 1, spec).is_err());
    }
}
