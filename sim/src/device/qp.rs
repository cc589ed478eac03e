//! One queue pair inside the device: the reliable-connected transport.
//!
//! Requester: fetches WQEs from the send ring, gives each message a range of packet sequence
//! numbers (one per MTU-sized segment; a READ reserves one per response segment), sends segments,
//! and completes messages in order as acknowledgements and READ responses arrive. Lost or refused
//! packets are resent go-back-N style: on a timeout (up to `retry_count` times), on a sequence
//! NAK, on a gap in READ responses (at once, once per gap), and after the peer's RNR wait on an RNR NAK (up to `rnr_retry` times; 7 = forever).
//! The timer waits the queue's ACK timeout, or, when the fabric backs off
//! (`FabricConfig::ack_timeout_backoff`), twice the last wait after a timeout without progress,
//! up to the cap, until progress.
//!
//! Responder: accepts request packets strictly in PSN order; a duplicate is re-acknowledged (a
//! duplicate READ is answered again), a gap is NAKed once. SENDs land in posted receives, WRITEs
//! and READs are checked against the key table. A protection or length violation NAKs the
//! requester and moves this queue to ERROR, as an RC responder does.
//!
//! Entering ERROR completes every outstanding work request exactly once with `Flushed` (after
//! the one that failed, which carries its own error), and keeps flushing anything posted later.

mod datagram;
pub(crate) use datagram::dest;

use super::keys::KeyFault;
use super::read_res::ReadResources;
use super::{Ctx, TxDesc};
use crate::clock::{Nanos, NEVER};
use crate::layout::{self, cqe_flags, Cqe, Wqe, WqeOp, BLOCK, MAX_SGE, WQE_HEADER};
use crate::packet::{
    psn_add, psn_diff, psn_offset, PacketHeader, PacketKind, Syndrome, PSN_MASK, PSN_WINDOW,
};
use crate::ring::WorkRing;
use crate::shared::{CqShared, QueueShared};
use crate::source::{Payload, PayloadRef};
use crate::wire::{Transmit, Wire, BY_REF_MIN};
use bypass_hal::trace::{self, Arg, Track};
use bypass_hal::{Access, AsyncEvent, CqOpcode, QueueInfo, QueueState, Status, WrFlags};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::Arc;

/// Where a connected queue's packets go.
pub(crate) struct Remote {
    pub wire: Arc<dyn Wire>,
    pub nic: u32,
    pub qpn: u32,
}

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Remote(nic {}, qpn {})", self.nic, self.qpn)
    }
}

/// A fetched send WQE in flight.
#[derive(Debug, Clone, Copy)]
struct Op {
    wqe: Wqe,
    len: u64,
    first_psn: u32,
    npkts: u32,
    /// READ: response segments received so far.
    resp_got: u32,
}

impl Op {
    fn last_psn(&self) -> u32 {
        psn_add(self.first_psn, self.npkts - 1)
    }
    fn contains(&self, psn: u32) -> bool {
        psn_offset(psn, self.first_psn) < self.npkts
    }
}

fn segments(len: u64, mtu: u32) -> u32 {
    (len.div_ceil(u64::from(mtu))).max(1) as u32
}

fn send_opcode(op: WqeOp) -> CqOpcode {
    match op {
        WqeOp::Write | WqeOp::WriteImm => CqOpcode::Write,
        WqeOp::Read => CqOpcode::Read,
        WqeOp::CompareSwap => CqOpcode::CompareSwap,
        WqeOp::FetchAdd => CqOpcode::FetchAdd,
        WqeOp::Recv => CqOpcode::Recv,
        WqeOp::Send | WqeOp::SendImm => CqOpcode::Send,
    }
}

fn op_name(op: WqeOp) -> &'static str {
    match op {
        WqeOp::Send => "SEND",
        WqeOp::SendImm => "SEND_IMM",
        WqeOp::Write => "WRITE",
        WqeOp::WriteImm => "WRITE_IMM",
        WqeOp::Read => "READ",
        WqeOp::CompareSwap => "COMPARE_SWAP",
        WqeOp::FetchAdd => "FETCH_ADD",
        WqeOp::Recv => "RECV",
    }
}

fn status_name(s: Status) -> &'static str {
    match s {
        Status::Success => "Success",
        Status::LocalLength => "LocalLength",
        Status::LocalQueueOperation => "LocalQueueOperation",
        Status::LocalProtection => "LocalProtection",
        Status::RemoteInvalidRequest => "RemoteInvalidRequest",
        Status::RemoteAccess => "RemoteAccess",
        Status::RemoteOperation => "RemoteOperation",
        Status::RetryExceeded => "RetryExceeded",
        Status::RnrRetryExceeded => "RnrRetryExceeded",
        Status::Flushed => "Flushed",
        Status::BadResponse => "BadResponse",
        _ => "General",
    }
}

/// The device's context for one queue.
#[derive(Debug)]
pub(crate) struct QpCtx {
    pub shared: Arc<QueueShared>,
    pub(crate) send_cq: Arc<CqShared>,
    pub(crate) recv_cq: Arc<CqShared>,
    pub state: QueueState,
    pub remote: Option<Remote>,
    timeout: Nanos,
    /// The retransmission timer's next wait: `timeout`, doubled by each timeout without progress
    /// when the fabric backs off (`backoff_cap` non-zero), back to `timeout` on progress.
    retx_wait: Nanos,
    /// The longest `retx_wait` may grow to (`FabricConfig::ack_timeout_backoff`); 0: no backoff.
    backoff_cap: Nanos,
    min_rnr: Nanos,
    // Requester.
    sq_fetch: u32,
    ops: VecDeque<Op>,
    send_psn: u32,
    next_psn: u32,
    /// The first PSN never sent yet (anything below it that is sent again is a retransmission).
    sent_high: u32,
    retry_left: u8,
    rnr_left: u8,
    /// The highest PSN the peer acknowledged (`oldest unacknowledged − 1` within a message too):
    /// an ACK that moves it is progress, and a retransmission starts after it.
    acked: u32,
    retx_deadline: Nanos,
    /// While the peer said "receiver not ready": when to try again (0 = not waiting).
    rnr_until: Nanos,
    reads_outstanding: u32,
    /// Waiting for an outstanding READ to complete before fetching the next WQE: a FENCE, or
    /// the queue's `max_rd_atomic` limit of READs in flight.
    read_blocked: bool,
    /// A gap in READ responses (or in the responses behind an incomplete READ) was seen and
    /// the READ asked again from its first missing segment: later out-of-order responses of
    /// the same gap ask nothing more. Cleared by progress and by the retransmission timer.
    read_gap_asked: bool,
    pub wire_blocked: bool,
    /// Listed in the device's to-flush list.
    pub pending_flush: bool,
    /// A READ request went out since the last flush: the responder is asked to run now.
    pub flush_eager: bool,
    /// On the device's active list.
    pub listed: bool,
    // Responder.
    epsn: u32,
    /// The PSN after the last SEND, WRITE or atomic this responder executed: how far a plain
    /// ACK may reach when a duplicate is acknowledged again. A READ is acknowledged by its
    /// responses alone: an ACK carrying a READ's PSN would tell the requester the READ is over,
    /// and rxe's requester then completes a READ whose response it lost with nothing placed
    /// (its completer ends the current request on an ACK with that request's last PSN). rxe's
    /// responder keeps the same bound (`resp.ack_psn`).
    ack_psn: u32,
    rq_fetch: u32,
    cur_recv: Option<Wqe>,
    /// Bytes of the current SEND placed so far (RoCE frames carry no offset: segments arrive
    /// in PSN order, so the responder counts).
    recv_off: u32,
    /// The WRITE in progress: its first segment's RETH (start address, key, length) and the
    /// bytes placed so far. Middle and last segments carry no RETH.
    cur_write: Option<WriteState>,
    /// A NAK for the expected PSN was sent (a sequence NAK, or an RNR NAK): later packets are
    /// dropped silently until the expected one arrives. After an RNR NAK the requester rewinds
    /// to that PSN anyway; a sequence NAK for the pipelined packets behind it would spend one of
    /// its transport retries per RNR wait, and a queue that waits out several RNR NAKs without
    /// a completion (a busy shared receive queue) would fail with `RetryExceeded` although
    /// `rnr_retry = 7` retries forever.
    nak_seq_sent: bool,
    /// Segments of the current multi-segment message received since the last ACK: the responder
    /// acknowledges every [`ACK_EVERY`] of them, not only the last, so a long message over a
    /// lossy wire shows progress (rxe asks for an ACK every 128 packets the same way).
    segs_unacked: u32,
    /// The READs answered lately, for duplicates (`max_dest_rd_atomic` of them).
    reads_answered: ReadResources,
    /// The connected peer's responder resources (`QueueInfo::responder_resources`; `None`: not
    /// known): READs and atomics in flight are kept at or below them, as rdma_cm negotiates.
    peer_resources: Option<u8>,
    /// A CQE of this queue found its CQ full (see `take_cq_overflow`).
    cq_overflowed: std::cell::Cell<bool>,
    /// The queue's transport service is the unreliable datagram one (UM), not RC: see
    /// [`datagram`].
    pub(crate) datagram: bool,
    /// A datagram queue of the reliable service (UB's RM): see [`datagram`], "Reliable".
    pub(crate) reliable: bool,
    /// Reliable datagram responder: the last PSN taken from each sender (source id, queue),
    /// to answer a retransmission again without delivering it twice.
    pub(crate) taken: Vec<(u32, u32, u32)>,
    /// Datagram queue: its address handles, the destinations its WQEs name by index.
    pub(crate) dests: Vec<Remote>,
}

