//! `plan`'s guard: a learned plan is returned only where the cost network
//! can be trusted, and never in place of a heuristic's plan that the
//! network itself cannot rank below it.
//!
//! A cost network is only as good as the plans it learned from. Off its
//! training distribution it can be wrong by a factor, and the search on it
//! goes exactly where it is most wrong (a plan predicted 3.6 ms measured
//! 9.7 ms, 93 % slower than a heuristic, before this guard). So:
//!
//! 1. The heuristics' plans (`lookup`, `size_lookup`, `torchrec`, `dim`,
//!    `size`) are always candidates beside the learned plan.
//! 2. **Out of distribution**: a table feature outside the ranges the model
//!    was trained on ([`TrainedShapes::features_outside`]) means the
//!    network's figures are extrapolations. A warning names the features
//!    and tables. `plan` then returns a heuristic's plan, while any fits.
//!    A table only hotter than any trained one (its reuse past the top of
//!    the trained bins, as a table of a few rows has) is no doubt: the
//!    networks see it at the trained top instead ([`seen`]), and a
//!    warning says so.
//!    That is `torchrec`'s (TorchRec's own planner's), unless every member
//!    predicts the heuristic plan it ranks best cheaper than `torchrec`'s
//!    by `model.plan_margin`. Where `torchrec`'s does not fit, it is the
//!    heuristic plan the network ranks best. Why trust that ranking: the
//!    network errs most on the plans its own search finds. On the space
//!    validation tasks of docs/results.md its pick among the heuristics'
//!    plans was +0.2 % from the measured best on average. `torchrec`'s
//!    was +8 %, up to +124 %.
//! 3. **Disagreement**: a cost network of several members (an ensemble,
//!    `model.cost_members`) gives one prediction per member. The learned
//!    plan replaces the best heuristic plan only if *every* member predicts
//!    it cheaper, by `model.plan_margin` (2 %): where members disagree, the
//!    data did not settle the question (the ensemble's spread is the usual
//!    estimate of a network's epistemic uncertainty; Lakshminarayanan et
//!    al., 2017). The margin is for the search's optimism: it picks the
//!    plans the network underrates, so the learned plan's prediction runs
//!    lower than a heuristic plan's (the winner's curse). Of the ends of
//!    its searches that win so, and that the network predicts within
//!    `model.plan_tie` (1 %) of the lowest, the least crowded is returned
//!    (`least_crowded`): the network predicts crowded devices low.
//! 4. **A second opinion**: a run may ship a second cost network, trained
//!    apart with another architecture (the shipped model does). Its
//!    members must also all predict the learned plan cheaper than the best
//!    heuristic plan by the margin, or that heuristic plan is returned
//!    ([`second_opinion`]). Where every table's reuse bins are a CSV's
//!    defaults, that margin is `model.plan_margin_default_bins`
//!    ([`second_margin`]). Two architectures err on different plans; two
//!    draws of one recipe err alike.
//! 5. With an oracle at hand (`plan --verify`), the final candidates are
//!    measured and the measured best is returned. They include the other
//!    ends of `plan`'s searches ([`add_basins`]): the network ranks them
//!    near its pick, and it errs between such plans by a few percent.
//!
//! A task of a shape far from training (tables per device) only warns: on
//! the main job's model, such tasks still gained 5 to 7 % (docs/cluster.md).

use common::oracle::Oracle;
use common::{MemoryModel, Plan, Task};

use crate::baselines::Method;
use crate::model::Model;
use crate::shapes::TrainedShapes;

/// The heuristics whose plans are candidates, in the order they are tried.
pub const HEURISTICS: [Method; 5] = [
    Method::Lookup,
    Method::SizeLookup,
    Method::Torchrec,
    Method::Dim,
    Method::Size,
];

/// A plan that competed, with each cost-network member's prediction.
#[derive(Debug, Clone)]
pub struct Candidate {
    /// `policy` (the learned plan: episode and search) or a heuristic's name.
    pub method: &'static str,
    pub plan: Plan,
    /// Predicted iteration cost (ms), one per ensemble member.
    pub predicted: Vec<f64>,
    /// Measured iteration cost (ms), with `--verify`.
    pub measured: Option<f64>,
    /// Which of the runs ([`plan_jointly`]) proposed it: 0 with one run.
    pub run: usize,
}

impl Candidate {
    /// A candidate not yet measured, proposed by the first run.
    pub fn new(method: &'static str, plan: Plan, predicted: Vec<f64>) -> Candidate {
        Candidate {
            method,
            plan,
            predicted,
            measured: None,
            run: 0,
        }
    }

    /// The members' mean prediction.
    pub fn mean(&self) -> f64 {
        self.predicted.iter().sum::<f64>() / self.predicted.len().max(1) as f64
    }

    /// Whether the plan is the model's (the learned plan or another
    /// basin of its searches) rather than a heuristic's.
    pub fn learned(&self) -> bool {
        self.method == POLICY || self.method == BASIN
    }

    /// The highest member prediction: how a doubtful network ranks plans.
    pub fn pessimistic(&self) -> f64 {
        self.predicted
            .iter()
            .copied()
            .fold(f64::NEG_INFINITY, f64::max)
    }
}

/// What `plan` decided and why.
#[derive(Debug, Clone)]
pub struct Guarded {
    /// Every candidate; `chosen` indexes it.
    pub candidates: Vec<Candidate>,
    pub chosen: usize,
    /// Why the learned plan was not followed, one line each (empty when it
    /// was, or when a heuristic's plan was predicted cheaper anyway).
    pub doubts: Vec<String>,
    /// Warnings that did not change the choice (a shape far from
    /// training).
    pub notes: Vec<String>,
    /// The distinct ends of the searches `plan` ran (its learned plan's
    /// among them), each with the run that searched, lowest prediction
    /// first within a run: what [`add_basins`] adds for [`verify`]. They
    /// are distinct within a run; two runs may list the same plan. Empty
    /// where `plan` did not search from every start, or where no learned
    /// plan fits.
    pub basins: Vec<(usize, Plan)>,
}

impl Guarded {
    /// Whether a table feature lies outside what the model was trained
    /// on (a doubt that sets every learned plan aside).
    pub fn out_of_distribution(&self) -> bool {
        self.doubts
            .iter()
            .any(|d| d.starts_with(OUT_OF_DISTRIBUTION))
    }

    pub fn plan(&self) -> &Plan {
        &self.candidates[self.chosen].plan
    }

    pub fn method(&self) -> &'static str {
        self.candidates[self.chosen].method
    }

    /// The best heuristic candidate: by measurement when measured, else
    /// by the pessimistic prediction.
    pub fn best_heuristic(&self) -> Option<usize> {
        best_heuristic(&self.candidates)
    }

    /// Where the plan chosen is a learned one, not measured, that some
    /// member predicts under [`SURE_GAIN`] cheaper than the best heuristic
    /// plan: a win within the cost network's error on tables it did not
    /// train on. With several runs ([`judge_runs`]) every run's members
    /// count, and some may predict the plan dearer. `None` for a
    /// heuristic's plan, a measured choice, a task without a heuristic's
    /// plan, or a wide win.
    pub fn narrow_win(&self) -> Option<NarrowWin> {
        let chosen = &self.candidates[self.chosen];
        if !chosen.learned() || chosen.measured.is_some() {
            return None;
        }
        let rival = &self.candidates[self.best_heuristic()?];
        let gains = member_gains(chosen, rival);
        let (lo, hi) = min_max(&gains);
        // A hair under the line still counts as on it: a gain of exactly
        // 6 % computes as 5.999… in floating point.
        (lo < SURE_GAIN * 100.0 - 1e-9).then_some(NarrowWin {
            rival: rival.method,
            change_pct: [-hi, -lo],
        })
    }
}

/// The smallest predicted gain (a share, over every member) of a learned
/// plan over the best heuristic plan at which `plan` stops advising a
/// measurement. Chosen on validation draws of the table space
/// (docs/results.md, "Fresh draws and other shapes"): of the learned
/// plans every member predicted 6 % cheaper or more, none measured over
/// 1 % slower than that heuristic plan; of those under 6 %, 3 of 46 did.
/// On the test draws, 2 of 64 over the line did, and 14 of 69 under it.
pub const SURE_GAIN: f64 = 0.06;

/// A learned plan chosen by a predicted gain under [`SURE_GAIN`] over the
/// best heuristic plan ([`Guarded::narrow_win`]).
#[derive(Debug, Clone, PartialEq)]
pub struct NarrowWin {
    /// The best heuristic candidate's method.
    pub rival: &'static str,
    /// The members' predicted cost of the learned plan against the
    /// rival's, in percent, from the most to the least change: below zero
    /// where cheaper (above zero: that member predicts it dearer), as the
    /// warning and the placement JSON give it.
    pub change_pct: [f64; 2],
}

impl std::fmt::Display for NarrowWin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the cost network's members predict the learned plan {:+.1} % to {:+.1} % against \
             `{}`'s: a win under {} % is within its error on tables it did not train on",
            self.change_pct[0],
            self.change_pct[1],
            self.rival,
            SURE_GAIN * 100.0
        )
    }
}

/// Each member's predicted gain of `a` over `b`, in percent of `b`'s
/// prediction.
fn member_gains(a: &Candidate, b: &Candidate) -> Vec<f64> {
    gains(&a.predicted, &b.predicted)
}

/// [`member_gains`] of predictions `a` over `b`.
fn gains(a: &[f64], b: &[f64]) -> Vec<f64> {
    a.iter()
        .zip(b)
        .map(|(p, q)| (q - p) / q.abs().max(1e-9) * 100.0)
        .collect()
}

/// The smallest and largest of `values` (infinities when empty).
fn min_max(values: &[f64]) -> (f64, f64) {
    values
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &g| {
            (a.min(g), b.max(g))
        })
}

