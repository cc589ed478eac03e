//! A connection's watch in the process's control loop ([`crate::control::reactor`]) on the server.
//!
//! The client's control stream is read on the loop, never blocking: its socket is non-blocking
//! and a [`SessionReader`] takes each frame's bytes as they arrive. A peer that sends part of a
//! frame and stops costs only itself: the rest must come within [`FRAME_TIMEOUT`] of the
//! frame's first byte, or the connection is closed ([`CloseReason::PeerClosed`]). The stream
//! closing, or carrying anything but a well-formed queue reset, closes the connection.
//!
//! A queue reset, once whole, is checked against the connection's budget
//! ([`ServerConfig::max_queue_resets`](crate::ServerConfig::max_queue_resets)): past it the
//! reset is refused on the loop, at once. Within it the reset itself (failing, draining and
//! reconnecting a queue, which waits for the worker) runs aside, on a short-lived thread (see
//! [`crate::conn::recovery`]); no peer's bytes are ever read there. Answers are written
//! without blocking: a peer whose socket does not take a ~100-byte answer is not reading its
//! side, and is closed. Keepalive silence is judged on the loop's timers (see
//! [`crate::conn::liveness`]). A connection the loop finds over is closed aside as well, so its
//! break callback and its rendezvous memory's release (a custom allocator) never run on the
//! loop.

#![forbid(unsafe_code)]

use super::Conn;
use crate::conn::liveness::{limit_while_moving, CloseReason, Keepalive, Silence, RNDV_BYTES_PER_LIMIT};
use crate::conn::recovery::{Budget, Recovery};
use crate::control::reactor::{Step, Watch};
use crate::control::session::{self, QueueReset, ReadStep, SessionFrame, SessionReader};
use crate::control::{ControlIo, ControlStream, QueueResetDone};
use crate::hal::Device;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// Limit for the rest of a control frame once its first byte is there (and for the server's
/// drain of a queue it resets).
pub(crate) const FRAME_TIMEOUT: Duration = Duration::from_secs(5);

/// Most frames one readiness event reads before the loop moves on to other connections (the
/// socket stays readable: the loop comes back to it).
const FRAMES_PER_LOOK: usize = 8;

/// A server connection's control stream and keepalive timer, as the control loop watches them.
pub(super) struct ConnWatch<D: Device + Clone> {
    stream: ControlStream,
    conn: Weak<Conn<D>>,
    keepalive: Option<Keepalive>,
    /// The connection's queues retransmit on an ACK timeout, so each READ or WRITE they post
    /// completes or fails within the transport's retry budget (with no timer, one to a dead
    /// peer would wait forever).
    transport_bounded: bool,
    silence: Silence,
    next_look: Option<Instant>,
    /// The loop found the connection over, for this reason: it is closed aside.
    closing: Option<CloseReason>,
    /// The frame being read.
    reader: SessionReader,
    /// A queue reset read and within budget: carried out aside.
    reset: Option<QueueReset>,
    /// Queue resets this connection may still ask for, and the policy they count against.
    budget: Budget,
    policy: Recovery,
}

impl<D: Device + Clone> ConnWatch<D> {
    /// Watches `stream` (made non-blocking here) for connection `conn` of `queues` queues, which
    /// may ask for `max_resets` queue resets per queue per [`QUEUE_RESET_WINDOW`];
    /// `transport_bounded`: the queues have an ACK timeout (see the field).
    ///
    /// [`QUEUE_RESET_WINDOW`]: crate::QUEUE_RESET_WINDOW
    pub(super) fn new(
        stream: ControlStream,
        conn: Weak<Conn<D>>,
        keepalive: Option<Keepalive>,
        transport_bounded: bool,
        queues: usize,
        max_resets: u32,
    ) -> std::io::Result<Self> {
        stream.tcp().set_nonblocking(true)?;
        let now = Instant::now();
        let queues = u32::try_from(queues).unwrap_or(u32::MAX);
        Ok(ConnWatch {
            stream,
            conn,
            keepalive,
            transport_bounded,
            silence: Silence::new(now),
            next_look: keepalive.map(|k| now + k.tick()),
            closing: None,
            reader: SessionReader::default(),
            reset: None,
            budget: Budget::new(),
            policy: Recovery {
                attempts: max_resets.saturating_mul(queues),
                window: crate::limits::QUEUE_RESET_WINDOW,
                timeout: FRAME_TIMEOUT,
            },
        })
    }

    /// The frame being read must be whole by then.
    fn frame_deadline(&self) -> Option<Instant> {
        self.reader.begun().map(|t| t + FRAME_TIMEOUT)
    }

    /// Closes the connection aside, for `reason`.
    fn close_aside(&mut self, reason: CloseReason) -> Step {
        self.closing = Some(reason);
        Step::Aside
    }

