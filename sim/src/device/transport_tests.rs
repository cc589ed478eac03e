//! Regression tests for transport bugs found by reading the simulator against rxe (issue 13):
//! a NIC's requester receives crafted responses injected into its receive port, from a peer
//! queue that never answers by itself (it stays in RESET, so it ignores everything), under the
//! Stepped engine: nothing happens but what the test injects.

use crate::packet::{PacketHeader, PacketKind, Syndrome, PSN_MASK};
use crate::{Engine, Fabric, SimNic};
use bypass_hal::*;

struct Rig {
    fabric: Fabric,
    a: SimNic,
    b: SimNic,
    cq: <SimNic as Device>::Cq,
    q: <SimNic as Device>::Queue,
    peer_qpn: u32,
    /// The first PSN the requester sends.
    first: u32,
    target: <SimNic as Device>::Region,
    local: <SimNic as Device>::Region,
}

fn rig(cfg: QueueConfig) -> Rig {
    rig_with(cfg, cfg)
}

/// As [`rig`], the peer queue made with `peer_cfg` (its `max_dest_rd_atomic` is the requester's
/// peer depth).
fn rig_with(cfg: QueueConfig, peer_cfg: QueueConfig) -> Rig {
    rig_on(crate::FabricConfig::new(Engine::Stepped { seed: 3 }), cfg, peer_cfg)
}

/// As [`rig_with`], on a fabric made with `fabric_cfg`.
fn rig_on(fabric_cfg: crate::FabricConfig, cfg: QueueConfig, peer_cfg: QueueConfig) -> Rig {
    let fabric = Fabric::with_config(fabric_cfg);
    let (a, b) = (fabric.add_nic(), fabric.add_nic());
    let cq = a.create_cq(64).unwrap();
    let mut q = a.create_queue(&cfg, &cq, &cq).unwrap();
    let cqb = b.create_cq(64).unwrap();
    let peer = b.create_queue(&peer_cfg, &cqb, &cqb).unwrap(); // stays in RESET: ignores packets
    q.connect(&peer.info()).unwrap();
    let first = q.info().psn;
    let target =
        b.register(1 << 16, Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ).unwrap();
    let local = a.register(1 << 16, Access::LOCAL_WRITE).unwrap();
    let peer_qpn = peer.qpn();
    std::mem::forget((cqb, peer)); // keep b's queue alive for the test's life
    Rig { fabric, a, b, cq, q, peer_qpn, first, target, local }
}

impl Rig {
    /// Injects a response from the peer queue with `psn` and `syndrome`, then runs to idle.
    fn respond(&self, psn: u32, syndrome: Syndrome) {
        let hdr = PacketHeader {
            src_nic: self.b.addr(),
            dst_nic: self.a.addr(),
            src_qpn: self.peer_qpn,
            dst_qpn: self.q.qpn(),
            kind: PacketKind::Ack,
            syndrome,
            psn: psn & PSN_MASK,
            ..Default::default()
        };
        assert!(self.a.nic.port.push(&hdr, &mut |_| {}));
        self.fabric.run_until_idle();
    }

    fn psn(&self, k: u32) -> u32 {
        self.first.wrapping_add(k) & PSN_MASK
    }

    fn completions(&mut self) -> Vec<(u64, Status)> {
        let mut wc = [Completion::default(); 16];
        let n = self.cq.poll(&mut wc).unwrap();
        wc[..n].iter().map(|c| (c.wr_id, c.status)).collect()
    }
}

/// Bug 2: an ACK outside [oldest unacknowledged, next PSN) — from before a reset — must not
/// complete messages the responder never executed.
#[test]
fn a_ghost_ack_completes_nothing() {
    let mut r = rig(QueueConfig::default());
    let sge = r.local.sge(0, 8).unwrap();
    r.q.post_send(&[SendWr::send(1, &[sge]), SendWr::send(2, &[sge]), SendWr::send(3, &[sge])]).unwrap();
    r.fabric.run_until_idle();
    assert!(r.completions().is_empty());
    // Far ahead of anything sent (PSNs first..first+2 are outstanding).
    r.respond(r.psn(1000), Syndrome::Ack);
    // Far behind.
    r.respond(r.psn(0).wrapping_sub(5000) & PSN_MASK, Syndrome::Ack);
    assert_eq!(r.completions(), [], "a stale ACK completed never-executed messages");
    assert_eq!(r.a.stats().stale_responses, 2);
    // The positive control: an ACK inside the window completes what it covers.
    r.respond(r.psn(1), Syndrome::Ack);
    assert_eq!(r.completions(), [(1, Status::Success), (2, Status::Success)]);
}

