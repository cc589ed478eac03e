//! Batched calls (`Channel::batch`): requests staged and posted together.
//!
//! Stepped engine where the order matters (nothing moves unless the test steps, so "not sent
//! before the flush" is observable); Inline for the volume test. Every wait is bounded.

use bypass::sim::{Engine, Fabric};
use bypass::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

#[path = "common/helpers.rs"]
mod helpers;
use helpers::{echo_functions, until};

const ECHO: FunctionId = match FunctionId::new(0x30, 0x1, true, 1) {
    Some(f) => f,
    None => panic!("bad function id"),
};
const NAME: &str = "batch";

type Outcomes = Arc<Mutex<Vec<(u8, Result<Vec<u8>, String>)>>>;

/// A callback that records call `i`'s outcome.
fn record(out: &Outcomes, i: u8) -> impl FnOnce(Result<&[u8], RpcError>) + Send + 'static {
    let out = out.clone();
    move |r| out.lock().unwrap().push((i, r.map(<[u8]>::to_vec).map_err(|e| e.to_string())))
}

/// Staged requests leave only when the batch is flushed, and then all of them in one go.
#[test]
fn staged_calls_go_out_at_the_flush() {
    let fabric = Fabric::new(Engine::Stepped { seed: 0xBA7C_0001 });
    let (snic, cnic) = (fabric.add_nic(), fabric.add_nic());
    let config = ServerConfig { workers: 0, ..ServerConfig::new(NAME) };
    let server = Server::bind(&snic, "127.0.0.1:0", config, echo_functions(ECHO)).expect("bind");
    let channel = Channel::connect(&cnic, server.local_addr(), ChannelConfig::new(NAME)).expect("connect");
    let out: Outcomes = Arc::default();
    let mut batch = channel.batch();
    for i in 0..8u8 {
        batch.call_callback(&CallOptions::default(), ECHO, &[i; 32], record(&out, i)).expect("stage");
    }
    assert_eq!(batch.staged(), 8);
    fabric.run_until_idle();
    server.poll();
    assert_eq!(server.stats().requests, 0, "nothing is sent before the flush");
    batch.flush();
    assert_eq!(batch.staged(), 0);
    until(
        "the 8 calls to complete",
        || {
            fabric.run_until_idle();
            server.poll();
            channel.poll();
        },
        || out.lock().unwrap().len() == 8,
    );
    let mut got = out.lock().unwrap().clone();
    got.sort_by_key(|(i, _)| *i);
    for (i, r) in got {
        assert_eq!(r, Ok(vec![i; 32]), "call {i}");
    }
    drop(batch);
    assert_eq!(channel.stats().tx_in_use, 0);
}

/// More calls than the channel's window in one batch: a call that would wait for a credit
/// first posts what is staged (their responses free the credits), so nothing deadlocks.
#[test]
fn a_batch_larger_than_the_window_completes() {
    let fabric = Fabric::new(Engine::Inline);
    let (snic, cnic) = (fabric.add_nic(), fabric.add_nic());
    let server =
        Server::bind(&snic, "127.0.0.1:0", ServerConfig::new(NAME), echo_functions(ECHO)).expect("bind");
    let ccfg = ChannelConfig { window: 4, ..ChannelConfig::new(NAME) };
    let channel = Channel::connect(&cnic, server.local_addr(), ccfg).expect("connect");
    let done = Arc::new(AtomicUsize::new(0));
    let opts = CallOptions { wait_for_credit: true, ..CallOptions::default() };
    for round in 0..50u32 {
        let mut batch = channel.batch();
        for i in 0..40u32 {
            let d = done.clone();
            let want = (round * 40 + i).to_le_bytes();
            batch
                .call_callback(&opts, ECHO, &want, move |r| {
                    assert_eq!(r.expect("echo"), want);
                    d.fetch_add(1, Ordering::Relaxed);
                })
                .expect("stage");
        }
    }
    until(
        "2000 calls to complete",
        || {
            channel.poll();
        },
        || done.load(Ordering::Relaxed) == 2000,
    );
    assert_eq!(channel.stats().tx_in_use, 0);
}

/// The queue fails between staging and the flush: every staged call ends once, with the
/// queue's error, and nothing is left in use.
#[test]
fn a_failed_flush_ends_every_staged_call_once() {
    let fabric = Fabric::new(Engine::Stepped { seed: 0xBA7C_0003 });
    let (snic, cnic) = (fabric.add_nic(), fabric.add_nic());
    let config = ServerConfig { workers: 0, ..ServerConfig::new(NAME) };
    let server = Server::bind(&snic, "127.0.0.1:0", config, echo_functions(ECHO)).expect("bind");
    let ccfg = ChannelConfig { recovery: None, queues: 2, ..ChannelConfig::new(NAME) };
    let channel = Channel::connect(&cnic, server.local_addr(), ccfg).expect("connect");
    let out: Outcomes = Arc::default();
    let on_queue_0 = CallOptions { queue: Some(0), ..CallOptions::default() };
    let mut batch = channel.batch();
    for i in 0..5u8 {
        batch.call_callback(&on_queue_0, ECHO, &[i], record(&out, i)).expect("stage");
    }
    channel.fail_queue(0).expect("fail queue 0");
    batch.flush();
    until(
        "the staged calls to end",
        || {
            fabric.run_until_idle();
            server.poll();
            channel.poll();
        },
        || out.lock().unwrap().len() >= 5 && channel.stats().tx_in_use == 0,
    );
    let got = out.lock().unwrap().clone();
    assert_eq!(got.len(), 5, "each staged call ended exactly once: {got:?}");
    for (i, r) in &got {
        let e = r.as_ref().expect_err("a call on a failed queue cannot succeed");
        assert!(e.contains("queue failed"), "call {i}: {e}");
    }
    // The other queue still works, batched too.
    let mut batch = channel.batch();
    let fut = batch
        .call_future(&CallOptions { queue: Some(1), ..CallOptions::default() }, ECHO, b"still here")
        .expect("stage");
    drop(batch);
    until(
        "the call on queue 1",
        || {
            fabric.run_until_idle();
            server.poll();
            channel.poll();
        },
        || fut.is_done(),
    );
}
