//! Regression tests: the server's handshakes must not wait on each other (an idle TCP
//! connection must not block real clients), large message sizes must not multiply into
//! gigabytes of registered memory, an idle server's worker must sleep by default, and a reply
//! posted just before the server closes (or by a handler that then closes its own connection)
//! must still reach the client.
//!
//! Every wait is bounded (by [`WAIT_LIMIT`] or a round count) and panics with what it saw; no
//! test asserts timing or sleeps to "wait enough".

use bypass::sim::{Engine, Fabric, SimNic};
use bypass::*;
use std::time::{Duration, Instant};

mod common;
use common::helpers;
use common::ids::ECHO;
use helpers::{echo_functions, poll_once, until, WAIT_LIMIT};

const NAME: &str = "regress";
// ---- Defect 9: the default worker spins briefly, then sleeps on the CQs' event fds. ----

/// With the default config an idle server's worker sleeps (counted in its stats), wakes on a
/// completion, and calls keep completing.
fn idle_worker_sleeps(engine: Engine) {
    assert_eq!(ServerConfig::default().mode, PollMode::Adaptive, "adaptive polling is the default");
    let fabric = Fabric::new(engine);
    let (snic, cnic) = (fabric.add_nic(), fabric.add_nic());
    let server =
        Server::bind(&snic, "127.0.0.1:0", ServerConfig::new(NAME), echo_functions(ECHO)).expect("bind");
    let channel = Channel::connect(&cnic, server.local_addr(), ChannelConfig::new(NAME)).expect("connect");
    let mut resp = Vec::new();
    for round in 0..3 {
        let before = server.worker_stats();
        // Idle: the worker must go to sleep (again).
        until(
            &format!("round {round}: the idle worker to sleep (stats {:?})", server.worker_stats()),
            || fabric.progress(),
            || server.worker_stats().sleeps > before.sleeps,
        );
        // A call wakes it and completes.
        for i in 0..20u8 {
            channel.call(ECHO, &[round, i], &mut resp).expect("call after the worker slept");
            assert_eq!(resp, [round, i]);
        }
    }
    let s = server.worker_stats();
    assert!(
        s.wakeups + s.sleep_timeouts >= s.sleeps.saturating_sub(1),
        "every sleep but the current ends: {s:?}"
    );
    // Each round's first call reached a sleeping worker: at least one of them woke it through
    // the CQ's event fd (calls would also complete if every sleep merely timed out, so this is
    // what shows the event path works).
    assert!(s.wakeups > 0, "no sleep ended by a completion event: {s:?}");
    assert_eq!(server.stats().responses, 60);
}

#[test]
fn idle_worker_sleeps_inline() {
    idle_worker_sleeps(Engine::Inline)
}

#[test]
fn idle_worker_sleeps_threaded() {
    idle_worker_sleeps(Engine::Threaded)
}

/// Stepped: nothing moves unless the test steps the fabric, so a server worker that sleeps can
/// only be woken by the event fd of a completion the test's stepping produced.
#[test]
fn idle_worker_sleeps_and_wakes_on_events_stepped() {
    let fabric = Fabric::new(Engine::Stepped { seed: 0x5EED_0009 });
    let (snic, cnic) = (fabric.add_nic(), fabric.add_nic());
    let server =
        Server::bind(&snic, "127.0.0.1:0", ServerConfig::new(NAME), echo_functions(ECHO)).expect("bind");
    let channel = Channel::connect(&cnic, server.local_addr(), ChannelConfig::new(NAME)).expect("connect");
    for i in 0..5u8 {
        let before = server.worker_stats();
        until("the idle worker to sleep", || {}, || server.worker_stats().sleeps > before.sleeps);
        let mut fut = channel.call_future(&CallOptions::default(), ECHO, &[i; 3]).expect("start a call");
        until(
            "a call to complete while the server's worker sleeps between completions",
            || {
                fabric.run_until_idle();
                channel.poll();
            },
            || fut.is_done(),
        );
        assert_eq!(poll_once(&mut fut).expect("done").expect("call"), [i; 3]);
    }
    assert!(server.worker_stats().wakeups > 0, "{:?}", server.worker_stats());
}

/// `PollMode::Busy` is still there and never sleeps.
#[test]
fn busy_mode_never_sleeps() {
    let fabric = Fabric::new(Engine::Inline);
    let (snic, cnic) = (fabric.add_nic(), fabric.add_nic());
    let config = ServerConfig { mode: PollMode::Busy, ..ServerConfig::new(NAME) };
    let server = Server::bind(&snic, "127.0.0.1:0", config, echo_functions(ECHO)).expect("bind");
    let channel = Channel::connect(&cnic, server.local_addr(), ChannelConfig::new(NAME)).expect("connect");
    let mut resp = Vec::new();
    for i in 0..100u8 {
        channel.call(ECHO, &[i], &mut resp).expect("call");
    }
    assert_eq!(server.worker_stats(), WorkerStats::default());
}

