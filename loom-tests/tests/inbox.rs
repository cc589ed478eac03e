//! loom models of a NIC's inbox (`sim/src/inbox.rs`): the lock-free ring of packet slots that
//! sending NICs fill and the receiving device drains, through `bypass_sim::loom_api::Inbox`
//! (the production code, whose atomics, mutex and slot cells are loom's under `--cfg loom`, so
//! every header and payload access is checked too).
//!
//! - [`packets_arrive_once_in_order_through_a_full_inbox`]: one sender pushes 3 packets through
//!   a 2-slot inbox (retrying when full) ‖ the device takes them: each arrives once, in order,
//!   with its bytes.
//! - [`two_senders_never_share_a_slot`]: two senders push one packet each into a 2-slot inbox ‖
//!   the device takes both: each once, with its own bytes.
//! - [`a_refused_sender_is_always_kicked`]: a sender refused by a full 1-slot inbox registers
//!   and marks the blocking slot ‖ the device takes the packet (its free sees the mark or the
//!   sender sees the free and retries): if the sender is refused, the device kicks it.
//! - [`a_refused_sender_is_always_kicked_from_the_middle_of_the_ring`]: the same through a full
//!   2-slot inbox, where the sender marks the slot halfway along the ring (the newer one, not
//!   the head's that blocked it) ‖ the device takes both packets.
//!
//! - [`a_run_reads_only_published_slots`]: a sender pushes the three segments of a READ by
//!   reference (back to back in one source) into a 4-slot inbox ‖ the device takes *runs*
//!   (`with_front_run`, which looks at the slots behind the head): however the runs are cut,
//!   every segment arrives once, in order, with its bytes.
//!
//! Broken twins (`bypass_sim::loom_api::mutation`): the slot published `Relaxed` (a causality
//! violation on the slot), the position claimed with a load and a store (two senders write one
//! slot), the waited-on slot marked with a load and a store (a lost kick, at depth 1 and 2), and
//! the run scan reading a slot's header before checking that it is published.
#![cfg(loom)]

use bypass_loom_tests::{check, Bound};
use bypass_sim::loom_api::mutation::{self as sim_mutation, Mutant as SimMutant};
use bypass_sim::loom_api::{Inbox, RefSource};
use loom::sync::Arc;
use loom::thread;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// Mutants are process-wide and `check` serializes only models, not the setting of a mutant:
/// every test here holds this lock around both.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Packet `i` of sender `s`: `i + 1` bytes of value `0x10 * s + i`.
fn payload(s: u32, i: u32) -> Vec<u8> {
    vec![(0x10 * s + i) as u8; i as usize + 1]
}

/// The device's side: takes `n` packets, yielding while the inbox is empty.
fn take(ib: &Inbox, n: usize) -> Vec<(u32, u32, Vec<u8>)> {
    let mut got = Vec::new();
    while got.len() < n {
        // SAFETY: this thread is the model's only consumer.
        match unsafe { ib.take(&mut Vec::new()) } {
            Some(p) => got.push(p),
            None => thread::yield_now(),
        }
    }
    // SAFETY: as above.
    assert!(unsafe { ib.take(&mut Vec::new()) }.is_none(), "a packet arrived twice");
    got
}

/// Executions of the first model in which the sender found the inbox full.
static FULL_SEEN: AtomicUsize = AtomicUsize::new(0);

fn in_order_model() {
    const N: u32 = 3;
    let ib = Arc::new(Inbox::new(2, 4));
    let tx = ib.clone();
    let sender = thread::spawn(move || {
        for i in 0..N {
            while !tx.push(1, i, &payload(1, i), false) {
                FULL_SEEN.fetch_add(1, Ordering::Relaxed);
                thread::yield_now();
            }
        }
    });
    let rx = ib.clone();
    let device = thread::spawn(move || {
        let got = take(&rx, N as usize);
        for (i, p) in got.into_iter().enumerate() {
            assert_eq!(p, (1, i as u32, payload(1, i as u32)), "packet {i} out of order or altered");
        }
    });
    sender.join().unwrap();
    device.join().unwrap();
}

#[test]
fn packets_arrive_once_in_order_through_a_full_inbox() {
    let _serial = serial();
    FULL_SEEN.store(0, Ordering::Relaxed);
    check(Bound::Env, in_order_model);
    assert!(FULL_SEEN.load(Ordering::Relaxed) > 0, "no execution found the inbox full");
}

/// The slot published `Relaxed`: the device acquires nothing and reads a slot whose write does
/// not happen before its read.
#[test]
#[should_panic(expected = "Causality violation")]
fn twin_publish_relaxed_is_caught() {
    let _serial = serial();
    let _mutant = sim_mutation::set(SimMutant::InboxPublishRelaxed);
    check(Bound::Env, in_order_model);
}

fn two_senders_model() {
    let ib = Arc::new(Inbox::new(2, 4));
    let senders: Vec<_> = (1..=2)
        .map(|s| {
            let tx = ib.clone();
            thread::spawn(move || assert!(tx.push(s, 0, &payload(s, 0), false), "sender {s} refused"))
        })
        .collect();
    let rx = ib.clone();
    let device = thread::spawn(move || {
        let mut got = take(&rx, 2);
        got.sort();
        assert_eq!(got, [(1, 0, payload(1, 0)), (2, 0, payload(2, 0))], "a packet lost or altered");
    });
    for s in senders {
        s.join().unwrap();
    }
    device.join().unwrap();
}

