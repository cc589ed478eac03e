//! Queues: an RC `ibv_qp` plus the backend's own bookkeeping — the side rings from slot to user
//! `wr_id`, the free-slot accounting that makes batches all-or-nothing, the tracked state, and the
//! epoch that makes completions of a queue's earlier incarnation invisible after a reset.
//!
//! # The `wr_id` libibverbs sees
//!
//! `epoch (16 bits) | receive? (1 bit) | 15 zero bits | slot index (32 bits)`. The user's `wr_id`
//! and the kind of operation live in the side ring at the slot; on an error completion only
//! `wr_id`, status and `qp_num` are valid, so everything else comes from there. The epoch starts
//! at a process-wide counter (a new QP reusing a destroyed one's number starts elsewhere) and moves
//! on at every reset; the poller drops completions whose epoch is not the queue's current one.
//!
//! # Free slots
//!
//! The poster owns the head (slots posted); the poller owns the retired count, packed with the
//! epoch in one atomic (`epoch << 32 | retired`) so a reset (new epoch, counts zeroed) and a poll
//! retiring a slot of the old epoch cannot interleave badly: the poller's compare-exchange fails.
//! A send completion at slot `i` retires every slot up to `i` (unsignaled requests before it
//! completed silently, in order); a receive retires one.

use super::cq::{CqShared, VerbsCq};
use super::device::Context;
use super::srq::{self, SrqObj, VerbsSharedRecv, SRQ_BIT};
use super::tables::{self, errno, verb_error};
use crate::queue_book::{check_config, invalid, HasRings, QueueBook, Rings};
use crate::wr_chain;
use crate::{Error, Queue, QueueConfig, QueueInfo, QueueState, RecvWr, Result, SendOp, SendWr, Sge, WrFlags};
use rdma_sys::*;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Arc;

pub(crate) use crate::side_ring::{Done, Op};

/// The live registrations, read-locked across an INLINE post.
type RegionsGuard<'a> = std::sync::RwLockReadGuard<'a, std::collections::HashMap<u32, (u64, u64)>>;

const RECV_BIT: u64 = 1 << 47;
const INDEX_MASK: u64 = 0xffff_ffff;

fn encode_wr_id(epoch: u16, recv: bool, index: u32) -> u64 {
    (u64::from(epoch) << 48) | if recv { RECV_BIT } else { 0 } | u64::from(index)
}

fn decode_wr_id(wr_id: u64) -> (u16, bool, u32) {
    ((wr_id >> 48) as u16, wr_id & RECV_BIT != 0, (wr_id & INDEX_MASK) as u32)
}

/// First epochs of new queues: a queue reusing a destroyed one's QPN must not take its stale
/// completions for its own.
static NEXT_EPOCH: AtomicU16 = AtomicU16::new(1);

/// The part of a queue that its CQs' pollers see.
pub(crate) struct QueueShared {
    pub(crate) qpn: u32,
    rings: Rings,
}

impl HasRings for QueueShared {
    fn rings(&self) -> &Rings {
        &self.rings
    }
}

impl std::fmt::Debug for QueueShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueShared").field("qpn", &self.qpn).field("state", &self.rings.state()).finish()
    }
}

impl QueueShared {
    /// Poller side: resolves the completion of libibverbs `wr_id`; `None` if it belongs to an
    /// earlier incarnation of the queue. Retires the slot(s) and, for an error, moves the tracked
    /// state to ERROR (the device has).
    pub(crate) fn complete(&self, wr_id: u64, success: bool) -> Option<Done> {
        if wr_id & SRQ_BIT != 0 {
            let (id, slot) = srq::locate(wr_id);
            return self.rings.retire_shared(id, slot, !success);
        }
        let (epoch, recv, index) = decode_wr_id(wr_id);
        self.rings.retire(epoch, recv, index, success)
    }

    /// The device moved the queue to ERROR (an async event said so).
    pub(crate) fn device_error(&self) {
        self.rings.device_error();
    }
}

