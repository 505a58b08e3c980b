//! Shared ground of embshard: tables and their features, pools, task suites,
//! placements, memory accounting, measurement results and the configuration:
//! the data every process shares. The wire protocol and its sockets are the
//! `net` crate's.
//!
//! # Layout
//!
//! - [`table`]: a table's 21 features (DESIGN §1) and its memory footprint.
//! - [`features`]: the scaled features the networks read.
//! - [`pool`]: the pool CSV format (`name,rows,dim,pooling_factor,bin_0..bin_16`),
//!   read with validation that names file, line and field, and written back.
//! - [`generate`]: a seeded generator of a DLRM-like pool shaped like Meta's
//!   `dlrm_datasets` (`fbgemm_t856_bs65536`), its statistics, the train/test split.
//! - [`space`]: a seeded generator of tables and tasks over the whole table
//!   space (pre-training data, held-out suites).
//! - [`suite`]: task suites (JSON) and their seeded generator.
//! - [`placement`]: placement JSON and the in-memory plan type.
//! - [`published`]: TorchRec planner constants shared by the simulator and the baseline.
//! - [`measurement`]: a plan's measured per-device costs, as every oracle returns it.
//! - [`oracle`]: "measure this plan", the trait behind every backend.
//! - [`payload`]: the networks' parameters and an actor's unroll as plain data.
//! - [`config`]: the TOML configuration, resolved once into validated types.
//! - [`fs`]: atomic file writes and stable name hashes.
//! - [`error`]: the typed errors of this crate.
//! - [`logging`]: tracing set-up shared by the binaries.
//! - [`malloc`]: keeps glibc from handing freed tensor memory back to the
//!   kernel between a network's updates.

pub mod config;
pub mod error;
pub mod features;
pub mod fs;
pub mod generate;
pub mod logging;
pub mod malloc;
pub mod measurement;
pub mod oracle;
pub mod payload;
pub mod placement;
pub mod pool;
pub mod published;
pub mod space;
pub mod suite;
pub mod table;

pub use error::{Error, InvalidSetting, Result};
pub use measurement::{DeviceCost, Measurement};
pub use placement::{Placement, Plan};
pub use suite::{Suite, Task};
pub use table::{MemoryModel, Optimizer, Precision, Table, NUM_BINS, NUM_FEATURES};

/// `n` and `noun`, plural unless `n` is 1: "1 task", "2 tasks".
pub fn count(n: usize, noun: &str) -> String {
    match n {
        1 => format!("1 {noun}"),
        _ => format!("{n} {noun}s"),
    }
}
