//! The server's shared receive pool (`RecvBuffers::Shared`): many connections with full windows
//! against a pool far smaller than their windows complete every call (the surplus waits at the
//! NIC, RNR, and is resent); a pool survives queue recoveries and closed connections with every
//! buffer (none lost, none posted twice); `RecvBuffers::PerConnection` and a device without
//! shared receive queues keep per-connection buffers.
//!
//! Every wait is bounded ([`WAIT_LIMIT`]) and ends on observable state; no timing assertions.

use bypass::sim::{Engine, Fabric, FabricConfig, SimNic};
use bypass::*;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod common;
use common::helpers::{echo_and_hold, Held};
use common::ids::{ECHO, HOLD};

const NAME: &str = "shared";
const WAIT_LIMIT: Duration = Duration::from_secs(60);

type Outcomes = Arc<Mutex<Vec<Option<Result<Vec<u8>, RpcError>>>>>;

fn server(fabric_nic: &SimNic, recv_buffers: RecvBuffers, held: &Held) -> Server<SimNic> {
    let config = ServerConfig { recv_buffers, ..ServerConfig::new(NAME) };
    Server::bind(fabric_nic, "127.0.0.1:0", config, echo_and_hold(held)).expect("bind")
}

fn connect(nic: &SimNic, server: &Server<SimNic>, window: u32) -> Channel<SimNic> {
    let config = ChannelConfig { window, ..ChannelConfig::new(NAME) };
    Channel::connect(nic, server.local_addr(), config).expect("connect")
}

/// Polls (the fabric and `channels`) until `cond`, at most [`WAIT_LIMIT`].
fn until(what: &str, fabric: &Fabric, channels: &[&Channel<SimNic>], mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < WAIT_LIMIT, "gave up waiting for {what}");
        fabric.progress();
        for c in channels {
            c.poll();
        }
        std::thread::yield_now();
    }
}

/// Starts `n` calls of `function` on `channel`, the i-th with arguments `[tag, i]`.
fn start(channel: &Channel<SimNic>, function: FunctionId, tag: u8, n: usize) -> Outcomes {
    let outcomes: Outcomes = Arc::new(Mutex::new((0..n).map(|_| None).collect()));
    for i in 0..n {
        let o = outcomes.clone();
        let opts = CallOptions { timeout: None, ..Default::default() };
        channel
            .call_callback(&opts, function, &[tag, i as u8], move |r| {
                let slot = &mut o.lock().unwrap()[i];
                assert!(slot.is_none(), "call {tag}/{i} completed twice");
                *slot = Some(r.map(<[u8]>::to_vec));
            })
            .expect("start a call");
    }
    outcomes
}

fn all_echoed(outcomes: &Outcomes, tag: u8) -> bool {
    let o = outcomes.lock().unwrap();
    let errs: Vec<String> = o
        .iter()
        .enumerate()
        .filter_map(|(i, r)| match r {
            Some(Err(e)) => Some(format!("{i}: {e:?}")),
            _ => None,
        })
        .collect();
    assert!(errs.is_empty(), "calls of {tag} failed: {errs:?}");
    o.iter().enumerate().all(|(i, r)| match r {
        Some(Ok(v)) => {
            assert_eq!(v, &[tag, i as u8], "call {tag}/{i} got another call's response");
            true
        }
        Some(Err(e)) => panic!("call {tag}/{i} failed: {e}"),
        None => false,
    })
}

/// Replies to every held request with its arguments; returns how many were held at once.
fn reply_held(held: &Held) -> usize {
    let taken: Vec<_> = held.lock().unwrap().drain(..).collect();
    let n = taken.len();
    for r in taken {
        let args = r.args().to_vec();
        r.reply(&args).expect("reply");
    }
    n
}

