//! The device: capabilities, and the factory of regions, completion queues and queues.

use crate::{Access, CompletionQueue, MemoryRegion, Queue, QueueConfig, Result};

/// Limits of a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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

    /// The device's limits.
    fn caps(&self) -> DeviceCaps;

    /// Allocates `len` bytes of zeroed memory and registers it with `access`. The region owns the
    /// memory; dropping it deregisters, then frees.
    fn register(&self, len: usize, access: Access) -> Result<Self::Region>;

    /// Creates a completion queue with room for `depth` completions.
    fn create_cq(&self, depth: u32) -> Result<Self::Cq>;

    /// Creates a queue in RESET whose send completions go to `send_cq` and receive completions to
    /// `recv_cq` (the two may be the same CQ).
    fn create_queue(
        &self,
        config: &QueueConfig,
        send_cq: &Self::Cq,
        recv_cq: &Self::Cq,
    ) -> Result<Self::Queue>;

    /// Gives a software device a chance to run on the calling thread. A thread that waits for
    /// completions without polling the CQ that will receive them (a caller waiting for a worker,
    /// a worker serving many devices) calls this in its wait loop. Hardware moves by itself: the
    /// default does nothing.
    fn progress(&self) {}

    /// The device's clock: time since an arbitrary fixed point, monotonic. Timeouts above the
    /// HAL (per-call deadlines) are measured with it, so a simulated device with a virtual clock
    /// makes them deterministic. The default is the process's monotonic clock.
    fn now(&self) -> std::time::Duration {
        static BASE: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        BASE.get_or_init(std::time::Instant::now).elapsed()
    }
}