/// [`Guarded::best_heuristic`] of `candidates`.
fn best_heuristic(candidates: &[Candidate]) -> Option<usize> {
    let key = |c: &Candidate| c.measured.unwrap_or(c.pessimistic());
    (0..candidates.len())
        .filter(|&i| !candidates[i].learned())
        .min_by(|&a, &b| key(&candidates[a]).total_cmp(&key(&candidates[b])))
}

/// How a doubt of distribution starts.
const OUT_OF_DISTRIBUTION: &str = "out of distribution";

/// The learned plan's name among the candidates.
pub const POLICY: &str = "policy";

/// The name of the other ends of `plan`'s searches among the candidates
/// ([`add_basins`]).
pub const BASIN: &str = "basin";

/// The task as the networks see it: `task` itself, or a copy whose tables
/// hotter than any trained one take the nearest trained reuse
/// ([`TrainedShapes::nearest_trained_reuse`]), with a note naming them.
/// Plans of the copy are plans of `task`: only reuse bins differ, and
/// memory does not depend on them.
pub fn seen<'t>(
    shapes: Option<&TrainedShapes>,
    task: &'t Task,
) -> (std::borrow::Cow<'t, Task>, Option<String>) {
    let moved = hotter_than_trained(shapes, &task.tables);
    if moved.is_empty() {
        return (std::borrow::Cow::Borrowed(task), None);
    }
    let mut copy = task.clone();
    for &(i, bins) in &moved {
        copy.tables[i].bins = bins;
    }
    const SHOWN: usize = 3;
    let names: Vec<String> = (moved.iter().take(SHOWN))
        .map(|&(i, _)| format!("`{}`", task.tables[i].name))
        .collect();
    let more = match moved.len() > SHOWN {
        true => format!(" and {} more", moved.len() - SHOWN),
        false => String::new(),
    };
    let top = |bins: &[f64]| bins.last().copied().unwrap_or(0.0);
    let hottest = moved
        .iter()
        .map(|&(i, _)| top(&task.tables[i].bins))
        .fold(0.0, f64::max);
    let trained = moved.iter().map(|&(_, b)| top(&b)).fold(0.0, f64::max);
    let (verb, them) = match moved.len() {
        1 => ("is", "it"),
        _ => ("are", "them"),
    };
    let note = format!(
        "{}{more} ({} of {} tables) {verb} hotter than any table the model was trained on \
         (bin_16 up to {hottest:.3}, trained at most {trained:.3}): the networks priced {them} at \
         the nearest reuse they were trained on, as hot as they know (rows read this often sit \
         in cache either way)",
        names.join(", "),
        moved.len(),
        task.tables.len(),
    );
    (std::borrow::Cow::Owned(copy), Some(note))
}

/// The tables of `tables` hotter than any trained one, by index, with the
/// bins the networks see for each.
fn hotter_than_trained(
    shapes: Option<&TrainedShapes>,
    tables: &[common::Table],
) -> Vec<(usize, [f64; common::table::NUM_BINS])> {
    let Some(shapes) = shapes else {
        return Vec::new();
    };
    (tables.iter().enumerate())
        .filter_map(|(i, t)| shapes.nearest_trained_reuse(t).map(|b| (i, b)))
        .collect()
}

/// `tables` as a run's networks see them ([`seen`]).
pub fn seen_tables<'t>(
    shapes: Option<&TrainedShapes>,
    tables: &'t [common::Table],
) -> std::borrow::Cow<'t, [common::Table]> {
    let moved = hotter_than_trained(shapes, tables);
    if moved.is_empty() {
        return std::borrow::Cow::Borrowed(tables);
    }
    let mut copy = tables.to_vec();
    for (i, bins) in moved {
        copy[i].bins = bins;
    }
    std::borrow::Cow::Owned(copy)
}

/// Places `task` with `model`, guarded (see the module's doc). `shapes`:
/// what the model was trained on, when known. Fails only when no
/// candidate fits memory. The networks see the task as [`seen`] gives
/// it; the candidates are plans of `task`.
pub fn plan(
    model: &Model,
    shapes: Option<&TrainedShapes>,
    task: &Task,
    mem: &MemoryModel,
) -> anyhow::Result<Guarded> {
    let (task, hotter) = seen(shapes, task);
    let task = task.as_ref();
    let kept = model.plan_keeping(task, mem);
    let mut candidates = Vec::new();
    if !kept.infeasible {
        candidates.push((POLICY, kept.plan));
    }
    let found = HEURISTICS.iter().map(|&m| {
        (
            m,
            crate::baselines::plans_for(task, mem, model.batch, &[m]).next(),
        )
    });
    for (method, plan) in found {
        if let Some(plan) = plan {
            candidates.push((method.name(), plan));
        }
    }
    anyhow::ensure!(
        !candidates.is_empty(),
        "{}: neither the policy nor any heuristic found a placement that fits {} GiB per \
         device; first-fit decreasing by bytes packs its tables at {:.3} GiB per device: give \
         each device that, or use more devices",
        task.name,
        task.memory_gb,
        task.packed_memory_gb_shown(mem)
    );
    // The other ends of the searches, priced with the candidates, for
    // the choice between near-equal learned plans (`least_crowded`).
    let learned_first = matches!(candidates.first(), Some((POLICY, _)));
    let to_plan = |assignment: &Vec<usize>| Plan {
        devices: task.devices,
        assignment: assignment.clone(),
    };
    let basins: Vec<(usize, Plan)> = match (learned_first, model.searches_every_start(task.devices))
    {
        (true, true) => std::iter::once(candidates[0].1.clone())
            .chain(kept.others.iter().map(to_plan))
            .map(|p| (0, p))
            .collect(),
        _ => Vec::new(),
    };
    let others: Vec<Plan> = (kept.others.into_iter())
        .filter(|_| learned_first)
        .map(|assignment| Plan {
            devices: task.devices,
            assignment,
        })
        .filter(|o| candidates.iter().all(|(_, p)| p != o))
        .collect();
    let plans: Vec<&Plan> = candidates.iter().map(|(_, p)| p).chain(&others).collect();
    let mut predicted = model.member_costs_for(&kept.episodes, &task.tables, &plans);
    let others: Vec<Candidate> = others
        .into_iter()
        .zip(predicted.split_off(candidates.len()))
        .map(|(plan, predicted)| Candidate::new(POLICY, plan, predicted))
        .collect();
    let candidates: Vec<Candidate> = candidates
        .into_iter()
        .zip(predicted)
        .map(|((method, plan), predicted)| Candidate::new(method, plan, predicted))
        .collect();
    let mut notes: Vec<String> = hotter.into_iter().collect();
    let mut doubts = Vec::new();
    if let Some(shapes) = shapes {
        if let Some(far) = shapes.outside(task.tables.len(), task.devices) {
            notes.push(format!(
                "{far}: its plans can lose to the heuristics this far out; `--verify sim` \
                 measures the candidates, or {}",
                TrainedShapes::ADVICE
            ));
        }
        for f in shapes.features_outside(&task.tables) {
            doubts.push(format!("{OUT_OF_DISTRIBUTION}: {f}"));
        }
    }
    let mut guarded = Guarded {
        candidates,
        chosen: 0,
        doubts,
        notes,
        basins,
    };
    let margin = model.plan_cfg.plan_margin;
    guarded.chosen = choose(&guarded, margin);
    if let (0, Some(h), true) = (
        guarded.chosen,
        guarded.best_heuristic(),
        guarded.doubts.is_empty(),
    ) {
        let rival = &guarded.candidates[h];
        let tie = model.plan_cfg.plan_tie;
        if let Some(k) = least_crowded(&guarded.candidates[0], &others, rival, margin, tie) {
            guarded.candidates[0] = others.into_iter().nth(k).expect("an index of others");
        }
    }
    if guarded.candidates[0].method == POLICY && guarded.chosen != 0 && guarded.doubts.is_empty() {
        let (learned, h) = (&guarded.candidates[0], &guarded.candidates[guarded.chosen]);
        if let Some(why) = disagreement(learned, h, margin) {
            guarded.doubts.push(why);
        }
    }
    Ok(guarded)
}

/// Which of `others` (the other ends of `plan`'s searches) to return in
/// place of `learned`, the learned plan the guard chose over `rival`, the
/// best heuristic plan: of the plans every member predicts cheaper than
/// `rival` by `margin`, those whose mean prediction lies within `tie` (a
/// share, `model.plan_tie`) of the lowest, the one with the fewest tables
/// on its most crowded device (the lower mean prediction, then `learned`,
/// on a tie). `None` keeps `learned`, as does a `tie` of 0.
///
/// Why: the network predicts crowded devices low (docs/results.md, "The
/// exchange reads the task"; `space-trace-0009` of "Fresh draws and other
/// shapes": 44 tables on a device, its forward predicted 26 % low). Plans
/// it predicts within 1 % of each other are a tie within its error, and
/// the less crowded one is the safer pick ("Near ties go to the less
/// crowded plan").
fn least_crowded(
    learned: &Candidate,
    others: &[Candidate],
    rival: &Candidate,
    margin: f64,
    tie: f64,
) -> Option<usize> {
    if tie <= 0.0 {
        return None;
    }
    // Each plan that passes: its index in `others` (none for `learned`),
    // its tables on the most crowded device and its mean prediction.
    let passing: Vec<(Option<usize>, usize, f64)> = std::iter::once((None, learned))
        .chain(
            (others.iter().enumerate())
                .filter(|(_, o)| cheaper_by(o, rival, margin))
                .map(|(k, o)| (Some(k), o)),
        )
        .map(|(k, c)| (k, most_on_a_device(&c.plan), c.mean()))
        .collect();
    let lowest = passing.iter().map(|p| p.2).fold(f64::INFINITY, f64::min);
    passing
        .into_iter()
        .filter(|p| p.2 <= lowest + tie * lowest.abs())
        .min_by(|a, b| a.1.cmp(&b.1).then(a.2.total_cmp(&b.2)))
        .and_then(|p| p.0)
}

