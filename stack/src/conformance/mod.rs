//! The RPC conformance suite: end-to-end scenarios of the stack, generic over the device pair
//! they run on (feature `conformance`).
//!
//! The same scenarios run on the simulator (`stack/tests/rpc_suite.rs`, Inline and Threaded
//! engines) and on real RDMA devices (`bypass-hw-tests`, e.g. Soft-RoCE `rxe0` in the CI
//! guest). A backend provides an [`Env`] — a server device, a client device and a way to let
//! time pass — and instantiates the suite with [`rpc_suite!`](crate::rpc_suite), which expands
//! to one `#[test]` per scenario:
//!
//! ```ignore
//! bypass::rpc_suite!(inline, || my_backend::RpcEnv::new());
//! bypass::rpc_suite!(on_hw, skip_unless my_backend::RpcEnv::from_env); // None: skipped
//! ```
//!
//! Scenarios assert what a user of the RPC API notices: response bytes, which error a call ends
//! with, that every call completes exactly once, the counters of [`ChannelStats`] and
//! [`ServerStats`](crate::ServerStats). They never assert timing. The server always has a worker
//! thread (it polls by itself), blocking calls poll the channel themselves, and callbacks and
//! futures are driven by the test thread polling the channel. Every wait is bounded by
//! [`WAIT_BUDGET`] of real time, generous because Soft-RoCE in an emulated guest takes hundreds
//! of microseconds (on a loaded host, milliseconds) per message. The suite needs devices that
//! move on real time: a stepped simulator, where nothing happens unless the test drives it, is
//! covered by `stack/tests/e2e.rs` instead.
//!
//! Nothing here depends on the simulator; a queue failure is injected with
//! [`Channel::fail_queue`], which works on every backend.

use crate::hal::Device;
use crate::{
    CallFuture, CallMode, Channel, ChannelConfig, ChannelStats, FunctionId, Functions, Request, RpcError,
    Server, ServerConfig, Status,
};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

mod connect;
mod flow;
mod robustness;
mod scenarios;
pub use connect::*;
pub use flow::*;
pub use robustness::*;
pub use scenarios::*;

/// A test environment: a server device and a client device that can reach each other, and
/// control over time.
pub trait Env {
    /// The device type under test.
    type Dev: Device + Clone;
    /// The device the server binds to.
    fn server(&self) -> &Self::Dev;
    /// The device the client's channels use (may be the same device as the server's: queue
    /// pairs then connect through its loopback).
    fn client(&self) -> &Self::Dev;
    /// Lets the devices make progress on work already posted; devices that progress on their
    /// own may return at once.
    fn progress(&self);
    /// Lets `d` of time pass (a sleep, on real-time devices).
    fn advance(&self, d: Duration);
    /// The ACK timeout of the queues of the scenarios' servers and channels (unless a scenario
    /// sets its own); `None` keeps `QueueConfig::default()`'s. For environments whose devices run
    /// on threads a loaded host can starve for longer than `retry_count` default timeouts (the
    /// simulator's real-time engines on a shared CI machine): a longer timeout keeps a starved
    /// thread from exhausting the retry budget and closing the channel, at the price of slower
    /// repairs of lost packets.
    fn ack_timeout(&self) -> Option<crate::hal::AckTimeout> {
        None
    }
}

/// A channel configuration for the suite's server, with the environment's ACK timeout.
fn channel_config<E: Env>(env: &E) -> ChannelConfig {
    let mut c = ChannelConfig::new(SERVER_NAME);
    if let Some(t) = env.ack_timeout() {
        c.queue_config.timeout = t;
    }
    c
}

/// The longest any single wait of a scenario may take (real time) before it gives up.
pub const WAIT_BUDGET: Duration = Duration::from_secs(60);
/// How long a scenario watches for something that must not happen (a second completion).
pub const QUIET: Duration = Duration::from_millis(50);
/// The per-call deadline of the timeout scenarios.
pub const CALL_TIMEOUT: Duration = Duration::from_millis(200);
/// How long an idle wait round lets pass, after spinning a while without progress.
const IDLE_TICK: Duration = Duration::from_micros(50);
/// Idle rounds spent yielding before one sleeps for [`IDLE_TICK`].
const IDLE_SPINS: u32 = 64;

