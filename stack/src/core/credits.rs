//! # credits: sender-side flow control
//!
//! A two-sided SEND consumes one receive buffer that the peer posted beforehand. If none is
//! posted, the peer's NIC answers with an RNR NAK and the sender's NIC retries, slowing the whole
//! connection down, and with a finite `rnr_retry` the send fails and the queue enters ERROR. So the
//! stack keeps, per connection, a [`Credits`] counter: **how many receive buffers the peer has
//! posted for us that we have not used yet**.
//!
//! - The peer grants its initial receive depth when the connection is set up ([`Credits::new`],
//!   [`Credits::with_limit`]).
//! - Every message the sender posts first takes one credit ([`Credits::try_take`], or
//!   [`Credits::take_wait`] to block). No credit, no post: the caller gets
//!   [`CreditError::WouldBlock`] (EAGAIN) or waits.
//! - When the peer has consumed a message and re-posted its receive buffer, it returns the credit,
//!   piggy-backed on a response (or an ACK); the receiving side calls [`Credits::give`].
//!
//! ## Invariant
//!
//! **A sender never posts more messages than the peer has receive buffers posted for it.** Taking
//! credits never drives the counter below zero, and every posted message holds one. Therefore a
//! receiver-not-ready (RNR) NAK, or an RNR-retry-exceeded completion, is a *fault* — a peer that
//! did not re-post what it returned, or returned credits it did not have — and never the normal
//! backpressure; the normal backpressure is `WouldBlock` here, before anything is posted. This is
//! eRPC's session credits, and it is why [`Credits::give`] refuses to raise the counter above its
//! limit: more credits than receive buffers is a protocol error to report, not to absorb.
//!
//! ## Implementation
//!
//! One `AtomicU64` holds `waiters << 32 | available`. [`Credits::try_take`] and
//! [`Credits::give`] are compare-exchange loops on that word: lock-free, no allocation, and the
//! check (`available >= n`, `available + n <= limit`) and the update are one atomic step, so the
//! count can never go negative or past the limit. These two are the core that loom checks (they
//! use the crate-internal `sync` shim).
//!
//! [`Credits::take_wait`] spins briefly on `try_take`, then takes a mutex and, in **one**
//! compare-exchange, either takes the credits or registers as a waiter (the high half), and sleeps
//! on a condition variable. `give` learns from the very word it updated whether anyone is
//! registered; only then does it take the mutex and notify. Because registration and the
//! availability check are the same atomic step, and a waiter holds the mutex from registration
//! until it sleeps, a `give` either lands before the registration (the waiter sees its credits and
//! does not sleep) or after it (the giver sees the waiter and its notification, taken under the
//! mutex, reaches it): no wakeup is lost, with no `SeqCst` and no lock on the fast path. A woken
//! waiter takes its credits and unregisters in one compare-exchange too. Under `cfg(loom)` the
//! mutex and condition variable are loom's, so a model can check the slow path as well (with
//! `deadline = None`: loom has no clock, so deadlines are ignored there).
//!
//! There is no fairness: a waiter that wants many credits can be overtaken by takers of few.
//! The stack takes one credit per message, where this does not matter.

use std::fmt;
use std::sync::PoisonError;
use std::time::Instant;

#[cfg(loom)]
use loom::sync::Condvar;
#[cfg(not(loom))]
use std::sync::Condvar;

#[cfg(loom)]
use crate::sync::mutation::{self, Mutant};
use crate::sync::{spin_loop_hint, AtomicU64, Mutex, MutexGuard, Ordering};

/// The `available` half of the word.
const AVAILABLE: u64 = 0xFFFF_FFFF;
/// One registered waiter, in the high half of the word.
const WAITER: u64 = 1 << 32;

/// `try_take` attempts [`Credits::take_wait`] makes before it sleeps. Loom explores every one of
/// them, so it gets a single attempt there.
const SPINS: u32 = if cfg!(loom) { 1 } else { 64 };

const fn available_of(word: u64) -> u32 {
    (word & AVAILABLE) as u32
}

const fn waiters_of(word: u64) -> u32 {
    (word >> 32) as u32
}

