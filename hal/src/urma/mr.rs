//! Registered memory: a URMA segment (`urma_register_seg`) over memory the region owns (or the
//! caller owns, for `register_external`), with a token of its own, and the 32-byte remote key a
//! peer imports it with.
//!
//! # Remote keys
//!
//! A region whose remote rights the owner's device enforces by itself — none, READ, or
//! READ|WRITE — gets a **32-bit key: its token id** ([`crate::RemoteKey::from_rkey`]), under the
//! device's token (the value every segment and jetty of the context is registered with, which a
//! peer learns from [`crate::QueueInfo::token`] when it connects, as UMDK's sample presets one
//! token for both sides). That fits the 32-bit token of URPC's DMA descriptors, so rendezvous
//! works on URMA. The requester names the segment as a `user_tseg` (token id + the peer's token),
//! URMA's import-free form; the owner's device checks the token id, token, range and rights.
//!
//! A **write-only** region (REMOTE_WRITE without REMOTE_READ) cannot be expressed to the owner's
//! device (URMA grants no WRITE without READ), so it gets a token of its own and the **wide
//! key**, which the requester imports (`urma_import_seg`, cached per queue) with only the WRITE
//! right:
//!
//! | bytes | field |
//! |---|---|
//! | 0..4 | token value (little-endian; [`crate::RemoteKey::rkey`] reads it) |
//! | 4..8 | token id (`urma_seg_t::token_id`) |
//! | 8..16 | segment start address (`ubva.va`, never 0: a wide key is never a 32-bit one) |
//! | 16..24 | segment length |
//! | 24..28 | segment attributes (`urma_seg_attr_t`) with the access bits the owner granted |
//! | 28..32 | zero |
//!
//! Neither form carries the owner's EID and UASID: a key is used on a queue connected to the
//! owner, which learnt them from the owner's [`crate::QueueInfo`]. A 32-bit key altered in any
//! bit names another token id, and a wide key altered in its first four bytes the wrong token:
//! the owner's device refuses either (`REM_ACCESS_ABORT` → [`crate::Status::RemoteAccess`])
//! without moving a byte.

use super::device::{random_u32, register_raw, Context};
use crate::region_memory;
use crate::{Access, Error, MemoryRegion, RemoteKey, Result};
use bypass_urma_abi as abi;
use bypass_urma_abi::consts::*;
use std::alloc::Layout;
use std::sync::Arc;

/// A live local segment as a post sees it: the library's target segment and its range.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LocalSeg {
    pub(crate) tseg: *mut abi::UrmaTargetSeg,
    pub(crate) addr: u64,
    pub(crate) len: u64,
}

/// The URMA access value a segment is registered with for the hal's `access`. URMA grants no
/// write without read (`urma_check_seg_cfg`), so a REMOTE_WRITE segment is registered READ|WRITE;
/// the remote key then carries only the rights the owner asked for, and the importing side
/// imports with those (see the module docs of `urma` on write-only regions).
pub(crate) fn seg_access(access: Access) -> Result<(u32, u32)> {
    if access.contains(Access::REMOTE_WRITE) && !access.contains(Access::LOCAL_WRITE) {
        return Err(Error::InvalidArgument("REMOTE_WRITE access requires LOCAL_WRITE".into()));
    }
    let mut granted = 0;
    if access.contains(Access::REMOTE_READ) {
        granted |= URMA_ACCESS_READ;
    }
    if access.contains(Access::REMOTE_WRITE) {
        granted |= URMA_ACCESS_WRITE;
    }
    let registered = match granted {
        0 => URMA_ACCESS_LOCAL_ONLY,
        g if g & URMA_ACCESS_WRITE != 0 => URMA_ACCESS_READ | URMA_ACCESS_WRITE,
        g => g,
    };
    Ok((registered, granted))
}

/// The fields of a remote key (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct KeyFields {
    pub(crate) token: u32,
    pub(crate) token_id: u32,
    pub(crate) va: u64,
    pub(crate) len: u64,
    pub(crate) attr: u32,
}

impl KeyFields {
    pub(crate) fn encode(&self) -> RemoteKey {
        let mut b = [0u8; RemoteKey::LEN];
        b[0..4].copy_from_slice(&self.token.to_le_bytes());
        b[4..8].copy_from_slice(&self.token_id.to_le_bytes());
        b[8..16].copy_from_slice(&self.va.to_le_bytes());
        b[16..24].copy_from_slice(&self.len.to_le_bytes());
        b[24..28].copy_from_slice(&self.attr.to_le_bytes());
        RemoteKey::from_bytes(b)
    }

    pub(crate) fn decode(key: &RemoteKey) -> Self {
        let b = key.as_bytes();
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        KeyFields { token: u32_at(0), token_id: u32_at(4), va: u64_at(8), len: u64_at(16), attr: u32_at(24) }
    }

    /// The access value (READ/WRITE bits) the owner granted.
    pub(crate) fn granted(&self) -> u32 {
        (self.attr & SEG_ATTR_ACCESS_MASK) >> SEG_ATTR_ACCESS_SHIFT
    }
}

/// Registered memory on a URMA device. Dropping it unregisters the segment, then frees the
/// memory if the region allocated it.
pub struct UrmaRegion {
    ctx: Arc<Context>,
    seg: LocalSeg,
    ptr: *mut u8,
    len: usize,
    access: Access,
    lkey: u32,
    key: RemoteKey,
    /// The allocation to free after unregistering (`None`: caller-owned memory).
    owned: Option<Layout>,
}

