//! `BYPASS_PCAP`: a real two-NIC run (SEND, WRITE, READ, WRITE_IMM, SEND_IMM, an RNR NAK and its
//! retry) captured through the fabric's capture wires, then the file read back: its structure
//! (file header, record headers, lengths, timestamps), every frame decoded with the crate's own
//! decoder against what the run did, and — where tshark is installed — Wireshark's dissection of
//! the same file.
//!
//! The environment variable is process-wide, so this binary holds this one test.

mod tshark;

use bypass_hal::conformance::pattern;
use bypass_hal::*;
use bypass_sim::pcap::{self, FILE_HEADER_LEN, RECORD_HEADER_LEN};
use bypass_sim::roce::{self, Opcode};
use bypass_sim::{Engine, Fabric, FabricConfig, SimCq, SimNic, SimQueue};
use std::time::Duration;

const MTU: u32 = 1024;

struct Side {
    q: SimQueue,
    cq: SimCq,
}

fn side(nic: &SimNic) -> Side {
    let mut cfg = QueueConfig::default();
    cfg.rnr_retry = 7;
    cfg.min_rnr_timer = RnrTimer::at_least(Duration::from_micros(100)); // code 7, 120 µs
    let cq = nic.create_cq(64).unwrap();
    let q = nic.create_queue(&cfg, &cq, &cq).unwrap();
    Side { q, cq }
}

/// Runs the fabric until idle and collects `n` completions from `cq`.
fn complete(fabric: &Fabric, cq: &mut SimCq, n: usize) -> Vec<Completion> {
    let mut got = Vec::new();
    let mut wc = [Completion::default(); 16];
    for _ in 0..100 {
        fabric.run_until_idle();
        let k = cq.poll(&mut wc).unwrap();
        got.extend_from_slice(&wc[..k]);
        if got.len() >= n {
            break;
        }
        fabric.advance(Duration::from_millis(1));
    }
    assert_eq!(got.len(), n, "{got:?}");
    assert!(got.iter().all(|c| c.status == Status::Success), "{got:?}");
    got
}

struct Record {
    ts_us: u64,
    frame: Vec<u8>,
}

/// Reads a classic pcap file, checking its structure.
fn read_pcap(bytes: &[u8]) -> Vec<Record> {
    assert!(bytes.len() >= FILE_HEADER_LEN);
    let u16_at = |at: usize| u16::from_le_bytes([bytes[at], bytes[at + 1]]);
    let u32_at = |b: &[u8], at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
    assert_eq!(&bytes[..4], &[0xd4, 0xc3, 0xb2, 0xa1], "magic a1b2c3d4, little-endian, microseconds");
    assert_eq!((u16_at(4), u16_at(6)), (2, 4), "version 2.4");
    assert_eq!((u32_at(bytes, 8), u32_at(bytes, 12)), (0, 0), "thiszone, sigfigs");
    assert_eq!(u32_at(bytes, 16), pcap::SNAPLEN);
    assert_eq!(u32_at(bytes, 20), 1, "LINKTYPE_ETHERNET");
    let mut at = FILE_HEADER_LEN;
    let mut out: Vec<Record> = Vec::new();
    while at < bytes.len() {
        let h = &bytes[at..at + RECORD_HEADER_LEN];
        let (sec, usec, incl, orig) = (u32_at(h, 0), u32_at(h, 4), u32_at(h, 8), u32_at(h, 12));
        assert!(usec < 1_000_000);
        assert_eq!(incl, orig, "records are never cut");
        let ts_us = u64::from(sec) * 1_000_000 + u64::from(usec);
        if let Some(prev) = out.last() {
            assert!(ts_us >= prev.ts_us, "timestamps never go back");
        }
        let start = at + RECORD_HEADER_LEN;
        let end = start + incl as usize;
        assert!(end <= bytes.len(), "record {} runs past the end of the file", out.len());
        out.push(Record { ts_us, frame: bytes[start..end].to_vec() });
        at = end;
    }
    assert_eq!(at, bytes.len());
    out
}

