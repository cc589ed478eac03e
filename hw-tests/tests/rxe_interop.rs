//! A simulated NIC and Linux's Soft-RoCE (rxe) exchange RC traffic on a real wire: connected
//! queue pairs, traffic both ways, the error cases, loss injected with netem, and RPC calls with a
//! bypass server on either side (issue 13's acceptance test, extended by issue 29; docs/sim.md,
//! "Interoperating with a real RoCEv2 NIC", and docs/vfio.md). One rig, three ways to put the
//! simulated NIC on the wire:
//!
//! | test | the sim NIC | rxe |
//! |---|---|---|
//! | `sim_and_rxe_…` | the UDP wire, socket 10.77.0.2:4791 in netns `sim` | `rxe1` on `veth0` 10.77.0.1 |
//! | `packet_…` | the L2 wire on an `AF_PACKET` socket on `veth1` (netns `sim`, no kernel address): `sim+packet://veth1,ip=10.77.0.2` | `rxe1` on `veth0` 10.77.0.1 |
//! | `vfio_…` | the L2 wire on the userspace virtio-net driver, NIC A through VFIO: `vfio:0000:00:10.0,ip=10.29.0.1` | `rxe1` on NIC B 10.29.0.2 (kernel virtio_net) |
//!
//! It needs root, `ip`, `rdma` and `tc` (iproute2), the `veth`, `rdma_rxe` and `sch_netem`
//! modules, and builds the network itself, so it runs only where `BYPASS_HW` names a Soft-RoCE
//! device (`verbs:rxe…`) and the process is root — in the project's QEMU guest; the VFIO test
//! also needs the guest's VFIO topology (`--vfio`, which sets `BYPASS_VFIO_NIC`) and the feature
//! `vfio`:
//!
//! ```text
//! cargo test -p bypass-hw-tests --features verbs,vfio --release --no-run
//! BYPASS_HW=verbs:rxe0 hw-tests/vm/run --timeout 500 -- target/release/deps/rxe_interop-… --test-threads=1
//! BYPASS_HW=verbs:rxe0 hw-tests/vm/run --vfio --timeout 300 -- target/release/deps/rxe_interop-… vfio
//! ```
//!
//! Elsewhere each test skips with a message. The veth network: `veth0` 10.77.0.1/24 (root
//! namespace, carrying `rxe1`) ↔ `veth1` (namespace `sim`). The kernel's rxe owns UDP port 4791
//! on every address of the root namespace, and a standard RoCEv2 peer sends only to 4791, so the
//! UDP wire's socket must be bound at 10.77.0.2:4791 inside `sim`; the AF_PACKET port is opened
//! there too (and veth1 then has no kernel address, so the kernel neither answers ARP for the
//! sim's address nor sends ICMP for its UDP frames). A socket belongs to the namespace of the
//! thread that creates it and keeps it for life, so the test moves its own thread into `sim`
//! (setns) just for the NIC's creation and back at once; everything else — the sim's device and
//! receive threads, which only use the socket, and the verbs side — runs in one process, which
//! lets the two sides exchange their `QueueInfo`s by value and check each other's memory
//! directly. The RPC calls go the way two processes' would: the channel finds the server through
//! its TCP session (on 127.0.0.1) and the queue pairs connect over the wire.
//!
//! `BYPASS_PCAP=<file under target/>` captures the sim NIC's frames on the L2 wire as they went
//! on it (both directions, ARP included) and the test decodes every RoCEv2 frame of it (ICRC
//! checked). `BYPASS_RXE_PCAP=<file>` captures the link with dumpcap (veth1, or NIC B in the
//! VFIO topology: both directions as the kernel saw them), decoded the same way; CI has tshark
//! read the VFIO topology's.
#![cfg(feature = "verbs")]

use bypass::{CallMode, CallOptions, Channel, ChannelConfig, FunctionId, Functions, Server, ServerConfig};
use bypass_hal::verbs::VerbsDevice;
use bypass_hal::*;
use bypass_hw_tests::rxe_link::{self, should_run};
use bypass_hw_tests::shell::{sh, sh_quiet};
use bypass_hw_tests::vfio_topology::VfioTopology;
use bypass_sim::{Engine, Fabric, FabricConfig, SimNic, WireConfig};
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const RXE: &str = "rxe1";
const RXE_IP: &str = "10.77.0.1";
const SIM_IP: &str = "10.77.0.2";
const NETNS: &str = "sim";
/// veth's and virtio-net's MTU is 1500: rxe's active MTU is 1024 (the largest IB MTU ≤ 1500 −
/// 80), and both ends of a connection must segment alike.
const MTU: u32 = 1024;
/// Every wait in the test: the guest is emulated (TCG) and slow, and a lossy link retransmits.
const WAIT: Duration = Duration::from_secs(60);

/// What the simulated NIC stands on.
#[derive(Debug, Clone, PartialEq, Eq)]
enum SimOn {
    /// The UDP wire: a socket at 10.77.0.2:4791 in netns `sim`.
    Udp,
    /// The L2 wire on an AF_PACKET socket on veth1 (netns `sim`).
    Packet,
    /// The L2 wire on the VFIO NIC (NIC A, `vfio:` backend); rxe on NIC B, the kernel's.
    Vfio(VfioTopology),
}

impl SimOn {
    /// The kernel netdev rxe1 sits on (B's side: where netem drops).
    fn rxe_netdev(&self) -> &str {
        match self {
            SimOn::Udp | SimOn::Packet => "veth0",
            SimOn::Vfio(t) => &t.netdev,
        }
    }

