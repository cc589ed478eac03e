//! Liveness and connection events: keepalive probes on the data path keep an idle connection
//! up and find a peer that stopped answering (a frozen process, a cut link); the break callback
//! runs exactly once on each side; the server's new-connection callback sees the client's info
//! and may refuse it; per-connection contexts on both sides.
//!
//! Keepalive runs on short configured intervals here. Every wait is bounded ([`WAIT_LIMIT`])
//! and ends on observable state (a callback that ran, a counter); no test asserts timing or
//! sleeps to "wait enough".

use bypass::sim::{Engine, Fabric, FabricConfig, FaultPlan, SimNic};
use bypass::*;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod common;
use common::ids::{CONTEXT, ECHO, HOLD};
use common::served::Served;

const NAME: &str = "live";
const WAIT_LIMIT: Duration = Duration::from_secs(30);

/// Short keepalive for the side under test: probes every 20 ms of silence, broken after 100 ms.
fn short() -> Keepalive {
    Keepalive { interval: Duration::from_millis(20), misses: 5 }
}

/// Frequent probes but a patient limit (2 s), for the side that must not give up first even on
/// a loaded machine.
fn patient() -> Keepalive {
    Keepalive { interval: Duration::from_millis(20), misses: 100 }
}

/// A callback call's outcome, once it arrived.
type Outcome = Arc<Mutex<Option<Result<Vec<u8>, RpcError>>>>;

/// Waits (bounded) until `cond` holds; panics naming `what`.
fn until(what: &str, fabric: &Fabric, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < WAIT_LIMIT, "gave up waiting for {what}");
        fabric.progress();
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Break callbacks seen, in order.
#[derive(Clone, Default)]
struct Breaks(Arc<Mutex<Vec<(u32, CloseReason)>>>);

impl Breaks {
    fn count(&self) -> usize {
        self.0.lock().unwrap().len()
    }
    fn all(&self) -> Vec<(u32, CloseReason)> {
        self.0.lock().unwrap().clone()
    }
}

/// The served fabric with CONTEXT, a server whose new-connection callback refuses clients
/// named `refuse...`, panics for `panic` and sets every other connection's context, and the
/// server's break callbacks.
struct Rig {
    served: Served,
    server_breaks: Breaks,
}

impl Deref for Rig {
    type Target = Served;
    fn deref(&self) -> &Served {
        &self.served
    }
}

impl DerefMut for Rig {
    fn deref_mut(&mut self) -> &mut Served {
        &mut self.served
    }
}

impl Rig {
    fn new(engine: Engine, server_ka: Option<Keepalive>) -> Rig {
        Self::with_fabric(Fabric::new(engine), server_ka)
    }

    fn with_fabric(fabric: Fabric, server_ka: Option<Keepalive>) -> Rig {
        let server_breaks = Breaks::default();
        let b = server_breaks.clone();
        let config = ServerConfig { keepalive: server_ka, ..ServerConfig::new(NAME) };
        let admit = |conn: &Connection<SimNic>| {
            if conn.client_info().starts_with("refuse") {
                return Err(format!("not today, {}", conn.client_info()));
            }
            if conn.client_info() == "panic" {
                panic!("on_connect panics (contained)");
            }
            conn.set_context(conn.client_info().len() as u64 * 1000 + u64::from(conn.channel_id()));
            Ok(())
        };
        let served = Served::build(fabric, config, admit, |f, events| {
            f.register(CONTEXT, |req| {
                let ctx = req.context().to_le_bytes();
                let _ = req.reply(&ctx);
            });
            events.on_break(move |conn, reason| b.0.lock().unwrap().push((conn.channel_id(), reason)))
        });
        Rig { served, server_breaks }
    }

    fn connect(&self, keepalive: Option<Keepalive>, info: &str) -> Result<Channel<SimNic>, RpcError> {
        self.served.connect(ChannelConfig { keepalive, client_info: info.into(), ..ChannelConfig::new(NAME) })
    }
}

