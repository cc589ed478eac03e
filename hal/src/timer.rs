//! Transport timers in the units the hardware takes: the ACK timeout exponent and the RNR timer
//! code of InfiniBand/RoCE (verbs `ibv_qp_attr::timeout` and `min_rnr_timer`; URMA's jetty
//! `err_timeout` and `min_rnr_timer` use the same encodings).
//!
//! A queue's timers are one of the values a NIC can hold, not any `Duration`: build them from a
//! duration (rounded *up* to the next value the hardware has, so a timer never fires early) or
//! from the raw code, and every backend (the simulator included) gives them the same meaning.

use std::time::Duration;

/// The local ACK timeout: how long a requester waits for an acknowledgement before it
/// retransmits. Exponent `t` in 1..=31 means 4.096 µs × 2^t; `0` means *no timer* (the requester
/// waits forever), as on verbs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AckTimeout(u8);

impl AckTimeout {
    /// No retransmission timer at all (exponent 0).
    pub const NONE: AckTimeout = AckTimeout(0);
    const UNIT_NS: u64 = 4096;

    /// The timeout with exponent `t` (0..=31); `None` above 31.
    pub const fn from_exponent(t: u8) -> Option<Self> {
        if t <= 31 {
            Some(AckTimeout(t))
        } else {
            None
        }
    }

    /// The smallest timeout of at least `d` (exponent 1 for anything up to 8.192 µs); `d` of zero
    /// is [`AckTimeout::NONE`], and anything above 2^31 × 4.096 µs (~2.4 h) saturates at 31.
    pub fn at_least(d: Duration) -> Self {
        if d.is_zero() {
            return AckTimeout::NONE;
        }
        let ns = d.as_nanos();
        (1..=31u8).map(AckTimeout).find(|t| u128::from(t.nanos()) >= ns).unwrap_or(AckTimeout(31))
    }

    /// The exponent (what `ibv_modify_qp` takes).
    pub const fn exponent(self) -> u8 {
        self.0
    }

    fn nanos(self) -> u64 {
        Self::UNIT_NS << self.0
    }

    /// The timeout as a duration; `None` for [`AckTimeout::NONE`].
    pub fn duration(self) -> Option<Duration> {
        (self.0 != 0).then(|| Duration::from_nanos(self.nanos()))
    }
}

/// The RNR timer: how long a requester waits after a receiver-not-ready NAK before it sends again
/// (the responder advertises its `min_rnr_timer` in the NAK). A 5-bit code; code 0 is the longest,
/// 655.36 ms, as the InfiniBand table defines it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RnrTimer(u8);

/// Microseconds of each RNR timer code (IBTA vol. 1, table "Encoding for RNR NAK Timer Field").
const RNR_MICROS: [u32; 32] = [
    655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560, 3_840, 5_120,
    7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840, 245_760, 327_680,
    491_520,
];

impl RnrTimer {
    /// The timer with `code` (0..=31); `None` above 31.
    pub const fn from_code(code: u8) -> Option<Self> {
        if code <= 31 {
            Some(RnrTimer(code))
        } else {
            None
        }
    }

    /// The shortest timer of at least `d` (code 1, 10 µs, for anything up to 10 µs); above
    /// 491.52 ms it is code 0 (655.36 ms).
    pub fn at_least(d: Duration) -> Self {
        let us = d.as_micros();
        (1..=31u8).map(RnrTimer).find(|t| u128::from(RNR_MICROS[t.0 as usize]) >= us).unwrap_or(RnrTimer(0))
    }

    /// The code (what `ibv_modify_qp` and the AETH of an RNR NAK carry).
    pub const fn code(self) -> u8 {
        self.0
    }

    /// The wait as a duration.
    pub fn duration(self) -> Duration {
        Duration::from_micros(u64::from(RNR_MICROS[self.0 as usize]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ack_timeout_encoding() {
        assert_eq!(AckTimeout::NONE.duration(), None);
        assert_eq!(AckTimeout::at_least(Duration::ZERO), AckTimeout::NONE);
        assert_eq!(AckTimeout::from_exponent(14).unwrap().duration(), Some(Duration::from_nanos(4096 << 14)));
        // 100 ms rounds up to 2^15 × 4.096 µs = 134.2 ms; exactly 2^14 × 4.096 µs stays 14.
        assert_eq!(AckTimeout::at_least(Duration::from_millis(100)).exponent(), 15);
        assert_eq!(AckTimeout::at_least(Duration::from_nanos(4096 << 14)).exponent(), 14);
        assert_eq!(AckTimeout::at_least(Duration::from_nanos(1)).exponent(), 1);
        assert_eq!(AckTimeout::at_least(Duration::from_secs(1 << 20)).exponent(), 31);
        assert_eq!(AckTimeout::from_exponent(32), None);
    }

    #[test]
    fn rnr_timer_encoding() {
        assert_eq!(RnrTimer::from_code(0).unwrap().duration(), Duration::from_micros(655_360));
        assert_eq!(RnrTimer::from_code(12).unwrap().duration(), Duration::from_micros(640));
        assert_eq!(RnrTimer::at_least(Duration::from_micros(100)).code(), 7); // 120 µs
        assert_eq!(RnrTimer::at_least(Duration::ZERO).code(), 1);
        assert_eq!(RnrTimer::at_least(Duration::from_millis(500)).code(), 0);
        assert_eq!(RnrTimer::from_code(32), None);
        for w in RNR_MICROS[1..].windows(2) {
            assert!(w[0] < w[1], "codes 1..=31 increase");
        }
    }
}
