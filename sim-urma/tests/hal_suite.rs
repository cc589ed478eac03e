//! The hal conformance suite — the scenarios bypass-sim and verbs pass — on hal's `urma` backend,
//! which dlopens this crate's liburma: two contexts on `bypass_sim0`, like two hosts.

mod common;

use bypass_hal::urma::UrmaEnv;

fn spec() -> String {
    format!("bypass_sim0,lib={}", common::library().display())
}

fn env(_scenario: &str) -> Option<UrmaEnv> {
    Some(UrmaEnv::open(&spec()).unwrap_or_else(|e| panic!("the simulated liburma ({}): {e}", spec())))
}

bypass_hal::conformance_suite!(urma_over_sim_urma, skip_unless env);