/// A responder acknowledges at least every this many segments of a long SEND or WRITE.
const ACK_EVERY: u32 = 64;

/// A WRITE being received (see [`QpCtx::cur_write`]).
#[derive(Debug, Clone, Copy)]
struct WriteState {
    va: u64,
    rkey: u32,
    len: u32,
    off: u32,
}

impl QpCtx {
    /// A queue in RESET; `responder` is its `max_dest_rd_atomic`, clamped to the device's.
    pub(crate) fn new(
        shared: Arc<QueueShared>,
        send_cq: Arc<CqShared>,
        recv_cq: Arc<CqShared>,
        responder: u8,
    ) -> Self {
        let cfg = shared.config;
        QpCtx {
            send_cq,
            recv_cq,
            state: QueueState::Reset,
            remote: None,
            // Exponent 0 is "no timer", as on verbs: the deadline saturates at NEVER.
            timeout: cfg.timeout.duration().map_or(NEVER, |d| d.as_nanos() as Nanos),
            retx_wait: cfg.timeout.duration().map_or(NEVER, |d| d.as_nanos() as Nanos),
            backoff_cap: 0,
            min_rnr: cfg.min_rnr_timer.duration().as_nanos() as Nanos,
            sq_fetch: 0,
            ops: VecDeque::with_capacity(shared.sq.depth() as usize),
            send_psn: 0,
            next_psn: 0,
            sent_high: 0,
            retry_left: cfg.retry_count,
            rnr_left: cfg.rnr_retry,
            acked: 0,
            retx_deadline: NEVER,
            rnr_until: 0,
            reads_outstanding: 0,
            read_blocked: false,
            read_gap_asked: false,
            wire_blocked: false,
            pending_flush: false,
            flush_eager: false,
            listed: false,
            epsn: 0,
            ack_psn: 0,
            rq_fetch: 0,
            cur_recv: None,
            recv_off: 0,
            cur_write: None,
            nak_seq_sent: false,
            segs_unacked: 0,
            reads_answered: ReadResources::new(responder),
            peer_resources: None,
            cq_overflowed: std::cell::Cell::new(false),
            datagram: false,
            reliable: false,
            taken: Vec::new(),
            dests: Vec::new(),
            shared,
        }
    }

    fn qpn(&self) -> u32 {
        self.shared.qpn
    }

    /// Backs the retransmission timer off up to `cap` (see `FabricConfig::ack_timeout_backoff`);
    /// `None`: every wait is the ACK timeout.
    pub(crate) fn set_backoff_cap(&mut self, cap: Option<std::time::Duration>) {
        self.backoff_cap = cap.map_or(0, |d| (d.as_nanos() as Nanos).max(1));
    }

    /// A timeout found no progress: with backoff, the next wait is twice this one, at most the
    /// cap (and never shorter than the queue's own timeout).
    fn back_off(&mut self) {
        if self.backoff_cap != 0 {
            self.retx_wait = self.retx_wait.saturating_mul(2).min(self.backoff_cap.max(self.timeout));
        }
    }

    /// RESET → READY with the peer's info.
    pub(crate) fn connect(&mut self, peer: &QueueInfo, wire: Arc<dyn Wire>, peer_nic: u32) {
        let cfg = self.shared.config;
        let psn = self.shared.psn.load(crate::sync::Ordering::Relaxed);
        self.remote = Some(Remote { wire, nic: peer_nic, qpn: peer.qpn });
        self.peer_resources = peer.responder_resources;
        self.send_psn = psn;
        self.next_psn = psn;
        self.sent_high = psn;
        self.acked = psn_add(psn, PSN_MASK);
        self.epsn = peer.psn;
        self.ack_psn = peer.psn;
        self.segs_unacked = 0;
        self.reads_answered.clear();
        self.retry_left = cfg.retry_count;
        self.rnr_left = cfg.rnr_retry;
        self.retx_wait = self.timeout;
        self.nak_seq_sent = false;
        self.read_gap_asked = false;
        self.set_state(QueueState::Ready);
    }

    fn set_state(&mut self, s: QueueState) {
        self.state = s;
        self.shared.set_state(s);
    }

    /// ERROR → RESET (the caller flushed first). Ring positions are kept, so flush completions
    /// still in the CQ map to the right side-table slots.
    pub(crate) fn reset(&mut self, next_psn: u32) {
        self.remote = None;
        self.shared.psn.store(next_psn, crate::sync::Ordering::Relaxed);
        self.set_state(QueueState::Reset);
    }

    /// The earliest time this queue needs the device again (timer or RNR wait).
    pub(crate) fn deadline(&self) -> Nanos {
        if self.state != QueueState::Ready {
            return NEVER;
        }
        let rnr = if self.rnr_until == 0 { NEVER } else { self.rnr_until };
        self.retx_deadline.min(rnr)
    }

    /// True when a [`send_step`](Self::send_step) would make progress.
    pub(crate) fn has_send_work(&self, now: Nanos) -> bool {
        if self.state != QueueState::Ready {
            return self.shared.sq.producer() != self.sq_fetch || self.shared.rq.producer() != self.rq_fetch;
        }
        if self.wire_blocked || now < self.rnr_until {
            return false;
        }
        self.send_psn != self.next_psn
            || (self.shared.sq.producer() != self.sq_fetch
                && self.ops.len() < self.shared.sq.depth() as usize
                && !self.read_blocked)
    }

    /// True when the retransmission timer is due.
    pub(crate) fn timer_due(&self, now: Nanos) -> bool {
        self.state == QueueState::Ready && self.retx_deadline <= now
    }

    // ---------------------------------------------------------------- tracing

    #[cold]
    fn trace(&self, name: &'static str, args: &[Arg]) {
        trace::instant(Track::Nic(self.shared.nic), name, args);
    }

    #[cold]
    fn trace_cqe(&self, name: &'static str, index: u32, status: Status, len: u32) {
        let args = [
            ("qpn", self.qpn().into()),
            ("index", index.into()),
            ("status", status_name(status).into()),
            ("len", len.into()),
        ];
        self.trace(name, &args);
    }

    // ---------------------------------------------------------------- completions

    fn send_cqe(&self, wqe: &Wqe, len: u64, status: Status) {
        if status == Status::Success && !wqe.flags.contains(WrFlags::SIGNALED) {
            return;
        }
        if trace::is_enabled() {
            self.trace_cqe("cqe send", wqe.index, status, len as u32);
        }
        let pushed = self.send_cq.push(&Cqe {
            flags: 0,
            status,
            opcode: send_opcode(wqe.op),
            qpn: self.qpn(),
            wqe_index: wqe.index,
            byte_len: len as u32,
            imm: 0,
            epoch: self.shared.epoch.load(crate::sync::Ordering::Relaxed),
            ..Default::default()
        });
        self.note_push(pushed);
    }

    fn recv_cqe(
        &self,
        index: u32,
        status: Status,
        opcode: CqOpcode,
        len: u32,
        imm: Option<u32>,
        solicited: bool,
    ) {
        self.recv_cqe_from(index, status, opcode, len, imm, solicited, (0, 0));
    }

    /// [`recv_cqe`](Self::recv_cqe) of a datagram: `from` is the sender (source id, queue).
    #[allow(clippy::too_many_arguments)]
    fn recv_cqe_from(
        &self,
        index: u32,
        status: Status,
        opcode: CqOpcode,
        len: u32,
        imm: Option<u32>,
        solicited: bool,
        from: (u32, u32),
    ) {
        let mut flags = cqe_flags::RECV;
        if imm.is_some() {
            flags |= cqe_flags::HAS_IMM;
        }
        if solicited {
            flags |= cqe_flags::SOLICITED;
        }
        if trace::is_enabled() {
            self.trace_cqe("cqe recv", index, status, len);
        }
        let pushed = self.recv_cq.push(&Cqe {
            flags,
            status,
            opcode,
            qpn: self.qpn(),
            wqe_index: index,
            byte_len: len,
            imm: imm.unwrap_or(0),
            epoch: self.shared.epoch.load(crate::sync::Ordering::Relaxed),
            src_nic: from.0,
            src_qpn: from.1,
        });
        self.note_push(pushed);
    }

