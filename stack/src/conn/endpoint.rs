//! One side of a connection: its queues, completion queues, send contexts and message buffers.
//!
//! Both the client's [`Channel`](crate::Channel) and the server's per-client connection are an
//! `Endpoint` plus their own logic. Memory is laid out so that ownership follows the protocol and
//! needs no bookkeeping on the hot path:
//!
//! - **send buffers**: `msg_size` bytes per send context (see [`crate::core::tx_ctx`]), registered in
//!   chunks of [`SEND_CHUNK`] contexts: send context `i` owns bytes `(i % SEND_CHUNK) × msg_size ..`
//!   of chunk `i / SEND_CHUNK`. The first chunk is registered with the endpoint, the others the
//!   first time a context of theirs is handed out ([`Endpoint::get_tx`]; once per chunk for the
//!   life of the endpoint). Before that happens the client and the server reap their send
//!   completions ([`Endpoint::tx_would_grow`]), so a chunk is added only when the registered
//!   contexts are all genuinely in flight, not merely waiting for a completion nobody polled.
//!   The slab hands out the most recently freed context first, so an idle or lightly loaded
//!   connection keeps using the first chunk and never registers the rest: its send buffers cost `SEND_CHUNK × msg_size`, not the whole send depth's worth. Whoever holds a
//!   live context's [`TxToken`] writes its buffer; the context is released only after the send completion, so
//!   the NIC never reads a buffer that is being rewritten.
//! - **receive buffers**, one of two ways:
//!   - *own* (the client always; a server on a device without shared receive queues, or
//!     configured with [`RecvBuffers::PerConnection`](crate::RecvBuffers)): one registered region
//!     of `queues × recv_depth × msg_size` bytes; buffer `b` belongs to queue `b / recv_depth`
//!     and is posted to it with `wr_id = b`.
//!   - *shared* (a server's connections by default): no receive buffers of the endpoint's own.
//!     Its queues are created on the server's [`SharedPool`] and take their receives from it;
//!     buffer `b` is the pool's, posted to the shared queue with `wr_id = b`, and a completion's
//!     queue is the one its qpn names. An idle connection then costs no receive buffers at all.
//!
//!   Either way a buffer is either posted or owned by exactly one party (the poller that took
//!   its completion, or a server [`Request`](crate::Request)), which holds its [`RecvBuf`] and
//!   gives it back when done: re-posted to its queue, or to the shared pool.
//!
//! **Selective signaling.** A batch of sends posted with one doorbell ([`Endpoint::post_sends`])
//! asks for a completion only for its last send: a queue completes its sends in order, so that
//! completion means the others are done too. Each context of a batch records its neighbours in
//! the batch (`run_prev`, `run_next`), and whoever handles a send completion first reports the
//! unsignaled contexts before it as successfully sent, in post order
//! ([`Endpoint::unsignaled_before`]). A send that fails or is flushed completes on its own (the
//! device reports those whether signaled or not) and retires the unsignaled ones before it the
//! same way; its successor's `run_prev` is cut while the send CQ's lock is held
//! ([`Endpoint::poll_send`]), so a later completion of the batch never walks back into contexts
//! already reported (and perhaps reused). A context reached by a walk is therefore always one
//! whose send event nobody has reported: it stays live, and its links are the ones its post
//! wrote. A lone send is always signaled, so no context waits for a send that may never come.
//!
//! Sends and receives complete on two separate completion queues, as in URPC (and as on
//! hardware, the order between them is not defined): the send CQ and the receive CQ.
//!
//! Every queue and CQ is behind a lock because the HAL's post and poll take `&mut self`. A poll
//! uses `try_lock`: if another thread is polling, it is delivering for everyone, so the caller
//! moves on. The locks are [`SpinLock`]s: one compare-exchange to take, a plain store to give
//! back (a std mutex gives back with a second locked instruction), and these sections come
//! several times per call.

use crate::conn::bufs::{Received, RecvBuf, SendList, TxToken, Unposted};
use crate::conn::polled::{Polled, RECV, SEND};
use crate::conn::shared_pool::SharedPool;
use crate::conn::sizes::{validate_sizes, Sizes};
use crate::core::tx_ctx::{CallMode, FailReason, Outcome, TxError, TxHandle, TxSlab};
use crate::hal::{
    Access, Completion, CompletionQueue, CqOpcode, Device, MemoryRegion, Queue, QueueInfo, QueueState,
    RecvWr, SendOp, SendWr, Sge, Status, WrFlags,
};
use crate::limits::{MAX_REPOST_BATCH, MIN_MSG_SIZE};
use crate::sync::{lock, SpinLock};
use crate::RpcError;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// `run_prev` of a send that no unsignaled send precedes in its batch.
const NO_RUN: u64 = u64::MAX;

/// Send contexts whose buffers are registered together (see the module docs).
pub(crate) const SEND_CHUNK: usize = 8;

/// One queue of an endpoint.
pub(crate) struct QueueSlot<Q> {
    pub(crate) q: SpinLock<Q>,
    pub(crate) qpn: u32,
    /// Cleared for good once the queue fails (an error completion, or a flush).
    pub(crate) ready: AtomicBool,
    /// Receive buffers given back but not re-posted yet (see [`Endpoint::repost`]).
    deferred: SpinLock<Deferred>,
    /// Receive buffers kept while the queue is not READY (flushed, or given back meanwhile), to
    /// be re-posted when it is recovered ([`Endpoint::reconnect_queue`]). Its capacity is the
    /// receive depth: each buffer is in one place (posted, owned, deferred or here).
    parked: Mutex<Vec<u32>>,
    /// Which drain markers of a recovery have completed (bit 0 send, bit 1 receive).
    drained: AtomicU8,
    /// The queue's life: incremented by each recovery, so work of an earlier life is told apart.
    pub(crate) epoch: AtomicU32,
    /// Per CQ (send, receive): its failed-poll count when the current life began, at the
    /// queue's last reset (see [`Polled`]). Written and read under `q`'s lock.
    life_from: [AtomicU64; 2],
}

#[derive(Default)]
struct Deferred {
    bufs: [u32; MAX_REPOST_BATCH],
    len: usize,
}

/// Where an endpoint's receive buffers are (see the module docs).
enum RecvBufs<D: Device> {
    /// Its own: `queues × depth` buffers, buffer `b` belonging to queue `b / depth`, given back
    /// `batch` at a time.
    Own { region: D::Region, depth: u32, batch: usize },
    /// The server's shared pool.
    Shared(Arc<SharedPool<D>>),
}

