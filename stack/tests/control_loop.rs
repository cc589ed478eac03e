//! What the process's control loop (`bypass-ctl`, one thread watching every connection) does
//! with application code and with replies in hand when a connection ends:
//!
//! - no completion or break callback runs on it, so one that blocks stalls no other connection;
//! - a callback call a keepalive look finishes on an idle channel has its callback run aside;
//! - a close caused by the server going away does not fail a call whose reply another thread
//!   already took from the completion queue and is about to deliver.
//!
//! Every wait is bounded and ends on observable state; nothing is timed.

use bypass::sim::{Engine, Fabric, SimNic};
use bypass::*;
use std::ops::Deref;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

mod common;
use common::helpers::{until, WAIT_LIMIT};
use common::ids::{ECHO, HOLD};
use common::served::Served;

const NAME: &str = "control-loop";
/// The loop's own thread name.
const LOOP_THREAD: &str = "bypass-ctl";

/// A callback's outcome and the name of the thread it ran on.
type Seen = Arc<Mutex<Vec<(Result<Vec<u8>, RpcError>, String)>>>;

fn thread_name() -> String {
    std::thread::current().name().unwrap_or("<unnamed>").to_string()
}

/// The served fabric (no keepalive on the server: these tests end connections on purpose).
struct Rig(Served);

impl Deref for Rig {
    type Target = Served;
    fn deref(&self) -> &Served {
        &self.0
    }
}

impl Rig {
    fn new(engine: Engine) -> Rig {
        let config = ServerConfig { keepalive: None, ..ServerConfig::new(NAME) };
        Rig(Served::build(Fabric::new(engine), config, |_| Ok(()), |_, events| events))
    }

    fn connect(&self, keepalive: Option<Keepalive>) -> Channel<SimNic> {
        self.0.connect(ChannelConfig { keepalive, ..ChannelConfig::new(NAME) }).expect("connect")
    }

    /// The server's side of `channel`.
    fn conn(&self, channel: &Channel<SimNic>) -> Connection<SimNic> {
        self.0.conn(channel.channel_id())
    }

    fn drive(&self) {
        self.fabric.progress();
    }

    /// Stepped engine: runs every ready unit of device work.
    fn step_all(&self) {
        self.fabric.run_until_idle();
    }
}

/// Records every callback outcome with its thread; the first one blocks until `gate` is
/// released (or dropped: a failing test never leaves it blocked).
fn recording_callback(
    seen: &Seen,
    gate: Option<Arc<Mutex<mpsc::Receiver<()>>>>,
) -> impl FnOnce(Result<&[u8], RpcError>) + Send + 'static {
    let seen = seen.clone();
    move |r| {
        seen.lock().unwrap().push((r.map(<[u8]>::to_vec), thread_name()));
        if let Some(gate) = gate {
            let _ = gate.lock().unwrap().recv_timeout(WAIT_LIMIT);
        }
    }
}

/// Break callbacks seen: the reason and the thread each ran on.
fn watch_breaks(channel: &Channel<SimNic>) -> Arc<Mutex<Vec<(CloseReason, String)>>> {
    let breaks: Arc<Mutex<Vec<(CloseReason, String)>>> = Arc::default();
    let b = breaks.clone();
    channel.set_break_callback(move |r| b.lock().unwrap().push((r, thread_name())));
    breaks
}

/// The server closes two connections, each with a callback call outstanding. The first
/// channel's callback blocks; the second channel still closes and its callbacks still run.
/// Neither channel's callbacks run on the loop.
fn a_blocking_callback_of_a_closed_channel_stalls_no_other_connection(engine: Engine) {
    let rig = Rig::new(engine);
    let (a, b) = (rig.connect(None), rig.connect(None));
    let (a_breaks, b_breaks) = (watch_breaks(&a), watch_breaks(&b));
    let (a_seen, b_seen) = (Seen::default(), Seen::default());
    let (release, gate) = mpsc::channel();
    let opts = CallOptions { timeout: None, ..Default::default() };
    a.call_callback(&opts, HOLD, b"a", recording_callback(&a_seen, Some(Arc::new(Mutex::new(gate)))))
        .expect("start a");
    b.call_callback(&opts, HOLD, b"b", recording_callback(&b_seen, None)).expect("start b");
    until("both requests at the server", || rig.drive(), || rig.held() == 2);

    rig.conn(&a).close();
    until("a's callback", || rig.drive(), || !a_seen.lock().unwrap().is_empty());
    {
        let seen = a_seen.lock().unwrap();
        assert!(matches!(seen[0].0, Err(RpcError::Closed)), "{engine:?}: {:?}", seen[0].0);
        assert_ne!(
            seen[0].1, LOOP_THREAD,
            "{engine:?}: a completion callback ran on the shared control loop"
        );
    }
    // a's callback is blocked now. b's close must not wait for it.
    rig.conn(&b).close();
    until(
        "b's break callback while a's callback blocks",
        || rig.drive(),
        || !b_breaks.lock().unwrap().is_empty(),
    );
    assert!(b.is_closed());
    {
        let seen = b_seen.lock().unwrap();
        assert!(matches!(seen[0].0, Err(RpcError::Closed)), "{engine:?}");
        assert_ne!(seen[0].1, LOOP_THREAD, "{engine:?}");
        let breaks = b_breaks.lock().unwrap();
        assert_eq!(breaks[0].0, CloseReason::PeerClosed);
        assert_ne!(breaks[0].1, LOOP_THREAD, "{engine:?}: a break callback ran on the shared control loop");
    }
    assert!(a_breaks.lock().unwrap().is_empty(), "a's break callback runs after its calls' callbacks");
    release.send(()).expect("release a's callback");
    until("a's break callback", || rig.drive(), || !a_breaks.lock().unwrap().is_empty());
    let breaks = a_breaks.lock().unwrap();
    assert_eq!(breaks.len(), 1);
    assert_ne!(breaks[0].1, LOOP_THREAD, "{engine:?}");
    assert_eq!(a.stats().tx_in_use, 0, "{engine:?}: nothing leaked");
}

