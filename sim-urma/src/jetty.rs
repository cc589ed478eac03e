//! Jetties (RC or UM, on a shared JFR): creation, import of a peer's jetty, bind/unbind (the sim
//! queue's connect; UM jetties bind to no one), state changes, query and flush. The data path is
//! in `post`; who sent a UM datagram, in `um`.

use crate::context::{ctx_of, Ctx, JettyIds};
use crate::ffi::{self, fail, inval, Res};
use crate::handle_cache;
use crate::ident;
use crate::jfc::{jfc_of, Jfc};
use crate::jfr::{jfr_of, Jfr, JfrMode};
use crate::registry::{self, Kind};
use crate::runtime::{alloc_list, free_list};
use bypass_hal::{AckTimeout, Device as _, Queue, QueueConfig, QueueInfo, QueueState, RecvWr, RnrTimer};
use bypass_sim::SimQueue;
use bypass_urma_abi as abi;
use bypass_urma_abi::consts::*;
use bypass_urma_abi::status::*;
use std::cell::UnsafeCell;
use std::ffi::c_int;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};

/// A jetty (`urma_jetty_t` first).
#[repr(C)]
pub(crate) struct Jetty {
    pub c: UnsafeCell<abi::UrmaJetty>,
    pub ctx: Arc<Ctx>,
    pub jfr: Arc<Jfr>,
    pub jfc: Arc<Jfc>,
    pub id: u32,
    pub qpn: u32,
    pub psn: u32,
    pub order: u32,
    pub max_sge: u32,
    /// `URMA_TM_RC`, `URMA_TM_RM` (a sim reliable datagram queue) or `URMA_TM_UM` (a sim
    /// datagram queue).
    pub trans_mode: u32,
    /// See [`JettyIds::errored`].
    pub errored: Arc<std::sync::atomic::AtomicBool>,
    pub inner: Mutex<JettyInner>,
}

// SAFETY: the C struct's mutable fields (`remote_jetty`, `async_events_acked`) are written only
// under `inner`'s lock; the rest is written before publication.
unsafe impl Send for Jetty {}
// SAFETY: as above.
unsafe impl Sync for Jetty {}

/// A jetty's mutable state.
pub(crate) struct JettyInner {
    pub q: SimQueue,
    pub bound: Option<Arc<TargetJetty>>,
    /// The state last asked for with `urma_modify_jetty` (READY after creation).
    pub state: u32,
    /// Where a post translates its work requests (allocated once, not per post).
    pub scratch: Box<[crate::post::Tr; crate::post::CHUNK]>,
    /// UM: the targets sent to so far (queue number, GID, port) and their address handles.
    pub dests: Vec<(crate::um::DestKey, bypass_sim::Dest)>,
}

/// An imported jetty (`urma_target_jetty_t` first).
#[repr(C)]
pub(crate) struct TargetJetty {
    pub c: UnsafeCell<abi::UrmaTargetJetty>,
    /// Its queue's description (UM: where its datagrams go).
    pub _ctx: Arc<Ctx>,
    pub peer: QueueInfo,
    pub order: u32,
    pub trans_mode: u32,
}

// SAFETY: written before publication, read-only after.
unsafe impl Send for TargetJetty {}
// SAFETY: as above.
unsafe impl Sync for TargetJetty {}

impl TargetJetty {
    pub(crate) fn ptr(&self) -> *mut abi::UrmaTargetJetty {
        self.c.get()
    }
    pub(crate) fn id(&self) -> abi::UrmaJettyId {
        // SAFETY: read-only after publication.
        unsafe { (*self.c.get()).id }
    }
}

