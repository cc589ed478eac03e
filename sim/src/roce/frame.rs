//! Encoding and decoding of RoCEv2 frames: the UDP payload (BTH … ICRC) and the whole
//! Ethernet/IPv4/UDP frame around it.

use super::icrc::{icrc_ipv4, icrc_ipv4_id, ipv4_checksum, udp_checksum};
use super::{
    mac_of_nic, nic_of_ip, Aeth, AtomicEth, Deth, EncodeError, Endpoints, Frame, FrameError, Opcode, Reth,
    AETH_LEN, ATOMIC_ACK_ETH_LEN, ATOMIC_ETH_LEN, BTH_LEN, DETH_LEN, ETH_LEN, ICRC_LEN, IMMDT_LEN, IPV4_LEN,
    MAX_UDP_PAYLOAD, RDETH_LEN, RETH_LEN, ROCE_PORT, UDP_LEN,
};
use crate::packet::PacketHeader;

/// EtherType of IPv4.
const ETHERTYPE_IPV4: u16 = 0x0800;
/// IPv4 flags/fragment field with only DF set.
const IP_DF: u16 = 0x4000;
/// IPv4 protocol number of UDP.
const PROTO_UDP: u8 = 17;

/// What an Ethernet frame has beyond the [`Endpoints`]: the Ethernet addresses and the IPv4
/// header fields a sender chooses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Link {
    /// Ethernet source address.
    pub src_mac: [u8; 6],
    /// Ethernet destination address.
    pub dst_mac: [u8; 6],
    /// IPv4 identification. The ICRC covers it; the UDP level ([`encode_udp`]) assumes 0, so
    /// frames whose Ethernet and UDP forms should carry the same ICRC use 0.
    pub ip_id: u16,
    /// IPv4 time to live (masked out of the ICRC).
    pub ttl: u8,
    /// IPv4 type of service: DSCP and ECN (masked out of the ICRC).
    pub tos: u8,
}

impl Link {
    /// The link of a sim packet on fabric `fabric`: Ethernet addresses from [`mac_of_nic`], IPv4
    /// ID 0 (with DF, as in every frame encoded here), TTL 64, TOS 0.
    pub fn of_packet(fabric: u32, hdr: &PacketHeader) -> Link {
        Link {
            src_mac: mac_of_nic(fabric, hdr.src_nic),
            dst_mac: mac_of_nic(fabric, hdr.dst_nic),
            ip_id: 0,
            ttl: 64,
            tos: 0,
        }
    }
}

/// A decoded Ethernet/IPv4/UDP/RoCEv2 frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EthFrame<'a> {
    /// Ethernet addresses and the chosen IPv4 fields.
    pub link: Link,
    /// IPv4 addresses and UDP ports.
    pub endpoints: Endpoints,
    /// The RoCEv2 packet.
    pub frame: Frame<'a>,
}

impl EthFrame<'_> {
    /// The sending sim NIC, if the source address is in 10.0.0.0/8 ([`nic_of_ip`]).
    pub fn src_nic(&self) -> Option<u32> {
        nic_of_ip(self.endpoints.src_ip)
    }

    /// The receiving sim NIC, if the destination address is in 10.0.0.0/8.
    pub fn dst_nic(&self) -> Option<u32> {
        nic_of_ip(self.endpoints.dst_ip)
    }
}

/// Bytes [`encode_udp`] writes for `hdr`: headers, payload, pad, ICRC.
pub fn udp_len(hdr: &PacketHeader) -> usize {
    let payload = hdr.payload_len as usize;
    Opcode::of(hdr).header_len() + payload + (payload.wrapping_neg() & 3) + ICRC_LEN
}

/// Bytes [`encode_ethernet`] writes for `hdr`: 42 bytes of Ethernet, IPv4 and UDP headers plus
/// [`udp_len`].
pub fn ethernet_len(hdr: &PacketHeader) -> usize {
    ETH_LEN + IPV4_LEN + UDP_LEN + udp_len(hdr)
}

