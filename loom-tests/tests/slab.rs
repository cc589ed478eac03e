#![cfg(loom)]
//! loom models of the fixed-size pools: the tagged free list (`free_list`, crate-private, so
//! modelled through its two users), `TxSlab::get` / release, and `BufPool::get` / drop /
//! `into_token` / `from_token`.
//!
//! Each model gives every index an *owner* word that a thread claims (swap, must find it free)
//! right after the pool hands the index out, and clears right before handing it back: a slot or
//! buffer given to two holders at once fails the claim. Buffers additionally carry a loom
//! `UnsafeCell` shadow that each holder writes and reads back, so two holders — or a holder not
//! ordered after the previous one's release — are a loom causality violation, and their bytes in
//! the region are written and read back through `Buf::write` / `Buf::read`. At the end every
//! index is back in its pool exactly once.

use std::sync::atomic::AtomicU8;

use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;

use bypass::buf_pool::{Buf, BufPool, PoolError};
use bypass::tx_ctx::{CallMode, Event, Outcome, TxSlab};
use bypass_hal::{Access, MemoryRegion, RemoteKey};
use bypass_loom_tests::{check, check_mutant, Bound, Mutant};

/// Per-index ownership: 0 = in the pool, else the holder's id.
struct Owners(Vec<AtomicUsize>);

impl Owners {
    fn new(n: usize) -> Owners {
        Owners((0..n).map(|_| AtomicUsize::new(0)).collect())
    }

    /// `me` (non-zero) now holds `index`: nobody else may.
    fn claim(&self, index: u32, me: usize) {
        let previous = self.0[index as usize].swap(me, Ordering::AcqRel);
        assert_eq!(previous, 0, "index {index} handed to holder {me} while holder {previous} has it");
    }

    /// `me` gives `index` back.
    fn clear(&self, index: u32, me: usize) {
        let previous = self.0[index as usize].swap(0, Ordering::AcqRel);
        assert_eq!(previous, me, "index {index} was taken from holder {me} by {previous}");
    }
}

// --- 1. TxSlab: get / release from two threads, with the ABA pattern -------------------------

/// Takes a context (EarlyRsp: its send completion alone releases it) and claims its index.
fn take(slab: &TxSlab, owners: &Owners, me: usize, token: u64) -> Option<(bypass::tx_ctx::TxHandle, u64)> {
    let h = slab.get(CallMode::EarlyRsp, token)?;
    owners.claim(h.index, me);
    Some((h, token))
}

/// Gives a context back through its releasing report, checking the token comes back.
fn give_back(slab: &TxSlab, owners: &Owners, me: usize, (h, token): (bypass::tx_ctx::TxHandle, u64)) {
    owners.clear(h.index, me);
    assert_eq!(slab.complete(h, Event::SendCqe), Ok(Outcome::Released { token }));
}

/// A two-context slab. One thread takes A and B and gives A back — a pop racing with that
/// sees the head return to A (the ABA case the tag defends against) — then gives B back; the
/// other takes two contexts and gives them back. No context is ever held twice.
fn tx_slab_get_release() {
    let slab = Arc::new(TxSlab::new(2).expect("capacity 2 is valid"));
    let owners = Arc::new(Owners::new(2));
    let churn = {
        let (slab, owners) = (Arc::clone(&slab), Arc::clone(&owners));
        thread::spawn(move || {
            let a = take(&slab, &owners, 1, 0xA1);
            let b = take(&slab, &owners, 1, 0xB1);
            if let Some(a) = a {
                give_back(&slab, &owners, 1, a);
            }
            if let Some(b) = b {
                give_back(&slab, &owners, 1, b);
            }
        })
    };
    let popper = {
        let (slab, owners) = (Arc::clone(&slab), Arc::clone(&owners));
        thread::spawn(move || {
            let x = take(&slab, &owners, 2, 0xA2);
            let y = take(&slab, &owners, 2, 0xB2);
            for held in [x, y].into_iter().flatten() {
                give_back(&slab, &owners, 2, held);
            }
        })
    };
    churn.join().expect("churn thread panicked");
    popper.join().expect("popper thread panicked");
    assert_eq!(slab.in_use(), 0);
    let st = slab.stats();
    assert_eq!((st.allocated, st.released), (st.released, st.allocated));
    // Both contexts are back, once each.
    let (x, y) = (slab.get(CallMode::EarlyRsp, 1), slab.get(CallMode::EarlyRsp, 2));
    let (x, y) = (x.expect("a context was lost: none is free"), y.expect("a context was lost: one is free"));
    assert_ne!(x.index, y.index);
    assert!(slab.get(CallMode::EarlyRsp, 3).is_none(), "a context is on the free list twice");
}

