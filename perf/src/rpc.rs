//! RPC-level tests: a `Channel` calling a `Server` over two NICs, in one process (the TCP
//! control plane on 127.0.0.1, the data path on the NICs).
//!
//! - `lat`: blocking calls (`Channel::call_with`); the client thread polls its own channel.
//!   With `--one-thread` the call is started with a callback and the client thread polls both
//!   the channel and the server.
//! - `rate`: calls with completion callbacks, up to `window` in flight, `batch` started between
//!   two polls of the channel (more than one: staged in a `CallBatch` and posted together, one
//!   doorbell per queue and up to 16 calls); the server echoes the arguments.
//! - `bw`: the same loop, but the server replies with no data (one-way bytes).
//!
//! - `echo`: blocking calls whose arguments and response are `size` bytes, reported as MiB/s of
//!   arguments, next to a plain `memcpy` of the same size measured right after, in the same run.
//! - `oneway`: blocking calls whose `size` bytes of arguments already lie in memory registered on
//!   the client's device (`Channel::call_segments_with`: the server READs them where they are)
//!   and whose reply is empty; reported like `echo`. The one-way rendezvous transfer.
//!
//! Arguments up to the message size less the 20-byte request header travel eagerly, inside the
//! request message; larger ones (or all, with `--rendezvous`) by rendezvous: the server RDMA
//! READs them and RDMA-WRITEs the echo into a response buffer the call names.

use crate::cli::{Plan, Spec, Test, What};
use crate::progress::{time_round_trips, Progress};
use crate::stats::{Budget, Clock, Latency, Measured, Throughput};
use bypass::hal::Device;
use bypass::{
    CallMode, CallOptions, Channel, ChannelConfig, FunctionId, Functions, RpcError, Server, ServerConfig,
    Status,
};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

type Res<T> = Result<T, String>;

/// Echoes the arguments.
const ECHO: FunctionId = match FunctionId::new(0x100, 1, true, 1) {
    Some(f) => f,
    None => panic!("invalid function id"),
};
/// Replies with no data.
const SINK: FunctionId = match FunctionId::new(0x100, 1, true, 2) {
    Some(f) => f,
    None => panic!("invalid function id"),
};

const TICK: u64 = 4096;

/// A channel to a server, and the server when it runs in this process.
pub struct Rig<D: Device + Clone> {
    server: Option<Server<D>>,
    channel: Channel<D>,
    /// The channel's device (`oneway` registers its arguments there).
    client_nic: D,
    one_thread: bool,
    rendezvous: bool,
}

/// The benchmark's server: its functions, on `nic` at `addr`.
fn start_server<D: Device + Clone>(nic: &D, addr: &str, plan: &Plan) -> Res<Server<D>> {
    let mut functions = Functions::new();
    functions.register(ECHO, |req| {
        // Eager: copied into the send buffer; rendezvous: written from the gathered buffer.
        let n = req.args().len();
        let _ = req.reply_args(n);
    });
    functions.register(SINK, |req| {
        let _ = req.reply_with(Status::Success, |_, _| Ok(0));
    });
    let window = plan.window as u32;
    let server_config = ServerConfig {
        msg_size: plan.msg_size,
        max_window: window.max(128),
        max_queues: plan.queues.max(64),
        workers: if plan.one_thread { 0 } else { 1 },
        pin: plan.pin.1.into_iter().collect(),
        // Room for a window of the largest rendezvous calls (each needs a power of two).
        rndv_memory_limit: (plan.specs.iter().map(|s| s.size).max().unwrap_or(0).next_power_of_two() as u64)
            .saturating_mul(plan.window as u64)
            .clamp(bypass::DEFAULT_RNDV_MEMORY_LIMIT, 4 << 30),
        ..ServerConfig::new("bypass-perf")
    };
    // Its workers pin themselves to `--pin`'s server CPU, or run where the process may; they must
    // not inherit the client's pin from this thread.
    crate::affinity::unpinned(|| Server::bind(nic, addr, server_config, functions))
        .map_err(|e| format!("start the server at {addr}: {e}"))
}