/// A provider's refusal of a chained post: how many requests before `bad` it posted anyway
/// (they will complete), and the error to return. `bad` is null or points into the chain that
/// starts at `base` and has `n` entries.
fn refused<T>(
    verb: &str,
    what: &str,
    rc: i32,
    bad: *mut T,
    base: *const T,
    n: usize,
    qpn: u32,
) -> (usize, Error) {
    let posted = wr_chain::posted_before(bad, base, n);
    let e = verb_error(verb, rc, &wr_chain::refusal(what, posted, n, format_args!("QP {qpn}")));
    (posted, e)
}

/// A reliable-connected queue on a verbs device.
pub struct VerbsQueue {
    qp: *mut ibv_qp,
    ctx: Arc<Context>,
    send_cq: Arc<CqShared>,
    recv_cq: Arc<CqShared>,
    /// The shared part, the epoch and the heads.
    book: QueueBook<QueueShared>,
    config: QueueConfig,
    psn: u32,
    // Reusable buffers the batches are built in (no allocation when posting).
    send_wrs: Box<[ibv_send_wr]>,
    send_sges: Box<[ibv_sge]>,
    recv_wrs: Box<[ibv_recv_wr]>,
    recv_sges: Box<[ibv_sge]>,
    /// The shared receive queue the queue takes its receives from (kept alive: the QP uses it).
    srq: Option<Arc<SrqObj>>,
}

// SAFETY: an ibv_qp may be posted to and modified from any thread (the provider locks); the
// buffers are plain data owned by this handle, whose methods take `&mut self` to post.
unsafe impl Send for VerbsQueue {}

impl std::fmt::Debug for VerbsQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsQueue")
            .field("qpn", &self.book.shared.qpn)
            .field("state", &self.book.tracked())
            .field("epoch", &self.book.epoch())
            .field("send_head", &self.book.send_head())
            .field("recv_head", &self.book.recv_head())
            .finish_non_exhaustive()
    }
}

/// A 24-bit starting PSN, different for every queue and run.
fn fresh_psn(qpn: u32) -> u32 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let x = (t ^ u64::from(qpn).wrapping_mul(0x9E37_79B9_7F4A_7C15)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    ((x >> 40) as u32) & 0x00ff_ffff
}

// SAFETY (for the zeroed values below): ibv_send_wr, ibv_recv_wr, ibv_sge, ibv_qp_attr and
// ibv_qp_init_attr are C structs of integers, raw pointers and unions of those: all-zero is valid.
fn zeroed<T>() -> T {
    // SAFETY: only instantiated with the plain-old-data types listed above.
    unsafe { std::mem::zeroed() }
}

