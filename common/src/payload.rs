//! What the processes exchange about the networks, as plain data: their
//! parameters by name, and an actor's unroll. The `model` crate converts
//! them to and from tensors; the `net` crate carries them.

use serde::{Deserialize, Serialize};

/// One named parameter tensor as plain data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NamedArray {
    pub name: String,
    pub shape: Vec<i64>,
    pub values: Vec<f32>,
}

/// Both networks' parameters at one policy version.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Weights {
    pub version: u64,
    pub policy: Vec<NamedArray>,
    pub cost: Vec<NamedArray>,
}

/// `E` episodes of one rollout task on the estimated MDP,
/// time-major over the task's `M` tables (see `model::mdp::Unroll`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UnrollData {
    /// Index of the task among the welcome's tasks (the rollout tasks).
    pub task: u32,
    pub episodes: u32,
    /// Table placed at each step.
    pub order: Vec<u32>,
    /// `[M × E]` chosen devices.
    pub actions: Vec<u32>,
    /// `[M × E]` log-probabilities under the acting policy.
    pub behaviour_logp: Vec<f32>,
    /// `[M × E × D]` legal devices.
    pub masks: Vec<bool>,
    /// `[M × E × D × F]` device features the policy saw (F per device: the
    /// actor's `DEVICE_FEATURES`).
    pub device_features: Vec<f32>,
    /// `[E]` predicted iteration costs (ms).
    pub predicted_cost_ms: Vec<f32>,
    pub reward_scale: f64,
    /// `[E]` episodes that ran out of memory.
    pub infeasible: Vec<bool>,
}
