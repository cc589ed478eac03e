//! RPCs between real processes over the simulated NIC's byte wires — UDP and shared memory: every
//! call mode, one-sided I/O, a server killed mid-call, a client killed mid-stream, garbage on the
//! wire, and several servers and clients at once. On the UDP wire the "hosts" are processes bound
//! to different loopback addresses (127.0.0.0/8 all reaches `lo`); on the shared-memory wire they
//! are processes of this host with their segments in /dev/shm. The test binary re-executes itself
//! as the other process; every wait is bounded and every child is killed when its test ends,
//! however it ends.

use bypass::sim::{Engine, Fabric, FabricConfig, SimNic, WireConfig};
use bypass::{CallMode, CallOptions, Channel, ChannelConfig, Functions, RpcError, Server, ServerConfig};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::UdpSocket;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

const ROLE: &str = "BYPASS_XP_ROLE";
const WIRE: &str = "BYPASS_XP_WIRE";
const TARGET: &str = "BYPASS_XP_TARGET";

mod common;
use common::ids::{ECHO, HOLD as SLOW};

fn engine() -> Engine {
    match std::env::var("BYPASS_XP_ENGINE").as_deref() {
        Ok("threaded") => Engine::Threaded,
        _ => Engine::Inline,
    }
}

/// A NIC on the wire `wire` names: `shm` (shared memory), or an IPv4 `ip:port` for the UDP wire.
fn nic_on(wire: &str, engine: Engine) -> (Fabric, SimNic) {
    let wire =
        if wire == "shm" { WireConfig::Shm } else { WireConfig::parse(&format!("udp://{wire}")).unwrap() };
    let fabric = Fabric::with_config(FabricConfig { wire, ..FabricConfig::new(engine) });
    let nic = fabric.add_nic();
    (fabric, nic)
}

/// Where a NIC is on its wire, for the parent: its UDP address or its segment.
fn wire_addr(nic: &SimNic) -> String {
    match nic.udp_addr() {
        Some(a) => a.to_string(),
        None => nic.shm_path().expect("a NIC on a byte wire").display().to_string(),
    }
}

static HELD: std::sync::Mutex<Vec<bypass::Request<SimNic>>> = std::sync::Mutex::new(Vec::new());

fn functions() -> Functions<SimNic> {
    let mut f = Functions::new();
    f.register(ECHO, |req| {
        let args = req.args().to_vec();
        let _ = req.reply(&args);
    });
    // Never answers: keeps a call outstanding for the kill tests (the request is held, not the
    // worker thread, so other calls go on).
    f.register(SLOW, |req| HELD.lock().unwrap().push(req));
    f
}

/// A child process of this test binary in some role, killed when dropped.
struct ChildProc {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl ChildProc {
    fn start(role: &str, env: &[(&str, &str)]) -> ChildProc {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args(["--exact", "child_role", "--nocapture", "--test-threads=1"])
            .env(ROLE, role)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("start a child process");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                // The harness may print "test child_role ... " before ours on the same line.
                if let Some(i) = line.find("XP ") {
                    let _ = tx.send(line[i + 3..].trim().to_string());
                }
            }
        });
        ChildProc { child, lines }
    }

    /// The next line the child reports that starts with `what`, within 60 s.
    fn expect(&mut self, what: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l.starts_with(what) => return l[what.len()..].trim().to_string(),
                Ok(_) => continue,
                Err(e) => panic!("the child never reported {what:?}: {e}"),
            }
        }
    }

    fn kill9(&mut self) {
        let _ = self.child.kill(); // SIGKILL
        let _ = self.child.wait();
    }
}