/// Encodes sim packet `hdr` with its `payload` as a RoCEv2 UDP payload (BTH … ICRC) into `out`,
/// for a datagram between `ep`; returns the bytes written. The mapping is [`Frame::of_packet`].
/// Nothing is allocated.
pub fn encode_udp(
    hdr: &PacketHeader,
    payload: &[u8],
    ep: &Endpoints,
    out: &mut [u8],
) -> Result<usize, EncodeError> {
    check_payload(hdr, payload)?;
    Frame::of_packet(hdr, payload).encode_udp(ep, out)
}

/// Encodes sim packet `hdr` as a RoCEv2 UDP payload into `out` like [`encode_udp`], but lets
/// `fill` write the `hdr.payload_len` payload bytes straight into their place in `out` (a byte
/// wire gathers from host memory into its send buffer in one copy). Returns the bytes written.
pub fn encode_udp_with(
    hdr: &PacketHeader,
    ep: &Endpoints,
    out: &mut [u8],
    fill: &mut dyn FnMut(&mut [u8]),
) -> Result<usize, EncodeError> {
    let frame = Frame::of_packet(hdr, &[]);
    let plen = if frame.opcode.has_payload() { hdr.payload_len as usize } else { 0 };
    if plen != hdr.payload_len as usize {
        return Err(EncodeError::PayloadLength { expected: 0, got: hdr.payload_len as usize });
    }
    let hl = frame.opcode.header_len();
    let pad = plen.wrapping_neg() & 3;
    let n = hl + plen + pad + ICRC_LEN;
    frame.check()?;
    if n > MAX_UDP_PAYLOAD {
        return Err(EncodeError::TooLong(n));
    }
    let have = out.len();
    let out = out.get_mut(..n).ok_or(EncodeError::BufferTooSmall { need: n, have })?;
    let (body, icrc) = out.split_at_mut(n - ICRC_LEN);
    // The pad count goes in the BTH: write the header as a frame with `pad` bytes of payload
    // would, then put the real payload after it.
    Frame { payload: &[], ..frame }.write_transport(&mut body[..hl]);
    body[1] = body[1] & !0x30 | (pad as u8) << 4;
    fill(&mut body[hl..hl + plen]);
    body[hl + plen..].fill(0);
    icrc.copy_from_slice(&udp_icrc(ep, body).to_le_bytes());
    Ok(n)
}

/// Encodes sim packet `hdr` with its `payload` as a whole Ethernet II / IPv4 / UDP / RoCEv2 frame
/// (no FCS) into `out`; returns the bytes written. Nothing is allocated.
pub fn encode_ethernet(
    hdr: &PacketHeader,
    payload: &[u8],
    ep: &Endpoints,
    link: &Link,
    out: &mut [u8],
) -> Result<usize, EncodeError> {
    check_payload(hdr, payload)?;
    Frame::of_packet(hdr, payload).encode_ethernet(ep, link, out)
}

fn check_payload(hdr: &PacketHeader, payload: &[u8]) -> Result<(), EncodeError> {
    let expected = if Opcode::of(hdr).has_payload() { hdr.payload_len as usize } else { 0 };
    if payload.len() != expected || hdr.payload_len as usize != expected {
        return Err(EncodeError::PayloadLength { expected, got: payload.len() });
    }
    Ok(())
}

/// The IPv4 header of a RoCEv2 datagram carrying `udp_payload` bytes: no options, DF, protocol
/// UDP, checksum filled in.
fn ipv4_header(ep: &Endpoints, id: u16, ttl: u8, tos: u8, udp_payload: usize) -> [u8; IPV4_LEN] {
    let mut h = ipv4_header_unsummed(ep, id, ttl, tos, udp_payload);
    let sum = ipv4_checksum(&h);
    h[10..12].copy_from_slice(&sum.to_be_bytes());
    h
}

/// [`ipv4_header`] with the checksum left 0: for the ICRC alone, which masks that field (a byte
/// wire's sender and receiver compute it per datagram).
fn ipv4_header_unsummed(ep: &Endpoints, id: u16, ttl: u8, tos: u8, udp_payload: usize) -> [u8; IPV4_LEN] {
    let total = (IPV4_LEN + UDP_LEN + udp_payload) as u16;
    let mut h = [0u8; IPV4_LEN];
    h[0] = 0x45;
    h[1] = tos;
    h[2..4].copy_from_slice(&total.to_be_bytes());
    h[4..6].copy_from_slice(&id.to_be_bytes());
    h[6..8].copy_from_slice(&IP_DF.to_be_bytes());
    h[8] = ttl;
    h[9] = PROTO_UDP;
    h[12..16].copy_from_slice(&ep.src_ip);
    h[16..20].copy_from_slice(&ep.dst_ip);
    h
}

