//! The L2 wire: the simulator's RC transport over any Ethernet NIC that moves raw frames
//! ([`L2Port`]), as a RoCEv2 NIC puts it on the wire — Ethernet II, IPv4, UDP to port 4791, then
//! the RoCEv2 packet ([`crate::roce`]) — with ARP to find the peer's MAC.
//!
//! - **Addressing**: a NIC on this wire has an IPv4 address ([`L2Addr`]); its queues advertise
//!   the IPv4-mapped GID (`::ffff:a.b.c.d`) and `lid` 0, exactly what a verbs queue on a RoCE
//!   device (rxe, hardware) reports, so a `QueueInfo` from either side connects to the other.
//!   A peer off the port's subnet is reached through the gateway, if one is set.
//! - **Connecting** resolves the next hop's MAC by ARP (`arp.rs`): a request at once, retries with
//!   backoff, and an error naming the address if nothing answers within about three seconds. A
//!   NIC answers requests for its own address, and learns from any ARP packet it receives.
//! - **Sending** (under the NIC's device lock): each packet is encoded straight into the next
//!   slot of a send batch (headers, then the payload gathered from host memory into its place,
//!   then the ICRC; `encap.rs`) and a burst leaves in one [`L2Port::send`]: one doorbell. The UDP
//!   source port is the queue pair's entropy port (rxe's hash of the two QPNs), so a switch can
//!   spread connections over paths while each stays in order. The payload per packet, the path
//!   MTU, is the largest InfiniBand MTU whose frames fit the port's MTU (1024 on a 1500-byte
//!   link): the fabric's `mtu` is lowered to it. Frames the port's full transmit ring did not
//!   take stay in the batch; when the batch is full too, the packet is refused with
//!   [`Transmit::Busy`] (backpressure, not loss) and the receive thread offers the batch again
//!   every tick and unblocks the waiting queues once the port took some.
//! - **Receiving** goes through the wire seam's polling hook: the NIC's polls and run loop ask
//!   `WirePort::pending` and the device takes frames with `WirePort::drain`, which calls the
//!   port's `recv` under the device lock, sorts each frame from a few header bytes (another
//!   host's MAC, another address, protocol or port: dropped before anything is checksummed),
//!   answers ARP, and decodes RoCEv2 frames (IPv4 header checksum, ICRC; bad ones are counted
//!   and dropped). A thread per NIC makes sure frames never wait for a poll that will not come:
//!   while the NIC's user polls, it only looks every millisecond whether the polls took
//!   anything; when the user sleeps (a CQ armed, or a Threaded device thread parked) it arms the
//!   port and sleeps on its event fd, and runs the device when a frame arrives.
//! - **Loopback**: a queue connected to a queue of the same NIC (its own address) gets its
//!   frames back through the wire, as a RoCE NIC loops them back, without reaching the port.

mod arp;
mod encap;
#[cfg(target_os = "linux")]
pub mod packet;
pub mod pair;

use crate::eventfd::EventFd;
use crate::packet::PacketHeader;
use crate::pcap::PcapWriter;
use crate::roce::{self, Endpoints};
use crate::wire::{Transmit, Wire, WireHost, WirePort, WireStats};
use bypass_hal::l2::{L2Port, Mac};
use bypass_hal::QueueInfo;
use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, RwLock, Weak};
use std::time::{Duration, Instant};

/// The ports an L2 wire string names, or `None` if `wire` is not one: `l2:pair[,loss_ppm=N]`
/// (an in-memory cable between two NICs, 10.99.0.1 and 10.99.0.2: for tests) or
/// `packet://<ifname>,ip=<v4>[/prefix][,gw=<v4>]` (an `AF_PACKET` socket on that interface,
/// one NIC; needs CAP_NET_RAW). Errors say what is wrong and what is expected.
pub fn parse_wire(wire: &str) -> Option<Result<Vec<L2Attachment>, String>> {
    if let Some(rest) = wire.strip_prefix("l2:") {
        return Some(parse_pair(rest));
    }
    let rest = wire.strip_prefix("packet://")?;
    Some(parse_packet(rest))
}

fn parse_pair(rest: &str) -> Result<Vec<L2Attachment>, String> {
    let mut opts = rest.split(',');
    if opts.next() != Some("pair") {
        return Err(format!("unknown L2 wire l2:{rest}: expected l2:pair (an in-memory cable, for tests)"));
    }
    let mut cfg = pair::PairConfig::default();
    for opt in opts {
        match opt.split_once('=') {
            Some(("loss_ppm", v)) => {
                cfg.loss_ppm = v
                    .parse()
                    .ok()
                    .filter(|&p| p < 1_000_000)
                    .ok_or_else(|| format!("bad loss_ppm {v:?}: frames lost per million, 0 to 999999"))?
            }
            _ => return Err(format!("unknown option {opt:?} of l2:pair: expected loss_ppm=<0..999999> (or, in a backend string, ack_timeout_backoff=N|off)")),
        }
    }
    let (ports, _) =
        pair::pair_attachments(cfg).map_err(|e| format!("cannot make an in-memory L2 pair: {e}"))?;
    Ok(ports)
}

