//! Adam (Kingma & Ba, 2015) with its moments held as tensors, so that a
//! checkpoint can save and restore them; libtorch's optimizer through tch
//! does not expose its state.
//!
//! `m ← β₁m + (1−β₁)g`, `v ← β₂v + (1−β₂)g²`,
//! `p ← p − lr · (m / (1−β₁ᵗ)) / (√(v / (1−β₂ᵗ)) + ε)`;
//! with a weight decay `λ`, first `p ← p · (1 − lr·λ)` (decoupled, as
//! AdamW: Loshchilov & Hutter, 2019), or, anchored at weights `a`,
//! `p ← p − lr·λ·(p − a)` (L2-SP's pull toward a starting point: Li et
//! al., 2018).

use tch::{Kind, Tensor};

/// Why a saved optimizer state does not fit the parameters.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StateError {
    #[error("optimizer state lacks `{0}`")]
    Missing(String),
    #[error("optimizer state for `{0}` has the wrong shape")]
    Shape(String),
}

/// Adam over a fixed list of parameters.
#[derive(Debug)]
pub struct Adam {
    params: Vec<(String, Tensor)>,
    m: Vec<Tensor>,
    v: Vec<Tensor>,
    /// Steps taken, for the bias corrections.
    t: i64,
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    /// Decoupled weight decay `λ` (0: plain Adam).
    pub weight_decay: f64,
    /// Where the decay pulls each parameter (`None`: toward zero).
    anchor: Option<Vec<Tensor>>,
}

impl Adam {
    /// Adam with PyTorch's defaults (β = 0.9, 0.999; ε = 1e-8) over the
    /// trainable variables of `vs`.
    pub fn new(vs: &tch::nn::VarStore, lr: f64) -> Adam {
        let mut params: Vec<(String, Tensor)> = vs
            .variables()
            .into_iter()
            .filter(|(_, t)| t.requires_grad())
            .collect();
        params.sort_by(|a, b| a.0.cmp(&b.0));
        let zeros = |p: &[(String, Tensor)]| p.iter().map(|(_, t)| t.zeros_like()).collect();
        Adam {
            m: zeros(&params),
            v: zeros(&params),
            params,
            t: 0,
            lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
            anchor: None,
        }
    }

    /// The same optimizer with decoupled weight decay `wd` (AdamW's `λ`).
    pub fn with_weight_decay(self, wd: f64) -> Adam {
        Adam {
            weight_decay: wd,
            ..self
        }
    }

    /// The same optimizer, its decay pulling toward the parameters' values
    /// now (copied) instead of toward zero.
    pub fn anchored(self) -> Adam {
        let anchor = tch::no_grad(|| self.params.iter().map(|(_, p)| p.copy()).collect());
        Adam {
            anchor: Some(anchor),
            ..self
        }
    }

    /// Whether the decay pulls toward an anchor rather than zero.
    pub fn is_anchored(&self) -> bool {
        self.anchor.is_some()
    }

    pub fn zero_grad(&mut self) {
        for (_, p) in &mut self.params {
            let mut g = p.grad();
            if g.defined() {
                let _ = g.zero_();
            }
        }
    }

    /// The joint L2 norm of the gradients (NaN or infinite when one of
    /// them is).
    fn grad_norm(&self) -> f64 {
        tch::no_grad(|| {
            self.params
                .iter()
                .map(|(_, p)| p.grad())
                .filter(|g| g.defined())
                .map(|g| g.square().sum(Kind::Double).double_value(&[]))
                .sum::<f64>()
                .sqrt()
        })
    }

    /// Scales the gradients by `max / norm` when their joint L2 `norm` is
    /// above `max`.
    fn clip_grads(&mut self, norm: f64, max: f64) {
        if norm > max {
            tch::no_grad(|| {
                for (_, p) in &self.params {
                    let mut g = p.grad();
                    if g.defined() {
                        let _ = g.f_mul_scalar_(max / (norm + 1e-6));
                    }
                }
            })
        }
    }