pub(crate) struct Endpoint<D: Device> {
    pub(crate) device: D,
    pub(crate) send_cq: SpinLock<D::Cq>,
    pub(crate) recv_cq: SpinLock<D::Cq>,
    pub(crate) queues: Box<[QueueSlot<D::Queue>]>,
    pub(crate) tx: TxSlab,
    /// The send buffers, [`SEND_CHUNK`] contexts' worth per region, each registered on first use.
    send_chunks: Box<[OnceLock<D::Region>]>,
    /// Taken to register a chunk (so that two threads do not both register it).
    chunk_init: Mutex<()>,
    /// Send contexts whose chunk is registered: always the first ones, since never-used contexts
    /// are handed out in index order (see [`Endpoint::tx_would_grow`]).
    send_ready: AtomicUsize,
    /// Per send context: the context posted unsignaled just before it in the same batch
    /// ([`NO_RUN`] for a batch's first send, a lone send, or once cut); see the module docs.
    run_prev: Box<[AtomicU64]>,
    /// Per send context: the context posted just after it in the same batch ([`NO_RUN`] for
    /// the last send of a batch and a lone send).
    run_next: Box<[AtomicU64]>,
    recv: RecvBufs<D>,
    pub(crate) msg_size: usize,
    /// SGEs per send-side work request the queues were created with.
    pub(crate) max_send_sge: usize,
    /// Polls of the receive CQ that found it empty (counted on the shared path only, where a
    /// drain has no receive marker; see [`Endpoint::drain`]).
    recv_empty_polls: AtomicU64,
    /// Polls of the receive CQ whose completions are still being handled by the thread that
    /// took them ([`Endpoint::poll_recv_tracked`]; the client counts them so that a close can
    /// wait for replies another thread took from the CQ but has not delivered yet).
    recv_in_flight: AtomicU32,
    /// Per CQ (send, receive): polls that returned a failed completion (see [`Polled`]). Only
    /// changed with the CQ's lock held.
    failed_polls: [AtomicU64; 2],
    /// Bytes registered for the send and receive buffers so far.
    registered: AtomicU64,
    /// Set for good when the connection closes (before its queues are failed), so a post that
    /// finds its queue failed can tell a closed connection ([`RpcError::Closed`]) from a queue
    /// that failed on its own ([`RpcError::Queue`]).
    pub(crate) closed: AtomicBool,
}

