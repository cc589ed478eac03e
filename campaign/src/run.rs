//! One run: a fabric with a server and several client NICs, channels shared by worker threads
//! that issue every kind of call, a chaos thread for the faults that act over time, then the
//! checks: every call ended once, nothing leaked, and every channel works once the faults stop.

use crate::kinds::{FaultKind, Shape};
use crate::tally::{close_explained, Outcome, Tally};
use bypass::hal::Device;
use bypass::sim::{Engine, Fabric, FabricConfig, SimNic, SimRegion};
use bypass::{
    Access, CallMode, CallOptions, Channel, ChannelConfig, FunctionId, Functions, LocalRange, MemoryRegion,
    OpOptions, RemoteRegion, Request, RpcError, Server, ServerConfig,
};
use bypass_sim::{FaultPlan, FaultStats};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, RwLock};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

const fn fid(method: u32) -> FunctionId {
    match FunctionId::new(0x30, 0x1, true, method) {
        Some(f) => f,
        None => panic!("function id out of range"),
    }
}
/// Replies the arguments' checksum and the arguments.
const ECHO: FunctionId = fid(1);
/// Drops the request without replying.
const DROP: FunctionId = fid(2);
/// Panics (the server answers SERVER_DECLINE).
const PANIC: FunctionId = fid(3);
/// Replies as ECHO does, from another thread, up to 3 ms later.
const DELAY: FunctionId = fid(4);
/// Replies the descriptor of the server's exposed region.
const REGION: FunctionId = fid(5);

/// The message of the handlers' planned panics (the panic hook keeps them quiet).
pub const PLANNED_PANIC: &str = "bypass-campaign: planned handler panic";

/// Bytes of the server's exposed region each worker thread owns for one-sided I/O.
const SLICE: usize = 64 << 10;
/// Most callback calls a worker keeps outstanding.
const MAX_OUTSTANDING: u64 = 16;

/// How a run is set up (from the command line).
#[derive(Debug, Clone)]
pub struct RunConfig {
    pub kind: FaultKind,
    pub seed: u64,
    pub calls: usize,
    pub threads: usize,
    pub channels: usize,
    pub client_nics: usize,
    /// Give rendezvous calls short deadlines too (issue 30, defect 3: a timed-out rendezvous
    /// call fails its queue; off by default until it is fixed).
    pub rndv_deadlines: bool,
}

/// What a run found.
#[derive(Debug)]
pub struct Report {
    pub calls: u64,
    pub counts: Vec<(Outcome, u64)>,
    pub lost: u64,
    pub doubled: u64,
    pub bad_data: u64,
    pub unexplained: u64,
    pub leaked: u64,
    pub unhealthy: u64,
    pub closed_channels: u64,
    pub faults: FaultStats,
    pub wall: Duration,
    pub violations: Vec<String>,
}

impl Report {
    pub fn ok(&self) -> bool {
        self.lost + self.doubled + self.bad_data + self.unexplained + self.leaked + self.unhealthy == 0
    }
}

/// SplitMix64.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// FNV-1a, 64 bits: the checksum the server returns with the arguments.
fn checksum(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| (h ^ u64::from(x)).wrapping_mul(0x0100_0000_01b3))
}

/// What ECHO answers for `args`.
fn echo_of(args: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(8 + args.len());
    v.extend_from_slice(&checksum(args).to_le_bytes());
    v.extend_from_slice(args);
    v
}

/// Arguments for call `id`: `len` bytes that differ from call to call.
fn args_for(id: usize, len: usize, seed: u64) -> Vec<u8> {
    let mut r = Rng::new(seed ^ (id as u64).wrapping_mul(0xD6E8_FEB8_6659_FD93));
    let mut v = Vec::with_capacity(len);
    while v.len() < len {
        v.extend_from_slice(&r.next().to_le_bytes());
    }
    v.truncate(len);
    v
}

struct Noop;
impl Wake for Noop {
    fn wake(self: Arc<Self>) {}
}

/// Polls `fut` to completion, polling `channel` meanwhile (a future needs someone to poll).
fn block_on<F: Future>(fut: F, channel: &Channel<SimNic>) -> F::Output {
    let waker = Waker::from(Arc::new(Noop));
    let mut cx = Context::from_waker(&waker);
    let mut fut = std::pin::pin!(fut);
    loop {
        if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return v;
        }
        if channel.poll() == 0 {
            std::thread::yield_now();
        }
    }
}