/// The server's name in every scenario.
const SERVER_NAME: &str = "rpc-suite";

/// Echoes its arguments; counts its invocations and records the arguments of calls that want
/// no response ([`Rig::seen`]).
const ECHO: FunctionId = fid(1);
/// Hands the request to the test ([`Rig::take_held`]) without replying.
const HOLD: FunctionId = fid(2);
/// Replies with the status whose wire value is its first argument byte, and no data.
const REPLY_STATUS: FunctionId = fid(3);
/// Replies with the largest response the client accepts: bytes 0, 1, 2, … (mod 251).
const BIG: FunctionId = fid(4);
/// Hands the request to another thread (the rig's `offload` receiver) and returns only once that thread
/// says it has replied (a handler offloading to a pool and waiting for it).
const OFFLOAD: FunctionId = fid(5);
/// Panics while it still holds the request.
const PANIC: FunctionId = fid(6);
/// Echoes, then panics (the reply is already on its way).
const PANIC_AFTER_REPLY: FunctionId = fid(7);
/// Replies with `reply_with` whose fill closure panics.
const PANIC_IN_FILL: FunctionId = fid(8);
/// Hands the request to the test (like HOLD), then panics.
const PANIC_AFTER_MOVE: FunctionId = fid(9);
/// Not registered.
const MISSING: FunctionId = fid(99);

const fn fid(method: u32) -> FunctionId {
    match FunctionId::new(0x20, 0x2, true, method) {
        Some(f) => f,
        None => panic!("bad function id"),
    }
}

type Outcome = Result<Vec<u8>, RpcError>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A deterministic byte pattern (so a misplaced byte is caught, not just a missing one).
fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ ((i >> 8) as u8)).collect()
}

/// A distinct payload per (caller, call), of varying length.
fn payload(t: usize, i: usize) -> Vec<u8> {
    let mut v = format!("t{t}:c{i}:").into_bytes();
    let extra = (t * 37 + i * 13) % 300;
    v.extend((0..extra).map(|k| (k ^ i ^ (t << 4)) as u8));
    v
}

/// What the response of a successful call in `mode` holds when the server echoes `args`.
fn echoed(mode: CallMode, args: &[u8]) -> &[u8] {
    if wants_response(mode) {
        args
    } else {
        &[]
    }
}

/// Whether a call in `mode` gets a response (data) from the server.
fn wants_response(mode: CallMode) -> bool {
    matches!(mode, CallMode::WaitRsp | CallMode::Ack)
}

/// Whether a call in `mode` asks the server for an ACK.
fn wants_ack(mode: CallMode) -> bool {
    matches!(mode, CallMode::Ack | CallMode::AckEarlyRsp)
}

/// Records every callback invocation: `log[i]` holds each outcome call `i` got (exactly one, if
/// the stack is right).
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<Vec<Outcome>>>>);

impl Log {
    fn cb(&self, i: usize) -> impl FnOnce(Result<&[u8], RpcError>) + Send + 'static {
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
    fn completed(&self) -> usize {
        lock(&self.0).iter().filter(|o| !o.is_empty()).count()
    }

    /// Asserts that exactly calls `0..n` completed, each exactly once.
    #[track_caller]
    fn assert_once(&self, n: usize) {
        let v = lock(&self.0);
        assert_eq!(v.len(), n, "callbacks ran for calls 0..{} but {n} calls were started", v.len());
        for (i, o) in v.iter().enumerate() {
            assert_eq!(o.len(), 1, "callback of call {i} ran {} times: {o:?}", o.len());
        }
    }

    /// Runs `f` on call `i`'s (first) outcome.
    #[track_caller]
    fn with<R>(&self, i: usize, f: impl FnOnce(&Outcome) -> R) -> R {
        let v = lock(&self.0);
        let o = v.get(i).and_then(|o| o.first()).unwrap_or_else(|| panic!("call {i} has no outcome"));
        f(o)
    }
}

