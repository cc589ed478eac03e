//! # buf_pool: fixed-size buffers carved from one registered region
//!
//! Messages are sent from, and received into, registered memory. Registering is slow (a system
//! call and a key-table entry per region), so the stack registers **one** region per pool up front
//! and carves it into `count = region.len() / buf_size` buffers of `buf_size` bytes; buffer `i`
//! is the range `i * buf_size .. (i + 1) * buf_size` (a tail shorter than one buffer is unused).
//!
//! - [`BufPool::get`] hands out a free buffer as a [`Buf`] guard, or `None` when all are in use
//!   (the caller backs off: EAGAIN). Lock-free (the crate's tagged free list), no allocation.
//! - Dropping the [`Buf`] returns it to the pool: exactly once, because the guard is the only
//!   owner. Like ixy's packet buffers, nothing has to remember to free it.
//! - [`Buf::sge`] gives the bounds-checked scatter/gather entry to post it;
//!   [`Buf::write`] and [`Buf::read`] copy in and out, bounds-checked against the buffer.
//!
//! ## Posting a buffer and getting it back: tokens
//!
//! A posted receive outlives any borrow: its buffer comes back when a completion names its
//! `wr_id`, possibly on another thread. [`Buf::into_token`] turns the guard into a
//! [`BufToken`] (`Copy`, packs into the `wr_id` with [`BufToken::to_u64`]) without returning the
//! buffer, and [`BufPool::from_token`] turns the token back into a guard. This is safe and
//! checked: each slot has a state word `generation << 32 | state`,
//!
//! ```text
//!   FREE(g) ──get──► HELD(g) ──into_token──► POSTED(g) ──from_token({i, g}): one CAS──► HELD(g)
//!      ▲                │
//!      └── FREE(g+1) ◄──┘ drop (then pushed on the free list)
//! ```
//!
//! so `from_token` succeeds once per `into_token`, and a stale token (already recovered, its
//! buffer since reused, or a bogus `wr_id`) is refused with [`PoolError::StaleToken`] or
//! [`PoolError::InvalidToken`], never handed a buffer somebody else holds. Generations are 32 bits:
//! a token kept across 2^32 reuses of its slot would be taken for current.
//!
//! **Call [`Buf::into_token`] before posting**, not after: once the receive is posted its
//! completion may be polled on another thread, which must find the slot `POSTED`. If the post
//! fails, recover the buffer with [`BufPool::from_token`] (and drop it).
//!
//! ## Memory
//!
//! The bytes are shared with the NIC (see `bypass_hal`'s `mr` module): while a buffer is posted
//! as a receive, the device may write it, so read it only after its completion, and do not drop a
//! guard whose buffer is still posted (turn it into a token instead). Dropping the pool drops the
//! region, which deregisters it before freeing its memory, so a receive still posted then fails
//! with a protection error instead of writing freed memory.

use std::fmt;
use std::mem::ManuallyDrop;

use bypass_hal::{MemoryRegion, Sge};

use crate::core::free_list::FreeList;
#[cfg(loom)]
use crate::sync::mutation::{self, Mutant};
use crate::sync::{AtomicU64, AtomicUsize, Ordering};

/// Most buffers one pool holds (16 Mi).
pub const MAX_BUFFERS: usize = 1 << 24;

/// Largest `buf_size`: one SGE describes at most `u32::MAX` bytes.
pub const MAX_BUF_SIZE: usize = u32::MAX as usize;

const FREE: u64 = 0;
const HELD: u64 = 1;
const POSTED: u64 = 2;

const fn pack(generation: u32, state: u64) -> u64 {
    ((generation as u64) << 32) | state
}

const fn generation_of(word: u64) -> u32 {
    (word >> 32) as u32
}

