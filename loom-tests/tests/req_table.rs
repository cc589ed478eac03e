#![cfg(loom)]
//! loom models of the request table (`bypass::req_table::ReqTable`).
//!
//! Tables of one slot whose id counter starts at `u32::MAX`, so consecutive requests share the
//! slot *and* the second id wraps to 0: the case where a response for one request could reach
//! another. Each model races allocation, responses (`complete`), timeouts (`cancel`),
//! `cancel_all`, `peek` and stale responses on that slot and asserts that a request's value is
//! handed out at most once, only for its own id, and exactly once in total. Every racing party
//! is a spawned thread; the main thread only sets up, joins and checks (see the README on loom's
//! partial-order reduction).

use loom::sync::atomic::{AtomicU64, Ordering};
use loom::sync::Arc;
use loom::thread;

use bypass::req_table::{ReqTable, ReqTableError};
use bypass_loom_tests::{check, check_mutant, Bound, Mutant};

/// The first request's value (in the stack: its packed tx_ctx handle).
const A: u64 = 0xAAAA;
/// The second request's value.
const B: u64 = 0xBBBB;
/// No id recorded yet (ids are `u32`, so this is never one).
const NO_ID: u64 = u64::MAX;

/// A one-slot table whose first id is `u32::MAX`: the next id wraps to 0, in the same slot.
fn table() -> ReqTable {
    ReqTable::with_first_id(1, u32::MAX).expect("1 is a power of two")
}

// --- 1. A late response for a timed-out request, while the slot is reused ---------------------

/// Request A is outstanding. The timer thread cancels A (its deadline passed) and the caller
/// allocates B, which lands in the same slot with the wrapped id 0. Meanwhile the poller handles
/// A's response, now late: it may take A (if it beats the timer) but never B.
fn late_response_vs_timeout_and_reuse() {
    let t = Arc::new(table());
    let id_a = t.allocate(A).expect("empty table");
    assert_eq!(id_a, u32::MAX);
    let id_b = Arc::new(AtomicU64::new(NO_ID));

    let timer = {
        let (t, id_b) = (Arc::clone(&t), Arc::clone(&id_b));
        thread::spawn(move || {
            let cancelled = t.cancel(id_a);
            assert!(cancelled.is_none() || cancelled == Some(A), "cancel(A) took {cancelled:?}");
            // The caller retries with a new request: the slot is free again either way.
            let b = t.allocate(B).expect("A is gone, so its slot is free");
            assert_eq!(b, 0, "the id wraps past u32::MAX into the same slot");
            id_b.store(u64::from(b), Ordering::Release);
            cancelled
        })
    };
    let poller = {
        let t = Arc::clone(&t);
        thread::spawn(move || {
            let got = t.complete(id_a);
            assert!(got.is_none() || got == Some(A), "the response for A was delivered {got:?}");
            got
        })
    };
    let cancelled = timer.join().expect("timer panicked");
    let completed = poller.join().expect("poller panicked");
    assert_eq!(
        usize::from(cancelled.is_some()) + usize::from(completed.is_some()),
        1,
        "A is taken exactly once (cancelled {cancelled:?}, completed {completed:?})"
    );
    // B is untouched by A's late response: still outstanding, with its own value.
    let b = id_b.load(Ordering::Acquire);
    assert_eq!(b, 0);
    assert_eq!(t.outstanding(), 1);
    assert_eq!(t.complete(0), Some(B), "B's value must still be there for B's response");
    assert_eq!(t.complete(id_a), None, "a response for A after all that is dropped");
    let st = t.stats();
    assert_eq!((st.outstanding, st.allocated, st.completed + st.cancelled), (0, 2, 2));
}

#[test]
fn late_response_never_reaches_the_next_request_in_the_slot() {
    check(Bound::Exhaustive, late_response_vs_timeout_and_reuse);
}

#[test]
#[should_panic(expected = "A is taken exactly once")]
fn twin_late_response_never_reaches_the_next_request_complete_without_id_check() {
    check_mutant(Mutant::ReqCompleteNoIdCheck, Bound::Exhaustive, late_response_vs_timeout_and_reuse);
}

// --- 2. Two allocators contend for the slot while early and stale responses arrive ----------