    /// Records a CQE the CQ had no room for: the queue fails once the current unit is done
    /// ([`take_cq_overflow`](Self::take_cq_overflow)).
    fn note_push(&self, pushed: bool) {
        if !pushed {
            self.cq_overflowed.set(true);
        }
    }

    /// After a unit of device work: if a CQE of this queue was lost to a full CQ, the queue
    /// enters ERROR with a `QueueFatal` event, after the CQ's own `CqError` event — a CQ overrun
    /// is fatal to the queues feeding it on hardware, never a silent loss.
    pub(crate) fn take_cq_overflow(&mut self, ctx: &mut Ctx<'_>) {
        if !self.cq_overflowed.take() || self.state == QueueState::Error {
            return;
        }
        ctx.events.push(AsyncEvent::CqError);
        ctx.events.push(AsyncEvent::QueueFatal { qpn: self.qpn() });
        self.enter_error(ctx);
        self.cq_overflowed.set(false); // the flushes just lost to the same full CQ
    }

    /// Completes the send WQE at `idx` (never turned into a message) with `status`, always
    /// reported, and moves the fetch index past it.
    fn unfetched_cqe(&mut self, idx: u32, op: WqeOp, status: Status) {
        if trace::is_enabled() {
            self.trace_cqe("cqe send", idx, status, 0);
        }
        let pushed = self.send_cq.push(&Cqe {
            flags: 0,
            status,
            opcode: send_opcode(op),
            qpn: self.qpn(),
            wqe_index: idx,
            byte_len: 0,
            imm: 0,
            epoch: self.shared.epoch.load(crate::sync::Ordering::Relaxed),
            ..Default::default()
        });
        self.note_push(pushed);
        self.sq_fetch = idx.wrapping_add(1);
    }

    /// Completes the oldest message with `status` (always reported) and enters ERROR.
    fn fail_front(&mut self, ctx: &mut Ctx<'_>, status: Status) {
        if let Some(op) = self.ops.pop_front() {
            self.send_cqe(&op.wqe, op.len, status);
        }
        self.enter_error(ctx);
    }

    /// Moves to ERROR and flushes everything outstanding, exactly once each, in order.
    pub(crate) fn enter_error(&mut self, ctx: &mut Ctx<'_>) {
        if self.state == QueueState::Error {
            return;
        }
        self.set_state(QueueState::Error);
        ctx.stats.queue_errors += 1;
        if trace::is_enabled() {
            self.trace("queue error", &[("qpn", self.qpn().into())]);
        }
        while let Some(op) = self.ops.pop_front() {
            self.send_cqe(&op.wqe, op.len, Status::Flushed);
        }
        self.cur_recv = None;
        self.cur_write = None;
        self.flush_posted();
        self.retx_deadline = NEVER;
        self.rnr_until = 0;
        self.send_psn = self.next_psn;
        self.reads_outstanding = 0;
        self.read_blocked = false;
        self.wire_blocked = false;
        self.nak_seq_sent = false;
    }

    /// Flushes WQEs posted but not yet fetched (on both rings). Returns true if any.
    pub(crate) fn flush_posted(&mut self) -> bool {
        let mut any = false;
        let pi = self.shared.sq.producer();
        while self.sq_fetch != pi {
            let idx = self.sq_fetch;
            let wqe = self.fetch_sq(idx).ok();
            self.unfetched_cqe(idx, wqe.map_or(WqeOp::Send, |w| w.op), Status::Flushed);
            any = true;
        }
        let pi = self.shared.rq.producer();
        while self.rq_fetch != pi {
            self.recv_cqe(self.rq_fetch, Status::Flushed, CqOpcode::Recv, 0, None, false);
            self.rq_fetch = self.rq_fetch.wrapping_add(1);
            any = true;
        }
        any
    }

    fn fetch_sq(&self, idx: u32) -> Result<Wqe, layout::WqeFault> {
        fetch(&self.shared.sq, idx)
    }

    fn fetch_rq(&self) -> Option<Result<Wqe, layout::WqeFault>> {
        if !self.have_recv() {
            return None;
        }
        Some(fetch(&self.shared.rq, self.rq_fetch))
    }

    /// True when the queue's receive ring holds a receive not yet fetched. A queue on a shared
    /// receive queue with none takes the shared queue's next receive into its ring first (see
    /// [`SrqShared`](crate::shared::SrqShared)); false if the shared queue is empty, or the
    /// queue's ring is full of completions its user has not polled: a receiver not ready.
    fn have_recv(&self) -> bool {
        let rq = &self.shared.rq;
        let pi = rq.producer();
        if pi != self.rq_fetch {
            return true;
        }
        let Some(srq) = &self.shared.srq else { return false };
        if pi.wrapping_sub(self.shared.rq_ci.load(crate::sync::Ordering::Acquire)) >= rq.depth() {
            return false;
        }
        let s = srq.ci.load(crate::sync::Ordering::Relaxed);
        if srq.ring.producer() == s {
            return false;
        }
        let mut sges = [bypass_hal::Sge::default(); MAX_SGE];
        // A shared WQE the device cannot read is handed on as one the queue rejects (an
        // operation that is no receive): the message fails with LocalQueueOperation, as for a bad
        // WQE in the queue's own ring.
        let (op, n) = match fetch(&srq.ring, s) {
            Ok(w) if w.op == WqeOp::Recv && u32::from(w.nsge) <= srq.max_sge => {
                let n = usize::from(w.nsge);
                for (i, sge) in sges.iter_mut().enumerate().take(n) {
                    // SAFETY: `s` is below the producer index just acquired and not yet freed, so
                    // the driver leaves the slot alone.
                    *sge = w.sge(i, |i| unsafe { srq.ring.sge(s, i) });
                }
                (WqeOp::Recv, n)
            }
            _ => (WqeOp::Send, 0),
        };
        // A receive WQE of one or two SGEs fits one block: zero (and encode into) only that much
        // rather than the largest WQE's 512 bytes, once per message on a shared receive queue.
        let used = (WQE_HEADER + n * layout::WQE_SGE).div_ceil(BLOCK) * BLOCK;
        let (mut small, mut large);
        let buf: &mut [u8] = if used <= BLOCK {
            small = [0u8; BLOCK];
            &mut small
        } else {
            large = [0u8; layout::MAX_WQE];
            &mut large
        };
        layout::encode_wqe(buf, op, WrFlags::SIGNALED, rq.owner(pi), 0, 0, 0, pi, &sges[..n], None);
        // SAFETY: with a shared receive queue the device (under its lock) is the only producer of
        // the queue's ring and side table; slot `pi` is free (checked against the consumer index
        // the poller publishes). The shared slot `s` is below the acquired producer index and is
        // freed only below, after its wr_id was read.
        unsafe {
            self.shared.rq_ids.set(pi, srq.ids.get(s));
            rq.write(pi, &buf[..used]);
        }
        rq.ring_doorbell(pi.wrapping_add(1));
        srq.ci.store(s.wrapping_add(1), crate::sync::Ordering::Release);
        true
    }

    // ---------------------------------------------------------------- requester

