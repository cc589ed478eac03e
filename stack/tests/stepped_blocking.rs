//! Blocking calls on the Stepped engine (issue 13): the device moves only when the test steps it
//! and deadlines run on its virtual clock, so a blocking call — even with a deadline, even with a
//! server whose workers run — would wait forever. It fails at once with an error that says what
//! to use instead; the non-blocking forms still work when the test drives the fabric.
//!
//! Each blocking call runs on a helper thread and is waited for with a bounded `recv_timeout`, so
//! a regression (a hang) fails the test instead of hanging it.

use bypass::hal::{Device, MemoryRegion};
use bypass::sim::{Engine, Fabric};
use bypass::*;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

mod common;
use common::helpers;
use common::ids::ECHO;
use helpers::{echo_functions, poll_once};

const NAME: &str = "stepped-blocking";
/// Longest the test waits for a blocking call to come back (it should be at once).
const LIMIT: Duration = Duration::from_secs(20);

/// Runs `f` on a thread and returns its result, or panics if it does not come back in [`LIMIT`]
/// (the thread is left behind; the test fails).
fn bounded<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(LIMIT).unwrap_or_else(|_| panic!("{what} did not return within {LIMIT:?}: it hangs"))
}

fn assert_refused(what: &str, r: Result<(), RpcError>) {
    match r {
        Err(RpcError::InvalidArgument(m)) => {
            assert!(
                m.contains("Stepped") && m.contains("call_future"),
                "{what}: the error says what to do: {m}"
            );
        }
        other => panic!("{what}: expected a clear refusal, got {other:?}"),
    }
}

#[test]
fn blocking_calls_on_the_stepped_engine_fail_fast_and_futures_work() {
    let fabric = Fabric::new(Engine::Stepped { seed: 0x5EED_0B10 });
    let (snic, cnic) = (fabric.add_nic(), fabric.add_nic());
    // A normal server: its worker thread runs (and polls), but cannot move the device. Keepalive
    // is off (it runs on real time; left on, it would break the connection after its timeout and
    // fail the hung call with a misleading ConnectionBroken instead of hanging forever).
    let scfg = ServerConfig { keepalive: None, ..ServerConfig::new(NAME) };
    let server = Server::bind(&snic, "127.0.0.1:0", scfg, echo_functions(ECHO)).expect("bind");
    let ccfg = ChannelConfig { keepalive: None, ..ChannelConfig::new(NAME) };
    let channel = Arc::new(Channel::connect(&cnic, server.local_addr(), ccfg).expect("connect"));

    let ch = channel.clone();
    let r = bounded("Channel::call_with with a deadline", move || {
        let opts = CallOptions { timeout: Some(Duration::from_millis(50)), ..Default::default() };
        let mut resp = b"stale".to_vec();
        let r = ch.call_with(&opts, ECHO, b"hi", &mut resp).map(drop);
        (r, resp)
    });
    assert_refused("call_with", r.0);
    assert!(r.1.is_empty(), "the response buffer is cleared on the error");

    let ch = channel.clone();
    assert_refused("call", bounded("Channel::call", move || ch.call(ECHO, b"hi", &mut Vec::new())));

    let local = Arc::new(cnic.register(64, Access::LOCAL_WRITE).expect("register"));
    let remote = local.remote();
    let (ch, l) = (channel.clone(), local.clone());
    let r = bounded("Channel::read", move || {
        ch.read(&[LocalRange::new(&l, 0, 8)], &remote, 0, &OpOptions::default())
    });
    assert_refused("read", r);

    // Nothing was sent by the refused calls, and the non-blocking form completes once the test
    // drives the fabric.
    let mut fut = channel.call_future(&CallOptions::default(), ECHO, b"stepped").expect("start a call");
    let start = Instant::now();
    let out = loop {
        fabric.run_until_idle();
        channel.poll();
        if let Some(v) = poll_once(&mut fut) {
            break v;
        }
        assert!(start.elapsed() < LIMIT, "the future did not complete");
        std::thread::yield_now();
    };
    assert_eq!(out.expect("the call"), b"stepped");
    assert_eq!(server.stats().responses, 1, "only the future's call reached the server");
}

/// The same calls on a self-running engine still block and succeed (the refusal is only for
/// devices a test steps).
#[test]
fn blocking_calls_still_work_on_the_inline_engine() {
    let fabric = Fabric::new(Engine::Inline);
    let (snic, cnic) = (fabric.add_nic(), fabric.add_nic());
    let server =
        Server::bind(&snic, "127.0.0.1:0", ServerConfig::new(NAME), echo_functions(ECHO)).expect("bind");
    let channel = Channel::connect(&cnic, server.local_addr(), ChannelConfig::new(NAME)).expect("connect");
    let resp = bounded("Channel::call on Inline", move || {
        let mut resp = Vec::new();
        channel.call(ECHO, b"inline", &mut resp).map(|()| resp)
    });
    assert_eq!(resp.expect("call"), b"inline");
    drop(server);
}
