//! RPC round trip and rate on the simulator: one client thread, one server worker thread, an
//! echo function, in one process (TCP control plane on 127.0.0.1, data path on sim NICs).
//!
//! ```text
//! cargo run --release -p bypass --example rpc_bench                 # latency + rate, 64 B
//! cargo run --release -p bypass --example rpc_bench -- --test lat --size 1024 --mode ack
//! options: --engine inline|threaded  --test all|lat|rate  --size N  --iters N  --runs N
//!          --window N (rate: calls in flight)  --mode wait|ack|early|ackearly
//!          --one-thread (the client thread also polls the server: software cost only)
//! ```
//!
//! Latency: blocking calls, the client thread polls (self-polling). Rate: the client keeps
//! `window` calls in flight with completion callbacks and polls. Medians over `--runs` runs;
//! the bare cache-line bounce between two threads is printed first, because two-thread figures
//! on a shared VM move with it.

use bypass::{
    CallMode, CallOptions, Channel, ChannelConfig, FunctionId, Functions, Server, ServerConfig, Status,
};
use bypass_sim::{Engine, Fabric, SimNic};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

#[path = "../../sim/examples/common/bounce.rs"]
mod bounce;

const ECHO: FunctionId = match FunctionId::new(0x100, 1, true, 1) {
    Some(f) => f,
    None => panic!("invalid function id"),
};

struct Opts {
    engine: Engine,
    test: String,
    size: usize,
    iters: u64,
    runs: usize,
    window: usize,
    mode: CallMode,
    one_thread: bool,
}

fn parse() -> Result<Opts, String> {
    let mut o = Opts {
        engine: Engine::Inline,
        test: "all".into(),
        size: 64,
        iters: 200_000,
        runs: 7,
        window: 32,
        mode: CallMode::WaitRsp,
        one_thread: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().ok_or(format!("{a} needs a value"));
        let num = |v: String| v.parse::<u64>().map_err(|_| format!("{a}: not a number: {v}"));
        match a.as_str() {
            "--engine" => {
                o.engine = match val()?.as_str() {
                    "inline" => Engine::Inline,
                    "threaded" => Engine::Threaded,
                    e => return Err(format!("unknown engine {e} (inline|threaded)")),
                }
            }
            "--test" => o.test = val()?,
            "--size" => o.size = num(val()?)? as usize,
            "--iters" => o.iters = num(val()?)?.max(1),
            "--runs" => o.runs = num(val()?)?.max(1) as usize,
            "--window" => o.window = num(val()?)?.max(1) as usize,
            "--mode" => {
                o.mode = match val()?.as_str() {
                    "wait" => CallMode::WaitRsp,
                    "ack" => CallMode::Ack,
                    "early" => CallMode::EarlyRsp,
                    "ackearly" => CallMode::AckEarlyRsp,
                    m => return Err(format!("unknown mode {m} (wait|ack|early|ackearly)")),
                }
            }
            "--one-thread" => o.one_thread = true,
            "-h" | "--help" => return Err("usage".into()),
            _ => return Err(format!("unknown option {a}")),
        }
    }
    if !["all", "lat", "rate"].contains(&o.test.as_str()) {
        return Err(format!("unknown test {} (all|lat|rate)", o.test));
    }
    Ok(o)
}

struct Rig {
    _fabric: Fabric,
    server: Server<SimNic>,
    channel: Channel<SimNic>,
}

fn rig(engine: Engine, window: usize, size: usize, one_thread: bool) -> Rig {
    let fabric = Fabric::new(engine);
    let (snic, cnic) = (fabric.add_nic(), fabric.add_nic());
    let mut functions = Functions::new();
    functions.register(ECHO, |req| {
        let _ = req.reply_with(Status::Success, |args, out| {
            let n = args.len().min(out.len());
            out[..n].copy_from_slice(&args[..n]);
            Ok(n)
        });
    });
    let msg_size = (size + 64).next_power_of_two().max(4096);
    let workers = if one_thread { 0 } else { 1 };
    let server_config = ServerConfig { msg_size, workers, ..ServerConfig::new("bench") };
    let server = Server::bind(&snic, "127.0.0.1:0", server_config, functions).expect("server");
    let channel_config = ChannelConfig { window: window as u32, msg_size, ..ChannelConfig::new("bench") };
    let channel = Channel::connect(&cnic, server.local_addr(), channel_config).expect("channel");
    Rig { _fabric: fabric, server, channel }
}

/// Blocking calls; returns (mean, p50, p99) in ns.
fn latency(r: &Rig, o: &Opts, lat: &mut Vec<u64>) -> (f64, f64, f64) {
    let args = vec![0xA5u8; o.size];
    let mut resp = Vec::new();
    let opts = CallOptions::mode(o.mode);
    for _ in 0..o.iters.min(10_000) {
        if o.one_thread {
            one_thread_call(r, &opts, &args);
        } else {
            r.channel.call_with(&opts, ECHO, &args, &mut resp).expect("warm-up call");
        }
    }
    lat.clear();
    let start = Instant::now();
    let mut t0 = start;
    for _ in 0..o.iters {
        if o.one_thread {
            one_thread_call(r, &opts, &args);
        } else {
            r.channel.call_with(&opts, ECHO, &args, &mut resp).expect("call");
        }
        let t1 = Instant::now();
        lat.push((t1 - t0).as_nanos() as u64);
        t0 = t1;
    }
    let mean = start.elapsed().as_nanos() as f64 / o.iters as f64;
    lat.sort_unstable();
    let pct = |p: f64| lat[((lat.len() - 1) as f64 * p) as usize] as f64;
    (mean, pct(0.5), pct(0.99))
}

