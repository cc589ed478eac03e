//! An endpoint's sizes: the depths, message size and repost batch a connection is built with,
//! the registered memory they cost, and the checks of a configuration against the device (what
//! the hal would refuse is refused here, by name).

use crate::error::bad_field;
use crate::hal::QueueConfig;
use crate::RpcError;

/// Sizes of an endpoint.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sizes {
    pub(crate) queues: usize,
    pub(crate) send_depth: u32,
    pub(crate) recv_depth: u32,
    pub(crate) msg_size: usize,
    /// Receive buffers re-posted together (1..=[`MAX_REPOST_BATCH`](crate::limits::MAX_REPOST_BATCH)). The receive depth must
    /// exceed what the peer may have outstanding by this much: up to `repost_batch - 1` buffers
    /// wait to be re-posted at any time.
    pub(crate) repost_batch: usize,
    pub(crate) queue_config: QueueConfig,
}

/// Bytes of registered buffers of an endpoint of `queues` queues with `send` send contexts and
/// `recv` receive buffers per queue, of `msg_size` bytes each.
pub(crate) fn buffer_bytes(queues: usize, (send, recv): (u32, u32), msg_size: usize) -> u64 {
    (queues as u64).saturating_mul(u64::from(send) + u64::from(recv)).saturating_mul(msg_size as u64)
}

/// The largest window up to `window` whose buffers (`depths(w)` per queue) fit in `limit` bytes,
/// or `None` when not even a window of 1 does. The buffers grow with the window, so this is the
/// window scaled down for large messages.
pub(crate) fn fit_window(
    window: u32,
    queues: usize,
    msg_size: usize,
    limit: u64,
    depths: impl Fn(u32) -> (u32, u32),
) -> Option<u32> {
    fit_window_by(window, |w| buffer_bytes(queues, depths(w), msg_size) <= limit)
}

/// The largest window up to `window` that `fits` (a test that holds for every window below one
/// that passes), or `None` when not even a window of 1 does.
pub(crate) fn fit_window_by(window: u32, fits: impl Fn(u32) -> bool) -> Option<u32> {
    if !fits(1) {
        return None;
    }
    // Binary search for the largest fitting w in 1..=window (fits(1) holds).
    let (mut lo, mut hi) = (1u32, window.max(1));
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    Some(lo)
}

/// Checks the transport settings `c` (the field `field` of a config) against the device: what
/// the hal would refuse is refused here, by name. The depths and SGE limits are replaced by the
/// stack's own (derived from the window, checked by [`validate_sizes`]); a zero, which no queue
/// can have, is still refused rather than silently replaced.
pub(crate) fn validate_queue_config(
    field: &str,
    c: &QueueConfig,
    caps: &crate::hal::DeviceCaps,
) -> Result<(), RpcError> {
    for (name, v) in [
        ("send_depth", c.send_depth),
        ("recv_depth", c.recv_depth),
        ("max_send_sge", c.max_send_sge),
        ("max_recv_sge", c.max_recv_sge),
    ] {
        if v == 0 {
            return Err(bad_field(
                &format!("{field}.{name}"),
                "is 0: no queue can have that (the stack sets its own value, derived from the window; leave the default)",
            ));
        }
    }
    if c.max_inline > caps.max_inline {
        return Err(bad_field(
            &format!("{field}.max_inline"),
            format_args!("is {}: the device allows at most {}", c.max_inline, caps.max_inline),
        ));
    }
    for (name, v) in [("retry_count", c.retry_count), ("rnr_retry", c.rnr_retry)] {
        if v > 7 {
            return Err(bad_field(&format!("{field}.{name}"), format_args!("is {v}: use 0..=7")));
        }
    }
    // `timeout` (an AckTimeout, exponent 0 = no retransmission timer), `min_rnr_timer` and the
    // read limits (clamped to the device's) are valid whatever their value.
    Ok(())
}

/// Checks that an endpoint of `queues` queues with `send_depth` send contexts and `recv_depth`
/// receive buffers per queue, of `msg_size` bytes each, fits the device; `hint` (appended to the
/// error) says which config fields decide these numbers.
pub(crate) fn validate_sizes(
    hint: &str,
    queues: usize,
    send_depth: u32,
    recv_depth: u32,
    msg_size: usize,
    caps: &crate::hal::DeviceCaps,
) -> Result<(), RpcError> {
    let tx = queues as u64 * u64::from(send_depth);
    let rx = queues as u64 * u64::from(recv_depth);
    let max_depth = u64::from(caps.max_queue_depth);
    let err = |what: String| Err(RpcError::InvalidArgument(format!("{what}: {hint}")));
    if tx > max_depth {
        return err(format!(
            "{tx} send contexts ({queues} queues x {send_depth}) exceed the device's queue depth {max_depth} \
             (every send ring holds all of them)"
        ));
    }
    if u64::from(recv_depth) > max_depth {
        return err(format!(
            "{recv_depth} receive buffers per queue exceed the device's queue depth {max_depth}"
        ));
    }
    for (dir, n) in [("send", tx), ("receive", rx)] {
        if n + 1 > u64::from(caps.max_cq_depth) {
            return err(format!(
                "the {dir} completion queue needs {} entries, more than the device's {}",
                n + 1,
                caps.max_cq_depth
            ));
        }
        if n.saturating_mul(msg_size as u64) > caps.max_region_size {
            return err(format!(
                "{n} {dir} buffers of {msg_size} bytes exceed the device's largest registration ({} bytes)",
                caps.max_region_size
            ));
        }
    }
    Ok(())
}
