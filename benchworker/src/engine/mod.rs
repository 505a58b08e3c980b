//! The measuring engine of the backends that run real kernels: `cpu` and
//! `cuda` build the same work from the same layout, and differ only in how
//! they move bytes between devices and how they time phases.
//!
//! A plan's devices each get a [`DeviceEngine`]: its tables in one kernel,
//! and the buffers of the all-to-all ([`crate::layout`] says what goes
//! where). The kernel is `kernel` in the backend's config:
//!
//! - `fbgemm`: FBGEMM's table-batched embedding ([`crate::fbgemm`]), one
//!   op over all the device's tables at their own dims, the optimizer fused
//!   into its backward;
//! - `torch`: libtorch's `embedding_bag`, one call per distinct dim
//!   ([`crate::fused`]), and a backward built from libtorch ops in
//!   FBGEMM's manner.
//!
//! Both give the device's pooled output as `[B, S_d]` fp32, sample-major,
//! tables in device order: the layout the forward all-to-all sends from.
//! Both take the output gradient in that layout, as the backward all-to-all
//! leaves it.
//!
//! In one process, [`copy_transfers`] runs an all-to-all as copies between
//! the devices' buffers: the `cpu` backend's exchange, and the tests'
//! stand-in for NCCL on any device.

use common::config::Kernel;
use common::{Optimizer, Precision};
use tch::{Device, Kind, TchError, Tensor};

use crate::fbgemm::{Tbe, TbeOptimizer, TbeSpec};
use crate::fused::{FusedDevice, FusedSpec};
use crate::indices::Lookups;
use crate::layout::{PlanLayout, Transfer};

/// Value of the output gradients the backward all-to-all sends (it does
/// not matter; a normal float).
pub const GRAD_VALUE: f64 = 1e-3;

/// How a device's work is built.
#[derive(Debug, Clone, Copy)]
pub struct EngineSpec {
    pub device: Device,
    pub kernel: Kernel,
    pub precision: Precision,
    pub optimizer: Optimizer,
    pub learning_rate: f64,
}

impl EngineSpec {
    /// Fails where the kernel cannot run this spec (FBGEMM's libraries
    /// missing, or an optimizer it does not fuse), before anything is
    /// built.
    pub fn check(&self) -> Result<(), crate::fbgemm::FbgemmError> {
        if self.kernel == Kernel::Fbgemm {
            TbeOptimizer::of(self.optimizer)?;
            crate::fbgemm::load()?;
        }
        Ok(())
    }
}

/// A device's tables in the configured kernel.
#[derive(Debug)]
enum DeviceKernel {
    Torch(FusedDevice),
    Fbgemm(Tbe),
}

fn fbgemm_err(e: crate::fbgemm::FbgemmError) -> TchError {
    TchError::Kind(e.to_string())
}

/// One device's share of an iteration: its kernel (none for a device with
/// no table) and its all-to-all buffers, all on its device.
#[derive(Debug)]
pub struct DeviceEngine {
    kernel: Option<DeviceKernel>,
    batch: i64,
    dim_sum: i64,
    /// Forward all-to-all: this device's samples of every table,
    /// `[c_e, S_0] ‖ [c_e, S_1] ‖ …`, flat.
    pub recv: Tensor,
    /// Backward all-to-all: the gradients of those, sent back (filled
    /// with [`GRAD_VALUE`]).
    pub grad_out: Tensor,
    /// This device's tables' output gradients, `[B · S_d]` flat, as the
    /// backward all-to-all assembles them.
    pub grad_in: Tensor,
}

