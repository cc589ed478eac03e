//! Issue 30 defect 1: peers that hold a server's control plane. Session frames (queue resets)
//! are read on the control loop as their bytes arrive, so peers that each send part of a frame
//! and stop delay nobody but themselves (each is closed when its frame's time is up), and a
//! connection's queue resets are counted against a budget (refused past it, with a reason
//! naming `ServerConfig::max_queue_resets`). The peers are raw queues that do the control-plane
//! handshake by hand and then write to their control stream directly.

use bypass::control::{self, ClientHello, QueueReset, QueueResetDone, CONTROL_VERSION, HEADER_LEN};
use bypass::hal::{Device, Queue, QueueConfig};
use bypass::sim::{Engine, Fabric, SimCq, SimQueue};
use bypass::{Server, ServerConfig};
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

mod common;
use common::helpers::{echo_functions, WAIT_LIMIT};
use common::ids::ECHO;

const NAME: &str = "stall";

/// A client of one raw queue whose handshake is done: its control stream and its queue.
struct RawPeer {
    stream: TcpStream,
    q: SimQueue,
    _cq: SimCq,
}

fn raw_peer(fabric: &Fabric, server: &Server<bypass::sim::SimNic>) -> RawPeer {
    let nic = fabric.add_nic();
    let cq = nic.create_cq(64).unwrap();
    let mut q = nic.create_queue(&QueueConfig::default(), &cq, &cq).unwrap();
    let hello = ClientHello {
        version: CONTROL_VERSION,
        server_name: NAME.into(),
        client_info: "raw".into(),
        window: 4,
        max_msg: 4096,
        keepalive: None,
        queues: vec![q.info()],
    };
    let (stream, sh) = control::connect(server.local_addr(), &hello, Duration::from_secs(10)).unwrap();
    q.connect(&sh.queues[0]).unwrap();
    stream.set_read_timeout(Some(WAIT_LIMIT)).unwrap();
    RawPeer { stream, q, _cq: cq }
}

impl RawPeer {
    fn reset_frame(&self, seq: u32) -> Vec<u8> {
        QueueReset { seq, queue: 0, info: self.q.info() }.encode().unwrap()
    }

    /// Sends a whole queue reset and reads the answer (bounded by the stream's read timeout).
    fn reset(&mut self, seq: u32) -> QueueResetDone {
        let frame = self.reset_frame(seq);
        self.stream.write_all(&frame).unwrap();
        let mut head = [0u8; HEADER_LEN];
        self.stream.read_exact(&mut head).expect("the server's answer");
        let len = u32::from_le_bytes([head[8], head[9], head[10], head[11]]) as usize;
        let mut answer = head.to_vec();
        answer.resize(HEADER_LEN + len, 0);
        self.stream.read_exact(&mut answer[HEADER_LEN..]).expect("the server's answer");
        let done = QueueResetDone::decode(&answer).unwrap();
        assert_eq!((done.seq, done.queue), (seq, 0));
        done
    }

    /// Whether the server has closed the stream (looked at without waiting).
    fn closed_by_server(&self) -> bool {
        self.stream.set_nonblocking(true).unwrap();
        let mut b = [0u8; 1];
        let closed = match self.stream.peek(&mut b) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) if e.kind() == ErrorKind::WouldBlock => false,
            Err(_) => true,
        };
        self.stream.set_nonblocking(false).unwrap();
        closed
    }
}

fn server(fabric: &Fabric, tweak: impl FnOnce(&mut ServerConfig)) -> Server<bypass::sim::SimNic> {
    let mut config = ServerConfig { workers: 1, keepalive: None, ..ServerConfig::new(NAME) };
    tweak(&mut config);
    Server::bind(&fabric.add_nic(), "127.0.0.1:0", config, echo_functions(ECHO)).unwrap()
}

/// Twenty peers each send the 12-byte header of a queue reset and nothing more (more than the
/// control loop has aside threads). A legitimate client's queue reset is answered while they
/// all still hold their half frames, and each of them is closed once its frame's time is up.
fn half_frames_stall_only_their_senders(engine: Engine) {
    let fabric = Fabric::new(engine);
    let server = server(&fabric, |_| {});
    let hostile: Vec<RawPeer> = (0..20).map(|_| raw_peer(&fabric, &server)).collect();
    for p in &hostile {
        let frame = p.reset_frame(7);
        (&p.stream).write_all(&frame[..HEADER_LEN]).unwrap();
    }
    let mut good = raw_peer(&fabric, &server);
    let done = good.reset(1);
    assert!(done.result.is_ok(), "{done:?}");
    // Answered before any half frame timed out (they would take 5 s): nobody waited for them.
    let closed = hostile.iter().filter(|p| p.closed_by_server()).count();
    assert_eq!(closed, 0, "the answer came only after {closed} stalling peers were given up on");
    // Each stalling peer is closed when its own frame's time runs out.
    let start = Instant::now();
    for (i, p) in hostile.iter().enumerate() {
        while !p.closed_by_server() {
            assert!(start.elapsed() < WAIT_LIMIT, "stalling peer {i} was never closed");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    assert_eq!(server.connections(), 1, "only the legitimate client is left");
    let done = good.reset(2);
    assert!(done.result.is_ok(), "{done:?}");
}

/// A connection that asks for queue resets past `ServerConfig::max_queue_resets` (per queue per
/// minute) is refused, with a reason naming the field, without the reset being done; it stays
/// connected.
fn queue_resets_past_the_budget_are_refused(engine: Engine) {
    let fabric = Fabric::new(engine);
    let server = server(&fabric, |c| c.max_queue_resets = 2);
    let mut peer = raw_peer(&fabric, &server);
    for seq in 0..2 {
        let done = peer.reset(seq);
        assert!(done.result.is_ok(), "reset {seq} is within the budget: {done:?}");
    }
    for seq in 2..5 {
        let done = peer.reset(seq);
        let reason = done.result.expect_err("past the budget");
        assert!(reason.contains("ServerConfig.max_queue_resets"), "{reason}");
        // One sentence a person reads: no runs of blanks left by a broken line continuation.
        assert!(!reason.contains("  ") && !reason.contains('\n'), "{reason:?}");
    }
    assert_eq!(server.connections(), 1);
    // Another connection has a budget of its own.
    let mut other = raw_peer(&fabric, &server);
    assert!(other.reset(0).result.is_ok());
}

common::per_engine!(half_frames_stall_only_their_senders, queue_resets_past_the_budget_are_refused);
