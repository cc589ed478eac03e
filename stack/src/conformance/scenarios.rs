//! The RPC conformance scenarios: one function per behaviour a user of the stack relies on,
//! generic over an [`Env`]. Each asserts only what the API documents, so a correct stack passes
//! on the simulator and on a real (or soft) RDMA device alike.
//!
//! Conventions: payloads come from `pattern` / `payload`, so a misplaced byte is caught, not
//! just a missing one; calls that must fail somewhere else than in their response (timeouts,
//! closing, queue failure) go to the HOLD function, whose requests the test keeps; every
//! scenario ends by checking that nothing leaked (contexts, table slots, credits) and that
//! every callback ran exactly once.

use super::{
    echoed, pattern, payload, wants_ack, wants_response, Env, Log, Rig, BIG, CALL_TIMEOUT, ECHO, HOLD,
    MISSING, REPLY_STATUS, WAIT_BUDGET,
};
use crate::wire::ResponseHeader;
use crate::{CallMode, CallOptions, ChannelConfig, RpcError, ServerConfig, Status};

/// The argument sizes every mode is tried with: empty, one byte, 64 bytes and the largest
/// request the channel takes in one message.
fn sizes(max: usize) -> [usize; 4] {
    [0, 1, 64, max]
}

fn on_queue(q: usize) -> CallOptions {
    CallOptions { queue: Some(q), ..Default::default() }
}

fn with_timeout(mode: CallMode) -> CallOptions {
    CallOptions { mode, timeout: Some(CALL_TIMEOUT), ..Default::default() }
}

/// The seed of the argument pattern of call `k` in mode `m`.
fn seed(m: usize, k: usize) -> u8 {
    (m * 16 + k + 1) as u8
}

/// Waits until the server has run ECHO `hits` times, then checks that the arguments of the calls
/// without a response arrived byte for byte (in any order).
#[track_caller]
fn check_seen<E: Env>(rig: &Rig<'_, E>, hits: usize, mut sent: Vec<Vec<u8>>) {
    rig.until(&format!("the server to run ECHO {hits} times"), || rig.hits() >= hits);
    let mut seen = rig.seen();
    seen.sort();
    sent.sort();
    assert!(seen == sent, "the server received other arguments than sent in the modes without a response");
}

/// Blocking calls (`Channel::call_with`) in every call mode with arguments of 0, 1, 64 bytes
/// and the largest request: the response is the echo byte for byte (empty in `EarlyRsp` and
/// `AckEarlyRsp`, whose calls complete without one), `CallInfo::acked` is true exactly in the
/// ACK modes, the server received every argument byte for byte, and the counters add up with
/// nothing timed out, stale or leaked.
pub fn blocking_calls_every_mode<E: Env>(env: &E) {
    let rig = Rig::new(env);
    let max = rig.channel.max_request_args();
    let mut no_rsp = Vec::new();
    for (m, mode) in CallMode::ALL.into_iter().enumerate() {
        for (k, len) in sizes(max).into_iter().enumerate() {
            let args = pattern(seed(m, k), len);
            let mut resp = b"left over".to_vec();
            let info = rig
                .channel
                .call_with(&CallOptions::mode(mode), ECHO, &args, &mut resp)
                .unwrap_or_else(|e| panic!("{mode:?} call with {len} B: {e}; {}", rig.state()));
            assert!(
                resp == echoed(mode, &args),
                "{mode:?} call with {len} B: wrong response ({} B)",
                resp.len()
            );
            assert_eq!(info.acked, wants_ack(mode), "{mode:?} call with {len} B: CallInfo::acked");
            if !wants_response(mode) {
                no_rsp.push(args);
            }
        }
    }
    check_seen(&rig, 16, no_rsp);
    rig.drain();
    rig.settle();
    assert_eq!(rig.hits(), 16, "a handler ran twice");
    let (c, s) = (rig.stats(), rig.server().stats());
    assert_eq!((c.calls, c.timeouts, c.stale), (16, 0, 0), "{c:?}");
    assert_eq!(
        (s.requests, s.responses, s.acks),
        (16, 8, 8),
        "WaitRsp and Ack respond, Ack modes ACK: {s:?}"
    );
}

