//! The networks' plain-array copies for fast inference: each cost-network
//! member's device heads ([`DeviceHeads`]) and the policy's per-device
//! score ([`PolicyScorer`]), and the hot loops they share, compiled for
//! AVX2 too and chosen at run time.

use std::cell::RefCell;

use multiversion::multiversion;
use tch::nn;
use tch::{Kind, Tensor};

use super::{Member, DEVICE_FEATURES};

/// The cost network's per-device heads (fwd, bwd, comm) as plain arrays,
/// for a search that costs thousands of devices in milliseconds without a
/// libtorch call. The heads' first layer is linear in the device
/// representation, which is a sum of table representations: so a table's
/// [`DeviceHeads::project`]ion can be computed once, and a device's hidden
/// layer is the sum of its tables' projections (a few hundred additions per
/// table and member) before [`DeviceHeads::finish`]. Equal to
/// [`super::CostNet::device_costs`] up to float rounding, ensembles included.
#[derive(Debug, Clone)]
pub struct DeviceHeads {
    pub(super) members: Vec<MemberHeads>,
    /// The device count of the task whose context the exchange heads hold
    /// (`None`: heads without context, good for any task of the tables).
    pub(super) devices: Option<usize>,
}

/// One member's three heads.
#[derive(Debug, Clone)]
pub(super) struct MemberHeads {
    /// Width of the representation the heads read (`out`).
    width: usize,
    /// Groups of `width` channels in the member's part of a table's
    /// representation, and of projections: `K + 1` with `K`
    /// widest-table dims (see [`super::CostNet::part`]).
    groups: usize,
    hidden: usize,
    /// Gated units per head (`model.cost_head_gates`).
    gates: usize,
    /// Each head's projection rows: its hidden layer's, then its gates'
    /// `u` and `v` (`stride()` rows per head); the three heads' one after
    /// the other: `[3·stride, width]` row-major.
    w1: Vec<f32>,
    /// Their biases `[3·stride]`, one set for each number `n` of
    /// widest-table flags set (`model.cost_wide_dims`, `K` of them, so
    /// `K + 1` sets): the first `n` flags' weights folded into the bias.
    /// The dims ascend, so a device wider than one is wider than those
    /// before it: its flags are always the first `n`.
    b1: Vec<f32>,
    /// The hidden layers' output weights `[3·hidden]` and biases `[3]`.
    w2: Vec<f32>,
    b2: Vec<f32>,
}

impl MemberHeads {
    /// The member's heads; `context` (the share `s` and the member's part
    /// `c` of the task's mean representation, see
    /// [`super::CostNet::context`]) where its exchange head reads them.
    /// `wide` of the heads' inputs, after the member's part of the device
    /// representation, are the widest-table flags.
    pub(super) fn of(m: &Member, wide: usize, context: Option<&[f32]>) -> MemberHeads {
        assert!(
            wide == 0 || context.is_none(),
            "widest-table flags and the exchange context are exclusive"
        );
        // Only the exchange head reads the context.
        let heads = [(&m.fwd, None), (&m.bwd, None), (&m.comm, context)];
        let gates = m
            .fwd
            .gates
            .as_ref()
            .map_or(0, |(u, _)| u.ws.size()[0] as usize);
        let width = m.fwd.head.l1.ws.size()[1] as usize - wide;
        let (mut w1, mut b1, mut w2, mut b2) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        // The flags' columns of every projection row, `[3·stride, wide]`.
        let mut on_flags = Vec::new();
        for (h, context) in heads {
            let mut rows = vec![dense(&h.head.l1)];
            if let Some((u, v)) = &h.gates {
                rows.extend([dense(u), dense(v)]);
            }
            for (w, b) in rows {
                let (w, b) = match context {
                    Some(ctx) => with_context(&w, &b, width, ctx),
                    None => (w, b),
                };
                for row in w.chunks_exact(width + wide) {
                    let (on_repr, flags) = row.split_at(width);
                    w1.extend_from_slice(on_repr);
                    on_flags.extend_from_slice(flags);
                }
                b1.extend(b);
            }
            let (w, b) = dense(&h.head.l2);
            w2.extend(w);
            b2.extend(b);
        }
        let b1 = (0..=wide)
            .flat_map(|set| {
                let on_flags = &on_flags;
                b1.iter().enumerate().map(move |(r, &b)| {
                    let flags = &on_flags[r * wide..(r + 1) * wide];
                    flags[..set].iter().fold(b, |acc, f| acc + f)
                })
            })
            .collect();
        MemberHeads {
            width,
            groups: wide + 1,
            hidden: m.fwd.head.l1.ws.size()[0] as usize,
            gates,
            w1,
            b1,
            w2,
            b2,
        }
    }

