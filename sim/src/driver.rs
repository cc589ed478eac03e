//! The driver: what an application links. It implements the hal traits by writing WQEs into the
//! rings, ringing doorbells, and polling CQEs by owner bit; it keeps the side tables that map ring
//! slots back to `wr_id`s. Control operations (register, create, connect, reset) talk to the
//! device under its lock, like a verbs provider's command interface.

use crate::attach::AttachTable;
use crate::device::keys::RegionDesc;
use crate::device::qp::QpCtx;
use crate::device::NicStats;
use crate::eventfd::EventFd;
use crate::events::SimChannel;
use crate::fabric::FabricOwner;
use crate::layout::{self, cqe_flags, WqeOp};
use crate::nic::Nic;
use crate::ring::{CqRing, WorkRing};
use crate::shared::{armed, CqShared, QueueShared, SideTable};
use crate::shared_recv::SimSharedRecv;
use crate::source::Life;
use crate::sync::{self, AtomicBool, AtomicU32, AtomicU8, Mutex, Ordering};
use bypass_hal::trace::{self, Track};
use bypass_hal::{
    Access, ArmMode, AsyncEvent, Completion, CompletionQueue, Device, DeviceCaps, Error, MemoryRegion, Queue,
    QueueConfig, QueueInfo, QueueState, RecvWr, RemoteKey, Result, SendOp, SendWr, Sge, WrFlags,
};
use std::alloc::Layout;
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, RawFd};
use std::ptr::NonNull;
use std::sync::Arc;

/// Checks that a ring with producer index `pi` and poller-published consumer index `ci` has room
/// for `wanted` WQEs: `Err(WouldBlock)` if not, `Ok(false)` for an empty batch, `Ok(true)` to post.
fn has_room(ring: &WorkRing, pi: u32, ci: &AtomicU32, wanted: usize, side: &'static str) -> Result<bool> {
    let free = ring.depth() - pi.wrapping_sub(ci.load(Ordering::Acquire));
    if wanted > free as usize {
        return Err(Error::WouldBlock { side, free, wanted });
    }
    Ok(wanted > 0)
}

/// Most completions one `poll` returns (the ring slots they free are remembered on the stack).
const POLL_FREES: usize = 64;

/// loom only: the driver's room check, for the ring models (`crate::loom_api`).
#[cfg(loom)]
pub(crate) fn has_room_for_loom(ring: &WorkRing, pi: u32, ci: &AtomicU32, wanted: usize) -> Result<bool> {
    has_room(ring, pi, ci, wanted, "send")
}

/// Bytes of a WQE the driver must write: its header and SGEs (or inline payload), in blocks.
fn used_blocks(flags: WrFlags, sges: &[Sge]) -> usize {
    let data = if flags.contains(WrFlags::INLINE) {
        sges.iter().map(|s| s.len as usize).sum()
    } else {
        sges.len() * layout::WQE_SGE
    };
    (layout::WQE_HEADER + data).div_ceil(layout::BLOCK) * layout::BLOCK
}

/// Inline engine: after this many empty polls in a row a poller runs other NICs' pending work — a
/// safety net for a NIC whose own user is not polling. Kept high: a poller that helps too eagerly
/// runs a busy peer's device on the wrong thread, and both threads then fight over both NICs'
/// state (the two-thread ping-pong settled at ~3.1 µs instead of ~1.1 µs with 64 here).
const HELP_AFTER_IDLE_POLLS: u32 = 1024;

/// A simulated NIC, as an application sees it: a [`bypass_hal::Device`].
#[derive(Debug, Clone)]
pub struct SimNic {
    pub(crate) nic: Arc<Nic>,
    owner: Arc<FabricOwner>,
}

impl SimNic {
    pub(crate) fn new(nic: Arc<Nic>, owner: Arc<FabricOwner>) -> Self {
        SimNic { nic, owner }
    }

    /// The NIC's address on its fabric.
    pub fn addr(&self) -> u32 {
        self.nic.addr
    }

    /// The NIC's counters.
    pub fn stats(&self) -> NicStats {
        let mut s = sync::lock(&self.nic.dev).stats;
        if let Some(p) = self.nic.wire_port.get() {
            let w = p.stats();
            s.rx_malformed += w.rx_malformed;
            s.rx_ignored += w.rx_ignored;
            s.tx_wire_dropped += w.tx_dropped;
            s.tx_wakeups += w.tx_wakeups;
            s.tx_wire_sends += w.tx_sends;
        }
        s
    }

    /// The NIC's shared-memory segment, on a fabric whose wire is shared memory
    /// ([`crate::WireConfig::Shm`]).
    pub fn shm_path(&self) -> Option<std::path::PathBuf> {
        self.nic.wire_port.get()?.segment_path().map(|p| p.to_path_buf())
    }

    /// The NIC's UDP socket address, on a fabric whose wire is UDP ([`crate::WireConfig::Udp`]).
    pub fn udp_addr(&self) -> Option<std::net::SocketAddrV4> {
        self.nic.wire_port.get()?.socket_addr()
    }

    /// How a peer reaches this NIC: the `gid` and `lid` every [`QueueInfo`] of its queues carries
    /// (the UDP wire's port is the `lid`). A layer that names NICs by address (sim-urma's EIDs)
    /// builds a peer's `QueueInfo` from it and a queue number.
    pub fn endpoint(&self) -> ([u8; 16], u16) {
        self.nic.endpoint()
    }
}

fn invalid(msg: impl Into<String>) -> Error {
    Error::InvalidArgument(msg.into())
}

/// Ids of CQs ([`CompletionQueue::id`]), unique in the process.
static NEXT_CQ_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

