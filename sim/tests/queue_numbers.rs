//! Queue numbers are reused after a queue is destroyed, and a late packet, queued response or
//! CQE of a destroyed queue never reaches the queue that got its slot (the number's generation
//! differs). Once the 8-bit generation wraps and a number comes back (after 256 reuses of its
//! slot), a CQE of its first queue is still not taken for the new one's (the CQE epoch).

use bypass_hal::*;
use bypass_sim::{Engine, Fabric, SimNic};

fn small() -> QueueConfig {
    let mut c = QueueConfig::default();
    c.send_depth = 1;
    c.recv_depth = 1;
    c.max_send_sge = 1;
    c.max_recv_sge = 1;
    c.max_inline = 0;
    c
}

const SLOT: u32 = 0xffff;

/// A NIC lives through more queues than it has numbers for at once: 70,000 created and
/// destroyed one after another, all on one CQ, which still delivers afterwards.
#[test]
fn seventy_thousand_queues_in_a_nics_life() {
    let fabric = Fabric::new(Engine::Inline);
    let (na, nb) = (fabric.add_nic(), fabric.add_nic());
    let cq = na.create_cq(4).unwrap();
    let cfg = small();
    let mut last: Option<u32> = None;
    let mut seen_slots = std::collections::HashSet::new();
    for i in 0..70_000u32 {
        let q = na.create_queue(&cfg, &cq, &cq).unwrap_or_else(|e| panic!("create #{i}: {e}"));
        let qpn = q.qpn();
        assert!(qpn < 1 << 24 && qpn & SLOT >= 2, "#{i}: queue number {qpn:#x} (24 bits, never QP0/QP1)");
        assert_ne!(Some(qpn), last, "#{i}: a reused slot got the same number again");
        seen_slots.insert(qpn & SLOT);
        last = Some(qpn);
    }
    assert_eq!(seen_slots.len(), 1, "one queue open at a time reuses one slot: {seen_slots:?}");
    // The CQ that saw 70,000 queues come and go still maps completions to the queue they belong to.
    let cfg = QueueConfig::default();
    let mut a = na.create_queue(&cfg, &cq, &cq).unwrap();
    let mut cqb = nb.create_cq(4).unwrap();
    let mut b = nb.create_queue(&cfg, &cqb, &cqb).unwrap();
    let (ia, ib) = (a.info(), b.info());
    a.connect(&ib).unwrap();
    b.connect(&ia).unwrap();
    let mut src = na.register(64, Access::LOCAL_WRITE).unwrap();
    src.write(0, b"after the churn").unwrap();
    let dst = nb.register(64, Access::LOCAL_WRITE).unwrap();
    b.post_recv(&[RecvWr { wr_id: 9, sges: &[dst.sge(0, 64).unwrap()] }]).unwrap();
    a.post_send(&[SendWr::send(7, &[src.sge(0, 15).unwrap()])]).unwrap();
    let mut wc = [Completion::default(); 4];
    let mut cqa = cq;
    let (mut sent, mut got) = (None, None);
    for _ in 0..10_000 {
        fabric.progress();
        if sent.is_none() && cqa.poll(&mut wc).unwrap() == 1 {
            sent = Some(wc[0]);
        }
        if got.is_none() && cqb.poll(&mut wc).unwrap() == 1 {
            got = Some(wc[0]);
        }
        if sent.is_some() && got.is_some() {
            break;
        }
    }
    let (sent, got) = (sent.expect("send completion"), got.expect("receive completion"));
    assert_eq!((sent.wr_id, sent.status, sent.qpn), (7, Status::Success, a.qpn()));
    assert_eq!((got.wr_id, got.status, got.byte_len), (9, Status::Success, 15));
    let mut bytes = [0u8; 15];
    dst.read(0, &mut bytes).unwrap();
    assert_eq!(&bytes, b"after the churn");
}

