//! Payloads passed by reference on the in-process wire, and the liveness of the registered memory
//! they point into.
//!
//! The in-process wire copies a payload once: the sending device puts a [`PayloadRef`] (a pointer
//! into one of its own registrations, and that registration's [`Life`]) into the receiver's
//! inbox slot instead of the bytes, and the receiving device copies straight from the sender's
//! memory into its own when it places the packet. The sender's memory may be deregistered (and
//! freed) while the packet waits in the inbox, so every access goes through the registration's
//! `Life`: one atomic word holding an *alive* bit and the number of copies in progress.
//!
//! - A reader (the receiving device taking the slot) adds itself with one `fetch_add` and goes on
//!   only if the word it replaced had the alive bit; otherwise it takes itself off again and the
//!   packet is lost on the wire, as if dropped (the requester's retransmission then finds the
//!   registration gone: a local protection error, or a remote access NAK for a READ response).
//! - Deregistration clears the bit (after removing the key, so no new reference is made) and then
//!   waits until no reader is left. It waits only for copies already in progress: each is one
//!   packet's placement (at most an MTU) by a device that holds no lock the deregistering thread
//!   could hold, so the wait is short and never depends on a peer being polled.
//!
//! Both sides change the one word with read-modify-writes, so a reader either comes before the
//! clear in its modification order (and the deregistration waits for its release) or after it
//! (and sees the bit gone). Checking the bit with a load and adding the reader afterwards would
//! let a deregistration slip between the two: `loom-tests/tests/source.rs` models both.

use crate::sync::{AtomicU64, Ordering};
use std::marker::PhantomData;
use std::sync::Arc;

/// In [`Life`]'s word: the registration's memory is still there.
const ALIVE: u64 = 1 << 63;

/// The liveness of one registration's memory (see the module documentation). Shared by the
/// registration, the device's key table and the inbox slots that last referred to it; on its own
/// cache line, so the `Arc`'s counts and other data do not share the readers' line.
#[derive(Debug)]
#[repr(align(64))]
pub struct Life {
    /// [`ALIVE`] | number of readers.
    state: AtomicU64,
}

impl Default for Life {
    fn default() -> Self {
        Life::new()
    }
}

impl Life {
    /// A live registration with no reader.
    pub fn new() -> Self {
        Life { state: AtomicU64::new(ALIVE) }
    }

    /// A reader starts a copy: true if the memory is alive, and then it stays so until
    /// [`exit`](Self::exit). False: the memory is gone (or going); do not touch it.
    #[inline]
    pub fn enter(&self) -> bool {
        #[cfg(loom)]
        if crate::sync::mutation::active(crate::sync::mutation::Mutant::SourceCheckThenEnter) {
            // MUTANT: check the bit with a load, then count the reader in a second step.
            if self.state.load(Ordering::Acquire) & ALIVE == 0 {
                return false;
            }
            self.state.fetch_add(1, Ordering::Acquire);
            return true;
        }
        let old = self.state.fetch_add(1, Ordering::Acquire);
        if old & ALIVE != 0 {
            return true;
        }
        self.state.fetch_sub(1, Ordering::Release);
        false
    }

    /// The reader that [`enter`](Self::enter)ed is done with the memory (release: its reads
    /// happen before a deregistration that waits for it returns).
    #[inline]
    pub fn exit(&self) {
        self.state.fetch_sub(1, Ordering::Release);
    }

    /// Deregistration: no reader enters from now on; returns once every reader already in has
    /// left, after which the memory may be freed. Readers copy one packet each without waiting
    /// on anything, so this spins (yielding the CPU) only for copies in progress.
    pub fn kill(&self) {
        let mut s = self.state.fetch_and(!ALIVE, Ordering::AcqRel) & !ALIVE;
        let mut spins = 0u32;
        while s != 0 {
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                // A reader was preempted mid-copy (two cores, more threads): let it run.
                std::thread::yield_now();
            }
            #[cfg(loom)]
            loom::thread::yield_now();
            s = self.state.load(Ordering::Acquire) & !ALIVE;
        }
    }
}

