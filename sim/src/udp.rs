//! The UDP wire: simulated NICs in different processes or on different hosts exchange RoCEv2
//! packets as UDP datagrams, one socket per NIC.
//!
//! Each datagram is exactly the UDP payload a RoCEv2 NIC sends — BTH, extension headers, payload,
//! pad, ICRC ([`crate::roce`]) — between the two NICs' own UDP ports (several sim NICs share a
//! host, so they cannot all use port 4791). The RC transport recovers from what UDP does (loss,
//! duplication, reordering) exactly as RoCEv2 does; nothing here retransmits.
//!
//! - **Sending** happens under the sending NIC's device lock: [`UdpLink::transmit`] encodes the
//!   packet into the NIC's send batch (the payload gathered from host memory straight into its
//!   place in the datagram), and [`UdpLink::flush`] hands the batch to the kernel in one
//!   `sendmmsg`. A socket buffer that is full drops the datagram, as a congested network would.
//!   To a NIC on this host, a run of same-sized datagrams to one peer is one segmented message
//!   (`UDP_SEGMENT`), and the receiving socket takes it coalesced (`UDP_GRO`): one buffer
//!   through the kernel per run rather than per datagram ([`UdpPort::send_batch`]).
//! - **Receiving** is the device's: while the NIC's user polls its CQs, each poll reads the
//!   socket (a non-blocking `recvmmsg` of up to a batch, [`UdpPort::drain`], under the device
//!   lock, so there is one reader at a time and packets are handled in the socket's order),
//!   checks each datagram's ICRC and headers and hands it to the device straight from the receive
//!   buffer. A thread per NIC covers a user that does not poll: it reads nothing itself, but when
//!   the polls stop (or a CQ is armed, a device thread parks, `connect` waits for a pong) it
//!   waits on the socket and has the device run on each arrival. Malformed datagrams are counted
//!   ([`UdpStats`], merged into `NicStats::rx_malformed`) and dropped; RoCEv2-shaped datagrams
//!   from addresses no queue is connected to are dropped before their ICRC is computed
//!   (`NicStats::rx_ignored`).
//! - **Loopback**: a queue connected to a queue of its own NIC never reaches the socket: the NIC
//!   loops its packets back through its inbox, as a RoCE NIC does (`WirePort::loops_back`,
//!   `Nic::link`); their source id is the NIC's fabric address, which the peer table skips.
//!   While no queue has a peer on the socket, polls do not read it.
//! - **Addresses**: a NIC on this wire is its socket address. Its queues' `QueueInfo` carries the
//!   IPv4 address as an IPv4-mapped GID (`::ffff:a.b.c.d`, as a RoCE NIC's GID is) and the UDP
//!   port in `lid` (RoCE has no LID). `connect` asks the peer NIC whether it is there (a ping
//!   datagram answered by its device, not by a queue) and fails with the reason when it
//!   does not answer, rather than "connecting" and timing out later.
//! - **Standard RoCEv2 peers** (Linux's rxe, a hardware NIC): a peer `QueueInfo` with an IPv4
//!   GID and `lid` 0 — what a verbs queue reports on RoCE — is one. Such a NIC receives only on
//!   UDP port 4791 and answers no ping, so the sim sends to `<ip>:4791` without pinging, and only
//!   from a NIC bound at port 4791 itself (the peer sends its requests and responses there; a
//!   NIC on another port is refused at `connect`, saying so). Its datagrams come from a per-queue
//!   source port (rxe: `0xC000 | hash`), so they are matched to the peer by IP address, and their
//!   ICRC covers an IPv4 ID the socket does not show: it is checked with the ID solved for
//!   ([`roce::decode_udp_any_id`]). The sim's own datagrams carry ID 0, DF set (the socket asks
//!   for path-MTU discovery, and Linux sends ID 0 on unconnected DF datagrams), which is what
//!   their ICRC is computed over. docs/sim.md, "Interoperating with a real RoCEv2 NIC".

use crate::eventfd::EventFd;
use crate::handoff::RxHandoff;
use crate::packet::{PacketHeader, PacketKind, Syndrome};
use crate::pcap::PcapWriter;
use crate::roce::{self, Endpoints, Link};
use crate::wire::{Transmit, Wire, WireHost, WirePort, WireStats};
use bypass_hal::QueueInfo;
use std::collections::HashMap;
use std::io;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering as AtOrd};
use std::sync::{Arc, Condvar, Mutex, RwLock, Weak};
use std::time::{Duration, Instant};

/// Datagrams one `sendmmsg` / `recvmmsg` moves at most (a `recvmmsg` of buffers the kernel
/// coalesced moves up to this many buffers, each of several datagrams).
const BATCH: usize = 32;
/// `setsockopt(SOL_UDP, ...)` and cmsg types (linux/udp.h; not in the libc crate for glibc):
/// send one buffer as datagrams of a given size; receive datagrams of one flow coalesced.
const UDP_SEGMENT: libc::c_int = 103;
const UDP_GRO: libc::c_int = 104;
/// A receive buffer when the socket coalesces datagrams (`UDP_GRO`): the largest UDP payload.
const GRO_BUF: usize = 65536;
/// Bytes one segmented send (`UDP_SEGMENT`) carries at most: an IPv4 datagram's payload limit,
/// less the UDP header.
const GSO_MAX_BYTES: usize = 65507;
/// Room for one cmsg of an `int` (the receive side's `UDP_GRO`) or a `u16` (the send side's
/// `UDP_SEGMENT`): `CMSG_SPACE(sizeof(int))`, 8-byte aligned.
const CMSG_ROOM: usize = 24;
/// Bytes a datagram needs beyond the payload: BTH, RETH (the longest extension), ImmDt, pad, ICRC.
const OVERHEAD: usize = roce::BTH_LEN + roce::RETH_LEN + roce::IMMDT_LEN + 3 + roce::ICRC_LEN;
/// A ping or pong: 8 bytes of magic, then a 64-bit nonce. The magic's first byte, 0x42, is no RC
/// opcode, so it can never be mistaken for a RoCE packet.
const PING: [u8; 8] = *b"BYPSPING";
const PONG: [u8; 8] = *b"BYPSPONG";
/// How long `connect` waits for the peer NIC's pong (each of three pings).
const PING_WAIT: Duration = Duration::from_millis(300);
/// How long the receive thread sleeps between looks while the NIC's user polls (the polls read
/// the socket; the thread only checks that they go on).
const TICK: Duration = Duration::from_millis(1);
/// The receive thread's longest sleep while it watches the socket (it then looks whether the
/// NIC is gone).
const LONG_SLEEP: Duration = Duration::from_millis(100);
/// The shortest time between two reads of the socket by polls while several threads poll the
/// NIC (see `UdpPort::poll`).
const CROWDED_READ_GAP: Duration = Duration::from_micros(3);
/// How long a NIC counts as polled by several threads after two of them asked for reads in turn.
const CROWDED_HOLD: Duration = Duration::from_millis(1);

/// A token naming the calling thread (the address of a thread-local), never 0.
#[inline]
fn thread_token() -> usize {
    thread_local!(static TOKEN: u8 = const { 0 });
    TOKEN.with(|t| t as *const u8 as usize)
}

/// epoll tokens: the socket, the receive thread's bell.
const SOCK_TOKEN: u64 = 0;
const BELL_TOKEN: u64 = 1;
/// The source id of packets from an address no queue of the NIC is connected to: no queue has
/// it as its peer, so such packets are counted as ignored and dropped.
const UNKNOWN_PEER: u32 = u32::MAX;

/// What a NIC's UDP port counted.
#[derive(Debug, Default)]
pub(crate) struct UdpStats {
    /// Datagrams that were not RoCEv2 packets of ours (short, bad ICRC, unknown opcode, ...).
    pub malformed: AtomicU64,
    /// Datagrams the socket would not take (its buffer was full): lost, as on a network.
    pub send_dropped: AtomicU64,
    /// RoCEv2-looking datagrams from an address no queue of the NIC is connected to: dropped
    /// before their ICRC is computed or anything is copied (`NicStats::rx_ignored`).
    pub strangers: AtomicU64,
    /// `sendmmsg` calls made.
    pub send_calls: AtomicU64,
    /// Segmented sends (`UDP_SEGMENT`: several datagrams handed to the kernel as one buffer).
    pub send_segmented: AtomicU64,
    /// Buffers `recvmmsg` returned (one datagram each, or several the kernel coalesced).
    pub recv_buffers: AtomicU64,
    /// Datagrams read (pings and junk included).
    pub recv_datagrams: AtomicU64,
}

