//! Queue recovery: a queue forced to ERROR (`Channel::fail_queue`, or a remote access error of a
//! one-sided WRITE) fails its outstanding calls once with the queue error, is reset and
//! re-exchanged with the server over the control stream, and serves calls again; past the retry
//! budget the channel closes (`RecoveryExhausted`).
//!
//! Every wait is bounded (the shared rig's `WAIT_LIMIT`) and ends on observable state; no timing
//! assertions.

use bypass::sim::{Engine, Fabric, SimNic};
use bypass::*;
use std::ops::Deref;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

mod common;
use common::ids::{ECHO, HOLD, REGION};
use common::rig::Req;

const NAME: &str = "recover";
const REGION_LEN: usize = 4096;

type Outcomes = Arc<Mutex<Vec<Option<Result<Vec<u8>, RpcError>>>>>;

/// The shared rig with a recovery policy, a region for one-sided I/O (REGION), the requests its
/// HOLD handler kept and the channel's break reasons.
struct Rig {
    // Dropped first: the held requests, while their server is still there.
    held: Mutex<Vec<Req>>,
    rig: common::rig::Rig,
    breaks: Arc<Mutex<Vec<CloseReason>>>,
    _exposed: Arc<<SimNic as hal::Device>::Region>,
}

impl Deref for Rig {
    type Target = common::rig::Rig;
    fn deref(&self) -> &common::rig::Rig {
        &self.rig
    }
}

