//! Liveness: keepalive probes, why a connection closed, and per-connection user context.
//!
//! **Keepalive runs on the data path.** A client whose channel has received nothing for
//! [`Keepalive::interval`] sends URPC's keepalive request ([`FunctionId::KEEPALIVE`]) on one of
//! its queues, like any call (one send context, one credit, taken only if free: a probe never
//! waits for credit, so it never delays a call); the server's stack answers it itself. Anything
//! received on the channel — a probe's response or any other message — counts as hearing from
//! the peer. Nothing heard for `interval × misses` declares the connection broken: outstanding
//! calls fail with [`RpcError::ConnectionBroken`], the channel closes, and the break callback
//! runs once. A probe tests what calls need — the peer's process polls and answers, and the
//! NICs and the link between them carry data — whereas the TCP control stream can stay up while
//! the data path is dead (a cut RDMA link, a frozen process whose kernel still ACKs TCP).
//!
//! The probe's 8 bytes of arguments are the client's interval (u32 milliseconds) and misses
//! (u32), little-endian, so the server can apply the matching limit: it declares a connection
//! broken after hearing nothing for the larger of its own `interval × misses` and the client's
//! `interval × (misses + 1)`, from the client's first probe on (a client without keepalive
//! never probes, and the server then relies on the TCP stream alone).
//!
//! Timing uses the real monotonic clock (not a simulated device's clock), and the process's
//! control loop ([`crate::control::reactor`], the thread that watches every control stream) runs it: it
//! looks at each channel every `interval / 4`, and, when nobody else has polled the channel
//! since its last look, polls it itself so that an idle channel's probe responses are collected
//! (a callback call that poll finishes has its callback run aside, not on the loop: see
//! [`crate::control::reactor`]). A channel or connection keepalive gives up on is closed aside too. The hot path pays one
//! relaxed load (and, after a quiet spell, one store) per non-empty poll of the receive CQ.
//!
//! **Rendezvous.** A connection moving its own rendezvous data hears nothing for as long as the
//! transfer takes, though both sides are well: the server's answer to a probe is a SEND on the
//! same RC queue as its READs and WRITEs, and RC delivers it only after them (rxe even holds a
//! SEND while more than 128 PSNs are unacknowledged); the client's messages queue behind the
//! READ responses its NIC sends. A 4 MiB echo at 0.5 MB/s (a TCG guest) is 16 s of silence,
//! three times the default limit. Keepalive must not call that dead, and must still find a peer
//! that really died or froze during it. Each side knows something different, so they differ:
//!
//! - **The server** knows exactly when it is moving data: it counts the READs and WRITEs it
//!   posted and has not seen complete (`ConnRndv::posted`, `server/rndv.rs`). While there are
//!   some, it does not judge the client's silence, which then counts from the transfer's end.
//!   The RC transport watches the client meanwhile: each READ or WRITE completes (the client's
//!   NIC answered: the data moves) or, when the client's host or the link is gone, fails with
//!   `RetryExceeded` after the queue's retries (a READ or WRITE never waits on RNR), which fails
//!   the queue and ends the count. A client process that froze while its NIC still serves the
//!   READs is judged from the transfer's end, one limit later; one that died closes its control
//!   stream at once. This rests on the queues' ACK timer: with `AckTimeout::NONE` a READ to a
//!   dead client would wait forever, so such a server stretches its limit instead, by one limit
//!   per work request in flight (each moves at most one chunk), as the client does.
//! - **The client** cannot see the server's READs and WRITEs: on one queue (the default) nothing
//!   the server sends can overtake them, so answering probes on another queue is no general
//!   answer, and not judging at all while a rendezvous call is out would leave a frozen server
//!   undetected for as long as a call with no deadline waits — forever. So the client stretches
//!   its limit by one more limit per [`RNDV_BYTES_PER_LIMIT`] (256 KiB, one READ/WRITE chunk)
//!   that the server may still move for the channel: the arguments and response capacity of its
//!   outstanding rendezvous calls and of timed-out ones whose memory is quarantined (the server
//!   may still be moving it). A live transfer keeps the channel as long as it moves at least
//!   one chunk per limit on average (51 KiB/s with the default 1 s × 5); a server that froze
//!   (its NIC still serving READs) is found by the call's own deadline if it has one, and by
//!   keepalive within the stretched limit in every case; a dead link or host also by RC retry
//!   exhaustion — of the server's READs and WRITEs (the server then closes the connection one
//!   limit later, which the client sees as `PeerClosed` while the control stream works) and of
//!   any SEND of the client's still unacknowledged, a probe included (probes go on, one at a
//!   time, each with the stretched limit as its deadline: a probe that timed out keeps its credit
//!   until its answer comes, so shorter deadlines would drain the calls' credits during a long
//!   transfer); a dead process by its control stream's closure.
//!
//! Both counts are relaxed atomics changed per rendezvous call (client) or per rendezvous work
//! request (server): eager calls pay nothing.

