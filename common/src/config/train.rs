//! Training: `[train]` (DreamShard's Algorithm 1) and `[pretrain]`.

use serde::{Deserialize, Serialize};

use super::model::CostLoss;
use super::{non_negative, positive, share};
use crate::error::InvalidSetting;
use std::path::PathBuf;

/// The policy-gradient update.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Update {
    /// IMPALA's V-trace with a learnt value baseline.
    #[default]
    Vtrace,
    /// DreamShard's REINFORCE: the episode's return against the batch mean.
    /// Each step is weighted by its action's likelihood ratio, current
    /// policy over the actor's, clipped at `clip_pg_rho`: an actor's stale
    /// weights count for less (in one thread every weight is 1, or
    /// `clip_pg_rho` where that is lower).
    Reinforce,
}

/// Where the cost network's weight decay pulls its weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DecayTo {
    /// Toward the weights training started from: `train.init`'s (L2-SP,
    /// Li et al. 2018), so that fine-tuning keeps what pre-training learned
    /// where the measurements say nothing; toward zero without an init.
    #[default]
    Init,
    /// Toward zero (AdamW), whatever training started from.
    Zero,
}

/// How the final reward (minus the predicted cost) is scaled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RewardScale {
    /// Divided by the predicted single-table costs summed over the devices
    /// (the cost of a perfectly balanced placement without fusion).
    #[default]
    Balanced,
    /// Milliseconds as predicted.
    Raw,
    /// Standardised across each batch of episodes (DreamShard).
    Batch,
    /// AutoShard's ratio: the cost over the best cost of the batch.
    MinRatio,
}

