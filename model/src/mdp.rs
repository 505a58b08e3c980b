//! The estimated MDP (DESIGN §4): placing a task's tables one per step, with
//! the devices' features and the final reward predicted by the cost
//! network instead of measured. `E` episodes of one task run in lockstep, so
//! each step is one batched forward of the policy.
//!
//! A step is cheap: table representations (of both networks) are computed
//! once per episode batch; a device's representation is a running sum, and
//! the cost network's heads cost each device as it is and with the table
//! being placed added (one batched call). The policy reads, per device,
//! those costs and what the placement would add to the iteration cost
//! ([`device_features`]). Tables are placed in descending order of their
//! predicted single-table cost (DreamShard's order). A device is a legal
//! action while the table fits its memory and leaves room for the tables
//! still to come ([`legal_devices`]); an episode whose table fits no device
//! is marked infeasible and continues on the device with the most free
//! memory.
//!
//! The same code serves training rollouts (sampled actions) and `plan`
//! (greedy actions).

use common::features::scaled;
use common::{MemoryModel, Table, NUM_FEATURES};
use tch::{Device, Kind, Tensor};

use crate::nets::{add_into, masked_log_softmax, CostNet, PolicyNet, DEVICE_FEATURES};

/// A task as the MDP sees it.
#[derive(Debug)]
pub struct MdpTask {
    /// `[M, 21]` scaled features.
    pub features: Tensor,
    /// Device memory each table takes.
    pub bytes: Vec<u64>,
    pub cap_bytes: u64,
    pub devices: usize,
}

impl MdpTask {
    pub fn new(tables: &[Table], devices: usize, cap_bytes: u64, mem: &MemoryModel) -> MdpTask {
        let flat: Vec<f32> = tables.iter().flat_map(scaled).collect();
        MdpTask {
            features: Tensor::from_slice(&flat).view([tables.len() as i64, NUM_FEATURES as i64]),
            bytes: tables.iter().map(|t| mem.table_bytes(t)).collect(),
            cap_bytes,
            devices,
        }
    }

    pub fn tables(&self) -> usize {
        self.bytes.len()
    }
}

/// How actions are chosen.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Mode {
    /// Sample from the policy (training), by the Gumbel-max trick with
    /// noise from a ChaCha RNG seeded by `seed`: the same seed and weights
    /// give the same episodes, whatever other threads draw (libtorch's
    /// global RNG is shared by every thread of the process).
    Sample { seed: u64 },
    /// The most probable legal device, in one batched call (`plan` and
    /// training's measured picks use [`PlainEpisodes`], which chooses
    /// alike).
    Greedy,
    /// Episode 0 greedy, the others sampled at `temperature` with Gumbel
    /// noise seeded by `seed`: reproducible candidates in one batched call
    /// (`plan`'s own are [`PlainEpisodes::sampled`], with another noise
    /// stream and the same distribution).
    GreedyAndSamples { seed: u64, temperature: f64 },
}

/// `E` episodes of one task, time-major over the `M` steps.
#[derive(Debug)]
pub struct Unroll {
    /// Table placed at each step (DreamShard's order).
    pub order: Vec<usize>,
    /// `[M, E]` int64: the device chosen at each step.
    pub actions: Tensor,
    /// `[M, E]`: log-probability of that choice under the acting policy.
    pub behaviour_logp: Tensor,
    /// `[M, E, D]` bool: the legal devices at each step.
    pub masks: Tensor,
    /// `[M, E, D, DEVICE_FEATURES]`: the device features the policy saw.
    pub device_features: Tensor,
    /// `[E]`: the predicted iteration cost of each finished placement (ms).
    pub predicted_cost_ms: Tensor,
    /// What rewards are divided by: the task's [`balanced_cost`], the cost
    /// of a perfectly balanced placement without fusion. It makes tasks of
    /// different sizes comparable.
    pub reward_scale: f64,
    /// Episodes that ran out of memory somewhere.
    pub infeasible: Vec<bool>,
    /// Each episode's plan, indexed by table (not by step).
    pub plans: Vec<Vec<usize>>,
}

fn opts() -> (Kind, Device) {
    (Kind::Float, Device::Cpu)
}

/// Each table's predicted cost alone on one of a task's devices (ms), from
/// the cost network's `[M, width]` table representations and the task's
/// context ([`CostNet::context`]).
pub fn single_table_costs(cost: &CostNet, repr: &Tensor, ctx: &Tensor) -> Vec<f32> {
    let m = repr.size()[0];
    let single = tch::no_grad(|| {
        cost.overall_cost(repr, &Tensor::arange(m, (Kind::Int64, Device::Cpu)), m, ctx)
    });
    crate::tensor_vec(&single)
}

/// The cost of a perfectly balanced placement without fusion: the
/// predicted single-table costs summed and divided by the device count (at
/// least a microsecond). Rewards and the policy's device features are in
/// this unit, which makes tasks of different sizes comparable. The costs
/// count by their size: a network not yet trained may predict some below
/// zero, and its features should still be of order one.
pub fn balanced_cost(single: &[f32], devices: usize) -> f64 {
    (single.iter().map(|&c| c.abs() as f64).sum::<f64>() / devices.max(1) as f64).max(1e-3)
}

/// The largest value, where it is, and the second largest (`-inf` where
/// there are fewer).
fn top_two(values: impl Iterator<Item = f32>) -> (f32, usize, f32) {
    let (mut first, mut at, mut second) = (f32::NEG_INFINITY, usize::MAX, f32::NEG_INFINITY);
    for (i, x) in values.enumerate() {
        if x > first {
            (second, first, at) = (first, x, i);
        } else if x > second {
            second = x;
        }
    }
    (first, at, second)
}

/// Where [`device_features`] puts what placing the table on the device
/// adds to the iteration cost.
pub const ADDED_ITERATION_COST: i64 = 6;

/// The policy's view of one episode's `D` devices as it places a table of
/// `need` bytes, [`DEVICE_FEATURES`] values per device appended to `out`:
/// the device's predicted (fwd, bwd, comm) now (`now`, zero while empty),
/// what placing the table there adds to each (`with`: its costs with the
/// table), what it adds to the iteration cost (`max_d fwd + max_d (bwd +
/// 2·comm)`, the composition of [`crate::nets::compose`], over the devices
/// as they are but for this one), all over `scale` (the task's
/// [`balanced_cost`]), and the share of its memory the device would have
/// left (negative where the table does not fit; `cap` bytes each).
pub fn device_features(
    now: &[[f32; 3]],
    with: &[[f32; 3]],
    used: &[u64],
    need: u64,
    cap: u64,
    scale: f64,
    out: &mut Vec<f32>,
) {
    let rest = |c: &[f32; 3]| c[1] + 2.0 * c[2];
    let (f1, f_at, f2) = top_two(now.iter().map(|c| c[0]));
    let (r1, r_at, r2) = top_two(now.iter().map(rest));
    let iteration = f1 + r1;
    let inv = (1.0 / scale) as f32;
    for (d, (n, w)) in now.iter().zip(with).enumerate() {
        let others_f = if d == f_at { f2 } else { f1 };
        let others_r = if d == r_at { r2 } else { r1 };
        let placed = w[0].max(others_f) + rest(w).max(others_r);
        let free = (cap as f64 - used[d] as f64 - need as f64) / cap.max(1) as f64;
        out.extend_from_slice(&[
            n[0] * inv,
            n[1] * inv,
            n[2] * inv,
            (w[0] - n[0]) * inv,
            (w[1] - n[1]) * inv,
            (w[2] - n[2]) * inv,
            (placed - iteration) * inv,
            free.clamp(-1.0, 1.0) as f32,
        ]);
    }
}

