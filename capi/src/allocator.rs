//! The memory allocator behind `OckRpcMemoryAllocator*`: hands out blocks of one contiguous
//! address range (in practice a registered memory region), so that a caller can build requests
//! for one-sided I/O and rendezvous calls out of registered memory without registering each
//! buffer.
//!
//! # Model
//!
//! The range `[address, address + size)` is cut into *units* of `minBlockSize` bytes (default
//! [`DEFAULT_MIN_BLOCK`]); every block is a whole number of units, so with `alignedAddress` set
//! (and the range's start rounded up to a multiple of the unit when it is not one already) every
//! address handed out is a multiple of `minBlockSize`. A request of `n` bytes takes
//! `ceil(n / unit)` units. [`Allocator::free_size`] counts free units (cached ones included) in
//! bytes, exactly; it starts at the managed length, which is `size` minus what alignment trims.
//!
//! The allocator never reads or writes the range: its bookkeeping is out of band, so neither a
//! caller nor a peer writing into the region (it is remotely writable) can corrupt it, and a
//! caller freeing an address it was never given gets an error, not a broken heap.
//!
//! # Structure
//!
//! - Blocks are descriptors in one table (`Vec<Block>`), linked in address order (to coalesce a
//!   freed block with free neighbours at once) and, when free, into one of 64 size bins (bin
//!   `k` holds blocks of `2^k..2^(k+1)` units; a bitmap finds the first non-empty bin in O(1)).
//!   Split-off remainders reuse spare descriptors, so the table grows only when more blocks
//!   exist than ever before: in steady state allocate and free do not touch the Rust heap.
//! - Blocks handed out (and cached ones) are found by address in an intrusive hash table of
//!   `bucketCount` buckets (rounded up to a power of two), chained through the descriptors.
//! - `MEM_DYNAMIC_SIZE_WITH_CACHE` adds `cacheTierCount` tiers of block sizes: tier `i` holds
//!   blocks of `(i + 1)` units (`MEM_TIER_TIMES`) or `2^i` units (`MEM_TIER_POWER`). A request
//!   that fits a tier is rounded up to the tier's size; freeing such a block parks it in the
//!   tier (up to `cacheBlockCountPerTier`) instead of coalescing, and the next request of that
//!   tier takes it back without searching the bins. A parked block counts as free; when the bins
//!   cannot satisfy a request the tiers are flushed back into them (coalescing) and the request
//!   is retried, so the cache never makes an allocation fail that would succeed without it.
//! - One mutex guards the whole state: every operation is a few pointer updates under it.

use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard};

/// Unit size when the options give `minBlockSize` 0.
pub const DEFAULT_MIN_BLOCK: u64 = 4096;
/// Hash buckets when the options give `bucketCount` 0.
pub const DEFAULT_BUCKETS: u32 = 1024;
/// Most hash buckets (larger requests are clamped: more buckets would only waste memory).
pub const MAX_BUCKETS: u32 = 1 << 20;
/// Cache tiers when `MEM_DYNAMIC_SIZE_WITH_CACHE` is asked for with `cacheTierCount` 0.
pub const DEFAULT_CACHE_TIERS: u16 = 8;
/// Blocks parked per tier when `cacheBlockCountPerTier` is 0.
pub const DEFAULT_CACHE_PER_TIER: u16 = 16;
/// Most cache tiers.
pub const MAX_CACHE_TIERS: u16 = 64;

/// No descriptor.
const NIL: u32 = u32::MAX;
/// Number of size bins (one per bit of a unit count).
const BINS: usize = 64;

/// How the tiers of a caching allocator grow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TierPolicy {
    /// Tier `i` holds blocks of `(i + 1)` units (`MEM_TIER_TIMES`).
    Times,
    /// Tier `i` holds blocks of `2^i` units (`MEM_TIER_POWER`).
    Power,
}

/// The allocator's settings, decoded from `OckRpcMemoryAllocatorOptions`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// First byte of the range.
    pub address: u64,
    /// Length of the range in bytes.
    pub size: u64,
    /// Unit of allocation in bytes; 0 means [`DEFAULT_MIN_BLOCK`].
    pub min_block: u32,
    /// Hash buckets for the blocks handed out; 0 means [`DEFAULT_BUCKETS`].
    pub buckets: u32,
    /// Align every block address to `min_block`.
    pub aligned: bool,
    /// Cache tiers (`None`: `MEM_DYNAMIC_SIZE`, no cache).
    pub cache: Option<CacheOptions>,
}

/// The cache of `MEM_DYNAMIC_SIZE_WITH_CACHE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheOptions {
    /// Number of tiers; 0 means [`DEFAULT_CACHE_TIERS`].
    pub tiers: u16,
    /// Blocks parked per tier; 0 means [`DEFAULT_CACHE_PER_TIER`].
    pub per_tier: u16,
    /// Tier sizes.
    pub policy: TierPolicy,
}

/// What went wrong, in words a C caller can act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllocError {
    /// The options cannot describe an allocator.
    InvalidOptions(String),
    /// A request of zero bytes.
    ZeroSize,
    /// No free block is large enough.
    NoSpace {
        /// Bytes asked for.
        requested: u64,
        /// Bytes free in total (possibly in smaller pieces).
        free: u64,
    },
    /// The address is outside the allocator's range.
    OutOfRange {
        /// The address given.
        address: u64,
    },
    /// The address is in range but is not the start of a block handed out (never allocated, or
    /// already freed).
    NotAllocated {
        /// The address given.
        address: u64,
    },
}

impl fmt::Display for AllocError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AllocError::InvalidOptions(why) => write!(f, "invalid allocator options: {why}"),
            AllocError::ZeroSize => write!(f, "cannot allocate 0 bytes (ask for at least 1)"),
            AllocError::NoSpace { requested, free } => write!(
                f,
                "no free block of {requested} bytes ({free} bytes free in total); free blocks or create a larger allocator"
            ),
            AllocError::OutOfRange { address } => {
                write!(f, "address {address:#x} is outside the allocator's range")
            }
            AllocError::NotAllocated { address } => write!(
                f,
                "address {address:#x} was not handed out by this allocator or was already freed"
            ),
        }
    }
}