#[test]
fn a_captured_run_reads_back_and_dissects() {
    let path = std::env::temp_dir().join(format!("bypass-capture-{}.pcap", std::process::id()));
    std::env::set_var(pcap::ENV, &path);

    let cfg = FabricConfig { mtu: MTU, ..FabricConfig::new(Engine::Stepped { seed: 11 }) };
    let fabric = Fabric::with_config(cfg);
    let (na, nb) = (fabric.add_nic(), fabric.add_nic());
    // Queue numbers 0 and 1 are InfiniBand's management queue pairs (SMI, GSI): Wireshark
    // dissects packets to them as MADs. The sim's first data queue is 2, so queue 2 talks to 2.
    let (mut a, mut b) = (side(&na), side(&nb));
    let (ia, ib) = (a.q.info(), b.q.info());
    a.q.connect(&ib).unwrap();
    b.q.connect(&ia).unwrap();
    let mut src = na.register(16 << 10, Access::LOCAL_WRITE).unwrap();
    src.write(0, &pattern(1, 16 << 10)).unwrap();
    let inbox = nb.register(16 << 10, Access::LOCAL_WRITE).unwrap();
    let target =
        nb.register(16 << 10, Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ).unwrap();
    let recv = |b: &mut Side, id: u64| {
        b.q.post_recv(&[RecvWr {
            wr_id: id,
            sges: &[inbox.sge(id as usize * 4096 % (16 << 10), 4096).unwrap()],
        }])
        .unwrap()
    };
    let s = |off, len| src.sge(off, len).unwrap();

    // SEND of 2,500 bytes: FIRST, MIDDLE, LAST.
    recv(&mut b, 0);
    a.q.post_send(&[SendWr::send(1, &[s(0, 2500)])]).unwrap();
    complete(&fabric, &mut a.cq, 1);
    complete(&fabric, &mut b.cq, 1);
    // WRITE of 3,000 bytes: FIRST (RETH), MIDDLE, LAST.
    a.q.post_send(&[SendWr::send(2, &[s(0, 3000)]).with_op(SendOp::Write(target.remote().at(0)))]).unwrap();
    complete(&fabric, &mut a.cq, 1);
    // READ of 2,100 bytes: a request, then response FIRST, MIDDLE, LAST.
    a.q.post_send(&[SendWr::send(3, &[s(8192, 2100)]).with_op(SendOp::Read(target.remote().at(0)))]).unwrap();
    complete(&fabric, &mut a.cq, 1);
    // WRITE_IMM of 8 bytes: ONLY_WITH_IMMEDIATE.
    recv(&mut b, 1);
    let write_imm = SendOp::WriteImm(target.remote().at(4096), 0xC0FF_EE00);
    a.q.post_send(&[SendWr::send(4, &[s(0, 8)]).with_op(write_imm)]).unwrap();
    complete(&fabric, &mut a.cq, 1);
    complete(&fabric, &mut b.cq, 1);
    // A SEND with no receive posted: RNR NAK; a receive, the RNR wait, the same PSN again.
    a.q.post_send(&[SendWr::send(5, &[s(0, 100)])]).unwrap();
    fabric.run_until_idle();
    assert_eq!(nb.stats().rnr_naks_sent, 1);
    recv(&mut b, 2);
    complete(&fabric, &mut a.cq, 1);
    complete(&fabric, &mut b.cq, 1);
    // A solicited SEND_IMM of 3 bytes (pad 1).
    recv(&mut b, 3);
    let three = [s(0, 3)];
    let send_imm = SendWr::send(6, &three)
        .with_op(SendOp::SendImm(77))
        .with_flags(WrFlags::SIGNALED | WrFlags::SOLICITED);
    a.q.post_send(&[send_imm]).unwrap();
    complete(&fabric, &mut a.cq, 1);
    complete(&fabric, &mut b.cq, 1);

    let (sa, sb) = (na.stats(), nb.stats());
    let sent = sa.tx_packets + sa.tx_responses + sb.tx_packets + sb.tx_responses;
    assert_eq!(sa.tx_dropped + sb.tx_dropped, 0);
    // Every record is in the file while the run is still alive (a crash loses nothing taken).
    let live = std::fs::read(&path).unwrap();
    assert_eq!(read_pcap(&live).len() as u64, sent, "one record per packet put on the wire");
    drop((a, b, src, inbox, target, na, nb, fabric));
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(bytes, live, "nothing was left buffered");
    let records = read_pcap(&bytes);

    // Decode every frame and check it against the run.
    let frames: Vec<_> =
        records.iter().map(|r| roce::decode_ethernet(&r.frame).expect("a valid frame")).collect();
    let psn0 = frames[0].frame.psn;
    let mut expect_req = vec![];
    for (f, r) in frames.iter().zip(&records) {
        let (from, to) = (f.src_nic().unwrap(), f.dst_nic().unwrap());
        assert_eq!(from + to, 1, "NICs 0 and 1");
        assert_eq!(f.link.src_mac[3..], [0, 0, from as u8]);
        assert_eq!(f.frame.dest_qp, 2);
        assert_eq!(f.endpoints.src_port, roce::udp_source_port(2, 2));
        assert_eq!(r.frame.len(), 42 + f.frame.udp_len());
        if from == 0 {
            expect_req.push((
                f.frame.opcode,
                f.frame.psn.wrapping_sub(psn0) & 0xFF_FFFF,
                f.frame.payload.len(),
            ));
        }
    }
    use Opcode::*;
    assert_eq!(
        expect_req,
        [
            (SendFirst, 0, 1024),
            (SendMiddle, 1, 1024),
            (SendLast, 2, 452),
            (RdmaWriteFirst, 3, 1024),
            (RdmaWriteMiddle, 4, 1024),
            (RdmaWriteLast, 5, 952),
            (RdmaReadRequest, 6, 0), // takes PSNs 6, 7, 8 for its three responses
            (RdmaWriteOnlyWithImmediate, 9, 8),
            (SendOnly, 10, 100),
            (SendOnly, 10, 100), // the retry after the RNR NAK
            (SendOnlyWithImmediate, 11, 3),
        ],
        "requests from NIC 0 in order, PSNs relative to the first"
    );
    let responses: Vec<_> = frames
        .iter()
        .filter(|f| f.src_nic() == Some(1))
        .map(|f| {
            (f.frame.opcode, f.frame.psn.wrapping_sub(psn0) & 0xFF_FFFF, f.frame.aeth.map(|a| a.syndrome))
        })
        .collect();
    for want in [
        (RdmaReadResponseFirst, 6, Some(0x1F)),
        (RdmaReadResponseMiddle, 7, None),
        (RdmaReadResponseLast, 8, Some(0x1F)),
        (Acknowledge, 2, Some(0x1F)),
        (Acknowledge, 10, Some(0x27)), // RNR NAK, timer code 7
        (Acknowledge, 11, Some(0x1F)),
    ] {
        assert!(responses.contains(&want), "{want:?} missing from {responses:?}");
    }
    // Payloads are the bytes the run moved; the WRITE's RETH names the target; flags are set
    // where rxe sets them.
    let src_bytes = pattern(1, 16 << 10);
    let send: Vec<u8> = frames[..]
        .iter()
        .filter(|f| f.src_nic() == Some(0))
        .take(3)
        .flat_map(|f| f.frame.payload.to_vec())
        .collect();
    assert_eq!(send, src_bytes[..2500]);
    let wf = frames.iter().find(|f| f.frame.opcode == RdmaWriteFirst).unwrap().frame;
    assert_eq!((wf.reth.unwrap().rkey, wf.reth.unwrap().len), (target_rkey(&frames), 3000));
    let imm = frames.iter().find(|f| f.frame.opcode == RdmaWriteOnlyWithImmediate).unwrap().frame;
    assert_eq!(imm.imm, Some(0xC0FF_EE00));
    let si = frames.iter().find(|f| f.frame.opcode == SendOnlyWithImmediate).unwrap().frame;
    assert!(si.solicited && si.ack_req && si.imm == Some(77) && si.pad() == 1);
    assert!(frames.iter().all(|f| f.frame.ack_req == (f.frame.opcode.is_last() && f.src_nic() == Some(0))));

    if tshark::available("a_captured_run_reads_back_and_dissects") {
        let rows = tshark::fields(
            &path,
            &[
                "infiniband.bth.opcode",
                "infiniband.bth.destqp",
                "infiniband.bth.psn",
                "infiniband.aeth.syndrome",
            ],
        );
        assert_eq!(rows.len(), frames.len());
        for (row, f) in rows.iter().zip(&frames) {
            let f = f.frame;
            let got: Vec<Option<u64>> = row.iter().map(|s| tshark::num(s)).collect();
            let want = [
                Some(u64::from(f.opcode.byte())),
                Some(2),
                Some(u64::from(f.psn)),
                f.aeth.map(|a| u64::from(a.syndrome)),
            ];
            assert_eq!(got, want, "tshark's view of {}", f.opcode);
        }
        let text = tshark::verbose(&path);
        tshark::assert_clean(&text, frames.len());
        for shown in [
            "Reliable Connection (RC) - SEND First (0)",
            "Reliable Connection (RC) - SEND Middle (1)",
            "Reliable Connection (RC) - SEND Last (2)",
            "Reliable Connection (RC) - SEND Only (4)",
            "Reliable Connection (RC) - SEND Only with Immediate (5)",
            "Reliable Connection (RC) - RDMA WRITE First (6)",
            "Reliable Connection (RC) - RDMA WRITE Middle (7)",
            "Reliable Connection (RC) - RDMA WRITE Last (8)",
            "Reliable Connection (RC) - RDMA WRITE Only with Immediate (11)",
            "Reliable Connection (RC) - RDMA READ Request (12)",
            "Reliable Connection (RC) - RDMA READ response First (13)",
            "Reliable Connection (RC) - RDMA READ response Middle (14)",
            "Reliable Connection (RC) - RDMA READ response Last (15)",
            "Reliable Connection (RC) - Acknowledge (17)",
            "RNR Nak",
            "Timer: 0.12 ms (7)",
            "Destination Queue Pair: 0x000002",
        ] {
            assert!(text.contains(shown), "tshark -V does not show {shown:?}");
        }
    }
    let _ = std::fs::remove_file(&path);
}

/// The rkey of the READ request (the same region the WRITE targets).
fn target_rkey(frames: &[roce::EthFrame<'_>]) -> u32 {
    frames.iter().find(|f| f.frame.opcode == Opcode::RdmaReadRequest).unwrap().frame.reth.unwrap().rkey
}