/// The tables still to place after the current one, by their memory: what
/// [`legal_devices`] must leave room for. Starts with every table of a
/// task; [`Remaining::take`] removes the one being placed.
#[derive(Debug, Clone)]
pub struct Remaining {
    /// Bytes, descending.
    bytes: Vec<u64>,
    total: u128,
}

impl Remaining {
    pub fn new(bytes: &[u64]) -> Remaining {
        let mut sorted = bytes.to_vec();
        sorted.sort_unstable_by(|a, b| b.cmp(a));
        Remaining {
            total: sorted.iter().map(|&b| b as u128).sum(),
            bytes: sorted,
        }
    }

    /// Takes out a table of `need` bytes (the one being placed).
    pub fn take(&mut self, need: u64) {
        // Descending: the first position whose bytes are not above `need`.
        let at = self.bytes.partition_point(|&b| b > need);
        if self.bytes.get(at) == Some(&need) {
            self.bytes.remove(at);
            self.total -= need as u128;
        }
    }
}

/// Buffers [`legal_devices`] reuses from step to step.
#[derive(Debug, Clone, Default)]
pub struct MaskScratch {
    free: Vec<u64>,
    fits: Vec<bool>,
}

/// Marks in `legal` the devices (of `used` bytes each, `cap` bytes of
/// memory) that can take a table of `need` bytes so that the tables still
/// to come (`rest`) fit too, packed best-fit in descending order of size.
/// Where no device allows that, every device the table fits is legal;
/// where it fits none, only the roomiest device, and the result is `true`:
/// the episode ran out of memory. At each step, then, a placement avoids a
/// dead end that best-fit packing sees; tables are placed in cost order,
/// not by size, so a later step may still find no device that leaves such
/// room, and from there the episode may run out.
///
/// Cheap where memory is loose: when the free memory left after the table,
/// summed over the devices, is at least what is to come plus `D − 1` times
/// its largest table, any packing of the rest fits (a table that fits no
/// device would leave under its size free on each), and no packing is run;
/// nor where the largest table to come fits no device after any
/// placement (no packing can succeed).
pub fn legal_devices(
    used: &[u64],
    cap: u64,
    need: u64,
    rest: &Remaining,
    legal: &mut [bool],
    scratch: &mut MaskScratch,
) -> bool {
    if used.is_empty() {
        return true;
    }
    let mut any = false;
    for (l, &u) in legal.iter_mut().zip(used) {
        *l = cap.saturating_sub(u) >= need;
        any |= *l;
    }
    if !any {
        let roomiest = (0..used.len()).min_by_key(|&x| used[x]).unwrap_or(0);
        legal[roomiest] = true;
        return true;
    }
    let largest = rest.bytes.first().copied().unwrap_or(0);
    let room = |u: u64| cap.saturating_sub(u);
    let free_after = used.iter().map(|&u| room(u) as u128).sum::<u128>() - need as u128;
    let room_needed = rest.total + (used.len() as u128 - 1) * largest as u128;
    if largest == 0 || free_after >= room_needed {
        return false;
    }
    // Room only shrinks: a table to come that no device has room for now
    // fits nowhere after any placement.
    if used.iter().all(|&u| room(u) < largest) {
        return false;
    }
    let MaskScratch { free, fits } = scratch;
    fits.clear();
    fits.extend_from_slice(legal);
    let mut some = false;
    // The free memory less what is to come: packing a table takes its
    // bytes from both, so this slack stays as it is while the packing
    // goes on. Once `D − 1` times the next table is within it, the rest
    // fits whatever the packing (the cheap path's argument above): the
    // packing stops there, with the answer it would have reached. Only
    // the few tables larger than that are packed, which keeps a step of a
    // large task on tight memory from growing with the tables to come.
    let others = used.len() as u128 - 1;
    let slack = free_after as i128 - rest.total as i128;
    // Descending: the tables to pack are a prefix.
    let big = match u128::try_from(slack) {
        Ok(slack) => rest.bytes.partition_point(|&b| others * b as u128 > slack),
        Err(_) => rest.bytes.len(),
    };
    for d in (0..used.len()).filter(|&d| fits[d]) {
        free.clear();
        free.extend(used.iter().map(|&u| room(u)));
        free[d] -= need;
        legal[d] = slack >= 0
            && rest.bytes[..big].iter().all(|&b| {
                // Best fit: the device with the least room that still takes it.
                let best = (0..free.len())
                    .filter(|&x| free[x] >= b)
                    .min_by_key(|&x| free[x]);
                best.map(|x| free[x] -= b).is_some()
            });
        some |= legal[d];
    }
    if !some {
        legal.copy_from_slice(fits);
    }
    false
}

/// DreamShard's order: tables by predicted single-table cost, descending.
pub fn placement_order(single: &[f32]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..single.len()).collect();
    order.sort_by(|&a, &b| single[b].total_cmp(&single[a]).then(a.cmp(&b)));
    order
}

impl Unroll {
    /// `[E]` rewards of the episodes' last steps: minus the predicted cost
    /// over [`Unroll::reward_scale`].
    pub fn final_rewards(&self) -> Tensor {
        -(&self.predicted_cost_ms / self.reward_scale)
    }
}

/// Rolls out `episodes` placements of `task` in lockstep (no gradients:
/// the learner replays the unroll with its own parameters).
///
/// Panics where [`try_rollout`] returns an error: for callers whose tasks
/// and weights are their own (checked where they were made).
pub fn rollout(
    policy: &PolicyNet,
    cost: &CostNet,
    task: &MdpTask,
    episodes: usize,
    mode: Mode,
) -> Unroll {
    try_rollout(policy, cost, task, episodes, mode).unwrap_or_else(|e| panic!("rollout: {e}"))
}

fn seeded(seed: u64) -> rand_chacha::ChaCha8Rng {
    <rand_chacha::ChaCha8Rng as rand::SeedableRng>::seed_from_u64(seed)
}

