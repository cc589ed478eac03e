//! Completion: JFCE (an event channel with a real eventfd), JFC (a sim CQ), and the translation
//! of sim completions into `urma_cr_t`.

use crate::context::{ctx_of, Ctx, JettyIds};
use crate::ffi::{self, fail, inval, Res};
use crate::handle_cache;
use crate::registry::{self, Kind};
use bypass_hal::{ArmMode, Completion, CompletionQueue, CqOpcode, Device as _, EventChannel, Status};
use bypass_sim::{SimChannel, SimCq, Source};
use bypass_urma_abi as abi;
use bypass_urma_abi::consts::*;
use bypass_urma_abi::status::*;
use std::cell::UnsafeCell;
use std::collections::{HashMap, VecDeque};
use std::ffi::c_int;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};

/// A completion event channel (`urma_jfce_t` first).
#[repr(C)]
pub(crate) struct Jfce {
    pub c: UnsafeCell<abi::UrmaJfce>,
    pub ctx: Arc<Ctx>,
    pub chan: SimChannel,
    /// The JFCs on this channel, by sim CQ id.
    pub jfcs: Mutex<HashMap<u64, usize>>,
}

// SAFETY: the C struct is written before publication and read-only after.
unsafe impl Send for Jfce {}
// SAFETY: as above.
unsafe impl Sync for Jfce {}

/// A completion queue (`urma_jfc_t` first).
#[repr(C)]
pub(crate) struct Jfc {
    pub c: UnsafeCell<abi::UrmaJfc>,
    pub ctx: Arc<Ctx>,
    pub jfce: Option<Arc<Jfce>>,
    pub inner: Mutex<JfcInner>,
}

// SAFETY: the C struct's counters are written only under `inner`'s lock; the rest is written
// before publication.
unsafe impl Send for Jfc {}
// SAFETY: as above.
unsafe impl Sync for Jfc {}

/// A JFC's poller state.
pub(crate) struct JfcInner {
    pub cq: SimCq,
    /// `Ctx::epoch` when `ids` was last known good.
    epoch: u32,
    ids: Vec<(u32, JettyIds)>,
    /// Records taken out of the CQ by `urma_flush_jetty` for other jetties, delivered first.
    pub stash: VecDeque<abi::UrmaCr>,
    buf: [Completion; 16],
    /// The sender of each datagram receive in `buf` (UM jetties).
    from: [Source; 16],
}

impl Jfc {
    pub(crate) fn lock(&self) -> MutexGuard<'_, JfcInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Writes up to `cap` records to `out`; those `keep` refuses go to the stash.
    ///
    /// # Safety
    /// `out` must be valid for writing `cap` records.
    pub(crate) unsafe fn poll_into(
        &self,
        out: *mut abi::UrmaCr,
        cap: usize,
        keep: impl Fn(&abi::UrmaCr) -> bool,
    ) -> Res<usize> {
        let mut g = self.lock();
        let inner = &mut *g;
        let mut n = 0;
        if !inner.stash.is_empty() {
            let mut i = 0;
            while i < inner.stash.len() && n < cap {
                if keep(&inner.stash[i]) {
                    let cr = inner.stash.remove(i).expect("index checked");
                    // SAFETY: n < cap, and the caller vouches for cap records at `out`.
                    unsafe { out.add(n).write(cr) };
                    n += 1;
                } else {
                    i += 1;
                }
            }
        }
        let epoch = self.ctx.epoch.load(Ordering::Acquire);
        if epoch != inner.epoch {
            inner.ids.clear();
            inner.epoch = epoch;
        }
        while n < cap {
            let want = (cap - n).min(inner.buf.len());
            let got = inner.cq.poll_from(&mut inner.buf[..want], &mut inner.from[..want]).map_err(|e| {
                fail(URMA_FAIL, format!("{e}; the JFC is unusable: delete it and create a deeper one"))
            })?;
            for i in 0..got {
                let wc = inner.buf[i];
                let at = match inner.ids.iter().position(|(q, _)| *q == wc.qpn) {
                    Some(i) => Some(i),
                    None => self.ctx.jetty(wc.qpn).map(|ids| {
                        inner.ids.push((wc.qpn, ids));
                        inner.ids.len() - 1
                    }),
                };
                let ids = at.map(|i| &inner.ids[i].1);
                if let Some(ids) = ids {
                    if !matches!(wc.status, Status::Success | Status::Flushed) {
                        ids.errored.store(true, Ordering::Release);
                    }
                }
                let mut cr = to_cr(&wc, ids);
                let from = inner.from[i];
                if from.qpn != 0 {
                    // A UM datagram: the sender is in the record, not the jetty's (absent) peer.
                    cr.remote_id = self.ctx.dev.senders.remote_id(from);
                }
                if keep(&cr) {
                    // SAFETY: n < cap (at most `want` records are taken per round).
                    unsafe { out.add(n).write(cr) };
                    n += 1;
                } else {
                    inner.stash.push_back(cr);
                }
            }
            if got < want {
                break;
            }
        }
        Ok(n)
    }
}

