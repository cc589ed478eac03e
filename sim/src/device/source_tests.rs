//! The in-process wire passes payloads by reference (`source.rs`): packets in a peer's inbox
//! point into the sender's registered memory. These tests deregister and free that memory while
//! such packets wait, then let the peer drain its inbox: the packets must be lost (never read
//! from freed memory, which `valgrind` reports) and the transfer must end as on hardware, with
//! the requester's retransmission meeting the missing registration.

use crate::device::Unit;
use crate::nic::Nic;
use crate::{sync, Engine, Fabric, SimNic, SimRegion};
use bypass_hal::*;
use std::time::Duration;

const MTU: usize = 4096;
/// Four full segments.
const LEN: usize = 4 * MTU;

struct Pair {
    fabric: Fabric,
    a: SimNic,
    b: SimNic,
    cqa: <SimNic as Device>::Cq,
    qa: <SimNic as Device>::Queue,
    _cqb: <SimNic as Device>::Cq,
    qb: <SimNic as Device>::Queue,
}

fn pair() -> Pair {
    pair_on(Engine::Stepped { seed: 11 }, QueueConfig::default())
}

fn pair_on(engine: Engine, cfg: QueueConfig) -> Pair {
    let fabric = Fabric::new(engine);
    let (a, b) = (fabric.add_nic(), fabric.add_nic());
    let (cqa, cqb) = (a.create_cq(64).unwrap(), b.create_cq(64).unwrap());
    let mut qa = a.create_queue(&cfg, &cqa, &cqa).unwrap();
    let mut qb = b.create_queue(&cfg, &cqb, &cqb).unwrap();
    qa.connect(&qb.info()).unwrap();
    qb.connect(&qa.info()).unwrap();
    Pair { fabric, a, b, cqa, qa, _cqb: cqb, qb }
}

/// Runs only `nic`'s ready units that `pick` selects, until none is left: the peer does not
/// move, so what `nic` sends stays in the peer's inbox.
fn run_only(nic: &Nic, pick: impl Fn(Unit) -> bool) {
    let mut units = Vec::new();
    for _ in 0..10_000 {
        let mut dev = sync::lock(&nic.dev);
        units.clear();
        nic.ready_units(&mut dev, 0, &mut units);
        let Some(&(_, unit)) = units.iter().find(|(_, u)| pick(*u)) else { return };
        nic.run_unit(&mut dev, unit);
    }
    panic!("NIC {} never ran out of work", nic.addr);
}

/// Lets everything run, advancing the virtual clock past retransmission timeouts, until `cq`
/// has a completion (bounded: the retry budget ends every transfer).
fn drain_until_completion(fabric: &Fabric, cq: &mut <SimNic as Device>::Cq) -> Completion {
    let mut wc = [Completion::default(); 4];
    for _ in 0..100 {
        fabric.run_until_idle();
        if cq.poll(&mut wc).unwrap() > 0 {
            return wc[0];
        }
        fabric.advance(Duration::from_millis(200));
    }
    panic!("the transfer never completed");
}

fn filled(nic: &SimNic, access: Access, byte: u8) -> SimRegion {
    let r = nic.register(LEN, access).unwrap();
    // SAFETY: our own fresh registration, not posted to anything yet.
    unsafe { std::ptr::write_bytes(r.as_ptr(), byte, LEN) };
    r
}

fn bytes(r: &SimRegion) -> Vec<u8> {
    // SAFETY: no transfer into `r` is in progress (the test drained the fabric).
    unsafe { std::slice::from_raw_parts(r.as_ptr(), r.len()) }.to_vec()
}

/// A WRITE's segments wait in the responder's inbox, by reference, when the requester frees the
/// source: they are lost, the responder's memory is untouched, and the requester's
/// retransmission fails with a local protection error (the registration is gone).
#[test]
fn a_write_whose_source_is_freed_in_flight_fails_without_reading_it() {
    let mut p = pair();
    let src = filled(&p.a, Access::LOCAL_WRITE, 0xab);
    let dst = filled(&p.b, Access::LOCAL_WRITE | Access::REMOTE_WRITE, 0);
    let sge = [src.sge(0, LEN).unwrap()];
    p.qa.post_send(&[SendWr::send(7, &sge).with_op(SendOp::Write(dst.remote().at(0)))]).unwrap();
    run_only(&p.a.nic, |u| matches!(u, Unit::Send(_)));
    assert_eq!(p.a.stats().tx_packets, 4, "every segment is in the responder's inbox");
    assert!(p.b.nic.port.maybe_nonempty());
    drop(src); // deregistered and freed, with four packets pointing into it
    let c = drain_until_completion(&p.fabric, &mut p.cqa);
    assert_eq!((c.wr_id, c.status), (7, Status::LocalProtection));
    assert_eq!(p.b.stats().rx_source_gone, 4, "the packets were not lost");
    assert!(bytes(&dst).iter().all(|&b| b == 0), "bytes of freed memory were placed");
    assert_eq!(p.qa.state(), QueueState::Error);
}