/// The Gumbel-max trick: for log-probabilities `logp` (`[E, D]`, `-inf`
/// where illegal), `argmax(logp + T·g)` with `g` standard Gumbel noise picks
/// device `d` with probability `softmax(logp / T)_d` (at `T = 1`, the
/// policy's own). The first `greedy` rows get no noise: their argmax.
fn gumbel_argmax(
    logp: &Tensor,
    rng: &mut rand_chacha::ChaCha8Rng,
    temperature: f64,
    greedy: usize,
) -> Tensor {
    let (rows, cols) = (logp.size()[0], logp.size()[1]);
    let noise: Vec<f32> = (0..rows * cols)
        .map(|i| {
            if i < greedy as i64 * cols {
                0.0
            } else {
                let u: f64 = rand::Rng::gen_range(rng, 1e-12..1.0);
                (-(-u.ln()).ln() * temperature) as f32
            }
        })
        .collect();
    let noise = Tensor::from_slice(&noise).view([rows, cols]);
    (logp + noise.to_kind(logp.kind())).argmax(1, false)
}

/// Why a rollout could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RolloutError {
    #[error("nothing to roll out: {tables} tables on {devices} devices, {episodes} episodes")]
    Empty {
        tables: usize,
        devices: usize,
        episodes: usize,
    },
    #[error("features of shape {shape:?} for {tables} tables")]
    FeatureShape { shape: Vec<i64>, tables: usize },
    /// The policy's logits overflowed (weights too large).
    #[error("sampling step {step}: the policy's probabilities are not numbers")]
    NotNumbers { step: usize },
    /// A libtorch call failed.
    #[error("{what}: {message}")]
    Torch { what: String, message: String },
}

/// [`rollout`], with an error instead of a panic for an empty task (no
/// table, no device, no episode) and, when sampling, for probabilities that
/// are not numbers (weights so large that the policy's logits overflow).
pub fn try_rollout(
    policy: &PolicyNet,
    cost: &CostNet,
    task: &MdpTask,
    episodes: usize,
    mode: Mode,
) -> Result<Unroll, RolloutError> {
    check_rollout(task, episodes)?;
    let _guard = tch::no_grad_guard();
    let (m, e, d) = (task.tables(), episodes as i64, task.devices as i64);
    let cost_repr = cost.tables(&task.features);
    let ctx = cost.context(&cost_repr, task.devices);
    let single = single_table_costs(cost, &cost_repr, &ctx);
    let order = placement_order(&single);
    let reward_scale = balanced_cost(&single, task.devices);
    let pol_repr = policy.tables(&task.features);
    let (pw, cw) = (pol_repr.size()[1], cost_repr.size()[1]);
    let mut dev_pol = Tensor::zeros([e, d, pw], opts());
    let mut dev_cost = Tensor::zeros([e, d, cw], opts());
    // Each device's predicted (fwd, bwd, comm): zero while empty
    // (DreamShard's q_0).
    let mut now = vec![[0.0f32; 3]; episodes * task.devices];
    let mut used = vec![vec![0u64; task.devices]; episodes];
    let mut infeasible = vec![false; episodes];
    let mut plans = vec![vec![0usize; m]; episodes];
    let rows = Tensor::arange(e, (Kind::Int64, Device::Cpu));
    let (mut gumbel, temperature, greedy) = noise(mode);
    let sampling = matches!(mode, Mode::Sample { .. });
    let (mut actions, mut logps, mut masks, mut feats) = (
        Vec::with_capacity(m),
        Vec::with_capacity(m),
        Vec::with_capacity(m),
        Vec::with_capacity(m),
    );
    let (mut rest, mut scratch) = (Remaining::new(&task.bytes), MaskScratch::default());
    for (step, &table) in order.iter().enumerate() {
        let need = task.bytes[table];
        rest.take(need);
        let mut mask = vec![false; episodes * task.devices];
        for (k, u) in used.iter().enumerate() {
            let legal = &mut mask[k * task.devices..(k + 1) * task.devices];
            infeasible[k] |= legal_devices(u, task.cap_bytes, need, &rest, legal, &mut scratch);
        }
        let mask_t = Tensor::from_slice(&mask).view([e, d]);
        let current = pol_repr
            .get(table as i64)
            .unsqueeze(0)
            .expand([e, pw], false);
        // Every device's costs with the table added, in one call.
        let table_cost = cost_repr.get(table as i64);
        let with =
            costs_with(cost, &dev_cost, &table_cost, &ctx).map_err(|err| RolloutError::Torch {
                what: format!("step {step}: the cost network's device costs"),
                message: err.to_string(),
            })?;
        let mut features = Vec::with_capacity(episodes * task.devices * DEVICE_FEATURES as usize);
        for (k, u) in used.iter().enumerate() {
            let span = k * task.devices..(k + 1) * task.devices;
            device_features(
                &now[span.clone()],
                &with[span],
                u,
                need,
                task.cap_bytes,
                reward_scale,
                &mut features,
            );
        }
        let features = Tensor::from_slice(&features).view([e, d, DEVICE_FEATURES]);
        let progress = Tensor::full([e], step as f64 / m as f64, opts());
        let out = policy.forward(&dev_pol, &features, &current, &progress);
        let logp = masked_log_softmax(&out.logits, &mask_t);
        // Training samples need numbers; `plan`'s candidates keep going
        // (their plans are checked against memory and costed afterwards).
        if sampling && logp.isnan().any().int64_value(&[]) != 0 {
            return Err(RolloutError::NotNumbers { step });
        }
        let action = match gumbel.as_mut() {
            None => logp.argmax(1, false),
            Some(rng) => gumbel_argmax(&logp, rng, temperature, greedy),
        };
        let chosen_logp = logp.gather(1, &action.unsqueeze(1), false).squeeze_dim(1);
        feats.push(features);
        masks.push(mask_t);
        logps.push(chosen_logp);
        let acts: Vec<i64> = crate::tensor_vec(&action);
        for (k, &a) in acts.iter().enumerate() {
            let a = a as usize;
            used[k][a] = used[k][a].saturating_add(need);
            plans[k][table] = a;
            now[k * task.devices + a] = with[k * task.devices + a];
        }
        // Running sums of the device that changed.
        let at = [Some(rows.shallow_clone()), Some(action.shallow_clone())];
        let _ = dev_pol.index_put_(&at, &current, true);
        let _ = dev_cost.index_put_(&at, &table_cost.expand([e, cw], false), true);
        actions.push(action);
    }
    let plan_of_device = rows.repeat_interleave_self_int(d, 0, None);
    let predicted = cost.overall_cost(&dev_cost.view([e * d, cw]), &plan_of_device, e, &ctx);
    let stack = |what: &str, parts: &[Tensor]| {
        Tensor::f_stack(parts, 0).map_err(|e| RolloutError::Torch {
            what: format!("stacking the unroll's {what}"),
            message: e.to_string(),
        })
    };
    Ok(Unroll {
        order,
        actions: stack("actions", &actions)?,
        behaviour_logp: stack("log-probabilities", &logps)?,
        masks: stack("masks", &masks)?,
        device_features: stack("device features", &feats)?,
        predicted_cost_ms: predicted,
        reward_scale,
        infeasible,
        plans,
    })
}

