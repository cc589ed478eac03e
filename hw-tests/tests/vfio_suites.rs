//! The hal conformance suite and the stack's RPC suite (`bypass::conformance`) between the VFIO
//! NIC and Soft-RoCE, in the guest's VFIO topology (`hw-tests/vm/run --vfio`, docs/vfio.md): one
//! end on the simulator's transport over the userspace virtio-net driver (NIC A, the `vfio:`
//! backend, Inline engine), the other on `rxe1`, the kernel's Soft-RoCE on NIC B, through
//! [`Either`](bypass_hw_tests::either::Either). Every scenario runs in both orders and without
//! and with 1 % netem loss on NIC B's side (rxe's frames):
//!
//! | module | first end (hal: A, requester; RPC: server) | second end | netem on NIC B |
//! |---|---|---|---|
//! | `hal_vfio_first`, `rpc_vfio_server` | the VFIO NIC | rxe1 | none |
//! | `hal_rxe_first`, `rpc_rxe_server` | rxe1 | the VFIO NIC | none |
//! | `…_lossy` | as above | | `loss 1%` |
//!
//! The network is built once per process (`rxe1` on NIC B, the VFIO NIC opened once) and
//! shared by every test, in order: run with `--test-threads=1` (libtest runs tests in name
//! order, so netem changes only between modules). Outside the guest's VFIO topology, without
//! root, or built without the feature `vfio`, every test skips with a message.
//!
//! ```text
//! cargo test -p bypass-hw-tests --features verbs,vfio --release --no-run
//! bin=$(ls -t target/release/deps/vfio_suites-* | grep -v '\.d$' | head -n1)
//! BYPASS_HW=verbs:rxe0 hw-tests/vm/run --vfio --timeout 900 -- "$bin" --test-threads=1
//! ```
#![cfg(feature = "verbs")]

use bypass_hal::verbs::VerbsDevice;
use bypass_hal::AckTimeout;
use bypass_hw_tests::either::{set_min_ack_timeout, EitherEnv};
use bypass_hw_tests::rxe_link;
use bypass_hw_tests::shell::{sh, sh_quiet};
use bypass_hw_tests::vfio_topology::VfioTopology;
use bypass_sim::{Fabric, SimNic};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// The Soft-RoCE device on NIC B.
const RXE: &str = "rxe1";
/// NIC B's MTU is 1500: rxe's active MTU is 1024 (the largest IB MTU ≤ 1500 − 80), and the sim
/// on the L2 wire picks the same path MTU.
const MTU: u32 = 1024;
/// Bound on the network's setup steps (TCG is slow).
const SETUP_WAIT: Duration = Duration::from_secs(60);

/// The network every test shares: the VFIO NIC's simulated NIC and rxe1, and netem's state.
struct Rig {
    _fabric: Fabric,
    sim: SimNic,
    rxe: VerbsDevice,
    netdev: String,
    lossy: Mutex<bool>,
}

impl Rig {
    fn up(t: &VfioTopology) -> Rig {
        // A failed earlier setup in this boot may have left them.
        sh_quiet(&["tc", "qdisc", "del", "dev", &t.netdev, "root"]);
        sh_quiet(&["rdma", "link", "delete", RXE]);
        rxe_link::add(RXE, &t.netdev, t.peer_ip, SETUP_WAIT);
        let rxe = VerbsDevice::open_spec(&format!("{RXE},mtu={MTU}"))
            .unwrap_or_else(|e| panic!("cannot open {RXE}: {e}"));
        assert_eq!(rxe.gid().1, t.peer_ip.to_ipv6_mapped().octets(), "{RXE} uses the GID of {}", t.peer_ip);
        let spec = t.backend();
        let fabric = vfio_fabric(t);
        let sim = fabric.try_add_nic().unwrap_or_else(|e| panic!("{spec}: the NIC: {e}"));
        assert_eq!(fabric.config().mtu, MTU, "the sim's path MTU is {RXE}'s");
        eprintln!("vfio_suites: {spec} and {RXE} on {} ({}) are up", t.netdev, t.peer_ip);
        Rig { _fabric: fabric, sim, rxe, netdev: t.netdev.clone(), lossy: Mutex::new(false) }
    }

    /// Puts netem's 1 % loss on NIC B (rxe's frames) or takes it off, if it is not so already,
    /// and says what both sides counted so far.
    fn set_loss(&self, lossy: bool) {
        let mut now = self.lossy.lock().unwrap_or_else(|e| e.into_inner());
        if *now == lossy {
            return;
        }
        eprintln!(
            "vfio_suites: netem loss {} on {}; so far the sim counted {:?}, {RXE} {}",
            if lossy { "1% on" } else { "off" },
            self.netdev,
            self.sim.stats(),
            rxe_link::nonzero_counters(RXE)
        );
        if lossy {
            sh(&["modprobe", "sch_netem"]);
            sh(&["tc", "qdisc", "replace", "dev", &self.netdev, "root", "netem", "loss", "1%"]);
        } else {
            sh(&["tc", "qdisc", "del", "dev", &self.netdev, "root"]);
        }
        *now = lossy;
    }
}