/// Why a pool operation failed. A failed operation changes nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PoolError {
    /// [`BufPool::new`] needs `1..=MAX_BUF_SIZE` bytes per buffer.
    #[error("buffer size {buf_size} is invalid: use 1..={max} bytes")]
    InvalidBufSize {
        /// The size asked for.
        buf_size: usize,
        /// [`MAX_BUF_SIZE`].
        max: usize,
    },
    /// The region cannot hold even one buffer.
    #[error("region of {region_len} bytes is smaller than one buffer of {buf_size} bytes: register at least one buffer's worth")]
    RegionTooSmall {
        /// The region's length.
        region_len: usize,
        /// The buffer size asked for.
        buf_size: usize,
    },
    /// The region holds more buffers than a pool manages.
    #[error("region holds {count} buffers, more than the {max} a pool manages: use a larger buffer size or a smaller region")]
    TooManyBuffers {
        /// `region.len() / buf_size`.
        count: usize,
        /// [`MAX_BUFFERS`].
        max: usize,
    },
    /// A range reaches past the end of the buffer.
    #[error("range {offset}..{offset}+{len} is outside the buffer of {buf_size} bytes")]
    OutOfBounds {
        /// Start of the range within the buffer.
        offset: usize,
        /// Length of the range.
        len: usize,
        /// The pool's buffer size.
        buf_size: usize,
    },
    /// The token's index is outside the pool: it came from another pool or is corrupted.
    #[error("{token} does not name a buffer of this pool ({capacity} buffers)")]
    InvalidToken {
        /// The refused token.
        token: BufToken,
        /// Buffers in the pool.
        capacity: usize,
    },
    /// The token's buffer is not posted under that generation: it was already recovered (maybe
    /// reused since), or the token is bogus. Nothing was handed out.
    #[error("{token} is stale: that buffer was already recovered or was never posted under this token")]
    StaleToken {
        /// The refused token.
        token: BufToken,
    },
}

/// Names a buffer that left the pool as a posted work request: `{index, generation}`. `Copy`;
/// recovered exactly once with [`BufPool::from_token`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BufToken {
    /// Buffer index in the pool (`0..capacity`).
    pub index: u32,
    /// The slot's generation when the token was made; bumped each time the buffer is freed.
    pub generation: u32,
}

crate::core::handle::generational_handle!(BufToken, "buffer");

/// A pool of `capacity()` buffers of `buf_size()` bytes carved from one registered region. See
/// the [module documentation](self).
pub struct BufPool<R: MemoryRegion> {
    region: R,
    buf_size: usize,
    /// Per buffer: `generation << 32 | FREE/HELD/POSTED`.
    slots: Box<[AtomicU64]>,
    free: FreeList,
    /// Free buffers, a hint: incremented before a buffer's push on the free list and decremented
    /// after its pop, so never below the true count and exact when no `get` or drop is in
    /// progress.
    available: AtomicUsize,
}

impl<R: MemoryRegion> fmt::Debug for BufPool<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BufPool")
            .field("buf_size", &self.buf_size)
            .field("capacity", &self.capacity())
            .field("available", &self.available())
            .field("region_addr", &format_args!("{:#x}", self.region.addr()))
            .field("lkey", &self.region.lkey())
            .finish()
    }
}

impl<R: MemoryRegion> BufPool<R> {
    /// Carves `region` into `region.len() / buf_size` buffers, all free. The region should have
    /// `Access::LOCAL_WRITE` if the buffers are to receive. On error the region is dropped
    /// (deregistered).
    pub fn new(region: R, buf_size: usize) -> Result<BufPool<R>, PoolError> {
        if buf_size == 0 || buf_size > MAX_BUF_SIZE {
            return Err(PoolError::InvalidBufSize { buf_size, max: MAX_BUF_SIZE });
        }
        let count = region.len() / buf_size;
        if count == 0 {
            return Err(PoolError::RegionTooSmall { region_len: region.len(), buf_size });
        }
        if count > MAX_BUFFERS {
            return Err(PoolError::TooManyBuffers { count, max: MAX_BUFFERS });
        }
        let free = FreeList::new(count).ok_or(PoolError::TooManyBuffers { count, max: MAX_BUFFERS })?;
        let slots = (0..count).map(|_| AtomicU64::new(pack(0, FREE))).collect();
        Ok(BufPool { region, buf_size, slots, free, available: AtomicUsize::new(count) })
    }

