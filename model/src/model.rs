//! The trained model: the policy network and the cost network (an ensemble
//! of one or more members), saved and loaded as a checkpoint's `policy.ot`
//! and `cost.ot`, and the cost network's predictions of whole plans.
//! `plan` is in [`crate::plan`].

use std::path::Path;

use anyhow::Context;
use common::config::Config;
use common::features::scaled;
use common::Plan;
use tch::{nn, Device, Kind, Tensor};

use crate::mdp::PlainEpisodes;
use crate::nets::{CostNet, PlacedTables, PlanBatch, PolicyNet};
use crate::tensor_vec;

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

    /// A fresh model whose weights depend on `seed` alone: for tests, and
    /// for anyone who needs the same fresh model on any thread.
    ///
    /// `tch::manual_seed` seeds the one generator every thread draws
    /// from, so a [`Model::new`] after it changes when tests run in
    /// parallel. This one draws every value from its own generator,
    /// uniform within ±1/√fan_in. That is torch's bound for a linear
    /// layer's bias; its weights start wider (±√(6/fan_in)). Values that
    /// start constant (the gates' biases start at 1) keep their value.
    pub fn seeded(cfg: &Config, seed: u64) -> Model {
        use rand::{Rng, SeedableRng};
        let model = Model::new(cfg);
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        for vs in [&model.policy_vs, &model.cost_vs] {
            let vars = vs.variables();
            let mut names: Vec<&String> = vars.keys().collect();
            names.sort();
            tch::no_grad(|| {
                for name in names {
                    let mut v = vars[name].shallow_clone();
                    if starts_constant(&v) {
                        continue;
                    }
                    let weight = match name.strip_suffix(".bias") {
                        Some(stem) => &vars[&format!("{stem}.weight")],
                        None => &v,
                    };
                    let size = weight.size();
                    let fan_in = size.get(1).copied().unwrap_or(size[0]).max(1);
                    let bound = 1.0 / (fan_in as f64).sqrt();
                    let values: Vec<f32> = (0..v.numel())
                        .map(|_| rng.gen_range(-bound..bound) as f32)
                        .collect();
                    v.copy_(&Tensor::from_slice(&values).view(v.size().as_slice()));
                }
            });
        }
        model
    }

    /// Writes both networks into `dir` (`policy.ot`, `cost.ot`). Not atomic
    /// by itself: the learner's `checkpoint::save` writes into a temp folder,
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
                    crate::wire::import_tensors(vs, &named).map_err(anyhow::Error::from)
                })
                .with_context(|| {
                    format!(
                        "loading {} (a checkpoint of this configuration? its layer sizes, \
                         model.cost_members and model.cost_wide_dims must match)",
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
        let per_device: Vec<f32> = tensor_vec(&pred.per_device);
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
            .map(|m| tensor_vec::<f64>(&m.overall.to_kind(Kind::Double)))
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
    /// [`crate::nets::compose`] does. Equal to the batched forward up to
    /// float rounding.
    fn member_costs_plain(
        &self,
        features: &[[f32; common::NUM_FEATURES]],
        plans: &[&Plan],
    ) -> Vec<Vec<f64>> {
        let reps = tch::no_grad(|| self.cost.tables(&Tensor::from_slice2(features)));
        // The plans are of one task: one device count.
        let devices = plans.first().map_or(1, |p| p.devices);
        let heads = self.cost.device_heads(&reps, devices);
        let flat = tensor_vec::<f32>(&reps.to_kind(Kind::Float));
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
}

/// Each plan's iteration cost as each member predicts it (`[plan][member]`),
/// from the cost network's plain heads and the tables' projections
/// (`[tables × projected width]`): the members' device costs composed as
/// [`crate::nets::compose`] does, `max fwd + max (bwd + 2·comm)`. A plan
/// that is not one of these tables' (another count of tables, no device, a
/// table on a device it lacks) or, for heads that hold a task's context,
/// on another device count, is predicted NaN by every member: never
/// cheaper than another.
fn composed_member_costs(
    heads: &crate::nets::DeviceHeads,
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
                || heads.devices().is_some_and(|d| d != p.devices)
            {
                return vec![f64::NAN; heads.members()];
            }
            sums.clear();
            sums.resize(p.devices * w, 0.0f32);
            for (t, &d) in p.assignment.iter().enumerate() {
                let x = &projected[t * w..(t + 1) * w];
                crate::nets::add_into(&mut sums[d * w..(d + 1) * w], x);
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

/// Whether `v` holds a value it was set to rather than drawn: every
/// element equal, or a single one that is exactly 0 or 1 (a draw lands
/// there with probability 0).
fn starts_constant(v: &Tensor) -> bool {
    match v.numel() {
        0 => true,
        1 => [0.0, 1.0].contains(&v.double_value(&[])),
        _ => (v.max() - v.min()).double_value(&[]) == 0.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{small_config, small_suite};
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn a_checkpoint_loads_only_into_its_own_ensemble_size() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = small_config();
        cfg.model.cost_members = 2;
        Model::new(&cfg).save(dir.path()).unwrap();
        assert!(Model::load(&cfg, dir.path()).is_ok());
        for members in [1, 3] {
            cfg.model.cost_members = members;
            let e = Model::load(&cfg, dir.path()).err().unwrap();
            assert!(format!("{e:#}").contains("model.cost_members"), "{e:#}");
        }
    }

    /// The tests' seeded model ignores torch's shared generator: the same
    /// seed gives the same weights however far that generator has moved.
    #[test]
    fn a_seeded_model_depends_on_its_seed_alone() {
        let cfg = small_config();
        let weights = |m: &Model| -> Vec<f32> {
            let mut named: Vec<_> = m.cost_vs.variables().into_iter().collect();
            named.extend(m.policy_vs.variables());
            named.sort_by(|a, b| a.0.cmp(&b.0));
            named
                .iter()
                .flat_map(|(_, t)| crate::tensor_vec::<f32>(t))
                .collect()
        };
        let a = weights(&Model::seeded(&cfg, 7));
        let _ = Tensor::rand([1000], (Kind::Float, Device::Cpu));
        assert_eq!(a, weights(&Model::seeded(&cfg, 7)));
        assert_ne!(a, weights(&Model::seeded(&cfg, 8)));
        assert_ne!(a, weights(&Model::new(&cfg)), "not torch's own draw");
    }

    #[test]
    fn member_costs_on_plain_arrays_equal_the_batched_forward() {
        for (cost_context, cost_wide_dims) in
            [(false, vec![]), (true, vec![]), (false, vec![32, 64, 100])]
        {
            let dir = tempfile::tempdir().unwrap();
            let mut cfg = small_config();
            cfg.model.cost_members = 3;
            cfg.model.cost_context = cost_context;
            cfg.model.cost_wide_dims = cost_wide_dims;
            let suite = small_suite(&cfg, "test", dir.path());
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
            // A plan of other tables or devices is never predicted cheap;
            // with a context, neither is one on another device count.
            let bad = [
                Plan {
                    devices: task.devices,
                    assignment: vec![task.devices; task.tables.len()],
                },
                Plan {
                    devices: task.devices,
                    assignment: vec![0; task.tables.len() + 1],
                },
                Plan {
                    devices: task.devices + 1,
                    assignment: vec![task.devices; task.tables.len()],
                },
            ];
            let costs =
                model.member_costs_plain(&features, &[&plans[0], &bad[0], &bad[1], &bad[2]]);
            assert!(costs[0].iter().all(|x| x.is_finite()), "{:?}", costs[0]);
            for (k, p) in costs[1..].iter().enumerate() {
                let refused = k < 2 || cost_context;
                assert!(
                    p.len() == 3 && p.iter().all(|x| x.is_nan() == refused),
                    "{k}: {p:?}"
                );
            }
        }
    }
}
