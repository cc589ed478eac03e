//! Rendezvous: arguments above the eager size travel as URPC DMA descriptors the server pulls
//! with RDMA READ; large responses are RDMA-written into a response buffer the client named.
//! On the simulator, Inline and Threaded engines. Every wait is bounded (call deadlines, or a
//! spin with a deadline); nothing sleeps.

use bypass::control::{self, ClientHello, CONTROL_VERSION};
use bypass::hal::{
    Completion, CompletionQueue, CqOpcode, Device, MemoryRegion, Queue, QueueConfig, RecvWr, SendWr,
};
use bypass::sim::{Engine, Fabric, SimNic};
use bypass::wire::{self, DmaDescriptor, RequestHeader};
use bypass::*;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

type Region = <SimNic as Device>::Region;

mod common;
// ECHO here echoes zero-copy from the gathered buffer when it can; HOLD holds the request for a
// while without answering (drops it on the next call).
use common::ids::{fid, ECHO, HOLD};

/// Answers `[is_rendezvous, segment count, then u32 length and u32 checksum per segment]`.
const SHAPE: FunctionId = fid(20);
/// Answers `n` bytes of pattern, `n` = the u64 argument (from a copy: `reply`).
const MAKE: FunctionId = fid(21);
const NAME: &str = "rndv";
const LIMIT: Duration = Duration::from_secs(30);

/// `len` bytes no two calls share (position- and seed-dependent), 8 at a time.
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    let mut v = vec![0u8; len];
    for (i, c) in v.chunks_mut(8).enumerate() {
        let x = (i as u64 ^ (u64::from(seed) << 56)).wrapping_mul(0x9E37_79B9_7F4A_7C15).to_le_bytes();
        c.copy_from_slice(&x[..c.len()]);
    }
    v
}

fn checksum(b: &[u8]) -> u32 {
    b.iter().fold(0x811c_9dc5u32, |h, &x| (h ^ u32::from(x)).wrapping_mul(0x0100_0193))
}

/// The shared rig serving [`functions`] (or the test's own), 64 MiB of rendezvous memory and
/// call deadlines of [`LIMIT`].
struct Rig(common::rig::Rig);

impl std::ops::Deref for Rig {
    type Target = common::rig::Rig;
    fn deref(&self) -> &common::rig::Rig {
        &self.0
    }
}

fn functions(held: Arc<std::sync::Mutex<Option<Request<SimNic>>>>) -> Functions<SimNic> {
    let mut f = Functions::new();
    f.register(ECHO, |req| {
        let n = req.args().len();
        let _ = req.reply_args(n);
    });
    f.register(SHAPE, |req| {
        let mut out = vec![u8::from(req.is_rendezvous())];
        let segs: Vec<&[u8]> = req.segments().collect();
        out.push(segs.len() as u8);
        for s in segs {
            out.extend_from_slice(&(s.len() as u32).to_le_bytes());
            out.extend_from_slice(&checksum(s).to_le_bytes());
        }
        out.extend_from_slice(&checksum(req.args()).to_le_bytes());
        let _ = req.reply(&out);
    });
    f.register(MAKE, |req| {
        let n = u64::from_le_bytes(req.args()[..8].try_into().unwrap()) as usize;
        let _ = req.reply(&pattern(n, 7));
    });
    f.register(HOLD, move |req| {
        let old = held.lock().unwrap().replace(req);
        drop(old);
    });
    f
}

impl Rig {
    fn new(engine: Engine, scfg: impl FnOnce(&mut ServerConfig), f: Option<Functions<SimNic>>) -> Rig {
        Rig(common::rig::Rig::build(engine, |s| {
            s.server = ServerConfig::new(NAME);
            s.server.rndv_memory_limit = 64 << 20;
            scfg(&mut s.server);
            s.functions = f.unwrap_or_else(|| functions(Default::default()));
            s.channel = ChannelConfig { timeout: Some(LIMIT), ..ChannelConfig::new(NAME) };
        }))
    }

    /// Spins (bounded) until the server has given back all its rendezvous memory.
    fn server_settles(&self) {
        let start = Instant::now();
        while self.server.rndv_stats().bytes_in_use != 0 {
            assert!(
                start.elapsed() < LIMIT,
                "the server kept {} bytes",
                self.server.rndv_stats().bytes_in_use
            );
            self.fabric.progress();
            self.channel.poll();
            std::thread::yield_now();
        }
    }

