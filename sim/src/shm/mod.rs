//! The shared-memory wire: simulated NICs in different processes on one host exchange RoCEv2
//! packets through single-producer/single-consumer rings in shared mappings under `/dev/shm`.
//!
//! - **Segments** ([`segment`]): every NIC on this wire creates one segment, named from its
//!   process, fabric and address (`/dev/shm/bypass-sim.<pid>.<fabric>.<nic>`). It holds a header
//!   (magic, version, sizes, the owner's pid and process start time), a doorbell block (a futex
//!   word, the receive thread's "sleeping" flag, a pending-rings mask) and [`segment::RINGS`]
//!   inbound rings. A NIC that sends to another opens the peer's segment and claims one ring by
//!   compare-and-swap on its owner word; all of its queues to that NIC share the ring (they all
//!   send under the NIC's device lock, so the ring has one producer).
//! - **Frames**: each slot holds a `u32` length and exactly the UDP payload the UDP wire sends
//!   (BTH, extension headers, payload, pad, ICRC). The ICRC is computed over fixed pseudo
//!   endpoints, [`PSEUDO`]: 127.0.0.1:4791 to 127.0.0.1:4791.
//! - **Sending** ([`ShmLink`]) writes the frame into the slot and publishes the producer index:
//!   no system call. A full ring is [`Transmit::Busy`] (lossless, like the in-process wire); the
//!   consumer wakes the producer's process after it makes room. At the end of a burst the
//!   producer issues `FUTEX_WAKE` only if the consumer's receive thread said it sleeps.
//! - **Receiving**: the device drains its rings in its own run loop, decoding every frame in place
//!   ([`ShmPort::drain`]); a poll notices pending frames with one load of the pending mask.
//!   A receive thread per NIC ([`receive_thread`]) sleeps on the futex; it runs the device when
//!   the NIC's user sleeps on an event fd or leaves frames untaken for a millisecond, runs due
//!   timers, passes on "room again" wakes from consumers, and frees rings of producers that are
//!   gone.
//! - **Addresses**: a NIC's `QueueInfo` GID is [`GID_MAGIC`], then the pid, the fabric number and
//!   the NIC address (little-endian). `connect` opens the peer's segment and checks its owner is
//!   alive (same pid and start time), so a dead or never-started peer fails at connect with the
//!   reason.

#[cfg(not(loom))]
pub(crate) mod segment;

pub mod ring;

#[cfg(not(loom))]
pub(crate) use port::*;

/// Magic prefix of a NIC's GID on the shared-memory wire (the in-process wire's is `bsm\x02`).
pub(crate) const GID_MAGIC: [u8; 4] = *b"bsm\x03";

/// The peer a shared-memory GID names: (pid, fabric, nic).
pub(crate) fn peer_of_gid(gid: &[u8; 16]) -> Option<(u32, u32, u32)> {
    if gid[..4] != GID_MAGIC {
        return None;
    }
    let at = |o: usize| u32::from_le_bytes([gid[o], gid[o + 1], gid[o + 2], gid[o + 3]]);
    Some((at(4), at(8), at(12)))
}

/// The GID of NIC `nic` of fabric `fabric` of this process.
#[cfg_attr(loom, allow(dead_code))]
pub(crate) fn gid_of(fabric: u32, nic: u32) -> [u8; 16] {
    let mut gid = [0u8; 16];
    gid[..4].copy_from_slice(&GID_MAGIC);
    gid[4..8].copy_from_slice(&std::process::id().to_le_bytes());
    gid[8..12].copy_from_slice(&fabric.to_le_bytes());
    gid[12..].copy_from_slice(&nic.to_le_bytes());
    gid
}

#[cfg(not(loom))]
mod port {
    use super::ring::{self, Pop, Push};
    use super::segment::{self, Identity, Layout, Segment};
    use crate::packet::PacketHeader;
    use crate::roce::{self, Endpoints};
    use crate::wire::{Transmit, Wire, WireHost, WirePort, WireStats};
    use bypass_hal::QueueInfo;
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::{Arc, Mutex, RwLock, Weak};
    use std::time::{Duration, Instant};