/// Callbacks (`Channel::call_callback`) in every call mode and size, all 16 outstanding at
/// once: each callback runs exactly once, with the echo byte for byte (empty for the modes
/// without a response); the server received every argument.
pub fn callbacks_every_mode<E: Env>(env: &E) {
    let rig = Rig::new(env);
    let max = rig.channel.max_request_args();
    let log = Log::default();
    let mut calls = Vec::new();
    for (m, mode) in CallMode::ALL.into_iter().enumerate() {
        for (k, len) in sizes(max).into_iter().enumerate() {
            let args = pattern(seed(m, k), len);
            rig.channel
                .call_callback(&CallOptions::mode(mode), ECHO, &args, log.cb(calls.len()))
                .unwrap_or_else(|e| panic!("starting a {mode:?} callback call with {len} B: {e}"));
            calls.push((mode, args));
        }
    }
    rig.until("16 callbacks", || log.completed() == calls.len());
    for (i, (mode, args)) in calls.iter().enumerate() {
        log.with(i, |o| match o {
            Ok(resp) => assert!(
                resp[..] == *echoed(*mode, args),
                "{mode:?} callback with {} B: wrong response ({} B)",
                args.len(),
                resp.len()
            ),
            Err(e) => panic!("{mode:?} callback with {} B: {e}", args.len()),
        });
    }
    let no_rsp = calls.iter().filter(|(m, _)| !wants_response(*m)).map(|(_, a)| a.clone()).collect();
    check_seen(&rig, 16, no_rsp);
    rig.drain();
    rig.settle();
    log.assert_once(calls.len());
    let c = rig.stats();
    assert_eq!((c.calls, c.timeouts), (16, 0), "{c:?}");
}

/// Futures (`Channel::call_future`) in every call mode and size, all outstanding at once and
/// then each polled to completion by a minimal executor (polled again only after its waker
/// fired): each resolves to the echo byte for byte (empty without a response), `is_acked()` is
/// true exactly in the ACK modes, and a resolved future stays `is_done()`.
pub fn futures_every_mode<E: Env>(env: &E) {
    let rig = Rig::new(env);
    let max = rig.channel.max_request_args();
    let mut calls = Vec::new();
    for (m, mode) in CallMode::ALL.into_iter().enumerate() {
        for (k, len) in sizes(max).into_iter().enumerate() {
            let args = pattern(seed(m, k), len);
            let fut = rig
                .channel
                .call_future(&CallOptions::mode(mode), ECHO, &args)
                .unwrap_or_else(|e| panic!("starting a {mode:?} future with {len} B: {e}"));
            calls.push((mode, args, fut));
        }
    }
    let mut no_rsp = Vec::new();
    for (mode, args, fut) in &mut calls {
        let (out, acked) = rig.block_on(fut);
        let len = args.len();
        let resp = out.unwrap_or_else(|e| panic!("{mode:?} future with {len} B: {e}"));
        assert!(resp[..] == *echoed(*mode, args), "{mode:?} future with {len} B: wrong response");
        assert_eq!(acked, wants_ack(*mode), "{mode:?} future with {len} B: is_acked()");
        assert!(fut.is_done());
        if !wants_response(*mode) {
            no_rsp.push(args.clone());
        }
    }
    check_seen(&rig, 16, no_rsp);
    rig.drain();
    let c = rig.stats();
    assert_eq!((c.calls, c.timeouts), (16, 0), "{c:?}");
}

/// Rendezvous well past one READ chunk: 256 KiB + 3 and 4 MiB + 1 bytes of arguments, which
/// the server READs in several chunks with several READs in flight, echoed back by RDMA WRITE
/// into the call's response buffer; blocking and future deliveries, byte for byte (the pattern
/// changes every 4 KiB, so a chunk placed at the wrong offset shows), nothing leaked. Each call
/// has the suite's [`WAIT_BUDGET`] as its deadline: an echo of 4 MiB moves 8 MiB, which takes
/// 8–16 s on an emulated link (the VFIO NIC and rxe in a TCG guest move 0.5–1 MB/s), past the
/// default 10 s deadline; the scenario checks the data, not the speed.
pub fn large_rendezvous_echo<E: Env>(env: &E) {
    let rig = Rig::new(env);
    for (k, size) in [(256usize << 10) + 3, (4 << 20) + 1].into_iter().enumerate() {
        let args: Vec<u8> = (0..size).map(|i| (i.wrapping_mul(7) + k + (i >> 12)) as u8).collect();
        let opts = CallOptions {
            max_response: size,
            timeout: Some(WAIT_BUDGET),
            ..CallOptions::mode(CallMode::WaitRsp)
        };
        let mut resp = Vec::new();
        rig.channel.call_with(&opts, ECHO, &args, &mut resp).expect("large rendezvous echo");
        assert!(resp == args, "{size} B blocking: the echo differs: {}", differences(&resp, &args));
        let mut fut = rig.channel.call_future(&opts, ECHO, &args).expect("large rendezvous future");
        let (out, _) = rig.block_on(&mut fut);
        let out = out.expect("large rendezvous future");
        assert!(out == args, "{size} B future: the echo differs: {}", differences(&out, &args));
    }
    rig.drain();
    let c = rig.stats();
    assert_eq!((c.calls, c.timeouts), (4, 0), "{c:?}");
}

