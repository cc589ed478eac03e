//! # bypass-sim: a software NIC
//!
//! A simulated RDMA-style NIC that implements [`bypass_hal`], split the way hardware is:
//!
//! - the **driver** ([`SimNic`], [`SimRegion`], [`SimCq`], [`SimQueue`]) writes 64-byte-block
//!   WQEs into send and receive rings, fences, and rings a doorbell with the producer index; it
//!   polls 64-byte CQEs by owner bit and maps ring slots back to `wr_id`s with side tables;
//! - the **device** fetches WQEs, checks keys, bounds and access rights, moves data, runs a
//!   reliable-connected transport (PSNs, ACK/NAK, go-back-N retransmission on a timer, RNR NAK and
//!   retry with 7 = forever, retry exhaustion → error completion and queue ERROR) and writes CQEs;
//! - a **wire** ([`wire::Wire`]) carries packets between NICs: the in-process wire, optionally
//!   behind a seeded fault wire that drops, duplicates and reorders ([`FaultPlan`]), and behind a
//!   capture wire when `BYPASS_PCAP=<file>` is set ([`pcap`]); or a byte wire to other processes
//!   and hosts (UDP, shared memory, an Ethernet port: [`WireConfig`], [`l2`]), which a NIC reaches
//!   through its wire port,
//!   the one seam for a wire's addressing, connecting and receiving (`wire.rs`, `wires.rs`).
//!   [`roce`] is the RoCEv2 byte encoding of packets (BTH, RETH, AETH, ImmDt, ICRC) that
//!   captures and byte wires use.
//!
//! The [`Engine`] decides who runs the device: the application's own threads on doorbells and
//! polls (`Inline`), a device thread per NIC (`Threaded`), or a test, one seeded-random unit at a
//! time under a virtual clock (`Stepped`). `docs/sim.md` describes the device model for hardware engineers.
//!
//! ```
//! use bypass_hal::*;
//! use bypass_sim::{Engine, Fabric};
//!
//! let fabric = Fabric::new(Engine::Inline);
//! let (nic_a, nic_b) = (fabric.add_nic(), fabric.add_nic());
//! let cfg = QueueConfig::default();
//! let (mut cq_a, mut cq_b) = (nic_a.create_cq(256).unwrap(), nic_b.create_cq(256).unwrap());
//! let mut qa = nic_a.create_queue(&cfg, &cq_a, &cq_a).unwrap();
//! let mut qb = nic_b.create_queue(&cfg, &cq_b, &cq_b).unwrap();
//! let (ia, ib) = (qa.info(), qb.info());
//! qa.connect(&ib).unwrap();
//! qb.connect(&ia).unwrap();
//!
//! let mut src = nic_a.register(64, Access::empty()).unwrap();
//! let dst = nic_b.register(64, Access::LOCAL_WRITE).unwrap();
//! src.write(0, b"hello, NIC").unwrap();
//! qb.post_recv(&[RecvWr { wr_id: 7, sges: &[dst.sge(0, 64).unwrap()] }]).unwrap();
//! qa.post_send(&[SendWr::send(1, &[src.sge(0, 10).unwrap()])]).unwrap();
//!
//! let mut wc = [Completion::default(); 4];
//! assert_eq!(cq_b.poll(&mut wc).unwrap(), 1);
//! assert_eq!((wc[0].wr_id, wc[0].byte_len, wc[0].status), (7, 10, Status::Success));
//! let mut got = [0u8; 10];
//! dst.read(0, &mut got).unwrap();
//! assert_eq!(&got, b"hello, NIC");
//! ```

mod attach;
mod clock;
mod device;
mod driver;
mod engine;
mod eventfd;
mod events;
mod fabric;
mod fault;
mod handoff;
mod inbox;
mod inproc;
pub mod l2;
pub mod layout;
mod nic;
pub mod packet;
pub mod pcap;
mod ring;
pub mod roce;
mod shared;
mod shared_recv;
mod shm;
mod source;
mod sync;
mod udp;
mod wake;
pub mod wire;
mod wires;