/// With every slot in use, creating a queue fails with a clear error; destroying one makes room.
#[test]
fn a_full_table_refuses_then_reuses_a_freed_slot() {
    let fabric = Fabric::new(Engine::Inline);
    let na = fabric.add_nic();
    let cq = na.create_cq(4).unwrap();
    let cfg = small();
    let mut open: Vec<_> = Vec::new();
    let err = loop {
        match na.create_queue(&cfg, &cq, &cq) {
            Ok(q) => open.push(q),
            Err(e) => break e,
        }
        assert!(open.len() <= 1 << 16, "no limit on open queues");
    };
    assert_eq!(open.len(), (1 << 16) - 2, "every slot but QP0 and QP1");
    assert!(matches!(err, Error::OutOfResources(_)), "{err}");
    assert!(err.to_string().contains("destroy one"), "the error says what to do: {err}");
    let freed = open.swap_remove(1000);
    let (old, slot) = (freed.qpn(), freed.qpn() & SLOT);
    drop(freed);
    let q = na.create_queue(&cfg, &cq, &cq).expect("a freed slot is reused");
    assert_eq!(q.qpn() & SLOT, slot);
    assert_ne!(q.qpn(), old);
}

fn recv_buffers(nic: &SimNic, n: usize, len: usize) -> bypass_sim::SimRegion {
    nic.register(n * len, Access::LOCAL_WRITE).unwrap()
}

/// A queue destroyed with traffic in flight, its slot given to a new queue connected to the same
/// sender: the sender's late packets (and the old queue's queued ACKs) reach nobody, on every
/// seed of the Stepped scheduler.
#[test]
fn a_destroyed_queues_late_packets_never_reach_its_successor() {
    for seed in 0..16 {
        late_packets(seed);
    }
}

fn late_packets(seed: u64) {
    const N: usize = 8;
    const LEN: usize = 64;
    let fabric = Fabric::new(Engine::Stepped { seed });
    let (na, nb) = (fabric.add_nic(), fabric.add_nic());
    let cfg = QueueConfig::default();
    let (cqa, mut cqb) = (na.create_cq(64).unwrap(), nb.create_cq(64).unwrap());
    let mut qa = na.create_queue(&cfg, &cqa, &cqa).unwrap();
    let mut qb1 = nb.create_queue(&cfg, &cqb, &cqb).unwrap();
    let (ia, ib1) = (qa.info(), qb1.info());
    qa.connect(&ib1).unwrap();
    qb1.connect(&ia).unwrap();
    let mut src = na.register(N * LEN, Access::LOCAL_WRITE).unwrap();
    src.write(0, &[0xAB; N * LEN]).unwrap();
    let old_bufs = recv_buffers(&nb, N, LEN);
    for i in 0..N {
        qb1.post_recv(&[RecvWr { wr_id: 100 + i as u64, sges: &[old_bufs.sge(i * LEN, LEN).unwrap()] }])
            .unwrap();
    }
    let wrs: Vec<_> = (0..N).map(|i| [src.sge(i * LEN, LEN).unwrap()]).collect();
    let sends: Vec<_> = wrs.iter().enumerate().map(|(i, s)| SendWr::send(i as u64, s)).collect();
    qa.post_send(&sends).unwrap();
    // Step until the first send is on the wire, before B received anything: every one of the
    // sends (those in flight, those still to go) is for the old queue, with the PSNs a queue
    // connected to the sender expects.
    let mut steps = 0;
    while na.stats().tx_packets == 0 {
        assert!(fabric.step(), "seed {seed}: idle before the sends were out");
        steps += 1;
        assert!(steps < 10_000, "seed {seed}: runaway");
    }
    assert_eq!(nb.stats().rx_packets, 0, "seed {seed}");
    let old = qb1.qpn();
    drop(qb1);
    // The successor takes the slot and, to be as exposed as possible, connects to the same sender
    // queue, expecting the PSNs the late packets carry.
    let mut qb2 = nb.create_queue(&cfg, &cqb, &cqb).unwrap();
    assert_eq!(qb2.qpn() & SLOT, old & SLOT, "seed {seed}: the freed slot is reused");
    assert_ne!(qb2.qpn(), old, "seed {seed}: with a new generation");
    qb2.connect(&ia).unwrap();
    let new_bufs = recv_buffers(&nb, N, LEN);
    for i in 0..N {
        qb2.post_recv(&[RecvWr { wr_id: 200 + i as u64, sges: &[new_bufs.sge(i * LEN, LEN).unwrap()] }])
            .unwrap();
    }
    let ignored = nb.stats().rx_ignored;
    let mut wc = [Completion::default(); 64];
    let mut on_b = Vec::new();
    let mut steps = 0;
    while fabric.step() {
        steps += 1;
        assert!(steps < 100_000, "seed {seed}: runaway");
        let n = cqb.poll(&mut wc).unwrap();
        on_b.extend(wc[..n].iter().filter(|c| c.qpn == qb2.qpn()).copied());
    }
    assert!(on_b.is_empty(), "seed {seed}: the new queue got the old one's traffic: {on_b:?}");
    assert!(nb.stats().rx_ignored > ignored, "seed {seed}: the late packets were dropped as ignored");
    let mut bytes = vec![0u8; N * LEN];
    new_bufs.read(0, &mut bytes).unwrap();
    assert!(bytes.iter().all(|&b| b == 0), "seed {seed}: bytes landed in the new queue's buffers");
}

