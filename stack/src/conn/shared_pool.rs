//! The server's shared receive pool: one registered region of receive buffers posted to one
//! [`SharedRecv`](crate::hal::SharedRecv), from which every connection's queues take their
//! requests (instead of each queue keeping `window + B` buffers of its own).
//!
//! Buffer `b` is bytes `b × msg_size ..` of the region and is posted with `wr_id = b`. A receive
//! completion of a connection's queue names the buffer by its `wr_id` and the queue by its qpn
//! (the hal contract: shared receives complete on the queue's own receive CQ). As with
//! per-connection buffers, a buffer is in exactly one place: posted to the shared queue, owned
//! (by the poller that took its completion, or a server `Request`), or waiting here to be
//! re-posted ([`SharedPool::give_back`]). A failed or reset queue does not flush the shared
//! queue, so nothing posted here is lost or posted twice by a queue recovery; a receive the
//! failing queue had already taken completes on it (`Flushed`) and comes back like any other.
//!
//! Buffers go back `batch` at a time, one doorbell per batch, `batch` ≤ a quarter of the pool,
//! but only while at least `batch` buffers are posted: when fewer are (by the count of posts and
//! completions taken), a buffer given back is posted at once, and a completion taken flushes
//! what waits. So a pool that runs low never keeps buffers back, and every buffer can be in use. Credits stay per connection: when more requests arrive at
//! once than buffers are posted, the server's NIC answers RNR and the client's NIC retries
//! (`rnr_retry = 7`, the default, retries forever; see docs/protocol.md §3 "Shared receive pool").

use crate::conn::bufs::RecvBuf;
use crate::hal::{Access, Device, MemoryRegion, RecvWr, Sge, SharedRecv};
use crate::limits::MAX_REPOST_BATCH;
use crate::sync::{lock, SpinLock};
use crate::RpcError;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

pub(crate) struct SharedPool<D: Device> {
    srq: SpinLock<D::SharedRecv>,
    region: D::Region,
    msg_size: usize,
    buffers: u32,
    batch: usize,
    /// Buffers given back and not posted yet. Its capacity is the pool size, so it never
    /// reallocates: a buffer a failed post leaves here is retried with the next batch.
    waiting: SpinLock<Vec<u32>>,
    /// `waiting`'s length, read without its lock by [`SharedPool::note_taken`].
    waiting_len: AtomicUsize,
    /// Receives posted to the shared queue, ever.
    posted: AtomicU64,
    /// Receive completions taken (successful or not), ever.
    taken: AtomicU64,
    /// Completions that took the last posted buffer (see [`SharedPool::dry`]).
    dry: AtomicU64,
}

impl<D: Device> SharedPool<D> {
    /// Registers `buffers` buffers of `msg_size` bytes on `device`, creates the shared receive
    /// queue and posts them all. `Err(hal Unsupported)` (wrapped) on a device without shared
    /// receive queues.
    pub(crate) fn new(device: &D, buffers: u32, msg_size: usize) -> Result<Self, crate::hal::Error> {
        let srq = device.create_shared_recv(buffers, 1)?;
        let region = device.register(buffers as usize * msg_size, Access::LOCAL_WRITE)?;
        let pool = SharedPool {
            srq: SpinLock::new(srq),
            region,
            msg_size,
            buffers,
            batch: (buffers as usize / 4).clamp(1, MAX_REPOST_BATCH),
            waiting: SpinLock::new(Vec::with_capacity(buffers as usize)),
            waiting_len: AtomicUsize::new(0),
            posted: AtomicU64::new(0),
            taken: AtomicU64::new(0),
            dry: AtomicU64::new(0),
        };
        let mut b = 0u32;
        while b < buffers {
            let n = (buffers - b).min(MAX_REPOST_BATCH as u32);
            let mut ids = [0u32; MAX_REPOST_BATCH];
            for (i, id) in ids[..n as usize].iter_mut().enumerate() {
                *id = b + i as u32;
            }
            pool.post(&ids[..n as usize])?;
            b += n;
        }
        Ok(pool)
    }

    /// Buffers in the pool.
    pub(crate) fn buffers(&self) -> u32 {
        self.buffers
    }

    /// Bytes registered for the pool.
    pub(crate) fn registered(&self) -> u64 {
        self.region.len() as u64
    }

    /// Whether `wr_id` names a buffer of the pool.
    #[inline]
    pub(crate) fn is_buf(&self, wr_id: u64) -> bool {
        wr_id < u64::from(self.buffers)
    }

    /// Counts a receive completion taken from a queue of the pool.
    #[inline]
    pub(crate) fn note_taken(&self) {
        let taken = self.taken.fetch_add(1, Ordering::AcqRel) + 1;
        let posted = self.posted.load(Ordering::Acquire);
        if posted <= taken {
            self.dry.fetch_add(1, Ordering::Relaxed);
        }
        if posted.saturating_sub(taken) < self.batch as u64 && self.waiting_len.load(Ordering::Acquire) > 0 {
            self.flush();
        }
    }

