//! Bad input from a peer: malformed, truncated, misaddressed or stale messages are counted and
//! dropped, never panic, never complete the wrong call, and the connection keeps working. The
//! misbehaving peer is a raw HAL queue that does the control-plane handshake by hand.

use bypass::control::{self, ClientHello, ServerHello, CONTROL_VERSION};
use bypass::hal::{
    Access, Completion, CompletionQueue, CqOpcode, Device, MemoryRegion, Queue, QueueConfig, RecvWr, SendWr,
};
use bypass::sim::{Engine, Fabric, SimCq, SimNic, SimQueue, SimRegion};
use bypass::wire::{self, AckHeader, RequestHeader, ResponseHeader};
use bypass::{
    CallOptions, Channel, ChannelConfig, FunctionId, Functions, RpcError, Server, ServerConfig, Status,
};
use std::net::TcpListener;
use std::time::Duration;

mod common;
use common::ids::{ECHO, MISSING};

const MSG: usize = 4096;

/// One queue pair driven by hand.
struct Raw {
    nic: SimNic,
    cq: SimCq,
    q: SimQueue,
    mem: SimRegion,
}

impl Raw {
    fn new(nic: &SimNic) -> Raw {
        let cq = nic.create_cq(256).unwrap();
        let q = nic.create_queue(&QueueConfig::default(), &cq, &cq).unwrap();
        let mem = nic.register(64 * MSG, Access::LOCAL_WRITE).unwrap();
        Raw { nic: nic.clone(), cq, q, mem }
    }

    /// Posts receive buffers 32..64.
    fn post_recvs(&mut self) {
        for i in 32..64u64 {
            let sge = self.mem.sge(i as usize * MSG, MSG).unwrap();
            self.q.post_recv(&[RecvWr { wr_id: i, sges: &[sge] }]).unwrap();
        }
    }

    /// Sends `bytes` from send buffer `slot` (0..32).
    fn send(&mut self, slot: usize, bytes: &[u8]) {
        self.mem.write(slot * MSG, bytes).unwrap();
        let sge = self.mem.sge(slot * MSG, bytes.len()).unwrap();
        self.q.post_send(&[SendWr::send(slot as u64, &[sge])]).unwrap();
    }

    /// Waits for the next received message and returns its bytes (send completions skipped).
    fn recv(&mut self) -> Vec<u8> {
        let mut wc = [Completion::default(); 1];
        for _ in 0..10_000_000 {
            if self.cq.poll(&mut wc).unwrap() == 1 {
                let c = wc[0];
                assert!(c.status.is_ok(), "{c:?}");
                if c.opcode == CqOpcode::Recv {
                    let mut out = vec![0; c.byte_len as usize];
                    self.mem.read(c.wr_id as usize * MSG, &mut out).unwrap();
                    let sge = self.mem.sge(c.wr_id as usize * MSG, MSG).unwrap();
                    self.q.post_recv(&[RecvWr { wr_id: c.wr_id, sges: &[sge] }]).unwrap();
                    return out;
                }
            } else {
                self.nic.progress();
                std::thread::yield_now();
            }
        }
        panic!("nothing received");
    }
}

fn request(channel: u32, req_id: u32, function: FunctionId, args: &[u8]) -> Vec<u8> {
    let header = RequestHeader {
        arg_dma_count: 0,
        ack_requested: false,
        no_response: false,
        response_descriptor: false,
        function,
        total_size: 0,
        req_id,
        channel,
        function_defined: 0,
    };
    let mut out = vec![0; RequestHeader::LEN + args.len()];
    let n = wire::encode_request(&mut out, &header, &[], args).unwrap();
    out.truncate(n);
    out
}

fn echo_server(nic: &SimNic) -> Server<SimNic> {
    let mut functions = Functions::new();
    functions.register(ECHO, |req| {
        let args = req.args().to_vec();
        let _ = req.reply(&args);
    });
    Server::bind(nic, "127.0.0.1:0", ServerConfig::new("strict"), functions).unwrap()
}

