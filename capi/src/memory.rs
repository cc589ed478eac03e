//! Memory regions of the C API: `OckRpcRegisterMemoryRegion` (library memory) and
//! `OckRpcRegisterAssignMemoryRegion` (caller memory) register on a server's device and record
//! the region in the server's [`RegionRegistry`], where one-sided requests, rendezvous calls and
//! the rendezvous malloc hook find it by address, length and key.
//!
//! # Keys
//!
//! `OckRpcMemoryRegionInfo` has one key, `lKey`, and callers hand it to their peer as the `rKey`
//! of its `OckRpcRequest`s while using it as the `lKey` of their own. So the key we report (and
//! record) is the region's *remote* key (32 bits on verbs and the simulator; on verbs providers
//! such as mlx5 and rxe it equals the local key anyway); the work request gets the region's own
//! local key from the region. A backend whose remote keys do not fit in 32 bits (URMA tokens)
//! cannot be described by this struct: registration fails with `OCK_RPC_ERR_UNSUPPORT`.
//!
//! # Lifetime
//!
//! The server's registry owns the region; a region handle names the server and refers to the
//! entry weakly. `OckRpcDestroyMemoryRegion` removes the entry and ends the handle (operations
//! already posted keep the region itself alive until the NIC is done with it). Regions of a
//! destroyed server go with its object, and a region handle whose server is gone is refused.

use crate::guard::guard;
use crate::handle::{Handle, HandleTable};
use crate::regions::{RegionEntry, RegionRegistry};
use crate::server::{self, ServerObj};
use crate::types::*;
use bypass::backend::{Nic, Regions};
use bypass::hal::MemoryRegion;
use std::sync::{Arc, Weak};

/// Access rights of every region registered through the C API: the peer may READ and WRITE it
/// and the local NIC may write it (READ targets), as hcom's regions allow.
pub(crate) const REGION_ACCESS: bypass::Access =
    bypass::Access::LOCAL_WRITE.union(bypass::Access::REMOTE_READ).union(bypass::Access::REMOTE_WRITE);

/// The C key of a region: its remote key, when it is a 32-bit one.
pub(crate) fn c_key<R: MemoryRegion>(region: &R) -> Option<u32> {
    let k = region.remote_key();
    k.is_rkey().then(|| k.rkey())
}

/// A region behind an `OckRpcMemoryRegion` handle.
#[derive(Debug)]
struct Record {
    /// The server it was registered through.
    server: Handle,
    /// The server's registry holds the region; when the server object goes, so does it.
    entry: Weak<RegionEntry>,
}

/// Every live region handle.
static REGIONS: HandleTable<Record> = HandleTable::new(0x3E);

/// A failure to hand back to C: the status and the log line.
type Failure = (OckRpcStatus, String);

fn fail(f: Failure) -> OckRpcStatus {
    crate::log!(crate::log::ERROR, "{}", f.1);
    f.0
}

/// Registers `len` bytes on `dev` (library memory, or the caller's at `external`).
fn register_on<D: Nic>(dev: &D, len: usize, external: Option<*mut u8>) -> Result<RegionEntry, Failure> {
    let registered = match external {
        None => dev.register(len, REGION_ACCESS),
        // SAFETY: the C caller of OckRpcRegisterAssignMemoryRegion promises, as the API
        // documents, that `len` bytes at the address stay allocated and in place until it
        // destroys the region; the device only reaches them through the registration.
        Some(ptr) => unsafe { dev.register_external(ptr, len, REGION_ACCESS) },
    };
    let region = Arc::new(registered.map_err(|e| {
        let status = match e {
            bypass::hal::Error::OutOfResources(_) => OCK_RPC_ERR_NO_MEMORY,
            _ => OCK_RPC_ERR_INVALID_PARAM,
        };
        (status, format!("registering {len} bytes failed: {e}"))
    })?);
    let key = c_key(&*region).ok_or_else(|| {
        (
            OCK_RPC_ERR_UNSUPPORT,
            format!(
                "this backend's remote key {:?} does not fit the 32-bit lKey of OckRpcMemoryRegionInfo",
                region.remote_key()
            ),
        )
    })?;
    Ok(RegionEntry { base: region.as_ptr() as usize, len, key, region: D::wrap::<Regions>(region) })
}

