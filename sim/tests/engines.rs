//! Simulator behaviour beyond the hal contract: replaying a Stepped run from its seed, virtual-time
//! transport timers, and CQ overflow.

use bypass_hal::*;
use bypass_sim::{Engine, Fabric, SimCq, SimNic, SimQueue};
use std::os::fd::AsRawFd;
use std::time::Duration;

struct Side {
    q: SimQueue,
    cq: SimCq,
}

fn side(nic: &SimNic, cfg: &QueueConfig, cq_depth: u32) -> Side {
    let cq = nic.create_cq(cq_depth).unwrap();
    let q = nic.create_queue(cfg, &cq, &cq).unwrap();
    Side { q, cq }
}

fn connect(a: &mut Side, b: &mut Side) {
    let (ia, ib) = (a.q.info(), b.q.info());
    a.q.connect(&ib).unwrap();
    b.q.connect(&ia).unwrap();
}

/// Runs a mixed workload one step at a time and records, after every step, which completions
/// became visible on which side: a fingerprint of the interleaving the scheduler chose.
fn fingerprint(seed: u64) -> Vec<(u64, u8, u64, Status)> {
    let fabric = Fabric::new(Engine::Stepped { seed });
    let (na, nb) = (fabric.add_nic(), fabric.add_nic());
    let cfg = QueueConfig::default();
    let (mut a, mut b) = (side(&na, &cfg, 256), side(&nb, &cfg, 256));
    connect(&mut a, &mut b);
    let src = na.register(64 << 10, Access::LOCAL_WRITE).unwrap();
    let dst =
        nb.register(64 << 10, Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ).unwrap();
    for i in 0..8 {
        b.q.post_recv(&[RecvWr { wr_id: 100 + i, sges: &[dst.sge(i as usize * 8192, 8192).unwrap()] }])
            .unwrap();
    }
    let s = |off, len| src.sge(off, len).unwrap();
    a.q.post_send(&[
        SendWr::send(1, &[s(0, 6000)]),
        SendWr::send(2, &[s(0, 10)]).with_op(SendOp::Write(dst.remote().at(60_000))),
        SendWr::send(3, &[s(8192, 9000)]).with_op(SendOp::Read(dst.remote().at(0))),
        SendWr::send(4, &[s(0, 5000)]).with_op(SendOp::SendImm(7)),
        SendWr::send(5, &[s(0, 4)]).with_op(SendOp::WriteImm(dst.remote().at(0), 9)),
    ])
    .unwrap();
    let mut out = Vec::new();
    let mut wc = [Completion::default(); 16];
    let mut step = 0u64;
    while fabric.step() {
        step += 1;
        for (tag, cq) in [(0u8, &mut a.cq), (1, &mut b.cq)] {
            let n = cq.poll(&mut wc).unwrap();
            out.extend(wc[..n].iter().map(|c| (step, tag, c.wr_id, c.status)));
        }
    }
    assert_eq!(out.len(), 5 + 3, "five send-side and three receive completions: {out:?}");
    out
}

#[test]
fn stepped_runs_replay_exactly_from_their_seed() {
    for seed in [1, 2, 42] {
        assert_eq!(fingerprint(seed), fingerprint(seed), "seed {seed} did not replay");
    }
    let distinct: std::collections::HashSet<_> = (1..=8).map(fingerprint).collect();
    assert!(distinct.len() > 1, "eight seeds all chose the same interleaving: the seed is ignored");
}

