//! Training, DreamShard's Algorithm 1 in one thread: each iteration measures
//! plans drawn from the current policy on the oracle, fits the cost network
//! to every measurement so far by MSE, then improves the policy on the
//! estimated MDP with V-trace.
//!
//! The two losses are the pieces the asynchronous learner reuses:
//! [`cost_loss`] over a batch of measured plans, [`policy_loss`] over an
//! actor's unroll.

use actor::mdp::ADDED_ITERATION_COST;
use actor::mdp::{rollout, MdpTask, Mode, PlainEpisodes, Unroll};
use actor::nets::{
    masked_log_softmax, CostNet, PlacedTables, PlanBatch, PolicyNet, COST_FEATURES, DEVICE_FEATURES,
};
use benchworker::Oracle;
use common::config::{Config, CostLoss, RewardScale, TrainConfig, Update};
use common::features::scaled;
use common::{Measurement, Plan, Task};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use tch::nn;
use tch::{Device, Kind, Tensor};

use std::path::Path;

use anyhow::Context;

use crate::adam::Adam;
use crate::vtrace::{from_importance_weights, Clipping};

/// One measured plan: what the cost network learns from.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct CostSample {
    pub placed: PlacedTables,
    pub measurement: Measurement,
    /// Which of the run's picks it measured: a resumed round measures the
    /// picks it lacks, in whatever order the others came back. `None` in
    /// logs written before it was kept (its place in the log stands for it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pick: Option<PickId>,
}

impl CostSample {
    pub fn new(task: &Task, plan: &Plan, measurement: Measurement) -> CostSample {
        CostSample {
            placed: PlacedTables {
                features: task.tables.iter().map(scaled).collect(),
                assignment: plan.assignment.clone(),
                devices: plan.devices,
            },
            measurement,
            pick: None,
        }
    }

    /// The sample as the measurement of pick `id`.
    pub fn of_pick(self, id: PickId) -> CostSample {
        CostSample {
            pick: Some(id),
            ..self
        }
    }
}

/// MSE of the cost network on measured plans: per-device forward, backward
/// and backward-communication times, and the iteration cost (DreamShard's
/// sum of four losses); for an ensemble, the mean of its members' losses,
/// each member's from its own prediction.
pub fn cost_loss(cost: &CostNet, samples: &[&CostSample], kind: CostLoss) -> Tensor {
    let batch = PlanBatch::new(samples.iter().map(|s| &s.placed));
    let per_device: Vec<f32> = samples
        .iter()
        .flat_map(|s| {
            s.measurement
                .devices
                .iter()
                .flat_map(|d| [d.fwd_ms as f32, d.bwd_ms as f32, d.bwd_comm_ms as f32])
        })
        .collect();
    let overall: Vec<f32> = samples
        .iter()
        .map(|s| s.measurement.cost_ms as f32)
        .collect();
    let dev_target = Tensor::from_slice(&per_device).view([-1, COST_FEATURES]);
    let overall = Tensor::from_slice(&overall);
    let err = |pred: Tensor, target: &Tensor| match kind {
        CostLoss::Mse => (pred - target).square(),
        CostLoss::Relative => ((pred - target) / target.clamp_min(0.1)).square(),
    };
    let losses: Vec<Tensor> = cost
        .forward_members(&batch)
        .into_iter()
        .map(|pred| {
            let dev_loss = err(pred.per_device, &dev_target)
                .mean_dim([0i64].as_slice(), false, Kind::Float)
                .sum(Kind::Float);
            dev_loss + err(pred.overall, &overall).mean(Kind::Float)
        })
        .collect();
    // Each member on its own loss; their mean keeps the scale of one.
    Tensor::stack(&losses, 0).mean(Kind::Float)
}

/// Figures of one policy update.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct PolicyStats {
    pub loss: f64,
    pub pg_loss: f64,
    pub baseline_loss: f64,
    pub entropy: f64,
    /// The episodes' mean final reward, `train.infeasible_penalty`
    /// included.
    pub mean_reward: f64,
}

/// The current policy re-run along a recorded unroll.
#[derive(Debug)]
pub struct Replay {
    /// `[M, E]` log-probabilities of the recorded actions.
    pub logp: Tensor,
    /// `[M, E]` entropies of the legal-action distributions.
    pub entropy: Tensor,
    /// `[M, E]` state values.
    pub values: Tensor,
}

/// Steps in a block of [`exclusive_cumsum`].
const CUMSUM_BLOCK: i64 = 64;

/// `[T, W]` sums of the rows before each row (the first row's: zero).
/// libtorch's cumsum along the first dimension is a scalar loop, a fifth
/// of a policy update when it ran here; this is matrix products instead:
/// within blocks of [`CUMSUM_BLOCK`] rows a product with the strictly lower
/// triangular matrix of ones, and each block's carry from the blocks
/// before (a cumsum of a few rows), so the work grows with T, not T².
fn exclusive_cumsum(x: &Tensor) -> Tensor {
    let (t, w) = (x.size()[0], x.size()[1]);
    let b = CUMSUM_BLOCK.min(t.max(1));
    let blocks = (t + b - 1) / b;
    let padded = x
        .constant_pad_nd([0, 0, 0, blocks * b - t])
        .view([blocks, b, w]);
    let earlier = Tensor::ones([b, b], (x.kind(), x.device())).tril(-1);
    let within = earlier.matmul(&padded);
    let sums = padded.sum_dim_intlist([1i64].as_slice(), false, x.kind());
    let carry = sums.cumsum(0, x.kind()) - &sums;
    (within + carry.unsqueeze(1))
        .view([blocks * b, w])
        .narrow(0, 0, t)
}

/// Re-runs the policy along an unroll: its table representations, hence the
/// device sums, depend on the current parameters; the device features are
/// the environment's and are taken as recorded.
pub fn replay(policy: &PolicyNet, task: &MdpTask, u: &Unroll) -> Replay {
    let (m, e) = (u.actions.size()[0], u.actions.size()[1]);
    let d = task.devices as i64;
    let order: Vec<i64> = u.order.iter().map(|&i| i as i64).collect();
    let placed = policy
        .tables(&task.features)
        .index_select(0, &Tensor::from_slice(&order));
    let pw = placed.size()[1];
    // Device sums before each step: an exclusive cumulative sum over time.
    let onehot = u.actions.one_hot(d).to_kind(Kind::Float);
    let contrib = onehot.unsqueeze(3) * placed.view([m, 1, 1, pw]);
    let before = exclusive_cumsum(&contrib.reshape([m, e * d * pw])).reshape([m, e, d, pw]);
    let current = placed
        .unsqueeze(1)
        .expand([m, e, pw], false)
        .reshape([m * e, pw]);
    let progress = (Tensor::arange(m, (Kind::Float, Device::Cpu)) / m as f64)
        .unsqueeze(1)
        .expand([m, e], false)
        .reshape([m * e]);
    let out = policy.forward(
        &before.reshape([m * e, d, pw]),
        &u.device_features.reshape([m * e, d, DEVICE_FEATURES]),
        &current,
        &progress,
    );
    let mask = u.masks.reshape([m * e, d]);
    let logp_all = masked_log_softmax(&out.logits, &mask);
    let logp = logp_all
        .gather(1, &u.actions.reshape([m * e, 1]), false)
        .reshape([m, e]);
    let entropy = -(logp_all.exp() * logp_all.masked_fill(&mask.logical_not(), 0.0))
        .sum_dim_intlist([1i64].as_slice(), false, Kind::Float)
        .reshape([m, e]);
    Replay {
        logp,
        entropy,
        values: out.value.reshape([m, e]),
    }
}

/// The IMPALA loss of an unroll under the current policy: policy gradient
/// with V-trace advantages, value regression to the V-trace targets, and an
/// entropy bonus; sums over steps, means over episodes.
pub fn policy_loss(
    policy: &PolicyNet,
    task: &MdpTask,
    u: &Unroll,
    cfg: &TrainConfig,
) -> (Tensor, PolicyStats) {
    let (m, e) = (u.actions.size()[0], u.actions.size()[1]);
    let r = replay(policy, task, u);
    let final_rewards = penalized(scaled_rewards(u, cfg.reward), u, cfg.infeasible_penalty);
    let n = e as f64;
    let entropy = r.entropy.sum(Kind::Float) / n;
    if cfg.update == Update::Reinforce {
        // Every step of an episode shares its return; the batch mean is the baseline.
        let adv = (&final_rewards - final_rewards.mean(Kind::Float)).unsqueeze(0);
        let pg_loss = -(&r.logp * adv).sum(Kind::Float) / n;
        let loss: Tensor = &pg_loss - &entropy * cfg.entropy_cost;
        let stats = PolicyStats {
            loss: loss.double_value(&[]),
            pg_loss: pg_loss.double_value(&[]),
            baseline_loss: 0.0,
            entropy: entropy.double_value(&[]),
            mean_reward: final_rewards.mean(Kind::Float).double_value(&[]),
        };
        return (loss, stats);
    }
    let rewards = step_rewards(u, &final_rewards, cfg.step_rewards);
    // One episode per column: it ends at the last step.
    let discounts = Tensor::ones([m, e], (Kind::Float, Device::Cpu));
    let _ = discounts.get(m - 1).fill_(0.0);
    let vt = from_importance_weights(
        &(&r.logp - &u.behaviour_logp),
        &discounts,
        &rewards,
        &r.values,
        &Tensor::zeros([e], (Kind::Float, Device::Cpu)),
        Clipping {
            rho: cfg.clip_rho,
            c: cfg.clip_c,
            pg_rho: cfg.clip_pg_rho,
            lambda: cfg.lambda,
        },
    );
    let pg_loss = -(&r.logp * &vt.pg_advantages).sum(Kind::Float) / n;
    let baseline_loss = (&vt.vs - &r.values).square().sum(Kind::Float) * 0.5 / n;
    let loss: Tensor = &pg_loss + &baseline_loss * cfg.baseline_cost - &entropy * cfg.entropy_cost;
    let stats = PolicyStats {
        loss: loss.double_value(&[]),
        pg_loss: pg_loss.double_value(&[]),
        baseline_loss: baseline_loss.double_value(&[]),
        entropy: entropy.double_value(&[]),
        mean_reward: final_rewards.mean(Kind::Float).double_value(&[]),
    };
    (loss, stats)
}

/// `[M, E]` rewards of an unroll's steps whose episodes end with
/// `final_rewards`: all at the last step, or (`per_step`) each step's
/// placement's added iteration cost, as its device features recorded it
/// (in balanced-cost units, negated), and at the last step what completes
/// the episode's reward, so that every episode's return is unchanged.
pub fn step_rewards(u: &Unroll, final_rewards: &Tensor, per_step: bool) -> Tensor {
    let (m, e) = (u.actions.size()[0], u.actions.size()[1]);
    if !per_step {
        let rewards = Tensor::zeros([m, e], (Kind::Float, Device::Cpu));
        rewards.get(m - 1).copy_(final_rewards);
        return rewards;
    }
    let added = u
        .device_features
        .select(3, ADDED_ITERATION_COST)
        .gather(2, &u.actions.unsqueeze(2), false)
        .squeeze_dim(2);
    let rewards = -added;
    let rest = final_rewards
        - rewards
            .narrow(0, 0, m - 1)
            .sum_dim_intlist([0i64].as_slice(), false, Kind::Float);
    rewards.get(m - 1).copy_(&rest);
    rewards
}

/// `rewards` (`[E]`, one per episode) less `penalty` for each episode
/// that ran out of memory.
pub fn penalized(rewards: Tensor, u: &Unroll, penalty: f64) -> Tensor {
    if penalty == 0.0 || !u.infeasible.iter().any(|&x| x) {
        return rewards;
    }
    let out: Vec<f32> = u
        .infeasible
        .iter()
        .map(|&x| if x { penalty as f32 } else { 0.0 })
        .collect();
    rewards - Tensor::from_slice(&out)
}

