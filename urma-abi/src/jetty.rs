//! Queues: JFCE, JFC, JFS, JFR, jetty, their configurations and attributes, and the remote /
//! target jetty (urma-abi.md §3.2, §3.3).

use crate::device::{OpaqueCond, OpaqueMutex, UrmaContext, UrmaJettyId, UrmaToken};
use core::ffi::{c_int, c_void};

/// `urma_jfce_t` (24 bytes): a completion event channel; `fd` is pollable.
#[repr(C)]
#[derive(Debug)]
pub struct UrmaJfce {
    /// Owning context.
    pub urma_ctx: *mut UrmaContext,
    /// Event fd: readable when a rearmed JFC on this channel has a completion.
    pub fd: c_int,
    /// Reference count.
    pub ref_: u64,
}

/// `urma_jfc_cfg_t` (32 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct UrmaJfcCfg {
    /// Depth, 1..=`max_jfc_depth`.
    pub depth: u32,
    /// `urma_jfc_flag_t` (`consts::JFC_FLAG_*`).
    pub flag: u32,
    /// Completion event queue number.
    pub ceqn: u32,
    /// Event channel, or NULL for poll-only.
    pub jfce: *mut UrmaJfce,
    /// Caller data.
    pub user_ctx: u64,
}

/// `urma_jfc_t` (248 bytes), owned by the library.
#[repr(C)]
#[derive(Debug)]
pub struct UrmaJfc {
    /// Owning context.
    pub urma_ctx: *mut UrmaContext,
    /// JFC id.
    pub jfc_id: UrmaJettyId,
    /// Configuration as created.
    pub jfc_cfg: UrmaJfcCfg,
    /// Kernel handle.
    pub handle: u64,
    /// Library mutex.
    pub event_mutex: OpaqueMutex,
    /// Library condition variable.
    pub event_cond: OpaqueCond,
    /// Completion events acknowledged.
    pub comp_events_acked: u32,
    /// Async events acknowledged.
    pub async_events_acked: u32,
    /// Driver-private tail (`urma_jfc_opt`, absent before 26.x).
    pub urma_jfc_opt: [u64; 10],
}

/// `urma_jfs_cfg_t` (40 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct UrmaJfsCfg {
    /// Depth, 1..=`max_jfs_depth`.
    pub depth: u32,
    /// `urma_jfs_flag_t` (`consts::JFS_FLAG_*`); `create_jetty` rewrites its order_type.
    pub flag: u32,
    /// `urma_transport_mode_t`.
    pub trans_mode: u32,
    /// Priority, 0..=15.
    pub priority: u8,
    /// Max SGEs per WR.
    pub max_sge: u8,
    /// Max remote SGEs per WR.
    pub max_rsge: u8,
    /// Max inline bytes.
    pub max_inline_data: u32,
    /// RNR retry count, 0..=7.
    pub rnr_retry: u8,
    /// Error timeout, 0..=31.
    pub err_timeout: u8,
    /// Send completion queue.
    pub jfc: *mut UrmaJfc,
    /// Caller data.
    pub user_ctx: u64,
}

/// `urma_jfs_t` (256 bytes), owned by the library. Only the documented head is declared.
#[repr(C)]
#[derive(Debug)]
pub struct UrmaJfs {
    /// Owning context.
    pub urma_ctx: *mut UrmaContext,
    /// JFS id.
    pub jfs_id: UrmaJettyId,
    /// Configuration as created.
    pub jfs_cfg: UrmaJfsCfg,
    /// Kernel handle.
    pub handle: u64,
    /// Library-private rest (mutex, cond, counters, `urma_jfs_opt`).
    pub private: [u64; 22],
}

/// `urma_jfr_cfg_t` (48 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct UrmaJfrCfg {
    /// Requested id, 0 lets the library choose.
    pub id: u32,
    /// Depth, 1..=`max_jfr_depth`.
    pub depth: u32,
    /// `urma_jfr_flag_t` (`consts::JFR_FLAG_*`).
    pub flag: u32,
    /// `urma_transport_mode_t`.
    pub trans_mode: u32,
    /// Max SGEs per receive WR.
    pub max_sge: u8,
    /// Minimum RNR NACK timer, 0..=31.
    pub min_rnr_timer: u8,
    /// Receive completion queue.
    pub jfc: *mut UrmaJfc,
    /// Token guarding the JFR.
    pub token_value: UrmaToken,
    /// Caller data.
    pub user_ctx: u64,
}

/// `urma_jfr_t` (264 bytes), owned by the library.
#[repr(C)]
#[derive(Debug)]
pub struct UrmaJfr {
    /// Owning context.
    pub urma_ctx: *mut UrmaContext,
    /// JFR id.
    pub jfr_id: UrmaJettyId,
    /// Configuration as created.
    pub jfr_cfg: UrmaJfrCfg,
    /// Kernel handle.
    pub handle: u64,
    /// Library mutex.
    pub event_mutex: OpaqueMutex,
    /// Library condition variable.
    pub event_cond: OpaqueCond,
    /// Async events acknowledged.
    pub async_events_acked: u32,
    /// Driver-private tail (`urma_jfr_opt`, absent before 26.x).
    pub urma_jfr_opt: [u64; 10],
}

