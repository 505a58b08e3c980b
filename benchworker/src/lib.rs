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
//! - [`indices`]: synthetic lookups that follow a table's pooling factor and
//!   reuse bins, shared by the real backends.
//! - [`serve`]: the benchworker's loop: measure the learner's jobs, as a
//!   thread or a process.
//! - [`cli`]: the `benchworker` command line (`measure`).

pub mod cli;
pub mod cpu;
pub mod indices;
pub mod oracle;
pub mod serve;
pub mod sim;

pub use oracle::{build, Backend, Oracle, OracleError, Spread};