use crate::wire::FunctionId;
use crate::RpcError;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::time::{Duration, Instant};

/// Rendezvous bytes a client gives the server one keepalive limit to move, when its answers
/// may wait behind them (one READ or WRITE chunk, [`MAX_CHUNK`](crate::conn::rndv::MAX_CHUNK)):
/// the slowest transfer keepalive takes for a live one is one chunk per limit (51 KiB/s with the
/// default 1 s × 5).
pub(crate) const RNDV_BYTES_PER_LIMIT: u64 = crate::conn::rndv::MAX_CHUNK as u64;

/// `limit` stretched for `bytes` of the connection's own rendezvous data that may be queued
/// ahead of what the peer sends (see the module docs, "Rendezvous"): one more limit per
/// [`RNDV_BYTES_PER_LIMIT`] or part of it; `limit` itself when nothing is moving.
pub(crate) fn limit_while_moving(limit: Duration, bytes: u64) -> Duration {
    let extra = bytes.div_ceil(RNDV_BYTES_PER_LIMIT);
    let times = u32::try_from(extra.saturating_add(1)).unwrap_or(u32::MAX);
    limit.saturating_mul(times)
}

/// Keepalive settings ([`ChannelConfig::keepalive`](crate::ChannelConfig::keepalive),
/// [`ServerConfig::keepalive`](crate::ServerConfig::keepalive)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keepalive {
    /// A connection that received nothing for this long is probed (client), and the unit of the
    /// limit below. 1 ms ..= 1 hour; default 1 s.
    pub interval: Duration,
    /// The connection is declared broken after `interval × misses` with nothing received.
    /// 1..=1000; default 5.
    pub misses: u32,
}

impl Default for Keepalive {
    fn default() -> Self {
        Keepalive { interval: Duration::from_secs(1), misses: 5 }
    }
}

impl Keepalive {
    /// `interval × misses`: how long a silent peer is given.
    pub fn limit(&self) -> Duration {
        self.interval.saturating_mul(self.misses)
    }

    /// Checks the fields; `field` is the config field's path for the error text.
    pub(crate) fn validate(&self, field: &str) -> Result<(), RpcError> {
        if self.interval < Duration::from_millis(1) || self.interval > Duration::from_secs(3600) {
            return Err(crate::error::bad_field(
                &format!("{field}.interval"),
                format_args!("is {:?}: use 1 ms ..= 1 h (or keepalive None to turn it off)", self.interval),
            ));
        }
        if !(1..=1000).contains(&self.misses) {
            return Err(crate::error::bad_field(
                &format!("{field}.misses"),
                format_args!("is {}: use 1..=1000", self.misses),
            ));
        }
        Ok(())
    }

    /// How often the monitor looks.
    pub(crate) fn tick(&self) -> Duration {
        (self.interval / 4).max(Duration::from_micros(250))
    }

    /// A gap between two looks past which the loop, not the peer, is taken to have been silent
    /// (see [`Silence::look`]): half the limit, and at least two ticks. Looks are a tick apart
    /// when the loop keeps up, so only a stall that could have condemned a live peer trips it.
    pub(crate) fn stall(&self) -> Duration {
        (self.limit() / 2).max(self.tick().saturating_mul(2))
    }

    /// Whether `quiet` (from [`Silence::look`], which may count from up to one look before the
    /// last message) has reached `limit`. Judged one look early, so a connection is declared
    /// broken no later than `limit` after its last message (and no sooner than `limit` minus
    /// two looks).
    pub(crate) fn expired(&self, quiet: Duration, limit: Duration) -> bool {
        quiet.saturating_add(self.tick()) >= limit
    }

    /// The silence after which the client probes: `interval`; with `misses` 1, half of it, so
    /// that the probe can be answered before the limit.
    pub(crate) fn probe_after(&self) -> Duration {
        if self.misses > 1 {
            self.interval
        } else {
            self.interval / 2
        }
    }

