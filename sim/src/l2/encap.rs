//! Ethernet II / IPv4 / UDP around a RoCEv2 packet, as rxe puts it on the wire, and the cheap
//! checks that sort a received frame before anything is decoded.
//!
//! The headers: Ethernet II (no VLAN tag); IPv4 with no options, DF set, ID 0, TTL 64 and TOS 0
//! (rxe sends the address vector's traffic class and hop limit, 0 and 64 for a plain RC
//! connection; DSCP 0, not ECN-capable), the header checksum computed; UDP from the queue
//! pair's entropy port ([`roce::udp_source_port`], rxe's hash of the two QPNs) to 4791, UDP
//! checksum 0 (RoCEv2 over IPv4 allows it, and rxe sends it). The ICRC that ends the RoCEv2
//! packet covers these IPv4 and UDP headers (with TTL, TOS and checksums masked), which is why
//! the ID is 0: [`roce::encode_udp_with`] computes it over ID 0.

use crate::roce::{self, icrc::ipv4_checksum, Endpoints};
use bypass_hal::l2::Mac;
use std::net::Ipv4Addr;

/// EtherType of IPv4.
pub(crate) const ETHERTYPE_IPV4: u16 = 0x0800;
/// EtherType of ARP.
pub(crate) const ETHERTYPE_ARP: u16 = 0x0806;
/// Ethernet, IPv4 and UDP headers before the RoCEv2 packet.
pub(crate) const HEADERS: usize = roce::ETH_LEN + roce::IPV4_LEN + roce::UDP_LEN;
/// IPv4 time to live of every frame sent (rxe: the AV's hop limit, 64 from rdma_cm).
pub(crate) const TTL: u8 = 64;
/// IPv4 TOS (DSCP and ECN) of every frame sent: rxe's default traffic class, 0.
pub(crate) const TOS: u8 = 0;
/// Bytes a RoCEv2 packet adds to its payload inside the IP MTU: IPv4, UDP, the longest transport
/// headers the sim sends with a payload (BTH, RETH, ImmDt), ICRC.
pub(crate) const IP_OVERHEAD: usize =
    roce::IPV4_LEN + roce::UDP_LEN + roce::BTH_LEN + roce::RETH_LEN + roce::IMMDT_LEN + roce::ICRC_LEN;
/// The RoCE path MTUs (InfiniBand's MTU enumeration), largest first.
const IB_MTUS: [u32; 5] = [4096, 2048, 1024, 512, 256];

/// The path MTU (payload bytes per packet) a port of `port_mtu` carries: the largest InfiniBand
/// MTU whose packets fit in its frames, as a RoCE NIC picks it (1024 on a 1500-byte Ethernet,
/// 4096 on a 9000-byte jumbo one). `None` if not even 256 fits.
pub(crate) fn path_mtu(port_mtu: usize) -> Option<u32> {
    IB_MTUS.into_iter().find(|&m| m as usize + IP_OVERHEAD <= port_mtu)
}

/// Writes the Ethernet, IPv4 and UDP headers of a RoCEv2 packet of `udp_payload` bytes into
/// `out[..HEADERS]`.
pub(crate) fn write_headers(out: &mut [u8], src_mac: Mac, dst_mac: Mac, ep: &Endpoints, udp_payload: usize) {
    out[0..6].copy_from_slice(&dst_mac);
    out[6..12].copy_from_slice(&src_mac);
    out[12..14].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
    let ip = &mut out[14..34];
    let total = (roce::IPV4_LEN + roce::UDP_LEN + udp_payload) as u16;
    ip[0] = 0x45;
    ip[1] = TOS;
    ip[2..4].copy_from_slice(&total.to_be_bytes());
    ip[4..6].copy_from_slice(&0u16.to_be_bytes()); // ID 0, as the ICRC assumes
    ip[6..8].copy_from_slice(&0x4000u16.to_be_bytes()); // DF
    ip[8] = TTL;
    ip[9] = 17; // UDP
    ip[10..12].fill(0);
    ip[12..16].copy_from_slice(&ep.src_ip);
    ip[16..20].copy_from_slice(&ep.dst_ip);
    let sum = ipv4_checksum(ip);
    ip[10..12].copy_from_slice(&sum.to_be_bytes());
    let udp = &mut out[34..42];
    udp[0..2].copy_from_slice(&ep.src_port.to_be_bytes());
    udp[2..4].copy_from_slice(&ep.dst_port.to_be_bytes());
    udp[4..6].copy_from_slice(&((roce::UDP_LEN + udp_payload) as u16).to_be_bytes());
    udp[6..8].fill(0); // no UDP checksum (RoCEv2 over IPv4 allows it; rxe sends 0)
}

/// What a received frame is, from a few header bytes (nothing is checksummed yet).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    /// An ARP packet (to us or broadcast).
    Arp,
    /// IPv4/UDP to port 4791 at our address: a RoCEv2 packet for us, to decode.
    Roce,
    /// Another host's frame, another protocol, or another port: not ours, dropped.
    NotOurs,
    /// Too short to be an Ethernet frame.
    Runt,
}

/// Sorts a received frame for a port with MAC `mac` and IPv4 address `ip`.
#[inline]
pub(crate) fn classify(frame: &[u8], mac: &Mac, ip: Ipv4Addr) -> Class {
    if frame.len() < roce::ETH_LEN {
        return Class::Runt;
    }
    let to_us = frame[0..6] == mac[..];
    let broadcast = frame[0..6] == [0xFF; 6];
    if !to_us && !broadcast {
        return Class::NotOurs;
    }
    match u16::from_be_bytes([frame[12], frame[13]]) {
        ETHERTYPE_ARP => Class::Arp,
        ETHERTYPE_IPV4 if to_us => {
            if frame.len() < HEADERS {
                return Class::Runt;
            }
            let dst_ip = &frame[30..34];
            let proto = frame[23];
            let dst_port = u16::from_be_bytes([frame[36], frame[37]]);
            if dst_ip == ip.octets() && proto == 17 && dst_port == roce::ROCE_PORT {
                Class::Roce
            } else {
                Class::NotOurs
            }
        }
        _ => Class::NotOurs,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_mtu_follows_the_port() {
        assert_eq!(path_mtu(1500), Some(1024));
        assert_eq!(path_mtu(9000), Some(4096));
        assert_eq!(path_mtu(4096 + IP_OVERHEAD), Some(4096));
        assert_eq!(path_mtu(4096 + IP_OVERHEAD - 1), Some(2048));
        assert_eq!(path_mtu(300), None);
    }
}
