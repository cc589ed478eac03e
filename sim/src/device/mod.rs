//! The device: the "hardware" half of a simulated NIC.
//!
//! It owns the key table, the per-queue transport contexts and the transmit queue for responses
//! (ACKs, NAKs, READ responses). Its work comes in four kinds of [`Unit`]: handle one inbound
//! packet, transmit one queued response, advance one queue's send side (fetch a WQE or send a
//! segment, or flush while in ERROR), and fire one queue's timer. The engines decide who runs
//! units and in which order: all of them on the caller's thread (Inline), on a device thread
//! (Threaded), or one at a time in a seeded random order (Stepped).
//!
//! Everything here runs under the NIC's device lock.

#[cfg(all(test, not(loom)))]
mod datagram_tests;
pub(crate) mod keys;
pub(crate) mod qp;
mod read_res;
#[cfg(all(test, not(loom)))]
mod reliable_datagram_tests;
#[cfg(all(test, not(loom)))]
mod source_tests;
#[cfg(all(test, not(loom)))]
mod transport_tests;

use crate::clock::{Nanos, NEVER};
use crate::events::AsyncEvents;
use crate::layout::Wqe;
use crate::packet::{PacketHeader, PacketKind, Syndrome};
use crate::ring::WorkRing;
use crate::source::{Life, Payload, PayloadRef};
use crate::wire::{Port, Transmit, WirePort, BY_REF_MIN};
use bypass_hal::trace::{self, Track};
use bypass_hal::{Access, DeviceCaps};
use keys::{KeyFault, KeyTable};
use qp::QpCtx;
use std::collections::VecDeque;
use std::sync::Arc;

/// Counters a NIC keeps (read them with `SimNic::stats`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NicStats {
    /// Request packets put on the wire (first sends and retransmissions).
    pub tx_packets: u64,
    /// Packets the wire dropped.
    pub tx_dropped: u64,
    /// Response packets (ACK, NAK, READ response) put on the wire.
    pub tx_responses: u64,
    /// Packets received and handled.
    pub rx_packets: u64,
    /// Packets received for an unknown, unconnected or foreign queue (dropped).
    pub rx_ignored: u64,
    /// Request segments sent again.
    pub retransmits: u64,
    /// Retransmission timeouts.
    pub timeouts: u64,
    /// Duplicate requests received.
    pub duplicates: u64,
    /// RNR NAKs sent (a SEND found no receive posted).
    pub rnr_naks_sent: u64,
    /// RNR NAKs received.
    pub rnr_naks_received: u64,
    /// Sequence-error NAKs received.
    pub seq_naks_received: u64,
    /// Queues that entered ERROR.
    pub queue_errors: u64,
    /// ACKs, NAKs and READ responses for PSNs that are not outstanding (from before a reset, or
    /// duplicated), dropped.
    pub stale_responses: u64,
    /// Duplicate READ requests for a READ the responder no longer has a resource for (older
    /// than its last `max_dest_rd_atomic` READs, or asking for another range), dropped.
    pub duplicate_reads_dropped: u64,
    /// READ responses that did not fit the request (a READ response for a SEND or WRITE, wrong
    /// FIRST/LAST flags, a wrong segment length): the request failed with `BadResponse`.
    pub bad_responses: u64,
    /// Gaps in READ (or atomic) responses — a response past one not yet received — after which
    /// the requester asked again at once from the first missing response (once per gap).
    pub read_gaps: u64,
    /// Byte wires: datagrams or frames that were not valid RoCEv2 packets (short, bad ICRC,
    /// unknown opcode, bad lengths), dropped before reaching any queue.
    pub rx_malformed: u64,
    /// Byte wires: packets the socket would not take (full buffer), lost as on a network.
    pub tx_wire_dropped: u64,
    /// Packets a full wire refused (`Transmit::Busy`: a full inbox or shared-memory ring), sent
    /// again once the receiver made room.
    pub tx_wire_busy: u64,
    /// Shared-memory wire: `FUTEX_WAKE`s this NIC issued because a receiving NIC's thread had said
    /// it sleeps (the only system call on that wire's send path).
    pub tx_wakeups: u64,
    /// UDP wire: `sendmmsg` calls that put this NIC's datagrams on the wire (each takes a batch;
    /// plain ACKs held back for the next packet ride in its call).
    pub tx_wire_sends: u64,
    /// Datagrams (UM) a datagram queue dropped: no receive posted, a receive too short, the
    /// queue not READY, or not a single-packet SEND. Never retried: the sender does not know.
    pub datagrams_dropped: u64,
    /// In-process wire: packets lost because the sender's memory their payload was left in (they
    /// travel by reference) was deregistered while they waited in this NIC's inbox.
    pub rx_source_gone: u64,
    /// In-process wire: READ response packets placed as part of a run of several (consecutive
    /// segments of one READ whose payloads lie back to back in one registration of the sender),
    /// with one key check and one copy for the run instead of one per packet. Counted in
    /// `rx_packets` too.
    pub rx_run_packets: u64,
}

