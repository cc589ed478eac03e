//! HAL-level benchmark on the simulator (Inline engine unless `--engine threaded`): 64-byte send/recv ping-pong between two
//! threads (round-trip time) and one-thread message rate with batches of WQEs.
//!
//! ```text
//! cargo run --release -p bypass-sim --example hal_bench -- [--iters N] [--runs R] [--batch B] [--size S]
//! ```
//!
//! Each figure is the median over R runs (each run's mean), with the min and max run beside it.
//! Threads are not pinned: on a 2-core VM the scheduler spreads the two spinning threads best
//! (pinning both to fixed vCPUs made runs collapse whenever a vCPU was descheduled).

use bypass_hal::*;
use bypass_sim::{Engine, Fabric, SimCq, SimNic, SimQueue, SimRegion};
use std::time::Instant;

#[path = "common/bounce.rs"]
mod bounce;
use bounce::bounce;

struct Opts {
    iters: u64,
    runs: usize,
    batch: usize,
    size: usize,
    test: String,
    engine: Engine,
    idle_queues: usize,
}

fn parse() -> Result<Opts, String> {
    let mut o = Opts {
        iters: 200_000,
        runs: 7,
        batch: 32,
        size: 64,
        test: "all".into(),
        engine: Engine::Inline,
        idle_queues: 0,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = |name: &str| -> Result<u64, String> {
            args.next().and_then(|v| v.parse().ok()).ok_or(format!("{name} needs a positive number"))
        };
        match a.as_str() {
            "--iters" => o.iters = val("--iters")?.max(1),
            "--runs" => o.runs = val("--runs")?.max(1) as usize,
            "--batch" => o.batch = val("--batch")?.clamp(1, 256) as usize,
            "--size" => o.size = val("--size")?.min(4096) as usize,
            "--test" => {
                o.test = args.next().filter(|t| ["all", "bounce", "pingpong", "pingpong1", "rate"].contains(&t.as_str())).ok_or("--test takes all, bounce, pingpong, pingpong1 or rate")?
            }
            "--idle-queues" => o.idle_queues = val("--idle-queues")?.min(4096) as usize,
            "--engine" => {
                o.engine = match args.next().as_deref() {
                    Some("inline") => Engine::Inline,
                    Some("threaded") => Engine::Threaded,
                    _ => return Err("--engine takes inline or threaded".into()),
                }
            }
            "-h" | "--help" => {
                return Err("usage: hal_bench [--engine inline|threaded] [--idle-queues N] [--test all|bounce|pingpong|pingpong1|rate] [--iters N] [--runs R] [--batch B (1..=256)] [--size BYTES (<=4096)]".into())
            }
            other => return Err(format!("unknown argument {other:?}; try --help")),
        }
    }
    Ok(o)
}

/// One endpoint: a queue with its CQs and one registered buffer holding send and receive slots.
struct End {
    q: SimQueue,
    scq: SimCq,
    rcq: SimCq,
    mr: SimRegion,
    size: usize,
    recv_slots: usize,
}

const DEPTH: u32 = 512;

impl End {
    fn new(nic: &SimNic, size: usize) -> End {
        let cfg = {
            let mut c = QueueConfig::default();
            c.send_depth = DEPTH;
            c.recv_depth = DEPTH;
            c.max_inline = 256;
            c
        };
        let scq = nic.create_cq(DEPTH * 2).unwrap();
        let rcq = nic.create_cq(DEPTH * 2).unwrap();
        let q = nic.create_queue(&cfg, &scq, &rcq).unwrap();
        let slot = size.max(1);
        let mr = nic.register(slot * (DEPTH as usize + 1), Access::LOCAL_WRITE).unwrap();
        End { q, scq, rcq, mr, size, recv_slots: DEPTH as usize }
    }

    fn recv_wr(&self, i: usize) -> Sge {
        self.mr.sge((i % self.recv_slots + 1) * self.size.max(1), self.size).unwrap()
    }