    fn balanced(&self) {
        self.server_settles();
        assert_eq!(self.channel.rndv_in_use(), 0, "client rendezvous memory leaked");
        // A call completes at its response; its request's send context is free once the send
        // completion (the transport ACK of the request) is polled too, which may come later.
        let start = Instant::now();
        while self.channel.stats().tx_in_use != 0 {
            assert!(start.elapsed() < LIMIT, "a send context was never released");
            self.fabric.progress();
            self.channel.poll();
            std::thread::yield_now();
        }
    }
}

fn engines() -> [Engine; 2] {
    [Engine::Inline, Engine::Threaded]
}

fn echo(ch: &Channel<SimNic>, args: &[u8]) -> Result<Vec<u8>, RpcError> {
    let opts = CallOptions { max_response: args.len(), ..Default::default() };
    let mut out = Vec::new();
    ch.call_with(&opts, ECHO, args, &mut out).map(|_| out)
}

#[test]
fn echo_keeps_every_byte_from_1_byte_to_16_mib_across_the_eager_limit() {
    for engine in engines() {
        let rig = Rig::new(engine, |_| {}, None);
        let eager = rig.channel.max_request_args();
        for (i, len) in [1, 100, eager - 1, eager, eager + 1, 3 * eager + 7, 1 << 20, (16 << 20) + 5]
            .into_iter()
            .enumerate()
        {
            let args = pattern(len, i as u8);
            let got = echo(&rig.channel, &args).unwrap_or_else(|e| panic!("{engine:?} {len}: {e}"));
            assert_eq!(got.len(), len, "{engine:?} {len}");
            assert!(got == args, "{engine:?}: {len} bytes came back different");
        }
        let s = rig.server.rndv_stats();
        assert!(s.requests >= 4, "{s:?}");
        assert!(s.bytes_read >= (17 << 20) as u64, "{s:?}");
        assert!(s.bytes_written >= (17 << 20) as u64, "{s:?}");
        assert_eq!((s.refused, s.failed), (0, 0), "{s:?}");
        rig.balanced();
    }
}

#[test]
fn small_arguments_can_be_forced_to_rendezvous() {
    for engine in engines() {
        let rig = Rig::new(engine, |_| {}, None);
        let args = pattern(10, 1);
        let mut out = Vec::new();
        rig.channel.call_with(&CallOptions::default(), SHAPE, &args, &mut out).unwrap();
        assert_eq!(out[0], 0, "eager by default");
        let forced = CallOptions { rendezvous: true, ..Default::default() };
        rig.channel.call_with(&forced, SHAPE, &args, &mut out).unwrap();
        assert_eq!(out[0], 1, "{engine:?}: forced rendezvous");
        assert_eq!(out[1], 1, "one segment");
        assert_eq!(u32::from_le_bytes(out[2..6].try_into().unwrap()), 10);
        assert_eq!(u32::from_le_bytes(out[6..10].try_into().unwrap()), checksum(&args));
        assert_eq!(rig.server.rndv_stats().requests, 1);
        rig.balanced();
    }
}

#[test]
fn a_large_response_is_written_into_the_callers_buffer() {
    for engine in engines() {
        let rig = Rig::new(engine, |_| {}, None);
        for n in [0usize, 5, 5000, 3 << 20] {
            let opts = CallOptions { max_response: 4 << 20, ..Default::default() };
            let mut out = Vec::new();
            rig.channel.call_with(&opts, MAKE, &(n as u64).to_le_bytes(), &mut out).unwrap();
            assert!(out == pattern(n, 7), "{engine:?}: {n}-byte response");
        }
        // Larger than the buffer named: REMOTE_LEN_ERR, nothing leaked.
        let opts = CallOptions { max_response: 1 << 20, ..Default::default() };
        let mut out = vec![1];
        let e = rig.channel.call_with(&opts, MAKE, &(2u64 << 20).to_le_bytes(), &mut out).unwrap_err();
        assert!(matches!(e, RpcError::Status(Status::RemoteLenErr)), "{e}");
        assert!(out.is_empty());
        // No buffer named at all: the same status, as before rendezvous existed.
        let e = rig.channel.call(MAKE, &(1u64 << 20).to_le_bytes(), &mut out).unwrap_err();
        assert!(matches!(e, RpcError::Status(Status::RemoteLenErr)), "{e}");
        rig.balanced();
    }
}

