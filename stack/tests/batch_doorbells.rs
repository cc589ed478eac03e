//! A batch on a multi-queue channel rings each queue's doorbell once per flush, with that
//! queue's share of the calls as one post list, while the calls still spread round-robin.
//!
//! Counts the client NIC's "doorbell sq" trace events. The trace recorder is process-wide, so
//! this binary holds this one test (no other test's NIC can record into the same trace).

use bypass::hal::trace::{self, Track, Value};
use bypass::sim::{Engine, Fabric};
use bypass::*;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

mod common;
use common::helpers;
use common::ids::ECHO;
use helpers::{echo_functions, until};

const NAME: &str = "batch-doorbells";
const QUEUES: usize = 4;
const CALLS: u8 = 32;

/// Per completed call, its number and its echo.
type Echoes = Arc<Mutex<Vec<(u8, Vec<u8>)>>>;

#[test]
fn a_flush_rings_each_queues_doorbell_once() {
    let fabric = Fabric::new(Engine::Stepped { seed: 0xBA7C_0D00 });
    let (snic, cnic) = (fabric.add_nic(), fabric.add_nic());
    let config = ServerConfig { workers: 0, ..ServerConfig::new(NAME) };
    let server = Server::bind(&snic, "127.0.0.1:0", config, echo_functions(ECHO)).expect("bind");
    // No keepalive: a probe is a call of its own, with a doorbell of its own.
    let ccfg = ChannelConfig { queues: QUEUES, window: 32, keepalive: None, ..ChannelConfig::new(NAME) };
    let channel = Channel::connect(&cnic, server.local_addr(), ccfg).expect("connect");
    fabric.run_until_idle();
    let out: Echoes = Arc::default();
    let mut batch = channel.batch();
    for i in 0..CALLS {
        let out = out.clone();
        batch
            .call_callback(&CallOptions::default(), ECHO, &[i; 24], move |r| {
                out.lock().unwrap().push((i, r.expect("echo").to_vec()));
            })
            .expect("stage");
    }
    assert_eq!(batch.staged(), usize::from(CALLS), "32 calls over 4 queues stay staged (8 each)");
    trace::start();
    batch.flush();
    trace::stop();
    let events = trace::take();
    // Per queue number, the sizes of the post lists its doorbells rang for.
    let mut lists: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for e in events.iter().filter(|e| e.track == Track::Nic(cnic.addr()) && e.name == "doorbell sq") {
        let qpn = e.arg("qpn").and_then(Value::as_u64).expect("a doorbell names its queue");
        lists.entry(qpn).or_default().push(e.arg("wqes").and_then(Value::as_u64).expect("and its list"));
    }
    assert_eq!(lists.len(), QUEUES, "the calls spread over every queue: {lists:?}");
    for (qpn, sizes) in &lists {
        assert_eq!(sizes, &[8], "queue {qpn:#x}: one doorbell for its 8 calls, got lists {sizes:?}");
    }
    until(
        "the 32 calls to complete",
        || {
            fabric.run_until_idle();
            server.poll();
            channel.poll();
        },
        || out.lock().unwrap().len() == usize::from(CALLS),
    );
    for (i, got) in out.lock().unwrap().iter() {
        assert_eq!(got, &vec![*i; 24], "call {i}");
    }
    drop(batch);
    assert_eq!(channel.stats().tx_in_use, 0);
}
