//! A NIC's inbox: the bounded, lock-free ring of packet slots that the in-process wire (and the
//! byte wires' receive threads) fill and the NIC's device drains.
//!
//! Many producers (every NIC that sends to this one), one consumer (whoever holds this NIC's
//! device lock). Each slot carries a sequence word, as in Vyukov's bounded queue: a slot at
//! position `p` is free for the producer that claims `p` when its sequence is `2p`, and holds a
//! published packet when it is `2p + 1`; the consumer frees it for the next lap by storing
//! `2(p + depth)`. (Vyukov's `p` / `p + 1` cannot tell "published" from "free for the next
//! lap" in a 1-slot ring: the first loom model found that.) A producer claims a position with one compare-exchange of the tail, writes the
//! header and payload into the slot (no lock held while `fill` copies the payload) and publishes
//! it with one release store. Positions are 64-bit and never wrap in practice, so any depth works.
//!
//! A full inbox refuses the packet. A refused NIC may ask to be kicked once there is room
//! ([`Inbox::push`] with `wait`): it registers in a small locked list (only on this cold path),
//! then sets a *waited-on* bit in the sequence word of a published slot halfway along the ring
//! (so it is kicked once more than half the ring is free, and refills it in one burst), with a
//! read-modify-write; the consumer frees slots with a swap, so it sees the bit exactly when the
//! bit went in before its free, and kicks the registered NICs. If the free came first, the
//! sender's read-modify-write sees the freed sequence and it retries. Both sides act on the one
//! word with read-modify-writes, so no fence is needed (a first version paired SeqCst fences
//! instead, Dekker-style: the consumer's fence after every pass cost more than the mutex it
//! replaced, docs/BENCHMARKS.md). The model: `loom-tests/tests/inbox.rs`.
//!
//! A slot holds its payload's bytes, or ([`Inbox::push_ref`]) a reference into the sender's
//! registered memory: a pointer and the registration's [`Life`], which the consumer enters for
//! the time it handles the packet (`source.rs`). The slot keeps the last `Life` it was given
//! and replaces it only when a packet from another registration comes, so a long transfer
//! through the same slots touches no reference count per packet.

use crate::packet::PacketHeader;
use crate::source::{Life, Payload, PayloadRef};
use crate::sync::{self, AtomicU64, Mutex, Ordering, UnsafeCell};
use bypass_hal::trace;
use std::sync::Arc;

/// In a slot's sequence: a refused sender waits for this slot to be freed.
const WAITED: u64 = 1 << 63;

/// Keeps the producers' tail off the consumer's line.
#[derive(Debug)]
#[repr(align(64))]
struct Padded<T>(T);

#[derive(Debug)]
struct Slot {
    /// `2p`: free for position `p`; `2p + 1`: holds position `p`'s packet; either may carry
    /// [`WAITED`].
    seq: AtomicU64,
    hdr: UnsafeCell<PacketHeader>,
    /// When the packet went in ([`bypass_hal::trace::now`]), if recording; else 0.
    sent_at: UnsafeCell<u64>,
    buf: UnsafeCell<Box<[u8]>>,
    /// Where the payload is: in `buf`, or in a sender's registration.
    src: UnsafeCell<Src>,
}

/// A slot's payload source.
#[derive(Debug)]
struct Src {
    /// The payload is `hdr.payload_len` bytes at `ptr` in the registration `life` guards, not
    /// in `buf`.
    by_ref: bool,
    ptr: *const u8,
    /// The registration of the last by-reference packet in this slot (kept afterwards, so that
    /// the next packet from it clones nothing).
    life: Option<Arc<Life>>,
}

/// How a producer hands over a payload.
enum Fill<'f, 'p> {
    /// Writes the bytes into the slot.
    Copy(&'f mut dyn FnMut(&mut [u8])),
    /// Leaves them in the sender's memory.
    Ref(&'f PayloadRef<'p>),
}

/// Leaves the source registration when the consumer is done with a by-reference packet (also
/// if handling it panics, so a deregistration never waits for a reader that is gone).
struct Reader<'a>(&'a Life);

impl Drop for Reader<'_> {
    fn drop(&mut self) {
        self.0.exit();
    }
}

/// The ring (see the module documentation).
#[derive(Debug)]
pub(crate) struct Inbox {
    slots: Box<[Slot]>,
    /// The next position a producer claims.
    tail: Padded<AtomicU64>,
    /// The next position the consumer reads (written only by the consumer).
    head: Padded<AtomicU64>,
    /// NICs that found the inbox full and wait to be kicked.
    waiters: Mutex<Vec<u32>>,
}

