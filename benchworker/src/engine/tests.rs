//! Written once, run on every device ([`test_device!`]) and for both
//! kernels: FBGEMM's where its libraries load (always on the CPU, where
//! setup installs them), libtorch's everywhere.

use common::{Plan, Table};

use super::*;
use crate::fused::sum_bags;
use crate::indices;
use crate::testing::test_device;

const BATCH: u64 = 13;
const LR: f64 = 0.05;
const EPS: f64 = 1e-8;

/// Five tables of three dims on three devices, the last with no table;
/// 13 samples split 5, 4, 4.
fn task() -> (Vec<Table>, Plan) {
    let t = |name: &str, rows, dim, pooling| {
        crate::test_table(name, rows, dim, pooling, &[(0, 0.5), (3, 0.5)])
    };
    let tables = vec![
        t("a", 40, 8, 3.0),
        t("b", 25, 4, 1.5),
        t("c", 60, 8, 5.0),
        t("d", 30, 12, 2.0),
        t("e", 20, 4, 4.0),
    ];
    let plan = Plan {
        devices: 3,
        assignment: vec![0, 1, 0, 1, 0],
    };
    (tables, plan)
}

/// The kernels that can run on `device` in this build and on this host.
fn kernels(device: Device) -> Vec<Kernel> {
    let mut k = vec![Kernel::Torch];
    match crate::fbgemm::load() {
        Ok(()) => k.push(Kernel::Fbgemm),
        // Setup installs FBGEMM on every CPU host: its absence fails there.
        // A GPU host that must test it (gpu-check.sh on one with FBGEMM)
        // sets EMBSHARD_KERNEL=fbgemm.
        Err(e) if device.is_cuda() => {
            let required = std::env::var("EMBSHARD_KERNEL").is_ok_and(|k| k == "fbgemm");
            assert!(
                !required,
                "EMBSHARD_KERNEL=fbgemm, but FBGEMM does not load: {e}"
            );
            eprintln!("FBGEMM's kernel not tested on {device:?}: {e}");
        }
        Err(e) => panic!("{e}"),
    }
    k
}

struct Built {
    layout: PlanLayout,
    engines: Vec<DeviceEngine>,
    /// Each device's tables' lookups, in device order.
    lookups: Vec<Vec<Lookups>>,
}

/// The task's engines, every weight set to its own value.
fn build(device: Device, kernel: Kernel, precision: Precision, optimizer: Optimizer) -> Built {
    let (tables, plan) = task();
    let layout = PlanLayout::new(&tables, &plan, BATCH, 0);
    let spec = EngineSpec {
        device,
        kernel,
        precision,
        optimizer,
        learning_rate: LR,
    };
    let mut engines = Vec::new();
    let mut all = Vec::new();
    for (d, dev) in layout.devices.iter().enumerate() {
        let of = |&t: &usize| indices::for_table(7, &tables[t], BATCH, u64::MAX, device);
        let lookups: Vec<Lookups> = dev.tables.iter().map(of).collect::<Result<_, _>>().unwrap();
        let kept = lookups.iter().map(Lookups::shallow_clone).collect();
        let engine = DeviceEngine::build(&layout, d, lookups, spec).unwrap();
        for i in 0..dev.tables.len() {
            let w = engine.table_weight(i).unwrap();
            let n = w.numel() as i64;
            let values =
                Tensor::arange_start(100 * i as i64, 100 * i as i64 + n, (Kind::Float, device))
                    .sin()
                    .view_as(&w)
                    .to_kind(w.kind());
            tch::no_grad(|| w.shallow_clone().copy_(&values));
        }
        engines.push(engine);
        all.push(kept);
    }
    Built {
        layout,
        engines,
        lookups: all,
    }
}

fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.size(), b.size());
    (a.to_kind(Kind::Float) - b.to_kind(Kind::Float))
        .abs()
        .max()
        .double_value(&[])
}

/// Each table looked up alone, `[B, dim]` each, side by side.
fn reference_forward(b: &Built, d: usize) -> Tensor {
    let parts: Vec<Tensor> = (0..b.layout.devices[d].tables.len())
        .map(|i| {
            let w = b.engines[d].table_weight(i).unwrap().to_kind(Kind::Float);
            let l = &b.lookups[d][i];
            sum_bags(&w, &l.indices, &l.offsets).unwrap()
        })
        .collect();
    Tensor::cat(&parts, 1)
}

fn forward_is_each_table_looked_up_alone(device: Device) {
    for kernel in kernels(device) {
        for (precision, tol) in [(Precision::Fp32, 1e-5), (Precision::Fp16, 2e-2)] {
            let mut b = build(device, kernel, precision, Optimizer::Sgd);
            for d in 0..3 {
                let out = b.engines[d].forward().unwrap();
                let Some(out) = out else {
                    assert!(b.layout.devices[d].is_empty() && !b.engines[d].has_tables());
                    continue;
                };
                let dims = b.layout.devices[d].dim_sum as i64;
                assert_eq!(out.size(), [BATCH as i64, dims]);
                assert_eq!((out.kind(), out.device()), (Kind::Float, device));
                let err = max_diff(&out, &reference_forward(&b, d));
                assert!(
                    err <= tol,
                    "{kernel:?} {precision:?} device {d}: off by {err}"
                );
            }
        }
    }
}
test_device!(
    forward_each_table_alone,
    forward_is_each_table_looked_up_alone
);

