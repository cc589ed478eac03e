//! # req_table: the per-channel request table
//!
//! A client channel matches each response (and ACK) to its outstanding request by `req_id`. The
//! table has a power-of-two number of slots (default [`DEFAULT_CAPACITY`] = 1024, as in URPC);
//! `req_id` comes from a wrapping 32-bit counter and lives in slot `req_id & (capacity - 1)`.
//!
//! - **Allocation** ([`ReqTable::allocate`]) takes the next id; if its slot is busy it takes the
//!   next id again (linear probing, one id per try), at most `capacity` tries, then fails with
//!   [`ReqTableError::TableFull`] (EAGAIN: retry once responses or timeouts free slots).
//!   `EARLY_RSP` calls take an id but no slot ([`ReqTable::take_id`]).
//! - **Completion** ([`ReqTable::complete`], the polling thread) takes the slot's value only if
//!   the slot is busy *and* holds the same `req_id`. Anything else is counted and dropped, never
//!   delivered: a response for a slot that was since reused (stale), a second response for a
//!   finished request (duplicate), a response after the request timed out (late).
//! - **Cancellation** ([`ReqTable::cancel`], the timer thread; [`ReqTable::cancel_all`] when the
//!   channel breaks) takes the slot the same way. Exactly one of `complete` and `cancel` returns
//!   the value for a given request.
//!
//! ## Slot state
//!
//! Each slot holds an `AtomicU64` word `req_id << 32 | state` and an `AtomicU64` caller value
//! (typically a [`crate::core::tx_ctx::TxHandle`] packed with [`crate::core::tx_ctx::TxHandle::to_u64`]).
//!
//! | state       | meaning                                          | `complete`/`cancel` with same id |
//! |-------------|--------------------------------------------------|----------------------------------|
//! | `EMPTY`     | never used                                       | miss (stale)                     |
//! | `RESERVED`  | claimed by `allocate`, value being written       | miss (stale)                     |
//! | `BUSY`      | outstanding request `req_id`                     | **take the value**               |
//! | `COMPLETED` | `req_id` was completed; slot free                | miss (duplicate)                 |
//! | `CANCELLED` | `req_id` was cancelled (timeout); slot free      | miss (late response)             |
//!
//! ```text
//!   EMPTY / COMPLETED / CANCELLED ──allocate CAS──► RESERVED(id) ──store value, store──► BUSY(id)
//!                                                                                        │
//!        COMPLETED(id) ◄────────── complete(id) CAS ───────────────────────────────────┤
//!        CANCELLED(id) ◄────────── cancel(id) CAS ─────────────────────────────────────┘
//! ```
//!
//! Every transition is one compare-exchange on the word, so the id check and the state change are
//! atomic and exactly one `BUSY(id) → …` transition succeeds. `RESERVED` exists so that a bogus
//! response carrying the id that `allocate` is about to return cannot take the slot before its
//! value is written. The taker reads the value *before* its compare-exchange: while the word is
//! `BUSY(id)` nobody writes the value, and once the compare-exchange succeeds the slot may be
//! reallocated at once. An id would repeat in the same slot only after 2^32 allocations, so the
//! word cannot come back to the same `BUSY(id)` under a taker's feet in practice.
//!
//! No locks and no allocation after [`ReqTable::new`]; everything goes through
//! the crate-internal `sync` shim, so the loom models in `loom-tests` check this code.

#[cfg(loom)]
use crate::sync::mutation::{self, Mutant};
use crate::sync::{fence, AtomicU32, AtomicU64, Ordering};

/// URPC's default table size.
pub const DEFAULT_CAPACITY: usize = 1024;

/// Largest capacity [`ReqTable::new`] accepts (16 Mi slots).
pub const MAX_CAPACITY: usize = 1 << 24;

const EMPTY: u64 = 0;
const RESERVED: u64 = 1;
const BUSY: u64 = 2;
const COMPLETED: u64 = 3;
const CANCELLED: u64 = 4;
const STATE_MASK: u64 = 0xFFFF_FFFF;

