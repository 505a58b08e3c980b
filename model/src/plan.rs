//! `plan`: the policy's placement of a task, found by local search on the
//! cost network from the policy's episodes and other starts, or chosen
//! among the episodes and the heuristics' plans by the cost network.

use common::{Plan, Task};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use tch::{Device, Kind, Tensor};

use crate::mdp::{MdpTask, PlainEpisodes};
use crate::model::Model;
use crate::tensor_vec;

/// What [`Model::plan_keeping`] keeps of a task it placed.
pub struct Kept {
    /// [`Model::plan`]'s plan.
    pub plan: Plan,
    /// Whether it overran memory.
    pub infeasible: bool,
    /// The networks' plain copies for the task.
    pub episodes: PlainEpisodes,
    /// The other distinct ends of its searches, cheapest predicted first
    /// (as [`Model::basins`] gives them, less the plan): empty where it
    /// does not search from every start.
    pub others: Vec<Vec<usize>>,
}

/// One of `plan`'s searches: its start, whether the start overran memory,
/// and the plan the search kept with its predicted cost (none for a start
/// that does not fit).
type Searched = (Vec<usize>, bool, Option<(Vec<usize>, f64)>);

impl Model {
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
    /// feasible candidate, the lowest prediction winning; without moves,
    /// the search starts from the episodes, `lookup`'s and `torchrec`'s
    /// plans and a piled plan instead. With one candidate and no moves or
    /// search, the greedy episode as it is.
    pub fn plan(&self, task: &Task, mem: &common::MemoryModel) -> (Plan, bool) {
        let kept = self.plan_keeping(task, mem);
        (kept.plan, kept.infeasible)
    }

    /// [`Model::plan`], with the networks' plain copies for the task it
    /// planned, for predicting more plans of it
    /// ([`Model::member_costs_for`]) without computing them again, and the
    /// other ends of its searches.
    pub fn plan_keeping(&self, task: &Task, mem: &common::MemoryModel) -> Kept {
        let mdp = MdpTask::new(&task.tables, task.devices, task.cap_bytes(), mem);
        // The greedy episode and the sampled ones: plain arrays, no libtorch
        // call per step, sample `i` seeded by `i` (reproducible, whatever
        // the threads).
        let episodes = PlainEpisodes::new(&self.policy, &self.cost, &mdp);
        let (plan, infeasible, others) = self.plan_with(task, mem, &mdp, &episodes);
        Kept {
            plan,
            infeasible,
            episodes,
            others,
        }
    }

