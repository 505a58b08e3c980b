//! The learner: owns the policy and cost networks (later issues) and, for
//! now, the offline commands that generate data and compare methods.
//!
//! # Layout
//!
//! - [`baselines`]: placement heuristics (`random`, `round_robin`, DreamShard's
//!   greedy family, TorchRec's partitioner) behind one [`baselines::Method`].
//! - [`torchrec`]: TorchRec's table-wise perf estimator and greedy partitioner.
//! - [`search`]: the local-search reference on the oracle.
//! - [`eval`]: every method on every task of a suite, failures counted.
//! - [`data`]: generation of the default pool, its split and the suites.
//! - [`vtrace`]: IMPALA's V-trace targets.
//! - [`cli`]: the `learner` command line.

pub mod adam;
pub mod baselines;
pub mod checkpoint;
pub mod cli;
pub mod costlog;
pub mod data;
pub mod eval;
pub mod search;
pub mod torchrec;
pub mod train;
pub mod vtrace;
