//! Time as the device sees it: real (for the Inline and Threaded engines) or virtual (advanced
//! only by the test, for the Stepped engine).
//!
//! Real time is the kernel's coarse monotonic clock: reading it costs a few nanoseconds, against
//! about twenty for the precise clock, and the device reads it on every run. Its resolution (a
//! few milliseconds, the kernel tick) is the granularity of real-time transport timers — like a
//! NIC whose timers count in coarse units, never early, at most one tick late.

use crate::sync::{AtomicU64, Ordering};

/// Nanoseconds since the fabric was created.
pub(crate) type Nanos = u64;

/// "No deadline".
pub(crate) const NEVER: Nanos = u64::MAX;

#[derive(Debug)]
pub(crate) enum Clock {
    /// Coarse monotonic nanoseconds at creation.
    Real(Nanos),
    Virtual(AtomicU64),
}

fn coarse_monotonic() -> Nanos {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec to the valid pointer we pass; the coarse monotonic
    // clock exists on every Linux since 2.6.32, and we fall back to 0 on failure.
    if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) } != 0 {
        return 0;
    }
    ts.tv_sec as Nanos * 1_000_000_000 + ts.tv_nsec as Nanos
}

impl Clock {
    pub(crate) fn real() -> Self {
        Clock::Real(coarse_monotonic())
    }

    pub(crate) fn now(&self) -> Nanos {
        match self {
            Clock::Real(start) => coarse_monotonic().saturating_sub(*start),
            Clock::Virtual(t) => t.load(Ordering::Acquire),
        }
    }

    /// Moves virtual time forward; a no-op on a real clock.
    pub(crate) fn advance(&self, by: Nanos) {
        if let Clock::Virtual(t) = self {
            t.fetch_add(by, Ordering::AcqRel);
        }
    }
}
