//! HAL-level tests: raw queue pairs, no RPC layer. Generic over any `bypass::hal::Device`; the
//! run builds two simulated NICs today.
//!
//! Both ends own one registered region of `2 * size` bytes: the first half is the source of
//! SENDs and WRITEs (and the target READs fetch from), the second half is where receives and
//! inbound WRITEs land (every receive uses the same buffer, as perftest does: nothing reads it).
//!
//! - `lat`, `send` / `write-imm`: ping-pong; the server echoes each message with the same
//!   operation. `write` / `read`: the client posts one signaled request and waits for its
//!   completion (the responder's NIC acknowledged, or returned the data), like `ib_read_lat`.
//! - `bw` and `rate`: the client keeps up to `window` requests in flight, posted in batches of
//!   `batch` work requests with one doorbell and one signaled request each; they share this loop
//!   and differ in their default sizes and in what the table shows.
//!
//! The passive side (the server) runs on its own thread and polls its CQs: it echoes, or re-posts
//! receives, or — for one-sided operations — merely polls, which is what runs a simulated NIC
//! under the Inline engine (a hardware NIC would need no CPU there).

use crate::cli::{EngineArg, Op, Plan, Spec, Test, What};
use crate::progress::{time_round_trips, Progress};
use crate::stats::{Budget, Clock, Latency, Measured, Throughput};
use bypass::hal::{
    Access, Completion, CompletionQueue, Device, MemoryRegion, Queue, QueueConfig, RecvWr, RemoteRegion,
    SendOp, SendWr, Sge, WrFlags,
};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

type Res<T> = Result<T, String>;

fn err(what: &'static str) -> impl Fn(bypass::hal::Error) -> String {
    move |e| format!("{what}: {e}")
}

/// Receives are re-posted in batches of this many.
const REPOST: u64 = 64;
/// In latency loops, every this many sends is signaled (and retires the ones before it).
const SIGNAL_EVERY: u64 = 32;
/// Progress bar updates every this many iterations.
const TICK: u64 = 4096;

/// One side of a connection.
pub struct End<D: Device> {
    q: D::Queue,
    scq: D::Cq,
    rcq: D::Cq,
    mr: D::Region,
    src: Sge,
    dst: Sge,
    /// The peer's region (set by `connect`).
    remote: RemoteRegion,
    size: usize,
    send_depth: u64,
    /// Requests posted and retired (a signaled completion with `wr_id` = count so far retires
    /// everything up to it).
    posted: u64,
    retired: u64,
    /// Receives consumed since the start.
    received: u64,
}

impl<D: Device> End<D> {
    fn new(dev: &D, size: usize, send_depth: u32, recv_depth: u32) -> Res<End<D>> {
        let cfg = {
            let mut c = QueueConfig::default();
            c.send_depth = send_depth;
            c.recv_depth = recv_depth;
            c.max_send_sge = 1;
            c.max_recv_sge = 1;
            c
        };
        let scq = dev.create_cq(send_depth).map_err(err("create send CQ"))?;
        let rcq = dev.create_cq(recv_depth).map_err(err("create receive CQ"))?;
        let q = dev.create_queue(&cfg, &scq, &rcq).map_err(err("create queue"))?;
        let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
        let mr = dev.register(2 * size, access).map_err(err("register memory"))?;
        let src = mr.sge(0, size).map_err(err("SGE"))?;
        let dst = mr.sge(size, size).map_err(err("SGE"))?;
        Ok(End {
            q,
            scq,
            rcq,
            src,
            dst,
            remote: RemoteRegion::default(),
            mr,
            size,
            send_depth: u64::from(send_depth),
            posted: 0,
            retired: 0,
            received: 0,
        })
    }

    fn post_recvs(&mut self, n: u64) -> Res<()> {
        let sges = [self.dst];
        let wr = RecvWr { wr_id: 0, sges: &sges };
        let wrs = [wr; REPOST as usize];
        let mut left = n as usize;
        while left > 0 {
            let k = left.min(wrs.len());
            self.q.post_recv(&wrs[..k]).map_err(err("post receive"))?;
            left -= k;
        }
        Ok(())
    }

    /// Polls the receive CQ once; returns how many receives completed (and re-posts in batches).
    #[inline]
    fn poll_recv(&mut self, wc: &mut [Completion]) -> Res<usize> {
        let n = self.rcq.poll(wc).map_err(err("poll receive CQ"))?;
        for c in &wc[..n] {
            if !c.status.is_ok() {
                return Err(format!("receive completion failed: {:?}", c.status));
            }
            self.received += 1;
            if self.received % REPOST == 0 {
                self.post_recvs(REPOST)?;
            }
        }
        Ok(n)
    }

