//! The fabric: the set of simulated NICs that can reach each other, the engine that runs them and
//! the clock they share. This is where a test or benchmark starts:
//!
//! ```
//! use bypass_sim::{Engine, Fabric};
//! let fabric = Fabric::new(Engine::Inline);
//! let (a, b) = (fabric.add_nic(), fabric.add_nic());
//! assert_ne!(a.addr(), b.addr());
//! ```
//!
//! A deterministic test: the Stepped engine, a lossy link, virtual time.
//!
//! ```
//! use bypass_hal::*;
//! use bypass_sim::{Engine, Fabric, FabricConfig, FaultPlan};
//! use std::time::Duration;
//!
//! let faults = FaultPlan { drop_ppm: 200_000, seed: 7, ..FaultPlan::NONE }; // lose 20 %
//! let fabric = Fabric::with_config(FabricConfig { faults, ..FabricConfig::new(Engine::Stepped { seed: 42 }) });
//! let (na, nb) = (fabric.add_nic(), fabric.add_nic());
//! let mut cfg = QueueConfig::default();
//! cfg.timeout = bypass_hal::AckTimeout::at_least(Duration::from_millis(1));
//! let (mut ca, cb) = (na.create_cq(64).unwrap(), nb.create_cq(64).unwrap());
//! let mut qa = na.create_queue(&cfg, &ca, &ca).unwrap();
//! let mut qb = nb.create_queue(&cfg, &cb, &cb).unwrap();
//! let (ia, ib) = (qa.info(), qb.info());
//! qa.connect(&ib).unwrap();
//! qb.connect(&ia).unwrap();
//! let dst = nb.register(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
//! let wrs: Vec<SendWr> = (0..10).map(|i| SendWr::send(i, &[]).with_op(SendOp::Write(dst.remote().at(0)))).collect();
//! qa.post_send(&wrs).unwrap();
//!
//! let mut done = Vec::new();
//! let mut wc = [Completion::default(); 16];
//! while done.len() < 10 {
//!     fabric.run_until_idle();                      // everything that can happen now
//!     let n = ca.poll(&mut wc).unwrap();
//!     done.extend(wc[..n].iter().map(|c| (c.wr_id, c.status)));
//!     if n == 0 {
//!         fabric.advance(Duration::from_millis(1)); // let a retransmission timer fire
//!     }
//! }
//! assert!(done.iter().enumerate().all(|(i, &(id, st))| id == i as u64 && st == Status::Success));
//! assert!(na.stats().retransmits > 0);
//! ```

use crate::clock::Clock;
use crate::device::Unit;
use crate::driver::SimNic;
use crate::engine::{device_thread, Engine};
use crate::fault::{FaultControl, FaultPlan, FaultStats, FaultWire};
use crate::layout;
use crate::nic::Nic;
use crate::sync;
use crate::wire::{Wire, WireHost};
use crate::wires::WireConfig;
use bypass_hal::trace::{self, Track};
use bypass_hal::DeviceCaps;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

/// Fabric-wide settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FabricConfig {
    /// How device work is run.
    pub engine: Engine,
    /// Largest packet payload; messages are cut into segments of this size.
    pub mtu: u32,
    /// Packets each NIC's inbox holds before senders must wait.
    pub inbox_depth: u32,
    /// Limits every NIC reports.
    pub caps: DeviceCaps,
    /// Faults injected on every connection's link ([`FaultPlan::NONE`]: none, links unwrapped).
    pub faults: FaultPlan,
    /// What carries packets between the NICs.
    pub wire: WireConfig,
    /// Retransmission-timer backoff for the reliable services (RC and RM): `None` (the default)
    /// keeps every wait at the queue's ACK timeout, as the hal contract and rxe do; `Some(cap)`
    /// doubles the wait after each timeout that found no progress, up to `cap` (never below the
    /// queue's own timeout), back to the timeout once an acknowledgement makes progress. For
    /// fabrics whose NICs are processes a loaded host may deschedule for longer than
    /// `retry_count` fixed timeouts (see docs/sim.md, "Retransmission backoff").
    pub ack_timeout_backoff: Option<std::time::Duration>,
    /// How long plain ACKs may be held back for the next packet the NIC sends (default 20 µs,
    /// far below any ACK timeout in use; `Duration::ZERO`: never). UDP wire: a flush holds
    /// them, while the NIC's user polls, so that they leave in one `sendmmsg` with the next
    /// packet (docs/sim.md, "The UDP wire"). In-process wire, Inline engine: a device pass holds
    /// the ACK of a single message for the next pass, so that it leaves with the response
    /// (docs/sim.md, "Held ACKs"); polls, arms and idle pollers usually send it much sooner.
    pub ack_hold: std::time::Duration,
}

