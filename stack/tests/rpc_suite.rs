//! The RPC conformance suite (`bypass::conformance`) on the simulator, Inline and Threaded
//! engines: a server NIC and a client NIC on one fabric. (The Stepped engine needs a test that
//! drives every step; `e2e.rs` covers it.) And the same on the UDP wire over loopback, and on the
//! L2 wire over an in-memory Ethernet cable, without and with loss (1 % of frames).

use bypass::conformance::Env;
use bypass::sim::{Engine, Fabric, FabricConfig, SimNic, WireConfig};
use std::time::Duration;

/// Two NICs on one fabric.
struct SimEnv {
    fabric: Fabric,
    server: SimNic,
    client: SimNic,
    /// See [`Env::ack_timeout`]: longer than the default, except on the lossy cable.
    ack_timeout: Option<bypass::hal::AckTimeout>,
}

/// The ACK timeout of the environments' queues: every engine here runs in real time, and a
/// device or test thread the host starves (CI at load 50 and more) must not exhaust the 8 tries
/// of the 134 ms default (about 1 s); at 537 ms (exponent 17) they last about 4 s. The lossy
/// cable keeps the default: its lost frames are repaired by the timer, and each repair would
/// cost four times as long.
fn real_time_ack_timeout() -> Option<bypass::hal::AckTimeout> {
    bypass::hal::AckTimeout::from_exponent(17)
}

impl SimEnv {
    fn new(engine: Engine) -> Self {
        Self::with_wire(engine, WireConfig::InProcess)
    }

    fn udp(engine: Engine) -> Self {
        Self::with_wire(engine, WireConfig::parse("udp://127.0.0.1:0").unwrap())
    }

    /// Two NICs on the L2 wire (Ethernet frames, ARP) joined by an in-memory cable that loses
    /// `loss_ppm` frames per million.
    fn l2(engine: Engine, loss_ppm: u32) -> Self {
        let cfg = bypass_sim::l2::pair::PairConfig { loss_ppm, seed: 29, ..Default::default() };
        let (ports, _) = bypass_sim::l2::pair::pair_attachments(cfg).unwrap();
        let fabric = Fabric::try_with_l2(FabricConfig::new(engine), ports).unwrap();
        let (server, client) = (fabric.add_nic(), fabric.add_nic());
        let ack_timeout = if loss_ppm == 0 { real_time_ack_timeout() } else { None };
        SimEnv { fabric, server, client, ack_timeout }
    }

    fn with_wire(engine: Engine, wire: WireConfig) -> Self {
        let fabric = Fabric::with_config(FabricConfig { wire, ..FabricConfig::new(engine) });
        let (server, client) = (fabric.add_nic(), fabric.add_nic());
        SimEnv { fabric, server, client, ack_timeout: real_time_ack_timeout() }
    }
}

impl Env for SimEnv {
    type Dev = SimNic;
    fn server(&self) -> &SimNic {
        &self.server
    }
    fn client(&self) -> &SimNic {
        &self.client
    }
    fn progress(&self) {
        match self.fabric.config().engine {
            // The test thread polls one CQ at a time; let every NIC of the fabric run.
            Engine::Inline => self.fabric.progress(),
            _ => std::thread::yield_now(),
        }
    }
    fn advance(&self, d: Duration) {
        std::thread::sleep(d);
    }
    fn ack_timeout(&self) -> Option<bypass::hal::AckTimeout> {
        self.ack_timeout
    }
}

bypass::rpc_suite!(inline, || super::SimEnv::new(bypass::sim::Engine::Inline));
bypass::rpc_suite!(threaded, || super::SimEnv::new(bypass::sim::Engine::Threaded));
bypass::rpc_suite!(udp_inline, || super::SimEnv::udp(bypass::sim::Engine::Inline));
bypass::rpc_suite!(udp_threaded, || super::SimEnv::udp(bypass::sim::Engine::Threaded));
bypass::rpc_suite!(l2_inline, || super::SimEnv::l2(bypass::sim::Engine::Inline, 0));
bypass::rpc_suite!(l2_threaded, || super::SimEnv::l2(bypass::sim::Engine::Threaded, 0));
bypass::rpc_suite!(l2_lossy_inline, || super::SimEnv::l2(bypass::sim::Engine::Inline, 10_000));