impl SimNic {
    fn check_access(&self, len: usize, access: Access) -> Result<()> {
        if len as u64 > self.nic.caps.max_region_size {
            return Err(invalid(format!("region of {len} bytes exceeds the device limit")));
        }
        if access.contains(Access::REMOTE_WRITE) && !access.contains(Access::LOCAL_WRITE) {
            return Err(invalid("REMOTE_WRITE access requires LOCAL_WRITE"));
        }
        if access.contains(Access::REMOTE_ATOMIC) && !access.contains(Access::LOCAL_WRITE) {
            return Err(invalid("REMOTE_ATOMIC access requires LOCAL_WRITE"));
        }
        Ok(())
    }

    /// Enters `base..base+len` in the key table; `layout` is the allocation to free on drop
    /// (`None`: the caller's memory).
    fn enter_region(
        &self,
        ptr: NonNull<u8>,
        len: usize,
        access: Access,
        layout: Option<Layout>,
    ) -> Result<SimRegion> {
        self.nic.check_alive()?;
        if self.nic.fabric.faults.refuse_registration() {
            return Err(Error::OutOfResources(format!(
                "simulated NIC {} refused to register {len} bytes (the fabric's fault plan, \
                 FaultPlan::register_fail_ppm): release registrations or retry later",
                self.nic.addr
            )));
        }
        let desc = RegionDesc { base: ptr.as_ptr(), addr: ptr.as_ptr() as u64, len: len as u64, access };
        let life = Arc::new(Life::new());
        let Some(key) = sync::lock(&self.nic.dev).keys.insert(desc, life.clone()) else {
            return Err(Error::OutOfResources("the NIC's key table is full".into()));
        };
        Ok(SimRegion {
            nic: self.nic.clone(),
            _owner: self.owner.clone(),
            ptr,
            layout,
            len,
            key,
            access,
            life,
        })
    }

    /// Creates a queue; with `srq`, one that takes its receives from that shared receive queue.
    fn new_queue(
        &self,
        config: &QueueConfig,
        send_cq: &SimCq,
        recv_cq: &SimCq,
        srq: Option<&SimSharedRecv>,
    ) -> Result<SimQueue> {
        self.new_queue_of(config, send_cq, recv_cq, srq, Service::Connected)
    }

    /// Makes the NIC of the queue `peer` describes known to this NIC's wire, without a queue:
    /// returns its source id (what [`SimCq::poll_from`] reports for datagrams from it). On a
    /// byte wire a datagram queue takes datagrams only from NICs its wire knows, so a receiver
    /// reaches its senders first (what importing a UM jetty does in sim-urma).
    pub fn reach(&self, peer: &QueueInfo) -> Result<u32> {
        let (wire, id) = self.nic.link(0, peer).map_err(invalid)?;
        sync::lock(&self.nic.dev).routes.insert(id, crate::device::qp::dest(wire, id, 0));
        Ok(id)
    }

    /// A queue of the unreliable datagram service (UB's UM, verbs' UD): connected to no one,
    /// each send names its destination (see [`SimQueue::post_datagrams`]), no acknowledgement
    /// and no retry, and a receive completion says who sent ([`SimCq::poll_from`]). It starts
    /// in RESET; [`SimQueue::activate`] makes it READY. `shared`: take receives from a shared
    /// receive queue. The hal has no datagram queue type; this is the simulator's own API (used by
    /// sim-urma's UM jetties). docs/sim.md, "Datagram queues (UM)".
    pub fn create_datagram_queue(
        &self,
        config: &QueueConfig,
        send_cq: &SimCq,
        recv_cq: &SimCq,
        shared: Option<&SimSharedRecv>,
    ) -> Result<SimQueue> {
        self.new_queue_of(config, send_cq, recv_cq, shared, Service::Datagram)
    }

    /// A queue of the reliable datagram service (UB's RM, "reliable message"): addressed like a
    /// datagram queue ([`create_datagram_queue`](Self::create_datagram_queue): each send names
    /// its destination, any sender), delivered like RC: every message is acknowledged, retried
    /// after the ACK timeout, RNR-retried when the target has no receive posted, delivered once
    /// and completed in posting order (one message in flight per queue). Its targets must be
    /// reliable datagram queues too. docs/sim.md, "Datagram queues (UM)", "Reliable (RM)".
    pub fn create_reliable_datagram_queue(
        &self,
        config: &QueueConfig,
        send_cq: &SimCq,
        recv_cq: &SimCq,
        shared: Option<&SimSharedRecv>,
    ) -> Result<SimQueue> {
        self.new_queue_of(config, send_cq, recv_cq, shared, Service::ReliableDatagram)
    }