/// Nobody polls an idle channel: its keepalive look collects the reply of a callback call, and
/// that callback runs aside, not on the loop.
fn a_reply_a_keepalive_look_collects_runs_its_callback_aside(engine: Engine) {
    let rig = Rig::new(engine);
    let channel = rig.connect(Some(Keepalive { interval: Duration::from_millis(20), misses: 100 }));
    let seen = Seen::default();
    let opts = CallOptions { timeout: None, ..Default::default() };
    channel.call_callback(&opts, ECHO, b"collected", recording_callback(&seen, None)).expect("start");
    // No poll of the channel here: only the loop's look can deliver the reply.
    until("the callback", || {}, || !seen.lock().unwrap().is_empty());
    let seen = seen.lock().unwrap();
    assert_eq!(seen[0].0.as_deref().ok(), Some(&b"collected"[..]), "{engine:?}");
    assert_ne!(seen[0].1, LOOP_THREAD, "{engine:?}: a completion callback ran on the shared control loop");
    assert!(!channel.is_closed());
}

/// Two replies reach the client's completion queue together; a thread of the application
/// takes both in one poll and is still in the first one's callback when the server closes the
/// connection. The close waits for that thread, so the second call ends with its reply, not
/// with the close's error. The Stepped engine puts both replies in the queue before the poll.
#[test]
fn a_close_does_not_fail_a_call_whose_reply_another_thread_holds() {
    let rig = Rig::new(Engine::Stepped { seed: 0xC105E });
    let channel = Arc::new(rig.connect(None));
    let seen = Seen::default();
    let (release, gate) = mpsc::channel();
    let gate = Arc::new(Mutex::new(gate));
    let first = Arc::new(AtomicBool::new(true));
    let opts = CallOptions { timeout: None, ..Default::default() };
    for args in [&b"one"[..], b"two"] {
        let (seen, gate, first) = (seen.clone(), gate.clone(), first.clone());
        channel
            .call_callback(&opts, HOLD, args, move |r| {
                seen.lock().unwrap().push((r.map(<[u8]>::to_vec), thread_name()));
                if first.swap(false, Ordering::SeqCst) {
                    let _ = gate.lock().unwrap().recv_timeout(WAIT_LIMIT);
                }
            })
            .expect("start");
    }
    until("both requests at the server", || rig.step_all(), || rig.held() == 2);
    for req in rig.held.lock().unwrap().drain(..) {
        let args = req.args().to_vec();
        req.reply(&args).expect("reply");
    }
    rig.step_all();

    // The application's poller: one poll takes both replies and blocks in the first callback.
    let ch = channel.clone();
    let poller = std::thread::spawn(move || ch.poll());
    until("the first callback", || {}, || !seen.lock().unwrap().is_empty());
    rig.conn(&channel).close();
    until(
        "the close to wait for the poller (or, wrongly, to fail the second call)",
        || rig.step_all(),
        || channel.stats().close_waits > 0 || seen.lock().unwrap().len() > 1,
    );
    // The close is under way (it waits for the poller): the channel says closed, and why.
    if channel.stats().close_waits > 0 {
        assert!(channel.is_closed());
        assert_eq!(channel.close_reason(), Some(CloseReason::PeerClosed), "a closed channel tells why");
    }
    release.send(()).expect("release the first callback");
    let polled = poller.join().expect("the poller");
    assert!(polled >= 2, "one poll took both replies: {polled}");
    until("the channel to close", || rig.step_all(), || channel.is_closed());
    let seen = seen.lock().unwrap();
    let got: Vec<_> = seen.iter().map(|(r, _)| r.as_deref().map_err(|e| e.to_string())).collect();
    assert_eq!(got, vec![Ok(&b"one"[..]), Ok(&b"two"[..])], "both calls end with their replies");
    assert!(channel.stats().close_waits > 0, "the close waited for the poller");
}

common::per_engine!(
    a_blocking_callback_of_a_closed_channel_stalls_no_other_connection,
    a_reply_a_keepalive_look_collects_runs_its_callback_aside,
);
