//! The single-producer / single-consumer frame ring of the shared-memory wire, and the doorbell
//! protocol that lets its consumer sleep.
//!
//! The algorithm is written once, over `crate::sync` atomics and a [`Slots`] store, so that it
//! runs in two places:
//!
//! - in production, on [`RingCtl`] and [`Bell`] structs that live *inside* the shared mapping
//!   (std atomics have the size and alignment of their integer, and an all-zero file is a valid
//!   value of every one of them), with slots that are plain bytes of the mapping;
//! - under `cfg(loom)`, on heap-allocated `RingCtl`/`Bell` (loom atomics) and slots in loom
//!   `UnsafeCell`s, so that `loom-tests/tests/shm_ring.rs` explores every interleaving of this
//!   very code.
//!
//! Indices are free-running `u32`s; the slot of index `i` is `i & (depth - 1)`. A slot holds a
//! little-endian `u32` frame length, then the frame (a RoCEv2 UDP payload). Every value read from
//! shared memory is checked before it is used: the peer is another process, and a bug or a stray
//! write there must turn into a counted drop here, never into an out-of-bounds access.
//!
//! Ordering, in the words of the code below:
//!
//! - **publish**: the producer writes the slot, then stores the producer index with `Release`;
//!   the consumer loads it with `Acquire` before it reads the slot. The consumer stores its index
//!   with `Release` after it is done with the slot; the producer loads it with `Acquire` before it
//!   writes the slot again.
//! - **the consumer's sleep** (Dekker): the consumer stores `sleeping = 1`, issues a SeqCst fence,
//!   then looks whether anything is pending; the producer publishes, marks the ring pending,
//!   issues a SeqCst fence, then loads `sleeping`. At least one of them sees the other's store, so
//!   either the consumer sees the frame or the producer sees the flag and wakes it.
//! - **the producer's wait** (the same pattern, mirrored): a producer that finds the ring full
//!   stores `waiting = 1`, fences, and re-reads the consumer index; a consumer that popped fences,
//!   then loads `waiting`. Either the producer sees the room or the consumer sees the flag and
//!   wakes the producer's process.

use crate::sync::{fence, AtomicU32, AtomicU64, Ordering};

/// Bytes of the frame-length word at the start of every slot.
pub(crate) const LEN_BYTES: usize = 4;

/// The control block of one ring: three cache lines (owner, producer, consumer), so the two sides'
/// hot words never share a line.
#[repr(C, align(64))]
#[derive(Debug)]
pub struct RingCtl {
    // ---- line 0: the owner, written when a producer claims or lets go of the ring.
    /// 0: free. Otherwise the claim token of the producer that won the compare-and-swap.
    pub owner: AtomicU64,
    /// The producer's process id.
    pub owner_pid: AtomicU32,
    /// The producer's fabric number in its process.
    pub owner_fabric: AtomicU32,
    /// The producer NIC's address on that fabric.
    pub owner_nic: AtomicU32,
    /// 1 once the producer has let go of the ring (the consumer frees it when it is empty).
    pub closed: AtomicU32,
    /// The producer process's start time (`/proc/<pid>/stat` field 22).
    pub owner_start: AtomicU64,
    _pad0: [u64; 4],
    // ---- line 1: written by the producer.
    /// Producer index: frames below it are published.
    pub pi: AtomicU32,
    /// 1: the producer found the ring full and waits to be woken (the consumer clears it).
    pub waiting: AtomicU32,
    _pad1: [u64; 7],
    // ---- line 2: written by the consumer.
    /// Consumer index: slots below it are free again.
    pub ci: AtomicU32,
    _pad2: [u32; 15],
}

impl RingCtl {
    /// A free, empty ring (loom models; in production the mapping starts zeroed).
    pub fn new() -> Self {
        RingCtl {
            owner: AtomicU64::new(0),
            owner_pid: AtomicU32::new(0),
            owner_fabric: AtomicU32::new(0),
            owner_nic: AtomicU32::new(0),
            closed: AtomicU32::new(0),
            owner_start: AtomicU64::new(0),
            _pad0: [0; 4],
            pi: AtomicU32::new(0),
            waiting: AtomicU32::new(0),
            _pad1: [0; 7],
            ci: AtomicU32::new(0),
            _pad2: [0; 15],
        }
    }
}

impl Default for RingCtl {
    fn default() -> Self {
        Self::new()
    }
}

