//! The unreliable datagram service (UB's UM, "unreliable message"; verbs' UD) of a queue.
//!
//! A datagram queue is connected to no one. Each send WQE names its destination: an address
//! handle (bytes 28..32 of the WQE: an index into the queue's [`QpCtx::dests`], which the driver
//! fills when the user adds a target), which names the target NIC and queue. What hardware does, and what this models:
//!
//! - **Operations.** SEND, SEND_IMM, WRITE, WRITE_IMM and READ (UB's UM carries memory
//!   operations too: UMDK's `urma_sample -m 2` WRITEs and READs on a UM jetty); no atomics.
//! - **One packet per message.** A message longer than the MTU fails with `LocalLength` before
//!   anything is sent (verbs UD; a READ's response is one packet too).
//! - **No acknowledgement, no retry.** A SEND or WRITE completes (`Success`) once the packet is
//!   on the wire: a packet the wire loses is lost, and the sender never knows. No PSN is checked
//!   by the receiver; the packet carries the queue's next PSN for captures only.
//! - **READ** waits for its one response (later work waits behind it, so completions stay in
//!   posting order) and completes with it. A request or response the wire loses is not asked
//!   again: after the queue's ACK timeout the READ completes with `RetryExceeded` and the queue
//!   stays READY. A responder answers a READ only from a NIC it has a route to (one it reached:
//!   `SimNic::reach`, or a destination of one of its datagram queues) and drops it otherwise.
//! - **Memory errors are silent.** A WRITE or READ whose key, range or rights the responder
//!   refuses is dropped (`NicStats::datagrams_dropped`): nothing goes back to say so (for a
//!   READ, the requester's timeout does).
//! - **Any sender.** The receiving datagram queue takes a datagram from any queue of any NIC its
//!   wire can name. The receive completion carries the source: the sending queue's number (the
//!   DETH's source QP on a byte wire) and the sending NIC's source id.
//! - **No receive, no delivery.** A datagram that finds no receive posted is dropped silently
//!   (`NicStats::datagrams_dropped`); there is no RNR. A receive too short for the datagram
//!   completes with `LocalLength` and the datagram is dropped; the queue stays READY (one bad
//!   message does not take a connectionless queue down).
//! - **Errors.** A send WQE the device cannot carry out (a bad opcode: datagram queues SEND
//!   only; a bad address handle; a protection fault) fails with its status and moves the queue
//!   to ERROR, as a local error does on every verbs queue type.
//! - **Ordering.** Datagrams from one queue to one destination leave in posting order; the
//!   wire may reorder or duplicate them (UDP), and the receiver does not reorder or filter.
//!
//! **Reliable** (UB's RM, "reliable message"; verbs' RD without EE contexts): a datagram queue
//! created reliable keeps the connectionless addressing above (any target per WQE, any sender)
//! and adds RC's delivery guarantees, one message at a time:
//!
//! - **Acknowledged, stop and wait.** Every message (SEND, WRITE, READ) waits for its answer
//!   before the next WQE is fetched: an ACK (an RD ACKNOWLEDGE on a byte wire), or the READ's
//!   response. So a queue's messages arrive and complete in posting order whatever their
//!   targets, and nothing is reordered by a lossy wire.
//! - **Retried.** A message unanswered after the queue's ACK timeout is sent again with its PSN,
//!   `retry_count` times, then completes with `RetryExceeded` and the queue goes to ERROR. With
//!   the fabric's backoff (`FabricConfig::ack_timeout_backoff`) each unanswered wait doubles the
//!   next, as on RC.
//! - **RNR.** A SEND (or WRITE with immediate) finding no receive posted gets an RNR NAK; the
//!   sender waits the responder's RNR time and sends again (`rnr_retry` times, 7 = forever),
//!   then `RnrRetryExceeded`. Nothing is dropped silently.
//! - **Errors are reported.** A WRITE or READ the responder's keys refuse gets a remote access
//!   NAK (`RemoteAccess` at the requester, its queue to ERROR); a receive too short completes
//!   `LocalLength` at the responder (which stays READY) and the requester gets
//!   `RemoteInvalidRequest`.
//! - **Exactly once.** The responder remembers the last PSN it took from each sending queue: a
//!   retransmission of it (its ACK was lost) is acknowledged again, not delivered twice.
//! - Both ends must be reliable: a reliable queue's packets are datagrams, and an unreliable
//!   receiver would take them without answering (the sender then times out).