/// The receive batch `drain` reads datagrams into: touched only under the NIC's device lock.
struct RxBatch {
    /// `GRO_BUF` bytes each when the socket coalesces datagrams, one datagram's room if not.
    bufs: Vec<Box<[u8]>>,
    /// The `recvmmsg` headers, built once: the device reads the socket on every poll of a
    /// spinning user, mostly finding it empty, and building 32 headers per read was 15 % of
    /// such a loop's time (`perf record` of the `-t lat` client).
    hdrs: Box<RxHeaders>,
    /// The last source looked up: its address, source id, and whether it is a standard peer.
    last_peer: Option<(SocketAddrV4, u32, bool)>,
}

/// `recvmmsg`'s headers and what they point at besides the buffers: boxed, so the pointers
/// between them stay valid wherever the batch moves.
struct RxHeaders {
    msgs: [libc::mmsghdr; BATCH],
    iovs: [libc::iovec; BATCH],
    addrs: [libc::sockaddr_in; BATCH],
    /// Each buffer's control data: the segment size of a coalesced buffer (`UDP_GRO`).
    ctrl: [[u64; CMSG_ROOM / 8]; BATCH],
}

// SAFETY: the raw pointers in `RxHeaders` point only into the same box and into the buffers of
// the `RxBatch` that owns it (heap memory that lives and moves with it); they are used only by
// `recvmmsg` calls made under the batch's mutex, so sending the batch to another thread sends
// everything they point at along with it.
unsafe impl Send for RxHeaders {}

impl RxHeaders {
    /// Headers over `bufs`, with room for a `UDP_GRO` cmsg each if `gro`.
    fn new(bufs: &mut [Box<[u8]>], gro: bool) -> Box<RxHeaders> {
        // SAFETY: all-zero mmsghdrs, iovecs, sockaddr_ins (null pointers, zero lengths) are
        // valid values of these plain C structs.
        let mut h: Box<RxHeaders> = Box::new(unsafe { std::mem::zeroed() });
        let h_ref = &mut *h;
        for (i, buf) in bufs.iter_mut().enumerate().take(BATCH) {
            h_ref.iovs[i] = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
            let m = &mut h_ref.msgs[i].msg_hdr;
            m.msg_name = (&mut h_ref.addrs[i] as *mut libc::sockaddr_in).cast();
            m.msg_iov = &mut h_ref.iovs[i];
            m.msg_iovlen = 1;
            if gro {
                m.msg_control = h_ref.ctrl[i].as_mut_ptr().cast();
            }
        }
        h_ref.reset(BATCH, gro);
        h
    }

    /// Gives the first `n` headers back the lengths `recvmmsg` overwrites (it writes only the
    /// headers of datagrams it returned).
    #[inline]
    fn reset(&mut self, n: usize, gro: bool) {
        for m in self.msgs.iter_mut().take(n) {
            m.msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as u32;
            m.msg_hdr.msg_controllen = if gro { CMSG_ROOM as _ } else { 0 };
            m.msg_hdr.msg_flags = 0;
        }
    }
}

/// The send batch: up to [`BATCH`] encoded datagrams waiting for `flush`.
struct TxBatch {
    bufs: Vec<Box<[u8]>>,
    lens: [usize; BATCH],
    dests: [SocketAddrV4; BATCH],
    n: usize,
    /// How many of the `n` datagrams are plain ACKs (what a flush may hold back, see
    /// [`UdpPort::flush`]).
    acks: usize,
    /// Which datagrams are plain ACKs.
    plain_ack: [bool; BATCH],
    /// How many of the `n` are a responder's answers other than plain ACKs (READ responses,
    /// atomic ACKs, NAKs): plain ACKs are not moved past them (see `send_batch`).
    answers: usize,
}

/// One NIC's UDP endpoint: its socket, its peers, its send batch.
pub(crate) struct UdpPort {
    sock: UdpSocket,
    local: SocketAddrV4,
    /// Peer socket addresses by source id, and the reverse map. A peer keeps its id for the
    /// NIC's life (one entry per peer NIC, not per connection).
    peers: RwLock<(Vec<SocketAddrV4>, HashMap<SocketAddrV4, u32>)>,
    /// A queue of this NIC reaches a peer through the socket (a peer has an id). Until then
    /// polls read nothing: all the NIC's traffic is looped back inside it (`loops_back`), and
    /// the receive thread, which sees no polls, watches the socket (pings, strangers).
    socket_peers: AtomicBool,
    /// Standard RoCEv2 peers (see the module docs) by IP address: their source id (that of
    /// `<ip>:4791`). Their datagrams come from any source port.
    standard: RwLock<HashMap<Ipv4Addr, u32>>,
    tx: Mutex<TxBatch>,
    /// Runs of datagrams to one loopback peer leave as one segmented send (`UDP_SEGMENT`); off
    /// if the kernel refused it once.
    gso: AtomicBool,
    /// The socket returns datagrams of one flow coalesced (`UDP_GRO`): `drain` splits them.
    gro: bool,
    /// How long (ns) a flush may hold plain ACKs back (`FabricConfig::ack_hold`); 0: never.
    ack_hold: u64,
    /// When (ns after `epoch`, never 0) the plain ACKs a flush held back in `tx` must leave at
    /// the latest; 0 while none is held. Written under `tx`'s lock; read without it by polls.
    ack_due: AtomicU64,
    /// The receive thread watches the socket because nobody polls: flushes hold nothing back
    /// (written by the receive thread, read under `tx`'s lock by flushes).
    unpolled: AtomicBool,
    rx: Mutex<RxBatch>,
    /// Who reads the socket when: reads asked for by polls and the receive thread, done by the
    /// device (`handoff.rs`).
    handoff: RxHandoff,
    /// When (ns after `epoch`) a poll may next ask for a read (see `poll`). It also tells the
    /// receive thread that the user polls (it moves).
    next_read: AtomicU64,
    /// The thread whose poll asked for the last read (a token: see `thread_token`).
    last_reader: AtomicUsize,
    /// Until when (ns after `epoch`) the NIC counts as polled by several threads at once, and
    /// its polls read the socket at most once per [`CROWDED_READ_GAP`].
    crowded_until: AtomicU64,
    epoch: Instant,
    /// Wakes the receive thread: a CQ was armed, `connect` waits for a pong, or shutdown.
    bell: EventFd,
    /// The receive thread's wait set: the socket (edge-triggered) and `bell`.
    epoll: OwnedFd,
    /// `connect`s waiting for a pong: the receive thread watches the socket meanwhile.
    pinging: AtomicU32,
    pub stats: UdpStats,
    /// Outstanding pings of `connect`'s reachability check: (nonce, answered). Only pongs to
    /// these are kept, so a stranger's pongs cannot grow it.
    pongs: Mutex<Vec<(u64, bool)>>,
    pong_cv: Condvar,
    pcap: Option<Arc<PcapWriter>>,
    fabric_id: u32,
    /// The NIC's address on its fabric (names the receive thread).
    nic: u32,
}

impl std::fmt::Debug for UdpPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "UdpPort({})", self.local)
    }
}