/// The retransmission backoff's cap where the NICs are threads of ordinary processes on a byte
/// wire (shared memory, UDP, L2 to a kernel NIC or a VFIO-owned one): 2^18 × 4.096 µs ≈ 1.07 s,
/// as in `bypass-sim-urma` and the `vfio:` backend (docs/sim.md, "Retransmission backoff").
pub const BYTE_WIRE_ACK_TIMEOUT_BACKOFF: Duration = Duration::from_nanos(4096 << 18);

impl FabricConfig {
    /// Parses the value of a backend string's `ack_timeout_backoff=` option: `off` or `0` for no
    /// backoff, else the longest wait as an ACK-timeout exponent N in 1..=31 (4.096 µs × 2^N;
    /// 18 ≈ 1.07 s), for [`ack_timeout_backoff`](Self::ack_timeout_backoff).
    pub fn parse_ack_timeout_backoff(value: &str) -> Result<Option<Duration>, String> {
        match value {
            "off" | "0" => Ok(None),
            n => match n.parse::<u8>() {
                Ok(n @ 1..=31) => Ok(Some(Duration::from_nanos(4096 << n))),
                _ => Err(format!(
                    "ack_timeout_backoff={n:?}: use the longest retransmission wait as an exponent N in 1..=31 \
                     (4.096 us x 2^N; 18 is about 1.07 s), or off"
                )),
            },
        }
    }

    /// Whether [`ack_hold`](Self::ack_hold) means anything for this configuration: the
    /// in-process wire with the Inline engine (a device pass holds the ACK for the next one) and
    /// the UDP wire (a flush holds it for the next datagram). Elsewhere every ACK leaves at once.
    pub fn holds_acks(&self) -> bool {
        match self.wire {
            WireConfig::InProcess => self.engine == Engine::Inline,
            WireConfig::Udp(_) => true,
            _ => false,
        }
    }

    /// Parses the value of a backend string's `ack_hold=` option: `off` or `0` to send every
    /// ACK at once, else the longest hold in whole microseconds (at most 1,000: a hold must stay
    /// far below the ACK timeout), for [`ack_hold`](Self::ack_hold).
    pub fn parse_ack_hold(value: &str) -> Result<Duration, String> {
        match value {
            "off" | "0" => Ok(Duration::ZERO),
            n => match n.parse::<u64>() {
                Ok(us @ 1..=1000) => Ok(Duration::from_micros(us)),
                _ => Err(format!(
                    "ack_hold={n:?}: use the longest time a plain ACK may wait for the next packet, in \
                     microseconds (1..=1000; the default is 20), or off to send every ACK at once"
                )),
            },
        }
    }

    /// Default settings for `engine`.
    pub fn new(engine: Engine) -> Self {
        FabricConfig {
            engine,
            mtu: 4096,
            inbox_depth: 256,
            caps: {
                let mut caps = DeviceCaps::new(
                    1 << 15,
                    1 << 16,
                    layout::MAX_SGE as u32,
                    layout::MAX_SGE as u32,
                    layout::MAX_INLINE as u32,
                    16 << 20,
                    1 << 40,
                );
                caps.atomics = true;
                caps.max_shared_recv = 1 << 10;
                caps.max_shared_recv_depth = 1 << 15;
                caps
            },
            faults: FaultPlan::NONE,
            wire: WireConfig::InProcess,
            ack_timeout_backoff: None,
            ack_hold: std::time::Duration::from_micros(20),
        }
    }
}

/// A tiny seeded generator (SplitMix64): deterministic, good enough to pick among ready units.
#[derive(Debug)]
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

#[derive(Debug, Default)]
struct StepState {
    nics: Vec<Arc<Nic>>,
    units: Vec<(usize, Unit)>,
    idle_runs: u32,
}

