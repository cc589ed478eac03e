//! [`Either`]: one `bypass_hal::Device` type over two devices of different types, so the
//! conformance suites — whose environments hand out one device type for both ends — run with
//! one end on each: the simulator's transport on the VFIO NIC against Soft-RoCE
//! (`tests/vfio_suites.rs`), or two differently configured simulated NICs on the host
//! (`tests/either_sim.rs`).
//!
//! `Either<L, R>` is also every object such a device makes: its regions, completion queues,
//! queues, shared receive queues and event channels are `Either`s of the two devices' own, and
//! every call goes straight to the one inside (one `match`, no allocation, no lock). Objects of
//! one side given to a device of the other (a CQ of device L for a queue of device R) are refused
//! with [`Error::InvalidArgument`]: each device only knows its own.
//!
//! [`EitherEnv`] is the environment of both suites: `bypass_hal::conformance::Env` (A and B)
//! and `bypass::conformance::Env` (server and client), the first end on one device and the
//! second on the other, in either order.

use bypass_hal::{
    Access, AckTimeout, ArmMode, AsyncEvent, Completion, CompletionQueue, Device, DeviceCaps, Error,
    EventChannel, MemoryRegion, Queue, QueueConfig, QueueInfo, QueueState, RecvWr, RemoteKey, Result, SendWr,
    SharedRecv,
};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, RawFd};
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

/// The exponent of the smallest ACK timeout a queue made through an `Either` device gets (0:
/// no floor). See [`set_min_ack_timeout`].
static MIN_ACK_TIMEOUT: AtomicU8 = AtomicU8::new(0);

/// Gives every queue made through an `Either` device from now on a retransmission timeout of at
/// least `t` (a queue asked with no timer, [`AckTimeout::NONE`], keeps none); `AckTimeout::NONE`
/// removes the floor. For environments where one end is software on a starved emulated CPU, for
/// longer than the other end's fixed `retry_count` timeouts (rxe, like IB, does not back off):
/// scenarios whose own configuration cannot be reached (the RPC suite's rig) then still get the
/// timeout such a host needs. Process-wide: the suites run one test at a time.
pub fn set_min_ack_timeout(t: AckTimeout) {
    MIN_ACK_TIMEOUT.store(t.exponent(), Ordering::Relaxed);
}

/// `config` with its timeout raised to the floor (an exponent), if it has a timer below it.
fn floored(config: &QueueConfig, floor: u8) -> QueueConfig {
    let t = config.timeout.exponent();
    match AckTimeout::from_exponent(floor) {
        Some(f) if t != 0 && t < floor => {
            let mut c = *config;
            c.timeout = f;
            c
        }
        _ => *config,
    }
}

/// A device (or a device's object) of type `L` or of type `R` (see the module docs).
#[derive(Debug, Clone)]
pub enum Either<L, R> {
    /// The first type's.
    Left(L),
    /// The second type's.
    Right(R),
}

/// Calls the same method on whichever side `$e` holds.
macro_rules! both {
    ($e:expr, $x:ident => $body:expr) => {
        match $e {
            Either::Left($x) => $body,
            Either::Right($x) => $body,
        }
    };
}

/// Wraps the result of a call on one side into the same side of `Either`.
macro_rules! wrap {
    ($e:expr, $x:ident => $body:expr) => {
        match $e {
            Either::Left($x) => $body.map(Either::Left),
            Either::Right($x) => $body.map(Either::Right),
        }
    };
}

fn mismatch(what: &str) -> Error {
    Error::InvalidArgument(format!(
        "{what} belongs to the other device of this Either: each device takes only its own objects"
    ))
}

impl<L, R> Either<L, R> {
    /// True for the first type's.
    pub fn is_left(&self) -> bool {
        matches!(self, Either::Left(_))
    }
}

impl<L: MemoryRegion, R: MemoryRegion> MemoryRegion for Either<L, R> {
    fn len(&self) -> usize {
        both!(self, x => x.len())
    }
    fn addr(&self) -> u64 {
        both!(self, x => x.addr())
    }
    fn lkey(&self) -> u32 {
        both!(self, x => x.lkey())
    }
    fn remote_key(&self) -> RemoteKey {
        both!(self, x => x.remote_key())
    }
    fn access(&self) -> Access {
        both!(self, x => x.access())
    }
    fn as_ptr(&self) -> *mut u8 {
        both!(self, x => x.as_ptr())
    }
    fn read(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        both!(self, x => x.read(offset, dst))
    }
    fn write(&mut self, offset: usize, src: &[u8]) -> Result<()> {
        both!(self, x => x.write(offset, src))
    }
    unsafe fn write_shared(&self, offset: usize, src: &[u8]) -> Result<()> {
        // SAFETY: the caller upholds `write_shared`'s contract for this region, which is the one
        // inside.
        both!(self, x => unsafe { x.write_shared(offset, src) })
    }
}

