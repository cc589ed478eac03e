//! The RoCEv2 encoding of sim packets (`bypass_sim::roce`):
//!
//! - golden frames, byte for byte. Their bytes were computed independently of this crate by
//!   `sim/tests/roce_golden.py` (struct.pack and zlib.crc32 over the masked pseudo-header, and
//!   scapy's contrib/roce.py, which builds the same bytes with its own IPv4 checksum and ICRC
//!   code); the first is the worked example of `shared/reference/rocev2.md`, which tshark 4.0.17
//!   and scapy were checked against, and one ICRC is checked against a ConnectX-4 Lx capture;
//! - one test per decoding error;
//! - properties over many seeded random headers: encode → decode gives the header back (less
//!   what the wire does not carry), and no truncation or byte flip panics or gets through the
//!   ICRC.

mod tshark;

use bypass_sim::packet::{PacketHeader, PacketKind, Syndrome};
use bypass_sim::roce::{self, icrc, Endpoints, Frame, FrameError, Link, Opcode, Reth, RxContext};

fn hex(s: &str) -> Vec<u8> {
    let s: Vec<u8> = s.bytes().filter(|b| b.is_ascii_hexdigit()).collect();
    s.chunks(2).map(|p| u8::from_str_radix(std::str::from_utf8(p).unwrap(), 16).unwrap()).collect()
}

/// Encodes `hdr` at both levels, as the capture does (fabric 1), and checks they agree.
fn encode(hdr: &PacketHeader, payload: &[u8], ep: &Endpoints, link: &Link) -> Vec<u8> {
    let mut eth = vec![0u8; roce::ethernet_len(hdr)];
    let n = roce::encode_ethernet(hdr, payload, ep, link, &mut eth).unwrap();
    assert_eq!(n, eth.len());
    let mut udp = vec![0u8; roce::udp_len(hdr)];
    assert_eq!(roce::encode_udp(hdr, payload, ep, &mut udp), Ok(udp.len()));
    if link.ip_id == 0 {
        assert_eq!(udp[..], eth[42..], "the UDP payload is the tail of the Ethernet frame");
    }
    eth
}

fn sim_encode(hdr: &PacketHeader, payload: &[u8]) -> Vec<u8> {
    encode(hdr, payload, &Endpoints::of_packet(hdr).unwrap(), &Link::of_packet(1, hdr))
}

/// A request from NIC 1 queue 3 to NIC 2 queue 4.
fn req(kind: PacketKind, psn: u32, payload: &[u8]) -> PacketHeader {
    PacketHeader {
        src_nic: 1,
        dst_nic: 2,
        src_qpn: 3,
        dst_qpn: 4,
        kind,
        first: true,
        last: true,
        psn,
        payload_len: payload.len() as u32,
        ..Default::default()
    }
}

/// A response from NIC 2 queue 4 to NIC 1 queue 3.
fn resp(kind: PacketKind, psn: u32, payload: &[u8]) -> PacketHeader {
    PacketHeader { src_nic: 2, dst_nic: 1, src_qpn: 4, dst_qpn: 3, ..req(kind, psn, payload) }
}

struct Golden {
    name: &'static str,
    hdr: PacketHeader,
    payload: &'static [u8],
    bytes: &'static str,
}

