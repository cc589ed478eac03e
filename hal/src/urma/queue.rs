//! Queues: an RC jetty on a JFR of its own (passed as the jetty's shared JFR: UB devices reject a
//! jetty without one) or on the JFR of a shared receive queue (`srq.rs`), connected with `urma_import_jetty` + `urma_bind_jetty`, plus the backend's
//! bookkeeping — side rings from slot to user `wr_id`, the free-slot accounting that makes batches
//! all-or-nothing, the tracked state, the epoch that hides completions of a queue's earlier life,
//! and the cache of imported remote segments.
//!
//! # The `user_ctx` liburma sees
//!
//! `queue tag (16 bits) | epoch (15 bits) | receive? (1 bit) | slot index (32 bits)`. The tag
//! finds the queue among those feeding a CQ (a receive record names the JFR, not the jetty, so
//! `local_id` cannot), the epoch (a process-wide counter, moved on at every reset) drops records
//! of an earlier incarnation, and the user's `wr_id` and the kind of operation live in the side
//! ring at the slot. Slots retire as in the verbs backend: a signaled send record at slot `i`
//! retires every slot up to `i` (unsignaled requests, without `complete_enable`, completed
//! silently before it), a receive retires one.

use super::cq::{CqShared, UrmaCq};
use super::device::Context;
use super::mr::{KeyFields, LocalSeg};
use super::srq::{self, SrqObj, UrmaSharedRecv, SRQ_TAG};
use super::tables::{errno, status_error};
use crate::queue_book::{check_config, invalid, HasRings, QueueBook, Rings};
use crate::wr_chain::{self, posted_before};
use crate::{
    Error, Queue, QueueConfig, QueueInfo, QueueState, RecvWr, RemoteKey, Result, SendOp, SendWr, Sge, WrFlags,
};
use bypass_urma_abi as abi;
use bypass_urma_abi::consts::*;
use bypass_urma_abi::status::{URMA_EEXIST, URMA_SUCCESS};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

pub(crate) use crate::side_ring::{Done, Op};

const RECV_BIT: u64 = 1 << 32;
const EPOCH_MASK: u16 = 0x7fff;

pub(crate) fn encode_user_ctx(tag: u16, epoch: u16, recv: bool, index: u32) -> u64 {
    (u64::from(tag) << 48)
        | (u64::from(epoch & EPOCH_MASK) << 33)
        | if recv { RECV_BIT } else { 0 }
        | u64::from(index)
}

/// `(tag, epoch, receive?, index)`.
pub(crate) fn decode_user_ctx(v: u64) -> (u16, u16, bool, u32) {
    ((v >> 48) as u16, ((v >> 33) as u16) & EPOCH_MASK, v & RECV_BIT != 0, v as u32)
}

static NEXT_EPOCH: AtomicU16 = AtomicU16::new(1);
static NEXT_TAG: AtomicU16 = AtomicU16::new(1);

/// A queue tag other than [`SRQ_TAG`] (which marks shared receives).
fn next_tag() -> u16 {
    loop {
        let t = NEXT_TAG.fetch_add(1, Ordering::Relaxed);
        if t != SRQ_TAG {
            return t;
        }
    }
}

fn next_epoch() -> u16 {
    NEXT_EPOCH.fetch_add(1, Ordering::Relaxed) & EPOCH_MASK
}

/// The part of a queue its CQs' pollers (and the async event reader) see.
pub(crate) struct QueueShared {
    pub(crate) tag: u16,
    /// The jetty id (changes when a reset recreates the jetty).
    qpn: AtomicU32,
    rings: Rings,
    /// The peer jettys bound last and before (see [`Peers`]).
    peers: Peers,
}

/// The peer jettys a queue was bound to last and the time before: the `remote_id` a record of a
/// shared receive names its queue by. The one before still counts, so that a receive the queue
/// took before a reset (reconnected to a new peer jetty id) still retires its shared slot.
/// Written under a sequence count (connect is rare; a poller retries a read that overlapped).
#[derive(Debug)]
struct Peers {
    seq: AtomicU32,
    /// `[last, before]`: jetty id (`u32::MAX`: none) and the EID in two halves.
    ids: [AtomicU32; 2],
    eids: [[AtomicU64; 2]; 2],
}

impl Peers {
    fn new() -> Self {
        Peers {
            seq: AtomicU32::new(0),
            ids: [AtomicU32::new(u32::MAX), AtomicU32::new(u32::MAX)],
            eids: [[AtomicU64::new(0), AtomicU64::new(0)], [AtomicU64::new(0), AtomicU64::new(0)]],
        }
    }

    /// Only the queue's owner writes (`&mut UrmaQueue` in connect).
    fn set(&self, eid: &abi::UrmaEid, id: u32) {
        let (lo, hi) = eid_halves(eid);
        self.seq.fetch_add(1, Ordering::AcqRel);
        std::sync::atomic::fence(Ordering::Release);
        let last =
            (self.ids[0].load(Ordering::Relaxed), [0, 1].map(|h| self.eids[0][h].load(Ordering::Relaxed)));
        self.ids[1].store(last.0, Ordering::Relaxed);
        for h in 0..2 {
            self.eids[1][h].store(last.1[h], Ordering::Relaxed);
        }
        self.ids[0].store(id, Ordering::Relaxed);
        self.eids[0][0].store(lo, Ordering::Relaxed);
        self.eids[0][1].store(hi, Ordering::Relaxed);
        self.seq.fetch_add(1, Ordering::Release);
    }