/// The UDP header of a RoCEv2 datagram carrying `udp_payload` bytes, with checksum 0 (none), as
/// rxe sends over IPv4.
fn udp_header(ep: &Endpoints, udp_payload: usize) -> [u8; UDP_LEN] {
    let mut h = [0u8; UDP_LEN];
    h[0..2].copy_from_slice(&ep.src_port.to_be_bytes());
    h[2..4].copy_from_slice(&ep.dst_port.to_be_bytes());
    h[4..6].copy_from_slice(&((UDP_LEN + udp_payload) as u16).to_be_bytes());
    h
}

impl Frame<'_> {
    /// Checks that the extension headers match the opcode and the frame fits in a datagram.
    fn check(&self) -> Result<usize, EncodeError> {
        let op = self.opcode;
        if self.rdeth.is_some() != op.has_rdeth()
            || self.deth.is_some() != op.has_deth()
            || self.reth.is_some() != op.has_reth()
            || self.aeth.is_some() != op.has_aeth()
            || self.imm.is_some() != op.has_imm()
            || self.atomic.is_some() != op.has_atomic_eth()
            || self.atomic_ack.is_some() != op.has_atomic_ack_eth()
        {
            return Err(EncodeError::Inconsistent(op));
        }
        if !op.has_payload() && !self.payload.is_empty() {
            return Err(EncodeError::PayloadLength { expected: 0, got: self.payload.len() });
        }
        let n = self.udp_len();
        if n > MAX_UDP_PAYLOAD {
            return Err(EncodeError::TooLong(n));
        }
        Ok(n)
    }

    /// Writes BTH, extension headers, payload and pad into `out` (exactly `udp_len() - 4`
    /// bytes, checked by the caller).
    fn write_transport(&self, out: &mut [u8]) {
        let pad = self.pad();
        out[0] = self.opcode.byte();
        out[1] = u8::from(self.solicited) << 7 | (pad as u8) << 4; // M = 0, TVer = 0
        out[2..4].copy_from_slice(&self.pkey.to_be_bytes());
        out[4..8].copy_from_slice(&(self.dest_qp & 0x00FF_FFFF).to_be_bytes()); // FECN/BECN/resv6 = 0
        out[8..12].copy_from_slice(&(u32::from(self.ack_req) << 31 | self.psn & 0x00FF_FFFF).to_be_bytes());
        let mut at = BTH_LEN;
        if let Some(ee) = self.rdeth {
            out[at..at + 4].copy_from_slice(&(ee & 0x00FF_FFFF).to_be_bytes()); // reserved byte 0
            at += RDETH_LEN;
        }
        if let Some(d) = self.deth {
            out[at..at + 4].copy_from_slice(&d.qkey.to_be_bytes());
            out[at + 4..at + 8].copy_from_slice(&(d.src_qp & 0x00FF_FFFF).to_be_bytes()); // reserved byte 0
            at += DETH_LEN;
        }
        if let Some(r) = self.reth {
            out[at..at + 8].copy_from_slice(&r.va.to_be_bytes());
            out[at + 8..at + 12].copy_from_slice(&r.rkey.to_be_bytes());
            out[at + 12..at + 16].copy_from_slice(&r.len.to_be_bytes());
            at += RETH_LEN;
        }
        if let Some(a) = self.aeth {
            out[at..at + 4]
                .copy_from_slice(&(u32::from(a.syndrome) << 24 | a.msn & 0x00FF_FFFF).to_be_bytes());
            at += AETH_LEN;
        }
        if let Some(imm) = self.imm {
            out[at..at + 4].copy_from_slice(&imm.to_be_bytes());
            at += IMMDT_LEN;
        }
        if let Some(a) = self.atomic {
            out[at..at + 8].copy_from_slice(&a.va.to_be_bytes());
            out[at + 8..at + 12].copy_from_slice(&a.rkey.to_be_bytes());
            out[at + 12..at + 20].copy_from_slice(&a.swap_add.to_be_bytes());
            out[at + 20..at + 28].copy_from_slice(&a.compare.to_be_bytes());
            at += ATOMIC_ETH_LEN;
        }
        if let Some(orig) = self.atomic_ack {
            out[at..at + 8].copy_from_slice(&orig.to_be_bytes());
            at += ATOMIC_ACK_ETH_LEN;
        }
        out[at..at + self.payload.len()].copy_from_slice(self.payload);
        at += self.payload.len();
        out[at..at + pad].fill(0);
    }

    /// Encodes the frame as a UDP payload between `ep` (ICRC over the IPv4 header with ID 0 and
    /// DF that [`encode_ethernet`] would send); returns the bytes written.
    pub fn encode_udp(&self, ep: &Endpoints, out: &mut [u8]) -> Result<usize, EncodeError> {
        let n = self.check()?;
        let have = out.len();
        let out = out.get_mut(..n).ok_or(EncodeError::BufferTooSmall { need: n, have })?;
        let (body, icrc) = out.split_at_mut(n - ICRC_LEN);
        self.write_transport(body);
        icrc.copy_from_slice(&udp_icrc(ep, body).to_le_bytes());
        Ok(n)
    }

    /// Encodes the frame as an Ethernet II / IPv4 / UDP frame from `ep.src_ip` to `ep.dst_ip`;
    /// returns the bytes written.
    pub fn encode_ethernet(&self, ep: &Endpoints, link: &Link, out: &mut [u8]) -> Result<usize, EncodeError> {
        let n = self.check()?;
        let total = ETH_LEN + IPV4_LEN + UDP_LEN + n;
        let have = out.len();
        let out = out.get_mut(..total).ok_or(EncodeError::BufferTooSmall { need: total, have })?;
        let ip = ipv4_header(ep, link.ip_id, link.ttl, link.tos, n);
        let udp = udp_header(ep, n);
        out[0..6].copy_from_slice(&link.dst_mac);
        out[6..12].copy_from_slice(&link.src_mac);
        out[12..14].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
        out[14..34].copy_from_slice(&ip);
        out[34..42].copy_from_slice(&udp);
        let (body, icrc) = out[42..].split_at_mut(n - ICRC_LEN);
        self.write_transport(body);
        icrc.copy_from_slice(&icrc_ipv4(&ip, &udp, body).to_le_bytes());
        Ok(total)
    }
}

