//! Connections cost no thread of their own: one process with many channels to one server has a
//! fixed set of threads (the server's acceptor and worker, and the process's one control loop,
//! `bypass-ctl`), whatever the number of channels; the loop still runs every channel's keepalive,
//! sees every closure on both sides, and ends once no connection is left.
//!
//! One test function (the thread counts are the process's, so nothing else may run at the same
//! time in this binary). Every wait is bounded and ends on observable state.

use bypass::sim::{Engine, Fabric, SimNic};
use bypass::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[path = "common/threads.rs"]
mod threads;
use threads::{count, thread_names, until};

mod common;
use common::ids::ECHO;

const NAME: &str = "many";
const CHANNELS: usize = 200;

#[test]
fn many_channels_share_one_control_thread() {
    let before = thread_names();
    assert_eq!(count(&before, "bypass-ctl"), 0, "no connection yet, no control loop: {before:?}");
    let fabric = Fabric::new(Engine::Inline);
    let (snic, cnic) = (fabric.add_nic(), fabric.add_nic());
    let mut functions = Functions::new();
    functions.register(ECHO, |req| {
        let args = req.args().to_vec();
        let _ = req.reply(&args);
    });
    let server_breaks = Arc::new(AtomicUsize::new(0));
    let sb = server_breaks.clone();
    let events = ConnectionEvents::new().on_break(move |_, _| {
        sb.fetch_add(1, Ordering::Relaxed);
    });
    // Frequent probes, patient limits: nothing is declared broken on a loaded machine.
    let keepalive = Some(Keepalive { interval: Duration::from_millis(20), misses: 200 });
    let config = ServerConfig { keepalive, ..ServerConfig::new(NAME) };
    let mut server = Server::bind_with(&snic, "127.0.0.1:0", config, functions, events).expect("bind");
    let with_server = thread_names();

    // Break callbacks of channels closed by the server (PeerClosed) and by this side (Local).
    let client_breaks = Arc::new(AtomicUsize::new(0));
    let local_breaks = Arc::new(AtomicUsize::new(0));
    let mut channels: Vec<Channel<SimNic>> = (0..CHANNELS)
        .map(|i| {
            let config =
                ChannelConfig { keepalive, client_info: format!("c{i}"), ..ChannelConfig::new(NAME) };
            let ch = Channel::connect(&cnic, server.local_addr(), config).expect("connect");
            let (b, l) = (client_breaks.clone(), local_breaks.clone());
            ch.set_break_callback(move |reason| {
                let counter = if reason == CloseReason::Local { &l } else { &b };
                counter.fetch_add(1, Ordering::Relaxed);
            });
            ch
        })
        .collect();
    let mut rsp = Vec::new();
    for ch in &channels {
        ch.call(ECHO, b"hello", &mut rsp).expect("call");
        assert_eq!(rsp, b"hello");
    }
    let open = thread_names();
    assert_eq!(count(&open, "bypass-ctl"), 1, "one control loop for {CHANNELS} channels: {open:?}");
    assert_eq!(
        open.len(),
        with_server.len() + 1,
        "{CHANNELS} channels add one thread (the control loop), no more: {with_server:?} -> {open:?}"
    );
    assert_eq!(count(&open, "bypass-ch"), 0, "no per-channel thread: {open:?}");
    assert_eq!(count(&open, "bypass-conn"), 0, "no per-connection thread: {open:?}");

    // The loop runs every idle channel's keepalive timer.
    until("two probes on every idle channel", &fabric, || {
        channels.iter().all(|c| c.stats().keepalive_probes >= 2)
    });
    assert!(channels.iter().all(|c| !c.is_closed()), "answering peers are not declared broken");

    // Closing half the channels: the server's side of the loop sees each stream close.
    let rest = channels.split_off(CHANNELS / 2);
    drop(channels);
    until("the server to see half the channels close", &fabric, || {
        server.connections() == CHANNELS - CHANNELS / 2
    });
    until("the server's break callbacks", &fabric, || server_breaks.load(Ordering::Relaxed) == CHANNELS / 2);
    assert_eq!(local_breaks.load(Ordering::Relaxed), CHANNELS / 2, "closed here: Local, once each");
    assert_eq!(client_breaks.load(Ordering::Relaxed), 0);
    for ch in &rest {
        ch.call(ECHO, b"still", &mut rsp).expect("the other channels still work");
    }

    // The server goes away: the client's side of the loop sees every stream close.
    server.shutdown();
    until("every remaining channel to see the server close", &fabric, || rest.iter().all(|c| c.is_closed()));
    until("their break callbacks", &fabric, || client_breaks.load(Ordering::Relaxed) == rest.len());
    assert_eq!(local_breaks.load(Ordering::Relaxed), CHANNELS / 2, "one break callback each");
    assert!(rest.iter().all(|c| c.close_reason() == Some(CloseReason::PeerClosed)));
    drop(rest);
    drop(server);

    // Nothing left to watch: the loop ends (the next connection starts it again).
    until("the control loop to end", &fabric, || count(&thread_names(), "bypass-ctl") == 0);
}
