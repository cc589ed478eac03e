//! Crate-internal synchronization shim.
//!
//! Production code imports atomics from here instead of `std`, so that building with
//! `RUSTFLAGS="--cfg loom"` swaps in loom's model-checked types and loom explores every
//! interleaving of the real code (see `loom-tests/`).

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicU32, Ordering};

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{fence, AtomicU32, Ordering};
