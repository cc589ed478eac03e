//! The signature of every liburma function urma-abi.md §2 lists, as `unsafe extern "C" fn`
//! types, and [`SYMBOLS`], the list of their names.
//!
//! A loader casts `dlsym` results to these types; an implementation can check each export at
//! compile time with `const _: fns::UrmaPollJfc = urma_poll_jfc;`.

use crate::device::*;
use crate::jetty::*;
use crate::seg::*;
use crate::status::UrmaStatus;
use crate::wr::*;
use core::ffi::{c_char, c_int};

/// `urma_log_cb_t`: `void (*)(int level, char *msg)`.
pub type UrmaLogCb = Option<unsafe extern "C" fn(level: c_int, msg: *mut c_char)>;

/// `urma_init`.
pub type UrmaInit = unsafe extern "C" fn(conf: *mut UrmaInitAttr) -> UrmaStatus;
/// `urma_uninit`.
pub type UrmaUninit = unsafe extern "C" fn() -> UrmaStatus;
/// `urma_get_device_list`.
pub type UrmaGetDeviceList = unsafe extern "C" fn(num_devices: *mut c_int) -> *mut *mut UrmaDevice;
/// `urma_free_device_list` (frees the array only).
pub type UrmaFreeDeviceList = unsafe extern "C" fn(device_list: *mut *mut UrmaDevice);
/// `urma_get_device_by_name`.
pub type UrmaGetDeviceByName = unsafe extern "C" fn(dev_name: *mut c_char) -> *mut UrmaDevice;
/// `urma_get_device_by_eid` (EID by value).
pub type UrmaGetDeviceByEid =
    unsafe extern "C" fn(eid: UrmaEid, type_: crate::consts::UrmaTransportType) -> *mut UrmaDevice;
/// `urma_get_eid_list`.
pub type UrmaGetEidList = unsafe extern "C" fn(dev: *mut UrmaDevice, cnt: *mut u32) -> *mut UrmaEidInfo;
/// `urma_free_eid_list`.
pub type UrmaFreeEidList = unsafe extern "C" fn(eid_list: *mut UrmaEidInfo);
/// `urma_query_device`.
pub type UrmaQueryDevice =
    unsafe extern "C" fn(dev: *mut UrmaDevice, dev_attr: *mut UrmaDeviceAttr) -> UrmaStatus;
/// `urma_create_context`.
pub type UrmaCreateContext = unsafe extern "C" fn(dev: *mut UrmaDevice, eid_index: u32) -> *mut UrmaContext;
/// `urma_delete_context`.
pub type UrmaDeleteContext = unsafe extern "C" fn(ctx: *mut UrmaContext) -> UrmaStatus;
/// `urma_create_jfce`.
pub type UrmaCreateJfce = unsafe extern "C" fn(ctx: *mut UrmaContext) -> *mut UrmaJfce;
/// `urma_delete_jfce`.
pub type UrmaDeleteJfce = unsafe extern "C" fn(jfce: *mut UrmaJfce) -> UrmaStatus;
/// `urma_create_jfc`.
pub type UrmaCreateJfc =
    unsafe extern "C" fn(ctx: *mut UrmaContext, jfc_cfg: *mut UrmaJfcCfg) -> *mut UrmaJfc;
/// `urma_delete_jfc`.
pub type UrmaDeleteJfc = unsafe extern "C" fn(jfc: *mut UrmaJfc) -> UrmaStatus;
/// `urma_rearm_jfc`.
pub type UrmaRearmJfc = unsafe extern "C" fn(jfc: *mut UrmaJfc, solicited_only: bool) -> UrmaStatus;
/// `urma_wait_jfc`: number of JFCs, 0 on timeout, -1 on error.
pub type UrmaWaitJfc =
    unsafe extern "C" fn(jfce: *mut UrmaJfce, jfc_cnt: u32, time_out: c_int, jfc: *mut *mut UrmaJfc) -> c_int;
/// `urma_ack_jfc`.
pub type UrmaAckJfc = unsafe extern "C" fn(jfc: *mut *mut UrmaJfc, nevents: *mut u32, jfc_cnt: u32);
/// `urma_poll_jfc`: number of records, < 0 on error.
pub type UrmaPollJfc = unsafe extern "C" fn(jfc: *mut UrmaJfc, cr_cnt: c_int, cr: *mut UrmaCr) -> c_int;
/// `urma_create_jfr`.
pub type UrmaCreateJfr =
    unsafe extern "C" fn(ctx: *mut UrmaContext, jfr_cfg: *mut UrmaJfrCfg) -> *mut UrmaJfr;
