//! Receive queues (JFR). A jetty shares one (UB devices require it); receives posted through a
//! jetty go to that jetty's sim receive ring, and receives posted before any jetty on the JFR is
//! bound wait here and go to the first jetty that binds.

use crate::context::{ctx_of, Ctx};
use crate::ffi::{self, inval, Res};
use crate::jfc::{jfc_of, Jfc};
use crate::registry::{self, Kind};
use bypass_hal::{Device as _, Sge};
use bypass_urma_abi as abi;
use bypass_urma_abi::consts::*;
use bypass_urma_abi::status::*;
use std::cell::UnsafeCell;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

/// A receive posted before its jetty was bound.
#[derive(Debug)]
pub(crate) struct PendingRecv {
    pub user_ctx: u64,
    pub sges: Vec<Sge>,
}

/// A JFR (`urma_jfr_t` first).
#[repr(C)]
pub(crate) struct Jfr {
    pub c: UnsafeCell<abi::UrmaJfr>,
    pub ctx: Arc<Ctx>,
    pub jfc: Arc<Jfc>,
    pub depth: u32,
    pub max_sge: u32,
    pub min_rnr_timer: u8,
    pub pending: Mutex<Vec<PendingRecv>>,
}

// SAFETY: the C struct is written before publication and read-only after.
unsafe impl Send for Jfr {}
// SAFETY: as above.
unsafe impl Sync for Jfr {}

pub(crate) fn jfr_of(p: *const abi::UrmaJfr) -> Res<Arc<Jfr>> {
    registry::get::<Jfr, _>(Kind::Jfr, p)
        .ok_or_else(|| inval(format!("{p:p} is not a live JFR of this library (NULL, unknown or deleted)")))
}

/// `urma_create_jfr`: depth 1..=`max_jfr_depth`, RC, `max_sge` up to `max_jfr_sge`.
#[no_mangle]
pub unsafe extern "C" fn urma_create_jfr(
    ctx: *mut abi::UrmaContext,
    jfr_cfg: *mut abi::UrmaJfrCfg,
) -> *mut abi::UrmaJfr {
    ffi::pointer("urma_create_jfr", || {
        let c = ctx_of(ctx)?;
        // SAFETY: a non-NULL cfg points to a jfr_cfg (the API's contract).
        let cfg = unsafe { ffi::read_in(jfr_cfg, "jfr_cfg")? };
        let caps = c.nic().caps();
        if cfg.depth == 0 || cfg.depth > caps.max_queue_depth {
            return Err(inval(format!(
                "JFR depth {} is outside 1..={} (dev_cap.max_jfr_depth)",
                cfg.depth, caps.max_queue_depth
            )));
        }
        if cfg.trans_mode != URMA_TM_RC {
            return Err(inval(format!(
                "JFR trans_mode {}: the simulator models RC (2) only",
                cfg.trans_mode
            )));
        }
        let max_sge = u32::from(cfg.max_sge.max(1));
        if max_sge > caps.max_recv_sge {
            return Err(inval(format!(
                "JFR max_sge {max_sge} exceeds dev_cap.max_jfr_sge {}",
                caps.max_recv_sge
            )));
        }
        if cfg.min_rnr_timer > 31 {
            return Err(inval(format!("min_rnr_timer {} is outside 0..=31", cfg.min_rnr_timer)));
        }
        let jfc = jfc_of(cfg.jfc)?;
        if !Arc::ptr_eq(&jfc.ctx, &c) {
            return Err(inval("the JFR's JFC belongs to another context"));
        }
        // SAFETY: plain C data.
        let mut pc: abi::UrmaJfr = unsafe { ffi::zeroed() };
        pc.urma_ctx = c.ptr();
        pc.jfr_id = c.id_of(c.next_id.fetch_add(1, Ordering::Relaxed));
        pc.jfr_cfg = cfg;
        let obj = Arc::new(Jfr {
            c: UnsafeCell::new(pc),
            ctx: c,
            jfc,
            depth: cfg.depth,
            max_sge,
            min_rnr_timer: cfg.min_rnr_timer,
            pending: Mutex::new(Vec::new()),
        });
        Ok(registry::insert(Kind::Jfr, obj).cast())
    })
}

/// `urma_delete_jfr`.
#[no_mangle]
pub unsafe extern "C" fn urma_delete_jfr(jfr: *mut abi::UrmaJfr) -> UrmaStatus {
    ffi::status("urma_delete_jfr", || {
        registry::remove::<Jfr, _>(Kind::Jfr, jfr)
            .map(drop)
            .ok_or_else(|| inval(format!("{jfr:p} is not a live JFR")))
    })
}