#[test]
fn two_senders_never_share_a_slot() {
    let _serial = serial();
    check(Bound::Env, two_senders_model);
}

/// Claiming with a load and a store: both senders can claim position 0 and write one slot.
#[test]
#[should_panic(expected = "Causality violation")]
fn twin_claim_load_store_is_caught() {
    let _serial = serial();
    let _mutant = sim_mutation::set(SimMutant::InboxClaimLoadStore);
    check(Bound::Env, two_senders_model);
}

/// A full inbox of `depth` slots, a sender that waits for room, a device that drains it: a
/// refused sender is kicked. At depth 1 the sender marks the slot that blocked it; at depth 2
/// one halfway along the ring, the newest (the device's first free must not be the only chance).
fn kick_model_at(depth: u32) {
    let ib = Arc::new(Inbox::new(depth as usize, 4));
    for i in 0..depth {
        assert!(ib.push(1, i, &payload(1, i), true));
    }
    let refused = Arc::new(loom::sync::atomic::AtomicBool::new(false));
    let (tx, r) = (ib.clone(), refused.clone());
    let sender = thread::spawn(move || {
        if !tx.push(2, 0, &payload(2, 0), true) {
            r.store(true, loom::sync::atomic::Ordering::Relaxed);
        }
    });
    let rx = ib.clone();
    let device = thread::spawn(move || {
        let mut kicked = Vec::new();
        for i in 0..depth {
            // SAFETY: this thread is the model's only consumer.
            assert_eq!(unsafe { rx.take(&mut kicked) }, Some((1, i, payload(1, i))));
        }
        kicked
    });
    sender.join().unwrap();
    let kicked = device.join().unwrap();
    let refused = refused.load(loom::sync::atomic::Ordering::Relaxed);
    assert!(!refused || kicked == [2], "lost kick: the sender was refused and never kicked ({kicked:?})");
}

fn kick_model() {
    kick_model_at(1);
}

#[test]
fn a_refused_sender_is_always_kicked() {
    let _serial = serial();
    check(Bound::Exhaustive, kick_model);
}

#[test]
fn a_refused_sender_is_always_kicked_from_the_middle_of_the_ring() {
    let _serial = serial();
    check(Bound::Exhaustive, || kick_model_at(2));
}

/// The same mutant at depth 2.
#[test]
#[should_panic(expected = "lost kick")]
fn twin_mark_load_store_is_caught_in_the_middle_of_the_ring() {
    let _serial = serial();
    let _mutant = sim_mutation::set(SimMutant::InboxMarkLoadStore);
    check(Bound::Exhaustive, || kick_model_at(2));
}

/// Marking the blocking slot with a load and a store: the device's free can fall between them
/// and be overwritten (the inbox then looks full with nothing in it, and nobody kicks the sender).
#[test]
#[should_panic(expected = "lost kick")]
fn twin_mark_load_store_is_caught() {
    let _serial = serial();
    let _mutant = sim_mutation::set(SimMutant::InboxMarkLoadStore);
    check(Bound::Exhaustive, kick_model);
}

/// Executions of the run model in which the device took more than one packet at once.
static RUN_SEEN: AtomicUsize = AtomicUsize::new(0);

fn run_model() {
    const N: u32 = 3;
    let ib = Arc::new(Inbox::new(4, 4));
    let src = Arc::new(RefSource::new(&[1, 2, 3, 4, 5, 6]));
    let (tx, s) = (ib.clone(), src.clone());
    let sender = thread::spawn(move || {
        for k in 0..N {
            assert!(tx.push_ref(1, 10 + k, k == 0, k == N - 1, &s, 2 * k as usize, 2, false), "refused");
        }
    });
    let (mut ids, mut bytes) = (Vec::new(), Vec::new());
    while ids.len() < N as usize {
        // SAFETY: this thread is the model's only consumer.
        match unsafe { ib.take_run(8, &mut Vec::new()) } {
            Some((i, b)) => {
                if i.len() > 1 {
                    RUN_SEEN.fetch_add(1, Ordering::Relaxed);
                }
                ids.extend(i);
                bytes.extend(b);
            }
            None => thread::yield_now(),
        }
    }
    sender.join().unwrap();
    assert_eq!(ids, [(1, 10), (1, 11), (1, 12)], "a segment lost, repeated or out of order");
    assert_eq!(bytes, [1, 2, 3, 4, 5, 6], "a segment's bytes altered");
    drop(src);
}

#[test]
fn a_run_reads_only_published_slots() {
    let _serial = serial();
    RUN_SEEN.store(0, Ordering::Relaxed);
    check(Bound::Env, run_model);
    assert!(RUN_SEEN.load(Ordering::Relaxed) > 0, "no execution took a run of several packets");
}

/// The run scan reads the next slot's header before its sequence: a header its sender may be
/// writing.
#[test]
#[should_panic(expected = "Causality violation")]
fn twin_run_read_before_check_is_caught() {
    let _serial = serial();
    let _mutant = sim_mutation::set(SimMutant::InboxRunReadBeforeCheck);
    check(Bound::Env, run_model);
}