    /// Projection rows of one head.
    fn stride(&self) -> usize {
        self.hidden + 2 * self.gates
    }

    /// Width of the member's part of a representation.
    fn repr_width(&self) -> usize {
        self.groups * self.width
    }

    /// Length of the member's part of a projection: each group's.
    fn projected_width(&self) -> usize {
        self.groups * 3 * self.stride()
    }

    /// Projects each group of the member's part of a representation.
    fn project_into(&self, repr: &[f32], out: &mut Vec<f32>) {
        for group in repr.chunks_exact(self.width) {
            out.extend(self.w1.chunks_exact(self.width).map(|row| dot(row, group)));
        }
    }

    /// (fwd, bwd, comm) from a device's summed projections (the member's
    /// part) and the number of its widest-table flags set: the first
    /// group's projections plus those of the groups of the flags set.
    fn finish(&self, projected: &[f32], set: usize) -> [f32; 3] {
        let n = 3 * self.stride();
        if set == 0 {
            return self.heads(&projected[..n], set);
        }
        SUMMED.with_borrow_mut(|sum| {
            sum.clear();
            sum.extend_from_slice(&projected[..n]);
            for group in projected[n..].chunks_exact(n).take(set) {
                add_into(sum, group);
            }
            self.heads(sum, set)
        })
    }

    /// (fwd, bwd, comm) from one group's worth of projections (`3·stride`
    /// values) with the bias set for `set` flags.
    fn heads(&self, projected: &[f32], set: usize) -> [f32; 3] {
        let (h, g, stride) = (self.hidden, self.gates, self.stride());
        let n = 3 * stride;
        let b1 = &self.b1[set * n..(set + 1) * n];
        let mut out = relu_dots(projected, b1, &self.w2, h, stride);
        for (k, o) in out.iter_mut().enumerate() {
            *o += self.b2[k];
            if g > 0 {
                let at = k * stride;
                let (p, b) = (&projected[at..at + stride], &b1[at..at + stride]);
                *o += gated(&p[h..h + g], &b[h..h + g], &p[h + g..], &b[h + g..]);
            }
        }
        out
    }
}

