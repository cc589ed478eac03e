//! A channel's watch in the process's control loop ([`crate::control::reactor`]): the control stream's
//! closure (or any byte the server sends unasked) closes the channel; keepalive looks run on
//! the loop's timers (see [`crate::conn::liveness`]); failed queues are recovered aside, on a
//! short-lived thread that owns the stream meanwhile, except for reading the server's answers,
//! which the loop does as their bytes arrive (see [`super::recovery`]). Closing is done
//! aside too, and so are the callbacks of calls a look finished ([`super::deferred`]): the loop
//! runs no application code.

#![forbid(unsafe_code)]

use super::recovery::{Answer, Progress};
use super::{CallOptions, ChannelInner};
use crate::client::delivery::{self, Oneshot, Sink};
use crate::conn::liveness::{limit_while_moving, CloseReason, Keepalive, Silence};
use crate::control::reactor::{Step, Watch};
use crate::control::session::{ReadStep, SessionFrame};
use crate::control::{ControlError, ControlIo, ControlStream};
use crate::core::tx_ctx::CallMode;
use crate::hal::Device;
use crate::wire::FunctionId;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Instant;

/// What the keepalive side of the monitor keeps between looks.
pub(super) struct KeepaliveState {
    keepalive: Keepalive,
    silence: Silence,
    probe: Option<Arc<Oneshot>>,
    last_polls: u32,
    next_look: Instant,
}

/// A channel's control stream and timers, as the process's control loop watches them.
pub(super) struct ChannelWatch<D: Device + Clone> {
    stream: ControlStream,
    channel: Weak<ChannelInner<D>>,
    ka: Option<KeepaliveState>,
    /// The loop found the channel over, for this reason: it is closed aside.
    closing: Option<CloseReason>,
    /// Queue recovery: the exchange whose answer the loop reads.
    recovery: Progress,
}

/// Most frames one readiness event reads before the loop moves on to other connections.
const FRAMES_PER_LOOK: usize = 8;

impl<D: Device + Clone> ChannelWatch<D> {
    /// Watches `stream` (made non-blocking here: the loop reads it) for `channel`.
    pub(super) fn new(
        stream: ControlStream,
        channel: Weak<ChannelInner<D>>,
        keepalive: Option<Keepalive>,
    ) -> std::io::Result<Self> {
        stream.tcp().set_nonblocking(true)?;
        let now = Instant::now();
        let ka = keepalive.map(|keepalive| KeepaliveState {
            keepalive,
            silence: Silence::new(now),
            probe: None,
            last_polls: u32::MAX,
            next_look: now + keepalive.tick(),
        });
        Ok(ChannelWatch { stream, channel, ka, closing: None, recovery: Progress::default() })
    }

    /// The channel, unless it is gone or closed (then the loop stops watching it).
    fn open(&self) -> Option<Arc<ChannelInner<D>>> {
        self.channel.upgrade().filter(|c| !c.ep.is_closed())
    }

    /// After the loop acted on the channel: callbacks it finished are run aside, and a closed
    /// channel is let go of.
    fn after(&self, inner: &ChannelInner<D>) -> Step {
        if inner.has_deferred() {
            Step::Aside
        } else if inner.ep.is_closed() {
            Step::Done
        } else {
            Step::Keep
        }
    }

    /// Closes the channel aside, for `reason`.
    fn close_aside(&mut self, reason: CloseReason) -> Step {
        self.closing = Some(reason);
        Step::Aside
    }
}

