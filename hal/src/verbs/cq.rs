//! Completion queues and their event channels: an `ibv_cq` on an `ibv_comp_channel` that is either
//! its own or shared by several CQs.

use super::device::{set_nonblocking, Context};
use super::qp::{self, QueueShared};
use super::srq;
use super::tables::{self, errno, verb_error};
use crate::cq_events::{self, EventSource};
use crate::cq_feeders::{FeederCache, Feeders};
use crate::{ArmMode, Completion, CompletionQueue, CqOpcode, Error, EventChannel, Result};
use rdma_sys::*;
use std::os::fd::{AsFd, BorrowedFd, RawFd};
use std::os::raw::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Work completions one `ibv_poll_cq` call fetches at most (the buffer lives in the CQ handle).
const WC_BATCH: usize = 32;

/// An `ibv_comp_channel` with its fd non-blocking. CQs on it hold an `Arc`, so it is destroyed
/// after the last of them.
pub(crate) struct ChannelInner {
    pub(crate) ctx: Arc<Context>,
    ch: *mut ibv_comp_channel,
}

// SAFETY: a completion channel is an fd plus libibverbs bookkeeping that is safe to use from any
// thread; reads of events are atomic reads of the fd.
unsafe impl Send for ChannelInner {}
// SAFETY: as above.
unsafe impl Sync for ChannelInner {}

impl ChannelInner {
    pub(crate) fn new(ctx: &Arc<Context>) -> Result<Arc<Self>> {
        // SAFETY: the context is open.
        let ch = unsafe { ibv_create_comp_channel(ctx.ctx) };
        if ch.is_null() {
            return Err(verb_error("ibv_create_comp_channel", errno(), &format!("on {}", ctx.name)));
        }
        let inner = Arc::new(ChannelInner { ctx: ctx.clone(), ch });
        set_nonblocking(inner.fd(), "the completion channel")?;
        Ok(inner)
    }
}

impl EventSource for ChannelInner {
    fn fd(&self) -> RawFd {
        // SAFETY: `ch` is live while `self` is.
        unsafe { (*self.ch).fd }
    }

    /// Takes up to `max` pending events (acknowledging each at once), calling `f` with the id of
    /// the CQ that raised it (from its tag).
    fn take(&self, max: usize, mut f: impl FnMut(u64)) -> Result<usize> {
        let mut n = 0;
        while n < max {
            let mut cq: *mut ibv_cq = std::ptr::null_mut();
            let mut cq_ctx: *mut c_void = std::ptr::null_mut();
            // SAFETY: the channel is live; the out-pointers are valid; the fd is non-blocking.
            let rc = unsafe { ibv_get_cq_event(self.ch, &mut cq, &mut cq_ctx) };
            if rc != 0 {
                return match errno() {
                    libc::EAGAIN | libc::EINTR => Ok(n),
                    e => Err(verb_error("ibv_get_cq_event", e, "take completion events")),
                };
            }
            // SAFETY: the CQ's context is its tag, a Box the CQ owns; ibv_destroy_cq (which runs
            // before the tag is freed) waits for every event taken to be acknowledged, so the tag
            // is alive until the ack below.
            f(unsafe { &*cq_ctx.cast::<CqTag>() }.id);
            // SAFETY: acknowledges the one event just taken on this CQ.
            unsafe { ibv_ack_cq_events(cq, 1) };
            n += 1;
        }
        Ok(n)
    }
}

impl Drop for ChannelInner {
    fn drop(&mut self) {
        // SAFETY: every CQ on the channel holds an Arc of it, so all are destroyed by now.
        unsafe { ibv_destroy_comp_channel(self.ch) };
    }
}

/// A completion event channel that several CQs share ([`crate::Device::create_cq_on`]).
pub struct VerbsChannel {
    pub(crate) inner: Arc<ChannelInner>,
}