    fn rxe_ip(&self) -> Ipv4Addr {
        match self {
            SimOn::Udp | SimOn::Packet => RXE_IP.parse().unwrap(),
            SimOn::Vfio(t) => t.peer_ip,
        }
    }

    fn veth(&self) -> bool {
        !matches!(self, SimOn::Vfio(_))
    }
}

/// The network, rxe1 and the simulated NIC; torn down (qdiscs, rxe1, veth, namespace) on drop,
/// after both devices are closed (`rdma link delete` waits for rxe1's last user).
struct Net {
    on: SimOn,
    _fabric: std::mem::ManuallyDrop<Fabric>,
    sim: std::mem::ManuallyDrop<SimNic>,
    rxe: std::mem::ManuallyDrop<VerbsDevice>,
}

impl Net {
    fn up(on: SimOn) -> Net {
        teardown(&on);
        if on.veth() {
            sh(&["modprobe", "veth"]);
            sh(&["ip", "netns", "add", NETNS]);
            sh(&["ip", "link", "add", "veth0", "type", "veth", "peer", "name", "veth1"]);
            sh(&["ip", "link", "set", "veth1", "netns", NETNS]);
            sh(&["ip", "addr", "add", &format!("{RXE_IP}/24"), "dev", "veth0"]);
            sh(&["ip", "link", "set", "veth0", "up"]);
            if on == SimOn::Udp {
                sh(&["ip", "-n", NETNS, "addr", "add", &format!("{SIM_IP}/24"), "dev", "veth1"]);
            }
            sh(&["ip", "-n", NETNS, "link", "set", "veth1", "up"]);
            sh(&["ip", "-n", NETNS, "link", "set", "lo", "up"]);
        }
        let rxe_ip = on.rxe_ip();
        rxe_link::add(RXE, on.rxe_netdev(), rxe_ip, WAIT);
        let rxe = VerbsDevice::open_spec(&format!("{RXE},mtu={MTU}"))
            .unwrap_or_else(|e| panic!("cannot open {RXE}: {e}"));
        assert_eq!(rxe.gid().1, rxe_ip.to_ipv6_mapped().octets(), "rxe1 uses the GID of {rxe_ip} (RoCE v2)");

        let (fabric, sim) = match &on {
            SimOn::Udp => {
                // The simulated NIC: its socket is created inside namespace `sim`, and the
                // fabric there too (it checks that the address is one of this host's).
                let wire = WireConfig::parse(&format!("udp://{SIM_IP}:4791")).unwrap();
                in_netns(NETNS, || {
                    let fabric = Fabric::try_with_config(FabricConfig {
                        wire,
                        mtu: MTU,
                        ..FabricConfig::new(Engine::Threaded)
                    })
                    .unwrap_or_else(|e| panic!("the UDP wire at {SIM_IP}:4791 in netns sim: {e}"));
                    let sim = fabric.try_add_nic().expect("the sim NIC binds 10.77.0.2:4791 in netns sim");
                    (fabric, sim)
                })
            }
            SimOn::Packet => {
                let spec = format!("sim+packet://veth1,ip={SIM_IP}/24");
                sim_backend(in_netns(NETNS, || bypass::Backend::open(&spec)), &spec)
            }
            SimOn::Vfio(t) => {
                let spec = t.backend();
                sim_backend(bypass::Backend::open(&spec), &spec)
            }
        };
        assert_eq!(fabric.config().mtu, MTU, "the sim's path MTU is rxe1's");
        use std::mem::ManuallyDrop as M;
        Net { on, _fabric: M::new(fabric), sim: M::new(sim), rxe: M::new(rxe) }
    }

    /// Netem drops `percent` of the frames rxe1's netdev sends (B's side).
    fn lose_on_rxe_side(&self, percent: &str) {
        sh(&["modprobe", "sch_netem"]);
        sh(&["tc", "qdisc", "add", "dev", self.on.rxe_netdev(), "root", "netem", "loss", percent]);
    }

    /// Sets netem to drop `percent` on rxe1's netdev only (after [`lose_on_rxe_side`] and,
    /// maybe, loss on veth1).
    fn lose_on_rxe_side_only(&self, percent: &str) {
        sh(&["tc", "qdisc", "change", "dev", self.on.rxe_netdev(), "root", "netem", "loss", percent]);
        if self.on.veth() {
            sh_quiet(&["ip", "netns", "exec", NETNS, "tc", "qdisc", "del", "dev", "veth1", "root"]);
        }
    }

    /// Frames netem dropped on rxe1's netdev so far (`tc -s qdisc`), if it says.
    fn netem_drops(&self) -> Option<u64> {
        let out =
            Command::new("tc").args(["-s", "qdisc", "show", "dev", self.on.rxe_netdev()]).output().ok()?;
        let text = String::from_utf8_lossy(&out.stdout);
        let at = text.find("dropped ")?;
        text[at + 8..].split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
    }
}

/// The fabric of a simulator backend opened by its string, and its one NIC.
fn sim_backend(b: Result<bypass::Backend, bypass::RpcError>, spec: &str) -> (Fabric, SimNic) {
    match b.unwrap_or_else(|e| panic!("{spec}: {e}")) {
        bypass::Backend::Sim { fabric, .. } => {
            let nic = fabric.try_add_nic().unwrap_or_else(|e| panic!("{spec}: the NIC: {e}"));
            (fabric, nic)
        }
        other => panic!("{spec} opened {other:?}, not the simulator"),
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // What both sides counted, for the failure's report.
            eprintln!("rxe_interop: the sim NIC at the failure: {:?}", self.sim.stats());
            eprintln!("rxe_interop: {RXE}'s non-zero counters: {}", rxe_link::nonzero_counters(RXE));
        }
        // SAFETY: each field is dropped exactly once, here, and never used afterwards.
        unsafe {
            std::mem::ManuallyDrop::drop(&mut self.rxe);
            std::mem::ManuallyDrop::drop(&mut self.sim);
            std::mem::ManuallyDrop::drop(&mut self._fabric);
        }
        teardown(&self.on);
    }
}

