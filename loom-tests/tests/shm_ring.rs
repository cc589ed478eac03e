//! loom models of the shared-memory wire's ring and doorbell protocol: the production
//! `bypass_sim::loom_api::shm_ring` code (`sim/src/shm/ring.rs`), whose atomics are loom's under
//! `--cfg loom`, over slots in loom `UnsafeCell`s so that every frame byte access is checked too.
//! In production the same functions run on control blocks inside the shared mapping.
//!
//! - [`frames_arrive_once_in_order_through_a_full_ring`]: a producer pushes 3 frames through a
//!   2-slot ring (it fills; the producer retries on `Full`), a consumer pops them: each arrives
//!   exactly once, in order, with its bytes and length.
//! - [`a_sleeping_consumer_is_never_left_asleep`]: the consumer raises its sleeping flag and looks
//!   for pending frames ‖ the producer publishes one frame and asks whether to wake. Whenever the
//!   consumer decides to sleep (saw nothing pending), the producer must have seen the flag.
//! - [`a_waiting_producer_is_never_left_waiting`]: the mirror image for a full ring: the producer
//!   finds a 1-slot ring full and raises its waiting flag ‖ the consumer pops and asks whether the
//!   producer waits. Whenever the producer is refused, the consumer must see the flag.
//!
//! Broken twins (`bypass_sim::loom_api::mutation`): the producer index published `Relaxed`
//! (caught as a causality violation on the slot), and each Dekker pair without the producer's
//! SeqCst fence (a lost wake-up, a lost unblock).
#![cfg(loom)]

use bypass_loom_tests::{check, Bound};
use bypass_sim::loom_api::mutation::{self as sim_mutation, Mutant as SimMutant};
use bypass_sim::loom_api::shm_ring::{self as ring, Bell, Pop, Push, RingCtl, Slots};
use loom::cell::UnsafeCell;
use loom::sync::atomic::AtomicBool;
use loom::sync::Arc;
use loom::thread;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// Bytes per slot: the 4-byte length word and up to 4 frame bytes.
const SLOT: usize = 8;

/// Mutants are process-wide and `check` serializes only models, not the setting of a mutant:
/// every test here holds this lock around both.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Slots in loom cells: loom checks that the producer's write of a slot happens before the
/// consumer's read of it, and the consumer's read before the producer's next write.
struct Cells(Vec<UnsafeCell<[u8; SLOT]>>);

impl Cells {
    fn new(depth: u32) -> Self {
        Cells((0..depth).map(|_| UnsafeCell::new([0; SLOT])).collect())
    }
}

impl Slots for Cells {
    fn depth(&self) -> u32 {
        self.0.len() as u32
    }
    unsafe fn with_slot_mut<R>(&self, i: u32, f: impl FnOnce(&mut [u8]) -> R) -> R {
        // SAFETY: the ring protocol gives the producer this slot alone (loom checks it).
        self.0[i as usize].with_mut(|p| f(unsafe { &mut *p }))
    }
    unsafe fn with_slot<R>(&self, i: u32, f: impl FnOnce(&[u8]) -> R) -> R {
        // SAFETY: the ring protocol gives the consumer this published slot (loom checks it).
        self.0[i as usize].with(|p| f(unsafe { &*p }))
    }
}

struct Ring {
    ctl: RingCtl,
    slots: Cells,
    bell: Bell,
}

impl Ring {
    fn new(depth: u32) -> Arc<Ring> {
        Arc::new(Ring { ctl: RingCtl::new(), slots: Cells::new(depth), bell: Bell::new() })
    }
}

/// Frame `i`: `i + 1` bytes of value `0x10 + i`.
fn frame(i: u8) -> Vec<u8> {
    vec![0x10 + i; usize::from(i) + 1]
}

fn push_frame(r: &Ring, i: u8) -> Push {
    let f = frame(i);
    let got = ring::push(&r.ctl, &r.slots, |buf| {
        buf.get_mut(..f.len())?.copy_from_slice(&f);
        Some(f.len())
    });
    if got == Push::Sent {
        ring::mark_pending(&r.bell, 0);
    }
    got
}

/// Executions of the first model in which the producer found the ring full.
static FULL_SEEN: AtomicUsize = AtomicUsize::new(0);

fn frames_model() {
    const N: u8 = 3;
    let r = Ring::new(2);
    let p = r.clone();
    let producer = thread::spawn(move || {
        for i in 0..N {
            loop {
                match push_frame(&p, i) {
                    Push::Sent => break,
                    Push::Full => {
                        FULL_SEEN.fetch_add(1, Ordering::Relaxed);
                        thread::yield_now();
                    }
                    Push::TooLong => panic!("frame {i} does not fit"),
                }
            }
        }
    });
    let c = r.clone();
    let consumer = thread::spawn(move || {
        let mut next = 0u8;
        while next < N {
            match ring::pop(&c.ctl, &c.slots, |f| f.map(<[u8]>::to_vec)) {
                Pop::Empty => thread::yield_now(),
                Pop::Frame(Ok(got)) => {
                    assert_eq!(got, frame(next), "frame {next} arrived with other bytes");
                    next += 1;
                }
                Pop::Frame(Err(len)) => panic!("frame {next}: impossible length {len}"),
                Pop::Corrupt(n) => panic!("corrupt indices ({n} apart)"),
            }
        }
        assert_eq!(ring::pop(&c.ctl, &c.slots, |_| ()), Pop::Empty, "a frame arrived twice");
    });
    producer.join().unwrap();
    consumer.join().unwrap();
}

