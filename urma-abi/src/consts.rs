//! Enum values, flag bits and typical values (urma-abi.md §3.1–§3.6).
//!
//! Every C enum is a 4-byte integer. Bitfield unions are `u32`s: a one-bit field is a mask
//! (`*_FLAG_*`), a wider field has a `*_SHIFT` and a `*_MASK` (the mask is already shifted).

/// `urma_transport_mode_t`.
pub type UrmaTransportMode = u32;
/// Reliable message.
pub const URMA_TM_RM: UrmaTransportMode = 0x1;
/// Reliable connection (the mode bypass uses).
pub const URMA_TM_RC: UrmaTransportMode = 0x2;
/// Unreliable message.
pub const URMA_TM_UM: UrmaTransportMode = 0x4;

/// `urma_transport_type_t`.
pub type UrmaTransportType = i32;
/// Invalid.
pub const URMA_TRANSPORT_INVALID: UrmaTransportType = -1;
/// UB.
pub const URMA_TRANSPORT_UB: UrmaTransportType = 0;
/// IB.
pub const URMA_TRANSPORT_IB: UrmaTransportType = 1;
/// IP.
pub const URMA_TRANSPORT_IP: UrmaTransportType = 2;
/// Software UB (enum value only upstream).
pub const URMA_TRANSPORT_SOFTUB: UrmaTransportType = 3;
/// HNS UB.
pub const URMA_TRANSPORT_HNS_UB: UrmaTransportType = 5;

/// `urma_tp_type_t`.
pub type UrmaTpType = u32;
/// Reliable TP.
pub const URMA_RTP: UrmaTpType = 0;
/// Compact TP.
pub const URMA_CTP: UrmaTpType = 1;
/// Unreliable TP.
pub const URMA_UTP: UrmaTpType = 2;

/// `urma_target_type_t`.
pub type UrmaTargetType = u32;
/// Target is a JFR.
pub const URMA_JFR: UrmaTargetType = 0;
/// Target is a jetty.
pub const URMA_JETTY: UrmaTargetType = 1;
/// Target is a jetty group.
pub const URMA_JETTY_GROUP: UrmaTargetType = 2;

/// Jetty-group policy round robin.
pub const URMA_JETTY_GRP_POLICY_RR: u32 = 0;
/// Jetty-group policy hash hint.
pub const URMA_JETTY_GRP_POLICY_HASH_HINT: u32 = 1;

/// `urma_order_type_t`.
pub type UrmaOrderType = u32;
/// Default: the library picks (OI for RM, OL for RC, NO for UM).
pub const URMA_DEF_ORDER: UrmaOrderType = 0;
/// Target ordering.
pub const URMA_OT: UrmaOrderType = 1;
/// Initiator ordering.
pub const URMA_OI: UrmaOrderType = 2;
/// Low-layer ordering.
pub const URMA_OL: UrmaOrderType = 3;
/// No ordering.
pub const URMA_NO: UrmaOrderType = 4;

/// The order type `create_jetty` / `import_jetty` substitute for [`URMA_DEF_ORDER`] in a
/// transport mode (urma-abi.md §2): OI for RM, OL for RC, NO for UM; other modes unchanged.
pub fn default_order_type(trans_mode: UrmaTransportMode) -> UrmaOrderType {
    match trans_mode {
        URMA_TM_RM => URMA_OI,
        URMA_TM_RC => URMA_OL,
        URMA_TM_UM => URMA_NO,
        _ => URMA_DEF_ORDER,
    }
}

/// `urma_opcode_t`.
pub type UrmaOpcode = u32;
/// WRITE.
pub const URMA_OPC_WRITE: UrmaOpcode = 0x00;
/// WRITE with immediate.
pub const URMA_OPC_WRITE_IMM: UrmaOpcode = 0x01;
/// WRITE with notify.
pub const URMA_OPC_WRITE_NOTIFY: UrmaOpcode = 0x02;
/// READ.
pub const URMA_OPC_READ: UrmaOpcode = 0x10;
/// Compare and swap.
pub const URMA_OPC_CAS: UrmaOpcode = 0x20;
/// Swap.
pub const URMA_OPC_SWAP: UrmaOpcode = 0x21;
/// Fetch and add.
pub const URMA_OPC_FADD: UrmaOpcode = 0x22;
/// Fetch and sub.
pub const URMA_OPC_FSUB: UrmaOpcode = 0x23;
/// Fetch and and.
pub const URMA_OPC_FAND: UrmaOpcode = 0x24;
/// Fetch and or.
pub const URMA_OPC_FOR: UrmaOpcode = 0x25;
/// Fetch and xor.
pub const URMA_OPC_FXOR: UrmaOpcode = 0x26;
/// SEND.
pub const URMA_OPC_SEND: UrmaOpcode = 0x40;
/// SEND with immediate.
pub const URMA_OPC_SEND_IMM: UrmaOpcode = 0x41;
/// SEND with invalidate.
pub const URMA_OPC_SEND_INVALIDATE: UrmaOpcode = 0x42;
/// NOP.
pub const URMA_OPC_NOP: UrmaOpcode = 0x51;
/// Atomic write.
pub const URMA_OPC_WRITE_ATOMIC: UrmaOpcode = 0x60;
/// Flush DMA.
pub const URMA_OPC_FLUSH_DMA: UrmaOpcode = 0x80;