/// loom only: the ring code of the driver and the device, for the models in `loom-tests/` (built
/// with `RUSTFLAGS="--cfg loom"`). Thin wrappers over crate-internal types, not an API: each method
/// is one step the real driver or device takes, forwarded to the code that takes it.
#[cfg(loom)]
#[doc(hidden)]
pub mod loom_api {
    use crate::eventfd::EventFd;
    use crate::layout::{self, Cqe, Wqe, WqeFault};
    use crate::ring::{CqRing, WorkRing};
    use crate::shared::{armed, state_to_u8, CqShared, QueueShared, SideTable};
    use crate::sync::{AtomicBool, AtomicU32, AtomicU8, Mutex, Ordering};
    use bypass_hal::{QueueConfig, QueueState, Sge};
    use std::sync::Arc;

    pub use crate::sync::mutation;

    /// The UDP wire's receive handoff (`sim/src/handoff.rs`): reads asked for by polls and the
    /// receive thread, done by the device; the receive thread's tick against a user arming a CQ.
    #[derive(Debug, Default)]
    pub struct UdpHandoff(crate::handoff::RxHandoff);

    impl UdpHandoff {
        /// A poll, or the receive thread on an arrival, asks for a read.
        pub fn ask(&self) {
            self.0.ask()
        }

        /// A read is asked for and not done.
        pub fn pending(&self) -> bool {
            self.0.pending()
        }

        /// The device reads: `read` returns true if it found the socket empty.
        pub fn read(&self, read: impl FnOnce() -> bool) {
            self.0.read(|| (read(), ()))
        }

        /// The receive thread is about to tick without watching the socket; `armed` loads the
        /// NIC's armed count. True if it may.
        pub fn may_tick(&self, armed: impl FnOnce() -> bool) -> bool {
            self.0.may_tick(armed)
        }

        /// The tick is over.
        pub fn end_tick(&self) {
            self.0.end_tick()
        }

        /// A CQ was armed: true if the thread must be rung.
        pub fn attention(&self) -> bool {
            self.0.attention()
        }
    }

    /// The shared-memory wire's ring and doorbell protocol (`RingCtl`, `Bell`, `push`, `pop`,
    /// `wake_needed`, `prepare_sleep`, ...), over loom atomics.
    pub use crate::shm::ring as shm_ring;

    /// A NIC's inbox (`sim/src/inbox.rs`): senders push, the device (one consumer) takes.
    #[derive(Debug)]
    pub struct Inbox(crate::inbox::Inbox);

    impl Inbox {
        /// `depth` slots of `mtu` bytes.
        pub fn new(depth: usize, mtu: usize) -> Self {
            Inbox(crate::inbox::Inbox::new(depth, mtu))
        }

        /// A sender (NIC `src_nic`) offers a packet with this PSN and payload; false if full
        /// (then, if `wait`, the sender is registered to be kicked).
        pub fn push(&self, src_nic: u32, psn: u32, payload: &[u8], wait: bool) -> bool {
            let hdr = crate::packet::PacketHeader {
                src_nic,
                psn,
                payload_len: payload.len() as u32,
                ..Default::default()
            };
            self.0.push(&hdr, &mut |b: &mut [u8]| b.copy_from_slice(payload), wait)
        }

        /// The device takes the oldest packet: `(src_nic, psn, payload)`; the senders it kicks
        /// (they waited for room) are appended to `kicked`.
        ///
        /// # Safety
        /// One consumer at a time (in the sim: the device lock's holder).
        pub unsafe fn take(&self, kicked: &mut Vec<u32>) -> Option<(u32, u32, Vec<u8>)> {
            // SAFETY: the caller is the only consumer.
            let got = unsafe {
                self.0.with_front(|h, p, _| (h.src_nic, h.psn, p.map(|p| p.to_vec()).unwrap_or_default()))
            }?;
            // SAFETY: as above; a packet is at the head.
            unsafe { self.0.pop(&mut |w| kicked.push(w)) };
            Some(got)
        }
    }

    /// A registration's bytes and liveness, for by-reference packets (`Inbox::push_ref`).
    #[derive(Debug)]
    pub struct RefSource {
        bytes: Box<[u8]>,
        life: std::sync::Arc<crate::source::Life>,
    }

    impl RefSource {
        /// `bytes`, alive.
        pub fn new(bytes: &[u8]) -> Self {
            RefSource { bytes: bytes.into(), life: Default::default() }
        }
    }

