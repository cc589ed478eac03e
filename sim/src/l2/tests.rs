//! The L2 wire's encapsulation, ARP and receive filter, driven by hand through one end of an
//! in-memory pair (the other end is the test's).

use super::pair::{l2_pair, PairConfig, PairPort};
use super::*;
use crate::packet::PacketKind;
use bypass_hal::l2::L2Port;

const A: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 1);
const B: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 2);
const B_MAC: Mac = [0x02, 0, 0, 0, 0, 2];

/// The wire on end A (10.99.0.1) and the raw end B.
fn wire() -> (Arc<L2Wire>, PairPort) {
    let (a, b, _) = l2_pair(PairConfig::default()).unwrap();
    let w = L2Wire::new(L2Attachment { port: Box::new(a), addr: L2Addr::new(A) }, 0, None).unwrap();
    (Arc::new(w), b)
}

fn frames_at(b: &mut PairPort) -> Vec<Vec<u8>> {
    let mut out = vec![];
    b.recv(1000, &mut |f: &[u8]| out.push(f.to_vec())).unwrap();
    out
}

fn arp_frame(op: arp::Op, sender_mac: Mac, sender_ip: Ipv4Addr, target_ip: Ipv4Addr, dst: Mac) -> [u8; 60] {
    let a = arp::Arp { op, sender_mac, sender_ip, target_mac: [0; 6], target_ip };
    let mut f = [0u8; arp::ARP_FRAME_LEN];
    a.write(dst, &mut f);
    f
}

fn drain_all(w: &L2Wire) -> Vec<(PacketHeader, Vec<u8>)> {
    let mut got = vec![];
    w.drain(0, &mut |h, p| got.push((*h, p.to_vec())));
    got
}

fn send_hdr(len: u32) -> PacketHeader {
    PacketHeader {
        src_qpn: 0x11,
        dst_qpn: 0x12,
        kind: PacketKind::Send,
        first: true,
        last: true,
        psn: 7,
        payload_len: len,
        ..Default::default()
    }
}

#[test]
fn answers_arp_for_its_address_only() {
    let (w, mut b) = wire();
    let req = arp_frame(arp::Op::Request, B_MAC, B, A, [0xFF; 6]);
    let other = arp_frame(arp::Op::Request, B_MAC, B, Ipv4Addr::new(10, 99, 0, 3), [0xFF; 6]);
    b.send(&[&req, &other]).unwrap();
    assert!(drain_all(&w).is_empty());
    let out = frames_at(&mut b);
    assert_eq!(out.len(), 1, "one reply, for our address; none for 10.99.0.3");
    let reply = arp::Arp::parse(&out[0]).unwrap();
    assert_eq!(&out[0][0..6], &B_MAC, "unicast to the asker");
    assert_eq!(reply.op, arp::Op::Reply);
    assert_eq!((reply.sender_mac, reply.sender_ip), (w.mac, A));
    assert_eq!((reply.target_mac, reply.target_ip), (B_MAC, B));
    // The asker was learnt: no request is needed to reach it.
    assert_eq!(w.lock().neigh.mac_of(B), Some(B_MAC));
}

#[test]
fn encapsulates_as_rxe_does() {
    let (w, mut b) = wire();
    // B announces itself (a request for our address teaches us its MAC).
    b.send(&[&arp_frame(arp::Op::Request, B_MAC, B, A, [0xFF; 6])]).unwrap();
    drain_all(&w);
    frames_at(&mut b);
    let payload: Vec<u8> = (0..1001u32).map(|i| i as u8).collect();
    let hdr = send_hdr(payload.len() as u32);
    let sent = w.transmit(B, B, &hdr, &mut |buf: &mut [u8]| buf.copy_from_slice(&payload));
    assert_eq!(sent, Transmit::Sent);
    assert!(frames_at(&mut b).is_empty(), "nothing leaves before the flush");
    w.flush();
    let out = frames_at(&mut b);
    assert_eq!(out.len(), 1);
    let f = &out[0];
    // The existing codec reads it whole: IPv4 checksum, UDP to 4791, ICRC over these headers.
    let e = roce::decode_ethernet(f).expect("our frame decodes");
    assert_eq!(e.link.dst_mac, B_MAC);
    assert_eq!(e.link.src_mac, w.mac);
    assert_eq!((e.link.ip_id, e.link.ttl, e.link.tos), (0, 64, 0));
    assert_eq!(e.endpoints.src_ip, A.octets());
    assert_eq!(e.endpoints.dst_ip, B.octets());
    assert_eq!(e.endpoints.src_port, 0xC132, "rxe's entropy port of QPNs 0x11 and 0x12");
    assert_eq!(e.endpoints.dst_port, 4791);
    assert_eq!(&f[20..22], &[0x40, 0x00], "DF set, not a fragment");
    assert_eq!(&f[40..42], &[0, 0], "UDP checksum 0");
    assert_eq!(e.frame.opcode, roce::Opcode::SendOnly);
    assert_eq!(e.frame.payload, &payload[..]);
    assert_eq!(f.len(), encap::HEADERS + roce::BTH_LEN + 1004 + roce::ICRC_LEN);
    // Another queue pair gets another source port (entropy per QP), the same both ways.
    let other = PacketHeader { src_qpn: 0x21, dst_qpn: 0x12, ..hdr };
    w.transmit(B, B, &other, &mut |buf: &mut [u8]| buf.copy_from_slice(&payload));
    w.flush();
    let out = frames_at(&mut b);
    let e2 = roce::decode_ethernet(&out[0]).unwrap();
    assert_ne!(e2.endpoints.src_port, 0xC132);
    assert_eq!(e2.endpoints.src_port, roce::udp_source_port(0x12, 0x21));
}

