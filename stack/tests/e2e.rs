//! End-to-end tests of the RPC stack on the Stepped engine of the simulated NIC, and the few
//! that only the simulator can run.
//!
//! The RPC conformance suite (`bypass::conformance`, run by `rpc_suite.rs` on the Inline and
//! Threaded engines and the UDP wire, and by `bypass-hw-tests` on real devices) holds the
//! scenarios every device runs; it needs devices that move on real time. Here the same
//! behaviours run on the Stepped engine, where nothing moves unless the test thread drives it
//! (`fabric.run_until_idle(); server.poll(); channel.poll();`, in [`Rig::until`]): calls go
//! through callbacks and futures (a blocking call would wait forever), timeouts move the
//! virtual clock (`fabric.advance`), and some regressions build an interleaving only this engine
//! can hold still. The scenarios keep the suite's names (`<scenario>_stepped`; the suite's
//! counterpart is named in each doc where it differs).
//!
//! Every wait is a bounded polling loop that panics with the state it saw; no test sleeps to
//! "wait enough".

mod common;

use bypass::sim::{Engine, Fabric};
use bypass::*;
use common::helpers::poll_once;
use common::ids::*;
use common::rig::*;
use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

/// Each call mode through the blocking (or driven-future) path, callbacks and
/// futures: what completes the call, what comes back, whether it was acknowledged, and that the
/// handler ran every time.
///
/// On real-time devices: the suite's `blocking_calls_every_mode`, `callbacks_every_mode`, `futures_every_mode`.
#[test]
fn call_modes_stepped() {
    let rig = Rig::new(STEPPED);
    let mode = CallOptions::mode;

    let (resp, acked) = rig.call(&mode(CallMode::EarlyRsp), ECHO, b"early").expect("EarlyRsp call");
    assert!(resp.is_empty(), "EarlyRsp: no response data, got {resp:?}");
    assert!(!acked, "EarlyRsp is never acknowledged");
    rig.until("the EarlyRsp handler to run", || rig.hits() == 1);

    let (resp, acked) = rig.call(&mode(CallMode::WaitRsp), ECHO, b"wait for me").expect("WaitRsp call");
    assert_eq!(resp, b"wait for me");
    assert!(!acked, "WaitRsp is never acknowledged");
    assert_eq!(rig.hits(), 2);

    let (resp, acked) = rig.call(&mode(CallMode::Ack), ECHO, b"ack me").expect("Ack call");
    assert_eq!(resp, b"ack me");
    assert!(acked, "Ack mode: CallInfo.acked");
    assert_eq!(rig.hits(), 3);

    let (resp, acked) = rig.call(&mode(CallMode::AckEarlyRsp), ECHO, b"ack early").expect("AckEarlyRsp");
    assert!(resp.is_empty(), "AckEarlyRsp: no response data, got {resp:?}");
    assert!(acked, "AckEarlyRsp: CallInfo.acked");
    rig.until("the AckEarlyRsp handler to run", || rig.hits() == 4);

    // Callbacks, all four modes outstanding at once.
    let log = Log::default();
    for (i, m) in CallMode::ALL.into_iter().enumerate() {
        rig.channel.call_callback(&mode(m), ECHO, format!("cb{i}").as_bytes(), log.cb(i)).expect("start");
    }
    rig.until("4 callbacks", || log.completed() == 4);
    for (i, m) in CallMode::ALL.into_iter().enumerate() {
        let want = match m {
            CallMode::EarlyRsp | CallMode::AckEarlyRsp => Vec::new(),
            _ => format!("cb{i}").into_bytes(),
        };
        log.with(i, |o| assert_eq!(o.as_deref().ok(), Some(&want[..]), "callback {m:?}: {o:?}"));
    }

    // Futures, all four modes outstanding at once.
    let mut futs: Vec<CallFuture> = CallMode::ALL
        .into_iter()
        .map(|m| rig.channel.call_future(&mode(m), ECHO, b"future").expect("start"))
        .collect();
    rig.until("4 futures", || futs.iter().all(CallFuture::is_done));
    for (m, f) in CallMode::ALL.into_iter().zip(&mut futs) {
        let acked = f.is_acked();
        let out = finished(f).unwrap_or_else(|e| panic!("future {m:?}: {e}"));
        match m {
            CallMode::EarlyRsp => assert!(out.is_empty() && !acked, "{m:?}: {out:?} acked {acked}"),
            CallMode::WaitRsp => assert!(out == b"future" && !acked, "{m:?}: {out:?} acked {acked}"),
            CallMode::Ack => assert!(out == b"future" && acked, "{m:?}: {out:?} acked {acked}"),
            CallMode::AckEarlyRsp => assert!(out.is_empty() && acked, "{m:?}: {out:?} acked {acked}"),
        }
    }

    rig.until("every handler to run", || rig.hits() == 12);
    rig.drain();
    rig.settle();
    log.assert_once(4);
    assert_eq!(rig.hits(), 12, "a handler ran twice");
    let (c, s) = (rig.channel.stats(), rig.server.stats());
    assert_eq!(c.calls, 12);
    assert_eq!((c.timeouts, c.stale), (0, 0), "{c:?}");
    assert_eq!(s.requests, 12, "{s:?}");
    assert_eq!(s.responses, 6, "WaitRsp and Ack get a response: {s:?}");
    assert_eq!(s.acks, 6, "Ack and AckEarlyRsp get an ACK: {s:?}");
}

/// The ACK arrives while the handler still holds
/// the request, so `is_acked()` turns true before the response (Ack) and an AckEarlyRsp call
/// completes without the handler having replied.
///
/// On real-time devices: the suite's `ack_arrives_before_response`.
#[test]
fn ack_before_response_stepped() {
    let rig = Rig::new(STEPPED);
    let mut fut =
        rig.channel.call_future(&CallOptions::mode(CallMode::Ack), HOLD, b"deferred").expect("start");
    rig.until("the ACK", || fut.is_acked());
    let mut held = rig.take_held(1);
    assert_eq!(held[0].args(), b"deferred");
    assert!(held[0].wants_response());
    rig.settle();
    assert!(!fut.is_done(), "the Ack call completed before the handler replied: {fut:?}");
    assert!(poll_once(&mut fut).is_none());
    held.pop().unwrap().reply(b"later").expect("reply");
    rig.until("the response", || fut.is_done());
    assert!(fut.is_acked());
    assert_eq!(finished(&mut fut).expect("Ack call"), b"later");

    // AckEarlyRsp completes on the ACK while the handler still holds the request.
    let mut fut =
        rig.channel.call_future(&CallOptions::mode(CallMode::AckEarlyRsp), HOLD, b"fire").expect("start");
    rig.until("the AckEarlyRsp call to complete", || fut.is_done());
    assert!(fut.is_acked());
    assert_eq!(finished(&mut fut).expect("AckEarlyRsp call"), b"");
    let req = rig.take_held(1).pop().unwrap();
    assert!(!req.wants_response());
    // The server still holds one of our receive buffers until the request is dropped.
    assert_eq!(rig.channel.stats().credits, rig.full_credits() - 1);
    req.reply(b"ignored").expect("a reply without response is fine");
    rig.drain();
    let s = rig.server.stats();
    assert_eq!((s.requests, s.acks, s.responses), (2, 2, 1), "{s:?}");
}