/// READ responses wait in the requester's inbox, by reference into the responder's memory, when
/// the responder frees it: they are lost, and the READ asked again is NAKed (remote access).
#[test]
fn read_responses_whose_source_is_freed_in_flight_fail_the_read() {
    let mut p = pair();
    let local = filled(&p.a, Access::LOCAL_WRITE, 0);
    let target = filled(&p.b, Access::LOCAL_WRITE | Access::REMOTE_READ, 0xcd);
    let sge = [local.sge(0, LEN).unwrap()];
    p.qa.post_send(&[SendWr::send(9, &sge).with_op(SendOp::Read(target.remote().at(0)))]).unwrap();
    run_only(&p.a.nic, |u| matches!(u, Unit::Send(_)));
    assert_eq!(p.a.stats().tx_packets, 1, "the READ request is in the responder's inbox");
    // The responder takes the request and sends its responses, which the requester does not take.
    run_only(&p.b.nic, |u| matches!(u, Unit::Rx | Unit::Tx));
    assert_eq!(p.b.stats().tx_responses, 4);
    drop(target);
    let c = drain_until_completion(&p.fabric, &mut p.cqa);
    assert_eq!((c.wr_id, c.status), (9, Status::RemoteAccess));
    assert_eq!(p.a.stats().rx_source_gone, 4, "the responses were not lost");
    assert!(bytes(&local).iter().all(|&b| b == 0), "bytes of freed memory were placed");
    drop(p.qb);
}

/// The positive control: with the memory kept, the same by-reference packets are placed.
#[test]
fn by_reference_segments_are_placed_when_the_source_lives() {
    let mut p = pair();
    let src = filled(&p.a, Access::LOCAL_WRITE, 0xab);
    let dst = filled(&p.b, Access::LOCAL_WRITE | Access::REMOTE_WRITE, 0);
    let sge = [src.sge(0, LEN).unwrap()];
    p.qa.post_send(&[SendWr::send(7, &sge).with_op(SendOp::Write(dst.remote().at(0)))]).unwrap();
    run_only(&p.a.nic, |u| matches!(u, Unit::Send(_)));
    let c = drain_until_completion(&p.fabric, &mut p.cqa);
    assert_eq!((c.wr_id, c.status), (7, Status::Success));
    assert_eq!(p.b.stats().rx_source_gone, 0);
    assert!(bytes(&dst).iter().all(|&b| b == 0xab));
}

/// Payloads below `BY_REF_MIN` are copied into the inbox slot when sent (as a NIC's DMA reads
/// them then): freeing the source afterwards loses nothing.
#[test]
fn a_small_write_is_copied_at_transmit_and_survives_its_source() {
    let mut p = pair();
    let src = filled(&p.a, Access::LOCAL_WRITE, 0x5a);
    let dst = filled(&p.b, Access::LOCAL_WRITE | Access::REMOTE_WRITE, 0);
    let n = crate::wire::BY_REF_MIN - 1;
    let sge = [src.sge(0, n).unwrap()];
    p.qa.post_send(&[SendWr::send(3, &sge).with_op(SendOp::Write(dst.remote().at(0)))]).unwrap();
    run_only(&p.a.nic, |u| matches!(u, Unit::Send(_)));
    drop(src);
    let c = drain_until_completion(&p.fabric, &mut p.cqa);
    assert_eq!((c.wr_id, c.status), (3, Status::Success));
    let got = bytes(&dst);
    assert!(got[..n].iter().all(|&b| b == 0x5a) && got[n..].iter().all(|&b| b == 0));
}