/// Why a credit operation was refused. A refused operation changes nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CreditError {
    /// Not enough credits right now: the peer has no free receive buffer for this message. Nothing
    /// was taken; retry after the peer returns credits (EAGAIN), or use [`Credits::take_wait`].
    #[error("flow control: {wanted} credit(s) wanted, {available} available; the peer has no free receive buffer for this message, retry when it returns credits")]
    WouldBlock {
        /// Credits available when the attempt was made.
        available: u32,
        /// Credits asked for.
        wanted: u32,
    },
    /// [`Credits::take_wait`] reached its deadline without getting the credits. Nothing was taken.
    #[error(
        "timed out waiting for {wanted} credit(s) ({available} available at the deadline); nothing was taken"
    )]
    TimedOut {
        /// Credits available at the deadline.
        available: u32,
        /// Credits asked for.
        wanted: u32,
    },
    /// More credits were asked for than the limit, so the request could never succeed (waiting
    /// would never end).
    #[error("{wanted} credit(s) can never be available: the peer grants at most {limit}; split the batch")]
    ExceedsLimit {
        /// Credits asked for.
        wanted: u32,
        /// The counter's limit.
        limit: u32,
    },
    /// [`Credits::give`] would raise the counter above its limit: the peer returned more credits
    /// than it has receive buffers for us (a protocol error, or a duplicated response). Nothing
    /// was added; treat the connection as broken.
    #[error("peer returned {given} credit(s) with {available} available, above the limit of {limit}: it returned receive buffers it does not have (protocol error); nothing was added")]
    Overflow {
        /// Credits available before the refused `give`.
        available: u32,
        /// Credits the peer tried to return.
        given: u32,
        /// The counter's limit.
        limit: u32,
    },
    /// [`Credits::with_limit`] was given more initial credits than its limit.
    #[error("initial credits {initial} exceed the limit {limit}")]
    InvalidLimit {
        /// The initial credits asked for.
        initial: u32,
        /// The limit asked for.
        limit: u32,
    },
}

impl CreditError {
    /// True for [`CreditError::WouldBlock`]: retrying later can succeed.
    pub fn is_would_block(&self) -> bool {
        matches!(self, CreditError::WouldBlock { .. })
    }
}

/// The credits a sender holds on one connection: receive buffers the peer has posted for it and
/// that it has not used yet. See the [module documentation](self) for the protocol and invariant.
///
/// Shared by reference (or `Arc`) between the threads that post and the thread that polls
/// responses; every method takes `&self`.
pub struct Credits {
    /// `waiters << 32 | available`.
    word: AtomicU64,
    /// Most credits the counter may hold (the peer's receive depth for us).
    limit: u32,
    /// Slow path only: held by a waiter from registration until it sleeps, and by `give` to
    /// notify.
    lock: Mutex<()>,
    wake: Condvar,
}

impl fmt::Debug for Credits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let word = self.word.load(Ordering::Relaxed);
        f.debug_struct("Credits")
            .field("available", &available_of(word))
            .field("waiters", &waiters_of(word))
            .field("limit", &self.limit)
            .finish()
    }
}

impl Credits {
    /// A counter starting at `initial` credits, with no limit below `u32::MAX`. Prefer
    /// [`Credits::with_limit`] when the peer's receive depth is known, so over-returned credits
    /// are caught.
    pub fn new(initial: u32) -> Credits {
        Credits::build(initial, u32::MAX)
    }

    /// A counter starting at `initial` credits that may never exceed `limit` (the number of
    /// receive buffers the peer posts for this sender). Typically `initial == limit`.
    pub fn with_limit(initial: u32, limit: u32) -> Result<Credits, CreditError> {
        if initial > limit {
            return Err(CreditError::InvalidLimit { initial, limit });
        }
        Ok(Credits::build(initial, limit))
    }

    fn build(initial: u32, limit: u32) -> Credits {
        Credits {
            word: AtomicU64::new(u64::from(initial)),
            limit,
            lock: Mutex::new(()),
            wake: Condvar::new(),
        }
    }

    /// Credits available right now (a snapshot).
    pub fn available(&self) -> u32 {
        available_of(self.word.load(Ordering::Relaxed))
    }

