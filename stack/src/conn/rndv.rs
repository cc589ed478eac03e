//! Rendezvous memory: where large arguments and responses live while the NIC moves them.
//!
//! Arguments above the eager size travel as URPC DMA descriptors (see `docs/protocol.md`, §15):
//! the client names registered memory, the server RDMA READs it into memory of its own, runs the
//! handler, and writes a large response straight into a response buffer the client named. Both
//! sides need registered memory for that, per call, of the call's size. It comes from an
//! [`RndvAllocator`]: by default a [`RegionPool`] (regions registered on first use and kept for
//! reuse), or the application's own allocate/free pair ([`AllocFns`], what the C API's
//! `OckRpcRndvMemAllocate` / `OckRpcRndvMemFree` hooks map to).
//!
//! Nothing here is on the eager path: an eager call never touches this module.

use crate::hal::{Access, Device, MemoryRegion};
use crate::sync::lock;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Most bytes one READ or WRITE work request of a rendezvous moves (the device's `max_msg_size`
/// may lower it). Larger descriptors are split, so that a 1 MiB argument has 4 READs in flight
/// (pipelined) rather than one; on the simulator 256 KiB did best among 64 KiB .. 4 MiB.
pub(crate) const MAX_CHUNK: usize = 256 << 10;

/// Smallest region the default pool registers (smaller requests are rounded up to it).
const MIN_CLASS: usize = 4096;

/// `len` bytes at `offset` of a registered region: what an [`RndvAllocator`] hands out.
#[derive(Debug)]
pub struct RndvBuf<R> {
    /// The region (registered on the device of the connection it is used on).
    pub region: Arc<R>,
    /// Offset of the first byte in the region.
    pub offset: usize,
    /// Length in bytes (at least what was asked for).
    pub len: usize,
}

/// Registered memory for rendezvous transfers: allocate and free.
///
/// `allocate(len)` returns at least `len` bytes of memory registered on the connection's device
/// (on the server: with [`Access::LOCAL_WRITE`], as the target of READs) or `None` if it cannot;
/// the stack then fails that call only (the server answers SERVER_DECLINE). Every buffer handed
/// out comes back through `free` exactly once, after the NIC is done with it — also when the
/// call fails or the connection closes. Both may run on any thread, concurrently.
pub trait RndvAllocator<R>: Send + Sync {
    /// At least `len` registered bytes, or `None`.
    fn allocate(&self, len: usize) -> Option<RndvBuf<R>>;
    /// Takes back a buffer `allocate` returned.
    fn free(&self, buf: RndvBuf<R>);
    /// Bytes a request of `len` is charged against the per-connection limit (what `allocate`
    /// really sets aside). Default: `len`.
    fn footprint(&self, len: usize) -> usize {
        len
    }
}

/// An [`RndvAllocator`] made of two closures (e.g. a C caller's allocate/free hooks).
pub struct AllocFns<A, F> {
    /// `allocate(len)`.
    pub allocate: A,
    /// `free(buf)`.
    pub free: F,
}

impl<A, F> std::fmt::Debug for AllocFns<A, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AllocFns")
    }
}

impl<R, A, F> RndvAllocator<R> for AllocFns<A, F>
where
    A: Fn(usize) -> Option<RndvBuf<R>> + Send + Sync,
    F: Fn(RndvBuf<R>) + Send + Sync,
{
    fn allocate(&self, len: usize) -> Option<RndvBuf<R>> {
        (self.allocate)(len)
    }
    fn free(&self, buf: RndvBuf<R>) {
        (self.free)(buf)
    }
}

/// The default rendezvous allocator: regions of a power-of-two size (at least 4 KiB), registered
/// on first use and kept in a cache for the next call of the same size class, up to
/// `cache_limit` bytes of idle regions (beyond it a freed region is deregistered at once).
pub struct RegionPool<D: Device> {
    device: D,
    access: Access,
    cache: Mutex<HashMap<usize, Vec<Arc<D::Region>>>>,
    cached: AtomicU64,
    cache_limit: u64,
    /// Most bytes registered at once (in use and cached): idle regions are dropped to make room.
    cap: u64,
    in_use: AtomicU64,
}

impl<D: Device> std::fmt::Debug for RegionPool<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegionPool")
            .field("access", &self.access)
            .field("in_use", &self.in_use())
            .field("cached", &self.cached())
            .finish()
    }
}

impl<D: Device + Clone> RegionPool<D> {
    /// A pool of regions registered on `device` with `access`, keeping up to `cache_limit` bytes
    /// of idle regions; idle regions are dropped before the pool's registered total (in use and
    /// cached) would exceed `cap`.
    pub fn new(device: &D, access: Access, cache_limit: u64, cap: u64) -> Self {
        RegionPool {
            device: device.clone(),
            access,
            cache: Mutex::new(HashMap::new()),
            cached: AtomicU64::new(0),
            cache_limit: cache_limit.min(cap),
            cap,
            in_use: AtomicU64::new(0),
        }
    }
}