/// A waker that records that it was woken.
#[derive(Default)]
struct Flag(AtomicBool);

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.0.store(true, Ordering::SeqCst);
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// A request an OFFLOAD handler handed on, and the way to tell that handler it was answered.
type Offloaded<D> = (Request<D>, mpsc::Sender<()>);

/// A server with the suite's functions, one channel to it, and what the handlers saw.
struct Rig<'e, E: Env> {
    env: &'e E,
    // Dropped in this order: the channel, the server, then the requests the test still holds.
    channel: Channel<E::Dev>,
    server: Option<Server<E::Dev>>,
    held: Mutex<Receiver<Request<E::Dev>>>,
    offload: Mutex<Receiver<Offloaded<E::Dev>>>,
    hits: Arc<AtomicUsize>,
    seen: Arc<Mutex<Vec<Vec<u8>>>>,
    window: u32,
}

impl<'e, E: Env> Rig<'e, E> {
    fn new(env: &'e E) -> Self {
        Self::with(env, |_, _| {})
    }

    /// A server (one worker unless `tweak` says more) with ECHO, HOLD, REPLY_STATUS and BIG on
    /// `env.server()`, and a channel to it from `env.client()`.
    fn with(env: &'e E, tweak: impl FnOnce(&mut ChannelConfig, &mut ServerConfig)) -> Self {
        let hits = Arc::new(AtomicUsize::new(0));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (tx, held) = mpsc::channel::<Request<E::Dev>>();
        let mut f = Functions::new();
        let (h, s) = (hits.clone(), seen.clone());
        f.register(ECHO, move |req| {
            h.fetch_add(1, Ordering::SeqCst);
            if !req.wants_response() {
                lock(&s).push(req.args().to_vec());
            }
            // Eager: copied into the send buffer; rendezvous arguments are written back from the
            // gathered buffer into the caller's response buffer (RDMA WRITE), if it named one.
            let n = req.args().len();
            let _ = req.reply_args(n);
        });
        let moved = tx.clone();
        f.register(HOLD, move |req| {
            // If the test stopped listening, the request is dropped (cleanly).
            let _ = tx.send(req);
        });
        let (otx, offload) = mpsc::channel::<Offloaded<E::Dev>>();
        f.register(OFFLOAD, move |req| {
            let (done_tx, done_rx) = mpsc::channel();
            if otx.send((req, done_tx)).is_ok() {
                let _ = done_rx.recv_timeout(WAIT_BUDGET);
            }
        });
        f.register(PANIC, |req| {
            let n = req.args().len();
            panic!("rpc-suite: a handler panics holding its request ({n} bytes of arguments)");
        });
        f.register(PANIC_AFTER_REPLY, |req| {
            let n = req.args().len();
            let _ = req.reply_args(n);
            panic!("rpc-suite: a handler panics after replying");
        });
        f.register(PANIC_IN_FILL, |req| {
            let _ =
                req.reply_with(Status::Success, |_, _| panic!("rpc-suite: a reply's fill closure panics"));
        });
        f.register(PANIC_AFTER_MOVE, move |req| {
            let _ = moved.send(req);
            panic!("rpc-suite: a handler panics after handing its request on");
        });
        f.register(REPLY_STATUS, |req| {
            let status = req.args().first().and_then(|&b| Status::from_u8(b).ok()).unwrap_or(Status::HdrErr);
            let _ = req.reply_status(status, &[]);
        });
        f.register(BIG, |req| {
            let n = req.max_response();
            let _ = req.reply_with(Status::Success, |_, out| {
                for (i, b) in out[..n].iter_mut().enumerate() {
                    *b = (i % 251) as u8;
                }
                Ok(n)
            });
        });
        let mut scfg = ServerConfig::new(SERVER_NAME);
        scfg.workers = 1;
        if let Some(t) = env.ack_timeout() {
            scfg.queue_config.timeout = t;
        }
        let mut ccfg = channel_config(env);
        tweak(&mut ccfg, &mut scfg);
        assert!(scfg.workers >= 1, "the suite's servers poll by themselves: workers >= 1");
        let window = ccfg.window.min(scfg.max_window);
        let server = Server::bind(env.server(), "127.0.0.1:0", scfg, f).expect("bind the server");
        let channel = Channel::connect(env.client(), server.local_addr(), ccfg).expect("connect the channel");
        let rig = Rig {
            env,
            channel,
            server: Some(server),
            held: Mutex::new(held),
            offload: Mutex::new(offload),
            hits,
            seen,
            window,
        };
        let s = rig.channel.stats();
        assert_eq!(s.credits, rig.full_credits(), "a fresh channel has every credit: {s:?}");
        assert_eq!(s.ready_queues, rig.channel.queues(), "a fresh channel has every queue READY: {s:?}");
        rig
    }