    /// Number of buffers.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Bytes per buffer.
    pub fn buf_size(&self) -> usize {
        self.buf_size
    }

    /// Free buffers right now (a snapshot; exact when no `get` or drop is in progress).
    pub fn available(&self) -> usize {
        self.available.load(Ordering::Relaxed).min(self.capacity())
    }

    /// Buffers out of the pool right now — held as [`Buf`]s or posted as [`BufToken`]s (a
    /// snapshot). Zero when idle: anything else is a leak.
    pub fn in_use(&self) -> usize {
        self.capacity() - self.available()
    }

    /// The registered region the buffers live in (its keys, its `remote()` descriptor).
    pub fn region(&self) -> &R {
        &self.region
    }

    /// Takes a free buffer, or `None` when every buffer is in use. Lock-free; allocates nothing.
    /// Its contents are whatever its previous user left.
    pub fn get(&self) -> Option<Buf<'_, R>> {
        let index = self.free.pop()?;
        self.available.fetch_sub(1, Ordering::Relaxed);
        // The free list only holds indices below capacity; `?` keeps this panic-free anyway.
        let slot = self.slots.get(index as usize)?;
        // Ours alone until dropped: off the free list, and `from_token` only moves POSTED slots.
        let generation = generation_of(slot.load(Ordering::Relaxed));
        slot.store(pack(generation, HELD), Ordering::Relaxed);
        Some(Buf { pool: self, index, generation })
    }

    /// Recovers the buffer a [`Buf::into_token`] turned into `token` (typically from a
    /// completion's `wr_id`). Succeeds once per token; a stale, repeated or bogus token is
    /// refused and nothing changes.
    pub fn from_token(&self, token: BufToken) -> Result<Buf<'_, R>, PoolError> {
        let Some(slot) = self.slots.get(token.index as usize) else {
            return Err(PoolError::InvalidToken { token, capacity: self.capacity() });
        };
        // MUTANT (loom twin only, see `sync::mutation`): check with a load, then store HELD.
        #[cfg(loom)]
        if mutation::enabled(Mutant::BufFromTokenLoadStore) {
            if slot.load(Ordering::Acquire) != pack(token.generation, POSTED) {
                return Err(PoolError::StaleToken { token });
            }
            slot.store(pack(token.generation, HELD), Ordering::Relaxed);
            return Ok(Buf { pool: self, index: token.index, generation: token.generation });
        }
        // Acquire: pairs with `into_token`'s release, so the recovering thread sees what the
        // poster wrote.
        match slot.compare_exchange(
            pack(token.generation, POSTED),
            pack(token.generation, HELD),
            Ordering::AcqRel,
            Ordering::Relaxed,
        ) {
            Ok(_) => Ok(Buf { pool: self, index: token.index, generation: token.generation }),
            Err(_) => Err(PoolError::StaleToken { token }),
        }
    }

    /// Byte offset of buffer `index` in the region. `index < capacity <= MAX_BUFFERS` and the
    /// region holds `capacity * buf_size` bytes, so this cannot overflow.
    fn offset_of(&self, index: u32) -> usize {
        index as usize * self.buf_size
    }

    /// Checks `offset..offset + len` against one buffer.
    fn check(&self, offset: usize, len: usize) -> Result<(), PoolError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.buf_size => Ok(()),
            _ => Err(PoolError::OutOfBounds { offset, len, buf_size: self.buf_size }),
        }
    }

    /// Returns a buffer from a dropped guard.
    fn put(&self, index: u32, generation: u32) {
        if let Some(slot) = self.slots.get(index as usize) {
            // Any token of this generation is stale from here on. The free list's push publishes
            // this store (and the user's writes) to the next `get`.
            slot.store(pack(generation.wrapping_add(1), FREE), Ordering::Relaxed);
            self.available.fetch_add(1, Ordering::Relaxed);
            self.free.push(index);
        }
    }
}

/// One buffer of a [`BufPool`], held exclusively; returned to the pool when dropped.
pub struct Buf<'a, R: MemoryRegion> {
    pool: &'a BufPool<R>,
    index: u32,
    generation: u32,
}

