//! How other rules for `plan`'s choice would have fared, replayed on the
//! same candidates: the learned plan, the heuristics' plans and the other
//! ends of the searches (basins), each predicted by every member and
//! measured on `sim`. One row per rule, over all the suites given:
//!
//! - `shipped`: what the run's guard returns (model::guard::plan). For `plan`
//!   before its near ties went to the less crowded plan, give a copy of
//!   the run whose config.toml has `plan_tie = 0` under `[model]`.
//! - `with its second opinion`: what `learner plan` returns where the run
//!   ships a second opinion (RUN_DIR/second-opinion): `shipped`, after
//!   that network's veto (model::guard::second_opinion).
//! - `second opinion (m)`: the same veto at margin `m` for the second
//!   network (the first keeps `model.plan_margin`).
//! - `second opinion, gain over c of the spread`: the second opinion at
//!   `model.plan_margin` on every task, and the learned plan kept only
//!   where the least gain over the best-ranked heuristic plan of both
//!   networks' members is at least `c` times the spread of their gains.
//! - `… heuristics ranked by both`: where the rule returns a heuristic's
//!   plan within the trained range, the heuristic plan of lowest highest
//!   prediction over the members of both networks.
//! - `… heuristics ranked by mean` (`… of both`): the same, by the lowest
//!   mean prediction of the first network's members (of both networks').
//! - `heuristics only`: the heuristic plan the guard ranks best (its
//!   highest member prediction), never a learned plan. The floor of any
//!   rule that trusts the network to rank the heuristics' plans.
//! - `… heuristics by vote (m)`: where the rule returns a heuristic's
//!   plan, the plan most heuristics give instead, unless every member
//!   predicts the best-ranked heuristic plan cheaper than it by `m`.
//! - `shipped, prior h (m)`: where `plan` returns a heuristic's plan,
//!   heuristic `h`'s plan instead, unless every member predicts the
//!   returned one cheaper than `h`'s by `m`: a fixed order in place of
//!   the network's ranking.
//! - `basins agree (m, k)`: the learned plan only where `plan` would
//!   return it and at least `k` of the other basins (all where fewer)
//!   are also predicted cheaper than that heuristic plan by `m` by every
//!   member; else that heuristic plan. The other basins include the plan
//!   predicted lowest where `plan` returned a less crowded near tie.
//!
//! - `crowd cap (c)`: where `plan` returns a learned plan, the learned
//!   plan (or basin) of lowest mean prediction among those every member
//!   predicts cheaper than the best-ranked heuristic plan by the margin
//!   and whose most crowded device holds at most `c` times the tables of
//!   the heuristics' most crowded; else that heuristic plan.
//!
//! - `both networks' margins (m1, m2)`: the learned plan where every
//!   member of the first network predicts it cheaper than the
//!   best-ranked heuristic plan by `m1` and every member of the second by
//!   `m2`, doubts or not; else that heuristic plan.
//! - `measured best (--verify)`: the candidate of lowest `sim`
//!   measurement, as `plan --verify sim` returns (model::guard::verify).
//!
//! Tasks out of distribution keep the guard's own choice in every rule
//! but the last.
//! Two last lines count the learned plans that lose over 1 % to their
//! own best heuristic, and how many of them, and of the others, `plan`
//! warned about as narrow wins: those the run's guard returns, then those
//! `plan` returns after the second opinion.
//! Each row: the mean over suites of the total cost against the suite's
//! best heuristic (the heuristic of lowest total measured cost), the
//! tasks over 1 % behind the suite's best heuristic and behind their own
//! best heuristic, the worst task against the suite's best heuristic, and
//! the learned plans returned.
//!
//! cargo run --release --example guard_rules -- RUN_DIR SUITE...

use model::guard::{Candidate, BASIN, HEURISTICS};

