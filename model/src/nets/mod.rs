//! DreamShard's two networks (DESIGN §5), sized by [`ModelConfig`], both
//! indifferent to how many tables and devices a task has: table
//! representations are **summed** per device, device representations are
//! reduced by **max** (cost) or **mean** (value) across devices.
//!
//! Batches are flattened so that plans of different sizes share one forward:
//! tables are rows of one `[N, 21]` feature tensor, `device_of[n]` names the
//! device (numbered across the whole batch) each table sits on, and
//! `plan_of_device[g]` the plan each device belongs to.

use common::config::{CostWork, ModelConfig, OverallCost};
use common::NUM_FEATURES;
use tch::nn::{self, Module};
use tch::{Kind, Tensor};

mod plain;

pub use plain::{add_into, move_between, DeviceHeads, PolicyScorer};
use plain::{dense, InputMajor, MemberHeads};

/// Per-device costs the cost network predicts: forward, backward and
/// backward-communication time (ms). Forward communication is left out: it
/// includes the wait for the slowest device, not the device's own work.
pub const COST_FEATURES: i64 = 3;

/// Per-device state features the policy reads when it places a table (see
/// [`crate::mdp::device_features`]): the device's predicted costs now, what
/// placing the table there would add to them and to the iteration cost, and
/// the memory it would leave free.
pub const DEVICE_FEATURES: i64 = 8;

fn mlp(p: &nn::Path, input: i64, hidden: i64, out: i64) -> nn::Sequential {
    nn::seq().add(Head::new(p, input, hidden, out))
}

/// Two linear layers with a ReLU between them (variables `l1`, `l2`): every
/// MLP of the networks; the cost network keeps its per-device heads as
/// these so that [`DeviceHeads`] can copy their weights.
#[derive(Debug)]
struct Head {
    l1: nn::Linear,
    l2: nn::Linear,
}

impl Head {
    fn new(p: &nn::Path, input: i64, hidden: i64, out: i64) -> Head {
        Head {
            l1: nn::linear(p / "l1", input, hidden, Default::default()),
            l2: nn::linear(p / "l2", hidden, out, Default::default()),
        }
    }
}

impl Module for Head {
    fn forward(&self, x: &Tensor) -> Tensor {
        x.apply(&self.l1).relu().apply(&self.l2)
    }
}

/// A per-device cost head: a [`Head`] plus `model.cost_head_gates` gated
/// units (variables `gu`, `gv`), each `u·x / (1 + relu(v·x))`. A device's
/// time with a shared cache has this form: its repeated reads times a hit
/// rate `1 / (1 + repeated bytes / cache)`, both sums over its tables.
/// Both layers are linear in the device representation, so [`DeviceHeads`]
/// still projects each table once.
#[derive(Debug)]
struct CostHead {
    head: Head,
    gates: Option<(nn::Linear, nn::Linear)>,
}

impl CostHead {
    fn new(p: &nn::Path, input: i64, hidden: i64, gates: i64) -> CostHead {
        // The gates start open (`v·x` about 1, `relu` passing gradient),
        // so none starts dead.
        let open = nn::LinearConfig {
            bs_init: Some(nn::Init::Const(1.0)),
            ..Default::default()
        };
        CostHead {
            head: Head::new(p, input, hidden, 1),
            gates: (gates > 0).then(|| {
                (
                    nn::linear(p / "gu", input, gates, Default::default()),
                    nn::linear(p / "gv", input, gates, open),
                )
            }),
        }
    }
}

impl Module for CostHead {
    fn forward(&self, x: &Tensor) -> Tensor {
        let out = self.head.forward(x);
        match &self.gates {
            None => out,
            Some((u, v)) => {
                out + (x.apply(u) / (x.apply(v).relu() + 1.0)).sum_dim_intlist(
                    [1i64].as_slice(),
                    true,
                    None::<Kind>,
                )
            }
        }
    }
}

/// Sums row `n` of `rows` into row `index[n]` of a `[groups, width]` result;
/// groups nothing is summed into stay zero (an empty device).
pub fn sum_by(rows: &Tensor, index: &Tensor, groups: i64) -> Tensor {
    let width = rows.size()[1];
    Tensor::zeros([groups, width], (rows.kind(), rows.device())).index_add(0, index, rows)
}

/// Element-wise maximum of the rows of each group (`[groups, width]`); a
/// group without rows is zero (torch's `scatter_reduce` with `amax`, not
/// including the zero it starts from).
pub fn max_by(rows: &Tensor, index: &Tensor, groups: i64) -> Tensor {
    let width = rows.size()[1];
    let idx = index.unsqueeze(1).expand([-1, width], false);
    Tensor::zeros([groups, width], (rows.kind(), rows.device()))
        .internal_scatter_reduce(0, &idx, rows, "amax", false)
}

/// `[P]` iteration costs composed from `[G, 3]` per-device (fwd, bwd, comm):
/// `max_d fwd_d + max_d (bwd_d + 2·comm_d)` over each plan's devices.
pub fn compose(per_device: &Tensor, plan_of_device: &Tensor, plans: i64) -> Tensor {
    let fwd = per_device.narrow(1, 0, 1);
    let rest = per_device.narrow(1, 1, 1) + per_device.narrow(1, 2, 1) * 2.0;
    (max_by(&fwd, plan_of_device, plans) + max_by(&rest, plan_of_device, plans)).squeeze_dim(1)
}

/// One plan as the networks see it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PlacedTables {
    /// Scaled features of each table.
    pub features: Vec<[f32; NUM_FEATURES]>,
    /// Device of each table.
    pub assignment: Vec<usize>,
    pub devices: usize,
}

/// Log-probabilities of a softmax restricted to legal actions: illegal
/// entries (`mask` false) get probability exactly zero and no gradient.
///
/// `logits` and `mask` have the same shape; the last dimension holds the
/// actions. Every row must allow at least one action.
pub fn masked_log_softmax(logits: &Tensor, mask: &Tensor) -> Tensor {
    let neg_inf = Tensor::full([1], f64::NEG_INFINITY, (logits.kind(), logits.device()));
    logits
        .where_self(mask, &neg_inf)
        .log_softmax(-1, Kind::Float)
}

/// A flattened batch of plans.
#[derive(Debug)]
pub struct PlanBatch {
    /// `[U, 21]` scaled features of the batch's distinct tables, in the
    /// order they first appear: plans of one task (and tasks drawn from one
    /// pool) share their tables, and the table MLP, most of a cost step's
    /// work, runs once per distinct table.
    pub features: Tensor,
    /// `[N]` (int64): the row of `features` of each table of each plan.
    pub table_of: Tensor,
    /// `[N]` (int64): the device of each table, numbered across the batch.
    pub device_of: Tensor,
    /// `[G]` (int64): the plan of each device.
    pub plan_of_device: Tensor,
    pub devices: i64,
    pub plans: i64,
}

impl PlanBatch {
    /// Flattens plans into one batch.
    pub fn new<'p>(plans: impl IntoIterator<Item = &'p PlacedTables>) -> PlanBatch {
        let mut features = Vec::new();
        // Distinct feature rows (by their bits) and their row.
        let mut rows = std::collections::HashMap::new();
        let mut table_of = Vec::new();
        let mut device_of = Vec::new();
        let mut plan_of_device = Vec::new();
        let mut first_device = 0i64;
        let mut count = 0i64;
        for (p, plan) in plans.into_iter().enumerate() {
            count += 1;
            for (f, &d) in plan.features.iter().zip(&plan.assignment) {
                let next = rows.len() as i64;
                let row = *rows.entry(f.map(f32::to_bits)).or_insert_with(|| {
                    features.extend_from_slice(f);
                    next
                });
                table_of.push(row);
                device_of.push(first_device + d as i64);
            }
            plan_of_device.extend(std::iter::repeat_n(p as i64, plan.devices));
            first_device += plan.devices as i64;
        }
        PlanBatch {
            features: Tensor::from_slice(&features).view([rows.len() as i64, NUM_FEATURES as i64]),
            table_of: Tensor::from_slice(&table_of),
            device_of: Tensor::from_slice(&device_of),
            plan_of_device: Tensor::from_slice(&plan_of_device),
            devices: first_device,
            plans: count,
        }
    }
}

/// What the cost network predicts for a batch.
#[derive(Debug)]
pub struct CostPrediction {
    /// `[G, 3]`: forward, backward, backward communication per device (ms).
    pub per_device: Tensor,
    /// `[P]`: the iteration cost of each plan (ms).
    pub overall: Tensor,
}

