//! The configuration file (`configs/*.toml`), resolved once into validated
//! types: every section is optional, every field has a default, unknown
//! fields are refused, and an out-of-range value fails with its field name.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, InvalidSetting, Result};
use crate::generate::PoolGenConfig;
use crate::table::MemoryModel;

/// The `sim` oracle's constants (see `benchworker::sim` for their sources).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SimConfig {
    /// Samples per iteration (global batch).
    pub batch: u64,
    /// Peak HBM bandwidth, GiB/s.
    pub hbm_gibps: f64,
    /// Share of peak HBM bandwidth reached by random row gathers.
    pub gather_efficiency: f64,
    /// L2 cache, MiB: repeated rows of a device's group compete for it.
    pub l2_mib: f64,
    /// Cost of an L2 hit relative to an HBM read.
    pub l2_hit_cost: f64,
    /// Fixed floor of one fused kernel call, ms.
    pub kernel_floor_ms: f64,
    /// Sharpness of the soft maximum between the floor and the work.
    pub floor_sharpness: f64,
    /// Backward work relative to forward work.
    pub bwd_multiplier: f64,
    /// Extra backward work per unit share of lookups on very hot rows.
    pub hot_row_contention: f64,
    /// Bytes of one pooled output element (FBGEMM's default output dtype is fp32).
    pub output_bytes: u64,
    /// Bytes of one index.
    pub index_bytes: u64,
    /// Per-rank all-to-all bandwidth, GiB/s.
    pub link_gibps: f64,
    /// Fixed latency of one all-to-all, ms.
    pub a2a_latency_ms: f64,
    /// σ of the seeded multiplicative log-normal noise per phase (0: exact).
    pub noise: f64,
    pub seed: u64,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            batch: 65536,
            hbm_gibps: 897.0,
            gather_efficiency: 0.59,
            l2_mib: 40.0,
            l2_hit_cost: 0.35,
            kernel_floor_ms: 0.3,
            floor_sharpness: 3.0,
            bwd_multiplier: 2.0,
            hot_row_contention: 0.25,
            output_bytes: 4,
            index_bytes: 8,
            link_gibps: 600.0,
            a2a_latency_ms: 0.05,
            noise: 0.0,
            seed: 0,
        }
    }
}

impl SimConfig {
    pub fn validate(&self) -> std::result::Result<(), InvalidSetting> {
        positive("sim.batch", self.batch as f64)?;
        positive("sim.hbm_gibps", self.hbm_gibps)?;
        unit("sim.gather_efficiency", self.gather_efficiency)?;
        positive("sim.l2_mib", self.l2_mib)?;
        unit("sim.l2_hit_cost", self.l2_hit_cost)?;
        non_negative("sim.kernel_floor_ms", self.kernel_floor_ms)?;
        if self.floor_sharpness.is_nan() || self.floor_sharpness < 1.0 {
            return Err(InvalidSetting::new(
                "sim.floor_sharpness",
                format!(
                    "sim.floor_sharpness = {} must be at least 1",
                    self.floor_sharpness
                ),
            ));
        }
        positive("sim.bwd_multiplier", self.bwd_multiplier)?;
        non_negative("sim.hot_row_contention", self.hot_row_contention)?;
        positive("sim.output_bytes", self.output_bytes as f64)?;
        positive("sim.index_bytes", self.index_bytes as f64)?;
        positive("sim.link_gibps", self.link_gibps)?;
        non_negative("sim.a2a_latency_ms", self.a2a_latency_ms)?;
        non_negative("sim.noise", self.noise)
    }
}

/// The `cpu` oracle's settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CpuConfig {
    /// Samples per iteration on the CPU (the GPU batch scaled down to fit time).
    pub batch: u64,
    /// Rows of each table are capped at this to fit memory.
    pub max_rows: u64,
    pub warmup: usize,
    pub repeats: usize,
    /// Threads libtorch may use (0: libtorch's default). One thread gives the
    /// steadiest medians on a small machine shared with other work.
    pub threads: usize,
    pub seed: u64,
}

impl Default for CpuConfig {
    fn default() -> Self {
        CpuConfig {
            batch: 2048,
            max_rows: 100_000,
            warmup: 2,
            repeats: 5,
            threads: 1,
            seed: 0,
        }
    }
}

impl CpuConfig {
    pub fn validate(&self) -> std::result::Result<(), InvalidSetting> {
        positive("cpu.batch", self.batch as f64)?;
        positive("cpu.max_rows", self.max_rows as f64)?;
        positive("cpu.repeats", self.repeats as f64)
    }
}

