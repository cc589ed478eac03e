//! Client calls: `OckRpcClientCall`, `...WithParam`, `...Rndv`, `...RndvIov`.
//!
//! - No response target: a one-way send (`EARLY_RSP`): synchronous calls return after the local
//!   send completion; with `done`, it runs on that completion.
//! - One target `{NULL, 0}`: the library mallocs the response; the caller frees it with free().
//! - Otherwise the caller's buffers receive the response in order and each `len` is set to
//!   what it got; a response larger than the buffers is an error (nothing is overrun).
//! - With `done`, the call returns at once and `done` runs exactly once on the thread that
//!   completes the call (the client worker), unless the call itself fails (then never).
//!
//! A synchronous call with caller buffers allocates nothing in steady state: the response lands
//! in a per-thread scratch vector that is reused.

use crate::client::ClientObj;
use crate::regions::RegionEntry;
use crate::server::{function_id, oneway_function_id, status_of};
use crate::types::*;
use bypass::backend::Nic;
use bypass::{CallMode, CallOptions, Channel, LocalRange};
use std::cell::RefCell;
use std::ffi::c_void;
use std::sync::Arc;

/// Where a response goes.
#[derive(Debug, Clone, Copy)]
pub enum Target {
    /// No response (one-way).
    None,
    /// `count` caller messages (one `{NULL, 0}`: malloc it).
    Iov(*mut OckRpcMessage, usize),
}

// SAFETY: the pointers are the caller's, which must keep them valid until `done` runs (the
// header's contract); they are only written on one thread, once.
unsafe impl Send for Target {}

/// The completion callback, movable to the completing thread.
#[derive(Debug, Clone, Copy)]
pub struct Done(pub OckRpcCallDone);
// SAFETY: `arg` is the caller's, passed back untouched; the header lets `done` run on any thread.
unsafe impl Send for Done {}

impl Done {
    /// Runs it with `st`.
    pub fn run(self, st: OckRpcStatus) {
        if let Some(cb) = self.0.cb {
            // SAFETY: the caller's callback with its own argument.
            unsafe { cb(st, self.0.arg) };
        }
    }
}

impl Target {
    fn wants_response(&self) -> bool {
        matches!(self, Target::Iov(_, n) if *n > 0)
    }

    /// Bytes the caller's buffers hold (0 for malloc or none).
    fn capacity(&self) -> usize {
        match *self {
            Target::Iov(m, n) if n > 0 => {
                // SAFETY: `m` holds `n` messages (checked non-NULL by the caller of this module).
                let msgs = unsafe { std::slice::from_raw_parts(m, n) };
                if n == 1 && msgs[0].data.is_null() {
                    0
                } else {
                    msgs.iter().map(|m| m.len).sum()
                }
            }
            _ => 0,
        }
    }

    /// Puts `bytes` where the caller wants them.
    fn deliver(self, bytes: &[u8]) -> OckRpcStatus {
        let Target::Iov(m, n) = self else { return OCK_RPC_OK };
        if n == 0 {
            return OCK_RPC_OK;
        }
        // SAFETY: `m` holds `n` messages, valid until completion (the caller's contract).
        let msgs = unsafe { std::slice::from_raw_parts_mut(m, n) };
        if n == 1 && msgs[0].data.is_null() {
            // SAFETY: plain malloc; the caller frees it with free().
            let p = unsafe { libc::malloc(bytes.len().max(1)) } as *mut u8;
            if p.is_null() {
                return OCK_RPC_ERR_NO_MEMORY;
            }
            // SAFETY: `p` has room for `bytes`.
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), p, bytes.len()) };
            msgs[0] = OckRpcMessage { data: p as *mut c_void, len: bytes.len() };
            return OCK_RPC_OK;
        }
        let cap: usize = msgs.iter().map(|m| m.len).sum();
        if bytes.len() > cap {
            crate::log!(
                crate::log::ERROR,
                "the response has {} bytes but the response buffers hold {cap}: give a larger buffer (or data = NULL \
                 to have the library allocate it)",
                bytes.len()
            );
            return OCK_RPC_ERR_INVALID_PARAM;
        }
        let mut rest = bytes;
        for m in msgs.iter_mut() {
            let k = rest.len().min(m.len);
            if k > 0 {
                // SAFETY: the caller's buffer of `m.len >= k` bytes.
                unsafe { std::ptr::copy_nonoverlapping(rest.as_ptr(), m.data as *mut u8, k) };
            }
            m.len = k;
            rest = &rest[k..];
        }
        OCK_RPC_OK
    }
}

