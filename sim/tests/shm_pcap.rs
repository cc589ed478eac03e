//! `BYPASS_PCAP` on the shared-memory wire: the capture wire wraps shm links too, so a run over
//! shared memory leaves a capture whose every record is a RoCEv2 Ethernet frame that decodes.
//! (A test binary of its own: it sets the process's environment.)

use bypass_hal::*;
use bypass_sim::{pcap, roce, Engine, Fabric, FabricConfig, WireConfig};
use std::time::{Duration, Instant};

#[test]
fn a_run_over_shared_memory_is_captured() {
    let path = std::env::temp_dir().join(format!("bypass-shm-capture-{}.pcap", std::process::id()));
    std::env::set_var(pcap::ENV, &path);
    {
        let fabric =
            Fabric::with_config(FabricConfig { wire: WireConfig::Shm, ..FabricConfig::new(Engine::Inline) });
        let (a, b) = (fabric.add_nic(), fabric.add_nic());
        let cfg = QueueConfig::default();
        let (mut ca, mut cb) = (a.create_cq(64).unwrap(), b.create_cq(64).unwrap());
        let mut qa = a.create_queue(&cfg, &ca, &ca).unwrap();
        let mut qb = b.create_queue(&cfg, &cb, &cb).unwrap();
        let (ia, ib) = (qa.info(), qb.info());
        qa.connect(&ib).unwrap();
        qb.connect(&ia).unwrap();
        let mut src = a.register(100, Access::empty()).unwrap();
        src.write(0, &[7u8; 100]).unwrap();
        let dst = b.register(100, Access::LOCAL_WRITE).unwrap();
        let mut wc = [Completion::default(); 8];
        let deadline = Instant::now() + Duration::from_secs(30);
        for i in 0..5u64 {
            qb.post_recv(&[RecvWr { wr_id: i, sges: &[dst.sge(0, 100).unwrap()] }]).unwrap();
            qa.post_send(&[SendWr::send(i, &[src.sge(0, 100).unwrap()])]).unwrap();
            let mut got = (false, false);
            while got != (true, true) {
                assert!(Instant::now() < deadline, "message {i}: {got:?}");
                got.0 |= ca.poll(&mut wc).unwrap() > 0;
                got.1 |= cb.poll(&mut wc).unwrap() > 0;
            }
        }
    }
    std::env::remove_var(pcap::ENV);
    let bytes = std::fs::read(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    assert_eq!(&bytes[..4], &[0xd4, 0xc3, 0xb2, 0xa1], "a classic pcap file");
    let (mut at, mut frames) = (24usize, Vec::new());
    while at + 16 <= bytes.len() {
        let incl = u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap()) as usize;
        frames.push(bytes[at + 16..at + 16 + incl].to_vec());
        at += 16 + incl;
    }
    assert_eq!(at, bytes.len());
    // 5 SENDs and (at least some of) their ACKs.
    assert!(frames.len() >= 6, "{} frames captured", frames.len());
    let mut sends = 0;
    for f in &frames {
        let eth = roce::decode_ethernet(f).expect("every captured frame decodes");
        if eth.frame.payload.len() == 100 {
            sends += 1;
        }
    }
    assert_eq!(sends, 5, "the five SENDs, once each");
}
