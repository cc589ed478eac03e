//! Completion queues and their event channels: a JFC on a JFCE that is either its own or shared by
//! several JFCs. The JFCE's fd is what the hal's event model waits on.

use super::device::Context;
use super::queue::{self, QueueShared};
use super::srq::{self, SRQ_TAG};
use super::tables::{self, errno, status_error};
use crate::cq_events::{self, EventSource};
use crate::cq_feeders::{FeederCache, Feeders};
use crate::queue_book::HasRings;
use crate::{ArmMode, Completion, CompletionQueue, CqOpcode, Error, EventChannel, Result, Status};
use bypass_urma_abi as abi;
use bypass_urma_abi::consts::*;
use std::os::fd::{AsFd, BorrowedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Completion records one `urma_poll_jfc` call fetches at most (the buffer lives in the CQ).
const CR_BATCH: usize = 32;
/// JFCs one `urma_wait_jfc` call reports at most.
const EVENT_BATCH: usize = 16;

/// A JFCE. CQs on it hold an `Arc`, so it is deleted after the last of them.
pub(crate) struct ChannelInner {
    pub(crate) ctx: Arc<Context>,
    pub(crate) jfce: *mut abi::UrmaJfce,
}

// SAFETY: a JFCE is an fd plus library bookkeeping usable from any thread.
unsafe impl Send for ChannelInner {}
// SAFETY: as above.
unsafe impl Sync for ChannelInner {}

impl ChannelInner {
    pub(crate) fn new(ctx: &Arc<Context>) -> Result<Arc<Self>> {
        // SAFETY: the context is live.
        let jfce = unsafe { (ctx.lib.create_jfce)(ctx.ctx) };
        if jfce.is_null() {
            return Err(status_error("urma_create_jfce", errno(), &format!("on {}", ctx.name)));
        }
        Ok(Arc::new(ChannelInner { ctx: ctx.clone(), jfce }))
    }
}

impl EventSource for ChannelInner {
    fn fd(&self) -> RawFd {
        // SAFETY: the JFCE is live while `self` is; `fd` is a public field.
        unsafe { (*self.jfce).fd }
    }

    /// Takes up to `max` pending events without blocking (acknowledging them), calling `f` with
    /// the id of each JFC that raised one.
    fn take(&self, max: usize, mut f: impl FnMut(u64)) -> Result<usize> {
        let mut n = 0;
        let mut jfcs = [std::ptr::null_mut::<abi::UrmaJfc>(); EVENT_BATCH];
        let mut ones = [1u32; EVENT_BATCH];
        while n < max {
            let want = (max - n).min(EVENT_BATCH);
            // SAFETY: the JFCE is live; `jfcs` has room for `want` entries; timeout 0 never blocks.
            let got = unsafe { (self.ctx.lib.wait_jfc)(self.jfce, want as u32, 0, jfcs.as_mut_ptr()) };
            if got < 0 {
                return Err(status_error("urma_wait_jfc", errno(), "take completion events"));
            }
            let got = (got as usize).min(want);
            if got == 0 {
                break;
            }
            for jfc in &jfcs[..got] {
                // SAFETY: a JFC reported by wait_jfc is live until its event is acknowledged
                // (delete_jfc waits for that); its config's user_ctx is the CQ id set at creation.
                f(unsafe { (**jfc).jfc_cfg.user_ctx });
            }
            // SAFETY: acknowledges one event for each JFC just reported.
            unsafe { (self.ctx.lib.ack_jfc)(jfcs.as_mut_ptr(), ones.as_mut_ptr(), got as u32) };
            n += got;
        }
        Ok(n)
    }
}

impl Drop for ChannelInner {
    fn drop(&mut self) {
        // SAFETY: every CQ on the channel holds an Arc of it, so all are deleted.
        unsafe { (self.ctx.lib.delete_jfce)(self.jfce) };
    }
}

/// A completion event channel (JFCE) that several CQs share ([`crate::Device::create_cq_on`]).
pub struct UrmaChannel {
    pub(crate) inner: Arc<ChannelInner>,
}

impl std::fmt::Debug for UrmaChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UrmaChannel").field("fd", &self.inner.fd()).finish()
    }
}

impl AsFd for UrmaChannel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.inner.borrowed_fd()
    }
}

