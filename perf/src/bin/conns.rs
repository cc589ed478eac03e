//! `bypass-conns`: what idle connections cost. Opens 1, 100 and 1000 channels (or the counts
//! given as arguments) from one process to one server in the same process, on the sim (Inline
//! engine), and prints the process's threads (`Threads:` of `/proc/self/status`) and resident
//! memory (`VmRSS:`) before and with the channels open, the growth per connection, the
//! registered buffer bytes per connection (client and server side; receive buffers counted
//! apart; the server's alone, its shared receive pool included), and whether one call on every
//! channel works. `docs/BENCHMARKS.md` records figures. `--per-connection` gives the server
//! per-connection receive buffers (`RecvBuffers::PerConnection`) instead of its default shared
//! receive pool, for comparison.
//!
//! ```text
//! cargo run --release -p bypass-perf --bin bypass-conns            # 1, 100, 1000
//! cargo run --release -p bypass-perf --bin bypass-conns -- 10 5000
//! cargo run --release -p bypass-perf --bin bypass-conns -- --per-connection 1000
//! ```
//!
//! A "connection" is one client channel and its server-side connection: both live in this
//! process, so the figures per connection hold both ends.

use bypass::{Channel, ChannelConfig, FunctionId, Functions, RecvBuffers, Server, ServerConfig};
use bypass_sim::{Engine, Fabric, SimNic};
use std::time::Instant;

const ECHO: FunctionId = match FunctionId::new(0x31, 0x1, true, 1) {
    Some(f) => f,
    None => panic!("bad function id"),
};
const NAME: &str = "conns";

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let per_connection = args.iter().any(|a| a == "--per-connection");
    args.retain(|a| a != "--per-connection");
    let recv_buffers = if per_connection { RecvBuffers::PerConnection } else { RecvBuffers::default() };
    let counts: Vec<usize> = {
        if args.is_empty() {
            vec![1, 100, 1000]
        } else {
            args.iter()
                .map(|a| {
                    a.parse().ok().filter(|&n| n > 0).unwrap_or_else(|| {
                        eprintln!("bypass-conns: `{a}` is not a connection count (a positive integer)");
                        std::process::exit(2)
                    })
                })
                .collect()
        }
    };
    raise_fd_limit();
    println!(
        "bypass-conns {}: idle channels to one server in one process, sim (Inline engine), default \
         ChannelConfig/ServerConfig (keepalive on, 1 worker), server receive buffers {recv_buffers:?}",
        env!("CARGO_PKG_VERSION")
    );
    println!(
        "columns: threads and RSS with the channels open; +: growth over the server alone; /conn: per \
         connection (client channel + server connection); reg: registered buffers; recv: receive \
         buffers among them; beyond_recv: RSS growth per connection less its receive buffers; \
         srv_reg: the server's registered buffers (its shared pool included)"
    );
    println!(
        "{:>6} {:>8} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>12} {:>9} {:>9} {:>7}",
        "conns",
        "threads",
        "+threads",
        "rss_MiB",
        "+rss_MiB",
        "rss/conn",
        "reg/conn",
        "recv/conn",
        "beyond_recv",
        "srv_reg/c",
        "calls_ok",
        "open_s"
    );
    for &n in &counts {
        if let Err(e) = measure(n, recv_buffers) {
            eprintln!("bypass-conns: {n} connections: {e}");
            std::process::exit(1);
        }
    }
}

