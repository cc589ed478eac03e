//! Issue 30's defects that a careless caller can trigger, each refused with a clear error instead
//! of a panic: a NUL byte in a server or worker name (it would reach
//! `std::thread::Builder::name`).

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
