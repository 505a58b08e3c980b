//! The networks' sizes and how `plan` chooses: `[model]`.

use serde::{Deserialize, Serialize};

use crate::error::InvalidSetting;

/// Layer sizes of the cost and policy networks (DESIGN §5).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelConfig {
    /// Cost network: table MLP 21 → `cost_table_hidden` → `cost_table_out`.
    pub cost_table_hidden: i64,
    pub cost_table_out: i64,
    /// Hidden width of each cost head (per-device fwd, bwd, comm; overall).
    pub cost_head_hidden: i64,
    /// Gated units in each per-device cost head, beside its hidden layer:
    /// a linear function of the device's summed table representation,
    /// divided by `1 + relu` of another. That is the form of a shared
    /// resource's slowdown (a cache whose hit rate falls as the device's
    /// tables outgrow it), which a ReLU layer on a sum fits only piecewise.
    /// 0: none (models trained before this setting).
    pub cost_head_gates: i64,
    /// Cost networks trained side by side from different initial weights
    /// (an ensemble, each member on its own loss); the cost network's
    /// prediction is their mean per device. 1: a single network.
    pub cost_members: i64,
    /// Policy network: its own table MLP.
    pub policy_table_hidden: i64,
    pub policy_table_out: i64,
    /// Policy network: the device features' MLP (8 → hidden → out; see
    /// the actor's `mdp::device_features`).
    pub cost_feature_hidden: i64,
    pub cost_feature_out: i64,
    /// Hidden width of the per-device score MLP and of the value head.
    pub score_hidden: i64,
    pub value_hidden: i64,
    /// How the cost network gives a plan's iteration cost (the reward).
    pub overall_cost: OverallCost,
    /// Whether and how the cost network uses each table's work on a linear
    /// scale (see [`CostWork`]).
    pub cost_work: CostWork,
    /// Whether the exchange head also reads the task around the device:
    /// the share `(D − 1) / D` of the device's pooled rows that leave it,
    /// its representation scaled by that share, and the task's tables'
    /// summed representation over `D`. A device's all-to-all sends
    /// `(B/D)·(D − 1)·Σ its dims` and receives `(B/D)·Σ the others'
    /// dims`: neither is a function of its own tables alone. false:
    /// the device's own tables only (models trained before this setting).
    pub cost_context: bool,
    /// Dims (ascending) at which the cost heads also see the device's
    /// widest table. For each dim, a device has a flag (whether it holds
    /// a wider table), and each table has a group of channels that the
    /// heads read only where the flag is set. A fused lookup sizes its
    /// thread blocks by its widest table, so a wide table changes what
    /// every table beside it costs (their idle lanes); a sum of table
    /// representations alone cannot tell. Flags come from counts, which
    /// add up over tables, so a search still moves a table by additions;
    /// each dim adds a projection as wide as the heads' to each table's.
    /// Empty: none (models trained before this setting).
    pub cost_wide_dims: Vec<u32>,
    /// Episodes the policy places when it places for a user (`plan`,
    /// eval's `policy`): its greedy episode and `plan_samples − 1` samples
    /// (each seeded by its number, spread over the cores); the plan with the
    /// lowest predicted cost wins. 1: greedy only.
    pub plan_samples: usize,
    /// Whether `plan` also lets the cheap heuristics' plans (`lookup`,
    /// `size_lookup`, `torchrec`) compete on predicted cost. With the
    /// default search from every start, it gives the search its starts
    /// besides the episodes instead: `lookup`'s and `torchrec`'s plans and
    /// the tables piled up (`plan_search_every_candidate`).
    pub plan_heuristics: bool,
    /// Temperature of `plan`'s sampled episodes (1: the policy's own).
    pub plan_temperature: f64,
    /// Before each search, `plan` makes up to this many single-table
    /// moves, each the one that lowers the predicted cost most (hill
    /// climbing through libtorch). 0, the default: none; the search finds
    /// about as good plans without them, in less time.
    pub plan_moves: usize,
    /// Then `plan` runs the `search` reference's iterated local search
    /// (moves and swaps off the slowest device, perturbations when stuck)
    /// with the cost network in place of the oracle, for this many predicted
    /// plans (0 or 1: none), whose plan is kept only when it predicts a
    /// lower cost than the one it started from. A seeded search: the same
    /// task gets the same plan. Like the moves, only for a feasible plan and
    /// a composed overall cost (`overall_cost = "composed"`).
    pub plan_search: usize,
    /// Whether, when `plan` searches (`plan_search` > 1, a composed overall
    /// cost, more than one device), the search runs from several starts
    /// (the policy's episodes, `lookup`'s and `torchrec`'s plans, and the
    /// tables piled up by first-fit decreasing; `plan_search`
    /// predicted plans each), the lowest predicted result winning, rather
    /// than only from the candidate predicted cheapest. The search then
    /// does not depend on one starting point.
    pub plan_search_every_candidate: bool,
    /// The learned plan replaces the best heuristic plan only when every
    /// cost-network member predicts it at least this share cheaper (0.02:
    /// 2 %). The search picks the plans the network underrates, so their
    /// predictions run low; the margin was chosen on validation draws of
    /// the table space (docs/results.md, "The guard's margin").
    pub plan_margin: f64,
    /// The second opinion's margin (see `plan_margin`) where every
    /// table's reuse bins are the defaults of a CSV without bin columns.
    /// Those bins are a guess, so both networks price such tables less
    /// surely; 0.04 was chosen on three draws of such CSVs and held on a
    /// fourth and on another family (docs/results.md, "A wider second
    /// opinion where the bins are guessed").
    pub plan_margin_default_bins: f64,
    /// Where the learned plan won, `plan` returns, of the ends of its
    /// searches that win by `plan_margin` too and are predicted within
    /// this share of the lowest (0.01: 1 %), the one with the fewest
    /// tables on its most crowded device: the network predicts crowded
    /// devices low (docs/results.md, "Near ties go to the less crowded
    /// plan"). 0: the lowest prediction, whatever the crowding.
    pub plan_tie: f64,
}