    /// Threads currently registered in [`Credits::take_wait`]'s slow path (a snapshot, for
    /// diagnostics and tests).
    pub fn waiters(&self) -> u32 {
        waiters_of(self.word.load(Ordering::Relaxed))
    }

    /// The most credits this counter may hold.
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// Takes `n` credits if that many are available, else fails with
    /// [`CreditError::WouldBlock`] and takes nothing (or [`CreditError::ExceedsLimit`] if `n` is
    /// above the limit). Lock-free; never drives the count below zero. Taking 0 always succeeds.
    pub fn try_take(&self, n: u32) -> Result<(), CreditError> {
        if n > self.limit {
            return Err(CreditError::ExceedsLimit { wanted: n, limit: self.limit });
        }
        let mut cur = self.word.load(Ordering::Relaxed);
        loop {
            let available = available_of(cur);
            if available < n {
                return Err(CreditError::WouldBlock { available, wanted: n });
            }
            // MUTANT (loom twin only, see `sync::mutation`): store instead of compare-exchange.
            #[cfg(loom)]
            if mutation::enabled(Mutant::CreditsTakeLoadStore) {
                self.word.store(cur - u64::from(n), Ordering::Release);
                return Ok(());
            }
            // available >= n, so the subtraction stays inside the low half.
            match self.word.compare_exchange(cur, cur - u64::from(n), Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return Ok(()),
                Err(actual) => cur = actual,
            }
        }
    }

    /// Returns `n` credits (the peer re-posted `n` receive buffers and said so in a response), and
    /// wakes any thread blocked in [`Credits::take_wait`]. Lock-free unless a thread is waiting.
    ///
    /// Fails with [`CreditError::Overflow`], adding nothing, if the count would exceed the limit:
    /// the peer returned credits it never had.
    pub fn give(&self, n: u32) -> Result<(), CreditError> {
        if n == 0 {
            return Ok(());
        }
        let mut cur = self.word.load(Ordering::Relaxed);
        loop {
            let available = available_of(cur);
            let Some(sum) = available.checked_add(n).filter(|sum| *sum <= self.limit) else {
                return Err(CreditError::Overflow { available, given: n, limit: self.limit });
            };
            let new = (cur & !AVAILABLE) | u64::from(sum);
            match self.word.compare_exchange(cur, new, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => {
                    // MUTANT (loom twin only, see `sync::mutation`): never wake (lost wakeup).
                    #[cfg(loom)]
                    if mutation::enabled(Mutant::CreditsGiveNoWake) {
                        return Ok(());
                    }
                    // `cur` is exactly the word this give replaced: if no waiter was registered
                    // in it, any later registration sees these credits (same word), so there is
                    // nobody to wake.
                    if waiters_of(cur) != 0 {
                        self.wake_all();
                    }
                    return Ok(());
                }
                Err(actual) => cur = actual,
            }
        }
    }

    /// Takes `n` credits, waiting for the peer to return them if necessary: spins briefly, then
    /// sleeps until a [`Credits::give`] wakes it or `deadline` passes (`None`: no deadline).
    ///
    /// Errors: [`CreditError::TimedOut`] at the deadline (nothing taken), or
    /// [`CreditError::ExceedsLimit`] at once if `n` is above the limit. A deadline already in the
    /// past still succeeds if the credits are available. Under `cfg(loom)` the deadline is ignored.
    pub fn take_wait(&self, n: u32, deadline: Option<Instant>) -> Result<(), CreditError> {
        for _ in 0..SPINS {
            match self.try_take(n) {
                Err(CreditError::WouldBlock { .. }) => spin_loop_hint(),
                other => return other,
            }
        }
        // loom has no clock (a timed wait never times out there), and reading the real one would
        // make executions differ between loom's iterations.
        #[cfg(loom)]
        let deadline: Option<Instant> = {
            let _ignored = deadline;
            None
        };
        self.wait_slow(n, deadline)
    }

