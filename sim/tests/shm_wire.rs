//! The shared-memory wire as a user meets it: peers that are gone or were never there, stale
//! segments, mixed wires, a full ring, garbage in a ring, and a user asleep on an event fd.
//!
//! Dead peers are real processes: the test binary re-executes itself as a child that creates a
//! NIC on the wire, reports it, and is killed with SIGKILL, so its segment is left behind exactly
//! as a crash leaves it.

use bypass_hal::*;
use bypass_sim::{Engine, Fabric, FabricConfig, SimNic, WireConfig};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const ROLE: &str = "BYPASS_SHM_TEST_ROLE";

/// Every shared-memory fabric made in this process removes the segments of dead processes, so the
/// tests that leave such a segment on purpose must not run beside another test's fabric creation:
/// every test here takes this lock.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn shm_fabric(engine: Engine) -> Fabric {
    Fabric::with_config(FabricConfig { wire: WireConfig::Shm, ..FabricConfig::new(engine) })
}

struct Pair {
    ca: <SimNic as Device>::Cq,
    cb: <SimNic as Device>::Cq,
    qa: <SimNic as Device>::Queue,
    qb: <SimNic as Device>::Queue,
}

fn pair(a: &SimNic, b: &SimNic) -> Pair {
    pair_with(a, b, &QueueConfig::default())
}

fn pair_with(a: &SimNic, b: &SimNic, cfg: &QueueConfig) -> Pair {
    let (ca, cb) = (a.create_cq(1024).unwrap(), b.create_cq(1024).unwrap());
    let mut qa = a.create_queue(cfg, &ca, &ca).unwrap();
    let mut qb = b.create_queue(cfg, &cb, &cb).unwrap();
    let (ia, ib) = (qa.info(), qb.info());
    qa.connect(&ib).unwrap();
    qb.connect(&ia).unwrap();
    Pair { ca, cb, qa, qb }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

/// The child: a NIC on the shared-memory wire with one queue; reports "SHM <gid> <qpn> <psn>
/// <segment path>" and waits to be killed.
#[test]
fn child_role() {
    if std::env::var(ROLE).is_err() {
        return;
    }
    let fabric = shm_fabric(Engine::Inline);
    let nic = fabric.add_nic();
    let cq = nic.create_cq(16).unwrap();
    let q = nic.create_queue(&QueueConfig::default(), &cq, &cq).unwrap();
    let info = q.info();
    println!("SHM {} {} {} {}", hex(&info.gid), info.qpn, info.psn, nic.shm_path().unwrap().display());
    std::thread::sleep(Duration::from_secs(600));
}

/// Starts a child NIC, reads what it reports, and kills it with SIGKILL. Returns its queue info
/// and segment path.
fn dead_child() -> (QueueInfo, std::path::PathBuf) {
    let (mut child, info, path) = live_child();
    child.kill().unwrap();
    child.wait().unwrap();
    (info, path)
}

/// Starts a child NIC and reads what it reports: the child (kill it), its queue info and its
/// segment path.
fn live_child() -> (std::process::Child, QueueInfo, std::path::PathBuf) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_role", "--nocapture", "--test-threads=1"])
        .env(ROLE, "nic")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = loop {
        let l = lines.next().expect("the child reports its NIC").unwrap();
        if let Some(i) = l.find("SHM ") {
            break l[i + 4..].to_string();
        }
    };
    let f: Vec<&str> = line.split(' ').collect();
    let gid: [u8; 16] = unhex(f[0]).try_into().unwrap();
    let info = QueueInfo::new(gid, f[1].parse().unwrap(), f[2].parse().unwrap());
    (child, info, f[3].into())
}