/// A receive poll's completions being handled (see [`Endpoint::poll_recv_tracked`]); dropping it
/// (also when the handling unwinds) ends the poll's count.
#[must_use]
pub(crate) struct InFlight<'a>(Option<&'a AtomicU32>);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if let Some(count) = self.0 {
            count.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl<D: Device + Clone> Endpoint<D> {
    /// An endpoint with receive buffers of its own.
    pub(crate) fn new(device: &D, s: Sizes) -> Result<Self, RpcError> {
        Self::with_recv(device, s, None)
    }

    /// An endpoint whose queues receive from `shared` if given (no receive buffers of its own;
    /// `s.recv_depth` is then only the queues' own receive depth, which bounds the receive
    /// completions a queue may have unpolled), else from buffers of its own.
    pub(crate) fn with_recv(
        device: &D,
        s: Sizes,
        shared: Option<&Arc<SharedPool<D>>>,
    ) -> Result<Self, RpcError> {
        let caps = device.caps();
        if s.queues == 0 || s.queues > 256 {
            return Err(RpcError::InvalidArgument(format!("{} queues: use 1..=256", s.queues)));
        }
        if s.msg_size < MIN_MSG_SIZE || s.msg_size as u64 > u64::from(caps.max_msg_size) {
            return Err(RpcError::InvalidArgument(format!(
                "message size {} out of range: use {MIN_MSG_SIZE}..={}",
                s.msg_size, caps.max_msg_size
            )));
        }
        let tx_capacity = s.queues * s.send_depth as usize;
        let recv_count = s.queues * s.recv_depth as usize;
        // Every send context may end up on one queue, so each send ring holds all of them: a
        // post then never finds its ring full (a context outlives its ring slot).
        if s.send_depth == 0 || s.recv_depth == 0 {
            return Err(RpcError::InvalidArgument(
                "an endpoint needs send contexts and receive buffers".into(),
            ));
        }
        validate_sizes(
            "use fewer queues or a smaller window",
            s.queues,
            s.send_depth,
            s.recv_depth,
            s.msg_size,
            &caps,
        )?;
        let cq_depth = |n: usize| u32::try_from(n + 1).unwrap_or(u32::MAX);
        let send_cq = device.create_cq(cq_depth(tx_capacity))?;
        let recv_cq = device.create_cq(cq_depth(recv_count))?;
        let config = {
            let mut c = s.queue_config;
            c.send_depth = tx_capacity as u32;
            c.recv_depth = s.recv_depth;
            // Gather/scatter lists of one-sided operations; messages use one SGE.
            c.max_send_sge = caps.max_send_sge.clamp(1, crate::limits::MAX_SGES as u32);
            c.max_recv_sge = 1;
            c
        };
        let mut queues = Vec::with_capacity(s.queues);
        for _ in 0..s.queues {
            let q = match shared {
                Some(pool) => {
                    pool.with_srq(|srq| device.create_queue_on_shared(&config, &send_cq, &recv_cq, srq))?
                }
                None => device.create_queue(&config, &send_cq, &recv_cq)?,
            };
            queues.push(QueueSlot {
                qpn: q.qpn(),
                q: SpinLock::new(q),
                ready: AtomicBool::new(false),
                deferred: SpinLock::default(),
                parked: Mutex::new(Vec::with_capacity(s.recv_depth as usize)),
                drained: AtomicU8::new(0),
                epoch: AtomicU32::new(0),
                life_from: [AtomicU64::new(0), AtomicU64::new(0)],
            });
        }
        let tx =
            TxSlab::new(tx_capacity).map_err(|e| RpcError::InvalidArgument(format!("send contexts: {e}")))?;
        let send_chunks: Box<[OnceLock<D::Region>]> =
            (0..tx_capacity.div_ceil(SEND_CHUNK)).map(|_| OnceLock::new()).collect();
        let repost_batch = s.repost_batch.clamp(1, MAX_REPOST_BATCH);
        let recv = match shared {
            Some(pool) => RecvBufs::Shared(pool.clone()),
            None => RecvBufs::Own {
                region: device.register(recv_count * s.msg_size, Access::LOCAL_WRITE)?,
                depth: s.recv_depth,
                batch: repost_batch,
            },
        };
        let own_recv_bytes = match &recv {
            RecvBufs::Own { region, .. } => region.len() as u64,
            RecvBufs::Shared(_) => 0,
        };
        let ep = Endpoint {
            registered: AtomicU64::new(own_recv_bytes),
            device: device.clone(),
            send_cq: SpinLock::new(send_cq),
            recv_cq: SpinLock::new(recv_cq),
            queues: queues.into_boxed_slice(),
            tx,
            send_chunks,
            chunk_init: Mutex::new(()),
            send_ready: AtomicUsize::new(0),
            run_prev: (0..tx_capacity).map(|_| AtomicU64::new(NO_RUN)).collect(),
            run_next: (0..tx_capacity).map(|_| AtomicU64::new(NO_RUN)).collect(),
            recv,
            msg_size: s.msg_size,
            max_send_sge: config.max_send_sge as usize,
            recv_empty_polls: AtomicU64::new(0),
            recv_in_flight: AtomicU32::new(0),
            failed_polls: [AtomicU64::new(0), AtomicU64::new(0)],
            closed: AtomicBool::new(false),
        };
        // The slab hands out context 0 first: its chunk is there from the start.
        ep.send_chunk(0)?;
        Ok(ep)
    }

    /// Bytes registered for the send and receive buffers so far (not counting a shared pool).
    pub(crate) fn registered(&self) -> u64 {
        self.registered.load(Ordering::Relaxed)
    }

    /// The registered chunk of send buffers holding context `index`'s, registering it first if
    /// no context of it was handed out before.
    fn send_chunk(&self, index: usize) -> Result<&D::Region, RpcError> {
        let cell = &self.send_chunks[index / SEND_CHUNK];
        if let Some(r) = cell.get() {
            return Ok(r);
        }
        let _init = lock(&self.chunk_init);
        if let Some(r) = cell.get() {
            return Ok(r);
        }
        let contexts = SEND_CHUNK.min(self.tx.capacity() - index / SEND_CHUNK * SEND_CHUNK);
        let region = self.device.register(contexts * self.msg_size, Access::LOCAL_WRITE)?;
        self.registered.fetch_add(region.len() as u64, Ordering::Relaxed);
        self.send_ready.fetch_add(contexts, Ordering::Relaxed);
        Ok(cell.get_or_init(|| region))
    }

    /// Whether the next context [`Endpoint::get_tx`] hands out would be the first of a chunk not
    /// registered yet: every context of the registered chunks is in use. (The slab hands out the
    /// most recently freed context first and never-used ones in index order, so a context of an
    /// unregistered chunk comes out only when no registered one is free.) Callers then reap send
    /// completions before they take one, so a chunk is registered on the call path only when
    /// the registered contexts are genuinely all in flight, not when their completions merely
    /// wait in the send CQ. Racy by nature (other threads take and free contexts); it only
    /// decides whether to poll first.
    pub(crate) fn tx_would_grow(&self) -> bool {
        let ready = self.send_ready.load(Ordering::Relaxed);
        ready < self.tx.capacity() && self.tx.in_use() >= ready
    }

    /// Send contexts whose buffers are registered.
    pub(crate) fn send_ready(&self) -> usize {
        self.send_ready.load(Ordering::Relaxed)
    }

    /// Whether fewer than half the registered send contexts are in use: a poller may then leave
    /// their completions in the send CQ for a later, bulk reap without making a sender register
    /// a new chunk or wait ([`Endpoint::tx_would_grow`] stays false).
    pub(crate) fn tx_mostly_free(&self) -> bool {
        self.tx.in_use() * 2 < self.send_ready.load(Ordering::Relaxed)
    }

    /// A free send context for a message of mode `mode` (see [`TxSlab::get`]), its send buffer
    /// registered; `Ok(None)` when every context is in use. The first use of a chunk of
    /// [`SEND_CHUNK`] contexts registers it (once for the endpoint's life); an error doing so
    /// is returned and the context goes back.
    pub(crate) fn get_tx(&self, mode: CallMode, token: u64) -> Result<Option<TxToken>, RpcError> {
        let Some(h) = self.tx.get(mode, token) else { return Ok(None) };
        if let Err(e) = self.send_chunk(h.index as usize) {
            let _ = self.tx.fail(h, FailReason::SendError);
            return Err(e);
        }
        Ok(Some(TxToken::mint(h)))
    }

    /// A free send context whose send buffer is already registered, or `None` (every context
    /// in use, or the one the slab would hand out belongs to a chunk not registered yet: it goes
    /// back). What a caller waits for once the device refused to register a chunk
    /// ([`Endpoint::get_tx`] failed): the endpoint then makes do with the contexts it has.
    pub(crate) fn get_registered_tx(&self, mode: CallMode, token: u64) -> Option<TxToken> {
        let h = self.tx.get(mode, token)?;
        if self.send_chunks[h.index as usize / SEND_CHUNK].get().is_some() {
            return Some(TxToken::mint(h));
        }
        let _ = self.tx.fail(h, FailReason::SendError);
        None
    }

    /// Context `index`'s send buffer: its chunk and its offset in it. The chunk is registered
    /// (the context was handed out by [`Endpoint::get_tx`]).
    fn send_slot(&self, index: u32) -> (&D::Region, usize) {
        let i = index as usize;
        let region =
            self.send_chunks[i / SEND_CHUNK].get().expect("a handed-out context's chunk is registered");
        (region, (i % SEND_CHUNK) * self.msg_size)
    }

    /// What the peer needs to connect to each of our queues, in order.
    pub(crate) fn infos(&self) -> Vec<QueueInfo> {
        self.queues.iter().map(|q| lock(&q.q).info()).collect()
    }

    /// Connects queue `i` to `peers[i]` and fills its receive queue (on the shared path the
    /// pool is filled already).
    pub(crate) fn connect(&self, peers: &[QueueInfo]) -> Result<(), RpcError> {
        if peers.len() != self.queues.len() {
            return Err(RpcError::InvalidArgument(format!(
                "the peer sent {} queue infos for {} queues",
                peers.len(),
                self.queues.len()
            )));
        }
        for (i, (slot, peer)) in self.queues.iter().zip(peers).enumerate() {
            let mut q = lock(&slot.q);
            q.connect(peer)?;
            if let RecvBufs::Own { depth, .. } = self.recv {
                for b in 0..depth {
                    self.post_recv_locked(&mut q, i as u32 * depth + b)?;
                }
            }
            slot.ready.store(true, Ordering::Release);
        }
        Ok(())
    }

    /// The queue index of a queue number.
    pub(crate) fn queue_index(&self, qpn: u32) -> Option<usize> {
        self.queues.iter().position(|q| q.qpn == qpn)
    }

    /// The queue a receive buffer of the endpoint's own belongs to (on the shared path a buffer
    /// belongs to no queue: see [`Endpoint::recv_queue`]).
    pub(crate) fn queue_of_buf(&self, buf: u32) -> usize {
        match self.recv {
            RecvBufs::Own { depth, .. } => (buf / depth) as usize,
            RecvBufs::Shared(_) => unreachable!("a shared receive buffer belongs to no queue"),
        }
    }

    /// The queue receive completion `c` (of a buffer: one that handed over a [`RecvBuf`]) came on: the
    /// buffer's queue, or on the shared path the queue its qpn names. On the shared path it also
    /// counts the completion for the pool's statistics.
    #[inline]
    pub(crate) fn recv_queue(&self, c: &Completion) -> Option<usize> {
        match &self.recv {
            RecvBufs::Own { depth, .. } => Some((c.wr_id / u64::from(*depth)) as usize),
            RecvBufs::Shared(pool) => {
                pool.note_taken();
                self.queue_index(c.qpn)
            }
        }
    }

    /// The `wr_id`s below this name the receive buffers (own, or the shared pool's).
    #[inline]
    fn buf_bound(&self) -> u64 {
        match &self.recv {
            RecvBufs::Own { depth, .. } => (self.queues.len() as u64) * u64::from(*depth),
            RecvBufs::Shared(pool) => u64::from(pool.buffers()),
        }
    }

    /// Whether the queues receive from a shared pool.
    pub(crate) fn is_shared(&self) -> bool {
        matches!(self.recv, RecvBufs::Shared(_))
    }

    /// Gives back, unread, the buffers of the receive completions still in the receive CQ (a
    /// closed connection on the shared path: its buffers serve the other connections). Returns
    /// how many; does nothing if another thread is polling, or for own buffers.
    pub(crate) fn reclaim_shared(&self) -> usize {
        let RecvBufs::Shared(pool) = &self.recv else { return 0 };
        let mut wc = [MaybeUninit::uninit(); MAX_REPOST_BATCH];
        let mut total = 0;
        loop {
            let (done, _) = self.poll_recv(&mut wc);
            let n = done.len();
            for (_, buf) in done {
                if let Some(buf) = buf {
                    pool.note_taken();
                    pool.give_back(buf.spend());
                    total += 1;
                }
            }
            if n == 0 {
                return total;
            }
        }
    }

    fn post_recv_locked(&self, q: &mut D::Queue, buf: u32) -> Result<(), RpcError> {
        let RecvBufs::Own { region, .. } = &self.recv else {
            unreachable!("a queue on a shared pool is not posted to")
        };
        let sge = region.sge(buf as usize * self.msg_size, self.msg_size)?;
        q.post_recv(&[RecvWr { wr_id: u64::from(buf), sges: &[sge] }])?;
        Ok(())
    }

    /// Gives receive buffer `buf` back to its queue. Buffers are collected and re-posted
    /// `repost_batch` at a time, with one doorbell (the receive depth has that much slack over
    /// the peer's window, so the peer never finds the queue empty). On a failed queue the buffer
    /// simply stays with us: nothing will be received there any more. On the shared path the
    /// buffer goes back to the pool, whatever became of the queue it came on.
    pub(crate) fn repost(&self, buf: RecvBuf) {
        self.repost_at(buf.spend());
    }

    /// [`repost`](Self::repost) of buffer `buf`, which the caller owned (its [`RecvBuf`] was
    /// spent).
    fn repost_at(&self, buf: u32) {
        let (region, batch_len) = match &self.recv {
            RecvBufs::Own { region, batch, .. } => (region, *batch),
            RecvBufs::Shared(pool) => return pool.give_back(buf),
        };
        let slot = &self.queues[self.queue_of_buf(buf)];
        if !slot.ready.load(Ordering::Acquire) {
            return self.park_at(buf);
        }
        let mut batch = [0u32; MAX_REPOST_BATCH];
        let n = {
            let mut d = lock(&slot.deferred);
            let len = d.len;
            d.bufs[len] = buf;
            d.len += 1;
            if d.len < batch_len {
                return;
            }
            batch[..d.len].copy_from_slice(&d.bufs[..d.len]);
            std::mem::take(&mut d.len)
        };
        let mut sges = [Sge::new(0, 0, 0); MAX_REPOST_BATCH];
        for (sge, &b) in sges.iter_mut().zip(&batch[..n]) {
            match region.sge(b as usize * self.msg_size, self.msg_size) {
                Ok(s) => *sge = s,
                Err(_) => return slot.ready.store(false, Ordering::Release),
            }
        }
        let wrs: [RecvWr<'_>; MAX_REPOST_BATCH] = std::array::from_fn(|i| RecvWr {
            wr_id: u64::from(batch[i]),
            sges: std::slice::from_ref(&sges[i]),
        });
        if lock(&slot.q).post_recv(&wrs[..n]).is_err() {
            slot.ready.store(false, Ordering::Release);
            for &b in &batch[..n] {
                self.park_at(b);
            }
        }
    }

