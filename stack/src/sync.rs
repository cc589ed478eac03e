//! Crate-internal synchronization shim.
//!
//! The stack's concurrent code (the tx_ctx slab, the request table, and later credits and channel
//! state) imports its atomics, `Arc`, `Mutex` and `UnsafeCell` from here instead of `std`. Built
//! with `RUSTFLAGS="--cfg loom"`, these are loom's model-checked types, so the models in
//! `loom-tests/` explore every interleaving of the real stack code rather than of a copy.
//!
//! Rules for code using the shim:
//!
//! - no `static` atomics or mutexes: loom's types are not const-constructible and must be created
//!   inside a loom model;
//! - `UnsafeCell` is used through the closure API (`with` / `with_mut`) on both builds;
//! - every loop that waits for another thread calls [`spin_loop_hint`], which yields under loom
//!   (a loop that only retries a failed compare-exchange does not need it).
//!
//! The shim is a superset of what the stack uses today, hence the `allow` below.

#![allow(unused_imports, dead_code)]

#[cfg(loom)]
pub(crate) use loom::cell::UnsafeCell;
#[cfg(loom)]
pub(crate) use loom::sync::atomic::{
    fence, AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering,
};
#[cfg(loom)]
pub(crate) use loom::sync::{Arc, Mutex, MutexGuard};

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{
    fence, AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering,
};
#[cfg(not(loom))]
pub(crate) use std::sync::{Arc, Mutex, MutexGuard};

/// `std::cell::UnsafeCell` with loom's closure-based API, so code is written once for both builds.
#[cfg(not(loom))]
#[derive(Debug, Default)]
pub(crate) struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

#[cfg(not(loom))]
impl<T> UnsafeCell<T> {
    /// Wraps `v`.
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

/// Hint for the body of a loop that waits for another thread to make progress.
///
/// Under loom this yields to the model scheduler (a spin loop that never yields makes loom
/// explore an unbounded number of iterations); otherwise it is [`std::hint::spin_loop`].
#[inline(always)]
pub(crate) fn spin_loop_hint() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    std::hint::spin_loop();
}

/// Loom-only mutation switch: lets `loom-tests` run a *broken twin* of each model against this
/// crate's real code, to show that the model can fail.
///
/// Each [`Mutant`] names one deliberately wrong variant of one step (a load-then-store instead of
/// a compare-exchange, a missing id check, …). The production code checks [`enabled`] only inside
/// `#[cfg(loom)]` blocks marked `MUTANT`; in a normal build this module and every such branch do
/// not exist. The switch is a plain `std` atomic, not loom's: it is set before a model starts and
/// read-only while it runs, so loom must not treat it as shared state to explore. Being global, a
/// mutant affects every model in the process while it is set: the loom test binaries serialize
/// their models on a lock for that reason (`bypass_loom_tests::check`).
#[cfg(loom)]
#[doc(hidden)]
pub mod mutation {

    /// One deliberate bug, switched on by a loom twin with [`set`] (at most one at a time).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    #[repr(u32)]
    pub enum Mutant {
        /// `tx_ctx`: a report loads the state word and stores the new one instead of
        /// compare-exchanging it (lost updates, double or missing release).
        TxReportLoadStore = 201,
        /// `tx_ctx`: `claim_completion` loads, checks `CLAIMED` and stores (two winners).
        TxClaimLoadStore,
        /// `tx_ctx`: the release condition ignores a won claim's hold (`HELD`), so the context can
        /// be released and reused while the claim winner is still taking the call's state out.
        TxClaimNoHold,
        /// `req_table`: `complete` takes whatever request the slot holds, without checking the
        /// id, with a plain store (a stale response reaches the slot's next request).
        ReqCompleteNoIdCheck,
        /// `req_table`: `peek` returns the value without re-checking the state word afterwards.
        ReqPeekNoRecheck,
        /// `free_list`: push and pop do not advance the head's tag (ABA).
        FreeListNoTag,
        /// `buf_pool`: `from_token` checks for `POSTED` with a load, then stores `HELD`.
        BufFromTokenLoadStore,
        /// `credits`: `try_take` checks the count with a load, then stores the difference.
        CreditsTakeLoadStore,
        /// `credits`: `give` never wakes registered waiters (a lost wakeup).
        CreditsGiveNoWake,
    }