use super::{gather, scatter, QpCtx, Remote};
use crate::device::Ctx;
use crate::layout::{WqeOp, MAX_SGE, WQE_HEADER};
use crate::packet::{psn_add, PacketHeader, PacketKind, Syndrome};
use crate::source::Payload;
use crate::wire::Transmit;
use bypass_hal::{Access, CqOpcode, QueueState, Status, WrFlags};

impl QpCtx {
    /// RESET → READY for a datagram queue: no peer, only its address handles.
    pub(crate) fn activate_datagram(&mut self) {
        let psn = self.shared.psn.load(crate::sync::Ordering::Relaxed);
        self.send_psn = psn;
        self.next_psn = psn;
        self.sent_high = psn;
        self.retx_wait = self.timeout;
        self.set_state(QueueState::Ready);
    }

    /// Adds an address handle; returns its index (what a WQE names).
    pub(crate) fn add_dest(&mut self, remote: Remote) -> u32 {
        if let Some(i) = self.dests.iter().position(|d| d.nic == remote.nic && d.qpn == remote.qpn) {
            return i as u32;
        }
        self.dests.push(remote);
        (self.dests.len() - 1) as u32
    }

    /// Send-side step of a datagram queue (READY): fetch one WQE, send its one packet, complete
    /// it. Returns whether anything happened.
    pub(super) fn datagram_step(&mut self, ctx: &mut Ctx<'_>) -> bool {
        let idx = self.sq_fetch;
        if self.shared.sq.producer() == idx {
            return false;
        }
        if self.read_blocked {
            return false; // a READ waits for its response
        }
        let wqe = match self.fetch_sq(idx) {
            Ok(w) if !w.op.is_atomic() && w.op != WqeOp::Recv => w,
            Ok(w) => {
                self.fail_unfetched(ctx, idx, w.op, Status::LocalQueueOperation);
                return true;
            }
            Err(_) => {
                self.fail_unfetched(ctx, idx, WqeOp::Send, Status::LocalQueueOperation);
                return true;
            }
        };
        if let Err(status) = self.validate(ctx, &wqe) {
            self.fail_unfetched(ctx, idx, wqe.op, status);
            return true;
        }
        if wqe.len > u64::from(ctx.mtu) {
            self.fail_unfetched(ctx, idx, wqe.op, Status::LocalLength);
            return true;
        }
        let Some(remote) = self.dests.get(wqe.ah as usize) else {
            self.fail_unfetched(ctx, idx, wqe.op, Status::LocalQueueOperation);
            return true;
        };
        // The address handle names the target queue too.
        let (dst_qpn, kind) = match wqe.op {
            WqeOp::Send | WqeOp::SendImm => (remote.qpn, PacketKind::Send),
            WqeOp::Write | WqeOp::WriteImm => (remote.qpn, PacketKind::Write),
            _ => (remote.qpn, PacketKind::ReadRequest),
        };
        let mut hdr = PacketHeader {
            src_nic: ctx.nic,
            dst_nic: remote.nic,
            src_qpn: self.shared.qpn,
            dst_qpn,
            kind,
            first: true,
            last: true,
            has_imm: wqe.op.has_imm(),
            imm: wqe.imm,
            solicited: wqe.flags.contains(WrFlags::SOLICITED),
            psn: self.next_psn,
            payload_len: wqe.len as u32,
            datagram: true,
            ..Default::default()
        };
        if kind != PacketKind::Send {
            hdr.remote_addr = wqe.remote_addr;
            hdr.rkey = wqe.rkey;
            hdr.dma_len = wqe.len as u32;
        }
        if kind == PacketKind::ReadRequest {
            hdr.payload_len = 0;
        }
        let result = if hdr.payload_len == 0 {
            remote.wire.transmit(&hdr, &mut |_| {})
        } else if wqe.flags.contains(WrFlags::INLINE) {
            let ring = &self.shared.sq;
            remote.wire.transmit(&hdr, &mut |buf: &mut [u8]| {
                // SAFETY: the WQE stays in its slot until we complete it, below.
                unsafe { ring.read_at(idx, WQE_HEADER, buf) }
            })
        } else {
            let mut segs = [(std::ptr::null_mut::<u8>(), 0usize); MAX_SGE];
            let Ok(n) = ctx.resolve_span(&self.shared.sq, &wqe, 0, wqe.len, Access::empty(), &mut segs)
            else {
                self.fail_unfetched(ctx, idx, wqe.op, Status::LocalProtection);
                return true;
            };
            remote.wire.transmit(&hdr, &mut |buf: &mut [u8]| gather(&segs[..n], buf))
        };
        if !self.transmitted(ctx, result) {
            return false;
        }
        let psn = self.next_psn;
        self.next_psn = psn_add(self.next_psn, 1);
        self.send_psn = self.next_psn;
        self.sent_high = self.next_psn;
        self.sq_fetch = idx.wrapping_add(1);
        if kind == PacketKind::ReadRequest || self.reliable {
            // Wait for the answer (the READ's response; a reliable message's ACK).
            self.ops.push_back(super::Op { wqe, len: wqe.len, first_psn: psn, npkts: 1, resp_got: 0 });
            self.read_blocked = true;
            // Reliable: the wait grows while retransmissions go unanswered (see `back_off`); a
            // datagram READ is never asked again, so its one wait is the timeout.
            self.retx_deadline =
                ctx.now.saturating_add(if self.reliable { self.retx_wait } else { self.timeout });
        } else {
            self.send_cqe(&wqe, wqe.len, Status::Success);
        }
        true
    }

