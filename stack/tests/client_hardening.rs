//! Issue 30's client-side defects: what a caller's deadline, a slow recovery exchange, an
//! oversized one-sided operation or a queue without READ resources must not cost the channel.
//!
//! - A rendezvous call that times out keeps its memory registered (quarantined) until the server
//!   answers it: the server's late READ succeeds instead of failing the queue under bystanders.
//!
//! Every wait is bounded (the rig's `until`); the Stepped engine moves deadlines on its virtual
//! clock.

use bypass::*;
use std::time::Duration;

mod common;
use common::ids::{fid, HOLD};
use common::rig::{lock, Log, Rig, STEPPED};

/// Answers the length of its arguments (8 bytes, little-endian).
const LEN: FunctionId = fid(30);

/// Rendezvous arguments of this size take one 8 KiB class of the server's pool: with a server
/// limit of 8 KiB, a second such call waits for the first one's memory.
const ARGS: usize = 5000;

fn rndv_rig(engine: sim::Engine) -> Rig {
    Rig::build(engine, |s| {
        s.server.rndv_memory_limit = 8192;
        s.functions.register(LEN, |req| {
            let n = req.args().len() as u64;
            let _ = req.reply(&n.to_le_bytes());
        });
    })
}

fn on0(timeout: Option<Duration>, rendezvous: bool) -> CallOptions {
    CallOptions { queue: Some(0), timeout, rendezvous, wait_for_credit: false, ..Default::default() }
}

/// Issue 30, defect 3. A rendezvous call times out while the server still waits for memory to
/// READ its arguments. The server READs them later: the READ must find the memory still
/// registered, so the queue does not fail, a bystander call outstanding on it succeeds, nothing
/// is recovered, and the quarantined memory is freed by the late response.
fn a_timed_out_rendezvous_call_costs_no_bystander(engine: sim::Engine) {
    let rig = rndv_rig(engine);
    let log = Log::default();
    let args = vec![7u8; ARGS];
    // 0: holds the server's whole rendezvous memory.
    rig.channel.call_callback(&on0(None, true), HOLD, &args, log.cb(0)).expect("start the holder");
    let mut held = rig.take_held(1);
    // 1: waits at the server for memory; it will time out here first.
    let short = Duration::from_millis(50);
    rig.channel.call_callback(&on0(Some(short), true), LEN, &args, log.cb(1)).expect("start the late one");
    rig.until("the server to queue the second call for memory", || rig.server.rndv_stats().waited == 1);
    // 2: a bystander on the same queue, held by the server.
    rig.channel.call_callback(&on0(None, false), HOLD, b"bystander", log.cb(2)).expect("start the bystander");
    held.extend(rig.take_held(1));
    rig.until_timers("the second call to time out", short, || {
        rig.channel.check_timeouts();
        log.completed() == 1
    });
    log.with(1, |o| assert!(matches!(o, Err(RpcError::Timeout)), "{engine:?}: {o:?}"));
    assert!(
        rig.channel.rndv_quarantined() >= ARGS as u64,
        "{engine:?}: the timed-out call's memory is kept while the server may READ it"
    );
    // The holder answers: the server's memory is free, it READs the timed-out call's arguments.
    let holder = held.remove(0);
    holder.reply(b"held").expect("reply the holder");
    rig.until("the server to READ the late call's arguments and answer it", || {
        rig.channel.stats().stale >= 1 || rig.server.rndv_stats().failed > 0
    });
    assert_eq!(rig.server.rndv_stats().failed, 0, "{engine:?}: the late READ failed");
    assert_eq!(rig.channel.rndv_quarantined(), 0, "{engine:?}: the late response frees the quarantine");
    let bystander = held.remove(0);
    bystander.reply(b"fine").expect("reply the bystander");
    rig.until("the bystander's outcome", || log.completed() == 3);
    log.assert_once(3);
    log.with(0, |o| assert_eq!(o.as_deref().ok(), Some(&b"held"[..]), "{engine:?}"));
    log.with(2, |o| assert_eq!(o.as_deref().ok(), Some(&b"fine"[..]), "{engine:?}: the bystander"));
    let s = rig.channel.stats();
    assert_eq!((s.recoveries, s.ready_queues, s.timeouts), (0, rig.channel.queues(), 1), "{engine:?} {s:?}");
    assert!(s.stale >= 1, "{engine:?}: the late response was counted stale: {s:?}");
    let r = rig.server.rndv_stats();
    assert_eq!((r.requests, r.failed, r.bytes_read), (2, 0, 2 * ARGS as u64), "{engine:?} {r:?}");
    rig.drain();
    assert_eq!(rig.channel.rndv_in_use(), 0, "{engine:?}: client rendezvous memory leaked");
    assert!(!rig.channel.is_closed());
}

/// A timed-out call's quarantine ends with its queue: a failed queue serves no late READ, so
/// its memory is dropped at once (and the channel's close drops whatever is left).
fn a_failed_queue_frees_its_quarantine(engine: sim::Engine) {
    let rig = rndv_rig(engine);
    let log = Log::default();
    let args = vec![3u8; ARGS];
    rig.channel.call_callback(&on0(None, true), HOLD, &args, log.cb(0)).expect("start the holder");
    let held = rig.take_held(1);
    let short = Duration::from_millis(50);
    rig.channel.call_callback(&on0(Some(short), true), LEN, &args, log.cb(1)).expect("start the late one");
    rig.until("the server to queue the second call for memory", || rig.server.rndv_stats().waited == 1);
    rig.until_timers("the second call to time out", short, || {
        rig.channel.check_timeouts();
        log.completed() == 1
    });
    assert!(rig.channel.rndv_quarantined() > 0, "{engine:?}");
    rig.channel.fail_queue(0).expect("fail queue 0");
    assert_eq!(rig.channel.rndv_quarantined(), 0, "{engine:?}: the failed queue's quarantine is freed");
    drop(held);
    rig.until("the holder's outcome", || log.completed() == 2);
    rig.channel.close();
    assert_eq!(rig.channel.rndv_in_use(), 0, "{engine:?}: nothing is left after the close");
    drop(lock(&rig.held));
}

/// A server that never answers (its handler dropped the request) leaves the quarantine to its
/// time limit: after 60 s of the device's clock without an answer the memory is dropped.
#[test]
fn an_unanswered_quarantine_ends_after_its_time_limit() {
    let rig = rndv_rig(STEPPED);
    let log = Log::default();
    let short = Duration::from_millis(50);
    rig.channel.call_callback(&on0(Some(short), true), HOLD, &[9u8; ARGS], log.cb(0)).expect("start");
    let held = rig.take_held(1);
    rig.until_timers("the call to time out", short, || {
        rig.channel.check_timeouts();
        log.completed() == 1
    });
    drop(held);
    rig.settle();
    assert!(rig.channel.rndv_quarantined() > 0, "a dropped request answers nothing: still quarantined");
    rig.fabric.advance(Duration::from_secs(59));
    rig.channel.check_timeouts();
    assert!(rig.channel.rndv_quarantined() > 0, "59 s: still quarantined");
    rig.fabric.advance(Duration::from_secs(1));
    rig.channel.check_timeouts();
    assert_eq!(rig.channel.rndv_quarantined(), 0, "60 s: dropped");
    assert_eq!(rig.channel.rndv_in_use(), 0);
    rig.drain();
}

common::per_engine!(stepped: a_timed_out_rendezvous_call_costs_no_bystander, a_failed_queue_frees_its_quarantine);
