//! The in-process wire with the Inline engine: a responder holds the plain ACK of a request back
//! for its next device pass, so that in a request–response exchange the ACK leaves in the same
//! burst as the response (docs/sim.md, "Response queue and ACK coalescing"), and never longer
//! than it may: an empty poll of the responder's CQ, an arm of any CQ, an idle poller or
//! `Fabric::progress`, or `FabricConfig::ack_hold` send it.
//!
//! Everything runs on the test's thread, so each step is deterministic.

use bypass_hal::*;
use bypass_sim::{Engine, Fabric, FabricConfig, SimCq, SimNic, SimQueue, SimRegion};
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

struct End {
    nic: SimNic,
    q: SimQueue,
    scq: SimCq,
    rcq: SimCq,
    mr: SimRegion,
}

struct Pair {
    _fabric: Fabric,
    client: End,
    server: End,
}

fn pair(ack_hold: Duration) -> Pair {
    pair_with(ack_hold, QueueConfig::default())
}

fn pair_with(ack_hold: Duration, queue: QueueConfig) -> Pair {
    let mut config = FabricConfig::new(Engine::Inline);
    config.ack_hold = ack_hold;
    let fabric = Fabric::with_config(config);
    let end = || {
        let nic = fabric.add_nic();
        let scq = nic.create_cq(16).unwrap();
        let rcq = nic.create_cq(16).unwrap();
        let q = nic.create_queue(&queue.with_depths(8, 8), &scq, &rcq).unwrap();
        let mr = nic.register(64, Access::LOCAL_WRITE).unwrap();
        End { nic, q, scq, rcq, mr }
    };
    let (mut client, mut server) = (end(), end());
    let (ci, si) = (client.q.info(), server.q.info());
    client.q.connect(&si).unwrap();
    server.q.connect(&ci).unwrap();
    for e in [&mut client, &mut server] {
        let sge = e.mr.sge(32, 32).unwrap();
        e.q.post_recv(&[RecvWr { wr_id: 100, sges: &[sge] }]).unwrap();
    }
    Pair { _fabric: fabric, client, server }
}

fn send(e: &mut End, wr_id: u64) {
    let sge = e.mr.sge(0, 8).unwrap();
    e.q.post_send(&[SendWr::send(wr_id, &[sge]).with_flags(WrFlags::SIGNALED)]).unwrap();
}

fn poll(cq: &mut SimCq) -> Vec<(u64, CqOpcode, Status)> {
    let mut wc = [Completion::default(); 8];
    let n = cq.poll(&mut wc).unwrap();
    wc[..n].iter().map(|c| (c.wr_id, c.opcode, c.status)).collect()
}

/// Polls `cq` until it completes something, for at most 5 s.
fn poll_until_done(cq: &mut SimCq) -> Vec<(u64, CqOpcode, Status)> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let got = poll(cq);
        if !got.is_empty() {
            return got;
        }
        assert!(Instant::now() < deadline, "nothing completed in 5 s");
    }
}

fn readable(fd: RawFd) -> bool {
    let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd, no wait.
    unsafe { libc::poll(&mut pfd, 1, 0) == 1 }
}

/// The server takes the client's request (its device runs on its poll) and answers it: the
/// request's ACK waits for the answer and leaves with it, so the client's device takes both in
/// one pass; the client's send completes when the answer arrives, not before.
#[test]
fn the_ack_of_a_request_leaves_with_the_reply() {
    let Pair { mut client, mut server, .. } = pair(Duration::from_secs(10));
    send(&mut client, 1);
    assert_eq!(poll(&mut server.rcq), [(100, CqOpcode::Recv, Status::Success)]);
    assert_eq!(poll(&mut client.scq), [], "the ACK was held back for the reply");
    send(&mut server, 2);
    assert_eq!(poll(&mut client.rcq), [(100, CqOpcode::Recv, Status::Success)]);
    assert_eq!(poll(&mut client.scq), [(1, CqOpcode::Send, Status::Success)], "the ACK came with the reply");
}

/// With `ack_hold` zero nothing is held: the ACK leaves with the pass that took the request.
#[test]
fn no_ack_is_held_when_ack_hold_is_zero() {
    let Pair { mut client, mut server, .. } = pair(Duration::ZERO);
    send(&mut client, 1);
    assert_eq!(poll(&mut server.rcq), [(100, CqOpcode::Recv, Status::Success)]);
    assert_eq!(poll(&mut client.scq), [(1, CqOpcode::Send, Status::Success)]);
}

