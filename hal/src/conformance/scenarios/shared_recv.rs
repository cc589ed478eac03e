//! Scenarios of shared receive queues ([`SharedRecv`]): queues on device B take their receives
//! from one shared queue; device A's queues are plain and send to them.

use super::{
    caps, check_numbered, check_region, expect_none, fit, numbered_source, pattern, rnr_config, send_ok, sge,
    side, sink, source, wait_one, QUIET,
};
use crate::conformance::{Env, Side};
use crate::{CqOpcode, Device, Error, Queue, QueueConfig, QueueState, RecvWr, SendWr, SharedRecv};
use std::time::Duration;

/// A queue on device B that takes its receives from a shared queue; its receive completions go
/// to a CQ it may share with others, so it has only a send CQ of its own.
struct OnShared<D: Device> {
    queue: D::Queue,
    send_cq: D::Cq,
}

/// True (after saying so) when a device has no shared receive queues: the scenario is skipped.
fn skip_without_shared_recv<E: Env>(env: &E, scenario: &str) -> bool {
    let c = caps(env);
    if c.max_shared_recv == 0 || c.max_shared_recv_depth == 0 {
        eprintln!("{scenario}: skipped, a device has no shared receive queues");
        return true;
    }
    false
}

/// A shared receive queue of `depth` single-SGE receives on device B.
#[track_caller]
fn shared_recv<E: Env>(env: &E, depth: u32) -> <E::Dev as Device>::SharedRecv {
    let depth = depth.min(caps(env).max_shared_recv_depth);
    let srq = env.b().create_shared_recv(depth, 1).expect("create a shared receive queue");
    assert!(srq.depth() >= depth, "a shared receive queue of {} slots for {depth} asked", srq.depth());
    srq
}

/// A queue on B on `srq` (receives to `recv_cq`) connected to a new plain queue on A.
#[track_caller]
fn connect_on_shared<E: Env>(
    env: &E,
    cfg: &QueueConfig,
    recv_cq: &<E::Dev as Device>::Cq,
    srq: &<E::Dev as Device>::SharedRecv,
) -> (Side<E::Dev>, OnShared<E::Dev>) {
    let b = env.b();
    let send_cq = b.create_cq(cfg.send_depth + 1).expect("create send CQ");
    let mut queue = b
        .create_queue_on_shared(cfg, &send_cq, recv_cq, srq)
        .expect("create a queue on the shared receive queue");
    assert_eq!(queue.state(), QueueState::Reset, "a new queue starts in RESET");
    let mut a = side(env.a(), cfg);
    let (ia, ib) = (a.queue.info(), queue.info());
    a.queue.connect(&ib).expect("connect A to B");
    queue.connect(&ia).expect("connect B to A");
    (a, OnShared { queue, send_cq })
}

/// Posts one receive of `len` bytes at `offset` of `mr` to the shared queue.
#[track_caller]
fn post_shared<S: SharedRecv, R: crate::MemoryRegion>(
    srq: &mut S,
    wr_id: u64,
    mr: &R,
    offset: usize,
    len: usize,
) {
    let sges = [sge(mr, offset, len)];
    srq.post_recv(&[RecvWr { wr_id, sges: &sges }]).expect("post a receive to the shared queue");
}

/// Two queues on one shared receive queue of 4 receives serve two peers: ten SENDs, alternating
/// between the peers, each land in the next receive posted to the shared queue (reposted as each
/// completes, so the shared queue wraps), and each completion names the queue the message came
/// in on, on the CQ both queues share. Posting a receive to such a queue's own RQ is refused.
pub fn shared_recv_serves_several_queues<E: Env>(env: &E) {
    if skip_without_shared_recv(env, "shared_recv_serves_several_queues") {
        return;
    }
    const LEN: usize = 48;
    const SLOT: usize = 64;
    let cfg = fit(env, QueueConfig::default().with_depths(16, 16));
    let mut srq = shared_recv(env, 4);
    let mut recv_cq = env.b().create_cq(2 * cfg.recv_depth + 1).expect("create the shared receive CQ");
    let (mut a1, mut b1) = connect_on_shared(env, &cfg, &recv_cq, &srq);
    let (mut a2, mut b2) = connect_on_shared(env, &cfg, &recv_cq, &srq);
    let dst = sink(env.b(), 4 * SLOT);
    let own = [sge(&dst, 0, SLOT)];
    match b1.queue.post_recv(&[RecvWr { wr_id: 1, sges: &own }]) {
        Err(Error::InvalidArgument(_)) => {}
        r => panic!("post_recv on a queue that uses a shared receive queue: want InvalidArgument, got {r:?}"),
    }
    for i in 0..4u64 {
        post_shared(&mut srq, 100 + i, &dst, i as usize * SLOT, SLOT);
    }
    let (src, sges) = numbered_source(env.a(), 10, LEN);
    for i in 0..10u64 {
        let what = format!("SEND {i} to a queue on a shared receive queue");
        let (from, to) = if i % 2 == 0 { (&mut a1, &b1) } else { (&mut a2, &b2) };
        from.queue.post_send(&[SendWr::send(i, &sges[i as usize])]).expect("post SEND");
        let c = wait_one(env, &mut recv_cq, &what);
        let slot = (i % 4) as usize;
        check_numbered(&c, to.queue.qpn(), 100 + i, &dst, slot * SLOT, i, LEN, &what);
        send_ok(env, from, i, CqOpcode::Send, &what);
        post_shared(&mut srq, 104 + i, &dst, slot * SLOT, SLOT);
    }
    expect_none(env, &mut recv_cq, QUIET, "after ten messages");
    for q in [&mut b1, &mut b2] {
        expect_none(env, &mut q.send_cq, QUIET, "the receiving queues sent nothing");
    }
    drop(src);
}

