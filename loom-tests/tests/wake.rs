//! loom model of the Inline engine's held-ACK handshake with a user about to sleep
//! (`sim/src/wake.rs`; docs/sim.md, "Held ACKs"). A user that arms a CQ blocks on its event fd
//! and runs nothing until the event fires, so the ACK it waits for, held back by a peer's device
//! for that device's next pass, must be sent by someone else. The handshake is a store-buffer
//! pair; the model runs the production functions of `wake.rs` (through `bypass_sim::loom_api`:
//! `Cq::arm` on the production `CqShared::arm`, `Cq::peer_may_wait`, `HeldAcks`, and `Device`,
//! whose runs are `wake::run_flagged`, the device lock and work-flag loop of `Nic::run_inline`).
//!
//! [`a_held_ack_is_never_left_with_a_sleeper`]: the responder's device pass holds the ACK of the
//! requester's message if the requester has no CQ armed, publishes the hold and looks again
//! (`Nic::run_all`, `wake::publish_hold`) ‖ the requester's user arms its CQ and scans for NICs
//! holding ACKs (`Nic::on_arm` → `FabricShared::release_held_acks`). The ACK is always either
//! sent by the holder or seen by the arm's scan and sent by the release it runs.
//!
//! What is reduced, line by line against the code:
//!
//! - *Running the device* is the production lock/flag loop (`Device::raise_and_run` = the work
//!   flag raised, then `wake::run_flagged` = `Nic::run_inline`) around [`responder_pass`], which
//!   stands for `DeviceState::run_all` (a pass that starts with ACKs held sends them:
//!   `held_before`; else `only_holdable_acks` decides to hold) and `Nic::run_all`'s
//!   `publish_hold` (true: the ACK is sent, `dev.send_responses()`, and the flag lowered).
//! - The arm's release is `Nic::release_held_acks` without its second (Relaxed) look at the
//!   flag, which can only skip a run once the holder has lowered the flag, having sent.
//! - The holder's decision to hold is `DeviceState::only_holdable_acks`, whose only shared read
//!   is `Wire::holds_acks` = `wake::peer_may_wait` of the ACK's receiver (the rest is the
//!   holder's own device state, under its lock).
//! - `SimCq::arm` calls `pending_wakes` / `fire_if_armed` between `CqShared::arm` and
//!   `Nic::on_arm`; no completion is pending in this model, so they do nothing there.
//!
//! Broken twins (`bypass_sim::loom_api::mutation`): `HoldNoFence` (the holder reads the armed
//! count again without fencing after publishing the hold), `HoldNoRecheck` (it does not read it
//! again at all), `ArmNoFence` (the arm scans the hold flags without fencing after raising its
//! count). Each leaves the other side's fence in place: one fence is not enough. `RunNoRecheck`
//! (`run_flagged` does not look at the work flag again after unlocking): the arm's release,
//! flagged while the holder still had the device, is lost.
#![cfg(loom)]

use bypass_loom_tests::{check, Bound};
use bypass_sim::loom_api::mutation::{self as sim_mutation, Mutant as SimMutant};
use bypass_sim::loom_api::{Cq, Device, HeldAcks};
use loom::sync::Arc;
use loom::thread;
use std::sync::atomic::{AtomicUsize as StdAtomicUsize, Ordering};
use std::sync::{Mutex as StdMutex, MutexGuard, PoisonError};

/// Mutants are process-wide: every test here holds this lock around setting one and checking.
static SERIAL: StdMutex<()> = StdMutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Which pass sent the ACK, over all executions of the model (std atomics, outside the model),
/// so the test can check that every branch of the handshake is reached.
#[derive(Debug, Default)]
struct Coverage {
    by_holder: StdAtomicUsize,
    by_arm: StdAtomicUsize,
    by_holder_again: StdAtomicUsize,
}

impl Coverage {
    fn hit(c: &StdAtomicUsize) {
        c.fetch_add(1, Ordering::Relaxed);
    }
    fn get(c: &StdAtomicUsize) -> usize {
        c.load(Ordering::Relaxed)
    }
}

/// The responder's device, as far as its one ACK goes.
#[derive(Debug, Default)]
struct Responder {
    /// The ACK is held back (`DeviceState::acks_held`).
    held: bool,
    /// The ACK has left, and by which thread's pass: [`HOLDER_FIRST_PASS`] (never held, or sent
    /// at `publish_hold`'s second look), [`HOLDER_LATER_PASS`] (the holder's thread went round
    /// again: the arm raised the work flag while the holder had the device), [`ARM_PASS`].
    sent_by: Option<u8>,
}

const HOLDER_FIRST_PASS: u8 = 0;
const HOLDER_LATER_PASS: u8 = 1;
const ARM_PASS: u8 = 2;