/// One task's candidates, measured, and the guard's choice.
struct Replayed {
    suite: usize,
    candidates: Vec<Candidate>,
    chosen: usize,
    /// The choice after the run's second opinion (`chosen` without one).
    heard: usize,
    /// The candidate `plan --verify sim` returns: the measured best.
    verified: usize,
    /// The best heuristic candidate as the guard ranks it (unmeasured).
    ranked: Option<usize>,
    out_of_distribution: bool,
    /// `plan` warned that its learned plan is a narrow win.
    narrow: bool,
    /// The guard had doubts (the second opinion weighs no such choice).
    doubted: bool,
    /// Per candidate, the second network's member predictions (empty
    /// without a second opinion).
    second: Vec<Vec<f64>>,
    /// Every table's reuse bins are the defaults of a CSV without bin
    /// columns (`common::generate::default_bins`).
    default_bins: bool,
}

type Rule = Box<dyn Fn(&Replayed) -> usize>;

fn main() -> anyhow::Result<()> {
    tch::set_num_threads(1);
    let args: Vec<String> = std::env::args().skip(1).collect();
    anyhow::ensure!(args.len() >= 2, "usage: guard_rules RUN_DIR SUITE...");
    let run = std::path::Path::new(&args[0]);
    let (cfg, model) = learner::checkpoint::load_run(run)?;
    let shapes = model::shapes::TrainedShapes::read(run);
    let second_dir = run.join(learner::checkpoint::Runs::SECOND_OPINION);
    let second = match second_dir.is_dir() {
        true => Some(learner::checkpoint::load_run(&second_dir)?.1),
        false => None,
    };
    let mut oracle = benchworker::build(benchworker::Backend::Sim, &cfg)?;
    let cfg_margin = model.plan_cfg.plan_margin;
    let mut tasks = Vec::new();
    for (suite, path) in args[1..].iter().enumerate() {
        let loaded = common::Suite::load(std::path::Path::new(path), &cfg.memory)?;
        for task in &loaded.tasks {
            let mut g = model::guard::plan(&model, shapes.as_ref(), task, &cfg.memory)?;
            let (chosen, ranked) = (g.chosen, g.best_heuristic());
            let out_of_distribution = g.out_of_distribution();
            let narrow = g.narrow_win().is_some();
            let doubted = !g.doubts.is_empty();
            let mut heard = g.clone();
            if let Some(second) = &second {
                let margin = model::guard::second_margin(&model.plan_cfg, &task.tables);
                let seen = model::guard::seen_tables(shapes.as_ref(), &task.tables);
                model::guard::second_opinion(&mut heard, second, &seen, margin);
            }
            model::guard::add_basins(
                &mut g,
                &[model::guard::Trained::alone(&model, shapes.as_ref())],
                task,
            );
            model::guard::verify(&mut g, &task.tables, oracle.as_mut())?;
            let verified = g.chosen;
            let plans: Vec<&common::Plan> = g.candidates.iter().map(|c| &c.plan).collect();
            let second_costs = match &second {
                Some(second) => {
                    let seen = model::guard::seen_tables(shapes.as_ref(), &task.tables);
                    second.member_costs(&seen, &plans)
                }
                None => Vec::new(),
            };
            tasks.push(Replayed {
                suite,
                candidates: g.candidates,
                chosen,
                heard: heard.chosen,
                verified,
                ranked,
                out_of_distribution,
                narrow,
                doubted,
                second: second_costs,
                default_bins: task.tables.iter().all(common::Table::has_default_bins),
            });
        }
    }
    let mut rules: Vec<(String, Rule)> = vec![
        ("shipped".into(), Box::new(|t: &Replayed| t.chosen)),
        (
            "with its second opinion".into(),
            Box::new(|t: &Replayed| t.heard),
        ),
        (
            "heuristics only".into(),
            Box::new(|t: &Replayed| match t.out_of_distribution {
                true => t.chosen,
                false => t.ranked.unwrap_or(t.chosen),
            }),
        ),
    ];
    rules.push((
        "heuristics only, ranked by mean".into(),
        Box::new(|t: &Replayed| by_mean(t, t.ranked.unwrap_or(t.chosen), false)),
    ));
    if second.is_some() {
        rules.push((
            "with its second opinion, heuristics ranked by mean".into(),
            Box::new(|t: &Replayed| by_mean(t, t.heard, false)),
        ));
        rules.push((
            "with its second opinion, heuristics ranked by mean of both".into(),
            Box::new(|t: &Replayed| by_mean(t, t.heard, true)),
        ));
        rules.push((
            "heuristics only, ranked by mean of both".into(),
            Box::new(|t: &Replayed| by_mean(t, t.ranked.unwrap_or(t.chosen), true)),
        ));
        rules.push((
            "with its second opinion, heuristics ranked by both".into(),
            Box::new(|t: &Replayed| by_both(t, t.heard)),
        ));
        rules.push((
            "heuristics only, ranked by both".into(),
            Box::new(|t: &Replayed| by_both(t, t.ranked.unwrap_or(t.chosen))),
        ));
        for m in [0.0, 0.04, 0.06] {
            rules.push((
                format!("second opinion ({:.0} %)", m * 100.0),
                Box::new(move |t: &Replayed| vetoed(t, m)),
            ));
            rules.push((
                format!(
                    "second opinion ({:.0} %), heuristics ranked by both",
                    m * 100.0
                ),
                Box::new(move |t: &Replayed| by_both(t, vetoed(t, m))),
            ));
        }
        for c in [0.25, 0.5, 1.0] {
            rules.push((
                format!("second opinion, gain over {c} of the spread"),
                Box::new(move |t: &Replayed| spread_rule(t, cfg_margin, c)),
            ));
        }
    }
    for m in [0.0, 0.02, 0.05] {
        rules.push((
            format!("shipped, heuristics by vote ({:.0} %)", m * 100.0),
            Box::new(move |t: &Replayed| voted(t, t.chosen, m)),
        ));
        rules.push((
            format!("heuristics only, by vote ({:.0} %)", m * 100.0),
            Box::new(move |t: &Replayed| voted(t, t.ranked.unwrap_or(t.chosen), m)),
        ));
    }
    for name in ["lookup", "size_lookup", "torchrec"] {
        for m in [0.0, 0.02, 0.05] {
            rules.push((
                format!("shipped, prior {name} ({:.0} %)", m * 100.0),
                Box::new(move |t: &Replayed| prior(t, name, m)),
            ));
        }
    }
    for m in [0.01, 0.02, 0.03] {
        for k in [2, usize::MAX] {
            let name = match k {
                usize::MAX => format!("basins agree ({:.0} %, all)", m * 100.0),
                k => format!("basins agree ({:.0} %, {k})", m * 100.0),
            };
            rules.push((name, Box::new(move |t: &Replayed| agree(t, m, k))));
        }
    }
    for m in [0.04, 0.06, 0.08, 0.10] {
        rules.push((
            format!("margin ({:.0} %)", m * 100.0),
            Box::new(move |t: &Replayed| margined(t, m)),
        ));
    }
    for c in [1.0, 1.25, 1.5, 2.0] {
        rules.push((
            format!("crowd cap ({c})"),
            Box::new(move |t: &Replayed| capped(t, c, cfg_margin)),
        ));
    }
    println!(
        "| rule | mean vs suite's best heuristic | tasks > 1 % behind it | > 1 % behind their own \
         best | worst task | learned plans |"
    );
    println!("|---|---|---|---|---|---|");
    if second.is_some() {
        for m in [0.03, 0.04, 0.06] {
            rules.push((
                format!(
                    "second opinion at {:.0} % where bins are defaults",
                    m * 100.0
                ),
                Box::new(move |t: &Replayed| match t.default_bins {
                    true => vetoed(t, m),
                    false => t.heard,
                }),
            ));
        }
        for m1 in [0.0, 0.01, 0.02] {
            for m2 in [0.0, 0.01, 0.02] {
                rules.push((
                    format!(
                        "both networks' margins ({:.0} %, {:.0} %)",
                        m1 * 100.0,
                        m2 * 100.0
                    ),
                    Box::new(move |t: &Replayed| both_margins(t, m1, m2)),
                ));
            }
        }
    }
    rules.push((
        "measured best (--verify)".into(),
        Box::new(|t: &Replayed| t.verified),
    ));
    for (name, rule) in &rules {
        println!("| {name} | {} |", score(&tasks, args.len() - 1, rule));
    }
    println!();
    warned(&tasks, "shipped", |t| t.chosen);
    if second.is_some() {
        warned(&tasks, "with its second opinion", |t| t.heard);
        losers(&tasks, args.len() - 1);
    }
    Ok(())
}