    fn new_queue_of(
        &self,
        config: &QueueConfig,
        send_cq: &SimCq,
        recv_cq: &SimCq,
        srq: Option<&SimSharedRecv>,
        service: Service,
    ) -> Result<SimQueue> {
        let datagram = service != Service::Connected;
        self.nic.check_alive()?;
        let caps = &self.nic.caps;
        let c = config;
        let depth_ok = |d: u32| (1..=caps.max_queue_depth).contains(&d);
        if !depth_ok(c.send_depth) || !depth_ok(c.recv_depth) {
            return Err(invalid(format!("queue depths must be in 1..={}", caps.max_queue_depth)));
        }
        if c.max_send_sge == 0
            || c.max_send_sge > caps.max_send_sge
            || c.max_recv_sge == 0
            || c.max_recv_sge > caps.max_recv_sge
        {
            return Err(invalid(format!("SGE limits must be in 1..={}", caps.max_send_sge)));
        }
        if c.max_inline > caps.max_inline {
            return Err(invalid(format!(
                "max_inline {} exceeds the device's {}",
                c.max_inline, caps.max_inline
            )));
        }
        if c.retry_count > 7 || c.rnr_retry > 7 {
            return Err(invalid("retry_count and rnr_retry are 0..=7"));
        }
        if !Arc::ptr_eq(&send_cq.nic, &self.nic) || !Arc::ptr_eq(&recv_cq.nic, &self.nic) {
            return Err(invalid("the CQs belong to another NIC"));
        }
        let srq = match srq {
            Some(s) if !Arc::ptr_eq(&s.nic, &self.nic) => {
                return Err(invalid("the shared receive queue belongs to another NIC"))
            }
            Some(s) => Some(s.shared.clone()),
            None => None,
        };
        let sq_depth = c.send_depth.next_power_of_two();
        // On a shared receive queue, the queue's own ring holds the receives the device took
        // from it whose completions are not yet polled (see `SrqShared`).
        let rq_depth = c.recv_depth.next_power_of_two();
        let sq_stride = layout::wqe_stride(c.max_send_sge, c.max_inline);
        let rq_sge = srq.as_ref().map_or(c.max_recv_sge, |s| s.max_sge);
        let rq_stride = layout::wqe_stride(rq_sge, 0);
        let psn = self.nic.fabric.next_psn();
        let mut dev = sync::lock(&self.nic.dev);
        let Some(new) = dev.alloc_queue() else {
            return Err(Error::OutOfResources(format!(
                "the NIC has {} queues open, its most: destroy one first",
                crate::device::MAX_QUEUES - 2
            )));
        };
        let shared = Arc::new(QueueShared {
            nic: self.nic.addr,
            qpn: new.qpn,
            config: *c,
            sq: WorkRing::new(sq_depth, sq_stride),
            rq: WorkRing::new(rq_depth, rq_stride),
            sq_ids: SideTable::new(sq_depth),
            rq_ids: SideTable::new(rq_depth),
            sq_ci: AtomicU32::new(0),
            rq_ci: AtomicU32::new(0),
            state: AtomicU8::new(0),
            psn: AtomicU32::new(psn),
            epoch: AtomicU32::new(new.epoch),
            first_epoch: new.epoch,
            srq,
        });
        if let Some(srq) = &shared.srq {
            srq.users.fetch_add(1, Ordering::AcqRel);
        }
        let responder = c.max_dest_rd_atomic.min(caps.max_dest_rd_atomic);
        let mut qp =
            Box::new(QpCtx::new(shared.clone(), send_cq.shared.clone(), recv_cq.shared.clone(), responder));
        qp.datagram = datagram;
        qp.reliable = service == Service::ReliableDatagram;
        qp.set_backoff_cap(self.nic.fabric.config.ack_timeout_backoff);
        dev.install(qp);
        drop(dev);
        for cq in [&send_cq.shared, &recv_cq.shared] {
            let mut list = sync::lock(&cq.attach);
            list.insert(crate::device::slot_of(shared.qpn), shared.clone());
            cq.attach_pending.store(true, Ordering::Release);
        }
        Ok(SimQueue {
            nic: self.nic.clone(),
            _owner: self.owner.clone(),
            wqe: vec![0u8; sq_stride.max(rq_stride)].into(),
            shared,
            sq_pi: 0,
            rq_pi: 0,
            datagram,
        })
    }

    fn new_cq(&self, depth: u32, channel: Option<&SimChannel>) -> Result<SimCq> {
        self.nic.check_alive()?;
        if depth == 0 || depth > self.nic.caps.max_cq_depth {
            return Err(invalid(format!("CQ depth {depth} is outside 1..={}", self.nic.caps.max_cq_depth)));
        }
        if let Some(c) = channel {
            if c.nic != self.nic.addr {
                return Err(invalid("the event channel belongs to another NIC"));
            }
        }
        let shared = Arc::new(CqShared {
            ring: CqRing::new(depth.next_power_of_two()),
            pi: AtomicU32::new(0),
            armed: AtomicU8::new(armed::NO),
            event: EventFd::new()?,
            overflow: AtomicBool::new(false),
            attach: Mutex::new(AttachTable::default()),
            attach_pending: AtomicBool::new(false),
            nic_armed: self.nic.armed_cqs.clone(),
            id: NEXT_CQ_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            channel: channel.map(|c| c.shared.clone()),
        });
        Ok(SimCq {
            nic: self.nic.clone(),
            _owner: self.owner.clone(),
            shared,
            ci: 0,
            queues: AttachTable::default(),
            idle: 0,
            frees: Vec::with_capacity(POLL_FREES),
        })
    }
}

impl Device for SimNic {
    type Region = SimRegion;
    type Cq = SimCq;
    type Queue = SimQueue;
    type Channel = SimChannel;
    type SharedRecv = SimSharedRecv;

    fn caps(&self) -> DeviceCaps {
        self.nic.caps
    }

