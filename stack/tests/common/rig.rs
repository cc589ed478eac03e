//! The rig: a fabric of two simulated NICs, a server on one with the functions of [`super::ids`]
//! and a channel to it from the other, on any engine, and the bounded waits that drive it.
//!
//! - Inline and Threaded (`real` engines): the server has worker threads; blocking calls poll
//!   the channel themselves, callbacks and futures complete while [`Rig::until`] polls it.
//! - Stepped: the server has no workers and keepalive is off. Nothing moves unless the test
//!   thread drives it (`fabric.run_until_idle(); server.poll(); channel.poll();` in
//!   [`Rig::pump`]); calls go through callbacks and futures (a blocking call would wait
//!   forever), and timeouts use the virtual clock (`fabric.advance`).
//!
//! Every wait is a bounded polling loop that panics with the state it saw; nothing sleeps to
//! "wait enough".

use super::helpers::poll_once;
use super::ids::*;
use super::SEED;
use bypass::sim::{Engine, Fabric, FabricConfig, SimNic};
use bypass::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

pub type Nic = SimNic;
pub type Req = Request<Nic>;
pub type Outcome = Result<Vec<u8>, RpcError>;

/// The Stepped engine with the tests' seed.
pub const STEPPED: Engine = Engine::Stepped { seed: SEED };
/// The server's name in every rig.
pub const SERVER_NAME: &str = "test-rig";
/// Longest any single wait may take (real time) before the test gives up.
pub const WAIT_LIMIT: Duration = Duration::from_secs(30);
/// Most driving rounds of one wait on the Stepped engine.
pub const STEPPED_ROUNDS: u64 = 1_000_000;
/// Per-call deadline of the timeout scenarios.
pub const SHORT: Duration = Duration::from_millis(50);
/// How long a real-engine test waits for something that must NOT happen.
pub const QUIET: Duration = Duration::from_millis(30);

/// Real-time engines: device work runs by itself; blocking calls are allowed.
pub fn real(engine: Engine) -> bool {
    !matches!(engine, Engine::Stepped { .. })
}

pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// `reply_with`'s fill for an echo.
pub fn echo_fill(args: &[u8], out: &mut [u8]) -> Result<usize, usize> {
    out.get_mut(..args.len()).ok_or(args.len())?.copy_from_slice(args);
    Ok(args.len())
}

/// What the deferred-reply scenarios answer: the arguments reversed, then `!`.
pub fn transform(args: &[u8]) -> Vec<u8> {
    let mut v: Vec<u8> = args.iter().rev().copied().collect();
    v.push(b'!');
    v
}

/// A distinct payload per (caller, call), of varying length.
pub fn payload(t: usize, i: usize) -> Vec<u8> {
    let mut v = format!("t{t}:c{i}:").into_bytes();
    let extra = (t * 37 + i * 13) % 300;
    v.extend((0..extra).map(|k| (k ^ i ^ (t << 4)) as u8));
    v
}

/// The outcome of a future that reports `is_done()`.
pub fn finished(f: &mut CallFuture) -> Outcome {
    assert!(f.is_done(), "future not done: {f:?}");
    poll_once(f).expect("a done CallFuture must be Ready")
}

pub fn opts_nowait() -> CallOptions {
    CallOptions { wait_for_credit: false, ..Default::default() }
}

pub fn on_queue(q: usize) -> CallOptions {
    CallOptions { queue: Some(q), ..Default::default() }
}

/// Records every callback invocation: `log[i]` holds each outcome call `i` got (exactly one,
/// if the stack is right).
#[derive(Clone, Default)]
pub struct Log(Arc<Mutex<Vec<Vec<Outcome>>>>);

