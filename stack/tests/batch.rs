//! Batched calls (`Channel::batch`): requests staged and posted together.
//!
//! Stepped engine where the order matters (nothing moves unless the test steps, so "not sent
//! before the flush" is observable); Inline for the volume test. Every wait is bounded.

use bypass::sim::{Engine, Fabric};
use bypass::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

mod common;
use common::helpers;
use common::ids::ECHO;
use helpers::{echo_functions, until};

const NAME: &str = "batch";

type Outcomes = Arc<Mutex<Vec<(u8, Result<Vec<u8>, String>)>>>;
/// Per call, its outcome once it ended.
type Slots = Arc<Mutex<Vec<Option<Result<Vec<u8>, String>>>>>;

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

/// The queue fails between staging and the flush: the failure ends every staged call once, with
/// the queue's error (the flush then posts none of them), and nothing is left in use. A post the
/// device refuses at the flush is the unit test `a_refused_post_ends_every_staged_call_once_and_leaks_nothing`
/// in `client/batch.rs`: every public way to make a queue unusable ends the staged calls first.
#[test]
fn a_queue_failing_before_the_flush_ends_every_staged_call_once() {
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

/// A queue fails and is recovered while calls for it wait in a batch: the failure ended them
/// (once each, with the queue's error), so the flush does not post them on the recovered queue
/// (the server would run calls their callers were told had failed); the other queue's staged
/// calls go out as usual, and new calls on the recovered queue work.
#[test]
fn calls_staged_across_a_queue_recovery_end_once_and_never_run() {
    let fabric = Fabric::new(Engine::Stepped { seed: 0xBA7C_0004 });
    let (snic, cnic) = (fabric.add_nic(), fabric.add_nic());
    let config = ServerConfig { workers: 0, ..ServerConfig::new(NAME) };
    let server = Server::bind(&snic, "127.0.0.1:0", config, echo_functions(ECHO)).expect("bind");
    let ccfg = ChannelConfig {
        queues: 2,
        window: 8,
        keepalive: None,
        recovery: Some(Recovery::default()),
        ..ChannelConfig::new(NAME)
    };
    let channel = Channel::connect(&cnic, server.local_addr(), ccfg).expect("connect");
    let drive = || {
        fabric.run_until_idle();
        server.poll();
        channel.poll();
    };
    drive();
    let on = |q| CallOptions { queue: Some(q), wait_for_credit: false, ..CallOptions::default() };
    // Outcomes by call: 0..4 on queue 0, 4..8 on queue 1. A second outcome for a call panics.
    let outcomes: Slots = Arc::new(Mutex::new(vec![None; 8]));
    let mut batch = channel.batch();
    for i in 0..8u8 {
        let o = outcomes.clone();
        batch
            .call_callback(&on(usize::from(i / 4)), ECHO, &[i; 16], move |r| {
                let slot = &mut o.lock().unwrap()[usize::from(i)];
                assert!(slot.is_none(), "call {i} ended twice");
                *slot = Some(r.map(<[u8]>::to_vec).map_err(|e| e.to_string()));
            })
            .expect("stage");
    }
    channel.fail_queue(0).expect("fail queue 0");
    until("queue 0 to be recovered", drive, || {
        channel.stats().recoveries == 1 && channel.stats().ready_queues == 2
    });
    assert_eq!(server.stats().requests, 0, "nothing was posted before the flush");
    // Two calls of the recovered queue's new life, posted at once: they hold 2 of its credits.
    let early: Vec<_> = (0..2u8)
        .map(|i| channel.call_future(&on(0), ECHO, &[0xE0 + i]).expect("a call on the recovered queue"))
        .collect();
    assert_eq!(channel.stats().credits, 6 + 4, "queue 0: 8 - 2; queue 1: 8 - 4 staged");
    batch.flush();
    // The failed calls' credits belonged to queue 0's old life, which the recovery refilled: the
    // flush gives none of them back (that would let more requests out than the server has buffers).
    assert_eq!(channel.stats().credits, 6 + 4, "the flush returned no credit of the old life");
    until("the calls on queue 1 to complete", drive, || {
        outcomes.lock().unwrap()[4..].iter().all(Option::is_some)
    });
    // Let anything the flush might have posted on queue 0 reach the server.
    for _ in 0..10 {
        drive();
    }
    assert_eq!(server.stats().requests, 4 + 2, "only queue 1's staged calls (and the 2 new ones) ran");
    assert!(early.iter().all(CallFuture::is_done));
    let got = outcomes.lock().unwrap().clone();
    for (i, o) in got.iter().enumerate() {
        match (i < 4, o) {
            (true, Some(Err(e))) => assert!(e.contains("queue failed"), "call {i}: {e}"),
            (false, Some(Ok(v))) => assert_eq!(v, &vec![i as u8; 16], "call {i}"),
            _ => panic!("call {i}: {o:?}"),
        }
    }
    drop(batch);
    assert_eq!(channel.stats().tx_in_use, 0, "every send context came back");
    // The recovered queue takes a full window again (its credits are whole), batched.
    let mut batch = channel.batch();
    let futs: Vec<_> =
        (0..8u8).map(|i| batch.call_future(&on(0), ECHO, &[i; 4]).expect("stage on queue 0")).collect();
    drop(batch);
    until("the new calls on queue 0", drive, || futs.iter().all(CallFuture::is_done));
    for (i, mut f) in (0..8u8).zip(futs) {
        assert_eq!(helpers::poll_once(&mut f).expect("done").expect("echo"), vec![i; 4], "new call {i}");
    }
    for (i, mut f) in (0..2u8).zip(early) {
        assert_eq!(helpers::poll_once(&mut f).expect("done").expect("echo"), vec![0xE0 + i]);
    }
    assert_eq!(channel.stats().tx_in_use, 0);
}

/// The calls staged between two flushes share one clock reading (the first one's): their
/// deadlines count from it. A flush starts a new reading. Stepped engine (virtual clock); the
/// server is never polled, so no call is answered and each ends by its deadline alone.
#[test]
fn a_flush_rounds_calls_share_one_clock_reading_for_their_deadlines() {
    let fabric = Fabric::new(Engine::Stepped { seed: 0xBA7C_0005 });
    let (snic, cnic) = (fabric.add_nic(), fabric.add_nic());
    let config = ServerConfig { workers: 0, ..ServerConfig::new(NAME) };
    let server = Server::bind(&snic, "127.0.0.1:0", config, echo_functions(ECHO)).expect("bind");
    let channel = Channel::connect(&cnic, server.local_addr(), ChannelConfig::new(NAME)).expect("connect");
    let opts = CallOptions { timeout: Some(Duration::from_millis(100)), ..CallOptions::default() };
    let out: Outcomes = Arc::default();
    let ended = |i: u8| out.lock().unwrap().iter().any(|(j, _)| *j == i);
    // Timeouts are checked every 32nd poll.
    let check = || {
        for _ in 0..64 {
            channel.poll();
        }
    };

    let mut batch = channel.batch();
    batch.call_callback(&opts, ECHO, &[0; 8], record(&out, 0)).expect("stage call 0");
    fabric.advance(Duration::from_millis(60));
    // Staged 60 ms after call 0, in the same flush round: its deadline is call 0's.
    batch.call_callback(&opts, ECHO, &[1; 8], record(&out, 1)).expect("stage call 1");
    batch.flush();
    // A new round reads the clock again: 60 ms now, deadline at 160 ms.
    batch.call_callback(&opts, ECHO, &[2; 8], record(&out, 2)).expect("stage call 2");
    batch.flush();

    fabric.advance(Duration::from_millis(50)); // 110 ms: past 100, before 160
    check();
    assert!(ended(0) && ended(1), "calls 0 and 1 share the 100 ms deadline: {:?}", out.lock().unwrap());
    assert!(!ended(2), "call 2's deadline (160 ms) has not come: {:?}", out.lock().unwrap());
    fabric.advance(Duration::from_millis(60)); // 170 ms
    check();
    let got = out.lock().unwrap().clone();
    assert_eq!(got.len(), 3, "{got:?}");
    for (i, r) in got {
        assert!(matches!(&r, Err(e) if e.contains("timed out") || e.contains("timeout")), "call {i}: {r:?}");
    }
    drop(batch);
    drop(server);
}