#[test]
fn tx_slab_get_and_release_never_share_a_context() {
    check(Bound::AtLeast(4), tx_slab_get_release);
}

#[test]
#[should_panic(expected = "a context was lost")]
fn twin_tx_slab_get_and_release_free_list_without_tag() {
    check_mutant(Mutant::FreeListNoTag, Bound::AtLeast(4), tx_slab_get_release);
}

// --- 2. BufPool: get / drop from two threads, with the ABA pattern --------------------------

/// A registered region for the pool without a device: plain memory. `AtomicU8` only for its
/// interior mutability (the trait's `read` / `write` copy through `as_ptr`); loom runs every
/// model thread on one OS thread, so these bytes are never accessed concurrently.
struct TestRegion {
    mem: Box<[AtomicU8]>,
}

impl TestRegion {
    fn new(len: usize) -> TestRegion {
        TestRegion { mem: (0..len).map(|_| AtomicU8::new(0)).collect() }
    }
}

impl MemoryRegion for TestRegion {
    fn len(&self) -> usize {
        self.mem.len()
    }
    fn addr(&self) -> u64 {
        self.mem.as_ptr() as u64
    }
    fn lkey(&self) -> u32 {
        1
    }
    fn remote_key(&self) -> RemoteKey {
        RemoteKey::from_rkey(2)
    }
    fn access(&self) -> Access {
        Access::LOCAL_WRITE
    }
    fn as_ptr(&self) -> *mut u8 {
        // `AtomicU8` has the layout of `u8`, and its `UnsafeCell` permits writes through a
        // pointer derived from a shared reference.
        self.mem.as_ptr() as *mut u8
    }
}

const BUF_SIZE: usize = 4;

/// A pool plus, per buffer, the owner word and a loom-tracked shadow of its contents.
struct Pool {
    pool: BufPool<TestRegion>,
    owners: Owners,
    shadow: Vec<UnsafeCell<usize>>,
}

impl Pool {
    fn new(count: usize) -> Pool {
        Pool {
            pool: BufPool::new(TestRegion::new(count * BUF_SIZE), BUF_SIZE).expect("valid pool"),
            owners: Owners::new(count),
            shadow: (0..count).map(|_| UnsafeCell::new(0)).collect(),
        }
    }

    /// `me` now holds `b`: claim it, and tag its bytes and its shadow.
    fn hold(&self, b: &mut Buf<'_, TestRegion>, me: usize) {
        self.owners.claim(b.index(), me);
        b.write(0, &[me as u8; BUF_SIZE]).expect("in bounds");
        // SAFETY: loom tracks the cell and panics before an access that races another.
        self.shadow[b.index() as usize].with_mut(|s| unsafe { *s = me });
    }

    /// `me` is done with `b`: its tag must be intact; then unclaim it (the caller drops it or
    /// turns it into a token).
    fn release(&self, b: &Buf<'_, TestRegion>, me: usize) {
        // SAFETY: as in `hold`.
        let shadow = self.shadow[b.index() as usize].with(|s| unsafe { *s });
        assert_eq!(shadow, me, "buffer {} was written by holder {shadow} meanwhile", b.index());
        let mut bytes = [0u8; BUF_SIZE];
        b.read(0, &mut bytes).expect("in bounds");
        assert_eq!(bytes, [me as u8; BUF_SIZE], "buffer {} bytes were overwritten", b.index());
        self.owners.clear(b.index(), me);
    }