    impl Inbox {
        /// A sender offers a packet whose payload stays in `src` (bytes `at..at + len`), as a
        /// READ response of the in-process wire: the `psn`-th segment of one READ, `first` and
        /// `last` as on the wire; false if full (then, if `wait`, the sender is registered).
        #[allow(clippy::too_many_arguments)]
        pub fn push_ref(
            &self,
            src_nic: u32,
            psn: u32,
            first: bool,
            last: bool,
            src: &RefSource,
            at: usize,
            len: usize,
            wait: bool,
        ) -> bool {
            let hdr = crate::packet::PacketHeader {
                src_nic,
                psn,
                first,
                last,
                kind: crate::packet::PacketKind::ReadResponse,
                payload_len: len as u32,
                ..Default::default()
            };
            assert!(at + len <= src.bytes.len());
            // SAFETY: `len` bytes at `at` lie in `src.bytes`, which `src.life` guards and which
            // the model keeps alive (never frees) until every packet was taken.
            let r = unsafe { crate::source::PayloadRef::new(src.bytes.as_ptr().add(at), len, &src.life) };
            self.0.push_ref(&hdr, &r, wait)
        }

        /// The device takes the run at the head (`Inbox::with_front_run`, at most `max` packets,
        /// joined as READ responses of one READ: the next PSN, no LAST before the end, no FIRST
        /// after the start): `(src_nic, psn)` of each and the run's payload; pops all of it.
        ///
        /// # Safety
        /// One consumer at a time.
        pub unsafe fn take_run(
            &self,
            max: usize,
            kicked: &mut Vec<u32>,
        ) -> Option<(Vec<(u32, u32)>, Vec<u8>)> {
            let joins = |p: &crate::packet::PacketHeader, n: &crate::packet::PacketHeader| {
                p.src_nic == n.src_nic && n.psn == p.psn.wrapping_add(1) && !p.last && !n.first
            };
            // SAFETY: the caller is the only consumer.
            let (first, n, bytes) = unsafe {
                self.0.with_front_run(max, joins, |h, _, n, p, _| {
                    (*h, n, p.map(|p| p.to_vec()).unwrap_or_default())
                })
            }?;
            let ids = (0..n as u32).map(|k| (first.src_nic, first.psn.wrapping_add(k))).collect();
            for _ in 0..n {
                // SAFETY: as above; `with_front_run` found `n` packets from the head.
                unsafe { self.0.pop(&mut |w| kicked.push(w)) };
            }
            Some((ids, bytes))
        }
    }

    /// The liveness of a registration's memory (`sim/src/source.rs`): a peer's device copying a
    /// by-reference payload `enter`s and `exit`s; deregistration `kill`s it before freeing.
    #[derive(Debug, Default)]
    pub struct RegionLife(crate::source::Life);

    impl RegionLife {
        /// A live registration with no reader.
        pub fn new() -> Self {
            RegionLife(crate::source::Life::new())
        }

        /// A reader starts a copy: true if the memory is alive (it stays so until `exit`).
        pub fn enter(&self) -> bool {
            self.0.enter()
        }

        /// The reader that entered is done.
        pub fn exit(&self) {
            self.0.exit()
        }

        /// Deregistration: no reader enters from now on; returns once the readers in have left.
        pub fn kill(&self) {
            self.0.kill()
        }
    }

    /// A READY queue's send side as the driver and the device share it (`QueueShared`): the send
    /// ring with its doorbell, the `wr_id` side table, and the consumer index the poller publishes.
    #[derive(Debug)]
    pub struct SendQueue(QueueShared);

    impl SendQueue {
        /// A send ring of `depth` (a power of two) WQEs, strided for `max_send_sge` SGEs, as
        /// `SimNic::create_queue` builds it.
        pub fn new(depth: u32, max_send_sge: u32) -> Self {
            let config = {
                let mut c = QueueConfig::default();
                c.send_depth = depth;
                c.recv_depth = 1;
                c.max_send_sge = max_send_sge;
                c.max_recv_sge = 1;
                c.max_inline = 0;
                c
            };
            SendQueue(QueueShared {
                nic: 0,
                qpn: 0,
                config,
                sq: WorkRing::new(depth, layout::wqe_stride(max_send_sge, 0)),
                rq: WorkRing::new(1, layout::wqe_stride(1, 0)),
                sq_ids: SideTable::new(depth),
                rq_ids: SideTable::new(1),
                sq_ci: AtomicU32::new(0),
                rq_ci: AtomicU32::new(0),
                state: AtomicU8::new(state_to_u8(QueueState::Ready)),
                psn: AtomicU32::new(0),
                epoch: AtomicU32::new(0),
                srq: None,
                first_epoch: 0,
            })
        }

