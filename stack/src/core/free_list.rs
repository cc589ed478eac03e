//! # free_list: a lock-free LIFO of free slot indices
//!
//! The stack's fixed-size pools — the tx_ctx slab ([`crate::core::tx_ctx`]) and the buffer pool
//! ([`crate::core::buf_pool`]) — hand out slots by index. Their free slots form this list: a Treiber
//! stack of `u32` indices whose links live in a side array (`next[i]` is the index below `i`
//! while `i` is on the list), so a pool allocates once, in [`FreeList::new`], and
//! [`FreeList::pop`] and [`FreeList::push`] take no lock and allocate nothing.
//!
//! ## ABA
//!
//! The head is one `AtomicU64`: a 32-bit **tag** in the high half and the top index in the low
//! half (`NIL` = `u32::MAX` when empty). Every successful pop or push increments the tag. A pop
//! reads `head = (t, a)` and `next[a] = b`, then compare-exchanges `(t, a)` → `(t + 1, b)`. If
//! meanwhile other threads popped `a`, popped `b` and pushed `a` again, the head reads `a` once
//! more but with a larger tag, so the stale pop fails and retries instead of installing `b`,
//! which is no longer free. A tag would have to wrap through all 2^32 values during one pop for
//! the check to miss.
//!
//! ## Memory ordering
//!
//! A successful `push(i)` is a release and the `pop` that returns `i` an acquire on the head, so
//! everything the pusher wrote before `push(i)` (the slot's data, a bumped generation) is visible
//! to the popper. Pools rely on this instead of ordering their own slot fields.
//!
//! ## No length
//!
//! The list keeps no count of its free indices: a pop and a push are one compare-exchange each
//! and nothing more (a counter beside the head would add a locked read-modify-write to each, two
//! per slot's round through a pool, on every call's send context). A pool that wants a count
//! keeps its own ([`crate::core::buf_pool`] does; the tx_ctx slab counts handed-out and
//! released contexts instead).
//!
//! Everything goes through the crate-internal `sync` shim, so loom models of the pools check this
//! code too.

#[cfg(loom)]
use crate::sync::mutation::{self, Mutant};
use crate::sync::{AtomicU32, AtomicU64, Ordering};

/// List terminator, in the head word and in `next`.
const NIL: u32 = u32::MAX;

/// Largest capacity [`FreeList::new`] accepts: every index except the terminator.
pub(crate) const MAX_CAPACITY: usize = NIL as usize;

const TAG_SHIFT: u32 = 32;

const fn pack(tag: u32, index: u32) -> u64 {
    ((tag as u64) << TAG_SHIFT) | index as u64
}

const fn tag_of(head: u64) -> u32 {
    (head >> TAG_SHIFT) as u32
}

const fn index_of(head: u64) -> u32 {
    head as u32
}

/// A lock-free LIFO free list of the indices `0..capacity`, tagged against ABA.
///
/// Contract (not checked: the list stores indices, not ownership): only push an index you popped
/// (or that [`FreeList::new`] never put on the list), and only once per pop. Pushing an index
/// that is already on the list corrupts it. Out-of-range pushes are ignored (and assert in debug
/// builds).
#[derive(Debug)]
pub(crate) struct FreeList {
    /// `next[i]`: the index below `i` while `i` is on the list.
    next: Box<[AtomicU32]>,
    /// `tag << 32 | top index`.
    head: AtomicU64,
}

impl FreeList {
    /// A list of `capacity` free indices; `pop` hands out `0, 1, 2, …` first. `None` if
    /// `capacity` exceeds [`MAX_CAPACITY`]. A capacity of zero gives a list that is always empty.
    pub(crate) fn new(capacity: usize) -> Option<FreeList> {
        if capacity > MAX_CAPACITY {
            return None;
        }
        // capacity <= MAX_CAPACITY = u32::MAX, so every index and `capacity` itself fit in u32.
        let next: Box<[AtomicU32]> = (1..=capacity)
            .map(|below| AtomicU32::new(if below < capacity { below as u32 } else { NIL }))
            .collect();
        let top = if capacity == 0 { NIL } else { 0 };
        Some(FreeList { next, head: AtomicU64::new(pack(0, top)) })
    }

    /// Takes the most recently pushed free index, or `None` if the list is empty. Acquires what
    /// the pusher of that index released.
    pub(crate) fn pop(&self) -> Option<u32> {
        let mut head = self.head.load(Ordering::Acquire);
        loop {
            let index = index_of(head);
            if index == NIL {
                return None;
            }
            // May read a `next` written after `head` was loaded (the index was popped and pushed
            // again meanwhile); the tag then differs and the compare-exchange fails. `?` instead
            // of indexing keeps this panic-free: the head only ever holds indices below capacity.
            let next = self.next.get(index as usize)?.load(Ordering::Relaxed);
            let new = pack(tag_of(head).wrapping_add(1), next);
            // MUTANT (loom twin only, see `sync::mutation`): keep the tag, so ABA goes unnoticed.
            #[cfg(loom)]
            let new = if mutation::enabled(Mutant::FreeListNoTag) { pack(tag_of(head), next) } else { new };
            match self.head.compare_exchange(head, new, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Some(index),
                Err(actual) => head = actual,
            }
        }
    }

