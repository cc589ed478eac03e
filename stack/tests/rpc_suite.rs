//! The RPC conformance suite (`bypass::conformance`) on the simulator, Inline and Threaded
//! engines: a server NIC and a client NIC on one fabric. (The Stepped engine needs a test that
//! drives every step; `e2e.rs` covers it.)

use bypass::conformance::Env;
use bypass::sim::{Engine, Fabric, SimNic};
use std::time::Duration;

/// Two NICs on one fabric.
struct SimEnv {
    fabric: Fabric,
    server: SimNic,
    client: SimNic,
}

impl SimEnv {
    fn new(engine: Engine) -> Self {
        let fabric = Fabric::new(engine);
        let (server, client) = (fabric.add_nic(), fabric.add_nic());
        SimEnv { fabric, server, client }
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
}

bypass::rpc_suite!(inline, || super::SimEnv::new(bypass::sim::Engine::Inline));
bypass::rpc_suite!(threaded, || super::SimEnv::new(bypass::sim::Engine::Threaded));
