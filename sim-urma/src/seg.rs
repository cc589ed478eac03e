//! Segments: registered memory (`urma_register_seg`, a sim registration plus its token) and
//! imported remote segments (`urma_import_seg`). See `ident` for how the token is checked.

use crate::context::{ctx_of, Ctx};
use crate::ffi::{self, inval, Res};
use crate::handle_cache;
use crate::ident;
use crate::registry::{self, Kind};
use crate::runtime::{alloc_list, free_list};
use bypass_hal::{Access, Device as _, MemoryRegion};
use bypass_sim::SimRegion;
use bypass_urma_abi as abi;
use bypass_urma_abi::consts::*;
use bypass_urma_abi::status::*;
use std::cell::UnsafeCell;
use std::sync::Arc;

/// A registered segment (`urma_target_seg_t` first).
#[repr(C)]
pub(crate) struct LocalSeg {
    pub c: UnsafeCell<abi::UrmaTargetSeg>,
    pub _ctx: Arc<Ctx>,
    pub region: SimRegion,
}

/// An imported segment (`urma_target_seg_t` first).
#[repr(C)]
pub(crate) struct ImportedSeg {
    pub c: UnsafeCell<abi::UrmaTargetSeg>,
    pub _ctx: Arc<Ctx>,
    /// The key this importer presents: `seg.token_id ^ mix(token)`.
    pub key: u32,
    /// The `URMA_ACCESS_*` rights it was imported with (0: not restricted).
    pub access: u32,
}

// SAFETY: the C structs are written before publication and read-only after; SimRegion is
// Send + Sync.
unsafe impl Send for LocalSeg {}
// SAFETY: as above.
unsafe impl Sync for LocalSeg {}
// SAFETY: as above.
unsafe impl Send for ImportedSeg {}
// SAFETY: as above.
unsafe impl Sync for ImportedSeg {}

/// The access rights of a `URMA_ACCESS_*` value, checked as `urma_check_seg_cfg` does.
fn access_of(acc: u32) -> Res<Access> {
    let (local, read, write, atomic) = (
        acc & URMA_ACCESS_LOCAL_ONLY != 0,
        acc & URMA_ACCESS_READ != 0,
        acc & URMA_ACCESS_WRITE != 0,
        acc & URMA_ACCESS_ATOMIC != 0,
    );
    if acc & !0xf != 0 {
        return Err(inval(format!(
            "access {acc:#x} has unknown bits (LOCAL_ONLY 1, READ 2, WRITE 4, ATOMIC 8)"
        )));
    }
    if local && (read || write || atomic) {
        return Err(inval("access LOCAL_ONLY cannot be combined with READ, WRITE or ATOMIC"));
    }
    if write && !read {
        return Err(inval("access WRITE requires READ"));
    }
    if atomic && !(read && write) {
        return Err(inval("access ATOMIC requires READ and WRITE"));
    }
    let mut a = Access::LOCAL_WRITE;
    if read {
        a |= Access::REMOTE_READ;
    }
    if write {
        a |= Access::REMOTE_WRITE;
    }
    Ok(a)
}

/// `urma_register_seg`: registers the caller's `va..va+len`.
#[no_mangle]
pub unsafe extern "C" fn urma_register_seg(
    ctx: *mut abi::UrmaContext,
    seg_cfg: *mut abi::UrmaSegCfg,
) -> *mut abi::UrmaTargetSeg {
    ffi::pointer("urma_register_seg", || {
        let c = ctx_of(ctx)?;
        // SAFETY: a non-NULL cfg points to a seg_cfg (the API's contract).
        let cfg = unsafe { ffi::read_in(seg_cfg, "seg_cfg")? };
        if cfg.va == 0 || cfg.len == 0 {
            return Err(inval(format!("segment va {:#x} len {}: both must be non-zero", cfg.va, cfg.len)));
        }
        let access = access_of((cfg.flag & REG_SEG_ACCESS_MASK) >> REG_SEG_ACCESS_SHIFT)?;
        if cfg.flag & REG_SEG_TOKEN_ID_VALID != 0
            && registry::get::<crate::context::TokenId, _>(Kind::TokenId, cfg.token_id).is_none()
        {
            return Err(inval("token_id_valid is set but token_id is not a live token id of this library"));
        }
        let len = usize::try_from(cfg.len).map_err(|_| inval("segment length does not fit in memory"))?;
        // SAFETY: the URMA API makes the caller keep va..va+len mapped and in place until
        // urma_unregister_seg; the sim reaches it only through the key table, which forgets it
        // when the region (owned by this segment) is dropped there.
        let region = unsafe { c.nic().register_external(cfg.va as *mut u8, len, access)? };
        // SAFETY: plain C data.
        let mut t: abi::UrmaTargetSeg = unsafe { ffi::zeroed() };
        t.seg.ubva = abi::UrmaUbva { eid: c.eid, uasid: c.uasid, va: cfg.va };
        t.seg.len = cfg.len;
        t.seg.attr = cfg.flag & !REG_SEG_TOKEN_ID_VALID;
        t.seg.token_id = region.lkey() ^ ident::mix(cfg.token_value.token);
        t.user_ctx = cfg.user_ctx;
        t.urma_ctx = c.ptr();
        t.token_id = cfg.token_id;
        t.handle = u64::from(region.lkey());
        let obj = Arc::new(LocalSeg { c: UnsafeCell::new(t), _ctx: c, region });
        Ok(registry::insert(Kind::LocalSeg, obj).cast())
    })
}

/// `urma_unregister_seg`: its keys stop working at once.
#[no_mangle]
pub unsafe extern "C" fn urma_unregister_seg(target_seg: *mut abi::UrmaTargetSeg) -> UrmaStatus {
    ffi::status("urma_unregister_seg", || {
        registry::remove::<LocalSeg, _>(Kind::LocalSeg, target_seg).map(drop).ok_or_else(|| {
            inval(format!(
                "{target_seg:p} is not a live registered segment (imported ones take urma_unimport_seg)"
            ))
        })
    })
}