#[test]
fn an_rxe_shaped_frame_is_accepted() {
    let (w, mut b) = wire();
    let id = w.peer_id(B);
    // What rxe sends: any IPv4 ID, DF, TTL 64, its entropy port, UDP checksum 0.
    let hdr = PacketHeader { psn: 0x0012_3456, ..send_hdr(8) };
    let ep = Endpoints { src_ip: B.octets(), dst_ip: A.octets(), src_port: 0xC132, dst_port: 4791 };
    let link = roce::Link { src_mac: B_MAC, dst_mac: w.mac, ip_id: 0x1234, ttl: 64, tos: 0 };
    let mut f = [0u8; 128];
    let n = roce::encode_ethernet(&hdr, b"rxe-said", &ep, &link, &mut f).unwrap();
    b.send(&[&f[..n]]).unwrap();
    let got = drain_all(&w);
    assert_eq!(got.len(), 1);
    let (h, p) = &got[0];
    assert_eq!((h.src_nic, h.dst_nic, h.dst_qpn, h.psn), (id, 0, 0x12, 0x0012_3456));
    assert_eq!(h.kind, PacketKind::Send);
    assert_eq!(p, b"rxe-said");
}

#[test]
fn frames_not_for_us_are_dropped_before_decoding() {
    let (w, mut b) = wire();
    w.peer_id(B);
    let hdr = send_hdr(8);
    let ep = Endpoints { src_ip: B.octets(), dst_ip: A.octets(), src_port: 0xC132, dst_port: 4791 };
    let link = roce::Link { src_mac: B_MAC, dst_mac: w.mac, ip_id: 1, ttl: 64, tos: 0 };
    let mut good = [0u8; 128];
    let n = roce::encode_ethernet(&hdr, b"12345678", &ep, &link, &mut good).unwrap();
    let good = &good[..n];
    let mut wrong_mac = good.to_vec();
    wrong_mac[5] ^= 1;
    let mut wrong_ip = good.to_vec();
    wrong_ip[33] ^= 1; // destination address (the checksum is not even looked at)
    let mut wrong_port = good.to_vec();
    wrong_port[37] ^= 1;
    let mut bad_ip_sum = good.to_vec();
    bad_ip_sum[24] ^= 1;
    let mut bad_icrc = good.to_vec();
    let last = bad_icrc.len() - 1;
    bad_icrc[last] ^= 1;
    let mut from_stranger = good.to_vec(); // a valid frame from an address no queue knows
    let ep2 = Endpoints { src_ip: [10, 99, 0, 7], ..ep };
    let n2 = roce::encode_ethernet(&hdr, b"12345678", &ep2, &link, &mut from_stranger).unwrap();
    from_stranger.truncate(n2);
    b.send(&[&wrong_mac, &wrong_ip, &wrong_port, &bad_ip_sum, &bad_icrc, &from_stranger, &[0u8; 14]])
        .unwrap();
    assert!(drain_all(&w).is_empty());
    assert_eq!(
        w.stats.not_ours.load(Ordering::Relaxed),
        4,
        "other MAC, address, port; the 14-byte non-IP frame"
    );
    assert_eq!(w.stats.malformed.load(Ordering::Relaxed), 2, "bad IPv4 checksum, bad ICRC");
    assert_eq!(w.stats.unknown_peer.load(Ordering::Relaxed), 1);
    b.send(&[good]).unwrap();
    assert_eq!(drain_all(&w).len(), 1, "and the good frame still goes through");
}