impl<D: Device> RegionPool<D> {
    fn class(len: usize) -> Option<usize> {
        len.max(MIN_CLASS).checked_next_power_of_two()
    }

    /// Bytes handed out and not freed yet (0 when nothing is outstanding: nothing leaked).
    pub fn in_use(&self) -> u64 {
        self.in_use.load(Ordering::Acquire)
    }

    /// Bytes of idle regions kept for reuse.
    pub fn cached(&self) -> u64 {
        self.cached.load(Ordering::Acquire)
    }

    /// Deregisters every idle region.
    pub fn trim(&self) {
        let drained: Vec<_> = lock(&self.cache).drain().collect();
        let bytes: u64 = drained.iter().flat_map(|(_, v)| v.iter()).map(|r| r.len() as u64).sum();
        self.cached.fetch_sub(bytes, Ordering::AcqRel);
        drop(drained);
    }
}

impl<D: Device> RndvAllocator<D::Region> for RegionPool<D> {
    fn allocate(&self, len: usize) -> Option<RndvBuf<D::Region>> {
        let class = Self::class(len)?;
        let cached = lock(&self.cache).get_mut(&class).and_then(Vec::pop);
        let region = match cached {
            Some(r) => {
                self.cached.fetch_sub(class as u64, Ordering::AcqRel);
                r
            }
            None => {
                if self.in_use() + self.cached() + class as u64 > self.cap {
                    self.trim();
                }
                Arc::new(self.device.register(class, self.access).ok()?)
            }
        };
        self.in_use.fetch_add(class as u64, Ordering::AcqRel);
        Some(RndvBuf { region, offset: 0, len })
    }

    fn free(&self, buf: RndvBuf<D::Region>) {
        let class = buf.region.len();
        self.in_use.fetch_sub(class as u64, Ordering::AcqRel);
        // Only a region nobody else holds goes back to the cache.
        let Ok(region) = Arc::try_unwrap(buf.region).map(Arc::new) else { return };
        if self.cached.load(Ordering::Acquire) + class as u64 > self.cache_limit {
            return;
        }
        self.cached.fetch_add(class as u64, Ordering::AcqRel);
        lock(&self.cache).entry(class).or_default().push(region);
    }

    fn footprint(&self, len: usize) -> usize {
        Self::class(len).unwrap_or(usize::MAX)
    }
}

/// Rendezvous memory held by a call: given back to its allocator when dropped, and uncharged
/// from the counter it was charged to.
///
/// **Views.** [`bytes`](Self::bytes), [`bytes_mut`](Self::bytes_mut) and
/// [`copy_in`](Self::copy_in) borrow the `RndvMem`, which is the memory's one owner (neither
/// `Copy` nor `Clone`). They are sound because of this invariant, which the stack keeps where it
/// hands the memory to the NIC ([`region`](Self::region) and [`offset`](Self::offset) make the
/// SGEs and descriptors): a transfer (a READ into it, a WRITE from it, the peer's access to the
/// memory a descriptor names) runs only while its owner is held where no view is taken, and
/// is over when the owner is reachable again —
///
/// - a server's READ target is in its request, which only the READ job holds until the last
///   READ completed (`server/rndv.rs`; the handler gets the request after);
/// - a WRITE's source is moved into its WRITE job and dropped there after the last WRITE
///   completed;
/// - a client call's argument and response memory is in the call's slot until the call's
///   outcome: a response, which the server sends only after its last READ completed and after
///   its WRITEs, which RC places before it; a call that ends otherwise (timeout, failure)
///   poisons its memory and reads nothing from it.
///
/// What a peer does against the protocol with memory it was given a key to (keep writing after
/// its response) no type can rule out, in this stack or any other RDMA user.
pub(crate) struct RndvMem<R: 'static> {
    buf: Option<RndvBuf<R>>,
    alloc: Arc<dyn RndvAllocator<R>>,
    charge: Option<(Arc<AtomicU64>, u64)>,
    /// Drop the region instead of reusing it: the NIC (or a peer) may still access it.
    poisoned: bool,
}