fn goldens() -> Vec<Golden> {
    let write_first = PacketHeader {
        last: false,
        remote_addr: 0x0000_7F00_1234_5000,
        rkey: 0x00AB_CDEF,
        dma_len: 10_000,
        ..req(PacketKind::Write, 100, &[0; 16])
    };
    const COUNT: [u8; 16] = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15];
    vec![
        Golden {
            name: "SEND_ONLY, solicited, 5 bytes (pad 3), PSN above 2^24",
            hdr: PacketHeader { solicited: true, ..req(PacketKind::Send, 0x01AB_CDEF, b"hello") },
            payload: b"hello",
            bytes: "020001000002 020001000001 0800
                    4500003400004000401126b70a0000010a000002
                    c00c12b700200000
                    04b0ffff0000000480abcdef
                    68656c6c6f000000
                    77c37e5c",
        },
        Golden {
            name: "SEND_ONLY, zero length",
            hdr: req(PacketKind::Send, 1, b""),
            payload: b"",
            bytes: "020001000002 020001000001 0800
                    4500002c00004000401126bf0a0000010a000002
                    c00c12b700180000
                    0400ffff0000000480000001
                    b252d436",
        },
        Golden {
            name: "SEND_ONLY_WITH_IMMEDIATE",
            hdr: PacketHeader { has_imm: true, imm: 0xDEAD_BEEF, ..req(PacketKind::Send, 7, b"imm!") },
            payload: b"imm!",
            bytes: "020001000002 020001000001 0800
                    4500003400004000401126b70a0000010a000002
                    c00c12b700200000
                    0500ffff0000000480000007
                    deadbeef
                    696d6d21
                    208db8f7",
        },
        Golden {
            name: "RDMA_WRITE_FIRST (RETH)",
            hdr: write_first,
            payload: &COUNT,
            bytes: "020001000002 020001000001 0800
                    4500004c000040004011269f0a0000010a000002
                    c00c12b700380000
                    0600ffff0000000400000064
                    00007f0012345000 00abcdef 00002710
                    000102030405060708090a0b0c0d0e0f
                    75762dbf",
        },
        Golden {
            name: "RDMA_WRITE_ONLY_WITH_IMMEDIATE (RETH, ImmDt), solicited, PSN 2^24 - 1",
            hdr: PacketHeader {
                has_imm: true,
                imm: 0x0102_0304,
                solicited: true,
                remote_addr: 0x2000,
                rkey: 0x77,
                dma_len: 3,
                ..req(PacketKind::Write, 0x00FF_FFFF, b"xyz")
            },
            payload: b"xyz",
            bytes: "020001000002 020001000001 0800
                    4500004400004000401126a70a0000010a000002
                    c00c12b700300000
                    0b90ffff0000000480ffffff
                    0000000000002000 00000077 00000003
                    01020304
                    78797a00
                    ef5ef4a0",
        },
        Golden {
            name: "RDMA_READ_REQUEST (RETH) for two segments",
            hdr: PacketHeader {
                last: false,
                remote_addr: 0x1000,
                rkey: 0x1234_5678,
                dma_len: 8192,
                ..req(PacketKind::ReadRequest, 200, b"")
            },
            payload: b"",
            bytes: "020001000002 020001000001 0800
                    4500003c00004000401126af0a0000010a000002
                    c00c12b700280000
                    0c00ffff00000004800000c8
                    0000000000001000 12345678 00002000
                    e1162adb",
        },
        Golden {
            name: "RDMA_READ_RESPONSE_ONLY (AETH), 7 bytes (pad 1)",
            hdr: resp(PacketKind::ReadResponse, 200, b"ABCDEFG"),
            payload: b"ABCDEFG",
            bytes: "020001000001 020001000002 0800
                    4500003800004000401126b30a0000020a000001
                    c00c12b700240000
                    1010ffff00000003000000c8
                    1f000000
                    4142434445464700
                    b2cd10ba",
        },
        Golden {
            name: "ACKNOWLEDGE: ACK",
            hdr: PacketHeader { first: false, last: false, ..resp(PacketKind::Ack, 100, b"") },
            payload: b"",
            bytes: "020001000001 020001000002 0800
                    4500003000004000401126bb0a0000020a000001
                    c00c12b7001c0000
                    1100ffff0000000300000064
                    1f000000
                    f1b8dd39",
        },
        Golden {
            name: "ACKNOWLEDGE: RNR NAK, 100 µs → timer code 7 (120 µs)",
            hdr: PacketHeader { syndrome: Syndrome::RnrNak(100_000), ..resp(PacketKind::Ack, 7, b"") },
            payload: b"",
            bytes: "020001000001 020001000002 0800
                    4500003000004000401126bb0a0000020a000001
                    c00c12b7001c0000
                    1100ffff0000000300000007
                    27000000
                    2265d0d2",
        },
        Golden {
            name: "ACKNOWLEDGE: NAK PSN sequence error",
            hdr: PacketHeader { syndrome: Syndrome::NakSequence, ..resp(PacketKind::Ack, 0x0A_BCDE, b"") },
            payload: b"",
            bytes: "020001000001 020001000002 0800
                    4500003000004000401126bb0a0000020a000001
                    c00c12b7001c0000
                    1100ffff00000003000abcde
                    60000000
                    ce948e99",
        },
    ]
}

#[test]
fn golden_frames() {
    for g in goldens() {
        let want = hex(g.bytes);
        let got = sim_encode(&g.hdr, g.payload);
        assert_eq!(
            got,
            want,
            "{}: encoded\n{}",
            g.name,
            got.iter().map(|b| format!("{b:02x}")).collect::<String>()
        );
        let f = roce::decode_ethernet(&want).unwrap_or_else(|e| panic!("{}: {e}", g.name));
        assert_eq!(f.frame, Frame::of_packet(&g.hdr, g.payload), "{}", g.name);
        assert_eq!((f.src_nic(), f.dst_nic()), (Some(g.hdr.src_nic), Some(g.hdr.dst_nic)));
        assert_eq!(roce::decode_udp(&want[42..], &f.endpoints), Ok(f.frame), "{}", g.name);
    }
}

