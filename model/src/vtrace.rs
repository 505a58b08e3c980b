//! V-trace off-policy targets (IMPALA, Espeholt et al. 2018, §4.1), over
//! `[T, B]` tensors: time-major unrolls of `B` trajectories.
//!
//! With `ρ_t = π(a_t|x_t) / μ(a_t|x_t)`:
//! - `ρ̃_t = min(ρ̄, ρ_t)`, `c_t = λ·min(c̄, ρ_t)`;
//! - `δ_t = ρ̃_t (r_t + γ_t V(x_{t+1}) − V(x_t))`;
//! - `vs_t = V(x_t) + δ_t + γ_t c_t (vs_{t+1} − V(x_{t+1}))`, `vs_T = bootstrap`;
//! - policy-gradient advantage `min(ρ̄_pg, ρ_t) (r_t + γ_t vs_{t+1} − V(x_t))`.
//!
//! An episode that ends at step `t` has `γ_t = 0`, so several episodes may be
//! laid end to end in one unroll and get the targets they would get alone.
//! Targets carry no gradient.

use tch::Tensor;

/// Clipping thresholds and the trace-cutting λ.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Clipping {
    /// `ρ̄`: clips the importance weight of the temporal difference.
    pub rho: f64,
    /// `c̄`: clips the trace coefficients.
    pub c: f64,
    /// `ρ̄_pg`: clips the importance weight of the policy-gradient advantage.
    pub pg_rho: f64,
    /// `λ`: discounts the traces (1 in IMPALA).
    pub lambda: f64,
}

impl Default for Clipping {
    /// IMPALA's defaults: every threshold 1, λ = 1.
    fn default() -> Self {
        Clipping {
            rho: 1.0,
            c: 1.0,
            pg_rho: 1.0,
            lambda: 1.0,
        }
    }
}

/// V-trace targets for the value function and advantages for the policy.
#[derive(Debug)]
pub struct VTraceReturns {
    /// `[T, B]` value targets.
    pub vs: Tensor,
    /// `[T, B]` policy-gradient advantages.
    pub pg_advantages: Tensor,
}

