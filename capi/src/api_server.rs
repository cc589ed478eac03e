//! The exported server functions (and the logger and the deprecated functions).

use crate::config;
use crate::ctx::{self, CTXS};
use crate::guard::guard;
use crate::handle::Handle;
use crate::log::{DEBUG, ERROR, WARN};
use crate::server::{self, MAX_ID, SERVERS};
use crate::types::*;
use std::ffi::{c_char, c_int};

/// Reads `p` as a message's bytes (`None`: data NULL with a non-zero length).
///
/// # Safety
/// `m.data` points to `m.len` readable bytes, or is NULL with `len` 0.
pub(crate) unsafe fn bytes<'a>(m: &OckRpcMessage) -> Option<&'a [u8]> {
    if m.len == 0 {
        return Some(&[]);
    }
    if m.data.is_null() {
        return None;
    }
    // SAFETY: the caller's contract.
    Some(unsafe { std::slice::from_raw_parts(m.data as *const u8, m.len) })
}

/// Whether `id` is a valid message id (logs if not).
pub(crate) fn id_ok(f: &str, id: u16) -> bool {
    if id >= MAX_ID {
        crate::log!(ERROR, "{f}: message id {id} is out of range: ids are 0..{}", MAX_ID - 1);
        return false;
    }
    true
}

/// `OckRpcSetExternalLogger`.
#[no_mangle]
pub extern "C" fn OckRpcSetExternalLogger(h: OckRpcLogHandler) {
    guard("OckRpcSetExternalLogger", (), || crate::log::set(h))
}

/// `Hcom4dbSetLogFunc`: an alias of `OckRpcSetExternalLogger` (libcomm resolves it).
#[no_mangle]
pub extern "C" fn Hcom4dbSetLogFunc(h: OckRpcLogHandler) {
    guard("Hcom4dbSetLogFunc", (), || crate::log::set(h))
}

/// `OckRpcDisableSecureHmac`: deprecated, a no-op.
#[no_mangle]
pub extern "C" fn OckRpcDisableSecureHmac() {
    guard("OckRpcDisableSecureHmac", (), || {
        crate::log!(DEBUG, "OckRpcDisableSecureHmac: deprecated, nothing to do")
    })
}

/// `OckRpcServerCtxBuilderThreadLocal`: deprecated; returns 0 (no context is needed).
#[no_mangle]
pub extern "C" fn OckRpcServerCtxBuilderThreadLocal(_server: Handle) -> Handle {
    guard("OckRpcServerCtxBuilderThreadLocal", 0, || 0)
}

/// `OckRpcServerCtxCleanupThreadLocal`: deprecated, a no-op.
#[no_mangle]
pub extern "C" fn OckRpcServerCtxCleanupThreadLocal(_server: Handle, _ctx: Handle) {
    guard("OckRpcServerCtxCleanupThreadLocal", (), || ())
}

/// `OckRpcServerCreateWithCfg`.
///
/// # Safety
/// `ip` is NULL or a C string; `out` NULL or writable; `cfg` NULL or a readable config.
#[no_mangle]
pub unsafe extern "C" fn OckRpcServerCreateWithCfg(
    ip: *const c_char,
    port: u16,
    out: *mut Handle,
    cfg: *mut OckRpcCreateConfig,
) -> OckRpcStatus {
    guard("OckRpcServerCreateWithCfg", OCK_RPC_ERR, || {
        if out.is_null() {
            crate::log!(ERROR, "OckRpcServerCreateWithCfg: server (the out pointer) is NULL");
            return OCK_RPC_ERR_INVALID_PARAM;
        }
        // SAFETY: a C string or NULL (bounded read).
        let Some(ip) = (unsafe { config::bounded_str(ip, 64) }) else {
            crate::log!(ERROR, "OckRpcServerCreateWithCfg: ip is NULL or not a terminated string");
            return OCK_RPC_ERR_INVALID_PARAM;
        };
        if ip.parse::<std::net::IpAddr>().is_err() {
            crate::log!(ERROR, "OckRpcServerCreateWithCfg: ip {ip:?} is not an IP address");
            return OCK_RPC_ERR_INVALID_PARAM;
        }
        if (1..1024).contains(&port) {
            crate::log!(
                ERROR,
                "OckRpcServerCreateWithCfg: port {port} is privileged: use 1024..=65535, or 0 for the first free \
                 port of server.create.range"
            );
            return OCK_RPC_ERR_INVALID_PARAM;
        }
        // SAFETY: the caller's contract.
        let settings = match unsafe { config::parse(cfg, config::Role::Server) } {
            Ok(s) => s,
            Err(st) => return st,
        };
        match server::create(ip, port, settings) {
            Ok(obj) => {
                let h = SERVERS.insert(obj);
                // SAFETY: checked non-NULL; the caller's out pointer.
                unsafe { *out = h };
                OCK_RPC_OK
            }
            Err(st) => st,
        }
    })
}

