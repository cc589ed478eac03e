//! The reliable datagram service (RM; `qp/datagram.rs`, "Reliable"): addressed like a datagram
//! queue, delivered like RC: RNR-retried, retransmitted after loss, delivered once, completed in
//! posting order, errors reported to the requester.

use crate::{Engine, Fabric, FabricConfig, FaultPlan, SimCq, SimNic, SimQueue, Source};
use bypass_hal::*;
use std::time::Duration;

struct End {
    nic: SimNic,
    cq: SimCq,
    q: SimQueue,
    mem: <SimNic as Device>::Region,
}

fn end_with(fabric: &Fabric, reliable: bool, retry_count: u8) -> End {
    let nic = fabric.add_nic();
    let cq = nic.create_cq(512).unwrap();
    let mut cfg = QueueConfig::default();
    cfg.send_depth = 128;
    cfg.recv_depth = 128;
    cfg.retry_count = retry_count;
    let mut q = if reliable {
        nic.create_reliable_datagram_queue(&cfg, &cq, &cq, None).unwrap()
    } else {
        nic.create_datagram_queue(&cfg, &cq, &cq, None).unwrap()
    };
    q.activate().unwrap();
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let mem = nic.register(1 << 16, access).unwrap();
    End { nic, cq, q, mem }
}

fn end(fabric: &Fabric) -> End {
    end_with(fabric, true, 7)
}

fn poll(e: &mut End) -> Vec<(Completion, Source)> {
    let mut out = Vec::new();
    loop {
        let mut wc = [Completion::default(); 64];
        let mut from = [Source::default(); 64];
        let n = e.cq.poll_from(&mut wc, &mut from).unwrap();
        out.extend(wc[..n].iter().copied().zip(from[..n].iter().copied()));
        if n < 64 {
            return out;
        }
    }
}

fn post_recvs(e: &mut End, n: u64) {
    for i in 0..n {
        let sge = e.mem.sge(4096 + (i as usize % 8) * 1024, 1024).unwrap();
        e.q.post_recv(&[RecvWr { wr_id: 100 + i, sges: &[sge] }]).unwrap();
    }
}

#[test]
fn a_send_that_finds_no_receive_is_retried_until_one_is_posted_and_the_queue_waits_behind_it() {
    let fabric = Fabric::new(Engine::Stepped { seed: 3 });
    let (mut a, mut b, mut c) = (end(&fabric), end(&fabric), end(&fabric));
    post_recvs(&mut c, 1);
    // Both ends know each other (the responder answers on its route to the sender).
    let (to_b, to_c) = (a.q.add_dest(&b.q.info()).unwrap(), a.q.add_dest(&c.q.info()).unwrap());
    b.q.add_dest(&a.q.info()).unwrap();
    c.q.add_dest(&a.q.info()).unwrap();
    a.mem.write(0, b"to b").unwrap();
    let s = [a.mem.sge(0, 4).unwrap()];
    a.q.post_datagrams(&[SendWr::send(1, &s), SendWr::send(2, &s)], &[to_b, to_c]).unwrap();
    for _ in 0..5 {
        fabric.run_until_idle();
        fabric.advance(Duration::from_millis(10));
    }
    fabric.run_until_idle();
    assert!(poll(&mut a).is_empty(), "the SEND to b waits for a receive; the one to c waits behind it");
    assert!(poll(&mut c).is_empty(), "nothing overtakes the message in flight");
    assert!(b.nic.stats().rnr_naks_sent >= 1, "b answered RNR");
    post_recvs(&mut b, 1);
    fabric.advance(Duration::from_millis(10));
    fabric.run_until_idle();
    let done: Vec<_> = poll(&mut a).iter().map(|(c, _)| (c.wr_id, c.status)).collect();
    assert_eq!(done, [(1, Status::Success), (2, Status::Success)], "in posting order");
    let got_b = poll(&mut b);
    assert_eq!((got_b.len(), got_b[0].0.byte_len, got_b[0].1.qpn), (1, 4, a.q.qpn()));
    assert_eq!(poll(&mut c).len(), 1);
}

#[test]
fn messages_lost_under_the_fault_plan_are_retransmitted_and_delivered_once_each() {
    let mut cfg = FabricConfig::new(Engine::Stepped { seed: 9 });
    cfg.faults = FaultPlan { drop_ppm: 100_000, seed: 17, ..FaultPlan::NONE };
    let fabric = Fabric::with_config(cfg);
    let (mut a, mut b) = (end(&fabric), end(&fabric));
    post_recvs(&mut b, 100);
    let to_b = a.q.add_dest(&b.q.info()).unwrap();
    b.q.add_dest(&a.q.info()).unwrap();
    for i in 0..100u64 {
        a.mem.write(0, &i.to_le_bytes()).unwrap();
        let sge = [a.mem.sge(0, 8).unwrap()];
        a.q.post_datagrams(&[SendWr::send(i, &sge)], &[to_b]).unwrap();
        for _ in 0..10 {
            fabric.run_until_idle();
            fabric.advance(Duration::from_millis(150)); // the ACK timeout (134 ms) fires
        }
    }
    let sent = poll(&mut a);
    assert_eq!(sent.len(), 100);
    assert!(sent.iter().enumerate().all(|(i, (c, _))| c.wr_id == i as u64 && c.status == Status::Success));
    let got = poll(&mut b);
    assert_eq!(got.len(), 100, "every message arrived exactly once");
    let st = a.nic.stats();
    assert!(st.retransmits > 5 && st.timeouts > 5, "losses were made good: {st:?}");
    assert!(b.nic.stats().duplicates > 0, "a lost ACK's message was answered again, not delivered twice");
}

