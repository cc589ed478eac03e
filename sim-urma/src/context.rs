//! Contexts (`urma_create_context`), their asynchronous events, and token ids.

use crate::ffi::{self, inval, Res};
use crate::registry::{self, Kind};
use crate::runtime::{dev_of, Dev};
use bypass_hal::{AsyncEvent, Device as _};
use bypass_sim::SimNic;
use bypass_urma_abi as abi;
use bypass_urma_abi::status::*;
use std::cell::UnsafeCell;
use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, RwLock};

/// What a completion record needs to say about the jetty of a sim queue.
#[derive(Debug, Clone)]
pub(crate) struct JettyIds {
    /// The jetty's handle (`urma_jetty_t *`) for async events.
    pub handle: usize,
    /// The jetty's id (`cr.local_id`).
    pub local_id: u32,
    /// The bound target (`cr.remote_id`); zero while unbound.
    pub remote: abi::UrmaJettyId,
    /// Set when a poller hands out an error record of the jetty: the sim queue enters ERROR
    /// right after writing it, and the jetty reports ERROR from then on, never READY in between.
    pub errored: Arc<std::sync::atomic::AtomicBool>,
}

/// An opened device (`urma_context_t` first).
#[repr(C)]
pub(crate) struct Ctx {
    pub c: UnsafeCell<abi::UrmaContext>,
    pub dev: Arc<Dev>,
    pub eid: [u8; 16],
    pub uasid: u32,
    /// Jetties by sim queue number.
    pub jetties: RwLock<HashMap<u32, JettyIds>>,
    /// Bumped on every change of `jetties`, so JFCs know their cached copies are stale.
    pub epoch: AtomicU32,
    /// Jetty generations (see `ident::jetty_id`).
    pub next_gen: AtomicU32,
    /// Ids of JFCs, JFRs and token ids.
    pub next_id: AtomicU32,
}

// SAFETY: the C struct is written before the handle is published and only read after; the rest
// is Send + Sync.
unsafe impl Send for Ctx {}
// SAFETY: as above.
unsafe impl Sync for Ctx {}

impl Ctx {
    pub(crate) fn nic(&self) -> &SimNic {
        &self.dev.nic
    }

    pub(crate) fn ptr(&self) -> *mut abi::UrmaContext {
        self.c.get()
    }

    pub(crate) fn eid(&self) -> abi::UrmaEid {
        abi::UrmaEid { raw: self.eid }
    }

    /// The id of this context's object named `id`.
    pub(crate) fn id_of(&self, id: u32) -> abi::UrmaJettyId {
        abi::UrmaJettyId { eid: self.eid(), uasid: self.uasid, id }
    }

    pub(crate) fn set_jetty(&self, qpn: u32, ids: Option<JettyIds>) {
        let mut m = self.jetties.write().unwrap_or_else(|e| e.into_inner());
        match ids {
            Some(i) => m.insert(qpn, i),
            None => m.remove(&qpn),
        };
        self.epoch.fetch_add(1, Ordering::Release);
    }

    pub(crate) fn jetty(&self, qpn: u32) -> Option<JettyIds> {
        self.jetties.read().unwrap_or_else(|e| e.into_inner()).get(&qpn).cloned()
    }
}

/// The live context at `p`.
pub(crate) fn ctx_of(p: *const abi::UrmaContext) -> Res<Arc<Ctx>> {
    registry::get::<Ctx, _>(Kind::Context, p).ok_or_else(|| {
        inval(format!("{p:p} is not a live context of this library (NULL, unknown or deleted)"))
    })
}

/// `urma_create_context`.
#[no_mangle]
pub unsafe extern "C" fn urma_create_context(
    dev: *mut abi::UrmaDevice,
    eid_index: u32,
) -> *mut abi::UrmaContext {
    ffi::pointer("urma_create_context", || {
        let d = dev_of(dev)?;
        if eid_index != 0 {
            return Err(inval(format!(
                "EID index {eid_index}: a simulated device has one EID, index 0 (see urma_get_eid_list)"
            )));
        }
        // SAFETY: plain C data.
        let mut c: abi::UrmaContext = unsafe { ffi::zeroed() };
        c.dev = d.ptr();
        c.dev_fd = -1;
        c.async_fd = d.nic.async_event_fd().map_or(-1, |f| f.as_raw_fd());
        c.eid = abi::UrmaEid { raw: d.eid };
        c.eid_index = 0;
        c.uasid = d.uasid;
        c.ref_ = 1;
        let ctx = Arc::new(Ctx {
            c: UnsafeCell::new(c),
            eid: d.eid,
            uasid: d.uasid,
            dev: d,
            jetties: RwLock::new(HashMap::new()),
            epoch: AtomicU32::new(0),
            next_gen: AtomicU32::new(1),
            next_id: AtomicU32::new(1),
        });
        Ok(registry::insert(Kind::Context, ctx).cast())
    })
}

/// `urma_delete_context`. Objects created on it stay usable until deleted themselves.
#[no_mangle]
pub unsafe extern "C" fn urma_delete_context(ctx: *mut abi::UrmaContext) -> UrmaStatus {
    ffi::status("urma_delete_context", || {
        registry::remove::<Ctx, _>(Kind::Context, ctx)
            .map(drop)
            .ok_or_else(|| inval(format!("{ctx:p} is not a live context")))
    })
}

