//! Crate-internal synchronization shim.
//!
//! The rings, doorbells, CQ owner words and device lock import their atomics, cells and mutex from
//! here. Built with `RUSTFLAGS="--cfg loom"`, these are loom's model-checked types, so the models
//! in `loom-tests/` explore every interleaving of the real driver and device code.

#[cfg(loom)]
pub(crate) use loom::cell::UnsafeCell;
#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
#[cfg(loom)]
pub(crate) use loom::sync::{Mutex, MutexGuard};

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::{Mutex, MutexGuard};

/// `std::cell::UnsafeCell` with loom's closure-based API, so code is written once for both.
#[cfg(not(loom))]
#[derive(Debug, Default)]
pub(crate) struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

#[cfg(not(loom))]
impl<T> UnsafeCell<T> {
    pub(crate) const fn new(v: T) -> Self {
        UnsafeCell(std::cell::UnsafeCell::new(v))
    }
    /// Runs `f` with a shared pointer to the contents.
    #[inline(always)]
    pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        f(self.0.get())
    }
    /// Runs `f` with a mutable pointer to the contents.
    #[inline(always)]
    pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}

/// Locks a mutex, treating poisoning as "the holder panicked; the state is still consistent
/// enough to keep going" (the sim's invariants are re-checked by every step).
#[inline]
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    #[cfg(not(loom))]
    {
        m.lock().unwrap_or_else(|e| e.into_inner())
    }
    #[cfg(loom)]
    {
        m.lock().unwrap()
    }
}

/// Tries to lock a mutex without blocking.
#[inline]
pub(crate) fn try_lock<T>(m: &Mutex<T>) -> Option<MutexGuard<'_, T>> {
    #[cfg(not(loom))]
    {
        match m.try_lock() {
            Ok(g) => Some(g),
            Err(std::sync::TryLockError::Poisoned(e)) => Some(e.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }
    #[cfg(loom)]
    {
        m.try_lock().ok()
    }
}

/// Loom-only mutation switch: tells the ring code to commit one deliberate ordering bug, so each
/// loom model in `loom-tests/` can show that it catches that bug (its "broken twin"). Compiled only
/// with `--cfg loom`; normal builds have no such switch and no branches on it.
///
/// The switch is a process-wide std (not loom) atomic, read at the hooks in `ring.rs`. Tests that
/// set a mutant must hold a test-wide lock so that no other model runs meanwhile.
#[cfg(loom)]
#[doc(hidden)]
pub mod mutation {

    /// A deliberate bug the ring code commits while it is [`set`].
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    #[repr(u32)]
    pub enum Mutant {
        /// `CqRing::write` stores the CQE head word (with the owner bit) `Relaxed`, not `Release`.
        CqeHeadRelaxed = 101,
        /// `CqRing::write` stores the head word before the body.
        CqeHeadBeforeBody = 102,
        /// `CqRing::release` publishes the driver's consumer index `Relaxed`, not `Release`.
        CiRecordRelaxed = 103,
        /// `CqRing::write` ignores the CI record and overwrites entries the driver has not consumed.
        CqFullCheckSkipped = 104,
        /// `shm::ring::push` publishes the producer index `Relaxed`, not `Release`.
        ShmPublishRelaxed = 105,
        /// `shm::ring::wake_needed` skips the SeqCst fence between publishing a frame and reading
        /// the consumer's sleeping flag (the lost wake-up).
        ShmNoFenceBeforeSleepCheck = 106,
        /// `shm::ring::push` skips the SeqCst fence between raising its waiting flag and
        /// re-reading the consumer index (the lost unblock).
        ShmNoFenceBeforeFullRecheck = 107,
        /// `inbox::Inbox::push` publishes a slot `Relaxed`, not `Release`.
        InboxPublishRelaxed = 108,
        /// `inbox::Inbox::push` claims a position with a load and a store, not a
        /// compare-exchange (two senders can claim the same slot).
        InboxClaimLoadStore = 109,
        /// `inbox::Inbox::push` marks the slot it waits on with a load and a store instead of a
        /// read-modify-write (a free in between is overwritten: the lost kick).
        InboxMarkLoadStore = 110,
        /// `source::Life::enter` checks the alive bit with a load and counts the reader with a
        /// second read-modify-write (a deregistration between the two frees memory under a copy).
        SourceCheckThenEnter = 111,
        /// `handoff::RxHandoff::read` reads `want` after the socket read, not before (an ask
        /// made for a datagram that arrived after the read is marked done: the lost read).
        UdpWantAfterRead = 112,
        /// `handoff::RxHandoff::may_tick` skips the SeqCst fence between raising `ticking` and
        /// reading the armed count (the lost wake-up of a user going to sleep).
        UdpNoFenceBeforeArmedCheck = 113,
        /// `inbox::Inbox::run_behind` reads the header of the slot behind the run before
        /// checking that the slot is published (a header a sender is still writing).
        InboxRunReadBeforeCheck = 114,
        /// `wake::arm_fence` issues no fence (an arm that misses a held ACK whose holder missed
        /// the arm).
        ArmNoFence = 115,
        /// `wake::publish_hold` skips the SeqCst fence between publishing the hold and reading
        /// the peer's armed count again (an ACK held while its peer sleeps).
        HoldNoFence = 116,
        /// `wake::publish_hold` does not read the peer's armed count again after publishing
        /// the hold (an ACK held while its peer sleeps).
        HoldNoRecheck = 117,
        /// `wake::run_flagged` does not read the work flag again after unlocking the device (a
        /// flag raised by a thread that found the device taken is lost).
        RunNoRecheck = 118,
    }

    pub use bypass_hal::mutation::Guard;

    /// True while `m` is the active mutant.
    #[inline]
    pub fn active(m: Mutant) -> bool {
        bypass_hal::mutation::is_on(m as u32)
    }

    /// Activates `m` until the returned guard is dropped. Panics if another mutant is active.
    #[must_use = "the mutant is active only while the guard lives"]
    pub fn set(m: Mutant) -> Guard {
        bypass_hal::mutation::switch_on(m as u32)
    }
}