/// A slot's generation is 8 bits, so its 257th queue gets its first queue's number back, and none
/// of the 255 in between does. A completion the first queue left unpolled in a CQ the 257th
/// shares is still not taken for the 257th queue's, nor does it free the 257th queue's ring
/// slot: what keeps them apart is the CQE epoch a slot carries over from queue to queue.
#[test]
fn a_number_back_after_256_reuses_never_gets_its_first_owners_completions() {
    const LEN: usize = 32;
    let fabric = Fabric::new(Engine::Stepped { seed: 0x0256 });
    let (na, nb) = (fabric.add_nic(), fabric.add_nic());
    // One send slot: a slot freed by somebody else's completion shows as room to post.
    let cfg = small();
    let mut cq = na.create_cq(16).unwrap();
    let mut cqb = nb.create_cq(16).unwrap();
    let mut src = na.register(LEN, Access::LOCAL_WRITE).unwrap();
    src.write(0, &[0x5A; LEN]).unwrap();
    let dst = recv_buffers(&nb, 1, LEN);
    let sge = src.sge(0, LEN).unwrap();
    let mut wc = [Completion::default(); 16];
    // The first owner sends once, run to the end: its send completion stays in `cq`, unpolled.
    let mut first = na.create_queue(&cfg, &cq, &cq).unwrap();
    let number = first.qpn();
    let mut peer = peer_of(&nb, &cqb, &mut first);
    peer.post_recv(&[RecvWr { wr_id: 1, sges: &[dst.sge(0, LEN).unwrap()] }]).unwrap();
    first.post_send(&[SendWr::send(0xDEAD, &[sge])]).unwrap();
    fabric.run_until_idle();
    assert_eq!(cqb.poll(&mut wc).unwrap(), 1, "the first owner's send arrived");
    drop(first);
    drop(peer);
    for reuse in 1..256 {
        let q = na.create_queue(&cfg, &cq, &cq).unwrap();
        assert_eq!(q.qpn() & SLOT, number & SLOT, "reuse {reuse}: the one free slot");
        assert_ne!(q.qpn(), number, "reuse {reuse}: the number came back before 256 reuses");
    }
    let mut again = na.create_queue(&cfg, &cq, &cq).unwrap();
    assert_eq!(again.qpn(), number, "the 8-bit generation wrapped: the 257th queue has the first's number");
    let mut peer = peer_of(&nb, &cqb, &mut again);
    peer.post_recv(&[RecvWr { wr_id: 2, sges: &[dst.sge(0, LEN).unwrap()] }]).unwrap();
    // Its one send slot taken and not run yet: the left-over completion is polled now.
    again.post_send(&[SendWr::send(0xBEEF, &[sge])]).unwrap();
    let n = cq.poll(&mut wc).unwrap();
    assert_eq!(n, 0, "the first owner's completion surfaced on the 257th queue: {:?}", &wc[..n]);
    let refused = again.post_send(&[SendWr::send(0xBAD, &[sge])]);
    assert!(
        matches!(refused, Err(Error::WouldBlock { .. })),
        "the first owner's completion freed the 257th queue's busy send slot: {refused:?}"
    );
    fabric.run_until_idle();
    let n = cq.poll(&mut wc).unwrap();
    let got: Vec<_> = wc[..n].iter().map(|c| (c.wr_id, c.status, c.qpn)).collect();
    assert_eq!(got, [(0xBEEF, Status::Success, number)], "the 257th queue's own send completes, once");
    assert_eq!(cqb.poll(&mut wc).unwrap(), 1, "and arrived");
}

/// A queue on `nic` (one slot each way, completing on `cq`) connected to `a`, and `a` to it.
fn peer_of(nic: &SimNic, cq: &bypass_sim::SimCq, a: &mut bypass_sim::SimQueue) -> bypass_sim::SimQueue {
    let mut b = nic.create_queue(&small(), cq, cq).unwrap();
    let (ia, ib) = (a.info(), b.info());
    a.connect(&ib).unwrap();
    b.connect(&ia).unwrap();
    b
}
