//! The unreliable datagram service (UM; `qp/datagram.rs`): one queue to many targets, the
//! source on every receive, no acknowledgement and no retry, loss under the fault plan.

use crate::packet::PacketHeader;
use crate::roce::{self, Endpoints, Frame, Opcode, RxContext};
use crate::{Engine, Fabric, FabricConfig, FaultPlan, SimCq, SimNic, SimQueue, Source};
use bypass_hal::*;

struct End {
    nic: SimNic,
    cq: SimCq,
    q: SimQueue,
    mem: <SimNic as Device>::Region,
}

fn end(fabric: &Fabric) -> End {
    let nic = fabric.add_nic();
    let cq = nic.create_cq(256).unwrap();
    let mut cfg = QueueConfig::default();
    cfg.send_depth = 128;
    cfg.recv_depth = 128;
    let mut q = nic.create_datagram_queue(&cfg, &cq, &cq, None).unwrap();
    q.activate().unwrap();
    let mem = nic.register(1 << 16, Access::LOCAL_WRITE).unwrap();
    End { nic, cq, q, mem }
}

fn poll(e: &mut End) -> Vec<(Completion, Source)> {
    let mut wc = [Completion::default(); 64];
    let mut from = [Source::default(); 64];
    let n = e.cq.poll_from(&mut wc, &mut from).unwrap();
    wc[..n].iter().copied().zip(from[..n].iter().copied()).collect()
}

fn post_recvs(e: &mut End, n: u64, len: usize) {
    for i in 0..n {
        let sge = e.mem.sge(4096 + (i as usize % 8) * 1024, len).unwrap();
        e.q.post_recv(&[RecvWr { wr_id: 100 + i, sges: &[sge] }]).unwrap();
    }
}

#[test]
fn one_queue_reaches_two_targets_and_each_receive_names_its_sender() {
    let fabric = Fabric::new(Engine::Stepped { seed: 5 });
    let (mut a, mut b, mut c) = (end(&fabric), end(&fabric), end(&fabric));
    post_recvs(&mut b, 1, 1024);
    post_recvs(&mut c, 1, 1024);
    let to_b = a.q.add_dest(&b.q.info()).unwrap();
    let to_c = a.q.add_dest(&c.q.info()).unwrap();
    assert_ne!(to_b.ah, to_c.ah);
    a.mem.write(0, b"to b").unwrap();
    a.mem.write(8, b"to c!").unwrap();
    let (s1, s2) = ([a.mem.sge(0, 4).unwrap()], [a.mem.sge(8, 5).unwrap()]);
    let wrs = [SendWr::send(1, &s1), SendWr::send(2, &s2).with_op(SendOp::SendImm(7))];
    a.q.post_datagrams(&wrs, &[to_b, to_c]).unwrap();
    fabric.run_until_idle();
    let sent: Vec<_> = poll(&mut a).iter().map(|(c, _)| (c.wr_id, c.status)).collect();
    assert_eq!(sent, [(1, Status::Success), (2, Status::Success)]);
    // Each receiver learns who sent: the sending queue, and the sending NIC as its wire names it
    // (what `add_dest` of the sender's queue on that NIC returns as `source`).
    let back_b = b.q.add_dest(&a.q.info()).unwrap();
    let got_b = poll(&mut b);
    assert_eq!(got_b.len(), 1);
    assert_eq!((got_b[0].0.status, got_b[0].0.byte_len), (Status::Success, 4));
    assert_eq!(got_b[0].1, Source { nic: back_b.source, qpn: a.q.qpn() });
    let mut buf = [0u8; 5];
    b.mem.read(4096, &mut buf[..4]).unwrap();
    assert_eq!(&buf[..4], b"to b");
    let got_c = poll(&mut c);
    assert_eq!((got_c[0].0.byte_len, got_c[0].0.imm), (5, Some(7)));
    assert_eq!(got_c[0].1.qpn, a.q.qpn());
    // Nothing is acknowledged: no response packet crossed the wire.
    assert_eq!(b.nic.stats().tx_responses + c.nic.stats().tx_responses, 0);
}