/// `urma_cr_status_t`.
pub type UrmaCrStatus = u32;
/// Success.
pub const URMA_CR_SUCCESS: UrmaCrStatus = 0;
/// Unsupported opcode.
pub const URMA_CR_UNSUPPORTED_OPCODE_ERR: UrmaCrStatus = 1;
/// Local length error.
pub const URMA_CR_LOC_LEN_ERR: UrmaCrStatus = 2;
/// Local operation error.
pub const URMA_CR_LOC_OPERATION_ERR: UrmaCrStatus = 3;
/// Local access error.
pub const URMA_CR_LOC_ACCESS_ERR: UrmaCrStatus = 4;
/// Remote response length error.
pub const URMA_CR_REM_RESP_LEN_ERR: UrmaCrStatus = 5;
/// Remote unsupported request.
pub const URMA_CR_REM_UNSUPPORTED_REQ_ERR: UrmaCrStatus = 6;
/// Remote operation error.
pub const URMA_CR_REM_OPERATION_ERR: UrmaCrStatus = 7;
/// Remote access abort (wrong token, out of range, no permission).
pub const URMA_CR_REM_ACCESS_ABORT_ERR: UrmaCrStatus = 8;
/// ACK timeout.
pub const URMA_CR_ACK_TIMEOUT_ERR: UrmaCrStatus = 9;
/// RNR retries exceeded.
pub const URMA_CR_RNR_RETRY_CNT_EXC_ERR: UrmaCrStatus = 10;
/// Flushed.
pub const URMA_CR_WR_FLUSH_ERR: UrmaCrStatus = 11;
/// Suspend done.
pub const URMA_CR_WR_SUSPEND_DONE: UrmaCrStatus = 12;
/// Flush error done.
pub const URMA_CR_WR_FLUSH_ERR_DONE: UrmaCrStatus = 13;
/// Unhandled.
pub const URMA_CR_WR_UNHANDLED: UrmaCrStatus = 14;
/// Local data poison.
pub const URMA_CR_LOC_DATA_POISON: UrmaCrStatus = 15;
/// Remote data poison.
pub const URMA_CR_REM_DATA_POISON: UrmaCrStatus = 16;

/// The C name of a `urma_cr_status_t` value, or `None` if it is not one.
pub fn cr_status_name(s: UrmaCrStatus) -> Option<&'static str> {
    const NAMES: [&str; 17] = [
        "URMA_CR_SUCCESS",
        "URMA_CR_UNSUPPORTED_OPCODE_ERR",
        "URMA_CR_LOC_LEN_ERR",
        "URMA_CR_LOC_OPERATION_ERR",
        "URMA_CR_LOC_ACCESS_ERR",
        "URMA_CR_REM_RESP_LEN_ERR",
        "URMA_CR_REM_UNSUPPORTED_REQ_ERR",
        "URMA_CR_REM_OPERATION_ERR",
        "URMA_CR_REM_ACCESS_ABORT_ERR",
        "URMA_CR_ACK_TIMEOUT_ERR",
        "URMA_CR_RNR_RETRY_CNT_EXC_ERR",
        "URMA_CR_WR_FLUSH_ERR",
        "URMA_CR_WR_SUSPEND_DONE",
        "URMA_CR_WR_FLUSH_ERR_DONE",
        "URMA_CR_WR_UNHANDLED",
        "URMA_CR_LOC_DATA_POISON",
        "URMA_CR_REM_DATA_POISON",
    ];
    NAMES.get(s as usize).copied()
}