/// `[E]` final rewards of an unroll under a reward scaling.
pub fn scaled_rewards(u: &Unroll, scale: RewardScale) -> Tensor {
    let cost = &u.predicted_cost_ms;
    match scale {
        RewardScale::Balanced => u.final_rewards(),
        RewardScale::Raw => -cost,
        RewardScale::Batch => {
            let std = cost.std(true).double_value(&[]).max(1e-6);
            -(cost - cost.mean(Kind::Float)) / std
        }
        RewardScale::MinRatio => {
            let best = cost.min().double_value(&[]).max(1e-6);
            -(cost / best)
        }
    }
}

/// Each plan's iteration cost as each member predicts it (`[plan][member]`),
/// from the cost network's plain heads and the tables' projections
/// (`[tables × projected width]`): the members' device costs composed as
/// [`actor::nets::compose`] does, `max fwd + max (bwd + 2·comm)`. A plan
/// that is not one of these tables' (another count of tables, no device, a
/// table on a device it lacks) is predicted NaN by every member: never
/// cheaper than another.
fn composed_member_costs(
    heads: &actor::nets::DeviceHeads,
    projected: &[f32],
    plans: &[&Plan],
) -> Vec<Vec<f64>> {
    let w = heads.projected_width();
    let mut sums = Vec::new();
    plans
        .iter()
        .map(|p| {
            let tables = projected.len() / w.max(1);
            if p.devices == 0
                || p.assignment.len() != tables
                || p.assignment.iter().any(|&d| d >= p.devices)
            {
                return vec![f64::NAN; heads.members()];
            }
            sums.clear();
            sums.resize(p.devices * w, 0.0f32);
            for (t, &d) in p.assignment.iter().enumerate() {
                let x = &projected[t * w..(t + 1) * w];
                actor::nets::add_into(&mut sums[d * w..(d + 1) * w], x);
            }
            let each: Vec<Vec<[f32; 3]>> = sums
                .chunks_exact(w.max(1))
                .map(|s| heads.finish_each(s))
                .collect();
            (0..heads.members())
                .map(|m| {
                    let max = |f: &dyn Fn(&[f32; 3]) -> f64| {
                        each.iter()
                            .map(|e| f(&e[m]))
                            .fold(f64::NEG_INFINITY, f64::max)
                    };
                    max(&|c| c[0] as f64) + max(&|c| c[1] as f64 + 2.0 * c[2] as f64)
                })
                .collect()
        })
        .collect()
}

/// `f` of each item, in order, spread over up to one thread per core (each
/// takes the next item when free) when there are several items (for
/// plain-Rust work such as `plan`'s episodes and searches: each is seeded,
/// so the results do not depend on the threads).
fn in_threads<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = items.len().min(cores);
    if threads <= 1 {
        return items.iter().map(f).collect();
    }
    // Each thread takes the next item when it is free: items of unequal
    // work still keep every thread busy.
    let next = std::sync::atomic::AtomicUsize::new(0);
    let (f, next) = (&f, &next);
    let mut done: Vec<(usize, R)> = std::thread::scope(|scope| {
        let running: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(move || {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(item) = items.get(i) else {
                            break mine;
                        };
                        mine.push((i, f(item)));
                    }
                })
            })
            .collect();
        running
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    });
    done.sort_by_key(|(i, _)| *i);
    done.into_iter().map(|(_, r)| r).collect()
}

/// One line of `metrics.jsonl`: written after every policy update.
#[derive(Debug, Clone, Serialize)]
pub struct Metrics {
    /// Policy updates so far (this one included).
    pub step: usize,
    /// The round of Algorithm 1 this update belongs to.
    pub iteration: usize,
    /// The version of the weights this update produced.
    pub policy_version: u64,
    /// Placement steps of the unrolls learned from so far.
    pub env_steps: usize,
    /// Measured plans in the cost buffer.
    pub measurements: usize,
    pub cost_steps: usize,
    /// Mean cost-network loss of the cost steps since the previous line.
    pub cost_loss: Option<f64>,
    pub policy: PolicyStats,
    /// Mean measured and predicted cost of the plans measured since the
    /// previous line (the gap shows the cost network's error where the
    /// policy goes).
    pub mean_measured_ms: Option<f64>,
    pub mean_predicted_ms: Option<f64>,
    /// Policy versions between the weights the unroll was acted with and
    /// the learner's when it was learned from.
    pub policy_lag: u64,
    /// Unrolls dropped so far (too old, or acted on a superseded cost net).
    pub dropped_unrolls: usize,
    /// Steps of either network not taken so far because their gradient
    /// was not finite (absent while none).
    #[serde(skip_serializing_if = "is_zero")]
    pub refused_steps: usize,
    /// Seconds of training so far, over every process of the run (a
    /// resumed run's clock continues from its checkpoint's).
    pub elapsed_s: f64,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// What happened since the previous metrics line.
#[derive(Debug, Default)]
struct Tally {
    cost_loss: f64,
    cost_n: usize,
    measured: f64,
    predicted: f64,
    measured_n: usize,
}

fn mean(sum: f64, n: usize) -> Option<f64> {
    (n > 0).then(|| sum / n as f64)
}

/// Where a training run's products go as they appear: every measurement
/// (to the durable cost log, before it counts), every metrics line, and
/// the end of every round (checkpoints).
pub struct Hooks<'h> {
    pub measured: Hook<'h, CostSample>,
    pub metrics: Hook<'h, Metrics>,
    pub round_done: RoundHook<'h>,
}

/// Called with the trainer at the end of each round.
pub type RoundHook<'h> = Box<dyn for<'t> FnMut(&Trainer<'t>) -> anyhow::Result<()> + 'h>;

/// A callback that may fail (a write to disk).
pub type Hook<'h, T> = Box<dyn FnMut(&T) -> anyhow::Result<()> + 'h>;

impl Hooks<'_> {
    /// Hooks that keep nothing.
    pub fn none() -> Hooks<'static> {
        Hooks {
            measured: Box::new(|_| Ok(())),
            metrics: Box::new(|_| Ok(())),
            round_done: Box::new(|_| Ok(())),
        }
    }
}

/// A plan drawn from the current policy for measuring.
#[derive(Debug, Clone)]
pub struct Pick {
    pub task: usize,
    pub plan: Plan,
    pub predicted_ms: f64,
    pub id: PickId,
}

/// A pick's round and its place in the round (see [`Trainer::pick_plan`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct PickId {
    pub round: usize,
    pub place: usize,
}

/// The two networks, each in its own variable store so that each has its
/// own optimizer.
pub struct Model {
    pub policy_vs: nn::VarStore,
    pub cost_vs: nn::VarStore,
    pub policy: PolicyNet,
    pub cost: CostNet,
    /// How [`Model::plan`] chooses (`model.plan_*`), and the global batch
    /// for TorchRec's estimator among its candidates.
    pub plan_cfg: common::config::ModelConfig,
    pub batch: u64,
}

impl Model {
    pub fn new(cfg: &Config) -> Model {
        let policy_vs = nn::VarStore::new(Device::Cpu);
        let cost_vs = nn::VarStore::new(Device::Cpu);
        let policy = PolicyNet::new(&(policy_vs.root() / "policy"), &cfg.model);
        let cost = CostNet::new(&(cost_vs.root() / "cost"), &cfg.model);
        Model {
            policy_vs,
            cost_vs,
            policy,
            cost,
            plan_cfg: cfg.model.clone(),
            batch: cfg.sim.batch,
        }
    }

