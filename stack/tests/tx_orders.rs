//! The send context's events in every order, end to end on the Stepped simulator.
//!
//! The client polls its receive CQ (responses, ACKs) and its send CQ separately, so the test
//! decides which of a call's events the stack sees first; a timeout is a third party, fired by
//! moving the virtual clock. Losing every transport acknowledgement (`ack_drop_ppm`) keeps a
//! request's send completion away until the queue is flushed, so a response (or ACK) can be
//! followed by a flush. Each case asserts that the call completes exactly once, with the outcome
//! of the first terminal event, and that no send context, table slot or credit is leaked.

use bypass::sim::{Engine, FaultPlan};
use bypass::{CallMode, CallOptions, RpcError};
use std::ops::Deref;
use std::sync::{Arc, Mutex};
use std::time::Duration;

mod common;
use common::ids::ECHO;

const TIMEOUT: Duration = Duration::from_millis(5);
const WINDOW: u32 = 8;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Got {
    Ok(Vec<u8>),
    Timeout,
    Other(String),
}

/// The shared rig on the Stepped engine, and the outcomes of the calls it started.
struct Rig {
    rig: common::rig::Rig,
    outcomes: Arc<Mutex<Vec<Got>>>,
}

impl Deref for Rig {
    type Target = common::rig::Rig;
    fn deref(&self) -> &common::rig::Rig {
        &self.rig
    }
}

impl Rig {
    fn new(seed: u64, lose_transport_acks: bool) -> Rig {
        let rig = common::rig::Rig::build(Engine::Stepped { seed }, |s| {
            if lose_transport_acks {
                s.fabric.faults = FaultPlan { ack_drop_ppm: 1_000_000, seed, ..FaultPlan::NONE };
            }
            // Exact orders on the Stepped engine: no keepalive probes (real time; the rig turns
            // them off there) and no queue recovery (a failed queue stays failed), which would
            // add device work of their own.
            s.channel.window = WINDOW;
            s.channel.timeout = None;
            s.channel.recovery = None;
        });
        Rig { rig, outcomes: Arc::default() }
    }

    fn start(&self, mode: CallMode, timeout: Option<Duration>) {
        let outcomes = self.outcomes.clone();
        let opts = CallOptions { timeout, ..CallOptions::mode(mode) };
        self.channel
            .call_callback(&opts, ECHO, b"ping", move |r| {
                outcomes.lock().unwrap().push(match r {
                    Ok(d) => Got::Ok(d.to_vec()),
                    Err(RpcError::Timeout) => Got::Timeout,
                    Err(e) => Got::Other(e.to_string()),
                })
            })
            .unwrap();
    }

    /// Moves the request to the server, runs its handler, and moves everything back to the
    /// client's CQs, without letting the client poll.
    fn exchange(&self) {
        self.fabric.run_until_idle();
        assert!(self.server.poll() > 0, "the server saw nothing");
        self.fabric.run_until_idle();
    }

    fn outcomes(&self) -> Vec<Got> {
        self.outcomes.lock().unwrap().clone()
    }

    fn tx_in_use(&self) -> usize {
        self.channel.stats().tx_in_use
    }

    /// Everything settles: no context, table slot or credit left behind on either side.
    fn assert_drained(&self) {
        for _ in 0..100 {
            self.fabric.run_until_idle();
            self.server.poll();
            self.channel.poll();
        }
        let s = self.channel.stats();
        assert_eq!((s.tx_in_use, s.table_in_use), (0, 0), "client leaked: {s:?}");
        if !self.channel.is_closed() {
            assert_eq!(s.credits, u64::from(WINDOW), "credits not all returned: {s:?}");
        }
        assert_eq!(self.server.tx_in_use(), 0, "server leaked send contexts");
    }
}

#[test]
fn response_before_send_completion() {
    let rig = Rig::new(1, false);
    rig.start(CallMode::WaitRsp, None);
    rig.exchange();
    assert_eq!(rig.channel.poll_responses(), 1);
    assert_eq!(rig.outcomes(), [Got::Ok(b"ping".to_vec())], "the response completes the call");
    assert_eq!(rig.tx_in_use(), 1, "the context waits for its send completion");
    assert!(rig.channel.poll_send_completions() >= 1);
    assert_eq!(rig.tx_in_use(), 0, "the send completion releases it");
    assert_eq!(rig.outcomes().len(), 1);
    rig.assert_drained();
}

#[test]
fn send_completion_before_response() {
    let rig = Rig::new(2, false);
    rig.start(CallMode::WaitRsp, None);
    rig.exchange();
    assert!(rig.channel.poll_send_completions() >= 1);
    assert!(rig.outcomes().is_empty(), "a send completion does not complete a WAIT_RSP call");
    assert_eq!(rig.tx_in_use(), 1, "the context waits for the response");
    assert_eq!(rig.channel.poll_responses(), 1);
    assert_eq!(rig.outcomes(), [Got::Ok(b"ping".to_vec())]);
    assert_eq!(rig.tx_in_use(), 0, "the response releases it");
    rig.assert_drained();
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Timeout,
    Response,
    SendCqe,
}