/// The ICRC of a UDP payload between `ep` whose BTH … pad bytes are `transport` (what
/// [`Frame::encode_udp`] appends, little-endian, and [`decode_udp`] checks): for a byte wire that
/// builds or edits packets in place.
pub fn udp_icrc(ep: &Endpoints, transport: &[u8]) -> u32 {
    let n = transport.len() + ICRC_LEN;
    icrc_ipv4(&ipv4_header_unsummed(ep, 0, 0, 0, n), &udp_header(ep, n), transport)
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Decodes a RoCEv2 UDP payload (BTH … ICRC) received between `ep`. The ICRC is checked first,
/// over the IPv4 header with ID 0 and DF that [`Frame::encode_udp`] assumes, then the BTH (TVer,
/// opcode class and number, P_Key), the lengths, pad and extension headers. Never panics.
pub fn decode_udp<'a>(bytes: &'a [u8], ep: &Endpoints) -> Result<Frame<'a>, FrameError> {
    if bytes.len() > MAX_UDP_PAYLOAD {
        return Err(FrameError::TooLong(bytes.len()));
    }
    let ip = ipv4_header_unsummed(ep, 0, 0, 0, bytes.len());
    let udp = udp_header(ep, bytes.len());
    parse_transport(bytes, &ip, &udp, false)
}