/// The `urma_cr_status_t` of a sim status (one table, here).
pub(crate) fn cr_status(s: Status) -> u32 {
    match s {
        Status::Success => URMA_CR_SUCCESS,
        Status::LocalLength => URMA_CR_LOC_LEN_ERR,
        Status::LocalQueueOperation => URMA_CR_LOC_OPERATION_ERR,
        Status::LocalProtection => URMA_CR_LOC_ACCESS_ERR,
        Status::RemoteInvalidRequest => URMA_CR_REM_UNSUPPORTED_REQ_ERR,
        Status::RemoteAccess => URMA_CR_REM_ACCESS_ABORT_ERR,
        Status::RemoteOperation => URMA_CR_REM_OPERATION_ERR,
        Status::RetryExceeded => URMA_CR_ACK_TIMEOUT_ERR,
        Status::RnrRetryExceeded => URMA_CR_RNR_RETRY_CNT_EXC_ERR,
        Status::Flushed => URMA_CR_WR_FLUSH_ERR,
        Status::BadResponse => URMA_CR_REM_RESP_LEN_ERR,
        _ => URMA_CR_LOC_OPERATION_ERR,
    }
}

fn to_cr(wc: &Completion, ids: Option<&JettyIds>) -> abi::UrmaCr {
    // SAFETY: plain C data.
    let mut cr: abi::UrmaCr = unsafe { ffi::zeroed() };
    cr.status = cr_status(wc.status);
    cr.user_ctx = wc.wr_id;
    let recv = matches!(wc.opcode, CqOpcode::Recv | CqOpcode::RecvWriteImm);
    cr.opcode = match wc.opcode {
        CqOpcode::Recv if wc.imm.is_some() => URMA_CR_OPC_SEND_WITH_IMM,
        CqOpcode::RecvWriteImm => URMA_CR_OPC_WRITE_WITH_IMM,
        _ => URMA_CR_OPC_SEND,
    };
    cr.flag = CR_FLAG_JETTY | if recv { CR_FLAG_S_R } else { 0 };
    cr.completion_len = wc.byte_len;
    if let Some(ids) = ids {
        cr.local_id = ids.local_id;
        cr.remote_id = ids.remote;
    }
    cr.data.imm_data = u64::from(wc.imm.unwrap_or(0));
    cr.tpn = wc.qpn;
    cr
}

thread_local! {
    static JFCS: handle_cache::ObjCache<Jfc> = const { std::cell::RefCell::new(handle_cache::Cache::new()) };
}

/// The live JFC at `p` (the thread's cache, then the registry).
pub(crate) fn jfc_of(p: *const abi::UrmaJfc) -> Res<Arc<Jfc>> {
    handle_cache::object(&JFCS, Kind::Jfc, p)
        .ok_or_else(|| inval(format!("{p:p} is not a live JFC of this library (NULL, unknown or deleted)")))
}

