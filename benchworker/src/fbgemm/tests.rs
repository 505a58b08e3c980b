use super::*;
use crate::fused::sum_bags;

/// Lookups of a table of `rows` rows for `batch` bags: bag `b` has
/// `(b + seed) % 4` of them (an empty bag among them), rows repeated within
/// and across bags.
fn lookups(rows: i64, batch: i64, seed: i64) -> Lookups {
    let (mut indices, mut offsets, mut bags) = (Vec::new(), Vec::new(), Vec::new());
    for b in 0..batch {
        offsets.push(indices.len() as i64);
        for k in 0..(b + seed) % 4 {
            indices.push((b * 7 + (k % 2) * 13 + seed) % rows);
            bags.push(b);
        }
    }
    Lookups {
        indices: Tensor::from_slice(&indices),
        offsets: Tensor::from_slice(&offsets),
        bags: Tensor::from_slice(&bags),
    }
}

fn assert_close(got: &Tensor, want: &Tensor, what: &str) {
    assert_eq!(got.size(), want.size(), "{what}: shapes");
    // fp32 sums in another order: a relative tolerance.
    let err = (got - want).abs().max().double_value(&[]);
    let scale = want.abs().max().double_value(&[]).max(1.0);
    assert!(
        err <= 1e-6 * scale,
        "{what}: off by {err} at a scale of {scale}"
    );
}

fn spec(optimizer: TbeOptimizer, precision: Precision, learning_rate: f64) -> TbeSpec {
    TbeSpec {
        device: Device::Cpu,
        precision,
        optimizer,
        learning_rate,
    }
}

/// The forward is each table's `embedding_bag` (sum), side by side in
/// table order; the backward sums each looked-up row's gradients `g` and
/// applies the optimizer to those rows only, as FBGEMM documents: SGD
/// `w -= lr · g`; AdaGrad `m += g²`, `w -= lr · g / (√m + ε)`; row-wise
/// AdaGrad the same with `m += mean(g²)`, one `m` per row.
#[test]
fn forward_is_embedding_bag_and_backward_is_the_fused_optimizer() {
    for optimizer in TbeOptimizer::ALL {
        check_two_steps(optimizer);
    }
}

fn check_two_steps(optimizer: TbeOptimizer) {
    let (rows, dims, batch, lr) = ([50i64, 80, 30], [8i64, 16, 4], 4i64, 0.05);
    let ls: Vec<Lookups> = (0..3).map(|t| lookups(rows[t], batch, t as i64)).collect();
    let mut tbe = Tbe::build(
        &rows,
        &dims,
        &ls,
        batch,
        spec(optimizer, Precision::Fp32, lr),
    )
    .unwrap();
    // Every weight its own value, so that a row taken for another shows.
    for t in 0..3 {
        let w = tbe.table_weight(t).unwrap();
        let values = Tensor::arange(rows[t] * dims[t], tch::kind::FLOAT_CPU).sin();
        tch::no_grad(|| w.view([-1]).copy_(&values));
    }
    let mut momentum: Vec<Tensor> = (0..3)
        .map(|t| match optimizer {
            TbeOptimizer::Adagrad => Tensor::zeros([rows[t], dims[t]], tch::kind::FLOAT_CPU),
            _ => Tensor::zeros([rows[t]], tch::kind::FLOAT_CPU),
        })
        .collect();
    for step in 0..2 {
        let weights: Vec<Tensor> = (0..3)
            .map(|t| tbe.table_weight(t).unwrap().copy())
            .collect();
        let out = tbe.forward().unwrap();
        let parts: Vec<Tensor> = (0..3)
            .map(|t| sum_bags(&weights[t], &ls[t].indices, &ls[t].offsets).unwrap())
            .collect();
        assert_close(&out, &Tensor::cat(&parts, 1), "forward");
        let grad = Tensor::arange(batch * 28, tch::kind::FLOAT_CPU)
            .view([batch, 28])
            .sin()
            * (step + 1) as f64;
        tbe.backward(&out, &grad).unwrap();
        let mut column = 0;
        for t in 0..3 {
            let g = grad.narrow(1, column, dims[t]).index_select(0, &ls[t].bags);
            column += dims[t];
            let rows_grad = Tensor::zeros([rows[t], dims[t]], tch::kind::FLOAT_CPU).index_add(
                0,
                &ls[t].indices,
                &g,
            );
            let update = match optimizer {
                TbeOptimizer::Sgd => &rows_grad * lr,
                TbeOptimizer::Adagrad => {
                    momentum[t] += rows_grad.square();
                    &rows_grad / (momentum[t].sqrt() + EPS) * lr
                }
                TbeOptimizer::RowwiseAdagrad => {
                    momentum[t] += rows_grad.square().mean_dim(1, false, Kind::Float);
                    &rows_grad / (momentum[t].sqrt().unsqueeze(1) + EPS) * lr
                }
            };
            let want = &weights[t] - update;
            let what = format!("{optimizer:?}, table {t}, step {step}");
            match tbe.table_momentum(t).unwrap() {
                Some(m) => assert_close(&m, &momentum[t], &format!("momentum, {what}")),
                None => assert_eq!(optimizer, TbeOptimizer::Sgd),
            }
            assert_close(
                &tbe.table_weight(t).unwrap(),
                &want,
                &format!("weights, {what}"),
            );
        }
    }
    // Rows nobody looked up keep their weights and no state.
    let looked: Vec<i64> = Vec::<i64>::try_from(&ls[0].indices).unwrap();
    let untouched = (0..rows[0]).find(|r| !looked.contains(r)).unwrap();
    if let Some(m) = tbe.table_momentum(0).unwrap() {
        assert_eq!(
            m.get(untouched).abs().sum(Kind::Float).double_value(&[]),
            0.0
        );
    }
}