impl Log {
    pub fn cb(&self, i: usize) -> impl FnOnce(Result<&[u8], RpcError>) + Send + 'static {
        let log = self.clone();
        move |r| {
            let mut v = lock(&log.0);
            if v.len() <= i {
                v.resize_with(i + 1, Vec::new);
            }
            v[i].push(r.map(<[u8]>::to_vec));
        }
    }

    /// Calls that got at least one outcome.
    pub fn completed(&self) -> usize {
        lock(&self.0).iter().filter(|o| !o.is_empty()).count()
    }

    /// Asserts that exactly calls `0..n` completed, each exactly once.
    #[track_caller]
    pub fn assert_once(&self, n: usize) {
        let v = lock(&self.0);
        assert_eq!(v.len(), n, "callbacks ran for calls 0..{} but {n} calls were started", v.len());
        for (i, o) in v.iter().enumerate() {
            assert_eq!(o.len(), 1, "call {i} completed {} times: {o:?}", o.len());
        }
    }

    /// Runs `f` on call `i`'s (first) outcome.
    #[track_caller]
    pub fn with<R>(&self, i: usize, f: impl FnOnce(&Outcome) -> R) -> R {
        let v = lock(&self.0);
        let o = v.get(i).and_then(|o| o.first()).unwrap_or_else(|| panic!("call {i} has no outcome"));
        f(o)
    }
}

/// What [`Rig::build`] lets a test change before the server binds and the channel connects.
pub struct Setup {
    pub fabric: FabricConfig,
    pub channel: ChannelConfig,
    pub server: ServerConfig,
    /// Already holds the functions of [`super::ids`] the rig serves; a test adds its own.
    pub functions: Functions<Nic>,
    pub events: ConnectionEvents<Nic>,
}

pub struct Rig {
    pub engine: Engine,
    // Dropped in this order: the channel first, then the server, the held requests, the fabric.
    pub channel: Channel<Nic>,
    pub server: Server<Nic>,
    pub held: Mutex<Receiver<Req>>,
    pub offload: Mutex<Receiver<(Req, Sender<()>)>>,
    pub snic: Nic,
    pub cnic: Nic,
    pub fabric: Fabric,
    hits: Arc<AtomicUsize>,
    pub window: u32,
    /// Whether [`Rig::pump`] polls the channel (false when a worker group does).
    pub poll_channel: bool,
}

impl Rig {
    pub fn new(engine: Engine) -> Rig {
        Rig::with(engine, |_, _| {})
    }

    /// A rig whose configs `tweak` adjusts (on the Stepped engine the server gets no workers
    /// whatever `tweak` says).
    pub fn with(engine: Engine, tweak: impl FnOnce(&mut ChannelConfig, &mut ServerConfig)) -> Rig {
        Rig::build(engine, |s| tweak(&mut s.channel, &mut s.server))
    }