/// `OckRpcGetOobIpAndPort`: one address, malloc'd (free the strings, then both arrays).
///
/// # Safety
/// The out pointers are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn OckRpcGetOobIpAndPort(
    server: Handle,
    ips: *mut *mut *mut c_char,
    ports: *mut *mut u16,
    length: *mut c_int,
) -> bool {
    guard("OckRpcGetOobIpAndPort", false, || {
        let Some(obj) = server::lookup(server) else {
            crate::log!(ERROR, "OckRpcGetOobIpAndPort: invalid server handle {server:#x}");
            return false;
        };
        if ips.is_null() || ports.is_null() || length.is_null() {
            crate::log!(ERROR, "OckRpcGetOobIpAndPort: NULL out pointer");
            return false;
        }
        let Some(addr) = *obj.bound.lock().unwrap_or_else(|e| e.into_inner()) else {
            crate::log!(ERROR, "OckRpcGetOobIpAndPort: the server is not started");
            return false;
        };
        let ip = std::ffi::CString::new(addr.ip().to_string()).unwrap_or_default();
        // SAFETY: plain mallocs, filled before they are handed out; the caller frees them.
        unsafe {
            let s = libc::strdup(ip.as_ptr());
            let a = libc::malloc(std::mem::size_of::<*mut c_char>()) as *mut *mut c_char;
            let p = libc::malloc(std::mem::size_of::<u16>()) as *mut u16;
            if s.is_null() || a.is_null() || p.is_null() {
                libc::free(s as *mut _);
                libc::free(a as *mut _);
                libc::free(p as *mut _);
                return false;
            }
            *a = s;
            *p = addr.port();
            *ips = a;
            *ports = p;
            *length = 1;
        }
        true
    })
}

fn add(f: &'static str, server: Handle, rndv: bool, id: u16, handler: usize) -> OckRpcStatus {
    guard(f, OCK_RPC_ERR, || {
        let Some(obj) = server::lookup(server) else {
            crate::log!(ERROR, "{f}: invalid server handle {server:#x}");
            return OCK_RPC_ERR_INVALID_PARAM;
        };
        if !id_ok(f, id) {
            return OCK_RPC_ERR_INVALID_PARAM;
        }
        if handler == 0 {
            crate::log!(ERROR, "{f}: the service of id {id} has a NULL handler");
            return OCK_RPC_ERR_INVALID_PARAM;
        }
        if rndv && !obj.settings.rndv {
            crate::log!(WARN, "{f}: server.rndv.enable is not \"yes\"; the service is added anyway");
        }
        obj.dispatch.services.set(rndv, id, handler);
        OCK_RPC_OK
    })
}

/// `OckRpcServerAddService`: before or after start; the same id replaces.
///
/// # Safety
/// `service` is NULL or readable.
#[no_mangle]
pub unsafe extern "C" fn OckRpcServerAddService(server: Handle, service: *mut OckRpcService) -> OckRpcStatus {
    if service.is_null() {
        return guard("OckRpcServerAddService", OCK_RPC_ERR, || {
            crate::log!(ERROR, "OckRpcServerAddService: service is NULL");
            OCK_RPC_ERR_INVALID_PARAM
        });
    }
    // SAFETY: checked non-NULL; the caller's struct.
    let s = unsafe { *service };
    add("OckRpcServerAddService", server, false, s.id, s.handler.map_or(0, |f| f as usize))
}