/// Decodes a RoCEv2 UDP payload from a standard RoCEv2 NIC (Linux's rxe, hardware), whose IPv4
/// header carried an ID the receiving UDP socket does not show: as [`decode_udp`], except that the
/// ICRC is accepted if some IPv4 ID makes it right ([`super::icrc::icrc_ipv4_id`], a 16-bit
/// weaker check). DF set, no options, as every RoCEv2 NIC sends (rxe: `prepare4`).
pub fn decode_udp_any_id<'a>(bytes: &'a [u8], ep: &Endpoints) -> Result<Frame<'a>, FrameError> {
    if bytes.len() > MAX_UDP_PAYLOAD {
        return Err(FrameError::TooLong(bytes.len()));
    }
    let ip = ipv4_header(ep, 0, 0, 0, bytes.len());
    let udp = udp_header(ep, bytes.len());
    parse_transport(bytes, &ip, &udp, true)
}

/// Decodes an Ethernet II / IPv4 / UDP / RoCEv2 frame (trailing Ethernet padding allowed, no FCS,
/// no VLAN tag): Ethernet type, a 20-byte IPv4 header with a valid checksum, not a fragment, UDP
/// to port 4791 with consistent lengths (and a valid checksum if it is not 0), then the RoCEv2
/// packet with its ICRC over this frame's own IPv4 and UDP headers. Never panics.
pub fn decode_ethernet(bytes: &[u8]) -> Result<EthFrame<'_>, FrameError> {
    const HEADERS: usize = ETH_LEN + IPV4_LEN + UDP_LEN;
    let len = bytes.len();
    let too_short = |need| FrameError::TooShort { len, need };
    if len < ETH_LEN {
        return Err(too_short(HEADERS + BTH_LEN + ICRC_LEN));
    }
    let ethertype = be16(bytes, 12);
    if ethertype != ETHERTYPE_IPV4 {
        return Err(FrameError::NotIpv4(ethertype));
    }
    let Some(ip) = bytes.get(ETH_LEN..ETH_LEN + IPV4_LEN) else {
        return Err(too_short(HEADERS + BTH_LEN + ICRC_LEN));
    };
    let mut ip_hdr = [0u8; IPV4_LEN];
    ip_hdr.copy_from_slice(ip);
    if ip_hdr[0] != 0x45 {
        return Err(FrameError::BadIpHeader(ip_hdr[0]));
    }
    if ipv4_checksum(&ip_hdr) != 0 {
        return Err(FrameError::BadIpChecksum);
    }
    if be16(&ip_hdr, 6) & 0x3FFF != 0 {
        return Err(FrameError::Fragmented);
    }
    if ip_hdr[9] != PROTO_UDP {
        return Err(FrameError::NotUdp(ip_hdr[9]));
    }
    let total = usize::from(be16(&ip_hdr, 2));
    if total < IPV4_LEN + UDP_LEN {
        return Err(FrameError::BadLength);
    }
    let Some(datagram) = bytes.get(ETH_LEN + IPV4_LEN..ETH_LEN + total) else {
        return Err(too_short(ETH_LEN + total));
    };
    let mut udp_hdr = [0u8; UDP_LEN];
    udp_hdr.copy_from_slice(&datagram[..UDP_LEN]);
    let dst_port = be16(&udp_hdr, 2);
    if dst_port != ROCE_PORT {
        return Err(FrameError::NotRoce(dst_port));
    }
    if usize::from(be16(&udp_hdr, 4)) != datagram.len() {
        return Err(FrameError::BadLength);
    }
    let (src_ip, dst_ip) = ([ip[12], ip[13], ip[14], ip[15]], [ip[16], ip[17], ip[18], ip[19]]);
    let sent_sum = be16(&udp_hdr, 6);
    if sent_sum != 0 && udp_checksum(src_ip, dst_ip, datagram) != sent_sum {
        return Err(FrameError::BadUdpChecksum);
    }
    let frame = parse_transport(&datagram[UDP_LEN..], &ip_hdr, &udp_hdr, false)?;
    let mac =
        |at: usize| [bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3], bytes[at + 4], bytes[at + 5]];
    Ok(EthFrame {
        link: Link {
            dst_mac: mac(0),
            src_mac: mac(6),
            ip_id: be16(&ip_hdr, 4),
            ttl: ip_hdr[8],
            tos: ip_hdr[1],
        },
        endpoints: Endpoints { src_ip, dst_ip, src_port: be16(&udp_hdr, 0), dst_port },
        frame,
    })
}