/// `--server ADDR`: serves the benchmark's functions until the process is killed.
pub fn serve<D: Device + Clone>(
    nic: &D,
    addr: &str,
    plan: &Plan,
    report: &mut crate::report::Report,
) -> Res<()> {
    let server = start_server(nic, addr, plan)?;
    report.note(&format!(
        "serving at {} (message size {} B); run `bypass-perf --client {}` with a matching --backend and --msg-size; stop with Ctrl-C",
        server.local_addr(),
        plan.msg_size,
        server.local_addr()
    ));
    loop {
        std::thread::park();
    }
}

impl<D: Device + Clone> Rig<D> {
    /// Starts a server on `server_nic` (one worker, or none with `--one-thread`) and connects a
    /// channel from `client_nic`.
    pub fn new(server_nic: &D, client_nic: &D, plan: &Plan) -> Res<Rig<D>> {
        let server = start_server(server_nic, "127.0.0.1:0", plan)?;
        let channel = Self::channel(client_nic, &server.local_addr().to_string(), plan)?;
        Ok(Rig {
            server: Some(server),
            channel,
            client_nic: client_nic.clone(),
            one_thread: plan.one_thread,
            rendezvous: plan.rendezvous,
        })
    }

    /// `--client ADDR`: a channel to a `bypass-perf --server` in another process.
    pub fn connect(client_nic: &D, addr: &str, plan: &Plan) -> Res<Rig<D>> {
        let channel = Self::channel(client_nic, addr, plan)?;
        Ok(Rig {
            server: None,
            channel,
            client_nic: client_nic.clone(),
            one_thread: false,
            rendezvous: plan.rendezvous,
        })
    }

    fn channel(client_nic: &D, addr: &str, plan: &Plan) -> Res<Channel<D>> {
        let window = plan.window as u32;
        let channel_config = ChannelConfig {
            window,
            queues: plan.queues,
            msg_size: plan.msg_size,
            table_size: (4 * plan.window).max(1024).next_power_of_two(),
            // A benchmark on a busy machine should be slow rather than fail.
            timeout: Some(Duration::from_secs(60)),
            ..ChannelConfig::new("bypass-perf")
        };
        Channel::connect(client_nic, addr, channel_config)
            .map_err(|e| format!("connect the channel to {addr}: {e}"))
    }

    /// `--one-thread`: this thread also runs the server's work.
    fn poll_server(&self) {
        if let Some(s) = &self.server {
            s.poll();
        }
    }

    /// The options of a call of `size`-byte arguments in `mode`: a response buffer for an echo
    /// that does not fit a message, rendezvous if forced.
    fn opts(&self, mode: CallMode, size: usize) -> CallOptions {
        let echoes = matches!(mode, CallMode::WaitRsp | CallMode::Ack);
        let max_response = if echoes && size > self.max_args() { size } else { 0 };
        CallOptions { rendezvous: self.rendezvous, max_response, ..CallOptions::mode(mode) }
    }

    /// Largest arguments a call may carry.
    pub fn max_args(&self) -> usize {
        self.channel.max_request_args()
    }

    /// One line about the counters, for the end of a run: nothing lost, nothing leaked.
    pub fn summary(&self) -> String {
        let c = self.channel.stats();
        let client = format!(
            "client: {} calls, {} timeouts, {} stale, {} contexts in use",
            c.calls, c.timeouts, c.stale, c.tx_in_use
        );
        match &self.server {
            Some(server) => {
                let s = server.stats();
                format!(
                    "server: {} requests, {} responses, {} ACKs, {} protocol errors; {client}",
                    s.requests, s.responses, s.acks, s.protocol_errors
                )
            }
            None => format!("server: in another process; {client}"),
        }
    }