/// Runs one iteration's forward and forward exchange; returns the pooled
/// outputs.
fn forward_exchange(b: &mut Built) -> Vec<Option<Tensor>> {
    let pooled: Vec<Option<Tensor>> = b.engines.iter_mut().map(|e| e.forward().unwrap()).collect();
    let moved = copy_transfers(
        &b.layout.forward_transfers(),
        |d| pooled[d].as_ref(),
        |e| Some(&b.engines[e].recv),
    )
    .unwrap();
    assert_eq!(moved, BATCH * b.layout.total_dims());
    pooled
}

fn the_exchange_gives_each_device_its_samples(device: Device) {
    for kernel in kernels(device) {
        let mut b = build(device, kernel, Precision::Fp32, Optimizer::Sgd);
        let pooled = forward_exchange(&mut b);
        // Device e holds its samples of every device's tables, device
        // after device.
        for (e, &(first, count)) in b.layout.split.iter().enumerate() {
            let (first, count) = (first as i64, count as i64);
            let blocks: Vec<Tensor> = pooled
                .iter()
                .flatten()
                .map(|p| p.narrow(0, first, count).reshape([-1]))
                .collect();
            let want = Tensor::cat(&blocks, 0);
            let got = b.engines[e].recv.narrow(0, 0, want.numel() as i64);
            assert_eq!(max_diff(&got, &want), 0.0, "{kernel:?} device {e}");
        }
        // The gradients go back: device d's `[B, S_d]` gradient has, at
        // e's samples, what e sent for d's tables.
        for (e, engine) in b.engines.iter_mut().enumerate() {
            let n = engine.grad_out.numel() as i64;
            let values =
                Tensor::arange_start(1000 * e as i64, 1000 * e as i64 + n, (Kind::Float, device));
            engine.grad_out.copy_(&values);
        }
        let e = &b.engines;
        copy_transfers(
            &b.layout.backward_transfers(),
            |e_| Some(&e[e_].grad_out),
            |d| Some(&e[d].grad_in),
        )
        .unwrap();
        let widths: Vec<i64> = b.layout.devices.iter().map(|d| d.dim_sum as i64).collect();
        for (d, dev) in b
            .layout
            .devices
            .iter()
            .enumerate()
            .filter(|(_, d)| !d.is_empty())
        {
            let before: i64 = widths[..d].iter().sum();
            let grad = e[d].grad_in.view([BATCH as i64, dev.dim_sum as i64]);
            for (src, &(first, count)) in b.layout.split.iter().enumerate() {
                let (first, count) = (first as i64, count as i64);
                let sent = e[src]
                    .grad_out
                    .narrow(0, count * before, count * widths[d])
                    .view([count, widths[d]]);
                let got = grad.narrow(0, first, count);
                assert_eq!(max_diff(&got, &sent), 0.0, "device {d} from {src}");
            }
        }
    }
}
test_device!(
    exchange_round_trip,
    the_exchange_gives_each_device_its_samples
);

/// The optimizer's step on table `i` of device `d`, from its weight
/// `before`, state `state` (updated) and its output gradient `grad`
/// (`[B, dim]`), in plain tensor ops: SGD `w -= lr·g`; AdaGrad `m += g²`,
/// `w -= lr·g/(√m + ε)`; row-wise AdaGrad the same with `m += mean(g²)`
/// per row; Adam (no bias correction) `m = β₁m + (1−β₁)g`, `v = β₂v +
/// (1−β₂)g²`, `w -= lr·m/(√v + ε)`. Only rows looked up change.
fn reference_step(
    optimizer: Optimizer,
    before: &Tensor,
    lookups: &Lookups,
    grad: &Tensor,
    state: &mut (Tensor, Tensor),
) -> Tensor {
    let per_lookup = grad.index_select(0, &lookups.bags);
    let g = before
        .zeros_like()
        .index_add(0, &lookups.indices, &per_lookup);
    let touched = g.abs().sum_dim_intlist(1, true, Kind::Float).gt(0.0);
    let step = match optimizer {
        Optimizer::Sgd => &g * LR,
        Optimizer::Adagrad => {
            state.0 += g.square();
            &g / (state.0.sqrt() + EPS) * LR
        }
        Optimizer::RowwiseAdagrad => {
            state.0 += g.square().mean_dim(1, true, Kind::Float);
            &g / (state.0.sqrt() + EPS) * LR
        }
        Optimizer::Adam => {
            let m = &state.0 * 0.9 + &g * 0.1;
            let v = &state.1 * 0.999 + g.square() * 0.001;
            state.0 = m.where_self(&touched, &state.0);
            state.1 = v.where_self(&touched, &state.1);
            &state.0 / (state.1.sqrt() + EPS) * LR
        }
    };
    before - step.where_self(&touched, &step.zeros_like())
}