#[test]
fn up_to_31_registered_segments_are_gathered_in_order() {
    for engine in engines() {
        let rig = Rig::new(engine, |_| {}, None);
        let mut regions: Vec<Arc<Region>> = Vec::new();
        let mut all = Vec::new();
        for i in 0..32usize {
            let len = 1 + i * 997;
            let bytes = pattern(len, i as u8);
            let mut r = rig.cnic.register(len + 8, Access::REMOTE_READ | Access::LOCAL_WRITE).unwrap();
            r.write(8, &bytes).unwrap();
            regions.push(Arc::new(r));
            all.push(bytes);
        }
        let ranges: Vec<LocalRange<'_, Region>> =
            regions.iter().zip(&all).map(|(r, b)| LocalRange::new(r, 8, b.len())).collect();
        let mut out = Vec::new();
        rig.channel.call_segments_with(&CallOptions::default(), SHAPE, &ranges[..31], &mut out).unwrap();
        assert_eq!((out[0], out[1]), (1, 31), "{engine:?}");
        for (i, b) in all[..31].iter().enumerate() {
            let at = 2 + i * 8;
            assert_eq!(u32::from_le_bytes(out[at..at + 4].try_into().unwrap()) as usize, b.len());
            assert_eq!(
                u32::from_le_bytes(out[at + 4..at + 8].try_into().unwrap()),
                checksum(b),
                "segment {i}"
            );
        }
        let gathered: Vec<u8> = all[..31].concat();
        assert_eq!(u32::from_le_bytes(out[out.len() - 4..].try_into().unwrap()), checksum(&gathered));
        let e =
            rig.channel.call_segments_with(&CallOptions::default(), SHAPE, &ranges, &mut out).unwrap_err();
        assert!(matches!(e, RpcError::InvalidArgument(_)), "32 segments: {e}");
        // A region the server may not READ is refused before anything is sent.
        let private = Arc::new(rig.cnic.register(64, Access::LOCAL_WRITE).unwrap());
        let e = rig
            .channel
            .call_segments_with(&CallOptions::default(), SHAPE, &[LocalRange::whole(&private)], &mut out)
            .unwrap_err();
        assert!(matches!(e, RpcError::InvalidArgument(_)), "{e}");
        rig.balanced();
    }
}

#[test]
fn arguments_above_the_servers_limit_get_remote_len_err_and_nothing_is_allocated() {
    for engine in engines() {
        let rig = Rig::new(engine, |c| c.rndv_memory_limit = 1 << 20, None);
        let e = echo(&rig.channel, &pattern((1 << 20) + 1, 3)).unwrap_err();
        assert!(matches!(e, RpcError::Status(Status::RemoteLenErr)), "{engine:?}: {e}");
        let s = rig.server.rndv_stats();
        assert_eq!((s.refused, s.bytes_read), (1, 0), "{s:?}");
        // The connection goes on: a call that fits works.
        assert_eq!(echo(&rig.channel, &pattern(1 << 19, 4)).unwrap(), pattern(1 << 19, 4));
        rig.balanced();
    }
}