/// A peer process killed after the connect: nobody drains the ring into its segment. The ring
/// fills, the sender is refused (Busy), its retransmission timer runs out, and the queue errors —
/// it does not hang.
#[test]
fn the_ring_into_a_killed_peer_fills_and_the_queue_errors() {
    let _serial = serial();
    for engine in [Engine::Inline, Engine::Threaded] {
        let fabric = Fabric::with_config(FabricConfig {
            wire: WireConfig::Shm,
            inbox_depth: 4,
            ..FabricConfig::new(engine)
        });
        let nic = fabric.add_nic();
        let (mut child, info, _) = live_child();
        // The child's rings hold 256 frames: 64 messages of 16 frames overflow it.
        let mut cfg = QueueConfig::default().with_depths(128, 16);
        cfg.timeout = AckTimeout::at_least(Duration::from_millis(1));
        cfg.retry_count = 2;
        let mut cq = nic.create_cq(256).unwrap();
        let mut q = nic.create_queue(&cfg, &cq, &cq).unwrap();
        q.connect(&info).expect("the child is alive");
        child.kill().unwrap();
        child.wait().unwrap();
        let src = nic.register(65536, Access::empty()).unwrap();
        let sges: Vec<[Sge; 1]> = (0..64).map(|_| [src.sge(0, 65536).unwrap()]).collect();
        let wrs: Vec<_> = (0..64).map(|i| SendWr::send(i, &sges[i as usize])).collect();
        q.post_send(&wrs).unwrap();
        let mut wc = [Completion::default(); 32];
        let deadline = Instant::now() + Duration::from_secs(30);
        let first = loop {
            assert!(Instant::now() < deadline, "{engine:?}: the queue hangs: {:?}", nic.stats());
            if cq.poll(&mut wc).unwrap() > 0 {
                break wc[0];
            }
            fabric.progress();
        };
        assert_eq!(first.status, Status::RetryExceeded, "{engine:?}");
        assert_eq!(q.state(), QueueState::Error, "{engine:?}");
        assert!(nic.stats().tx_wire_busy > 0, "{engine:?}: the ring never filled: {:?}", nic.stats());
    }
}

#[test]
fn a_dead_peer_is_refused_with_the_reason_and_its_segment_removed() {
    let _serial = serial();
    // The segment of a dead process, found by connect itself (it died after this fabric was made,
    // so the fabric's own clean-up did not see it).
    let fabric = shm_fabric(Engine::Inline);
    let nic = fabric.add_nic();
    let (info, path) = dead_child();
    assert!(path.exists());
    let cq = nic.create_cq(16).unwrap();
    let mut q = nic.create_queue(&QueueConfig::default(), &cq, &cq).unwrap();
    let e = q.connect(&info).expect_err("a dead peer").to_string();
    assert!(e.contains("the peer process is gone"), "{e}");
    assert!(e.contains("stale segment was removed"), "{e}");
    assert!(!path.exists());
    assert_eq!(q.state(), QueueState::Reset, "a refused connect leaves the queue as it was");
}

#[test]
fn fabric_creation_removes_segments_of_dead_processes() {
    let _serial = serial();
    let (_, path) = dead_child();
    assert!(path.exists());
    let _fabric = shm_fabric(Engine::Inline);
    assert!(!path.exists(), "a new shared-memory fabric removes {}", path.display());
}

#[test]
fn segments_are_removed_when_the_fabric_is_dropped() {
    let _serial = serial();
    let fabric = shm_fabric(Engine::Threaded);
    let (a, b) = (fabric.add_nic(), fabric.add_nic());
    let paths = [a.shm_path().unwrap(), b.shm_path().unwrap()];
    assert!(paths.iter().all(|p| p.exists()));
    drop((a, b, fabric));
    for p in &paths {
        assert!(!p.exists(), "{} left behind", p.display());
    }
}

#[test]
fn a_peer_that_is_not_there_is_refused_with_the_reason() {
    let _serial = serial();
    let fabric = shm_fabric(Engine::Inline);
    let nic = fabric.add_nic();
    let cq = nic.create_cq(16).unwrap();
    let mut q = nic.create_queue(&QueueConfig::default(), &cq, &cq).unwrap();
    let mut info = q.info();
    info.gid[8..12].copy_from_slice(&0x7fff_fff0u32.to_le_bytes()); // no such fabric here
    let e = q.connect(&info).expect_err("nobody is there").to_string();
    assert!(e.contains("is not running") && e.contains("use the UDP wire between hosts"), "{e}");
}

