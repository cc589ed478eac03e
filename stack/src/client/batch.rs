//! Batched calls: requests staged by a [`CallBatch`] and posted together, one doorbell (one
//! `post_send` of several work requests) per queue and flush, instead of one per call. The
//! pipelined-rate path: the NIC then takes each queue's run in one pass.
//!
//! Calls keep the channel's queue choice (round-robin, or the queue a call names), so a batch
//! spreads its calls over the queues exactly as unbatched calls would (the server's workers share
//! the load the same way). What changes is the posting: the staged calls are grouped by queue
//! at the flush, and each queue gets its calls as one post list, in the order they were started.

#![forbid(unsafe_code)]

use super::{Channel, ChannelInner};
use crate::client::delivery::{CallFuture, Callback, Oneshot, Sink};
use crate::conn::bufs::{SendList, TxToken};
use crate::control::MAX_QUEUES;
use crate::core::tx_ctx::{CallMode, TxHandle};
use crate::hal::Device;
use crate::limits::MAX_REPOST_BATCH;
use crate::wire::FunctionId;
use crate::{CallOptions, RpcError};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// Most calls a batch holds, over all its queues, before it posts them (one bit each of the
/// mask [`Staging::flush`] walks).
pub(super) const MAX_STAGED: usize = 64;

/// A started call whose request waits in a batch (or failed to post). Its send context's token
/// travels beside it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Staged {
    pub h: TxHandle,
    pub len: u32,
    pub q: usize,
    pub req_id: u32,
    pub mode: CallMode,
    /// The queue's life ([`crate::conn::endpoint::QueueSlot`]'s epoch) when the call was started.
    pub life: u32,
}

/// The requests a batch holds, in the order they were started, for any of the channel's queues.
#[derive(Debug)]
pub(super) struct Staging {
    items: [Option<(Staged, TxToken)>; MAX_STAGED],
    n: usize,
    /// Per queue, how many of `items` are for it (at most [`MAX_REPOST_BATCH`]: one post list).
    per_queue: [u8; MAX_QUEUES],
    /// The device clock, read by the first call with a deadline staged since the last flush:
    /// the calls of one burst share it (see [`CallBatch`]) instead of reading it once each.
    now: Option<Duration>,
}

impl Default for Staging {
    fn default() -> Self {
        Staging { items: std::array::from_fn(|_| None), n: 0, per_queue: [0; MAX_QUEUES], now: None }
    }
}

impl Staging {
    /// The clock reading the calls staged since the last flush share (read now if none is).
    pub(super) fn clock<D: Device + Clone>(&mut self, ch: &ChannelInner<D>) -> Duration {
        *self.now.get_or_insert_with(|| ch.ep.device.now())
    }

    /// Before a call on queue `q` takes a credit and a context: posts what is staged if the call
    /// might otherwise wait for a credit or a context that only the staged calls' completions
    /// can give back.
    pub(super) fn before_start<D: Device + Clone>(&mut self, ch: &ChannelInner<D>, q: usize) {
        if self.n > 0 && (ch.credits[q].available() == 0 || ch.ep.tx.in_use() >= ch.ep.tx.capacity()) {
            self.flush(ch);
        }
    }

    /// Adds a started call's request. Posts everything staged once a queue has a full post list
    /// ([`MAX_REPOST_BATCH`]) or the batch is full ([`MAX_STAGED`]).
    pub(super) fn push<D: Device + Clone>(&mut self, ch: &ChannelInner<D>, s: Staged, tx: TxToken) {
        self.items[self.n] = Some((s, tx));
        self.n += 1;
        let on_q = &mut self.per_queue[s.q];
        *on_q += 1;
        if usize::from(*on_q) == MAX_REPOST_BATCH || self.n == MAX_STAGED {
            self.flush(ch);
        }
    }