    /// One unit of send-side work: flush (when not READY), send one segment, or fetch a WQE and
    /// send its first segment. Returns whether anything happened.
    pub(crate) fn send_step(&mut self, ctx: &mut Ctx<'_>) -> bool {
        if self.state != QueueState::Ready {
            return self.flush_posted();
        }
        if self.wire_blocked || ctx.now < self.rnr_until {
            return false;
        }
        if self.datagram {
            return self.datagram_step(ctx);
        }
        self.rnr_until = 0;
        if self.send_psn != self.next_psn {
            return self.emit(ctx, self.send_psn);
        }
        if self.shared.sq.producer() == self.sq_fetch
            || self.ops.len() >= self.shared.sq.depth() as usize
            || self.read_blocked
        {
            return false;
        }
        let idx = self.sq_fetch;
        let wqe = match self.fetch_sq(idx) {
            Ok(w) if w.op != WqeOp::Recv => w,
            _ => {
                // A corrupt or stale entry: the driver broke the ring protocol.
                self.fail_unfetched(ctx, idx, WqeOp::Send, Status::LocalQueueOperation);
                return true;
            }
        };
        if wqe.flags.contains(WrFlags::FENCE) && self.reads_outstanding > 0 {
            self.read_blocked = true;
            return false;
        }
        if wqe.op.reads_back() && self.reads_outstanding >= self.read_limit(ctx) {
            // As many READs and atomics in flight as the queue may have (verbs max_rd_atomic, clamped to
            // the device's): this one waits until one completes. Nothing after it overtakes it.
            self.read_blocked = true;
            return false;
        }
        if trace::is_enabled() {
            let args = [
                ("qpn", self.qpn().into()),
                ("index", idx.into()),
                ("op", op_name(wqe.op).into()),
                ("len", wqe.len.into()),
            ];
            self.trace("wqe fetch", &args);
        }
        if let Err(status) = self.validate(ctx, &wqe) {
            self.fail_unfetched(ctx, idx, wqe.op, status);
            return true;
        }
        let len = wqe.len;
        let npkts = segments(len, ctx.mtu);
        if let Some(front) = self.ops.front() {
            if psn_offset(psn_add(self.next_psn, npkts), front.first_psn) >= PSN_WINDOW {
                // Too many PSNs unacknowledged: wait for ACKs before starting this message.
                return false;
            }
        }
        self.ops.push_back(Op { wqe, len, first_psn: self.next_psn, npkts, resp_got: 0 });
        self.next_psn = psn_add(self.next_psn, npkts);
        self.sq_fetch = idx.wrapping_add(1);
        if wqe.op.reads_back() {
            self.reads_outstanding += 1;
        }
        self.emit(ctx, self.send_psn);
        true
    }

    /// Most READs this queue may have outstanding: its `max_rd_atomic`, clamped to the device's
    /// and to the peer's responder resources (its initiator depth), and at least 1 (a limit of 0
    /// would stall every READ forever, as rxe does; the sim lets one through instead).
    fn read_limit(&self, ctx: &Ctx<'_>) -> u32 {
        let own = self.shared.config.max_rd_atomic.min(ctx.caps.max_rd_atomic);
        let depth = match self.peer_resources {
            None => own,
            Some(r) => own.min(r),
        };
        u32::from(depth).max(1)
    }

    /// A WQE failed before it started: flush older outstanding ones, report it, flush the rest.
    fn fail_unfetched(&mut self, ctx: &mut Ctx<'_>, idx: u32, op: WqeOp, status: Status) {
        while let Some(o) = self.ops.pop_front() {
            self.send_cqe(&o.wqe, o.len, Status::Flushed);
        }
        self.unfetched_cqe(idx, op, status);
        self.enter_error(ctx);
    }

    fn validate(&self, ctx: &Ctx<'_>, wqe: &Wqe) -> Result<(), Status> {
        let cfg = &self.shared.config;
        if wqe.len > u64::from(ctx.caps.max_msg_size)
            || u64::from(segments(wqe.len, ctx.mtu)) >= u64::from(PSN_WINDOW / 2)
        {
            return Err(Status::LocalLength);
        }
        if wqe.flags.contains(WrFlags::INLINE) {
            if wqe.op.reads_back() || wqe.inline_len > cfg.max_inline {
                return Err(Status::LocalQueueOperation);
            }
            return Ok(());
        }
        if u32::from(wqe.nsge) > cfg.max_send_sge {
            return Err(Status::LocalQueueOperation);
        }
        if wqe.op.is_atomic() && wqe.len != 8 {
            return Err(Status::LocalLength);
        }
        let need = if wqe.op.reads_back() { Access::LOCAL_WRITE } else { Access::empty() };
        for i in 0..usize::from(wqe.nsge) {
            // SAFETY: the WQE was fetched and is not complete, so its slot is stable.
            let s = wqe.sge(i, |i| unsafe { self.shared.sq.sge(wqe.index, i) });
            ctx.keys.resolve(s.lkey, s.addr, u64::from(s.len), need).map_err(|_| Status::LocalProtection)?;
        }
        Ok(())
    }

    /// Sends the segment with sequence number `psn` (or, for a READ, the request for the rest of
    /// its response starting there).
    fn emit(&mut self, ctx: &mut Ctx<'_>, psn: u32) -> bool {
        let Some(op) = self.ops.iter().find(|o| o.contains(psn)).copied() else {
            // Everything from here on was acknowledged meanwhile.
            self.send_psn = self.next_psn;
            return true;
        };
        let Some(remote) = self.remote.as_ref() else { return false };
        let mtu = u64::from(ctx.mtu);
        let k = u64::from(psn_offset(psn, op.first_psn));
        let off = k * mtu;
        let mut hdr = PacketHeader {
            src_nic: ctx.nic,
            dst_nic: remote.nic,
            src_qpn: self.qpn(),
            dst_qpn: remote.qpn,
            psn,
            first: k == 0,
            last: k + 1 == u64::from(op.npkts),
            offset: off as u32,
            ..Default::default()
        };
        let w = &op.wqe;
        let next = if w.op.is_atomic() {
            hdr.kind = PacketKind::AtomicRequest;
            hdr.remote_addr = w.remote_addr;
            hdr.rkey = w.rkey;
            hdr.dma_len = 8;
            hdr.atomic = w.atomic;
            hdr.has_imm = w.op == WqeOp::FetchAdd;
            psn_add(psn, 1)
        } else if w.op == WqeOp::Read {
            hdr.kind = PacketKind::ReadRequest;
            hdr.remote_addr = w.remote_addr.wrapping_add(off);
            hdr.rkey = w.rkey;
            hdr.dma_len = op.len.saturating_sub(off) as u32;
            self.flush_eager = true;
            psn_add(op.first_psn, op.npkts)
        } else {
            let plen = (op.len - off.min(op.len)).min(mtu);
            hdr.kind = if matches!(w.op, WqeOp::Send | WqeOp::SendImm) {
                PacketKind::Send
            } else {
                PacketKind::Write
            };
            hdr.payload_len = plen as u32;
            hdr.has_imm = w.op.has_imm();
            hdr.imm = w.imm;
            hdr.solicited = w.flags.contains(WrFlags::SOLICITED);
            if hdr.kind == PacketKind::Write {
                hdr.remote_addr = w.remote_addr.wrapping_add(off);
                hdr.rkey = w.rkey;
                hdr.dma_len = op.len as u32;
            }
            psn_add(psn, 1)
        };
        let result = if hdr.payload_len == 0 {
            remote.wire.transmit(&hdr, &mut |_| {})
        } else if w.flags.contains(WrFlags::INLINE) {
            let ring = &self.shared.sq;
            let idx = w.index;
            remote.wire.transmit(&hdr, &mut |buf: &mut [u8]| {
                // SAFETY: the WQE stays in its slot until we complete it, which has not happened.
                unsafe { ring.read_at(idx, WQE_HEADER + off as usize, buf) }
            })
        } else {
            let mut segs = [(std::ptr::null_mut::<u8>(), 0usize); MAX_SGE];
            let mut life = None;
            let Ok(n) = ctx.resolve_span_live(
                &self.shared.sq,
                w,
                off,
                u64::from(hdr.payload_len),
                Access::empty(),
                &mut segs,
                &mut life,
            ) else {
                // The region was deregistered after the WQE was fetched.
                self.fail_local(ctx, psn, Status::LocalProtection);
                return true;
            };
            match life {
                Some(life) if n == 1 && segs[0].1 >= BY_REF_MIN => {
                    // SAFETY: the key table vouched for `segs[0].1` readable bytes at `segs[0].0`
                    // in the registration `life` guards; we hold the device lock until the wire
                    // has taken the packet, so it stays registered meanwhile.
                    let src = unsafe { PayloadRef::new(segs[0].0, segs[0].1, life) };
                    remote.wire.transmit_ref(&hdr, src)
                }
                _ => remote.wire.transmit(&hdr, &mut |buf: &mut [u8]| gather(&segs[..n], buf)),
            }
        };
        if !self.transmitted(ctx, result) {
            return false;
        }
        if psn_diff(psn, self.sent_high) < 0 {
            ctx.stats.retransmits += 1;
            if trace::is_enabled() {
                self.trace("retransmit", &[("qpn", self.qpn().into()), ("psn", psn.into())]);
            }
        } else {
            self.sent_high = next;
        }
        self.send_psn = next;
        if self.retx_deadline == NEVER {
            self.retx_deadline = ctx.now.saturating_add(self.retx_wait);
        }
        true
    }