/// Where `got` differs from `want`, for a failure message: the lengths, the first and last
/// differing offsets and how many bytes differ (a whole chunk or packet shows in its bounds).
fn differences(got: &[u8], want: &[u8]) -> String {
    let diff: Vec<usize> =
        got.iter().zip(want).enumerate().filter(|(_, (a, b))| a != b).map(|(i, _)| i).collect();
    match (diff.first(), diff.last()) {
        (Some(first), Some(last)) => format!(
            "{} B received of {}; {} bytes differ, offsets {first}..={last} (first: got {:#04x}, want {:#04x})",
            got.len(),
            want.len(),
            diff.len(),
            got[*first],
            want[*first]
        ),
        _ => format!("{} B received of {}, the common part equal", got.len(), want.len()),
    }
}

/// The largest response the client accepts (message size less the 16-byte response header)
/// arrives whole through each delivery. Arguments one byte over the largest eager size fail at
/// once with `TooLarge` in the modes without a response, in every delivery, and send nothing; in
/// WAIT_RSP and ACK they go by rendezvous (RDMA READ); an echo too large for a response message
/// comes back by RDMA WRITE into a response buffer the call names (REMOTE_LEN_ERR without one).
pub fn message_size_limits<E: Env>(env: &E) {
    let rig = Rig::new(env);
    let biggest =
        ChannelConfig::default().msg_size.min(ServerConfig::default().msg_size) - ResponseHeader::LEN;
    let expect = |resp: &[u8], what: &str| {
        assert_eq!(resp.len(), biggest, "{what}: the largest response");
        assert!(resp.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8), "{what}: response bytes");
    };
    for mode in [CallMode::WaitRsp, CallMode::Ack] {
        let mut resp = Vec::new();
        rig.channel.call_with(&CallOptions::mode(mode), BIG, b"", &mut resp).expect("blocking BIG");
        expect(&resp, &format!("{mode:?} blocking"));
        let mut fut = rig.channel.call_future(&CallOptions::mode(mode), BIG, b"").expect("future BIG");
        let (out, _) = rig.block_on(&mut fut);
        expect(&out.expect("future BIG"), &format!("{mode:?} future"));
    }
    let log = Log::default();
    rig.channel.call_callback(&CallOptions::default(), BIG, b"", log.cb(0)).expect("callback BIG");
    rig.until("the BIG callback", || log.completed() == 1);
    log.with(0, |o| expect(o.as_deref().expect("callback BIG"), "callback"));
    rig.drain();

    let (calls, requests) = (rig.stats().calls, rig.server().stats().requests);
    let max = rig.channel.max_request_args();
    let too_big = vec![0xA5; max + 1];
    let large: Vec<u8> = (0..3 * max + 5).map(|i| (i % 253) as u8).collect();
    for mode in [CallMode::WaitRsp, CallMode::Ack] {
        // One byte over: the arguments are READ, the echo still fits a response message.
        let mut resp = Vec::new();
        rig.channel.call_with(&CallOptions::mode(mode), ECHO, &too_big, &mut resp).expect("rendezvous echo");
        assert!(resp == too_big, "{mode:?}: the rendezvous echo differs");
        // Larger: READ, and the echo written into the call's response buffer.
        let opts = CallOptions { max_response: large.len(), ..CallOptions::mode(mode) };
        rig.channel.call_with(&opts, ECHO, &large, &mut resp).expect("rendezvous echo, large");
        assert!(resp == large, "{mode:?}: the large rendezvous echo differs");
        let r = rig.channel.call_with(&CallOptions::mode(mode), ECHO, &large, &mut resp);
        assert!(
            matches!(r, Err(RpcError::Status(Status::RemoteLenErr))),
            "{mode:?} no response buffer: {r:?}"
        );
    }
    rig.drain();
    let (calls, requests) = (calls + 6, requests + 6);
    for mode in [CallMode::EarlyRsp, CallMode::AckEarlyRsp] {
        let opts = CallOptions::mode(mode);
        let mut resp = Vec::new();
        let r = rig.channel.call_with(&opts, ECHO, &too_big, &mut resp);
        assert!(matches!(r, Err(RpcError::TooLarge { .. })), "{mode:?}: {} B of arguments: {r:?}", max + 1);
        if let Err(e @ RpcError::TooLarge { len, max: limit, header }) = r {
            // The error counts the header in, names the message size, and says what fits, that
            // msg_size counts the header, and that both sides' msg_size must grow.
            assert_eq!((len, limit), (max + 1 + header, max + header), "{mode:?}: {e:?}");
            let text = e.to_string();
            for needle in [&format!("at most {max} bytes of arguments") as &str, "header", "msg_size", "both"]
            {
                assert!(text.contains(needle), "{mode:?}: {needle:?} missing from {text:?}");
            }
        }
        let r = rig.channel.call_callback(&opts, ECHO, &too_big, log.cb(1));
        assert!(matches!(r, Err(RpcError::TooLarge { .. })), "{mode:?} callback: {r:?}");
        let r = rig.channel.call_future(&opts, ECHO, &too_big);
        assert!(matches!(r, Err(RpcError::TooLarge { .. })), "{mode:?} future: {r:?}");
    }
    rig.settle();
    log.assert_once(1);
    assert_eq!(rig.stats().calls, calls, "TooLarge calls must not be sent");
    assert_eq!(rig.server().stats().requests, requests);
    rig.drain();
}