    /// A server with ECHO, HOLD, BIG, OFFLOAD and the PANIC functions (one worker on the real
    /// engines, none on Stepped, which also has keepalive off), and one channel to it; `setup`
    /// adjusts the fabric, the configs, the functions and the connection events first.
    pub fn build(engine: Engine, setup: impl FnOnce(&mut Setup)) -> Rig {
        let hits = Arc::new(AtomicUsize::new(0));
        let (tx, held) = mpsc::channel::<Req>();
        let mut f = Functions::new();
        let h = hits.clone();
        f.register(ECHO, move |req| {
            h.fetch_add(1, Ordering::SeqCst);
            let _ = req.reply_with(Status::Success, echo_fill);
        });
        let moved = tx.clone();
        f.register(HOLD, move |req| {
            // If the test stopped listening, the request is dropped (cleanly).
            let _ = tx.send(req);
        });
        f.register(PANIC, |req| {
            let n = req.args().len();
            panic!("test rig: a handler panics holding its request ({n} bytes of arguments)");
        });
        f.register(PANIC_AFTER_REPLY, |req| {
            let _ = req.reply_with(Status::Success, echo_fill);
            panic!("test rig: a handler panics after replying");
        });
        f.register(PANIC_IN_FILL, |req| {
            let _ = req.reply_with(Status::Success, |_, _| panic!("test rig: a reply's fill closure panics"));
        });
        f.register(PANIC_AFTER_MOVE, move |req| {
            let _ = moved.send(req);
            panic!("test rig: a handler panics after handing its request on");
        });
        let (otx, offload) = mpsc::channel::<(Req, Sender<()>)>();
        f.register(OFFLOAD, move |req| {
            let (done_tx, done_rx) = mpsc::channel();
            if otx.send((req, done_tx)).is_ok() {
                let _ = done_rx.recv_timeout(WAIT_LIMIT);
            }
        });
        f.register(BIG, |req| {
            let n = req.max_response();
            req.reply_with(Status::Success, |_, out| {
                for (i, b) in out[..n].iter_mut().enumerate() {
                    *b = i as u8;
                }
                Ok(n)
            })
            .expect("BIG reply");
        });
        let mut server = ServerConfig::new(SERVER_NAME);
        server.workers = 1;
        let mut s = Setup {
            fabric: FabricConfig::new(engine),
            channel: ChannelConfig::new(SERVER_NAME),
            server,
            functions: f,
            events: ConnectionEvents::new(),
        };
        setup(&mut s);
        let Setup { fabric, channel: mut ccfg, server: mut scfg, functions, events } = s;
        if !real(engine) {
            scfg.workers = 0;
            // Keepalive runs on real time; on the Stepped engine its probes would be device work
            // the test did not schedule (tests/liveness.rs covers keepalive).
            ccfg.keepalive = None;
            scfg.keepalive = None;
        }
        let fabric = Fabric::with_config(fabric);
        let snic = fabric.add_nic();
        let cnic = fabric.add_nic();
        let window = ccfg.window.min(scfg.max_window);
        let server =
            Server::bind_with(&snic, "127.0.0.1:0", scfg, functions, events).expect("bind the server");
        let channel = Channel::connect(&cnic, server.local_addr(), ccfg).expect("connect the channel");
        let rig = Rig {
            engine,
            channel,
            server,
            held: Mutex::new(held),
            offload: Mutex::new(offload),
            snic,
            cnic,
            fabric,
            hits,
            window,
            poll_channel: true,
        };
        assert_eq!(rig.channel.stats().credits, rig.full_credits(), "{engine:?}: fresh channel's credits");
        assert_eq!(rig.channel.stats().ready_queues, rig.channel.queues());
        rig
    }

    pub fn real(&self) -> bool {
        real(self.engine)
    }

    /// Another channel to the rig's server, from the client NIC.
    pub fn connect(&self, config: ChannelConfig) -> Result<Channel<Nic>, RpcError> {
        Channel::connect(&self.cnic, self.server.local_addr(), config)
    }

