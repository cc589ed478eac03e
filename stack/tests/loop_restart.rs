//! The process's control loop (`bypass-ctl`) survives a panic of its own code: the connections
//! it held are closed with `CloseReason::ControlLost` (none is left open and unwatched), and the
//! next connection starts a new loop that serves it.
//!
//! One test function in its own binary: the loop and the thread names are the process's. Every
//! wait is bounded and ends on observable state.

use bypass::sim::{Engine, Fabric};
use bypass::*;
use std::sync::{Arc, Mutex};

#[path = "common/threads.rs"]
mod threads;
use threads::{count, thread_names, until};

mod common;
use common::helpers::{echo_and_hold, Held};
use common::ids::{ECHO, HOLD};

const NAME: &str = "restart";

#[test]
fn a_panicking_control_loop_closes_its_connections_and_the_next_one_starts_a_new_loop() {
    let fabric = Fabric::new(Engine::Inline);
    let (snic, cnic) = (fabric.add_nic(), fabric.add_nic());
    let held = Held::default();
    let functions = echo_and_hold(&held);
    let mut server = Server::bind(&snic, "127.0.0.1:0", ServerConfig::new(NAME), functions).expect("bind");
    let connect = |info: &str| {
        let config = ChannelConfig { client_info: info.into(), ..ChannelConfig::new(NAME) };
        Channel::connect(&cnic, server.local_addr(), config).expect("connect")
    };
    let mut rsp = Vec::new();

    // A channel the loop watches, with a call outstanding.
    let a = connect("a");
    a.call(ECHO, b"before", &mut rsp).expect("a call before the panic");
    let breaks: Arc<Mutex<Vec<CloseReason>>> = Arc::default();
    let b = breaks.clone();
    a.set_break_callback(move |reason| b.lock().unwrap().push(reason));
    let outcome: Arc<Mutex<Option<String>>> = Arc::default();
    let o = outcome.clone();
    a.call_callback(&CallOptions::default(), HOLD, b"", move |r| {
        *o.lock().unwrap() = Some(match r {
            Ok(_) => "answered".into(),
            Err(e) => format!("{e:?}"),
        });
    })
    .expect("start the held call");
    until("the server to hold the call", &fabric, || held.lock().unwrap().len() == 1);

    // The loop panics as it registers the next connection (this one's watches): it held A and
    // had taken the new one; both are closed, none is left unwatched.
    panic_control_loop_for_tests();
    let lost = connect("lost");
    // (`is_closed` turns true a moment before the reason is recorded: wait for the reason.)
    until("the loop's connections to be closed", &fabric, || {
        a.close_reason().is_some() && lost.close_reason().is_some()
    });
    assert!(a.is_closed() && lost.is_closed());
    assert_eq!(a.close_reason(), Some(CloseReason::ControlLost), "closed because the loop is gone");
    until("A's break callback", &fabric, || !breaks.lock().unwrap().is_empty());
    assert_eq!(*breaks.lock().unwrap(), [CloseReason::ControlLost], "once, with the reason");
    let o = outcome.lock().unwrap().clone();
    assert_eq!(
        o.as_deref(),
        Some("ConnectionBroken(ControlLost)"),
        "the outstanding call ends, with the reason"
    );
    assert!(matches!(a.call(ECHO, b"after", &mut rsp), Err(RpcError::Closed)));
    // The new connection's own watch was abandoned (ControlLost), or the server's side of it
    // was and the client saw the server close it (PeerClosed): closed either way.
    assert!(
        matches!(lost.close_reason(), Some(CloseReason::ControlLost | CloseReason::PeerClosed)),
        "{:?}",
        lost.close_reason()
    );

    // A new connection starts a new loop, which serves it: calls work, and the server's
    // closing it is seen.
    let c = connect("c");
    for i in 0..10u8 {
        c.call(ECHO, &[i; 32], &mut rsp).expect("a call on a connection made after the panic");
        assert_eq!(rsp, [i; 32]);
    }
    until("the server to drop the closed connections", &fabric, || server.connections() == 1);
    // One new loop thread (awaited: a thread just started may not have taken its name yet).
    until("one control loop thread", &fabric, || count(&thread_names(), "bypass-ctl") == 1);
    held.lock().unwrap().clear();
    server.shutdown();
    until("the new loop to see the server close", &fabric, || c.close_reason().is_some());
    assert_eq!(c.close_reason(), Some(CloseReason::PeerClosed));
    drop((a, lost, c));
    drop(server);
    // Nothing left to watch: the new loop ends as the first one would have.
    until("the new control loop to end", &fabric, || count(&thread_names(), "bypass-ctl") == 0);
}
