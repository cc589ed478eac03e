//! The hal conformance suite — the scenarios bypass-sim and verbs pass — on hal's `urma` backend,
//! which dlopens this crate's liburma: two contexts on `bypass_sim0`, like two hosts.

mod common;

use bypass_hal::urma::UrmaEnv;

fn spec() -> String {
    format!("bypass_sim0,lib={}", common::library().display())
}

fn env(scenario: &str) -> Option<UrmaEnv> {
    if scenario == "shared_recv_slots_come_back_from_a_destroyed_queue" {
        // Known gap (docs/urma.md, "Shared JFR"): the simulated NIC fences a deleted jetty's
        // records, as mlx5 purges a destroyed QP's completions, so the backend never sees the
        // receives that jetty took and their JFR slots stay busy. The backend frees them when a
        // record does arrive (as on rxe); a fix for the purging case needs the slot accounting
        // to stop depending on records.
        eprintln!("{scenario}: skipped on urma over sim-urma (known gap, see docs/urma.md)");
        return None;
    }
    Some(UrmaEnv::open(&spec()).unwrap_or_else(|e| panic!("the simulated liburma ({}): {e}", spec())))
}

bypass_hal::conformance_suite!(urma_over_sim_urma, skip_unless env);