fn jfce_of(p: *const abi::UrmaJfce) -> Res<Arc<Jfce>> {
    registry::get::<Jfce, _>(Kind::Jfce, p)
        .ok_or_else(|| inval(format!("{p:p} is not a live JFCE of this library (NULL, unknown or deleted)")))
}

/// `urma_create_jfce`.
#[no_mangle]
pub unsafe extern "C" fn urma_create_jfce(ctx: *mut abi::UrmaContext) -> *mut abi::UrmaJfce {
    ffi::pointer("urma_create_jfce", || {
        let c = ctx_of(ctx)?;
        let chan = c.nic().create_channel()?;
        // SAFETY: plain C data.
        let mut j: abi::UrmaJfce = unsafe { ffi::zeroed() };
        j.urma_ctx = c.ptr();
        j.fd = chan.as_fd().as_raw_fd();
        j.ref_ = 1;
        let obj = Arc::new(Jfce { c: UnsafeCell::new(j), ctx: c, chan, jfcs: Mutex::new(HashMap::new()) });
        Ok(registry::insert(Kind::Jfce, obj).cast())
    })
}

/// `urma_delete_jfce`.
#[no_mangle]
pub unsafe extern "C" fn urma_delete_jfce(jfce: *mut abi::UrmaJfce) -> UrmaStatus {
    ffi::status("urma_delete_jfce", || {
        let j = jfce_of(jfce)?;
        if !j.jfcs.lock().unwrap_or_else(|e| e.into_inner()).is_empty() {
            return Err(inval("the JFCE still has JFCs: delete them first"));
        }
        registry::remove::<Jfce, _>(Kind::Jfce, jfce);
        Ok(())
    })
}

/// `urma_create_jfc`: depth 1..=`max_jfc_depth`; the JFCE (if any) must be of this context.
#[no_mangle]
pub unsafe extern "C" fn urma_create_jfc(
    ctx: *mut abi::UrmaContext,
    jfc_cfg: *mut abi::UrmaJfcCfg,
) -> *mut abi::UrmaJfc {
    ffi::pointer("urma_create_jfc", || {
        let c = ctx_of(ctx)?;
        // SAFETY: a non-NULL cfg points to a jfc_cfg (the API's contract).
        let cfg = unsafe { ffi::read_in(jfc_cfg, "jfc_cfg")? };
        let max = c.nic().caps().max_cq_depth;
        if cfg.depth == 0 || cfg.depth > max {
            return Err(inval(format!(
                "JFC depth {} is outside 1..={max} (dev_cap.max_jfc_depth)",
                cfg.depth
            )));
        }
        let jfce = if cfg.jfce.is_null() {
            None
        } else {
            let j = jfce_of(cfg.jfce)?;
            if !Arc::ptr_eq(&j.ctx, &c) {
                return Err(inval("the JFCE belongs to another context"));
            }
            Some(j)
        };
        let cq = match &jfce {
            Some(j) => c.nic().create_cq_on(cfg.depth, &j.chan)?,
            None => c.nic().create_cq(cfg.depth)?,
        };
        let cq_id = cq.id();
        // SAFETY: plain C data.
        let mut pc: abi::UrmaJfc = unsafe { ffi::zeroed() };
        pc.urma_ctx = c.ptr();
        pc.jfc_id = c.id_of(c.next_id.fetch_add(1, Ordering::Relaxed));
        pc.jfc_cfg = cfg;
        let inner = JfcInner {
            cq,
            epoch: u32::MAX,
            ids: Vec::with_capacity(8),
            stash: VecDeque::new(),
            buf: [Completion::default(); 16],
            from: [Source::default(); 16],
        };
        let obj =
            Arc::new(Jfc { c: UnsafeCell::new(pc), ctx: c, jfce: jfce.clone(), inner: Mutex::new(inner) });
        let p = registry::insert(Kind::Jfc, obj);
        if let Some(j) = jfce {
            j.jfcs.lock().unwrap_or_else(|e| e.into_inner()).insert(cq_id, p as usize);
        }
        Ok(p.cast())
    })
}