/// State shared by every NIC of a fabric.
#[derive(Debug)]
pub(crate) struct FabricShared {
    /// Distinguishes fabrics of one process, so a QueueInfo from another fabric is refused.
    pub id: u32,
    pub config: FabricConfig,
    pub clock: Arc<Clock>,
    nics: RwLock<Vec<Arc<Nic>>>,
    rng: Mutex<SplitMix>,
    /// The fault plan in force, its counters, cut links and dead NICs.
    pub(crate) faults: Arc<FaultControl>,
    /// Where every link's packets are captured (`BYPASS_PCAP`, read when the fabric is made).
    pcap: Option<Arc<crate::pcap::PcapWriter>>,
    step: Mutex<StepState>,
    shutdown: AtomicBool,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// The L2 wire: ports not yet given to a NIC, in the order NICs get them.
    l2_ports: Mutex<std::collections::VecDeque<crate::l2::L2Attachment>>,
}

impl FabricShared {
    pub(crate) fn is_shut_down(&self) -> bool {
        self.shutdown.load(Ordering::Acquire)
    }

    /// The wire from queue `src_qpn` of NIC `src` to the NIC at `dst`, if it exists: the NIC
    /// itself, behind a capture wire when `BYPASS_PCAP` is set, behind a fault wire when the
    /// fabric has a fault plan.
    pub(crate) fn route(&self, src: u32, src_qpn: u32, dst: u32) -> Option<Arc<dyn Wire>> {
        let nic = self.nics.read().unwrap_or_else(|e| e.into_inner()).get(dst as usize)?.clone();
        let nic: Arc<dyn Wire> = match &self.pcap {
            Some(w) => Arc::new(crate::pcap::PcapWire::new(nic, w.clone(), self.id)),
            None => nic,
        };
        Some(self.with_faults(nic, src, src_qpn, dst))
    }

    /// A wire port's link from queue `src_qpn` of NIC `src` to peer `dst` (a source id), behind a
    /// capture wire when `BYPASS_PCAP` is set and a fault wire when the fabric has a fault plan.
    pub(crate) fn wrap_link(&self, link: Arc<dyn Wire>, src: u32, src_qpn: u32, dst: u32) -> Arc<dyn Wire> {
        let link: Arc<dyn Wire> = match &self.pcap {
            Some(w) => Arc::new(crate::pcap::PcapWire::new(link, w.clone(), self.id)),
            None => link,
        };
        self.with_faults(link, src, src_qpn, dst)
    }

    /// `wire` behind a fault wire when the fabric has a fault plan (seeded per link). NIC `src`
    /// (the sender) runs the wire's delayed packets as one of its timers.
    pub(crate) fn with_faults(&self, wire: Arc<dyn Wire>, src: u32, src_qpn: u32, dst: u32) -> Arc<dyn Wire> {
        if self.config.faults.is_none() {
            return wire;
        }
        let timer =
            self.nics.read().unwrap_or_else(|e| e.into_inner()).get(src as usize).map(|n| n.delays.clone());
        // A link is made by its sending NIC, which is on the fabric; were it not, its delayed
        // packets would go with its next packet or burst end only.
        let timer = timer.unwrap_or_default();
        FaultWire::new(wire, self.faults.clone(), timer, src, src_qpn, dst)
    }

    /// A NIC that waited for inbox room at another NIC may go on.
    pub(crate) fn kick_waiter(&self, addr: u32) {
        let nic = self.nics.read().unwrap_or_else(|e| e.into_inner()).get(addr as usize).cloned();
        if let Some(nic) = nic {
            nic.unblocked.store(true, Ordering::Release);
            nic.kick();
        }
    }

    /// Inline engine: a poller that keeps finding nothing runs every NIC with work flagged or a
    /// timer due, so a NIC whose own user is not polling still makes progress (a sender waiting
    /// out an RNR NAK retries even if only the receiver's CQ is being polled). ACKs a NIC holds
    /// back go first, every NIC's: whoever helps is waiting, perhaps for one of them, and a
    /// timer run below must not retransmit for want of one.
    pub(crate) fn help(&self) {
        self.release_held_acks();
        let now = self.clock.now();
        let nics = self.nics.read().unwrap_or_else(|e| e.into_inner());
        let mut flagged: [Option<Arc<Nic>>; 8] = Default::default();
        let pending = nics.iter().filter(|x| {
            x.work.load(Ordering::Relaxed) || x.deadline.load(Ordering::Relaxed) <= now || x.port_pending()
        });
        for (slot, nic) in flagged.iter_mut().zip(pending) {
            *slot = Some(nic.clone());
        }
        drop(nics);
        for nic in flagged.iter().flatten() {
            nic.run_if_flagged();
        }
    }