    fn contains(&self, remote: &abi::UrmaJettyId) -> bool {
        let (lo, hi) = eid_halves(&remote.eid);
        loop {
            let s1 = self.seq.load(Ordering::Acquire);
            if s1 & 1 == 0 {
                let hit = (0..2).any(|k| {
                    self.ids[k].load(Ordering::Relaxed) == remote.id
                        && self.eids[k][0].load(Ordering::Relaxed) == lo
                        && self.eids[k][1].load(Ordering::Relaxed) == hi
                });
                std::sync::atomic::fence(Ordering::Acquire);
                if self.seq.load(Ordering::Relaxed) == s1 {
                    return hit;
                }
            }
            std::hint::spin_loop();
        }
    }
}

impl HasRings for QueueShared {
    fn rings(&self) -> &Rings {
        &self.rings
    }
}

impl std::fmt::Debug for QueueShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueShared").field("qpn", &self.qpn()).field("state", &self.rings.state()).finish()
    }
}

impl QueueShared {
    pub(crate) fn qpn(&self) -> u32 {
        self.qpn.load(Ordering::Acquire)
    }

    /// Poller side: resolves the record with `user_ctx`; `None` if it belongs to an earlier
    /// incarnation. Retires the slot(s) and, for an error, moves the tracked state to ERROR.
    pub(crate) fn complete(&self, user_ctx: u64, success: bool) -> Option<Done> {
        let (_, epoch, recv, index) = decode_user_ctx(user_ctx);
        self.rings.retire(epoch, recv, index, success)
    }

    /// Whether `remote` is a peer jetty this queue was bound to last or the time before.
    pub(crate) fn is_peer(&self, remote: &abi::UrmaJettyId) -> bool {
        self.peers.contains(remote)
    }

    fn set_peer(&self, eid: &abi::UrmaEid, id: u32) {
        self.peers.set(eid, id);
    }

    /// Poller side: a shared receive's record taken by this queue. An error other than a flush
    /// moves the tracked state to ERROR, as an error on its own receive ring would.
    pub(crate) fn complete_shared(&self, user_ctx: u64, success: bool, flushed: bool) -> Option<Done> {
        let (id, slot) = srq::locate(user_ctx);
        self.rings.retire_shared(id, slot, !success && !flushed)
    }

    /// The device moved the queue to ERROR (an async event said so).
    pub(crate) fn device_error(&self) {
        self.rings.device_error();
    }
}

fn eid_halves(eid: &abi::UrmaEid) -> (u64, u64) {
    let (lo, hi) = eid.raw.split_at(8);
    (u64::from_le_bytes(lo.try_into().expect("8 bytes")), u64::from_le_bytes(hi.try_into().expect("8 bytes")))
}

/// The order type a jetty or import flag carries (after the library's rewrite of 0).
fn order_type(flag: u32, shift: u32, mask: u32) -> u32 {
    (flag & mask) >> shift
}

/// The peer a connected queue is bound to.
#[derive(Debug, Clone, Copy)]
struct Peer {
    tjetty: *mut abi::UrmaTargetJetty,
    eid: abi::UrmaEid,
    uasid: u32,
    /// The peer device's token: what its segments with 32-bit keys are registered with.
    token: u32,
}

/// A reliable-connected queue on a URMA device.
pub struct UrmaQueue {
    ctx: Arc<Context>,
    send_cq: Arc<CqShared>,
    recv_cq: Arc<CqShared>,
    /// The shared part, the epoch and the heads.
    book: QueueBook<QueueShared>,
    config: QueueConfig,
    jfr: *mut abi::UrmaJfr,
    /// The shared receive queue whose JFR `jfr` is (not this queue's to delete), if any.
    srq: Option<Arc<SrqObj>>,
    jetty: *mut abi::UrmaJetty,
    peer: Option<Peer>,
    /// Remote segments imported through this queue's peer, by remote key (null: the library
    /// refused the import; such keys travel as user target segments).
    imports: HashMap<[u8; RemoteKey::LEN], *mut abi::UrmaTargetSeg>,
    // Reusable buffers the batches are built in (no allocation when posting).
    wrs: Box<[abi::UrmaJfsWr]>,
    sges: Box<[abi::UrmaSge]>,
    remote_sges: Box<[abi::UrmaSge]>,
    remote_user_tsegs: Box<[abi::UrmaUserTseg]>,
    recv_wrs: Box<[abi::UrmaJfrWr]>,
    recv_sges: Box<[abi::UrmaSge]>,
}

// SAFETY: a jetty may be posted to and modified from any thread (the library locks); the buffers
// and the import cache are owned by this handle, whose posting methods take `&mut self`.
unsafe impl Send for UrmaQueue {}

impl std::fmt::Debug for UrmaQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UrmaQueue")
            .field("qpn", &self.book.shared.qpn())
            .field("state", &self.book.tracked())
            .field("epoch", &self.book.epoch())
            .field("imports", &self.imports.len())
            .finish_non_exhaustive()
    }
}

fn zero_sge() -> abi::UrmaSge {
    abi::UrmaSge { addr: 0, len: 0, tseg: std::ptr::null_mut(), user_tseg: std::ptr::null_mut() }
}