    /// The probe's arguments.
    pub(crate) fn probe_args(&self) -> [u8; 8] {
        let (ms, misses) = self.announced();
        let mut a = [0u8; 8];
        a[..4].copy_from_slice(&ms.to_le_bytes());
        a[4..].copy_from_slice(&misses.to_le_bytes());
        a
    }

    /// What the client tells the server, in its hello and in each probe: `(interval in ms,
    /// misses)`, both at least 1.
    pub(crate) fn announced(&self) -> (u32, u32) {
        (u32::try_from(self.interval.as_millis()).unwrap_or(u32::MAX).max(1), self.misses.max(1))
    }
}

/// Why a connection closed: what [`Channel::close_reason`](crate::Channel::close_reason) reports
/// and what break callbacks get.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CloseReason {
    /// This side closed it: [`Channel::close`](crate::Channel::close), the channel's last handle
    /// dropped, [`Server::shutdown`](crate::Server::shutdown), a connection closed by the
    /// application.
    Local,
    /// The peer closed the control connection (or it failed, or carried garbage).
    PeerClosed,
    /// Keepalive: nothing was received from the peer for `interval × misses`.
    KeepaliveTimeout,
    /// Every queue failed, and none was left to recover.
    QueuesFailed,
    /// A queue failed more often than the recovery budget allows, or could not be recovered.
    RecoveryExhausted,
    /// This process's control loop could not go on watching the connection (a panic in its
    /// handling, or no resources to watch it; the reason is on stderr), so nothing would notice
    /// the peer's close or run keepalive: it is closed rather than left unwatched.
    ControlLost,
}

impl CloseReason {
    const ALL: [CloseReason; 6] = [
        CloseReason::Local,
        CloseReason::PeerClosed,
        CloseReason::KeepaliveTimeout,
        CloseReason::QueuesFailed,
        CloseReason::RecoveryExhausted,
        CloseReason::ControlLost,
    ];

    fn to_u8(self) -> u8 {
        match self {
            CloseReason::Local => 1,
            CloseReason::PeerClosed => 2,
            CloseReason::KeepaliveTimeout => 3,
            CloseReason::QueuesFailed => 4,
            CloseReason::RecoveryExhausted => 5,
            CloseReason::ControlLost => 6,
        }
    }

    fn from_u8(v: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.to_u8() == v)
    }

    /// The error outstanding calls get when the connection closes for this reason: a broken
    /// connection ([`RpcError::ConnectionBroken`]) for keepalive and an exhausted recovery, else
    /// [`RpcError::Closed`].
    pub(crate) fn call_error(self) -> RpcError {
        match self {
            CloseReason::KeepaliveTimeout | CloseReason::RecoveryExhausted | CloseReason::ControlLost => {
                RpcError::ConnectionBroken(self)
            }
            _ => RpcError::Closed,
        }
    }
}

impl std::fmt::Display for CloseReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CloseReason::Local => "closed by this side",
            CloseReason::PeerClosed => "the peer closed the control connection",
            CloseReason::KeepaliveTimeout => {
                "keepalive: nothing received from the peer within interval x misses"
            }
            CloseReason::QueuesFailed => "every queue failed",
            CloseReason::RecoveryExhausted => "a queue failed past its recovery budget",
            CloseReason::ControlLost => {
                "this process's control loop could no longer watch the connection (see stderr)"
            }
        })
    }
}

/// Per-connection state shared by the data path (which marks traffic) and the control loop.
pub(crate) struct Live {
    /// Set by pollers when they received something; taken by the monitor.
    heard: AtomicBool,
    /// The application's context value.
    pub(crate) context: AtomicU64,
    /// The [`CloseReason`] of the first close (0: open).
    reason: AtomicU8,
    /// Test hook: the monitor neither probes nor judges (a frozen peer, as the other side sees it).
    pub(crate) frozen: AtomicBool,
    /// Test hook (server): probes are dropped unanswered.
    pub(crate) ignore_probes: AtomicBool,
    /// Server: the keepalive the client announced in its probes (ms, misses; 0 ms: none yet).
    peer_interval_ms: AtomicU32,
    peer_misses: AtomicU32,
    /// Probes sent (client) or answered (server).
    pub(crate) probes: AtomicU64,
}

impl Live {
    pub(crate) fn new() -> Self {
        Live {
            heard: AtomicBool::new(false),
            context: AtomicU64::new(0),
            reason: AtomicU8::new(0),
            frozen: AtomicBool::new(false),
            ignore_probes: AtomicBool::new(false),
            peer_interval_ms: AtomicU32::new(0),
            peer_misses: AtomicU32::new(0),
            probes: AtomicU64::new(0),
        }
    }

