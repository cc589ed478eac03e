//! The UDP wire against a standard RoCEv2 peer (lid 0: what a verbs queue on rxe or a RoCE NIC
//! reports), played here by plain sockets: frames from a per-queue source port to 4791, with an
//! IPv4 ID in their ICRC the receiving socket never sees, and answers sent to port 4791.
//! The real thing (Linux's rxe) is hw-tests/tests/rxe_interop.rs.

use bypass_hal::*;
use bypass_sim::packet::{PacketHeader, PacketKind, Syndrome};
use bypass_sim::roce::{self, Endpoints, Link};
use bypass_sim::{Engine, Fabric, FabricConfig, WireConfig};
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::time::{Duration, Instant};

/// A fabric with one NIC at `addr`.
fn nic_at(addr: &str) -> (Fabric, bypass_sim::SimNic) {
    let wire = WireConfig::parse(&format!("udp://{addr}")).unwrap();
    let fabric = Fabric::with_config(FabricConfig { wire, ..FabricConfig::new(Engine::Threaded) });
    let nic = fabric.try_add_nic().unwrap_or_else(|e| panic!("cannot bind {addr}: {e}"));
    (fabric, nic)
}

fn peer_info(ip: Ipv4Addr, qpn: u32, psn: u32) -> QueueInfo {
    QueueInfo::new(ip.to_ipv6_mapped().octets(), qpn, psn) // lid 0: a standard RoCEv2 NIC
}

#[test]
fn a_nic_not_on_port_4791_refuses_a_standard_peer_and_says_how() {
    let (_f, nic) = nic_at("127.0.0.1:0");
    let cq = nic.create_cq(8).unwrap();
    let mut q = nic.create_queue(&QueueConfig::default(), &cq, &cq).unwrap();
    let e = q.connect(&peer_info(Ipv4Addr::new(127, 0, 0, 9), 0x11, 5)).unwrap_err().to_string();
    assert!(e.contains("standard") && e.contains("4791") && e.contains("sim+udp://127.0.0.1:4791"), "{e}");
    assert_eq!(q.state(), QueueState::Reset);
}

/// A standard peer at 127.0.0.43 (sockets on port 4791 and on a rxe-like source port) and a sim
/// NIC at 127.0.0.42:4791: the peer's SEND, whose ICRC covers IPv4 ID 0xBEEF, is delivered and
/// acknowledged to the peer's port 4791 with an ICRC over ID 0, the header the sim's socket sends.
#[test]
fn frames_from_a_standard_peer_are_accepted_and_answered_on_4791() {
    let sim_ip = Ipv4Addr::new(127, 0, 0, 42);
    let peer_ip = Ipv4Addr::new(127, 0, 0, 43);
    let (_f, nic) = nic_at("127.0.0.42:4791");
    let answers = UdpSocket::bind(SocketAddrV4::new(peer_ip, roce::ROCE_PORT)).unwrap();
    answers.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let requester = UdpSocket::bind(SocketAddrV4::new(peer_ip, 0xC132)).unwrap();
    let mut cq = nic.create_cq(8).unwrap();
    let mut q = nic.create_queue(&QueueConfig::default(), &cq, &cq).unwrap();
    let (peer_qpn, peer_psn) = (0x11, 0x00AB_CDEF);
    q.connect(&peer_info(peer_ip, peer_qpn, peer_psn)).unwrap();
    assert_eq!(q.state(), QueueState::Ready);
    let buf = nic.register(64, Access::LOCAL_WRITE).unwrap();
    q.post_recv(&[RecvWr { wr_id: 7, sges: &[buf.sge(0, 64).unwrap()] }]).unwrap();

    // The peer's SEND ONLY, as rxe would send it: its IPv4 ID (0xBEEF) is in the ICRC.
    let hdr = PacketHeader {
        kind: PacketKind::Send,
        dst_qpn: q.qpn(),
        src_qpn: peer_qpn,
        first: true,
        last: true,
        psn: peer_psn,
        payload_len: 5,
        ..Default::default()
    };
    let ep = Endpoints {
        src_ip: peer_ip.octets(),
        dst_ip: sim_ip.octets(),
        src_port: 0xC132,
        dst_port: roce::ROCE_PORT,
    };
    let link =
        Link { ip_id: 0xBEEF, ttl: 64, tos: 0, src_mac: [2, 0, 0, 0, 0, 1], dst_mac: [2, 0, 0, 0, 0, 2] };
    let mut frame = [0u8; 128];
    let n = roce::encode_ethernet(&hdr, b"hello", &ep, &link, &mut frame).unwrap();
    let udp_payload = &frame[roce::ETH_LEN + roce::IPV4_LEN + roce::UDP_LEN..n];
    // A corrupted copy first: dropped as malformed, not delivered.
    let mut bad = udp_payload.to_vec();
    bad[12] ^= 1;
    requester.send_to(&bad, SocketAddrV4::new(sim_ip, roce::ROCE_PORT)).unwrap();
    requester.send_to(udp_payload, SocketAddrV4::new(sim_ip, roce::ROCE_PORT)).unwrap();

    let mut wc = [Completion::default(); 4];
    let deadline = Instant::now() + Duration::from_secs(10);
    let got = loop {
        let k = cq.poll(&mut wc).unwrap();
        if k > 0 {
            break wc[0];
        }
        assert!(Instant::now() < deadline, "the standard peer's SEND never arrived ({:?})", nic.stats());
        std::thread::yield_now();
    };
    assert_eq!((got.wr_id, got.status, got.byte_len), (7, Status::Success, 5));
    let mut bytes = [0u8; 5];
    buf.read(0, &mut bytes).unwrap();
    assert_eq!(&bytes, b"hello");
    assert_eq!(nic.stats().rx_malformed, 1, "the corrupted copy was counted");

    // The ACK: to port 4791, from the sim's port 4791, ICRC over ID 0.
    let mut ack = [0u8; 256];
    let (len, from) = answers.recv_from(&mut ack).expect("an ACK to the peer's port 4791");
    assert_eq!(from, std::net::SocketAddr::V4(SocketAddrV4::new(sim_ip, roce::ROCE_PORT)));
    let ep_back = Endpoints {
        src_ip: sim_ip.octets(),
        dst_ip: peer_ip.octets(),
        src_port: roce::ROCE_PORT,
        dst_port: roce::ROCE_PORT,
    };
    let f = roce::decode_udp(&ack[..len], &ep_back).expect("the ACK's ICRC is over IPv4 ID 0");
    assert_eq!(f.opcode, roce::Opcode::Acknowledge);
    assert_eq!((f.dest_qp, f.psn, f.pkey), (peer_qpn, peer_psn, 0xFFFF));
    assert_eq!(f.aeth.and_then(|a| a.meaning()), Some(Syndrome::Ack));
    assert!(!f.ack_req, "responses never ask for an ACK");
}