    /// Buffers posted and not yet taken, by the counts (completions not polled yet count as
    /// posted).
    fn outstanding(&self) -> u64 {
        self.posted.load(Ordering::Acquire).saturating_sub(self.taken.load(Ordering::Acquire))
    }

    /// How many receive completions found no other buffer posted: each means senders may have
    /// met RNR NAKs (and retried) until buffers came back. Counted without a lock, so under
    /// concurrency it is close, not exact.
    pub(crate) fn dry(&self) -> u64 {
        self.dry.load(Ordering::Relaxed)
    }

    /// The first `len` bytes (at most the message size) of buffer `buf`, for as long as `buf` is
    /// borrowed.
    pub(crate) fn bytes<'a>(&'a self, buf: &'a RecvBuf, len: usize) -> &'a [u8] {
        let len = len.min(self.msg_size);
        let off = buf.index() as usize * self.msg_size;
        assert!(off + len <= self.region.len(), "shared receive buffer {} out of range", buf.index());
        // SAFETY: in bounds (asserted). A `RecvBuf` of the pool is minted once per completion of
        // its buffer, by the receive poll of an endpoint on this pool, and is neither `Copy` nor
        // `Clone`; the buffer comes back here (`give_back`) only when that `RecvBuf` is spent,
        // which cannot happen while it is borrowed. So the buffer is not posted while the slice
        // lives: neither the NIC nor another owner writes these bytes. The region has no remote
        // access and outlives `&self`.
        unsafe { std::slice::from_raw_parts(self.region.as_ptr().add(off), len) }
    }

    /// Gives buffer `buf` back: it is posted to the shared queue with the next full batch, or
    /// at once if fewer than a batch are posted.
    pub(crate) fn give_back(&self, buf: u32) {
        debug_assert!(buf < self.buffers);
        {
            let mut w = lock(&self.waiting);
            w.push(buf);
            self.waiting_len.store(w.len(), Ordering::Release);
            if w.len() < self.batch && self.outstanding() >= self.batch as u64 {
                return;
            }
        }
        self.flush();
    }

    /// Posts what waits (up to [`MAX_REPOST_BATCH`]) with one doorbell.
    fn flush(&self) {
        let mut batch = [0u32; MAX_REPOST_BATCH];
        let n = {
            let mut w = lock(&self.waiting);
            let n = w.len().min(MAX_REPOST_BATCH);
            let from = w.len() - n;
            batch[..n].copy_from_slice(&w[from..]);
            w.truncate(from);
            self.waiting_len.store(w.len(), Ordering::Release);
            n
        };
        if n > 0 && self.post(&batch[..n]).is_err() {
            // Kept for the next batch (a device that refuses posts is failing anyway).
            let mut w = lock(&self.waiting);
            w.extend_from_slice(&batch[..n]);
            self.waiting_len.store(w.len(), Ordering::Release);
        }
    }

    /// Posts `bufs` (at most [`MAX_REPOST_BATCH`]) to the shared queue with one doorbell.
    fn post(&self, bufs: &[u32]) -> Result<(), crate::hal::Error> {
        let n = bufs.len().min(MAX_REPOST_BATCH);
        let mut sges = [Sge::new(0, 0, 0); MAX_REPOST_BATCH];
        for (sge, &b) in sges.iter_mut().zip(&bufs[..n]) {
            *sge = self.region.sge(b as usize * self.msg_size, self.msg_size)?;
        }
        let wrs: [RecvWr<'_>; MAX_REPOST_BATCH] = std::array::from_fn(|i| RecvWr {
            wr_id: bufs.get(i).map_or(0, |&b| u64::from(b)),
            sges: std::slice::from_ref(&sges[i]),
        });
        let mut srq = lock(&self.srq);
        srq.post_recv(&wrs[..n])?;
        self.posted.fetch_add(n as u64, Ordering::AcqRel);
        Ok(())
    }

    /// Runs `f` with the shared receive queue (to create a queue on it).
    pub(crate) fn with_srq<R>(&self, f: impl FnOnce(&D::SharedRecv) -> R) -> R {
        f(&lock(&self.srq))
    }
}

/// How a config's pool size becomes the pool's: at most what `memory_limit` holds of
/// `msg_size`-byte buffers, what the device's shared queue and largest registration allow
/// (at least 1).
pub(crate) fn fitted_buffers(
    buffers: u32,
    msg_size: usize,
    memory_limit: u64,
    caps: &crate::hal::DeviceCaps,
) -> u32 {
    let by_memory = memory_limit / msg_size.max(1) as u64;
    let by_region = caps.max_region_size / msg_size.max(1) as u64;
    let fitted = u64::from(buffers).min(by_memory).min(by_region).min(u64::from(caps.max_shared_recv_depth));
    fitted.max(1) as u32
}

/// An [`RpcError`] for a pool that could not be set up.
pub(crate) fn pool_error(e: crate::hal::Error) -> RpcError {
    RpcError::InvalidArgument(format!(
        "the shared receive pool (ServerConfig.recv_buffers) could not be set up: {e}; use \
         RecvBuffers::PerConnection or fewer buffers"
    ))
}