    /// Something was received (called per non-empty receive poll: a load, and a store only when
    /// the flag was taken since).
    #[inline]
    pub(crate) fn mark_heard(&self) {
        if !self.heard.load(Ordering::Relaxed) {
            self.heard.store(true, Ordering::Relaxed);
        }
    }

    fn take_heard(&self) -> bool {
        self.heard.swap(false, Ordering::Relaxed)
    }

    /// Records why the connection closed; only the first reason counts. Returns the reason that
    /// stands.
    pub(crate) fn set_reason(&self, reason: CloseReason) -> CloseReason {
        match self.reason.compare_exchange(0, reason.to_u8(), Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => reason,
            Err(v) => CloseReason::from_u8(v).unwrap_or(reason),
        }
    }

    pub(crate) fn reason(&self) -> Option<CloseReason> {
        CloseReason::from_u8(self.reason.load(Ordering::Acquire))
    }

    /// Server: a probe arrived with these arguments.
    pub(crate) fn on_probe(&self, args: &[u8]) {
        if let (Some(ms), Some(misses)) = (args.get(..4), args.get(4..8)) {
            let ms = u32::from_le_bytes([ms[0], ms[1], ms[2], ms[3]]);
            let misses = u32::from_le_bytes([misses[0], misses[1], misses[2], misses[3]]);
            self.announce((ms, misses));
        }
        self.probes.fetch_add(1, Ordering::Relaxed);
    }

    /// Server: the client's keepalive `(interval in ms, misses)`, from its hello or a probe.
    pub(crate) fn announce(&self, (ms, misses): (u32, u32)) {
        self.peer_misses.store(misses.max(1), Ordering::Relaxed);
        self.peer_interval_ms.store(ms.max(1), Ordering::Relaxed);
    }

    /// Server: the silence after which the client is declared gone, once it has announced its
    /// keepalive (in its hello, or a probe): the larger of ours and the client's
    /// `interval × (misses + 1)`.
    pub(crate) fn server_limit(&self, ours: &Keepalive) -> Option<Duration> {
        let ms = self.peer_interval_ms.load(Ordering::Relaxed);
        if ms == 0 {
            return None;
        }
        let misses = self.peer_misses.load(Ordering::Relaxed).saturating_add(1);
        let theirs = Duration::from_millis(u64::from(ms)).saturating_mul(misses);
        Some(ours.limit().max(theirs))
    }
}

/// The monitor's view of silence: when the peer was last heard from, conservatively (the last
/// look before the one that found traffic), so that "quiet for `limit`" is never later than
/// `limit` after the last message.
pub(crate) struct Silence {
    quiet_since: Instant,
    last_look: Instant,
}

impl Silence {
    pub(crate) fn new(now: Instant) -> Self {
        Silence { quiet_since: now, last_look: now }
    }

    /// One look at `now`: takes `live`'s traffic mark and returns how long it has been quiet.
    ///
    /// A look that comes more than `stall` after the previous one ([`Keepalive::stall`]) means
    /// the control loop was held up (a starved thread, a stopped process): meanwhile our own
    /// probes were not sent, and traffic may have been heard at any moment of the gap, so the
    /// gap says nothing about the peer. The silence starts again from this look rather than
    /// close a healthy connection; a peer that really died in the gap is found one limit later.
    pub(crate) fn look(&mut self, live: &Live, now: Instant, stall: Duration) -> Duration {
        if now.saturating_duration_since(self.last_look) > stall {
            live.take_heard();
            self.restart(now);
            return Duration::ZERO;
        }
        if live.take_heard() {
            self.quiet_since = self.last_look;
        }
        self.last_look = now;
        now.saturating_duration_since(self.quiet_since)
    }

    /// Forget the silence so far (e.g. after the monitor was busy elsewhere for a long time, or
    /// a frozen test hook was lifted).
    pub(crate) fn restart(&mut self, now: Instant) {
        self.quiet_since = now;
        self.last_look = now;
    }
}