    pub fn step(&mut self) {
        self.t += 1;
        let (b1, b2) = (self.beta1, self.beta2);
        let c1 = 1.0 - b1.powi(self.t as i32);
        let c2 = 1.0 - b2.powi(self.t as i32);
        tch::no_grad(|| {
            for (i, (_, p)) in self.params.iter_mut().enumerate() {
                let g = p.grad();
                if !g.defined() {
                    continue;
                }
                if self.weight_decay > 0.0 {
                    match &self.anchor {
                        Some(a) => {
                            let pull = (&*p - &a[i]) * (self.lr * self.weight_decay);
                            let _ = p.f_sub_(&pull);
                        }
                        None => {
                            let _ = p.f_mul_scalar_(1.0 - self.lr * self.weight_decay);
                        }
                    }
                }
                self.m[i] = &self.m[i] * b1 + &g * (1.0 - b1);
                self.v[i] = &self.v[i] * b2 + g.square() * (1.0 - b2);
                let update = (&self.m[i] / c1) / ((&self.v[i] / c2).sqrt() + self.eps) * self.lr;
                let _ = p.f_sub_(&update);
            }
        })
    }

    /// Zeroes the gradients, back-propagates `loss`, clips the gradients'
    /// joint norm to `max`, steps. A gradient that is not finite (a loss
    /// that overflowed, from extreme inputs) is not stepped on: the
    /// parameters and moments stay as they were, and the answer is `false`
    /// (one such step would write NaN into every weight for good).
    #[must_use = "a step refused for a gradient that is not finite should be counted"]
    pub fn backward_step_clip_norm(&mut self, loss: &Tensor, max: f64) -> bool {
        self.zero_grad();
        loss.backward();
        let norm = self.grad_norm();
        if !norm.is_finite() {
            self.zero_grad();
            return false;
        }
        self.clip_grads(norm, max);
        self.step();
        true
    }

    /// [`Adam::backward_step_clip_norm`] without clipping.
    #[must_use = "a step refused for a gradient that is not finite should be counted"]
    pub fn backward_step(&mut self, loss: &Tensor) -> bool {
        self.backward_step_clip_norm(loss, f64::INFINITY)
    }

    /// The optimizer's state as named tensors (moments, the step count and
    /// the anchor, if any).
    pub fn state(&self) -> Vec<(String, Tensor)> {
        let mut out = vec![("t".to_string(), Tensor::from_slice(&[self.t]))];
        for (i, (name, _)) in self.params.iter().enumerate() {
            out.push((format!("m.{name}"), self.m[i].shallow_clone()));
            out.push((format!("v.{name}"), self.v[i].shallow_clone()));
            if let Some(a) = &self.anchor {
                out.push((format!("a.{name}"), a[i].shallow_clone()));
            }
        }
        out
    }

