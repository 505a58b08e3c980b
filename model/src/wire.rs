//! Tensors to and from the plain data of the wire protocol: unrolls and
//! network weights. Whatever arrives is checked against what the receiver
//! knows (the task's tables and devices, its own parameters' names and
//! shapes) before it becomes a tensor: a bad payload is an error naming the
//! fault, never a panic inside libtorch.

use common::payload::{NamedArray, UnrollData};
use tch::{nn, Device, Kind, Tensor};

use crate::mdp::Unroll;
use crate::nets::DEVICE_FEATURES;

/// The largest predicted cost an unroll may carry, in ms (days of an
/// iteration): far above any real one, far below where the learner's f32
/// sums of them overflow.
const MAX_COST_MS: f32 = 1e9;
/// The reward scales an unroll may carry, in ms (a task's balanced cost:
/// microseconds to days); outside, its rewards would overflow.
const REWARD_SCALE_RANGE: std::ops::RangeInclusive<f64> = 1e-9..=1e9;

/// The most episodes an unroll may hold ([`unroll_from_data`] refuses more).
pub const MAX_EPISODES: usize = 1 << 16;

/// An unroll of rollout task `task` as plain data.
pub fn unroll_to_data(task: u32, u: &Unroll) -> UnrollData {
    let actions: Vec<i64> = crate::tensor_vec(&u.actions);
    UnrollData {
        task,
        episodes: u.actions.size()[1] as u32,
        order: u.order.iter().map(|&i| i as u32).collect(),
        actions: actions.iter().map(|&a| a as u32).collect(),
        behaviour_logp: crate::tensor_vec(&u.behaviour_logp),
        masks: crate::tensor_vec(&u.masks),
        device_features: crate::tensor_vec(&u.device_features),
        predicted_cost_ms: crate::tensor_vec(&u.predicted_cost_ms),
        reward_scale: u.reward_scale,
        infeasible: u.infeasible.clone(),
    }
}

/// Why an unroll from the wire is refused: what in it is wrong.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum UnrollError {
    #[error("unknown task {0}")]
    Task(usize),
    #[error("{0} episodes (1..={MAX_EPISODES})")]
    Episodes(usize),
    #[error("{what}: {got} values, expected {want}")]
    Length {
        what: &'static str,
        got: usize,
        want: usize,
    },
    #[error("order: table {0} out of range or repeated")]
    Order(u32),
    #[error("actions[{index}]: device {device} is not a legal action")]
    IllegalAction { index: usize, device: u32 },
    #[error("{what}[{index}] is not a finite number")]
    NotFinite { what: &'static str, index: usize },
    #[error("predicted_cost_ms[{index}] = {value} is beyond ±{MAX_COST_MS:e} ms")]
    Cost { index: usize, value: f32 },
    #[error("behaviour_logp: a log-probability above 0")]
    PositiveLogProbability,
    #[error(
        "reward_scale {value} is not in [{lo:e}, {hi:e}] ms",
        lo = REWARD_SCALE_RANGE.start(),
        hi = REWARD_SCALE_RANGE.end()
    )]
    RewardScale { value: f64 },
}

/// Why weights are refused: nothing of them was copied.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ImportError {
    #[error("unknown parameter `{0}`")]
    Unknown(String),
    #[error("parameter `{0}` given twice")]
    Twice(String),
    #[error("parameter `{name}`: shape {shape:?} with {values} values, expected {expected:?}")]
    Shape {
        name: String,
        shape: Vec<i64>,
        values: usize,
        expected: Vec<i64>,
    },
    #[error("parameter `{0}` holds a non-finite value")]
    NotFinite(String),
    #[error("{given} parameters given, the network has {has}; missing: {}", missing.join(", "))]
    Missing {
        given: usize,
        has: usize,
        missing: Vec<String>,
    },
    /// Another error, in the store named (`policy`, `cost`).
    #[error("{store}: {error}")]
    In {
        store: String,
        error: Box<ImportError>,
    },
}

