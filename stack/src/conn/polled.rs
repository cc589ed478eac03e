//! When a batch of completions was polled, told in queue lives: what lets a recovered queue
//! ignore the flushes of its earlier life that a slow poller hands in late.

/// When a batch of completions was polled, in terms of the queues' lives: the count of polls of
/// its CQ that returned a failed completion, this one included (counted under the CQ's lock).
///
/// A failed completion (an error, or a flush) of queue `q` is from an earlier life of `q` when
/// its batch was polled before `q`'s current life began (at its reset). That happens: a poller
/// takes a batch of flushes, and before it handles them the queue is drained (by other
/// pollers: the drain waits for its markers, which come after every flush, not for the threads
/// holding them), reset, re-exchanged and perhaps reconnected. Such a flush is not a failure of
/// the queue's current life ([`fail_queue_polled`]). Recovery resets a queue only after it saw
/// the drain markers, so every batch that held a completion of the old life was polled, and
/// counted, before the count it records; a failure of the new life is polled after the queue is
/// connected again, and counts higher.
///
/// [`fail_queue_polled`]: super::endpoint::Endpoint::fail_queue_polled
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Polled {
    pub(super) cq: usize,
    pub(super) seq: u64,
}

/// [`Polled::cq`] of the send CQ and of the receive CQ.
pub(super) const SEND: usize = 0;
pub(super) const RECV: usize = 1;