thread_local! {
    /// A device's first group of projections plus its set groups, reused
    /// by every [`MemberHeads::finish`] on the thread (the search's hot
    /// loop), so a device beside a wide table costs no allocation.
    static SUMMED: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

impl DeviceHeads {
    /// How many widest-table counts end a representation and a projection
    /// (`model.cost_wide_dims`; 0: none): every member has one group of
    /// channels more.
    fn wide(&self) -> usize {
        self.members.first().map_or(0, |m| m.groups - 1)
    }

    /// The device count these heads hold the context of, if any: their
    /// costs are for plans on that many devices only.
    pub fn devices(&self) -> Option<usize> {
        self.devices
    }

    /// Width of the device representation the heads read (all members',
    /// then the widest-table counts).
    pub fn width(&self) -> usize {
        self.members.iter().map(|m| m.repr_width()).sum::<usize>() + self.wide()
    }

    /// Length of a projection: the three heads' hidden units and gates'
    /// two rows each, per member, then the widest-table counts (which
    /// add up over a device's tables as the rest does).
    pub fn projected_width(&self) -> usize {
        self.members
            .iter()
            .map(|m| m.projected_width())
            .sum::<usize>()
            + self.wide()
    }

    /// The heads' first layer without its bias: `W1 · repr`, member by
    /// member, then the representation's widest-table counts as they are.
    pub fn project(&self, repr: &[f32]) -> Vec<f32> {
        let mut out = Vec::with_capacity(self.projected_width());
        let mut at = 0;
        for m in &self.members {
            m.project_into(&repr[at..at + m.repr_width()], &mut out);
            at += m.repr_width();
        }
        out.extend_from_slice(&repr[at..at + self.wide()]);
        out
    }

    /// [`DeviceHeads::project`] of every row of `reps` (`[rows, width]`,
    /// row-major) by one matrix product per member: `[rows,
    /// projected_width]`, row-major. Equal to `project` row by row up to
    /// float rounding.
    pub fn project_rows(&self, reps: &[f32]) -> Vec<f32> {
        let (width, rows) = (self.width(), reps.len() / self.width().max(1));
        if rows == 0 || width == 0 {
            return Vec::new();
        }
        let (wide, r) = (self.wide() as i64, rows as i64);
        let reps = Tensor::from_slice(&reps[..rows * width]).view([r, width as i64]);
        let counts_at = width as i64 - wide;
        let mut at = 0;
        let parts: Vec<Tensor> = self
            .members
            .iter()
            .map(|m| {
                let (groups, w) = (m.groups as i64, m.width as i64);
                let w1 = Tensor::from_slice(&m.w1).view([3 * m.stride() as i64, w]);
                // Every group of channels as a row of its own: one product
                // projects them all, each group's after the one before.
                let part = reps
                    .narrow(1, at, groups * w)
                    .reshape([r * groups, w])
                    .matmul(&w1.tr())
                    .reshape([r, -1]);
                at += groups * w;
                part
            })
            .chain((wide > 0).then(|| reps.narrow(1, counts_at, wide)))
            .collect();
        crate::tensor_vec(&Tensor::cat(&parts, 1))
    }

    /// The ensemble's members.
    pub fn members(&self) -> usize {
        self.members.len()
    }

    /// Each member's (fwd, bwd, comm) from a device's summed projections
    /// (what [`DeviceHeads::finish`] averages).
    pub fn finish_each(&self, projected: &[f32]) -> Vec<[f32; 3]> {
        self.each(projected).collect()
    }

    /// (fwd, bwd, comm) from a device's summed projections: the members'
    /// mean.
    pub fn finish(&self, projected: &[f32]) -> [f32; 3] {
        let mut sum = [0.0f32; 3];
        for c in self.each(projected) {
            for k in 0..3 {
                sum[k] += c[k];
            }
        }
        let n = self.members.len().max(1) as f32;
        sum.map(|x| x / n)
    }

    /// Each member's heads on its own part of `projected`, in order.
    fn each<'a>(&'a self, projected: &'a [f32]) -> impl Iterator<Item = [f32; 3]> + 'a {
        // The widest-table flags set: counts of wider tables of at least
        // one (counts are sums of exact ones and zeros).
        let counts = &projected[projected.len() - self.wide()..];
        let set = counts.iter().filter(|&&c| c > 0.5).count();
        let mut at = 0;
        self.members.iter().map(move |m| {
            at += m.projected_width();
            m.finish(&projected[at - m.projected_width()..at], set)
        })
    }

    /// (fwd, bwd, comm) of a device whose summed table representation is
    /// `repr` (`width` values).
    pub fn costs(&self, repr: &[f32]) -> [f32; 3] {
        self.finish(&self.project(repr))
    }
}

/// `Σ a·b` in eight independent lanes, which the compiler turns into
/// vector instructions (a plain sum of products must keep its order).
/// Compiled also for AVX2 and chosen at run time where the processor has it,
/// like the other plain-array kernels here: the same lanes, so the same
/// result bit for bit (Rust never fuses a multiply and an add on its own).
#[multiversion(targets("x86_64+avx2+fma"))]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for k in 0..8 {
            lanes[k] += x[k] * y[k];
        }
    }
    lanes.iter().sum::<f32>() + tail
}