    fn register(&self, len: usize, access: Access) -> Result<SimRegion> {
        self.check_access(len, access)?;
        let layout = Layout::from_size_align(len.max(1), 4096).map_err(|e| invalid(e.to_string()))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) })
            .ok_or_else(|| Error::OutOfResources(format!("cannot allocate {len} bytes to register")))?;
        self.enter_region(ptr, len, access, Some(layout)).inspect_err(|_| {
            // SAFETY: allocated just above with this layout and not shared.
            unsafe { std::alloc::dealloc(ptr.as_ptr(), layout) };
        })
    }

    unsafe fn register_external(&self, ptr: *mut u8, len: usize, access: Access) -> Result<SimRegion> {
        self.check_access(len, access)?;
        let ptr = NonNull::new(ptr).ok_or_else(|| invalid("register_external of a null pointer"))?;
        self.enter_region(ptr, len, access, None)
    }

    fn create_cq(&self, depth: u32) -> Result<SimCq> {
        self.new_cq(depth, None)
    }

    fn create_channel(&self) -> Result<SimChannel> {
        SimChannel::new(self.nic.addr)
    }

    fn create_cq_on(&self, depth: u32, channel: &SimChannel) -> Result<SimCq> {
        self.new_cq(depth, Some(channel))
    }

    fn async_event_fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.nic.events.fd())
    }

    fn poll_async_event(&self) -> Result<Option<AsyncEvent>> {
        self.nic.events.pop()
    }

    fn create_queue(&self, config: &QueueConfig, send_cq: &SimCq, recv_cq: &SimCq) -> Result<SimQueue> {
        self.new_queue(config, send_cq, recv_cq, None)
    }

    fn create_shared_recv(&self, depth: u32, max_sge: u32) -> Result<SimSharedRecv> {
        SimSharedRecv::new(self.nic.clone(), self.owner.clone(), depth, max_sge)
    }

    fn create_queue_on_shared(
        &self,
        config: &QueueConfig,
        send_cq: &SimCq,
        recv_cq: &SimCq,
        shared: &SimSharedRecv,
    ) -> Result<SimQueue> {
        self.new_queue(config, send_cq, recv_cq, Some(shared))
    }

    /// Inline engine: runs the fabric's NICs that have work on this thread (see
    /// [`Fabric::progress`](crate::Fabric::progress)). Threaded: nothing to do. Stepped: nothing
    /// moves until the test calls [`Fabric::step`](crate::Fabric::step).
    fn progress(&self) {
        self.nic.fabric.progress();
    }

    /// Stepped engine: yes, only the test's `Fabric::step`, `run_until_idle` and `advance` move
    /// the NIC and its clock.
    fn externally_stepped(&self) -> bool {
        self.nic.fabric.config.engine.is_stepped()
    }

    /// The fabric's clock: real time, or the virtual clock of the Stepped engine.
    fn now(&self) -> std::time::Duration {
        std::time::Duration::from_nanos(self.nic.fabric.clock.now())
    }
}

/// Registered memory on a simulated NIC.
#[derive(Debug)]
pub struct SimRegion {
    nic: Arc<Nic>,
    _owner: Arc<FabricOwner>,
    ptr: NonNull<u8>,
    /// The allocation to free on drop; `None` for caller memory (`register_external`).
    layout: Option<Layout>,
    len: usize,
    key: u32,
    access: Access,
    /// Guards the memory for packets that refer to it from a peer's inbox (`source.rs`).
    life: Arc<Life>,
}

// SAFETY: the region owns its allocation; shared access to the bytes follows the DMA contract in
// bypass_hal's `mr` module docs, and the key lives in the device under its lock.
unsafe impl Send for SimRegion {}
// SAFETY: as above; all methods take `&self` and either copy through raw pointers or lock.
unsafe impl Sync for SimRegion {}

impl MemoryRegion for SimRegion {
    fn len(&self) -> usize {
        self.len
    }
    fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }
    fn lkey(&self) -> u32 {
        self.key
    }
    fn remote_key(&self) -> RemoteKey {
        RemoteKey::from_rkey(self.key)
    }
    fn access(&self) -> Access {
        self.access
    }
    fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for SimRegion {
    fn drop(&mut self) {
        // Deregister first: once the key is gone (under the device lock) the device can no longer
        // reach this memory, nor make new references to it for the in-process wire. Then kill
        // its liveness: packets that still refer to it from a peer's inbox are lost from now on,
        // and `kill` returns once a peer copying from it right now is done.
        sync::lock(&self.nic.dev).keys.remove(self.key);
        self.life.kill();
        if let Some(layout) = self.layout {
            // SAFETY: allocated in `register` with this layout; no key refers to it any more and
            // no reader is in it or can enter it (`kill`).
            unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) };
        }
    }
}

/// A completion queue on a simulated NIC.
#[derive(Debug)]
pub struct SimCq {
    nic: Arc<Nic>,
    _owner: Arc<FabricOwner>,
    shared: Arc<CqShared>,
    ci: u32,
    /// The queues completing here, by slot (a copy of `CqShared::attach`).
    queues: AttachTable<Arc<QueueShared>>,
    /// Consecutive empty polls (Inline engine: after a few, help other NICs along).
    idle: u32,
    /// Work-ring slots one poll frees after giving the CQ slots back: (queue, receive?, new CI).
    frees: Vec<(usize, bool, u32)>,
}

impl SimCq {
    /// The queue numbered `qpn` (generation included) among those completing here.
    #[inline]
    fn queue(&self, qpn: u32) -> Option<&QueueShared> {
        self.queues.get(crate::device::slot_of(qpn)).map(|q| &**q).filter(|q| q.qpn == qpn)
    }
}

impl SimCq {
    /// True when a completion not yet polled would wake a CQ armed with `mode`: any for
    /// [`ArmMode::Any`]; for [`ArmMode::Solicited`] a solicited or an error one.
    fn pending_wakes(&self, mode: ArmMode) -> bool {
        let mut i = self.ci;
        for _ in 0..self.shared.ring.depth() {
            // SAFETY: `&mut self` (the caller's) makes this handle the ring's only consumer; a
            // read does not consume.
            let Some(cqe) = (unsafe { self.shared.ring.read(i) }) else { return false };
            if mode == ArmMode::Any
                || cqe.flags & cqe_flags::SOLICITED != 0
                || cqe.status != bypass_hal::Status::Success
            {
                return true;
            }
            i = i.wrapping_add(1);
        }
        false
    }

    /// Raises this CQ's event now if it is armed: a driver that completes work itself (a
    /// library's software completions, such as receives flushed from a shared receive ring)
    /// wakes a waiter the way a device CQE would.
    pub fn fire_if_armed(&self) {
        self.shared.fire_if_armed();
    }
}