    /// Has every NIC that holds ACKs back send them now (a CQ was armed: its user may be about
    /// to sleep waiting for what one of them acknowledges, or a timer is due). Runs them on the
    /// calling thread. Cold: the paths that call it are about to sleep or to retransmit.
    #[cold]
    pub(crate) fn release_held_acks(&self) {
        let mut from = 0;
        loop {
            let mut held: [Option<Arc<Nic>>; 8] = Default::default();
            let nics = self.nics.read().unwrap_or_else(|e| e.into_inner());
            let end = nics.len();
            for slot in &mut held {
                let start = from.min(end);
                let Some(k) = nics[start..].iter().position(|x| crate::wake::holds_acks(&x.acks_held)) else {
                    from = end;
                    break;
                };
                from = start + k + 1;
                *slot = Some(nics[start + k].clone());
            }
            drop(nics);
            for nic in held.iter().flatten() {
                nic.release_held_acks();
            }
            if from >= end {
                return;
            }
        }
    }

    /// A fresh initial packet sequence number.
    pub(crate) fn next_psn(&self) -> u32 {
        (self.rng.lock().unwrap_or_else(|e| e.into_inner()).next() & 0x00ff_ffff) as u32
    }

    /// Stops device threads and breaks the reference cycles between connected queues.
    fn shut_down(&self) {
        self.shutdown.store(true, Ordering::Release);
        let nics = std::mem::take(&mut *self.nics.write().unwrap_or_else(|e| e.into_inner()));
        for n in &nics {
            if let Some(t) = n.thread.get() {
                t.unpark();
            }
            if let Some(p) = n.wire_port.get() {
                p.shut_down();
            }
        }
        for t in self.threads.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
            let _ = t.join();
        }
        for n in &nics {
            let mut dev = sync::lock(&n.dev);
            dev.outbox.clear();
            for qp in dev.qps.iter_mut().flatten() {
                qp.remote = None;
            }
        }
        self.step.lock().unwrap_or_else(|e| e.into_inner()).nics.clear();
    }
}

/// Shuts the fabric down when the last handle (fabric, NIC, region, CQ or queue) is gone.
#[derive(Debug)]
pub(crate) struct FabricOwner {
    pub shared: Arc<FabricShared>,
}

impl Drop for FabricOwner {
    fn drop(&mut self) {
        self.shared.shut_down();
    }
}

/// A tag for this process on this host, carried in every sim GID: a hash of the kernel's boot id
/// (distinct per host and boot) and the process id. Two processes (or hosts) never share one
/// while both run; collisions of the 32-bit hash are possible in principle and would only turn a
/// clear connect error back into a timeout.
pub(crate) fn process_tag() -> u32 {
    static TAG: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *TAG.get_or_init(|| {
        let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
        // FNV-1a over the boot id, then the pid.
        let mut h: u32 = 0x811c_9dc5;
        for b in boot.trim().bytes().chain(std::process::id().to_le_bytes()) {
            h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
        }
        h
    })
}

/// A set of simulated NICs that can reach each other over in-process wires.
#[derive(Debug, Clone)]
pub struct Fabric {
    owner: Arc<FabricOwner>,
}

/// Refuses a UDP wire address its NICs could not use: the unspecified address (it would travel
/// in queue infos, and peers cannot send to it) or one this host does not own (a probe socket on
/// it, at a free port, fails to bind).
fn check_udp_address(at: std::net::SocketAddrV4) -> Result<(), String> {
    if at.ip().is_unspecified() {
        return Err(format!(
            "the UDP wire cannot use {at}: give the address peers reach this host at (e.g. \
             127.0.0.1:0 on one host, or this host's interface address), since it travels in the \
             NICs' queue infos"
        ));
    }
    let probe = std::net::SocketAddrV4::new(*at.ip(), 0);
    std::net::UdpSocket::bind(probe).map(drop).map_err(|e| {
        format!(
            "the UDP wire cannot use {at}: no socket binds at {} on this host ({e}); give an \
             address of one of this host's interfaces (e.g. 127.0.0.1:0)",
            at.ip()
        )
    })
}