/// Records the channel's break callback.
fn watch(channel: &Channel<SimNic>) -> Breaks {
    let breaks = Breaks::default();
    let b = breaks.clone();
    let id = channel.channel_id();
    channel.set_break_callback(move |reason| b.0.lock().unwrap().push((id, reason)));
    breaks
}

/// An idle channel is probed (by its monitor thread; nothing else polls it) and stays up; the
/// server answers the probes itself; calls go on working; probes are not counted as calls.
fn idle_connection_is_probed_and_stays_up(engine: Engine) {
    let rig = Rig::new(engine, Some(patient()));
    let channel = rig.connect(Some(patient()), "idle").expect("connect");
    let breaks = watch(&channel);
    let mut rsp = Vec::new();
    channel.call(ECHO, b"before", &mut rsp).expect("call");
    until("several probes on the idle channel", &rig.fabric, || channel.stats().keepalive_probes >= 5);
    assert!(!channel.is_closed(), "{engine:?}: an answering peer is not declared broken");
    assert_eq!(breaks.count(), 0);
    assert_eq!(rig.server_breaks.count(), 0);
    channel.call(ECHO, b"after", &mut rsp).expect("call after idling");
    assert_eq!(rsp, b"after");
    assert_eq!(channel.stats().calls, 2, "{engine:?}: probes are not calls");
    assert_eq!(channel.close_reason(), None);
}

/// A server that stops answering (a frozen process, as the client sees it): the outstanding
/// call fails with ConnectionBroken, the channel closes, its break callback runs exactly once.
fn frozen_server_breaks_the_channel(engine: Engine) {
    let rig = Rig::new(engine, None);
    let channel = rig.connect(Some(short()), "frozen-server").expect("connect");
    let breaks = watch(&channel);
    let mut rsp = Vec::new();
    channel.call(ECHO, b"alive", &mut rsp).expect("call");
    rig.conn(channel.channel_id()).ignore_probes_for_tests(true);
    let outcome: Outcome = Arc::default();
    let o = outcome.clone();
    let opts = CallOptions { timeout: None, ..Default::default() };
    channel
        .call_callback(&opts, HOLD, b"held", move |r| *o.lock().unwrap() = Some(r.map(<[u8]>::to_vec)))
        .expect("start");
    until("the break callback", &rig.fabric, || breaks.count() > 0);
    assert_eq!(breaks.all(), vec![(channel.channel_id(), CloseReason::KeepaliveTimeout)], "{engine:?}");
    assert!(channel.is_closed());
    assert_eq!(channel.close_reason(), Some(CloseReason::KeepaliveTimeout));
    let got = outcome.lock().unwrap().take();
    match got {
        Some(Err(RpcError::ConnectionBroken(CloseReason::KeepaliveTimeout))) => {}
        other => panic!("{engine:?}: the outstanding call: {other:?}"),
    }
    assert!(matches!(channel.call(ECHO, b"later", &mut rsp), Err(RpcError::Closed)));
    // Exactly once, whatever else closes it later; a callback set now runs at once.
    channel.close();
    drop(rig.held.lock().unwrap().drain(..));
    assert_eq!(breaks.count(), 1);
    let late = Breaks::default();
    let l = late.clone();
    channel.set_break_callback(move |r| l.0.lock().unwrap().push((0, r)));
    assert_eq!(late.all(), vec![(0, CloseReason::KeepaliveTimeout)]);
    // The server hears the client close.
    until("the server's break callback", &rig.fabric, || rig.server_breaks.count() > 0);
    assert_eq!(rig.server_breaks.all(), vec![(channel.channel_id(), CloseReason::PeerClosed)]);
}