impl Drop for SimCq {
    fn drop(&mut self) {
        // An armed CQ counts towards its NIC's "user asleep" state; a dropped one no longer can.
        if self.shared.armed.swap(armed::NO, Ordering::AcqRel) != armed::NO {
            self.shared.nic_armed.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl CompletionQueue for SimCq {
    fn depth(&self) -> u32 {
        self.shared.ring.depth()
    }

    fn poll(&mut self, out: &mut [Completion]) -> Result<usize> {
        // SAFETY: `poll_inner` only writes initialised completions into the slots, so `out`
        // stays initialised; `MaybeUninit<T>` has `T`'s layout.
        let slots = unsafe { &mut *(out as *mut [Completion] as *mut [MaybeUninit<Completion>]) };
        self.poll_inner(slots, &mut [])
    }

    fn poll_uninit<'a>(&mut self, out: &'a mut [MaybeUninit<Completion>]) -> Result<&'a [Completion]> {
        let n = self.poll_inner(out, &mut [])?;
        // SAFETY: `poll_inner` initialised `out[..n]`; `MaybeUninit<T>` has `T`'s layout.
        Ok(unsafe { std::slice::from_raw_parts(out.as_ptr().cast::<Completion>(), n) })
    }

    fn arm(&mut self, mode: ArmMode) -> Result<()> {
        let v = match mode {
            ArmMode::Any => armed::ANY,
            ArmMode::Solicited => armed::SOLICITED,
        };
        self.shared.arm(v);
        // Arming is against the consumer index, as on mlx5 and UDMA (their arm doorbells carry
        // it): completions already past it raise the event at once (hal's `CompletionQueue::arm`).
        if self.pending_wakes(mode) {
            self.shared.fire_if_armed();
        }
        self.nic.on_arm();
        Ok(())
    }

    fn id(&self) -> u64 {
        self.shared.id
    }

    fn event_fd(&self) -> RawFd {
        match &self.shared.channel {
            Some(c) => c.fd(),
            None => self.shared.event.raw(),
        }
    }

    fn ack_events(&mut self) -> Result<u64> {
        if self.shared.channel.is_some() {
            return Ok(0);
        }
        Ok(self.shared.event.drain()?)
    }
}

impl SimCq {
    /// [`CompletionQueue::poll`], also filling `from[i]` with the sender of `out[i]` when it is
    /// a datagram receive (zero otherwise). Up to `min(out.len(), from.len())` completions.
    pub fn poll_from(&mut self, out: &mut [Completion], from: &mut [Source]) -> Result<usize> {
        let n = out.len().min(from.len());
        // SAFETY: as in `poll`: only initialised completions are written into the slots.
        let slots = unsafe { &mut *(&mut out[..n] as *mut [Completion] as *mut [MaybeUninit<Completion>]) };
        self.poll_inner(slots, &mut from[..n])
    }

    /// Writes completions into `out[..n]` (initialised values only) and returns `n`.
    fn poll_inner(&mut self, out: &mut [MaybeUninit<Completion>], from: &mut [Source]) -> Result<usize> {
        self.nic.on_poll(self.idle % 16 == 0);
        if self.shared.attach_pending.load(Ordering::Acquire) {
            self.shared.attach_pending.store(false, Ordering::Relaxed);
            let list = sync::lock(&self.shared.attach);
            self.queues.clone_from(&list);
        }
        // Work-ring slots are freed only after the CQ slots are given back: a poster on another
        // thread may reuse a freed ring slot at once, and its completion must find room in the
        // CQ (found by the loom ring model `split_poster_and_poller`).
        self.frees.clear();
        let (mut n, mut consumed) = (0, 0);
        while n < out.len() && consumed < POLL_FREES {
            // SAFETY: `&mut self` makes this handle the ring's only consumer.
            let Some(cqe) = (unsafe { self.shared.ring.read(self.ci) }) else { break };
            self.ci = self.ci.wrapping_add(1);
            consumed += 1;
            let recv = cqe.flags & cqe_flags::RECV != 0;
            let (wr_id, current) = match self.queue(cqe.qpn) {
                // A CQE of a destroyed queue whose number a later queue has now (its slot reused
                // 256 times): not this queue's, and it frees none of its ring slots.
                Some(q) if (cqe.epoch.wrapping_sub(q.first_epoch) as i32) < 0 => (0, false),
                Some(q) => {
                    let ids = if recv { &q.rq_ids } else { &q.sq_ids };
                    // A CQE of an earlier life of the queue (before a reset) still frees its
                    // ring slot but is not delivered: RESET purges, as on mlx5.
                    let current = cqe.epoch == q.epoch.load(Ordering::Acquire);
                    // SAFETY: we are the poller and have just read this slot's completion; the
                    // slot is not freed (so not reused) before the end of this poll.
                    let id = unsafe { ids.get(cqe.wqe_index) };
                    let slot = crate::device::slot_of(cqe.qpn);
                    self.frees.push((slot, recv, cqe.wqe_index.wrapping_add(1)));
                    (id, current)
                }
                // A CQE of a queue already destroyed: nobody can own it (verbs drops these too).
                None => (0, false),
            };
            if !current {
                continue;
            }
            out[n].write(Completion {
                wr_id,
                status: cqe.status,
                opcode: cqe.opcode,
                byte_len: cqe.byte_len,
                imm: (cqe.flags & cqe_flags::HAS_IMM != 0).then_some(cqe.imm),
                qpn: cqe.qpn,
            });
            if let Some(f) = from.get_mut(n) {
                *f = Source { nic: cqe.src_nic, qpn: cqe.src_qpn };
            }
            n += 1;
        }
        if consumed > 0 {
            self.idle = 0;
            self.shared.ring.release(self.ci);
            for &(qi, recv, next) in &self.frees {
                if let Some(q) = self.queues.get(qi) {
                    let ci = if recv { &q.rq_ci } else { &q.sq_ci };
                    ci.store(next, Ordering::Release);
                }
            }
        } else {
            if self.shared.overflow.load(Ordering::Acquire) {
                return Err(Error::CqOverflow { depth: self.depth() });
            }
            self.nic.on_empty_poll();
            self.idle = self.idle.wrapping_add(1);
            if self.idle % HELP_AFTER_IDLE_POLLS == 0 {
                self.nic.on_idle_polls();
            }
        }
        Ok(n)
    }
}

/// A reliable-connected queue on a simulated NIC.
#[derive(Debug)]
pub struct SimQueue {
    nic: Arc<Nic>,
    _owner: Arc<FabricOwner>,
    shared: Arc<QueueShared>,
    sq_pi: u32,
    rq_pi: u32,
    /// Where WQEs are assembled before they are copied into the ring.
    wqe: Box<[u8]>,
    /// A datagram queue ([`SimNic::create_datagram_queue`]).
    datagram: bool,
}

/// A datagram queue's destination: what [`SimQueue::add_dest`] returns and
/// [`SimQueue::post_datagrams`] takes, one per work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dest {
    /// The address handle: an index into the queue's destinations.
    pub ah: u32,
    /// The target queue.
    pub qpn: u32,
    /// The target NIC's source id on this NIC's wire: what [`SimCq::poll_from`] reports for
    /// datagrams from it.
    pub source: u32,
}