    /// The sleeping part of `take_wait`.
    fn wait_slow(&self, n: u32, deadline: Option<Instant>) -> Result<(), CreditError> {
        let mut guard = self.lock();
        if !self.take_or_register(n) {
            return Ok(());
        }
        // Registered, holding the lock: no `give` can notify before this thread sleeps.
        loop {
            guard = match deadline {
                None => self.wake.wait(guard).unwrap_or_else(PoisonError::into_inner),
                Some(deadline) => {
                    let now = Instant::now();
                    if now >= deadline {
                        return self.unregister(n);
                    }
                    match self.wake.wait_timeout(guard, deadline - now) {
                        Ok((guard, _)) => guard,
                        Err(poisoned) => poisoned.into_inner().0,
                    }
                }
            };
            if self.take_registered(n) {
                drop(guard);
                return Ok(());
            }
        }
    }

    /// One compare-exchange: take `n` credits (returns `false`) or register as a waiter (returns
    /// `true`).
    fn take_or_register(&self, n: u32) -> bool {
        let mut cur = self.word.load(Ordering::Acquire);
        loop {
            let enough = available_of(cur) >= n;
            // Waiters can never reach 2^32 (each is a blocked thread), so `+ WAITER` stays in the
            // high half.
            let new = if enough { cur - u64::from(n) } else { cur + WAITER };
            match self.word.compare_exchange(cur, new, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return !enough,
                Err(actual) => cur = actual,
            }
        }
    }

    /// For a registered waiter: take `n` credits and unregister in one compare-exchange (returns
    /// `true`), or stay registered if they are not there (returns `false`).
    fn take_registered(&self, n: u32) -> bool {
        let mut cur = self.word.load(Ordering::Acquire);
        loop {
            if available_of(cur) < n {
                return false;
            }
            // Registered, so the high half holds at least one WAITER.
            match self.word.compare_exchange(
                cur,
                cur - u64::from(n) - WAITER,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                Err(actual) => cur = actual,
            }
        }
    }

    /// For a registered waiter at its deadline: unregister, taking the credits if they arrived
    /// meanwhile, else report the time-out with nothing taken.
    fn unregister(&self, n: u32) -> Result<(), CreditError> {
        let mut cur = self.word.load(Ordering::Acquire);
        loop {
            let available = available_of(cur);
            let (new, result) = if available >= n {
                (cur - u64::from(n) - WAITER, Ok(()))
            } else {
                (cur - WAITER, Err(CreditError::TimedOut { available, wanted: n }))
            };
            match self.word.compare_exchange(cur, new, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return result,
                Err(actual) => cur = actual,
            }
        }
    }

    fn wake_all(&self) {
        // Taking the lock orders this notification after any registered waiter has gone to sleep.
        let _guard = self.lock();
        self.wake.notify_all();
    }