/// The tables on `plan`'s most crowded device.
pub fn most_on_a_device(plan: &Plan) -> usize {
    let mut on = vec![0usize; plan.devices];
    for &d in &plan.assignment {
        on[d] += 1;
    }
    on.into_iter().max().unwrap_or(0)
}

/// A trained run that `plan` places with: its model, the shapes it was
/// trained on when known, and the model whose veto it ships with, if any
/// ([`second_opinion`]).
#[derive(Clone, Copy)]
pub struct Trained<'a> {
    pub model: &'a Model,
    pub shapes: Option<&'a TrainedShapes>,
    pub second: Option<&'a Model>,
}

impl<'a> Trained<'a> {
    /// A run with no second opinion.
    pub fn alone(model: &'a Model, shapes: Option<&'a TrainedShapes>) -> Trained<'a> {
        Trained {
            model,
            shapes,
            second: None,
        }
    }

    /// [`plan`] with this run, then the veto of its second opinion, at
    /// [`second_margin`].
    pub fn plan(&self, task: &Task, mem: &MemoryModel) -> anyhow::Result<Guarded> {
        let mut g = plan(self.model, self.shapes, task, mem)?;
        if let Some(second) = self.second {
            // The margin from the tables as given (defaults or not), the
            // prices from the tables as the first network saw them.
            let margin = second_margin(&self.model.plan_cfg, &task.tables);
            let seen = seen_tables(self.shapes, &task.tables);
            second_opinion(&mut g, second, &seen, margin);
        }
        Ok(g)
    }
}

/// The margin a second opinion asks for on `tables`, with the setting
/// that gives it: `model.plan_margin_default_bins` where every table's
/// reuse bins are a CSV's defaults (guessed), else `model.plan_margin`.
///
/// Why: on tables without bins nearly every learned plan that loses is
/// one both networks overrate alike. A wider margin there cut such
/// losers by a ninth to a third on draws of user CSVs and cost under 0.3
/// points on another family. Where the bins are given it would cost the
/// space suites (docs/results.md, "A wider second opinion where the bins
/// are guessed").
pub fn second_margin(cfg: &common::config::ModelConfig, tables: &[common::Table]) -> Margin {
    match !tables.is_empty() && tables.iter().all(common::Table::has_default_bins) {
        true => Margin {
            share: cfg.plan_margin_default_bins,
            setting: "model.plan_margin_default_bins: every table's reuse bins are a CSV's \
                      defaults",
        },
        false => Margin::plan_margin(cfg.plan_margin),
    }
}

/// A margin (a share: 0.02 is 2 %) and the setting it comes from, for
/// the doubt that names it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Margin {
    pub share: f64,
    pub setting: &'static str,
}

impl Margin {
    /// `model.plan_margin`'s value.
    pub fn plan_margin(share: f64) -> Margin {
        Margin {
            share,
            setting: "model.plan_margin",
        }
    }
}

/// How a second opinion's doubt starts.
pub const SECOND_OPINION: &str = "second opinion";

/// Vetoes `g`'s learned plan unless every member of `second`, a cost
/// network trained apart with another architecture, also predicts it
/// cheaper than the best heuristic plan by `margin` ([`second_margin`]).
/// A veto returns that heuristic plan, with a
/// doubt that gives `second`'s predictions. Nothing changes where `g`
/// chose a heuristic's plan, had doubts already, or was measured.
///
/// Why: the shipped model's losses off its training draws come from
/// plans its members all overrate alike. A network of another
/// architecture (no gated units in its cost heads) errs on other plans
/// (docs/results.md, "A second opinion from the model before"). Draws of
/// one recipe err alike, and vetoed nothing useful ("A second opinion
/// from another pre-training draw").
pub fn second_opinion(g: &mut Guarded, second: &Model, tables: &[common::Table], margin: Margin) {
    let Some((chosen, h)) = vetoable(g) else {
        return;
    };
    let (plan, rival) = (&g.candidates[chosen].plan, &g.candidates[h].plan);
    let priced = second.member_costs(tables, &[plan, rival]);
    if let Some(why) = veto(&g.candidates[h], &priced[0], &priced[1], margin) {
        g.doubts.push(why);
        g.chosen = h;
    }
}

/// The learned plan chosen and the best heuristic candidate, which a
/// second opinion compares; `None` where it has nothing to veto: a
/// heuristic's plan chosen, a measured choice, doubts already, or no
/// heuristic plan that fits.
fn vetoable(g: &Guarded) -> Option<(usize, usize)> {
    let chosen = &g.candidates[g.chosen];
    if !chosen.learned() || chosen.measured.is_some() || !g.doubts.is_empty() {
        return None;
    }
    Some((g.chosen, g.best_heuristic()?))
}

/// The doubt of a second opinion whose members price the learned plan
/// at `a` and heuristic plan `rival` at `b`, or `None` where
/// every one predicts it cheaper by `margin`.
fn veto(rival: &Candidate, a: &[f64], b: &[f64], margin: Margin) -> Option<String> {
    if all_cheaper(a, b, margin.share) {
        return None;
    }
    let (lo, hi) = min_max(&gains(a, b));
    Some(format!(
        "{SECOND_OPINION}: the {} members of the second cost network predict the learned plan \
         from {:+.2} % to {:+.2} % against `{}`'s, and it must be {:.1} % cheaper for every \
         one ({}; `--no-second-opinion` follows the first network alone)",
        a.len(),
        -hi,
        -lo,
        rival.method,
        margin.share * 100.0,
        margin.setting
    ))
}

/// Places `task` with several runs trained apart (other seeds of one
/// configuration). Each run's guard chooses as [`plan`] does. Of their
/// choices, the one that all the runs' cost networks predict cheapest
/// (the mean over every member of every run) is returned. One run: the
/// same as [`plan`].
///
/// Why: two fine-tuned runs differ, in their policies and their cost
/// networks, most on densities they did not train on. Each run's choice
/// already passed its own guard; the ensemble of both networks then
/// judges between them, which averages out one run's mistakes
/// (docs/results.md, "Two runs plan together").
///
/// The near-tie rule (`model.plan_tie`) chooses within each run. The
/// runs' choices are then judged by their lowest mean prediction alone, so
/// a run's less crowded near tie may lose to another run's more crowded
/// choice. The rule between runs as well lost mean on pairs of the main
/// job (docs/results.md, "Near ties between runs: not kept").
///
/// Every candidate of every run is kept once (`merge`), priced by every
/// run's members, so `--compare` and [`verify`] see them all. Where any
/// run finds a table out of its distribution, only such runs' choices
/// compete (`judge`). Where every competing run fell back to a
/// heuristic's plan, the heuristic is the one a guard of every run's
/// members would choose, with the first run's `model.plan_margin`. The
/// doubts are those of the run whose choice won (every run's where no
/// run chose that heuristic alone); the notes, every run's.
pub fn plan_jointly(runs: &[Trained], task: &Task, mem: &MemoryModel) -> anyhow::Result<Guarded> {
    let (first, others) = runs
        .split_first()
        .ok_or_else(|| anyhow::anyhow!("no trained run to place with"))?;
    if others.is_empty() {
        return first.plan(task, mem);
    }
    // One after another: libtorch's modules cannot be shared between
    // threads (a caller owning the models can run them on threads of
    // their own, then call [`judge_runs`]).
    let guards = runs
        .iter()
        .map(|r| r.plan(task, mem))
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(judge_runs(&guards, runs, task))
}

/// The second half of [`plan_jointly`]: each run's guarded choice
/// (`guards`, one per run of `runs`, in order), merged, priced by every
/// run's members (each seeing the tables as [`seen_tables`] gives them)
/// and judged.
pub fn judge_runs(guards: &[Guarded], runs: &[Trained], task: &Task) -> Guarded {
    let (mut candidates, picks) = merge(guards);
    let plans: Vec<&Plan> = candidates.iter().map(|c| &c.plan).collect();
    let priced = joint_costs(runs, &task.tables, &plans);
    for (c, predicted) in candidates.iter_mut().zip(priced) {
        c.predicted = predicted;
    }
    // The runs may be placed with other margins: the first run's rules.
    let margin = runs.first().map_or(0.0, |r| r.model.plan_cfg.plan_margin);
    let (by, chosen) = judge(guards, &candidates, &picks, margin);
    // A heuristic no run chose alone: each run's reasons for setting its
    // learned plan aside, not one run's alone.
    let whose: Vec<&Guarded> = match by {
        Some(r) => vec![&guards[r]],
        None => guards.iter().collect(),
    };
    Guarded {
        candidates,
        chosen,
        doubts: lines_once(whose.iter().map(|g| &g.doubts)),
        notes: lines_once(guards.iter().map(|g| &g.notes)),
        basins: (guards.iter().enumerate())
            .flat_map(|(run, g)| g.basins.iter().map(move |(_, p)| (run, p.clone())))
            .collect(),
    }
}

/// The lines of every list, in order, each once.
fn lines_once<'a>(lists: impl Iterator<Item = &'a Vec<String>>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for l in lists.flatten() {
        if !out.contains(l) {
            out.push(l.clone());
        }
    }
    out
}

/// Every run's candidates once, in run order, unpriced, and where each
/// run's choice lies among them. A heuristic's plan is the same in every
/// run: it is kept once, by name. A learned plan (or basin) is kept once
/// by plan, apart from the heuristics' even where it places alike (as
/// [`plan`] keeps it), named by the first run that proposed it.
fn merge(guards: &[Guarded]) -> (Vec<Candidate>, Vec<usize>) {
    let mut candidates: Vec<Candidate> = Vec::new();
    let mut picks = Vec::with_capacity(guards.len());
    for (run, g) in guards.iter().enumerate() {
        for (k, c) in g.candidates.iter().enumerate() {
            let same = |o: &Candidate| match c.learned() {
                true => o.learned() && o.plan == c.plan,
                false => o.method == c.method,
            };
            let at = candidates.iter().position(same).unwrap_or_else(|| {
                candidates.push(Candidate {
                    run,
                    predicted: Vec::new(),
                    ..c.clone()
                });
                candidates.len() - 1
            });
            if k == g.chosen {
                picks.push(at);
            }
        }
    }
    (candidates, picks)
}