    /// Writes both networks into `dir` (`policy.ot`, `cost.ot`). Not atomic
    /// by itself: [`crate::checkpoint::save`] writes into a temp folder,
    /// fsyncs and renames it.
    pub fn save(&self, dir: &Path) -> anyhow::Result<()> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        for (vs, name) in [(&self.policy_vs, "policy.ot"), (&self.cost_vs, "cost.ot")] {
            let path = dir.join(name);
            vs.save(&path)
                .with_context(|| format!("writing {}", path.display()))?;
        }
        Ok(())
    }

    /// Loads networks of `cfg.model`'s sizes from `dir`.
    pub fn load(cfg: &Config, dir: &Path) -> anyhow::Result<Model> {
        let model = Model::new(cfg);
        for (vs, name) in [(&model.policy_vs, "policy.ot"), (&model.cost_vs, "cost.ot")] {
            let path = dir.join(name);
            // Every tensor checked: a plain VarStore load would ignore extra
            // ones (say, ensemble members beyond `model.cost_members`).
            Tensor::load_multi(&path)
                .map_err(anyhow::Error::from)
                .and_then(|named| {
                    actor::wire::import_tensors(vs, &named).map_err(anyhow::Error::msg)
                })
                .with_context(|| {
                    format!(
                        "loading {} (a checkpoint of this configuration? its layer sizes \
                         and model.cost_members must match)",
                        path.display()
                    )
                })?;
        }
        Ok(model)
    }

    /// The cost network's estimate of a plan: per device (forward, backward,
    /// backward communication) and the iteration cost, in ms.
    pub fn estimate(&self, tables: &[common::Table], plan: &Plan) -> (Vec<[f64; 3]>, f64) {
        let batch = PlanBatch::new(&[PlacedTables {
            features: tables.iter().map(scaled).collect(),
            assignment: plan.assignment.clone(),
            devices: plan.devices,
        }]);
        let pred = tch::no_grad(|| self.cost.forward(&batch));
        let per_device: Vec<f32> = Vec::try_from(pred.per_device.view([-1])).unwrap_or_default();
        (
            per_device
                .chunks(3)
                .map(|c| [c[0] as f64, c[1] as f64, c[2] as f64])
                .collect(),
            pred.overall.double_value(&[0]),
        )
    }

    /// Each plan's iteration cost (ms) as each cost-network member
    /// predicts it: `[plan][member]`.
    pub fn member_costs(&self, tables: &[common::Table], plans: &[&Plan]) -> Vec<Vec<f64>> {
        let features: Vec<_> = tables.iter().map(scaled).collect();
        if self.plan_cfg.overall_cost == common::config::OverallCost::Composed {
            self.member_costs_plain(&features, plans)
        } else {
            self.member_costs_batched(&features, plans)
        }
    }

    /// [`Model::member_costs`] through libtorch, in one batch.
    fn member_costs_batched(
        &self,
        features: &[[f32; common::NUM_FEATURES]],
        plans: &[&Plan],
    ) -> Vec<Vec<f64>> {
        let placed: Vec<PlacedTables> = plans
            .iter()
            .map(|p| PlacedTables {
                features: features.to_vec(),
                assignment: p.assignment.clone(),
                devices: p.devices,
            })
            .collect();
        let batch = PlanBatch::new(&placed);
        let members = tch::no_grad(|| self.cost.forward_members(&batch));
        let per_member: Vec<Vec<f64>> = members
            .iter()
            .map(|m| Vec::<f64>::try_from(m.overall.to_kind(Kind::Double)).unwrap_or_default())
            .collect();
        (0..plans.len())
            .map(|p| {
                per_member
                    .iter()
                    .map(|m| m.get(p).copied().unwrap_or(f64::NAN))
                    .collect()
            })
            .collect()
    }

    /// [`Model::member_costs`] of a composed overall cost on plain arrays:
    /// the tables' representations once (not once per plan), each plan's
    /// device sums of their projections, each member's heads, composed as
    /// [`actor::nets::compose`] does. Equal to the batched forward up to
    /// float rounding.
    fn member_costs_plain(
        &self,
        features: &[[f32; common::NUM_FEATURES]],
        plans: &[&Plan],
    ) -> Vec<Vec<f64>> {
        let heads = self.cost.device_heads();
        let reps = tch::no_grad(|| self.cost.tables(&Tensor::from_slice2(features)));
        let flat = Vec::<f32>::try_from(reps.to_kind(Kind::Float).view([-1])).unwrap_or_default();
        composed_member_costs(&heads, &heads.project_rows(&flat), plans)
    }

    /// [`Model::member_costs`] of plans of the task `episodes` was made for
    /// (by [`Model::plan_keeping`]), from its copy of the cost network where
    /// the overall cost is composed.
    pub fn member_costs_for(
        &self,
        episodes: &PlainEpisodes,
        tables: &[common::Table],
        plans: &[&Plan],
    ) -> Vec<Vec<f64>> {
        if self.plan_cfg.overall_cost == common::config::OverallCost::Composed {
            composed_member_costs(episodes.heads(), episodes.cost_projections(), plans)
        } else {
            self.member_costs(tables, plans)
        }
    }

    /// The policy's plan for a task, and whether it ran out of memory (see
    /// [`Model::estimate`] for its predicted cost): the candidate with the
    /// lowest predicted cost among the greedy episode, `plan_samples − 1`
    /// sampled ones (plain arrays, spread over the cores, each seeded by its
    /// number: reproducible) and, with
    /// `model.plan_heuristics`, the cheap heuristics' plans; then, for a
    /// feasible candidate and a composed overall cost, `model.plan_moves`
    /// hill-climbing moves and `model.plan_search` predicted plans of local
    /// search on the cost network (kept if it predicts lower, see
    /// [`crate::search::Outcome::improved`]); with
    /// `model.plan_search_every_candidate`, moves and search from every
    /// feasible candidate, the lowest prediction winning. With one candidate
    /// and no moves or search, the greedy episode as it is.
    pub fn plan(&self, task: &Task, mem: &common::MemoryModel) -> (Plan, bool) {
        let (plan, infeasible, _) = self.plan_keeping(task, mem);
        (plan, infeasible)
    }

    /// [`Model::plan`], with the networks' plain copies for the task it
    /// planned, for predicting more plans of it
    /// ([`Model::member_costs_for`]) without computing them again.
    pub fn plan_keeping(
        &self,
        task: &Task,
        mem: &common::MemoryModel,
    ) -> (Plan, bool, PlainEpisodes) {
        let mdp = MdpTask::new(&task.tables, task.devices, task.cap_bytes(), mem);
        // The greedy episode and the sampled ones: plain arrays, no libtorch
        // call per step, sample `i` seeded by `i` (reproducible, whatever
        // the threads).
        let episodes = PlainEpisodes::new(&self.policy, &self.cost, &mdp);
        let (plan, infeasible) = self.plan_with(task, mem, &mdp, &episodes);
        (plan, infeasible, episodes)
    }

    /// [`Model::plan`] once the task's episodes are ready.
    fn plan_with(
        &self,
        task: &Task,
        mem: &common::MemoryModel,
        mdp: &MdpTask,
        episodes: &PlainEpisodes,
    ) -> (Plan, bool) {
        let c = &self.plan_cfg;
        let k = c.plan_samples.max(1);
        let heuristics: Vec<Vec<usize>> = if c.plan_heuristics {
            use crate::baselines::Method::{Lookup, SizeLookup, Torchrec};
            let found =
                crate::baselines::plans_for(task, mem, self.batch, &[Lookup, SizeLookup, Torchrec]);
            found.map(|p| p.assignment).collect()
        } else {
            Vec::new()
        };
        // Moves and search need per-device costs composed into the overall.
        let (moves, searched) = if c.overall_cost == common::config::OverallCost::Composed {
            (c.plan_moves, c.plan_search)
        } else {
            (0, 0)
        };
        if searched > 1 && task.devices > 1 && c.plan_search_every_candidate && moves == 0 {
            return self.search_each(task, mem, episodes, heuristics);
        }
        let indices: Vec<usize> = (0..k).collect();
        let mut candidates: Vec<(Vec<usize>, bool)> = in_threads(&indices, |&i| match i {
            0 => episodes.greedy(),
            i => episodes.sampled(i as u64, c.plan_temperature),
        });
        candidates.extend(heuristics.into_iter().map(|a| (a, false)));
        if candidates.len() == 1 && moves == 0 && searched == 0 {
            let (assignment, infeasible) = candidates.swap_remove(0);
            return (
                Plan {
                    devices: task.devices,
                    assignment,
                },
                infeasible,
            );
        }
        // The cost network's table representations once; each candidate's
        // device sums from them.
        let _guard = tch::no_grad_guard();
        let reps = self.cost.tables(&mdp.features);
        let searching = searched > 1 && task.devices > 1;
        // The episodes' copy of the cost network's heads and table
        // projections, for every search.
        let net = searching.then(|| {
            crate::search::CostNetOracle::from_projected(
                episodes.heads().clone(),
                episodes.cost_projections().to_vec(),
                0,
            )
        });
        let moved = |assignment: Vec<usize>| -> Vec<usize> {
            if moves > 0 {
                self.improve(mdp, &reps, assignment, moves)
            } else {
                assignment
            }
        };
        // The search from each start (after its moves), with its result's
        // predicted cost, in order: spread over up to one thread per core
        // when more than one (a search is plain Rust on the copied heads,
        // and each is seeded, so the result does not depend on the threads).
        let searches = |starts: Vec<Vec<usize>>| -> Vec<(Vec<usize>, f64)> {
            let Some(net) = &net else {
                return starts.into_iter().map(|a| (a, f64::NAN)).collect();
            };
            in_threads(&starts, |start| {
                Self::search_from(net, task, mem, start.clone(), searched)
            })
        };
        if searching && c.plan_search_every_candidate {
            // From every distinct candidate that fits (heuristics often
            // agree); the lowest prediction wins (the first on a tie).
            let starts: Vec<Vec<usize>> = candidates
                .iter()
                .enumerate()
                .filter(|(i, (a, infeasible))| {
                    !infeasible && !candidates[..*i].iter().any(|(b, _)| b == a)
                })
                .map(|(_, (assignment, _))| moved(assignment.clone()))
                .collect();
            let best = searches(starts)
                .into_iter()
                .min_by(|a, b| a.1.total_cmp(&b.1));
            if let Some((assignment, _)) = best {
                return (
                    Plan {
                        devices: task.devices,
                        assignment,
                    },
                    false,
                );
            }
        }
        let best =
            if candidates.len() == 1 {
                0
            } else {
                let (n, d) = (candidates.len() as i64, task.devices as i64);
                let device_of: Vec<i64> = candidates
                    .iter()
                    .enumerate()
                    .flat_map(|(i, (a, _))| a.iter().map(move |&x| i as i64 * d + x as i64))
                    .collect();
                let dev = Tensor::zeros([n * d, reps.size()[1]], (Kind::Float, Device::Cpu))
                    .index_add(0, &Tensor::from_slice(&device_of), &reps.repeat([n, 1]));
                let plan_of_device = Tensor::arange(n, (Kind::Int64, Device::Cpu))
                    .repeat_interleave_self_int(d, 0, None);
                let costs: Vec<f32> =
                    Vec::try_from(self.cost.overall_cost(&dev, &plan_of_device, n))
                        .unwrap_or_default();
                (0..candidates.len())
                    .filter(|&i| !candidates[i].1)
                    .min_by(|&a, &b| costs[a].total_cmp(&costs[b]).then(a.cmp(&b)))
                    .unwrap_or(0)
            };
        let (assignment, infeasible) = candidates.swap_remove(best);
        let assignment = if infeasible {
            assignment
        } else {
            let mut found = searches(vec![moved(assignment)]);
            found.swap_remove(0).0
        };
        (
            Plan {
                devices: task.devices,
                assignment,
            },
            infeasible,
        )
    }

    /// `plan` searching from every candidate, without moves: each episode
    /// then the search from its plan, and the search from each distinct
    /// heuristic plan, as one job each, spread over the cores (a search
    /// does not wait for the other candidates). The lowest predicted
    /// result wins, the first on a tie; with no candidate that fits, the
    /// greedy episode as it is. The same plan as searching after all the
    /// candidates are known.
    fn search_each(
        &self,
        task: &Task,
        mem: &common::MemoryModel,
        episodes: &PlainEpisodes,
        heuristics: Vec<Vec<usize>>,
    ) -> (Plan, bool) {
        let c = &self.plan_cfg;
        let k = c.plan_samples.max(1);
        let net = crate::search::CostNetOracle::from_projected(
            episodes.heads().clone(),
            episodes.cost_projections().to_vec(),
            0,
        );
        let mut distinct: Vec<Vec<usize>> = Vec::new();
        for h in heuristics {
            if !distinct.contains(&h) {
                distinct.push(h);
            }
        }
        let jobs: Vec<usize> = (0..k + distinct.len()).collect();
        let mut done = in_threads(&jobs, |&j| {
            let (start, infeasible) = match j {
                0 => episodes.greedy(),
                j if j < k => episodes.sampled(j as u64, c.plan_temperature),
                j => (distinct[j - k].clone(), false),
            };
            let found = (!infeasible)
                .then(|| Self::search_from(&net, task, mem, start.clone(), c.plan_search));
            (start, infeasible, found)
        });
        let best = (done.iter().enumerate())
            .filter_map(|(i, (_, _, found))| found.as_ref().map(|f| (i, f.1)))
            .min_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
        let (assignment, infeasible) = match best {
            Some((i, _)) => (
                done.swap_remove(i).2.map(|f| f.0).unwrap_or_default(),
                false,
            ),
            None => {
                let (greedy, infeasible, _) = done.swap_remove(0);
                (greedy, infeasible)
            }
        };
        (
            Plan {
                devices: task.devices,
                assignment,
            },
            infeasible,
        )
    }

    /// Where `plan`'s search on the cost network goes from each of
    /// `starts` (plans that fit `task`): the plan each search keeps, for
    /// measuring. The search goes where the network predicts low, and so
    /// where it is most wrong: measuring what it finds teaches the network
    /// its errors there (pre-training's rounds, [`crate::pretrain`]).
    pub fn searched_from(
        &self,
        task: &Task,
        mem: &common::MemoryModel,
        starts: &[Vec<usize>],
    ) -> Vec<Vec<usize>> {
        let budget = self.plan_cfg.plan_search;
        if budget <= 1 || task.devices < 2 {
            return starts.to_vec();
        }
        let mdp = MdpTask::new(&task.tables, task.devices, task.cap_bytes(), mem);
        let _guard = tch::no_grad_guard();
        let reps = self.cost.tables(&mdp.features);
        let net = crate::search::CostNetOracle::new(self.cost.device_heads(), &reps, 0);
        in_threads(starts, |start| {
            Self::search_from(&net, task, mem, start.clone(), budget).0
        })
    }

    /// The `search` reference's local search on the cost network (`net`,
    /// a fresh copy for each search) from `start` (a plan that fits),
    /// `budget` predicted plans: its plan if it predicts lower (see
    /// [`crate::search::Outcome::improved`]), else the start; with that
    /// plan's predicted cost.
    fn search_from(
        net: &crate::search::CostNetOracle,
        task: &Task,
        mem: &common::MemoryModel,
        start: Vec<usize>,
        budget: usize,
    ) -> (Vec<usize>, f64) {
        let start = Plan {
            devices: task.devices,
            assignment: start,
        };
        let mut net = net.clone();
        let mut rng = ChaCha8Rng::seed_from_u64(0);
        match crate::search::search(
            &mut net,
            &task.tables,
            &start,
            task.cap_bytes(),
            mem,
            budget,
            &mut rng,
        ) {
            Ok(out) if out.improved() => (out.plan.assignment, out.cost_ms),
            Ok(out) => (start.assignment, out.start_cost_ms),
            Err(e) => {
                // Only a plan that does not fit the task gets here.
                tracing::warn!("plan: the search on the cost network stopped: {e}");
                (start.assignment, f64::INFINITY)
            }
        }
    }
}