impl<R: MemoryRegion> fmt::Debug for Buf<'_, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Buf")
            .field("index", &self.index)
            .field("generation", &self.generation)
            .field("len", &self.pool.buf_size)
            .finish()
    }
}

impl<'a, R: MemoryRegion> Buf<'a, R> {
    /// The buffer's index in its pool (`0..capacity`).
    pub fn index(&self) -> u32 {
        self.index
    }

    /// The buffer's size in bytes (the pool's `buf_size`).
    pub fn len(&self) -> usize {
        self.pool.buf_size
    }

    /// Always false: a pool's buffers are at least one byte.
    pub fn is_empty(&self) -> bool {
        self.pool.buf_size == 0
    }

    /// Byte offset of the buffer's first byte in the pool's region.
    pub fn region_offset(&self) -> usize {
        self.pool.offset_of(self.index)
    }

    /// An SGE for the buffer's first `len` bytes, to post it (a SEND of `len` bytes, or a receive
    /// of up to `len`). Fails with [`PoolError::OutOfBounds`] if `len` exceeds the buffer.
    pub fn sge(&self, len: usize) -> Result<Sge, PoolError> {
        let out_of_bounds = PoolError::OutOfBounds { offset: 0, len, buf_size: self.pool.buf_size };
        self.pool.check(0, len)?;
        // In the region and at most MAX_BUF_SIZE bytes, so the region's own checks pass too.
        self.pool.region.sge(self.region_offset(), len).map_err(|_| out_of_bounds)
    }

    /// Copies `src` into the buffer at `offset`.
    pub fn write(&mut self, offset: usize, src: &[u8]) -> Result<(), PoolError> {
        self.pool.check(offset, src.len())?;
        let out_of_bounds = PoolError::OutOfBounds { offset, len: src.len(), buf_size: self.pool.buf_size };
        // SAFETY: buffers are disjoint ranges of the region and this guard is the only handle to
        // its buffer (`&mut self`: no other access through it either); a guard exists only while
        // its buffer is not posted (`into_token` gives it up before posting), so no work request
        // writes the range meanwhile.
        unsafe { self.pool.region.write_shared(self.region_offset() + offset, src) }
            .map_err(|_| out_of_bounds)
    }

    /// Copies `dst.len()` bytes at `offset` out of the buffer. Read a received buffer only after
    /// its completion.
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), PoolError> {
        self.pool.check(offset, dst.len())?;
        let out_of_bounds = PoolError::OutOfBounds { offset, len: dst.len(), buf_size: self.pool.buf_size };
        self.pool.region.read(self.region_offset() + offset, dst).map_err(|_| out_of_bounds)
    }

    /// Gives up the guard without returning the buffer, for posting it: the token goes in the
    /// `wr_id` and [`BufPool::from_token`] recovers the buffer when the completion names it. Call
    /// this *before* posting (see the module documentation). A token that is never recovered
    /// leaks its buffer (it shows in [`BufPool::in_use`]).
    pub fn into_token(self) -> BufToken {
        let this = ManuallyDrop::new(self);
        if let Some(slot) = this.pool.slots.get(this.index as usize) {
            // Release: pairs with `from_token`'s acquire.
            slot.store(pack(this.generation, POSTED), Ordering::Release);
        }
        BufToken { index: this.index, generation: this.generation }
    }
}