impl EventChannel for UrmaChannel {
    fn take_events(&self, out: &mut [u64]) -> Result<usize> {
        self.inner.take_into(out)
    }
}

/// The part of a CQ that queues reference: the JFC and the list of queues feeding it.
pub(crate) struct CqShared {
    pub(crate) ctx: Arc<Context>,
    pub(crate) jfc: *mut abi::UrmaJfc,
    id: u64,
    overflow: AtomicBool,
    channel: Arc<ChannelInner>,
    /// The queues feeding this JFC and the shared receive queues they took receives from.
    pub(crate) feeders: Feeders<QueueShared>,
}

// SAFETY: a JFC may be polled, rearmed and deleted from any thread (the library locks unless
// lock_free is asked for, which this backend never does); the Rust fields are synchronised.
unsafe impl Send for CqShared {}
// SAFETY: as above.
unsafe impl Sync for CqShared {}

impl Drop for CqShared {
    fn drop(&mut self) {
        // SAFETY: every queue using this JFC holds an Arc of it, so all are deleted; channel events
        // were acknowledged as they were taken.
        unsafe { (self.ctx.lib.delete_jfc)(self.jfc) };
    }
}

/// Marks the CQ behind an async `URMA_EVENT_JFC_ERR` as overrun.
///
/// # Safety
/// `jfc` is the element of an async event not yet acknowledged (so the JFC is alive).
pub(crate) unsafe fn mark_overflow(jfc: *mut abi::UrmaJfc) {
    // SAFETY: per the contract the JFC is alive; its config's user_ctx is the CQ id this backend
    // set at creation. The CQ finds its id in the list when a poll comes back empty.
    let id = unsafe { (*jfc).jfc_cfg.user_ctx };
    OVERFLOWED.lock().unwrap_or_else(|e| e.into_inner()).push(id);
    ANY_OVERFLOW.store(true, Ordering::Release);
}

/// CQ ids an async event reported overrun (cold; read by an empty poll only once
/// [`ANY_OVERFLOW`] is set).
static OVERFLOWED: Mutex<Vec<u64>> = Mutex::new(Vec::new());
/// Set (for good) by the first overrun event of the process.
static ANY_OVERFLOW: AtomicBool = AtomicBool::new(false);

/// A completion queue on a URMA device.
pub struct UrmaCq {
    pub(crate) shared: Arc<CqShared>,
    /// The channel is this CQ's own (so `ack_events` takes its events).
    private: bool,
    depth: u32,
    queues: FeederCache<QueueShared>,
    cr: Box<[abi::UrmaCr]>,
}

// SAFETY: see CqShared; the record buffer is plain data owned by this handle.
unsafe impl Send for UrmaCq {}

impl std::fmt::Debug for UrmaCq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UrmaCq")
            .field("id", &self.shared.id)
            .field("depth", &self.depth)
            .field("private_channel", &self.private)
            .field("queues", &self.queues.len())
            .finish()
    }
}

impl UrmaCq {
    pub(crate) fn new(
        ctx: &Arc<Context>,
        depth: u32,
        channel: Arc<ChannelInner>,
        private: bool,
    ) -> Result<Self> {
        cq_events::check_depth(&ctx.caps, &ctx.name, depth)?;
        let id = ctx.next_cq_id();
        let mut cfg = abi::UrmaJfcCfg { depth, flag: 0, ceqn: 0, jfce: channel.jfce, user_ctx: id };
        // SAFETY: the context and JFCE are live; `cfg` is a valid configuration.
        let jfc = unsafe { (ctx.lib.create_jfc)(ctx.ctx, &mut cfg) };
        if jfc.is_null() {
            return Err(status_error(
                "urma_create_jfc",
                errno(),
                &format!("a JFC of {depth} entries on {}", ctx.name),
            ));
        }
        // SAFETY: `jfc` was just created; the library stores the depth it granted.
        let actual = unsafe { (*jfc).jfc_cfg.depth }.max(depth);
        let shared = Arc::new(CqShared {
            ctx: ctx.clone(),
            jfc,
            id,
            overflow: AtomicBool::new(false),
            channel,
            feeders: Feeders::new(),
        });
        let cr = (0..CR_BATCH).map(|_| abi::UrmaCr::default()).collect();
        Ok(UrmaCq { shared, private, depth: actual, queues: FeederCache::new(), cr })
    }

