//! Shared receive queues: an `ibv_srq`, and the slot table that maps the `wr_id`s libibverbs
//! sees back to the user's.
//!
//! The slot table, shared with the URMA backend, is [`crate::shared_slots`]: the receives
//! complete on the CQs of whichever queues took them, in any order, so its slots are freed one
//! by one.
//!
//! The `wr_id` libibverbs sees is `SRQ_BIT | id << 32 | slot`: the poller of a queue on a shared
//! queue tells its receive completions by the bit, and the shared queue by its 14-bit `id`, so a
//! completion whose queue is gone (destroyed with it still in the CQ) still frees its slot: the
//! CQ keeps the slot tables of the shared queues its queues used ([`super::cq::CqShared`]). That
//! holds where the provider keeps a destroyed QP's completions in the CQ (rxe); one that purges
//! them at destroy (mlx5) leaves no completion to free the slot, which then stays busy for the
//! shared queue's life: poll a queue's receive CQ before destroying it. It carries no queue epoch (the poster cannot know which
//! queue will take the receive), so a queue reset does not hide its receive completions still in
//! the CQ from before the reset (mlx5-class providers purge them; rxe does not).

use super::device::Context;
use super::tables::{errno, verb_error};
use crate::shared_slots::{self, SharedSlots, SlotPoster};
use crate::wr_chain;
use crate::{Error, RecvWr, Result, Sge, SharedRecv};
use rdma_sys::*;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Marks the `wr_id` of a shared queue's receive (bits 48.. are a queue's epoch, 47 its receive
/// bit, 0..32 a slot).
pub(crate) const SRQ_BIT: u64 = 1 << 46;
const INDEX_MASK: u64 = 0xffff_ffff;
/// Bits 32..46 of a shared receive's `wr_id`: its shared queue's id.
const ID_SHIFT: u32 = 32;
const ID_MASK: u64 = (1 << 14) - 1;

/// Ids of shared queues, unique among the ones alive together (14 bits, wrapping).
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// The shared queue id and the slot a shared receive's `wr_id` carries.
pub(crate) fn locate(wr_id: u64) -> (u64, usize) {
    ((wr_id >> ID_SHIFT) & ID_MASK, (wr_id & INDEX_MASK) as usize)
}

/// The `ibv_srq`; destroyed when the handle and every queue created on it are gone.
pub(crate) struct SrqObj {
    pub(crate) srq: *mut ibv_srq,
    ctx: Arc<Context>,
}

// SAFETY: an ibv_srq may be posted to from any thread (the provider locks); the handle that posts
// takes `&mut self`.
unsafe impl Send for SrqObj {}
// SAFETY: as above; shared references only read the pointer.
unsafe impl Sync for SrqObj {}

impl SrqObj {
    pub(crate) fn ctx(&self) -> &Arc<Context> {
        &self.ctx
    }
}

impl Drop for SrqObj {
    fn drop(&mut self) {
        // SAFETY: live and destroyed once; no queue uses it any more (each holds this object).
        let rc = unsafe { ibv_destroy_srq(self.srq) };
        debug_assert_eq!(rc, 0, "ibv_destroy_srq on {} failed", self.ctx.name);
    }
}

/// The slot table the pollers of the queues on a shared queue resolve completions with.
pub(crate) type SrqSlots = SharedSlots;

/// A shared receive queue on a verbs device (see [`crate::SharedRecv`]).
pub struct VerbsSharedRecv {
    pub(crate) obj: Arc<SrqObj>,
    pub(crate) slots: Arc<SrqSlots>,
    depth: u32,
    max_sge: u32,
    poster: SlotPoster,
    wrs: Box<[ibv_recv_wr]>,
    sges: Box<[ibv_sge]>,
}

// SAFETY: the buffers are plain data owned by this handle, which posts through `&mut self`.
unsafe impl Send for VerbsSharedRecv {}

impl std::fmt::Debug for VerbsSharedRecv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsSharedRecv")
            .field("depth", &self.depth)
            .field("max_sge", &self.max_sge)
            .field("posted", &self.poster.posted())
            .finish_non_exhaustive()
    }
}