/// Which run's choice to return (`None` for a heuristic no competing
/// run chose alone), and where it lies among `candidates`:
/// the one all members price lowest (the earlier run on a tie). Where any
/// run finds the task out of its distribution, only such runs' choices
/// (heuristics' plans) compete: a run with no doubt, trained elsewhere or
/// with no record of its shapes, must not bring a learned plan past them.
///
/// Where every competing run fell back to a heuristic's plan, the
/// heuristic is chosen as one run's guard would choose it, with every
/// run's members (`fallback`): the lowest worst-member prediction,
/// or out of distribution `torchrec`'s unless beaten by `margin`. So,
/// within the distribution, the choice is the best heuristic that `plan`
/// reports. It may be a heuristic no single run chose.
fn judge(
    guards: &[Guarded],
    candidates: &[Candidate],
    picks: &[usize],
    margin: f64,
) -> (Option<usize>, usize) {
    let far: Vec<usize> = (0..guards.len())
        .filter(|&r| guards[r].out_of_distribution())
        .collect();
    let doubtful = !far.is_empty();
    let eligible = match doubtful {
        true => far,
        false => (0..guards.len()).collect(),
    };
    let all_heuristic = eligible.iter().all(|&r| !candidates[picks[r]].learned());
    if let Some(h) = best_heuristic(candidates).filter(|_| all_heuristic) {
        let chosen = fallback(candidates, h, doubtful, margin);
        let by = eligible.iter().copied().find(|&r| picks[r] == chosen);
        return (by, chosen);
    }
    let by = eligible
        .into_iter()
        .min_by(|&a, &b| {
            candidates[picks[a]]
                .mean()
                .total_cmp(&candidates[picks[b]].mean())
                .then(a.cmp(&b))
        })
        .expect("one choice per run");
    (Some(by), picks[by])
}

/// Every run's member predictions of each plan, one after another: the
/// members of an ensemble of runs. Each run's networks see the tables as
/// [`seen_tables`] gives them.
fn joint_costs(runs: &[Trained], tables: &[common::Table], plans: &[&Plan]) -> Vec<Vec<f64>> {
    let mut joint = vec![Vec::new(); plans.len()];
    for r in runs {
        let seen = seen_tables(r.shapes, tables);
        for (all, p) in joint.iter_mut().zip(r.model.member_costs(&seen, plans)) {
            all.extend(p);
        }
    }
    joint
}

/// The candidate to return: the learned plan if there are no doubts of
/// distribution and every member predicts it cheaper than the best
/// heuristic plan by `margin` (a share); else that heuristic plan. Out of
/// distribution, a heuristic plan while any fits. The network's ranking is
/// then trusted only past the margin: `torchrec`'s plan (what TorchRec's
/// own planner would give), unless every member predicts the best
/// heuristic plan cheaper than it by `margin`.
fn choose(g: &Guarded, margin: f64) -> usize {
    let Some(h) = g.best_heuristic() else {
        return 0;
    };
    let c = &g.candidates;
    if !g.doubts.is_empty() {
        return fallback(c, h, true, margin);
    }
    if c[0].method == POLICY && cheaper_by(&c[0], &c[h], margin) {
        0
    } else {
        h
    }
}

/// The heuristic plan to return in place of a learned one, `h` being the
/// best heuristic candidate: `h` itself, or out of distribution
/// (`doubtful`) `torchrec`'s unless every member predicts `h` cheaper by
/// `margin`.
fn fallback(c: &[Candidate], h: usize, doubtful: bool, margin: f64) -> usize {
    match c.iter().position(|x| x.method == Method::Torchrec.name()) {
        Some(t) if doubtful && !cheaper_by(&c[h], &c[t], margin) => t,
        _ => h,
    }
}

/// Whether every member predicts `a` cheaper than `b` by `margin` (a
/// share of `b`): the guard's test of a learned plan.
pub fn cheaper_by(a: &Candidate, b: &Candidate, margin: f64) -> bool {
    all_cheaper(&a.predicted, &b.predicted, margin)
}

/// [`cheaper_by`] of predictions `a` and `b`, member by member.
pub fn all_cheaper(a: &[f64], b: &[f64], margin: f64) -> bool {
    a.iter().zip(b).all(|(p, q)| q - p >= margin * q.abs())
}

/// Why the learned plan was set aside for heuristic plan `h` although some
/// member predicts it cheaper (members that disagree, or a gain under
/// `margin`), or `None` when every member predicts it no cheaper (a plain
/// loss, not a doubt).
fn disagreement(learned: &Candidate, h: &Candidate, margin: f64) -> Option<String> {
    let gains = member_gains(learned, h);
    let (lo, hi) = min_max(&gains);
    (hi > 0.0).then(|| {
        let what = if lo > 0.0 {
            format!("all {} members of the cost network", gains.len())
        } else {
            format!("the cost network's {} members disagree: they", gains.len())
        };
        format!(
            "{what} predict the learned plan from {:+.2} % to {:+.2} % against `{}`'s, \
             and it must be {:.1} % cheaper for every one (model.plan_margin)",
            -hi,
            -lo,
            h.method,
            margin * 100.0
        )
    })
}

/// Adds the other distinct ends of `plan`'s searches ([`Guarded::basins`],
/// kept as it planned: nothing is searched again) as candidates named
/// [`BASIN`], for [`verify`] to measure; a plan already among the
/// candidates is not added again. `models`: the run's model, or every
/// run's for [`plan_jointly`] (each run's basins, priced by all). Returns
/// how many were added. The choice without measurement does not change.
/// The network ranks these plans below the learned one, or within
/// `model.plan_tie` of it and more crowded (the plan it predicts lowest,
/// where the learned plan is a less crowded near tie). Measured, one of
/// them is sometimes faster (docs/results.md, "`--verify` measures the
/// other basins").
pub fn add_basins(g: &mut Guarded, runs: &[Trained], task: &Task) -> usize {
    let mut basins: Vec<(usize, Plan)> = Vec::new();
    for (run, plan) in &g.basins {
        let known = g.candidates.iter().any(|c| c.plan == *plan);
        if !known && basins.iter().all(|(_, b)| b != plan) {
            basins.push((*run, plan.clone()));
        }
    }
    if basins.is_empty() {
        return 0;
    }
    let refs: Vec<&Plan> = basins.iter().map(|(_, p)| p).collect();
    let predicted = joint_costs(runs, &task.tables, &refs);
    let added = basins.len();
    g.candidates.extend(
        basins
            .into_iter()
            .zip(predicted)
            .map(|((run, plan), predicted)| Candidate {
                method: BASIN,
                plan,
                predicted,
                measured: None,
                run,
            }),
    );
    added
}

/// Measures every candidate on `oracle` and chooses the measured best (the
/// learned plan on a tie). A plan that several candidates give is measured
/// once, and they all take that measurement. A candidate the oracle fails
/// on is left out (with a warning); it fails only when none was measured. Returns the
/// largest repeat-to-repeat spread of a measurement (interquartile range
/// over the median) for oracles that time real work: gains under it are
/// ties.
pub fn verify(
    g: &mut Guarded,
    tables: &[common::Table],
    oracle: &mut dyn Oracle,
) -> anyhow::Result<Option<f64>> {
    let mut first_error = None;
    let mut spread: Option<f64> = None;
    // A slow oracle (`cpu`, `cuda`) says how far it has got.
    let (start, n) = (std::time::Instant::now(), g.candidates.len());
    let slow = std::time::Duration::from_secs(2);
    for k in 0..n {
        // A plan two methods give, its devices relabelled or not, is
        // measured once: on a timed oracle two measurements of one plan
        // differ by noise alone, and noise would pick between them.
        let twin = (0..k).find(|&j| {
            same_groups(&g.candidates[j].plan, &g.candidates[k].plan)
                && g.candidates[j].measured.is_some()
        });
        if let Some(j) = twin {
            g.candidates[k].measured = g.candidates[j].measured;
            continue;
        }
        let c = &mut g.candidates[k];
        match oracle.measure(tables, &c.plan) {
            Ok(m) => {
                c.measured = Some(m.cost_ms);
                if let Some(s) = oracle.spread() {
                    spread = Some(spread.unwrap_or(0.0).max(s.relative_iqr()));
                }
                if start.elapsed() > slow {
                    tracing::info!(
                        "--verify {}: `{}` measured {:.3} ms ({} of {n}, {:.0} s so far)",
                        oracle.name(),
                        c.method,
                        m.cost_ms,
                        k + 1,
                        start.elapsed().as_secs_f64()
                    );
                }
            }
            Err(e) => {
                tracing::warn!(
                    "--verify: {} could not measure `{}`'s plan: {e}",
                    oracle.name(),
                    c.method
                );
                first_error.get_or_insert(e);
            }
        }
    }
    let best = (0..g.candidates.len())
        .filter_map(|i| g.candidates[i].measured.map(|m| (i, m)))
        .min_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
    match best {
        Some((i, _)) => {
            g.chosen = i;
            Ok(spread)
        }
        None => Err(anyhow::anyhow!(
            "--verify: {} measured none of the {} candidates ({})",
            oracle.name(),
            g.candidates.len(),
            first_error.map_or_else(String::new, |e| e.to_string())
        )),
    }
}

