//! Shared receive queues on URMA: a JFR of its own that several jettys share (`share_jfr = 1`,
//! `shared.jfr`), posted with `urma_post_jfr_wr`, and the slot table that maps the `user_ctx`s
//! liburma sees back to the user's `wr_id`s.
//!
//! URMA names a receive JFC at the JFR, but a jetty on a shared JFR may name its own
//! (`shared.jfc`), which is how each queue keeps the receive CQ the hal gives it. The JFR's own
//! JFC (one entry, no event channel) therefore never sees a record.
//!
//! The receives complete on the CQs of whichever queues took them, in any order, polled from any
//! thread, so the slots are freed one by one, with the slot table the verbs backend uses too
//! ([`crate::shared_slots`]). The `user_ctx` of a shared receive carries the reserved queue tag
//! [`SRQ_TAG`], the shared queue's 15-bit id (in the epoch field, which shared receives have no
//! use for) and the slot; it names no queue (the poster cannot know which will take it), so the
//! CQ finds the queue by the record's `remote_id`, the peer jetty its queue is bound to. A record
//! whose queue is gone (destroyed with the record still in the JFC) still frees its slot: the CQ
//! keeps the slot tables of the shared queues its queues used and finds this one by its id.

use super::device::Context;
use super::queue::encode_user_ctx;
use super::tables::{errno, status_error};
use crate::shared_slots::{self, SharedSlots, SlotPoster};
use crate::wr_chain;
use crate::{Error, RecvWr, Result, SharedRecv};
use bypass_urma_abi as abi;
use bypass_urma_abi::consts::*;
use bypass_urma_abi::status::URMA_SUCCESS;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The queue tag of a shared receive's `user_ctx` (no queue is given it).
pub(crate) const SRQ_TAG: u16 = 0;

/// Ids of shared queues, unique among the ones alive together (15 bits, wrapping).
static NEXT_ID: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(0);

/// The shared queue id and the slot a shared receive's `user_ctx` carries.
pub(crate) fn locate(user_ctx: u64) -> (u64, usize) {
    let (_, id, _, slot) = super::queue::decode_user_ctx(user_ctx);
    (u64::from(id), slot as usize)
}

/// The JFR and its placeholder JFC; deleted when the handle and every queue on it are gone.
pub(crate) struct SrqObj {
    pub(crate) jfr: *mut abi::UrmaJfr,
    jfc: *mut abi::UrmaJfc,
    ctx: Arc<Context>,
}

// SAFETY: a JFR may be posted to from any thread (the library locks unless asked not to, which
// this backend never does); the handle that posts takes `&mut self`.
unsafe impl Send for SrqObj {}
// SAFETY: as above; shared references only read the pointers.
unsafe impl Sync for SrqObj {}

impl SrqObj {
    pub(crate) fn ctx(&self) -> &Arc<Context> {
        &self.ctx
    }
}

impl Drop for SrqObj {
    fn drop(&mut self) {
        // SAFETY: live and deleted once, the JFR before its JFC; no jetty uses the JFR any more
        // (each queue on it holds this object).
        unsafe {
            (self.ctx.lib.delete_jfr)(self.jfr);
            (self.ctx.lib.delete_jfc)(self.jfc);
        }
    }
}

/// The slot table the pollers of the queues on a shared queue resolve records with (its id
/// is 15 bits).
pub(crate) type SrqSlots = SharedSlots;

/// A shared receive queue on a URMA device (see [`crate::SharedRecv`]).
pub struct UrmaSharedRecv {
    pub(crate) obj: Arc<SrqObj>,
    pub(crate) slots: Arc<SrqSlots>,
    depth: u32,
    max_sge: u32,
    poster: SlotPoster,
    wrs: Box<[abi::UrmaJfrWr]>,
    sges: Box<[abi::UrmaSge]>,
}

// SAFETY: the buffers are plain data owned by this handle, which posts through `&mut self`.
unsafe impl Send for UrmaSharedRecv {}

impl std::fmt::Debug for UrmaSharedRecv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UrmaSharedRecv")
            .field("depth", &self.depth)
            .field("max_sge", &self.max_sge)
            .field("posted", &self.poster.posted())
            .finish_non_exhaustive()
    }
}