#[test]
fn mixed_wires_are_refused_with_reasons() {
    let _serial = serial();
    let shm = shm_fabric(Engine::Inline);
    let inproc = Fabric::new(Engine::Inline);
    let udp = Fabric::with_config(FabricConfig {
        wire: WireConfig::parse("udp://127.0.0.1:0").unwrap(),
        ..FabricConfig::new(Engine::Inline)
    });
    let nics = [shm.add_nic(), inproc.add_nic(), udp.add_nic()];
    let cqs: Vec<_> = nics.iter().map(|n| n.create_cq(16).unwrap()).collect();
    let mut qs: Vec<_> =
        nics.iter().zip(&cqs).map(|(n, c)| n.create_queue(&QueueConfig::default(), c, c).unwrap()).collect();
    let infos: Vec<_> = qs.iter().map(|q| q.info()).collect();
    let e = qs[1].connect(&infos[0]).unwrap_err().to_string();
    assert!(e.contains("shared-memory wire") && e.contains("sim+shm"), "in-process → shm: {e}");
    let e = qs[2].connect(&infos[0]).unwrap_err().to_string();
    assert!(e.contains("shared-memory wire") && e.contains("UDP wire"), "udp → shm: {e}");
    let e = qs[0].connect(&infos[1]).unwrap_err().to_string();
    assert!(e.contains("not on the shared-memory wire"), "shm → in-process: {e}");
    let e = qs[0].connect(&infos[2]).unwrap_err().to_string();
    assert!(e.contains("UDP or L2 wire") && e.contains("shared-memory"), "shm → udp: {e}");
}

#[test]
fn the_stepped_engine_refuses_the_shared_memory_wire() {
    let _serial = serial();
    let e = Fabric::try_with_config(FabricConfig {
        wire: WireConfig::parse("shm").unwrap(),
        ..FabricConfig::new(Engine::Stepped { seed: 1 })
    })
    .unwrap_err();
    assert!(e.contains("Stepped engine runs only on the in-process wire"), "{e}");
}

/// A consumer whose user does not poll: rings of 2 slots fill at once, the producer is refused
/// (Busy) and resumes when the consumer's receive thread makes room; every message arrives, in
/// order, with its bytes.
#[test]
fn a_full_ring_pushes_back_and_everything_arrives_in_order() {
    let _serial = serial();
    for engine in [Engine::Inline, Engine::Threaded] {
        let fabric = Fabric::with_config(FabricConfig {
            wire: WireConfig::Shm,
            inbox_depth: 2,
            ..FabricConfig::new(engine)
        });
        let (a, b) = (fabric.add_nic(), fabric.add_nic());
        let mut p = pair_with(&a, &b, &QueueConfig::default().with_depths(256, 256));
        const N: usize = 200;
        const LEN: usize = 3000;
        let mut src = a.register(LEN * N, Access::empty()).unwrap();
        let fill: Vec<u8> = (0..LEN * N).map(|k| (k * 7 + k / LEN) as u8).collect();
        src.write(0, &fill).unwrap();
        let dst = b.register(LEN * N, Access::LOCAL_WRITE).unwrap();
        let recvs: Vec<_> = (0..N).map(|i| dst.sge(i * LEN, LEN).unwrap()).collect();
        let sends: Vec<[Sge; 1]> = (0..N).map(|i| [src.sge(i * LEN, LEN).unwrap()]).collect();
        for (i, s) in recvs.iter().enumerate() {
            p.qb.post_recv(&[RecvWr { wr_id: i as u64, sges: std::slice::from_ref(s) }]).unwrap();
        }
        let mut wc = [Completion::default(); 64];
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut sent = 0;
        let mut done = 0;
        // Only the sender's CQ is polled until every send completed.
        while done < N {
            assert!(Instant::now() < deadline, "{engine:?}: {done} of {N} sends completed");
            if sent < N {
                let wrs: Vec<_> =
                    (sent..N.min(sent + 32)).map(|i| SendWr::send(i as u64, &sends[i])).collect();
                if p.qa.post_send(&wrs).is_ok() {
                    sent += wrs.len();
                }
            }
            let k = p.ca.poll(&mut wc).unwrap();
            for c in &wc[..k] {
                assert_eq!((c.wr_id, c.status), (done as u64, Status::Success), "{engine:?}");
                done += 1;
            }
        }
        assert!(a.stats().tx_wire_busy > 0, "{engine:?}: the 2-slot ring never filled: {:?}", a.stats());
        let mut got = 0;
        while got < N {
            assert!(Instant::now() < deadline, "{engine:?}: {got} of {N} received");
            let k = p.cb.poll(&mut wc).unwrap();
            for c in &wc[..k] {
                assert_eq!((c.wr_id, c.status, c.byte_len), (got as u64, Status::Success, LEN as u32));
                got += 1;
            }
        }
        let mut all = vec![0u8; LEN * N];
        dst.read(0, &mut all).unwrap();
        assert!(all == fill, "{engine:?}: the bytes arrived as sent");
    }
}