/// Calls go round-robin, `CallOptions::queue` picks one, an
/// out-of-range queue is InvalidArgument. With a window of 1 a queue whose only credit is held
/// refuses a non-waiting call, which shows where each call went.
///
/// On real-time devices: the suite's `multi_queue_round_robin`.
#[test]
fn multi_queue_stepped() {
    let rig = Rig::with(STEPPED, |c, _| {
        c.queues = 3;
        c.window = 1;
    });
    assert_eq!(rig.channel.queues(), 3);
    assert_eq!(rig.channel.stats().credits, 3);
    let log = Log::default();
    for i in 0..3 {
        rig.channel
            .call_callback(&opts_nowait(), HOLD, &[i as u8], log.cb(i))
            .unwrap_or_else(|e| panic!("call {i}: round robin should give each call its own queue: {e}"));
    }
    assert_eq!(rig.channel.stats().credits, 0);
    match rig.channel.call_callback(&opts_nowait(), HOLD, b"4th", log.cb(99)) {
        Err(RpcError::WouldBlock(_)) => {}
        other => panic!("a 4th call on 3 queues of window 1: {other:?}"),
    }
    for q in 0..3 {
        let opts = CallOptions { queue: Some(q), wait_for_credit: false, ..Default::default() };
        match rig.channel.call_callback(&opts, HOLD, b"busy", log.cb(99)) {
            Err(RpcError::WouldBlock(_)) => {}
            other => panic!("queue {q} has its credit held: {other:?}"),
        }
    }
    match rig.channel.call_callback(&on_queue(3), ECHO, b"nope", log.cb(99)) {
        Err(RpcError::InvalidArgument(_)) => {}
        other => panic!("queue 3 of 3: {other:?}"),
    }
    match rig.channel.call_future(&on_queue(7), ECHO, b"nope") {
        Err(RpcError::InvalidArgument(_)) => {}
        other => panic!("queue 7 of 3: {other:?}"),
    }
    let held = rig.take_held(3);
    let mut args: Vec<u8> = held.iter().map(|r| r.args()[0]).collect();
    args.sort_unstable();
    assert_eq!(args, [0, 1, 2]);
    for r in held {
        let a = r.args().to_vec();
        r.reply(&transform(&a)).expect("reply");
    }
    rig.until("3 callbacks", || log.completed() == 3);
    rig.until("the credits", || rig.channel.stats().credits == 3);
    for i in 0..3 {
        log.with(i, |o| assert_eq!(o.as_deref().ok(), Some(&transform(&[i as u8])[..]), "{o:?}"));
    }
    for q in 0..3 {
        rig.echo(&on_queue(q), format!("on queue {q}").as_bytes());
    }
    for i in 0..9 {
        rig.echo(&CallOptions::default(), format!("round robin {i}").as_bytes());
    }
    rig.drain();
    log.assert_once(3);
    assert_eq!(rig.channel.stats().calls, 15);
}

/// Many calls on one shared channel, distinct payloads, each checked against its own response:
/// callbacks outstanding at once from the test thread (a full window in the first burst),
/// refilled as credits come back.
///
/// On real-time devices: the suite's `concurrent_callers`.
#[test]
fn concurrent_callers_stepped() {
    const THREADS: usize = 4;
    let rig = Rig::with(STEPPED, |_, s| s.workers = 2);
    let per_thread = 100;
    let total = THREADS * per_thread;
    {
        let log = Log::default();
        let args = |k: usize| payload(k % THREADS, k / THREADS);
        let mut next = 0;
        let mut first_burst = None;
        let mut rounds = 0;
        while log.completed() < total {
            while next < total {
                let mode = if next % 2 == 0 { CallMode::WaitRsp } else { CallMode::Ack };
                let opts = CallOptions { mode, wait_for_credit: false, ..Default::default() };
                match rig.channel.call_callback(&opts, ECHO, &args(next), log.cb(next)) {
                    Ok(()) => next += 1,
                    Err(RpcError::WouldBlock(_)) => break,
                    Err(e) => panic!("call {next}: {e}"),
                }
            }
            first_burst.get_or_insert(next);
            rig.pump();
            rounds += 1;
            assert!(
                rounds < 100_000,
                "Stepped: {}/{total} calls done after {rounds} rounds",
                log.completed()
            );
        }
        assert_eq!(first_burst, Some(rig.window as usize), "a full window of calls outstanding at once");
        for k in 0..total {
            log.with(k, |o| assert_eq!(o.as_deref().ok(), Some(&args(k)[..]), "call {k}"));
        }
        rig.drain();
        log.assert_once(total);
    }
    assert_eq!(rig.hits(), total);
    rig.drain();
    assert_eq!(rig.channel.stats().calls, total as u64);
    assert_eq!(rig.server.stats().responses, total as u64);
}

/// Deferred replies: a batch of callbacks answered out of order, then more calls answered as they
/// arrive, the test thread replying between steps.
///
/// On real-time devices: the suite's `deferred_replies`.
#[test]
fn deferred_replies_stepped() {
    const BATCH: usize = 16;
    // Event mode: the server's worker sleeps on its CQs' event fds when idle.
    let rig = Rig::with(STEPPED, |_, s| s.mode = PollMode::Event);
    let log = Log::default();
    let batch_args = |i: usize| format!("batch {i}").into_bytes();
    let blocking_callers = 2;
    let per_caller = 100;
    {
        for i in 0..BATCH {
            rig.channel.call_callback(&CallOptions::default(), HOLD, &batch_args(i), log.cb(i)).unwrap();
        }
        let mut batch = rig.take_held(BATCH);
        while let Some(r) = batch.pop() {
            let out = transform(r.args());
            r.reply(&out).expect("deferred reply");
            rig.pump();
        }
        rig.until("the batch of deferred replies", || log.completed() == BATCH);
        // More calls, replied to between steps as they arrive.
        let total = blocking_callers * per_caller;
        let mut next = 0;
        let mut rounds = 0;
        while log.completed() < BATCH + total {
            while next < total {
                let k = BATCH + next;
                match rig.channel.call_callback(&opts_nowait(), HOLD, &payload(0, next), log.cb(k)) {
                    Ok(()) => next += 1,
                    Err(RpcError::WouldBlock(_)) => break,
                    Err(e) => panic!("call {k}: {e}"),
                }
            }
            rig.fabric.step();
            rig.fabric.step();
            rig.server.poll();
            while let Ok(r) = lock(&rig.held).try_recv() {
                let out = transform(r.args());
                r.reply(&out).expect("deferred reply");
                rig.fabric.step();
            }
            rig.pump();
            rounds += 1;
            assert!(rounds < 100_000, "Stepped: {}/{} calls done", log.completed(), BATCH + total);
        }
        for i in 0..total {
            log.with(BATCH + i, |o| assert_eq!(o.as_deref().ok(), Some(&transform(&payload(0, i))[..])));
        }
    }
    for i in 0..BATCH {
        log.with(i, |o| assert_eq!(o.as_deref().ok(), Some(&transform(&batch_args(i))[..]), "batch {i}"));
    }
    rig.drain();
    log.assert_once(BATCH + blocking_callers * per_caller);
    let s = rig.server.stats();
    assert_eq!(s.responses, (BATCH + blocking_callers * per_caller) as u64, "{s:?}");
    assert_eq!((s.dropped, s.failed_replies), (0, 0), "{s:?}");
}

/// An unknown function fails with FunctionNotFound naming it, and is counted.
///
/// On real-time devices: the suite's `unknown_function`.
#[test]
fn unknown_function_stepped() {
    let rig = Rig::new(STEPPED);
    for m in [CallMode::WaitRsp, CallMode::Ack] {
        match rig.call(&CallOptions::mode(m), MISSING, b"anyone?") {
            Err(RpcError::FunctionNotFound(id)) => assert_eq!(id, MISSING, "{m:?}"),
            other => panic!("{m:?}: calling an unknown function: {other:?}"),
        }
    }
    let log = Log::default();
    rig.channel.call_callback(&CallOptions::default(), MISSING, b"", log.cb(0)).expect("start");
    rig.until("the callback", || log.completed() == 1);
    log.with(0, |o| assert!(matches!(o, Err(RpcError::FunctionNotFound(id)) if *id == MISSING), "{o:?}"));
    let e = RpcError::FunctionNotFound(MISSING);
    assert!(e.to_string().contains(&MISSING.to_string()), "{e}");
    assert_eq!(rig.server.stats().unknown_functions, 3);
    assert_eq!(rig.hits(), 0);
    rig.echo(&CallOptions::default(), b"still fine");
    rig.drain();
    log.assert_once(1);
    assert_eq!(rig.server.stats().unknown_functions, 3);
}

/// Fires the deadline of a call: moves the virtual clock past it and checks timeouts once.
fn expire(rig: &Rig, log: &Log, i: usize) {
    rig.settle();
    assert_eq!(log.completed(), i, "completed before its deadline");
    rig.fabric.advance(SHORT + Duration::from_millis(1));
    assert_eq!(rig.channel.check_timeouts(), 1, "one call past its deadline");
    log.with(i, |o| assert!(matches!(o, Err(RpcError::Timeout)), "call {i}: {o:?}"));
}