/// The `shared` arm of the receive union of `urma_jetty_cfg_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct UrmaJettyShared {
    /// The shared JFR (UB devices require one).
    pub jfr: *mut UrmaJfr,
    /// Replacement receive JFC, or NULL to use the JFR's.
    pub jfc: *mut UrmaJfc,
}

/// The receive union of `urma_jetty_cfg_t` (16 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub union UrmaJettyRecv {
    /// Shared-JFR form (`flag.share_jfr = 1`).
    pub shared: UrmaJettyShared,
    /// Deprecated private-JFR form.
    pub jfr_cfg: *mut UrmaJfrCfg,
}

impl core::fmt::Debug for UrmaJettyRecv {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        // SAFETY: both arms are plain pointers; `shared` covers all 16 bytes, and the union is
        // always fully initialised by its constructor.
        let s = unsafe { self.shared };
        write!(f, "UrmaJettyRecv({s:?})")
    }
}

/// `urma_jetty_cfg_t` (80 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct UrmaJettyCfg {
    /// Requested id, 0 lets the library choose.
    pub id: u32,
    /// `urma_jetty_flag_t` (`consts::JETTY_FLAG_*`).
    pub flag: u32,
    /// Send side.
    pub jfs_cfg: UrmaJfsCfg,
    /// Receive side.
    pub recv: UrmaJettyRecv,
    /// Jetty group, or NULL.
    pub jetty_grp: *mut c_void,
    /// Caller data.
    pub user_ctx: u64,
}

/// `urma_jetty_t` (344 bytes), owned by the library.
#[repr(C)]
#[derive(Debug)]
pub struct UrmaJetty {
    /// Owning context.
    pub urma_ctx: *mut UrmaContext,
    /// Jetty id (offset 8 in every version).
    pub jetty_id: UrmaJettyId,
    /// Bound target jetty (RC), NULL before bind.
    pub remote_jetty: *mut UrmaTargetJetty,
    /// Configuration as created (order_type rewritten).
    pub jetty_cfg: UrmaJettyCfg,
    /// Kernel handle.
    pub handle: u64,
    /// Library mutex.
    pub event_mutex: OpaqueMutex,
    /// Library condition variable.
    pub event_cond: OpaqueCond,
    /// Async events acknowledged.
    pub async_events_acked: u32,
    /// Driver-private tail (`urma_jetty_opt`, absent before 26.x).
    pub urma_jetty_opt: [u64; 15],
}

/// `urma_jetty_attr_t` (12 bytes), the argument of `urma_modify_jetty`. `urma_jfr_attr_t` has the
/// same layout.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct UrmaJettyAttr {
    /// `consts::JETTY_ATTR_*` bits saying which fields apply.
    pub mask: u32,
    /// Receive threshold.
    pub rx_threshold: u32,
    /// `urma_jetty_state_t`.
    pub state: u32,
}

/// `urma_jfr_attr_t` (same layout as [`UrmaJettyAttr`]; state is `urma_jfr_state_t`).
pub type UrmaJfrAttr = UrmaJettyAttr;

/// `urma_jfc_attr_t` (8 bytes), the argument of `urma_modify_jfc`: completion moderation.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct UrmaJfcAttr {
    /// `consts::JFC_MODERATE_*` bits saying which fields apply.
    pub mask: u32,
    /// Records coalesced into one event.
    pub moderate_count: u16,
    /// Longest wait before an event, in microseconds.
    pub moderate_period: u16,
}

/// `urma_jfs_attr_t` (8 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct UrmaJfsAttr {
    /// Field mask.
    pub mask: u32,
    /// `urma_jetty_state_t`.
    pub state: u32,
}

/// `urma_rjetty_t` (48 bytes): what `urma_import_jetty` is told about the remote jetty.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct UrmaRjetty {
    /// Remote jetty id (EID, UASID, id).
    pub jetty_id: UrmaJettyId,
    /// `urma_transport_mode_t`.
    pub trans_mode: u32,
    /// Jetty-group policy.
    pub policy: u32,
    /// `urma_target_type_t`.
    pub type_: u32,
    /// `urma_import_jetty_flag_t` (`consts::IMPORT_JETTY_*`); `import_jetty` rewrites its
    /// order_type.
    pub flag: u32,
    /// `urma_tp_type_t`.
    pub tp_type: u32,
}

/// `urma_target_jetty_t` (64 bytes), owned by the library.
#[repr(C)]
#[derive(Debug)]
pub struct UrmaTargetJetty {
    /// Owning context.
    pub urma_ctx: *mut UrmaContext,
    /// Remote jetty id.
    pub id: UrmaJettyId,
    /// Kernel handle.
    pub handle: u64,
    /// `urma_transport_mode_t`.
    pub trans_mode: u32,
    /// `tp.tpn`.
    pub tpn: u32,
    /// `urma_target_type_t`.
    pub type_: u32,
    /// Import flag after rewriting.
    pub flag: u32,
    /// Jetty-group policy.
    pub policy: u32,
    /// `urma_tp_type_t`.
    pub tp_type: u32,
}

/// `urma_rjfr_t` (40 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct UrmaRjfr {
    /// Remote JFR id.
    pub jfr_id: UrmaJettyId,
    /// `urma_transport_mode_t`.
    pub trans_mode: u32,
    /// Import flag.
    pub flag: u32,
    /// `urma_tp_type_t`.
    pub tp_type: u32,
}
