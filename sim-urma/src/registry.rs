//! The handles this library gave out, so a pointer from C is dereferenced only if it is one.
//!
//! Every object C sees (`urma_context_t *`, `urma_jfc_t *`, ...) is the first field of an
//! `Arc`-owned Rust object; its address is entered here with its kind. An entry point looks the
//! pointer up and works on a clone of the `Arc` (or, for [`with`], under the lookup's read lock),
//! so a concurrent delete cannot free the object under it. A pointer that is not live, or is live
//! but of another kind, is refused with the documented error instead of being followed.
//!
//! The table is split into [`SHARDS`] by address, each behind its own read-write lock: the data
//! path looks a handle up on every call, and the two ends of a connection (a client thread and a
//! server thread) use different handles, so they take different locks and do not bounce one
//! cache line between their cores.

use std::any::Any;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

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

/// Number of independently locked parts of the table.
const SHARDS: usize = 64;

/// One part, padded to its own cache line pair.
#[repr(align(128))]
struct Shard(RwLock<Option<Table>>);

static TABLE: [Shard; SHARDS] = [const { Shard(RwLock::new(None)) }; SHARDS];

fn shard(addr: usize) -> &'static RwLock<Option<Table>> {
    // Objects are at least 8-byte aligned and usually 64 or more bytes apart.
    &TABLE[(addr >> 6 ^ addr >> 12) % SHARDS].0
}

/// Handles removed so far: the data path's per-thread caches ([`crate::handle_cache`]) trust an
/// entry only while this has not moved since it was validated here.
static REMOVALS: AtomicU64 = AtomicU64::new(0);

/// The number of handles removed so far (see [`REMOVALS`]).
pub(crate) fn removals() -> u64 {
    REMOVALS.load(Ordering::Acquire)
}

/// Enters `obj` and returns the pointer C gets (the address of the object, whose first field is
/// the C struct).
pub(crate) fn insert<T: Any + Send + Sync>(kind: Kind, obj: Arc<T>) -> *mut T {
    let p = Arc::as_ptr(&obj) as *mut T;
    let mut t = shard(p as usize).write().unwrap_or_else(|e| e.into_inner());
    t.get_or_insert_with(Table::default).insert(p as usize, (kind, obj));
    p
}

/// Runs `f` on the live object of `kind` at `p`, under the lookup's read lock (no reference
/// count touched); `None` if there is none.
pub(crate) fn with<T: Any + Send + Sync, P, R>(
    kind: Kind,
    p: *const P,
    f: impl FnOnce(&T) -> R,
) -> Option<R> {
    if p.is_null() {
        return None;
    }
    let t = shard(p as usize).read().unwrap_or_else(|e| e.into_inner());
    match t.as_ref()?.get(&(p as usize)) {
        Some((k, obj)) if *k == kind => obj.downcast_ref::<T>().map(f),
        _ => None,
    }
}

/// The live object of `kind` at `p`, if there is one.
pub(crate) fn get<T: Any + Send + Sync, P>(kind: Kind, p: *const P) -> Option<Arc<T>> {
    if p.is_null() {
        return None;
    }
    let t = shard(p as usize).read().unwrap_or_else(|e| e.into_inner());
    match t.as_ref()?.get(&(p as usize)) {
        Some((k, obj)) if *k == kind => obj.clone().downcast::<T>().ok(),
        _ => None,
    }
}

/// Removes the object of `kind` at `p` (deleting a handle); returns it.
pub(crate) fn remove<T: Any + Send + Sync, P>(kind: Kind, p: *const P) -> Option<Arc<T>> {
    if p.is_null() {
        return None;
    }
    let mut t = shard(p as usize).write().unwrap_or_else(|e| e.into_inner());
    let map = t.as_mut()?;
    match map.get(&(p as usize)) {
        Some((k, _)) if *k == kind => {}
        _ => return None,
    }
    let (_, obj) = map.remove(&(p as usize))?;
    // After the entry left the table, before the object can be dropped: a cache that read the
    // old count before this either validated the handle earlier or will miss it in the table.
    REMOVALS.fetch_add(1, Ordering::AcqRel);
    obj.downcast::<T>().ok()
}