// SAFETY: the region owns its allocation (or the caller promised the memory outlives it); CPU
// access follows the DMA contract of hal's `mr` module; liburma segments may be used and
// unregistered from any thread.
unsafe impl Send for UrmaRegion {}
// SAFETY: as above; `&self` methods only copy through raw pointers under that contract.
unsafe impl Sync for UrmaRegion {}

impl std::fmt::Debug for UrmaRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UrmaRegion")
            .field("addr", &format_args!("{:#x}", self.ptr as u64))
            .field("len", &self.len)
            .field("lkey", &self.lkey)
            .field("access", &self.access)
            .field("owned", &self.owned.is_some())
            .finish()
    }
}

impl UrmaRegion {
    pub(crate) fn allocate(ctx: &Arc<Context>, len: usize, access: Access) -> Result<Self> {
        let layout = region_memory::layout(len)?;
        seg_access(access)?;
        region_memory::allocate(len, layout, |ptr, reg_len| {
            // SAFETY: `ptr..ptr + reg_len` was just allocated and is owned by the new region.
            unsafe { Self::reg(ctx, ptr, len, reg_len, access, Some(layout)) }
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
        region_memory::check_external(ptr, len, "URMA")?;
        // SAFETY: forwarded from the caller.
        unsafe { Self::reg(ctx, ptr, len, len, access, None) }
    }

    /// # Safety
    /// `ptr..ptr + reg_len` is valid memory that lives as long as the region.
    unsafe fn reg(
        ctx: &Arc<Context>,
        ptr: *mut u8,
        len: usize,
        reg_len: usize,
        access: Access,
        owned: Option<Layout>,
    ) -> Result<Self> {
        let (registered, granted) = seg_access(access)?;
        // Rights the owner's device enforces by itself (none, READ, READ|WRITE) get a 32-bit key
        // under the device's token; a write-only grant needs the wide key (see the module docs).
        let compact = granted != URMA_ACCESS_WRITE;
        let token = if compact { ctx.jetty_token } else { random_u32() };
        let tseg = register_raw(ctx.lib, ctx.ctx, ptr, reg_len, registered, token)
            .map_err(|e| Error::OutOfResources(format!("{e} with {access:?} on {}", ctx.name)))?;
        // SAFETY: the segment was just returned by urma_register_seg; `seg` is its public part.
        let seg = unsafe { (*tseg).seg };
        let attr = (seg.attr & !SEG_ATTR_ACCESS_MASK) | (granted << SEG_ATTR_ACCESS_SHIFT);
        let key = if compact {
            RemoteKey::from_rkey(seg.token_id)
        } else {
            KeyFields { token, token_id: seg.token_id, va: { seg.ubva }.va, len: seg.len, attr }.encode()
        };
        let lkey = ctx.next_lkey();
        let local = LocalSeg { tseg, addr: ptr as u64, len: reg_len as u64 };
        ctx.regions.write().unwrap_or_else(|e| e.into_inner()).insert(lkey, local);
        Ok(UrmaRegion { ctx: ctx.clone(), seg: local, ptr, len, access, lkey, key, owned })
    }
}

impl MemoryRegion for UrmaRegion {
    fn len(&self) -> usize {
        self.len
    }
    fn addr(&self) -> u64 {
        self.ptr as u64
    }
    fn lkey(&self) -> u32 {
        self.lkey
    }
    fn remote_key(&self) -> RemoteKey {
        self.key
    }
    fn access(&self) -> Access {
        self.access
    }
    fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }
}

impl Drop for UrmaRegion {
    fn drop(&mut self) {
        // Posts look segments up under the read lock and hold it across the library call: once
        // the entry is gone (write lock) no post can hand this segment to the library any more.
        self.ctx.regions.write().unwrap_or_else(|e| e.into_inner()).remove(&self.lkey);
        // SAFETY: the segment came from urma_register_seg and is unregistered once.
        let rc = unsafe { (self.ctx.lib.unregister_seg)(self.seg.tseg) };
        // SAFETY: `owned` is the layout `allocate` used; the segment is gone (if `rc` is 0).
        unsafe { region_memory::free(self.ptr, self.owned, rc == 0) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_and_carry_the_token_first() {
        let k = KeyFields { token: 0xacfe, token_id: 9, va: 0x7f00_0000_1000, len: 4096, attr: 0xc0 | 0x1 };
        let key = k.encode();
        assert_eq!(KeyFields::decode(&key), k);
        assert_eq!(key.rkey(), 0xacfe);
        assert!(!key.is_rkey());
        assert_eq!(k.granted(), URMA_ACCESS_READ | URMA_ACCESS_WRITE);
    }

    #[test]
    fn access_follows_urma_rules() {
        assert_eq!(seg_access(Access::empty()).unwrap(), (URMA_ACCESS_LOCAL_ONLY, 0));
        assert_eq!(seg_access(Access::LOCAL_WRITE).unwrap(), (URMA_ACCESS_LOCAL_ONLY, 0));
        assert_eq!(seg_access(Access::REMOTE_READ).unwrap(), (URMA_ACCESS_READ, URMA_ACCESS_READ));
        let w = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
        assert_eq!(seg_access(w).unwrap(), (URMA_ACCESS_READ | URMA_ACCESS_WRITE, URMA_ACCESS_WRITE));
        assert!(seg_access(Access::REMOTE_WRITE).is_err());
    }
}
