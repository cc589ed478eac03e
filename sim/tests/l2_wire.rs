//! The L2 wire end to end: two simulated NICs on an in-memory Ethernet cable that loses frames,
//! one NIC talking to itself, and (where the host allows it) two NICs on an `AF_PACKET` veth pair.

use bypass_hal::conformance::pattern;
use bypass_hal::l2::{L2Port, Mac};
use bypass_hal::*;
use bypass_sim::l2::pair::{pair_attachments, PairConfig};
use bypass_sim::{Engine, Fabric, FabricConfig, L2Attachment, SimNic};
use std::collections::VecDeque;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
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

/// A slow NIC's transmit ring in front of a port: `send` takes only what fits in a ring of
/// [`SlowTx::RING`] frames (the L2 port contract: the caller keeps the rest), and the NIC's
/// "device", a thread, puts at most two of them on the cable every 100 µs, as an emulated
/// virtio-net NIC under TCG drains its 256-deep ring far slower than the transport fills it.
struct SlowTx {
    ring: Arc<Mutex<VecDeque<Vec<u8>>>>,
    port: Arc<Mutex<Box<dyn L2Port>>>,
    mac: Mac,
    mtu: usize,
    fd: Option<RawFd>,
    stop: Arc<AtomicBool>,
    device: Option<std::thread::JoinHandle<()>>,
}

impl SlowTx {
    const RING: usize = 8;

    fn new(port: Box<dyn L2Port>) -> SlowTx {
        let (mac, mtu, fd) = (port.mac(), port.mtu(), port.event_fd());
        let ring = Arc::new(Mutex::new(VecDeque::<Vec<u8>>::new()));
        let port = Arc::new(Mutex::new(port));
        let stop = Arc::new(AtomicBool::new(false));
        let (r, p, st) = (ring.clone(), port.clone(), stop.clone());
        let device = std::thread::spawn(move || {
            while !st.load(Ordering::Relaxed) {
                let out: Vec<Vec<u8>> = {
                    let mut r = r.lock().unwrap();
                    let n = r.len().min(2);
                    r.drain(..n).collect()
                };
                if !out.is_empty() {
                    let frames: Vec<&[u8]> = out.iter().map(|f| &f[..]).collect();
                    assert_eq!(p.lock().unwrap().send(&frames).unwrap(), frames.len(), "the cable takes all");
                }
                // The model's pace (the device's transmit rate), not a wait for a result.
                std::thread::sleep(Duration::from_micros(100));
            }
        });
        SlowTx { ring, port, mac, mtu, fd, stop, device: Some(device) }
    }
}

impl Drop for SlowTx {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(d) = self.device.take() {
            let _ = d.join();
        }
    }
}

impl L2Port for SlowTx {
    fn mac(&self) -> Mac {
        self.mac
    }
    fn mtu(&self) -> usize {
        self.mtu
    }
    fn send(&mut self, frames: &[&[u8]]) -> Result<usize> {
        let mut ring = self.ring.lock().unwrap();
        let n = frames.len().min(Self::RING - ring.len());
        ring.extend(frames[..n].iter().map(|f| f.to_vec()));
        Ok(n)
    }
    fn recv(&mut self, max: usize, each: &mut dyn FnMut(&[u8])) -> Result<usize> {
        self.port.lock().unwrap().recv(max, each)
    }
    fn event_fd(&self) -> Option<RawFd> {
        self.fd
    }
    fn arm(&mut self) -> Result<bool> {
        self.port.lock().unwrap().arm()
    }
}

/// A NIC whose transmit ring is full holds its packets back (`Busy`) and loses none: the
/// transport neither drops its own frames nor resends windows into the same full ring, which
/// made 4 MiB transfers between the VFIO NIC and rxe run out of retries in the guest.
#[test]
fn a_full_transmit_ring_holds_packets_back_and_loses_none() {
    for engine in [Engine::Inline, Engine::Threaded] {
        let (ports, cable) = pair_attachments(PairConfig::default()).unwrap();
        let ports = ports
            .into_iter()
            .map(|at| L2Attachment { port: Box::new(SlowTx::new(at.port)), addr: at.addr })
            .collect();
        let fabric = Fabric::try_with_l2(FabricConfig::new(engine), ports).unwrap();
        let (na, nb) = (fabric.add_nic(), fabric.add_nic());
        exchange(&fabric, &na, &nb, 3);
        let (a, b) = (na.stats(), nb.stats());
        assert_eq!(
            (a.tx_wire_dropped, b.tx_wire_dropped),
            (0, 0),
            "no frame lost to a full ring ({engine:?}; retransmits {} and {})",
            a.retransmits,
            b.retransmits
        );
        assert!(
            a.tx_wire_busy + b.tx_wire_busy > 0,
            "the rings were full at times ({engine:?}): {a:?} {b:?}"
        );
        assert_eq!(cable.overflowed.load(Ordering::Relaxed), 0, "nor at the receiver");
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
