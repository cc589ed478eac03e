//! The device: capabilities, and the factory of regions, completion queues and queues.

use crate::{
    Access, AsyncEvent, CompletionQueue, EventChannel, MemoryRegion, Queue, QueueConfig, Result, SharedRecv,
};
use std::os::fd::BorrowedFd;

/// Limits of a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeviceCaps {
    /// Most slots in a send or receive queue.
    pub max_queue_depth: u32,
    /// Most entries in a completion queue.
    pub max_cq_depth: u32,
    /// Most SGEs per send-side work request.
    pub max_send_sge: u32,
    /// Most SGEs per receive.
    pub max_recv_sge: u32,
    /// Most bytes of an INLINE work request.
    pub max_inline: u32,
    /// Largest message (SEND, WRITE or READ) in bytes.
    pub max_msg_size: u32,
    /// Largest single registration in bytes.
    pub max_region_size: u64,
    /// Most READs a queue may have outstanding as requester (verbs `max_qp_init_rd_atom`); a
    /// queue's [`QueueConfig::max_rd_atomic`] above it is clamped to it.
    pub max_rd_atomic: u8,
    /// Most READs a queue accepts in flight as responder (verbs `max_qp_rd_atom`).
    pub max_dest_rd_atomic: u8,
    /// Whether the device does atomics ([`SendOp::CompareSwap`](crate::SendOp::CompareSwap),
    /// [`SendOp::FetchAdd`](crate::SendOp::FetchAdd)) atomically with respect to other NIC
    /// operations (verbs `atomic_cap` HCA or GLOB). Posting one where this is false is
    /// `Error::Unsupported`.
    pub atomics: bool,
    /// Most shared receive queues ([`crate::SharedRecv`]) the device has (0: none; creating one
    /// is `Error::Unsupported` then).
    pub max_shared_recv: u32,
    /// Most receive slots of one shared receive queue.
    pub max_shared_recv_depth: u32,
}

impl DeviceCaps {
    /// Caps from the limits every field names; the read limits default to 16, shared receive
    /// queues to none.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        max_queue_depth: u32,
        max_cq_depth: u32,
        max_send_sge: u32,
        max_recv_sge: u32,
        max_inline: u32,
        max_msg_size: u32,
        max_region_size: u64,
    ) -> Self {
        DeviceCaps {
            max_queue_depth,
            max_cq_depth,
            max_send_sge,
            max_recv_sge,
            max_inline,
            max_msg_size,
            max_region_size,
            max_rd_atomic: 16,
            max_dest_rd_atomic: 16,
            atomics: false,
            max_shared_recv: 0,
            max_shared_recv_depth: 0,
        }
    }
}

/// Device-level settings a real NIC needs when it is opened (the simulator ignores what it does
/// not model). Backends take it in their `open`; the backend string of the stack
/// (`verbs:rxe0,gid=1,mtu=1024`) fills it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeviceConfig {
    /// Physical port (verbs ports count from 1).
    pub port: u8,
    /// GID table index for RoCE (`None`: the first RoCE v2 IPv4-mapped GID, else the first
    /// non-zero one). Unused on InfiniBand ports, which address by LID.
    pub gid_index: Option<u8>,
    /// Path MTU in bytes (256, 512, 1024, 2048 or 4096; `None`: the port's active MTU).
    pub path_mtu: Option<u32>,
    /// Traffic class (IPv6 TC / IPv4 DSCP+ECN byte) of RoCE packets.
    pub traffic_class: u8,
}

impl Default for DeviceConfig {
    fn default() -> Self {
        DeviceConfig { port: 1, gid_index: None, path_mtu: None, traffic_class: 0 }
    }
}