/// How the cost network's table MLP sees a table's work: its lookups
/// (`pooling / 16`, 16 being about the mean pooling) and lookup width
/// (`pooling / 16 × dim / 128`), on a linear scale. A table's bytes read grow
/// linearly with them, while the 21 scaled features hold pooling as a
/// logarithm, from which a ReLU network extrapolates far too low on a table
/// busier than any it was trained on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CostWork {
    /// The 21 scaled features only (DreamShard).
    #[default]
    None,
    /// The two work figures appended to the table MLP's input.
    Inputs,
    /// Appended to the input, and the table representation's channels
    /// multiplied by them: a third by the lookup width, a third by the
    /// lookups, the rest left alone, so that a device's summed
    /// representation holds work-weighted sums (Σ width × g(table)).
    Gated,
    /// The two work figures and a third: the lookup width with each row
    /// rounded up to whole 32-byte sectors of fp16 weights (`dim` to the
    /// next multiple of 16). A GPU reads memory in sectors, so a row of
    /// dim 20 costs what one of dim 32 does; the scaled dim alone hides
    /// that step.
    Sectors,
    /// The three of `sectors` and six more, each a known driver of a fused
    /// lookup kernel's time, computed from the table's own features (see
    /// `model::nets::with_kernel_features`): the sector width weighted by
    /// TorchRec's block penalty in a full-warp block and in a half-warp
    /// block (the widest table beside it picks which), whether the table
    /// is wider than half a warp, the sector width of lookups that repeat a
    /// row (what a cache can serve), the bytes of the rows read more than
    /// once in a batch (what competes for the cache), and the share of
    /// lookups on very hot rows (their gradients reduce serially). A sum
    /// of learned functions of 21 logarithmic features fits these only
    /// roughly, and the search moves tables by their marginal costs.
    Kernel,
}

/// The cost network's loss over per-device forward, backward and
/// communication times and the iteration cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CostLoss {
    /// Squared error in ms (DreamShard): large costs dominate.
    #[default]
    Mse,
    /// Squared error relative to the target, `((pred − y) / y)²` (targets
    /// below 0.1 ms count as 0.1 ms): every plan's error counts by its share.
    Relative,
}