#[test]
fn datagrams_lost_under_the_fault_plan_are_never_retried() {
    let mut cfg = FabricConfig::new(Engine::Stepped { seed: 9 });
    cfg.faults = FaultPlan { drop_ppm: 300_000, seed: 17, ..FaultPlan::NONE };
    let fabric = Fabric::with_config(cfg);
    let (mut a, mut b) = (end(&fabric), end(&fabric));
    post_recvs(&mut b, 100, 64);
    let to_b = a.q.add_dest(&b.q.info()).unwrap();
    for i in 0..100u64 {
        let sge = [a.mem.sge(0, 64).unwrap()];
        let wr = SendWr::send(i, &sge);
        a.q.post_datagrams(&[wr], &[to_b]).unwrap();
        fabric.run_until_idle();
        fabric.advance(std::time::Duration::from_millis(50)); // any retransmission timer would fire
        fabric.run_until_idle();
    }
    let sent = poll(&mut a).into_iter().chain(poll(&mut a)).collect::<Vec<_>>();
    assert_eq!(sent.len(), 100);
    assert!(sent.iter().all(|(c, _)| c.status == Status::Success), "a lost datagram is no error");
    let got = poll(&mut b).len() + poll(&mut b).len();
    let st = a.nic.stats();
    assert_eq!((st.tx_packets + st.tx_dropped, st.retransmits, st.timeouts), (100, 0, 0));
    let lost = fabric.fault_stats().dropped as usize;
    assert!(lost > 10 && lost < 60, "the plan drops about 30%: {lost}");
    assert_eq!(got, 100 - lost, "every datagram not dropped arrived once");
}

#[test]
fn a_datagram_that_finds_no_receive_is_dropped_without_rnr() {
    let fabric = Fabric::new(Engine::Stepped { seed: 1 });
    let (mut a, mut b) = (end(&fabric), end(&fabric));
    let to_b = a.q.add_dest(&b.q.info()).unwrap();
    a.mem.write(0, b"first").unwrap();
    a.q.post_datagrams(&[SendWr::send(1, &[a.mem.sge(0, 5).unwrap()])], &[to_b]).unwrap();
    fabric.run_until_idle();
    assert_eq!(b.nic.stats().datagrams_dropped, 1);
    assert_eq!(b.nic.stats().rnr_naks_sent, 0);
    post_recvs(&mut b, 1, 64);
    a.mem.write(0, b"again").unwrap();
    a.q.post_datagrams(&[SendWr::send(2, &[a.mem.sge(0, 5).unwrap()])], &[to_b]).unwrap();
    fabric.advance(std::time::Duration::from_secs(1));
    fabric.run_until_idle();
    let got = poll(&mut b);
    assert_eq!(got.len(), 1, "the first datagram was not kept for a later receive");
    let mut buf = [0u8; 5];
    b.mem.read(4096, &mut buf).unwrap();
    assert_eq!(&buf, b"again");
    assert_eq!(poll(&mut a).len(), 2);
}

#[test]
fn a_datagram_queue_refuses_atomics_and_a_connection_and_fails_a_message_over_the_mtu() {
    let fabric = Fabric::new(Engine::Stepped { seed: 2 });
    let (mut a, b) = (end(&fabric), end(&fabric));
    let to_b = a.q.add_dest(&b.q.info()).unwrap();
    let sge = [a.mem.sge(0, 8).unwrap()];
    let cas = SendWr::send(1, &sge).with_op(SendOp::CompareSwap {
        remote: RemoteAddr { addr: 0, key: RemoteKey::from_rkey(1) },
        compare: 0,
        swap: 1,
    });
    assert!(matches!(a.q.post_datagrams(&[cas], &[to_b]), Err(Error::InvalidArgument(_))));
    assert!(matches!(a.q.post_send(&[SendWr::send(1, &sge)]), Err(Error::InvalidArgument(_))));
    assert!(matches!(a.q.connect(&b.q.info()), Err(Error::InvalidArgument(_))));
    let mtu = fabric.config().mtu;
    let big = [a.mem.sge(0, mtu as usize + 1).unwrap()];
    a.q.post_datagrams(&[SendWr::send(2, &big)], &[to_b]).unwrap();
    fabric.run_until_idle();
    let got: Vec<_> = poll(&mut a).iter().map(|(c, _)| (c.wr_id, c.status)).collect();
    assert_eq!(got, [(2, Status::LocalLength)]);
    assert_eq!(a.q.state(), QueueState::Error);
}