/// Bug 1: a NAK for a message behind an incomplete READ means the READ's response was lost; the
/// READ is asked again, and the NAK's error is not pinned on it.
#[test]
fn a_nak_past_an_incomplete_read_retries_the_read() {
    let mut r = rig(QueueConfig::default());
    let remote = r.target.remote();
    let (big, small) = ([r.local.sge(0, 6000).unwrap()], [r.local.sge(0, 8).unwrap()]);
    let read = SendWr::send(1, &big).with_op(SendOp::Read(remote.at(0)));
    let write = SendWr::send(2, &small).with_op(SendOp::Write(remote.at(0)));
    r.q.post_send(&[read, write]).unwrap();
    r.fabric.run_until_idle();
    let sent = r.a.stats().tx_packets;
    // The READ holds PSNs first..first+1 (two response segments); the WRITE is first+2.
    r.respond(r.psn(2), Syndrome::NakRemoteAccess);
    assert_eq!(r.completions(), [], "the NAK's error was reported on the READ");
    assert_eq!(r.q.state(), QueueState::Ready);
    assert!(r.a.stats().tx_packets > sent, "the READ request was sent again");
}

/// Bug 4: sequence NAKs spend the retry budget: after `retry_count` of them the next one fails
/// the message with `RetryExceeded`.
#[test]
fn sequence_naks_spend_the_retry_budget() {
    let mut cfg = QueueConfig::default();
    cfg.retry_count = 3;
    let mut r = rig(cfg);
    r.q.post_send(&[SendWr::send(1, &[r.local.sge(0, 8).unwrap()])]).unwrap();
    r.fabric.run_until_idle();
    for i in 0..3 {
        r.respond(r.psn(0), Syndrome::NakSequence);
        assert_eq!(r.completions(), [], "failed after {} sequence NAK(s)", i + 1);
    }
    r.respond(r.psn(0), Syndrome::NakSequence);
    assert_eq!(r.completions(), [(1, Status::RetryExceeded)]);
    assert_eq!(r.q.state(), QueueState::Error);
}

/// Bug 4, implied NAKs: an ACK past an incomplete READ spends the retry budget too.
#[test]
fn implied_naks_spend_the_retry_budget() {
    let mut cfg = QueueConfig::default();
    cfg.retry_count = 2;
    let mut r = rig(cfg);
    let remote = r.target.remote();
    let (big, small) = ([r.local.sge(0, 100).unwrap()], [r.local.sge(0, 8).unwrap()]);
    let read = SendWr::send(1, &big).with_op(SendOp::Read(remote.at(0)));
    let write = SendWr::send(2, &small).with_op(SendOp::Write(remote.at(0)));
    r.q.post_send(&[read, write]).unwrap();
    r.fabric.run_until_idle();
    for _ in 0..2 {
        r.respond(r.psn(1), Syndrome::Ack); // acknowledges the WRITE, past the READ (PSN first)
        assert_eq!(r.completions(), []);
    }
    r.respond(r.psn(1), Syndrome::Ack);
    let got = r.completions();
    assert_eq!(got.first(), Some(&(1, Status::RetryExceeded)), "{got:?}");
}

/// The requester keeps at most `max_rd_atomic` READs in flight: the next READ (and everything
/// after it) waits until one completes.
#[test]
fn reads_in_flight_stop_at_max_rd_atomic() {
    let mut cfg = QueueConfig::default();
    cfg.max_rd_atomic = 2;
    let mut r = rig(cfg);
    let remote = r.target.remote();
    let sges: Vec<[Sge; 1]> = (0..4).map(|i| [r.local.sge(i * 64, 64).unwrap()]).collect();
    let wrs: Vec<SendWr<'_>> =
        (0..4).map(|i| SendWr::send(i as u64, &sges[i]).with_op(SendOp::Read(remote.at(0)))).collect();
    r.q.post_send(&wrs).unwrap();
    r.fabric.run_until_idle();
    assert_eq!(r.a.stats().tx_packets, 2, "two READ requests, then the limit");
    // The first READ's response (one segment, PSN first) completes it; the third READ goes out.
    let hdr = PacketHeader {
        src_nic: r.b.addr(),
        dst_nic: r.a.addr(),
        src_qpn: r.peer_qpn,
        dst_qpn: r.q.qpn(),
        kind: PacketKind::ReadResponse,
        first: true,
        last: true,
        psn: r.psn(0),
        payload_len: 64,
        ..Default::default()
    };
    assert!(r.a.nic.port.push(&hdr, &mut |b: &mut [u8]| b.fill(7)));
    r.fabric.run_until_idle();
    assert_eq!(r.completions(), [(0, Status::Success)]);
    assert_eq!(r.a.stats().tx_packets, 3, "one more READ request once one completed");
}

