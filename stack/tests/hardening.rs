//! Issue 30's defects that a careless caller can trigger, each refused with a clear error instead
//! of a panic: a NUL byte in a server or worker name (it would reach
//! `std::thread::Builder::name`); a handler that drops its own `Server`.

use bypass::sim::{Engine, Fabric};
use bypass::*;

mod common;
use common::helpers::echo_functions;
use common::ids::ECHO;

#[test]
fn a_nul_byte_in_a_server_name_is_refused_by_name() {
    let fabric = Fabric::new(Engine::Inline);
    let nic = fabric.add_nic();
    let config = ServerConfig { workers: 1, ..ServerConfig::new("bad\0name") };
    let e = Server::bind(&nic, "127.0.0.1:0", config, echo_functions(ECHO)).expect_err("refused");
    assert!(matches!(e, RpcError::InvalidArgument(_)), "{e:?}");
    let text = e.to_string();
    assert!(text.contains("ServerConfig.name") && text.contains("NUL"), "{text}");
    // The fabric and the NIC are still usable: a good name binds.
    Server::bind(&nic, "127.0.0.1:0", ServerConfig::new("good"), echo_functions(ECHO)).expect("bind");
}

#[test]
fn a_nul_byte_in_a_worker_name_is_refused() {
    let config = WorkerConfig { name: "w\0".into(), ..WorkerConfig::default() };
    let e = WorkerGroup::new(config).expect_err("refused");
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
    assert!(e.to_string().contains("NUL"), "{e}");
}

/// Defect 5: a handler that drops its own `Server` (the last handle) ran `WorkerGroup::drop` on
/// the worker thread, which joined itself and panicked. Now the server shuts down from there:
/// the handler carries on past the drop, the client's channel sees the close, and the device is
/// free for a new server.
fn a_handler_can_drop_its_own_server(engine: sim::Engine) {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    const STOP: FunctionId = common::ids::fid(77);
    let fabric = sim::Fabric::new(engine);
    let nic = fabric.add_nic();
    let slot: Arc<Mutex<Option<Server<sim::SimNic>>>> = Arc::default();
    let after_drop = Arc::new(AtomicBool::new(false));
    let mut functions = echo_functions(ECHO);
    let (s, done) = (slot.clone(), after_drop.clone());
    functions.register(STOP, move |req| {
        let _ = req.reply(b"bye");
        let server = s.lock().unwrap_or_else(|e| e.into_inner()).take();
        drop(server);
        done.store(true, Ordering::Release);
    });
    let config = ServerConfig { workers: 1, ..ServerConfig::new("self-drop") };
    let server = Server::bind(&nic, "127.0.0.1:0", config, functions).expect("bind");
    let addr = server.local_addr();
    *slot.lock().unwrap() = Some(server);
    let client = Channel::connect(&fabric.add_nic(), addr, ChannelConfig::new("self-drop")).expect("connect");
    let mut out = Vec::new();
    client.call(ECHO, b"up", &mut out).expect("echo");
    // The reply may or may not beat the close; either is fine. What matters is below.
    let _ = client.call(STOP, b"", &mut out);
    common::helpers::wait_for("the handler to return from dropping its server", || {
        after_drop.load(Ordering::Acquire)
    });
    common::helpers::wait_for("the channel to see the server close", || client.is_closed());
    assert!(slot.lock().unwrap().is_none());
    // The NIC serves again.
    let again =
        Server::bind(&nic, "127.0.0.1:0", ServerConfig::new("again"), echo_functions(ECHO)).expect("bind");
    let c2 = Channel::connect(&fabric.add_nic(), again.local_addr(), ChannelConfig::new("again"))
        .expect("connect");
    c2.call(ECHO, b"again", &mut out).expect("echo");
    assert_eq!(out, b"again");
}

common::per_engine!(a_handler_can_drop_its_own_server);