impl UdpPort {
    /// Binds a NIC's socket at `addr` (port 0: any free port). The address must be one that peers
    /// can send to: the unspecified address 0.0.0.0 is refused, since it would travel in the
    /// NIC's queue infos. `nic` is the NIC's address on fabric `fabric_id`.
    pub(crate) fn bind(
        addr: SocketAddrV4,
        mtu: u32,
        ack_hold: Duration,
        pcap: Option<Arc<PcapWriter>>,
        fabric_id: u32,
        nic: u32,
    ) -> io::Result<UdpPort> {
        if addr.ip().is_unspecified() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "the UDP wire cannot bind {addr}: give the address peers reach this host at \
                     (e.g. 127.0.0.1 on one host), since it is what the NIC's queue infos carry"
                ),
            ));
        }
        let sock = UdpSocket::bind(addr)
            .map_err(|e| io::Error::new(e.kind(), format!("the UDP wire cannot bind {addr}: {e}")))?;
        // DF on every datagram, never fragmented by this host: Linux then sends IPv4 ID 0 (an
        // unconnected socket), the header the ICRC is computed over, which a standard RoCEv2 peer
        // checks. A datagram over the path MTU fails to send (counted, then retransmitted and
        // failed by the transport) rather than arriving in fragments whose ID no ICRC covers.
        set_int(&sock, libc::IPPROTO_IP, libc::IP_MTU_DISCOVER, libc::IP_PMTUDISC_DO);
        let local = match sock.local_addr()? {
            std::net::SocketAddr::V4(a) => a,
            other => return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("not IPv4: {other}"))),
        };
        // Big buffers absorb bursts (a 4 MiB message is ~1,000 datagrams). The plain options are
        // capped by net.core.rmem_max / wmem_max (often 208 KiB); the FORCE ones, allowed with
        // CAP_NET_ADMIN, are not. Either may fail: the defaults still work, with more loss.
        for (force, plain) in
            [(libc::SO_RCVBUFFORCE, libc::SO_RCVBUF), (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF)]
        {
            if !set_int(&sock, libc::SOL_SOCKET, force, 8 << 20) {
                set_int(&sock, libc::SOL_SOCKET, plain, 8 << 20);
            }
        }
        // Datagrams of one flow arrive coalesced into one buffer when the sender segmented
        // them (loopback) or the kernel merged them (GRO): one buffer per burst, not per packet.
        let gro = set_int(&sock, libc::SOL_UDP, UDP_GRO, 1);
        let size = mtu as usize + OVERHEAD;
        let zero = SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0);
        let tx = TxBatch {
            bufs: (0..BATCH).map(|_| vec![0u8; size].into_boxed_slice()).collect(),
            lens: [0; BATCH],
            dests: [zero; BATCH],
            n: 0,
            acks: 0,
            plain_ack: [false; BATCH],
            answers: 0,
        };
        let rx_size = if gro { GRO_BUF.max(size) } else { size };
        let mut bufs: Vec<Box<[u8]>> = (0..BATCH).map(|_| vec![0u8; rx_size].into_boxed_slice()).collect();
        let hdrs = RxHeaders::new(&mut bufs, gro);
        let rx = RxBatch { bufs, hdrs, last_peer: None };
        let bell = EventFd::new()?;
        // SAFETY: epoll_create1 has no memory-safety preconditions; the result is checked.
        let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if ep < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `ep` is a fresh descriptor that nothing else owns.
        let epoll = unsafe { OwnedFd::from_raw_fd(ep) };
        epoll_add(&epoll, sock.as_raw_fd(), (libc::EPOLLIN | libc::EPOLLET) as u32, SOCK_TOKEN)?;
        epoll_add(&epoll, bell.raw(), libc::EPOLLIN as u32, BELL_TOKEN)?;
        Ok(UdpPort {
            sock,
            local,
            peers: RwLock::new((Vec::new(), HashMap::new())),
            socket_peers: AtomicBool::new(false),
            standard: RwLock::new(HashMap::new()),
            tx: Mutex::new(tx),
            gso: AtomicBool::new(true),
            gro,
            ack_hold: ack_hold.as_nanos().min(u128::from(u64::MAX / 2)) as u64,
            ack_due: AtomicU64::new(0),
            unpolled: AtomicBool::new(true),
            rx: Mutex::new(rx),
            handoff: RxHandoff::default(),
            next_read: AtomicU64::new(0),
            last_reader: AtomicUsize::new(0),
            crowded_until: AtomicU64::new(0),
            epoch: Instant::now(),
            bell,
            epoll,
            pinging: AtomicU32::new(0),
            stats: UdpStats::default(),
            pongs: Mutex::new(Vec::new()),
            pong_cv: Condvar::new(),
            pcap,
            fabric_id,
            nic,
        })
    }

    /// The receive thread's sleep: up to `wait`, woken by its bell and, if `watch`, by datagrams
    /// arriving on the socket (edge-triggered: an arrival wakes it once, even if earlier ones are
    /// still unread). True if datagrams arrived.
    fn wait(&self, wait: Duration, watch: bool) -> bool {
        let ms = wait.as_millis().clamp(1, i32::MAX as u128) as i32;
        let mut arrived = false;
        if watch {
            // SAFETY: an all-zero epoll_event is a valid plain C struct.
            let mut evs: [libc::epoll_event; 2] = unsafe { std::mem::zeroed() };
            // SAFETY: the kernel writes at most 2 events into `evs`, which lives in this frame.
            let r = unsafe { libc::epoll_wait(self.epoll.as_raw_fd(), evs.as_mut_ptr(), 2, ms) };
            for e in evs.iter().take(r.max(0) as usize) {
                arrived |= { e.u64 } == SOCK_TOKEN;
            }
        } else {
            let mut pfd = libc::pollfd { fd: self.bell.raw(), events: libc::POLLIN, revents: 0 };
            // SAFETY: one live pollfd.
            unsafe { libc::poll(&mut pfd, 1, ms) };
        }
        let _ = self.bell.drain();
        arrived
    }

    /// The device's receive path, run under the NIC's device lock, so there is one reader at a
    /// time and packets are handled in the order the socket holds them: takes up to a batch of
    /// datagrams without waiting, answers pings, drops junk and strangers' frames, and hands each
    /// packet to `recv` straight from the receive buffer (no copy through the inbox). A batch
    /// that is not full means the socket was empty: the reads asked for before are done.
    fn drain(&self, nic: u32, recv: &mut dyn FnMut(&PacketHeader, &[u8])) {
        self.handoff.read(|| (self.read_batch(nic, recv), ()));
    }

    /// One non-blocking `recvmmsg` of up to a batch of buffers, each datagram handled (see
    /// `drain`; a buffer the kernel coalesced is split into its datagrams): true if the socket
    /// was found empty (fewer buffers than a batch, or an error a read would meet again).
    fn read_batch(&self, nic: u32, recv: &mut dyn FnMut(&PacketHeader, &[u8])) -> bool {
        let mut guard = self.rx.lock().unwrap_or_else(|e| e.into_inner());
        let RxBatch { bufs, hdrs, last_peer } = &mut *guard;
        // SAFETY: every header points at a live sockaddr_in, iovec, buffer and control buffer
        // (in `hdrs` and `bufs`, locked), sized as declared (`RxHeaders::new`; lengths the
        // kernel overwrote are reset below); the kernel writes at most that much and does not
        // wait (MSG_DONTWAIT). The bare system call, not libc's wrapper: `recvmmsg` is a
        // cancellation point, and the wrapper's cancellation toggles around it were 6 % of a
        // spinning poll loop; no thread of ours is ever cancelled.
        let r = unsafe {
            libc::syscall(
                libc::SYS_recvmmsg,
                self.sock.as_raw_fd(),
                hdrs.msgs.as_mut_ptr(),
                BATCH as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut::<libc::timespec>(),
            )
        };
        if r <= 0 {
            // Empty (EAGAIN), or an error a read would meet again; EINTR: look again.
            return r == 0 || io::Error::last_os_error().kind() != io::ErrorKind::Interrupted;
        }
        let got = r as usize;
        let mut datagrams = 0u64;
        let RxHeaders { msgs, addrs, .. } = &**hdrs;
        for (i, m) in msgs.iter().enumerate().take(got) {
            let len = m.msg_len as usize;
            let a = addrs[i];
            let from =
                SocketAddrV4::new(Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)), u16::from_be(a.sin_port));
            if len > bufs[i].len() || m.msg_hdr.msg_flags & libc::MSG_TRUNC != 0 {
                self.stats.malformed.fetch_add(1, AtOrd::Relaxed);
                continue;
            }
            // A coalesced buffer holds datagrams of `seg` bytes each, the last one shorter or
            // equal (what the sender's segmented send or the kernel's GRO put together).
            let seg = if self.gro { gro_segment(&m.msg_hdr).unwrap_or(len) } else { len };
            let seg = if seg == 0 { len } else { seg };
            // At least one datagram, an empty one included.
            let mut off = 0;
            loop {
                let end = (off + seg).min(len);
                datagrams += 1;
                self.take_datagram(nic, &bufs[i][off..end], from, last_peer, recv);
                off = end;
                if off >= len {
                    break;
                }
            }
        }
        hdrs.reset(got, self.gro);
        self.stats.recv_buffers.fetch_add(got as u64, AtOrd::Relaxed);
        self.stats.recv_datagrams.fetch_add(datagrams, AtOrd::Relaxed);
        got < BATCH
    }

    /// Handles one datagram read from `from`: answers a ping, drops junk and strangers' frames,
    /// else decodes it (ICRC first) and hands it to `recv`.
    #[inline]
    fn take_datagram(
        &self,
        nic: u32,
        dgram: &[u8],
        from: SocketAddrV4,
        last_peer: &mut Option<(SocketAddrV4, u32, bool)>,
        recv: &mut dyn FnMut(&PacketHeader, &[u8]),
    ) {
        let len = dgram.len();
        if len == 16 && (dgram[..8] == PING || dgram[..8] == PONG) {
            self.ping_pong(dgram, from);
            return;
        }
        if let Err(e) = roce_shaped(dgram) {
            self.stats.malformed.fetch_add(1, AtOrd::Relaxed);
            if bypass_hal::trace::is_enabled() {
                trace_malformed(nic, from, len, e);
            }
            return;
        }
        let (src, standard) = match *last_peer {
            Some((a, id, std)) if a == from => (id, std),
            _ => {
                let (id, std) = self.lookup(from);
                *last_peer = Some((from, id, std));
                (id, std)
            }
        };
        if src == UNKNOWN_PEER {
            // No queue of this NIC is connected to the sender: its frame would reach none.
            // Dropped before the ICRC is computed or a byte is copied, so a flood of them
            // costs little more than reading it (issue 30, defect 10).
            self.stats.strangers.fetch_add(1, AtOrd::Relaxed);
            return;
        }
        let local = self.local;
        let ep = Endpoints {
            src_ip: from.ip().octets(),
            dst_ip: local.ip().octets(),
            src_port: from.port(),
            dst_port: local.port(),
        };
        let decoded =
            if standard { roce::decode_udp_any_id(dgram, &ep) } else { roce::decode_udp(dgram, &ep) };
        let frame = match decoded {
            Ok(f) => f,
            Err(e) => {
                self.stats.malformed.fetch_add(1, AtOrd::Relaxed);
                if bypass_hal::trace::is_enabled() {
                    trace_malformed(nic, from, len, e);
                }
                return;
            }
        };
        let ctx = roce::RxContext::from_wire(src, nic, frame.psn);
        recv(&frame.to_header(&ctx), frame.payload);
    }

    /// Answers a ping; records a pong that `connect` waits for (others are junk).
    #[cold]
    fn ping_pong(&self, dgram: &[u8], from: SocketAddrV4) {
        if dgram[..8] == PING {
            let mut pong = [0u8; 16];
            pong[..8].copy_from_slice(&PONG);
            pong[8..].copy_from_slice(&dgram[8..]);
            let _ = self.sock.send_to(&pong, from);
            return;
        }
        let nonce = u64::from_le_bytes(dgram[8..16].try_into().expect("8 bytes"));
        let mut pongs = self.pongs.lock().unwrap_or_else(|e| e.into_inner());
        match pongs.iter_mut().find(|(n, _)| *n == nonce) {
            Some(p) => {
                p.1 = true;
                self.pong_cv.notify_all();
            }
            None => drop(self.stats.malformed.fetch_add(1, AtOrd::Relaxed)),
        }
    }

    /// The source id of peer `addr`, assigned on first use.
    pub(crate) fn peer_id(&self, addr: SocketAddrV4) -> u32 {
        if let Some(&id) = self.peers.read().unwrap_or_else(|e| e.into_inner()).1.get(&addr) {
            return id;
        }
        let mut p = self.peers.write().unwrap_or_else(|e| e.into_inner());
        if let Some(&id) = p.1.get(&addr) {
            return id;
        }
        let mut id = p.0.len() as u32;
        if id == self.nic {
            // The NIC's own fabric address is the source id of the packets it loops back to
            // itself (see `loops_back`): no peer may have it.
            p.0.push(self.local);
            id += 1;
        }
        p.0.push(addr);
        p.1.insert(addr, id);
        self.socket_peers.store(true, AtOrd::Relaxed);
        id
    }

    /// The source id of a datagram from `addr`, and whether it is from a standard RoCEv2 peer.
    fn lookup(&self, addr: SocketAddrV4) -> (u32, bool) {
        if let Some(&id) = self.peers.read().unwrap_or_else(|e| e.into_inner()).1.get(&addr) {
            return (id, false);
        }
        match self.standard.read().unwrap_or_else(|e| e.into_inner()).get(addr.ip()) {
            Some(&id) => (id, true),
            None => (UNKNOWN_PEER, false),
        }
    }

    /// Where a queue connecting to `peer` (whose GID is the IPv4 address `ip`) sends, and the
    /// peer's source id: a sim NIC at `ip:lid` once it answered a ping, or a standard RoCEv2
    /// NIC (`lid` 0) at `ip:4791`, which this NIC must be bound at port 4791 to talk to.
    pub(crate) fn reach(&self, peer: &QueueInfo, ip: Ipv4Addr) -> Result<(SocketAddrV4, u32), String> {
        if peer.lid != 0 {
            let to = SocketAddrV4::new(ip, peer.lid);
            self.ping(to)?;
            return Ok((to, self.peer_id(to)));
        }
        if self.local.port() != roce::ROCE_PORT {
            return Err(format!(
                "the peer's queue info names the IP address {ip} and no UDP port (lid 0): a standard \
                 RoCEv2 NIC, which sends its requests and acknowledgements to UDP port {p} only, but \
                 this NIC is bound at {}: bind it at port {p} (sim+udp://{}:{p}), on an address of a \
                 host or network namespace where no kernel RoCE device (rxe, a NIC) owns that port",
                self.local,
                self.local.ip(),
                p = roce::ROCE_PORT
            ));
        }
        if ip == *self.local.ip() {
            return Err(format!(
                "the peer's queue info names this NIC's own address {ip} with no UDP port: a \
                 standard RoCEv2 peer must be another host (or network namespace)"
            ));
        }
        let to = SocketAddrV4::new(ip, roce::ROCE_PORT);
        let id = self.peer_id(to);
        self.standard.write().unwrap_or_else(|e| e.into_inner()).insert(ip, id);
        Ok((to, id))
    }

    /// Checks that a sim NIC answers at `peer`: sends a ping and waits for its pong.
    pub(crate) fn ping(&self, peer: SocketAddrV4) -> Result<(), String> {
        static NONCE: AtomicU64 = AtomicU64::new(1);
        let nonce = NONCE.fetch_add(1, AtOrd::Relaxed) ^ u64::from(std::process::id()) << 40;
        let mut msg = [0u8; 16];
        msg[..8].copy_from_slice(&PING);
        msg[8..].copy_from_slice(&nonce.to_le_bytes());
        self.pongs.lock().unwrap_or_else(|e| e.into_inner()).push((nonce, false));
        // The pong is read by the device; have the receive thread watch the socket meanwhile
        // (this thread, which may be the NIC's only poller, waits here).
        self.pinging.fetch_add(1, AtOrd::SeqCst);
        self.bell.signal();
        let answered = (|| {
            for _ in 0..3 {
                if let Err(e) = self.sock.send_to(&msg, peer) {
                    return Err(format!("cannot send to the peer NIC at {peer}: {e}"));
                }
                let deadline = Instant::now() + PING_WAIT;
                let mut got = self.pongs.lock().unwrap_or_else(|e| e.into_inner());
                loop {
                    if got.iter().any(|&(n, yes)| n == nonce && yes) {
                        return Ok(true);
                    }
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break;
                    }
                    got = self.pong_cv.wait_timeout(got, left).unwrap_or_else(|e| e.into_inner()).0;
                }
            }
            Ok(false)
        })();
        self.pongs.lock().unwrap_or_else(|e| e.into_inner()).retain(|&(n, _)| n != nonce);
        self.pinging.fetch_sub(1, AtOrd::SeqCst);
        if answered? {
            return Ok(());
        }
        Err(format!(
            "no simulated NIC answers at {peer} (UDP) from {}: the peer process is gone, the address \
             is wrong, or a firewall drops UDP between the hosts",
            self.local
        ))
    }

    /// Encodes one packet into the send batch (sending the batch first if it is full).
    fn transmit(&self, to: SocketAddrV4, hdr: &PacketHeader, fill: &mut dyn FnMut(&mut [u8])) -> Transmit {
        let mut tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        if tx.n == BATCH {
            self.send_batch(&mut tx);
        }
        let ep = self.endpoints(to);
        let i = tx.n;
        match roce::encode_udp_with(hdr, &ep, &mut tx.bufs[i], fill) {
            Ok(len) => {
                tx.lens[i] = len;
                tx.dests[i] = to;
                tx.n += 1;
                let plain_ack = hdr.kind == PacketKind::Ack && hdr.syndrome == Syndrome::Ack;
                tx.plain_ack[i] = plain_ack;
                if plain_ack {
                    tx.acks += 1;
                } else if !hdr.kind.is_request() {
                    tx.answers += 1;
                }
                if let Some(w) = &self.pcap {
                    self.capture(w, hdr, to, &tx.bufs[i][..len]);
                }
                Transmit::Sent
            }
            Err(_) => Transmit::Dropped, // larger than the MTU the socket buffers were sized for
        }
    }

    /// The endpoints a datagram to `to` is sent between (what its ICRC covers).
    fn endpoints(&self, to: SocketAddrV4) -> Endpoints {
        Endpoints {
            src_ip: self.local.ip().octets(),
            dst_ip: to.ip().octets(),
            src_port: self.local.port(),
            dst_port: to.port(),
        }
    }

    /// Writes a sent packet to the capture as RoCEv2 on port 4791 between the real addresses
    /// (re-encoded, so its ICRC matches the capture's headers and Wireshark's dissector reads it).
    #[cold]
    fn capture(&self, w: &PcapWriter, hdr: &PacketHeader, to: SocketAddrV4, datagram: &[u8]) {
        let hl = roce::Opcode::of(hdr).header_len();
        let plen = hdr.payload_len as usize;
        let Some(payload) = datagram.get(hl..hl + plen) else { return };
        let ep = Endpoints {
            src_ip: self.local.ip().octets(),
            dst_ip: to.ip().octets(),
            src_port: roce::udp_source_port(hdr.src_qpn, hdr.dst_qpn),
            dst_port: roce::ROCE_PORT,
        };
        let link = Link {
            src_mac: mac_of(self.fabric_id, self.local),
            dst_mac: mac_of(self.fabric_id, to),
            ..Link::of_packet(self.fabric_id, hdr)
        };
        let mut frame = vec![0u8; roce::ethernet_len(hdr)];
        if let Ok(n) = roce::encode_ethernet(hdr, payload, &ep, &link, &mut frame) {
            w.write_frame(&frame[..n]);
        }
    }

    /// Whether datagrams to `to` may leave as one segmented send (`UDP_SEGMENT`): only to this
    /// host (the loopback device), where no wire carries them apart. The kernel numbers the
    /// IPv4 ID of a segmented send's datagrams 0, 1, 2, ..., where a datagram sent alone has
    /// ID 0 (what its ICRC covers); on loopback the receiving socket gets them coalesced (or,
    /// without `UDP_GRO`, split by the kernel) and never sees an ID, so nothing differs for the
    /// receiver. A datagram to another host, or to port 4791 (where a standard RoCEv2 NIC
    /// listens, which checks those IDs), leaves alone, exactly as a RoCE NIC sends it.
    #[inline]
    fn segments_to(&self, to: SocketAddrV4) -> bool {
        (to.ip().is_loopback() || to.ip() == self.local.ip()) && to.port() != roce::ROCE_PORT
    }

    /// Hands the batch to the kernel in one `sendmmsg`: a run of datagrams of one size to one
    /// peer on this host goes as one message the kernel segments (`UDP_SEGMENT`; the last of
    /// the run may be shorter), so a burst of 32 requests is one buffer through the kernel's
    /// UDP and IP layers instead of 32. The datagrams are the same either way.
    ///
    /// Plain ACKs in a batch with requests go last (a ping-pong's batch is the ACK of the last
    /// answer and the next request): an ACK is shorter than a request carrying data, so it ends
    /// the request's run and the two are one buffer through the kernel, not two. Moving an ACK
    /// behind requests changes no outcome: the ACKs of a queue are a stream of their own,
    /// independent of its requests (RoCE has no piggybacking), and each acknowledges every PSN
    /// up to its own. It is never moved behind READ responses, atomic ACKs or NAKs, which share
    /// the ACKs' PSN order (a later ACK would look stale).
    fn send_batch(&self, tx: &mut TxBatch) {
        let n = tx.n;
        if n == 0 {
            return;
        }
        let gso = self.gso.load(AtOrd::Relaxed);
        let mut addrs: [libc::sockaddr_in; BATCH] = [sockaddr_in(tx.dests[0]); BATCH];
        let mut iovs: [libc::iovec; BATCH] =
            [libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; BATCH];
        let mut ctrl = [[0u64; CMSG_ROOM / 8]; BATCH];
        // SAFETY: an all-zero mmsghdr is a valid (empty) value of this plain C struct.
        let mut msgs: [libc::mmsghdr; BATCH] = unsafe { std::mem::zeroed() };
        // The datagrams each message carries.
        let mut count = [0usize; BATCH];
        // The order datagrams leave in: plain ACKs last if they may move (see above).
        let mut ord = [0u8; BATCH];
        let acks_last = gso && tx.acks > 0 && tx.acks < n && tx.answers == 0;
        let mut k = 0;
        for pass in [false, true] {
            for (i, &ack) in tx.plain_ack.iter().enumerate().take(n) {
                if !acks_last && !pass || acks_last && ack == pass {
                    ord[k] = i as u8;
                    k += 1;
                }
            }
        }
        debug_assert_eq!(k, n);
        for (iov, &d) in iovs.iter_mut().zip(&ord).take(n) {
            let d = usize::from(d);
            *iov = libc::iovec { iov_base: tx.bufs[d].as_mut_ptr().cast(), iov_len: tx.lens[d] };
        }
        let dest = |k: usize| tx.dests[usize::from(ord[k])];
        let size = |k: usize| tx.lens[usize::from(ord[k])];
        let mut m = 0;
        let mut i = 0;
        while i < n {
            let (to, len) = (dest(i), size(i));
            let mut j = i + 1;
            if gso && self.segments_to(to) {
                // Same peer; the size of the first, the last possibly shorter; 64 KiB at most.
                while j < n && dest(j) == to && size(j) <= len && (j - i + 1) * len <= GSO_MAX_BYTES {
                    j += 1;
                    if size(j - 1) < len {
                        break;
                    }
                }
            }
            addrs[m] = sockaddr_in(to);
            let h = &mut msgs[m].msg_hdr;
            h.msg_name = (&mut addrs[m] as *mut libc::sockaddr_in).cast();
            h.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as u32;
            h.msg_iov = &mut iovs[i];
            h.msg_iovlen = (j - i) as _;
            if j - i > 1 {
                h.msg_control = ctrl[m].as_mut_ptr().cast();
                h.msg_controllen = CMSG_ROOM as _;
                // SAFETY: the control buffer is CMSG_ROOM (= CMSG_SPACE of an int, which covers
                // a u16) bytes, 8-byte aligned, and `h` describes it, so the first cmsg header
                // and its data fit in it.
                unsafe {
                    let c = libc::CMSG_FIRSTHDR(h);
                    (*c).cmsg_level = libc::SOL_UDP;
                    (*c).cmsg_type = UDP_SEGMENT;
                    (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<u16>() as u32) as _;
                    std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<u16>(), len as u16);
                    h.msg_controllen = libc::CMSG_SPACE(std::mem::size_of::<u16>() as u32) as _;
                }
            }
            count[m] = j - i;
            m += 1;
            i = j;
        }
        let mut done = 0;
        while done < m {
            // SAFETY: msgs[done..m] point at addresses, iovecs, control data and buffers that
            // live in this frame or in `tx` (borrowed mutably for the call); the kernel only
            // reads them.
            let r = unsafe {
                libc::sendmmsg(
                    self.sock.as_raw_fd(),
                    msgs[done..].as_mut_ptr(),
                    (m - done) as u32,
                    libc::MSG_DONTWAIT,
                )
            };
            self.stats.send_calls.fetch_add(1, AtOrd::Relaxed);
            if r > 0 {
                let sent = &count[done..done + r as usize];
                let segmented = sent.iter().filter(|&&c| c > 1).count();
                if segmented > 0 {
                    self.stats.send_segmented.fetch_add(segmented as u64, AtOrd::Relaxed);
                }
                done += r as usize;
                continue;
            }
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            if count[done] > 1 && matches!(err.raw_os_error(), Some(libc::EIO | libc::EINVAL)) {
                // The kernel does not segment for this socket or route: send datagrams alone
                // from now on (these are lost; the transport retransmits them).
                self.gso.store(false, AtOrd::Relaxed);
            }
            // Full socket buffer (EAGAIN/ENOBUFS) or an unreachable peer: the first message's
            // datagrams are lost, as on a network; the transport's retransmission recovers them.
            self.stats.send_dropped.fetch_add(count[done] as u64, AtOrd::Relaxed);
            done += 1;
        }
        tx.n = 0;
        tx.acks = 0;
        tx.answers = 0;
        if self.ack_due.load(AtOrd::Relaxed) != 0 {
            self.ack_due.store(0, AtOrd::Relaxed);
        }
    }

    /// Hands the batch to the kernel — unless it holds only plain ACKs, the NIC's user polls
    /// and nobody is about to sleep (`eager` false): then they wait, for at most `ack_hold`
    /// (`FabricConfig::ack_hold`, 20 µs by default, far below any ACK timeout in use),
    /// for the next packet the NIC sends (a responder's reply, a requester's next request) and
    /// leave in the same `sendmmsg`, and the peer reads both with one `recvmmsg`. A ping-pong
    /// then costs each side one send and one read per call instead of two of each. Polls send
    /// held ACKs when they fall due ([`UdpPort::send_due_acks`]), the receive thread when
    /// nobody polls.
    fn flush(&self, eager: bool) {
        let mut tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        let hold = !eager && self.ack_hold > 0 && tx.n == tx.acks && !self.unpolled.load(AtOrd::Relaxed);
        if hold && tx.n > 0 {
            if self.ack_due.load(AtOrd::Relaxed) == 0 {
                let due = self.epoch.elapsed().as_nanos() as u64 + self.ack_hold;
                self.ack_due.store(due.max(1), AtOrd::Relaxed);
            }
            return;
        }
        self.send_batch(&mut tx);
    }

    /// Sends the ACKs a flush held back if they are due at `now` (ns after `epoch`), or at
    /// once if `now` is `u64::MAX`. A poll asks with one load when none is held.
    #[inline]
    fn send_due_acks(&self, now: u64) {
        let due = self.ack_due.load(AtOrd::Relaxed);
        if due != 0 && now >= due {
            self.send_held_acks(now);
        }
    }

    /// Several threads began to poll the NIC: wakes the receive thread, which reads from now on.
    #[cold]
    fn crowded_onset(&self) {
        self.bell.signal();
    }

    /// Several threads poll the NIC (see `poll`): the receive thread reads.
    fn crowded(&self) -> bool {
        self.epoch.elapsed().as_nanos() as u64 <= self.crowded_until.load(AtOrd::Relaxed)
    }

    #[cold]
    fn send_held_acks(&self, now: u64) {
        let mut tx = if now == u64::MAX {
            // The receive thread, nobody polling: a flush that is holding ACKs back right now
            // must not be passed by.
            self.tx.lock().unwrap_or_else(|e| e.into_inner())
        } else {
            // A poll that finds the batch locked leaves it: the holder is sending or adding to
            // it, and the next poll looks again.
            match self.tx.try_lock() {
                Ok(tx) => tx,
                Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => return,
            }
        };
        let due = self.ack_due.load(AtOrd::Relaxed);
        if due != 0 && now >= due {
            self.send_batch(&mut tx);
        }
    }
}

