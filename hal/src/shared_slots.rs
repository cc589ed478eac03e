//! The slot table of a shared receive queue and the checks of its configuration and batches,
//! common to the verbs and URMA backends.
//!
//! The receives of a shared queue complete on the CQs of whichever queues took them, in any
//! order, polled from any thread; so unlike a queue's side ring (retired in order) the slots here
//! are freed one by one: each has a busy flag the poster sets and the poller clears. The poster
//! ([`SlotPoster`]) counts free slots as posted minus completed (a counter the pollers advance)
//! so a batch is all-or-nothing, then takes free slots round-robin from a cursor. How a slot and
//! the table's id are carried in what the library sees (a `wr_id`, a `user_ctx`) is the
//! backend's business.

use crate::side_ring::{Done, Op};
use crate::{DeviceCaps, Error, RecvWr, Result};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

/// The slot table the pollers of the queues on a shared queue resolve completions with.
#[derive(Debug)]
pub(crate) struct SharedSlots {
    /// The id the backend puts in each receive's context, so an orphaned completion finds it.
    pub(crate) id: u64,
    wr_ids: Box<[AtomicU64]>,
    busy: Box<[AtomicBool]>,
    /// Receives completed (on any queue), advanced by the pollers.
    completed: AtomicU32,
}

impl SharedSlots {
    /// A table of `depth` free slots.
    pub(crate) fn new(id: u64, depth: u32) -> Self {
        SharedSlots {
            id,
            wr_ids: (0..depth).map(|_| AtomicU64::new(0)).collect(),
            busy: (0..depth).map(|_| AtomicBool::new(false)).collect(),
            completed: AtomicU32::new(0),
        }
    }

    /// Poller side: the completion of slot `slot` of the table numbered `id` (as decoded from
    /// the completion); `None` for another table's or a slot that is not outstanding.
    pub(crate) fn retire(&self, id: u64, slot: usize) -> Option<Done> {
        if id != self.id {
            return None;
        }
        let busy = self.busy.get(slot)?;
        let user_wr_id = self.wr_ids[slot].load(Ordering::Acquire);
        if !busy.swap(false, Ordering::AcqRel) {
            return None;
        }
        self.completed.fetch_add(1, Ordering::Release);
        Some(Done { user_wr_id, op: Op::Recv })
    }
}

/// The posting handle's side of a [`SharedSlots`]: its count of receives posted, its cursor,
/// and the slots the batch being posted took.
#[derive(Debug)]
pub(crate) struct SlotPoster {
    depth: u32,
    /// Receives posted (free = depth − (posted − completed)).
    posted: u32,
    cursor: u32,
    taken: Box<[u32]>,
}

impl SlotPoster {
    pub(crate) fn new(depth: u32) -> Self {
        SlotPoster { depth, posted: 0, cursor: 0, taken: vec![0; depth as usize].into() }
    }

    /// Receives posted so far (wrapping).
    pub(crate) fn posted(&self) -> u32 {
        self.posted
    }