impl<L: CompletionQueue, R: CompletionQueue> CompletionQueue for Either<L, R> {
    fn depth(&self) -> u32 {
        both!(self, x => x.depth())
    }
    fn id(&self) -> u64 {
        both!(self, x => x.id())
    }
    fn poll(&mut self, out: &mut [Completion]) -> Result<usize> {
        both!(self, x => x.poll(out))
    }
    fn poll_uninit<'a>(&mut self, out: &'a mut [MaybeUninit<Completion>]) -> Result<&'a [Completion]> {
        both!(self, x => x.poll_uninit(out))
    }
    fn arm(&mut self, mode: ArmMode) -> Result<()> {
        both!(self, x => x.arm(mode))
    }
    fn event_fd(&self) -> RawFd {
        both!(self, x => x.event_fd())
    }
    fn ack_events(&mut self) -> Result<u64> {
        both!(self, x => x.ack_events())
    }
}

impl<L: Queue, R: Queue> Queue for Either<L, R> {
    fn qpn(&self) -> u32 {
        both!(self, x => x.qpn())
    }
    fn info(&self) -> QueueInfo {
        both!(self, x => x.info())
    }
    fn state(&self) -> QueueState {
        both!(self, x => x.state())
    }
    fn connect(&mut self, peer: &QueueInfo) -> Result<()> {
        both!(self, x => x.connect(peer))
    }
    fn set_error(&mut self) -> Result<()> {
        both!(self, x => x.set_error())
    }
    fn reset(&mut self) -> Result<()> {
        both!(self, x => x.reset())
    }
    fn post_send(&mut self, wrs: &[SendWr<'_>]) -> Result<()> {
        both!(self, x => x.post_send(wrs))
    }
    fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> Result<()> {
        both!(self, x => x.post_recv(wrs))
    }
}

impl<L: SharedRecv, R: SharedRecv> SharedRecv for Either<L, R> {
    fn depth(&self) -> u32 {
        both!(self, x => x.depth())
    }
    fn max_sge(&self) -> u32 {
        both!(self, x => x.max_sge())
    }
    fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> Result<()> {
        both!(self, x => x.post_recv(wrs))
    }
    fn destroy(self) -> Result<(), (Self, Error)> {
        match self {
            Either::Left(x) => x.destroy().map_err(|(x, e)| (Either::Left(x), e)),
            Either::Right(x) => x.destroy().map_err(|(x, e)| (Either::Right(x), e)),
        }
    }
}

impl<L: AsFd, R: AsFd> AsFd for Either<L, R> {
    fn as_fd(&self) -> BorrowedFd<'_> {
        both!(self, x => x.as_fd())
    }
}

impl<L: EventChannel, R: EventChannel> EventChannel for Either<L, R> {
    fn take_events(&self, out: &mut [u64]) -> Result<usize> {
        both!(self, x => x.take_events(out))
    }
}

impl<L: Device, R: Device> Device for Either<L, R> {
    type Region = Either<L::Region, R::Region>;
    type Cq = Either<L::Cq, R::Cq>;
    type Queue = Either<L::Queue, R::Queue>;
    type SharedRecv = Either<L::SharedRecv, R::SharedRecv>;
    type Channel = Either<L::Channel, R::Channel>;

    fn caps(&self) -> DeviceCaps {
        both!(self, x => x.caps())
    }

    fn register(&self, len: usize, access: Access) -> Result<Self::Region> {
        wrap!(self, x => x.register(len, access))
    }

    unsafe fn register_external(&self, ptr: *mut u8, len: usize, access: Access) -> Result<Self::Region> {
        // SAFETY: the caller upholds `register_external`'s contract for the device inside.
        wrap!(self, x => unsafe { x.register_external(ptr, len, access) })
    }

    fn create_cq(&self, depth: u32) -> Result<Self::Cq> {
        wrap!(self, x => x.create_cq(depth))
    }

    fn create_channel(&self) -> Result<Self::Channel> {
        wrap!(self, x => x.create_channel())
    }

    fn create_cq_on(&self, depth: u32, channel: &Self::Channel) -> Result<Self::Cq> {
        match (self, channel) {
            (Either::Left(d), Either::Left(c)) => d.create_cq_on(depth, c).map(Either::Left),
            (Either::Right(d), Either::Right(c)) => d.create_cq_on(depth, c).map(Either::Right),
            _ => Err(mismatch("the event channel")),
        }
    }

    fn create_queue(
        &self,
        config: &QueueConfig,
        send_cq: &Self::Cq,
        recv_cq: &Self::Cq,
    ) -> Result<Self::Queue> {
        let config = &floored(config, MIN_ACK_TIMEOUT.load(Ordering::Relaxed));
        match (self, send_cq, recv_cq) {
            (Either::Left(d), Either::Left(s), Either::Left(r)) => {
                d.create_queue(config, s, r).map(Either::Left)
            }
            (Either::Right(d), Either::Right(s), Either::Right(r)) => {
                d.create_queue(config, s, r).map(Either::Right)
            }
            _ => Err(mismatch("a completion queue")),
        }
    }

    fn create_shared_recv(&self, depth: u32, max_sge: u32) -> Result<Self::SharedRecv> {
        wrap!(self, x => x.create_shared_recv(depth, max_sge))
    }

