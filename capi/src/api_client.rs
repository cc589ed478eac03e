//! The exported client functions.

use crate::api_server::{bytes, id_ok};
use crate::call::{self, Done, Target};
use crate::client::{self, CLIENTS};
use crate::config;
use crate::guard::guard;
use crate::handle::Handle;
use crate::log::{DEBUG, ERROR};
use crate::types::*;
use std::cell::RefCell;
use std::ffi::{c_char, c_int};

/// Most request buffers of `OckRpcClientCallWithParam`.
const MAX_REQ_IOV: usize = 8;
/// Most segments of a rendezvous call.
const MAX_RNDV_SEGMENTS: usize = 4;

/// `OckRpcClientConnectWithCfg`: needs a server of the configured name (`server.create.name`,
/// default "service") created in this process; the channel uses that server's device.
///
/// # Safety
/// `ip` NULL or a C string; `out` NULL or writable; `cfg` NULL or a readable config.
#[no_mangle]
pub unsafe extern "C" fn OckRpcClientConnectWithCfg(
    ip: *const c_char,
    port: u16,
    out: *mut Handle,
    cfg: *mut OckRpcCreateConfig,
) -> OckRpcStatus {
    guard("OckRpcClientConnectWithCfg", OCK_RPC_ERR, || {
        if out.is_null() {
            crate::log!(ERROR, "OckRpcClientConnectWithCfg: client (the out pointer) is NULL");
            return OCK_RPC_ERR_INVALID_PARAM;
        }
        // SAFETY: a C string or NULL (bounded read).
        let Some(ip) = (unsafe { config::bounded_str(ip, 64) }) else {
            crate::log!(ERROR, "OckRpcClientConnectWithCfg: ip is NULL or not a terminated string");
            return OCK_RPC_ERR_INVALID_PARAM;
        };
        let Ok(ip) = ip.parse::<std::net::IpAddr>() else {
            crate::log!(ERROR, "OckRpcClientConnectWithCfg: ip {ip:?} is not an IP address");
            return OCK_RPC_ERR_INVALID_PARAM;
        };
        if (1..1024).contains(&port) {
            crate::log!(
                ERROR,
                "OckRpcClientConnectWithCfg: port {port} is privileged: servers listen on 1024..=65535"
            );
            return OCK_RPC_ERR_INVALID_PARAM;
        }
        // SAFETY: the caller's contract.
        let settings = match unsafe { config::parse(cfg, config::Role::Client) } {
            Ok(s) => s,
            Err(st) => return st,
        };
        if port == 0 {
            // As the reference: the connect itself fails.
            crate::log!(ERROR, "OckRpcClientConnectWithCfg: port 0: give the server's port (1024..=65535)");
            return OCK_RPC_ERR;
        }
        let Some(server) = client::server_named(&settings.name) else {
            crate::log!(
                ERROR,
                "OckRpcClientConnectWithCfg: no server named {:?} was created in this process: create one first \
                 (OckRpcServerCreateWithCfg); the client uses its device",
                settings.name
            );
            return OCK_RPC_ERR_INVALID_PARAM;
        };
        match client::connect(std::net::SocketAddr::new(ip, port), &settings, server) {
            Ok(h) => {
                // SAFETY: checked non-NULL; the caller's out pointer.
                unsafe { *out = h };
                OCK_RPC_OK
            }
            Err(st) => st,
        }
    })
}

/// `OckRpcClientDisconnect`: closes the client (the break handler, if set, runs) and ends the
/// handle.
#[no_mangle]
pub extern "C" fn OckRpcClientDisconnect(h: Handle) {
    guard("OckRpcClientDisconnect", (), || match client::lookup(h) {
        Some(c) => {
            c.close();
            CLIENTS.remove(h);
        }
        None => crate::log!(ERROR, "OckRpcClientDisconnect: invalid client handle {h:#x}"),
    })
}

/// `OckRpcClientDisconnectBreakHandler`: ends the handle (from a break handler).
#[no_mangle]
pub extern "C" fn OckRpcClientDisconnectBreakHandler(h: Handle) {
    guard("OckRpcClientDisconnectBreakHandler", (), || {
        if let Some(c) = CLIENTS.remove(h) {
            c.close();
        } else {
            crate::log!(DEBUG, "OckRpcClientDisconnectBreakHandler: client {h:#x} is already ended");
        }
    })
}