/// `urma_cr_opcode_t` (receive completions).
pub type UrmaCrOpcode = u32;
/// SEND received.
pub const URMA_CR_OPC_SEND: UrmaCrOpcode = 0;
/// SEND with immediate received.
pub const URMA_CR_OPC_SEND_WITH_IMM: UrmaCrOpcode = 1;
/// SEND with invalidate received.
pub const URMA_CR_OPC_SEND_WITH_INV: UrmaCrOpcode = 2;
/// WRITE with immediate received.
pub const URMA_CR_OPC_WRITE_WITH_IMM: UrmaCrOpcode = 3;
/// Flush write.
pub const URMA_CR_OPC_FLUSH_WRITE: UrmaCrOpcode = 4;

/// `urma_cr_flag_t` bit s_r: 1 = receive completion, 0 = send.
pub const CR_FLAG_S_R: u8 = 0x1;
/// `urma_cr_flag_t` bit jetty: the local id is a jetty.
pub const CR_FLAG_JETTY: u8 = 0x2;
/// `urma_cr_flag_t` bit suspend_done.
pub const CR_FLAG_SUSPEND_DONE: u8 = 0x4;
/// `urma_cr_flag_t` bit flush_err_done.
pub const CR_FLAG_FLUSH_ERR_DONE: u8 = 0x8;

/// `urma_jetty_state_t`.
pub type UrmaJettyState = u32;
/// Reset.
pub const URMA_JETTY_STATE_RESET: UrmaJettyState = 0;
/// Ready.
pub const URMA_JETTY_STATE_READY: UrmaJettyState = 1;
/// Suspended.
pub const URMA_JETTY_STATE_SUSPENDED: UrmaJettyState = 2;
/// Error.
pub const URMA_JETTY_STATE_ERROR: UrmaJettyState = 3;

/// `urma_jfr_state_t`.
pub type UrmaJfrState = u32;
/// Reset.
pub const URMA_JFR_STATE_RESET: UrmaJfrState = 0;
/// Ready.
pub const URMA_JFR_STATE_READY: UrmaJfrState = 1;
/// Error.
pub const URMA_JFR_STATE_ERROR: UrmaJfrState = 2;

/// `urma_jetty_attr_t::mask` bit: rx_threshold applies.
pub const JETTY_RX_THRESHOLD: u32 = 0x1;
/// `urma_jetty_attr_t::mask` bit: state applies.
pub const JETTY_STATE: u32 = 0x2;
/// `urma_jfr_attr_t::mask` bit: rx_threshold applies.
pub const JFR_RX_THRESHOLD: u32 = 0x1;
/// `urma_jfr_attr_t::mask` bit: state applies.
pub const JFR_STATE: u32 = 0x2;

/// `urma_tp_type_cap_t` / `union urma_tp_type_en` bit (`rm_tp_cap`, `rc_tp_cap`, `um_tp_cap`,
/// `priority_info[].tp_type`): reliable transport.
pub const TP_TYPE_RTP: u32 = 0x1;
/// The same: compact transport.
pub const TP_TYPE_CTP: u32 = 0x2;
/// The same: unreliable transport.
pub const TP_TYPE_UTP: u32 = 0x4;
/// `urma_order_type_cap_t` bit (`rm_order_cap`, `rc_order_cap`): OT.
pub const ORDER_CAP_OT: u32 = 0x1;
/// The same: OI.
pub const ORDER_CAP_OI: u32 = 0x2;
/// The same: OL.
pub const ORDER_CAP_OL: u32 = 0x4;
/// The same: NO.
pub const ORDER_CAP_NO: u32 = 0x8;

/// `urma_jfc_attr_t::mask` bit: moderate_count applies.
pub const JFC_MODERATE_COUNT: u32 = 0x1;
/// `urma_jfc_attr_t::mask` bit: moderate_period applies.
pub const JFC_MODERATE_PERIOD: u32 = 0x2;

/// Token policy none.
pub const URMA_TOKEN_NONE: u32 = 0;
/// Token policy plain text.
pub const URMA_TOKEN_PLAIN_TEXT: u32 = 1;
/// Token policy signed.
pub const URMA_TOKEN_SIGNED: u32 = 2;
/// Token policy all encrypted.
pub const URMA_TOKEN_ALL_ENCRYPTED: u32 = 3;
/// Token policy reserved.
pub const URMA_TOKEN_RESERVED: u32 = 4;

