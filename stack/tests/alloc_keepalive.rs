//! Keepalive allocates nothing in steady state: an idle channel whose monitor thread probes the
//! server over and over (the probe, the server's answer, collecting it) allocates nothing on any
//! thread. Counted with a global allocator (its own test binary, so no other test's allocations
//! mix in); the waits end on the probe counter, bounded, with no timing assertion.

use bypass::sim::{Engine, Fabric};
use bypass::{Channel, ChannelConfig, Functions, Keepalive, Server, ServerConfig};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

#[path = "common/counting_alloc.rs"]
mod counting_alloc;
use counting_alloc::{report, ALLOCATIONS, COUNTING};

/// Waits (bounded, allocation-free unless it gives up) until the channel sent `n` probes.
fn until_probes(channel: &Channel<bypass::sim::SimNic>, n: u64) {
    let start = Instant::now();
    while channel.stats().keepalive_probes < n {
        if start.elapsed() > Duration::from_secs(30) {
            COUNTING.store(false, Ordering::SeqCst);
            panic!("gave up waiting for {n} probes: {:?}", channel.stats());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn keepalive_probes_do_not_allocate_in_steady_state() {
    let fabric = Fabric::new(Engine::Inline);
    let (snic, cnic) = (fabric.add_nic(), fabric.add_nic());
    // Probes every 10 ms of silence; a limit (10 s) that a loaded machine does not reach.
    let keepalive = Some(Keepalive { interval: Duration::from_millis(10), misses: 1000 });
    let server = Server::bind(
        &snic,
        "127.0.0.1:0",
        ServerConfig { keepalive, ..ServerConfig::new("ka") },
        Functions::new(),
    )
    .unwrap();
    let config = ChannelConfig { keepalive, ..ChannelConfig::new("ka") };
    let channel = Channel::connect(&cnic, server.local_addr(), config).unwrap();
    // Warm up: the monitor thread's reusable call slots, the server's first answers.
    until_probes(&channel, 5);
    let before = channel.stats().keepalive_probes;
    COUNTING.store(true, Ordering::SeqCst);
    until_probes(&channel, before + 50);
    COUNTING.store(false, Ordering::SeqCst);
    let n = ALLOCATIONS.load(Ordering::SeqCst);
    assert!(!channel.is_closed());
    assert_eq!(n, 0, "{n} allocations during 50 keepalive probes; the first:\n{}", report());
}
