//! Work requests and completion records (urma-abi.md §3.5).

use crate::device::{UrmaJettyId, UrmaToken};
use crate::jetty::UrmaTargetJetty;
use crate::seg::UrmaTargetSeg;

/// `urma_user_tseg_t` (12 bytes): a remote segment named without `urma_import_seg`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct UrmaUserTseg {
    /// `urma_seg_attr_t`.
    pub attr: u32,
    /// Token id.
    pub token_id: u32,
    /// Token value.
    pub token_value: UrmaToken,
}

/// `urma_sge_t` (32 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct UrmaSge {
    /// Address (local VA, or remote VA for the remote side of READ/WRITE).
    pub addr: u64,
    /// Length.
    pub len: u32,
    /// Local registered or remote imported segment.
    pub tseg: *mut UrmaTargetSeg,
    /// Remote segment without import (ignored when `tseg` is set).
    pub user_tseg: *mut UrmaUserTseg,
}

/// `urma_sg_t` (16 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct UrmaSg {
    /// SGE array.
    pub sge: *mut UrmaSge,
    /// Entries in `sge`.
    pub num_sge: u32,
}

/// `urma_rw_wr_t` (48 bytes): WRITE / READ.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct UrmaRwWr {
    /// Local for WRITE, remote for READ.
    pub src: UrmaSg,
    /// Remote for WRITE, local for READ.
    pub dst: UrmaSg,
    /// Jetty-group target hint.
    pub target_hint: u8,
    /// Notify / immediate data.
    pub notify_data: u64,
}

/// `urma_send_wr_t` (40 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct UrmaSendWr {
    /// Local data.
    pub src: UrmaSg,
    /// Jetty-group target hint.
    pub target_hint: u8,
    /// Immediate data.
    pub imm_data: u64,
    /// Segment to invalidate (SEND_INVALIDATE only).
    pub tseg: *mut UrmaTargetSeg,
}

/// `urma_cas_wr_t` (32 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct UrmaCasWr {
    /// Remote target.
    pub dst: *mut UrmaSge,
    /// Local buffer for the old value.
    pub src: *mut UrmaSge,
    /// Compare value (or its address when longer than 8 bytes).
    pub cmp_data: u64,
    /// Swap value (or its address).
    pub swap_data: u64,
}

/// `urma_faa_wr_t` (24 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct UrmaFaaWr {
    /// Remote target.
    pub dst: *mut UrmaSge,
    /// Local buffer for the old value.
    pub src: *mut UrmaSge,
    /// Operand (or its address).
    pub operand: u64,
}

/// The 48-byte operation union of `urma_jfs_wr_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union UrmaJfsWrBody {
    /// WRITE*, READ.
    pub rw: UrmaRwWr,
    /// SEND*.
    pub send: UrmaSendWr,
    /// CAS.
    pub cas: UrmaCasWr,
    /// FADD and the other fetch atomics.
    pub faa: UrmaFaaWr,
}

impl core::fmt::Debug for UrmaJfsWrBody {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("UrmaJfsWrBody{..}")
    }
}

/// `urma_jfs_wr_t` (80 bytes): one send-side work request of a linked batch.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct UrmaJfsWr {
    /// `urma_opcode_t` (`consts::URMA_OPC_*`).
    pub opcode: u32,
    /// `urma_jfs_wr_flag_t` (`consts::WR_FLAG_*`).
    pub flag: u32,
    /// Target jetty (the bound one for RC).
    pub tjetty: *mut UrmaTargetJetty,
    /// Returned in the completion record.
    pub user_ctx: u64,
    /// The operation.
    pub body: UrmaJfsWrBody,
    /// Next WR of the batch, or NULL.
    pub next: *mut UrmaJfsWr,
}

/// `urma_jfr_wr_t` (32 bytes): one receive work request.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct UrmaJfrWr {
    /// Buffers.
    pub src: UrmaSg,
    /// Returned in the completion record.
    pub user_ctx: u64,
    /// Next WR, or NULL.
    pub next: *mut UrmaJfrWr,
}

/// The `invalid_token` arm of the completion-record union.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct UrmaInvalidToken {
    /// Token id invalidated.
    pub token_id: u32,
    /// Token value.
    pub token_value: UrmaToken,
}

/// The 8-byte union at offset 56 of `urma_cr_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union UrmaCrData {
    /// Immediate data (SEND_WITH_IMM, WRITE_WITH_IMM).
    pub imm_data: u64,
    /// Invalidated token (SEND_WITH_INV).
    pub invalid_token: UrmaInvalidToken,
}

impl Default for UrmaCrData {
    fn default() -> Self {
        UrmaCrData { imm_data: 0 }
    }
}

impl core::fmt::Debug for UrmaCrData {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        // SAFETY: both arms are 8 bytes of plain integers; any bit pattern is a valid u64.
        let v = unsafe { self.imm_data };
        write!(f, "UrmaCrData({v:#x})")
    }
}

/// `urma_cr_t` (80 bytes): a completion record, filled by `urma_poll_jfc`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct UrmaCr {
    /// `urma_cr_status_t` (`consts::URMA_CR_*`).
    pub status: u32,
    /// The WR's `user_ctx`.
    pub user_ctx: u64,
    /// `urma_cr_opcode_t` (receive side only).
    pub opcode: u32,
    /// `urma_cr_flag_t` (`consts::CR_FLAG_*`; s_r = 1 for a receive).
    pub flag: u8,
    /// Bytes received / transferred.
    pub completion_len: u32,
    /// Local JFS / JFR / jetty id.
    pub local_id: u32,
    /// Remote jetty (the sender for a receive).
    pub remote_id: UrmaJettyId,
    /// Immediate data or invalidated token.
    pub data: UrmaCrData,
    /// Transport path number.
    pub tpn: u32,
    /// User data.
    pub user_data: usize,
}