/// A handler that never replies. The call times out; dropping the request later
/// returns the credit; a late reply is counted as stale and not delivered.
///
/// On real-time devices: the suite's `timeout_then_late_reply`, `deadlines_each_their_own`.
#[test]
fn timeouts_stepped() {
    let rig = Rig::new(STEPPED);
    let full = rig.full_credits();
    let short = CallOptions { timeout: Some(SHORT), ..Default::default() };
    let log = Log::default();

    // (a) timeout, then the server drops the request.
    rig.channel.call_callback(&short, HOLD, b"slow", log.cb(0)).expect("start");
    rig.until("the request to arrive", || rig.server.stats().requests == 1);
    expire(&rig, &log, 0);
    let req = rig.take_held(1).pop().unwrap();
    assert_eq!(req.args(), b"slow");
    let s = rig.channel.stats();
    assert_eq!(s.timeouts, 1, "{s:?}");
    assert_eq!(s.credits, full - 1, "the server still holds one receive buffer: {s:?}");
    drop(req);
    rig.until("the dropped request's credit", || rig.channel.stats().credits == full);
    rig.until("the server to count the drop", || rig.server.stats().dropped == 1);
    rig.drain();

    // (b) timeout, then a late reply.
    rig.channel.call_callback(&short, HOLD, b"late", log.cb(1)).expect("start");
    let req = rig.take_held(1).pop().unwrap();
    expire(&rig, &log, 1);
    assert_eq!(rig.channel.stats().stale, 0);
    req.reply(b"too late").expect("late reply");
    rig.until("the late response to be counted stale", || rig.channel.stats().stale == 1);
    rig.drain();
    rig.settle();
    log.assert_once(2);
    let s = rig.channel.stats();
    assert_eq!((s.timeouts, s.stale), (2, 1), "{s:?}");

    // (c) several deadlines: each call fails at its own, the others stay outstanding.
    for (k, ms) in [30u64, 10, 20].into_iter().enumerate() {
        let o = CallOptions { timeout: Some(Duration::from_millis(ms)), ..Default::default() };
        rig.channel.call_callback(&o, HOLD, &[k as u8], log.cb(2 + k)).expect("start");
    }
    let held = rig.take_held(3);
    rig.settle();
    assert_eq!(log.completed(), 2);
    for (expected, call) in [(3, 3), (4, 4), (5, 2)] {
        rig.fabric.advance(Duration::from_millis(10));
        assert_eq!(rig.channel.check_timeouts(), 1, "one deadline passes every 10 ms");
        assert_eq!(log.completed(), expected);
        log.with(call, |o| assert!(matches!(o, Err(RpcError::Timeout)), "call {call}: {o:?}"));
    }
    for i in 2..5 {
        log.with(i, |o| assert!(matches!(o, Err(RpcError::Timeout)), "call {i}: {o:?}"));
    }
    assert_eq!(rig.channel.stats().credits, full - 3);
    drop(held);
    rig.drain();
    assert_eq!(rig.server.stats().dropped, 4);

    // The channel is as good as new.
    rig.echo(&short, b"in time");
    rig.drain();
    rig.settle();
    log.assert_once(5);
    let s = rig.channel.stats();
    assert_eq!((s.timeouts, s.stale), (5, 1), "{s:?}");
}

/// The server shuts down while calls are outstanding: each fails with Closed,
/// exactly once; the channel closes; new calls fail with Closed.
///
/// On real-time devices: the suite's `server_shutdown_mid_call`.
#[test]
fn server_shutdown_mid_call_stepped() {
    let mut rig = Rig::new(STEPPED);
    let log = Log::default();
    for i in 0..3 {
        rig.channel.call_callback(&CallOptions::default(), HOLD, &[i as u8], log.cb(i)).expect("start");
    }
    let mut fut = rig.channel.call_future(&CallOptions::mode(CallMode::Ack), HOLD, b"fut").expect("start");
    {
        let held = rig.take_held(4);
        rig.until("the Ack call's ACK", || fut.is_acked());
        assert_eq!(log.completed(), 0);
        assert!(!fut.is_done());
        rig.server.shutdown();
        assert_eq!(rig.server.connections(), 0);
        rig.until("the channel to notice the server is gone", || rig.channel.is_closed());
        rig.until("every outstanding call to fail", || log.completed() == 3 && fut.is_done());
        drop(held);
    }
    for i in 0..3 {
        log.with(i, |o| assert!(matches!(o, Err(RpcError::Closed)), "call {i}: {o:?}"));
    }
    match finished(&mut fut) {
        Err(RpcError::Closed) => {}
        other => panic!("future: {other:?}"),
    }
    match rig.channel.call_callback(&CallOptions::default(), ECHO, b"x", log.cb(99)) {
        Err(RpcError::Closed) => {}
        other => panic!("a call on a closed channel: {other:?}"),
    }
    match rig.call(&CallOptions::default(), ECHO, b"x") {
        Err(RpcError::Closed) => {}
        other => panic!("a call on a closed channel: {other:?}"),
    }
    rig.drain_closed();
    rig.settle();
    log.assert_once(3);
    assert_eq!(rig.channel.stats().ready_queues, 0);
}

/// The client closes its channel while calls are outstanding: they fail with
/// Closed; the server notices and drops the connection.
///
/// On real-time devices: the suite's `client_close_mid_call`.
#[test]
fn client_close_mid_call_stepped() {
    let rig = Rig::new(STEPPED);
    let log = Log::default();
    for i in 0..3 {
        rig.channel.call_callback(&CallOptions::default(), HOLD, &[i as u8], log.cb(i)).expect("start");
    }
    let mut fut = rig.channel.call_future(&CallOptions::mode(CallMode::Ack), HOLD, b"fut").expect("start");
    let held = rig.take_held(4);
    rig.until("the ACK", || fut.is_acked());
    assert_eq!(rig.server.connections(), 1);
    rig.channel.close();
    assert!(rig.channel.is_closed());
    rig.until("every outstanding call to fail", || log.completed() == 3 && fut.is_done());
    for i in 0..3 {
        log.with(i, |o| assert!(matches!(o, Err(RpcError::Closed)), "call {i}: {o:?}"));
    }
    assert!(matches!(finished(&mut fut), Err(RpcError::Closed)));
    match rig.call(&CallOptions::default(), ECHO, b"x") {
        Err(RpcError::Closed) => {}
        other => panic!("a call on a closed channel: {other:?}"),
    }
    rig.until("the server to drop the connection", || rig.server.connections() == 0);
    // Replies to a closed connection fail cleanly and are counted.
    for r in held {
        assert!(r.reply(b"nobody listens").is_err(), "a reply on a closed connection succeeded");
    }
    assert_eq!(rig.server.stats().failed_replies, 4);
    rig.drain_closed();
    rig.until("the server's contexts", || rig.server.tx_in_use() == 0);
    rig.settle();
    log.assert_once(3);
}

/// A queue forced into ERROR while calls on it are outstanding: they fail with
/// `Queue(_)` exactly once, later calls use the other queue; failing the last queue closes the
/// channel. Without queue recovery (`tests/recovery.rs` covers that).
///
/// On real-time devices: the suite's `queue_error_mid_flight`.
#[test]
fn queue_error_mid_flight_stepped() {
    let rig = Rig::with(STEPPED, |c, _| {
        c.queues = 2;
        c.recovery = None;
    });
    let log = Log::default();
    for i in 0..3 {
        rig.channel.call_callback(&on_queue(0), HOLD, &[i as u8], log.cb(i)).expect("start");
    }
    let held0 = rig.take_held(3);
    rig.channel.fail_queue(0).expect("fail queue 0");
    rig.until("the calls on queue 0 to fail", || log.completed() == 3);
    for i in 0..3 {
        log.with(i, |o| assert!(matches!(o, Err(RpcError::Queue(_))), "call {i}: {o:?}"));
    }
    let s = rig.channel.stats();
    assert_eq!(s.ready_queues, 1, "{s:?}");
    assert!(!rig.channel.is_closed());
    match rig.call(&on_queue(0), ECHO, b"q0") {
        Err(RpcError::Queue(_)) => {}
        other => panic!("a call on the failed queue: {other:?}"),
    }
    for i in 0..6 {
        rig.echo(&CallOptions::default(), format!("after the failure {i}").as_bytes());
    }
    rig.echo(&on_queue(1), b"q1");
    // Late replies to the failed queue's calls reach nobody (the client's queue is in ERROR;
    // the server's queue gives up after its retries).
    for r in held0 {
        let _ = r.reply(b"zombie");
    }
    rig.until_timers("the server's sends on the failed queue to finish", Duration::from_millis(20), || {
        rig.server.tx_in_use() == 0
    });
    rig.settle();
    log.assert_once(3);
    rig.until("queue 1's credits", || rig.channel.stats().credits >= u64::from(rig.window));

    // Fail the last queue with calls outstanding on it: the channel closes.
    for i in 3..5 {
        rig.channel.call_callback(&on_queue(1), HOLD, &[i as u8], log.cb(i)).expect("start");
    }
    let held1 = rig.take_held(2);
    rig.channel.fail_queue(1).expect("fail queue 1");
    assert!(rig.channel.is_closed(), "no queue left: the channel is closed");
    rig.until("the calls on queue 1 to fail", || log.completed() == 5);
    for i in 3..5 {
        log.with(i, |o| assert!(matches!(o, Err(RpcError::Queue(_) | RpcError::Closed)), "call {i}: {o:?}"));
    }
    match rig.call(&CallOptions::default(), ECHO, b"x") {
        Err(RpcError::Closed) => {}
        other => panic!("a call on a closed channel: {other:?}"),
    }
    drop(held1);
    rig.until("the server to drop the connection", || rig.server.connections() == 0);
    rig.drain_closed();
    rig.settle();
    log.assert_once(5);
    assert!(rig.channel.fail_queue(2).is_err(), "queue 2 of 2");
}

