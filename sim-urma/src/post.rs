//! The data path: `urma_post_jetty_send_wr` and `urma_post_jetty_recv_wr` translate URMA work
//! requests into sim work requests (SGE segments resolved to keys under one registry lock) and
//! post them in chunks of [`CHUNK`], one doorbell per chunk, without allocating.

use crate::ffi::{self, inval, Fail, Res};
use crate::jetty::{jetty_of, tjetty_of, Jetty, JettyInner, TargetJetty};
use crate::jfr::{jfr_of, JfrMode, PendingRecv};
use crate::seg::{lkey_in, rkey_in};
use bypass_hal::SharedRecv as _;
use bypass_hal::{Queue, QueueState, RecvWr, RemoteAddr, RemoteKey, SendOp, SendWr, Sge, WrFlags};
use bypass_sim::layout::MAX_SGE;
use bypass_sim::{Dest, SimSharedRecv};
use bypass_urma_abi as abi;
use bypass_urma_abi::consts::*;
use bypass_urma_abi::status::*;
use std::mem::MaybeUninit;

/// Work requests translated before one post.
pub(crate) const CHUNK: usize = 16;

/// One translated work request (a jetty keeps [`CHUNK`] of them, so a post fills them in place).
#[derive(Clone, Copy)]
pub(crate) struct Tr {
    wr_id: u64,
    op: SendOp,
    flags: WrFlags,
    n: usize,
    sges: [Sge; MAX_SGE],
    /// UM: where the datagram goes.
    dest: Dest,
}

pub(crate) const EMPTY: Tr = Tr {
    wr_id: 0,
    op: SendOp::Send,
    flags: WrFlags::empty(),
    n: 0,
    sges: [Sge::new(0, 0, 0); MAX_SGE],
    dest: Dest { ah: 0, qpn: 0, source: 0 },
};

/// Resolves a local scatter/gather list into `out`.
///
/// # Safety
/// A non-NULL `sg.sge` points to `sg.num_sge` SGEs (the API's contract).
unsafe fn local_sges(sg: &abi::UrmaSg, max: u32, out: &mut Tr) -> Res<()> {
    if sg.num_sge > max {
        return Err(inval(format!("{} SGEs exceed the queue's max_sge {max}", sg.num_sge)));
    }
    if sg.num_sge > 0 && sg.sge.is_null() {
        return Err(inval("sg.sge is NULL with num_sge > 0"));
    }
    for i in 0..sg.num_sge as usize {
        // SAFETY: i < num_sge, which the caller vouches for.
        let s = unsafe { sg.sge.add(i).read_unaligned() };
        out.sges[i] = Sge::new(s.addr, s.len, lkey_in(s.tseg)?);
    }
    out.n = sg.num_sge as usize;
    Ok(())
}

/// The remote address of a one-SGE remote list.
///
/// # Safety
/// As for [`local_sges`].
unsafe fn remote(sg: &abi::UrmaSg, need: u32) -> Res<RemoteAddr> {
    if sg.num_sge != 1 || sg.sge.is_null() {
        return Err(inval(format!("the remote side of a WRITE or READ is one SGE, not {}", sg.num_sge)));
    }
    // SAFETY: one SGE, non-NULL.
    let s = unsafe { sg.sge.read_unaligned() };
    // SAFETY: the SGE's user_tseg is the caller's, valid per the API.
    let key = unsafe { rkey_in(s.tseg, s.user_tseg, need)? };
    Ok(RemoteAddr { addr: s.addr, key: RemoteKey::from_rkey(key) })
}

fn imm32(v: u64) -> Res<u32> {
    u32::try_from(v).map_err(|_| inval(format!("immediate {v:#x}: the simulator carries 32-bit immediates")))
}

