//! `cuda`: real fused embedding lookups on GPUs, with the pooled outputs and
//! their gradients exchanged by NCCL all-to-all (DESIGN §6). Built with the
//! `cuda` feature; see docs/gpu.md for running it.
//!
//! One iteration of a plan on `D` GPUs, each a [`DeviceEngine`]: the
//! measuring engine the `cpu` backend runs too, its tables in the kernel
//! `cuda.kernel` names (FBGEMM's TBE, or libtorch's `embedding_bag` per
//! dim), weights in `memory.precision`, the `memory.optimizer` step in the
//! backward:
//!
//! | phase      | what runs on device `d`, timed by CUDA events on its stream |
//! |------------|--------------------------------------------------------------|
//! | `fwd`      | the fused lookup, packed to `[B, S_d]` fp32                  |
//! | `fwd_comm` | grouped `ncclSend`/`ncclRecv`: each peer gets its `B/D` samples of `d`'s tables ([`PlanLayout::forward_transfers`]); includes waiting for slower peers, as a real iteration does |
//! | `bwd_comm` | the reverse exchange of the output gradients                 |
//! | `bwd`      | sort, per-row gradient reduction, optimizer step on the rows looked up |
//!
//! `cuda.warmup` unmeasured iterations, then each phase's median over
//! `cuda.repeats` (DreamShard: 5 and 10), with an optional L2 flush before
//! each. The lookups come from [`crate::indices`], generated on each GPU
//! by the ops the `cpu` backend runs, so both measure the same traffic
//! (checked when the backend starts); they are made once per measurement,
//! before anything is timed, and the timed work never touches the host.
//!
//! Work is launched on each device's default stream, which libtorch uses
//! too; NCCL runs on the same streams, so kernels, exchanges and events are
//! ordered without extra synchronisation.
//!
//! Communicators: in one process, `ncclCommInitAll` over the first `D`
//! configured GPUs (one communicator set per plan size, kept). Across hosts
//! ([`CudaOracle::multi_host`]), every process calls `ncclCommInitRank` for
//! each of its GPUs with the unique id rank 0 created and the learner handed
//! out; NCCL ranks are the plan's device numbers, rank after rank
//! ([`Ranks`]). Rank 0 broadcasts each job to the others ([`crate::group`])
//! and all-gathers their phases.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::config::{CudaConfig, Kernel};
use common::{Measurement, MemoryModel, Plan, Table};
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaContext, CudaEvent, CudaStream};
use cudarc::nccl::result as nccl;
use cudarc::nccl::sys as nccl_sys;
use tch::{Device, Kind, Tensor};

use crate::engine::{DeviceEngine, EngineSpec};
use crate::group;
use crate::indices::{self, Lookups};
use crate::layout::{PlanLayout, Ranks, Transfer};
use crate::oracle::{check_plan, Oracle, OracleError, Spread};
use crate::timing::{self, Phases};

mod comms;

use comms::{exchange, nccl_err, Comms, NcclGroup};

const BACKEND: &str = "cuda";
/// Most lookups of one iteration on one GPU: it holds them with their bags,
/// the backward's sort keys and pieces (a few tens of bytes each, more while
/// they are generated), next to its weights.
const MAX_LOOKUPS: f64 = (1u64 << 29) as f64;
/// How often a wait on the GPU checks NCCL for a failed peer.
const POLL: Duration = Duration::from_micros(200);

fn err(message: impl Into<String>) -> OracleError {
    OracleError::Backend {
        backend: BACKEND,
        message: message.into(),
    }
}

fn tch_err(e: tch::TchError) -> OracleError {
    err(e.to_string())
}

fn driver_err(what: &str) -> impl Fn(cudarc::driver::DriverError) -> OracleError + '_ {
    move |e| err(format!("CUDA {what}: {e:?}"))
}