const fn pack(req_id: u32, state: u64) -> u64 {
    ((req_id as u64) << 32) | state
}

const fn unpack(word: u64) -> (u32, u64) {
    ((word >> 32) as u32, word & STATE_MASK)
}

/// Why a request-table operation failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReqTableError {
    /// [`ReqTable::new`] needs a power of two in `1..=MAX_CAPACITY`.
    #[error("request table capacity {capacity} is invalid: use a power of two between 1 and {max}")]
    InvalidCapacity {
        /// The capacity asked for.
        capacity: usize,
        /// [`MAX_CAPACITY`].
        max: usize,
    },
    /// Every probed slot was busy: too many requests are outstanding on this channel.
    #[error("request table full: {tries} slot(s) probed, all busy (capacity {capacity}); retry when responses or timeouts free slots")]
    TableFull {
        /// The table's capacity.
        capacity: usize,
        /// Ids consumed by the failed probe (the capacity).
        tries: usize,
    },
}

/// A snapshot of a table's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReqStats {
    /// Slots in the table.
    pub capacity: usize,
    /// Requests allocated and neither completed nor cancelled. Zero when idle.
    pub outstanding: usize,
    /// Successful [`ReqTable::allocate`] calls.
    pub allocated: u64,
    /// [`ReqTable::allocate`] calls that failed with [`ReqTableError::TableFull`].
    pub full: u64,
    /// Requests taken by [`ReqTable::complete`].
    pub completed: u64,
    /// Requests taken by [`ReqTable::cancel`] / [`ReqTable::cancel_all`].
    pub cancelled: u64,
    /// Responses dropped because the slot did not hold that request (reused, never used, or
    /// still being set up).
    pub stale_responses: u64,
    /// Responses dropped because that request was already completed.
    pub duplicates: u64,
    /// Responses dropped because that request was cancelled (timed out) before they came.
    pub late_responses: u64,
}

#[derive(Debug)]
struct ReqSlot {
    /// `req_id << 32 | state`.
    state: AtomicU64,
    /// Caller value; written only while the slot is `RESERVED` by its allocator.
    value: AtomicU64,
}

#[derive(Debug)]
struct Counters {
    allocated: AtomicU64,
    full: AtomicU64,
    completed: AtomicU64,
    cancelled: AtomicU64,
    stale_responses: AtomicU64,
    duplicates: AtomicU64,
    late_responses: AtomicU64,
}

/// Why a take missed (internal).
enum Miss {
    Stale,
    Duplicate,
    Late,
}

/// A per-channel table of outstanding requests, keyed by a wrapping 32-bit `req_id`, storing one
/// `u64` per request. Lock-free; safe to share between allocating threads, a polling thread and
/// a timer thread.
#[derive(Debug)]
pub struct ReqTable {
    slots: Box<[ReqSlot]>,
    mask: u32,
    next_id: AtomicU32,
    counters: Counters,
}

impl Default for ReqTable {
    /// A table of [`DEFAULT_CAPACITY`] slots whose first id is 0.
    fn default() -> ReqTable {
        ReqTable::build(DEFAULT_CAPACITY, 0)
    }
}

impl ReqTable {
    /// Creates a table of `capacity` slots (a power of two); the first id is 0.
    pub fn new(capacity: usize) -> Result<ReqTable, ReqTableError> {
        ReqTable::with_first_id(capacity, 0)
    }

    /// Creates a table whose id counter starts at `first_id` (e.g. a random value per
    /// connection, so responses from an earlier connection are unlikely to match).
    pub fn with_first_id(capacity: usize, first_id: u32) -> Result<ReqTable, ReqTableError> {
        if capacity == 0 || capacity > MAX_CAPACITY || !capacity.is_power_of_two() {
            return Err(ReqTableError::InvalidCapacity { capacity, max: MAX_CAPACITY });
        }
        Ok(ReqTable::build(capacity, first_id))
    }