/// Sequence NAKs spend the retry budget, so a long message over a lossy wire must show progress
/// before its last segment: the responder acknowledges every 64 segments, and an ACK (or a
/// sequence NAK, which acknowledges what precedes it) inside a message refills the budget. A
/// 1 MiB SEND (256 segments, ~13 of them lost) with three retries gets through, on every seed.
#[test]
fn a_long_message_over_a_lossy_wire_keeps_its_retry_budget() {
    use crate::{FabricConfig, FaultPlan};
    for seed in 1..=8u64 {
        let faults = FaultPlan { drop_ppm: 50_000, seed, ..FaultPlan::NONE };
        let fabric =
            Fabric::with_config(FabricConfig { faults, ..FabricConfig::new(Engine::Stepped { seed }) });
        let (a, b) = (fabric.add_nic(), fabric.add_nic());
        let mut cfg = QueueConfig::default();
        cfg.retry_count = 3;
        cfg.timeout = AckTimeout::at_least(std::time::Duration::from_millis(1));
        let (mut ca, mut cb) = (a.create_cq(16).unwrap(), b.create_cq(16).unwrap());
        let mut qa = a.create_queue(&cfg, &ca, &ca).unwrap();
        let mut qb = b.create_queue(&cfg, &cb, &cb).unwrap();
        let (ia, ib) = (qa.info(), qb.info());
        qa.connect(&ib).unwrap();
        qb.connect(&ia).unwrap();
        let src = a.register(1 << 20, Access::empty()).unwrap();
        let dst = b.register(1 << 20, Access::LOCAL_WRITE).unwrap();
        qb.post_recv(&[RecvWr { wr_id: 1, sges: &[dst.sge(0, 1 << 20).unwrap()] }]).unwrap();
        qa.post_send(&[SendWr::send(2, &[src.sge(0, 1 << 20).unwrap()])]).unwrap();
        let mut wc = [Completion::default(); 4];
        let mut sent = None;
        for _ in 0..100_000 {
            fabric.run_until_idle();
            if let Some(c) = ca.poll(&mut wc).unwrap().checked_sub(1).map(|_| wc[0]) {
                sent = Some(c.status);
                break;
            }
            fabric.advance(std::time::Duration::from_millis(1));
        }
        assert_eq!(sent, Some(Status::Success), "seed {seed}: {:?}", a.stats());
        assert_eq!(cb.poll(&mut wc).unwrap(), 1);
        assert_eq!((wc[0].status, wc[0].byte_len), (Status::Success, 1 << 20));
    }
}

impl Rig {
    /// Injects a READ response segment from the peer, then runs to idle.
    fn read_response(&self, psn: u32, first: bool, last: bool, len: u32) {
        let hdr = PacketHeader {
            src_nic: self.b.addr(),
            dst_nic: self.a.addr(),
            src_qpn: self.peer_qpn,
            dst_qpn: self.q.qpn(),
            kind: PacketKind::ReadResponse,
            first,
            last,
            psn: psn & PSN_MASK,
            payload_len: len,
            ..Default::default()
        };
        assert!(self.a.nic.port.push(&hdr, &mut |b: &mut [u8]| b.fill(9)));
        self.fabric.run_until_idle();
    }
}

/// A READ response that does not fit what was asked — at the PSN of a SEND, LAST too early,
/// a short middle segment, no FIRST at the start — fails the request with `BadResponse` and
/// puts the queue in ERROR, as IBA's bad-response rule (mlx5 reports IBV_WC_BAD_RESP_ERR).
#[test]
fn a_read_response_that_does_not_fit_is_a_bad_response() {
    // (READ length, or None for a SEND; the response's first, last, length)
    let cases: [(Option<u64>, bool, bool, u32); 4] = [
        (None, true, true, 8),          // a READ response for a SEND
        (Some(6000), true, true, 4096), // LAST on the first of two segments
        (Some(6000), true, false, 100), // a first segment shorter than the MTU
        (Some(100), false, true, 100),  // an only segment without FIRST
    ];
    for (i, (read, first, last, len)) in cases.into_iter().enumerate() {
        let mut r = rig(QueueConfig::default());
        let remote = r.target.remote();
        let sge = [r.local.sge(0, read.unwrap_or(8) as usize).unwrap()];
        let wr = match read {
            Some(_) => SendWr::send(1, &sge).with_op(SendOp::Read(remote.at(0))),
            None => SendWr::send(1, &sge),
        };
        r.q.post_send(&[wr]).unwrap();
        r.fabric.run_until_idle();
        r.read_response(r.psn(0), first, last, len);
        assert_eq!(r.completions(), [(1, Status::BadResponse)], "case {i}");
        assert_eq!(r.q.state(), QueueState::Error, "case {i}");
        assert_eq!(r.a.stats().bad_responses, 1, "case {i}");
    }
    // The positive control: the right two segments complete the READ.
    let mut r = rig(QueueConfig::default());
    let sge = [r.local.sge(0, 6000).unwrap()];
    r.q.post_send(&[SendWr::send(1, &sge).with_op(SendOp::Read(r.target.remote().at(0)))]).unwrap();
    r.fabric.run_until_idle();
    r.read_response(r.psn(0), true, false, 4096);
    r.read_response(r.psn(1), false, true, 6000 - 4096);
    assert_eq!(r.completions(), [(1, Status::Success)]);
    assert_eq!(r.a.stats().bad_responses, 0);
}