/// Rebuilds an unroll of a task with `tables` tables on `devices` devices,
/// checking every size, index and number.
pub fn unroll_from_data(
    d: &UnrollData,
    tables: usize,
    devices: usize,
) -> Result<Unroll, UnrollError> {
    let (m, e) = (tables, d.episodes as usize);
    if e == 0 || e > MAX_EPISODES {
        return Err(UnrollError::Episodes(e));
    }
    let steps = m * e;
    let check = |what: &'static str, got: usize, want: usize| {
        if got == want {
            Ok(())
        } else {
            Err(UnrollError::Length { what, got, want })
        }
    };
    check("order", d.order.len(), m)?;
    check("actions", d.actions.len(), steps)?;
    check("behaviour_logp", d.behaviour_logp.len(), steps)?;
    check("masks", d.masks.len(), steps * devices)?;
    check(
        "device_features",
        d.device_features.len(),
        steps * devices * DEVICE_FEATURES as usize,
    )?;
    check("predicted_cost_ms", d.predicted_cost_ms.len(), e)?;
    check("infeasible", d.infeasible.len(), e)?;
    let mut seen = vec![false; m];
    for &t in &d.order {
        match seen.get_mut(t as usize) {
            Some(s) if !*s => *s = true,
            _ => return Err(UnrollError::Order(t)),
        }
    }
    for (i, &a) in d.actions.iter().enumerate() {
        if a as usize >= devices || !d.masks[i * devices + a as usize] {
            return Err(UnrollError::IllegalAction {
                index: i,
                device: a,
            });
        }
    }
    let finite = |what: &'static str, v: &[f32]| match v.iter().position(|x| !x.is_finite()) {
        Some(index) => Err(UnrollError::NotFinite { what, index }),
        None => Ok(()),
    };
    finite("behaviour_logp", &d.behaviour_logp)?;
    finite("device_features", &d.device_features)?;
    finite("predicted_cost_ms", &d.predicted_cost_ms)?;
    if let Some(i) = d
        .predicted_cost_ms
        .iter()
        .position(|c| c.abs() > MAX_COST_MS)
    {
        return Err(UnrollError::Cost {
            index: i,
            value: d.predicted_cost_ms[i],
        });
    }
    if d.behaviour_logp.iter().any(|&l| l > 1e-4) {
        return Err(UnrollError::PositiveLogProbability);
    }
    if !(REWARD_SCALE_RANGE.contains(&d.reward_scale)) {
        return Err(UnrollError::RewardScale {
            value: d.reward_scale,
        });
    }
    let (mi, ei, di) = (m as i64, e as i64, devices as i64);
    let actions: Vec<i64> = d.actions.iter().map(|&a| a as i64).collect();
    let mut plans = vec![vec![0usize; m]; e];
    for (step, &table) in d.order.iter().enumerate() {
        for (k, plan) in plans.iter_mut().enumerate() {
            plan[table as usize] = d.actions[step * e + k] as usize;
        }
    }
    Ok(Unroll {
        order: d.order.iter().map(|&i| i as usize).collect(),
        actions: Tensor::from_slice(&actions).view([mi, ei]),
        behaviour_logp: Tensor::from_slice(&d.behaviour_logp).view([mi, ei]),
        masks: Tensor::from_slice(&d.masks).view([mi, ei, di]),
        device_features: Tensor::from_slice(&d.device_features).view([mi, ei, di, DEVICE_FEATURES]),
        predicted_cost_ms: Tensor::from_slice(&d.predicted_cost_ms),
        reward_scale: d.reward_scale,
        infeasible: d.infeasible.clone(),
        plans,
    })
}

/// Every variable of a store, by name (sorted, so the order is stable).
pub fn export(vs: &nn::VarStore) -> Vec<NamedArray> {
    let mut vars: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    vars.into_iter()
        .map(|(name, t)| NamedArray {
            name,
            shape: t.size(),
            values: crate::tensor_vec(&t.to_kind(Kind::Float)),
        })
        .collect()
}

/// [`import`] of named tensors (a checkpoint file's).
pub fn import_tensors(vs: &nn::VarStore, named: &[(String, Tensor)]) -> Result<(), ImportError> {
    let arrays: Vec<NamedArray> = named
        .iter()
        .map(|(name, t)| NamedArray {
            name: name.clone(),
            shape: t.size(),
            values: crate::tensor_vec(&t.to_kind(Kind::Float)),
        })
        .collect();
    import(vs, &arrays)
}

/// Copies `arrays` into the store's variables: every variable must be
/// given exactly once with its exact shape and finite values, and nothing
/// else given. A refused import changes nothing.
pub fn import(vs: &nn::VarStore, arrays: &[NamedArray]) -> Result<(), ImportError> {
    check_import(vs, arrays)?;
    copy_in(vs, arrays);
    Ok(())
}

/// [`import`] into several stores (say the policy's and the cost
/// network's), all or nothing: every store's arrays are checked before any
/// store changes. An error names the store (`what`).
pub fn import_all(stores: &[(&str, &nn::VarStore, &[NamedArray])]) -> Result<(), ImportError> {
    for (what, vs, arrays) in stores {
        check_import(vs, arrays).map_err(|e| ImportError::In {
            store: what.to_string(),
            error: Box::new(e),
        })?;
    }
    for (_, vs, arrays) in stores {
        copy_in(vs, arrays);
    }
    Ok(())
}