/// Argument sizes from 0 to the largest eager size; one byte more is TooLarge and
/// sends nothing for the modes without a response, and goes by rendezvous for the others.
///
/// On real-time devices: the suite's `message_size_limits`.
#[test]
fn payload_sizes_stepped() {
    let rig = Rig::new(STEPPED);
    let max = rig.channel.max_request_args();
    assert_eq!(max, 4096 - 20);
    for len in [0, 1, 64, 1000, max - 1, max] {
        let args: Vec<u8> = (0..len).map(|i| (i * 7 + len) as u8).collect();
        rig.echo(&CallOptions::default(), &args);
        rig.echo(&CallOptions::mode(CallMode::Ack), &args);
        let (resp, _) = rig.call(&CallOptions::mode(CallMode::EarlyRsp), ECHO, &args).expect("EarlyRsp");
        assert!(resp.is_empty());
    }
    rig.until("every handler to run", || rig.hits() == 18);
    rig.drain();
    let (calls, requests) = (rig.channel.stats().calls, rig.server.stats().requests);
    let too_big = vec![0xAB; max + 1];
    for m in [CallMode::WaitRsp, CallMode::Ack] {
        // By rendezvous; the echo (4077 bytes) still fits a response message (4096 - 16).
        match rig.call(&CallOptions::mode(m), ECHO, &too_big) {
            Ok((resp, _)) => assert!(resp == too_big, "{m:?}: the echo differs"),
            other => {
                panic!("{m:?}: {} bytes of arguments by rendezvous: {:?}", max + 1, other.map(|r| r.0.len()))
            }
        }
    }
    rig.drain();
    for m in [CallMode::EarlyRsp, CallMode::AckEarlyRsp] {
        match rig.call(&CallOptions::mode(m), ECHO, &too_big) {
            Err(e @ RpcError::TooLarge { .. }) => {
                let RpcError::TooLarge { len, max: limit, header } = e else { unreachable!() };
                assert_eq!((len, limit, header), (max + 1 + 20, 4096, 20), "{m:?}");
                // The message says what fits, that msg_size counts the header, and that both
                // sides' msg_size must grow.
                let text = e.to_string();
                for needle in
                    [&format!("at most {max} bytes of arguments") as &str, "header", "msg_size", "both"]
                {
                    assert!(text.contains(needle), "{m:?}: {needle:?} missing from {text:?}");
                }
            }
            other => panic!("{m:?}: {} bytes of arguments: {other:?}", max + 1),
        }
    }
    let log = Log::default();
    let early = CallOptions::mode(CallMode::EarlyRsp);
    assert!(matches!(
        rig.channel.call_callback(&early, ECHO, &too_big, log.cb(0)),
        Err(RpcError::TooLarge { .. })
    ));
    assert!(matches!(rig.channel.call_future(&early, ECHO, &too_big), Err(RpcError::TooLarge { .. })));
    // The largest response the client accepts.
    let (resp, _) = rig.call(&CallOptions::default(), BIG, b"").expect("BIG");
    assert_eq!(resp.len(), 4096 - 16);
    assert!(resp.iter().enumerate().all(|(i, &b)| b == i as u8));
    rig.drain();
    rig.settle();
    log.assert_once(0);
    assert_eq!(
        rig.channel.stats().calls,
        calls + 3,
        "TooLarge calls must not be sent (2 rendezvous calls were)"
    );
    assert_eq!(rig.server.stats().requests, requests + 3);
    assert_eq!(rig.hits(), 20, "18 eager echoes and the 2 by rendezvous");
}

/// With no credit left a non-waiting call fails with WouldBlock (no callback, no
/// leak); once the held calls are answered calls work again.
///
/// On real-time devices: the suite's `would_block_without_credit`.
#[test]
fn would_block_stepped() {
    let rig = Rig::with(STEPPED, |c, _| c.window = 2);
    assert_eq!(rig.full_credits(), 2);
    let log = Log::default();
    rig.channel.call_callback(&opts_nowait(), HOLD, b"a", log.cb(0)).expect("1st");
    rig.channel.call_callback(&opts_nowait(), HOLD, b"b", log.cb(1)).expect("2nd");
    for _ in 0..3 {
        match rig.channel.call_callback(&opts_nowait(), ECHO, b"c", log.cb(2)) {
            Err(e @ RpcError::WouldBlock(_)) => assert!(e.is_would_block()),
            other => panic!("a 3rd call with a window of 2: {other:?}"),
        }
        assert!(matches!(rig.channel.call_future(&opts_nowait(), ECHO, b"c"), Err(RpcError::WouldBlock(_))));
    }
    let s = rig.channel.stats();
    assert_eq!((s.calls, s.credits, s.tx_in_use, s.table_in_use), (2, 0, 2, 2), "{s:?}");
    let held = rig.take_held(2);
    for r in held {
        let a = r.args().to_vec();
        r.reply(&a).expect("reply");
    }
    rig.until("the held calls", || log.completed() == 2);
    log.with(0, |o| assert_eq!(o.as_deref().ok(), Some(&b"a"[..])));
    log.with(1, |o| assert_eq!(o.as_deref().ok(), Some(&b"b"[..])));
    rig.until("both credits", || rig.channel.stats().credits == 2);
    rig.echo(&opts_nowait(), b"c");
    rig.echo(&opts_nowait(), b"d");
    // Two at once again.
    for i in 2..4 {
        rig.channel.call_callback(&opts_nowait(), ECHO, &[i as u8], log.cb(i)).expect("a window of calls");
    }
    rig.until("two more", || log.completed() == 4);
    rig.drain();
    rig.settle();
    log.assert_once(4);
}

/// Control-plane errors name what went wrong.
///
/// On real-time devices: the suite's `control_errors`.
#[test]
fn control_errors_stepped() {
    let rig = Rig::new(STEPPED);
    let dead = {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr")
    };
    match Channel::connect(&rig.cnic, dead, ChannelConfig::new(SERVER_NAME)) {
        Err(e @ RpcError::Control(_)) => {
            let text = e.to_string();
            assert!(text.contains(&dead.to_string()), "the error should name {dead}: {text}");
        }
        other => panic!("connecting to {dead} where nothing listens: {other:?}"),
    }
    match Channel::connect(&rig.cnic, rig.server.local_addr(), ChannelConfig::new("no-such-server")) {
        Err(e @ RpcError::Control(_)) => {
            let text = e.to_string();
            assert!(text.contains("no-such-server"), "the error should name the server asked for: {text}");
        }
        other => panic!("connecting with the wrong server name: {other:?}"),
    }
    let mut too_many = ChannelConfig::new(SERVER_NAME);
    too_many.queues = 100;
    match Channel::connect(&rig.cnic, rig.server.local_addr(), too_many) {
        Err(e @ RpcError::Control(_)) => {
            let text = e.to_string();
            assert!(text.contains("100 queues"), "the refusal should say why: {text}");
        }
        other => panic!("asking for more queues than the server allows: {other:?}"),
    }
    type Tweak = fn(&mut ChannelConfig);
    let bad: [(&str, Tweak); 4] = [
        ("no queues", |c| c.queues = 0),
        ("window 0", |c| c.window = 0),
        ("window 5000", |c| c.window = 5000),
        ("table size 100", |c| c.table_size = 100),
    ];
    for (what, tweak) in bad {
        let mut c = ChannelConfig::new(SERVER_NAME);
        tweak(&mut c);
        match Channel::connect(&rig.cnic, rig.server.local_addr(), c) {
            Err(RpcError::InvalidArgument(_)) => {}
            other => panic!("{what}: {other:?}"),
        }
    }
    assert_eq!(rig.server.connections(), 1);
    assert_eq!(rig.server.stats().connections, 1);
    rig.echo(&CallOptions::default(), b"unaffected");
    rig.drain();
}