#[test]
fn golden_frames_mean_what_their_names_say() {
    let g = goldens();
    let dec: Vec<Frame<'_>> = g.iter().map(|g| Frame::of_packet(&g.hdr, g.payload)).collect();
    let ops: Vec<Opcode> = dec.iter().map(|f| f.opcode).collect();
    use Opcode::*;
    assert_eq!(
        ops,
        [
            SendOnly,
            SendOnly,
            SendOnlyWithImmediate,
            RdmaWriteFirst,
            RdmaWriteOnlyWithImmediate,
            RdmaReadRequest,
            RdmaReadResponseOnly,
            Acknowledge,
            Acknowledge,
            Acknowledge
        ]
    );
    assert!(dec[0].solicited && dec[0].ack_req && dec[0].psn == 0xAB_CDEF);
    assert!(!dec[3].ack_req, "AckReq only on the last segment");
    assert_eq!(dec[3].reth, Some(Reth { va: 0x7F00_1234_5000, rkey: 0xAB_CDEF, len: 10_000 }));
    assert!(dec[5].ack_req, "a READ request asks for an answer");
    assert_eq!(dec[8].aeth.map(|a| (a.syndrome, a.msn)), Some((0x27, 0)));
    assert_eq!(dec[8].aeth.unwrap().meaning(), Some(Syndrome::RnrNak(120_000)));
}