/// Whether `f` is the keepalive function.
#[inline]
pub(crate) fn is_probe(f: FunctionId) -> bool {
    f == FunctionId::KEEPALIVE
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn silence_is_counted_from_the_look_before_traffic() {
        let live = Live::new();
        let t0 = Instant::now();
        let mut s = Silence::new(t0);
        let ms = Duration::from_millis;
        let stall = ms(1_000);
        assert_eq!(s.look(&live, t0 + ms(10), stall), ms(10));
        live.mark_heard();
        // Heard between the looks at 10 and 20: counted from 10.
        assert_eq!(s.look(&live, t0 + ms(20), stall), ms(10));
        assert_eq!(s.look(&live, t0 + ms(30), stall), ms(20));
    }

    /// A control loop held up far past the limit (traffic heard meanwhile, or not: our probes
    /// were not going out) does not condemn the peer on its first look back.
    #[test]
    fn a_late_look_starts_the_silence_again() {
        let live = Live::new();
        let t0 = Instant::now();
        let mut s = Silence::new(t0);
        let ms = Duration::from_millis;
        let k = Keepalive { interval: ms(40), misses: 5 };
        assert_eq!(k.stall(), ms(100), "half the 200 ms limit");
        let stall = k.stall();
        assert_eq!(s.look(&live, t0 + ms(10), stall), ms(10));
        live.mark_heard();
        assert_eq!(s.look(&live, t0 + ms(5_000), stall), Duration::ZERO, "heard during the stall");
        assert_eq!(s.look(&live, t0 + ms(5_010), stall), ms(10));
        assert_eq!(s.look(&live, t0 + ms(9_000), stall), Duration::ZERO, "nothing heard, no probe sent");
        // Looks on time again (a gap up to the stall is still the peer's): silence accumulates.
        assert_eq!(s.look(&live, t0 + ms(9_100), stall), ms(100));
        assert_eq!(s.look(&live, t0 + ms(9_190), stall), ms(190));
    }

    #[test]
    fn judged_one_look_early_and_misses_1_probes_at_half_the_interval() {
        let k = Keepalive { interval: Duration::from_millis(100), misses: 3 };
        let ms = Duration::from_millis;
        assert!(!k.expired(ms(274), k.limit()));
        assert!(k.expired(ms(275), k.limit()), "one look (25 ms) before 300 ms");
        assert_eq!(k.probe_after(), ms(100));
        assert_eq!(Keepalive { misses: 1, ..k }.probe_after(), ms(50));
    }

    #[test]
    fn a_limit_more_per_chunk_of_rendezvous_data_in_flight() {
        let limit = Duration::from_millis(100);
        let chunk = RNDV_BYTES_PER_LIMIT;
        assert_eq!(limit_while_moving(limit, 0), limit, "nothing moving: the plain limit");
        assert_eq!(limit_while_moving(limit, 1), limit * 2, "part of a chunk counts whole");
        assert_eq!(limit_while_moving(limit, chunk), limit * 2);
        assert_eq!(limit_while_moving(limit, 16 * chunk + 1), limit * 18);
        let huge = limit_while_moving(Duration::from_secs(3600), u64::MAX);
        assert!(huge > Duration::from_secs(3600 * 1000), "saturates instead of overflowing: {huge:?}");
    }

    #[test]
    fn the_first_close_reason_stands() {
        let live = Live::new();
        assert_eq!(live.reason(), None);
        assert_eq!(live.set_reason(CloseReason::KeepaliveTimeout), CloseReason::KeepaliveTimeout);
        assert_eq!(live.set_reason(CloseReason::Local), CloseReason::KeepaliveTimeout);
        assert_eq!(live.reason(), Some(CloseReason::KeepaliveTimeout));
    }

    #[test]
    fn server_limit_follows_the_clients_announcement() {
        let live = Live::new();
        let ours = Keepalive { interval: Duration::from_millis(100), misses: 3 };
        assert_eq!(live.server_limit(&ours), None);
        live.on_probe(&Keepalive { interval: Duration::from_millis(500), misses: 2 }.probe_args());
        assert_eq!(live.server_limit(&ours), Some(Duration::from_millis(1500)));
        live.on_probe(&Keepalive { interval: Duration::from_millis(10), misses: 1 }.probe_args());
        assert_eq!(live.server_limit(&ours), Some(Duration::from_millis(300)));
    }

    #[test]
    fn keepalive_validation_names_the_field() {
        let bad = Keepalive { interval: Duration::ZERO, misses: 3 };
        let e = bad.validate("ChannelConfig.keepalive").unwrap_err().to_string();
        assert!(e.contains("ChannelConfig.keepalive.interval"), "{e}");
        let bad = Keepalive { interval: Duration::from_secs(1), misses: 0 };
        let e = bad.validate("ServerConfig.keepalive").unwrap_err().to_string();
        assert!(e.contains("ServerConfig.keepalive.misses"), "{e}");
        Keepalive::default().validate("x").unwrap();
    }
}