fn zero_sg() -> abi::UrmaSg {
    abi::UrmaSg { sge: std::ptr::null_mut(), num_sge: 0 }
}

fn zero_wr() -> abi::UrmaJfsWr {
    abi::UrmaJfsWr {
        opcode: 0,
        flag: 0,
        tjetty: std::ptr::null_mut(),
        user_ctx: 0,
        body: abi::UrmaJfsWrBody {
            rw: abi::UrmaRwWr { src: zero_sg(), dst: zero_sg(), target_hint: 0, notify_data: 0 },
        },
        next: std::ptr::null_mut(),
    }
}

fn zero_recv_wr() -> abi::UrmaJfrWr {
    abi::UrmaJfrWr { src: zero_sg(), user_ctx: 0, next: std::ptr::null_mut() }
}

fn wr_flags(f: WrFlags) -> u32 {
    let mut v = 0;
    if f.contains(WrFlags::SIGNALED) {
        v |= WR_FLAG_COMPLETE_ENABLE;
    }
    if f.contains(WrFlags::INLINE) {
        v |= WR_FLAG_INLINE;
    }
    if f.contains(WrFlags::FENCE) {
        v |= WR_FLAG_FENCE;
    }
    if f.contains(WrFlags::SOLICITED) {
        v |= WR_FLAG_SOLICITED_ENABLE;
    }
    v
}

/// The library's target segment for a local SGE: the region's when the lkey names a live one, the
/// context's poison segment otherwise (the device then fails the request with a local access
/// error, as the hal wants for a stale lkey).
fn local_seg(regions: &super::device::RegionMap, poison: &LocalSeg, s: &Sge) -> (LocalSeg, bool) {
    match regions.get(&s.lkey) {
        Some(seg) => (*seg, true),
        None => (*poison, false),
    }
}

fn inside(seg: &LocalSeg, s: &Sge) -> bool {
    s.addr >= seg.addr && s.addr.checked_add(u64::from(s.len)).is_some_and(|end| end <= seg.addr + seg.len)
}

impl UrmaQueue {
    pub(crate) fn new(
        ctx: &Arc<Context>,
        c: &QueueConfig,
        send_cq: &UrmaCq,
        recv_cq: &UrmaCq,
    ) -> Result<Self> {
        Self::build(ctx, c, send_cq, recv_cq, None)
    }

    /// A queue whose jetty shares `srq`'s JFR (its receives come from there), with `recv_cq`
    /// as its own receive JFC (`shared.jfc`).
    pub(crate) fn new_on_shared(
        ctx: &Arc<Context>,
        c: &QueueConfig,
        send_cq: &UrmaCq,
        recv_cq: &UrmaCq,
        srq: &UrmaSharedRecv,
    ) -> Result<Self> {
        Self::build(ctx, c, send_cq, recv_cq, Some(srq))
    }

    fn build(
        ctx: &Arc<Context>,
        c: &QueueConfig,
        send_cq: &UrmaCq,
        recv_cq: &UrmaCq,
        srq: Option<&UrmaSharedRecv>,
    ) -> Result<Self> {
        // The JFS and JFR configurations carry SGE counts in a byte.
        check_config(&ctx.caps, &ctx.name, c, 255)?;
        if !Arc::ptr_eq(&send_cq.shared.ctx, ctx) || !Arc::ptr_eq(&recv_cq.shared.ctx, ctx) {
            return Err(invalid("the CQs belong to another device (context)"));
        }
        let epoch = next_epoch();
        let shared = Arc::new(QueueShared {
            tag: next_tag(),
            qpn: AtomicU32::new(0),
            rings: Rings::new(c.send_depth, c.recv_depth, epoch, srq.map(|s| s.slots.clone())),
            peers: Peers::new(),
        });
        let srq = srq.map(|s| s.obj.clone());
        let shared_jfr = srq.as_ref().map(|s| s.jfr);
        let (jfr, jetty) = create_objects(ctx, c, &send_cq.shared, &recv_cq.shared, &shared, shared_jfr)?;
        for cq in [&send_cq.shared, &recv_cq.shared] {
            cq.feeders.attach(&shared);
        }
        let n_send = c.send_depth as usize;
        let n_recv = c.recv_depth as usize;
        Ok(UrmaQueue {
            ctx: ctx.clone(),
            send_cq: send_cq.shared.clone(),
            recv_cq: recv_cq.shared.clone(),
            book: QueueBook::new(shared, epoch),
            config: *c,
            jfr,
            srq,
            jetty,
            peer: None,
            imports: HashMap::new(),
            wrs: (0..n_send).map(|_| zero_wr()).collect(),
            sges: (0..n_send * c.max_send_sge as usize).map(|_| zero_sge()).collect(),
            remote_sges: (0..n_send).map(|_| zero_sge()).collect(),
            remote_user_tsegs: (0..n_send).map(|_| abi::UrmaUserTseg::default()).collect(),
            recv_wrs: (0..n_recv).map(|_| zero_recv_wr()).collect(),
            recv_sges: (0..n_recv * c.max_recv_sge as usize).map(|_| zero_sge()).collect(),
        })
    }