/// Training (DreamShard's Algorithm 1).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainConfig {
    /// Suite of training tasks (relative to the working directory).
    pub suite: PathBuf,
    /// Further suites whose tasks train beside `suite`'s (e.g. one with 8
    /// devices, so that the cost network sees 8-way communication).
    pub extra_suites: Vec<PathBuf>,
    /// A trained run (a folder such as `models/pretrained`) whose networks
    /// this run starts from instead of fresh ones (`learner train --init`):
    /// fine-tuning a pre-trained model on your tasks and measurements. Its
    /// `[model]` section replaces this configuration's, since the layer
    /// sizes must match the weights.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub init: Option<PathBuf>,
    /// Rounds of collect → cost updates → policy updates.
    pub iterations: usize,
    /// Plans measured on the oracle per iteration (the measurement budget is
    /// `iterations × measure_per_iteration`).
    pub measure_per_iteration: usize,
    /// Share of each iteration's measured plans that are the greedy pick
    /// (see `measure_planned`) rather than a sampled episode: measuring them
    /// shows the cost network its errors where the plans it will be asked
    /// about lie (DAgger-like); the rest explore.
    pub measure_greedy_share: f64,
    /// Whether that greedy share measures what `plan` returns for the task
    /// (candidates, moves and the search on the cost network: see
    /// [`super::ModelConfig::plan_search`]) rather than the policy's greedy episode.
    /// The search goes where the cost network predicts low; measuring what
    /// it finds teaches the network its errors there, which is where `plan`
    /// relies on it.
    pub measure_planned: bool,
    /// Temperature of the sampled episodes among the measured plans (1:
    /// the policy's own probabilities; higher, closer to a uniform choice
    /// among the legal devices): how widely the measurements spread around
    /// where the policy goes. The default, 1000, is about uniform: over
    /// twelve training seeds it did better than 1 on the densities the
    /// main job does not train on (docs/results.md).
    pub measure_temperature: f64,
    /// Share of the measured plans outside the greedy share that are one
    /// of the other basins where `plan`'s searches end (drawn among those
    /// the network ranks below its pick) rather than sampled episodes: 0,
    /// none; 1, all. A basin pick is a sampled episode where every search
    /// ends alike, and always where `plan` does not search from every start
    /// (`model.plan_moves` above 0, `model.plan_search` of 1 or less, or
    /// `model.plan_search_every_candidate = false`). With about 100
    /// measured plans, 0.4 gains on the trained shapes and loses on others;
    /// at 200 it widens the spread between seeds (docs/results.md).
    pub measure_basins_share: f64,
    pub cost_steps: usize,
    pub cost_batch: usize,
    pub cost_lr: f64,
    /// Decoupled weight decay of the cost network's optimizer (AdamW's
    /// `λ`: each step first shrinks the weights by `cost_lr · λ`). A few
    /// hundred measured plans are a small data set; the decay keeps the
    /// network from fitting their noise and makes its predictions carry
    /// over to the plans a search proposes.
    pub cost_weight_decay: f64,
    /// Where the decay pulls: toward `train.init`'s weights, or zero.
    pub cost_decay_to: DecayTo,
    /// The cost network's loss (see [`CostLoss`]).
    pub cost_loss: CostLoss,
    /// Weight of the same-task pair term of the cost loss (0: none). Above
    /// 0, half of each cost batch is drawn as usual and each of those plans
    /// gets a partner: another measured plan of the same task. The term is
    /// the mean over the pairs of the squared difference of the two plans'
    /// errors of the iteration cost (in `cost_loss`'s units). It is zero
    /// when the network errs on both alike: what `plan`'s guard needs is
    /// the difference between two plans of one task, not their level.
    /// Written into a run's config only when on: a run with it off reads
    /// as before, by an older embshard too (it refuses unknown settings),
    /// and `plan` finds nothing missing in runs from before it.
    #[serde(skip_serializing_if = "is_zero")]
    pub cost_pair_weight: f64,
    pub policy_steps: usize,
    /// Episodes per policy update, in lockstep on one task.
    pub episodes: usize,
    pub policy_lr: f64,
    pub entropy_cost: f64,
    pub baseline_cost: f64,
    pub max_grad_norm: f64,
    /// V-trace's ρ̄, c̄ and ρ̄_pg. REINFORCE clips its likelihood ratios at
    /// ρ̄_pg too.
    pub clip_rho: f64,
    pub clip_c: f64,
    pub clip_pg_rho: f64,
    /// V-trace's λ: how far the targets and advantages look ahead before
    /// bootstrapping on the value head (1: to the episode's end).
    pub lambda: f64,
    /// Whether each step is rewarded with what its placement added to the
    /// predicted iteration cost (in the task's balanced-cost units), the
    /// last step's reward completing the episode's: every episode keeps its
    /// return, and with `lambda` below 1 a step's advantage rests on its
    /// own effect more than on the steps after it. Needs `reward =
    /// "balanced"` (the unit of the steps' costs).
    pub step_rewards: bool,
    /// Reward units taken off the final reward of an episode that ran out
    /// of memory (no legal device left for a table, which then went to the
    /// device with the most free memory): without it, such a placement is
    /// judged by its predicted cost alone, which may be low.
    pub infeasible_penalty: f64,
    /// Copies of each training task that rollouts also place with less
    /// memory per device (measured plans keep the tasks' own): the policy
    /// learns to fit a tight budget, which the training suites seldom ask
    /// for. 0: none; 1: up to half the rollouts are on a tight copy (a
    /// task already tighter than its drawn copy gets none).
    pub tight_memory: usize,
    /// A tight copy's memory per device, as a multiple of an even share
    /// of its tables' memory, drawn uniformly from `[low, high]` per copy
    /// (seeded by `seed`): never under its largest table, and a copy that
    /// would not be tighter than its task is not made.
    pub tight_memory_slack: [f64; 2],
    /// Copies of each training task that rollouts also place on another
    /// number of devices (the same tables; measured plans keep the tasks'
    /// own): the policy learns other densities than the training tasks',
    /// at no cost in measurements. 0: none; 1: up to half the rollouts
    /// are on a reshaped copy.
    pub reshape_copies: usize,
    /// A reshaped copy's tables per device, as a multiple of its task's,
    /// drawn log-uniformly from `[low, high]` per copy (seeded by `seed`);
    /// its device count is the nearest to that density, at least 2 and at
    /// most one per table. Memory per device keeps the task's multiple of
    /// an even share.
    pub reshape_density: [f64; 2],
    pub update: Update,
    pub reward: RewardScale,
    pub seed: u64,
    /// Iterations between checkpoints.
    pub checkpoint_every: usize,
    /// Checkpoints kept (the newest).
    pub keep_checkpoints: usize,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            suite: PathBuf::from("data/generated/dlrm-50x4.train.json"),
            extra_suites: Vec::new(),
            init: None,
            iterations: 20,
            measure_per_iteration: 10,
            measure_greedy_share: 0.5,
            measure_planned: true,
            measure_temperature: 1000.0,
            measure_basins_share: 0.0,
            cost_steps: 1000,
            cost_batch: 64,
            cost_lr: 1e-3,
            cost_weight_decay: 0.1,
            cost_decay_to: DecayTo::Init,
            cost_loss: CostLoss::Mse,
            cost_pair_weight: 0.0,
            policy_steps: 50,
            episodes: 32,
            policy_lr: 2e-3,
            entropy_cost: 1e-3,
            baseline_cost: 0.5,
            max_grad_norm: 40.0,
            clip_rho: 1.0,
            clip_c: 1.0,
            clip_pg_rho: 1.0,
            lambda: 1.0,
            step_rewards: false,
            infeasible_penalty: 0.0,
            tight_memory: 0,
            tight_memory_slack: [1.05, 1.5],
            reshape_copies: 0,
            reshape_density: [0.5, 2.0],
            update: Update::Vtrace,
            reward: RewardScale::Balanced,
            seed: 0,
            checkpoint_every: 1,
            keep_checkpoints: 3,
        }
    }
}