impl Jetty {
    pub(crate) fn lock(&self) -> MutexGuard<'_, JettyInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn handle(&self) -> usize {
        self.c.get() as usize
    }

    pub(crate) fn ack_async_event(&self) {
        let _g = self.lock();
        // SAFETY: the counter is written only under the jetty's lock.
        unsafe { (*self.c.get()).async_events_acked = (*self.c.get()).async_events_acked.wrapping_add(1) };
    }

    /// The state `urma_query_jetty` reports.
    pub(crate) fn state(&self, g: &JettyInner) -> u32 {
        match g.q.state() {
            QueueState::Ready if self.errored.load(Ordering::Acquire) => URMA_JETTY_STATE_ERROR,
            QueueState::Ready => URMA_JETTY_STATE_READY,
            QueueState::Error => URMA_JETTY_STATE_ERROR,
            QueueState::Reset => g.state,
        }
    }

    /// Back to RESET with this jetty's derived PSN, ready to connect again.
    fn reset(&self, g: &mut JettyInner) -> Res<()> {
        g.q.reset()?;
        self.errored.store(false, Ordering::Release);
        g.q.set_initial_psn(self.psn)?;
        Ok(())
    }

    /// Connects the sim queue to the bound peer, then hands it the receives waiting on the JFR.
    fn connect(&self, g: &mut JettyInner, tj: &TargetJetty) -> Res<()> {
        g.q.connect(&tj.peer).map_err(|e| fail(URMA_FAIL, format!("cannot reach the target jetty: {e}")))?;
        self.take_pending(g)
    }

    /// UM: RESET → READY (no peer), then hands it the receives waiting on the JFR.
    fn activate(&self, g: &mut JettyInner) -> Res<()> {
        g.q.activate()?;
        self.take_pending(g)
    }

    fn take_pending(&self, g: &mut JettyInner) -> Res<()> {
        let pending = std::mem::take(&mut *self.jfr.pending.lock().unwrap_or_else(|e| e.into_inner()));
        for r in &pending {
            g.q.post_recv(&[RecvWr { wr_id: r.user_ctx, sges: &r.sges }])?;
        }
        Ok(())
    }
}

thread_local! {
    static JETTIES: handle_cache::ObjCache<Jetty> = const { std::cell::RefCell::new(handle_cache::Cache::new()) };
}

/// The live jetty at `p` (the data path's lookup: the thread's cache, then the registry).
pub(crate) fn jetty_of(p: *const abi::UrmaJetty) -> Res<Arc<Jetty>> {
    handle_cache::object(&JETTIES, Kind::Jetty, p)
        .ok_or_else(|| inval(format!("{p:p} is not a live jetty of this library (NULL, unknown or deleted)")))
}

pub(crate) fn tjetty_of(p: *const abi::UrmaTargetJetty) -> Res<Arc<TargetJetty>> {
    registry::get::<TargetJetty, _>(Kind::TargetJetty, p)
        .ok_or_else(|| inval(format!("{p:p} is not a live target jetty (import it with urma_import_jetty)")))
}

/// RM and UM: the jetty binds to no one, each WR names its target (`wr->tjetty`), and the
/// simulator runs it on a datagram queue (reliable for RM).
pub(crate) fn connectionless(trans_mode: u32) -> bool {
    matches!(trans_mode, URMA_TM_RM | URMA_TM_UM)
}

/// The order type a 0 ("default") becomes, per transport mode, as liburma rewrites it.
fn default_order(trans_mode: u32) -> u32 {
    match trans_mode {
        URMA_TM_RM => URMA_OI,
        URMA_TM_UM => URMA_NO,
        _ => URMA_OL,
    }
}

