//! Queue recovery on the client (see [`crate::conn::recovery`] for the sequence): the channel's watch
//! ([`super::monitor`]), which owns the control stream, brings failed queues back. The work
//! that waits for the device (failing, draining and resetting the queue, then connecting it to
//! the server's answer) runs on a short-lived thread aside from the process's control loop; the
//! server's answer is read on the loop, never blocking, as its bytes arrive ([`Progress`]): the
//! aside threads are shared by every channel and server connection of the process, and a
//! server that sends part of an answer and stops must hold none of them.
//!
//! A server that answers a queue reset late (busy, or its own drain slow) costs one attempt of
//! the budget, not the channel: the client stops waiting at the attempt's `timeout`, counts the
//! exchange as unanswered and tries again. The server answers every reset it read, in order, so
//! the next attempt first reads (and skips) the answers to the exchanges it gave up on; only a
//! frame that is none of those, or the stream's end, ends the connection. An answer cut short
//! costs attempts (each waits its `timeout`) until the budget closes the channel.

#![forbid(unsafe_code)]

use super::ChannelInner;
use crate::conn::liveness::CloseReason;
use crate::conn::recovery::{Budget, Recovery};
use crate::control::session::{self, SessionReader};
use crate::control::{ControlError, QueueReset, QueueResetDone};
use crate::hal::Device;
use crate::sync::lock;
use crate::RpcError;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Which queues wait for recovery, and the budget of each.
pub(super) struct State {
    needs: Box<[AtomicBool]>,
    budgets: Mutex<Vec<Budget>>,
    seq: AtomicU32,
    /// Queue resets sent whose answer the client stopped waiting for (it is still to come, in
    /// order, before the answer to any later reset). Only the recovering thread touches it.
    unanswered: AtomicU32,
    pub(super) recovered: AtomicU64,
}

impl State {
    pub(super) fn new(queues: usize) -> Self {
        State {
            needs: (0..queues).map(|_| AtomicBool::new(false)).collect(),
            budgets: Mutex::new(vec![Budget::new(); queues]),
            seq: AtomicU32::new(0),
            unanswered: AtomicU32::new(0),
            recovered: AtomicU64::new(0),
        }
    }

    /// Queue `q` failed: the control loop is to recover it.
    pub(super) fn request(&self, q: usize) {
        self.needs[q].store(true, Ordering::Release);
        crate::control::reactor::wake();
    }

    /// Whether a queue waits for recovery.
    pub(super) fn pending(&self) -> bool {
        self.needs.iter().any(|n| n.load(Ordering::Acquire))
    }

    fn next(&self) -> Option<usize> {
        self.needs.iter().position(|n| n.swap(false, Ordering::AcqRel))
    }
}

impl State {
    /// Whether an answer numbered `got` is a late one to a reset before `current` that an
    /// attempt gave up on (then it is counted as answered).
    fn take_unanswered(&self, current: u32, got: u32) -> bool {
        let waiting = self.unanswered.load(Ordering::Relaxed);
        // Numbers are handed out in order (wrapping): an earlier exchange's is "behind".
        let age = current.wrapping_sub(got);
        if waiting == 0 || age == 0 || age >= 1 << 31 {
            return false;
        }
        self.unanswered.store(waiting - 1, Ordering::Relaxed);
        true
    }
}

/// Why an attempt failed.
enum Failed {
    /// The control stream broke (or went out of step): the connection is over.
    Stream(ControlError),
    /// This attempt failed; another may succeed.
    Attempt(RpcError),
}

impl From<RpcError> for Failed {
    fn from(e: RpcError) -> Self {
        Failed::Attempt(e)
    }
}

/// An exchange whose answer the control loop waits for.
pub(super) struct Awaiting {
    seq: u32,
    queue: u16,
    /// The attempt's limit: past it the attempt failed (its answer comes later, and is skipped).
    pub(super) deadline: Instant,
    timeout: Duration,
}

/// Where a channel's recovery stands between its trips aside and the control loop, which
/// reads the server's answers as their bytes arrive (a server that sends part of one delays
/// nobody else's recovery: no thread waits for it).
#[derive(Default)]
pub(super) struct Progress {
    /// The queue being recovered, and why its last attempt failed.
    current: Option<(usize, Option<RpcError>)>,
    /// The exchange sent for it, not answered yet.
    pub(super) awaiting: Option<Awaiting>,
    /// What ended that exchange (read or timed out on the loop), to be acted on aside.
    outcome: Option<Result<QueueResetDone, Failed>>,
    /// The answer being read.
    pub(super) reader: SessionReader,
}

/// What the loop made of a frame it read while an answer was awaited.
pub(super) enum Answer {
    /// The awaited answer: the rest is done aside.
    Arrived,
    /// A late answer to an exchange an attempt gave up on: skipped.
    Skipped,
    /// Not an answer the channel can be waiting for: the control stream is out of step.
    Unexpected,
}

