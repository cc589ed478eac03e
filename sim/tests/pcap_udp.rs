//! `BYPASS_PCAP` on the UDP wire: the capture holds every packet sent, as RoCEv2 between the
//! NICs' real IPv4 addresses on port 4791, so Wireshark's RoCE dissector reads it. (A binary of
//! its own: the capture file is named by a process-wide environment variable.)

use bypass_hal::*;
use bypass_sim::{pcap, roce, Engine, Fabric, FabricConfig, WireConfig};
use std::time::{Duration, Instant};

#[allow(dead_code)] // this capture uses only part of the shared tshark helpers
mod tshark;

#[test]
fn a_udp_run_is_captured_between_real_addresses() {
    let path = std::env::temp_dir().join(format!("bypass-udp-capture-{}.pcap", std::process::id()));
    std::env::set_var(pcap::ENV, &path);
    let wire = WireConfig::parse("udp://127.0.0.1:0").unwrap();
    let fabric = Fabric::with_config(FabricConfig { wire, ..FabricConfig::new(Engine::Inline) });
    let (na, nb) = (fabric.add_nic(), fabric.add_nic());
    let (ca, cb) = (na.create_cq(64).unwrap(), nb.create_cq(64).unwrap());
    let mut qa = na.create_queue(&QueueConfig::default(), &ca, &ca).unwrap();
    let mut qb = nb.create_queue(&QueueConfig::default(), &cb, &cb).unwrap();
    let (ia, ib) = (qa.info(), qb.info());
    qa.connect(&ib).unwrap();
    qb.connect(&ia).unwrap();
    let mut src = na.register(8192, Access::LOCAL_WRITE).unwrap();
    src.write(0, &[0x5A; 8192]).unwrap();
    let dst = nb.register(8192, Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ).unwrap();
    qb.post_recv(&[RecvWr { wr_id: 1, sges: &[dst.sge(0, 8192).unwrap()] }]).unwrap();
    let s = |off, len| src.sge(off, len).unwrap();
    qa.post_send(&[
        SendWr::send(1, &[s(0, 6000)]),
        SendWr::send(2, &[s(0, 100)]).with_op(SendOp::Write(dst.remote().at(0))),
        SendWr::send(3, &[s(2048, 5000)]).with_op(SendOp::Read(dst.remote().at(0))),
    ])
    .unwrap();
    let (mut ca, mut cb) = (ca, cb);
    let mut wc = [Completion::default(); 8];
    let (mut got_a, mut got_b) = (0, 0);
    let deadline = Instant::now() + Duration::from_secs(30);
    while got_a < 3 || got_b < 1 {
        assert!(Instant::now() < deadline, "traffic stalled: {got_a} send and {got_b} receive completions");
        got_a += ca.poll(&mut wc).unwrap();
        got_b += cb.poll(&mut wc).unwrap();
        fabric.progress();
    }
    let (a_addr, b_addr) = (na.udp_addr().unwrap(), nb.udp_addr().unwrap());
    drop((qa, qb, na, nb, fabric));

    let bytes = std::fs::read(&path).expect("the capture file");
    let _ = std::fs::remove_file(&path);
    // Records: 16-byte header, then the frame (the file header is 24 bytes).
    let mut frames = Vec::new();
    let mut at = pcap::FILE_HEADER_LEN;
    while at < bytes.len() {
        let incl = u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap()) as usize;
        frames.push(bytes[at + pcap::RECORD_HEADER_LEN..at + pcap::RECORD_HEADER_LEN + incl].to_vec());
        at += pcap::RECORD_HEADER_LEN + incl;
    }
    let mut opcodes = Vec::new();
    for f in &frames {
        let e = roce::decode_ethernet(f).expect("every captured frame decodes, ICRC included");
        assert_eq!(e.endpoints.dst_port, roce::ROCE_PORT);
        let pair = (e.endpoints.src_ip, e.endpoints.dst_ip);
        let (a, b) = (a_addr.ip().octets(), b_addr.ip().octets());
        assert!(pair == (a, b) || pair == (b, a), "between the NICs' real addresses: {pair:?}");
        opcodes.push(e.frame.opcode.name());
    }
    for want in [
        "SEND_FIRST",
        "SEND_LAST",
        "RDMA_WRITE_ONLY",
        "RDMA_READ_REQUEST",
        "RDMA_READ_RESPONSE_FIRST",
        "ACKNOWLEDGE",
    ] {
        assert!(opcodes.iter().any(|o| o.contains(want)), "no {want} in {opcodes:?}");
    }
    if tshark::available("a_udp_run_is_captured_between_real_addresses") {
        let tmp = std::env::temp_dir().join(format!("bypass-udp-capture-{}-b.pcap", std::process::id()));
        std::fs::write(&tmp, &bytes).unwrap();
        let text = tshark::verbose(&tmp);
        let _ = std::fs::remove_file(&tmp);
        tshark::assert_clean(&text, frames.len());
    }
}