/// `urma_delete_jfr`.
pub type UrmaDeleteJfr = unsafe extern "C" fn(jfr: *mut UrmaJfr) -> UrmaStatus;
/// `urma_create_jetty` (rewrites `jfs_cfg.flag.order_type`).
pub type UrmaCreateJetty =
    unsafe extern "C" fn(ctx: *mut UrmaContext, jetty_cfg: *mut UrmaJettyCfg) -> *mut UrmaJetty;
/// `urma_delete_jetty`.
pub type UrmaDeleteJetty = unsafe extern "C" fn(jetty: *mut UrmaJetty) -> UrmaStatus;
/// `urma_modify_jetty`.
pub type UrmaModifyJetty =
    unsafe extern "C" fn(jetty: *mut UrmaJetty, attr: *mut UrmaJettyAttr) -> UrmaStatus;
/// `urma_query_jetty`.
pub type UrmaQueryJetty = unsafe extern "C" fn(
    jetty: *mut UrmaJetty,
    cfg: *mut UrmaJettyCfg,
    attr: *mut UrmaJettyAttr,
) -> UrmaStatus;
/// `urma_flush_jetty`: number of records, < 0 on error.
pub type UrmaFlushJetty =
    unsafe extern "C" fn(jetty: *mut UrmaJetty, cr_cnt: c_int, cr: *mut UrmaCr) -> c_int;
/// `urma_import_jetty` (rewrites `rjetty->flag.order_type`).
pub type UrmaImportJetty = unsafe extern "C" fn(
    ctx: *mut UrmaContext,
    rjetty: *mut UrmaRjetty,
    token_value: *mut UrmaToken,
) -> *mut UrmaTargetJetty;
/// `urma_unimport_jetty`.
pub type UrmaUnimportJetty = unsafe extern "C" fn(tjetty: *mut UrmaTargetJetty) -> UrmaStatus;
/// `urma_bind_jetty`.
pub type UrmaBindJetty =
    unsafe extern "C" fn(jetty: *mut UrmaJetty, tjetty: *mut UrmaTargetJetty) -> UrmaStatus;
/// `urma_unbind_jetty`.
pub type UrmaUnbindJetty = unsafe extern "C" fn(jetty: *mut UrmaJetty) -> UrmaStatus;
/// `urma_get_rjetty` (not in v25.12.0).
pub type UrmaGetRjetty =
    unsafe extern "C" fn(jetty: *mut UrmaJetty, rjetty: *mut *mut UrmaRjetty, length: *mut u32) -> UrmaStatus;
/// `urma_put_rjetty`.
pub type UrmaPutRjetty = unsafe extern "C" fn(rjetty: *mut UrmaRjetty);
/// `urma_alloc_token_id`.
pub type UrmaAllocTokenId = unsafe extern "C" fn(ctx: *mut UrmaContext) -> *mut UrmaTokenId;
/// `urma_free_token_id`.
pub type UrmaFreeTokenId = unsafe extern "C" fn(token_id: *mut UrmaTokenId) -> UrmaStatus;
/// `urma_register_seg`.
pub type UrmaRegisterSeg =
    unsafe extern "C" fn(ctx: *mut UrmaContext, seg_cfg: *mut UrmaSegCfg) -> *mut UrmaTargetSeg;
/// `urma_unregister_seg`.
pub type UrmaUnregisterSeg = unsafe extern "C" fn(target_seg: *mut UrmaTargetSeg) -> UrmaStatus;
/// `urma_import_seg` (flag is a `urma_import_seg_flag_t` by value).
pub type UrmaImportSeg = unsafe extern "C" fn(
    ctx: *mut UrmaContext,
    seg: *mut UrmaSeg,
    token_value: *mut UrmaToken,
    addr: u64,
    flag: u32,
) -> *mut UrmaTargetSeg;
/// `urma_unimport_seg`.
pub type UrmaUnimportSeg = unsafe extern "C" fn(tseg: *mut UrmaTargetSeg) -> UrmaStatus;
/// `urma_get_seg_ctx` (not in v25.12.0).
pub type UrmaGetSegCtx =
    unsafe extern "C" fn(tseg: *mut UrmaTargetSeg, seg: *mut *mut UrmaSeg, size: *mut u32) -> UrmaStatus;
/// `urma_put_seg_ctx`.
pub type UrmaPutSegCtx = unsafe extern "C" fn(seg: *mut UrmaSeg);
/// `urma_post_jetty_send_wr` (`bad_wr` must not be NULL).
pub type UrmaPostJettySendWr = unsafe extern "C" fn(
    jetty: *mut UrmaJetty,
    wr: *mut UrmaJfsWr,
    bad_wr: *mut *mut UrmaJfsWr,
) -> UrmaStatus;
/// `urma_post_jetty_recv_wr` (`bad_wr` must not be NULL).
pub type UrmaPostJettyRecvWr = unsafe extern "C" fn(
    jetty: *mut UrmaJetty,
    wr: *mut UrmaJfrWr,
    bad_wr: *mut *mut UrmaJfrWr,
) -> UrmaStatus;
/// `urma_post_jfr_wr`: receives for a JFR, which any jetty sharing it may take (`bad_wr` must
/// not be NULL). Not in urma-abi.md's list of 48: declared as UMDK's `urma_api.h` has it since
/// its first releases (newer headers make `jfr` a `const urma_jfr_t *`, the same ABI).
pub type UrmaPostJfrWr =
    unsafe extern "C" fn(jfr: *mut UrmaJfr, wr: *mut UrmaJfrWr, bad_wr: *mut *mut UrmaJfrWr) -> UrmaStatus;