/// A channel polled by a client [`WorkerGroup`] (`self_poll: false`): callbacks, futures and
/// complete without the caller polling; dropping the last handle
/// closes the channel even though the worker group still polls it.
///
/// On real-time devices: the suite's `client_worker_group`.
#[test]
fn client_worker_group_stepped() {
    let mut rig = Rig::with(STEPPED, |c, _| c.self_poll = false);
    rig.poll_channel = false;
    let wg = WorkerGroup::new(WorkerConfig {
        threads: 1,
        mode: PollMode::Busy,
        name: "e2e-client".into(),
        ..Default::default()
    })
    .expect("client worker group");
    assert_eq!(wg.threads(), 1);
    wg.add(rig.channel.pollable());

    let log = Log::default();
    for i in 0..20 {
        let mode = CallMode::ALL[i % 4];
        rig.channel.call_callback(&CallOptions::mode(mode), ECHO, &payload(1, i), log.cb(i)).expect("start");
    }
    let mut futs: Vec<CallFuture> = (0..8)
        .map(|i| rig.channel.call_future(&CallOptions::default(), ECHO, &payload(2, i)).unwrap())
        .collect();
    rig.until("the worker to deliver", || log.completed() == 20 && futs.iter().all(CallFuture::is_done));
    for i in 0..20 {
        let want = match CallMode::ALL[i % 4] {
            CallMode::EarlyRsp | CallMode::AckEarlyRsp => Vec::new(),
            _ => payload(1, i),
        };
        log.with(i, |o| assert_eq!(o.as_deref().ok(), Some(&want[..]), "callback {i}"));
    }
    for (i, f) in futs.iter_mut().enumerate() {
        assert_eq!(finished(f).expect("future"), payload(2, i));
    }
    rig.drain();
    rig.settle();
    log.assert_once(20);

    // A second channel that only the worker group polls: dropping its last handle closes it.
    let mut cfg = ChannelConfig::new(SERVER_NAME);
    cfg.self_poll = false;
    let ch2 = Channel::connect(&rig.cnic, rig.server.local_addr(), cfg).expect("second channel");
    wg.add(ch2.pollable());
    let mut fut = ch2.call_future(&CallOptions::default(), ECHO, b"second").expect("start");
    rig.until("the second channel's call", || fut.is_done());
    assert_eq!(finished(&mut fut).expect("second channel"), b"second");
    assert_eq!(rig.server.connections(), 2);
    drop(ch2);
    rig.until("the server to see the second channel go", || rig.server.connections() == 1);
    rig.echo(&CallOptions::default(), b"first still works");
    rig.drain();
    drop(wg);
}

/// Regression (found by this file, fixed in f708f8c): a handler that offloads to another thread
/// and waits for it. The other thread's reply used to be posted at once while the ACK the worker
/// had queued for the same request waited for the end of the pass, so the response overtook the
/// ACK: the Ack call completed with `acked == false` and its ACK was counted stale.
///
/// On real-time devices: the suite's `ack_overtaken_by_offloaded_reply`.
#[test]
fn ack_overtaken_by_offloaded_reply_stepped() {
    const N: usize = 8;
    let rig = Rig::new(STEPPED);
    let acked = std::thread::scope(|s| {
        let offload = &rig.offload;
        s.spawn(move || {
            let rx = lock(offload);
            for _ in 0..N {
                let (r, done) = rx.recv_timeout(WAIT_LIMIT).expect("an offloaded request");
                let out = transform(r.args());
                r.reply(&out).expect("offloaded reply");
                let _ = done.send(());
            }
        });
        (0..N)
            .map(|i| {
                let args = payload(0, i);
                let (resp, acked) =
                    rig.call(&CallOptions::mode(CallMode::Ack), OFFLOAD, &args).expect("Ack call");
                assert_eq!(resp, transform(&args));
                acked
            })
            .collect::<Vec<bool>>()
    });
    rig.drain();
    let s = rig.channel.stats();
    assert!(acked.iter().all(|&a| a), "Ack calls completed without being acknowledged: {acked:?}; {s:?}");
    assert_eq!(s.stale, 0, "the server's ACKs arrived after the responses and were dropped as stale");
}

/// Regression (found by this file, fixed in f708f8c; Stepped only: the interleaving needs the
/// engine's control). Two threads poll one channel: thread A takes the ACKs of calls X
/// (AckEarlyRsp) and Y (Ack) in one batch and is held up in X's callback; thread B then takes Y's
/// response and completes Y. Y used to report `is_acked() == false` although the server had
/// acknowledged it before responding. (Y's ACK, processed after Y completed, is counted in
/// `stats().stale` as a late message; that is documented behaviour and not checked here.)
#[test]
fn ack_seen_after_response_two_pollers_stepped() {
    let rig = Rig::new(STEPPED);
    let (gate_tx, gate_rx) = mpsc::channel::<()>();
    let (entered_tx, entered_rx) = mpsc::channel::<()>();
    rig.channel
        .call_callback(&CallOptions::mode(CallMode::AckEarlyRsp), HOLD, b"x", move |r| {
            assert!(r.is_ok(), "{r:?}");
            let _ = entered_tx.send(());
            let _ = gate_rx.recv_timeout(WAIT_LIMIT);
        })
        .expect("start X");
    let mut y = rig.channel.call_future(&CallOptions::mode(CallMode::Ack), HOLD, b"y").expect("start Y");
    // Both requests arrive, the server ACKs both; the ACKs reach the client's receive CQ.
    rig.fabric.run_until_idle();
    rig.server.poll();
    rig.fabric.run_until_idle();
    let mut held: Vec<Req> = std::iter::from_fn(|| lock(&rig.held).try_recv().ok()).collect();
    assert_eq!(held.len(), 2);
    let (acked, done) = std::thread::scope(|s| {
        let ch = rig.channel.clone();
        let a = s.spawn(move || ch.poll_responses());
        entered_rx.recv_timeout(WAIT_LIMIT).expect("thread A runs X's callback");
        let ry = held.pop().unwrap();
        assert_eq!(ry.args(), b"y");
        ry.reply(b"y!").expect("reply Y");
        rig.fabric.run_until_idle();
        rig.channel.poll_responses();
        let seen = (y.is_acked(), y.is_done());
        gate_tx.send(()).unwrap();
        a.join().expect("thread A");
        seen
    });
    drop(held);
    rig.drain();
    assert!(done, "Y completed on its response");
    assert_eq!(finished(&mut y).expect("Y"), b"y!");
    let s = rig.channel.stats();
    assert!(acked, "Y is an Ack call whose ACK arrived before its response: is_acked() must be true; {s:?}");
    assert!(s.stale <= 1, "{s:?}");
}

/// Regression (found by this file, fixed in f708f8c; Stepped only: needs the server's passes and
/// the client's polls in a given ratio). A 2-queue channel with every Ack call on queue 0. Each
/// server pass posts up to 32 sends (ACK + response for 16 requests) but collects at most 16 send
/// completions. The connection's send contexts were shared by both queues (2 × 96) while queue
/// 0's send ring held 128, so the ring filled before the contexts ran out and posts failed: ACKs
/// and responses were dropped (`failed_replies`), their calls never completed and their credits
/// never came back.
#[test]
fn server_send_ring_overflow_stepped() {
    let rig = Rig::with(STEPPED, |c, _| c.queues = 2);
    let log = Log::default();
    let opts =
        CallOptions { mode: CallMode::Ack, queue: Some(0), wait_for_credit: false, ..Default::default() };
    let mut next = 0;
    for _ in 0..12 {
        loop {
            match rig.channel.call_callback(&opts, ECHO, &payload(0, next), log.cb(next)) {
                Ok(()) => next += 1,
                Err(RpcError::WouldBlock(_)) => break,
                Err(e) => panic!("call {next}: {e}"),
            }
        }
        rig.fabric.run_until_idle();
        rig.server.poll(); // one worker pass
        rig.fabric.run_until_idle();
        while rig.channel.poll() > 0 {
            rig.fabric.run_until_idle();
        }
    }
    let s = rig.server.stats();
    assert_eq!(
        s.failed_replies,
        0,
        "the server could not post {} ACKs/responses; {} of {next} calls can never complete: {s:?}, client {:?}",
        s.failed_replies,
        next - log.completed(),
        rig.channel.stats()
    );
    rig.until("every call to complete", || log.completed() == next);
    rig.drain();
    log.assert_once(next);
}