/// A mode's Gumbel noise: its generator (none for greedy episodes), its
/// temperature, and how many first episodes take none.
fn noise(mode: Mode) -> (Option<rand_chacha::ChaCha8Rng>, f64, usize) {
    match mode {
        Mode::Sample { seed } => (Some(seeded(seed)), 1.0, 0),
        Mode::GreedyAndSamples { seed, temperature } => (Some(seeded(seed)), temperature, 1),
        Mode::Greedy => (None, 0.0, 0),
    }
}

/// What a rollout needs: a table, a device, an episode, and one row of
/// features per table.
fn check_rollout(task: &MdpTask, episodes: usize) -> Result<(), RolloutError> {
    if task.tables() == 0 || task.devices == 0 || episodes == 0 {
        return Err(RolloutError::Empty {
            tables: task.tables(),
            devices: task.devices,
            episodes,
        });
    }
    if task.features.size() != [task.tables() as i64, NUM_FEATURES as i64] {
        return Err(RolloutError::FeatureShape {
            shape: task.features.size(),
            tables: task.tables(),
        });
    }
    Ok(())
}

/// Every device's predicted (fwd, bwd, comm) with the table whose cost
/// representation is `table_cost` added, for each episode's devices
/// (`dev_cost`: `[E, D, width]`; the task's context `ctx`), in one call:
/// `[E·D]` in order.
fn costs_with(
    cost: &CostNet,
    dev_cost: &Tensor,
    table_cost: &Tensor,
    ctx: &Tensor,
) -> Result<Vec<[f32; 3]>, tch::TchError> {
    let [e, d, cw] = dev_cost.size()[..] else {
        unreachable!("device representations are [E, D, width]")
    };
    let with: Vec<f32> = Vec::try_from(
        cost.device_costs(
            &(dev_cost + table_cost.view([1, 1, cw])).view([e * d, cw]),
            ctx,
        )
        .view([-1]),
    )?;
    Ok(with.chunks_exact(3).map(|c| [c[0], c[1], c[2]]).collect())
}

/// One greedy episode of `task` (what [`rollout`] with [`Mode::Greedy`]
/// and one episode places, up to float rounding and the numbering of
/// devices: empty devices tie, and this takes the first) without a libtorch call per
/// step: both networks' table representations once, then plain arrays (see
/// [`crate::nets::PolicyScorer`] and [`crate::nets::DeviceHeads`]). This is
/// `plan`'s episode; a 100-table, 8-device one takes a fraction of a
/// millisecond instead of several. Returns the plan (device per table) and
/// whether memory ran out somewhere.
pub fn greedy_episode(policy: &PolicyNet, cost: &CostNet, task: &MdpTask) -> (Vec<usize>, bool) {
    PlainEpisodes::new(policy, cost, task).greedy()
}

/// A task made ready for episodes on plain arrays: both networks' table
/// representations, the placement order and the reward scale, computed
/// once through libtorch; then each episode ([`PlainEpisodes::greedy`],
/// [`PlainEpisodes::sampled`]) runs without a libtorch call, and several
/// may run at once on different threads.
#[derive(Debug, Clone)]
pub struct PlainEpisodes {
    order: Vec<usize>,
    scale: f64,
    bytes: Vec<u64>,
    cap: u64,
    devices: usize,
    pol_repr: Vec<Vec<f32>>,
    /// `[tables × projected width]`: the cost heads' projections of the
    /// tables' representations ([`crate::nets::DeviceHeads::project_rows`]).
    cost_proj: Vec<f32>,
    scorer: crate::nets::PolicyScorer,
    heads: crate::nets::DeviceHeads,
}

impl PlainEpisodes {
    pub fn new(policy: &PolicyNet, cost: &CostNet, task: &MdpTask) -> PlainEpisodes {
        let _guard = tch::no_grad_guard();
        let cost_repr = cost.tables(&task.features);
        let ctx = cost.context(&cost_repr, task.devices);
        let single = single_table_costs(cost, &cost_repr, &ctx);
        let rows = |t: &Tensor| -> Vec<Vec<f32>> {
            let width = t.size()[1] as usize;
            crate::tensor_vec::<f32>(&t.to_kind(Kind::Float))
                .chunks_exact(width.max(1))
                .map(<[f32]>::to_vec)
                .collect()
        };
        let heads = cost.device_heads(&cost_repr, task.devices);
        let flat = crate::tensor_vec::<f32>(&cost_repr.to_kind(Kind::Float));
        PlainEpisodes {
            order: placement_order(&single),
            scale: balanced_cost(&single, task.devices),
            bytes: task.bytes.clone(),
            cap: task.cap_bytes,
            devices: task.devices,
            pol_repr: rows(&policy.tables(&task.features)),
            cost_proj: heads.project_rows(&flat),
            scorer: policy.scorer(),
            heads,
        }
    }

    /// The cost network's per-device heads, copied out of libtorch.
    pub fn heads(&self) -> &crate::nets::DeviceHeads {
        &self.heads
    }

    /// The tables' projections by the heads (`[tables × projected
    /// width]`), for a search on the same network
    /// ([`crate::search::CostNetOracle::from_projected`]).
    pub fn cost_projections(&self) -> &[f32] {
        &self.cost_proj
    }

    /// The greedy episode: the first legal device of highest logit at each
    /// step. The plan (device per table) and whether memory ran out.
    pub fn greedy(&self) -> (Vec<usize>, bool) {
        self.run(None)
    }

    /// An episode sampled at `temperature` (1: the policy's own
    /// probabilities; towards 0, the greedy episode) by the Gumbel-max
    /// trick, with noise seeded by `seed`: the same seed, the same plan.
    pub fn sampled(&self, seed: u64, temperature: f64) -> (Vec<usize>, bool) {
        self.run(Some((seeded(seed), temperature as f32)))
    }