impl VerbsQueue {
    pub(crate) fn new(
        ctx: &Arc<Context>,
        c: &QueueConfig,
        send_cq: &VerbsCq,
        recv_cq: &VerbsCq,
        srq: Option<&VerbsSharedRecv>,
    ) -> Result<Self> {
        check_config(&ctx.caps, &ctx.name, c, u32::MAX)?;
        if !Arc::ptr_eq(&send_cq.shared.ctx, ctx) || !Arc::ptr_eq(&recv_cq.shared.ctx, ctx) {
            return Err(invalid("the CQs belong to another device (context)"));
        }
        if let Some(s) = srq {
            if !Arc::ptr_eq(s.obj.ctx(), ctx) {
                return Err(invalid("the shared receive queue belongs to another device (context)"));
            }
        }
        // A queue on a shared receive queue has no receive queue of its own: no slots for it.
        let recv_depth = if srq.is_some() { 0 } else { c.recv_depth };
        let epoch = NEXT_EPOCH.fetch_add(1, Ordering::Relaxed);
        let mut attr: ibv_qp_init_attr = zeroed();
        attr.send_cq = send_cq.shared.cq;
        attr.recv_cq = recv_cq.shared.cq;
        attr.qp_type = ibv_qp_type::IBV_QPT_RC;
        attr.sq_sig_all = 0;
        attr.cap = ibv_qp_cap {
            max_send_wr: c.send_depth,
            max_recv_wr: recv_depth,
            max_send_sge: c.max_send_sge,
            max_recv_sge: if srq.is_some() { 0 } else { c.max_recv_sge },
            max_inline_data: c.max_inline,
        };
        if let Some(s) = srq {
            attr.srq = s.obj.srq;
        }
        // The shared part must exist (at a fixed address) before the QP: its context points at it.
        // The qpn is filled in right after creation, before anything can see it.
        let mut shared = Arc::new(QueueShared {
            qpn: 0,
            rings: Rings::new(c.send_depth, recv_depth.max(1), epoch, srq.map(|s| s.slots.clone())),
        });
        attr.qp_context = Arc::as_ptr(&shared).cast_mut().cast();
        // SAFETY: the PD and CQs are live and belong to this context; `attr` is a valid in/out
        // pointer.
        let qp = unsafe { ibv_create_qp(ctx.pd, &mut attr) };
        if qp.is_null() {
            return Err(verb_error(
                "ibv_create_qp",
                errno(),
                &format!(
                    "an RC queue of {}/{} slots, {}/{} SGEs, {} B inline on {}",
                    c.send_depth, c.recv_depth, c.max_send_sge, c.max_recv_sge, c.max_inline, ctx.name
                ),
            ));
        }
        // SAFETY: `qp` was just created.
        let qpn = unsafe { (*qp).qp_num };
        Arc::get_mut(&mut shared).expect("not shared yet").qpn = qpn;
        for cq in [&send_cq.shared, &recv_cq.shared] {
            cq.feeders.attach(&shared);
        }
        let send_sges = (c.send_depth as usize) * (c.max_send_sge as usize);
        let recv_sges = (recv_depth as usize) * (c.max_recv_sge as usize);
        Ok(VerbsQueue {
            qp,
            ctx: ctx.clone(),
            send_cq: send_cq.shared.clone(),
            recv_cq: recv_cq.shared.clone(),
            book: QueueBook::new(shared, epoch),
            config: *c,
            psn: fresh_psn(qpn),
            send_wrs: (0..c.send_depth).map(|_| zeroed()).collect(),
            send_sges: (0..send_sges).map(|_| zeroed()).collect(),
            recv_wrs: (0..recv_depth).map(|_| zeroed()).collect(),
            recv_sges: (0..recv_sges).map(|_| zeroed()).collect(),
            srq: srq.map(|s| s.obj.clone()),
        })
    }

    fn modify(&mut self, attr: &mut ibv_qp_attr, mask: ibv_qp_attr_mask, step: &str) -> Result<()> {
        // SAFETY: the QP is live; `attr` is valid for the fields `mask` names.
        let rc = unsafe { ibv_modify_qp(self.qp, attr, mask.0 as i32) };
        if rc != 0 {
            return Err(verb_error(
                "ibv_modify_qp",
                rc,
                &format!("QP {} to {step} on {}", self.book.shared.qpn, self.ctx.name),
            ));
        }
        Ok(())
    }

    fn enter_reset(&mut self) -> Result<()> {
        let mut attr: ibv_qp_attr = zeroed();
        attr.qp_state = ibv_qp_state::IBV_QPS_RESET;
        self.modify(&mut attr, ibv_qp_attr_mask::IBV_QP_STATE, "RESET")
    }