/// A locally administered MAC address for a socket address, for captures.
fn mac_of(fabric: u32, a: SocketAddrV4) -> [u8; 6] {
    let ip = a.ip().octets();
    [0x02, fabric as u8, ip[2], ip[3], (a.port() >> 8) as u8, a.port() as u8]
}

fn sockaddr_in(a: SocketAddrV4) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: a.port().to_be(),
        sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(a.ip().octets()) },
        sin_zero: [0; 8],
    }
}

/// Sets an integer socket option; false if the kernel refused it.
fn set_int(sock: &UdpSocket, level: libc::c_int, opt: libc::c_int, value: libc::c_int) -> bool {
    // SAFETY: setsockopt reads `size_of::<c_int>()` bytes at the pointer, which is a live c_int;
    // a failure leaves the socket as it was.
    let r = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            level,
            opt,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as u32,
        )
    };
    r == 0
}

/// The wire from one NIC to one peer NIC on the UDP wire.
pub(crate) struct UdpLink {
    port: Arc<UdpPort>,
    to: SocketAddrV4,
}

impl Wire for UdpLink {
    fn transmit(&self, hdr: &PacketHeader, fill: &mut dyn FnMut(&mut [u8])) -> Transmit {
        self.port.transmit(self.to, hdr, fill)
    }

