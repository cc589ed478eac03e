//! The hal conformance suite on the simulator, in all three engine modes, and on the UDP wire
//! (loopback), the shared-memory wire and the L2 wire (an in-memory Ethernet pair) with the Inline
//! and Threaded engines.

use bypass_hal::conformance::Env;
use bypass_sim::{Engine, Fabric, FabricConfig, SimNic, WireConfig};
use std::time::Duration;

/// Two NICs on one fabric.
struct SimEnv {
    fabric: Fabric,
    a: SimNic,
    b: SimNic,
}

impl SimEnv {
    fn new(engine: Engine) -> Self {
        Self::with_wire(engine, WireConfig::InProcess)
    }

    fn with_wire(engine: Engine, wire: WireConfig) -> Self {
        let fabric = Fabric::with_config(FabricConfig { wire, ..FabricConfig::new(engine) });
        let (a, b) = (fabric.add_nic(), fabric.add_nic());
        SimEnv { fabric, a, b }
    }

    /// Two NICs on the UDP wire, on loopback ports the system picks.
    fn udp(engine: Engine) -> Self {
        Self::with_wire(engine, WireConfig::parse("udp://127.0.0.1:0").unwrap())
    }

    /// Two NICs on the L2 wire, the two ends of an in-memory cable (Ethernet, IPv4, UDP, ARP).
    fn l2(engine: Engine) -> Self {
        let (ports, _) = bypass_sim::l2::pair::pair_attachments(Default::default()).unwrap();
        let fabric = Fabric::try_with_l2(FabricConfig::new(engine), ports).unwrap();
        let (a, b) = (fabric.add_nic(), fabric.add_nic());
        SimEnv { fabric, a, b }
    }

    /// Two NICs on the shared-memory wire (two segments of this process).
    fn shm(engine: Engine) -> Self {
        Self::with_wire(engine, WireConfig::Shm)
    }
}

impl Env for SimEnv {
    type Dev = SimNic;
    fn a(&self) -> &SimNic {
        &self.a
    }
    fn b(&self) -> &SimNic {
        &self.b
    }
    fn progress(&self) {
        match self.fabric.config().engine {
            Engine::Stepped { .. } => {
                self.fabric.run_until_idle();
            }
            // One test thread drives both NICs of an Inline fabric but polls one CQ at a time.
            Engine::Inline => self.fabric.progress(),
            Engine::Threaded => std::thread::yield_now(),
        }
    }
    fn advance(&self, d: Duration) {
        match self.fabric.config().engine {
            Engine::Stepped { .. } => {
                self.fabric.advance(d);
                self.fabric.run_until_idle();
            }
            // Real-time engines: let real time pass so the device's timers can fall due.
            _ => std::thread::sleep(d),
        }
    }
    /// The simulated CQ arms against its consumer index, as mlx5 and UDMA do.
    fn arm_signals_queued_completions(&self) -> bool {
        true
    }
    /// Real-time engines: a device or test thread the host starves (CI at load 50 and more)
    /// must not exhaust the 8 tries of a 134 ms default timeout (about 1 s); at 537 ms they last
    /// about 4 s. Virtual time (Stepped) starves nobody.
    fn ack_timeout(&self) -> Option<bypass_hal::AckTimeout> {
        match self.fabric.config().engine {
            Engine::Stepped { .. } => None,
            Engine::Inline | Engine::Threaded => Some(REAL_TIME_ACK_TIMEOUT),
        }
    }
}

/// The ACK timeout of the real-time environments' queues (exponent 17: 537 ms).
const REAL_TIME_ACK_TIMEOUT: bypass_hal::AckTimeout = match bypass_hal::AckTimeout::from_exponent(17) {
    Some(t) => t,
    None => panic!("exponent 17 is a valid ACK timeout"),
};

bypass_hal::conformance_suite!(inline, || super::SimEnv::new(bypass_sim::Engine::Inline));
bypass_hal::conformance_suite!(threaded, || super::SimEnv::new(bypass_sim::Engine::Threaded));
bypass_hal::conformance_suite!(stepped, || super::SimEnv::new(bypass_sim::Engine::Stepped { seed: 1 }));
bypass_hal::conformance_suite!(stepped_seed_2, || super::SimEnv::new(bypass_sim::Engine::Stepped {
    seed: 0xdecaf
}));
bypass_hal::conformance_suite!(udp_inline, || super::SimEnv::udp(bypass_sim::Engine::Inline));
bypass_hal::conformance_suite!(udp_threaded, || super::SimEnv::udp(bypass_sim::Engine::Threaded));
bypass_hal::conformance_suite!(l2_inline, || super::SimEnv::l2(bypass_sim::Engine::Inline));
bypass_hal::conformance_suite!(l2_threaded, || super::SimEnv::l2(bypass_sim::Engine::Threaded));
bypass_hal::conformance_suite!(shm_inline, || super::SimEnv::shm(bypass_sim::Engine::Inline));
bypass_hal::conformance_suite!(shm_threaded, || super::SimEnv::shm(bypass_sim::Engine::Threaded));