/// `urma_create_jetty`: RC, `share_jfr = 1`, limits checked against the device's; rewrites
/// `jfs_cfg.flag.order_type` 0 to OL.
#[no_mangle]
pub unsafe extern "C" fn urma_create_jetty(
    ctx: *mut abi::UrmaContext,
    jetty_cfg: *mut abi::UrmaJettyCfg,
) -> *mut abi::UrmaJetty {
    ffi::pointer("urma_create_jetty", || {
        let c = ctx_of(ctx)?;
        // SAFETY: a non-NULL cfg points to a jetty_cfg (the API's contract).
        let mut cfg = unsafe { ffi::read_in(jetty_cfg, "jetty_cfg")? };
        if cfg.flag & JETTY_FLAG_SHARE_JFR == 0 {
            return Err(inval(
                "flag.share_jfr is 0: UB devices (and this one) need a jetty on a shared JFR (shared.jfr)",
            ));
        }
        let jfs = cfg.jfs_cfg;
        let caps = c.nic().caps();
        if !matches!(jfs.trans_mode, URMA_TM_RM | URMA_TM_RC | URMA_TM_UM) {
            return Err(inval(format!(
                "jfs_cfg.trans_mode {}: a jetty is RM (1), RC (2) or UM (4)",
                jfs.trans_mode
            )));
        }
        let um = connectionless(jfs.trans_mode);
        let reliable = jfs.trans_mode == URMA_TM_RM;
        if jfs.depth == 0 || jfs.depth > caps.max_queue_depth {
            return Err(inval(format!(
                "jfs_cfg.depth {} is outside 1..={} (dev_cap.max_jfs_depth)",
                jfs.depth, caps.max_queue_depth
            )));
        }
        let max_sge = u32::from(jfs.max_sge.max(1));
        if max_sge > caps.max_send_sge {
            return Err(inval(format!(
                "jfs_cfg.max_sge {max_sge} exceeds dev_cap.max_jfs_sge {}",
                caps.max_send_sge
            )));
        }
        if jfs.max_inline_data > caps.max_inline {
            return Err(inval(format!(
                "jfs_cfg.max_inline_data {} exceeds dev_cap.max_jfs_inline_len {}",
                jfs.max_inline_data, caps.max_inline
            )));
        }
        if jfs.rnr_retry > 7 || jfs.err_timeout > 31 {
            return Err(inval(format!(
                "rnr_retry {} (0..=7) or err_timeout {} (0..=31) out of range",
                jfs.rnr_retry, jfs.err_timeout
            )));
        }
        let jfc = jfc_of(jfs.jfc)?;
        // SAFETY: share_jfr is set, so the `shared` arm of the union is the one in use; reading
        // two pointers is reading plain bytes.
        let shared = unsafe { cfg.recv.shared };
        let jfr = jfr_of(shared.jfr)?;
        // SAFETY: the JFR's C struct is read-only after publication.
        let jfr_mode = unsafe { (*jfr.c.get()).jfr_cfg.trans_mode };
        if jfr_mode != jfs.trans_mode {
            return Err(inval(format!(
                "the JFR's trans_mode {jfr_mode} differs from jfs_cfg.trans_mode {}: a jetty receives on a JFR of its own mode",
                jfs.trans_mode
            )));
        }
        // The receive JFC: `shared.jfc` if set, else the JFR's.
        let recv_jfc = if shared.jfc.is_null() { jfr.jfc.clone() } else { jfc_of(shared.jfc)? };
        if !Arc::ptr_eq(&jfc.ctx, &c) || !Arc::ptr_eq(&jfr.ctx, &c) || !Arc::ptr_eq(&recv_jfc.ctx, &c) {
            return Err(inval("the jetty's JFC, receive JFC (shared.jfc) or JFR belongs to another context"));
        }
        let mut order = (jfs.flag & JFS_FLAG_ORDER_TYPE_MASK) >> JFS_FLAG_ORDER_TYPE_SHIFT;
        if order == URMA_DEF_ORDER {
            order = default_order(jfs.trans_mode);
            cfg.jfs_cfg.flag = (jfs.flag & !JFS_FLAG_ORDER_TYPE_MASK) | order << JFS_FLAG_ORDER_TYPE_SHIFT;
            // SAFETY: `jetty_cfg` is non-NULL (read above) and the caller's to modify, as
            // liburma modifies it.
            unsafe { std::ptr::addr_of_mut!((*jetty_cfg).jfs_cfg.flag).write_unaligned(cfg.jfs_cfg.flag) };
        }
        let mut qc = QueueConfig::default().with_depths(jfs.depth, jfr.depth);
        qc.max_send_sge = max_sge;
        qc.max_recv_sge = jfr.max_sge;
        qc.max_inline = jfs.max_inline_data;
        qc.rnr_retry = jfs.rnr_retry;
        if jfs.err_timeout != 0 {
            // Raised to the wire's floor (config: hardware timers have a granularity too).
            let t = jfs.err_timeout.max(c.dev.ack_timeout_floor);
            qc.timeout = AckTimeout::from_exponent(t).unwrap_or(qc.timeout);
        }
        if let Some(d) = abi::timers::min_rnr_timer_duration(jfr.min_rnr_timer) {
            // URMA's 2 µs × 2^N as the device's timer (at most 655.36 ms, the longest an RNR
            // NAK can carry).
            qc.min_rnr_timer = RnrTimer::at_least(d);
        }
        let mut q = {
            let mut mode = jfr.mode();
            if matches!(*mode, JfrMode::Undecided) {
                // Per jetty only when asked for by naming the JFR's own JFC explicitly (the
                // simulator's one-jetty-per-JFR form, whose receives flush with the jetty);
                // `shared.jfc` NULL gets the hardware's JFR, shared by all its jettys.
                if !shared.jfc.is_null() && Arc::ptr_eq(&recv_jfc, &jfr.jfc) {
                    *mode = JfrMode::PerJetty;
                } else {
                    jfr.make_shared(&mut mode)?;
                }
            }
            let (a, b) =
                (jfc.lock(), if Arc::ptr_eq(&jfc, &recv_jfc) { None } else { Some(recv_jfc.lock()) });
            let recv_cq = b.as_ref().map_or(&a.cq, |g| &g.cq);
            match &*mode {
                JfrMode::Shared(ring, _) if reliable => {
                    c.nic().create_reliable_datagram_queue(&qc, &a.cq, recv_cq, Some(ring))?
                }
                _ if reliable => c.nic().create_reliable_datagram_queue(&qc, &a.cq, recv_cq, None)?,
                JfrMode::Shared(ring, _) if um => {
                    c.nic().create_datagram_queue(&qc, &a.cq, recv_cq, Some(ring))?
                }
                _ if um => c.nic().create_datagram_queue(&qc, &a.cq, recv_cq, None)?,
                JfrMode::Shared(ring, _) => c.nic().create_queue_on_shared(&qc, &a.cq, recv_cq, ring)?,
                _ => c.nic().create_queue(&qc, &a.cq, recv_cq)?,
            }
        };
        let qpn = q.qpn();
        let id = ident::jetty_id(qpn, c.next_gen.fetch_add(1, Ordering::Relaxed));
        let psn = ident::psn_of(&c.eid, c.uasid, id);
        q.set_initial_psn(psn)?;
        let errored = Arc::new(std::sync::atomic::AtomicBool::new(false));
        // SAFETY: plain C data.
        let mut pc: abi::UrmaJetty = unsafe { ffi::zeroed() };
        pc.urma_ctx = c.ptr();
        pc.jetty_id = c.id_of(id);
        pc.jetty_cfg = cfg;
        pc.handle = u64::from(qpn);
        let obj = Arc::new(Jetty {
            c: UnsafeCell::new(pc),
            ctx: c.clone(),
            jfr,
            jfc,
            id,
            qpn,
            psn,
            order,
            max_sge,
            trans_mode: jfs.trans_mode,
            errored: errored.clone(),
            inner: Mutex::new(JettyInner {
                q,
                bound: None,
                state: URMA_JETTY_STATE_READY,
                scratch: Box::new([crate::post::EMPTY; crate::post::CHUNK]),
                dests: Vec::new(),
            }),
        });
        if um {
            // An RM or UM jetty is READY from creation: it binds to no one.
            obj.activate(&mut obj.lock())?;
        }
        let p = registry::insert(Kind::Jetty, obj);
        c.set_jetty(
            qpn,
            Some(JettyIds { handle: p as usize, local_id: id, remote: Default::default(), errored }),
        );
        Ok(p.cast())
    })
}