/// A cut link (the fault plan drops every packet; the TCP control stream still works): the
/// channel is declared broken by keepalive.
fn cut_wire_breaks_the_channel(engine: Engine) {
    let faults = FaultPlan { drop_ppm: 1_000_000, seed: 7, ..FaultPlan::NONE };
    let fabric = Fabric::with_config(FabricConfig { faults, ..FabricConfig::new(engine) });
    let rig = Rig::with_fabric(fabric, None);
    let channel = rig.connect(Some(short()), "cut").expect("connect (TCP works)");
    let breaks = watch(&channel);
    let outcome: Outcome = Arc::default();
    let o = outcome.clone();
    let opts = CallOptions { timeout: None, ..Default::default() };
    channel
        .call_callback(&opts, ECHO, b"lost", move |r| *o.lock().unwrap() = Some(r.map(<[u8]>::to_vec)))
        .expect("start");
    until("the break callback", &rig.fabric, || breaks.count() > 0);
    assert_eq!(breaks.all(), vec![(channel.channel_id(), CloseReason::KeepaliveTimeout)], "{engine:?}");
    assert!(channel.is_closed());
    let got = outcome.lock().unwrap().take();
    match got {
        Some(Err(RpcError::ConnectionBroken(_))) => {}
        other => panic!("{engine:?}: the outstanding call: {other:?}"),
    }
}

/// A client that stops probing and answering (frozen): the server declares the connection
/// broken, its break callback runs once, and the client sees the server close it.
fn frozen_client_is_dropped_by_the_server(engine: Engine) {
    // The server's limit follows the client's announcement (20 ms × 101 here).
    let rig = Rig::new(engine, Some(short()));
    let channel = rig.connect(Some(patient()), "frozen-client").expect("connect");
    let breaks = watch(&channel);
    // The first probe announces the client's keepalive to the server.
    until("a probe", &rig.fabric, || channel.stats().keepalive_probes >= 1);
    let mut rsp = Vec::new();
    channel.call(ECHO, b"x", &mut rsp).expect("call");
    channel.freeze_keepalive_for_tests(true);
    until("the server's break callback", &rig.fabric, || rig.server_breaks.count() > 0);
    assert_eq!(
        rig.server_breaks.all(),
        vec![(channel.channel_id(), CloseReason::KeepaliveTimeout)],
        "{engine:?}"
    );
    assert_eq!(rig.conn(channel.channel_id()).close_reason(), Some(CloseReason::KeepaliveTimeout));
    until("the client's break callback", &rig.fabric, || breaks.count() > 0);
    assert_eq!(breaks.all(), vec![(channel.channel_id(), CloseReason::PeerClosed)], "{engine:?}");
    assert_eq!(rig.server.connections(), 0);
}

/// A client that froze before it ever had to probe (a busy one: it heard from the server more
/// often than its interval) is found too: its hello announced its keepalive, so the server
/// judges its silence from the start (control protocol 5).
fn client_frozen_before_its_first_probe_is_dropped(engine: Engine) {
    // It would probe after 500 ms of silence; the server's limit is 1 s × (1 + 1).
    let ka = Keepalive { interval: Duration::from_secs(1), misses: 1 };
    let rig = Rig::new(engine, Some(short()));
    let channel = rig.connect(Some(ka), "frozen-early").expect("connect");
    let breaks = watch(&channel);
    channel.freeze_keepalive_for_tests(true);
    assert_eq!(channel.stats().keepalive_probes, 0, "frozen before its first probe");
    until("the server's break callback", &rig.fabric, || rig.server_breaks.count() > 0);
    assert_eq!(
        rig.server_breaks.all(),
        vec![(channel.channel_id(), CloseReason::KeepaliveTimeout)],
        "{engine:?}"
    );
    until("the client's break callback", &rig.fabric, || breaks.count() > 0);
    assert_eq!(rig.server.connections(), 0);
}