/// 8 connections × a window of 16 (128 requests at once) against a pool of 4 buffers. The
/// handler holds its requests, so no more than 4 are ever in progress; the other requests wait
/// at the client NICs (RNR NAKs, resent, `rnr_retry = 7`). Every call completes with its own
/// response, no queue fails, and the server's stats show the pool running dry.
fn tiny_pool_serves_many_full_windows(engine: Engine) {
    const POOL: u32 = 4;
    const CHANNELS: usize = 8;
    const WINDOW: u32 = 16;
    let fabric = Fabric::new(engine);
    let snic = fabric.add_nic();
    let held = Held::default();
    let server = server(&snic, RecvBuffers::Shared { buffers: POOL }, &held);
    let nics: Vec<SimNic> = (0..CHANNELS).map(|_| fabric.add_nic()).collect();
    let channels: Vec<Channel<SimNic>> = nics.iter().map(|n| connect(n, &server, WINDOW)).collect();
    let refs: Vec<&Channel<SimNic>> = channels.iter().collect();
    assert_eq!(server.stats().shared_recv_buffers, u64::from(POOL));
    for round in 0..2u8 {
        let outcomes: Vec<(u8, Outcomes)> = channels
            .iter()
            .enumerate()
            .map(|(c, ch)| {
                assert_eq!(ch.window(), WINDOW);
                let tag = round * 100 + c as u8;
                (tag, start(ch, HOLD, tag, WINDOW as usize))
            })
            .collect();
        // Nothing is answered until the handler holds the whole pool: the pool is then dry.
        until("the pool to fill", &fabric, &refs, || held.lock().unwrap().len() == POOL as usize);
        assert!(server.stats().shared_recv_dry > 0, "{engine:?}: {:?}", server.stats());
        until("every call to complete", &fabric, &refs, || {
            let n = reply_held(&held);
            assert!(n <= POOL as usize, "{n} requests in progress with a pool of {POOL}");
            outcomes.iter().all(|(tag, o)| all_echoed(o, *tag))
        });
    }
    let s = server.stats();
    assert_eq!(s.requests, 2 * (CHANNELS as u64) * u64::from(WINDOW), "{engine:?}: {s:?}");
    assert_eq!(s.responses, s.requests, "{engine:?}: {s:?}");
    assert!(s.shared_recv_dry > 0, "{engine:?}: the pool never ran dry: {s:?}");
    for ch in &channels {
        let cs = ch.stats();
        assert_eq!(cs.recoveries, 0, "{engine:?}: no queue failed: {cs:?}");
        assert!(!ch.is_closed());
    }
    assert_eq!(server.connections(), CHANNELS);
}

/// A pool of 8: a queue recovery with requests held (their buffers come back from the old
/// life), a connection closed with requests held, and one closed with requests in flight leave
/// all 8 buffers in the pool: 8 requests can be held at once afterwards, and every echo is its
/// own (a buffer posted twice would mix two requests up).
fn pool_survives_recovery_and_closes(engine: Engine) {
    const POOL: usize = 8;
    let fabric = Fabric::new(engine);
    let snic = fabric.add_nic();
    let held = Held::default();
    let server = server(&snic, RecvBuffers::Shared { buffers: POOL as u32 }, &held);
    let (na, nb, nc) = (fabric.add_nic(), fabric.add_nic(), fabric.add_nic());
    let a = connect(&na, &server, 8);
    // Recovery with three requests held by the handler.
    let old = start(&a, HOLD, 1, 3);
    until("3 held", &fabric, &[&a], || held.lock().unwrap().len() == 3);
    a.fail_queue(0).expect("fail queue 0");
    until("the held calls to fail", &fabric, &[&a], || {
        old.lock().unwrap().iter().all(|o| matches!(o, Some(Err(RpcError::Queue(_)))))
    });
    until("the recovery", &fabric, &[&a], || a.stats().recoveries == 1 && a.stats().ready_queues == 1);
    for r in held.lock().unwrap().drain(..) {
        assert!(r.reply(b"zombie").is_err(), "{engine:?}: a reply into the queue's old life");
    }
    // A connection closed while the server holds two of its requests.
    let b = connect(&nb, &server, 8);
    let _b_calls = start(&b, HOLD, 2, 2);
    until("2 held", &fabric, &[&a, &b], || held.lock().unwrap().len() == 2);
    b.close();
    until("the server to see b close", &fabric, &[&a], || server.connections() == 1);
    drop(held.lock().unwrap().drain(..));
    // A connection closed with echo calls in flight.
    let c = connect(&nc, &server, 8);
    let _c_calls = start(&c, ECHO, 3, 8);
    c.close();
    until("the server to see c close", &fabric, &[&a], || server.connections() == 1);
    drop(c);
    // Every buffer is back: the handler can hold POOL requests at once.
    let full = start(&a, HOLD, 4, POOL);
    until("the whole pool held", &fabric, &[&a], || held.lock().unwrap().len() == POOL);
    assert_eq!(reply_held(&held), POOL);
    until("the held calls to complete", &fabric, &[&a], || all_echoed(&full, 4));
    let more = start(&a, ECHO, 5, 8);
    until("echo calls", &fabric, &[&a], || all_echoed(&more, 5));
    assert_eq!(server.stats().shared_recv_buffers, POOL as u64);
    assert!(!a.is_closed());
}