impl std::fmt::Debug for VerbsChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsChannel").field("fd", &self.inner.fd()).finish()
    }
}

impl AsFd for VerbsChannel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.inner.borrowed_fd()
    }
}

impl EventChannel for VerbsChannel {
    fn take_events(&self, out: &mut [u64]) -> Result<usize> {
        self.inner.take_into(out)
    }
}

/// What a CQ's `cq_context` points at: its id (for channel events) and the overflow flag (set
/// from a `CQ_ERR` async event). Boxed so its address is fixed before the CQ exists.
pub(crate) struct CqTag {
    pub(crate) id: u64,
    pub(crate) overflow: AtomicBool,
}

/// The part of a CQ that queues reference: the `ibv_cq` and the list of queues feeding it.
pub(crate) struct CqShared {
    pub(crate) ctx: Arc<Context>,
    pub(crate) cq: *mut ibv_cq,
    tag: Box<CqTag>,
    channel: Arc<ChannelInner>,
    /// The queues feeding this CQ and the shared receive queues they took receives from.
    pub(crate) feeders: Feeders<QueueShared>,
}

// SAFETY: an ibv_cq may be polled, armed and destroyed from any thread (the provider locks); the
// Rust fields are synchronised.
unsafe impl Send for CqShared {}
// SAFETY: as above.
unsafe impl Sync for CqShared {}

impl Drop for CqShared {
    fn drop(&mut self) {
        // SAFETY: every queue using this CQ holds an Arc of it, so all are destroyed; pending
        // channel events were acknowledged as they were taken.
        unsafe { ibv_destroy_cq(self.cq) };
    }
}

/// A completion queue on a verbs device.
pub struct VerbsCq {
    pub(crate) shared: Arc<CqShared>,
    /// The channel is this CQ's own (so `ack_events` takes its events).
    private: bool,
    depth: u32,
    queues: FeederCache<QueueShared>,
    wc: Box<[ibv_wc]>,
}

// SAFETY: see CqShared; the wc buffer is plain data owned by this handle.
unsafe impl Send for VerbsCq {}

impl std::fmt::Debug for VerbsCq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsCq")
            .field("id", &self.shared.tag.id)
            .field("depth", &self.depth)
            .field("private_channel", &self.private)
            .field("queues", &self.queues.len())
            .finish()
    }
}

impl VerbsCq {
    pub(crate) fn new(
        ctx: &Arc<Context>,
        depth: u32,
        channel: Arc<ChannelInner>,
        private: bool,
    ) -> Result<Self> {
        cq_events::check_depth(&ctx.caps, &ctx.name, depth)?;
        let tag = Box::new(CqTag { id: ctx.next_cq_id(), overflow: AtomicBool::new(false) });
        let tag_ptr = (&*tag as *const CqTag).cast_mut().cast::<c_void>();
        // SAFETY: the context and channel are live; the tag outlives the CQ (CqShared destroys
        // the CQ in its Drop, before its fields, the tag among them, are dropped).
        let cq = unsafe { ibv_create_cq(ctx.ctx, depth as i32, tag_ptr, channel.ch, 0) };
        if cq.is_null() {
            return Err(verb_error(
                "ibv_create_cq",
                errno(),
                &format!("a CQ of {depth} entries on {}", ctx.name),
            ));
        }
        // SAFETY: `cq` was just created.
        let actual = unsafe { (*cq).cqe }.max(depth as i32) as u32;
        let shared = Arc::new(CqShared { ctx: ctx.clone(), cq, tag, channel, feeders: Feeders::new() });
        // SAFETY: an all-zero ibv_wc is a valid value (integers and a union of integers).
        let wc = (0..WC_BATCH).map(|_| unsafe { std::mem::zeroed::<ibv_wc>() }).collect();
        Ok(VerbsCq { shared, private, depth: actual, queues: FeederCache::new(), wc })
    }