/// One NIC (verbs: an opened context plus a protection domain; URMA: a context; sim: one
/// simulated NIC). Everything it creates keeps what it needs alive, so handles may be dropped in
/// any order.
pub trait Device: Send + Sync + 'static {
    /// Registered memory.
    type Region: MemoryRegion;
    /// Completion queue.
    type Cq: CompletionQueue;
    /// Reliable-connected queue.
    type Queue: Queue;
    /// Shared receive queue.
    type SharedRecv: SharedRecv;
    /// Completion event channel that several CQs can share (verbs: `ibv_comp_channel`; URMA:
    /// jfce).
    type Channel: EventChannel;

    /// The device's limits.
    fn caps(&self) -> DeviceCaps;

    /// Allocates `len` bytes of zeroed memory and registers it with `access`. The region owns the
    /// memory; dropping it deregisters, then frees.
    fn register(&self, len: usize, access: Access) -> Result<Self::Region>;

    /// Registers `len` bytes of memory the caller owns, at `ptr`, with `access`. Dropping the
    /// region deregisters it and leaves the memory alone.
    ///
    /// # Safety
    /// `ptr..ptr + len` must be valid, writable memory that stays allocated, and is not moved or
    /// unmapped, until the returned region (and every queue that may still use its keys, see the
    /// module docs of `mr`) is dropped. While registered it is DMA memory: the caller accesses it
    /// only as [`MemoryRegion::write_shared`] allows, and never through a Rust reference that
    /// asserts it is unaliased (`&mut [u8]`) while a work request may touch it.
    unsafe fn register_external(&self, ptr: *mut u8, len: usize, access: Access) -> Result<Self::Region>;

    /// Creates a completion queue with room for `depth` completions and an event channel of its
    /// own ([`CompletionQueue::event_fd`]).
    fn create_cq(&self, depth: u32) -> Result<Self::Cq>;

    /// Creates an event channel for [`create_cq_on`](Self::create_cq_on).
    fn create_channel(&self) -> Result<Self::Channel>;

    /// Creates a completion queue whose events go to `channel`, which may serve many CQs: one
    /// fd to wait on for all of them ([`EventChannel::take_events`] says which fired).
    fn create_cq_on(&self, depth: u32, channel: &Self::Channel) -> Result<Self::Cq>;

    /// Creates a queue in RESET whose send completions go to `send_cq` and receive completions to
    /// `recv_cq` (the two may be the same CQ).
    fn create_queue(
        &self,
        config: &QueueConfig,
        send_cq: &Self::Cq,
        recv_cq: &Self::Cq,
    ) -> Result<Self::Queue>;

    /// Creates a shared receive queue of at least `depth` receives of up to `max_sge` SGEs each
    /// (see [`SharedRecv`] for the contract); `depth` within
    /// [`DeviceCaps::max_shared_recv_depth`], `max_sge` within [`DeviceCaps::max_recv_sge`].
    /// `Error::Unsupported` on a device whose [`DeviceCaps::max_shared_recv`] is 0.
    fn create_shared_recv(&self, depth: u32, max_sge: u32) -> Result<Self::SharedRecv>;

    /// Creates a queue in RESET, as [`create_queue`](Self::create_queue) does, that takes its
    /// receives from `shared` (created on this device); its own
    /// [`post_recv`](Queue::post_recv) is refused. Receive completions go to `recv_cq` with
    /// this queue's qpn and the `wr_id` posted to `shared`.
    fn create_queue_on_shared(
        &self,
        config: &QueueConfig,
        send_cq: &Self::Cq,
        recv_cq: &Self::Cq,
        shared: &Self::SharedRecv,
    ) -> Result<Self::Queue>;

    /// The device's asynchronous-event fd (verbs: the context's `async_fd`), readable when
    /// [`poll_async_event`](Self::poll_async_event) has something; `None` if the backend has no
    /// fd (poll it then).
    fn async_event_fd(&self) -> Option<BorrowedFd<'_>>;

    /// The next asynchronous event, if any, without blocking: a queue that failed with nothing
    /// outstanding (so no completion says so), a port that went down or came up, a device that
    /// failed. Each event is reported once.
    fn poll_async_event(&self) -> Result<Option<AsyncEvent>>;

    /// Gives a software device a chance to run on the calling thread. A thread that waits for
    /// completions without polling the CQ that will receive them (a caller waiting for a worker,
    /// a worker serving many devices) calls this in its wait loop. Hardware moves by itself: the
    /// default does nothing.
    fn progress(&self) {}

    /// Whether the device moves only when something outside it steps it: the simulator's
    /// Stepped engine, which a test drives one unit of work at a time and whose clock ([`now`])
    /// is virtual and stands still between the test's moves. On such a device nothing a waiting
    /// thread does ([`progress`], polling) makes work advance or deadlines pass, so a blocking
    /// wait would never end: layers above refuse to block on it and ask for a non-blocking form.
    /// Hardware and self-running simulators return `false` (the default).
    ///
    /// [`now`]: Self::now
    /// [`progress`]: Self::progress
    fn externally_stepped(&self) -> bool {
        false
    }

    /// The device's clock: time since an arbitrary fixed point, monotonic. Timeouts above the
    /// HAL (per-call deadlines) are measured with it, so a simulated device with a virtual clock
    /// makes them deterministic. The default is the process's monotonic clock.
    fn now(&self) -> std::time::Duration {
        static BASE: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        BASE.get_or_init(std::time::Instant::now).elapsed()
    }
}