/// `shared/reference/rocev2.md` §5: SEND_ONLY "abcd" from 192.0.2.1 to 192.0.2.2, IP ID 0x1234,
/// source port 0xC132 (rxe's hash of QPNs 0x11 and 0x12), ICRC bytes 66 54 29 4e.
#[test]
fn reproduces_the_worked_example_of_the_reference() {
    let hdr = PacketHeader { src_qpn: 0x11, dst_qpn: 0x12, ..req(PacketKind::Send, 0, b"abcd") };
    let ep = Endpoints {
        src_ip: [192, 0, 2, 1],
        dst_ip: [192, 0, 2, 2],
        src_port: roce::udp_source_port(0x11, 0x12),
        dst_port: roce::ROCE_PORT,
    };
    let link =
        Link { src_mac: [2, 0, 0, 0, 0, 1], dst_mac: [2, 0, 0, 0, 0, 2], ip_id: 0x1234, ttl: 64, tos: 0 };
    let want = hex("02 00 00 00 00 02 02 00 00 00 00 01 08 00
                    45 00 00 30 12 34 40 00 40 11 a4 85 c0 00 02 01 c0 00 02 02
                    c1 32 12 b7 00 1c 00 00
                    04 00 ff ff 00 00 00 12 80 00 00 00
                    61 62 63 64
                    66 54 29 4e");
    assert_eq!(encode(&hdr, b"abcd", &ep, &link), want);
    // The CRC input of the reference, hashed with the crate's CRC-32, gives the same value.
    let input = hex("ff ff ff ff ff ff ff ff 45 ff 00 30 12 34 40 00 ff 11 ff ff c0 00 02 01 c0 00 02 02
                     c1 32 12 b7 00 1c ff ff 04 00 ff ff ff 00 00 12 80 00 00 00 61 62 63 64");
    assert_eq!(icrc::crc32(&input), 0x4E29_5466);
    let f = roce::decode_ethernet(&want).unwrap();
    assert_eq!((f.link, f.endpoints), (link, ep));
}

/// Third-party vectors from scapy's `test/contrib/roce.uts`: a CNP captured on a Mellanox
/// ConnectX-4 Lx (ICRC bytes 82 fd 00 2a), and a UC SEND_ONLY with MigReq and pad 2 whose ICRC
/// scapy gives as 0x78f353f3 (read big-endian, as Wireshark shows it). Both are not RC, so the
/// decoder accepts their ICRC and then refuses the opcode.
#[test]
fn icrc_matches_third_party_frames() {
    let cnp = hex("e41d 2dab 2bc2 7cfe 9064 3b32 0800 45c2
                   003c 718c 4000 4011 9161 0a00 1101 0a00
                   1201 0000 12b7 0028 0000 8100 ffff 4000
                   0118 0000 0000 0000 0000 0000 0000 0000
                   0000 0000 0000 82fd 002a");
    let (ip, udp) = (cnp[14..34].try_into().unwrap(), cnp[34..42].try_into().unwrap());
    assert_eq!(icrc::icrc_ipv4(ip, udp, &cnp[42..cnp.len() - 4]).to_le_bytes(), [0x82, 0xfd, 0x00, 0x2a]);
    assert_eq!(roce::decode_ethernet(&cnp).map(|_| ()), Err(FrameError::NotRc(0x81)));

    // Ether / IP(tos=1, id=1144, DF, ttl=64, 192.168.0.7 → 192.168.0.7) / UDP(49152 → 4791) /
    // BTH(UC_SEND_ONLY, migreq=1, padcount=2, dqpn=211, psn=13571856) / 20 payload bytes.
    let mut ip = [0u8; 20];
    ip[..12].copy_from_slice(&hex("45 01 0040 0478 4000 40 11 0000"));
    ip[12..].copy_from_slice(&[192, 168, 0, 7, 192, 168, 0, 7]);
    let sum = icrc::ipv4_checksum(&ip);
    ip[10..12].copy_from_slice(&sum.to_be_bytes());
    assert_eq!(sum, 0xb4d5, "scapy's test gives this IPv4 checksum");
    let udp: [u8; 8] = hex("c000 12b7 002c aca2").try_into().unwrap();
    let mut transport = hex("24 60 ffff 00 0000d3 00 cf1710"); // PSN 13571856 = 0xCF1710
    transport.extend_from_slice(b"F0\x81\x8b\xe2\x895\xd9\x0e\x9a\x95PT\x01\xbe\x88^P\x00\x00");
    assert_eq!(icrc::icrc_ipv4(&ip, &udp, &transport).to_le_bytes(), 0x78f3_53f3u32.to_be_bytes());
}

/// A valid UDP payload `transport ‖ ICRC` between the golden endpoints.
fn sealed(transport: &[u8]) -> (Vec<u8>, Endpoints) {
    let ep = Endpoints::of_packet(&req(PacketKind::Send, 0, b"")).unwrap();
    let mut v = transport.to_vec();
    v.extend_from_slice(&roce::udp_icrc(&ep, transport).to_le_bytes());
    (v, ep)
}

#[test]
fn each_malformed_udp_payload_has_its_error() {
    let bth = |op: u8, b1: u8, pkey: u16| {
        let mut v = vec![op, b1];
        v.extend_from_slice(&pkey.to_be_bytes());
        v.extend_from_slice(&[0, 0, 0, 4, 0x80, 0, 0, 9]);
        v
    };
    let with = |mut v: Vec<u8>, more: &[u8]| {
        v.extend_from_slice(more);
        v
    };
    let check = |transport: Vec<u8>, want: FrameError| {
        let (bytes, ep) = sealed(&transport);
        assert_eq!(roce::decode_udp(&bytes, &ep), Err(want), "{transport:02x?}");
    };
    let ep = Endpoints::of_packet(&req(PacketKind::Send, 0, b"")).unwrap();
    assert_eq!(roce::decode_udp(&[0; 15], &ep), Err(FrameError::TooShort { len: 15, need: 16 }));
    assert_eq!(roce::decode_udp(&[], &ep), Err(FrameError::TooShort { len: 0, need: 16 }));
    let big = vec![0u8; roce::MAX_UDP_PAYLOAD + 1];
    assert_eq!(roce::decode_udp(&big, &ep), Err(FrameError::TooLong(big.len())));

    let ok = sealed(&with(bth(0x04, 0, 0xFFFF), b"abcd"));
    assert!(roce::decode_udp(&ok.0, &ok.1).is_ok());
    let mut bad = ok.0.clone();
    bad[12] ^= 1;
    assert!(matches!(roce::decode_udp(&bad, &ok.1), Err(FrameError::BadIcrc { .. })));
    let other = Endpoints { src_ip: [10, 0, 0, 9], ..ok.1 };
    assert!(matches!(roce::decode_udp(&ok.0, &other), Err(FrameError::BadIcrc { .. })), "endpoints count");

    check(with(bth(0x04, 0x01, 0xFFFF), b"abcd"), FrameError::BadVersion(1));
    check(with(bth(0x24, 0, 0xFFFF), b"abcd"), FrameError::NotRc(0x24)); // UC SEND_ONLY
    check(with(bth(0x66, 0, 0xFFFF), b"abcd"), FrameError::NotRc(0x66)); // UD, not SEND_ONLY
                                                                         // UD SEND_ONLY is a datagram (UM): its DETH (8 bytes) must follow the BTH.
    check(with(bth(0x64, 0, 0xFFFF), b"abcd"), FrameError::TooShort { len: 20, need: 24 });
    check(bth(0x16, 0, 0xFFFF), FrameError::UnsupportedOpcode(0x16)); // SEND_LAST_WITH_INVALIDATE
    check(bth(0x15, 0, 0xFFFF), FrameError::UnknownOpcode(0x15));
    check(with(bth(0x04, 0, 0x8001), b"abcd"), FrameError::BadPartition(0x8001));
    assert!(roce::decode_udp(&sealed(&with(bth(0x04, 0, 0x7FFF), b"abcd")).0, &ep).is_ok(), "limited member");
    check(with(bth(0x11, 0x10, 0xFFFF), &[0x1F, 0, 0, 0]), FrameError::BadPad(1)); // ACK with a pad
    check(with(bth(0x04, 0x30, 0xFFFF), b""), FrameError::BadPad(3)); // pad larger than the bytes
    check(with(bth(0x04, 0, 0xFFFF), b"hello"), FrameError::Unaligned(5));
    check(
        with(bth(0x11, 0, 0xFFFF), &[0x1F, 0, 0, 0, 1, 2, 3, 4]),
        FrameError::UnexpectedPayload(Opcode::Acknowledge),
    );
    check(with(bth(0x0C, 0, 0xFFFF), &[0; 20]), FrameError::UnexpectedPayload(Opcode::RdmaReadRequest));
    check(with(bth(0x11, 0, 0xFFFF), &[0x40, 0, 0, 0]), FrameError::BadSyndrome(0x40));
    check(with(bth(0x11, 0, 0xFFFF), &[0x64, 0, 0, 0]), FrameError::BadSyndrome(0x64));
    check(with(bth(0x11, 0, 0xFFFF), &[0x80, 0, 0, 0]), FrameError::BadSyndrome(0x80));
    check(with(bth(0x10, 0, 0xFFFF), &[0x60, 0, 0, 0]), FrameError::BadSyndrome(0x60)); // NAK on a READ response
    check(with(bth(0x06, 0, 0xFFFF), &[0; 8]), FrameError::TooShort { len: 24, need: 32 }); // RETH cut short
    check(bth(0x11, 0, 0xFFFF), FrameError::TooShort { len: 16, need: 20 }); // no AETH
}

#[test]
fn each_malformed_ethernet_frame_has_its_error() {
    let g = &goldens()[0];
    let good = sim_encode(&g.hdr, g.payload);
    assert!(roce::decode_ethernet(&good).is_ok());
    // Edits that keep or fix the IPv4 checksum, so the error is the intended one.
    let edit = |at: usize, v: &[u8], fix_ip_sum: bool| {
        let mut f = good.clone();
        f[at..at + v.len()].copy_from_slice(v);
        if fix_ip_sum {
            f[24..26].fill(0);
            let s = icrc::ipv4_checksum(&f[14..34]);
            f[24..26].copy_from_slice(&s.to_be_bytes());
        }
        roce::decode_ethernet(&f).map(|_| ())
    };
    assert_eq!(
        roce::decode_ethernet(&good[..10]).map(|_| ()),
        Err(FrameError::TooShort { len: 10, need: 58 })
    );
    assert_eq!(edit(12, &[0x86, 0xDD], false), Err(FrameError::NotIpv4(0x86DD)));
    assert_eq!(edit(14, &[0x46], true), Err(FrameError::BadIpHeader(0x46)));
    assert_eq!(edit(22, &[0x3F], false), Err(FrameError::BadIpChecksum)); // TTL changed, sum not
    assert_eq!(edit(20, &[0x20, 0x00], true), Err(FrameError::Fragmented)); // MF
    assert_eq!(edit(20, &[0x00, 0x08], true), Err(FrameError::Fragmented)); // offset
    assert_eq!(edit(23, &[6], true), Err(FrameError::NotUdp(6)));
    assert_eq!(edit(36, &[0x12, 0xB8], false), Err(FrameError::NotRoce(4792)));
    assert_eq!(edit(38, &[0x00, 0x1F], false), Err(FrameError::BadLength)); // UDP length
    assert_eq!(edit(16, &[0x00, 0x10], true), Err(FrameError::BadLength)); // IP length < 28
    assert_eq!(edit(16, &[0x00, 0x40], true), Err(FrameError::TooShort { len: 66, need: 78 }));
    assert_eq!(edit(40, &[0x12, 0x34], false), Err(FrameError::BadUdpChecksum));
    // TTL and TOS are not in the ICRC: a router may change them (and fix the IPv4 checksum).
    assert!(edit(22, &[0x01], true).is_ok());
    assert!(edit(15, &[0xB8], true).is_ok());
    // A correct UDP checksum is accepted, and Ethernet padding after the datagram ignored.
    let mut f = good.clone();
    let (src, dst) = (f[26..30].try_into().unwrap(), f[30..34].try_into().unwrap());
    let sum = icrc::udp_checksum(src, dst, &f[34..]);
    f[40..42].copy_from_slice(&sum.to_be_bytes());
    f.extend_from_slice(&[0; 6]);
    assert_eq!(roce::decode_ethernet(&f).map(|e| e.frame), roce::decode_ethernet(&good).map(|e| e.frame));
}

#[test]
fn encoding_refuses_what_it_cannot_encode() {
    let h = req(PacketKind::Send, 0, b"abcd");
    let ep = Endpoints::of_packet(&h).unwrap();
    let mut small = [0u8; 19];
    assert_eq!(
        roce::encode_udp(&h, b"abcd", &ep, &mut small),
        Err(roce::EncodeError::BufferTooSmall { need: 20, have: 19 })
    );
    assert_eq!(
        roce::encode_udp(&h, b"abc", &ep, &mut [0; 64]),
        Err(roce::EncodeError::PayloadLength { expected: 4, got: 3 })
    );
    let ack = PacketHeader { payload_len: 4, ..resp(PacketKind::Ack, 0, b"") };
    assert!(matches!(
        roce::encode_udp(&ack, b"abcd", &ep, &mut [0; 64]),
        Err(roce::EncodeError::PayloadLength { .. })
    ));
    let huge = vec![0u8; roce::MAX_UDP_PAYLOAD];
    let h = req(PacketKind::Send, 0, &huge);
    assert!(matches!(
        roce::encode_udp(&h, &huge, &ep, &mut vec![0; 70_000]),
        Err(roce::EncodeError::TooLong(_))
    ));
    assert_eq!(Endpoints::of_packet(&PacketHeader { dst_nic: 1 << 24, ..h }), None);
    let mut f = Frame::of_packet(&req(PacketKind::Write, 0, b""), b"");
    f.reth = None;
    assert_eq!(f.encode_udp(&ep, &mut [0; 64]), Err(roce::EncodeError::Inconsistent(Opcode::RdmaWriteOnly)));
}

/// SplitMix64.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn bit(&mut self) -> bool {
        self.next() & 1 != 0
    }
}

/// A random header of the kinds and shapes the sim sends, and its payload.
fn random_packet(r: &mut Rng) -> (PacketHeader, Vec<u8>) {
    let kind = [
        PacketKind::Send,
        PacketKind::Write,
        PacketKind::ReadRequest,
        PacketKind::ReadResponse,
        PacketKind::Ack,
        PacketKind::AtomicRequest,
        PacketKind::AtomicAck,
    ][r.below(7) as usize];
    let nic = |r: &mut Rng| if r.bit() { r.below(4) as u32 } else { r.below(1 << 24) as u32 };
    let qpn = |r: &mut Rng| if r.bit() { r.below(8) as u32 } else { r.below(1 << 24) as u32 };
    let mut h = PacketHeader {
        src_nic: nic(r),
        dst_nic: nic(r),
        src_qpn: qpn(r),
        dst_qpn: qpn(r),
        kind,
        first: r.bit(),
        last: r.bit(),
        has_imm: r.bit(),
        solicited: r.bit(),
        psn: r.next() as u32,
        imm: r.next() as u32,
        offset: r.next() as u32,
        remote_addr: r.next(),
        rkey: r.next() as u32,
        dma_len: r.next() as u32,
        atomic: [r.next(), r.next()],
        ..Default::default()
    };
    if kind == PacketKind::Ack {
        h.syndrome = match r.below(7) {
            0 => Syndrome::RnrNak(roce::rnr_nanos(r.below(32) as u8)),
            1 => Syndrome::RnrNak(r.below(1 << 30)),
            2 => Syndrome::NakSequence,
            3 => Syndrome::NakInvalidRequest,
            4 => Syndrome::NakRemoteAccess,
            5 => Syndrome::NakRemoteOperation,
            _ => Syndrome::Ack,
        };
    }
    if matches!(kind, PacketKind::Send | PacketKind::Write | PacketKind::ReadResponse) {
        h.payload_len = match r.below(10) {
            0 => 0,
            1 => 4096,
            2 => r.below(9000) as u32,
            _ => r.below(64) as u32,
        };
    }
    let payload = (0..h.payload_len).map(|_| r.next() as u8).collect();
    (h, payload)
}

/// What the receiver gets back for `h`: the fields the wire carries, plus `RxContext`.
fn expected(h: &PacketHeader) -> PacketHeader {
    let op = Opcode::of(h);
    let mut e = *h;
    e.has_imm = op.has_imm() || op == Opcode::FetchAdd;
    if !op.has_imm() {
        e.imm = 0;
    }
    match h.kind {
        PacketKind::AtomicRequest => e.dma_len = 8,
        PacketKind::AtomicAck => e.atomic[1] = 0,
        _ => e.atomic = [0, 0],
    }
    e.solicited =
        h.solicited && h.last && (h.kind == PacketKind::Send || (h.kind == PacketKind::Write && h.has_imm));
    match h.kind {
        PacketKind::Write | PacketKind::ReadRequest | PacketKind::AtomicRequest => {}
        _ => (e.remote_addr, e.rkey, e.dma_len) = (0, 0, 0),
    }
    match h.kind {
        PacketKind::ReadRequest | PacketKind::AtomicRequest => (e.first, e.last) = (true, true),
        PacketKind::AtomicAck => (e.first, e.last, e.syndrome) = (false, false, Syndrome::Ack),
        PacketKind::Ack => {
            (e.first, e.last) = (false, false);
            if let Syndrome::RnrNak(ns) = h.syndrome {
                e.syndrome = Syndrome::RnrNak(roce::rnr_nanos(roce::rnr_code(ns)));
            }
        }
        _ => e.syndrome = Syndrome::Ack,
    }
    e
}

fn rx_for(h: &PacketHeader, r: &mut Rng) -> RxContext {
    let skew = r.below(1 << 24) as i64 - (1 << 23) + 1; // within ±(2^23 − 1)
    RxContext {
        src_nic: h.src_nic,
        dst_nic: h.dst_nic,
        src_qpn: h.src_qpn,
        near_psn: h.psn.wrapping_add(skew as u32),
        offset: h.offset,
        write: (h.kind == PacketKind::Write && !h.first).then_some(Reth {
            va: h.remote_addr.wrapping_sub(u64::from(h.offset)),
            rkey: h.rkey,
            len: h.dma_len,
        }),
    }
}

#[test]
fn random_headers_round_trip() {
    let mut r = Rng(0x5EED_0FF4_A3E5);
    let mut udp = vec![0u8; 16 << 10];
    let mut eth = vec![0u8; 16 << 10];
    let mut seen = [0u32; 21];
    for i in 0..20_000 {
        let (h, payload) = random_packet(&mut r);
        let ep = Endpoints::of_packet(&h).unwrap();
        let link = Link::of_packet(r.next() as u32, &h);
        let n = roce::encode_udp(&h, &payload, &ep, &mut udp).unwrap();
        assert_eq!(n, roce::udp_len(&h));
        let m = roce::encode_ethernet(&h, &payload, &ep, &link, &mut eth).unwrap();
        assert_eq!(&eth[42..m], &udp[..n], "packet {i}");

        let f = roce::decode_udp(&udp[..n], &ep).unwrap_or_else(|e| panic!("packet {i} {h:?}: {e}"));
        assert_eq!(f, Frame::of_packet(&h, &payload), "packet {i}");
        seen[f.opcode.byte() as usize] += 1;
        let e = roce::decode_ethernet(&eth[..m]).unwrap();
        assert_eq!((e.frame, e.endpoints, e.link), (f, ep, link));
        assert_eq!((e.src_nic(), e.dst_nic()), (Some(h.src_nic), Some(h.dst_nic)));
        let rx = rx_for(&h, &mut r);
        assert_eq!(f.to_header(&rx), expected(&h), "packet {i}");
    }
    assert!(seen.iter().all(|&n| n > 100), "every opcode was generated: {seen:?}");
}

#[test]
fn no_truncation_or_byte_flip_gets_through() {
    let mut r = Rng(42);
    let mut cases: Vec<(PacketHeader, Vec<u8>)> =
        goldens().iter().map(|g| (g.hdr, g.payload.to_vec())).collect();
    while cases.len() < 400 {
        let (h, p) = random_packet(&mut r);
        if h.payload_len <= 512 {
            cases.push((h, p));
        }
    }
    for (h, payload) in &cases {
        let ep = Endpoints::of_packet(h).unwrap();
        let frame = sim_encode(h, payload);
        let udp = &frame[42..];
        let good = roce::decode_udp(udp, &ep).unwrap();
        for len in 0..udp.len() {
            match roce::decode_udp(&udp[..len], &ep) {
                Err(FrameError::TooShort { .. }) if len < 16 => {}
                Err(FrameError::BadIcrc { .. }) => {}
                other => panic!("{h:?} cut to {len} bytes: {other:?}"),
            }
        }
        for len in 0..frame.len() {
            assert!(roce::decode_ethernet(&frame[..len]).is_err(), "{h:?} cut to {len} bytes");
        }
        for _ in 0..4 {
            let mut bad = udp.to_vec();
            let at = r.below(bad.len() as u64) as usize;
            bad[at] ^= 1 + r.below(255) as u8;
            match roce::decode_udp(&bad, &ep) {
                // BTH byte 4 (FECN, BECN, reserved) is outside the ICRC and ignored.
                Ok(f) if at == 4 => assert_eq!(f, good),
                Err(FrameError::BadIcrc { .. }) => {}
                other => panic!("{h:?} with byte {at} flipped: {other:?}"),
            }
            let mut bad = frame.clone();
            let at = r.below(bad.len() as u64) as usize;
            bad[at] ^= 1 + r.below(255) as u8;
            match roce::decode_ethernet(&bad) {
                // Ethernet addresses are covered by the FCS, not the ICRC; BTH byte 4 and (if it
                // happens to become right) the UDP checksum are outside the ICRC too.
                Ok(f) if at < 12 || at == 46 || at == 40 || at == 41 => assert_eq!(f.frame, good),
                Err(_) => {}
                other => panic!("{h:?} with byte {at} flipped: {other:?}"),
            }
        }
    }
    // Every single-bit flip of one frame, exhaustively.
    let g = &goldens()[3];
    let frame = sim_encode(&g.hdr, g.payload);
    let ep = Endpoints::of_packet(&g.hdr).unwrap();
    for at in 42..frame.len() {
        for bit in 0..8 {
            let mut bad = frame[42..].to_vec();
            bad[at - 42] ^= 1 << bit;
            let res = roce::decode_udp(&bad, &ep);
            assert!(
                at == 46 || matches!(res, Err(FrameError::BadIcrc { .. })),
                "byte {at} bit {bit}: {res:?}"
            );
        }
    }
}

#[test]
fn garbage_never_panics() {
    let mut r = Rng(7);
    let ep = Endpoints { src_ip: [10, 0, 0, 1], dst_ip: [10, 0, 0, 2], src_port: 0xC000, dst_port: 4791 };
    let mut buf = [0u8; 200];
    for i in 0..100_000 {
        let len = r.below(buf.len() as u64) as usize;
        for b in &mut buf[..len] {
            *b = r.next() as u8;
        }
        if i % 2 == 0 && len >= 42 {
            // Mostly plausible headers, so the decoder gets past the first checks.
            buf[12..14].copy_from_slice(&[0x08, 0x00]);
            buf[14] = 0x45;
        }
        let _ = roce::decode_udp(&buf[..len], &ep);
        let _ = roce::decode_ethernet(&buf[..len]);
        // And the same bytes sealed with a right ICRC, so the later checks run too.
        if len >= 16 {
            let crc = roce::udp_icrc(&ep, &buf[..len - 4]);
            buf[len - 4..len].copy_from_slice(&crc.to_le_bytes());
            if let Ok(f) = roce::decode_udp(&buf[..len], &ep) {
                assert!(f.payload.len() + f.opcode.header_len() + 4 <= len);
            }
        }
    }
}

/// Wireshark's dissector reads the golden frames as the RC packets they are meant to be: the
/// opcode, QP, PSN, flags, extension headers and ICRC it shows are the ones written, and it
/// reports nothing malformed. (Wireshark 4.0 shows the ICRC but does not check it; the ICRCs
/// were checked by `roce_golden.py` and the tests above.)
#[test]
fn tshark_reads_the_golden_frames() {
    if !tshark::available("tshark_reads_the_golden_frames") {
        return;
    }
    let path = std::env::temp_dir().join(format!("bypass-golden-{}.pcap", std::process::id()));
    let frames: Vec<Vec<u8>> = goldens().iter().map(|g| hex(g.bytes)).collect();
    {
        let w = bypass_sim::pcap::PcapWriter::create(&path).unwrap();
        for f in &frames {
            w.write_frame(f);
        }
    }
    let names = [
        "infiniband.bth.opcode",
        "infiniband.bth.se",
        "infiniband.bth.padcnt",
        "infiniband.bth.p_key",
        "infiniband.bth.destqp",
        "infiniband.bth.a",
        "infiniband.bth.psn",
        "infiniband.reth.va",
        "infiniband.reth.r_key",
        "infiniband.reth.dmalen",
        "infiniband.aeth.syndrome",
        "infiniband.aeth.msn",
        "infiniband.immdt",
        "infiniband.invariant.crc",
        "udp.srcport",
        "ip.src",
    ];
    let rows = tshark::fields(&path, &names);
    assert_eq!(rows.len(), frames.len());
    for (row, bytes) in rows.iter().zip(&frames) {
        let f = roce::decode_ethernet(bytes).unwrap().frame;
        let n = |i: usize| tshark::num(&row[i]);
        let flag = |i: usize| matches!(row[i].as_str(), "1" | "True" | "true");
        let what = format!("{}: tshark says {row:?}", f.opcode);
        assert_eq!(n(0), Some(u64::from(f.opcode.byte())), "{what}");
        assert_eq!(flag(1), f.solicited, "{what}");
        assert_eq!(n(2), Some(f.pad() as u64), "{what}");
        assert_eq!(n(3), Some(0xFFFF), "{what}");
        assert_eq!(n(4), Some(u64::from(f.dest_qp)), "{what}");
        assert_eq!(flag(5), f.ack_req, "{what}");
        assert_eq!(n(6), Some(u64::from(f.psn)), "{what}");
        assert_eq!(
            (n(7), n(8), n(9)),
            f.reth.map_or((None, None, None), |r| {
                (Some(r.va), Some(u64::from(r.rkey)), Some(u64::from(r.len)))
            }),
            "{what}"
        );
        assert_eq!(
            (n(10), n(11)),
            f.aeth.map_or((None, None), |a| (Some(u64::from(a.syndrome)), Some(0))),
            "{what}"
        );
        let imm = row[12].replace(':', "");
        assert_eq!(u32::from_str_radix(&imm, 16).ok(), f.imm, "{what}");
        let icrc = u32::from_be_bytes(bytes[bytes.len() - 4..].try_into().unwrap());
        assert_eq!(n(13), Some(u64::from(icrc)), "{what}: Wireshark shows the ICRC bytes big-endian");
        assert!(row[15] == "10.0.0.1" || row[15] == "10.0.0.2", "{what}");
    }
    tshark::assert_clean(&tshark::verbose(&path), frames.len());
    let _ = std::fs::remove_file(&path);
}