    /// Runs one measurement.
    pub fn run(&self, spec: &Spec, plan: &Plan, mut progress: Progress) -> Res<Measured> {
        let Spec { test, what, size, budget, warmup } = *spec;
        let What::Mode(mode) = what else { return Err("internal: RPC run without a call mode".into()) };
        let args = vec![0xA5u8; size];
        let mut none = Progress::off();
        let m = match test {
            Test::Lat => {
                self.check_echo(mode, &args)?;
                if warmup > 0 {
                    self.latency(mode, &args, Budget::Iters(warmup), &mut none)?;
                }
                Measured::Lat(self.latency(mode, &args, budget, &mut progress)?)
            }
            Test::Rate | Test::Bw => {
                let f = if test == Test::Rate { ECHO } else { SINK };
                if warmup > 0 {
                    self.stream(mode, f, &args, Budget::Iters(warmup), plan, &mut none)?;
                }
                Measured::Thru(self.stream(mode, f, &args, budget, plan, &mut progress)?)
            }
            Test::Echo => {
                if !matches!(mode, CallMode::WaitRsp | CallMode::Ack) || self.one_thread {
                    return Err("-t echo needs --mode wait or ack, and two threads".into());
                }
                self.check_echo(mode, &args)?;
                if warmup > 0 {
                    self.latency(mode, &args, Budget::Iters(warmup), &mut none)?;
                }
                let l = self.latency(mode, &args, budget, &mut progress)?;
                // The same bytes with a plain memcpy, now, for comparison.
                let (copies, copy_secs) = crate::stats::memcpy(size, Duration::from_millis(300));
                Measured::Echo(crate::stats::Echo {
                    iters: l.iters,
                    size,
                    secs: l.secs,
                    copies,
                    copy_secs,
                    ways: 2,
                })
            }
            Test::Oneway => {
                if !matches!(mode, CallMode::WaitRsp | CallMode::Ack) || self.one_thread {
                    return Err("-t oneway needs --mode wait or ack, and two threads".into());
                }
                let mut region = self
                    .client_nic
                    .register(size.max(1), bypass::Access::REMOTE_READ | bypass::Access::LOCAL_WRITE)
                    .map_err(|e| format!("register {size} bytes of arguments: {e}"))?;
                bypass::MemoryRegion::write(&mut region, 0, &args)
                    .map_err(|e| format!("fill the arguments: {e}"))?;
                let region = std::sync::Arc::new(region);
                let opts = CallOptions { max_response: 0, ..CallOptions::mode(mode) };
                let ranges = [bypass::LocalRange::new(&region, 0, size)];
                let mut resp = Vec::new();
                let mut once = || -> Res<()> {
                    self.channel.call_segments_with(&opts, SINK, &ranges, &mut resp).map_err(call_err)?;
                    if !resp.is_empty() {
                        return Err(format!("the one-way call returned {} bytes, expected none", resp.len()));
                    }
                    Ok(())
                };
                if warmup > 0 {
                    time_round_trips(Budget::Iters(warmup), &mut none, &mut once)?;
                }
                let l = time_round_trips(budget, &mut progress, &mut once)?;
                let (copies, copy_secs) = crate::stats::memcpy(size, Duration::from_millis(300));
                Measured::Echo(crate::stats::Echo {
                    iters: l.iters,
                    size,
                    secs: l.secs,
                    copies,
                    copy_secs,
                    ways: 1,
                })
            }
        };
        progress.finish();
        Ok(m)
    }

    /// One call whose response is checked (modes with a response).
    fn check_echo(&self, mode: CallMode, args: &[u8]) -> Res<()> {
        if self.one_thread {
            return Ok(());
        }
        let mut resp = Vec::new();
        self.channel.call_with(&self.opts(mode, args.len()), ECHO, args, &mut resp).map_err(call_err)?;
        let want: &[u8] = if matches!(mode, CallMode::WaitRsp | CallMode::Ack) { args } else { &[] };
        if resp != want {
            return Err(format!("the echo returned {} bytes, expected {}", resp.len(), want.len()));
        }
        Ok(())
    }

    fn latency(&self, mode: CallMode, args: &[u8], budget: Budget, progress: &mut Progress) -> Res<Latency> {
        let opts = self.opts(mode, args.len());
        let mut resp = Vec::with_capacity(args.len());
        let done = &DONE;
        time_round_trips(budget, progress, || {
            if self.one_thread {
                let before = done.count.load(Ordering::Relaxed);
                self.channel
                    .call_callback(&opts, ECHO, args, |r| DONE.finish(r.map(|_| ())))
                    .map_err(call_err)?;
                while done.count.load(Ordering::Relaxed) == before {
                    self.poll_server();
                    self.channel.poll();
                }
                done.check()?;
            } else {
                self.channel.call_with(&opts, ECHO, args, &mut resp).map_err(call_err)?;
            }
            Ok(())
        })
    }

