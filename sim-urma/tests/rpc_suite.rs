//! The RPC conformance suite (`bypass::rpc_suite!`, what the stack passes on sim and verbs) on
//! the `urma` backend over this crate's liburma: server and client on two contexts of
//! `bypass_sim0`.

mod common;

use bypass_hal::urma::UrmaDevice;
use std::time::Duration;

struct UrmaSimEnv {
    server: UrmaDevice,
    client: UrmaDevice,
}

impl UrmaSimEnv {
    fn open(_scenario: &str) -> Option<Self> {
        let spec = format!("bypass_sim0,lib={}", common::library().display());
        let open =
            || UrmaDevice::open_spec(&spec).unwrap_or_else(|e| panic!("the simulated liburma ({spec}): {e}"));
        Some(UrmaSimEnv { server: open(), client: open() })
    }
}

impl bypass::conformance::Env for UrmaSimEnv {
    type Dev = UrmaDevice;
    fn server(&self) -> &UrmaDevice {
        &self.server
    }
    fn client(&self) -> &UrmaDevice {
        &self.client
    }
    fn progress(&self) {}
    fn advance(&self, d: Duration) {
        std::thread::sleep(d);
    }
}

bypass::rpc_suite!(urma_over_sim_urma, skip_unless UrmaSimEnv::open);