    /// The slow-path mutex guards nothing but the sleep itself, so a poisoned lock is harmless.
    fn lock(&self) -> MutexGuard<'_, ()> {
        self.lock.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64 as StdU64, Ordering as O};
    use std::sync::mpsc;
    use std::sync::{Arc, Barrier};
    use std::time::Duration;

    use crate::test_rng::Rng;

    /// A failure guard only: nothing in these tests waits for time to pass.
    const GUARD: Duration = Duration::from_secs(30);

    /// Spins (yielding) until `cond` holds; panics after [`GUARD`].
    fn wait_until(what: &str, cond: impl Fn() -> bool) {
        let give_up = Instant::now() + GUARD;
        while !cond() {
            assert!(Instant::now() < give_up, "gave up waiting for {what}");
            std::thread::yield_now();
        }
    }

    #[test]
    fn take_and_give_account_exactly() {
        let c = Credits::new(3);
        assert_eq!((c.available(), c.waiters(), c.limit()), (3, 0, u32::MAX));
        assert_eq!(c.try_take(0), Ok(()));
        assert_eq!(c.try_take(2), Ok(()));
        assert_eq!(c.try_take(2), Err(CreditError::WouldBlock { available: 1, wanted: 2 }));
        assert_eq!(c.available(), 1);
        assert_eq!(c.try_take(1), Ok(()));
        assert_eq!(c.try_take(1), Err(CreditError::WouldBlock { available: 0, wanted: 1 }));
        assert!(c.try_take(1).is_err_and(|e| e.is_would_block()));
        assert_eq!(c.give(0), Ok(()));
        assert_eq!(c.give(4), Ok(()));
        assert_eq!(c.available(), 4);
        assert_eq!(c.take_wait(4, None), Ok(()));
        assert_eq!(c.available(), 0);
        let msg = CreditError::WouldBlock { available: 0, wanted: 1 }.to_string();
        assert!(msg.contains("receive buffer"), "{msg}");
    }

    #[test]
    fn limits_are_enforced_and_refusals_change_nothing() {
        assert_eq!(Credits::with_limit(5, 4).err(), Some(CreditError::InvalidLimit { initial: 5, limit: 4 }));
        let c = Credits::with_limit(2, 4).expect("initial within limit");
        assert_eq!(c.give(3), Err(CreditError::Overflow { available: 2, given: 3, limit: 4 }));
        assert_eq!(c.available(), 2);
        assert_eq!(c.give(2), Ok(()));
        assert_eq!(c.give(1), Err(CreditError::Overflow { available: 4, given: 1, limit: 4 }));
        assert_eq!(c.try_take(5), Err(CreditError::ExceedsLimit { wanted: 5, limit: 4 }));
        assert_eq!(c.take_wait(5, None), Err(CreditError::ExceedsLimit { wanted: 5, limit: 4 }));
        assert_eq!((c.available(), c.waiters()), (4, 0));

        let full = Credits::new(u32::MAX);
        assert_eq!(
            full.give(1),
            Err(CreditError::Overflow { available: u32::MAX, given: 1, limit: u32::MAX })
        );
        assert_eq!(full.try_take(u32::MAX), Ok(()));
        assert_eq!(full.give(u32::MAX), Ok(()));
        assert_eq!(full.available(), u32::MAX);
    }

    #[test]
    fn timed_out_wait_returns_an_error_and_takes_nothing() {
        let c = Credits::new(1);
        let past = Instant::now();
        assert_eq!(c.take_wait(2, Some(past)), Err(CreditError::TimedOut { available: 1, wanted: 2 }));
        // Goes through the sleeping path (the deadline is in the future when it registers).
        let soon = Instant::now() + Duration::from_millis(20);
        assert_eq!(c.take_wait(2, Some(soon)), Err(CreditError::TimedOut { available: 1, wanted: 2 }));
        assert!(Instant::now() >= soon);
        assert_eq!((c.available(), c.waiters()), (1, 0));
        // A past deadline does not stop a wait that needs no waiting.
        assert_eq!(c.take_wait(1, Some(past)), Ok(()));
        assert_eq!(c.available(), 0);
    }

    #[test]
    fn take_wait_is_woken_by_give() {
        let c = Arc::new(Credits::new(0));
        let waiter = {
            let c = Arc::clone(&c);
            std::thread::spawn(move || c.take_wait(3, Some(Instant::now() + GUARD)))
        };
        // Handshake: the waiter is registered (past its spin, about to sleep or asleep).
        wait_until("the waiter to register", || c.waiters() == 1);
        assert_eq!(c.give(2), Ok(()));
        // Not enough for it: it must still be waiting, having taken nothing.
        assert_eq!(c.available(), 2);
        assert_eq!(c.give(1), Ok(()));
        assert_eq!(waiter.join().expect("waiter panicked"), Ok(()));
        assert_eq!((c.available(), c.waiters()), (0, 0));
    }

    #[test]
    fn one_give_wakes_every_waiter_it_can_satisfy() {
        const WAITERS: u32 = 3;
        let c = Arc::new(Credits::new(0));
        let waiters: Vec<_> = (0..WAITERS)
            .map(|_| {
                let c = Arc::clone(&c);
                std::thread::spawn(move || c.take_wait(1, Some(Instant::now() + GUARD)))
            })
            .collect();
        wait_until("every waiter to register", || c.waiters() == WAITERS);
        assert_eq!(c.give(WAITERS), Ok(()));
        for w in waiters {
            assert_eq!(w.join().expect("waiter panicked"), Ok(()));
        }
        assert_eq!((c.available(), c.waiters()), (0, 0));
    }

    /// Takers take 1..=4 credits (half of them blocking), "post" them to a peer thread, and the
    /// peers return them in random batches, the way responses piggy-back credits. Checks that no
    /// more credits than exist are ever held at once and that every credit comes back.
    #[test]
    fn stress_takers_and_givers_account_exactly() {
        const TAKERS: usize = 2;
        const GIVERS: usize = 2;
        const ITERS: usize = 50_000;
        const TOTAL: u32 = 16;
        const SEED: u64 = 0xC4ED_175E;
        let c = Arc::new(Credits::with_limit(TOTAL, TOTAL).expect("valid limit"));
        // Credits taken and not yet returned; never above TOTAL if the counter is right.
        let held = Arc::new(StdU64::new(0));
        let start = Arc::new(Barrier::new(TAKERS + GIVERS));
        let (txs, rxs): (Vec<_>, Vec<_>) = (0..GIVERS).map(|_| mpsc::channel::<u32>()).unzip();

        let givers: Vec<_> = rxs
            .into_iter()
            .enumerate()
            .map(|(g, rx)| {
                let (c, held, start) = (Arc::clone(&c), Arc::clone(&held), Arc::clone(&start));
                std::thread::spawn(move || -> Result<u64, String> {
                    let mut rng = Rng(SEED ^ (0x6173 + g as u64));
                    let (mut pending, mut given, mut batch) = (0u32, 0u64, 1 + rng.below(8) as u32);
                    let mut flush = |pending: &mut u32| -> Result<(), String> {
                        held.fetch_sub(u64::from(*pending), O::SeqCst);
                        c.give(*pending).map_err(|e| e.to_string())?;
                        given += u64::from(*pending);
                        *pending = 0;
                        Ok(())
                    };
                    start.wait();
                    loop {
                        match rx.try_recv() {
                            Ok(n) => {
                                pending += n;
                                if pending >= batch {
                                    flush(&mut pending)?;
                                    batch = 1 + rng.below(8) as u32;
                                }
                            }
                            // Nothing more to piggy-back on: return what we hold, then wait.
                            Err(mpsc::TryRecvError::Empty) if pending > 0 => flush(&mut pending)?,
                            Err(mpsc::TryRecvError::Empty) => match rx.recv() {
                                Ok(n) => pending += n,
                                Err(_) => break,
                            },
                            Err(mpsc::TryRecvError::Disconnected) => {
                                flush(&mut pending)?;
                                break;
                            }
                        }
                    }
                    Ok(given)
                })
            })
            .collect();

        let takers: Vec<_> = (0..TAKERS)
            .map(|t| {
                let (c, held, start) = (Arc::clone(&c), Arc::clone(&held), Arc::clone(&start));
                let txs = txs.clone();
                std::thread::spawn(move || -> Result<u64, String> {
                    let mut rng = Rng(SEED ^ (0x7A6B + t as u64));
                    let mut taken = 0u64;
                    start.wait();
                    for _ in 0..ITERS {
                        let n = 1 + rng.below(4) as u32;
                        let got = if rng.percent(50) {
                            c.take_wait(n, Some(Instant::now() + GUARD)).map(|()| true)
                        } else {
                            match c.try_take(n) {
                                Ok(()) => Ok(true),
                                Err(CreditError::WouldBlock { .. }) => Ok(false),
                                Err(e) => Err(e),
                            }
                        };
                        if !got.map_err(|e| e.to_string())? {
                            continue;
                        }
                        let now = held.fetch_add(u64::from(n), O::SeqCst) + u64::from(n);
                        if now > u64::from(TOTAL) {
                            return Err(format!("{now} credits held at once, only {TOTAL} exist"));
                        }
                        if c.available() > TOTAL {
                            return Err(format!("counter at {} (went negative?)", c.available()));
                        }
                        taken += u64::from(n);
                        txs[rng.below(GIVERS)].send(n).map_err(|e| e.to_string())?;
                    }
                    Ok(taken)
                })
            })
            .collect();
        drop(txs);

        let mut taken = 0;
        for t in takers {
            taken += t.join().expect("taker panicked").unwrap_or_else(|e| panic!("seed {SEED:#x}: {e}"));
        }
        let mut given = 0;
        for g in givers {
            given += g.join().expect("giver panicked").unwrap_or_else(|e| panic!("seed {SEED:#x}: {e}"));
        }
        assert_eq!(taken, given, "seed {SEED:#x}");
        assert!(taken > 0);
        assert_eq!((c.available(), c.waiters(), held.load(O::SeqCst)), (TOTAL, 0, 0), "seed {SEED:#x}");
    }
}