/// How the GPUs of a measurement are connected.
enum Topology {
    /// All GPUs in this process; communicators per plan size.
    Local { comms: HashMap<usize, Comms> },
    /// This process is rank `rank` of a multi-host group.
    Group {
        rank: usize,
        ranks: Ranks,
        comms: Comms,
    },
}

/// One local GPU.
struct Gpu {
    ordinal: usize,
    stream: Arc<CudaStream>,
    /// Overwritten before each repeat when `cuda.flush_l2` is on.
    flush: Option<Tensor>,
}

/// The `cuda` oracle.
pub struct CudaOracle {
    cfg: CudaConfig,
    mem: MemoryModel,
    gpus: Vec<Gpu>,
    topology: Topology,
    last_spread: Option<Spread>,
}

/// Refuses a plan that has a device draw more lookups per iteration than
/// [`MAX_LOOKUPS`] (a pooling factor of 1e5 at a batch of 65536 would be
/// 6.5e9 of them), naming the device and its busiest table.
fn check_lookups(tables: &[Table], plan: &Plan, batch: u64) -> Result<(), OracleError> {
    let of = |t: usize| indices::lookups_per_batch(&tables[t], batch);
    for (d, group) in plan.groups().iter().enumerate() {
        let total: f64 = group.iter().map(|&t| of(t)).sum();
        if total > MAX_LOOKUPS {
            let busiest = group
                .iter()
                .max_by(|&&a, &&b| of(a).total_cmp(&of(b)))
                .map(|&t| format!(" (table `{}`: {:.0})", tables[t].name, of(t)))
                .unwrap_or_default();
            return Err(err(format!(
                "device {d} of the plan needs {total:.0} lookups per iteration at cuda.batch = \
                 {batch}{busiest}, more than the {MAX_LOOKUPS:.0} a GPU is given; lower cuda.batch"
            )));
        }
    }
    Ok(())
}

/// Checks that the driver, libtorch's CUDA and NCCL are all there, and
/// returns the GPUs to use.
fn open_gpus(cfg: &CudaConfig) -> Result<Vec<Gpu>, OracleError> {
    cfg.validate().map_err(|e| err(e.to_string()))?;
    // SAFETY: probing for the libraries only loads them.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(err(
            "no CUDA driver (libcuda.so) on this host: the cuda backend needs NVIDIA GPUs",
        ));
    }
    if !tch::Cuda::is_available() {
        return Err(err(
            "libtorch sees no CUDA device (is the torch wheel a CUDA build, and are GPUs visible? \
             check CUDA_VISIBLE_DEVICES)",
        ));
    }
    // SAFETY: as above.
    if !unsafe { nccl_sys::is_culib_present() } {
        return Err(err(
            "NCCL (libnccl.so) not found: put the folder holding libnccl.so on LD_LIBRARY_PATH \
             (see docs/gpu.md)",
        ));
    }
    let visible = tch::Cuda::device_count() as usize;
    let ordinals: Vec<usize> = if cfg.gpus.is_empty() {
        (0..visible).collect()
    } else {
        cfg.gpus.clone()
    };
    if let Some(g) = ordinals.iter().find(|&&g| g >= visible) {
        return Err(err(format!(
            "cuda.gpus names GPU {g}, but {visible} are visible"
        )));
    }
    let on: Vec<Device> = ordinals.iter().map(|&g| Device::Cuda(g)).collect();
    indices::same_on(&on).map_err(|e| err(e.to_string()))?;
    ordinals
        .into_iter()
        .map(|ordinal| {
            let ctx = CudaContext::new(ordinal).map_err(driver_err("context"))?;
            let flush = if cfg.flush_l2 {
                let n = (cfg.flush_mib << 20) as i64 / 4;
                Some(Tensor::f_zeros([n], (Kind::Float, Device::Cuda(ordinal))).map_err(tch_err)?)
            } else {
                None
            };
            Ok(Gpu {
                ordinal,
                stream: ctx.default_stream(),
                flush,
            })
        })
        .collect()
}

