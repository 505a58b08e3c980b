//! The oracles' sections: `[sim]`, `[cpu]` and `[cuda]`.

use serde::{Deserialize, Serialize};

use super::{batch, non_negative, positive, seconds, unit};
use crate::error::InvalidSetting;

/// The `sim` oracle's constants (see `benchworker::sim` for their sources).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SimConfig {
    /// Samples per iteration (global batch).
    pub batch: u64,
    /// Peak HBM bandwidth, GiB/s.
    pub hbm_gibps: f64,
    /// Share of peak HBM bandwidth reached by random row gathers.
    pub gather_efficiency: f64,
    /// L2 cache, MiB: repeated rows of a device's group compete for it.
    pub l2_mib: f64,
    /// Cost of an L2 hit relative to an HBM read.
    pub l2_hit_cost: f64,
    /// Fixed floor of one fused kernel call, ms.
    pub kernel_floor_ms: f64,
    /// Sharpness of the soft maximum between the floor and the work.
    pub floor_sharpness: f64,
    /// Backward work relative to forward work.
    pub bwd_multiplier: f64,
    /// Extra backward work per unit share of lookups on very hot rows.
    pub hot_row_contention: f64,
    /// Bytes of one pooled output element (FBGEMM's default output dtype is fp32).
    pub output_bytes: u64,
    /// Bytes of one index.
    pub index_bytes: u64,
    /// Per-rank all-to-all bandwidth, GiB/s.
    pub link_gibps: f64,
    /// Fixed latency of one all-to-all, ms.
    pub a2a_latency_ms: f64,
    /// σ of the seeded multiplicative log-normal noise per phase (0: exact).
    pub noise: f64,
    pub seed: u64,
    /// A file written by `benchworker calibrate`, relative to the config's
    /// folder: its `[sim]` constants replace these (but `noise` and
    /// `seed`) when the config is read, so a run's `config.toml` records
    /// the values and not the file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub calibration: Option<std::path::PathBuf>,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            batch: 65536,
            hbm_gibps: 897.0,
            gather_efficiency: 0.59,
            l2_mib: 40.0,
            l2_hit_cost: 0.35,
            kernel_floor_ms: 0.3,
            floor_sharpness: 3.0,
            bwd_multiplier: 2.0,
            hot_row_contention: 0.25,
            output_bytes: 4,
            index_bytes: 8,
            link_gibps: 600.0,
            a2a_latency_ms: 0.05,
            noise: 0.0,
            seed: 0,
            calibration: None,
        }
    }
}

impl SimConfig {
    pub fn validate(&self) -> std::result::Result<(), InvalidSetting> {
        batch("sim.batch", self.batch)?;
        positive("sim.hbm_gibps", self.hbm_gibps)?;
        unit("sim.gather_efficiency", self.gather_efficiency)?;
        positive("sim.l2_mib", self.l2_mib)?;
        unit("sim.l2_hit_cost", self.l2_hit_cost)?;
        non_negative("sim.kernel_floor_ms", self.kernel_floor_ms)?;
        if self.floor_sharpness.is_nan() || self.floor_sharpness < 1.0 {
            return Err(InvalidSetting::new(
                "sim.floor_sharpness",
                format!(
                    "sim.floor_sharpness = {} must be at least 1",
                    self.floor_sharpness
                ),
            ));
        }
        positive("sim.bwd_multiplier", self.bwd_multiplier)?;
        non_negative("sim.hot_row_contention", self.hot_row_contention)?;
        positive("sim.output_bytes", self.output_bytes as f64)?;
        positive("sim.index_bytes", self.index_bytes as f64)?;
        positive("sim.link_gibps", self.link_gibps)?;
        non_negative("sim.a2a_latency_ms", self.a2a_latency_ms)?;
        non_negative("sim.noise", self.noise)
    }
}

/// The `cpu` oracle's settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CpuConfig {
    /// Samples per iteration on the CPU (the GPU batch scaled down to fit time).
    pub batch: u64,
    /// Rows of each table are capped at this to fit memory.
    pub max_rows: u64,
    pub warmup: usize,
    pub repeats: usize,
    /// Threads libtorch may use (0: libtorch's default). One thread gives the
    /// steadiest medians on a small machine shared with other work.
    pub threads: usize,
    pub seed: u64,
    /// The kernel that runs each device's lookups.
    pub kernel: Kernel,
}