/// `urma_delete_jetty`.
#[no_mangle]
pub unsafe extern "C" fn urma_delete_jetty(jetty: *mut abi::UrmaJetty) -> UrmaStatus {
    ffi::status("urma_delete_jetty", || {
        let j = registry::remove::<Jetty, _>(Kind::Jetty, jetty)
            .ok_or_else(|| inval(format!("{jetty:p} is not a live jetty")))?;
        j.ctx.set_jetty(j.qpn, None);
        Ok(())
    })
}

/// `urma_import_jetty`: a peer's jetty from its id; rewrites `rjetty->flag.order_type` 0.
#[no_mangle]
pub unsafe extern "C" fn urma_import_jetty(
    ctx: *mut abi::UrmaContext,
    rjetty: *mut abi::UrmaRjetty,
    token_value: *mut abi::UrmaToken,
) -> *mut abi::UrmaTargetJetty {
    ffi::pointer("urma_import_jetty", || {
        let c = ctx_of(ctx)?;
        // SAFETY: a non-NULL rjetty points to an rjetty (the API's contract).
        let mut rj = unsafe { ffi::read_in(rjetty, "rjetty")? };
        if token_value.is_null() {
            return Err(inval("token_value is NULL"));
        }
        if rj.type_ != URMA_JETTY {
            return Err(inval(format!(
                "rjetty type {}: the simulator imports jetties (URMA_JETTY = 1) only",
                rj.type_
            )));
        }
        let mut order = (rj.flag & IMPORT_JETTY_ORDER_TYPE_MASK) >> IMPORT_JETTY_ORDER_TYPE_SHIFT;
        if order == URMA_DEF_ORDER {
            order = default_order(rj.trans_mode);
            rj.flag = (rj.flag & !IMPORT_JETTY_ORDER_TYPE_MASK) | order << IMPORT_JETTY_ORDER_TYPE_SHIFT;
            // SAFETY: non-NULL (read above); liburma rewrites the caller's rjetty the same way.
            unsafe { std::ptr::addr_of_mut!((*rjetty).flag).write_unaligned(rj.flag) };
        }
        let jid = rj.jetty_id;
        let (gid, lid) = ident::endpoint_of(&jid.eid.raw, jid.uasid).map_err(inval)?;
        let mut peer =
            QueueInfo::new(gid, ident::qpn_of(jid.id), ident::psn_of(&jid.eid.raw, jid.uasid, jid.id));
        peer.lid = lid;
        peer.uasid = jid.uasid;
        match rj.trans_mode {
            URMA_TM_RC => {}
            URMA_TM_RM | URMA_TM_UM => {
                // Its NIC must be known to this device's wire before its datagrams can arrive
                // (docs/sim.md, "Datagram queues"), and its datagrams must say who sent them.
                let source = c
                    .nic()
                    .reach(&peer)
                    .map_err(|e| fail(URMA_FAIL, format!("cannot reach the target jetty's device: {e}")))?;
                c.dev.senders.learn(source, &jid);
            }
            m => return Err(inval(format!("rjetty trans_mode {m}: a jetty is RM (1), RC (2) or UM (4)"))),
        }
        // SAFETY: plain C data.
        let mut t: abi::UrmaTargetJetty = unsafe { ffi::zeroed() };
        t.urma_ctx = c.ptr();
        t.id = jid;
        t.handle = u64::from(jid.id);
        t.trans_mode = rj.trans_mode;
        t.type_ = rj.type_;
        t.flag = rj.flag;
        t.policy = rj.policy;
        t.tp_type = rj.tp_type;
        let obj =
            Arc::new(TargetJetty { c: UnsafeCell::new(t), _ctx: c, peer, order, trans_mode: rj.trans_mode });
        Ok(registry::insert(Kind::TargetJetty, obj).cast())
    })
}

