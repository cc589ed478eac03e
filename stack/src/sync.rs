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