/// Two connected queues on a Stepped fabric; the responder `b` with `dest_reads` READ resources.
fn pair(
    dest_reads: u8,
) -> (Fabric, SimNic, SimNic, [<SimNic as Device>::Cq; 2], [<SimNic as Device>::Queue; 2]) {
    let fabric = Fabric::new(Engine::Stepped { seed: 5 });
    let (a, b) = (fabric.add_nic(), fabric.add_nic());
    let (ca, cb) = (a.create_cq(64).unwrap(), b.create_cq(64).unwrap());
    let mut cfg = QueueConfig::default();
    let mut qa = a.create_queue(&cfg, &ca, &ca).unwrap();
    cfg.max_dest_rd_atomic = dest_reads;
    let mut qb = b.create_queue(&cfg, &cb, &cb).unwrap();
    let (ia, ib) = (qa.info(), qb.info());
    qa.connect(&ib).unwrap();
    qb.connect(&ia).unwrap();
    (fabric, a, b, [ca, cb], [qa, qb])
}

/// A header from queue `qa` of NIC `a` to queue `qb` of NIC `b`, the rest left to the test:
/// what a test injects into `b`'s port as if `a` had sent it.
fn addressed<Q: Queue>(a: &SimNic, qa: &Q, b: &SimNic, qb: &Q) -> PacketHeader {
    PacketHeader {
        src_nic: a.addr(),
        dst_nic: b.addr(),
        src_qpn: qa.qpn(),
        dst_qpn: qb.qpn(),
        ..Default::default()
    }
}

/// A responder with `max_dest_rd_atomic` 0 may not be read from: NAK invalid request, the
/// requester's READ fails with RemoteInvalidRequest and both queues go to ERROR (rxe:
/// RESPST_ERR_TOO_MANY_RDMA_ATM_REQ).
#[test]
fn a_responder_without_read_resources_refuses_reads() {
    let (fabric, a, b, [mut ca, _cb], [mut qa, qb]) = pair(0);
    let target = b.register(4096, Access::LOCAL_WRITE | Access::REMOTE_READ).unwrap();
    let local = a.register(4096, Access::LOCAL_WRITE).unwrap();
    let sge = [local.sge(0, 64).unwrap()];
    qa.post_send(&[SendWr::send(1, &sge).with_op(SendOp::Read(target.remote().at(0)))]).unwrap();
    fabric.run_until_idle();
    let mut wc = [Completion::default(); 4];
    assert_eq!(ca.poll(&mut wc).unwrap(), 1);
    assert_eq!(wc[0].status, Status::RemoteInvalidRequest);
    assert_eq!((qa.state(), qb.state()), (QueueState::Error, QueueState::Error));
}

/// A duplicate READ is answered again only while the responder still remembers it (its last
/// `max_dest_rd_atomic` READs); an older one is dropped.
#[test]
fn duplicate_reads_are_answered_only_inside_the_responders_window() {
    let (fabric, a, b, [mut ca, _cb], [mut qa, qb]) = pair(1);
    let target = b.register(4096, Access::LOCAL_WRITE | Access::REMOTE_READ).unwrap();
    let local = a.register(4096, Access::LOCAL_WRITE).unwrap();
    let first = qa.info().psn;
    let sges = [[local.sge(0, 64).unwrap()], [local.sge(64, 64).unwrap()]];
    let remote = target.remote();
    let wrs = [
        SendWr::send(1, &sges[0]).with_op(SendOp::Read(remote.at(0))),
        SendWr::send(2, &sges[1]).with_op(SendOp::Read(remote.at(64))),
    ];
    qa.post_send(&wrs).unwrap();
    fabric.run_until_idle();
    let mut wc = [Completion::default(); 4];
    assert_eq!(ca.poll(&mut wc).unwrap(), 2);
    let duplicate = |psn: u32, addr: u64| {
        let hdr = PacketHeader {
            kind: PacketKind::ReadRequest,
            psn: psn & PSN_MASK,
            remote_addr: addr,
            rkey: remote.key.rkey(),
            dma_len: 64,
            ..addressed(&a, &qa, &b, &qb)
        };
        let before = b.stats().tx_responses;
        assert!(b.nic.port.push(&hdr, &mut |_| {}));
        fabric.run_until_idle();
        b.stats().tx_responses - before
    };
    assert_eq!(duplicate(first.wrapping_add(1), remote.addr + 64), 1, "the last READ is replayed");
    assert_eq!(duplicate(first, remote.addr), 0, "the READ before it is forgotten");
    assert_eq!(b.stats().duplicate_reads_dropped, 1);
    assert_eq!(duplicate(first.wrapping_add(1), remote.addr), 0, "a replay must ask for the same range");
    assert_eq!(qb.state(), QueueState::Ready, "dropping a duplicate is not an error");
}