/// `urma_unimport_jetty`.
#[no_mangle]
pub unsafe extern "C" fn urma_unimport_jetty(tjetty: *mut abi::UrmaTargetJetty) -> UrmaStatus {
    ffi::status("urma_unimport_jetty", || {
        registry::remove::<TargetJetty, _>(Kind::TargetJetty, tjetty)
            .map(drop)
            .ok_or_else(|| inval(format!("{tjetty:p} is not a live target jetty")))
    })
}

/// `urma_bind_jetty`: connects the RC jetty to the imported one. `URMA_EEXIST` if bound already,
/// `URMA_ENOPERM` if either side is not RC or the order types differ.
#[no_mangle]
pub unsafe extern "C" fn urma_bind_jetty(
    jetty: *mut abi::UrmaJetty,
    tjetty: *mut abi::UrmaTargetJetty,
) -> UrmaStatus {
    ffi::status("urma_bind_jetty", || {
        let j = jetty_of(jetty)?;
        let tj = tjetty_of(tjetty)?;
        let mut g = j.lock();
        if g.bound.is_some() {
            return Err(fail(URMA_EEXIST, "the jetty is bound already (unbind it first to bind elsewhere)"));
        }
        if connectionless(j.trans_mode) {
            return Err(fail(
                URMA_ENOPERM,
                format!(
                    "an {} jetty binds to no one: name the target in each wr->tjetty (imported with the same trans_mode)",
                    if j.trans_mode == URMA_TM_RM { "RM" } else { "UM" }
                ),
            ));
        }
        if tj.trans_mode != URMA_TM_RC {
            return Err(fail(
                URMA_ENOPERM,
                format!("the target jetty's trans_mode is {}, not RC (2)", tj.trans_mode),
            ));
        }
        if tj.order != j.order {
            return Err(fail(
                URMA_ENOPERM,
                format!("order types differ: jetty {} vs target {}", j.order, tj.order),
            ));
        }
        if g.q.state() != QueueState::Reset {
            j.reset(&mut g)?;
        }
        j.connect(&mut g, &tj)?;
        g.state = URMA_JETTY_STATE_READY;
        // SAFETY: written only under the jetty's lock.
        unsafe { (*j.c.get()).remote_jetty = tj.ptr() };
        j.ctx.set_jetty(
            j.qpn,
            Some(JettyIds {
                handle: j.handle(),
                local_id: j.id,
                remote: tj.id(),
                errored: j.errored.clone(),
            }),
        );
        g.bound = Some(tj);
        Ok(())
    })
}