    /// Keeps receive buffer `buf` for re-posting when its queue is recovered; if the queue is
    /// READY again by now, re-posts it at once. On the shared path it goes back to the pool.
    pub(crate) fn park(&self, buf: RecvBuf) {
        self.park_at(buf.spend());
    }

    /// [`park`](Self::park) of buffer `buf`, which the caller owned.
    fn park_at(&self, buf: u32) {
        if let RecvBufs::Shared(pool) = &self.recv {
            return pool.give_back(buf);
        }
        let slot = &self.queues[self.queue_of_buf(buf)];
        let mut parked = lock(&slot.parked);
        if slot.ready.load(Ordering::Acquire) {
            drop(parked);
            return self.repost_at(buf);
        }
        parked.push(buf);
    }

    /// Posts the drain markers of queue `q` (a queue in ERROR flushes them behind everything
    /// posted before) and waits until both completions have been seen (`mark_drained`), calling
    /// `turn` between looks (it should poll). A queue in RESET holds nothing and is drained.
    ///
    /// On the shared path the queue takes no receive of its own, so there is no receive marker:
    /// what its receive side can still hold are completions already in the receive CQ (requests,
    /// and a receive it had taken for a message in progress, flushed when it entered ERROR,
    /// before the send marker's flush). Once the send marker is seen, the receive side is
    /// drained when the receive CQ has been found empty by a poll that *began* after that:
    /// two more empty polls (polls are serialised by the CQ's lock, so the second began after
    /// the first ended). No pool buffer is then left in the CQ for the reset to discard.
    pub(crate) fn drain(
        &self,
        q: usize,
        deadline: std::time::Instant,
        mut turn: impl FnMut(),
    ) -> Result<(), RpcError> {
        use crate::conn::recovery::drain_wr_id;
        let slot = &self.queues[q];
        slot.drained.store(0, Ordering::Release);
        if lock(&slot.q).state() == QueueState::Reset {
            return Ok(());
        }
        let (mut send, mut recv) = (false, self.is_shared());
        // Shared path: the empty-poll count when the send marker was first seen drained.
        let mut empty_mark: Option<u64> = None;
        loop {
            if !send {
                let wr = SendWr {
                    wr_id: drain_wr_id(q, false),
                    op: SendOp::Send,
                    sges: &[],
                    flags: WrFlags::SIGNALED,
                };
                match lock(&slot.q).post_send(&[wr]) {
                    Ok(()) => send = true,
                    Err(e) if e.is_would_block() => {}
                    Err(e) => return Err(e.into()),
                }
            }
            if !recv {
                match lock(&slot.q).post_recv(&[RecvWr { wr_id: drain_wr_id(q, true), sges: &[] }]) {
                    Ok(()) => recv = true,
                    Err(e) if e.is_would_block() => {}
                    Err(e) => return Err(e.into()),
                }
            }
            let drained = slot.drained.load(Ordering::Acquire);
            if drained == 3 {
                return Ok(());
            }
            if self.is_shared() && drained & 1 != 0 {
                let now = self.recv_empty_polls.load(Ordering::Acquire);
                match empty_mark {
                    None => empty_mark = Some(now),
                    Some(m) if now >= m + 2 => return Ok(()),
                    Some(_) => {}
                }
            }
            if std::time::Instant::now() >= deadline {
                return Err(RpcError::Timeout);
            }
            turn();
            std::thread::yield_now();
        }
    }

