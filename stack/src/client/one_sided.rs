//! One-sided I/O: RDMA WRITE and READ of a peer's registered region over a [`Channel`].
//!
//! The peer registers a region with [`Access::REMOTE_READ`] / [`Access::REMOTE_WRITE`] and hands
//! its descriptor ([`RemoteRegion`], 49 bytes by [`RemoteRegion::encode`]) to the application on
//! this side, typically as the response of an RPC. The application decodes it
//! ([`RemoteRegion::decode`]) and calls [`Channel::write`] / [`Channel::read`] (or their
//! `_callback` / `_future` forms) with a list of [`LocalRange`]s: up to [`MAX_SGES`] ranges of
//! regions registered on the channel's device, gathered (WRITE) or scattered into (READ) in
//! order.
//!
//! # Design
//!
//! - **Memory safety.** A [`LocalRange`] borrows an `Arc` of the local region; the operation
//!   keeps a clone of it until the device has *completed* the work request (its send
//!   completion, including a flush), not merely until the caller hears the outcome. A timed-out
//!   READ therefore still has its target region alive while the NIC may write it. (The hal's
//!   own model already makes a stale key harmless; this makes it impossible to hit.)
//! - **Send slots.** Every operation takes a send context of the channel's slab, exactly like a
//!   call (but no credit: it consumes no receive buffer at the peer). Each send ring holds every
//!   context, so a posted operation always finds room, and the send-depth accounting of calls
//!   covers one-sided operations. When every context is in use the operation waits (polling)
//!   or fails with [`RpcError::WouldBlock`], per [`OpOptions::wait`]. READs beyond the queue's
//!   `max_rd_atomic` are queued by the device in order (the hal contract), so the stack adds no
//!   limit of its own.
//! - **wr_ids.** An operation's `wr_id` is its [`TxHandle`] (`generation << 32 | index`) with
//!   bit 31 ([`ONE_SIDED_TAG`]) set. Context indexes are below the device's queue depth, far
//!   below 2^31, so the tag never collides with a call's `wr_id`; the send-CQ handler strips it
//!   and knows from it, without a lock, to release the operation's regions and to name a
//!   remote-access error as such.
//! - **Completion.** An operation is a context in `EARLY_RSP` mode: it completes on its send
//!   completion, and every other path (deadline, queue failure, close) claims it through the
//!   same [`TxSlab::claim_completion`](crate::core::tx_ctx::TxSlab::claim_completion) as a call, so it
//!   completes exactly once.
//! - **Errors.** The operation's own error completion maps to [`RpcError::RemoteAccess`] (bad
//!   key, out of range, missing right, or another remote error), [`RpcError::LocalAccess`] (a
//!   local key or range the device refused) or [`RpcError::Queue`]. On a reliable connection
//!   such an error moves the queue to ERROR: the channel marks that queue failed, fails the
//!   calls outstanding on it with [`RpcError::Queue`] (other one-sided operations on it end with
//!   their own flush completion, [`RpcError::Queue`]`(Flushed)`), and goes on with its other
//!   queues; the failed queue is not reconnected. When no queue is left the channel closes
//!   (later operations get [`RpcError::Closed`]), so a channel of one queue is closed by a bad
//!   descriptor: use several queues, or validate offsets against the descriptor's length first,
//!   if that matters.
//! - **Limits checked at the call.** What the device would refuse only by failing the queue is
//!   refused before anything is posted, with [`RpcError::InvalidArgument`] naming the limit, and
//!   the queue is not touched: an operation of more bytes (its ranges' total) than the device's
//!   `max_msg_size` (one operation is one work request, so it is not split: a split operation
//!   could fail or time out half done; split it yourself if partial progress is fine), and a
//!   READ on a channel whose queues may have no READ outstanding
//!   (`ChannelConfig::queue_config.max_rd_atomic` 0, or the device's cap 0).

#![forbid(unsafe_code)]

use super::{ChannelInner, Pending, NO_DEADLINE};
use crate::client::delivery::CallFuture;
use crate::client::delivery::Sink;
use crate::conn::bufs::Unposted;
use crate::core::tx_ctx::{CallMode, TxHandle};
use crate::hal::{self, Access, Device, MemoryRegion, RemoteRegion, SendOp, Sge};
use crate::sync::lock;
use crate::wire::FunctionId;
use crate::{CallOptions, RpcError};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

pub use crate::limits::MAX_SGES;

/// Set in the `wr_id` of every one-sided operation (bit 31 of the context-index half).
pub(crate) const ONE_SIDED_TAG: u64 = 1 << 31;

