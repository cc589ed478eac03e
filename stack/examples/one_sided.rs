//! One-sided RDMA WRITE and READ on a channel, on the simulator: the server registers a region
//! with remote access and hands its descriptor (`RemoteRegion::encode`, 49 bytes) to the client
//! in the response of an ordinary RPC; the client then writes into that memory and reads it
//! back without the server's CPU taking part.
//!
//! ```text
//! cargo run --release -p bypass --example one_sided
//! ```

use bypass::hal::Device;
use bypass::{
    Access, Channel, ChannelConfig, FunctionId, Functions, LocalRange, MemoryRegion, OpOptions, RemoteRegion,
    Server, ServerConfig,
};
use bypass_sim::{Engine, Fabric};
use std::sync::Arc;

const REGION: FunctionId = match FunctionId::new(0x100, 1, true, 7) {
    Some(f) => f,
    None => panic!("invalid function id"),
};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let fabric = Fabric::new(Engine::Inline);
    let (server_nic, client_nic) = (fabric.add_nic(), fabric.add_nic());

    // The server's memory, open to its peers for READ and WRITE.
    let exposed = Arc::new(
        server_nic.register(4096, Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE)?,
    );
    let mut functions = Functions::new();
    let descriptor = exposed.remote().encode();
    functions.register(REGION, move |req| {
        let _ = req.reply(&descriptor);
    });
    let server = Server::bind(&server_nic, "127.0.0.1:0", ServerConfig::new("one-sided"), functions)?;
    let channel = Channel::connect(&client_nic, server.local_addr(), ChannelConfig::new("one-sided"))?;

    // The descriptor travels in an RPC response.
    let mut rsp = Vec::new();
    channel.call(REGION, b"", &mut rsp)?;
    let remote = RemoteRegion::decode(&rsp)?;
    println!("server region: {} bytes at {:#x}", remote.len, remote.addr);

    // WRITE from a registered local buffer into the server's region at offset 100 ...
    let mut local = client_nic.register(64, Access::LOCAL_WRITE)?;
    local.write(0, b"written by the client's NIC")?;
    let local = Arc::new(local);
    channel.write(&[LocalRange::new(&local, 0, 27)], &remote, 100, &OpOptions::default())?;
    let mut seen = [0u8; 27];
    exposed.read(100, &mut seen)?;
    println!("the server's memory now holds {:?}", String::from_utf8_lossy(&seen));

    // ... and READ it back into another local buffer.
    let back = Arc::new(client_nic.register(64, Access::LOCAL_WRITE)?);
    channel.read(&[LocalRange::new(&back, 0, 27)], &remote, 100, &OpOptions::default())?;
    let mut got = [0u8; 27];
    back.read(0, &mut got)?;
    println!("read back: {:?}", String::from_utf8_lossy(&got));

    // A range outside the region is refused by the server's NIC, and named as such.
    match channel.write(&[LocalRange::new(&local, 0, 27)], &remote, 4090, &OpOptions::default()) {
        Err(e) => println!("out of range: {e}"),
        Ok(()) => println!("out of range: unexpectedly accepted"),
    }
    Ok(())
}
