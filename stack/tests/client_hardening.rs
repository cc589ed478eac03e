//! Issue 30's client-side defects: what a caller's deadline, a slow recovery exchange, an
//! oversized one-sided operation or a queue without READ resources must not cost the channel.
//!
//! - 3: a rendezvous call that times out keeps its memory registered (quarantined) until the
//!   server answers it: the server's late READ succeeds instead of failing the queue under
//!   bystanders; a failed queue, the close or a 60 s limit end the quarantine too.
//! - 4: a one-sided READ or WRITE above the device's `max_msg_size` is refused at the call.
//! - 6: a queue-reset answer slower than the recovery timeout costs one attempt, not the channel.
//! - 11: `max_dest_rd_atomic` / `max_rd_atomic` 0 are accepted at connect, on either side;
//!   rendezvous arguments and one-sided READs, which would need them, are refused at the call
//!   (the server's are announced in its hello).
//!
//! Every wait is bounded (the rig's `until`); the Stepped engine moves deadlines on its virtual
//! clock.

use bypass::*;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;
use common::helpers::poll_once;
use common::ids::{fid, ECHO, HOLD};
use common::rig::{lock, Log, Rig, Setup, SERVER_NAME, STEPPED, WAIT_LIMIT};

/// Answers the length of its arguments (8 bytes, little-endian).
const LEN: FunctionId = fid(30);
/// Answers the largest response the caller accepts (bytes 0, 1, 2, ... mod 256), by `reply`:
/// into the caller's response buffer when it is large.
const MAKE: FunctionId = fid(31);

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

