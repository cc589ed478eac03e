#![cfg(loom)]
//! loom models of sender-side flow control (`bypass::credits::Credits`).
//!
//! - `try_take` / `give` from several threads: the count never goes below zero or above the
//!   limit (more holders than credits, or a refused `give`, fail the model), and every credit
//!   taken is given back (the count ends at the limit).
//! - `take_wait`'s slow path (loom's `Mutex` / `Condvar` under `cfg(loom)`; deadline `None`,
//!   loom has no clock): a thread blocked for a credit is woken by the `give` that returns one —
//!   no lost wakeup (loom reports a deadlock otherwise) — and registered waiters are all gone at
//!   the end.
//!
//! Every racing party is a spawned thread; the main thread only sets up, joins and checks (see
//! the README on loom's partial-order reduction).

// `std`'s `Arc`, not loom's: a lost wakeup ends a model in a loom deadlock, and dropping a loom
// `Arc` while that panic unwinds would be a second (aborting) panic. What the `Arc` orders is not
// under test here.
use std::sync::Arc;

use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::thread;

use bypass::credits::{CreditError, Credits};
use bypass_loom_tests::{check, check_mutant, Bound, Mutant};

/// Credits plus a count of messages "in flight" (holding a credit).
struct Flow {
    credits: Credits,
    holders: AtomicUsize,
}

impl Flow {
    fn new(initial: u32, limit: u32) -> Flow {
        Flow {
            credits: Credits::with_limit(initial, limit).expect("initial <= limit"),
            holders: AtomicUsize::new(0),
        }
    }

    /// Holds the credit just taken (a posted message), then returns it (the peer re-posted the
    /// receive buffer and said so). Never more holders than the limit.
    fn use_and_return(&self) {
        let holding = self.holders.fetch_add(1, Ordering::AcqRel) + 1;
        assert!(
            holding <= self.credits.limit() as usize,
            "{holding} messages in flight with {} receive buffers",
            self.credits.limit()
        );
        self.holders.fetch_sub(1, Ordering::AcqRel);
        assert_eq!(self.credits.give(1), Ok(()), "returning a taken credit must never overflow");
    }

    /// Once every thread joined: every take was matched by a give.
    fn verify(&self) {
        assert_eq!(self.holders.load(Ordering::Relaxed), 0);
        assert_eq!(self.credits.available(), self.credits.limit(), "a credit leaked or was duplicated");
        assert_eq!(self.credits.waiters(), 0, "a waiter stayed registered");
    }
}

// --- 1. try_take / give ----------------------------------------------------------------------

/// One credit, two senders: each tries to take it, posts, and returns it. A third party returns
/// a credit the peer never granted: it must be refused.
fn try_take_and_give() {
    let flow = Arc::new(Flow::new(1, 1));
    let sender = || {
        let flow = Arc::clone(&flow);
        thread::spawn(move || match flow.credits.try_take(1) {
            Ok(()) => {
                flow.use_and_return();
                true
            }
            Err(CreditError::WouldBlock { .. }) => false,
            Err(e) => panic!("try_take: {e}"),
        })
    };
    let (a, b) = (sender(), sender());
    let took = [a, b].map(|t| t.join().expect("sender panicked"));
    assert!(took.iter().any(|t| *t), "one sender at least finds the credit");
    flow.verify();
    // The counter is full: a credit the peer never granted is a protocol error, not absorbed.
    assert!(matches!(flow.credits.give(1), Err(CreditError::Overflow { .. })));
    assert_eq!(flow.credits.available(), 1);
}

#[test]
fn try_take_and_give_stay_within_the_limit() {
    check(Bound::Exhaustive, try_take_and_give);
}

#[test]
#[should_panic(expected = "returning a taken credit must never overflow")]
fn twin_try_take_and_give_take_load_store() {
    check_mutant(Mutant::CreditsTakeLoadStore, Bound::Exhaustive, try_take_and_give);
}

// --- 2. take_wait's slow path woken by give --------------------------------------------------

/// No credit yet: a sender blocks in `take_wait` (deadline `None`) while the peer's response
/// returns one credit — before the sender spins, between its spin and its registration, or
/// after it sleeps. The sender gets the credit in every order, then returns it after use; nobody
/// is left registered and the count ends full.
fn take_wait_woken_by_give() {
    let flow = Arc::new(Flow::new(0, 1));
    let waiter = {
        let flow = Arc::clone(&flow);
        thread::spawn(move || {
            assert_eq!(flow.credits.take_wait(1, None), Ok(()));
            flow.use_and_return();
        })
    };
    let peer = {
        let flow = Arc::clone(&flow);
        thread::spawn(move || {
            assert_eq!(flow.credits.give(1), Ok(()), "the peer's grant fits the limit");
        })
    };
    waiter.join().expect("waiter panicked");
    peer.join().expect("peer panicked");
    flow.verify();
}

#[test]
fn take_wait_is_woken_by_give() {
    check(Bound::Exhaustive, take_wait_woken_by_give);
}

#[test]
#[should_panic(expected = "deadlock")]
fn twin_take_wait_is_woken_by_give_without_wakeup() {
    check_mutant(Mutant::CreditsGiveNoWake, Bound::Exhaustive, take_wait_woken_by_give);
}

/// Two senders block in `take_wait` for one credit each; the peer returns one credit, and each
/// sender returns its credit after use, so the other is woken in turn.
fn two_waiters_share_one_credit() {
    let flow = Arc::new(Flow::new(0, 1));
    let waiter = || {
        let flow = Arc::clone(&flow);
        thread::spawn(move || {
            assert_eq!(flow.credits.take_wait(1, None), Ok(()));
            flow.use_and_return();
        })
    };
    let (a, b) = (waiter(), waiter());
    let peer = {
        let flow = Arc::clone(&flow);
        thread::spawn(move || assert_eq!(flow.credits.give(1), Ok(())))
    };
    for t in [a, b, peer] {
        t.join().expect("thread panicked");
    }
    flow.verify();
}

#[test]
fn two_waiters_are_woken_in_turn() {
    check(Bound::AtLeast(4), two_waiters_share_one_credit);
}

#[test]
#[should_panic(expected = "deadlock")]
fn twin_two_waiters_are_woken_in_turn_without_wakeup() {
    check_mutant(Mutant::CreditsGiveNoWake, Bound::AtLeast(4), two_waiters_share_one_credit);
}