impl std::error::Error for AllocError {}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// A descriptor not describing any block (on the spare list).
    Spare,
    /// A free block (in a size bin).
    Free,
    /// Handed out (in the hash table).
    Live,
    /// Freed by the caller but parked in a cache tier (in the hash table and a tier's stack).
    Cached,
}

/// A block of units, or a spare descriptor.
#[derive(Debug, Clone, Copy)]
struct Block {
    /// First unit.
    start: u64,
    /// Length in units (at least 1).
    len: u64,
    /// Neighbours in address order.
    prev: u32,
    next: u32,
    /// Free: the bin list (both links). Live/Cached: the hash chain (`link_next`). Spare: the
    /// spare list (`link_next`).
    link_prev: u32,
    link_next: u32,
    state: State,
}

/// A cache tier: parked blocks of exactly `units` units.
#[derive(Debug)]
struct Tier {
    units: u64,
    parked: Vec<u32>,
    cap: usize,
}

/// The state under the mutex.
#[derive(Debug)]
struct Heap {
    blocks: Vec<Block>,
    spare: u32,
    bins: [u32; BINS],
    bin_map: u64,
    buckets: Box<[u32]>,
    tiers: Vec<Tier>,
    /// Units in free blocks (bins).
    free_units: u64,
    /// Units in parked blocks.
    cached_units: u64,
}

/// A thread-safe allocator over one address range (see the module docs).
#[derive(Debug)]
pub struct Allocator {
    base: u64,
    size: u64,
    /// Address of unit 0.
    start: u64,
    unit: u64,
    units: u64,
    key: AtomicU32,
    heap: Mutex<Heap>,
}

fn bin_of(units: u64) -> usize {
    63 - units.leading_zeros() as usize
}

