//! Registered memory: an `ibv_mr` over memory the region owns (or the caller owns, for
//! `register_external`).

use super::device::Context;
use super::tables::{errno, verb_error};
use crate::region_memory;
use crate::{Access, Error, MemoryRegion, RemoteKey, Result};
use rdma_sys::*;
use std::alloc::Layout;
use std::sync::Arc;

fn ibv_access(access: Access) -> Result<u32> {
    if access.contains(Access::REMOTE_WRITE) && !access.contains(Access::LOCAL_WRITE) {
        return Err(Error::InvalidArgument("REMOTE_WRITE access requires LOCAL_WRITE".into()));
    }
    if access.contains(Access::REMOTE_ATOMIC) && !access.contains(Access::LOCAL_WRITE) {
        return Err(Error::InvalidArgument("REMOTE_ATOMIC access requires LOCAL_WRITE".into()));
    }
    let mut a = 0;
    if access.contains(Access::LOCAL_WRITE) {
        a |= ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
    }
    if access.contains(Access::REMOTE_READ) {
        a |= ibv_access_flags::IBV_ACCESS_REMOTE_READ.0;
    }
    if access.contains(Access::REMOTE_WRITE) {
        a |= ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
    }
    if access.contains(Access::REMOTE_ATOMIC) {
        a |= ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC.0;
    }
    Ok(a)
}

/// Registered memory on a verbs device. Dropping it deregisters the `ibv_mr`, then frees the
/// memory if the region allocated it.
pub struct VerbsRegion {
    ctx: Arc<Context>,
    mr: *mut ibv_mr,
    ptr: *mut u8,
    len: usize,
    access: Access,
    /// The allocation to free after deregistering (`None`: caller-owned memory).
    owned: Option<Layout>,
}

// SAFETY: the region owns its allocation (or the caller promised the memory outlives it); CPU
// access to the bytes follows the DMA contract of hal's `mr` module, and ibv_mr handles may be
// used and destroyed from any thread.
unsafe impl Send for VerbsRegion {}
// SAFETY: as above; `&self` methods only copy through raw pointers under that contract.
unsafe impl Sync for VerbsRegion {}

impl std::fmt::Debug for VerbsRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsRegion")
            .field("addr", &format_args!("{:#x}", self.ptr as u64))
            .field("len", &self.len)
            .field("lkey", &self.lkey())
            .field("rkey", &format_args!("{:#x}", self.remote_key().rkey()))
            .field("access", &self.access)
            .field("owned", &self.owned.is_some())
            .finish()
    }
}

impl VerbsRegion {
    pub(crate) fn allocate(ctx: &Arc<Context>, len: usize, access: Access) -> Result<Self> {
        check_len(ctx, len)?;
        let flags = ibv_access(access)?;
        let layout = region_memory::layout(len)?;
        region_memory::allocate(len, layout, |ptr, reg_len| {
            // SAFETY: `ptr..ptr + reg_len` was just allocated and is owned by the new region.
            unsafe { Self::reg(ctx, ptr, len, reg_len, flags, access, Some(layout)) }
        })
    }

    /// # Safety
    /// `Device::register_external`'s contract.
    pub(crate) unsafe fn external(
        ctx: &Arc<Context>,
        ptr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<Self> {
        check_len(ctx, len)?;
        region_memory::check_external(ptr, len, "verbs")?;
        let flags = ibv_access(access)?;
        // SAFETY: forwarded from the caller.
        unsafe { Self::reg(ctx, ptr, len, len, flags, access, None) }
    }

    /// # Safety
    /// `ptr..ptr + reg_len` is valid memory that lives as long as the region.
    unsafe fn reg(
        ctx: &Arc<Context>,
        ptr: *mut u8,
        len: usize,
        reg_len: usize,
        flags: u32,
        access: Access,
        owned: Option<Layout>,
    ) -> Result<Self> {
        // SAFETY: the PD is live (we hold its context); the range is valid per the caller.
        let mr = unsafe { ibv_reg_mr(ctx.pd, ptr.cast(), reg_len, flags as i32) };
        if mr.is_null() {
            return Err(verb_error(
                "ibv_reg_mr",
                errno(),
                &format!("register {len} bytes with {access:?} on {}", ctx.name),
            ));
        }
        // SAFETY: `mr` was just returned by ibv_reg_mr.
        let lkey = unsafe { (*mr).lkey };
        ctx.regions.write().unwrap_or_else(|e| e.into_inner()).insert(lkey, (ptr as u64, reg_len as u64));
        Ok(VerbsRegion { ctx: ctx.clone(), mr, ptr, len, access, owned })
    }
}

fn check_len(ctx: &Context, len: usize) -> Result<()> {
    if len as u64 > ctx.caps.max_region_size {
        return Err(Error::InvalidArgument(format!(
            "region of {len} bytes exceeds {}'s limit of {}",
            ctx.name, ctx.caps.max_region_size
        )));
    }
    Ok(())
}

impl MemoryRegion for VerbsRegion {
    fn len(&self) -> usize {
        self.len
    }
    fn addr(&self) -> u64 {
        // SAFETY: `mr` is live while the region is.
        unsafe { (*self.mr).addr as u64 }
    }
    fn lkey(&self) -> u32 {
        // SAFETY: as above.
        unsafe { (*self.mr).lkey }
    }
    fn remote_key(&self) -> RemoteKey {
        // SAFETY: as above.
        RemoteKey::from_rkey(unsafe { (*self.mr).rkey })
    }
    fn access(&self) -> Access {
        self.access
    }
    fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }
}

impl Drop for VerbsRegion {
    fn drop(&mut self) {
        // INLINE posts copy from registered memory while holding the read lock: once the entry is
        // gone (write lock) none can reach this memory any more.
        self.ctx.regions.write().unwrap_or_else(|e| e.into_inner()).remove(&self.lkey());
        // SAFETY: `mr` came from ibv_reg_mr and is deregistered once. After it returns the device
        // can no longer reach the memory (the kernel unpins it), so freeing it is safe.
        let rc = unsafe { ibv_dereg_mr(self.mr) };
        // SAFETY: `owned` is the layout `allocate` used; no key refers to the memory any more.
        unsafe { region_memory::free(self.ptr, self.owned, rc == 0) };
    }
}