/// A duplicate SEND is acknowledged again no further than the last SEND, WRITE or atomic the
/// responder executed, never past a READ received after it: a READ is acknowledged by its
/// responses alone. (With the READ's PSN in that ACK, rxe's requester completed a one-segment
/// READ whose response it had lost, with nothing placed: a wrong echo in the RPC suite.)
#[test]
fn a_duplicate_send_is_acknowledged_no_further_than_the_last_send() {
    let (fabric, a, b, _cqs, [qa, mut qb]) = pair(4);
    let target = b.register(4096, Access::LOCAL_WRITE | Access::REMOTE_READ).unwrap();
    let sge = [target.sge(0, 64).unwrap()];
    qb.post_recv(&[RecvWr { wr_id: 1, sges: &sge }]).unwrap();
    let first = qa.info().psn;
    let inject = |kind: PacketKind, psn: u32, payload_len: u32| {
        let hdr = PacketHeader {
            kind,
            first: true,
            last: true,
            psn: psn & PSN_MASK,
            remote_addr: target.remote().addr,
            rkey: target.remote().key.rkey(),
            dma_len: if kind == PacketKind::ReadRequest { 64 } else { 0 },
            payload_len,
            ..addressed(&a, &qa, &b, &qb)
        };
        assert!(b.nic.port.push(&hdr, &mut |buf| buf.fill(7)));
        fabric.run_until_idle();
    };
    // What b answers stays in its outbox, where the test reads it.
    crate::sync::lock(&b.nic.dev).outbox_blocked = true;
    inject(PacketKind::Send, first, 8);
    inject(PacketKind::ReadRequest, first.wrapping_add(1), 0);
    inject(PacketKind::Send, first, 8); // the SEND again, as after a requester's timeout
    let dev = crate::sync::lock(&b.nic.dev);
    let answers: Vec<(PacketKind, u32)> = dev.outbox.iter().map(|d| (d.hdr.kind, d.hdr.psn)).collect();
    let (send, read) = (first & PSN_MASK, first.wrapping_add(1) & PSN_MASK);
    assert_eq!(
        answers,
        [(PacketKind::Ack, send), (PacketKind::ReadResponse, read), (PacketKind::Ack, send)],
        "the duplicate's ACK must not reach the READ"
    );
    assert_eq!(dev.stats.duplicates, 1);
}

/// A request of another kind where the next segment of a multi-segment SEND or WRITE belongs is
/// an invalid request: NAK, and the responder's queue goes to ERROR.
#[test]
fn another_opcode_inside_a_message_is_an_invalid_request() {
    for (open, intruder) in
        [(PacketKind::Write, PacketKind::Send), (PacketKind::Send, PacketKind::ReadRequest)]
    {
        let (fabric, a, b, _cqs, [qa, mut qb]) = pair(4);
        let target =
            b.register(1 << 16, Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ).unwrap();
        qb.post_recv(&[RecvWr { wr_id: 1, sges: &[target.sge(0, 1 << 16).unwrap()] }]).unwrap();
        let remote = target.remote();
        let first = qa.info().psn;
        let seg = |kind: PacketKind, k: u32, first_seg: bool| {
            let hdr = PacketHeader {
                kind,
                psn: first.wrapping_add(k) & PSN_MASK,
                first: first_seg,
                last: kind == PacketKind::ReadRequest,
                remote_addr: remote.addr,
                rkey: remote.key.rkey(),
                dma_len: 8192,
                payload_len: if kind == PacketKind::ReadRequest { 0 } else { 4096 },
                ..addressed(&a, &qa, &b, &qb)
            };
            assert!(b.nic.port.push(&hdr, &mut |p: &mut [u8]| p.fill(1)));
            fabric.run_until_idle();
        };
        seg(open, 0, true); // the first of two segments
        assert_eq!(qb.state(), QueueState::Ready, "{open:?}: the first segment is fine");
        seg(intruder, 1, true);
        assert_eq!(qb.state(), QueueState::Error, "{intruder:?} inside a {open:?}");
    }
}

/// The responder executes an atomic once: a duplicate of one it remembers is answered with the
/// remembered old value and the word is not touched again; an unaligned word (which a bypass
/// requester refuses at post, but a foreign one may send) is an invalid request.
#[test]
fn atomics_execute_once_and_need_alignment() {
    let (fabric, a, b, [mut ca, _cb], [mut qa, qb]) = pair(4);
    let mut target = b.register(4096, Access::LOCAL_WRITE | Access::REMOTE_ATOMIC).unwrap();
    target.write(0, &40u64.to_ne_bytes()).unwrap();
    let local = a.register(8, Access::LOCAL_WRITE).unwrap();
    let first = qa.info().psn;
    let remote = target.remote();
    let sge = [local.sge(0, 8).unwrap()];
    qa.post_send(&[SendWr::send(1, &sge).with_op(SendOp::FetchAdd { remote: remote.at(0), add: 2 })])
        .unwrap();
    fabric.run_until_idle();
    let mut wc = [Completion::default(); 4];
    assert_eq!(ca.poll(&mut wc).unwrap(), 1);
    assert_eq!((wc[0].status, wc[0].opcode), (Status::Success, CqOpcode::FetchAdd));
    let request = |psn: u32, addr: u64| {
        let hdr = PacketHeader {
            kind: PacketKind::AtomicRequest,
            first: true,
            last: true,
            has_imm: true, // fetch-and-add
            psn: psn & PSN_MASK,
            remote_addr: addr,
            rkey: remote.key.rkey(),
            dma_len: 8,
            atomic: [2, 0],
            ..addressed(&a, &qa, &b, &qb)
        };
        let before = b.stats().tx_responses;
        assert!(b.nic.port.push(&hdr, &mut |_| {}));
        fabric.run_until_idle();
        b.stats().tx_responses - before
    };
    let word = |t: &<SimNic as Device>::Region| {
        let mut w = [0u8; 8];
        t.read(0, &mut w).unwrap();
        u64::from_ne_bytes(w)
    };
    assert_eq!(word(&target), 42);
    assert_eq!(request(first, remote.addr), 1, "the duplicate is answered");
    assert_eq!(word(&target), 42, "and not executed again");
    assert_eq!(qb.state(), QueueState::Ready);
    assert_eq!(request(first.wrapping_add(1), remote.addr + 4), 1, "a NAK");
    assert_eq!(qb.state(), QueueState::Error, "an unaligned atomic is an invalid request");
    assert_eq!(word(&target), 42);
}

