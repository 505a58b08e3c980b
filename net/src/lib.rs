//! Networking of embshard: the wire protocol between the learner, actors
//! and benchworkers, and the ZeroMQ sockets that speak it.
//!
//! # Layout
//!
//! - [`protocol`]: the messages, their envelope and their encoding.
//! - [`link`]: the learner's hub and a peer's link (sessions, heartbeats,
//!   stop on a signal); `link::auth`: the cluster token checked at each
//!   connection's handshake.

pub mod link;
pub mod protocol;
pub mod warn;