/// `OckRpcServerAddRndvService`.
///
/// # Safety
/// `service` is NULL or readable.
#[no_mangle]
pub unsafe extern "C" fn OckRpcServerAddRndvService(
    server: Handle,
    service: *mut OckRpcRndvService,
) -> OckRpcStatus {
    if service.is_null() {
        return guard("OckRpcServerAddRndvService", OCK_RPC_ERR, || {
            crate::log!(ERROR, "OckRpcServerAddRndvService: service is NULL");
            OCK_RPC_ERR_INVALID_PARAM
        });
    }
    // SAFETY: checked non-NULL; the caller's struct.
    let s = unsafe { *service };
    add("OckRpcServerAddRndvService", server, true, s.id, s.handler.map_or(0, |f| f as usize))
}

/// `OckRpcServerStart`.
#[no_mangle]
pub extern "C" fn OckRpcServerStart(server: Handle) -> OckRpcStatus {
    guard("OckRpcServerStart", OCK_RPC_ERR, || match server::lookup(server) {
        Some(obj) => server::start(&obj),
        None => {
            crate::log!(ERROR, "OckRpcServerStart: invalid server handle {server:#x}");
            OCK_RPC_ERR_INVALID_PARAM
        }
    })
}

/// `OckRpcServerDestroy`.
#[no_mangle]
pub extern "C" fn OckRpcServerDestroy(server: Handle) {
    guard("OckRpcServerDestroy", (), || match SERVERS.remove(server) {
        Some(obj) => server::destroy(&obj),
        None => crate::log!(ERROR, "OckRpcServerDestroy: invalid server handle {server:#x}"),
    })
}

fn reply(
    f: &'static str,
    h: Handle,
    msg_id: u16,
    msg: *mut OckRpcMessage,
    done: *mut OckRpcCallDone,
) -> OckRpcStatus {
    guard(f, OCK_RPC_ERR, || {
        let Some(c) = ctx::lookup(h) else {
            crate::log!(ERROR, "{f}: invalid context {h:#x}");
            return OCK_RPC_ERR_INVALID_PARAM;
        };
        if msg.is_null() {
            crate::log!(ERROR, "{f}: reply is NULL (a zero-length reply is {{NULL, 0}})");
            return OCK_RPC_ERR_INVALID_PARAM;
        }
        // SAFETY: checked non-NULL; the caller's message.
        let m = unsafe { *msg };
        // SAFETY: the caller's message bytes.
        let Some(data) = (unsafe { bytes(&m) }) else {
            crate::log!(ERROR, "{f}: reply data is NULL with length {}", m.len);
            return OCK_RPC_ERR_INVALID_PARAM;
        };
        if msg_id != c.msg_id {
            crate::log!(WARN, "{f}: reply id {msg_id} differs from the request's {}", c.msg_id);
        }
        let req = c.req.lock().unwrap_or_else(|e| e.into_inner()).take();
        let Some(req) = req else {
            crate::log!(ERROR, "{f}: the request of context {h:#x} was answered already");
            return OCK_RPC_ERR_INVALID_PARAM;
        };
        // Copies (or sends) the data before returning.
        let st = match bypass::match_any!(req, r => r.reply(data)) {
            Ok(()) => OCK_RPC_OK,
            Err(e) => {
                crate::log!(WARN, "{f}: {e}");
                server::status_of(&e)
            }
        };
        if st != OCK_RPC_OK || done.is_null() {
            return st;
        }
        // SAFETY: checked non-NULL; the caller's struct.
        crate::call::Done(unsafe { *done }).run(OCK_RPC_OK);
        OCK_RPC_OK
    })
}

/// `OckRpcServerReply`.
///
/// # Safety
/// Pointer arguments are NULL or valid as the header says.
#[no_mangle]
pub unsafe extern "C" fn OckRpcServerReply(
    ctx: Handle,
    msg_id: u16,
    reply_msg: *mut OckRpcMessage,
    done: *mut OckRpcCallDone,
) -> OckRpcStatus {
    reply("OckRpcServerReply", ctx, msg_id, reply_msg, done)
}