/// Regression (shared receive pool under load): the packets pipelined behind a SEND that was
/// answered RNR got a sequence NAK as well, which spent one of the requester's transport
/// retries per RNR wait, so a queue that waited out eight RNR NAKs without a completion failed
/// with `RetryExceeded` although `rnr_retry = 7` retries forever. The RNR NAK is now the one
/// NAK for its PSN: ten RNR waits later, every SEND lands.
#[test]
fn rnr_waits_spend_no_transport_retries() {
    let (fabric, a, b, [mut ca, mut cb], [mut qa, mut qb]) = pair(4);
    let local = a.register(4096, Access::LOCAL_WRITE).unwrap();
    let target = b.register(4096, Access::LOCAL_WRITE).unwrap();
    let sges: Vec<[Sge; 1]> = (0..3).map(|i| [local.sge(i * 64, 64).unwrap()]).collect();
    let wrs: Vec<SendWr<'_>> = (0..3).map(|i| SendWr::send(i as u64, &sges[i])).collect();
    qa.post_send(&wrs).unwrap();
    for _ in 0..10 {
        fabric.run_until_idle();
        fabric.advance(std::time::Duration::from_millis(1));
    }
    fabric.run_until_idle();
    assert!(b.stats().rnr_naks_sent >= 10, "{:?}", b.stats());
    assert_eq!(a.stats().seq_naks_received, 0, "no sequence NAK behind an RNR NAK");
    assert_eq!(qa.state(), QueueState::Ready);
    let rsges: Vec<[Sge; 1]> = (0..3).map(|i| [target.sge(i * 64, 64).unwrap()]).collect();
    let rwrs: Vec<RecvWr<'_>> = (0..3).map(|i| RecvWr { wr_id: i as u64, sges: &rsges[i] }).collect();
    qb.post_recv(&rwrs).unwrap();
    fabric.advance(std::time::Duration::from_millis(1));
    fabric.run_until_idle();
    let mut wc = [Completion::default(); 4];
    assert_eq!(ca.poll(&mut wc).unwrap(), 3);
    assert!(wc[..3].iter().all(|c| c.status == Status::Success), "{:?}", &wc[..3]);
    assert_eq!(cb.poll(&mut wc).unwrap(), 3, "all three SENDs landed");
}

/// The peer's READ depth bounds the requester too: with its own `max_rd_atomic` 4 and a peer
/// whose `max_dest_rd_atomic` is 2 (rxe replays a duplicate READ only inside that window, so a
/// third READ in flight could never be asked again), the wire carries two READ requests, and
/// one more only once one completes.
#[test]
fn reads_in_flight_stop_at_the_peers_read_depth() {
    let cfg = QueueConfig::default();
    assert!(cfg.max_rd_atomic >= 4, "the requester alone would allow more than the peer");
    let mut peer_cfg = cfg;
    peer_cfg.max_dest_rd_atomic = 2;
    let mut r = rig_with(cfg, peer_cfg);
    let remote = r.target.remote();
    let sges: Vec<[Sge; 1]> = (0..4).map(|i| [r.local.sge(i * 64, 64).unwrap()]).collect();
    let wrs: Vec<SendWr<'_>> =
        (0..4).map(|i| SendWr::send(i as u64, &sges[i]).with_op(SendOp::Read(remote.at(0)))).collect();
    r.q.post_send(&wrs).unwrap();
    r.fabric.run_until_idle();
    assert_eq!(r.a.stats().tx_packets, 2, "two READ requests, the peer's depth");
    r.read_response(r.psn(0), true, true, 64);
    assert_eq!(r.completions(), [(0, Status::Success)]);
    assert_eq!(r.a.stats().tx_packets, 3, "one more READ request once one completed");
    r.read_response(r.psn(1), true, true, 64);
    r.read_response(r.psn(2), true, true, 64);
    assert_eq!(r.completions(), [(1, Status::Success), (2, Status::Success)]);
    assert_eq!(r.a.stats().tx_packets, 4);
}

