//! The hal conformance suite: scenarios every backend must pass, generic over a pair of devices.
//!
//! A backend provides an [`Env`] (two connected-capable devices plus a way to let time pass) and
//! instantiates the suite with [`conformance_suite!`](crate::conformance_suite), which expands to
//! one `#[test]` per scenario:
//!
//! ```ignore
//! bypass_hal::conformance_suite!(inline, || my_backend::TestEnv::new());
//! ```
//!
//! Scenarios assert what a user of the device would notice: bytes delivered, completions (their
//! order, status, opcode, length, immediate), queue states, and errors from post calls. They never
//! assert timing. They are written so that a slow device (a real NIC under load, or Soft-RoCE)
//! passes as long as it is correct: waits are bounded by generous budgets of (virtual or real) time.

use crate::{
    AckTimeout, Completion, CompletionQueue, Device, MemoryRegion, Queue, QueueConfig, QueueState, Status,
};
use std::time::Duration;

mod scenarios;
pub use scenarios::*;

/// A test environment: two devices that can reach each other, and control over time.
pub trait Env {
    /// The device type under test.
    type Dev: Device;
    /// The first device ("A", usually the requester).
    fn a(&self) -> &Self::Dev;
    /// The second device ("B", usually the responder).
    fn b(&self) -> &Self::Dev;
    /// Lets the devices make progress on work already posted. A stepped simulator runs until no
    /// event is ready; devices that progress on their own may return at once.
    fn progress(&self);
    /// Lets `d` pass: virtual time for a stepped simulator (then progress), a sleep otherwise.
    fn advance(&self, d: Duration);
    /// True when arming a CQ that holds an unpolled completion raises the event at once (devices
    /// that arm against the consumer index: mlx5, UDMA, the simulator); false when it may not
    /// (rxe). See [`crate::CompletionQueue::arm`].
    fn arm_signals_queued_completions(&self) -> bool {
        false
    }
    /// The ACK timeout of the scenarios' queues where a scenario leaves it at
    /// `QueueConfig::default()`'s (scenarios that need a timeout of their own set it); `None`
    /// keeps the default. For environments whose devices run on threads a loaded host can starve
    /// for longer than `retry_count` default timeouts (the simulator's real-time engines on a
    /// shared CI machine): a longer timeout keeps a starved thread from exhausting the retry
    /// budget, at the price of slower repairs of lost packets. Virtual-time environments need
    /// none.
    fn ack_timeout(&self) -> Option<AckTimeout> {
        None
    }
    /// True when the link between the devices may lose packets (the guest's netem variants).
    /// Scenarios then accept what hardware does when a packet they rely on is lost: a responder
    /// that NAKs a bad request (remote access or invalid request) goes to ERROR at once, so if the
    /// NAK is lost the retransmitted request meets a queue that answers nothing, and the requester
    /// fails with `RetryExceeded` instead of the NAK's status (rxe and the simulator both do this).
    fn loses_packets(&self) -> bool {
        false
    }
}

/// The time budget a scenario waits for completions that must arrive before it gives up.
pub const WAIT_BUDGET: Duration = Duration::from_secs(10);
/// The step by which waiting advances time between polls.
pub const WAIT_TICK: Duration = Duration::from_micros(200);

/// One side of a connected pair: a queue with its own send and receive CQs.
#[derive(Debug)]
pub struct Side<D: Device> {
    /// The queue.
    pub queue: D::Queue,
    /// Its send CQ.
    pub send_cq: D::Cq,
    /// Its receive CQ.
    pub recv_cq: D::Cq,
}

/// Two connected queues, `a` on device A and `b` on device B.
pub struct Pair<D: Device> {
    /// Queue on device A.
    pub a: Side<D>,
    /// Queue on device B.
    pub b: Side<D>,
}

// Written out because `#[derive(Debug)]` would demand `D: Debug` and miss the bounds on the
// queue and CQ types that `Side`'s derived impl needs.
impl<D: Device> std::fmt::Debug for Pair<D>
where
    Side<D>: std::fmt::Debug,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pair").field("a", &self.a).field("b", &self.b).finish()
    }
}

/// Creates one side: CQs sized for every outstanding request, and a queue in RESET.
#[track_caller]
pub fn side<D: Device>(dev: &D, cfg: &QueueConfig) -> Side<D> {
    let send_cq = dev.create_cq(cfg.send_depth + 1).expect("create send CQ");
    let recv_cq = dev.create_cq(cfg.recv_depth + 1).expect("create recv CQ");
    let queue = dev.create_queue(cfg, &send_cq, &recv_cq).expect("create queue");
    assert_eq!(queue.state(), QueueState::Reset, "a new queue starts in RESET");
    Side { queue, send_cq, recv_cq }
}

/// Creates and connects a pair of queues with the same configuration on both ends.
#[track_caller]
pub fn pair<E: Env>(env: &E, cfg: &QueueConfig) -> Pair<E::Dev> {
    let mut a = side(env.a(), cfg);
    let mut b = side(env.b(), cfg);
    connect(&mut a, &mut b);
    Pair { a, b }
}