    /// Accounts for a request packet handed to the wire; false when the wire was full (`Busy`):
    /// the queue then waits for room and sends the same packet again (a NIC does not drop its
    /// own send queue). Otherwise the queue's wire is flushed at the end of the device pass.
    fn transmitted(&mut self, ctx: &mut Ctx<'_>, result: Transmit) -> bool {
        match result {
            Transmit::Busy => {
                self.wire_blocked = true;
                ctx.stats.tx_wire_busy += 1;
                return false;
            }
            Transmit::Sent => ctx.stats.tx_packets += 1,
            Transmit::Dropped => ctx.stats.tx_dropped += 1,
        }
        if !self.pending_flush {
            self.pending_flush = true;
            ctx.to_flush.push(self.qpn());
        }
        true
    }

    /// A local error in the message containing `psn`: the older messages were not acknowledged,
    /// so they are flushed (in order) before it fails and the queue enters ERROR.
    fn fail_local(&mut self, ctx: &mut Ctx<'_>, psn: u32, status: Status) {
        while let Some(front) = self.ops.front() {
            if front.contains(psn) {
                break;
            }
            let op = self.ops.pop_front().expect("front exists");
            self.send_cqe(&op.wqe, op.len, Status::Flushed);
        }
        self.fail_front(ctx, status);
    }

    /// A NAK for `psn`: it acknowledges the messages before it, and fails the one containing it.
    fn fail_front_at(&mut self, ctx: &mut Ctx<'_>, psn: u32, status: Status) {
        if self.implied_nak(ctx, psn) {
            // The NAK is for a message after an incomplete READ: the READ's response was lost.
            // Retry the READ (rxe does the same); the NAK, if the responder still means it, comes
            // again once the READ is complete.
            return;
        }
        self.ack_before(ctx, psn);
        self.fail_front(ctx, status);
    }

    /// Completes, in order, every message whose last segment is at or before `psn`.
    fn ack_through(&mut self, ctx: &mut Ctx<'_>, psn: u32) {
        let mut progress = false;
        while let Some(front) = self.ops.front() {
            if psn_diff(front.last_psn(), psn) > 0 {
                break;
            }
            if front.wqe.op.reads_back() {
                // Acknowledged past a READ (or atomic) whose response is incomplete: the response was lost
                // (an implied NAK). Ask again from the first missing segment.
                if progress {
                    self.on_progress(ctx);
                }
                self.implied_nak(ctx, psn_add(psn, 1));
                return;
            }
            let op = self.ops.pop_front().expect("front exists");
            self.send_cqe(&op.wqe, op.len, Status::Success);
            progress = true;
        }
        // Part of a long message acknowledged is progress too.
        if psn_diff(psn, self.acked) > 0 {
            self.acked = psn;
            progress = true;
        }
        if progress {
            self.on_progress(ctx);
        }
    }

    fn ack_before(&mut self, ctx: &mut Ctx<'_>, psn: u32) {
        self.ack_through(ctx, psn_add(psn, PSN_MASK));
    }

    /// Bookkeeping after the peer showed progress.
    fn on_progress(&mut self, ctx: &Ctx<'_>) {
        let cfg = &self.shared.config;
        self.retry_left = cfg.retry_count;
        self.rnr_left = cfg.rnr_retry;
        self.read_gap_asked = false;
        self.retx_wait = self.timeout;
        self.retx_deadline = if self.ops.is_empty() { NEVER } else { ctx.now.saturating_add(self.timeout) };
        if let Some(front) = self.ops.front() {
            let from = self.resume_psn(front);
            if psn_diff(self.send_psn, from) < 0 {
                self.send_psn = from;
            }
        } else {
            self.send_psn = self.next_psn;
        }
    }

    /// Where a retransmission of `front` (the oldest message) starts: a READ from its first
    /// missing response segment, anything else after its last acknowledged segment.
    fn resume_psn(&self, front: &Op) -> u32 {
        if front.wqe.op.reads_back() {
            return psn_add(front.first_psn, front.resp_got);
        }
        let after = psn_add(self.acked, 1);
        if front.contains(after) {
            after
        } else {
            front.first_psn
        }
    }

    /// The oldest PSN not yet acknowledged (the next PSN when nothing is outstanding).
    fn oldest_unacked(&self) -> u32 {
        self.ops.front().map_or(self.next_psn, |o| o.first_psn)
    }

    /// True if `psn` is outstanding: in [oldest unacknowledged, next PSN). Responses (NAKs, READ
    /// responses) for anything else are stale — from before a reset, or duplicated by the
    /// network — and are dropped, never applied to newer messages ("ghost ACKs").
    fn in_window(&self, psn: u32) -> bool {
        let una = self.oldest_unacked();
        psn_diff(psn, una) >= 0 && psn_diff(psn, self.next_psn) < 0
    }

    /// An implied NAK or a sequence NAK asks for a retransmission: it spends one unit of the
    /// retry budget, as rxe does (`retry_cnt`). Returns false, having failed the oldest message
    /// with `RetryExceeded`, when the budget is spent.
    fn spend_retry(&mut self, ctx: &mut Ctx<'_>) -> bool {
        if self.retry_left == 0 {
            self.fail_front(ctx, Status::RetryExceeded);
            return false;
        }
        self.retry_left -= 1;
        true
    }

    /// An incomplete READ older than `psn`: a response at `psn` means the READ's response was
    /// lost (an implied NAK), so the READ is asked again from its first missing segment.
    /// Returns true if it was (the caller then applies nothing else of the response).
    fn implied_nak(&mut self, ctx: &mut Ctx<'_>, psn: u32) -> bool {
        let Some(read) = self.ops.iter().find(|o| o.wqe.op.reads_back() && psn_diff(o.last_psn(), psn) < 0)
        else {
            return false;
        };
        let again = psn_add(read.first_psn, read.resp_got);
        if self.spend_retry(ctx) {
            self.send_psn = again;
            self.wire_blocked = false;
        }
        true
    }

    /// Rewinds to resend from `psn` if it is outstanding.
    fn rewind(&mut self, psn: u32) {
        if self.ops.iter().any(|o| o.contains(psn)) {
            self.send_psn = psn;
            self.wire_blocked = false;
        }
    }

    /// Handles an ACK or NAK.
    pub(crate) fn on_ack(&mut self, ctx: &mut Ctx<'_>, hdr: &PacketHeader) {
        if self.state != QueueState::Ready {
            return;
        }
        // An ACK may repeat the last acknowledged PSN (una - 1); a NAK names an outstanding one.
        let valid = match hdr.syndrome {
            Syndrome::Ack => {
                self.in_window(psn_add(hdr.psn, 1)) || hdr.psn == psn_add(self.next_psn, PSN_MASK)
            }
            _ => self.in_window(hdr.psn),
        };
        if !valid {
            ctx.stats.stale_responses += 1;
            return;
        }
        match hdr.syndrome {
            Syndrome::Ack => self.ack_through(ctx, hdr.psn),
            Syndrome::NakSequence => {
                ctx.stats.seq_naks_received += 1;
                if self.implied_nak(ctx, hdr.psn) {
                    return;
                }
                self.ack_before(ctx, hdr.psn);
                if self.state == QueueState::Ready
                    && self.ops.iter().any(|o| o.contains(hdr.psn))
                    && self.spend_retry(ctx)
                {
                    self.rewind(hdr.psn);
                }
            }
            Syndrome::RnrNak(wait) => {
                ctx.stats.rnr_naks_received += 1;
                if self.implied_nak(ctx, hdr.psn) {
                    return;
                }
                self.ack_before(ctx, hdr.psn);
                if self.shared.config.rnr_retry != 7 {
                    if self.rnr_left == 0 {
                        self.fail_front(ctx, Status::RnrRetryExceeded);
                        return;
                    }
                    self.rnr_left -= 1;
                }
                self.rewind(hdr.psn);
                self.rnr_until = ctx.now.saturating_add(wait);
                self.retx_deadline = NEVER;
            }
            Syndrome::NakInvalidRequest => self.fail_front_at(ctx, hdr.psn, Status::RemoteInvalidRequest),
            Syndrome::NakRemoteAccess => self.fail_front_at(ctx, hdr.psn, Status::RemoteAccess),
            Syndrome::NakRemoteOperation => self.fail_front_at(ctx, hdr.psn, Status::RemoteOperation),
        }
    }