/// One URMA send WR into `out`.
///
/// # Safety
/// `wr` is a readable `urma_jfs_wr_t` whose SGE lists are valid (the API's contract).
///
/// `wr.tjetty` is not read: an RC jetty sends to the target it is bound to, whatever a WR names
/// (UDMA's provider takes the bound target on RC and `wr->tjetty` only on RM and UM, and URPC
/// posts replies naming a target it built itself).
unsafe fn translate(wr: &abi::UrmaJfsWr, max_sge: u32, out: &mut Tr) -> Res<()> {
    let mut flags = WrFlags::empty();
    for (bit, f) in [
        (WR_FLAG_COMPLETE_ENABLE, WrFlags::SIGNALED),
        (WR_FLAG_INLINE, WrFlags::INLINE),
        (WR_FLAG_FENCE, WrFlags::FENCE),
        (WR_FLAG_SOLICITED_ENABLE, WrFlags::SOLICITED),
    ] {
        if wr.flag & bit != 0 {
            flags |= f;
        }
    }
    out.wr_id = wr.user_ctx;
    out.flags = flags;
    // In every arm: the opcode says which union arm the caller filled, and the SGE lists are the
    // caller's, valid per the API (this function's contract).
    out.op = match wr.opcode {
        URMA_OPC_SEND | URMA_OPC_SEND_IMM => {
            // SAFETY: a SEND fills the `send` arm.
            let s = unsafe { wr.body.send };
            // SAFETY: its SGE list is the caller's (this function's contract).
            unsafe { local_sges(&s.src, max_sge, out)? };
            if wr.opcode == URMA_OPC_SEND { SendOp::Send } else { SendOp::SendImm(imm32(s.imm_data)?) }
        }
        URMA_OPC_WRITE | URMA_OPC_WRITE_IMM => {
            // SAFETY: a WRITE fills the `rw` arm.
            let rw = unsafe { wr.body.rw };
            // SAFETY: its SGE lists are the caller's (this function's contract).
            unsafe { local_sges(&rw.src, max_sge, out)? };
            // SAFETY: as above.
            let to = unsafe { remote(&rw.dst, URMA_ACCESS_WRITE)? };
            if wr.opcode == URMA_OPC_WRITE { SendOp::Write(to) } else { SendOp::WriteImm(to, imm32(rw.notify_data)?) }
        }
        URMA_OPC_READ => {
            // SAFETY: a READ fills the `rw` arm.
            let rw = unsafe { wr.body.rw };
            // SAFETY: its SGE lists are the caller's (this function's contract).
            let from = unsafe { remote(&rw.src, URMA_ACCESS_READ)? };
            // SAFETY: as above.
            unsafe { local_sges(&rw.dst, max_sge, out)? };
            SendOp::Read(from)
        }
        op => {
            return Err(inval(format!(
                "opcode {op:#x} is not simulated: SEND 0x40, SEND_IMM 0x41, WRITE 0x00, WRITE_IMM 0x01 and READ 0x10 are (no atomics)"
            )))
        }
    };
    Ok(())
}