    fn connect_steps(&mut self, peer: &QueueInfo) -> Result<()> {
        use ibv_qp_attr_mask as m;
        let ctx = self.ctx.clone();
        let c = self.config;

        let mut a: ibv_qp_attr = zeroed();
        a.qp_state = ibv_qp_state::IBV_QPS_INIT;
        a.pkey_index = 0;
        a.port_num = ctx.port;
        a.qp_access_flags = (ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
            | ibv_access_flags::IBV_ACCESS_REMOTE_READ
            | ibv_access_flags::IBV_ACCESS_REMOTE_WRITE
            | ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC)
            .0;
        self.modify(
            &mut a,
            m::IBV_QP_STATE | m::IBV_QP_PKEY_INDEX | m::IBV_QP_PORT | m::IBV_QP_ACCESS_FLAGS,
            "INIT",
        )?;

        let mut a: ibv_qp_attr = zeroed();
        a.qp_state = ibv_qp_state::IBV_QPS_RTR;
        a.path_mtu = ctx.path_mtu;
        a.dest_qp_num = peer.qpn;
        a.rq_psn = peer.psn & 0x00ff_ffff;
        a.max_dest_rd_atomic = c.max_dest_rd_atomic.min(ctx.caps.max_dest_rd_atomic);
        a.min_rnr_timer = c.min_rnr_timer.code();
        a.ah_attr.port_num = ctx.port;
        a.ah_attr.sl = 0;
        if ctx.roce || peer.lid == 0 {
            a.ah_attr.is_global = 1;
            a.ah_attr.grh.dgid.raw = peer.gid;
            a.ah_attr.grh.sgid_index = ctx.gid_index;
            a.ah_attr.grh.hop_limit = 64;
            a.ah_attr.grh.traffic_class = ctx.traffic_class;
        } else {
            a.ah_attr.dlid = peer.lid;
        }
        self.modify(
            &mut a,
            m::IBV_QP_STATE
                | m::IBV_QP_AV
                | m::IBV_QP_PATH_MTU
                | m::IBV_QP_DEST_QPN
                | m::IBV_QP_RQ_PSN
                | m::IBV_QP_MAX_DEST_RD_ATOMIC
                | m::IBV_QP_MIN_RNR_TIMER,
            "RTR",
        )?;

        let mut a: ibv_qp_attr = zeroed();
        a.qp_state = ibv_qp_state::IBV_QPS_RTS;
        a.timeout = c.timeout.exponent();
        // The hal's retry_count is IBTA's: 7 means seven retries. Soft-RoCE reads 7 as infinite
        // (only rnr_retry 7 should be), so a peer that died would never be reported there.
        a.retry_cnt = if ctx.soft_roce { c.retry_count.min(6) } else { c.retry_count };
        a.rnr_retry = c.rnr_retry;
        a.sq_psn = self.psn;
        // The initiator depth, at most the peer's responder resources (as rdma_cm negotiates).
        a.max_rd_atomic = peer.initiator_depth(c.max_rd_atomic.min(ctx.caps.max_rd_atomic));
        self.modify(
            &mut a,
            m::IBV_QP_STATE
                | m::IBV_QP_TIMEOUT
                | m::IBV_QP_RETRY_CNT
                | m::IBV_QP_RNR_RETRY
                | m::IBV_QP_SQ_PSN
                | m::IBV_QP_MAX_QP_RD_ATOMIC,
            "RTS",
        )
    }

    /// Makes the device flush receives posted while the queue is in ERROR. Some providers never
    /// look at them otherwise: rxe's `ibv_post_recv` only writes the shared ring (no system call),
    /// and its kernel side reads the receive queue when a packet arrives or the QP changes state,
    /// so a receive posted in ERR would sit there uncompleted. Modifying ERR → ERR (legal on
    /// every device, IBTA "any state → Error") runs the flush again; hardware that flushes by
    /// itself has nothing left to do. Control path only: posting in ERROR is not the hot path.
    fn kick_flush(&mut self) -> Result<()> {
        let mut attr: ibv_qp_attr = zeroed();
        attr.qp_state = ibv_qp_state::IBV_QPS_ERR;
        self.modify(&mut attr, ibv_qp_attr_mask::IBV_QP_STATE, "ERR (to flush receives posted in ERROR)")
    }

    /// The QP's state as the device has it.
    fn query_state(&self) -> Option<QueueState> {
        let mut attr: ibv_qp_attr = zeroed();
        let mut init: ibv_qp_init_attr = zeroed();
        // SAFETY: the QP is live; the out-structs are valid.
        let rc =
            unsafe { ibv_query_qp(self.qp, &mut attr, ibv_qp_attr_mask::IBV_QP_STATE.0 as i32, &mut init) };
        if rc != 0 {
            return None;
        }
        tables::qp_state(attr.qp_state)
    }

