//! FBGEMM's table-batched embedding (TBE): the kernel TorchRec runs in
//! production. One call looks up every table of a device, whatever their
//! dims; its backward applies the optimizer (SGD, AdaGrad or row-wise
//! AdaGrad) to the rows looked up, fused. The same op runs on the CPU and
//! on a GPU; only the layout of its weight lists differs.
//!
//! FBGEMM registers the op with libtorch's dispatcher, which tch cannot
//! call: a C++ shim does (`shim.cpp`, compiled by `build.rs` against the
//! headers of the libtorch this binary links). FBGEMM's libraries are
//! loaded at run time from the Python package `fbgemm-gpu-cpu` (or
//! `fbgemm-gpu` with CUDA) installed beside torch, so a host without them
//! still runs the `torch` kernel.
//!
//! The op's arguments are FBGEMM's internals: this build speaks those of
//! FBGEMM [`VERSION`] and checks the op's schema before its first call.

use std::ffi::{c_char, c_int, CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use common::{Optimizer, Precision};
use tch::{Device, Kind, Tensor};
use torch_sys::C_tensor;

use crate::indices::Lookups;

/// The FBGEMM release this build speaks (it pairs with torch 2.13).
pub const VERSION: &str = "1.8.0";

/// The op's schema in FBGEMM [`VERSION`] up to the optimizer's
/// arguments: the same for every optimizer.
const SCHEMA_HEAD: &str = "(Tensor placeholder_autograd_tensor, Tensor[](a!) weights, \
Tensor D_offsets, SymInt total_D, SymInt max_D, Tensor hash_size_cumsum, int total_hash_size_bits, \
Tensor indices, Tensor offsets, int pooling_mode, Tensor? indice_weights, \
Tensor? feature_requires_grad, int output_dtype, Tensor?[](e!) aux_tensor, int[] aux_int, \
float[] aux_float, bool[] aux_bool, ";
/// The schema after the optimizer's arguments.
const SCHEMA_TAIL: &str = "SymInt max_B=-1, SymInt max_B_feature_rank=-1, \
SymInt vbe_output_size=-1, Tensor? vbe_output=None) -> Tensor";

/// The optimizers FBGEMM fuses into the TBE backward that this build calls:
/// those its CPU kernels have. (Adam is CUDA-only in FBGEMM; the `torch`
/// kernel measures it.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TbeOptimizer {
    Sgd = 0,
    Adagrad = 1,
    RowwiseAdagrad = 2,
}

impl TbeOptimizer {
    pub const ALL: [TbeOptimizer; 3] = [
        TbeOptimizer::Sgd,
        TbeOptimizer::Adagrad,
        TbeOptimizer::RowwiseAdagrad,
    ];

    /// FBGEMM's kernel for `memory.optimizer`, if it has one.
    pub fn of(optimizer: Optimizer) -> Result<Self, FbgemmError> {
        match optimizer {
            Optimizer::Sgd => Ok(TbeOptimizer::Sgd),
            Optimizer::Adagrad => Ok(TbeOptimizer::Adagrad),
            Optimizer::RowwiseAdagrad => Ok(TbeOptimizer::RowwiseAdagrad),
            Optimizer::Adam => Err(FbgemmError::Optimizer(optimizer)),
        }
    }

    /// The op's name.
    pub fn op(self) -> String {
        let name = match self {
            TbeOptimizer::Sgd => "sgd",
            TbeOptimizer::Adagrad => "adagrad",
            TbeOptimizer::RowwiseAdagrad => "rowwise_adagrad",
        };
        format!("fbgemm::split_embedding_codegen_lookup_{name}_function_pt2")
    }

    /// The op's schema in FBGEMM [`VERSION`].
    pub fn schema(self) -> String {
        let optimizer_args = match self {
            TbeOptimizer::Sgd => "Tensor learning_rate_tensor, ",
            TbeOptimizer::Adagrad => {
                "Tensor[](g!) momentum1, Tensor learning_rate_tensor, float[] optim_float, "
            }
            TbeOptimizer::RowwiseAdagrad => {
                "Tensor[](g!) momentum1, Tensor learning_rate_tensor, int[] optim_int, \
                 float[] optim_float, "
            }
        };
        format!("{}{SCHEMA_HEAD}{optimizer_args}{SCHEMA_TAIL}", self.op())
    }
}