/// The most plans one round may measure.
pub const MAX_MEASURE_PER_ITERATION: usize = 1_000_000;

impl TrainConfig {
    /// How many of a round's measured plans are the model's own pick
    /// (`measure_greedy_share` of `measure_per_iteration`, rounded).
    pub fn greedy_picks(&self) -> usize {
        (self.measure_greedy_share * self.measure_per_iteration as f64).round() as usize
    }

    pub fn validate(&self) -> std::result::Result<(), InvalidSetting> {
        positive("train.iterations", self.iterations as f64)?;
        if !(1..=MAX_MEASURE_PER_ITERATION).contains(&self.measure_per_iteration) {
            return Err(InvalidSetting::new(
                "train.measure_per_iteration",
                format!(
                    "train.measure_per_iteration = {} must lie in 1..={MAX_MEASURE_PER_ITERATION} \
                     (a round's plans are drawn and held in memory at once)",
                    self.measure_per_iteration
                ),
            ));
        }
        positive("train.measure_temperature", self.measure_temperature)?;
        share("train.measure_greedy_share", self.measure_greedy_share)?;
        share("train.measure_basins_share", self.measure_basins_share)?;
        positive("train.cost_batch", self.cost_batch as f64)?;
        if !(1..=65536).contains(&self.episodes) {
            return Err(InvalidSetting::new(
                "train.episodes",
                format!("train.episodes = {} must lie in 1..=65536", self.episodes),
            ));
        }
        positive("train.cost_lr", self.cost_lr)?;
        non_negative("train.cost_weight_decay", self.cost_weight_decay)?;
        non_negative("train.cost_pair_weight", self.cost_pair_weight)?;
        if self.cost_lr * self.cost_weight_decay >= 1.0 {
            return Err(InvalidSetting::new(
                "train.cost_weight_decay",
                format!(
                    "train.cost_weight_decay = {} times train.cost_lr = {} must stay below 1 \
                 (each step scales the weights by 1 − their product)",
                    self.cost_weight_decay, self.cost_lr
                ),
            ));
        }
        positive("train.policy_lr", self.policy_lr)?;
        non_negative("train.entropy_cost", self.entropy_cost)?;
        non_negative("train.baseline_cost", self.baseline_cost)?;
        positive("train.max_grad_norm", self.max_grad_norm)?;
        positive("train.clip_rho", self.clip_rho)?;
        positive("train.clip_c", self.clip_c)?;
        positive("train.clip_pg_rho", self.clip_pg_rho)?;
        if !(self.lambda > 0.0 && self.lambda <= 1.0) {
            return Err(InvalidSetting::new(
                "train.lambda",
                format!("train.lambda = {} must lie in (0, 1]", self.lambda),
            ));
        }
        if self.step_rewards && self.reward != RewardScale::Balanced {
            return Err(InvalidSetting::new(
                "train.step_rewards",
                "train.step_rewards needs train.reward = \"balanced\" (the unit \
                        of a step's cost)",
            ));
        }
        non_negative("train.infeasible_penalty", self.infeasible_penalty)?;
        let [low, high] = self.tight_memory_slack;
        if !(low >= 1.0 && high >= low && high.is_finite()) {
            return Err(InvalidSetting::new(
                "train.tight_memory_slack",
                format!(
                    "train.tight_memory_slack = [{low}, {high}] must be [low, high] with \
                 1 <= low <= high (multiples of an even share of a task's memory)"
                ),
            ));
        }
        if self.tight_memory > 8 {
            return Err(InvalidSetting::new(
                "train.tight_memory",
                format!(
                    "train.tight_memory = {} must lie in 0..=8 (tight copies per training task)",
                    self.tight_memory
                ),
            ));
        }
        let [low, high] = self.reshape_density;
        if !(low > 0.0 && high >= low && high.is_finite()) {
            return Err(InvalidSetting::new(
                "train.reshape_density",
                format!(
                    "train.reshape_density = [{low}, {high}] must be [low, high] with \
                 0 < low <= high (multiples of a task's tables per device)"
                ),
            ));
        }
        if self.reshape_copies > 8 {
            return Err(InvalidSetting::new(
                "train.reshape_copies",
                format!(
                    "train.reshape_copies = {} must lie in 0..=8 (reshaped copies per training \
                     task)",
                    self.reshape_copies
                ),
            ));
        }
        positive("train.checkpoint_every", self.checkpoint_every as f64)?;
        positive("train.keep_checkpoints", self.keep_checkpoints as f64)
    }
}

