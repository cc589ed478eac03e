#![cfg(loom)]
//! loom models of the send-context double release (`bypass::tx_ctx::TxSlab`).
//!
//! One call's context is raced by the paths that may finish it — the send completion, the
//! peer's ACK and response, a timer, a flushed send completion — each on its own thread and each
//! following the protocol of the `tx_ctx` module docs and the client (`claim_completion` before
//! the report; only the claim winner delivers). Every model asserts:
//!
//! - the context returns to the slab **exactly once** (one `Outcome::Released`, carrying the
//!   call's token), and `in_use() == 0` once every path is done;
//! - the caller's completion is delivered **exactly once** (one `claim_completion` winner, which
//!   takes the call's pending state);
//! - every report made with the old handle after the release is rejected as stale — in the
//!   models with a reusing thread, even while the slot is live again under the next generation;
//! - nothing touches the context after release: the call's per-slot state is a loom `UnsafeCell`
//!   that, in the models with a reusing thread, the next user of the slot writes as soon as `get`
//!   hands the slot out again, so an access of an old path that is not ordered before the
//!   release is reported by loom, and the next call's state machine must be untouched.
//!
//! The timeout and flush races run without the reusing thread: with it they fail on the current
//! code (the `bug_` models at the end, ignored; see "Known bug" in the README).

use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;

use bypass::tx_ctx::{CallMode, Event, FailReason, Outcome, TxError, TxHandle, TxSlab};
use bypass_loom_tests::{check, check_mutant, Bound, Mutant};

/// The call under test.
const TOKEN: u64 = 0xCA11;
/// The next call, which reuses the slot once it is released.
const NEXT_TOKEN: u64 = 0x0E47;

/// One path that may finish the call, as the client runs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    /// A successful send completion.
    SendCqe,
    /// A send completion with status `Flushed` (the queue entered ERROR).
    SendFlushed,
    /// The peer's ACK.
    Ack,
    /// The peer's response.
    Rsp,
    /// The call's timer.
    Timeout,
}

/// A one-context slab with one call in flight, plus what the client keeps per slot.
struct Call {
    slab: TxSlab,
    mode: CallMode,
    handle: TxHandle,
    /// The slot's pending call (the client's `slots[i].pending`): set by whoever takes the slot,
    /// taken by the claim winner to deliver. A loom cell: an access racing with the slot's next
    /// user is reported.
    pending: UnsafeCell<Option<u64>>,
    /// Completions delivered to the caller.
    delivered: AtomicUsize,
    /// Reports that returned `Outcome::Released`.
    released: AtomicUsize,
    /// Path threads that have finished.
    finished: AtomicUsize,
}

impl Call {
    fn new(mode: CallMode) -> Call {
        let slab = TxSlab::new(1).expect("capacity 1 is valid");
        let handle = slab.get(mode, TOKEN).expect("a fresh slab has a free context");
        Call {
            slab,
            mode,
            handle,
            pending: UnsafeCell::new(Some(TOKEN)),
            delivered: AtomicUsize::new(0),
            released: AtomicUsize::new(0),
            finished: AtomicUsize::new(0),
        }
    }

    /// Whether `path` may complete the call in this mode (the client's policy, `tx_ctx` docs).
    fn completes(&self, path: Path) -> bool {
        match path {
            Path::SendCqe => self.mode == CallMode::EarlyRsp,
            Path::Ack => self.mode == CallMode::AckEarlyRsp,
            Path::Rsp | Path::SendFlushed | Path::Timeout => true,
        }
    }

