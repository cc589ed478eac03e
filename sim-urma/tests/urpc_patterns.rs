//! `c/urpc_patterns.c`, written only against `include/urma_api.h`, compiled with the system `cc`
//! and run on the built library: the URMA usage of UMDK's URPC framework and `urma_sample` beyond
//! the plain RC sequence (see the program's header comment for each scenario), in one process and
//! as two processes over the shared-memory and the UDP wire.

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

fn build(dir: &Path) -> PathBuf {
    build_c(dir, "urpc_patterns", &["urpc_patterns.c"])
}

fn one_process(what: &str) {
    one_process_on(what, "inproc,devices=2");
}

fn one_process_on(what: &str, wire: &str) {
    let dir = lib_dir(what);
    let exe = build(&dir);
    let child = with_lib(Command::new(&exe), &dir).arg(what).env("BYPASS_SIM_URMA", wire).spawn().unwrap();
    let out = wait_bounded(child, Duration::from_secs(60), what);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("all checks passed"),
        "{what}:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn jfr_state_machine_modify_jfc_user_ctl_and_log_hooks() {
    one_process("objects");
}

#[test]
fn the_priority_table_offers_rtp_the_way_urpc_reads_it() {
    one_process("priority");
}

#[test]
fn udp_eids_are_ipv4_mapped_so_urpc_finds_the_device() {
    one_process_on("eid", "udp://127.0.0.1:0");
}

/// Server and client of `scenario` on `wire` (the threaded engine: each process's device runs
/// while its user waits on TCP, as on hardware).
fn two_processes(scenario: &str, wire: &str, tag: &str) {
    let dir = lib_dir(&format!("{scenario}-{tag}"));
    let exe = build(&dir);
    let wire = format!("{wire},engine=threaded");
    server_and_client(&exe, &dir, &wire, &[scenario], &[scenario], scenario);
}

#[test]
fn rc_send_naming_another_target_goes_to_the_bound_one_shm() {
    two_processes("rc_tjetty", "shm", "shm");
}

#[test]
fn rc_send_naming_another_target_goes_to_the_bound_one_udp() {
    two_processes("rc_tjetty", "udp://127.0.0.1:0", "udp");
}

#[test]
fn two_jettys_on_one_jfr_posted_through_one_shm() {
    two_processes("shared_jfr", "shm", "shm");
}

#[test]
fn two_jettys_on_one_jfr_posted_through_one_udp() {
    two_processes("shared_jfr", "udp://127.0.0.1:0", "udp");
}

#[test]
fn rearm_with_a_record_already_queued_raises_the_event_shm() {
    two_processes("event_queued", "shm", "shm");
}

#[test]
fn rearm_with_a_record_already_queued_raises_the_event_udp() {
    two_processes("event_queued", "udp://127.0.0.1:0", "udp");
}

#[test]
fn urpc_err_timeout_is_raised_to_the_byte_wire_floor_shm() {
    two_processes("ack_floor", "shm", "shm");
}

#[test]
fn urpc_err_timeout_is_raised_to_the_byte_wire_floor_udp() {
    two_processes("ack_floor", "udp://127.0.0.1:0", "udp");
}

/// The client process is stopped (SIGSTOP) for 500 ms while the server's SEND is in flight:
/// longer than the ~134 ms that eight fixed ACK timeouts at the byte wires' floor allow. The
/// requester's timer backs off (each timeout without progress doubles the next wait) and the
/// SEND completes once the client runs again, instead of failing with an ACK timeout.
#[test]
fn a_peer_stopped_longer_than_the_retry_budget_is_waited_for_shm() {
    two_processes("peer_stall", "shm", "shm");
}

#[test]
fn a_peer_stopped_longer_than_the_retry_budget_is_waited_for_udp() {
    two_processes("peer_stall", "udp://127.0.0.1:0", "udp");
}