    /// [`Model::plan`] once the task's episodes are ready, with the other
    /// ends of its searches where it searches from every start.
    fn plan_with(
        &self,
        task: &Task,
        mem: &common::MemoryModel,
        mdp: &MdpTask,
        episodes: &PlainEpisodes,
    ) -> (Plan, bool, Vec<Vec<usize>>) {
        let c = &self.plan_cfg;
        let k = c.plan_samples.max(1);
        // Moves and search need per-device costs composed into the overall.
        let (moves, searched) = if c.overall_cost == common::config::OverallCost::Composed {
            (c.plan_moves, c.plan_search)
        } else {
            (0, 0)
        };
        if self.searches_every_start(task.devices) {
            return self.search_each(task, mem, episodes, self.search_starts(task, mem));
        }
        let heuristics = self.heuristic_plans(task, mem);
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
                Vec::new(),
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
                    Vec::new(),
                );
            }
        }
        let best = self.cheapest(&candidates, &reps, task.devices);
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
            Vec::new(),
        )
    }

    /// Whether `plan` searches from every start, without moves, on a task
    /// of `devices` ([`Model::search_each`]).
    pub(crate) fn searches_every_start(&self, devices: usize) -> bool {
        let c = &self.plan_cfg;
        c.overall_cost == common::config::OverallCost::Composed
            && c.plan_search > 1
            && devices > 1
            && c.plan_search_every_candidate
            && c.plan_moves == 0
    }

    /// The cheap heuristics' plans (`lookup`, `size_lookup`, `torchrec`)
    /// where `model.plan_heuristics` has them compete, those that fit.
    fn heuristic_plans(&self, task: &Task, mem: &common::MemoryModel) -> Vec<Vec<usize>> {
        if !self.plan_cfg.plan_heuristics {
            return Vec::new();
        }
        use crate::baselines::Method::{Lookup, SizeLookup, Torchrec};
        let found =
            crate::baselines::plans_for(task, mem, self.batch, &[Lookup, SizeLookup, Torchrec]);
        found.map(|p| p.assignment).collect()
    }

    /// Where [`Model::search_each`] starts besides the policy's episodes:
    /// `lookup`'s and `torchrec`'s plans, and the tables piled up by
    /// first-fit decreasing (largest first, each on the first device it
    /// fits). Balanced starts lie in like basins of the search; from a
    /// piled one it moves tables off the slowest device one at a time and
    /// ends in another (docs/results.md, "A piled start for the search").
    /// `size_lookup`'s plan is no start: the search runs as many times as
    /// before. So where that plan is the cheapest candidate, searching
    /// from every start may predict higher than searching from the
    /// cheapest. None without `model.plan_heuristics`.
    fn search_starts(&self, task: &Task, mem: &common::MemoryModel) -> Vec<Vec<usize>> {
        if !self.plan_cfg.plan_heuristics {
            return Vec::new();
        }
        use crate::baselines::Method::{Lookup, Torchrec};
        let balanced = crate::baselines::plans_for(task, mem, self.batch, &[Lookup, Torchrec]);
        let piled =
            common::suite::first_fit_decreasing(&task.tables, task.devices, task.cap_bytes(), mem);
        balanced.map(|p| p.assignment).chain(piled).collect()
    }

    /// The candidate the cost network predicts cheapest among those that
    /// fit (the first on a tie; the first of all when none fits), in one
    /// batched forward from the tables' representations `reps`.
    fn cheapest(&self, candidates: &[(Vec<usize>, bool)], reps: &Tensor, devices: usize) -> usize {
        if candidates.len() == 1 {
            return 0;
        }
        let (n, d) = (candidates.len() as i64, devices as i64);
        let device_of: Vec<i64> = candidates
            .iter()
            .enumerate()
            .flat_map(|(i, (a, _))| a.iter().map(move |&x| i as i64 * d + x as i64))
            .collect();
        let dev = Tensor::zeros([n * d, reps.size()[1]], (Kind::Float, Device::Cpu)).index_add(
            0,
            &Tensor::from_slice(&device_of),
            &reps.repeat([n, 1]),
        );
        let plan_of_device =
            Tensor::arange(n, (Kind::Int64, Device::Cpu)).repeat_interleave_self_int(d, 0, None);
        let ctx = self.cost.context(reps, devices);
        let costs: Vec<f32> = tensor_vec(&self.cost.overall_cost(&dev, &plan_of_device, n, &ctx));
        (0..candidates.len())
            .filter(|&i| !candidates[i].1)
            .min_by(|&a, &b| costs[a].total_cmp(&costs[b]).then(a.cmp(&b)))
            .unwrap_or(0)
    }

    /// `plan` searching from every start, without moves: each episode
    /// then the search from its plan, and the search from each distinct
    /// plan of `starts` ([`Model::search_starts`]), as one job each,
    /// spread over the cores (a search does not wait for the others). The
    /// lowest predicted result wins, the first on a tie; with no start
    /// that fits, the greedy episode as it is.
    fn search_each(
        &self,
        task: &Task,
        mem: &common::MemoryModel,
        episodes: &PlainEpisodes,
        starts: Vec<Vec<usize>>,
    ) -> (Plan, bool, Vec<Vec<usize>>) {
        let mut done = self.searches_each(task, mem, episodes, starts);
        let mut others = ends(&done);
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
        others.retain(|o| *o != assignment);
        (
            Plan {
                devices: task.devices,
                assignment,
            },
            infeasible,
            others,
        )
    }

    /// [`Model::search_each`]'s searches, in order: the episodes, then
    /// each distinct start.
    fn searches_each(
        &self,
        task: &Task,
        mem: &common::MemoryModel,
        episodes: &PlainEpisodes,
        starts: Vec<Vec<usize>>,
    ) -> Vec<Searched> {
        let c = &self.plan_cfg;
        let k = c.plan_samples.max(1);
        let net = crate::search::CostNetOracle::from_projected(
            episodes.heads().clone(),
            episodes.cost_projections().to_vec(),
            0,
        );
        let distinct = distinct(starts);
        let jobs: Vec<usize> = (0..k + distinct.len()).collect();
        in_threads(&jobs, |&j| {
            let (start, infeasible) = match j {
                0 => episodes.greedy(),
                j if j < k => episodes.sampled(j as u64, c.plan_temperature),
                j => (distinct[j - k].clone(), false),
            };
            let found = (!infeasible)
                .then(|| Self::search_from(&net, task, mem, start.clone(), c.plan_search));
            (start, infeasible, found)
        })
    }

    /// The distinct plans where `plan`'s searches on the cost network end,
    /// one per basin they reach, cheapest predicted first: the first is
    /// `plan`'s own where it searches from every start and some start
    /// fits. Measuring the others teaches the network the basins it ranks
    /// below its pick (`train.measure_basins_share`). Empty where `plan`
    /// does not search from every start; a search that failed ends in no
    /// basin.
    pub fn basins(&self, task: &Task, mem: &common::MemoryModel) -> Vec<Vec<usize>> {
        if !self.searches_every_start(task.devices) {
            return Vec::new();
        }
        let mdp = MdpTask::new(&task.tables, task.devices, task.cap_bytes(), mem);
        self.basins_of(
            task,
            mem,
            &PlainEpisodes::new(&self.policy, &self.cost, &mdp),
        )
    }

    /// [`Model::basins`] from the task's episodes already made (see
    /// [`PlainEpisodes::new`]), for a caller that holds them.
    pub fn basins_of(
        &self,
        task: &Task,
        mem: &common::MemoryModel,
        episodes: &PlainEpisodes,
    ) -> Vec<Vec<usize>> {
        if !self.searches_every_start(task.devices) {
            return Vec::new();
        }
        ends(&self.searches_each(task, mem, episodes, self.search_starts(task, mem)))
    }

    /// Where `plan`'s search on the cost network goes from each of
    /// `starts` (plans that fit `task`): the plan each search keeps, for
    /// measuring. The search goes where the network predicts low, and so
    /// where it is most wrong: measuring what it finds teaches the network
    /// its errors there (pre-training's rounds, the learner's `pretrain`).
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
        let heads = self.cost.device_heads(&reps, task.devices);
        let net = crate::search::CostNetOracle::new(heads, &reps, 0);
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
        let costs_of = |t: &Tensor| tensor_vec::<f32>(t);
        let ctx = self.cost.context(reps, d);
        let mut pd = costs_of(&self.cost.device_costs(&dev_repr, &ctx));
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
                    .device_costs(&Tensor::cat(&[src_repr, dst_repr], 0), &ctx),
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