    /// A datagram READ's time is up: it completes with `RetryExceeded` (nothing is asked again)
    /// and the queue goes on.
    pub(super) fn datagram_timeout(&mut self, ctx: &mut Ctx<'_>) {
        self.retx_deadline = super::NEVER;
        if self.reliable {
            if self.ops.is_empty() {
                return;
            }
            ctx.stats.timeouts += 1;
            if self.retry_left == 0 {
                return self.fail_front(ctx, Status::RetryExceeded);
            }
            self.retry_left -= 1;
            self.back_off();
            return self.resend_front(ctx);
        }
        if let Some(op) = self.ops.pop_front() {
            ctx.stats.timeouts += 1;
            self.send_cqe(&op.wqe, op.len, Status::RetryExceeded);
        }
        self.read_blocked = false;
    }

    /// Reliable: gives the outstanding message back to the send ring, to be fetched and sent
    /// again with the same PSN (stop and wait: it is the last WQE fetched).
    fn resend_front(&mut self, ctx: &mut Ctx<'_>) {
        if let Some(op) = self.ops.pop_front() {
            ctx.stats.retransmits += 1;
            self.sq_fetch = self.sq_fetch.wrapping_sub(1);
            self.next_psn = op.first_psn;
            self.send_psn = op.first_psn;
            self.sent_high = op.first_psn;
        }
        self.read_blocked = false;
        self.wire_blocked = false;
    }

    /// Reliable: the outstanding message was answered; the next one may go.
    fn answered(&mut self) {
        self.read_blocked = false;
        self.retx_deadline = super::NEVER;
        self.retry_left = self.shared.config.retry_count;
        self.rnr_left = self.shared.config.rnr_retry;
        self.retx_wait = self.timeout;
    }