/// What [`import`] checks: each variable of the store named exactly once,
/// with its shape and finite values, and no other name.
fn check_import(vs: &nn::VarStore, arrays: &[NamedArray]) -> Result<(), ImportError> {
    let vars = vs.variables();
    let mut seen = std::collections::HashSet::with_capacity(arrays.len());
    for a in arrays {
        let Some(v) = vars.get(&a.name) else {
            return Err(ImportError::Unknown(a.name.clone()));
        };
        if !seen.insert(a.name.as_str()) {
            return Err(ImportError::Twice(a.name.clone()));
        }
        if v.size() != a.shape || a.shape.iter().product::<i64>() != a.values.len() as i64 {
            return Err(ImportError::Shape {
                name: a.name.clone(),
                shape: a.shape.clone(),
                values: a.values.len(),
                expected: v.size(),
            });
        }
        if a.values.iter().any(|x| !x.is_finite()) {
            return Err(ImportError::NotFinite(a.name.clone()));
        }
    }
    if seen.len() != vars.len() {
        let mut missing: Vec<&str> = vars
            .keys()
            .map(String::as_str)
            .filter(|n| !seen.contains(n))
            .collect();
        missing.sort_unstable();
        return Err(ImportError::Missing {
            given: arrays.len(),
            has: vars.len(),
            missing: missing.into_iter().map(String::from).collect(),
        });
    }
    Ok(())
}

