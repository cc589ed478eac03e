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
        // C names local memory by its address in this process (lAddress).
        let start = region.as_ptr() as u64;
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

// ---- regions behind C handles ---------------------------------------------------------------

use bypass::hal::Device;
use interim::{entry, log_error, Handles};
use std::ffi::c_int;
use std::ptr::NonNull;
use std::sync::OnceLock;

/// `OckRpcStatus` values used here.
mod status {
    use std::ffi::c_int;
    pub const OK: c_int = 0;
    pub const INVALID_PARAM: c_int = -2;
    pub const NO_MEMORY: c_int = -7;
    pub const UNSUPPORT: c_int = -14;
}

/// `OckRpcMemoryRegionInfo`: `{lAddress, lKey, size}` (16 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RegionInfo {
    /// First byte, in this process.
    pub l_address: usize,
    /// The key (see the module docs).
    pub l_key: u32,
    /// Length in bytes.
    pub size: u32,
}

/// A failure to hand back to C: the status and the log line.
pub(crate) type Failure = (c_int, String);

/// A registered region behind an `OckRpcMemoryRegion` handle, whatever its backend.
pub(crate) trait RegionRecord: Send + Sync {
    /// What `OckRpcGetMemoryRegionInfo` reports.
    fn info(&self) -> RegionInfo;
    /// The server handle it was registered through.
    fn owner(&self) -> u64;
    /// Removes it from its device's registry: its key stops resolving (the region itself is
    /// deregistered when operations still using it are done).
    fn forget(&self);
}

struct Record<R> {
    region: Arc<R>,
    key: u32,
    owner: u64,
    registry: Arc<Registry<R>>,
}

impl<R: MemoryRegion> RegionRecord for Record<R> {
    fn info(&self) -> RegionInfo {
        RegionInfo {
            l_address: self.region.as_ptr() as usize,
            l_key: self.key,
            size: self.region.len() as u32,
        }
    }
    fn owner(&self) -> u64 {
        self.owner
    }
    fn forget(&self) {
        self.registry.remove(self.key);
    }
}

/// The memory side of one server: its device and the regions registered on it. The server
/// object of each backend holds one (an `Arc`, shared with its clients' [`ClientMemory`]).
#[derive(Debug)]
pub(crate) struct DeviceMemory<D: Device> {
    pub device: D,
    pub registry: Arc<Registry<D::Region>>,
}

impl<D: Device> DeviceMemory<D> {
    pub(crate) fn new(device: D) -> Self {
        DeviceMemory { device, registry: Arc::new(Registry::default()) }
    }
}

/// What `OckRpcRegisterMemoryRegion` needs of a server, whatever its backend.
pub(crate) trait MemoryHost: Send + Sync {
    /// Registers `len` bytes (library memory, or the caller's at `external`) for `owner`.
    fn register(
        &self,
        owner: u64,
        len: usize,
        external: Option<NonNull<u8>>,
    ) -> Result<Box<dyn RegionRecord>, Failure>;
}

impl<D: Device> MemoryHost for DeviceMemory<D> {
    fn register(
        &self,
        owner: u64,
        len: usize,
        external: Option<NonNull<u8>>,
    ) -> Result<Box<dyn RegionRecord>, Failure> {
        let registered = match external {
            None => self.device.register(len, REGION_ACCESS),
            // SAFETY: the C caller of OckRpcRegisterAssignMemoryRegion promises, as the API
            // documents, that `len` bytes at the address stay allocated and in place until it
            // destroys the region; the device only reaches them through the registration.
            Some(ptr) => unsafe { self.device.register_external(ptr.as_ptr(), len, REGION_ACCESS) },
        };
        let region = Arc::new(registered.map_err(|e| {
            let status = match e {
                bypass::hal::Error::OutOfResources(_) => status::NO_MEMORY,
                _ => status::INVALID_PARAM,
            };
            (status, format!("registering {len} bytes failed: {e}"))
        })?);
        let key = self.registry.insert(Arc::clone(&region)).map_err(|m| (status::UNSUPPORT, m))?;
        Ok(Box::new(Record { region, key, owner, registry: Arc::clone(&self.registry) }))
    }
}