/// Import-seg mapping: no mapping.
pub const URMA_SEG_NOMAP: u32 = 0;
/// Import-seg mapping: mapped.
pub const URMA_SEG_MAPPED: u32 = 1;

/// Access value: local only (cannot combine with the others).
pub const URMA_ACCESS_LOCAL_ONLY: u32 = 1;
/// Access value: remote read.
pub const URMA_ACCESS_READ: u32 = 2;
/// Access value: remote write (requires READ).
pub const URMA_ACCESS_WRITE: u32 = 4;
/// Access value: remote atomic (requires READ and WRITE).
pub const URMA_ACCESS_ATOMIC: u32 = 8;

/// Typical RNR retry count.
pub const URMA_TYPICAL_RNR_RETRY: u8 = 7;
/// Typical error timeout.
pub const URMA_TYPICAL_ERR_TIMEOUT: u8 = 17;
/// Typical minimum RNR timer.
pub const URMA_TYPICAL_MIN_RNR_TIMER: u8 = 12;
/// Highest priority.
pub const URMA_MAX_PRIORITY: u8 = 15;

/// `urma_mtu_t`: 256.
pub const URMA_MTU_256: u32 = 1;
/// `urma_mtu_t`: 512.
pub const URMA_MTU_512: u32 = 2;
/// `urma_mtu_t`: 1024.
pub const URMA_MTU_1024: u32 = 3;
/// `urma_mtu_t`: 2048.
pub const URMA_MTU_2048: u32 = 4;
/// `urma_mtu_t`: 4096.
pub const URMA_MTU_4096: u32 = 5;
/// `urma_mtu_t`: 8192.
pub const URMA_MTU_8192: u32 = 6;

// ---- urma_device_cap_t::feature bits (by bit number) ----
/// oor.
pub const FEATURE_OOR: u32 = 1 << 0;
/// jfc_per_wr.
pub const FEATURE_JFC_PER_WR: u32 = 1 << 1;
/// stride_op.
pub const FEATURE_STRIDE_OP: u32 = 1 << 2;
/// load_store_op.
pub const FEATURE_LOAD_STORE_OP: u32 = 1 << 3;
/// non_pin.
pub const FEATURE_NON_PIN: u32 = 1 << 4;
/// pmem.
pub const FEATURE_PMEM: u32 = 1 << 5;
/// jfc_inline.
pub const FEATURE_JFC_INLINE: u32 = 1 << 6;
/// spray_en.
pub const FEATURE_SPRAY_EN: u32 = 1 << 7;
/// selective_retrans.
pub const FEATURE_SELECTIVE_RETRANS: u32 = 1 << 8;
/// live_migrate.
pub const FEATURE_LIVE_MIGRATE: u32 = 1 << 9;
/// dca.
pub const FEATURE_DCA: u32 = 1 << 10;
/// jetty_grp.
pub const FEATURE_JETTY_GRP: u32 = 1 << 11;
/// error_suspend.
pub const FEATURE_ERROR_SUSPEND: u32 = 1 << 12;
/// outorder_comp.
pub const FEATURE_OUTORDER_COMP: u32 = 1 << 13;
/// mn.
pub const FEATURE_MN: u32 = 1 << 14;
/// clan.
pub const FEATURE_CLAN: u32 = 1 << 15;
/// muti_seg_per_token_id.
pub const FEATURE_MUTI_SEG_PER_TOKEN_ID: u32 = 1 << 16;
/// ipourma_en.
pub const FEATURE_IPOURMA_EN: u32 = 1 << 17;
/// ctp_en.
pub const FEATURE_CTP_EN: u32 = 1 << 18;
/// uboe.
pub const FEATURE_UBOE: u32 = 1 << 19;

// ---- urma_jfc_flag_t ----
/// lock_free.
pub const JFC_FLAG_LOCK_FREE: u32 = 0x1;
/// jfc_inline.
pub const JFC_FLAG_JFC_INLINE: u32 = 0x2;
/// non_blocking (26.x).
pub const JFC_FLAG_NON_BLOCKING: u32 = 0x4;
/// has_drv_ext (26.x).
pub const JFC_FLAG_HAS_DRV_EXT: u32 = 0x8;