/// A peer that never answers: the requester retransmits on its timer `retry_count` times, then
/// completes with RetryExceeded and goes to ERROR — at the virtual time the configuration says.
#[test]
fn retry_exhaustion_happens_on_the_virtual_clock() {
    let fabric = Fabric::new(Engine::Stepped { seed: 3 });
    let (na, nb) = (fabric.add_nic(), fabric.add_nic());
    // 10 ms rounds up to what the hardware can hold: 2^12 × 4.096 µs = 16.8 ms.
    let ack_timeout = bypass_hal::AckTimeout::at_least(Duration::from_millis(10));
    let timeout = ack_timeout.duration().expect("a finite timeout");
    let cfg = {
        let mut c = QueueConfig::default();
        c.timeout = ack_timeout;
        c.retry_count = 3;
        c
    };
    let (mut a, mut b) = (side(&na, &cfg, 16), side(&nb, &cfg, 16));
    connect(&mut a, &mut b);
    drop(b); // the peer queue is destroyed: its NIC ignores our packets
    a.q.post_send(&[SendWr::send(1, &[]), SendWr::send(2, &[])]).unwrap();
    let mut wc = [Completion::default(); 4];
    let start = fabric.now();
    let mut got = Vec::new();
    while got.is_empty() {
        fabric.run_until_idle();
        let n = a.cq.poll(&mut wc).unwrap();
        got.extend_from_slice(&wc[..n]);
        if got.is_empty() {
            assert!(fabric.now() - start < timeout * 10, "no RetryExceeded after {:?}", fabric.now() - start);
            fabric.advance(Duration::from_millis(1));
        }
    }
    fabric.run_until_idle();
    let n = a.cq.poll(&mut wc).unwrap();
    got.extend_from_slice(&wc[..n]);
    let elapsed = fabric.now() - start;
    assert_eq!(
        got.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        [(1, Status::RetryExceeded), (2, Status::Flushed)]
    );
    assert_eq!(a.q.state(), QueueState::Error);
    // 1 first transmission + 3 retries, each waiting one timeout.
    assert!(elapsed >= timeout * 4 && elapsed < timeout * 5, "gave up after {elapsed:?}");
    let stats = na.stats();
    assert_eq!(stats.timeouts, 3);
    assert_eq!(stats.retransmits, 3 * 2, "each timeout resends both outstanding messages");
}

