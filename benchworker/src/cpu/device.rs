//! One device's work in a `cpu` measurement: its tables' lookups and
//! weights in the kernel `cpu.kernel` picks, built once per measurement,
//! and its forward and backward.

use common::config::CpuConfig;
use common::{Precision, Table};
use tch::{Device, Kind, TchError, Tensor};

use super::{weight_shape, F32, LEARNING_RATE};
use crate::fbgemm::Tbe;
use crate::fused::sum_bags;
use crate::indices::{self, LookupCache, Lookups};

/// One device's fused work, built once per measurement.
pub(super) struct DeviceWork {
    /// Task indices of its tables, in the order of the fused output.
    pub(super) tables: Vec<usize>,
    pub(super) dims: Vec<i64>,
    pub(super) batch: i64,
    pub(super) kernel: DeviceKernel,
    /// Gradient of the pooled output, in the kernel's layout, assembled by
    /// the backward all-to-all (padding columns stay zero).
    pub(super) grad: Tensor,
}

/// A device's kernel and what it keeps between iterations.
pub(super) enum DeviceKernel {
    /// libtorch's `embedding_bag` over `[rows, widest dim]`; the pooled
    /// output is `[T_d·B, D_max]`, table-major.
    Torch {
        weight: Tensor,
        indices: Tensor,
        offsets: Tensor,
        /// Bag of each lookup (static for the batch, like `offsets`).
        bags: Tensor,
    },
    /// FBGEMM's TBE; the pooled output is `[B, Σ dims]`, sample-major,
    /// table `i` from column `cols[i]`.
    Fbgemm { tbe: Tbe, cols: Vec<i64> },
}

impl DeviceWork {
    /// `weight`: the device's fused weight, for the `torch` kernel.
    pub(super) fn build(
        tables: &[Table],
        group: &[usize],
        cfg: &CpuConfig,
        weight: Option<Tensor>,
        lookups: &mut LookupCache,
    ) -> Result<Self, TchError> {
        let lookups = group
            .iter()
            .map(|&t| lookups.get(&tables[t]))
            .collect::<Result<Vec<Lookups>, _>>()?;
        let rows: Vec<i64> = group
            .iter()
            .map(|&t| indices::capped_rows(&tables[t], cfg.max_rows) as i64)
            .collect();
        let dims: Vec<i64> = group.iter().map(|&t| tables[t].dim as i64).collect();
        let batch = cfg.batch as i64;
        let (kernel, grad_shape) = match weight {
            Some(weight) => {
                let fused = indices::fuse(lookups, &rows)?;
                let (_, dim) = weight_shape(tables, group, cfg.max_rows);
                let kernel = DeviceKernel::Torch {
                    weight,
                    indices: fused.indices,
                    offsets: fused.offsets,
                    bags: fused.bags,
                };
                (kernel, [group.len() as i64 * batch, dim])
            }
            None => {
                let tbe = Tbe::build(
                    Device::Cpu,
                    &rows,
                    &dims,
                    &lookups,
                    batch,
                    Precision::Fp32,
                    LEARNING_RATE,
                )
                .map_err(|e| TchError::Kind(e.to_string()))?;
                let cols = crate::layout::prefix_sums(&dims);
                let kernel = DeviceKernel::Fbgemm { tbe, cols };
                (kernel, [batch, dims.iter().sum()])
            }
        };
        Ok(DeviceWork {
            tables: group.to_vec(),
            dims,
            batch,
            kernel,
            grad: Tensor::f_zeros(grad_shape, F32)?,
        })
    }

    /// The fused lookup: one call over all the device's bags.
    pub(super) fn forward(&mut self) -> Result<Tensor, TchError> {
        match &mut self.kernel {
            DeviceKernel::Torch {
                weight,
                indices,
                offsets,
                ..
            } => sum_bags(weight, indices, offsets),
            DeviceKernel::Fbgemm { tbe, .. } => {
                tbe.forward().map_err(|e| TchError::Kind(e.to_string()))
            }
        }
    }

    /// Table `i`'s rows `first..first + count` of `pooled`, a pooled output
    /// or its gradient in this kernel's layout.
    pub(super) fn block(
        &self,
        pooled: &Tensor,
        i: usize,
        first: i64,
        count: i64,
    ) -> Result<Tensor, TchError> {
        let (row, col) = match &self.kernel {
            DeviceKernel::Torch { .. } => (i as i64 * self.batch + first, 0),
            DeviceKernel::Fbgemm { cols, .. } => (first, cols[i]),
        };
        pooled
            .f_narrow(0, row, count)?
            .f_narrow(1, col, self.dims[i])
    }

    /// The backward of `pooled`, this iteration's forward output, from the
    /// gradient the exchange assembled. `torch`: sort by row,
    /// segment-reduce the output gradients per unique row, and update
    /// those rows (SGD). `fbgemm`: its fused backward (row-wise AdaGrad).
    pub(super) fn backward(&mut self, pooled: &Tensor) -> Result<(), TchError> {
        let (weight, indices, bags) = match &mut self.kernel {
            DeviceKernel::Torch {
                weight,
                indices,
                bags,
                ..
            } => (weight, indices, bags),
            DeviceKernel::Fbgemm { tbe, .. } => {
                return tbe
                    .backward(pooled, &self.grad)
                    .map_err(|e| TchError::Kind(e.to_string()));
            }
        };
        let (rows, order) = indices.f_sort(0, false)?;
        let bags = bags.f_index_select(0, &order)?;
        let (unique, _, counts) = rows.f_unique_consecutive(false, true, None)?;
        let starts = counts.f_cumsum(0, Kind::Int64)?.f_sub(&counts)?;
        let mut row_grad = sum_bags(&self.grad, &bags, &starts)?;
        // In place: an op that takes a `Scalar` must not allocate (a failed
        // allocation would panic, see [`CpuOracle::weights`]).
        let _ = row_grad.f_mul_scalar_(-LEARNING_RATE)?;
        let _ = weight.f_index_add_(0, &unique, &row_grad)?;
        Ok(())
    }
}