/// Of the tasks over 1 % behind the suite's best heuristic with the
/// second opinion, how many return a learned plan and how many a
/// heuristic's.
fn losers(tasks: &[Replayed], suites: usize) {
    let (mut learned, mut heuristic_pick) = (0, 0);
    for s in 0..suites {
        let of: Vec<&Replayed> = tasks.iter().filter(|t| t.suite == s).collect();
        let Some(best) = suite_best(&of) else {
            continue;
        };
        for t in &of {
            let c = &t.candidates[t.heard];
            let (Some(got), Some(yard)) = (c.measured, heuristic(t, best)) else {
                continue;
            };
            if got > yard * 1.01 {
                match c.learned() {
                    true => learned += 1,
                    false => heuristic_pick += 1,
                }
            }
        }
    }
    println!(
        "tasks over 1 % behind the suite's best heuristic with the second opinion: {learned} \
         learned plans, {heuristic_pick} heuristics' plans"
    );
}

/// The highest prediction of candidate `i` over both networks' members.
fn worst_of_both(t: &Replayed, i: usize) -> f64 {
    (t.candidates[i].predicted.iter())
        .chain(&t.second[i])
        .fold(f64::NEG_INFINITY, |a, &b| a.max(b))
}

/// `pick` where it is a learned plan or the task is out of distribution;
/// else the heuristic plan of lowest [`worst_of_both`].
fn by_both(t: &Replayed, pick: usize) -> usize {
    if t.out_of_distribution || t.candidates[pick].learned() || t.second.is_empty() {
        return pick;
    }
    (0..t.candidates.len())
        .filter(|&i| !t.candidates[i].learned())
        .min_by(|&a, &b| worst_of_both(t, a).total_cmp(&worst_of_both(t, b)))
        .unwrap_or(pick)
}