    /// Reliable: the answer (ACK or NAK) to this queue's outstanding message.
    fn on_datagram_ack(&mut self, ctx: &mut Ctx<'_>, hdr: &PacketHeader) {
        let Some(op) = self.ops.front().copied() else {
            ctx.stats.stale_responses += 1;
            return;
        };
        if !self.reliable || op.first_psn != hdr.psn || op.wqe.op.reads_back() {
            ctx.stats.stale_responses += 1;
            return;
        }
        match hdr.syndrome {
            Syndrome::Ack => {
                self.ops.pop_front();
                self.answered();
                self.send_cqe(&op.wqe, op.len, Status::Success);
            }
            Syndrome::RnrNak(wait) => {
                ctx.stats.rnr_naks_received += 1;
                if self.shared.config.rnr_retry != 7 {
                    if self.rnr_left == 0 {
                        return self.fail_front(ctx, Status::RnrRetryExceeded);
                    }
                    self.rnr_left -= 1;
                }
                self.retx_deadline = super::NEVER;
                self.rnr_until = ctx.now.saturating_add(wait);
                self.resend_front(ctx);
            }
            Syndrome::NakSequence => {
                // Not sent by a datagram responder; a sender sends again.
                self.resend_front(ctx);
            }
            Syndrome::NakInvalidRequest => self.fail_front(ctx, Status::RemoteInvalidRequest),
            Syndrome::NakRemoteAccess => self.fail_front(ctx, Status::RemoteAccess),
            Syndrome::NakRemoteOperation => self.fail_front(ctx, Status::RemoteOperation),
        }
    }

    /// Reliable responder: answers the request `hdr` (to its sending queue, on the route to its
    /// NIC; a NIC with no route is not answered, as a READ from it is not).
    fn datagram_reply(&self, ctx: &mut Ctx<'_>, hdr: &PacketHeader, syndrome: Syndrome) {
        let Some(route) = ctx.routes.get(&hdr.src_nic) else {
            ctx.stats.datagrams_dropped += 1;
            return;
        };
        let ack = PacketHeader {
            src_nic: ctx.nic,
            dst_nic: hdr.src_nic,
            src_qpn: self.shared.qpn,
            dst_qpn: hdr.src_qpn,
            kind: PacketKind::Ack,
            syndrome,
            psn: hdr.psn,
            datagram: true,
            ..Default::default()
        };
        match route.wire.transmit(&ack, &mut |_| {}) {
            Transmit::Sent => ctx.stats.tx_responses += 1,
            Transmit::Dropped | Transmit::Busy => ctx.stats.tx_dropped += 1,
        }
        route.wire.flush(false);
    }

    /// Reliable responder: whether `hdr` repeats the last message taken from its sender.
    fn taken_before(&self, hdr: &PacketHeader) -> bool {
        self.taken.iter().any(|&(nic, qpn, psn)| nic == hdr.src_nic && qpn == hdr.src_qpn && psn == hdr.psn)
    }

    /// Reliable responder: `hdr` was taken (delivered or carried out); remember it, and ACK.
    fn take(&mut self, ctx: &mut Ctx<'_>, hdr: &PacketHeader) {
        match self.taken.iter_mut().find(|t| t.0 == hdr.src_nic && t.1 == hdr.src_qpn) {
            Some(t) => t.2 = hdr.psn,
            None => self.taken.push((hdr.src_nic, hdr.src_qpn, hdr.psn)),
        }
        self.datagram_reply(ctx, hdr, Syndrome::Ack);
    }