#[cfg(target_os = "linux")]
fn parse_packet(rest: &str) -> Result<Vec<L2Attachment>, String> {
    let (ifname, opts) = rest.split_once(',').unwrap_or((rest, ""));
    let addr = L2Addr::parse_options(opts)?;
    let port = packet::PacketPort::open(ifname).map_err(|e| e.to_string())?;
    Ok(vec![L2Attachment { port: Box::new(port), addr }])
}

#[cfg(not(target_os = "linux"))]
fn parse_packet(_: &str) -> Result<Vec<L2Attachment>, String> {
    Err("AF_PACKET sockets exist only on Linux".into())
}

/// The path MTU (RoCE payload bytes per packet) an L2 port with this MTU carries: the largest
/// InfiniBand MTU (256 … 4096) whose packets, with their IPv4, UDP and RoCEv2 headers, fit in one
/// frame; `None` if not even 256 fits.
pub fn path_mtu_of(port_mtu: usize) -> Option<u32> {
    encap::path_mtu(port_mtu)
}

/// Frames one `send` or `recv` moves at most.
const BATCH: usize = 32;
/// How often the receive thread looks whether polls took the frames, while the NIC's user polls.
const TICK: Duration = Duration::from_millis(1);
/// A poll that finds no frame hot drains the port once every this many asks.
const POLL_EVERY: usize = 2;
/// Longest sleep of the receive thread (it then looks whether its NIC is gone).
const LONG_SLEEP: Duration = Duration::from_millis(100);
/// The source id of frames from an address no queue of the NIC is connected to.
const UNKNOWN_PEER: u32 = u32::MAX;
/// Frames a loopback queue holds.
const LOOPBACK_MAX: usize = 256;

/// A NIC's IPv4 addressing on an L2 port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct L2Addr {
    /// The NIC's own address (its queues' GID).
    pub ip: Ipv4Addr,
    /// Length of the subnet prefix: peers inside it are on the link (ARP for them), others are
    /// reached through `gateway`.
    pub prefix: u8,
    /// The router for peers off the subnet, if any.
    pub gateway: Option<Ipv4Addr>,
}

impl L2Addr {
    /// `ip` on a /24 with no gateway.
    pub fn new(ip: Ipv4Addr) -> L2Addr {
        L2Addr { ip, prefix: 24, gateway: None }
    }

    /// Parses `ip=A.B.C.D[/PREFIX][,gw=A.B.C.D]` (the address part of an L2 backend string, as in
    /// `sim+packet://veth0,ip=10.99.0.2/24`), checked ([`check`](Self::check)). Other options
    /// are refused, naming the ones there are.
    pub fn parse_options(opts: &str) -> Result<L2Addr, String> {
        let mut ip = None;
        let mut prefix = 24;
        let mut gateway = None;
        for opt in opts.split(',').filter(|o| !o.is_empty()) {
            let (k, v) = opt.split_once('=').unwrap_or((opt, ""));
            let v4 = |v: &str| {
                v.parse::<Ipv4Addr>()
                    .map_err(|e| format!("bad IPv4 address {v:?} in {opt:?} ({e}): expected e.g. 10.99.0.2"))
            };
            match k {
                "ip" => {
                    let (a, p) = match v.split_once('/') {
                        Some((a, p)) => {
                            let p: u8 = p.parse().map_err(|_| format!("bad prefix length {p:?} in {opt:?}: expected 0 to 32"))?;
                            (a, p)
                        }
                        None => (v, 24),
                    };
                    ip = Some(v4(a)?);
                    prefix = p;
                }
                "gw" => gateway = Some(v4(v)?),
                other => {
                    return Err(format!(
                        "unknown L2 option {other:?} in {opts:?}: expected ip=<v4>[/prefix] and optionally gw=<v4> (and, in a backend string, ack_timeout_backoff=N|off)"
                    ))
                }
            }
        }
        let ip = ip
            .ok_or_else(|| format!("no address in {opts:?}: the L2 wire needs ip=<v4>, e.g. ip=10.99.0.2"))?;
        let addr = L2Addr { ip, prefix, gateway };
        addr.check()?;
        Ok(addr)
    }

    fn on_link(&self, peer: Ipv4Addr) -> bool {
        let mask = if self.prefix == 0 { 0 } else { u32::MAX << (32 - u32::from(self.prefix.min(32))) };
        u32::from(peer) & mask == u32::from(self.ip) & mask
    }

