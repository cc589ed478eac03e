//! Command-line options (clap derive) and their validation into a [`Plan`].
//!
//! Every check here returns a one-line message; `main` hands it to clap, which prints it with the
//! usage and exits with status 2, as for clap's own errors.

use crate::stats::Budget;
use bypass::CallMode;
use clap::{Parser, ValueEnum};
use std::path::PathBuf;
use std::time::Duration;

/// Largest window (calls or work requests in flight); the RPC channel's limit.
pub const MAX_WINDOW: u32 = 4096;
/// Largest HAL message: the simulator's `max_msg_size`.
pub const MAX_HAL_SIZE: usize = 16 << 20;
/// Largest TCP baseline message.
pub const MAX_TCP_SIZE: usize = 64 << 20;
/// URPC request header in front of the arguments of every call.
pub const RPC_REQUEST_HEADER: usize = 20;
/// Default sizes of `lat` and `rate`, and of `bw`.
const DEFAULT_SIZES: [usize; 3] = [64, 1024, 4096];
const DEFAULT_BW_SIZE: usize = 65536;
/// Upper end of `-a` at the HAL and TCP levels (override with `--max-size`).
const DEFAULT_SWEEP_MAX: usize = 65536;
/// Upper end of `-a` at the RPC level: past the eager limit into rendezvous sizes.
const DEFAULT_RPC_SWEEP_MAX: usize = 1 << 20;
/// Largest RPC argument size by rendezvous.
pub const MAX_RNDV_SIZE: usize = 1 << 30;
/// Most memory the RPC buffers of one side may take (send and receive buffers, all queues).
const MAX_RPC_BUFFERS: usize = 1 << 30;

/// perftest-style latency, bandwidth and message-rate tests of the bypass stack.
///
/// With no arguments: RPC round-trip latency and call rate at 64 B, 1 KiB and 4 KiB, WAIT_RSP
/// mode, on the simulator (Inline engine), one client thread and one server worker, after the
/// machine's bare cache-line bounce between two threads. See docs/perf.md.
#[derive(Parser, Debug)]
#[command(name = "bypass-perf", version, max_term_width = 100)]
pub struct Args {
    /// Tests to run, comma-separated: lat (ping-pong round trip), bw (one-way bandwidth),
    /// rate (messages or calls per second) [default: lat,rate]
    #[arg(short = 't', long = "test", value_enum, value_delimiter = ',', value_name = "TEST")]
    pub tests: Vec<Test>,

    /// Layer to measure: rpc (Channel calls to a Server), hal (raw queue pairs), tcp (plain
    /// loopback TCP sockets, the baseline)
    #[arg(long, value_enum, default_value = "rpc")]
    pub level: Level,

    /// HAL operation(s), comma-separated: send, write, write-imm, read, all [default: send]
    #[arg(long, value_enum, value_delimiter = ',', value_name = "OP")]
    pub op: Vec<OpArg>,

    /// RPC call mode(s), comma-separated: wait (WAIT_RSP), ack (ACK), early (EARLY_RSP),
    /// ackearly (ACK_EARLY_RSP), all [default: wait]
    #[arg(long, value_enum, value_delimiter = ',', value_name = "MODE")]
    pub mode: Vec<ModeArg>,

    /// Message (RPC: argument) sizes in bytes, comma-separated; k, m suffixes are powers of
    /// 1024 [default: 64,1k,4k; bw: 64k]
    #[arg(short = 's', long = "size", value_delimiter = ',', value_parser = parse_size, value_name = "BYTES")]
    pub sizes: Vec<usize>,

    /// Sweep sizes over powers of two from 2 bytes up to --max-size (RPC: through the largest
    /// eager argument size, which is the message size less the 20-byte request header, and on
    /// into rendezvous sizes, where arguments and responses travel by RDMA READ and WRITE)
    #[arg(short = 'a', long = "all-sizes", conflicts_with = "sizes")]
    pub all_sizes: bool,

    /// RPC: send every call's arguments by rendezvous (DMA descriptors the server READs), also
    /// sizes that fit a message; sizes above the message size (default 4096) are allowed, up to 1g
    #[arg(long)]
    pub rendezvous: bool,