/// An empty shared receive queue is a receiver that is not ready: with `rnr_retry = 7` the SEND
/// does not complete over many RNR timer periods, the sender's queue stays READY, nothing
/// arrives; once a receive is posted to the shared queue the message lands in it, completing on
/// the receiving queue with the shared queue's `wr_id`.
pub fn shared_recv_empty_is_receiver_not_ready<E: Env>(env: &E) {
    if skip_without_shared_recv(env, "shared_recv_empty_is_receiver_not_ready") {
        return;
    }
    let cfg = rnr_config(env, 7);
    let mut srq = shared_recv(env, 8);
    let mut recv_cq = env.b().create_cq(cfg.recv_depth + 1).expect("create receive CQ");
    let (mut a, b) = connect_on_shared(env, &cfg, &recv_cq, &srq);
    let data = pattern(44, 100);
    let src = source(env.a(), &data);
    let dst = sink(env.b(), 128);
    let sges = [sge(&src, 0, 100)];
    a.queue.post_send(&[SendWr::send(1, &sges)]).expect("post SEND");
    expect_none(env, &mut a.send_cq, Duration::from_millis(20), "a SEND while the shared queue is empty");
    assert_eq!(a.queue.state(), QueueState::Ready, "RNR with rnr_retry = 7 is not an error");
    expect_none(env, &mut recv_cq, QUIET, "nothing is received while the shared queue is empty");
    post_shared(&mut srq, 7, &dst, 0, 128);
    let what = "SEND after a receive was posted to the shared queue";
    let c = wait_one(env, &mut recv_cq, what);
    check_numbered_like(&c, b.queue.qpn(), 7, 100, what);
    check_region(&dst, 0, &data, what);
    send_ok(env, &mut a, 1, CqOpcode::Send, what);
    assert_eq!(b.queue.state(), QueueState::Ready);
}

/// A receive completion `wr_id` of `len` bytes on queue `qpn`.
#[track_caller]
fn check_numbered_like(c: &crate::Completion, qpn: u32, wr_id: u64, len: u32, what: &str) {
    super::assert_ok(c, qpn, wr_id, CqOpcode::Recv, what);
    assert_eq!(c.byte_len, len, "{what}: {c:?}");
}

/// Destroying a shared receive queue that a queue uses is refused with `Busy` (verbs `EBUSY`)
/// and hands the shared queue back, still working; once the queue is dropped, it is destroyed.
pub fn shared_recv_destroy_refused_while_used<E: Env>(env: &E) {
    if skip_without_shared_recv(env, "shared_recv_destroy_refused_while_used") {
        return;
    }
    let cfg = fit(env, QueueConfig::default().with_depths(8, 8));
    let srq = shared_recv(env, 8);
    let mut recv_cq = env.b().create_cq(cfg.recv_depth + 1).expect("create receive CQ");
    let (mut a, b) = connect_on_shared(env, &cfg, &recv_cq, &srq);
    let mut srq = match srq.destroy() {
        Err((srq, Error::Busy(_))) => srq,
        Err((_, e)) => panic!("destroying a shared receive queue in use: want Busy, got {e:?}"),
        Ok(()) => panic!("destroying a shared receive queue in use was allowed"),
    };
    let what = "a SEND after the refused destroy";
    let dst = sink(env.b(), 64);
    post_shared(&mut srq, 9, &dst, 0, 64);
    let src = source(env.a(), &pattern(5, 64));
    let sges = [sge(&src, 0, 64)];
    a.queue.post_send(&[SendWr::send(2, &sges)]).expect("post SEND");
    let c = wait_one(env, &mut recv_cq, what);
    check_numbered_like(&c, b.queue.qpn(), 9, 64, what);
    check_region(&dst, 0, &pattern(5, 64), what);
    send_ok(env, &mut a, 2, CqOpcode::Send, what);
    drop(b);
    srq.destroy().map_err(|(_, e)| e).expect("destroy the shared receive queue once no queue uses it");
}