/// The three heads' `Σ w·max(p + b, 0)`: head `k`'s hidden units are
/// `p` and `b` from `k·stride` (`hidden` of them) and `w` from
/// `k·hidden`. Each head sums in eight independent lanes, as [`dot`]
/// (element `j` in lane `j % 8`). One call for the three heads, and a
/// plain comparison for the ReLU (with `f32::max` the loop compiled to
/// short, shuffled vectors): a device's heads take well under half the
/// time three calls did (docs/results.md, "The speed of `plan`", "The
/// cost heads in one pass").
#[multiversion(targets("x86_64+avx2+fma"))]
fn relu_dots(p: &[f32], b: &[f32], w: &[f32], hidden: usize, stride: usize) -> [f32; 3] {
    // Eight elements into the eight lanes: the one loop body, so that it
    // compiles to whole vectors.
    #[inline(always)]
    fn step(lanes: &mut [f32; 8], p: &[f32], b: &[f32], w: &[f32]) {
        for j in 0..8 {
            let x = p[j] + b[j];
            lanes[j] += w[j] * if x > 0.0 { x } else { 0.0 };
        }
    }
    let mut out = [0.0f32; 3];
    for (k, o) in out.iter_mut().enumerate() {
        let (at, wat) = (k * stride, k * hidden);
        let (p, b, w) = (
            &p[at..at + hidden],
            &b[at..at + hidden],
            &w[wat..wat + hidden],
        );
        let mut lanes = [0.0f32; 8];
        let (cp, cb, cw) = (p.chunks_exact(8), b.chunks_exact(8), w.chunks_exact(8));
        let (rp, rb, rw) = (cp.remainder(), cb.remainder(), cw.remainder());
        for ((p, b), w) in cp.zip(cb).zip(cw) {
            step(&mut lanes, p, b, w);
        }
        if !rp.is_empty() {
            // The leftovers, padded with zeros (which add nothing).
            let mut tail = [[0.0f32; 8]; 3];
            tail[0][..rp.len()].copy_from_slice(rp);
            tail[1][..rb.len()].copy_from_slice(rb);
            tail[2][..rw.len()].copy_from_slice(rw);
            step(&mut lanes, &tail[0], &tail[1], &tail[2]);
        }
        *o = lanes.iter().sum::<f32>();
    }
    out
}

/// `Σ (pu + bu) / (1 + max(pv + bv, 0))`: a cost head's gated units
/// ([`super::CostHead`]) from their projections and biases.
fn gated(pu: &[f32], bu: &[f32], pv: &[f32], bv: &[f32]) -> f32 {
    pu.iter()
        .zip(bu)
        .zip(pv.iter().zip(bv))
        .map(|((pu, bu), (pv, bv))| (pu + bu) / (1.0 + (pv + bv).max(0.0)))
        .sum()
}

/// An exchange head's layer on `[x, s·x, c, s]` (rows of `3·width + 1`)
/// folded for one context `[s, c]`: rows `A + s·B` of `width` on `x`, and
/// biases `b + C·c + e·s`. A device's costs then come from its own
/// tables' projections, as without context.
fn with_context(w: &[f32], b: &[f32], width: usize, ctx: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let (share, mean) = (ctx[0], &ctx[1..]);
    let row = 3 * width + 1;
    let mut folded = Vec::with_capacity(b.len() * width);
    let mut bias = Vec::with_capacity(b.len());
    for (r, &b) in w.chunks_exact(row).zip(b) {
        let (a, rest) = r.split_at(width);
        let (scaled, rest) = rest.split_at(width);
        let (on_mean, on_share) = rest.split_at(width);
        folded.extend(a.iter().zip(scaled).map(|(a, s)| a + share * s));
        bias.push(b + dot(on_mean, mean) + on_share[0] * share);
    }
    (folded, bias)
}