    /// Runs `path` the way the client does: claim first if the path may complete the call, and
    /// if the claim is won take the pending call and deliver; then report the event.
    fn run(&self, path: Path) {
        let h = self.handle;
        if self.completes(path) {
            match self.slab.claim_completion(h) {
                Ok(true) => {
                    // SAFETY: loom tracks every access to the cell and panics, before the access,
                    // if it is not ordered with the other accesses (the claim winner is the only
                    // path that touches the pending call; whether the slot's next user can reach
                    // it meanwhile is what the `bug_` models show).
                    let taken = self.pending.with_mut(|p| unsafe { (*p).take() });
                    assert_eq!(taken, Some(TOKEN), "{path:?}: the claim winner must find its own call");
                    self.delivered.fetch_add(1, Ordering::Relaxed);
                    // A WAIT_RSP call's winning response ends the hold and reports itself in
                    // one step, as the client does (`end_claim_and_complete`).
                    if path == Path::Rsp && self.mode == CallMode::WaitRsp {
                        match self.slab.end_claim_and_complete(h, Event::Rsp) {
                            Ok(Outcome::Released { token }) => {
                                assert_eq!(token, TOKEN, "{path:?}: released with another call's token");
                                self.released.fetch_add(1, Ordering::Relaxed);
                            }
                            Ok(Outcome::Pending) => {}
                            Err(e) => panic!("{path:?}: end_claim_and_complete failed: {e}"),
                        }
                        self.finished.fetch_add(1, Ordering::Release);
                        return;
                    }
                    // The winner no longer needs the slot: end the claim's hold (this may be
                    // the report that releases the context).
                    match self.slab.end_claim(h) {
                        Ok(Outcome::Released { token }) => {
                            assert_eq!(token, TOKEN, "{path:?}: released with another call's token");
                            self.released.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(Outcome::Pending) => {}
                        Err(e) => panic!("{path:?}: end_claim failed: {e}"),
                    }
                }
                // Somebody else claimed (and delivers); `Stale`: released, so somebody did.
                Ok(false) | Err(TxError::Stale { .. }) => {}
                Err(e) => panic!("{path:?}: claim_completion failed: {e}"),
            }
        }
        let result = match path {
            Path::SendCqe => self.slab.complete(h, Event::SendCqe),
            Path::SendFlushed => self.slab.fail(h, FailReason::Flushed),
            Path::Ack => self.slab.complete(h, Event::Ack),
            Path::Rsp => self.slab.complete(h, Event::Rsp),
            Path::Timeout => self.slab.fail(h, FailReason::Timeout),
        };
        match result {
            Ok(Outcome::Released { token }) => {
                assert_eq!(token, TOKEN, "{path:?}: released with another call's token");
                self.released.fetch_add(1, Ordering::Relaxed);
            }
            Ok(Outcome::Pending) => {}
            // The send completion is never waived, so only the other paths can find the context
            // already released.
            Err(TxError::Stale { .. }) if !matches!(path, Path::SendCqe | Path::SendFlushed) => {}
            Err(e) => panic!("{path:?}: report rejected: {e}"),
        }
        self.finished.fetch_add(1, Ordering::Release);
    }

    /// The slot's next user, racing the paths: takes the slot as soon as it is free and writes
    /// its own pending call (what the client does after `get`). Returns the new handle, or
    /// `None` if every path finished before the slot was seen free.
    fn reuse(&self, paths: usize) -> Option<TxHandle> {
        loop {
            if let Some(h2) = self.slab.get(CallMode::WaitRsp, NEXT_TOKEN) {
                assert_eq!(h2.index, self.handle.index);
                assert_eq!(
                    h2.generation,
                    self.handle.generation.wrapping_add(1),
                    "reuse bumps the generation"
                );
                // SAFETY: the slot is ours from `get`; loom panics, before the access, if a path
                // of the old call touches the cell without being ordered before this write.
                self.pending.with_mut(|p| unsafe { *p = Some(NEXT_TOKEN) });
                // The old handle names the same, live slot: it must bounce.
                assert_eq!(
                    self.slab.complete(self.handle, Event::Rsp),
                    Err(TxError::Stale { handle: self.handle })
                );
                return Some(h2);
            }
            if self.finished.load(Ordering::Acquire) == paths {
                return None;
            }
            thread::yield_now();
        }
    }

    /// After every path thread joined: exactly one release, one delivery, old handle stale, and
    /// the next call (if the slot was reused) untouched by the old call's paths.
    fn verify(&self, reused: Option<TxHandle>) {
        assert_eq!(self.released.load(Ordering::Relaxed), 1, "the context must be released exactly once");
        assert_eq!(
            self.delivered.load(Ordering::Relaxed),
            1,
            "the completion must be delivered exactly once"
        );
        let h = self.handle;
        assert_eq!(self.slab.claim_completion(h), Err(TxError::Stale { handle: h }));
        assert_eq!(self.slab.fail(h, FailReason::Flushed), Err(TxError::Stale { handle: h }));
        assert_eq!(self.slab.complete(h, Event::SendCqe), Err(TxError::Stale { handle: h }));
        match reused {
            Some(h2) => {
                assert_eq!(self.slab.in_use(), 1);
                // SAFETY: every other thread has been joined (and loom checks it).
                let pending = self.pending.with(|p| unsafe { *p });
                assert_eq!(pending, Some(NEXT_TOKEN), "an old path touched the next call's state");
                // The next call is exactly as `get` left it: nothing old was applied to it.
                assert_eq!(self.slab.complete(h2, Event::SendCqe), Ok(Outcome::Pending));
                assert_eq!(self.slab.claim_completion(h2), Ok(true));
                assert_eq!(self.slab.end_claim(h2), Ok(Outcome::Pending));
                assert_eq!(self.slab.complete(h2, Event::Rsp), Ok(Outcome::Released { token: NEXT_TOKEN }));
            }
            None => {
                // SAFETY: every other thread has been joined (and loom checks it).
                let pending = self.pending.with(|p| unsafe { *p });
                assert_eq!(pending, None, "delivered, so the pending call was taken");
            }
        }
        assert_eq!(self.slab.in_use(), 0, "a context leaked");
        let stats = self.slab.stats();
        assert_eq!(stats.allocated, stats.released);
    }
}

/// Runs each group of paths on its own thread (a group's paths in order, like one poller
/// handling the ACK then the response), plus, if `reuse`, the slot's next user on another. The
/// main thread only sets up, joins and verifies: loom's partial-order reduction can miss races
/// of the main thread's operations (see the README), so every racing party is a spawned thread.
fn race(mode: CallMode, groups: &'static [&'static [Path]], reuse: bool) {
    let call = Arc::new(Call::new(mode));
    let paths: usize = groups.iter().map(|g| g.len()).sum();
    let reuser = reuse.then(|| {
        let call = Arc::clone(&call);
        thread::spawn(move || call.reuse(paths))
    });
    let threads: Vec<_> = groups
        .iter()
        .map(|group| {
            let call = Arc::clone(&call);
            thread::spawn(move || {
                for path in group.iter() {
                    call.run(*path);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("path thread panicked");
    }
    let reused = reuser.and_then(|r| r.join().expect("reusing thread panicked"));
    call.verify(reused);
}

// --- 1. The seed's race: the send completion and the response on two threads -----------------

fn send_cqe_vs_response() {
    race(CallMode::WaitRsp, &[&[Path::SendCqe], &[Path::Rsp]], true);
}

#[test]
fn send_completion_races_response() {
    check(Bound::AtLeast(3), send_cqe_vs_response);
}

#[test]
#[should_panic(expected = "the context must be released exactly once")]
fn twin_send_completion_races_response_report_load_store() {
    check_mutant(Mutant::TxReportLoadStore, Bound::AtLeast(3), send_cqe_vs_response);
}

// --- 2. ACK mode: the send completion against the ACK and the response (one poller) ----------

fn send_cqe_vs_ack_then_response() {
    race(CallMode::Ack, &[&[Path::SendCqe], &[Path::Ack, Path::Rsp]], true);
}

#[test]
fn send_completion_races_ack_then_response() {
    check(Bound::AtLeast(3), send_cqe_vs_ack_then_response);
}

#[test]
#[should_panic(expected = "the context must be released exactly once")]
fn twin_send_completion_races_ack_then_response_report_load_store() {
    check_mutant(Mutant::TxReportLoadStore, Bound::AtLeast(3), send_cqe_vs_ack_then_response);
}

// --- 3. A timeout as a third party ------------------------------------------------------------
//
// No reuse here: see the `bug_` models below.

fn timeout_vs_send_cqe_and_response() {
    race(CallMode::WaitRsp, &[&[Path::SendCqe], &[Path::Rsp], &[Path::Timeout]], false);
}

#[test]
fn timeout_races_send_completion_and_response() {
    check(Bound::AtLeast(3), timeout_vs_send_cqe_and_response);
}

#[test]
// A lost update leaves the context live after every path ran: the old handle is not stale.
#[should_panic(expected = "right: Err(Stale")]
fn twin_timeout_races_send_completion_and_response_report_load_store() {
    check_mutant(Mutant::TxReportLoadStore, Bound::AtLeast(3), timeout_vs_send_cqe_and_response);
}

// --- 4. A flush after the response --------------------------------------------------------------
//
// No reuse here: see the `bug_` models below.

fn flush_vs_response() {
    race(CallMode::WaitRsp, &[&[Path::Rsp], &[Path::SendFlushed]], false);
}

#[test]
fn flushed_send_completion_races_response() {
    check(Bound::Exhaustive, flush_vs_response);
}

#[test]
#[should_panic(expected = "Concurrent write accesses to `UnsafeCell`")]
fn twin_flushed_send_completion_races_response_claim_load_store() {
    check_mutant(Mutant::TxClaimLoadStore, Bound::Exhaustive, flush_vs_response);
}

// --- 5. A claim winner and the slot's reuse -----------------------------------------------------
//
// `claim_completion` makes exactly one path deliver, and a won claim also *holds* the context
// (`HELD`) until the winner calls `end_claim`, after taking the call's state out of the slot. The
// release condition respects the hold, so a winner whose own event is not needed for the release
// (a timer after the send completion and the response; a response followed by a flush) cannot
// see the slot handed to the next call while it is still on its way to it. These models found
// that bug (before the hold existed the old path's take and the next call's write of the slot
// were unordered: a causality violation on the pending call); the twins switch the hold off.

fn timeout_claims_then_send_cqe_and_response_release_and_reuse() {
    race(CallMode::WaitRsp, &[&[Path::SendCqe, Path::Rsp], &[Path::Timeout]], true);
}

/// The timer wins the claim; the send completion and the response then report (all required
/// events done) while another thread waits to reuse the slot.
#[test]
fn timeout_claim_winner_holds_the_context_against_release_and_reuse() {
    check(Bound::Env, timeout_claims_then_send_cqe_and_response_release_and_reuse);
}

#[test]
#[should_panic]
fn twin_timeout_claim_winner_without_hold() {
    check_mutant(
        Mutant::TxClaimNoHold,
        Bound::Env,
        timeout_claims_then_send_cqe_and_response_release_and_reuse,
    );
}

fn response_claims_then_flush_releases_and_reuse() {
    race(CallMode::WaitRsp, &[&[Path::Rsp], &[Path::SendFlushed]], true);
}

/// The response wins the claim; a flushed send completion then reports (terminal: the response's
/// own report is waived) while another thread waits to reuse the slot.
#[test]
fn response_claim_winner_holds_the_context_against_flush_and_reuse() {
    check(Bound::Env, response_claims_then_flush_releases_and_reuse);
}

#[test]
#[should_panic]
fn twin_response_claim_winner_without_hold() {
    check_mutant(Mutant::TxClaimNoHold, Bound::Env, response_claims_then_flush_releases_and_reuse);
}