impl Rig {
    fn new(engine: Engine, queues: usize, recovery: Recovery) -> Rig {
        // The region is registered on the rig's server NIC, which exists once the rig is built;
        // REGION is called after that.
        let exposed: Arc<OnceLock<Arc<<SimNic as hal::Device>::Region>>> = Arc::default();
        let e = exposed.clone();
        let rig = common::rig::Rig::build(engine, |s| {
            s.channel.queues = queues;
            s.channel.recovery = Some(recovery);
            s.functions.register(REGION, move |req| {
                let _ = req.reply(&e.get().expect("the region is registered").remote().encode());
            });
        });
        let region = Arc::new(
            hal::Device::register(&rig.snic, REGION_LEN, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
                .expect("register"),
        );
        assert!(exposed.set(region.clone()).is_ok());
        let breaks: Arc<Mutex<Vec<CloseReason>>> = Arc::default();
        let b = breaks.clone();
        rig.channel.set_break_callback(move |r| b.lock().unwrap().push(r));
        Rig { rig, held: Mutex::default(), breaks, _exposed: region }
    }

    fn echo(&self, opts: &CallOptions, what: &[u8]) {
        let mut rsp = Vec::new();
        self.channel.call_with(opts, ECHO, what, &mut rsp).unwrap_or_else(|e| panic!("echo {what:?}: {e}"));
        assert_eq!(rsp, what);
    }

    /// Starts `n` HOLD calls on `queue`; returns where their outcomes land.
    fn hold(&self, queue: usize, n: usize) -> Outcomes {
        let outcomes: Outcomes = Arc::new(Mutex::new((0..n).map(|_| None).collect()));
        for i in 0..n {
            let o = outcomes.clone();
            let opts = CallOptions { queue: Some(queue), timeout: None, ..Default::default() };
            self.channel
                .call_callback(&opts, HOLD, &[i as u8], move |r| {
                    let slot = &mut o.lock().unwrap()[i];
                    assert!(slot.is_none(), "call {i} completed twice");
                    *slot = Some(r.map(<[u8]>::to_vec));
                })
                .expect("start");
        }
        let held = self.take_held(n);
        self.held.lock().unwrap().extend(held);
        outcomes
    }

    fn recovered(&self, n: u64) {
        self.until(&format!("recovery {n}"), || {
            // A channel that closed will not recover: say why at once rather than at the limit.
            assert!(
                !self.channel.is_closed(),
                "closed while waiting for recovery {n}: {:?}",
                self.channel.close_reason()
            );
            let s = self.channel.stats();
            s.recoveries >= n && s.ready_queues == self.channel.queues()
        });
    }
}

fn all_failed_once(outcomes: &Outcomes, ok: impl Fn(&RpcError) -> bool) -> bool {
    outcomes.lock().unwrap().iter().all(|o| matches!(o, Some(Err(e)) if ok(e)))
}

/// fail_queue on the only queue with calls outstanding: they fail once with the queue error,
/// the queue comes back, new calls (named or round-robin) succeed, late replies to the old calls
/// change nothing, nothing leaks, no break callback.
fn failed_queue_comes_back(engine: Engine) {
    let rig = Rig::new(engine, 1, Recovery::default());
    rig.echo(&CallOptions::default(), b"before");
    let outcomes = rig.hold(0, 3);
    rig.channel.fail_queue(0).expect("fail queue 0");
    rig.until("the held calls to fail", || all_failed_once(&outcomes, |e| matches!(e, RpcError::Queue(_))));
    rig.recovered(1);
    assert!(!rig.channel.is_closed(), "{engine:?}");
    for i in 0..10u8 {
        rig.echo(&CallOptions::default(), &[b'a', i]);
        rig.echo(&CallOptions { queue: Some(0), ..Default::default() }, &[b'q', i]);
    }
    // The server's handlers still hold the old life's requests: their replies go nowhere.
    for r in rig.held.lock().unwrap().drain(..) {
        assert!(r.reply(b"zombie").is_err(), "{engine:?}: a reply into the queue's old life");
    }
    rig.echo(&CallOptions::default(), b"after the zombies");
    assert!(all_failed_once(&outcomes, |e| matches!(e, RpcError::Queue(_))), "{engine:?}: still once each");
    rig.until("nothing in use", || {
        let s = rig.channel.stats();
        s.tx_in_use == 0 && s.table_in_use == 0 && rig.server.tx_in_use() == 0
    });
    assert_eq!(rig.channel.stats().credits, u64::from(rig.channel.window()), "{engine:?}: credits refilled");
    assert!(rig.breaks.lock().unwrap().is_empty());
    assert_eq!(rig.server.connections(), 1);
}

/// Two queues: queue 1 fails and recovers while queue 0 keeps serving; then both work.
fn one_of_two_queues_comes_back(engine: Engine) {
    let rig = Rig::new(engine, 2, Recovery::default());
    let outcomes = rig.hold(1, 2);
    rig.channel.fail_queue(1).expect("fail queue 1");
    rig.until("the held calls to fail", || all_failed_once(&outcomes, |e| matches!(e, RpcError::Queue(_))));
    rig.echo(&CallOptions { queue: Some(0), ..Default::default() }, b"queue 0 meanwhile");
    rig.recovered(1);
    for q in [0, 1, 0, 1] {
        rig.echo(&CallOptions { queue: Some(q), ..Default::default() }, &[q as u8]);
    }
    drop(rig.held.lock().unwrap().drain(..));
    assert!(!rig.channel.is_closed());
}

/// A one-sided WRITE out of the peer's region fails with RemoteAccess and fails its queue (RC);
/// the queue is recovered and calls and operations go on on it.
fn remote_access_error_is_recovered(engine: Engine) {
    let rig = Rig::new(engine, 1, Recovery::default());
    let mut rsp = Vec::new();
    rig.channel.call(REGION, b"", &mut rsp).expect("region");
    let remote = RemoteRegion::decode(&rsp).expect("descriptor");
    let mut src = hal::Device::register(&rig.cnic, 16, Access::LOCAL_WRITE).expect("register");
    src.write(0, &[9; 16]).expect("fill");
    let src = Arc::new(src);
    let r =
        rig.channel.write(&[LocalRange::whole(&src)], &remote, REGION_LEN as u64 - 8, &OpOptions::default());
    assert!(matches!(r, Err(RpcError::RemoteAccess(_))), "{engine:?}: {r:?}");
    rig.recovered(1);
    rig.echo(&CallOptions::default(), b"after the remote error");
    rig.channel.write(&[LocalRange::whole(&src)], &remote, 0, &OpOptions::default()).expect("a good write");
    assert!(!rig.channel.is_closed());
    assert!(rig.breaks.lock().unwrap().is_empty());
}

/// The budget: two recoveries within the window work, the third failure closes the channel
/// with RecoveryExhausted; its outstanding calls failed with the queue error first, the break
/// callback runs once, later calls get Closed, and the server sees the connection end.
fn budget_exhaustion_closes_the_channel(engine: Engine) {
    let policy = Recovery { attempts: 2, window: Duration::from_secs(3600), ..Recovery::default() };
    let rig = Rig::new(engine, 1, policy);
    for n in 1..=2 {
        rig.channel.fail_queue(0).expect("fail");
        rig.recovered(n);
        rig.echo(&CallOptions::default(), &[n as u8]);
    }
    let outcomes = rig.hold(0, 2);
    rig.channel.fail_queue(0).expect("fail a third time");
    rig.until("the channel to close", || rig.channel.is_closed());
    rig.until("the break callback", || !rig.breaks.lock().unwrap().is_empty());
    assert_eq!(*rig.breaks.lock().unwrap(), [CloseReason::RecoveryExhausted], "{engine:?}");
    assert_eq!(rig.channel.close_reason(), Some(CloseReason::RecoveryExhausted));
    assert!(all_failed_once(&outcomes, |e| matches!(e, RpcError::Queue(_))), "{engine:?}");
    let mut rsp = Vec::new();
    assert!(matches!(rig.channel.call(ECHO, b"x", &mut rsp), Err(RpcError::Closed)));
    drop(rig.held.lock().unwrap().drain(..));
    rig.until("the server to drop the connection", || rig.server.connections() == 0);
    assert_eq!(rig.channel.stats().recoveries, 2);
}

/// A TCP proxy between a channel and its server that forwards every control frame at once and
/// counts the client's queue resets (frame type 4) it passed on.
fn counting_proxy(server: std::net::SocketAddr, resets: Arc<AtomicUsize>) -> std::net::SocketAddr {
    use std::io::{Read, Write};
    use std::net::{Shutdown, TcpListener, TcpStream};
    fn read_frame(s: &mut TcpStream) -> Option<Vec<u8>> {
        let mut frame = vec![0u8; 12];
        s.read_exact(&mut frame).ok()?;
        let body = u32::from_le_bytes(frame[8..12].try_into().unwrap()) as usize;
        frame.resize(12 + body, 0);
        s.read_exact(&mut frame[12..]).ok()?;
        Some(frame)
    }
    fn pipe(mut from: TcpStream, mut to: TcpStream, resets: Option<Arc<AtomicUsize>>) {
        while let Some(f) = read_frame(&mut from) {
            if to.write_all(&f).is_err() {
                break;
            }
            if let (Some(r), 4) = (&resets, f[4]) {
                r.fetch_add(1, Ordering::SeqCst);
            }
        }
        let _ = to.shutdown(Shutdown::Both);
    }
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let Ok((client, _)) = listener.accept() else { return };
        let upstream = TcpStream::connect(server).expect("connect to the server");
        let (c2, u2) = (client.try_clone().unwrap(), upstream.try_clone().unwrap());
        let up = std::thread::spawn(move || pipe(client, upstream, Some(resets)));
        pipe(u2, c2, None);
        let _ = up.join();
    });
    addr
}