fn permutations() -> Vec<[Step; 3]> {
    use Step::*;
    vec![
        [Timeout, Response, SendCqe],
        [Timeout, SendCqe, Response],
        [Response, Timeout, SendCqe],
        [Response, SendCqe, Timeout],
        [SendCqe, Timeout, Response],
        [SendCqe, Response, Timeout],
    ]
}

/// A timeout racing both the response and the send completion, in all six orders.
#[test]
fn timeout_racing_response_and_send_completion_in_every_order() {
    for (i, order) in permutations().into_iter().enumerate() {
        let rig = Rig::new(10 + i as u64, false);
        rig.start(CallMode::WaitRsp, Some(TIMEOUT));
        rig.exchange();
        rig.fabric.advance(TIMEOUT * 2);
        let mut done = Vec::new();
        for step in order {
            match step {
                Step::Timeout => drop(rig.channel.check_timeouts()),
                Step::Response => assert_eq!(rig.channel.poll_responses(), 1, "{order:?}"),
                Step::SendCqe => assert!(rig.channel.poll_send_completions() >= 1, "{order:?}"),
            }
            done.push(step);
            let send_seen = done.contains(&Step::SendCqe);
            let terminal_seen = done.contains(&Step::Timeout) || done.contains(&Step::Response);
            let expect_in_use = usize::from(!(send_seen && terminal_seen));
            assert_eq!(rig.tx_in_use(), expect_in_use, "{order:?} after {done:?}");
            assert_eq!(rig.outcomes().len(), usize::from(terminal_seen), "{order:?} after {done:?}");
        }
        let first = order.into_iter().find(|s| *s != Step::SendCqe).unwrap();
        let expect = if first == Step::Timeout { Got::Timeout } else { Got::Ok(b"ping".to_vec()) };
        assert_eq!(rig.outcomes(), [expect], "{order:?}");
        if first == Step::Timeout {
            assert!(rig.channel.stats().stale >= 1, "{order:?}: the late response is counted as stale");
            assert_eq!(rig.channel.stats().timeouts, 1);
        }
        rig.assert_drained();
    }
}

/// A flush after the peer's message completed the call: the flushed send completion releases the
/// context and delivers nothing more. Transport ACKs are all lost, so the request's send
/// completion is still pending when the response (or URPC ACK) arrives.
#[test]
fn flush_after_response_or_ack_releases_once_and_delivers_nothing() {
    for (i, mode) in [CallMode::WaitRsp, CallMode::Ack, CallMode::AckEarlyRsp].into_iter().enumerate() {
        let rig = Rig::new(20 + i as u64, true);
        rig.start(mode, None);
        rig.exchange();
        assert_eq!(rig.channel.poll_send_completions(), 0, "{mode:?}: the transport ACK was lost");
        assert!(rig.channel.poll_responses() >= 1, "{mode:?}");
        let expect = if mode == CallMode::AckEarlyRsp { Got::Ok(vec![]) } else { Got::Ok(b"ping".to_vec()) };
        assert_eq!(
            rig.outcomes(),
            std::slice::from_ref(&expect),
            "{mode:?}: completed by the peer's message"
        );
        assert_eq!(rig.tx_in_use(), 1, "{mode:?}: still waiting for the send completion");
        rig.channel.fail_queue(0).unwrap();
        rig.fabric.run_until_idle();
        rig.channel.poll_send_completions();
        assert_eq!(rig.tx_in_use(), 0, "{mode:?}: the flushed send completion released the context");
        assert_eq!(rig.outcomes(), [expect], "{mode:?}: nothing delivered twice");
        assert!(rig.channel.is_closed(), "{mode:?}: its only queue failed");
        let s = rig.channel.stats();
        assert_eq!((s.tx_in_use, s.table_in_use), (0, 0), "{mode:?}: {s:?}");
    }
}

/// The flush comes first, with the response still on its way: the call fails with a queue error
/// (or closed) once, and the response that arrives later is not delivered.
#[test]
fn flush_before_response_fails_the_call_once() {
    let rig = Rig::new(30, true);
    rig.start(CallMode::WaitRsp, None);
    rig.exchange();
    rig.channel.fail_queue(0).unwrap();
    rig.fabric.run_until_idle();
    rig.channel.poll();
    let got = rig.outcomes();
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(matches!(&got[0], Got::Other(_)), "{got:?}");
    assert_eq!(rig.tx_in_use(), 0);
}

/// Every mode, with events in both orders, over several scheduler seeds.
#[test]
fn every_mode_in_both_orders_completes_once() {
    for seed in 0..4 {
        for mode in CallMode::ALL {
            for recv_first in [true, false] {
                let rig = Rig::new(100 + seed, false);
                rig.start(mode, None);
                rig.exchange();
                if recv_first {
                    rig.channel.poll_responses();
                    rig.channel.poll_send_completions();
                } else {
                    rig.channel.poll_send_completions();
                    rig.channel.poll_responses();
                }
                rig.fabric.run_until_idle();
                rig.channel.poll();
                let expect = match mode {
                    CallMode::WaitRsp | CallMode::Ack => Got::Ok(b"ping".to_vec()),
                    _ => Got::Ok(vec![]),
                };
                assert_eq!(rig.outcomes(), [expect], "{mode:?} recv_first={recv_first} seed={seed}");
                rig.assert_drained();
            }
        }
    }
}