    /// Upper end of the -a sweep [default: hal, tcp: 64k; rpc: 1m (rendezvous above the message
    /// size less 20)]
    #[arg(long, value_parser = parse_size, value_name = "BYTES", requires = "all_sizes")]
    pub max_size: Option<usize>,

    /// RPC message size, header included (both directions) [default: the smallest power of two
    /// >= 4096 that holds the largest size plus the 20-byte header]
    #[arg(long, value_parser = parse_size, value_name = "BYTES")]
    pub msg_size: Option<usize>,

    /// Iterations per measurement: round trips (lat), messages or calls (bw, rate)
    /// [default: lat 100000, rate 500000, bw 20000]
    #[arg(short = 'n', long = "iters", value_name = "N", conflicts_with = "duration",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub iters: Option<u64>,

    /// Run each measurement for this many seconds instead of a number of iterations
    #[arg(short = 'D', long = "duration", value_name = "SECS", value_parser = parse_secs)]
    pub duration: Option<Duration>,

    /// Window: messages or calls in flight at most (bw, rate; RPC: the channel's credit window)
    #[arg(short = 'w', long, default_value_t = 32, value_name = "N")]
    pub window: u32,

    /// RPC: queue pairs of the channel (1..=256); calls are spread over them round-robin, and a
    /// batch (-b) posts each queue's share with one doorbell
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub queues: usize,

    /// Batch: work requests per doorbell (hal), calls started between two polls and posted
    /// together with one doorbell per queue and 16 calls (rpc, `Channel::batch`),
    /// messages per write() (tcp) [default: hal min(32, window); rpc window; tcp 1]
    #[arg(short = 'b', long, value_name = "N")]
    pub batch: Option<u32>,

    /// Warm-up iterations before each measurement [default: a tenth of -n, at most 10000 for lat
    /// and 50000 for bw and rate]
    #[arg(long, value_name = "N")]
    pub warmup: Option<u64>,

    /// NIC backend: `sim` (the software NIC, in this process), `sim+shm`, `sim+udp://IP:PORT`;
    /// simulator options after a comma, e.g. `sim,ack_hold=off` (never hold ACKs back for the next
    /// packet, for A/B runs), `sim+udp://127.0.0.1:0,ack_hold=off`;
    /// with `--features verbs` `verbs` (the first RDMA device), `verbs:rxe0`,
    /// `verbs:rxe0,gid=1,port=1,mtu=1024`; with `--features urma` `urma`,
    /// `urma:bypass_sim0,lib=PATH` (liburma, e.g. the simulated one)
    #[arg(long, default_value = "sim", value_parser = parse_backend, value_name = "BACKEND")]
    pub backend: String,

    /// Simulator engine: inline (device work on the callers' threads) or threaded (a device
    /// thread per NIC) [default: inline]
    #[arg(long, value_enum, value_name = "ENGINE")]
    pub engine: Option<EngineArg>,

    /// Serve at ADDR (TCP control plane) for a two-process RPC run, until killed; the other
    /// process runs --client ADDR. With the simulator, both need a byte wire:
    /// --backend sim+shm (one host) or sim+udp://IP:0
    #[arg(long, value_name = "ADDR", conflicts_with = "client")]
    pub server: Option<String>,

    /// Run the RPC tests against a `bypass-perf --server` at ADDR in another process (or host)
    #[arg(long, value_name = "ADDR")]
    pub client: Option<String>,

    /// Pin the client thread to the first CPU and the server thread (RPC worker) to the second
    #[arg(long, value_delimiter = ',', value_name = "CPU,CPU")]
    pub pin: Vec<usize>,

    /// TCP level: non-blocking sockets that both threads spin on, instead of blocking reads
    #[arg(long)]
    pub busy_poll: bool,

    /// Drive client and server from one thread (the software cost, no cache line crossing cores)
    #[arg(long)]
    pub one_thread: bool,

    /// Print one JSON object per result line instead of the table
    #[arg(long)]
    pub json: bool,

