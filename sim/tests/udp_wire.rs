//! The UDP wire as a user meets it: garbage on the socket, peers that are not there, mixed
//! wires, faults, and a capture of real traffic.

use bypass_hal::*;
use bypass_sim::{Engine, Fabric, FabricConfig, FaultPlan, SimNic, WireConfig};
use std::net::UdpSocket;
use std::time::{Duration, Instant};

fn udp_fabric(engine: Engine, faults: FaultPlan) -> Fabric {
    let wire = WireConfig::parse("udp://127.0.0.1:0").unwrap();
    Fabric::with_config(FabricConfig { wire, faults, ..FabricConfig::new(engine) })
}

struct Pair {
    ca: <SimNic as Device>::Cq,
    cb: <SimNic as Device>::Cq,
    qa: <SimNic as Device>::Queue,
    qb: <SimNic as Device>::Queue,
}

fn pair(a: &SimNic, b: &SimNic, cfg: &QueueConfig) -> Pair {
    let (ca, cb) = (a.create_cq(256).unwrap(), b.create_cq(256).unwrap());
    let mut qa = a.create_queue(cfg, &ca, &ca).unwrap();
    let mut qb = b.create_queue(cfg, &cb, &cb).unwrap();
    let (ia, ib) = (qa.info(), qb.info());
    qa.connect(&ib).unwrap();
    qb.connect(&ia).unwrap();
    Pair { ca, cb, qa, qb }
}

