//! A tiny seeded generator for this crate's tests (SplitMix64): reproducible stress and fuzz
//! loops without a dependency. Test-only.

/// SplitMix64. The same seed gives the same sequence on every machine.
#[derive(Debug, Clone)]
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform-enough in `0..n` (`n > 0`).
    pub(crate) fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// Uniform-enough in `0..n` (`n > 0`), for 64-bit ranges.
    pub(crate) fn below_u64(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// True with probability `p` percent.
    pub(crate) fn percent(&mut self, p: u64) -> bool {
        self.next() % 100 < p
    }

    /// Fisher–Yates shuffle.
    pub(crate) fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i + 1);
            v.swap(i, j);
        }
    }

    /// Fills `buf` with random bytes.
    pub(crate) fn fill(&mut self, buf: &mut [u8]) {
        buf.iter_mut().for_each(|b| *b = self.next() as u8);
    }
}