    /// A drain marker's completion was polled.
    pub(crate) fn mark_drained(&self, q: usize, recv: bool) {
        if let Some(slot) = self.queues.get(q) {
            slot.drained.fetch_or(if recv { 2 } else { 1 }, Ordering::AcqRel);
        }
    }

    /// Moves queue `q` to RESET (it must be drained: a reset discards what it holds) and
    /// returns its new [`QueueInfo`].
    ///
    /// Its next life begins here as far as failed completions go (see [`Polled`]): the queue
    /// was drained, so every batch that held a completion of the old life has been polled and
    /// counted, and it holds no completion of the next life before it is connected. A flush of
    /// the old life handled from now on, while the queue is reset and re-exchanged or after it
    /// is connected again, is stale: it must neither move the reset queue to ERROR (its connect
    /// would fail) nor fail the new life.
    pub(crate) fn reset_queue(&self, q: usize) -> Result<QueueInfo, RpcError> {
        let slot = &self.queues[q];
        let mut queue = lock(&slot.q);
        queue.reset()?;
        for (from, polls) in slot.life_from.iter().zip(&self.failed_polls) {
            from.store(polls.load(Ordering::Acquire), Ordering::Relaxed);
        }
        Ok(queue.info())
    }

    /// Connects the reset queue `q` to `peer`, re-posts its parked (and deferred) receive
    /// buffers, starts its next life and marks it READY.
    pub(crate) fn reconnect_queue(&self, q: usize, peer: &QueueInfo) -> Result<(), RpcError> {
        let slot = &self.queues[q];
        let mut queue = lock(&slot.q);
        queue.connect(peer)?;
        let mut parked = lock(&slot.parked);
        {
            let mut d = lock(&slot.deferred);
            let n = std::mem::take(&mut d.len);
            parked.extend_from_slice(&d.bufs[..n]);
        }
        while let Some(&b) = parked.last() {
            self.post_recv_locked(&mut queue, b)?;
            parked.pop();
        }
        slot.epoch.fetch_add(1, Ordering::AcqRel);
        slot.ready.store(true, Ordering::Release);
        Ok(())
    }

    /// The first `len` bytes (at most the message size) of received buffer `buf`, for as long as
    /// `buf` is borrowed.
    pub(crate) fn recv_bytes<'a>(&'a self, buf: &'a RecvBuf, len: usize) -> &'a [u8] {
        let region = match &self.recv {
            RecvBufs::Own { region, .. } => region,
            RecvBufs::Shared(pool) => return pool.bytes(buf, len),
        };
        let len = len.min(self.msg_size);
        let off = buf.index() as usize * self.msg_size;
        assert!(off + len <= region.len(), "receive buffer {} out of range", buf.index());
        // SAFETY: in bounds (asserted). `buf` is a `RecvBuf`, which only this endpoint's receive
        // poll mints, once per completion of buffer `buf` (`Received`), and which is neither
        // `Copy` nor `Clone`; the buffer goes back to its queue only when that `RecvBuf` is
        // spent (`repost`, `park`), which cannot happen while it is borrowed here. So the
        // buffer is not posted while the slice lives: the NIC does not write it, and no other
        // owner exists to. The region has no remote access and outlives `&self`.
        unsafe { std::slice::from_raw_parts(region.as_ptr().add(off), len) }
    }

    /// The send buffer (`msg_size` bytes) of send context `tx`, writable for as long as `tx` is
    /// borrowed.
    pub(crate) fn send_buf<'a>(&'a self, tx: &'a mut TxToken) -> &'a mut [u8] {
        let (region, off) = self.send_slot(tx.handle().index);
        assert!(off + self.msg_size <= region.len(), "send buffer {} out of range", tx.handle().index);
        // SAFETY: in bounds (asserted). A `TxToken` is minted only by `get_tx` /
        // `get_registered_tx`, from a context the slab has just handed out (LIVE, its send event
        // pending), and is neither `Copy` nor `Clone`: it is the only way to this buffer. The
        // context, and with it the buffer, can go to another call only once its send event is
        // reported, which happens only for a posted send (from its send completion) or for a
        // token given back (`discard_tx`): both spend the token, so neither can happen while it
        // is borrowed `&mut` here. Until the post the NIC does not read the buffer. The region
        // has no remote access and outlives `&self`.
        unsafe { std::slice::from_raw_parts_mut(region.as_ptr().add(off), self.msg_size) }
    }

    /// Gives back a send context that was never posted (it is released: its send event and a
    /// terminal one are reported at once, as for a send that failed).
    pub(crate) fn discard_tx(&self, tx: TxToken) -> Result<Outcome, TxError> {
        self.tx.fail(tx.spend(), FailReason::SendError)
    }

    /// Posts the first `len` bytes of `tx`'s send buffer as a signaled SEND on queue `q`. Spends
    /// the token; if nothing was posted, it comes back with the error.
    pub(crate) fn post_send(&self, q: usize, tx: TxToken, len: usize) -> Result<(), Unposted> {
        match self.post_send_of(q, tx.handle(), len) {
            Ok(()) => {
                let _posted = tx.spend();
                Ok(())
            }
            Err(error) => Err(Unposted { tx, error }),
        }
    }

    fn post_send_of(&self, q: usize, tx: TxHandle, len: usize) -> Result<(), RpcError> {
        let slot = &self.queues[q];
        self.check_ready(q)?;
        let (region, off) = self.send_slot(tx.index);
        let sge = region.sge(off, len)?;
        self.run_prev[tx.index as usize].store(NO_RUN, Ordering::Relaxed);
        self.run_next[tx.index as usize].store(NO_RUN, Ordering::Relaxed);
        let mut queue = lock(&slot.q);
        queue.post_send(&[SendWr::send(tx.to_u64(), &[sge])])?;
        Ok(())
    }

    /// Posts one signaled one-sided operation (READ or WRITE of `sges`) on queue `q`, with send
    /// context `tx` (whose buffer it does not use) and `wr_id` its handle with `tag` set. Spends
    /// the token; if nothing was posted, it comes back with the error.
    pub(crate) fn post_op(
        &self,
        q: usize,
        tx: TxToken,
        tag: u64,
        op: SendOp,
        sges: &[Sge],
    ) -> Result<(), Unposted> {
        let posted = self.check_ready(q).and_then(|()| {
            let wr = SendWr { wr_id: tx.handle().to_u64() | tag, op, sges, flags: WrFlags::SIGNALED };
            Ok(lock(&self.queues[q].q).post_send(&[wr])?)
        });
        match posted {
            Ok(()) => {
                let _posted = tx.spend();
                Ok(())
            }
            Err(error) => Err(Unposted { tx, error }),
        }
    }

