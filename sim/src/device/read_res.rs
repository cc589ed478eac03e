//! The responder's READ resources: what it remembers of the READs it answered, so that a
//! duplicate READ (its response was lost, the requester asks again, perhaps from the middle) is
//! answered again only if it is one of the last `max_dest_rd_atomic` READs and asks for a part
//! of what that READ covered — as rxe keeps `max_dest_rd_atomic` response resources and drops a
//! duplicate it finds none for (IBA class D: silently dropped; the requester's timer retries and
//! finally fails with RetryExceeded). Resources are reused oldest first.
//!
//! A queue configured with `max_dest_rd_atomic` 0 has no resources: it refuses every READ with
//! a NAK invalid request (see `QpCtx::on_request`).

use crate::packet::{psn_diff, psn_offset};

/// The device's cap on `max_dest_rd_atomic` (`DeviceCaps::max_dest_rd_atomic` of a SimNic).
pub(crate) const MAX_READ_RESOURCES: usize = 16;

/// One answered READ (its first PSN, segment count and RETH) or atomic (its PSN and the old
/// value it answered, sent again for a duplicate rather than executing it twice).
#[derive(Debug, Clone, Copy, Default)]
struct ReadRes {
    psn: u32,
    segments: u32,
    va: u64,
    rkey: u32,
    len: u64,
    atomic: Option<u64>,
}

/// A queue's READ resources.
#[derive(Debug, Clone)]
pub(crate) struct ReadResources {
    slots: [ReadRes; MAX_READ_RESOURCES],
    /// How many slots the queue may use (its `max_dest_rd_atomic`, clamped to the cap).
    limit: usize,
    /// Slots in use (at most `limit`), and the next slot to (re)use.
    used: usize,
    next: usize,
}

impl ReadResources {
    pub(crate) fn new(limit: u8) -> ReadResources {
        ReadResources {
            slots: [ReadRes::default(); MAX_READ_RESOURCES],
            limit: usize::from(limit).min(MAX_READ_RESOURCES),
            used: 0,
            next: 0,
        }
    }

    /// Whether this queue answers READs at all.
    pub(crate) fn enabled(&self) -> bool {
        self.limit > 0
    }

    /// Forgets every READ (the queue was reset or reconnected).
    pub(crate) fn clear(&mut self) {
        self.used = 0;
        self.next = 0;
    }

    /// Records a new READ answered from `psn` with `segments` response packets.
    pub(crate) fn record(&mut self, psn: u32, segments: u32, va: u64, rkey: u32, len: u64) {
        self.push(ReadRes { psn, segments, va, rkey, len, atomic: None });
    }

    /// Records an atomic executed at `psn` that found `old` in the word.
    pub(crate) fn record_atomic(&mut self, psn: u32, old: u64) {
        self.push(ReadRes { psn, segments: 1, atomic: Some(old), ..ReadRes::default() });
    }

    fn push(&mut self, r: ReadRes) {
        if self.limit == 0 {
            return;
        }
        self.slots[self.next] = r;
        self.next = (self.next + 1) % self.limit;
        self.used = (self.used + 1).min(self.limit);
    }

    /// The old value a remembered atomic at `psn` answered.
    pub(crate) fn atomic_result(&self, psn: u32) -> Option<u64> {
        self.slots[..self.used].iter().find(|r| r.psn == psn).and_then(|r| r.atomic)
    }

    /// Whether a duplicate READ request at `psn` for `len` bytes at `va` with `rkey` may be
    /// answered again: it falls inside a remembered READ, with its key, asking for the rest of
    /// that READ from the segment its PSN names (a subset of the original range).
    pub(crate) fn covers(&self, psn: u32, va: u64, rkey: u32, len: u64, mtu: u32) -> bool {
        self.slots[..self.used].iter().any(|r| {
            if r.atomic.is_some() || r.rkey != rkey || psn_diff(psn, r.psn) < 0 {
                return false;
            }
            let k = psn_offset(psn, r.psn);
            let skip = u64::from(k) * u64::from(mtu);
            k < r.segments.max(1) && va == r.va.wrapping_add(skip) && len <= r.len.saturating_sub(skip)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_last_limit_reads_are_remembered() {
        let mut r = ReadResources::new(2);
        r.record(10, 2, 0x1000, 7, 8000); // PSNs 10, 11 (mtu 4096)
        r.record(12, 1, 0x9000, 7, 100);
        assert!(r.covers(10, 0x1000, 7, 8000, 4096), "the whole first READ");
        assert!(r.covers(11, 0x2000, 7, 8000 - 4096, 4096), "its rest from the second segment");
        assert!(!r.covers(11, 0x1000, 7, 8000, 4096), "a different range at that PSN");
        assert!(!r.covers(10, 0x1000, 8, 8000, 4096), "another key");
        assert!(!r.covers(10, 0x1000, 7, 8001, 4096), "more than was asked");
        r.record(13, 1, 0xa000, 7, 100); // reuses the first READ's slot
        assert!(!r.covers(10, 0x1000, 7, 8000, 4096), "the oldest READ is forgotten");
        assert!(r.covers(12, 0x9000, 7, 100, 4096));
        assert!(r.covers(13, 0xa000, 7, 100, 4096));
        r.clear();
        assert!(!r.covers(13, 0xa000, 7, 100, 4096));
    }

    #[test]
    fn zero_resources_answer_nothing() {
        let mut r = ReadResources::new(0);
        assert!(!r.enabled());
        r.record(1, 1, 0, 1, 1);
        assert!(!r.covers(1, 0, 1, 1, 4096));
    }
}