/// A server whose polls find nothing more (it is not answering yet) sends the held ACK at the
/// second empty one; the first only counts, since a user that has just taken a message often
/// polls its other CQ before it answers.
#[test]
fn a_held_ack_leaves_at_the_responders_second_empty_poll() {
    let Pair { mut client, mut server, .. } = pair(Duration::from_secs(10));
    send(&mut client, 1);
    assert_eq!(poll(&mut server.rcq).len(), 1);
    assert_eq!(poll(&mut client.scq), []);
    assert_eq!(poll(&mut server.scq), [], "nothing to complete on the server");
    assert_eq!(poll(&mut client.scq), [], "one empty poll keeps the ACK for an answer");
    assert_eq!(poll(&mut server.rcq), []);
    assert_eq!(poll(&mut client.scq), [(1, CqOpcode::Send, Status::Success)]);
}

/// The client's ACK of the server's answer rides with the client's next request, though the
/// client polls its (empty) send CQ in between, as the RPC stack's client does.
#[test]
fn the_requesters_ack_of_a_reply_leaves_with_its_next_request() {
    let Pair { mut client, mut server, .. } = pair(Duration::from_secs(10));
    send(&mut client, 1);
    assert_eq!(poll(&mut server.rcq).len(), 1);
    let sge = server.mr.sge(32, 32).unwrap();
    server.q.post_recv(&[RecvWr { wr_id: 101, sges: &[sge] }]).unwrap();
    send(&mut server, 2);
    assert_eq!(poll(&mut client.rcq), [(100, CqOpcode::Recv, Status::Success)]);
    assert_eq!(poll(&mut client.scq), [(1, CqOpcode::Send, Status::Success)]);
    assert_eq!(poll(&mut client.scq), [], "the client's one empty poll");
    assert_eq!(poll(&mut server.scq), [], "the reply's ACK is held by the client");
    send(&mut client, 3);
    assert_eq!(poll(&mut server.rcq), [(101, CqOpcode::Recv, Status::Success)]);
    assert_eq!(poll(&mut server.scq), [(2, CqOpcode::Send, Status::Success)], "it came with the request");
}

/// A client about to sleep on its send CQ's event fd gets the completion: arming sends the ACK
/// the server holds, although the server's user does nothing more.
#[test]
fn arming_the_requesters_cq_sends_the_held_ack() {
    let Pair { mut client, mut server, .. } = pair(Duration::from_secs(10));
    send(&mut client, 1);
    assert_eq!(poll(&mut server.rcq).len(), 1);
    assert_eq!(poll(&mut client.scq), []);
    client.scq.arm(ArmMode::Any).unwrap();
    assert!(readable(client.scq.event_fd()), "the armed CQ's event fired");
    assert_eq!(poll(&mut client.scq), [(1, CqOpcode::Send, Status::Success)]);
}

/// The server's user stops after taking the request: the client, polling its send CQ, gets the
/// completion anyway (its idle polls help the server's device, which sends what it holds),
/// well before any retransmission.
#[test]
fn a_held_ack_leaves_though_the_responders_user_stops() {
    let Pair { mut client, mut server, .. } = pair(Duration::from_secs(10));
    send(&mut client, 1);
    assert_eq!(poll(&mut server.rcq).len(), 1);
    assert_eq!(poll_until_done(&mut client.scq), [(1, CqOpcode::Send, Status::Success)]);
}

/// A burst of messages taken in one pass is not a request waiting for its answer (and its
/// sender may wait for the ACK to send more): its one merged ACK leaves at once.
#[test]
fn the_ack_of_a_burst_is_not_held() {
    let Pair { mut client, mut server, .. } = pair(Duration::from_secs(10));
    let sge = server.mr.sge(32, 32).unwrap();
    server.q.post_recv(&[RecvWr { wr_id: 101, sges: &[sge] }]).unwrap();
    let sge = client.mr.sge(0, 8).unwrap();
    let sges = [sge];
    client
        .q
        .post_send(&[SendWr::send(1, &sges), SendWr::send(2, &sges).with_flags(WrFlags::SIGNALED)])
        .unwrap();
    assert_eq!(poll(&mut server.rcq).len(), 2);
    let done = poll(&mut client.scq);
    assert_eq!(done.last(), Some(&(2, CqOpcode::Send, Status::Success)), "{done:?}");
}