// ---- Defect 4: handshakes do not wait on each other. ----

/// Idle TCP connections (connected, silent) and one that sent half a frame header.
fn idle_connections(server: &Server<SimNic>, n: usize) -> Vec<std::net::TcpStream> {
    use std::io::Write;
    let mut idle: Vec<std::net::TcpStream> = (0..n)
        .map(|_| std::net::TcpStream::connect(server.local_addr()).expect("idle TCP connect"))
        .collect();
    let mut trickler = std::net::TcpStream::connect(server.local_addr()).expect("trickler TCP connect");
    trickler.write_all(b"BYPC\x01").expect("half a header");
    idle.push(trickler);
    idle
}

/// With many idle connections to its port (and a 60 s handshake timeout), a real client still
/// connects within its own 3 s connect timeout, and calls work.
fn idle_connections_do_not_block_handshakes(engine: Engine) {
    let fabric = Fabric::new(engine);
    let (snic, cnic) = (fabric.add_nic(), fabric.add_nic());
    let real = !matches!(engine, Engine::Stepped { .. });
    let config = ServerConfig {
        handshake_timeout: Duration::from_secs(60),
        workers: if real { 1 } else { 0 },
        ..ServerConfig::new(NAME)
    };
    let server = Server::bind(&snic, "127.0.0.1:0", config, echo_functions(ECHO)).expect("bind");
    let idle = idle_connections(&server, 16);
    let ccfg = ChannelConfig { connect_timeout: Duration::from_secs(3), ..ChannelConfig::new(NAME) };
    let channels: Vec<Channel<SimNic>> = (0..3)
        .map(|i| {
            Channel::connect(&cnic, server.local_addr(), ccfg.clone())
                .unwrap_or_else(|e| panic!("connect {i} behind {} idle connections: {e}", idle.len()))
        })
        .collect();
    assert_eq!(server.connections(), 3);
    assert_eq!(server.stats().handshake_timeouts, 0, "nobody timed out yet (60 s)");
    if real {
        let mut resp = Vec::new();
        for ch in &channels {
            ch.call(ECHO, b"through", &mut resp).expect("call");
            assert_eq!(resp, b"through");
        }
    }
    drop(idle);
}

#[test]
fn idle_connections_do_not_block_handshakes_inline() {
    idle_connections_do_not_block_handshakes(Engine::Inline)
}

#[test]
fn idle_connections_do_not_block_handshakes_threaded() {
    idle_connections_do_not_block_handshakes(Engine::Threaded)
}

#[test]
fn idle_connections_do_not_block_handshakes_stepped() {
    idle_connections_do_not_block_handshakes(Engine::Stepped { seed: 0x5EED_0004 })
}

/// Idle connections are closed by the server at their handshake timeout, counted, and the
/// server keeps accepting.
#[test]
fn idle_connections_are_dropped_at_the_handshake_timeout() {
    use std::io::Read;
    let fabric = Fabric::new(Engine::Inline);
    let (snic, cnic) = (fabric.add_nic(), fabric.add_nic());
    let config = ServerConfig { handshake_timeout: Duration::from_millis(200), ..ServerConfig::new(NAME) };
    let server = Server::bind(&snic, "127.0.0.1:0", config, echo_functions(ECHO)).expect("bind");
    let idle = idle_connections(&server, 8);
    let n = idle.len() as u64;
    for (i, mut s) in idle.into_iter().enumerate() {
        // Bounded: the server closes it after 200 ms; WAIT_LIMIT is only a safety net.
        s.set_read_timeout(Some(WAIT_LIMIT)).expect("read timeout");
        let mut buf = [0u8; 64];
        match s.read(&mut buf) {
            Ok(0) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            other => panic!("idle connection {i}: expected the server to close it, got {other:?}"),
        }
    }
    until("the server to count the timeouts", || {}, || server.stats().handshake_timeouts == n);
    assert_eq!(server.stats().connections, 0);
    let channel =
        Channel::connect(&cnic, server.local_addr(), ChannelConfig::new(NAME)).expect("connect after");
    let mut resp = Vec::new();
    channel.call(ECHO, b"after", &mut resp).expect("call");
    assert_eq!(server.stats().handshake_timeouts, n);
}

// ---- Defect 6: large messages do not multiply into gigabytes of registered memory. ----

const MIB: usize = 1 << 20;

