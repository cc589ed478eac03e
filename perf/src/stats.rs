//! What a measurement produces, and the machine's floor (the bare cache-line bounce).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a measurement runs: a number of iterations, or a wall-clock duration.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Budget {
    /// Exactly this many iterations (round trips, messages or calls).
    Iters(u64),
    /// As many as fit in this time.
    Time(Duration),
}

impl Budget {
    /// The iteration count, if fixed.
    pub fn iters(self) -> Option<u64> {
        match self {
            Budget::Iters(n) => Some(n),
            Budget::Time(_) => None,
        }
    }
}

/// A running measurement's clock: says when a [`Budget`] is used up.
#[derive(Debug)]
pub struct Clock {
    budget: Budget,
    pub start: Instant,
}

impl Clock {
    pub fn start(budget: Budget) -> Clock {
        Clock { budget, start: Instant::now() }
    }

    /// Whether iteration number `done` (0-based count of finished ones) should still start.
    /// With a time budget the clock is read only every 64 iterations unless `now` is given.
    #[inline]
    pub fn more(&self, done: u64, now: Option<Instant>) -> bool {
        match self.budget {
            Budget::Iters(n) => done < n,
            Budget::Time(d) => {
                if let Some(now) = now {
                    now.duration_since(self.start) < d
                } else {
                    done % 64 != 0 || self.start.elapsed() < d
                }
            }
        }
    }

    /// Progress as (done, total) for a progress bar: iterations, or milliseconds of a time budget.
    pub fn progress(&self, done: u64) -> (u64, u64) {
        match self.budget {
            Budget::Iters(n) => (done, n),
            Budget::Time(d) => (self.start.elapsed().as_millis() as u64, d.as_millis() as u64),
        }
    }
}

/// Round-trip latency of one measurement, in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Latency {
    pub iters: u64,
    pub secs: f64,
    pub min: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
    pub mean: f64,
}

impl Latency {
    /// Summarises per-iteration times (sorted in place). `secs`: the whole timed loop.
    pub fn from_samples(samples: &mut [u64], secs: f64) -> Latency {
        samples.sort_unstable();
        let n = samples.len();
        // Nearest rank: the smallest sample with at least p of all samples at or below it.
        let pct = |p: f64| -> f64 {
            if n == 0 {
                return 0.0;
            }
            let rank = ((p * n as f64).ceil() as usize).clamp(1, n);
            samples[rank - 1] as f64
        };
        Latency {
            iters: n as u64,
            secs,
            min: samples.first().copied().unwrap_or(0) as f64,
            p50: pct(0.50),
            p90: pct(0.90),
            p99: pct(0.99),
            p999: pct(0.999),
            max: samples.last().copied().unwrap_or(0) as f64,
            mean: if n == 0 { 0.0 } else { secs * 1e9 / n as f64 },
        }
    }
}

/// The result of one measurement.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Measured {
    Lat(Latency),
    Thru(Throughput),
    Echo(Echo),
}

/// Blocking echo calls of one size (arguments and response of `size` bytes each), and a plain
/// `memcpy` of the same size measured right after, in the same run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Echo {
    pub iters: u64,
    pub size: usize,
    pub secs: f64,
    /// Copies of `size` bytes and the seconds they took.
    pub copies: u64,
    pub copy_secs: f64,
    /// Bytes each call moves, in units of `size`: 2 for an echo (arguments there, the same back),
    /// 1 for a one-way call (empty reply).
    pub ways: u32,
}

impl Echo {
    /// Argument bytes echoed per second, in MiB/s (each call also moves as many back).
    pub fn mib_per_sec(&self) -> f64 {
        mib(self.iters, self.size, self.secs)
    }

    /// Bytes moved per second, both ways, in MiB/s (arguments and response).
    pub fn moved_mib_per_sec(&self) -> f64 {
        self.mib_per_sec() * f64::from(self.ways)
    }

    pub fn memcpy_mib_per_sec(&self) -> f64 {
        mib(self.copies, self.size, self.copy_secs)
    }
}