/// The libraries that register the op (forward, backward and the autograd
/// function that joins them), in FBGEMM's package folder.
const LIBRARIES: [&str; 3] = [
    "fbgemm_gpu_tbe_training_forward.so",
    "fbgemm_gpu_tbe_training_backward.so",
    "fbgemm_gpu_tbe_training_backward_pt2.so",
];

/// Overrides the folder FBGEMM's libraries are loaded from.
pub const DIR_VAR: &str = "EMBSHARD_FBGEMM_DIR";

/// Where the libtorch this binary was built against lives.
const TORCH_LIB: &str = env!("EMBSHARD_TORCH_LIB");

/// `EmbeddingLocation.DEVICE`: weights in the GPU's memory.
const DEVICE: i64 = 0;
/// `EmbeddingLocation.HOST`: weights in host memory.
const HOST: i64 = 3;
/// `PoolingMode.SUM`.
const POOLING_SUM: i64 = 0;
/// `SparseType.FP32`: the output's dtype.
const OUTPUT_FP32: i64 = 0;
const EPS: f64 = 1e-8;
/// Initial weights: a normal float, whose value does not matter for timing.
const WEIGHT_INIT: f64 = 0.01;
/// Room for an error message from the shim.
const ERR_BYTES: usize = 2048;

/// Why FBGEMM's kernel cannot run.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FbgemmError {
    #[error(
        "FBGEMM's kernel is not installed: {missing} is not in {dir}. Install \
         fbgemm-gpu-cpu=={VERSION} (fbgemm-gpu=={VERSION} on GPU hosts) into the venv beside \
         torch (scripts/setup.sh does; EMBSHARD_CUDA=1 for the GPU one), set {DIR_VAR} to the \
         folder that holds its libraries, or set kernel = \"torch\" under [cpu] or [cuda] in \
         the config (or pass --kernel torch) to measure without it"
    )]
    Missing { dir: PathBuf, missing: String },
    #[error("loading {path}: {why}")]
    Load { path: PathBuf, why: String },
    #[error(
        "FBGEMM's TBE op has another schema than this build speaks (FBGEMM {VERSION}); install \
         fbgemm-gpu-cpu=={VERSION} (fbgemm-gpu=={VERSION} on GPU hosts).\n  found:    \
         {found}\n  expected: {expected}"
    )]
    Schema { found: String, expected: String },
    #[error("FBGEMM's TBE kernel: {0}")]
    Op(String),
    #[error(
        "FBGEMM's TBE kernel fuses sgd, adagrad and rowwise_adagrad here, not \
         memory.optimizer = {0:?} (FBGEMM has Adam on CUDA only); set kernel = \"torch\" to \
         measure its update with libtorch"
    )]
    Optimizer(Optimizer),
    #[error(
        "FBGEMM's CUDA kernel reads rows four floats at a time: the device's table {table} has \
         dim {dim}, not a multiple of 4; set kernel = \"torch\" (or --kernel torch)"
    )]
    Dim { table: usize, dim: i64 },
}

#[repr(C)]
struct TbeArgs {
    placeholder: *mut C_tensor,
    weights: *const *mut C_tensor,
    n_weights: usize,
    d_offsets: *mut C_tensor,
    total_d: i64,
    max_d: i64,
    hash_size_cumsum: *mut C_tensor,
    total_hash_size_bits: i64,
    indices: *mut C_tensor,
    offsets: *mut C_tensor,
    pooling_mode: i64,
    output_dtype: i64,
    lxu_cache_locations: *mut C_tensor,
    iter: i64,
    info_b_num_bits: i64,
    info_b_mask: i64,
    use_homogeneous_placements: i64,
    stochastic_rounding: i64,
    momentum: *const *mut C_tensor,
    n_momentum: usize,
    learning_rate: *mut C_tensor,
    eps: f64,
    optimizer: i32,
}