    /// The jetty's state as the device has it.
    fn query_state(&self) -> Option<QueueState> {
        // SAFETY: plain data out-structures; zero is valid for every field (null pointers).
        let mut cfg: abi::UrmaJettyCfg = unsafe { std::mem::zeroed() };
        let mut attr = abi::UrmaJettyAttr::default();
        // SAFETY: the jetty is live; the out-structures are valid.
        let rc = unsafe { (self.ctx.lib.query_jetty)(self.jetty, &mut cfg, &mut attr) };
        if rc != URMA_SUCCESS {
            return None;
        }
        match attr.state {
            URMA_JETTY_STATE_READY => Some(QueueState::Ready),
            URMA_JETTY_STATE_ERROR | URMA_JETTY_STATE_SUSPENDED => Some(QueueState::Error),
            URMA_JETTY_STATE_RESET => Some(QueueState::Reset),
            _ => None,
        }
    }

    fn connect_steps(&mut self, peer: &QueueInfo) -> Result<Peer> {
        let lib = self.ctx.lib;
        let eid = abi::UrmaEid { raw: peer.gid };
        let mut rjetty = abi::UrmaRjetty {
            jetty_id: abi::UrmaJettyId { eid, uasid: peer.uasid, id: peer.qpn },
            trans_mode: URMA_TM_RC,
            policy: URMA_JETTY_GRP_POLICY_RR,
            type_: URMA_JETTY,
            // Order type 0: the library rewrites it (OL for RC), as create_jetty did ours.
            flag: URMA_TOKEN_PLAIN_TEXT & IMPORT_JETTY_TOKEN_POLICY_MASK,
            tp_type: URMA_RTP,
        };
        let mut token = abi::UrmaToken { token: peer.token };
        // SAFETY: the context is live; `rjetty` and `token` are valid for the call.
        let tjetty = unsafe { (lib.import_jetty)(self.ctx.ctx, &mut rjetty, &mut token) };
        if tjetty.is_null() {
            return Err(status_error(
                "urma_import_jetty",
                errno(),
                &format!(
                    "import jetty {} of EID {} (uasid {})",
                    peer.qpn,
                    std::net::Ipv6Addr::from(peer.gid),
                    peer.uasid
                ),
            ));
        }
        // SAFETY: the jetty is live; its config holds the order type create_jetty chose.
        let ours = order_type(
            unsafe { (*self.jetty).jetty_cfg.jfs_cfg.flag },
            JFS_FLAG_ORDER_TYPE_SHIFT,
            JFS_FLAG_ORDER_TYPE_MASK,
        );
        let theirs = order_type(rjetty.flag, IMPORT_JETTY_ORDER_TYPE_SHIFT, IMPORT_JETTY_ORDER_TYPE_MASK);
        // SAFETY: the jetty and the target jetty just imported are live.
        let rc = unsafe { (lib.bind_jetty)(self.jetty, tjetty) };
        // A jetty already bound (to this target) is what perftest accepts as bound.
        if rc != URMA_SUCCESS && rc != URMA_EEXIST {
            // SAFETY: imported above, never bound.
            unsafe { (lib.unimport_jetty)(tjetty) };
            return Err(status_error(
                "urma_bind_jetty",
                rc,
                &format!(
                    "bind jetty {} to jetty {} (order types: ours {ours}, the import's {theirs})",
                    self.book.shared.qpn(),
                    peer.qpn
                ),
            ));
        }
        Ok(Peer { tjetty, eid, uasid: peer.uasid, token: peer.token })
    }

    /// Unbinds and unimports everything connect and posts made.
    fn disconnect(&mut self) {
        let lib = self.ctx.lib;
        for (_, tseg) in self.imports.drain() {
            if !tseg.is_null() {
                // SAFETY: imported by this queue, unimported once.
                unsafe { (lib.unimport_seg)(tseg) };
            }
        }
        if let Some(p) = self.peer.take() {
            // SAFETY: the jetty is live and bound to `p.tjetty`, which this queue imported.
            unsafe {
                (lib.unbind_jetty)(self.jetty);
                (lib.unimport_jetty)(p.tjetty);
            }
        }
    }

    /// The imported target segment for remote key `key` on the bound peer (imported on first use).
    fn import(&mut self, key: &RemoteKey) -> Result<*mut abi::UrmaTargetSeg> {
        if let Some(&t) = self.imports.get(key.as_bytes()) {
            return Ok(t);
        }
        self.import_slow(key)
    }

    #[cold]
    fn import_slow(&mut self, key: &RemoteKey) -> Result<*mut abi::UrmaTargetSeg> {
        let Some(peer) = self.peer else {
            return Err(invalid("a WRITE or READ needs a connected queue (its peer owns the segment)"));
        };
        let k = KeyFields::decode(key);
        let mut seg = abi::UrmaSeg {
            ubva: abi::UrmaUbva { eid: peer.eid.raw, uasid: peer.uasid, va: k.va },
            len: k.len,
            attr: k.attr,
            token_id: k.token_id,
        };
        let mut token = abi::UrmaToken { token: k.token };
        let flag = ((k.granted() << IMPORT_SEG_ACCESS_SHIFT) & IMPORT_SEG_ACCESS_MASK) | URMA_SEG_NOMAP << 7;
        // SAFETY: the context is live; `seg` and `token` are valid for the call.
        let tseg = unsafe { (self.ctx.lib.import_seg)(self.ctx.ctx, &mut seg, &mut token, 0, flag) };
        // A key the library will not import (one that was never a segment's, say) is still sent,
        // as a user target segment with the key's token id and token: the owner's device then
        // refuses it as it refuses any wrong key, and the requester sees a RemoteAccess completion
        // (the hal reports key errors as completions, never at post time). A null entry caches
        // that decision.
        self.imports.insert(*key.as_bytes(), tseg);
        Ok(tseg)
    }
}