/// `OckRpcSetUpCtx`.
#[no_mangle]
pub extern "C" fn OckRpcSetUpCtx(h: Handle, ctx: u64) -> c_int {
    guard("OckRpcSetUpCtx", OCK_RPC_ERR, || match client::lookup(h) {
        Some(c) => {
            c.set_context(ctx);
            OCK_RPC_OK
        }
        None => {
            crate::log!(ERROR, "OckRpcSetUpCtx: invalid client handle {h:#x}");
            OCK_RPC_ERR_INVALID_PARAM
        }
    })
}

/// `OckRpcGetUpCtx`.
///
/// # Safety
/// Pointer arguments are NULL or valid as the header says.
#[no_mangle]
pub unsafe extern "C" fn OckRpcGetUpCtx(h: Handle, ctx: *mut u64) -> c_int {
    guard("OckRpcGetUpCtx", OCK_RPC_ERR, || match (client::lookup(h), ctx.is_null()) {
        (Some(c), false) => {
            // SAFETY: checked non-NULL; the caller's out pointer.
            unsafe { *ctx = c.context() };
            OCK_RPC_OK
        }
        _ => {
            crate::log!(ERROR, "OckRpcGetUpCtx: invalid client handle {h:#x} or NULL ctx");
            OCK_RPC_ERR_INVALID_PARAM
        }
    })
}

/// `OckRpcClientSetTimeout`: ms; negative never; 0 immediate; per client.
#[no_mangle]
pub extern "C" fn OckRpcClientSetTimeout(h: Handle, timeout: i64) {
    guard("OckRpcClientSetTimeout", (), || match client::lookup(h) {
        Some(c) => c.set_timeout(timeout),
        None => crate::log!(ERROR, "OckRpcClientSetTimeout: invalid client handle {h:#x}"),
    })
}

fn done_of(done: *mut OckRpcCallDone) -> Option<Done> {
    // SAFETY: NULL or the caller's struct (copied now; the header lets it go after the call).
    (!done.is_null()).then(|| Done(unsafe { *done }))
}

fn target_of(f: &str, rsp: *mut OckRpcMessage, count: usize) -> Result<Target, OckRpcStatus> {
    if count == 0 {
        return Ok(Target::None);
    }
    if rsp.is_null() {
        crate::log!(ERROR, "{f}: {count} response buffers but the array is NULL");
        return Err(OCK_RPC_ERR_INVALID_PARAM);
    }
    // SAFETY: `rsp` holds `count` messages (the caller's contract).
    let msgs = unsafe { std::slice::from_raw_parts(rsp, count) };
    let malloc = count == 1 && msgs[0].data.is_null();
    if !malloc && msgs.iter().any(|m| m.data.is_null() && m.len > 0) {
        crate::log!(ERROR, "{f}: a response buffer is NULL with a non-zero length");
        return Err(OCK_RPC_ERR_INVALID_PARAM);
    }
    Ok(Target::Iov(rsp, count))
}

/// `OckRpcClientCall`.
///
/// # Safety
/// Pointers NULL or valid as the header says; with `done`, `response` stays valid until it runs.
#[no_mangle]
pub unsafe extern "C" fn OckRpcClientCall(
    h: Handle,
    msg_id: u16,
    request: *mut OckRpcMessage,
    response: *mut OckRpcMessage,
    done: *mut OckRpcCallDone,
) -> OckRpcStatus {
    guard("OckRpcClientCall", OCK_RPC_ERR, || {
        const F: &str = "OckRpcClientCall";
        let Some(c) = client::lookup(h) else {
            crate::log!(ERROR, "{F}: invalid client handle {h:#x}");
            return OCK_RPC_ERR_INVALID_PARAM;
        };
        if !id_ok(F, msg_id) {
            return OCK_RPC_ERR_INVALID_PARAM;
        }
        if request.is_null() {
            crate::log!(ERROR, "{F}: request is NULL");
            return OCK_RPC_ERR_INVALID_PARAM;
        }
        // SAFETY: checked non-NULL; the caller's message and bytes.
        let Some(args) = (unsafe { bytes(&*request) }) else {
            crate::log!(ERROR, "{F}: request data is NULL with a non-zero length");
            return OCK_RPC_ERR_INVALID_PARAM;
        };
        let target = match target_of(F, response, usize::from(!response.is_null())) {
            Ok(t) => t,
            Err(st) => return st,
        };
        call::call(&c, msg_id, args, target, done_of(done))
    })
}