#[test]
fn a_write_the_responder_refuses_fails_at_the_requester_and_its_queue_goes_to_error() {
    let fabric = Fabric::new(Engine::Stepped { seed: 4 });
    let (mut a, mut b) = (end(&fabric), end(&fabric));
    let to_b = a.q.add_dest(&b.q.info()).unwrap();
    b.q.add_dest(&a.q.info()).unwrap();
    let s = [a.mem.sge(0, 8).unwrap()];
    let bad = RemoteAddr { addr: 0, key: RemoteKey::from_rkey(0xdead_beef) };
    let wrs = [SendWr::send(1, &s).with_op(SendOp::Write(bad)), SendWr::send(2, &s)];
    a.q.post_datagrams(&wrs, &[to_b, to_b]).unwrap();
    fabric.run_until_idle();
    let done: Vec<_> = poll(&mut a).iter().map(|(c, _)| (c.wr_id, c.status)).collect();
    assert_eq!(done, [(1, Status::RemoteAccess), (2, Status::Flushed)]);
    assert_eq!(a.q.state(), QueueState::Error);
    assert_eq!(b.q.state(), QueueState::Ready, "the responder's queue is not failed by a bad request");
}

#[test]
fn an_unanswered_message_completes_with_retry_exceeded_after_retry_count_retransmissions() {
    let fabric = Fabric::new(Engine::Stepped { seed: 6 });
    // The target is an unreliable datagram queue: it takes the SEND and answers nothing.
    let (mut a, mut b) = (end_with(&fabric, true, 2), end_with(&fabric, false, 7));
    post_recvs(&mut b, 8);
    let to_b = a.q.add_dest(&b.q.info()).unwrap();
    let s = [a.mem.sge(0, 8).unwrap()];
    a.q.post_datagrams(&[SendWr::send(1, &s)], &[to_b]).unwrap();
    for _ in 0..10 {
        fabric.run_until_idle();
        fabric.advance(Duration::from_secs(1));
    }
    fabric.run_until_idle();
    let done: Vec<_> = poll(&mut a).iter().map(|(c, _)| (c.wr_id, c.status)).collect();
    assert_eq!(done, [(1, Status::RetryExceeded)]);
    assert_eq!((a.nic.stats().timeouts, a.nic.stats().retransmits), (3, 2));
    assert_eq!(a.q.state(), QueueState::Error);
}

/// Retransmission backoff on the reliable datagram service too (`FabricConfig::
/// ack_timeout_backoff`): across a cut link an unanswered message waits the timeout, then twice
/// that, then four times (the cap here), each wait without an answer doubling the next; once
/// the link heals the retransmission is answered, and the next message waits the timeout again.
#[test]
fn reliable_datagram_timeouts_back_off_while_unanswered() {
    let t = QueueConfig::default().timeout.duration().unwrap();
    let fabric = Fabric::with_config(FabricConfig {
        ack_timeout_backoff: Some(t * 4),
        faults: FaultPlan { controls: true, ..FaultPlan::NONE },
        ..FabricConfig::new(Engine::Stepped { seed: 6 })
    });
    let (mut a, mut b) = (end_with(&fabric, true, 7), end_with(&fabric, true, 7));
    post_recvs(&mut b, 8);
    let to_b = a.q.add_dest(&b.q.info()).unwrap();
    b.q.add_dest(&a.q.info()).unwrap(); // b's route back, for its ACKs
    let s = [a.mem.sge(0, 8).unwrap()];
    // Cut for 10.5 timeouts: the timeouts fall at 1, 3, 7 and 11 timeouts (waits t, 2t, 4t, 4t),
    // so the fourth retransmission, at 11, crosses the healed link.
    fabric.cut_link(a.nic.addr(), b.nic.addr(), Some(t * 21 / 2)).unwrap();
    // When (in eighths of t from now) timeouts fire over the next `eighths` eighths.
    let timeouts_at = |a: &End, eighths: u32| {
        let base = a.nic.stats().timeouts;
        let mut at = Vec::new();
        for i in 1..=eighths {
            fabric.advance(t / 8);
            fabric.run_until_idle();
            if a.nic.stats().timeouts - base > at.len() as u64 {
                at.push(i);
            }
        }
        at
    };
    a.q.post_datagrams(&[SendWr::send(1, &s)], &[to_b]).unwrap();
    fabric.run_until_idle();
    assert_eq!(timeouts_at(&a, 8 * 12), [8, 24, 56, 88], "{:?}", a.nic.stats());
    let done: Vec<_> = poll(&mut a).iter().map(|(c, _)| (c.wr_id, c.status)).collect();
    assert_eq!(done, [(1, Status::Success)], "answered once the link healed");
    // Progress: the next message's first wait is the timeout again.
    fabric.cut_link(a.nic.addr(), b.nic.addr(), None).unwrap();
    a.q.post_datagrams(&[SendWr::send(2, &s)], &[to_b]).unwrap();
    fabric.run_until_idle();
    assert_eq!(timeouts_at(&a, 8 * 4), [8, 24], "after progress: t, then 2t");
}