/// Regression (found by this file, fixed in f708f8c; Stepped only, same ratio argument as above,
/// client side). EarlyRsp calls on queue 0 of a 2-queue channel: a credit grant can return more
/// credits than one poll collects send completions (16), so queue 0's send ring (2 × window = 64)
/// used to fill while send contexts (2 queues × 64) remained, and the next call failed with
/// `RpcError::Device(WouldBlock)`, a hard device error where nothing was wrong.
#[test]
fn client_send_ring_full_stepped() {
    let rig = Rig::with(STEPPED, |c, _| c.queues = 2);
    let log = Log::default();
    let opts = CallOptions {
        mode: CallMode::EarlyRsp,
        queue: Some(0),
        wait_for_credit: false,
        ..Default::default()
    };
    let mut next = 0;
    for round in 0..12 {
        loop {
            match rig.channel.call_callback(&opts, ECHO, &payload(0, next), log.cb(next)) {
                Ok(()) => next += 1,
                Err(RpcError::WouldBlock(_)) => break,
                Err(e) => panic!("round {round}, call {next}: expected Ok or WouldBlock, got {e:?}"),
            }
        }
        rig.fabric.run_until_idle();
        while rig.server.poll() > 0 {
            rig.fabric.run_until_idle();
        }
        rig.fabric.run_until_idle();
        rig.channel.poll();
    }
    rig.until("every call to complete", || log.completed() == next);
    rig.drain();
    log.assert_once(next);
}

/// Regression (fixed: `start()` now reaps send completions when the slab is empty). A
/// request's send context is released only once its send completion has been reaped by a poll,
/// and the simulated server NIC puts a response on the wire before the transport ACK of the request (device `run_all`: send steps, then the ACK queue), so
/// a call normally completes and returns its credit before its send completion exists. Observed
/// with several blocking callers on one channel: `tx_in_use` reaches `2 × window` (64) while
/// `table_in_use` is 0 and every credit is back, the completions are sitting in the send CQ (one
/// `poll_send_completions` then reaps 16 at once), and `start()` failed immediately with
/// `WouldBlock("every send context is in use")` although `wait_for_credit` is set and waiting
/// (reaping) would do.
///
/// The real engines' race (threads of blocking calls) is the suite's scenario of the same name;
/// here the same state is built deterministically with `poll_responses` (responses processed,
/// send completions left in the CQ): 64 calls done, credits all back, nothing outstanding, and
/// the next call used to fail.
///
/// On real-time devices: the suite's `contexts_held_by_unreaped_send_completions`.
#[test]
fn contexts_held_by_unreaped_send_completions_stepped() {
    let rig = Rig::new(STEPPED);
    let window = rig.window as usize;
    let log = Log::default();
    for k in 0..2 * window {
        rig.channel.call_callback(&CallOptions::default(), ECHO, &payload(0, k), log.cb(k)).expect("start");
        if (k + 1) % window == 0 {
            // The window is in flight: let it complete, reaping only the responses.
            for _ in 0..8 {
                rig.fabric.run_until_idle();
                rig.server.poll();
                rig.fabric.run_until_idle();
                rig.channel.poll_responses();
            }
            assert_eq!(log.completed(), k + 1);
        }
    }
    let s = rig.channel.stats();
    assert_eq!((s.table_in_use, s.credits), (0, rig.full_credits()), "nothing outstanding: {s:?}");
    let r = rig.channel.call_callback(&CallOptions::default(), ECHO, b"one more", log.cb(2 * window));
    assert!(r.is_ok(), "a call with every credit available and no call outstanding: {r:?}; {s:?}");
    rig.until("the last call", || log.completed() == 2 * window + 1);
    rig.drain();
    log.assert_once(2 * window + 1);
}

#[track_caller]
fn expect_decline(what: &str, r: Result<impl std::fmt::Debug, RpcError>) {
    match r {
        Err(RpcError::Status(Status::ServerDecline)) => {}
        other => panic!("{what}: expected Status(ServerDecline), got {other:?}"),
    }
}

/// Regression: a handler that panicked killed its worker thread; every connection on that worker
/// (and new ones assigned to it) got only timeouts, and the stats showed nothing. Now the panic
/// fails that request alone with SERVER_DECLINE: the worker keeps serving the connection and new
/// ones, nothing leaks (more panics than the window, the send contexts and the receive buffers),
/// and `handler_panics` counts them. Covers a panic holding the request, after replying, inside
/// `reply_with`'s fill closure, and after handing the request to another thread.
///
/// On real-time devices: the suite's `handler_panics_are_contained`.
#[test]
fn handler_panics_are_contained_stepped() {
    let rig = Rig::with(STEPPED, |c, _| c.window = 4);
    let window = rig.window as usize;
    let dflt = CallOptions::default();
    let n = 3 * window + 1;
    for i in 0..n {
        expect_decline("a handler that panics", rig.call(&dflt, PANIC, &payload(0, i)));
        expect_decline("Ack mode", rig.call(&CallOptions::mode(CallMode::Ack), PANIC, b"ack"));
    }
    // The no-response modes complete as usual; the credit comes back in a grant.
    for m in [CallMode::EarlyRsp, CallMode::AckEarlyRsp] {
        let (resp, _) = rig.call(&CallOptions::mode(m), PANIC, b"no response").expect("no-response call");
        assert!(resp.is_empty(), "{m:?}");
    }
    // A panic after the reply: the response stands.
    let (resp, _) = rig.call(&dflt, PANIC_AFTER_REPLY, b"replied").expect("a reply before the panic");
    assert_eq!(resp, b"replied");
    // A panic inside reply_with: declined; its send context and buffer go back.
    expect_decline("a panicking fill closure", rig.call(&dflt, PANIC_IN_FILL, b"fill"));
    // A panic after handing the request on: the request stays valid and is answered later.
    let log = Log::default();
    rig.channel.call_callback(&dflt, PANIC_AFTER_MOVE, b"moved", log.cb(0)).expect("start");
    let req = rig.take_held(1).pop().expect("the moved request");
    assert_eq!(req.args(), b"moved");
    req.reply(b"later").expect("a reply after the handler panicked");
    rig.until("the moved request's response", || log.completed() == 1);
    log.with(0, |o| assert_eq!(o.as_deref().ok(), Some(&b"later"[..]), "{o:?}"));
    // The worker still serves this connection.
    rig.echo(&dflt, b"still served");
    rig.drain();
    let panics = (2 * n + 5) as u64;
    rig.until("the server to count every panic", || rig.server.stats().handler_panics == panics);
    let s = rig.server.stats();
    assert_eq!((s.dropped, s.failed_replies, s.protocol_errors), (0, 0, 0), "{s:?}");
    // And a new connection, which goes to the same (only) worker.
    let ch2 = Channel::connect(&rig.cnic, rig.server.local_addr(), ChannelConfig::new(SERVER_NAME))
        .expect("a second channel");
    let full2 = ch2.stats().credits;
    assert_eq!(rig.call_on(&ch2, &dflt, ECHO, b"new").expect("a new connection"), b"new");
    expect_decline("second channel", rig.call_on(&ch2, &dflt, PANIC, b""));
    assert_eq!(rig.call_on(&ch2, &dflt, ECHO, b"again").expect("after a panic"), b"again");
    assert_eq!(rig.server.stats().handler_panics, panics + 1);
    rig.until("the second channel to drain", || {
        ch2.poll();
        let s = ch2.stats();
        s.tx_in_use == 0 && s.credits == full2
    });
    rig.drain();
    log.assert_once(1);
}

/// A completion callback that counts itself and panics.
fn panicking_callback(ran: &Arc<AtomicUsize>) -> impl FnOnce(Result<&[u8], RpcError>) + Send + 'static {
    let ran = ran.clone();
    move |r| {
        ran.fetch_add(1, Ordering::SeqCst);
        panic!("e2e: a completion callback panics (outcome {:?})", r.map(<[u8]>::len));
    }
}