    fn flush(&self, eager: bool) {
        self.port.flush(eager);
    }
}

impl WirePort for UdpPort {
    fn name(&self) -> &'static str {
        "UDP"
    }

    fn backend_hint(&self) -> &'static str {
        "sim+udp://<address>"
    }

    /// The IPv4 address as an IPv4-mapped GID, the UDP port in `lid`.
    fn endpoint(&self) -> ([u8; 16], u16) {
        (gid_of(*self.local.ip()), self.local.port())
    }

    /// An IPv4-mapped GID: a sim NIC on this wire (`lid` its port) or a standard RoCEv2 NIC.
    fn accepts(&self, peer: &QueueInfo) -> bool {
        ip_of_gid(&peer.gid).is_some()
    }

    fn connect(self: Arc<Self>, peer: &QueueInfo) -> Result<(Arc<dyn Wire>, u32), String> {
        let Some(ip) = ip_of_gid(&peer.gid) else {
            return Err(format!("the peer's GID {:?} is no IPv4 address", peer.gid));
        };
        let (to, id) = self.reach(peer, ip)?;
        Ok((Arc::new(UdpLink { port: self, to }), id))
    }

    /// A queue connected to a queue of this NIC never touches the socket.
    fn loops_back(&self) -> bool {
        true
    }

    /// Sent datagrams are captured between the NICs' real addresses (see `capture`).
    fn captures_itself(&self) -> bool {
        true
    }

    fn start(self: Arc<Self>, host: Weak<dyn WireHost>) -> io::Result<Option<std::thread::JoinHandle<()>>> {
        let name = format!("bypass-sim-udp{}", self.nic);
        let handle = std::thread::Builder::new().name(name).spawn(move || receive_thread(host, self))?;
        Ok(Some(handle))
    }

    /// The device reads the socket itself ([`drain`](UdpPort::drain)).
    fn polled(&self) -> bool {
        true
    }

    /// A read was asked for (a poll, or an arrival the receive thread saw) since the socket was
    /// last found empty: two loads.
    #[inline]
    fn pending(&self) -> bool {
        self.handoff.pending()
    }

    /// Whether datagrams wait cannot be told without a system call, so a poll asks for a read,
    /// as a busy-polling socket program does — while one thread polls the NIC. While several do
    /// (a client and its server in one process on one NIC, as the C library's `TCP` type runs
    /// them: the caller, the client's worker and the server's worker), polls read nothing and
    /// the receive thread reads on arrivals, as it does for a sleeping user. Reading from every
    /// poll of every thread kept each spinning thread in system calls most of the time, with
    /// the device lock held (61 `recvmmsg` per call of `capi_bench`, against 2.7 by the thread,
    /// even with reads spaced 3 µs apart for all pollers together): with more spinning threads
    /// than cores the one that had to answer got the CPU late, and calls took ~25 % longer
    /// than with the thread (docs/BENCHMARKS.md). Who polls is looked at once per
    /// [`CROWDED_READ_GAP`] while several do.
    ///
    /// A NIC with no peer on the socket (its queues all loop back inside it) reads nothing
    /// from polls: the receive thread, seeing no polls, watches the socket.
    #[inline]
    fn poll(&self) -> bool {
        if !self.socket_peers.load(AtOrd::Relaxed) {
            return self.pending();
        }
        let now = self.epoch.elapsed().as_nanos() as u64;
        self.send_due_acks(now);
        let next = self.next_read.load(AtOrd::Relaxed);
        if now < next {
            return self.pending();
        }
        let me = thread_token();
        if self.last_reader.load(AtOrd::Relaxed) != me {
            self.last_reader.store(me, AtOrd::Relaxed);
            if self.crowded_until.swap(now + CROWDED_HOLD.as_nanos() as u64, AtOrd::Relaxed) <= now {
                // Several threads poll from now on: the receive thread must take over reading.
                self.crowded_onset();
            }
        }
        let crowded = now < self.crowded_until.load(AtOrd::Relaxed);
        let gap = if crowded { CROWDED_READ_GAP.as_nanos() as u64 } else { 0 };
        // `now + 1` at least, so that `next_read` moves on every poll that gets here (it tells
        // the receive thread that the user polls).
        let until = now + gap.max(1);
        if self.next_read.compare_exchange(next, until, AtOrd::Relaxed, AtOrd::Relaxed).is_err() || crowded {
            return self.pending(); // another poller asked just now, or the thread reads
        }
        self.handoff.ask();
        true
    }

    fn drain(&self, nic: u32, recv: &mut dyn FnMut(&PacketHeader, &[u8])) {
        UdpPort::drain(self, nic, recv)
    }

    /// Rings the receive thread if it sleeps on its tick, so that it watches the socket from now
    /// on. Off the hot path: only event-mode users arm CQs.
    fn attention(&self) {
        // The caller raised the NIC's armed count before this call (`RxHandoff::attention`).
        if self.handoff.attention() {
            self.bell.signal();
        }
    }

    fn stats(&self) -> WireStats {
        WireStats {
            rx_malformed: self.stats.malformed.load(AtOrd::Relaxed),
            rx_ignored: self.stats.strangers.load(AtOrd::Relaxed),
            tx_dropped: self.stats.send_dropped.load(AtOrd::Relaxed),
            tx_wakeups: 0,
            tx_sends: self.stats.send_calls.load(AtOrd::Relaxed),
        }
    }

    fn shut_down(&self) {
        self.bell.signal();
    }

    fn socket_addr(&self) -> Option<SocketAddrV4> {
        Some(self.local)
    }
}

