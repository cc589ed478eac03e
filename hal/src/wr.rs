//! Work requests: what an application asks a queue to do.

use crate::{RemoteAddr, Sge};

bitflags::bitflags! {
    /// Per-work-request flags.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct WrFlags: u32 {
        /// Produce a completion when the request finishes. Unsignaled requests still execute in
        /// order; their slots are reclaimed when the completion of a later signaled request is
        /// polled (so post a signaled one at least every `send_depth` requests). Failed and
        /// flushed requests always produce a completion.
        const SIGNALED = 1 << 0;
        /// Copy the payload into the work queue entry at post time (at most the queue's
        /// `max_inline` bytes); the SGEs' memory may be reused as soon as the post returns. The
        /// SGEs must still lie in a region registered on this device (backends check this; a
        /// payload outside any region is refused at post time).
        const INLINE = 1 << 1;
        /// Do not start this request until every earlier READ on the queue has completed.
        const FENCE = 1 << 2;
        /// Ask the receiver's CQ to raise an event even when armed for solicited events only.
        const SOLICITED = 1 << 3;
    }
}

/// The operation of a send-side work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOp {
    /// Two-sided send; consumes one receive at the peer.
    Send,
    /// Send with 32-bit immediate data delivered in the peer's receive completion.
    SendImm(u32),
    /// One-sided write of the SGEs' bytes to the remote address. The requester's completion
    /// means the responder's NIC placed the bytes; the responder's CPU may rely on them once a
    /// later SEND or WRITE_IMM on the same connection has completed there.
    Write(RemoteAddr),
    /// Write plus immediate data; consumes one receive at the peer, whose completion carries the
    /// immediate and the byte count.
    WriteImm(RemoteAddr, u32),
    /// One-sided read of the remote range into the local SGEs.
    Read(RemoteAddr),
}

/// A send-side work request.
#[derive(Debug, Clone, Copy)]
pub struct SendWr<'a> {
    /// Returned unchanged in the completion.
    pub wr_id: u64,
    /// What to do.
    pub op: SendOp,
    /// Local memory to gather from (or scatter into, for READ). A zero-byte message has an
    /// empty list.
    pub sges: &'a [Sge],
    /// Flags.
    pub flags: WrFlags,
}

impl<'a> SendWr<'a> {
    /// A signaled SEND of `sges`.
    pub fn send(wr_id: u64, sges: &'a [Sge]) -> Self {
        SendWr { wr_id, op: SendOp::Send, sges, flags: WrFlags::SIGNALED }
    }
    /// The same request with `flags` instead of its current flags.
    pub fn with_flags(mut self, flags: WrFlags) -> Self {
        self.flags = flags;
        self
    }
    /// The same request with a different operation.
    pub fn with_op(mut self, op: SendOp) -> Self {
        self.op = op;
        self
    }
    /// Total bytes described by the SGEs (saturating).
    pub fn total_len(&self) -> u64 {
        self.sges.iter().map(|s| u64::from(s.len)).sum()
    }
}

/// A receive-side work request: where to put the next inbound SEND (or where a WRITE_IMM's
/// notification lands).
#[derive(Debug, Clone, Copy)]
pub struct RecvWr<'a> {
    /// Returned unchanged in the completion.
    pub wr_id: u64,
    /// Memory to scatter into, in order.
    pub sges: &'a [Sge],
}