/// `pick` where it is a learned plan or the task is out of distribution;
/// else the heuristic plan of lowest mean prediction over the first
/// network's members, or over both networks' (`both`).
fn by_mean(t: &Replayed, pick: usize, both: bool) -> usize {
    if t.out_of_distribution || t.candidates[pick].learned() || (both && t.second.is_empty()) {
        return pick;
    }
    let mean = |i: usize| {
        let own = &t.candidates[i].predicted;
        let all: Vec<f64> = match both {
            true => own.iter().chain(&t.second[i]).copied().collect(),
            false => own.clone(),
        };
        all.iter().sum::<f64>() / all.len().max(1) as f64
    };
    (0..t.candidates.len())
        .filter(|&i| !t.candidates[i].learned())
        .min_by(|&a, &b| mean(a).total_cmp(&mean(b)))
        .unwrap_or(pick)
}

/// [`Replayed::chosen`] after the second opinion at margin `m`, kept only
/// where the least gain over the best-ranked heuristic plan, of all the
/// members of both networks, is at least `c` times their gains' spread.
fn spread_rule(t: &Replayed, m: f64, c: f64) -> usize {
    let pick = vetoed(t, m);
    let Some(h) = t.ranked else {
        return pick;
    };
    if pick != t.chosen || !t.candidates[pick].learned() || t.second.is_empty() || t.doubted {
        return pick;
    }
    let gain = |p: f64, q: f64| (q - p) / q.abs();
    let (a, b) = (&t.candidates[pick], &t.candidates[h]);
    let gains: Vec<f64> = (a.predicted.iter().zip(&b.predicted))
        .chain(t.second[pick].iter().zip(&t.second[h]))
        .map(|(&p, &q)| gain(p, q))
        .collect();
    let lo = gains.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = gains.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    match lo >= c * (hi - lo) {
        true => pick,
        false => h,
    }
}

/// [`Replayed::chosen`], vetoed as `plan`'s second opinion does but at
/// margin `m` for the second network.
fn vetoed(t: &Replayed, m: f64) -> usize {
    let (Some(h), false, false) = (t.ranked, t.out_of_distribution, t.doubted) else {
        return t.chosen;
    };
    if !t.candidates[t.chosen].learned() || t.second.is_empty() {
        return t.chosen;
    }
    let (a, b) = (&t.second[t.chosen], &t.second[h]);
    match model::guard::all_cheaper(a, b, m) {
        true => t.chosen,
        false => h,
    }
}