/// Most READ response packets the device places as one run (`DeviceState::rx_one`): 64
/// segments of a 4096-byte MTU are a 256 KiB READ, the stack's largest rendezvous chunk.
pub(crate) const RX_RUN_MAX: usize = 64;

/// Most READ response packets `DeviceState::tx_one` sends in one go (the segments of one READ
/// queued back to back, their source range checked once).
const TX_BURST_MAX: usize = 64;

/// Whether `next` may follow `prev` in a run of READ response packets: the next segment of the
/// same READ (same queues, the next PSN, neither the end of the READ nor a new one), after a
/// full-MTU segment.
fn joins_read_run(prev: &PacketHeader, next: &PacketHeader, mtu: u32) -> bool {
    prev.kind == PacketKind::ReadResponse
        && next.kind == PacketKind::ReadResponse
        && !prev.datagram
        && !next.datagram
        && (next.src_nic, next.dst_nic, next.src_qpn, next.dst_qpn)
            == (prev.src_nic, prev.dst_nic, prev.src_qpn, prev.dst_qpn)
        && next.psn == crate::packet::psn_add(prev.psn, 1)
        && !prev.last
        && !next.first
        && prev.payload_len == mtu
}

/// Drains of a wire port one device run makes at most before it returns to flush what it sent
/// (`DeviceState::run_all`): a port drains a batch at a time (the UDP wire 32 datagrams).
pub(crate) const MAX_PORT_DRAINS: u32 = 4;

/// A queued response packet. Its addresses are filled in from the queue when it is sent.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TxDesc {
    pub qpn: u32,
    pub hdr: PacketHeader,
    /// READ response: the (rkey, address) its payload comes from.
    pub read_from: Option<(u32, u64)>,
    /// A plain ACK into which later ones were merged (it acknowledges several messages).
    pub merged: bool,
}

/// One unit of device work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unit {
    /// Handle the oldest inbound packet.
    Rx,
    /// Transmit the oldest queued response.
    Tx,
    /// Send-side step of a queue.
    Send(u32),
    /// Retransmission timer of a queue.
    Timer(u32),
    /// Release of the NIC's delayed packets that are due (the fault plan's delay; run by the
    /// NIC, not the device state: `Nic::run_unit`).
    Delayed,
}

/// What a queue method needs from the rest of the device.
pub(crate) struct Ctx<'a> {
    pub keys: &'a KeyTable,
    pub outbox: &'a mut VecDeque<TxDesc>,
    pub stats: &'a mut NicStats,
    pub caps: &'a DeviceCaps,
    /// Queues that transmitted since the wires were last flushed.
    pub to_flush: &'a mut Vec<u32>,
    pub nic: u32,
    pub mtu: u32,
    pub now: Nanos,
    /// The NIC's asynchronous events.
    pub events: &'a AsyncEvents,
    /// Datagram service: the wire back to each source id the NIC reached (for READ responses).
    pub routes: &'a std::collections::HashMap<u32, qp::Remote>,
}

impl<'a> Ctx<'a> {
    /// Queues an ACK or NAK, merging a plain ACK into a plain ACK of the same queue queued last.
    pub(crate) fn push_ack(&mut self, qpn: u32, syndrome: Syndrome, psn: u32) {
        if syndrome == Syndrome::Ack {
            if let Some(last) = self.outbox.back_mut() {
                if last.qpn == qpn && last.hdr.kind == PacketKind::Ack && last.hdr.syndrome == Syndrome::Ack {
                    last.hdr.psn = psn;
                    last.merged = true;
                    return;
                }
            }
        }
        self.outbox.push_back(TxDesc {
            qpn,
            hdr: PacketHeader { kind: PacketKind::Ack, syndrome, psn, ..Default::default() },
            read_from: None,
            merged: false,
        });
    }

    /// Translates bytes `off..off+len` of the message of `wqe` (whose SGEs are in `ring`) into
    /// host ranges. Returns how many entries of `out` were filled.
    pub(crate) fn resolve_span(
        &self,
        ring: &WorkRing,
        wqe: &Wqe,
        off: u64,
        len: u64,
        need: Access,
        out: &mut [(*mut u8, usize)],
    ) -> Result<usize, KeyFault> {
        self.resolve_span_live(ring, wqe, off, len, need, out, &mut None)
    }

    /// [`resolve_span`](Self::resolve_span), also setting `life` to the liveness of the last
    /// range's registration (the only one when a single range is returned).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn resolve_span_live(
        &self,
        ring: &WorkRing,
        wqe: &Wqe,
        mut off: u64,
        len: u64,
        need: Access,
        out: &mut [(*mut u8, usize)],
        life: &mut Option<&'a Arc<Life>>,
    ) -> Result<usize, KeyFault> {
        let keys: &'a KeyTable = self.keys;
        let mut left = len;
        let mut n = 0;
        for i in 0..usize::from(wqe.nsge) {
            if left == 0 {
                break;
            }
            // SAFETY: the WQE is fetched and not complete, so the driver leaves its slot alone.
            let s = wqe.sge(i, |i| unsafe { ring.sge(wqe.index, i) });
            let slen = u64::from(s.len);
            if off >= slen {
                off -= slen;
                continue;
            }
            let take = (slen - off).min(left);
            let (p, l) = keys.resolve_live(s.lkey, s.addr + off, take, need)?;
            *life = Some(l);
            out[n] = (p, take as usize);
            n += 1;
            left -= take;
            off = 0;
        }
        if left > 0 {
            return Err(KeyFault::OutOfBounds);
        }
        Ok(n)
    }
}