    /// Checks the address can be used: a unicast address, a prefix of at most 32 bits, a gateway
    /// on the subnet.
    pub fn check(&self) -> Result<(), String> {
        let ip = self.ip;
        if ip.is_unspecified() || ip.is_broadcast() || ip.is_multicast() {
            return Err(format!(
                "{ip} cannot be an L2 NIC's address: give a unicast IPv4 address (ip=10.99.0.2)"
            ));
        }
        if self.prefix > 32 {
            return Err(format!("prefix length {} is more than 32 bits", self.prefix));
        }
        if let Some(gw) = self.gateway {
            if !self.on_link(gw) || gw == ip {
                return Err(format!(
                    "gateway {gw} is not another address on {ip}/{}: give a router on the port's subnet",
                    self.prefix
                ));
            }
        }
        Ok(())
    }
}

/// An L2 port and the address of the NIC that will use it: what
/// [`Fabric::try_with_l2`](crate::Fabric::try_with_l2) takes, one per NIC.
pub struct L2Attachment {
    /// The port (a virtio-net or e1000e NIC owned through VFIO, an `AF_PACKET` socket, one end of
    /// an in-memory [`pair`]).
    pub port: Box<dyn L2Port>,
    /// The NIC's address on it.
    pub addr: L2Addr,
}

impl std::fmt::Debug for L2Attachment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "L2Attachment({}, MTU {})", self.addr.ip, self.port.mtu())
    }
}

/// What an L2 wire counted (beyond [`WireStats`]).
#[derive(Debug, Default)]
pub(crate) struct L2Stats {
    /// Frames that were not RoCEv2 packets of ours (bad IPv4 checksum, bad ICRC, ...).
    pub malformed: AtomicU64,
    /// Frames for another host, address, protocol or port, dropped unread.
    pub not_ours: AtomicU64,
    /// RoCEv2 frames from an address no queue of the NIC is connected to.
    pub unknown_peer: AtomicU64,
    /// Frames lost on the way out: a neighbour's queue of held frames full, an ARP frame the
    /// port did not take, a frame too long (a full transmit ring is `Busy`, not loss).
    pub tx_dropped: AtomicU64,
    /// ARP requests answered.
    pub arp_replies: AtomicU64,
}

/// The send batch: frames encoded, waiting for `flush`.
struct TxBatch {
    bufs: Vec<Box<[u8]>>,
    lens: [usize; BATCH],
    n: usize,
}

/// What the wire's lock guards: the port and everything that sends on it.
struct Inner {
    port: Box<dyn L2Port>,
    neigh: arp::Table,
    tx: TxBatch,
    /// Frames a queue sent to a queue of this same NIC.
    loopback: VecDeque<Vec<u8>>,
    /// Spent loopback buffers.
    spare: Vec<Vec<u8>>,
}

/// Copies of received frames, taken under the port lock and decoded after it (decoding hands
/// packets to the device, which may send, which takes the port lock).
struct RxBufs {
    bufs: Vec<Box<[u8]>>,
    lens: [usize; BATCH],
}

/// A NIC's attachment to an L2 port (see the module docs).
pub(crate) struct L2Wire {
    addr: L2Addr,
    mac: Mac,
    nic: u32,
    inner: Mutex<Inner>,
    /// Notified when an ARP packet resolves a neighbour (a connecting queue waits on it).
    resolved: Condvar,
    rx: Mutex<RxBufs>,
    /// The last drain took frames, or a frame is known to wait: the next poll should drain.
    hot: AtomicBool,
    /// Asks of [`pending`](WirePort::pending) since the last drain.
    polls: AtomicUsize,
    /// Drains run (the receive thread compares it across a tick).
    drains: AtomicU64,
    /// Frames wait in the send batch because the port's transmit ring had no room: the receive
    /// thread offers them again every tick.
    tx_held: AtomicBool,
    /// A packet was refused with [`Transmit::Busy`] (the batch full, the port's ring too): its
    /// queue waits until the receive thread finds room and calls [`WireHost::unblocked`].
    tx_blocked: AtomicBool,
    /// The port's event fd, if it has one.
    port_fd: Option<RawFd>,
    /// Wakes the receive thread (a CQ was armed, a queue is resolving, shutdown).
    wake: EventFd,
    /// Peer addresses by source id, and the reverse map.
    peers: RwLock<(Vec<Ipv4Addr>, HashMap<Ipv4Addr, u32>)>,
    pcap: Option<Arc<PcapWriter>>,
    host: OnceLock<Weak<dyn WireHost>>,
    pub(crate) stats: L2Stats,
}

impl std::fmt::Debug for L2Wire {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "L2Wire({}, {})", self.addr.ip, fmt_mac(&self.mac))
    }
}

fn fmt_mac(m: &Mac) -> String {
    format!("{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}", m[0], m[1], m[2], m[3], m[4], m[5])
}