fn register(func: &str, server: Handle, size: u64, external: Option<usize>, mr: *mut Handle) -> OckRpcStatus {
    let result = (|| {
        if mr.is_null() {
            return Err((OCK_RPC_ERR_INVALID_PARAM, format!("{func}: mr must not be NULL")));
        }
        if size == 0 {
            return Err((
                OCK_RPC_ERR_INVALID_PARAM,
                format!("{func}: size is 0 (give the region's length in bytes)"),
            ));
        }
        if size > u64::from(u32::MAX) {
            return Err((
                OCK_RPC_ERR_INVALID_PARAM,
                format!(
                    "{func}: size {size} does not fit the 32-bit size of OckRpcMemoryRegionInfo (at most {})",
                    u32::MAX
                ),
            ));
        }
        let ptr = match external {
            None => None,
            Some(0) => {
                return Err((
                    OCK_RPC_ERR_INVALID_PARAM,
                    format!("{func}: address is 0 (pass the memory to register)"),
                ))
            }
            Some(a) if a.checked_add(size as usize).is_none() => {
                return Err((
                    OCK_RPC_ERR_INVALID_PARAM,
                    format!("{func}: address {a:#x} + size {size} overflows"),
                ))
            }
            Some(a) => Some(a as *mut u8),
        };
        let obj = server::lookup(server).ok_or_else(|| {
            (OCK_RPC_ERR_INVALID_PARAM, format!("{func}: server handle {server:#x} is not a live server"))
        })?;
        let entry = bypass::match_any!(obj.dev(), d => register_on(d, size as usize, ptr))
            .map_err(|(s, m)| (s, format!("{func}: {m}")))?;
        let entry = obj.regions().insert(entry);
        Ok(REGIONS.insert(Arc::new(Record { server, entry: Arc::downgrade(&entry) })))
    })();
    match result {
        Ok(h) => {
            // SAFETY: checked non-NULL above; the caller passes a writable handle.
            unsafe { mr.write_unaligned(h) };
            OCK_RPC_OK
        }
        Err(f) => fail(f),
    }
}

/// `OckRpcRegisterMemoryRegion`: `size` bytes of library memory (page-aligned, zeroed),
/// registered on the server's device for local and remote access.
///
/// # Safety
/// `mr` is NULL or points to a writable `OckRpcMemoryRegion`.
#[no_mangle]
pub unsafe extern "C" fn OckRpcRegisterMemoryRegion(
    server: Handle,
    size: u64,
    mr: *mut Handle,
) -> OckRpcStatus {
    const F: &str = "OckRpcRegisterMemoryRegion";
    guard(F, OCK_RPC_ERR, || register(F, server, size, None, mr))
}

/// `OckRpcRegisterAssignMemoryRegion`: registers the caller's `size` bytes at `address`, which
/// must stay allocated until the region is destroyed.
///
/// # Safety
/// `mr` is NULL or points to a writable `OckRpcMemoryRegion`; `address..address + size` is
/// memory the caller owns, for as long as the region lives.
#[no_mangle]
pub unsafe extern "C" fn OckRpcRegisterAssignMemoryRegion(
    server: Handle,
    address: usize,
    size: u64,
    mr: *mut Handle,
) -> OckRpcStatus {
    const F: &str = "OckRpcRegisterAssignMemoryRegion";
    guard(F, OCK_RPC_ERR, || register(F, server, size, Some(address), mr))
}

/// The live record of `mr`: refused when the handle is dead or its server is gone (then the
/// record goes too).
fn record_of(mr: Handle) -> Option<(Arc<Record>, Arc<RegionEntry>, Arc<ServerObj>)> {
    let rec = REGIONS.get(mr)?;
    match (server::lookup(rec.server), rec.entry.upgrade()) {
        (Some(obj), Some(entry)) => Some((rec, entry, obj)),
        _ => {
            REGIONS.remove(mr);
            None
        }
    }
}

/// `OckRpcGetMemoryRegionInfo`.
///
/// # Safety
/// `info` is NULL or points to a writable `OckRpcMemoryRegionInfo`.
#[no_mangle]
pub unsafe extern "C" fn OckRpcGetMemoryRegionInfo(
    mr: Handle,
    info: *mut OckRpcMemoryRegionInfo,
) -> OckRpcStatus {
    const F: &str = "OckRpcGetMemoryRegionInfo";
    guard(F, OCK_RPC_ERR, || {
        let Some((_, e, _)) = record_of(mr) else {
            return fail((
                OCK_RPC_ERR_INVALID_PARAM,
                format!("{F}: {mr:#x} is not a live memory region (never registered, destroyed, or its server was)"),
            ));
        };
        if info.is_null() {
            return fail((OCK_RPC_ERR_INVALID_PARAM, format!("{F}: info must not be NULL")));
        }
        let out = OckRpcMemoryRegionInfo { l_address: e.base, l_key: e.key, size: e.len as u32 };
        // SAFETY: checked non-NULL; the caller passes a writable struct.
        unsafe { info.write_unaligned(out) };
        OCK_RPC_OK
    })
}

/// Removes `e` from its server's registry (unless another region took its place).
fn forget(e: &Arc<RegionEntry>, regions: &RegionRegistry) {
    if regions.find(e.base, e.len, e.key).is_some_and(|(found, _)| Arc::ptr_eq(&found, e)) {
        regions.remove(e.base);
    }
}

/// `OckRpcDestroyMemoryRegion`: the handle and key stop working at once. A handle that is not a
/// live region of `server` is logged and ignored.
#[no_mangle]
pub extern "C" fn OckRpcDestroyMemoryRegion(server: Handle, mr: Handle) {
    const F: &str = "OckRpcDestroyMemoryRegion";
    guard(F, (), || match record_of(mr) {
        None => crate::log!(crate::log::WARN, "{F}: {mr:#x} is not a live memory region; nothing to do"),
        Some((rec, _, _)) if rec.server != server => crate::log!(
            crate::log::WARN,
            "{F}: region {mr:#x} was registered through server {:#x}, not {server:#x}; nothing done",
            rec.server
        ),
        Some((_, e, obj)) => {
            if REGIONS.remove(mr).is_some() {
                forget(&e, obj.regions());
            }
        }
    })
}