/// The doorbell block of a segment: one cache line shared by every producer and the consumer.
#[repr(C, align(64))]
#[derive(Debug)]
pub struct Bell {
    /// The futex word the segment owner's receive thread sleeps on; bumped by every wake.
    pub doorbell: AtomicU32,
    /// 1 while the receive thread is (about to be) asleep and wants producers to wake it.
    pub sleeping: AtomicU32,
    /// 1: a consumer of one of this process's outbound rings made room for a waiting producer.
    pub unblock: AtomicU32,
    _pad: u32,
    /// One bit per ring (ring `r` sets bit `r % 64`): frames may be waiting there.
    pub pending: AtomicU64,
    _pad1: [u64; 5],
}

impl Bell {
    /// A quiet doorbell (loom models; in production the mapping starts zeroed).
    pub fn new() -> Self {
        Bell {
            doorbell: AtomicU32::new(0),
            sleeping: AtomicU32::new(0),
            unblock: AtomicU32::new(0),
            _pad: 0,
            pending: AtomicU64::new(0),
            _pad1: [0; 5],
        }
    }
}

impl Default for Bell {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(not(loom))]
const _: () = {
    assert!(std::mem::size_of::<RingCtl>() == 192);
    assert!(std::mem::size_of::<Bell>() == 64);
};

/// Where a ring's slots live. Each slot is `slot_size()` bytes: the length word, then the frame.
pub trait Slots {
    /// Number of slots (a power of two).
    fn depth(&self) -> u32;
    /// Runs `f` on slot `i`'s bytes for writing.
    ///
    /// # Safety
    /// Only the ring's producer calls it, for a slot the consumer has released (below `ci + depth`,
    /// at or above `pi`), so nobody else touches those bytes meanwhile.
    unsafe fn with_slot_mut<R>(&self, i: u32, f: impl FnOnce(&mut [u8]) -> R) -> R;
    /// Runs `f` on slot `i`'s bytes for reading.
    ///
    /// # Safety
    /// Only the ring's consumer calls it, for a published slot (at or above `ci`, below `pi`), which
    /// the producer does not write until the consumer index passes it.
    unsafe fn with_slot<R>(&self, i: u32, f: impl FnOnce(&[u8]) -> R) -> R;
}

/// The outcome of [`push`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Push {
    /// The frame is in the ring and published.
    Sent,
    /// The ring is full; the waiting flag is raised, so the consumer wakes the producer's
    /// process after its next pop.
    Full,
    /// `fill` refused: the frame does not fit a slot. Nothing was published.
    TooLong,
}

/// Producer: writes one frame with `fill` (which gets the slot's frame area and returns the
/// frame's length, or `None` if it does not fit) and publishes it.
pub fn push<S: Slots>(ctl: &RingCtl, slots: &S, fill: impl FnOnce(&mut [u8]) -> Option<usize>) -> Push {
    let depth = slots.depth();
    let pi = ctl.pi.load(Ordering::Relaxed); // only this producer writes it
    let ci = ctl.ci.load(Ordering::Acquire);
    // More than `depth` outstanding can only be a corrupt index: treat it as full.
    if pi.wrapping_sub(ci) >= depth {
        ctl.waiting.store(1, Ordering::Relaxed);
        #[cfg(loom)]
        let skip = crate::sync::mutation::active(crate::sync::mutation::Mutant::ShmNoFenceBeforeFullRecheck);
        #[cfg(not(loom))]
        let skip = false;
        if !skip {
            fence(Ordering::SeqCst);
        }
        let ci = ctl.ci.load(Ordering::Acquire);
        if pi.wrapping_sub(ci) >= depth {
            return Push::Full;
        }
    }
    // SAFETY: `pi - ci < depth`, so slot `pi` was released by the consumer (its Release store of
    // `ci`, read with Acquire above); this thread is the ring's only producer.
    let len = unsafe {
        slots.with_slot_mut(pi & (depth - 1), |slot| {
            let cap = slot.len().saturating_sub(LEN_BYTES);
            let (head, frame) = slot.split_at_mut(LEN_BYTES.min(slot.len()));
            let len = fill(frame).filter(|&n| n <= cap)?;
            head.copy_from_slice(&(len as u32).to_le_bytes());
            Some(len)
        })
    };
    if len.is_none() {
        return Push::TooLong;
    }
    #[cfg(loom)]
    let order = if crate::sync::mutation::active(crate::sync::mutation::Mutant::ShmPublishRelaxed) {
        Ordering::Relaxed // MUTANT
    } else {
        Ordering::Release
    };
    #[cfg(not(loom))]
    let order = Ordering::Release;
    ctl.pi.store(pi.wrapping_add(1), order);
    Push::Sent
}

/// Producer, after a successful [`push`] on ring `ring`: marks the ring pending in its segment's
/// doorbell block (what the consumer's poll looks at: one load).
#[inline]
pub fn mark_pending(bell: &Bell, ring: u32) {
    bell.pending.fetch_or(1 << (ring % 64), Ordering::Release);
}