/// A channel shared by the workers, replaced when a fault closed it.
struct Slot {
    nic: usize,
    ch: RwLock<Arc<Channel<SimNic>>>,
    /// Reconnecting failed (its NIC is dead): calls on it just fail.
    dead: AtomicBool,
}

/// Everything the threads of a run share.
struct Shared {
    cfg: RunConfig,
    fabric: Fabric,
    nics: Vec<SimNic>,
    addr: std::net::SocketAddr,
    slots: Vec<Slot>,
    /// Channels replaced after a close, checked for leaks at the end.
    graveyard: Mutex<Vec<Arc<Channel<SimNic>>>>,
    tally: Arc<Tally>,
    remote: RemoteRegion,
    victim: usize,
    killed: AtomicBool,
    closed_channels: AtomicU64,
    stop: AtomicBool,
}

fn channel_config() -> ChannelConfig {
    let mut c = ChannelConfig::new("campaign");
    c.queues = 2;
    c.window = 16;
    c
}

impl Shared {
    fn victim(&self, slot: &Slot) -> bool {
        self.cfg.kind == FaultKind::Kill && slot.nic == self.victim
    }

    fn explained(&self, outcome: Outcome, shape: Shape, slot: &Slot) -> bool {
        self.cfg.kind.explains(outcome, shape, self.victim(slot))
    }

    /// Replaces a slot's closed channel by a new one (once per closed channel).
    fn reconnect(&self, slot: &Slot, closed: &Arc<Channel<SimNic>>) {
        if slot.dead.load(Ordering::Acquire) {
            return;
        }
        let mut w = slot.ch.write().unwrap_or_else(|e| e.into_inner());
        if !Arc::ptr_eq(&w, closed) {
            return; // another thread did it
        }
        self.closed_channels.fetch_add(1, Ordering::Relaxed);
        let reason = closed.close_reason();
        if !self.cfg.kind.may_close(self.victim(slot)) || !close_explained(reason) {
            self.tally.violation(format!(
                "a channel on NIC {} closed ({reason:?}) under fault kind {}",
                slot.nic,
                self.cfg.kind.name()
            ));
            self.tally.unexplained.fetch_add(1, Ordering::Relaxed);
        }
        match Channel::connect(&self.nics[slot.nic], self.addr, channel_config()) {
            Ok(c) => {
                let old = std::mem::replace(&mut *w, Arc::new(c));
                self.graveyard.lock().unwrap_or_else(|e| e.into_inner()).push(old);
            }
            Err(_) if self.victim(slot) && self.killed.load(Ordering::Acquire) => {
                slot.dead.store(true, Ordering::Release);
            }
            Err(_) => {} // e.g. a cut still on: the next close tries again
        }
    }
}

