//! The actor: rolls out placement episodes on the estimated MDP and sends
//! unrolls to the learner (DESIGN §3, §4).
//!
//! # Layout
//!
//! - [`mdp`]: the estimated MDP, many episodes in lockstep.
//! - [`nets`]: the cost network and the policy network with its value head.
//! - [`wire`]: unrolls and weights to and from the wire protocol's plain data.
//! - [`worker`]: the actor's loop, as a thread or a process.
//! - [`cli`]: the `actor` command line.

pub mod cli;
pub mod mdp;
pub mod nets;
pub mod wire;
pub mod worker;