/// FBGEMM's CUDA kernel reads rows four floats at a time: a task with a
/// dim that is not a multiple of 4 is refused before any GPU work, naming
/// the table (a misaligned read would leave the GPU unusable).
fn check_dims(tables: &[Table], kernel: Kernel) -> Result<(), OracleError> {
    match tables.iter().find(|t| t.dim % 4 != 0) {
        Some(t) if kernel == Kernel::Fbgemm => Err(err(format!(
            "table `{}` has dim {}: FBGEMM's CUDA kernel needs every dim a multiple of 4; set \
             cuda.kernel = \"torch\" (or --kernel torch) to measure it",
            t.name, t.dim
        ))),
        _ => Ok(()),
    }
}

/// How the `cuda` backend builds each GPU's work (the device is set per
/// GPU), checked before any GPU is opened.
fn engine_spec(cfg: &CudaConfig, mem: &MemoryModel) -> EngineSpec {
    EngineSpec {
        device: Device::Cpu,
        kernel: cfg.kernel,
        precision: mem.precision,
        optimizer: mem.optimizer,
        learning_rate: cfg.learning_rate,
    }
}

/// A plan on `devices` devices fits a group of `total` GPUs.
fn group_fits(devices: usize, total: usize) -> Result<(), OracleError> {
    if devices > total {
        return Err(err(format!(
            "the plan needs {devices} GPUs; the group has {total}"
        )));
    }
    Ok(())
}

/// The stream as NCCL's type.
fn raw(stream: &CudaStream) -> nccl_sys::cudaStream_t {
    stream.cu_stream() as nccl_sys::cudaStream_t
}

impl CudaOracle {
    /// All GPUs in this process (`cuda.gpus`, or every visible one).
    pub fn new(cfg: CudaConfig, mem: MemoryModel) -> Result<Self, OracleError> {
        engine_spec(&cfg, &mem)
            .check()
            .map_err(|e| err(e.to_string()))?;
        let gpus = open_gpus(&cfg)?;
        let topology = Topology::Local {
            comms: HashMap::new(),
        };
        Ok(Self::with(cfg, mem, gpus, topology))
    }

    fn with(cfg: CudaConfig, mem: MemoryModel, gpus: Vec<Gpu>, topology: Topology) -> Self {
        CudaOracle {
            cfg,
            mem,
            gpus,
            topology,
            last_spread: None,
        }
    }

    /// A new NCCL unique id, made by the group's rank 0 for the learner to
    /// hand to the others.
    pub fn unique_id() -> Result<Vec<u8>, OracleError> {
        // SAFETY: probing for the library only loads it.
        if !unsafe { nccl_sys::is_culib_present() } {
            return Err(err("NCCL (libnccl.so) not found (see docs/gpu.md)"));
        }
        let id = nccl::get_uniqueid().map_err(nccl_err("unique id"))?;
        Ok(id.internal.iter().map(|&c| c as u8).collect())
    }