/// A linear layer's weight (`[out, in]`, row-major) and bias as plain
/// arrays.
pub(super) fn dense(l: &nn::Linear) -> (Vec<f32>, Vec<f32>) {
    let flat = |t: &Tensor| crate::tensor_vec::<f32>(&t.to_kind(Kind::Float));
    let w = flat(&l.ws);
    let b = match &l.bs {
        Some(b) => flat(b),
        None => vec![0.0; l.ws.size()[0] as usize],
    };
    (w, b)
}

/// A linear layer stored input-major (`[in, out]`): `W·x + b` as the bias
/// plus each input times its row, which vectorizes over the outputs and
/// skips the inputs a ReLU before it zeroed (about half of them).
#[derive(Debug, Clone)]
pub(super) struct InputMajor {
    w: Vec<f32>,
    b: Vec<f32>,
}

impl InputMajor {
    /// From a [`dense`] copy (`[out, in]`).
    pub(super) fn of((w, b): &(Vec<f32>, Vec<f32>)) -> InputMajor {
        let (out, inputs) = (b.len(), w.len() / b.len().max(1));
        let mut t = vec![0.0f32; w.len()];
        for (o, row) in w.chunks_exact(inputs.max(1)).enumerate() {
            for (i, &x) in row.iter().enumerate() {
                t[i * out + o] = x;
            }
        }
        InputMajor { w: t, b: b.clone() }
    }

    /// `y = W·x + b`, with a ReLU after it if `relu`.
    fn apply(&self, x: &[f32], y: &mut Vec<f32>, relu: bool) {
        y.clear();
        y.extend_from_slice(&self.b);
        for (&xi, row) in x.iter().zip(self.w.chunks_exact(self.b.len().max(1))) {
            if xi != 0.0 {
                add_scaled(y, xi, row);
            }
        }
        if relu {
            for v in y.iter_mut() {
                *v = v.max(0.0);
            }
        }
    }
}

/// `y += a·x`, element by element (see [`dot`]).
#[multiversion(targets("x86_64+avx2+fma"))]
fn add_scaled(y: &mut [f32], a: f32, x: &[f32]) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y += a * x;
    }
}

/// `minus -= x` and `plus += x`, element by element: a table's projection
/// moved from one device's sum to another's (compiled for AVX2 too, like `dot`).
#[multiversion(targets("x86_64+avx2+fma"))]
pub fn move_between(minus: &mut [f32], plus: &mut [f32], x: &[f32]) {
    for ((m, p), &x) in minus.iter_mut().zip(plus.iter_mut()).zip(x) {
        *m -= x;
        *p += x;
    }
}

/// `sum += x`, element by element (compiled for AVX2 too, like `dot`).
#[multiversion(targets("x86_64+avx2+fma"))]
pub fn add_into(sum: &mut [f32], x: &[f32]) {
    for (s, x) in sum.iter_mut().zip(x) {
        *s += x;
    }
}

/// The policy's device scores as plain arrays, for one greedy episode
/// without a libtorch call per step (`plan`). The score MLP's first layer is
/// linear in its three inputs (the device's summed table representations,
/// its state features through their MLP, the table being placed), so each
/// part is projected on its own: a table's projection once per episode, a
/// device's as the sum of its tables', the state part again at every step
/// (it depends on the table being placed). Equal to [`super::PolicyNet::forward`]'s logits up to float
/// rounding.
#[derive(Debug, Clone)]
pub struct PolicyScorer {
    pub(super) hidden: usize,
    pub(super) table_width: usize,
    /// The state features' MLP and the score's state part, input-major
    /// (computed for every device at every step).
    pub(super) cost1: InputMajor,
    pub(super) cost2: InputMajor,
    pub(super) cost: InputMajor,
    /// The score's first layer's table parts: `[hidden, table_width]`
    /// twice (as a device's table, as the table being placed), and its
    /// bias.
    pub(super) tables: Vec<f32>,
    pub(super) current: Vec<f32>,
    pub(super) b1: Vec<f32>,
    pub(super) w2: Vec<f32>,
    pub(super) b2: f32,
}

