//! Time as the device sees it: real (monotonic, for the Inline and Threaded engines) or virtual
//! (advanced only by the test, for the Stepped engine).

use crate::sync::{AtomicU64, Ordering};
use std::time::Instant;

/// Nanoseconds since the fabric was created.
pub(crate) type Nanos = u64;

/// "No deadline".
pub(crate) const NEVER: Nanos = u64::MAX;

#[derive(Debug)]
pub(crate) enum Clock {
    Real(Instant),
    Virtual(AtomicU64),
}

impl Clock {
    pub(crate) fn now(&self) -> Nanos {
        match self {
            Clock::Real(start) => start.elapsed().as_nanos() as Nanos,
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