/// Creates the JFR and the jetty of a queue with configuration `c`.
fn create_objects(
    ctx: &Arc<Context>,
    c: &QueueConfig,
    send_cq: &CqShared,
    recv_cq: &CqShared,
    shared: &Arc<QueueShared>,
    shared_jfr: Option<*mut abi::UrmaJfr>,
) -> Result<(*mut abi::UrmaJfr, *mut abi::UrmaJetty)> {
    let lib = ctx.lib;
    let own_jfr = shared_jfr.is_none();
    let mut jfr_cfg = abi::UrmaJfrCfg {
        id: 0,
        depth: c.recv_depth,
        flag: URMA_TOKEN_PLAIN_TEXT & JFR_FLAG_TOKEN_POLICY_MASK,
        trans_mode: URMA_TM_RC,
        max_sge: c.max_recv_sge as u8,
        // URMA's timer is 2 µs × 2^N, not the InfiniBand code (urma-abi's `timers`).
        min_rnr_timer: abi::timers::min_rnr_timer_at_least(c.min_rnr_timer.duration()),
        jfc: recv_cq.jfc,
        token_value: abi::UrmaToken { token: ctx.jetty_token },
        user_ctx: 0,
    };
    let jfr = match shared_jfr {
        Some(j) => j,
        // SAFETY: the context and the receive JFC are live; the configuration is valid.
        None => unsafe { (lib.create_jfr)(ctx.ctx, &mut jfr_cfg) },
    };
    if jfr.is_null() {
        return Err(status_error(
            "urma_create_jfr",
            errno(),
            &format!("a JFR of {} slots, {} SGEs on {}", c.recv_depth, c.max_recv_sge, ctx.name),
        ));
    }
    let mut cfg = abi::UrmaJettyCfg {
        id: 0,
        flag: JETTY_FLAG_SHARE_JFR,
        jfs_cfg: abi::UrmaJfsCfg {
            depth: c.send_depth,
            // Order type 0: the library picks (OL for RC) and writes it back.
            flag: 0,
            trans_mode: URMA_TM_RC,
            priority: URMA_MAX_PRIORITY,
            max_sge: c.max_send_sge as u8,
            max_rsge: 1,
            max_inline_data: c.max_inline,
            rnr_retry: c.rnr_retry,
            err_timeout: c.timeout.exponent().min(31),
            jfc: send_cq.jfc,
            user_ctx: 0,
        },
        recv: abi::UrmaJettyRecv { shared: abi::UrmaJettyShared { jfr, jfc: recv_cq.jfc } },
        jetty_grp: std::ptr::null_mut(),
        user_ctx: Arc::as_ptr(shared) as u64,
    };
    // SAFETY: the context, JFCs and JFR are live; the configuration is valid.
    let jetty = unsafe { (lib.create_jetty)(ctx.ctx, &mut cfg) };
    if jetty.is_null() {
        let e = errno();
        if own_jfr {
            // SAFETY: created above, used by nothing.
            unsafe { (lib.delete_jfr)(jfr) };
        }
        return Err(status_error(
            "urma_create_jetty",
            e,
            &format!(
                "an RC jetty of {} slots, {} SGEs, {} B inline on {}",
                c.send_depth, c.max_send_sge, c.max_inline, ctx.name
            ),
        ));
    }
    // SAFETY: the jetty was just created; jetty_id is at offset 8 in every layout.
    shared.qpn.store(unsafe { (*jetty).jetty_id.id }, Ordering::Release);
    Ok((jfr, jetty))
}

impl Queue for UrmaQueue {
    fn qpn(&self) -> u32 {
        self.book.shared.qpn()
    }

    fn info(&self) -> QueueInfo {
        // SAFETY: the jetty is live; its id is public.
        let id = unsafe { (*self.jetty).jetty_id };
        let mut info = QueueInfo::new(id.eid.raw, id.id, 0);
        info.uasid = id.uasid;
        info.token = self.ctx.jetty_token;
        info
    }

    fn state(&self) -> QueueState {
        self.book.state(|| self.query_state())
    }

    fn connect(&mut self, peer: &QueueInfo) -> Result<()> {
        self.book.need_reset("connect")?;
        let p = self.connect_steps(peer)?;
        self.book.shared.set_peer(&abi::UrmaEid { raw: peer.gid }, peer.qpn);
        self.peer = Some(p);
        self.book.set_tracked(QueueState::Ready);
        Ok(())
    }

    fn set_error(&mut self) -> Result<()> {
        self.book.need_ready_or_error("set_error")?;
        let mut attr =
            abi::UrmaJettyAttr { mask: JETTY_STATE, rx_threshold: 0, state: URMA_JETTY_STATE_ERROR };
        // SAFETY: the jetty is live; `attr` is valid.
        let rc = unsafe { (self.ctx.lib.modify_jetty)(self.jetty, &mut attr) };
        if rc != URMA_SUCCESS {
            return Err(status_error("urma_modify_jetty", rc, "move a jetty to ERROR"));
        }
        self.book.set_tracked(QueueState::Error);
        Ok(())
    }