/// Regression: a completion callback that panicked leaked its send context (after 2 × window
/// panics every call waited out its deadline) and unwound into whatever call's poll delivered it.
/// Now the panic is contained: the context is released, `callback_panics` counts it, and other
/// calls — including a blocking call whose own polling ran the callback — are unaffected. Covers
/// successes in every mode and an error outcome (a timeout).
///
/// On real-time devices: the suite's `callback_panics_are_contained`.
#[test]
fn callback_panics_are_contained_stepped() {
    let rig = Rig::with(STEPPED, |c, _| c.window = 2);
    let window = rig.window as usize;
    let ran = Arc::new(AtomicUsize::new(0));
    let n = 3 * 2 * window;
    for i in 0..n {
        let mode = CallMode::ALL[i % 4];
        rig.channel
            .call_callback(&CallOptions::mode(mode), ECHO, &payload(0, i), panicking_callback(&ran))
            .expect("start");
        rig.until("the panicking callback to run", || ran.load(Ordering::SeqCst) == i + 1);
    }
    rig.drain();
    assert_eq!(rig.channel.stats().callback_panics, n as u64);
    // An error outcome delivered to a panicking callback.
    let short = CallOptions { timeout: Some(SHORT), ..Default::default() };
    rig.channel.call_callback(&short, HOLD, b"slow", panicking_callback(&ran)).expect("start");
    let held = rig.take_held(1);
    rig.settle();
    rig.fabric.advance(SHORT + Duration::from_millis(1));
    assert_eq!(rig.channel.check_timeouts(), 1);
    assert_eq!(ran.load(Ordering::SeqCst), n + 1);
    drop(held);
    rig.drain();
    rig.echo(&CallOptions::default(), b"unaffected");
    rig.drain();
    let s = rig.channel.stats();
    assert_eq!(s.callback_panics, ran.load(Ordering::SeqCst) as u64, "{s:?}");
    assert_eq!((s.tx_in_use, s.table_in_use, s.protocol_errors), (0, 0, 0), "{s:?}");
}

/// Set in the child process of [`in_child`].
const CHILD_ENV: &str = "BYPASS_E2E_CHILD";

/// For a scenario whose failure is a process abort: in the parent, runs test `name` of this
/// binary in a child process and asserts that it passed, then returns true (the parent is done);
/// in the child, returns false (run the scenario).
fn in_child(name: &str) -> bool {
    if std::env::var_os(CHILD_ENV).is_some() {
        return false;
    }
    let exe = std::env::current_exe().expect("the test binary");
    let out = std::process::Command::new(exe)
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, "1")
        .output()
        .expect("run the child test");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "child test {name} failed ({:?}; an abort is a signal)\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        out.status
    );
    true
}

/// Regression: dropping the last handle of a channel while the thread unwinds from a panic closed
/// the channel, which delivered `Closed` to the outstanding callbacks; one that panicked then
/// panicked inside a destructor during unwinding, which aborts the process. Run in a child
/// process (an abort would take the whole test binary down), on every engine.
#[test]
fn channel_dropped_while_unwinding_does_not_abort() {
    if in_child("channel_dropped_while_unwinding_does_not_abort") {
        return;
    }
    for engine in [Engine::Inline, Engine::Threaded, STEPPED] {
        let rig = Rig::new(engine);
        let ran = Arc::new(AtomicUsize::new(0));
        let ch = rig.connect(ChannelConfig::new(SERVER_NAME)).expect("a second channel");
        for i in 0..3u8 {
            ch.call_callback(&CallOptions::default(), HOLD, &[i], panicking_callback(&ran)).expect("start");
        }
        let unwound = std::thread::spawn(move || {
            let _last_handle = ch;
            panic!("e2e: unwinding with the last handle of a channel");
        })
        .join();
        assert!(unwound.is_err(), "{engine:?}: the thread's own panic");
        assert_eq!(ran.load(Ordering::SeqCst), 3, "{engine:?}: every outstanding callback got its outcome");
    }
}

/// Regression: `CallOptions.timeout` or `ChannelConfig.timeout` of `Duration::MAX` panicked
/// inside the library ("overflow when adding durations") once the clock was past zero. Now the
/// deadline saturates: it never comes. Stepped moves the virtual clock past 1 s first.
///
/// On real-time devices: the suite's `huge_timeouts_saturate`.
#[test]
fn huge_timeouts_saturate_stepped() {
    let rig = Rig::with(STEPPED, |c, _| c.timeout = Some(Duration::MAX));
    rig.fabric.advance(Duration::from_secs(2));
    rig.echo(&CallOptions::default(), b"channel timeout MAX");
    for m in CallMode::ALL {
        let opts = CallOptions { mode: m, timeout: Some(Duration::MAX), ..Default::default() };
        rig.call(&opts, ECHO, b"call timeout MAX").unwrap_or_else(|e| panic!("{m:?}: {e}"));
        let opts = CallOptions { timeout: Some(Duration::from_secs(u64::MAX)), ..opts };
        rig.call(&opts, ECHO, b"u64::MAX s").unwrap_or_else(|e| panic!("{m:?}: {e}"));
    }
    // Such a call never times out.
    let log = Log::default();
    let opts = CallOptions { timeout: Some(Duration::MAX), ..Default::default() };
    rig.channel.call_callback(&opts, HOLD, b"forever", log.cb(0)).expect("start");
    let req = rig.take_held(1).pop().expect("held");
    rig.fabric.advance(Duration::from_secs(3600));
    assert_eq!(rig.channel.check_timeouts(), 0);
    assert_eq!(log.completed(), 0);
    req.reply(b"eventually").expect("reply");
    rig.until("the response", || log.completed() == 1);
    log.with(0, |o| assert_eq!(o.as_deref().ok(), Some(&b"eventually"[..]), "{o:?}"));
    rig.drain();
    assert_eq!(rig.channel.stats().timeouts, 0);
}

/// Regression: a failed blocking call left the previous response's bytes in the caller's `Vec`.
/// Every error found before sending (too large, bad queue, closed) leaves it empty; the errors
/// from the server or the deadline need a blocking call that waits, which the suite covers.
///
/// On real-time devices: the suite's `failed_calls_leave_no_stale_response`.
#[test]
fn failed_calls_leave_no_stale_response_stepped() {
    let rig = Rig::new(STEPPED);
    let prev = || b"the previous response".to_vec();
    let mut resp = prev();
    let too_big = vec![0u8; rig.channel.max_request_args() + 1];
    let early = CallOptions::mode(CallMode::EarlyRsp);
    let r = rig.channel.call_with(&early, ECHO, &too_big, &mut resp).map(drop);
    assert!(matches!(r, Err(RpcError::TooLarge { .. })), "{r:?}");
    assert!(resp.is_empty(), "TooLarge left {resp:?}");
    resp = prev();
    let r = rig.channel.call_with(&on_queue(rig.channel.queues()), ECHO, b"x", &mut resp);
    assert!(matches!(r, Err(RpcError::InvalidArgument(_))), "{r:?}");
    assert!(resp.is_empty(), "InvalidArgument left {resp:?}");
    rig.drain();
    rig.channel.close();
    resp = prev();
    let r = rig.channel.call(ECHO, b"x", &mut resp);
    assert!(matches!(r, Err(RpcError::Closed)), "{r:?}");
    assert!(resp.is_empty(), "Closed left {resp:?}");
}

/// Regression: a reply after the client closed failed with `Device(BadState)`; it is
/// `RpcError::Closed`, whichever way the reply is made, and counted as a failed reply.
///
/// On real-time devices: the suite's `reply_after_client_close_is_closed`.
#[test]
fn reply_after_client_close_is_closed_stepped() {
    let rig = Rig::new(STEPPED);
    let log = Log::default();
    for i in 0..3u8 {
        rig.channel.call_callback(&CallOptions::default(), HOLD, &[i], log.cb(i as usize)).expect("start");
    }
    let mut held = rig.take_held(3);
    rig.channel.close();
    rig.until("the server to drop the connection", || rig.server.connections() == 0);
    let r = held.pop().unwrap().reply(b"nobody listens");
    assert!(matches!(r, Err(RpcError::Closed)), "reply: {r:?}");
    let r = held.pop().unwrap().reply_status(Status::ServerDecline, b"");
    assert!(matches!(r, Err(RpcError::Closed)), "reply_status: {r:?}");
    let r = held.pop().unwrap().reply_with(Status::Success, echo_fill);
    assert!(matches!(r, Err(RpcError::Closed)), "reply_with: {r:?}");
    assert_eq!(rig.server.stats().failed_replies, 3);
    rig.until("the server's contexts", || rig.server.tx_in_use() == 0);
    rig.drain_closed();
    log.assert_once(3);
}