impl Drop for ChildProc {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.child.try_wait().ok().flatten().is_none() {
            if Instant::now() > deadline {
                self.kill9();
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// The child side. Roles: `server` (serve on BYPASS_XP_WIRE — `shm` or a UDP address —, report
/// "XP ADDR <tcp> <udp address or segment>", run until stdin closes) and `client` (connect to
/// BYPASS_XP_TARGET, report "XP WIRE <udp address or segment>", then "XP CALLING" once calls flow,
/// call until killed).
#[test]
fn child_role() {
    let Ok(role) = std::env::var(ROLE) else { return };
    let wire = std::env::var(WIRE).unwrap_or_else(|_| "127.0.0.1:0".into());
    let (_fabric, nic) = nic_on(&wire, engine());
    match role.as_str() {
        "server" => {
            let server =
                Server::bind(&nic, "127.0.0.1:0", ServerConfig::new("xp"), functions()).expect("bind");
            println!("XP ADDR {} {}", server.local_addr(), wire_addr(&nic));

            std::io::stdout().flush().unwrap();
            let _ = std::io::stdin().read_to_end(&mut Vec::new());
        }
        "client" => {
            let target = std::env::var(TARGET).expect("a target address");
            println!("XP WIRE {}", wire_addr(&nic));
            std::io::stdout().flush().unwrap();
            let ch = Channel::connect(&nic, target.as_str(), ChannelConfig::new("xp")).expect("connect");
            let mut rsp = Vec::new();
            let mut announced = false;
            loop {
                // A stream of echo calls, and calls left waiting on the slow function.
                let _ = ch.call_callback(&CallOptions::default(), SLOW, b"wait", |_| {});
                ch.call(ECHO, b"ping", &mut rsp).expect("echo");
                if !announced {
                    println!("XP CALLING");
                    std::io::stdout().flush().unwrap();
                    announced = true;
                }
            }
        }
        other => panic!("unknown role {other}"),
    }
}

fn server_at(ip: &str) -> (ChildProc, String, String) {
    server_on(&format!("{ip}:0"))
}

/// A server child on `wire` (`shm`, or `ip:0` for UDP): the child, its TCP address, and its
/// wire address.
fn server_on(wire: &str) -> (ChildProc, String, String) {
    let mut s = ChildProc::start("server", &[(WIRE, wire)]);
    let addr = s.expect("ADDR");
    let (tcp, udp) = addr.split_once(' ').expect("two addresses");
    (s, tcp.to_string(), udp.to_string())
}

fn config() -> ChannelConfig {
    let mut c = ChannelConfig::new("xp");
    c.connect_timeout = Duration::from_secs(20);
    c.timeout = Some(Duration::from_secs(20));
    c
}

#[test]
fn every_call_mode_between_two_hosts() {
    every_call_mode("127.0.0.2:0", "127.0.0.3:0");
}

#[test]
fn every_call_mode_between_two_processes_over_shared_memory() {
    every_call_mode("shm", "shm");
}

fn every_call_mode(server_wire: &str, client_wire: &str) {
    for engine in [Engine::Inline, Engine::Threaded] {
        let (_server, tcp, _) = server_on(server_wire);
        let (_fabric, nic) = nic_on(client_wire, engine);
        let ch = Channel::connect(&nic, tcp.as_str(), config()).expect("connect across processes");
        let mut rsp = Vec::new();
        for mode in CallMode::ALL {
            for len in [0usize, 1, 100, 4000, 30_000] {
                let args: Vec<u8> = (0..len).map(|i| (i * 31 + len) as u8).collect();
                let max = ch.max_request_args();
                if len > max {
                    continue;
                }
                ch.call_with(&CallOptions::mode(mode), ECHO, &args, &mut rsp)
                    .unwrap_or_else(|e| panic!("{engine:?} {mode:?} {len} B: {e}"));
                if matches!(mode, CallMode::WaitRsp | CallMode::Ack) {
                    assert_eq!(rsp, args, "{engine:?} {mode:?} {len} B");
                }
            }
        }
        // Callback and Future delivery.
        let (tx, rx) = mpsc::channel();
        for i in 0..50u32 {
            let tx = tx.clone();
            ch.call_callback(&CallOptions::default(), ECHO, &i.to_le_bytes(), move |r| {
                let _ = tx.send(r.map(|b| b.to_vec()).map_err(|e| e.to_string()));
            })
            .unwrap();
        }
        let mut seen = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        while seen.len() < 50 {
            assert!(Instant::now() < deadline, "{engine:?}: {} of 50 callbacks ran", seen.len());
            ch.poll(); // this channel has no worker group: its user polls
            let Ok(r) = rx.try_recv() else { continue };
            seen.push(u32::from_le_bytes(
                r.unwrap_or_else(|e| {
                    panic!("{engine:?}: {e}; {:?} closed={} {:?}", ch.stats(), ch.is_closed(), nic.stats())
                })
                .try_into()
                .unwrap(),
            ));
        }
        seen.sort();
        assert_eq!(seen, (0..50).collect::<Vec<_>>());
        let fut = ch.call_future(&CallOptions::default(), ECHO, b"future").unwrap();
        assert_eq!(
            futures_block_on(fut, || {
                ch.poll();
            })
            .unwrap(),
            b"future"
        );
    }
}

/// A minimal executor: polls the future with a waker that unparks this thread, running `poll`
/// (the channel's) between tries.
fn futures_block_on<F: std::future::Future>(f: F, poll: impl Fn()) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = std::task::Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = std::task::Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        assert!(Instant::now() < deadline, "the future never completed");
        poll();
    }
}

#[test]
fn killing_the_server_fails_outstanding_calls_and_a_new_server_works() {
    killing_the_server("127.0.0.2:0", "127.0.0.3:0");
}

#[test]
fn killing_the_server_over_shared_memory_fails_outstanding_calls_and_a_new_server_works() {
    killing_the_server("shm", "shm");
}

fn killing_the_server(server_wire: &str, client_wire: &str) {
    let (mut server, tcp, seg) = server_on(server_wire);
    let (_fabric, nic) = nic_on(client_wire, Engine::Inline);
    let ch = Channel::connect(&nic, tcp.as_str(), config()).unwrap();
    let mut rsp = Vec::new();
    ch.call(ECHO, b"before", &mut rsp).unwrap();
    let (tx, rx) = mpsc::channel();
    for _ in 0..4 {
        let tx = tx.clone();
        ch.call_callback(&CallOptions::default(), SLOW, b"x", move |r| {
            let _ = tx.send(r.map(|_| ()).map_err(|e| e.to_string()));
        })
        .unwrap();
    }
    let killed = Instant::now();
    server.kill9();
    let mut ended = 0;
    while ended < 4 {
        assert!(killed.elapsed() < Duration::from_secs(15), "{ended} of 4 outstanding calls ended");
        ch.poll();
        let Ok(r) = rx.try_recv() else { continue };
        ended += 1;
        let e = r.expect_err("a call to a killed server cannot succeed");
        assert!(e.contains("closed") || e.contains("broken"), "the error says the connection is gone: {e}");
    }
    assert!(killed.elapsed() < Duration::from_secs(15));
    assert!(ch.is_closed());
    match ch.call(ECHO, b"after", &mut rsp) {
        Err(RpcError::Closed) => {}
        other => panic!("a call on the broken channel: {other:?}"),
    }
    let (_server2, tcp2, _) = server_on(server_wire);
    if server_wire == "shm" {
        // The new server's fabric removed the dead one's segment when it started.
        assert!(!std::path::Path::new(&seg).exists(), "the killed server's segment {seg} is left");
    }
    let ch2 = Channel::connect(&nic, tcp2.as_str(), config()).expect("connect to the new server");
    ch2.call(ECHO, b"again", &mut rsp).unwrap();
    assert_eq!(rsp, b"again");
}

#[test]
fn killing_a_client_frees_its_connection_on_the_server() {
    killing_a_client("127.0.0.2:0", "127.0.0.3:0");
}

#[test]
fn killing_a_client_over_shared_memory_frees_its_connection_and_its_segment() {
    killing_a_client("shm", "shm");
}

fn killing_a_client(server_wire: &str, client_wire: &str) {
    let (_fabric, nic) = nic_on(server_wire, Engine::Inline);
    let server = Server::bind(&nic, "127.0.0.1:0", ServerConfig::new("xp"), functions()).unwrap();
    let idle_bytes = server.registered_bytes();
    let target = server.local_addr().to_string();
    let mut client = ChildProc::start("client", &[(WIRE, client_wire), (TARGET, &target)]);
    let seg = client.expect("WIRE");
    client.expect("CALLING");
    assert_eq!(server.connections(), 1);
    client.kill9();
    let deadline = Instant::now() + Duration::from_secs(30);
    while server.connections() != 0 || server.registered_bytes() != idle_bytes {
        assert!(
            Instant::now() < deadline,
            "the killed client's connection was not freed: {} connection(s), {} registered bytes",
            server.connections(),
            server.registered_bytes()
        );
        server.poll();
        std::thread::sleep(Duration::from_millis(5));
    }
    if client_wire == "shm" {
        // kill -9 left the client's segment behind (unless a fabric made meanwhile by a test
        // running beside this one removed it already).
        let _next = nic_on("shm", Engine::Inline);
        assert!(
            !std::path::Path::new(&seg).exists(),
            "the next fabric removes the dead client's segment {seg}"
        );
    }
}

#[test]
fn garbage_on_the_wire_is_dropped_while_calls_complete() {
    let (_server, tcp, udp) = server_at("127.0.0.2");
    let (_fabric, nic) = nic_on("127.0.0.3:0", Engine::Inline);
    let ch = Channel::connect(&nic, tcp.as_str(), config()).unwrap();
    let junk = UdpSocket::bind("127.0.0.4:0").unwrap();
    let mine = nic.udp_addr().unwrap();
    let mut rsp = Vec::new();
    for i in 0..200u32 {
        let noise: Vec<u8> = (0..(i % 70) as usize).map(|k| (k as u32 * 13 + i) as u8).collect();
        junk.send_to(&noise, udp.as_str()).unwrap();
        junk.send_to(&noise, mine).unwrap();
        ch.call(ECHO, &i.to_le_bytes(), &mut rsp).unwrap();
        assert_eq!(rsp, i.to_le_bytes());
    }
    // Noise shaped like a RoCEv2 packet (a known opcode, room for its headers) from a source no
    // queue is connected to is dropped unread as a stranger's (`rx_ignored`); the rest fails to
    // decode (`rx_malformed`). Every datagram is one or the other.
    let dropped = |nic: &SimNic| {
        let s = nic.stats();
        s.rx_malformed + s.rx_ignored
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while dropped(&nic) < 200 {
        let s = nic.stats();
        assert!(
            Instant::now() < deadline,
            "garbage counted: {} malformed, {} ignored",
            s.rx_malformed,
            s.rx_ignored
        );
        std::thread::yield_now();
    }
}

#[test]
fn two_servers_and_several_clients_at_once() {
    several_at_once(["127.0.0.2:0", "127.0.0.5:0"], |c| format!("127.0.1.{}:0", c + 1));
}

#[test]
fn two_servers_and_several_clients_at_once_over_shared_memory() {
    several_at_once(["shm", "shm"], |_| "shm".to_string());
}

fn several_at_once(server_wires: [&str; 2], client_wire: fn(usize) -> String) {
    let servers = server_wires.map(server_on);
    let done = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..4)
        .map(|c| {
            let targets: Vec<String> = servers.iter().map(|s| s.1.clone()).collect();
            let done = done.clone();
            std::thread::spawn(move || {
                let (_fabric, nic) = nic_on(&client_wire(c), Engine::Inline);
                let chans: Vec<_> =
                    targets.iter().map(|t| Channel::connect(&nic, t.as_str(), config()).unwrap()).collect();
                let mut rsp = Vec::new();
                for i in 0..100u32 {
                    let ch = &chans[i as usize % chans.len()];
                    let msg = format!("client {c} call {i}");
                    ch.call(ECHO, msg.as_bytes(), &mut rsp).unwrap();
                    assert_eq!(rsp, msg.as_bytes());
                }
                done.fetch_add(1, Ordering::Relaxed);
            })
        })
        .collect();
    for t in threads {
        t.join().expect("a client thread failed");
    }
    assert_eq!(done.load(Ordering::Relaxed), 4);
}