// SAFETY: a slot's cells are written only by the producer that claimed its position (until it
// publishes it with a release store of the sequence) and read only by the single consumer after
// an acquire load of that sequence; the consumer frees it with a release store before any
// producer's acquire load lets it write again. Everything else is atomic or behind the mutex.
unsafe impl Sync for Inbox {}
// SAFETY: the only non-`Send` field is a slot's source pointer, into registered memory that any
// thread may read under the slot's `Life` (it is not tied to the thread that stored it).
unsafe impl Send for Inbox {}

impl Inbox {
    /// `depth` slots of `mtu` bytes each, allocated once.
    pub(crate) fn new(depth: usize, mtu: usize) -> Self {
        assert!(depth > 0, "an inbox needs at least one slot");
        let slots = (0..depth as u64)
            .map(|p| Slot {
                seq: AtomicU64::new(2 * p),
                hdr: UnsafeCell::new(PacketHeader::default()),
                sent_at: UnsafeCell::new(0),
                buf: UnsafeCell::new(vec![0u8; mtu].into()),
                src: UnsafeCell::new(Src { by_ref: false, ptr: std::ptr::null(), life: None }),
            })
            .collect();
        Inbox {
            slots,
            tail: Padded(AtomicU64::new(0)),
            head: Padded(AtomicU64::new(0)),
            waiters: Mutex::new(Vec::with_capacity(8)),
        }
    }

    fn slot(&self, pos: u64) -> &Slot {
        &self.slots[(pos % self.slots.len() as u64) as usize]
    }

    /// Producer: appends a packet, calling `fill` once to write its `hdr.payload_len` payload
    /// bytes into the slot. False if the inbox is full (`fill` not called); then, if `wait`,
    /// `hdr.src_nic` is kicked once the consumer has freed more than half the ring (the slot it
    /// marks, `ceil(depth / 2)` behind the refused position: the head's slot at depth 1).
    pub(crate) fn push(&self, hdr: &PacketHeader, fill: &mut dyn FnMut(&mut [u8]), wait: bool) -> bool {
        self.push_with(hdr, &mut Fill::Copy(fill), wait)
    }

    /// Producer: appends a packet whose payload stays in the sender's memory (`src`, of
    /// `hdr.payload_len` bytes); otherwise as [`push`](Self::push).
    pub(crate) fn push_ref(&self, hdr: &PacketHeader, src: &PayloadRef<'_>, wait: bool) -> bool {
        debug_assert_eq!(src.len(), hdr.payload_len as usize);
        self.push_with(hdr, &mut Fill::Ref(src), wait)
    }

    fn push_with(&self, hdr: &PacketHeader, fill: &mut Fill<'_, '_>, wait: bool) -> bool {
        let mut registered = false;
        loop {
            let Err(full) = self.try_push(hdr, fill) else { return true };
            if !wait {
                return false;
            }
            // Mark the slot halfway between the head and the tail (the ring is full, so every
            // position in between was claimed): the sender is kicked after `depth / 2 + 1` frees
            // (5 of 8; 2 of 2; 1 of 1) and then refills the ring in one burst. Marking the head's
            // slot, which blocked us, would kick it after every free of a ring kept full by a
            // sender faster than its consumer (a by-reference READ response costs the sender no
            // copy): one kick, one packet, one refusal per packet.
            let depth = self.slots.len() as u64;
            // A slot starts at `2p` for its first lap, so a refusal is never in the first lap.
            debug_assert!(full >= depth, "refused at {full} by a ring of {depth}");
            let pos = full - depth + depth / 2;
            let seq = self.slot(pos).seq.load(Ordering::Acquire) & !WAITED;
            if seq.wrapping_sub(2 * pos) as i64 > 1 {
                continue; // freed meanwhile: there is room now
            }
            if seq & 1 == 0 {
                // Claimed by another sender that has not published yet (it is copying its
                // payload): the slot will be published soon; mark it then.
                std::hint::spin_loop();
                #[cfg(loom)]
                loom::thread::yield_now();
                continue;
            }
            if !registered {
                let mut w = sync::lock(&self.waiters);
                if !w.contains(&hdr.src_nic) {
                    w.push(hdr.src_nic);
                }
                registered = true;
            }
            #[cfg(loom)]
            if crate::sync::mutation::active(crate::sync::mutation::Mutant::InboxMarkLoadStore) {
                // MUTANT: mark with a load and a store (a free in between is overwritten).
                let cur = self.slot(pos).seq.load(Ordering::Acquire);
                if cur & !WAITED != seq {
                    continue;
                }
                self.slot(pos).seq.store(cur | WAITED, Ordering::Release);
                return false;
            }
            let old = self.slot(pos).seq.fetch_or(WAITED, Ordering::AcqRel);
            if old & !WAITED == 2 * pos + 1 {
                // Marked before the consumer freed it: its free will see the bit.
                return false;
            }
            // Freed (or taken further) meanwhile: try again. (A registration left behind costs
            // one spurious kick.)
        }
    }

