//! Crate-internal synchronization shim.
//!
//! Production code imports atomics from here instead of `std`, so that building with
//! `RUSTFLAGS="--cfg loom"` swaps in loom's model-checked types and loom explores every
//! interleaving of the real code (see `loom-tests/`).

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicU32, Ordering};

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{fence, AtomicU32, Ordering};

/// Loom-only mutation switch: tells the doorbell code to commit one deliberate ordering bug, so
/// the loom models in `loom-tests/` can show that they catch it (their "broken twins"). Compiled
/// only with `--cfg loom`; normal builds have no such switch and no branches on it.
///
/// The switch is a process-wide std (not loom) atomic. Tests that set a mutant must hold a
/// test-wide lock so that no other model runs meanwhile.
#[cfg(loom)]
#[doc(hidden)]
pub mod mutation {
    use std::sync::atomic::{AtomicU32, Ordering};

    /// A deliberate bug the doorbell code commits while it is [`set`].
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    #[repr(u32)]
    pub enum Mutant {
        /// [`ring`](crate::doorbell::ring) stores the producer index without the release fence.
        DoorbellNoFence = 1,
        /// [`MemoryDoorbell::load_acquire`](crate::doorbell::MemoryDoorbell::load_acquire) loads
        /// the producer index `Relaxed`.
        DoorbellLoadRelaxed = 2,
        /// [`SplitQueue::publish`](crate::vfio::virtqueue::SplitQueue::publish) stores the
        /// available index without the release fence.
        VirtqNoFence = 10,
        /// [`SplitQueue::add`](crate::vfio::virtqueue::SplitQueue::add) publishes the available
        /// index before it writes the chain's descriptors.
        VirtqAvailBeforeDesc = 11,
        /// [`SplitQueue::pop_used`](crate::vfio::virtqueue::SplitQueue::pop_used) reads the used
        /// element without the acquire fence after the used index.
        VirtqUsedNoAcquire = 12,
    }

    static ACTIVE: AtomicU32 = AtomicU32::new(0);

    /// True while `m` is the active mutant.
    #[inline]
    pub fn active(m: Mutant) -> bool {
        is_on(m as u32)
    }

    /// Activates `m` until the returned guard is dropped. Panics if another mutant is active.
    #[must_use = "the mutant is active only while the guard lives"]
    pub fn set(m: Mutant) -> Guard {
        switch_on(m as u32)
    }

    /// The one process-wide switch behind every crate's mutants (hal, sim and stack number theirs
    /// in disjoint ranges): true while mutant `id` is on.
    #[inline]
    pub fn is_on(id: u32) -> bool {
        ACTIVE.load(Ordering::Relaxed) == id
    }

    /// Switches mutant `id` on until the returned guard is dropped (also while a failing model
    /// unwinds). Only between loom models, never during one. Panics if a mutant is already on.
    #[must_use = "the mutant is on only while the guard lives"]
    pub fn switch_on(id: u32) -> Guard {
        let prev = ACTIVE.swap(id, Ordering::SeqCst);
        assert_eq!(prev, 0, "another mutant is on (hold the loom test lock)");
        Guard { _private: () }
    }

    /// Switches the mutant off when dropped.
    #[derive(Debug)]
    pub struct Guard {
        _private: (),
    }

    impl Drop for Guard {
        fn drop(&mut self) {
            ACTIVE.store(0, Ordering::SeqCst);
        }
    }
}