/// The ACK of an `Ack` call arrives while the handler still holds the request: the future's
/// `is_acked()` turns true, the call stays pending until the handler replies, then resolves to
/// the reply. An `AckEarlyRsp` call completes on the ACK alone, while the handler still holds
/// its request (which wants no response; replying to it sends nothing).
pub fn ack_arrives_before_response<E: Env>(env: &E) {
    let rig = Rig::new(env);
    let mut fut =
        rig.channel.call_future(&CallOptions::mode(CallMode::Ack), HOLD, b"deferred").expect("start Ack");
    rig.until("the ACK of the Ack call", || fut.is_acked());
    let req = rig.take_held(1).pop().expect("held");
    assert_eq!(req.args(), b"deferred");
    assert!(req.wants_response());
    rig.settle();
    assert!(!fut.is_done(), "the Ack call completed before the handler replied: {fut:?}");
    let waker = std::task::Waker::from(std::sync::Arc::new(super::Flag::default()));
    let polled =
        std::future::Future::poll(std::pin::Pin::new(&mut fut), &mut std::task::Context::from_waker(&waker));
    assert!(polled.is_pending(), "polling the Ack call before the handler replied: {polled:?}");
    req.reply(b"later").expect("reply");
    let (out, acked) = rig.block_on(&mut fut);
    assert_eq!(out.expect("Ack call"), b"later");
    assert!(acked);

    let mut fut = rig
        .channel
        .call_future(&CallOptions::mode(CallMode::AckEarlyRsp), HOLD, b"fire")
        .expect("start AckEarlyRsp");
    let (out, acked) = rig.block_on(&mut fut);
    assert_eq!(out.expect("AckEarlyRsp call"), b"", "AckEarlyRsp completes with no data");
    assert!(acked, "AckEarlyRsp completes on the ACK");
    let req = rig.take_held(1).pop().expect("held");
    assert!(!req.wants_response());
    let c = rig.stats();
    assert_eq!(
        c.credits,
        rig.full_credits() - 1,
        "the server still holds the request's receive buffer: {c:?}"
    );
    req.reply(b"ignored").expect("a reply to a request without response is fine");
    rig.drain();
    let s = rig.server().stats();
    assert_eq!((s.requests, s.acks, s.responses), (2, 2, 1), "{s:?}");
    assert_eq!(rig.stats().stale, 0);
}