/// A CQ too small for what completes reports the overflow instead of losing entries silently,
/// and the overrun is fatal, as on hardware: a CQ error event, and the queue that lost a
/// completion goes to ERROR with its own fatal event (it accepts posts only to flush them).
#[test]
fn cq_overflow_is_reported() {
    let fabric = Fabric::new(Engine::Stepped { seed: 5 });
    let (na, nb) = (fabric.add_nic(), fabric.add_nic());
    let cfg = {
        let mut c = QueueConfig::default();
        c.send_depth = 8;
        c
    };
    let (mut a, mut b) = (side(&na, &cfg, 2), side(&nb, &cfg, 64));
    connect(&mut a, &mut b);
    let mr = nb.register(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
    let wrs: Vec<SendWr<'_>> =
        (0..4).map(|i| SendWr::send(i, &[]).with_op(SendOp::Write(mr.remote().at(0)))).collect();
    a.q.post_send(&wrs).unwrap();
    fabric.run_until_idle();
    let mut wc = [Completion::default(); 8];
    assert_eq!(a.cq.poll(&mut wc).unwrap(), 2, "the two that fit");
    assert_eq!((wc[0].wr_id, wc[1].wr_id), (0, 1));
    match a.cq.poll(&mut wc) {
        Err(Error::CqOverflow { depth: 2 }) => {}
        other => panic!("expected CqOverflow, got {other:?}"),
    }
    assert_eq!(a.q.state(), QueueState::Error, "a queue that lost a completion cannot stay READY");
    let mut events = Vec::new();
    while let Some(e) = na.poll_async_event().unwrap() {
        events.push(e);
    }
    assert_eq!(events, [AsyncEvent::CqError, AsyncEvent::QueueFatal { qpn: a.q.qpn() }]);
    drop(b);
}

/// A batch with an INLINE payload outside any registered region is refused whole: the requests
/// before it in the batch are not left in the ring to be sent by the next doorbell.
#[test]
fn a_refused_inline_batch_leaves_nothing_behind() {
    let fabric = Fabric::new(Engine::Stepped { seed: 9 });
    let (na, nb) = (fabric.add_nic(), fabric.add_nic());
    let cfg = QueueConfig::default();
    let (mut a, mut b) = (side(&na, &cfg, 64), side(&nb, &cfg, 64));
    connect(&mut a, &mut b);
    let src = na.register(64, Access::empty()).unwrap();
    let dst = nb.register(64, Access::LOCAL_WRITE).unwrap();
    for i in 0..4 {
        b.q.post_recv(&[RecvWr { wr_id: 10 + i, sges: &[dst.sge(0, 64).unwrap()] }]).unwrap();
    }
    let good = [src.sge(0, 8).unwrap()];
    let bogus = [Sge::new(0x10, 8, src.lkey())]; // not inside the region
    let batch =
        [SendWr::send(1, &good), SendWr::send(2, &bogus).with_flags(WrFlags::SIGNALED | WrFlags::INLINE)];
    assert!(matches!(a.q.post_send(&batch), Err(Error::InvalidArgument(_))));
    a.q.post_send(&[SendWr::send(3, &good)]).unwrap();
    fabric.run_until_idle();
    let mut wc = [Completion::default(); 8];
    let n = b.cq.poll(&mut wc).unwrap();
    assert_eq!(wc[..n].iter().map(|c| c.wr_id).collect::<Vec<_>>(), [10], "only the later SEND arrived");
    let n = a.cq.poll(&mut wc).unwrap();
    assert_eq!(wc[..n].iter().map(|c| c.wr_id).collect::<Vec<_>>(), [3]);
}

/// A QueueInfo from a NIC of another fabric is refused with a clear error, not routed to the NIC
/// that happens to have the same address here.
#[test]
fn connecting_across_fabrics_is_refused() {
    let (f1, f2) = (Fabric::new(Engine::Inline), Fabric::new(Engine::Inline));
    let (n1, n2) = (f1.add_nic(), f2.add_nic());
    let cfg = QueueConfig::default();
    let (mut a, b) = (side(&n1, &cfg, 8), side(&n2, &cfg, 8));
    match a.q.connect(&b.q.info()) {
        Err(Error::InvalidArgument(msg)) => assert!(msg.contains("fabric"), "{msg}"),
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
    assert_eq!(a.q.state(), QueueState::Reset);
}

/// Inline engine, one thread, only the sender's CQ polled, nobody calling `Fabric::progress`: the
/// idle-poll safety net still runs the receiving NIC, so a 4 MiB SEND (1024 segments through a
/// 256-slot inbox, so the sender also waits for room) completes on both sides.
#[test]
fn inline_idle_pollers_help_a_nic_nobody_polls() {
    let fabric = Fabric::new(Engine::Inline);
    let (na, nb) = (fabric.add_nic(), fabric.add_nic());
    let cfg = QueueConfig::default();
    let (mut a, mut b) = (side(&na, &cfg, 16), side(&nb, &cfg, 16));
    connect(&mut a, &mut b);
    let len = 4 << 20;
    let mut src = na.register(len, Access::empty()).unwrap();
    let dst = nb.register(len, Access::LOCAL_WRITE).unwrap();
    src.write(len - 3, b"end").unwrap();
    b.q.post_recv(&[RecvWr { wr_id: 7, sges: &[dst.sge(0, len).unwrap()] }]).unwrap();
    a.q.post_send(&[SendWr::send(1, &[src.sge(0, len).unwrap()])]).unwrap();
    let mut wc = [Completion::default(); 4];
    let mut polls = 0u64;
    while a.cq.poll(&mut wc).unwrap() == 0 {
        polls += 1;
        assert!(polls < 50_000_000, "the sender's completion never came");
    }
    assert_eq!((wc[0].wr_id, wc[0].status), (1, Status::Success));
    assert_eq!(b.cq.poll(&mut wc).unwrap(), 1);
    assert_eq!((wc[0].wr_id, wc[0].byte_len), (7, len as u32));
    let mut tail = [0u8; 3];
    dst.read(len - 3, &mut tail).unwrap();
    assert_eq!(&tail, b"end");
}

/// Inline engine: a READ is answered on the requester's thread. The doorbell's run sends the
/// READ request and has the responder's NIC run at once (no thread of the responder's has to
/// be scheduled for it), which sends the responses back into the requester's inbox, where the
/// same run places them: the READ's completion is there at the first poll of the requester's
/// CQ, with nobody polling the responder. (Left to the responder's user, or to an idle poller's
/// help after `HELP_AFTER_IDLE_POLLS` empty polls, the first poll finds nothing.)
#[test]
fn inline_read_is_answered_on_the_requesters_thread() {
    let fabric = Fabric::new(Engine::Inline);
    let (na, nb) = (fabric.add_nic(), fabric.add_nic());
    let cfg = QueueConfig::default();
    let (mut a, mut b) = (side(&na, &cfg, 16), side(&nb, &cfg, 16));
    connect(&mut a, &mut b);
    let len = 64 << 10;
    let mut target = nb.register(len, Access::LOCAL_WRITE | Access::REMOTE_READ).unwrap();
    target.write(len - 3, b"end").unwrap();
    let local = na.register(len, Access::LOCAL_WRITE).unwrap();
    let sge = [local.sge(0, len).unwrap()];
    a.q.post_send(&[SendWr::send(5, &sge).with_op(SendOp::Read(target.remote().at(0)))]).unwrap();
    let mut wc = [Completion::default(); 4];
    assert_eq!(a.cq.poll(&mut wc).unwrap(), 1, "the READ waited for the responder's thread");
    assert_eq!((wc[0].wr_id, wc[0].status, wc[0].byte_len), (5, Status::Success, len as u32));
    let mut tail = [0u8; 3];
    local.read(len - 3, &mut tail).unwrap();
    assert_eq!(&tail, b"end");
    assert_eq!(b.cq.poll(&mut wc).unwrap(), 0);
}

/// Bad arguments to the control path are refused with `InvalidArgument` naming the problem, and
/// nothing is created.
#[test]
fn bad_control_arguments_are_clear_errors() {
    let fabric = Fabric::new(Engine::Inline);
    let (nic, other) = (fabric.add_nic(), fabric.add_nic());
    let invalid = |r: Result<(), Error>, what: &str| match r {
        Err(Error::InvalidArgument(msg)) => assert!(!msg.is_empty(), "{what}"),
        other => panic!("{what}: expected InvalidArgument, got {other:?}"),
    };
    invalid(nic.create_cq(0).map(drop), "CQ depth 0");
    invalid(nic.create_cq(nic.caps().max_cq_depth + 1).map(drop), "CQ deeper than the device allows");
    invalid(nic.register(64, Access::REMOTE_WRITE).map(drop), "REMOTE_WRITE without LOCAL_WRITE");
    let cq = nic.create_cq(8).unwrap();
    let foreign = other.create_cq(8).unwrap();
    let ok = QueueConfig::default();
    let caps = nic.caps();
    let with = |f: fn(&mut QueueConfig, &DeviceCaps)| {
        let mut c = ok;
        f(&mut c, &caps);
        c
    };
    for (what, cfg) in [
        ("send depth 0", with(|c, _| c.send_depth = 0)),
        ("recv depth above the device's", with(|c, caps| c.recv_depth = caps.max_queue_depth + 1)),
        ("no send SGE", with(|c, _| c.max_send_sge = 0)),
        ("more receive SGEs than the device's", with(|c, caps| c.max_recv_sge = caps.max_recv_sge + 1)),
        ("inline above the device's", with(|c, caps| c.max_inline = caps.max_inline + 1)),
        ("retry_count above 7", with(|c, _| c.retry_count = 8)),
        ("rnr_retry above 7", with(|c, _| c.rnr_retry = 8)),
    ] {
        invalid(nic.create_queue(&cfg, &cq, &cq).map(drop), what);
    }
    invalid(nic.create_queue(&ok, &cq, &foreign).map(drop), "a CQ of another NIC");

    // Post-time limits: too many SGEs, an oversized INLINE payload, an INLINE READ.
    let (mut a, mut b) = (side(&nic, &ok, 16), side(&other, &ok, 16));
    connect(&mut a, &mut b);
    let mr = nic.register(4096, Access::LOCAL_WRITE).unwrap();
    let sges: Vec<Sge> = (0..ok.max_send_sge as usize + 1).map(|i| mr.sge(i * 8, 8).unwrap()).collect();
    invalid(a.q.post_send(&[SendWr::send(1, &sges)]), "more SGEs than max_send_sge");
    let big = [mr.sge(0, ok.max_inline as usize + 1).unwrap()];
    invalid(a.q.post_send(&[SendWr::send(2, &big).with_flags(WrFlags::INLINE)]), "INLINE above max_inline");
    let one = [mr.sge(0, 8).unwrap()];
    let read = SendWr::send(3, &one).with_op(SendOp::Read(mr.remote().at(0))).with_flags(WrFlags::INLINE);
    invalid(a.q.post_send(&[read]), "an INLINE READ");
    invalid(a.q.post_recv(&[RecvWr { wr_id: 4, sges: &sges }]), "more SGEs than max_recv_sge");
    // None of the refused requests reached the device.
    fabric.progress();
    let mut wc = [Completion::default(); 4];
    assert_eq!(a.cq.poll(&mut wc).unwrap(), 0);
    assert_eq!(b.cq.poll(&mut wc).unwrap(), 0);
}

/// Many queues on one NIC pair, traffic on a changing subset of them, under every engine: each
/// message arrives exactly once on its own queue. (The device visits only queues whose doorbell
/// rang or that have work left, so this checks that no queue is forgotten.)
#[test]
fn many_queues_each_get_their_traffic() {
    for engine in [Engine::Inline, Engine::Threaded, Engine::Stepped { seed: 11 }] {
        let fabric = Fabric::new(engine);
        let (na, nb) = (fabric.add_nic(), fabric.add_nic());
        let cfg = QueueConfig::default().with_depths(8, 8);
        let (cqa, mut cqb) = (na.create_cq(1024).unwrap(), nb.create_cq(1024).unwrap());
        let mut pairs: Vec<(SimQueue, SimQueue)> = (0..40)
            .map(|_| {
                let mut qa = na.create_queue(&cfg, &cqa, &cqa).unwrap();
                let mut qb = nb.create_queue(&cfg, &cqb, &cqb).unwrap();
                let (ia, ib) = (qa.info(), qb.info());
                qa.connect(&ib).unwrap();
                qb.connect(&ia).unwrap();
                (qa, qb)
            })
            .collect();
        let mut cqa = cqa;
        let buf = nb.register(8, Access::LOCAL_WRITE).unwrap();
        let mut expected = std::collections::HashMap::new();
        let mut wc = [Completion::default(); 64];
        for round in 0..5u64 {
            // A different subset of queues each round: every third, offset by the round.
            for (i, (qa, qb)) in pairs.iter_mut().enumerate().filter(|(i, _)| (*i as u64 + round) % 3 == 0) {
                let id = round * 100 + i as u64;
                qb.post_recv(&[RecvWr { wr_id: id, sges: &[buf.sge(0, 8).unwrap()] }]).unwrap();
                qa.post_send(&[SendWr::send(id, &[])]).unwrap();
                expected.insert(id, qb.qpn());
            }
            let want = expected.len();
            let mut got = 0;
            let mut sends = 0;
            let mut spins = 0u64;
            while got < want || sends < want {
                fabric.run_until_idle();
                fabric.progress();
                let n = cqb.poll(&mut wc).unwrap();
                for c in &wc[..n] {
                    assert_eq!(c.status, Status::Success, "{engine:?}: {c:?}");
                    assert_eq!(
                        expected.remove(&c.wr_id),
                        Some(c.qpn),
                        "{engine:?}: {c:?} on the wrong queue or twice"
                    );
                    got += 1;
                }
                sends += cqa.poll(&mut wc).unwrap();
                spins += 1;
                assert!(spins < 5_000_000, "{engine:?} round {round}: {got}/{want} received, {sends} sent");
                if n == 0 {
                    std::thread::yield_now();
                }
            }
            assert!(expected.is_empty());
        }
    }
}

/// `set_error` racing traffic in flight — at a seeded step in Stepped mode, at a random moment
/// against a device thread in Threaded mode — still completes every posted work request exactly
/// once (successfully or flushed), sends before receives never lose their order, and nothing
/// arrives after the flush.
#[test]
fn set_error_racing_traffic_completes_everything_exactly_once() {
    let mut cases: Vec<(Engine, u64)> = (0..12).map(|s| (Engine::Stepped { seed: s }, s * 7 + 3)).collect();
    cases.extend((0..4).map(|s| (Engine::Threaded, s)));
    cases.extend((0..4).map(|s| (Engine::Inline, s)));
    for (engine, cut) in cases {
        let fabric = Fabric::new(engine);
        let (na, nb) = (fabric.add_nic(), fabric.add_nic());
        let cfg = QueueConfig::default().with_depths(64, 64);
        let (mut a, mut b) = (side(&na, &cfg, 256), side(&nb, &cfg, 256));
        connect(&mut a, &mut b);
        let src = na.register(64 * 1024, Access::LOCAL_WRITE).unwrap();
        let dst =
            nb.register(64 * 1024, Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ).unwrap();
        for r in 0..40u64 {
            b.q.post_recv(&[RecvWr { wr_id: 1000 + r, sges: &[dst.sge(r as usize * 1024, 1024).unwrap()] }])
                .unwrap();
        }
        for r in 0..8u64 {
            a.q.post_recv(&[RecvWr {
                wr_id: 2000 + r,
                sges: &[src.sge(60 * 1024 + r as usize * 64, 64).unwrap()],
            }])
            .unwrap();
        }
        let sges: Vec<[Sge; 1]> = (0..40).map(|i| [src.sge(i * 1024, 700 + i).unwrap()]).collect();
        let wrs: Vec<SendWr<'_>> = (0..40u64)
            .map(|i| {
                let w = SendWr::send(i, &sges[i as usize]);
                match i % 4 {
                    0 | 1 => w,
                    2 => w.with_op(SendOp::Write(dst.remote().at(i * 1024))),
                    _ => w.with_op(SendOp::Read(dst.remote().at(i * 1024))),
                }
            })
            .collect();
        a.q.post_send(&wrs[..20]).unwrap();
        // Let some of it happen, then pull the plug while the rest is in flight.
        match engine {
            Engine::Stepped { .. } => {
                for _ in 0..cut {
                    fabric.step();
                }
            }
            Engine::Inline => {
                for _ in 0..cut {
                    fabric.progress();
                }
            }
            Engine::Threaded => {
                for _ in 0..cut * 3 {
                    std::thread::yield_now();
                }
            }
        }
        a.q.post_send(&wrs[20..]).unwrap();
        a.q.set_error().unwrap();
        assert_eq!(a.q.state(), QueueState::Error);

        let mut seen = std::collections::HashMap::new();
        let mut wc = [Completion::default(); 64];
        let mut spins = 0u64;
        while seen.len() < 48 {
            fabric.run_until_idle();
            fabric.progress();
            let n = a.cq.poll(&mut wc).unwrap();
            for c in &wc[..n] {
                assert!(matches!(c.status, Status::Success | Status::Flushed), "{engine:?}/{cut}: {c:?}");
                assert!(
                    seen.insert(c.wr_id, c.status).is_none(),
                    "{engine:?}/{cut}: wr {} completed twice",
                    c.wr_id
                );
            }
            spins += 1;
            assert!(spins < 5_000_000, "{engine:?}/{cut}: only {} of 48 completions", seen.len());
            if n == 0 {
                std::thread::yield_now();
            }
        }
        // Sends complete in order: once one is flushed, every later one is too.
        let first_flushed = (0..40u64).find(|i| seen[i] == Status::Flushed).unwrap_or(40);
        assert!((first_flushed..40).all(|i| seen[&i] == Status::Flushed), "{engine:?}/{cut}: {seen:?}");
        assert!((2000..2008).all(|id| seen[&id] == Status::Flushed), "{engine:?}/{cut}: receives flushed");
        // Nothing more, ever.
        fabric.run_until_idle();
        fabric.progress();
        assert_eq!(a.cq.poll(&mut wc).unwrap(), 0, "{engine:?}/{cut}: a completion after the flush");
        let _ = b.cq.poll(&mut wc);
    }
}

/// A queue that fails on the responder side with nothing of its own outstanding — a peer's WRITE
/// with a wrong rkey — is reported by an asynchronous event naming it (readable on the NIC's
/// async-event fd), once; the requester gets `RemoteAccess` on its WRITE.
#[test]
fn responder_failure_raises_an_async_event() {
    use bypass_hal::{AsyncEvent, RemoteAddr, RemoteKey, SendOp};
    let fabric = Fabric::new(Engine::Inline);
    let (na, nb) = (fabric.add_nic(), fabric.add_nic());
    let cfg = QueueConfig::default();
    let (mut a, mut b) = (side(&na, &cfg, 16), side(&nb, &cfg, 16));
    connect(&mut a, &mut b);
    assert_eq!(nb.poll_async_event().unwrap(), None, "no event on a healthy NIC");
    let target = nb.register(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
    let src = na.register(64, Access::empty()).unwrap();
    let bad =
        RemoteAddr { addr: target.addr(), key: RemoteKey::from_rkey(target.remote_key().rkey() ^ 0x100) };
    let sges = [src.sge(0, 8).unwrap()];
    a.q.post_send(&[SendWr::send(1, &sges).with_op(SendOp::Write(bad))]).unwrap();
    let mut wc = [Completion::default(); 4];
    let mut got = Vec::new();
    for _ in 0..10_000 {
        let n = a.cq.poll(&mut wc).unwrap();
        got.extend_from_slice(&wc[..n]);
        if !got.is_empty() {
            break;
        }
    }
    assert_eq!(got.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(), [(1, Status::RemoteAccess)]);
    assert_eq!(b.q.state(), QueueState::Error, "the responder's queue fails too");
    let mut pfd =
        libc::pollfd { fd: nb.async_event_fd().unwrap().as_raw_fd(), events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd, zero timeout.
    assert_eq!(unsafe { libc::poll(&mut pfd, 1, 0) }, 1, "the async-event fd is readable");
    assert_eq!(nb.poll_async_event().unwrap(), Some(AsyncEvent::QueueAccessError { qpn: b.q.qpn() }));
    assert_eq!(nb.poll_async_event().unwrap(), None, "each event is reported once");
    assert_eq!(na.poll_async_event().unwrap(), None, "the requester's failure is its completion's to report");
}