    /// The response to this queue's outstanding datagram READ (anything else is dropped).
    fn on_datagram_read_response(&mut self, ctx: &mut Ctx<'_>, hdr: &PacketHeader, payload: Payload<'_>) {
        let Some(op) = self.ops.front().copied() else {
            ctx.stats.stale_responses += 1;
            return;
        };
        if op.first_psn != hdr.psn || payload.len() as u64 != op.len {
            ctx.stats.stale_responses += 1;
            return;
        }
        self.ops.pop_front();
        self.answered();
        let mut segs = [(std::ptr::null_mut::<u8>(), 0usize); MAX_SGE];
        match ctx.resolve_span(&self.shared.sq, &op.wqe, 0, op.len, Access::LOCAL_WRITE, &mut segs) {
            Ok(n) => {
                scatter(&segs[..n], payload);
                self.send_cqe(&op.wqe, op.len, Status::Success);
            }
            Err(_) => {
                self.send_cqe(&op.wqe, op.len, Status::LocalProtection);
                self.enter_error(ctx);
            }
        }
    }

    /// A datagram WRITE or READ request for this queue's NIC memory.
    fn on_datagram_memory(&mut self, ctx: &mut Ctx<'_>, hdr: &PacketHeader, payload: Payload<'_>) {
        if hdr.kind == PacketKind::ReadRequest {
            let len = u64::from(hdr.dma_len);
            let route = ctx.routes.get(&hdr.src_nic);
            let ok = len <= u64::from(ctx.mtu)
                && ctx.keys.resolve(hdr.rkey, hdr.remote_addr, len, Access::REMOTE_READ).is_ok();
            let (Some(route), true) = (route, ok) else {
                ctx.stats.datagrams_dropped += 1;
                if self.reliable && route.is_some() {
                    self.datagram_reply(ctx, hdr, Syndrome::NakRemoteAccess);
                }
                return;
            };
            let resp = PacketHeader {
                src_nic: ctx.nic,
                dst_nic: hdr.src_nic,
                src_qpn: self.shared.qpn,
                dst_qpn: hdr.src_qpn,
                kind: PacketKind::ReadResponse,
                first: true,
                last: true,
                psn: hdr.psn,
                payload_len: len as u32,
                datagram: true,
                ..Default::default()
            };
            let keys = ctx.keys;
            let (addr, rkey) = (hdr.remote_addr, hdr.rkey);
            let sent = route.wire.transmit(&resp, &mut |buf: &mut [u8]| {
                if let Ok(src) = keys.resolve(rkey, addr, buf.len() as u64, Access::REMOTE_READ) {
                    // SAFETY: the key table vouched for `buf.len()` readable bytes at `src` in a
                    // live registration (we hold the device lock); `buf` is wire memory.
                    unsafe { std::ptr::copy_nonoverlapping(src, buf.as_mut_ptr(), buf.len()) }
                }
            });
            match sent {
                Transmit::Sent => ctx.stats.tx_responses += 1,
                Transmit::Dropped | Transmit::Busy => ctx.stats.tx_dropped += 1,
            }
            route.wire.flush(false);
            return;
        }
        let len = payload.len() as u64;
        let Ok(dst) = ctx.keys.resolve(hdr.rkey, hdr.remote_addr, len, Access::REMOTE_WRITE) else {
            ctx.stats.datagrams_dropped += 1;
            if self.reliable {
                self.datagram_reply(ctx, hdr, Syndrome::NakRemoteAccess);
            }
            return;
        };
        if hdr.has_imm && !self.have_recv() {
            if self.reliable {
                ctx.stats.rnr_naks_sent += 1;
                return self.datagram_reply(ctx, hdr, Syndrome::RnrNak(self.min_rnr));
            }
            ctx.stats.datagrams_dropped += 1;
            return;
        }
        // SAFETY: the key table checked that `len` bytes at `dst` lie inside a live registration
        // with REMOTE_WRITE (we hold the device lock).
        unsafe { payload.copy_out(0, dst, payload.len()) };
        if hdr.has_imm {
            let from = (hdr.src_nic, hdr.src_qpn);
            self.recv_cqe_from(
                self.rq_fetch,
                Status::Success,
                CqOpcode::RecvWriteImm,
                len as u32,
                Some(hdr.imm),
                hdr.solicited,
                from,
            );
            self.rq_fetch = self.rq_fetch.wrapping_add(1);
        }
        if self.reliable {
            self.take(ctx, hdr);
        }
    }

