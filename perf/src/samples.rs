//! Latency samples in bounded memory: every sample exactly while they fit in [`EXACT`] entries,
//! and a log-linear histogram of all of them for longer runs, so `-n 10000000000` runs in a few
//! hundred kilobytes instead of growing without bound.
//!
//! The histogram keeps values below 128 ns exactly and larger ones in 128 sub-buckets per power
//! of two: a percentile read from it is within 1/256 of the true sample (reported as the
//! bucket's midpoint). Minimum and maximum are always exact.

use crate::stats::Latency;

/// Samples kept exactly (8 MiB); past this, percentiles come from the histogram.
pub const EXACT: usize = 1 << 20;

/// Sub-buckets per power of two (2^SUB_BITS).
const SUB_BITS: u32 = 7;
const SUB: usize = 1 << SUB_BITS;
/// Values below SUB exactly, then SUB buckets for each exponent SUB_BITS..=63.
const BUCKETS: usize = SUB + (64 - SUB_BITS as usize) * SUB;

/// The bucket of `v`.
fn bucket(v: u64) -> usize {
    if v < SUB as u64 {
        return v as usize;
    }
    let e = 63 - v.leading_zeros(); // >= SUB_BITS
    let sub = ((v >> (e - SUB_BITS)) as usize) & (SUB - 1);
    SUB + (e - SUB_BITS) as usize * SUB + sub
}

/// The value a bucket stands for: exact below SUB, else the midpoint of its range.
fn value(b: usize) -> u64 {
    if b < SUB {
        return b as u64;
    }
    let e = (b - SUB) / SUB + SUB_BITS as usize;
    let sub = ((b - SUB) % SUB) as u64;
    let width = 1u64 << (e - SUB_BITS as usize);
    ((SUB as u64 + sub) << (e - SUB_BITS as usize)) + width / 2
}

/// A recorder of round-trip times in nanoseconds.
#[derive(Debug)]
pub struct Samples {
    exact: Vec<u64>,
    hist: Box<[u64]>,
    count: u64,
    min: u64,
    max: u64,
}

impl Samples {
    /// A recorder; `expected` (the iteration budget, if fixed) sizes the exact buffer up front so
    /// that recording never allocates inside the timed loop.
    pub fn new(expected: Option<u64>) -> Samples {
        let cap = expected.map_or(EXACT, |n| (n as usize).min(EXACT));
        Samples {
            exact: Vec::with_capacity(cap),
            hist: vec![0; BUCKETS].into_boxed_slice(),
            count: 0,
            min: u64::MAX,
            max: 0,
        }
    }

    /// Records one sample.
    #[inline]
    pub fn record(&mut self, ns: u64) {
        if self.exact.len() < EXACT {
            self.exact.push(ns);
        }
        self.hist[bucket(ns)] += 1;
        self.count += 1;
        self.min = self.min.min(ns);
        self.max = self.max.max(ns);
    }

    /// The summary; `secs` is the whole timed loop (the mean comes from it).
    pub fn summary(mut self, secs: f64) -> Latency {
        if self.count as usize <= self.exact.len() {
            return Latency::from_samples(&mut self.exact, secs);
        }
        let n = self.count;
        let hist = &self.hist;
        let (min, max) = (self.min, self.max);
        // Nearest rank, as Latency::from_samples, read from the cumulative histogram.
        let pct = |p: f64| -> f64 {
            let rank = ((p * n as f64).ceil() as u64).clamp(1, n);
            let mut seen = 0u64;
            for (b, &c) in hist.iter().enumerate() {
                seen += c;
                if seen >= rank {
                    return value(b).clamp(min, max) as f64;
                }
            }
            max as f64
        };
        Latency {
            iters: n,
            secs,
            min: min as f64,
            p50: pct(0.50),
            p90: pct(0.90),
            p99: pct(0.99),
            p999: pct(0.999),
            max: max as f64,
            mean: secs * 1e9 / n as f64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_ordered_and_contain_their_values() {
        let mut last = 0;
        for v in (0..20_000u64).chain([1 << 20, (1 << 40) + 12345, u64::MAX]) {
            let b = bucket(v);
            assert!(b >= last, "buckets out of order at {v}");
            assert!(b < BUCKETS);
            let mid = value(b);
            let err = mid.abs_diff(v) as f64 / v.max(1) as f64;
            assert!(err <= 1.0 / 128.0, "{v} -> bucket {b} -> {mid}: error {err}");
            last = b;
        }
    }

    #[test]
    fn small_runs_are_exact() {
        let mut s = Samples::new(Some(1000));
        for v in (1..=1000).rev() {
            s.record(v);
        }
        let l = s.summary(1e-3);
        assert_eq!((l.p50, l.p99, l.min, l.max), (500.0, 990.0, 1.0, 1000.0));
    }

    #[test]
    fn long_runs_stay_bounded_and_close() {
        let mut s = Samples::new(None);
        // 3 × EXACT samples: values 1000..=1999 ns repeated, then a tail of 1 ms outliers (0.05 %).
        let n = 3 * EXACT as u64;
        for i in 0..n {
            s.record(if i % 2000 == 0 { 1_000_000 } else { 1000 + i % 1000 });
        }
        assert_eq!(s.exact.capacity(), EXACT, "the exact buffer never grows past its cap");
        let l = s.summary(1.0);
        assert_eq!(l.iters, n);
        assert!((l.p50 - 1500.0).abs() <= 1500.0 / 128.0, "p50 {}", l.p50);
        assert!((l.p90 - 1900.0).abs() <= 1900.0 / 128.0, "p90 {}", l.p90);
        assert_eq!(l.max, 1_000_000.0);
        assert_eq!(l.min, 1000.0);
    }
}