/// A 16 MiB message size with the default window connects within the default memory limit on
/// both sides (the window is scaled down), and multi-MiB calls work.
fn large_messages_fit_the_memory_limit(engine: Engine) {
    let fabric = Fabric::new(engine);
    let (snic, cnic) = (fabric.add_nic(), fabric.add_nic());
    let scfg = ServerConfig { msg_size: 16 * MIB, ..ServerConfig::new(NAME) };
    let server = Server::bind(&snic, "127.0.0.1:0", scfg, echo_functions(ECHO)).expect("bind");
    let ccfg = ChannelConfig { msg_size: 16 * MIB, ..ChannelConfig::new(NAME) };
    assert_eq!(ccfg.memory_limit, DEFAULT_MEMORY_LIMIT);
    let channel = Channel::connect(&cnic, server.local_addr(), ccfg).expect("connect with 16 MiB messages");
    let registered = channel.stats().registered_bytes;
    assert!(registered > 0 && registered <= DEFAULT_MEMORY_LIMIT, "client registered {registered} bytes");
    // The memory limit caps the connection and, separately, the server's shared receive pool
    // (scaled down to 16 buffers of 16 MiB).
    let pool = server.stats().shared_recv_buffers * (16 * MIB) as u64;
    assert!(pool > 0 && pool <= DEFAULT_MEMORY_LIMIT, "the shared pool has {pool} bytes");
    let on_server = server.registered_bytes() - pool;
    assert!(on_server > 0 && on_server <= DEFAULT_MEMORY_LIMIT, "server registered {on_server} bytes");
    let window = channel.window();
    assert!((1..32).contains(&window), "the window is scaled down for 16 MiB messages: {window}");
    assert_eq!(channel.stats().credits, u64::from(window));
    assert_eq!(channel.max_request_args(), 16 * MIB - 20);
    let mut resp = Vec::new();
    for len in [3 * MIB + 7, 16 * MIB - 20] {
        // The largest request: 16 MiB less the 20-byte header.
        let args: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        channel.call(ECHO, &args, &mut resp).unwrap_or_else(|e| panic!("echo of {len} bytes: {e}"));
        assert!(resp == args, "echo of {len} bytes came back different ({} bytes)", resp.len());
    }
}

#[test]
fn large_messages_fit_the_memory_limit_inline() {
    large_messages_fit_the_memory_limit(Engine::Inline)
}

#[test]
fn large_messages_fit_the_memory_limit_threaded() {
    large_messages_fit_the_memory_limit(Engine::Threaded)
}

/// Configs whose buffers cannot fit their memory limit even at a window of 1 fail at once, with
/// an error naming the limit: the client before any I/O, the server at bind, and a client
/// asking for more queues than the server's limit allows when it connects.
#[test]
fn over_the_memory_limit_fails_fast_naming_it() {
    let fabric = Fabric::new(Engine::Inline);
    let (snic, cnic) = (fabric.add_nic(), fabric.add_nic());
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr")
    };
    let small = ChannelConfig { msg_size: 16 * MIB, memory_limit: 64 << 20, ..ChannelConfig::new(NAME) };
    match Channel::connect(&cnic, dead, small) {
        Err(RpcError::InvalidArgument(text)) => {
            assert!(text.contains("ChannelConfig.memory_limit"), "{text}")
        }
        other => panic!("a channel over its memory limit: {other:?}"),
    }
    // Per-connection receive buffers: with the shared pool (the default) a connection holds only
    // send buffers, and both of these fit.
    let per_conn = RecvBuffers::PerConnection;
    let small = ServerConfig {
        msg_size: 16 * MIB,
        memory_limit: 64 << 20,
        recv_buffers: per_conn,
        ..ServerConfig::new(NAME)
    };
    match Server::bind(&snic, "127.0.0.1:0", small, echo_functions(ECHO)) {
        Err(RpcError::InvalidArgument(text)) => assert!(text.contains("ServerConfig.memory_limit"), "{text}"),
        other => panic!("a server over its memory limit: {other:?}"),
    }
    // The server fits one queue of 16 MiB messages (5 buffers at window 1), not four.
    let scfg = ServerConfig { msg_size: 16 * MIB, recv_buffers: per_conn, ..ServerConfig::new(NAME) };
    let server = Server::bind(&snic, "127.0.0.1:0", scfg, echo_functions(ECHO)).expect("bind");
    let ccfg =
        ChannelConfig { msg_size: 16 * MIB, queues: 4, memory_limit: 1 << 30, ..ChannelConfig::new(NAME) };
    match Channel::connect(&cnic, server.local_addr(), ccfg) {
        Err(RpcError::Control(control::ControlError::Rejected(reason))) => {
            assert!(reason.contains("ServerConfig.memory_limit"), "{reason}")
        }
        other => panic!("four 16 MiB queues against a 256 MiB server limit: {other:?}"),
    }
    assert_eq!(server.registered_bytes(), 0, "nothing stays registered for the refused client");
}

// ---- A reply posted just before the server closes the connection reaches the client. ----