/// The new-connection callback sees the client's info, refuses with a reason the client gets,
/// sets the context the handlers see; the break callback runs once per accepted connection
/// (client close, server shutdown), never for a refused one.
fn connection_callbacks_and_contexts(engine: Engine) {
    let mut rig = Rig::new(engine, None);
    match rig.connect(None, "refuse-me") {
        Err(RpcError::Control(control::ControlError::Rejected(reason))) => {
            assert_eq!(reason, "not today, refuse-me", "{engine:?}")
        }
        other => panic!("{engine:?}: expected a refusal, got {other:?}"),
    }
    match rig.connect(None, "panic") {
        Err(RpcError::Control(control::ControlError::Rejected(reason))) => {
            assert!(reason.contains("callback"), "{reason}")
        }
        other => panic!("{engine:?}: expected a refusal, got {other:?}"),
    }
    let a = rig.connect(None, "alpha").expect("connect a");
    let b = rig.connect(None, "beta-client").expect("connect b");
    let mut rsp = Vec::new();
    for (ch, info) in [(&a, "alpha"), (&b, "beta-client")] {
        ch.call(CONTEXT, b"", &mut rsp).expect("context call");
        let want = info.len() as u64 * 1000 + u64::from(ch.channel_id());
        assert_eq!(rsp, want.to_le_bytes(), "{engine:?}: the handler sees the context set on connect");
        assert_eq!(rig.conn(ch.channel_id()).context(), want);
    }
    // The client side has its own context.
    assert_eq!(a.context(), 0);
    a.set_context(42);
    assert_eq!(a.context(), 42);
    assert_eq!(b.context(), 0);
    // A server-side context set later is what later requests see.
    rig.conn(b.channel_id()).set_context(7);
    b.call(CONTEXT, b"", &mut rsp).expect("context call");
    assert_eq!(rsp, 7u64.to_le_bytes());
    assert_eq!(rig.server_breaks.count(), 0, "{engine:?}: refused connections get no break callback");
    let a_breaks = watch(&a);
    a.close();
    assert_eq!(a_breaks.all(), vec![(a.channel_id(), CloseReason::Local)]);
    until("the server's break callback for a", &rig.fabric, || rig.server_breaks.count() == 1);
    assert_eq!(rig.server_breaks.all(), vec![(a.channel_id(), CloseReason::PeerClosed)]);
    let b_breaks = watch(&b);
    rig.server.shutdown();
    assert_eq!(
        rig.server_breaks.all(),
        vec![(a.channel_id(), CloseReason::PeerClosed), (b.channel_id(), CloseReason::Local)],
        "{engine:?}"
    );
    until("b's break callback", &rig.fabric, || b_breaks.count() > 0);
    assert_eq!(b_breaks.all(), vec![(b.channel_id(), CloseReason::PeerClosed)]);
}

/// A break callback that panics is contained, on both sides.
fn panicking_break_callbacks_are_contained(engine: Engine) {
    let ran = Arc::new(AtomicUsize::new(0));
    let r = ran.clone();
    let served = Served::build(
        Fabric::new(engine),
        ServerConfig::new(NAME),
        |_| Ok(()),
        |_, events| {
            events.on_break(move |_, _| {
                r.fetch_add(1, Ordering::SeqCst);
                panic!("server break callback panics (contained)");
            })
        },
    );
    let channel = served.connect(ChannelConfig::new(NAME)).expect("connect");
    let r = ran.clone();
    channel.set_break_callback(move |_| {
        r.fetch_add(1, Ordering::SeqCst);
        panic!("client break callback panics (contained)");
    });
    drop(channel);
    until("both break callbacks", &served.fabric, || ran.load(Ordering::SeqCst) == 2);
    // The server goes on serving.
    let channel = served.connect(ChannelConfig::new(NAME)).expect("connect");
    let mut rsp = Vec::new();
    channel.call(ECHO, b"still serving", &mut rsp).expect("call");
    assert_eq!(rsp, b"still serving");
}

/// Keepalive for both sides of the rendezvous tests: probes after 20 ms of silence, broken after
/// 60 ms (the server's limit follows the client's announcement: 20 ms × 4).
fn brisk() -> Keepalive {
    Keepalive { interval: Duration::from_millis(20), misses: 3 }
}

/// Where in an echo's rendezvous the device is held still.
#[derive(Debug, Clone, Copy)]
enum Phase {
    /// The server's READs of the arguments are posted.
    Reading,
    /// The server's WRITEs of the response are posted.
    Writing,
}