    fn create_queue_on_shared(
        &self,
        config: &QueueConfig,
        send_cq: &Self::Cq,
        recv_cq: &Self::Cq,
        shared: &Self::SharedRecv,
    ) -> Result<Self::Queue> {
        let config = &floored(config, MIN_ACK_TIMEOUT.load(Ordering::Relaxed));
        match (self, send_cq, recv_cq, shared) {
            (Either::Left(d), Either::Left(s), Either::Left(r), Either::Left(sh)) => {
                d.create_queue_on_shared(config, s, r, sh).map(Either::Left)
            }
            (Either::Right(d), Either::Right(s), Either::Right(r), Either::Right(sh)) => {
                d.create_queue_on_shared(config, s, r, sh).map(Either::Right)
            }
            _ => Err(mismatch("a completion queue or the shared receive queue")),
        }
    }

    fn async_event_fd(&self) -> Option<BorrowedFd<'_>> {
        both!(self, x => x.async_event_fd())
    }

    fn poll_async_event(&self) -> Result<Option<AsyncEvent>> {
        both!(self, x => x.poll_async_event())
    }

    fn progress(&self) {
        both!(self, x => x.progress())
    }

    fn externally_stepped(&self) -> bool {
        both!(self, x => x.externally_stepped())
    }

    fn now(&self) -> Duration {
        both!(self, x => x.now())
    }
}

/// The two suites' environment over an [`Either`] device: the first end (hal: A, the requester;
/// RPC: the server) on one device, the second (B, the responder; the client) on the other.
/// Both devices must move on real time (the simulator's Inline or Threaded engine, hardware):
/// `progress` lets each device progress ([`Device::progress`]; the Inline engine runs there),
/// `advance` sleeps.
#[derive(Debug)]
pub struct EitherEnv<L, R> {
    first: Either<L, R>,
    second: Either<L, R>,
    arm_signals: bool,
    lossy: bool,
}

impl<L: Device, R: Device> EitherEnv<L, R> {
    /// The first end on `l`, the second on `r`.
    pub fn left_first(l: L, r: R) -> Self {
        EitherEnv { first: Either::Left(l), second: Either::Right(r), arm_signals: false, lossy: false }
    }

    /// The first end on `r`, the second on `l`.
    pub fn right_first(l: L, r: R) -> Self {
        EitherEnv { first: Either::Right(r), second: Either::Left(l), arm_signals: false, lossy: false }
    }

    /// Says that the second end's device raises a CQ event when a CQ holding an unpolled
    /// completion is armed (the simulator; not rxe): see
    /// `bypass_hal::conformance::Env::arm_signals_queued_completions`, which only the second
    /// end's CQs are asked about. Off by default (the suite then accepts either behaviour).
    pub fn second_arms_against_consumer_index(mut self, yes: bool) -> Self {
        self.arm_signals = yes;
        self
    }

    /// Says that the link between the ends may lose packets (netem on it): see
    /// `bypass_hal::conformance::Env::loses_packets`. Off by default.
    pub fn loses_packets(mut self, yes: bool) -> Self {
        self.lossy = yes;
        self
    }

    /// The first end's device.
    pub fn first(&self) -> &Either<L, R> {
        &self.first
    }

    /// The second end's device.
    pub fn second(&self) -> &Either<L, R> {
        &self.second
    }

    fn progress_both(&self) {
        self.first.progress();
        self.second.progress();
        std::thread::yield_now();
    }
}

impl<L: Device, R: Device> bypass_hal::conformance::Env for EitherEnv<L, R> {
    type Dev = Either<L, R>;
    fn a(&self) -> &Self::Dev {
        &self.first
    }
    fn b(&self) -> &Self::Dev {
        &self.second
    }
    fn progress(&self) {
        self.progress_both();
    }
    fn advance(&self, d: Duration) {
        std::thread::sleep(d);
    }
    fn arm_signals_queued_completions(&self) -> bool {
        self.arm_signals
    }
    fn loses_packets(&self) -> bool {
        self.lossy
    }
}

impl<L: Device + Clone, R: Device + Clone> bypass::conformance::Env for EitherEnv<L, R> {
    type Dev = Either<L, R>;
    fn server(&self) -> &Self::Dev {
        &self.first
    }
    fn client(&self) -> &Self::Dev {
        &self.second
    }
    fn progress(&self) {
        self.progress_both();
    }
    fn advance(&self, d: Duration) {
        std::thread::sleep(d);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_timeout_floor_raises_short_timers_only() {
        let with = |t: u8| {
            let mut c = QueueConfig::default();
            c.timeout = AckTimeout::from_exponent(t).unwrap();
            c
        };
        assert_eq!(floored(&with(14), 17).timeout.exponent(), 17, "raised to the floor");
        assert_eq!(floored(&with(19), 17).timeout.exponent(), 19, "a longer timer stays");
        assert_eq!(floored(&with(0), 17).timeout, AckTimeout::NONE, "no timer stays none");
        assert_eq!(floored(&with(14), 0).timeout.exponent(), 14, "no floor");
        let c = with(14);
        let mut f = floored(&c, 17);
        f.timeout = c.timeout;
        assert_eq!(f, c, "nothing else changes");
    }
}