/// A queue on a shared receive queue that goes to ERROR does not flush the shared queue's
/// receives (they are the shared queue's): nothing completes on the CQ, and the next messages to
/// the other queue on the same shared queue land in the receives in posting order. The failed
/// queue then recovers (ERROR → RESET → READY with its peer) and takes the next shared receive.
pub fn shared_recv_survives_a_failed_queue<E: Env>(env: &E) {
    if skip_without_shared_recv(env, "shared_recv_survives_a_failed_queue") {
        return;
    }
    let cfg = fit(env, QueueConfig::default().with_depths(8, 8));
    let mut srq = shared_recv(env, 8);
    let mut recv_cq = env.b().create_cq(2 * cfg.recv_depth + 1).expect("create the shared receive CQ");
    let (mut a1, mut b1) = connect_on_shared(env, &cfg, &recv_cq, &srq);
    let (mut a2, b2) = connect_on_shared(env, &cfg, &recv_cq, &srq);
    let dst = sink(env.b(), 192);
    post_shared(&mut srq, 30, &dst, 0, 64);
    post_shared(&mut srq, 31, &dst, 64, 64);
    post_shared(&mut srq, 32, &dst, 128, 64);
    b1.queue.set_error().expect("set_error");
    assert_eq!(b1.queue.state(), QueueState::Error);
    expect_none(
        env,
        &mut recv_cq,
        Duration::from_millis(5),
        "a failed queue flushes none of the shared receives",
    );
    expect_none(env, &mut b1.send_cq, QUIET, "the failed queue had nothing to flush");
    let (src, sges) = numbered_source(env.a(), 2, 40);
    let what = "SENDs to the other queue on the shared receive queue";
    for i in 0..2u64 {
        a2.queue.post_send(&[SendWr::send(i, &sges[i as usize])]).expect("post SEND");
        let c = wait_one(env, &mut recv_cq, what);
        check_numbered(&c, b2.queue.qpn(), 30 + i, &dst, i as usize * 64, i, 40, what);
        send_ok(env, &mut a2, i, CqOpcode::Send, what);
    }
    let what = "the failed queue after recovery";
    a1.queue.set_error().expect("set_error on the failed queue's peer");
    expect_none(env, &mut a1.send_cq, QUIET, what);
    expect_none(env, &mut a1.recv_cq, QUIET, what);
    b1.queue.reset().expect("reset the failed queue");
    a1.queue.reset().expect("reset its peer");
    let (ia, ib) = (a1.queue.info(), b1.queue.info());
    a1.queue.connect(&ib).expect("reconnect A to B");
    b1.queue.connect(&ia).expect("reconnect B to A");
    a1.queue.post_send(&[SendWr::send(7, &sges[0])]).expect("post SEND");
    let c = wait_one(env, &mut recv_cq, what);
    check_numbered(&c, b1.queue.qpn(), 32, &dst, 128, 0, 40, what);
    send_ok(env, &mut a1, 7, CqOpcode::Send, what);
    expect_none(env, &mut recv_cq, QUIET, what);
    drop(src);
}

/// A queue destroyed while receive completions it took from the shared queue still sit in the
/// CQ (a connection closed with messages nobody polled) gives those receives back: none is
/// delivered, and the shared queue can be filled to its depth again and serve another queue.
/// (A backend that mapped completions through the dead queue only would leak one slot per such
/// message, until posting to the shared queue failed for good.)
pub fn shared_recv_slots_come_back_from_a_destroyed_queue<E: Env>(env: &E) {
    if skip_without_shared_recv(env, "shared_recv_slots_come_back_from_a_destroyed_queue") {
        return;
    }
    const DEPTH: u32 = 4;
    const SLOT: usize = 64;
    let cfg = fit(env, QueueConfig::default().with_depths(8, 8));
    let mut srq = shared_recv(env, DEPTH);
    let depth = srq.depth().min(DEPTH) as usize;
    let mut recv_cq = env.b().create_cq(2 * cfg.recv_depth + 1).expect("create the shared receive CQ");
    let dst = sink(env.b(), depth * SLOT);
    let (src, sges) = numbered_source(env.a(), depth as u64, 40);
    {
        let (mut a1, b1) = connect_on_shared(env, &cfg, &recv_cq, &srq);
        for i in 0..depth {
            post_shared(&mut srq, 10 + i as u64, &dst, i * SLOT, SLOT);
        }
        let what = "SENDs that fill the shared queue, left unpolled";
        for (i, sge) in sges.iter().enumerate() {
            a1.queue.post_send(&[SendWr::send(i as u64, sge)]).expect("post SEND");
            send_ok(env, &mut a1, i as u64, CqOpcode::Send, what);
        }
        // The receiving queue goes away with its completions still in the CQ.
        drop(b1);
    }
    expect_none(env, &mut recv_cq, QUIET, "completions of a destroyed queue on a shared receive queue");
    for i in 0..depth {
        post_shared(&mut srq, 20 + i as u64, &dst, i * SLOT, SLOT);
    }
    let (mut a2, b2) = connect_on_shared(env, &cfg, &recv_cq, &srq);
    let what = "SENDs to another queue on the refilled shared queue";
    for (i, sge) in sges.iter().enumerate() {
        a2.queue.post_send(&[SendWr::send(i as u64, sge)]).expect("post SEND");
        let c = wait_one(env, &mut recv_cq, what);
        check_numbered(&c, b2.queue.qpn(), 20 + i as u64, &dst, i * SLOT, i as u64, 40, what);
        send_ok(env, &mut a2, i as u64, CqOpcode::Send, what);
    }
    drop(src);
}