    /// Checks a batch before anything is built: SGE counts (at most `max_sge` each), then room
    /// for all of it.
    pub(crate) fn check_batch(&self, slots: &SharedSlots, wrs: &[RecvWr<'_>], max_sge: usize) -> Result<()> {
        if let Some(wr) = wrs.iter().find(|w| w.sges.len() > max_sge) {
            return Err(Error::InvalidArgument(format!(
                "{} SGEs exceed the shared receive queue's max_sge {max_sge}",
                wr.sges.len()
            )));
        }
        self.check_room(slots, wrs.len())
    }

    /// Whether a batch of `wanted` fits: all or nothing.
    pub(crate) fn check_room(&self, slots: &SharedSlots, wanted: usize) -> Result<()> {
        let outstanding = self.posted.wrapping_sub(slots.completed.load(Ordering::Acquire));
        let free = self.depth.saturating_sub(outstanding);
        if wanted > free as usize {
            return Err(Error::WouldBlock { side: "shared receive", free, wanted });
        }
        Ok(())
    }

    /// Takes a free slot for receive `i` of the batch (after [`Self::check_room`]) and marks it
    /// outstanding with the user's `wr_id`.
    pub(crate) fn take(&mut self, slots: &SharedSlots, i: usize, wr_id: u64) -> u32 {
        let slot = loop {
            let s = self.cursor;
            self.cursor = if s + 1 == self.depth { 0 } else { s + 1 };
            if !slots.busy[s as usize].load(Ordering::Acquire) {
                break s;
            }
        };
        self.taken[i] = slot;
        slots.wr_ids[slot as usize].store(wr_id, Ordering::Relaxed);
        slots.busy[slot as usize].store(true, Ordering::Release);
        slot
    }

    /// After the library took the first `posted` of a batch of `n`: frees the slots of the rest
    /// and counts the posted ones.
    pub(crate) fn finish(&mut self, slots: &SharedSlots, posted: usize, n: usize) {
        for &slot in &self.taken[posted..n] {
            slots.busy[slot as usize].store(false, Ordering::Release);
        }
        self.posted = self.posted.wrapping_add(posted as u32);
    }
}

/// Checks a shared receive queue's `depth` and `max_sge` against the device's caps (`sge_limit`
/// caps the SGE count further: a library field narrower than the caps); `none` says what the
/// device lacks when it has no shared receive queues.
pub(crate) fn check_config(
    caps: &DeviceCaps,
    name: &str,
    depth: u32,
    max_sge: u32,
    sge_limit: u32,
    none: &str,
) -> Result<()> {
    if caps.max_shared_recv == 0 {
        return Err(Error::Unsupported(format!("{name} has no {none}")));
    }
    if depth == 0 || depth > caps.max_shared_recv_depth {
        return Err(Error::InvalidArgument(format!(
            "shared receive queue depth {depth} is outside 1..={} on {name}",
            caps.max_shared_recv_depth
        )));
    }
    let sge_max = caps.max_recv_sge.min(sge_limit);
    if max_sge == 0 || max_sge > sge_max {
        return Err(Error::InvalidArgument(format!(
            "shared receive queue max_sge {max_sge} is outside 1..={sge_max} on {name}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_retire_once_in_any_order() {
        let slots = SharedSlots::new(0, 4);
        for (i, id) in [(0usize, 10u64), (1, 11), (3, 13)] {
            slots.wr_ids[i].store(id, Ordering::Relaxed);
            slots.busy[i].store(true, Ordering::Release);
        }
        let user = |slot| slots.retire(0, slot).map(|d| (d.user_wr_id, d.op));
        assert_eq!(user(3), Some((13, Op::Recv)));
        assert_eq!(user(0), Some((10, Op::Recv)));
        assert_eq!(user(0), None, "a slot retires once");
        assert_eq!(user(2), None, "a slot never posted");
        assert_eq!(user(9), None, "a slot outside the table");
        assert!(slots.retire(1, 1).is_none(), "another table's id");
        assert_eq!(slots.completed.load(Ordering::Acquire), 2);
        assert!(slots.busy[1].load(Ordering::Acquire));
    }

    #[test]
    fn poster_counts_free_slots_and_skips_busy_ones() {
        let slots = SharedSlots::new(7, 3);
        let mut p = SlotPoster::new(3);
        assert!(p.check_room(&slots, 4).is_err(), "more than the depth");
        p.check_room(&slots, 3).unwrap();
        let taken: Vec<u32> = (0..3).map(|i| p.take(&slots, i, 100 + i as u64)).collect();
        assert_eq!(taken, [0, 1, 2]);
        // The library refused the third: its slot is free again, two are outstanding.
        p.finish(&slots, 2, 3);
        assert_eq!(p.posted(), 2);
        assert!(matches!(p.check_room(&slots, 2), Err(Error::WouldBlock { free: 1, wanted: 2, .. })));
        assert_eq!(slots.retire(7, 1).map(|d| d.user_wr_id), Some(101));
        p.check_room(&slots, 2).unwrap();
        // Slot 0 is still busy: the cursor (back at 0 after wrapping) passes over it.
        assert_eq!(p.take(&slots, 0, 200), 1);
        assert_eq!(p.take(&slots, 1, 201), 2);
        p.finish(&slots, 2, 2);
        assert!(p.check_room(&slots, 1).is_err());
    }
}