    /// After every thread joined: every buffer is back, once.
    fn verify_all_free(&self) {
        assert_eq!(self.pool.in_use(), 0);
        let all: Vec<_> = std::iter::from_fn(|| self.pool.get()).take(self.pool.capacity() + 1).collect();
        let mut idx: Vec<u32> = all.iter().map(Buf::index).collect();
        idx.sort_unstable();
        assert_eq!(idx, (0..self.pool.capacity() as u32).collect::<Vec<_>>(), "a buffer is lost or doubled");
    }
}

/// Two buffers. One thread takes A and B and drops A (the ABA pattern for a concurrent pop),
/// then drops B; the other takes two buffers and drops them.
fn buf_pool_get_drop() {
    let p = Arc::new(Pool::new(2));
    let churn = {
        let p = Arc::clone(&p);
        thread::spawn(move || {
            let mut a = p.pool.get();
            a.iter_mut().for_each(|b| p.hold(b, 1));
            let mut b = p.pool.get();
            b.iter_mut().for_each(|b| p.hold(b, 1));
            for held in [a, b].into_iter().flatten() {
                p.release(&held, 1);
                drop(held);
            }
        })
    };
    let popper = {
        let p = Arc::clone(&p);
        thread::spawn(move || {
            let mut x = p.pool.get();
            x.iter_mut().for_each(|b| p.hold(b, 2));
            let mut y = p.pool.get();
            y.iter_mut().for_each(|b| p.hold(b, 2));
            for held in [x, y].into_iter().flatten() {
                p.release(&held, 2);
            }
        })
    };
    churn.join().expect("churn thread panicked");
    popper.join().expect("popper thread panicked");
    p.verify_all_free();
}

#[test]
fn buf_pool_get_and_drop_never_share_a_buffer() {
    check(Bound::AtLeast(4), buf_pool_get_drop);
}

#[test]
#[should_panic(expected = "a buffer is lost or doubled")]
fn twin_buf_pool_get_and_drop_free_list_without_tag() {
    check_mutant(Mutant::FreeListNoTag, Bound::AtLeast(4), buf_pool_get_drop);
}

// --- 3. BufPool: a posted buffer's token, recovered by two completions at once ---------------

/// One buffer, posted (turned into a token). Two threads recover it from the same token (a
/// duplicated completion); a third takes a free buffer meanwhile. Exactly one recovery
/// succeeds; the buffer is never held twice; a stale token never recovers a reused buffer.
fn token_recovered_once() {
    let p = Arc::new(Pool::new(1));
    let token = {
        let mut b = p.pool.get().expect("a free buffer");
        p.hold(&mut b, 9);
        p.release(&b, 9);
        b.into_token()
    };
    assert_eq!(p.pool.in_use(), 1, "a posted buffer stays out of the pool");
    let recover = |me: usize| {
        let p = Arc::clone(&p);
        thread::spawn(move || match p.pool.from_token(token) {
            Ok(mut b) => {
                assert_eq!(b.index(), token.index);
                p.hold(&mut b, me);
                p.release(&b, me);
                true
            }
            Err(PoolError::StaleToken { .. }) => false,
            Err(e) => panic!("from_token: {e}"),
        })
    };
    let (first, second) = (recover(1), recover(2));
    let getter = {
        let p = Arc::clone(&p);
        thread::spawn(move || {
            if let Some(mut b) = p.pool.get() {
                p.hold(&mut b, 3);
                p.release(&b, 3);
            }
        })
    };
    let recovered = [first, second].map(|t| t.join().expect("recovering thread panicked"));
    getter.join().expect("getter panicked");
    assert_eq!(recovered.iter().filter(|r| **r).count(), 1, "the token must be recovered exactly once");
    assert!(p.pool.from_token(token).is_err(), "a used token must stay stale");
    p.verify_all_free();
}

#[test]
fn buf_pool_token_is_recovered_exactly_once() {
    check(Bound::Exhaustive, token_recovered_once);
}

#[test]
#[should_panic(expected = "the token must be recovered exactly once")]
fn twin_buf_pool_token_from_token_load_store() {
    check_mutant(Mutant::BufFromTokenLoadStore, Bound::Exhaustive, token_recovered_once);
}
