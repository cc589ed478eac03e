//! The unreliable datagram service (UB's UM, "unreliable message"; verbs' UD) of a queue.
//!
//! A datagram queue is connected to no one. Each send WQE names its destination: an address
//! handle (an index into the queue's [`QpCtx::dests`], which the driver fills when the user
//! imports a target) and the target queue's number. What hardware does, and what this models:
//!
//! - **One packet per message.** A message longer than the MTU fails with `LocalLength` before
//!   anything is sent (verbs UD; UDMA's UM likewise limits a message to one packet).
//! - **No acknowledgement, no retry.** The send completes (`Success`) once the packet is on the
//!   wire: a packet the wire loses is lost, and the sender never knows. No PSN is checked by
//!   the receiver; the packet carries the queue's next PSN for captures only.
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

use super::{gather, scatter, QpCtx, Remote};
use crate::device::Ctx;
use crate::layout::{WqeOp, MAX_SGE, WQE_HEADER};
use crate::packet::{psn_add, PacketHeader, PacketKind};
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
        let wqe = match self.fetch_sq(idx) {
            Ok(w) if matches!(w.op, WqeOp::Send | WqeOp::SendImm) => w,
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
        // The WQE's remote-key field holds the address handle, its remote address the target
        // queue (a SEND uses neither).
        let Some(remote) = self.dests.get(wqe.rkey as usize) else {
            self.fail_unfetched(ctx, idx, wqe.op, Status::LocalQueueOperation);
            return true;
        };
        let hdr = PacketHeader {
            src_nic: ctx.nic,
            dst_nic: remote.nic,
            src_qpn: self.shared.qpn,
            dst_qpn: wqe.remote_addr as u32,
            kind: PacketKind::Send,
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
        let result = if wqe.len == 0 {
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
        match result {
            Transmit::Busy => {
                // A full wire holds the packet back (a NIC does not drop its own send queue).
                self.wire_blocked = true;
                ctx.stats.tx_wire_busy += 1;
                return false;
            }
            Transmit::Sent => ctx.stats.tx_packets += 1,
            Transmit::Dropped => ctx.stats.tx_dropped += 1,
        }
        if !self.pending_flush {
            self.pending_flush = true;
            ctx.to_flush.push(self.shared.qpn);
        }
        self.next_psn = psn_add(self.next_psn, 1);
        self.send_psn = self.next_psn;
        self.sent_high = self.next_psn;
        self.sq_fetch = idx.wrapping_add(1);
        self.send_cqe(&wqe, wqe.len, Status::Success);
        true
    }

    /// A datagram arrived for this (datagram) queue.
    pub(crate) fn on_datagram(&mut self, ctx: &mut Ctx<'_>, hdr: &PacketHeader, payload: Payload<'_>) {
        if self.state != QueueState::Ready || hdr.kind != PacketKind::Send || !(hdr.first && hdr.last) {
            ctx.stats.datagrams_dropped += 1;
            return;
        }
        let recv = match self.fetch_rq() {
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
    }
}

/// The destination an address handle names (for the driver).
pub(crate) fn dest(wire: std::sync::Arc<dyn crate::wire::Wire>, nic: u32, qpn: u32) -> Remote {
    Remote { wire, nic, qpn }
}
