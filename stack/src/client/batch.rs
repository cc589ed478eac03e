//! Batched calls: requests staged by a [`CallBatch`] and posted together, one doorbell (one
//! `post_send` of several work requests) per queue and run of up to 16 calls, instead of one per
//! call. The pipelined-rate path: the NIC then takes the run in one pass.

use super::{Channel, ChannelInner};
use crate::call::{CallFuture, Callback, Oneshot, Sink};
use crate::endpoint::MAX_REPOST_BATCH;
use crate::hal::Device;
use crate::tx_ctx::{CallMode, TxHandle};
use crate::wire::FunctionId;
use crate::{CallOptions, RpcError};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// A started call whose request waits in a batch (or failed to post).
#[derive(Debug, Clone, Copy)]
pub(super) struct Staged {
    pub h: TxHandle,
    pub len: u32,
    pub q: usize,
    pub req_id: u32,
    pub mode: CallMode,
    /// The queue's life ([`crate::endpoint::QueueSlot`]'s epoch) when the call was started.
    pub life: u32,
}

/// The requests a batch holds, all for one queue.
#[derive(Debug, Default)]
pub(super) struct Staging {
    items: [Option<Staged>; MAX_REPOST_BATCH],
    n: usize,
}

impl Staging {
    /// Before a call on queue `q` takes a credit and a context: posts what is staged if the call
    /// goes to another queue, or if it might otherwise wait for a credit or a context that only
    /// the staged calls' completions can give back.
    pub(super) fn before_start<D: Device + Clone>(&mut self, ch: &ChannelInner<D>, q: usize) {
        let Some(first) = self.items[0].filter(|_| self.n > 0) else { return };
        if first.q != q || ch.credits[q].available() == 0 || ch.ep.tx.in_use() >= ch.ep.tx.capacity() {
            self.flush(ch);
        }
    }

    /// Adds a started call's request; a full batch is posted at once.
    pub(super) fn push<D: Device + Clone>(&mut self, ch: &ChannelInner<D>, s: Staged) {
        self.items[self.n] = Some(s);
        self.n += 1;
        if self.n == MAX_REPOST_BATCH {
            self.flush(ch);
        }
    }

    /// Posts the staged requests with one doorbell. If the post fails (the queue failed or the
    /// channel closed meanwhile), every staged call ends with that error, exactly once.
    ///
    /// A call staged before its queue failed and was recovered is not posted: the failure ended
    /// it already (with the queue's error), and posting it on the recovered queue would run, on
    /// the server, a call its caller was told had failed.
    pub(super) fn flush<D: Device + Clone>(&mut self, ch: &ChannelInner<D>) {
        let n = std::mem::take(&mut self.n);
        if n == 0 {
            return;
        }
        let Some(first) = self.items[0] else { return };
        let q = first.q;
        let life = ch.ep.queues[q].epoch.load(Ordering::Acquire);
        let mut items = [(first.h, 0u32); MAX_REPOST_BATCH];
        let mut live = 0;
        for s in self.items[..n].iter().flatten() {
            if s.life == life {
                items[live] = (s.h, s.len);
                live += 1;
            } else if let Some(p) = ch.unpost(s) {
                // Not claimed by the failure after all (it cannot have been posted): end it.
                ch.deliver(p, Err(RpcError::Queue(crate::hal::Status::Flushed)));
            }
        }
        if live == 0 {
            return;
        }
        if let Err(e) = ch.ep.post_sends(q, &items[..live]) {
            for s in self.items[..n].iter().flatten().filter(|s| s.life == life) {
                if let Some(p) = ch.unpost(s) {
                    ch.deliver(p, Err(same_error(&e)));
                }
            }
        }
    }
}

/// The error of a failed batch post, once per call of the batch.
fn same_error(e: &RpcError) -> RpcError {
    match e {
        RpcError::Closed => RpcError::Closed,
        RpcError::Queue(s) => RpcError::Queue(*s),
        other => RpcError::InvalidArgument(format!("posting the batch failed: {other}")),
    }
}

/// Calls started together and posted with one doorbell per queue (and per 16 calls), for
/// pipelined rates: a NIC takes a posted run in one pass. Made by [`Channel::batch`].
///
/// A call started here behaves exactly like [`Channel::call_callback`] /
/// [`Channel::call_future`] — same options, credits, deadlines, exactly-once completion — except
/// that its request goes out at the latest when the batch is flushed or dropped (earlier when 16
/// are staged, when a call picks another queue, or when a call would otherwise wait for a credit
/// or send context that only the staged calls can free). So an error of the post itself (the
/// queue failed or the channel closed between start and flush) reaches the call's callback or
/// future rather than the start's return value. Starting calls allocates nothing beyond what
/// the non-batched calls do.
///
/// ```no_run
/// # use bypass::*;
/// # fn f(channel: &Channel<bypass::sim::SimNic>, id: FunctionId) -> Result<(), RpcError> {
/// let mut batch = channel.batch();
/// for i in 0..8u8 {
///     batch.call_callback(&CallOptions::default(), id, &[i; 64], move |r| {
///         assert!(r.is_ok(), "call {i}");
///     })?;
/// }
/// batch.flush(); // or drop it
/// # Ok(()) }
/// ```
pub struct CallBatch<'c, D: Device + Clone> {
    channel: &'c Channel<D>,
    staging: Staging,
}

impl<D: Device + Clone> std::fmt::Debug for CallBatch<'_, D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallBatch").field("staged", &self.staging.n).finish()
    }
}

impl<D: Device + Clone> Channel<D> {
    /// A batch of calls posted together (see [`CallBatch`]).
    pub fn batch(&self) -> CallBatch<'_, D> {
        CallBatch { channel: self, staging: Staging::default() }
    }
}

impl<D: Device + Clone> CallBatch<'_, D> {
    /// Stages a call whose outcome goes to `callback` (as [`Channel::call_callback`]).
    pub fn call_callback(
        &mut self,
        opts: &CallOptions,
        function: FunctionId,
        args: &[u8],
        callback: impl FnOnce(Result<&[u8], RpcError>) + Send + 'static,
    ) -> Result<(), RpcError> {
        let cb: Callback = Box::new(callback);
        self.start(opts, function, args, Sink::Callback(cb))
    }

    /// Stages a call and returns a `Future` of its outcome (as [`Channel::call_future`]).
    pub fn call_future(
        &mut self,
        opts: &CallOptions,
        function: FunctionId,
        args: &[u8],
    ) -> Result<CallFuture, RpcError> {
        let shot = Arc::new(Oneshot::default());
        self.start(opts, function, args, Sink::Shot(shot.clone()))?;
        Ok(CallFuture { shot })
    }

    /// Calls staged and not yet posted.
    pub fn staged(&self) -> usize {
        self.staging.n
    }

    /// Posts the staged calls now.
    pub fn flush(&mut self) {
        self.staging.flush(&self.channel.inner);
    }

    fn start(
        &mut self,
        opts: &CallOptions,
        function: FunctionId,
        args: &[u8],
        sink: Sink,
    ) -> Result<(), RpcError> {
        let inner = &self.channel.inner;
        inner.start_args(opts, function, super::rndv::Args::Bytes(args), sink, None, Some(&mut self.staging))
    }
}

impl<D: Device + Clone> Drop for CallBatch<'_, D> {
    fn drop(&mut self) {
        self.flush();
    }
}
