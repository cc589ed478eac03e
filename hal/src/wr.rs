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
    /// Atomic compare-and-swap of the 8-byte word at the remote address (8-byte aligned, in a
    /// region with [`Access::REMOTE_ATOMIC`](crate::Access::REMOTE_ATOMIC)): if it equals
    /// `compare` it becomes `swap`. The word's value before the operation lands in the request's
    /// one SGE of exactly 8 bytes (which needs `LOCAL_WRITE`). Needs
    /// [`DeviceCaps::atomics`](crate::DeviceCaps::atomics).
    ///
    /// Values are 64-bit integers in the byte order of the hosts (both x86_64 or aarch64 little
    /// endian here): the responder's NIC operates on the word as its CPU would, and the result
    /// arrives in host order, as on rxe. An unaligned remote address is refused at post
    /// (`Error::InvalidArgument`) by every backend, as rxe's provider does (hardware that lets it
    /// through gets a NAK invalid request from the responder instead; the hal does not leave that
    /// difference to the device).
    CompareSwap {
        /// Where the word is.
        remote: RemoteAddr,
        /// The value it must have.
        compare: u64,
        /// The value it gets if it had `compare`.
        swap: u64,
    },
    /// Atomic fetch-and-add on the 8-byte word at the remote address (wrapping); the value
    /// before the addition lands in the one 8-byte SGE. Same rules as
    /// [`CompareSwap`](SendOp::CompareSwap).
    FetchAdd {
        /// Where the word is.
        remote: RemoteAddr,
        /// What to add.
        add: u64,
    },
}

impl SendOp {
    /// The operation's name, for messages.
    pub fn name(&self) -> &'static str {
        match self {
            SendOp::Send => "SEND",
            SendOp::SendImm(_) => "SEND_IMM",
            SendOp::Write(_) => "WRITE",
            SendOp::WriteImm(..) => "WRITE_IMM",
            SendOp::Read(_) => "READ",
            SendOp::CompareSwap { .. } => "COMPARE_SWAP",
            SendOp::FetchAdd { .. } => "FETCH_ADD",
        }
    }

    /// The remote address of a one-sided operation.
    pub fn remote(&self) -> Option<&RemoteAddr> {
        match self {
            SendOp::Send | SendOp::SendImm(_) => None,
            SendOp::Write(r) | SendOp::WriteImm(r, _) | SendOp::Read(r) => Some(r),
            SendOp::CompareSwap { remote, .. } | SendOp::FetchAdd { remote, .. } => Some(remote),
        }
    }

    /// True for the atomics.
    pub fn is_atomic(&self) -> bool {
        matches!(self, SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. })
    }

    /// True for operations that bring data back into the local SGEs (READ and the atomics):
    /// they count against `max_rd_atomic`, wait for a FENCE, and cannot be INLINE.
    pub fn reads_back(&self) -> bool {
        matches!(self, SendOp::Read(_)) || self.is_atomic()
    }
}

/// The size of an atomic operand and result.
pub const ATOMIC_SIZE: u32 = 8;

/// Checks what every backend checks before posting a send-side request: INLINE limits, the SGE
/// count, and the atomics' rules (device support, exactly one 8-byte SGE, not INLINE, an 8-byte
/// aligned remote address).
pub fn check_send_wr(
    wr: &SendWr<'_>,
    max_inline: u32,
    max_send_sge: u32,
    atomics: bool,
) -> crate::Result<()> {
    let invalid = |m: String| Err(crate::Error::InvalidArgument(m));
    if wr.flags.contains(WrFlags::INLINE) {
        if wr.op.reads_back() {
            return invalid(format!("a {} cannot be INLINE (its SGEs receive data)", wr.op.name()));
        }
        if wr.total_len() > u64::from(max_inline) {
            return invalid(format!(
                "INLINE payload of {} bytes exceeds max_inline {max_inline}",
                wr.total_len()
            ));
        }
    } else if wr.sges.len() > max_send_sge as usize {
        return invalid(format!("{} SGEs exceed the queue's max_send_sge {max_send_sge}", wr.sges.len()));
    }
    if wr.op.is_atomic() {
        if !atomics {
            return Err(crate::Error::Unsupported(format!(
                "this device does not do atomics ({}); see DeviceCaps::atomics",
                wr.op.name()
            )));
        }
        if wr.sges.len() != 1 || wr.sges[0].len != ATOMIC_SIZE {
            return invalid(format!(
                "a {} takes exactly one SGE of {ATOMIC_SIZE} bytes for the old value, not {:?}",
                wr.op.name(),
                wr.sges.iter().map(|s| s.len).collect::<Vec<_>>()
            ));
        }
        if let Some(r) = wr.op.remote().filter(|r| r.addr % u64::from(ATOMIC_SIZE) != 0) {
            return invalid(format!(
                "a {} needs an 8-byte aligned remote address, not {:#x}",
                wr.op.name(),
                r.addr
            ));
        }
    }
    Ok(())
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