    /// A whole queue reset from the client: within the budget it is done aside; past it, it is
    /// refused here, at once.
    fn on_reset(&mut self, r: QueueReset, now: Instant) -> Option<Step> {
        if self.budget.take(&self.policy, now) {
            self.reset = Some(r);
            return Some(Step::Aside);
        }
        let refusal = QueueResetDone {
            seq: r.seq,
            queue: r.queue,
            result: Err(format!(
                "refused: this connection asked for more queue resets than the server allows ({} per \
                 {:?}: ServerConfig.max_queue_resets per queue); a queue that keeps failing needs its \
                 cause fixed",
                self.policy.attempts, self.policy.window
            )),
        };
        match refusal.encode().and_then(|frame| session::write_frame_now(&mut self.stream, &frame)) {
            Ok(()) => None,
            Err(_) => Some(self.close_aside(CloseReason::PeerClosed)),
        }
    }

    fn open(&self) -> Option<Arc<Conn<D>>> {
        self.conn.upgrade().filter(|c| !c.ep.is_closed())
    }
}

impl<D: Device + Clone + 'static> Watch for ConnWatch<D> {
    fn fd(&self) -> RawFd {
        self.stream.tcp().as_raw_fd()
    }

    fn has_buffered(&mut self) -> bool {
        self.stream.buffered() > 0
    }

    /// The one place the connection is closed (and its break callback runs) on the loop: the
    /// loop lets go of it after a panic of its own, or is going away.
    fn abandon(&mut self) {
        if let Some(c) = self.open() {
            c.close_with(self.closing.take().unwrap_or(CloseReason::ControlLost));
        }
    }

    fn on_readable(&mut self) -> Step {
        if self.open().is_none() {
            return Step::Done;
        }
        for _ in 0..FRAMES_PER_LOOK {
            match self.reader.read(&mut self.stream) {
                ReadStep::Pending => return Step::Keep,
                ReadStep::Closed => return self.close_aside(CloseReason::PeerClosed),
                ReadStep::Frame(Ok(SessionFrame::QueueReset(r))) => {
                    if let Some(step) = self.on_reset(r, Instant::now()) {
                        return step;
                    }
                }
                // Anything else is a protocol error: the client is broken or hostile.
                ReadStep::Frame(Ok(SessionFrame::QueueResetDone(_)) | Err(_)) => {
                    return self.close_aside(CloseReason::PeerClosed)
                }
            }
        }
        // More frames wait. On plain TCP the socket is still readable and the loop comes back
        // after the others; bytes inside a TLS session would not wake it, so a trip aside (which
        // does nothing) hands the connection back, and its registration reads them.
        if self.stream.buffered() > 0 {
            Step::Aside
        } else {
            Step::Keep
        }
    }

    fn on_timer(&mut self, now: Instant) -> Step {
        let Some(c) = self.open() else { return Step::Done };
        if self.frame_deadline().is_some_and(|d| now >= d) {
            // Part of a frame, and the rest never came: this peer is closed, nobody else waits.
            return self.close_aside(CloseReason::PeerClosed);
        }
        let (Some(k), Some(at)) = (self.keepalive, self.next_look) else { return Step::Keep };
        if now < at {
            return Step::Keep;
        }
        self.next_look = Some(now + k.tick());
        if c.live.frozen.load(Ordering::Acquire) {
            self.silence.restart(now);
            return Step::Keep;
        }
        let posted = c.rndv.posted();
        if posted > 0 && self.transport_bounded {
            // The connection is moving its own rendezvous data, which may hold up the client's
            // messages (behind READ responses on its NIC) and its probes (whose answers wait
            // behind our WRITEs): the RC transport watches the client meanwhile — each READ or
            // WRITE completes, or fails the queue after its retries. Silence counts from the
            // transfer's end (see `conn::liveness`).
            self.silence.restart(now);
            return Step::Keep;
        }
        let quiet = self.silence.look(&c.live, now, k.stall());
        // Without a retransmission timer, only time bounds a transfer: a limit more per chunk
        // in flight, as on the client.
        let moving = (posted as u64).saturating_mul(RNDV_BYTES_PER_LIMIT);
        if c.live.server_limit(&k).is_some_and(|limit| k.expired(quiet, limit_while_moving(limit, moving))) {
            return self.close_aside(CloseReason::KeepaliveTimeout);
        }
        Step::Keep
    }

    fn on_wake(&mut self) -> Step {
        if self.open().is_some() {
            Step::Keep
        } else {
            Step::Done
        }
    }

    fn deadline(&self) -> Option<Instant> {
        match (self.next_look, self.frame_deadline()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Closes the connection the loop found over; else carries out the queue reset the loop read,
    /// and writes the answer (without blocking: a client that does not read it is closed).
    fn aside(&mut self) -> bool {
        let Some(c) = self.open() else { return false };
        if let Some(reason) = self.closing.take() {
            c.close_with(reason);
            return false;
        }
        let Some(r) = self.reset.take() else { return true };
        let answered =
            c.reset_queue(&r).encode().and_then(|frame| session::write_frame_now(&mut self.stream, &frame));
        if answered.is_err() {
            c.close_with(CloseReason::PeerClosed);
            return false;
        }
        // The reset took a while; the silence meanwhile is ours, not the client's.
        let now = Instant::now();
        self.silence.restart(now);
        self.next_look = self.keepalive.map(|k| now + k.tick());
        !c.ep.is_closed()
    }
}
