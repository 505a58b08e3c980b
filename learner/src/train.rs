//! Training, DreamShard's Algorithm 1 in one thread: each iteration measures
//! plans drawn from the current policy on the oracle, fits the cost network
//! to every measurement so far by MSE, then improves the policy on the
//! estimated MDP with V-trace or REINFORCE (`train.update`).
//!
//! The losses ([`model::loss`]) are the pieces the asynchronous learner
//! reuses: the cost loss over a batch of measured plans, the policy loss
//! over an actor's unroll.

use benchworker::Oracle;
use common::config::Config;
use common::{Plan, Task};
use model::adam::Adam;
use model::loss::{paired_cost_loss, policy_loss, CostSample, PickId, PolicyStats};
use model::mdp::{try_rollout, MdpTask, Mode, PlainEpisodes, Unroll};
use model::Model;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

/// One line of `metrics.jsonl`: written after every policy update.
#[derive(Debug, Clone, Default, Serialize)]
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
    /// Measurements the run had logged when this checkpoint was written:
    /// a resume over a log with fewer says that some were lost (0 in
    /// checkpoints from before it was kept).
    pub measurements: usize,
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
    /// The training tasks, then their tight-memory and reshaped copies
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
    /// Measurements that cost steps draw a fixed share of each batch from
    /// (`pretrain.found_share`), however few: pre-training's stage 1 puts
    /// the plans its search rounds found here.
    pub focus: Vec<CostSample>,
    /// Each task's samples in the three pools, for the cost loss's pair
    /// term (`train.cost_pair_weight`; indexed only when it is on).
    same_task: crate::pairs::SameTask,
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
            cost_opt: {
                let opt = Adam::new(&model.cost_vs, cfg.train.cost_lr)
                    .with_weight_decay(cfg.train.cost_weight_decay);
                // Fine-tuning decays toward the weights it starts from (a
                // resumed run's checkpoint restores its anchor).
                match (cfg.train.cost_decay_to, &cfg.train.init) {
                    (common::config::DecayTo::Init, Some(_)) => opt.anchored(),
                    _ => opt,
                }
            },
            policy_opt: Adam::new(&model.policy_vs, cfg.train.policy_lr),
            model,
            buffer,
            prior: Vec::new(),
            focus: Vec::new(),
            same_task: Default::default(),
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
    /// and reshaped copies (an unroll names its task by its index here).
    pub fn rollout_tasks(&self) -> &[Task] {
        &self.rollout_tasks
    }

    /// Whether the `j`-th plan measured in a round is the greedy pick
    /// (`train.measure_greedy_share` of them are: what `plan` returns, or the
    /// policy's greedy episode, see `train.measure_planned`) rather than a
    /// sample.
    pub fn greedy_pick(&self, j: usize) -> bool {
        j < self.greedy_picks()
    }

    /// How many of a round's measured plans are greedy picks.
    fn greedy_picks(&self) -> usize {
        self.cfg.train.greedy_picks()
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
    /// sample, for a greedy pick ([`Self::greedy_pick`]) what `plan`
    /// returns (`train.measure_planned`) or the greedy episode, and for a
    /// basin pick ([`Self::basin_pick`]) another basin of `plan`'s searches.
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
            // Not the stream `pick_task` drew the task from.
            let seed = seed ^ 0x5bd1_e995_9e37_79b9;
            let (assignment, infeasible) = if greedy {
                episodes.greedy()
            } else {
                self.other_basin(j, task, &episodes, seed).map_or_else(
                    || episodes.sampled(seed, self.cfg.train.measure_temperature),
                    |a| (a, false),
                )
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

    /// Whether the `j`-th plan measured in a round, outside the greedy
    /// share, is one of the basins `plan` ranks below its pick
    /// (`train.measure_basins_share` of that share are, the first of it)
    /// rather than a sampled episode.
    pub fn basin_pick(&self, j: usize) -> bool {
        let t = &self.cfg.train;
        let greedy = self.greedy_picks();
        let others = t.measure_per_iteration.saturating_sub(greedy);
        j >= greedy && j < greedy + (t.measure_basins_share * others as f64).round() as usize
    }

    /// For a basin pick ([`Self::basin_pick`]), one of the plans where
    /// `plan`'s searches end other than its pick (from the task's
    /// `episodes`), drawn by `seed`; none otherwise, or where every search
    /// ends in the same plan.
    fn other_basin(
        &self,
        j: usize,
        task: &Task,
        episodes: &PlainEpisodes,
        seed: u64,
    ) -> Option<Vec<usize>> {
        if !self.basin_pick(j) {
            return None;
        }
        let mut basins = self.model.basins_of(task, &self.cfg.memory, episodes);
        if basins.len() < 2 {
            return None;
        }
        let i = 1 + (seed % (basins.len() as u64 - 1)) as usize;
        Some(basins.swap_remove(i))
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
        let taken = self.taken_places(out);
        // Among the first `taken.len() + 1` places one is free.
        (0..m.max(taken.len() + 1))
            .filter(|j| !taken.contains(j))
            .collect()
    }

    /// The first `n` places of this round not measured, ascending: past
    /// the round's `measure_per_iteration` places where those do not
    /// suffice (a round making up for measurements lost from a damaged
    /// log).
    pub fn free_places(&self, n: usize) -> Vec<usize> {
        let taken = self.taken_places(&[]);
        (0..).filter(|j| !taken.contains(j)).take(n).collect()
    }

    /// This round's places measured (in the cost buffer) or in `out`.
    fn taken_places(&self, out: &[PickId]) -> std::collections::BTreeSet<usize> {
        let m = self.cfg.train.measure_per_iteration.max(1);
        let round = self.counters.iteration;
        // A sample logged before picks were numbered: its place in the log.
        let measured = self.buffer.iter().enumerate().map(|(k, s)| {
            s.pick.unwrap_or(PickId {
                round: k / m,
                place: k % m,
            })
        });
        measured
            .chain(out.iter().copied())
            .filter(|id| id.round == round)
            .map(|id| id.place)
            .collect()
    }

    /// The first of the cheap heuristics' plans for `task` that fits.
    fn fitting_heuristic_plan(&self, task: &Task) -> Option<Plan> {
        use model::baselines::Method::{Lookup, SizeLookup, Torchrec};
        let methods = [SizeLookup, Lookup, Torchrec];
        let first =
            model::baselines::plans_for(task, &self.cfg.memory, self.model.batch, &methods).next();
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
    /// and the prior measurements, and `pretrain.found_share` of it from
    /// the focus. With `train.cost_pair_weight`, half the batch is drawn
    /// so and each of those plans brings another plan of its task.
    pub fn cost_step(&mut self) {
        let t = &self.cfg.train;
        let pools = [&self.prior[..], &self.buffer[..]];
        let share = self.cfg.pretrain.found_share.unwrap_or(0.0);
        let paired = t.cost_pair_weight > 0.0;
        let size = if paired {
            t.cost_batch.div_ceil(2)
        } else {
            t.cost_batch
        };
        let mut batch = draw_batch(&mut self.rng, size, pools, &self.focus, share);
        if batch.is_empty() {
            return;
        }
        let mut pairs = Vec::new();
        if paired {
            let all = [&self.prior[..], &self.buffer[..], &self.focus[..]];
            self.same_task.update(all);
            for i in 0..batch.len() {
                if let Some(p) = self.same_task.partner(batch[i], all, &mut self.rng) {
                    pairs.push((i, batch.len()));
                    batch.push(p);
                }
            }
        }
        let loss = paired_cost_loss(
            &self.model.cost,
            &batch,
            t.cost_loss,
            &pairs,
            t.cost_pair_weight,
        );
        if self.cost_opt.backward_step(&loss) {
            self.tally.cost_loss += loss.double_value(&[]);
            self.tally.cost_n += 1;
        } else {
            self.refused_step("cost");
        }
        self.counters.cost_steps += 1;
    }

    /// Rolls out a batch of episodes on a random rollout task in this
    /// thread. An error (the policy's probabilities are not numbers) names
    /// the task; training then stops at the last checkpoint.
    pub fn rollout(&mut self) -> anyhow::Result<(usize, Unroll)> {
        let k = self.rng.gen_range(0..self.mdps.len());
        let u = try_rollout(
            &self.model.policy,
            &self.model.cost,
            &self.mdps[k],
            self.cfg.train.episodes,
            Mode::Sample {
                seed: self.rng.gen(),
            },
        )
        .map_err(|e| anyhow::anyhow!("rolling out task `{}`: {e}", self.rollout_tasks[k].name))?;
        Ok((k, u))
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
            measurements: self.buffer.len(),
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
            let (k, u) = self.rollout()?;
            let line = self.policy_update(k, &u, 0);
            (hooks.metrics)(&line)?;
        }
        self.finish_round();
        (hooks.round_done)(self)
    }
}

/// A cost batch of `size` (fewer when fewer samples exist): each draw
/// comes from `focus` with probability `share` (always where `pools` are
/// empty), otherwise uniformly from all of `pools` together. Without a
/// focus no draw is spent on the choice, so a run's random stream is as
/// it was before the focus existed.
fn draw_batch<'s>(
    rng: &mut ChaCha8Rng,
    size: usize,
    pools: [&'s [CostSample]; 2],
    focus: &'s [CostSample],
    share: f64,
) -> Vec<&'s CostSample> {
    let [a, b] = pools;
    let n = a.len() + b.len();
    let share = match (focus.len(), n) {
        (0, _) => 0.0,
        (_, 0) => 1.0,
        _ => share,
    };
    (0..size.min(n + focus.len()))
        .map(|_| {
            if share > 0.0 && rng.gen_bool(share) {
                return &focus[rng.gen_range(0..focus.len())];
            }
            match rng.gen_range(0..n) {
                k if k < a.len() => &a[k],
                k => &b[k - a.len()],
            }
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use common::Suite;
    use model::loss::{penalized, scaled_rewards};
    use model::mdp::{numbered_by_first_use, rollout};
    use std::path::Path;
    use tch::{Kind, Tensor};

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

    /// Samples whose measured cost tells them apart.
    fn samples(costs: std::ops::Range<usize>) -> Vec<CostSample> {
        costs
            .map(|c| CostSample {
                placed: model::nets::PlacedTables {
                    features: Vec::new(),
                    assignment: Vec::new(),
                    devices: 1,
                },
                measurement: common::Measurement {
                    cost_ms: c as f64,
                    devices: Vec::new(),
                },
                pick: None,
            })
            .collect()
    }

    #[test]
    fn a_focus_gets_its_share_of_each_batch_however_few_it_holds() {
        let (prior, buffer, focus) = (samples(0..1000), samples(1000..1010), samples(5000..5003));
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let mut from_focus = 0;
        for _ in 0..200 {
            let b = draw_batch(&mut rng, 64, [&prior, &buffer], &focus, 0.25);
            assert_eq!(b.len(), 64);
            from_focus += b.iter().filter(|s| s.measurement.cost_ms >= 5000.0).count();
        }
        let share = from_focus as f64 / (200.0 * 64.0);
        assert!((share - 0.25).abs() < 0.02, "{share}");
        // Only a focus: every draw is from it, the batch no larger than all.
        let b = draw_batch(&mut rng, 64, [&[], &[]], &focus, 0.25);
        assert_eq!(b.len(), 3);
        assert!(b.iter().all(|s| s.measurement.cost_ms >= 5000.0));
    }

    #[test]
    fn without_a_focus_batches_draw_as_before_it_existed() {
        let (prior, buffer) = (samples(0..100), samples(100..110));
        let mut a = ChaCha8Rng::seed_from_u64(9);
        let mut b = a.clone();
        let got: Vec<f64> = draw_batch(&mut a, 64, [&prior, &buffer], &[], 0.5)
            .iter()
            .map(|s| s.measurement.cost_ms)
            .collect();
        // The draw of old: one index over the prior, then the buffer.
        let want: Vec<f64> = (0..64).map(|_| b.gen_range(0..110usize) as f64).collect();
        assert_eq!(got, want);
        assert!(draw_batch(&mut a, 64, [&[], &[]], &[], 0.5).is_empty());
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
        let (k, mut u) = trainer.rollout().unwrap();
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
        let (k, u) = trainer.rollout().unwrap();
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
    fn a_policy_whose_logits_are_not_numbers_stops_training_with_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let (cfg, suite) = small_data(dir.path());
        let mut trainer = Trainer::new(&cfg, &suite.tasks);
        tch::no_grad(|| {
            for mut v in trainer.model.policy_vs.trainable_variables() {
                let _ = v.fill_(f64::NAN);
            }
        });
        let Err(e) = trainer.rollout() else {
            panic!("NaN logits are an error")
        };
        assert!(e.to_string().starts_with("rolling out task `"), "{e}");
        let mut sim = benchworker::sim::SimOracle::new(cfg.sim.clone(), cfg.memory);
        assert!(trainer.iteration(&mut sim, &mut Hooks::none()).is_err());
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
            let (k, u) = trainer.rollout().unwrap();
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
                    model::mdp::greedy_episode(&trainer.model.policy, &trainer.model.cost, &mdp).0;
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
        // A counter moved: a new checkpoint, its clock later; the folders
        // of writes a kill cut short are gone with it.
        let torn = run.join("checkpoints").join("step-000000.7.tmp");
        std::fs::create_dir_all(&torn).unwrap();
        trainer.counters.cost_steps += 1;
        let second = crate::checkpoint::save(&run, &trainer, 5).unwrap();
        assert_ne!(second, first);
        assert!(!torn.exists(), "a half-written checkpoint left behind");
        // It counts the measurements logged, for a resume to compare.
        assert_eq!(newest(&run).measurements, trainer.buffer.len());
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
        // What a cluster round hands out: the places not measured.
        assert_eq!(trainer.free_places(3), [1, 3, 4]);
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
        assert_eq!(lost.free_places(m + 1), (0..=m).collect::<Vec<_>>());
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
                    model::mdp::greedy_episode(&trainer.model.policy, &trainer.model.cost, mdp).0;
                let same = model::mdp::numbered_by_first_use(&pick.plan.assignment)
                    == model::mdp::numbered_by_first_use(&greedy);
                n += !same as usize;
            }
            differ.push(n);
        }
        // Cold: every sample is the greedy episode; hot: hardly any.
        assert_eq!(differ[0], 0, "{differ:?}");
        assert_eq!(differ[1], sampled.len(), "{differ:?}");
    }

    #[test]
    fn the_basins_share_measures_the_basins_plan_ranks_below_its_pick() {
        let dir = tempfile::tempdir().unwrap();
        let (mut cfg, suite) = small_data(dir.path());
        cfg.model.plan_search = 300;
        cfg.train.measure_per_iteration = 10;
        cfg.train.measure_basins_share = 0.4;
        // Weights from their own seed: the searches' ends must not change
        // with the tests running beside (libtorch's generator is shared).
        let model = Model::seeded(&cfg, cfg.train.seed);
        let mut trainer = Trainer::with(&cfg, &suite.tasks, model, Vec::new(), Counters::default());
        let explored: Vec<usize> = (0..10).filter(|&j| !trainer.greedy_pick(j)).collect();
        // Two of the five picks outside the greedy share.
        let basin_picks: Vec<usize> = (0..10).filter(|&j| trainer.basin_pick(j)).collect();
        assert_eq!(basin_picks, explored[..2]);
        for (share, picks) in [(0.0, 0), (1.0, explored.len())] {
            let mut cfg = cfg.clone();
            cfg.train.measure_basins_share = share;
            let t = Trainer::new(&cfg, &suite.tasks);
            assert_eq!((0..10).filter(|&j| t.basin_pick(j)).count(), picks);
        }
        let (mut other_basins, mut samples) = (0, 0);
        for round in 0..4 {
            trainer.counters.iteration = round;
            for &j in &explored {
                let pick = trainer.pick_plan(j);
                let task = &suite.tasks[pick.task];
                let basins = trainer.model.basins(task, &cfg.memory);
                if !trainer.basin_pick(j) {
                    // A sampled episode, nearly uniform: no search's end.
                    assert!(!basins.contains(&pick.plan.assignment));
                    samples += 1;
                } else if basins.len() > 1 {
                    // Never `plan`'s own pick, always where a search ended.
                    assert!(basins[1..].contains(&pick.plan.assignment));
                    other_basins += 1;
                }
            }
        }
        assert!(other_basins > 0, "every search ended in the same plan");
        assert_eq!(samples, 12);
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
                model::baselines::Method::Random,
                model::baselines::Method::Policy,
            ],
            &mut sim,
            &crate::eval::Setting {
                mem: &cfg.memory,
                cfg: &cfg.eval,
                batch: cfg.sim.batch,
                runs: &[model::guard::Trained::alone(&model, None)],
                verify: false,
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
    fn a_short_training_run_in_one_thread_beats_random_on_unseen_tasks() {
        short_run(0);
    }

    #[test]
    fn a_short_training_run_with_actor_threads_beats_random_on_unseen_tasks() {
        short_run(2);
    }
}