/// When the old life's flushes are handled in [`a_stale_flush_is_no_new_failure`].
#[derive(Debug, Clone, Copy)]
enum Late {
    /// While the queue is reset and its exchange with the server is under way.
    DuringTheExchange,
    /// After the queue was connected again.
    AfterTheRecovery,
}

/// A flushed completion of a queue's earlier life, handled late, is not a new failure. Stepped,
/// so the order is exact: a receive CQ holds a response and then the flushes of a queue that a
/// remote access error failed; the test thread polls one batch of them and, inside the
/// response's callback, waits while another thread has the queue recovered, up to the reset
/// being sent (`DuringTheExchange`) or to the end (`AfterTheRecovery`). The rest of that batch
/// (flushes of the old life) must then leave the queue alone. Before the fix they moved the
/// reset queue to ERROR, so that its connect failed ("connect needs RESET"), or failed the new
/// life; either spent the budget and closed the channel. This is the ASan flake of
/// `budget_exhaustion_closes_the_channel` (a slow poller did the same, during the exchange).
fn a_stale_flush_is_no_new_failure(late: Late) {
    use std::sync::mpsc;
    let policy = Recovery { attempts: 1, window: Duration::from_secs(3600), ..Recovery::default() };
    let mut rig = Rig::new(common::rig::STEPPED, 1, policy);
    let resets = Arc::new(AtomicUsize::new(0));
    let proxy = counting_proxy(rig.server.local_addr(), resets.clone());
    let config = ChannelConfig {
        recovery: Some(policy),
        keepalive: None,
        ..ChannelConfig::new(common::rig::SERVER_NAME)
    };
    let ch = Channel::connect(&rig.cnic, proxy, config).expect("connect through the proxy");
    let rsp = rig.call_on(&ch, &CallOptions::default(), REGION, b"").expect("region");
    let remote = RemoteRegion::decode(&rsp).expect("descriptor");
    let mut src = hal::Device::register(&rig.cnic, 16, Access::LOCAL_WRITE).expect("register");
    src.write(0, &[9; 16]).expect("fill");
    let src = Arc::new(src);
    // From here on only this test's own polls take the channels' completions.
    rig.rig.poll_channel = false;

    let (entered_tx, entered) = mpsc::channel::<Result<Vec<u8>, RpcError>>();
    let (go_tx, go) = mpsc::channel::<()>();
    ch.call_callback(&CallOptions::default(), ECHO, b"first", move |r| {
        entered_tx.send(r.map(<[u8]>::to_vec)).unwrap();
        go.recv_timeout(common::rig::WAIT_LIMIT).expect("the queue's recovery to get far enough");
    })
    .expect("start");
    rig.until("the echo to be served", || rig.hits() == 1);
    rig.fabric.run_until_idle(); // the response is in the receive CQ, unpolled
    let mut bad = ch
        .write_future(&[LocalRange::whole(&src)], &remote, REGION_LEN as u64 - 8, &OpOptions::default())
        .expect("start the bad write");
    // The server's NIC refuses it: the client's queue goes to ERROR and its receives are flushed
    // into the receive CQ behind the response.
    rig.fabric.run_until_idle();

    let (rig_ref, ch_ref, resets_ref) = (&rig, &ch, &resets);
    let outcome = std::thread::scope(|s| {
        let recoverer = s.spawn(move || {
            let (rig, ch, resets) = (rig_ref, ch_ref, resets_ref);
            let outcome = entered.recv_timeout(common::rig::WAIT_LIMIT).expect("the callback to run");
            // The write's error completion fails the queue; the control loop recovers it.
            ch.poll_send_completions();
            match late {
                Late::DuringTheExchange => {
                    // The reset is sent after the queue was reset; the server is not driven,
                    // so it cannot answer yet.
                    let start = std::time::Instant::now();
                    while resets.load(Ordering::SeqCst) == 0 {
                        assert!(start.elapsed() < common::rig::WAIT_LIMIT, "the queue reset was never sent");
                        rig.fabric.run_until_idle();
                        ch.poll_send_completions();
                        std::thread::yield_now();
                    }
                }
                Late::AfterTheRecovery => rig.until("recovery 1", || {
                    ch.poll_send_completions();
                    let s = ch.stats();
                    s.recoveries >= 1 && s.ready_queues == 1
                }),
            }
            go_tx.send(()).unwrap();
            outcome
        });
        // One batch: the response (its callback waits), then old flushes.
        assert!(ch.poll_responses() > 1, "the response and flushes in one batch");
        recoverer.join().unwrap()
    });
    rig.until("the recovery to end", || {
        ch.poll_send_completions();
        let s = ch.stats();
        ch.is_closed() || (s.recoveries >= 1 && s.ready_queues == 1)
    });
    let s = ch.stats();
    assert_eq!(
        (s.ready_queues, s.recoveries, ch.close_reason()),
        (1, 1, None),
        "{late:?}: an old life's flush failed the recovered queue"
    );
    assert_eq!(outcome.expect("the echo"), b"first");
    rig.until("the bad write to end", || {
        ch.poll();
        bad.is_done()
    });
    assert!(matches!(common::helpers::poll_once(&mut bad), Some(Err(RpcError::RemoteAccess(_)))));
    assert_eq!(rig.call_on(&ch, &CallOptions::default(), ECHO, b"after").expect("echo after"), b"after");
    for _ in 0..8 {
        rig.pump();
        ch.poll();
    }
    assert!(!ch.is_closed(), "{late:?}: {:?}", ch.close_reason());
    assert_eq!(ch.stats().recoveries, 1);
    assert_eq!(resets.load(Ordering::SeqCst), 1, "{late:?}: one queue reset");
}

#[test]
fn a_stale_flush_during_the_exchange_is_no_new_failure() {
    a_stale_flush_is_no_new_failure(Late::DuringTheExchange);
}

#[test]
fn a_stale_flush_after_the_recovery_is_no_new_failure() {
    a_stale_flush_is_no_new_failure(Late::AfterTheRecovery);
}

#[test]
fn recovery_config_is_validated_by_name() {
    let fabric = Fabric::new(Engine::Inline);
    let cnic = fabric.add_nic();
    let bad = ChannelConfig {
        recovery: Some(Recovery { attempts: 0, ..Recovery::default() }),
        ..ChannelConfig::new(NAME)
    };
    match Channel::connect(&cnic, "127.0.0.1:1", bad) {
        Err(RpcError::InvalidArgument(t)) => assert!(t.starts_with("ChannelConfig.recovery.attempts"), "{t}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(ChannelConfig::default().recovery, Some(Recovery::default()));
}

common::per_engine!(
    failed_queue_comes_back,
    one_of_two_queues_comes_back,
    remote_access_error_is_recovered,
    budget_exhaustion_closes_the_channel,
);