/// Two callers allocate at once (ids `u32::MAX` and 0, both for the one slot); the poller
/// meanwhile handles a response for each of those ids — bogus early ones, possibly before the
/// request exists or while its allocator is still writing the value. Every response takes at
/// most its own request's value; every allocated request is taken exactly once in the end.
fn allocators_vs_early_responses() {
    let t = Arc::new(table());
    let alloc = |value: u64| {
        let t = Arc::clone(&t);
        thread::spawn(move || match t.allocate(value) {
            Ok(id) => Some((id, value)),
            Err(ReqTableError::TableFull { .. }) => None,
            Err(e) => panic!("allocate: {e}"),
        })
    };
    let (first, second) = (alloc(A), alloc(B));
    let poller = {
        let t = Arc::clone(&t);
        thread::spawn(move || [(u32::MAX, t.complete(u32::MAX)), (0, t.complete(0))])
    };
    let requests: Vec<(u32, u64)> =
        [first, second].into_iter().filter_map(|h| h.join().expect("allocator panicked")).collect();
    let early = poller.join().expect("poller panicked");
    assert!(!requests.is_empty(), "the empty slot must go to one of the allocators");
    // Each early response took nothing or exactly the request allocated under its id.
    for (id, got) in early {
        if let Some(v) = got {
            assert!(
                requests.contains(&(id, v)),
                "the response for {id} took {v:#x}, not its request's value"
            );
        }
    }
    // Every request is taken exactly once: by its early response, or now.
    for (id, value) in &requests {
        let early_took = early.iter().any(|(eid, got)| eid == id && got.is_some());
        let now = t.complete(*id);
        assert_eq!(now.is_some(), !early_took, "request {id} taken twice or never");
        assert!(now.is_none() || now == Some(*value));
    }
    assert_eq!(t.outstanding(), 0);
}

#[test]
fn early_and_stale_responses_take_only_their_own_request() {
    check(Bound::AtLeast(4), allocators_vs_early_responses);
}

#[test]
#[should_panic(expected = "not its request's value")]
fn twin_early_and_stale_responses_complete_without_id_check() {
    check_mutant(Mutant::ReqCompleteNoIdCheck, Bound::AtLeast(4), allocators_vs_early_responses);
}

// --- 3. peek (the ACK path) while the request is cancelled and the slot reused -----------------

/// The poller peeks at A (an ACK, which does not end the call) while the timer cancels A and the
/// caller reuses the slot for B (wrapped id 0). `peek(A)` returns A's value or nothing — never
/// B's (the seqlock re-check in `peek`).
fn peek_vs_cancel_and_reuse() {
    let t = Arc::new(table());
    let id_a = t.allocate(A).expect("empty table");
    let timer = {
        let t = Arc::clone(&t);
        thread::spawn(move || {
            assert_eq!(t.cancel(id_a), Some(A));
            assert_eq!(t.allocate(B), Ok(0));
        })
    };
    let poller = {
        let t = Arc::clone(&t);
        thread::spawn(move || {
            let peeked = t.peek(id_a);
            assert!(peeked.is_none() || peeked == Some(A), "peek(A) returned {peeked:?}");
        })
    };
    timer.join().expect("timer panicked");
    poller.join().expect("poller panicked");
    assert_eq!(t.peek(id_a), None);
    assert_eq!(t.peek(0), Some(B));
    assert_eq!(t.complete(0), Some(B));
}

#[test]
fn peek_never_returns_the_next_requests_value() {
    check(Bound::Exhaustive, peek_vs_cancel_and_reuse);
}

#[test]
#[should_panic(expected = "peek(A) returned Some")]
fn twin_peek_never_returns_the_next_requests_value_without_recheck() {
    check_mutant(Mutant::ReqPeekNoRecheck, Bound::Exhaustive, peek_vs_cancel_and_reuse);
}

// --- 4. The channel breaks (cancel_all) while the response arrives ----------------------------

/// `cancel_all` (the connection broke) races the request's response: exactly one of them gets
/// the value.
fn cancel_all_vs_response() {
    let t = Arc::new(table());
    let id_a = t.allocate(A).expect("empty table");
    let breaker = {
        let t = Arc::clone(&t);
        thread::spawn(move || {
            let mut got = Vec::new();
            let n = t.cancel_all(|id, v| got.push((id, v)));
            assert_eq!(n, got.len());
            got
        })
    };
    let poller = {
        let t = Arc::clone(&t);
        thread::spawn(move || t.complete(id_a))
    };
    let cancelled = breaker.join().expect("breaker panicked");
    let completed = poller.join().expect("poller panicked");
    assert!(completed.is_none() || completed == Some(A));
    assert!(cancelled.is_empty() || cancelled == [(id_a, A)], "cancel_all took {cancelled:?}");
    assert_eq!(cancelled.len() + usize::from(completed.is_some()), 1, "A must be taken exactly once");
    assert_eq!(t.outstanding(), 0);
}

#[test]
fn cancel_all_and_response_take_a_request_exactly_once() {
    check(Bound::Exhaustive, cancel_all_vs_response);
}

#[test]
#[should_panic(expected = "A must be taken exactly once")]
fn twin_cancel_all_and_response_complete_without_id_check() {
    check_mutant(Mutant::ReqCompleteNoIdCheck, Bound::Exhaustive, cancel_all_vs_response);
}