    fn build(capacity: usize, first_id: u32) -> ReqTable {
        ReqTable {
            slots: (0..capacity)
                .map(|_| ReqSlot { state: AtomicU64::new(pack(0, EMPTY)), value: AtomicU64::new(0) })
                .collect(),
            // capacity <= MAX_CAPACITY < 2^32, so the mask fits.
            mask: (capacity - 1) as u32,
            next_id: AtomicU32::new(first_id),
            counters: Counters {
                allocated: AtomicU64::new(0),
                full: AtomicU64::new(0),
                completed: AtomicU64::new(0),
                cancelled: AtomicU64::new(0),
                stale_responses: AtomicU64::new(0),
                duplicates: AtomicU64::new(0),
                late_responses: AtomicU64::new(0),
            },
        }
    }

    /// Number of slots.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Requests allocated and neither completed nor cancelled.
    ///
    /// Counted as allocated less taken (completed and cancelled), not with a counter of its own:
    /// that would cost each call two more locked read-modify-writes (one at `allocate`, one at
    /// the take) on top of the `allocated` and `completed` counts it keeps anyway. The takes are
    /// read first (Acquire, pairing with their Release increments): a take counted there was of
    /// a request whose allocation is then counted too, so the difference is never negative.
    /// Like any snapshot of a table in use it may be stale by the time it is read; it is exact
    /// when the table is quiescent.
    pub fn outstanding(&self) -> usize {
        let c = &self.counters;
        let taken = c.completed.load(Ordering::Acquire) + c.cancelled.load(Ordering::Acquire);
        c.allocated.load(Ordering::Relaxed).saturating_sub(taken) as usize
    }

    /// A snapshot of the counters (each read individually; exact when the table is quiescent).
    pub fn stats(&self) -> ReqStats {
        let c = &self.counters;
        ReqStats {
            capacity: self.slots.len(),
            outstanding: self.outstanding(),
            allocated: c.allocated.load(Ordering::Relaxed),
            full: c.full.load(Ordering::Relaxed),
            completed: c.completed.load(Ordering::Relaxed),
            cancelled: c.cancelled.load(Ordering::Relaxed),
            stale_responses: c.stale_responses.load(Ordering::Relaxed),
            duplicates: c.duplicates.load(Ordering::Relaxed),
            late_responses: c.late_responses.load(Ordering::Relaxed),
        }
    }

    /// Takes the next id without a slot (for `EARLY_RSP` calls, which expect no response).
    pub fn take_id(&self) -> u32 {
        self.next_id.fetch_add(1, Ordering::Relaxed) // wraps at u32::MAX
    }

    /// Allocates a request: returns its `req_id`, with `value` stored in its slot until
    /// [`ReqTable::complete`] or [`ReqTable::cancel`] takes it. Probes past busy slots, one new
    /// id per try, at most `capacity` tries; then [`ReqTableError::TableFull`].
    pub fn allocate(&self, value: u64) -> Result<u32, ReqTableError> {
        for _ in 0..self.slots.len() {
            let req_id = self.take_id();
            let Some(slot) = self.slots.get((req_id & self.mask) as usize) else { continue };
            let cur = slot.state.load(Ordering::Relaxed);
            let (_, state) = unpack(cur);
            if state == RESERVED || state == BUSY {
                continue;
            }
            // Acquire: the previous taker read the old value before its (release) compare-
            // exchange; our value store below must not be seen by it.
            if slot
                .state
                .compare_exchange(cur, pack(req_id, RESERVED), Ordering::Acquire, Ordering::Relaxed)
                .is_err()
            {
                continue; // another allocator got it (an id `capacity` apart); probe on
            }
            // Release fence: a `peek` that reads the value stored below also sees this slot's
            // state as no longer BUSY with the previous id (the seqlock pairing in `peek`).
            fence(Ordering::Release);
            slot.value.store(value, Ordering::Relaxed);
            // Count before publishing, so a take counted in `outstanding` was of an allocation
            // counted there too.
            self.counters.allocated.fetch_add(1, Ordering::Relaxed);
            // Release: publishes the value to whoever sees BUSY(req_id).
            slot.state.store(pack(req_id, BUSY), Ordering::Release);
            return Ok(req_id);
        }
        self.counters.full.fetch_add(1, Ordering::Relaxed);
        Err(ReqTableError::TableFull { capacity: self.slots.len(), tries: self.slots.len() })
    }