impl<D: Device + Clone> ChannelInner<D> {
    /// Recovers the queues that asked for it, each within its budget (aside from the control
    /// loop): acts on the outcome of the exchange the loop saw end, then starts the next
    /// attempt or queue, up to sending its queue reset; the loop reads the answer
    /// ([`ChannelInner::answer_read`]). Returns whether it did anything.
    pub(super) fn recover_pending(
        &self,
        stream: &mut crate::control::ControlStream,
        p: &mut Progress,
    ) -> bool {
        let Some(policy) = self.config.recovery else { return false };
        if p.awaiting.is_some() {
            return false;
        }
        let mut tried = false;
        loop {
            let (q, mut last_failure) = match p.current.take() {
                Some(c) => c,
                None => match self.recovery.next() {
                    Some(q) => (q, None),
                    None => return tried,
                },
            };
            tried = true;
            if let Some(outcome) = p.outcome.take() {
                match outcome.and_then(|a| self.finish_attempt(q, a)) {
                    Ok(()) => {
                        self.recovery.recovered.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    Err(Failed::Stream(e)) => return self.stream_failed(q, e),
                    Err(Failed::Attempt(e)) => {
                        eprintln!(
                            "bypass: channel {}: recovering queue {q} failed ({e}); trying again within its budget",
                            self.channel_id
                        );
                        last_failure = Some(e);
                    }
                }
            }
            if self.ep.is_closed() {
                return tried;
            }
            if !lock(&self.recovery.budgets)[q].take(&policy, Instant::now()) {
                let last = match &last_failure {
                    Some(e) => format!("; the last attempt failed: {e}"),
                    None => String::new(),
                };
                eprintln!(
                    "bypass: channel {}: queue {q} failed past its recovery budget ({} recoveries or attempts \
                     per {:?}){last}; closing the channel (RecoveryExhausted)",
                    self.channel_id, policy.attempts, policy.window
                );
                self.close_with(CloseReason::RecoveryExhausted);
                return tried;
            }
            match self.start_attempt(q, stream, &policy) {
                Ok(awaiting) => {
                    p.current = Some((q, last_failure));
                    p.awaiting = Some(awaiting);
                    return tried;
                }
                Err(Failed::Stream(e)) => return self.stream_failed(q, e),
                Err(Failed::Attempt(e)) => {
                    eprintln!(
                        "bypass: channel {}: recovering queue {q} failed ({e}); trying again within its budget",
                        self.channel_id
                    );
                    p.current = Some((q, Some(e)));
                }
            }
        }
    }

    /// The control stream failed while queue `q` was recovered: the connection is over.
    fn stream_failed(&self, q: usize, e: ControlError) -> bool {
        let reason = match e {
            ControlError::Closed => CloseReason::PeerClosed,
            _ => CloseReason::RecoveryExhausted,
        };
        eprintln!(
            "bypass: channel {}: the control stream failed while recovering queue {q} ({e}); closing",
            self.channel_id
        );
        self.close_with(reason);
        true
    }

    /// The first part of an attempt, aside: drain, reset, send the queue reset.
    fn start_attempt(
        &self,
        q: usize,
        stream: &mut crate::control::ControlStream,
        policy: &Recovery,
    ) -> Result<Awaiting, Failed> {
        let deadline = Instant::now() + policy.timeout;
        self.ep.fail_queue(q);
        self.ep.drain(q, deadline, || {
            if self.poll() == 0 {
                self.ep.device.progress();
            }
        })?;
        let info = self.ep.reset_queue(q)?;
        let seq = self.recovery.seq.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
        let queue = u16::try_from(q).map_err(|_| RpcError::InvalidArgument(format!("queue {q}")))?;
        let frame = QueueReset { seq, queue, info }.encode().map_err(RpcError::from)?;
        // A ~60-byte frame: a socket that does not take it at once belongs to a server that
        // reads nothing.
        session::write_frame_now(stream, &frame).map_err(Failed::Stream)?;
        Ok(Awaiting { seq, queue, deadline, timeout: policy.timeout })
    }

    /// On the loop: a queue reset answer `a` was read while `p` awaits one.
    pub(super) fn answer_read(&self, p: &mut Progress, a: QueueResetDone) -> Answer {
        let Some(w) = &p.awaiting else { return Answer::Unexpected };
        if a.seq == w.seq && a.queue == w.queue {
            p.awaiting = None;
            p.outcome = Some(Ok(a));
            Answer::Arrived
        } else if self.recovery.take_unanswered(w.seq, a.seq) {
            Answer::Skipped
        } else {
            p.outcome = Some(Err(Failed::Stream(ControlError::Malformed(format!(
                "expected the answer to queue reset {} of queue {}, got one to reset {} of queue {}",
                w.seq, w.queue, a.seq, a.queue
            )))));
            p.awaiting = None;
            Answer::Unexpected
        }
    }

    /// On the loop: the awaited answer did not come by its deadline. That attempt failed; its
    /// answer comes later, before the answer to any later reset, and is skipped then.
    pub(super) fn answer_late(&self, p: &mut Progress) {
        let Some(w) = p.awaiting.take() else { return };
        self.recovery.unanswered.fetch_add(1, Ordering::Relaxed);
        p.outcome = Some(Err(Failed::Attempt(RpcError::Control(ControlError::Io(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!(
                "the server did not answer queue reset {} of queue {} within the recovery timeout ({:?})",
                w.seq, w.queue, w.timeout
            ),
        ))))));
    }

    /// On the loop: the control stream ended or failed while an answer was awaited.
    pub(super) fn answer_lost(&self, p: &mut Progress, e: ControlError) {
        p.awaiting = None;
        p.outcome = Some(Err(Failed::Stream(e)));
    }

    /// The rest of an attempt, aside: connect to the server's new queue, refill the credits.
    fn finish_attempt(&self, q: usize, answer: QueueResetDone) -> Result<(), Failed> {
        let peer = answer.result.map_err(|reason| RpcError::Control(ControlError::Rejected(reason)))?;
        // Every call of the old queue life has failed and the server re-posted its buffers. (No
        // call takes this queue's credits before it is READY.)
        let c = &self.credits[q];
        let _ = c.give(c.limit().saturating_sub(c.available()));
        self.ep.reconnect_queue(q, &peer)?;
        Ok(())
    }
}