/// Real threads: the responder's device thread places by-reference segments while the requester
/// frees their source, at varying moments. Every WRITE ends, either placed whole from live memory
/// or failed with a local protection error. Run alone, freed memory still holds its bytes, so a
/// missing liveness check passes here; under valgrind it reports reads of freed memory (checked),
/// and this test is clean.
#[test]
fn freeing_a_source_races_a_device_thread_placing_it() {
    const N: usize = 16 * MTU;
    let mut cfg = QueueConfig::default();
    cfg.timeout = AckTimeout::at_least(Duration::from_millis(1));
    let mut outcomes = [0u32; 2];
    for i in 0..24u32 {
        let mut p = pair_on(Engine::Threaded, cfg);
        let byte = 1 + i as u8;
        let src = p.a.register(N, Access::LOCAL_WRITE).unwrap();
        // SAFETY: our own fresh registration, not posted to anything yet.
        unsafe { std::ptr::write_bytes(src.as_ptr(), byte, N) };
        let dst = p.b.register(N, Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
        let sge = [src.sge(0, N).unwrap()];
        p.qa.post_send(&[SendWr::send(u64::from(i), &sge).with_op(SendOp::Write(dst.remote().at(0)))])
            .unwrap();
        // Free it once the requester sent a varying number of the 16 segments (the responder's
        // device thread is taking them meanwhile), or, every fourth round, after all of them.
        let sent = if i % 4 == 3 { 16 } else { u64::from(i % 16) + 1 };
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while p.a.stats().tx_packets < sent {
            assert!(std::time::Instant::now() < deadline, "WRITE {i} never sent {sent} segments");
            std::thread::yield_now();
        }
        drop(src);
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let mut wc = [Completion::default(); 4];
        while p.cqa.poll(&mut wc).unwrap() == 0 {
            assert!(std::time::Instant::now() < deadline, "WRITE {i} never completed");
            std::thread::yield_now();
        }
        match wc[0].status {
            Status::Success => {
                // SAFETY: the WRITE completed; nothing else writes `dst`.
                let got = unsafe { std::slice::from_raw_parts(dst.as_ptr(), N) };
                assert!(got.iter().all(|&b| b == byte), "WRITE {i} succeeded with bytes not from its source");
                outcomes[0] += 1;
            }
            Status::LocalProtection => outcomes[1] += 1,
            s => panic!("WRITE {i} ended with {s:?}"),
        }
    }
    eprintln!("placed whole: {}, failed (source gone): {}", outcomes[0], outcomes[1]);
}

/// A READ's responses waiting in the requester's inbox, back to back in the responder's memory,
/// are placed as one run (one key check, one copy), scattered over the READ's two SGEs with a
/// short last segment, and the READ completes once with every byte in place. A WRITE posted
/// before it completes first, as it would packet by packet.
#[test]
fn read_responses_waiting_back_to_back_are_placed_as_one_run() {
    // The last segment is short, but long enough to travel by reference (`BY_REF_MIN`).
    const N: usize = 16 * MTU + 2000;
    let mut p = pair();
    let target = p.b.register(N, Access::LOCAL_WRITE | Access::REMOTE_READ).unwrap();
    let pattern: Vec<u8> = (0..N).map(|i| (i % 251) as u8).collect();
    // SAFETY: our own fresh registration, not posted to anything yet.
    unsafe { std::ptr::copy_nonoverlapping(pattern.as_ptr(), target.as_ptr(), N) };
    let local = p.a.register(N + 4096, Access::LOCAL_WRITE).unwrap();
    let wsrc = filled(&p.a, Access::LOCAL_WRITE, 0x11);
    let wdst = filled(&p.b, Access::LOCAL_WRITE | Access::REMOTE_WRITE, 0);
    // Two SGEs with a hole between them: the run is scattered.
    let split = 5 * MTU + 17;
    let sges = [local.sge(0, split).unwrap(), local.sge(split + 4096, N - split).unwrap()];
    let wsge = [wsrc.sge(0, MTU).unwrap()];
    p.qa.post_send(&[
        SendWr::send(1, &wsge).with_op(SendOp::Write(wdst.remote().at(0))),
        SendWr::send(2, &sges).with_op(SendOp::Read(target.remote().at(0))),
    ])
    .unwrap();
    run_only(&p.a.nic, |u| matches!(u, Unit::Send(_)));
    run_only(&p.b.nic, |u| matches!(u, Unit::Rx | Unit::Tx));
    assert_eq!(p.b.stats().tx_responses, 18, "an ACK and 17 READ responses wait in the inbox");
    let mut got = vec![];
    for _ in 0..100 {
        p.fabric.run_until_idle();
        let mut wc = [Completion::default(); 4];
        let n = p.cqa.poll(&mut wc).unwrap();
        got.extend(wc[..n].iter().map(|c| (c.wr_id, c.status, c.byte_len)));
        if got.len() == 2 {
            break;
        }
    }
    assert_eq!(got, [(1, Status::Success, MTU as u32), (2, Status::Success, N as u32)]);
    let all = bytes(&local);
    assert_eq!(&all[..split], &pattern[..split]);
    assert!(all[split..split + 4096].iter().all(|&b| b == 0), "the hole between the SGEs was written");
    assert_eq!(&all[split + 4096..], &pattern[split..]);
    let s = p.a.stats();
    assert_eq!(s.rx_run_packets, 17, "the READ's responses were not placed as one run: {s:?}");
    assert_eq!(s.rx_packets, 18);
    assert_eq!((s.bad_responses, s.read_gaps, s.rx_source_gone), (0, 0, 0));
}

/// A loopback READ whose destination overlaps its source (one MTU further on, in the same
/// registration) is not placed as one run, whose single copy would move the original bytes: it
/// is placed packet by packet, each segment copied from memory the previous one just wrote,
/// which is what the NIC's per-packet DMA does.
#[test]
fn a_loopback_read_into_its_own_source_is_placed_packet_by_packet() {
    const N: usize = 4 * MTU;
    let fabric = Fabric::new(Engine::Stepped { seed: 5 });
    let a = fabric.add_nic();
    let mut cq = a.create_cq(64).unwrap();
    let cfg = QueueConfig::default();
    let mut q1 = a.create_queue(&cfg, &cq, &cq).unwrap();
    let mut q2 = a.create_queue(&cfg, &cq, &cq).unwrap();
    q1.connect(&q2.info()).unwrap();
    q2.connect(&q1.info()).unwrap();
    let r = a.register(N + MTU, Access::LOCAL_WRITE | Access::REMOTE_READ).unwrap();
    let pattern: Vec<u8> = (0..N + MTU).map(|i| (i / MTU) as u8 + 1).collect();
    // SAFETY: our own fresh registration, not posted to anything yet.
    unsafe { std::ptr::copy_nonoverlapping(pattern.as_ptr(), r.as_ptr(), N + MTU) };
    let sge = [r.sge(MTU, N).unwrap()];
    q1.post_send(&[SendWr::send(4, &sge).with_op(SendOp::Read(r.remote().at(0)))]).unwrap();
    let c = drain_until_completion(&fabric, &mut cq);
    assert_eq!((c.wr_id, c.status), (4, Status::Success));
    let got = bytes(&r);
    for k in 0..=4 {
        assert!(
            got[k * MTU..(k + 1) * MTU].iter().all(|&b| b == 1),
            "segment {k}: the READ was not placed packet by packet"
        );
    }
    assert_eq!(a.stats().rx_run_packets, 0);
    drop((q1, q2));
}

/// The responder sends a READ's queued segments in one go (one range check), one packet each:
/// an inbox of 3 slots refuses the fourth, and the rest go as the requester makes room. Every
/// segment arrives once and in order, and the READ completes with its bytes.
#[test]
fn a_burst_of_read_responses_stopped_by_a_full_inbox_resumes_in_order() {
    const N: usize = 10 * MTU;
    let mut config = crate::FabricConfig::new(Engine::Stepped { seed: 3 });
    config.inbox_depth = 3;
    let fabric = Fabric::with_config(config);
    let (a, b) = (fabric.add_nic(), fabric.add_nic());
    let (mut cqa, cqb) = (a.create_cq(64).unwrap(), b.create_cq(64).unwrap());
    let cfg = QueueConfig::default();
    let mut qa = a.create_queue(&cfg, &cqa, &cqa).unwrap();
    let mut qb = b.create_queue(&cfg, &cqb, &cqb).unwrap();
    qa.connect(&qb.info()).unwrap();
    qb.connect(&qa.info()).unwrap();
    let target = b.register(N, Access::LOCAL_WRITE | Access::REMOTE_READ).unwrap();
    let pattern: Vec<u8> = (0..N).map(|i| (i % 253) as u8).collect();
    // SAFETY: our own fresh registration, not posted to anything yet.
    unsafe { std::ptr::copy_nonoverlapping(pattern.as_ptr(), target.as_ptr(), N) };
    let local = a.register(N, Access::LOCAL_WRITE).unwrap();
    let sge = [local.sge(0, N).unwrap()];
    qa.post_send(&[SendWr::send(6, &sge).with_op(SendOp::Read(target.remote().at(0)))]).unwrap();
    run_only(&a.nic, |u| matches!(u, Unit::Send(_)));
    run_only(&b.nic, |u| matches!(u, Unit::Rx | Unit::Tx));
    assert_eq!(b.stats().tx_responses, 3, "the burst did not stop at the full inbox");
    assert_eq!(b.stats().tx_wire_busy, 1);
    let c = drain_until_completion(&fabric, &mut cqa);
    assert_eq!((c.wr_id, c.status, c.byte_len), (6, Status::Success, N as u32));
    assert_eq!(bytes(&local), pattern);
    assert_eq!(b.stats().tx_responses, 10);
    let s = a.stats();
    assert_eq!((s.rx_packets, s.bad_responses, s.read_gaps, s.stale_responses), (10, 0, 0, 0));
    assert_eq!(b.stats().retransmits + a.stats().retransmits, 0);
    drop((qa, qb));
}