/// Body of a NIC's UDP receive thread. It never reads a datagram itself: reading is the
/// device's, under the device lock ([`UdpPort::drain`]). It makes sure someone reads when the
/// NIC's user does not:
///
/// - while the user polls the NIC's CQs (each poll reads the socket), it sleeps on a tick and
///   only checks that the polls go on;
/// - when they stop, or the user is about to sleep (a CQ is armed, a Threaded device thread
///   parked), or `connect` waits for a pong, it has the device take what arrived meanwhile,
///   then waits on the socket (edge-triggered) and has the device run on every arrival — on this
///   thread with the Inline engine, on the device thread with the Threaded one.
///
/// It also runs due timers for an engine without threads. Ends when the NIC is gone or its
/// fabric shuts down.
fn receive_thread(nic: Weak<dyn WireHost>, port: Arc<UdpPort>) {
    let mut last_polls = 0u64;
    // As `unpolled` starts: nobody has polled yet (a first look that finds polls stops watching
    // and lets flushes hold ACKs back).
    let mut watching = true;
    loop {
        let Some(n) = nic.upgrade() else { return };
        if n.is_shut_down() {
            return;
        }
        // Moved by the user's polls only.
        let polls = port.next_read.load(AtOrd::Relaxed);
        let polled = polls != last_polls;
        last_polls = polls;
        let watch = !polled || port.crowded() || n.sleepy() || port.pinging.load(AtOrd::Acquire) > 0;
        if watch != watching {
            // Flushes hold ACKs back only while someone polls (and sends them when due). The
            // flag is written before the batch is looked at under its lock, so a flush either
            // saw it or left its ACKs for this look.
            port.unpolled.store(watch, AtOrd::Relaxed);
        }
        if watch && !watching {
            port.send_due_acks(u64::MAX);
            // Nobody will read soon: take what arrived since the last poll now; from here on the
            // socket's readiness says when to look again.
            port.handoff.ask();
            n.take_now();
        }
        watching = watch;
        n.idle(); // timers that fell due while the user was not polling
        if watch {
            let wait = match n.next_timer() {
                None => LONG_SLEEP,
                Some(d) => d.clamp(Duration::from_micros(50), LONG_SLEEP),
            };
            drop(n);
            if port.wait(wait, true) {
                let Some(n) = nic.upgrade() else { return };
                port.handoff.ask();
                n.take_now();
            }
        } else {
            // A CQ armed after `sleepy` was read found the thread not ticking and rang no bell:
            // this look sees it.
            if !port.handoff.may_tick(|| n.armed() || port.pinging.load(AtOrd::SeqCst) > 0) {
                continue;
            }
            drop(n);
            port.wait(TICK, false);
            port.handoff.end_tick();
            // ACKs held back for a poll that did not come (the user polls another NIC's CQs).
            port.send_due_acks(port.epoch.elapsed().as_nanos() as u64);
        }
    }
}