/// Pre-training across the whole table space (`learner pretrain`): tasks
/// drawn from [`crate::space`], a bulk of their plans measured on `sim` to
/// fit the cost network, then Algorithm 1 (`[train]`) on those tasks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PretrainConfig {
    /// Tasks drawn from the space.
    pub tasks: usize,
    /// Plans of each task measured on `sim` before Algorithm 1: every
    /// heuristic's, random ones (uniform and skewed), and the plans the
    /// local search on `sim` visits from the best heuristic's.
    pub plans_per_task: usize,
    /// Share of those plans that the search visits: the region near good
    /// plans, where `plan`'s own search relies on the cost network.
    pub search_share: f64,
    /// Cost-network steps on the bulk before Algorithm 1 starts, the
    /// rounds' included.
    pub cost_steps: usize,
    /// Rounds, within those steps, that measure where the search on the
    /// cost network goes: after each equal share of the steps but the
    /// first, `plan`'s search runs on every task from each heuristic's plan
    /// and what it finds is measured on `sim` and joins the bulk. The
    /// search seeks out the plans the network underrates; measured, they
    /// correct it where `plan` relies on it.
    pub search_rounds: usize,
    /// Share of each stage-1 cost batch drawn from the plans the search
    /// rounds found, once there are any. Unset: they join the bulk and are
    /// drawn as often as any bulk plan (1 to 5 % of the draws). 0: they are
    /// measured but never trained on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub found_share: Option<f64>,
    pub seed: u64,
    /// The ranges tasks are drawn from.
    pub space: crate::space::SpaceConfig,
}

impl Default for PretrainConfig {
    fn default() -> Self {
        PretrainConfig {
            tasks: 300,
            plans_per_task: 200,
            search_share: 0.5,
            cost_steps: 20_000,
            search_rounds: 4,
            found_share: None,
            seed: 0,
            space: crate::space::SpaceConfig::default(),
        }
    }
}

impl PretrainConfig {
    pub(super) fn is_default(&self) -> bool {
        *self == PretrainConfig::default()
    }

    pub fn validate(&self) -> std::result::Result<(), InvalidSetting> {
        positive("pretrain.tasks", self.tasks as f64)?;
        positive("pretrain.plans_per_task", self.plans_per_task as f64)?;
        share("pretrain.search_share", self.search_share)?;
        if let Some(v) = self.found_share {
            share("pretrain.found_share", v)?;
        }
        self.space.validate()
    }
}

fn is_zero(v: &f64) -> bool {
    *v == 0.0
}