    /// Skip the bare cache-line bounce measured first
    #[arg(long)]
    pub no_bounce: bool,

    /// Measure only the bare cache-line bounce (the machine's state), then exit
    #[arg(long, conflicts_with = "no_bounce")]
    pub bounce_only: bool,

    /// Never draw the progress bar (it only appears on a terminal, after a second)
    #[arg(long)]
    pub no_progress: bool,

    /// Record a trace of a short run (iterations capped at 100) into FILE, for Perfetto
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Test {
    Lat,
    Bw,
    Rate,
    /// RPC only: blocking echo calls, as MiB/s of arguments, next to a memcpy of the same size
    Echo,
    /// RPC only: blocking one-way rendezvous calls: arguments already in registered memory
    /// (`Channel::call_segments_with`), READ by the server, empty reply; next to a memcpy
    Oneway,
}

impl Test {
    pub fn name(self) -> &'static str {
        match self {
            Test::Lat => "lat",
            Test::Bw => "bw",
            Test::Rate => "rate",
            Test::Echo => "echo",
            Test::Oneway => "oneway",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Level {
    Hal,
    Rpc,
    Tcp,
}

impl Level {
    pub fn name(self) -> &'static str {
        match self {
            Level::Hal => "hal",
            Level::Rpc => "rpc",
            Level::Tcp => "tcp",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OpArg {
    Send,
    Write,
    WriteImm,
    Read,
    All,
}

/// A HAL operation under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Two-sided SEND into a posted receive.
    Send,
    /// One-sided WRITE (lat: post to completion, the responder NIC's acknowledgement).
    Write,
    /// WRITE with immediate: the peer's CPU learns of it from a receive completion.
    WriteImm,
    /// One-sided READ (lat: post to completion).
    Read,
}

impl Op {
    pub fn name(self) -> &'static str {
        match self {
            Op::Send => "send",
            Op::Write => "write",
            Op::WriteImm => "write-imm",
            Op::Read => "read",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ModeArg {
    Wait,
    Ack,
    Early,
    Ackearly,
    All,
}

pub fn mode_name(m: CallMode) -> &'static str {
    match m {
        CallMode::WaitRsp => "wait",
        CallMode::Ack => "ack",
        CallMode::EarlyRsp => "early",
        CallMode::AckEarlyRsp => "ackearly",
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum EngineArg {
    Inline,
    Threaded,
}

impl EngineArg {
    pub fn name(self) -> &'static str {
        match self {
            EngineArg::Inline => "inline",
            EngineArg::Threaded => "threaded",
        }
    }
}

/// Checks the backend's kind against what this build has (opening it comes later, in `main`).
fn parse_backend(s: &str) -> Result<String, String> {
    let kind = s.split([':', '+', ',']).next().unwrap_or("");
    let compiled = bypass::backend::compiled();
    match kind {
        // The wire is part of the backend (sim+udp://127.0.0.1:0); the engine is --engine.
        // Options after plain `sim` (sim,ack_hold=off), for the in-process wire.
        "sim" if s.starts_with("sim+") || s.starts_with("sim,") => Ok(s.to_string()),
        "sim" if s != "sim" => Err(format!(
            "`{s}`: give the simulator's engine with --engine, and the backend as plain `sim` (or `sim,ack_hold=off` with options, `sim+udp://IP:PORT` for the UDP wire, `sim+shm` for shared memory)"
        )),
        k if compiled.contains(&k) => Ok(s.to_string()),
        "verbs" | "urma" | "vfio" => Err(format!(
            "the {kind} backend is not compiled in (build with `--features {kind}` where it exists); this build has: {}",
            compiled.join(", ")
        )),
        _ => Err(format!("unknown backend `{s}`: this build has: {}", compiled.join(", "))),
    }
}

/// A byte count: `4096`, `4k`, `4K`, `4KiB`, `1m`.
pub fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let lower = t.to_ascii_lowercase();
    let (digits, shift) = if let Some(d) = lower.strip_suffix("kib").or(lower.strip_suffix('k')) {
        (d, 10)
    } else if let Some(d) = lower.strip_suffix("mib").or(lower.strip_suffix('m')) {
        (d, 20)
    } else if let Some(d) = lower.strip_suffix('b') {
        (d, 0)
    } else {
        (lower.as_str(), 0)
    };
    let n: usize = digits.parse().map_err(|_| format!("`{t}` is not a size in bytes (e.g. 64, 4k, 1m)"))?;
    n.checked_mul(1 << shift).ok_or_else(|| format!("`{t}` is too large"))
}

fn parse_secs(s: &str) -> Result<Duration, String> {
    let secs: f64 = s.trim().parse().map_err(|_| format!("`{s}` is not a number of seconds"))?;
    if !(secs > 0.0 && secs <= 86_400.0) {
        return Err(format!("`{s}`: use a duration above 0 and at most 86400 seconds"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// What one measurement exercises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum What {
    Op(Op),
    Mode(CallMode),
    /// A TCP socket: blocking (false) or busy-polled (true).
    Tcp(bool),
}

impl What {
    pub fn name(self) -> &'static str {
        match self {
            What::Op(op) => op.name(),
            What::Mode(m) => mode_name(m),
            What::Tcp(false) => "blocking",
            What::Tcp(true) => "busy-poll",
        }
    }
}

/// One measurement.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spec {
    pub test: Test,
    pub what: What,
    pub size: usize,
    pub budget: Budget,
    pub warmup: u64,
}

/// Everything a run does, validated.
#[derive(Debug, Clone)]
pub struct Plan {
    pub level: Level,
    pub specs: Vec<Spec>,
    /// RPC: force rendezvous for every call with arguments.
    pub rendezvous: bool,
    /// `None` at the TCP level and for real NICs.
    pub engine: Option<EngineArg>,
    /// The backend string (`sim`, `verbs:rxe0`, ...).
    pub backend: String,
    pub window: usize,
    pub batch: usize,
    /// RPC: queue pairs of the channel.
    pub queues: usize,
    /// RPC message size, header included.
    pub msg_size: usize,
    /// Client CPU, server CPU.
    pub pin: (Option<usize>, Option<usize>),
    pub one_thread: bool,
    /// Two-process runs: this process's side.
    pub peer: Option<Peer>,
    /// TCP level: spin on non-blocking sockets.
    pub busy_poll: bool,
    pub json: bool,
    pub bounce: bool,
    pub bounce_only: bool,
    pub progress: bool,
    pub trace: Option<PathBuf>,
}

/// One side of a two-process run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Peer {
    /// Serve at this control-plane address.
    Server(String),
    /// Call the server at this address.
    Client(String),
}

/// Trace runs are short: at most this many iterations per measurement.
pub const TRACE_ITERS: u64 = 100;

fn default_iters(test: Test) -> u64 {
    match test {
        Test::Lat => 100_000,
        Test::Rate => 500_000,
        Test::Bw => 20_000,
        Test::Echo | Test::Oneway => 200,
    }
}

fn default_warmup(test: Test, budget: Budget) -> u64 {
    let cap = if test == Test::Lat { 10_000 } else { 50_000 };
    match budget {
        Budget::Iters(n) => (n / 10).min(cap),
        Budget::Time(_) => cap,
    }
}

/// Powers of two from 2 up to `max`, and `max` itself when it is not one (the largest eager size).
fn sweep(max: usize, include_max: bool) -> Vec<usize> {
    let mut v: Vec<usize> = (1..usize::BITS).map(|i| 1usize << i).take_while(|&s| s <= max).collect();
    if include_max && !max.is_power_of_two() && max >= 2 {
        v.push(max);
    }
    v
}

/// Checks the options and expands them into the measurements to run.
pub fn plan(a: &Args) -> Result<Plan, String> {
    let peer = match (&a.server, &a.client) {
        (Some(s), _) => Some(Peer::Server(s.clone())),
        (_, Some(c)) => Some(Peer::Client(c.clone())),
        _ => None,
    };
    if peer.is_some() {
        let role = if a.server.is_some() { "--server" } else { "--client" };
        if a.level != Level::Rpc {
            return Err(format!(
                "{role}: two-process runs measure the RPC level (the {} level runs both ends in this process)",
                a.level.name()
            ));
        }
        if a.backend == "sim" || a.backend.starts_with("sim,") {
            return Err(format!(
                "{role}: the simulator's in-process wire cannot reach another process; give both processes a byte wire, e.g. --backend sim+shm (one host) or sim+udp://127.0.0.1:0"
            ));
        }
        if a.one_thread {
            return Err(format!("{role}: --one-thread drives both ends from one thread of one process"));
        }
    }
    let level = a.level;
    if level != Level::Hal && !a.op.is_empty() {
        return Err("--op applies to --level hal (use --mode for rpc)".into());
    }
    if level != Level::Rpc && !a.mode.is_empty() {
        return Err("--mode applies to --level rpc (use --op for hal)".into());
    }
    if level != Level::Tcp && a.busy_poll {
        return Err("--busy-poll applies to --level tcp (the NIC tests always poll)".into());
    }
    if level != Level::Rpc && a.queues != 1 {
        return Err("--queues applies to --level rpc".into());
    }
    if !(1..=256).contains(&a.queues) {
        return Err(format!("--queues {}: use 1..=256", a.queues));
    }
    if level != Level::Rpc && a.msg_size.is_some() {
        return Err("--msg-size applies to --level rpc".into());
    }
    let is_sim = a.backend == "sim" || a.backend.starts_with("sim+") || a.backend.starts_with("sim,");
    if !is_sim && a.engine.is_some() {
        return Err(format!("--engine applies to the simulator, not to --backend {}", a.backend));
    }
    if a.backend.starts_with("sim,") && a.engine == Some(EngineArg::Threaded) {
        return Err(format!(
            "--backend {} --engine threaded: the Threaded engine never holds an ACK back on the \
             in-process wire, so its options mean nothing there; use --engine inline, or the UDP wire \
             (sim+udp://127.0.0.1:0,ack_hold=off)",
            a.backend
        ));
    }
    if level == Level::Tcp {
        if a.engine.is_some() {
            return Err("--engine applies to the simulator, not to --level tcp".into());
        }
        if a.one_thread {
            return Err("--one-thread is not available with --level tcp".into());
        }
        if a.trace.is_some() {
            return Err("--trace records the NIC and RPC path; it does not apply to --level tcp".into());
        }
    }
    if a.window == 0 || a.window > MAX_WINDOW {
        return Err(format!("window {}: use 1..={MAX_WINDOW}", a.window));
    }
    let window = a.window as usize;
    let batch = match a.batch {
        Some(b) if b == 0 || b > a.window => {
            return Err(format!("batch {b}: use 1..=window ({})", a.window));
        }
        Some(b) => b as usize,
        None => match level {
            Level::Hal => window.min(32),
            Level::Rpc => window,
            Level::Tcp => 1,
        },
    };
    if a.pin.len() > 2 {
        return Err(format!("--pin takes one or two CPUs (client,server), not {}", a.pin.len()));
    }
    let tests = if a.tests.is_empty() { vec![Test::Lat, Test::Rate] } else { dedup(&a.tests) };

    // Sizes, and the RPC message size that must hold the largest.
    if a.rendezvous && level != Level::Rpc {
        return Err("--rendezvous: only --level rpc has rendezvous".into());
    }
    if tests.contains(&Test::Echo) && level != Level::Rpc {
        return Err("-t echo: only --level rpc".into());
    }
    if tests.contains(&Test::Oneway) && level != Level::Rpc {
        return Err("-t oneway: only --level rpc".into());
    }
    // -a at the RPC level and --rendezvous keep the message size (sizes above it go by
    // rendezvous); otherwise the message size grows to hold the largest size.
    let rndv = level == Level::Rpc && (a.all_sizes || a.rendezvous);
    let (min_size, max_size) = match level {
        Level::Hal => (1, MAX_HAL_SIZE),
        Level::Tcp => (1, MAX_TCP_SIZE),
        Level::Rpc if rndv => (0, MAX_RNDV_SIZE),
        Level::Rpc => (0, (16 << 20) - RPC_REQUEST_HEADER),
    };
    let sizes_for = |test: Test, msg_size: Option<usize>| -> Vec<usize> {
        if a.all_sizes {
            let max = match (level, a.max_size) {
                (_, Some(m)) => m,
                (Level::Rpc, None) => DEFAULT_RPC_SWEEP_MAX,
                _ => DEFAULT_SWEEP_MAX,
            };
            let mut v = sweep(max, false);
            // The largest eager size, the edge where rendezvous starts.
            let edge = msg_size.unwrap_or(4096) - RPC_REQUEST_HEADER;
            if level == Level::Rpc && edge <= max && !v.contains(&edge) {
                v.push(edge);
                v.sort_unstable();
            }
            v
        } else if !a.sizes.is_empty() {
            dedup(&a.sizes)
        } else if test == Test::Bw {
            vec![DEFAULT_BW_SIZE]
        } else {
            DEFAULT_SIZES.to_vec()
        }
    };
    if let Some(m) = a.msg_size.filter(|m| !(64..=16 << 20).contains(m)) {
        return Err(format!("--msg-size {m}: use 64..=16m"));
    }
    if a.all_sizes && a.max_size.is_some_and(|m| m < 2) {
        return Err("--max-size: the sweep starts at 2 bytes; use 2 or more".into());
    }
    let all: Vec<usize> = tests.iter().flat_map(|&t| sizes_for(t, a.msg_size)).collect();
    let largest = all.iter().copied().max().unwrap_or(0);
    for &s in &all {
        if s < min_size {
            return Err(format!("size {s}: --level {} needs at least {min_size} byte", level.name()));
        }
        if s > max_size {
            return Err(format!(
                "size {s} is larger than the largest message of --level {} ({max_size})",
                level.name()
            ));
        }
    }
    let msg_size = match a.msg_size {
        Some(m) if rndv => m,
        None if rndv => 4096,
        Some(m) => {
            if level == Level::Rpc && largest + RPC_REQUEST_HEADER > m {
                return Err(format!(
                    "size {largest} is larger than the message size allows: --msg-size {m} leaves {} bytes for arguments (the request header takes {RPC_REQUEST_HEADER})",
                    m - RPC_REQUEST_HEADER
                ));
            }
            m
        }
        None => (largest + RPC_REQUEST_HEADER).next_power_of_two().max(4096),
    };
    if level == Level::Tcp && largest.saturating_mul(batch) > MAX_TCP_SIZE {
        return Err(format!(
            "batch {batch} x size {largest}: one write() of at most 64m; lower -b or the size"
        ));
    }
    if level == Level::Rpc {
        // Per side: about 2 * window send buffers and 4 * window + 32 receive buffers.
        let need = (6 * window + 32).saturating_mul(msg_size);
        if need > MAX_RPC_BUFFERS {
            return Err(format!(
                "window {window} x message size {msg_size} needs {} MiB of buffers per side; lower -w or the sizes",
                need >> 20
            ));
        }
    }

    let whats: Vec<What> = match level {
        Level::Hal => {
            let ops = if a.op.is_empty() { vec![OpArg::Send] } else { dedup(&a.op) };
            let mut v = Vec::new();
            for o in ops {
                let expand: &[Op] = match o {
                    OpArg::Send => &[Op::Send],
                    OpArg::Write => &[Op::Write],
                    OpArg::WriteImm => &[Op::WriteImm],
                    OpArg::Read => &[Op::Read],
                    OpArg::All => &[Op::Send, Op::Write, Op::WriteImm, Op::Read],
                };
                v.extend(expand.iter().map(|&op| What::Op(op)));
            }
            dedup(&v)
        }
        Level::Rpc => {
            let modes = if a.mode.is_empty() { vec![ModeArg::Wait] } else { dedup(&a.mode) };
            let mut v = Vec::new();
            for m in modes {
                let expand: &[CallMode] = match m {
                    ModeArg::Wait => &[CallMode::WaitRsp],
                    ModeArg::Ack => &[CallMode::Ack],
                    ModeArg::Early => &[CallMode::EarlyRsp],
                    ModeArg::Ackearly => &[CallMode::AckEarlyRsp],
                    ModeArg::All => {
                        &[CallMode::WaitRsp, CallMode::Ack, CallMode::EarlyRsp, CallMode::AckEarlyRsp]
                    }
                };
                v.extend(expand.iter().map(|&m| What::Mode(m)));
            }
            dedup(&v)
        }
        Level::Tcp => vec![What::Tcp(a.busy_poll)],
    };

    let mut specs = Vec::new();
    for &test in &tests {
        let mut budget = match (a.iters, a.duration) {
            (Some(n), _) => Budget::Iters(n),
            (None, Some(d)) => Budget::Time(d),
            (None, None) => Budget::Iters(default_iters(test)),
        };
        let mut warmup = a.warmup.unwrap_or_else(|| default_warmup(test, budget));
        if a.trace.is_some() {
            budget = Budget::Iters(budget.iters().unwrap_or(TRACE_ITERS).min(TRACE_ITERS));
            warmup = warmup.min(10);
        }
        for &what in &whats {
            for size in sizes_for(test, Some(msg_size)) {
                // Rendezvous sizes with the default budget: about 1 GiB of arguments per
                // measurement (at least 64 calls), not 100 000 round trips of a megabyte.
                let defaulted = a.iters.is_none() && a.duration.is_none() && a.trace.is_none();
                let (budget, warmup) =
                    if defaulted && level == Level::Rpc && size + RPC_REQUEST_HEADER > msg_size {
                        let n = default_iters(test).min(((1usize << 30) / size.max(1)).max(64) as u64);
                        let b = Budget::Iters(n);
                        (b, a.warmup.unwrap_or_else(|| default_warmup(test, b)))
                    } else {
                        (budget, warmup)
                    };
                specs.push(Spec { test, what, size, budget, warmup });
            }
        }
    }
    Ok(Plan {
        level,
        specs,
        rendezvous: a.rendezvous,
        engine: if level == Level::Tcp || !is_sim {
            None
        } else {
            Some(a.engine.unwrap_or(EngineArg::Inline))
        },
        backend: a.backend.clone(),
        window,
        batch,
        queues: a.queues,
        msg_size,
        pin: (a.pin.first().copied(), a.pin.get(1).copied()),
        one_thread: a.one_thread,
        peer,
        busy_poll: a.busy_poll,
        json: a.json,
        bounce: !a.no_bounce,
        bounce_only: a.bounce_only,
        progress: !a.no_progress,
        trace: a.trace.clone(),
    })
}

fn dedup<T: PartialEq + Copy>(v: &[T]) -> Vec<T> {
    let mut out: Vec<T> = Vec::with_capacity(v.len());
    for &x in v {
        if !out.contains(&x) {
            out.push(x);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan_of(args: &[&str]) -> Result<Plan, String> {
        let a = Args::try_parse_from(std::iter::once("bypass-perf").chain(args.iter().copied()))
            .map_err(|e| e.to_string())?;
        plan(&a)
    }

    #[test]
    fn defaults() {
        let p = plan_of(&[]).unwrap();
        assert_eq!(p.level, Level::Rpc);
        assert_eq!(p.engine, Some(EngineArg::Inline));
        let got: Vec<(Test, usize)> = p.specs.iter().map(|s| (s.test, s.size)).collect();
        assert_eq!(
            got,
            [
                (Test::Lat, 64),
                (Test::Lat, 1024),
                (Test::Lat, 4096),
                (Test::Rate, 64),
                (Test::Rate, 1024),
                (Test::Rate, 4096)
            ]
        );
        assert!(p.specs.iter().all(|s| s.what == What::Mode(CallMode::WaitRsp)));
        assert_eq!(p.msg_size, 8192, "4 KiB of arguments and the header need an 8 KiB message");
        assert_eq!((p.window, p.batch), (32, 32));
    }

    #[test]
    fn sizes_and_sweeps() {
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("1MiB"), Ok(1 << 20));
        assert_eq!(parse_size("64"), Ok(64));
        assert!(parse_size("x").is_err());
        let p = plan_of(&["-a", "-t", "lat"]).unwrap();
        let sizes: Vec<usize> = p.specs.iter().map(|s| s.size).collect();
        let mut want = vec![2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4076];
        want.extend((12..=20).map(|i| 1usize << i));
        assert_eq!(sizes, want, "through the eager edge (4096 - 20) into rendezvous sizes");
        assert_eq!(p.msg_size, 4096);
        let last = p.specs.last().unwrap();
        assert_eq!(
            (last.size, last.budget),
            (1 << 20, Budget::Iters(1024)),
            "about 1 GiB per rendezvous size"
        );
        assert_eq!(p.specs[0].budget, Budget::Iters(100_000), "eager sizes keep the default");
        let p = plan_of(&["-t", "echo", "--rendezvous", "-s", "1m,16m"]).unwrap();
        assert_eq!(p.specs.iter().map(|s| s.size).collect::<Vec<_>>(), [1 << 20, 16 << 20]);
        assert!(p.rendezvous && p.msg_size == 4096);
        let p = plan_of(&["--level", "hal", "-a", "--max-size", "16", "-t", "bw"]).unwrap();
        assert_eq!(p.specs.iter().map(|s| s.size).collect::<Vec<_>>(), [2, 4, 8, 16]);
    }

    /// Simulator options after a comma keep the simulator's engine choice and reach the backend;
    /// with the Threaded engine, which holds no ACK on the in-process wire, they are refused here
    /// rather than when the backend opens.
    #[test]
    fn simulator_options_are_a_sim_backend() {
        let p = plan_of(&["--backend", "sim,ack_hold=off", "--engine", "inline"]).unwrap();
        assert_eq!((p.backend.as_str(), p.engine), ("sim,ack_hold=off", Some(EngineArg::Inline)));
        let e = plan_of(&["--backend", "sim,ack_hold=off", "--engine", "threaded"]).unwrap_err();
        assert!(e.contains("--engine threaded") && e.contains("--engine inline"), "{e}");
        assert!(plan_of(&["--backend", "sim:inline"]).is_err(), "the engine is --engine");
        assert!(plan_of(&["--backend", "sim,ack_hold=off", "--server", "127.0.0.1:0"]).is_err());
    }

    #[test]
    fn bad_arguments_are_errors() {
        for bad in [
            &["-w", "0"][..],
            &["-b", "64"],
            &["-s", "5000", "--msg-size", "4096"],
            &["--level", "hal", "-s", "0"],
            &["--level", "hal", "--mode", "ack"],
            &["--op", "read"],
            &["--server", "1.2.3.4:5"],
            &["--client", "localhost:5"],
            &["--client", "localhost:5", "--backend", "sim+udp://127.0.0.1:0", "--level", "hal"],
            &["--server", "localhost:5", "--backend", "sim+udp://127.0.0.1:0", "--one-thread"],
            &["--backend", "sim:threaded"],
            &["--backend", "verbs"],
            &["--pin", "0,1,2"],
            &["-n", "0"],
            &["-D", "0"],
            &["-n", "5", "-D", "1"],
            &["--level", "tcp", "--engine", "inline"],
            &["-a", "--msg-size", "10"],
            &["--level", "hal", "-a", "--max-size", "1g"],
            &["--level", "hal", "--rendezvous"],
            &["--level", "tcp", "-t", "echo"],
            &["-a", "--max-size", "2g"],
        ] {
            let e = plan_of(bad).expect_err(&format!("{bad:?} should fail"));
            assert!(!e.trim().is_empty());
        }
    }

    #[test]
    fn trace_caps_iterations() {
        let p = plan_of(&["--trace", "/tmp/x.json", "-n", "100000"]).unwrap();
        assert!(p.specs.iter().all(|s| s.budget == Budget::Iters(TRACE_ITERS) && s.warmup <= 10));
        let p = plan_of(&["--trace", "/tmp/x.json", "-D", "5"]).unwrap();
        assert!(p.specs.iter().all(|s| s.budget == Budget::Iters(TRACE_ITERS)));
    }
}