/// `urma_get_async_event`.
pub type UrmaGetAsyncEvent =
    unsafe extern "C" fn(ctx: *mut UrmaContext, event: *mut UrmaAsyncEvent) -> UrmaStatus;
/// `urma_ack_async_event`.
pub type UrmaAckAsyncEvent = unsafe extern "C" fn(event: *mut UrmaAsyncEvent);
/// `urma_register_log_func`.
pub type UrmaRegisterLogFunc = unsafe extern "C" fn(func: UrmaLogCb) -> UrmaStatus;
/// `urma_log_set_level` (0..=7, EMERG..DEBUG).
pub type UrmaLogSetLevel = unsafe extern "C" fn(level: u32);
/// `urma_str_to_eid`: 0 on success.
pub type UrmaStrToEid = unsafe extern "C" fn(buf: *const c_char, eid: *mut UrmaEid) -> c_int;
/// `urma_u32_to_eid`.
pub type UrmaU32ToEid = unsafe extern "C" fn(ipv4: u32, eid: *mut UrmaEid);

/// `urma_modify_jfc`: completion moderation.
pub type UrmaModifyJfc = unsafe extern "C" fn(jfc: *mut UrmaJfc, attr: *mut UrmaJfcAttr) -> UrmaStatus;
/// `urma_modify_jfr`: state (RESET 0, READY 1, ERROR 2) and rx threshold.
pub type UrmaModifyJfr = unsafe extern "C" fn(jfr: *mut UrmaJfr, attr: *mut UrmaJfrAttr) -> UrmaStatus;
/// `urma_query_jfr`: the configuration and the current state.
pub type UrmaQueryJfr =
    unsafe extern "C" fn(jfr: *mut UrmaJfr, cfg: *mut UrmaJfrCfg, attr: *mut UrmaJfrAttr) -> UrmaStatus;
/// `urma_user_ctl`: a driver-specific request (`URMA_ENOPERM` for an opcode the driver lacks).
pub type UrmaUserCtl = unsafe extern "C" fn(
    ctx: *mut UrmaContext,
    in_: *mut UrmaUserCtlIn,
    out: *mut UrmaUserCtlOut,
) -> UrmaStatus;
/// `urma_unregister_log_func`: back to the default log output.
pub type UrmaUnregisterLogFunc = unsafe extern "C" fn() -> UrmaStatus;

/// The names of all functions declared here, in urma-abi.md §2 order.
pub const SYMBOLS: &[&str] = &[
    "urma_init",
    "urma_uninit",
    "urma_get_device_list",
    "urma_free_device_list",
    "urma_get_device_by_name",
    "urma_get_device_by_eid",
    "urma_get_eid_list",
    "urma_free_eid_list",
    "urma_query_device",
    "urma_create_context",
    "urma_delete_context",
    "urma_create_jfce",
    "urma_delete_jfce",
    "urma_create_jfc",
    "urma_delete_jfc",
    "urma_rearm_jfc",
    "urma_wait_jfc",
    "urma_ack_jfc",
    "urma_poll_jfc",
    "urma_create_jfr",
    "urma_delete_jfr",
    "urma_create_jetty",
    "urma_delete_jetty",
    "urma_modify_jetty",
    "urma_query_jetty",
    "urma_flush_jetty",
    "urma_import_jetty",
    "urma_unimport_jetty",
    "urma_bind_jetty",
    "urma_unbind_jetty",
    "urma_get_rjetty",
    "urma_put_rjetty",
    "urma_alloc_token_id",
    "urma_free_token_id",
    "urma_register_seg",
    "urma_unregister_seg",
    "urma_import_seg",
    "urma_unimport_seg",
    "urma_get_seg_ctx",
    "urma_put_seg_ctx",
    "urma_post_jetty_send_wr",
    "urma_post_jetty_recv_wr",
    "urma_post_jfr_wr",
    "urma_get_async_event",
    "urma_ack_async_event",
    "urma_register_log_func",
    "urma_log_set_level",
    "urma_str_to_eid",
    "urma_u32_to_eid",
    "urma_modify_jfc",
    "urma_modify_jfr",
    "urma_query_jfr",
    "urma_user_ctl",
    "urma_unregister_log_func",
];