/// The `cuda` oracle's settings (benchworker built with `--features cuda`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CudaConfig {
    /// Samples per iteration, split evenly over the plan's devices for the
    /// data-parallel part (dlrm_datasets: 65536).
    pub batch: u64,
    /// Rows of each table are capped at this (0: no cap, the table's own rows).
    pub max_rows: u64,
    /// Unmeasured iterations, then measured ones (DreamShard: 5 and 10).
    pub warmup: usize,
    pub repeats: usize,
    /// Overwrite a buffer larger than the L2 cache before each repeat, so a
    /// repeat does not start with the previous one's rows in cache.
    pub flush_l2: bool,
    /// Size of that buffer, MiB (H100's L2 is 50 MiB).
    pub flush_mib: u64,
    /// GPUs this benchworker drives, as CUDA ordinals (empty: all visible).
    /// Plan device `d` runs on `gpus[d]`.
    pub gpus: Vec<usize>,
    /// Learning rate of the optimizer step in the backward.
    pub learning_rate: f64,
    /// A multi-host group whose ranks have not all joined by then makes its
    /// benchworkers exit (NCCL's join cannot be interrupted), seconds.
    pub join_timeout_s: f64,
    pub seed: u64,
}

impl Default for CudaConfig {
    fn default() -> Self {
        CudaConfig {
            batch: 65536,
            max_rows: 0,
            warmup: 5,
            repeats: 10,
            flush_l2: true,
            flush_mib: 128,
            gpus: Vec::new(),
            learning_rate: 0.01,
            join_timeout_s: 300.0,
            seed: 0,
        }
    }
}

impl CudaConfig {
    pub fn validate(&self) -> std::result::Result<(), InvalidSetting> {
        positive("cuda.batch", self.batch as f64)?;
        // The first iteration makes NCCL's connections: never timed.
        positive("cuda.warmup", self.warmup as f64)?;
        positive("cuda.repeats", self.repeats as f64)?;
        seconds("cuda.join_timeout_s", self.join_timeout_s)?;
        positive("cuda.flush_mib", self.flush_mib as f64)?;
        positive("cuda.learning_rate", self.learning_rate)?;
        let mut seen = std::collections::BTreeSet::new();
        if let Some(g) = self.gpus.iter().find(|&&g| !seen.insert(g)) {
            return Err(InvalidSetting::new(
                "cuda.gpus",
                format!("cuda.gpus names GPU {g} twice"),
            ));
        }
        Ok(())
    }
}

/// One generated suite: `name` = `dlrm-<tables>x<devices>`, or
/// `dlrm-<tables>x<devices>-share<memory_share>` when its memory is a
/// multiple of each task's own need. Exactly one of `memory_gb` and
/// `memory_share` is given.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SuiteConfig {
    pub tables: usize,
    pub devices: usize,
    /// Memory per device, the same for every task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_gb: Option<f64>,
    /// Memory per device of each task: this multiple of an even share of
    /// its tables' memory (their sum over the devices), never under its
    /// largest table. 1.1 leaves a tenth to spare: heuristics that balance
    /// lookups then often find no plan that fits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_share: Option<f64>,
}

impl SuiteConfig {
    pub fn name(&self) -> String {
        match self.memory_share {
            Some(share) => format!("dlrm-{}x{}-share{share}", self.tables, self.devices),
            None => format!("dlrm-{}x{}", self.tables, self.devices),
        }
    }

    /// The memory rule of `data.suites[i]` (this one), checked.
    pub fn memory(
        &self,
        i: usize,
    ) -> std::result::Result<crate::suite::SuiteMemory, InvalidSetting> {
        use crate::suite::SuiteMemory;
        match (self.memory_gb, self.memory_share) {
            (Some(gb), None) => {
                positive(&format!("data.suites[{i}].memory_gb"), gb)?;
                Ok(SuiteMemory::Gb(gb))
            }
            (None, Some(share)) if (1.0..=self.devices as f64).contains(&share) => {
                Ok(SuiteMemory::Share(share))
            }
            (None, Some(share)) => Err(InvalidSetting::new(
                format!("data.suites[{i}].memory_share"),
                format!(
                    "data.suites[{i}].memory_share = {share} must lie in 1..={} (below an even \
                 share of its tables' memory no task fits; at the number of devices, one \
                 device holds them all)",
                    self.devices
                ),
            )),
            (Some(_), Some(_)) => Err(InvalidSetting::new(
                format!("data.suites[{i}]"),
                format!("data.suites[{i}] gives both memory_gb and memory_share: give one"),
            )),
            (None, None) => Err(InvalidSetting::new(
                format!("data.suites[{i}]"),
                format!(
                    "data.suites[{i}] needs memory_gb (memory per device) or memory_share (a \
                 multiple of an even share of each task's tables' memory)"
                ),
            )),
        }
    }
}

/// Where generated data goes and what suites to draw.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DataConfig {
    pub dir: PathBuf,
    /// A pool CSV of the user's own tables: `generate` splits it and draws
    /// the suites from it instead of generating a pool (`[generate]` is
    /// then unused).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool: Option<PathBuf>,
    pub seed: u64,
    pub train_tasks: usize,
    pub test_tasks: usize,
    pub suites: Vec<SuiteConfig>,
}

