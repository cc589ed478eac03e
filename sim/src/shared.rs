//! Objects shared between the driver and the device: a queue's rings, side tables and state, and
//! a completion queue's ring and event machinery.

use crate::attach::AttachTable;
use crate::eventfd::EventFd;
use crate::events::ChannelShared;
use crate::layout::Cqe;
use crate::ring::{CqRing, WorkRing};
use crate::sync::{AtomicBool, AtomicU32, AtomicU8, Mutex, Ordering, UnsafeCell};
use bypass_hal::{QueueConfig, QueueState, Status};
use std::sync::Arc;

/// Queue state as a byte, for the atomic the driver reads.
pub(crate) fn state_to_u8(s: QueueState) -> u8 {
    match s {
        QueueState::Reset => 0,
        QueueState::Ready => 1,
        QueueState::Error => 2,
    }
}

pub(crate) fn state_from_u8(v: u8) -> QueueState {
    match v {
        1 => QueueState::Ready,
        2 => QueueState::Error,
        _ => QueueState::Reset,
    }
}

/// A slot-indexed table of `wr_id`s, written by the poster, read by the poller. The ring
/// protocol orders the two: a slot is written before its doorbell and read after its CQE.
#[derive(Debug)]
pub(crate) struct SideTable(Box<[UnsafeCell<u64>]>);

impl SideTable {
    pub(crate) fn new(depth: u32) -> Self {
        SideTable((0..depth).map(|_| UnsafeCell::new(0)).collect())
    }
    /// # Safety
    /// Only the poster calls this, for a slot the device has not yet seen (before the doorbell).
    pub(crate) unsafe fn set(&self, index: u32, wr_id: u64) {
        let i = index as usize & (self.0.len() - 1);
        // SAFETY: by the contract nobody else reads or writes this slot now.
        self.0[i].with_mut(|p| unsafe { *p = wr_id });
    }
    /// # Safety
    /// Only the poller calls this, for a slot whose completion it has just read; or (for a
    /// shared receive ring) the device, for a slot below the producer index it acquired, which
    /// the poster does not rewrite until the device frees it.
    pub(crate) unsafe fn get(&self, index: u32) -> u64 {
        let i = index as usize & (self.0.len() - 1);
        // SAFETY: the completion (acquired) happens after the poster's write; the poster does not
        // rewrite the slot until the poller releases it.
        self.0[i].with(|p| unsafe { *p })
    }
}

// SAFETY: access is ordered by the ring protocol described on the type.
unsafe impl Sync for SideTable {}
// SAFETY: plain owned data.
unsafe impl Send for SideTable {}

/// The driver-visible half of a queue.
#[derive(Debug)]
pub(crate) struct QueueShared {
    pub nic: u32,
    pub qpn: u32,
    pub config: QueueConfig,
    pub sq: WorkRing,
    pub rq: WorkRing,
    pub sq_ids: SideTable,
    pub rq_ids: SideTable,
    /// Send slots below this index are free again (advanced by the poller).
    pub sq_ci: AtomicU32,
    /// Receive slots below this index are free again (advanced by the poller).
    pub rq_ci: AtomicU32,
    /// The queue state, written by the device.
    pub state: AtomicU8,
    /// The first PSN this queue sends after its next connect.
    pub psn: AtomicU32,
    /// Bumped by every reset; CQEs carry it so that the poller drops those of an earlier life.
    pub epoch: AtomicU32,
    /// The shared receive queue this queue takes its receives from (`None`: its own `rq`, which
    /// the driver fills). With one, the device is the producer of `rq` and `rq_ids`: it copies
    /// each receive it takes from the shared ring into `rq` (see [`SrqShared`]).
    pub srq: Option<Arc<SrqShared>>,
    /// `epoch` when the queue was created: CQEs of an earlier epoch belong to a destroyed queue
    /// that had the same number (see `device::SLOT_BITS`).
    pub first_epoch: u32,
}

impl QueueShared {
    pub(crate) fn state(&self) -> QueueState {
        state_from_u8(self.state.load(Ordering::Acquire))
    }
    pub(crate) fn set_state(&self, s: QueueState) {
        self.state.store(state_to_u8(s), Ordering::Release);
    }
}