fn post_chunk(q: &mut bypass_sim::SimQueue, trs: &[Tr]) -> Res<()> {
    let mut wrs = [const { MaybeUninit::<SendWr<'_>>::uninit() }; CHUNK];
    for (w, t) in wrs.iter_mut().zip(trs) {
        w.write(SendWr { wr_id: t.wr_id, op: t.op, sges: &t.sges[..t.n], flags: t.flags });
    }
    // SAFETY: the first trs.len() (<= CHUNK) entries were written just above.
    let wrs = unsafe { std::slice::from_raw_parts(wrs.as_ptr().cast::<SendWr<'_>>(), trs.len()) };
    q.post_send(wrs)?;
    Ok(())
}

/// The destination key of a UM target: its queue, GID and port.
fn dest_key(tj: &TargetJetty) -> crate::um::DestKey {
    (tj.peer.qpn, tj.peer.gid, tj.peer.lid)
}

/// The WR's RM or UM target jetty, checked against the sending jetty's `mode`.
fn um_target(w: &abi::UrmaJfsWr, mode: u32) -> Res<std::sync::Arc<TargetJetty>> {
    let tj = tjetty_of(w.tjetty)?;
    if tj.trans_mode != mode {
        return Err(inval(format!(
            "wr->tjetty was imported with trans_mode {}: a jetty of trans_mode {mode} sends to targets of its own mode only",
            tj.trans_mode
        )));
    }
    Ok(tj)
}

/// `urma_post_jetty_send_wr` on an RM or UM jetty: each WR names its target in `wr->tjetty`; SEND,
/// SEND_IMM, WRITE, WRITE_IMM and READ, one MTU each (the device's datagram service). The targets are resolved first (a new one gets an address handle, which may
/// reach its device over the wire), so an unknown target fails the post before anything is sent.
///
/// # Safety
/// `wr` is a NULL-terminated list of readable WRs and `bad_wr` is writable (the API's contract).
unsafe fn post_um(
    j: &Jetty,
    g: &mut JettyInner,
    wr: *mut abi::UrmaJfsWr,
    bad_wr: *mut *mut abi::UrmaJfsWr,
) -> Res<()> {
    let limit = 2 * j.c_depth() as usize + CHUNK;
    let (mut p, mut seen) = (wr, 0usize);
    while !p.is_null() && seen <= limit {
        seen += 1;
        // SAFETY: a non-NULL element of the caller's list.
        let w = unsafe { p.read_unaligned() };
        let found = um_target(&w, j.trans_mode).and_then(|tj| {
            let key = dest_key(&tj);
            if !g.dests.iter().any(|(k, _)| *k == key) {
                let d = g.q.add_dest(&tj.peer).map_err(|e| {
                    ffi::fail(URMA_FAIL, format!("cannot reach the target jetty's device: {e}"))
                })?;
                g.dests.push((key, d));
            }
            Ok(())
        });
        if let Err(f) = found {
            // SAFETY: bad_wr is writable (checked non-NULL by the caller).
            unsafe { *bad_wr = p };
            return Err(f);
        }
        p = w.next;
    }
    let (max_sge, mode) = (j.max_sge, j.trans_mode);
    let JettyInner { q, scratch, dests, .. } = g;
    let dests = &*dests;
    // SAFETY: as for RC: the caller's list, bounded by `limit`.
    unsafe {
        walk(
            scratch,
            wr,
            bad_wr,
            limit,
            |w| w.next,
            |w, out| {
                translate(w, max_sge, out)?;
                let tj = um_target(w, mode)?;
                let key = dest_key(&tj);
                out.dest = dests.iter().find(|(k, _)| *k == key).map(|(_, d)| *d).expect("resolved above");
                Ok(())
            },
            |trs| if trs.is_empty() { Ok(()) } else { post_um_chunk(q, trs) },
        )
    }
}

fn post_um_chunk(q: &mut bypass_sim::SimQueue, trs: &[Tr]) -> Res<()> {
    let mut wrs = [const { MaybeUninit::<SendWr<'_>>::uninit() }; CHUNK];
    let mut dests = [Dest { ah: 0, qpn: 0, source: 0 }; CHUNK];
    for ((w, d), t) in wrs.iter_mut().zip(dests.iter_mut()).zip(trs) {
        w.write(SendWr { wr_id: t.wr_id, op: t.op, sges: &t.sges[..t.n], flags: t.flags });
        *d = t.dest;
    }
    // SAFETY: the first `trs.len()` (at most CHUNK) elements were initialized just above.
    let wrs = unsafe { std::slice::from_raw_parts(wrs.as_ptr().cast::<SendWr<'_>>(), trs.len()) };
    q.post_datagrams(wrs, &dests[..trs.len()])?;
    Ok(())
}

fn post_recv_chunk(q: &mut bypass_sim::SimQueue, trs: &[Tr]) -> Res<()> {
    let mut wrs = [const { MaybeUninit::<RecvWr<'_>>::uninit() }; CHUNK];
    for (w, t) in wrs.iter_mut().zip(trs) {
        w.write(RecvWr { wr_id: t.wr_id, sges: &t.sges[..t.n] });
    }
    // SAFETY: the first trs.len() (<= CHUNK) entries were written just above.
    let wrs = unsafe { std::slice::from_raw_parts(wrs.as_ptr().cast::<RecvWr<'_>>(), trs.len()) };
    q.post_recv(wrs)?;
    Ok(())
}

/// Posts a linked list of WRs in chunks; `one` translates a WR. On failure, `*bad` is the first
/// WR not posted.
///
/// # Safety
/// `wr` heads a list of readable WRs linked by `next` (the API's contract).
unsafe fn walk<W>(
    trs: &mut [Tr; CHUNK],
    wr: *mut W,
    bad: *mut *mut W,
    limit: usize,
    next: impl Fn(&W) -> *mut W,
    mut one: impl FnMut(&W, &mut Tr) -> Res<()>,
    mut post: impl FnMut(&[Tr]) -> Res<()>,
) -> Res<()> {
    let (mut p, mut first, mut n, mut seen) = (wr, wr, 0usize, 0usize);
    let fail_at = |at: *mut W, f: Fail| {
        // SAFETY: `bad` was checked non-NULL by the caller.
        unsafe { *bad = at };
        f
    };
    while !p.is_null() {
        seen += 1;
        if seen > limit {
            post(&trs[..n]).map_err(|f| fail_at(first, f))?;
            return Err(fail_at(p, inval(format!("the WR list is longer than {limit} (a cycle in next?)"))));
        }
        // SAFETY: a non-NULL element of the caller's list.
        let w = unsafe { p.read_unaligned() };
        if let Err(f) = one(&w, &mut trs[n]) {
            post(&trs[..n]).map_err(|e| fail_at(first, e))?;
            return Err(fail_at(p, f));
        }
        n += 1;
        let after = next(&w);
        if n == CHUNK {
            post(&trs[..n]).map_err(|f| fail_at(first, f))?;
            n = 0;
            first = after;
        }
        p = after;
    }
    post(&trs[..n]).map_err(|f| fail_at(first, f))
}

/// `urma_post_jetty_send_wr`: WRs up to the bad one are posted; `*bad_wr` names the first that
/// was not. An unbound jetty refuses with URMA_EINVAL, a full send queue with URMA_EAGAIN.
#[no_mangle]
pub unsafe extern "C" fn urma_post_jetty_send_wr(
    jetty: *mut abi::UrmaJetty,
    wr: *mut abi::UrmaJfsWr,
    bad_wr: *mut *mut abi::UrmaJfsWr,
) -> UrmaStatus {
    ffi::status("urma_post_jetty_send_wr", || {
        let j = jetty_of(jetty)?;
        if bad_wr.is_null() {
            return Err(inval("bad_wr is NULL"));
        }
        let mut g = j.lock();
        if crate::jetty::connectionless(j.trans_mode) {
            // SAFETY: the caller's WR list and bad_wr, as for RC below.
            return unsafe { post_um(&j, &mut g, wr, bad_wr) };
        }
        if g.bound.is_none() {
            // SAFETY: non-NULL, writable per the API.
            unsafe { *bad_wr = wr };
            return Err(inval("the jetty is not bound: urma_import_jetty and urma_bind_jetty first"));
        }
        let limit = 2 * j.c_depth() as usize + CHUNK;
        let max_sge = j.max_sge;
        let JettyInner { q, scratch, .. } = &mut *g;
        // SAFETY: the caller's WR list, per the API.
        unsafe {
            walk(
                scratch,
                wr,
                bad_wr,
                limit,
                |w| w.next,
                |w, out| translate(w, max_sge, out),
                |trs| if trs.is_empty() { Ok(()) } else { post_chunk(q, trs) },
            )
        }
    })
}

/// `urma_post_jetty_recv_wr`: receives for the jetty's JFR. On a JFR of per-jetty rings they
/// are this jetty's (waiting on the JFR until the jetty is bound); on a shared JFR they go to the
/// JFR's ring, for any of its jettys, as `urma_post_jfr_wr` would.
#[no_mangle]
pub unsafe extern "C" fn urma_post_jetty_recv_wr(
    jetty: *mut abi::UrmaJetty,
    wr: *mut abi::UrmaJfrWr,
    bad_wr: *mut *mut abi::UrmaJfrWr,
) -> UrmaStatus {
    ffi::status("urma_post_jetty_recv_wr", || {
        let j = jetty_of(jetty)?;
        if bad_wr.is_null() {
            return Err(inval("bad_wr is NULL"));
        }
        let jfr = j.jfr.clone();
        if let Err(f) = jfr.check_ready() {
            // SAFETY: non-NULL, writable per the API.
            unsafe { *bad_wr = wr };
            return Err(f);
        }
        let limit = 2 * jfr.depth as usize + CHUNK;
        let max_sge = jfr.max_sge;
        if let JfrMode::Shared(ring, scratch) = &mut *jfr.mode() {
            // SAFETY: the caller's WR list, per the API.
            return unsafe { post_to_ring(ring, scratch, wr, bad_wr, limit, max_sge) };
        }
        let mut g = j.lock();
        let connected = g.q.state() != QueueState::Reset;
        let JettyInner { q, scratch, .. } = &mut *g;
        // SAFETY: the caller's WR list, per the API.
        unsafe {
            walk_recv(scratch, wr, bad_wr, limit, max_sge, |trs| {
                if connected {
                    return post_recv_chunk(q, trs);
                }
                let mut pending = jfr.pending.lock().unwrap_or_else(|e| e.into_inner());
                if pending.len() + trs.len() > jfr.depth as usize {
                    return Err(ffi::fail(
                        URMA_EAGAIN,
                        format!("the JFR holds {} receives already (depth {})", pending.len(), jfr.depth),
                    ));
                }
                pending.extend(
                    trs.iter().map(|t| PendingRecv { user_ctx: t.wr_id, sges: t.sges[..t.n].to_vec() }),
                );
                Ok(())
            })
        }
    })
}

/// [`walk`] over a receive WR list: each WR's `user_ctx` and SGEs; `post` gets each non-empty
/// chunk.
///
/// # Safety
/// As [`walk`]'s: `wr` heads a list of readable WRs linked by `next`; `bad_wr` is non-NULL.
unsafe fn walk_recv(
    scratch: &mut [Tr; CHUNK],
    wr: *mut abi::UrmaJfrWr,
    bad_wr: *mut *mut abi::UrmaJfrWr,
    limit: usize,
    max_sge: u32,
    mut post: impl FnMut(&[Tr]) -> Res<()>,
) -> Res<()> {
    // SAFETY: forwarded contract.
    unsafe {
        walk(
            scratch,
            wr,
            bad_wr,
            limit,
            |w| w.next,
            |w, out| {
                out.wr_id = w.user_ctx;
                local_sges(&w.src, max_sge, out) // the caller's SGE list (this function's contract)
            },
            |trs| if trs.is_empty() { Ok(()) } else { post(trs) },
        )
    }
}

/// Posts a receive WR list to a shared JFR's ring, in chunks.
///
/// # Safety
/// `wr` heads a list of readable WRs linked by `next`; `bad_wr` is non-NULL (checked by the caller).
unsafe fn post_to_ring(
    ring: &mut SimSharedRecv,
    scratch: &mut [Tr; CHUNK],
    wr: *mut abi::UrmaJfrWr,
    bad_wr: *mut *mut abi::UrmaJfrWr,
    limit: usize,
    max_sge: u32,
) -> Res<()> {
    // SAFETY: forwarded contract.
    unsafe {
        walk_recv(scratch, wr, bad_wr, limit, max_sge, |trs| {
            let mut wrs = [const { MaybeUninit::<RecvWr<'_>>::uninit() }; CHUNK];
            for (w, t) in wrs.iter_mut().zip(trs) {
                w.write(RecvWr { wr_id: t.wr_id, sges: &t.sges[..t.n] });
            }
            // SAFETY: the first trs.len() (<= CHUNK) entries were written just above.
            let wrs = std::slice::from_raw_parts(wrs.as_ptr().cast::<RecvWr<'_>>(), trs.len());
            ring.post_recv(wrs).map_err(|e| match e {
                    bypass_hal::Error::WouldBlock { free, .. } => ffi::fail(
                        URMA_EAGAIN,
                        format!("the JFR has room for {free} more receives: poll the receive completions of its jettys first"),
                    ),
                    e => Fail::from(e),
                })
        })
    }
}

/// `urma_post_jfr_wr`: receives for a JFR, taken by whichever of its jettys a message arrives on
/// next. A JFR posted this way before any jetty uses it becomes a shared ring; one whose jettys
/// each have their own ring (created naming the JFR's JFC in `shared.jfc`) refuses, saying so.
#[no_mangle]
pub unsafe extern "C" fn urma_post_jfr_wr(
    jfr: *mut abi::UrmaJfr,
    wr: *mut abi::UrmaJfrWr,
    bad_wr: *mut *mut abi::UrmaJfrWr,
) -> UrmaStatus {
    ffi::status("urma_post_jfr_wr", || {
        let r = jfr_of(jfr)?;
        if bad_wr.is_null() {
            return Err(inval("bad_wr is NULL"));
        }
        if let Err(f) = r.check_ready() {
            // SAFETY: non-NULL, writable per the API.
            unsafe { *bad_wr = wr };
            return Err(f);
        }
        let limit = 2 * r.depth as usize + CHUNK;
        let mut m = r.mode();
        r.make_shared(&mut m)?;
        match &mut *m {
            // SAFETY: the caller's WR list, per the API.
            JfrMode::Shared(ring, scratch) => unsafe {
                post_to_ring(ring, scratch, wr, bad_wr, limit, r.max_sge)
            },
            _ => {
                // SAFETY: non-NULL, writable per the API.
                unsafe { *bad_wr = wr };
                Err(inval(
                    "this JFR's jettys each keep their own receives in the simulator (they were created with \
                     the JFR's JFC in shared.jfc): post through urma_post_jetty_recv_wr, or create the jettys \
                     with shared.jfc NULL (or a JFC of their own) to share the JFR's receives",
                ))
            }
        }
    })
}