    /// Posts the staged requests: per queue, one post list and one doorbell. If a queue's post
    /// fails (it failed or the channel closed meanwhile, or the device refused), every call
    /// staged for it ends with that error, exactly once; the other queues' calls go out.
    ///
    /// A call staged before its queue failed and was recovered is not posted: the failure ended
    /// it already (with the queue's error), and posting it on the recovered queue would run, on
    /// the server, a call its caller was told had failed.
    pub(super) fn flush<D: Device + Clone>(&mut self, ch: &ChannelInner<D>) {
        let n = std::mem::take(&mut self.n);
        self.now = None;
        // Bit i: items[i] is still to post (or to end).
        let mut left = if n == MAX_STAGED { u64::MAX } else { (1u64 << n) - 1 };
        while left != 0 {
            let Some((first, _)) = &self.items[left.trailing_zeros() as usize] else { break };
            let q = first.q;
            self.per_queue[q] = 0;
            let life = ch.ep.queues[q].epoch.load(Ordering::Acquire);
            // Queue q's calls, in the order they were started: their sends, and the calls.
            let mut list = SendList::default();
            let mut calls = [None; MAX_REPOST_BATCH];
            let mut rest = left;
            while rest != 0 {
                let i = rest.trailing_zeros() as usize;
                rest &= rest - 1;
                let Some((s, tx)) = self.items[i].take_if(|(s, _)| s.q == q) else { continue };
                left &= !(1u64 << i);
                if s.life != life {
                    if let Some(p) = ch.unpost(&s, tx) {
                        // Not claimed by the failure after all (it cannot have been posted): end it.
                        ch.deliver(p, Err(RpcError::Queue(crate::hal::Status::Flushed)));
                    }
                    continue;
                }
                // `push` posts a queue's full list at once, so this one has room.
                calls[list.len()] = Some(s);
                list.push(tx, s.len);
            }
            if list.is_empty() {
                continue;
            }
            if let Err(e) = ch.ep.post_sends(q, &mut list) {
                // `calls[..n]` are the list's calls, in its order.
                for ((tx, _), s) in list.drain().zip(calls.iter().flatten()) {
                    if let Some(p) = ch.unpost(s, tx) {
                        ch.deliver(p, Err(same_error(&e)));
                    }
                }
            }
        }
    }
}

/// The error of a failed batch post, once per call of the batch: the error the same call would
/// have got from an unbatched post.
fn same_error(e: &RpcError) -> RpcError {
    match e {
        RpcError::Closed => RpcError::Closed,
        RpcError::Queue(s) => RpcError::Queue(*s),
        RpcError::Device(e) => RpcError::Device(e.clone()),
        // Not produced by a post; kept general rather than unreachable.
        other => RpcError::InvalidArgument(format!("posting the batch failed: {other}")),
    }
}

/// Calls started together and posted with one doorbell per queue, for pipelined rates: a NIC
/// takes a posted run in one pass. Made by [`Channel::batch`].
///
/// A call started here behaves exactly like [`Channel::call_callback`] /
/// [`Channel::call_future`] — same options, credits, deadlines, exactly-once completion — except
/// that its request goes out at the latest when the batch is flushed or dropped (earlier when 16
/// are staged for one queue or 64 in all, or when a call would otherwise wait for a credit or
/// send context that only the staged calls can free). Calls are spread over the channel's
/// queues as unbatched ones are (round-robin unless [`CallOptions::queue`] names one); a flush
/// posts each queue's share as one list with one doorbell, in the order the calls were started. So an error of the post itself (the
/// queue failed or the channel closed between start and flush) reaches the call's callback or
/// future rather than the start's return value. Starting calls allocates nothing beyond what
/// the non-batched calls do.
///
/// The calls staged between two flushes read the clock once, for all of them: their deadlines
/// ([`CallOptions::timeout`]) count from the first of them (a burst's calls start within
/// microseconds of each other; one clock read each was ~30 ns a call). A batch is for bursts:
/// a call staged long after the first one of its flush round, with no flush between, gets a
/// deadline that much earlier.
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

#[cfg(test)]
mod tests {
    //! The failed-post path, which needs a post the device refuses while the channel still takes
    //! the queue for READY: every other way a queue stops being usable (a failure, a close) also
    //! ends the staged calls itself, before the flush gets to post them (tests/batch.rs).

    use crate::sim::{Engine, Fabric};
    use crate::{CallOptions, Channel, ChannelConfig, FunctionId, Functions, Server, ServerConfig};
    use std::future::Future;
    use std::sync::{Arc, Mutex};