    /// Claims, fills and publishes the tail slot, or returns the position that was full.
    fn try_push(&self, hdr: &PacketHeader, fill: &mut Fill<'_, '_>) -> Result<(), u64> {
        let mut pos = self.tail.0.load(Ordering::Relaxed);
        loop {
            let slot = self.slot(pos);
            let seq = slot.seq.load(Ordering::Acquire) & !WAITED;
            let ahead = seq.wrapping_sub(2 * pos) as i64;
            if ahead == 0 {
                #[cfg(loom)]
                if crate::sync::mutation::active(crate::sync::mutation::Mutant::InboxClaimLoadStore) {
                    // MUTANT: claim with a load and a store instead of one compare-exchange.
                    self.tail.0.store(pos + 1, Ordering::Relaxed);
                    self.fill_and_publish(slot, pos, hdr, fill);
                    return Ok(());
                }
                match self.tail.0.compare_exchange_weak(pos, pos + 1, Ordering::Relaxed, Ordering::Relaxed) {
                    Ok(_) => {
                        self.fill_and_publish(slot, pos, hdr, fill);
                        return Ok(());
                    }
                    Err(now) => pos = now,
                }
            } else if ahead < 0 {
                // The slot still holds the packet of the previous lap (or is being filled with
                // it): full.
                return Err(pos);
            } else {
                // Another producer claimed `pos` meanwhile.
                pos = self.tail.0.load(Ordering::Relaxed);
            }
        }
    }

    fn fill_and_publish(&self, slot: &Slot, pos: u64, hdr: &PacketHeader, fill: &mut Fill<'_, '_>) {
        let len = hdr.payload_len as usize;
        // SAFETY: claiming `pos` (the tail's compare-exchange from `pos`, with the slot's
        // sequence at `2 pos`, i.e. freed by the consumer) gives this producer the slot alone
        // until it publishes it below.
        unsafe {
            slot.hdr.with_mut(|h| *h = *hdr);
            slot.sent_at.with_mut(|t| *t = trace::stamp());
            slot.src.with_mut(|s| {
                let s = &mut *s;
                match fill {
                    Fill::Copy(fill) => {
                        s.by_ref = false;
                        slot.buf.with_mut(|b| {
                            let b = &mut *b;
                            debug_assert!(len <= b.len(), "packet larger than the MTU");
                            fill(&mut b[..len]);
                        });
                    }
                    Fill::Ref(src) => {
                        s.by_ref = true;
                        s.ptr = src.ptr();
                        // A pointer comparison: a slot fed by one registration keeps its `Arc`.
                        if !s.life.as_ref().is_some_and(|l| Arc::ptr_eq(l, src.life())) {
                            s.life = Some(src.life().clone());
                        }
                    }
                }
            });
        }
        #[cfg(loom)]
        let order = if crate::sync::mutation::active(crate::sync::mutation::Mutant::InboxPublishRelaxed) {
            Ordering::Relaxed // MUTANT
        } else {
            Ordering::Release
        };
        #[cfg(not(loom))]
        let order = Ordering::Release;
        slot.seq.store(2 * pos + 1, order);
    }

    /// True if the oldest packet is published (any thread may ask; a push racing with this may
    /// be missed, and its sender flags the NIC afterwards).
    pub(crate) fn nonempty(&self) -> bool {
        let h = self.head.0.load(Ordering::Relaxed);
        self.slot(h).seq.load(Ordering::Acquire) & !WAITED == 2 * h + 1
    }