/// The distinct plans that `searches` kept with a finite prediction,
/// cheapest predicted first (the first of equal predictions stays first,
/// as in `plan`).
fn ends(searches: &[Searched]) -> Vec<Vec<usize>> {
    let mut found: Vec<&(Vec<usize>, f64)> = searches
        .iter()
        .filter_map(|(_, _, found)| found.as_ref().filter(|f| f.1.is_finite()))
        .collect();
    found.sort_by(|a, b| a.1.total_cmp(&b.1));
    distinct(found.into_iter().map(|(plan, _)| plan.clone()))
}

/// The plans of `plans` in order, each once.
fn distinct(plans: impl IntoIterator<Item = Vec<usize>>) -> Vec<Vec<usize>> {
    let mut out: Vec<Vec<usize>> = Vec::new();
    for p in plans {
        if !out.contains(&p) {
            out.push(p);
        }
    }
    out
}

/// `f` of each item, in order, spread over up to one thread per core (each
/// takes the next item when free) when there are several items (for
/// plain-Rust work such as `plan`'s episodes and searches: each is seeded,
/// so the results do not depend on the threads).
fn in_threads<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    // Asked once: the answer reads the process's CPU quota from files.
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let cores = *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{small_config, small_suite};

    #[test]
    fn plan_selection_moves_and_search_never_predict_worse_than_greedy() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = small_config();
        let suite = small_suite(&cfg, "test", dir.path());
        let mut model = Model::seeded(&cfg, 3);
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
            // Without moves, a search runs from each start as soon as it is
            // known (the episodes, `search_starts`): no worse than any start.
            model.plan_cfg.plan_moves = 0;
            let (each, each_infeasible) = model.plan(task, &cfg.memory);
            assert!(!each_infeasible);
            assert_eq!(each, model.plan(task, &cfg.memory).0, "reproducible");
            let each = model.estimate(&task.tables, &each).1;
            let starts = model.search_starts(task, &cfg.memory);
            assert!(!starts.is_empty(), "no heuristic and no piled start fits");
            for start in starts.into_iter().chain([greedy.assignment.clone()]) {
                let plan = Plan {
                    devices: task.devices,
                    assignment: start,
                };
                let sc = model.estimate(&task.tables, &plan).1;
                assert!(each <= sc + 1e-4, "each {each} ms vs a start's {sc} ms");
            }
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
            let heads = model.cost.device_heads(&reps, task.devices);
            let mut net = crate::search::CostNetOracle::new(heads, &reps, 0);
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

    /// The search starts from `lookup`'s and `torchrec`'s balanced plans
    /// and from the tables piled up by first-fit decreasing; with room for
    /// all, onto one device.
    #[test]
    fn the_search_also_starts_from_the_tables_piled_up() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = small_config();
        let suite = small_suite(&cfg, "test", dir.path());
        let mut model = Model::seeded(&cfg, 0);
        let mut task = suite.tasks[0].clone();
        let total: u64 = task.tables.iter().map(|t| cfg.memory.table_bytes(t)).sum();
        let devices_used = |a: &[usize]| {
            let mut d = a.to_vec();
            d.sort_unstable();
            d.dedup();
            d.len()
        };
        // Room for every table on one device.
        let roomy = |t: &mut Task| {
            let all: u64 = t.tables.iter().map(|x| cfg.memory.table_bytes(x)).sum();
            t.memory_gb *= 2.0 * all as f64 / t.cap_bytes() as f64;
        };
        roomy(&mut task);
        let starts = model.search_starts(&task, &cfg.memory);
        assert_eq!(starts.len(), 3);
        assert_eq!(devices_used(&starts[2]), 1, "{:?}", starts[2]);
        for balanced in &starts[..2] {
            assert_eq!(devices_used(balanced), task.devices, "{balanced:?}");
        }
        // `plan` keeps the lowest prediction of the searches from the
        // greedy episode and from these starts (the first on a tie).
        model.plan_cfg.plan_samples = 1;
        model.plan_cfg.plan_moves = 0;
        model.plan_cfg.plan_search = 200;
        let mut several = 0;
        for mut t in suite.tasks.iter().cloned() {
            roomy(&mut t);
            let mdp = MdpTask::new(&t.tables, t.devices, t.cap_bytes(), &cfg.memory);
            let episodes = PlainEpisodes::new(&model.policy, &model.cost, &mdp);
            let net = crate::search::CostNetOracle::from_projected(
                episodes.heads().clone(),
                episodes.cost_projections().to_vec(),
                0,
            );
            let found: Vec<(Vec<usize>, f64)> = [episodes.greedy().0]
                .into_iter()
                .chain(model.search_starts(&t, &cfg.memory))
                .map(|s| Model::search_from(&net, &t, &cfg.memory, s, 200))
                .collect();
            let lowest = found.iter().map(|f| f.1).fold(f64::INFINITY, f64::min);
            let first = found.iter().position(|f| f.1 == lowest).unwrap();
            assert_eq!(model.plan(&t, &cfg.memory).0.assignment, found[first].0);
            // The basins: every search's end once, cheapest predicted
            // first, `plan`'s own first of all.
            let basins = model.basins(&t, &cfg.memory);
            several += usize::from(basins.len() > 1);
            assert_eq!(basins[0], found[first].0);
            let predicted = |b: &Vec<usize>| found.iter().find(|f| &f.0 == b).unwrap().1;
            assert!(found.iter().all(|f| basins.contains(&f.0)));
            for (i, b) in basins.iter().enumerate().skip(1) {
                assert!(!basins[..i].contains(b), "{b:?} twice");
                assert!(predicted(&basins[i - 1]) <= predicted(b));
            }
        }
        assert!(several > 0, "every task's searches ended alike");
        model.plan_cfg.plan_search = 0;
        assert!(model.basins(&task, &cfg.memory).is_empty());
        model.plan_cfg.plan_search = 200;
        // Room for a little over half the tables (or the largest) per
        // device: piled onto fewer devices than the balanced plans, within
        // the cap.
        let largest = task.tables.iter().map(|t| cfg.memory.table_bytes(t)).max();
        let cap = (0.55 * total as f64).max(1.01 * largest.unwrap() as f64);
        task.memory_gb *= cap / task.cap_bytes() as f64;
        let mut starts = model.search_starts(&task, &cfg.memory);
        let piled = starts.pop().unwrap();
        assert!(!starts.is_empty(), "no balanced plan fits");
        assert_eq!(
            Some(piled.clone()),
            common::suite::first_fit_decreasing(
                &task.tables,
                task.devices,
                task.cap_bytes(),
                &cfg.memory
            )
        );
        let used = Plan {
            devices: task.devices,
            assignment: piled.clone(),
        }
        .device_bytes(&task.tables, &cfg.memory);
        assert!(used.iter().all(|&u| u <= task.cap_bytes()), "{used:?}");
        for balanced in &starts {
            assert!(devices_used(&piled) < devices_used(balanced), "{used:?}");
        }
        model.plan_cfg.plan_heuristics = false;
        assert!(model.search_starts(&task, &cfg.memory).is_empty());
    }
}
