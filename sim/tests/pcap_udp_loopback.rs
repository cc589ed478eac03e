//! `BYPASS_PCAP` on the UDP wire with queues of one NIC connected to each other: their packets
//! are looped back inside the NIC, never reach the socket, and are still captured (with the
//! sim's NIC numbering, as every link behind the fabric's capture wire). A binary of its own:
//! the capture file is named by a process-wide environment variable.

use bypass_hal::*;
use bypass_sim::{pcap, Engine, Fabric, FabricConfig, WireConfig};
use std::time::{Duration, Instant};

#[test]
fn looped_back_packets_are_captured() {
    let path = std::env::temp_dir().join(format!("bypass-udp-loop-capture-{}.pcap", std::process::id()));
    std::env::set_var(pcap::ENV, &path);
    let wire = WireConfig::parse("udp://127.0.0.1:0").unwrap();
    let fabric = Fabric::with_config(FabricConfig { wire, ..FabricConfig::new(Engine::Inline) });
    let nic = fabric.add_nic();
    let mut cq = nic.create_cq(64).unwrap();
    let mut qa = nic.create_queue(&QueueConfig::default(), &cq, &cq).unwrap();
    let mut qb = nic.create_queue(&QueueConfig::default(), &cq, &cq).unwrap();
    let (ia, ib) = (qa.info(), qb.info());
    qa.connect(&ib).unwrap();
    qb.connect(&ia).unwrap();
    let src = nic.register(64, Access::LOCAL_WRITE).unwrap();
    let dst = nic.register(64 * 3, Access::LOCAL_WRITE).unwrap();
    for i in 0..3 {
        qb.post_recv(&[RecvWr { wr_id: 10 + i, sges: &[dst.sge(i as usize * 64, 64).unwrap()] }]).unwrap();
    }
    let sge = [src.sge(0, 64).unwrap()];
    let sends: Vec<SendWr> = (0..3).map(|i| SendWr::send(i, &sge)).collect();
    qa.post_send(&sends).unwrap();
    let mut wc = [Completion::default(); 8];
    let mut got = 0;
    let deadline = Instant::now() + Duration::from_secs(30);
    while got < 6 {
        assert!(Instant::now() < deadline, "looped traffic stalled: {got} of 6 completions");
        got += cq.poll(&mut wc).unwrap();
        fabric.progress();
    }
    assert_eq!(nic.stats().tx_wire_sends, 0, "looped packets went through the socket");
    drop((qa, qb, cq, nic, fabric));
    let bytes = std::fs::read(&path).expect("the capture file");
    let _ = std::fs::remove_file(&path);
    let mut records = 0;
    let mut at = pcap::FILE_HEADER_LEN;
    while at < bytes.len() {
        let incl = u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap()) as usize;
        records += 1;
        at += pcap::RECORD_HEADER_LEN + incl;
    }
    // Three SENDs and at least one ACK.
    assert!(records >= 4, "{records} packets captured, expected the 3 SENDs and their ACKs");
}