fn mib(n: u64, size: usize, secs: f64) -> f64 {
    if secs > 0.0 {
        n as f64 * size as f64 / secs / (1u64 << 20) as f64
    } else {
        0.0
    }
}

/// Copies `size` bytes between two pre-faulted buffers until `at_least` has passed (at least 3
/// copies); returns the copies and the seconds they took.
pub fn memcpy(size: usize, at_least: std::time::Duration) -> (u64, f64) {
    let src = vec![0x5Au8; size.max(1)];
    let mut dst = vec![0u8; size.max(1)];
    dst.copy_from_slice(&src); // fault the pages in first
    let start = std::time::Instant::now();
    let mut n = 0u64;
    while n < 3 || start.elapsed() < at_least {
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&mut dst);
        n += 1;
    }
    (n, start.elapsed().as_secs_f64())
}

/// Throughput of one measurement: messages (or calls) and payload bytes moved in `secs`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Throughput {
    pub msgs: u64,
    pub bytes: u64,
    pub secs: f64,
}

impl Throughput {
    pub fn msgs_per_sec(&self) -> f64 {
        if self.secs > 0.0 {
            self.msgs as f64 / self.secs
        } else {
            0.0
        }
    }

    /// Payload bandwidth in MiB/s (2^20 bytes, as perftest and ucx_perftest count).
    pub fn mib_per_sec(&self) -> f64 {
        if self.secs > 0.0 {
            self.bytes as f64 / self.secs / (1u64 << 20) as f64
        } else {
            0.0
        }
    }
}

/// The machine's floor for two-thread figures: one cache line (an `AtomicU64`) bounced between
/// two threads, `iters` times or for `limit`, whichever ends first (a busy machine makes the
/// bounce slow, not the program). Returns nanoseconds per round trip. On a shared VM this moves
/// when the host moves the vCPUs, and every two-thread round trip moves with it.
pub fn bounce(iters: u64, limit: Duration) -> f64 {
    const STOP: u64 = u64::MAX;
    let line = Arc::new(AtomicU64::new(0));
    let peer = line.clone();
    let t = std::thread::spawn(move || {
        for i in 0.. {
            loop {
                let v = peer.load(Ordering::Acquire);
                if v == STOP {
                    return;
                }
                if v == 2 * i + 1 {
                    break;
                }
                std::hint::spin_loop();
            }
            peer.store(2 * i + 2, Ordering::Release);
        }
    });
    let start = Instant::now();
    let mut done = 0;
    while done < iters {
        line.store(2 * done + 1, Ordering::Release);
        while line.load(Ordering::Acquire) != 2 * done + 2 {
            std::hint::spin_loop();
        }
        done += 1;
        if done % 1024 == 0 && start.elapsed() >= limit {
            break;
        }
    }
    let ns = start.elapsed().as_nanos() as f64 / done.max(1) as f64;
    line.store(STOP, Ordering::Release);
    let _ = t.join();
    ns
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_nearest_rank() {
        let mut v: Vec<u64> = (1..=1000).rev().collect();
        let l = Latency::from_samples(&mut v, 1e-3);
        assert_eq!((l.min, l.p50, l.p90, l.p99, l.p999, l.max), (1.0, 500.0, 900.0, 990.0, 999.0, 1000.0));
        assert_eq!(l.mean, 1000.0);
        let mut one = vec![7u64];
        let l = Latency::from_samples(&mut one, 7e-9);
        assert_eq!((l.p50, l.p999, l.max), (7.0, 7.0, 7.0));
    }

    #[test]
    fn time_budget_ends() {
        let c = Clock::start(Budget::Time(Duration::from_millis(1)));
        std::thread::sleep(Duration::from_millis(2));
        assert!(!c.more(64, None));
        assert!(c.more(65, None), "the clock is read every 64 iterations only");
        assert!(!Clock::start(Budget::Iters(3)).more(3, None));
    }

    #[test]
    fn bounce_ends() {
        assert!(bounce(10_000, Duration::from_secs(10)) > 0.0);
        // An unbounded iteration count ends on the time limit (the test returning is the check;
        // how long it takes on a loaded machine is not).
        assert!(bounce(u64::MAX, Duration::from_millis(50)) > 0.0);
    }
}