        /// Number of send slots.
        pub fn depth(&self) -> u32 {
            self.0.sq.depth()
        }

        /// Bytes per WQE.
        pub fn stride(&self) -> usize {
            self.0.sq.stride()
        }

        /// Driver: the owner byte of the WQE at `index`.
        pub fn owner(&self, index: u32) -> u8 {
            self.0.sq.owner(index)
        }

        /// Driver (`post_send`): room for `wanted` WQEs at producer index `pi`?
        pub fn has_room(&self, pi: u32, wanted: usize) -> bypass_hal::Result<bool> {
            crate::driver::has_room_for_loom(&self.0.sq, pi, &self.0.sq_ci, wanted)
        }

        /// Driver (`post_send`): records `wr_id` in the side table and copies `wqe` into the slot of
        /// `index`.
        ///
        /// # Safety
        /// As for `post_send`: the caller is the only poster and `has_room` said the slot is free.
        pub unsafe fn post(&self, index: u32, wr_id: u64, wqe: &[u8]) {
            // SAFETY: forwarded contract (the same two calls as `post_send`).
            unsafe {
                self.0.sq_ids.set(index, wr_id);
                self.0.sq.write(index, wqe);
            }
        }

        /// Driver (`post_send`): rings the doorbell with producer index `pi`.
        pub fn ring_doorbell(&self, pi: u32) {
            self.0.sq.ring_doorbell(pi);
        }

        /// Driver (`poll`): the `wr_id` of the WQE at `index`.
        ///
        /// # Safety
        /// The caller is the poller and has just read the completion of `index`.
        pub unsafe fn wr_id(&self, index: u32) -> u64 {
            // SAFETY: forwarded contract.
            unsafe { self.0.sq_ids.get(index) }
        }

        /// Driver (`poll`): the completion of `index` frees every send slot up to it (the store
        /// `SimCq::poll` makes).
        pub fn completed(&self, index: u32) {
            self.0.sq_ci.store(index.wrapping_add(1), Ordering::Release);
        }

        /// Device: the producer index last rung (acquire).
        pub fn producer(&self) -> u32 {
            self.0.sq.producer()
        }

        /// Device (`send_step`): fetches and decodes the WQE at `index` (owner and index checked).
        ///
        /// # Safety
        /// `index` is below a producer index read with `producer` and not yet completed.
        pub unsafe fn fetch(&self, index: u32) -> Result<Wqe, WqeFault> {
            crate::device::qp::fetch_for_loom(&self.0.sq, index)
        }

        /// Device (validate, emit): re-reads SGE `i` of the WQE at `index` from the ring.
        ///
        /// # Safety
        /// As for [`fetch`](Self::fetch).
        pub unsafe fn sge(&self, index: u32, i: usize) -> Sge {
            // SAFETY: forwarded contract.
            unsafe { self.0.sq.sge(index, i) }
        }
    }

    /// A completion queue as the driver and the device share it (`CqShared`).
    #[derive(Debug)]
    pub struct Cq(CqShared);

    impl Cq {
        /// A CQ of `depth` (a power of two) entries, as `SimNic::create_cq` builds it.
        pub fn new(depth: u32) -> Self {
            Cq(CqShared {
                ring: CqRing::new(depth),
                pi: AtomicU32::new(0),
                armed: AtomicU8::new(armed::NO),
                event: EventFd::new().expect("eventfd"),
                overflow: AtomicBool::new(false),
                attach: Mutex::new(crate::attach::AttachTable::default()),
                attach_pending: AtomicBool::new(false),
                nic_armed: Arc::new(crate::nic::ArmedCount::default()),
                id: 0,
                channel: None,
            })
        }

        /// Number of entries.
        pub fn depth(&self) -> u32 {
            self.0.ring.depth()
        }

        /// Device: appends a CQE, or drops it and sets the overflow flag if the ring is full.
        ///
        /// # Safety
        /// The caller is the CQ's only producer (the device lock makes the device that).
        pub unsafe fn push(&self, cqe: &Cqe) {
            self.0.push(cqe);
        }

        /// Driver (`poll`): whether the device has dropped a CQE.
        pub fn overflowed(&self) -> bool {
            self.0.overflow.load(Ordering::Acquire)
        }