/// One worker thread: `calls` calls over its channels, every kind of call.
fn worker(sh: &Shared, t: usize) {
    let mut rng = Rng::new(sh.cfg.seed ^ 0x574F_524B ^ (t as u64) << 32);
    let outstanding = Arc::new(AtomicU64::new(0));
    let my: Vec<usize> = (0..sh.slots.len()).filter(|c| c % sh.cfg.threads == t).collect();
    let nic_of = |c: usize| &sh.nics[sh.slots[c].nic];
    // The one-sided buffer of this thread, on each client NIC its channels use.
    let mut local: Vec<Option<Arc<SimRegion>>> = vec![None; sh.nics.len()];
    let slice_at = (t * SLICE) as u64;
    while !sh.stop.load(Ordering::Relaxed) {
        let c = my[rng.below(my.len() as u64) as usize];
        let slot = &sh.slots[c];
        let ch = slot.ch.read().unwrap_or_else(|e| e.into_inner()).clone();
        if ch.is_closed() {
            sh.reconnect(slot, &ch);
        }
        while outstanding.load(Ordering::Acquire) >= MAX_OUTSTANDING {
            let mut n = 0;
            for &c in &my {
                n += sh.slots[c].ch.read().unwrap_or_else(|e| e.into_inner()).poll();
            }
            if n == 0 {
                std::thread::yield_now();
            }
        }
        let pick = rng.below(100);
        let Some(id) = sh.tally.begin() else { break };
        let seed = sh.cfg.seed;
        let short = |rng: &mut Rng| Some(Duration::from_millis(rng.range(1, 20)));
        match pick {
            // Blocking calls, every mode; some with a short deadline.
            0..=29 => {
                let mode = CallMode::ALL[rng.below(4) as usize];
                let mut opts = CallOptions::mode(mode);
                let shape = Shape { may_time_out: rng.chance(10), op: "blocking call", ..Shape::default() };
                if shape.may_time_out {
                    opts.timeout = short(&mut rng);
                }
                let args = args_for(id, rng.range(0, 2000) as usize, seed);
                let mut rsp = Vec::new();
                let r = ch.call_with(&opts, ECHO, &args, &mut rsp);
                finish(sh, slot, id, shape, r.map(|_| ()), || check_echo(mode, &args, &rsp));
            }
            // Futures.
            30..=44 => {
                let fshape = Shape { op: "future", ..Shape::default() };
                let mode = if rng.chance(50) { CallMode::WaitRsp } else { CallMode::Ack };
                let opts = CallOptions::mode(mode);
                let args = args_for(id, rng.range(0, 2000) as usize, seed);
                match ch.call_future(&opts, ECHO, &args) {
                    Ok(f) => {
                        let r = block_on(f, &ch);
                        match r {
                            Ok(rsp) => finish(sh, slot, id, fshape, Ok(()), || check_echo(mode, &args, &rsp)),
                            Err(e) => finish(sh, slot, id, fshape, Err(e), || None),
                        }
                    }
                    Err(e) => finish(sh, slot, id, fshape, Err(e), || None),
                }
            }
            // Callbacks, left outstanding while the thread goes on.
            45..=59 => {
                let mode = CallMode::ALL[rng.below(4) as usize];
                let args = args_for(id, rng.range(0, 2000) as usize, seed);
                start_callback(sh, slot, &ch, None, id, mode, args, &outstanding);
            }
            // Batches of callbacks and futures.
            60..=67 => {
                let n = rng.range(2, 8) as usize;
                let mut futures = Vec::new();
                {
                    let mut batch = ch.batch();
                    let mut next = Some(id);
                    for _ in 0..n {
                        let Some(id) = next.take().or_else(|| sh.tally.begin()) else { break };
                        let args = args_for(id, rng.range(0, 1000) as usize, seed);
                        if rng.chance(50) {
                            start_callback(
                                sh,
                                slot,
                                &ch,
                                Some(&mut batch),
                                id,
                                CallMode::WaitRsp,
                                args,
                                &outstanding,
                            );
                        } else {
                            match batch.call_future(&CallOptions::default(), ECHO, &args) {
                                Ok(f) => futures.push((id, args, f)),
                                Err(e) => finish(sh, slot, id, BATCHED, Err(e), || None),
                            }
                        }
                    }
                }
                for (id, args, f) in futures {
                    match block_on(f, &ch) {
                        Ok(rsp) => finish(sh, slot, id, BATCHED, Ok(()), || {
                            check_echo(CallMode::WaitRsp, &args, &rsp)
                        }),
                        Err(e) => finish(sh, slot, id, BATCHED, Err(e), || None),
                    }
                }
            }
            // Rendezvous: arguments the server READs, responses it WRITEs.
            68..=72 => {
                let args = args_for(id, rng.range(4000, 40_000) as usize, seed);
                let mut opts =
                    CallOptions { rendezvous: true, max_response: 64 << 10, ..CallOptions::default() };
                let shape = Shape {
                    may_time_out: sh.cfg.rndv_deadlines && rng.chance(20),
                    registers: true,
                    op: "rendezvous call",
                    ..Shape::default()
                };
                if shape.may_time_out {
                    opts.timeout = short(&mut rng);
                }
                let mut rsp = Vec::new();
                let r = ch.call_with(&opts, ECHO, &args, &mut rsp);
                finish(sh, slot, id, shape, r.map(|_| ()), || check_echo(CallMode::WaitRsp, &args, &rsp));
            }
            // Zero-copy arguments from registered segments.
            73..=75 => {
                let shape = Shape { registers: true, op: "segments call", ..Shape::default() };
                let args = args_for(id, rng.range(1, 3000) as usize, seed);
                let region = nic_of(c).register(args.len(), Access::LOCAL_WRITE | Access::REMOTE_READ);
                match region {
                    Ok(mut r) => {
                        let _ = r.write(0, &args);
                        let r = Arc::new(r);
                        let cut = args.len() / 2;
                        let segs = [LocalRange::new(&r, 0, cut), LocalRange::new(&r, cut, args.len() - cut)];
                        let mut rsp = Vec::new();
                        let res = ch.call_segments_with(&CallOptions::default(), ECHO, &segs, &mut rsp);
                        finish(sh, slot, id, shape, res.map(|_| ()), || {
                            check_echo(CallMode::WaitRsp, &args, &rsp)
                        });
                    }
                    Err(e) => finish(sh, slot, id, shape, Err(RpcError::Device(e)), || None),
                }
            }
            // One-sided WRITE then READ of this thread's slice of the server's region.
            76..=84 => {
                let shape = Shape { registers: true, op: "one-sided", ..Shape::default() };
                let len = rng.range(1, 16 << 10) as usize;
                let off = slice_at + rng.below((SLICE - len) as u64 + 1);
                let n = slot.nic;
                let buf = match local[n].take() {
                    Some(b) if Arc::strong_count(&b) == 1 => Ok(b),
                    _ => nic_of(c).register(2 * SLICE, Access::LOCAL_WRITE).map(Arc::new),
                };
                let mut buf = match buf {
                    Ok(b) => b,
                    Err(e) => {
                        finish(sh, slot, id, shape, Err(RpcError::Device(e)), || None);
                        continue;
                    }
                };
                let data = args_for(id, len, seed);
                if let Some(b) = Arc::get_mut(&mut buf) {
                    let _ = b.write(0, &data);
                    let _ = b.write(SLICE, &vec![0u8; len]);
                }
                let form = rng.below(3);
                let opts = OpOptions::default();
                let src = [LocalRange::new(&buf, 0, len)];
                let dst = [LocalRange::new(&buf, SLICE, len)];
                let r = match form {
                    0 => ch
                        .write(&src, &sh.remote, off, &opts)
                        .and_then(|()| ch.read(&dst, &sh.remote, off, &opts)),
                    1 => ch
                        .write_future(&src, &sh.remote, off, &opts)
                        .and_then(|f| block_on(f, &ch))
                        .and_then(|()| ch.read_future(&dst, &sh.remote, off, &opts))
                        .and_then(|f| block_on(f, &ch)),
                    _ => {
                        let (tx, rx) = mpsc::channel();
                        let tx2 = tx.clone();
                        let started = ch
                            .write_callback(&src, &sh.remote, off, &opts, move |r| {
                                let _ = tx.send(r);
                            })
                            .map(|()| block_on(Recv(&rx), &ch));
                        match started {
                            Ok(Ok(())) => ch
                                .read_callback(&dst, &sh.remote, off, &opts, move |r| {
                                    let _ = tx2.send(r);
                                })
                                .and_then(|()| block_on(Recv(&rx), &ch)),
                            Ok(Err(e)) | Err(e) => Err(e),
                        }
                    }
                };
                finish(sh, slot, id, shape, r, || {
                    let mut got = vec![0u8; len];
                    let _ = buf.read(SLICE, &mut got);
                    (got != data)
                        .then(|| format!("one-sided READ of {len} bytes at {off} returned other bytes"))
                });
                local[n] = Some(buf);
            }
            // A handler that drops the request: only a deadline ends the call.
            85..=88 => {
                let opts = CallOptions {
                    timeout: Some(Duration::from_millis(rng.range(1, 10))),
                    ..CallOptions::default()
                };
                let mut rsp = Vec::new();
                let r = ch.call_with(&opts, DROP, b"drop me", &mut rsp);
                let shape = Shape { may_time_out: true, op: "dropping handler", ..Shape::default() };
                finish(sh, slot, id, shape, r.map(|_| ()), || Some("a dropped request was answered".into()));
            }
            // A handler that panics.
            89..=92 => {
                let mut rsp = Vec::new();
                let r = ch.call_with(&CallOptions::default(), PANIC, b"panic", &mut rsp);
                let shape = Shape { may_decline: true, op: "panicking handler", ..Shape::default() };
                finish(sh, slot, id, shape, r.map(|_| ()), || Some("a panicking handler answered".into()));
            }
            // A handler that replies late, from another thread; sometimes after the deadline.
            _ => {
                let mut opts = CallOptions::default();
                let shape = Shape { may_time_out: rng.chance(50), op: "late handler", ..Shape::default() };
                if shape.may_time_out {
                    opts.timeout = Some(Duration::from_millis(rng.range(1, 5)));
                }
                let args = args_for(id, rng.range(0, 500) as usize, seed);
                let mut rsp = Vec::new();
                let r = ch.call_with(&opts, DELAY, &args, &mut rsp);
                finish(sh, slot, id, shape, r.map(|_| ()), || check_echo(CallMode::WaitRsp, &args, &rsp));
            }
        }
        ch.poll();
    }
    // Leave nothing outstanding: poll until every callback of this thread has run.
    let end = Instant::now() + Duration::from_secs(60);
    while outstanding.load(Ordering::Acquire) > 0 && Instant::now() < end {
        let mut n = 0;
        for &c in &my {
            n += sh.slots[c].ch.read().unwrap_or_else(|e| e.into_inner()).poll();
        }
        if n == 0 {
            std::thread::yield_now();
        }
    }
}

