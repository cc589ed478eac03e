//! Registered memory a server knows, looked up by address, length and key: what rendezvous
//! calls (`OckRpcMessageInfo`), the rendezvous malloc hook and one-sided I/O name their memory
//! by. The memory side (`OckRpcRegister*MemoryRegion`) inserts and removes entries; the
//! rendezvous paths find them.

use bypass::backend::AnyRegion;
use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

/// A registered region.
#[derive(Debug)]
pub struct RegionEntry {
    /// Address of its first byte.
    pub base: usize,
    /// Length in bytes.
    pub len: usize,
    /// Its local key (`lKey`).
    pub key: u32,
    /// The region.
    pub region: AnyRegion,
}

/// The regions of one server, by base address.
#[derive(Debug, Default)]
pub struct RegionRegistry {
    map: RwLock<BTreeMap<usize, Arc<RegionEntry>>>,
}

impl RegionRegistry {
    /// Adds `entry` (replacing one at the same base address).
    pub fn insert(&self, entry: RegionEntry) -> Arc<RegionEntry> {
        let e = Arc::new(entry);
        self.map.write().unwrap_or_else(|p| p.into_inner()).insert(e.base, e.clone());
        e
    }

    /// Removes the region at `base`.
    pub fn remove(&self, base: usize) -> Option<Arc<RegionEntry>> {
        self.map.write().unwrap_or_else(|p| p.into_inner()).remove(&base)
    }

    /// The region holding `[addr, addr + len)` registered with `key`, and the offset of `addr`.
    pub fn find(&self, addr: usize, len: usize, key: u32) -> Option<(Arc<RegionEntry>, usize)> {
        let map = self.map.read().unwrap_or_else(|p| p.into_inner());
        let (_, e) = map.range(..=addr).next_back()?;
        let offset = addr - e.base;
        let end = offset.checked_add(len)?;
        (e.key == key && end <= e.len).then(|| (e.clone(), offset))
    }

    /// Every region (e.g. to drop them with the server).
    pub fn clear(&self) {
        self.map.write().unwrap_or_else(|p| p.into_inner()).clear();
    }
}