/// Records a packet's time on the wire: from when it went into the receiver's inbox (`sent_at`,
/// 0 if that was before recording started) until now, when the receiving device takes it.
#[cold]
fn trace_flight(hdr: &PacketHeader, sent_at: u64) {
    if sent_at != 0 {
        trace::async_span(
            Track::Wire { from: hdr.src_nic, to: hdr.dst_nic },
            hdr.name(),
            sent_at,
            &[
                ("psn", hdr.psn.into()),
                ("len", hdr.payload_len.into()),
                ("src_qpn", hdr.src_qpn.into()),
                ("dst_qpn", hdr.dst_qpn.into()),
            ],
        );
    }
}

/// Most queues open at once per NIC: a queue number's low [`SLOT_BITS`] bits name its slot in
/// the queue table and the doorbell bitmap.
pub(crate) const MAX_QUEUES: usize = 1 << SLOT_BITS;

/// Queue numbers are 24 bits, as on the wire (the BTH's destination QP): the low `SLOT_BITS`
/// name a slot of the queue table, the upper 8 a generation of that slot, bumped each time the
/// slot is given to a new queue. A number therefore comes back only after its slot was reused 256
/// times, and a packet, doorbell, queued response or CQE for a destroyed queue whose slot now
/// holds another queue carries the old generation and is dropped (as a NIC drops packets for a
/// queue number that is not in use). Slots 0 and 1 are never used: queue numbers 0 and 1 are
/// InfiniBand's management queues (QP0, QP1).
pub(crate) const SLOT_BITS: u32 = 16;

/// The queue-table slot of queue number `qpn`.
#[inline]
pub(crate) const fn slot_of(qpn: u32) -> usize {
    (qpn & ((1 << SLOT_BITS) - 1)) as usize
}

/// The queue in `qps` numbered `qpn`: the occupant of its slot, if its number (generation
/// included) is `qpn`.
#[inline]
fn find(qps: &mut [Option<Box<QpCtx>>], qpn: u32) -> Option<&mut QpCtx> {
    qps.get_mut(slot_of(qpn))?.as_deref_mut().filter(|q| q.shared.qpn == qpn)
}

/// Read-only [`find`].
#[inline]
fn find_ref(qps: &[Option<Box<QpCtx>>], qpn: u32) -> Option<&QpCtx> {
    qps.get(slot_of(qpn))?.as_deref().filter(|q| q.shared.qpn == qpn)
}

/// What a queue-table slot remembers of the queues it held.
#[derive(Debug, Clone, Copy, Default)]
struct SlotLife {
    /// The generation the slot's next queue gets (upper bits of its number).
    generation: u8,
    /// The first CQE epoch of the slot's next queue: past every epoch of the queues it held, so
    /// that a CQE of a destroyed queue is never taken for one of a later queue with the same
    /// number (after 256 reuses of the slot).
    next_epoch: u32,
}

/// A queue number given out by [`DeviceState::alloc_queue`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct NewQueue {
    pub qpn: u32,
    /// The queue's first CQE epoch.
    pub epoch: u32,
}

/// The doorbell list: one bit per queue, set by the driver after it rings a queue's doorbell and
/// taken by the device, so a device pass visits the queues that have something to do rather than
/// every queue of the NIC (real NICs keep a doorbell FIFO for the same reason).
#[derive(Debug)]
pub(crate) struct Bells {
    words: Box<[crate::sync::AtomicU64]>,
}

impl Bells {
    pub(crate) fn new() -> Self {
        Bells { words: (0..MAX_QUEUES / 64).map(|_| crate::sync::AtomicU64::new(0)).collect() }
    }

    /// Driver side: queue `qpn` has new work queue entries (after its doorbell was rung). The
    /// bell is its slot's: a bell a destroyed queue rang only makes the device look at the slot's
    /// next queue, which finds nothing to do unless it has work of its own.
    #[inline]
    pub(crate) fn ring(&self, qpn: u32) {
        let slot = slot_of(qpn);
        let (w, b) = (slot / 64, slot % 64);
        self.words[w].fetch_or(1 << b, crate::sync::Ordering::Release);
    }