    /// Rank `rank` of a multi-host group: `devices[r]` GPUs on rank `r`,
    /// this process's being `cuda.gpus` (or every visible one). Blocks until
    /// every rank has joined.
    pub fn multi_host(
        cfg: CudaConfig,
        mem: MemoryModel,
        rank: usize,
        devices: Vec<usize>,
        unique_id: &[u8],
    ) -> Result<Self, OracleError> {
        engine_spec(&cfg, &mem)
            .check()
            .map_err(|e| err(e.to_string()))?;
        let gpus = open_gpus(&cfg)?;
        let ranks = Ranks { devices };
        if ranks.devices.get(rank) != Some(&gpus.len()) {
            return Err(err(format!(
                "rank {rank} of a group with GPUs {:?} drives {} GPUs",
                ranks.devices,
                gpus.len()
            )));
        }
        let mut id = nccl_sys::ncclUniqueId { internal: [0; 128] };
        if unique_id.len() != id.internal.len() {
            return Err(err(format!(
                "an NCCL unique id of {} bytes (expected {})",
                unique_id.len(),
                id.internal.len()
            )));
        }
        for (dst, &src) in id.internal.iter_mut().zip(unique_id) {
            *dst = src as _;
        }
        let world = ranks.total() as i32;
        let mut comms = Vec::with_capacity(gpus.len());
        let group = NcclGroup::start()?;
        for (local, gpu) in gpus.iter().enumerate() {
            let mut comm = std::ptr::null_mut();
            let global = ranks.local(rank).start + local;
            // SAFETY: `comm` is a valid out-pointer; the id came from
            // `ncclGetUniqueId` on rank 0. Inside a group, NCCL needs the
            // device current, which CudaContext binds.
            CudaContext::new(gpu.ordinal)
                .and_then(|c| c.bind_to_thread())
                .map_err(driver_err("context"))?;
            unsafe { nccl::comm_init_rank(&mut comm, world, id, global as i32) }
                .map_err(nccl_err("init rank"))?;
            comms.push(comm);
        }
        group.end()?;
        let topology = Topology::Group {
            rank,
            ranks,
            comms: Comms(comms),
        };
        Ok(Self::with(cfg, mem, gpus, topology))
    }

    /// Plan devices this process drives, as (plan device, local GPU).
    fn local_devices(&self, devices: usize) -> Vec<(usize, usize)> {
        match &self.topology {
            Topology::Local { .. } => (0..devices).map(|d| (d, d)).collect(),
            Topology::Group { rank, ranks, .. } => ranks
                .local(*rank)
                .enumerate()
                .filter(|&(_, d)| d < devices)
                .map(|(local, d)| (d, local))
                .collect(),
        }
    }

    /// The communicators for a plan on `devices` devices, by local GPU.
    fn comms(&mut self, devices: usize) -> Result<&mut Comms, OracleError> {
        let gpus: Vec<i32> = self.gpus.iter().map(|g| g.ordinal as i32).collect();
        match &mut self.topology {
            Topology::Group { comms, ranks, .. } => {
                group_fits(devices, ranks.total())?;
                Ok(comms)
            }
            Topology::Local { comms } => {
                if devices > gpus.len() {
                    return Err(err(format!(
                        "the plan needs {devices} GPUs; this benchworker drives {} (cuda.gpus)",
                        gpus.len()
                    )));
                }
                // Communicators aborted after a failure are made anew.
                comms.retain(|_, c| !c.0.is_empty());
                if let std::collections::hash_map::Entry::Vacant(v) = comms.entry(devices) {
                    let mut raw = vec![std::ptr::null_mut(); devices];
                    // SAFETY: `raw` has room for `devices` communicators and
                    // the list names `devices` distinct visible GPUs.
                    unsafe { nccl::comm_init_all(raw.as_mut_ptr(), devices as i32, gpus.as_ptr()) }
                        .map_err(nccl_err("init all"))?;
                    v.insert(Comms(raw));
                }
                Ok(comms.get_mut(&devices).expect("inserted above"))
            }
        }
    }