    pub use bypass_hal::mutation::Guard;

    /// Whether `mutant` is on.
    #[inline]
    pub fn enabled(mutant: Mutant) -> bool {
        bypass_hal::mutation::is_on(mutant as u32)
    }

    /// Switches `mutant` on until the returned guard is dropped (also while a failing model
    /// unwinds). Only between loom models, never during one. Panics if a mutant is already on.
    #[must_use = "the mutant is on only while the guard lives"]
    pub fn set(mutant: Mutant) -> Guard {
        bypass_hal::mutation::switch_on(mutant as u32)
    }
}

/// What [`lock`] can take: a std mutex or a [`SpinLock`].
#[cfg(not(loom))]
pub(crate) trait Lockable {
    /// The guard that holds the lock.
    type Guard<'a>
    where
        Self: 'a;
    /// Takes the lock, waiting for it.
    fn acquire(&self) -> Self::Guard<'_>;
}

#[cfg(not(loom))]
impl<T> Lockable for std::sync::Mutex<T> {
    type Guard<'a>
        = std::sync::MutexGuard<'a, T>
    where
        T: 'a;

    fn acquire(&self) -> Self::Guard<'_> {
        self.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A lock behind an `Arc` (what `&Arc<Mutex<T>>` deref-coerced to with a non-generic `lock`).
#[cfg(not(loom))]
impl<L: Lockable> Lockable for std::sync::Arc<L> {
    type Guard<'a>
        = L::Guard<'a>
    where
        L: 'a;

    fn acquire(&self) -> Self::Guard<'_> {
        (**self).acquire()
    }
}

#[cfg(not(loom))]
impl<T> Lockable for SpinLock<T> {
    type Guard<'a>
        = SpinGuard<'a, T>
    where
        T: 'a;

    fn acquire(&self) -> Self::Guard<'_> {
        self.lock()
    }
}

/// Locks a std mutex or a [`SpinLock`]; a poisoned mutex (a thread panicked while holding it)
/// is still usable here because every critical section leaves its data consistent before
/// anything can panic.
#[cfg(not(loom))]
pub(crate) fn lock<L: Lockable>(m: &L) -> L::Guard<'_> {
    m.acquire()
}

/// A lock for the data path's short critical sections: a completion queue's poll, a queue's
/// post, a call's slot, a worker's outbox. Taking it is one compare-exchange and giving it back
/// a plain release store, where a std mutex gives back with a second locked read-modify-write
/// (a swap, to learn whether a thread sleeps on it): one locked instruction instead of two per
/// critical section, and on the call path these sections come a dozen times per round trip.
/// (rdma-core's providers guard their queues' post paths with spin locks for the same reason.)
///
/// A waiter spins briefly, then yields its CPU between tries (it never sleeps in the kernel):
/// on this stack the sections are short and mostly uncontended, and the pollers that do meet
/// use [`SpinLock::try_lock`] and move on. Not for sections that block (the longest one here is
/// a CQ poll that runs the simulated device inline, or an ACK waking a call's waker). No
/// poisoning: a panic while held releases the lock (the guard's drop), as [`lock`] treats a
/// poisoned std mutex. Not modelled by loom (the loom build has no data path).
#[cfg(not(loom))]
pub(crate) struct SpinLock<T> {
    held: std::sync::atomic::AtomicBool,
    value: std::cell::UnsafeCell<T>,
}

// SAFETY: the lock hands out access to `value` to one thread at a time (a guard exists only
// after winning the compare-exchange from false to true, and its drop stores false), so sharing
// the lock moves `T` between threads but never shares it: `T: Send` suffices, as for a mutex.
#[cfg(not(loom))]
unsafe impl<T: Send> Sync for SpinLock<T> {}