    /// Device side: calls `f` for every slot below `queues` whose bell rang, clearing them.
    fn drain(&self, queues: usize, mut f: impl FnMut(u32)) {
        for (w, word) in self.words.iter().take(queues.div_ceil(64)).enumerate() {
            if word.load(crate::sync::Ordering::Relaxed) == 0 {
                continue;
            }
            let mut bits = word.swap(0, crate::sync::Ordering::Acquire);
            while bits != 0 {
                let b = bits.trailing_zeros();
                bits &= bits - 1;
                f((w * 64) as u32 + b);
            }
        }
    }
}

/// The device state of one NIC.
#[derive(Debug)]
pub(crate) struct DeviceState {
    pub keys: KeyTable,
    /// The queue table, indexed by [`slot_of`] a queue number.
    pub qps: Vec<Option<Box<QpCtx>>>,
    /// Per slot of `qps`: what the next queue in it gets.
    lives: Vec<SlotLife>,
    /// Slots of destroyed queues, reused oldest first (so a number's slot rests as long as
    /// possible before its next generation).
    free: VecDeque<u32>,
    /// Queues (by number) that may have send work or a timer: the only ones a device pass visits.
    active: Vec<u32>,
    pub outbox: VecDeque<TxDesc>,
    pub outbox_blocked: bool,
    /// The outbox holds plain ACKs a device pass held back for the next pass (`run_all`'s
    /// `hold`): they leave with whatever that pass sends, at `ack_release` at the latest.
    pub acks_held: bool,
    /// When held ACKs must leave ([`NEVER`] while none is held): one of the NIC's timers.
    ack_release: Nanos,
    pub stats: NicStats,
    to_flush: Vec<u32>,
    pub caps: DeviceCaps,
    pub addr: u32,
    pub mtu: u32,
    pub events: Arc<AsyncEvents>,
    /// Shared receive queues created and not yet dropped (at most `caps.max_shared_recv`).
    pub shared_recvs: u32,
    /// Datagram service: a wire to each NIC (by source id) this NIC reached with `reach` or
    /// `add_dest`, so a datagram queue can answer a READ from it.
    pub routes: std::collections::HashMap<u32, qp::Remote>,
}

// SAFETY: the raw pointers in the key table point into registrations whose memory is freed only
// after they are removed from the table under the device lock; the state is only used under that
// lock, from whichever thread holds it.
unsafe impl Send for DeviceState {}

impl DeviceState {
    pub(crate) fn new(addr: u32, mtu: u32, caps: DeviceCaps, events: Arc<AsyncEvents>) -> Self {
        DeviceState {
            keys: KeyTable::default(),
            // Queue numbers 0 and 1 are InfiniBand's management queues (QP0, QP1): a RoCE
            // dissector or NIC treats packets to them as management traffic, so slots 0 and 1 are
            // never used and data queues start at 2.
            qps: vec![None, None],
            lives: vec![SlotLife::default(); 2],
            free: VecDeque::new(),
            active: Vec::with_capacity(64),
            outbox: VecDeque::with_capacity(1024),
            outbox_blocked: false,
            acks_held: false,
            ack_release: NEVER,
            stats: NicStats::default(),
            to_flush: Vec::with_capacity(64),
            shared_recvs: 0,
            routes: std::collections::HashMap::new(),
            caps,
            addr,
            mtu,
            events,
        }
    }

    /// Takes a slot for a new queue: the oldest freed one, else a new one. `None` when all
    /// [`MAX_QUEUES`] slots hold queues. The caller puts the queue in with [`Self::install`]
    /// before it releases the device lock.
    pub(crate) fn alloc_queue(&mut self) -> Option<NewQueue> {
        let slot = match self.free.pop_front() {
            Some(s) => s as usize,
            None if self.qps.len() < MAX_QUEUES => {
                self.qps.push(None);
                self.lives.push(SlotLife::default());
                self.qps.len() - 1
            }
            None => return None,
        };
        let life = self.lives[slot];
        Some(NewQueue { qpn: u32::from(life.generation) << SLOT_BITS | slot as u32, epoch: life.next_epoch })
    }

    /// Puts a queue whose number [`Self::alloc_queue`] gave into its slot.
    pub(crate) fn install(&mut self, qp: Box<QpCtx>) {
        let slot = slot_of(qp.shared.qpn);
        debug_assert!(self.qps[slot].is_none(), "slot {slot} was given out twice");
        self.qps[slot] = Some(qp);
    }

    /// Removes queue `qpn` (a queue being destroyed) and frees its slot for a later queue, with
    /// the next generation. Returns the queue's context, `None` if there is no such queue.
    pub(crate) fn remove(&mut self, qpn: u32) -> Option<Box<QpCtx>> {
        let slot = slot_of(qpn);
        find(&mut self.qps, qpn)?;
        let qp = self.qps[slot].take()?;
        let life = &mut self.lives[slot];
        life.generation = life.generation.wrapping_add(1);
        life.next_epoch = qp.shared.epoch.load(crate::sync::Ordering::Acquire).wrapping_add(1);
        self.free.push_back(slot as u32);
        Some(qp)
    }

