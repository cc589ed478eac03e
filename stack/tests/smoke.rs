use bypass::sim::{Engine, Fabric};
use bypass::*;

mod common;
use common::helpers::echo_functions;
use common::ids::ECHO;

#[test]
fn smoke() {
    let fabric = Fabric::new(Engine::Inline);
    let snic = fabric.add_nic();
    let cnic = fabric.add_nic();
    let server = Server::bind(&snic, "127.0.0.1:0", ServerConfig::new("echo"), echo_functions(ECHO)).unwrap();
    let ch = Channel::connect(&cnic, server.local_addr(), ChannelConfig::new("echo")).unwrap();
    let mut resp = Vec::new();
    for i in 0..1000u32 {
        ch.call(ECHO, &i.to_le_bytes(), &mut resp).unwrap();
        assert_eq!(resp, i.to_le_bytes());
    }
    for mode in CallMode::ALL {
        let info = ch.call_with(&CallOptions::mode(mode), ECHO, b"hello", &mut resp).unwrap();
        eprintln!("{mode:?}: {info:?} {:?}", resp);
    }
    eprintln!("{:?} {:?}", ch.stats(), server.stats());
}
