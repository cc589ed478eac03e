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

// ---- the memory allocator's C entry points ------------------------------------------------

use crate::allocator::{self, AllocError, Allocator};
use interim::{entry, log_error, Handles};
use std::ffi::c_int;

/// `OckRpcStatus` values used here.
mod status {
    use std::ffi::c_int;
    pub const OK: c_int = 0;
    pub const INVALID_PARAM: c_int = -2;
    pub const NO_MEMORY: c_int = -7;
}

/// Every allocator created through the C API, by handle.
static ALLOCATORS: Handles<Allocator> = Handles::new();

fn alloc_status(e: &AllocError) -> c_int {
    match e {
        AllocError::NoSpace { .. } => status::NO_MEMORY,
        _ => status::INVALID_PARAM,
    }
}

/// Looks up an allocator handle, logging what is wrong with a bad one.
fn allocator_of(func: &str, handle: usize) -> Result<std::sync::Arc<Allocator>, c_int> {
    ALLOCATORS.get(handle as u64).ok_or_else(|| {
        log_error(&format!(
            "{func}: allocator handle {handle:#x} is not a live allocator (never created, or destroyed)"
        ));
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
    entry("OckRpcMemoryAllocatorCreate", || {
        if options.is_null() || allocator.is_null() {
            log_error("OckRpcMemoryAllocatorCreate: options and allocator must not be NULL");
            return status::INVALID_PARAM;
        }
        // SAFETY: the caller passes a readable options struct; read it as bytes (any alignment).
        let bytes = unsafe { std::ptr::read_unaligned(options.cast::<[u8; allocator::C_OPTIONS_SIZE]>()) };
        let created = allocator::options_from_c(t, &bytes).and_then(|o| Allocator::new(&o));
        match created {
            Ok(a) => {
                let h = ALLOCATORS.insert(a);
                // SAFETY: checked non-NULL; the caller passes a writable handle.
                unsafe { allocator.write_unaligned(h as usize) };
                status::OK
            }
            Err(e) => {
                log_error(&format!("OckRpcMemoryAllocatorCreate: {e}"));
                alloc_status(&e)
            }
        }
    })
}

/// `OckRpcMemoryAllocatorDestroy`. Blocks handed out become invalid with it; the memory is the
/// caller's (or its region's) and is not touched.
#[no_mangle]
pub extern "C" fn OckRpcMemoryAllocatorDestroy(allocator: usize) -> c_int {
    entry("OckRpcMemoryAllocatorDestroy", || match ALLOCATORS.remove(allocator as u64) {
        Some(_) => status::OK,
        None => {
            log_error(&format!(
                "OckRpcMemoryAllocatorDestroy: allocator handle {allocator:#x} is not a live allocator"
            ));
            status::INVALID_PARAM
        }
    })
}

/// `OckRpcMemoryAllocatorSetMrKey`: the key `Allocate` reports with every block.
#[no_mangle]
pub extern "C" fn OckRpcMemoryAllocatorSetMrKey(allocator: usize, mr_key: u32) -> c_int {
    entry("OckRpcMemoryAllocatorSetMrKey", || {
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
    entry(F, || {
        let a = match allocator_of(F, allocator) {
            Ok(a) => a,
            Err(s) => return s,
        };
        if offset.is_null() {
            log_error(&format!("{F}: offset must not be NULL"));
            return status::INVALID_PARAM;
        }
        match a.offset_of(address as u64) {
            Ok(off) => {
                // SAFETY: checked non-NULL; the caller passes a writable uintptr_t.
                unsafe { offset.write_unaligned(off as usize) };
                status::OK
            }
            Err(e) => {
                log_error(&format!("{F}: {e}"));
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
    entry(F, || {
        let a = match allocator_of(F, allocator) {
            Ok(a) => a,
            Err(s) => return s,
        };
        if size.is_null() {
            log_error(&format!("{F}: size must not be NULL"));
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
    entry(F, || {
        let a = match allocator_of(F, allocator) {
            Ok(a) => a,
            Err(s) => return s,
        };
        if address.is_null() || key.is_null() {
            log_error(&format!("{F}: address and key must not be NULL"));
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
                log_error(&format!("{F}: {e}"));
                alloc_status(&e)
            }
        }
    })
}

/// `OckRpcMemoryAllocatorFree`.
#[no_mangle]
pub extern "C" fn OckRpcMemoryAllocatorFree(allocator: usize, address: usize) -> c_int {
    const F: &str = "OckRpcMemoryAllocatorFree";
    entry(F, || {
        let a = match allocator_of(F, allocator) {
            Ok(a) => a,
            Err(s) => return s,
        };
        match a.free(address as u64) {
            Ok(()) => status::OK,
            Err(e) => {
                log_error(&format!("{F}: {e}"));
                alloc_status(&e)
            }
        }
    })
}

/// Stand-ins for the foundation's handle table, entry guard and logger (issue 12's other half),
/// until it lands; then these go and the calls above use the foundation's.
mod interim {
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
    fn allocator_entry_points_validate_handles_and_pointers() {
        let mut opts = [0u8; allocator::C_OPTIONS_SIZE];
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