    fn run(&self, mut noise: Option<(rand_chacha::ChaCha8Rng, f32)>) -> (Vec<usize>, bool) {
        let (scorer, heads, devices) = (&self.scorer, &self.heads, self.devices);
        let h = scorer.hidden();
        // Per device: the policy's summed table part, the cost heads' summed
        // projections, and the predicted costs (zero while empty).
        let mut dev_tables = vec![vec![0.0f32; h]; devices];
        let mut dev_heads = vec![vec![0.0f32; heads.projected_width()]; devices];
        let mut now = vec![[0.0f32; 3]; devices];
        let (mut with, mut features, mut sum) = (Vec::new(), Vec::new(), Vec::new());
        let (mut scratch, mut state) = ([Vec::new(), Vec::new()], Vec::new());
        let mut used = vec![0u64; devices];
        let mut plan = vec![0usize; self.bytes.len()];
        let mut infeasible = false;
        let (mut rest, mut mask, mut legal) = (
            Remaining::new(&self.bytes),
            MaskScratch::default(),
            vec![false; devices],
        );
        for &table in &self.order {
            let need = self.bytes[table];
            rest.take(need);
            infeasible |= legal_devices(&used, self.cap, need, &rest, &mut legal, &mut mask);
            let current = scorer.project_current(&self.pol_repr[table]);
            let w = heads.projected_width();
            let projected = &self.cost_proj[table * w..(table + 1) * w];
            with.clear();
            with.extend(dev_heads.iter().map(|dev| {
                sum.clear();
                sum.extend(dev.iter().zip(projected).map(|(a, b)| a + b));
                heads.finish(&sum)
            }));
            features.clear();
            device_features(
                &now,
                &with,
                &used,
                need,
                self.cap,
                self.scale,
                &mut features,
            );
            // The first legal device of highest logit (torch's argmax), with
            // Gumbel noise when sampling.
            let mut best: Option<(usize, f32)> = None;
            let per_device = features.chunks_exact(DEVICE_FEATURES as usize);
            for (d, f) in per_device.enumerate().filter(|&(d, _)| legal[d]) {
                scorer.project_state_into(f, &mut scratch, &mut state);
                let mut logit = scorer.logit(&dev_tables[d], &state, &current);
                if let Some((rng, temperature)) = noise.as_mut() {
                    let u: f64 = rand::Rng::gen_range(rng, 1e-12..1.0);
                    logit += *temperature * (-(-u.ln()).ln()) as f32;
                }
                if best.is_none_or(|(_, b)| logit > b) {
                    best = Some((d, logit));
                }
            }
            let d = best.map_or(0, |(d, _)| d);
            used[d] = used[d].saturating_add(need);
            plan[table] = d;
            add_into(
                &mut dev_tables[d],
                &scorer.project_table(&self.pol_repr[table]),
            );
            add_into(&mut dev_heads[d], projected);
            now[d] = with[d];
        }
        (plan, infeasible)
    }
}

