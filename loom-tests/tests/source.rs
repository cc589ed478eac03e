//! loom models of the liveness of a registration's memory (`sim/src/source.rs`), which the
//! in-process wire's by-reference payloads rely on: a peer's device copies straight from the
//! sender's registered memory, and a deregistration may free it at any moment. Through
//! `bypass_sim::loom_api::RegionLife`, the production `Life` over loom atomics; the memory is a
//! loom `UnsafeCell`, and the deregistration's "free" writes it, so a copy that is not ordered
//! before the free is a causality violation.
//!
//! - [`a_deregistration_never_frees_memory_under_a_copy`]: a reader enters, copies, exits ‖ the
//!   owner kills the liveness and frees: every copy the reader makes happens before the free,
//!   and it reads the live bytes.
//! - [`two_readers_and_a_deregistration`]: the same with two readers (the count, not a flag).
//!
//! Broken twin (`Mutant::SourceCheckThenEnter`): the reader checks the alive bit with a load and
//! counts itself afterwards; the deregistration slips between the two and frees under the copy.
#![cfg(loom)]

use bypass_loom_tests::{check, Bound};
use bypass_sim::loom_api::mutation::{self as sim_mutation, Mutant as SimMutant};
use bypass_sim::loom_api::RegionLife;
use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::thread;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// Mutants are process-wide: every test here holds this lock around setting one and checking.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

const LIVE: u8 = 0xab;
const FREED: u8 = 0xdd;

/// A registration: its liveness and its memory.
struct Region {
    life: RegionLife,
    mem: UnsafeCell<u8>,
}

// SAFETY: `mem` is read only by readers between a successful `enter` and their `exit`, and
// written only by the deregistration after `kill` returned: the protocol under test, which loom
// checks (any access it does not order is a causality violation).
unsafe impl Sync for Region {}

/// A peer's device placing a by-reference packet: true if it copied (and the bytes were live).
fn copy(r: &Region) -> bool {
    if !r.life.enter() {
        return false;
    }
    // SAFETY: entered: the memory is not freed before `exit` (what the model checks).
    let v = r.mem.with(|p| unsafe { *p });
    assert_eq!(v, LIVE, "copied freed memory");
    r.life.exit();
    true
}

/// The owner deregisters: kill, then free (the allocator writes the memory).
fn deregister(r: &Region) {
    r.life.kill();
    // SAFETY: `kill` returned: no reader is in the memory (what the model checks).
    r.mem.with_mut(|p| unsafe { *p = FREED });
}

/// Executions in which a reader copied, and in which one found the memory gone.
static COPIED: AtomicUsize = AtomicUsize::new(0);
static REFUSED: AtomicUsize = AtomicUsize::new(0);

fn readers_model(readers: usize) {
    let r = Arc::new(Region { life: RegionLife::new(), mem: UnsafeCell::new(LIVE) });
    let threads: Vec<_> = (0..readers)
        .map(|_| {
            let r = r.clone();
            thread::spawn(move || {
                let n = if copy(&r) { &COPIED } else { &REFUSED };
                n.fetch_add(1, Ordering::Relaxed);
            })
        })
        .collect();
    deregister(&r);
    for t in threads {
        t.join().unwrap();
    }
    assert!(!r.life.enter(), "a reader entered a killed registration");
}

fn one_reader_model() {
    readers_model(1);
}

#[test]
fn a_deregistration_never_frees_memory_under_a_copy() {
    let _serial = serial();
    COPIED.store(0, Ordering::Relaxed);
    REFUSED.store(0, Ordering::Relaxed);
    check(Bound::Exhaustive, one_reader_model);
    assert!(COPIED.load(Ordering::Relaxed) > 0, "no execution copied before the deregistration");
    assert!(REFUSED.load(Ordering::Relaxed) > 0, "no execution found the memory gone");
}

#[test]
fn two_readers_and_a_deregistration() {
    let _serial = serial();
    check(Bound::Env, || readers_model(2));
}

/// Checking the bit with a load, then counting the reader: the deregistration can clear the bit
/// and find no reader between the two, and free the memory the reader then copies.
#[test]
#[should_panic(expected = "Causality violation")]
fn twin_check_then_enter_is_caught() {
    let _serial = serial();
    let _mutant = sim_mutation::set(SimMutant::SourceCheckThenEnter);
    check(Bound::Exhaustive, one_reader_model);
}