/// How the memory functions find servers: the foundation's server table answers with the
/// server's [`MemoryHost`]. Set once, at the first server's creation.
pub(crate) static SERVER_MEMORY: OnceLock<ServerLookup> = OnceLock::new();

/// The server table's lookup of a server's memory side.
pub(crate) type ServerLookup = fn(u64) -> Option<Arc<dyn MemoryHost>>;

/// Every region registered through the C API, by handle.
static REGIONS: Handles<Box<dyn RegionRecord>> = Handles::new(0x3e);

fn host_of(func: &str, server: usize) -> Result<Arc<dyn MemoryHost>, Failure> {
    SERVER_MEMORY.get().and_then(|f| f(server as u64)).ok_or_else(|| {
        (status::INVALID_PARAM, format!("{func}: server handle {server:#x} is not a live server"))
    })
}

fn register_entry(func: &str, server: usize, size: u64, external: Option<usize>, mr: *mut usize) -> c_int {
    let result = (|| {
        if mr.is_null() {
            return Err((status::INVALID_PARAM, format!("{func}: mr must not be NULL")));
        }
        if size == 0 {
            return Err((
                status::INVALID_PARAM,
                format!("{func}: size is 0 (give the region's length in bytes)"),
            ));
        }
        if size > u64::from(u32::MAX) {
            return Err((
                status::INVALID_PARAM,
                format!(
                    "{func}: size {size} does not fit the 32-bit size of OckRpcMemoryRegionInfo (at most {})",
                    u32::MAX
                ),
            ));
        }
        let ptr = match external {
            None => None,
            Some(a) => {
                if a.checked_add(size as usize).is_none() {
                    return Err((
                        status::INVALID_PARAM,
                        format!("{func}: address {a:#x} + size {size} overflows"),
                    ));
                }
                Some(NonNull::new(a as *mut u8).ok_or_else(|| {
                    (status::INVALID_PARAM, format!("{func}: address is 0 (pass the memory to register)"))
                })?)
            }
        };
        let host = host_of(func, server)?;
        let record =
            host.register(server as u64, size as usize, ptr).map_err(|(s, m)| (s, format!("{func}: {m}")))?;
        Ok(REGIONS.insert(record))
    })();
    match result {
        Ok(h) => {
            // SAFETY: checked non-NULL above; the caller passes a writable handle.
            unsafe { mr.write_unaligned(h as usize) };
            status::OK
        }
        Err((s, m)) => {
            log_error(&m);
            s
        }
    }
}

/// `OckRpcRegisterMemoryRegion`: `size` bytes of library memory (page-aligned, zeroed),
/// registered on the server's device for local and remote access.
///
/// # Safety
/// `mr` is NULL or points to a writable `OckRpcMemoryRegion`.
#[no_mangle]
pub unsafe extern "C" fn OckRpcRegisterMemoryRegion(server: usize, size: u64, mr: *mut usize) -> c_int {
    entry("OckRpcRegisterMemoryRegion", || {
        register_entry("OckRpcRegisterMemoryRegion", server, size, None, mr)
    })
}

/// `OckRpcRegisterAssignMemoryRegion`: registers the caller's `size` bytes at `address`, which
/// must stay allocated until the region is destroyed.
///
/// # Safety
/// `mr` is NULL or points to a writable `OckRpcMemoryRegion`; `address..address + size` is
/// memory the caller owns, for as long as the region lives.
#[no_mangle]
pub unsafe extern "C" fn OckRpcRegisterAssignMemoryRegion(
    server: usize,
    address: usize,
    size: u64,
    mr: *mut usize,
) -> c_int {
    const F: &str = "OckRpcRegisterAssignMemoryRegion";
    entry(F, || register_entry(F, server, size, Some(address), mr))
}

/// `OckRpcGetMemoryRegionInfo`.
///
/// # Safety
/// `info` is NULL or points to a writable `OckRpcMemoryRegionInfo`.
#[no_mangle]
pub unsafe extern "C" fn OckRpcGetMemoryRegionInfo(mr: usize, info: *mut RegionInfo) -> c_int {
    const F: &str = "OckRpcGetMemoryRegionInfo";
    entry(F, || {
        let Some(record) = REGIONS.get(mr as u64) else {
            log_error(&format!("{F}: {mr:#x} is not a live memory region (never registered, or destroyed)"));
            return status::INVALID_PARAM;
        };
        if info.is_null() {
            log_error(&format!("{F}: info must not be NULL"));
            return status::INVALID_PARAM;
        }
        // SAFETY: checked non-NULL; the caller passes a writable struct.
        unsafe { info.write_unaligned(record.info()) };
        status::OK
    })
}