/// One pass of the responder's device whose only output is the ACK of the requester's message,
/// run by thread `who` (`DeviceState::run_all`, then `Nic::run_all`'s publication).
fn responder_pass(st: &mut Responder, cq: &Cq, flag: &HeldAcks, who: u8, first: &mut bool) {
    let by = if who == ARM_PASS {
        ARM_PASS
    } else if std::mem::take(first) {
        HOLDER_FIRST_PASS
    } else {
        HOLDER_LATER_PASS
    };
    if st.sent_by.is_some() {
        return; // nothing left to send
    }
    if st.held {
        // A pass that starts with ACKs held sends them (`held_before`).
        st.held = false;
        st.sent_by = Some(by);
        flag.clear();
    } else if cq.peer_may_wait() {
        // `only_holdable_acks`: hold it; publish, fence, look again.
        if flag.publish_hold(|| !cq.peer_may_wait()) {
            st.sent_by = Some(by);
            flag.clear();
        } else {
            st.held = true;
        }
    } else {
        st.sent_by = Some(by);
    }
}

fn hold_model(cov: &std::sync::Arc<Coverage>) {
    // The requester NIC's CQ (its armed count is what `holds_acks` of the ACK's wire reads), the
    // responder NIC's `acks_held`, and the responder's device (lock, work flag, state).
    let cq = Arc::new(Cq::new(2));
    let flag = Arc::new(HeldAcks::default());
    let dev = Arc::new(Device::new(Responder::default()));
    let holder = {
        let (cq, flag, dev) = (cq.clone(), flag.clone(), dev.clone());
        thread::spawn(move || {
            // The responder's user rings or polls: its device runs on this thread.
            let mut first = true;
            dev.raise_and_run(|st| responder_pass(st, &cq, &flag, HOLDER_FIRST_PASS, &mut first));
        })
    };
    let user = {
        let (cq, flag, dev) = (cq.clone(), flag.clone(), dev.clone());
        thread::spawn(move || {
            // `SimCq::arm` → `Nic::on_arm` → `FabricShared::release_held_acks`'s scan →
            // `Nic::release_held_acks` (work flag raised, `run_inline`).
            cq.arm();
            if flag.holds() {
                let mut first = false;
                dev.raise_and_run(|st| responder_pass(st, &cq, &flag, ARM_PASS, &mut first));
            }
            // ... and the user sleeps, waiting for the ACK.
        })
    };
    holder.join().unwrap();
    user.join().unwrap();
    let sent_by = dev.with(|st| {
        assert!(!st.held, "an ACK is held while its peer's user sleeps, and nobody sends it");
        st.sent_by
    });
    match sent_by.expect("the ACK neither held nor sent") {
        HOLDER_FIRST_PASS => Coverage::hit(&cov.by_holder),
        HOLDER_LATER_PASS => Coverage::hit(&cov.by_holder_again),
        _ => Coverage::hit(&cov.by_arm),
    }
}

fn run_hold_model() -> std::sync::Arc<Coverage> {
    let cov = std::sync::Arc::new(Coverage::default());
    let c = cov.clone();
    check(Bound::Exhaustive, move || hold_model(&c));
    cov
}

#[test]
fn a_held_ack_is_never_left_with_a_sleeper() {
    let _serial = serial();
    let cov = run_hold_model();
    assert!(Coverage::get(&cov.by_holder) > 0, "no execution had the holder send the ACK in its pass");
    assert!(Coverage::get(&cov.by_arm) > 0, "no execution had the arm's thread run the release");
    assert!(
        Coverage::get(&cov.by_holder_again) > 0,
        "no execution had the holder's thread run the release the arm flagged while it held the device"
    );
}

/// The holder reads the armed count again without a fence after publishing the hold.
#[test]
#[should_panic(expected = "nobody sends it")]
fn twin_hold_without_fence_is_caught() {
    let _serial = serial();
    let _mutant = sim_mutation::set(SimMutant::HoldNoFence);
    run_hold_model();
}

/// The holder does not read the armed count again after publishing the hold: an arm between
/// its first look and the publication is missed by both.
#[test]
#[should_panic(expected = "nobody sends it")]
fn twin_hold_without_recheck_is_caught() {
    let _serial = serial();
    let _mutant = sim_mutation::set(SimMutant::HoldNoRecheck);
    run_hold_model();
}

/// The holder does not read the work flag again after unlocking its device: the arm's release,
/// flagged while the holder still had the device (it had just published the hold), is lost.
#[test]
#[should_panic(expected = "nobody sends it")]
fn twin_run_without_recheck_loses_a_release() {
    let _serial = serial();
    let _mutant = sim_mutation::set(SimMutant::RunNoRecheck);
    run_hold_model();
}

/// The arm scans the hold flags without a fence after raising its count.
#[test]
#[should_panic(expected = "nobody sends it")]
fn twin_arm_without_fence_misses_a_held_ack() {
    let _serial = serial();
    let _mutant = sim_mutation::set(SimMutant::ArmNoFence);
    run_hold_model();
}
