//! Layouts of older UMDK releases (urma-abi.md §3.7). Function prototypes are unchanged; this
//! crate declares only the current (26.x) layout, and these numbers let a loader detect and
//! refuse, or adapt to, an older library.
//!
//! - **v25.12.0**: every cfg, WR, CR, segment and rjetty struct is identical to 26.x. The
//!   library-owned `urma_jfc_t`/`urma_jfs_t`/`urma_jfr_t`/`urma_jetty_t` are shorter (no
//!   trailing `*_opt`), `urma_device_cap_t` lacks `reserved`/`priority_info`, and the
//!   `non_blocking`, `has_drv_ext`, `db_bypass` and `udf` flag bits do not exist.
//!   `urma_get_rjetty` and `urma_get_seg_ctx` are not exported — the run-time tell.
//! - **URMA_24.12.0_LTS**: `urma_sge_t`, `urma_rjetty_t`, `urma_rjfr_t`, `urma_token_id_t` and
//!   `urma_context_t` are shorter and flags carry no order_type: WRs built with the 26.x layout
//!   are wrong for it. Also lacks the two symbols above.
//! - `jetty_id` at offset 8 of a jetty is the same in all three.

/// Symbols present since 26.x and absent from v25.12.0 and older: their absence identifies an
/// older library.
pub const SYMBOLS_SINCE_26: &[&str] = &["urma_get_rjetty", "urma_get_seg_ctx"];

/// Struct sizes of UMDK v25.12.0 that differ from 26.x.
pub mod v25_12 {
    /// `urma_device_cap_t`.
    pub const DEVICE_CAP_SIZE: usize = 176;
    /// `urma_device_attr_t`.
    pub const DEVICE_ATTR_SIZE: usize = 368;
    /// Offset of `urma_device_attr_t::port_cnt`.
    pub const DEVICE_ATTR_PORT_CNT_OFFSET: usize = 192;
    /// `urma_jfc_t`.
    pub const JFC_SIZE: usize = 168;
    /// `urma_jfs_t`.
    pub const JFS_SIZE: usize = 176;
    /// `urma_jfr_t`.
    pub const JFR_SIZE: usize = 184;
    /// `urma_jetty_t`.
    pub const JETTY_SIZE: usize = 224;
}

/// Struct sizes of UMDK URMA_24.12.0_LTS that differ from 26.x.
pub mod v24_12_lts {
    /// `urma_device_cap_t`.
    pub const DEVICE_CAP_SIZE: usize = 120;
    /// `urma_device_attr_t`.
    pub const DEVICE_ATTR_SIZE: usize = 312;
    /// Offset of `reserved_jetty_id_min` (before `port_cnt` in this release).
    pub const DEVICE_ATTR_RESERVED_JETTY_ID_MIN_OFFSET: usize = 136;
    /// Offset of `reserved_jetty_id_max`.
    pub const DEVICE_ATTR_RESERVED_JETTY_ID_MAX_OFFSET: usize = 140;
    /// Offset of `port_cnt`.
    pub const DEVICE_ATTR_PORT_CNT_OFFSET: usize = 144;
    /// `urma_context_t` (no `aggr_mode`).
    pub const CONTEXT_SIZE: usize = 96;
    /// `urma_rjetty_t` (no `tp_type`).
    pub const RJETTY_SIZE: usize = 40;
    /// `urma_rjfr_t` (no `tp_type`).
    pub const RJFR_SIZE: usize = 32;
    /// `urma_sge_t` (no `user_tseg`).
    pub const SGE_SIZE: usize = 24;
    /// `urma_token_id_t`.
    pub const TOKEN_ID_SIZE: usize = 32;
}

/// Offset of `jetty_id` in `urma_jetty_t`, stable across all three releases.
pub const JETTY_ID_OFFSET: usize = 8;