/// The cost network: a shared table MLP, summed per device; per-device
/// heads for forward, backward and communication time; an overall head on
/// the maximum of the device representations. With `model.cost_members`
/// above 1 it is an ensemble of such networks from different initial
/// weights: a table's representation is the members' representations side
/// by side (so a device's sum is theirs side by side), each member's heads
/// read its own part, and the prediction is the members' mean per device.
#[derive(Debug)]
pub struct CostNet {
    members: Vec<Member>,
    /// Width of one member's table representation: `out`, times `K + 1`
    /// with `K` widest-table dims (see [`CostNet::part`]).
    member_width: i64,
    /// Width of the representation a member's heads read (`out`).
    out: i64,
    composition: OverallCost,
    work: CostWork,
    /// Whether the exchange heads read the task's context
    /// (`model.cost_context`, see [`CostNet::context`]).
    context: bool,
    /// `model.cost_wide_dims` as scaled dims (`dim / 128`, the first
    /// feature): a table's representation has a group of channels per
    /// dim, and ends with one count column per dim, 1 where the table is
    /// wider (see [`CostNet::tables`] and [`CostNet::part`]).
    wide: Vec<f64>,
}

/// One network of the ensemble.
#[derive(Debug)]
struct Member {
    table: nn::Sequential,
    fwd: CostHead,
    bwd: CostHead,
    comm: CostHead,
    overall: nn::Sequential,
}

/// Extra cost-network inputs derived from the scaled features (see
/// [`CostWork`]): lookups per sample over 16 (about
/// the mean pooling) and that times `dim / 128`, both linear, not logarithmic.
pub const WORK_FEATURES: i64 = 2;

/// The extra inputs of a [`CostWork`]: none, the two work features, or
/// those and the sector-rounded width.
pub fn work_features(work: CostWork) -> i64 {
    match work {
        CostWork::None => 0,
        CostWork::Inputs | CostWork::Gated => WORK_FEATURES,
        CostWork::Sectors => WORK_FEATURES + 1,
        CostWork::Kernel => WORK_FEATURES + 1 + KERNEL_FEATURES,
    }
}

/// The kernel's cost drivers [`with_kernel_features`] adds after the
/// sector-rounded width.
pub const KERNEL_FEATURES: i64 = 6;

/// The batch the footprint feature assumes: the trace's (a fixed scale,
/// since every backend measures at one batch).
const FOOTPRINT_BATCH: f64 = common::generate::published::BATCH as f64;
/// Cache bytes the footprint feature is counted in (64 MiB, about a
/// data-centre GPU's L2).
const FOOTPRINT_UNIT: f64 = (64u64 << 20) as f64;
/// Accesses per batch above which a row is very hot.
const HOT_ACCESSES: f64 = 1024.0;

/// TorchRec's block penalty (`[N, 1]`) of dims (`[N, 1]`, unscaled) in
/// blocks of `width` lanes: 1 for a full block, 1.15 from half, 1.75 below.
fn lane_penalty(dim: &Tensor, width: f64) -> Tensor {
    use common::published::{HALF_BLOCK_PENALTY, QUARTER_BLOCK_PENALTY};
    let share = dim / ((dim / width).ceil() * width);
    let full = share.ge(1.0 - 1e-6).to_kind(dim.kind());
    let half = share.ge(0.5 - 1e-6).to_kind(dim.kind());
    // 1.75 below half; 1.15 from half; 1 for a full block.
    (&half * (HALF_BLOCK_PENALTY - QUARTER_BLOCK_PENALTY) + QUARTER_BLOCK_PENALTY)
        + full * (1.0 - HALF_BLOCK_PENALTY)
}

/// `[N, 24]` of [`with_work_features`] (`sectors`) → `[N, 30]` with the
/// kernel's cost drivers appended (see [`CostWork::Kernel`]):
///
/// - the sector width in a full-warp block (128 lanes) and in a half-warp
///   block (64), each times TorchRec's block penalty there;
/// - 1 where the table is wider than 64 (a device's sum counts them, so
///   the heads can tell which block width its call gets);
/// - the sector width times the share of lookups that repeat a row;
/// - the bytes of rows read more than once in a batch of 65,536, in
///   units of 64 MiB: what the call's tables ask of one cache;
/// - the share of lookups on rows read over 1,024 times a batch.
pub fn with_kernel_features(features: &Tensor) -> Tensor {
    let x = with_work_features(features, true);
    let f = NUM_FEATURES as i64;
    let scaled_dim = features.narrow(1, 0, 1);
    let dim = &scaled_dim * 128.0;
    let sectored = x.narrow(1, f + 2, 1);
    // Inverts `log10(rows) / 8`.
    let rows = (features.narrow(1, 1, 1) * (8.0 * std::f64::consts::LN_10)).exp();
    let pooling = pooling_of(features);
    let bins = features.narrow(1, 4, common::table::NUM_BINS as i64);
    let counts: Vec<f32> = (0..common::table::NUM_BINS)
        .map(|k| common::Table::bin_count(k) as f32)
        .collect();
    let counts = Tensor::from_slice(&counts)
        .to_kind(features.kind())
        .to_device(features.device())
        .view([1, -1]);
    let total = bins.sum_dim_intlist([1i64].as_slice(), true, None::<Kind>);
    let weighted = (&bins * &counts).sum_dim_intlist([1i64].as_slice(), true, None::<Kind>);
    // Table::mean_reuse: accesses per unique row, at least 1 (1 without bins).
    let reuse = (&weighted / total.clamp_min(1e-12)).clamp_min(1.0);
    let repeats = 1.0 - reuse.reciprocal();
    let hot_counts = counts.gt(HOT_ACCESSES).to_kind(features.kind());
    let hot = (&bins * &counts * hot_counts).sum_dim_intlist([1i64].as_slice(), true, None::<Kind>)
        / weighted.clamp_min(1e-12);
    let unique = (pooling * FOOTPRINT_BATCH / &reuse).minimum(&rows);
    // Whole 32-byte sectors of fp16 weights: 2 bytes per rounded dim.
    let row_bytes = sector_dim(&scaled_dim) * 256.0;
    let once = features.narrow(1, 4, 1);
    let footprint = unique * (-once + 1.0).clamp_min(0.0) * row_bytes / FOOTPRINT_UNIT;
    Tensor::cat(
        &[
            x.shallow_clone(),
            &sectored * lane_penalty(&dim, 128.0),
            &sectored * lane_penalty(&dim, 64.0),
            dim.gt(64.0 + 1e-3).to_kind(features.kind()),
            &sectored * repeats,
            footprint,
            hot,
        ],
        1,
    )
}

/// `[N, 21]` scaled features → `[N, 23]` with the two work features
/// appended; `[N, 24]` with the sector-rounded width too (`sectors`).
pub fn with_work_features(features: &Tensor, sectors: bool) -> Tensor {
    let dim = features.narrow(1, 0, 1);
    let lookups = pooling_of(features) / 16.0;
    let width = &lookups * &dim;
    if !sectors {
        return Tensor::cat(&[features.shallow_clone(), lookups, width], 1);
    }
    let sectored = &lookups * sector_dim(&dim);
    Tensor::cat(&[features.shallow_clone(), lookups, width, sectored], 1)
}

/// `[N, 1]` pooling factors of `[N, 21]` scaled features: inverts
/// `log10(1 + pooling) / 3` (common::features::scaled).
fn pooling_of(features: &Tensor) -> Tensor {
    (features.narrow(1, 2, 1) * (3.0 * std::f64::consts::LN_10)).exp() - 1.0
}

/// Scaled dims `dim / 128` → `ceil(dim / 16) × 16 / 128`: a row of fp16
/// weights in whole 32-byte sectors. The small slack keeps an exact
/// multiple of 16 from rounding up through float error.
fn sector_dim(scaled_dim: &Tensor) -> Tensor {
    ((scaled_dim * 8.0 - 1e-4).ceil()) / 8.0
}

impl Member {
    /// DreamShard's overall head on the maximum of this member's device
    /// representations, `[P]`.
    fn overall_head(&self, device_repr: &Tensor, plan_of_device: &Tensor, plans: i64) -> Tensor {
        self.overall
            .forward(&max_by(device_repr, plan_of_device, plans))
            .squeeze_dim(1)
    }