/// One call with the server polled by this thread too (`--one-thread`): the software cost of a
/// round trip with no cache line crossing cores.
fn one_thread_call(r: &Rig, opts: &CallOptions, args: &[u8]) {
    static DONE: AtomicU64 = AtomicU64::new(0);
    let before = DONE.load(Ordering::Relaxed);
    r.channel
        .call_callback(opts, ECHO, args, |res| {
            res.expect("call");
            DONE.fetch_add(1, Ordering::Relaxed);
        })
        .expect("call");
    while DONE.load(Ordering::Relaxed) == before {
        r.server.poll();
        r.channel.poll();
    }
}

/// Pipelined calls with callbacks; returns calls per second.
fn rate(r: &Rig, o: &Opts) -> f64 {
    let args = vec![0xA5u8; o.size];
    let done = Arc::new(AtomicU64::new(0));
    let opts = CallOptions { wait_for_credit: false, ..CallOptions::mode(o.mode) };
    let run = |n: u64| {
        let target = done.load(Ordering::Relaxed) + n;
        let mut started = done.load(Ordering::Relaxed);
        while done.load(Ordering::Relaxed) < target {
            while started < target && started - done.load(Ordering::Relaxed) < o.window as u64 {
                let d = done.clone();
                let ok = r.channel.call_callback(&opts, ECHO, &args, move |res| {
                    res.expect("pipelined call");
                    d.fetch_add(1, Ordering::Relaxed);
                });
                match ok {
                    Ok(()) => started += 1,
                    Err(e) if e.is_would_block() => break,
                    Err(e) => panic!("call: {e}"),
                }
            }
            if o.one_thread {
                r.server.poll();
            }
            r.channel.poll();
        }
    };
    run(o.iters.min(20_000));
    let start = Instant::now();
    run(o.iters);
    o.iters as f64 / start.elapsed().as_secs_f64()
}

fn median(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[0], v[v.len() / 2], v[v.len() - 1])
}

fn main() {
    let o = match parse() {
        Ok(o) => o,
        Err(e) => {
            if e != "usage" {
                eprintln!("rpc_bench: {e}");
            }
            eprintln!(
                "usage: rpc_bench [--engine inline|threaded] [--test all|lat|rate] [--size N] [--iters N] \
                 [--runs N] [--window N] [--mode wait|ack|early|ackearly] [--one-thread]"
            );
            std::process::exit(2);
        }
    };
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    println!(
        "bypass RPC on sim: engine {:?}, {} B args, mode {:?}, {} iterations x {} runs, {cpus} CPUs, {}",
        o.engine,
        o.size,
        o.mode,
        o.iters,
        o.runs,
        if o.one_thread { "client and server on one thread" } else { "one client thread, one server worker" }
    );
    println!("bare cache-line bounce between two threads: {:.3} us", bounce::bounce(1_000_000) / 1e3);
    let r = rig(o.engine, o.window, o.size, o.one_thread);
    if o.size > r.channel.max_request_args() {
        eprintln!("rpc_bench: --size {} exceeds the message size", o.size);
        std::process::exit(2);
    }
    if o.test == "all" || o.test == "lat" {
        let mut lat = Vec::with_capacity(o.iters as usize);
        let (mut means, mut p50s, mut p99s) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..o.runs {
            let (m, p50, p99) = latency(&r, &o, &mut lat);
            means.push(m);
            p50s.push(p50);
            p99s.push(p99);
        }
        let (lo, med, hi) = median(means);
        println!(
            "round trip, blocking call:   median {:.3} us  (runs {:.3}..{:.3});  p50 {:.3} us  p99 {:.3} us",
            med / 1e3,
            lo / 1e3,
            hi / 1e3,
            median(p50s).1 / 1e3,
            median(p99s).1 / 1e3
        );
    }
    if o.test == "all" || o.test == "rate" {
        let rates: Vec<f64> = (0..o.runs).map(|_| rate(&r, &o)).collect();
        let (lo, med, hi) = median(rates);
        println!(
            "rate, {} calls in flight:    median {:.2} M calls/s  (runs {:.2}..{:.2})",
            o.window,
            med / 1e6,
            lo / 1e6,
            hi / 1e6
        );
    }
    let s = r.server.stats();
    let c = r.channel.stats();
    println!(
        "server: {} requests, {} responses, {} protocol errors; client: {} stale, {} contexts in use",
        s.requests, s.responses, s.protocol_errors, c.stale, c.tx_in_use
    );
}