/// Connects two RESET queues to each other.
#[track_caller]
pub fn connect<D: Device>(a: &mut Side<D>, b: &mut Side<D>) {
    let (ia, ib) = (a.queue.info(), b.queue.info());
    a.queue.connect(&ib).expect("connect A to B");
    b.queue.connect(&ia).expect("connect B to A");
    assert_eq!(a.queue.state(), QueueState::Ready);
    assert_eq!(b.queue.state(), QueueState::Ready);
}

/// Polls `cq` until `n` completions arrived, letting time pass between polls, and returns them.
/// Panics (naming `what`) if fewer arrive within [`WAIT_BUDGET`].
#[track_caller]
pub fn wait_for<E: Env, C: CompletionQueue>(env: &E, cq: &mut C, n: usize, what: &str) -> Vec<Completion> {
    let got = collect(env, cq, n, WAIT_BUDGET);
    assert_eq!(got.len(), n, "{what}: expected {n} completion(s) within {WAIT_BUDGET:?}, got {got:?}");
    got
}

/// Waits for exactly one completion on `cq`.
#[track_caller]
pub fn wait_one<E: Env, C: CompletionQueue>(env: &E, cq: &mut C, what: &str) -> Completion {
    wait_for(env, cq, 1, what)[0]
}

/// Polls `cq`, letting up to `budget` pass, until `n` completions arrived or the budget is spent;
/// returns what arrived (possibly more than `n` if they came in one poll).
pub fn collect<E: Env, C: CompletionQueue>(
    env: &E,
    cq: &mut C,
    n: usize,
    budget: Duration,
) -> Vec<Completion> {
    let mut got = Vec::new();
    let mut buf = [Completion::default(); 64];
    let mut waited = Duration::ZERO;
    loop {
        env.progress();
        let k = cq.poll(&mut buf).expect("poll");
        got.extend_from_slice(&buf[..k]);
        if got.len() >= n {
            return got;
        }
        if k == 0 {
            if waited >= budget {
                return got;
            }
            env.advance(WAIT_TICK);
            waited += WAIT_TICK;
        }
    }
}

/// Asserts that nothing more arrives on `cq` while `quiet` passes.
#[track_caller]
pub fn expect_none<E: Env, C: CompletionQueue>(env: &E, cq: &mut C, quiet: Duration, what: &str) {
    let extra = collect(env, cq, 1, quiet);
    assert!(extra.is_empty(), "{what}: expected no completion, got {extra:?}");
}

/// Asserts a completion's status, naming it on failure.
#[track_caller]
pub fn assert_status(c: &Completion, status: Status, what: &str) {
    assert_eq!(c.status, status, "{what}: {c:?}");
}

/// A deterministic byte pattern (so a misplaced byte is caught, not just a missing one).
pub fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ ((i >> 8) as u8)).collect()
}

/// Reads a region's bytes `offset..offset+len`.
#[track_caller]
pub fn read_region<R: MemoryRegion>(mr: &R, offset: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    mr.read(offset, &mut v).expect("read region");
    v
}

/// Expands to one `#[test]` per conformance scenario, in a module named `$name`, each calling the
/// scenario with a fresh environment from `$make_env`.
///
/// With `skip_unless`, `$make_env` is called with the scenario's name and returns an
/// `Option<Env>`: `None` skips the scenario (the closure prints why), for suites that run only
/// where a device is present (`bypass-hw-tests`).
#[macro_export]
macro_rules! conformance_suite {
    ($name:ident, skip_unless $make_env:expr) => {
        $crate::__conformance_module!($name, |scenario: &str| ($make_env)(scenario));
    };
    ($name:ident, $make_env:expr) => {
        $crate::__conformance_module!($name, |_: &str| Some(($make_env)()));
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_module {
    ($name:ident, $make_env:expr) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            $crate::__conformance_tests!($make_env;
                send_recv_sizes,
                gather_and_scatter,
                send_imm_delivers_immediate,
                write_imm_consumes_receive,
                write_and_read_regions,
                large_writes_and_reads_keep_every_byte,
                unsignaled_requests_are_ordered,
                zero_length_write_needs_no_key,
                completions_in_post_order,
                cq_wraps_without_loss,
                recv_too_small_fails_the_receive,
                remote_access_errors_flush_exactly_once,
                post_in_reset_refused_in_error_flushed,
                send_queue_full_would_block,
                invalid_batch_posts_nothing,
                rnr_then_success,
                rnr_retry_exceeded,
                retry_exceeded_when_the_peer_is_gone,
                deregistered_keys_stop_working,
                error_reset_ready_recovers,
                reset_discards_unpolled_completions,
                inline_send,
                cq_event_fd_after_arm,
                cq_event_solicited_only,
                arm_with_a_completion_already_queued,
                shared_cq_for_send_and_recv,
                shared_event_channel,
                caller_memory_registration,
                atomics_compare_swap_and_fetch_add,
                shared_recv_serves_several_queues,
                shared_recv_empty_is_receiver_not_ready,
                shared_recv_destroy_refused_while_used,
                shared_recv_survives_a_failed_queue,
                shared_recv_slots_come_back_from_a_destroyed_queue,
                destroyed_queue_numbers_never_deliver,
            );
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_tests {
    ($make_env:expr; $($scenario:ident),* $(,)?) => {
        $(
            #[test]
            fn $scenario() {
                if let Some(env) = ($make_env)(stringify!($scenario)) {
                    $crate::conformance::$scenario(&env);
                }
            }
        )*
    };
}
