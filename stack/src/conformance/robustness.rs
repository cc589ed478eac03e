//! Conformance scenarios of robustness: a server shut down under calls, handlers and callbacks
//! that panic, deadlines too large to add, failed calls that must not leave an old response
//! behind, and replies to a client that has gone. Generic over an [`Env`] like the rest of the
//! suite (moved here from the simulator's `stack/tests/e2e.rs`, which keeps their Stepped-engine
//! runs).

use super::{
    payload, Env, Log, Rig, CALL_TIMEOUT, ECHO, HOLD, MISSING, PANIC, PANIC_AFTER_MOVE, PANIC_AFTER_REPLY,
    PANIC_IN_FILL,
};
use crate::{CallMode, CallOptions, Channel, FunctionId, RpcError, Status};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::flow::on_queue;

#[track_caller]
fn expect_decline<T: std::fmt::Debug>(what: &str, r: Result<T, RpcError>) {
    match r {
        Err(RpcError::Status(Status::ServerDecline)) => {}
        other => panic!("{what}: expected Status(ServerDecline), got {other:?}"),
    }
}

/// A blocking call on another channel than the rig's: the response.
fn call_on<D: crate::hal::Device + Clone>(
    ch: &Channel<D>,
    opts: &CallOptions,
    f: FunctionId,
    args: &[u8],
) -> Result<Vec<u8>, RpcError> {
    let mut resp = b"garbage".to_vec();
    ch.call_with(opts, f, args, &mut resp).map(|_| resp)
}

/// `Server::shutdown` while calls are outstanding (three callbacks, an acknowledged `Ack` future
/// and a blocking call on another thread): the server has no connection left at once; each call
/// fails with `Closed`, exactly once; the channel closes with no queue READY, and later calls
/// fail with `Closed`. (Dropping the server instead: `server_dropped_mid_call`.)
pub fn server_shutdown_mid_call<E: Env>(env: &E) {
    let mut rig = Rig::new(env);
    let log = Log::default();
    for i in 0..3 {
        rig.channel.call_callback(&CallOptions::default(), HOLD, &[i as u8], log.cb(i)).expect("start");
    }
    let mut fut = rig.channel.call_future(&CallOptions::mode(CallMode::Ack), HOLD, b"fut").expect("start");
    let blocked = std::thread::scope(|s| {
        let ch = rig.channel.clone();
        let blocking = s.spawn(move || {
            let mut resp = Vec::new();
            ch.call(HOLD, b"blocking", &mut resp)
        });
        let held = rig.take_held(5);
        rig.until("the Ack call's ACK", || fut.is_acked());
        assert_eq!(log.completed(), 0, "a call completed before the server shut down");
        assert!(!fut.is_done());
        let server = rig.server.as_mut().expect("the server");
        server.shutdown();
        assert_eq!(server.connections(), 0, "a shut down server has no connection");
        rig.until("the channel to notice the server is gone", || rig.channel.is_closed());
        rig.until("every outstanding call to fail", || log.completed() == 3 && fut.is_done());
        drop(held);
        blocking.join().expect("blocking caller")
    });
    assert!(matches!(blocked, Err(RpcError::Closed)), "the blocking call: {blocked:?}");
    for i in 0..3 {
        log.with(i, |o| assert!(matches!(o, Err(RpcError::Closed)), "call {i}: {o:?}"));
    }
    assert!(matches!(rig.block_on(&mut fut).0, Err(RpcError::Closed)), "the future");
    let r = rig.channel.call_callback(&CallOptions::default(), ECHO, b"x", log.cb(99));
    assert!(matches!(r, Err(RpcError::Closed)), "a callback on a closed channel: {r:?}");
    let r = rig.call(&CallOptions::default(), ECHO, b"x");
    assert!(matches!(r, Err(RpcError::Closed)), "a call on a closed channel: {r:?}");
    rig.drain_closed();
    rig.settle();
    log.assert_once(3);
    assert_eq!(rig.stats().ready_queues, 0);
}