    fn split(&mut self, now: Nanos) -> (&mut Vec<Option<Box<QpCtx>>>, Ctx<'_>) {
        let DeviceState { keys, qps, outbox, stats, to_flush, caps, addr, mtu, events, routes, .. } = self;
        (qps, Ctx { keys, outbox, stats, caps, to_flush, nic: *addr, mtu: *mtu, now, events, routes })
    }

    /// The NIC died (`Fabric::kill_nic`): nothing queued to send leaves, and every queue enters
    /// ERROR with its outstanding work flushed.
    pub(crate) fn fail_all(&mut self, now: Nanos) {
        self.outbox.clear();
        let (qps, mut ctx) = self.split(now);
        for qp in qps.iter_mut().flatten() {
            qp.enter_error(&mut ctx);
            qp.take_cq_overflow(&mut ctx);
        }
        let qpns: Vec<u32> = self.qps.iter().flatten().map(|qp| qp.shared.qpn).collect();
        for qpn in qpns {
            self.list(qpn);
        }
    }

    /// Runs `f` on queue `qpn` with a context, if the queue exists.
    pub(crate) fn with_qp<R>(
        &mut self,
        qpn: u32,
        now: Nanos,
        f: impl FnOnce(&mut QpCtx, &mut Ctx<'_>) -> R,
    ) -> Option<R> {
        let (qps, mut ctx) = self.split(now);
        let qp = find(qps, qpn)?;
        let r = f(qp, &mut ctx);
        qp.take_cq_overflow(&mut ctx);
        Some(r)
    }

    /// Flushes the wire of every queue that transmitted since the last call (one notification
    /// per burst). `eager`: this NIC's user is about to sleep, so receivers must not wait for it.
    pub(crate) fn flush_wires(&mut self, eager: bool) {
        while let Some(qpn) = self.to_flush.pop() {
            if let Some(qp) = find(&mut self.qps, qpn) {
                qp.pending_flush = false;
                let read = std::mem::take(&mut qp.flush_eager);
                if let Some(r) = &qp.remote {
                    r.wire.flush(eager || read);
                }
                for d in &qp.dests {
                    d.wire.flush(eager);
                }
            }
        }
    }

    /// Puts queue `qpn` on the active list (if it exists and is not on it already).
    pub(crate) fn list(&mut self, qpn: u32) {
        if let Some(qp) = find(&mut self.qps, qpn) {
            if !qp.listed {
                qp.listed = true;
                self.active.push(qpn);
            }
        }
    }

    /// Lists every queue whose doorbell rang since the last call.
    pub(crate) fn take_bells(&mut self, bells: &Bells) {
        let DeviceState { qps, active, .. } = self;
        bells.drain(qps.len(), |slot| {
            if let Some(qp) = qps[slot as usize].as_deref_mut() {
                if !qp.listed {
                    qp.listed = true;
                    active.push(qp.shared.qpn);
                }
            }
        });
    }

    /// Drops from the active list the queues with nothing left to do and no timer running.
    fn prune(&mut self, now: Nanos) {
        let mut i = 0;
        while i < self.active.len() {
            let qpn = self.active[i];
            // A number whose queue was destroyed (its slot empty or reused) finds nothing.
            let keep = match find(&mut self.qps, qpn) {
                Some(qp) if qp.has_send_work(now) || qp.deadline() != NEVER => true,
                Some(qp) => {
                    qp.listed = false;
                    false
                }
                None => false,
            };
            if keep {
                i += 1;
            } else {
                self.active.swap_remove(i);
            }
        }
    }

    /// Called when a wire that was full has room again (rare: visits every queue).
    pub(crate) fn unblock(&mut self) {
        self.outbox_blocked = false;
        for i in 0..self.qps.len() {
            let Some(qp) = self.qps[i].as_deref_mut() else { continue };
            if std::mem::take(&mut qp.wire_blocked) {
                let qpn = qp.shared.qpn;
                self.list(qpn);
            }
        }
    }

    /// Appends every unit that is ready now to `out`, tagged with `tag`.
    pub(crate) fn ready_units(
        &mut self,
        bells: &Bells,
        inbox_has: bool,
        now: Nanos,
        tag: usize,
        out: &mut Vec<(usize, Unit)>,
    ) {
        self.take_bells(bells);
        self.prune(now);
        if inbox_has {
            out.push((tag, Unit::Rx));
        }
        if !self.outbox.is_empty() && !self.outbox_blocked {
            out.push((tag, Unit::Tx));
        }
        for qp in self.active.iter().filter_map(|&q| find_ref(&self.qps, q)) {
            if qp.has_send_work(now) {
                out.push((tag, Unit::Send(qp.shared.qpn)));
            }
            if qp.timer_due(now) {
                out.push((tag, Unit::Timer(qp.shared.qpn)));
            }
        }
    }

    /// The earliest timer deadline of any queue (a queue with a timer stays on the active list)
    /// and of held ACKs.
    pub(crate) fn deadline(&self) -> Nanos {
        self.active
            .iter()
            .filter_map(|&q| find_ref(&self.qps, q))
            .map(|q| q.deadline())
            .min()
            .unwrap_or(NEVER)
            .min(self.ack_release)
    }

    /// Whether the outbox holds one plain ACK of one message (no NAK, no READ or atomic
    /// response, not several messages' ACKs merged: a burst of requests is not a request
    /// waiting for its response, and its sender may be waiting for the ACK to send more) whose
    /// wire lets it wait ([`Wire::holds_acks`](crate::wire::Wire::holds_acks): the peer is not
    /// about to sleep).
    fn only_holdable_acks(&self) -> bool {
        if self.outbox.len() != 1 || self.outbox_blocked {
            return false;
        }
        let d = &self.outbox[0];
        d.hdr.kind == PacketKind::Ack
            && d.hdr.syndrome == Syndrome::Ack
            && !d.merged
            && d.read_from.is_none()
            && find_ref(&self.qps, d.qpn)
                .and_then(|qp| qp.remote.as_ref())
                .is_some_and(|r| r.wire.holds_acks())
    }

    /// Sends the queued responses, held ACKs included (the caller flushes the wires).
    pub(crate) fn send_responses(&mut self) {
        while self.tx_one() {}
        self.acks_held = false;
        self.ack_release = NEVER;
    }

    /// After `acks_held` was published: whether a held ACK's peer has become sleepy meanwhile
    /// (then the caller sends them now, `send_responses`).
    pub(crate) fn held_acks_wanted(&self) -> bool {
        self.acks_held && !self.only_holdable_acks()
    }

    /// Runs one unit. Returns whether it did anything. `port` is this NIC's receive port;
    /// `kick_waiter` is called (after the inbox lock is released) for a NIC that waited for room.
    pub(crate) fn run_unit(
        &mut self,
        unit: Unit,
        now: Nanos,
        port: &Port,
        kick_waiter: &mut dyn FnMut(u32),
    ) -> bool {
        match unit {
            Unit::Rx => self.rx_one(now, port, kick_waiter),
            Unit::Tx => self.tx_one(),
            Unit::Send(qpn) => self.with_qp(qpn, now, |qp, ctx| qp.send_step(ctx)).unwrap_or(false),
            Unit::Timer(qpn) => self
                .with_qp(qpn, now, |qp, ctx| {
                    let due = qp.timer_due(ctx.now);
                    if due {
                        qp.on_timer(ctx);
                    }
                    due
                })
                .unwrap_or(false),
            Unit::Delayed => false,
        }
    }

    /// Runs every ready unit until none is left (the Inline and Threaded engines). `port` is
    /// this NIC's inbox; `rx`, its wire port if the device takes packets from it in place.
    /// Returns true if it stopped with packets still waiting at `rx` after
    /// [`MAX_PORT_DRAINS`] drains: the caller flushes what the run sent (the ACKs of what it
    /// read) and runs again, so a flood at the port cannot keep a run, and its ACKs, going
    /// for ever.
    ///
    /// `hold` > 0 lets a pass that started with no ACK held keep plain ACKs back for at most
    /// `hold` ns, when they are all it would send (`acks_held`): in a request–response exchange
    /// the next pass is the one that sends the response, and the ACK leaves in the same burst
    /// (docs/sim.md, "Response queue and ACK coalescing"). Any later pass sends them.
    pub(crate) fn run_all(
        &mut self,
        now: Nanos,
        port: &Port,
        rx: Option<&dyn WirePort>,
        bells: &Bells,
        hold: Nanos,
        kick_waiter: &mut dyn FnMut(u32),
    ) -> bool {
        let mut drains = 0;
        let held_before = self.acks_held;
        loop {
            self.take_bells(bells);
            while self.rx_one(now, port, kick_waiter) {}
            if let Some(rx) = rx.filter(|p| p.pending()) {
                drains += 1;
                // Packets are read in place where the wire left them (the shared-memory rings):
                // no copy through the inbox.
                let nic = self.addr;
                rx.drain(nic, &mut |hdr, payload| {
                    self.receive(now, hdr, payload.into());
                });
            }
            // Send work only grows from doorbells and received packets (ACKs open the window,
            // NAKs rewind), so after this sweep a queue has more only if it hit the per-round bound.
            let mut bounded = false;
            let mut k = 0;
            while k < self.active.len() {
                let i = self.active[k];
                k += 1;
                // Bounded per round so one busy queue cannot starve the others' packets.
                let mut steps = 0;
                while steps < 64 {
                    let stepped = self.with_qp(i, now, |qp, ctx| {
                        let mut did = false;
                        if qp.timer_due(ctx.now) {
                            qp.on_timer(ctx);
                            did = true;
                        }
                        qp.send_step(ctx) || did
                    });
                    if stepped != Some(true) {
                        break;
                    }
                    steps += 1;
                }
                bounded |= steps == 64;
            }
            if hold > 0 && !held_before && self.only_holdable_acks() {
                if !self.acks_held {
                    self.acks_held = true;
                    self.ack_release = now.saturating_add(hold);
                }
            } else if self.acks_held || !self.outbox.is_empty() {
                self.send_responses();
            }
            self.prune(now);
            // Go round again only if packets arrived meanwhile (from a NIC run nested in our
            // flushes, or another thread) or a queue was cut short.
            let rx_pending = rx.is_some_and(|p| p.pending());
            if rx_pending && drains >= MAX_PORT_DRAINS {
                return true;
            }
            if !bounded && !port.maybe_nonempty() && !rx_pending {
                return false;
            }
        }
    }

    /// Takes the oldest inbound packet, if any, or a run of READ response packets that it
    /// starts ([`RX_RUN_MAX`]); kicks the NICs that waited for room if one marked a slot.
    fn rx_one(&mut self, now: Nanos, port: &Port, kick_waiter: &mut dyn FnMut(u32)) -> bool {
        if !port.maybe_nonempty() {
            return false;
        }
        // A trace records every packet's flight: no runs then.
        let tracing = trace::is_enabled();
        let max = if tracing { 1 } else { RX_RUN_MAX };
        let mtu = self.mtu;
        // SAFETY: the caller holds this NIC's device lock (`&mut self` is its state), so this
        // thread is the inbox's only consumer.
        let took = unsafe {
            port.inbox.with_front_run(
                max,
                |prev, next| joins_read_run(prev, next, mtu),
                |hdr, last, n, payload, sent_at| {
                    if tracing {
                        trace_flight(hdr, sent_at);
                    }
                    match payload {
                        Some(run) if n > 1 && self.receive_read_run(now, hdr, last, n, run) => n,
                        // One packet: the run's first.
                        Some(run) => {
                            self.receive(now, hdr, run.prefix(hdr.payload_len as usize));
                            1
                        }
                        // Its payload was left in the sender's memory, which is gone: lost on the
                        // wire (the sender's retransmission meets the missing registration).
                        None => {
                            self.stats.rx_source_gone += 1;
                            1
                        }
                    }
                },
            )
        };
        let Some(n) = took else { return false };
        for _ in 0..n {
            // SAFETY: as above; `with_front_run` found `n` packets from the head.
            unsafe { port.inbox.pop(kick_waiter) };
        }
        true
    }

    /// Handles `n` > 1 READ response packets from `first` to `last` whose payloads are `run`,
    /// back to back, all at once — if they are exactly the segments the front READ of their
    /// queue expects next (in window, in order, full MTU but the last, the right FIRST and LAST
    /// flags) and land in memory the READ may write, not overlapping their source. Then the
    /// result is the one `n` calls of [`receive`](Self::receive) would have had, with one key
    /// check and one copy; otherwise it does nothing and returns false (the caller handles the
    /// first packet alone, and the rest as they come).
    fn receive_read_run(
        &mut self,
        now: Nanos,
        first: &PacketHeader,
        last: &PacketHeader,
        n: usize,
        run: Payload<'_>,
    ) -> bool {
        let handled = self.with_qp(first.dst_qpn, now, |qp, ctx| {
            let from_peer = qp.remote.as_ref().is_some_and(|r| {
                r.nic == first.src_nic && (first.src_qpn == crate::packet::ANY_QPN || r.qpn == first.src_qpn)
            });
            !qp.datagram
                && !first.datagram
                && from_peer
                && qp.on_read_run(ctx, first, last.last, n as u32, run)
        });
        if handled != Some(true) {
            return false;
        }
        self.stats.rx_packets += n as u64;
        self.stats.rx_run_packets += n as u64;
        self.list(first.dst_qpn);
        true
    }

    /// Handles one inbound packet, wherever it was received (the inbox, or a byte wire's ring
    /// read in place): hands it to its queue if the queue is connected to the packet's sender,
    /// else counts it as ignored (also a packet for a destroyed queue whose slot holds a newer
    /// queue: its number's generation differs).
    pub(crate) fn receive(&mut self, now: Nanos, hdr: &PacketHeader, payload: Payload<'_>) {
        self.stats.rx_packets += 1;
        let handled = self.with_qp(hdr.dst_qpn, now, |qp, ctx| {
            if qp.datagram || hdr.datagram {
                // A datagram queue takes datagrams from anyone (and nothing else); a connected
                // queue takes no datagram.
                if qp.datagram && hdr.datagram {
                    qp.on_datagram(ctx, hdr, payload);
                    return true;
                }
                return false;
            }
            let from_peer = qp.remote.as_ref().is_some_and(|r| {
                r.nic == hdr.src_nic && (hdr.src_qpn == crate::packet::ANY_QPN || r.qpn == hdr.src_qpn)
            });
            if !from_peer {
                return false;
            }
            match hdr.kind {
                PacketKind::Ack => qp.on_ack(ctx, hdr),
                PacketKind::ReadResponse => qp.on_read_response(ctx, hdr, payload),
                PacketKind::AtomicAck => qp.on_atomic_ack(ctx, hdr),
                _ => qp.on_request(ctx, hdr, payload),
            }
            true
        });
        if handled == Some(true) {
            self.list(hdr.dst_qpn); // what arrived may have opened its window or rewound it
        } else {
            self.stats.rx_ignored += 1;
        }
    }

    fn tx_one(&mut self) -> bool {
        if self.outbox_blocked {
            return false;
        }
        let Some(desc) = self.outbox.front().copied() else { return false };
        let qp = find_ref(&self.qps, desc.qpn);
        let Some((qp, remote)) = qp.and_then(|qp| qp.remote.as_ref().map(|r| (qp, r))) else {
            // The queue was reset or destroyed meanwhile (its slot may hold a newer queue).
            self.outbox.pop_front();
            return true;
        };
        let mut hdr = desc.hdr;
        hdr.src_nic = self.addr;
        hdr.dst_nic = remote.nic;
        hdr.src_qpn = qp.shared.qpn;
        hdr.dst_qpn = remote.qpn;
        // Outbox entries sent (or lost) by this call, and whether the wire refused one after
        // the first.
        let mut taken = 1usize;
        let mut burst_busy = false;
        let result = match desc.read_from {
            None => remote.wire.transmit(&hdr, &mut |_| {}),
            Some((rkey, addr)) => {
                let len = u64::from(hdr.payload_len);
                match self.keys.resolve_live(rkey, addr, len, Access::REMOTE_READ) {
                    Ok((src, _)) if (len as usize) < BY_REF_MIN => {
                        remote.wire.transmit(&hdr, &mut |buf: &mut [u8]| {
                            // SAFETY: the key table vouched for `buf.len()` readable bytes at
                            // `src` in a live registration (we hold the device lock); `buf` is
                            // wire memory.
                            unsafe { std::ptr::copy_nonoverlapping(src, buf.as_mut_ptr(), buf.len()) }
                        })
                    }
                    Ok((src, life)) => {
                        // SAFETY: the key table vouched for `len` readable bytes at `src` in the
                        // live registration `life` guards; we hold the device lock until the
                        // wire has taken the packet, so it stays in the table meanwhile.
                        let first = remote
                            .wire
                            .transmit_ref(&hdr, unsafe { PayloadRef::new(src, len as usize, life) });
                        if first != Transmit::Busy {
                            // The READ's next segments, queued right behind this one and back
                            // to back in the same registration, go now too: their range is
                            // checked in one piece, which is the same check as one per packet
                            // since the key table cannot change while we hold the device lock.
                            let mut end = addr + len;
                            let more = self
                                .outbox
                                .iter()
                                .skip(1)
                                .take(TX_BURST_MAX - 1)
                                .take_while(|d| {
                                    let next = d.qpn == desc.qpn
                                        && d.hdr.kind == PacketKind::ReadResponse
                                        && d.read_from == Some((rkey, end))
                                        && d.hdr.payload_len as usize >= BY_REF_MIN;
                                    end += if next { u64::from(d.hdr.payload_len) } else { 0 };
                                    next
                                })
                                .count();
                            if more > 0 {
                                if let Ok((src, life)) = self.keys.resolve_live(
                                    rkey,
                                    addr + len,
                                    end - addr - len,
                                    Access::REMOTE_READ,
                                ) {
                                    let mut at = 0usize;
                                    for d in self.outbox.iter().skip(1).take(more) {
                                        let n = d.hdr.payload_len as usize;
                                        let (src_nic, dst_nic, src_qpn, dst_qpn) =
                                            (hdr.src_nic, hdr.dst_nic, hdr.src_qpn, hdr.dst_qpn);
                                        let h = PacketHeader { src_nic, dst_nic, src_qpn, dst_qpn, ..d.hdr };
                                        // SAFETY: `at + n` is inside the range the key table
                                        // vouched for above, in the live registration `life`
                                        // guards, which stays in the table while we hold the
                                        // device lock.
                                        let p = unsafe { PayloadRef::new(src.add(at), n, life) };
                                        if remote.wire.transmit_ref(&h, p) == Transmit::Busy {
                                            burst_busy = true;
                                            break;
                                        }
                                        at += n;
                                        taken += 1;
                                    }
                                }
                            }
                        }
                        first
                    }
                    Err(_) => {
                        // Deregistered between the request and this response.
                        let nak = PacketHeader {
                            kind: PacketKind::Ack,
                            syndrome: Syndrome::NakRemoteAccess,
                            payload_len: 0,
                            ..hdr
                        };
                        remote.wire.transmit(&nak, &mut |_| {})
                    }
                }
            }
        };
        if result == Transmit::Busy {
            self.outbox_blocked = true;
            self.stats.tx_wire_busy += 1;
            return false;
        }
        self.stats.tx_responses += taken as u64;
        self.outbox.drain(..taken);
        if burst_busy {
            self.outbox_blocked = true;
            self.stats.tx_wire_busy += 1;
        }
        if let Some(qp) = find(&mut self.qps, desc.qpn) {
            if !qp.pending_flush {
                qp.pending_flush = true;
                self.to_flush.push(desc.qpn);
            }
        }
        true
    }
}
