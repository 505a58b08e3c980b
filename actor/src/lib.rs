//! The actor: rolls out placement episodes on the estimated MDP and sends
//! unrolls to the learner (DESIGN §3, §4). The networks and the MDP it
//! rolls out are the `model` crate's.
//!
//! # Layout
//!
//! - [`worker`]: the actor's loop, as a thread or a process.
//! - [`cli`]: the `actor` command line.

pub mod cli;
pub mod worker;