/// Regression: a handler that panicked killed its worker thread; every connection on that
/// worker got only timeouts, and the stats showed nothing. The panic fails that request alone
/// with SERVER_DECLINE: the worker keeps serving the connection and new ones, nothing leaks
/// (more panics than the window, the send contexts and the receive buffers), and
/// `handler_panics` counts them. Covers a panic holding the request (in every mode: the modes
/// without a response complete as usual), after replying (the response stands), inside
/// `reply_with`'s fill closure, and after handing the request to another thread (which answers
/// it later).
pub fn handler_panics_are_contained<E: Env>(env: &E) {
    let rig = Rig::with(env, |c, _| c.window = 4);
    let window = rig.window as usize;
    let dflt = CallOptions::default();
    let n = 3 * window + 1;
    for i in 0..n {
        expect_decline("a handler that panics", rig.call(&dflt, PANIC, &payload(0, i)));
        expect_decline("Ack mode", rig.call(&CallOptions::mode(CallMode::Ack), PANIC, b"ack"));
    }
    for m in [CallMode::EarlyRsp, CallMode::AckEarlyRsp] {
        let (resp, _) = rig.call(&CallOptions::mode(m), PANIC, b"no response").expect("no-response call");
        assert!(resp.is_empty(), "{m:?}");
    }
    let (resp, _) = rig.call(&dflt, PANIC_AFTER_REPLY, b"replied").expect("a reply before the panic");
    assert_eq!(resp, b"replied");
    expect_decline("a panicking fill closure", rig.call(&dflt, PANIC_IN_FILL, b"fill"));
    let log = Log::default();
    rig.channel.call_callback(&dflt, PANIC_AFTER_MOVE, b"moved", log.cb(0)).expect("start");
    let req = rig.take_held(1).pop().expect("the moved request");
    assert_eq!(req.args(), b"moved");
    req.reply(b"later").expect("a reply after the handler panicked");
    rig.until("the moved request's response", || log.completed() == 1);
    log.with(0, |o| assert_eq!(o.as_deref().ok(), Some(&b"later"[..]), "{o:?}"));
    rig.echo(&dflt, b"still served");
    rig.drain();
    let panics = (2 * n + 5) as u64;
    rig.until("the server to count every panic", || rig.server().stats().handler_panics == panics);
    let s = rig.server().stats();
    assert_eq!((s.dropped, s.failed_replies, s.protocol_errors), (0, 0, 0), "{s:?}");
    // And a new connection, which goes to the same (only) worker.
    let ch2 = Channel::connect(env.client(), rig.server().local_addr(), super::channel_config(env))
        .expect("a second channel");
    let full2 = ch2.stats().credits;
    assert_eq!(call_on(&ch2, &dflt, ECHO, b"new").expect("a new connection"), b"new");
    expect_decline("second channel", call_on(&ch2, &dflt, PANIC, b""));
    assert_eq!(call_on(&ch2, &dflt, ECHO, b"again").expect("after a panic"), b"again");
    assert_eq!(rig.server().stats().handler_panics, panics + 1);
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
        panic!("rpc-suite: a completion callback panics (outcome {:?})", r.map(<[u8]>::len));
    }
}

/// Regression: a completion callback that panicked leaked its send context (after 2 × window
/// panics every call waited out its deadline) and unwound into whatever call's poll delivered
/// it. The panic is contained: the context is released, `callback_panics` counts it, and other
/// calls — including a blocking call whose own polling ran the callback — are unaffected.
/// Covers successes in every mode and an error outcome (a timeout).
pub fn callback_panics_are_contained<E: Env>(env: &E) {
    let rig = Rig::with(env, |c, _| c.window = 2);
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
    assert_eq!(rig.stats().callback_panics, n as u64);
    // An error outcome delivered to a panicking callback.
    let short = CallOptions { timeout: Some(CALL_TIMEOUT), ..Default::default() };
    rig.channel.call_callback(&short, HOLD, b"slow", panicking_callback(&ran)).expect("start");
    let held = rig.take_held(1);
    rig.until("the timeout", || ran.load(Ordering::SeqCst) == n + 1);
    drop(held);
    rig.drain();
    // The blocking caller is the channel's only poller, so its polling delivers the callback's
    // response (which comes first); its own call must not see that panic.
    for i in 0..4 {
        rig.channel
            .call_callback(&CallOptions::default(), ECHO, b"cb", panicking_callback(&ran))
            .expect("start");
        rig.echo(&CallOptions::default(), &payload(1, i));
    }
    rig.until("the last callbacks", || ran.load(Ordering::SeqCst) == n + 5);
    rig.echo(&CallOptions::default(), b"unaffected");
    rig.drain();
    let s = rig.stats();
    assert_eq!(s.callback_panics, ran.load(Ordering::SeqCst) as u64, "{s:?}");
    assert_eq!((s.tx_in_use, s.table_in_use, s.protocol_errors), (0, 0, 0), "{s:?}");
}