/// `urma_unbind_jetty`: back to unconnected; outstanding work is dropped (as a RESET does).
#[no_mangle]
pub unsafe extern "C" fn urma_unbind_jetty(jetty: *mut abi::UrmaJetty) -> UrmaStatus {
    ffi::status("urma_unbind_jetty", || {
        let j = jetty_of(jetty)?;
        let mut g = j.lock();
        if g.bound.take().is_none() {
            return Err(inval("the jetty is not bound"));
        }
        j.reset(&mut g)?;
        // SAFETY: written only under the jetty's lock.
        unsafe { (*j.c.get()).remote_jetty = std::ptr::null_mut() };
        j.ctx.set_jetty(
            j.qpn,
            Some(JettyIds {
                handle: j.handle(),
                local_id: j.id,
                remote: Default::default(),
                errored: j.errored.clone(),
            }),
        );
        Ok(())
    })
}

/// `urma_modify_jetty`: JETTY_STATE to ERROR (flush everything outstanding), RESET, or READY
/// (from ERROR or RESET: reset and, if bound, reconnect with the same derived PSNs, so both ends
/// recover together); JETTY_RX_THRESHOLD is accepted and has no effect.
#[no_mangle]
pub unsafe extern "C" fn urma_modify_jetty(
    jetty: *mut abi::UrmaJetty,
    attr: *mut abi::UrmaJettyAttr,
) -> UrmaStatus {
    ffi::status("urma_modify_jetty", || {
        let j = jetty_of(jetty)?;
        // SAFETY: a non-NULL attr points to a jetty attr (the API's contract).
        let a = unsafe { ffi::read_in(attr, "attr")? };
        if a.mask & !(JETTY_STATE | JETTY_RX_THRESHOLD) != 0 {
            return Err(inval(format!(
                "attr.mask {:#x} has unknown bits (JETTY_RX_THRESHOLD 1, JETTY_STATE 2)",
                a.mask
            )));
        }
        if a.mask & JETTY_STATE == 0 {
            return Ok(());
        }
        let mut g = j.lock();
        match a.state {
            URMA_JETTY_STATE_ERROR => {
                g.q.set_error()?;
            }
            URMA_JETTY_STATE_RESET => {
                j.reset(&mut g)?;
            }
            URMA_JETTY_STATE_READY => {
                if j.state(&g) != URMA_JETTY_STATE_READY || g.q.state() != QueueState::Ready {
                    if g.q.state() != QueueState::Reset {
                        j.reset(&mut g)?;
                    }
                    if connectionless(j.trans_mode) {
                        j.activate(&mut g)?;
                    } else if let Some(tj) = g.bound.clone() {
                        j.connect(&mut g, &tj)?;
                    }
                }
            }
            URMA_JETTY_STATE_SUSPENDED => {
                return Err(inval("SUSPENDED is not simulated (no error_suspend): use ERROR, RESET or READY"))
            }
            s => {
                return Err(inval(format!(
                    "unknown jetty state {s} (RESET 0, READY 1, SUSPENDED 2, ERROR 3)"
                )))
            }
        }
        g.state = a.state;
        Ok(())
    })
}