    /// Runs the iterations of one plan on this process's devices and
    /// returns each repeat's phases of those devices (local order).
    fn run(&mut self, tables: &[Table], plan: &Plan) -> Result<Vec<Vec<Phases>>, OracleError> {
        // Checks the plan's size against the GPUs, and makes the
        // communicators before anything is timed.
        self.comms(plan.devices)?;
        let layout = PlanLayout::new(tables, plan, self.cfg.batch, self.cfg.max_rows);
        let local = self.local_devices(plan.devices);
        let (seed, batch) = (self.cfg.seed, self.cfg.batch);
        let spec = engine_spec(&self.cfg, &self.mem);
        // Per local device: its engine, on its GPU.
        let mut work = Vec::with_capacity(local.len());
        for &(d, g) in &local {
            let dev = &layout.devices[d];
            let on = Device::Cuda(self.gpus[g].ordinal);
            // Each table's rows as the layout capped them.
            let lookups = dev
                .tables
                .iter()
                .zip(&dev.rows)
                .map(|(&t, &rows)| indices::for_table(seed, &tables[t], batch, rows, on))
                .collect::<Result<Vec<Lookups>, _>>()
                .map_err(tch_err)?;
            let spec = EngineSpec { device: on, ..spec };
            work.push(DeviceEngine::build(&layout, d, lookups, spec).map_err(tch_err)?);
        }
        let fwd = layout.forward_transfers();
        let bwd = layout.backward_transfers();
        // Five timing events per device, recorded anew each round.
        let timing = Some(CUevent_flags::CU_EVENT_DEFAULT);
        let mut events: Vec<[CudaEvent; 5]> = Vec::with_capacity(local.len());
        for &(_, g) in &local {
            let s = &self.gpus[g].stream;
            let mk = || s.context().new_event(timing).map_err(driver_err("event"));
            events.push([mk()?, mk()?, mk()?, mk()?, mk()?]);
        }
        let total = self.cfg.warmup + self.cfg.repeats;
        let mut rounds = Vec::with_capacity(self.cfg.repeats);
        for i in 0..total {
            let p = self.round(&local, &layout, &mut work, &events, &fwd, &bwd)?;
            if i >= self.cfg.warmup {
                rounds.push(p);
            }
        }
        Ok(rounds)
    }

    /// One iteration on the local devices; the phases of each.
    fn round(
        &mut self,
        local: &[(usize, usize)],
        layout: &PlanLayout,
        work: &mut [DeviceEngine],
        events: &[[CudaEvent; 5]],
        fwd: &[Transfer],
        bwd: &[Transfer],
    ) -> Result<Vec<Phases>, OracleError> {
        for &(_, g) in local {
            if let Some(f) = &mut self.gpus[g].flush {
                let _ = f.f_fill_(1.0).map_err(tch_err)?;
            }
        }
        let own: Vec<Arc<CudaStream>> = local
            .iter()
            .map(|&(_, g)| self.gpus[g].stream.clone())
            .collect();
        // Event `k` of local device `i`, on its stream.
        let mark = |i: usize, k: usize| {
            events[i][k]
                .record(&own[i])
                .map_err(driver_err("event record"))
        };
        // Each device's events go right around its own work, so launching
        // another device's work is never timed.
        let mut outputs: Vec<Option<Tensor>> = Vec::with_capacity(local.len());
        for (i, w) in work.iter_mut().enumerate() {
            mark(i, 0)?;
            outputs.push(w.forward().map_err(tch_err)?);
            mark(i, 1)?;
        }
        let streams: Vec<nccl_sys::cudaStream_t> = own.iter().map(|s| raw(s)).collect();
        let slot = |d: usize| local.iter().position(|&(pd, _)| pd == d);
        let plan_devices = layout.devices.len();
        let outs = &outputs;
        exchange(
            self.comms(plan_devices)?,
            &streams,
            fwd,
            &slot,
            |i| outs[i].as_ref(),
            |i| Some(&work[i].recv),
        )?;
        (0..local.len()).try_for_each(|i| mark(i, 2))?;
        exchange(
            self.comms(plan_devices)?,
            &streams,
            bwd,
            &slot,
            |i| Some(&work[i].grad_out),
            |i| Some(&work[i].grad_in),
        )?;
        (0..local.len()).try_for_each(|i| mark(i, 3))?;
        for (i, (w, out)) in work.iter_mut().zip(&outputs).enumerate() {
            if let Some(out) = out {
                w.backward(out).map_err(tch_err)?;
            }
            mark(i, 4)?;
        }
        // Wait for the last event of every device, watching NCCL for a dead peer.
        for ev in events {
            while !ev[4].try_is_complete().map_err(driver_err("event query"))? {
                self.comms(plan_devices)?.check()?;
                std::thread::sleep(POLL);
            }
        }
        drop(outputs);
        let ms = |a: &CudaEvent, b: &CudaEvent| {
            a.elapsed_ms(b)
                .map(f64::from)
                .map_err(driver_err("elapsed time"))
        };
        events
            .iter()
            .map(|e| {
                Ok(Phases {
                    fwd: ms(&e[0], &e[1])?,
                    fwd_comm: ms(&e[1], &e[2])?,
                    bwd_comm: ms(&e[2], &e[3])?,
                    bwd: ms(&e[3], &e[4])?,
                })
            })
            .collect()
    }