    /// Polls the send CQ once, retiring what completed.
    #[inline]
    fn poll_send(&mut self) -> Res<usize> {
        let mut wc = [Completion::default(); 16];
        let n = self.scq.poll(&mut wc).map_err(err("poll send CQ"))?;
        for c in &wc[..n] {
            if !c.status.is_ok() {
                return Err(format!("{:?} completion failed: {:?}", c.opcode, c.status));
            }
            self.retired = self.retired.max(c.wr_id);
        }
        Ok(n)
    }

    fn op_of(&self, op: Op, imm: u32) -> (SendOp, Sge) {
        let target = self.remote.at(self.size as u64);
        match op {
            Op::Send => (SendOp::Send, self.src),
            Op::Write => (SendOp::Write(target), self.src),
            Op::WriteImm => (SendOp::WriteImm(target, imm), self.src),
            Op::Read => (SendOp::Read(self.remote.at(0)), self.dst),
        }
    }

    /// Posts one request; signaled every `SIGNAL_EVERY` or when `signal`.
    #[inline]
    fn post_one(&mut self, op: Op, signal: bool) -> Res<()> {
        let (sop, sge) = self.op_of(op, self.posted as u32);
        let id = self.posted + 1;
        let flags = if signal || id % SIGNAL_EVERY == 0 { WrFlags::SIGNALED } else { WrFlags::empty() };
        let sges = [sge];
        self.q.post_send(&[SendWr { wr_id: id, op: sop, sges: &sges, flags }]).map_err(err("post send"))?;
        self.posted = id;
        Ok(())
    }

    fn outstanding(&self) -> u64 {
        self.posted - self.retired
    }
}

fn connect<D: Device>(a: &mut End<D>, b: &mut End<D>) -> Res<()> {
    let (ia, ib) = (a.q.info(), b.q.info());
    a.q.connect(&ib).map_err(err("connect"))?;
    b.q.connect(&ia).map_err(err("connect"))?;
    a.remote = b.mr.remote();
    b.remote = a.mr.remote();
    Ok(())
}

/// What the passive side does with what arrives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// Answer every message with the same operation.
    Echo(Op),
    /// Count messages and re-post receives.
    Sink,
    /// Only poll (runs a simulated NIC for one-sided operations).
    Drive,
}

struct Passive<D: Device> {
    end: End<D>,
    role: Role,
    wc: [Completion; 16],
}

impl<D: Device> Passive<D> {
    /// One pass: polls the receive CQ, answers, retires sends. Returns receives handled.
    #[inline]
    fn step(&mut self) -> Res<usize> {
        let n = self.end.poll_recv(&mut self.wc)?;
        if let Role::Echo(op) = self.role {
            for _ in 0..n {
                while self.end.outstanding() + 1 >= self.end.send_depth {
                    self.end.poll_send()?;
                }
                self.end.post_one(op, false)?;
            }
        }
        if n == 0 || self.end.outstanding() >= SIGNAL_EVERY {
            self.end.poll_send()?;
        }
        Ok(n)
    }
}