/// Calling a function the server does not have fails with `FunctionNotFound` naming it, through
/// each delivery and in both modes with a response; the server counts them, no handler runs,
/// and the channel keeps working.
pub fn unknown_function<E: Env>(env: &E) {
    let rig = Rig::new(env);
    let log = Log::default();
    for (i, mode) in [CallMode::WaitRsp, CallMode::Ack].into_iter().enumerate() {
        let opts = CallOptions::mode(mode);
        let mut resp = Vec::new();
        match rig.channel.call_with(&opts, MISSING, b"anyone?", &mut resp) {
            Err(RpcError::FunctionNotFound(id)) => assert_eq!(id, MISSING, "{mode:?}"),
            other => panic!("{mode:?}: a blocking call of an unknown function: {other:?}"),
        }
        let mut fut = rig.channel.call_future(&opts, MISSING, b"").expect("start");
        match rig.block_on(&mut fut).0 {
            Err(RpcError::FunctionNotFound(id)) => assert_eq!(id, MISSING, "{mode:?}"),
            other => panic!("{mode:?}: a future of an unknown function: {other:?}"),
        }
        rig.channel.call_callback(&opts, MISSING, &[1; 100], log.cb(i)).expect("start");
    }
    rig.until("the callbacks", || log.completed() == 2);
    let e = RpcError::FunctionNotFound(MISSING);
    assert!(e.to_string().contains(&MISSING.to_string()), "the error should name the function: {e}");
    for i in 0..2 {
        log.with(i, |o| assert!(matches!(o, Err(RpcError::FunctionNotFound(id)) if *id == MISSING), "{o:?}"));
    }
    let mut resp = Vec::new();
    rig.channel.call(ECHO, b"still fine", &mut resp).expect("a call after unknown functions");
    assert_eq!(resp, b"still fine");
    rig.drain();
    rig.settle();
    log.assert_once(2);
    assert_eq!(rig.server().stats().unknown_functions, 6);
    assert_eq!(rig.hits(), 1);
}

/// A handler that replies with an error status: the call fails with `RpcError::Status` of that
/// status (FUNCTION_ERR, which means "no such function", as `FunctionNotFound` of the function
/// called), through each delivery; SUCCESS without data is an empty response.
pub fn handler_status_errors<E: Env>(env: &E) {
    let rig = Rig::new(env);
    let log = Log::default();
    let check = |s: Status, r: &Result<Vec<u8>, RpcError>, what: &str| match (s, r) {
        (Status::Success, Ok(v)) => assert!(v.is_empty(), "{what}: {v:?}"),
        (Status::FunctionErr, Err(RpcError::FunctionNotFound(id))) => assert_eq!(*id, REPLY_STATUS),
        (s, Err(RpcError::Status(got))) => assert_eq!(*got, s, "{what}"),
        (s, other) => panic!("{what}: a handler replying {s:?} gave {other:?}"),
    };
    for (i, s) in Status::ALL.into_iter().enumerate() {
        let mode = if i % 2 == 0 { CallMode::WaitRsp } else { CallMode::Ack };
        let opts = CallOptions::mode(mode);
        let mut resp = Vec::new();
        let r = rig.channel.call_with(&opts, REPLY_STATUS, &[s as u8], &mut resp).map(|_| resp);
        check(s, &r, &format!("{s:?} {mode:?} blocking"));
        let mut fut = rig.channel.call_future(&opts, REPLY_STATUS, &[s as u8]).expect("start");
        check(s, &rig.block_on(&mut fut).0, &format!("{s:?} {mode:?} future"));
        rig.channel.call_callback(&opts, REPLY_STATUS, &[s as u8], log.cb(i)).expect("start");
    }
    rig.until("the callbacks", || log.completed() == Status::ALL.len());
    for (i, s) in Status::ALL.into_iter().enumerate() {
        log.with(i, |o| check(s, o, &format!("{s:?} callback")));
    }
    rig.drain();
    rig.settle();
    log.assert_once(Status::ALL.len());
    let s = rig.server().stats();
    assert_eq!(s.responses, 3 * Status::ALL.len() as u64, "{s:?}");
}

