//! Rendezvous: a 64 MiB argument and a 64 MiB response in one call on the simulator.
//!
//! The arguments do not fit a message, so the client sends a DMA descriptor of a registered copy
//! and the server pulls it with RDMA READ; `max_response` names a registered response buffer
//! the server RDMA-WRITEs the answer into. `cargo run --release --example rendezvous -p bypass`

use bypass::{CallOptions, Channel, ChannelConfig, FunctionId, Functions, Server, ServerConfig};
use bypass_sim::{Engine, Fabric};
use std::time::Instant;

const REVERSE: FunctionId = match FunctionId::new(1, 1, true, 1) {
    Some(f) => f,
    None => panic!("bad function id"),
};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let fabric = Fabric::new(Engine::Inline);
    let (snic, cnic) = (fabric.add_nic(), fabric.add_nic());
    let mut functions = Functions::new();
    functions.register(REVERSE, |mut req| {
        let n = req.args().len();
        println!(
            "server: {n} bytes arrived by rendezvous: {}, in {} segment(s)",
            req.is_rendezvous(),
            req.segments().count()
        );
        // Work on the gathered buffer in place, then write it back without a copy.
        if let Some(args) = req.args_mut() {
            args.reverse();
        }
        let _ = req.reply_args(n);
    });
    let mut config = ServerConfig::new("rndv-example");
    config.rndv_memory_limit = 128 << 20;
    let server = Server::bind(&snic, "127.0.0.1:0", config, functions)?;
    let channel = Channel::connect(&cnic, server.local_addr(), ChannelConfig::new("rndv-example"))?;

    let len = 64 << 20;
    let args: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    let opts = CallOptions { max_response: len, ..Default::default() };
    let mut response = Vec::new();
    let t = Instant::now();
    channel.call_with(&opts, REVERSE, &args, &mut response)?;
    let took = t.elapsed();
    assert!(response.iter().eq(args.iter().rev()), "the response is the arguments reversed");
    println!(
        "client: {len} bytes there and back in {took:?} ({:.0} MiB/s of arguments); rendezvous memory held now: {} bytes",
        len as f64 / took.as_secs_f64() / (1 << 20) as f64,
        channel.rndv_in_use()
    );
    Ok(())
}