fn both_kernels_take_the_optimizers_step(device: Device) {
    for kernel in kernels(device) {
        let mut optimizers = vec![
            Optimizer::Sgd,
            Optimizer::Adagrad,
            Optimizer::RowwiseAdagrad,
        ];
        if kernel == Kernel::Torch {
            optimizers.push(Optimizer::Adam);
        }
        for optimizer in optimizers {
            let mut b = build(device, kernel, Precision::Fp32, optimizer);
            let mut states: Vec<Vec<(Tensor, Tensor)>> = b
                .lookups
                .iter()
                .enumerate()
                .map(|(d, ls)| {
                    (0..ls.len())
                        .map(|i| {
                            let w = b.engines[d].table_weight(i).unwrap();
                            let rows = if optimizer == Optimizer::RowwiseAdagrad {
                                w.narrow(1, 0, 1).zeros_like()
                            } else {
                                w.zeros_like()
                            };
                            (rows, w.zeros_like())
                        })
                        .collect()
                })
                .collect();
            for step in 0..2 {
                let before: Vec<Vec<Tensor>> = (0..3)
                    .map(|d| {
                        (0..b.lookups[d].len())
                            .map(|i| b.engines[d].table_weight(i).unwrap().copy())
                            .collect()
                    })
                    .collect();
                let pooled = forward_exchange(&mut b);
                for engine in &mut b.engines {
                    let n = engine.grad_in.numel() as i64;
                    let g = Tensor::arange_start(step, step + n, (Kind::Float, device)).cos();
                    engine.grad_in.copy_(&g);
                }
                for (d, p) in pooled.iter().enumerate() {
                    let Some(p) = p else { continue };
                    b.engines[d].backward(p).unwrap();
                    let dev = &b.layout.devices[d];
                    let grad = b.engines[d]
                        .grad_in
                        .view([BATCH as i64, dev.dim_sum as i64]);
                    for i in 0..dev.tables.len() {
                        let g = grad.narrow(1, dev.first_col[i] as i64, dev.dims[i] as i64);
                        let l = &b.lookups[d][i];
                        let want =
                            reference_step(optimizer, &before[d][i], l, &g, &mut states[d][i]);
                        let got = b.engines[d].table_weight(i).unwrap();
                        let err = max_diff(&got, &want);
                        assert!(
                            err <= 1e-5,
                            "{kernel:?} {optimizer:?} step {step} device {d} table {i}: off by {err}"
                        );
                        assert!(max_diff(&got, &before[d][i]) > 0.0, "nothing moved");
                    }
                }
            }
        }
    }
}
test_device!(optimizer_step, both_kernels_take_the_optimizers_step);

#[test]
fn fbgemm_refuses_adam_before_building_anything() {
    let spec = EngineSpec {
        device: Device::Cpu,
        kernel: Kernel::Fbgemm,
        precision: Precision::Fp32,
        optimizer: Optimizer::Adam,
        learning_rate: LR,
    };
    let e = spec.check().unwrap_err().to_string();
    assert!(
        e.contains("Adam") && e.contains("kernel = \"torch\""),
        "{e}"
    );
    let torch = EngineSpec {
        kernel: Kernel::Torch,
        ..spec
    };
    assert!(torch.check().is_ok());
}

#[test]
fn a_transfer_without_a_buffer_is_an_error() {
    let t = [Transfer {
        from: 0,
        to: 1,
        send_offset: 0,
        recv_offset: 0,
        count: 2,
    }];
    let buf = Tensor::zeros([4], (Kind::Float, Device::Cpu));
    let e = copy_transfers(&t, |_| Some(&buf), |_| None).unwrap_err();
    assert!(
        e.to_string().contains("no receive buffer on device 1"),
        "{e}"
    );
    assert_eq!(
        copy_transfers(&t, |_| Some(&buf), |_| Some(&buf)).unwrap(),
        2
    );
}

/// Exchange buffers too large for memory are an error, not a panic: a
/// device with no table still receives its samples of every table.
#[test]
fn exchange_buffers_that_cannot_be_allocated_are_an_error() {
    let wide = crate::test_table("w", 10, 1 << 16, 1.0, &[(0, 1.0)]);
    let plan = Plan {
        devices: 2,
        assignment: vec![0],
    };
    let layout = PlanLayout::new(&[wide], &plan, 1 << 40, 0);
    let spec = EngineSpec {
        device: Device::Cpu,
        kernel: Kernel::Torch,
        precision: Precision::Fp32,
        optimizer: Optimizer::Sgd,
        learning_rate: LR,
    };
    assert!(layout.devices[1].is_empty());
    assert!(DeviceEngine::build(&layout, 1, Vec::new(), spec).is_err());
}