impl Allocator {
    /// An allocator over `opts.address..opts.address + opts.size`; it never touches the bytes.
    pub fn new(opts: &Options) -> Result<Allocator, AllocError> {
        let bad = |s: String| Err(AllocError::InvalidOptions(s));
        if opts.address == 0 {
            return bad("address is 0 (pass the first byte of a registered region)".into());
        }
        if opts.size == 0 {
            return bad("size is 0 (pass the length of the range to manage)".into());
        }
        let Some(end) = opts.address.checked_add(opts.size) else {
            return bad(format!("address {:#x} + size {} overflows", opts.address, opts.size));
        };
        let unit = if opts.min_block == 0 { DEFAULT_MIN_BLOCK } else { u64::from(opts.min_block) };
        let start =
            if opts.aligned { opts.address.div_ceil(unit).saturating_mul(unit) } else { opts.address };
        let units = if start >= end { 0 } else { (end - start) / unit };
        if units == 0 {
            return bad(format!(
                "the range {:#x}+{} holds no {}block of minBlockSize {unit} bytes",
                opts.address,
                opts.size,
                if opts.aligned { "aligned " } else { "" }
            ));
        }
        let buckets = match opts.buckets {
            0 => DEFAULT_BUCKETS,
            b => b.min(MAX_BUCKETS),
        }
        .next_power_of_two();
        let mut tiers = Vec::new();
        if let Some(c) = opts.cache {
            let count = if c.tiers == 0 { DEFAULT_CACHE_TIERS } else { c.tiers };
            if count > MAX_CACHE_TIERS {
                return bad(format!("cacheTierCount {count} exceeds {MAX_CACHE_TIERS}"));
            }
            let per_tier = if c.per_tier == 0 { DEFAULT_CACHE_PER_TIER } else { c.per_tier };
            for i in 0..u32::from(count) {
                let tier_units = match c.policy {
                    TierPolicy::Times => u64::from(i) + 1,
                    TierPolicy::Power => 1u64 << i,
                };
                // Tiers larger than the whole range could never be filled.
                if tier_units > units {
                    break;
                }
                tiers.push(Tier { units: tier_units, parked: Vec::new(), cap: usize::from(per_tier) });
            }
        }
        let mut heap = Heap {
            blocks: Vec::with_capacity(64),
            spare: NIL,
            bins: [NIL; BINS],
            bin_map: 0,
            buckets: vec![NIL; buckets as usize].into_boxed_slice(),
            tiers,
            free_units: 0,
            cached_units: 0,
        };
        let first = heap.new_desc(0, units);
        heap.blocks[first as usize].state = State::Free;
        heap.bin_insert(first);
        heap.free_units = units;
        Ok(Allocator {
            base: opts.address,
            size: opts.size,
            start,
            unit,
            units,
            key: AtomicU32::new(0),
            heap: Mutex::new(heap),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Heap> {
        // A panic under the lock leaves the heap consistent at every step that can panic (none
        // should); keep serving rather than poisoning every later call.
        self.heap.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The key [`Allocator::allocate`] reports (`OckRpcMemoryAllocatorSetMrKey`).
    pub fn set_key(&self, key: u32) {
        self.key.store(key, Ordering::Relaxed);
    }

    /// The key set by [`Allocator::set_key`] (0 before).
    pub fn key(&self) -> u32 {
        self.key.load(Ordering::Relaxed)
    }

    /// Bytes managed: the free size of an allocator with nothing handed out.
    #[cfg(test)]
    pub fn capacity(&self) -> u64 {
        self.units * self.unit
    }

    /// `address - base` for an address inside the range given at creation.
    pub fn offset_of(&self, address: u64) -> Result<u64, AllocError> {
        if address < self.base || address - self.base >= self.size {
            return Err(AllocError::OutOfRange { address });
        }
        Ok(address - self.base)
    }

    /// Free bytes (parked cache blocks included): exact, in units of [`Allocator::unit`].
    pub fn free_size(&self) -> u64 {
        let h = self.lock();
        (h.free_units + h.cached_units) * self.unit
    }

    /// A block of at least `size` bytes; returns its address.
    pub fn allocate(&self, size: u64) -> Result<u64, AllocError> {
        if size == 0 {
            return Err(AllocError::ZeroSize);
        }
        let mut units = size.div_ceil(self.unit);
        let mut h = self.lock();
        let no_space = |h: &Heap| AllocError::NoSpace {
            requested: size,
            free: (h.free_units + h.cached_units) * self.unit,
        };
        if units > self.units {
            return Err(no_space(&h));
        }
        // Smallest tier that holds the request (tiers are sorted by size).
        if let Some(t) = h.tiers.iter().position(|t| t.units >= units) {
            units = h.tiers[t].units;
            if let Some(i) = h.tiers[t].parked.pop() {
                h.blocks[i as usize].state = State::Live;
                h.cached_units -= units;
                return Ok(self.addr_of(h.blocks[i as usize].start));
            }
        }
        let i = match h.take(units) {
            Some(i) => i,
            None if h.cached_units > 0 => {
                h.flush_tiers();
                h.take(units).ok_or_else(|| no_space(&h))?
            }
            None => return Err(no_space(&h)),
        };
        Ok(self.addr_of(h.blocks[i as usize].start))
    }

    /// Frees the block that starts at `address`.
    pub fn free(&self, address: u64) -> Result<(), AllocError> {
        if address < self.start || address - self.start >= self.units * self.unit {
            return Err(AllocError::OutOfRange { address });
        }
        let off = address - self.start;
        if off % self.unit != 0 {
            return Err(AllocError::NotAllocated { address });
        }
        let unit_index = off / self.unit;
        let mut h = self.lock();
        let Some((i, pred)) = h.find(unit_index) else {
            return Err(AllocError::NotAllocated { address });
        };
        if h.blocks[i as usize].state != State::Live {
            return Err(AllocError::NotAllocated { address });
        }
        let len = h.blocks[i as usize].len;
        if let Some(tier) = h.tiers.iter_mut().find(|t| t.units == len) {
            if tier.parked.len() < tier.cap {
                tier.parked.push(i);
                h.blocks[i as usize].state = State::Cached;
                h.cached_units += len;
                return Ok(());
            }
        }
        h.hash_remove(i, pred);
        h.release(i);
        Ok(())
    }

    fn addr_of(&self, unit_index: u64) -> u64 {
        self.start + unit_index * self.unit
    }

    /// Checks every invariant of the bookkeeping (tests).
    #[cfg(test)]
    fn check(&self) {
        let h = self.lock();
        h.check(self.units);
    }
}

impl Heap {
    /// A descriptor for `len` units at `start`, not linked anywhere yet.
    fn new_desc(&mut self, start: u64, len: u64) -> u32 {
        let b =
            Block { start, len, prev: NIL, next: NIL, link_prev: NIL, link_next: NIL, state: State::Free };
        if self.spare != NIL {
            let i = self.spare;
            self.spare = self.blocks[i as usize].link_next;
            self.blocks[i as usize] = b;
            i
        } else {
            // Only when more blocks exist than ever before (amortised growth).
            self.blocks.push(b);
            u32::try_from(self.blocks.len() - 1).expect("fewer than 2^32 blocks")
        }
    }

    fn drop_desc(&mut self, i: u32) {
        let b = &mut self.blocks[i as usize];
        b.state = State::Spare;
        b.link_next = self.spare;
        self.spare = i;
    }

    fn bucket(&self, unit_index: u64) -> usize {
        // Fibonacci hashing of the unit index; the table length is a power of two.
        let h = unit_index.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        (h >> 32) as usize & (self.buckets.len() - 1)
    }

    /// The handed-out (or parked) block starting at unit `unit_index`, and its predecessor in
    /// its hash chain.
    fn find(&self, unit_index: u64) -> Option<(u32, u32)> {
        let mut pred = NIL;
        let mut i = self.buckets[self.bucket(unit_index)];
        while i != NIL {
            if self.blocks[i as usize].start == unit_index {
                return Some((i, pred));
            }
            pred = i;
            i = self.blocks[i as usize].link_next;
        }
        None
    }

    fn hash_insert(&mut self, i: u32) {
        let b = self.bucket(self.blocks[i as usize].start);
        self.blocks[i as usize].link_next = self.buckets[b];
        self.buckets[b] = i;
    }

    fn hash_remove(&mut self, i: u32, pred: u32) {
        let next = self.blocks[i as usize].link_next;
        if pred == NIL {
            let b = self.bucket(self.blocks[i as usize].start);
            self.buckets[b] = next;
        } else {
            self.blocks[pred as usize].link_next = next;
        }
    }

    fn bin_insert(&mut self, i: u32) {
        let k = bin_of(self.blocks[i as usize].len);
        let head = self.bins[k];
        self.blocks[i as usize].link_prev = NIL;
        self.blocks[i as usize].link_next = head;
        if head != NIL {
            self.blocks[head as usize].link_prev = i;
        }
        self.bins[k] = i;
        self.bin_map |= 1 << k;
    }

    fn bin_remove(&mut self, i: u32) {
        let Block { link_prev: p, link_next: n, len, .. } = self.blocks[i as usize];
        let k = bin_of(len);
        if p == NIL {
            self.bins[k] = n;
            if n == NIL {
                self.bin_map &= !(1 << k);
            }
        } else {
            self.blocks[p as usize].link_next = n;
        }
        if n != NIL {
            self.blocks[n as usize].link_prev = p;
        }
    }

    /// A free block of at least `units` units, or `None`.
    fn find_free(&self, units: u64) -> Option<u32> {
        let k = bin_of(units);
        // Every block in bin k has at least 2^k units: enough when units is a power of two.
        if units.is_power_of_two() && self.bins[k] != NIL {
            return Some(self.bins[k]);
        }
        // Every block in a higher bin is larger than units.
        let higher = if k + 1 < BINS { self.bin_map & (!0u64 << (k + 1)) } else { 0 };
        if higher != 0 {
            return Some(self.bins[higher.trailing_zeros() as usize]);
        }
        let mut i = self.bins[k];
        while i != NIL {
            if self.blocks[i as usize].len >= units {
                return Some(i);
            }
            i = self.blocks[i as usize].link_next;
        }
        None
    }

    /// Takes `units` units from the bins: the block handed out, now live and hashed.
    fn take(&mut self, units: u64) -> Option<u32> {
        let i = self.find_free(units)?;
        self.bin_remove(i);
        let b = self.blocks[i as usize];
        if b.len > units {
            let rest = self.new_desc(b.start + units, b.len - units);
            self.blocks[rest as usize].prev = i;
            self.blocks[rest as usize].next = b.next;
            if b.next != NIL {
                self.blocks[b.next as usize].prev = rest;
            }
            self.blocks[i as usize].next = rest;
            self.blocks[i as usize].len = units;
            self.bin_insert(rest);
        }
        self.blocks[i as usize].state = State::Live;
        self.hash_insert(i);
        self.free_units -= units;
        Some(i)
    }

    /// Returns block `i` (no longer hashed) to the bins, merged with its free neighbours.
    fn release(&mut self, mut i: u32) {
        self.free_units += self.blocks[i as usize].len;
        self.blocks[i as usize].state = State::Free;
        let next = self.blocks[i as usize].next;
        if next != NIL && self.blocks[next as usize].state == State::Free {
            self.bin_remove(next);
            self.absorb_next(i);
        }
        let prev = self.blocks[i as usize].prev;
        if prev != NIL && self.blocks[prev as usize].state == State::Free {
            self.bin_remove(prev);
            self.absorb_next(prev);
            i = prev;
        }
        self.bin_insert(i);
    }

    /// Merges the block after `i` into `i` (both unlinked from any bin).
    fn absorb_next(&mut self, i: u32) {
        let n = self.blocks[i as usize].next;
        let Block { len, next, .. } = self.blocks[n as usize];
        self.blocks[i as usize].len += len;
        self.blocks[i as usize].next = next;
        if next != NIL {
            self.blocks[next as usize].prev = i;
        }
        self.drop_desc(n);
    }

    /// Returns every parked block to the bins.
    fn flush_tiers(&mut self) {
        for t in 0..self.tiers.len() {
            while let Some(i) = self.tiers[t].parked.pop() {
                let start = self.blocks[i as usize].start;
                let (found, pred) = self.find(start).expect("a parked block is hashed");
                debug_assert_eq!(found, i);
                self.hash_remove(i, pred);
                self.cached_units -= self.blocks[i as usize].len;
                self.release(i);
            }
        }
    }

    #[cfg(test)]
    fn check(&self, units: u64) {
        // Address order covers 0..units without gaps; no two free neighbours.
        let mut i = self.blocks.iter().position(|b| b.state != State::Spare && b.prev == NIL).unwrap() as u32;
        let (mut at, mut free, mut cached, mut prev_free) = (0u64, 0u64, 0u64, false);
        let mut count = 0;
        while i != NIL {
            let b = self.blocks[i as usize];
            assert_eq!(b.start, at, "blocks are contiguous");
            assert!(b.len > 0);
            match b.state {
                State::Free => {
                    assert!(!prev_free, "two free neighbours were not coalesced");
                    free += b.len;
                    assert_ne!(self.bin_map & (1 << bin_of(b.len)), 0);
                }
                State::Live => assert_eq!(self.find(b.start).map(|f| f.0), Some(i)),
                State::Cached => {
                    cached += b.len;
                    assert_eq!(self.find(b.start).map(|f| f.0), Some(i));
                }
                State::Spare => panic!("a spare descriptor is linked"),
            }
            prev_free = b.state == State::Free;
            at += b.len;
            count += 1;
            if b.next != NIL {
                assert_eq!(self.blocks[b.next as usize].prev, i);
            }
            i = b.next;
        }
        assert_eq!(at, units);
        assert_eq!(free, self.free_units);
        assert_eq!(cached, self.cached_units);
        let parked: usize = self.tiers.iter().map(|t| t.parked.len()).sum();
        let in_bins: usize = (0..BINS)
            .map(|k| {
                let mut n = 0;
                let mut j = self.bins[k];
                while j != NIL {
                    assert_eq!(bin_of(self.blocks[j as usize].len), k);
                    assert_eq!(self.blocks[j as usize].state, State::Free);
                    n += 1;
                    j = self.blocks[j as usize].link_next;
                }
                assert_eq!(n == 0, self.bin_map & (1 << k) == 0);
                n
            })
            .sum();
        let live = self.blocks.iter().filter(|b| b.state == State::Live).count();
        let cached_count = self.blocks.iter().filter(|b| b.state == State::Cached).count();
        assert_eq!(cached_count, parked);
        assert_eq!(in_bins + live + cached_count, count);
    }
}

/// Size of `OckRpcMemoryAllocatorOptions` (x86_64: the policy enum at 32, padded to 40).
pub const C_OPTIONS_SIZE: usize = 40;

/// `OckRpcMemoryAllocatorType` values.
pub const MEM_DYNAMIC_SIZE: i32 = 0;
/// See [`MEM_DYNAMIC_SIZE`].
pub const MEM_DYNAMIC_SIZE_WITH_CACHE: i32 = 1;

/// Decodes `OckRpcMemoryAllocatorOptions` from its bytes and the allocator type, checking the
/// enums (a C enum can hold any `int`; reading it as a Rust enum would be undefined behaviour).
pub fn options_from_c(kind: i32, b: &[u8; C_OPTIONS_SIZE]) -> Result<Options, AllocError> {
    let u64_at = |i: usize| u64::from_ne_bytes(b[i..i + 8].try_into().expect("8 bytes"));
    let u32_at = |i: usize| u32::from_ne_bytes(b[i..i + 4].try_into().expect("4 bytes"));
    let u16_at = |i: usize| u16::from_ne_bytes(b[i..i + 2].try_into().expect("2 bytes"));
    let cache = match kind {
        MEM_DYNAMIC_SIZE => None,
        MEM_DYNAMIC_SIZE_WITH_CACHE => {
            // Only read for the caching type: callers of the other may leave it uninitialised.
            let policy = match i32::from_ne_bytes(b[32..36].try_into().expect("4 bytes")) {
                0 => TierPolicy::Times,
                1 => TierPolicy::Power,
                p => {
                    return Err(AllocError::InvalidOptions(format!(
                        "cacheTierPolicy {p} is neither MEM_TIER_TIMES (0) nor MEM_TIER_POWER (1)"
                    )))
                }
            };
            Some(CacheOptions { tiers: u16_at(26), per_tier: u16_at(28), policy })
        }
        t => {
            return Err(AllocError::InvalidOptions(format!(
                "allocator type {t} is neither MEM_DYNAMIC_SIZE (0) nor MEM_DYNAMIC_SIZE_WITH_CACHE (1)"
            )))
        }
    };
    Ok(Options {
        address: u64_at(0),
        size: u64_at(8),
        min_block: u32_at(16),
        buckets: u32_at(20),
        aligned: u16_at(24) != 0,
        cache,
    })
}

// ---- the C entry points ---------------------------------------------------------------------

use crate::guard::guard;
use crate::handle::HandleTable;
use std::ffi::c_int;

/// `OckRpcStatus` values used here.
mod status {
    use std::ffi::c_int;
    pub const OK: c_int = 0;
    pub const ERR: c_int = -1;
    pub const INVALID_PARAM: c_int = -2;
    pub const NO_MEMORY: c_int = -7;
}

/// Every allocator created through the C API, by handle.
static ALLOCATORS: HandleTable<Allocator> = HandleTable::new(0xA1);

fn alloc_status(e: &AllocError) -> c_int {
    match e {
        AllocError::NoSpace { .. } => status::NO_MEMORY,
        _ => status::INVALID_PARAM,
    }
}

/// Looks up an allocator handle, logging what is wrong with a bad one.
fn allocator_of(func: &str, handle: usize) -> Result<std::sync::Arc<Allocator>, c_int> {
    ALLOCATORS.get(handle).ok_or_else(|| {
        crate::log!(
            crate::log::ERROR,
            "{}",
            format!(
                "{func}: allocator handle {handle:#x} is not a live allocator (never created, or destroyed)"
            )
        );
        status::INVALID_PARAM
    })
}

/// `OckRpcMemoryAllocatorCreate`.
///
/// # Safety
/// `options` is NULL or points to a readable `OckRpcMemoryAllocatorOptions`; `allocator` is
/// NULL or points to a writable `OckRpcMemoryAllocator`.
#[no_mangle]
pub unsafe extern "C" fn OckRpcMemoryAllocatorCreate(
    t: c_int,
    options: *const u8,
    allocator: *mut usize,
) -> c_int {
    guard("OckRpcMemoryAllocatorCreate", status::ERR, || {
        if options.is_null() || allocator.is_null() {
            crate::log!(
                crate::log::ERROR,
                "OckRpcMemoryAllocatorCreate: options and allocator must not be NULL"
            );
            return status::INVALID_PARAM;
        }
        // SAFETY: the caller passes a readable options struct; read it as bytes (any alignment).
        let bytes = unsafe { std::ptr::read_unaligned(options.cast::<[u8; C_OPTIONS_SIZE]>()) };
        let created = options_from_c(t, &bytes).and_then(|o| Allocator::new(&o));
        match created {
            Ok(a) => {
                let h = ALLOCATORS.insert(std::sync::Arc::new(a));
                // SAFETY: checked non-NULL; the caller passes a writable handle.
                unsafe { allocator.write_unaligned(h) };
                status::OK
            }
            Err(e) => {
                crate::log!(crate::log::ERROR, "{}", format!("OckRpcMemoryAllocatorCreate: {e}"));
                alloc_status(&e)
            }
        }
    })
}

/// `OckRpcMemoryAllocatorDestroy`. Blocks handed out become invalid with it; the memory is the
/// caller's (or its region's) and is not touched.
#[no_mangle]
pub extern "C" fn OckRpcMemoryAllocatorDestroy(allocator: usize) -> c_int {
    guard("OckRpcMemoryAllocatorDestroy", status::ERR, || match ALLOCATORS.remove(allocator) {
        Some(_) => status::OK,
        None => {
            crate::log!(
                crate::log::ERROR,
                "{}",
                format!(
                    "OckRpcMemoryAllocatorDestroy: allocator handle {allocator:#x} is not a live allocator"
                )
            );
            status::INVALID_PARAM
        }
    })
}

/// `OckRpcMemoryAllocatorSetMrKey`: the key `Allocate` reports with every block.
#[no_mangle]
pub extern "C" fn OckRpcMemoryAllocatorSetMrKey(allocator: usize, mr_key: u32) -> c_int {
    guard("OckRpcMemoryAllocatorSetMrKey", status::ERR, || {
        match allocator_of("OckRpcMemoryAllocatorSetMrKey", allocator) {
            Ok(a) => {
                a.set_key(mr_key);
                status::OK
            }
            Err(s) => s,
        }
    })
}

/// `OckRpcMemoryAllocatorMemOffset`: `address - options.address`.
///
/// # Safety
/// `offset` is NULL or points to a writable `uintptr_t`.
#[no_mangle]
pub unsafe extern "C" fn OckRpcMemoryAllocatorMemOffset(
    allocator: usize,
    address: usize,
    offset: *mut usize,
) -> c_int {
    const F: &str = "OckRpcMemoryAllocatorMemOffset";
    guard(F, status::ERR, || {
        let a = match allocator_of(F, allocator) {
            Ok(a) => a,
            Err(s) => return s,
        };
        if offset.is_null() {
            crate::log!(crate::log::ERROR, "{}", format!("{F}: offset must not be NULL"));
            return status::INVALID_PARAM;
        }
        match a.offset_of(address as u64) {
            Ok(off) => {
                // SAFETY: checked non-NULL; the caller passes a writable uintptr_t.
                unsafe { offset.write_unaligned(off as usize) };
                status::OK
            }
            Err(e) => {
                crate::log!(crate::log::ERROR, "{}", format!("{F}: {e}"));
                alloc_status(&e)
            }
        }
    })
}

/// `OckRpcMemoryAllocatorFreeSize`: free bytes, exactly.
///
/// # Safety
/// `size` is NULL or points to a writable `uintptr_t`.
#[no_mangle]
pub unsafe extern "C" fn OckRpcMemoryAllocatorFreeSize(allocator: usize, size: *mut usize) -> c_int {
    const F: &str = "OckRpcMemoryAllocatorFreeSize";
    guard(F, status::ERR, || {
        let a = match allocator_of(F, allocator) {
            Ok(a) => a,
            Err(s) => return s,
        };
        if size.is_null() {
            crate::log!(crate::log::ERROR, "{}", format!("{F}: size must not be NULL"));
            return status::INVALID_PARAM;
        }
        // SAFETY: checked non-NULL; the caller passes a writable uintptr_t.
        unsafe { size.write_unaligned(a.free_size() as usize) };
        status::OK
    })
}

/// `OckRpcMemoryAllocatorAllocate`.
///
/// # Safety
/// `address` and `key` are NULL or point to a writable `uintptr_t` and `uint32_t`.
#[no_mangle]
pub unsafe extern "C" fn OckRpcMemoryAllocatorAllocate(
    allocator: usize,
    size: u64,
    address: *mut usize,
    key: *mut u32,
) -> c_int {
    const F: &str = "OckRpcMemoryAllocatorAllocate";
    guard(F, status::ERR, || {
        let a = match allocator_of(F, allocator) {
            Ok(a) => a,
            Err(s) => return s,
        };
        if address.is_null() || key.is_null() {
            crate::log!(crate::log::ERROR, "{}", format!("{F}: address and key must not be NULL"));
            return status::INVALID_PARAM;
        }
        match a.allocate(size) {
            Ok(addr) => {
                // SAFETY: both checked non-NULL; the caller passes writable outputs.
                unsafe {
                    address.write_unaligned(addr as usize);
                    key.write_unaligned(a.key());
                }
                status::OK
            }
            Err(e) => {
                crate::log!(crate::log::ERROR, "{}", format!("{F}: {e}"));
                alloc_status(&e)
            }
        }
    })
}

/// `OckRpcMemoryAllocatorFree`.
#[no_mangle]
pub extern "C" fn OckRpcMemoryAllocatorFree(allocator: usize, address: usize) -> c_int {
    const F: &str = "OckRpcMemoryAllocatorFree";
    guard(F, status::ERR, || {
        let a = match allocator_of(F, allocator) {
            Ok(a) => a,
            Err(s) => return s,
        };
        match a.free(address as u64) {
            Ok(()) => status::OK,
            Err(e) => {
                crate::log!(crate::log::ERROR, "{}", format!("{F}: {e}"));
                alloc_status(&e)
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::sync::Arc;

    const BASE: u64 = 0x1000_0000;

    fn opts(size: u64, unit: u32) -> Options {
        Options { address: BASE, size, min_block: unit, buckets: 64, aligned: true, cache: None }
    }

    fn cached(size: u64, unit: u32, tiers: u16, per_tier: u16, policy: TierPolicy) -> Options {
        Options { cache: Some(CacheOptions { tiers, per_tier, policy }), ..opts(size, unit) }
    }

    /// splitmix64: a seeded generator for the tests.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    #[test]
    fn allocator_entry_points_validate_handles_and_pointers() {
        let mut opts = [0u8; C_OPTIONS_SIZE];
        opts[0..8].copy_from_slice(&0x10_0000u64.to_ne_bytes());
        opts[8..16].copy_from_slice(&(64u64 * 1024).to_ne_bytes());
        opts[16..20].copy_from_slice(&1024u32.to_ne_bytes());
        let mut h = 0usize;
        // SAFETY: every pointer passed below is to a live local, or NULL.
        unsafe {
            assert_eq!(OckRpcMemoryAllocatorCreate(0, std::ptr::null(), &mut h), status::INVALID_PARAM);
            assert_eq!(
                OckRpcMemoryAllocatorCreate(0, opts.as_ptr(), std::ptr::null_mut()),
                status::INVALID_PARAM
            );
            assert_eq!(OckRpcMemoryAllocatorCreate(5, opts.as_ptr(), &mut h), status::INVALID_PARAM);
            assert_eq!(h, 0, "a failed create leaves the output alone");
            assert_eq!(OckRpcMemoryAllocatorCreate(0, opts.as_ptr(), &mut h), status::OK);
            assert_ne!(h, 0);
            assert_eq!(OckRpcMemoryAllocatorSetMrKey(h, 9), status::OK);
            let (mut addr, mut key, mut free) = (0usize, 0u32, 0usize);
            assert_eq!(OckRpcMemoryAllocatorAllocate(h, 1000, &mut addr, &mut key), status::OK);
            assert_eq!((addr, key), (0x10_0000, 9));
            assert_eq!(OckRpcMemoryAllocatorAllocate(h, 1 << 20, &mut addr, &mut key), status::NO_MEMORY);
            assert_eq!(OckRpcMemoryAllocatorFreeSize(h, &mut free), status::OK);
            assert_eq!(free, 63 * 1024);
            assert_eq!(OckRpcMemoryAllocatorFree(h, 0x10_0000), status::OK);
            assert_eq!(OckRpcMemoryAllocatorFree(h, 0x10_0000), status::INVALID_PARAM);
            assert_eq!(OckRpcMemoryAllocatorDestroy(h), status::OK);
            for bad in [h, 0, 1, 0xdead_beef, usize::MAX] {
                assert_eq!(OckRpcMemoryAllocatorDestroy(bad), status::INVALID_PARAM);
                assert_eq!(OckRpcMemoryAllocatorFreeSize(bad, &mut free), status::INVALID_PARAM);
                assert_eq!(OckRpcMemoryAllocatorAllocate(bad, 8, &mut addr, &mut key), status::INVALID_PARAM);
                assert_eq!(OckRpcMemoryAllocatorMemOffset(bad, 0x10_0000, &mut free), status::INVALID_PARAM);
            }
            // The slot is reused with a new generation: the old handle stays dead.
            let mut h2 = 0usize;
            assert_eq!(OckRpcMemoryAllocatorCreate(0, opts.as_ptr(), &mut h2), status::OK);
            assert_ne!(h2, h);
            assert_eq!(OckRpcMemoryAllocatorSetMrKey(h, 1), status::INVALID_PARAM);
            assert_eq!(OckRpcMemoryAllocatorDestroy(h2), status::OK);
        }
    }

    #[test]
    fn c_options_decode_with_their_layout() {
        let mut b = [0u8; C_OPTIONS_SIZE];
        b[0..8].copy_from_slice(&BASE.to_ne_bytes());
        b[8..16].copy_from_slice(&65536u64.to_ne_bytes());
        b[16..20].copy_from_slice(&512u32.to_ne_bytes());
        b[20..24].copy_from_slice(&99u32.to_ne_bytes());
        b[24..26].copy_from_slice(&1u16.to_ne_bytes());
        b[26..28].copy_from_slice(&3u16.to_ne_bytes());
        b[28..30].copy_from_slice(&5u16.to_ne_bytes());
        b[32..36].copy_from_slice(&1i32.to_ne_bytes());
        let o = options_from_c(MEM_DYNAMIC_SIZE_WITH_CACHE, &b).unwrap();
        assert_eq!(
            o,
            Options {
                address: BASE,
                size: 65536,
                min_block: 512,
                buckets: 99,
                aligned: true,
                cache: Some(CacheOptions { tiers: 3, per_tier: 5, policy: TierPolicy::Power })
            }
        );
        assert_eq!(options_from_c(MEM_DYNAMIC_SIZE, &b).unwrap().cache, None);
        assert!(options_from_c(2, &b).unwrap_err().to_string().contains("allocator type 2"));
        b[32..36].copy_from_slice(&7i32.to_ne_bytes());
        assert!(options_from_c(MEM_DYNAMIC_SIZE_WITH_CACHE, &b)
            .unwrap_err()
            .to_string()
            .contains("cacheTierPolicy 7"));
        assert!(options_from_c(MEM_DYNAMIC_SIZE, &b).is_ok(), "the policy of the uncached type is not read");
    }

    #[test]
    fn bad_options_are_refused_with_a_reason() {
        let e = |o: Options| Allocator::new(&o).unwrap_err().to_string();
        assert!(e(Options { address: 0, ..opts(4096, 64) }).contains("address is 0"));
        assert!(e(opts(0, 64)).contains("size is 0"));
        assert!(e(Options { address: u64::MAX - 10, ..opts(4096, 64) }).contains("overflows"));
        assert!(e(opts(63, 64)).contains("holds no"));
        // Aligned start rounds up past the end.
        assert!(e(Options { address: BASE + 1, ..opts(100, 64) }).contains("aligned"));
        assert!(e(cached(1 << 20, 64, 65, 4, TierPolicy::Times)).contains("cacheTierCount 65"));
    }

    #[test]
    fn offsets_free_size_and_rounding_are_exact() {
        let a = Allocator::new(&opts(10 * 4096 + 100, 4096)).unwrap();
        assert_eq!(a.capacity(), 10 * 4096);
        assert_eq!(a.free_size(), 10 * 4096);
        let x = a.allocate(1).unwrap();
        assert_eq!(x, BASE);
        assert_eq!(a.free_size(), 9 * 4096);
        let y = a.allocate(4097).unwrap();
        assert_eq!(y, BASE + 4096);
        assert_eq!(a.free_size(), 7 * 4096);
        assert_eq!(a.offset_of(y).unwrap(), 4096);
        assert_eq!(a.offset_of(y + 5).unwrap(), 4101);
        assert_eq!(a.offset_of(BASE + 10 * 4096 + 99).unwrap(), 10 * 4096 + 99);
        assert_eq!(
            a.offset_of(BASE + 10 * 4096 + 100),
            Err(AllocError::OutOfRange { address: BASE + 41060 })
        );
        assert!(a.offset_of(BASE - 1).is_err());
        a.free(x).unwrap();
        a.free(y).unwrap();
        assert_eq!(a.free_size(), 10 * 4096);
        a.check();
    }

    #[test]
    fn unaligned_base_is_rounded_up_when_aligned_addresses_are_asked_for() {
        let a = Allocator::new(&Options { address: BASE + 10, ..opts(4 * 64, 64) }).unwrap();
        // 10..256+10 holds three whole aligned units.
        assert_eq!(a.capacity(), 3 * 64);
        assert_eq!(a.allocate(1).unwrap(), BASE + 64);
        assert_eq!(a.offset_of(BASE + 64).unwrap(), 54);
        let u = Allocator::new(&Options { address: BASE + 10, aligned: false, ..opts(4 * 64, 64) }).unwrap();
        assert_eq!(u.capacity(), 4 * 64);
        assert_eq!(u.allocate(1).unwrap(), BASE + 10);
    }

    #[test]
    fn bad_frees_are_errors_and_leave_the_heap_intact() {
        let a = Allocator::new(&opts(16 * 64, 64)).unwrap();
        let x = a.allocate(128).unwrap();
        assert_eq!(a.free(x + 64), Err(AllocError::NotAllocated { address: x + 64 }));
        assert_eq!(a.free(x + 1), Err(AllocError::NotAllocated { address: x + 1 }));
        assert_eq!(a.free(BASE + 8 * 64), Err(AllocError::NotAllocated { address: BASE + 512 }));
        assert_eq!(a.free(BASE - 64), Err(AllocError::OutOfRange { address: BASE - 64 }));
        assert_eq!(a.free(BASE + 16 * 64), Err(AllocError::OutOfRange { address: BASE + 1024 }));
        a.check();
        a.free(x).unwrap();
        assert_eq!(a.free(x), Err(AllocError::NotAllocated { address: x }), "double free");
        assert_eq!(a.free_size(), 16 * 64);
        assert_eq!(a.allocate(0), Err(AllocError::ZeroSize));
        a.check();
    }

    #[test]
    fn exhaustion_and_fragmentation_report_no_space() {
        let a = Allocator::new(&opts(8 * 64, 64)).unwrap();
        let blocks: Vec<u64> = (0..8).map(|_| a.allocate(64).unwrap()).collect();
        assert_eq!(a.allocate(1), Err(AllocError::NoSpace { requested: 1, free: 0 }));
        // Free every other block: 4 units free, none contiguous.
        for b in blocks.iter().step_by(2) {
            a.free(*b).unwrap();
        }
        assert_eq!(a.free_size(), 4 * 64);
        assert_eq!(a.allocate(128), Err(AllocError::NoSpace { requested: 128, free: 256 }));
        assert!(a.allocate(9 * 64).is_err());
        // Free the rest: they coalesce into one block of the whole range.
        for b in blocks.iter().skip(1).step_by(2) {
            a.free(*b).unwrap();
        }
        a.check();
        assert_eq!(a.allocate(8 * 64).unwrap(), BASE);
    }

    #[test]
    fn neighbours_coalesce_in_every_order() {
        for order in [[0, 1, 2], [0, 2, 1], [1, 0, 2], [1, 2, 0], [2, 0, 1], [2, 1, 0]] {
            let a = Allocator::new(&opts(3 * 64, 64)).unwrap();
            let b: Vec<u64> = (0..3).map(|_| a.allocate(64).unwrap()).collect();
            for &i in &order {
                a.free(b[i]).unwrap();
                a.check();
            }
            assert_eq!(a.allocate(3 * 64).unwrap(), BASE, "order {order:?}");
        }
    }

    #[test]
    fn cache_tiers_reuse_blocks_and_count_them_free() {
        let a = Allocator::new(&cached(64 * 64, 64, 4, 2, TierPolicy::Power)).unwrap();
        // Tiers of 1, 2, 4, 8 units. 100 bytes rounds up to the 2-unit tier.
        let x = a.allocate(100).unwrap();
        assert_eq!(a.free_size(), 62 * 64);
        a.free(x).unwrap();
        assert_eq!(a.free_size(), 64 * 64, "a parked block counts as free");
        a.check();
        assert_eq!(a.free(x), Err(AllocError::NotAllocated { address: x }), "double free of a parked block");
        // The next request of that tier takes the parked block back.
        assert_eq!(a.allocate(65).unwrap(), x);
        a.free(x).unwrap();
        // A request the bins cannot satisfy while blocks are parked flushes them back.
        let whole = a.allocate(64 * 64).unwrap();
        assert_eq!(whole, BASE);
        assert_eq!(a.free_size(), 0);
        a.free(whole).unwrap();
        a.check();
        // Beyond the tier's capacity, frees go to the bins.
        let b: Vec<u64> = (0..3).map(|_| a.allocate(64).unwrap()).collect();
        for x in &b {
            a.free(*x).unwrap();
        }
        assert_eq!(a.free_size(), 64 * 64);
        a.check();
    }

    #[test]
    fn times_policy_tiers_are_multiples_of_the_unit() {
        let a = Allocator::new(&cached(64 * 64, 64, 3, 4, TierPolicy::Times)).unwrap();
        let x = a.allocate(3 * 64 - 1).unwrap();
        assert_eq!(a.free_size(), 61 * 64);
        // Larger than every tier: exact units, not cached.
        let y = a.allocate(5 * 64).unwrap();
        assert_eq!(a.free_size(), 56 * 64);
        a.free(y).unwrap();
        a.free(x).unwrap();
        assert_eq!(a.free_size(), 64 * 64);
        a.check();
    }

    #[test]
    fn steady_state_reuses_descriptors() {
        let a = Allocator::new(&cached(1 << 20, 64, 8, 8, TierPolicy::Power)).unwrap();
        let mut rng = Rng(7);
        let mut live = Vec::new();
        for _ in 0..2000 {
            if live.len() < 50 {
                live.push(a.allocate(1 + rng.below(2000)).unwrap());
            } else {
                let i = rng.below(live.len() as u64) as usize;
                a.free(live.swap_remove(i)).unwrap();
            }
        }
        let grown = a.lock().blocks.len();
        for _ in 0..20_000 {
            if rng.below(2) == 0 && live.len() < 50 {
                live.push(a.allocate(1 + rng.below(2000)).unwrap());
            } else if !live.is_empty() {
                let i = rng.below(live.len() as u64) as usize;
                a.free(live.swap_remove(i)).unwrap();
            }
        }
        // The descriptor table is bounded by the most blocks ever alive at once, not by the
        // number of operations.
        assert!(a.lock().blocks.len() <= grown.max(2 * 50 + 2 + 64), "{}", a.lock().blocks.len());
        for x in live {
            a.free(x).unwrap();
        }
        assert_eq!(a.free_size(), 1 << 20);
        a.check();
    }

    /// Several threads allocate and free at random (seeded); every block handed out is checked
    /// against every live block for overlap and range, and the free size returns to full.
    fn stress(o: Options, seed: u64) {
        let a = Arc::new(Allocator::new(&o).unwrap());
        let live = Arc::new(Mutex::new(BTreeMap::<u64, u64>::new()));
        let end = a.start + a.capacity();
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let (a, live) = (Arc::clone(&a), Arc::clone(&live));
                std::thread::spawn(move || {
                    let mut rng = Rng(seed ^ (t << 32));
                    let mut mine: Vec<(u64, u64)> = Vec::new();
                    for _ in 0..20_000 {
                        if mine.is_empty() || (rng.below(3) != 0 && mine.len() < 64) {
                            let size =
                                1 + if rng.below(8) == 0 { rng.below(64 << 10) } else { rng.below(2048) };
                            match a.allocate(size) {
                                Ok(addr) => {
                                    assert!(addr >= a.start && addr + size <= end, "block out of range");
                                    let mut l = live.lock().unwrap();
                                    if let Some((&s, &e)) = l.range(..addr + size).next_back() {
                                        assert!(e <= addr || s >= addr + size, "overlap");
                                    }
                                    l.insert(addr, addr + size);
                                    mine.push((addr, size));
                                }
                                Err(AllocError::NoSpace { .. }) => {}
                                Err(e) => panic!("{e}"),
                            }
                        } else {
                            let (addr, _) = mine.swap_remove(rng.below(mine.len() as u64) as usize);
                            live.lock().unwrap().remove(&addr);
                            a.free(addr).unwrap();
                        }
                    }
                    for (addr, _) in mine {
                        live.lock().unwrap().remove(&addr);
                        a.free(addr).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert!(live.lock().unwrap().is_empty());
        assert_eq!(a.free_size(), a.capacity());
        a.check();
    }

    #[test]
    fn multithreaded_stress_without_cache() {
        stress(opts(4 << 20, 64), 0x5eed_0001);
    }

    #[test]
    fn multithreaded_stress_with_cache() {
        stress(cached(4 << 20, 256, 8, 16, TierPolicy::Times), 0x5eed_0002);
        stress(cached(4 << 20, 64, 12, 4, TierPolicy::Power), 0x5eed_0003);
    }
}
