//! Crate-internal synchronization shim.
//!
//! The rings, doorbells, CQ owner words and device lock import their atomics, cells and mutex from
//! here. Built with `RUSTFLAGS="--cfg loom"`, these are loom's model-checked types, so the models
//! in `loom-tests/` explore every interleaving of the real driver and device code.

#[cfg(loom)]
pub(crate) use loom::cell::UnsafeCell;
#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
#[cfg(loom)]
pub(crate) use loom::sync::{Mutex, MutexGuard};

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
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