#[test]
fn a_datagram_is_a_ud_send_only_frame_whose_deth_names_the_sender() {
    let hdr = PacketHeader {
        src_nic: 1,
        dst_nic: 2,
        src_qpn: 0x1234,
        dst_qpn: 0x56,
        first: true,
        last: true,
        has_imm: true,
        imm: 9,
        psn: 77,
        payload_len: 3,
        datagram: true,
        ..Default::default()
    };
    let frame = Frame::of_packet(&hdr, b"abc");
    assert_eq!(frame.opcode, Opcode::UdSendOnlyWithImmediate);
    assert_eq!(frame.opcode.byte(), 0x65);
    let ep = Endpoints::of_packet(&hdr).unwrap();
    let mut buf = [0u8; 128];
    let n = frame.encode_udp(&ep, &mut buf).unwrap();
    assert_eq!(n, roce::BTH_LEN + roce::DETH_LEN + roce::IMMDT_LEN + 4 + roce::ICRC_LEN);
    // DETH right after the BTH: Q_Key, then a reserved byte and the 24-bit source QP.
    assert_eq!(buf[12..16], roce::SIM_QKEY.to_be_bytes());
    assert_eq!(buf[16..20], [0, 0, 0x12, 0x34]);
    // No AckReq: nothing answers a datagram.
    assert_eq!(buf[8] & 0x80, 0);
    let back = roce::decode_udp(&buf[..n], &ep).unwrap();
    let rx = RxContext {
        src_nic: 1,
        dst_nic: 2,
        src_qpn: crate::packet::ANY_QPN,
        near_psn: 77,
        ..Default::default()
    };
    assert_eq!(back.to_header(&rx), hdr);
}

/// A target whose memory the datagram WRITEs and READs (REMOTE_WRITE | REMOTE_READ).
fn target(e: &End) -> <SimNic as Device>::Region {
    e.nic.register(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ).unwrap()
}

#[test]
fn datagram_writes_and_reads_reach_the_target_memory_without_acknowledgement() {
    let fabric = Fabric::new(Engine::Stepped { seed: 4 });
    let (mut a, mut b) = (end(&fabric), end(&fabric));
    let mut mem_b = target(&b);
    let to_b = a.q.add_dest(&b.q.info()).unwrap();
    // B answers READs only from NICs it has a route to.
    let a_from_b = b.nic.reach(&a.q.info()).unwrap();
    post_recvs(&mut b, 1, 64);
    a.mem.write(0, b"written!").unwrap();
    mem_b.write(100, b"for READ").unwrap();
    let src = [a.mem.sge(0, 8).unwrap()];
    let dst = [a.mem.sge(512, 8).unwrap()];
    let wrs = [
        SendWr::send(1, &src).with_op(SendOp::Write(mem_b.remote().at(0))),
        SendWr::send(2, &src).with_op(SendOp::WriteImm(mem_b.remote().at(16), 5)),
        SendWr::send(3, &dst).with_op(SendOp::Read(mem_b.remote().at(100))),
    ];
    a.q.post_datagrams(&wrs, &[to_b; 3]).unwrap();
    fabric.run_until_idle();
    let sent: Vec<_> = poll(&mut a).iter().map(|(c, _)| (c.wr_id, c.status, c.opcode)).collect();
    assert_eq!(
        sent,
        [
            (1, Status::Success, CqOpcode::Write),
            (2, Status::Success, CqOpcode::Write),
            (3, Status::Success, CqOpcode::Read)
        ]
    );
    let mut buf = [0u8; 8];
    mem_b.read(0, &mut buf).unwrap();
    assert_eq!(&buf, b"written!");
    mem_b.read(16, &mut buf).unwrap();
    assert_eq!(&buf, b"written!");
    a.mem.read(512, &mut buf).unwrap();
    assert_eq!(&buf, b"for READ");
    let got = poll(&mut b);
    assert_eq!(got.len(), 1, "WRITE_IMM consumed one receive");
    assert_eq!((got[0].0.opcode, got[0].0.imm), (CqOpcode::RecvWriteImm, Some(5)));
    assert_eq!(got[0].1, Source { nic: a_from_b, qpn: a.q.qpn() });
    // The READ's response is the only packet B sent: no ACKs.
    assert_eq!(b.nic.stats().tx_responses, 1);
}