/// What the `vfio:` backend string opens (the VFIO NIC under the sim's L2 wire, Inline engine),
/// with retransmission backoff on: in this TCG guest the "NIC" on either end is software on a
/// starved vCPU, descheduled for longer than 7 fixed timeouts (~1 s) while 4 MiB moves, and a
/// timeout resends the whole window (docs/vfio.md, "The suites between the VFIO NIC and rxe").
#[cfg(feature = "vfio")]
fn vfio_fabric(t: &VfioTopology) -> Fabric {
    use bypass_sim::{Engine, FabricConfig, L2Addr, L2Attachment};
    let port = bypass_hal::vfio::VirtioNet::open(&t.nic)
        .unwrap_or_else(|e| panic!("cannot open the VFIO NIC {}: {e}", t.nic));
    let addr = L2Addr::parse_options(&format!("ip={}/24", VfioTopology::OUR_IP)).expect("our address");
    let config = FabricConfig {
        ack_timeout_backoff: Some(bypass_sim::BYTE_WIRE_ACK_TIMEOUT_BACKOFF),
        ..FabricConfig::new(Engine::Inline)
    };
    Fabric::try_with_l2(config, vec![L2Attachment { port: Box::new(port), addr }])
        .unwrap_or_else(|e| panic!("{}: {e}", t.backend()))
}

#[cfg(not(feature = "vfio"))]
fn vfio_fabric(_: &VfioTopology) -> Fabric {
    unreachable!("env() skips every test without the feature vfio")
}

/// The network, built by the first test that runs.
static RIG: OnceLock<Rig> = OnceLock::new();

/// Has a failing scenario also print both sides' counters (the sim NIC's: retransmissions,
/// duplicates, timeouts; rxe1's from sysfs), which say which side gave up and why. Panics the
/// suites provoke on purpose (their messages start with "rpc-suite:") print nothing more.
fn counters_on_panic() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        previous(info);
        let msg = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if msg.starts_with("rpc-suite:") {
            return;
        }
        if let Some(rig) = RIG.get() {
            eprintln!(
                "vfio_suites: at the panic the sim counted {:?}; {RXE}: {}",
                rig.sim.stats(),
                rxe_link::nonzero_counters(RXE)
            );
        }
    }));
}

/// Which device is the first end.
#[derive(Clone, Copy)]
enum First {
    Vfio,
    Rxe,
}

/// The RPC suite's queues retransmit after at least ~0.5 s (rxe_interop's RPC queues do the
/// same): with its default ~134 ms, rxe1's fixed budget of 7 timeouts ran out while 8 blocking
/// callers starved the sim client's vCPU (`retry_exceeded_err=1` on rxe1, the calls `Flushed`;
/// docs/vfio.md). The hal suite keeps the timeouts its scenarios ask for.
fn rpc_min_ack_timeout() -> AckTimeout {
    AckTimeout::at_least(Duration::from_millis(500))
}

/// Which suite a test belongs to.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Suite {
    Hal,
    Rpc,
}

/// The environment of `scenario`, or `None` (after printing why) where the topology is not here.
fn env(scenario: &str, suite: Suite, first: First, lossy: bool) -> Option<EitherEnv<SimNic, VerbsDevice>> {
    rxe_link::should_run(scenario)?;
    if !cfg!(feature = "vfio") {
        bypass_hw_tests::skip(scenario, "built without the feature vfio (--features verbs,vfio)");
        return None;
    }
    let t = VfioTopology::from_env(scenario)?;
    let rig = RIG.get_or_init(|| {
        counters_on_panic();
        Rig::up(&t)
    });
    rig.set_loss(lossy);
    set_min_ack_timeout(if suite == Suite::Rpc { rpc_min_ack_timeout() } else { AckTimeout::NONE });
    let (sim, rxe) = (rig.sim.clone(), rig.rxe.clone());
    Some(
        match first {
            First::Vfio => EitherEnv::left_first(sim, rxe),
            // The sim's CQs arm against the consumer index; rxe's do not.
            First::Rxe => EitherEnv::right_first(sim, rxe).second_arms_against_consumer_index(true),
        }
        .loses_packets(lossy),
    )
}

fn vfio_first(s: &str) -> Option<EitherEnv<SimNic, VerbsDevice>> {
    env(s, Suite::Hal, First::Vfio, false)
}
fn rxe_first(s: &str) -> Option<EitherEnv<SimNic, VerbsDevice>> {
    env(s, Suite::Hal, First::Rxe, false)
}
fn vfio_first_lossy(s: &str) -> Option<EitherEnv<SimNic, VerbsDevice>> {
    env(s, Suite::Hal, First::Vfio, true)
}
fn rxe_first_lossy(s: &str) -> Option<EitherEnv<SimNic, VerbsDevice>> {
    env(s, Suite::Hal, First::Rxe, true)
}
fn vfio_server(s: &str) -> Option<EitherEnv<SimNic, VerbsDevice>> {
    env(s, Suite::Rpc, First::Vfio, false)
}
fn rxe_server(s: &str) -> Option<EitherEnv<SimNic, VerbsDevice>> {
    env(s, Suite::Rpc, First::Rxe, false)
}
fn vfio_server_lossy(s: &str) -> Option<EitherEnv<SimNic, VerbsDevice>> {
    env(s, Suite::Rpc, First::Vfio, true)
}
fn rxe_server_lossy(s: &str) -> Option<EitherEnv<SimNic, VerbsDevice>> {
    env(s, Suite::Rpc, First::Rxe, true)
}

bypass_hal::conformance_suite!(hal_vfio_first, skip_unless super::vfio_first);
bypass_hal::conformance_suite!(hal_rxe_first, skip_unless super::rxe_first);
bypass_hal::conformance_suite!(hal_vfio_first_lossy, skip_unless super::vfio_first_lossy);
bypass_hal::conformance_suite!(hal_rxe_first_lossy, skip_unless super::rxe_first_lossy);
bypass::rpc_suite!(rpc_vfio_server, skip_unless super::vfio_server);
bypass::rpc_suite!(rpc_rxe_server, skip_unless super::rxe_server);
bypass::rpc_suite!(rpc_vfio_server_lossy, skip_unless super::vfio_server_lossy);
bypass::rpc_suite!(rpc_rxe_server_lossy, skip_unless super::rxe_server_lossy);