/// Four threads of blocking calls share one channel of three queues (two server workers). First
/// all `WaitRsp`: every response matches its own request, nothing is stale, timed out or lost,
/// and the counters on both sides add up. Then every thread cycles through all four modes: every
/// call completes with its own echo and acknowledgement; the only stale messages allowed are
/// late ACKs of `Ack` calls whose response another polling thread processed first (documented
/// in `ChannelStats::stale`), at most one per `Ack` call.
pub fn concurrent_callers<E: Env>(env: &E) {
    const THREADS: usize = 4;
    const PER_THREAD: usize = 100;
    let rig = Rig::with(env, |c, s| {
        c.queues = 3;
        s.workers = 2;
    });
    let run = |mixed: bool| {
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let ch = rig.channel.clone();
                s.spawn(move || {
                    let mut resp = Vec::new();
                    for i in 0..PER_THREAD {
                        let mode = if mixed { CallMode::ALL[(t + i) % 4] } else { CallMode::WaitRsp };
                        let args = payload(t + if mixed { THREADS } else { 0 }, i);
                        let info = ch
                            .call_with(&CallOptions::mode(mode), ECHO, &args, &mut resp)
                            .unwrap_or_else(|e| panic!("thread {t} call {i} ({mode:?}): {e}"));
                        assert!(
                            resp == echoed(mode, &args),
                            "thread {t} call {i} ({mode:?}) got someone else's response"
                        );
                        assert_eq!(info.acked, wants_ack(mode), "thread {t} call {i} ({mode:?})");
                    }
                });
            }
        });
    };
    let total = (THREADS * PER_THREAD) as u64;

    run(false);
    rig.drain();
    let (c, s) = (rig.stats(), rig.server().stats());
    assert_eq!((c.calls, c.timeouts, c.stale), (total, 0, 0), "{c:?}");
    assert_eq!((s.requests, s.responses, s.dropped, s.failed_replies), (total, total, 0, 0), "{s:?}");

    run(true);
    rig.until("every handler to run", || rig.hits() as u64 == 2 * total);
    rig.drain();
    let (c, s) = (rig.stats(), rig.server().stats());
    let ack_calls = total / 4;
    assert_eq!((c.calls, c.timeouts), (2 * total, 0), "{c:?}");
    assert!(c.stale <= ack_calls, "more stale messages than late ACKs could explain: {c:?}");
    assert_eq!((s.requests, s.responses, s.acks), (2 * total, total + total / 2, total / 2), "{s:?}");
    assert_eq!((s.dropped, s.failed_replies), (0, 0), "{s:?}");
}

/// A handler that holds its request: a blocking call with a short deadline fails with
/// `Timeout` (the wait budget is far longer); the server still holds one receive buffer, so one
/// credit is out until the late reply, which is dropped and counted as stale. The same through a
/// callback (the request then dropped: its credit comes back in a grant) and an `Ack` future
/// (the ACK arrives, the response does not: still `Timeout`). The channel keeps working.
pub fn timeout_then_late_reply<E: Env>(env: &E) {
    let rig = Rig::new(env);
    let full = rig.full_credits();

    // (a) blocking; then a late reply.
    let mut resp = Vec::new();
    match rig.channel.call_with(&with_timeout(CallMode::WaitRsp), HOLD, b"slow", &mut resp) {
        Err(RpcError::Timeout) => {}
        other => panic!("a blocking call nobody answers: {other:?}"),
    }
    let req = rig.take_held(1).pop().expect("held");
    assert_eq!(req.args(), b"slow");
    let s = rig.stats();
    assert_eq!((s.timeouts, s.stale), (1, 0), "{s:?}");
    assert_eq!(s.credits, full - 1, "the server still holds the request's receive buffer: {s:?}");
    req.reply(b"too late").expect("late reply");
    rig.until("the late response to be counted stale", || rig.stats().stale == 1);
    rig.drain();

    // (b) callback; then the request is dropped.
    let log = Log::default();
    rig.channel.call_callback(&with_timeout(CallMode::WaitRsp), HOLD, b"cb", log.cb(0)).expect("start");
    let req = rig.take_held(1).pop().expect("held");
    rig.until("the callback call to time out", || log.completed() == 1);
    log.with(0, |o| assert!(matches!(o, Err(RpcError::Timeout)), "{o:?}"));
    drop(req);
    rig.until("the server to count the dropped request", || rig.server().stats().dropped == 1);
    rig.drain();

    // (c) Ack future: acknowledged, never answered; then a late reply.
    // A longer deadline here: the ACK must arrive before it, or it would be late (stale) too.
    let opts = CallOptions { timeout: Some(5 * CALL_TIMEOUT), ..with_timeout(CallMode::Ack) };
    let mut fut = rig.channel.call_future(&opts, HOLD, b"acked").expect("start");
    let req = rig.take_held(1).pop().expect("held");
    match rig.block_on(&mut fut) {
        (Err(RpcError::Timeout), acked) => {
            assert!(acked, "the server ACKs before the handler runs: the ACK came within the deadline")
        }
        other => panic!("an Ack call whose response never comes: {other:?}"),
    }
    req.reply(b"too late").expect("late reply");
    rig.until("the second late response to be counted stale", || rig.stats().stale == 2);
    rig.drain();

    // The channel is as good as new.
    let mut resp = Vec::new();
    rig.channel.call_with(&with_timeout(CallMode::WaitRsp), ECHO, b"in time", &mut resp).expect("echo");
    assert_eq!(resp, b"in time");
    rig.drain();
    rig.settle();
    log.assert_once(1);
    let s = rig.stats();
    assert_eq!((s.timeouts, s.stale), (3, 2), "{s:?}");
}