    /// The hal completion for a work completion, or `None` for one of a queue's earlier
    /// incarnation (before a reset) or of a queue that is gone.
    fn translate(&mut self, k: usize) -> Option<Completion> {
        let wc = &self.wc[k];
        let (wr_id, status_code, opcode, qpn, flags, byte_len) =
            (wc.wr_id, wc.status, wc.opcode, wc.qp_num, wc.wc_flags, wc.byte_len);
        // SAFETY: both union members are u32; reading either is always defined.
        let imm_be = unsafe { wc.imm_data_invalidated_rkey_union.imm_data };
        let status = tables::wc_status(status_code);
        let Some(q) = self.queues.find(&self.shared.feeders, |q| q.qpn == qpn) else {
            if wr_id & srq::SRQ_BIT != 0 {
                let (id, slot) = srq::locate(wr_id);
                self.shared.feeders.retire_orphan(id, slot);
            }
            return None;
        };
        let done = q.complete(wr_id, status.is_ok())?;
        let ok = status.is_ok();
        let opcode = match done.op {
            qp::Op::Recv if ok && opcode == ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM => {
                CqOpcode::RecvWriteImm
            }
            op => op.opcode(),
        };
        let has_imm = ok && flags & ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0;
        Some(Completion {
            wr_id: done.user_wr_id,
            status,
            opcode,
            byte_len: if ok { byte_len } else { 0 },
            imm: has_imm.then(|| u32::from_be(imm_be)),
            qpn,
        })
    }
}

impl CompletionQueue for VerbsCq {
    fn depth(&self) -> u32 {
        self.depth
    }

    fn id(&self) -> u64 {
        self.shared.tag.id
    }

    fn poll(&mut self, out: &mut [Completion]) -> Result<usize> {
        self.queues.refresh_if_changed(&self.shared.feeders);
        let mut n = 0;
        while n < out.len() {
            let want = (out.len() - n).min(WC_BATCH);
            // SAFETY: the CQ is live; `wc` has room for `want` entries.
            let got = unsafe { ibv_poll_cq(self.shared.cq, want as i32, self.wc.as_mut_ptr()) };
            if got < 0 {
                return Err(Error::Device(format!(
                    "ibv_poll_cq failed ({got}) on {}: the CQ is in error (overrun?)",
                    self.shared.ctx.name
                )));
            }
            for k in 0..got as usize {
                if let Some(c) = self.translate(k) {
                    out[n] = c;
                    n += 1;
                }
            }
            if (got as usize) < want {
                break;
            }
        }
        if n == 0 && self.shared.tag.overflow.load(Ordering::Acquire) {
            return Err(Error::CqOverflow { depth: self.depth });
        }
        Ok(n)
    }

    fn arm(&mut self, mode: ArmMode) -> Result<()> {
        let solicited = i32::from(mode == ArmMode::Solicited);
        // SAFETY: the CQ is live.
        let rc = unsafe { ibv_req_notify_cq(self.shared.cq, solicited) };
        if rc != 0 {
            return Err(verb_error("ibv_req_notify_cq", rc, "arm a CQ"));
        }
        Ok(())
    }

    fn event_fd(&self) -> RawFd {
        self.shared.channel.fd()
    }

    fn ack_events(&mut self) -> Result<u64> {
        self.shared.channel.ack_own(self.private)
    }
}

/// Marks the CQ behind an async `CQ_ERR` event as overrun.
///
/// # Safety
/// `cq` is the element of an async event not yet acknowledged (so the CQ, and its tag, are alive).
pub(crate) unsafe fn mark_overflow(cq: *mut ibv_cq) {
    // SAFETY: per the contract; every CQ of this backend has a CqTag as its context.
    let tag = unsafe { (*cq).cq_context }.cast::<CqTag>();
    if !tag.is_null() {
        // SAFETY: as above.
        unsafe { (*tag).overflow.store(true, Ordering::Release) };
    }
}