/// `urma_delete_jfc`.
#[no_mangle]
pub unsafe extern "C" fn urma_delete_jfc(jfc: *mut abi::UrmaJfc) -> UrmaStatus {
    ffi::status("urma_delete_jfc", || {
        let j = registry::remove::<Jfc, _>(Kind::Jfc, jfc)
            .ok_or_else(|| inval(format!("{jfc:p} is not a live JFC")))?;
        if let Some(ch) = &j.jfce {
            let id = j.lock().cq.id();
            ch.jfcs.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
        }
        Ok(())
    })
}

/// The completion-event moderation periods UDMA accepts (`moderate_period`, microseconds).
const MODERATE_PERIODS: [u16; 8] = [0, 4, 16, 64, 256, 1024, 4096, 16384];
/// UDMA's bound on `moderate_count` (exclusive).
const MODERATE_COUNT_MAX: u16 = 1 << 10;

/// `urma_modify_jfc`: completion moderation, validated as UDMA validates it (a mask of
/// `JFC_MODERATE_COUNT` and/or `JFC_MODERATE_PERIOD`, a count below 1024, a period of 0, 4, 16,
/// 64, 256, 1024, 4096 or 16384 µs). The simulated device raises an event per armed completion
/// whatever the moderation (a moderation of 1 completion, 0 µs), which every setting permits: an
/// application must not count on moderation to batch events.
#[no_mangle]
pub unsafe extern "C" fn urma_modify_jfc(jfc: *mut abi::UrmaJfc, attr: *mut abi::UrmaJfcAttr) -> UrmaStatus {
    ffi::status("urma_modify_jfc", || {
        jfc_of(jfc)?;
        // SAFETY: a non-NULL attr points to a jfc attr (the API's contract).
        let a = unsafe { ffi::read_in(attr, "attr")? };
        let known = JFC_MODERATE_COUNT | JFC_MODERATE_PERIOD;
        if a.mask & known == 0 || a.mask & !known != 0 {
            return Err(inval(format!(
                "attr.mask {:#x}: set JFC_MODERATE_COUNT (1) and/or JFC_MODERATE_PERIOD (2), nothing else",
                a.mask
            )));
        }
        if a.mask & JFC_MODERATE_COUNT != 0 && a.moderate_count >= MODERATE_COUNT_MAX {
            return Err(inval(format!(
                "moderate_count {} is outside 0..{MODERATE_COUNT_MAX}",
                a.moderate_count
            )));
        }
        if a.mask & JFC_MODERATE_PERIOD != 0 && !MODERATE_PERIODS.contains(&a.moderate_period) {
            return Err(inval(format!(
                "moderate_period {} µs is not one of {MODERATE_PERIODS:?}",
                a.moderate_period
            )));
        }
        Ok(())
    })
}

/// `urma_rearm_jfc`: one event on the JFCE at the next (solicited) completion, or at once if
/// one is already waiting to be polled (UDMA's arm doorbell carries the consumer index).
#[no_mangle]
pub unsafe extern "C" fn urma_rearm_jfc(jfc: *mut abi::UrmaJfc, solicited_only: bool) -> UrmaStatus {
    ffi::status("urma_rearm_jfc", || {
        let j = jfc_of(jfc)?;
        let mode = if solicited_only { ArmMode::Solicited } else { ArmMode::Any };
        let mut g = j.lock();
        g.cq.arm(mode)?;
        // Records the library made itself (flushed JFR receives) wait in the stash: like
        // completions already in the CQ, they raise the event at once (hal's `arm` contract).
        if !g.stash.is_empty() {
            g.cq.fire_if_armed();
        }
        Ok(())
    })
}

