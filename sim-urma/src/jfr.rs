//! Receive queues (JFR). A jetty shares one (UB devices require it). A JFR is in one of two modes,
//! fixed by its first use ([`JfrMode`]):
//!
//! - **shared** (the hardware's JFR; first use `urma_post_jfr_wr`, or a first jetty whose
//!   `shared.jfc` is NULL or another JFC than the JFR's): the JFR is a sim shared receive ring
//!   ([`SimSharedRecv`]) every jetty on it is created on, and receives posted to the JFR or
//!   through any of its jettys serve all of them in posting order, as on UDMA
//!   (`udma_u_post_jetty_recv_wr` posts to the JFR). A failing jetty flushes none of them; the
//!   JFR's own state machine does (`urma_modify_jfr` to ERROR).
//! - **per jetty** (a first jetty naming the JFR's own JFC explicitly in `shared.jfc`): receives
//!   posted through a jetty go to that jetty's sim receive ring, and receives posted before any
//!   jetty on the JFR is bound wait here and go to the first jetty that binds. Exact for one jetty
//!   per JFR, whose receives then flush with the jetty: what bypass's plain queues rely on.

use crate::context::{ctx_of, Ctx};
use crate::ffi::{self, inval, Res};
use crate::handle_cache;
use crate::jfc::{jfc_of, Jfc};
use crate::post::{self, Tr, CHUNK};
use crate::registry::{self, Kind};
use bypass_hal::{Device as _, RecvWr, Sge, SharedRecv as _};
use bypass_sim::SimSharedRecv;
use bypass_urma_abi as abi;
use bypass_urma_abi::consts::*;
use bypass_urma_abi::status::*;
use std::cell::UnsafeCell;
use std::sync::atomic::Ordering;
use std::sync::MutexGuard;
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
    pub mode: Mutex<JfrMode>,
    /// `urma_jfr_state_t` and rx_threshold, as `urma_modify_jfr` left them.
    pub state: Mutex<(u32, u32)>,
}

/// How a JFR's receives reach its jettys (see the module docs).
pub(crate) enum JfrMode {
    /// No jetty and no `urma_post_jfr_wr` yet.
    Undecided,
    /// Each jetty has its own sim receive ring.
    PerJetty,
    /// One sim shared receive ring under every jetty of the JFR, and the WR translation buffer.
    Shared(SimSharedRecv, Box<[Tr; CHUNK]>),
}

impl Jfr {
    pub(crate) fn state(&self) -> MutexGuard<'_, (u32, u32)> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `Ok` while the JFR takes receives (READY); what to do otherwise.
    pub(crate) fn check_ready(&self) -> Res<()> {
        match self.state().0 {
            URMA_JFR_STATE_READY => Ok(()),
            s => Err(inval(format!(
                "the JFR is in state {s} (RESET 0, ERROR 2), not READY: urma_modify_jfr it ERROR -> RESET -> READY first"
            ))),
        }
    }

    /// ERROR: every receive the JFR still holds (not yet taken by a jetty) completes with
    /// `URMA_CR_WR_FLUSH_ERR` on the JFR's JFC, oldest first; a waiter on that JFC is woken.
    fn flush(&self) -> Res<()> {
        let mut ids: Vec<u64> = std::mem::take(&mut *self.pending.lock().unwrap_or_else(|e| e.into_inner()))
            .into_iter()
            .map(|r| r.user_ctx)
            .collect();
        match &mut *self.mode() {
            JfrMode::Shared(ring, _) => ids.extend(ring.take_posted()),
            JfrMode::PerJetty => return Err(inval(
                "this JFR keeps its receives per jetty in the simulator (its first jetty named the JFR's \
                     own JFC in shared.jfc): they flush with their jetty (urma_modify_jetty ERROR); leave \
                     shared.jfc NULL to get a JFR whose state machine flushes its receives",
            )),
            JfrMode::Undecided => {}
        }
        // SAFETY: read-only after publication.
        let local = unsafe { (*self.c.get()).jfr_id.id };
        let mut g = self.jfc.lock();
        for id in ids {
            // SAFETY: plain C data.
            let mut cr: abi::UrmaCr = unsafe { ffi::zeroed() };
            cr.status = URMA_CR_WR_FLUSH_ERR;
            cr.user_ctx = id;
            cr.opcode = URMA_CR_OPC_SEND;
            cr.flag = CR_FLAG_S_R;
            cr.local_id = local;
            g.stash.push_back(cr);
        }
        g.cq.fire_if_armed();
        Ok(())
    }