impl L2Wire {
    /// The wire of NIC `nic` on `at`. Errors if the address is unusable or the
    /// port's MTU carries no RoCE packet.
    pub(crate) fn new(at: L2Attachment, nic: u32, pcap: Option<Arc<PcapWriter>>) -> io::Result<L2Wire> {
        let bad = |m: String| io::Error::new(io::ErrorKind::InvalidInput, m);
        at.addr.check().map_err(bad)?;
        let mtu = at.port.mtu();
        if encap::path_mtu(mtu).is_none() {
            return Err(bad(format!(
                "the L2 port's MTU of {mtu} bytes cannot carry a RoCE packet of 256 payload bytes (it needs {})",
                256 + encap::IP_OVERHEAD
            )));
        }
        let size = roce::ETH_LEN + mtu;
        let bufs = || (0..BATCH).map(|_| vec![0u8; size].into_boxed_slice()).collect::<Vec<_>>();
        let port_fd = at.port.event_fd();
        Ok(L2Wire {
            addr: at.addr,
            mac: at.port.mac(),
            nic,
            inner: Mutex::new(Inner {
                port: at.port,
                neigh: arp::Table::default(),
                tx: TxBatch { bufs: bufs(), lens: [0; BATCH], n: 0 },
                loopback: VecDeque::new(),
                spare: Vec::new(),
            }),
            resolved: Condvar::new(),
            rx: Mutex::new(RxBufs { bufs: bufs(), lens: [0; BATCH] }),
            hot: AtomicBool::new(true),
            polls: AtomicUsize::new(0),
            drains: AtomicU64::new(0),
            tx_held: AtomicBool::new(false),
            tx_blocked: AtomicBool::new(false),
            port_fd,
            wake: EventFd::new()?,
            peers: RwLock::new((Vec::new(), HashMap::new())),
            pcap,
            host: OnceLock::new(),
            stats: L2Stats::default(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The source id of peer `ip`, assigned on first use.
    fn peer_id(&self, ip: Ipv4Addr) -> u32 {
        if let Some(&id) = self.peers.read().unwrap_or_else(|e| e.into_inner()).1.get(&ip) {
            return id;
        }
        let mut p = self.peers.write().unwrap_or_else(|e| e.into_inner());
        if let Some(&id) = p.1.get(&ip) {
            return id;
        }
        let id = p.0.len() as u32;
        p.0.push(ip);
        p.1.insert(ip, id);
        id
    }

    fn lookup(&self, ip: Ipv4Addr) -> u32 {
        self.peers.read().unwrap_or_else(|e| e.into_inner()).1.get(&ip).copied().unwrap_or(UNKNOWN_PEER)
    }

    /// The address frames to `peer` go to on the link: the peer itself or the gateway.
    fn next_hop(&self, peer: Ipv4Addr) -> Result<Ipv4Addr, String> {
        if self.addr.on_link(peer) {
            return Ok(peer);
        }
        self.addr.gateway.ok_or_else(|| {
            format!(
                "{peer} is not on this L2 port's subnet ({}/{}) and no gateway is set: give the peer an \
                 address on the subnet, or add gw=<router> to the backend string",
                self.addr.ip, self.addr.prefix
            )
        })
    }

    /// Makes sure the receive path runs soon (a frame is expected): the next poll drains, and the
    /// receive thread looks.
    fn nudge(&self) {
        self.hot.store(true, Ordering::Relaxed);
        self.wake.signal();
    }

    /// Sends an ARP request for `ip` (inner held).
    fn send_request(&self, inner: &mut Inner, ip: Ipv4Addr) {
        let req = arp::Arp {
            op: arp::Op::Request,
            sender_mac: self.mac,
            sender_ip: self.addr.ip,
            target_mac: [0; 6],
            target_ip: ip,
        };
        let mut f = [0u8; arp::ARP_FRAME_LEN];
        req.write([0xFF; 6], &mut f);
        self.send_now(inner, &f);
    }

    /// Sends one frame outside the batch (ARP), after what the batch holds.
    fn send_now(&self, inner: &mut Inner, frame: &[u8]) {
        self.send_batch(inner);
        match inner.port.send(&[frame]) {
            Ok(1) => {
                if let Some(w) = &self.pcap {
                    w.write_frame(frame);
                }
            }
            _ => drop(self.stats.tx_dropped.fetch_add(1, Ordering::Relaxed)),
        }
    }

    /// Sends ARP requests that fell due (inner held).
    fn service(&self, inner: &mut Inner) {
        if !inner.neigh.resolving() {
            return;
        }
        let mut due = [Ipv4Addr::UNSPECIFIED; 8];
        let n = inner.neigh.due(Instant::now(), &mut due);
        for &ip in &due[..n] {
            self.send_request(inner, ip);
        }
        if n == 0 && !inner.neigh.resolving() {
            // An entry failed: wake whoever waits for it.
            self.resolved.notify_all();
        }
    }

    /// Resolves `hop`'s MAC, waiting for ARP (not on a data path: `connect`).
    fn resolve(&self, hop: Ipv4Addr) -> Result<Mac, String> {
        let mut inner = self.lock();
        if inner.neigh.start(hop, Instant::now()) {
            self.send_request(&mut inner, hop);
        }
        loop {
            match inner.neigh.state(hop) {
                Some(arp::State::Reachable(mac)) => return Ok(mac),
                Some(arp::State::Failed) => {
                    return Err(format!(
                    "no ARP reply from {hop} after {} requests over {:.1} s on the L2 port of {} ({}): the \
                         host is down or not on this link, or its address is wrong (check the peer's ip= and \
                         the cable or bridge between the ports)",
                    arp::TRIES,
                    arp::give_up_after().as_secs_f32(),
                    self.addr.ip,
                    fmt_mac(&self.mac)
                ))
                }
                None => {
                    inner.neigh.start(hop, Instant::now());
                    self.send_request(&mut inner, hop);
                }
                Some(arp::State::Incomplete { .. }) => {}
            }
            self.service(&mut inner);
            drop(inner);
            // The reply comes through the receive path: have it run (this thread may be the
            // NIC's only user).
            self.nudge();
            if let Some(h) = self.host.get().and_then(Weak::upgrade) {
                h.take_now();
            }
            inner = self.lock();
            if !matches!(inner.neigh.state(hop), Some(arp::State::Reachable(_) | arp::State::Failed)) {
                inner = self
                    .resolved
                    .wait_timeout(inner, Duration::from_millis(2))
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        }
    }

    /// Encodes one packet to `to` (via `hop`) into the send batch, or holds it for ARP.
    fn transmit(
        &self,
        to: Ipv4Addr,
        hop: Ipv4Addr,
        hdr: &PacketHeader,
        fill: &mut dyn FnMut(&mut [u8]),
    ) -> Transmit {
        let mut guard = self.lock();
        let inner = &mut *guard;
        let ep = Endpoints {
            src_ip: self.addr.ip.octets(),
            dst_ip: to.octets(),
            src_port: roce::udp_source_port(hdr.src_qpn, hdr.dst_qpn),
            dst_port: roce::ROCE_PORT,
        };
        let dst_mac = if to == self.addr.ip { Some(self.mac) } else { inner.neigh.mac_of(hop) };
        if to != self.addr.ip && dst_mac.is_some() {
            if inner.tx.n == BATCH {
                self.send_batch(inner);
                if inner.tx.n == BATCH {
                    // The port's transmit ring is full: backpressure from our own NIC, not loss
                    // on the link (a NIC does not drop its own send queue). Dropping here made
                    // the transport resend whole windows into the same full ring, again and
                    // again. The queue keeps the packet and waits; the receive thread offers the
                    // batch again each tick and unblocks it once the port took some.
                    if !self.tx_blocked.swap(true, Ordering::AcqRel) {
                        self.wake.signal();
                    }
                    return Transmit::Busy;
                }
            }
            let i = inner.tx.n;
            let Some(len) = self.encode(&mut inner.tx.bufs[i], dst_mac.unwrap_or_default(), &ep, hdr, fill)
            else {
                return Transmit::Dropped;
            };
            inner.tx.lens[i] = len;
            inner.tx.n += 1;
            return Transmit::Sent;
        }
        // Loopback, or a neighbour not (or no longer) resolved: encode into a buffer of its own.
        let mut buf = inner.spare.pop().unwrap_or_default();
        buf.resize(roce::ETH_LEN + inner.port.mtu(), 0);
        let Some(len) = self.encode(&mut buf, dst_mac.unwrap_or_default(), &ep, hdr, fill) else {
            return Transmit::Dropped;
        };
        buf.truncate(len);
        if to == self.addr.ip {
            if inner.loopback.len() >= LOOPBACK_MAX {
                self.stats.tx_dropped.fetch_add(1, Ordering::Relaxed);
                return Transmit::Dropped;
            }
            if let Some(w) = &self.pcap {
                w.write_frame(&buf);
            }
            inner.loopback.push_back(buf);
            self.hot.store(true, Ordering::Relaxed);
            return Transmit::Sent;
        }
        if inner.neigh.start(hop, Instant::now()) {
            self.send_request(inner, hop);
        }
        inner.neigh.hold(hop, buf);
        self.wake.signal(); // the receive thread sends the retries
        Transmit::Sent
    }

    /// Writes the frame of `hdr` to `dst_mac` into `out`; its length, or `None` (counted) if it
    /// does not fit the port.
    fn encode(
        &self,
        out: &mut [u8],
        dst_mac: Mac,
        ep: &Endpoints,
        hdr: &PacketHeader,
        fill: &mut dyn FnMut(&mut [u8]),
    ) -> Option<usize> {
        match roce::encode_udp_with(hdr, ep, &mut out[encap::HEADERS..], fill) {
            Ok(n) => {
                encap::write_headers(out, self.mac, dst_mac, ep, n);
                Some(encap::HEADERS + n)
            }
            Err(_) => {
                // Longer than the path MTU the fabric was given: a sim bug, counted, not a panic.
                self.stats.tx_dropped.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// Hands the batch to the port: one `send`, one doorbell. Frames the port did not take
    /// (its ring is full) stay for the next flush.
    fn send_batch(&self, inner: &mut Inner) {
        let n = inner.tx.n;
        if n == 0 {
            return;
        }
        let tx = &mut inner.tx;
        let mut frames: [&[u8]; BATCH] = [&[]; BATCH];
        for ((f, buf), &len) in frames.iter_mut().zip(&tx.bufs).zip(&tx.lens).take(n) {
            *f = &buf[..len];
        }
        let took = match inner.port.send(&frames[..n]) {
            Ok(k) => k.min(n),
            Err(_) => {
                // Refused as malformed: cannot happen for frames encoded here; lose the batch.
                self.stats.tx_dropped.fetch_add(n as u64, Ordering::Relaxed);
                n
            }
        };
        if let Some(w) = &self.pcap {
            for f in &frames[..took] {
                w.write_frame(f);
            }
        }
        if took < n {
            // Keep the rest, in order, at the front.
            for i in took..n {
                tx.bufs.swap(i - took, i);
                tx.lens[i - took] = tx.lens[i];
            }
        }
        tx.n = n - took;
        let held = tx.n > 0;
        if self.tx_held.load(Ordering::Relaxed) != held {
            self.tx_held.store(held, Ordering::Relaxed);
            if held {
                self.wake.signal(); // the receive thread offers them again
            }
        }
    }

    /// Offers frames held in the send batch to the port again (the receive thread, every tick
    /// while some are held); true if a queue was refused with `Busy` and the batch now has room.
    fn retry_held(&self) -> bool {
        let mut inner = self.lock();
        self.send_batch(&mut inner);
        inner.tx.n < BATCH && self.tx_blocked.swap(false, Ordering::AcqRel)
    }

    /// How long the receive thread may wait: at most a tick while frames are held.
    fn wait_cap(&self, d: Duration) -> Duration {
        if self.tx_held.load(Ordering::Relaxed) || self.tx_blocked.load(Ordering::Relaxed) {
            d.min(TICK)
        } else {
            d
        }
    }

    fn flush(&self) {
        let mut inner = self.lock();
        self.send_batch(&mut inner);
    }

    /// Handles an ARP packet (inner held): answers requests for our address, learns the sender
    /// and sends what waited for it.
    fn on_arp(&self, inner: &mut Inner, frame: &[u8]) {
        let Some(a) = arp::Arp::parse(frame) else {
            self.stats.not_ours.fetch_add(1, Ordering::Relaxed);
            return;
        };
        if a.sender_ip.is_unspecified() || a.sender_mac == [0xFF; 6] || a.sender_mac[0] & 1 != 0 {
            return; // an ARP probe (RFC 5227) or a bogus sender: nothing to learn
        }
        let for_us = a.target_ip == self.addr.ip;
        let held = inner.neigh.learn(a.sender_ip, a.sender_mac, for_us);
        if !held.is_empty() || for_us {
            self.resolved.notify_all();
        }
        for f in held {
            self.send_now(inner, &f);
            inner.spare.push(f);
        }
        if for_us && a.op == arp::Op::Request {
            let reply = arp::Arp {
                op: arp::Op::Reply,
                sender_mac: self.mac,
                sender_ip: self.addr.ip,
                target_mac: a.sender_mac,
                target_ip: a.sender_ip,
            };
            let mut f = [0u8; arp::ARP_FRAME_LEN];
            reply.write(a.sender_mac, &mut f);
            self.send_now(inner, &f);
            self.stats.arp_replies.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The device's receive path (under the NIC's device lock): takes up to a batch of frames
    /// from the port and the loopback queue, answers ARP, and hands each RoCEv2 packet for this
    /// NIC to `recv`.
    fn drain(&self, nic: u32, recv: &mut dyn FnMut(&PacketHeader, &[u8])) {
        self.drains.fetch_add(1, Ordering::Relaxed);
        self.polls.store(0, Ordering::Relaxed);
        let mut rxg = self.rx.lock().unwrap_or_else(|e| e.into_inner());
        let rx = &mut *rxg;
        let mut n = 0;
        let mut got = 0;
        {
            let mut guard = self.lock();
            let inner = &mut *guard;
            self.service(inner);
            while n < BATCH {
                let Some(f) = inner.loopback.pop_front() else { break };
                rx.bufs[n][..f.len()].copy_from_slice(&f);
                rx.lens[n] = f.len();
                n += 1;
                got += 1;
                inner.spare.push(f);
            }
            let mut arps = [false; BATCH];
            let (mac, ip) = (self.mac, self.addr.ip);
            let budget = BATCH - n;
            let stats = &self.stats;
            let _ = inner.port.recv(budget, &mut |f: &[u8]| {
                got += 1;
                let class = encap::classify(f, &mac, ip);
                // Longer than the port's MTU, or beyond the budget (a port that hands more than
                // asked): not a frame this wire can hold.
                let fits = rx.bufs.get(n).is_some_and(|b| f.len() <= b.len());
                if !matches!(class, encap::Class::Roce | encap::Class::Arp) || !fits {
                    let c = if class == encap::Class::Runt { &stats.malformed } else { &stats.not_ours };
                    c.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                rx.bufs[n][..f.len()].copy_from_slice(f);
                rx.lens[n] = f.len();
                if class == encap::Class::Arp {
                    arps[n] = true;
                }
                n += 1;
            });
            // ARP is handled here, under the port lock (it sends); RoCEv2 frames after it.
            for (k, _) in arps.iter().enumerate().take(n).filter(|(_, &is_arp)| is_arp) {
                let len = rx.lens[k];
                self.on_arp(inner, &rx.bufs[k][..len]);
                rx.lens[k] = 0;
            }
            if got < BATCH && inner.loopback.is_empty() {
                self.hot.store(false, Ordering::Relaxed);
            }
        }
        let mut last: Option<(Ipv4Addr, u32)> = None;
        for k in 0..n {
            let len = rx.lens[k];
            if len == 0 {
                continue;
            }
            let f = match roce::decode_ethernet(&rx.bufs[k][..len]) {
                Ok(f) => f,
                Err(e) => {
                    self.stats.malformed.fetch_add(1, Ordering::Relaxed);
                    if bypass_hal::trace::is_enabled() {
                        trace_malformed(nic, len, e);
                    }
                    continue;
                }
            };
            let from = Ipv4Addr::from(f.endpoints.src_ip);
            let src = match last {
                Some((a, id)) if a == from => id,
                _ => {
                    let id = self.lookup(from);
                    last = Some((from, id));
                    id
                }
            };
            if src == UNKNOWN_PEER {
                self.stats.unknown_peer.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let frame = f.frame;
            let ctx = roce::RxContext::from_wire(src, nic, frame.psn);
            recv(&frame.to_header(&ctx), frame.payload);
        }
    }
}

#[cold]
fn trace_malformed(nic: u32, len: usize, e: roce::FrameError) {
    let _ = e;
    let args = [("len", len.into())];
    bypass_hal::trace::instant(bypass_hal::trace::Track::Nic(nic), "malformed frame dropped", &args);
}

/// The wire from one NIC to one peer address on the L2 wire.
pub(crate) struct L2Link {
    wire: Arc<L2Wire>,
    to: Ipv4Addr,
    hop: Ipv4Addr,
}

impl Wire for L2Link {
    fn transmit(&self, hdr: &PacketHeader, fill: &mut dyn FnMut(&mut [u8])) -> Transmit {
        self.wire.transmit(self.to, self.hop, hdr, fill)
    }

    fn flush(&self, _eager: bool) {
        self.wire.flush();
    }
}

impl WirePort for L2Wire {
    fn name(&self) -> &'static str {
        "L2"
    }

    fn backend_hint(&self) -> &'static str {
        "sim+packet://<ifname>,ip=<v4> or vfio:<pci-addr>,ip=<v4>, with a RoCEv2 peer"
    }

    /// The IPv4-mapped GID of the NIC's address, and no LID: what a RoCE NIC's queue reports.
    fn endpoint(&self) -> ([u8; 16], u16) {
        (crate::udp::gid_of(self.addr.ip), 0)
    }

    fn accepts(&self, peer: &QueueInfo) -> bool {
        crate::udp::ip_of_gid(&peer.gid).is_some()
    }

    fn connect(self: Arc<Self>, peer: &QueueInfo) -> Result<(Arc<dyn Wire>, u32), String> {
        let Some(ip) = crate::udp::ip_of_gid(&peer.gid) else {
            return Err(format!("the peer's GID {:?} is no IPv4 address", peer.gid));
        };
        if peer.lid != 0 {
            return Err(format!(
                "the peer's queue is a simulated NIC on the UDP wire at {ip}:{} (its lid is a UDP port): it \
                 talks to NICs on the UDP wire, not to raw Ethernet frames; open both ends on the L2 wire, or \
                 both on the UDP wire",
                peer.lid
            ));
        }
        let hop = if ip == self.addr.ip { ip } else { self.next_hop(ip)? };
        if ip != self.addr.ip {
            self.resolve(hop)?;
        }
        let id = self.peer_id(ip);
        Ok((Arc::new(L2Link { wire: self, to: ip, hop }), id))
    }

    /// Every frame sent (ARP included) is captured as it went on the wire.
    fn captures_itself(&self) -> bool {
        true
    }

    fn start(self: Arc<Self>, host: Weak<dyn WireHost>) -> io::Result<Option<std::thread::JoinHandle<()>>> {
        let _ = self.host.set(host.clone());
        let name = format!("bypass-sim-l2-{}", self.nic);
        let handle = std::thread::Builder::new().name(name).spawn(move || receive_thread(host, self))?;
        Ok(Some(handle))
    }

    fn polled(&self) -> bool {
        true
    }

    /// True when the last drain took frames (more may wait), and otherwise once every
    /// [`POLL_EVERY`] asks since the last drain: a port can only be asked by receiving from it.
    /// A drain resets the count, so the device's run loop, which asks again after draining,
    /// ends.
    #[inline]
    fn pending(&self) -> bool {
        if self.hot.load(Ordering::Relaxed) {
            return true;
        }
        let n = self.polls.load(Ordering::Relaxed) + 1;
        self.polls.store(n, Ordering::Relaxed);
        n >= POLL_EVERY
    }

    fn drain(&self, nic: u32, recv: &mut dyn FnMut(&PacketHeader, &[u8])) {
        L2Wire::drain(self, nic, recv)
    }

    fn attention(&self) {
        self.wake.signal();
    }

    fn stats(&self) -> WireStats {
        WireStats {
            rx_malformed: self.stats.malformed.load(Ordering::Relaxed),
            // RoCEv2 frames from an address no queue is connected to, dropped in `drain` before
            // they reach the device. Frames for other hosts (`not_ours`) are not counted here.
            rx_ignored: self.stats.unknown_peer.load(Ordering::Relaxed),
            tx_dropped: self.stats.tx_dropped.load(Ordering::Relaxed),
            tx_wakeups: 0,
            tx_sends: 0,
        }
    }

    fn shut_down(&self) {
        self.wake.signal();
    }
}

/// Waits until `fds` is readable or `timeout` passes.
fn wait_readable(fds: &[RawFd], timeout: Duration) {
    let mut p = [libc::pollfd { fd: -1, events: libc::POLLIN, revents: 0 }; 2];
    for (slot, &fd) in p.iter_mut().zip(fds) {
        slot.fd = fd;
    }
    let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
    // SAFETY: `p` is a live array of `fds.len()` (at most 2) pollfd structs; poll writes only
    // their `revents`.
    unsafe { libc::poll(p.as_mut_ptr(), fds.len().min(2) as libc::nfds_t, ms) };
}

/// Reads an eventfd's counter (clears it); a port's event fd is one by the L2 port contract.
fn clear_eventfd(fd: RawFd) {
    let mut n: u64 = 0;
    // SAFETY: reads at most 8 bytes into a live u64; the fd is non-blocking or readable (poll).
    let _ = unsafe { libc::read(fd, (&mut n as *mut u64).cast(), 8) };
}

/// Body of a NIC's L2 receive thread (see the module docs). Ends when the NIC is gone or its
/// fabric shuts down.
fn receive_thread(nic: Weak<dyn WireHost>, wire: Arc<L2Wire>) {
    let mut last_drains = u64::MAX;
    loop {
        let Some(n) = nic.upgrade() else { return };
        if n.is_shut_down() {
            return;
        }
        if (wire.tx_held.load(Ordering::Relaxed) || wire.tx_blocked.load(Ordering::Relaxed))
            && wire.retry_held()
        {
            n.unblocked();
        }
        n.idle(); // timers that fell due while the user was not polling
        let resolving = {
            let mut inner = wire.lock();
            wire.service(&mut inner);
            inner.neigh.resolving()
        };
        if resolving {
            // ARP replies must be read even if nobody polls.
            wire.hot.store(true, Ordering::Relaxed);
            n.take_now();
            drop(n);
            wait_readable(&[wire.wake.raw()], wire.wait_cap(Duration::from_millis(5)));
            let _ = wire.wake.drain();
            continue;
        }
        let drains = wire.drains.load(Ordering::Relaxed);
        if !n.sleepy() && drains != last_drains {
            // The user polls, and its polls drain the port: look again in a tick.
            last_drains = drains;
            drop(n);
            wait_readable(&[wire.wake.raw()], TICK);
            let _ = wire.wake.drain();
            continue;
        }
        // Nobody takes frames without being woken: the user sleeps on an event fd (a CQ is
        // armed, or a device thread parked), or it did not poll for a tick. Sleep on the port's
        // event fd and run the device when a frame comes: a NIC acknowledges what it receives
        // whether or not its application polls.
        let Some(fd) = wire.port_fd else {
            // A port that can only be polled: poll it every tick.
            wire.hot.store(true, Ordering::Relaxed);
            n.take_now();
            last_drains = u64::MAX;
            drop(n);
            wait_readable(&[wire.wake.raw()], TICK);
            let _ = wire.wake.drain();
            continue;
        };
        if wire.lock().port.arm().unwrap_or(true) {
            wire.hot.store(true, Ordering::Relaxed);
            n.take_now();
            last_drains = u64::MAX;
            continue;
        }
        let timeout = n.next_timer().map_or(LONG_SLEEP, |d| d.clamp(Duration::from_micros(50), LONG_SLEEP));
        let timeout = wire.wait_cap(timeout);
        drop(n);
        wait_readable(&[fd, wire.wake.raw()], timeout);
        clear_eventfd(fd);
        let _ = wire.wake.drain();
        wire.hot.store(true, Ordering::Relaxed);
        if let Some(n) = nic.upgrade() {
            n.take_now();
        }
        last_drains = u64::MAX; // a tick to see whether the user polls
    }
}

#[cfg(test)]
mod tests;