/// A shared receive queue as driver and device see it: a receive ring the driver fills and the
/// device takes from, for every queue created on it, in posting order.
///
/// When a queue on it needs a receive, the device (under its lock, so queues of one NIC never
/// race for a slot) copies the next shared WQE into that queue's own receive ring and its
/// `wr_id` into the queue's side table, then frees the shared slot at once. From there the
/// receive is the queue's: its completion, its flush on ERROR, and the freeing of its slot by the
/// poller follow the queue's own ring, so completions may be polled from any CQ in any order
/// without the shared ring caring (what a free list does on hardware).
#[derive(Debug)]
pub(crate) struct SrqShared {
    /// The NIC it belongs to.
    pub nic: u32,
    /// Most SGEs per receive.
    pub max_sge: u32,
    pub ring: WorkRing,
    pub ids: SideTable,
    /// Slots below this index are free again: advanced by the device as it takes receives (it
    /// is the ring's consumer and fetch index at once).
    pub ci: AtomicU32,
    /// Live queues created on it (destroy is refused while non-zero).
    pub users: AtomicU32,
}

/// Arm states of a CQ.
pub(crate) mod armed {
    pub const NO: u8 = 0;
    pub const ANY: u8 = 1;
    pub const SOLICITED: u8 = 2;
}

/// A completion queue as both sides see it.
#[derive(Debug)]
pub(crate) struct CqShared {
    pub ring: CqRing,
    /// Producer index; only the device (under its lock) touches it.
    pub pi: AtomicU32,
    pub armed: AtomicU8,
    pub event: EventFd,
    /// Set once the device had to drop a completion.
    pub overflow: AtomicBool,
    /// The queues completing to this CQ, keyed by their slot (`device::slot_of` their number)
    /// and sized by how many there are: the poller maps CQEs to side tables with its copy, taken
    /// when `attach_pending`.
    pub attach: Mutex<AttachTable<Arc<QueueShared>>>,
    pub attach_pending: AtomicBool,
    /// The owning NIC's count of armed CQs.
    pub nic_armed: Arc<crate::nic::ArmedCount>,
    /// What `EventChannel::take_events` reports for this CQ.
    pub id: u64,
    /// The shared channel this CQ's events go to (`None`: its own `event`).
    pub channel: Option<Arc<ChannelShared>>,
}

impl CqShared {
    /// Driver side: arms for one event.
    pub(crate) fn arm(&self, mode: u8) {
        if self.armed.swap(mode, Ordering::AcqRel) == armed::NO {
            self.nic_armed.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Raises the CQ's one event if it is armed, and disarms it (whoever disarms first fires, so
    /// a device push and an arm that finds completions waiting never both fire).
    pub(crate) fn fire_if_armed(&self) {
        if self.armed.swap(armed::NO, Ordering::AcqRel) != armed::NO {
            self.nic_armed.fetch_sub(1, Ordering::AcqRel);
            match &self.channel {
                Some(c) => c.fire(self.id),
                None => self.event.signal(),
            }
        }
    }

    /// Device side: appends a CQE and raises the event if armed for it. Returns false when the
    /// ring was full (a CQ overflow): the CQE is lost, the overflow is recorded for the poller,
    /// and the caller must fail the queue, as hardware does.
    pub(crate) fn push(&self, cqe: &Cqe) -> bool {
        let pi = self.pi.load(Ordering::Relaxed);
        // SAFETY: the device lock makes the device the ring's only producer.
        if unsafe { self.ring.write(pi, cqe) } {
            self.pi.store(pi.wrapping_add(1), Ordering::Relaxed);
        } else {
            self.overflow.store(true, Ordering::Release);
            // A waiter on the CQ's event must learn of it too (its next poll reports it).
            self.fire_if_armed();
            return false;
        }
        let mode = self.armed.load(Ordering::Acquire);
        if mode != armed::NO {
            let wake = mode == armed::ANY
                || cqe.flags & crate::layout::cqe_flags::SOLICITED != 0
                || cqe.status != Status::Success;
            if wake {
                self.fire_if_armed();
            }
        }
        true
    }
}