/// Issue 29: a rendezvous that outlasts keepalive's limit on both sides. On the Stepped engine
/// the device moves only when the test steps it, while keepalive runs on the real clock: the
/// test starts a 4 MiB echo, steps until the server's READs (or its WRITEs) are posted, and then
/// holds the device still for ten limits — a transfer that takes that long, over a transport
/// that is healthy (no timer runs on the frozen virtual clock, nothing is lost). Nothing reaches
/// either side meanwhile: the client's probe and its answer wait, as they wait behind a slow
/// transfer on a real link (the answer on the server's send queue behind its WRITEs, the probe
/// behind the READ responses). Neither side may declare the other broken: the client gives its
/// own rendezvous bytes time (a limit per 256 KiB it may still move), the server does not judge
/// while its own READs and WRITEs are outstanding. When the device moves again the echo
/// completes and both sides are open. Before the fix, the client closed the channel
/// (`ConnectionBroken(KeepaliveTimeout)`) and the server the connection, about one limit into
/// the hold.
fn a_rendezvous_that_outlasts_the_keepalive_limit_keeps_the_connection(phase: Phase) {
    const LEN: usize = 4 << 20;
    let rig = Rig::new(Engine::Stepped { seed: 0x29 }, Some(brisk()));
    let config = ChannelConfig {
        keepalive: Some(brisk()),
        client_info: format!("{phase:?}"),
        ..ChannelConfig::new(NAME)
    };
    let channel = rig.served.connect(config).expect("connect");
    let breaks = watch(&channel);
    let args: Vec<u8> = (0..LEN).map(|i| (i % 251) as u8).collect();
    let outcome: Outcome = Arc::default();
    let o = outcome.clone();
    let opts = CallOptions { max_response: LEN, ..Default::default() };
    channel
        .call_callback(&opts, ECHO, &args, move |r| *o.lock().unwrap() = Some(r.map(<[u8]>::to_vec)))
        .expect("start the echo");
    let started = |s: &RndvStats| match phase {
        Phase::Reading => s.peak_reads > 0,
        Phase::Writing => s.bytes_written > 0,
    };
    step_until(&format!("{phase:?}: the server's transfer under way"), &rig.fabric, || {
        started(&rig.server.rndv_stats())
    });
    assert!(outcome.lock().unwrap().is_none(), "{phase:?}: the echo is still moving");

    // The device holds still for ten client limits (the transfer takes that long).
    let limit = brisk().limit();
    let hold = Instant::now();
    while hold.elapsed() < limit * 10 || channel.stats().keepalive_probes == 0 {
        assert!(hold.elapsed() < WAIT_LIMIT, "{phase:?}: no probe in {WAIT_LIMIT:?}");
        assert!(
            !channel.is_closed() && breaks.count() == 0,
            "{phase:?}: the client gave up on a connection busy with its own rendezvous after {:?}: {:?}",
            hold.elapsed(),
            channel.close_reason()
        );
        assert_eq!(
            rig.server_breaks.all(),
            vec![],
            "{phase:?}: the server gave up on a connection busy with its own rendezvous after {:?}",
            hold.elapsed()
        );
        std::thread::sleep(Duration::from_millis(2));
    }

    step_until(&format!("{phase:?}: the echo's outcome"), &rig.fabric, || outcome.lock().unwrap().is_some());
    match outcome.lock().unwrap().take() {
        Some(Ok(rsp)) => assert!(rsp == args, "{phase:?}: the echo came back changed"),
        other => panic!("{phase:?}: the echo: {other:?} (close reason {:?})", channel.close_reason()),
    }
    assert_eq!(channel.close_reason(), None, "{phase:?}");
    assert_eq!(breaks.count(), 0, "{phase:?}");
    assert_eq!(rig.server_breaks.count(), 0, "{phase:?}");
    assert_eq!(rig.conn(channel.channel_id()).close_reason(), None, "{phase:?}");
    assert!(channel.stats().keepalive_probes >= 1, "{phase:?}: the hold was long enough to probe");
}

#[test]
fn a_rendezvous_outlasting_the_keepalive_limit_while_the_server_reads_keeps_the_connection() {
    a_rendezvous_that_outlasts_the_keepalive_limit_keeps_the_connection(Phase::Reading);
}