fn teardown(on: &SimOn) {
    sh_quiet(&["tc", "qdisc", "del", "dev", on.rxe_netdev(), "root"]);
    sh_quiet(&["rdma", "link", "delete", RXE]);
    if on.veth() {
        sh_quiet(&["ip", "link", "del", "veth0"]);
        sh_quiet(&["ip", "netns", "del", NETNS]);
    }
}

/// `BYPASS_RXE_PCAP=<file>`: everything on the link between the two NICs (both directions),
/// captured with `dumpcap` into a pcap file that tshark and Wireshark decode as RoCEv2 (UDP port
/// 4791): on veth1 as the sim's namespace sees it (after netem's drops on either side), or, in
/// the VFIO topology, on NIC B as its kernel sees it (the VFIO NIC's frames as they came off the
/// QEMU hub, and rxe1's after netem's drops).
struct Capture(std::process::Child);

impl Capture {
    fn start(path: &str, on: &SimOn) -> Capture {
        use std::io::BufRead;
        let (mut cmd, ifname) = match on {
            SimOn::Udp | SimOn::Packet => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", NETNS, "dumpcap"]);
                (c, "veth1")
            }
            SimOn::Vfio(t) => (Command::new("dumpcap"), t.netdev.as_str()),
        };
        let mut child = cmd
            .args(["-i", ifname, "-P", "-w", path])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("BYPASS_RXE_PCAP: cannot run dumpcap: {e} (package tshark)"));
        // dumpcap says "Capturing on '<ifname>'" once it captures: wait for that line (bounded).
        let err = child.stderr.take().expect("piped");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(err).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let deadline = Instant::now() + WAIT;
        let mut said = String::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(l) if l.contains("Capturing on") => break,
                Ok(l) => said = said + &l + "\n",
                Err(_) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("BYPASS_RXE_PCAP: dumpcap did not start capturing on {ifname}:\n{said}");
                }
            }
        }
        Capture(child)
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        // SIGINT: dumpcap writes what it has and exits; bounded, then killed.
        // SAFETY: kill on our own child's pid, which has not been reaped yet.
        unsafe { libc::kill(self.0.id() as libc::pid_t, libc::SIGINT) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while matches!(self.0.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Reads a classic pcap file (Ethernet) and decodes every UDP-to-4791 frame with the sim's
/// `decode_ethernet`, which checks the ICRC over the frame's own IPv4 and UDP headers (the IPv4
/// ID included): both rxe's frames and the sim's as they were on the wire. Returns (frames,
/// RoCEv2 frames).
fn check_capture(path: &str) -> (usize, usize) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    assert!(
        bytes.len() >= 24 && bytes[..4] == 0xA1B2_C3D4u32.to_le_bytes(),
        "{path}: not a little-endian pcap"
    );
    assert_eq!(u32::from_le_bytes(bytes[20..24].try_into().unwrap()), 1, "{path}: not Ethernet");
    let (mut at, mut frames, mut roce) = (24usize, 0, 0);
    while at + 16 <= bytes.len() {
        let incl = u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap()) as usize;
        let orig = u32::from_le_bytes(bytes[at + 12..at + 16].try_into().unwrap()) as usize;
        let frame = &bytes[at + 16..(at + 16 + incl).min(bytes.len())];
        at += 16 + incl;
        frames += 1;
        // IPv4, UDP, destination port 4791: a RoCEv2 frame (ARP and the rest are not).
        let is_roce = frame.len() >= 42
            && frame[12..14] == [8, 0]
            && frame[23] == 17
            && frame[36..38] == 4791u16.to_be_bytes();
        if !is_roce {
            continue;
        }
        assert_eq!(incl, orig, "{path}: frame {frames} truncated by the capture");
        roce += 1;
        // The UDP checksum of the sim's own datagrams is captured before veth's checksum offload
        // fills it in (a partial sum), and the ICRC masks it anyway: checked as "none".
        let mut frame = frame.to_vec();
        frame[40..42].fill(0);
        if let Err(e) = bypass_sim::roce::decode_ethernet(&frame) {
            panic!(
                "{path}: frame {frames} ({} → {}) does not decode: {e:?}",
                ip(&frame[26..30]),
                ip(&frame[30..34])
            );
        }
    }
    assert!(roce > 0, "{path}: no RoCEv2 frame captured");
    (frames, roce)
}

fn ip(b: &[u8]) -> std::net::Ipv4Addr {
    std::net::Ipv4Addr::new(b[0], b[1], b[2], b[3])
}