    fn stream(
        &self,
        mode: CallMode,
        function: FunctionId,
        args: &[u8],
        budget: Budget,
        plan: &Plan,
        progress: &mut Progress,
    ) -> Res<Throughput> {
        let max_response = if function == ECHO { self.opts(mode, args.len()).max_response } else { 0 };
        let opts = CallOptions { wait_for_credit: false, max_response, ..self.opts(mode, args.len()) };
        let done = &DONE;
        done.check()?;
        let base = done.count.load(Ordering::Relaxed);
        let (window, batch) = (plan.window as u64, plan.batch as u64);
        let mut limit = budget.iters();
        let mut started = 0u64;
        let mut turns = 0u32;
        let mut next_tick = TICK;
        let clock = Clock::start(budget);
        loop {
            let finished = done.count.load(Ordering::Relaxed) - base;
            if limit.is_none() {
                turns = turns.wrapping_add(1);
                if turns % 16 == 0 && !clock.more(finished, Some(Instant::now())) {
                    limit = Some(started);
                }
            }
            if let Some(l) = limit {
                if finished >= l {
                    break;
                }
            }
            let mut k = 0;
            // More than one call per turn: staged and posted together (one doorbell).
            let mut staged = (batch > 1).then(|| self.channel.batch());
            while k < batch && below(started, limit) && started - finished < window {
                let callback = |r: Result<&[u8], RpcError>| DONE.finish(r.map(|_| ()));
                let start = match staged.as_mut() {
                    Some(b) => b.call_callback(&opts, function, args, callback),
                    None => self.channel.call_callback(&opts, function, args, callback),
                };
                match start {
                    Ok(()) => {
                        started += 1;
                        k += 1;
                    }
                    Err(e) if e.is_would_block() => break,
                    Err(e) => return Err(call_err(e)),
                }
            }
            drop(staged);
            if self.one_thread {
                self.poll_server();
            }
            self.channel.poll();
            if finished >= next_tick {
                next_tick += TICK;
                progress.tick(&clock, finished);
            }
        }
        let secs = clock.start.elapsed().as_secs_f64();
        done.check()?;
        Ok(Throughput { msgs: started, bytes: started * args.len() as u64, secs })
    }
}

fn below(n: u64, limit: Option<u64>) -> bool {
    match limit {
        Some(l) => n < l,
        None => true,
    }
}

fn call_err(e: RpcError) -> String {
    format!("call failed: {e}")
}

/// Calls finished by callbacks, and the first failure.
struct Done {
    count: AtomicU64,
    /// Set once `error` holds a failure: `check`, called after every one-thread round trip,
    /// reads this instead of taking the mutex (two locked instructions the HAL loop does not
    /// have, and which the per-call counts of perf/callgrind.sh would charge to the RPC layer).
    failed: AtomicBool,
    error: Mutex<Option<String>>,
}

/// The one [`Done`] of the process (one measurement runs at a time; each counts from the value
/// it finds). A static, so the callbacks capture nothing: a closure with no captures is a
/// zero-sized type, and boxing it in `call_callback` allocates nothing, so the measured loop
/// does not time the tool's own allocator.
static DONE: Done =
    Done { count: AtomicU64::new(0), failed: AtomicBool::new(false), error: Mutex::new(None) };

impl Done {
    fn finish(&self, r: Result<(), RpcError>) {
        if let Err(e) = r {
            let mut slot = self.error.lock().unwrap_or_else(|p| p.into_inner());
            slot.get_or_insert_with(|| call_err(e));
            self.failed.store(true, Ordering::Release);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    fn check(&self) -> Res<()> {
        if !self.failed.load(Ordering::Acquire) {
            return Ok(());
        }
        self.failed.store(false, Ordering::Relaxed);
        match self.error.lock().unwrap_or_else(|p| p.into_inner()).take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}