/// Quarantined memory counts against `ChannelConfig::memory_limit` with the channel's buffers:
/// while it fills the limit, a new rendezvous call is refused with `WouldBlock` (saying why),
/// eager calls go on, and once the server answers the quarantined call rendezvous works again.
fn the_quarantine_counts_against_the_memory_limit(engine: sim::Engine) {
    const BIG_ARGS: usize = (1 << 20) - 100;
    let rig = Rig::build(engine, |s| {
        s.server.rndv_memory_limit = 1 << 20;
        s.channel.msg_size = 1024;
        s.channel.memory_limit = 1 << 20;
        s.functions.register(LEN, |req| {
            let n = req.args().len() as u64;
            let _ = req.reply(&n.to_le_bytes());
        });
    });
    assert!(rig.channel.stats().registered_bytes < 1 << 19, "{:?}", rig.channel.stats());
    let log = Log::default();
    let args = vec![5u8; BIG_ARGS];
    rig.channel.call_callback(&on0(None, true), HOLD, &args, log.cb(0)).expect("start the holder");
    let mut held = rig.take_held(1);
    let short = Duration::from_millis(50);
    rig.channel.call_callback(&on0(Some(short), true), LEN, &args, log.cb(1)).expect("start the late one");
    rig.until("the server to queue the second call for memory", || rig.server.rndv_stats().waited == 1);
    rig.until_timers("the second call to time out", short, || {
        rig.channel.check_timeouts();
        log.completed() == 1
    });
    assert_eq!(rig.channel.rndv_quarantined(), BIG_ARGS as u64, "{engine:?}");
    match rig.channel.call_future(&on0(None, true), LEN, b"small, forced to rendezvous") {
        Err(RpcError::WouldBlock(why)) => {
            assert!(why.contains("timed-out") && why.contains("memory_limit"), "{engine:?}: {why}")
        }
        Err(e) => panic!("{engine:?}: {e:?}"),
        Ok(_) => panic!("{engine:?}: a rendezvous call past the memory limit was started"),
    }
    rig.echo(&on0(None, false), b"eager calls go on");
    held.remove(0).reply(b"held").expect("reply the holder");
    rig.until("the late call's answer to free the quarantine", || rig.channel.rndv_quarantined() == 0);
    let (rsp, _) = rig.call(&on0(None, true), LEN, b"forced again").expect("rendezvous works again");
    assert_eq!(rsp, 12u64.to_le_bytes(), "{engine:?}");
    queue_untouched(&rig);
    rig.drain();
    assert_eq!(rig.channel.rndv_in_use(), 0, "{engine:?}");
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

// ---- defect 4: one-sided operations above the device's max_msg_size ----

const MAX_MSG: u32 = 64 << 10;

/// A finished operation's outcome (driving the rig until it is done).
fn op_outcome(rig: &Rig, what: &str, mut f: OpFuture) -> Result<(), RpcError> {
    rig.until(what, || f.is_done());
    poll_once(&mut f).expect("a done OpFuture is ready")
}

/// The queue is untouched: READY, never recovered, no call or operation failed on it.
#[track_caller]
fn queue_untouched(rig: &Rig) {
    let s = rig.channel.stats();
    assert_eq!((s.ready_queues, s.recoveries), (rig.channel.queues(), 0), "{:?}: {s:?}", rig.engine);
    assert!(!rig.channel.is_closed());
}

/// Issue 30, defect 4. A one-sided READ or WRITE of more bytes than the device's
/// `max_msg_size` is refused at the call, naming the limit, before anything is posted: no queue
/// fails, nothing is recovered. An operation of exactly the limit works.
fn one_sided_above_max_msg_size_is_refused_at_the_call(engine: sim::Engine) {
    let rig = Rig::build(engine, |s| s.fabric.caps.max_msg_size = MAX_MSG);
    let max = MAX_MSG as usize;
    let rights = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
    let exposed = hal::Device::register(&rig.snic, 2 * max, rights).expect("register the server's region");
    let remote = exposed.remote();
    let local = Arc::new(hal::Device::register(&rig.cnic, 2 * max, Access::LOCAL_WRITE).expect("register"));
    let opts = OpOptions { queue: Some(0), ..OpOptions::default() };
    let one = [LocalRange::new(&local, 0, max + 1)];
    let two = [LocalRange::new(&local, 0, max), LocalRange::new(&local, max, 1)];
    for (what, ranges) in [("one range", &one[..]), ("two ranges", &two[..])] {
        for (op, r) in [
            ("WRITE", rig.channel.write_future(ranges, &remote, 0, &opts)),
            ("READ", rig.channel.read_future(ranges, &remote, 0, &opts)),
        ] {
            match r {
                Err(RpcError::InvalidArgument(t)) => assert!(
                    t.contains(op) && t.contains("max_msg_size") && t.contains(&MAX_MSG.to_string()),
                    "{engine:?}: {op} of {what}: {t}"
                ),
                Err(e) => panic!("{engine:?}: {op} of {what}: {e:?}"),
                Ok(_) => panic!("{engine:?}: a {op} above max_msg_size ({what}) was started"),
            }
        }
    }
    queue_untouched(&rig);
    let at_limit = [LocalRange::new(&local, 0, max)];
    let w = rig.channel.write_future(&at_limit, &remote, 0, &opts).expect("a WRITE at the limit");
    op_outcome(&rig, "the WRITE", w).expect("the WRITE at the limit");
    let r = rig.channel.read_future(&at_limit, &remote, 0, &opts).expect("a READ at the limit");
    op_outcome(&rig, "the READ", r).expect("the READ at the limit");
    queue_untouched(&rig);
    rig.echo(&CallOptions::default(), b"still serving");
    rig.drain();
}

// ---- defect 11: queues without READ resources ----

/// Issue 30, defect 11, the client's responder side. With
/// `queue_config.max_dest_rd_atomic = 0` the channel's queues serve no READ, so the server could
/// not READ rendezvous arguments: such a call is refused at the call, naming the field, and the
/// queue is untouched. What needs no READ of this side still works: eager calls, and a large
/// response the server WRITEs into the caller's buffer. (Connecting is allowed: a client that
/// never sends large arguments may have no responder resources.)
fn rendezvous_arguments_need_responder_resources(engine: sim::Engine) {
    rendezvous_refused(engine, |s| s.channel.queue_config.max_dest_rd_atomic = 0, &["max_dest_rd_atomic"]);
}

/// Issue 30, defect 11, the client's requester side. With `queue_config.max_rd_atomic = 0` no
/// READ may be outstanding (a READ would wait forever on hardware): a one-sided READ is refused
/// at the call, naming the field; WRITEs work.
fn reads_need_an_initiator_depth(engine: sim::Engine) {
    read_refused(engine, |s| s.channel.queue_config.max_rd_atomic = 0, &["max_rd_atomic"]);
}

/// Issue 30, defect 11, the server's side, as the client sees it. A server whose queues serve no
/// READ (`ServerConfig.queue_config.max_dest_rd_atomic = 0`) says so in its hello (control
/// version 6; a 0 used to read as "unknown"): a one-sided READ from its regions is refused at the
/// call, naming the server's field, instead of being NAKed by the server's NIC and failing the
/// queue. WRITEs, which need no READ resources, work.
fn reads_need_the_servers_responder_resources(engine: sim::Engine) {
    read_refused(engine, |s| s.server.queue_config.max_dest_rd_atomic = 0, &["server", "max_dest_rd_atomic"]);
}

/// Issue 30, defect 11: a server whose queues issue no READ
/// (`ServerConfig.queue_config.max_rd_atomic = 0`) could not fetch rendezvous arguments (its
/// scheduler let one READ through anyway, which stalls on hardware). It says so in its hello: a
/// call whose arguments would go by rendezvous is refused at the call, naming the server's
/// field; eager calls and large responses (the server WRITEs them) work.
fn rendezvous_arguments_need_the_servers_initiator_depth(engine: sim::Engine) {
    rendezvous_refused(engine, |s| s.server.queue_config.max_rd_atomic = 0, &["server", "max_rd_atomic"]);
}

/// A rig set up by `zero` (a READ depth at 0 on one side): a call whose arguments would go by
/// rendezvous (forced, or too large to be eager) is refused at the call with an error naming
/// every word of `names`, the queue untouched; eager calls and a large response (the server
/// WRITEs it) still work, and nothing reached the server's rendezvous path.
fn rendezvous_refused(engine: sim::Engine, zero: impl FnOnce(&mut Setup), names: &[&str]) {
    let rig = Rig::build(engine, |s| {
        zero(s);
        s.functions.register(MAKE, |req| {
            let n = req.max_response();
            let _ = req.reply(&(0..n).map(|i| i as u8).collect::<Vec<u8>>());
        });
    });
    let forced = CallOptions { rendezvous: true, ..Default::default() };
    for (what, args) in [("forced", vec![1u8; 100]), ("too large to be eager", vec![2u8; 256 << 10])] {
        match rig.channel.call_future(&forced, LEN, &args) {
            Err(RpcError::InvalidArgument(t)) => {
                assert!(names.iter().all(|n| t.contains(n)), "{engine:?}: {what}: {t}")
            }
            Err(e) => panic!("{engine:?}: {what}: {e:?}"),
            Ok(mut f) => {
                rig.until("the call", || f.is_done());
                panic!(
                    "{engine:?}: {what}: a rendezvous call that needs a READ at depth 0 was started: {:?}",
                    poll_once(&mut f)
                )
            }
        }
    }
    queue_untouched(&rig);
    rig.echo(&CallOptions::default(), b"eager");
    let big = CallOptions { max_response: 100_000, ..Default::default() };
    let (rsp, _) = rig.call(&big, MAKE, b"").expect("a large response written by the server");
    assert_eq!(rsp.len(), 100_000, "{engine:?}");
    assert!(rsp.iter().enumerate().all(|(i, &b)| b == i as u8), "{engine:?}");
    queue_untouched(&rig);
    assert_eq!(rig.server.rndv_stats().refused, 0, "{engine:?}: nothing reached the server");
    rig.drain();
}

/// A rig set up by `zero` (a READ depth at 0 on one side): a one-sided READ of the server's
/// region is refused at the call with an error naming every word of `names`; a WRITE, which
/// needs no READ resources, works; the queue is untouched and the channel still serves calls.
fn read_refused(engine: sim::Engine, zero: impl FnOnce(&mut Setup), names: &[&str]) {
    let rig = Rig::build(engine, zero);
    let rights = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
    let exposed = hal::Device::register(&rig.snic, 4096, rights).expect("register the server's region");
    let remote = exposed.remote();
    let local = Arc::new(hal::Device::register(&rig.cnic, 4096, Access::LOCAL_WRITE).expect("register"));
    let range = [LocalRange::whole(&local)];
    match rig.channel.read_future(&range, &remote, 0, &OpOptions::default()) {
        Err(RpcError::InvalidArgument(t)) => assert!(names.iter().all(|n| t.contains(n)), "{engine:?}: {t}"),
        Err(e) => panic!("{engine:?}: {e:?}"),
        Ok(f) => panic!(
            "{engine:?}: a READ that needs a READ depth of 0 was started: {:?}",
            op_outcome(&rig, "the READ", f)
        ),
    }
    let w = rig.channel.write_future(&range, &remote, 0, &OpOptions::default()).expect("a WRITE");
    op_outcome(&rig, "the WRITE", w).expect("the WRITE");
    queue_untouched(&rig);
    rig.echo(&CallOptions::default(), b"still serving");
    rig.drain();
}

// ---- defect 6: a slow recovery exchange ----

/// A TCP proxy between a channel and its server that forwards every control frame at once,
/// except the server's first queue reset answer (type 5), which it holds until the client has
/// sent a second queue reset (type 4): a server slower than the client's recovery timeout.
struct SlowAnswer {
    addr: std::net::SocketAddr,
    resets: Arc<AtomicUsize>,
}

fn read_frame(s: &mut TcpStream) -> Option<Vec<u8>> {
    let mut frame = vec![0u8; 12];
    s.read_exact(&mut frame).ok()?;
    let body = u32::from_le_bytes(frame[8..12].try_into().unwrap()) as usize;
    frame.resize(12 + body, 0);
    s.read_exact(&mut frame[12..]).ok()?;
    Some(frame)
}

impl SlowAnswer {
    fn new(server: std::net::SocketAddr) -> SlowAnswer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let addr = listener.local_addr().unwrap();
        let resets = Arc::new(AtomicUsize::new(0));
        let r = resets.clone();
        std::thread::spawn(move || {
            let Ok((client, _)) = listener.accept() else { return };
            let upstream = TcpStream::connect(server).expect("connect to the server");
            let (mut c_in, mut c_out) = (client.try_clone().unwrap(), client);
            let (mut s_in, mut s_out) = (upstream.try_clone().unwrap(), upstream);
            let r2 = r.clone();
            let up = std::thread::spawn(move || {
                while let Some(f) = read_frame(&mut c_in) {
                    if f[4] == 4 {
                        r2.fetch_add(1, Ordering::SeqCst);
                    }
                    if s_out.write_all(&f).is_err() {
                        break;
                    }
                }
                let _ = s_out.shutdown(Shutdown::Both);
            });
            let mut held_first = false;
            while let Some(f) = read_frame(&mut s_in) {
                if f[4] == 5 && !held_first {
                    held_first = true;
                    let start = Instant::now();
                    // Bounded: a client that never retries (the defect) ends the test below.
                    while r.load(Ordering::SeqCst) < 2 && start.elapsed() < WAIT_LIMIT {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
                if c_out.write_all(&f).is_err() {
                    break;
                }
            }
            let _ = c_out.shutdown(Shutdown::Both);
            let _ = up.join();
        });
        SlowAnswer { addr, resets }
    }
}

/// Issue 30, defect 6. The server answers a queue reset after the client's recovery timeout:
/// that attempt fails and is retried within the budget (skipping the late answer), instead of
/// closing the channel as RecoveryExhausted at once.
fn a_slow_recovery_exchange_is_retried_within_the_budget(engine: sim::Engine) {
    let rig = Rig::new(engine);
    let proxy = SlowAnswer::new(rig.server.local_addr());
    let policy =
        Recovery { attempts: 3, window: Duration::from_secs(3600), timeout: Duration::from_millis(300) };
    let config = ChannelConfig { recovery: Some(policy), ..ChannelConfig::new(SERVER_NAME) };
    let channel = Channel::connect(&rig.cnic, proxy.addr, config).expect("connect through the proxy");
    let mut rsp = Vec::new();
    channel.call(ECHO, b"before", &mut rsp).expect("echo before");
    channel.fail_queue(0).expect("fail queue 0");
    rig.until("the queue to be recovered, or the channel to close", || {
        channel.poll();
        channel.is_closed() || (channel.stats().recoveries == 1 && channel.stats().ready_queues == 1)
    });
    assert!(
        !channel.is_closed(),
        "{engine:?}: closed as {:?} after one slow exchange",
        channel.close_reason()
    );
    assert_eq!(
        proxy.resets.load(Ordering::SeqCst),
        2,
        "{engine:?}: one attempt timed out, the next one worked"
    );
    channel.call(ECHO, b"after", &mut rsp).expect("echo after");
    assert_eq!(rsp, b"after");
    // The budget still has its third attempt: one more failure is recovered too.
    channel.fail_queue(0).expect("fail queue 0 again");
    rig.until("the second recovery", || {
        channel.poll();
        channel.is_closed() || channel.stats().recoveries == 2
    });
    assert!(!channel.is_closed(), "{engine:?}: {:?}", channel.close_reason());
    assert_eq!(channel.stats().protocol_errors, 0);
}

// ---- a partial recovery answer ----

/// A TCP proxy between a channel and its server that forwards every control frame, except that
/// of the server's first queue reset answer it sends only the first half, and nothing after:
/// a server that stalls in the middle of an answer. Counts the halves sent in `halves`.
fn half_answer_proxy(server: std::net::SocketAddr, halves: Arc<AtomicUsize>) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let Ok((client, _)) = listener.accept() else { return };
        let upstream = TcpStream::connect(server).expect("connect to the server");
        let (mut c_in, mut c_out) = (client.try_clone().unwrap(), client);
        let (mut s_in, mut s_out) = (upstream.try_clone().unwrap(), upstream);
        let up = std::thread::spawn(move || {
            while let Some(f) = read_frame(&mut c_in) {
                if s_out.write_all(&f).is_err() {
                    break;
                }
            }
            let _ = s_out.shutdown(Shutdown::Both);
        });
        let mut stalled = false;
        // Ends when the channel closes (the upstream side then shuts the server's stream).
        while let Some(f) = read_frame(&mut s_in) {
            if stalled {
                continue;
            }
            if f[4] == 5 {
                stalled = true;
                if c_out.write_all(&f[..f.len() / 2]).is_err() {
                    break;
                }
                halves.fetch_add(1, Ordering::SeqCst);
            } else if c_out.write_all(&f).is_err() {
                break;
            }
        }
        let _ = c_out.shutdown(Shutdown::Both);
        let _ = up.join();
    });
    addr
}