    /// Rank 0: broadcast a job (or, with `None`, the stop signal) to the
    /// group.
    fn broadcast_job(&mut self, job: Option<&[u8]>) -> Result<(), OracleError> {
        let header = group::header(job.map_or(0, |j| j.len()));
        self.broadcast_len(Some(&header), header.len(), None)?;
        if let Some(j) = job {
            self.broadcast_len(Some(j), j.len(), None)?;
        }
        Ok(())
    }

    /// A broadcast of `len` bytes from plan device 0: the leader passes the
    /// bytes, the others `None` and get them back.
    fn broadcast_len(
        &mut self,
        bytes: Option<&[u8]>,
        len: usize,
        stop: Option<&AtomicBool>,
    ) -> Result<Vec<u8>, OracleError> {
        let Topology::Group { comms, .. } = &mut self.topology else {
            return Err(err("a broadcast outside a multi-host group"));
        };
        let mut buffers = Vec::with_capacity(self.gpus.len());
        for gpu in &self.gpus {
            let on = Device::Cuda(gpu.ordinal);
            let t = match bytes {
                Some(b) => Tensor::f_from_slice(b).and_then(|t| t.f_to_device(on)),
                None => Tensor::f_zeros([len as i64], (Kind::Uint8, on)),
            }
            .map_err(tch_err)?;
            buffers.push(t);
        }
        let group = NcclGroup::start()?;
        for ((gpu, buf), &comm) in self.gpus.iter().zip(&buffers).zip(&comms.0) {
            let p = buf.data_ptr();
            // SAFETY: `buf` holds `len` bytes on the communicator's device
            // and outlives the wait below.
            unsafe {
                nccl::broadcast(
                    p,
                    p,
                    len,
                    nccl_sys::ncclDataType_t::ncclUint8,
                    0,
                    comm,
                    raw(&gpu.stream),
                )
            }
            .map_err(nccl_err("broadcast"))?;
        }
        group.end()?;
        self.wait_streams(stop)?;
        Vec::<u8>::try_from(&buffers[0].to_device(Device::Cpu)).map_err(tch_err)
    }

    /// Waits until every local stream is idle, watching NCCL for failures
    /// and `stop` (which aborts the communicators).
    fn wait_streams(&mut self, stop: Option<&AtomicBool>) -> Result<(), OracleError> {
        let mut done = Vec::with_capacity(self.gpus.len());
        for gpu in &self.gpus {
            done.push(gpu.stream.record_event(None).map_err(driver_err("event"))?);
        }
        for e in &done {
            while !e.try_is_complete().map_err(driver_err("event query"))? {
                if let Topology::Group { comms, .. } = &mut self.topology {
                    if stop.is_some_and(|s| s.load(Ordering::Relaxed)) {
                        comms.abort();
                        return Err(err("stopped while waiting for the group"));
                    }
                    comms.check()?;
                }
                std::thread::sleep(POLL);
            }
        }
        Ok(())
    }