// ---- urma_jfs_flag_t ----
/// lock_free.
pub const JFS_FLAG_LOCK_FREE: u32 = 0x1;
/// error_suspend.
pub const JFS_FLAG_ERROR_SUSPEND: u32 = 0x2;
/// outorder_comp.
pub const JFS_FLAG_OUTORDER_COMP: u32 = 0x4;
/// order_type field shift (bits 3–10).
pub const JFS_FLAG_ORDER_TYPE_SHIFT: u32 = 3;
/// order_type field mask (shifted).
pub const JFS_FLAG_ORDER_TYPE_MASK: u32 = 0x7f8;
/// multi_path.
pub const JFS_FLAG_MULTI_PATH: u32 = 0x800;
/// ctp_rc_mul_path_mode.
pub const JFS_FLAG_CTP_RC_MUL_PATH_MODE: u32 = 0x1000;
/// non_blocking (26.x).
pub const JFS_FLAG_NON_BLOCKING: u32 = 0x2000;
/// has_drv_ext (26.x).
pub const JFS_FLAG_HAS_DRV_EXT: u32 = 0x4000;

// ---- urma_jfr_flag_t ----
/// token_policy field shift (bits 0–2).
pub const JFR_FLAG_TOKEN_POLICY_SHIFT: u32 = 0;
/// token_policy field mask.
pub const JFR_FLAG_TOKEN_POLICY_MASK: u32 = 0x7;
/// tag_matching.
pub const JFR_FLAG_TAG_MATCHING: u32 = 0x8;
/// lock_free.
pub const JFR_FLAG_LOCK_FREE: u32 = 0x10;
/// order_type field shift (bits 5–12).
pub const JFR_FLAG_ORDER_TYPE_SHIFT: u32 = 5;
/// order_type field mask (shifted).
pub const JFR_FLAG_ORDER_TYPE_MASK: u32 = 0x1fe0;
/// has_drv_ext (26.x).
pub const JFR_FLAG_HAS_DRV_EXT: u32 = 0x2000;
/// non_blocking (26.x).
pub const JFR_FLAG_NON_BLOCKING: u32 = 0x4000;

// ---- urma_jetty_flag_t ----
/// share_jfr (UB devices reject 0).
pub const JETTY_FLAG_SHARE_JFR: u32 = 0x1;
/// non_blocking.
pub const JETTY_FLAG_NON_BLOCKING: u32 = 0x2;
/// has_drv_ext.
pub const JETTY_FLAG_HAS_DRV_EXT: u32 = 0x4;
/// has_user_info.
pub const JETTY_FLAG_HAS_USER_INFO: u32 = 0x8;

// ---- urma_import_jetty_flag_t ----
/// token_policy field mask (bits 0–2).
pub const IMPORT_JETTY_TOKEN_POLICY_MASK: u32 = 0x7;
/// order_type field shift (bits 3–10).
pub const IMPORT_JETTY_ORDER_TYPE_SHIFT: u32 = 3;
/// order_type field mask (shifted).
pub const IMPORT_JETTY_ORDER_TYPE_MASK: u32 = 0x7f8;
/// share_tp.
pub const IMPORT_JETTY_SHARE_TP: u32 = 0x800;
/// has_drv_ext.
pub const IMPORT_JETTY_HAS_DRV_EXT: u32 = 0x1000;
/// has_user_info.
pub const IMPORT_JETTY_HAS_USER_INFO: u32 = 0x2000;

// ---- urma_reg_seg_flag_t ----
/// token_policy field mask (bits 0–2).
pub const REG_SEG_TOKEN_POLICY_MASK: u32 = 0x7;
/// cacheable.
pub const REG_SEG_CACHEABLE: u32 = 0x8;
/// dsva.
pub const REG_SEG_DSVA: u32 = 0x10;
/// access field shift (bits 5–10): `URMA_ACCESS_* << 5`.
pub const REG_SEG_ACCESS_SHIFT: u32 = 5;
/// access field mask (shifted).
pub const REG_SEG_ACCESS_MASK: u32 = 0x7e0;
/// non_pin.
pub const REG_SEG_NON_PIN: u32 = 0x800;
/// user_iova.
pub const REG_SEG_USER_IOVA: u32 = 0x1000;
/// token_id_valid.
pub const REG_SEG_TOKEN_ID_VALID: u32 = 0x2000;