    fn reset(&mut self) -> Result<()> {
        // URMA has no RESET transition a jetty can take back to a connectable state: the queue
        // gets a new jetty and JFR (a new jetty id; the peer reconnects with the new info(), as
        // every reconnect does). What the old ones held is discarded with them; records of theirs
        // that still arrive carry the old epoch and are dropped.
        self.disconnect();
        let lib = self.ctx.lib;
        // SAFETY: unbound above; deleted once, the jetty before the JFR it uses (a shared JFR is
        // its shared queue's, which outlives this queue).
        unsafe {
            (lib.delete_jetty)(self.jetty);
            if self.srq.is_none() {
                (lib.delete_jfr)(self.jfr);
            }
        }
        self.book.new_incarnation(next_epoch());
        let shared_jfr = self.srq.as_ref().map(|s| s.jfr);
        let shared = &self.book.shared;
        match create_objects(&self.ctx, &self.config, &self.send_cq, &self.recv_cq, shared, shared_jfr) {
            Ok((jfr, jetty)) => {
                self.jfr = jfr;
                self.jetty = jetty;
                Ok(())
            }
            Err(e) => {
                // Leave the queue unusable but safe: a poison jetty pointer must never be used.
                self.jfr = std::ptr::null_mut();
                self.jetty = std::ptr::null_mut();
                self.book.shared.rings.kill();
                Err(Error::Device(format!("reset could not recreate the jetty, the queue is unusable: {e}")))
            }
        }
    }

