//! One side of a connection: its queues, completion queues, send contexts and message buffers.
//!
//! Both the client's [`Channel`](crate::Channel) and the server's per-client connection are an
//! `Endpoint` plus their own logic. Memory is laid out so that ownership follows the protocol and
//! needs no bookkeeping on the hot path:
//!
//! - **send buffers**: one registered region of `tx_capacity × msg_size` bytes; send context `i`
//!   (see [`crate::tx_ctx`]) owns bytes `i × msg_size ..`. Whoever holds a live context writes
//!   its buffer; the context is released only after the send completion, so the NIC never reads
//!   a buffer that is being rewritten.
//! - **receive buffers**: one registered region of `queues × recv_depth × msg_size` bytes;
//!   buffer `b` belongs to queue `b / recv_depth` and is posted with `wr_id = b`. A buffer is
//!   either posted or owned by exactly one party (the poller that took its completion, or a
//!   server [`Request`](crate::Request)), which re-posts it when done.
//!
//! Sends and receives complete on two separate completion queues, as in URPC (and as on
//! hardware, the order between them is not defined): the send CQ and the receive CQ.
//!
//! Every queue and CQ is behind a mutex because the HAL's post and poll take `&mut self`. A poll
//! uses `try_lock`: if another thread is polling, it is delivering for everyone, so the caller
//! moves on. Uncontended, a mutex is one compare-exchange to take and one to give back.

use crate::hal::{
    Access, Completion, CompletionQueue, Device, MemoryRegion, Queue, QueueConfig, QueueInfo, QueueState,
    RecvWr, SendWr, Sge,
};
use crate::tx_ctx::{TxHandle, TxSlab};
use crate::RpcError;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

/// Locks a mutex; a poisoned mutex (a thread panicked while holding it) is still usable here
/// because every critical section leaves its data consistent before anything can panic.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One queue of an endpoint.
pub(crate) struct QueueSlot<Q> {
    pub(crate) q: Mutex<Q>,
    pub(crate) qpn: u32,
    /// Cleared for good once the queue fails (an error completion, or a flush).
    pub(crate) ready: AtomicBool,
    /// Receive buffers given back but not re-posted yet (see [`Endpoint::repost`]).
    deferred: Mutex<Deferred>,
}

/// Most receive buffers re-posted with one doorbell.
pub(crate) const MAX_REPOST_BATCH: usize = 16;

#[derive(Default)]
struct Deferred {
    bufs: [u32; MAX_REPOST_BATCH],
    len: usize,
}

/// Sizes of an endpoint.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sizes {
    pub(crate) queues: usize,
    pub(crate) send_depth: u32,
    pub(crate) recv_depth: u32,
    pub(crate) msg_size: usize,
    /// Receive buffers re-posted together (1..=[`MAX_REPOST_BATCH`]). The receive depth must
    /// exceed what the peer may have outstanding by this much: up to `repost_batch - 1` buffers
    /// wait to be re-posted at any time.
    pub(crate) repost_batch: usize,
    pub(crate) queue_config: QueueConfig,
}

pub(crate) struct Endpoint<D: Device> {
    pub(crate) device: D,
    pub(crate) send_cq: Mutex<D::Cq>,
    pub(crate) recv_cq: Mutex<D::Cq>,
    pub(crate) queues: Box<[QueueSlot<D::Queue>]>,
    pub(crate) tx: TxSlab,
    send_region: D::Region,
    recv_region: D::Region,
    pub(crate) msg_size: usize,
    recv_depth: u32,
    repost_batch: usize,
}