impl PolicyScorer {
    /// Length of every projection: the score's hidden units.
    pub fn hidden(&self) -> usize {
        self.hidden
    }

    fn project(w: &[f32], x: &[f32]) -> Vec<f32> {
        w.chunks_exact(x.len().max(1))
            .map(|row| dot(row, x))
            .collect()
    }

    /// A table's part as one of a device's tables (a policy table
    /// representation, `table_width` values); a device's part is its
    /// tables' sum.
    pub fn project_table(&self, repr: &[f32]) -> Vec<f32> {
        debug_assert_eq!(repr.len(), self.table_width);
        Self::project(&self.tables, repr)
    }

    /// A table's part as the table being placed.
    pub fn project_current(&self, repr: &[f32]) -> Vec<f32> {
        debug_assert_eq!(repr.len(), self.table_width);
        Self::project(&self.current, repr)
    }

    /// A device's part from its state features (`DEVICE_FEATURES` values).
    pub fn project_state(&self, features: &[f32]) -> Vec<f32> {
        let mut out = Vec::new();
        self.project_state_into(features, &mut [Vec::new(), Vec::new()], &mut out);
        out
    }

    /// [`PolicyScorer::project_state`] into `out`, with `scratch` for the
    /// hidden layers: no allocation once the buffers have grown.
    pub fn project_state_into(
        &self,
        features: &[f32],
        scratch: &mut [Vec<f32>; 2],
        out: &mut Vec<f32>,
    ) {
        debug_assert_eq!(features.len(), DEVICE_FEATURES as usize);
        let [h1, h2] = scratch;
        self.cost1.apply(features, h1, true);
        self.cost2.apply(h1, h2, true);
        self.cost.apply(h2, out, false);
    }

    /// A device's logit from its three parts.
    pub fn logit(&self, tables: &[f32], cost: &[f32], current: &[f32]) -> f32 {
        let mut lanes = [0.0f32; 8];
        for (j, ((((a, b), c), bias), w)) in tables
            .iter()
            .zip(cost)
            .zip(current)
            .zip(&self.b1)
            .zip(&self.w2)
            .enumerate()
        {
            lanes[j % 8] += w * (a + b + c + bias).max(0.0);
        }
        self.b2 + lanes.iter().sum::<f32>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The old per-head form: element `j` in lane `j % 8`, `f32::max`.
    fn reference(p: &[f32], b: &[f32], w: &[f32]) -> f32 {
        let mut lanes = [0.0f32; 8];
        for (j, ((p, b), w)) in p.iter().zip(b).zip(w).enumerate() {
            lanes[j % 8] += w * (p + b).max(0.0);
        }
        lanes.iter().sum()
    }

    /// `relu_dots` gives each head's reference sum bit for bit, for
    /// widths that fill the lanes and one that does not, with gates'
    /// rows between the heads, and inputs at zero, negative zero and
    /// below.
    #[test]
    fn the_heads_in_one_pass_sum_as_each_head_alone() {
        let value = |i: usize| match i % 7 {
            0 => 0.0,
            1 => -0.0,
            2 => -(i as f32) * 0.37,
            _ => ((i * 7919) % 113) as f32 / 17.0 - 3.0,
        };
        for (hidden, gates) in [(8, 0), (13, 0), (64, 0), (13, 3)] {
            let stride = hidden + 2 * gates;
            let p: Vec<f32> = (0..3 * stride).map(value).collect();
            let b: Vec<f32> = (0..3 * stride).map(|i| value(i + 5)).collect();
            let w: Vec<f32> = (0..3 * hidden).map(|i| value(i + 11)).collect();
            let got = relu_dots(&p, &b, &w, hidden, stride);
            for (k, g) in got.iter().enumerate() {
                let (at, wat) = (k * stride, k * hidden);
                let want = reference(
                    &p[at..at + hidden],
                    &b[at..at + hidden],
                    &w[wat..wat + hidden],
                );
                assert_eq!(g.to_bits(), want.to_bits(), "hidden {hidden}, head {k}");
            }
        }
    }
}