/// A future of the next message on an mpsc channel (for the callback forms, polled by
/// [`block_on`] while it polls the channel).
struct Recv<'a, T>(&'a mpsc::Receiver<T>);
impl<T> Future for Recv<'_, T> {
    type Output = T;
    fn poll(self: std::pin::Pin<&mut Self>, _: &mut Context<'_>) -> Poll<T> {
        match self.0.try_recv() {
            Ok(v) => Poll::Ready(v),
            Err(mpsc::TryRecvError::Empty) => Poll::Pending,
            Err(mpsc::TryRecvError::Disconnected) => {
                panic!("a one-sided callback was dropped without running")
            }
        }
    }
}

/// What is wrong with an ECHO response, if anything.
fn check_echo(mode: CallMode, args: &[u8], rsp: &[u8]) -> Option<String> {
    let want = match mode {
        CallMode::WaitRsp | CallMode::Ack => echo_of(args),
        CallMode::EarlyRsp | CallMode::AckEarlyRsp => Vec::new(),
    };
    (rsp != want).then(|| {
        format!(
            "{mode:?} call with {} bytes of arguments: {} bytes of response, not {}",
            args.len(),
            rsp.len(),
            want.len()
        )
    })
}

/// Records a call's end: its outcome, whether the fault explains it, and its data if it
/// succeeded (`check` says what is wrong).
fn finish(
    sh: &Shared,
    slot: &Slot,
    id: usize,
    shape: Shape,
    r: Result<(), RpcError>,
    check: impl FnOnce() -> Option<String>,
) {
    let outcome = match &r {
        Ok(()) => Outcome::Ok,
        Err(e) => Outcome::of(e),
    };
    let explained = sh.explained(outcome, shape, slot);
    sh.tally.end(id, outcome, explained, || format!("{}: {r:?} on NIC {}", shape.op, slot.nic));
    if r.is_ok() {
        if let Some(bad) = check() {
            sh.tally.bad_data(id, bad);
        }
    }
}