    const ECHO: FunctionId = match FunctionId::new(0x30, 0x3, true, 1) {
        Some(f) => f,
        None => panic!("bad function id"),
    };

    #[test]
    fn a_refused_post_ends_every_staged_call_once_and_leaks_nothing() {
        let fabric = Fabric::new(Engine::Stepped { seed: 0xBA7C_0005 });
        let (snic, cnic) = (fabric.add_nic(), fabric.add_nic());
        let mut functions = Functions::new();
        functions.register(ECHO, |req| {
            let args = req.args().to_vec();
            let _ = req.reply(&args);
        });
        let config = ServerConfig { workers: 0, ..ServerConfig::new("batch-unit") };
        let server = Server::bind(&snic, "127.0.0.1:0", config, functions).expect("bind");
        let ccfg = ChannelConfig { queues: 2, window: 8, recovery: None, ..ChannelConfig::new("batch-unit") };
        let channel = Channel::connect(&cnic, server.local_addr(), ccfg).expect("connect");
        fabric.run_until_idle();
        let inner = &channel.inner;
        let credits = inner.credits[0].available();
        let out: Arc<Mutex<Vec<(u8, String)>>> = Arc::default();
        let on_queue = |q| CallOptions { queue: Some(q), wait_for_credit: false, ..CallOptions::default() };
        let mut batch = channel.batch();
        for i in 0..5u8 {
            let out = out.clone();
            batch
                .call_callback(&on_queue(0), ECHO, &[i], move |r| {
                    out.lock().unwrap().push((i, r.expect_err("the post was refused").to_string()));
                })
                .expect("stage");
        }
        assert_eq!(inner.credits[0].available(), credits - 5, "each staged call holds a credit");
        // The device now refuses posts on queue 0 (a queue in RESET cannot send), while the channel
        // has seen nothing wrong with it: only the flush's post finds out.
        inner.ep.reset_queue(0).expect("reset queue 0");
        assert!(inner.ep.queues[0].ready.load(std::sync::atomic::Ordering::Acquire));
        batch.flush();
        let got = out.lock().unwrap().clone();
        assert_eq!(got.len(), 5, "each staged call ended exactly once, at the flush: {got:?}");
        let mut ids: Vec<u8> = got.iter().map(|(i, _)| *i).collect();
        ids.sort_unstable();
        assert_eq!(ids, [0, 1, 2, 3, 4]);
        assert_eq!(channel.stats().tx_in_use, 0, "the send contexts came back");
        assert_eq!(inner.credits[0].available(), credits, "the credits came back");
        // Each staged call got the error an unbatched call gets from the same post.
        let unbatched = channel
            .call_callback(&on_queue(0), ECHO, b"alone", |_| panic!("the post is refused"))
            .expect_err("an unbatched post on queue 0 is refused too")
            .to_string();
        assert!(unbatched.contains("queue is Reset"), "{unbatched}");
        for (i, e) in &got {
            assert_eq!(e, &unbatched, "call {i}");
        }
        assert_eq!(channel.stats().tx_in_use, 0);
        assert_eq!(inner.credits[0].available(), credits);
        fabric.run_until_idle();
        server.poll();
        assert_eq!(server.stats().requests, 0, "nothing reached the server");
        // A full window still fits in the table and the contexts: a batch of 8 on queue 1 works.
        let mut batch = channel.batch();
        let futs: Vec<_> = (0..8u8)
            .map(|i| batch.call_future(&on_queue(1), ECHO, &[i; 8]).expect("stage on queue 1"))
            .collect();
        drop(batch);
        for _ in 0..1_000 {
            if futs.iter().all(|f| f.is_done()) {
                break;
            }
            fabric.run_until_idle();
            server.poll();
            channel.poll();
        }
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        for (i, mut f) in (0..8u8).zip(futs) {
            let r = std::pin::Pin::new(&mut f).poll(&mut cx);
            assert!(
                matches!(&r, std::task::Poll::Ready(Ok(v)) if v == &[i; 8]),
                "call {i} on queue 1: {r:?}"
            );
        }
        assert_eq!(server.stats().requests, 8);
    }
}