        /// Device, ring level: writes `cqe` at producer index `pi` unless the ring is full.
        ///
        /// # Safety
        /// The caller is the ring's only producer.
        pub unsafe fn write(&self, pi: u32, cqe: &Cqe) -> bool {
            // SAFETY: forwarded contract.
            unsafe { self.0.ring.write(pi, cqe) }
        }

        /// Driver (`poll`): the CQE at consumer index `ci`, if written (owner bit, acquire).
        ///
        /// # Safety
        /// The caller is the ring's only consumer.
        pub unsafe fn read(&self, ci: u32) -> Option<Cqe> {
            // SAFETY: forwarded contract.
            unsafe { self.0.ring.read(ci) }
        }

        /// Driver (`poll`): publishes the consumer index (the CI record).
        pub fn release(&self, ci: u32) {
            self.0.ring.release(ci);
        }
    }

    /// The Inline engine's held-ACK handshake (`sim/src/wake.rs`), on a CQ's NIC's armed count.
    impl Cq {
        /// The user arms the CQ and is about to sleep: `SimCq::arm`'s `CqShared::arm` (which
        /// raises the NIC's armed count), then `Nic::on_arm`'s `wake::arm_fence`, after which
        /// the caller looks at the NICs holding ACKs.
        pub fn arm(&self) {
            self.0.arm(armed::ANY);
            crate::wake::arm_fence();
        }

        /// Whether a plain ACK to this CQ's NIC may be held back (`Wire::holds_acks`).
        pub fn peer_may_wait(&self) -> bool {
            crate::wake::peer_may_wait(&self.0.nic_armed)
        }
    }

    /// A NIC's device lock and work flag (`Nic::dev`, `Nic::work`) around a model's own device
    /// state, run by `wake::run_flagged` as `Nic::run_inline` runs the real device.
    #[derive(Debug)]
    pub struct Device<T> {
        dev: Mutex<T>,
        work: AtomicBool,
    }

    impl<T> Device<T> {
        /// A device in `state`, no work flagged.
        pub fn new(state: T) -> Self {
            Device { dev: Mutex::new(state), work: AtomicBool::new(false) }
        }

        /// The work flag raised, then `Nic::run_inline` (`Nic::release_held_acks`): `pass` runs
        /// on this thread, or on the thread holding the device. False if this thread never got
        /// the lock.
        pub fn raise_and_run(&self, pass: impl FnMut(&mut T)) -> bool {
            self.work.store(true, Ordering::SeqCst);
            crate::wake::run_flagged(&self.dev, &self.work, pass)
        }

        /// The state, once the model's threads are joined.
        pub fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
            f(&mut crate::sync::lock(&self.dev))
        }
    }

    /// A NIC's `acks_held` flag (`Nic::acks_held`, `sim/src/wake.rs`).
    #[derive(Debug)]
    pub struct HeldAcks(AtomicU8);

    impl Default for HeldAcks {
        fn default() -> Self {
            HeldAcks(AtomicU8::new(crate::wake::HELD_NONE))
        }
    }

    impl HeldAcks {
        /// Holder (`Nic::run_all`): publishes the hold, then asks `wanted_now` (the peer's
        /// armed count read again); true: send now.
        pub fn publish_hold(&self, wanted_now: impl FnOnce() -> bool) -> bool {
            crate::wake::publish_hold(&self.0, wanted_now)
        }

        /// Holder, after sending what it held (`Nic::run_all`, `Nic::release_held_acks`).
        pub fn clear(&self) {
            self.0.store(crate::wake::HELD_NONE, Ordering::Relaxed);
        }

        /// Arming side's scan (`FabricShared::release_held_acks`): the NIC holds ACKs back.
        pub fn holds(&self) -> bool {
            crate::wake::holds_acks(&self.0)
        }
    }
}

pub use device::NicStats;
pub use driver::{Dest, SimCq, SimNic, SimQueue, SimRegion, Source};
pub use engine::Engine;
pub use events::SimChannel;
pub use fabric::{Fabric, FabricConfig, BYTE_WIRE_ACK_TIMEOUT_BACKOFF};
pub use fault::{FaultPlan, FaultStats};
pub use l2::{L2Addr, L2Attachment};
pub use shared_recv::SimSharedRecv;
pub use wires::WireConfig;
