//! A connection's monitor thread on the server: it reads the client's control stream (its
//! closure, or anything but a queue reset, closes the connection), answers queue resets (see
//! [`crate::recovery`]) and judges keepalive silence (see [`crate::liveness`]).

use super::Conn;
use crate::control::session::{self, SessionFrame};
use crate::hal::Device;
use crate::liveness::{self, CloseReason, Keepalive, Silence};
use std::sync::atomic::Ordering;
use std::sync::Weak;
use std::time::{Duration, Instant};

/// Limit for reading one control frame once its first byte is there, and for writing one.
pub(crate) const FRAME_TIMEOUT: Duration = Duration::from_secs(5);

pub(super) fn run<D: Device + Clone>(
    mut stream: crate::control::ControlStream,
    conn: Weak<Conn<D>>,
    keepalive: Option<Keepalive>,
) {
    let mut silence = Silence::new(Instant::now());
    let mut next_look = keepalive.map(|k| Instant::now() + k.tick());
    loop {
        let timeout = next_look.map(|t| t.saturating_duration_since(Instant::now()));
        let readable = liveness::wait_readable(&mut stream, None, timeout).unwrap_or(true);
        let Some(c) = conn.upgrade() else { return };
        if c.ep.is_closed() {
            return;
        }
        if readable {
            let answered = match session::read_frame(&mut stream, FRAME_TIMEOUT) {
                Ok(SessionFrame::QueueReset(r)) => {
                    let answer = c.reset_queue(&r);
                    answer.encode().and_then(|frame| session::write_frame(&mut stream, &frame, FRAME_TIMEOUT))
                }
                Ok(other) => {
                    Err(crate::control::ControlError::Malformed(format!("{other:?} sent to a server")))
                }
                Err(e) => Err(e),
            };
            if answered.is_err() {
                // End of stream, garbage, or an answer we could not write: the client is gone.
                c.close_with(CloseReason::PeerClosed);
                return;
            }
            // The reset took a while; the silence meanwhile is ours, not the client's.
            silence.restart(Instant::now());
        }
        if let (Some(k), Some(at)) = (keepalive, next_look) {
            let now = Instant::now();
            if now >= at {
                next_look = Some(now + k.tick());
                if c.live.frozen.load(Ordering::Acquire) {
                    silence.restart(now);
                    continue;
                }
                let quiet = silence.look(&c.live, now);
                if c.live.server_limit(&k).is_some_and(|limit| k.expired(quiet, limit)) {
                    c.close_with(CloseReason::KeepaliveTimeout);
                    return;
                }
            }
        }
    }
}
