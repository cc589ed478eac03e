//! Queue recovery: a queue that went to ERROR is brought back.
//!
//! The client drives it (the channel's watch in the control loop, which owns the control
//! stream, runs it aside on a short-lived thread, and reads the server's answer on the loop
//! itself, as its bytes arrive); the server answers. For queue `q`:
//!
//! 1. **Fail** (already done when the failure was seen): the queue is marked not READY and moved
//!    to ERROR; the calls outstanding on it fail once with [`RpcError::Queue`](crate::RpcError::Queue)
//!    (the status that failed it); new calls go to the other queues, or fail with
//!    `Queue(Flushed)` while none is READY.
//! 2. **Drain**: a zero-length SEND and a zero-SGE receive with reserved `wr_id`s ([`drain_wr_id`])
//!    are posted behind everything else. Queues flush in order, so once both markers' flush
//!    completions have been polled, every earlier work request of the queue has completed: each
//!    send context is back, and each receive buffer is *parked* (kept for re-posting) — none can
//!    be lost by the reset, which discards unpolled completions.
//! 3. **Reset** the queue (RESET: a new PSN) and read its new [`QueueInfo`](crate::hal::QueueInfo).
//! 4. **Re-exchange** over the control stream: a `QueueReset` frame (control version 3) with
//!    the new info; the server fails, drains and resets its end of the queue the same way,
//!    connects it to the client's new info, re-posts its parked receive buffers, forgets the
//!    credit grants it owed on the old queue, and answers `QueueResetDone` with its own new
//!    info (or a refusal with a reason).
//! 5. **Connect** to the server's new info, re-post the parked receive buffers, refill the
//!    queue's credits to the window, READY again.
//!
//! Requests of the old queue life that a server handler still holds are answered into the void:
//! their replies are not sent (the client already failed those calls), their buffers go back to
//! the new queue. Because such a handler returns its buffer only when it finishes, the server
//! may briefly have fewer receive buffers posted than the client has credits; a request then
//! waits at the NIC (receiver-not-ready retries, `rnr_retry = 7`: forever), it does not fail.
//!
//! **Budget** ([`Recovery`]): each queue may be recovered at most `attempts` times within
//! `window`; an attempt that fails (the drain or the exchange does not finish within `timeout`,
//! the server refuses, a device error, a server answering after `timeout`) counts too and is
//! retried while the budget lasts (a late answer is skipped by the next attempt). When it
//! is spent the channel closes with [`CloseReason::RecoveryExhausted`](crate::CloseReason):
//! outstanding calls fail with `ConnectionBroken(RecoveryExhausted)` and the break callback
//! runs. With `ChannelConfig::recovery = None` nothing is recovered: a failed queue stays failed
//! and the channel closes when none is left (`QueuesFailed`).

use std::time::{Duration, Instant};

/// Queue recovery settings ([`ChannelConfig::recovery`](crate::ChannelConfig::recovery)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recovery {
    /// Most recoveries (successful or not) of one queue within `window`; one more closes the
    /// channel. 1..=1000; default 3.
    pub attempts: u32,
    /// The period `attempts` counts over (non-zero; default 60 s).
    pub window: Duration,
    /// Limit for one attempt: the drain, the exchange with the server and reconnecting
    /// (non-zero; default 5 s).
    pub timeout: Duration,
}

impl Default for Recovery {
    fn default() -> Self {
        Recovery { attempts: 3, window: Duration::from_secs(60), timeout: Duration::from_secs(5) }
    }
}

impl Recovery {
    pub(crate) fn validate(&self, field: &str) -> Result<(), crate::RpcError> {
        use crate::error::bad_field;
        if !(1..=1000).contains(&self.attempts) {
            return Err(bad_field(
                &format!("{field}.attempts"),
                format_args!("is {}: use 1..=1000 (or recovery None to turn it off)", self.attempts),
            ));
        }
        if self.window.is_zero() {
            return Err(bad_field(&format!("{field}.window"), "is zero: use a positive duration"));
        }
        if self.timeout.is_zero() {
            return Err(bad_field(&format!("{field}.timeout"), "is zero: use a positive duration"));
        }
        Ok(())
    }
}

/// Per queue: the attempts counted in the current window.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Budget {
    since: Option<Instant>,
    used: u32,
}

impl Budget {
    pub(crate) const fn new() -> Self {
        Budget { since: None, used: 0 }
    }

    /// Takes one attempt at `now`; false when `policy` allows no more.
    pub(crate) fn take(&mut self, policy: &Recovery, now: Instant) -> bool {
        match self.since {
            Some(t) if now.saturating_duration_since(t) < policy.window => {}
            _ => {
                self.since = Some(now);
                self.used = 0;
            }
        }
        if self.used >= policy.attempts {
            return false;
        }
        self.used += 1;
        true
    }
}

/// `wr_id`s of the drain markers: the top of the `wr_id` space, far above any send context
/// handle's or receive buffer's. Queue `q`'s send marker is `DRAIN_BASE + 2q`, its receive
/// marker `DRAIN_BASE + 2q + 1`.
const DRAIN_BASE: u64 = u64::MAX - 1024;

/// The drain marker `wr_id` of queue `q`, send or receive side.
pub(crate) fn drain_wr_id(q: usize, recv: bool) -> u64 {
    DRAIN_BASE + 2 * q as u64 + u64::from(recv)
}

/// The queue a drain marker `wr_id` belongs to, if it is one.
#[inline]
pub(crate) fn drain_queue(wr_id: u64) -> Option<usize> {
    (wr_id >= DRAIN_BASE).then(|| ((wr_id - DRAIN_BASE) / 2) as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_counts_attempts_per_window() {
        let p = Recovery { attempts: 2, window: Duration::from_secs(10), timeout: Duration::from_secs(1) };
        let t0 = Instant::now();
        let mut b = Budget::new();
        assert!(b.take(&p, t0));
        assert!(b.take(&p, t0 + Duration::from_secs(1)));
        assert!(!b.take(&p, t0 + Duration::from_secs(2)), "a third within the window");
        assert!(b.take(&p, t0 + Duration::from_secs(11)), "a new window");
    }

    #[test]
    fn drain_ids_round_trip() {
        for q in [0, 1, 255] {
            for recv in [false, true] {
                assert_eq!(drain_queue(drain_wr_id(q, recv)), Some(q));
            }
        }
        assert_eq!(drain_queue(0), None);
        assert_eq!(drain_queue(u64::from(u32::MAX) << 32), None);
    }

    #[test]
    fn validation_names_the_field() {
        let bad = Recovery { attempts: 0, ..Recovery::default() };
        assert!(bad
            .validate("ChannelConfig.recovery")
            .unwrap_err()
            .to_string()
            .contains("recovery.attempts"));
        let bad = Recovery { timeout: Duration::ZERO, ..Recovery::default() };
        assert!(bad.validate("ChannelConfig.recovery").unwrap_err().to_string().contains("recovery.timeout"));
    }
}