    fn server(&self) -> &Server<E::Dev> {
        self.server.as_ref().expect("the server was dropped")
    }

    fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }

    /// The arguments of the ECHO calls without a response, in arrival order.
    fn seen(&self) -> Vec<Vec<u8>> {
        lock(&self.seen).clone()
    }

    fn full_credits(&self) -> u64 {
        u64::from(self.window) * self.channel.queues() as u64
    }

    /// One round of driving: poll the channel; when that finds nothing, let the devices
    /// progress, and now and then let a little time pass.
    fn pump(&self, idle: &mut u32) {
        if self.channel.poll() > 0 {
            *idle = 0;
            return;
        }
        self.env.progress();
        *idle += 1;
        if *idle % IDLE_SPINS == 0 {
            self.env.advance(IDLE_TICK);
        } else {
            std::thread::yield_now();
        }
    }

    /// Drives until `cond` holds; panics, saying what it waited for and the state it saw, if it
    /// does not within [`WAIT_BUDGET`].
    #[track_caller]
    fn until(&self, what: &str, mut cond: impl FnMut() -> bool) {
        let start = Instant::now();
        let mut idle = 0;
        while !cond() {
            if start.elapsed() > WAIT_BUDGET {
                panic!("gave up waiting for {what} after {WAIT_BUDGET:?}; {}", self.state());
            }
            self.pump(&mut idle);
        }
    }

    /// Drives for [`QUIET`], so that something that must not happen has a chance to.
    fn settle(&self) {
        let start = Instant::now();
        let mut idle = 0;
        while start.elapsed() < QUIET {
            self.pump(&mut idle);
        }
    }

    fn state(&self) -> String {
        let server = match &self.server {
            Some(s) => format!(
                "server {:?}, server tx_in_use {}, connections {}",
                s.stats(),
                s.tx_in_use(),
                s.connections()
            ),
            None => "server dropped".into(),
        };
        format!("channel {:?} (closed: {}); {server}", self.channel.stats(), self.channel.is_closed())
    }

    /// Drives until `n` requests reached the HOLD handler and returns them.
    #[track_caller]
    fn take_held(&self, n: usize) -> Vec<Request<E::Dev>> {
        let mut out = Vec::with_capacity(n);
        self.until(&format!("{n} request(s) to reach the HOLD handler"), || {
            let rx = lock(&self.held);
            while let Ok(r) = rx.try_recv() {
                out.push(r);
            }
            out.len() >= n
        });
        assert_eq!(out.len(), n, "more requests reached the HOLD handler than were sent there");
        out
    }

    /// Polls `fut` to completion like an executor would: poll, and poll again only once it has
    /// been woken (driving the channel meanwhile). Returns the outcome and whether the call was
    /// acknowledged when it completed.
    #[track_caller]
    fn block_on(&self, fut: &mut CallFuture) -> (Outcome, bool) {
        let flag = Arc::new(Flag::default());
        let waker = Waker::from(flag.clone());
        let start = Instant::now();
        let mut idle = 0;
        loop {
            flag.0.store(false, Ordering::SeqCst);
            if let Poll::Ready(out) = Pin::new(&mut *fut).poll(&mut Context::from_waker(&waker)) {
                return (out, fut.is_acked());
            }
            while !flag.0.load(Ordering::SeqCst) {
                if start.elapsed() > WAIT_BUDGET {
                    panic!(
                        "a call future was not woken within {WAIT_BUDGET:?} (done: {}); {}",
                        fut.is_done(),
                        self.state()
                    );
                }
                self.pump(&mut idle);
            }
        }
    }

    /// Drives until the channel and the server have nothing in use and every credit is back, and
    /// checks that neither side saw a malformed message.
    #[track_caller]
    fn drain(&self) {
        let full = self.full_credits();
        self.until("the channel and the server to drain", || {
            let s = self.channel.stats();
            s.tx_in_use == 0 && s.table_in_use == 0 && s.credits == full && self.server().tx_in_use() == 0
        });
        self.assert_no_protocol_errors();
    }

    /// Drives until the channel has no send context or table slot in use (credits are not
    /// checked: for a closed channel or a failed queue they never come back).
    #[track_caller]
    fn drain_closed(&self) {
        self.until("the channel's contexts and table slots to come back", || {
            let s = self.channel.stats();
            s.tx_in_use == 0 && s.table_in_use == 0
        });
        self.assert_no_protocol_errors();
    }

    #[track_caller]
    fn assert_no_protocol_errors(&self) {
        let c = self.channel.stats();
        assert_eq!(c.protocol_errors, 0, "the client dropped malformed messages: {c:?}");
        if let Some(s) = &self.server {
            let s = s.stats();
            assert_eq!(s.protocol_errors, 0, "the server dropped malformed messages: {s:?}");
        }
    }

    #[track_caller]
    fn stats(&self) -> ChannelStats {
        self.channel.stats()
    }
}