impl Model {
    /// Hill climbing on the cost network: up to `moves` times, the single
    /// table move (to a device it fits) that lowers the predicted iteration
    /// cost most. Only the two devices a move touches are re-costed.
    fn improve(
        &self,
        mdp: &MdpTask,
        reps: &Tensor,
        mut assignment: Vec<usize>,
        moves: usize,
    ) -> Vec<usize> {
        let _guard = tch::no_grad_guard();
        let (m, d) = (mdp.tables(), mdp.devices);
        let bytes = &mdp.bytes;
        let cap = mdp.cap_bytes;
        let cw = reps.size()[1];
        let mut used = vec![0u64; d];
        for (t, &a) in assignment.iter().enumerate() {
            used[a] += bytes[t];
        }
        let dev_of = Tensor::from_slice(&assignment.iter().map(|&a| a as i64).collect::<Vec<_>>());
        let dev_repr =
            Tensor::zeros([d as i64, cw], (Kind::Float, Device::Cpu)).index_add(0, &dev_of, reps);
        // Per-device (fwd, bwd, comm) as plain floats: a move changes two
        // devices, and `compose` is two maxima and a sum.
        let costs_of = |t: &Tensor| Vec::<f32>::try_from(t.view([-1])).unwrap_or_default();
        let mut pd = costs_of(&self.cost.device_costs(&dev_repr));
        let composed = |dev: &dyn Fn(usize) -> [f32; 3]| {
            let (mut fwd, mut rest) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
            for x in 0..d {
                let c = dev(x);
                fwd = fwd.max(c[0]);
                rest = rest.max(c[1] + c[2] * 2.0);
            }
            fwd + rest
        };
        let row = |v: &[f32], x: usize| [v[x * 3], v[x * 3 + 1], v[x * 3 + 2]];
        let mut current = composed(&|x| row(&pd, x));
        for _ in 0..moves {
            // Only moves off a bottleneck device (the slowest forward, the
            // slowest backward with its exchanges) can lower the cost.
            let argmax = |f: &dyn Fn([f32; 3]) -> f32| {
                (0..d)
                    .max_by(|&a, &b| f(row(&pd, a)).total_cmp(&f(row(&pd, b))))
                    .unwrap_or(0)
            };
            let slow = [argmax(&|c| c[0]), argmax(&|c| c[1] + 2.0 * c[2])];
            let (mut tabs, mut dsts) = (Vec::new(), Vec::new());
            for t in (0..m).filter(|&t| slow.contains(&assignment[t])) {
                for (dst, &u) in used.iter().enumerate() {
                    if dst != assignment[t] && u + bytes[t] <= cap {
                        tabs.push(t as i64);
                        dsts.push(dst as i64);
                    }
                }
            }
            if tabs.is_empty() {
                break;
            }
            let n = tabs.len();
            let srcs: Vec<i64> = tabs
                .iter()
                .map(|&t| assignment[t as usize] as i64)
                .collect();
            let moved = reps.index_select(0, &Tensor::from_slice(&tabs));
            let src_repr = dev_repr.index_select(0, &Tensor::from_slice(&srcs)) - &moved;
            let dst_repr = dev_repr.index_select(0, &Tensor::from_slice(&dsts)) + &moved;
            // [2N, 3]: the source devices after each move, then the targets.
            let changed = costs_of(
                &self
                    .cost
                    .device_costs(&Tensor::cat(&[src_repr, dst_repr], 0)),
            );
            let (best, best_cost) = (0..n)
                .map(|i| {
                    let (src, dst) = (srcs[i] as usize, dsts[i] as usize);
                    let c = composed(&|x| {
                        if x == src {
                            row(&changed, i)
                        } else if x == dst {
                            row(&changed, n + i)
                        } else {
                            row(&pd, x)
                        }
                    });
                    (i, c)
                })
                .min_by(|a, b| a.1.total_cmp(&b.1))
                .unwrap_or((0, f32::INFINITY));
            if best_cost >= current - 1e-6 {
                break;
            }
            let (t, dst) = (tabs[best] as usize, dsts[best] as usize);
            let src = assignment[t];
            used[src] -= bytes[t];
            used[dst] += bytes[t];
            assignment[t] = dst;
            let rep = reps.get(t as i64);
            let _ = dev_repr.get(src as i64).g_sub_(&rep);
            let _ = dev_repr.get(dst as i64).g_add_(&rep);
            pd[src * 3..src * 3 + 3].copy_from_slice(&row(&changed, best));
            pd[dst * 3..dst * 3 + 3].copy_from_slice(&row(&changed, n + best));
            current = best_cost;
        }
        assignment
    }
}

/// Counters that a checkpoint carries and a resumed run continues.
#[derive(Debug, Clone, Default, PartialEq, Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Counters {
    /// The next iteration (round of Algorithm 1) to run.
    pub iteration: usize,
    pub env_steps: usize,
    /// Position of the trainer's RNG stream (tasks, cost batches, the
    /// seeds of its rollouts), a decimal u128.
    pub rng_word_pos: String,
    pub cost_steps: usize,
    pub policy_updates: usize,
    /// Version of the newest published weights.
    pub policy_version: u64,
    pub dropped_unrolls: usize,
    /// Steps of either network not taken because their gradient was not
    /// finite (the weights stay as they were).
    pub refused_steps: usize,
    /// Seconds of training up to this checkpoint, over every process of
    /// the run (the time between a crash and the resume not counted).
    pub training_s: f64,
}

impl Counters {
    /// Whether two checkpoints hold the same training state: the same
    /// counters, whatever the clock.
    pub fn same_state(&self, other: &Counters) -> bool {
        Counters {
            training_s: 0.0,
            ..self.clone()
        } == Counters {
            training_s: 0.0,
            ..other.clone()
        }
    }
}

/// A training run in progress: the networks, their optimizers, the cost
/// buffer, the counters and the RNG — everything a checkpoint holds.
pub struct Trainer<'a> {
    cfg: &'a Config,
    tasks: &'a [Task],
    /// The training tasks, then their tight-memory copies
    /// ([`crate::data::rollout_tasks`]): what rollouts place.
    rollout_tasks: Vec<Task>,
    /// The rollout tasks' MDPs, in the same order.
    mdps: Vec<MdpTask>,
    pub model: Model,
    pub cost_opt: Adam,
    pub policy_opt: Adam,
    pub buffer: Vec<CostSample>,
    /// Measurements the cost network learns from beside the buffer's but
    /// that are not this run's (pre-training's bulk measurements, which
    /// are regenerated rather than logged): cost steps draw from both.
    pub prior: Vec<CostSample>,
    pub counters: Counters,
    rng: ChaCha8Rng,
    tally: Tally,
    started: std::time::Instant,
}

