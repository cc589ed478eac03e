//! # bypass-sim-urma: liburma on the simulated NIC
//!
//! A `liburma.so.0` that exports the URMA C API of openEuler UMDK (the prototypes and layouts of
//! `shared/reference/urma-abi.md`, declared in `bypass-urma-abi`) and implements it on
//! `bypass-sim` NICs, so URMA programs run on a laptop, between processes (shared-memory wire)
//! and hosts (UDP wire), with the simulator's faults, traces and captures.
//!
//! | URMA | here |
//! |---|---|
//! | device `bypass_sim<i>` | one simulated NIC; how many and on which wire: `BYPASS_SIM_URMA` ([`config`]) |
//! | EID | the NIC's address (`ident`) |
//! | context | a handle on the NIC; `async_fd` is the NIC's async-event eventfd |
//! | JFCE | a sim completion channel: `fd` is a real eventfd |
//! | JFC | a sim CQ; `urma_cr_t` translated from sim completions (`jfc`) |
//! | JFR | receive depth and SGE limit of the jetties sharing it (`jfr`) |
//! | jetty (RC) | a sim queue; bound = connected; first PSN derived from the jetty id |
//! | segment + token | a sim registration; `token_id` = key masked by the token (`ident`) |
//!
//! Every exported function catches panics, checks pointers against the registry of handles it
//! gave out (`registry`), and fails the way liburma does (`ffi`).

// The exported functions are `unsafe extern "C"`: their contract is the URMA API's (pointers to
// structs the caller owns must be valid for the call), stated once here and in the prototypes of
// `include/urma_api.h` rather than in 54 identical `# Safety` sections.
#![allow(clippy::missing_safety_doc)]

pub mod config;
mod context;
mod ffi;
mod handle_cache;
mod ident;
mod jetty;
mod jfc;
mod jfr;
mod log;
mod post;
mod registry;
mod runtime;
mod seg;
mod um;

pub use context::*;
pub use jetty::*;
pub use jfc::*;
pub use jfr::*;
pub use post::*;
pub use runtime::*;
pub use seg::*;

/// Every export has exactly the C type `bypass-urma-abi` declares for it.
mod signatures {
    use super::*;
    use bypass_urma_abi::fns;
    const _: fns::UrmaInit = urma_init;
    const _: fns::UrmaUninit = urma_uninit;
    const _: fns::UrmaGetDeviceList = urma_get_device_list;
    const _: fns::UrmaFreeDeviceList = urma_free_device_list;
    const _: fns::UrmaGetDeviceByName = urma_get_device_by_name;
    const _: fns::UrmaGetDeviceByEid = urma_get_device_by_eid;
    const _: fns::UrmaGetEidList = urma_get_eid_list;
    const _: fns::UrmaFreeEidList = urma_free_eid_list;
    const _: fns::UrmaQueryDevice = urma_query_device;
    const _: fns::UrmaCreateContext = urma_create_context;
    const _: fns::UrmaDeleteContext = urma_delete_context;
    const _: fns::UrmaCreateJfce = urma_create_jfce;
    const _: fns::UrmaDeleteJfce = urma_delete_jfce;
    const _: fns::UrmaCreateJfc = urma_create_jfc;
    const _: fns::UrmaDeleteJfc = urma_delete_jfc;
    const _: fns::UrmaRearmJfc = urma_rearm_jfc;
    const _: fns::UrmaWaitJfc = urma_wait_jfc;
    const _: fns::UrmaAckJfc = urma_ack_jfc;
    const _: fns::UrmaPollJfc = urma_poll_jfc;
    const _: fns::UrmaCreateJfr = urma_create_jfr;
    const _: fns::UrmaDeleteJfr = urma_delete_jfr;
    const _: fns::UrmaCreateJetty = urma_create_jetty;
    const _: fns::UrmaDeleteJetty = urma_delete_jetty;
    const _: fns::UrmaModifyJetty = urma_modify_jetty;
    const _: fns::UrmaQueryJetty = urma_query_jetty;
    const _: fns::UrmaFlushJetty = urma_flush_jetty;
    const _: fns::UrmaImportJetty = urma_import_jetty;
    const _: fns::UrmaUnimportJetty = urma_unimport_jetty;
    const _: fns::UrmaBindJetty = urma_bind_jetty;
    const _: fns::UrmaUnbindJetty = urma_unbind_jetty;
    const _: fns::UrmaGetRjetty = urma_get_rjetty;
    const _: fns::UrmaPutRjetty = urma_put_rjetty;
    const _: fns::UrmaAllocTokenId = urma_alloc_token_id;
    const _: fns::UrmaFreeTokenId = urma_free_token_id;
    const _: fns::UrmaRegisterSeg = urma_register_seg;
    const _: fns::UrmaUnregisterSeg = urma_unregister_seg;
    const _: fns::UrmaImportSeg = urma_import_seg;
    const _: fns::UrmaUnimportSeg = urma_unimport_seg;
    const _: fns::UrmaGetSegCtx = urma_get_seg_ctx;
    const _: fns::UrmaPutSegCtx = urma_put_seg_ctx;
    const _: fns::UrmaPostJettySendWr = urma_post_jetty_send_wr;
    const _: fns::UrmaPostJettyRecvWr = urma_post_jetty_recv_wr;
    const _: fns::UrmaPostJfrWr = urma_post_jfr_wr;
    const _: fns::UrmaGetAsyncEvent = urma_get_async_event;
    const _: fns::UrmaAckAsyncEvent = urma_ack_async_event;
    const _: fns::UrmaRegisterLogFunc = urma_register_log_func;
    const _: fns::UrmaLogSetLevel = urma_log_set_level;
    const _: fns::UrmaStrToEid = urma_str_to_eid;
    const _: fns::UrmaU32ToEid = urma_u32_to_eid;
    const _: fns::UrmaModifyJfc = urma_modify_jfc;
    const _: fns::UrmaModifyJfr = urma_modify_jfr;
    const _: fns::UrmaQueryJfr = urma_query_jfr;
    const _: fns::UrmaUserCtl = urma_user_ctl;
    const _: fns::UrmaUnregisterLogFunc = urma_unregister_log_func;
}