/// Expands to one `#[test]` per RPC conformance scenario, in a module named `$name`, each
/// calling the scenario with a fresh environment from `$make_env`.
///
/// With `skip_unless`, `$make_env` is called with the scenario's name and returns an
/// `Option<Env>`: `None` skips the scenario (the closure prints why), for suites that run only
/// where a device is present (`bypass-hw-tests`).
#[macro_export]
macro_rules! rpc_suite {
    ($name:ident, skip_unless $make_env:expr) => {
        $crate::__rpc_suite_module!($name, |scenario: &str| ($make_env)(scenario));
    };
    ($name:ident, $make_env:expr) => {
        $crate::__rpc_suite_module!($name, |_: &str| Some(($make_env)()));
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __rpc_suite_module {
    ($name:ident, $make_env:expr) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            $crate::__rpc_suite_tests!($make_env;
                blocking_calls_every_mode,
                callbacks_every_mode,
                futures_every_mode,
                message_size_limits,
                large_rendezvous_echo,
                ack_arrives_before_response,
                unknown_function,
                handler_status_errors,
                concurrent_callers,
                timeout_then_late_reply,
                server_dropped_mid_call,
                client_close_mid_call,
                queue_error_mid_flight,
                multi_queue_round_robin,
                would_block_without_credit,
                deadlines_each_their_own,
                deferred_replies,
                client_worker_group,
                ack_overtaken_by_offloaded_reply,
                contexts_held_by_unreaped_send_completions,
                server_shutdown_mid_call,
                handler_panics_are_contained,
                callback_panics_are_contained,
                huge_timeouts_saturate,
                failed_calls_leave_no_stale_response,
                reply_after_client_close_is_closed,
                control_errors,
                connect_takes_a_host_port_tuple,
                no_ack_timer_is_valid,
            );
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __rpc_suite_tests {
    ($make_env:expr; $($scenario:ident),* $(,)?) => {
        $(
            #[test]
            fn $scenario() {
                if let Some(env) = ($make_env)(stringify!($scenario)) {
                    $crate::conformance::$scenario(&env);
                }
            }
        )*
    };
}