    pub(crate) fn mode(&self) -> MutexGuard<'_, JfrMode> {
        self.mode.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes an undecided JFR shared: creates the ring and moves the receives waiting here into
    /// it. A JFR already decided is left as it is.
    pub(crate) fn make_shared(&self, m: &mut JfrMode) -> Res<()> {
        if !matches!(m, JfrMode::Undecided) {
            return Ok(());
        }
        let mut ring = self.ctx.nic().create_shared_recv(self.depth, self.max_sge)?;
        let pending = std::mem::take(&mut *self.pending.lock().unwrap_or_else(|e| e.into_inner()));
        for r in &pending {
            ring.post_recv(&[RecvWr { wr_id: r.user_ctx, sges: &r.sges }])?;
        }
        *m = JfrMode::Shared(ring, Box::new([post::EMPTY; CHUNK]));
        Ok(())
    }
}

// SAFETY: the C struct is written before publication and read-only after.
unsafe impl Send for Jfr {}
// SAFETY: as above.
unsafe impl Sync for Jfr {}

thread_local! {
    static JFRS: handle_cache::ObjCache<Jfr> = const { std::cell::RefCell::new(handle_cache::Cache::new()) };
}

/// The live JFR at `p` (`urma_post_jfr_wr`'s lookup: the thread's cache, then the registry).
pub(crate) fn jfr_of(p: *const abi::UrmaJfr) -> Res<Arc<Jfr>> {
    handle_cache::object(&JFRS, Kind::Jfr, p)
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
        if !matches!(cfg.trans_mode, URMA_TM_RM | URMA_TM_RC | URMA_TM_UM) {
            return Err(inval(format!(
                "JFR trans_mode {}: a JFR is RM (1), RC (2) or UM (4)",
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
            mode: Mutex::new(JfrMode::Undecided),
            state: Mutex::new((URMA_JFR_STATE_READY, 0)),
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

/// `urma_modify_jfr`: `JFR_RX_THRESHOLD` (at most the depth; the simulated device raises no
/// limit event) and `JFR_STATE`, along READY -> ERROR -> RESET -> READY (a state to itself is a
/// no-op). ERROR flushes the receives the JFR holds as `URMA_CR_WR_FLUSH_ERR` records on its JFC;
/// posting is refused until it is READY again.
#[no_mangle]
pub unsafe extern "C" fn urma_modify_jfr(jfr: *mut abi::UrmaJfr, attr: *mut abi::UrmaJfrAttr) -> UrmaStatus {
    ffi::status("urma_modify_jfr", || {
        let r = jfr_of(jfr)?;
        // SAFETY: a non-NULL attr points to a jfr attr (the API's contract).
        let a = unsafe { ffi::read_in(attr, "attr")? };
        let known = JFR_RX_THRESHOLD | JFR_STATE;
        if a.mask & known == 0 || a.mask & !known != 0 {
            return Err(inval(format!(
                "attr.mask {:#x}: set JFR_RX_THRESHOLD (1) and/or JFR_STATE (2), nothing else",
                a.mask
            )));
        }
        if a.mask & JFR_RX_THRESHOLD != 0 && a.rx_threshold > r.depth {
            return Err(inval(format!(
                "rx_threshold {} exceeds the JFR's depth {}",
                a.rx_threshold, r.depth
            )));
        }
        let mut st = r.state();
        if a.mask & JFR_STATE != 0 && a.state != st.0 {
            let ok = matches!(
                (st.0, a.state),
                (URMA_JFR_STATE_READY, URMA_JFR_STATE_ERROR)
                    | (URMA_JFR_STATE_ERROR, URMA_JFR_STATE_RESET)
                    | (URMA_JFR_STATE_RESET, URMA_JFR_STATE_READY)
            );
            if !ok {
                return Err(inval(format!(
                    "JFR state {} -> {}: a JFR goes READY (1) -> ERROR (2) -> RESET (0) -> READY",
                    st.0, a.state
                )));
            }
            if a.state == URMA_JFR_STATE_ERROR {
                r.flush()?;
            }
            st.0 = a.state;
        }
        if a.mask & JFR_RX_THRESHOLD != 0 {
            st.1 = a.rx_threshold;
        }
        Ok(())
    })
}

/// `urma_query_jfr`: the configuration it was created with, its state and rx threshold.
#[no_mangle]
pub unsafe extern "C" fn urma_query_jfr(
    jfr: *mut abi::UrmaJfr,
    cfg: *mut abi::UrmaJfrCfg,
    attr: *mut abi::UrmaJfrAttr,
) -> UrmaStatus {
    ffi::status("urma_query_jfr", || {
        let r = jfr_of(jfr)?;
        if cfg.is_null() || attr.is_null() {
            return Err(inval("cfg or attr is NULL"));
        }
        let (state, rx_threshold) = *r.state();
        // SAFETY: both non-NULL and writable per the API; the JFR's cfg is read-only after
        // publication.
        unsafe {
            cfg.write_unaligned((*r.c.get()).jfr_cfg);
            attr.write_unaligned(abi::UrmaJfrAttr {
                mask: JFR_STATE | JFR_RX_THRESHOLD,
                rx_threshold,
                state,
            });
        }
        Ok(())
    })
}