/// Who sent a datagram: what [`SimCq::poll_from`] reports beside each completion.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Source {
    /// The sending NIC's source id (as in [`Dest::source`]); 0 for other completions.
    pub nic: u32,
    /// The sending queue; 0 for other completions.
    pub qpn: u32,
}

impl SimQueue {
    /// True for a datagram queue ([`SimNic::create_datagram_queue`]).
    pub fn is_datagram(&self) -> bool {
        self.datagram
    }

    /// RESET → READY for a datagram queue (a connected queue uses `connect`).
    pub fn activate(&mut self) -> Result<()> {
        if !self.datagram {
            return Err(invalid("activate is for datagram queues: connect a connected queue to its peer"));
        }
        self.control(|qp, _| match qp.state {
            QueueState::Reset => {
                qp.activate_datagram();
                Ok(())
            }
            state => Err(Error::BadState { state, op: "activate", needs: "RESET" }),
        })
    }

    /// A datagram queue's destination: the queue `peer` describes (on any NIC this NIC's wire
    /// reaches). The same peer gives the same handle.
    pub fn add_dest(&mut self, peer: &QueueInfo) -> Result<Dest> {
        if !self.datagram {
            return Err(invalid("add_dest is for datagram queues: a connected queue has one peer"));
        }
        let (wire, id) = self.nic.link(self.shared.qpn, peer).map_err(invalid)?;
        sync::lock(&self.nic.dev)
            .routes
            .entry(id)
            .or_insert_with(|| crate::device::qp::dest(wire.clone(), id, 0));
        let ah = self.control(|qp, _| qp.add_dest(crate::device::qp::dest(wire, id, peer.qpn)));
        Ok(Dest { ah, qpn: peer.qpn, source: id })
    }

    /// Posts datagrams (SEND, SEND_IMM, WRITE, WRITE_IMM or READ, each at most one MTU; no
    /// atomics), `dests[i]` the destination of `wrs[i]`.
    /// A datagram queue is READY, or in ERROR (whose posts the device flushes).
    pub fn post_datagrams(&mut self, wrs: &[SendWr<'_>], dests: &[Dest]) -> Result<()> {
        if !self.datagram {
            return Err(invalid("post_datagrams is for datagram queues: use post_send"));
        }
        if dests.len() != wrs.len() {
            return Err(invalid("post_datagrams needs one destination per work request"));
        }
        if let Some(wr) =
            wrs.iter().find(|w| matches!(w.op, SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. }))
        {
            return Err(invalid(format!(
                "a datagram queue carries SEND, SEND_IMM, WRITE, WRITE_IMM and READ, not {:?}",
                wr.op
            )));
        }
        self.post_send_to(wrs, Some(dests))
    }

    /// Sets the first PSN this queue will send (what [`Queue::info`] reports) while it is in
    /// RESET, instead of the random one it got at creation or reset. For layers whose peers learn
    /// only a queue's number (sim-urma: a URMA jetty id), so both ends must derive the PSN.
    pub fn set_initial_psn(&mut self, psn: u32) -> Result<()> {
        if self.shared.state() != QueueState::Reset {
            return Err(Error::BadState {
                state: self.shared.state(),
                op: "set_initial_psn",
                needs: "RESET",
            });
        }
        self.shared.psn.store(psn & 0x00ff_ffff, Ordering::Relaxed);
        Ok(())
    }

    /// Posting needs a connected queue: READY, or ERROR (whose posts the device flushes).
    fn need_connected(&self, op: &'static str) -> Result<()> {
        match self.shared.state() {
            QueueState::Reset => {
                Err(Error::BadState { state: QueueState::Reset, op, needs: "READY (or ERROR)" })
            }
            _ => Ok(()),
        }
    }

    #[cold]
    fn trace_doorbell(&self, name: &'static str, pi: u32, wqes: usize) {
        let args = [("qpn", self.shared.qpn.into()), ("pi", pi.into()), ("wqes", wqes.into())];
        trace::instant(Track::Nic(self.shared.nic), name, &args);
    }

