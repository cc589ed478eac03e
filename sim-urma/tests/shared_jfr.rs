//! A shared JFR under queues that each keep a receive CQ of their own — how the stack's server
//! uses a shared receive queue (one per server, one receive CQ per connection), which the hal
//! conformance scenarios (one receive CQ for all the queues on a shared queue) do not cover.

mod common;

use bypass_hal::urma::UrmaDevice;
use bypass_hal::{
    Access, Completion, CompletionQueue, CqOpcode, Device, MemoryRegion, Queue, QueueConfig, RecvWr, SendWr,
    Sge, SharedRecv, Status,
};
use std::time::{Duration, Instant};

fn open() -> UrmaDevice {
    let spec = format!("bypass_sim0,lib={}", common::library().display());
    UrmaDevice::open_spec(&spec).unwrap_or_else(|e| panic!("the simulated liburma ({spec}): {e}"))
}

/// The next completion of `cq`, within two seconds.
fn wait_one(cq: &mut impl CompletionQueue, what: &str) -> Completion {
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut out = [Completion::default(); 1];
    loop {
        if cq.poll(&mut out).expect("poll") == 1 {
            return out[0];
        }
        assert!(Instant::now() < deadline, "{what}: no completion within 2 s");
        std::thread::yield_now();
    }
}

/// Nothing on `cq` for 20 ms.
fn expect_none(cq: &mut impl CompletionQueue, what: &str) {
    let until = Instant::now() + Duration::from_millis(20);
    let mut out = [Completion::default(); 1];
    while Instant::now() < until {
        assert_eq!(cq.poll(&mut out).expect("poll"), 0, "{what}: unexpected {:?}", out[0]);
    }
}

#[test]
fn queues_on_one_shared_jfr_complete_on_their_own_receive_cqs() {
    let (a, b) = (open(), open());
    let cfg = QueueConfig::default().with_depths(8, 8);
    let mut srq = b.create_shared_recv(8, 1).expect("create a shared receive queue");
    let mut recv_cqs = [b.create_cq(9).expect("cq"), b.create_cq(9).expect("cq")];
    let send_cqs_b = [b.create_cq(9).expect("cq"), b.create_cq(9).expect("cq")];
    let mut qb: Vec<_> = (0..2)
        .map(|i| b.create_queue_on_shared(&cfg, &send_cqs_b[i], &recv_cqs[i], &srq).expect("queue on shared"))
        .collect();
    let mut send_cqs_a = [a.create_cq(9).expect("cq"), a.create_cq(9).expect("cq")];
    let recv_cq_a = a.create_cq(17).expect("cq");
    let mut qa: Vec<_> =
        (0..2).map(|i| a.create_queue(&cfg, &send_cqs_a[i], &recv_cq_a).expect("plain queue")).collect();
    for i in 0..2 {
        let (ia, ib) = (qa[i].info(), qb[i].info());
        qa[i].connect(&ib).expect("connect A");
        qb[i].connect(&ia).expect("connect B");
    }
    let dst = b.register(4 * 64, Access::LOCAL_WRITE).expect("register sink");
    let mut src = a.register(64, Access::empty()).expect("register source");
    for k in 0..4u64 {
        let s = [Sge::new(dst.addr() + k * 64, 64, dst.lkey())];
        srq.post_recv(&[RecvWr { wr_id: 100 + k, sges: &s }]).expect("post to the shared queue");
    }
    // Alternate the senders: each message takes the next shared receive in posting order and
    // completes on the receiving queue's own CQ, with its qpn.
    for (n, i) in [1usize, 0, 0, 1].into_iter().enumerate() {
        let what = format!("message {n} through queue pair {i}");
        src.write(0, &[n as u8 + 1; 64]).expect("fill source");
        let s = [Sge::new(src.addr(), 40, src.lkey())];
        qa[i].post_send(&[SendWr::send(n as u64, &s)]).expect("post SEND");
        let c = wait_one(&mut recv_cqs[i], &what);
        assert_eq!(
            (c.status, c.opcode, c.wr_id, c.qpn, c.byte_len),
            (Status::Success, CqOpcode::Recv, 100 + n as u64, qb[i].qpn(), 40),
            "{what}: {c:?}"
        );
        let mut got = [0u8; 40];
        dst.read(n * 64, &mut got).expect("read sink");
        assert_eq!(got, [n as u8 + 1; 40], "{what}: the data landed in receive {n}");
        expect_none(&mut recv_cqs[1 - i], &format!("{what}: the other queue's receive CQ"));
        let c = wait_one(&mut send_cqs_a[i], &what);
        assert_eq!((c.status, c.wr_id), (Status::Success, n as u64), "{what}: {c:?}");
    }
    // Dropping one queue leaves the other served by the shared queue; then it can be destroyed.
    let q0 = qb.remove(0);
    drop(q0);
    let s = [Sge::new(dst.addr(), 64, dst.lkey())];
    srq.post_recv(&[RecvWr { wr_id: 200, sges: &s }]).expect("post to the shared queue");
    let s = [Sge::new(src.addr(), 8, src.lkey())];
    qa[1].post_send(&[SendWr::send(9, &s)]).expect("post SEND");
    let c = wait_one(&mut recv_cqs[1], "after the other queue was dropped");
    assert_eq!((c.status, c.wr_id, c.qpn), (Status::Success, 200, qb[0].qpn()), "{c:?}");
    let srq = match srq.destroy() {
        Err((s, bypass_hal::Error::Busy(_))) => s,
        r => panic!("destroy while a queue uses it: want Busy, got {:?}", r.map_err(|(_, e)| e)),
    };
    drop(qb);
    srq.destroy().map_err(|(_, e)| e).expect("destroy once no queue uses it");
}