fn measure(n: usize, recv_buffers: RecvBuffers) -> Result<(), String> {
    let fabric = Fabric::new(Engine::Inline);
    let (snic, cnic) = (fabric.add_nic(), fabric.add_nic());
    let mut functions = Functions::new();
    functions.register(ECHO, |req| {
        let args = req.args().to_vec();
        let _ = req.reply(&args);
    });
    let config = ServerConfig { recv_buffers, ..ServerConfig::new(NAME) };
    let mut server =
        Server::bind(&snic, "127.0.0.1:0", config, functions).map_err(|e| format!("bind: {e}"))?;
    let (threads0, rss0) = status();
    let started = Instant::now();
    let mut channels: Vec<Channel<SimNic>> = Vec::with_capacity(n);
    for i in 0..n {
        let ch = Channel::connect(&cnic, server.local_addr(), ChannelConfig::new(NAME))
            .map_err(|e| format!("connect #{i}: {e}"))?;
        channels.push(ch);
    }
    let open_s = started.elapsed().as_secs_f64();
    let (threads1, rss1) = status();
    let mut ok = 0;
    let mut rsp = Vec::new();
    for ch in &channels {
        if ch.call(ECHO, b"ping", &mut rsp).is_ok() && rsp == b"ping" {
            ok += 1;
        }
    }
    let client_reg: u64 = channels.iter().map(|c| c.stats().registered_bytes).sum();
    let server_reg = server.registered_bytes();
    let reg = client_reg + server_reg;
    let recv = recv_bytes(&channels, server.stats().shared_recv_buffers > 0);
    let kib = |b: f64| b / 1024.0;
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    let per_conn = rss1.saturating_sub(rss0) as f64 / n as f64;
    println!(
        "{:>6} {:>8} {:>8} {:>9.1} {:>9.1} {:>5.0} KiB {:>5.0} KiB {:>5.0} KiB {:>8.0} KiB {:>5.0} KiB {:>9} {:>7.2}",
        n,
        threads1,
        threads1 as i64 - threads0 as i64,
        mib(rss1),
        mib(rss1.saturating_sub(rss0)),
        kib(per_conn),
        kib(reg as f64 / n as f64),
        kib(recv as f64 / n as f64),
        kib(per_conn - recv as f64 / n as f64),
        kib(server_reg as f64 / n as f64),
        format!("{ok}/{n}"),
        open_s
    );
    drop(channels);
    server.shutdown();
    control_threads_gone()?;
    if ok != n {
        return Err(format!("{} of {n} calls failed", n - ok));
    }
    Ok(())
}

/// Receive buffer bytes of the channels and their server connections: what the default
/// configuration posts (client: 4 × window + repost batch per queue; server: window + batch,
/// none with a shared pool, which is counted once in the server's registered bytes).
fn recv_bytes(channels: &[Channel<SimNic>], shared_pool: bool) -> u64 {
    channels
        .iter()
        .map(|c| {
            let w = u64::from(c.window());
            let batch = w.min(16);
            let msg = ChannelConfig::default().msg_size as u64;
            let server = if shared_pool { 0 } else { w + batch };
            c.queues() as u64 * ((4 * w + batch) + server) * msg
        })
        .sum()
}

/// Waits (at most 10 s) until the control-plane threads of the connections just closed have
/// ended: the control loop (`bypass-ctl`) and the short-lived threads that close connections
/// aside (`bypass-ctl-aside`). The next count's "server alone" figures are taken after that,
/// so its thread growth is its own.
fn control_threads_gone() -> Result<(), String> {
    let start = Instant::now();
    loop {
        let left = control_threads();
        if left == 0 {
            return Ok(());
        }
        if start.elapsed() > std::time::Duration::from_secs(10) {
            return Err(format!(
                "{left} control-plane thread(s) still running 10 s after every connection closed"
            ));
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// Threads of this process whose name starts with `bypass-ctl` (`/proc/self/task/*/comm`).
fn control_threads() -> usize {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return 0 };
    tasks
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm")).is_ok_and(|name| name.starts_with("bypass-ctl"))
        })
        .count()
}

/// (threads, resident bytes) of this process, from `/proc/self/status`.
fn status() -> (u64, u64) {
    let text = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    (field("Threads:"), field("VmRSS:") * 1024)
}

/// Every connection holds a few descriptors on each side (sockets, CQ event fds): use the
/// hard limit.
fn raise_fd_limit() {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `lim` is a valid rlimit for getrlimit to fill in.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 && lim.rlim_cur < lim.rlim_max {
        lim.rlim_cur = lim.rlim_max;
        // SAFETY: `lim` is a valid rlimit read just above.
        let _ = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) };
    }
}