/// Regression: `Channel::connect` required `ToSocketAddrs + Display`, so the `(host, port)` tuple
/// `Server::bind` takes did not compile. Any `ToSocketAddrs` works now; a failure names the
/// socket addresses the argument resolved to.
///
/// On real-time devices: the suite's `connect_takes_a_host_port_tuple`.
#[test]
fn connect_takes_a_host_port_tuple_stepped() {
    let rig = Rig::new(STEPPED);
    let port = rig.server.local_addr().port();
    let dflt = CallOptions::default();
    let tuple = Channel::connect(&rig.cnic, ("127.0.0.1", port), ChannelConfig::new(SERVER_NAME))
        .expect("connect with a (host, port) tuple");
    assert_eq!(rig.call_on(&tuple, &dflt, ECHO, b"tuple").expect("call"), b"tuple");
    let owned =
        Channel::connect(&rig.cnic, (String::from("127.0.0.1"), port), ChannelConfig::new(SERVER_NAME))
            .expect("connect with a (String, port) tuple");
    assert_eq!(rig.call_on(&owned, &dflt, ECHO, b"owned").expect("call"), b"owned");
    let dead = {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr")
    };
    match Channel::connect(&rig.cnic, ("127.0.0.1", dead.port()), ChannelConfig::new(SERVER_NAME)) {
        Err(e @ RpcError::Control(_)) => assert!(e.to_string().contains(&dead.to_string()), "{e}"),
        other => panic!("connecting where nothing listens: {other:?}"),
    }
    drop((tuple, owned));
    rig.until("the server to see them go", || rig.server.connections() == 1);
    rig.drain();
}

/// `QueueConfig::timeout` of exponent 0 (`AckTimeout::NONE`: no retransmission timer, the
/// hardware's meaning) is a valid setting on both sides; calls work and are bounded by their own
/// deadlines.
///
/// On real-time devices: the suite's `no_ack_timer_is_valid`.
#[test]
fn no_ack_timer_is_valid_stepped() {
    let rig = Rig::with(STEPPED, |c, s| {
        c.queue_config.timeout = hal::AckTimeout::NONE;
        s.queue_config.timeout = hal::AckTimeout::NONE;
    });
    for m in CallMode::ALL {
        rig.call(&CallOptions::mode(m), ECHO, b"no timer").unwrap_or_else(|e| panic!("{m:?}: {e}"));
    }
    rig.drain();
}

/// Regression: several config fields were not checked at construction (zero or oversized
/// depths, timeouts of zero, names over the protocol's limits, a message size above the device's
/// caps reported without naming the field). Every bad field is now refused by `Channel::connect`
/// / `Server::bind` with `InvalidArgument` naming it, before any I/O.
#[test]
fn config_fields_are_validated_by_name() {
    let fabric = Fabric::new(Engine::Inline);
    let nic = fabric.add_nic();
    let caps = hal::Device::caps(&nic);
    let server = Server::bind(&nic, "127.0.0.1:0", ServerConfig::new(SERVER_NAME), Functions::new())
        .expect("a valid server");
    let cnic = fabric.add_nic();
    type C = fn(&mut ChannelConfig, &hal::DeviceCaps);
    let channel_cases: Vec<(&str, C)> = vec![
        ("ChannelConfig.queues", |c, _| c.queues = 0),
        ("ChannelConfig.queues", |c, _| c.queues = 257),
        ("ChannelConfig.window", |c, _| c.window = 0),
        ("ChannelConfig.window", |c, _| c.window = 5000),
        ("ChannelConfig.msg_size", |c, _| c.msg_size = 63),
        ("ChannelConfig.msg_size", |c, caps| c.msg_size = caps.max_msg_size as usize + 1),
        ("ChannelConfig.table_size", |c, _| c.table_size = 0),
        ("ChannelConfig.table_size", |c, _| c.table_size = 100),
        ("ChannelConfig.timeout", |c, _| c.timeout = Some(Duration::ZERO)),
        ("ChannelConfig.connect_timeout", |c, _| c.connect_timeout = Duration::ZERO),
        ("ChannelConfig.server_name", |c, _| c.server_name = "n".repeat(256)),
        ("ChannelConfig.client_info", |c, _| c.client_info = "i".repeat(4097)),
        ("ChannelConfig.queue_config.send_depth", |c, _| c.queue_config.send_depth = 0),
        ("ChannelConfig.queue_config.recv_depth", |c, _| c.queue_config.recv_depth = 0),
        ("ChannelConfig.queue_config.max_send_sge", |c, _| c.queue_config.max_send_sge = 0),
        ("ChannelConfig.queue_config.max_recv_sge", |c, _| c.queue_config.max_recv_sge = 0),
        ("ChannelConfig.queue_config.max_inline", |c, caps| c.queue_config.max_inline = caps.max_inline + 1),
        ("ChannelConfig.queue_config.retry_count", |c, _| c.queue_config.retry_count = 8),
        ("ChannelConfig.queue_config.rnr_retry", |c, _| c.queue_config.rnr_retry = 8),
        // 256 queues x 2 x 4096 send contexts exceed the device's queue depth.
        ("ChannelConfig.queues", |c, _| {
            c.queues = 256;
            c.window = 4096
        }),
    ];
    let dead = {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr")
    };
    for (field, tweak) in &channel_cases {
        let mut c = ChannelConfig::new(SERVER_NAME);
        tweak(&mut c, &caps);
        assert!(c.validate(&caps).is_err(), "{field}: validate accepted {c:?}");
        // Refused before any I/O: the same error where nothing listens.
        for addr in [server.local_addr(), dead] {
            match Channel::connect(&cnic, addr, c.clone()) {
                Err(RpcError::InvalidArgument(text)) => {
                    assert!(text.contains(field), "{field}: the error should name it: {text}")
                }
                other => panic!("{field}: {other:?}"),
            }
        }
    }
    assert_eq!(server.stats().connections, 0, "no refused config may reach the server");
    ChannelConfig::new(SERVER_NAME).validate(&caps).expect("the defaults are valid");

    type S = fn(&mut ServerConfig, &hal::DeviceCaps);
    let server_cases: Vec<(&str, S)> = vec![
        ("ServerConfig.name", |s, _| s.name = "n".repeat(256)),
        ("ServerConfig.msg_size", |s, _| s.msg_size = 63),
        ("ServerConfig.msg_size", |s, caps| s.msg_size = caps.max_msg_size as usize + 1),
        ("ServerConfig.max_window", |s, _| s.max_window = 0),
        ("ServerConfig.max_window", |s, _| s.max_window = 5000),
        ("ServerConfig.max_queues", |s, _| s.max_queues = 0),
        ("ServerConfig.max_queues", |s, _| s.max_queues = 257),
        ("ServerConfig.pin", |s, _| s.pin = vec![0, 1 << 20]),
        ("ServerConfig.handshake_timeout", |s, _| s.handshake_timeout = Duration::ZERO),
        ("ServerConfig.queue_config.send_depth", |s, _| s.queue_config.send_depth = 0),
        ("ServerConfig.queue_config.max_inline", |s, caps| s.queue_config.max_inline = caps.max_inline + 1),
        ("ServerConfig.queue_config.retry_count", |s, _| s.queue_config.retry_count = 9),
    ];
    for (field, tweak) in &server_cases {
        let mut s = ServerConfig::new(SERVER_NAME);
        tweak(&mut s, &caps);
        match Server::bind(&nic, "127.0.0.1:0", s, Functions::new()) {
            Err(RpcError::InvalidArgument(text)) => {
                assert!(text.contains(field), "{field}: the error should name it: {text}")
            }
            other => panic!("{field}: {other:?}"),
        }
    }
    ServerConfig::new(SERVER_NAME).validate(&caps).expect("the defaults are valid");

    // A device with small queues: a window whose rings do not fit is refused by name.
    let mut small = sim::FabricConfig::new(Engine::Inline);
    small.caps.max_queue_depth = 64;
    let small = Fabric::with_config(small);
    let snic = small.add_nic();
    let mut s = ServerConfig::new(SERVER_NAME);
    s.max_window = 32; // 3 x 32 send contexts > 64
    match Server::bind(&snic, "127.0.0.1:0", s, Functions::new()) {
        Err(RpcError::InvalidArgument(text)) => assert!(text.contains("ServerConfig.max_window"), "{text}"),
        other => panic!("max_window too large for the device: {other:?}"),
    }
    let mut c = ChannelConfig::new(SERVER_NAME);
    c.window = 32; // 2 x 32 fits, 4 x 32 + 16 receive buffers do not
    match Channel::connect(&small.add_nic(), server.local_addr(), c) {
        Err(RpcError::InvalidArgument(text)) => assert!(text.contains("ChannelConfig.window"), "{text}"),
        other => panic!("window too large for the device: {other:?}"),
    }
}