impl Default for DataConfig {
    fn default() -> Self {
        let s = |tables, devices, memory_gb| SuiteConfig {
            tables,
            devices,
            memory_gb: Some(memory_gb),
            memory_share: None,
        };
        let tight = |tables, devices, share| SuiteConfig {
            tables,
            devices,
            memory_gb: None,
            memory_share: Some(share),
        };
        DataConfig {
            dir: PathBuf::from("data/generated"),
            pool: None,
            seed: 0,
            train_tasks: 50,
            test_tasks: 20,
            suites: vec![
                s(50, 4, 5.0),
                s(100, 4, 8.0),
                s(100, 8, 4.0),
                s(200, 8, 8.0),
                tight(50, 4, 1.1),
                tight(100, 8, 1.1),
            ],
        }
    }
}

impl DataConfig {
    pub fn validate(&self) -> std::result::Result<(), InvalidSetting> {
        positive("data.train_tasks", self.train_tasks as f64)?;
        positive("data.test_tasks", self.test_tasks as f64)?;
        let mut names = std::collections::BTreeMap::new();
        for (i, s) in self.suites.iter().enumerate() {
            positive(&format!("data.suites[{i}].tables"), s.tables as f64)?;
            if !(1..=crate::placement::MAX_DEVICES).contains(&s.devices) {
                return Err(InvalidSetting::new(
                    format!("data.suites[{i}].devices"),
                    format!(
                        "data.suites[{i}].devices = {} must lie in 1..={}",
                        s.devices,
                        crate::placement::MAX_DEVICES
                    ),
                ));
            }
            s.memory(i)?;
            // The files are named by tables, devices and memory share: a
            // second entry of the same name would overwrite the first's.
            if let Some(j) = names.insert(s.name(), i) {
                return Err(InvalidSetting::new(
                    format!("data.suites[{j}]"),
                    format!(
                        "data.suites[{j}] and data.suites[{i}] are both {}: their files would \
                     overwrite each other (one suite per number of tables and devices, and per \
                     memory_share)",
                        s.name()
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// `eval` settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EvalConfig {
    /// Oracle calls the `search` reference may spend per task.
    pub search_budget: usize,
    pub seed: u64,
}

impl Default for EvalConfig {
    fn default() -> Self {
        EvalConfig {
            search_budget: 4000,
            seed: 0,
        }
    }
}

/// Layer sizes of the cost and policy networks (DESIGN §5).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelConfig {
    /// Cost network: table MLP 21 → `cost_table_hidden` → `cost_table_out`.
    pub cost_table_hidden: i64,
    pub cost_table_out: i64,
    /// Hidden width of each cost head (per-device fwd, bwd, comm; overall).
    pub cost_head_hidden: i64,
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
    /// Episodes the policy places when it places for a user (`plan`,
    /// eval's `policy`): its greedy episode and `plan_samples − 1` samples
    /// (each seeded by its number, spread over the cores); the plan with the
    /// lowest predicted cost wins. 1: greedy only.
    pub plan_samples: usize,
    /// Whether `plan` also lets the cheap heuristics' plans (`lookup`,
    /// `size_lookup`, `torchrec`) compete on predicted cost.
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
    /// cost, more than one device), the moves and the search run from every
    /// distinct candidate that fits (the policy's episodes and the
    /// heuristics' plans, `plan_search` predicted plans each), the lowest
    /// predicted result winning, rather than only from the candidate
    /// predicted cheapest. The search then does not depend on one starting
    /// point.
    pub plan_search_every_candidate: bool,
    /// The learned plan replaces the best heuristic plan only when every
    /// cost-network member predicts it at least this share cheaper (0.02:
    /// 2 %). The search picks the plans the network underrates, so their
    /// predictions run low; the margin was chosen on validation draws of
    /// the table space (docs/results.md, "The guard's margin").
    pub plan_margin: f64,
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
            cost_members: 1,
            policy_table_hidden: 128,
            policy_table_out: 32,
            cost_feature_hidden: 64,
            cost_feature_out: 32,
            score_hidden: 64,
            value_hidden: 64,
            overall_cost: OverallCost::Composed,
            cost_work: CostWork::Inputs,
            plan_samples: 1,
            plan_heuristics: true,
            plan_temperature: 1.0,
            plan_moves: 0,
            plan_search: 2000,
            plan_search_every_candidate: true,
            plan_margin: 0.02,
        }
    }
}

impl ModelConfig {
    pub fn validate(&self) -> std::result::Result<(), InvalidSetting> {
        for (field, v) in [
            ("model.cost_table_hidden", self.cost_table_hidden),
            ("model.cost_table_out", self.cost_table_out),
            ("model.cost_head_hidden", self.cost_head_hidden),
            ("model.policy_table_hidden", self.policy_table_hidden),
            ("model.policy_table_out", self.policy_table_out),
            ("model.cost_feature_hidden", self.cost_feature_hidden),
            ("model.cost_feature_out", self.cost_feature_out),
            ("model.score_hidden", self.score_hidden),
            ("model.value_hidden", self.value_hidden),
        ] {
            if !(1..=65536).contains(&v) {
                return Err(InvalidSetting::new(
                    field,
                    format!("{field} = {v} must lie in 1..=65536"),
                ));
            }
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
        if !(1..=16).contains(&self.cost_members) {
            return Err(InvalidSetting::new(
                "model.cost_members",
                format!(
                    "model.cost_members = {} must lie in 1..=16",
                    self.cost_members
                ),
            ));
        }
        Ok(())
    }
}

/// The policy-gradient update.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Update {
    /// IMPALA's V-trace with a learnt value baseline.
    #[default]
    Vtrace,
    /// DreamShard's REINFORCE: the episode's return against the batch mean.
    Reinforce,
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

/// The measuring backends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// Deterministic model of a GPU (fast; for tests, laptops and training).
    Sim,
    /// Real fused embedding_bag with libtorch on this machine's CPU.
    Cpu,
    /// Real fused lookups on this host's GPUs with NCCL all-to-all (a
    /// benchworker built with `--features cuda`; docs/gpu.md).
    Cuda,
}

impl Backend {
    /// Its name on the command line and in a run's `config.toml`.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Sim => "sim",
            Backend::Cpu => "cpu",
            Backend::Cuda => "cuda",
        }
    }
}

/// How the learner, actors and benchworkers work together (DESIGN §3, §9).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterConfig {
    /// Actor threads the learner starts beside itself; with 0 actor
    /// threads, 0 benchworker threads and no remote peers (`--bind`), it
    /// runs Algorithm 1 in its own thread alone (slower, reproducible).
    pub actors: usize,
    /// Benchworker threads the learner starts beside itself.
    pub benchworkers: usize,
    /// Unrolls an actor may have in flight (credits).
    pub actor_credits: usize,
    /// Unrolls acted with weights more than this many versions old are
    /// dropped and counted. No more than this many unrolls are in flight
    /// over all actors at once (credits held, unrolls queued): more would
    /// be that old by the time the learner reached them, so actors beyond
    /// that wait their turn for a credit (0: one unroll in flight).
    pub max_policy_lag: usize,
    /// Seconds between heartbeats, both ways.
    pub heartbeat_s: f64,
    /// A peer silent this long is gone: its job goes to another one. A peer
    /// that hears nothing from the learner this long says hello again.
    pub peer_timeout_s: f64,
    /// A measurement not back after this long goes to another benchworker.
    pub job_timeout_s: f64,
    /// Without progress for this long (no measurement, cost step, policy
    /// update or unroll), with no measurement job out and no benchworker
    /// setting up within `job_timeout_s`, training stops with an error
    /// (after a checkpoint) instead of waiting for peers that will not come.
    pub stall_timeout_s: f64,
    /// The oracle that measures plans (`--backend`; absent: `sim`). A
    /// run's `config.toml` records the one it measures with: its cost
    /// buffer holds that oracle's measurements.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backend: Option<Backend>,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            actors: 2,
            benchworkers: 1,
            actor_credits: 2,
            max_policy_lag: 8,
            heartbeat_s: 1.0,
            peer_timeout_s: 10.0,
            job_timeout_s: 600.0,
            stall_timeout_s: 120.0,
            backend: None,
        }
    }
}