extern "C" {
    fn embshard_dlopen(path: *const c_char, err: *mut c_char, errlen: usize) -> c_int;
    fn embshard_tbe_schema(
        optimizer: i32,
        out: *mut c_char,
        outlen: usize,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
    fn embshard_tbe_forward(
        args: *const TbeArgs,
        out: *mut *mut C_tensor,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
    fn embshard_tbe_backward(
        out: *mut C_tensor,
        grad: *mut C_tensor,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
}

/// Calls a shim function that reports failure by a non-zero return and a
/// message in `err`.
fn checked(call: impl FnOnce(*mut c_char, usize) -> c_int) -> Result<(), String> {
    let mut err = vec![0 as c_char; ERR_BYTES];
    if call(err.as_mut_ptr(), err.len()) == 0 {
        return Ok(());
    }
    // The shim writes a terminated string within the buffer.
    let text = unsafe { CStr::from_ptr(err.as_ptr()) };
    Err(text.to_string_lossy().into_owned())
}

/// The folder FBGEMM's libraries are loaded from: [`DIR_VAR`], else the
/// `fbgemm_gpu` package beside the torch this binary was built against.
pub fn library_dir() -> PathBuf {
    match std::env::var_os(DIR_VAR) {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(TORCH_LIB).join("../../fbgemm_gpu"),
    }
}

/// Loads FBGEMM's libraries once per process and checks the op's schema.
pub fn load() -> Result<(), FbgemmError> {
    static LOADED: OnceLock<Result<(), FbgemmError>> = OnceLock::new();
    LOADED.get_or_init(|| load_from(&library_dir())).clone()
}

fn load_from(dir: &Path) -> Result<(), FbgemmError> {
    if let Some(missing) = LIBRARIES.iter().find(|l| !dir.join(l).is_file()) {
        return Err(FbgemmError::Missing {
            dir: dir.to_path_buf(),
            missing: missing.to_string(),
        });
    }
    // FBGEMM's libraries need libtorch by name, which nothing on their
    // search path finds: the one this binary runs on is loaded first (by
    // name, from the library path, for a binary built on another host).
    let built = Path::new(TORCH_LIB).join("libtorch.so");
    let torch = if built.is_file() {
        built
    } else {
        PathBuf::from("libtorch.so")
    };
    for path in std::iter::once(torch).chain(LIBRARIES.iter().map(|l| dir.join(l))) {
        let c =
            CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| FbgemmError::Load {
                path: path.clone(),
                why: "a NUL byte in the path".into(),
            })?;
        checked(|err, len| unsafe { embshard_dlopen(c.as_ptr(), err, len) })
            .map_err(|why| FbgemmError::Load { path, why })?;
    }
    TbeOptimizer::ALL
        .iter()
        .try_for_each(|&o| check_schema(o, &registered_schema(o)?))
}

/// The schema FBGEMM registered for `optimizer`'s op.
fn registered_schema(optimizer: TbeOptimizer) -> Result<String, FbgemmError> {
    let mut schema = vec![0 as c_char; 4 * ERR_BYTES];
    let len = schema.len();
    checked(|err, errlen| unsafe {
        embshard_tbe_schema(optimizer as i32, schema.as_mut_ptr(), len, err, errlen)
    })
    .map_err(FbgemmError::Op)?;
    let found = unsafe { CStr::from_ptr(schema.as_ptr()) };
    Ok(found.to_string_lossy().into_owned())
}

/// The op found must be the one this build speaks.
pub fn check_schema(optimizer: TbeOptimizer, found: &str) -> Result<(), FbgemmError> {
    let expected = optimizer.schema();
    if found == expected {
        return Ok(());
    }
    Err(FbgemmError::Schema {
        found: found.to_string(),
        expected,
    })
}

/// `info_B_num_bits` and `info_B_mask` for `tables` tables: the bits of a
/// 32-bit word left for the sample once the table's are taken.
pub fn info_bits(tables: usize) -> (i64, i64) {
    let table_bits = usize::BITS - tables.leading_zeros();
    let bits = 32 - i64::from(table_bits);
    (bits, (1i64 << bits) - 1)
}

/// Bits of a hash index over `rows` rows in all.
pub fn hash_size_bits(rows: i64) -> i64 {
    match rows {
        0 => 0,
        r => i64::from(63 - r.leading_zeros()) + 1,
    }
}

/// Exclusive prefix sums with the total last: `[0, a, a + b, …, Σ]`.
fn prefix_sums(xs: &[i64]) -> Vec<i64> {
    let mut out = crate::layout::prefix_sums(xs);
    out.push(xs.iter().sum());
    out
}

/// How a TBE is built.
#[derive(Debug, Clone, Copy)]
pub struct TbeSpec {
    pub device: Device,
    pub precision: Precision,
    pub optimizer: TbeOptimizer,
    pub learning_rate: f64,
}

/// One device's tables in one TBE, with their lookups and optimizer
/// state.
#[derive(Debug)]
pub struct Tbe {
    rows: Vec<i64>,
    dims: Vec<i64>,
    optimizer: TbeOptimizer,
    total_d: i64,
    max_d: i64,
    total_hash_size_bits: i64,
    info: (i64, i64),
    iter: i64,
    placeholder: Tensor,
    /// Every table's rows, row-major, one after another: `[Σ rows·dim]`.
    weights: Tensor,
    /// The weights' list as the op takes it: on the CPU `[host,
    /// placements, offsets]`; on a GPU `[dev, uvm, placements, offsets,
    /// lxu_cache]`, with no UVM and no cache.
    weight_list: Vec<Tensor>,
    d_offsets: Tensor,
    hash_size_cumsum: Tensor,
    indices: Tensor,
    offsets: Tensor,
    lxu_cache_locations: Tensor,
    /// AdaGrad's accumulators, `[Σ rows·dim]`, or row-wise AdaGrad's, one
    /// per row, `[Σ rows]`, fp32; nothing for SGD.
    momentum: Option<Tensor>,
    /// The accumulators' list, laid out as `weight_list` (without the cache).
    momentum_list: Vec<Tensor>,
    learning_rate: Tensor,
}

impl Tbe {
    /// Tables of `rows[t]` rows of `dims[t]`, looked up as `lookups[t]`
    /// (rows within the table's own, on `spec.device`) in batches of
    /// `batch` samples.
    pub fn build(
        rows: &[i64],
        dims: &[i64],
        lookups: &[Lookups],
        batch: i64,
        spec: TbeSpec,
    ) -> Result<Tbe, FbgemmError> {
        load()?;
        let bad = |m: String| Err(FbgemmError::Op(m));
        let tables = rows.len();
        if tables == 0 || dims.len() != tables || lookups.len() != tables {
            return bad(format!(
                "{tables} tables, {} dims and {} lookup batches",
                dims.len(),
                lookups.len()
            ));
        }
        if spec.device.is_cuda() {
            if let Some(t) = dims.iter().position(|d| d % 4 != 0) {
                return Err(FbgemmError::Dim {
                    table: t,
                    dim: dims[t],
                });
            }
        }
        let info = info_bits(tables);
        if batch > info.1 {
            return bad(format!("a batch of {batch} over {tables} tables"));
        }
        let t = |e: tch::TchError| FbgemmError::Op(e.to_string());
        let device = spec.device;
        let (indices, offsets) = table_major(lookups, batch).map_err(t)?;
        let sizes: Vec<i64> = rows.iter().zip(dims).map(|(r, d)| r * d).collect();
        let weight_starts = prefix_sums(&sizes);
        let row_starts = prefix_sums(rows);
        let kind = match spec.precision {
            Precision::Fp16 => Kind::Half,
            Precision::Fp32 => Kind::Float,
        };
        // Allocated, then filled in place: a measurement may hold
        // gigabytes, and an op taking a `Scalar` panics when its allocation
        // fails (see `cpu::CpuOracle::weights`).
        let mut weights = Tensor::f_empty([weight_starts[tables]], (kind, device)).map_err(t)?;
        let _ = weights.f_fill_(WEIGHT_INIT).map_err(t)?;
        let on_device = |v: &[i64], kind: Kind| {
            Tensor::f_from_slice(v)
                .and_then(|x| x.f_to_kind(kind))
                .and_then(|x| x.f_to_device(device))
                .map_err(t)
        };
        let gpu = device.is_cuda();
        let placement = if gpu { DEVICE } else { HOST };
        let placements = on_device(&vec![placement; tables], Kind::Int)?;
        let momentum = match spec.optimizer {
            TbeOptimizer::Sgd => None,
            TbeOptimizer::Adagrad => Some((weight_starts[tables], &weight_starts)),
            TbeOptimizer::RowwiseAdagrad => Some((row_starts[tables], &row_starts)),
        };
        let (momentum, momentum_list) = match momentum {
            None => (None, Vec::new()),
            Some((len, starts)) => {
                let m = Tensor::f_zeros([len], (Kind::Float, device)).map_err(t)?;
                let offsets = on_device(&starts[..tables], Kind::Int64)?;
                let list = state_list(&m, &placements, &offsets, None, gpu).map_err(t)?;
                (Some(m), list)
            }
        };
        let weight_offsets = on_device(&weight_starts[..tables], Kind::Int64)?;
        let cache = Tensor::f_zeros([0, 0], (kind, device)).map_err(t)?;
        let weight_list =
            state_list(&weights, &placements, &weight_offsets, Some(cache), gpu).map_err(t)?;
        Ok(Tbe {
            rows: rows.to_vec(),
            dims: dims.to_vec(),
            optimizer: spec.optimizer,
            total_d: dims.iter().sum(),
            max_d: dims.iter().copied().max().unwrap_or(0),
            total_hash_size_bits: hash_size_bits(row_starts[tables]),
            info,
            iter: 0,
            placeholder: Tensor::f_zeros([0], (Kind::Float, device))
                .map_err(t)?
                .set_requires_grad(true),
            weights,
            weight_list,
            d_offsets: on_device(&prefix_sums(dims), Kind::Int)?,
            hash_size_cumsum: on_device(&row_starts, Kind::Int64)?,
            indices: indices.f_to_device(device).map_err(t)?,
            offsets: offsets.f_to_device(device).map_err(t)?,
            lxu_cache_locations: Tensor::f_empty([0], (Kind::Int, device)).map_err(t)?,
            momentum,
            momentum_list,
            // FBGEMM's frontend keeps the learning rate on the host.
            learning_rate: Tensor::f_from_slice(&[spec.learning_rate as f32])
                .and_then(|l| l.f_reshape([]))
                .map_err(t)?,
        })
    }

    /// The fused lookups: `[B, Σ dims]` fp32, sample-major, tables in
    /// order; its backward ([`Tbe::backward`]) applies the update.
    pub fn forward(&mut self) -> Result<Tensor, FbgemmError> {
        self.iter += 1;
        let ptr = |t: &Tensor| t.as_ptr() as *mut C_tensor;
        let weights: Vec<*mut C_tensor> = self.weight_list.iter().map(ptr).collect();
        let momentum: Vec<*mut C_tensor> = self.momentum_list.iter().map(ptr).collect();
        let args = TbeArgs {
            placeholder: ptr(&self.placeholder),
            weights: weights.as_ptr(),
            n_weights: weights.len(),
            d_offsets: ptr(&self.d_offsets),
            total_d: self.total_d,
            max_d: self.max_d,
            hash_size_cumsum: ptr(&self.hash_size_cumsum),
            total_hash_size_bits: self.total_hash_size_bits,
            indices: ptr(&self.indices),
            offsets: ptr(&self.offsets),
            pooling_mode: POOLING_SUM,
            output_dtype: OUTPUT_FP32,
            lxu_cache_locations: ptr(&self.lxu_cache_locations),
            iter: self.iter,
            info_b_num_bits: self.info.0,
            info_b_mask: self.info.1,
            use_homogeneous_placements: 1,
            stochastic_rounding: 1,
            momentum: momentum.as_ptr(),
            n_momentum: momentum.len(),
            learning_rate: ptr(&self.learning_rate),
            eps: EPS,
            optimizer: self.optimizer as i32,
        };
        let mut out: *mut C_tensor = std::ptr::null_mut();
        checked(|err, len| unsafe { embshard_tbe_forward(&args, &mut out, err, len) })
            .map_err(FbgemmError::Op)?;
        // The shim hands over a tensor it allocated, as tch's own calls do.
        Ok(unsafe { Tensor::from_ptr(out) })
    }

    /// Applies the output gradient `grad` (`[B, Σ dims]` fp32) of
    /// `output`, a forward's result: the looked-up rows' gradients and the
    /// optimizer's step on them.
    pub fn backward(&mut self, output: &Tensor, grad: &Tensor) -> Result<(), FbgemmError> {
        let ptr = |t: &Tensor| t.as_ptr() as *mut C_tensor;
        checked(|err, len| unsafe { embshard_tbe_backward(ptr(output), ptr(grad), err, len) })
            .map_err(FbgemmError::Op)
    }

    /// Table `t`'s weight, `[rows, dim]` (a view).
    pub fn table_weight(&self, t: usize) -> Result<Tensor, tch::TchError> {
        let start: i64 = self.rows[..t]
            .iter()
            .zip(&self.dims)
            .map(|(r, d)| r * d)
            .sum();
        self.weights
            .f_narrow(0, start, self.rows[t] * self.dims[t])?
            .f_view([self.rows[t], self.dims[t]])
    }

    /// Table `t`'s accumulators (a view): `[rows]` for row-wise AdaGrad,
    /// `[rows, dim]` for AdaGrad; `None` for SGD.
    pub fn table_momentum(&self, t: usize) -> Result<Option<Tensor>, tch::TchError> {
        let Some(m) = &self.momentum else {
            return Ok(None);
        };
        let (r, d) = (self.rows[t], self.dims[t]);
        Ok(Some(match self.optimizer {
            TbeOptimizer::RowwiseAdagrad => m.f_narrow(0, self.rows[..t].iter().sum(), r)?,
            _ => {
                let start: i64 = self.rows[..t]
                    .iter()
                    .zip(&self.dims)
                    .map(|(r, d)| r * d)
                    .sum();
                m.f_narrow(0, start, r * d)?.f_view([r, d])?
            }
        }))
    }
}

/// A state's list as FBGEMM's op takes it for the state's device: on the
/// CPU `[host, placements, offsets]`; on a GPU `[dev, uvm, placements,
/// offsets]` with an empty UVM part, and `cache` last for the weights
/// (`gpu` says which; the tests lay out a GPU's list on the CPU).
fn state_list(
    state: &Tensor,
    placements: &Tensor,
    offsets: &Tensor,
    cache: Option<Tensor>,
    gpu: bool,
) -> Result<Vec<Tensor>, tch::TchError> {
    let parts = [placements.shallow_clone(), offsets.shallow_clone()];
    if !gpu {
        return Ok([state.shallow_clone()].into_iter().chain(parts).collect());
    }
    let uvm = Tensor::f_empty([0], (state.kind(), state.device()))?;
    Ok([state.shallow_clone(), uvm]
        .into_iter()
        .chain(parts)
        .chain(cache)
        .collect())
}

/// Every table's lookups in one CSR, table after table: the indices one
/// after another (each within its table's rows) and `[T·B + 1]` offsets.
fn table_major(lookups: &[Lookups], batch: i64) -> Result<(Tensor, Tensor), tch::TchError> {
    let mut offsets = Vec::with_capacity(lookups.len() + 1);
    let mut start = 0;
    for l in lookups {
        if l.bags() != batch {
            return Err(tch::TchError::Kind(format!(
                "{} bags for a batch of {batch}",
                l.bags()
            )));
        }
        offsets.push(l.offsets.f_add_scalar(start)?);
        start += l.len();
    }
    let device = lookups.first().map_or(Device::Cpu, |l| l.offsets.device());
    offsets.push(Tensor::f_from_slice(&[start])?.f_to_device(device)?);
    let indices: Vec<&Tensor> = lookups.iter().map(|l| &l.indices).collect();
    Ok((Tensor::f_cat(&indices, 0)?, Tensor::f_cat(&offsets, 0)?))
}

#[cfg(test)]
mod tests;