/// The regions an operation keeps alive until its work request completed.
pub(crate) type Held<R> = [Option<Arc<R>>; MAX_SGES];

/// Placeholder function id of an operation in the call bookkeeping (traces, panic reports).
const NO_FUNCTION: FunctionId = match FunctionId::new(0, 0, false, 0) {
    Some(f) => f,
    None => panic!("function id 0 fits"),
};

/// `len` bytes at `offset` of a registered local region: a gather source of a WRITE or a
/// scatter target of a READ. The operation clones the `Arc`, so the region outlives the device's
/// use of it whatever the caller does meanwhile.
#[derive(Debug)]
pub struct LocalRange<'a, R> {
    pub(crate) region: &'a Arc<R>,
    pub(crate) offset: usize,
    pub(crate) len: usize,
}

impl<'a, R: MemoryRegion> LocalRange<'a, R> {
    /// `len` bytes at `offset` of `region` (bounds are checked when the operation starts).
    pub fn new(region: &'a Arc<R>, offset: usize, len: usize) -> Self {
        LocalRange { region, offset, len }
    }

    /// The whole region.
    pub fn whole(region: &'a Arc<R>) -> Self {
        LocalRange { region, offset: 0, len: region.len() }
    }
}

/// Per-operation choices of a one-sided READ or WRITE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpOptions {
    /// Deadline; `None` uses the channel's [`ChannelConfig::timeout`](crate::ChannelConfig).
    /// At the deadline the operation fails with [`RpcError::Timeout`]; its work request may
    /// still execute (the local regions stay alive until it completes).
    pub timeout: Option<Duration>,
    /// Post on this queue instead of one picked round-robin.
    pub queue: Option<usize>,
    /// When every send context is in use: wait (polling) until one is free or the deadline,
    /// instead of failing with [`RpcError::WouldBlock`].
    pub wait: bool,
}

impl Default for OpOptions {
    fn default() -> Self {
        OpOptions { timeout: None, queue: None, wait: true }
    }
}

/// The kind of a one-sided operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OpKind {
    Read,
    Write,
}

/// The pending outcome of [`Channel::write_future`](crate::Channel::write_future) or
/// [`Channel::read_future`](crate::Channel::read_future). Like a [`CallFuture`], it resolves only
/// while something polls the channel; dropping it does not cancel the operation.
#[derive(Debug)]
#[must_use = "an operation future does nothing useful unless awaited or polled"]
pub struct OpFuture(pub(crate) CallFuture);

impl OpFuture {
    /// Whether the outcome has arrived.
    pub fn is_done(&self) -> bool {
        self.0.is_done()
    }
}

impl Future for OpFuture {
    type Output = Result<(), RpcError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0).poll(cx).map(|r| r.map(drop))
    }
}

/// The error of an operation whose own work request completed with `status`.
pub(crate) fn error_of(status: hal::Status) -> RpcError {
    use hal::Status as S;
    match status {
        S::RemoteAccess | S::RemoteInvalidRequest | S::RemoteOperation => RpcError::RemoteAccess(status),
        S::LocalProtection | S::LocalLength => RpcError::LocalAccess(status),
        s => RpcError::Queue(s),
    }
}

impl<D: Device + Clone> ChannelInner<D> {
    /// Releases the regions operation context `index` kept alive (its work request completed,
    /// or was never posted).
    pub(crate) fn release_held(&self, index: u32) {
        if let Some(h) = self.held.get(index as usize) {
            *lock(h) = Default::default();
        }
    }