    /// Handles a READ response segment.
    pub(crate) fn on_read_response(&mut self, ctx: &mut Ctx<'_>, hdr: &PacketHeader, payload: Payload<'_>) {
        if self.state != QueueState::Ready {
            return;
        }
        if !self.in_window(hdr.psn) {
            ctx.stats.stale_responses += 1;
            return;
        }
        // Responses come in order, so every message before the READ is complete.
        while let Some(front) = self.ops.front() {
            if front.contains(hdr.psn) {
                break;
            }
            if psn_diff(front.last_psn(), hdr.psn) > 0 {
                return; // stale response
            }
            if front.wqe.op.reads_back() {
                // A response past an incomplete READ or atomic: its responses were lost.
                let missing = self.resume_psn(front);
                self.read_gap(ctx, missing);
                return;
            }
            let op = self.ops.pop_front().expect("front exists");
            self.send_cqe(&op.wqe, op.len, Status::Success);
        }
        let Some(op) = self.ops.front().copied() else { return };
        if op.wqe.op != WqeOp::Read {
            // A READ response at the PSN of a SEND or WRITE: the responder answered something
            // that was never asked (IBA: bad response, the requester's queue goes to ERROR).
            ctx.stats.bad_responses += 1;
            self.fail_front(ctx, Status::BadResponse);
            return;
        }
        let offset = psn_offset(hdr.psn, op.first_psn);
        if offset != op.resp_got {
            if offset > op.resp_got {
                // A gap: the segments between were lost.
                self.read_gap(ctx, psn_add(op.first_psn, op.resp_got));
            }
            return; // a duplicate, or the gap asked again
        }
        let off = u64::from(op.resp_got) * u64::from(ctx.mtu);
        // The expected segment: FIRST (at the start, or where a re-request restarted), MIDDLE,
        // LAST exactly at the end, every segment but the last a full MTU.
        let expect_len = (op.len - off.min(op.len)).min(u64::from(ctx.mtu));
        let expect_last = op.resp_got + 1 == op.npkts;
        if hdr.last != expect_last || (op.resp_got == 0 && !hdr.first) || payload.len() as u64 != expect_len {
            ctx.stats.bad_responses += 1;
            self.fail_front(ctx, Status::BadResponse);
            return;
        }
        let mut segs = [(std::ptr::null_mut::<u8>(), 0usize); MAX_SGE];
        match ctx.resolve_span(
            &self.shared.sq,
            &op.wqe,
            off,
            payload.len() as u64,
            Access::LOCAL_WRITE,
            &mut segs,
        ) {
            Ok(n) => scatter(&segs[..n], payload),
            Err(_) => {
                self.fail_front(ctx, Status::LocalProtection);
                return;
            }
        }
        self.read_segments_placed(ctx, hdr.psn, 1);
    }

    /// `n` more segments of the front READ were placed, the last with PSN `last_psn`: they are
    /// acknowledged, and the READ completes with its last segment.
    fn read_segments_placed(&mut self, ctx: &mut Ctx<'_>, last_psn: u32, n: u32) {
        self.acked = last_psn;
        let front = self.ops.front_mut().expect("front exists");
        front.resp_got += n;
        if front.resp_got == front.npkts {
            let op = self.ops.pop_front().expect("front exists");
            self.send_cqe(&op.wqe, op.len, Status::Success);
            self.reads_outstanding -= 1;
            self.read_blocked = false;
        }
        self.on_progress(ctx);
    }

    /// Handles `n` READ response segments from `first` (PSNs `first.psn` onwards, the last one's
    /// LAST flag `last`) whose payloads are `run`, back to back, as `n` calls of
    /// [`on_read_response`](Self::on_read_response) would — but only if they are exactly what
    /// the front READ expects next and land, all of them, in memory it may write that does not
    /// overlap their source. Then the bytes are placed with one key check and one copy (the
    /// same bytes, since every range is checked in one piece and nothing overlaps) and true is
    /// returned. Otherwise nothing changes and it returns false.
    pub(crate) fn on_read_run(
        &mut self,
        ctx: &mut Ctx<'_>,
        first: &PacketHeader,
        last: bool,
        n: u32,
        run: Payload<'_>,
    ) -> bool {
        if self.state != QueueState::Ready || !self.in_window(first.psn) {
            return false;
        }
        let Some(op) = self.ops.front().copied() else { return false };
        // The READ is the oldest message (no SEND or WRITE before it to complete first) and the
        // run starts at its next expected segment and ends inside it.
        if op.wqe.op != WqeOp::Read
            || !op.contains(first.psn)
            || psn_offset(first.psn, op.first_psn) != op.resp_got
            || op.npkts - op.resp_got < n
        {
            return false;
        }
        let mtu = u64::from(ctx.mtu);
        let off = u64::from(op.resp_got) * mtu;
        // Every segment but the run's last is a full MTU (`joins_read_run`), so the run's length
        // is right exactly when each segment's is; only the run's last may be the READ's LAST.
        let expect_len = (op.len - off.min(op.len)).min(u64::from(n) * mtu);
        let expect_last = op.resp_got + n == op.npkts;
        if last != expect_last || (op.resp_got == 0 && !first.first) || run.len() as u64 != expect_len {
            return false;
        }
        let mut segs = [(std::ptr::null_mut::<u8>(), 0usize); MAX_SGE];
        let Ok(k) =
            ctx.resolve_span(&self.shared.sq, &op.wqe, off, run.len() as u64, Access::LOCAL_WRITE, &mut segs)
        else {
            return false; // the first segment fails the READ, as it would alone
        };
        if segs[..k].iter().any(|&(p, l)| run.overlaps(p, l)) {
            // A loopback READ into its own source: placed segment by segment, as packets come.
            return false;
        }
        scatter(&segs[..k], run);
        self.read_segments_placed(ctx, psn_add(first.psn, n - 1), n);
        true
    }

    /// A READ or atomic response arrived past `missing`, the first response not received: the
    /// ones between were lost, and responses come in order, so they will not come. As IBA's
    /// requester does on an out-of-sequence READ response (and rxe's completer): ask again from
    /// `missing` at once rather than wait for the retransmission timer, once per gap (the rest
    /// of the responses already in flight behind the gap ask nothing more), spending one retry.
    fn read_gap(&mut self, ctx: &mut Ctx<'_>, missing: u32) {
        if self.read_gap_asked {
            return;
        }
        self.read_gap_asked = true;
        ctx.stats.read_gaps += 1;
        if trace::is_enabled() {
            self.trace("read gap", &[("qpn", self.qpn().into()), ("psn", missing.into())]);
        }
        if self.spend_retry(ctx) {
            self.send_psn = missing;
            self.wire_blocked = false;
        }
    }

    /// An atomic ACK: the old value of the word the atomic at `hdr.psn` worked on.
    pub(crate) fn on_atomic_ack(&mut self, ctx: &mut Ctx<'_>, hdr: &PacketHeader) {
        if self.state != QueueState::Ready {
            return;
        }
        if !self.in_window(hdr.psn) {
            ctx.stats.stale_responses += 1;
            return;
        }
        // Responses come in order, so every message before the atomic is complete.
        while let Some(front) = self.ops.front() {
            if front.contains(hdr.psn) {
                break;
            }
            if psn_diff(front.last_psn(), hdr.psn) > 0 {
                return; // stale
            }
            if front.wqe.op.reads_back() {
                // Past an incomplete READ or atomic: its responses were lost.
                let missing = self.resume_psn(front);
                self.read_gap(ctx, missing);
                return;
            }
            let op = self.ops.pop_front().expect("front exists");
            self.send_cqe(&op.wqe, op.len, Status::Success);
        }
        let Some(op) = self.ops.front().copied() else { return };
        if !op.wqe.op.is_atomic() {
            // An atomic answer at the PSN of something else: a bad response.
            ctx.stats.bad_responses += 1;
            self.fail_front(ctx, Status::BadResponse);
            return;
        }
        let mut segs = [(std::ptr::null_mut::<u8>(), 0usize); MAX_SGE];
        match ctx.resolve_span(&self.shared.sq, &op.wqe, 0, 8, Access::LOCAL_WRITE, &mut segs) {
            // The old value in host byte order (see `SendOp::CompareSwap`).
            Ok(n) => scatter(&segs[..n], Payload::from(&hdr.atomic[0].to_ne_bytes()[..])),
            Err(_) => {
                self.fail_front(ctx, Status::LocalProtection);
                return;
            }
        }
        self.acked = hdr.psn;
        let op = self.ops.pop_front().expect("front exists");
        self.send_cqe(&op.wqe, op.len, Status::Success);
        self.reads_outstanding -= 1;
        self.read_blocked = false;
        self.on_progress(ctx);
    }

    /// The retransmission timer fired.
    pub(crate) fn on_timer(&mut self, ctx: &mut Ctx<'_>) {
        if self.datagram {
            return self.datagram_timeout(ctx);
        }
        if self.ops.is_empty() {
            self.retx_deadline = NEVER;
            return;
        }
        if self.retry_left == 0 {
            self.fail_front(ctx, Status::RetryExceeded);
            return;
        }
        self.retry_left -= 1;
        self.read_gap_asked = false;
        let front = self.ops[0];
        self.send_psn = self.resume_psn(&front);
        self.wire_blocked = false;
        self.back_off();
        self.retx_deadline = ctx.now.saturating_add(self.retx_wait);
        ctx.stats.timeouts += 1;
        if trace::is_enabled() {
            let args = [
                ("qpn", self.qpn().into()),
                ("psn", self.send_psn.into()),
                ("retries_left", self.retry_left.into()),
                ("next_wait_ns", self.retx_wait.into()),
            ];
            self.trace("timeout", &args);
        }
    }

