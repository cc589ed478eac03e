//! `BYPASS_PCAP` on the L2 wire: the capture holds every frame the NICs put on the cable, ARP
//! included, byte for byte, and Wireshark's dissectors read it as ARP and RoCEv2 with good IPv4
//! checksums. (A binary of its own: the capture file is named by a process-wide environment
//! variable.)

use bypass_hal::*;
use bypass_sim::l2::pair::{pair_attachments, PairConfig};
use bypass_sim::{pcap, roce, Engine, Fabric, FabricConfig};
use std::time::{Duration, Instant};

#[allow(dead_code)] // this capture uses only part of the shared tshark helpers
mod tshark;

#[test]
fn an_l2_run_is_captured_as_it_went_on_the_cable() {
    let path = std::env::temp_dir().join(format!("bypass-l2-capture-{}.pcap", std::process::id()));
    std::env::set_var(pcap::ENV, &path);
    let (ports, _) = pair_attachments(PairConfig::default()).unwrap();
    let fabric = Fabric::try_with_l2(FabricConfig::new(Engine::Inline), ports).unwrap();
    let (na, nb) = (fabric.add_nic(), fabric.add_nic());
    let (mut ca, mut cb) = (na.create_cq(64).unwrap(), nb.create_cq(64).unwrap());
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
        SendWr::send(1, &[s(0, 3000)]),
        SendWr::send(2, &[s(0, 100)]).with_op(SendOp::Write(dst.remote().at(0))),
        SendWr::send(3, &[s(2048, 5000)]).with_op(SendOp::Read(dst.remote().at(0))),
    ])
    .unwrap();
    let mut wc = [Completion::default(); 8];
    let (mut got_a, mut got_b) = (0, 0);
    let deadline = Instant::now() + Duration::from_secs(30);
    while got_a < 3 || got_b < 1 {
        assert!(Instant::now() < deadline, "traffic stalled: {got_a} send and {got_b} receive completions");
        got_a += ca.poll(&mut wc).unwrap();
        got_b += cb.poll(&mut wc).unwrap();
        fabric.progress();
    }
    drop((qa, qb, na, nb, fabric));

    let bytes = std::fs::read(&path).expect("the capture file");
    let _ = std::fs::remove_file(&path);
    let mut frames = Vec::new();
    let mut at = pcap::FILE_HEADER_LEN;
    while at < bytes.len() {
        let incl = u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap()) as usize;
        frames.push(bytes[at + pcap::RECORD_HEADER_LEN..at + pcap::RECORD_HEADER_LEN + incl].to_vec());
        at += pcap::RECORD_HEADER_LEN + incl;
    }
    let (mut arp, mut opcodes) = (0, Vec::new());
    for f in &frames {
        if f[12..14] == [0x08, 0x06] {
            arp += 1;
            continue;
        }
        let e = roce::decode_ethernet(f).expect("every captured RoCE frame decodes, ICRC included");
        let pair = (e.endpoints.src_ip, e.endpoints.dst_ip);
        assert!(
            pair == ([10, 99, 0, 1], [10, 99, 0, 2]) || pair == ([10, 99, 0, 2], [10, 99, 0, 1]),
            "{pair:?}"
        );
        assert!(f.len() - 14 <= 1500, "every frame fits the port's MTU");
        opcodes.push(e.frame.opcode.name());
    }
    assert!(arp >= 2, "the request and the reply that resolved the peer: {arp}");
    for want in
        ["SEND_FIRST", "SEND_MIDDLE", "SEND_LAST", "RDMA_WRITE_ONLY", "RDMA_READ_REQUEST", "ACKNOWLEDGE"]
    {
        assert!(opcodes.iter().any(|o| o.contains(want)), "no {want} in {opcodes:?}");
    }
    if tshark::available("an_l2_run_is_captured_as_it_went_on_the_cable") {
        let tmp = std::env::temp_dir().join(format!("bypass-l2-capture-{}-b.pcap", std::process::id()));
        std::fs::write(&tmp, &bytes).unwrap();
        let text = tshark::verbose(&tmp);
        let rows = tshark::fields(&tmp, &["arp.opcode", "infiniband.bth.opcode"]);
        let _ = std::fs::remove_file(&tmp);
        for bad in ["Malformed", "Expert Info (Error", "Bad checksum", "[Packet size limited"] {
            assert!(!text.contains(bad), "tshark reports {bad:?}:\n{text}");
        }
        let roce = frames.len() - arp;
        assert_eq!(text.matches("[Header checksum status: Good]").count(), roce, "IPv4 checksums good");
        assert_eq!(
            text.lines().filter(|l| *l == "InfiniBand").count(),
            roce,
            "RoCE frames read as InfiniBand"
        );
        assert_eq!(rows.iter().filter(|r| !r[0].is_empty()).count(), arp, "ARP frames read as ARP");
    }
}