/// On a GPU the op takes `[dev, uvm, placements, offsets]` (and the
/// weights' cache last); on the CPU `[host, placements, offsets]`.
#[test]
fn the_state_lists_are_laid_out_for_the_device() {
    let state = Tensor::zeros([12], tch::kind::FLOAT_CPU);
    let placements = Tensor::from_slice(&[DEVICE as i32, DEVICE as i32]);
    let offsets = Tensor::from_slice(&[0i64, 8]);
    let cache = || Some(Tensor::zeros([0, 0], tch::kind::FLOAT_CPU));
    let cpu = state_list(&state, &placements, &offsets, cache(), false).unwrap();
    let kinds = |l: &[Tensor]| l.iter().map(|t| t.kind()).collect::<Vec<_>>();
    assert_eq!(kinds(&cpu), [Kind::Float, Kind::Int, Kind::Int64]);
    let gpu = state_list(&state, &placements, &offsets, cache(), true).unwrap();
    let sizes: Vec<Vec<i64>> = gpu.iter().map(|t| t.size()).collect();
    assert_eq!(sizes, [vec![12], vec![0], vec![2], vec![2], vec![0, 0]]);
    let five = [
        Kind::Float,
        Kind::Float,
        Kind::Int,
        Kind::Int64,
        Kind::Float,
    ];
    assert_eq!(kinds(&gpu), five);
    // The state itself first, not a copy.
    assert_eq!(gpu[0].data_ptr(), state.data_ptr());
    let momentum = state_list(&state, &placements, &offsets, None, true).unwrap();
    assert_eq!(momentum.len(), 4);
}

#[test]
fn half_weights_give_a_float_output() {
    let ls = [lookups(20, 8, 1)];
    let opt = TbeOptimizer::RowwiseAdagrad;
    let mut tbe = Tbe::build(&[20], &[12], &ls, 8, spec(opt, Precision::Fp16, 0.1)).unwrap();
    let w = tbe.table_weight(0).unwrap().to_kind(Kind::Float);
    let out = tbe.forward().unwrap();
    assert_eq!(out.kind(), Kind::Float);
    let want = sum_bags(&w, &ls[0].indices, &ls[0].offsets).unwrap();
    let err = (&out - want).abs().max().double_value(&[]);
    assert!(err < 1e-3, "{err}");
    tbe.backward(&out, &out.ones_like()).unwrap();
}

#[test]
fn the_index_bits_are_fbgemms() {
    // `torch.ops.fbgemm.get_infos_metadata` for these table counts.
    for (tables, bits) in [(1, 31), (2, 30), (3, 30), (4, 29), (7, 29), (100, 25)] {
        assert_eq!(
            info_bits(tables),
            (bits, (1 << bits) - 1),
            "{tables} tables"
        );
    }
    for (rows, bits) in [(0, 0), (1, 1), (2, 2), (160, 8), (255, 8), (256, 9)] {
        assert_eq!(hash_size_bits(rows), bits, "{rows} rows");
    }
}

#[test]
fn a_missing_library_or_another_schema_says_what_to_install() {
    let dir = tempfile::tempdir().unwrap();
    let e = load_from(dir.path()).unwrap_err().to_string();
    for words in [
        LIBRARIES[0],
        "fbgemm-gpu-cpu==1.8.0",
        DIR_VAR,
        "kernel = \"torch\" under [cpu] or [cuda]",
        "--kernel torch",
    ] {
        assert!(e.contains(words), "{words:?} not in {e}");
    }
    for o in TbeOptimizer::ALL {
        assert!(check_schema(o, &o.schema()).is_ok(), "{o:?}");
    }
    let rowwise = TbeOptimizer::RowwiseAdagrad;
    let want = rowwise.schema();
    let other = want.replace("int pooling_mode", "int pooling");
    let e = check_schema(rowwise, &other).unwrap_err().to_string();
    assert!(e.contains(&other) && e.contains(&want), "{e}");
    // The op of one optimizer is not the schema of another.
    assert!(check_schema(TbeOptimizer::Sgd, &want).is_err());
    // Adam has no CPU kernel in FBGEMM: the error says what measures it.
    let e = TbeOptimizer::of(Optimizer::Adam).unwrap_err().to_string();
    assert!(
        e.contains("Adam") && e.contains("kernel = \"torch\""),
        "{e}"
    );
    // A GPU's dims must be multiples of 4: refused before anything is
    // made on the device (so this runs without one).
    let ls = [lookups(20, 4, 0)];
    let gpu = TbeSpec {
        device: Device::Cuda(0),
        ..spec(rowwise, Precision::Fp32, 0.1)
    };
    let e = Tbe::build(&[20], &[6], &ls, 4, gpu).unwrap_err();
    assert!(matches!(e, FbgemmError::Dim { table: 0, dim: 6 }), "{e:?}");
    // Lookups of another batch are refused before any call.
    let ls = [lookups(20, 4, 0)];
    let e = Tbe::build(&[20], &[4], &ls, 5, spec(rowwise, Precision::Fp32, 0.1)).unwrap_err();
    assert!(e.to_string().contains("4 bags for a batch of 5"), "{e}");
}
