//! The learner: owns the policy and cost networks, trains them with the
//! actors and benchworkers, and runs the offline commands (generate data,
//! compare methods, place tables with a trained model).
//!
//! # Layout
//!
//! - [`baselines`]: placement heuristics (`random`, `round_robin`, DreamShard's
//!   greedy family, TorchRec's partitioner) behind one [`baselines::Method`].
//! - [`torchrec`]: TorchRec's table-wise perf estimator and greedy partitioner.
//! - [`search`]: the local-search reference on the oracle.
//! - [`eval`]: every method on every task of a suite, failures counted.
//! - [`guard`]: `plan`'s guard: heuristics as candidates, out-of-distribution
//!   and ensemble checks, `--verify` on an oracle.
//! - [`pretrain`]: pre-training across the whole table space.
//! - [`data`]: generation of the default pool, its split and the suites.
//! - [`vtrace`]: IMPALA's V-trace targets.
//! - [`adam`]: Adam with state a checkpoint can hold.
//! - [`train`]: the losses, the model, and the trainer's pieces of Algorithm 1.
//! - [`runtime`]: asynchronous training with actors and benchworkers over ZeroMQ.
//! - [`checkpoint`], [`costlog`]: the run's durable state; [`runlock`]: one
//!   learner per run directory.
//! - [`cli`]: the `learner` command line.

pub mod adam;
pub mod baselines;
pub mod checkpoint;
pub mod cli;
pub mod costlog;
pub mod data;
pub mod eval;
pub mod guard;
pub mod pretrain;
pub mod runlock;
pub mod runtime;
pub mod search;
pub mod torchrec;
pub mod train;
pub mod vtrace;