/// `urma_wait_jfc`: the JFCs that raised events (up to `jfc_cnt`), 0 on timeout (`time_out` ms,
/// -1 forever), -1 on error; a signal returns 0 with errno ERESTARTSYS.
#[no_mangle]
pub unsafe extern "C" fn urma_wait_jfc(
    jfce: *mut abi::UrmaJfce,
    jfc_cnt: u32,
    time_out: c_int,
    jfc: *mut *mut abi::UrmaJfc,
) -> c_int {
    ffi::count("urma_wait_jfc", || {
        let ch = jfce_of(jfce)?;
        if jfc_cnt == 0 || jfc.is_null() {
            return Err(inval("jfc_cnt is 0 or the jfc array is NULL"));
        }
        let deadline = (time_out >= 0)
            .then(|| std::time::Instant::now() + std::time::Duration::from_millis(time_out as u64));
        let mut ids = [0u64; 64];
        loop {
            let n = ch.chan.take_events(&mut ids[..(jfc_cnt as usize).min(64)])?;
            if n > 0 {
                let map = ch.jfcs.lock().unwrap_or_else(|e| e.into_inner());
                let mut k = 0;
                for id in &ids[..n] {
                    if let Some(&p) = map.get(id) {
                        // SAFETY: the caller's array has room for jfc_cnt entries; k < n <= jfc_cnt.
                        unsafe { *jfc.add(k) = p as *mut abi::UrmaJfc };
                        k += 1;
                    }
                }
                if k > 0 {
                    return Ok(k as c_int);
                }
            }
            let wait_ms = match deadline {
                None => 50,
                Some(d) => {
                    let left = d.saturating_duration_since(std::time::Instant::now());
                    if left.is_zero() {
                        return Ok(0);
                    }
                    left.as_millis().clamp(1, 50) as c_int
                }
            };
            // An Inline-engine device runs on its users' threads: give it the chance before
            // sleeping (and between naps, so its timers fire).
            ch.ctx.nic().progress();
            let mut p = libc::pollfd { fd: ch.chan.as_fd().as_raw_fd(), events: libc::POLLIN, revents: 0 };
            // SAFETY: one valid pollfd for the duration of the call.
            let r = unsafe { libc::poll(&mut p, 1, wait_ms) };
            if r < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                crate::log::set_errno(ERESTARTSYS);
                return Ok(0);
            }
        }
    })
}

/// `urma_ack_jfc`: counts `nevents[i]` on `jfc[i]` (`comp_events_acked`).
#[no_mangle]
pub unsafe extern "C" fn urma_ack_jfc(jfc: *mut *mut abi::UrmaJfc, nevents: *mut u32, jfc_cnt: u32) {
    ffi::unit("urma_ack_jfc", || {
        if jfc_cnt == 0 {
            return Ok(());
        }
        if jfc.is_null() || nevents.is_null() {
            return Err(inval("jfc or nevents is NULL"));
        }
        for i in 0..jfc_cnt as usize {
            // SAFETY: the caller's arrays have jfc_cnt entries each.
            let (p, n) = unsafe { (*jfc.add(i), *nevents.add(i)) };
            let j = jfc_of(p)?;
            let mut g = j.lock();
            if j.jfce.is_none() {
                g.cq.ack_events()?;
            }
            // SAFETY: the counter is written only here, under the JFC's lock.
            unsafe { (*j.c.get()).comp_events_acked = (*j.c.get()).comp_events_acked.wrapping_add(n) };
        }
        Ok(())
    })
}

/// `urma_poll_jfc`: up to `cr_cnt` records, oldest first; -1 on bad arguments.
#[no_mangle]
pub unsafe extern "C" fn urma_poll_jfc(jfc: *mut abi::UrmaJfc, cr_cnt: c_int, cr: *mut abi::UrmaCr) -> c_int {
    ffi::count("urma_poll_jfc", || {
        if cr_cnt < 0 || (cr_cnt > 0 && cr.is_null()) {
            jfc_of(jfc)?;
            return Err(inval(format!("cr_cnt {cr_cnt} with cr {cr:p}: need cr_cnt >= 0 and a cr array")));
        }
        let j = jfc_of(jfc)?;
        if cr_cnt == 0 {
            return Ok(0);
        }
        // SAFETY: the caller's array has room for cr_cnt records (the API's contract).
        Ok(unsafe { j.poll_into(cr, cr_cnt as usize, |_| true) }? as c_int)
    })
}