/// A handler answers, and the application closes the connection before the server's NIC has
/// sent the answer (Stepped: nothing is sent until the test steps). The close lingers until the
/// client has the reply, and the client, seeing the server close, first takes what already
/// arrived: the call succeeds. (Before: the close failed the queue at once, discarding the
/// reply, and the call failed with Closed — the C API's two-process one-sided test hit it when
/// its server shut down right after answering QUIT.)
#[test]
fn a_reply_posted_before_the_close_reaches_the_client() {
    use std::sync::atomic::{AtomicU8, Ordering};
    use std::sync::{Arc, Mutex};
    // 0: waiting; 1: the handler runs; 2: the test let it reply; 3: it replied.
    let stage = Arc::new(AtomicU8::new(0));
    let conn: Arc<Mutex<Option<Connection<SimNic>>>> = Arc::default();
    let mut functions = Functions::new();
    let (s, c) = (stage.clone(), conn.clone());
    functions.register(ECHO, move |req| {
        *c.lock().unwrap() = Some(req.connection());
        s.store(1, Ordering::Release);
        let start = Instant::now();
        while s.load(Ordering::Acquire) != 2 && start.elapsed() < WAIT_LIMIT {
            std::thread::yield_now();
        }
        let _ = req.reply_with(Status::Success, |args, out| {
            out.get_mut(..args.len()).ok_or(args.len())?.copy_from_slice(args);
            Ok(args.len())
        });
        s.store(3, Ordering::Release);
    });
    let fabric = Fabric::new(Engine::Stepped { seed: 0x5EED_0C10 });
    let (snic, cnic) = (fabric.add_nic(), fabric.add_nic());
    let server = Server::bind(&snic, "127.0.0.1:0", ServerConfig::new(NAME), functions).expect("bind");
    let channel = Channel::connect(&cnic, server.local_addr(), ChannelConfig::new(NAME)).expect("connect");
    let mut fut = channel.call_future(&CallOptions::default(), ECHO, b"last words").expect("start a call");
    until(
        "the handler to run",
        || {
            fabric.step();
        },
        || stage.load(Ordering::Acquire) == 1,
    );
    // No stepping from here until the close waits: the reply stays unsent.
    stage.store(2, Ordering::Release);
    until("the handler to reply", || {}, || stage.load(Ordering::Acquire) == 3);
    let conn = conn.lock().unwrap().take().expect("the handler kept its connection");
    let close = std::thread::spawn(move || conn.close());
    until("the close to wait for the reply", || {}, || server.stats().lingers == 1 || close.is_finished());
    until(
        "the close to finish",
        || {
            fabric.step();
        },
        || close.is_finished(),
    );
    close.join().expect("close");
    // The channel is not polled here: what ends the call is the client seeing the server close.
    until(
        "the call to end",
        || {
            fabric.step();
        },
        || fut.is_done(),
    );
    assert!(channel.is_closed());
    assert_eq!(poll_once(&mut fut).expect("done").expect("the call the server answered"), b"last words");
    let stats = server.stats();
    assert_eq!((stats.lingers, stats.linger_timeouts), (1, 0), "{stats:?}");
}

/// Review finding: a handler that answers and then closes its own connection lost its answer.
/// The reply waited in the worker's outbox (posted at the end of the pass), the close waited
/// the whole linger for it to be acknowledged, then failed the queues under it.
#[test]
fn a_handler_that_replies_then_closes_its_connection_is_heard() {
    let mut functions = Functions::new();
    functions.register(ECHO, move |req| {
        let conn = req.connection();
        let _ = req.reply_with(Status::Success, |args, out| {
            out.get_mut(..args.len()).ok_or(args.len())?.copy_from_slice(args);
            Ok(args.len())
        });
        conn.close();
    });
    let fabric = Fabric::new(Engine::Stepped { seed: 0x5EED_0C11 });
    let (snic, cnic) = (fabric.add_nic(), fabric.add_nic());
    let server = Server::bind(&snic, "127.0.0.1:0", ServerConfig::new(NAME), functions).expect("bind");
    let channel = Channel::connect(&cnic, server.local_addr(), ChannelConfig::new(NAME)).expect("connect");
    let mut fut = channel.call_future(&CallOptions::default(), ECHO, b"goodbye").expect("start a call");
    until(
        "the call to end",
        || {
            fabric.step();
        },
        || fut.is_done(),
    );
    assert_eq!(poll_once(&mut fut).expect("done").expect("the answer before the close"), b"goodbye");
    until(
        "the channel to see the close",
        || {
            fabric.step();
        },
        || channel.is_closed(),
    );
    let stats = server.stats();
    assert_eq!((stats.lingers, stats.linger_timeouts), (1, 0), "{stats:?}");
}