    /// The endpoints every frame's ICRC is computed over (the wire has no IP addresses).
    pub(crate) const PSEUDO: Endpoints = Endpoints {
        src_ip: [127, 0, 0, 1],
        dst_ip: [127, 0, 0, 1],
        src_port: roce::ROCE_PORT,
        dst_port: roce::ROCE_PORT,
    };
    /// Bytes a frame needs beyond the payload: BTH, RETH (the longest extension), ImmDt, pad, ICRC.
    const OVERHEAD: usize = roce::BTH_LEN + roce::RETH_LEN + roce::IMMDT_LEN + 3 + roce::ICRC_LEN;
    /// The source id of frames from a producer no queue of the NIC is connected to (dropped).
    const UNKNOWN_PEER: u32 = u32::MAX;
    /// Frames taken from one ring per pass, so one busy producer cannot starve the others.
    const BUDGET: u32 = 64;
    /// How long the receive thread sleeps while its NIC's user is not about to sleep: the longest
    /// frames sit untaken before the receive thread runs the device.
    const TICK: Duration = Duration::from_millis(1);
    /// The longest sleep with the sleeping flag raised (bounds how late the thread notices its
    /// NIC is gone or a timer is due).
    const LONG_SLEEP: Duration = Duration::from_millis(100);
    /// How often rings of producers that are gone are looked for.
    const SWEEP: Duration = Duration::from_millis(200);

    /// A peer NIC: its process (pid and start time), fabric and address.
    type PeerKey = (u32, u64, u32, u32);

    fn key_of(id: &Identity) -> PeerKey {
        (id.pid, id.start, id.fabric, id.nic)
    }

    /// What the consumer remembers about one of its rings (under [`ShmPort::rx`]).
    #[derive(Debug, Default)]
    struct RingRx {
        /// The owner token the entry is for (0: none yet).
        token: u64,
        owner: Option<Identity>,
        /// The source id of its frames ([`UNKNOWN_PEER`] until a queue connects to the producer).
        src: u32,
        /// The producer's own segment, opened the first time it must be woken.
        producer: Option<Arc<Segment>>,
    }

    /// One NIC's shared-memory endpoint: its own segment (inbound rings), its peers and its
    /// outbound links.
    pub(crate) struct ShmPort {
        pub seg: Segment,
        me: Identity,
        layout: Layout,
        peers: RwLock<(Vec<PeerKey>, HashMap<PeerKey, u32>)>,
        links: Mutex<HashMap<(u32, u32, u32), Weak<ShmLink>>>,
        rx: Mutex<Vec<RingRx>>,
        /// Frames that were not valid RoCEv2 packets (or had an impossible length), dropped.
        pub malformed: AtomicU64,
        /// FUTEX_WAKEs this NIC's links issued to sleeping receivers.
        pub wakes_sent: Arc<AtomicU64>,
        /// Passes of [`drain`](Self::drain) that found something: lets the receive thread tell
        /// frames left untaken from frames taken and replaced.
        drains: AtomicU64,
        /// The receive thread waits with a short timeout and without the sleeping flag: a CQ
        /// being armed must wake it so it raises the flag.
        ticking: AtomicBool,
    }