impl ClusterConfig {
    pub fn validate(&self) -> std::result::Result<(), InvalidSetting> {
        positive("cluster.actor_credits", self.actor_credits as f64)?;
        seconds("cluster.heartbeat_s", self.heartbeat_s)?;
        seconds("cluster.job_timeout_s", self.job_timeout_s)?;
        seconds("cluster.peer_timeout_s", self.peer_timeout_s)?;
        seconds("cluster.stall_timeout_s", self.stall_timeout_s)?;
        if self.peer_timeout_s < 2.0 * self.heartbeat_s {
            return Err(InvalidSetting::new(
                "cluster.peer_timeout_s",
                format!(
                    "cluster.peer_timeout_s ({}) must be at least twice cluster.heartbeat_s ({})",
                    self.peer_timeout_s, self.heartbeat_s
                ),
            ));
        }
        Ok(())
    }
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
    /// [`ModelConfig::plan_search`]) rather than the policy's greedy episode.
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
    pub cost_steps: usize,
    pub cost_batch: usize,
    pub cost_lr: f64,
    /// Decoupled weight decay of the cost network's optimizer (AdamW's
    /// `λ`: each step first shrinks the weights by `cost_lr · λ`). A few
    /// hundred measured plans are a small data set; the decay keeps the
    /// network from fitting their noise and makes its predictions carry
    /// over to the plans a search proposes.
    pub cost_weight_decay: f64,
    /// The cost network's loss (see [`CostLoss`]).
    pub cost_loss: CostLoss,
    pub policy_steps: usize,
    /// Episodes per policy update, in lockstep on one task.
    pub episodes: usize,
    pub policy_lr: f64,
    pub entropy_cost: f64,
    pub baseline_cost: f64,
    pub max_grad_norm: f64,
    /// V-trace's ρ̄, c̄ and ρ̄_pg.
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
            cost_steps: 1000,
            cost_batch: 64,
            cost_lr: 1e-3,
            cost_weight_decay: 0.1,
            cost_loss: CostLoss::Mse,
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
            update: Update::Vtrace,
            reward: RewardScale::Balanced,
            seed: 0,
            checkpoint_every: 1,
            keep_checkpoints: 3,
        }
    }
}