/// Which kernel measures a device's lookups.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kernel {
    /// libtorch's `embedding_bag`, one fused call per dim on a device, and
    /// a backward of libtorch ops in FBGEMM's manner: for hosts without
    /// FBGEMM.
    Torch,
    /// FBGEMM's table-batched embedding, the optimizer fused in its
    /// backward: what TorchRec runs. Needs the `fbgemm-gpu-cpu` package
    /// (`scripts/setup.sh` installs it), or `fbgemm-gpu` on GPU hosts.
    #[default]
    Fbgemm,
}

impl Kernel {
    /// The kernel's name, as the configuration spells it.
    pub fn name(self) -> &'static str {
        match self {
            Kernel::Torch => "torch",
            Kernel::Fbgemm => "fbgemm",
        }
    }
}

impl Default for CpuConfig {
    fn default() -> Self {
        CpuConfig {
            batch: 2048,
            max_rows: 100_000,
            warmup: 2,
            repeats: 5,
            threads: 1,
            seed: 0,
            kernel: Kernel::Fbgemm,
        }
    }
}

impl CpuConfig {
    pub fn validate(&self) -> std::result::Result<(), InvalidSetting> {
        batch("cpu.batch", self.batch)?;
        positive("cpu.max_rows", self.max_rows as f64)?;
        positive("cpu.repeats", self.repeats as f64)
    }
}

/// The `cuda` oracle's settings (benchworker built with `--features cuda`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CudaConfig {
    /// Samples per iteration, split evenly over the plan's devices for the
    /// data-parallel part (dlrm_datasets: 65536).
    pub batch: u64,
    /// Rows of each table are capped at this (0: no cap, the table's own rows).
    pub max_rows: u64,
    /// Unmeasured iterations, then measured ones (DreamShard: 5 and 10).
    pub warmup: usize,
    pub repeats: usize,
    /// Overwrite a buffer larger than the L2 cache before each repeat, so a
    /// repeat does not start with the previous one's rows in cache.
    pub flush_l2: bool,
    /// Size of that buffer, MiB (H100's L2 is 50 MiB).
    pub flush_mib: u64,
    /// GPUs this benchworker drives, as CUDA ordinals (empty: all visible).
    /// Plan device `d` runs on `gpus[d]`.
    pub gpus: Vec<usize>,
    /// Learning rate of the optimizer step in the backward.
    pub learning_rate: f64,
    /// A multi-host group whose ranks have not all joined by then makes its
    /// benchworkers exit (NCCL's join cannot be interrupted), seconds.
    pub join_timeout_s: f64,
    pub seed: u64,
    /// The kernel that runs each GPU's lookups (`fbgemm` needs the
    /// `fbgemm-gpu` package: `EMBSHARD_CUDA=1 scripts/setup.sh`).
    pub kernel: Kernel,
}

impl Default for CudaConfig {
    fn default() -> Self {
        CudaConfig {
            batch: 65536,
            max_rows: 0,
            warmup: 5,
            repeats: 10,
            flush_l2: true,
            flush_mib: 128,
            gpus: Vec::new(),
            learning_rate: 0.01,
            join_timeout_s: 300.0,
            seed: 0,
            kernel: Kernel::Fbgemm,
        }
    }
}

impl CudaConfig {
    pub fn validate(&self) -> std::result::Result<(), InvalidSetting> {
        batch("cuda.batch", self.batch)?;
        // The first iteration makes NCCL's connections: never timed.
        positive("cuda.warmup", self.warmup as f64)?;
        positive("cuda.repeats", self.repeats as f64)?;
        seconds("cuda.join_timeout_s", self.join_timeout_s)?;
        positive("cuda.flush_mib", self.flush_mib as f64)?;
        positive("cuda.learning_rate", self.learning_rate)?;
        let mut seen = std::collections::BTreeSet::new();
        if let Some(g) = self.gpus.iter().find(|&&g| !seen.insert(g)) {
            return Err(InvalidSetting::new(
                "cuda.gpus",
                format!("cuda.gpus names GPU {g} twice"),
            ));
        }
        Ok(())
    }
}