/// How often `plan`'s narrow-win warning (which suggests `--verify`)
/// came with the learned plans that lost over 1 % to their own best
/// heuristic, and with those that did not.
fn warned(tasks: &[Replayed], label: &str, rule: impl Fn(&Replayed) -> usize) {
    let (mut lost, mut lost_warned, mut held, mut held_warned) = (0, 0, 0, 0);
    for t in tasks {
        let c = &t.candidates[rule(t)];
        let own = own_best(t);
        let (true, Some(got)) = (c.learned(), c.measured) else {
            continue;
        };
        match got > own * 1.01 {
            true => (lost, lost_warned) = (lost + 1, lost_warned + usize::from(t.narrow)),
            false => (held, held_warned) = (held + 1, held_warned + usize::from(t.narrow)),
        }
    }
    println!(
        "{label}: learned plans over 1 % behind their own best heuristic: {lost}, {lost_warned} \
         of them warned as narrow wins; the other learned plans: {held}, {held_warned} warned"
    );
}

/// [`Replayed::chosen`] where it is a heuristic's plan; else the learned
/// plan only if `k` of the basins (all where fewer) are predicted cheaper
/// than the heuristic plan it beat by `m` by every member.
fn agree(t: &Replayed, m: f64, k: usize) -> usize {
    let (Some(h), false) = (t.ranked, t.out_of_distribution) else {
        return t.chosen;
    };
    if !t.candidates[t.chosen].learned() {
        return t.chosen;
    }
    let basins: Vec<&Candidate> = t.candidates.iter().filter(|c| c.method == BASIN).collect();
    let rival = &t.candidates[h];
    let agreeing = basins
        .iter()
        .filter(|b| model::guard::cheaper_by(b, rival, m))
        .count();
    if agreeing >= k.min(basins.len()) {
        t.chosen
    } else {
        h
    }
}

/// [`Replayed::chosen`] where it is a heuristic's plan or every member
/// predicts it cheaper than the best-ranked heuristic plan by `m`; else
/// that heuristic plan.
fn margined(t: &Replayed, m: f64) -> usize {
    let (Some(h), false) = (t.ranked, t.out_of_distribution) else {
        return t.chosen;
    };
    let c = &t.candidates[t.chosen];
    if !c.learned() || model::guard::cheaper_by(c, &t.candidates[h], m) {
        t.chosen
    } else {
        h
    }
}

/// The learned plan (the first candidate) where every member of the
/// first network predicts it cheaper than the best-ranked heuristic plan
/// by `m1` and every member of the second by `m2`; else that heuristic
/// plan. Unlike `plan`, it returns a learned plan the first network's
/// members doubt when both margins pass.
fn both_margins(t: &Replayed, m1: f64, m2: f64) -> usize {
    let (Some(h), false) = (t.ranked, t.out_of_distribution) else {
        return t.chosen;
    };
    let l = 0;
    if t.candidates[l].method != model::guard::POLICY || t.second.is_empty() {
        return t.chosen;
    }
    let first = model::guard::cheaper_by(&t.candidates[l], &t.candidates[h], m1);
    let (a, b) = (&t.second[l], &t.second[h]);
    let second = model::guard::all_cheaper(a, b, m2);
    match first && second {
        true => l,
        false => h,
    }
}

/// [`Replayed::chosen`] where it is a heuristic's plan; else the learned
/// plan of lowest mean prediction of those predicted cheaper than the
/// best-ranked heuristic plan by `m` by every member, with at most `c`
/// times the tables on a device of the heuristics' most crowded plan;
/// else that heuristic plan.
fn capped(t: &Replayed, c: f64, m: f64) -> usize {
    let (Some(h), false) = (t.ranked, t.out_of_distribution) else {
        return t.chosen;
    };
    if !t.candidates[t.chosen].learned() {
        return t.chosen;
    }
    let most = model::guard::most_on_a_device;
    let cap = (t.candidates.iter())
        .filter(|k| !k.learned())
        .map(|k| most(&k.plan))
        .max()
        .unwrap_or(usize::MAX) as f64
        * c;
    let rival = &t.candidates[h];
    (0..t.candidates.len())
        .filter(|&i| t.candidates[i].learned())
        .filter(|&i| model::guard::cheaper_by(&t.candidates[i], rival, m))
        .filter(|&i| most(&t.candidates[i].plan) as f64 <= cap)
        .min_by(|&a, &b| t.candidates[a].mean().total_cmp(&t.candidates[b].mean()))
        .unwrap_or(h)
}