impl TrainConfig {
    pub fn validate(&self) -> std::result::Result<(), InvalidSetting> {
        positive("train.iterations", self.iterations as f64)?;
        positive(
            "train.measure_per_iteration",
            self.measure_per_iteration as f64,
        )?;
        positive("train.measure_temperature", self.measure_temperature)?;
        if !(0.0..=1.0).contains(&self.measure_greedy_share) {
            return Err(InvalidSetting::new(
                "train.measure_greedy_share",
                format!(
                    "train.measure_greedy_share = {} must lie in [0, 1]",
                    self.measure_greedy_share
                ),
            ));
        }
        positive("train.cost_batch", self.cost_batch as f64)?;
        if !(1..=65536).contains(&self.episodes) {
            return Err(InvalidSetting::new(
                "train.episodes",
                format!("train.episodes = {} must lie in 1..=65536", self.episodes),
            ));
        }
        positive("train.cost_lr", self.cost_lr)?;
        non_negative("train.cost_weight_decay", self.cost_weight_decay)?;
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
            seed: 0,
            space: crate::space::SpaceConfig::default(),
        }
    }
}

impl PretrainConfig {
    fn is_default(&self) -> bool {
        *self == PretrainConfig::default()
    }

    pub fn validate(&self) -> std::result::Result<(), InvalidSetting> {
        positive("pretrain.tasks", self.tasks as f64)?;
        positive("pretrain.plans_per_task", self.plans_per_task as f64)?;
        if !(0.0..=1.0).contains(&self.search_share) {
            return Err(InvalidSetting::new(
                "pretrain.search_share",
                format!(
                    "pretrain.search_share = {} must lie in [0, 1]",
                    self.search_share
                ),
            ));
        }
        self.space.validate()
    }
}

/// The whole configuration.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub cluster: ClusterConfig,
    pub memory: MemoryModel,
    pub sim: SimConfig,
    pub cpu: CpuConfig,
    pub cuda: CudaConfig,
    pub generate: PoolGenConfig,
    pub data: DataConfig,
    pub eval: EvalConfig,
    pub model: ModelConfig,
    pub train: TrainConfig,
    /// Only `learner pretrain` reads it; left out of a file while default.
    #[serde(skip_serializing_if = "PretrainConfig::is_default")]
    pub pretrain: PretrainConfig,
}

impl Config {
    /// Its file paths (`data.dir`, `data.pool`, `train.suite`,
    /// `train.extra_suites`, `train.init`) made absolute against `base`, the folder they
    /// were relative to: a run's `config.toml` written so resumes, `eval`
    /// and `plan` find them from any folder.
    pub fn with_absolute_paths(mut self, base: &Path) -> Config {
        let fix = |p: &mut PathBuf| {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        };
        fix(&mut self.data.dir);
        if let Some(pool) = &mut self.data.pool {
            fix(pool);
        }
        fix(&mut self.train.suite);
        self.train.extra_suites.iter_mut().for_each(fix);
        if let Some(init) = &mut self.train.init {
            fix(init);
        }
        self
    }

