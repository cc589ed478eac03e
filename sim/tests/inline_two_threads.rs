//! The Inline engine driven from two threads at once: every message of a long ping-pong arrives,
//! exactly once, in order (the device runs on whichever thread rings or polls, so this exercises
//! the hand-off between threads that the engine relies on).

use bypass_hal::*;
use bypass_sim::{Engine, Fabric, SimCq, SimNic, SimQueue, SimRegion};
use std::time::{Duration, Instant};

struct End {
    q: SimQueue,
    cq: SimCq,
    mr: SimRegion,
}

const DEPTH: u32 = 64;

fn end(nic: &SimNic) -> End {
    let cfg = QueueConfig::default().with_depths(DEPTH, DEPTH);
    let cq = nic.create_cq(DEPTH * 4).unwrap();
    let q = nic.create_queue(&cfg, &cq, &cq).unwrap();
    let mr = nic.register(8 * (DEPTH as usize + 1), Access::LOCAL_WRITE).unwrap();
    End { q, cq, mr }
}

fn post_recv(e: &mut End, i: u64) {
    let slot = 8 * (1 + (i % u64::from(DEPTH)) as usize);
    e.q.post_recv(&[RecvWr { wr_id: i, sges: &[e.mr.sge(slot, 8).unwrap()] }]).unwrap();
}

/// Runs one side: `first` sends first. Each message carries its sequence number; each side
/// checks it receives 0, 1, 2, … and that every send completes.
fn side(mut e: End, iters: u64, first: bool, unsignaled: bool, deadline: Instant) -> End {
    let mut wc = [Completion::default(); 8];
    let (mut sent, mut received, mut send_done) = (0u64, 0u64, 0u64);
    let mut may_send = first;
    while received < iters || send_done < iters {
        if may_send && sent < iters {
            e.mr.write(0, &sent.to_le_bytes()).unwrap();
            let sge = e.mr.sge(0, 8).unwrap();
            let flags = if !unsignaled || sent % 16 == 15 { WrFlags::SIGNALED } else { WrFlags::empty() };
            e.q.post_send(&[SendWr::send(sent, &[sge]).with_flags(flags)]).unwrap();
            if unsignaled && sent % 16 != 15 && send_done == sent {
                send_done += 1; // no completion will come for this one
            }
            sent += 1;
            may_send = false;
        }
        let n = e.cq.poll(&mut wc).unwrap();
        if n == 0 {
            // Other tests may be spinning on the same two cores: let the peer thread run.
            std::thread::yield_now();
        }
        for c in &wc[..n] {
            assert_eq!(c.status, Status::Success, "{c:?}");
            match c.opcode {
                CqOpcode::Send => {
                    assert_eq!(c.wr_id, send_done);
                    send_done += 1;
                    if unsignaled {
                        send_done = c.wr_id + 1;
                    }
                }
                CqOpcode::Recv => {
                    assert_eq!(c.wr_id, received);
                    let slot = 8 * (1 + (c.wr_id % u64::from(DEPTH)) as usize);
                    let mut b = [0u8; 8];
                    e.mr.read(slot, &mut b).unwrap();
                    assert_eq!(u64::from_le_bytes(b), received, "message {received} out of order or corrupt");
                    received += 1;
                    post_recv(&mut e, received + u64::from(DEPTH) - 1);
                    may_send = true;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        assert!(Instant::now() < deadline, "stuck: sent {sent} received {received} send_done {send_done}");
    }
    e
}

#[test]
fn inline_ping_pong_across_two_threads_loses_nothing() {
    run(false);
}

#[test]
fn inline_ping_pong_with_unsignaled_sends_loses_nothing() {
    run(true);
}

fn run(unsignaled: bool) {
    let fabric = Fabric::new(Engine::Inline);
    let (na, nb) = (fabric.add_nic(), fabric.add_nic());
    let (mut a, mut b) = (end(&na), end(&nb));
    let (ia, ib) = (a.q.info(), b.q.info());
    a.q.connect(&ib).unwrap();
    b.q.connect(&ia).unwrap();
    // Receives go up before either side sends, so no message can find none (that would be an
    // RNR NAK and a retransmission: correct, but not what this test is about).
    for i in 0..u64::from(DEPTH) {
        post_recv(&mut a, i);
        post_recv(&mut b, i);
    }
    let iters = 50_000;
    let deadline = Instant::now() + Duration::from_secs(20);
    let t = std::thread::spawn(move || side(b, iters, false, unsignaled, deadline));
    let r =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| side(a, iters, true, unsignaled, deadline)));
    let rb = t.join();
    if r.is_err() || rb.is_err() {
        panic!("a: {:?}\nb: {:?}", na.stats(), nb.stats());
    }
    assert_eq!(
        na.stats().retransmits,
        0,
        "a lossless in-process wire never needs a retransmission: {:?} {:?}",
        na.stats(),
        nb.stats()
    );
}