/// Sixteen channels (as many as the process's control loop has aside threads) whose server
/// sends half of a queue reset answer and stops: they wait for the rest (until their recovery
/// timeout, 25 s here) without holding a thread another channel needs, so a bystander
/// channel's queue recovery (and the server's side of it) is done at once. Before the fix each
/// of them read its answer with a blocking read on an aside thread, and the bystander's
/// recovery waited for their timeouts.
fn a_partial_recovery_answer_holds_no_shared_thread(engine: sim::Engine) {
    const STALLED: usize = 16;
    let rig = Rig::new(engine);
    let policy =
        Recovery { attempts: 3, window: Duration::from_secs(3600), timeout: Duration::from_secs(25) };
    let halves = Arc::new(AtomicUsize::new(0));
    let stalled: Vec<_> = (0..STALLED)
        .map(|_| {
            let proxy = half_answer_proxy(rig.server.local_addr(), halves.clone());
            let config = ChannelConfig { recovery: Some(policy), ..ChannelConfig::new(SERVER_NAME) };
            let channel = Channel::connect(&rig.cnic, proxy, config).expect("connect through the proxy");
            channel.fail_queue(0).expect("fail queue 0");
            channel
        })
        .collect();
    rig.until("half answers on half of the stalled channels", || {
        halves.load(Ordering::SeqCst) >= STALLED / 2
    });
    let start = Instant::now();
    rig.channel.fail_queue(0).expect("fail the bystander's queue");
    rig.until("the bystander's recovery", || {
        let s = rig.channel.stats();
        rig.channel.is_closed() || (s.recoveries == 1 && s.ready_queues == 1)
    });
    let took = start.elapsed();
    assert!(!rig.channel.is_closed(), "{engine:?}: {:?}", rig.channel.close_reason());
    assert!(took < Duration::from_secs(10), "{engine:?}: the bystander's recovery took {took:?}");
    rig.echo(&CallOptions::default(), b"after");
    for (i, c) in stalled.iter().enumerate() {
        assert!(!c.is_closed(), "{engine:?}: stalled channel {i} closed: {:?}", c.close_reason());
        assert_eq!(c.stats().recoveries, 0);
    }
}

/// Recovery runs on real time and real threads: the real engines only.
mod recovery {
    use super::*;
    common::per_engine!(
        a_slow_recovery_exchange_is_retried_within_the_budget,
        a_partial_recovery_answer_holds_no_shared_thread,
    );
}

common::per_engine!(
    stepped: a_timed_out_rendezvous_call_costs_no_bystander,
    a_failed_queue_frees_its_quarantine,
    the_quarantine_counts_against_the_memory_limit,
    one_sided_above_max_msg_size_is_refused_at_the_call,
    rendezvous_arguments_need_responder_resources,
    reads_need_an_initiator_depth,
    reads_need_the_servers_responder_resources,
    rendezvous_arguments_need_the_servers_initiator_depth,
);