common::per_engine!(tiny_pool_serves_many_full_windows, pool_survives_recovery_and_closes);

/// Registered bytes of a server with two idle connections (one queue, window 32), and its
/// stats' pool size.
fn two_idle_connections(fabric: &Fabric, recv_buffers: RecvBuffers) -> (u64, u64) {
    let snic = fabric.add_nic();
    let held = Held::default();
    let server = server(&snic, recv_buffers, &held);
    let (n1, n2) = (fabric.add_nic(), fabric.add_nic());
    let chans = [connect(&n1, &server, 32), connect(&n2, &server, 32)];
    for (i, ch) in chans.iter().enumerate() {
        let mut rsp = Vec::new();
        ch.call(ECHO, &[i as u8], &mut rsp).expect("echo");
        assert_eq!(rsp, [i as u8]);
    }
    (server.registered_bytes(), server.stats().shared_recv_buffers)
}

/// Per-connection buffers when the config asks for them or the device has no shared receive
/// queues; the difference is the connections' receive buffers, `window + 16` per queue.
#[test]
fn per_connection_buffers_when_asked_or_unsupported() {
    let fabric = Fabric::new(Engine::Inline);
    let (shared, pool) = two_idle_connections(&fabric, RecvBuffers::Shared { buffers: 64 });
    assert_eq!(pool, 64);
    let (own, none) = two_idle_connections(&fabric, RecvBuffers::PerConnection);
    assert_eq!(none, 0, "PerConnection: no pool");
    let per_conn_recv = (32 + 16) * 4096;
    assert_eq!(own - (shared - 64 * 4096), 2 * per_conn_recv, "own {own}, shared {shared}");
    let mut config = FabricConfig::new(Engine::Inline);
    config.caps.max_shared_recv = 0;
    let plain = Fabric::with_config(config);
    let (fallback, none) = two_idle_connections(&plain, RecvBuffers::default());
    assert_eq!(none, 0, "a device without shared receive queues: no pool");
    assert_eq!(fallback, own, "the fallback is the per-connection layout");
}

#[test]
fn recv_buffers_config_is_validated_by_name() {
    let fabric = Fabric::new(Engine::Inline);
    let caps = hal::Device::caps(&fabric.add_nic());
    let bad = ServerConfig { recv_buffers: RecvBuffers::Shared { buffers: 0 }, ..ServerConfig::new(NAME) };
    match bad.validate(&caps) {
        Err(RpcError::InvalidArgument(t)) => assert!(t.starts_with("ServerConfig.recv_buffers"), "{t}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        ServerConfig::default().recv_buffers,
        RecvBuffers::Shared { buffers: DEFAULT_SHARED_RECV_BUFFERS }
    );
}
