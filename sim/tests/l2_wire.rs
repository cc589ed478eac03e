//! The L2 wire end to end: two simulated NICs on an in-memory Ethernet cable that loses frames,
//! one NIC talking to itself, and (where the host allows it) two NICs on an `AF_PACKET` veth pair.

use bypass_hal::conformance::pattern;
use bypass_hal::*;
use bypass_sim::l2::pair::{pair_attachments, PairConfig};
use bypass_sim::{Engine, Fabric, FabricConfig, SimNic};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Moves a 3000-byte SEND (three 1024-byte segments), a 64 KiB WRITE and a 64 KiB READ from `na`
/// to `nb` `rounds` times, checking every byte; returns when all completed.
fn exchange(fabric: &Fabric, na: &SimNic, nb: &SimNic, rounds: u64) {
    const BIG: usize = 64 << 10;
    let (mut ca, mut cb) = (na.create_cq(256).unwrap(), nb.create_cq(256).unwrap());
    let cfg = QueueConfig::default();
    let mut qa = na.create_queue(&cfg, &ca, &ca).unwrap();
    let mut qb = nb.create_queue(&cfg, &cb, &cb).unwrap();
    let (ia, ib) = (qa.info(), qb.info());
    qa.connect(&ib).unwrap();
    qb.connect(&ia).unwrap();
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let mut src = na.register(2 * BIG, access).unwrap();
    let mut dst = nb.register(2 * BIG, access).unwrap();
    for round in 0..rounds {
        let seed = round as u8;
        src.write(0, &pattern(seed, BIG)).unwrap();
        dst.write(BIG, &pattern(seed ^ 0x55, BIG)).unwrap();
        qb.post_recv(&[RecvWr { wr_id: 100 + round, sges: &[dst.sge(0, 3000).unwrap()] }]).unwrap();
        qa.post_send(&[
            SendWr::send(1, &[src.sge(0, 3000).unwrap()]),
            SendWr::send(2, &[src.sge(0, BIG).unwrap()]).with_op(SendOp::Write(dst.remote().at(BIG as u64))),
        ])
        .unwrap();
        let mut wc = [Completion::default(); 8];
        let (mut got_a, mut got_b) = (0, 0);
        let deadline = Instant::now() + Duration::from_secs(60);
        while got_a < 2 || got_b < 1 {
            assert!(Instant::now() < deadline, "round {round} stalled: {got_a} sends, {got_b} receives");
            let n = ca.poll(&mut wc).unwrap();
            for c in &wc[..n] {
                assert_eq!(c.status, Status::Success, "{c:?}");
                got_a += 1;
            }
            let n = cb.poll(&mut wc).unwrap();
            for c in &wc[..n] {
                assert_eq!(c.status, Status::Success, "{c:?}");
                assert_eq!(c.byte_len, 3000);
                got_b += 1;
            }
            fabric.progress();
        }
        let mut got = vec![0u8; BIG];
        dst.read(0, &mut got[..3000]).unwrap();
        assert_eq!(got[..3000], pattern(seed, 3000)[..], "SEND payload, round {round}");
        dst.read(BIG, &mut got).unwrap();
        assert_eq!(got, pattern(seed, BIG), "WRITE payload, round {round}");
        // READ it back into the other half of the source.
        qa.post_send(&[
            SendWr::send(3, &[src.sge(BIG, BIG).unwrap()]).with_op(SendOp::Read(dst.remote().at(BIG as u64)))
        ])
        .unwrap();
        let mut done = 0;
        while done < 1 {
            assert!(Instant::now() < deadline, "READ of round {round} stalled");
            let n = ca.poll(&mut wc).unwrap();
            for c in &wc[..n] {
                assert_eq!(c.status, Status::Success, "{c:?}");
                done += 1;
            }
            fabric.progress();
        }
        src.read(BIG, &mut got).unwrap();
        assert_eq!(got, pattern(seed, BIG), "READ payload, round {round}");
    }
    src.write(0, &[0]).unwrap();
}

#[test]
fn a_lossy_cable_loses_nothing_the_transport_sees() {
    for engine in [Engine::Inline, Engine::Threaded] {
        let cfg = PairConfig { loss_ppm: 20_000, seed: 7, ..PairConfig::default() };
        let (ports, cable) = pair_attachments(cfg).unwrap();
        let fabric = Fabric::try_with_l2(FabricConfig::new(engine), ports).unwrap();
        assert_eq!(fabric.config().mtu, 1024, "the path MTU of a 1500-byte Ethernet");
        let (na, nb) = (fabric.add_nic(), fabric.add_nic());
        exchange(&fabric, &na, &nb, 4);
        let lost = cable.lost.load(Ordering::Relaxed);
        assert!(lost > 0, "the cable lost frames ({engine:?})");
        assert!(na.stats().retransmits + nb.stats().retransmits > 0, "and the transport resent them");
    }
}

#[test]
fn queues_of_one_nic_reach_each_other_through_the_wire() {
    let (mut ports, _) = pair_attachments(PairConfig::default()).unwrap();
    ports.truncate(1);
    let fabric = Fabric::try_with_l2(FabricConfig::new(Engine::Inline), ports).unwrap();
    let na = fabric.add_nic();
    let e = fabric.try_add_nic().expect_err("one port, one NIC");
    assert!(e.to_string().contains("already has its NIC"), "{e}");
    exchange(&fabric, &na, &na, 2);
}

#[test]
fn fabrics_without_ports_are_refused() {
    let e = Fabric::try_with_l2(FabricConfig::new(Engine::Inline), vec![]).err().unwrap();
    assert!(e.contains("at least one port"), "{e}");
    let wire = bypass_sim::WireConfig::L2;
    let e =
        Fabric::try_with_config(FabricConfig { wire, ..FabricConfig::new(Engine::Inline) }).err().unwrap();
    assert!(e.contains("try_with_l2"), "{e}");
    let (ports, _) = pair_attachments(PairConfig::default()).unwrap();
    let e = Fabric::try_with_l2(FabricConfig::new(Engine::Stepped { seed: 1 }), ports).err().unwrap();
    assert!(e.contains("Stepped"), "{e}");
}

/// Two NICs on the two ends of a veth pair through `AF_PACKET` sockets: runs only where the
/// pair exists and the process has CAP_NET_RAW, named by `BYPASS_L2_VETH=<if-a>,<if-b>`
/// (`ip link add bpl2a type veth peer name bpl2b; ip link set bpl2a up; ip link set bpl2b up`).
#[test]
fn two_nics_on_a_veth_pair_through_af_packet() {
    let Ok(pair) = std::env::var("BYPASS_L2_VETH") else {
        eprintln!("two_nics_on_a_veth_pair_through_af_packet: skipped (set BYPASS_L2_VETH=<if-a>,<if-b>)");
        return;
    };
    let (a, b) = pair.split_once(',').expect("BYPASS_L2_VETH=<if-a>,<if-b>");
    let at = |ifname: &str, host: u8| bypass_sim::L2Attachment {
        port: Box::new(bypass_sim::l2::packet::PacketPort::open(ifname).unwrap()),
        addr: bypass_sim::L2Addr::new(std::net::Ipv4Addr::new(10, 99, 0, host)),
    };
    let ports = vec![at(a, 1), at(b, 2)];
    let fabric = Fabric::try_with_l2(FabricConfig::new(Engine::Inline), ports).unwrap();
    let (na, nb) = (fabric.add_nic(), fabric.add_nic());
    exchange(&fabric, &na, &nb, 2);
}