/// `urma_import_seg`: a peer's segment, to name in WRITE and READ work requests.
#[no_mangle]
pub unsafe extern "C" fn urma_import_seg(
    ctx: *mut abi::UrmaContext,
    seg: *mut abi::UrmaSeg,
    token_value: *mut abi::UrmaToken,
    addr: u64,
    flag: u32,
) -> *mut abi::UrmaTargetSeg {
    ffi::pointer("urma_import_seg", || {
        let c = ctx_of(ctx)?;
        // SAFETY: non-NULL inputs point to a seg and a token (the API's contract).
        let (s, token) = unsafe { (ffi::read_in(seg, "seg")?, ffi::read_in(token_value, "token_value")?) };
        if flag & IMPORT_SEG_MAPPING != 0 {
            return Err(inval("mapping = URMA_SEG_MAPPED is not simulated (remote memory cannot be mapped): import with URMA_SEG_NOMAP"));
        }
        // SAFETY: plain C data.
        let mut t: abi::UrmaTargetSeg = unsafe { ffi::zeroed() };
        t.seg = s;
        t.mva = addr;
        t.urma_ctx = c.ptr();
        let key = s.token_id ^ ident::mix(token.token);
        t.handle = u64::from(key);
        let access = (flag & IMPORT_SEG_ACCESS_MASK) >> IMPORT_SEG_ACCESS_SHIFT;
        let obj = Arc::new(ImportedSeg { c: UnsafeCell::new(t), _ctx: c, key, access });
        Ok(registry::insert(Kind::ImportedSeg, obj).cast())
    })
}

/// `urma_unimport_seg`.
#[no_mangle]
pub unsafe extern "C" fn urma_unimport_seg(tseg: *mut abi::UrmaTargetSeg) -> UrmaStatus {
    ffi::status("urma_unimport_seg", || {
        registry::remove::<ImportedSeg, _>(Kind::ImportedSeg, tseg)
            .map(drop)
            .ok_or_else(|| inval(format!("{tseg:p} is not a live imported segment")))
    })
}

/// `urma_get_seg_ctx`: a copy of the segment's public part (`urma_seg_t`) to send to a peer.
#[no_mangle]
pub unsafe extern "C" fn urma_get_seg_ctx(
    tseg: *mut abi::UrmaTargetSeg,
    seg: *mut *mut abi::UrmaSeg,
    size: *mut u32,
) -> UrmaStatus {
    ffi::status("urma_get_seg_ctx", || {
        let local = registry::get::<LocalSeg, _>(Kind::LocalSeg, tseg)
            .ok_or_else(|| inval(format!("{tseg:p} is not a live registered segment")))?;
        if seg.is_null() || size.is_null() {
            return Err(inval("seg or size is NULL"));
        }
        let out = alloc_list::<abi::UrmaSeg>(1)?;
        // SAFETY: `out` has room for one seg; `seg` and `size` are non-NULL and writable; the
        // C struct is read-only after publication.
        unsafe {
            out.write((*local.c.get()).seg);
            *seg = out;
            *size = std::mem::size_of::<abi::UrmaSeg>() as u32;
        }
        Ok(())
    })
}

/// `urma_put_seg_ctx`.
#[no_mangle]
pub unsafe extern "C" fn urma_put_seg_ctx(seg: *mut abi::UrmaSeg) {
    ffi::unit("urma_put_seg_ctx", || free_list(seg, "segment context"))
}

thread_local! {
    static LKEYS: handle_cache::ValCache<u32> = const { std::cell::RefCell::new(handle_cache::Cache::new()) };
    static RKEYS: handle_cache::ValCache<(u32, u32)> = const { std::cell::RefCell::new(handle_cache::Cache::new()) };
}

/// The local key of SGE segment `p` (a registered segment).
pub(crate) fn lkey_in(p: *const abi::UrmaTargetSeg) -> Res<u32> {
    handle_cache::value::<LocalSeg, _, _>(&LKEYS, Kind::LocalSeg, p, |s| s.region.lkey()).ok_or_else(|| {
        inval(format!("SGE segment {p:p} is not a live segment registered with urma_register_seg"))
    })
}

/// A key no registration has (index 2^24 - 1, generation 255): what a WR through an import
/// lacking the right presents, so the owner's device refuses it like a wrong token.
const NO_KEY: u32 = u32::MAX;

/// The remote key of a remote SGE: its imported segment's key (or
/// [`NO_KEY`] if the import lacks the `need`ed `URMA_ACCESS_*` right), or, with no segment, the
/// key its `user_tseg` (token id and token value) names.
///
/// # Safety
/// A non-NULL `user` points to a readable `urma_user_tseg_t` (the API's contract).
pub(crate) unsafe fn rkey_in(
    p: *const abi::UrmaTargetSeg,
    user: *const abi::UrmaUserTseg,
    need: u32,
) -> Res<u32> {
    if p.is_null() && !user.is_null() {
        // SAFETY: non-NULL, readable per the caller.
        let u = unsafe { user.read_unaligned() };
        return Ok(u.token_id ^ ident::mix(u.token_value.token));
    }
    let found = handle_cache::value::<ImportedSeg, _, _>(&RKEYS, Kind::ImportedSeg, p, |s| (s.key, s.access));
    let (key, access) = found.ok_or_else(|| {
        inval(format!("remote SGE segment {p:p} is not a live segment imported with urma_import_seg (nor is user_tseg set)"))
    })?;
    Ok(if access != 0 && access & need == 0 { NO_KEY } else { key })
}
