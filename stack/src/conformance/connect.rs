//! Conformance scenarios of connecting: control-plane errors that name what went wrong, the
//! address forms `Channel::connect` takes, and queue settings at the edge of their range.
//! Generic over an [`Env`] like the rest of the suite (moved here from the simulator's
//! `stack/tests/e2e.rs`, which keeps their Stepped-engine runs).

use super::{Env, Rig, ECHO, SERVER_NAME};
use crate::{CallMode, CallOptions, Channel, ChannelConfig, RpcError};
use std::net::{SocketAddr, TcpListener};

/// A loopback address where nothing listens (a port just bound and released).
fn dead_address() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr")
}

/// `Channel::connect` fails with an error that says why: nothing listening (naming the
/// address), a server name nobody serves (naming it), more queues than the server allows (the
/// refusal says how many were asked; the server allows 2 here, since asking a default server
/// for 100 queues makes the client build and register them all first, which on Soft-RoCE takes
/// longer than the connect timeout); configurations that cannot work are `InvalidArgument`.
/// None of this disturbs the server's existing connection.
pub fn control_errors<E: Env>(env: &E) {
    let rig = Rig::with(env, |_, s| s.max_queues = 2);
    let dead = dead_address();
    match Channel::connect(env.client(), dead, ChannelConfig::new(SERVER_NAME)) {
        Err(e @ RpcError::Control(_)) => {
            let text = e.to_string();
            assert!(text.contains(&dead.to_string()), "the error should name {dead}: {text}");
        }
        other => panic!("connecting to {dead} where nothing listens: {other:?}"),
    }
    let addr = rig.server().local_addr();
    match Channel::connect(env.client(), addr, ChannelConfig::new("no-such-server")) {
        Err(e @ RpcError::Control(_)) => {
            let text = e.to_string();
            assert!(text.contains("no-such-server"), "the error should name the server asked for: {text}");
        }
        other => panic!("connecting with the wrong server name: {other:?}"),
    }
    let mut too_many = ChannelConfig::new(SERVER_NAME);
    too_many.queues = 3;
    match Channel::connect(env.client(), addr, too_many) {
        Err(e @ RpcError::Control(_)) => {
            let text = e.to_string();
            assert!(text.contains("3 queues"), "the refusal should say why: {text}");
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
        match Channel::connect(env.client(), addr, c) {
            Err(RpcError::InvalidArgument(_)) => {}
            other => panic!("{what}: {other:?}"),
        }
    }
    assert_eq!(rig.server().connections(), 1);
    assert_eq!(rig.server().stats().connections, 1);
    rig.echo(&CallOptions::default(), b"unaffected");
    rig.drain();
}

/// Regression: `Channel::connect` required `ToSocketAddrs + Display`, so the `(host, port)`
/// tuple `Server::bind` takes did not compile. Any `ToSocketAddrs` works (`(&str, u16)`,
/// `(String, u16)`); a failure names the socket address the argument resolved to.
pub fn connect_takes_a_host_port_tuple<E: Env>(env: &E) {
    let rig = Rig::new(env);
    let port = rig.server().local_addr().port();
    let mut resp = Vec::new();
    let tuple = Channel::connect(env.client(), ("127.0.0.1", port), ChannelConfig::new(SERVER_NAME))
        .expect("connect with a (host, port) tuple");
    tuple.call(ECHO, b"tuple", &mut resp).expect("call");
    assert_eq!(resp, b"tuple");
    let owned =
        Channel::connect(env.client(), (String::from("127.0.0.1"), port), ChannelConfig::new(SERVER_NAME))
            .expect("connect with a (String, port) tuple");
    owned.call(ECHO, b"owned", &mut resp).expect("call");
    assert_eq!(resp, b"owned");
    let dead = dead_address();
    match Channel::connect(env.client(), ("127.0.0.1", dead.port()), ChannelConfig::new(SERVER_NAME)) {
        Err(e @ RpcError::Control(_)) => assert!(e.to_string().contains(&dead.to_string()), "{e}"),
        other => panic!("connecting where nothing listens: {other:?}"),
    }
    drop((tuple, owned));
    rig.until("the server to see them go", || rig.server().connections() == 1);
    rig.drain();
}

/// `QueueConfig::timeout` of exponent 0 (`AckTimeout::NONE`: no retransmission timer, the
/// hardware's meaning) is a valid setting on both sides; calls in every mode work.
pub fn no_ack_timer_is_valid<E: Env>(env: &E) {
    let rig = Rig::with(env, |c, s| {
        c.queue_config.timeout = crate::hal::AckTimeout::NONE;
        s.queue_config.timeout = crate::hal::AckTimeout::NONE;
    });
    for m in CallMode::ALL {
        rig.call(&CallOptions::mode(m), ECHO, b"no timer").unwrap_or_else(|e| panic!("{m:?}: {e}"));
    }
    rig.drain();
}
