//! The data path's handle check without the registry's map: a small per-thread cache of the
//! handles this thread used last, valid while no handle of the library has been deleted since.
//!
//! **Why it is safe.** A pointer from C is never dereferenced because it *looks* right; it is
//! accepted only if it equals a pointer this thread already validated through the registry
//! ([`registry::get`]) and the registry's removal count ([`registry::removals`]) has not moved
//! since. The count is bumped by every delete after the handle leaves the table, so an equal count
//! means the handle is still registered, of the cached kind (each kind has its own cache), and
//! the object at the address is the one validated (a registered object cannot be freed, so its
//! address cannot be reused). A garbage, foreign or deleted pointer misses and takes the slow
//! path, which refuses it as before.
//!
//! **Lifetime during the call.** A delete racing the call on another thread (a caller's bug, but
//! not one that may become a use-after-free) could drop the registry's reference right after the
//! check. Object lookups therefore hold a [`Weak`] and upgrade it: the call works on a strong
//! reference, as with [`registry::get`], at the cost of two uncontended atomic operations on the
//! object's own counter instead of a shard lock, a hash and a probe. The `Weak` also keeps the
//! allocation (not the object) from being reused while the entry exists. Lookups of an
//! immutable value (a segment's key) cache the value itself and touch no object at all.
//!
//! A thread's cache keeps at most [`WAYS`] allocations of deleted objects of each kind until it
//! replaces the entries (or the thread exits); the objects themselves are dropped on delete.

use crate::registry::{self, Kind};
use std::any::Any;
use std::cell::RefCell;
use std::sync::{Arc, Weak};
use std::thread::LocalKey;

/// Entries per kind and thread: a connection's jetty and its two JFCs on each side of a
/// one-thread client and server fit.
pub(crate) const WAYS: usize = 4;

/// One thread's recent handles of one kind, with what the caller keeps of each (`V`).
pub(crate) struct Cache<V> {
    entries: [(usize, u64, Option<V>); WAYS],
    next: usize,
}

impl<V> Cache<V> {
    pub(crate) const fn new() -> Self {
        Cache { entries: [const { (0, 0, None) }; WAYS], next: 0 }
    }

    fn hit(&self, p: usize, now: u64) -> Option<&V> {
        self.entries.iter().find(|(a, g, _)| *a == p && *g == now).and_then(|(_, _, v)| v.as_ref())
    }

    fn fill(&mut self, p: usize, gen: u64, v: V) {
        // Overwrite this handle's stale entry if there is one, else the oldest.
        let at = self.entries.iter().position(|(a, ..)| *a == p).unwrap_or_else(|| {
            let i = self.next;
            self.next = (i + 1) % WAYS;
            i
        });
        self.entries[at] = (p, gen, Some(v));
    }
}

/// A thread's cache of objects of one kind.
pub(crate) type ObjCache<T> = RefCell<Cache<Weak<T>>>;
/// A thread's cache of one immutable value per handle.
pub(crate) type ValCache<V> = RefCell<Cache<V>>;

/// The live object of `kind` at `p` (see the module's safety argument).
pub(crate) fn object<T: Any + Send + Sync, P>(
    cache: &'static LocalKey<ObjCache<T>>,
    kind: Kind,
    p: *const P,
) -> Option<Arc<T>> {
    let now = registry::removals();
    let hit = cache.try_with(|c| c.borrow().hit(p as usize, now).and_then(Weak::upgrade)).ok().flatten();
    if hit.is_some() {
        return hit;
    }
    let obj = registry::get::<T, P>(kind, p)?;
    // `now` was read before the lookup: a delete after it bumps the count past `now`.
    let _ = cache.try_with(|c| c.borrow_mut().fill(p as usize, now, Arc::downgrade(&obj)));
    Some(obj)
}

/// A value of the live object of `kind` at `p` that never changes while it is registered, read
/// by `f` on a miss (see the module's safety argument).
pub(crate) fn value<T: Any + Send + Sync, P, V: Copy>(
    cache: &'static LocalKey<ValCache<V>>,
    kind: Kind,
    p: *const P,
    f: impl FnOnce(&T) -> V,
) -> Option<V> {
    let now = registry::removals();
    if let Ok(Some(v)) = cache.try_with(|c| c.borrow().hit(p as usize, now).copied()) {
        return Some(v);
    }
    let v = registry::with::<T, P, V>(kind, p, f)?;
    let _ = cache.try_with(|c| c.borrow_mut().fill(p as usize, now, v));
    Some(v)
}