/// Regression: a `CallOptions.timeout` or `ChannelConfig.timeout` of `Duration::MAX` panicked
/// inside the library ("overflow when adding durations"). The deadline saturates: it never
/// comes, in every mode, and a call held that long does not time out.
pub fn huge_timeouts_saturate<E: Env>(env: &E) {
    let rig = Rig::with(env, |c, _| c.timeout = Some(Duration::MAX));
    rig.echo(&CallOptions::default(), b"channel timeout MAX");
    for m in CallMode::ALL {
        let opts = CallOptions { mode: m, timeout: Some(Duration::MAX), ..Default::default() };
        rig.call(&opts, ECHO, b"call timeout MAX").unwrap_or_else(|e| panic!("{m:?}: {e}"));
        let opts = CallOptions { timeout: Some(Duration::from_secs(u64::MAX)), ..opts };
        rig.call(&opts, ECHO, b"u64::MAX s").unwrap_or_else(|e| panic!("{m:?}: {e}"));
    }
    let log = Log::default();
    let opts = CallOptions { timeout: Some(Duration::MAX), ..Default::default() };
    rig.channel.call_callback(&opts, HOLD, b"forever", log.cb(0)).expect("start");
    let req = rig.take_held(1).pop().expect("held");
    assert_eq!(rig.channel.check_timeouts(), 0);
    assert_eq!(log.completed(), 0);
    req.reply(b"eventually").expect("reply");
    rig.until("the response", || log.completed() == 1);
    log.with(0, |o| assert_eq!(o.as_deref().ok(), Some(&b"eventually"[..]), "{o:?}"));
    rig.drain();
    assert_eq!(rig.stats().timeouts, 0);
}

/// Regression: a failed blocking call left the previous response's bytes in the caller's
/// buffer. Every error leaves it empty: errors found before sending (too large, a queue out of
/// range, a closed channel) and errors from the server or the deadline (an unknown function, a
/// panicking handler, a timeout).
pub fn failed_calls_leave_no_stale_response<E: Env>(env: &E) {
    let rig = Rig::new(env);
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
    let short = CallOptions { timeout: Some(CALL_TIMEOUT), ..Default::default() };
    for f in [MISSING, PANIC, HOLD] {
        rig.channel.call(ECHO, b"ok", &mut resp).expect("echo");
        assert_eq!(resp, b"ok");
        let r = rig.channel.call_with(&short, f, b"fails", &mut resp);
        assert!(r.is_err(), "{f}: {r:?}");
        assert!(resp.is_empty(), "{f}: {r:?} left {resp:?}");
    }
    drop(rig.take_held(1));
    rig.drain();
    rig.channel.close();
    resp = prev();
    let r = rig.channel.call(ECHO, b"x", &mut resp);
    assert!(matches!(r, Err(RpcError::Closed)), "{r:?}");
    assert!(resp.is_empty(), "Closed left {resp:?}");
}

/// Regression: a reply after the client closed failed with `Device(BadState)`; it is
/// `RpcError::Closed`, whichever way the reply is made (`reply`, `reply_status`, `reply_with`),
/// and counted as a failed reply.
pub fn reply_after_client_close_is_closed<E: Env>(env: &E) {
    let rig = Rig::new(env);
    let log = Log::default();
    for i in 0..3u8 {
        rig.channel.call_callback(&CallOptions::default(), HOLD, &[i], log.cb(i as usize)).expect("start");
    }
    let mut held = rig.take_held(3);
    rig.channel.close();
    rig.until("the server to drop the connection", || rig.server().connections() == 0);
    let r = held.pop().expect("held").reply(b"nobody listens");
    assert!(matches!(r, Err(RpcError::Closed)), "reply: {r:?}");
    let r = held.pop().expect("held").reply_status(Status::ServerDecline, b"");
    assert!(matches!(r, Err(RpcError::Closed)), "reply_status: {r:?}");
    let r = held.pop().expect("held").reply_with(Status::Success, |args, out| {
        out.get_mut(..args.len()).ok_or(args.len())?.copy_from_slice(args);
        Ok(args.len())
    });
    assert!(matches!(r, Err(RpcError::Closed)), "reply_with: {r:?}");
    assert_eq!(rig.server().stats().failed_replies, 3);
    rig.until("the server's contexts", || rig.server().tx_in_use() == 0);
    rig.drain_closed();
    log.assert_once(3);
}
