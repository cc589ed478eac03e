//! The stack's size and window limits, in one place: what either side accepts and what a
//! connection's buffers may cost by default.

/// Smallest message size either side accepts (the peer refuses a smaller one in the handshake):
/// room for the 20-byte request header, or the 16-byte response header, and some data.
pub(crate) const MIN_MSG_SIZE: usize = 64;

/// Largest credit window (calls outstanding per queue) a client may ask for or a server grant.
pub(crate) const MAX_WINDOW: u32 = 4096;

/// Default limit of the registered buffer memory of one connection, on either side
/// (`ChannelConfig::memory_limit`, `ServerConfig::memory_limit`): 256 MiB.
pub const DEFAULT_MEMORY_LIMIT: u64 = 256 << 20;

/// Most receive buffers re-posted with one doorbell.
pub(crate) const MAX_REPOST_BATCH: usize = 16;

/// Default [`RecvBuffers::Shared`](crate::RecvBuffers) pool size: 512 buffers (2 MiB at the
/// default 4 KiB messages), the full windows of 16 connections at the default window of 32.
pub const DEFAULT_SHARED_RECV_BUFFERS: u32 = 512;

/// Most buffers a shared pool may have.
pub(crate) const MAX_SHARED_RECV_BUFFERS: u32 = 1 << 20;

/// Default per-connection limit of the server's rendezvous memory
/// ([`ServerConfig::rndv_memory_limit`](crate::ServerConfig::rndv_memory_limit)): 256 MiB.
pub const DEFAULT_RNDV_MEMORY_LIMIT: u64 = 256 << 20;

/// Most local ranges of one operation (the SGEs of one work request).
pub const MAX_SGES: usize = 4;

/// The period [`ServerConfig::max_queue_resets`](crate::ServerConfig::max_queue_resets) counts
/// a connection's queue resets over: one minute.
pub const QUEUE_RESET_WINDOW: std::time::Duration = std::time::Duration::from_secs(60);

/// Bytes the server counts for one entry of a send ring when it sizes a connection's memory
/// (`ServerConfig::memory_limit`, `ServerConfig::max_memory`): a work request of up to
/// [`MAX_SGES`] SGEs, as the simulator lays it out (mlx5's send WQEs are 64-byte blocks, one
/// to four of them).
pub(crate) const SEND_WQE_BYTES: u64 = 128;

/// Bytes counted for one entry of a receive ring (one SGE).
pub(crate) const RECV_WQE_BYTES: u64 = 64;

/// Bytes counted for one completion queue entry (mlx5's CQE is 64 bytes).
pub(crate) const CQE_BYTES: u64 = 64;

/// Default [`ServerConfig::max_connections`](crate::ServerConfig::max_connections): 1024.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;

/// Default [`ServerConfig::max_memory`](crate::ServerConfig::max_memory): 1 GiB, four
/// connections at the default [`DEFAULT_MEMORY_LIMIT`].
pub const DEFAULT_MAX_MEMORY: u64 = 1 << 30;