/// Starts an ECHO call whose outcome a callback records (on whichever thread completes it).
#[allow(clippy::too_many_arguments)]
fn start_callback(
    sh: &Shared,
    slot: &Slot,
    ch: &Arc<Channel<SimNic>>,
    batch: Option<&mut bypass::CallBatch<'_, SimNic>>,
    id: usize,
    mode: CallMode,
    args: Vec<u8>,
    outstanding: &Arc<AtomicU64>,
) {
    let victim = sh.victim(slot);
    let kind = sh.cfg.kind;
    let nic = slot.nic;
    let out = outstanding.clone();
    let tally = sh.tally.clone();
    let want = match mode {
        CallMode::WaitRsp | CallMode::Ack => echo_of(&args),
        _ => Vec::new(),
    };
    out.fetch_add(1, Ordering::AcqRel);
    let cb = move |r: Result<&[u8], RpcError>| {
        let outcome = match &r {
            Ok(_) => Outcome::Ok,
            Err(e) => Outcome::of(e),
        };
        let explained = kind.explains(outcome, CALLBACK, victim);
        tally.end(id, outcome, explained, || {
            format!("{:?} on NIC {nic} (callback)", r.as_ref().map(|b| b.len()))
        });
        if let Ok(rsp) = r {
            if rsp != want {
                tally.bad_data(
                    id,
                    format!("{mode:?} callback: {} bytes of response, not {}", rsp.len(), want.len()),
                );
            }
        }
        out.fetch_sub(1, Ordering::AcqRel);
    };
    let opts = CallOptions::mode(mode);
    let started = match batch {
        Some(b) => b.call_callback(&opts, ECHO, &args, cb),
        None => ch.call_callback(&opts, ECHO, &args, cb),
    };
    if let Err(e) = started {
        outstanding.fetch_sub(1, Ordering::AcqRel);
        finish(sh, slot, id, CALLBACK, Err(e), || None);
    }
}

