//! The channel's monitor thread: it watches the control stream (its closure, or any byte the
//! server sends unasked, closes the channel), runs keepalive (see [`crate::liveness`]) and
//! recovers failed queues (see [`crate::recovery`]).

use super::{CallOptions, ChannelInner};
use crate::call::{self, Oneshot, Sink};
use crate::hal::Device;
use crate::liveness::{self, CloseReason, Keepalive, Silence};
use crate::tx_ctx::CallMode;
use crate::wire::FunctionId;
use crate::worker::WakeFd;
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

pub(super) fn run<D: Device + Clone>(
    mut stream: crate::control::ControlStream,
    channel: Weak<ChannelInner<D>>,
    wake: Arc<WakeFd>,
    keepalive: Option<Keepalive>,
) {
    let now = Instant::now();
    let mut ka = keepalive.map(|keepalive| KeepaliveState {
        keepalive,
        silence: Silence::new(now),
        probe: None,
        last_polls: u32::MAX,
        next_look: now + keepalive.tick(),
    });
    loop {
        let timeout = ka.as_ref().map(|k| k.next_look.saturating_duration_since(Instant::now()));
        // An error of poll(2) itself is treated like a broken stream.
        let readable = liveness::wait_readable(&mut stream, Some(wake.raw()), timeout).unwrap_or(true);
        wake.clear();
        let Some(inner) = channel.upgrade() else { return };
        if inner.ep.is_closed() {
            return;
        }
        if readable {
            // End of stream, an error, or bytes nobody asked for (answers to our own requests
            // are read where they are awaited): the connection is over.
            inner.close_with(CloseReason::PeerClosed);
            return;
        }
        let recovered = inner.recover_pending(&mut stream);
        if let Some(k) = ka.as_mut() {
            let now = Instant::now();
            if recovered {
                // The data path was down meanwhile, by our own doing: silence counts from now.
                k.silence.restart(now);
            }
            if now >= k.next_look {
                k.next_look = now + k.keepalive.tick();
                inner.keepalive_look(k, now);
            }
        }
    }
}

impl<D: Device + Clone> ChannelInner<D> {
    /// One keepalive look: collect what arrived if nobody else polls, judge the silence, probe.
    fn keepalive_look(&self, k: &mut KeepaliveState, now: Instant) {
        if self.live.frozen.load(Ordering::Acquire) {
            k.silence.restart(now);
            return;
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
        let quiet = k.silence.look(&self.live, now);
        if k.keepalive.expired(quiet, k.keepalive.limit()) {
            self.close_with(CloseReason::KeepaliveTimeout);
            return;
        }
        if k.probe.as_ref().is_some_and(|p| p.is_done()) {
            if let Some(p) = k.probe.take() {
                call::recycle_shot(p);
            }
        }
        if quiet >= k.keepalive.probe_after() && k.probe.is_none() {
            let shot = call::blocking_shot();
            let opts = CallOptions {
                mode: CallMode::WaitRsp,
                timeout: Some(k.keepalive.limit()),
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
                Err(_) => call::recycle_shot(shot),
            }
        }
    }
}