#[test]
fn concurrent_calls_wait_for_memory_under_the_limit_and_all_succeed() {
    for engine in engines() {
        // Each call needs 1 MiB (a power-of-two pool class); two fit at once.
        let rig = Rig::new(engine, |c| c.rndv_memory_limit = 2 << 20, None);
        let threads: Vec<_> = (0..4u8)
            .map(|t| {
                let ch = rig.channel.clone();
                std::thread::spawn(move || {
                    for k in 0..3u8 {
                        let args = pattern((1 << 20) - 100, t * 16 + k);
                        let mut out = Vec::new();
                        let opts = CallOptions::default();
                        ch.call_with(&opts, SHAPE, &args, &mut out).unwrap();
                        assert_eq!(
                            u32::from_le_bytes(out[out.len() - 4..].try_into().unwrap()),
                            checksum(&args)
                        );
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let s = rig.server.rndv_stats();
        assert_eq!((s.requests, s.refused, s.failed), (12, 0, 0), "{engine:?} {s:?}");
        rig.balanced();
    }
}

#[test]
fn outstanding_reads_never_exceed_max_rd_atomic() {
    for (engine, rd) in
        [(Engine::Inline, 1u8), (Engine::Threaded, 1), (Engine::Inline, 4), (Engine::Threaded, 2)]
    {
        let rig = Rig::new(engine, |c| c.queue_config.max_rd_atomic = rd, None);
        // 4 MiB in 256 KiB READs: 16 of them, queued behind the limit.
        let args = pattern(4 << 20, rd);
        assert!(echo(&rig.channel, &args).unwrap() == args, "{engine:?} rd {rd}");
        let peak = rig.server.rndv_stats().peak_reads;
        assert!(
            (1..=u64::from(rd)).contains(&peak),
            "{engine:?}: {peak} READs in flight with max_rd_atomic {rd}"
        );
        rig.balanced();
    }
}

#[test]
fn rendezvous_needs_a_mode_with_a_response() {
    let rig = Rig::new(Engine::Inline, |_| {}, None);
    let big = pattern(rig.channel.max_request_args() + 1, 0);
    for mode in [CallMode::EarlyRsp, CallMode::AckEarlyRsp] {
        // Too large for a message, as without rendezvous; forcing it is refused.
        let e = rig.channel.call_with(&CallOptions::mode(mode), ECHO, &big, &mut Vec::new()).unwrap_err();
        assert!(matches!(e, RpcError::TooLarge { .. }), "{mode:?}: {e}");
        let forced = CallOptions { rendezvous: true, ..CallOptions::mode(mode) };
        let e = rig.channel.call_with(&forced, ECHO, b"small", &mut Vec::new()).unwrap_err();
        assert!(matches!(e, RpcError::InvalidArgument(_)), "{mode:?}: {e}");
    }
    // ACK mode works, and says it was acknowledged.
    let opts = CallOptions { max_response: big.len(), ..CallOptions::mode(CallMode::Ack) };
    let mut out = Vec::new();
    let info = rig.channel.call_with(&opts, ECHO, &big, &mut out).unwrap();
    assert!(info.acked && out == big);
    rig.balanced();
}

#[test]
fn a_timed_out_rendezvous_call_frees_its_memory_once_the_server_answers() {
    for engine in engines() {
        let held = Arc::new(std::sync::Mutex::new(None));
        let rig = Rig::new(engine, |_| {}, Some(functions(held.clone())));
        let opts = CallOptions {
            timeout: Some(Duration::from_millis(200)),
            max_response: 1 << 20,
            ..Default::default()
        };
        let e = rig.channel.call_with(&opts, HOLD, &pattern(100_000, 1), &mut Vec::new()).unwrap_err();
        assert!(matches!(e, RpcError::Timeout), "{e}");
        // The server still holds the request and may write the response buffer: the memory is
        // quarantined, not freed, until the server answers.
        assert!(rig.channel.rndv_quarantined() > 0, "{engine:?}: the timed-out call's memory is kept");
        // The held request is answered late: its server memory goes back, and the late answer
        // (counted stale) frees the client's.
        held.lock().unwrap().take().expect("held").reply(b"late").expect("reply");
        let start = Instant::now();
        while rig.channel.rndv_quarantined() != 0 {
            assert!(start.elapsed() < LIMIT, "{engine:?}: the late answer did not free the quarantine");
            rig.fabric.progress();
            rig.channel.poll();
            std::thread::yield_now();
        }
        rig.balanced();
    }
}

/// A user allocator: regions registered on the server's NIC, counted.
struct Counting {
    nic: SimNic,
    allocs: AtomicUsize,
    frees: AtomicUsize,
    bytes: AtomicU64,
}

impl RndvAllocator<Region> for Counting {
    fn allocate(&self, len: usize) -> Option<RndvBuf<Region>> {
        let region = Arc::new(self.nic.register(len.max(1), Access::LOCAL_WRITE).ok()?);
        self.allocs.fetch_add(1, Ordering::SeqCst);
        self.bytes.fetch_add(len as u64, Ordering::SeqCst);
        Some(RndvBuf { region, offset: 0, len })
    }
    fn free(&self, buf: RndvBuf<Region>) {
        self.frees.fetch_add(1, Ordering::SeqCst);
        self.bytes.fetch_sub(buf.len as u64, Ordering::SeqCst);
    }
}

#[test]
fn a_caller_provided_allocator_gets_every_buffer_back() {
    for engine in engines() {
        let fabric = Fabric::new(engine);
        let (snic, cnic) = (fabric.add_nic(), fabric.add_nic());
        let alloc =
            Arc::new(Counting { nic: snic.clone(), allocs: 0.into(), frees: 0.into(), bytes: 0.into() });
        let mut f = functions(Default::default());
        f.rndv_allocator(alloc.clone());
        let server = Server::bind(&snic, "127.0.0.1:0", ServerConfig::new(NAME), f).unwrap();
        let mut ccfg = ChannelConfig::new(NAME);
        ccfg.timeout = Some(LIMIT);
        let channel = Channel::connect(&cnic, server.local_addr(), ccfg).unwrap();
        for len in [10_000usize, 1 << 20] {
            let args = pattern(len, 9);
            assert!(echo(&channel, &args).unwrap() == args);
        }
        // MAKE stages its copied response in allocator memory too.
        let opts = CallOptions { max_response: 1 << 20, ..Default::default() };
        let mut out = Vec::new();
        channel.call_with(&opts, MAKE, &(300_000u64).to_le_bytes(), &mut out).unwrap();
        assert!(out == pattern(300_000, 7));
        let start = Instant::now();
        while alloc.frees.load(Ordering::SeqCst) != alloc.allocs.load(Ordering::SeqCst) {
            assert!(start.elapsed() < LIMIT, "buffers not freed");
            fabric.progress();
            std::thread::yield_now();
        }
        assert_eq!(alloc.allocs.load(Ordering::SeqCst), 3, "{engine:?}");
        assert_eq!(alloc.bytes.load(Ordering::SeqCst), 0);
        assert_eq!(server.rndv_stats().bytes_in_use, 0);
    }
}

#[test]
fn server_config_validates_the_rendezvous_limit() {
    let fabric = Fabric::new(Engine::Inline);
    let nic = fabric.add_nic();
    let cfg = ServerConfig { rndv_memory_limit: 100, ..ServerConfig::new(NAME) };
    let e = cfg.validate(&nic.caps()).unwrap_err();
    assert!(e.to_string().contains("ServerConfig.rndv_memory_limit"), "{e}");
    let cfg = ServerConfig { rndv_memory_limit: 0, ..ServerConfig::new(NAME) };
    cfg.validate(&nic.caps()).unwrap();
}

#[test]
fn a_server_with_rendezvous_disabled_refuses_it_clearly() {
    let rig = Rig::new(Engine::Inline, |c| c.rndv_memory_limit = 0, None);
    let e = echo(&rig.channel, &pattern(10_000, 1)).unwrap_err();
    assert!(matches!(e, RpcError::Status(Status::RemoteLenErr)), "{e}");
    assert_eq!(echo(&rig.channel, b"small").unwrap(), b"small");
    rig.balanced();
}

/// 256 MiB there and back (release builds only: the simulated NIC moves every 4 KiB packet).
#[test]
#[cfg_attr(debug_assertions, ignore = "256 MiB through the simulator is slow unoptimised")]
fn quarter_gib_echo() {
    big_echo(256 << 20);
}

/// 1 GiB there and back. Ignored by default: about 15 s on a 2 vCPU VM, most of it page faults
/// of four fresh 1 GiB buffers (the test's, the client's registered region, the server's gather
/// buffer, the response `Vec`). `cargo test --release --test rendezvous -- --ignored`.
#[test]
#[ignore = "15 s on a 2 vCPU VM: run with --ignored"]
fn one_gib_echo() {
    big_echo(1 << 30);
}

fn big_echo(len: usize) {
    let rig = Rig::new(Engine::Inline, |c| c.rndv_memory_limit = 1 << 30, None);
    let args = pattern(len, 0x5a);
    let got = echo(&rig.channel, &args).unwrap();
    assert_eq!(got.len(), len);
    assert!(got == args, "1 GiB came back different");
    drop((got, args));
    rig.balanced();
}

// ---- a peer that sends descriptors by hand ----

const MSG: usize = 4096;

struct Raw {
    nic: SimNic,
    cq: <SimNic as Device>::Cq,
    q: <SimNic as Device>::Queue,
    mem: Region,
}

impl Raw {
    fn new(nic: &SimNic) -> Raw {
        let cq = nic.create_cq(256).unwrap();
        let q = nic.create_queue(&QueueConfig::default(), &cq, &cq).unwrap();
        let mem = nic.register(64 * MSG, Access::LOCAL_WRITE | Access::REMOTE_READ).unwrap();
        Raw { nic: nic.clone(), cq, q, mem }
    }

    fn send(&mut self, slot: usize, bytes: &[u8]) {
        self.mem.write(slot * MSG, bytes).unwrap();
        let sge = self.mem.sge(slot * MSG, bytes.len()).unwrap();
        self.q.post_send(&[SendWr::send(slot as u64, &[sge])]).unwrap();
    }

    /// The next received message, or `None` once the queue failed.
    fn recv(&mut self) -> Option<Vec<u8>> {
        let mut wc = [Completion::default(); 1];
        let start = Instant::now();
        while start.elapsed() < LIMIT {
            if self.cq.poll(&mut wc).unwrap() == 1 {
                let c = wc[0];
                if !c.status.is_ok() {
                    return None;
                }
                if c.opcode == CqOpcode::Recv {
                    let mut out = vec![0; c.byte_len as usize];
                    self.mem.read(c.wr_id as usize * MSG, &mut out).unwrap();
                    let sge = self.mem.sge(c.wr_id as usize * MSG, MSG).unwrap();
                    self.q.post_recv(&[RecvWr { wr_id: c.wr_id, sges: &[sge] }]).unwrap();
                    return Some(out);
                }
            } else {
                self.nic.progress();
                std::thread::yield_now();
            }
        }
        panic!("nothing received");
    }
}

fn raw_request(channel: u32, req_id: u32, descs: &[DmaDescriptor]) -> Vec<u8> {
    let header = RequestHeader {
        arg_dma_count: 0,
        ack_requested: false,
        no_response: false,
        response_descriptor: false,
        function: SHAPE,
        total_size: 0,
        req_id,
        channel,
        function_defined: 0,
    };
    let mut out = vec![0; 1024];
    let n = wire::encode_request(&mut out, &header, descs, &[]).unwrap();
    out.truncate(n);
    out
}

#[test]
fn descriptors_from_a_rogue_peer_get_error_statuses_and_leak_nothing() {
    let fabric = Fabric::new(Engine::Inline);
    let snic = fabric.add_nic();
    let mut cfg = ServerConfig::new(NAME);
    cfg.rndv_memory_limit = 1 << 20;
    let server = Server::bind(&snic, "127.0.0.1:0", cfg, functions(Default::default())).unwrap();
    let mut raw = Raw::new(&fabric.add_nic());
    let hello = ClientHello {
        version: CONTROL_VERSION,
        server_name: NAME.into(),
        client_info: "rogue".into(),
        window: 16,
        max_msg: MSG as u32,
        // A hand-driven client that never probes: it announces no keepalive.
        keepalive: None,
        queues: vec![raw.q.info()],
    };
    let (_stream, sh) = control::connect(server.local_addr(), &hello, Duration::from_secs(5)).unwrap();
    raw.q.connect(&sh.queues[0]).unwrap();
    for i in 32..64u64 {
        let sge = raw.mem.sge(i as usize * MSG, MSG).unwrap();
        raw.q.post_recv(&[RecvWr { wr_id: i, sges: &[sge] }]).unwrap();
    }
    let ch = sh.channel_id;
    let base = raw.mem.addr();
    let token = raw.mem.remote_key().rkey();
    raw.mem.write(10 * MSG, b"hello rendezvous").unwrap();
    let good = DmaDescriptor { size: 16, address: base + (10 * MSG) as u64, token };
    let mut expect = |req_id: u32, descs: &[DmaDescriptor], status: Status| {
        raw.send(req_id as usize, &raw_request(ch, req_id, descs));
        let m = raw.recv().expect("an answer");
        match wire::parse(&m).unwrap() {
            wire::Parsed::Response(r) => {
                assert_eq!((r.header.req_id, r.header.status), (req_id, status), "{descs:?}");
            }
            other => panic!("unexpected {other:?}"),
        }
    };
    // A good descriptor works.
    expect(1, &[good], Status::Success);
    // A huge size: refused before any allocation.
    expect(2, &[DmaDescriptor { size: u32::MAX, ..good }], Status::RemoteLenErr);
    expect(3, &[good; 31].map(|d| DmaDescriptor { size: 40_000, ..d }), Status::RemoteLenErr);
    // An empty descriptor, a range that wraps around: HDR_ERR.
    expect(4, &[DmaDescriptor { size: 0, ..good }], Status::HdrErr);
    expect(5, &[DmaDescriptor { address: u64::MAX - 4, ..good }], Status::HdrErr);
    assert_eq!(server.rndv_stats().refused, 4);
    // A bad key: the READ fails, which fails the queue (RC): the peer's queue fails too, and the
    // server frees everything the request held.
    raw.send(6, &raw_request(ch, 6, &[DmaDescriptor { token: token ^ 0x5555, ..good }]));
    assert!(raw.recv().is_none(), "the queue fails");
    let start = Instant::now();
    while server.rndv_stats().failed == 0 || server.rndv_stats().bytes_in_use != 0 {
        assert!(start.elapsed() < LIMIT, "{:?}", server.rndv_stats());
        fabric.progress();
        std::thread::yield_now();
    }
    // The server goes on serving others.
    let ccfg = ChannelConfig { timeout: Some(LIMIT), ..ChannelConfig::new(NAME) };
    let channel = Channel::connect(&fabric.add_nic(), server.local_addr(), ccfg).unwrap();
    assert!(echo(&channel, &pattern(200_000, 2)).unwrap() == pattern(200_000, 2));
    assert_eq!(channel.rndv_in_use(), 0);
}

// ---- an allocator that refuses ----

/// A user allocator (regions on the server's NIC) that refuses the next `refuse` allocations.
struct Refusing {
    /// The server's NIC, set once the rig has it (before any call).
    nic: OnceLock<SimNic>,
    refuse: AtomicUsize,
    allocs: AtomicUsize,
    frees: AtomicUsize,
}

impl Refusing {
    fn new() -> Arc<Refusing> {
        Arc::new(Refusing { nic: OnceLock::new(), refuse: 0.into(), allocs: 0.into(), frees: 0.into() })
    }
}

impl RndvAllocator<Region> for Refusing {
    fn allocate(&self, len: usize) -> Option<RndvBuf<Region>> {
        if self.refuse.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok() {
            return None;
        }
        let region = Arc::new(self.nic.get()?.register(len.max(1), Access::LOCAL_WRITE).ok()?);
        self.allocs.fetch_add(1, Ordering::SeqCst);
        Some(RndvBuf { region, offset: 0, len })
    }
    fn free(&self, _: RndvBuf<Region>) {
        self.frees.fetch_add(1, Ordering::SeqCst);
    }
}

/// Every engine with every server poll mode: the refusal tests race the worker's wake-ups.
fn engine_modes() -> impl Iterator<Item = (Engine, PollMode)> {
    engines().into_iter().flat_map(|e| [PollMode::Event, PollMode::Adaptive, PollMode::Busy].map(|m| (e, m)))
}

/// The shared rig whose server's rendezvous memory comes from a [`Refusing`] allocator, under a
/// limit of `rndv_memory_limit` bytes (the held request drops first, then the rig: channel
/// first).
struct RefusalRig {
    held: Arc<std::sync::Mutex<Option<Request<SimNic>>>>,
    rig: common::rig::Rig,
    alloc: Arc<Refusing>,
    label: String,
}

impl std::ops::Deref for RefusalRig {
    type Target = common::rig::Rig;
    fn deref(&self) -> &common::rig::Rig {
        &self.rig
    }
}

impl RefusalRig {
    fn new(engine: Engine, mode: PollMode, rndv_memory_limit: u64, round: u8) -> RefusalRig {
        let alloc = Refusing::new();
        let held = Arc::new(std::sync::Mutex::new(None));
        let rig = common::rig::Rig::build(engine, |s| {
            let mut f = functions(held.clone());
            f.rndv_allocator(alloc.clone());
            s.functions = f;
            s.server = ServerConfig { rndv_memory_limit, mode, ..ServerConfig::new(NAME) };
            s.channel = ChannelConfig { timeout: Some(LIMIT), ..ChannelConfig::new(NAME) };
        });
        assert!(alloc.nic.set(rig.snic.clone()).is_ok());
        RefusalRig { held, rig, alloc, label: format!("{engine:?} {mode:?} round {round}") }
    }

    /// Drives both sides until `cond` holds; gives up after [`LIMIT`].
    fn wait(&self, what: &str, cond: &dyn Fn() -> bool) {
        let start = Instant::now();
        while !cond() {
            assert!(start.elapsed() < LIMIT, "{}: gave up waiting for {what}", self.label);
            self.fabric.progress();
            self.channel.poll();
            std::thread::yield_now();
        }
    }
}

type Outcome = Arc<std::sync::Mutex<Option<Result<Vec<u8>, String>>>>;

fn start(ch: &Channel<SimNic>, f: FunctionId, args: &[u8]) -> Outcome {
    start_with(ch, &CallOptions::default(), f, args)
}

fn start_with(ch: &Channel<SimNic>, opts: &CallOptions, f: FunctionId, args: &[u8]) -> Outcome {
    let out: Outcome = Arc::default();
    let o = out.clone();
    ch.call_callback(opts, f, args, move |r| {
        *o.lock().unwrap() = Some(r.map(<[u8]>::to_vec).map_err(|e| format!("{e:?}")));
    })
    .unwrap();
    out
}

/// Requests queued for rendezvous memory, the first of which the allocator then refuses: that
/// one call ends at once with SERVER_DECLINE, and the one behind it gets its memory and
/// completes, without another call arriving to move things on.
#[test]
fn a_refused_allocation_ends_its_call_and_the_next_waiting_request_goes_on() {
    for (engine, mode) in engine_modes() {
        for round in 0..20u8 {
            // Room for one request's arguments at a time.
            let rig = RefusalRig::new(engine, mode, 1 << 20, round);
            let (alloc, held, server, channel) = (&rig.alloc, &rig.held, &rig.server, &rig.channel);
            let wait = |what: &str, cond: &dyn Fn() -> bool| rig.wait(what, cond);
            let (a_args, b_args, c_args) = (pattern(600_000, 1), pattern(600_000, 2), pattern(600_000, 3));
            let a = start(channel, HOLD, &a_args);
            wait("the server to hold A", &|| held.lock().unwrap().is_some());
            let b = start(channel, SHAPE, &b_args);
            wait("B to wait for memory", &|| server.rndv_stats().waited == 1);
            let c = start(channel, SHAPE, &c_args);
            wait("C to wait for memory", &|| server.rndv_stats().waited == 2);
            alloc.refuse.store(1, Ordering::SeqCst);
            // A is answered from this thread; its memory goes back.
            let req: Request<SimNic> = held.lock().unwrap().take().unwrap();
            req.reply(b"a").unwrap();
            wait("A, B and C to end", &|| [&a, &b, &c].iter().all(|o| o.lock().unwrap().is_some()));
            assert_eq!(a.lock().unwrap().clone().unwrap().unwrap(), b"a");
            let b = b.lock().unwrap().clone().unwrap();
            assert_eq!(b, Err("Status(ServerDecline)".into()), "{engine:?}: B's memory was refused");
            let c = c.lock().unwrap().clone().unwrap().expect("C got memory after B's refusal");
            assert_eq!(u32::from_le_bytes(c[c.len() - 4..].try_into().unwrap()), checksum(&c_args));
            let s = server.rndv_stats();
            assert_eq!((s.requests, s.refused, s.failed), (3, 1, 0), "{engine:?} {s:?}");
            wait("the memory to go back", &|| server.rndv_stats().bytes_in_use == 0);
            assert_eq!(alloc.allocs.load(Ordering::SeqCst), 2, "A and C");
            wait("every buffer to be freed", &|| alloc.frees.load(Ordering::SeqCst) == 2);
        }
    }
}

/// The same for the memory a large copied response is staged in: the call whose response
/// memory is refused ends once with SERVER_DECLINE (replied from the worker, or from another
/// thread), the memory its request held goes back, and the request waiting for that memory
/// goes on at once; the next call gets its response.
#[test]
fn a_refused_response_allocation_ends_its_call_and_the_next_one_goes_on() {
    for (engine, mode) in engine_modes() {
        for round in 0..10u8 {
            let rig = RefusalRig::new(engine, mode, 2 << 20, round);
            let (alloc, held, server, channel) = (&rig.alloc, &rig.held, &rig.server, &rig.channel);
            let wait = |what: &str, cond: &dyn Fn() -> bool| rig.wait(what, cond);
            let big = CallOptions { max_response: 600_000, ..Default::default() };
            // Replied on the worker: refused, then the next one gets its response.
            alloc.refuse.store(1, Ordering::SeqCst);
            let make = 300_000u64.to_le_bytes();
            let e = channel.call_with(&big, MAKE, &make, &mut Vec::new()).unwrap_err();
            assert!(matches!(e, RpcError::Status(Status::ServerDecline)), "{engine:?} {mode:?}: {e}");
            let mut out = Vec::new();
            channel.call_with(&big, MAKE, &make, &mut out).unwrap();
            assert!(out == pattern(300_000, 7));
            // Replied from another thread, while a request waits for the memory the call holds.
            let a = start_with(channel, &big, HOLD, &pattern(600_000, 1));
            wait("the server to hold A", &|| held.lock().unwrap().is_some());
            let b_args = pattern(1_500_000, 2);
            let b = start(channel, SHAPE, &b_args);
            wait("B to wait for memory", &|| server.rndv_stats().waited == 1);
            alloc.refuse.store(1, Ordering::SeqCst);
            let req: Request<SimNic> = held.lock().unwrap().take().unwrap();
            let e = req.reply(&pattern(500_000, 3)).unwrap_err();
            assert!(e.is_would_block(), "{e}");
            wait("A and B to end", &|| a.lock().unwrap().is_some() && b.lock().unwrap().is_some());
            let a = a.lock().unwrap().clone().unwrap();
            assert_eq!(
                a,
                Err("Status(ServerDecline)".into()),
                "{engine:?} {mode:?}: A's response memory was refused"
            );
            let b = b.lock().unwrap().clone().unwrap().expect("B got the memory A gave back");
            assert_eq!(u32::from_le_bytes(b[b.len() - 4..].try_into().unwrap()), checksum(&b_args));
            let s = server.rndv_stats();
            assert_eq!((s.requests, s.refused, s.failed), (4, 2, 0), "{engine:?} {s:?}");
            wait("the memory to go back", &|| server.rndv_stats().bytes_in_use == 0);
            // The second MAKE's response, A's and B's arguments.
            assert_eq!(alloc.allocs.load(Ordering::SeqCst), 3);
            wait("every buffer to be freed", &|| alloc.frees.load(Ordering::SeqCst) == 3);
            assert_eq!(channel.rndv_in_use(), 0);
        }
    }
}