impl<D: Device + Clone> Endpoint<D> {
    pub(crate) fn new(device: &D, s: Sizes) -> Result<Self, RpcError> {
        let caps = device.caps();
        if s.queues == 0 || s.queues > 256 {
            return Err(RpcError::InvalidArgument(format!("{} queues: use 1..=256", s.queues)));
        }
        if s.msg_size < 64 || s.msg_size as u64 > u64::from(caps.max_msg_size) {
            return Err(RpcError::InvalidArgument(format!(
                "message size {} out of range: use 64..={}",
                s.msg_size, caps.max_msg_size
            )));
        }
        let tx_capacity = s.queues * s.send_depth as usize;
        let recv_count = s.queues * s.recv_depth as usize;
        let cq_depth = |n: usize| u32::try_from(n + 1).unwrap_or(u32::MAX);
        let send_cq = device.create_cq(cq_depth(tx_capacity))?;
        let recv_cq = device.create_cq(cq_depth(recv_count))?;
        // Every send context may end up on one queue, so each send ring holds all of them: a
        // post then never finds its ring full (a context outlives its ring slot).
        if tx_capacity > caps.max_queue_depth as usize {
            return Err(RpcError::InvalidArgument(format!(
                "{tx_capacity} send contexts exceed the device's queue depth {}: use fewer queues or a smaller window",
                caps.max_queue_depth
            )));
        }
        let config = {
            let mut c = s.queue_config;
            c.send_depth = tx_capacity as u32;
            c.recv_depth = s.recv_depth;
            c.max_send_sge = 1;
            c.max_recv_sge = 1;
            c
        };
        let mut queues = Vec::with_capacity(s.queues);
        for _ in 0..s.queues {
            let q = device.create_queue(&config, &send_cq, &recv_cq)?;
            queues.push(QueueSlot {
                qpn: q.qpn(),
                q: Mutex::new(q),
                ready: AtomicBool::new(false),
                deferred: Mutex::default(),
            });
        }
        let tx =
            TxSlab::new(tx_capacity).map_err(|e| RpcError::InvalidArgument(format!("send contexts: {e}")))?;
        let send_region = device.register(tx_capacity * s.msg_size, Access::LOCAL_WRITE)?;
        let recv_region = device.register(recv_count * s.msg_size, Access::LOCAL_WRITE)?;
        Ok(Endpoint {
            device: device.clone(),
            send_cq: Mutex::new(send_cq),
            recv_cq: Mutex::new(recv_cq),
            queues: queues.into_boxed_slice(),
            tx,
            send_region,
            recv_region,
            msg_size: s.msg_size,
            recv_depth: s.recv_depth,
            repost_batch: s.repost_batch.clamp(1, MAX_REPOST_BATCH),
        })
    }

    /// What the peer needs to connect to each of our queues, in order.
    pub(crate) fn infos(&self) -> Vec<QueueInfo> {
        self.queues.iter().map(|q| lock(&q.q).info()).collect()
    }