    /// Consumer: runs `f` on the oldest packet (header, payload, trace stamp) if one is
    /// published, leaving it in place. The payload is `None` if it was left in a sender's
    /// registration that has been deregistered since: the packet is lost.
    ///
    /// # Safety
    /// The caller is the only consumer (it holds the NIC's device lock) until its `pop`.
    #[cfg(any(test, loom))]
    pub(crate) unsafe fn with_front<R>(
        &self,
        f: impl FnOnce(&PacketHeader, Option<Payload<'_>>, u64) -> R,
    ) -> Option<R> {
        // SAFETY: the caller's contract is ours.
        unsafe {
            self.with_front_run(1, |_, _| false, |hdr, _, _, payload, sent_at| f(hdr, payload, sent_at))
        }
    }

    /// Consumer: [`with_front`](Self::with_front) for a *run*: the oldest packet and the packets
    /// published right behind it (at most `max` in all) whose payloads continue its payload by
    /// reference — each in the same registration, starting where the previous one's bytes end —
    /// and whose headers `joins(previous, next)` accepts. `f` gets the first and the last header
    /// of the run, its length `n` and the `n` payloads as one (`None`: the registration is gone),
    /// and leaves the packets in place; the caller then pops as many as it handled. A packet
    /// whose payload is in its slot is a run of one. No packet is read twice: a run that `f`
    /// takes only the first packet of (the payload's first `first.payload_len` bytes) offers
    /// the rest again at the next call.
    ///
    /// # Safety
    /// The caller is the only consumer (it holds the NIC's device lock) until its `pop`s.
    pub(crate) unsafe fn with_front_run<R>(
        &self,
        max: usize,
        joins: impl Fn(&PacketHeader, &PacketHeader) -> bool,
        f: impl FnOnce(&PacketHeader, &PacketHeader, usize, Option<Payload<'_>>, u64) -> R,
    ) -> Option<R> {
        let h = self.head.0.load(Ordering::Relaxed);
        let slot = self.slot(h);
        if slot.seq.load(Ordering::Acquire) & !WAITED != 2 * h + 1 {
            return None;
        }
        // SAFETY: the slot is published (its sequence, acquired above, is `2h + 1`) and only the
        // consumer frees it, so no producer writes it until our `pop`s (`run_behind` reads the
        // slots behind it under the same rule).
        unsafe {
            let hdr = slot.hdr.with(|p| *p);
            let sent_at = slot.sent_at.with(|p| *p);
            let len = hdr.payload_len as usize;
            Some(slot.src.with(|s| {
                let s = &*s;
                if !s.by_ref {
                    return slot.buf.with(|b| f(&hdr, &hdr, 1, Some(Payload::from(&(&*b)[..len])), sent_at));
                }
                let life = s.life.as_deref().expect("a by-reference slot names its registration");
                let (last, n, total) = self.run_behind(h, &hdr, s, max, &joins);
                if !life.enter() {
                    return f(&hdr, &last, n, None, sent_at);
                }
                let _reader = Reader(life);
                // SAFETY: the sender's key table vouched for each packet's bytes in the
                // registration `life` guards, and they lie back to back from `ptr` (checked by
                // `run_behind`), so `total` bytes at `ptr` are in it; `enter` succeeded: its memory is
                // not freed before `_reader` leaves, after `f`.
                f(&hdr, &last, n, Some(Payload::from_raw(s.ptr, total)), sent_at)
            }))
        }
    }

    /// The run that the by-reference packet `first` at the head (position `h`, source `src`)
    /// starts: the published slots behind it, by reference into the same registration, each
    /// payload starting where the previous one ends, whose headers `joins` accepts; at most
    /// `max` packets in all. Returns the run's last header, its length and its payload bytes.
    /// (Out of line: a packet whose payload is in its slot never gets here.)
    ///
    /// # Safety
    /// As for [`with_front_run`](Self::with_front_run), whose head slot `src` is.
    #[inline(never)]
    unsafe fn run_behind(
        &self,
        h: u64,
        first: &PacketHeader,
        src: &Src,
        max: usize,
        joins: &dyn Fn(&PacketHeader, &PacketHeader) -> bool,
    ) -> (PacketHeader, usize, usize) {
        let (mut last, mut n, mut total) = (*first, 1usize, first.payload_len as usize);
        let life = src.life.as_deref();
        while n < max.min(self.slots.len()) {
            let pos = h + n as u64;
            let next = self.slot(pos);
            #[cfg(loom)]
            if crate::sync::mutation::active(crate::sync::mutation::Mutant::InboxRunReadBeforeCheck) {
                // MUTANT: read the header first, then check that the slot is published.
                // SAFETY: none — this is the broken twin the model must catch.
                let _ = unsafe { next.hdr.with(|p| *p) };
            }
            if next.seq.load(Ordering::Acquire) & !WAITED != 2 * pos + 1 {
                break;
            }
            // SAFETY: the slot is published (its sequence, acquired above, is `2 pos + 1`) and
            // only the consumer, the caller, frees it, so no producer writes it meanwhile.
            let (nh, contiguous) = unsafe {
                let nh = next.hdr.with(|p| *p);
                let contiguous = next.src.with(|ns| {
                    let ns = &*ns;
                    ns.by_ref
                        && ns.life.as_deref().zip(life).is_some_and(|(a, b)| std::ptr::eq(a, b))
                        && ns.ptr == src.ptr.wrapping_add(total)
                });
                (nh, contiguous)
            };
            if !contiguous || !joins(&last, &nh) {
                break;
            }
            total += nh.payload_len as usize;
            last = nh;
            n += 1;
        }
        (last, n, total)
    }

    /// Consumer: frees the oldest packet's slot (after [`with_front`](Self::with_front) found
    /// it) and calls `kick` for the NICs waiting for room if a refused sender marked the slot.
    ///
    /// # Safety
    /// As for `with_front`, and a packet must be published at the head.
    pub(crate) unsafe fn pop(&self, kick: &mut dyn FnMut(u32)) {
        let h = self.head.0.load(Ordering::Relaxed);
        self.head.0.store(h + 1, Ordering::Relaxed);
        let old = self.slot(h).seq.swap(2 * (h + self.slots.len() as u64), Ordering::AcqRel);
        debug_assert_eq!(old & !WAITED, 2 * h + 1, "pop of an empty inbox");
        if old & WAITED != 0 {
            self.kick_waiters(kick);
        }
    }

    /// Kicks every NIC registered so far: each retries, and one that finds the inbox full again
    /// registers and marks a slot again. (Kicking one per freed slot, as the locked inbox did,
    /// would strand the others: several senders can mark the same slot.) Registrations made
    /// while kicking (a kicked sender may run at once, nested, and be refused again) belong to
    /// the slot they marked and stay for its free.
    #[cold]
    fn kick_waiters(&self, kick: &mut dyn FnMut(u32)) {
        let mut taken = [0u32; 16];
        let mut left = usize::MAX;
        while left > 0 {
            let n = {
                let mut w = sync::lock(&self.waiters);
                left = left.min(w.len());
                let n = left.min(taken.len());
                for (t, x) in taken.iter_mut().zip(w.drain(..n)) {
                    *t = x;
                }
                n
            };
            left -= n;
            for &x in &taken[..n] {
                kick(x);
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn front(ib: &Inbox) -> Option<(u32, Vec<u8>)> {
        // SAFETY: the test thread is the only consumer.
        unsafe { ib.with_front(|h, p, _| (h.psn, p.expect("bytes in the slot").to_vec())) }
    }

    #[test]
    fn inbox_is_fifo_reports_full_and_kicks_its_waiters() {
        let ib = Inbox::new(2, 16);
        let mut h = PacketHeader { src_nic: 5, payload_len: 3, ..Default::default() };
        for psn in 0..2 {
            h.psn = psn;
            assert!(ib.push(&h, &mut |b: &mut [u8]| b.copy_from_slice(&[psn as u8; 3]), true));
        }
        assert!(!ib.push(&h, &mut |_: &mut [u8]| unreachable!("a full inbox never calls fill"), true));
        h.src_nic = 6;
        assert!(!ib.push(&h, &mut |_: &mut [u8]| unreachable!(), true));
        h.src_nic = 7;
        assert!(!ib.push(&h, &mut |_: &mut [u8]| unreachable!(), false));
        assert_eq!(front(&ib), Some((0, vec![0; 3])));
        // SAFETY: the test thread is the only consumer and a packet is at the head.
        unsafe { ib.pop(&mut |w| panic!("NIC {w} kicked before half the ring was free")) };
        assert_eq!(front(&ib), Some((1, vec![1; 3])));
        let mut kicked = vec![];
        // SAFETY: as above.
        unsafe { ib.pop(&mut |w| kicked.push(w)) };
        kicked.sort();
        assert_eq!(
            kicked,
            [5, 6],
            "the marked slot's free kicks both waiters, not the one that did not wait"
        );
        assert!(front(&ib).is_none() && !ib.nonempty());
    }

    /// A sender refused by a full ring is kicked once more than half of it is free, not after
    /// the first free: a sender faster than its consumer refills it in bursts instead of one
    /// kick and one refusal per packet (which cut by-reference READ streams to a third).
    #[test]
    fn a_refused_sender_is_kicked_once_half_the_ring_is_free() {
        let ib = Inbox::new(8, 16);
        let mut h = PacketHeader { src_nic: 5, payload_len: 1, ..Default::default() };
        for psn in 0..8 {
            h.psn = psn;
            assert!(ib.push(&h, &mut |b: &mut [u8]| b[0] = psn as u8, true));
        }
        assert!(!ib.push(&h, &mut |_: &mut [u8]| unreachable!("a full inbox never calls fill"), true));
        for psn in 0..4 {
            assert_eq!(front(&ib), Some((psn, vec![psn as u8])));
            // SAFETY: the test thread is the only consumer and a packet is at the head.
            unsafe { ib.pop(&mut |w| panic!("NIC {w} kicked with only {} slot(s) free", psn + 1)) };
        }
        let mut kicked = vec![];
        // SAFETY: as above.
        unsafe { ib.pop(&mut |w| kicked.push(w)) };
        assert_eq!(kicked, [5], "kicked when the fifth of eight slots is freed");
    }

    /// A kicked sender can run at once (nested in the kick, on the Inline engine), be refused
    /// again and re-register for the next slot: that registration must survive until that slot
    /// is freed (the 4 MiB SEND of the hal conformance suite lost its kick otherwise).
    #[test]
    fn a_sender_refused_again_while_kicked_is_kicked_by_the_next_free() {
        let ib = Inbox::new(1, 8);
        let h = PacketHeader { src_nic: 3, payload_len: 1, ..Default::default() };
        assert!(ib.push(&h, &mut |b: &mut [u8]| b[0] = 1, true));
        assert!(!ib.push(&h, &mut |_: &mut [u8]| unreachable!(), true));
        let mut kicks = 0;
        // SAFETY: the test thread is the only consumer and a packet is at the head.
        unsafe {
            ib.pop(&mut |w| {
                assert_eq!(w, 3);
                kicks += 1;
                // The kicked sender refills the freed slot and is refused for the next one.
                assert!(ib.push(&h, &mut |b: &mut [u8]| b[0] = 2, true));
                assert!(!ib.push(&h, &mut |_: &mut [u8]| unreachable!(), true));
            })
        };
        assert_eq!(kicks, 1);
        let mut again = vec![];
        // SAFETY: as above.
        unsafe { ib.pop(&mut |w| again.push(w)) };
        assert_eq!(again, [3], "the second refusal was not kicked");
    }

    #[test]
    fn one_slot_inbox_refuses_until_taken() {
        let ib = Inbox::new(1, 8);
        let h = PacketHeader { payload_len: 1, ..Default::default() };
        assert!(ib.push(&h, &mut |b: &mut [u8]| b[0] = 1, false));
        assert!(!ib.push(&h, &mut |_: &mut [u8]| unreachable!("full"), false));
        assert_eq!(front(&ib), Some((0, vec![1])));
        // SAFETY: the test thread is the only consumer and a packet is at the head.
        unsafe { ib.pop(&mut |_| panic!("no waiters")) };
        assert!(ib.push(&h, &mut |b: &mut [u8]| b[0] = 2, false));
        assert_eq!(front(&ib), Some((0, vec![2])));
    }

    #[test]
    fn inbox_of_odd_depth_wraps_many_laps() {
        let ib = Inbox::new(3, 8);
        let mut h = PacketHeader { payload_len: 1, ..Default::default() };
        for psn in 0..100u32 {
            h.psn = psn;
            assert!(ib.push(&h, &mut |b: &mut [u8]| b[0] = psn as u8, true));
            if psn % 2 == 1 {
                for want in psn - 1..=psn {
                    assert_eq!(front(&ib), Some((want, vec![want as u8])));
                    // SAFETY: the test thread is the only consumer and a packet is at the head.
                    unsafe { ib.pop(&mut |_| panic!("no waiters")) };
                }
            }
        }
        assert!(!ib.nonempty());
    }
}
