//! Segments and token ids (urma-abi.md §3.4).

use crate::device::{UrmaContext, UrmaEid, UrmaToken};

/// `urma_token_id_t` (40 bytes), owned by the library.
#[repr(C)]
#[derive(Debug)]
pub struct UrmaTokenId {
    /// Owning context.
    pub urma_ctx: *mut UrmaContext,
    /// Token id.
    pub token_id: u32,
    /// Kernel handle.
    pub handle: u64,
    /// Reference count.
    pub ref_: u64,
    /// `urma_token_id_flag_t` (multi_seg 0x1).
    pub flag: u32,
}

/// `urma_seg_cfg_t` (48 bytes), the argument of `urma_register_seg`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct UrmaSegCfg {
    /// Start address.
    pub va: u64,
    /// Length in bytes.
    pub len: u64,
    /// Token id, or NULL to let the library allocate one (with `token_id_valid = 0`).
    pub token_id: *mut UrmaTokenId,
    /// Token a peer must present.
    pub token_value: UrmaToken,
    /// `urma_reg_seg_flag_t` (`consts::REG_SEG_*`).
    pub flag: u32,
    /// Caller data.
    pub user_ctx: u64,
    /// User IOVA (with `user_iova`).
    pub iova: u64,
}

/// `urma_ubva_t` (28 bytes, packed, align 1): EID + UASID + VA. The EID is raw bytes here because
/// a packed Rust struct cannot hold the 8-aligned [`UrmaEid`]; see [`UrmaUbva::eid`].
#[repr(C, packed)]
#[derive(Clone, Copy, Debug, Default)]
pub struct UrmaUbva {
    /// EID bytes.
    pub eid: [u8; 16],
    /// UASID.
    pub uasid: u32,
    /// Virtual address (unaligned: copy it out, never borrow it).
    pub va: u64,
}

impl UrmaUbva {
    /// The EID as an aligned value.
    pub fn eid(&self) -> UrmaEid {
        UrmaEid { raw: self.eid }
    }
}

/// `urma_seg_t` (48 bytes): the public description of a segment, sent to a peer out of band.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct UrmaSeg {
    /// Address.
    pub ubva: UrmaUbva,
    /// Length.
    pub len: u64,
    /// `urma_seg_attr_t` (`consts::SEG_ATTR_*`).
    pub attr: u32,
    /// Token id.
    pub token_id: u32,
}

/// `urma_target_seg_t` (88 bytes), from `urma_register_seg` or `urma_import_seg`.
#[repr(C)]
#[derive(Debug)]
pub struct UrmaTargetSeg {
    /// The segment.
    pub seg: UrmaSeg,
    /// Caller data.
    pub user_ctx: u64,
    /// Mapping address when imported with `mapping`.
    pub mva: u64,
    /// Owning context.
    pub urma_ctx: *mut UrmaContext,
    /// Token id when registered, NULL when imported.
    pub token_id: *mut UrmaTokenId,
    /// Kernel handle.
    pub handle: u64,
}