    // ---------------------------------------------------------------- responder

    fn reply(&self, ctx: &mut Ctx<'_>, syndrome: Syndrome, psn: u32) {
        ctx.push_ack(self.qpn(), syndrome, psn);
    }

    /// Handles a request packet (SEND, WRITE, READ request) in PSN order.
    pub(crate) fn on_request(&mut self, ctx: &mut Ctx<'_>, hdr: &PacketHeader, payload: Payload<'_>) {
        if self.state != QueueState::Ready {
            return;
        }
        let d = psn_diff(hdr.psn, self.epsn);
        if d < 0 {
            ctx.stats.duplicates += 1;
            if hdr.kind == PacketKind::AtomicRequest {
                // A duplicate atomic is not executed again: its remembered result is sent again
                // (or, if the responder no longer has it, the duplicate is dropped).
                match self.reads_answered.atomic_result(hdr.psn) {
                    Some(old) => self.atomic_ack(ctx, hdr.psn, old),
                    None => ctx.stats.duplicate_reads_dropped += 1,
                }
            } else if hdr.kind == PacketKind::ReadRequest {
                // A duplicate READ is answered again (the first answer may have been lost) if it
                // is one of the READs the responder still has a resource for; the memory is
                // checked again. Otherwise it is dropped, as rxe does.
                let covered = self.reads_answered.covers(
                    hdr.psn,
                    hdr.remote_addr,
                    hdr.rkey,
                    u64::from(hdr.dma_len),
                    ctx.mtu,
                );
                if !covered {
                    ctx.stats.duplicate_reads_dropped += 1;
                } else if self.execute_read(ctx, hdr).is_err() {
                    self.reply(ctx, Syndrome::NakRemoteAccess, hdr.psn);
                }
            } else {
                // Up to the last SEND, WRITE or atomic, never past a READ (`ack_psn`).
                self.reply(ctx, Syndrome::Ack, psn_add(self.ack_psn, PSN_MASK));
            }
            return;
        }
        if d > 0 {
            if !self.nak_seq_sent {
                self.nak_seq_sent = true;
                self.reply(ctx, Syndrome::NakSequence, self.epsn);
            }
            return;
        }
        self.nak_seq_sent = false;
        let in_send = self.cur_recv.is_some() && hdr.kind != PacketKind::Send;
        let in_write = self.cur_write.is_some() && hdr.kind != PacketKind::Write;
        if in_send || in_write {
            // Another opcode where a SEND or WRITE's next segment belongs (IBA opcode sequence
            // check; rxe's RESPST_CHK_OP_SEQ).
            self.responder_error(ctx, Syndrome::NakInvalidRequest, hdr.psn);
            return;
        }
        match hdr.kind {
            PacketKind::Send => self.on_send(ctx, hdr, payload),
            PacketKind::Write => self.on_write(ctx, hdr, payload),
            // A queue with no READ resources (max_dest_rd_atomic 0) may not be read from.
            PacketKind::ReadRequest if !self.reads_answered.enabled() => {
                self.responder_error(ctx, Syndrome::NakInvalidRequest, hdr.psn)
            }
            PacketKind::ReadRequest => match self.execute_read(ctx, hdr) {
                Ok(n) => {
                    let len = u64::from(hdr.dma_len);
                    self.reads_answered.record(hdr.psn, n, hdr.remote_addr, hdr.rkey, len);
                    self.epsn = psn_add(self.epsn, n);
                }
                Err(_) => self.responder_error(ctx, Syndrome::NakRemoteAccess, hdr.psn),
            },
            PacketKind::AtomicRequest if !self.reads_answered.enabled() => {
                self.responder_error(ctx, Syndrome::NakInvalidRequest, hdr.psn)
            }
            PacketKind::AtomicRequest => self.on_atomic(ctx, hdr),
            PacketKind::ReadResponse | PacketKind::Ack | PacketKind::AtomicAck => {}
        }
    }

    /// A class C responder error: NAK the requester and go to ERROR.
    fn responder_error(&mut self, ctx: &mut Ctx<'_>, syndrome: Syndrome, psn: u32) {
        self.reply(ctx, syndrome, psn);
        if self.state != QueueState::Error {
            // The responder's failure may have no work request of its own to report it (a bad
            // WRITE or READ consumes no receive): say so as verbs does, with an async event.
            let qpn = self.qpn();
            ctx.events.push(match syndrome {
                Syndrome::NakRemoteAccess => AsyncEvent::QueueAccessError { qpn },
                Syndrome::NakInvalidRequest => AsyncEvent::QueueRequestError { qpn },
                _ => AsyncEvent::QueueFatal { qpn },
            });
        }
        self.enter_error(ctx);
    }

    fn on_send(&mut self, ctx: &mut Ctx<'_>, hdr: &PacketHeader, payload: Payload<'_>) {
        if hdr.first != self.cur_recv.is_none() {
            // A middle segment without a first one, or a new message inside another.
            self.responder_error(ctx, Syndrome::NakInvalidRequest, hdr.psn);
            return;
        }
        if hdr.first {
            self.recv_off = 0;
            match self.fetch_rq() {
                None => {
                    ctx.stats.rnr_naks_sent += 1;
                    self.reply(ctx, Syndrome::RnrNak(self.min_rnr), hdr.psn);
                    // The RNR NAK is the one NAK for this PSN (see `nak_seq_sent`).
                    self.nak_seq_sent = true;
                    return;
                }
                Some(Ok(w))
                    if w.op == WqeOp::Recv && u32::from(w.nsge) <= self.shared.config.max_recv_sge =>
                {
                    self.cur_recv = Some(w)
                }
                Some(_) => {
                    self.recv_cqe(self.rq_fetch, Status::LocalQueueOperation, CqOpcode::Recv, 0, None, false);
                    self.rq_fetch = self.rq_fetch.wrapping_add(1);
                    self.responder_error(ctx, Syndrome::NakRemoteOperation, hdr.psn);
                    return;
                }
            }
        }
        let recv = self.cur_recv.expect("set above");
        let capacity = recv.len;
        let off = self.recv_off;
        let end = u64::from(off) + payload.len() as u64;
        if end > capacity {
            self.fail_recv(ctx, Status::LocalLength, Syndrome::NakInvalidRequest, hdr.psn);
            return;
        }
        let mut segs = [(std::ptr::null_mut::<u8>(), 0usize); MAX_SGE];
        match ctx.resolve_span(
            &self.shared.rq,
            &recv,
            u64::from(off),
            payload.len() as u64,
            Access::LOCAL_WRITE,
            &mut segs,
        ) {
            Ok(n) => scatter(&segs[..n], payload),
            Err(_) => {
                self.fail_recv(ctx, Status::LocalProtection, Syndrome::NakRemoteOperation, hdr.psn);
                return;
            }
        }
        self.epsn = psn_add(self.epsn, 1);
        self.ack_psn = self.epsn;
        self.recv_off = end as u32;
        if hdr.last {
            let imm = hdr.has_imm.then_some(hdr.imm);
            self.recv_cqe(self.rq_fetch, Status::Success, CqOpcode::Recv, end as u32, imm, hdr.solicited);
            self.rq_fetch = self.rq_fetch.wrapping_add(1);
            self.cur_recv = None;
            self.segs_unacked = 0;
            self.reply(ctx, Syndrome::Ack, hdr.psn);
        } else {
            self.ack_some(ctx, hdr.psn);
        }
    }

    /// A middle segment placed: acknowledge it if [`ACK_EVERY`] have gone unacknowledged.
    fn ack_some(&mut self, ctx: &mut Ctx<'_>, psn: u32) {
        self.segs_unacked += 1;
        if self.segs_unacked >= ACK_EVERY {
            self.segs_unacked = 0;
            self.reply(ctx, Syndrome::Ack, psn);
        }
    }

    /// The receive being filled failed: report it, NAK, go to ERROR.
    fn fail_recv(&mut self, ctx: &mut Ctx<'_>, status: Status, syndrome: Syndrome, psn: u32) {
        self.recv_cqe(self.rq_fetch, status, CqOpcode::Recv, 0, None, false);
        self.rq_fetch = self.rq_fetch.wrapping_add(1);
        self.cur_recv = None;
        self.responder_error(ctx, syndrome, psn);
    }