impl<R: MemoryRegion> Drop for Buf<'_, R> {
    fn drop(&mut self) {
        self.pool.put(self.index, self.generation);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::{Arc, Barrier};

    use bypass_hal::{
        Access, Completion, CompletionQueue, Device, Queue, QueueConfig, RecvWr, SendWr, Status,
    };
    use bypass_sim::{Engine, Fabric, SimRegion};

    use crate::test_rng::Rng;

    fn region(len: usize) -> SimRegion {
        let nic = Fabric::new(Engine::Inline).add_nic();
        nic.register(len, Access::LOCAL_WRITE).expect("register")
    }

    fn pool(count: usize, buf_size: usize) -> BufPool<SimRegion> {
        BufPool::new(region(count * buf_size), buf_size).expect("valid pool")
    }

    #[test]
    fn new_validates_sizes() {
        assert_eq!(
            BufPool::new(region(64), 0).err(),
            Some(PoolError::InvalidBufSize { buf_size: 0, max: MAX_BUF_SIZE })
        );
        assert_eq!(
            BufPool::new(region(100), 128).err(),
            Some(PoolError::RegionTooSmall { region_len: 100, buf_size: 128 })
        );
        assert_eq!(
            BufPool::new(region(MAX_BUFFERS + 1), 1).err(),
            Some(PoolError::TooManyBuffers { count: MAX_BUFFERS + 1, max: MAX_BUFFERS })
        );
        // The tail shorter than a buffer is unused.
        let p = BufPool::new(region(1000), 96).expect("valid pool");
        assert_eq!((p.capacity(), p.buf_size(), p.available(), p.in_use()), (10, 96, 10, 0));
        let one = BufPool::new(region(96), 96).expect("valid pool");
        assert_eq!(one.capacity(), 1);
        let msg = PoolError::RegionTooSmall { region_len: 1, buf_size: 2 }.to_string();
        assert!(msg.contains("smaller than one buffer"), "{msg}");
    }

    #[test]
    fn exhaustion_returns_none_and_drop_returns_the_slot() {
        let p = pool(4, 64);
        let bufs: Vec<_> = (0..4).map(|_| p.get().expect("free buffer")).collect();
        let mut idx: Vec<u32> = bufs.iter().map(Buf::index).collect();
        idx.sort_unstable();
        assert_eq!(idx, [0, 1, 2, 3]);
        assert!(p.get().is_none());
        assert!(p.get().is_none());
        assert_eq!((p.available(), p.in_use()), (0, 4));
        let mut bufs = bufs;
        let second = bufs.remove(1);
        let back = second.index();
        drop(second);
        assert_eq!((p.available(), p.in_use()), (1, 3));
        let again = p.get().expect("the dropped buffer");
        assert_eq!(again.index(), back);
        assert!(p.get().is_none());
        drop(again);
        drop(bufs);
        assert_eq!((p.available(), p.in_use()), (4, 0));
    }

    #[test]
    fn sge_read_and_write_are_bounds_checked() {
        let p = pool(3, 64);
        let _first = p.get().expect("free buffer");
        let mut b = p.get().expect("free buffer");
        assert_eq!((b.len(), b.is_empty(), b.region_offset()), (64, false, 64));
        let sge = b.sge(64).expect("whole buffer");
        assert_eq!((sge.addr, sge.len, sge.lkey), (p.region().addr() + 64, 64, p.region().lkey()));
        assert_eq!(b.sge(0).map(|s| s.len), Ok(0));
        assert_eq!(b.sge(65), Err(PoolError::OutOfBounds { offset: 0, len: 65, buf_size: 64 }));

        assert_eq!(b.write(62, &[1, 2]), Ok(()));
        assert_eq!(b.write(63, &[1, 2]), Err(PoolError::OutOfBounds { offset: 63, len: 2, buf_size: 64 }));
        assert!(b.write(usize::MAX, &[1]).is_err());
        assert_eq!(b.write(64, &[]), Ok(()));
        let mut two = [0u8; 2];
        assert_eq!(b.read(62, &mut two), Ok(()));
        assert_eq!(two, [1, 2]);
        assert!(b.read(63, &mut two).is_err());
        assert!(b.read(usize::MAX - 1, &mut two).is_err());
        // The write landed in this buffer's range of the region, nowhere else.
        let mut raw = [0u8; 2];
        p.region().read(64 + 62, &mut raw).expect("in region");
        assert_eq!(raw, [1, 2]);
    }

    #[test]
    fn buffers_do_not_overlap() {
        let p = pool(8, 32);
        let mut bufs: Vec<_> = std::iter::from_fn(|| p.get()).collect();
        assert_eq!(bufs.len(), 8);
        for b in &mut bufs {
            let i = b.index();
            b.write(0, &[i as u8 + 1; 32]).expect("in bounds");
        }
        for b in &bufs {
            let mut got = [0u8; 32];
            b.read(0, &mut got).expect("in bounds");
            assert_eq!(got, [b.index() as u8 + 1; 32]);
        }
    }

    #[test]
    fn tokens_recover_exactly_once() {
        let p = pool(2, 16);
        let mut b = p.get().expect("free buffer");
        b.write(0, b"posted").expect("in bounds");
        let index = b.index();
        let token = b.into_token();
        assert_eq!(token.index, index);
        assert_eq!(BufToken::from_u64(token.to_u64()), token);
        assert_eq!(BufToken::from(u64::from(token)), token);
        assert_eq!(p.in_use(), 1, "a posted buffer stays out of the pool");

        let back = p.from_token(token).expect("posted buffer");
        assert_eq!(back.index(), index);
        let mut got = [0u8; 6];
        back.read(0, &mut got).expect("in bounds");
        assert_eq!(&got, b"posted");
        // Held again: the same token cannot take it a second time.
        assert_eq!(p.from_token(token).err(), Some(PoolError::StaleToken { token }));
        drop(back);
        assert_eq!(p.from_token(token).err(), Some(PoolError::StaleToken { token }));
        assert_eq!(p.in_use(), 0);

        // Reused under a new generation: the old token still misses.
        let reused = p.get().expect("free buffer");
        assert_eq!(reused.index(), index);
        let newer = reused.into_token();
        assert_eq!(newer.generation, token.generation.wrapping_add(1));
        assert_eq!(p.from_token(token).err(), Some(PoolError::StaleToken { token }));
        let bogus = BufToken { index: 9, generation: 0 };
        assert_eq!(p.from_token(bogus).err(), Some(PoolError::InvalidToken { token: bogus, capacity: 2 }));
        let never = BufToken { index: 1, generation: 0 };
        assert_eq!(p.from_token(never).err(), Some(PoolError::StaleToken { token: never }));
        drop(p.from_token(newer).expect("posted buffer"));
        assert_eq!(p.in_use(), 0);
    }

    /// The use the tokens are for: post pool buffers as receives on a simulated NIC, send into
    /// them from a peer, and get each buffer back from its completion's `wr_id`.
    #[test]
    fn receive_buffers_come_back_by_wr_id() {
        let fabric = Fabric::new(Engine::Inline);
        let (nic_a, nic_b) = (fabric.add_nic(), fabric.add_nic());
        let cfg = QueueConfig::default();
        let (mut cq_a, mut cq_b) = (nic_a.create_cq(64).expect("cq"), nic_b.create_cq(64).expect("cq"));
        let mut qa = nic_a.create_queue(&cfg, &cq_a, &cq_a).expect("queue");
        let mut qb = nic_b.create_queue(&cfg, &cq_b, &cq_b).expect("queue");
        let (ia, ib) = (qa.info(), qb.info());
        qa.connect(&ib).expect("connect");
        qb.connect(&ia).expect("connect");

        let rx = BufPool::new(nic_b.register(4 * 128, Access::LOCAL_WRITE).expect("register"), 128)
            .expect("valid pool");
        let tx = BufPool::new(nic_a.register(4 * 128, Access::empty()).expect("register"), 128)
            .expect("valid pool");
        for _ in 0..4 {
            let b = rx.get().expect("free buffer");
            let sge = b.sge(b.len()).expect("whole buffer");
            let token = b.into_token();
            qb.post_recv(&[RecvWr { wr_id: token.to_u64(), sges: &[sge] }]).expect("post receive");
        }
        assert_eq!(rx.in_use(), 4);
        for i in 0..4u8 {
            let mut b = tx.get().expect("free buffer");
            b.write(0, &[i; 10]).expect("in bounds");
            let sge = b.sge(10).expect("in bounds");
            // The send buffer stays out of the pool until its send completion.
            let token = b.into_token();
            qa.post_send(&[SendWr::send(token.to_u64(), &[sge])]).expect("post send");
        }
        let mut wc = [Completion::default(); 8];
        let (mut got, mut sent) = (Vec::new(), 0);
        let give_up = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while got.len() < 4 || sent < 4 {
            assert!(std::time::Instant::now() < give_up, "work requests never completed");
            let n = cq_a.poll(&mut wc).expect("poll");
            for c in &wc[..n] {
                assert_eq!(c.status, Status::Success);
                drop(tx.from_token(BufToken::from_u64(c.wr_id)).expect("posted send buffer"));
                sent += 1;
            }
            let n = cq_b.poll(&mut wc).expect("poll");
            for c in &wc[..n] {
                assert_eq!((c.status, c.byte_len), (Status::Success, 10));
                let b = rx.from_token(BufToken::from_u64(c.wr_id)).expect("posted buffer");
                let mut data = [0u8; 10];
                b.read(0, &mut data).expect("in bounds");
                got.push(data[0]);
                assert_eq!(data, [data[0]; 10]);
                // A duplicated completion could not take the buffer again.
                assert!(rx.from_token(BufToken::from_u64(c.wr_id)).is_err());
            }
        }
        got.sort_unstable();
        assert_eq!(got, [0, 1, 2, 3]);
        assert_eq!((rx.in_use(), tx.in_use()), (0, 0));
    }

    /// The contents `t` writes into a buffer for its `i`-th use: a per-thread, per-use tag.
    fn fill(t: usize, i: usize, salt: u8) -> [u8; 64] {
        let tag = [t as u8 + 1, i as u8, (i >> 8) as u8, salt];
        std::array::from_fn(|k| tag[k % tag.len()])
    }

    fn expect_fill(b: &Buf<'_, SimRegion>, want: &[u8; 64]) -> Result<(), String> {
        let mut back = [0u8; 64];
        b.read(0, &mut back).map_err(|e| e.to_string())?;
        if &back != want {
            return Err(format!("buffer {} was written by another holder: {back:?}", b.index()));
        }
        Ok(())
    }

    #[test]
    fn stress_concurrent_get_and_put_never_share_a_buffer() {
        const THREADS: usize = 4;
        const ITERS: usize = 50_000;
        const COUNT: usize = 6;
        const SEED: u64 = 0x0B0F_F001;
        let p = Arc::new(pool(COUNT, 64));
        let start = Arc::new(Barrier::new(THREADS));
        let threads: Vec<_> = (0..THREADS)
            .map(|t| {
                let (p, start) = (Arc::clone(&p), Arc::clone(&start));
                std::thread::spawn(move || -> Result<u64, String> {
                    let mut rng = Rng(SEED ^ ((t as u64 + 1) * 0x1000_0001));
                    let mut held = Vec::with_capacity(3);
                    let mut posted = Vec::with_capacity(3);
                    let mut got = 0u64;
                    start.wait();
                    for i in 0..ITERS {
                        // Take one to three buffers and tag each for this thread and use.
                        for _ in 0..1 + rng.below(3) {
                            let Some(mut b) = p.get() else { break };
                            got += 1;
                            let want = fill(t, i, rng.next() as u8);
                            b.write(0, &want).map_err(|e| e.to_string())?;
                            held.push((b, want));
                        }
                        rng.shuffle(&mut held);
                        // Read each tag back before the buffer goes back (drop), or before it
                        // leaves as a token, the posted-receive route.
                        for (b, want) in held.drain(..) {
                            expect_fill(&b, &want)?;
                            if rng.percent(30) {
                                posted.push((b.into_token(), want));
                            }
                        }
                        rng.shuffle(&mut posted);
                        for (token, want) in posted.drain(..) {
                            let b = p.from_token(token).map_err(|e| e.to_string())?;
                            expect_fill(&b, &want)?;
                        }
                    }
                    Ok(got)
                })
            })
            .collect();
        let mut got = 0;
        for t in threads {
            got += t.join().expect("thread panicked").unwrap_or_else(|e| panic!("seed {SEED:#x}: {e}"));
        }
        assert!(got > 0);
        assert_eq!((p.in_use(), p.available()), (0, COUNT));
    }
}
