//! The benchworker: measures the real cost of placement plans (DESIGN §6).
//!
//! # Layout
//!
//! - [`oracle`]: the one trait every backend implements, its errors, and the
//!   choice of backend.
//! - [`sim`]: a deterministic model of a GPU's fused embedding kernel and NCCL
//!   all-to-all; each property it must have is documented and tested there.
//! - [`cpu`]: real fused `embedding_bag` forward and backward with libtorch on
//!   the CPU, one call per device, with real all-to-all memory movement.
//! - `cuda` (feature `cuda`): real fused lookups on GPUs with NCCL all-to-all.
//! - [`layout`]: where a plan's data lives on its devices and what the
//!   all-to-all moves; plain arithmetic, tested without a GPU.
//! - [`fused`]: one device's fused forward, backward and optimizer step with
//!   libtorch on any device, the compute of the `cuda` backend.
//! - [`group`]: what the processes of a multi-host `cuda` group exchange.
//! - [`sweep`]: the fusion sweep (fused call vs single-table calls).
//! - [`timing`]: from timed repeats to a measurement and its spread.
//! - [`indices`]: synthetic lookups that follow a table's pooling factor and
//!   reuse bins, shared by the real backends.
//! - [`serve`]: the benchworker's loop: measure the learner's jobs, as a
//!   thread or a process.
//! - [`cli`]: the `benchworker` command line (`measure`, `serve`, `bench`,
//!   `fusion`).

pub mod cli;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod fused;
pub mod group;
pub mod indices;
pub mod layout;
pub mod oracle;
pub mod serve;
pub mod sim;
pub mod sweep;
pub mod timing;

pub use oracle::{build, Backend, Oracle, OracleError, Spread};

/// `tables` tables of the default generator's pool, for the tests.
#[cfg(test)]
pub(crate) fn test_pool(tables: usize, seed: u64) -> Vec<common::Table> {
    let cfg = common::generate::PoolGenConfig {
        tables,
        ..Default::default()
    };
    common::generate::generate_pool(&cfg, seed).expect("the default generator works")
}

/// A table for the tests: `bins` as `(bin, share)` pairs.
#[cfg(test)]
pub(crate) fn test_table(
    name: &str,
    rows: u64,
    dim: u32,
    pooling: f64,
    bins: &[(usize, f64)],
) -> common::Table {
    let mut b = [0.0; common::NUM_BINS];
    for &(k, v) in bins {
        b[k] = v;
    }
    common::Table {
        name: name.into(),
        rows,
        dim,
        pooling_factor: pooling,
        bins: b,
    }
}