    /// How many times ECHO ran.
    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }

    pub fn full_credits(&self) -> u64 {
        u64::from(self.window) * self.channel.queues() as u64
    }

    /// One round of driving. Stepped: run the devices until idle, then the server and the
    /// channel. Real engines: poll the channel (the server's workers poll the server).
    pub fn pump(&self) {
        if self.real() {
            if !self.poll_channel || self.channel.poll() == 0 {
                self.fabric.progress();
                std::thread::yield_now();
            }
        } else {
            let steps = self.fabric.run_until_idle();
            let n = self.server.poll() + if self.poll_channel { self.channel.poll() } else { 0 };
            if steps == 0 && n == 0 {
                // Something may be waiting on a real thread (TCP control plane).
                std::thread::yield_now();
            }
        }
    }

    /// Drives until `cond` holds; panics (saying what it waited for) if it does not in time.
    #[track_caller]
    pub fn until(&self, what: &str, cond: impl FnMut() -> bool) {
        self.until_inner(what, None, cond)
    }

    /// Like [`Rig::until`], but on the Stepped engine also moves the virtual clock forward by
    /// `tick` every round, so transport timers (retransmission, retry exhaustion) fire.
    #[track_caller]
    pub fn until_timers(&self, what: &str, tick: Duration, cond: impl FnMut() -> bool) {
        self.until_inner(what, Some(tick), cond)
    }

    #[track_caller]
    fn until_inner(&self, what: &str, tick: Option<Duration>, mut cond: impl FnMut() -> bool) {
        let start = Instant::now();
        let mut rounds = 0u64;
        while !cond() {
            let elapsed = start.elapsed();
            if elapsed > WAIT_LIMIT || (!self.real() && rounds >= STEPPED_ROUNDS) {
                panic!(
                    "{:?}: gave up waiting for {what} after {rounds} rounds ({elapsed:?}); channel {:?}, \
                     closed {}; server {:?}, server tx_in_use {}, connections {}",
                    self.engine,
                    self.channel.stats(),
                    self.channel.is_closed(),
                    self.server.stats(),
                    self.server.tx_in_use(),
                    self.server.connections(),
                );
            }
            if let (Some(t), false) = (tick, self.real()) {
                self.fabric.advance(t);
            }
            self.pump();
            rounds += 1;
        }
    }

    /// Drives for a short while (real engines: `QUIET` of real time; Stepped: until idle a few
    /// times) so that something that must not happen has a chance to.
    pub fn settle(&self) {
        if self.real() {
            let start = Instant::now();
            while start.elapsed() < QUIET {
                self.pump();
            }
        } else {
            for _ in 0..8 {
                self.pump();
            }
        }
    }

    /// Drives until `n` requests reached the HOLD handler and returns them.
    #[track_caller]
    pub fn take_held(&self, n: usize) -> Vec<Req> {
        let mut out = Vec::with_capacity(n);
        self.until(&format!("{n} requests to reach the HOLD handler"), || {
            let rx = lock(&self.held);
            while let Ok(r) = rx.try_recv() {
                out.push(r);
            }
            out.len() >= n
        });
        assert_eq!(out.len(), n, "more held requests than expected");
        out
    }

    /// A call that works on every engine: blocking on the real ones, a driven future on
    /// Stepped. Returns the response and whether the call was acknowledged.
    pub fn call(&self, opts: &CallOptions, f: FunctionId, args: &[u8]) -> Result<(Vec<u8>, bool), RpcError> {
        if self.real() {
            let mut resp = b"garbage".to_vec();
            self.channel.call_with(opts, f, args, &mut resp).map(|info| (resp, info.acked))
        } else {
            let mut fut = self.channel.call_future(opts, f, args)?;
            self.until("a call to complete", || fut.is_done());
            let acked = fut.is_acked();
            finished(&mut fut).map(|v| (v, acked))
        }
    }

    /// A call on another channel to the rig's server, on every engine: blocking on the real
    /// ones, a driven future on Stepped (the rig's pump drives the server, the wait polls `ch`).
    pub fn call_on(&self, ch: &Channel<Nic>, opts: &CallOptions, f: FunctionId, args: &[u8]) -> Outcome {
        if self.real() {
            let mut resp = b"garbage".to_vec();
            ch.call_with(opts, f, args, &mut resp).map(|_| resp)
        } else {
            let mut fut = ch.call_future(opts, f, args)?;
            self.until("a call on the second channel", || {
                ch.poll();
                fut.is_done()
            });
            finished(&mut fut)
        }
    }

    /// An ECHO call that must succeed.
    #[track_caller]
    pub fn echo(&self, opts: &CallOptions, args: &[u8]) {
        let (resp, _) = self
            .call(opts, ECHO, args)
            .unwrap_or_else(|e| panic!("{:?}: echo call with {opts:?} failed: {e}", self.engine));
        assert_eq!(resp, args, "{:?}: echo response", self.engine);
    }

    /// Drives until nothing is in use on either side and every credit is back, and checks that
    /// nothing was malformed.
    #[track_caller]
    pub fn drain(&self) {
        let full = self.full_credits();
        self.until("the channel and the server to drain", || {
            let s = self.channel.stats();
            s.tx_in_use == 0 && s.table_in_use == 0 && s.credits == full && self.server.tx_in_use() == 0
        });
        self.assert_no_protocol_errors();
    }

    /// Drives until the channel has no context or table slot in use (credits are not checked:
    /// for a closed channel or a failed queue they never come back).
    #[track_caller]
    pub fn drain_closed(&self) {
        self.until("the channel's contexts and table slots to come back", || {
            let s = self.channel.stats();
            s.tx_in_use == 0 && s.table_in_use == 0
        });
        self.assert_no_protocol_errors();
    }

    #[track_caller]
    pub fn assert_no_protocol_errors(&self) {
        assert_eq!(self.channel.stats().protocol_errors, 0, "{:?}: client protocol errors", self.engine);
        assert_eq!(self.server.stats().protocol_errors, 0, "{:?}: server protocol errors", self.engine);
    }
}
