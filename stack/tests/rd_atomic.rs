//! Initiator depth negotiation (issues 11 and 13): each side connects with an initiator depth
//! (`max_rd_atomic`) of at most the peer's responder resources (`max_dest_rd_atomic`), which the
//! queue infos of the control handshake carry (control version 4), as rdma_cm does.
//!
//! Without it a requester with more READs in flight than its peer has resources for works until a
//! READ response is lost: the responder no longer has the resource to answer the duplicate, drops
//! it, and the READ fails with RetryExceeded (rxe behaves the same). Here the devices' caps allow 1
//! responder resource while the stack's default initiator depth is 4, the link loses packets, and
//! both directions of READ — the client's one-sided READs of a server region, the server's
//! rendezvous READs of the client's arguments — must all succeed with the right bytes.

use bypass::hal::{AckTimeout, Device, MemoryRegion, QueueConfig};
use bypass::sim::{Engine, Fabric, FabricConfig, FaultPlan, SimNic};
use bypass::*;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;
use common::helpers;
use common::ids::{ECHO, REGION as DESC};
use helpers::poll_once;

const NAME: &str = "rd-atomic";
const REGION: usize = 256 << 10;
const LIMIT: Duration = Duration::from_secs(60);

fn queue_config() -> QueueConfig {
    let mut c = QueueConfig::default();
    // Losses are retried after a short timeout, so the test does not wait 134 ms per loss.
    c.timeout = AckTimeout::at_least(Duration::from_millis(2));
    assert_eq!(c.max_rd_atomic, 4, "the default initiator depth");
    c
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ ((i >> 8) as u8)).collect()
}

#[test]
fn fewer_responder_resources_than_the_peers_initiator_depth_still_serve_reads() {
    let mut config = FabricConfig::new(Engine::Threaded);
    config.caps.max_dest_rd_atomic = 1;
    config.faults = FaultPlan { drop_ppm: 20_000, seed: 0x0D_A70C, ..FaultPlan::NONE };
    let fabric = Fabric::with_config(config);
    let (snic, cnic) = (fabric.add_nic(), fabric.add_nic());
    assert_eq!(snic.caps().max_dest_rd_atomic, 1);
    assert!(snic.caps().max_rd_atomic >= 4);

    let mut region = snic.register(REGION, Access::LOCAL_WRITE | Access::REMOTE_READ).expect("register");
    let want = pattern(3, REGION);
    region.write(0, &want).expect("fill");
    let exposed = Arc::new(region);
    let mut f = Functions::<SimNic>::new();
    let r = exposed.clone();
    f.register(DESC, move |req| {
        let _ = req.reply(&r.remote().encode());
    });
    f.register(ECHO, |req| {
        let a = req.args().to_vec();
        let _ = req.reply(&a);
    });
    let scfg = ServerConfig { queue_config: queue_config(), ..ServerConfig::new(NAME) };
    let server = Server::bind(&snic, "127.0.0.1:0", scfg, f).expect("bind");
    let ccfg = ChannelConfig { queue_config: queue_config(), ..ChannelConfig::new(NAME) };
    let channel = Channel::connect(&cnic, server.local_addr(), ccfg).expect("connect");

    let mut desc = Vec::new();
    channel.call(DESC, b"", &mut desc).expect("descriptor");
    let remote = hal::RemoteRegion::decode(&desc).expect("decode the descriptor");

    // One-sided: 8 READs of 32 KiB in flight at a time, 4 rounds over the whole region.
    const PIECE: usize = 32 << 10;
    for round in 0..4 {
        let local = Arc::new(cnic.register(REGION, Access::LOCAL_WRITE).expect("register"));
        let mut futs: Vec<_> = (0..REGION / PIECE)
            .map(|i| {
                let range = [LocalRange::new(&local, i * PIECE, PIECE)];
                channel
                    .read_future(&range, &remote, (i * PIECE) as u64, &OpOptions::default())
                    .expect("start a READ")
            })
            .collect();
        let start = Instant::now();
        let mut done = vec![false; futs.len()];
        while done.iter().any(|d| !d) {
            assert!(start.elapsed() < LIMIT, "round {round}: READs did not finish");
            channel.poll();
            for (i, fut) in futs.iter_mut().enumerate() {
                if !done[i] {
                    if let Some(r) = poll_once(fut) {
                        r.unwrap_or_else(|e| panic!("round {round}: READ {i} failed: {e}"));
                        done[i] = true;
                    }
                }
            }
            std::thread::yield_now();
        }
        let mut got = vec![0u8; REGION];
        local.read(0, &mut got).expect("read back");
        assert!(got == want, "round {round}: the READs brought the wrong bytes");
    }

    // Rendezvous: the server READs the client's arguments (its initiator depth against the
    // client's single resource), several calls at once.
    let args: Vec<Vec<u8>> = (0..6).map(|i| pattern(40 + i as u8, 96 << 10)).collect();
    let opts = CallOptions { rendezvous: true, max_response: 128 << 10, ..Default::default() };
    let mut futs: Vec<_> = args.iter().map(|a| channel.call_future(&opts, ECHO, a).expect("start")).collect();
    let start = Instant::now();
    let mut done = vec![false; futs.len()];
    while done.iter().any(|d| !d) {
        assert!(start.elapsed() < LIMIT, "rendezvous calls did not finish");
        channel.poll();
        for (i, fut) in futs.iter_mut().enumerate() {
            if !done[i] {
                if let Some(r) = poll_once(fut) {
                    let resp = r.unwrap_or_else(|e| panic!("rendezvous call {i} failed: {e}"));
                    assert!(resp == args[i], "rendezvous call {i}: wrong echo");
                    done[i] = true;
                }
            }
        }
        std::thread::yield_now();
    }

    let (s, c) = (snic.stats(), cnic.stats());
    assert!(fabric.fault_stats().dropped > 0, "the link lost nothing: the test proves nothing");
    assert_eq!(
        (s.duplicate_reads_dropped, c.duplicate_reads_dropped),
        (0, 0),
        "no READ was outstanding beyond the responder's resources"
    );
    assert_eq!((s.queue_errors, c.queue_errors), (0, 0));
    drop(server);
}
