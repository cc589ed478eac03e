//! The NIC's key table: memory registrations, looked up by key on every data movement.
//!
//! A key is `index << 8 | generation`. Deregistering bumps the slot's generation, so a stale key
//! never matches a later registration that reuses the slot. Every lookup checks the generation,
//! the address range and the access rights; the device touches host memory only through
//! [`KeyTable::resolve`].

use crate::source::Life;
use bypass_hal::Access;
use std::sync::Arc;

/// A registration as the device sees it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RegionDesc {
    /// Host pointer to the first byte.
    pub base: *mut u8,
    /// Device address of the first byte.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// Rights.
    pub access: Access,
}

#[derive(Debug, Default)]
struct Entry {
    generation: u8,
    /// The registration and its liveness (for payloads the in-process wire passes by
    /// reference), together so that a lookup tests one `Option`.
    region: Option<(RegionDesc, Arc<Life>)>,
}

/// Why a key lookup failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyFault {
    /// No live registration has this key.
    BadKey,
    /// The range is not inside the region.
    OutOfBounds,
    /// The region lacks the needed right.
    NoAccess,
}

/// The key table.
#[derive(Debug, Default)]
pub(crate) struct KeyTable {
    entries: Vec<Entry>,
    /// Freed slots, reused oldest first and only once [`REUSE_AFTER`] are waiting, so a slot is
    /// reused at most once per that many deregistrations and a stale key (8-bit generation) can
    /// only match again after 256 reuses of its slot.
    free: std::collections::VecDeque<u32>,
}

/// Freed slots kept out of use before the oldest is reused.
const REUSE_AFTER: usize = 256;

/// Most registrations per NIC (keys carry a 24-bit index).
pub(crate) const MAX_KEYS: usize = 1 << 24;

impl KeyTable {
    /// Installs a registration and returns its key, or `None` when the table is full. `life`
    /// is killed by the registration's owner after [`remove`](Self::remove), before it frees
    /// the memory.
    pub(crate) fn insert(&mut self, region: RegionDesc, life: Arc<Life>) -> Option<u32> {
        let index = if self.free.len() >= REUSE_AFTER || self.entries.len() >= MAX_KEYS {
            self.free.pop_front()?
        } else {
            self.entries.push(Entry::default());
            (self.entries.len() - 1) as u32
        };
        let e = &mut self.entries[index as usize];
        e.region = Some((region, life));
        Some(index << 8 | u32::from(e.generation))
    }

    /// Removes the registration with `key`; its key stops working at once.
    pub(crate) fn remove(&mut self, key: u32) {
        let index = key >> 8;
        if let Some(e) = self.entries.get_mut(index as usize) {
            if e.region.is_some() && u32::from(e.generation) == key & 0xff {
                e.region = None;
                e.generation = e.generation.wrapping_add(1);
                self.free.push_back(index);
            }
        }
    }

    /// Translates `len` bytes at device address `addr` under `key`, requiring `need`.
    pub(crate) fn resolve(&self, key: u32, addr: u64, len: u64, need: Access) -> Result<*mut u8, KeyFault> {
        self.resolve_live(key, addr, len, need).map(|(p, _)| p)
    }

    /// [`resolve`](Self::resolve), also returning the registration's liveness (a reference
    /// valid while the caller holds the device lock, which keeps the registration in the table).
    pub(crate) fn resolve_live(
        &self,
        key: u32,
        addr: u64,
        len: u64,
        need: Access,
    ) -> Result<(*mut u8, &Arc<Life>), KeyFault> {
        let e = self.entries.get((key >> 8) as usize).ok_or(KeyFault::BadKey)?;
        let (r, life) = match &e.region {
            Some((r, life)) if u32::from(e.generation) == key & 0xff => (r, life),
            _ => return Err(KeyFault::BadKey),
        };
        let end = addr.checked_add(len).ok_or(KeyFault::OutOfBounds)?;
        if addr < r.addr || end > r.addr + r.len {
            return Err(KeyFault::OutOfBounds);
        }
        if !r.access.contains(need) {
            return Err(KeyFault::NoAccess);
        }
        // SAFETY: `addr - r.addr <= r.len`, so the result stays inside (or one past) the
        // registration's allocation, which is live while it is in the table.
        let p = unsafe { r.base.add((addr - r.addr) as usize) };
        Ok((p, life))
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn stale_keys_bounds_and_rights_are_refused() {
        let mut buf = [0u8; 64];
        let desc = RegionDesc { base: buf.as_mut_ptr(), addr: 0x1000, len: 64, access: Access::LOCAL_WRITE };
        let mut t = KeyTable::default();
        let k = t.insert(desc, Arc::default()).unwrap();
        assert!(t.resolve(k, 0x1000, 64, Access::LOCAL_WRITE).is_ok());
        assert!(t.resolve(k, 0x1040, 0, Access::empty()).is_ok(), "an empty range at the end is in bounds");
        assert_eq!(t.resolve(k, 0x1001, 64, Access::empty()), Err(KeyFault::OutOfBounds));
        assert_eq!(t.resolve(k, 0xfff, 1, Access::empty()), Err(KeyFault::OutOfBounds));
        assert_eq!(t.resolve(k, u64::MAX, 2, Access::empty()), Err(KeyFault::OutOfBounds));
        assert_eq!(t.resolve(k, 0x1000, 1, Access::REMOTE_READ), Err(KeyFault::NoAccess));
        t.remove(k);
        assert_eq!(t.resolve(k, 0x1000, 1, Access::empty()), Err(KeyFault::BadKey));
        let k2 = t.insert(desc, Arc::default()).unwrap();
        assert_ne!(k, k2, "a new registration gets a new key");
        assert_eq!(t.resolve(k, 0x1000, 1, Access::empty()), Err(KeyFault::BadKey));
        t.remove(k); // a stale remove does not take the new registration down
        assert!(t.resolve(k2, 0x1000, 1, Access::empty()).is_ok());
    }

    #[test]
    fn a_stale_key_stays_dead_through_many_reuses() {
        let mut buf = [0u8; 8];
        let desc = RegionDesc { base: buf.as_mut_ptr(), addr: 0x1000, len: 8, access: Access::empty() };
        let mut t = KeyTable::default();
        let stale = t.insert(desc, Arc::default()).unwrap();
        t.remove(stale);
        for _ in 0..20_000 {
            let k = t.insert(desc, Arc::default()).unwrap();
            assert_ne!(k, stale, "a deregistered key came back");
            assert_eq!(t.resolve(stale, 0x1000, 1, Access::empty()), Err(KeyFault::BadKey));
            t.remove(k);
        }
    }
}