/// How the cost network turns device representations into a plan's
/// iteration cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OverallCost {
    /// DreamShard's overall head on the element-wise maximum of the device
    /// representations.
    #[default]
    Head,
    /// Composed from the per-device heads the way one iteration runs: the
    /// forward all-to-all waits for the slowest forward, then each device
    /// runs its two exchanges and its backward, so the cost is
    /// `max_d fwd_d + max_d (bwd_d + 2·comm_d)` (the forward exchange moves
    /// the same bytes as the backward one).
    Composed,
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig {
            cost_table_hidden: 128,
            cost_table_out: 32,
            cost_head_hidden: 64,
            cost_head_gates: 0,
            cost_members: 1,
            policy_table_hidden: 128,
            policy_table_out: 32,
            cost_feature_hidden: 64,
            cost_feature_out: 32,
            score_hidden: 64,
            value_hidden: 64,
            overall_cost: OverallCost::Composed,
            cost_work: CostWork::Inputs,
            cost_context: false,
            cost_wide_dims: Vec::new(),
            plan_samples: 1,
            plan_heuristics: true,
            plan_temperature: 1.0,
            plan_moves: 0,
            plan_search: 2000,
            plan_search_every_candidate: true,
            plan_margin: 0.02,
            plan_margin_default_bins: 0.04,
            plan_tie: 0.01,
        }
    }
}

impl ModelConfig {
    pub fn validate(&self) -> std::result::Result<(), InvalidSetting> {
        const SIZE: std::ops::RangeInclusive<i64> = 1..=65536;
        for (field, v, range) in [
            ("model.cost_table_hidden", self.cost_table_hidden, SIZE),
            ("model.cost_table_out", self.cost_table_out, SIZE),
            ("model.cost_head_hidden", self.cost_head_hidden, SIZE),
            ("model.policy_table_hidden", self.policy_table_hidden, SIZE),
            ("model.policy_table_out", self.policy_table_out, SIZE),
            ("model.cost_feature_hidden", self.cost_feature_hidden, SIZE),
            ("model.cost_feature_out", self.cost_feature_out, SIZE),
            ("model.score_hidden", self.score_hidden, SIZE),
            ("model.value_hidden", self.value_hidden, SIZE),
            ("model.cost_head_gates", self.cost_head_gates, 0..=256),
            ("model.cost_members", self.cost_members, 1..=16),
        ] {
            if !range.contains(&v) {
                return Err(InvalidSetting::new(
                    field,
                    format!(
                        "{field} = {v} must lie in {}..={}",
                        range.start(),
                        range.end()
                    ),
                ));
            }
        }
        if self.cost_wide_dims.len() > 8
            || self.cost_wide_dims.windows(2).any(|w| w[0] >= w[1])
            || self
                .cost_wide_dims
                .iter()
                .any(|&d| !(1..=65536).contains(&d))
        {
            return Err(InvalidSetting::new(
                "model.cost_wide_dims",
                format!(
                    "model.cost_wide_dims = {:?} must be at most 8 dims in 1..=65536, \
                     strictly ascending (e.g. [32, 64, 128, 256, 512])",
                    self.cost_wide_dims
                ),
            ));
        }
        if self.cost_context && !self.cost_wide_dims.is_empty() {
            return Err(InvalidSetting::new(
                "model.cost_wide_dims",
                "model.cost_wide_dims and model.cost_context cannot be used together \
                 (the exchange head's context has no part for the widest table); \
                 set one of them",
            ));
        }
        if !(self.plan_temperature.is_finite() && (0.0..=1e3).contains(&self.plan_temperature)) {
            return Err(InvalidSetting::new(
                "model.plan_temperature",
                format!(
                    "model.plan_temperature = {} must lie in [0, 1000]",
                    self.plan_temperature
                ),
            ));
        }
        if !(self.plan_margin.is_finite() && (0.0..=0.5).contains(&self.plan_margin)) {
            return Err(InvalidSetting::new(
                "model.plan_margin",
                format!(
                    "model.plan_margin = {} must lie in [0, 0.5] (a share: 0.02 is 2 %)",
                    self.plan_margin
                ),
            ));
        }
        if !(self.plan_margin_default_bins.is_finite()
            && (0.0..=0.5).contains(&self.plan_margin_default_bins))
        {
            return Err(InvalidSetting::new(
                "model.plan_margin_default_bins",
                format!(
                    "model.plan_margin_default_bins = {} must lie in [0, 0.5] (a share: 0.04 is \
                     4 %)",
                    self.plan_margin_default_bins
                ),
            ));
        }
        if !(self.plan_tie.is_finite() && (0.0..=0.1).contains(&self.plan_tie)) {
            return Err(InvalidSetting::new(
                "model.plan_tie",
                format!(
                    "model.plan_tie = {} must lie in [0, 0.1] (a share: 0.01 is 1 %)",
                    self.plan_tie
                ),
            ));
        }
        Ok(())
    }
}