/// `pick` where it is a learned plan or the task is out of distribution;
/// else the plan most heuristics give (the one with the best-ranked
/// heuristic among them on a tie), unless every member predicts the
/// best-ranked heuristic plan cheaper than it by `m`.
fn voted(t: &Replayed, pick: usize, m: f64) -> usize {
    let (Some(h), false) = (t.ranked, t.out_of_distribution) else {
        return pick;
    };
    if t.candidates[pick].learned() {
        return pick;
    }
    let heuristics: Vec<usize> = (0..t.candidates.len())
        .filter(|&i| !t.candidates[i].learned())
        .collect();
    let votes = |i: usize| {
        heuristics
            .iter()
            .filter(|&&j| t.candidates[j].plan == t.candidates[i].plan)
            .count()
    };
    let same_as_h = |i: usize| t.candidates[i].plan == t.candidates[h].plan;
    let Some(&major) = heuristics
        .iter()
        .max_by_key(|&&i| (votes(i), same_as_h(i), std::cmp::Reverse(i)))
    else {
        return pick;
    };
    if model::guard::cheaper_by(&t.candidates[h], &t.candidates[major], m) {
        h
    } else {
        major
    }
}

/// [`Replayed::chosen`] where it is a learned plan or the task is out of
/// distribution; else heuristic `name`'s plan, unless every member
/// predicts the chosen plan cheaper than it by `m`.
fn prior(t: &Replayed, name: &str, m: f64) -> usize {
    let pick = t.chosen;
    if t.out_of_distribution || t.candidates[pick].learned() {
        return pick;
    }
    match t.candidates.iter().position(|c| c.method == name) {
        Some(p) if !model::guard::cheaper_by(&t.candidates[pick], &t.candidates[p], m) => p,
        _ => pick,
    }
}

/// The lowest measured cost of the heuristics' plans on a task.
fn own_best(t: &Replayed) -> f64 {
    HEURISTICS
        .iter()
        .filter_map(|m| heuristic(t, m.name()))
        .fold(f64::INFINITY, f64::min)
}

/// A heuristic's measured cost on a task, where its plan fits.
fn heuristic(t: &Replayed, name: &str) -> Option<f64> {
    t.candidates
        .iter()
        .find(|c| c.method == name)
        .and_then(|c| c.measured)
}

/// The heuristic of lowest total measured cost over a suite's tasks.
fn suite_best(of: &[&Replayed]) -> Option<&'static str> {
    let total = |name: &str| -> Option<f64> { of.iter().map(|t| heuristic(t, name)).sum() };
    HEURISTICS
        .iter()
        .filter_map(|m| total(m.name()).map(|c| (m.name(), c)))
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(name, _)| name)
}

/// A rule's row cells (see the module's doc).
fn score(tasks: &[Replayed], suites: usize, rule: &Rule) -> String {
    let (mut means, mut behind_suite, mut behind_own) = (Vec::new(), 0, 0);
    let (mut worst, mut learned) = (f64::NEG_INFINITY, 0);
    for s in 0..suites {
        let of: Vec<&Replayed> = tasks.iter().filter(|t| t.suite == s).collect();
        let Some(best) = suite_best(&of) else {
            continue;
        };
        let (mut ours, mut theirs) = (0.0, 0.0);
        for t in &of {
            let c = &t.candidates[rule(t)];
            learned += usize::from(c.learned());
            let (Some(got), Some(yard)) = (c.measured, heuristic(t, best)) else {
                continue;
            };
            ours += got;
            theirs += yard;
            let pct = (got / yard - 1.0) * 100.0;
            worst = worst.max(pct);
            behind_suite += usize::from(pct > 1.0);
            let own = own_best(t);
            behind_own += usize::from(got > own * 1.01);
        }
        means.push((ours / theirs - 1.0) * 100.0);
    }
    let mean = means.iter().sum::<f64>() / means.len().max(1) as f64;
    format!("{mean:+.2} % | {behind_suite} | {behind_own} | {worst:+.2} % | {learned}")
}
