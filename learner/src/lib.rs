//! The learner: owns the policy and cost networks, trains them with the
//! actors and benchworkers, and runs the offline commands (generate data,
//! compare methods, place tables with a trained model). The networks, the
//! losses, the MDP and `plan` are the `model` crate's.
//!
//! # Layout
//!
//! - [`eval`]: every method on every task of a suite, failures counted.
//! - [`pretrain`]: pre-training across the whole table space.
//! - [`data`]: generation of the default pool, its split and the suites.
//! - [`train`]: the trainer's pieces of Algorithm 1.
//! - [`runtime`]: asynchronous training with actors and benchworkers over ZeroMQ.
//! - [`run`]: a run folder's files and whether to start, resume or refuse.
//! - [`checkpoint`], [`costlog`]: the run's durable state; [`runlock`]: one
//!   learner per run directory.
//! - [`cli`]: the `learner` command line.

pub mod checkpoint;
pub mod cli;
pub mod costlog;
pub mod data;
pub mod eval;
pub mod pairs;
pub mod pretrain;
pub mod report;
pub mod run;
pub mod runlock;
pub mod runtime;
pub mod status;
pub mod train;