    fn control<R>(&self, f: impl FnOnce(&mut QpCtx, &mut crate::device::Ctx<'_>) -> R) -> R {
        let now = self.nic.now();
        let mut dev = sync::lock(&self.nic.dev);
        self.nic.send_held_acks_locked(&mut dev);
        let r = dev.with_qp(self.shared.qpn, now, f).expect("a live queue handle has a device context");
        // A state change may leave work (flushes, a first send after connect): look at it.
        dev.list(self.shared.qpn);
        drop(dev);
        self.nic.after_control();
        r
    }
}

impl Queue for SimQueue {
    fn qpn(&self) -> u32 {
        self.shared.qpn
    }

    fn info(&self) -> QueueInfo {
        let (gid, lid) = SimNic { nic: self.nic.clone(), owner: self._owner.clone() }.endpoint();
        let mut info = QueueInfo::new(gid, self.shared.qpn, self.shared.psn.load(Ordering::Relaxed));
        info.lid = lid;
        info.responder_resources =
            Some(self.shared.config.max_dest_rd_atomic.min(self.nic.caps.max_dest_rd_atomic));
        info.requester_depth = Some(self.shared.config.max_rd_atomic.min(self.nic.caps.max_rd_atomic));
        info
    }

    fn state(&self) -> QueueState {
        self.shared.state()
    }

    fn connect(&mut self, peer: &QueueInfo) -> Result<()> {
        if self.datagram {
            return Err(invalid(
                "a datagram queue connects to no one: activate it, and add_dest its targets",
            ));
        }
        if self.shared.state() != QueueState::Reset {
            return Err(Error::BadState { state: self.shared.state(), op: "connect", needs: "RESET" });
        }
        self.nic.check_alive()?;
        let (wire, id) = self.nic.link(self.shared.qpn, peer).map_err(invalid)?;
        self.control(|qp, _| match qp.state {
            QueueState::Reset => {
                qp.connect(peer, wire, id);
                Ok(())
            }
            state => Err(Error::BadState { state, op: "connect", needs: "RESET" }),
        })
    }

    fn set_error(&mut self) -> Result<()> {
        self.control(|qp, ctx| qp.enter_error(ctx));
        Ok(())
    }

    fn reset(&mut self) -> Result<()> {
        let psn = self.nic.fabric.next_psn();
        self.control(|qp, ctx| {
            if qp.state != QueueState::Reset {
                // Flush what is outstanding so every ring slot comes back through the CQ, then
                // start a new epoch: those flush CQEs (and any of the old life not yet polled)
                // are dropped by the poller, never delivered.
                qp.enter_error(ctx);
                qp.flush_posted();
                qp.shared.epoch.fetch_add(1, Ordering::AcqRel);
                qp.reset(psn);
            }
        });
        Ok(())
    }

