//! Memory regions of the C API: the regions `OckRpcRegisterMemoryRegion` (library memory) and
//! `OckRpcRegisterAssignMemoryRegion` (caller memory) register on a server's device, found again
//! by key when a one-sided request or a rendezvous buffer names them.
//!
//! # Keys
//!
//! `OckRpcMemoryRegionInfo` has one key, `lKey`, and callers hand it to their peer as the `rKey`
//! of its `OckRpcRequest`s while using it as the `lKey` of their own. So the key we report is the
//! region's *remote* key (32 bits on verbs and the simulator; on verbs providers such as mlx5 and
//! rxe it equals the local key anyway), and the registry maps it back to the region, whose own
//! local key goes into the work request. A backend whose remote keys do not fit in 32 bits
//! (URMA tokens) cannot be described by this struct and registration fails with
//! `OCK_RPC_ERR_UNSUPPORT`.

use bypass::hal::MemoryRegion;
use std::collections::HashMap;
use std::sync::{Arc, RwLock};

/// Access rights of every region registered through the C API: the peer may READ and WRITE it
/// and the local NIC may write it (READ targets), as hcom's regions allow.
pub(crate) const REGION_ACCESS: bypass::Access =
    bypass::Access::LOCAL_WRITE.union(bypass::Access::REMOTE_READ).union(bypass::Access::REMOTE_WRITE);

/// The regions registered on one device, by the key reported to C.
#[derive(Debug)]
pub(crate) struct Registry<R> {
    by_key: RwLock<HashMap<u32, Arc<R>>>,
}

impl<R> Default for Registry<R> {
    fn default() -> Self {
        Registry { by_key: RwLock::new(HashMap::new()) }
    }
}

/// The C key of a region: its remote key, when it is a 32-bit one.
pub(crate) fn c_key<R: MemoryRegion>(region: &R) -> Option<u32> {
    let k = region.remote_key();
    k.is_rkey().then(|| k.rkey())
}

impl<R: MemoryRegion> Registry<R> {
    /// Enters `region`; returns its C key.
    pub(crate) fn insert(&self, region: Arc<R>) -> Result<u32, String> {
        let key = c_key(&*region).ok_or_else(|| {
            format!(
                "this backend's remote key {:?} does not fit the 32-bit lKey of OckRpcMemoryRegionInfo",
                region.remote_key()
            )
        })?;
        let mut map = self.by_key.write().unwrap_or_else(|p| p.into_inner());
        // The device never hands out a live key twice; a stale entry would mean a region we no
        // longer track, so the new one wins.
        map.insert(key, region);
        Ok(key)
    }

    /// Removes the region of `key` (it is deregistered when the last operation using it is done).
    pub(crate) fn remove(&self, key: u32) -> Option<Arc<R>> {
        self.by_key.write().unwrap_or_else(|p| p.into_inner()).remove(&key)
    }

    /// Number of regions.
    pub(crate) fn len(&self) -> usize {
        self.by_key.read().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// The region of `key` and the offset of `address` in it, when `address..address + len` lies
    /// inside it; otherwise what is wrong.
    pub(crate) fn resolve(&self, key: u32, address: u64, len: u64) -> Result<(Arc<R>, usize), String> {
        let map = self.by_key.read().unwrap_or_else(|p| p.into_inner());
        let Some(region) = map.get(&key) else {
            return Err(format!(
                "lKey {key:#x} names no memory region registered on this device (register it with OckRpcRegisterMemoryRegion)"
            ));
        };
        let start = region.addr();
        let end = start + region.len() as u64;
        match address.checked_add(len) {
            Some(e) if address >= start && e <= end => Ok((Arc::clone(region), (address - start) as usize)),
            _ => Err(format!(
                "local range {address:#x}+{len} is outside the region of lKey {key:#x} ({start:#x}+{})",
                region.len()
            )),
        }
    }
}

/// Stand-ins for the foundation's handle table, entry guard and logger (issue 12's other half),
/// until it lands; then these go and the calls above use the foundation's.
pub(crate) mod interim {
    use std::ffi::c_int;
    use std::panic::{catch_unwind, AssertUnwindSafe};
    use std::sync::{Arc, Mutex};