/// A hold may outlast a short ACK timeout (8 µs here, the hold 10 s): when the client's timer
/// comes due, the ACK the server holds leaves before the timer runs, so the request is not sent
/// again (on hardware the ACK would have come long before), and the poll that found the timer
/// due completes the send.
#[test]
fn a_held_ack_leaves_before_the_requester_would_retransmit() {
    let mut queue = QueueConfig::default();
    queue.timeout = AckTimeout::from_exponent(1).unwrap();
    let Pair { mut client, mut server, .. } = pair_with(Duration::from_secs(10), queue);
    send(&mut client, 1);
    assert_eq!(poll(&mut server.rcq).len(), 1);
    // Time passes (the sim's clock is the kernel's coarse one, 1-10 ms a tick): the client's
    // first poll below finds its retransmission timer due. Waiting longer changes nothing.
    std::thread::sleep(Duration::from_millis(25));
    assert_eq!(poll(&mut client.scq), [(1, CqOpcode::Send, Status::Success)]);
    let stats = client.nic.stats();
    assert_eq!((stats.timeouts, stats.retransmits), (0, 0), "{stats:?}");
    assert_eq!(server.nic.stats().duplicates, 0);
}

/// The server's user takes the request, then moves its queue to the error state or destroys it
/// before answering: the ACK it held for the answer leaves first (the NIC had taken the request),
/// so the client's send completes successfully rather than being retried into a dead queue.
/// (Destruction is what lost the ACK before; a queue in ERROR still exists, and its NIC's next
/// pass sent it anyway.)
#[test]
fn a_control_path_change_of_the_responders_queue_sends_its_held_ack() {
    for destroy in [false, true] {
        let mut queue = QueueConfig::default();
        queue.timeout = AckTimeout::from_exponent(10).unwrap(); // 4 ms
        queue.retry_count = 1;
        let Pair { mut client, mut server, .. } = pair_with(Duration::from_secs(10), queue);
        send(&mut client, 1);
        assert_eq!(poll(&mut server.rcq).len(), 1);
        assert_eq!(poll(&mut client.scq), [], "the ACK is held");
        if destroy {
            drop(server.q);
        } else {
            server.q.set_error().unwrap();
        }
        let done = poll_until_done(&mut client.scq);
        assert_eq!(done, [(1, CqOpcode::Send, Status::Success)], "destroyed: {destroy}");
        assert_eq!(client.nic.stats().retransmits, 0, "destroyed: {destroy}");
    }
}

/// The client's 1024th empty poll helps every NIC along (`HELP_AFTER_IDLE_POLLS`) while its own
/// retransmission timer is due and the server holds the ACK: the help sends every held ACK
/// before it runs any NIC, so the client takes the ACK before its timer runs. (Found by review:
/// the help ran the client's timer first, the server's release after it.)
#[test]
fn an_idle_pollers_help_sends_held_acks_before_it_runs_a_due_timer() {
    let mut queue = QueueConfig::default();
    queue.timeout = AckTimeout::from_exponent(12).unwrap(); // 16.8 ms
    let Pair { mut client, mut server, .. } = pair_with(Duration::from_secs(10), queue);
    send(&mut client, 1);
    assert_eq!(poll(&mut server.rcq).len(), 1);
    // 1,023 empty polls, well within the timeout (a poll checks timers every 16th time: one
    // that found the timer due would release the ACK itself, which the test above covers).
    for _ in 0..1023 {
        assert_eq!(poll(&mut client.scq), []);
    }
    // The timer falls due (the sim's clock is the kernel's coarse one); the next poll is the
    // 1,024th empty one, which helps without checking its own timers first.
    std::thread::sleep(Duration::from_millis(60));
    assert_eq!(poll_until_done(&mut client.scq), [(1, CqOpcode::Send, Status::Success)]);
    let stats = client.nic.stats();
    assert_eq!((stats.timeouts, stats.retransmits), (0, 0), "{stats:?}");
}