thread_local! {
    static REQ: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// `OckRpcClientCallWithParam`: 1..8 request buffers, sent as ONE message (their
/// concatenation); `rspIov.count` 0 means no response.
///
/// # Safety
/// `params` NULL or valid as the header says.
#[no_mangle]
pub unsafe extern "C" fn OckRpcClientCallWithParam(params: *mut OckRpcClientCallParams) -> OckRpcStatus {
    guard("OckRpcClientCallWithParam", OCK_RPC_ERR, || {
        const F: &str = "OckRpcClientCallWithParam";
        if params.is_null() {
            crate::log!(ERROR, "{F}: params is NULL");
            return OCK_RPC_ERR_INVALID_PARAM;
        }
        // SAFETY: checked non-NULL; the caller's struct.
        let p = unsafe { *params };
        let Some(c) = client::lookup(p.client) else {
            crate::log!(ERROR, "{F}: invalid client handle {:#x}", p.client);
            return OCK_RPC_ERR_INVALID_PARAM;
        };
        if !id_ok(F, p.msg_id) {
            return OCK_RPC_ERR_INVALID_PARAM;
        }
        let n = p.req_iov.count;
        if !(1..=MAX_REQ_IOV).contains(&n) || p.req_iov.msgs.is_null() {
            crate::log!(
                ERROR,
                "{F}: reqIov has {n} buffers (array {:p}): give 1..={MAX_REQ_IOV}",
                p.req_iov.msgs
            );
            return OCK_RPC_ERR_INVALID_PARAM;
        }
        let segsize = c.server().map_or(usize::MAX, |s| s.settings.segsize);
        // SAFETY: `msgs` holds `count` messages (the caller's contract).
        let msgs = unsafe { std::slice::from_raw_parts(p.req_iov.msgs, n) };
        let mut parts: [&[u8]; MAX_REQ_IOV] = [&[]; MAX_REQ_IOV];
        for (i, m) in msgs.iter().enumerate() {
            // SAFETY: the caller's bytes.
            let Some(b) = (unsafe { bytes(m) }) else {
                crate::log!(ERROR, "{F}: reqIov.msgs[{i}] is NULL with length {}", m.len);
                return OCK_RPC_ERR_INVALID_PARAM;
            };
            if b.len() > segsize {
                crate::log!(
                    ERROR,
                    "{F}: reqIov.msgs[{i}] has {} bytes, more than the segment size {segsize}",
                    b.len()
                );
                return OCK_RPC_ERR_INVALID_PARAM;
            }
            parts[i] = b;
        }
        let target = match target_of(F, p.rsp_iov.msgs, p.rsp_iov.count) {
            Ok(t) => t,
            Err(st) => return st,
        };
        let done = done_of(p.done);
        if n == 1 {
            return call::call(&c, p.msg_id, parts[0], target, done);
        }
        let go = |buf: &mut Vec<u8>| {
            buf.clear();
            for part in &parts[..n] {
                buf.extend_from_slice(part);
            }
            call::call(&c, p.msg_id, buf, target, done)
        };
        REQ.with(|cell| match cell.try_borrow_mut() {
            Ok(mut v) => go(&mut v),
            Err(_) => go(&mut Vec::new()),
        })
    })
}

fn rndv(
    f: &'static str,
    h: Handle,
    msg_id: u16,
    infos: &[OckRpcMessageInfo],
    response: *mut OckRpcMessage,
    done: *mut OckRpcCallDone,
) -> OckRpcStatus {
    let Some(c) = client::lookup(h) else {
        crate::log!(ERROR, "{f}: invalid client handle {h:#x}");
        return OCK_RPC_ERR_INVALID_PARAM;
    };
    if !id_ok(f, msg_id) {
        return OCK_RPC_ERR_INVALID_PARAM;
    }
    if response.is_null() {
        crate::log!(ERROR, "{f}: response is NULL (a rendezvous call needs one)");
        return OCK_RPC_ERR_INVALID_PARAM;
    }
    if infos.is_empty() || infos.len() > MAX_RNDV_SEGMENTS {
        crate::log!(ERROR, "{f}: {} request segments: give 1..={MAX_RNDV_SEGMENTS}", infos.len());
        return OCK_RPC_ERR_INVALID_PARAM;
    }
    let Some(server) = c.server() else { return OCK_RPC_ERR_INVALID_PARAM };
    let mut segs = Vec::with_capacity(infos.len());
    for (i, m) in infos.iter().enumerate() {
        match server.regions().find(m.l_address, m.size as usize, m.l_key) {
            Some((e, off)) => segs.push((e, off, m.size as usize)),
            None => {
                crate::log!(
                    ERROR,
                    "{f}: request segment {i} ({} bytes at {:#x}, key {}) is not in a region registered on this \
                     client's server (OckRpcRegisterMemoryRegion or the memory allocator)",
                    m.size,
                    m.l_address,
                    m.l_key
                );
                return OCK_RPC_ERR_INVALID_PARAM;
            }
        }
    }
    let target = match target_of(f, response, 1) {
        Ok(t) => t,
        Err(st) => return st,
    };
    let st = call::call_rndv(&c, msg_id, &segs, target);
    // A rendezvous call runs to its end here; `done` then reports it (on this thread).
    match done_of(done) {
        Some(d) if st == OCK_RPC_OK => {
            d.run(st);
            OCK_RPC_OK
        }
        _ => st,
    }
}

/// `OckRpcClientCallRndv`.
///
/// # Safety
/// Pointers NULL or valid as the header says.
#[no_mangle]
pub unsafe extern "C" fn OckRpcClientCallRndv(
    h: Handle,
    msg_id: u16,
    request: *mut OckRpcMessageInfo,
    response: *mut OckRpcMessage,
    done: *mut OckRpcCallDone,
) -> OckRpcStatus {
    guard("OckRpcClientCallRndv", OCK_RPC_ERR, || {
        if request.is_null() {
            crate::log!(ERROR, "OckRpcClientCallRndv: request is NULL");
            return OCK_RPC_ERR_INVALID_PARAM;
        }
        // SAFETY: checked non-NULL; the caller's struct.
        let info = unsafe { *request };
        rndv("OckRpcClientCallRndv", h, msg_id, &[info], response, done)
    })
}

/// `OckRpcClientCallRndvIov`.
///
/// # Safety
/// Pointers NULL or valid as the header says.
#[no_mangle]
pub unsafe extern "C" fn OckRpcClientCallRndvIov(
    h: Handle,
    msg_id: u16,
    request: *mut OckRpcMessageInfoIov,
    response: *mut OckRpcMessage,
    done: *mut OckRpcCallDone,
) -> OckRpcStatus {
    guard("OckRpcClientCallRndvIov", OCK_RPC_ERR, || {
        if request.is_null() {
            crate::log!(ERROR, "OckRpcClientCallRndvIov: request is NULL");
            return OCK_RPC_ERR_INVALID_PARAM;
        }
        // SAFETY: checked non-NULL; the caller's struct.
        let iov = unsafe { *request };
        if iov.reqs.is_null() || iov.count == 0 || iov.count > MAX_RNDV_SEGMENTS {
            crate::log!(
                ERROR,
                "OckRpcClientCallRndvIov: {} segments (array {:p}): give 1..={MAX_RNDV_SEGMENTS}",
                iov.count,
                iov.reqs
            );
            return OCK_RPC_ERR_INVALID_PARAM;
        }
        // SAFETY: `reqs` holds `count` infos (the caller's contract).
        let infos = unsafe { std::slice::from_raw_parts(iov.reqs, iov.count) };
        rndv("OckRpcClientCallRndvIov", h, msg_id, infos, response, done)
    })
}