// SAFETY (for the zeroed values below): ibv_recv_wr, ibv_sge and ibv_srq_init_attr are C structs
// of integers and raw pointers: all-zero is valid.
fn zeroed<T>() -> T {
    // SAFETY: only instantiated with the plain-old-data types listed above.
    unsafe { std::mem::zeroed() }
}

impl VerbsSharedRecv {
    pub(crate) fn new(ctx: &Arc<Context>, depth: u32, max_sge: u32) -> Result<Self> {
        let none = "shared receive queues (max_srq 0)";
        shared_slots::check_config(&ctx.caps, &ctx.name, depth, max_sge, u32::MAX, none)?;
        let mut init: ibv_srq_init_attr = zeroed();
        init.attr.max_wr = depth;
        init.attr.max_sge = max_sge;
        // SAFETY: the PD is live; `init` is a valid in/out pointer.
        let srq = unsafe { ibv_create_srq(ctx.pd, &mut init) };
        if srq.is_null() {
            return Err(verb_error(
                "ibv_create_srq",
                errno(),
                &format!("a shared receive queue of {depth} receives of {max_sge} SGEs on {}", ctx.name),
            ));
        }
        let slots = Arc::new(SrqSlots::new(NEXT_ID.fetch_add(1, Ordering::Relaxed) & ID_MASK, depth));
        Ok(VerbsSharedRecv {
            obj: Arc::new(SrqObj { srq, ctx: ctx.clone() }),
            slots,
            depth,
            max_sge,
            poster: SlotPoster::new(depth),
            wrs: (0..depth).map(|_| zeroed()).collect(),
            sges: (0..depth as usize * max_sge as usize).map(|_| zeroed()).collect(),
        })
    }
}

fn fill_sges(dst: &mut [ibv_sge], src: &[Sge]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = ibv_sge { addr: s.addr, length: s.len, lkey: s.lkey };
    }
}

impl SharedRecv for VerbsSharedRecv {
    fn depth(&self) -> u32 {
        self.depth
    }

    fn max_sge(&self) -> u32 {
        self.max_sge
    }

    fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> Result<()> {
        if wrs.is_empty() {
            return Ok(());
        }
        let max_sge = self.max_sge as usize;
        self.poster.check_batch(&self.slots, wrs, max_sge)?;
        let n = wrs.len();
        for (i, wr) in wrs.iter().enumerate() {
            let slot = self.poster.take(&self.slots, i, wr.wr_id);
            let sges = &mut self.sges[i * max_sge..i * max_sge + wr.sges.len()];
            fill_sges(sges, wr.sges);
            let sg_list = sges.as_mut_ptr();
            let next = wr_chain::next(&mut self.wrs, i, n);
            let w = &mut self.wrs[i];
            w.wr_id = SRQ_BIT | self.slots.id << ID_SHIFT | u64::from(slot);
            w.next = next;
            w.sg_list = sg_list;
            w.num_sge = wr.sges.len() as i32;
        }
        let mut bad: *mut ibv_recv_wr = std::ptr::null_mut();
        // SAFETY: the chain and its SGE lists live in this handle's buffers for the call; the SRQ
        // is live. Receive memory is checked by the device through the lkeys.
        let rc = unsafe { ibv_post_srq_recv(self.obj.srq, self.wrs.as_mut_ptr(), &mut bad) };
        if rc != 0 {
            let posted = wr_chain::posted_before(bad, self.wrs.as_ptr(), n);
            self.poster.finish(&self.slots, posted, n);
            return Err(verb_error(
                "ibv_post_srq_recv",
                rc,
                &wr_chain::refusal(
                    "receive",
                    posted,
                    n,
                    format_args!("a shared receive queue of {}", self.obj.ctx.name),
                ),
            ));
        }
        self.poster.finish(&self.slots, n, n);
        Ok(())
    }

    fn destroy(self) -> Result<(), (Self, Error)> {
        let users = Arc::strong_count(&self.obj) - 1;
        if users > 0 {
            let e = Error::Busy(format!(
                "the shared receive queue is used by {users} queue(s) (EBUSY): drop them before destroying it"
            ));
            return Err((self, e));
        }
        Ok(())
    }
}