    fn on_write(&mut self, ctx: &mut Ctx<'_>, hdr: &PacketHeader, payload: Payload<'_>) {
        if hdr.first != self.cur_write.is_none() {
            // A middle segment without a first one, or a new WRITE inside another.
            self.responder_error(ctx, Syndrome::NakInvalidRequest, hdr.psn);
            return;
        }
        let w = match self.cur_write {
            Some(w) => w,
            None => WriteState { va: hdr.remote_addr, rkey: hdr.rkey, len: hdr.dma_len, off: 0 },
        };
        let end = u64::from(w.off) + payload.len() as u64;
        if end > u64::from(w.len) || (hdr.last && end != u64::from(w.len)) {
            // More (or, at the end, less) data than the RETH announced.
            self.responder_error(ctx, Syndrome::NakInvalidRequest, hdr.psn);
            return;
        }
        let addr = w.va.wrapping_add(u64::from(w.off));
        // IBA C9-88 (rxe's `check_rkey` says so too): a zero-length WRITE names no memory, so
        // its address and remote key are not checked; it only completes in order. The stack
        // uses one as a marker that retires the unsignaled sends before it.
        let dst = if w.len == 0 {
            std::ptr::null_mut()
        } else {
            match ctx.keys.resolve(w.rkey, addr, payload.len() as u64, Access::REMOTE_WRITE) {
                Ok(p) => p,
                Err(_) => {
                    self.responder_error(ctx, Syndrome::NakRemoteAccess, hdr.psn);
                    return;
                }
            }
        };
        let consumes_recv = hdr.last && hdr.has_imm;
        if consumes_recv && !self.have_recv() {
            ctx.stats.rnr_naks_sent += 1;
            self.reply(ctx, Syndrome::RnrNak(self.min_rnr), hdr.psn);
            self.nak_seq_sent = true;
            return;
        }
        if payload.len() > 0 {
            // SAFETY: the key table checked that `payload.len()` bytes at `dst` lie inside a live
            // registration with REMOTE_WRITE (we hold the device lock); a zero-length WRITE has no
            // payload and copies nothing.
            unsafe { payload.copy_out(0, dst, payload.len()) };
        }
        self.epsn = psn_add(self.epsn, 1);
        self.ack_psn = self.epsn;
        self.cur_write = (!hdr.last).then_some(WriteState { off: end as u32, ..w });
        if !hdr.last {
            self.ack_some(ctx, hdr.psn);
        }
        if hdr.last {
            self.segs_unacked = 0;
            if consumes_recv {
                self.recv_cqe(
                    self.rq_fetch,
                    Status::Success,
                    CqOpcode::RecvWriteImm,
                    w.len,
                    Some(hdr.imm),
                    hdr.solicited,
                );
                self.rq_fetch = self.rq_fetch.wrapping_add(1);
            }
            self.reply(ctx, Syndrome::Ack, hdr.psn);
        }
    }

    /// Checks a READ request and queues its response segments. Returns how many.
    /// Executes an atomic request (in PSN order) on the 8-byte word it names and answers with
    /// the word's old value.
    fn on_atomic(&mut self, ctx: &mut Ctx<'_>, hdr: &PacketHeader) {
        if hdr.remote_addr % 8 != 0 {
            // IBA: an atomic's address must be 8-byte aligned (rxe: misaligned atomic → NAK
            // invalid request).
            self.responder_error(ctx, Syndrome::NakInvalidRequest, hdr.psn);
            return;
        }
        let p = match ctx.keys.resolve(hdr.rkey, hdr.remote_addr, 8, Access::REMOTE_ATOMIC) {
            Ok(p) if (p as usize) % std::mem::align_of::<AtomicU64>() == 0 => p,
            Ok(_) => {
                self.responder_error(ctx, Syndrome::NakInvalidRequest, hdr.psn);
                return;
            }
            Err(_) => {
                self.responder_error(ctx, Syndrome::NakRemoteAccess, hdr.psn);
                return;
            }
        };
        // SAFETY: the key table vouches for 8 bytes at `p` in a live registration with
        // REMOTE_ATOMIC, and `p` is 8-byte aligned (checked above). The host may access the word
        // concurrently only with atomics of its own (the hal's contract for atomic targets), so
        // viewing it as an AtomicU64 is sound.
        let word = unsafe { &*(p as *const AtomicU64) };
        let [operand, compare] = hdr.atomic;
        let old = if hdr.has_imm {
            word.fetch_add(operand, AtomicOrdering::SeqCst)
        } else {
            match word.compare_exchange(compare, operand, AtomicOrdering::SeqCst, AtomicOrdering::SeqCst) {
                Ok(v) | Err(v) => v,
            }
        };
        self.reads_answered.record_atomic(hdr.psn, old);
        self.epsn = psn_add(self.epsn, 1);
        self.ack_psn = self.epsn;
        self.atomic_ack(ctx, hdr.psn, old);
    }

    /// Queues the answer to the atomic at `psn`.
    fn atomic_ack(&self, ctx: &mut Ctx<'_>, psn: u32, old: u64) {
        ctx.outbox.push_back(TxDesc {
            qpn: self.qpn(),
            hdr: PacketHeader { kind: PacketKind::AtomicAck, psn, atomic: [old, 0], ..Default::default() },
            read_from: None,
            merged: false,
        });
    }

    fn execute_read(&self, ctx: &mut Ctx<'_>, hdr: &PacketHeader) -> Result<u32, KeyFault> {
        let len = u64::from(hdr.dma_len);
        ctx.keys.resolve(hdr.rkey, hdr.remote_addr, len, Access::REMOTE_READ)?;
        let mtu = u64::from(ctx.mtu);
        let n = segments(len, ctx.mtu);
        for k in 0..n {
            let off = u64::from(k) * mtu;
            let plen = (len - off.min(len)).min(mtu);
            ctx.outbox.push_back(TxDesc {
                qpn: self.qpn(),
                hdr: PacketHeader {
                    kind: PacketKind::ReadResponse,
                    psn: psn_add(hdr.psn, k),
                    first: k == 0,
                    last: k + 1 == n,
                    offset: off as u32,
                    payload_len: plen as u32,
                    ..Default::default()
                },
                read_from: Some((hdr.rkey, hdr.remote_addr.wrapping_add(off))),
                merged: false,
            });
        }
        Ok(n)
    }
}

/// Fetches the WQE at `idx`: its first block, then (for SGE WQEs) the SGE lengths to size it.
fn fetch(ring: &WorkRing, idx: u32) -> Result<Wqe, layout::WqeFault> {
    let mut blk = [0u8; BLOCK];
    // SAFETY: idx is below the producer index we acquired and not yet completed, so the driver is
    // not writing this slot.
    unsafe { ring.read_at(idx, 0, &mut blk) };
    let mut w = layout::decode_wqe(&blk, ring.stride(), ring.owner(idx), idx)?;
    if !w.flags.contains(WrFlags::INLINE) {
        // The SGEs that fit in the first block are already here; the rest come from the ring.
        let in_first = (BLOCK - WQE_HEADER) / layout::WQE_SGE;
        w.len = (0..usize::from(w.nsge))
            .map(|i| {
                let sge = if i < in_first {
                    let o = WQE_HEADER + i * layout::WQE_SGE;
                    layout::decode_sge(blk[o..o + layout::WQE_SGE].try_into().expect("16 bytes"))
                } else {
                    // SAFETY: as above.
                    unsafe { ring.sge(idx, i) }
                };
                u64::from(sge.len)
            })
            .sum();
    }
    Ok(w)
}

/// loom only: the device's WQE fetch, for the ring models (`crate::loom_api`).
#[cfg(loom)]
pub(crate) fn fetch_for_loom(ring: &WorkRing, idx: u32) -> Result<Wqe, layout::WqeFault> {
    fetch(ring, idx)
}

/// Copies scattered host ranges into one wire buffer.
fn gather(segs: &[(*mut u8, usize)], buf: &mut [u8]) {
    let mut pos = 0;
    for &(p, n) in segs {
        // SAFETY: `resolve_span` produced these ranges from live registrations (under the device
        // lock, which the caller holds); `buf` is wire memory and does not overlap host memory.
        unsafe { std::ptr::copy_nonoverlapping(p, buf[pos..pos + n].as_mut_ptr(), n) };
        pos += n;
    }
}

/// Copies one received payload into scattered host ranges.
fn scatter(segs: &[(*mut u8, usize)], payload: Payload<'_>) {
    let mut pos = 0;
    for &(p, n) in segs {
        // SAFETY: the key table vouched for `n` writable bytes at `p` in a live registration
        // (under the device lock, which the caller holds); `copy_out` checks the payload's bounds
        // and allows the payload to overlap them (a loopback by reference).
        unsafe { payload.copy_out(pos, p, n) };
        pos += n;
    }
}