/// Producer, after publishing a burst: whether the consumer asked to be woken (then the caller
/// bumps the doorbell and issues FUTEX_WAKE).
#[inline]
pub fn wake_needed(bell: &Bell) -> bool {
    #[cfg(loom)]
    let skip = crate::sync::mutation::active(crate::sync::mutation::Mutant::ShmNoFenceBeforeSleepCheck);
    #[cfg(not(loom))]
    let skip = false;
    if !skip {
        fence(Ordering::SeqCst);
    }
    bell.sleeping.load(Ordering::Relaxed) != 0
}

/// Producer side of a wake: bumps the doorbell so a sleeper's futex wait returns (or never
/// starts). The caller issues the system call.
#[inline]
pub fn ring_doorbell(bell: &Bell) {
    bell.doorbell.fetch_add(1, Ordering::Release);
}

/// The outcome of [`pop`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pop<R> {
    /// Nothing published.
    Empty,
    /// One frame, handed to the caller's function (which returned this).
    Frame(R),
    /// The indices are impossible (more than `depth` apart): the ring was skipped to its
    /// producer index and the caller counts the frames lost as malformed.
    Corrupt(u32),
}

/// Consumer: hands the oldest published frame to `f` in place (`Err(len)` if its length word is
/// impossible, so the caller can count it), then releases the slot.
pub fn pop<S: Slots, R>(ctl: &RingCtl, slots: &S, f: impl FnOnce(Result<&[u8], u32>) -> R) -> Pop<R> {
    let depth = slots.depth();
    let ci = ctl.ci.load(Ordering::Relaxed); // only this consumer writes it
    let pi = ctl.pi.load(Ordering::Acquire);
    let n = pi.wrapping_sub(ci);
    if n == 0 {
        return Pop::Empty;
    }
    if n > depth {
        ctl.ci.store(pi, Ordering::Release);
        return Pop::Corrupt(n);
    }
    // SAFETY: `ci < pi` (at most `depth` apart): slot `ci` was published by the producer's
    // Release store of `pi`, read with Acquire above, and stays untouched until `ci` moves on.
    let r = unsafe {
        slots.with_slot(ci & (depth - 1), |slot| {
            let Some(head) = slot.get(..LEN_BYTES) else { return f(Err(0)) };
            let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
            match slot.get(LEN_BYTES..LEN_BYTES.saturating_add(len as usize)) {
                Some(frame) => f(Ok(frame)),
                None => f(Err(len)),
            }
        })
    };
    ctl.ci.store(ci.wrapping_add(1), Ordering::Release);
    Pop::Frame(r)
}

/// Consumer, after popping one or more frames from a ring: whether its producer waits for room
/// (the flag is cleared; the caller wakes the producer's process).
#[inline]
pub fn producer_waiting(ctl: &RingCtl) -> bool {
    fence(Ordering::SeqCst);
    ctl.waiting.load(Ordering::Relaxed) != 0 && ctl.waiting.swap(0, Ordering::AcqRel) != 0
}

/// Consumer: whether ring `ctl` has a frame published (one Acquire load).
#[inline]
pub fn has_frames(ctl: &RingCtl) -> bool {
    ctl.pi.load(Ordering::Acquire) != ctl.ci.load(Ordering::Relaxed)
}

/// Consumer, before sleeping: raises the sleeping flag and fences. Returns the doorbell value to
/// wait on; the caller then checks [`Bell::pending`] (and its rings) once more, and sleeps only if
/// nothing is there, with `FUTEX_WAIT(doorbell, value)`.
#[inline]
pub fn prepare_sleep(bell: &Bell) -> u32 {
    let v = bell.doorbell.load(Ordering::Acquire);
    bell.sleeping.store(1, Ordering::Relaxed);
    fence(Ordering::SeqCst);
    v
}

/// Consumer, after waking (or deciding not to sleep).
#[inline]
pub fn end_sleep(bell: &Bell) {
    bell.sleeping.store(0, Ordering::Relaxed);
}

/// Consumer: takes the pending bits (the caller drains those rings, and puts back the bits of
/// rings it did not empty).
#[inline]
pub fn take_pending(bell: &Bell) -> u64 {
    if bell.pending.load(Ordering::Relaxed) == 0 {
        return 0;
    }
    bell.pending.swap(0, Ordering::Acquire)
}

/// Whether any ring may have frames (one load: what a poll looks at).
#[inline]
pub fn any_pending(bell: &Bell) -> bool {
    bell.pending.load(Ordering::Relaxed) != 0
}