/// Runs one HAL measurement between two NICs of a device.
pub fn run<D: Device>(a: &D, b: &D, spec: &Spec, plan: &Plan, progress: Progress) -> Res<Measured>
where
    D::Queue: 'static,
    D::Cq: 'static,
    D::Region: 'static,
{
    let Spec { test, what, size, .. } = *spec;
    let What::Op(op) = what else { return Err("internal: HAL run without an operation".into()) };
    let (window, one_thread) = (plan.window, plan.one_thread);
    // Under the Inline engine a NIC runs only when its user polls: the responder of one-sided
    // operations needs a thread that polls. A device thread (Threaded) or hardware needs none.
    let drive_one_sided = plan.engine != Some(EngineArg::Threaded);
    let lat = test == Test::Lat;
    let two_sided = matches!(op, Op::Send | Op::WriteImm);
    let send_depth = if lat { 128 } else { (window as u32).next_power_of_two().max(64) };
    // Receives: enough that a receiver lagging behind a full window never runs dry.
    let recv_depth = if lat { 512 } else { ((4 * window as u32).max(1024) + REPOST as u32).min(32_768) };
    let mut client = End::new(a, size, send_depth, recv_depth)?;
    let mut server = End::new(b, size, send_depth, recv_depth)?;
    connect(&mut client, &mut server)?;
    if two_sided {
        client.post_recvs(u64::from(recv_depth))?;
        server.post_recvs(u64::from(recv_depth))?;
    }
    let role = match (lat, two_sided) {
        (true, true) => Role::Echo(op),
        (false, true) => Role::Sink,
        (_, false) => Role::Drive,
    };
    let mut passive = Passive { end: server, role, wc: [Completion::default(); 16] };

    if one_thread {
        let mut drive = || passive.step().map(|_| ());
        return measure(&mut client, spec, op, plan, &mut drive, progress);
    }
    // Two threads: the server polls until the client is done.
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let spin = role != Role::Drive || drive_one_sided;
    let server_cpu = plan.pin.1;
    let server_thread = std::thread::Builder::new()
        .name("perf-hal-server".into())
        .spawn(move || -> Res<()> {
            crate::affinity::place_server_thread(server_cpu)?;
            loop {
                let n = if spin { passive.step()? } else { 0 };
                if n == 0 && stop2.load(Ordering::Acquire) {
                    return Ok(());
                }
                if !spin {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
            }
        })
        .map_err(|e| format!("spawn the server thread: {e}"))?;
    let result = measure(&mut client, spec, op, plan, &mut || Ok(()), progress);
    stop.store(true, Ordering::Release);
    let served = server_thread.join().map_err(|_| "the server thread panicked".to_string())?;
    let m = result?;
    served?;
    Ok(m)
}

fn measure<D: Device>(
    c: &mut End<D>,
    spec: &Spec,
    op: Op,
    plan: &Plan,
    drive: &mut dyn FnMut() -> Res<()>,
    mut progress: Progress,
) -> Res<Measured> {
    let Spec { test, budget, warmup, .. } = *spec;
    let (window, batch) = (plan.window, plan.batch);
    match test {
        Test::Lat => {
            let mut none = Progress::off();
            if warmup > 0 {
                latency(c, op, Budget::Iters(warmup), drive, &mut none)?;
            }
            let l = latency(c, op, budget, drive, &mut progress)?;
            progress.finish();
            Ok(Measured::Lat(l))
        }
        Test::Bw | Test::Rate => {
            let mut none = Progress::off();
            if warmup > 0 {
                stream(c, op, Budget::Iters(warmup), window, batch, drive, &mut none)?;
            }
            let t = stream(c, op, budget, window, batch, drive, &mut progress)?;
            progress.finish();
            Ok(Measured::Thru(t))
        }
        Test::Echo | Test::Oneway => Err("-t echo and -t oneway are RPC tests".into()),
    }
}

fn latency<D: Device>(
    c: &mut End<D>,
    op: Op,
    budget: Budget,
    drive: &mut dyn FnMut() -> Res<()>,
    progress: &mut Progress,
) -> Res<Latency> {
    let mut wc = [Completion::default(); 1];
    time_round_trips(budget, progress, || {
        while c.outstanding() + 1 >= c.send_depth {
            c.poll_send()?;
            drive()?;
        }
        match op {
            Op::Send | Op::WriteImm => {
                c.post_one(op, false)?;
                while c.poll_recv(&mut wc)? == 0 {
                    drive()?;
                    std::hint::spin_loop();
                }
                if c.outstanding() >= SIGNAL_EVERY {
                    c.poll_send()?;
                }
            }
            Op::Write | Op::Read => {
                c.post_one(op, true)?;
                while c.retired < c.posted {
                    if c.poll_send()? == 0 {
                        drive()?;
                        std::hint::spin_loop();
                    }
                }
            }
        }
        Ok(())
    })
}

fn stream<D: Device>(
    c: &mut End<D>,
    op: Op,
    budget: Budget,
    window: usize,
    batch: usize,
    drive: &mut dyn FnMut() -> Res<()>,
    progress: &mut Progress,
) -> Res<Throughput> {
    let (sop, sge) = c.op_of(op, 0);
    let sges = [sge];
    let mut wrs = vec![SendWr { wr_id: 0, op: sop, sges: &sges, flags: WrFlags::empty() }; batch];
    let (window, batch) = (window as u64, batch as u64);
    let base = c.posted;
    let mut limit = budget.iters();
    let clock = Clock::start(budget);
    let mut next_tick = TICK;
    let mut turns = 0u32;
    loop {
        let sent = c.posted - base;
        if limit.is_none() {
            turns = turns.wrapping_add(1);
            if turns % 16 == 0 && !clock.more(sent, Some(Instant::now())) {
                limit = Some(sent);
            }
        }
        let left = limit.map_or(u64::MAX, |l| l - sent);
        if left == 0 && c.retired == c.posted {
            break;
        }
        let room = window - c.outstanding();
        let k = batch.min(left).min(room);
        // Full batches only, except the last one of the run.
        if k > 0 && (k == batch || k == left) {
            for (j, wr) in wrs[..k as usize].iter_mut().enumerate() {
                let id = c.posted + j as u64 + 1;
                wr.wr_id = id;
                if let SendOp::WriteImm(addr, _) = wr.op {
                    wr.op = SendOp::WriteImm(addr, id as u32);
                }
                wr.flags = if j as u64 + 1 == k { WrFlags::SIGNALED } else { WrFlags::empty() };
            }
            c.q.post_send(&wrs[..k as usize]).map_err(err("post send"))?;
            c.posted += k;
        }
        c.poll_send()?;
        drive()?;
        if c.posted - base >= next_tick {
            next_tick += TICK;
            progress.tick(&clock, c.posted - base);
        }
    }
    let secs = clock.start.elapsed().as_secs_f64();
    let msgs = c.posted - base;
    Ok(Throughput { msgs, bytes: msgs * c.size as u64, secs })
}