    /// The hal completion for record `k`, or `None` for one of a queue's earlier incarnation or
    /// of a queue that is gone.
    fn translate(&mut self, k: usize) -> Option<Completion> {
        let cr = self.cr[k];
        let status = tables::cr_status(cr.status);
        let (tag, ..) = queue::decode_user_ctx(cr.user_ctx);
        let feeders = &self.shared.feeders;
        let done;
        let q = if tag == SRQ_TAG {
            // A shared receive names no queue: the queue is the one bound to the sender.
            let remote = &cr.remote_id;
            let hit = |q: &QueueShared| q.rings().srq.is_some() && q.is_peer(remote);
            let Some(q) = self.queues.find(feeders, hit) else {
                let (id, slot) = srq::locate(cr.user_ctx);
                feeders.retire_orphan(id, slot);
                return None;
            };
            done = q.complete_shared(cr.user_ctx, status.is_ok(), status == Status::Flushed)?;
            q
        } else {
            let q = self.queues.find(feeders, |q| q.tag == tag)?;
            done = q.complete(cr.user_ctx, status.is_ok())?;
            q
        };
        let ok = status.is_ok();
        let recv = done.op == queue::Op::Recv;
        let opcode = match done.op {
            queue::Op::Recv if ok && cr.opcode == URMA_CR_OPC_WRITE_WITH_IMM => CqOpcode::RecvWriteImm,
            op => op.opcode(),
        };
        let has_imm =
            ok && recv && matches!(cr.opcode, URMA_CR_OPC_SEND_WITH_IMM | URMA_CR_OPC_WRITE_WITH_IMM);
        // SAFETY: both arms of the union are plain integers.
        let imm = unsafe { cr.data.imm_data } as u32;
        Some(Completion {
            wr_id: done.user_wr_id,
            status,
            opcode,
            byte_len: if ok { cr.completion_len } else { 0 },
            imm: has_imm.then_some(imm),
            qpn: q.qpn(),
        })
    }

    /// Whether an async event reported this CQ overrun. An empty poll asks: one atomic load
    /// unless some CQ of the process ever overran.
    fn overflowed(&self) -> bool {
        if self.shared.overflow.load(Ordering::Acquire) {
            return true;
        }
        if !ANY_OVERFLOW.load(Ordering::Acquire) {
            return false;
        }
        let hit = OVERFLOWED.lock().unwrap_or_else(|e| e.into_inner()).contains(&self.shared.id);
        if hit {
            self.shared.overflow.store(true, Ordering::Release);
        }
        hit
    }
}

impl CompletionQueue for UrmaCq {
    fn depth(&self) -> u32 {
        self.depth
    }

    fn id(&self) -> u64 {
        self.shared.id
    }

    fn poll(&mut self, out: &mut [Completion]) -> Result<usize> {
        self.queues.refresh_if_changed(&self.shared.feeders);
        let mut n = 0;
        while n < out.len() {
            let want = (out.len() - n).min(CR_BATCH);
            // SAFETY: the JFC is live; `cr` has room for `want` records.
            let got =
                unsafe { (self.shared.ctx.lib.poll_jfc)(self.shared.jfc, want as i32, self.cr.as_mut_ptr()) };
            if got < 0 {
                return Err(Error::Device(format!(
                    "urma_poll_jfc failed ({got}) on {}: the JFC is in error (overrun?)",
                    self.shared.ctx.name
                )));
            }
            let got = (got as usize).min(want);
            for k in 0..got {
                if let Some(c) = self.translate(k) {
                    out[n] = c;
                    n += 1;
                }
            }
            if got < want {
                break;
            }
        }
        if n == 0 && self.overflowed() {
            return Err(Error::CqOverflow { depth: self.depth });
        }
        Ok(n)
    }

    fn arm(&mut self, mode: ArmMode) -> Result<()> {
        // SAFETY: the JFC is live.
        let rc = unsafe { (self.shared.ctx.lib.rearm_jfc)(self.shared.jfc, mode == ArmMode::Solicited) };
        if rc != 0 {
            return Err(status_error("urma_rearm_jfc", rc, "arm a CQ"));
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
