//! A steady loop of blocking 64-byte calls allocates nothing: not on the calling thread, not on
//! the server's worker (busy or going to sleep between bursts), not in the simulated NICs; with
//! the server's shared receive pool (the default) and with per-connection receive buffers. Nor
//! does one thread that starts callback calls and polls both the channel and a server with no
//! workers (`Server::poll`, which once copied its connection list on every call).
//! Counted with a global allocator, so the result is deterministic (no timing involved); one test
//! function, so nothing else runs while it counts.

use bypass::sim::{Engine, Fabric};
use bypass::{CallOptions, Channel, ChannelConfig, RecvBuffers, Server, ServerConfig};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

mod common;
use common::helpers::echo_functions;
use common::ids::ECHO;

#[path = "common/counting_alloc.rs"]
mod counting_alloc;
use counting_alloc::{report, ALLOCATIONS, COUNTING};

#[test]
fn blocking_64_byte_calls_do_not_allocate_in_steady_state() {
    for recv_buffers in [RecvBuffers::default(), RecvBuffers::PerConnection] {
        steady_state(recv_buffers);
    }
    one_thread_polled();
}

/// Callback calls finished (a static, so the callbacks capture nothing and boxing them
/// allocates nothing: what is counted is the library's own allocation).
static FINISHED: AtomicU64 = AtomicU64::new(0);

/// Waits (at most 10 s) until setting up the server's one connection is over on every thread:
/// the acceptor has handed it to the control loop (which then counts it accepted) and the loop
/// has registered every connection handed to it. Counting earlier would catch a slow acceptor's
/// setup allocations (seen on a loaded machine: `ServerInner::watch` on `bypass-accept`).
fn settle(server: &Server<bypass::sim::SimNic>) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.stats().connections < 1 || !bypass::control_loop_settled_for_tests() {
        assert!(Instant::now() < deadline, "the connection's setup did not finish in 10 s");
        std::thread::yield_now();
    }
}

fn one_thread_polled() {
    let fabric = Fabric::new(Engine::Inline);
    let (snic, cnic) = (fabric.add_nic(), fabric.add_nic());
    let config = ServerConfig { workers: 0, ..ServerConfig::new("alloc") };
    let server = Server::bind(&snic, "127.0.0.1:0", config, echo_functions(ECHO)).unwrap();
    let channel = Channel::connect(&cnic, server.local_addr(), ChannelConfig::new("alloc")).unwrap();
    let args = [0x5Au8; 64];
    let opts = CallOptions::default();
    let round_trip = || {
        let before = FINISHED.load(Ordering::Relaxed);
        channel
            .call_callback(&opts, ECHO, &args, |r| {
                assert_eq!(r.expect("the echo call failed"), [0x5Au8; 64]);
                FINISHED.fetch_add(1, Ordering::Relaxed);
            })
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while FINISHED.load(Ordering::Relaxed) == before {
            assert!(Instant::now() < deadline, "a polled call did not finish in 10 s");
            server.poll();
            channel.poll();
        }
    };
    for _ in 0..2_000 {
        round_trip();
    }
    settle(&server);
    ALLOCATIONS.store(0, Ordering::SeqCst);
    COUNTING.store(true, Ordering::SeqCst);
    for _ in 0..10_000 {
        round_trip();
    }
    COUNTING.store(false, Ordering::SeqCst);
    let n = ALLOCATIONS.load(Ordering::SeqCst);
    assert_eq!(n, 0, "{n} heap allocations in 10,000 polled one-thread calls; the first:\n{}", report());
}

fn steady_state(recv_buffers: RecvBuffers) {
    let fabric = Fabric::new(Engine::Inline);
    let (snic, cnic) = (fabric.add_nic(), fabric.add_nic());
    let config = ServerConfig { recv_buffers, ..ServerConfig::new("alloc") };
    let server = Server::bind(&snic, "127.0.0.1:0", config, echo_functions(ECHO)).unwrap();
    let shared = server.stats().shared_recv_buffers > 0;
    assert_eq!(shared, recv_buffers != RecvBuffers::PerConnection, "{recv_buffers:?}");
    let channel = Channel::connect(&cnic, server.local_addr(), ChannelConfig::new("alloc")).unwrap();
    let args = [0x5Au8; 64];
    let mut response = Vec::new();
    for _ in 0..2_000 {
        channel.call(ECHO, &args, &mut response).unwrap();
    }
    settle(&server);
    ALLOCATIONS.store(0, Ordering::SeqCst);
    COUNTING.store(true, Ordering::SeqCst);
    for _ in 0..5 {
        for _ in 0..2_000 {
            channel.call(ECHO, &args, &mut response).unwrap();
        }
        // An idle spell: the server's worker goes to sleep on its event fds and is woken by the
        // next call. A busy machine does this at random moments; here every run does it, so a
        // sleep that allocates fails every time rather than now and then.
        let sleeps = server.worker_stats().sleeps;
        let deadline = Instant::now() + Duration::from_secs(10);
        while server.worker_stats().sleeps == sleeps {
            assert!(Instant::now() < deadline, "the server's worker never went to sleep in 10 s");
            std::thread::yield_now();
        }
    }
    COUNTING.store(false, Ordering::SeqCst);
    assert_eq!(response, args);
    let n = ALLOCATIONS.load(Ordering::SeqCst);
    assert_eq!(
        n,
        0,
        "{recv_buffers:?}: {n} heap allocations in 10,000 blocking 64-byte calls (all threads); the first:\n{}",
        report()
    );
}