    /// A generational table: a handle is `generation << 32 | (index + 1)`, never 0, and a stale
    /// or made-up one finds nothing.
    /// Slots (generation, value) and the free slot indexes.
    type Slots<T> = (Vec<(u32, Option<Arc<T>>)>, Vec<u32>);

    #[derive(Debug)]
    pub(crate) struct Handles<T> {
        slots: Mutex<Slots<T>>,
    }

    impl<T> Handles<T> {
        pub(crate) const fn new() -> Self {
            Handles { slots: Mutex::new((Vec::new(), Vec::new())) }
        }

        fn lock(&self) -> std::sync::MutexGuard<'_, Slots<T>> {
            self.slots.lock().unwrap_or_else(|p| p.into_inner())
        }

        pub(crate) fn insert(&self, value: T) -> u64 {
            let mut g = self.lock();
            let (slots, free) = &mut *g;
            let index = match free.pop() {
                Some(i) => i,
                None => {
                    slots.push((0, None));
                    (slots.len() - 1) as u32
                }
            };
            let slot = &mut slots[index as usize];
            slot.0 = slot.0.wrapping_add(1).max(1);
            slot.1 = Some(Arc::new(value));
            (u64::from(slot.0) << 32) | (u64::from(index) + 1)
        }

        fn index_of(handle: u64) -> Option<(usize, u32)> {
            let low = handle as u32;
            (low != 0).then(|| ((low - 1) as usize, (handle >> 32) as u32))
        }

        pub(crate) fn get(&self, handle: u64) -> Option<Arc<T>> {
            let (i, gen) = Self::index_of(handle)?;
            let g = self.lock();
            match g.0.get(i) {
                Some((g2, Some(v))) if *g2 == gen => Some(Arc::clone(v)),
                _ => None,
            }
        }

        pub(crate) fn remove(&self, handle: u64) -> Option<Arc<T>> {
            let (i, gen) = Self::index_of(handle)?;
            let mut g = self.lock();
            let (slots, free) = &mut *g;
            match slots.get_mut(i) {
                Some((g2, v @ Some(_))) if *g2 == gen => {
                    let out = v.take();
                    free.push(i as u32);
                    out
                }
                _ => None,
            }
        }
    }

    /// Runs a C entry point; a panic becomes `OCK_RPC_ERR` and a log line.
    pub(crate) fn entry(func: &str, f: impl FnOnce() -> c_int) -> c_int {
        catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| {
            log_error(&format!("{func}: internal error (a panic was caught at the C boundary)"));
            -1
        })
    }

    /// Logs an error line (the default sink of the C API is stdout).
    pub(crate) fn log_error(msg: &str) {
        println!("[hcom4db] ERROR {msg}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bypass::hal::Device;
    use bypass::sim::{Engine, Fabric};

    #[test]
    fn keys_resolve_to_their_regions_and_ranges_are_checked() {
        let fabric = Fabric::new(Engine::Inline);
        let nic = fabric.add_nic();
        let reg = Registry::default();
        let a = Arc::new(nic.register(4096, REGION_ACCESS).unwrap());
        let b = Arc::new(nic.register(100, REGION_ACCESS).unwrap());
        let (ka, kb) = (reg.insert(a.clone()).unwrap(), reg.insert(b.clone()).unwrap());
        assert_ne!(ka, kb);
        assert_eq!(reg.len(), 2);
        let (r, off) = reg.resolve(ka, a.addr() + 10, 4086).unwrap();
        assert!(Arc::ptr_eq(&r, &a));
        assert_eq!(off, 10);
        assert!(reg.resolve(ka, a.addr() + 10, 4087).unwrap_err().contains("outside"));
        assert!(reg.resolve(ka, a.addr() - 1, 1).unwrap_err().contains("outside"));
        assert!(reg.resolve(ka, u64::MAX, 2).unwrap_err().contains("outside"));
        assert!(reg.resolve(kb, a.addr(), 1).unwrap_err().contains("outside"));
        assert!(reg.resolve(ka ^ kb ^ 0x5555, a.addr(), 1).unwrap_err().contains("no memory region"));
        assert!(reg.remove(ka).is_some());
        assert!(reg.resolve(ka, a.addr(), 1).is_err());
        assert!(reg.remove(ka).is_none());
    }
}