/// Runs `f` with this thread in network namespace `name`, then moves it back.
fn in_netns<R>(name: &str, f: impl FnOnce() -> R) -> R {
    let home = std::fs::File::open("/proc/thread-self/ns/net").expect("/proc/thread-self/ns/net");
    let there = std::fs::File::open(format!("/run/netns/{name}")).expect("the namespace's file");
    // SAFETY: setns on a namespace fd only changes this thread's network namespace.
    let r = unsafe { libc::setns(there.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(r, 0, "setns into {name}: {}", std::io::Error::last_os_error());
    let out = f();
    // SAFETY: as above, back to the namespace the thread started in.
    let r = unsafe { libc::setns(home.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(r, 0, "setns back: {}", std::io::Error::last_os_error());
    out
}

/// The queue settings of both ends: a lost packet is retried after ~134 ms (2^15 × 4.096 µs, a
/// few guest round trips), seven times; RNR retried without limit every ~10 ms.
fn config() -> QueueConfig {
    let mut c = QueueConfig::default();
    c.timeout = AckTimeout::at_least(Duration::from_millis(100));
    c.retry_count = 7;
    c.rnr_retry = 7;
    c.min_rnr_timer = RnrTimer::at_least(Duration::from_millis(10));
    c
}

/// Waits (bounded by [`WAIT`]) until `cond` holds.
#[track_caller]
fn wait_until(what: &str, cond: impl FnMut() -> bool) {
    bypass_hw_tests::shell::wait_until(what, WAIT, cond)
}

/// One end of a connection.
struct End<'d, D: Device> {
    name: &'static str,
    dev: &'d D,
    cq: D::Cq,
    q: D::Queue,
}

/// A connected pair: `a` on device `da`, `b` on device `db`.
fn connect<'a, 'b, A: Device, B: Device>(
    (na, da): (&'static str, &'a A),
    (nb, db): (&'static str, &'b B),
) -> (End<'a, A>, End<'b, B>) {
    let (ca, cb) = (da.create_cq(256).unwrap(), db.create_cq(256).unwrap());
    let mut qa = da.create_queue(&config(), &ca, &ca).unwrap();
    let mut qb = db.create_queue(&config(), &cb, &cb).unwrap();
    let (ia, ib) = (qa.info(), qb.info());
    qa.connect(&ib).unwrap_or_else(|e| panic!("{na} connects to {nb}: {e}"));
    qb.connect(&ia).unwrap_or_else(|e| panic!("{nb} connects to {na}: {e}"));
    (End { name: na, dev: da, cq: ca, q: qa }, End { name: nb, dev: db, cq: cb, q: qb })
}

/// Polls `n` completions (bounded).
#[track_caller]
fn take<D: Device>(e: &mut End<'_, D>, n: usize, what: &str) -> Vec<Completion> {
    let deadline = Instant::now() + WAIT;
    let mut got = Vec::new();
    let mut wc = [Completion::default(); 32];
    while got.len() < n {
        assert!(Instant::now() < deadline, "{}: {what}: {} of {n} completions", e.name, got.len());
        let k = e.cq.poll(&mut wc).unwrap();
        got.extend_from_slice(&wc[..k]);
        if k == 0 {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    got
}

/// `len` bytes of a pattern that differs per message.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    (0..len).map(|i| ((i as u64).wrapping_mul(31) ^ seed.wrapping_mul(0x9E37)) as u8).collect()
}

const ALL: Access = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE).union(Access::REMOTE_READ);

/// SEND and SEND with immediate from `a` to `b`: a small message and one of five segments.
fn sends<A: Device, B: Device>(a: &mut End<'_, A>, b: &mut End<'_, B>) {
    let sizes = [13usize, 5 * MTU as usize - 100];
    let mut src = a.dev.register(8192, Access::LOCAL_WRITE).unwrap();
    let dst = b.dev.register(16384, ALL).unwrap();
    for i in 0..sizes.len() {
        b.q.post_recv(&[RecvWr { wr_id: 100 + i as u64, sges: &[dst.sge(i * 8192, 8192).unwrap()] }])
            .unwrap();
    }
    for (i, &len) in sizes.iter().enumerate() {
        src.write(0, &pattern(len, i as u64)).unwrap();
        let sge = [src.sge(0, len).unwrap()];
        let mut wr = SendWr::send(i as u64, &sge);
        if i == 1 {
            wr = wr.with_op(SendOp::SendImm(0xDEC0_DED1));
        }
        a.q.post_send(&[wr]).unwrap();
        let c = take(a, 1, "SEND")[0];
        assert_eq!((c.wr_id, c.status), (i as u64, Status::Success), "{} → {} SEND {len} B", a.name, b.name);
    }
    let got = take(b, 2, "receives");
    for (i, &len) in sizes.iter().enumerate() {
        let c = got[i];
        assert_eq!(
            (c.wr_id, c.status, c.opcode, c.byte_len),
            (100 + i as u64, Status::Success, CqOpcode::Recv, len as u32)
        );
        assert_eq!(c.imm, (i == 1).then_some(0xDEC0_DED1), "{} → {}: immediate", a.name, b.name);
        let mut bytes = vec![0u8; len];
        dst.read(i * 8192, &mut bytes).unwrap();
        assert!(bytes == pattern(len, i as u64), "{} → {}: SEND of {len} B arrived changed", a.name, b.name);
    }
}

/// WRITE (three segments) and WRITE with immediate from `a` into `b`'s memory.
fn writes<A: Device, B: Device>(a: &mut End<'_, A>, b: &mut End<'_, B>) {
    let len = 3 * MTU as usize - 7;
    let mut src = a.dev.register(8192, Access::LOCAL_WRITE).unwrap();
    let dst = b.dev.register(8192, ALL).unwrap();
    let r = dst.remote();
    src.write(0, &pattern(len, 7)).unwrap();
    src.write(4096, &pattern(100, 8)).unwrap();
    b.q.post_recv(&[RecvWr { wr_id: 200, sges: &[] }]).unwrap();
    let at = |off: u64| RemoteAddr { addr: r.addr + off, key: r.key };
    a.q.post_send(&[
        SendWr::send(1, &[src.sge(0, len).unwrap()]).with_op(SendOp::Write(at(0))),
        SendWr::send(2, &[src.sge(4096, 100).unwrap()]).with_op(SendOp::WriteImm(at(4096), 0x1234_5678)),
    ])
    .unwrap();
    let c = take(a, 2, "WRITEs");
    assert_eq!(
        (c[0].wr_id, c[0].status, c[0].opcode),
        (1, Status::Success, CqOpcode::Write),
        "{} → {}",
        a.name,
        b.name
    );
    assert_eq!((c[1].wr_id, c[1].status), (2, Status::Success));
    let n = take(b, 1, "WRITE_IMM notification")[0];
    assert_eq!(
        (n.wr_id, n.status, n.opcode, n.byte_len, n.imm),
        (200, Status::Success, CqOpcode::RecvWriteImm, 100, Some(0x1234_5678))
    );
    let mut bytes = vec![0u8; len];
    dst.read(0, &mut bytes).unwrap();
    assert!(bytes == pattern(len, 7), "{} → {}: WRITE of {len} B landed changed", a.name, b.name);
    let mut bytes = vec![0u8; 100];
    dst.read(4096, &mut bytes).unwrap();
    assert!(bytes == pattern(100, 8), "{} → {}: WRITE_IMM landed changed", a.name, b.name);
}

/// READ of four segments by `a` from `b`'s memory.
fn reads<A: Device, B: Device>(a: &mut End<'_, A>, b: &mut End<'_, B>) {
    let len = 4 * MTU as usize - 3;
    let dst = a.dev.register(8192, Access::LOCAL_WRITE).unwrap();
    let mut src = b.dev.register(8192, ALL).unwrap();
    src.write(0, &pattern(len, 9)).unwrap();
    let r = src.remote();
    a.q.post_send(&[SendWr::send(3, &[dst.sge(0, len).unwrap()])
        .with_op(SendOp::Read(RemoteAddr { addr: r.addr, key: r.key }))])
        .unwrap();
    let c = take(a, 1, "READ")[0];
    assert_eq!(
        (c.wr_id, c.status, c.opcode),
        (3, Status::Success, CqOpcode::Read),
        "{} reads {}",
        a.name,
        b.name
    );
    let mut bytes = vec![0u8; len];
    dst.read(0, &mut bytes).unwrap();
    assert!(bytes == pattern(len, 9), "{} read {len} B of {} changed", a.name, b.name);
}

/// Atomics across the two implementations: a FETCH_ADD and two COMPARE_SWAPs (one matching,
/// one not) return the word's old value, and the word ends as a CPU's atomics would leave it —
/// the AtomicETH and AtomicAckETH encodings and the responder's execution agree.
fn atomics<A: Device, B: Device>(a: &mut End<'_, A>, b: &mut End<'_, B>) {
    let old = a.dev.register(64, Access::LOCAL_WRITE).unwrap();
    let mut word = b.dev.register(4096, Access::LOCAL_WRITE | Access::REMOTE_ATOMIC).unwrap();
    word.write(16, &1000u64.to_ne_bytes()).unwrap();
    let r = word.remote();
    let at = RemoteAddr { addr: r.addr + 16, key: r.key };
    let sges: Vec<[Sge; 1]> = (0..3).map(|i| [old.sge(i * 8, 8).unwrap()]).collect();
    a.q.post_send(&[
        SendWr::send(40, &sges[0]).with_op(SendOp::FetchAdd { remote: at, add: 24 }),
        SendWr::send(41, &sges[1]).with_op(SendOp::CompareSwap { remote: at, compare: 1024, swap: 7 }),
        SendWr::send(42, &sges[2]).with_op(SendOp::CompareSwap { remote: at, compare: 99, swap: 1 }),
    ])
    .unwrap();
    let got: Vec<(u64, Status, CqOpcode)> =
        take(a, 3, "atomics").iter().map(|c| (c.wr_id, c.status, c.opcode)).collect();
    assert_eq!(
        got,
        [
            (40, Status::Success, CqOpcode::FetchAdd),
            (41, Status::Success, CqOpcode::CompareSwap),
            (42, Status::Success, CqOpcode::CompareSwap)
        ],
        "{} atomics on {}",
        a.name,
        b.name
    );
    let mut olds = [0u8; 24];
    old.read(0, &mut olds).unwrap();
    let olds: Vec<u64> = olds.chunks(8).map(|c| u64::from_ne_bytes(c.try_into().unwrap())).collect();
    assert_eq!(olds, [1000, 1024, 7], "{} atomics on {}: old values", a.name, b.name);
    let mut w = [0u8; 8];
    word.read(16, &mut w).unwrap();
    assert_eq!(u64::from_ne_bytes(w), 7, "{} atomics on {}: the word", a.name, b.name);
}

/// A WRITE with a wrong rkey: remote access error at the requester, both queues in ERROR.
fn wrong_rkey<A: Device, B: Device>(a: &mut End<'_, A>, b: &mut End<'_, B>) {
    let src = a.dev.register(4096, Access::LOCAL_WRITE).unwrap();
    let dst = b.dev.register(4096, ALL).unwrap();
    let r = dst.remote();
    let bad = RemoteKey::from_rkey(r.key.rkey() ^ 0x00A5_5A00);
    a.q.post_send(&[SendWr::send(4, &[src.sge(0, 64).unwrap()])
        .with_op(SendOp::Write(RemoteAddr { addr: r.addr, key: bad }))])
        .unwrap();
    let c = take(a, 1, "WRITE with a wrong rkey")[0];
    assert_eq!((c.wr_id, c.status), (4, Status::RemoteAccess), "{} → {}: wrong rkey", a.name, b.name);
    wait_until(&format!("{}'s queue in ERROR", a.name), || a.q.state() == QueueState::Error);
    wait_until(&format!("{}'s queue in ERROR", b.name), || b.q.state() == QueueState::Error);
}

/// A SEND to `b` with no receive posted: RNR NAKs until `b` posts one (after `rnr_seen` showed
/// the first), then success.
fn rnr<A: Device, B: Device>(a: &mut End<'_, A>, b: &mut End<'_, B>, rnr_seen: &dyn Fn() -> bool) {
    let mut src = a.dev.register(4096, Access::LOCAL_WRITE).unwrap();
    let dst = b.dev.register(4096, ALL).unwrap();
    src.write(0, &pattern(300, 11)).unwrap();
    a.q.post_send(&[SendWr::send(5, &[src.sge(0, 300).unwrap()])]).unwrap();
    wait_until(&format!("an RNR NAK from {} to {}", b.name, a.name), rnr_seen);
    let mut wc = [Completion::default(); 4];
    assert_eq!(a.cq.poll(&mut wc).unwrap(), 0, "{}: the SEND waits for a receive", a.name);
    b.q.post_recv(&[RecvWr { wr_id: 500, sges: &[dst.sge(0, 4096).unwrap()] }]).unwrap();
    let c = take(a, 1, "SEND after RNR")[0];
    assert_eq!((c.wr_id, c.status), (5, Status::Success), "{} → {} after RNR", a.name, b.name);
    let r = take(b, 1, "receive after RNR")[0];
    assert_eq!((r.wr_id, r.status, r.byte_len), (500, Status::Success, 300));
    let mut bytes = vec![0u8; 300];
    dst.read(0, &mut bytes).unwrap();
    assert!(bytes == pattern(300, 11));
}

/// `n` messages from `a` to `b` over the lossy link, all posted at once (some of three
/// segments): each arrives exactly once, in order, intact.
fn lossy_sequence<A: Device, B: Device>(a: &mut End<'_, A>, b: &mut End<'_, B>, n: usize) {
    let slot = 4096usize;
    let mut src = a.dev.register(n * slot, Access::LOCAL_WRITE).unwrap();
    let dst = b.dev.register(n * slot, ALL).unwrap();
    let len = |i: usize| if i % 5 == 4 { 3 * MTU as usize - 11 } else { 40 + i };
    for i in 0..n {
        src.write(i * slot, &pattern(len(i), 1000 + i as u64)).unwrap();
        b.q.post_recv(&[RecvWr { wr_id: i as u64, sges: &[dst.sge(i * slot, slot).unwrap()] }]).unwrap();
    }
    let sges: Vec<[Sge; 1]> = (0..n).map(|i| [src.sge(i * slot, len(i)).unwrap()]).collect();
    let wrs: Vec<SendWr<'_>> = (0..n).map(|i| SendWr::send(i as u64, &sges[i])).collect();
    a.q.post_send(&wrs).unwrap();
    let sent = take(a, n, "lossy SENDs");
    for (i, c) in sent.iter().enumerate() {
        assert_eq!(
            (c.wr_id, c.status),
            (i as u64, Status::Success),
            "{} → {}: lossy SEND {i}",
            a.name,
            b.name
        );
    }
    let got = take(b, n, "lossy receives");
    let mut extra = [Completion::default(); 4];
    assert_eq!(b.cq.poll(&mut extra).unwrap(), 0, "{}: no message arrives twice", b.name);
    for (i, c) in got.iter().enumerate() {
        assert_eq!(
            (c.wr_id, c.status, c.byte_len),
            (i as u64, Status::Success, len(i) as u32),
            "{}: message {i} in order",
            b.name
        );
        let mut bytes = vec![0u8; len(i)];
        dst.read(i * slot, &mut bytes).unwrap();
        assert!(bytes == pattern(len(i), 1000 + i as u64), "{}: message {i} intact", b.name);
    }
}

/// The RPC queues' retransmission timeout (see `rpc_calls`).
fn rpc_ack_timeout() -> AckTimeout {
    AckTimeout::at_least(Duration::from_millis(500))
}

/// An RPC function id of these tests' echo server.
const ECHO: FunctionId = match FunctionId::new(0x29, 0x1, true, 1) {
    Some(f) => f,
    None => panic!("bad function id"),
};

/// Arguments of call `i`: distinct bytes, every seventh call larger than the channel's 4 KiB
/// messages (sent by rendezvous: the server RDMA READs them and RDMA WRITEs the echo back), the
/// others of one to four segments, sent eagerly.
fn call_args(i: usize, seed: u64, rendezvous: bool) -> Vec<u8> {
    let len = if rendezvous && i % 7 == 6 { 9 * MTU as usize + 501 } else { 16 + (i * 337) % 3500 };
    pattern(len, seed ^ (i as u64) << 8)
}

/// `n` blocking echo calls, then `n` pipelined ones, from a channel on `client` to a server on
/// `server`, found through its TCP session (127.0.0.1) as another process's would be: every call
/// completes once with its own arguments, and the handler ran exactly `2n` times (no call lost,
/// none executed twice, under loss too). Returns the time the calls took.
fn rpc_calls<S: Device + Clone, C: Device + Clone>(
    (sn, server): (&str, &S),
    (cn, client): (&str, &C),
    n: usize,
    seed: u64,
    rendezvous: bool,
) -> Duration {
    let hits = Arc::new(AtomicUsize::new(0));
    let mut f = Functions::new();
    let h = hits.clone();
    f.register(ECHO, move |req| {
        h.fetch_add(1, Ordering::SeqCst);
        let len = req.args().len();
        let _ = req.reply_args(len);
    });
    let mut scfg = ServerConfig::new("rxe-interop");
    scfg.workers = 1;
    // The guest's clock runs while the host has its vCPU descheduled: a retransmission timer of
    // ~0.5 s (seven retries, ~4 s without progress) rides out such a stall on a loaded host,
    // where the default ~134 ms (~1 s) may not.
    scfg.queue_config.timeout = rpc_ack_timeout();
    let srv = Server::bind(server, "127.0.0.1:0", scfg, f).unwrap_or_else(|e| panic!("{sn}: bind: {e}"));
    let mut ccfg = ChannelConfig::new("rxe-interop");
    ccfg.timeout = Some(WAIT);
    ccfg.connect_timeout = WAIT;
    ccfg.queue_config.timeout = rpc_ack_timeout();
    let ch = Channel::connect(client, srv.local_addr(), ccfg)
        .unwrap_or_else(|e| panic!("{cn} → {sn}: connect: {e}"));
    let t0 = Instant::now();
    let mut resp = Vec::new();
    for i in 0..n {
        let args = call_args(i, seed, rendezvous);
        let opts =
            CallOptions { mode: CallMode::WaitRsp, max_response: args.len(), ..CallOptions::default() };
        ch.call_with(&opts, ECHO, &args, &mut resp)
            .unwrap_or_else(|e| panic!("{cn} → {sn}: call {i} ({} B): {e}", args.len()));
        assert!(resp == args, "{cn} → {sn}: call {i} ({} B) came back changed", args.len());
    }
    // The same again, pipelined: every call started at once (as many in flight as the channel
    // has credits), each callback recording its outcome, the channel polled until all are in.
    type Outcomes = Arc<Mutex<Vec<Vec<Result<Vec<u8>, String>>>>>;
    let got: Outcomes = Arc::new(Mutex::new(vec![Vec::new(); n]));
    let deadline = Instant::now() + WAIT;
    for i in 0..n {
        let args = call_args(n + i, seed, rendezvous);
        let opts =
            CallOptions { mode: CallMode::WaitRsp, max_response: args.len(), ..CallOptions::default() };
        let g = got.clone();
        ch.call_callback(&opts, ECHO, &args, move |r| {
            g.lock().unwrap()[i].push(r.map(<[u8]>::to_vec).map_err(|e| e.to_string()))
        })
        .unwrap_or_else(|e| panic!("{cn} → {sn}: pipelined call {i}: {e}"));
    }
    while got.lock().unwrap().iter().any(Vec::is_empty) {
        assert!(Instant::now() < deadline, "{cn} → {sn}: pipelined calls still outstanding after {WAIT:?}");
        if ch.poll() == 0 {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    let took = t0.elapsed();
    for (i, o) in got.lock().unwrap().iter().enumerate() {
        assert_eq!(o.len(), 1, "{cn} → {sn}: pipelined call {i} completed {} times: {o:?}", o.len());
        let want = call_args(n + i, seed, rendezvous);
        match &o[0] {
            Ok(r) => assert!(*r == want, "{cn} → {sn}: pipelined call {i} came back changed"),
            Err(e) => panic!("{cn} → {sn}: pipelined call {i}: {e}"),
        }
    }
    drop(ch);
    drop(srv);
    assert_eq!(hits.load(Ordering::SeqCst), 2 * n, "{cn} → {sn}: the handler ran once per call");
    took
}

/// Everything the rig checks, on the network `net` built: RC operations both ways, the error
/// cases, RNR, then loss on rxe's side (`loss` for netem; `both`: also on the sim's veth) with
/// sequences both ways and RPC calls both ways, and the capture if one was asked for.
fn exercise(net: Net, loss: &str, both: bool, test: &str) {
    let pcap = std::env::var("BYPASS_RXE_PCAP").ok().filter(|p| !p.is_empty());
    let capture = pcap.as_deref().map(|p| Capture::start(p, &net.on));
    let (sim, rxe) = (("sim", &*net.sim), ("rxe", &*net.rxe));
    let t0 = Instant::now();
    let step = |s: &str| eprintln!("{test}: {:>6.1} s  {s}", t0.elapsed().as_secs_f64());

    // The queues, CQs and regions of rxe1 are closed at the end of this block, before the
    // network: `rdma link delete` waits for its last user.
    {
        step("SEND, SEND_IMM, WRITE, WRITE_IMM, READ, atomics both ways");
        let (mut s, mut r) = connect(sim, rxe);
        sends(&mut s, &mut r);
        sends(&mut r, &mut s);
        writes(&mut s, &mut r);
        writes(&mut r, &mut s);
        reads(&mut s, &mut r);
        reads(&mut r, &mut s);
        if net.rxe.caps().atomics {
            atomics(&mut s, &mut r);
            atomics(&mut r, &mut s);
        } else {
            eprintln!("{test}: rxe1 reports no atomics; skipping them");
        }
        let st = net.sim.stats();
        assert_eq!(st.rx_malformed, 0, "every frame from rxe decoded: {st:?}");

        step("wrong rkey: sim requester, rxe responder");
        let (mut s, mut r) = connect(sim, rxe);
        wrong_rkey(&mut s, &mut r);
        step("wrong rkey: rxe requester, sim responder");
        let (mut s, mut r) = connect(sim, rxe);
        wrong_rkey(&mut r, &mut s);

        step("RNR: sim sends to rxe with no receive posted");
        let (mut s, mut r) = connect(sim, rxe);
        let before = net.sim.stats().rnr_naks_received;
        rnr(&mut s, &mut r, &|| net.sim.stats().rnr_naks_received > before);
        step("RNR: rxe sends to sim with no receive posted");
        let before = net.sim.stats().rnr_naks_sent;
        rnr(&mut r, &mut s, &|| net.sim.stats().rnr_naks_sent > before);

        // Calls per run of rpc_calls, blocking and as many again pipelined; more under loss.
        const CALLS: usize = 50;
        const LOSSY_CALLS: usize = 100;
        step(&format!("RPC: 2 × {CALLS} echo calls, server on rxe, client on the sim"));
        let took = rpc_calls(rxe, sim, CALLS, 1, true);
        step(&format!("  … {} calls exactly once in {:.2} s", 2 * CALLS, took.as_secs_f64()));
        step(&format!("RPC: 2 × {CALLS} echo calls, server on the sim, client on rxe"));
        let took = rpc_calls(sim, rxe, CALLS, 2, true);
        step(&format!("  … {} calls exactly once in {:.2} s", 2 * CALLS, took.as_secs_f64()));

        step(&format!(
            "{loss} loss (netem) on rxe's side{}: sequences both ways, then RPC both ways at 1% on rxe's side",
            if both { " and the sim's" } else { "" }
        ));
        net.lose_on_rxe_side(loss);
        if both {
            sh(&[
                "ip", "netns", "exec", NETNS, "tc", "qdisc", "add", "dev", "veth1", "root", "netem", "loss",
                loss,
            ]);
        }
        let (mut s, mut r) = connect(sim, rxe);
        let before = net.sim.stats();
        lossy_sequence(&mut s, &mut r, 40);
        lossy_sequence(&mut r, &mut s, 40);
        // The RPC calls under 1% loss on rxe's side (issue 29's figure). At 10% both ways an rxe
        // client's queue once ended with RetryExceeded after 154 of 400 calls: a finding for
        // the RPC layer's retry budget under heavy loss, not what this test measures.
        if both || loss != "1%" {
            net.lose_on_rxe_side_only("1%");
        }
        // Rendezvous calls under loss fail between rxe and the sim (a sim server READing an rxe
        // client's arguments: the channel's queue flushed or the connection closed after 61 and
        // 145 pipelined calls, two runs of two; docs/vfio.md): eager calls only, unless
        // BYPASS_RXE_LOSSY_RENDEZVOUS=1 asks for the failing case.
        let lossy_rendezvous = std::env::var("BYPASS_RXE_LOSSY_RENDEZVOUS").is_ok_and(|v| v == "1");
        let took = rpc_calls(rxe, sim, LOSSY_CALLS, 3, lossy_rendezvous);
        step(&format!(
            "  … lossy: {} calls rxe server ← sim client exactly once in {:.2} s",
            2 * LOSSY_CALLS,
            took.as_secs_f64()
        ));
        let took = rpc_calls(sim, rxe, LOSSY_CALLS, 4, lossy_rendezvous);
        step(&format!(
            "  … lossy: {} calls sim server ← rxe client exactly once in {:.2} s",
            2 * LOSSY_CALLS,
            took.as_secs_f64()
        ));
        let after = net.sim.stats();
        let (retx, dups) = (after.retransmits - before.retransmits, after.duplicates - before.duplicates);
        let drops = net.netem_drops();
        eprintln!(
            "{test}: under loss netem dropped {drops:?} frame(s) on rxe's side; the sim retransmitted {retx} \
             packet(s), saw {dups} duplicate(s): {after:?}"
        );
        if both {
            assert!(retx > 0, "the sim retransmitted what netem dropped: {after:?}");
        }
        assert_eq!(after.rx_malformed, 0, "{after:?}");
    }
    if let (Some(c), Some(path)) = (capture, pcap) {
        drop(c);
        let (frames, roce) = check_capture(&path);
        eprintln!("{test}: {path}: {frames} frames, {roce} RoCEv2 frames, every ICRC right");
    }
    drop(net);
    // The sim's own capture of the L2 wire (BYPASS_PCAP), complete once its fabric is gone.
    if let Some(path) = std::env::var("BYPASS_PCAP").ok().filter(|p| !p.is_empty() && !p.contains("{pid}")) {
        let (frames, roce) = check_capture(&path);
        eprintln!("{test}: {path} (BYPASS_PCAP): {frames} frames, {roce} RoCEv2 frames, every ICRC right");
    }
    step("done");
}

#[test]
fn sim_and_rxe_exchange_rc_traffic_errors_and_retransmissions() {
    let test = "sim_and_rxe_exchange_rc_traffic_errors_and_retransmissions";
    if should_run(test).is_none() {
        return;
    }
    exercise(Net::up(SimOn::Udp), "10%", true, test);
}

/// The L2 wire on an AF_PACKET socket (`sim+packet://`): the simulator's own Ethernet, IPv4, UDP
/// and ARP against the kernel's, with no VFIO.
#[test]
fn packet_port_and_rxe_exchange_rc_traffic_rpc_and_retransmissions() {
    let test = "packet_port_and_rxe_exchange_rc_traffic_rpc_and_retransmissions";
    if should_run(test).is_none() {
        return;
    }
    exercise(Net::up(SimOn::Packet), "1%", false, test);
}

/// The L2 wire on the userspace virtio-net driver (`vfio:` backend), NIC A owned through VFIO,
/// against rxe on NIC B: no kernel on the sim's data path.
#[test]
fn vfio_nic_and_rxe_exchange_rc_traffic_rpc_and_retransmissions() {
    let test = "vfio_nic_and_rxe_exchange_rc_traffic_rpc_and_retransmissions";
    if should_run(test).is_none() {
        return;
    }
    if !cfg!(feature = "vfio") {
        bypass_hw_tests::skip(test, "built without the feature vfio (--features verbs,vfio)");
        return;
    }
    let Some(t) = VfioTopology::from_env(test) else { return };
    exercise(Net::up(SimOn::Vfio(t)), "1%", false, test);
}