/// Writes frames into a NIC's segment the way another process would, straight from the documented
/// layout (docs/sim.md, "Shared-memory wire"): claims the last ring, publishes `frames` (each
/// given as the length word to write and the bytes), marks the ring pending.
fn inject(path: &std::path::Path, frames: &[(u32, Vec<u8>)]) {
    let file = std::fs::OpenOptions::new().read(true).write(true).open(path).unwrap();
    let map = memmap2::MmapRaw::map_raw(&file).unwrap();
    let base = map.as_mut_ptr();
    let rd = |o: usize| {
        // SAFETY: the header's fixed fields are inside the mapping and never change.
        unsafe { std::ptr::read_unaligned(base.add(o) as *const u32) }
    };
    assert_eq!(&unsafe_bytes(base, 0, 8), b"BYPSSHM\x01");
    let (rings, depth, slot, stride) = (rd(16) as usize, rd(20) as usize, rd(24) as usize, rd(28) as usize);
    assert_eq!(stride, 192 + depth * slot);
    let ring = 128 + (rings - 1) * stride;
    // SAFETY: the control block's words are in the mapping and 8-/4-aligned; the atomics have the
    // layout of their integers.
    let (owner, pi, pending) = unsafe {
        (
            &*(base.add(ring) as *const AtomicU64),
            &*(base.add(ring + 64) as *const AtomicU32),
            &*(base.add(64 + 16) as *const AtomicU64),
        )
    };
    owner
        .compare_exchange(0, 0xdead_0001, Ordering::AcqRel, Ordering::Relaxed)
        .expect("the last ring is free");
    // Identity: our own pid (alive), a fabric and NIC no queue is connected to.
    for (o, v) in [(8usize, std::process::id()), (12, 999), (16, 999)] {
        // SAFETY: as above: identity words of the ring's control block.
        unsafe { (*(base.add(ring + o) as *const AtomicU32)).store(v, Ordering::Relaxed) };
    }
    for (i, (len, bytes)) in frames.iter().enumerate() {
        assert!(i < depth);
        let s = ring + 192 + i * slot;
        // SAFETY: slot i of the ring lies in the mapping; bytes.len() + 4 ≤ slot (checked).
        unsafe {
            assert!(bytes.len() + 4 <= slot);
            std::ptr::copy_nonoverlapping(len.to_le_bytes().as_ptr(), base.add(s), 4);
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), base.add(s + 4), bytes.len());
        }
    }
    pi.store(frames.len() as u32, Ordering::Release);
    pending.fetch_or(1 << (rings - 1), Ordering::Release);
}