thread_local! {
    static RSP: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` with this thread's scratch vector (a fresh one if it is in use further up).
fn with_scratch<R>(f: impl FnOnce(&mut Vec<u8>) -> R) -> R {
    RSP.with(|cell| match cell.try_borrow_mut() {
        Ok(mut v) => f(&mut v),
        Err(_) => f(&mut Vec::new()),
    })
}

fn options(c: &ClientObj, target: &Target) -> CallOptions {
    CallOptions {
        mode: if target.wants_response() { CallMode::WaitRsp } else { CallMode::EarlyRsp },
        timeout: Some(c.timeout()),
        max_response: target.capacity(),
        ..CallOptions::default()
    }
}

/// The options and function of a call of `id` with `len` bytes on `ch`, whose server's segment
/// is `segsize`: a one-way message larger than the eager segment travels as a call to the
/// one-way function (the server answers it empty, which frees the rendezvous memory); a
/// response the library mallocs may be as large as a segment, so a segment above the eager
/// size names a response buffer of that size.
fn plan<D: Nic>(
    ch: &Channel<D>,
    c: &ClientObj,
    id: u16,
    len: usize,
    target: &Target,
) -> (CallOptions, bypass::FunctionId) {
    let mut opts = options(c, target);
    let segsize = c.server().map_or(0, |s| s.settings.segsize);
    if !target.wants_response() && len > ch.max_request_args() {
        opts.mode = CallMode::WaitRsp;
        return (opts, oneway_function_id(id));
    }
    if target.wants_response() && opts.max_response == 0 && segsize > ch.max_request_args() {
        opts.max_response = segsize;
    }
    (opts, function_id(id, false))
}

/// A call of `id` with `args`.
pub fn call(c: &ClientObj, id: u16, args: &[u8], target: Target, done: Option<Done>) -> OckRpcStatus {
    let Some(ch) = c.channel() else {
        crate::log!(
            crate::log::ERROR,
            "OckRpcClientCall: the handle is a server-side connection, not a client channel"
        );
        return OCK_RPC_ERR_INVALID_PARAM;
    };
    bypass::match_any!(ch, ch => call_on(ch, c, id, args, target, done))
}

fn call_on<D: Nic>(
    ch: &Channel<D>,
    c: &ClientObj,
    id: u16,
    args: &[u8],
    target: Target,
    done: Option<Done>,
) -> OckRpcStatus {
    let (opts, f) = plan(ch, c, id, args.len(), &target);
    match done {
        None => with_scratch(|rsp| match ch.call_with(&opts, f, args, rsp) {
            Ok(_) => target.deliver(rsp),
            Err(e) => {
                crate::log!(crate::log::DEBUG, "call of id {id} failed: {e}");
                status_of(&e)
            }
        }),
        Some(done) => {
            let r = ch.call_callback(&opts, f, args, move |res| {
                let st = match res {
                    Ok(bytes) => target.deliver(bytes),
                    Err(e) => status_of(&e),
                };
                done.run(st);
            });
            match r {
                Ok(()) => OCK_RPC_OK,
                Err(e) => {
                    crate::log!(crate::log::DEBUG, "async call of id {id} failed to start: {e}");
                    status_of(&e)
                }
            }
        }
    }
}

/// A rendezvous call: the server READs `segments` (registered memory) itself.
pub fn call_rndv(
    c: &ClientObj,
    id: u16,
    segments: &[(Arc<RegionEntry>, usize, usize)],
    target: Target,
) -> OckRpcStatus {
    let Some(ch) = c.channel() else {
        crate::log!(crate::log::ERROR, "OckRpcClientCallRndv: the handle is a server-side connection");
        return OCK_RPC_ERR_INVALID_PARAM;
    };
    bypass::match_any!(ch, ch => rndv_on(ch, c, id, segments, target))
}

fn rndv_on<D: Nic>(
    ch: &Channel<D>,
    c: &ClientObj,
    id: u16,
    segments: &[(Arc<RegionEntry>, usize, usize)],
    target: Target,
) -> OckRpcStatus {
    let mut regions = Vec::with_capacity(segments.len());
    for (e, off, len) in segments {
        match e.region.get::<D>() {
            Some(r) => regions.push((r, *off, *len)),
            None => return OCK_RPC_ERR_INVALID_PARAM,
        }
    }
    let ranges: Vec<LocalRange<'_, D::Region>> =
        regions.iter().map(|(r, o, l)| LocalRange::new(r, *o, *l)).collect();
    let mut opts = options(c, &target);
    opts.mode = CallMode::WaitRsp;
    let f = function_id(id, true);
    with_scratch(|rsp| match ch.call_segments_with(&opts, f, &ranges, rsp) {
        Ok(_) => target.deliver(rsp),
        Err(e) => {
            crate::log!(crate::log::DEBUG, "rendezvous call of id {id} failed: {e}");
            status_of(&e)
        }
    })
}