/// `urma_get_async_event`: blocks until the device reports one (poll `ctx->async_fd` first to
/// wait with a timeout).
#[no_mangle]
pub unsafe extern "C" fn urma_get_async_event(
    ctx: *mut abi::UrmaContext,
    event: *mut abi::UrmaAsyncEvent,
) -> UrmaStatus {
    ffi::status("urma_get_async_event", || {
        let c = ctx_of(ctx)?;
        if event.is_null() {
            return Err(inval("event is NULL"));
        }
        loop {
            if let Some(ev) = c.nic().poll_async_event()? {
                if let Some(out) = translate(&c, &ev) {
                    // SAFETY: non-NULL, writable per the API.
                    unsafe { event.write_unaligned(out) };
                    return Ok(());
                }
                continue;
            }
            // Nothing yet: let an Inline-engine device run (its timers fire from here too), then
            // sleep on the async fd for a while.
            c.nic().progress();
            if let Some(fd) = c.nic().async_event_fd() {
                let mut p = libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
                // SAFETY: one valid pollfd for the duration of the call.
                unsafe { libc::poll(&mut p, 1, 50) };
            }
        }
    })
}

fn translate(c: &Arc<Ctx>, ev: &AsyncEvent) -> Option<abi::UrmaAsyncEvent> {
    use abi::consts::*;
    // SAFETY: plain C data.
    let mut out: abi::UrmaAsyncEvent = unsafe { ffi::zeroed() };
    out.urma_ctx = c.ptr();
    match *ev {
        AsyncEvent::QueueFatal { qpn }
        | AsyncEvent::QueueAccessError { qpn }
        | AsyncEvent::QueueRequestError { qpn } => {
            let j = c.jetty(qpn)?;
            out.event_type = URMA_EVENT_JETTY_ERR;
            out.element.jetty = j.handle as *mut abi::UrmaJetty;
        }
        AsyncEvent::CqError => out.event_type = URMA_EVENT_JFC_ERR,
        AsyncEvent::PortActive { port } => {
            out.event_type = URMA_EVENT_PORT_ACTIVE;
            out.element.port_id = u32::from(port);
        }
        AsyncEvent::PortDown { port } => {
            out.event_type = URMA_EVENT_PORT_DOWN;
            out.element.port_id = u32::from(port);
        }
        AsyncEvent::DeviceFatal => out.event_type = URMA_EVENT_DEV_FATAL,
        // LAST_WQE_REACHED and codes this version does not name have no URMA event.
        _ => return None,
    }
    Some(out)
}

/// `urma_ack_async_event`: counts the event on its jetty (`async_events_acked`).
#[no_mangle]
pub unsafe extern "C" fn urma_ack_async_event(event: *mut abi::UrmaAsyncEvent) {
    ffi::unit("urma_ack_async_event", || {
        // SAFETY: a non-NULL event is one the caller got from urma_get_async_event.
        let ev = unsafe { ffi::read_in(event, "event")? };
        if ev.event_type == abi::consts::URMA_EVENT_JETTY_ERR {
            // SAFETY: the jetty arm is the one written for JETTY_ERR; reading a pointer-sized
            // union field is reading plain bytes.
            let j = unsafe { ev.element.jetty };
            if let Some(jetty) = registry::get::<crate::jetty::Jetty, _>(Kind::Jetty, j) {
                jetty.ack_async_event();
            }
        }
        Ok(())
    })
}

/// A token id (`urma_token_id_t` first).
#[repr(C)]
pub(crate) struct TokenId {
    pub c: UnsafeCell<abi::UrmaTokenId>,
    pub _ctx: Arc<Ctx>,
}

// SAFETY: written before publication, read-only after.
unsafe impl Send for TokenId {}
// SAFETY: as above.
unsafe impl Sync for TokenId {}

/// `urma_alloc_token_id`. Accepted for bookkeeping; a segment's public `token_id` is always the
/// one `urma_register_seg` derives (see `ident`).
#[no_mangle]
pub unsafe extern "C" fn urma_alloc_token_id(ctx: *mut abi::UrmaContext) -> *mut abi::UrmaTokenId {
    ffi::pointer("urma_alloc_token_id", || {
        let c = ctx_of(ctx)?;
        // SAFETY: plain C data.
        let mut t: abi::UrmaTokenId = unsafe { ffi::zeroed() };
        t.urma_ctx = c.ptr();
        t.token_id = c.next_id.fetch_add(1, Ordering::Relaxed);
        let obj = Arc::new(TokenId { c: UnsafeCell::new(t), _ctx: c });
        Ok(registry::insert(Kind::TokenId, obj).cast())
    })
}

/// `urma_free_token_id`.
#[no_mangle]
pub unsafe extern "C" fn urma_free_token_id(token_id: *mut abi::UrmaTokenId) -> UrmaStatus {
    ffi::status("urma_free_token_id", || {
        registry::remove::<TokenId, _>(Kind::TokenId, token_id)
            .map(drop)
            .ok_or_else(|| inval(format!("{token_id:p} is not a live token id")))
    })
}