// ---- urma_seg_attr_t (same as reg_seg except bit 13 and 14) ----
/// token_policy field mask.
pub const SEG_ATTR_TOKEN_POLICY_MASK: u32 = 0x7;
/// cacheable.
pub const SEG_ATTR_CACHEABLE: u32 = 0x8;
/// dsva.
pub const SEG_ATTR_DSVA: u32 = 0x10;
/// access field shift.
pub const SEG_ATTR_ACCESS_SHIFT: u32 = 5;
/// access field mask (shifted).
pub const SEG_ATTR_ACCESS_MASK: u32 = 0x7e0;
/// non_pin.
pub const SEG_ATTR_NON_PIN: u32 = 0x800;
/// user_iova.
pub const SEG_ATTR_USER_IOVA: u32 = 0x1000;
/// user_token_id.
pub const SEG_ATTR_USER_TOKEN_ID: u32 = 0x2000;
/// has_user_info.
pub const SEG_ATTR_HAS_USER_INFO: u32 = 0x4000;

// ---- urma_import_seg_flag_t ----
/// cacheable.
pub const IMPORT_SEG_CACHEABLE: u32 = 0x1;
/// access field shift (bits 1–6): `URMA_ACCESS_* << 1`.
pub const IMPORT_SEG_ACCESS_SHIFT: u32 = 1;
/// access field mask (shifted).
pub const IMPORT_SEG_ACCESS_MASK: u32 = 0x7e;
/// mapping (`URMA_SEG_MAPPED << 7`).
pub const IMPORT_SEG_MAPPING: u32 = 0x80;

// ---- urma_token_id_flag_t ----
/// multi_seg.
pub const TOKEN_ID_FLAG_MULTI_SEG: u32 = 0x1;

// ---- urma_jfs_wr_flag_t ----
/// place_order field mask (bits 0–1).
pub const WR_FLAG_PLACE_ORDER_MASK: u32 = 0x3;
/// comp_order.
pub const WR_FLAG_COMP_ORDER: u32 = 0x4;
/// fence.
pub const WR_FLAG_FENCE: u32 = 0x8;
/// solicited_enable.
pub const WR_FLAG_SOLICITED_ENABLE: u32 = 0x10;
/// complete_enable: without it the WR produces no completion record.
pub const WR_FLAG_COMPLETE_ENABLE: u32 = 0x20;
/// inline_flag.
pub const WR_FLAG_INLINE: u32 = 0x40;
/// db_bypass (26.x).
pub const WR_FLAG_DB_BYPASS: u32 = 0x80;
/// udf (26.x).
pub const WR_FLAG_UDF: u32 = 0x100;
/// has_drv_ext (26.x).
pub const WR_FLAG_HAS_DRV_EXT: u32 = 0x200;

// ---- urma_jfr_wr_flag_t ----
/// complete_type.
pub const JFR_WR_FLAG_COMPLETE_TYPE: u32 = 0x1;

// ---- urma_vlog_level_t ----
/// Log level EMERG.
pub const URMA_VLOG_LEVEL_EMERG: u32 = 0;
/// Log level DEBUG.
pub const URMA_VLOG_LEVEL_DEBUG: u32 = 7;

/// `errno` value `urma_wait_jfc` leaves when a signal interrupted it (returns 0): retry.
pub const ERESTARTSYS: i32 = 512;

// ---- urma_async_event_type_t (urma_opcode.h; added after the first release of this crate) ----
/// A JFC failed (overrun); element is the JFC.
pub const URMA_EVENT_JFC_ERR: u32 = 0;
/// A JFS failed; element is the JFS.
pub const URMA_EVENT_JFS_ERR: u32 = 1;
/// A JFR failed; element is the JFR.
pub const URMA_EVENT_JFR_ERR: u32 = 2;
/// A JFR reached its limit; element is the JFR.
pub const URMA_EVENT_JFR_LIMIT: u32 = 3;
/// A jetty failed (went to ERROR); element is the jetty.
pub const URMA_EVENT_JETTY_ERR: u32 = 4;
/// A jetty reached its limit; element is the jetty.
pub const URMA_EVENT_JETTY_LIMIT: u32 = 5;
/// A jetty group failed.
pub const URMA_EVENT_JETTY_GRP_ERR: u32 = 6;
/// A port became active; element is the port id.
pub const URMA_EVENT_PORT_ACTIVE: u32 = 7;
/// A port went down; element is the port id.
pub const URMA_EVENT_PORT_DOWN: u32 = 8;
/// The device failed.
pub const URMA_EVENT_DEV_FATAL: u32 = 9;
/// An EID changed; element is the EID index.
pub const URMA_EVENT_EID_CHANGE: u32 = 10;
/// Entity-level error.
pub const URMA_EVENT_ELR_ERR: u32 = 11;
/// Entity flush done.
pub const URMA_EVENT_ELR_DONE: u32 = 12;