fn unsafe_bytes(base: *mut u8, o: usize, n: usize) -> Vec<u8> {
    // SAFETY: used only for the header's magic, inside the mapping.
    unsafe { std::slice::from_raw_parts(base.add(o), n).to_vec() }
}

#[test]
fn garbage_in_a_ring_is_counted_and_dropped_while_traffic_flows() {
    let _serial = serial();
    let fabric = shm_fabric(Engine::Inline);
    let (a, b) = (fabric.add_nic(), fabric.add_nic());
    let mut p = pair(&a, &b);
    let garbage = vec![
        (0, vec![]),              // an empty frame
        (1, vec![0x04]),          // a SEND ONLY opcode and nothing else
        (40, vec![0u8; 40]),      // zeros: a SEND FIRST whose ICRC is wrong
        (64, vec![0xFF; 64]),     // no such opcode
        (u32::MAX, vec![0u8; 8]), // a length word larger than any slot
        (1 << 20, vec![0u8; 8]),  // larger than the slot
    ];
    inject(&b.shm_path().unwrap(), &garbage);
    let mut src = a.register(64, Access::empty()).unwrap();
    let dst = b.register(64 * 20, Access::LOCAL_WRITE).unwrap();
    let mut wc = [Completion::default(); 16];
    let deadline = Instant::now() + Duration::from_secs(30);
    for i in 0..20usize {
        src.write(0, &[i as u8; 64]).unwrap();
        p.qb.post_recv(&[RecvWr { wr_id: i as u64, sges: &[dst.sge(i * 64, 64).unwrap()] }]).unwrap();
        p.qa.post_send(&[SendWr::send(i as u64, &[src.sge(0, 64).unwrap()])]).unwrap();
        let mut got = (false, false);
        while got != (true, true) {
            assert!(Instant::now() < deadline, "message {i} stuck: {got:?}");
            if p.ca.poll(&mut wc).unwrap() > 0 {
                assert_eq!(wc[0].status, Status::Success);
                got.0 = true;
            }
            if p.cb.poll(&mut wc).unwrap() > 0 {
                assert_eq!((wc[0].wr_id, wc[0].status), (i as u64, Status::Success));
                got.1 = true;
            }
        }
    }
    let mut all = vec![0u8; 64 * 20];
    dst.read(0, &mut all).unwrap();
    assert!(all.chunks(64).enumerate().all(|(i, c)| c.iter().all(|&x| x == i as u8)));
    while b.stats().rx_malformed < garbage.len() as u64 {
        assert!(Instant::now() < deadline, "malformed count stuck at {}", b.stats().rx_malformed);
        fabric.progress();
    }
    assert_eq!(b.stats().rx_malformed, garbage.len() as u64, "each garbage frame counted once");
    assert_eq!(a.stats().rx_malformed, 0);
}

/// A user asleep in poll(2) on an armed CQ's event fd is woken by a frame from the other NIC:
/// nobody polls the receiving NIC, so its receive thread must have been woken through the futex.
#[test]
fn a_user_asleep_on_an_event_fd_is_woken_by_a_frame() {
    let _serial = serial();
    for engine in [Engine::Inline, Engine::Threaded] {
        let fabric = shm_fabric(engine);
        let (a, b) = (fabric.add_nic(), fabric.add_nic());
        let Pair { mut ca, mut cb, mut qa, mut qb } = pair(&a, &b);
        let mr = b.register(64, Access::LOCAL_WRITE).unwrap();
        const ROUNDS: u64 = 20;
        let (armed_tx, armed_rx) = std::sync::mpsc::channel();
        let sleeper = std::thread::spawn(move || {
            let mut wc = [Completion::default(); 4];
            for i in 0..ROUNDS {
                qb.post_recv(&[RecvWr { wr_id: i, sges: &[mr.sge(0, 64).unwrap()] }]).unwrap();
                cb.arm(ArmMode::Any).unwrap();
                armed_tx.send(()).unwrap();
                let mut pfd = libc::pollfd { fd: cb.event_fd(), events: libc::POLLIN, revents: 0 };
                // SAFETY: one live pollfd; the timeout bounds the wait.
                let r = unsafe { libc::poll(&mut pfd, 1, 20_000) };
                assert_eq!(r, 1, "round {i}: the sleeper was never woken");
                cb.ack_events().unwrap();
                let n = cb.poll(&mut wc).unwrap();
                assert_eq!((n, wc[0].wr_id, wc[0].status), (1, i, Status::Success), "round {i}");
            }
            qb
        });
        let mut wc = [Completion::default(); 4];
        for i in 0..ROUNDS {
            armed_rx.recv().unwrap();
            // Let the receive thread see the armed CQ and go to sleep with its flag raised.
            std::thread::sleep(Duration::from_millis(5));
            qa.post_send(&[SendWr::send(i, &[])]).unwrap();
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                assert!(Instant::now() < deadline, "send {i} never completed");
                if ca.poll(&mut wc).unwrap() > 0 {
                    assert_eq!(wc[0].status, Status::Success);
                    break;
                }
            }
        }
        let _qb = sleeper.join().unwrap();
        assert!(a.stats().tx_wakeups > 0, "{engine:?}: no FUTEX_WAKE was issued: {:?}", a.stats());
    }
}

