//! The handles this library gave out, so a pointer from C is dereferenced only if it is one.
//!
//! Every object C sees (`urma_context_t *`, `urma_jfc_t *`, ...) is the first field of an
//! `Arc`-owned Rust object; its address is entered here with its kind. An entry point looks the
//! pointer up (one read lock, a hash of the address) and works on a clone of the `Arc`, so a
//! concurrent delete cannot free the object under it. A pointer that is not live, or is live but
//! of another kind, is refused with the documented error instead of being followed.

use std::any::Any;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, Weak};

/// What a handle is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Device,
    Context,
    Jfce,
    Jfc,
    Jfr,
    Jetty,
    TargetJetty,
    LocalSeg,
    ImportedSeg,
    TokenId,
}

/// Addresses are already well spread except for their low (alignment) bits.
#[derive(Default)]
pub(crate) struct AddrHasher(u64);

impl Hasher for AddrHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 << 8 | u64::from(*b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_usize(&mut self, n: usize) {
        self.0 = (n as u64 >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

type Entry = (Kind, Arc<dyn Any + Send + Sync>);
type Table = HashMap<usize, Entry, BuildHasherDefault<AddrHasher>>;

static TABLE: RwLock<Option<Table>> = RwLock::new(None);

/// Bumped on every removal: a thread's cached lookups are good while it has not moved.
static REMOVALS: AtomicU64 = AtomicU64::new(0);

/// Entries of a thread's lookup cache.
const CACHED: usize = 4;

thread_local! {
    /// The last few lookups of this thread, valid while [`REMOVALS`] is unchanged: the data path
    /// (poll, post) looks up the same two or three handles over and over, and a shared read lock
    /// per call would bounce its cache line between the threads of both ends. Weak, so a deleted
    /// handle's object goes at once (unless a call is still using it).
    static CACHE: RefCell<(u64, usize, [Option<(usize, Kind, Weak<dyn Any + Send + Sync>)>; CACHED])> =
        const { RefCell::new((u64::MAX, 0, [const { None }; CACHED])) };
}

/// Enters `obj` and returns the pointer C gets (the address of the object, whose first field is
/// the C struct).
pub(crate) fn insert<T: Any + Send + Sync>(kind: Kind, obj: Arc<T>) -> *mut T {
    let p = Arc::as_ptr(&obj) as *mut T;
    let mut t = TABLE.write().unwrap_or_else(|e| e.into_inner());
    t.get_or_insert_with(Table::default).insert(p as usize, (kind, obj));
    p
}

/// The live object of `kind` at `p`, if there is one.
pub(crate) fn get<T: Any + Send + Sync, P>(kind: Kind, p: *const P) -> Option<Arc<T>> {
    if p.is_null() {
        return None;
    }
    let addr = p as usize;
    let gen = REMOVALS.load(Ordering::Acquire);
    let hit = CACHE.with(|c| {
        let c = c.borrow();
        if c.0 != gen {
            return None;
        }
        c.2.iter().flatten().find(|(a, k, _)| *a == addr && *k == kind).and_then(|(_, _, o)| o.upgrade())
    });
    if let Some(obj) = hit {
        return obj.downcast::<T>().ok();
    }
    let t = TABLE.read().unwrap_or_else(|e| e.into_inner());
    let found = t.as_ref()?.get(&addr).filter(|(k, _)| *k == kind).cloned();
    drop(t);
    let (k, obj) = found?;
    CACHE.with(|c| {
        let mut c = c.borrow_mut();
        if c.0 != gen {
            *c = (gen, 0, [const { None }; CACHED]);
        }
        let slot = c.1 % CACHED;
        c.2[slot] = Some((addr, k, Arc::downgrade(&obj)));
        c.1 = c.1.wrapping_add(1);
    });
    obj.downcast::<T>().ok()
}

/// Removes the object of `kind` at `p` (deleting a handle); returns it.
pub(crate) fn remove<T: Any + Send + Sync, P>(kind: Kind, p: *const P) -> Option<Arc<T>> {
    if p.is_null() {
        return None;
    }
    let mut t = TABLE.write().unwrap_or_else(|e| e.into_inner());
    let map = t.as_mut()?;
    match map.get(&(p as usize)) {
        Some((k, _)) if *k == kind => {}
        _ => return None,
    }
    let (_, obj) = map.remove(&(p as usize))?;
    // Under the write lock: a lookup that starts after this sees the new count and misses its
    // cache.
    REMOVALS.fetch_add(1, Ordering::AcqRel);
    obj.downcast::<T>().ok()
}

/// Several lookups under one read lock (a post resolves every SGE's segment this way).
pub(crate) struct Batch(RwLockReadGuard<'static, Option<Table>>);

impl Batch {
    pub(crate) fn new() -> Self {
        Batch(TABLE.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// As [`get`], without taking the lock again; borrows instead of cloning.
    pub(crate) fn get<T: Any + Send + Sync, P>(&self, kind: Kind, p: *const P) -> Option<&T> {
        if p.is_null() {
            return None;
        }
        match self.0.as_ref()?.get(&(p as usize)) {
            Some((k, obj)) if *k == kind => obj.downcast_ref::<T>(),
            _ => None,
        }
    }
}