#[test]
fn frames_arrive_once_in_order_through_a_full_ring() {
    let _serial = serial();
    FULL_SEEN.store(0, Ordering::Relaxed);
    check(Bound::Env, frames_model);
    assert!(FULL_SEEN.load(Ordering::Relaxed) > 0, "no execution found the ring full");
}

/// The producer index published `Relaxed`: the consumer acquires nothing, and reads a slot the
/// producer's write does not happen before.
#[test]
#[should_panic(expected = "Causality violation")]
fn twin_publish_relaxed_is_caught() {
    let _serial = serial();
    let _mutant = sim_mutation::set(SimMutant::ShmPublishRelaxed);
    check(Bound::Env, frames_model);
}

fn sleep_model() {
    let r = Ring::new(2);
    // What each side decided, read after both joined.
    let slept = Arc::new(AtomicBool::new(false));
    let woke = Arc::new(AtomicBool::new(false));
    let (c, s) = (r.clone(), slept.clone());
    let consumer = thread::spawn(move || {
        let seen = ring::prepare_sleep(&c.bell);
        if ring::any_pending(&c.bell) {
            // Frames: take them rather than sleep.
            ring::end_sleep(&c.bell);
            let bits = ring::take_pending(&c.bell);
            assert_eq!(bits, 1);
            match ring::pop(&c.ctl, &c.slots, |f| f.map(<[u8]>::to_vec)) {
                Pop::Frame(Ok(got)) => assert_eq!(got, frame(0)),
                other => panic!("pending, but the ring gave {other:?}"),
            }
        } else {
            // FUTEX_WAIT(doorbell, seen): only a doorbell bump after `seen` ends this sleep.
            s.store(true, loom::sync::atomic::Ordering::Relaxed);
            let _ = seen;
        }
    });
    let (p, w) = (r.clone(), woke.clone());
    let producer = thread::spawn(move || {
        assert_eq!(push_frame(&p, 0), Push::Sent);
        if ring::wake_needed(&p.bell) {
            ring::ring_doorbell(&p.bell);
            w.store(true, loom::sync::atomic::Ordering::Relaxed);
        }
    });
    consumer.join().unwrap();
    producer.join().unwrap();
    let (slept, woke) =
        (slept.load(loom::sync::atomic::Ordering::Relaxed), woke.load(loom::sync::atomic::Ordering::Relaxed));
    assert!(!slept || woke, "lost wake-up: the consumer sleeps with a frame pending and nobody wakes it");
}

#[test]
fn a_sleeping_consumer_is_never_left_asleep() {
    let _serial = serial();
    check(Bound::Exhaustive, sleep_model);
}

/// Without the producer's fence between publishing and reading the sleeping flag, both sides can
/// read the other's old value (store buffering): the consumer sleeps, the producer does not wake.
#[test]
#[should_panic(expected = "lost wake-up")]
fn twin_no_fence_before_the_sleep_check_is_caught() {
    let _serial = serial();
    let _mutant = sim_mutation::set(SimMutant::ShmNoFenceBeforeSleepCheck);
    check(Bound::Exhaustive, sleep_model);
}

fn full_model() {
    let r = Ring::new(1);
    assert_eq!(push_frame(&r, 0), Push::Sent); // the ring is full before the threads start
    let blocked = Arc::new(AtomicBool::new(false));
    let told = Arc::new(AtomicBool::new(false));
    let (p, b) = (r.clone(), blocked.clone());
    let producer = thread::spawn(move || match push_frame(&p, 1) {
        Push::Sent => {}
        // The device marks the queue blocked and waits for the consumer's wake.
        Push::Full => b.store(true, loom::sync::atomic::Ordering::Relaxed),
        Push::TooLong => panic!("frame 1 does not fit"),
    });
    let (c, t) = (r.clone(), told.clone());
    let consumer = thread::spawn(move || {
        match ring::pop(&c.ctl, &c.slots, |f| f.map(<[u8]>::to_vec)) {
            Pop::Frame(Ok(got)) => assert_eq!(got, frame(0)),
            other => panic!("the full ring gave {other:?}"),
        }
        if ring::producer_waiting(&c.ctl) {
            t.store(true, loom::sync::atomic::Ordering::Relaxed);
        }
    });
    producer.join().unwrap();
    consumer.join().unwrap();
    let (blocked, told) = (
        blocked.load(loom::sync::atomic::Ordering::Relaxed),
        told.load(loom::sync::atomic::Ordering::Relaxed),
    );
    assert!(!blocked || told, "lost unblock: the producer waits for room nobody tells it about");
}

#[test]
fn a_waiting_producer_is_never_left_waiting() {
    let _serial = serial();
    check(Bound::Exhaustive, full_model);
}

/// Without the producer's fence between raising its waiting flag and re-reading the consumer
/// index, it can miss the room while the consumer misses the flag.
#[test]
#[should_panic(expected = "lost unblock")]
fn twin_no_fence_before_the_full_recheck_is_caught() {
    let _serial = serial();
    let _mutant = sim_mutation::set(SimMutant::ShmNoFenceBeforeFullRecheck);
    check(Bound::Exhaustive, full_model);
}