#[cold]
fn trace_malformed(nic: u32, from: SocketAddrV4, len: usize, e: roce::FrameError) {
    let _ = e;
    let args = [("from_port", from.port().into()), ("len", len.into())];
    bypass_hal::trace::instant(bypass_hal::trace::Track::Nic(nic), "malformed frame dropped", &args);
}

/// Whether a datagram is shaped like a RoCEv2 packet the sim handles (a known RC opcode and room
/// for its headers and ICRC), or why not: cheap, before the sender is looked up; the ICRC is
/// checked later, for known senders only.
fn roce_shaped(dgram: &[u8]) -> Result<(), roce::FrameError> {
    let Some(&b) = dgram.first() else {
        return Err(roce::FrameError::TooShort { len: 0, need: roce::BTH_LEN + roce::ICRC_LEN });
    };
    let need = roce::Opcode::from_byte(b)?.header_len() + roce::ICRC_LEN;
    if dgram.len() < need {
        return Err(roce::FrameError::TooShort { len: dgram.len(), need });
    }
    Ok(())
}

/// The segment size of a buffer the kernel coalesced (its `UDP_GRO` cmsg), if it is one.
fn gro_segment(hdr: &libc::msghdr) -> Option<usize> {
    // SAFETY: `hdr` is a msghdr `recvmmsg` filled: its control pointer and length describe the
    // control buffer it wrote (or are null/0), and the CMSG_* walkers stay within them.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(hdr);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_UDP && (*c).cmsg_type == UDP_GRO {
                let v = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<libc::c_int>());
                return usize::try_from(v).ok();
            }
            c = libc::CMSG_NXTHDR(hdr, c);
        }
    }
    None
}