impl UrmaSharedRecv {
    pub(crate) fn new(ctx: &Arc<Context>, depth: u32, max_sge: u32) -> Result<Self> {
        // A JFR's max_sge is a byte.
        shared_slots::check_config(&ctx.caps, &ctx.name, depth, max_sge, 255, "shared JFRs (max_jfr 0)")?;
        let lib = ctx.lib;
        let mut jfc_cfg =
            abi::UrmaJfcCfg { depth: 1, flag: 0, ceqn: 0, jfce: std::ptr::null_mut(), user_ctx: u64::MAX };
        // SAFETY: the context is live; the configuration is valid (no event channel).
        let jfc = unsafe { (lib.create_jfc)(ctx.ctx, &mut jfc_cfg) };
        if jfc.is_null() {
            return Err(status_error(
                "urma_create_jfc",
                errno(),
                &format!("the JFC of a shared JFR on {}", ctx.name),
            ));
        }
        let mut jfr_cfg = abi::UrmaJfrCfg {
            id: 0,
            depth,
            flag: URMA_TOKEN_PLAIN_TEXT & JFR_FLAG_TOKEN_POLICY_MASK,
            trans_mode: URMA_TM_RC,
            max_sge: max_sge as u8,
            // The default queue configuration's: URMA sets the RNR timer at the JFR, so the
            // queues on it cannot have their own.
            min_rnr_timer: abi::timers::min_rnr_timer_at_least(
                crate::QueueConfig::default().min_rnr_timer.duration(),
            ),
            jfc,
            token_value: abi::UrmaToken { token: ctx.jetty_token },
            user_ctx: 0,
        };
        // SAFETY: the context and the JFC are live; the configuration is valid.
        let jfr = unsafe { (lib.create_jfr)(ctx.ctx, &mut jfr_cfg) };
        if jfr.is_null() {
            let e = errno();
            // SAFETY: created above, used by nothing.
            unsafe { (lib.delete_jfc)(jfc) };
            return Err(status_error(
                "urma_create_jfr",
                e,
                &format!("a shared JFR of {depth} receives of {max_sge} SGEs on {}", ctx.name),
            ));
        }
        let slots =
            Arc::new(SrqSlots::new(u64::from(NEXT_ID.fetch_add(1, Ordering::Relaxed) & 0x7fff), depth));
        let zero_sge =
            abi::UrmaSge { addr: 0, len: 0, tseg: std::ptr::null_mut(), user_tseg: std::ptr::null_mut() };
        let zero_wr = abi::UrmaJfrWr {
            src: abi::UrmaSg { sge: std::ptr::null_mut(), num_sge: 0 },
            user_ctx: 0,
            next: std::ptr::null_mut(),
        };
        Ok(UrmaSharedRecv {
            obj: Arc::new(SrqObj { jfr, jfc, ctx: ctx.clone() }),
            slots,
            depth,
            max_sge,
            poster: SlotPoster::new(depth),
            wrs: (0..depth).map(|_| zero_wr).collect(),
            sges: (0..depth as usize * max_sge as usize).map(|_| zero_sge).collect(),
        })
    }
}

impl SharedRecv for UrmaSharedRecv {
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
        let obj = self.obj.clone();
        let ctx = obj.ctx();
        // Held across the post, as a queue's post holds it: a region cannot be unregistered
        // while the library may read its target segment.
        let regions = ctx.regions.read().unwrap_or_else(|e| e.into_inner());
        let n = wrs.len();
        for (i, wr) in wrs.iter().enumerate() {
            let slot = self.poster.take(&self.slots, i, wr.wr_id);
            let base = i * max_sge;
            for (k, s) in wr.sges.iter().enumerate() {
                let seg = regions.get(&s.lkey).copied().unwrap_or(ctx.poison);
                self.sges[base + k] = abi::UrmaSge {
                    addr: s.addr,
                    len: s.len,
                    tseg: seg.tseg,
                    user_tseg: std::ptr::null_mut(),
                };
            }
            let next = wr_chain::next(&mut self.wrs, i, n);
            self.wrs[i] = abi::UrmaJfrWr {
                src: abi::UrmaSg {
                    // SAFETY: `base <= (depth - 1) * max_sge`, in bounds of the buffer.
                    sge: unsafe { self.sges.as_mut_ptr().add(base) },
                    num_sge: wr.sges.len() as u32,
                },
                user_ctx: encode_user_ctx(SRQ_TAG, self.slots.id as u16, true, slot),
                next,
            };
        }
        let mut bad: *mut abi::UrmaJfrWr = std::ptr::null_mut();
        // SAFETY: the chain and its SGE lists live in this handle's buffers for the call, the
        // segments they name are held by `regions`; the JFR is live; `bad` is a valid out-pointer.
        let rc = unsafe { (ctx.lib.post_jfr_wr)(obj.jfr, self.wrs.as_mut_ptr(), &mut bad) };
        drop(regions);
        if rc != URMA_SUCCESS {
            let posted = wr_chain::posted_before(bad, self.wrs.as_ptr(), n);
            self.poster.finish(&self.slots, posted, n);
            return Err(status_error(
                "urma_post_jfr_wr",
                rc,
                &wr_chain::refusal("receive", posted, n, format_args!("a shared JFR of {}", ctx.name)),
            ));
        }
        self.poster.finish(&self.slots, n, n);
        Ok(())
    }

    fn destroy(self) -> Result<(), (Self, Error)> {
        let users = Arc::strong_count(&self.obj) - 1;
        if users > 0 {
            let e = Error::Busy(format!(
                "the shared JFR is used by {users} queue(s): drop them before destroying it"
            ));
            return Err((self, e));
        }
        Ok(())
    }
}