    /// A datagram arrived for this (datagram) queue.
    pub(crate) fn on_datagram(&mut self, ctx: &mut Ctx<'_>, hdr: &PacketHeader, payload: Payload<'_>) {
        if self.state == QueueState::Ready && hdr.kind == PacketKind::Ack {
            return self.on_datagram_ack(ctx, hdr); // (an ACK is neither first nor last)
        }
        if self.state != QueueState::Ready || !(hdr.first && hdr.last) {
            ctx.stats.datagrams_dropped += 1;
            return;
        }
        if self.reliable && matches!(hdr.kind, PacketKind::Send | PacketKind::Write) && self.taken_before(hdr)
        {
            // A retransmission of what was taken (its ACK was lost): answer it again.
            ctx.stats.duplicates += 1;
            return self.datagram_reply(ctx, hdr, Syndrome::Ack);
        }
        match hdr.kind {
            PacketKind::Send => {}
            PacketKind::Write | PacketKind::ReadRequest => return self.on_datagram_memory(ctx, hdr, payload),
            PacketKind::ReadResponse => return self.on_datagram_read_response(ctx, hdr, payload),
            _ => {
                ctx.stats.datagrams_dropped += 1;
                return;
            }
        }
        let recv = match self.fetch_rq() {
            None if self.reliable => {
                ctx.stats.rnr_naks_sent += 1;
                return self.datagram_reply(ctx, hdr, Syndrome::RnrNak(self.min_rnr));
            }
            None => {
                ctx.stats.datagrams_dropped += 1;
                return;
            }
            Some(Ok(w)) if w.op == WqeOp::Recv && u32::from(w.nsge) <= self.shared.config.max_recv_sge => w,
            Some(_) => {
                self.recv_cqe(self.rq_fetch, Status::LocalQueueOperation, CqOpcode::Recv, 0, None, false);
                self.rq_fetch = self.rq_fetch.wrapping_add(1);
                self.enter_error(ctx);
                return;
            }
        };
        let from = (hdr.src_nic, hdr.src_qpn);
        let len = payload.len() as u64;
        if len > recv.len {
            self.recv_cqe_from(self.rq_fetch, Status::LocalLength, CqOpcode::Recv, 0, None, false, from);
            self.rq_fetch = self.rq_fetch.wrapping_add(1);
            ctx.stats.datagrams_dropped += 1;
            if self.reliable {
                self.datagram_reply(ctx, hdr, Syndrome::NakInvalidRequest);
            }
            return;
        }
        let mut segs = [(std::ptr::null_mut::<u8>(), 0usize); MAX_SGE];
        match ctx.resolve_span(&self.shared.rq, &recv, 0, len, Access::LOCAL_WRITE, &mut segs) {
            Ok(n) => scatter(&segs[..n], payload),
            Err(_) => {
                // The receive's memory is not the queue's to write: a local error, as on RC.
                self.recv_cqe_from(
                    self.rq_fetch,
                    Status::LocalProtection,
                    CqOpcode::Recv,
                    0,
                    None,
                    false,
                    from,
                );
                self.rq_fetch = self.rq_fetch.wrapping_add(1);
                self.enter_error(ctx);
                return;
            }
        }
        let imm = hdr.has_imm.then_some(hdr.imm);
        self.recv_cqe_from(
            self.rq_fetch,
            Status::Success,
            CqOpcode::Recv,
            len as u32,
            imm,
            hdr.solicited,
            from,
        );
        self.rq_fetch = self.rq_fetch.wrapping_add(1);
        if self.reliable {
            self.take(ctx, hdr);
        }
    }
}

/// The destination an address handle names (for the driver).
pub(crate) fn dest(wire: std::sync::Arc<dyn crate::wire::Wire>, nic: u32, qpn: u32) -> Remote {
    Remote { wire, nic, qpn }
}