    /// Posts the sends of `list` on queue `q` with one doorbell. All or nothing: on success the
    /// list is empty (its tokens spent); on error it still holds every token, nothing posted.
    /// Only the last send is signaled; the others are recorded as its run (see the module docs).
    pub(crate) fn post_sends(&self, q: usize, list: &mut SendList) -> Result<(), RpcError> {
        self.post_sends_of(q, list.items())?;
        list.spent();
        Ok(())
    }

    fn post_sends_of(&self, q: usize, items: &[(TxHandle, u32)]) -> Result<(), RpcError> {
        let items = &items[..items.len().min(MAX_REPOST_BATCH)];
        self.check_ready(q)?;
        let mut sges = [Sge::new(0, 0, 0); MAX_REPOST_BATCH];
        for (i, (sge, (tx, len))) in sges.iter_mut().zip(items).enumerate() {
            let (region, off) = self.send_slot(tx.index);
            *sge = region.sge(off, *len as usize)?;
            // Before the post: the device's completion of the batch orders these stores before
            // the poller's loads (`poll_send`, `unsignaled_before`).
            let link = |j: Option<usize>| j.and_then(|j| items.get(j)).map_or(NO_RUN, |(t, _)| t.to_u64());
            self.run_prev[tx.index as usize].store(link(i.checked_sub(1)), Ordering::Relaxed);
            self.run_next[tx.index as usize].store(link(Some(i + 1)), Ordering::Relaxed);
        }
        let last = items.len().wrapping_sub(1);
        let wrs: [SendWr<'_>; MAX_REPOST_BATCH] = std::array::from_fn(|i| {
            let wr_id = items.get(i).map_or(0, |(tx, _)| tx.to_u64());
            let wr = SendWr::send(wr_id, std::slice::from_ref(&sges[i]));
            if i == last {
                wr
            } else {
                wr.with_flags(WrFlags::empty())
            }
        });
        lock(&self.queues[q].q).post_send(&wrs[..items.len()])?;
        Ok(())
    }

    /// The send context a send completion's `wr_id` names if it is a message's (posted by
    /// [`Endpoint::post_send`] or [`Endpoint::post_sends`]), not a one-sided operation's (tagged)
    /// or a drain marker's.
    fn message_ctx(&self, wr_id: u64) -> Option<usize> {
        let index = TxHandle::from_u64(wr_id).index as usize;
        (index < self.run_prev.len() && crate::conn::recovery::drain_queue(wr_id).is_none()).then_some(index)
    }

    /// Reports, through `f`, each context posted unsignaled before the message send that
    /// completion `c` is about, oldest first, as a successful send completion on `c`'s queue: a
    /// completion of a send (success, error or flush) means the sends before it on its queue
    /// completed, and those of its batch that were not signaled have no completion of their own
    /// (see the module docs). Call it for every send completion, before handling the completion
    /// itself; it does nothing for a lone send, a one-sided operation or a drain marker.
    pub(crate) fn unsignaled_before(&self, c: &Completion, mut f: impl FnMut(&Completion)) {
        let Some(index) = self.message_ctx(c.wr_id) else { return };
        let mut p = self.run_prev[index].load(Ordering::Relaxed);
        if p == NO_RUN {
            return;
        }
        let mut run = [0u64; MAX_REPOST_BATCH];
        let mut n = 0;
        while p != NO_RUN && n < MAX_REPOST_BATCH {
            run[n] = p;
            n += 1;
            // `p` was posted before `c`'s send in its batch and its send event is not reported
            // yet (the cut in `poll_send`), so it is live and this link is its post's.
            p = self.run_prev[TxHandle::from_u64(p).index as usize].load(Ordering::Relaxed);
        }
        for &wr_id in run[..n].iter().rev() {
            debug_assert!(
                self.tx.send_pending(TxHandle::from_u64(wr_id)),
                "a run walked into a reported send"
            );
            f(&Completion {
                wr_id,
                status: Status::Success,
                opcode: CqOpcode::Send,
                byte_len: 0,
                imm: None,
                qpn: c.qpn,
            });
        }
    }

    /// Refuses to post on a queue the endpoint has failed (or that failed under it): the hal
    /// accepts posts to a queue in ERROR and flushes them, as hardware does, but a message posted
    /// there can only fail, so the caller learns it now: [`RpcError::Closed`] if the connection
    /// is closed, else [`RpcError::Queue`]`(Flushed)` (what the post would have completed with).
    pub(crate) fn check_ready(&self, q: usize) -> Result<(), RpcError> {
        if self.queues[q].ready.load(Ordering::Acquire) {
            Ok(())
        } else if self.is_closed() {
            Err(RpcError::Closed)
        } else {
            Err(RpcError::Queue(crate::hal::Status::Flushed))
        }
    }

    /// Whether the connection is closed.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Marks the connection closed; true if this call did it (the first one).
    pub(crate) fn mark_closed(&self) -> bool {
        !self.closed.swap(true, Ordering::AcqRel)
    }

    /// Polls the send CQ if no other thread is polling it (or, with `wait`, after that thread
    /// is done). Before the CQ's lock is given back, each polled send's successor in its batch
    /// (if any) is cut off from it: a send with a completion of its own ends the run the next
    /// completion may walk back over (see the module docs and [`Endpoint::unsignaled_before`]).
    pub(crate) fn poll_send<'a>(
        &self,
        out: &'a mut [MaybeUninit<Completion>],
        wait: bool,
    ) -> (&'a [Completion], Polled) {
        let guard = if wait { Some(lock(&self.send_cq)) } else { self.send_cq.try_lock() };
        let Some(mut cq) = guard else { return (&[], self.polled(SEND, false)) };
        // A CQ overflow means the device dropped completions: the queues behind it cannot be
        // trusted any more. Sizes here make it impossible (CQ depth > everything postable).
        let done = cq.poll_uninit(out).unwrap_or(&[]);
        let polled = self.polled(SEND, done.iter().any(|c| !c.status.is_ok()));
        for c in done.iter().filter(|c| !c.status.is_ok()) {
            // Only a failed or flushed send can have a successor in its batch: a successful
            // completion is a signaled send's, the last of its batch or a lone one.
            let Some(index) = self.message_ctx(c.wr_id) else { continue };
            let next = self.run_next[index].load(Ordering::Relaxed);
            if next != NO_RUN {
                self.run_prev[TxHandle::from_u64(next).index as usize].store(NO_RUN, Ordering::Relaxed);
            }
        }
        (done, polled)
    }

    /// Polls the receive CQ if no other thread is polling it. Each completion of a receive
    /// buffer hands that buffer over as a [`RecvBuf`] (see [`Received`]); the [`Polled`] says
    /// when the batch was polled.
    pub(crate) fn poll_recv<'a>(&self, out: &'a mut [MaybeUninit<Completion>]) -> (Received<'a>, Polled) {
        let Some(mut cq) = self.recv_cq.try_lock() else {
            return (self.received(&[]), self.polled(RECV, false));
        };
        // As in `poll_send`.
        let done = cq.poll_uninit(out).unwrap_or(&[]);
        if done.is_empty() && self.is_shared() {
            // Under the CQ's lock, so the count orders the polls (see `drain`).
            self.recv_empty_polls.fetch_add(1, Ordering::AcqRel);
        }
        let polled = self.polled(RECV, done.iter().any(|c| !c.status.is_ok()));
        (self.received(done), polled)
    }

    /// The [`Polled`] of a batch just polled from CQ `cq`, whose lock the caller holds (else
    /// `failed` is false): a batch with a failed completion is counted.
    fn polled(&self, cq: usize, failed: bool) -> Polled {
        let polls = &self.failed_polls[cq];
        let mut seq = polls.load(Ordering::Relaxed);
        if failed {
            // Only changed under the CQ's lock: no read-modify-write needed.
            seq += 1;
            polls.store(seq, Ordering::Release);
        }
        Polled { cq, seq }
    }

    /// Completions just polled from the receive CQ, each yielded once with its buffer.
    #[inline]
    fn received<'a>(&self, done: &'a [Completion]) -> Received<'a> {
        Received { done, bufs: self.buf_bound() }
    }

    /// Polls the receive CQ like [`poll_recv`](Self::poll_recv) (or waiting for its lock, with
    /// `wait`), and counts a poll that returned completions as in flight until the returned
    /// guard is dropped: the caller keeps it while it handles them. The count is raised under
    /// the CQ's lock, so a thread that then takes the lock and finds the CQ empty sees every
    /// earlier poll's completions either handled or still counted ([`Self::recv_in_flight`]).
    pub(crate) fn poll_recv_tracked<'a>(
        &self,
        out: &'a mut [MaybeUninit<Completion>],
        wait: bool,
    ) -> (Received<'a>, Polled, InFlight<'_>) {
        let guard = if wait { Some(lock(&self.recv_cq)) } else { self.recv_cq.try_lock() };
        let Some(mut cq) = guard else {
            return (self.received(&[]), self.polled(RECV, false), InFlight(None));
        };
        let done = cq.poll_uninit(out).unwrap_or(&[]);
        if done.is_empty() {
            return (self.received(done), self.polled(RECV, false), InFlight(None));
        }
        let polled = self.polled(RECV, done.iter().any(|c| !c.status.is_ok()));
        self.recv_in_flight.fetch_add(1, Ordering::AcqRel);
        (self.received(done), polled, InFlight(Some(&self.recv_in_flight)))
    }

    /// Whether completions taken by [`poll_recv_tracked`](Self::poll_recv_tracked) are still
    /// being handled.
    pub(crate) fn recv_in_flight(&self) -> bool {
        self.recv_in_flight.load(Ordering::Acquire) > 0
    }

    /// Marks queue `q` failed and moves it to ERROR (which flushes what it still holds).
    /// Returns whether it was READY until now.
    pub(crate) fn fail_queue(&self, q: usize) -> bool {
        self.fail_queue_polled(q, None).unwrap_or(false)
    }

    /// [`fail_queue`](Self::fail_queue) for a failed completion of queue `q` from the batch
    /// `polled` (None: a failure not seen in a completion): does nothing and returns `None` if
    /// that completion is from an earlier life of the queue (see [`Polled`]), which a recovery
    /// has already drained and which says nothing about the queue's current life.
    pub(crate) fn fail_queue_polled(&self, q: usize, polled: Option<Polled>) -> Option<bool> {
        let slot = &self.queues[q];
        // Under the queue's lock, as `reconnect_queue` starts a life: a life does not begin
        // between the judgment and the failure.
        let mut queue = lock(&slot.q);
        if polled.is_some_and(|p| p.seq <= slot.life_from[p.cq].load(Ordering::Relaxed)) {
            return None;
        }
        let was_ready = slot.ready.swap(false, Ordering::AcqRel);
        if queue.state() != QueueState::Error {
            let _ = queue.set_error();
        }
        Some(was_ready)
    }

    /// Number of queues still READY.
    pub(crate) fn ready_queues(&self) -> usize {
        self.queues.iter().filter(|q| q.ready.load(Ordering::Acquire)).count()
    }
}