    /// A response (or ACK) for `req_id` arrived: returns the request's value if the request is
    /// outstanding, and frees its slot. Returns `None` — counting a stale, duplicate or late
    /// response — if the slot does not hold that outstanding request; such a response must be
    /// dropped. Exactly one of `complete` and [`ReqTable::cancel`] gets the value.
    pub fn complete(&self, req_id: u32) -> Option<u64> {
        match self.take(req_id, COMPLETED) {
            Ok(value) => {
                // Release: see `outstanding`.
                self.counters.completed.fetch_add(1, Ordering::Release);
                Some(value)
            }
            Err(miss) => {
                let counter = match miss {
                    Miss::Stale => &self.counters.stale_responses,
                    Miss::Duplicate => &self.counters.duplicates,
                    Miss::Late => &self.counters.late_responses,
                };
                counter.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// The value of outstanding request `req_id`, without ending it: for a message that does not
    /// finish the call (the ACK of an ACK-mode call, whose RSP is still to come). `None` if the
    /// slot does not hold that outstanding request. Not counted: the caller decides whether a
    /// miss is stale.
    pub fn peek(&self, req_id: u32) -> Option<u64> {
        let slot = self.slots.get((req_id & self.mask) as usize)?;
        // Acquire: see the value stored before BUSY(req_id) was published.
        let cur = slot.state.load(Ordering::Acquire);
        if cur != pack(req_id, BUSY) {
            return None;
        }
        let value = slot.value.load(Ordering::Relaxed);
        // MUTANT (loom twin only, see `sync::mutation`): no re-check after reading the value.
        #[cfg(loom)]
        if mutation::enabled(Mutant::ReqPeekNoRecheck) {
            return Some(value);
        }
        // Seqlock check: if the slot was taken and reallocated meanwhile, the value may be the
        // next request's; the acquire fence pairs with `allocate`'s release fence, so seeing the
        // new value implies seeing the state change below.
        fence(Ordering::Acquire);
        (slot.state.load(Ordering::Relaxed) == cur).then_some(value)
    }

    /// Cancels `req_id` (its timer fired, or the caller gave up): returns the request's value if
    /// it was still outstanding, and frees its slot; `None` if it was already completed or
    /// cancelled (not counted: losing that race is normal). A response arriving later is dropped
    /// as late.
    pub fn cancel(&self, req_id: u32) -> Option<u64> {
        let value = self.take(req_id, CANCELLED).ok()?;
        // Release: see `outstanding`.
        self.counters.cancelled.fetch_add(1, Ordering::Release);
        Some(value)
    }

    /// Cancels every outstanding request (the channel broke), calling `f(req_id, value)` for each
    /// one this call took. Returns how many. Requests allocated concurrently may or may not be
    /// included; requests completed concurrently are not passed to `f`.
    pub fn cancel_all(&self, mut f: impl FnMut(u32, u64)) -> usize {
        let mut n = 0;
        for slot in self.slots.iter() {
            let (req_id, state) = unpack(slot.state.load(Ordering::Acquire));
            if state == BUSY {
                if let Some(value) = self.cancel(req_id) {
                    f(req_id, value);
                    n += 1;
                }
            }
        }
        n
    }

    /// Moves `BUSY(req_id)` to `done` and returns the value, or says why not.
    fn take(&self, req_id: u32, done: u64) -> Result<u64, Miss> {
        let slot = self.slots.get((req_id & self.mask) as usize).ok_or(Miss::Stale)?;
        // Acquire: see the value stored before BUSY(req_id) was published.
        let mut cur = slot.state.load(Ordering::Acquire);
        // MUTANT (loom twin only, see `sync::mutation`): `complete` takes whatever request the
        // slot holds (no id check) and frees it with a plain store.
        #[cfg(loom)]
        if done == COMPLETED && mutation::enabled(Mutant::ReqCompleteNoIdCheck) {
            let (id, state) = unpack(cur);
            if state != BUSY {
                return Err(Miss::Stale);
            }
            let value = slot.value.load(Ordering::Relaxed);
            slot.state.store(pack(id, COMPLETED), Ordering::Release);
            return Ok(value);
        }
        loop {
            let (id, state) = unpack(cur);
            if id != req_id {
                return Err(Miss::Stale);
            }
            match state {
                BUSY => {}
                COMPLETED => return Err(Miss::Duplicate),
                CANCELLED => return Err(Miss::Late),
                _ => return Err(Miss::Stale), // EMPTY, RESERVED
            }
            // Read before the compare-exchange: after it the slot may be reallocated at once.
            let value = slot.value.load(Ordering::Relaxed);
            // AcqRel: release orders our value read before the next allocator's value write.
            match slot.state.compare_exchange(cur, pack(req_id, done), Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Ok(value),
                Err(actual) => cur = actual,
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::sync::atomic::{AtomicBool as StdBool, AtomicU32 as StdU32, Ordering as O};
    use std::sync::{Arc, Barrier, Mutex, RwLock};

    use crate::test_rng::Rng;

    #[test]
    fn capacity_must_be_a_power_of_two() {
        for bad in [0, 3, 1000, MAX_CAPACITY + 1, MAX_CAPACITY * 2] {
            assert!(
                matches!(ReqTable::new(bad), Err(ReqTableError::InvalidCapacity { capacity, .. }) if capacity == bad),
                "{bad}"
            );
        }
        assert_eq!(ReqTable::new(1).expect("1 is a power of two").capacity(), 1);
        assert_eq!(ReqTable::default().capacity(), DEFAULT_CAPACITY);
        assert_eq!(DEFAULT_CAPACITY, 1024);
    }

    #[test]
    fn ids_wrap_past_u32_max() {
        let t = ReqTable::with_first_id(8, u32::MAX - 2).expect("valid");
        let ids: Vec<u32> = (0..5).map(|v| t.allocate(100 + v).expect("room")).collect();
        assert_eq!(ids, [u32::MAX - 2, u32::MAX - 1, u32::MAX, 0, 1]);
        assert_eq!(t.outstanding(), 5);
        for (v, id) in ids.iter().enumerate() {
            assert_eq!(t.complete(*id), Some(100 + v as u64));
        }
        assert_eq!(t.take_id(), 2);
        let st = t.stats();
        assert_eq!((st.outstanding, st.allocated, st.completed), (0, 5, 5));
    }

    #[test]
    fn allocation_probes_past_busy_slots() {
        let t = ReqTable::new(4).expect("valid");
        for id in 0..4 {
            assert_eq!(t.allocate(id as u64), Ok(id));
        }
        assert_eq!(t.complete(1), Some(1));
        // id 4 → slot 0 busy, id 5 → slot 1 free.
        assert_eq!(t.allocate(55), Ok(5));
        // All busy: ids 6..=9 are burnt probing, then the table is full.
        assert_eq!(t.allocate(66), Err(ReqTableError::TableFull { capacity: 4, tries: 4 }));
        assert_eq!(t.complete(2), Some(2));
        // id 10 → slot 2, which is free again.
        assert_eq!(t.allocate(1010), Ok(10));
        assert_eq!(t.complete(5), Some(55));
        assert_eq!(t.complete(10), Some(1010));
        let st = t.stats();
        assert_eq!((st.outstanding, st.full), (2, 1));
    }

    #[test]
    fn full_table_is_an_error_not_a_panic() {
        let t = ReqTable::new(4).expect("valid");
        for v in 0..4 {
            t.allocate(v).expect("room");
        }
        for _ in 0..3 {
            let err = t.allocate(9).expect_err("full");
            assert_eq!(err, ReqTableError::TableFull { capacity: 4, tries: 4 });
            assert!(err.to_string().contains("full"));
        }
        let st = t.stats();
        assert_eq!((st.outstanding, st.full, st.allocated), (4, 3, 4));
    }

    #[test]
    fn stale_duplicate_and_late_responses_are_dropped_and_counted() {
        let t = ReqTable::new(4).expect("valid");
        // A response before anything was allocated.
        assert_eq!(t.complete(0), None);
        assert_eq!(t.complete(12_345), None);
        let first = t.allocate(100).expect("room");
        assert_eq!(first, 0);
        assert_eq!(t.cancel(first), Some(100)); // timeout
        assert_eq!(t.complete(first), None); // late response, slot not yet reused
        for v in 1..4 {
            t.allocate(v).expect("room");
        }
        // id 4 reuses slot 0.
        let reuse = t.allocate(200).expect("room");
        assert_eq!(reuse, 4);
        assert_eq!(t.complete(first), None); // stale: the slot now belongs to id 4
        assert_eq!(t.complete(reuse), Some(200));
        assert_eq!(t.complete(reuse), None); // duplicate
        assert_eq!(t.cancel(reuse), None); // the timer lost; not counted
        let st = t.stats();
        assert_eq!(st.stale_responses, 3);
        assert_eq!(st.late_responses, 1);
        assert_eq!(st.duplicates, 1);
        assert_eq!((st.completed, st.cancelled, st.outstanding), (1, 1, 3));
    }

    #[test]
    fn complete_and_cancel_exclude_each_other() {
        let t = ReqTable::new(2).expect("valid");
        let a = t.allocate(1).expect("room");
        assert_eq!(t.complete(a), Some(1));
        assert_eq!(t.cancel(a), None);
        let b = t.allocate(2).expect("room");
        assert_eq!(t.cancel(b), Some(2));
        assert_eq!(t.complete(b), None);
        assert_eq!(t.outstanding(), 0);
    }

    #[test]
    fn peek_reads_an_outstanding_request_without_ending_it() {
        let t = ReqTable::new(8).unwrap();
        let id = t.allocate(77).unwrap();
        assert_eq!(t.peek(id), Some(77));
        assert_eq!(t.peek(id), Some(77), "peeking twice is fine");
        assert_eq!(t.peek(id.wrapping_add(8)), None, "same slot, other id");
        assert_eq!(t.outstanding(), 1);
        assert_eq!(t.complete(id), Some(77), "the RSP still completes the request");
        assert_eq!(t.peek(id), None, "nothing to peek after completion");
        assert_eq!(t.stats().stale_responses, 0, "peek misses are not counted");
    }

    /// A peeker racing allocate/complete cycles on one slot only ever sees the value of the id it
    /// asked for (values encode their id).
    #[test]
    fn peek_never_returns_another_requests_value() {
        let t = Arc::new(ReqTable::new(1).unwrap());
        let stop = Arc::new(StdBool::new(false));
        let current = Arc::new(StdU32::new(u32::MAX));
        let peeker = {
            let (t, stop, current) = (t.clone(), stop.clone(), current.clone());
            std::thread::spawn(move || {
                while !stop.load(O::Relaxed) {
                    // Ask for the current id and its neighbours: the slot cycles through them.
                    let id = current.load(O::Relaxed);
                    for probe in [id, id.wrapping_add(1)] {
                        if let Some(v) = t.peek(probe) {
                            assert_eq!(
                                v,
                                u64::from(probe) << 8 | 0xAB,
                                "peek({probe}) returned another request's value"
                            );
                        }
                    }
                }
            })
        };
        for _ in 0..200_000 {
            // One allocator and one slot: the next id is known before allocating, so the value
            // can encode it.
            let expect = t.next_id.load(Ordering::Relaxed);
            let id = t.allocate(u64::from(expect) << 8 | 0xAB).unwrap();
            assert_eq!(id, expect);
            current.store(id, O::Relaxed);
            assert!(t.complete(id).is_some());
        }
        stop.store(true, O::Relaxed);
        peeker.join().unwrap();
    }

    #[test]
    fn take_id_uses_no_slot() {
        let t = ReqTable::new(2).expect("valid");
        assert_eq!(t.take_id(), 0);
        assert_eq!(t.complete(0), None);
        assert_eq!(t.allocate(5), Ok(1));
        assert_eq!(t.allocate(6), Ok(2));
        assert_eq!(t.outstanding(), 2);
    }

    #[test]
    fn cancel_all_takes_every_outstanding_request() {
        let t = ReqTable::new(8).expect("valid");
        let ids: Vec<u32> = (0..5).map(|v| t.allocate(v * 10).expect("room")).collect();
        assert_eq!(t.complete(ids[1]), Some(10));
        assert_eq!(t.cancel(ids[3]), Some(30));
        let mut got = Vec::new();
        assert_eq!(t.cancel_all(|id, v| got.push((id, v))), 3);
        got.sort_unstable();
        assert_eq!(got, [(ids[0], 0), (ids[2], 20), (ids[4], 40)]);
        assert_eq!(t.outstanding(), 0);
        assert_eq!(t.cancel_all(|_, _| panic!("nothing left")), 0);
    }

    struct RaceShared {
        table: ReqTable,
        ids: RwLock<Vec<(u32, u64, bool, bool)>>,
        stale: RwLock<Vec<u32>>,
        start: Barrier,
        end: Barrier,
        stop: StdBool,
        wins: Vec<StdU32>,
        errors: Mutex<Vec<String>>,
    }

    fn race_worker(sh: &RaceShared, poller: bool, seed: u64) {
        let mut rng = Rng(seed);
        loop {
            sh.start.wait();
            if sh.stop.load(O::SeqCst) {
                return;
            }
            let ids = sh.ids.read().unwrap_or_else(|e| e.into_inner());
            let stale = sh.stale.read().unwrap_or_else(|e| e.into_inner());
            let mut order: Vec<usize> = (0..ids.len()).collect();
            match rng.below(3) {
                0 => {}
                1 => order.reverse(),
                _ => rng.shuffle(&mut order),
            }
            for i in order {
                let (id, value, respond, time_out) = ids[i];
                if poller && !stale.is_empty() && rng.percent(25) {
                    // A response from an earlier round: must never be delivered.
                    let old = stale[rng.below(stale.len())];
                    if let Some(v) = sh.table.complete(old) {
                        sh.errors
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .push(format!("stale {old} delivered {v:#x}"));
                    }
                }
                let attempt = if poller { respond } else { time_out };
                if !attempt {
                    continue;
                }
                let got = if poller { sh.table.complete(id) } else { sh.table.cancel(id) };
                match got {
                    Some(v) if v == value => {
                        sh.wins[i].fetch_add(1, O::Relaxed);
                    }
                    Some(v) => sh
                        .errors
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(format!("id {id} gave value {v:#x}, expected {value:#x}")),
                    None => {}
                }
            }
            drop((ids, stale));
            sh.end.wait();
        }
    }

    #[test]
    fn stress_complete_versus_cancel_exactly_once() {
        const ROUNDS: usize = 1000;
        const BATCH: usize = 512;
        const SEED: u64 = 0x5EED_0001;
        let sh = Arc::new(RaceShared {
            // capacity == BATCH: every slot is reused each round, so last round's ids hit live slots.
            table: ReqTable::with_first_id(BATCH, u32::MAX - 10_000).expect("valid"),
            ids: RwLock::new(Vec::new()),
            stale: RwLock::new(Vec::new()),
            start: Barrier::new(3),
            end: Barrier::new(3),
            stop: StdBool::new(false),
            wins: (0..BATCH).map(|_| StdU32::new(0)).collect(),
            errors: Mutex::new(Vec::new()),
        });
        let workers: Vec<_> = [true, false]
            .into_iter()
            .map(|poller| {
                let sh = Arc::clone(&sh);
                std::thread::spawn(move || race_worker(&sh, poller, SEED ^ u64::from(poller)))
            })
            .collect();
        let mut rng = Rng(SEED);
        let mut failures = Vec::new();
        let mut previous: Vec<u32> = Vec::new();
        for round in 0..ROUNDS {
            let mut ids = Vec::with_capacity(BATCH);
            for i in 0..BATCH {
                let value = ((round as u64) << 32) | i as u64;
                match sh.table.allocate(value) {
                    Ok(id) => {
                        let respond = rng.percent(85);
                        let time_out = !respond || rng.percent(60);
                        ids.push((id, value, respond, time_out));
                    }
                    Err(e) => {
                        failures.push(format!("round {round}: {e} with the table idle: a slot leaked"));
                        break;
                    }
                }
            }
            if !failures.is_empty() {
                break;
            }
            for w in &sh.wins {
                w.store(0, O::Relaxed);
            }
            *sh.ids.write().unwrap_or_else(|e| e.into_inner()) = ids.clone();
            *sh.stale.write().unwrap_or_else(|e| e.into_inner()) = std::mem::take(&mut previous);
            sh.start.wait();
            sh.end.wait();
            for (i, (id, ..)) in ids.iter().enumerate() {
                let w = sh.wins[i].load(O::Relaxed);
                if w != 1 {
                    failures.push(format!("round {round}: id {id} taken {w} times"));
                }
            }
            if sh.table.outstanding() != 0 {
                failures.push(format!("round {round}: {} requests leaked", sh.table.outstanding()));
            }
            if !failures.is_empty() || !sh.errors.lock().unwrap_or_else(|e| e.into_inner()).is_empty() {
                break;
            }
            previous = ids.iter().map(|(id, ..)| *id).collect();
        }
        sh.stop.store(true, O::SeqCst);
        sh.start.wait();
        for w in workers {
            w.join().expect("worker panicked");
        }
        let errors = sh.errors.lock().unwrap_or_else(|e| e.into_inner()).clone();
        assert!(errors.is_empty(), "seed {SEED:#x}: {:?}", &errors[..errors.len().min(5)]);
        assert!(failures.is_empty(), "seed {SEED:#x}: {:?}", &failures[..failures.len().min(5)]);
        let st = sh.table.stats();
        assert_eq!(st.outstanding, 0);
        assert_eq!(st.completed + st.cancelled, (ROUNDS * BATCH) as u64);
        assert!(st.stale_responses + st.duplicates + st.late_responses > 0);
    }

    #[test]
    fn stress_concurrent_allocators_never_share_a_slot() {
        const ALLOCATORS: usize = 2;
        const PER_THREAD: u64 = 20_000;
        let table = Arc::new(ReqTable::with_first_id(64, u32::MAX - 1000).expect("valid"));
        let (tx, rx) = std::sync::mpsc::channel::<(u32, u64)>();
        let start = Arc::new(Barrier::new(ALLOCATORS));
        let allocators: Vec<_> = (0..ALLOCATORS as u64)
            .map(|t| {
                let (table, tx, start) = (Arc::clone(&table), tx.clone(), Arc::clone(&start));
                std::thread::spawn(move || {
                    start.wait();
                    for k in 0..PER_THREAD {
                        let value = (t << 32) | k;
                        let id = loop {
                            match table.allocate(value) {
                                Ok(id) => break id,
                                Err(_) => std::thread::yield_now(), // the completer is behind
                            }
                        };
                        if tx.send((id, value)).is_err() {
                            return;
                        }
                    }
                })
            })
            .collect();
        drop(tx);
        let completer = {
            let table = Arc::clone(&table);
            std::thread::spawn(move || -> Result<HashSet<u32>, String> {
                let mut seen = HashSet::new();
                for (id, value) in rx {
                    match table.complete(id) {
                        Some(v) if v == value => {}
                        other => return Err(format!("id {id}: got {other:?}, expected {value:#x}")),
                    }
                    if !seen.insert(id) {
                        return Err(format!("id {id} handed out twice"));
                    }
                }
                Ok(seen)
            })
        };
        for a in allocators {
            a.join().expect("allocator panicked");
        }
        let seen = completer.join().expect("completer panicked").expect("slot shared");
        assert_eq!(seen.len() as u64, ALLOCATORS as u64 * PER_THREAD);
        let st = table.stats();
        assert_eq!(st.outstanding, 0);
        assert_eq!(st.completed, ALLOCATORS as u64 * PER_THREAD);
        assert_eq!((st.stale_responses, st.duplicates), (0, 0));
    }
}