    impl std::fmt::Debug for ShmPort {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "ShmPort({})", self.seg.path.display())
        }
    }

    impl ShmPort {
        /// Creates NIC `nic`'s segment on fabric `fabric`, for frames of up to `mtu` payload bytes,
        /// `depth` per ring.
        pub(crate) fn create(fabric: u32, nic: u32, mtu: u32, depth: u32) -> std::io::Result<ShmPort> {
            let me = Identity { pid: std::process::id(), start: segment::own_start(), fabric, nic };
            let layout = Layout::new(depth, mtu as usize + OVERHEAD);
            let seg = Segment::create(me, layout)?;
            Ok(ShmPort {
                seg,
                me,
                layout,
                peers: RwLock::new((Vec::new(), HashMap::new())),
                links: Mutex::new(HashMap::new()),
                rx: Mutex::new(
                    (0..layout.rings).map(|_| RingRx { src: UNKNOWN_PEER, ..Default::default() }).collect(),
                ),
                malformed: AtomicU64::new(0),
                wakes_sent: Arc::new(AtomicU64::new(0)),
                drains: AtomicU64::new(0),
                ticking: AtomicBool::new(false),
            })
        }

        /// The source id of peer `key`, assigned on first use.
        fn peer_id(&self, key: PeerKey) -> u32 {
            if let Some(&id) = self.peers.read().unwrap_or_else(|e| e.into_inner()).1.get(&key) {
                return id;
            }
            let mut p = self.peers.write().unwrap_or_else(|e| e.into_inner());
            if let Some(&id) = p.1.get(&key) {
                return id;
            }
            let mut id = p.0.len() as u32;
            if id == self.me.nic {
                // The NIC's own fabric address is the source id of the packets it loops back
                // to itself (see `loops_back`): no peer may have it.
                p.0.push(key);
                id += 1;
            }
            p.0.push(key);
            p.1.insert(key, id);
            id
        }

        fn lookup(&self, key: PeerKey) -> u32 {
            self.peers.read().unwrap_or_else(|e| e.into_inner()).1.get(&key).copied().unwrap_or(UNKNOWN_PEER)
        }

        /// Whether frames may be waiting in any inbound ring: one load, no lock, no system call.
        #[inline]
        pub(crate) fn pending(&self) -> bool {
            ring::any_pending(self.seg.bell())
        }

        /// The link to NIC `nic` of fabric `fabric` of process `pid` (one per peer NIC, shared by
        /// all queues), and the peer's source id. Errors say why the peer cannot be reached.
        pub(crate) fn link_to(&self, pid: u32, fabric: u32, nic: u32) -> Result<(Arc<ShmLink>, u32), String> {
            let mut links = self.links.lock().unwrap_or_else(|e| e.into_inner());
            links.retain(|_, l| l.strong_count() > 0);
            if let Some(l) = links.get(&(pid, fabric, nic)).and_then(Weak::upgrade) {
                if segment::alive(l.seg.owner.pid, l.seg.owner.start)
                    && l.seg.path.exists()
                    && !l.seg.broken()
                {
                    let id = self.peer_id(key_of(&l.seg.owner));
                    return Ok((l, id));
                }
            }
            let path = segment::path_of(pid, fabric, nic);
            let seg = match Segment::open(&path) {
                Ok(s) => s,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Err(format!(
                        "no simulated NIC on the shared-memory wire at {}: process {pid} is not running \
                         (or has no such NIC), or it runs on another host — the shared-memory wire reaches \
                         only this host; use the UDP wire between hosts (sim+udp://IP:0)",
                        path.display()
                    ))
                }
                Err(e) => {
                    return Err(format!(
                        "cannot use the peer NIC's shared-memory segment {}: {e}",
                        path.display()
                    ))
                }
            };
            if seg.owner.pid != pid || seg.owner.fabric != fabric || seg.owner.nic != nic {
                return Err(format!(
                    "the shared-memory segment {} names another NIC in its header (pid {}, fabric {}, NIC {})",
                    path.display(),
                    seg.owner.pid,
                    seg.owner.fabric,
                    seg.owner.nic
                ));
            }
            if !segment::alive(seg.owner.pid, seg.owner.start) {
                seg.unlink();
                return Err(format!(
                    "the peer process is gone: process {pid}, which created {}, no longer runs (or its pid \
                     now belongs to another process); the stale segment was removed",
                    path.display()
                ));
            }
            if seg.layout.slot_size < self.layout.slot_size {
                return Err(format!(
                    "the peer NIC's segment {} holds frames of up to {} bytes, this NIC sends up to {}: \
                     give both fabrics the same MTU",
                    path.display(),
                    seg.layout.slot_size,
                    self.layout.slot_size
                ));
            }
            let seg = Arc::new(seg);
            let ring = claim(&seg, &self.me).ok_or_else(|| {
                format!(
                    "all {} inbound rings of the peer NIC ({}) are claimed by other NICs: close some of its \
                     connections, or add NICs",
                    seg.layout.rings,
                    path.display()
                )
            })?;
            let link = Arc::new(ShmLink { seg: seg.clone(), ring, wakes: self.wakes_sent.clone() });
            links.insert((pid, fabric, nic), Arc::downgrade(&link));
            let id = self.peer_id(key_of(&seg.owner));
            Ok((link, id))
        }

        /// The device's receive path: takes the frames of every pending ring (at most [`BUDGET`]
        /// per ring per call), decodes each in place and hands it to `recv`. Malformed frames are
        /// counted and dropped. Runs under the NIC's device lock.
        pub(crate) fn drain(&self, nic: u32, recv: &mut dyn FnMut(&PacketHeader, &[u8])) {
            let bell = self.seg.bell();
            let mut bits = ring::take_pending(bell);
            if bits == 0 {
                return;
            }
            self.drains.fetch_add(1, Ordering::Relaxed);
            let mut rx = self.rx.lock().unwrap_or_else(|e| e.into_inner());
            let mut again = 0u64;
            while bits != 0 {
                let b = bits.trailing_zeros();
                bits &= bits - 1;
                // Ring r sets bit r % 64; with at most 64 rings, that is ring b.
                if b >= self.layout.rings {
                    continue;
                }
                if self.drain_ring(b, &mut rx[b as usize], nic, recv) {
                    again |= 1 << b;
                }
            }
            if again != 0 {
                bell.pending.fetch_or(again, Ordering::Release);
            }
        }

        /// Drains one ring; true if frames are left (the budget ran out).
        fn drain_ring(
            &self,
            r: u32,
            st: &mut RingRx,
            nic: u32,
            recv: &mut dyn FnMut(&PacketHeader, &[u8]),
        ) -> bool {
            let (ctl, slots) = self.seg.ring(r);
            let token = ctl.owner.load(Ordering::Acquire);
            if token == 0 {
                return false;
            }
            if st.token != token || st.src == UNKNOWN_PEER {
                if !ring::has_frames(ctl) {
                    return false;
                }
                // The identity was written before the first frame was published (and `pi` read
                // with Acquire above orders it).
                let owner = Identity {
                    pid: ctl.owner_pid.load(Ordering::Relaxed),
                    start: ctl.owner_start.load(Ordering::Relaxed),
                    fabric: ctl.owner_fabric.load(Ordering::Relaxed),
                    nic: ctl.owner_nic.load(Ordering::Relaxed),
                };
                if st.token != token {
                    st.producer = None;
                }
                st.token = token;
                st.owner = Some(owner);
                st.src = self.lookup(key_of(&owner));
            }
            let src = st.src;
            let mut n = 0;
            let left = loop {
                if n == BUDGET {
                    break ring::has_frames(ctl);
                }
                let got = ring::pop(ctl, &slots, |frame| {
                    let Ok(bytes) = frame else {
                        self.malformed.fetch_add(1, Ordering::Relaxed);
                        return;
                    };
                    let frame = match roce::decode_udp(bytes, &PSEUDO) {
                        Ok(f) => f,
                        Err(e) => {
                            self.malformed.fetch_add(1, Ordering::Relaxed);
                            if bypass_hal::trace::is_enabled() {
                                trace_malformed(nic, r, bytes.len(), e);
                            }
                            return;
                        }
                    };
                    let rx = roce::RxContext::from_wire(src, nic, frame.psn);
                    let hdr = frame.to_header(&rx);
                    recv(&hdr, frame.payload);
                });
                match got {
                    Pop::Empty => break false,
                    Pop::Frame(()) => n += 1,
                    Pop::Corrupt(lost) => {
                        self.malformed.fetch_add(u64::from(lost), Ordering::Relaxed);
                        break false;
                    }
                }
            };
            if n > 0 && ring::producer_waiting(ctl) {
                self.wake_producer(st);
            }
            left
        }

        /// A producer waits for room in one of our rings: tells its process (its own segment's
        /// doorbell), whose receive thread unblocks the NIC.
        #[cold]
        fn wake_producer(&self, st: &mut RingRx) {
            let Some(owner) = st.owner else { return };
            if st.producer.is_none() {
                st.producer =
                    Segment::open(&segment::path_of(owner.pid, owner.fabric, owner.nic)).ok().map(Arc::new);
            }
            if let Some(p) = &st.producer {
                let bell = p.bell();
                bell.unblock.store(1, Ordering::Release);
                ring::ring_doorbell(bell);
                futex_wake(&bell.doorbell);
            }
        }

        /// Wakes this NIC's own receive thread so it re-evaluates (a CQ was armed), if it is in
        /// its short-timeout wait. Off the hot path: only event-mode users arm CQs.
        pub(crate) fn attention(&self) {
            // Dekker with the receive thread: it stores `ticking` then reads the armed count; the
            // caller raised the armed count before this fence.
            std::sync::atomic::fence(Ordering::SeqCst);
            if self.ticking.load(Ordering::Relaxed) {
                let bell = self.seg.bell();
                ring::ring_doorbell(bell);
                futex_wake(&bell.doorbell);
            }
        }

        /// Frees rings whose producer let go (and that are empty) or whose producer process is
        /// gone (dropping what it left).
        fn sweep(&self) {
            let mut rx = self.rx.lock().unwrap_or_else(|e| e.into_inner());
            for r in 0..self.layout.rings {
                let (ctl, _) = self.seg.ring(r);
                if ctl.owner.load(Ordering::Acquire) == 0 {
                    continue;
                }
                let closed = ctl.closed.load(Ordering::Acquire) != 0;
                let gone = !closed && {
                    let (pid, start) =
                        (ctl.owner_pid.load(Ordering::Relaxed), ctl.owner_start.load(Ordering::Relaxed));
                    pid != 0 && pid != self.me.pid && !segment::alive(pid, start)
                };
                if (closed && !ring::has_frames(ctl)) || gone {
                    ctl.waiting.store(0, Ordering::Relaxed);
                    ctl.ci.store(0, Ordering::Relaxed);
                    ctl.pi.store(0, Ordering::Relaxed);
                    ctl.closed.store(0, Ordering::Relaxed);
                    ctl.owner_pid.store(0, Ordering::Relaxed);
                    ctl.owner_start.store(0, Ordering::Relaxed);
                    ctl.owner_fabric.store(0, Ordering::Relaxed);
                    ctl.owner_nic.store(0, Ordering::Relaxed);
                    ctl.owner.store(0, Ordering::Release);
                    rx[r as usize] = RingRx { src: UNKNOWN_PEER, ..Default::default() };
                }
            }
        }
    }

    impl WirePort for ShmPort {
        fn name(&self) -> &'static str {
            "shared-memory"
        }

        fn backend_hint(&self) -> &'static str {
            "sim+shm"
        }

        /// [`GID_MAGIC`](super::GID_MAGIC), pid, fabric, NIC; no lid.
        fn endpoint(&self) -> ([u8; 16], u16) {
            (super::gid_of(self.me.fabric, self.me.nic), 0)
        }

        fn accepts(&self, peer: &QueueInfo) -> bool {
            super::peer_of_gid(&peer.gid).is_some()
        }

        fn connect(self: Arc<Self>, peer: &QueueInfo) -> Result<(Arc<dyn Wire>, u32), String> {
            let Some((pid, fabric, nic)) = super::peer_of_gid(&peer.gid) else {
                return Err(format!("the peer's GID {:?} is no shared-memory address", peer.gid));
            };
            let (link, id) = self.link_to(pid, fabric, nic)?;
            Ok((link, id))
        }

        /// A queue connected to a queue of this NIC never touches its rings.
        fn loops_back(&self) -> bool {
            true
        }

        fn start(
            self: Arc<Self>,
            host: Weak<dyn WireHost>,
        ) -> std::io::Result<Option<std::thread::JoinHandle<()>>> {
            let name = format!("bypass-sim-shm{}", self.me.nic);
            let handle = std::thread::Builder::new().name(name).spawn(move || receive_thread(host, self))?;
            Ok(Some(handle))
        }

        /// The device takes frames in place from the rings ([`drain`](Self::drain)).
        fn polled(&self) -> bool {
            true
        }

        #[inline]
        fn pending(&self) -> bool {
            ShmPort::pending(self)
        }

        fn drain(&self, nic: u32, recv: &mut dyn FnMut(&PacketHeader, &[u8])) {
            ShmPort::drain(self, nic, recv)
        }

        fn attention(&self) {
            ShmPort::attention(self)
        }

        fn stats(&self) -> WireStats {
            WireStats {
                rx_malformed: self.malformed.load(Ordering::Relaxed),
                // Frames are read in place, from processes attached to the region; the device
                // counts those from a producer no queue is connected to.
                rx_ignored: 0,
                tx_dropped: 0,
                tx_wakeups: self.wakes_sent.load(Ordering::Relaxed),
                tx_sends: 0,
            }
        }

        /// Peers can no longer connect to this NIC (the mapping lives on until the port is
        /// dropped). The receive thread notices the shutdown within its longest sleep.
        fn shut_down(&self) {
            self.seg.unlink();
        }

        fn segment_path(&self) -> Option<&std::path::Path> {
            Some(&self.seg.path)
        }
    }

    /// Claims a free ring of `seg` for producer `me`; its index.
    fn claim(seg: &Segment, me: &Identity) -> Option<u32> {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let token = u64::from(me.pid) << 32 | (NEXT.fetch_add(1, Ordering::Relaxed) & 0xffff_ffff).max(1);
        (0..seg.layout.rings).find(|&r| {
            let (ctl, _) = seg.ring(r);
            if ctl.owner.compare_exchange(0, token, Ordering::AcqRel, Ordering::Relaxed).is_err() {
                return false;
            }
            // The consumer reset the indices before it freed the ring (Release on `owner`,
            // read by the Acquire of the CAS). Identity first, then frames.
            ctl.owner_pid.store(me.pid, Ordering::Relaxed);
            ctl.owner_start.store(me.start, Ordering::Relaxed);
            ctl.owner_fabric.store(me.fabric, Ordering::Relaxed);
            ctl.owner_nic.store(me.nic, Ordering::Relaxed);
            ctl.closed.store(0, Ordering::Relaxed);
            ctl.waiting.store(0, Ordering::Relaxed);
            true
        })
    }

    /// The wire from one NIC to one peer NIC on the shared-memory wire: a claimed ring in the
    /// peer's segment. Dropped when the last queue using it is reset or destroyed, which lets go
    /// of the ring.
    pub(crate) struct ShmLink {
        seg: Arc<Segment>,
        ring: u32,
        /// The sending NIC's count of wakes issued.
        wakes: Arc<AtomicU64>,
    }

    impl std::fmt::Debug for ShmLink {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "ShmLink({} ring {})", self.seg.path.display(), self.ring)
        }
    }

    impl Wire for ShmLink {
        fn transmit(&self, hdr: &PacketHeader, fill: &mut dyn FnMut(&mut [u8])) -> Transmit {
            let (ctl, slots) = self.seg.ring(self.ring);
            let got = ring::push(ctl, &slots, |buf| roce::encode_udp_with(hdr, &PSEUDO, buf, fill).ok());
            match got {
                Push::Sent => {
                    ring::mark_pending(self.seg.bell(), self.ring);
                    Transmit::Sent
                }
                Push::Full => Transmit::Busy,
                Push::TooLong => Transmit::Dropped,
            }
        }

        fn flush(&self, _eager: bool) {
            let bell = self.seg.bell();
            if ring::wake_needed(bell) {
                ring::ring_doorbell(bell);
                futex_wake(&bell.doorbell);
                self.wakes.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    impl Drop for ShmLink {
        fn drop(&mut self) {
            let (ctl, _) = self.seg.ring(self.ring);
            ctl.closed.store(1, Ordering::Release);
        }
    }

    fn futex_wake(word: &std::sync::atomic::AtomicU32) {
        // SAFETY: FUTEX_WAKE only reads the address, which points at a live u32 in a shared
        // mapping; no timeout or second address is used.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                word.as_ptr(),
                libc::FUTEX_WAKE,
                i32::MAX,
                std::ptr::null::<libc::timespec>(),
            );
        }
    }

    fn futex_wait(word: &std::sync::atomic::AtomicU32, seen: u32, timeout: Duration) {
        let ts = libc::timespec {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_nsec: libc::c_long::from(timeout.subsec_nanos() as i32),
        };
        // SAFETY: the address is a live u32 in a shared mapping (not FUTEX_PRIVATE: other
        // processes wake it); `ts` lives across the call. EAGAIN (the value changed), EINTR and
        // ETIMEDOUT all just return.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                word.as_ptr(),
                libc::FUTEX_WAIT,
                seen,
                &ts as *const libc::timespec,
            );
        }
    }

    #[cold]
    fn trace_malformed(nic: u32, ring: u32, len: usize, e: roce::FrameError) {
        let _ = e;
        let args = [("ring", ring.into()), ("len", len.into())];
        bypass_hal::trace::instant(bypass_hal::trace::Track::Nic(nic), "malformed frame dropped", &args);
    }

    /// Body of a NIC's shared-memory receive thread. Ends when the NIC is gone or its fabric shuts
    /// down.
    fn receive_thread(nic: Weak<dyn WireHost>, port: Arc<ShmPort>) {
        let bell = port.seg.bell();
        let mut last_drains = u64::MAX;
        let mut last_sweep = Instant::now();
        loop {
            let Some(n) = nic.upgrade() else { return };
            if n.is_shut_down() {
                return;
            }
            if bell.unblock.load(Ordering::Relaxed) != 0 && bell.unblock.swap(0, Ordering::Acquire) != 0 {
                n.unblocked();
            }
            let sleepy = n.sleepy();
            if port.pending() {
                let drains = port.drains.load(Ordering::Relaxed);
                // Frames are there and either nobody will take them (the user sleeps) or nobody
                // took any since the last tick: a NIC acknowledges whether or not its
                // application polls.
                if sleepy || drains == last_drains {
                    n.take_now();
                }
                last_drains = port.drains.load(Ordering::Relaxed);
            }
            n.idle(); // timers that fell due while the user was not polling
            if last_sweep.elapsed() >= SWEEP {
                last_sweep = Instant::now();
                port.sweep();
            }
            let seen;
            let wait;
            if sleepy {
                port.ticking.store(false, Ordering::Relaxed);
                seen = ring::prepare_sleep(bell);
                if port.pending() || bell.unblock.load(Ordering::Relaxed) != 0 {
                    ring::end_sleep(bell);
                    last_drains = u64::MAX; // take them at once
                    continue;
                }
                wait = match n.next_timer() {
                    None => LONG_SLEEP,
                    Some(d) => d.clamp(Duration::from_micros(50), LONG_SLEEP),
                };
            } else {
                seen = bell.doorbell.load(Ordering::Acquire);
                port.ticking.store(true, Ordering::SeqCst);
                // A CQ armed after `sleepy` was read would find `ticking` false and not wake us.
                if n.armed() {
                    continue;
                }
                wait = TICK;
            }
            drop(n);
            futex_wait(&bell.doorbell, seen, wait);
            ring::end_sleep(bell);
            port.ticking.store(false, Ordering::Relaxed);
        }
    }

    /// Removes stale segments of dead processes (at fabric creation).
    pub(crate) fn clean_stale() -> usize {
        segment::clean_stale()
    }
}
