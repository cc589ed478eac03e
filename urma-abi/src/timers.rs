//! URMA's two timer fields, and what their values mean.
//!
//! - `urma_jfs_cfg_t::err_timeout` N: the ACK timeout, 4.096 µs × 2^N (UMDK's header says so), the
//!   same encoding as InfiniBand's local ACK timeout.
//! - `urma_jfr_cfg_t::min_rnr_timer` N (0..=31): how long a sender waits after a "receiver not
//!   ready" answer, **2 µs × 2^N**. UMDK's header gives no unit; UMDK's URPC framework does (its
//!   default, 19, is commented "RNR single retransmission time: 2us*2^19 = 1.049s"). It is not
//!   InfiniBand's RNR timer table, where code 19 is 7.68 ms.

use std::time::Duration;

/// The largest `min_rnr_timer` value.
pub const MAX_MIN_RNR_TIMER: u8 = 31;

/// What `min_rnr_timer` `n` means: 2 µs × 2^n (`None` above [`MAX_MIN_RNR_TIMER`]).
pub fn min_rnr_timer_duration(n: u8) -> Option<Duration> {
    (n <= MAX_MIN_RNR_TIMER).then(|| Duration::from_micros(2u64 << n))
}

/// The smallest `min_rnr_timer` whose wait is at least `d` (31 for anything longer).
pub fn min_rnr_timer_at_least(d: Duration) -> u8 {
    (0..=MAX_MIN_RNR_TIMER).find(|&n| Duration::from_micros(2u64 << n) >= d).unwrap_or(MAX_MIN_RNR_TIMER)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urpc_s_default_is_about_a_second_and_the_typical_value_8_ms() {
        assert_eq!(min_rnr_timer_duration(19), Some(Duration::from_micros(1_048_576)));
        assert_eq!(min_rnr_timer_duration(12), Some(Duration::from_micros(8_192)));
        assert_eq!(min_rnr_timer_duration(32), None);
    }

    #[test]
    fn at_least_inverts_duration() {
        for n in 0..=MAX_MIN_RNR_TIMER {
            assert_eq!(min_rnr_timer_at_least(min_rnr_timer_duration(n).unwrap()), n);
        }
        assert_eq!(min_rnr_timer_at_least(Duration::from_micros(120)), 6); // 128 µs
        assert_eq!(min_rnr_timer_at_least(Duration::ZERO), 0);
    }
}