    /// All-gathers every device's phases (`repeats × 4` f64 each) in a
    /// group; returns the leader's copy.
    fn gather(&mut self, mine: &[Vec<Phases>]) -> Result<Vec<f64>, OracleError> {
        let Topology::Group { comms, ranks, .. } = &mut self.topology else {
            return Err(err("a gather outside a multi-host group"));
        };
        let per_device = self.cfg.repeats * 4;
        let world = ranks.total();
        let mut sends = Vec::with_capacity(self.gpus.len());
        let mut recvs = Vec::with_capacity(self.gpus.len());
        for (local, gpu) in self.gpus.iter().enumerate() {
            let on = Device::Cuda(gpu.ordinal);
            let phases: Vec<Phases> = mine
                .iter()
                .map(|round| round.get(local).copied().unwrap_or_default())
                .collect();
            let mut flat = group::flatten_phases(&phases);
            flat.resize(per_device, 0.0);
            sends.push(
                Tensor::f_from_slice(&flat)
                    .and_then(|t| t.f_to_device(on))
                    .map_err(tch_err)?,
            );
            recvs.push(
                Tensor::f_zeros([(world * per_device) as i64], (Kind::Double, on))
                    .map_err(tch_err)?,
            );
        }
        let group = NcclGroup::start()?;
        for (((gpu, s), r), &comm) in self.gpus.iter().zip(&sends).zip(&recvs).zip(&comms.0) {
            // SAFETY: `s` holds `per_device` and `r` `world × per_device`
            // doubles on the communicator's device; both outlive the wait.
            unsafe {
                nccl::all_gather(
                    s.data_ptr(),
                    r.data_ptr(),
                    per_device,
                    nccl_sys::ncclDataType_t::ncclFloat64,
                    comm,
                    raw(&gpu.stream),
                )
            }
            .map_err(nccl_err("all-gather"))?;
        }
        group.end()?;
        self.wait_streams(None)?;
        Vec::<f64>::try_from(&recvs[0].to_device(Device::Cpu)).map_err(tch_err)
    }

    /// Ranks other than 0: measure the jobs rank 0 broadcasts until it says
    /// stop, `stop` is set, or NCCL fails.
    pub fn follow(&mut self, stop: &AtomicBool) -> Result<u64, OracleError> {
        let mut jobs = 0;
        while !stop.load(Ordering::Relaxed) {
            // Idle until rank 0 has a job: only here may a stop interrupt.
            let header = self.broadcast_len(None, group::HEADER_BYTES, Some(stop))?;
            let Some(len) = group::payload_len(&header).map_err(|e| err(e.to_string()))? else {
                return Ok(jobs);
            };
            self.group_step(|o| {
                let job = group::decode_job(&o.broadcast_len(None, len, None)?)
                    .map_err(|e| err(format!("a job the leader broadcast: {e}")))?;
                let rounds = o.run(&job.tables, &job.plan)?;
                o.gather(&rounds)
            })?;
            jobs += 1;
        }
        Ok(jobs)
    }

    /// One job of a group. A rank that fails midway no longer takes part in
    /// the collectives the others wait in, so on any error the
    /// communicators are aborted and the group must re-form.
    fn group_step<T>(
        &mut self,
        step: impl FnOnce(&mut Self) -> Result<T, OracleError>,
    ) -> Result<T, OracleError> {
        let result = step(self);
        if result.is_err() {
            if let Topology::Group { comms, .. } = &mut self.topology {
                comms.abort();
            }
        }
        result
    }

    /// Rank 0: tells the other ranks to stop following.
    pub fn release_group(&mut self) -> Result<(), OracleError> {
        if matches!(self.topology, Topology::Group { rank: 0, .. }) {
            self.broadcast_job(None)?;
        }
        Ok(())
    }
}