/// `OckRpcDestroyMemoryRegion`: the handle and key stop working at once. A handle that is not a
/// live region of `server` is logged and ignored.
#[no_mangle]
pub extern "C" fn OckRpcDestroyMemoryRegion(server: usize, mr: usize) {
    const F: &str = "OckRpcDestroyMemoryRegion";
    entry(F, || {
        match REGIONS.get(mr as u64) {
            None => log_error(&format!("{F}: {mr:#x} is not a live memory region; nothing to do")),
            Some(r) if r.owner() != server as u64 => log_error(&format!(
                "{F}: region {mr:#x} was registered through server {:#x}, not {server:#x}; nothing done",
                r.owner()
            )),
            Some(_) => {
                if let Some(r) = REGIONS.remove(mr as u64) {
                    r.forget();
                }
            }
        }
        status::OK
    });
}

/// Destroys every region registered through `server` (its `OckRpcServerDestroy` calls this).
pub(crate) fn destroy_regions_of(server: u64) -> usize {
    let gone = REGIONS.remove_where(|r| r.owner() == server);
    for r in &gone {
        r.forget();
    }
    gone.len()
}

/// Stand-ins for the foundation's handle table, entry guard and logger (issue 12's other half),
/// until it lands; then these go and the calls above use the foundation's.
pub(crate) mod interim {
    use std::ffi::c_int;
    use std::panic::{catch_unwind, AssertUnwindSafe};
    use std::sync::{Arc, Mutex};

    /// Slots (generation, value) and the free slot indexes.
    type Slots<T> = (Vec<(u32, Option<Arc<T>>)>, Vec<u32>);

    /// A generational table of one kind of object. A handle is
    /// `kind << 56 | generation << 32 | (index + 1)` (generation 24 bits, never 0): never 0, a
    /// stale or made-up one finds nothing, and a handle of another kind never matches.
    #[derive(Debug)]
    pub(crate) struct Handles<T> {
        kind: u8,
        slots: Mutex<Slots<T>>,
    }

    const GEN_MASK: u32 = 0x00ff_ffff;

    impl<T> Handles<T> {
        pub(crate) const fn new(kind: u8) -> Self {
            Handles { kind, slots: Mutex::new((Vec::new(), Vec::new())) }
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
            slot.0 = (slot.0 % GEN_MASK) + 1;
            slot.1 = Some(Arc::new(value));
            (u64::from(self.kind) << 56) | (u64::from(slot.0) << 32) | (u64::from(index) + 1)
        }

        fn index_of(&self, handle: u64) -> Option<(usize, u32)> {
            let low = handle as u32;
            let ok = low != 0 && (handle >> 56) as u8 == self.kind;
            ok.then(|| ((low - 1) as usize, (handle >> 32) as u32 & GEN_MASK))
        }

        pub(crate) fn get(&self, handle: u64) -> Option<Arc<T>> {
            let (i, gen) = self.index_of(handle)?;
            let g = self.lock();
            match g.0.get(i) {
                Some((g2, Some(v))) if *g2 == gen => Some(Arc::clone(v)),
                _ => None,
            }
        }

        pub(crate) fn remove(&self, handle: u64) -> Option<Arc<T>> {
            let (i, gen) = self.index_of(handle)?;
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

        /// Removes every entry `pred` selects; returns them.
        pub(crate) fn remove_where(&self, pred: impl Fn(&T) -> bool) -> Vec<Arc<T>> {
            let mut g = self.lock();
            let (slots, free) = &mut *g;
            let mut out = Vec::new();
            for (i, (_, v)) in slots.iter_mut().enumerate() {
                if v.as_deref().is_some_and(&pred) {
                    out.extend(v.take());
                    free.push(i as u32);
                }
            }
            out
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
