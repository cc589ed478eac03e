//! A connection's watch in the process's control loop ([`crate::control::reactor`]) on the server: the
//! client's control stream closing (or carrying anything but a queue reset) closes the
//! connection; a queue reset is read and answered aside, on a short-lived thread that owns the
//! stream meanwhile (see [`crate::conn::recovery`]); keepalive silence is judged on the loop's timers
//! (see [`crate::conn::liveness`]). A connection the loop finds over is closed aside as well, so its
//! break callback and its rendezvous memory's release (a custom allocator) never run on the
//! loop.

use super::Conn;
use crate::conn::liveness::{CloseReason, Keepalive, Silence};
use crate::control::reactor::{Step, Watch};
use crate::control::session::{self, SessionFrame};
use crate::control::{ControlIo, ControlStream};
use crate::hal::Device;
use crate::os::{peek, Peek};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// Limit for reading one control frame once its first byte is there, and for writing one.
pub(crate) const FRAME_TIMEOUT: Duration = Duration::from_secs(5);

/// A server connection's control stream and keepalive timer, as the control loop watches them.
pub(super) struct ConnWatch<D: Device + Clone> {
    stream: ControlStream,
    conn: Weak<Conn<D>>,
    keepalive: Option<Keepalive>,
    silence: Silence,
    next_look: Option<Instant>,
    /// The loop found the connection over, for this reason: it is closed aside.
    closing: Option<CloseReason>,
}

impl<D: Device + Clone> ConnWatch<D> {
    pub(super) fn new(stream: ControlStream, conn: Weak<Conn<D>>, keepalive: Option<Keepalive>) -> Self {
        let now = Instant::now();
        ConnWatch {
            stream,
            conn,
            keepalive,
            silence: Silence::new(now),
            next_look: keepalive.map(|k| now + k.tick()),
            closing: None,
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
        if self.stream.buffered() > 0 {
            return Step::Aside;
        }
        match peek(self.fd()) {
            Peek::Data => Step::Aside,
            Peek::Empty => Step::Keep,
            Peek::Closed => {
                self.closing = Some(CloseReason::PeerClosed);
                Step::Aside
            }
        }
    }

    fn on_timer(&mut self, now: Instant) -> Step {
        let Some(c) = self.open() else { return Step::Done };
        let (Some(k), Some(at)) = (self.keepalive, self.next_look) else { return Step::Keep };
        if now < at {
            return Step::Keep;
        }
        self.next_look = Some(now + k.tick());
        if c.live.frozen.load(Ordering::Acquire) {
            self.silence.restart(now);
            return Step::Keep;
        }
        let quiet = self.silence.look(&c.live, now, k.stall());
        if c.live.server_limit(&k).is_some_and(|limit| k.expired(quiet, limit)) {
            self.closing = Some(CloseReason::KeepaliveTimeout);
            return Step::Aside;
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
        self.next_look
    }

    /// Closes the connection the loop found over; else reads the client's frame (a queue reset)
    /// and answers it, blocking (bounded by [`FRAME_TIMEOUT`] each way).
    fn aside(&mut self) -> bool {
        let Some(c) = self.open() else { return false };
        if let Some(reason) = self.closing.take() {
            c.close_with(reason);
            return false;
        }
        let answered = match session::read_frame(&mut self.stream, FRAME_TIMEOUT) {
            Ok(SessionFrame::QueueReset(r)) => {
                let answer = c.reset_queue(&r);
                answer
                    .encode()
                    .and_then(|frame| session::write_frame(&mut self.stream, &frame, FRAME_TIMEOUT))
            }
            Ok(other) => Err(crate::control::ControlError::Malformed(format!("{other:?} sent to a server"))),
            Err(e) => Err(e),
        };
        if answered.is_err() {
            // End of stream, garbage, or an answer we could not write: the client is gone.
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
