//! Queue recovery on the client (see [`crate::conn::recovery`] for the sequence): the channel's watch
//! ([`super::monitor`]), which owns the control stream, brings failed queues back, on a
//! short-lived thread aside from the process's control loop.
//!
//! A server that answers a queue reset late (busy, or its own drain slow) costs one attempt of
//! the budget, not the channel: the client stops waiting at the attempt's `timeout`, counts the
//! exchange as unanswered and tries again. The server answers every reset it read, in order, so
//! the next attempt first reads (and skips) the answers to the exchanges it gave up on; only a
//! frame that is none of those, or a stream cut in the middle of a frame, ends the connection.

#![forbid(unsafe_code)]

use super::ChannelInner;
use crate::conn::liveness::CloseReason;
use crate::conn::recovery::{Budget, Recovery};
use crate::control::session::{self, SessionFrame};
use crate::control::{ControlError, ControlIo, QueueReset};
use crate::hal::Device;
use crate::sync::lock;
use crate::RpcError;
use std::os::fd::AsRawFd;
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

/// Waits until the control stream has bytes to read, or `deadline` passes (false then).
fn answer_waiting(stream: &mut crate::control::ControlStream, deadline: Instant) -> bool {
    loop {
        if stream.buffered() > 0 {
            return true;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        let ms = left.max(Duration::from_millis(1)).as_millis().min(i32::MAX as u128) as libc::c_int;
        let mut fds = [libc::pollfd { fd: stream.tcp().as_raw_fd(), events: libc::POLLIN, revents: 0 }];
        match crate::os::poll(&mut fds, ms) {
            0 => {}
            n if n > 0 => return true,
            // Interrupted: look at the clock again. Another error: let the read report it.
            _ if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted => {}
            _ => return true,
        }
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

impl<D: Device + Clone> ChannelInner<D> {
    /// Recovers the queues that asked for it, each within its budget (aside from the control loop). Returns
    /// whether it tried any.
    pub(super) fn recover_pending(&self, stream: &mut crate::control::ControlStream) -> bool {
        let Some(policy) = self.config.recovery else { return false };
        let mut tried = false;
        while let Some(q) = self.recovery.next() {
            tried = true;
            let mut last_failure: Option<RpcError> = None;
            loop {
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
                match self.recover_queue(q, stream, &policy) {
                    Ok(()) => {
                        self.recovery.recovered.fetch_add(1, Ordering::Relaxed);
                        break;
                    }
                    Err(Failed::Stream(e)) => {
                        let reason = match e {
                            ControlError::Closed => CloseReason::PeerClosed,
                            _ => CloseReason::RecoveryExhausted,
                        };
                        eprintln!(
                            "bypass: channel {}: the control stream failed while recovering queue {q} ({e}); \
                             closing",
                            self.channel_id
                        );
                        self.close_with(reason);
                        return tried;
                    }
                    Err(Failed::Attempt(e)) => {
                        eprintln!(
                            "bypass: channel {}: recovering queue {q} failed ({e}); trying again within its budget",
                            self.channel_id
                        );
                        last_failure = Some(e);
                    }
                }
            }
        }
        tried
    }

    /// One attempt: drain, reset, exchange, reconnect, refill the credits.
    fn recover_queue(
        &self,
        q: usize,
        stream: &mut crate::control::ControlStream,
        policy: &Recovery,
    ) -> Result<(), Failed> {
        let started = Instant::now();
        let deadline = started + policy.timeout;
        let left =
            || deadline.saturating_duration_since(Instant::now()).max(std::time::Duration::from_millis(1));
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
        session::write_frame(stream, &frame, left()).map_err(Failed::Stream)?;
        let answer = loop {
            if !answer_waiting(stream, deadline) {
                // The server is slow: this attempt is over, its answer comes later.
                self.recovery.unanswered.fetch_add(1, Ordering::Relaxed);
                return Err(Failed::Attempt(RpcError::Control(ControlError::Io(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!(
                        "the server did not answer queue reset {seq} of queue {q} within the recovery timeout \
                         ({:?})",
                        policy.timeout
                    ),
                )))));
            }
            match session::read_frame(stream, left()).map_err(Failed::Stream)? {
                SessionFrame::QueueResetDone(a) if a.seq == seq && a.queue == queue => break a,
                // The late answer to an exchange an earlier attempt gave up on: skipped.
                SessionFrame::QueueResetDone(a) if self.recovery.take_unanswered(seq, a.seq) => {}
                other => {
                    return Err(Failed::Stream(ControlError::Malformed(format!(
                        "expected the answer to queue reset {seq} of queue {q}, got {other:?}"
                    ))))
                }
            }
        };
        let peer = answer.result.map_err(|reason| RpcError::Control(ControlError::Rejected(reason)))?;
        // Every call of the old queue life has failed and the server re-posted its buffers. (No
        // call takes this queue's credits before it is READY.)
        let c = &self.credits[q];
        let _ = c.give(c.limit().saturating_sub(c.available()));
        self.ep.reconnect_queue(q, &peer)?;
        Ok(())
    }
}