/// A plan with its devices renumbered in order of their first table: equal
/// for two plans that differ only in how devices are numbered (which no
/// cost or policy here can tell apart).
pub fn numbered_by_first_use(plan: &[usize]) -> Vec<usize> {
    let mut names: Vec<usize> = Vec::new();
    plan.iter()
        .map(|d| match names.iter().position(|x| x == d) {
            Some(k) => k,
            None => {
                names.push(*d);
                names.len() - 1
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nets::{PlacedTables, PlanBatch};
    use common::config::ModelConfig;
    use common::generate::{generate_pool, PoolGenConfig};
    use tch::nn;

    fn nets() -> (nn::VarStore, PolicyNet, CostNet) {
        tch::manual_seed(3);
        let vs = nn::VarStore::new(Device::Cpu);
        let cfg = ModelConfig::default();
        let policy = PolicyNet::new(&(vs.root() / "policy"), &cfg);
        let cost = CostNet::new(&(vs.root() / "cost"), &cfg);
        (vs, policy, cost)
    }

    fn tables(n: usize) -> Vec<Table> {
        generate_pool(
            &PoolGenConfig {
                tables: n,
                ..Default::default()
            },
            5,
        )
        .unwrap()
    }

    fn close(a: &Tensor, b: &Tensor) -> bool {
        (a - b).abs().max().double_value(&[]) < 1e-4
    }

    #[test]
    fn the_plain_greedy_episode_places_as_the_batched_one() {
        let mem = MemoryModel::default();
        let (mut infeasible_seen, mut spread) = (false, 0);
        for seed in 0..6u64 {
            tch::manual_seed(seed as i64);
            let vs = nn::VarStore::new(Device::Cpu);
            // Odd seeds: two members whose exchange heads read the task;
            // seeds 2 and 4: heads that see the devices' widest tables
            // (seed 4: two members).
            let cfg = ModelConfig {
                cost_context: seed % 2 == 1,
                cost_members: 1 + seed as i64 % 2 + i64::from(seed == 4),
                cost_wide_dims: if seed % 2 == 0 && seed > 0 {
                    vec![32, 64, 100]
                } else {
                    vec![]
                },
                ..ModelConfig::default()
            };
            let policy = PolicyNet::new(&(vs.root() / "policy"), &cfg);
            let cost = CostNet::new(&(vs.root() / "cost"), &cfg);
            let t = generate_pool(
                &PoolGenConfig {
                    tables: 40,
                    ..Default::default()
                },
                seed,
            )
            .unwrap();
            let total: u64 = t.iter().map(|x| mem.table_bytes(x)).sum();
            let devices = 2 + seed as usize % 5;
            // Room to spare, tight, and too little.
            let cap = match seed % 3 {
                0 => u64::MAX,
                1 => total / devices as u64 * 6 / 5,
                _ => total / devices as u64 * 4 / 5,
            };
            let task = MdpTask::new(&t, devices, cap, &mem);
            let batched = rollout(&policy, &cost, &task, 1, Mode::Greedy);
            let (plan, infeasible) = greedy_episode(&policy, &cost, &task);
            // Empty devices tie, and libtorch's batched rounding breaks the
            // tie anywhere: the plans agree up to the devices' numbering.
            assert_eq!(
                numbered_by_first_use(&plan),
                numbered_by_first_use(&batched.plans[0]),
                "seed {seed}"
            );
            assert_eq!(infeasible, batched.infeasible[0], "seed {seed}");
            infeasible_seen |= infeasible;
            spread += usize::from(plan.iter().any(|&d| d != plan[0]));
        }
        assert!(infeasible_seen, "no case ran out of memory");
        // Not only single-device plans (a random policy may well put every
        // table on one device when memory allows; tight memory does not).
        assert!(spread >= 2, "{spread} plans used more than one device");
    }

    #[test]
    fn incremental_state_equals_state_recomputed_from_scratch() {
        let (_vs, policy, cost) = nets();
        let t = tables(12);
        let mem = MemoryModel::default();
        let cap = t.iter().map(|x| mem.table_bytes(x)).sum::<u64>() / 2;
        let task = MdpTask::new(&t, 3, cap, &mem);
        let u = rollout(&policy, &cost, &task, 4, Mode::Sample { seed: 1 });
        let repr = tch::no_grad(|| cost.tables(&task.features));
        let scale = u.reward_scale as f32;
        let composed = |c: &[[f32; 3]]| {
            let f = c.iter().map(|x| x[0]).fold(f32::MIN, f32::max);
            let r = c.iter().map(|x| x[1] + 2.0 * x[2]).fold(f32::MIN, f32::max);
            f + r
        };
        for (k, plan) in u.plans.iter().enumerate() {
            for (step, &table) in u.order.iter().enumerate() {
                // Devices hold the tables placed before this step.
                let sums = Tensor::zeros([3, repr.size()[1]], opts());
                let mut used = [0u64; 3];
                for &placed in &u.order[..step] {
                    let row = repr.get(placed as i64);
                    let _ = sums.get(plan[placed] as i64).f_add_(&row).unwrap();
                    used[plan[placed]] += task.bytes[placed];
                }
                let costs = |x: &Tensor| -> Vec<[f32; 3]> {
                    let v = Vec::<f32>::try_from(
                        tch::no_grad(|| cost.device_costs(x, &cost.context(&repr, 3))).view([-1]),
                    );
                    v.unwrap().chunks(3).map(|c| [c[0], c[1], c[2]]).collect()
                };
                // Devices still empty cost nothing.
                let now: Vec<[f32; 3]> = costs(&sums)
                    .into_iter()
                    .enumerate()
                    .map(|(dev, c)| {
                        let occupied = u.order[..step].iter().any(|&p| plan[p] == dev);
                        if occupied {
                            c
                        } else {
                            [0.0; 3]
                        }
                    })
                    .collect();
                let with = costs(&(&sums + repr.get(table as i64).unsqueeze(0)));
                let seen = u.device_features.get(step as i64).get(k as i64);
                let seen: Vec<f32> = Vec::try_from(seen.view([-1])).unwrap();
                for dev in 0..3usize {
                    let f = &seen[dev * DEVICE_FEATURES as usize..][..DEVICE_FEATURES as usize];
                    let mut placed = now.clone();
                    placed[dev] = with[dev];
                    let free = (cap as f64 - (used[dev] + task.bytes[table]) as f64) / cap as f64;
                    let mut expect = vec![];
                    expect.extend(now[dev].map(|x| x / scale));
                    expect.extend((0..3).map(|i| (with[dev][i] - now[dev][i]) / scale));
                    expect.push((composed(&placed) - composed(&now)) / scale);
                    expect.push(free.clamp(-1.0, 1.0) as f32);
                    for (i, (a, b)) in f.iter().zip(&expect).enumerate() {
                        assert!(
                            (a - b).abs() < 1e-4 * (1.0 + b.abs()),
                            "step {step} dev {dev} feature {i}: {a} vs {b}"
                        );
                    }
                }
            }
            // The final predicted cost is the cost network on the final plan.
            let feats: Vec<[f32; NUM_FEATURES]> = t.iter().map(scaled).collect();
            let batch = PlanBatch::new(&[PlacedTables {
                features: feats,
                assignment: plan.clone(),
                devices: 3,
            }]);
            let direct = tch::no_grad(|| cost.forward(&batch).overall);
            assert!(close(
                &direct,
                &u.predicted_cost_ms.get(k as i64).unsqueeze(0)
            ));
        }
    }

    #[test]
    fn device_features_follow_their_definition() {
        let now = [[2.0, 1.0, 0.5], [1.0, 3.0, 0.0], [0.0, 0.0, 0.0]];
        let with = [[3.0, 2.0, 0.5], [2.0, 3.0, 1.0], [1.0, 1.0, 0.0]];
        let mut out = Vec::new();
        device_features(&now, &with, &[10, 20, 0], 10, 40, 2.0, &mut out);
        // The iteration costs max fwd + max (bwd + 2·comm) = 2 + 3 now; on
        // device 0 it would be 3 + 3, on 1 it would be 2 + 5, on 2 still 2 + 3.
        #[rustfmt::skip]
        let expect = [
            1.0, 0.5, 0.25, 0.5, 0.5, 0.0, 0.5, 0.5,
            0.5, 1.5, 0.0, 0.5, 0.0, 0.5, 1.0, 0.25,
            0.0, 0.0, 0.0, 0.5, 0.5, 0.0, 0.0, 0.75,
        ];
        assert_eq!(out, expect);
        // One device: the iteration cost is its own; a table that does not
        // fit leaves a negative share free (at least -1).
        out.clear();
        device_features(
            &[[1.0, 1.0, 1.0]],
            &[[2.0, 1.0, 1.0]],
            &[30],
            100,
            40,
            1.0,
            &mut out,
        );
        assert_eq!(out, [1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 1.0, -1.0]);
        // Two devices tie for the largest forward: adding to one leaves the
        // other's as the others' largest.
        out.clear();
        let now = [[2.0, 0.0, 0.0], [2.0, 0.0, 0.0]];
        let with = [[2.5, 0.0, 0.0], [2.0, 1.0, 0.0]];
        device_features(&now, &with, &[0, 0], 1, 10, 1.0, &mut out);
        let added: Vec<f32> = out.chunks(8).map(|f| f[6]).collect();
        assert_eq!(added, [0.5, 1.0]);
    }

    /// Tables of one size and varied pooling: with room for six per device
    /// and twenty tables on four devices, a legal device always exists, and
    /// the cap binds once a device holds six.
    fn equal_tables(n: usize) -> Vec<Table> {
        (0..n)
            .map(|i| Table::cold(format!("t{i}"), 100_000, 64, 1.0 + i as f64))
            .collect()
    }

    #[test]
    fn every_plan_fits_memory_and_illegal_devices_are_never_chosen() {
        let (_vs, policy, cost) = nets();
        let t = equal_tables(20);
        let mem = MemoryModel::default();
        let cap = 6 * mem.table_bytes(&t[0]);
        let task = MdpTask::new(&t, 4, cap, &mem);
        let u = rollout(&policy, &cost, &task, 32, Mode::Sample { seed: 1 });
        for (k, plan) in u.plans.iter().enumerate() {
            assert!(!u.infeasible[k]);
            let p = common::Plan {
                devices: 4,
                assignment: plan.clone(),
            };
            assert!(p.fits(&t, &mem, cap), "episode {k}");
        }
        let chosen_legal = u
            .masks
            .gather(2, &u.actions.unsqueeze(2), false)
            .all()
            .int64_value(&[]);
        assert_eq!(chosen_legal, 1);
        // The cap binds: some steps had illegal devices.
        assert_eq!(u.masks.all().int64_value(&[]), 0);
        assert_eq!(u.behaviour_logp.le(0.0).all().int64_value(&[]), 1);
    }

    /// Best-fit decreasing of `rest` into devices with `free` bytes each.
    fn best_fit_packs(mut free: Vec<u64>, rest: &[u64]) -> bool {
        let mut rest = rest.to_vec();
        rest.sort_unstable_by(|a, b| b.cmp(a));
        rest.iter().all(|&b| {
            let best = (0..free.len())
                .filter(|&x| free[x] >= b)
                .min_by_key(|&x| free[x]);
            best.map(|x| free[x] -= b).is_some()
        })
    }

    #[test]
    fn remaining_takes_out_one_table_of_the_size_placed() {
        let mut rest = Remaining::new(&[5, 9, 5, 1]);
        assert_eq!((rest.bytes.clone(), rest.total), (vec![9, 5, 5, 1], 20));
        rest.take(5);
        assert_eq!((rest.bytes.clone(), rest.total), (vec![9, 5, 1], 15));
        rest.take(9);
        rest.take(7); // no such table: nothing taken
        assert_eq!((rest.bytes.clone(), rest.total), (vec![5, 1], 6));
    }

    #[test]
    fn the_mask_keeps_room_for_the_tables_to_come() {
        let mut free = MaskScratch::default();
        let mut legal = [false; 2];
        // Cap 10, device 0 holds 3; a table of 4 now, then 7 and 6. Both
        // devices have room for the 4, but on device 0 it leaves 3 and 10
        // free, and the 6 finds no room after the 7.
        let rest = {
            let mut r = Remaining::new(&[4, 7, 6]);
            r.take(4);
            r
        };
        let out = legal_devices(&[3, 0], 10, 4, &rest, &mut legal, &mut free);
        assert_eq!((legal, out), ([false, true], false));
        // No device leaves room for what is to come: every device that
        // fits is legal, and the episode has not run out yet.
        let rest = {
            let mut r = Remaining::new(&[4, 9, 9]);
            r.take(4);
            r
        };
        let out = legal_devices(&[3, 0], 10, 4, &rest, &mut legal, &mut free);
        assert_eq!((legal, out), ([true, true], false));
        // The table fits nowhere: the roomiest device, out of memory.
        let out = legal_devices(&[8, 7], 10, 4, &rest, &mut legal, &mut free);
        assert_eq!((legal, out), ([false, true], true));
    }

    #[test]
    fn the_cheap_path_only_skips_packings_that_would_succeed() {
        // Random small states: wherever the mask allows a device, a best-fit
        // packing of the rest exists after placing there, unless no device
        // allows one (then every device that fits is legal).
        let mut rng = seeded(11);
        let (mut checked, mut narrowed) = (0, 0);
        for _ in 0..3000 {
            let d = rand::Rng::gen_range(&mut rng, 1..5usize);
            let cap = rand::Rng::gen_range(&mut rng, 10..40u64);
            let used: Vec<u64> = (0..d)
                .map(|_| rand::Rng::gen_range(&mut rng, 0..cap))
                .collect();
            let n = rand::Rng::gen_range(&mut rng, 0..6usize);
            let sizes: Vec<u64> = (0..=n)
                .map(|_| rand::Rng::gen_range(&mut rng, 1..cap / 2))
                .collect();
            let need = sizes[0];
            let mut rest = Remaining::new(&sizes);
            rest.take(need);
            let (mut legal, mut free) = (vec![false; d], MaskScratch::default());
            if legal_devices(&used, cap, need, &rest, &mut legal, &mut free) {
                assert!(used.iter().all(|&u| u + need > cap));
                continue;
            }
            let fits: Vec<bool> = used.iter().map(|&u| u + need <= cap).collect();
            let packs: Vec<bool> = (0..d)
                .map(|x| {
                    fits[x] && {
                        let mut f: Vec<u64> = used.iter().map(|&u| cap - u).collect();
                        f[x] -= need;
                        best_fit_packs(f, &rest.bytes)
                    }
                })
                .collect();
            let want = if packs.iter().any(|&p| p) {
                packs
            } else {
                fits.clone()
            };
            assert_eq!(
                legal, want,
                "used {used:?} cap {cap} need {need} rest {:?}",
                rest.bytes
            );
            checked += 1;
            narrowed += (legal != fits) as usize;
        }
        assert!(
            checked > 1000 && narrowed > 50,
            "{checked} checked, {narrowed} narrowed"
        );
    }

    #[test]
    fn on_a_tight_budget_episodes_keep_room_where_a_plain_mask_runs_out() {
        let (_vs, policy, cost) = nets();
        let mem = MemoryModel::default();
        let (mut ours, mut plain) = (0, 0);
        for seed in 0..8u64 {
            let t = generate_pool(
                &PoolGenConfig {
                    tables: 40,
                    ..Default::default()
                },
                100 + seed,
            )
            .unwrap();
            let bytes: Vec<u64> = t.iter().map(|x| mem.table_bytes(x)).collect();
            let devices = 4;
            let share = bytes.iter().sum::<u64>() / devices as u64;
            let cap = (share + share / 10).max(*bytes.iter().max().unwrap());
            let task = MdpTask::new(&t, devices, cap, &mem);
            let u = rollout(&policy, &cost, &task, 16, Mode::Sample { seed });
            ours += u.infeasible.iter().filter(|&&x| x).count();
            // A walk that checks only the step's own memory: a random
            // fitting device at each step, in the same order (not the
            // policy: how often such a walk runs out shows the budget is
            // tight).
            let mut rng = seeded(seed);
            for _ in 0..16 {
                let mut used = vec![0u64; devices];
                let stuck = u.order.iter().any(|&k| {
                    let fit: Vec<usize> = (0..devices)
                        .filter(|&x| used[x] + bytes[k] <= cap)
                        .collect();
                    if fit.is_empty() {
                        return true;
                    }
                    let x = fit[rand::Rng::gen_range(&mut rng, 0..fit.len())];
                    used[x] += bytes[k];
                    false
                });
                plain += stuck as usize;
            }
        }
        assert!(
            plain >= 20,
            "the plain mask ran out in only {plain} of 128 episodes"
        );
        assert!(
            ours * 4 <= plain,
            "{ours} of 128 ran out, against {plain} with a plain mask"
        );
    }

    #[test]
    fn a_task_that_cannot_fit_is_flagged_infeasible() {
        let (_vs, policy, cost) = nets();
        let t = equal_tables(6);
        let mem = MemoryModel::default();
        let task = MdpTask::new(&t, 2, 2 * mem.table_bytes(&t[0]), &mem);
        let u = rollout(&policy, &cost, &task, 3, Mode::Sample { seed: 1 });
        assert!(u.infeasible.iter().all(|&f| f));
    }

    #[test]
    fn greedy_is_deterministic_and_sampling_explores() {
        let (_vs, policy, cost) = nets();
        let t = tables(20);
        let task = MdpTask::new(&t, 4, u64::MAX, &MemoryModel::default());
        let a = rollout(&policy, &cost, &task, 3, Mode::Greedy);
        let b = rollout(&policy, &cost, &task, 3, Mode::Greedy);
        assert_eq!(a.plans, b.plans);
        assert!(a.plans.iter().all(|p| p == &a.plans[0]));
        let s = rollout(&policy, &cost, &task, 64, Mode::Sample { seed: 1 });
        let distinct: std::collections::HashSet<_> = s.plans.iter().collect();
        assert!(
            distinct.len() > 10,
            "{} distinct plans of 64",
            distinct.len()
        );
        // A seed fixes the samples, whatever libtorch's global RNG holds.
        tch::manual_seed(99);
        let again = rollout(&policy, &cost, &task, 64, Mode::Sample { seed: 1 });
        assert_eq!(s.plans, again.plans);
        let other = rollout(&policy, &cost, &task, 64, Mode::Sample { seed: 2 });
        assert_ne!(s.plans, other.plans);
    }

    #[test]
    fn gumbel_samples_follow_the_probabilities_and_never_an_illegal_device() {
        let probs = [0.6f64, 0.3, 0.1];
        let n = 20_000i64;
        let row: Vec<f32> = probs
            .iter()
            .map(|p| p.ln() as f32)
            .chain([f32::NEG_INFINITY])
            .collect();
        let logp = Tensor::from_slice(&row).view([1, 4]).expand([n, 4], false);
        let freq = |temperature: f64, greedy: usize| {
            let a = gumbel_argmax(&logp, &mut seeded(3), temperature, greedy);
            let a = Vec::<i64>::try_from(&a).unwrap();
            let mut count = [0usize; 4];
            a.iter().skip(greedy).for_each(|&d| count[d as usize] += 1);
            (a, count.map(|c| c as f64 / (n as usize - greedy) as f64))
        };
        let (_, f) = freq(1.0, 0);
        assert_eq!(f[3], 0.0, "an illegal device was chosen");
        for d in 0..3 {
            let sigma = (probs[d] * (1.0 - probs[d]) / n as f64).sqrt();
            assert!((f[d] - probs[d]).abs() < 4.0 * sigma, "{f:?}");
        }
        // At temperature 1/2, softmax(logp / T): probabilities squared, renormalised.
        let (_, f) = freq(0.5, 0);
        let z: f64 = probs.iter().map(|p| p * p).sum();
        for d in 0..3 {
            let p = probs[d] * probs[d] / z;
            assert!(
                (f[d] - p).abs() < 4.0 * (p * (1.0 - p) / n as f64).sqrt(),
                "{f:?}"
            );
        }
        // Greedy rows take the most probable device.
        let (a, _) = freq(1.0, 5);
        assert!(a[..5].iter().all(|&d| d == 0));
        assert!(a[5..].iter().any(|&d| d != 0));
    }

    #[test]
    fn plain_samples_follow_the_batched_rollouts_distribution() {
        // Four tables on two devices: plans, numbered by first use, have
        // eight kinds. The plain sampler at a temperature and the batched
        // rollout at the same temperature draw them alike; another
        // temperature draws them differently (so the comparison can fail).
        let (_vs, policy, cost) = nets();
        let mem = MemoryModel::default();
        let task = MdpTask::new(&tables(4), 2, u64::MAX, &mem);
        let plain = PlainEpisodes::new(&policy, &cost, &task);
        let n = 6000usize;
        let histogram = |plans: Vec<Vec<usize>>| {
            let mut h = std::collections::BTreeMap::<Vec<usize>, f64>::new();
            for p in plans {
                *h.entry(numbered_by_first_use(&p)).or_default() += 1.0 / n as f64;
            }
            h
        };
        let distance = |a: &std::collections::BTreeMap<Vec<usize>, f64>,
                        b: &std::collections::BTreeMap<Vec<usize>, f64>| {
            let keys: std::collections::BTreeSet<_> = a.keys().chain(b.keys()).collect();
            keys.into_iter()
                .map(|k| (a.get(k).unwrap_or(&0.0) - b.get(k).unwrap_or(&0.0)).abs())
                .sum::<f64>()
                / 2.0
        };
        let plain_at = |t: f64| histogram((0..n as u64).map(|i| plain.sampled(i, t).0).collect());
        let batched_at = |t: f64| {
            let mode = Mode::GreedyAndSamples {
                seed: 9,
                temperature: t,
            };
            let u = rollout(&policy, &cost, &task, n + 1, mode);
            histogram(u.plans[1..].to_vec())
        };
        for t in [0.05, 0.3] {
            let (a, b) = (plain_at(t), batched_at(t));
            assert!(
                distance(&a, &b) < 0.04,
                "at temperature {t}: {a:?} against {b:?}"
            );
        }
        let (cold, warm) = (plain_at(0.05), plain_at(0.3));
        assert!(distance(&cold, &warm) > 0.1, "{cold:?} and {warm:?}");
        // Seeded: the same seed, the same plan; towards zero, the greedy one.
        assert_eq!(plain.sampled(7, 1.0), plain.sampled(7, 1.0));
        let (cold, greedy) = (plain.sampled(7, 1e-9), plain.greedy());
        assert_eq!(
            numbered_by_first_use(&cold.0),
            numbered_by_first_use(&greedy.0)
        );
    }

    #[test]
    fn an_empty_task_or_overflowing_weights_are_errors_not_panics() {
        let (vs, policy, cost) = nets();
        let mem = MemoryModel::default();
        let t = tables(6);
        let no_table = MdpTask::new(&[], 3, u64::MAX, &mem);
        let e = try_rollout(&policy, &cost, &no_table, 4, Mode::Sample { seed: 1 }).unwrap_err();
        assert!(e.to_string().contains("0 tables"), "{e}");
        let no_device = MdpTask::new(&t, 0, u64::MAX, &mem);
        let e = try_rollout(&policy, &cost, &no_device, 4, Mode::Sample { seed: 1 }).unwrap_err();
        assert!(e.to_string().contains("0 devices"), "{e}");
        let task = MdpTask::new(&t, 3, u64::MAX, &mem);
        let e = try_rollout(&policy, &cost, &task, 0, Mode::Sample { seed: 1 }).unwrap_err();
        assert!(matches!(e, RolloutError::Empty { episodes: 0, .. }), "{e}");
        assert!(try_rollout(&policy, &cost, &task, 4, Mode::Sample { seed: 1 }).is_ok());
        // Finite weights (an import accepts them) whose logits overflow:
        // the probabilities are NaN, and nothing can be sampled from them.
        tch::no_grad(|| {
            for (_, mut v) in vs.variables() {
                let _ = v.fill_(1e30);
            }
        });
        let e = try_rollout(&policy, &cost, &task, 4, Mode::Sample { seed: 1 }).unwrap_err();
        assert!(matches!(e, RolloutError::NotNumbers { step: 0 }), "{e}");
    }
}
