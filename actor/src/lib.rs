//! The actor: rolls out placement episodes on the estimated MDP and sends
//! unrolls to the learner (DESIGN §3, §4). The rollout itself arrives with
//! the learning core; today the actor resolves and shows its configuration.
//!
//! # Layout
//!
//! - [`mdp`]: the estimated MDP, many episodes in lockstep.
//! - [`nets`]: the cost network and the policy network with its value head.
//! - [`cli`]: the `actor` command line.

pub mod cli;
pub mod mdp;
pub mod nets;
