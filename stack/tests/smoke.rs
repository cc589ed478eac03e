use bypass::sim::{Engine, Fabric};
use bypass::*;

#[test]
fn smoke() {
    let fabric = Fabric::new(Engine::Inline);
    let snic = fabric.add_nic();
    let cnic = fabric.add_nic();
    let echo = FunctionId::new(1, 1, true, 1).unwrap();
    let mut f = Functions::new();
    f.register(echo, |req| {
        let _ = req.reply_with(Status::Success, |args, out| {
            out[..args.len()].copy_from_slice(args);
            Ok(args.len())
        });
    });
    let server = Server::bind(&snic, "127.0.0.1:0", ServerConfig::new("echo"), f).unwrap();
    let ch = Channel::connect(&cnic, server.local_addr(), ChannelConfig::new("echo")).unwrap();
    let mut resp = Vec::new();
    for i in 0..1000u32 {
        ch.call(echo, &i.to_le_bytes(), &mut resp).unwrap();
        assert_eq!(resp, i.to_le_bytes());
    }
    for mode in CallMode::ALL {
        let info = ch.call_with(&CallOptions::mode(mode), echo, b"hello", &mut resp).unwrap();
        eprintln!("{mode:?}: {info:?} {:?}", resp);
    }
    eprintln!("{:?} {:?}", ch.stats(), server.stats());
}
