//! loom models of the simulator's rings: the production `WorkRing`, `CqRing`, side table, CQ
//! push and doorbell code (`bypass_sim::loom_api`, `bypass_hal::doorbell`), built with
//! `RUSTFLAGS="--cfg loom"` so every atomic and every WQE/CQE byte access goes through loom.
//!
//! - [`send_ring_and_cq`]: the driver posts 5 WQEs on a 2-deep send ring (batches of two, two and
//!   one, so the ring fills and the owner bit goes 1, 0, 1 over three passes), one doorbell per
//!   batch, polls a 2-deep CQ by owner bit and publishes its consumer indices; the device reads
//!   the doorbell, fetches each WQE by the producer-index/owner protocol, re-reads its SGEs from
//!   the ring, and pushes a CQE. Every WQE is fetched exactly once, in order, with exactly the bytes posted
//!   (owner and index checked by the device's own decode), and every CQE is polled exactly once,
//!   in order, with the right index, length and `wr_id`.
//! - [`cq_back_pressure`]: the device writes 5 CQEs into a 2-deep CQ, backing off while the ring
//!   is full; the driver polls. No CQE is lost, duplicated, overwritten or read early.
//! - [`split_poster_and_poller`]: one thread posts and runs the device inline, another polls; a
//!   CQ as deep as the send ring must never overflow (this model found a driver bug, now fixed).
//!
//! The driver and device *sequences* (which step follows which) are transcribed from
//! `SimQueue::post_send`, `SimCq::poll`, `QpCtx::send_step` and `CqShared::push`; every step
//! runs the production code through `loom_api`. Keep them in step when those functions change.
//!
//! Each model has broken twins: the same production code with one deliberate bug switched on
//! (`bypass_hal::mutation`, `bypass_sim::loom_api::mutation`, loom builds only), which loom must
//! catch (`#[should_panic]`). Mutants are process-wide, so every test here holds [`serial`].
#![cfg(loom)]

use bypass_hal::mutation::{self as hal_mutation, Mutant as HalMutant};
use bypass_hal::{CqOpcode, Error, Sge, Status, WrFlags};
use bypass_sim::layout::{self, cqe_flags, Cqe, WqeOp};
use bypass_sim::loom_api::mutation::{self as sim_mutation, Mutant as SimMutant};
use bypass_sim::loom_api::{Cq, SendQueue};
use loom::sync::atomic::{AtomicBool, Ordering};
use loom::thread;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// Send ring depth: the third WQE wraps the owner bit, and two outstanding fill the ring.
const SQ_DEPTH: u32 = 2;
/// CQ depth: as deep as the send ring, so the driver's own flow control keeps it from overflowing.
const CQ_DEPTH: u32 = 2;
/// SGEs per WQE: 32 + 3 × 16 = 80 bytes, so each WQE spans two 64-byte blocks and the device
/// re-reads SGE 2 from the second block.
const SGES: usize = 3;
/// WQEs posted in [`send_ring_and_cq`]: two full passes round the ring and the start of a third.
const WQES: u32 = 5;
/// Most WQEs per `post_send` batch (one doorbell each).
const BATCH: u32 = 2;
/// CQEs the device writes in [`cq_back_pressure`].
const CQES: u32 = 5;

/// Mutants are process-wide: every model runs alone.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    // A should_panic twin poisons the lock; the state it guards is `()`.
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What the executions of a model reached (std atomics, outside the model), so a test can check
/// that the model really exercises a full ring.
#[derive(Debug, Default)]
struct Coverage {
    /// Executions explored.
    runs: AtomicUsize,
    /// `has_room` refused a batch: the send ring was full.
    sq_full: AtomicUsize,
    /// One poll found the CQ full (`CQ_DEPTH` CQEs before the driver consumed any).
    cq_full: AtomicUsize,
    /// `CqRing::write` refused a CQE because the ring was full.
    cq_refused: AtomicUsize,
}