/// Copies arrays [`check_import`] accepted into the store.
fn copy_in(vs: &nn::VarStore, arrays: &[NamedArray]) {
    let vars = vs.variables();
    tch::no_grad(|| {
        for a in arrays {
            let mut v = vars[&a.name].shallow_clone();
            v.copy_(
                &Tensor::from_slice(&a.values)
                    .view(a.shape.as_slice())
                    .to_device(Device::Cpu),
            );
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mdp::{rollout, MdpTask, Mode};
    use crate::nets::{CostNet, PolicyNet};
    use common::config::ModelConfig;
    use common::generate::{generate_pool, PoolGenConfig};
    use common::MemoryModel;

    fn nets(seed: i64) -> (nn::VarStore, PolicyNet, CostNet) {
        tch::manual_seed(seed);
        let vs = nn::VarStore::new(Device::Cpu);
        let cfg = ModelConfig::default();
        let policy = PolicyNet::new(&(vs.root() / "policy"), &cfg);
        let cost = CostNet::new(&(vs.root() / "cost"), &cfg);
        (vs, policy, cost)
    }

    fn task() -> MdpTask {
        let pool = generate_pool(
            &PoolGenConfig {
                tables: 9,
                ..Default::default()
            },
            1,
        )
        .unwrap();
        MdpTask::new(&pool, 3, u64::MAX, &MemoryModel::default())
    }

    #[test]
    fn an_unroll_survives_the_wire() {
        let (_vs, policy, cost) = nets(1);
        let t = task();
        let u = rollout(&policy, &cost, &t, 5, Mode::Sample { seed: 1 });
        let back = unroll_from_data(&unroll_to_data(2, &u), 9, 3).unwrap();
        assert_eq!(back.order, u.order);
        assert_eq!(back.plans, u.plans);
        for (a, b) in [
            (&back.actions, &u.actions),
            (&back.masks, &u.masks),
            (&back.behaviour_logp, &u.behaviour_logp),
            (&back.device_features, &u.device_features),
            (&back.predicted_cost_ms, &u.predicted_cost_ms),
        ] {
            assert_eq!(a.size(), b.size());
            assert!(a.equal(b));
        }
    }

    #[test]
    fn bad_unrolls_are_refused_with_the_fault() {
        let (_vs, policy, cost) = nets(1);
        let u = rollout(&policy, &cost, &task(), 2, Mode::Sample { seed: 1 });
        let good = unroll_to_data(0, &u);
        let fault = |d: &UnrollData| unroll_from_data(d, 9, 3).unwrap_err();
        let wrong_size = unroll_from_data(&good, 10, 3).unwrap_err();
        assert!(
            matches!(wrong_size, UnrollError::Length { what: "order", .. }),
            "{wrong_size}"
        );
        let mut bad = good.clone();
        bad.actions[3] = 7;
        let e = fault(&bad);
        assert!(
            matches!(
                e,
                UnrollError::IllegalAction {
                    index: 3,
                    device: 7
                }
            ),
            "{e}"
        );
        let mut bad = good.clone();
        bad.order[1] = bad.order[0];
        assert_eq!(fault(&bad), UnrollError::Order(bad.order[0]));
        let mut bad = good.clone();
        bad.device_features[5] = f32::NAN;
        let e = fault(&bad);
        assert!(
            e == UnrollError::NotFinite {
                what: "device_features",
                index: 5
            } && e.to_string().contains("device_features[5]"),
            "{e}"
        );
        // Finite, but where the learner's sums would overflow.
        let mut bad = good.clone();
        bad.predicted_cost_ms[1] = -3e38;
        let e = fault(&bad);
        assert!(matches!(e, UnrollError::Cost { index: 1, .. }), "{e}");
        for scale in [1e-300, 0.0, 1e12, f64::NAN] {
            let mut bad = good.clone();
            bad.reward_scale = scale;
            let e = fault(&bad);
            assert!(matches!(e, UnrollError::RewardScale { .. }), "{e}");
        }
        let mut bad = good;
        bad.masks.pop();
        let e = fault(&bad);
        assert!(
            matches!(e, UnrollError::Length { what: "masks", .. }),
            "{e}"
        );
    }

    #[test]
    fn weights_copy_into_another_store_and_bad_ones_change_nothing() {
        let (a, pa, ca) = nets(1);
        let (b, pb, cb) = nets(2);
        let t = task();
        // The greedy plan up to the devices' numbering, and its predicted
        // cost: at the first step every device is empty and alike, so
        // their logits tie, and which one wins may change with libtorch's
        // threads (it did under load).
        let greedy = |p: &PolicyNet, c: &CostNet| -> (Vec<usize>, f64) {
            let u = rollout(p, c, &t, 1, Mode::Greedy);
            let plan = crate::mdp::numbered_by_first_use(&u.plans[0]);
            (plan, u.predicted_cost_ms.double_value(&[0]))
        };
        let close = |x: f64, y: f64| (x - y).abs() <= 1e-5 * x.abs().max(y.abs());
        assert!(!close(greedy(&pa, &ca).1, greedy(&pb, &cb).1));
        let sent = export(&a);
        let orig = export(&b);
        assert_ne!(orig, sent);
        let mut bad = sent.clone();
        bad[0].values[0] = f32::INFINITY;
        assert!(matches!(import(&b, &bad), Err(ImportError::NotFinite(_))));
        let mut bad = sent.clone();
        bad[1].shape = vec![1];
        assert!(matches!(import(&b, &bad), Err(ImportError::Shape { .. })));
        assert!(import(&b, &sent[1..]).is_err());
        assert_eq!(export(&b), orig, "a refused import changes nothing");
        import(&b, &sent).unwrap();
        assert_eq!(export(&b), sent);
        let ((plan_a, cost_a), (plan_b, cost_b)) = (greedy(&pa, &ca), greedy(&pb, &cb));
        assert_eq!(plan_a, plan_b);
        assert!(close(cost_a, cost_b), "{cost_a} against {cost_b}");
    }

    #[test]
    fn a_name_given_twice_is_refused_though_the_count_matches() {
        let (a, _, _) = nets(1);
        let (b, _, _) = nets(2);
        let orig = export(&b);
        let mut bad = export(&a);
        // Parameter 0 twice, parameter 1 missing: as many as the network has.
        bad[1] = bad[0].clone();
        let e = import(&b, &bad).unwrap_err();
        assert_eq!(e, ImportError::Twice(orig[0].name.clone()));
        assert_eq!(export(&b), orig, "a refused import changes nothing");
        let missing = import(&b, &export(&a)[1..]).unwrap_err();
        assert!(
            matches!(&missing, ImportError::Missing { missing: names, .. } if names == &[orig[0].name.clone()]),
            "{missing}"
        );
    }

    /// A policy and a cost network in stores of their own, as the actor
    /// keeps them.
    fn split_nets(seed: i64) -> (nn::VarStore, nn::VarStore) {
        tch::manual_seed(seed);
        let cfg = ModelConfig::default();
        let (p, c) = (
            nn::VarStore::new(Device::Cpu),
            nn::VarStore::new(Device::Cpu),
        );
        PolicyNet::new(&(p.root() / "policy"), &cfg);
        CostNet::new(&(c.root() / "cost"), &cfg);
        (p, c)
    }

    #[test]
    fn both_networks_import_together_or_not_at_all() {
        let (sp, sc) = split_nets(1);
        let (p, c) = split_nets(2);
        let (orig_p, orig_c) = (export(&p), export(&c));
        let (new_p, mut bad_c) = (export(&sp), export(&sc));
        bad_c[0].values[0] = f32::NAN;
        let e = import_all(&[("policy", &p, &new_p), ("cost", &c, &bad_c)]).unwrap_err();
        assert!(
            matches!(&e, ImportError::In { store, .. } if store == "cost"),
            "{e}"
        );
        assert!(e.to_string().starts_with("cost: parameter "), "{e}");
        assert_eq!(export(&p), orig_p, "the policy is unchanged too");
        assert_eq!(export(&c), orig_c);
        import_all(&[("policy", &p, &new_p), ("cost", &c, &export(&sc))]).unwrap();
        assert_eq!(export(&p), new_p);
        assert_eq!(export(&c), export(&sc));
    }
}