impl Fabric {
    /// A fabric with default settings for `engine`.
    pub fn new(engine: Engine) -> Self {
        Self::with_config(FabricConfig::new(engine))
    }

    /// A fabric with explicit settings.
    ///
    /// # Panics
    /// If the settings cannot work together (see [`try_with_config`](Self::try_with_config)).
    pub fn with_config(config: FabricConfig) -> Self {
        Self::try_with_config(config).unwrap_or_else(|e| panic!("{e}"))
    }

    /// A fabric with explicit settings, or why they cannot work: the Stepped engine runs only on
    /// the in-process wire; the UDP wire's address must be one of this host's (its NICs bind
    /// sockets there, and it travels in their queue infos), so 0.0.0.0 or an address no
    /// interface has is refused here, not later when a NIC is added.
    pub fn try_with_config(config: FabricConfig) -> Result<Self, String> {
        if config.engine.is_stepped() && config.wire != WireConfig::InProcess {
            return Err("the Stepped engine runs only on the in-process wire: its virtual clock and \
                        scheduler cannot reach NICs in other processes (use Inline or Threaded)"
                .into());
        }
        if let WireConfig::Udp(at) = config.wire {
            check_udp_address(at)?;
        }
        if config.wire == WireConfig::L2 {
            return Err(
                "the L2 wire needs its ports (one per NIC): make the fabric with Fabric::try_with_l2".into(),
            );
        }
        Ok(Self::build(config))
    }

    /// A fabric on the L2 wire ([`WireConfig::L2`]): its NICs, as they are added, get `ports` in
    /// order, one each, and speak RoCEv2 in Ethernet frames on them (`l2.rs`). The fabric's `mtu`
    /// is lowered to the path MTU the smallest port carries (1024 bytes on a 1500-byte
    /// Ethernet). Refused: no port, an unusable address, a port whose MTU cannot carry a
    /// 256-byte packet, the Stepped engine.
    pub fn try_with_l2(config: FabricConfig, ports: Vec<crate::l2::L2Attachment>) -> Result<Self, String> {
        if ports.is_empty() {
            return Err("the L2 wire needs at least one port".into());
        }
        let mut config = FabricConfig { wire: WireConfig::L2, ..config };
        if config.engine.is_stepped() {
            return Err(
                "the Stepped engine runs only on the in-process wire: its virtual clock cannot drive a \
                        real port or the ARP timers (use Inline or Threaded)"
                    .into(),
            );
        }
        for p in &ports {
            p.addr.check()?;
            let mtu = p.port.mtu();
            let path = crate::l2::path_mtu_of(mtu).ok_or_else(|| {
                format!(
                    "the L2 port of {} has an MTU of {mtu} bytes, too small for a 256-byte RoCE packet",
                    p.addr.ip
                )
            })?;
            config.mtu = config.mtu.min(path);
        }
        let fabric = Self::build(config);
        fabric.shared().l2_ports.lock().unwrap_or_else(|e| e.into_inner()).extend(ports);
        Ok(fabric)
    }