/// A packet payload handed to a wire by reference: `len` bytes of a registration of the sending
/// NIC, valid while the sender holds its device lock (its lifetime `'a`). A wire that carries
/// bytes copies it out with [`copy_to`](Self::copy_to) (what [`Wire::transmit_ref`]'s default
/// does); the in-process wire keeps the reference and lets the receiver copy.
///
/// [`Wire::transmit_ref`]: crate::wire::Wire::transmit_ref
#[derive(Debug, Clone, Copy)]
pub struct PayloadRef<'a> {
    ptr: *const u8,
    len: usize,
    life: &'a Arc<Life>,
}

impl<'a> PayloadRef<'a> {
    /// # Safety
    /// `len` bytes at `ptr` lie in the registration `life` belongs to, and stay readable for
    /// `'a` (the sender holds the device lock under which its key table vouched for them).
    pub(crate) unsafe fn new(ptr: *const u8, len: usize, life: &'a Arc<Life>) -> Self {
        PayloadRef { ptr, len, life }
    }

    /// The payload's length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if the payload is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies the payload into `buf`, which must be exactly [`len`](Self::len) bytes long.
    pub fn copy_to(&self, buf: &mut [u8]) {
        assert_eq!(buf.len(), self.len, "a payload copied into a buffer of another size");
        // SAFETY: `new`'s contract: `len` readable bytes at `ptr` for `'a`, which outlives
        // `&self`; `buf` is the caller's own memory, a `&mut` that no registration aliases
        // while the sender holds its device lock (wire buffers are not registered memory).
        unsafe { std::ptr::copy_nonoverlapping(self.ptr, buf.as_mut_ptr(), self.len) }
    }

    pub(crate) fn ptr(&self) -> *const u8 {
        self.ptr
    }

    pub(crate) fn life(&self) -> &'a Arc<Life> {
        self.life
    }
}

/// A received payload as the device places it: bytes in an inbox slot or a byte wire's buffer,
/// or (the in-process wire's by-reference packets) in the sending NIC's registered memory while
/// the receiver counts as its reader. Only raw copies read it: the sender's memory is host
/// memory under the DMA contract (its owner may write it concurrently, and it may even be the
/// destination itself on a loopback), so no `&[u8]` is ever made of it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Payload<'a> {
    ptr: *const u8,
    len: usize,
    _bytes: PhantomData<&'a [u8]>,
}

impl<'a> From<&'a [u8]> for Payload<'a> {
    fn from(b: &'a [u8]) -> Self {
        Payload { ptr: b.as_ptr(), len: b.len(), _bytes: PhantomData }
    }
}

impl Payload<'_> {
    /// # Safety
    /// `len` bytes at `ptr` stay readable (by raw copies) for the payload's lifetime.
    pub(crate) unsafe fn from_raw(ptr: *const u8, len: usize) -> Self {
        Payload { ptr, len, _bytes: PhantomData }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether the payload's bytes and the `n` bytes at `p` share an address.
    pub(crate) fn overlaps(&self, p: *const u8, n: usize) -> bool {
        let (a, b) = (self.ptr as usize, p as usize);
        a < b.saturating_add(n) && b < a.saturating_add(self.len)
    }

    /// The first `len` bytes (at most all of them).
    pub(crate) fn prefix(self, len: usize) -> Self {
        Payload { len: len.min(self.len), ..self }
    }

    /// Copies bytes `from..from + n` of the payload to `dst` (the ranges may overlap: a loopback
    /// can place a registration's bytes into itself).
    ///
    /// # Safety
    /// `dst` is valid for `n` bytes of writes (a range the receiving device's key table vouched
    /// for, under its device lock).
    pub(crate) unsafe fn copy_out(&self, from: usize, dst: *mut u8, n: usize) {
        assert!(from.checked_add(n).is_some_and(|e| e <= self.len), "copy past the payload's end");
        // SAFETY: `from + n <= len` bytes at `ptr` are readable (the payload's invariant);
        // `dst` is valid for `n` writes (the caller's contract); `copy` allows overlap.
        unsafe { std::ptr::copy(self.ptr.add(from), dst, n) }
    }

    /// The payload's bytes, copied (tests and the loom API).
    #[cfg(any(test, loom))]
    pub(crate) fn to_vec(self) -> Vec<u8> {
        let mut v = vec![0u8; self.len];
        // SAFETY: `v` is our own buffer of `len` bytes.
        unsafe { self.copy_out(0, v.as_mut_ptr(), self.len) };
        v
    }
}