    /// Checks every SGE of INLINE requests against the live registrations; returns the read guard
    /// to hold across the post (a region cannot be freed while the CPU copies from it).
    fn check_inline(&self, wrs: &[SendWr<'_>]) -> Result<Option<RegionsGuard<'_>>> {
        if !wrs.iter().any(|w| w.flags.contains(WrFlags::INLINE)) {
            return Ok(None);
        }
        let regions = self.ctx.regions.read().unwrap_or_else(|e| e.into_inner());
        let inside = |s: &Sge| {
            regions.get(&s.lkey).is_some_and(|&(addr, len)| {
                s.addr >= addr && s.addr.checked_add(u64::from(s.len)).is_some_and(|end| end <= addr + len)
            })
        };
        let bad =
            wrs.iter().filter(|w| w.flags.contains(WrFlags::INLINE)).flat_map(|w| w.sges).any(|s| !inside(s));
        if bad {
            return Err(invalid(format!(
                "an INLINE SGE does not lie in a region registered on {} (with that lkey)",
                self.ctx.name
            )));
        }
        Ok(Some(regions))
    }
}

fn send_flags(f: WrFlags) -> u32 {
    let mut v = 0;
    if f.contains(WrFlags::SIGNALED) {
        v |= ibv_send_flags::IBV_SEND_SIGNALED.0;
    }
    if f.contains(WrFlags::INLINE) {
        v |= ibv_send_flags::IBV_SEND_INLINE.0;
    }
    if f.contains(WrFlags::FENCE) {
        v |= ibv_send_flags::IBV_SEND_FENCE.0;
    }
    if f.contains(WrFlags::SOLICITED) {
        v |= ibv_send_flags::IBV_SEND_SOLICITED.0;
    }
    v
}

fn rkey_of(r: &crate::RemoteAddr) -> Result<u32> {
    if !r.key.is_rkey() {
        return Err(invalid(format!("{:?} is not a verbs rkey (32 bits)", r.key)));
    }
    Ok(r.key.rkey())
}

fn fill_sges(dst: &mut [ibv_sge], src: &[Sge]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = ibv_sge { addr: s.addr, length: s.len, lkey: s.lkey };
    }
}

impl Queue for VerbsQueue {
    fn qpn(&self) -> u32 {
        self.book.shared.qpn
    }

    fn info(&self) -> QueueInfo {
        let mut info = QueueInfo::new(self.ctx.gid, self.book.shared.qpn, self.psn);
        info.lid = self.ctx.lid;
        info.responder_resources = Some(self.config.max_dest_rd_atomic.min(self.ctx.caps.max_dest_rd_atomic));
        info.requester_depth = Some(self.config.max_rd_atomic.min(self.ctx.caps.max_rd_atomic));
        info
    }

    fn state(&self) -> QueueState {
        self.book.state(|| self.query_state())
    }

    fn connect(&mut self, peer: &QueueInfo) -> Result<()> {
        self.book.need_reset("connect")?;
        if let Err(e) = self.connect_steps(peer) {
            // Leave the queue where it was: RESET.
            let _ = self.enter_reset();
            return Err(e);
        }
        self.book.set_tracked(QueueState::Ready);
        Ok(())
    }

    fn set_error(&mut self) -> Result<()> {
        self.book.need_ready_or_error("set_error")?;
        let mut attr: ibv_qp_attr = zeroed();
        attr.qp_state = ibv_qp_state::IBV_QPS_ERR;
        self.modify(&mut attr, ibv_qp_attr_mask::IBV_QP_STATE, "ERR")?;
        self.book.set_tracked(QueueState::Error);
        Ok(())
    }

    fn reset(&mut self) -> Result<()> {
        self.enter_reset()?;
        // A new incarnation: completions of the old one that still arrive are dropped by epoch.
        // Epochs come from the process-wide counter, so no two incarnations of any queues share
        // one (a later queue may reuse this QPN on the same CQ).
        let epoch = NEXT_EPOCH.fetch_add(1, Ordering::Relaxed);
        self.book.new_incarnation(epoch);
        self.psn = fresh_psn(self.book.shared.qpn ^ u32::from(epoch));
        Ok(())
    }