/// Whether two plans place the same tables together, whatever their
/// devices are called: on devices alike, one plan.
fn same_groups(a: &Plan, b: &Plan) -> bool {
    use crate::mdp::numbered_by_first_use as numbered;
    a.devices == b.devices && numbered(&a.assignment) == numbered(&b.assignment)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(method: &'static str, predicted: &[f64]) -> Candidate {
        let plan = Plan {
            devices: 2,
            assignment: vec![0, 1],
        };
        Candidate::new(method, plan, predicted.to_vec())
    }

    fn guarded(candidates: Vec<Candidate>, doubts: &[&str]) -> Guarded {
        Guarded {
            candidates,
            chosen: 0,
            doubts: doubts.iter().map(|s| s.to_string()).collect(),
            notes: Vec::new(),
            basins: Vec::new(),
        }
    }

    #[test]
    fn a_second_opinion_weighs_only_an_unmeasured_learned_choice_without_doubts() {
        let candidates = vec![
            cand(POLICY, &[8.0]),
            cand("lookup", &[10.0]),
            cand("dim", &[9.0]),
        ];
        let mut g = guarded(candidates, &[]);
        assert_eq!(vetoable(&g), Some((0, 2)), "dim is the best heuristic");
        g.chosen = 1;
        assert_eq!(vetoable(&g), None, "a heuristic's plan");
        g.chosen = 0;
        g.candidates[0].measured = Some(7.0);
        assert_eq!(vetoable(&g), None, "measured");
        g.candidates[0].measured = None;
        g.doubts.push("out of distribution: dim".into());
        assert_eq!(vetoable(&g), None, "doubted already");
        let mut alone = guarded(vec![cand(POLICY, &[8.0])], &[]);
        assert_eq!(vetoable(&alone), None, "no heuristic plan fits");
        alone.candidates.push(cand(BASIN, &[7.0]));
        alone.chosen = 1;
        assert_eq!(vetoable(&alone), None, "a basin is no heuristic");
    }

    #[test]
    fn a_second_opinion_vetoes_unless_every_member_agrees_past_the_margin() {
        let rival = cand("size_lookup", &[10.0, 10.0]);
        let two = Margin::plan_margin(0.02);
        assert_eq!(veto(&rival, &[9.7, 9.75], &[10.0, 10.0], two), None);
        let why = veto(&rival, &[9.7, 9.9], &[10.0, 10.0], two).expect("1 % is under 2 %");
        assert!(why.starts_with(SECOND_OPINION), "{why}");
        assert!(why.contains("the 2 members"), "{why}");
        assert!(
            why.contains("from -3.00 % to -1.00 % against `size_lookup`'s"),
            "{why}"
        );
        let why = veto(&rival, &[9.0, 10.5], &[10.0, 10.0], two).expect("one predicts it dearer");
        assert!(why.contains("from -10.00 % to +5.00 %"), "{why}");
        assert!(veto(&rival, &[9.7], &[10.0], Margin::plan_margin(0.0)).is_none());
    }

    #[test]
    fn the_second_opinion_asks_more_where_every_tables_bins_are_guessed() {
        let cfg = common::config::ModelConfig::default();
        let guessed = |name: &str, rows: u64, pooling: f64| {
            let mut t = common::Table::cold(name, rows, 64, pooling);
            t.bins = common::generate::default_bins(rows, pooling);
            t
        };
        let csv = vec![guessed("a", 1000, 2.5), guessed("b", 5_000_000, 20.0)];
        assert!(csv.iter().all(common::Table::has_default_bins));
        let m = second_margin(&cfg, &csv);
        assert_eq!(m.share, cfg.plan_margin_default_bins);
        assert!(
            m.setting.starts_with("model.plan_margin_default_bins"),
            "{m:?}"
        );
        // One table with bins of its own: the plain margin.
        let mut mixed = csv.clone();
        mixed.push(common::Table::cold("c", 1000, 64, 2.5));
        assert!(!mixed[2].has_default_bins());
        assert_eq!(
            second_margin(&cfg, &mixed),
            Margin::plan_margin(cfg.plan_margin)
        );
        assert_eq!(
            second_margin(&cfg, &[]),
            Margin::plan_margin(cfg.plan_margin)
        );
        // The doubt names the setting that gave the margin.
        let rival = cand("lookup", &[10.0]);
        let why = veto(&rival, &[9.7], &[10.0], m).expect("3 % is under 4 %");
        assert!(why.contains("4.0 % cheaper"), "{why}");
        assert!(why.contains("model.plan_margin_default_bins"), "{why}");
        assert!(veto(&rival, &[9.7], &[10.0], Margin::plan_margin(0.02)).is_none());
    }

    #[test]
    fn a_veto_returns_the_best_heuristic_plan_and_says_why() {
        let (cfg, task) = small_task(12);
        let (first, second) = (Model::seeded(&cfg, 0), Model::seeded(&cfg, 1));
        let mut g = plan(&first, None, &task, &cfg.memory).unwrap();
        assert_eq!(g.candidates[0].method, POLICY, "the policy's plan fits");
        // Whatever the untrained guard chose: the learned plan, unless
        // it places as the best heuristic does (nothing to veto then).
        let h = g.best_heuristic().unwrap();
        assert_ne!(g.candidates[0].plan, g.candidates[h].plan);
        g.chosen = 0;
        g.doubts.clear();
        let before = g.clone();
        // No member can predict any plan 1000 % cheaper: a veto.
        second_opinion(&mut g, &second, &task.tables, Margin::plan_margin(10.0));
        assert_eq!(g.chosen, h);
        assert_eq!(g.doubts.len(), 1);
        assert!(g.doubts[0].starts_with(SECOND_OPINION), "{:?}", g.doubts);
        assert!(!g.out_of_distribution());
        let mut kept = before.clone();
        // Any member predicts it cheaper than 1000 % dearer: kept.
        second_opinion(&mut kept, &second, &task.tables, Margin::plan_margin(-10.0));
        assert_eq!((kept.chosen, kept.doubts.len()), (0, 0));
        // A run with a second opinion plans, then hears it.
        let run = Trained {
            model: &first,
            shapes: None,
            second: Some(&second),
        };
        let mut by_hand = plan(&first, None, &task, &cfg.memory).unwrap();
        second_opinion(
            &mut by_hand,
            &second,
            &task.tables,
            second_margin(&first.plan_cfg, &task.tables),
        );
        for g in [
            run.plan(&task, &cfg.memory),
            plan_jointly(&[run], &task, &cfg.memory),
        ] {
            let g = g.unwrap();
            assert_eq!((g.chosen, &g.doubts), (by_hand.chosen, &by_hand.doubts));
        }
    }

    fn laid(assignment: &[usize], predicted: &[f64]) -> Candidate {
        let plan = Plan {
            devices: 2,
            assignment: assignment.to_vec(),
        };
        Candidate::new(POLICY, plan, predicted.to_vec())
    }

    #[test]
    fn near_ties_go_to_the_less_crowded_plan() {
        let rival = cand("lookup", &[10.0, 10.0]);
        // Three tables on one device, predicted lowest.
        let learned = laid(&[0, 0, 0, 1], &[9.0, 9.0]);
        let (tie, margin) = (0.01, 0.02);
        let balanced_near = laid(&[0, 0, 1, 1], &[9.05, 9.05]);
        let balanced_far = laid(&[0, 1, 0, 1], &[9.2, 9.2]);
        let others = [balanced_far.clone(), balanced_near.clone()];
        assert_eq!(
            least_crowded(&learned, &others, &rival, margin, tie),
            Some(1),
            "within 1 % and less crowded"
        );
        assert_eq!(least_crowded(&learned, &others, &rival, margin, 0.0), None);
        assert_eq!(
            least_crowded(&learned, &others[..1], &rival, margin, tie),
            None,
            "2.2 % dearer is no tie"
        );
        assert_eq!(
            least_crowded(&learned, &others[..1], &rival, margin, 0.05),
            Some(0)
        );
        // Within the tie on the mean, but one member predicts it under the
        // margin against the rival: it does not compete.
        let doubtful = laid(&[0, 0, 1, 1], &[9.81, 8.3]);
        assert_eq!(
            least_crowded(&learned, &[doubtful], &rival, margin, tie),
            None
        );
        // As crowded: the lower prediction, and the learned plan on a
        // full tie.
        let as_crowded = laid(&[1, 1, 1, 0], &[8.95, 8.95]);
        assert_eq!(
            least_crowded(&learned, &[as_crowded], &rival, margin, tie),
            Some(0)
        );
        let same = laid(&[1, 1, 1, 0], &[9.0, 9.0]);
        assert_eq!(least_crowded(&learned, &[same], &rival, margin, tie), None);
        assert_eq!(most_on_a_device(&learned.plan), 3);
        assert_eq!(most_on_a_device(&balanced_near.plan), 2);
    }

    /// `plan` returns, of its searches' ends that pass the guard's test,
    /// the least crowded within `model.plan_tie` of the lowest prediction;
    /// with `plan_tie = 0`, `Model::plan`'s plan.
    #[test]
    fn the_guard_returns_the_least_crowded_end_of_the_near_ties() {
        let mut swapped = 0;
        for k in (0..240).step_by(10) {
            let (mut cfg, task) = small_task(k);
            cfg.model.plan_margin = 0.0;
            cfg.model.plan_tie = 0.1;
            let mut model = Model::seeded(&cfg, k as u64);
            let g = plan(&model, None, &task, &cfg.memory).unwrap();
            let lowest = model.plan(&task, &cfg.memory).0;
            model.plan_cfg.plan_tie = 0.0;
            let g_off = plan(&model, None, &task, &cfg.memory).unwrap();
            assert_eq!(g_off.candidates[0].plan, lowest, "no tie: the lowest");
            model.plan_cfg.plan_tie = 0.1;
            if g.chosen != 0 {
                continue;
            }
            let learned = &g.candidates[0];
            let ends = model.basins(&task, &cfg.memory);
            assert!(ends.contains(&learned.plan.assignment));
            let rival = &g.candidates[g.best_heuristic().unwrap()];
            let plans: Vec<Plan> = ends
                .into_iter()
                .map(|assignment| Plan {
                    devices: task.devices,
                    assignment,
                })
                .collect();
            let priced = model.member_costs(&task.tables, &plans.iter().collect::<Vec<_>>());
            // The guard sets aside an end equal to a heuristic's plan.
            let heuristic = |p: &Plan| g.candidates[1..].iter().any(|c| c.plan == *p);
            let ends: Vec<Candidate> = plans
                .into_iter()
                .zip(priced)
                .map(|(p, c)| Candidate::new(POLICY, p, c))
                .filter(|c| c.plan == learned.plan || !heuristic(&c.plan))
                .filter(|c| cheaper_by(c, rival, 0.0))
                .collect();
            let low = ends.iter().map(|c| c.mean()).fold(f64::INFINITY, f64::min);
            let near = |e: &Candidate, slack: f64| e.mean() <= low + 0.1 * low.abs() + slack;
            assert!(
                ends.iter().any(|e| e.plan == learned.plan && near(e, 1e-6)),
                "the plan returned wins and lies within the tie"
            );
            for e in ends.iter().filter(|e| near(e, -1e-6)) {
                assert!(most_on_a_device(&e.plan) >= most_on_a_device(&learned.plan));
            }
            swapped += usize::from(learned.plan != lowest);
        }
        assert!(swapped > 0, "no task had a less crowded near tie");
    }

    #[test]
    fn the_learned_plan_wins_only_when_every_member_predicts_it_cheaper() {
        let agreed = guarded(
            vec![cand(POLICY, &[9.0, 9.5]), cand("lookup", &[10.0, 10.0])],
            &[],
        );
        assert_eq!(choose(&agreed, 0.0), 0);
        let split = guarded(
            vec![cand(POLICY, &[9.0, 10.5]), cand("lookup", &[10.0, 10.0])],
            &[],
        );
        assert_eq!(choose(&split, 0.0), 1);
        let why = disagreement(&split.candidates[0], &split.candidates[1], 0.0).unwrap();
        assert!(
            why.contains("2 members disagree") && why.contains("lookup"),
            "{why}"
        );
        assert!(why.contains("-10.00 %") && why.contains("+5.00 %"), "{why}");
    }

    #[test]
    fn the_learned_plan_must_be_predicted_cheaper_by_the_margin() {
        // Every member predicts the learned plan 1 % to 3 % cheaper.
        let g = guarded(
            vec![cand(POLICY, &[9.7, 9.9]), cand("lookup", &[10.0, 10.0])],
            &[],
        );
        assert_eq!(choose(&g, 0.0), 0);
        assert_eq!(choose(&g, 0.005), 0);
        assert_eq!(choose(&g, 0.02), 1, "one member predicts only 1 %");
        let why = disagreement(&g.candidates[0], &g.candidates[1], 0.02).unwrap();
        assert!(
            why.contains("all 2 members") && why.contains("2.0 % cheaper"),
            "{why}"
        );
        // Just under 2 % for one member: still set aside.
        let close = guarded(
            vec![cand(POLICY, &[9.75, 9.81]), cand("lookup", &[10.0, 10.0])],
            &[],
        );
        assert_eq!(choose(&close, 0.02), 1);
        assert_eq!(choose(&close, 0.018), 0);
        // Predictions below zero (an untrained head can give them): the
        // gain is still the difference over the size of the heuristic's.
        let negative = guarded(vec![cand(POLICY, &[-9.9]), cand("lookup", &[-10.0])], &[]);
        assert_eq!(choose(&negative, 0.02), 1, "predicted dearer");
        let negative = guarded(vec![cand(POLICY, &[-10.5]), cand("lookup", &[-10.0])], &[]);
        assert_eq!(choose(&negative, 0.02), 0, "predicted 5 % cheaper");
        // No member predicts a gain: a plain loss, no doubt to report.
        let lost = guarded(
            vec![cand(POLICY, &[10.5, 10.1]), cand("lookup", &[10.0, 10.0])],
            &[],
        );
        assert_eq!(choose(&lost, 0.02), 1);
        assert!(disagreement(&lost.candidates[0], &lost.candidates[1], 0.02).is_none());
    }

    #[test]
    fn a_doubt_of_distribution_falls_back_to_torchrec_unless_clearly_beaten() {
        let mut g = guarded(
            vec![
                cand(POLICY, &[1.0, 1.0]),
                cand("lookup", &[12.0, 12.9]),
                cand("size_lookup", &[11.0, 12.5]),
                cand("torchrec", &[13.0, 12.6]),
            ],
            &["out of distribution: bin_0"],
        );
        assert_eq!(
            choose(&g, 0.02),
            3,
            "TorchRec's planner: one member predicts size_lookup under 1 % cheaper"
        );
        g.candidates[3].predicted = vec![13.0, 12.8];
        assert_eq!(choose(&g, 0.02), 2, "every member 2 % cheaper: size_lookup");
        assert_eq!(choose(&g, 0.05), 3, "but not 5 %");
        g.candidates.pop();
        assert_eq!(
            choose(&g, 0.02),
            2,
            "no torchrec plan: the heuristic ranked best"
        );
    }

    #[test]
    fn a_learned_plan_won_by_under_the_sure_gain_is_a_narrow_win() {
        // Every member predicts 3 % to 5 % cheaper than `size_lookup`'s
        // plan, the best heuristic by its worst member.
        let mut g = guarded(
            vec![
                cand(POLICY, &[9.5, 9.7]),
                cand("lookup", &[9.0, 10.5]),
                cand("size_lookup", &[10.0, 10.0]),
            ],
            &[],
        );
        let narrow = g.narrow_win().expect("under 6 %");
        assert_eq!(narrow.rival, "size_lookup");
        assert!((narrow.change_pct[0] + 5.0).abs() < 1e-9, "{narrow:?}");
        assert!((narrow.change_pct[1] + 3.0).abs() < 1e-9, "{narrow:?}");
        let text = narrow.to_string();
        assert!(
            text.contains("-5.0 % to -3.0 % against `size_lookup`'s") && text.contains("under 6 %"),
            "{text}"
        );
        // One member at 5.99 % is enough to call it narrow; every member
        // at 6 % or more, not (exactly 6 % included, whatever the rounding).
        let mut wide = guarded(
            vec![
                cand(POLICY, &[94.01, 90.0]),
                cand("lookup", &[100.0, 100.0]),
            ],
            &[],
        );
        assert!(wide.narrow_win().is_some());
        wide.candidates[0].predicted = vec![94.0, 90.0];
        assert_eq!(wide.narrow_win(), None, "every member 6 % or more");
        // Another run's member may predict the plan dearer: shown signed.
        wide.candidates[0].predicted = vec![102.0, 90.0];
        let dearer = wide.narrow_win().expect("one member predicts it dearer");
        assert!(dearer.to_string().contains("-10.0 % to +2.0 %"), "{dearer}");
        // A heuristic's plan chosen, or a measured choice: nothing to advise.
        g.candidates[0].predicted = vec![9.8, 9.8];
        g.chosen = 2;
        assert_eq!(g.narrow_win(), None);
        g.chosen = 0;
        assert!(g.narrow_win().is_some());
        g.candidates[0].measured = Some(9.0);
        assert_eq!(g.narrow_win(), None, "measured");
    }

    #[test]
    fn the_best_heuristic_is_the_pessimistic_prediction_until_measured() {
        let mut g = guarded(
            vec![
                cand(POLICY, &[1.0, 1.0]),
                cand("lookup", &[5.0, 9.0]),
                cand("size_lookup", &[7.0, 8.0]),
            ],
            &[],
        );
        assert_eq!(g.best_heuristic(), Some(2), "8 < 9 pessimistically");
        g.candidates[1].measured = Some(3.0);
        g.candidates[2].measured = Some(4.0);
        assert_eq!(g.best_heuristic(), Some(1));
    }

    fn small_task(k: usize) -> (common::config::Config, Task) {
        let cfg = common::config::Config::default();
        let pool = common::generate::generate_pool(&cfg.generate, 5).unwrap();
        let task = Task {
            name: "t".into(),
            devices: 4,
            memory_gb: 100.0,
            tables: pool[k..k + 24].to_vec(),
        };
        (cfg, task)
    }

    #[test]
    fn a_task_out_of_distribution_gets_a_heuristics_plan_and_the_reason() {
        let (cfg, task) = small_task(0);
        let model = Model::seeded(&cfg, 0);
        let shapes = TrainedShapes::of(std::slice::from_ref(&task)).unwrap();
        let inside = plan(&model, Some(&shapes), &task, &cfg.memory).unwrap();
        assert!(inside.doubts.iter().all(|d| !d.contains("distribution")));
        assert_eq!(inside.candidates[0].method, POLICY);
        assert!(inside.candidates.len() > 3, "heuristics compete");
        for c in &inside.candidates {
            assert_eq!(c.predicted.len(), 1, "one member");
            assert!(c.predicted[0].is_finite());
        }
        let mut odd = task.clone();
        odd.tables[3].dim = 2048;
        odd.tables[3].name = "very_wide".into();
        let g = plan(&model, Some(&shapes), &odd, &cfg.memory).unwrap();
        assert_ne!(g.method(), POLICY);
        assert!(
            g.doubts
                .iter()
                .any(|d| d.contains("dim of `very_wide` (2048)")),
            "{:?}",
            g.doubts
        );
    }

    /// A table of a few rows, hotter than any trained one, does not set
    /// the learned plan aside: the networks see it at the trained top, a
    /// note names it, and the plans place the task's own tables.
    #[test]
    fn a_table_hotter_than_trained_is_priced_at_the_trained_top_not_doubted() {
        let (cfg, task) = small_task(0);
        let model = Model::seeded(&cfg, 0);
        let shapes = TrainedShapes::of(std::slice::from_ref(&task)).unwrap();
        let mut hot = task.clone();
        let mut day = common::Table::cold("day_of_week", 7, 8, 15.8);
        day.bins = common::generate::default_bins(7, 15.8);
        hot.tables.push(day);
        assert!(!shapes.features_outside(&hot.tables).is_empty());
        let (seen_task, note) = seen(Some(&shapes), &hot);
        assert!(shapes.features_outside(&seen_task.tables).is_empty());
        assert_ne!(seen_task.tables[24].bins, hot.tables[24].bins);
        assert_eq!(seen_task.tables[..24], hot.tables[..24]);
        let g = plan(&model, Some(&shapes), &hot, &cfg.memory).unwrap();
        assert!(
            g.doubts.iter().all(|d| !d.contains("distribution")),
            "{:?}",
            g.doubts
        );
        let note = note.unwrap();
        assert!(g.notes.contains(&note), "{:?}", g.notes);
        assert!(
            note.contains("`day_of_week` (1 of 25 tables) is hotter"),
            "{note}"
        );
        for c in &g.candidates {
            assert_eq!(c.plan.assignment.len(), 25);
        }
        // Without the trained shapes nothing is known to lie outside.
        assert!(matches!(
            seen(None, &hot),
            (std::borrow::Cow::Borrowed(_), None)
        ));
    }

    /// Tables that fit in all but not one by one: the error names the
    /// task and the memory at which first-fit decreasing packs them.
    #[test]
    fn no_placement_that_fits_says_what_memory_would() {
        let cfg = common::config::Config::default();
        let model = Model::seeded(&cfg, 0);
        let big = |name: &str| common::Table::cold(name, 20_000_000, 128, 1.0);
        let one = cfg.memory.table_gb(&big("a"));
        let task = Task {
            name: "my_tables.csv".into(),
            devices: 2,
            memory_gb: 1.6 * one,
            tables: vec![big("a"), big("b"), big("c")],
        };
        assert_eq!(task.infeasibility(&cfg.memory), None);
        let err = plan(&model, None, &task, &cfg.memory)
            .unwrap_err()
            .to_string();
        let gb = task.packed_memory_gb(&cfg.memory);
        let packed = format!("{:.3} GiB per device", (gb * 1000.0).ceil() / 1000.0);
        assert!(
            err.starts_with("my_tables.csv: neither") && err.contains(&packed),
            "{err}"
        );
        assert!((gb - 2.0 * one).abs() < 1e-6);
        // The figure as printed packs: no plan error at that memory.
        let printed: f64 = packed.split(' ').next().unwrap().parse().unwrap();
        let enough = Task {
            memory_gb: printed,
            ..task.clone()
        };
        assert!(
            plan(&model, None, &enough, &cfg.memory).is_ok(),
            "{printed}"
        );
    }

    #[test]
    fn verify_returns_the_measured_best_candidate() {
        let (cfg, task) = small_task(30);
        let model = Model::seeded(&cfg, 0);
        let mut g = plan(&model, None, &task, &cfg.memory).unwrap();
        let mut oracle = benchworker::build(benchworker::Backend::Sim, &cfg).unwrap();
        let spread = verify(&mut g, &task.tables, oracle.as_mut()).unwrap();
        assert_eq!(spread, None, "sim is exact: no spread");
        let measured: Vec<f64> = g.candidates.iter().map(|c| c.measured.unwrap()).collect();
        let best = measured.iter().copied().fold(f64::INFINITY, f64::min);
        assert_eq!(measured[g.chosen], best);
        let again = oracle.measure(&task.tables, g.plan()).unwrap().cost_ms;
        assert_eq!(again, best, "sim is deterministic");
        // Timed work has a spread, the largest of the candidates'.
        let mut cfg = cfg;
        cfg.cpu.batch = 64;
        cfg.cpu.max_rows = 1000;
        cfg.cpu.repeats = 3;
        let mut cpu = benchworker::build(benchworker::Backend::Cpu, &cfg).unwrap();
        let spread = verify(&mut g, &task.tables, cpu.as_mut()).unwrap().unwrap();
        assert!(spread.is_finite() && spread >= 0.0, "{spread}");
    }

    use common::oracle::{OracleError, Spread};

    /// Measures on `sim`, but fails on the calls in `fail` and reports the
    /// `k`-th call's repeat-to-repeat spread as `spreads[k]` (relative IQR).
    struct Scripted {
        sim: Box<dyn Oracle>,
        calls: usize,
        fail: Vec<usize>,
        spreads: Vec<f64>,
    }

    impl Oracle for Scripted {
        fn name(&self) -> &'static str {
            "scripted"
        }
        fn measure(
            &mut self,
            tables: &[common::Table],
            plan: &Plan,
        ) -> Result<common::Measurement, OracleError> {
            self.calls += 1;
            if self.fail.contains(&(self.calls - 1)) {
                return Err(OracleError::Backend {
                    backend: "scripted",
                    message: "scripted failure".into(),
                });
            }
            self.sim.measure(tables, plan)
        }
        fn spread(&self) -> Option<Spread> {
            let s = self.spreads[self.calls - 1];
            Some(Spread {
                median_ms: 10.0,
                p25_ms: 10.0 * (1.0 - s / 2.0),
                p75_ms: 10.0 * (1.0 + s / 2.0),
                min_ms: 9.0,
                max_ms: 11.0,
                repeats: 5,
            })
        }
    }

    /// Candidates with one plan, its devices relabelled or not, are
    /// measured once and share the figure; so the oracle is called once
    /// per distinct plan.
    #[test]
    fn verify_measures_each_distinct_plan_once() {
        let (cfg, task) = small_task(30);
        let model = Model::seeded(&cfg, 0);
        let mut g = plan(&model, None, &task, &cfg.memory).unwrap();
        // Two candidates more, copies of the first and the last, the
        // last's devices relabelled.
        let (first, mut last) = (
            g.candidates[0].clone(),
            g.candidates.last().unwrap().clone(),
        );
        let devices = last.plan.devices;
        for d in &mut last.plan.assignment {
            *d = (*d + 1) % devices;
        }
        assert_ne!(last.plan, g.candidates.last().unwrap().plan);
        g.candidates.push(first);
        g.candidates.push(last);
        let mut distinct: Vec<&Plan> = Vec::new();
        for c in &g.candidates {
            if !distinct.iter().any(|p| same_groups(p, &c.plan)) {
                distinct.push(&c.plan);
            }
        }
        let distinct = distinct.len();
        let n = g.candidates.len();
        let mut oracle = Scripted {
            sim: benchworker::build(benchworker::Backend::Sim, &cfg).unwrap(),
            calls: 0,
            fail: Vec::new(),
            spreads: vec![0.01; n],
        };
        verify(&mut g, &task.tables, &mut oracle).unwrap();
        assert_eq!(oracle.calls, distinct, "{n} candidates");
        for a in &g.candidates {
            for b in &g.candidates {
                if same_groups(&a.plan, &b.plan) {
                    assert_eq!(a.measured, b.measured);
                }
            }
        }
        assert!(distinct < n);
    }

    /// A candidate the oracle fails on is left out; the spread returned is
    /// the largest of the measured candidates'; with none measured, the
    /// error names the oracle.
    #[test]
    fn verify_skips_failed_candidates_and_returns_the_largest_spread() {
        let (cfg, task) = small_task(30);
        let model = Model::seeded(&cfg, 0);
        let mut g = plan(&model, None, &task, &cfg.memory).unwrap();
        let n = g.candidates.len();
        assert!(n >= 3, "{n} candidates");
        let sim = || benchworker::build(benchworker::Backend::Sim, &cfg).unwrap();
        // The largest spread (0.09) belongs to a call that fails: not counted.
        let mut spreads = vec![0.01; n];
        spreads[1] = 0.09;
        spreads[n - 1] = 0.04;
        let mut oracle = Scripted {
            sim: sim(),
            calls: 0,
            fail: vec![1],
            spreads,
        };
        let spread = verify(&mut g, &task.tables, &mut oracle).unwrap().unwrap();
        assert!((spread - 0.04).abs() < 1e-12, "{spread}");
        assert_eq!(g.candidates[1].measured, None);
        let best = g
            .candidates
            .iter()
            .filter_map(|c| c.measured)
            .fold(f64::INFINITY, f64::min);
        assert_eq!(g.candidates[g.chosen].measured, Some(best));
        assert_ne!(g.chosen, 1);

        let mut g = plan(&model, None, &task, &cfg.memory).unwrap();
        let mut none = Scripted {
            sim: sim(),
            calls: 0,
            fail: (0..n).collect(),
            spreads: vec![0.0; n],
        };
        let err = verify(&mut g, &task.tables, &mut none)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("scripted measured none of the") && err.contains("scripted failure"),
            "{err}"
        );
    }

    /// The other basins join the candidates once each, as learned plans,
    /// and change nothing until measured; measured, the best of all wins.
    #[test]
    fn basins_join_the_candidates_once_and_change_nothing_until_measured() {
        let mut added_somewhere = 0;
        for k in [0, 30, 60] {
            let (cfg, task) = small_task(k);
            let model = Model::seeded(&cfg, k as u64);
            let mut g = plan(&model, None, &task, &cfg.memory).unwrap();
            let (before, chosen, heuristic) = (g.candidates.len(), g.chosen, g.best_heuristic());
            let added = add_basins(&mut g, &[Trained::alone(&model, None)], &task);
            assert_eq!(g.candidates.len(), before + added);
            assert_eq!(
                add_basins(&mut g, &[Trained::alone(&model, None)], &task),
                0,
                "once"
            );
            assert_eq!(choose(&g, cfg.model.plan_margin), chosen);
            assert_eq!(g.best_heuristic(), heuristic, "a basin is no heuristic");
            let basins = model.basins(&task, &cfg.memory);
            // `plan` kept its searches' ends: the same as searching again.
            let kept: Vec<&Vec<usize>> = g.basins.iter().map(|(_, p)| &p.assignment).collect();
            assert_eq!(kept, basins.iter().collect::<Vec<_>>());
            assert!(g.basins.iter().all(|(run, _)| *run == 0));
            for (i, c) in g.candidates.iter().enumerate().skip(before) {
                assert_eq!(c.method, BASIN);
                assert!(c.learned() && c.predicted[0].is_finite());
                assert!(basins.contains(&c.plan.assignment));
                assert!(g.candidates[..i].iter().all(|o| o.plan != c.plan));
                assert!(c.plan.fits(&task.tables, &cfg.memory, task.cap_bytes()));
            }
            added_somewhere += added;
            let mut oracle = benchworker::build(benchworker::Backend::Sim, &cfg).unwrap();
            verify(&mut g, &task.tables, oracle.as_mut()).unwrap();
            let best = g
                .candidates
                .iter()
                .map(|c| c.measured.unwrap())
                .fold(f64::INFINITY, f64::min);
            assert_eq!(g.candidates[g.chosen].measured, Some(best));
        }
        assert!(added_somewhere > 0, "no task had another basin");
    }

    /// Two runs: each run's choice competes, priced by both runs'
    /// members, and the one they price lowest is returned. One run: the
    /// same as `plan`.
    #[test]
    fn runs_planning_together_return_the_choice_all_members_price_lowest() {
        let (cfg, task) = small_task(0);
        let a = Model::seeded(&cfg, 1);
        let b = Model::seeded(&cfg, 2);
        let (ta, tb) = (Trained::alone(&a, None), Trained::alone(&b, None));
        let alone = plan(&a, None, &task, &cfg.memory).unwrap();
        let one = plan_jointly(&[ta], &task, &cfg.memory).unwrap();
        assert_eq!(one.plan(), alone.plan());
        assert_eq!(one.candidates.len(), alone.candidates.len());

        let gb = plan(&b, None, &task, &cfg.memory).unwrap();
        assert_ne!(alone.plan(), gb.plan(), "the two runs choose apart here");
        let joint = |p: &Plan| {
            let mut all = a.member_costs(&task.tables, &[p]).remove(0);
            all.extend(b.member_costs(&task.tables, &[p]).remove(0));
            all.iter().sum::<f64>() / all.len() as f64
        };
        let g = plan_jointly(&[ta, tb], &task, &cfg.memory).unwrap();
        let lower = if joint(alone.plan()) <= joint(gb.plan()) {
            alone.plan()
        } else {
            gb.plan()
        };
        assert_eq!(g.plan(), lower);
        assert!((g.candidates[g.chosen].mean() - joint(lower)).abs() < 1e-9);
        // The order of the runs does not decide.
        let swapped = plan_jointly(&[tb, ta], &task, &cfg.memory).unwrap();
        assert_eq!(swapped.plan(), lower);
        for (i, c) in g.candidates.iter().enumerate() {
            assert_eq!(c.predicted.len(), 2, "one member per run");
            assert!(g.candidates[..i].iter().all(|o| o.plan != c.plan), "once");
        }
        // Each run's learned plan is there, named by the run that proposed it.
        for (run, learned) in [(0, &alone.candidates[0]), (1, &gb.candidates[0])] {
            assert_eq!(learned.method, POLICY);
            let c = g
                .candidates
                .iter()
                .find(|c| c.plan == learned.plan)
                .unwrap();
            assert_eq!((c.method, c.run), (POLICY, run));
        }
        // Every run's basins join, priced by both.
        let before = g.candidates.len();
        let mut g = g;
        let added = add_basins(
            &mut g,
            &[Trained::alone(&a, None), Trained::alone(&b, None)],
            &task,
        );
        assert_eq!(g.candidates.len(), before + added);
        assert!(g.candidates[before..]
            .iter()
            .all(|c| c.method == BASIN && c.predicted.len() == 2));
        // Each basin is named by the run whose searches ended there.
        let ends = [a.basins(&task, &cfg.memory), b.basins(&task, &cfg.memory)];
        let labelled: Vec<(usize, &Vec<usize>)> = (ends.iter().enumerate())
            .flat_map(|(run, e)| e.iter().map(move |p| (run, p)))
            .collect();
        let kept: Vec<(usize, &Vec<usize>)> =
            g.basins.iter().map(|(r, p)| (*r, &p.assignment)).collect();
        assert_eq!(kept, labelled);
        for c in &g.candidates[before..] {
            assert!(ends[c.run].contains(&c.plan.assignment));
        }
        assert!(plan_jointly(&[], &task, &cfg.memory).is_err());
    }

    fn placed(method: &'static str, assignment: &[usize]) -> Candidate {
        Candidate {
            plan: Plan {
                devices: 2,
                assignment: assignment.to_vec(),
            },
            ..cand(method, &[1.0])
        }
    }

    /// A heuristic's plan is kept once by name, a learned plan once by
    /// plan, and a learned plan that places as a heuristic does stays
    /// apart from it, as with one run.
    #[test]
    fn merging_runs_keeps_heuristics_by_name_and_learned_plans_by_plan() {
        let a = Guarded {
            chosen: 1,
            ..guarded(
                vec![
                    placed(POLICY, &[0, 1]),
                    placed("lookup", &[0, 1]),
                    placed("dim", &[1, 0]),
                ],
                &[],
            )
        };
        let b = Guarded {
            chosen: 0,
            ..guarded(
                vec![
                    placed(POLICY, &[1, 1]),
                    placed("lookup", &[0, 1]),
                    placed("dim", &[1, 0]),
                ],
                &[],
            )
        };
        let c = Guarded {
            chosen: 0,
            ..guarded(
                vec![placed(POLICY, &[0, 1]), placed("lookup", &[0, 1])],
                &[],
            )
        };
        let (merged, picks) = merge(&[a, b, c]);
        let names: Vec<(&str, usize)> = merged.iter().map(|m| (m.method, m.run)).collect();
        assert_eq!(
            names,
            [(POLICY, 0), ("lookup", 0), ("dim", 0), (POLICY, 1)],
            "run 2's learned plan is run 0's"
        );
        assert_eq!(picks, [1, 3, 0]);
        assert!(merged.iter().all(|m| m.predicted.is_empty()), "unpriced");
    }

    /// The lowest joint mean wins, the earlier run on a tie; a run out of
    /// its distribution keeps the others' learned plans out.
    #[test]
    fn judging_runs_takes_the_cheapest_choice_unless_one_is_out_of_distribution() {
        let candidates = vec![
            cand(POLICY, &[9.0, 9.0]),
            cand("torchrec", &[10.0, 10.0]),
            cand(POLICY, &[8.0, 8.5]),
            cand(POLICY, &[8.0, 8.5]),
        ];
        let plain = || guarded(Vec::new(), &[]);
        let g = [plain(), plain(), plain()];
        assert_eq!(judge(&g, &candidates, &[0, 2, 1], 0.02), (Some(1), 2));
        assert_eq!(
            judge(&g, &candidates, &[3, 2, 1], 0.02),
            (Some(0), 3),
            "a tie: the earlier run"
        );
        let far = guarded(Vec::new(), &["out of distribution: the dim of `w` (2048)"]);
        assert!(far.out_of_distribution());
        assert!(
            !guarded(Vec::new(), &["the cost network's 3 members disagree"]).out_of_distribution()
        );
        let g = [plain(), plain(), far];
        assert_eq!(
            judge(&g, &candidates, &[0, 2, 1], 0.02),
            (Some(2), 1),
            "torchrec's, though dearer"
        );
    }

    /// Where every run fell back to a heuristic, the heuristic is the one
    /// a guard of all the members chooses (the lowest worst member; out of
    /// distribution `torchrec`'s unless beaten by the margin), though no
    /// run chose it alone and another has a lower mean.
    #[test]
    fn runs_that_all_fell_back_take_the_heuristic_all_members_would() {
        let candidates = vec![
            cand(POLICY, &[7.0, 12.0]),
            cand("lookup", &[8.0, 8.4]),
            cand("size_lookup", &[7.0, 9.0]),
            cand("torchrec", &[8.5, 8.5]),
            cand(POLICY, &[9.0, 9.0]),
        ];
        let plain = || guarded(Vec::new(), &[]);
        let g = [plain(), plain()];
        // Mean: size_lookup 8.0 < lookup 8.2; worst member: lookup 8.4.
        assert_eq!(judge(&g, &candidates, &[2, 3], 0.02), (None, 1));
        assert_eq!(best_heuristic(&candidates), Some(1));
        // The run that chose it, where one did.
        assert_eq!(judge(&g, &candidates, &[3, 1], 0.02), (Some(1), 1));
        // A learned choice still competes by the mean.
        assert_eq!(judge(&g, &candidates, &[2, 4], 0.02), (Some(0), 2));
        // Out of distribution: lookup does not beat torchrec by 2 % for
        // every member (8.4 against 8.5), so torchrec's, which no run chose.
        let far = || guarded(Vec::new(), &["out of distribution: the rows of `t`"]);
        assert_eq!(
            judge(&[plain(), far()], &candidates, &[0, 1], 0.02),
            (None, 3)
        );
        // With no margin, lookup beats it.
        assert_eq!(judge(&[far(), far()], &candidates, &[3, 3], 0.0), (None, 1));
    }

    #[test]
    fn without_a_learned_plan_the_best_heuristic_is_chosen() {
        let g = guarded(vec![cand("lookup", &[5.0]), cand("dim", &[4.0])], &[]);
        assert_eq!(choose(&g, 0.0), 1);
    }
}