impl<'a> Trainer<'a> {
    /// A fresh run.
    pub fn new(cfg: &'a Config, tasks: &'a [Task]) -> Trainer<'a> {
        tch::manual_seed(cfg.train.seed as i64);
        let model = Model::new(cfg);
        Trainer::with(cfg, tasks, model, Vec::new(), Counters::default())
    }

    /// A fresh run from trained networks (fine-tuning): fresh optimizer
    /// state and counters. The model's plan settings and batch are the
    /// run's.
    pub fn from_model(cfg: &'a Config, tasks: &'a [Task], mut model: Model) -> Trainer<'a> {
        tch::manual_seed(cfg.train.seed as i64);
        model.plan_cfg = cfg.model.clone();
        model.batch = cfg.sim.batch;
        Trainer::with(cfg, tasks, model, Vec::new(), Counters::default())
    }

    /// Continues from a saved model, optimizer state, counters and buffer.
    pub fn with(
        cfg: &'a Config,
        tasks: &'a [Task],
        model: Model,
        buffer: Vec<CostSample>,
        counters: Counters,
    ) -> Trainer<'a> {
        let mut rng = ChaCha8Rng::seed_from_u64(cfg.train.seed);
        if let Ok(pos) = counters.rng_word_pos.parse::<u128>() {
            rng.set_word_pos(pos);
        }
        let rollout_tasks = crate::data::rollout_tasks(tasks, cfg);
        Trainer {
            mdps: rollout_tasks
                .iter()
                .map(|k| MdpTask::new(&k.tables, k.devices, k.cap_bytes(), &cfg.memory))
                .collect(),
            rollout_tasks,
            cost_opt: Adam::new(&model.cost_vs, cfg.train.cost_lr)
                .with_weight_decay(cfg.train.cost_weight_decay),
            policy_opt: Adam::new(&model.policy_vs, cfg.train.policy_lr),
            model,
            buffer,
            prior: Vec::new(),
            counters,
            rng,
            tally: Tally::default(),
            started: std::time::Instant::now(),
            cfg,
            tasks,
        }
    }

    /// Whether every configured iteration has run.
    pub fn done(&self) -> bool {
        self.counters.iteration >= self.cfg.train.iterations
    }

    pub fn config(&self) -> &'a Config {
        self.cfg
    }

    /// The training tasks: measured plans are theirs.
    pub fn tasks(&self) -> &'a [Task] {
        self.tasks
    }

    /// What rollouts place: the training tasks, then their tight-memory
    /// copies (an unroll names its task by its index here).
    pub fn rollout_tasks(&self) -> &[Task] {
        &self.rollout_tasks
    }

    /// Whether the `j`-th plan measured in a round is the greedy pick
    /// (`train.measure_greedy_share` of them are: what `plan` returns, or the
    /// policy's greedy episode, see `train.measure_planned`) rather than a
    /// sample.
    pub fn greedy_pick(&self, j: usize) -> bool {
        let t = &self.cfg.train;
        j < (t.measure_greedy_share * t.measure_per_iteration as f64).round() as usize
    }

    /// The seed of the `j`-th pick of the current round: a pick depends on
    /// its place in the round, not on how many were drawn before it in this
    /// process, so a run resumed mid-round goes on with the picks it had
    /// not measured rather than drawing the first ones again.
    fn pick_seed(&self, j: usize) -> u64 {
        let mut bytes = Vec::with_capacity(24);
        for n in [
            self.cfg.train.seed,
            self.counters.iteration as u64,
            j as u64,
        ] {
            bytes.extend_from_slice(&n.to_le_bytes());
        }
        common::fs::fnv1a(&bytes)
    }

    /// Draws the round's `j`-th plan to measure (seeded by its place, `pick_seed`):
    /// a training task and one plan for it from the current policy, a
    /// sample, or for a greedy pick ([`Self::greedy_pick`]) what `plan`
    /// returns (`train.measure_planned`) or the greedy episode.
    pub fn pick_plan(&mut self, j: usize) -> Pick {
        let id = PickId {
            round: self.counters.iteration,
            place: j,
        };
        let greedy = self.greedy_pick(j);
        let seed = self.pick_seed(j);
        let k = self.pick_task(j);
        let task = &self.tasks[k];
        let (plan, infeasible, predicted_ms) = if greedy && self.cfg.train.measure_planned {
            let (plan, infeasible) = self.model.plan(task, &self.cfg.memory);
            let predicted_ms = self.model.estimate(&task.tables, &plan).1;
            (plan, infeasible, predicted_ms)
        } else {
            let episodes = PlainEpisodes::new(&self.model.policy, &self.model.cost, &self.mdps[k]);
            let (assignment, infeasible) = if greedy {
                episodes.greedy()
            } else {
                // Not the stream `pick_task` drew the task from.
                let seed = seed ^ 0x5bd1_e995_9e37_79b9;
                episodes.sampled(seed, self.cfg.train.measure_temperature)
            };
            let plan = Plan {
                devices: task.devices,
                assignment,
            };
            let predicted_ms = self.model.estimate(&task.tables, &plan).1;
            (plan, infeasible, predicted_ms)
        };
        if infeasible {
            // A plan over a device's memory cannot run (on a GPU it would
            // fail for want of memory): a heuristic's plan that fits is
            // measured instead.
            if let Some(plan) = self.fitting_heuristic_plan(task) {
                let predicted_ms = self.model.estimate(&task.tables, &plan).1;
                return Pick {
                    task: k,
                    plan,
                    predicted_ms,
                    id,
                };
            }
        }
        Pick {
            task: k,
            plan,
            predicted_ms,
            id,
        }
    }

    /// The place in the current round of its first pick neither measured
    /// (in the cost buffer) nor in `out` (being measured). A round resumed
    /// after a crash thereby measures exactly the picks it lacks, whatever
    /// order its measurements came back in; one that must make up for
    /// measurements lost from a damaged log goes on past its
    /// `train.measure_per_iteration` places (to fresh picks, not the same
    /// ones again).
    pub fn next_pick(&self, out: &[PickId]) -> usize {
        self.free_picks(out)[0]
    }

    /// The training task pick `j` of this round measures a plan of.
    pub fn pick_task(&self, j: usize) -> usize {
        ChaCha8Rng::seed_from_u64(self.pick_seed(j)).gen_range(0..self.tasks.len())
    }

    /// The devices of pick `j`'s plan: its task's.
    pub fn pick_devices(&self, j: usize) -> usize {
        self.tasks[self.pick_task(j)].devices
    }

    /// This round's places neither measured nor in `out`, ascending: every
    /// free place of the round's `measure_per_iteration`, and at least one.
    pub fn free_picks(&self, out: &[PickId]) -> Vec<usize> {
        let m = self.cfg.train.measure_per_iteration.max(1);
        let round = self.counters.iteration;
        // A sample logged before picks were numbered: its place in the log.
        let measured = self.buffer.iter().enumerate().map(|(k, s)| {
            s.pick.unwrap_or(PickId {
                round: k / m,
                place: k % m,
            })
        });
        let taken: std::collections::BTreeSet<usize> = measured
            .chain(out.iter().copied())
            .filter(|id| id.round == round)
            .map(|id| id.place)
            .collect();
        // Among the first `taken.len() + 1` places one is free.
        (0..m.max(taken.len() + 1))
            .filter(|j| !taken.contains(j))
            .collect()
    }

    /// The first of the cheap heuristics' plans for `task` that fits.
    fn fitting_heuristic_plan(&self, task: &Task) -> Option<Plan> {
        use crate::baselines::Method::{Lookup, SizeLookup, Torchrec};
        let methods = [SizeLookup, Lookup, Torchrec];
        let first =
            crate::baselines::plans_for(task, &self.cfg.memory, self.model.batch, &methods).next();
        first
    }

    /// Adds a measured plan to the cost buffer (after the caller made it
    /// durable); `predicted_ms` is what the cost network expected of it.
    pub fn record(&mut self, predicted_ms: f64, sample: CostSample) {
        let t = &mut self.tally;
        t.measured += sample.measurement.cost_ms;
        t.predicted += predicted_ms;
        t.measured_n += 1;
        self.buffer.push(sample);
    }

    /// Counts a step of the `net` network refused for a gradient that is
    /// not finite, and says so (the first time, then every hundredth).
    fn refused_step(&mut self, net: &str) {
        self.counters.refused_steps += 1;
        let n = self.counters.refused_steps;
        if n == 1 || n % 100 == 0 {
            tracing::warn!(
                "a {net} network step was not taken: its gradient is not finite (a loss that \
                 overflowed, from extreme inputs); {n} so far, the weights are unchanged"
            );
        }
    }

    /// One MSE step of the cost network on a batch drawn from the buffer
    /// and the prior measurements.
    pub fn cost_step(&mut self) {
        let (n, prior) = (self.buffer.len() + self.prior.len(), self.prior.len());
        if n == 0 {
            return;
        }
        let t = &self.cfg.train;
        let batch: Vec<&CostSample> = (0..t.cost_batch.min(n))
            .map(|_| match self.rng.gen_range(0..n) {
                k if k < prior => &self.prior[k],
                k => &self.buffer[k - prior],
            })
            .collect();
        let loss = cost_loss(&self.model.cost, &batch, t.cost_loss);
        if self.cost_opt.backward_step(&loss) {
            self.tally.cost_loss += loss.double_value(&[]);
            self.tally.cost_n += 1;
        } else {
            self.refused_step("cost");
        }
        self.counters.cost_steps += 1;
    }

    /// Rolls out a batch of episodes on a random rollout task in this
    /// thread.
    pub fn rollout(&mut self) -> (usize, Unroll) {
        let k = self.rng.gen_range(0..self.mdps.len());
        let u = rollout(
            &self.model.policy,
            &self.model.cost,
            &self.mdps[k],
            self.cfg.train.episodes,
            Mode::Sample {
                seed: self.rng.gen(),
            },
        );
        (k, u)
    }

    /// One policy update from an unroll of task `task` acted with weights
    /// `lag` versions old; returns its metrics line.
    pub fn policy_update(&mut self, task: usize, u: &Unroll, lag: u64) -> Metrics {
        let t = &self.cfg.train;
        let mdp = &self.mdps[task];
        let (loss, stats) = policy_loss(&self.model.policy, mdp, u, t);
        let stepped = self
            .policy_opt
            .backward_step_clip_norm(&loss, t.max_grad_norm);
        if !stepped {
            self.refused_step("policy");
        }
        self.counters.env_steps += u.plans.len() * self.mdps[task].tables();
        self.counters.policy_updates += 1;
        // New weights only from a step taken.
        self.counters.policy_version += u64::from(stepped);
        let tally = std::mem::take(&mut self.tally);
        Metrics {
            step: self.counters.policy_updates,
            iteration: self.counters.iteration,
            policy_version: self.counters.policy_version,
            env_steps: self.counters.env_steps,
            measurements: self.buffer.len(),
            cost_steps: self.counters.cost_steps,
            cost_loss: mean(tally.cost_loss, tally.cost_n),
            policy: stats,
            mean_measured_ms: mean(tally.measured, tally.measured_n),
            mean_predicted_ms: mean(tally.predicted, tally.measured_n),
            policy_lag: lag,
            dropped_unrolls: self.counters.dropped_unrolls,
            refused_steps: self.counters.refused_steps,
            elapsed_s: self.training_s(),
        }
    }

    /// The counters with the RNG's position as of now (for a checkpoint
    /// taken mid-round).
    pub fn counters_now(&self) -> Counters {
        Counters {
            rng_word_pos: self.rng.get_word_pos().to_string(),
            training_s: self.training_s(),
            ..self.counters.clone()
        }
    }

    /// Seconds of training so far: the checkpoint's and this process's.
    pub fn training_s(&self) -> f64 {
        self.counters.training_s + self.started.elapsed().as_secs_f64()
    }

    /// Closes the current round.
    pub fn finish_round(&mut self) {
        self.counters.iteration += 1;
        self.counters.rng_word_pos = self.rng.get_word_pos().to_string();
    }

    /// One round of Algorithm 1 in this thread: measure, fit the cost
    /// network, improve the policy.
    pub fn iteration(&mut self, oracle: &mut dyn Oracle, hooks: &mut Hooks) -> anyhow::Result<()> {
        let t = &self.cfg.train;
        // A run resumed mid-round has some of the round's measurements.
        let first = self.counters.iteration * t.measure_per_iteration;
        while self.buffer.len() < first + t.measure_per_iteration {
            let j = self.next_pick(&[]);
            let pick = self.pick_plan(j);
            let m = oracle.measure(&self.tasks[pick.task].tables, &pick.plan)?;
            let sample = CostSample::new(&self.tasks[pick.task], &pick.plan, m).of_pick(pick.id);
            (hooks.measured)(&sample)?;
            self.record(pick.predicted_ms, sample);
        }
        // Up to the round's totals: a checkpoint taken mid-round (a cluster
        // run stopped while learning) has some of the round's steps done.
        let round_end = self.counters.iteration + 1;
        while self.counters.cost_steps < round_end * t.cost_steps && !self.buffer.is_empty() {
            self.cost_step();
        }
        while self.counters.policy_updates < round_end * t.policy_steps {
            let (k, u) = self.rollout();
            let line = self.policy_update(k, &u, 0);
            (hooks.metrics)(&line)?;
        }
        self.finish_round();
        (hooks.round_done)(self)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use actor::mdp::numbered_by_first_use;
    use common::Suite;

    /// `configs/small.toml` with its data in `dir`.
    pub(crate) fn small_config(dir: &Path) -> Config {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/small.toml");
        let mut cfg = Config::load(Some(&path)).unwrap();
        assert_eq!(
            cfg.train.suite,
            cfg.data.dir.join("dlrm-20x4.train.json"),
            "small.toml trains on its own 20×4 suite"
        );
        cfg.data.dir = dir.to_path_buf();
        cfg.train.suite = dir.join("dlrm-20x4.train.json");
        cfg
    }

    /// [`small_config`] with its data generated in `dir`, and its training
    /// suite.
    pub(crate) fn small_data(dir: &Path) -> (Config, Suite) {
        let cfg = small_config(dir);
        crate::data::generate(&cfg, dir).unwrap();
        let suite = Suite::load(&cfg.train.suite, &cfg.memory).unwrap();
        (cfg, suite)
    }

    /// A fresh model's unroll of `episodes` sampled episodes (seeded) of the
    /// small configuration's first training task.
    fn fresh_unroll(dir: &Path, episodes: usize, seed: u64) -> (Config, Model, MdpTask, Unroll) {
        let (cfg, suite) = small_data(dir);
        let model = Model::new(&cfg);
        let task = &suite.tasks[0];
        let mdp = MdpTask::new(&task.tables, task.devices, task.cap_bytes(), &cfg.memory);
        let u = rollout(
            &model.policy,
            &model.cost,
            &mdp,
            episodes,
            Mode::Sample { seed },
        );
        (cfg, model, mdp, u)
    }

    /// Across block edges, and for fewer rows than a block: the sums of
    /// the rows before, and their gradient, as a plain loop gives them.
    #[test]
    fn exclusive_cumsum_sums_the_rows_before_across_blocks() {
        for t in [
            1i64,
            5,
            CUMSUM_BLOCK,
            CUMSUM_BLOCK + 1,
            2 * CUMSUM_BLOCK + 3,
        ] {
            let x = Tensor::randn([t, 3], (Kind::Float, Device::Cpu)).set_requires_grad(true);
            let got = exclusive_cumsum(&x);
            assert_eq!(got.size(), [t, 3]);
            let rows: Vec<Vec<f32>> = Vec::try_from(&x.detach()).unwrap();
            let mut sum = [0.0f32; 3];
            for (i, row) in rows.iter().enumerate() {
                for (k, s) in sum.iter().enumerate() {
                    let v = got.double_value(&[i as i64, k as i64]) as f32;
                    assert!((v - s).abs() < 1e-4, "t {t}, row {i}: {v} against {s}");
                }
                for (s, v) in sum.iter_mut().zip(row) {
                    *s += v;
                }
            }
            // d(Σ weights · out)/dx[i] = Σ of the weights of the rows after i.
            let weights = Tensor::randn([t, 3], (Kind::Float, Device::Cpu));
            (&got * &weights).sum(Kind::Float).backward();
            let after = weights.flip([0]).cumsum(0, Kind::Float).flip([0]) - &weights;
            assert!(
                (x.grad() - after).abs().max().double_value(&[]) < 1e-4,
                "t {t}"
            );
        }
    }

    #[test]
    fn replaying_an_unroll_gives_back_the_actors_log_probabilities() {
        let dir = tempfile::tempdir().unwrap();
        let (cfg, model, mdp, u) = fresh_unroll(dir.path(), 8, 1);
        let r = tch::no_grad(|| replay(&model.policy, &mdp, &u));
        let diff = (&r.logp - &u.behaviour_logp).abs().max().double_value(&[]);
        assert!(diff < 1e-4, "replayed log-probabilities differ by {diff}");
        assert!(r.entropy.ge(0.0).all().int64_value(&[]) == 1);
        // The loss has gradients for the policy.
        let (loss, stats) = policy_loss(&model.policy, &mdp, &u, &cfg.train);
        loss.backward();
        let grads: f64 = model
            .policy_vs
            .trainable_variables()
            .iter()
            .map(|v| v.grad().abs().sum(Kind::Float).double_value(&[]))
            .sum();
        assert!(grads > 0.0 && stats.loss.is_finite());
    }

    #[test]
    fn reward_scalings_and_reinforce_follow_their_definitions() {
        let dir = tempfile::tempdir().unwrap();
        let (mut cfg, model, mdp, mut u) = fresh_unroll(dir.path(), 16, 1);
        // An untrained cost network may predict anything; use known costs.
        let costs: Vec<f32> = (0..16).map(|k| 10.0 + (k * 7 % 16) as f32).collect();
        u.predicted_cost_ms = Tensor::from_slice(&costs);
        let cost = &u.predicted_cost_ms;
        let raw = scaled_rewards(&u, RewardScale::Raw);
        assert!((&raw + cost).abs().max().double_value(&[]) < 1e-6);
        let balanced = scaled_rewards(&u, RewardScale::Balanced);
        assert!(
            (&balanced * u.reward_scale + cost)
                .abs()
                .max()
                .double_value(&[])
                < 1e-4
        );
        let batch = scaled_rewards(&u, RewardScale::Batch);
        assert!(batch.mean(Kind::Float).double_value(&[]).abs() < 1e-5);
        assert!((batch.std(true).double_value(&[]) - 1.0).abs() < 1e-4);
        let ratio = scaled_rewards(&u, RewardScale::MinRatio);
        assert!(
            (ratio.max().double_value(&[]) + 1.0).abs() < 1e-6,
            "the best episode gets -1"
        );
        cfg.train.update = Update::Reinforce;
        let (loss, stats) = policy_loss(&model.policy, &mdp, &u, &cfg.train);
        loss.backward();
        assert_eq!(stats.baseline_loss, 0.0);
        assert!(stats.loss.is_finite());
    }

    #[test]
    fn an_update_whose_gradient_overflows_changes_no_weight_and_is_counted() {
        let dir = tempfile::tempdir().unwrap();
        let (cfg, suite) = small_data(dir.path());
        let mut trainer = Trainer::new(&cfg, &suite.tasks);
        let weights = |t: &Trainer| -> Vec<(String, Tensor)> {
            let mut v: Vec<_> = t
                .model
                .policy_vs
                .variables()
                .into_iter()
                .map(|(n, w)| (n, w.copy()))
                .collect();
            v.sort_by(|a, b| a.0.cmp(&b.0));
            v
        };
        let (k, mut u) = trainer.rollout();
        let before = weights(&trainer);
        let version = trainer.counters.policy_version;
        // Finite, but rewards of cost / 1e-300 overflow f32.
        u.reward_scale = 1e-300;
        let line = trainer.policy_update(k, &u, 0);
        assert_eq!(trainer.counters.refused_steps, 1);
        assert_eq!(line.refused_steps, 1);
        assert_eq!(trainer.counters.policy_version, version, "no new weights");
        assert_eq!(trainer.counters.policy_updates, 1, "the unroll is used up");
        for ((name, a), (_, b)) in before.iter().zip(weights(&trainer)) {
            assert!(a.equal(&b), "{name} changed");
        }
        // A sound unroll steps as before.
        let (k, u) = trainer.rollout();
        trainer.policy_update(k, &u, 0);
        assert_eq!(trainer.counters.policy_version, version + 1);
        assert_eq!(trainer.counters.refused_steps, 1);
        let after = weights(&trainer);
        assert!(before
            .iter()
            .zip(&after)
            .any(|((_, a), (_, b))| !a.equal(b)));
        assert!(after
            .iter()
            .all(|(_, w)| w.isfinite().all().int64_value(&[]) == 1));
    }

    #[test]
    fn episodes_that_ran_out_of_memory_lose_the_penalty_and_rollouts_place_tight_copies() {
        let dir = tempfile::tempdir().unwrap();
        let (mut cfg, suite) = small_data(dir.path());
        cfg.train.tight_memory = 1;
        cfg.train.tight_memory_slack = [1.0, 1.0];
        cfg.train.infeasible_penalty = 0.75;
        let mut trainer = Trainer::new(&cfg, &suite.tasks);
        let n = suite.tasks.len();
        assert!(trainer.rollout_tasks().len() > n, "tight copies are made");
        // Rollouts place the copies too.
        let mut tight = None;
        for _ in 0..40 {
            let (k, u) = trainer.rollout();
            assert!(k < trainer.rollout_tasks().len());
            if k >= n {
                tight = Some((k, u));
            }
        }
        let (k, mut u) = tight.expect("no rollout on a tight copy in 40");
        let copy = &trainer.rollout_tasks()[k];
        let of = suite.tasks.iter().find(|t| copy.name.starts_with(&t.name));
        assert!(of.is_some_and(|of| copy.memory_gb < of.memory_gb && copy.tables == of.tables));
        // The mask keeps room for the tables to come, so episodes seldom run
        // out: say that every other one did.
        u.infeasible = (0..u.infeasible.len()).map(|e| e % 2 == 0).collect();
        // The penalty falls on exactly the episodes that ran out.
        let plain = scaled_rewards(&u, cfg.train.reward);
        let less = penalized(plain.shallow_clone(), &u, cfg.train.infeasible_penalty);
        let diff = Vec::<f32>::try_from(&plain - &less).unwrap();
        for (d, &out) in diff.iter().zip(&u.infeasible) {
            let want = if out { 0.75 } else { 0.0 };
            assert!((d - want).abs() < 1e-6, "{d} for infeasible = {out}");
        }
        // The update learns from a tight copy's unroll, penalty included.
        let before = trainer.counters.policy_updates;
        let line = trainer.policy_update(k, &u, 0);
        assert_eq!(trainer.counters.policy_updates, before + 1);
        let share = u.infeasible.iter().filter(|&&x| x).count() as f64 / u.infeasible.len() as f64;
        let want = plain.mean(Kind::Float).double_value(&[]) - 0.75 * share;
        assert!((line.policy.mean_reward - want).abs() < 1e-4, "{line:?}");
    }

    #[test]
    fn step_rewards_are_each_steps_added_cost_and_keep_every_episodes_return() {
        let dir = tempfile::tempdir().unwrap();
        let (_, _, mdp, u) = fresh_unroll(dir.path(), 8, 2);
        let last = scaled_rewards(&u, RewardScale::Balanced);
        let m = u.actions.size()[0];
        let end = step_rewards(&u, &last, false);
        assert_eq!(end.narrow(0, 0, m - 1).abs().max().double_value(&[]), 0.0);
        let steps = step_rewards(&u, &last, true);
        let returns = steps.sum_dim_intlist([0i64].as_slice(), false, Kind::Float);
        assert!((&returns - &last).abs().max().double_value(&[]) < 1e-4);
        // Each step before the last: minus what its device's features said
        // the placement adds to the iteration cost.
        let feats: Vec<f32> = Vec::try_from(u.device_features.view([-1])).unwrap();
        let acts: Vec<i64> = Vec::try_from(u.actions.view([-1])).unwrap();
        let got: Vec<f32> = Vec::try_from(steps.view([-1])).unwrap();
        let (e, d) = (8usize, mdp.devices);
        let w = actor::nets::DEVICE_FEATURES as usize;
        let mut nonzero = 0;
        for i in 0..(m as usize - 1) * e {
            let added = feats[(i * d + acts[i] as usize) * w + ADDED_ITERATION_COST as usize];
            assert_eq!(got[i], -added, "step-episode {i}");
            nonzero += usize::from(added != 0.0);
        }
        assert!(nonzero > 0, "no step added to the iteration cost");
        // The steps' added costs, the last one's included, telescope to the
        // predicted iteration cost of the finished plan wherever no device
        // stayed empty (an empty device costs nothing in the features, and
        // its heads' bias in the cost network's prediction).
        let mut checked = 0;
        for k in 0..e {
            if (0..d).any(|dev| !u.plans[k].contains(&dev)) {
                continue;
            }
            let total: f32 = (0..m as usize)
                .map(|t| {
                    let i = t * e + k;
                    feats[(i * d + acts[i] as usize) * w + ADDED_ITERATION_COST as usize]
                })
                .sum();
            let want = -last.double_value(&[k as i64]) as f32;
            assert!(
                (total - want).abs() < 1e-3 * (1.0 + want.abs()),
                "episode {k}: {total} vs {want}"
            );
            checked += 1;
        }
        assert!(checked > 0, "every episode left a device empty");
    }

    #[test]
    fn an_ensembles_members_learn_from_their_own_losses() {
        let dir = tempfile::tempdir().unwrap();
        let (mut cfg, suite) = small_data(dir.path());
        cfg.model.cost_members = 2;
        let mut sim = benchworker::sim::SimOracle::new(cfg.sim.clone(), cfg.memory);
        let samples: Vec<CostSample> = suite.tasks[..4]
            .iter()
            .map(|task| {
                let plan = Plan {
                    devices: task.devices,
                    assignment: (0..task.tables.len()).map(|i| i % task.devices).collect(),
                };
                let m = sim.measure(&task.tables, &plan).unwrap();
                CostSample::new(task, &plan, m)
            })
            .collect();
        let refs: Vec<&CostSample> = samples.iter().collect();
        let model = Model::new(&cfg);
        let vars = model.cost_vs.variables();
        let grads = |member0: bool| -> Vec<(String, Tensor)> {
            for mut v in model.cost_vs.trainable_variables() {
                if v.grad().defined() {
                    v.zero_grad();
                }
            }
            cost_loss(&model.cost, &refs, CostLoss::Mse).backward();
            let mut g: Vec<(String, Tensor)> = vars
                .iter()
                .filter(|(n, v)| n.contains("member1") != member0 && v.grad().defined())
                .map(|(n, v)| (n.clone(), v.grad().copy()))
                .collect();
            g.sort_by(|a, b| a.0.cmp(&b.0));
            g
        };
        let before = grads(true);
        assert!(before
            .iter()
            .any(|(_, g)| g.abs().sum(Kind::Float).double_value(&[]) > 0.0));
        // Change the second member: the first one's gradients stay as they
        // were (a loss on the members' mean would couple them).
        tch::no_grad(|| {
            for (n, v) in &vars {
                if n.contains("member1") {
                    let _ = v.shallow_clone().g_add_(&(v.randn_like() * 0.5));
                }
            }
        });
        let after = grads(true);
        assert_eq!(before.len(), after.len());
        for ((n, a), (_, b)) in before.iter().zip(&after) {
            let diff = (a - b).abs().max().double_value(&[]);
            assert!(diff < 1e-6, "{n}: gradient moved by {diff}");
        }
        assert!(grads(false)
            .iter()
            .any(|(_, g)| g.abs().sum(Kind::Float).double_value(&[]) > 0.0));
    }

    #[test]
    fn a_checkpoint_loads_only_into_its_own_ensemble_size() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = small_config(dir.path());
        cfg.model.cost_members = 2;
        Model::new(&cfg).save(dir.path()).unwrap();
        assert!(Model::load(&cfg, dir.path()).is_ok());
        for members in [1, 3] {
            cfg.model.cost_members = members;
            let e = Model::load(&cfg, dir.path()).err().unwrap();
            assert!(format!("{e:#}").contains("model.cost_members"), "{e:#}");
        }
    }

    #[test]
    fn the_greedy_share_measures_what_plan_returns_or_the_greedy_episode() {
        let dir = tempfile::tempdir().unwrap();
        let (mut cfg, suite) = small_data(dir.path());
        let mut differ = 0;
        for planned in [true, false] {
            cfg.train.measure_planned = planned;
            let mut trainer = Trainer::new(&cfg, &suite.tasks);
            assert!(trainer.greedy_pick(0));
            for round in 0..6 {
                trainer.counters.iteration = round;
                let pick = trainer.pick_plan(0);
                let task = &suite.tasks[pick.task];
                let planned_plan = trainer.model.plan(task, &cfg.memory).0;
                let mdp = MdpTask::new(&task.tables, task.devices, task.cap_bytes(), &cfg.memory);
                let episode =
                    actor::mdp::greedy_episode(&trainer.model.policy, &trainer.model.cost, &mdp).0;
                if planned {
                    assert_eq!(pick.plan, planned_plan);
                    let predicted = trainer.model.estimate(&task.tables, &pick.plan).1;
                    assert!((pick.predicted_ms - predicted).abs() < 1e-6);
                    differ += usize::from(pick.plan.assignment != episode);
                } else {
                    // The batched episode: the same up to device numbering.
                    assert_eq!(
                        numbered_by_first_use(&pick.plan.assignment),
                        numbered_by_first_use(&episode)
                    );
                }
            }
        }
        assert!(differ > 0, "plan never differed from the greedy episode");
    }

    #[test]
    fn a_checkpoint_carries_the_training_clock_and_is_not_rewritten_for_it_alone() {
        let dir = tempfile::tempdir().unwrap();
        let (cfg, suite) = small_data(dir.path());
        let run = dir.path().join("run");
        let mut trainer = Trainer::new(&cfg, &suite.tasks);
        trainer.counters.training_s = 100.0;
        let first = crate::checkpoint::save(&run, &trainer, 5).unwrap();
        let newest = |run: &std::path::Path| {
            crate::checkpoint::load_latest(&cfg, run)
                .unwrap()
                .unwrap()
                .counters
        };
        let saved = newest(&run);
        assert!(saved.training_s >= 100.0, "{}", saved.training_s);
        // Only the clock moved (by a minute): the newest checkpoint stands.
        trainer.counters.training_s += 60.0;
        assert_eq!(crate::checkpoint::save(&run, &trainer, 5).unwrap(), first);
        assert_eq!(crate::checkpoint::list(&run).len(), 1);
        // A counter moved: a new checkpoint, its clock later.
        trainer.counters.cost_steps += 1;
        let second = crate::checkpoint::save(&run, &trainer, 5).unwrap();
        assert_ne!(second, first);
        let later = newest(&run);
        assert!(later.training_s > saved.training_s);
        // A resumed trainer's clock goes on from the checkpoint's.
        let resumed = Trainer::with(
            &cfg,
            &suite.tasks,
            Model::new(&cfg),
            Vec::new(),
            later.clone(),
        );
        assert!(resumed.training_s() >= later.training_s);
    }

    /// A fresh trainer with `t`'s weights, copied rather than drawn again
    /// from libtorch's generator (which the tests running beside share).
    fn twin<'a>(t: &Trainer<'a>) -> Trainer<'a> {
        let mut model = Model::new(t.cfg);
        model.policy_vs.copy(&t.model.policy_vs).unwrap();
        model.cost_vs.copy(&t.model.cost_vs).unwrap();
        Trainer::with(t.cfg, t.tasks, model, Vec::new(), Counters::default())
    }

    #[test]
    fn a_rounds_picks_depend_on_their_place_not_on_the_picks_before() {
        let dir = tempfile::tempdir().unwrap();
        let (cfg, suite) = small_data(dir.path());
        let m = cfg.train.measure_per_iteration;
        let mut whole = Trainer::new(&cfg, &suite.tasks);
        whole.counters.iteration = 3;
        let all: Vec<Pick> = (0..m).map(|j| whole.pick_plan(j)).collect();
        // Resumed after 4 of the round's measurements: the 5th onwards.
        let mut resumed = twin(&whole);
        resumed.counters.iteration = 3;
        for (j, want) in all.iter().enumerate().skip(4) {
            let got = resumed.pick_plan(j);
            assert_eq!((got.task, &got.plan), (want.task, &want.plan), "pick {j}");
        }
        // Not one pick over and over: the round covers tasks and plans.
        let tasks: std::collections::BTreeSet<usize> = all.iter().map(|p| p.task).collect();
        assert!(tasks.len() > 1, "{tasks:?}");
        let plans: std::collections::BTreeSet<&Vec<usize>> =
            all.iter().map(|p| &p.plan.assignment).collect();
        assert!(plans.len() > m / 2, "{} distinct plans of {m}", plans.len());
    }

    #[test]
    fn a_round_resumed_after_out_of_order_measurements_measures_exactly_the_picks_it_lacks() {
        let dir = tempfile::tempdir().unwrap();
        let (cfg, suite) = small_data(dir.path());
        let m = cfg.train.measure_per_iteration;
        assert!(m >= 4);
        let mut sim = benchworker::sim::SimOracle::new(cfg.sim.clone(), cfg.memory);
        let measure = |t: &mut Trainer, sim: &mut benchworker::sim::SimOracle, j: usize| {
            let pick = t.pick_plan(j);
            let task = &t.tasks[pick.task];
            let got = sim.measure(&task.tables, &pick.plan).unwrap();
            let sample = CostSample::new(task, &pick.plan, got).of_pick(pick.id);
            t.record(pick.predicted_ms, sample);
        };
        let id = |round, place| PickId { round, place };
        // Round 1's measuring alone: its learning counted as done.
        let measure_round_1 = |t: &mut Trainer, sim: &mut benchworker::sim::SimOracle| {
            t.counters.cost_steps = 2 * cfg.train.cost_steps;
            t.counters.policy_updates = 2 * cfg.train.policy_steps;
            t.iteration(sim, &mut Hooks::none()).unwrap();
        };
        let places = |t: &Trainer, round: usize| -> Vec<usize> {
            let mut p: Vec<usize> = (t.buffer.iter().filter_map(|s| s.pick))
                .filter(|p| p.round == round)
                .map(|p| p.place)
                .collect();
            p.sort_unstable();
            p
        };
        // A log from before picks were numbered (a sample's place in the
        // log stands for its pick): round 0 and the first of round 1. Then
        // pick 2 came back, and the crash came before pick 1.
        let mut trainer = Trainer::new(&cfg, &suite.tasks);
        for j in 0..m {
            measure(&mut trainer, &mut sim, j);
        }
        trainer.finish_round();
        measure(&mut trainer, &mut sim, 0);
        for s in &mut trainer.buffer {
            s.pick = None;
        }
        measure(&mut trainer, &mut sim, 2);
        assert_eq!(trainer.next_pick(&[]), 1);
        assert_eq!(
            trainer.next_pick(&[id(1, 1), id(0, 3)]),
            3,
            "picks out are taken"
        );
        measure_round_1(&mut trainer, &mut sim);
        let want: Vec<usize> = (1..m).collect();
        assert_eq!(places(&trainer, 1), want, "each missing pick once");
        // The missing pick is the one a run without the crash measured.
        let mut whole = twin(&trainer);
        whole.counters.iteration = 1;
        let pick_1 = whole.pick_plan(1);
        let got = &trainer.buffer[m + 2];
        assert_eq!(got.pick, Some(pick_1.id));
        assert_eq!(got.placed.assignment, pick_1.plan.assignment);

        // A round 0 that lost a measurement to a damaged log: round 1
        // makes up for it with a fresh pick past its places.
        let mut lost = Trainer::new(&cfg, &suite.tasks);
        for j in 0..m {
            measure(&mut lost, &mut sim, j);
        }
        lost.buffer.remove(1);
        lost.finish_round();
        measure_round_1(&mut lost, &mut sim);
        assert_eq!(lost.buffer.len(), 2 * m);
        assert_eq!(places(&lost, 1), (0..=m).collect::<Vec<_>>());
    }

    #[test]
    fn the_sampled_share_is_drawn_at_its_temperature() {
        let dir = tempfile::tempdir().unwrap();
        let (mut cfg, suite) = small_data(dir.path());
        let sampled: Vec<usize> = {
            let t = Trainer::new(&cfg, &suite.tasks);
            (0..cfg.train.measure_per_iteration)
                .filter(|&j| !t.greedy_pick(j))
                .collect()
        };
        assert!(!sampled.is_empty());
        let mut differ = Vec::new();
        for temperature in [1e-9, 1000.0] {
            cfg.train.measure_temperature = temperature;
            let mut trainer = Trainer::new(&cfg, &suite.tasks);
            let mut n = 0;
            for &j in &sampled {
                let pick = trainer.pick_plan(j);
                let mdp = &trainer.mdps[pick.task];
                let greedy =
                    actor::mdp::greedy_episode(&trainer.model.policy, &trainer.model.cost, mdp).0;
                let same = actor::mdp::numbered_by_first_use(&pick.plan.assignment)
                    == actor::mdp::numbered_by_first_use(&greedy);
                n += !same as usize;
            }
            differ.push(n);
        }
        // Cold: every sample is the greedy episode; hot: hardly any.
        assert_eq!(differ[0], 0, "{differ:?}");
        assert_eq!(differ[1], sampled.len(), "{differ:?}");
    }

    #[test]
    fn plans_over_memory_are_never_picked_for_measuring() {
        let dir = tempfile::tempdir().unwrap();
        let (cfg, suite) = small_data(dir.path());
        // A tenth more than an even share of the bytes (and room for the
        // largest table): the heuristics' plans fit.
        let mut task = suite.tasks[0].clone();
        let bytes: Vec<u64> = task
            .tables
            .iter()
            .map(|t| cfg.memory.table_bytes(t))
            .collect();
        let even = bytes.iter().sum::<u64>() as f64 / task.devices as f64;
        let largest = *bytes.iter().max().unwrap() as f64;
        task.memory_gb = (even * 1.1).max(largest + 1.0) / common::table::BYTES_PER_GB;
        let tasks = vec![task];
        let task = &tasks[0];
        // The MDP's mask keeps room for the tables to come, so the policy's
        // episodes seldom run out; these must: its rollouts see less memory
        // than the task has (half an even share), every episode runs out,
        // and its tables go to the devices with the most room, in the
        // policy's order, which overflows the task's memory too.
        let mut trainer = Trainer::new(&cfg, &tasks);
        trainer.mdps[0] =
            MdpTask::new(&task.tables, task.devices, (even * 0.5) as u64, &cfg.memory);
        let u = rollout(
            &trainer.model.policy,
            &trainer.model.cost,
            &trainer.mdps[0],
            4,
            Mode::Sample { seed: 1 },
        );
        assert!(u.infeasible.iter().all(|&x| x), "the case tests nothing");
        for round in 0..3 {
            trainer.counters.iteration = round;
            for j in 0..cfg.train.measure_per_iteration {
                let pick = trainer.pick_plan(j);
                if !trainer.greedy_pick(j) {
                    // A sample ran out: a fitting heuristic plan instead.
                    assert_eq!(
                        Some(&pick.plan),
                        trainer.fitting_heuristic_plan(task).as_ref()
                    );
                }
                let mut used = vec![0u64; task.devices];
                for (t, &d) in pick.plan.assignment.iter().enumerate() {
                    used[d] += bytes[t];
                }
                assert!(
                    used.iter().all(|&u| u <= task.cap_bytes()),
                    "a plan over memory was picked: {used:?} > {}",
                    task.cap_bytes()
                );
                assert!(pick.predicted_ms.is_finite());
            }
        }
    }

    /// The CI training runs: well under a minute each, and the policy must
    /// beat `random` clearly on unseen tasks. With `actors` = 0 the learner
    /// works alone; otherwise actor and benchworker threads join it over
    /// `inproc://`.
    fn short_run(actors: usize) {
        let dir = tempfile::tempdir().unwrap();
        let (mut cfg, train_suite) = small_data(dir.path());
        cfg.cluster.actors = actors;
        cfg.cluster.benchworkers = 2;
        // The cluster run's cost network is an ensemble: its weights travel
        // to the actors and through the checkpoint.
        cfg.model.cost_members = if actors > 0 { 2 } else { 1 };
        let test_suite = Suite::load(&dir.path().join("dlrm-20x4.test.json"), &cfg.memory).unwrap();
        let mut sim = benchworker::sim::SimOracle::new(cfg.sim.clone(), cfg.memory);
        let mut trainer = Trainer::new(&cfg, &train_suite.tasks);
        let logged = std::cell::Cell::new(0);
        let lines = std::cell::RefCell::new(Vec::new());
        let rounds = std::cell::Cell::new(0);
        let mut hooks = Hooks {
            measured: Box::new(|_| {
                logged.set(logged.get() + 1);
                Ok(())
            }),
            metrics: Box::new(|m| {
                assert_eq!(m.measurements, logged.get(), "logged before counted");
                lines.borrow_mut().push(m.clone());
                Ok(())
            }),
            round_done: Box::new(|t| {
                rounds.set(rounds.get() + 1);
                assert_eq!(t.counters.iteration, rounds.get());
                assert_eq!(t.buffer.len(), rounds.get() * 10, "a round's measurements");
                assert_eq!(t.counters.cost_steps, rounds.get() * 100);
                assert_eq!(t.counters.policy_updates, rounds.get() * 25);
                Ok(())
            }),
        };
        if actors == 0 {
            while !trainer.done() {
                trainer.iteration(&mut sim, &mut hooks).unwrap();
            }
        } else {
            let run = crate::runtime::ClusterRun::threads(actors, 2, benchworker::Backend::Sim);
            let stop = std::sync::atomic::AtomicBool::new(false);
            let (report, peers) =
                crate::runtime::train_cluster(&mut trainer, &run, &mut hooks, &stop, |_| Ok(()))
                    .unwrap();
            assert_eq!(peers.actors.len(), actors, "every actor stopped cleanly");
            assert!(peers.actors.iter().all(|a| a.unrolls > 0));
            let measured: u64 = peers.benchworkers.iter().map(|b| b.measured).sum();
            assert_eq!(measured, 40, "each plan measured once");
            assert_eq!(report.learned_from(), 100);
            assert!(report.lag_quantile(1.0) <= cfg.cluster.max_policy_lag as u64);
            let acked: u64 = peers.benchworkers.iter().map(|b| b.acked).sum();
            assert_eq!(acked, 40, "every measurement acknowledged");
            assert_eq!(report.bad_unrolls + report.drops.total(), 0);
        }
        drop(hooks);
        assert_eq!(rounds.get(), 4);
        assert_eq!(logged.get(), 40);
        let lines = lines.into_inner();
        let steps: Vec<usize> = lines.iter().map(|m| m.step).collect();
        assert_eq!(steps, (1..=100).collect::<Vec<_>>());
        assert!(lines
            .windows(2)
            .all(|w| w[1].policy_version > w[0].policy_version));
        let mut model = trainer.model;
        // The policy alone: its greedy episode, without the heuristics'
        // plans or a search on the cost network to fall back on (which
        // would beat random with untrained networks too).
        let full_plan = model.plan_cfg.clone();
        model.plan_cfg.plan_heuristics = false;
        model.plan_cfg.plan_search = 0;
        model.plan_cfg.plan_moves = 0;
        model.plan_cfg.plan_samples = 1;
        let report = crate::eval::evaluate(
            &test_suite,
            &[
                crate::baselines::Method::Random,
                crate::baselines::Method::Policy,
            ],
            &mut sim,
            &crate::eval::Setting {
                mem: &cfg.memory,
                cfg: &cfg.eval,
                batch: cfg.sim.batch,
                model: Some(&model),
                shapes: None,
            },
            || {},
        )
        .unwrap();
        let random = report.methods["random"].mean_cost_ms.unwrap();
        let policy = report.methods["policy"].mean_cost_ms.unwrap();
        eprintln!(
            "short run ({actors} actors): policy alone {policy:.3} ms, random {random:.3} ms"
        );
        assert!(
            policy < 0.9 * random,
            "policy alone {policy} ms vs random {random} ms"
        );
        model.plan_cfg = full_plan;
        // The checkpoint round-trips.
        model.save(&dir.path().join("ckpt")).unwrap();
        let back = Model::load(&cfg, &dir.path().join("ckpt")).unwrap();
        let (a, _) = model.plan(&test_suite.tasks[0], &cfg.memory);
        let (b, _) = back.plan(&test_suite.tasks[0], &cfg.memory);
        assert_eq!(a, b);
    }

    #[test]
    fn member_costs_on_plain_arrays_equal_the_batched_forward() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = small_config(dir.path());
        cfg.model.cost_members = 3;
        crate::data::generate(&cfg, dir.path()).unwrap();
        let suite = Suite::load(&dir.path().join("dlrm-20x4.test.json"), &cfg.memory).unwrap();
        tch::manual_seed(5);
        let model = Model::new(&cfg);
        let task = &suite.tasks[0];
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let plans: Vec<Plan> = (0..5)
            .map(|_| Plan {
                devices: task.devices,
                assignment: (0..task.tables.len())
                    .map(|_| rng.gen_range(0..task.devices))
                    .collect(),
            })
            .collect();
        let refs: Vec<&Plan> = plans.iter().collect();
        let features: Vec<_> = task.tables.iter().map(scaled).collect();
        let plain = model.member_costs_plain(&features, &refs);
        let batched = model.member_costs_batched(&features, &refs);
        assert_eq!(plain.len(), 5);
        for (p, b) in plain.iter().zip(&batched) {
            assert_eq!(p.len(), 3);
            for (x, y) in p.iter().zip(b) {
                assert!((x - y).abs() < 1e-4 * (1.0 + y.abs()), "{x} vs {y}");
            }
        }
        // The members differ (else the test would not tell them apart).
        assert!(plain.iter().any(|p| (p[0] - p[1]).abs() > 1e-6));
        // A plan of other tables or devices is never predicted cheap.
        let bad = [
            Plan {
                devices: task.devices,
                assignment: vec![task.devices; task.tables.len()],
            },
            Plan {
                devices: task.devices,
                assignment: vec![0; task.tables.len() + 1],
            },
        ];
        for p in model.member_costs_plain(&features, &[&bad[0], &bad[1]]) {
            assert!(p.len() == 3 && p.iter().all(|x| x.is_nan()), "{p:?}");
        }
    }

    #[test]
    fn plan_selection_moves_and_search_never_predict_worse_than_greedy() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = small_config(dir.path());
        crate::data::generate(&cfg, dir.path()).unwrap();
        let suite = Suite::load(&dir.path().join("dlrm-20x4.test.json"), &cfg.memory).unwrap();
        tch::manual_seed(3);
        let mut model = Model::new(&cfg);
        let (mut searched_lower, mut every_lower) = (0, 0);
        for task in &suite.tasks {
            // Memory for 1.5 times an even share (or the largest table): the
            // cap binds.
            let mut task = task.clone();
            let bytes: Vec<u64> = task
                .tables
                .iter()
                .map(|t| cfg.memory.table_bytes(t))
                .collect();
            let share = 1.5 * bytes.iter().sum::<u64>() as f64 / task.devices as f64;
            let cap = share.max(1.1 * *bytes.iter().max().unwrap() as f64);
            task.memory_gb *= cap / task.cap_bytes() as f64;
            let task = &task;
            model.plan_cfg.plan_samples = 1;
            model.plan_cfg.plan_moves = 0;
            model.plan_cfg.plan_search = 0;
            model.plan_cfg.plan_heuristics = false;
            let (greedy, _) = model.plan(task, &cfg.memory);
            model.plan_cfg.plan_samples = 8;
            model.plan_cfg.plan_moves = 20;
            model.plan_cfg.plan_heuristics = true;
            let (moved, _) = model.plan(task, &cfg.memory);
            model.plan_cfg.plan_search = 300;
            model.plan_cfg.plan_search_every_candidate = false;
            let (searched, infeasible) = model.plan(task, &cfg.memory);
            model.plan_cfg.plan_search_every_candidate = true;
            let (every, every_infeasible) = model.plan(task, &cfg.memory);
            assert!(!infeasible && !every_infeasible);
            assert_eq!(every, model.plan(task, &cfg.memory).0, "reproducible");
            for plan in [&moved, &searched, &every] {
                let used = plan.device_bytes(&task.tables, &cfg.memory);
                assert!(used.iter().all(|&u| u <= task.cap_bytes()));
            }
            let g = model.estimate(&task.tables, &greedy).1;
            let m = model.estimate(&task.tables, &moved).1;
            let s = model.estimate(&task.tables, &searched).1;
            assert!(m <= g + 1e-4, "moved {m} ms vs greedy {g} ms");
            assert!(s <= m + 1e-4, "searched {s} ms vs moved {m} ms");
            // Searching from every candidate includes the search from the
            // cheapest, and from each heuristic's plan.
            let e = model.estimate(&task.tables, &every).1;
            assert!(e <= s + 1e-4, "from every candidate {e} ms vs {s} ms");
            // Without moves, each candidate's search runs as soon as the
            // candidate is known: still no worse than from the cheapest.
            model.plan_cfg.plan_moves = 0;
            model.plan_cfg.plan_search_every_candidate = false;
            let cheapest = model
                .estimate(&task.tables, &model.plan(task, &cfg.memory).0)
                .1;
            model.plan_cfg.plan_search_every_candidate = true;
            let (each, each_infeasible) = model.plan(task, &cfg.memory);
            assert!(!each_infeasible);
            assert_eq!(each, model.plan(task, &cfg.memory).0, "reproducible");
            let each = model.estimate(&task.tables, &each).1;
            assert!(each <= cheapest + 1e-4, "each {each} ms vs {cheapest} ms");
            model.plan_cfg.plan_moves = 20;
            let ctx = crate::baselines::Context::for_task(task, &cfg.memory, cfg.sim.batch);
            let mut rng = ChaCha8Rng::seed_from_u64(0);
            for method in [
                crate::baselines::Method::Lookup,
                crate::baselines::Method::Torchrec,
            ] {
                if let Some(h) = crate::baselines::place(method, &ctx, &mut rng) {
                    let hc = model.estimate(&task.tables, &h).1;
                    assert!(e <= hc + 1e-4, "{e} ms vs {method:?}'s {hc} ms");
                }
            }
            every_lower += usize::from(e < s - 1e-4);
            // A search that only rebalanced devices below the bottleneck (its
            // tie-break) predicts no gain: the moved plan stays. (Judged by
            // the search's own figures, which round apart from `estimate`'s.)
            let reps = tch::no_grad(|| {
                model.cost.tables(
                    &MdpTask::new(&task.tables, task.devices, task.cap_bytes(), &cfg.memory)
                        .features,
                )
            });
            let mut net = crate::search::CostNetOracle::new(model.cost.device_heads(), &reps, 0);
            let mut predict = |p: &Plan| net.measure(&task.tables, p).unwrap().cost_ms;
            let (ps, pm) = (predict(&searched), predict(&moved));
            assert!(
                searched == moved || ps < pm - 1e-5 * pm.abs(),
                "the search changed the plan for no predicted gain ({ps} vs {pm} ms)"
            );
            searched_lower += usize::from(s < m - 1e-4);
        }
        assert!(
            searched_lower > 0,
            "the search never found a lower prediction"
        );
        assert!(
            every_lower > 0,
            "searching from every candidate never beat searching from the cheapest"
        );
    }

    #[test]
    fn a_short_training_run_in_one_thread_beats_random_on_unseen_tasks() {
        short_run(0);
    }

    #[test]
    fn a_short_training_run_with_actor_threads_beats_random_on_unseen_tasks() {
        short_run(2);
    }
}