    /// `[G, 3]` costs of devices; `wide` (`[G, K]`) the devices'
    /// widest-table flags ([`CostNet::wide_flags`]) where the heads read
    /// them; `context` (`[G or 1, 1 + out]`: the share `(D − 1) / D` and
    /// this member's part of the task's mean representation) only where
    /// the exchange head reads it.
    fn device_costs(
        &self,
        device_repr: &Tensor,
        wide: Option<&Tensor>,
        context: Option<&Tensor>,
    ) -> Tensor {
        let x = match wide {
            None => device_repr.shallow_clone(),
            Some(w) => Tensor::cat(&[device_repr.shallow_clone(), w.shallow_clone()], 1),
        };
        let comm = match context {
            None => self.comm.forward(&x),
            Some(ctx) => self.comm.forward(&exchange_input(&x, ctx)),
        };
        Tensor::cat(&[self.fwd.forward(&x), self.bwd.forward(&x), comm], 1)
    }
}

/// The exchange head's input with the task's context: the device's
/// representation `x`, `s·x`, the task's mean representation `c` and `s`
/// (`[G, 3·out + 1]`), from `x` (`[G, out]`) and `[s, c]` (`[G or 1,
/// 1 + out]`). A device sends `s·Σ its dims` and receives `c − x/D =
/// c − (1 − s)·x` per sample and dim, both linear in these.
fn exchange_input(x: &Tensor, ctx: &Tensor) -> Tensor {
    let [g, o] = x.size()[..] else {
        unreachable!("device representations are [G, width]")
    };
    let ctx = ctx.expand([g, 1 + o], false);
    let share = ctx.narrow(1, 0, 1);
    Tensor::cat(
        &[x.shallow_clone(), x * &share, ctx.narrow(1, 1, o), share],
        1,
    )
}

impl CostNet {
    /// Member 0's variables lie under `p` (as a single network's do), member
    /// `m`'s under `p / "member{m}"`.
    pub fn new(p: &nn::Path, cfg: &ModelConfig) -> CostNet {
        let (h, o, hh) = (
            cfg.cost_table_hidden,
            cfg.cost_table_out,
            cfg.cost_head_hidden,
        );
        let input = NUM_FEATURES as i64 + work_features(cfg.cost_work);
        // The heads read the device's representation and its widest-table
        // flags.
        let k = cfg.cost_wide_dims.len() as i64;
        assert!(
            k == 0 || !cfg.cost_context,
            "model.cost_wide_dims and model.cost_context are exclusive (ModelConfig::validate)"
        );
        let members = (0..cfg.cost_members.max(1))
            .map(|m| {
                let p = if m == 0 {
                    p.clone()
                } else {
                    p / format!("member{m}")
                };
                Member {
                    table: mlp(&(&p / "table"), input, h, o * (k + 1)).add_fn(|x| x.relu()),
                    fwd: CostHead::new(&(&p / "fwd"), o + k, hh, cfg.cost_head_gates),
                    bwd: CostHead::new(&(&p / "bwd"), o + k, hh, cfg.cost_head_gates),
                    comm: CostHead::new(
                        &(&p / "comm"),
                        if cfg.cost_context { 3 * o + 1 } else { o + k },
                        hh,
                        cfg.cost_head_gates,
                    ),
                    overall: mlp(&(&p / "overall"), o, hh, 1),
                }
            })
            .collect();
        CostNet {
            members,
            member_width: o * (k + 1),
            out: o,
            composition: cfg.overall_cost,
            work: cfg.cost_work,
            context: cfg.cost_context,
            wide: cfg
                .cost_wide_dims
                .iter()
                .map(|&d| d as f64 / 128.0)
                .collect(),
        }
    }

    /// The task's context for the exchange heads (`[1, 1 + members ×
    /// out]`): the share `(D − 1) / D` of a device's pooled rows that go to
    /// other devices, and the summed representation of all the task's
    /// tables (`table_reps`, from [`CostNet::tables`]) over `D`. It is the
    /// same for every plan of the task, partial ones included, so a search
    /// evaluates a device from its own tables as before. A network without
    /// `model.cost_context` gets a placeholder it does not read.
    pub fn context(&self, table_reps: &Tensor, devices: usize) -> Tensor {
        if !self.context {
            return Self::no_context(table_reps);
        }
        let d = devices.max(1) as f64;
        // No table: a sum of zeros.
        let mean = table_reps.sum_dim_intlist([0i64].as_slice(), true, None::<Kind>) / d;
        let share = Tensor::full([1, 1], (d - 1.0) / d, (mean.kind(), mean.device()));
        Tensor::cat(&[share, mean], 1)
    }

    /// Each device's context in a batch of whole plans (`[G, 1 + members
    /// × out]`): [`CostNet::context`] of its plan, from the device sums.
    fn batch_context(&self, device_sums: &Tensor, batch: &PlanBatch) -> Tensor {
        if !self.context {
            return Self::no_context(device_sums);
        }
        let ones = Tensor::ones(
            [batch.devices, 1],
            (device_sums.kind(), device_sums.device()),
        );
        let count = sum_by(&ones, &batch.plan_of_device, batch.plans).clamp_min(1.0);
        let total = sum_by(device_sums, &batch.plan_of_device, batch.plans);
        Tensor::cat(&[(&count - 1.0) / &count, total / &count], 1)
            .index_select(0, &batch.plan_of_device)
    }

    /// What a network without context passes for one (it reads none, so
    /// nothing is computed: not in every training step either).
    fn no_context(like: &Tensor) -> Tensor {
        Tensor::zeros([1, 1], (like.kind(), like.device()))
    }

    /// Member `m`'s part of a context: the share and its part of the mean
    /// representation (`None` for a network without context).
    fn member_context(&self, ctx: &Tensor, m: usize) -> Option<Tensor> {
        if !self.context {
            return None;
        }
        let share = ctx.narrow(1, 0, 1);
        let mean = ctx.narrow(1, 1 + m as i64 * self.member_width, self.member_width);
        Some(Tensor::cat(&[share, mean], 1))
    }

    /// Networks in the ensemble.
    pub fn members(&self) -> usize {
        self.members.len()
    }

    /// `[N, members × (K + 1) × out + K]` table representations, `K` the
    /// widest-table dims (`model.cost_wide_dims`); they do not depend on
    /// the plan, so an episode computes them once. Each member's part
    /// holds `K + 1` groups of `out` channels (see `CostNet::part`). The `K`
    /// last columns count the table against the dims: 1 where it is wider
    /// than the dim, so that a device's sum counts its wider tables.
    pub fn tables(&self, features: &Tensor) -> Tensor {
        let x = match self.work {
            CostWork::None => features.shallow_clone(),
            CostWork::Inputs | CostWork::Gated => with_work_features(features, false),
            CostWork::Sectors => with_work_features(features, true),
            CostWork::Kernel => with_kernel_features(features),
        };
        let mut reps: Vec<Tensor> = self
            .members
            .iter()
            .map(|m| {
                let r = m.table.forward(&x);
                if self.work != CostWork::Gated {
                    return r;
                }
                let (n, o) = (r.size()[0], r.size()[1]);
                let k = o / 3;
                let f = NUM_FEATURES as i64;
                let scale = Tensor::cat(
                    &[
                        x.narrow(1, f + 1, 1).expand([n, k], false),
                        x.narrow(1, f, 1).expand([n, k], false),
                        Tensor::ones([n, o - 2 * k], (r.kind(), r.device())),
                    ],
                    1,
                );
                r * scale
            })
            .collect();
        if !self.wide.is_empty() {
            // Exact 0/1 columns: the scaled dim is `dim / 128`, exact in f32.
            let dim = features.narrow(1, 0, 1);
            reps.extend(
                self.wide
                    .iter()
                    .map(|&t| dim.gt(t).to_kind(features.kind())),
            );
        }
        if reps.len() == 1 {
            reps.into_iter().next().unwrap_or_default()
        } else {
            Tensor::cat(&reps, 1)
        }
    }

    /// The devices' widest-table flags (`[G, K]`) from their summed
    /// representations: for each of `model.cost_wide_dims`, 1 where the
    /// device holds a wider table (its count column is at least 1), else 0.
    /// `None` for a network without them.
    fn wide_flags(&self, device_repr: &Tensor) -> Option<Tensor> {
        if self.wide.is_empty() {
            return None;
        }
        let k = self.wide.len() as i64;
        let counts = device_repr.narrow(1, device_repr.size()[1] - k, k);
        Some(counts.clamp(0.0, 1.0))
    }