impl<D: Device> Drop for Endpoint<D> {
    fn drop(&mut self) {
        // Shared path: receive completions nobody polled (a connection that closed with
        // requests still in its CQ) give their buffers back to the pool, which outlives us. The
        // queues are closed (in ERROR) by now and take no more receives.
        if let RecvBufs::Shared(pool) = &self.recv {
            let cq = self.recv_cq.get_mut();
            let mut wc = [Completion::default(); MAX_REPOST_BATCH];
            while let Ok(n @ 1..) = cq.poll(&mut wc) {
                for c in &wc[..n] {
                    if pool.is_buf(c.wr_id) {
                        pool.note_taken();
                        pool.give_back(c.wr_id as u32);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::tx_ctx::Event;
    use bypass_sim::{Engine, Fabric};

    fn sizes() -> Sizes {
        Sizes {
            queues: 2,
            send_depth: 4,
            recv_depth: 4,
            msg_size: 256,
            repost_batch: 1,
            queue_config: crate::hal::QueueConfig::default(),
        }
    }

    /// Send buffers are registered a chunk at a time, as contexts are first handed out: an
    /// endpoint whose calls never overlap keeps only the first chunk; one with more contexts in
    /// use registers more, once, and each context's buffer is its own.
    #[test]
    fn send_buffers_are_registered_a_chunk_at_a_time() {
        let fabric = Fabric::new(Engine::Inline);
        let nic = fabric.add_nic();
        let s = Sizes { queues: 2, send_depth: 10, ..sizes() };
        let ep = Endpoint::new(&nic, s).expect("endpoint");
        let recv = (2 * 4 * 256) as u64;
        let chunk = (SEND_CHUNK * 256) as u64;
        assert_eq!(ep.registered(), recv + chunk, "the first chunk only");
        let mode = crate::core::tx_ctx::CallMode::EarlyRsp;
        for _ in 0..100 {
            let tx = ep.get_tx(mode, 0).unwrap().expect("a context");
            let _ = ep.discard_tx(tx);
        }
        assert_eq!(ep.registered(), recv + chunk, "one context at a time reuses the first chunk");
        let mut held: Vec<TxToken> =
            (0..20).map(|_| ep.get_tx(mode, 0).unwrap().expect("a context")).collect();
        assert!(ep.get_tx(mode, 0).unwrap().is_none(), "20 contexts in all");
        assert_eq!(ep.registered(), recv + 20 * 256, "all three chunks (8 + 8 + 4 contexts)");
        for (i, tx) in held.iter_mut().enumerate() {
            ep.send_buf(tx).fill(i as u8);
        }
        for (i, tx) in held.iter_mut().enumerate() {
            let buf = ep.send_buf(tx);
            assert!(buf.iter().all(|&b| b == i as u8), "context {i}'s buffer is its own");
        }
        for tx in held {
            assert!(ep.discard_tx(tx).expect("live").is_released());
        }
        assert_eq!(ep.tx.in_use(), 0);
    }

    /// The callers' cue to reap send completions before a chunk is registered on the call path:
    /// raised exactly while every registered context is in use, and never once all are registered.
    #[test]
    fn tx_would_grow_only_when_every_registered_context_is_in_use() {
        let fabric = Fabric::new(Engine::Inline);
        let nic = fabric.add_nic();
        let ep = Endpoint::new(&nic, Sizes { queues: 2, send_depth: 10, ..sizes() }).expect("endpoint");
        let mode = crate::core::tx_ctx::CallMode::EarlyRsp;
        let mut held = Vec::new();
        for n in 0..20 {
            // 8 and 16 in use: the registered chunks are full, the next context is a new chunk's.
            let full = n == SEND_CHUNK || n == 2 * SEND_CHUNK;
            assert_eq!(ep.tx_would_grow(), full, "{n} contexts in use");
            held.push(ep.get_tx(mode, 0).unwrap().expect("a context"));
        }
        assert!(!ep.tx_would_grow(), "every chunk is registered: nothing left to grow");
        // One context back: the next one handed out is it, registered.
        let _ = ep.discard_tx(held.pop().unwrap());
        assert!(!ep.tx_would_grow());
    }

    /// Two connected endpoints on `engine`.
    fn pair(fabric: &Fabric) -> (Endpoint<bypass_sim::SimNic>, Endpoint<bypass_sim::SimNic>) {
        let (na, nb) = (fabric.add_nic(), fabric.add_nic());
        let a = Endpoint::new(&na, sizes()).expect("endpoint a");
        let b = Endpoint::new(&nb, sizes()).expect("endpoint b");
        a.connect(&b.infos()).expect("connect a");
        b.connect(&a.infos()).expect("connect b");
        (a, b)
    }

    /// Every send completion of `ep`'s send CQ, each preceded by the unsignaled sends its batch
    /// retires, as `(wr_id, status, signaled)` in the order they are reported.
    fn reap(ep: &Endpoint<bypass_sim::SimNic>) -> Vec<(u64, crate::hal::Status, bool)> {
        let mut seen = Vec::new();
        let mut wc = [std::mem::MaybeUninit::uninit(); 8];
        loop {
            let (done, _) = ep.poll_send(&mut wc, false);
            if done.is_empty() {
                return seen;
            }
            for c in done {
                ep.unsignaled_before(c, |p| seen.push((p.wr_id, p.status, false)));
                seen.push((c.wr_id, c.status, true));
            }
        }
    }

    /// Posts a batch of three 16-byte sends on queue 0 with one doorbell; their handles.
    fn post_three(a: &Endpoint<bypass_sim::SimNic>) -> Vec<TxHandle> {
        let mode = crate::core::tx_ctx::CallMode::EarlyRsp;
        let mut list = SendList::default();
        let mut hs = Vec::new();
        for _ in 0..3 {
            let tx = a.get_tx(mode, 0).unwrap().expect("a context");
            hs.push(tx.handle());
            list.push(tx, 16);
        }
        a.post_sends(0, &mut list).expect("post");
        assert!(list.is_empty(), "a post spends the list's tokens");
        hs
    }

    /// Selective signaling: a batch of three sends makes one send completion (the last one's),
    /// and handling it reports the other two as sent, oldest first, so every context of the
    /// batch goes back to the slab exactly once.
    #[test]
    fn a_batch_completes_once_and_retires_its_unsignaled_sends_in_order() {
        let fabric = Fabric::new(Engine::Stepped { seed: 31 });
        let (a, _b) = pair(&fabric);
        let mode = crate::core::tx_ctx::CallMode::EarlyRsp;
        let hs = post_three(&a);
        fabric.run_until_idle();
        let seen = reap(&a);
        let ok = crate::hal::Status::Success;
        let want: Vec<_> = hs.iter().enumerate().map(|(i, h)| (h.to_u64(), ok, i == 2)).collect();
        assert_eq!(seen, want, "one completion, the batch's earlier sends retired before it");
        for (wr_id, _, _) in seen {
            assert!(a.tx.complete(TxHandle::from_u64(wr_id), Event::SendCqe).expect("live").is_released());
        }
        assert_eq!(a.tx.in_use(), 0);
        // A lone send after the batch retires nothing but itself.
        let tx = a.get_tx(mode, 0).unwrap().expect("a context");
        let h = tx.handle();
        a.post_send(1, tx, 16).expect("post");
        fabric.run_until_idle();
        assert_eq!(reap(&a), vec![(h.to_u64(), ok, true)]);
    }

    /// A batch flushed by its queue's failure: each send completes on its own (flushed), and
    /// none is also reported by a walk from a later one (which could report a context already
    /// released and handed to another call).
    #[test]
    fn a_flushed_batch_reports_each_send_once() {
        let fabric = Fabric::new(Engine::Stepped { seed: 31 });
        let (a, _b) = pair(&fabric);
        let hs = post_three(&a);
        a.fail_queue(0);
        fabric.run_until_idle();
        let seen = reap(&a);
        let flushed = crate::hal::Status::Flushed;
        let want: Vec<_> = hs.iter().map(|h| (h.to_u64(), flushed, true)).collect();
        assert_eq!(seen, want, "three flushed completions, no walk");
    }

    /// Regression: a post on a failed queue was `Device(BadState)` whether the connection was
    /// closed or one queue had failed. It is `Queue(Flushed)` for a failed queue of an open
    /// connection and `Closed` once the connection is closed.
    #[test]
    fn post_on_a_failed_queue_says_failed_queue_or_closed() {
        let fabric = Fabric::new(Engine::Inline);
        let (na, nb) = (fabric.add_nic(), fabric.add_nic());
        let a = Endpoint::new(&na, sizes()).expect("endpoint a");
        let b = Endpoint::new(&nb, sizes()).expect("endpoint b");
        a.connect(&b.infos()).expect("connect a");
        b.connect(&a.infos()).expect("connect b");
        let tx =
            a.get_tx(crate::core::tx_ctx::CallMode::EarlyRsp, 0).expect("registered").expect("a context");
        a.check_ready(1).expect("queue 1 is READY");
        a.fail_queue(0);
        let mut tx = match a.post_send(0, tx, 16) {
            Err(Unposted { tx, error: RpcError::Queue(crate::hal::Status::Flushed) }) => tx,
            other => panic!("a post on a failed queue of an open connection: {other:?}"),
        };
        assert!(a.check_ready(1).is_ok(), "the other queue is unaffected");
        assert!(a.mark_closed());
        assert!(!a.mark_closed(), "only the first close counts");
        a.fail_queue(1);
        for q in 0..2 {
            tx = match a.post_send(q, tx, 16) {
                Err(Unposted { tx, error: RpcError::Closed }) => tx,
                other => panic!("a post on queue {q} of a closed connection: {other:?}"),
            };
        }
        assert!(a.discard_tx(tx).expect("the unposted context is still live").is_released());
        assert_eq!(a.tx.in_use(), 0, "nothing leaked");
    }
}
