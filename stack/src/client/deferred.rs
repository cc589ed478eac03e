//! Deliveries the control loop hands on instead of making them.
//!
//! The loop ([`crate::control::reactor`]) is one thread for every connection in the process, so it runs
//! no application code: a completion callback or a break callback that blocked there would stall
//! every other connection's keepalive and closing. When the loop itself finishes a call — a
//! keepalive look that polls an idle channel, a queue failure it finds there — the outcome of a
//! callback call is copied out (cold path: this is the one place a delivery allocates) and kept
//! here, with a break callback that became due; the channel's watch then goes aside
//! ([`crate::control::reactor::Step::Aside`]) and the short-lived aside thread runs them, in the order
//! they were finished. Blocking calls and futures are woken on the loop as usual: waking runs no
//! application code but the future's waker.

#![forbid(unsafe_code)]

use crate::client::delivery::Sink;
use crate::conn::liveness::CloseReason;
use crate::wire::FunctionId;
use crate::RpcError;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// One delivery kept for the aside thread.
pub(super) enum Deferred {
    /// A callback call's outcome, copied.
    Call { sink: Sink, function: FunctionId, result: Result<Vec<u8>, RpcError> },
    /// The break callback, with the reason the channel closed.
    Break(Box<dyn FnOnce(CloseReason) + Send>, CloseReason),
}

/// The deliveries a channel's watch has to run aside.
#[derive(Default)]
pub(super) struct DeferredList {
    items: Mutex<Vec<Deferred>>,
    /// Whether `items` may be non-empty (so the loop's check after each event takes no lock).
    any: AtomicBool,
}

impl DeferredList {
    pub(super) fn push(&self, d: Deferred) {
        crate::sync::lock(&self.items).push(d);
        self.any.store(true, Ordering::Release);
    }

    /// Whether something waits to be run.
    pub(super) fn pending(&self) -> bool {
        self.any.load(Ordering::Acquire)
    }

    /// Takes everything kept so far, in order.
    pub(super) fn take(&self) -> Vec<Deferred> {
        if !self.pending() {
            return Vec::new();
        }
        let mut items = crate::sync::lock(&self.items);
        self.any.store(false, Ordering::Release);
        std::mem::take(&mut *items)
    }
}