/// `OckRpcServerReplyRndv`.
///
/// # Safety
/// Pointer arguments are NULL or valid as the header says.
#[no_mangle]
pub unsafe extern "C" fn OckRpcServerReplyRndv(
    ctx: Handle,
    msg_id: u16,
    reply_msg: *mut OckRpcMessage,
    done: *mut OckRpcCallDone,
) -> OckRpcStatus {
    reply("OckRpcServerReplyRndv", ctx, msg_id, reply_msg, done)
}

fn get_client(f: &'static str, h: Handle, out: *mut Handle) -> c_int {
    guard(f, OCK_RPC_ERR, || {
        let Some(c) = ctx::lookup(h) else {
            crate::log!(ERROR, "{f}: invalid context {h:#x}");
            return OCK_RPC_ERR_INVALID_PARAM;
        };
        if out.is_null() {
            return OCK_RPC_ERR_INVALID_PARAM;
        }
        let client = c.dispatch.conns.lock().unwrap_or_else(|e| e.into_inner()).get(&c.channel).copied();
        match client {
            Some(cl) => {
                // SAFETY: checked non-NULL; the caller's out pointer.
                unsafe { *out = cl };
                OCK_RPC_OK
            }
            None => OCK_RPC_ERR_CONN_BROKEN,
        }
    })
}

/// `OckRpcGetClient`.
///
/// # Safety
/// Pointer arguments are NULL or valid as the header says.
#[no_mangle]
pub unsafe extern "C" fn OckRpcGetClient(ctx: Handle, client: *mut Handle) -> c_int {
    get_client("OckRpcGetClient", ctx, client)
}

/// `OckRpcGetRndvClient`.
///
/// # Safety
/// Pointer arguments are NULL or valid as the header says.
#[no_mangle]
pub unsafe extern "C" fn OckRpcGetRndvClient(ctx: Handle, client: *mut Handle) -> c_int {
    get_client("OckRpcGetRndvClient", ctx, client)
}

/// `OckRpcCloneCtx`: a second handle on the request, valid until `OckRpcDeCloneCtx`.
#[no_mangle]
pub extern "C" fn OckRpcCloneCtx(ctx: Handle) -> Handle {
    guard("OckRpcCloneCtx", 0, || match ctx::lookup(ctx) {
        Some(c) => CTXS.insert(c),
        None => {
            crate::log!(ERROR, "OckRpcCloneCtx: invalid context {ctx:#x}");
            0
        }
    })
}

/// `OckRpcDeCloneCtx`.
#[no_mangle]
pub extern "C" fn OckRpcDeCloneCtx(ctx: Handle) {
    guard("OckRpcDeCloneCtx", (), || {
        if CTXS.remove(ctx).is_none() {
            crate::log!(ERROR, "OckRpcDeCloneCtx: invalid context {ctx:#x}");
        }
    })
}

/// `OckRpcServerCleanupCtx`: deprecated; harmless on any context (the handler's context ends
/// when the handler returns, a clone with `OckRpcDeCloneCtx`).
#[no_mangle]
pub extern "C" fn OckRpcServerCleanupCtx(ctx: Handle) {
    guard("OckRpcServerCleanupCtx", (), || {
        if ctx::lookup(ctx).is_none() {
            crate::log!(DEBUG, "OckRpcServerCleanupCtx: context {ctx:#x} is not live (nothing to do)");
        }
    })
}

/// `OckRpcServerCleanupRndvCtx`: ends a rendezvous context.
#[no_mangle]
pub extern "C" fn OckRpcServerCleanupRndvCtx(ctx: Handle) -> c_int {
    guard("OckRpcServerCleanupRndvCtx", OCK_RPC_ERR, || match ctx::lookup(ctx) {
        Some(c) if c.rndv => {
            CTXS.remove(ctx);
            OCK_RPC_OK
        }
        Some(_) => {
            crate::log!(ERROR, "OckRpcServerCleanupRndvCtx: context {ctx:#x} is not a rendezvous context");
            OCK_RPC_ERR_INVALID_PARAM
        }
        None => {
            crate::log!(ERROR, "OckRpcServerCleanupRndvCtx: invalid context {ctx:#x}");
            OCK_RPC_ERR_INVALID_PARAM
        }
    })
}