    /// Restores a state written by [`Adam::state`] for the same parameters.
    pub fn load_state(&mut self, named: &[(String, Tensor)]) -> Result<(), StateError> {
        let get = |key: &str| {
            named
                .iter()
                .find(|(n, _)| n == key)
                .map(|(_, t)| t.shallow_clone())
                .ok_or_else(|| StateError::Missing(key.to_string()))
        };
        self.t = get("t")?.int64_value(&[0]);
        // An anchored optimizer's state holds its anchor: it goes on
        // pulling toward it, not toward the weights it resumes from.
        let anchored = self.anchor.is_some();
        let mut anchor = Vec::new();
        for (i, (name, p)) in self.params.iter().enumerate() {
            let (m, v) = (get(&format!("m.{name}"))?, get(&format!("v.{name}"))?);
            if m.size() != p.size() || v.size() != p.size() {
                return Err(StateError::Shape(name.clone()));
            }
            self.m[i] = m;
            self.v[i] = v;
            if anchored {
                let a = get(&format!("a.{name}"))?;
                if a.size() != p.size() {
                    return Err(StateError::Shape(name.clone()));
                }
                anchor.push(a);
            }
        }
        if anchored {
            self.anchor = Some(anchor);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::nn::{self, Module, OptimizerConfig};
    use tch::Device;

    fn problem() -> (nn::VarStore, nn::Linear, Tensor, Tensor) {
        let vs = nn::VarStore::new(Device::Cpu);
        let lin = nn::linear(vs.root() / "lin", 3, 1, Default::default());
        let x = Tensor::from_slice(&[1.0f32, 2.0, -1.0, 0.5, 0.0, 3.0]).view([2, 3]);
        let y = Tensor::from_slice(&[1.0f32, -2.0]).view([2, 1]);
        (vs, lin, x, y)
    }

    #[test]
    fn matches_libtorchs_adam_step_for_step() {
        let (vs_a, lin_a, x, y) = problem();
        let (mut vs_b, lin_b, _, _) = problem();
        vs_b.copy(&vs_a).unwrap();
        let mut ours = Adam::new(&vs_a, 0.01);
        let mut theirs = nn::Adam::default().build(&vs_b, 0.01).unwrap();
        for _ in 0..5 {
            assert!(ours.backward_step(&lin_a.forward(&x).mse_loss(&y, tch::Reduction::Mean)));
            theirs.backward_step(&lin_b.forward(&x).mse_loss(&y, tch::Reduction::Mean));
        }
        for (name, a) in vs_a.variables() {
            let b = &vs_b.variables()[&name];
            let diff = (&a - b).abs().max().double_value(&[]);
            assert!(diff < 1e-6, "{name} differs by {diff}");
        }
    }

    #[test]
    fn with_weight_decay_matches_libtorchs_adamw_step_for_step() {
        let (vs_a, lin_a, x, y) = problem();
        let (mut vs_b, lin_b, _, _) = problem();
        vs_b.copy(&vs_a).unwrap();
        let mut ours = Adam::new(&vs_a, 0.01).with_weight_decay(0.5);
        let mut theirs = nn::AdamW {
            wd: 0.5,
            ..Default::default()
        }
        .build(&vs_b, 0.01)
        .unwrap();
        let (mut vs_c, lin_c, _, _) = problem();
        vs_c.copy(&vs_a).unwrap();
        let mut plain = Adam::new(&vs_c, 0.01);
        for _ in 0..5 {
            assert!(ours.backward_step(&lin_a.forward(&x).mse_loss(&y, tch::Reduction::Mean)));
            theirs.backward_step(&lin_b.forward(&x).mse_loss(&y, tch::Reduction::Mean));
            assert!(plain.backward_step(&lin_c.forward(&x).mse_loss(&y, tch::Reduction::Mean)));
        }
        for (name, a) in vs_a.variables() {
            let b = &vs_b.variables()[&name];
            let diff = (&a - b).abs().max().double_value(&[]);
            assert!(diff < 1e-6, "{name} differs by {diff}");
            // The decay is felt: plain Adam ends elsewhere.
            let c = &vs_c.variables()[&name];
            assert!((&a - c).abs().max().double_value(&[]) > 1e-5, "{name}");
        }
    }

    /// With no gradient, only the decay moves the weights: an anchored
    /// optimizer pulls them toward the anchor, a plain one toward zero, and
    /// a restored state pulls toward the anchor it saved.
    #[test]
    fn an_anchored_decay_pulls_toward_the_anchor_and_survives_a_restore() {
        let (vs, lin, x, _) = problem();
        let start = lin.ws.copy();
        let (lr, wd) = (0.1, 2.0);
        let mut opt = Adam::new(&vs, lr).with_weight_decay(wd).anchored();
        assert!(opt.is_anchored());
        let zero_loss = |l: &nn::Linear| l.forward(&x).sum(Kind::Float) * 0.0;
        tch::no_grad(|| {
            let _ = lin.ws.shallow_clone().f_add_scalar_(1.0);
        });
        assert!(opt.backward_step(&zero_loss(&lin)));
        // p − a = 1 · (1 − lr·λ) = 0.8 in every weight.
        let gap = (&lin.ws - &start).double_value(&[0, 0]);
        assert!((gap - 0.8).abs() < 1e-6, "{gap}");
        // A plain decay would have shrunk the weights toward zero instead.
        let (vs_p, lin_p, _, _) = problem();
        let w = lin_p.ws.copy();
        let mut plain = Adam::new(&vs_p, lr).with_weight_decay(wd);
        assert!(plain.backward_step(&zero_loss(&lin_p)));
        let ratio = (&lin_p.ws / &w).double_value(&[0, 1]);
        assert!((ratio - 0.8).abs() < 1e-6, "{ratio}");
        // Restored into an optimizer anchored elsewhere, the saved anchor
        // holds: the next step pulls toward `start` again.
        let saved = opt.state();
        let mut again = Adam::new(&vs, lr).with_weight_decay(wd).anchored();
        again.load_state(&saved).unwrap();
        assert!(again.backward_step(&zero_loss(&lin)));
        let gap = (&lin.ws - &start).double_value(&[0, 0]);
        assert!((gap - 0.64).abs() < 1e-6, "{gap}");
        // A state without an anchor cannot restore an anchored optimizer.
        let e = Adam::new(&vs, lr)
            .anchored()
            .load_state(&Adam::new(&vs, lr).state())
            .unwrap_err();
        assert!(
            matches!(e, StateError::Missing(ref k) if k.starts_with("a.")),
            "{e}"
        );
    }

    #[test]
    fn a_restored_state_continues_exactly() {
        let (vs_a, lin_a, x, y) = problem();
        let loss = |l: &nn::Linear| l.forward(&x).mse_loss(&y, tch::Reduction::Mean);
        let mut a = Adam::new(&vs_a, 0.05);
        for _ in 0..3 {
            assert!(a.backward_step(&loss(&lin_a)));
        }
        // Copy parameters and optimizer state, then take the same steps.
        let (mut vs_b, lin_b, _, _) = problem();
        vs_b.copy(&vs_a).unwrap();
        let mut b = Adam::new(&vs_b, 0.05);
        let state: Vec<(String, Tensor)> =
            a.state().into_iter().map(|(n, t)| (n, t.copy())).collect();
        b.load_state(&state).unwrap();
        for _ in 0..3 {
            assert!(a.backward_step(&loss(&lin_a)));
            assert!(b.backward_step(&loss(&lin_b)));
        }
        for (name, pa) in vs_a.variables() {
            let pb = &vs_b.variables()[&name];
            assert!((&pa - pb).abs().max().double_value(&[]) < 1e-7, "{name}");
        }
        // A fresh optimizer (no state) would have diverged from `a`.
        let (mut vs_c, lin_c, _, _) = problem();
        vs_c.copy(&vs_b).unwrap();
        let mut c = Adam::new(&vs_c, 0.05);
        assert!(c.backward_step(&loss(&lin_c)));
        assert!(b.backward_step(&loss(&lin_b)));
        let differs = vs_c
            .variables()
            .iter()
            .any(|(n, t)| (t - &vs_b.variables()[n]).abs().max().double_value(&[]) > 1e-6);
        assert!(differs);
        assert_eq!(b.load_state(&[]), Err(StateError::Missing("t".into())));
    }

    #[test]
    fn a_gradient_that_is_not_finite_changes_nothing() {
        let (vs_a, lin_a, x, y) = problem();
        let loss = |l: &nn::Linear| l.forward(&x).mse_loss(&y, tch::Reduction::Mean);
        let (mut vs_b, lin_b, _, _) = problem();
        vs_b.copy(&vs_a).unwrap();
        let mut a = Adam::new(&vs_a, 0.05);
        let mut b = Adam::new(&vs_b, 0.05);
        assert!(a.backward_step(&loss(&lin_a)));
        assert!(b.backward_step(&loss(&lin_b)));
        // An overflowed loss (inputs of 1e38 squared), and a NaN one.
        let huge = Tensor::from_slice(&[1e38f32; 6]).view([2, 3]);
        let overflow = lin_a.forward(&huge).mse_loss(&y, tch::Reduction::Mean);
        assert!(!a.backward_step_clip_norm(&overflow, 1.0));
        assert!(!a.backward_step(&(loss(&lin_a) * f64::NAN)));
        // Untouched: the next step is the one `b` takes, moments included.
        assert!(a.backward_step(&loss(&lin_a)));
        assert!(b.backward_step(&loss(&lin_b)));
        // A step taken or lost moves a weight by about the learning rate
        // (0.05); the bound leaves room for float rounding only.
        for (name, pa) in vs_a.variables() {
            assert!(pa.isfinite().all().int64_value(&[]) == 1, "{name}");
            let pb = &vs_b.variables()[&name];
            let gap = (&pa - pb).abs().max().double_value(&[]);
            assert!(gap < 1e-6, "{name} differs by {gap}");
        }
        assert_eq!(a.t, b.t);
    }
}