#[cfg(not(loom))]
impl<T> SpinLock<T> {
    /// An unlocked lock holding `value`.
    pub(crate) const fn new(value: T) -> Self {
        SpinLock { held: std::sync::atomic::AtomicBool::new(false), value: std::cell::UnsafeCell::new(value) }
    }

    /// Takes the lock if it is free, without waiting.
    #[inline]
    pub(crate) fn try_lock(&self) -> Option<SpinGuard<'_, T>> {
        use std::sync::atomic::Ordering::{Acquire, Relaxed};
        // A plain load first: a compare-exchange on a held lock would still take its cache line.
        if self.held.load(Relaxed) || self.held.compare_exchange(false, true, Acquire, Relaxed).is_err() {
            return None;
        }
        Some(SpinGuard { lock: self })
    }

    /// Takes the lock, waiting for it: spinning for a few tries, then yielding between tries.
    #[inline]
    pub(crate) fn lock(&self) -> SpinGuard<'_, T> {
        if let Some(g) = self.try_lock() {
            return g;
        }
        self.lock_contended()
    }

    #[cold]
    fn lock_contended(&self) -> SpinGuard<'_, T> {
        let mut spins = 0u32;
        loop {
            if let Some(g) = self.try_lock() {
                return g;
            }
            spins = spins.saturating_add(1);
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// The value, through exclusive access to the lock (no locking needed).
    pub(crate) fn get_mut(&mut self) -> &mut T {
        self.value.get_mut()
    }
}

#[cfg(not(loom))]
impl<T: Default> Default for SpinLock<T> {
    fn default() -> Self {
        SpinLock::new(T::default())
    }
}

/// Holds a [`SpinLock`]; gives it back when dropped.
#[cfg(not(loom))]
pub(crate) struct SpinGuard<'a, T> {
    lock: &'a SpinLock<T>,
}

#[cfg(not(loom))]
impl<T> std::ops::Deref for SpinGuard<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        // SAFETY: the guard exists only while this thread holds the lock, so no other reference
        // to the value exists (see `SpinLock`'s `Sync`).
        unsafe { &*self.lock.value.get() }
    }
}

#[cfg(not(loom))]
impl<T> std::ops::DerefMut for SpinGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`; `&mut self` makes this the only reference through the guard.
        unsafe { &mut *self.lock.value.get() }
    }
}

#[cfg(not(loom))]
impl<T> Drop for SpinGuard<'_, T> {
    fn drop(&mut self) {
        // Release: the section's writes are visible to the next holder (whose take acquires).
        self.lock.held.store(false, std::sync::atomic::Ordering::Release);
    }
}

#[cfg(all(test, not(loom)))]
mod spin_tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn try_lock_fails_while_held_and_succeeds_after() {
        let l = SpinLock::new(5u32);
        let g = l.try_lock().expect("free");
        assert!(l.try_lock().is_none(), "held");
        drop(g);
        *lock(&l) += 1;
        assert_eq!(*l.try_lock().expect("free again"), 6);
    }

    #[test]
    fn threads_incrementing_under_the_lock_lose_nothing() {
        const THREADS: u64 = 4;
        const ITERS: u64 = 50_000;
        let l = Arc::new(SpinLock::new(0u64));
        let threads: Vec<_> = (0..THREADS)
            .map(|_| {
                let l = Arc::clone(&l);
                std::thread::spawn(move || {
                    for _ in 0..ITERS {
                        // A non-atomic read-modify-write: only mutual exclusion keeps it exact.
                        let mut g = l.lock();
                        let v = *g;
                        std::hint::black_box(&mut *g);
                        *g = v + 1;
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("thread panicked");
        }
        assert_eq!(*lock(&*l), THREADS * ITERS);
    }

    #[test]
    fn a_panic_while_held_gives_the_lock_back() {
        let l = SpinLock::new(1u32);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _g = l.lock();
            panic!("in the section");
        }));
        assert!(r.is_err());
        assert_eq!(*l.try_lock().expect("given back by the unwind"), 1);
    }
}