#[test]
fn a_rendezvous_outlasting_the_keepalive_limit_while_the_server_writes_keeps_the_connection() {
    a_rendezvous_that_outlasts_the_keepalive_limit_keeps_the_connection(Phase::Writing);
}

/// A link cut for good while the server READs a rendezvous call's arguments: the server does
/// not judge silence while its READs are out, but the RC transport ends them — they exhaust
/// their retries (`RetryExceeded`, counted in `RndvStats::failed`) — and the call, which has a
/// deadline far away and a client limit stretched by its 8 MiB in flight, ends with an error
/// instead of waiting (the client's probe, sent meanwhile, exhausts its retries too). Stepped engine: the transport's timers run on the virtual clock, which the
/// test moves on whenever nothing else is ready.
#[test]
fn a_link_cut_during_a_rendezvous_ends_the_call_by_rc_retry_exhaustion() {
    const LEN: usize = 4 << 20;
    let faults = FaultPlan { controls: true, ..FaultPlan::NONE };
    let engine = Engine::Stepped { seed: 0x29c };
    let rig = Rig::with_fabric(
        Fabric::with_config(FabricConfig { faults, ..FabricConfig::new(engine) }),
        Some(brisk()),
    );
    let config = ChannelConfig {
        keepalive: Some(brisk()),
        client_info: "cut-rndv".into(),
        ..ChannelConfig::new(NAME)
    };
    let channel = rig.served.connect(config).expect("connect");
    let outcome: Outcome = Arc::default();
    let o = outcome.clone();
    let opts = CallOptions { max_response: LEN, ..Default::default() };
    channel
        .call_callback(&opts, ECHO, &vec![3u8; LEN], move |r| {
            *o.lock().unwrap() = Some(r.map(<[u8]>::to_vec))
        })
        .expect("start the echo");
    step_until("the server's READs", &rig.fabric, || rig.server.rndv_stats().peak_reads > 0);
    rig.fabric.cut_link(rig.snic.addr(), rig.cnic.addr(), None).expect("cut");
    let start = Instant::now();
    while outcome.lock().unwrap().is_none() || rig.server.rndv_stats().failed == 0 {
        assert!(start.elapsed() < WAIT_LIMIT, "the call over a cut link did not end");
        if !rig.fabric.step() {
            rig.fabric.advance(Duration::from_millis(25));
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    let got = outcome.lock().unwrap().take();
    match got {
        // Which side's transport gives up first decides the form: the client's queue failed
        // (its probe exhausted its retries: `Queue`), or the channel closed.
        Some(Err(RpcError::Queue(_) | RpcError::Closed | RpcError::ConnectionBroken(_))) => {}
        other => panic!("the echo over a cut link: {other:?}"),
    }
}

/// Stepped engine: steps (or, when nothing is ready, lets the server's worker threads run) until
/// `cond` holds; bounded.
fn step_until(what: &str, fabric: &Fabric, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < WAIT_LIMIT, "gave up waiting for {what}");
        if !fabric.step() {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

/// The other side of the fix: a server that stops answering during a rendezvous (its stack
/// ignores probes, its handler keeps the request: a frozen process whose NIC still serves the
/// READs) is still found by the client's keepalive, for a call with no deadline at all — the
/// rendezvous stretches the limit by a limit per 256 KiB the server may still move, it does not
/// suspend it.
fn a_server_frozen_during_a_rendezvous_is_still_found(engine: Engine) {
    let rig = Rig::new(engine, None);
    let config = ChannelConfig {
        keepalive: Some(brisk()),
        timeout: None,
        client_info: "frozen-rndv".into(),
        ..ChannelConfig::new(NAME)
    };
    let channel = rig.served.connect(config).expect("connect");
    let breaks = watch(&channel);
    rig.conn(channel.channel_id()).ignore_probes_for_tests(true);
    let outcome: Outcome = Arc::default();
    let o = outcome.clone();
    let opts = CallOptions { timeout: None, rendezvous: true, ..Default::default() };
    channel
        .call_callback(&opts, HOLD, &vec![7u8; 300 << 10], move |r| {
            *o.lock().unwrap() = Some(r.map(<[u8]>::to_vec))
        })
        .expect("start");
    until("the break callback", &rig.fabric, || breaks.count() > 0);
    assert_eq!(breaks.all(), vec![(channel.channel_id(), CloseReason::KeepaliveTimeout)], "{engine:?}");
    match outcome.lock().unwrap().take() {
        Some(Err(RpcError::ConnectionBroken(CloseReason::KeepaliveTimeout))) => {}
        other => panic!("{engine:?}: the outstanding rendezvous call: {other:?}"),
    }
    assert_eq!(rig.held(), 1, "{engine:?}: the server had READ the arguments and held the request");
    drop(rig.held.lock().unwrap().drain(..));
}

/// And the server's side: a client that freezes with a rendezvous in flight (its NIC still
/// serves the READs) is dropped by the server once its transfers are over, as any silent client.
fn a_client_frozen_during_a_rendezvous_is_dropped_after_the_transfer(engine: Engine) {
    let rig = Rig::new(engine, Some(brisk()));
    let channel = rig.connect(Some(patient()), "frozen-rndv-client").expect("connect");
    let breaks = watch(&channel);
    until("a probe", &rig.fabric, || channel.stats().keepalive_probes >= 1);
    channel.freeze_keepalive_for_tests(true);
    let opts = CallOptions { timeout: None, rendezvous: true, ..Default::default() };
    channel.call_callback(&opts, HOLD, &vec![9u8; 1 << 20], |_| {}).expect("start");
    until("the server's break callback", &rig.fabric, || rig.server_breaks.count() > 0);
    assert_eq!(
        rig.server_breaks.all(),
        vec![(channel.channel_id(), CloseReason::KeepaliveTimeout)],
        "{engine:?}"
    );
    assert_eq!(rig.held(), 1, "{engine:?}: the READs were over (the handler had the request)");
    drop(rig.held.lock().unwrap().drain(..));
    until("the client's break callback", &rig.fabric, || breaks.count() > 0);
}

#[test]
fn keepalive_config_is_validated_by_name() {
    let fabric = Fabric::new(Engine::Inline);
    let (snic, cnic) = (fabric.add_nic(), fabric.add_nic());
    let bad = ServerConfig {
        keepalive: Some(Keepalive { interval: Duration::ZERO, misses: 3 }),
        ..ServerConfig::new(NAME)
    };
    match Server::bind(&snic, "127.0.0.1:0", bad, Functions::new()) {
        Err(RpcError::InvalidArgument(t)) => assert!(t.starts_with("ServerConfig.keepalive.interval"), "{t}"),
        other => panic!("{other:?}"),
    }
    let bad = ChannelConfig {
        keepalive: Some(Keepalive { interval: Duration::from_secs(1), misses: 0 }),
        ..ChannelConfig::new(NAME)
    };
    match Channel::connect(&cnic, "127.0.0.1:1", bad) {
        Err(RpcError::InvalidArgument(t)) => assert!(t.starts_with("ChannelConfig.keepalive.misses"), "{t}"),
        other => panic!("{other:?}"),
    }
    let d = Keepalive::default();
    assert_eq!((d.interval, d.misses), (Duration::from_secs(1), 5), "seconds-scale defaults");
    assert_eq!(ChannelConfig::default().keepalive, Some(d));
    assert_eq!(ServerConfig::default().keepalive, Some(d));
}

common::per_engine!(
    idle_connection_is_probed_and_stays_up,
    frozen_server_breaks_the_channel,
    cut_wire_breaks_the_channel,
    frozen_client_is_dropped_by_the_server,
    client_frozen_before_its_first_probe_is_dropped,
    connection_callbacks_and_contexts,
    panicking_break_callbacks_are_contained,
    a_server_frozen_during_a_rendezvous_is_still_found,
    a_client_frozen_during_a_rendezvous_is_dropped_after_the_transfer,
);