    /// Connects queue `i` to `peers[i]` and fills its receive queue.
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
            for b in 0..self.recv_depth {
                self.post_recv_locked(&mut q, i as u32 * self.recv_depth + b)?;
            }
            slot.ready.store(true, Ordering::Release);
        }
        Ok(())
    }

    /// The queue index of a queue number.
    pub(crate) fn queue_index(&self, qpn: u32) -> Option<usize> {
        self.queues.iter().position(|q| q.qpn == qpn)
    }

    /// The queue a receive buffer belongs to.
    pub(crate) fn queue_of_buf(&self, buf: u32) -> usize {
        (buf / self.recv_depth) as usize
    }

    /// Whether `buf` names a receive buffer of this endpoint.
    pub(crate) fn is_buf(&self, wr_id: u64) -> bool {
        wr_id < (self.queues.len() as u64) * u64::from(self.recv_depth)
    }

    fn post_recv_locked(&self, q: &mut D::Queue, buf: u32) -> Result<(), RpcError> {
        let sge = self.recv_region.sge(buf as usize * self.msg_size, self.msg_size)?;
        q.post_recv(&[RecvWr { wr_id: u64::from(buf), sges: &[sge] }])?;
        Ok(())
    }

    /// Gives receive buffer `buf` back to its queue. Buffers are collected and re-posted
    /// `repost_batch` at a time, with one doorbell (the receive depth has that much slack over
    /// the peer's window, so the peer never finds the queue empty). On a failed queue the buffer
    /// simply stays with us: nothing will be received there any more.
    pub(crate) fn repost(&self, buf: u32) {
        let slot = &self.queues[self.queue_of_buf(buf)];
        if !slot.ready.load(Ordering::Acquire) {
            return;
        }
        let mut batch = [0u32; MAX_REPOST_BATCH];
        let n = {
            let mut d = lock(&slot.deferred);
            let len = d.len;
            d.bufs[len] = buf;
            d.len += 1;
            if d.len < self.repost_batch {
                return;
            }
            batch[..d.len].copy_from_slice(&d.bufs[..d.len]);
            std::mem::take(&mut d.len)
        };
        let mut sges = [Sge::new(0, 0, 0); MAX_REPOST_BATCH];
        for (sge, &b) in sges.iter_mut().zip(&batch[..n]) {
            match self.recv_region.sge(b as usize * self.msg_size, self.msg_size) {
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
        }
    }

    /// The first `len` bytes of receive buffer `buf`.
    ///
    /// # Safety
    /// The caller owns `buf`: its completion was polled and it has not been re-posted, and it
    /// keeps owning it while the returned slice lives.
    pub(crate) unsafe fn recv_bytes(&self, buf: u32, len: usize) -> &[u8] {
        let len = len.min(self.msg_size);
        let off = buf as usize * self.msg_size;
        assert!(off + len <= self.recv_region.len(), "receive buffer {buf} out of range");
        // SAFETY: in bounds (asserted); the region has no remote access and the buffer is not
        // posted (caller's contract), so neither the NIC nor anyone else writes these bytes
        // while the slice lives. The region outlives `&self`.
        unsafe { std::slice::from_raw_parts(self.recv_region.as_ptr().add(off), len) }
    }

    /// The send buffer of send context `tx`.
    ///
    /// # Safety
    /// The caller holds the live context `tx`, has not posted it yet, and creates no other
    /// reference to this buffer while the returned one lives.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn send_buf(&self, tx: TxHandle) -> &mut [u8] {
        let off = tx.index as usize * self.msg_size;
        assert!(off + self.msg_size <= self.send_region.len(), "send buffer {} out of range", tx.index);
        // SAFETY: in bounds (asserted). A context owns its buffer exclusively from `get` to its
        // release, and the NIC reads it only between the post and the send completion, which
        // comes before the release (caller's contract: not posted yet). The region has no
        // remote access and outlives `&self`.
        unsafe { std::slice::from_raw_parts_mut(self.send_region.as_ptr().add(off), self.msg_size) }
    }

    /// Posts the first `len` bytes of `tx`'s send buffer as a signaled SEND on queue `q`.
    pub(crate) fn post_send(&self, q: usize, tx: TxHandle, len: usize) -> Result<(), RpcError> {
        let slot = &self.queues[q];
        self.check_ready(q)?;
        let sge = self.send_region.sge(tx.index as usize * self.msg_size, len)?;
        let mut queue = lock(&slot.q);
        queue.post_send(&[SendWr::send(tx.to_u64(), &[sge])])?;
        Ok(())
    }

    /// Posts several sends on queue `q` with one doorbell: `(context, length)` pairs, at most
    /// [`MAX_REPOST_BATCH`]. All or nothing.
    pub(crate) fn post_sends(&self, q: usize, items: &[(TxHandle, u32)]) -> Result<(), RpcError> {
        let items = &items[..items.len().min(MAX_REPOST_BATCH)];
        self.check_ready(q)?;
        let mut sges = [Sge::new(0, 0, 0); MAX_REPOST_BATCH];
        for (sge, (tx, len)) in sges.iter_mut().zip(items) {
            *sge = self.send_region.sge(tx.index as usize * self.msg_size, *len as usize)?;
        }
        let wrs: [SendWr<'_>; MAX_REPOST_BATCH] = std::array::from_fn(|i| {
            let wr_id = items.get(i).map_or(0, |(tx, _)| tx.to_u64());
            SendWr::send(wr_id, std::slice::from_ref(&sges[i]))
        });
        lock(&self.queues[q].q).post_send(&wrs[..items.len()])?;
        Ok(())
    }

    /// Refuses to post on a queue the endpoint has failed (or that failed under it): the hal
    /// accepts posts to a queue in ERROR and flushes them, as hardware does, but a message posted
    /// there can only fail, so the caller learns it now.
    fn check_ready(&self, q: usize) -> Result<(), RpcError> {
        if self.queues[q].ready.load(Ordering::Acquire) {
            Ok(())
        } else {
            Err(RpcError::Device(bypass_hal::Error::BadState {
                state: QueueState::Error,
                op: "post_send",
                needs: "READY",
            }))
        }
    }

    /// Polls the send CQ if no other thread is polling it.
    pub(crate) fn poll_send(&self, out: &mut [Completion]) -> usize {
        Self::poll_cq(&self.send_cq, out)
    }

    /// Polls the receive CQ if no other thread is polling it.
    pub(crate) fn poll_recv(&self, out: &mut [Completion]) -> usize {
        Self::poll_cq(&self.recv_cq, out)
    }

    fn poll_cq(cq: &Mutex<D::Cq>, out: &mut [Completion]) -> usize {
        let Ok(mut cq) = cq.try_lock() else { return 0 };
        // A CQ overflow means the device dropped completions: the queues behind it cannot be
        // trusted any more. Sizes here make it impossible (CQ depth > everything postable).
        cq.poll(out).unwrap_or(0)
    }

    /// Marks queue `q` failed and moves it to ERROR (which flushes what it still holds).
    pub(crate) fn fail_queue(&self, q: usize) {
        let slot = &self.queues[q];
        slot.ready.store(false, Ordering::Release);
        let mut queue = lock(&slot.q);
        if queue.state() != QueueState::Error {
            let _ = queue.set_error();
        }
    }

    /// Number of queues still READY.
    pub(crate) fn ready_queues(&self) -> usize {
        self.queues.iter().filter(|q| q.ready.load(Ordering::Acquire)).count()
    }
}