impl DeviceEngine {
    /// Device `d` of `layout`; `lookups[i]` is one batch of its `i`-th
    /// table, rows within the layout's capped rows, on `spec.device`.
    pub fn build(
        layout: &PlanLayout,
        d: usize,
        lookups: Vec<Lookups>,
        spec: EngineSpec,
    ) -> Result<Self, TchError> {
        let dev = &layout.devices[d];
        let on = (Kind::Float, spec.device);
        let kernel = match (dev.is_empty(), spec.kernel) {
            (true, _) => None,
            (false, Kernel::Torch) => {
                let fused = FusedSpec {
                    device: spec.device,
                    precision: spec.precision,
                    optimizer: spec.optimizer,
                    learning_rate: spec.learning_rate,
                };
                Some(DeviceKernel::Torch(FusedDevice::build(
                    dev,
                    lookups,
                    layout.batch,
                    fused,
                )?))
            }
            (false, Kernel::Fbgemm) => {
                let tbe = TbeSpec {
                    device: spec.device,
                    precision: spec.precision,
                    optimizer: TbeOptimizer::of(spec.optimizer).map_err(fbgemm_err)?,
                    learning_rate: spec.learning_rate,
                };
                let rows: Vec<i64> = dev.rows.iter().map(|&r| r as i64).collect();
                let dims: Vec<i64> = dev.dims.iter().map(|&r| r as i64).collect();
                let batch = layout.batch as i64;
                let tbe = Tbe::build(&rows, &dims, &lookups, batch, tbe).map_err(fbgemm_err)?;
                Some(DeviceKernel::Fbgemm(tbe))
            }
        };
        // Allocated, then filled in place: an op taking a `Scalar` panics
        // when its allocation fails (see `cpu::CpuOracle`).
        let exchanged = (layout.exchanged_len(d) as i64).max(1);
        let mut grad_out = Tensor::f_empty([exchanged], on)?;
        let _ = grad_out.f_fill_(GRAD_VALUE)?;
        Ok(DeviceEngine {
            kernel,
            batch: layout.batch as i64,
            dim_sum: dev.dim_sum as i64,
            recv: Tensor::f_zeros([exchanged], on)?,
            grad_out,
            grad_in: Tensor::f_zeros([(layout.output_len(d) as i64).max(1)], on)?,
        })
    }

    /// Whether the device has tables to look up.
    pub fn has_tables(&self) -> bool {
        self.kernel.is_some()
    }

    /// The fused lookups: `[B, S_d]` fp32, contiguous; `None` on a device
    /// with no table.
    pub fn forward(&mut self) -> Result<Option<Tensor>, TchError> {
        let out = match &mut self.kernel {
            None => return Ok(None),
            Some(DeviceKernel::Torch(f)) => f.forward()?,
            Some(DeviceKernel::Fbgemm(t)) => t.forward().map_err(fbgemm_err)?,
        };
        Ok(Some(out.f_contiguous()?))
    }

    /// The backward of `pooled`, this iteration's forward output, from the
    /// gradient in [`DeviceEngine::grad_in`]: each looked-up row's gradient
    /// and the optimizer's step on those rows.
    pub fn backward(&mut self, pooled: &Tensor) -> Result<(), TchError> {
        let grad = self.grad_in.f_view([self.batch, self.dim_sum])?;
        match &mut self.kernel {
            None => Ok(()),
            Some(DeviceKernel::Torch(f)) => f.backward(&grad),
            Some(DeviceKernel::Fbgemm(t)) => t.backward(pooled, &grad).map_err(fbgemm_err),
        }
    }

    /// Table `i`'s weight, `[rows, dim]` (a view), in the weight's
    /// precision.
    pub fn table_weight(&self, i: usize) -> Result<Tensor, TchError> {
        match &self.kernel {
            None => Err(TchError::Kind(
                "a device with no table has no weight".into(),
            )),
            Some(DeviceKernel::Torch(f)) => f.table_weight(i),
            Some(DeviceKernel::Fbgemm(t)) => t.table_weight(i),
        }
    }
}

/// Runs `transfers` as copies between buffers in this process: each
/// copies `count` elements from `send(from)` at `send_offset` to
/// `recv(to)` at `recv_offset`. A device with no buffer (`None`) must not
/// take part. Returns the elements moved.
pub fn copy_transfers<'t>(
    transfers: &[Transfer],
    send: impl Fn(usize) -> Option<&'t Tensor>,
    recv: impl Fn(usize) -> Option<&'t Tensor>,
) -> Result<u64, TchError> {
    // Copies out of FBGEMM's output (which requires grad) must not be
    // recorded: the graph would grow every round.
    let _no_grad = tch::no_grad_guard();
    let missing = |what: &str, d: usize| TchError::Kind(format!("no {what} buffer on device {d}"));
    let mut moved = 0;
    for t in transfers {
        let src = send(t.from).ok_or_else(|| missing("send", t.from))?;
        let dst = recv(t.to).ok_or_else(|| missing("receive", t.to))?;
        let (count, from, to) = (t.count as i64, t.send_offset as i64, t.recv_offset as i64);
        let src = src.f_view([-1])?.f_narrow(0, from, count)?;
        dst.f_view([-1])?.f_narrow(0, to, count)?.f_copy_(&src)?;
        moved += t.count;
    }
    Ok(moved)
}

#[cfg(test)]
mod tests;