    /// The L2 wire: ports not yet given to a NIC (0 on other wires).
    pub fn l2_ports_left(&self) -> usize {
        self.shared().l2_ports.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    fn build(config: FabricConfig) -> Self {
        let (clock, seed): (Clock, u64) = config.engine.clock();
        let clock = Arc::new(clock);
        crate::wires::prepare(config.wire);
        static NEXT_ID: AtomicU32 = AtomicU32::new(1);
        let shared = Arc::new(FabricShared {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            config,
            faults: Arc::new(FaultControl::new(config.faults, clock.clone())),
            clock,
            nics: RwLock::new(Vec::new()),
            rng: Mutex::new(SplitMix(seed)),
            pcap: crate::pcap::from_env(),
            step: Mutex::new(StepState::default()),
            shutdown: AtomicBool::new(false),
            threads: Mutex::new(Vec::new()),
            l2_ports: Mutex::new(std::collections::VecDeque::new()),
        });
        Fabric { owner: Arc::new(FabricOwner { shared }) }
    }

    fn shared(&self) -> &Arc<FabricShared> {
        &self.owner.shared
    }

    /// The settings.
    pub fn config(&self) -> FabricConfig {
        self.shared().config
    }

    /// Adds a NIC. With the Threaded engine this starts its device thread; on the UDP wire it
    /// binds the NIC's socket and starts its receive thread; on the shared-memory wire it creates
    /// the NIC's segment and starts its receive thread.
    ///
    /// # Panics
    /// If that fails (see [`try_add_nic`](Self::try_add_nic)).
    pub fn add_nic(&self) -> SimNic {
        self.try_add_nic().unwrap_or_else(|e| panic!("cannot add a simulated NIC: {e}"))
    }

    /// Adds a NIC, or says why it cannot be added: on the UDP wire, its socket could not be
    /// bound (address in use, not an address of this host, ...).
    pub fn try_add_nic(&self) -> std::io::Result<SimNic> {
        let shared = self.shared();
        let mut nics = shared.nics.write().unwrap_or_else(|e| e.into_inner());
        let addr = nics.len() as u32;
        let nic = Arc::new(Nic::new(addr, shared.clone(), shared.config.caps));
        let spec = crate::wires::PortSpec {
            fabric: shared.id,
            nic: addr,
            mtu: shared.config.mtu,
            depth: shared.config.inbox_depth,
            ack_hold: shared.config.ack_hold,
            pcap: shared.pcap.clone(),
            l2: if shared.config.wire == WireConfig::L2 {
                shared.l2_ports.lock().unwrap_or_else(|e| e.into_inner()).pop_front()
            } else {
                None
            },
        };
        if let Some(port) = crate::wires::open(shared.config.wire, spec)? {
            nic.attach(port.clone());
            let host: std::sync::Weak<dyn WireHost> = Arc::downgrade(&nic) as _;
            if let Some(handle) = port.start(host)? {
                shared.threads.lock().unwrap_or_else(|e| e.into_inner()).push(handle);
            }
        }
        nics.push(nic.clone());
        drop(nics);
        if shared.config.engine.has_device_threads() {
            let weak = Arc::downgrade(&nic);
            let handle = std::thread::Builder::new()
                .name(format!("bypass-sim-nic{addr}"))
                .spawn(move || device_thread(weak))?;
            let _ = nic.thread.set(handle.thread().clone());
            shared.threads.lock().unwrap_or_else(|e| e.into_inner()).push(handle);
        }
        Ok(SimNic::new(nic, self.owner.clone()))
    }

    /// Stepped engine: runs one ready unit of device work, chosen by the seeded scheduler.
    /// Returns false when nothing is ready (timers may still be pending: see
    /// [`advance`](Self::advance)). On other engines this runs nothing and returns false.
    ///
    /// # Panics
    /// If units keep being offered as ready without making progress (a simulator bug).
    pub fn step(&self) -> bool {
        let shared = self.shared();
        if !shared.config.engine.is_stepped() {
            return false;
        }
        let mut st = shared.step.lock().unwrap_or_else(|e| e.into_inner());
        let StepState { nics, units, idle_runs } = &mut *st;
        nics.clear();
        nics.extend(shared.nics.read().unwrap_or_else(|e| e.into_inner()).iter().cloned());
        units.clear();
        for (i, nic) in nics.iter().enumerate() {
            let mut dev = sync::lock(&nic.dev);
            nic.ready_units(&mut dev, i, units);
        }
        if units.is_empty() {
            return false;
        }
        let pick = shared.rng.lock().unwrap_or_else(|e| e.into_inner()).below(units.len());
        let (i, unit) = units[pick];
        let nic = &nics[i];
        let did = nic.run_unit(&mut sync::lock(&nic.dev), unit);
        *idle_runs = if did { 0 } else { *idle_runs + 1 };
        assert!(
            *idle_runs < 10_000,
            "stepped engine livelock: {unit:?} on NIC {i} is ready but makes no progress"
        );
        true
    }

    /// Stepped engine: steps until nothing is ready; returns the number of steps.
    pub fn run_until_idle(&self) -> u64 {
        let mut n = 0;
        while self.step() {
            n += 1;
        }
        n
    }

    /// Stepped engine: moves the virtual clock forward by `by` (timers that fall due become
    /// ready units). Real-time engines ignore it.
    pub fn advance(&self, by: Duration) {
        self.shared().clock.advance(by.as_nanos() as u64);
        if trace::is_enabled() {
            let args =
                [("by_ns", (by.as_nanos() as u64).into()), ("now_ns", self.shared().clock.now().into())];
            trace::instant(Track::Thread("fabric"), "advance clock", &args);
        }
    }

    /// Inline engine: runs, on the calling thread, every NIC with work pending or a timer due.
    /// A thread that drives several NICs but waits on only one of them calls this instead of
    /// relying on the idle-poll safety net (which steps in only after many empty polls).
    /// Other engines: nothing to do (Threaded runs by itself; Stepped moves only on `step`).
    pub fn progress(&self) {
        self.shared().progress();
    }

    /// What the fault wires did so far (all zero without a fault plan).
    pub fn fault_stats(&self) -> FaultStats {
        let mut s = FaultStats::default();
        self.shared().faults.counters.add_to(&mut s);
        s
    }

    /// Replaces the fault plan of every link, from the next packet on (and of registrations from
    /// the next one). Links are wrapped in fault wires only if the fabric was made with a plan
    /// that is not [`FaultPlan::NONE`] (set [`FaultPlan::controls`] to have them wrapped with no
    /// fault to start with); on a fabric made without one this says so and changes nothing.
    /// `set_faults(FaultPlan { controls: true, ..FaultPlan::NONE })` stops every random fault
    /// (cut links and dead NICs stay as they are).
    pub fn set_faults(&self, plan: FaultPlan) -> Result<(), String> {
        self.need_controls("set_faults")?;
        self.shared().faults.set_plan(plan);
        Ok(())
    }

    /// The fault plan in force (the configured one unless [`set_faults`](Self::set_faults)
    /// replaced it).
    pub fn faults(&self) -> FaultPlan {
        self.shared().faults.plan()
    }

    /// Cuts the link between NICs `a` and `b`: every packet between them, in either direction
    /// and on every queue, is lost for `for_` on the fabric's clock (virtual with the Stepped
    /// engine), or until [`heal_links`](Self::heal_links) when `None`. Queues that keep sending
    /// across a cut exhaust their retries and go to ERROR (`RetryExceeded`), as over a dead
    /// switch port. Needs a fabric made with a fault plan (see [`set_faults`](Self::set_faults)).
    pub fn cut_link(&self, a: u32, b: u32, for_: Option<Duration>) -> Result<(), String> {
        self.need_controls("cut_link")?;
        self.shared().faults.cut(a, b, for_);
        Ok(())
    }

    /// Heals every cut link.
    pub fn heal_links(&self) {
        self.shared().faults.heal();
    }

    /// Kills NIC `addr`, as if it had died or been removed: from now on every packet from or to
    /// it is lost (its peers' queues exhaust their retries and go to ERROR), every one of its
    /// queues goes to ERROR with its outstanding work flushed, it raises
    /// [`AsyncEvent::DeviceFatal`](bypass_hal::AsyncEvent::DeviceFatal), and its control path
    /// (registering memory, creating CQs and queues, connecting) fails with
    /// [`Error::Device`](bypass_hal::Error::Device). A killed NIC stays dead. Needs a fabric made
    /// with a fault plan (see [`set_faults`](Self::set_faults)).
    pub fn kill_nic(&self, addr: u32) -> Result<(), String> {
        self.need_controls("kill_nic")?;
        let nic = self
            .shared()
            .nics
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(addr as usize)
            .cloned()
            .ok_or_else(|| format!("kill_nic: no NIC with address {addr} on this fabric"))?;
        self.shared().faults.kill(addr);
        nic.kill();
        Ok(())
    }

    fn need_controls(&self, what: &str) -> Result<(), String> {
        if self.config().faults.is_none() {
            return Err(format!(
                "{what}: this fabric's links have no fault wires; make it with a fault plan \
                 (FabricConfig::faults, e.g. FaultPlan {{ controls: true, ..FaultPlan::NONE }})"
            ));
        }
        Ok(())
    }

    /// Time since the fabric was created (virtual for the Stepped engine).
    pub fn now(&self) -> Duration {
        Duration::from_nanos(self.shared().clock.now())
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::time::Instant;

    fn parked(nic: &SimNic) -> bool {
        nic.nic.sleeping.load(Ordering::SeqCst)
    }

    #[test]
    fn backoff_option_values() {
        let parse = FabricConfig::parse_ack_timeout_backoff;
        assert_eq!(parse("off"), Ok(None));
        assert_eq!(parse("0"), Ok(None));
        assert_eq!(parse("18"), Ok(Some(BYTE_WIRE_ACK_TIMEOUT_BACKOFF)));
        assert_eq!(parse("1"), Ok(Some(Duration::from_nanos(8192))));
        for bad in ["32", "-1", "", "on", "1.5", "256"] {
            let e = parse(bad).unwrap_err();
            assert!(e.contains("1..=31") && e.contains(&format!("{bad:?}")), "{bad:?}: {e}");
        }
    }

    /// A NIC whose CQ was being polled (so its device thread backs off and leaves the work to
    /// the poller) still does its work once the polling stops without any CQ being armed: the
    /// receiver here is never polled again, yet it must take the message and acknowledge it, or
    /// the sender's completion never comes (or comes with a retry error).
    #[test]
    fn threaded_device_thread_resumes_when_its_poller_stops() {
        use bypass_hal::*;
        let fabric = Fabric::new(Engine::Threaded);
        let (a, b) = (fabric.add_nic(), fabric.add_nic());
        let cfg = QueueConfig::default();
        let (mut ca, mut cb) = (a.create_cq(64).unwrap(), b.create_cq(64).unwrap());
        let mut qa = a.create_queue(&cfg, &ca, &ca).unwrap();
        let mut qb = b.create_queue(&cfg, &cb, &cb).unwrap();
        let (ia, ib) = (qa.info(), qb.info());
        qa.connect(&ib).unwrap();
        qb.connect(&ia).unwrap();
        let mr = b.register(8, Access::LOCAL_WRITE).unwrap();
        qb.post_recv(&[RecvWr { wr_id: 1, sges: &[mr.sge(0, 8).unwrap()] }]).unwrap();
        let mut wc = [Completion::default(); 2];
        // Poll b's CQ until its device thread has seen the poller (it clears the flag as it
        // backs off).
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            assert_eq!(cb.poll(&mut wc).unwrap(), 0);
            std::thread::sleep(Duration::from_micros(100));
            if !b.nic.polled.load(Ordering::Relaxed) {
                break;
            }
            assert!(Instant::now() < deadline, "b's device thread never looked at its poll flag");
        }
        assert_eq!(cb.poll(&mut wc).unwrap(), 0);
        qa.post_send(&[SendWr::send(2, &[])]).unwrap();
        let mut sent = 0;
        while sent == 0 {
            assert!(Instant::now() < deadline, "an unpolled NIC's device thread did not resume");
            sent += ca.poll(&mut wc).unwrap();
            std::thread::yield_now();
        }
        assert_eq!((wc[0].wr_id, wc[0].status), (2, Status::Success));
        assert_eq!(cb.poll(&mut wc).unwrap(), 1, "the receive completed without b being polled");
        assert_eq!(wc[0].wr_id, 1);
    }

    /// An idle NIC's device thread parks (so it burns no CPU) and a doorbell wakes it.
    #[test]
    fn threaded_device_thread_parks_when_idle_and_wakes_on_doorbell() {
        use bypass_hal::*;
        let fabric = Fabric::new(Engine::Threaded);
        let (a, b) = (fabric.add_nic(), fabric.add_nic());
        let deadline = Instant::now() + Duration::from_secs(20);
        while !(parked(&a) && parked(&b)) {
            assert!(Instant::now() < deadline, "device threads never parked");
            std::thread::yield_now();
        }
        let cfg = QueueConfig::default();
        let (mut ca, mut cb) = (a.create_cq(64).unwrap(), b.create_cq(64).unwrap());
        let mut qa = a.create_queue(&cfg, &ca, &ca).unwrap();
        let mut qb = b.create_queue(&cfg, &cb, &cb).unwrap();
        let (ia, ib) = (qa.info(), qb.info());
        qa.connect(&ib).unwrap();
        qb.connect(&ia).unwrap();
        let mr = b.register(8, Access::LOCAL_WRITE).unwrap();
        qb.post_recv(&[RecvWr { wr_id: 1, sges: &[mr.sge(0, 8).unwrap()] }]).unwrap();
        qa.post_send(&[SendWr::send(2, &[])]).unwrap();
        let mut wc = [Completion::default(); 2];
        let mut got = (0, 0);
        while got != (1, 1) {
            assert!(Instant::now() < deadline, "a parked device thread did not wake: {got:?}");
            got.0 += ca.poll(&mut wc).unwrap();
            got.1 += cb.poll(&mut wc).unwrap();
            std::thread::yield_now();
        }
    }
}