    /// Parses TOML text; `path` names the source in messages.
    pub fn from_toml(text: &str, path: &Path) -> Result<Config> {
        let cfg: Config = toml::from_str(text).map_err(|e| Error::Parse {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        cfg.validate().map_err(|e| Error::Invalid {
            path: path.to_path_buf(),
            location: "config".into(),
            message: e.to_string(),
        })?;
        Ok(cfg)
    }

    /// Reads a config file, or the defaults when `path` is `None`.
    pub fn load(path: Option<&Path>) -> Result<Config> {
        match path {
            None => Ok(Config::default()),
            Some(p) => {
                let text = std::fs::read_to_string(p).map_err(|e| Error::io(p, e))?;
                Config::from_toml(&text, p)
            }
        }
    }

    /// Reads a run's resolved configuration (`RUN/config.toml`, which
    /// `learner train` writes whole) and warns about the settings it lacks:
    /// a run written by an older embshard, whose missing settings take
    /// today's built-in defaults.
    ///
    /// A setting whose default changed after it came in takes, where a run
    /// lacks it, what runs did before it existed: `train.measure_temperature`
    /// (1; the default is 1000 since).
    pub fn load_run(path: &Path) -> Result<Config> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        let mut cfg = Config::from_toml(&text, path)?;
        let mut missing = missing_settings(&text);
        for m in &mut missing {
            if m.starts_with("train.measure_temperature =") {
                cfg.train.measure_temperature = 1.0;
                *m = "train.measure_temperature = 1.0 (how runs before the setting sampled)".into();
            }
        }
        if !missing.is_empty() {
            const SHOWN: usize = 6;
            let mut named: Vec<String> = missing.iter().take(SHOWN).cloned().collect();
            if missing.len() > SHOWN {
                named.push(format!("and {} more", missing.len() - SHOWN));
            }
            tracing::warn!(
                "{} comes from an older embshard: {} settings it lacks take these values ({}); \
                 if the run was trained otherwise, write its values into the file",
                path.display(),
                missing.len(),
                named.join(", ")
            );
        }
        Ok(cfg)
    }

    pub fn validate(&self) -> std::result::Result<(), InvalidSetting> {
        self.cluster.validate()?;
        self.sim.validate()?;
        self.cpu.validate()?;
        self.cuda.validate()?;
        self.generate.validate()?;
        self.data.validate()?;
        self.model.validate()?;
        self.train.validate()?;
        self.pretrain.validate()?;
        // Step rewards come from the composed iteration cost; REINFORCE
        // uses neither them nor λ.
        if self.train.step_rewards && self.model.overall_cost != OverallCost::Composed {
            return Err(InvalidSetting::new(
                "train.step_rewards",
                "train.step_rewards needs model.overall_cost = \"composed\" (a step's \
                        added cost is the composed iteration cost's)",
            ));
        }
        if self.train.update == Update::Reinforce
            && (self.train.step_rewards || self.train.lambda != 1.0)
        {
            return Err(InvalidSetting::new(
                "train.step_rewards",
                "train.step_rewards and train.lambda are V-trace's: with train.update = \
                        \"reinforce\" leave them at false and 1",
            ));
        }
        Ok(())
    }
}

/// The settings that TOML `text` leaves out, as `section.key = default`
/// (empty when the text does not parse: parsing reports that).
pub fn missing_settings(text: &str) -> Vec<String> {
    fn walk(all: &toml::Table, given: Option<&toml::Table>, prefix: &str, out: &mut Vec<String>) {
        for (key, value) in all {
            let name = format!("{prefix}{key}");
            let there = given.and_then(|g| g.get(key));
            match value {
                toml::Value::Table(sub) => walk(
                    sub,
                    there.and_then(|t| t.as_table()),
                    &format!("{name}."),
                    out,
                ),
                _ if there.is_none() => out.push(format!("{name} = {value}")),
                _ => {}
            }
        }
    }
    let (Ok(given), Ok(all)) = (
        text.parse::<toml::Table>(),
        toml::Table::try_from(Config::default()),
    ) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    walk(&all, Some(&given), "", &mut out);
    out
}

fn positive(field: &str, v: f64) -> std::result::Result<(), InvalidSetting> {
    if v.is_finite() && v > 0.0 {
        Ok(())
    } else {
        Err(InvalidSetting::new(
            field,
            format!("{field} = {v} must be a positive number"),
        ))
    }
}

/// A duration in seconds that libstd can hold and a peer can wait: from a
/// millisecond to about eleven days.
fn seconds(field: &str, v: f64) -> std::result::Result<(), InvalidSetting> {
    if (1e-3..=1e6).contains(&v) {
        Ok(())
    } else {
        Err(InvalidSetting::new(
            field,
            format!("{field} = {v} must lie in [0.001, 1000000] seconds"),
        ))
    }
}

fn non_negative(field: &str, v: f64) -> std::result::Result<(), InvalidSetting> {
    if v.is_finite() && v >= 0.0 {
        Ok(())
    } else {
        Err(InvalidSetting::new(
            field,
            format!("{field} = {v} must be a non-negative number"),
        ))
    }
}

fn unit(field: &str, v: f64) -> std::result::Result<(), InvalidSetting> {
    if v > 0.0 && v <= 1.0 {
        Ok(())
    } else {
        Err(InvalidSetting::new(
            field,
            format!("{field} = {v} must lie in (0, 1]"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_setting_that_cannot_work_is_named_by_its_key() {
        let mut cfg = Config::default();
        cfg.train.lambda = 0.0;
        let e = cfg.validate().unwrap_err();
        assert_eq!(e.key, "train.lambda");
        assert!(e.to_string().starts_with("train.lambda = 0 "), "{e}");
        let mut cfg = Config::default();
        cfg.data.suites[1].devices = 0;
        assert_eq!(cfg.validate().unwrap_err().key, "data.suites[1].devices");
        let mut cfg = Config::default();
        cfg.cluster.heartbeat_s = 0.0;
        assert_eq!(cfg.validate().unwrap_err().key, "cluster.heartbeat_s");
    }

    #[test]
    fn a_runs_paths_are_made_absolute_and_others_kept() {
        let mut cfg = Config::default();
        cfg.data.pool = Some(PathBuf::from("mine.csv"));
        cfg.train.extra_suites = vec![PathBuf::from("/abs/s.json"), PathBuf::from("x/s.json")];
        let cfg = cfg.with_absolute_paths(Path::new("/work/here"));
        assert_eq!(cfg.data.dir, Path::new("/work/here/data/generated"));
        assert_eq!(
            cfg.data.pool.as_deref(),
            Some(Path::new("/work/here/mine.csv"))
        );
        assert_eq!(
            cfg.train.suite,
            Path::new("/work/here/data/generated/dlrm-50x4.train.json")
        );
        assert_eq!(
            cfg.train.extra_suites,
            [
                PathBuf::from("/abs/s.json"),
                PathBuf::from("/work/here/x/s.json")
            ]
        );
    }

    #[test]
    fn the_shipped_default_config_spells_out_the_defaults() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/default.toml");
        let mut c = Config::load(Some(&path)).unwrap();
        // The two fields the main job sets: it also trains on 8-device
        // tasks, and it fine-tunes the shipped model.
        assert_eq!(
            c.train.extra_suites,
            [PathBuf::from("data/generated/dlrm-100x8.train.json")]
        );
        assert_eq!(c.train.init, Some(PathBuf::from("models/pretrained")));
        c.train.extra_suites.clear();
        c.train.init = None;
        assert_eq!(c, Config::default());
    }

    #[test]
    fn a_run_from_before_measure_temperature_keeps_sampling_as_it_did() {
        let dir = tempfile::tempdir().unwrap();
        let whole = toml::to_string(&Config::default()).unwrap();
        let path = dir.path().join("config.toml");
        std::fs::write(&path, &whole).unwrap();
        assert_eq!(
            Config::load_run(&path).unwrap().train.measure_temperature,
            1000.0
        );
        let older: String = whole
            .lines()
            .filter(|l| !l.starts_with("measure_temperature ="))
            .map(|l| format!("{l}\n"))
            .collect();
        std::fs::write(&path, older).unwrap();
        assert_eq!(
            Config::load_run(&path).unwrap().train.measure_temperature,
            1.0
        );
        // A default config written out reads back the same, suites with a
        // memory share included.
        assert_eq!(Config::from_toml(&whole, &path).unwrap(), Config::default());
    }

    #[test]
    fn the_settings_a_run_config_lacks_are_named_with_their_defaults() {
        let whole = toml::to_string(&Config::default()).unwrap();
        assert_eq!(missing_settings(&whole), Vec::<String>::new());
        // The shipped default spells out every setting.
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/default.toml");
        let shipped = std::fs::read_to_string(path).unwrap();
        assert_eq!(missing_settings(&shipped), Vec::<String>::new());
        // Two settings of a run written before they existed.
        let older: String = whole
            .lines()
            .filter(|l| !l.starts_with("plan_search =") && !l.starts_with("measure_planned ="))
            .map(|l| format!("{l}\n"))
            .collect();
        assert_eq!(
            missing_settings(&older),
            ["model.plan_search = 2000", "train.measure_planned = true"]
        );
        // A whole section left out: each of its settings.
        let missing = missing_settings("[sim]\nbatch = 1024\n");
        assert!(missing.iter().any(|m| m.starts_with("train.iterations = ")));
        assert!(!missing.iter().any(|m| m.starts_with("sim.batch")));
        assert!(missing.iter().any(|m| m.starts_with("sim.")));
    }

    #[test]
    fn empty_text_gives_the_defaults() {
        let c = Config::from_toml("", Path::new("c.toml")).unwrap();
        assert_eq!(c, Config::default());
    }

    #[test]
    fn fields_override_and_bad_values_name_their_field() {
        let c = Config::from_toml("[sim]\nbatch = 1024\n", Path::new("c.toml")).unwrap();
        assert_eq!(c.sim.batch, 1024);
        let e = Config::from_toml("[sim]\ngather_efficiency = 1.5\n", Path::new("c.toml"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("c.toml") && e.contains("sim.gather_efficiency"),
            "{e}"
        );
        let e = Config::from_toml("[sim]\nbogus = 1\n", Path::new("c.toml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("bogus"), "{e}");
        let e = Config::from_toml("[memory]\nprecision = \"fp8\"\n", Path::new("c.toml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("fp8"), "{e}");
        for bad in [0, 17] {
            let e = Config::from_toml(
                &format!("[model]\ncost_members = {bad}\n"),
                Path::new("c.toml"),
            )
            .unwrap_err()
            .to_string();
            assert!(e.contains("model.cost_members"), "{e}");
        }
        for bad in [
            "cost_weight_decay = -0.1",
            "cost_lr = 0.5\ncost_weight_decay = 2.0",
        ] {
            let e = Config::from_toml(&format!("[train]\n{bad}\n"), Path::new("c.toml"))
                .unwrap_err()
                .to_string();
            assert!(e.contains("train.cost_weight_decay"), "{e}");
        }
    }

    #[test]
    fn values_that_pass_as_numbers_but_cannot_work_are_refused() {
        let refused = |text: &str, field: &str| {
            let e = Config::from_toml(text, Path::new("c.toml"))
                .unwrap_err()
                .to_string();
            assert!(e.contains(field), "{text}: {e}");
        };
        // V-trace's λ, and step rewards only where they mean something.
        for v in ["0.0", "-0.5", "1.5", "nan"] {
            refused(&format!("[train]\nlambda = {v}\n"), "train.lambda");
        }
        refused(
            "[train]\nstep_rewards = true\nreward = \"raw\"\n",
            "train.reward",
        );
        refused(
            "[train]\nstep_rewards = true\n[model]\noverall_cost = \"head\"\n",
            "model.overall_cost",
        );
        refused(
            "[train]\nlambda = 0.9\nupdate = \"reinforce\"\n",
            "train.update",
        );
        // Tight copies: multiples of an even share, at least 1, ordered.
        for v in ["[0.9, 1.2]", "[1.5, 1.2]", "[1.1, inf]", "[nan, 1.2]"] {
            refused(
                &format!("[train]\ntight_memory_slack = {v}\n"),
                "train.tight_memory_slack",
            );
        }
        refused("[train]\ntight_memory = 9\n", "train.tight_memory");
        for v in ["0.0", "-1.0", "nan", "inf"] {
            refused(
                &format!("[train]\nmeasure_temperature = {v}\n"),
                "train.measure_temperature",
            );
        }
        for v in ["-1.0", "nan", "inf"] {
            refused(
                &format!("[train]\ninfeasible_penalty = {v}\n"),
                "train.infeasible_penalty",
            );
        }
        let tight = "[train]\ntight_memory = 2\ntight_memory_slack = [1.1, 1.1]\n\
                     infeasible_penalty = 0.5\n";
        assert!(Config::from_toml(tight, Path::new("c.toml")).is_ok());
        let ok =
            "[train]\nstep_rewards = true\nlambda = 0.9\n[model]\noverall_cost = \"composed\"\n";
        assert!(Config::from_toml(ok, Path::new("c.toml")).is_ok());
        // Durations libstd cannot hold, or that would never end.
        for v in ["nan", "inf", "1e20", "0.0", "-1.0", "1e-300"] {
            refused(
                &format!("[cluster]\nheartbeat_s = {v}\n"),
                "cluster.heartbeat_s",
            );
            refused(
                &format!("[cluster]\njob_timeout_s = {v}\n"),
                "cluster.job_timeout_s",
            );
            refused(
                &format!("[cluster]\nstall_timeout_s = {v}\n"),
                "cluster.stall_timeout_s",
            );
            refused(
                &format!("[cuda]\njoin_timeout_s = {v}\n"),
                "cuda.join_timeout_s",
            );
        }
        for v in ["nan", "inf", "1e20"] {
            refused(
                &format!("[cluster]\npeer_timeout_s = {v}\n"),
                "cluster.peer_timeout_s",
            );
        }
        refused(
            "[cluster]\npeer_timeout_s = 1.5\n",
            "cluster.peer_timeout_s",
        );
        for v in ["nan", "inf", "-0.5", "1e9"] {
            refused(
                &format!("[model]\nplan_temperature = {v}\n"),
                "model.plan_temperature",
            );
        }
        refused("[train]\nepisodes = 70000\n", "train.episodes");
        refused(
            "[data]\nsuites = [{ tables = 10, devices = 100000, memory_gb = 1.0 }]\n",
            "data.suites[0].devices",
        );
        refused(
            "[data]\nsuites = [{ tables = 10, devices = 2, memory_gb = 1.0 }, \
             { tables = 10, devices = 2, memory_gb = 8.0 }]\n",
            "dlrm-10x2",
        );
        for (suite, field) in [
            ("tables = 10, devices = 2", "needs memory_gb"),
            (
                "tables = 10, devices = 2, memory_gb = 1.0, memory_share = 1.1",
                "both",
            ),
            (
                "tables = 10, devices = 2, memory_share = 0.9",
                "data.suites[0].memory_share",
            ),
            (
                "tables = 10, devices = 2, memory_share = nan",
                "data.suites[0].memory_share",
            ),
            (
                "tables = 10, devices = 2, memory_share = 2.5",
                "must lie in 1..=2",
            ),
            (
                "tables = 10, devices = 2, memory_gb = -1.0",
                "data.suites[0].memory_gb",
            ),
        ] {
            refused(&format!("[data]\nsuites = [{{ {suite} }}]\n"), field);
        }
        // A suite whose memory is a share has a name of its own.
        let c = Config::from_toml(
            "[data]\nsuites = [{ tables = 10, devices = 2, memory_gb = 1.0 }, \
             { tables = 10, devices = 2, memory_share = 1.1 }]\n",
            Path::new("c.toml"),
        )
        .unwrap();
        let names: Vec<String> = c.data.suites.iter().map(|s| s.name()).collect();
        assert_eq!(names, ["dlrm-10x2", "dlrm-10x2-share1.1"]);
        refused(
            "[generate]\nlog10_rows_sigma = 1e308\n",
            "generate.log10_rows_sigma",
        );
        refused(
            "[generate]\nrows_pooling_slope = -1e308\n",
            "generate.rows_pooling_slope",
        );
        // The edges that work stay accepted.
        let c = Config::from_toml(
            "[cluster]\nheartbeat_s = 0.001\npeer_timeout_s = 1000000\n[model]\nplan_temperature = 0\n",
            Path::new("c.toml"),
        )
        .unwrap();
        assert_eq!(c.cluster.peer_timeout_s, 1e6);
    }
}