#[test]
fn frames_wait_for_arp_then_go() {
    let (w, mut b) = wire();
    let hdr = send_hdr(4);
    for _ in 0..3 {
        assert_eq!(w.transmit(B, B, &hdr, &mut |buf: &mut [u8]| buf.fill(9)), Transmit::Sent);
    }
    w.flush();
    let out = frames_at(&mut b);
    assert_eq!(out.len(), 1, "one ARP request for three held frames");
    let req = arp::Arp::parse(&out[0]).unwrap();
    assert_eq!((req.op, req.sender_ip, req.target_ip), (arp::Op::Request, A, B));
    assert_eq!(&out[0][0..6], &[0xFF; 6]);
    b.send(&[&arp_frame(arp::Op::Reply, B_MAC, B, A, w.mac)]).unwrap();
    drain_all(&w);
    let out = frames_at(&mut b);
    assert_eq!(out.len(), 3, "the held frames leave once B answers");
    for f in &out {
        let e = roce::decode_ethernet(f).unwrap();
        assert_eq!(e.link.dst_mac, B_MAC);
    }
}

#[test]
fn an_unanswered_peer_fails_to_connect_with_a_reason() {
    let (w, mut b) = wire();
    let info = |ip: Ipv4Addr, lid: u16| {
        let mut q = QueueInfo::default();
        q.gid = crate::udp::gid_of(ip);
        q.lid = lid;
        q
    };
    let peer = info(Ipv4Addr::new(10, 99, 0, 7), 0);
    let err = w.clone().connect(&peer).err().expect("nobody answers");
    assert!(err.contains("no ARP reply from 10.99.0.7 after 5 requests"), "{err}");
    let requests = frames_at(&mut b).iter().filter(|f| arp::Arp::parse(f).is_some()).count();
    assert_eq!(requests, 5);
    // Off the subnet with no gateway: refused at once.
    let far = info(Ipv4Addr::new(192, 0, 2, 1), 0);
    let err = w.clone().connect(&far).err().unwrap();
    assert!(err.contains("not on this L2 port's subnet"), "{err}");
    // A sim NIC of the UDP wire (its lid is its port) is refused with the reason.
    let udp = info(B, 4000);
    let err = w.connect(&udp).err().unwrap();
    assert!(err.contains("UDP wire"), "{err}");
}

#[test]
fn addresses_are_checked() {
    assert!(L2Addr::new(Ipv4Addr::UNSPECIFIED).check().is_err());
    assert!(L2Addr { gateway: Some(Ipv4Addr::new(10, 1, 0, 1)), ..L2Addr::new(A) }.check().is_err());
    assert!(L2Addr { gateway: Some(Ipv4Addr::new(10, 99, 0, 254)), ..L2Addr::new(A) }.check().is_ok());
    let a = L2Addr { prefix: 16, ..L2Addr::new(A) };
    assert!(a.on_link(Ipv4Addr::new(10, 99, 7, 7)) && !a.on_link(Ipv4Addr::new(10, 98, 0, 1)));
    let (p, _, _) = l2_pair(PairConfig { mtu: 200, ..PairConfig::default() }).unwrap();
    let e = L2Wire::new(L2Attachment { port: Box::new(p), addr: L2Addr::new(A) }, 0, None).err().unwrap();
    assert!(e.to_string().contains("MTU of 200 bytes"), "{e}");
}

#[test]
fn wire_strings_parse_or_say_why_not() {
    assert!(parse_wire("udp://127.0.0.1:0").is_none());
    assert_eq!(parse_wire("l2:pair").unwrap().unwrap().len(), 2);
    assert!(parse_wire("l2:pair,loss_ppm=1000").unwrap().is_ok());
    let e = parse_wire("l2:pair,loss_ppm=2000000").unwrap().err().unwrap();
    assert!(e.contains("0 to 999999"), "{e}");
    let e = parse_wire("l2:cable").unwrap().err().unwrap();
    assert!(e.contains("expected l2:pair"), "{e}");
    let a = L2Addr::parse_options("ip=10.99.0.2/16,gw=10.99.255.254").unwrap();
    assert_eq!((a.ip, a.prefix, a.gateway), (B, 16, Some(Ipv4Addr::new(10, 99, 255, 254))));
    for (bad, why) in [
        ("", "needs ip="),
        ("ip=10.99.0", "bad IPv4 address"),
        ("ip=10.99.0.2/40", "more than 32"),
        ("ip=10.99.0.2,mtu=9000", "unknown L2 option \"mtu\""),
        ("ip=0.0.0.0", "unicast"),
    ] {
        let e = L2Addr::parse_options(bad).err().unwrap();
        assert!(e.contains(why), "{bad}: {e}");
    }
    let e = parse_wire("packet://no-such-if0,ip=10.99.0.2").unwrap().err().unwrap();
    assert!(e.contains("no network interface \"no-such-if0\""), "{e}");
}
