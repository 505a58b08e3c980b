//! NCCL for the `cuda` backend: communicators, grouped calls, and one
//! grouped all-to-all exchange of a plan's transfers.

use std::ffi::c_void;

use common::oracle::OracleError;
use cudarc::nccl::result as nccl;
use cudarc::nccl::sys as nccl_sys;
use tch::Tensor;

use super::err;
use crate::layout::Transfer;

pub(super) fn nccl_err(what: &str) -> impl Fn(nccl::NcclError) -> OracleError + '_ {
    move |e| err(format!("NCCL {what}: {:?}", e.0))
}

/// An open NCCL group (`ncclGroupStart`); closed on drop, so an error
/// between start and end never leaves the thread's group open.
pub(super) struct NcclGroup {
    open: bool,
}

impl NcclGroup {
    pub(super) fn start() -> Result<Self, OracleError> {
        nccl::group_start().map_err(nccl_err("group start"))?;
        Ok(NcclGroup { open: true })
    }

    /// `ncclGroupEnd`: issues the operations queued since the start.
    pub(super) fn end(mut self) -> Result<(), OracleError> {
        self.open = false;
        nccl::group_end().map_err(nccl_err("group end")).map(drop)
    }
}

impl Drop for NcclGroup {
    fn drop(&mut self) {
        if self.open {
            let _ = nccl::group_end();
        }
    }
}

/// NCCL communicators, one per local GPU; destroyed with the value.
pub(super) struct Comms(pub(super) Vec<nccl_sys::ncclComm_t>);

// SAFETY: a communicator may be used from any thread as long as it is used
// from one at a time, which `&mut CudaOracle` guarantees.
unsafe impl Send for Comms {}

impl Drop for Comms {
    /// Communicators of one process finalise together (in one group), then
    /// are destroyed: finalising them one by one can wait on each other.
    fn drop(&mut self) {
        if self.0.is_empty() {
            return;
        }
        if let Ok(group) = NcclGroup::start() {
            for &c in &self.0 {
                // SAFETY: each communicator is live and finalised once, here.
                let _ = unsafe { nccl::comm_finalize(c) };
            }
            let _ = group.end();
        }
        for &c in &self.0 {
            // SAFETY: each communicator was initialised once and is
            // destroyed once, here.
            let _ = unsafe { nccl::comm_destroy(c) };
        }
    }
}

impl Comms {
    /// Aborts every communicator (pending operations fail); none is used again.
    pub(super) fn abort(&mut self) {
        for &c in &self.0 {
            // SAFETY: aborting a live communicator, once.
            let _ = unsafe { nccl::comm_abort(c) };
        }
        self.0.clear();
    }

    /// Fails if NCCL reported an asynchronous error on any communicator (a
    /// peer that died, a network failure); the communicators are aborted.
    pub(super) fn check(&mut self) -> Result<(), OracleError> {
        for &c in &self.0 {
            let mut state = nccl_sys::ncclResult_t::ncclSuccess;
            // SAFETY: `c` is a live communicator and `state` a valid out-pointer.
            let r = unsafe { nccl_sys::ncclCommGetAsyncError(c, &mut state) };
            if r != nccl_sys::ncclResult_t::ncclSuccess
                || !matches!(
                    state,
                    nccl_sys::ncclResult_t::ncclSuccess | nccl_sys::ncclResult_t::ncclInProgress
                )
            {
                self.abort();
                return Err(err(format!("NCCL failed: {state:?} (a peer is gone?)")));
            }
        }
        Ok(())
    }
}

/// `tensor`'s storage from element `offset` (fp32).
pub(super) fn at(tensor: &Tensor, offset: u64) -> *mut c_void {
    // SAFETY of the caller: the offset lies within the tensor.
    (tensor.data_ptr() as *mut u8).wrapping_add(offset as usize * 4) as *mut c_void
}

/// One grouped NCCL exchange: every transfer with a local end, as
/// send/recv on the local device's communicator. On failure the
/// communicators are aborted: the peers no longer agree on what comes next.
pub(super) fn exchange<'t>(
    comms: &mut Comms,
    streams: &[nccl_sys::cudaStream_t],
    transfers: &[Transfer],
    slot: &dyn Fn(usize) -> Option<usize>,
    send_buf: impl Fn(usize) -> Option<&'t Tensor>,
    recv_buf: impl Fn(usize) -> Option<&'t Tensor>,
) -> Result<(), OracleError> {
    let sent = issue(comms, streams, transfers, slot, send_buf, recv_buf);
    if sent.is_err() {
        comms.abort();
    }
    sent
}

fn issue<'t>(
    comms: &mut Comms,
    streams: &[nccl_sys::cudaStream_t],
    transfers: &[Transfer],
    slot: &dyn Fn(usize) -> Option<usize>,
    send_buf: impl Fn(usize) -> Option<&'t Tensor>,
    recv_buf: impl Fn(usize) -> Option<&'t Tensor>,
) -> Result<(), OracleError> {
    let group = NcclGroup::start()?;
    for t in transfers {
        // The sending end, then the receiving end, each where it is local.
        for sending in [true, false] {
            let (here, peer, offset) = match sending {
                true => (t.from, t.to, t.send_offset),
                false => (t.to, t.from, t.recv_offset),
            };
            let Some(i) = slot(here) else { continue };
            let (buf, what) = match sending {
                true => (send_buf(i), "send"),
                false => (recv_buf(i), "recv"),
            };
            let buf = buf.ok_or_else(|| err(format!("a {what} with no buffer on its device")))?;
            let (ptr, count, kind) = (
                at(buf, offset),
                t.count as usize,
                nccl_sys::ncclDataType_t::ncclFloat32,
            );
            let (peer, comm, stream) = (peer as i32, comms.0[i], streams[i]);
            // SAFETY: the transfer lies within the buffer of its end (its
            // arithmetic is tested in `layout`), which outlives the round.
            unsafe {
                match sending {
                    true => nccl::send(ptr, count, kind, peer, comm, stream),
                    false => nccl::recv(ptr, count, kind, peer, comm, stream),
                }
            }
            .map_err(nccl_err(what))?;
        }
    }
    group.end()
}