/// The server is dropped while calls are outstanding (three callbacks, an acknowledged `Ack`
/// future and a blocking call on another thread): each fails with `Closed`, exactly once; the
/// channel is closed with no queue READY; later calls fail with `Closed` through every delivery
/// and nothing leaks.
pub fn server_dropped_mid_call<E: Env>(env: &E) {
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
        assert_eq!(log.completed(), 0, "a call completed before the server went away");
        drop(rig.server.take());
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
    expect_closed(&rig, &log);
    rig.drain_closed();
    rig.settle();
    log.assert_once(3);
    assert_eq!(rig.stats().ready_queues, 0);
}

/// Calls on a closed channel fail at once with `Closed`, through every delivery (a callback
/// that fails to start is not run).
#[track_caller]
fn expect_closed<E: Env>(rig: &Rig<'_, E>, log: &Log) {
    for mode in CallMode::ALL {
        let opts = CallOptions::mode(mode);
        let mut resp = Vec::new();
        let r = rig.channel.call_with(&opts, ECHO, b"x", &mut resp);
        assert!(matches!(r, Err(RpcError::Closed)), "{mode:?}: a blocking call on a closed channel: {r:?}");
        let r = rig.channel.call_callback(&opts, ECHO, b"x", log.cb(1000));
        assert!(matches!(r, Err(RpcError::Closed)), "{mode:?}: a callback on a closed channel: {r:?}");
        let r = rig.channel.call_future(&opts, ECHO, b"x");
        assert!(matches!(r, Err(RpcError::Closed)), "{mode:?}: a future on a closed channel: {r:?}");
    }
}

/// The client closes its channel while calls are outstanding (three callbacks, an acknowledged
/// `Ack` future, a blocking call on another thread): each fails with `Closed` exactly once,
/// later calls fail with `Closed`; the server notices and drops the connection, and replies to
/// the requests it still holds fail cleanly and are counted. Dropping the last handle of a
/// second channel with a call outstanding closes it the same way.
pub fn client_close_mid_call<E: Env>(env: &E) {
    let rig = Rig::new(env);
    let log = Log::default();
    for i in 0..3 {
        rig.channel.call_callback(&CallOptions::default(), HOLD, &[i as u8], log.cb(i)).expect("start");
    }
    let mut fut = rig.channel.call_future(&CallOptions::mode(CallMode::Ack), HOLD, b"fut").expect("start");
    let (blocked, held) = std::thread::scope(|s| {
        let ch = rig.channel.clone();
        let blocking = s.spawn(move || {
            let mut resp = Vec::new();
            ch.call(HOLD, b"blocking", &mut resp)
        });
        let held = rig.take_held(5);
        rig.until("the ACK", || fut.is_acked());
        assert_eq!(rig.server().connections(), 1);
        rig.channel.close();
        assert!(rig.channel.is_closed());
        rig.until("every outstanding call to fail", || log.completed() == 3 && fut.is_done());
        (blocking.join().expect("blocking caller"), held)
    });
    assert!(matches!(blocked, Err(RpcError::Closed)), "the blocking call: {blocked:?}");
    for i in 0..3 {
        log.with(i, |o| assert!(matches!(o, Err(RpcError::Closed)), "call {i}: {o:?}"));
    }
    assert!(matches!(rig.block_on(&mut fut).0, Err(RpcError::Closed)), "the future");
    expect_closed(&rig, &log);
    rig.until("the server to drop the connection", || rig.server().connections() == 0);
    for r in held {
        assert!(r.reply(b"nobody listens").is_err(), "a reply on a closed connection succeeded");
    }
    assert_eq!(rig.server().stats().failed_replies, 5);
    rig.drain_closed();
    rig.until("the server's send contexts", || rig.server().tx_in_use() == 0);
    rig.settle();
    log.assert_once(3);

    // Dropping the last handle of a channel closes it too.
    let server = rig.server();
    let ch2 =
        crate::Channel::connect(env.client(), server.local_addr(), ChannelConfig::new(super::SERVER_NAME))
            .expect("a second channel");
    rig.until("the server to see the second channel", || server.connections() == 1);
    let log2 = Log::default();
    ch2.call_callback(&CallOptions::default(), HOLD, b"dropped", log2.cb(0)).expect("start");
    let held = rig.take_held(1);
    drop(ch2);
    assert_eq!(log2.completed(), 1, "dropping the last handle completes its outstanding calls");
    log2.with(0, |o| assert!(matches!(o, Err(RpcError::Closed)), "{o:?}"));
    rig.until("the server to see the second channel go", || server.connections() == 0);
    drop(held);
    log2.assert_once(1);
}