/// The fault plan wraps shared-memory links as it wraps every link: drops, duplicates and
/// reordering on the wire, recovered by the transport, every byte delivered in order.
#[test]
fn the_fault_plan_wraps_shared_memory_links() {
    let _serial = serial();
    let faults = bypass_sim::FaultPlan {
        drop_ppm: 50_000,
        duplicate_ppm: 50_000,
        reorder_ppm: 50_000,
        seed: 11,
        ..bypass_sim::FaultPlan::NONE
    };
    let fabric = Fabric::with_config(FabricConfig {
        wire: WireConfig::Shm,
        faults,
        ..FabricConfig::new(Engine::Inline)
    });
    let (a, b) = (fabric.add_nic(), fabric.add_nic());
    let mut cfg = QueueConfig::default().with_depths(64, 64);
    cfg.timeout = AckTimeout::at_least(Duration::from_millis(2));
    let mut p = pair_with(&a, &b, &cfg);
    const N: usize = 50;
    const LEN: usize = 10_000;
    let mut src = a.register(LEN * N, Access::empty()).unwrap();
    let fill: Vec<u8> = (0..LEN * N).map(|k| (k * 13 + k / LEN) as u8).collect();
    src.write(0, &fill).unwrap();
    let dst = b.register(LEN * N, Access::LOCAL_WRITE).unwrap();
    for i in 0..N {
        p.qb.post_recv(&[RecvWr { wr_id: i as u64, sges: &[dst.sge(i * LEN, LEN).unwrap()] }]).unwrap();
    }
    let sges: Vec<[Sge; 1]> = (0..N).map(|i| [src.sge(i * LEN, LEN).unwrap()]).collect();
    let wrs: Vec<_> = (0..N).map(|i| SendWr::send(i as u64, &sges[i])).collect();
    p.qa.post_send(&wrs).unwrap();
    let mut wc = [Completion::default(); 64];
    let deadline = Instant::now() + Duration::from_secs(60);
    let (mut sent, mut got) = (0, 0);
    while sent < N || got < N {
        assert!(Instant::now() < deadline, "{sent} sent, {got} received: {:?}", a.stats());
        let k = p.ca.poll(&mut wc).unwrap();
        for c in &wc[..k] {
            assert_eq!((c.wr_id, c.status), (sent as u64, Status::Success));
            sent += 1;
        }
        let k = p.cb.poll(&mut wc).unwrap();
        for c in &wc[..k] {
            assert_eq!((c.wr_id, c.status), (got as u64, Status::Success));
            got += 1;
        }
        fabric.progress();
    }
    let mut all = vec![0u8; LEN * N];
    dst.read(0, &mut all).unwrap();
    assert!(all == fill, "the bytes arrived as sent");
    let f = fabric.fault_stats();
    assert!(f.dropped > 0 && f.duplicated > 0, "the fault plan acted on the links: {f:?}");
    assert!(a.stats().retransmits > 0, "{:?}", a.stats());
}