    fn post_send(&mut self, wrs: &[SendWr<'_>]) -> Result<()> {
        if self.datagram {
            return Err(invalid(
                "a datagram queue's sends name their destination: post them with post_datagrams",
            ));
        }
        self.post_send_to(wrs, None)
    }

    fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> Result<()> {
        self.post_recv_inner(wrs)
    }
}

impl SimQueue {
    /// The sends of a connected queue, or (`dests` given, one per work request) the datagrams
    /// of a datagram queue.
    fn post_send_to(&mut self, wrs: &[SendWr<'_>], dests: Option<&[Dest]>) -> Result<()> {
        self.need_connected("post_send")?;
        let cfg = &self.shared.config;
        let atomics = self.nic.caps.atomics;
        let mut inline = false;
        for wr in wrs {
            inline |= wr.flags.contains(WrFlags::INLINE);
            bypass_hal::check_send_wr(wr, cfg.max_inline, cfg.max_send_sge, atomics)?;
        }
        let sq = &self.shared.sq;
        if !has_room(sq, self.sq_pi, &self.shared.sq_ci, wrs.len(), "send")? {
            return Ok(());
        }
        // INLINE payloads are copied by the CPU at post time; the sim resolves their SGEs through
        // the key table so a bad address is an error, not a wild read. All are checked before
        // any WQE is written, so a refused batch leaves nothing behind.
        let dev = if inline { Some(sync::lock(&self.nic.dev)) } else { None };
        if let Some(dev) = &dev {
            let bad = wrs
                .iter()
                .filter(|w| w.flags.contains(WrFlags::INLINE))
                .flat_map(|w| w.sges)
                .any(|s| dev.keys.resolve(s.lkey, s.addr, u64::from(s.len), Access::empty()).is_err());
            if bad {
                return Err(invalid("an INLINE SGE does not lie in a registered region of this NIC"));
            }
        }
        let stride = sq.stride();
        for (i, wr) in wrs.iter().enumerate() {
            let (op, imm, raddr, operands) = match wr.op {
                SendOp::Send => (WqeOp::Send, 0, Default::default(), None),
                SendOp::SendImm(i) => (WqeOp::SendImm, i, Default::default(), None),
                SendOp::Write(r) => (WqeOp::Write, 0, r, None),
                SendOp::WriteImm(r, i) => (WqeOp::WriteImm, i, r, None),
                SendOp::Read(r) => (WqeOp::Read, 0, r, None),
                SendOp::CompareSwap { remote, compare, swap } => {
                    (WqeOp::CompareSwap, 0, remote, Some([swap, compare]))
                }
                SendOp::FetchAdd { remote, add } => (WqeOp::FetchAdd, 0, remote, Some([add, 0])),
            };
            let ah = dests.and_then(|d| d.get(i)).map(|d| d.ah);
            let idx = self.sq_pi;
            let buf = &mut self.wqe[..stride];
            if wr.flags.contains(WrFlags::INLINE) {
                let keys = &dev.as_ref().expect("locked for INLINE").keys;
                let mut bad = false;
                let mut fill = |dst: &mut [u8]| -> u32 {
                    let mut pos = 0usize;
                    for s in wr.sges {
                        match keys.resolve(s.lkey, s.addr, u64::from(s.len), Access::empty()) {
                            Ok(p) => {
                                // SAFETY: the key table vouches for `s.len` bytes at `p` in a live
                                // registration; `dst` is our private WQE buffer.
                                unsafe {
                                    std::ptr::copy_nonoverlapping(p, dst[pos..].as_mut_ptr(), s.len as usize)
                                };
                                pos += s.len as usize;
                            }
                            Err(_) => bad = true,
                        }
                    }
                    pos as u32
                };
                layout::encode_wqe(
                    buf,
                    op,
                    wr.flags,
                    sq.owner(idx),
                    imm,
                    raddr.addr,
                    raddr.key.rkey(),
                    idx,
                    &[],
                    Some(&mut fill),
                );
            } else {
                layout::encode_wqe(
                    buf,
                    op,
                    wr.flags,
                    sq.owner(idx),
                    imm,
                    raddr.addr,
                    raddr.key.rkey(),
                    idx,
                    wr.sges,
                    None,
                );
                if let Some(operands) = operands {
                    layout::encode_atomic(buf, operands);
                }
            }
            if let Some(ah) = ah {
                // A datagram WQE names its destination (bytes 28..32, `layout`).
                self.wqe[28..32].copy_from_slice(&ah.to_le_bytes());
            }
            // SAFETY: we are the only poster (`&mut self`) and slot `idx` is free (checked above
            // against the consumer index the poller publishes).
            unsafe {
                self.shared.sq_ids.set(idx, wr.wr_id);
                sq.write(idx, &self.wqe[..used_blocks(wr.flags, wr.sges)]);
            }
            self.sq_pi = idx.wrapping_add(1);
        }
        drop(dev);
        if trace::is_enabled() {
            self.trace_doorbell("doorbell sq", self.sq_pi, wrs.len());
        }
        sq.ring_doorbell(self.sq_pi);
        self.nic.bells.ring(self.shared.qpn);
        self.nic.kick();
        Ok(())
    }

    fn post_recv_inner(&mut self, wrs: &[RecvWr<'_>]) -> Result<()> {
        if self.shared.srq.is_some() {
            return Err(invalid(
                "this queue takes its receives from a shared receive queue: post them to the SharedRecv",
            ));
        }
        self.need_connected("post_recv")?;
        let sh = &self.shared;
        if !write_recvs(
            &sh.rq,
            &sh.rq_ids,
            &sh.rq_ci,
            &mut self.rq_pi,
            &mut self.wqe,
            sh.config.max_recv_sge,
            wrs,
        )? {
            return Ok(());
        }
        if trace::is_enabled() {
            self.trace_doorbell("doorbell rq", self.rq_pi, wrs.len());
        }
        self.shared.rq.ring_doorbell(self.rq_pi);
        self.nic.bells.ring(self.shared.qpn);
        self.nic.on_recv_doorbell(self.shared.state() == QueueState::Ready);
        Ok(())
    }
}

/// Writes receive WQEs for `wrs` into `ring` from producer index `*pi` on (advancing it) and
/// their `wr_id`s into `ids`, all or nothing: more SGEs than `max_sge` is `InvalidArgument`, too
/// little room (against the consumer index `ci`) `WouldBlock`. Returns false for an empty batch.
/// The caller rings the doorbell. The caller must be the ring's only producer (`&mut` of the
/// handle that owns `pi`).
pub(crate) fn write_recvs(
    ring: &WorkRing,
    ids: &SideTable,
    ci: &AtomicU32,
    pi: &mut u32,
    wqe: &mut [u8],
    max_sge: u32,
    wrs: &[RecvWr<'_>],
) -> Result<bool> {
    if let Some(wr) = wrs.iter().find(|w| w.sges.len() > max_sge as usize) {
        return Err(invalid(format!("{} SGEs exceed the queue's max_recv_sge {max_sge}", wr.sges.len())));
    }
    if !has_room(ring, *pi, ci, wrs.len(), "receive")? {
        return Ok(false);
    }
    let stride = ring.stride();
    for wr in wrs {
        let idx = *pi;
        let buf = &mut wqe[..stride];
        layout::encode_wqe(buf, WqeOp::Recv, WrFlags::SIGNALED, ring.owner(idx), 0, 0, 0, idx, wr.sges, None);
        // SAFETY: the caller is the only poster and slot `idx` is free (checked above against
        // the consumer index the poller, or for a shared ring the device, publishes).
        unsafe {
            ids.set(idx, wr.wr_id);
            ring.write(idx, &wqe[..used_blocks(WrFlags::empty(), wr.sges)]);
        }
        *pi = idx.wrapping_add(1);
    }
    Ok(true)
}

impl Drop for SimQueue {
    fn drop(&mut self) {
        let qp = {
            let mut dev = sync::lock(&self.nic.dev);
            self.nic.send_held_acks_locked(&mut dev);
            dev.remove(self.shared.qpn)
        };
        self.nic.after_control();
        // The CQs forget the queue (their pollers drop its CQEs still in the ring, as verbs
        // does), so its number can name a later queue there.
        if let Some(qp) = qp {
            for cq in [&qp.send_cq, &qp.recv_cq] {
                let mut list = sync::lock(&cq.attach);
                list.remove_if(crate::device::slot_of(self.shared.qpn), |q| Arc::ptr_eq(q, &self.shared));
                cq.attach_pending.store(true, Ordering::Release);
            }
        }
        // After the device dropped the queue: it takes no more receives from the shared queue.
        if let Some(srq) = &self.shared.srq {
            srq.users.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// A queue's transport service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Service {
    /// Reliable connected (RC).
    Connected,
    /// Unreliable datagram (UM, UD).
    Datagram,
    /// Reliable datagram (RM).
    ReliableDatagram,
}
