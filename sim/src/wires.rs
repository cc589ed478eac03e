//! The catalogue of wires: what a fabric may be configured with ([`WireConfig`], and its part of
//! a backend string), the [`WirePort`] each NIC gets for it, and how a peer's GID names its wire
//! (for the reasons given when a queue connects to a peer of another wire).
//!
//! A new wire is a module implementing [`WirePort`] (and [`Wire`](crate::wire::Wire) for its
//! links) plus an entry in each of the three places below; the device, the driver, the NIC and the
//! engine do not change.

use crate::pcap::PcapWriter;
use crate::wire::WirePort;
use bypass_hal::QueueInfo;
use std::sync::Arc;

/// What carries packets between a fabric's NICs (see `docs/sim.md`, "Wires").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum WireConfig {
    /// Straight into the receiving NIC's inbox: NICs of this fabric, in this process. Every
    /// engine.
    #[default]
    InProcess,
    /// RoCEv2 packets in UDP datagrams, one socket per NIC: NICs in any process on any host that
    /// can reach this address. NIC `i` of the fabric binds `ip:port+i` (port 0: a free port
    /// each). Inline and Threaded engines (the Stepped engine's virtual time cannot span
    /// processes).
    Udp(std::net::SocketAddrV4),
    /// RoCEv2 packets through single-producer/single-consumer rings in shared memory
    /// (`/dev/shm`): NICs in any process on this host. Each NIC creates a segment named from its
    /// process, fabric and address. Inline and Threaded engines.
    Shm,
    /// RoCEv2 in Ethernet/IPv4/UDP frames on an Ethernet NIC that moves raw frames (an
    /// [`L2Port`](bypass_hal::l2::L2Port): a NIC owned through VFIO, an `AF_PACKET` socket, an
    /// in-memory pair), with ARP: NICs on the same link, including RoCEv2 NICs such as Linux's
    /// rxe. Each NIC gets one port, given to [`Fabric::try_with_l2`](crate::Fabric::try_with_l2)
    /// (a fabric made with this wire and no ports is refused). Inline and Threaded engines.
    L2,
}

impl WireConfig {
    /// Parses the wire part of a backend string: `shm` (shared memory, one host) or
    /// `udp://IP:PORT` (IPv4).
    pub fn parse(s: &str) -> Result<WireConfig, String> {
        if s == "shm" {
            return Ok(WireConfig::Shm);
        }
        let Some(addr) = s.strip_prefix("udp://") else {
            return Err(format!(
                "unknown simulator wire {s:?}: expected shm (processes on one host), udp://IP:PORT \
                 (e.g. udp://127.0.0.1:0), an L2 wire (l2:pair, packet://<ifname>,ip=<v4>: see \
                 bypass_sim::l2::parse_wire), or no wire for the in-process one"
            ));
        };
        let addr: std::net::SocketAddrV4 = addr.parse().map_err(|e| {
            format!("bad UDP wire address {addr:?} ({e}): expected IPv4:port, e.g. 127.0.0.1:0")
        })?;
        Ok(WireConfig::Udp(addr))
    }
}

/// What a NIC's port is made from.
#[cfg_attr(loom, allow(dead_code))] // `depth`: the shared-memory wire's, absent under loom
pub(crate) struct PortSpec {
    /// The fabric's number in this process.
    pub fabric: u32,
    /// The NIC's address on its fabric.
    pub nic: u32,
    /// Largest packet payload.
    pub mtu: u32,
    /// Packets a receive queue (inbox, ring) holds.
    pub depth: u32,
    /// How long a flush may hold plain ACKs back (`FabricConfig::ack_hold`; the UDP wire).
    pub ack_hold: std::time::Duration,
    /// Where sent packets are captured (`BYPASS_PCAP`), for wires that capture their own bytes.
    pub pcap: Option<Arc<PcapWriter>>,
    /// The L2 wire: the NIC's port and address (`None` when the fabric's ports are all taken).
    pub l2: Option<crate::l2::L2Attachment>,
}

/// Once per fabric, before its first NIC: clears what dead processes left behind on the wire.
pub(crate) fn prepare(wire: WireConfig) {
    #[cfg(not(loom))]
    if wire == WireConfig::Shm {
        // Segments left by processes that died without cleaning up (kill -9).
        crate::shm::clean_stale();
    }
    let _ = wire;
}

/// The port NIC `spec.nic` gets on `wire` (not yet started): `None` on the in-process wire.
/// Errors say why it cannot be made (a UDP address that cannot be bound, ...).
pub(crate) fn open(wire: WireConfig, spec: PortSpec) -> std::io::Result<Option<Arc<dyn WirePort>>> {
    match wire {
        WireConfig::InProcess => Ok(None),
        WireConfig::Udp(at) => {
            let port = if at.port() == 0 { 0 } else { at.port().checked_add(spec.nic as u16).unwrap_or(0) };
            let addr = std::net::SocketAddrV4::new(*at.ip(), port);
            let udp =
                crate::udp::UdpPort::bind(addr, spec.mtu, spec.ack_hold, spec.pcap, spec.fabric, spec.nic)?;
            Ok(Some(Arc::new(udp)))
        }
        #[cfg(not(loom))]
        WireConfig::Shm => {
            let shm = crate::shm::ShmPort::create(spec.fabric, spec.nic, spec.mtu, spec.depth)?;
            Ok(Some(Arc::new(shm)))
        }
        WireConfig::L2 => {
            let Some(at) = spec.l2 else {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    "every L2 port of this fabric already has its NIC: give Fabric::try_with_l2 one port per NIC \
                     (queues of one NIC can connect to each other: the wire loops their frames back)",
                ));
            };
            let l2 = crate::l2::L2Wire::new(at, spec.nic, spec.pcap)?;
            Ok(Some(Arc::new(l2)))
        }
        #[cfg(loom)]
        WireConfig::Shm => Err(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            "the shared-memory wire does not exist under loom",
        )),
    }
}

/// Why a NIC on the wire `name` (opened with `hint`) cannot connect to `peer`, whose GID is
/// not of that wire: names the peer's wire when its GID says which, else says both ends must use
/// the same wire.
pub(crate) fn refuse(name: &str, hint: &str, peer: &QueueInfo) -> String {
    mismatch(name, peer).unwrap_or_else(|| {
        format!(
            "the peer's queue is not on the {name} wire: both ends of a connection must use the same \
             wire (e.g. both {hint})"
        )
    })
}

/// The reason a NIC on the wire `name` cannot reach `peer` if `peer`'s GID belongs to a byte
/// wire (UDP, shared memory); `None` if it does not.
pub(crate) fn mismatch(name: &str, peer: &QueueInfo) -> Option<String> {
    if let Some((pid, _, _)) = crate::shm::peer_of_gid(&peer.gid) {
        return Some(format!(
            "the peer's queue is on a simulated NIC on the shared-memory wire (process {pid}), but this \
             NIC's fabric is on the {name} wire: open this side with the shared-memory wire too (sim+shm)"
        ));
    }
    if let Some(ip) = crate::udp::ip_of_gid(&peer.gid) {
        return Some(format!(
            "the peer's queue is at the IP address {ip} (a simulated NIC on the UDP or L2 wire, or a \
             RoCEv2 NIC), but this NIC's fabric is on the {name} wire: open this side with the peer's wire \
             (e.g. sim+udp://127.0.0.1:0)"
        ));
    }
    None
}