/// Issue 30, defect 9: a peer's segment truncated while this process has it mapped killed this
/// process with SIGBUS at its next send. Now the queue errors by its retry limit, the process
/// lives on, and a new connect to that NIC is refused saying what is wrong with the file.
#[test]
fn a_truncated_peer_segment_fails_the_queue_not_the_process() {
    let _serial = serial();
    let fabric = shm_fabric(Engine::Inline);
    let nic = fabric.add_nic();
    let (mut child, info, path) = live_child();
    let mut cfg = QueueConfig::default();
    cfg.timeout = AckTimeout::at_least(Duration::from_millis(1));
    cfg.retry_count = 2;
    let mut cq = nic.create_cq(64).unwrap();
    let mut q = nic.create_queue(&cfg, &cq, &cq).unwrap();
    q.connect(&info).expect("the child is alive");
    std::fs::OpenOptions::new().write(true).open(&path).and_then(|f| f.set_len(0)).expect("truncate");

    let src = nic.register(4096, Access::empty()).unwrap();
    let sge = [src.sge(0, 4096).unwrap()];
    q.post_send(&[SendWr::send(1, &sge)]).unwrap();
    let mut wc = [Completion::default(); 4];
    let deadline = Instant::now() + Duration::from_secs(30);
    let first = loop {
        assert!(Instant::now() < deadline, "the queue hangs: {:?}", nic.stats());
        if cq.poll(&mut wc).unwrap() > 0 {
            break wc[0];
        }
        fabric.progress();
    };
    assert_eq!(first.status, Status::RetryExceeded);
    assert_eq!(q.state(), QueueState::Error);

    let mut again = nic.create_queue(&cfg, &cq, &cq).unwrap();
    let e = again.connect(&info).expect_err("a truncated segment").to_string();
    assert!(e.contains(&path.display().to_string()) && e.contains("short header"), "{e}");
    child.kill().unwrap();
    child.wait().unwrap();
    let _ = std::fs::remove_file(&path);
}

/// Issue 31: queues of one NIC connected to each other are looped back inside the NIC (its
/// inbox), not through a ring of its own segment; messages still flow both ways.
#[test]
fn queues_of_one_nic_reach_each_other_inside_it() {
    let _g = serial();
    for engine in [Engine::Inline, Engine::Threaded] {
        let fabric = shm_fabric(engine);
        let a = fabric.add_nic();
        let mut p = pair(&a, &a);
        let mut mr = a.register(128, Access::LOCAL_WRITE).unwrap();
        for (i, (tx, rx)) in [(0usize, 64usize), (64, 0)].into_iter().enumerate() {
            let (sq, rq) = if i == 0 { (&mut p.qa, &mut p.qb) } else { (&mut p.qb, &mut p.qa) };
            mr.write(tx, &[i as u8 + 1; 64]).unwrap();
            rq.post_recv(&[RecvWr { wr_id: 1, sges: &[mr.sge(rx, 64).unwrap()] }]).unwrap();
            sq.post_send(&[SendWr::send(2, &[mr.sge(tx, 64).unwrap()])]).unwrap();
            let mut wc = [Completion::default(); 4];
            let (mut got, deadline) = (0, Instant::now() + Duration::from_secs(20));
            while got < 2 {
                assert!(Instant::now() < deadline, "{engine:?}: loop stalled, {got} of 2 completions");
                got += p.ca.poll(&mut wc).unwrap();
                got += p.cb.poll(&mut wc).unwrap();
                fabric.progress();
            }
            let mut buf = [0u8; 64];
            mr.read(rx, &mut buf).unwrap();
            assert_eq!(buf, [i as u8 + 1; 64], "{engine:?}: direction {i}");
        }
        assert_eq!(a.stats().tx_wakeups, 0, "{engine:?}");
    }
}