    /// What member `m`'s heads read of device representations
    /// (`[G, out]`). With widest-table dims, the member's first group of
    /// channels plus group `k + 1` wherever the device's flag `k` is set
    /// ([`CostNet::wide_flags`]): a wide table changes how every table
    /// beside it costs (their lanes), which a group that counts only
    /// beside a wide table can say and a flag added on cannot.
    /// `flags` are the devices' [`CostNet::wide_flags`], computed once
    /// for all members.
    fn part(&self, repr: &Tensor, flags: Option<&Tensor>, m: usize) -> Tensor {
        if self.members.len() == 1 && self.wide.is_empty() {
            return repr.shallow_clone();
        }
        let mine = repr.narrow(1, m as i64 * self.member_width, self.member_width);
        let Some(flags) = flags else {
            return mine;
        };
        let o = self.out;
        (0..self.wide.len() as i64).fold(mine.narrow(1, 0, o), |x, k| {
            x + mine.narrow(1, (k + 1) * o, o) * flags.narrow(1, k, 1)
        })
    }

    /// `[G, 3]` cost features of devices given their summed representations
    /// (the members' mean) and the context of their task ([`CostNet::context`],
    /// `[1, …]`, or one row per device).
    pub fn device_costs(&self, device_repr: &Tensor, ctx: &Tensor) -> Tensor {
        self.members_mean(device_repr, |m, member, part, wide| {
            member.device_costs(part, wide, self.member_context(ctx, m).as_ref())
        })
    }

    /// The members' mean of `f(m, member, part, flags)`, where `part` is
    /// what member `m` reads of the device representations
    /// ([`CostNet::part`]) and `flags` their widest-table flags.
    fn members_mean(
        &self,
        device_repr: &Tensor,
        f: impl Fn(usize, &Member, &Tensor, Option<&Tensor>) -> Tensor,
    ) -> Tensor {
        let wide = self.wide_flags(device_repr);
        mean_of(
            self.members
                .iter()
                .enumerate()
                .map(|(m, member)| {
                    let part = self.part(device_repr, wide.as_ref(), m);
                    f(m, member, &part, wide.as_ref())
                })
                .collect(),
        )
    }

    /// `[P]` overall costs from device representations (see
    /// [`OverallCost`]), the plans being of one task whose context is `ctx`
    /// (or with one context row per device).
    pub fn overall_cost(
        &self,
        device_repr: &Tensor,
        plan_of_device: &Tensor,
        plans: i64,
        ctx: &Tensor,
    ) -> Tensor {
        match self.composition {
            OverallCost::Head => self.members_mean(device_repr, |_, member, part, _| {
                member.overall_head(part, plan_of_device, plans)
            }),
            OverallCost::Composed => {
                compose(&self.device_costs(device_repr, ctx), plan_of_device, plans)
            }
        }
    }

    /// A plain copy of the per-device heads for the plans of one task
    /// (its tables' representations `reps`, on `devices` devices), for many
    /// cheap evaluations of single devices (see [`DeviceHeads`]): the
    /// exchange heads' context ([`CostNet::context`]) is folded into their
    /// first layer's weights and bias.
    pub fn device_heads(&self, reps: &Tensor, devices: usize) -> DeviceHeads {
        let _guard = tch::no_grad_guard();
        let ctx = self.context(reps, devices);
        let ctx = &ctx;
        DeviceHeads {
            devices: self.context.then_some(devices),
            members: self
                .members
                .iter()
                .enumerate()
                .map(|(m, member)| {
                    let context = self
                        .member_context(ctx, m)
                        .map(|c| crate::tensor_vec::<f32>(&c.to_kind(Kind::Float)));
                    MemberHeads::of(member, self.wide.len(), context.as_deref())
                })
                .collect(),
        }
    }

    /// `[G, members × out + K]` device representations of a batch: each
    /// distinct table's representation, summed over the tables of each
    /// device.
    fn device_sums(&self, batch: &PlanBatch) -> Tensor {
        let tables = self.tables(&batch.features);
        sum_by(
            &tables.index_select(0, &batch.table_of),
            &batch.device_of,
            batch.devices,
        )
    }

    /// The ensemble's prediction: the members' mean per device, and the
    /// overall cost from it (composed) or the mean of the members' overall
    /// heads.
    pub fn forward(&self, batch: &PlanBatch) -> CostPrediction {
        let dev = self.device_sums(batch);
        let ctx = self.batch_context(&dev, batch);
        let per_device = self.device_costs(&dev, &ctx);
        let overall = match self.composition {
            OverallCost::Head => self.overall_cost(&dev, &batch.plan_of_device, batch.plans, &ctx),
            OverallCost::Composed => compose(&per_device, &batch.plan_of_device, batch.plans),
        };
        CostPrediction {
            per_device,
            overall,
        }
    }

    /// Each member's own prediction, which training fits one by one (a
    /// member learns from its loss alone, so the members stay apart).
    pub fn forward_members(&self, batch: &PlanBatch) -> Vec<CostPrediction> {
        let dev = self.device_sums(batch);
        let ctx = self.batch_context(&dev, batch);
        let wide = self.wide_flags(&dev);
        self.members
            .iter()
            .enumerate()
            .map(|(m, member)| {
                let part = self.part(&dev, wide.as_ref(), m);
                let per_device = member.device_costs(
                    &part,
                    wide.as_ref(),
                    self.member_context(&ctx, m).as_ref(),
                );
                let overall = match self.composition {
                    OverallCost::Head => {
                        member.overall_head(&part, &batch.plan_of_device, batch.plans)
                    }
                    OverallCost::Composed => {
                        compose(&per_device, &batch.plan_of_device, batch.plans)
                    }
                };
                CostPrediction {
                    per_device,
                    overall,
                }
            })
            .collect()
    }
}

/// The mean of equally shaped tensors (the tensor itself for one).
fn mean_of(parts: Vec<Tensor>) -> Tensor {
    let n = parts.len() as f64;
    let mut it = parts.into_iter();
    let first = it.next().unwrap_or_default();
    if n == 1.0 {
        return first;
    }
    it.fold(first, |acc, t| acc + t) / n
}

/// The policy network with its value head.
///
/// A device's representation is its tables' summed representations
/// (own MLP), its state features (through their MLP) and the representation
/// of the table being placed; a shared score MLP turns each into a logit,
/// and a softmax over the legal devices gives the action. The value head
/// reads the mean device representation and how far the episode is.
#[derive(Debug)]
pub struct PolicyNet {
    table: nn::Sequential,
    /// The state features' MLP (a ReLU after it).
    cost: Head,
    score: Head,
    value: nn::Sequential,
    device_width: i64,
}

/// The policy's outputs for a batch of states over `D` devices.
#[derive(Debug)]
pub struct PolicyOutput {
    /// `[E, D]` unnormalised scores.
    pub logits: Tensor,
    /// `[E]` state values.
    pub value: Tensor,
}

impl PolicyNet {
    pub fn new(p: &nn::Path, cfg: &ModelConfig) -> PolicyNet {
        let o = cfg.policy_table_out;
        let co = cfg.cost_feature_out;
        let device_width = o + co + o;
        PolicyNet {
            table: mlp(
                &(p / "table"),
                NUM_FEATURES as i64,
                cfg.policy_table_hidden,
                o,
            )
            .add_fn(|x| x.relu()),
            cost: Head::new(&(p / "cost"), DEVICE_FEATURES, cfg.cost_feature_hidden, co),
            score: Head::new(&(p / "score"), device_width, cfg.score_hidden, 1),
            value: mlp(&(p / "value"), device_width + 1, cfg.value_hidden, 1),
            device_width,
        }
    }

    /// `[N, out]` table representations (once per episode).
    pub fn tables(&self, features: &Tensor) -> Tensor {
        self.table.forward(features)
    }

    /// Scores and values for `E` states over `D` devices:
    /// `device_tables` `[E, D, out]` (summed table representations),
    /// `device_features` `[E, D, DEVICE_FEATURES]`, `current` `[E, out]` (the table being
    /// placed) and `progress` `[E]` (steps taken / steps in the episode).
    pub fn forward(
        &self,
        device_tables: &Tensor,
        device_features: &Tensor,
        current: &Tensor,
        progress: &Tensor,
    ) -> PolicyOutput {
        let d = device_tables.size()[1];
        let cur = current.unsqueeze(1).expand([-1, d, -1], false);
        let dev = Tensor::cat(
            &[
                device_tables.shallow_clone(),
                self.cost.forward(device_features).relu(),
                cur,
            ],
            2,
        );
        debug_assert_eq!(dev.size()[2], self.device_width);
        let logits = self.score.forward(&dev).squeeze_dim(2);
        let pooled = dev.mean_dim([1i64].as_slice(), false, Kind::Float);
        let value = self
            .value
            .forward(&Tensor::cat(&[pooled, progress.unsqueeze(1)], 1))
            .squeeze_dim(1);
        PolicyOutput { logits, value }
    }