#[test]
fn a_datagram_read_nobody_answers_times_out_once_and_the_queue_goes_on() {
    let fabric = Fabric::new(Engine::Stepped { seed: 6 });
    let (mut a, mut b) = (end(&fabric), end(&fabric));
    let mem_b = target(&b);
    let to_b = a.q.add_dest(&b.q.info()).unwrap(); // B never reaches A: no route back
    post_recvs(&mut b, 1, 64);
    let dst = [a.mem.sge(512, 8).unwrap()];
    let src = [a.mem.sge(0, 8).unwrap()];
    let wrs = [SendWr::send(1, &dst).with_op(SendOp::Read(mem_b.remote().at(0))), SendWr::send(2, &src)];
    a.q.post_datagrams(&wrs, &[to_b; 2]).unwrap();
    fabric.run_until_idle();
    assert!(poll(&mut a).is_empty(), "the READ waits, and the SEND behind it");
    assert_eq!(b.nic.stats().datagrams_dropped, 1);
    fabric.advance(std::time::Duration::from_secs(2));
    fabric.run_until_idle();
    let got: Vec<_> = poll(&mut a).iter().map(|(c, _)| (c.wr_id, c.status)).collect();
    assert_eq!(got, [(1, Status::RetryExceeded), (2, Status::Success)]);
    assert_eq!(a.q.state(), QueueState::Ready);
    assert_eq!((a.nic.stats().tx_packets, a.nic.stats().retransmits), (2, 0), "asked once, never again");
    assert_eq!(poll(&mut b).len(), 1, "the SEND behind the READ arrived");
}

#[test]
fn datagram_memory_operations_are_rd_frames_naming_the_sender() {
    let hdr = PacketHeader {
        src_nic: 1,
        dst_nic: 2,
        src_qpn: 0x77,
        dst_qpn: 0x56,
        kind: crate::packet::PacketKind::ReadRequest,
        first: true,
        last: true,
        psn: 5,
        remote_addr: 0x1000,
        rkey: 9,
        dma_len: 64,
        datagram: true,
        ..Default::default()
    };
    let frame = Frame::of_packet(&hdr, &[]);
    assert_eq!(frame.opcode, Opcode::RdRdmaReadRequest);
    let ep = Endpoints::of_packet(&hdr).unwrap();
    let mut buf = [0u8; 128];
    let n = frame.encode_udp(&ep, &mut buf).unwrap();
    assert_eq!(n, roce::BTH_LEN + roce::RDETH_LEN + roce::DETH_LEN + roce::RETH_LEN + roce::ICRC_LEN);
    assert_eq!(buf[0], 0x4C);
    let rx = RxContext {
        src_nic: 1,
        dst_nic: 2,
        src_qpn: crate::packet::ANY_QPN,
        near_psn: 5,
        ..Default::default()
    };
    assert_eq!(roce::decode_udp(&buf[..n], &ep).unwrap().to_header(&rx), hdr);
}