    /// Starts a one-sided operation; its outcome goes to `sink` (unless this returns an error).
    /// Starts a one-sided operation. `blocking`: the name of the blocking call starting it (it
    /// is refused on a device a test steps, after the argument checks).
    #[allow(clippy::too_many_arguments)] // one more than the lint's 7: the blocking caller's name
    pub(crate) fn start_op(
        &self,
        kind: OpKind,
        local: &[LocalRange<'_, D::Region>],
        remote: &RemoteRegion,
        remote_offset: u64,
        opts: &OpOptions,
        sink: Sink,
        blocking: Option<&'static str>,
    ) -> Result<(), RpcError> {
        if self.ep.is_closed() {
            return Err(RpcError::Closed);
        }
        let max = self.ep.max_send_sge.min(MAX_SGES);
        if local.is_empty() || local.len() > max {
            return Err(RpcError::InvalidArgument(format!(
                "a one-sided operation takes 1..={max} local ranges, got {}",
                local.len()
            )));
        }
        let caps = self.ep.device.caps();
        let name = match kind {
            OpKind::Read => "READ",
            OpKind::Write => "WRITE",
        };
        let total: u64 = local.iter().map(|l| l.len as u64).sum();
        if total > u64::from(caps.max_msg_size) {
            return Err(RpcError::InvalidArgument(format!(
                "a one-sided {name} of {total} bytes is above this device's max_msg_size ({} bytes): split it \
                 into operations of at most that many bytes",
                caps.max_msg_size
            )));
        }
        if kind == OpKind::Read && self.config.queue_config.max_rd_atomic.min(caps.max_rd_atomic) == 0 {
            return Err(RpcError::InvalidArgument(format!(
                "a one-sided READ needs a queue that may have a READ outstanding, but \
                 ChannelConfig.queue_config.max_rd_atomic is {} (device cap {}): set it to at least 1",
                self.config.queue_config.max_rd_atomic, caps.max_rd_atomic
            )));
        }
        if kind == OpKind::Read && self.server_reads.0 == Some(0) {
            return Err(RpcError::InvalidArgument(
                "a one-sided READ is served by the server's queues, but they serve no READ: the server \
                 announced 0 responder resources (its ServerConfig.queue_config.max_dest_rd_atomic, or \
                 its device's cap, is 0); set it to at least 1 on the server, or have the server WRITE \
                 the data"
                    .into(),
            ));
        }
        let mut sges = [Sge::default(); MAX_SGES];
        for (i, (sge, l)) in sges.iter_mut().zip(local).enumerate() {
            if kind == OpKind::Read && !l.region.access().contains(Access::LOCAL_WRITE) {
                return Err(RpcError::InvalidArgument(format!(
                    "local range {i} of a READ is in a region without LOCAL_WRITE access"
                )));
            }
            *sge = l
                .region
                .sge(l.offset, l.len)
                .map_err(|e| RpcError::InvalidArgument(format!("local range {i}: {e}")))?;
        }
        let Some(raddr) = remote.addr.checked_add(remote_offset).map(|_| remote.at(remote_offset)) else {
            return Err(RpcError::InvalidArgument(format!(
                "remote offset {remote_offset} overflows the descriptor's address {:#x}",
                remote.addr
            )));
        };
        let call_opts = CallOptions {
            mode: CallMode::EarlyRsp,
            timeout: opts.timeout,
            queue: opts.queue,
            wait_for_credit: opts.wait,
            ..CallOptions::default()
        };
        let deadline = self.deadline_of(&call_opts);
        let q = self.pick_queue(opts.queue)?;
        if let Some(what) = blocking {
            self.refuse_to_block(what)?;
        }
        let tx = self.take_tx(&call_opts, deadline)?;
        let h = tx.handle();
        {
            let mut held = lock(&self.held[h.index as usize]);
            for (slot, l) in held.iter_mut().zip(local) {
                *slot = Some(Arc::clone(l.region));
            }
        }
        let slot = &self.slots[h.index as usize];
        *lock(&slot.pending) = Some(Pending {
            sink,
            req_id: 0,
            queue: q,
            function: NO_FUNCTION,
            mode: CallMode::EarlyRsp,
            deadline,
            traced_at: 0,
            one_sided: true,
        });
        slot.handle.store(h.to_u64(), Ordering::Release);
        let op = match kind {
            OpKind::Read => SendOp::Read(raddr),
            OpKind::Write => SendOp::Write(raddr),
        };
        if let Err(Unposted { tx, error }) = self.ep.post_op(q, tx, ONE_SIDED_TAG, op, &sges[..local.len()]) {
            // Nothing was posted: undo, unless another path (close, queue failure) claimed the
            // operation meanwhile and delivered its outcome.
            let claimed = self.ep.tx.claim_completion(h) == Ok(true);
            let pending = if claimed { self.take_pending(h) } else { None };
            self.release_held(h.index);
            let _ = self.ep.discard_tx(tx);
            drop(pending);
            return if claimed { Err(error) } else { Ok(()) };
        }
        if deadline != NO_DEADLINE {
            slot.deadline.store(deadline, Ordering::SeqCst);
            self.next_scan.fetch_min(deadline, Ordering::SeqCst);
        }
        Ok(())
    }
}

/// Splits a send completion's `wr_id` into the context handle and whether it is an operation.
pub(crate) fn split_wr_id(wr_id: u64) -> (TxHandle, bool) {
    (TxHandle::from_u64(wr_id & !ONE_SIDED_TAG), wr_id & ONE_SIDED_TAG != 0)
}