    /// A plain copy of the weights that score devices (see
    /// [`PolicyScorer`]).
    pub fn scorer(&self) -> PolicyScorer {
        let _guard = tch::no_grad_guard();
        let o = (self.device_width as usize - self.cost.l2.ws.size()[0] as usize) / 2;
        let cost_width = self.cost.l2.ws.size()[0] as usize;
        let (w1, b1) = dense(&self.score.l1);
        let hidden = b1.len();
        let width = self.device_width as usize;
        let block = |from: usize, len: usize| -> Vec<f32> {
            w1.chunks_exact(width)
                .flat_map(|row| row[from..from + len].iter().copied())
                .collect()
        };
        let (w2, b2) = dense(&self.score.l2);
        PolicyScorer {
            hidden,
            table_width: o,
            cost1: InputMajor::of(&dense(&self.cost.l1)),
            cost2: InputMajor::of(&dense(&self.cost.l2)),
            cost: InputMajor::of(&(block(o, cost_width), vec![0.0; hidden])),
            tables: block(0, o),
            current: block(o + cost_width, o),
            b1,
            w2,
            b2: b2.first().copied().unwrap_or(0.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use common::features::scaled;
    use common::generate::{generate_pool, PoolGenConfig};
    use tch::nn::OptimizerConfig;
    use tch::Device;

    fn pool(n: usize) -> Vec<[f32; NUM_FEATURES]> {
        generate_pool(
            &PoolGenConfig {
                tables: n,
                ..Default::default()
            },
            1,
        )
        .unwrap()
        .iter()
        .map(scaled)
        .collect()
    }

    fn cost_net() -> (nn::VarStore, CostNet) {
        tch::manual_seed(0);
        let vs = nn::VarStore::new(Device::Cpu);
        let net = CostNet::new(&vs.root(), &ModelConfig::default());
        (vs, net)
    }

    fn placed(
        features: Vec<[f32; NUM_FEATURES]>,
        assignment: Vec<usize>,
        devices: usize,
    ) -> PlacedTables {
        PlacedTables {
            features,
            assignment,
            devices,
        }
    }

    /// Same shape (no broadcasting) and equal within 1e-5.
    fn close(a: &Tensor, b: &Tensor) -> bool {
        a.size() == b.size() && (a - b).abs().max().double_value(&[]) < 1e-5
    }

    #[test]
    fn plain_heads_equal_the_cost_networks_heads() {
        for (cost_context, cost_wide_dims) in [(false, vec![]), (true, vec![]), (false, vec![64])] {
            let (_vs, net) = ensemble_of(
                1,
                ModelConfig {
                    cost_context,
                    cost_wide_dims,
                    ..ModelConfig::default()
                },
            );
            // Device representations of three groups of tables, one empty.
            let reps = tch::no_grad(|| net.tables(&Tensor::from_slice2(&pool(12))));
            let heads = net.device_heads(&reps, 3);
            assert_eq!(heads.devices(), cost_context.then_some(3));
            let dev = sum_by(
                &reps,
                &Tensor::from_slice(&[0i64, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1]),
                3,
            );
            let expected = tch::no_grad(|| net.device_costs(&dev, &net.context(&reps, 3)));
            assert_eq!(heads.width(), dev.size()[1] as usize);
            for d in 0..3 {
                let repr = Vec::<f32>::try_from(dev.get(d)).unwrap();
                let got = heads.costs(&repr);
                for (k, g) in got.iter().enumerate() {
                    let e = expected.double_value(&[d, k as i64]) as f32;
                    assert!(
                        (g - e).abs() < 1e-4 * (1.0 + e.abs()),
                        "context {cost_context}, device {d} head {k}: {g} vs {e}"
                    );
                }
            }
        }
    }

    /// With `model.cost_context` the exchange head reads the task: the
    /// same device costs another exchange beside other devices or in
    /// another device count, its forward and backward do not change, and
    /// whole plans in a batch get the context of their own task.
    #[test]
    fn the_exchange_head_reads_the_tasks_context() {
        let (_vs, net) = ensemble_of(
            2,
            ModelConfig {
                cost_context: true,
                ..ModelConfig::default()
            },
        );
        let reps = tch::no_grad(|| net.tables(&Tensor::from_slice2(&pool(8))));
        let ctx = net.context(&reps, 4);
        // The share (D − 1)/D, then the mean representation.
        assert!((ctx.double_value(&[0, 0]) - 0.75).abs() < 1e-6);
        let mean = reps.sum_dim_intlist([0i64].as_slice(), true, None::<Kind>) / 4.0;
        assert!(close(&ctx.narrow(1, 1, reps.size()[1]), &mean));
        let device = reps
            .narrow(0, 0, 2)
            .sum_dim_intlist([0i64].as_slice(), true, None::<Kind>);
        let on = |devices: usize, tables: i64| {
            let others = reps.narrow(0, 0, tables);
            tch::no_grad(|| net.device_costs(&device, &net.context(&others, devices)))
        };
        let (four, two, fewer) = (on(4, 8), on(2, 8), on(4, 4));
        for other in [&two, &fewer] {
            assert!(close(&four.narrow(1, 0, 2), &other.narrow(1, 0, 2)));
            assert!((four.double_value(&[0, 2]) - other.double_value(&[0, 2])).abs() > 1e-6);
        }
        // Forward: a plan's devices read its own context, as the rollout's
        // path does with the task's.
        let batch = PlanBatch::new(&[
            placed(pool(8), vec![0, 0, 1, 1, 2, 2, 3, 3], 4),
            placed(pool(8), vec![0, 1, 0, 1, 0, 1, 0, 1], 2),
        ]);
        let both = tch::no_grad(|| net.forward(&batch));
        for (plan, devices, of) in [
            (0, 4, [0i64, 0, 1, 1, 2, 2, 3, 3]),
            (1, 2, [0, 1, 0, 1, 0, 1, 0, 1]),
        ] {
            let dev = sum_by(&reps, &Tensor::from_slice(&of), devices as i64);
            let apart = tch::no_grad(|| net.device_costs(&dev, &net.context(&reps, devices)));
            let at = if plan == 0 { 0 } else { 4 };
            assert!(close(
                &both.per_device.narrow(0, at, devices as i64),
                &apart
            ));
        }
    }

    /// With `model.cost_wide_dims` a table's representation ends with its
    /// counts (1 where wider than the dim); the heads read whether a
    /// device holds any such table, not how many; the plain heads agree
    /// for every number of flags set.
    #[test]
    fn the_heads_see_the_devices_widest_table() {
        let (_vs, net) = ensemble_of(
            2,
            ModelConfig {
                cost_wide_dims: vec![32, 64, 100],
                ..ModelConfig::default()
            },
        );
        let dims = [16u32, 32, 48, 64, 96, 128];
        let mut features = pool(dims.len());
        for (f, d) in features.iter_mut().zip(dims) {
            f[0] = d as f32 / 128.0;
        }
        let reps = tch::no_grad(|| net.tables(&Tensor::from_slice2(&features)));
        let w = reps.size()[1];
        let counts: Vec<Vec<f32>> = (0..dims.len() as i64)
            .map(|t| Vec::<f32>::try_from(reps.get(t).narrow(0, w - 3, 3)).unwrap())
            .collect();
        let expected: [[f32; 3]; 6] = [
            [0., 0., 0.],
            [0., 0., 0.],
            [1., 0., 0.],
            [1., 0., 0.],
            [1., 1., 0.],
            [1., 1., 1.],
        ];
        for (got, want) in counts.iter().zip(expected) {
            assert_eq!(got[..], want[..]);
        }
        // Devices: flags 000, 100 (once and twice), 110, 111 and empty.
        let groups: [&[usize]; 6] = [&[0, 1], &[2, 0], &[2, 3], &[4], &[5, 3], &[]];
        let heads = net.device_heads(&reps, groups.len());
        assert_eq!(heads.width(), w as usize);
        let sums: Vec<Tensor> = groups
            .iter()
            .map(|g| {
                g.iter()
                    .fold(Tensor::zeros([w], (Kind::Float, Device::Cpu)), |acc, &t| {
                        acc + reps.get(t as i64)
                    })
            })
            .collect();
        let dev = Tensor::stack(&sums, 0);
        let ctx = net.context(&reps, groups.len());
        let expected = tch::no_grad(|| net.device_costs(&dev, &ctx));
        for d in 0..groups.len() {
            let got = heads.costs(&Vec::<f32>::try_from(dev.get(d as i64)).unwrap());
            for (k, g) in got.iter().enumerate() {
                let e = expected.double_value(&[d as i64, k as i64]) as f32;
                assert!(
                    (g - e).abs() < 1e-4 * (1.0 + e.abs()),
                    "device {d} head {k}: {g} vs {e}"
                );
            }
        }
        // Two wider tables count as one; no wider table is another input.
        let with_count = |c: f64| {
            let r = dev.get(1).copy();
            let _ = r.narrow(0, w - 3, 1).fill_(c);
            tch::no_grad(|| net.device_costs(&r.unsqueeze(0), &ctx))
        };
        assert!(close(&with_count(1.0), &with_count(2.0)));
        assert!(!close(&with_count(0.0), &with_count(1.0)));
        // A flag's group of channels counts only where the flag is set:
        // each member's group 1 (of 4 groups of `out`).
        let o = ModelConfig::default().cost_table_out;
        let without_group = |d: i64| {
            let r = dev.get(d).copy();
            for m in 0..2 {
                let _ = r.narrow(0, m * 4 * o + o, o).fill_(0.0);
            }
            tch::no_grad(|| net.device_costs(&r.unsqueeze(0), &ctx))
        };
        // Device 0 (dims 16 and 32): no flag; device 1 (48 and 16): the
        // first.
        assert!(close(&without_group(0), &expected.narrow(0, 0, 1)));
        assert!(!close(&without_group(1), &expected.narrow(0, 1, 1)));
    }

    fn ensemble(members: i64) -> (nn::VarStore, CostNet) {
        ensemble_of(members, ModelConfig::default())
    }

    fn ensemble_of(members: i64, cfg: ModelConfig) -> (nn::VarStore, CostNet) {
        tch::manual_seed(0);
        let vs = nn::VarStore::new(Device::Cpu);
        let cfg = ModelConfig {
            cost_members: members,
            ..cfg
        };
        let net = CostNet::new(&vs.root(), &cfg);
        (vs, net)
    }

    #[test]
    fn an_ensemble_predicts_its_members_mean_and_its_plain_heads_agree() {
        // Hidden widths that fill the plain heads' lanes of eight, and
        // one that leaves five over.
        let cfg = |overall_cost, cost_work, cost_head_gates, cost_head_hidden| ModelConfig {
            overall_cost,
            cost_work,
            cost_head_gates,
            cost_head_hidden,
            ..ModelConfig::default()
        };
        let with_context = |c: ModelConfig| ModelConfig {
            cost_context: true,
            ..c
        };
        let with_wide = |c: ModelConfig| ModelConfig {
            cost_wide_dims: vec![32, 64, 100],
            ..c
        };
        let (composed, head) = (OverallCost::Composed, OverallCost::Head);
        let (inputs, gated) = (CostWork::Inputs, CostWork::Gated);
        for cfg in [
            cfg(composed, inputs, 0, 64),
            cfg(head, gated, 0, 64),
            cfg(composed, inputs, 5, 64),
            cfg(composed, inputs, 3, 13),
            with_context(cfg(composed, inputs, 0, 64)),
            with_context(cfg(composed, inputs, 3, 13)),
            with_wide(cfg(composed, inputs, 0, 64)),
            with_wide(cfg(head, gated, 3, 13)),
        ] {
            let k = cfg.cost_wide_dims.len() as i64;
            let overall_cost = cfg.overall_cost;
            let (_vs, net) = ensemble_of(3, cfg);
            assert_eq!(net.members(), 3);
            let batch = PlanBatch::new(&[
                placed(pool(7), vec![0, 0, 1, 1, 1, 2, 2], 3),
                placed(pool(7), vec![1, 0, 1, 0, 1, 0, 1], 2),
            ]);
            let (mean, each) = tch::no_grad(|| (net.forward(&batch), net.forward_members(&batch)));
            assert_eq!(each.len(), 3);
            // Different initial weights: the members disagree.
            assert!(!close(&each[0].per_device, &each[1].per_device));
            let avg = |f: &dyn Fn(&CostPrediction) -> &Tensor| {
                (f(&each[0]) + f(&each[1]) + f(&each[2])) / 3.0
            };
            assert!(close(&mean.per_device, &avg(&|p| &p.per_device)));
            if overall_cost == OverallCost::Head {
                assert!(close(&mean.overall, &avg(&|p| &p.overall)));
            }
            // The search's plain heads give the same mean.
            let reps = tch::no_grad(|| net.tables(&Tensor::from_slice2(&pool(7))));
            assert_eq!(
                reps.size()[1],
                3 * ModelConfig::default().cost_table_out * (k + 1) + k
            );
            let dev = sum_by(&reps, &Tensor::from_slice(&[0i64, 0, 1, 1, 1, 2, 2]), 3);
            let heads = net.device_heads(&reps, 3);
            assert_eq!(heads.width(), reps.size()[1] as usize);
            for d in 0..3 {
                let got = heads.costs(&Vec::<f32>::try_from(dev.get(d)).unwrap());
                for (k, g) in got.iter().enumerate() {
                    let e = mean.per_device.double_value(&[d, k as i64]) as f32;
                    assert!(
                        (g - e).abs() < 1e-4 * (1.0 + e.abs()),
                        "{d} {k}: {g} vs {e}"
                    );
                }
            }
            // Every table's projection at once: one matrix product per
            // member, equal to each row's own projection.
            let flat = Vec::<f32>::try_from(reps.view([-1])).unwrap();
            let rows = heads.project_rows(&flat);
            let w = heads.projected_width();
            assert_eq!(rows.len(), 7 * w);
            for (t, r) in flat.chunks_exact(heads.width()).enumerate() {
                for (a, b) in rows[t * w..(t + 1) * w].iter().zip(heads.project(r)) {
                    assert!(
                        (a - b).abs() < 1e-4 * (1.0 + b.abs()),
                        "table {t}: {a} vs {b}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_single_cost_network_keeps_its_variable_names() {
        // Checkpoints of one network load as before; members beyond the
        // first have variables of their own.
        let names = |members| {
            let (vs, _net) = ensemble(members);
            let mut n: Vec<String> = vs.variables().into_keys().collect();
            n.sort();
            n
        };
        let one = names(1);
        assert!(one.contains(&"table.l1.weight".to_string()), "{one:?}");
        assert!(one.iter().all(|n| !n.contains("member")));
        let two = names(2);
        assert_eq!(two.len(), 2 * one.len());
        assert!(one.iter().all(|n| two.contains(n)));
        assert!(
            two.contains(&"member1.fwd.l1.weight".to_string()),
            "{two:?}"
        );
    }

    #[test]
    fn composed_cost_is_max_forward_plus_max_backward_and_exchanges() {
        // Two plans: devices (fwd, bwd, comm) 0..1 belong to plan 0, 2..4 to plan 1.
        let per_device = Tensor::from_slice(&[
            1.0f32, 2.0, 0.5, //
            3.0, 1.0, 0.1, //
            2.0, 4.0, 0.0, //
            1.0, 3.0, 1.0, //
            0.5, 1.0, 0.2,
        ])
        .view([5, 3]);
        let plan_of_device = Tensor::from_slice(&[0i64, 0, 1, 1, 1]);
        let c = compose(&per_device, &plan_of_device, 2);
        // Plan 0: max fwd 3 + max(2 + 1, 1 + 0.2) = 6; plan 1: 2 + max(4, 5, 1.4) = 7.
        assert!(close(&c, &Tensor::from_slice(&[6.0f32, 7.0])));
    }

    #[test]
    fn work_features_recover_lookups_linearly() {
        let t = common::Table::cold("t", 10_000, 64, 31.0);
        let f = Tensor::from_slice(&scaled(&t)).view([1, NUM_FEATURES as i64]);
        let w = with_work_features(&f, false);
        assert_eq!(w.size(), vec![1, NUM_FEATURES as i64 + WORK_FEATURES]);
        let lookups = w.double_value(&[0, NUM_FEATURES as i64]);
        let width = w.double_value(&[0, NUM_FEATURES as i64 + 1]);
        assert!((lookups - 31.0 / 16.0).abs() < 1e-3, "{lookups}");
        assert!((width - 31.0 / 16.0 * 0.5).abs() < 1e-3, "{width}");
    }

    /// The sector-rounded width rounds each dim up to a multiple of 16
    /// (32 bytes of fp16) and leaves a multiple of 16 as it is.
    #[test]
    fn the_sector_width_rounds_rows_up_to_whole_sectors() {
        for (dim, rounded) in [
            (4, 16),
            (12, 16),
            (16, 16),
            (20, 32),
            (36, 48),
            (100, 112),
            (1024, 1024),
        ] {
            let t = common::Table::cold("t", 10_000, dim, 15.0);
            let f = Tensor::from_slice(&scaled(&t)).view([1, NUM_FEATURES as i64]);
            let w = with_work_features(&f, true);
            assert_eq!(
                w.size(),
                vec![1, NUM_FEATURES as i64 + work_features(CostWork::Sectors)]
            );
            let plain = w.double_value(&[0, NUM_FEATURES as i64 + 1]);
            let sectored = w.double_value(&[0, NUM_FEATURES as i64 + 2]);
            let lookups = 15.0 / 16.0;
            assert!(
                (plain - lookups * dim as f64 / 128.0).abs() < 1e-3,
                "dim {dim}: {plain}"
            );
            assert!(
                (sectored - lookups * rounded as f64 / 128.0).abs() < 1e-3,
                "dim {dim}: {sectored}, want {rounded}"
            );
        }
    }

    /// The kernel features agree with the table's own figures: TorchRec's
    /// block penalties by dim and block width, the share of lookups that
    /// repeat a row, the repeated rows' bytes and the hot lookups' share.
    #[test]
    fn the_kernel_features_follow_the_tables_own_figures() {
        let f = NUM_FEATURES as i64;
        // (dim, penalty in 128 lanes, penalty in 64 lanes)
        for (dim, full, half) in [
            (12, 1.75, 1.75),
            (32, 1.75, 1.15),
            (64, 1.15, 1.0),
            (100, 1.15, 1.15),
            (128, 1.0, 1.0),
            (200, 1.15, 1.15),
            (1024, 1.0, 1.0),
        ] {
            for (rows, pooling, hot_bin) in [(500, 40.0, 11), (3_000_000, 7.5, 3), (10_000, 0.5, 0)]
            {
                let mut t = common::Table::cold("t", rows, dim, pooling);
                t.bins = [0.0; common::table::NUM_BINS];
                t.bins[0] = 0.4;
                t.bins[2] = 0.35;
                t.bins[hot_bin] += 0.25;
                let x = Tensor::from_slice(&scaled(&t)).view([1, f]);
                let k = with_kernel_features(&x);
                assert_eq!(k.size(), vec![1, f + work_features(CostWork::Kernel)]);
                let at = |i: i64| k.double_value(&[0, f + i]);
                let sectored = at(2);
                let near = |got: f64, want: f64, what: &str| {
                    assert!(
                        (got - want).abs() <= 2e-3 * want.abs().max(1e-3),
                        "dim {dim}, rows {rows}, pooling {pooling}: {what} {got}, want {want}"
                    )
                };
                near(at(3), sectored * full, "full-warp width");
                near(at(4), sectored * half, "half-warp width");
                assert_eq!(at(5), if dim > 64 { 1.0 } else { 0.0 });
                near(
                    at(6),
                    sectored * (1.0 - 1.0 / t.mean_reuse()),
                    "repeated width",
                );
                let row_bytes = (dim as f64 / 16.0).ceil() * 32.0;
                let footprint =
                    common::generate::unique_rows(&t, 65536) * (1.0 - t.bins[0]) * row_bytes
                        / (64u64 << 20) as f64;
                near(at(7), footprint, "footprint");
                near(at(8), t.lookup_share_above(1024.0), "hot share");
            }
        }
    }

    /// Plans that share tables: the batch holds each distinct table once,
    /// and predicts (and trains) as with every table of every plan
    /// computed apart.
    #[test]
    fn a_batch_computes_each_distinct_table_once_and_predicts_the_same() {
        let (vs, net) = cost_net();
        let f = pool(5);
        let plans = [
            placed(f.clone(), vec![0, 1, 0, 1, 1], 2),
            placed(vec![f[3], f[0], f[4]], vec![2, 0, 2], 3),
            placed(f.clone(), vec![1, 1, 1, 0, 0], 2),
        ];
        let batch = PlanBatch::new(&plans);
        assert_eq!(batch.features.size(), [5, NUM_FEATURES as i64]);
        assert_eq!(
            Vec::<i64>::try_from(&batch.table_of).unwrap(),
            [0, 1, 2, 3, 4, 3, 0, 4, 0, 1, 2, 3, 4]
        );
        // Every table of every plan, one row each.
        let rows: Vec<f32> = plans
            .iter()
            .flat_map(|p| p.features.iter().flatten().copied())
            .collect();
        let rows = Tensor::from_slice(&rows).view([13, NUM_FEATURES as i64]);
        let dev = sum_by(&net.tables(&rows), &batch.device_of, batch.devices);
        let ctx = net.batch_context(&dev, &batch);
        let apart = net.overall_cost(&dev, &batch.plan_of_device, batch.plans, &ctx);
        let together = net.forward(&batch).overall;
        assert!(close(&apart, &together));
        // The same gradients too.
        let grads = |loss: Tensor| -> Vec<Option<Tensor>> {
            for mut g in vs.trainable_variables().iter().map(Tensor::grad) {
                if g.defined() {
                    let _ = g.zero_();
                }
            }
            loss.backward();
            let grad = |v: &Tensor| Some(v.grad()).filter(Tensor::defined).map(|g| g.copy());
            vs.trainable_variables().iter().map(grad).collect()
        };
        let a = grads(apart.sum(Kind::Float));
        let b = grads(together.sum(Kind::Float));
        assert!(a.iter().any(Option::is_some));
        assert!(a.iter().zip(&b).all(|pair| match pair {
            (Some(x), Some(y)) => close(x, y),
            (x, y) => x.is_none() && y.is_none(),
        }));
    }

    #[test]
    fn every_cost_variant_is_invariant_to_device_numbering() {
        for (overall_cost, cost_work, cost_context) in [
            (OverallCost::Composed, CostWork::Inputs, false),
            (OverallCost::Head, CostWork::Gated, false),
            (OverallCost::Composed, CostWork::Inputs, true),
            (OverallCost::Composed, CostWork::Sectors, false),
            (OverallCost::Composed, CostWork::Kernel, false),
        ] {
            tch::manual_seed(0);
            let vs = nn::VarStore::new(Device::Cpu);
            let cfg = ModelConfig {
                overall_cost,
                cost_work,
                cost_context,
                ..ModelConfig::default()
            };
            let net = CostNet::new(&vs.root(), &cfg);
            let f = pool(6);
            let a = net.forward(&PlanBatch::new(&[placed(
                f.clone(),
                vec![0, 0, 1, 1, 2, 2],
                3,
            )]));
            let b = net.forward(&PlanBatch::new(&[placed(f, vec![2, 2, 1, 1, 0, 0], 3)]));
            assert!(close(&a.overall, &b.overall));
            assert!(close(&a.per_device.get(0), &b.per_device.get(2)));
            // The rollout's path (device representations) agrees with forward.
            let reps = net.tables(&Tensor::from_slice2(&pool(6)));
            let dev = sum_by(&reps, &Tensor::from_slice(&[0i64, 0, 1, 1, 2, 2]), 3);
            let ctx = net.context(&reps, 3);
            let via_repr = net.overall_cost(&dev, &Tensor::from_slice(&[0i64, 0, 0]), 1, &ctx);
            assert!(close(&via_repr, &a.overall));
        }
    }

    #[test]
    fn cost_net_handles_any_table_and_device_count() {
        let (_vs, net) = cost_net();
        let f = pool(12);
        let batch = PlanBatch::new(&[
            placed(f[..5].to_vec(), vec![0, 1, 1, 0, 1], 2),
            placed(f[5..].to_vec(), vec![0, 3, 2, 7, 5, 1, 4], 8),
        ]);
        let out = net.forward(&batch);
        assert_eq!(out.per_device.size(), vec![10, 3]);
        assert_eq!(out.overall.size(), vec![2]);
    }

    #[test]
    fn cost_net_is_invariant_to_table_order_and_device_numbering() {
        let (_vs, net) = cost_net();
        let f = pool(6);
        let a = net.forward(&PlanBatch::new(&[placed(
            f.clone(),
            vec![0, 0, 1, 1, 2, 2],
            3,
        )]));
        // Same plan, tables listed in another order and devices renamed 0↔2.
        let order = [5, 3, 1, 4, 2, 0];
        let rename = [2, 1, 0];
        let feats: Vec<_> = order.iter().map(|&i| f[i]).collect();
        let devs: Vec<usize> = order
            .iter()
            .map(|&i| rename[[0, 0, 1, 1, 2, 2][i]])
            .collect();
        let b = net.forward(&PlanBatch::new(&[placed(feats, devs, 3)]));
        assert!(close(&a.overall, &b.overall));
        assert!(close(&a.per_device.get(0), &b.per_device.get(2)));
        assert!(close(&a.per_device.get(1), &b.per_device.get(1)));
    }

    #[test]
    fn empty_devices_have_zero_representation_and_max_ignores_padding() {
        let rows = Tensor::from_slice(&[1.0f32, -2.0, 3.0, -4.0]).view([2, 2]);
        let idx = Tensor::from_slice(&[0i64, 2]);
        let s = sum_by(&rows, &idx, 3);
        assert_eq!(
            Vec::<f32>::try_from(s.view([-1])).unwrap(),
            vec![1.0, -2.0, 0.0, 0.0, 3.0, -4.0]
        );
        // Max of negative rows stays negative: the zero init takes no part.
        let m = max_by(&rows, &Tensor::from_slice(&[0i64, 0]), 1);
        assert_eq!(Vec::<f32>::try_from(m.view([-1])).unwrap(), vec![3.0, -2.0]);
    }

    #[test]
    fn cost_net_learns_a_non_additive_cost() {
        // Target: per device, the largest scaled pooling plus 0.1 per table;
        // overall, the max over devices. A table MLP summed per device can fit
        // it only approximately; the loss must still fall a lot.
        let (vs, net) = cost_net();
        let f = pool(64);
        let mut rng = 7u64;
        let mut next = || {
            rng = rng
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (rng >> 33) as usize
        };
        let plans: Vec<PlacedTables> = (0..64)
            .map(|_| {
                let feats: Vec<_> = (0..8).map(|_| f[next() % f.len()]).collect();
                let devs: Vec<usize> = (0..8).map(|_| next() % 4).collect();
                placed(feats, devs, 4)
            })
            .collect();
        let target: Vec<f32> = plans
            .iter()
            .map(|p| {
                (0..p.devices)
                    .map(|k| {
                        let on: Vec<_> = p
                            .features
                            .iter()
                            .zip(&p.assignment)
                            .filter(|(_, &x)| x == k)
                            .collect();
                        on.iter().map(|(t, _)| t[2]).fold(0.0f32, f32::max) + 0.1 * on.len() as f32
                    })
                    .fold(0.0f32, f32::max)
            })
            .collect();
        let batch = PlanBatch::new(&plans);
        let target = Tensor::from_slice(&target);
        let mut opt = nn::Adam::default().build(&vs, 3e-3).unwrap();
        let loss_of = |net: &CostNet| {
            net.forward(&batch)
                .overall
                .mse_loss(&target, tch::Reduction::Mean)
        };
        let first = loss_of(&net).double_value(&[]);
        for _ in 0..300 {
            let loss = loss_of(&net);
            opt.backward_step(&loss);
        }
        let last = loss_of(&net).double_value(&[]);
        assert!(last < 0.1 * first, "loss {first} → {last}");
    }

    #[test]
    fn masked_actions_never_get_probability_or_gradient() {
        let logits = Tensor::from_slice(&[2.0f32, 5.0, -1.0, 0.5, 3.0, 1.0])
            .view([2, 3])
            .set_requires_grad(true);
        let mask = Tensor::from_slice(&[true, false, true, false, true, true]).view([2, 3]);
        let logp = masked_log_softmax(&logits, &mask);
        let p = logp.exp();
        assert_eq!(p.double_value(&[0, 1]), 0.0);
        assert_eq!(p.double_value(&[1, 0]), 0.0);
        let sums = p.sum_dim_intlist([1i64].as_slice(), false, Kind::Float);
        assert!((sums.double_value(&[0]) - 1.0).abs() < 1e-6);
        assert!((sums.double_value(&[1]) - 1.0).abs() < 1e-6);
        // The best legal action, not the masked larger logit, wins row 0.
        assert!(p.double_value(&[0, 0]) > 0.9);
        // A loss over legal log-probabilities sends no gradient to illegal logits.
        let legal = logp.where_self(&mask, &Tensor::zeros_like(&logp));
        legal.sum(Kind::Float).backward();
        let g = logits.grad();
        assert_eq!(g.double_value(&[0, 1]), 0.0);
        assert_eq!(g.double_value(&[1, 0]), 0.0);
        assert!(g.double_value(&[0, 0]).abs() > 0.0);
    }

    #[test]
    fn the_plain_scorer_gives_the_networks_logits() {
        tch::manual_seed(4);
        let vs = nn::VarStore::new(Device::Cpu);
        let cfg = ModelConfig::default();
        let net = PolicyNet::new(&vs.root(), &cfg);
        let scorer = net.scorer();
        let d = 6;
        let dt = Tensor::randn([1, d, cfg.policy_table_out], (Kind::Float, Device::Cpu));
        // Device features as the MDP makes them: some negative, some zero.
        let cf = Tensor::randn([1, d, DEVICE_FEATURES], (Kind::Float, Device::Cpu)).relu()
            - Tensor::rand([1, d, DEVICE_FEATURES], (Kind::Float, Device::Cpu)) * 0.5;
        let cur = Tensor::randn([1, cfg.policy_table_out], (Kind::Float, Device::Cpu));
        let out = net.forward(
            &dt,
            &cf,
            &cur,
            &Tensor::zeros([1], (Kind::Float, Device::Cpu)),
        );
        let want = Vec::<f32>::try_from(out.logits.view([-1])).unwrap();
        let row = |t: &Tensor| Vec::<f32>::try_from(t.view([-1])).unwrap();
        let current = scorer.project_current(&row(&cur));
        let (mut scratch, mut state) = ([Vec::new(), Vec::new()], Vec::new());
        for (k, w) in want.iter().enumerate() {
            let k = k as i64;
            let tables = scorer.project_table(&row(&dt.get(0).get(k)));
            scorer.project_state_into(&row(&cf.get(0).get(k)), &mut scratch, &mut state);
            assert_eq!(state, scorer.project_state(&row(&cf.get(0).get(k))));
            let got = scorer.logit(&tables, &state, &current);
            assert!(
                (got - w).abs() < 1e-4 * (1.0 + w.abs()),
                "device {k}: {got} against {w}"
            );
        }
    }

    #[test]
    fn policy_scores_every_device_of_any_count() {
        tch::manual_seed(0);
        let vs = nn::VarStore::new(Device::Cpu);
        let cfg = ModelConfig::default();
        let net = PolicyNet::new(&vs.root(), &cfg);
        for d in [2i64, 4, 8] {
            let e = 5;
            let out = net.forward(
                &Tensor::randn([e, d, cfg.policy_table_out], (Kind::Float, Device::Cpu)),
                &Tensor::rand([e, d, DEVICE_FEATURES], (Kind::Float, Device::Cpu)),
                &Tensor::randn([e, cfg.policy_table_out], (Kind::Float, Device::Cpu)),
                &Tensor::full([e], 0.5, (Kind::Float, Device::Cpu)),
            );
            assert_eq!(out.logits.size(), vec![e, d]);
            assert_eq!(out.value.size(), vec![e]);
        }
        // Renaming devices permutes the scores and leaves the value alone.
        let dt = Tensor::randn([1, 3, cfg.policy_table_out], (Kind::Float, Device::Cpu));
        let cf = Tensor::rand([1, 3, DEVICE_FEATURES], (Kind::Float, Device::Cpu));
        let cur = Tensor::randn([1, cfg.policy_table_out], (Kind::Float, Device::Cpu));
        let prog = Tensor::zeros([1], (Kind::Float, Device::Cpu));
        let perm = Tensor::from_slice(&[2i64, 0, 1]);
        let a = net.forward(&dt, &cf, &cur, &prog);
        let b = net.forward(
            &dt.index_select(1, &perm),
            &cf.index_select(1, &perm),
            &cur,
            &prog,
        );
        assert!(close(&a.logits.index_select(1, &perm), &b.logits));
        assert!(close(&a.value, &b.value));
    }
}