/// Sends `n` messages of `len` bytes from a to b and checks every byte arrived, in order.
fn exchange(fabric: &Fabric, a: &SimNic, b: &SimNic, p: &mut Pair, n: u64, len: usize) {
    let mut src = a.register(len, Access::empty()).unwrap();
    let dst = b.register(len * n as usize, Access::LOCAL_WRITE).unwrap();
    let mut wc = [Completion::default(); 32];
    for i in 0..n {
        let off = i as usize * len;
        p.qb.post_recv(&[RecvWr { wr_id: i, sges: &[dst.sge(off, len).unwrap()] }]).unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    let (mut sent, mut got) = (0u64, 0u64);
    while sent < n || got < n {
        assert!(Instant::now() < deadline, "exchange stalled: {sent} sent, {got} received");
        if sent < n {
            let fill: Vec<u8> = (0..len).map(|k| (k as u64 * 7 + sent) as u8).collect();
            src.write(0, &fill).unwrap();
            p.qa.post_send(&[SendWr::send(sent, &[src.sge(0, len).unwrap()])]).unwrap();
            // One message at a time: the source buffer is rewritten for the next one.
            loop {
                assert!(Instant::now() < deadline, "send {sent} never completed");
                let k = p.ca.poll(&mut wc).unwrap();
                if k > 0 {
                    assert_eq!(wc[0].status, Status::Success, "send {sent}");
                    break;
                }
                fabric.progress();
                got += count_recv(&mut p.cb, &mut wc);
            }
            sent += 1;
        }
        got += count_recv(&mut p.cb, &mut wc);
        fabric.progress();
    }
    let mut all = vec![0u8; len * n as usize];
    dst.read(0, &mut all).unwrap();
    for i in 0..n as usize {
        for k in 0..len {
            assert_eq!(all[i * len + k], (k as u64 * 7 + i as u64) as u8, "message {i} byte {k}");
        }
    }
}

fn count_recv(cq: &mut <SimNic as Device>::Cq, wc: &mut [Completion]) -> u64 {
    let k = cq.poll(wc).unwrap();
    for c in &wc[..k] {
        assert_eq!(c.status, Status::Success, "receive {}", c.wr_id);
    }
    k as u64
}

#[test]
fn garbage_datagrams_are_counted_and_dropped_while_traffic_flows() {
    let fabric = udp_fabric(Engine::Inline, FaultPlan::NONE);
    let (a, b) = (fabric.add_nic(), fabric.add_nic());
    let mut p = pair(&a, &b, &QueueConfig::default());
    let target = b.udp_addr().expect("a NIC on the UDP wire has a socket address");
    let junk = UdpSocket::bind("127.0.0.1:0").unwrap();
    let garbage: [&[u8]; 5] = [
        b"",
        b"\x04",                             // a SEND ONLY opcode and nothing else
        &[0u8; 40],                          // zeros: a SEND FIRST whose ICRC is wrong
        &[0xFFu8; 64],                       // no such opcode
        b"BYPSPONG\x01\x02\x03\x04\x05\x06", // looks like a pong but is 14 bytes
    ];
    for g in garbage {
        junk.send_to(g, target).unwrap();
    }
    exchange(&fabric, &a, &b, &mut p, 20, 3000);
    // The zeros are shaped like a SEND FIRST; they come from an address no queue is connected
    // to, so they are dropped unread (ignored) before their ICRC is looked at. The rest are not
    // RoCEv2 packets at all.
    let deadline = Instant::now() + Duration::from_secs(10);
    while b.stats().rx_malformed < 4 || b.stats().rx_ignored < 1 {
        assert!(Instant::now() < deadline, "counts stuck at {:?}", b.stats());
        std::thread::yield_now();
    }
    assert_eq!(b.stats().rx_malformed, 4, "each garbage datagram counted once");
    assert_eq!(b.stats().rx_ignored, 1, "each garbage datagram counted once");
    assert_eq!(a.stats().rx_malformed, 0);
}

#[test]
fn a_valid_frame_from_a_stranger_is_ignored() {
    let fabric = udp_fabric(Engine::Inline, FaultPlan::NONE);
    let (a, b) = (fabric.add_nic(), fabric.add_nic());
    let mut p = pair(&a, &b, &QueueConfig::default());
    let target = b.udp_addr().unwrap();
    let stranger = UdpSocket::bind("127.0.0.1:0").unwrap();
    let me = match stranger.local_addr().unwrap() {
        std::net::SocketAddr::V4(v) => v,
        _ => unreachable!(),
    };
    // A well-formed SEND ONLY to b's queue, with a correct ICRC, from an address no queue of b
    // is connected to: a NIC drops it rather than placing it.
    let hdr = bypass_sim::packet::PacketHeader {
        dst_qpn: p.qb.qpn(),
        first: true,
        last: true,
        psn: 0,
        payload_len: 4,
        ..Default::default()
    };
    let ep = bypass_sim::roce::Endpoints {
        src_ip: me.ip().octets(),
        dst_ip: target.ip().octets(),
        src_port: me.port(),
        dst_port: target.port(),
    };
    let mut buf = [0u8; 64];
    let n = bypass_sim::roce::encode_udp(&hdr, b"evil", &ep, &mut buf).unwrap();
    let before = b.stats().rx_ignored;
    stranger.send_to(&buf[..n], target).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while b.stats().rx_ignored == before {
        assert!(Instant::now() < deadline, "the stranger's frame was never looked at");
        fabric.progress();
        std::thread::yield_now();
    }
    exchange(&fabric, &a, &b, &mut p, 3, 16);
}

#[test]
fn connect_to_a_nic_that_is_not_there_says_why() {
    let fabric = udp_fabric(Engine::Inline, FaultPlan::NONE);
    let a = fabric.add_nic();
    let cq = a.create_cq(8).unwrap();
    let mut q = a.create_queue(&QueueConfig::default(), &cq, &cq).unwrap();
    // A port nothing listens on (bound, then closed).
    let gone = UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let mut peer = q.info();
    peer.lid = gone.port();
    let err = q.connect(&peer).unwrap_err().to_string();
    assert!(err.contains("no simulated NIC answers") && err.contains(&gone.to_string()), "{err}");
    assert_eq!(q.state(), QueueState::Reset, "a failed connect leaves the queue as it was");
}

#[test]
fn wires_do_not_mix_and_say_so() {
    let udp = udp_fabric(Engine::Inline, FaultPlan::NONE);
    let local = Fabric::new(Engine::Inline);
    let (u, l) = (udp.add_nic(), local.add_nic());
    let (cu, cl) = (u.create_cq(8).unwrap(), l.create_cq(8).unwrap());
    let mut qu = u.create_queue(&QueueConfig::default(), &cu, &cu).unwrap();
    let mut ql = l.create_queue(&QueueConfig::default(), &cl, &cl).unwrap();
    let e = qu.connect(&ql.info()).unwrap_err().to_string();
    assert!(e.contains("same wire"), "{e}");
    let e = ql.connect(&qu.info()).unwrap_err().to_string();
    assert!(e.contains("UDP or L2 wire") && e.contains("sim+udp://"), "{e}");
}

#[test]
fn stepped_engine_refuses_the_udp_wire_and_unspecified_addresses_are_refused() {
    let wire = WireConfig::parse("udp://127.0.0.1:0").unwrap();
    let e = Fabric::try_with_config(FabricConfig { wire, ..FabricConfig::new(Engine::Stepped { seed: 1 }) })
        .unwrap_err();
    assert!(e.contains("in-process wire"), "{e}");
    let any = WireConfig::parse("udp://0.0.0.0:0").unwrap();
    // Refused when the fabric is made (it used to be made, then panic in `add_nic`).
    let e =
        Fabric::try_with_config(FabricConfig { wire: any, ..FabricConfig::new(Engine::Inline) }).unwrap_err();
    assert!(e.contains("0.0.0.0") && e.contains("peers reach"), "{e}");
    // An address no interface of this host has (TEST-NET-1, RFC 5737; nothing is sent to it).
    let foreign = WireConfig::parse("udp://192.0.2.1:0").unwrap();
    let e = Fabric::try_with_config(FabricConfig { wire: foreign, ..FabricConfig::new(Engine::Inline) })
        .unwrap_err();
    assert!(e.contains("no socket binds at 192.0.2.1"), "{e}");
    for bad in ["udp://localhost", "tcp://1.2.3.4:5", "udp://[::1]:0", "udp://1.2.3.4"] {
        assert!(WireConfig::parse(bad).is_err(), "{bad} parsed");
    }
}

#[test]
fn lossy_udp_links_still_deliver_everything_in_order() {
    for engine in [Engine::Inline, Engine::Threaded] {
        let faults = FaultPlan {
            drop_ppm: 100_000,
            duplicate_ppm: 50_000,
            reorder_ppm: 50_000,
            seed: 9,
            ..FaultPlan::NONE
        };
        let fabric = udp_fabric(engine, faults);
        let (a, b) = (fabric.add_nic(), fabric.add_nic());
        let mut cfg = QueueConfig::default();
        // 20 ms, not 2: the sockets are read by the polling thread, and on a loaded host a
        // poller that loses its CPU leaves them unread until the receive thread's next tick
        // (1 ms) and its own scheduling; seven 2 ms timeouts in a row then ran out now and then
        // (issue 31). What is checked — every byte, in order, through loss, duplication and
        // reordering — does not depend on the timeout.
        cfg.timeout = AckTimeout::at_least(Duration::from_millis(20));
        let mut p = pair(&a, &b, &cfg);
        exchange(&fabric, &a, &b, &mut p, 30, 9000);
        assert!(fabric.fault_stats().dropped > 0, "{engine:?}: the plan dropped nothing");
        assert!(a.stats().retransmits > 0, "{engine:?}");
    }
}

/// Issue 30, defect 10: a flood of well-formed frames from an address no queue is connected to
/// must cost the NIC no more than junk does, and must not take a live connection down.
#[test]
fn a_flood_from_a_stranger_does_not_stall_a_live_connection() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    let fabric = udp_fabric(Engine::Inline, FaultPlan::NONE);
    let (a, b) = (fabric.add_nic(), fabric.add_nic());
    let mut cfg = QueueConfig::default();
    // The default retry budget: a connection that loses its packets to the flood fails.
    cfg.timeout = AckTimeout::at_least(Duration::from_millis(10));
    let mut p = pair(&a, &b, &cfg);
    let target = b.udp_addr().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let mut flooders = Vec::new();
    for k in 0..2u32 {
        let (stop, sent) = (stop.clone(), sent.clone());
        let dst_qpn = p.qb.qpn();
        flooders.push(std::thread::spawn(move || {
            let s = UdpSocket::bind("127.0.0.1:0").unwrap();
            let me = match s.local_addr().unwrap() {
                std::net::SocketAddr::V4(v) => v,
                _ => unreachable!(),
            };
            let ep = bypass_sim::roce::Endpoints {
                src_ip: me.ip().octets(),
                dst_ip: target.ip().octets(),
                src_port: me.port(),
                dst_port: target.port(),
            };
            // Well-formed SEND ONLYs with correct ICRCs, 1 KiB each, at b's live queue.
            let payload = [0x5Au8; 1024];
            let mut frames = Vec::new();
            for psn in 0..64u32 {
                let hdr = bypass_sim::packet::PacketHeader {
                    dst_qpn,
                    first: true,
                    last: true,
                    psn: psn * 2 + k,
                    payload_len: payload.len() as u32,
                    ..Default::default()
                };
                let mut buf = vec![0u8; 1200];
                let n = bypass_sim::roce::encode_udp(&hdr, &payload, &ep, &mut buf).unwrap();
                buf.truncate(n);
                frames.push(buf);
            }
            let mut i = 0usize;
            while !stop.load(Ordering::Relaxed) {
                let _ = s.send_to(&frames[i % 64], target);
                i += 1;
                sent.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    // The connection's traffic starts behind a socket buffer full of the stranger's frames
    // (20,000 KiB frames, more than the NIC's 8 MiB receive buffer) and goes on beside the flood.
    let deadline = Instant::now() + Duration::from_secs(60);
    while sent.load(Ordering::Relaxed) < 20_000 {
        assert!(
            Instant::now() < deadline,
            "the flood did not start: {} frames",
            sent.load(Ordering::Relaxed)
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    exchange(&fabric, &a, &b, &mut p, 100, 2000);
    stop.store(true, Ordering::Relaxed);
    for t in flooders {
        t.join().unwrap();
    }
    assert!(b.stats().rx_ignored > 0, "the stranger's frames are counted as ignored: {:?}", b.stats());
    assert_eq!(a.stats().rx_ignored, 0);
}

/// A deterministic generator for the tests' timings (SplitMix64).
fn next(seed: &mut u64) -> u64 {
    *seed = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *seed;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Spins for `us` microseconds polling `cq`; the completions it found.
fn poll_for(cq: &mut <SimNic as Device>::Cq, wc: &mut [Completion], us: u64) -> u64 {
    let until = Instant::now() + Duration::from_micros(us);
    let mut got = 0;
    while Instant::now() < until {
        got += count_recv(cq, wc);
    }
    got
}

/// Waits until `fd` is readable or `ms` pass; true if readable.
fn wait_fd(fd: std::os::fd::RawFd, ms: i32) -> bool {
    let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one live pollfd.
    unsafe { libc::poll(&mut p, 1, ms) == 1 }
}

/// The receive handoff (docs/sim.md, "The UDP wire"): while a user polls, its polls read the
/// socket and the receive thread sleeps without watching it; a user that arms its CQ and sleeps
/// on the event fd must be woken by a packet whatever the moment it arrives — while the user
/// polls, as it arms, between its last poll and its sleep, or during the sleep. The sender waits
/// a seeded random time before each message and the receiver polls a seeded random time before
/// it sleeps, so arrivals fall on every side of the arm. The queues' ACK timeout is far longer
/// than the wait allowed, so a packet the NIC failed to take cannot be rescued by a
/// retransmission: a lost wake-up fails the test. (Checked: with the receive thread's take on
/// an arrival while it watches removed, the first sleep times out.)
#[test]
fn a_user_asleep_on_its_event_fd_is_woken_by_every_packet() {
    const N: u64 = 100;
    let fabric = udp_fabric(Engine::Inline, FaultPlan::NONE);
    let (a, b) = (fabric.add_nic(), fabric.add_nic());
    let mut cfg = QueueConfig::default();
    cfg.timeout = AckTimeout::at_least(Duration::from_secs(10));
    let Pair { mut ca, mut cb, mut qa, mut qb } = pair(&a, &b, &cfg);
    let dst = b.register(64 * N as usize, Access::LOCAL_WRITE).unwrap();
    for i in 0..N {
        qb.post_recv(&[RecvWr { wr_id: i, sges: &[dst.sge(i as usize * 64, 64).unwrap()] }]).unwrap();
    }
    let sender = std::thread::spawn(move || {
        let src = a.register(64, Access::empty()).unwrap();
        let mut wc = [Completion::default(); 4];
        let mut seed = 31;
        for i in 0..N {
            let pause = Instant::now() + Duration::from_micros(next(&mut seed) % 3000);
            while Instant::now() < pause {
                std::hint::spin_loop();
            }
            qa.post_send(&[SendWr::send(i, &[src.sge(0, 64).unwrap()])]).unwrap();
            let deadline = Instant::now() + Duration::from_secs(5);
            while ca.poll(&mut wc).unwrap() == 0 {
                assert!(Instant::now() < deadline, "send {i} never completed");
            }
            assert_eq!(wc[0].status, Status::Success, "send {i}");
        }
    });
    let mut wc = [Completion::default(); 4];
    let mut seed = 7;
    let (mut got, mut slept) = (0u64, 0u64);
    while got < N {
        // Shorter than the sender's pauses on average, so most rounds end asleep.
        got += poll_for(&mut cb, &mut wc, next(&mut seed) % 1500);
        if got == N {
            break;
        }
        cb.arm(ArmMode::Any).unwrap();
        let k = count_recv(&mut cb, &mut wc);
        if k > 0 {
            got += k;
            continue;
        }
        slept += 1;
        assert!(
            wait_fd(cb.event_fd(), 2000),
            "message {got} arrived while the receiver slept on its event fd and did not wake it"
        );
        cb.ack_events().unwrap();
        got += count_recv(&mut cb, &mut wc);
    }
    sender.join().unwrap();
    assert!(slept > 0, "the receiver never slept: the race was not exercised");
}

/// ACK coalescing: a plain ACK the receiver's device flushes while its user polls is held back
/// for the next packet the NIC sends (a reply rides with it in one `sendmmsg`), for at most
/// ~20 µs. When no packet follows and the user stops polling — without arming anything — the
/// held ACK must still leave: the sender's send completes. The ACK timeout is far longer than
/// the wait allowed, so a retransmission cannot rescue an ACK that was never sent. (Checked:
/// with held ACKs never released, the send does not complete.)
#[test]
fn an_ack_held_back_leaves_when_no_packet_follows() {
    let fabric = udp_fabric(Engine::Inline, FaultPlan::NONE);
    let (a, b) = (fabric.add_nic(), fabric.add_nic());
    let mut cfg = QueueConfig::default();
    cfg.timeout = AckTimeout::at_least(Duration::from_secs(10));
    let Pair { mut ca, mut cb, mut qa, mut qb } = pair(&a, &b, &cfg);
    let src = a.register(64, Access::empty()).unwrap();
    let dst = b.register(64 * 8, Access::LOCAL_WRITE).unwrap();
    let mut wc = [Completion::default(); 4];
    for i in 0..8u64 {
        qb.post_recv(&[RecvWr { wr_id: i, sges: &[dst.sge(i as usize * 64, 64).unwrap()] }]).unwrap();
        // The receiver polls (for a few ms: its receive thread must see polls to let ACKs wait).
        let mut got = poll_for(&mut cb, &mut wc, 3000);
        qa.post_send(&[SendWr::send(i, &[src.sge(0, 64).unwrap()])]).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while got == 0 {
            assert!(Instant::now() < deadline, "message {i} never arrived");
            got += count_recv(&mut cb, &mut wc);
        }
        // The receiver's user stops polling; only the sender polls now.
        let deadline = Instant::now() + Duration::from_secs(2);
        while ca.poll(&mut wc).unwrap() == 0 {
            assert!(Instant::now() < deadline, "send {i}: its ACK never left the receiver");
        }
        assert_eq!(wc[0].status, Status::Success, "send {i}");
    }
}

/// Issue 31: a queue connected to a queue of its own NIC (a client and its server in one
/// process on one NIC, as the C library's `TCP` type runs them) is looped back inside the NIC,
/// as a RoCE NIC does: its packets never reach the socket, so they cost no system call — and
/// the fabric's fault plan still applies to them, as to any link.
#[test]
fn queues_of_one_nic_loop_back_inside_it_without_the_socket() {
    for engine in [Engine::Inline, Engine::Threaded] {
        for faults in [FaultPlan::NONE, FaultPlan { drop_ppm: 100_000, seed: 5, ..FaultPlan::NONE }] {
            let fabric = udp_fabric(engine, faults);
            // `a` is NIC 1: its loop's source id (its fabric address, 1) is not a socket peer's.
            let (other, a) = (fabric.add_nic(), fabric.add_nic());
            let mut cfg = QueueConfig::default();
            cfg.timeout = AckTimeout::at_least(Duration::from_millis(20));
            // A link to another NIC of the fabric first, then the loop.
            let mut out = pair(&a, &other, &cfg);
            let mut p = pair(&a, &a, &cfg);
            let before = a.stats().tx_wire_sends;
            exchange(&fabric, &a, &a, &mut p, 40, 3000);
            let lossy = faults.drop_ppm > 0;
            assert_eq!(
                a.stats().tx_wire_sends,
                before,
                "{engine:?}, lossy {lossy}: packets to the NIC itself went through the socket"
            );
            if lossy {
                assert!(fabric.fault_stats().dropped > 0, "{engine:?}: the plan dropped nothing on the loop");
                assert!(a.stats().retransmits > 0, "{engine:?}");
            }
            // The link to the other NIC still goes through the socket, and both keep working.
            exchange(&fabric, &a, &other, &mut out, 5, 100);
            assert!(a.stats().tx_wire_sends > before, "{engine:?}: the other link sent nothing");
            exchange(&fabric, &a, &a, &mut p, 5, 100);
        }
    }
}

/// The source id a looped-back queue knows its peer by is the NIC's fabric address; a peer on
/// the socket must never get the same id, or its packets would pass for the NIC's own. Here NIC
/// 0's first peer on the socket would have had id 0: a queue of that peer which sends to a
/// looped-back queue of NIC 0 must be ignored, not taken for that queue's partner.
#[test]
fn a_peer_on_the_socket_cannot_pass_for_the_nic_itself() {
    let fabric = udp_fabric(Engine::Inline, FaultPlan::NONE);
    let (a, other) = (fabric.add_nic(), fabric.add_nic());
    let cfg = QueueConfig::default();
    let mut out = pair(&a, &other, &cfg); // `other` is a's first peer on the socket
    let mut p = pair(&a, &a, &cfg);
    exchange(&fabric, &a, &a, &mut p, 3, 64);
    // A queue of `other` connected one-sidedly to the looped-back queue `qb` sends to it.
    let mut cz = other.create_cq(16).unwrap();
    let mut z = other.create_queue(&cfg, &cz, &cz).unwrap();
    z.connect(&p.qb.info()).unwrap();
    let src = other.register(64, Access::empty()).unwrap();
    let before = a.stats().rx_ignored;
    z.post_send(&[SendWr::send(1, &[src.sge(0, 64).unwrap()])]).unwrap();
    let mut wc = [Completion::default(); 8];
    let deadline = Instant::now() + Duration::from_secs(10);
    while a.stats().rx_ignored == before {
        assert!(Instant::now() < deadline, "the other NIC's packet was taken for the NIC's own");
        assert_eq!(p.cb.poll(&mut wc).unwrap(), 0, "the other NIC's SEND landed in the looped queue");
        fabric.progress();
        let _ = cz.poll(&mut wc);
    }
    drop(z);
    // The loop and the link to the other NIC still work.
    exchange(&fabric, &a, &other, &mut out, 3, 64);
    exchange(&fabric, &a, &a, &mut p, 3, 64);
}