/// A READ response lost in the middle of a multi-segment READ: the next segment reveals the
/// gap, and the requester asks again from the missing segment at once (IBA's out-of-sequence
/// READ response, rxe's completer), without waiting for its retransmission timer; the rest of
/// the responses already in flight behind the gap ask nothing more.
#[test]
fn a_gap_in_read_responses_asks_again_at_once_and_once() {
    let mut r = rig(QueueConfig::default());
    let sge = [r.local.sge(0, 3 * 4096).unwrap()];
    r.q.post_send(&[SendWr::send(1, &sge).with_op(SendOp::Read(r.target.remote().at(0)))]).unwrap();
    r.fabric.run_until_idle();
    assert_eq!(r.a.stats().tx_packets, 1);
    r.read_response(r.psn(0), true, false, 4096);
    // Segment 1 is lost; segment 2 arrives. No time passes: no timer can fire.
    r.read_response(r.psn(2), false, true, 4096);
    assert_eq!(r.a.stats().tx_packets, 2, "the READ asked again from segment 1 at once");
    assert_eq!(r.a.stats().timeouts, 0);
    assert_eq!(r.a.stats().read_gaps, 1);
    // A duplicate of the response behind the gap asks nothing more.
    r.read_response(r.psn(2), false, true, 4096);
    assert_eq!(r.a.stats().tx_packets, 2, "once per gap");
    // The answer to the new request (segments 1 and 2, a READ of its own) completes the READ.
    r.read_response(r.psn(1), true, false, 4096);
    r.read_response(r.psn(2), false, true, 4096);
    assert_eq!(r.completions(), [(1, Status::Success)]);
    assert_eq!(r.a.stats().read_gaps, 1);
}

/// A READ whose every response was lost, behind it a second READ whose response arrives: the
/// first READ's responses will never come (responses are in order), so it is asked again at
/// once, and the second's response alone completes nothing out of order.
#[test]
fn a_response_past_an_unanswered_read_asks_it_again_at_once() {
    let mut r = rig(QueueConfig::default());
    let remote = r.target.remote();
    let sges: Vec<[Sge; 1]> = (0..2).map(|i| [r.local.sge(i * 64, 64).unwrap()]).collect();
    let wrs: Vec<SendWr<'_>> =
        (0..2).map(|i| SendWr::send(i as u64, &sges[i]).with_op(SendOp::Read(remote.at(0)))).collect();
    r.q.post_send(&wrs).unwrap();
    r.fabric.run_until_idle();
    assert_eq!(r.a.stats().tx_packets, 2);
    r.read_response(r.psn(1), true, true, 64);
    assert_eq!(r.completions(), []);
    // Go-back-N from the first READ: both requests again, no timer.
    assert_eq!(r.a.stats().tx_packets, 4, "{:?}", r.a.stats());
    assert_eq!(r.a.stats().timeouts, 0);
    r.read_response(r.psn(0), true, true, 64);
    r.read_response(r.psn(1), true, true, 64);
    assert_eq!(r.completions(), [(0, Status::Success), (1, Status::Success)]);
}

/// READs of many segments over a seeded lossy wire: every READ completes with the peer's bytes,
/// and the lost responses in the middle of a READ are asked again at once — the repairs by gap
/// outnumber the timeouts (the timer is left for what no later response reveals: a lost last
/// segment, a lost request).
#[test]
fn reads_over_a_lossy_wire_repair_gaps_without_the_timer() {
    use crate::{FabricConfig, FaultPlan};
    for seed in 1..=4u64 {
        let faults = FaultPlan { drop_ppm: 20_000, seed, ..FaultPlan::NONE };
        let fabric =
            Fabric::with_config(FabricConfig { faults, ..FabricConfig::new(Engine::Stepped { seed }) });
        let (a, b) = (fabric.add_nic(), fabric.add_nic());
        let mut cfg = QueueConfig::default();
        cfg.timeout = AckTimeout::at_least(std::time::Duration::from_millis(1));
        let (mut ca, cb) = (a.create_cq(64).unwrap(), b.create_cq(64).unwrap());
        let mut qa = a.create_queue(&cfg, &ca, &ca).unwrap();
        let mut qb = b.create_queue(&cfg, &cb, &cb).unwrap();
        let (ia, ib) = (qa.info(), qb.info());
        qa.connect(&ib).unwrap();
        qb.connect(&ia).unwrap();
        const LEN: usize = 16 * 4096;
        let src = b.register(LEN, Access::REMOTE_READ).unwrap();
        // SAFETY: the region is LEN bytes, registered above and alive; nothing else touches it.
        let bytes = unsafe { std::slice::from_raw_parts_mut(src.as_ptr(), LEN) };
        for (i, x) in bytes.iter_mut().enumerate() {
            *x = (i * 7 + 3) as u8;
        }
        let dst = a.register(LEN, Access::LOCAL_WRITE).unwrap();
        let mut done = 0;
        for round in 0..16u64 {
            // SAFETY: as above, for dst.
            unsafe { std::ptr::write_bytes(dst.as_ptr(), 0, LEN) };
            qa.post_send(&[
                SendWr::send(round, &[dst.sge(0, LEN).unwrap()]).with_op(SendOp::Read(src.remote().at(0)))
            ])
            .unwrap();
            let mut wc = [Completion::default(); 4];
            let mut got = None;
            for _ in 0..10_000 {
                fabric.run_until_idle();
                if ca.poll(&mut wc).unwrap() == 1 {
                    got = Some(wc[0].status);
                    break;
                }
                fabric.advance(std::time::Duration::from_millis(1));
            }
            assert_eq!(got, Some(Status::Success), "seed {seed} round {round}: {:?}", a.stats());
            // SAFETY: as above.
            assert_eq!(unsafe { std::slice::from_raw_parts(dst.as_ptr(), LEN) }, &bytes[..]);
            done += 1;
        }
        assert_eq!(done, 16);
        let s = a.stats();
        assert!(s.read_gaps > s.timeouts, "seed {seed}: {s:?}");
    }
}