/// Adds `fd` to the epoll set `ep` for `events`, tagged `token`.
fn epoll_add(ep: &OwnedFd, fd: libc::c_int, events: u32, token: u64) -> io::Result<()> {
    let mut ev = libc::epoll_event { events, u64: token };
    // SAFETY: both descriptors are live; the kernel copies `ev` from this frame.
    if unsafe { libc::epoll_ctl(ep.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The IPv4-mapped GID of an IPv4 address (`::ffff:a.b.c.d`).
pub(crate) fn gid_of(ip: Ipv4Addr) -> [u8; 16] {
    ip.to_ipv6_mapped().octets()
}

/// The IPv4 address of an IPv4-mapped GID, if it is one.
pub(crate) fn ip_of_gid(gid: &[u8; 16]) -> Option<Ipv4Addr> {
    std::net::Ipv6Addr::from(*gid).to_ipv4_mapped()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packet::{PacketHeader, PacketKind, Syndrome};

    fn port(hold: Duration) -> UdpPort {
        let any = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0);
        UdpPort::bind(any, 4096, hold, None, 0, 0).expect("a socket on 127.0.0.1")
    }

    /// A plain socket that counts what reaches it.
    fn sink() -> (UdpSocket, SocketAddrV4) {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        s.set_nonblocking(true).unwrap();
        let std::net::SocketAddr::V4(a) = s.local_addr().unwrap() else { unreachable!() };
        (s, a)
    }

    fn arrived(s: &UdpSocket) -> usize {
        let mut buf = [0u8; 5000];
        let mut n = 0;
        while s.recv(&mut buf).is_ok() {
            n += 1;
        }
        n
    }

    fn ack() -> PacketHeader {
        PacketHeader { kind: PacketKind::Ack, syndrome: Syndrome::Ack, psn: 1, ..Default::default() }
    }

    fn send() -> PacketHeader {
        PacketHeader {
            kind: PacketKind::Send,
            psn: 2,
            payload_len: 8,
            first: true,
            last: true,
            ..Default::default()
        }
    }

    fn put(p: &UdpPort, to: SocketAddrV4, hdr: &PacketHeader) {
        assert_eq!(p.transmit(to, hdr, &mut |b: &mut [u8]| b.fill(7)), Transmit::Sent);
    }

    fn calls(p: &UdpPort) -> u64 {
        p.stats.send_calls.load(AtOrd::Relaxed)
    }

    /// While the user polls, a flush of nothing but plain ACKs sends nothing; the next packet's
    /// flush takes them along in the same `sendmmsg`. An eager flush (the user is about to sleep),
    /// or a NIC nobody polls, sends them at once; held ACKs leave when due, and not before.
    #[test]
    fn plain_acks_wait_for_the_next_packet_while_the_user_polls() {
        let p = port(Duration::from_secs(3600));
        let (s, to) = sink();
        p.unpolled.store(false, AtOrd::Relaxed); // the receive thread saw polls

        put(&p, to, &ack());
        p.flush(false);
        assert_eq!((calls(&p), arrived(&s)), (0, 0), "a lone ACK left while the user polls");
        p.send_due_acks(p.epoch.elapsed().as_nanos() as u64);
        assert_eq!(calls(&p), 0, "an ACK left before it was due");
        put(&p, to, &send());
        p.flush(false);
        assert_eq!(calls(&p), 1, "the ACK and the next packet in one call");
        assert_eq!(arrived(&s), 2);
        assert_eq!(p.ack_due.load(AtOrd::Relaxed), 0);

        put(&p, to, &ack());
        p.flush(true);
        assert_eq!((calls(&p), arrived(&s)), (2, 1), "an eager flush holds nothing back");

        put(&p, to, &ack());
        p.flush(false);
        assert_eq!(calls(&p), 2);
        p.send_due_acks(u64::MAX - 1);
        assert_eq!((calls(&p), arrived(&s)), (3, 1), "a due ACK left at a poll");

        put(&p, to, &ack());
        p.flush(false);
        p.unpolled.store(true, AtOrd::Relaxed);
        p.send_due_acks(u64::MAX);
        assert_eq!((calls(&p), arrived(&s)), (4, 1), "the receive thread sends held ACKs when it watches");
        put(&p, to, &ack());
        p.flush(false);
        assert_eq!((calls(&p), arrived(&s)), (5, 1), "nobody polls: nothing is held");
    }

    /// A send of `len` payload bytes with PSN `psn`, its payload bytes all `psn as u8`.
    fn send_of(psn: u32, len: u32) -> PacketHeader {
        PacketHeader { psn, payload_len: len, ..send() }
    }

    /// What `q` reads from its socket until `n` packets came (5 s at most): (PSN, payload
    /// length, payload intact) per packet.
    fn read_all(q: &UdpPort, n: usize) -> Vec<(u32, usize, bool)> {
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(5);
        while got.len() < n && Instant::now() < deadline {
            let mut pfd = libc::pollfd { fd: q.sock.as_raw_fd(), events: libc::POLLIN, revents: 0 };
            // SAFETY: one live pollfd.
            unsafe { libc::poll(&mut pfd, 1, 100) };
            q.drain(1, &mut |h: &PacketHeader, payload: &[u8]| {
                got.push((h.psn, payload.len(), payload.iter().all(|&b| b == h.psn as u8)));
            });
        }
        got
    }

    /// A burst to a NIC on this host leaves as one segmented send and is read as one buffer
    /// (issue 31: a buffer through the kernel per datagram was most of the UDP wire's cost per
    /// call); the receiver splits it back into the very datagrams, in order, payloads intact.
    #[test]
    fn a_burst_to_this_host_is_one_buffer_through_the_kernel() {
        let p = port(Duration::ZERO);
        let q = port(Duration::ZERO);
        assert!(q.gro, "this kernel lets a UDP socket take coalesced datagrams (Linux 5.0+)");
        q.peer_id(p.local);
        for psn in 0..32 {
            let hdr = send_of(psn, 64);
            assert_eq!(p.transmit(q.local, &hdr, &mut |b: &mut [u8]| b.fill(psn as u8)), Transmit::Sent);
        }
        p.flush(true);
        assert_eq!(calls(&p), 1);
        let got = read_all(&q, 32);
        assert_eq!(got, (0..32).map(|psn| (psn, 64, true)).collect::<Vec<_>>());
        assert_eq!(q.stats.recv_buffers.load(AtOrd::Relaxed), 1, "32 datagrams, one buffer");
        assert_eq!(q.stats.recv_datagrams.load(AtOrd::Relaxed), 32);
        assert_eq!(q.stats.malformed.load(AtOrd::Relaxed), 0);
    }

    /// A run ends where the size grows, after a shorter datagram (the kernel's segments are all
    /// of one size but the last), and where the destination changes; every datagram arrives
    /// once, in order.
    #[test]
    fn runs_split_where_size_or_peer_changes() {
        let p = port(Duration::ZERO);
        let q = port(Duration::ZERO);
        let r = port(Duration::ZERO);
        q.peer_id(p.local);
        r.peer_id(p.local);
        let plan: [(u32, u32, bool); 9] = [
            (1, 0, false), // to q, sizes 0 64 64 40 64 64, then r 64 64, then q 64
            (2, 64, false),
            (3, 64, false),
            (4, 40, false),
            (5, 64, false),
            (6, 64, false),
            (7, 64, true),
            (8, 64, true),
            (9, 64, false),
        ];
        for (psn, len, to_r) in plan {
            let to = if to_r { r.local } else { q.local };
            let hdr = send_of(psn, len);
            assert_eq!(p.transmit(to, &hdr, &mut |b: &mut [u8]| b.fill(psn as u8)), Transmit::Sent);
        }
        p.flush(true);
        assert_eq!(calls(&p), 1, "one sendmmsg for the batch");
        // Runs: [1] (the next is larger), [2 3 4] (4 is shorter: last), [5 6], [7 8], [9].
        assert_eq!(p.stats.send_segmented.load(AtOrd::Relaxed), 3);
        let want_q: Vec<_> =
            plan.iter().filter(|x| !x.2).map(|&(psn, len, _)| (psn, len as usize, true)).collect();
        let want_r: Vec<_> =
            plan.iter().filter(|x| x.2).map(|&(psn, len, _)| (psn, len as usize, true)).collect();
        assert_eq!(read_all(&q, want_q.len()), want_q);
        assert_eq!(read_all(&r, want_r.len()), want_r);
        assert_eq!(p.stats.send_dropped.load(AtOrd::Relaxed), 0);
    }

    /// A ping-pong's batch, the ACK of the last answer and the next request, is one buffer
    /// through the kernel: the ACK goes behind the request (it is shorter, so it ends the run).
    /// Behind a NAK or a READ response (the ACKs' own PSN order) an ACK stays where it was.
    #[test]
    fn an_ack_rides_behind_a_request_in_one_buffer() {
        let p = port(Duration::ZERO);
        let q = port(Duration::ZERO);
        q.peer_id(p.local);
        put(&p, q.local, &ack()); // PSN 1
        let fill2 = &mut |b: &mut [u8]| b.fill(2);
        assert_eq!(p.transmit(q.local, &send(), fill2), Transmit::Sent); // PSN 2, 8 bytes
        p.flush(true);
        assert_eq!(read_all(&q, 2), vec![(2, 8, true), (1, 0, true)], "the request first");
        assert_eq!(q.stats.recv_buffers.load(AtOrd::Relaxed), 1, "both in one buffer");

        put(&p, q.local, &PacketHeader { psn: 3, ..ack() });
        put(&p, q.local, &PacketHeader { psn: 4, syndrome: Syndrome::NakSequence, ..ack() });
        put(&p, q.local, &PacketHeader { psn: 5, payload_len: 0, ..send() });
        p.flush(true);
        let order: Vec<u32> = read_all(&q, 3).iter().map(|x| x.0).collect();
        assert_eq!(order, vec![3, 4, 5], "no ACK moves behind a NAK");
    }

    /// Datagrams to another host or to a RoCE NIC's port 4791 leave one by one, each exactly as
    /// a RoCE NIC sends it (a segmented send would number the IPv4 IDs its ICRC covers).
    #[test]
    fn only_datagrams_to_this_host_are_segmented() {
        let p = port(Duration::ZERO);
        assert!(p.segments_to(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 9)));
        assert!(p.segments_to(SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 2), 9)));
        assert!(!p.segments_to(SocketAddrV4::new(Ipv4Addr::new(10, 1, 2, 3), 7000)));
        assert!(!p.segments_to(SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 2), roce::ROCE_PORT)));
    }

    /// A NAK is never held, nor an ACK when the fabric says not to hold.
    #[test]
    fn naks_and_a_zero_hold_are_sent_at_once() {
        let p = port(Duration::from_secs(3600));
        let (s, to) = sink();
        p.unpolled.store(false, AtOrd::Relaxed);
        put(&p, to, &PacketHeader { syndrome: Syndrome::NakSequence, ..ack() });
        p.flush(false);
        assert_eq!((calls(&p), arrived(&s)), (1, 1));
        let q = port(Duration::ZERO);
        q.unpolled.store(false, AtOrd::Relaxed);
        put(&q, to, &ack());
        q.flush(false);
        assert_eq!((calls(&q), arrived(&s)), (1, 1));
    }
}