impl<R: MemoryRegion + 'static> RndvMem<R> {
    /// Allocates `len` bytes from `alloc`; `None` if it has none.
    pub(crate) fn allocate(alloc: &Arc<dyn RndvAllocator<R>>, len: usize) -> Option<Self> {
        let buf = alloc.allocate(len)?;
        // A misbehaving allocator (too short, out of its region) is refused, and given its
        // buffer back.
        let fits = buf.len >= len && buf.offset.checked_add(len).is_some_and(|end| end <= buf.region.len());
        if !fits {
            alloc.free(buf);
            return None;
        }
        Some(RndvMem { buf: Some(buf), alloc: alloc.clone(), charge: None, poisoned: false })
    }

    /// Records that `bytes` were charged to `counter`; they are uncharged on drop.
    pub(crate) fn charged(mut self, counter: &Arc<AtomicU64>, bytes: u64) -> Self {
        self.charge = Some((counter.clone(), bytes));
        self
    }

    fn buf(&self) -> &RndvBuf<R> {
        self.buf.as_ref().expect("present until drop")
    }

    pub(crate) fn region(&self) -> &Arc<R> {
        &self.buf().region
    }

    /// Offset of the buffer in its region.
    pub(crate) fn offset(&self) -> usize {
        self.buf().offset
    }

    /// Marks the memory as possibly still accessed by a peer: it is not returned for reuse.
    pub(crate) fn poison(&mut self) {
        self.poisoned = true;
    }

    /// The peer is known to be done with the memory after all (it answered the call the memory
    /// was quarantined for): it may be reused.
    pub(crate) fn unpoison(&mut self) {
        self.poisoned = false;
    }

    /// Bytes handed out (at least what was asked for).
    pub(crate) fn len(&self) -> usize {
        self.buf().len
    }

    /// The first `len` bytes (at most the buffer's length), for as long as `self` is borrowed.
    pub(crate) fn bytes(&self, len: usize) -> &[u8] {
        let b = self.buf();
        let len = len.min(b.len);
        // SAFETY: `offset + len` is inside the region (checked at allocation, `len <= b.len`) and
        // the region outlives `self`. No transfer runs on the bytes while the slice lives, by
        // the type's invariant (see `RndvMem`): a transfer runs only while the memory's owner
        // holds it where no view is taken, and this view borrows the owner. No `&mut` to them
        // exists: `bytes_mut` borrows `self` mutably.
        unsafe { std::slice::from_raw_parts(b.region.as_ptr().add(b.offset), len) }
    }

    /// The first `len` bytes (at most the buffer's length), writable, for as long as `self` is
    /// borrowed mutably.
    pub(crate) fn bytes_mut(&mut self, len: usize) -> &mut [u8] {
        let b = self.buf();
        let len = len.min(b.len);
        // SAFETY: in bounds and outlived by the region, as in `bytes`; no transfer runs on the
        // bytes (the type's invariant, as in `bytes`), and `&mut self` excludes every other view.
        unsafe { std::slice::from_raw_parts_mut(b.region.as_ptr().add(b.offset), len) }
    }

    /// Copies `src` (at most the buffer's length) to the start of the memory: what a call's
    /// arguments, or a response, are sent from.
    pub(crate) fn copy_in(&mut self, src: &[u8]) {
        let dst = self.bytes_mut(src.len());
        let n = dst.len();
        dst.copy_from_slice(&src[..n]);
    }
}

impl<R: 'static> Drop for RndvMem<R> {
    fn drop(&mut self) {
        if let Some((counter, bytes)) = self.charge.take() {
            counter.fetch_sub(bytes, Ordering::AcqRel);
        }
        if let Some(buf) = self.buf.take() {
            if self.poisoned {
                // Keep the allocator's books straight but never reuse the memory: a late transfer
                // could still land in it. The region is deregistered when its last Arc goes.
                let RndvBuf { region, offset, len } = buf;
                let stand_in = RndvBuf { region: region.clone(), offset, len };
                self.alloc.free(stand_in);
                drop(region);
            } else {
                self.alloc.free(buf);
            }
        }
    }
}

/// Splits `len` bytes into work requests of at most `chunk` bytes: `(offset, len)` pairs.
pub(crate) fn chunks(len: usize, chunk: usize) -> impl Iterator<Item = (usize, usize)> {
    let chunk = chunk.max(1);
    (0..len.div_ceil(chunk)).map(move |i| (i * chunk, chunk.min(len - i * chunk)))
}

/// The largest work request a rendezvous posts on a device with `max_msg_size`.
pub(crate) fn chunk_size(max_msg_size: u32) -> usize {
    MAX_CHUNK.min(max_msg_size as usize).max(1)
}

/// The 32-bit token of a region's remote key, for a URPC DMA descriptor; `None` if the device's
/// keys are wider (URMA), which URPC's 16-byte descriptor cannot carry.
pub(crate) fn token_of(key: &crate::hal::RemoteKey) -> Option<u32> {
    key.is_rkey().then(|| key.rkey())
}