/// `urma_query_jetty`: the configuration it was created with and its current state.
#[no_mangle]
pub unsafe extern "C" fn urma_query_jetty(
    jetty: *mut abi::UrmaJetty,
    cfg: *mut abi::UrmaJettyCfg,
    attr: *mut abi::UrmaJettyAttr,
) -> UrmaStatus {
    ffi::status("urma_query_jetty", || {
        let j = jetty_of(jetty)?;
        if cfg.is_null() || attr.is_null() {
            return Err(inval("cfg or attr is NULL"));
        }
        let g = j.lock();
        let state = j.state(&g);
        // SAFETY: both non-NULL and writable per the API; the jetty's cfg is read-only after
        // publication.
        unsafe {
            cfg.write_unaligned((*j.c.get()).jetty_cfg);
            attr.write_unaligned(abi::UrmaJettyAttr { mask: JETTY_STATE, rx_threshold: 0, state });
        }
        Ok(())
    })
}

/// `urma_flush_jetty`: the send-side records of a jetty in ERROR (flushed work requests), up to
/// `cr_cnt`; records of other jetties polled on the way stay for `urma_poll_jfc`.
#[no_mangle]
pub unsafe extern "C" fn urma_flush_jetty(
    jetty: *mut abi::UrmaJetty,
    cr_cnt: c_int,
    cr: *mut abi::UrmaCr,
) -> c_int {
    ffi::count("urma_flush_jetty", || {
        let j = jetty_of(jetty)?;
        if cr_cnt < 0 || (cr_cnt > 0 && cr.is_null()) {
            return Err(inval(format!("cr_cnt {cr_cnt} with cr {cr:p}: need cr_cnt >= 0 and a cr array")));
        }
        let state = j.state(&j.lock());
        if state != URMA_JETTY_STATE_ERROR {
            return Err(inval(
                "the jetty is not in ERROR: urma_modify_jetty it to URMA_JETTY_STATE_ERROR first",
            ));
        }
        let id = j.id;
        let mine = move |r: &abi::UrmaCr| r.local_id == id && r.flag & CR_FLAG_S_R == 0;
        // SAFETY: the caller's array has room for cr_cnt records (the API's contract).
        Ok(unsafe { j.jfc.poll_into(cr, cr_cnt as usize, mine) }? as c_int)
    })
}

/// `urma_get_rjetty`: what a peer passes to `urma_import_jetty`, to send it out of band.
#[no_mangle]
pub unsafe extern "C" fn urma_get_rjetty(
    jetty: *mut abi::UrmaJetty,
    rjetty: *mut *mut abi::UrmaRjetty,
    length: *mut u32,
) -> UrmaStatus {
    ffi::status("urma_get_rjetty", || {
        let j = jetty_of(jetty)?;
        if rjetty.is_null() || length.is_null() {
            return Err(inval("rjetty or length is NULL"));
        }
        let out = alloc_list::<abi::UrmaRjetty>(1)?;
        // SAFETY: `out` has room for one rjetty; the outputs are non-NULL and writable; the
        // jetty id is read-only after publication.
        unsafe {
            out.write(abi::UrmaRjetty {
                jetty_id: (*j.c.get()).jetty_id,
                trans_mode: j.trans_mode,
                policy: 0,
                type_: URMA_JETTY,
                flag: j.order << IMPORT_JETTY_ORDER_TYPE_SHIFT,
                tp_type: URMA_RTP,
            });
            *rjetty = out;
            *length = std::mem::size_of::<abi::UrmaRjetty>() as u32;
        }
        Ok(())
    })
}

/// `urma_put_rjetty`.
#[no_mangle]
pub unsafe extern "C" fn urma_put_rjetty(rjetty: *mut abi::UrmaRjetty) {
    ffi::unit("urma_put_rjetty", || free_list(rjetty, "rjetty"))
}

impl Jetty {
    /// The send depth it was created with.
    pub(crate) fn c_depth(&self) -> u32 {
        // SAFETY: the cfg is read-only after publication.
        unsafe { (*self.c.get()).jetty_cfg.jfs_cfg.depth }
    }
}