/// A queue fails while calls on it are outstanding (`Channel::fail_queue`, as if the NIC had
/// moved it to ERROR): each of them — three callbacks, an `Ack` future and a blocking call on
/// another thread — completes exactly once with `RpcError::Queue`; the channel stays open on its
/// other queue: calls naming the failed queue fail with `Queue`, round-robin calls and calls on
/// the other queue succeed, and once the server's replies on the failed queue have given up,
/// nothing is left in use on the server. Failing the last queue closes the channel: its calls
/// fail (`Queue` or `Closed`), later calls fail with `Closed`, the server drops the connection.
///
/// The server's replies to the failed queue can only end by retry exhaustion (with the default
/// `retry_count` 7, which Soft-RoCE would read as "forever" if the verbs backend did not give it
/// 6: see `bypass_hal::conformance::retry_exceeded_when_the_peer_is_gone`).
///
/// Without queue recovery (`ChannelConfig::recovery` = `None`): a failed queue stays failed.
pub fn queue_error_mid_flight<E: Env>(env: &E) {
    let rig = Rig::with(env, |c, _| {
        c.queues = 2;
        c.recovery = None;
    });
    let log = Log::default();
    for i in 0..3 {
        rig.channel.call_callback(&on_queue(0), HOLD, &[i as u8], log.cb(i)).expect("start");
    }
    let ack0 = CallOptions { queue: Some(0), ..CallOptions::mode(CallMode::Ack) };
    let mut fut = rig.channel.call_future(&ack0, HOLD, b"fut").expect("start");
    let (blocked, held0) = std::thread::scope(|s| {
        let ch = rig.channel.clone();
        let blocking = s.spawn(move || {
            let mut resp = Vec::new();
            ch.call_with(&on_queue(0), HOLD, b"blocking", &mut resp)
        });
        let held = rig.take_held(5);
        rig.until("the ACK", || fut.is_acked());
        assert_eq!(log.completed(), 0);
        rig.channel.fail_queue(0).expect("fail queue 0");
        rig.until("the calls on queue 0 to fail", || log.completed() == 3 && fut.is_done());
        (blocking.join().expect("blocking caller"), held)
    });
    assert!(matches!(blocked, Err(RpcError::Queue(_))), "the blocking call on queue 0: {blocked:?}");
    for i in 0..3 {
        log.with(i, |o| assert!(matches!(o, Err(RpcError::Queue(_))), "call {i}: {o:?}"));
    }
    assert!(matches!(rig.block_on(&mut fut).0, Err(RpcError::Queue(_))), "the future on queue 0");
    let s = rig.stats();
    assert_eq!(s.ready_queues, 1, "{s:?}");
    assert!(!rig.channel.is_closed(), "one queue failed, one is left: the channel stays open");

    let mut resp = Vec::new();
    let r = rig.channel.call_with(&on_queue(0), ECHO, b"q0", &mut resp);
    assert!(matches!(r, Err(RpcError::Queue(_))), "a call naming the failed queue: {r:?}");
    for i in 0..6 {
        let args = format!("after the failure {i}").into_bytes();
        rig.channel.call(ECHO, &args, &mut resp).unwrap_or_else(|e| panic!("round-robin call {i}: {e}"));
        assert_eq!(resp, args);
    }
    rig.channel.call_with(&on_queue(1), ECHO, b"q1", &mut resp).expect("a call on queue 1");
    assert_eq!(resp, b"q1");
    let mut fut = rig.channel.call_future(&CallOptions::mode(CallMode::Ack), ECHO, b"f").expect("start");
    assert_eq!(rig.block_on(&mut fut).0.expect("a future after the failure"), b"f");
    // Late replies to the failed queue's calls reach nobody (the client's queue is in ERROR; the
    // server's queue gives up after its retries, the connection goes on on queue 1).
    for r in held0 {
        let _ = r.reply(b"zombie");
    }
    rig.until("the server's sends on the failed queue to finish", || rig.server().tx_in_use() == 0);
    rig.settle();
    log.assert_once(3);
    rig.channel.call_with(&on_queue(1), ECHO, b"q1 again", &mut resp).expect("queue 1 after the zombies");
    assert_eq!(resp, b"q1 again");

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
    expect_closed(&rig, &log);
    drop(held1);
    rig.until("the server to drop the connection", || rig.server().connections() == 0);
    rig.drain_closed();
    rig.settle();
    log.assert_once(5);
    assert!(rig.channel.fail_queue(2).is_err(), "queue 2 of 2 does not exist");
}