impl Oracle for CudaOracle {
    fn name(&self) -> &'static str {
        BACKEND
    }

    fn kernel(&self) -> Option<&'static str> {
        Some(self.cfg.kernel.name())
    }

    fn measure(&mut self, tables: &[Table], plan: &Plan) -> Result<Measurement, OracleError> {
        check_plan(tables, plan)?;
        self.last_spread = None;
        if !self.healthy() {
            return Err(err(
                "the group's NCCL communicators failed; it must re-form",
            ));
        }
        check_lookups(tables, plan, self.cfg.batch)?;
        check_dims(tables, self.cfg.kernel)?;
        let leader = matches!(self.topology, Topology::Group { rank: 0, .. });
        // Before the job reaches the group: a plan too big for it would
        // fail in `comms` after the broadcast, and abort every communicator.
        if let Topology::Group { ranks, .. } = &self.topology {
            group_fits(plan.devices, ranks.total())?;
        }
        let rounds = if leader {
            self.group_step(|o| {
                o.broadcast_job(Some(&group::encode_job(tables, plan)))?;
                let mine = o.run(tables, plan)?;
                let world = match &o.topology {
                    Topology::Group { ranks, .. } => ranks.total(),
                    Topology::Local { .. } => plan.devices,
                };
                let gathered = o.gather(&mine)?;
                group::gathered_rounds(&gathered, world, o.cfg.repeats, plan.devices)
                    .map_err(|e| err(e.to_string()))
            })?
        } else {
            if matches!(self.topology, Topology::Group { .. }) {
                return Err(err("only rank 0 of a group takes jobs"));
            }
            self.run(tables, plan)?
        };
        let (m, s) = timing::assemble(&rounds).ok_or_else(|| err("no timed repeat"))?;
        self.last_spread = Some(s);
        Ok(m)
    }

    fn spread(&self) -> Option<Spread> {
        self.last_spread
    }

    fn max_devices(&self) -> Option<usize> {
        Some(match &self.topology {
            Topology::Group { ranks, .. } => ranks.total(),
            Topology::Local { .. } => self.gpus.len(),
        })
    }

    fn healthy(&self) -> bool {
        match &self.topology {
            Topology::Group { comms, .. } => !comms.0.is_empty(),
            Topology::Local { .. } => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_table;

    #[test]
    fn too_many_lookups_on_a_device_are_refused_with_the_batch_named() {
        let small = test_table("small", 1000, 32, 4.0, &[(0, 1.0)]);
        let busy = test_table("busy", 1000, 32, 5e3, &[(0, 1.0)]);
        let plan = |assignment: Vec<usize>| Plan {
            devices: 2,
            assignment,
        };
        let two_busy = [small.clone(), busy.clone(), busy.clone()];
        // 2 × 3.3e8 lookups: too many on one device, not on two.
        assert!(check_lookups(&two_busy, &plan(vec![0, 0, 1]), 65536).is_ok());
        let e = check_lookups(&two_busy, &plan(vec![0, 1, 1]), 65536)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("device 1") && e.contains("cuda.batch = 65536"),
            "{e}"
        );
        assert!(e.contains("`busy`"), "{e}");
        // A pooling that is not a number draws nothing (as the generator).
        let odd = test_table("odd", 1000, 32, f64::NAN, &[(0, 1.0)]);
        assert!(check_lookups(&[small, odd], &plan(vec![0, 0]), 65536).is_ok());
    }

    #[test]
    fn fbgemm_refuses_a_dim_that_is_not_a_multiple_of_4_naming_the_table() {
        let ok = test_table("ok", 100, 12, 1.0, &[(0, 1.0)]);
        let odd = test_table("odd", 100, 6, 1.0, &[(0, 1.0)]);
        let both = [ok.clone(), odd];
        let e = check_dims(&both, Kernel::Fbgemm).unwrap_err().to_string();
        assert!(
            e.contains("`odd` has dim 6") && e.contains("--kernel torch"),
            "{e}"
        );
        assert!(check_dims(&both, Kernel::Torch).is_ok());
        assert!(check_dims(&[ok], Kernel::Fbgemm).is_ok());
    }

    #[test]
    fn a_plan_wider_than_the_group_does_not_fit() {
        assert!(group_fits(4, 4).is_ok());
        let e = group_fits(5, 4).unwrap_err().to_string();
        assert!(e.contains("needs 5 GPUs; the group has 4"), "{e}");
    }
}
