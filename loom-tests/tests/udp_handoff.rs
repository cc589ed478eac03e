//! loom models of the UDP wire's receive handoff (`sim/src/handoff.rs`): the device reads the
//! socket while reads are asked for (by polls, and by the receive thread when datagrams arrive
//! while nobody polls), and the receive thread, which sleeps on a tick without watching the socket
//! while the user polls, must not miss a user that arms a CQ and goes to sleep. Through
//! `bypass_sim::loom_api::UdpHandoff`, the production `RxHandoff` over loom atomics. The socket is
//! a loom atomic count of waiting datagrams.
//!
//! - [`an_arrival_asked_for_is_always_read`]: a datagram arrives and the receive thread asks
//!   for a read ‖ the device reads (finding the socket empty or not): afterwards, a datagram still
//!   on the socket always has a read pending, and the device's loop reads it.
//! - [`a_user_going_to_sleep_is_never_missed`]: a user arms a CQ and rings the bell if the
//!   thread ticks ‖ the receive thread decides to tick: it never ticks unrung while a CQ is armed.
//!
//! Broken twins: `UdpWantAfterRead` (the drain reads `want` after the socket, so an ask for an
//! arrival after the read is marked done: the datagram waits with no read pending) and
//! `UdpNoFenceBeforeArmedCheck` (no fence between raising `ticking` and reading the armed count:
//! both sides miss each other, the lost wake-up).
#![cfg(loom)]

use bypass_loom_tests::{check, Bound};
use bypass_sim::loom_api::mutation::{self as sim_mutation, Mutant as SimMutant};
use bypass_sim::loom_api::UdpHandoff;
use loom::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize};
use loom::sync::Arc;
use loom::thread;
use std::sync::atomic::Ordering;
use std::sync::{Mutex, MutexGuard, PoisonError};

/// Mutants are process-wide: every test here holds this lock around setting one and checking.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One device read: takes every waiting datagram; true if it found none.
fn device_read(h: &UdpHandoff, socket: &AtomicUsize, taken: &AtomicUsize) {
    h.read(|| {
        let n = socket.swap(0, Ordering::Acquire);
        taken.fetch_add(n, Ordering::Relaxed);
        n == 0
    });
}

fn read_model() {
    let h = Arc::new(UdpHandoff::default());
    let socket = Arc::new(AtomicUsize::new(0));
    let taken = Arc::new(AtomicUsize::new(0));
    let arrival = {
        let (h, socket) = (h.clone(), socket.clone());
        thread::spawn(move || {
            // The kernel queues the datagram; the receive thread, woken by it, asks for a read.
            socket.fetch_add(1, Ordering::Release);
            h.ask();
        })
    };
    // A poll asked earlier: the device reads once, racing with the arrival.
    h.ask();
    device_read(&h, &socket, &taken);
    arrival.join().unwrap();
    assert!(
        socket.load(Ordering::Acquire) == 0 || h.pending(),
        "a datagram waits on the socket and no read is pending"
    );
    // The device's run loop: it reads while a read is pending.
    let mut rounds = 0;
    while h.pending() {
        device_read(&h, &socket, &taken);
        rounds += 1;
        assert!(rounds <= 2, "reads stay pending with the socket empty");
    }
    assert_eq!(taken.load(Ordering::Relaxed), 1, "the datagram was not read");
}

#[test]
fn an_arrival_asked_for_is_always_read() {
    let _serial = serial();
    check(Bound::Exhaustive, read_model);
}

/// Reading `want` after the socket: the drain finds the socket empty, the datagram arrives and
/// is asked for, and the drain then marks that ask done.
#[test]
#[should_panic(expected = "a datagram waits on the socket and no read is pending")]
fn twin_want_after_read_is_caught() {
    let _serial = serial();
    let _mutant = sim_mutation::set(SimMutant::UdpWantAfterRead);
    check(Bound::Exhaustive, read_model);
}

fn sleep_model() {
    let h = Arc::new(UdpHandoff::default());
    let armed = Arc::new(AtomicU32::new(0));
    let bell = Arc::new(AtomicBool::new(false));
    let user = {
        let (h, armed, bell) = (h.clone(), armed.clone(), bell.clone());
        thread::spawn(move || {
            // `SimCq::arm`: the NIC's armed count, then the port's `attention`.
            armed.fetch_add(1, Ordering::AcqRel);
            if h.attention() {
                bell.store(true, Ordering::Release);
            }
            // ... and the user sleeps on its event fd.
        })
    };
    let ticked = h.may_tick(|| armed.load(Ordering::Relaxed) > 0);
    user.join().unwrap();
    assert!(
        !ticked || bell.load(Ordering::Acquire),
        "the receive thread ticks without watching the socket while a user sleeps, and nobody rang it"
    );
    if ticked {
        h.end_tick();
    }
}

#[test]
fn a_user_going_to_sleep_is_never_missed() {
    let _serial = serial();
    check(Bound::Exhaustive, sleep_model);
}

/// No fence between raising `ticking` and reading the armed count: the thread reads the count
/// from before the arm, the user reads `ticking` from before the thread raised it.
#[test]
#[should_panic(expected = "nobody rang it")]
fn twin_no_fence_before_armed_check_is_caught() {
    let _serial = serial();
    let _mutant = sim_mutation::set(SimMutant::UdpNoFenceBeforeArmedCheck);
    check(Bound::Exhaustive, sleep_model);
}