/// Parses BTH … ICRC, with the ICRC over `ip` and `udp` (with `any_id`: over `ip` with whatever
/// IPv4 ID makes it right).
fn parse_transport<'a>(
    bytes: &'a [u8],
    ip: &[u8; IPV4_LEN],
    udp: &[u8; UDP_LEN],
    any_id: bool,
) -> Result<Frame<'a>, FrameError> {
    let len = bytes.len();
    if len < BTH_LEN + ICRC_LEN {
        return Err(FrameError::TooShort { len, need: BTH_LEN + ICRC_LEN });
    }
    let (body, tail) = bytes.split_at(len - ICRC_LEN);
    let sent = u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]);
    let computed = icrc_ipv4(ip, udp, body);
    if sent != computed && !(any_id && icrc_ipv4_id(ip, udp, body, sent).is_some()) {
        return Err(FrameError::BadIcrc { sent, computed });
    }
    let tver = body[1] & 0x0F;
    if tver != 0 {
        return Err(FrameError::BadVersion(tver));
    }
    let opcode = Opcode::from_byte(body[0])?;
    let pkey = be16(body, 2);
    if pkey & 0x7FFF != 0x7FFF {
        return Err(FrameError::BadPartition(pkey));
    }
    let need = opcode.header_len();
    if body.len() < need {
        return Err(FrameError::TooShort { len, need: need + ICRC_LEN });
    }
    let pad = (body[1] >> 4) & 3;
    let rest = body.len() - need;
    if !opcode.has_payload() {
        if rest != 0 {
            return Err(FrameError::UnexpectedPayload(opcode));
        }
        if pad != 0 {
            return Err(FrameError::BadPad(pad));
        }
    }
    if rest % 4 != 0 {
        return Err(FrameError::Unaligned(rest));
    }
    if usize::from(pad) > rest {
        return Err(FrameError::BadPad(pad));
    }
    let mut at = BTH_LEN;
    let rdeth = opcode.has_rdeth().then(|| {
        let ee = be32(body, at) & 0x00FF_FFFF;
        at += RDETH_LEN;
        ee
    });
    let deth = opcode.has_deth().then(|| {
        let d = Deth { qkey: be32(body, at), src_qp: be32(body, at + 4) & 0x00FF_FFFF };
        at += DETH_LEN;
        d
    });
    let reth = opcode.has_reth().then(|| {
        let va = u64::from(be32(body, at)) << 32 | u64::from(be32(body, at + 4));
        let r = Reth { va, rkey: be32(body, at + 8), len: be32(body, at + 12) };
        at += RETH_LEN;
        r
    });
    let aeth = match opcode.has_aeth() {
        false => None,
        true => {
            let word = be32(body, at);
            at += AETH_LEN;
            let a = Aeth { syndrome: (word >> 24) as u8, msn: word & 0x00FF_FFFF };
            let ok = match opcode {
                Opcode::Acknowledge => a.meaning().is_some(),
                _ => a.syndrome <= 0x1F, // READ responses carry an ACK syndrome
            };
            if !ok {
                return Err(FrameError::BadSyndrome(a.syndrome));
            }
            Some(a)
        }
    };
    let imm = opcode.has_imm().then(|| be32(body, at));
    let be64 = |at: usize| u64::from(be32(body, at)) << 32 | u64::from(be32(body, at + 4));
    let atomic = opcode.has_atomic_eth().then(|| AtomicEth {
        va: be64(at),
        rkey: be32(body, at + 8),
        swap_add: be64(at + 12),
        compare: be64(at + 20),
    });
    let atomic_ack = opcode.has_atomic_ack_eth().then(|| be64(at));
    Ok(Frame {
        opcode,
        solicited: body[1] & 0x80 != 0,
        ack_req: body[8] & 0x80 != 0,
        pkey,
        dest_qp: be32(body, 4) & 0x00FF_FFFF,
        psn: be32(body, 8) & 0x00FF_FFFF,
        rdeth,
        deth,
        reth,
        aeth,
        imm,
        atomic,
        atomic_ack,
        payload: &body[need..body.len() - usize::from(pad)],
    })
}