    /// Posts `n` receives (in batches of at most 64, built on the stack: the benchmark itself
    /// allocates nothing in its loops).
    fn post_recvs(&mut self, from: usize, n: usize) {
        for start in (from..from + n).step_by(64) {
            let k = (from + n - start).min(64);
            let sges: [Sge; 64] =
                std::array::from_fn(|i| if i < k { self.recv_wr(start + i) } else { Sge::default() });
            let wrs: [RecvWr<'_>; 64] =
                std::array::from_fn(|i| RecvWr { wr_id: 0, sges: std::slice::from_ref(&sges[i]) });
            self.q.post_recv(&wrs[..k]).unwrap();
        }
    }
}

fn connect(a: &mut End, b: &mut End) {
    let (ia, ib) = (a.q.info(), b.q.info());
    a.q.connect(&ib).unwrap();
    b.q.connect(&ia).unwrap();
    a.post_recvs(0, DEPTH as usize);
    b.post_recvs(0, DEPTH as usize);
}

/// Ping-pong: returns the mean round-trip time in nanoseconds of `iters` exchanges.
fn pingpong(engine: Engine, iters: u64, size: usize, flags: WrFlags) -> f64 {
    let fabric = Fabric::new(engine);
    let (na, nb) = (fabric.add_nic(), fabric.add_nic());
    let (mut a, mut b) = (End::new(&na, size), End::new(&nb, size));
    connect(&mut a, &mut b);
    let server = std::thread::spawn(move || {
        echo(&mut b, iters, flags);
    });
    let start = Instant::now();
    echo_client(&mut a, iters, flags);
    let elapsed = start.elapsed();
    server.join().unwrap();
    elapsed.as_nanos() as f64 / iters as f64
}

/// Sends one message; every 64th is signaled and the send CQ drained then, so the send queue
/// never fills and completions cost little.
/// `last`: signal it and wait, so the sender may then drop its queue (destroying a queue discards
/// work the device has not carried out yet, as on a real NIC).
fn send_one(e: &mut End, i: u64, flags: WrFlags, last: bool) {
    let sge = e.mr.sge(0, e.size).unwrap();
    let signaled = i % 64 == 63 || last;
    let f = if signaled { flags | WrFlags::SIGNALED } else { flags };
    e.q.post_send(&[SendWr { wr_id: i, op: SendOp::Send, sges: &[sge], flags: f }]).unwrap();
    if signaled {
        let mut wc = [Completion::default(); 8];
        // Earlier signaled sends were drained when they were posted, so this waits for this one.
        while e.scq.poll(&mut wc).unwrap() == 0 {}
    }
}

fn wait_recv(e: &mut End, received: &mut usize) {
    let mut wc = [Completion::default(); 1];
    loop {
        if e.rcq.poll(&mut wc).unwrap() == 1 {
            debug_assert!(wc[0].status.is_ok());
            *received += 1;
            if *received % 64 == 0 {
                e.post_recvs(*received - 64, 64);
            }
            return;
        }
        std::hint::spin_loop();
    }
}

fn echo_client(e: &mut End, iters: u64, flags: WrFlags) {
    let mut received = 0usize;
    for i in 0..iters {
        send_one(e, i, flags, i + 1 == iters);
        wait_recv(e, &mut received);
    }
}

fn echo(e: &mut End, iters: u64, flags: WrFlags) {
    let mut received = 0usize;
    for i in 0..iters {
        wait_recv(e, &mut received);
        send_one(e, i, flags, i + 1 == iters);
    }
}

/// Ping-pong with both ends driven by one thread: the software cost of a round trip with no
/// cache line crossing cores. Returns nanoseconds per round trip.
fn pingpong_one_thread(engine: Engine, iters: u64, size: usize, idle_queues: usize) -> f64 {
    let fabric = Fabric::new(engine);
    let (na, nb) = (fabric.add_nic(), fabric.add_nic());
    // Connected queue pairs that carry nothing: the device should not pay for them.
    let _idle: Vec<(End, End)> = (0..idle_queues)
        .map(|_| {
            let (mut x, mut y) = (End::new(&na, size), End::new(&nb, size));
            connect(&mut x, &mut y);
            (x, y)
        })
        .collect();
    let (mut a, mut b) = (End::new(&na, size), End::new(&nb, size));
    connect(&mut a, &mut b);
    let (mut ra, mut rb) = (0usize, 0usize);
    let start = Instant::now();
    for i in 0..iters {
        send_one(&mut a, i, WrFlags::empty(), false);
        wait_recv(&mut b, &mut rb);
        send_one(&mut b, i, WrFlags::empty(), false);
        wait_recv(&mut a, &mut ra);
    }
    start.elapsed().as_nanos() as f64 / iters as f64
}

/// One thread, batches of `batch` sends from A to B: returns messages per second.
fn rate(engine: Engine, iters: u64, size: usize, batch: usize) -> f64 {
    let fabric = Fabric::new(engine);
    let (na, nb) = (fabric.add_nic(), fabric.add_nic());
    let (mut a, mut b) = (End::new(&na, size), End::new(&nb, size));
    connect(&mut a, &mut b);
    let sge = a.mr.sge(0, size).unwrap();
    let sges = [sge];
    let mut wrs: Vec<SendWr<'_>> = (0..batch)
        .map(|i| SendWr { wr_id: i as u64, op: SendOp::Send, sges: &sges, flags: WrFlags::empty() })
        .collect(); // built once, before the timed loop
    wrs[batch - 1].flags = WrFlags::SIGNALED;
    let mut wc = vec![Completion::default(); batch];
    let rounds = iters / batch as u64;
    let mut received = 0usize;
    let start = Instant::now();
    for _ in 0..rounds {
        a.q.post_send(&wrs).unwrap();
        let mut got = 0;
        while got < batch {
            got += b.rcq.poll(&mut wc[got..]).unwrap();
        }
        b.post_recvs(received, batch);
        received += batch;
        while a.scq.poll(&mut wc[..1]).unwrap() == 0 {}
    }
    let elapsed = start.elapsed();
    (rounds * batch as u64) as f64 / elapsed.as_secs_f64()
}

fn num_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn summarize(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(|a, b| a.total_cmp(b));
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

fn main() {
    let o = match parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("hal_bench: {e}");
            std::process::exit(2);
        }
    };
    println!(
        "bypass-sim HAL benchmark: {:?} engine, {} B messages, {} runs, {} CPUs",
        o.engine,
        o.size,
        o.runs,
        num_cpus()
    );
    if o.test == "all" || o.test == "bounce" {
        let runs: Vec<f64> = (0..o.runs).map(|_| bounce(o.iters * 5)).collect();
        let (med, lo, hi) = summarize(runs);
        println!(
            "bare cache-line bounce (machine floor)     median {:>7.3} us   (runs {:.3} .. {:.3} us)",
            med / 1e3,
            lo / 1e3,
            hi / 1e3
        );
        if o.test == "bounce" {
            return;
        }
    }
    let pp = o.test != "rate" && o.test != "pingpong1";
    if pp {
        let _ = pingpong(o.engine, o.iters / 10, o.size, WrFlags::empty()); // warm-up
    }
    for (name, flags) in [("send/recv", WrFlags::empty()), ("send/recv INLINE", WrFlags::INLINE)] {
        if !pp || (flags.contains(WrFlags::INLINE) && o.size > 256) {
            continue;
        }
        let runs: Vec<f64> = (0..o.runs).map(|_| pingpong(o.engine, o.iters, o.size, flags)).collect();
        let (med, lo, hi) = summarize(runs);
        println!(
            "ping-pong {name:<17} round trip  median {:>7.3} us   (runs {:.3} .. {:.3} us)",
            med / 1e3,
            lo / 1e3,
            hi / 1e3
        );
    }
    if pp || o.test == "pingpong1" {
        let runs: Vec<f64> =
            (0..o.runs).map(|_| pingpong_one_thread(o.engine, o.iters, o.size, o.idle_queues)).collect();
        let (med, lo, hi) = summarize(runs);
        println!(
            "ping-pong one thread (no core crossing) median {:>7.3} us   (runs {:.3} .. {:.3} us)",
            med / 1e3,
            lo / 1e3,
            hi / 1e3
        );
    }
    if o.test.starts_with("pingpong") {
        return;
    }
    let runs: Vec<f64> = (0..o.runs).map(|_| rate(o.engine, o.iters * 5, o.size, o.batch)).collect();
    let (med, lo, hi) = summarize(runs);
    println!(
        "rate      one thread, batch {:<3}       median {:>7.2} M msg/s (runs {:.2} .. {:.2})",
        o.batch,
        med / 1e6,
        lo / 1e6,
        hi / 1e6
    );
}