impl Rig {
    /// Moves the clock `wait` on and asserts that the retransmission timer fires exactly then:
    /// not a nanosecond before (no timeout, nothing resent), and at `wait` (one more timeout).
    fn expect_timeout_after(&self, wait: std::time::Duration, what: &str) {
        let before = self.a.stats();
        self.fabric.advance(wait - std::time::Duration::from_nanos(1));
        self.fabric.run_until_idle();
        assert_eq!(self.a.stats().timeouts, before.timeouts, "{what}: the timer fired before {wait:?}");
        assert_eq!(self.a.stats().retransmits, before.retransmits, "{what}: resent before {wait:?}");
        self.fabric.advance(std::time::Duration::from_nanos(1));
        self.fabric.run_until_idle();
        assert_eq!(self.a.stats().timeouts, before.timeouts + 1, "{what}: no timeout at {wait:?}");
        assert_eq!(self.a.stats().retransmits, before.retransmits + 1, "{what}: nothing resent at {wait:?}");
    }
}

/// Retransmission backoff (`FabricConfig::ack_timeout_backoff`, for wires whose NICs are
/// processes a host may deschedule): each timeout without progress doubles the next wait, up
/// to the cap; an ACK that makes progress brings it back to the queue's timeout; the retry
/// budget is spent as before, only over a longer time. Without the option every wait is the
/// timeout, as the hal contract and rxe have it.
#[test]
fn timeout_backoff_doubles_each_wait_without_progress() {
    let t_exp = 8; // 4.096 us x 2^8 = 1.048576 ms
    let mut cfg = QueueConfig::default();
    cfg.timeout = AckTimeout::from_exponent(t_exp).unwrap();
    cfg.retry_count = 4;
    let t = cfg.timeout.duration().unwrap();
    let backoff = crate::FabricConfig {
        ack_timeout_backoff: Some(t * 4),
        ..crate::FabricConfig::new(Engine::Stepped { seed: 3 })
    };
    let mut r = rig_on(backoff, cfg, cfg);
    let sge = r.local.sge(0, 8).unwrap();
    r.q.post_send(&[SendWr::send(1, &[sge])]).unwrap();
    r.fabric.run_until_idle();
    assert_eq!(r.a.stats().tx_packets, 1);
    r.expect_timeout_after(t, "first wait");
    r.expect_timeout_after(t * 2, "second wait, doubled");
    // The peer answers: progress, and the next message's wait is the timeout again.
    r.respond(r.psn(0), Syndrome::Ack);
    assert_eq!(r.completions(), [(1, Status::Success)]);
    r.q.post_send(&[SendWr::send(2, &[sge])]).unwrap();
    r.fabric.run_until_idle();
    r.expect_timeout_after(t, "after progress");
    r.expect_timeout_after(t * 2, "doubled");
    r.expect_timeout_after(t * 4, "doubled again");
    r.expect_timeout_after(t * 4, "at the cap");
    // Four retries spent: the next timeout, one cap later, fails the message.
    r.fabric.advance(t * 4 - std::time::Duration::from_nanos(1));
    r.fabric.run_until_idle();
    assert_eq!(r.completions(), []);
    r.fabric.advance(std::time::Duration::from_nanos(1));
    r.fabric.run_until_idle();
    assert_eq!(r.completions(), [(2, Status::RetryExceeded)]);
    assert_eq!(r.q.state(), QueueState::Error);

    // The default: no backoff, every wait is the timeout.
    let mut r = rig(cfg);
    r.q.post_send(&[SendWr::send(1, &[r.local.sge(0, 8).unwrap()])]).unwrap();
    r.fabric.run_until_idle();
    for k in 0..3 {
        r.expect_timeout_after(t, &format!("fixed wait {k}"));
    }
}