/// Computes V-trace from log importance weights `log π − log μ`.
///
/// `log_rhos`, `discounts`, `rewards` and `values` are `[T, B]`;
/// `bootstrap_value` is `[B]`, the value after the last step.
pub fn from_importance_weights(
    log_rhos: &Tensor,
    discounts: &Tensor,
    rewards: &Tensor,
    values: &Tensor,
    bootstrap_value: &Tensor,
    clip: Clipping,
) -> VTraceReturns {
    tch::no_grad(|| {
        let (log_rhos, discounts, rewards, values, bootstrap) = (
            log_rhos.detach(),
            discounts.detach(),
            rewards.detach(),
            values.detach(),
            bootstrap_value.detach(),
        );
        let t_len = values.size()[0];
        let rhos = log_rhos.exp();
        let clipped_rhos = rhos.clamp_max(clip.rho);
        let cs = rhos.clamp_max(clip.c) * clip.lambda;
        let bootstrap_row = bootstrap.unsqueeze(0);
        let values_next = Tensor::cat(
            &[
                values.narrow(0, 1, t_len - 1),
                bootstrap_row.shallow_clone(),
            ],
            0,
        );
        let deltas = &clipped_rhos * (&rewards + &discounts * &values_next - &values);
        // vs_t − V(x_t), accumulated backwards in time.
        let mut acc = bootstrap.zeros_like();
        let mut rows = Vec::with_capacity(t_len as usize);
        for t in (0..t_len).rev() {
            acc = deltas.get(t) + discounts.get(t) * cs.get(t) * &acc;
            rows.push(acc.shallow_clone());
        }
        rows.reverse();
        let vs = Tensor::stack(&rows, 0) + &values;
        let vs_next = Tensor::cat(&[vs.narrow(0, 1, t_len - 1), bootstrap_row], 0);
        let pg_advantages =
            rhos.clamp_max(clip.pg_rho) * (&rewards + &discounts * &vs_next - &values);
        VTraceReturns { vs, pg_advantages }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ground truth as the paper writes it, an O(T²) loop:
    /// `v_s = V(x_s) + Σ_{t≥s} (Π_{i<t} γ_i)(Π_{i<t} c_i) ρ̃_t (r_t + γ_t V(x_{t+1}) − V(x_t))`,
    /// products over `i` in `s..t`. Indexed loops on purpose: they read like
    /// the sums and products of the equation.
    #[allow(clippy::needless_range_loop)]
    fn naive(
        log_rhos: &[Vec<f64>],
        discounts: &[Vec<f64>],
        rewards: &[Vec<f64>],
        values: &[Vec<f64>],
        bootstrap: &[f64],
        clip: Clipping,
    ) -> (Vec<Vec<f64>>, Vec<Vec<f64>>) {
        let t_len = values.len();
        let b_len = bootstrap.len();
        let rho = |t: usize, b: usize| log_rhos[t][b].exp();
        let next_value = |t: usize, b: usize| {
            if t + 1 < t_len {
                values[t + 1][b]
            } else {
                bootstrap[b]
            }
        };
        let mut vs = vec![vec![0.0; b_len]; t_len];
        for b in 0..b_len {
            for s in 0..t_len {
                let mut v = values[s][b];
                for t in s..t_len {
                    let mut prod = 1.0;
                    for i in s..t {
                        prod *= discounts[i][b] * clip.lambda * rho(i, b).min(clip.c);
                    }
                    v += prod
                        * rho(t, b).min(clip.rho)
                        * (rewards[t][b] + discounts[t][b] * next_value(t, b) - values[t][b]);
                }
                vs[s][b] = v;
            }
        }
        let mut adv = vec![vec![0.0; b_len]; t_len];
        for t in 0..t_len {
            for b in 0..b_len {
                let vs_next = if t + 1 < t_len {
                    vs[t + 1][b]
                } else {
                    bootstrap[b]
                };
                adv[t][b] = rho(t, b).min(clip.pg_rho)
                    * (rewards[t][b] + discounts[t][b] * vs_next - values[t][b]);
            }
        }
        (vs, adv)
    }

    fn tensor(rows: &[Vec<f64>]) -> Tensor {
        let flat: Vec<f64> = rows.iter().flatten().copied().collect();
        Tensor::from_slice(&flat).view([rows.len() as i64, rows[0].len() as i64])
    }

    fn rows(t: &Tensor) -> Vec<Vec<f64>> {
        let (t_len, b_len) = (t.size()[0], t.size()[1]);
        (0..t_len)
            .map(|i| (0..b_len).map(|j| t.double_value(&[i, j])).collect())
            .collect()
    }

    fn assert_close(a: &[Vec<f64>], b: &[Vec<f64>], what: &str) {
        assert_eq!(a.len(), b.len(), "{what}: rows");
        for (ra, rb) in a.iter().zip(b) {
            assert_eq!(ra.len(), rb.len(), "{what}: columns");
            for (x, y) in ra.iter().zip(rb) {
                assert!(
                    (x - y).abs() <= 1e-9 * (1.0 + y.abs()),
                    "{what}: {x} vs {y}"
                );
            }
        }
    }

    /// Asserts that the tensor implementation and the naive closed form agree
    /// on `[log_rhos, discounts, rewards, values]`.
    fn check_closed_form(inputs: [&[Vec<f64>]; 4], bootstrap: &[f64], clip: Clipping) {
        let [log_rhos, discounts, rewards, values] = inputs;
        let out = from_importance_weights(
            &tensor(log_rhos),
            &tensor(discounts),
            &tensor(rewards),
            &tensor(values),
            &Tensor::from_slice(bootstrap),
            clip,
        );
        let (vs, adv) = naive(log_rhos, discounts, rewards, values, bootstrap, clip);
        assert_close(&rows(&out.vs), &vs, "vs");
        assert_close(&rows(&out.pg_advantages), &adv, "pg advantages");
    }

    /// The reference inputs of DeepMind's scalable_agent `vtrace_test.py`.
    fn reference_inputs(b_len: usize) -> [Vec<Vec<f64>>; 4] {
        let t_len = 5;
        let n = (t_len * b_len) as f64;
        let grid = |f: &dyn Fn(usize, usize) -> f64| {
            (0..t_len)
                .map(|t| (0..b_len).map(|b| f(t, b)).collect())
                .collect::<Vec<Vec<f64>>>()
        };
        let k = |t: usize, b: usize| (t * b_len + b) as f64;
        [
            grid(&|t, b| 5.0 * (k(t, b) / n - 0.5)),
            grid(&|_, b| 0.9 / (b as f64 + 1.0)),
            grid(&|t, b| k(t, b)),
            grid(&|t, b| k(t, b) / b_len as f64),
        ]
    }

    #[test]
    fn matches_the_papers_closed_form_on_deepminds_reference_inputs() {
        let clip = Clipping {
            rho: 3.7,
            c: 1.0,
            pg_rho: 2.2,
            lambda: 1.0,
        };
        for b_len in [1, 5] {
            let [log_rhos, discounts, rewards, values] = reference_inputs(b_len);
            let bootstrap: Vec<f64> = (0..b_len).map(|b| b as f64 + 1.0).collect();
            check_closed_form([&log_rhos, &discounts, &rewards, &values], &bootstrap, clip);
            // The clipping is exercised: some ρ exceed 3.7 and 2.2 here.
            assert!(log_rhos.iter().flatten().any(|&l| l.exp() > 3.7));
        }
    }

    #[test]
    fn lambda_and_c_clipping_follow_the_closed_form() {
        let clip = Clipping {
            rho: 1.5,
            c: 0.7,
            pg_rho: 1.0,
            lambda: 0.8,
        };
        let [log_rhos, discounts, rewards, values] = reference_inputs(3);
        check_closed_form(
            [&log_rhos, &discounts, &rewards, &values],
            &[0.5, -1.0, 2.0],
            clip,
        );
    }

    #[test]
    fn episodes_laid_end_to_end_get_the_targets_they_get_alone() {
        let clip = Clipping {
            rho: 2.0,
            c: 1.0,
            pg_rho: 1.5,
            lambda: 1.0,
        };
        let col = |v: &[f64]| v.iter().map(|&x| vec![x]).collect::<Vec<_>>();
        // Episode A: 3 steps, terminal at its last; episode B: 4 steps, cut.
        let a = [
            col(&[0.3, -0.2, 0.9]),
            col(&[1.0, 1.0, 0.0]),
            col(&[0.0, 0.0, -2.5]),
            col(&[-1.0, -1.2, -2.0]),
        ];
        let b = [
            col(&[-0.5, 0.1, 1.2, 0.0]),
            col(&[1.0, 1.0, 1.0, 1.0]),
            col(&[0.0, 0.0, 0.0, 0.0]),
            col(&[-3.0, -2.8, -2.9, -3.1]),
        ];
        let bootstrap = Tensor::from_slice(&[-3.3]);
        let run = |parts: &[&[Vec<Vec<f64>>; 4]], boot: &Tensor| {
            let cat = |k: usize| {
                let all: Vec<Vec<f64>> = parts.iter().flat_map(|p| p[k].clone()).collect();
                tensor(&all)
            };
            from_importance_weights(&cat(0), &cat(1), &cat(2), &cat(3), boot, clip)
        };
        let together = run(&[&a, &b], &bootstrap);
        // A ends in a terminal step: whatever follows it does not matter.
        let alone_a = run(&[&a], &Tensor::from_slice(&[123.0]));
        let alone_b = run(&[&b], &bootstrap);
        let expect_vs: Vec<Vec<f64>> = rows(&alone_a.vs)
            .into_iter()
            .chain(rows(&alone_b.vs))
            .collect();
        let expect_adv: Vec<Vec<f64>> = rows(&alone_a.pg_advantages)
            .into_iter()
            .chain(rows(&alone_b.pg_advantages))
            .collect();
        assert_close(&rows(&together.vs), &expect_vs, "vs");
        assert_close(&rows(&together.pg_advantages), &expect_adv, "pg advantages");
    }
}