impl<D: Device + Clone + 'static> Watch for ChannelWatch<D> {
    fn fd(&self) -> RawFd {
        self.stream.tcp().as_raw_fd()
    }

    fn has_buffered(&mut self) -> bool {
        self.stream.buffered() > 0
    }

    /// The one place the channel is closed, and its callbacks run, on the loop: the loop lets
    /// go of it after a panic of its own, or is going away.
    fn abandon(&mut self) {
        if let Some(inner) = self.channel.upgrade() {
            inner.close_with(self.closing.take().unwrap_or(CloseReason::ControlLost));
            inner.run_deferred();
        }
    }

    fn on_readable(&mut self) -> Step {
        let Some(inner) = self.open() else { return Step::Done };
        if self.recovery.awaiting.is_none() {
            // End of stream, an error, or bytes nobody asked for: the connection is over.
            return self.close_aside(CloseReason::PeerClosed);
        }
        for _ in 0..FRAMES_PER_LOOK {
            match self.recovery.reader.read(&mut self.stream) {
                ReadStep::Pending => return Step::Keep,
                ReadStep::Closed => {
                    inner.answer_lost(&mut self.recovery, ControlError::Closed);
                    return Step::Aside;
                }
                ReadStep::Frame(Ok(SessionFrame::QueueResetDone(a))) => {
                    match inner.answer_read(&mut self.recovery, a) {
                        Answer::Skipped => {}
                        Answer::Arrived | Answer::Unexpected => return Step::Aside,
                    }
                }
                ReadStep::Frame(Ok(other)) => {
                    let e = ControlError::Malformed(format!("a {other:?} sent to a client"));
                    inner.answer_lost(&mut self.recovery, e);
                    return Step::Aside;
                }
                ReadStep::Frame(Err(e)) => {
                    inner.answer_lost(&mut self.recovery, e);
                    return Step::Aside;
                }
            }
        }
        // More frames wait (see the server's watch): bytes inside a TLS session would not wake
        // the loop, so a trip aside (which does nothing) hands the channel back to be read.
        if self.stream.buffered() > 0 {
            Step::Aside
        } else {
            Step::Keep
        }
    }

    fn on_timer(&mut self, now: Instant) -> Step {
        let Some(inner) = self.open() else { return Step::Done };
        if self.recovery.awaiting.as_ref().is_some_and(|w| now >= w.deadline) {
            inner.answer_late(&mut self.recovery);
            return Step::Aside;
        }
        if let Some(k) = self.ka.as_mut() {
            if self.recovery.awaiting.is_some() {
                // A queue is down by our own doing while its exchange lasts (bounded by the
                // recovery timeout): its silence is not the server's.
                k.silence.restart(now);
                k.next_look = now + k.keepalive.tick();
            } else if now >= k.next_look {
                k.next_look = now + k.keepalive.tick();
                if inner.keepalive_look(k, now) {
                    return self.close_aside(CloseReason::KeepaliveTimeout);
                }
            }
        }
        self.after(&inner)
    }

    fn on_wake(&mut self) -> Step {
        let Some(inner) = self.channel.upgrade() else { return Step::Done };
        // One exchange at a time: other queues wait for the one in progress.
        if inner.recovery.pending() && !inner.ep.is_closed() && self.recovery.awaiting.is_none() {
            return Step::Aside;
        }
        self.after(&inner)
    }

    fn deadline(&self) -> Option<Instant> {
        let answer = self.recovery.awaiting.as_ref().map(|w| w.deadline);
        match (self.ka.as_ref().map(|k| k.next_look), answer) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn aside(&mut self) -> bool {
        let Some(inner) = self.channel.upgrade() else { return false };
        inner.run_deferred();
        if let Some(reason) = self.closing.take() {
            inner.close_with(reason);
            return false;
        }
        if inner.ep.is_closed() {
            return false;
        }
        if inner.recover_pending(&mut self.stream, &mut self.recovery) {
            if let Some(k) = self.ka.as_mut() {
                // The data path was down meanwhile, by our own doing: silence counts from now.
                let now = Instant::now();
                k.silence.restart(now);
                k.next_look = now + k.keepalive.tick();
            }
        }
        !inner.ep.is_closed()
    }
}

impl<D: Device + Clone> ChannelInner<D> {
    /// One keepalive look: collect what arrived if nobody else polls, judge the silence, probe.
    /// Returns true if the channel is to be closed ([`CloseReason::KeepaliveTimeout`]).
    fn keepalive_look(&self, k: &mut KeepaliveState, now: Instant) -> bool {
        if self.live.frozen.load(Ordering::Acquire) {
            k.silence.restart(now);
            return false;
        }
        if self.polls.load(Ordering::Relaxed) == k.last_polls {
            // Nobody polled since the last look (an idle channel between blocking calls, with no
            // worker group): collect what arrived ourselves, probe responses included.
            self.ep.device.progress();
            for _ in 0..4 {
                if self.poll() == 0 {
                    break;
                }
            }
        }
        k.last_polls = self.polls.load(Ordering::Relaxed);
        let quiet = k.silence.look(&self.live, now, k.keepalive.stall());
        // The server's answers may wait behind this channel's own rendezvous transfers on its
        // send queue: a limit more per chunk it may still move (see `conn::liveness`).
        let limit = limit_while_moving(k.keepalive.limit(), self.rndv.moving());
        if k.keepalive.expired(quiet, limit) {
            return true;
        }
        if k.probe.as_ref().is_some_and(|p| p.is_done()) {
            if let Some(p) = k.probe.take() {
                delivery::recycle_shot(p);
            }
        }
        if quiet >= k.keepalive.probe_after() && k.probe.is_none() {
            let shot = delivery::blocking_shot();
            let opts = CallOptions {
                mode: CallMode::WaitRsp,
                // Its answer may wait behind the transfer as long as the silence may last: a
                // probe that timed out holds its credit until its answer comes, so one probe per
                // plain limit would take a credit each from the calls during a long transfer.
                timeout: Some(limit),
                queue: None,
                wait_for_credit: false,
                ..CallOptions::default()
            };
            let args = k.keepalive.probe_args();
            match self.start(&opts, FunctionId::KEEPALIVE, &args, Sink::Shot(shot.clone())) {
                Ok(()) => {
                    self.live.probes.fetch_add(1, Ordering::Relaxed);
                    k.probe = Some(shot);
                }
                // No credit or send context free (the queues are busy: calls are in flight),
                // or no queue READY (one is being recovered): look again next time.
                Err(_) => delivery::recycle_shot(shot),
            }
        }
        false
    }
}