    fn post_send(&mut self, wrs: &[SendWr<'_>]) -> Result<()> {
        self.book.need_ready_or_error("post_send")?;
        if wrs.is_empty() {
            return Ok(());
        }
        let c = &self.config;
        self.book.check_send(wrs, c, self.ctx.caps.atomics, |wr| match wr.op.remote() {
            Some(r) => rkey_of(r).map(drop),
            None => Ok(()),
        })?;
        let max_sge = c.max_send_sge as usize;
        let n = wrs.len();
        let send_head = self.book.send_head();
        for (i, wr) in wrs.iter().enumerate() {
            let index = send_head.wrapping_add(i as u32);
            let sges = &mut self.send_sges[i * max_sge..i * max_sge + wr.sges.len()];
            fill_sges(sges, wr.sges);
            let sg_list = sges.as_mut_ptr();
            let mut atomic = None;
            let (opcode, imm, remote, op) = match wr.op {
                SendOp::CompareSwap { remote, compare, swap } => {
                    atomic = Some((remote, compare, swap));
                    (ibv_wr_opcode::IBV_WR_ATOMIC_CMP_AND_SWP, None, None, Op::CompareSwap)
                }
                SendOp::FetchAdd { remote, add } => {
                    atomic = Some((remote, add, 0));
                    (ibv_wr_opcode::IBV_WR_ATOMIC_FETCH_AND_ADD, None, None, Op::FetchAdd)
                }
                SendOp::Send => (ibv_wr_opcode::IBV_WR_SEND, None, None, Op::Send),
                SendOp::SendImm(v) => (ibv_wr_opcode::IBV_WR_SEND_WITH_IMM, Some(v), None, Op::Send),
                SendOp::Write(r) => (ibv_wr_opcode::IBV_WR_RDMA_WRITE, None, Some(r), Op::Write),
                SendOp::WriteImm(r, v) => {
                    (ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM, Some(v), Some(r), Op::Write)
                }
                SendOp::Read(r) => (ibv_wr_opcode::IBV_WR_RDMA_READ, None, Some(r), Op::Read),
            };
            self.book.shared.rings.send.set(index, wr.wr_id, op);
            let next = wr_chain::next(&mut self.send_wrs, i, n);
            let w = &mut self.send_wrs[i];
            w.wr_id = encode_wr_id(self.book.epoch(), false, index);
            w.next = next;
            w.sg_list = sg_list;
            w.num_sge = wr.sges.len() as i32;
            w.opcode = opcode;
            w.send_flags = send_flags(wr.flags);
            w.imm_data_invalidated_rkey_union.imm_data = imm.unwrap_or(0).to_be();
            if let Some(r) = remote {
                w.wr.rdma = rdma_t { remote_addr: r.addr, rkey: r.key.rkey() };
            }
            if let Some((r, compare_add, swap)) = atomic {
                // verbs: compare_add is the compare value of a CAS and the addend of a FAA.
                w.wr.atomic = atomic_t { remote_addr: r.addr, compare_add, swap, rkey: r.key.rkey() };
            }
        }
        let chain = self.send_wrs.as_mut_ptr();
        let guard = self.check_inline(wrs)?;
        let mut bad: *mut ibv_send_wr = std::ptr::null_mut();
        // SAFETY: the chain of `n` WRs and their SGE lists live in this queue's buffers until the
        // call returns (libibverbs copies them into the send queue); INLINE payloads lie in live
        // registrations (checked above, held by `guard`); the QP is live.
        let rc = unsafe { ibv_post_send(self.qp, chain, &mut bad) };
        drop(guard);
        if rc != 0 {
            let qpn = self.book.shared.qpn;
            let (posted, e) = refused("ibv_post_send", "request", rc, bad, self.send_wrs.as_ptr(), n, qpn);
            self.book.posted_send(posted);
            return Err(e);
        }
        self.book.posted_send(n);
        Ok(())
    }

    fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> Result<()> {
        if self.srq.is_some() {
            return Err(invalid(
                "this queue takes its receives from a shared receive queue: post them to the SharedRecv",
            ));
        }
        self.book.need_ready_or_error("post_recv")?;
        if wrs.is_empty() {
            return Ok(());
        }
        let max_sge = self.config.max_recv_sge as usize;
        self.book.check_recv(wrs, max_sge)?;
        let n = wrs.len();
        let recv_head = self.book.recv_head();
        for (i, wr) in wrs.iter().enumerate() {
            let index = recv_head.wrapping_add(i as u32);
            let sges = &mut self.recv_sges[i * max_sge..i * max_sge + wr.sges.len()];
            fill_sges(sges, wr.sges);
            let sg_list = sges.as_mut_ptr();
            self.book.shared.rings.recv.set(index, wr.wr_id, Op::Recv);
            let next = wr_chain::next(&mut self.recv_wrs, i, n);
            let w = &mut self.recv_wrs[i];
            w.wr_id = encode_wr_id(self.book.epoch(), true, index);
            w.next = next;
            w.sg_list = sg_list;
            w.num_sge = wr.sges.len() as i32;
        }
        let mut bad: *mut ibv_recv_wr = std::ptr::null_mut();
        // SAFETY: the chain and its SGE lists live in this queue's buffers for the call; the QP
        // is live. Receive memory is checked by the device through the lkeys.
        let rc = unsafe { ibv_post_recv(self.qp, self.recv_wrs.as_mut_ptr(), &mut bad) };
        if rc != 0 {
            let qpn = self.book.shared.qpn;
            let (posted, e) = refused("ibv_post_recv", "receive", rc, bad, self.recv_wrs.as_ptr(), n, qpn);
            self.book.posted_recv(posted);
            return Err(e);
        }
        self.book.posted_recv(n);
        if self.book.tracked() == QueueState::Error {
            self.kick_flush()?;
        }
        Ok(())
    }
}

impl Drop for VerbsQueue {
    fn drop(&mut self) {
        self.book.shared.rings.kill();
        // SAFETY: the QP is live and destroyed once; libibverbs waits for its unacknowledged
        // async events, whose context pointer (the shared part) we still hold.
        unsafe { ibv_destroy_qp(self.qp) };
        self.send_cq.feeders.detach_later();
        self.recv_cq.feeders.detach_later();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wr_ids_round_trip() {
        for (e, r, i) in [(0u16, false, 0u32), (0xffff, true, u32::MAX), (7, true, 12345)] {
            assert_eq!(decode_wr_id(encode_wr_id(e, r, i)), (e, r, i));
        }
    }

    #[test]
    fn side_ring_retires_in_order_and_drops_stale_epochs() {
        let book = QueueBook::new(Arc::new(QueueShared { qpn: 1, rings: Rings::new(4, 4, 9, None) }), 9);
        book.set_tracked(QueueState::Ready);
        let q = &book.shared;
        for i in 0..3 {
            q.rings.send.set(i, 100 + u64::from(i), Op::Write);
        }
        assert_eq!(q.rings.send.free(3), 1);
        // A signaled completion of slot 2 retires 0..=2.
        let d = q.complete(encode_wr_id(9, false, 2), true).unwrap();
        assert_eq!((d.user_wr_id, d.op), (102, Op::Write));
        assert_eq!(q.rings.send.free(3), 4);
        // An old epoch is invisible; an error moves the state to ERROR.
        assert!(q.complete(encode_wr_id(8, false, 3), false).is_none());
        assert_eq!(q.rings.state(), QueueState::Ready);
        q.rings.recv.set(0, 7, Op::Recv);
        assert_eq!(q.complete(encode_wr_id(9, true, 0), false).unwrap().user_wr_id, 7);
        assert_eq!(q.rings.state(), QueueState::Error);
        assert_eq!(q.rings.recv.free(1), 4);
    }
}
