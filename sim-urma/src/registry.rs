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
use std::sync::{Arc, RwLock, RwLockReadGuard};

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
    let t = TABLE.read().unwrap_or_else(|e| e.into_inner());
    lookup(&t, kind, p as usize)
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

fn lookup<T: Any + Send + Sync>(t: &Option<Table>, kind: Kind, addr: usize) -> Option<Arc<T>> {
    match t.as_ref()?.get(&addr) {
        Some((k, obj)) if *k == kind => obj.clone().downcast::<T>().ok(),
        _ => None,
    }
}