    /// Puts `index` back on the list, releasing everything written before the call to the thread
    /// that pops it next. See the type's contract.
    pub(crate) fn push(&self, index: u32) {
        debug_assert!((index as usize) < self.next.len(), "free-list push of {index} out of range");
        let Some(link) = self.next.get(index as usize) else { return };
        let mut head = self.head.load(Ordering::Relaxed);
        loop {
            link.store(index_of(head), Ordering::Relaxed);
            let new = pack(tag_of(head).wrapping_add(1), index);
            // MUTANT (loom twin only, see `sync::mutation`): keep the tag, so ABA goes unnoticed.
            #[cfg(loom)]
            let new = if mutation::enabled(Mutant::FreeListNoTag) { pack(tag_of(head), index) } else { new };
            // Release: publishes `link` and the caller's writes to the thread that pops `index`.
            match self.head.compare_exchange(head, new, Ordering::Release, Ordering::Relaxed) {
                Ok(_) => return,
                Err(actual) => head = actual,
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32 as StdU32, Ordering as O};
    use std::sync::{Arc, Barrier};

    use crate::test_rng::Rng;

    fn list(capacity: usize) -> FreeList {
        FreeList::new(capacity).expect("valid capacity")
    }

    #[test]
    fn pops_in_index_order_then_lifo() {
        let l = list(4);
        let got: Vec<u32> = std::iter::from_fn(|| l.pop()).collect();
        assert_eq!(got, [0, 1, 2, 3]);
        assert_eq!(l.pop(), None);
        l.push(2);
        l.push(0);
        l.push(3);
        assert_eq!([l.pop(), l.pop(), l.pop(), l.pop()], [Some(3), Some(0), Some(2), None]);
    }

    #[test]
    fn capacity_limits() {
        let empty = list(0);
        assert_eq!(empty.pop(), None);
        let one = list(1);
        assert_eq!((one.pop(), one.pop()), (Some(0), None));
        one.push(0);
        assert_eq!(one.pop(), Some(0));
        assert!(FreeList::new(MAX_CAPACITY + 1).is_none());
    }

    #[test]
    #[cfg(not(debug_assertions))]
    fn out_of_range_push_is_ignored() {
        let l = list(2);
        l.push(7);
        assert_eq!((l.pop(), l.pop(), l.pop()), (Some(0), Some(1), None));
    }

    #[test]
    fn interleaved_pushes_and_pops_conserve_every_index() {
        let mut rng = Rng(0xF4EE_0001);
        let l = list(16);
        let mut held: Vec<u32> = Vec::new();
        for _ in 0..10_000 {
            if rng.percent(50) {
                if let Some(i) = l.pop() {
                    assert!(!held.contains(&i), "{i} popped twice");
                    held.push(i);
                } else {
                    assert_eq!(held.len(), 16);
                }
            } else if !held.is_empty() {
                let k = rng.below(held.len());
                l.push(held.swap_remove(k));
            }
        }
        held.drain(..).for_each(|i| l.push(i));
        let mut all: Vec<u32> = std::iter::from_fn(|| l.pop()).collect();
        all.sort_unstable();
        assert_eq!(all, (0..16).collect::<Vec<u32>>());
    }

    #[test]
    fn stress_never_hands_out_an_index_twice_at_once() {
        const THREADS: usize = 4;
        const ITERS: usize = 200_000;
        const CAPACITY: usize = 6;
        const SEED: u64 = 0x0F4E_E715;
        let l = Arc::new(list(CAPACITY));
        let owner: Arc<Vec<StdU32>> = Arc::new((0..CAPACITY).map(|_| StdU32::new(0)).collect());
        let start = Arc::new(Barrier::new(THREADS));
        let threads: Vec<_> = (0..THREADS)
            .map(|t| {
                let (l, owner, start) = (Arc::clone(&l), Arc::clone(&owner), Arc::clone(&start));
                std::thread::spawn(move || -> Result<u64, String> {
                    let me = t as u32 + 1;
                    let mut rng = Rng(SEED ^ ((t as u64 + 1) * 0x9E37_79B9));
                    let mut held: Vec<u32> = Vec::with_capacity(3);
                    let mut pops = 0;
                    start.wait();
                    for _ in 0..ITERS {
                        // Hold one to three indices and push them back in a random order: a pop
                        // interrupted by "pop A, pop B, push A" elsewhere is the ABA case.
                        for _ in 0..1 + rng.below(3) {
                            let Some(i) = l.pop() else { break };
                            pops += 1;
                            let slot = owner.get(i as usize).ok_or(format!("index {i} out of range"))?;
                            if let Err(other) = slot.compare_exchange(0, me, O::AcqRel, O::Acquire) {
                                return Err(format!("index {i} handed to {me} while held by {other}"));
                            }
                            held.push(i);
                        }
                        rng.shuffle(&mut held);
                        for i in held.drain(..) {
                            owner[i as usize].store(0, O::Release);
                            l.push(i);
                        }
                    }
                    Ok(pops)
                })
            })
            .collect();
        let mut pops = 0;
        for t in threads {
            pops += t.join().expect("thread panicked").unwrap_or_else(|e| panic!("seed {SEED:#x}: {e}"));
        }
        assert!(pops > 0);
        let mut all: Vec<u32> = std::iter::from_fn(|| l.pop()).collect();
        all.sort_unstable();
        assert_eq!(all, (0..CAPACITY as u32).collect::<Vec<u32>>());
    }
}