    fn post_send(&mut self, wrs: &[SendWr<'_>]) -> Result<()> {
        self.book.need_ready_or_error("post_send")?;
        if self.jetty.is_null() {
            return Err(Error::Device("the queue lost its jetty in a failed reset; drop it".into()));
        }
        if wrs.is_empty() {
            return Ok(());
        }
        let c = self.config;
        // The atomics are refused here (Unsupported): the backend does not map URMA's CAS and FAA
        // yet, so its caps say `atomics: false`.
        self.book.check_send(wrs, &c, self.ctx.caps.atomics, |_| Ok(()))?;
        // Imports first: the only step that can fail after the checks, before anything is built.
        for wr in wrs {
            if let SendOp::Write(r) | SendOp::WriteImm(r, _) | SendOp::Read(r) = &wr.op {
                if !r.key.is_rkey() {
                    self.import(&r.key)?;
                }
            }
        }
        // A borrow that does not hold `self` (the loop below writes the queue's buffers) and costs
        // no reference count: `self.ctx` is set once at creation and outlives this call.
        let ctx_ptr = Arc::as_ptr(&self.ctx);
        // SAFETY: `self.ctx` keeps the context alive for the whole call and is never replaced.
        let ctx: &Context = unsafe { &*ctx_ptr };
        // Held across the post: a region cannot be unregistered while the library may use its
        // target segment (the write lock of its Drop waits).
        let regions = ctx.regions.read().unwrap_or_else(|e| e.into_inner());
        let max_sge = c.max_send_sge as usize;
        let n = wrs.len();
        let tjetty = self.peer.map_or(std::ptr::null_mut(), |p| p.tjetty);
        let (send_head, epoch) = (self.book.send_head(), self.book.epoch());
        for (i, wr) in wrs.iter().enumerate() {
            let index = send_head.wrapping_add(i as u32);
            let base = i * max_sge;
            for (k, s) in wr.sges.iter().enumerate() {
                let (seg, live) = local_seg(&regions, &ctx.poison, s);
                if wr.flags.contains(WrFlags::INLINE) && !(live && inside(&seg, s)) {
                    return Err(invalid(format!(
                        "an INLINE SGE does not lie in a region registered on {} (with that lkey)",
                        ctx.name
                    )));
                }
                self.sges[base + k] = abi::UrmaSge {
                    addr: s.addr,
                    len: s.len,
                    tseg: seg.tseg,
                    user_tseg: std::ptr::null_mut(),
                };
            }
            let local = abi::UrmaSg {
                // SAFETY: `base <= (send_depth - 1) * max_sge`, in bounds of the buffer.
                sge: unsafe { self.sges.as_mut_ptr().add(base) },
                num_sge: wr.sges.len() as u32,
            };
            let remote_sg = |q: &mut Self, r: &crate::RemoteAddr| -> abi::UrmaSg {
                let (tseg, user) = if r.key.is_rkey() {
                    // A 32-bit key: the token id of a segment under the peer device's token.
                    let token = q.peer.map_or(0, |p| p.token);
                    let attr = (URMA_TOKEN_PLAIN_TEXT & SEG_ATTR_TOKEN_POLICY_MASK)
                        | ((URMA_ACCESS_READ | URMA_ACCESS_WRITE) << SEG_ATTR_ACCESS_SHIFT);
                    (std::ptr::null_mut(), Some((attr, r.key.rkey(), token)))
                } else {
                    let tseg = q.imports.get(r.key.as_bytes()).copied().unwrap_or(std::ptr::null_mut());
                    let k = KeyFields::decode(&r.key);
                    (tseg, tseg.is_null().then_some((k.attr, k.token_id, k.token)))
                };
                let user_tseg = match user {
                    Some((attr, token_id, token)) => {
                        q.remote_user_tsegs[i] =
                            abi::UrmaUserTseg { attr, token_id, token_value: abi::UrmaToken { token } };
                        // SAFETY: `i < n <= send_depth`, in bounds.
                        unsafe { q.remote_user_tsegs.as_mut_ptr().add(i) }
                    }
                    None => std::ptr::null_mut(),
                };
                let len = wr.total_len().min(u64::from(u32::MAX)) as u32;
                q.remote_sges[i] = abi::UrmaSge { addr: r.addr, len, tseg, user_tseg };
                // SAFETY: `i < n <= send_depth`, in bounds.
                abi::UrmaSg { sge: unsafe { q.remote_sges.as_mut_ptr().add(i) }, num_sge: 1 }
            };
            let (opcode, body, op) = match wr.op {
                SendOp::Send | SendOp::SendImm(_) => {
                    let imm = if let SendOp::SendImm(v) = wr.op { u64::from(v) } else { 0 };
                    let opc =
                        if matches!(wr.op, SendOp::SendImm(_)) { URMA_OPC_SEND_IMM } else { URMA_OPC_SEND };
                    let send = abi::UrmaSendWr {
                        src: local,
                        target_hint: 0,
                        imm_data: imm,
                        tseg: std::ptr::null_mut(),
                    };
                    (opc, abi::UrmaJfsWrBody { send }, Op::Send)
                }
                SendOp::Write(r) | SendOp::WriteImm(r, _) => {
                    let imm = if let SendOp::WriteImm(_, v) = wr.op { u64::from(v) } else { 0 };
                    let opc = if matches!(wr.op, SendOp::WriteImm(..)) {
                        URMA_OPC_WRITE_IMM
                    } else {
                        URMA_OPC_WRITE
                    };
                    let dst = remote_sg(self, &r);
                    let rw = abi::UrmaRwWr { src: local, dst, target_hint: 0, notify_data: imm };
                    (opc, abi::UrmaJfsWrBody { rw }, Op::Write)
                }
                SendOp::Read(r) => {
                    let src = remote_sg(self, &r);
                    let rw = abi::UrmaRwWr { src, dst: local, target_hint: 0, notify_data: 0 };
                    (URMA_OPC_READ, abi::UrmaJfsWrBody { rw }, Op::Read)
                }
                SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. } => {
                    return Err(Error::Unsupported(format!("{} on the urma backend", wr.op.name())));
                }
            };
            self.book.shared.rings.send.set(index, wr.wr_id, op);
            let next = wr_chain::next(&mut self.wrs, i, n);
            self.wrs[i] = abi::UrmaJfsWr {
                opcode,
                flag: wr_flags(wr.flags),
                tjetty,
                user_ctx: encode_user_ctx(self.book.shared.tag, epoch, false, index),
                body,
                next,
            };
        }
        let mut bad: *mut abi::UrmaJfsWr = std::ptr::null_mut();
        // SAFETY: the chain of `n` WRs, their SGE lists and the segments they name live until the
        // call returns (local segments are held by `regions`, imports by this queue); the jetty is
        // live; `bad` is a valid out-pointer (the library requires one).
        let rc = unsafe { (ctx.lib.post_jetty_send_wr)(self.jetty, self.wrs.as_mut_ptr(), &mut bad) };
        drop(regions);
        if rc != URMA_SUCCESS {
            let posted = posted_before(bad, self.wrs.as_ptr(), n);
            self.book.posted_send(posted);
            return Err(status_error(
                "urma_post_jetty_send_wr",
                rc,
                &wr_chain::refusal("request", posted, n, format_args!("jetty {}", self.book.shared.qpn())),
            ));
        }
        self.book.posted_send(n);
        Ok(())
    }

    fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> Result<()> {
        if self.srq.is_some() {
            return Err(invalid(format!(
                "jetty {} takes its receives from a shared receive queue (a shared JFR): post them there",
                self.book.shared.qpn()
            )));
        }
        self.book.need_ready_or_error("post_recv")?;
        if self.jetty.is_null() {
            return Err(Error::Device("the queue lost its jetty in a failed reset; drop it".into()));
        }
        if wrs.is_empty() {
            return Ok(());
        }
        let max_sge = self.config.max_recv_sge as usize;
        self.book.check_recv(wrs, max_sge)?;
        // A borrow that does not hold `self` (the loop below writes the queue's buffers) and costs
        // no reference count: `self.ctx` is set once at creation and outlives this call.
        let ctx_ptr = Arc::as_ptr(&self.ctx);
        // SAFETY: `self.ctx` keeps the context alive for the whole call and is never replaced.
        let ctx: &Context = unsafe { &*ctx_ptr };
        let regions = ctx.regions.read().unwrap_or_else(|e| e.into_inner());
        let n = wrs.len();
        let (recv_head, epoch) = (self.book.recv_head(), self.book.epoch());
        for (i, wr) in wrs.iter().enumerate() {
            let index = recv_head.wrapping_add(i as u32);
            let base = i * max_sge;
            for (k, s) in wr.sges.iter().enumerate() {
                let (seg, _) = local_seg(&regions, &ctx.poison, s);
                self.recv_sges[base + k] = abi::UrmaSge {
                    addr: s.addr,
                    len: s.len,
                    tseg: seg.tseg,
                    user_tseg: std::ptr::null_mut(),
                };
            }
            self.book.shared.rings.recv.set(index, wr.wr_id, Op::Recv);
            let next = wr_chain::next(&mut self.recv_wrs, i, n);
            self.recv_wrs[i] = abi::UrmaJfrWr {
                src: abi::UrmaSg {
                    // SAFETY: `base <= (recv_depth - 1) * max_sge`, in bounds.
                    sge: unsafe { self.recv_sges.as_mut_ptr().add(base) },
                    num_sge: wr.sges.len() as u32,
                },
                user_ctx: encode_user_ctx(self.book.shared.tag, epoch, true, index),
                next,
            };
        }
        let mut bad: *mut abi::UrmaJfrWr = std::ptr::null_mut();
        // SAFETY: as in post_send.
        let rc = unsafe { (ctx.lib.post_jetty_recv_wr)(self.jetty, self.recv_wrs.as_mut_ptr(), &mut bad) };
        drop(regions);
        if rc != URMA_SUCCESS {
            let posted = posted_before(bad, self.recv_wrs.as_ptr(), n);
            self.book.posted_recv(posted);
            return Err(status_error(
                "urma_post_jetty_recv_wr",
                rc,
                &wr_chain::refusal("receive", posted, n, format_args!("jetty {}", self.book.shared.qpn())),
            ));
        }
        self.book.posted_recv(n);
        Ok(())
    }
}

impl Drop for UrmaQueue {
    fn drop(&mut self) {
        self.book.shared.rings.kill();
        if !self.jetty.is_null() {
            self.disconnect();
            // SAFETY: live, deleted once, the jetty before its JFR (a shared JFR is deleted by its
            // shared queue's last holder: `self.srq` is dropped after this).
            unsafe {
                (self.ctx.lib.delete_jetty)(self.jetty);
                if self.srq.is_none() {
                    (self.ctx.lib.delete_jfr)(self.jfr);
                }
            }
        }
        self.send_cq.feeders.detach_later();
        self.recv_cq.feeders.detach_later();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_ctx_round_trips() {
        for (t, e, r, i) in
            [(0u16, 0u16, false, 0u32), (0xffff, 0x7fff, true, u32::MAX), (7, 300, true, 12345)]
        {
            assert_eq!(decode_user_ctx(encode_user_ctx(t, e, r, i)), (t, e, r, i));
        }
        // The epoch keeps 15 bits.
        assert_eq!(decode_user_ctx(encode_user_ctx(1, 0x8001, false, 2)).1, 1);
    }

    #[test]
    fn signaled_records_retire_earlier_slots_and_stale_epochs_vanish() {
        let shared = QueueShared {
            tag: 3,
            qpn: AtomicU32::new(9),
            rings: Rings::new(4, 4, 5, None),
            peers: Peers::new(),
        };
        let book = QueueBook::new(Arc::new(shared), 5);
        book.set_tracked(QueueState::Ready);
        let q = &book.shared;
        for i in 0..3 {
            q.rings.send.set(i, 100 + u64::from(i), Op::Write);
        }
        assert_eq!(q.rings.send.free(3), 1);
        let d = q.complete(encode_user_ctx(3, 5, false, 2), true).unwrap();
        assert_eq!((d.user_wr_id, d.op), (102, Op::Write));
        assert_eq!(q.rings.send.free(3), 4);
        assert!(q.complete(encode_user_ctx(3, 4, false, 3), false).is_none());
        assert_eq!(q.rings.state(), QueueState::Ready);
        q.rings.recv.set(0, 7, Op::Recv);
        assert_eq!(q.complete(encode_user_ctx(3, 5, true, 0), false).unwrap().user_wr_id, 7);
        assert_eq!(q.rings.state(), QueueState::Error);
    }

    #[test]
    fn peers_remember_the_last_two_bindings() {
        let p = Peers::new();
        let eid = |b: u8| abi::UrmaEid { raw: [b; 16] };
        let id = |b: u8, id: u32| abi::UrmaJettyId { eid: eid(b), uasid: 0, id };
        assert!(!p.contains(&id(0, u32::MAX - 1)));
        p.set(&eid(1), 10);
        assert!(p.contains(&id(1, 10)));
        assert!(!p.contains(&id(2, 10)), "the EID counts, not only the jetty id");
        p.set(&eid(1), 11);
        assert!(p.contains(&id(1, 10)) && p.contains(&id(1, 11)));
        p.set(&eid(2), 12);
        assert!(!p.contains(&id(1, 10)), "two bindings back is forgotten");
        assert!(p.contains(&id(1, 11)) && p.contains(&id(2, 12)));
    }

    #[test]
    fn wr_flags_map_signaled_to_complete_enable() {
        assert_eq!(wr_flags(WrFlags::SIGNALED), WR_FLAG_COMPLETE_ENABLE);
        assert_eq!(wr_flags(WrFlags::empty()), 0);
        assert_eq!(
            wr_flags(WrFlags::INLINE | WrFlags::FENCE | WrFlags::SOLICITED),
            WR_FLAG_INLINE | WR_FLAG_FENCE | WR_FLAG_SOLICITED_ENABLE
        );
    }
}