#[test]
fn server_counts_and_drops_malformed_requests_and_keeps_serving() {
    let fabric = Fabric::new(Engine::Inline);
    let server = echo_server(&fabric.add_nic());
    let mut raw = Raw::new(&fabric.add_nic());
    let hello = ClientHello {
        version: CONTROL_VERSION,
        server_name: "strict".into(),
        client_info: "rogue".into(),
        window: 16,
        max_msg: MSG as u32,
        // A hand-driven client that never probes: it announces no keepalive.
        keepalive: None,
        queues: vec![raw.q.info()],
    };
    let (_stream, sh) = control::connect(server.local_addr(), &hello, Duration::from_secs(5)).unwrap();
    raw.q.connect(&sh.queues[0]).unwrap();
    raw.post_recvs();
    let ch = sh.channel_id;
    let good = request(ch, 1, ECHO, b"fine");
    let mut bad: Vec<Vec<u8>> = vec![
        vec![],           // empty
        vec![0x10, 0, 0], // shorter than a header
        {
            let mut b = good.clone();
            b[0] = 0x20; // version 2
            b
        },
        {
            let mut b = good.clone();
            b[0] = 0x17; // type 7
            b
        },
        {
            let mut b = good.clone();
            b[8] = 200; // total size says 200 bytes, 24 arrived
            b
        },
        good[..good.len() - 1].to_vec(),               // truncated
        [&good[..], &[0u8; 5][..]].concat(),           // trailing bytes
        request(ch ^ 0x55, 2, ECHO, b"other channel"), // misaddressed
        {
            let mut b = vec![0; 16];
            let h = ResponseHeader {
                ack: false,
                status: Status::Success,
                req_id_range: 1,
                req_id: 3,
                channel: ch,
                function_defined: 0,
                total_size: 16,
            };
            h.encode(&mut b).unwrap();
            b // a response sent to a server
        },
    ];
    let n_bad = bad.len() as u64;
    for (i, m) in bad.drain(..).enumerate() {
        raw.send(i, &m);
    }
    // The connection still works: an echo comes back, and an unknown function gets FUNCTION_ERR.
    raw.send(20, &good);
    raw.send(21, &request(ch, 9, MISSING, b""));
    let mut credits_back = 0u32;
    let mut answers = Vec::new();
    while answers.len() < 2 {
        let m = raw.recv();
        match wire::parse(&m).unwrap() {
            wire::Parsed::Ack(a) if a.is_credit_grant() => credits_back += a.req_id,
            wire::Parsed::Response(r) => answers.push((r.header.req_id, r.header.status, r.data.to_vec())),
            other => panic!("unexpected {other:?}"),
        }
    }
    answers.sort_by_key(|a| a.0);
    assert_eq!(answers[0], (1, Status::Success, b"fine".to_vec()));
    assert_eq!(answers[1], (9, Status::FunctionErr, vec![]));
    let s = server.stats();
    assert_eq!(s.protocol_errors, n_bad, "{s:?}");
    // Every dropped message still returns its credit (grants may still be on their way).
    while credits_back < n_bad as u32 {
        let m = raw.recv();
        let a = AckHeader::decode(&m).unwrap();
        assert!(a.is_credit_grant());
        credits_back += a.req_id;
    }
    assert_eq!(credits_back, n_bad as u32);

    // A well-behaved client on the same server is unaffected.
    let good_client =
        Channel::connect(&fabric.add_nic(), server.local_addr(), ChannelConfig::new("strict")).unwrap();
    let mut resp = Vec::new();
    good_client.call(ECHO, b"still here", &mut resp).unwrap();
    assert_eq!(resp, b"still here");
}

#[test]
fn client_counts_and_drops_bad_responses_and_completes_the_call_once() {
    let fabric = Fabric::new(Engine::Inline);
    let server_nic = fabric.add_nic();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let rogue = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        let mut raw = Raw::new(&server_nic);
        let info = raw.q.info();
        let mut client_queue = None;
        control::accept(&mut stream, "rogue", Duration::from_secs(5), |hello| {
            client_queue = Some(hello.queues[0]);
            Ok(ServerHello {
                version: CONTROL_VERSION,
                server_name: "rogue".into(),
                channel_id: 77,
                credits: 8,
                max_msg: MSG as u32,
                queues: vec![info],
            })
        })
        .unwrap();
        raw.q.connect(&client_queue.unwrap()).unwrap();
        raw.post_recvs();
        let req = raw.recv();
        let wire::Parsed::Request(r) = wire::parse(&req).unwrap() else { panic!("not a request") };
        let id = r.header.req_id;
        let rsp = |req_id: u32, channel: u32, data: &[u8]| {
            let h = ResponseHeader {
                ack: false,
                status: Status::Success,
                req_id_range: 1,
                req_id,
                channel,
                function_defined: 0,
                total_size: 0,
            };
            let mut out = vec![0; 16 + data.len()];
            wire::encode_response(&mut out, &h, data).unwrap();
            out
        };
        let mut garbage = vec![
            vec![0xFF; 7],                         // nonsense
            rsp(id, 78, b"wrong channel"),         // misaddressed
            rsp(id.wrapping_add(5), 77, b"stale"), // no such request
            {
                let mut m = rsp(id, 77, b"truncated");
                m.pop();
                m
            },
            {
                let mut m = vec![0; 12];
                AckHeader::new(id, 77).encode(&mut m).unwrap();
                m // an ACK for a call that did not ask for one
            },
        ];
        for (i, m) in garbage.drain(..).enumerate() {
            raw.send(i, &m);
        }
        raw.send(10, &rsp(id, 77, b"the answer"));
        raw.send(11, &rsp(id, 77, b"a duplicate"));
        // Keep the connection open until the client is done.
        let mut buf = [0u8; 1];
        let _ = std::io::Read::read(&mut stream, &mut buf);
    });
    let client_nic = fabric.add_nic();
    let config = ChannelConfig { timeout: Some(Duration::from_secs(20)), ..ChannelConfig::new("rogue") };
    let channel = Channel::connect(&client_nic, addr, config).unwrap();
    let mut resp = Vec::new();
    channel.call_with(&CallOptions::default(), ECHO, b"question", &mut resp).unwrap();
    assert_eq!(resp, b"the answer");
    // Let the duplicate arrive too.
    for _ in 0..100_000 {
        if channel.stats().stale >= 2 {
            break;
        }
        channel.poll();
        client_nic.progress();
    }
    let s = channel.stats();
    assert!(s.protocol_errors >= 3, "nonsense, wrong channel, truncated: {s:?}");
    assert!(s.stale >= 2, "the stale response and the duplicate: {s:?}");
    assert_eq!((s.tx_in_use, s.table_in_use), (0, 0), "{s:?}");
    channel.close();
    rogue.join().unwrap();
    assert!(matches!(channel.call(ECHO, b"", &mut resp), Err(RpcError::Closed)));
}