impl Coverage {
    fn hit(counter: &AtomicUsize) {
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    fn get(counter: &AtomicUsize) -> usize {
        counter.load(std::sync::atomic::Ordering::Relaxed)
    }
}

// ------------------------------------------------------------------ payloads (distinct per WQE)

fn wr_id(seq: u32) -> u64 {
    0x5eed_0000 + u64::from(seq)
}

fn sges(seq: u32) -> [Sge; SGES] {
    let s = u64::from(seq);
    [0u32, 1, 2].map(|i| Sge {
        addr: 0x1_0000 * (s + 1) + 0x100 * u64::from(i),
        len: 10 * seq + i + 1,
        lkey: 0x40 + seq,
    })
}

fn total_len(seq: u32) -> u64 {
    sges(seq).iter().map(|s| u64::from(s.len)).sum()
}

fn imm(seq: u32) -> u32 {
    0xa000 + seq
}

fn remote_addr(seq: u32) -> u64 {
    0xdead_0000_0000 + u64::from(seq)
}

fn rkey(seq: u32) -> u32 {
    0x700 + seq
}

/// The send-side CQE the device writes for WQE `seq` (as `QpCtx::send_cqe` does for a WRITE).
fn send_cqe(seq: u32, len: u64) -> Cqe {
    Cqe {
        flags: 0,
        status: Status::Success,
        opcode: CqOpcode::Write,
        qpn: 0,
        wqe_index: seq,
        byte_len: len as u32,
        imm: 0,
        epoch: 0,
        src_qpn: 0,
        src_nic: 0,
    }
}

/// The CQE written at index `seq` in [`cq_back_pressure`].
fn plain_cqe(seq: u32) -> Cqe {
    Cqe {
        flags: cqe_flags::RECV,
        status: Status::Success,
        opcode: CqOpcode::Recv,
        qpn: 3,
        wqe_index: 100 + seq,
        byte_len: 1000 + seq,
        imm: 0xbeef_0000 + seq,
        epoch: 0,
        src_qpn: 0,
        src_nic: 0,
    }
}

/// The owner bit of CQ index `i` (1 on the first pass).
fn cq_owner(i: u32, depth: u32) -> u32 {
    ((i / depth) & 1) ^ 1
}

// ------------------------------------------------------------------ model 1: send ring and CQ

/// Driver and device on one send ring and one CQ (see the module docs).
fn send_ring_and_cq(cov: &Arc<Coverage>) {
    Coverage::hit(&cov.runs);
    let sq = Arc::new(SendQueue::new(SQ_DEPTH, SGES as u32));
    let cq = Arc::new(Cq::new(CQ_DEPTH));
    let device = {
        let (sq, cq) = (sq.clone(), cq.clone());
        thread::spawn(move || device(&sq, &cq))
    };
    driver(&sq, &cq, cov);
    device.join().unwrap();
    assert!(!cq.overflowed(), "the CQ overflowed although it is as deep as the send ring");
}

/// The driver: `SimQueue::post_send` (room check, encode, side table + ring write, one doorbell
/// per batch) and `SimCq::poll` (owner-bit read, side-table lookup, send CI, then the CI record),
/// until every WQE has completed.
fn driver(sq: &SendQueue, cq: &Cq, cov: &Coverage) {
    let (mut pi, mut ci) = (0u32, 0u32);
    let mut buf = vec![0u8; sq.stride()];
    let used = (layout::WQE_HEADER + SGES * layout::WQE_SGE).div_ceil(layout::BLOCK) * layout::BLOCK;
    while ci < WQES {
        let mut progress = false;
        // Poll. One CQ serves one send ring and every WQE is signaled, so CQE `ci` is WQE `ci`.
        let mut got = 0;
        // SAFETY: this thread is the CQ's only consumer.
        while let Some(cqe) = unsafe { cq.read(ci) } {
            assert_eq!(cqe.wqe_index, ci, "CQE {ci}: completion lost, duplicated or out of order");
            assert_eq!(cqe.flags, cq_owner(ci, CQ_DEPTH), "CQE {ci}: flags");
            assert_eq!((cqe.status, cqe.opcode, cqe.qpn), (Status::Success, CqOpcode::Write, 0));
            assert_eq!(u64::from(cqe.byte_len), total_len(ci), "CQE {ci}: stale or partial body");
            // SAFETY: we are the poller and have just read this WQE's completion.
            let id = unsafe { sq.wr_id(cqe.wqe_index) };
            assert_eq!(id, wr_id(ci), "CQE {ci}: wrong wr_id from the side table");
            sq.completed(cqe.wqe_index);
            ci += 1;
            got += 1;
        }
        if got > 0 {
            if got == CQ_DEPTH {
                Coverage::hit(&cov.cq_full);
            }
            cq.release(ci);
            progress = true;
        }
        // Post the next batch, all or nothing.
        let batch = (WQES - pi).min(BATCH);
        if batch > 0 {
            match sq.has_room(pi, batch as usize) {
                Ok(true) => {
                    for _ in 0..batch {
                        let s = sges(pi);
                        layout::encode_wqe(
                            &mut buf,
                            WqeOp::WriteImm,
                            WrFlags::SIGNALED,
                            sq.owner(pi),
                            imm(pi),
                            remote_addr(pi),
                            rkey(pi),
                            pi,
                            &s,
                            None,
                        );
                        // SAFETY: the only poster, and `has_room` said the slot is free.
                        unsafe { sq.post(pi, wr_id(pi), &buf[..used]) };
                        pi += 1;
                    }
                    sq.ring_doorbell(pi);
                    progress = true;
                }
                Ok(false) => unreachable!("batches are never empty"),
                Err(Error::WouldBlock { .. }) => Coverage::hit(&cov.sq_full),
                Err(e) => panic!("post: {e}"),
            }
        }
        if !progress {
            assert!(!cq.overflowed(), "CQE {ci} lost: the CQ overflowed");
            thread::yield_now();
        }
    }
}

/// The device: `QpCtx::send_step` (acquire the producer index, fetch the WQE at the fetch index
/// with the owner/index check, re-read its SGEs as validate and emit do) and `CqShared::push`.
fn device(sq: &SendQueue, cq: &Cq) {
    let mut fetch = 0u32;
    while fetch < WQES {
        if sq.producer() == fetch {
            thread::yield_now();
            continue;
        }
        // SAFETY: `fetch` is below the acquired producer index and not yet completed.
        let w = unsafe { sq.fetch(fetch) }
            .unwrap_or_else(|e| panic!("WQE {fetch}: {e:?}: the device fetched a stale or partial entry"));
        let s = sges(fetch);
        assert_eq!(
            (w.op, w.flags, w.index, w.nsge, w.imm, w.remote_addr, w.rkey),
            (
                WqeOp::WriteImm,
                WrFlags::SIGNALED,
                fetch,
                SGES as u8,
                imm(fetch),
                remote_addr(fetch),
                rkey(fetch)
            ),
            "WQE {fetch}: header"
        );
        assert_eq!(w.len, total_len(fetch), "WQE {fetch}: SGE lengths");
        for (i, want) in s.iter().enumerate() {
            // SAFETY: as above; the driver rewrites the slot only after our CQE for it.
            let got = w.sge(i, |i| unsafe { sq.sge(fetch, i) });
            assert_eq!(got, *want, "WQE {fetch}: SGE {i}");
        }
        // SAFETY: this thread is the CQ's only producer.
        unsafe { cq.push(&send_cqe(fetch, w.len)) };
        fetch += 1;
    }
}

fn run_send_ring_and_cq() -> Arc<Coverage> {
    let cov = Arc::new(Coverage::default());
    let c = cov.clone();
    loom::model(move || send_ring_and_cq(&c));
    cov
}

#[test]
fn send_ring_and_cq_deliver_every_wqe_and_cqe_once_in_order() {
    let _serial = serial();
    let cov = run_send_ring_and_cq();
    eprintln!("send_ring_and_cq: {cov:?}");
    assert!(Coverage::get(&cov.sq_full) > 0, "no execution found the send ring full");
    assert!(Coverage::get(&cov.cq_full) > 0, "no execution found the CQ full");
}

/// Without the release fence the device can acquire the new producer index and still read the
/// WQE bytes (or the side table entry) from before the driver wrote them.
#[test]
#[should_panic(expected = "Causality violation")]
fn twin_doorbell_without_fence_is_caught() {
    let _serial = serial();
    let _mutant = hal_mutation::set(HalMutant::DoorbellNoFence);
    run_send_ring_and_cq();
}

/// The other half of the doorbell pairing: a relaxed load of the producer index.
#[test]
#[should_panic(expected = "Causality violation")]
fn twin_doorbell_relaxed_load_is_caught() {
    let _serial = serial();
    let _mutant = hal_mutation::set(HalMutant::DoorbellLoadRelaxed);
    run_send_ring_and_cq();
}

/// A relaxed CQE head store: the driver can see the owner bit before the body (and reuse a send
/// slot the device may still be reading).
#[test]
#[should_panic(expected = "Causality violation")]
fn twin_cqe_head_relaxed_is_caught() {
    let _serial = serial();
    let _mutant = sim_mutation::set(SimMutant::CqeHeadRelaxed);
    run_send_ring_and_cq();
}

/// The head word (owner bit) published before the body.
#[test]
#[should_panic(expected = "Causality violation")]
fn twin_cqe_head_before_body_is_caught() {
    let _serial = serial();
    let _mutant = sim_mutation::set(SimMutant::CqeHeadBeforeBody);
    run_send_ring_and_cq();
}

// ------------------------------------------------------------------ model 2: a full CQ

/// The device writes `CQES` CQEs into a `CQ_DEPTH`-deep ring through `CqRing::write`, waiting
/// while it reports the ring full; the driver polls as `SimCq::poll` does and publishes its CI
/// record after each batch.
fn cq_back_pressure(cov: &Arc<Coverage>) {
    Coverage::hit(&cov.runs);
    let cq = Arc::new(Cq::new(CQ_DEPTH));
    let done = Arc::new(AtomicBool::new(false));
    let device = {
        let (cq, done, cov) = (cq.clone(), done.clone(), cov.clone());
        thread::spawn(move || {
            for pi in 0..CQES {
                // SAFETY: this thread is the ring's only producer.
                while !unsafe { cq.write(pi, &plain_cqe(pi)) } {
                    Coverage::hit(&cov.cq_refused);
                    thread::yield_now();
                }
            }
            done.store(true, Ordering::Release);
        })
    };
    let mut ci = 0u32;
    while ci < CQES {
        // Read before polling: once the device is done, every CQE it wrote is visible to the poll.
        let finished = done.load(Ordering::Acquire);
        let mut got = 0;
        // SAFETY: this thread is the ring's only consumer.
        while let Some(cqe) = unsafe { cq.read(ci) } {
            let want = plain_cqe(ci);
            assert_eq!(cqe, Cqe { flags: want.flags | cq_owner(ci, CQ_DEPTH), ..want }, "CQE {ci}");
            ci += 1;
            got += 1;
        }
        if got > 0 {
            cq.release(ci);
        } else {
            assert!(!finished, "CQE {ci} lost: the device is done but the entry is not in the ring");
            thread::yield_now();
        }
    }
    device.join().unwrap();
}

fn run_cq_back_pressure() -> Arc<Coverage> {
    let cov = Arc::new(Coverage::default());
    let c = cov.clone();
    loom::model(move || cq_back_pressure(&c));
    cov
}

#[test]
fn full_cq_holds_back_the_device_and_loses_nothing() {
    let _serial = serial();
    let cov = run_cq_back_pressure();
    eprintln!("cq_back_pressure: {cov:?}");
    assert!(Coverage::get(&cov.cq_refused) > 0, "no execution found the CQ full");
}

/// A relaxed CI record: the device may overwrite a slot whose body the driver is still reading.
#[test]
#[should_panic(expected = "Causality violation")]
fn twin_ci_record_relaxed_is_caught() {
    let _serial = serial();
    let _mutant = sim_mutation::set(SimMutant::CiRecordRelaxed);
    run_cq_back_pressure();
}

/// No full check: the device overwrites CQEs the driver has not consumed. loom finds a CQE lost
/// (the driver's "CQE n lost" check) or an overwrite racing the driver's read, whichever comes first.
#[test]
#[should_panic]
fn twin_cq_full_check_skipped_is_caught() {
    let _serial = serial();
    let _mutant = sim_mutation::set(SimMutant::CqFullCheckSkipped);
    run_cq_back_pressure();
}

/// A relaxed CQE head store, seen from the CQ-only model.
#[test]
#[should_panic(expected = "Causality violation")]
fn twin_cqe_head_relaxed_is_caught_on_a_full_cq() {
    let _serial = serial();
    let _mutant = sim_mutation::set(SimMutant::CqeHeadRelaxed);
    run_cq_back_pressure();
}

// ------------------------------------------------------------------ model 3: two driver threads

/// WQEs posted in [`split_poster_and_poller`].
const SPLIT_WQES: u32 = 3;

/// The driver split over two threads, the way a hal user may split it: one thread posts (one WQE
/// per `post_send`) and, as the Inline engine does on a doorbell, runs the device's send steps
/// itself; the other thread polls in `SimCq::poll`'s order (per CQE the side-table lookup and the
/// send ring's consumer index, after the batch the CI record). The CQ is exactly as deep as the
/// send ring, which is what the hal asks for ("size the CQ for every outstanding work request";
/// `send_depth` bounds them), so the device must never find it full.
///
/// `SimCq::poll` used to free send slots (`sq_ci`, per CQE) before it published the CI record
/// (after the batch): between the two, the poster saw free slots and posted, the device completed
/// the new WQE, found the CQ still full by the old CI record and dropped the CQE (`CqOverflow`).
/// This model found that; the driver now publishes the CI record first and frees the work-ring
/// slots after it. `old_order = true` replays the old order and must fail.
fn split_poster_and_poller(old_order: bool) {
    let sq = Arc::new(SendQueue::new(SQ_DEPTH, 1));
    let cq = Arc::new(Cq::new(SQ_DEPTH));
    let done = Arc::new(AtomicBool::new(false));
    let poster = {
        let (sq, cq, done) = (sq.clone(), cq.clone(), done.clone());
        thread::spawn(move || {
            let mut buf = vec![0u8; sq.stride()];
            let (mut pi, mut fetch) = (0u32, 0u32);
            while pi < SPLIT_WQES {
                match sq.has_room(pi, 1) {
                    Ok(_) => {
                        let s = [Sge { addr: 0x1000, len: 8 + pi, lkey: 1 }];
                        let (owner, flags) = (sq.owner(pi), WrFlags::SIGNALED);
                        layout::encode_wqe(&mut buf, WqeOp::Send, flags, owner, 0, 0, 0, pi, &s, None);
                        // SAFETY: the only poster, and `has_room` said the slot is free.
                        unsafe { sq.post(pi, wr_id(pi), &buf[..layout::BLOCK]) };
                        pi += 1;
                        sq.ring_doorbell(pi);
                        // The Inline engine: the doorbell runs the device on this thread.
                        while sq.producer() != fetch {
                            // SAFETY: below the acquired producer index and not yet completed.
                            let w = unsafe { sq.fetch(fetch) }.expect("a fresh WQE");
                            // SAFETY: the device runs only on this thread: the only producer.
                            unsafe { cq.push(&send_cqe(fetch, w.len)) };
                            fetch += 1;
                        }
                    }
                    Err(Error::WouldBlock { .. }) => thread::yield_now(),
                    Err(e) => panic!("post: {e}"),
                }
            }
            done.store(true, Ordering::Release);
        })
    };
    let mut ci = 0u32;
    while ci < SPLIT_WQES {
        let finished = done.load(Ordering::Acquire);
        let mut got = 0;
        let mut freed = [0u32; SPLIT_WQES as usize];
        // SAFETY: this thread is the CQ's only consumer.
        while let Some(cqe) = unsafe { cq.read(ci) } {
            assert_eq!(cqe.wqe_index, ci, "CQE {ci}: lost, duplicated or out of order");
            // SAFETY: we are the poller and have just read this WQE's completion.
            assert_eq!(unsafe { sq.wr_id(cqe.wqe_index) }, wr_id(ci));
            if old_order {
                sq.completed(cqe.wqe_index);
            }
            freed[got] = cqe.wqe_index;
            ci += 1;
            got += 1;
        }
        if got > 0 {
            cq.release(ci);
            if !old_order {
                for &w in &freed[..got] {
                    sq.completed(w);
                }
            }
        } else {
            assert!(!cq.overflowed(), "CQE {ci} dropped: a CQ as deep as the send ring overflowed");
            assert!(!finished, "CQE {ci} lost: the device is done but the entry is not in the ring");
            thread::yield_now();
        }
    }
    poster.join().unwrap();
}

#[test]
fn split_poster_and_poller_never_overflow_a_cq_as_deep_as_the_ring() {
    let _serial = serial();
    loom::model(|| split_poster_and_poller(false));
}

#[test]
#[should_panic(expected = "overflowed")]
fn twin_send_slots_freed_before_the_ci_record_overflows_the_cq() {
    let _serial = serial();
    loom::model(|| split_poster_and_poller(true));
}
