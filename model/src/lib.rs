//! The model: everything that learns and plans, without I/O beyond a
//! checkpoint's weight files.
//!
//! # Layout
//!
//! - [`nets`]: the cost network and the policy network with its value head,
//!   and their plain-array copies for fast inference.
//! - [`mdp`]: the estimated MDP, many episodes in lockstep.
//! - [`wire`]: unrolls and weights to and from the wire protocol's plain data.
//! - [`vtrace`]: IMPALA's V-trace targets.
//! - [`loss`]: the cost network's and the policy's losses.
//! - [`adam`]: Adam with state a checkpoint can hold.
//! - [`model`]: the two networks together, saved and loaded.
//! - [`plan`]: `plan`, the policy's placement improved by search on the cost
//!   network.
//! - [`search`]: iterated local search, on an oracle or the cost network.
//! - [`baselines`]: placement heuristics (`random`, `round_robin`, DreamShard's
//!   greedy family, TorchRec's partitioner) behind one [`baselines::Method`].
//! - [`torchrec`]: TorchRec's table-wise perf estimator and greedy partitioner.
//! - [`shapes`]: the shapes and table features a model was trained on.
//! - [`guard`]: `plan`'s guard: heuristics as candidates, out-of-distribution
//!   and ensemble checks, `--verify` on an oracle.

pub mod adam;
pub mod baselines;
pub mod guard;
pub mod loss;
pub mod mdp;
pub mod model;
pub mod nets;
pub mod plan;
pub mod search;
pub mod shapes;
pub mod torchrec;
pub mod vtrace;
pub mod wire;

pub use model::Model;

/// A tensor's elements in order, as a flat vector. A tensor of another
/// element kind than `T` is a bug of the caller: it panics and names both.
pub fn tensor_vec<T>(t: &tch::Tensor) -> Vec<T>
where
    T: tch::kind::Element,
    Vec<T>: for<'a> TryFrom<&'a tch::Tensor, Error = tch::TchError>,
{
    let flat = t.contiguous().view([-1]);
    Vec::<T>::try_from(&flat)
        .unwrap_or_else(|e| panic!("a {:?} tensor read as {:?}: {e}", t.kind(), T::KIND))
}

#[cfg(test)]
pub(crate) mod testing;