const CALLBACK: Shape = Shape { may_time_out: false, may_decline: false, registers: false, op: "callback" };
const BATCHED: Shape =
    Shape { may_time_out: false, may_decline: false, registers: false, op: "batched future" };

/// The chaos thread: faults that act over time, seeded.
fn chaos(sh: &Shared) {
    let mut rng = Rng::new(sh.cfg.seed ^ 0xC4A0_5000);
    let nap = |ms: u64| {
        let end = Instant::now() + Duration::from_millis(ms);
        while Instant::now() < end && !sh.stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    match sh.cfg.kind {
        FaultKind::Cut => {
            while !sh.stop.load(Ordering::Relaxed) {
                nap(rng.range(20, 200));
                let n = rng.range(1, sh.cfg.client_nics as u64) as u32;
                // Mostly short cuts the retransmissions ride out; one in ten past the keepalive
                // (5 s) and every retry, so queues fail, recover or channels break.
                let ms = match rng.below(10) {
                    0 => rng.range(2000, 8000),
                    1 => rng.range(300, 2000),
                    _ => rng.range(5, 100),
                };
                let _ = sh.fabric.cut_link(0, n, Some(Duration::from_millis(ms)));
            }
        }
        FaultKind::Kill => {
            while !sh.stop.load(Ordering::Relaxed) && sh.tally.started() < sh.cfg.calls / 5 {
                nap(1);
            }
            if !sh.stop.load(Ordering::Relaxed) {
                sh.killed.store(true, Ordering::Release);
                let _ = sh.fabric.kill_nic(sh.victim as u32);
            }
        }
        FaultKind::Regfail => {
            // Channels connected and dropped while registrations fail: a refused connect must
            // be a clean error, and leave nothing behind (checked at the end on the server).
            while !sh.stop.load(Ordering::Relaxed) {
                nap(rng.range(10, 50));
                let n = rng.range(1, sh.cfg.client_nics as u64) as usize;
                if let Ok(c) = Channel::connect(&sh.nics[n], sh.addr, channel_config()) {
                    let mut rsp = Vec::new();
                    for _ in 0..5 {
                        let _ = c.call(ECHO, b"short-lived", &mut rsp);
                    }
                }
            }
        }
        _ => {}
    }
}

fn server_functions(
    late: mpsc::Sender<(Instant, Request<SimNic>)>,
    remote: RemoteRegion,
) -> Functions<SimNic> {
    let mut f = Functions::new();
    f.register(ECHO, |req| {
        let rsp = echo_of(req.args());
        let _ = req.reply(&rsp);
    });
    f.register(DROP, drop);
    f.register(PANIC, |_req| panic!("{PLANNED_PANIC}"));
    let late = Mutex::new(late);
    f.register(DELAY, move |req| {
        let due = Instant::now() + Duration::from_micros(u64::from(req.req_id() % 3000));
        let _ = late.lock().unwrap_or_else(|e| e.into_inner()).send((due, req));
    });
    let desc = remote.encode();
    f.register(REGION, move |req| {
        let _ = req.reply(&desc);
    });
    f
}

/// Polls `ch` until its counters show nothing in use, or `limit` passes.
fn settle(ch: &Channel<SimNic>, limit: Duration, full_credits: bool) -> Result<(), String> {
    let end = Instant::now() + limit;
    loop {
        ch.poll();
        let s = ch.stats();
        let credits_ok = !full_credits || s.credits == (ch.queues() as u64) * u64::from(ch.window());
        if s.tx_in_use == 0 && s.table_in_use == 0 && ch.rndv_in_use() == 0 && credits_ok {
            return Ok(());
        }
        if Instant::now() > end {
            return Err(format!(
                "send contexts {}, table slots {}, rendezvous bytes {}, credits {} of {}",
                s.tx_in_use,
                s.table_in_use,
                ch.rndv_in_use(),
                s.credits,
                (ch.queues() as u64) * u64::from(ch.window())
            ));
        }
        std::thread::yield_now();
    }
}

/// Runs one fault kind.
pub fn run(cfg: RunConfig) -> Report {
    let started = Instant::now();
    let kind = cfg.kind;
    let fabric = Fabric::with_config(FabricConfig {
        faults: FaultPlan { controls: true, seed: cfg.seed, ..FaultPlan::NONE },
        ..FabricConfig::new(Engine::Inline)
    });
    let nics: Vec<SimNic> = (0..=cfg.client_nics).map(|_| fabric.add_nic()).collect();
    let exposed = nics[0]
        .register(cfg.threads * SLICE, Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE)
        .expect("the server's exposed region");
    let remote = exposed.remote();
    let (late_tx, late_rx) = mpsc::channel::<(Instant, Request<SimNic>)>();
    let late = std::thread::Builder::new()
        .name("campaign-late".into())
        .spawn(move || {
            // Requests by due time; each replied once due (the sender's drop ends the thread).
            let mut waiting: Vec<(Instant, Request<SimNic>)> = Vec::new();
            loop {
                let now = Instant::now();
                let mut i = 0;
                while i < waiting.len() {
                    if waiting[i].0 <= now {
                        let (_, req) = waiting.swap_remove(i);
                        let rsp = echo_of(req.args());
                        let _ = req.reply(&rsp);
                    } else {
                        i += 1;
                    }
                }
                let next = waiting.iter().map(|w| w.0).min();
                let wait = next.map_or(Duration::from_millis(100), |d| d.saturating_duration_since(now));
                match late_rx.recv_timeout(wait) {
                    Ok(r) => waiting.push(r),
                    Err(mpsc::RecvTimeoutError::Timeout) => {}
                    Err(mpsc::RecvTimeoutError::Disconnected) if waiting.is_empty() => return,
                    Err(mpsc::RecvTimeoutError::Disconnected) => std::thread::sleep(wait),
                }
            }
        })
        .expect("the late replier thread");
    let mut scfg = ServerConfig::new("campaign");
    scfg.workers = 2;
    let mut server = Server::bind(&nics[0], "127.0.0.1:0", scfg, server_functions(late_tx, remote))
        .expect("the campaign's server");
    let baseline = server.registered_bytes();
    let addr = server.local_addr();
    let slots: Vec<Slot> = (0..cfg.channels)
        .map(|c| {
            // Worker t uses channels t, t + threads, ...: spread them over the client NICs so
            // that every worker has channels on NICs a kill leaves alone.
            let nic = 1 + (c % cfg.threads + c / cfg.threads) % cfg.client_nics;
            let ch = Channel::connect(&nics[nic], addr, channel_config()).expect("a campaign channel");
            Slot { nic, ch: RwLock::new(Arc::new(ch)), dead: AtomicBool::new(false) }
        })
        .collect();
    let victim = cfg.client_nics;
    // Sized for every call the workers may start (batches take several ids).
    let sh = Shared {
        tally: Arc::new(Tally::new(cfg.calls)),
        cfg: cfg.clone(),
        fabric: fabric.clone(),
        nics,
        addr,
        slots,
        graveyard: Mutex::new(Vec::new()),
        remote,
        victim,
        killed: AtomicBool::new(false),
        closed_channels: AtomicU64::new(0),
        stop: AtomicBool::new(false),
    };
    fabric.set_faults(kind.plan(cfg.seed)).expect("the fabric has fault controls");
    let mut unhealthy = 0u64;
    let mut leaked = 0u64;
    std::thread::scope(|s| {
        let chaos_thread = s.spawn(|| chaos(&sh));
        let workers: Vec<_> = (0..cfg.threads)
            .map(|t| {
                let sh = &sh;
                s.spawn(move || worker(sh, t))
            })
            .collect();
        for w in workers {
            if w.join().is_err() {
                sh.tally.violation("a worker thread panicked".into());
                sh.tally.unexplained.fetch_add(1, Ordering::Relaxed);
            }
        }
        sh.stop.store(true, Ordering::Release);
        let _ = chaos_thread.join();
    });
    // The faults stop.
    let _ = fabric.set_faults(FaultPlan { controls: true, seed: cfg.seed, ..FaultPlan::NONE });
    fabric.heal_links();
    // Every call must end: poll every channel until none is pending (bounded).
    let end = Instant::now() + Duration::from_secs(60);
    while sh.tally.pending() > 0 && Instant::now() < end {
        for slot in &sh.slots {
            slot.ch.read().unwrap_or_else(|e| e.into_inner()).poll();
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let lost = sh.tally.pending();
    if lost > 0 {
        sh.tally.violation(format!("{lost} calls never ended"));
    }
    // Healthy again: every channel (a closed one reconnected, except on a dead NIC) answers a
    // clean round of calls with the right data.
    for slot in &sh.slots {
        let ch = slot.ch.read().unwrap_or_else(|e| e.into_inner()).clone();
        if ch.is_closed() {
            sh.reconnect(slot, &ch);
        }
        if sh.victim(slot) && sh.killed.load(Ordering::Acquire) {
            // Its NIC is dead: nothing on it can work, but it must hold nothing either.
            if let Err(e) = settle(&ch, Duration::from_secs(10), false) {
                leaked += 1;
                sh.tally.violation(format!("a channel on the killed NIC {} holds {e}", slot.nic));
            }
            continue;
        }
        let ch = slot.ch.read().unwrap_or_else(|e| e.into_inner()).clone();
        for i in 0..20 {
            let args = args_for(i, 100 + i, cfg.seed);
            let mut rsp = Vec::new();
            match ch.call(ECHO, &args, &mut rsp) {
                Ok(()) if rsp == echo_of(&args) => {}
                r => {
                    unhealthy += 1;
                    sh.tally
                        .violation(format!("after the faults, a clean call on NIC {} got {r:?}", slot.nic));
                    break;
                }
            }
        }
        if let Err(e) = settle(&ch, Duration::from_secs(10), true) {
            leaked += 1;
            sh.tally.violation(format!("a channel on NIC {} holds {e} after its calls ended", slot.nic));
        }
    }
    for (i, ch) in sh.graveyard.lock().unwrap_or_else(|e| e.into_inner()).iter().enumerate() {
        if let Err(e) = settle(ch, Duration::from_secs(10), false) {
            leaked += 1;
            sh.tally.violation(format!("closed channel {i} holds {e}"));
        }
    }
    let calls = sh.tally.started() as u64;
    let counts = Outcome::ALL.iter().map(|&o| (o, sh.tally.count(o))).collect();
    let closed_channels = sh.closed_channels.load(Ordering::Relaxed);
    let faults = fabric.fault_stats();
    // Close everything: the server must drop every connection and give back their memory.
    let slots = std::mem::take(&mut *sh.graveyard.lock().unwrap_or_else(|e| e.into_inner()));
    drop(slots);
    let Shared { slots, tally, .. } = sh;
    drop(slots);
    let end = Instant::now() + Duration::from_secs(30);
    while (server.connections() > 0 || server.registered_bytes() != baseline) && Instant::now() < end {
        server.poll();
        std::thread::sleep(Duration::from_millis(5));
    }
    let (conns, bytes, tx, rndv) = (
        server.connections(),
        server.registered_bytes(),
        server.tx_in_use(),
        server.rndv_stats().bytes_in_use,
    );
    if conns != 0 || bytes != baseline || tx != 0 || rndv != 0 {
        leaked += 1;
        tally.violation(format!(
            "the server kept {conns} connections, {bytes} registered bytes (of {baseline} before any), \
             {tx} send contexts and {rndv} rendezvous bytes after every channel closed"
        ));
    }
    server.shutdown();
    drop(server);
    let _ = late.join();
    drop(exposed);
    Report {
        calls,
        counts,
        lost,
        doubled: tally.doubled.load(Ordering::Relaxed),
        bad_data: tally.bad_data.load(Ordering::Relaxed),
        unexplained: tally.unexplained.load(Ordering::Relaxed),
        leaked,
        unhealthy,
        closed_channels,
        faults,
        wall: started.elapsed(),
        violations: tally.violations(),
    }
}
