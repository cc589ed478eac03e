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

/// Locks a (std) mutex; a poisoned mutex (a thread panicked while holding it) is still usable
/// here because every critical section leaves its data consistent before anything can panic.
#[cfg(not(loom))]
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
