//! The C API on the URMA backend (feature `urma`): the C programs of `tests/c/` over the "UBC"
//! type, with sim-urma's `liburma.so` (the URMA C API on the simulated NIC) as the liburma the
//! library loads (`BYPASS_URMA_LIB`).
//!
//! - in one process (`BYPASS_SIM_URMA` unset: the in-process wire), every server and client
//!   function (basic.c) and one-sided READ/WRITE (onesided_local.c), moved to URMA by
//!   `BYPASS_BACKEND=urma:bypass_sim0,lib=...`;
//! - between two processes, the servers asking for "UBC" (`CAPI_COMM_TYPE=UBC`): RPC and one-way
//!   sends (proc.c) on the shared-memory and the UDP wires, one-sided I/O (onesided_procs.c) on
//!   shared memory;
//! - without a liburma, "UBC" fails with RDMA_NOT_ENABLE and a log line naming BYPASS_URMA_LIB.

#![cfg(feature = "urma")]

mod c_harness;

use c_harness::{compile, sim_liburma, urma_env, Run};
use std::time::Duration;

/// `BYPASS_BACKEND` putting every server of a process on sim-urma's first device.
fn urma_backend() -> String {
    format!("urma:bypass_sim0,lib={}", sim_liburma().display())
}

#[test]
fn every_function_in_one_process_on_urma() {
    let exe = compile("basic.c");
    let backend = urma_backend();
    let env = urma_env(None, &[("BYPASS_BACKEND", &backend), ("BYPASS_CAPI_LOG_LEVEL", "1")]);
    let out = c_harness::run(&exe, &[], Run { env, ..Run::default() });
    out.expect_ok("basic.c on urma");
    assert!(out.stdout.contains("basic ok"), "{}", out.stdout);
    // The servers really ran on the URMA backend, through sim-urma's library (the default log
    // sink is stdout).
    assert!(out.stdout.contains("server device: urma bypass_sim0"), "{}", out.stdout);
}

#[test]
fn one_sided_read_and_write_in_one_process_on_urma() {
    let exe = compile("onesided_local.c");
    let backend = urma_backend();
    let env = urma_env(None, &[("BYPASS_BACKEND", &backend)]);
    c_harness::run(&exe, &[], Run { env, ..Run::default() }).expect_ok("onesided_local.c on urma");
}

/// proc.c's two processes with `env` (see [`c_harness::proc_pair`]).
fn proc_pair(env: &[(String, String)]) {
    c_harness::proc_pair(&compile("proc.c"), env);
}

#[test]
fn two_processes_talk_over_the_ubc_type_on_shared_memory() {
    proc_pair(&urma_env(Some("shm"), &[("CAPI_COMM_TYPE", "UBC")]));
}

#[test]
fn two_processes_talk_over_the_ubc_type_on_udp() {
    proc_pair(&urma_env(Some("udp://127.0.0.1:0"), &[("CAPI_COMM_TYPE", "UBC")]));
}

#[test]
fn one_sided_between_two_processes_over_the_ubc_type() {
    let exe = compile("onesided_procs.c");
    let env = urma_env(Some("shm"), &[("CAPI_COMM_TYPE", "UBC")]);
    let how = Run { env, ..Run::default() };
    let served = c_harness::serve(c_harness::spawn(&exe, &["server"], &how), "port ");
    let (server, port, reader) = (served.child, served.value, served.stdout);
    let client = c_harness::run(&exe, &["client", &port], how.clone());
    let out = c_harness::finish(server, how.timeout);
    let server_stdout = reader.join().unwrap_or_default();
    client.expect_ok("onesided_procs client over UBC");
    assert!(
        out.code == Some(0) && server_stdout.contains("server: ok"),
        "onesided_procs server failed (exit {:?}):\n--- stdout\n{server_stdout}\n--- stderr\n{}",
        out.code,
        out.stderr
    );
}

#[test]
fn ubc_without_a_liburma_says_what_to_set() {
    // proc.c's server, asking for UBC with a liburma path that does not exist: the create fails
    // (the program's CHECK exits non-zero) and the log line says what to install or set.
    let exe = compile("proc.c");
    let env = vec![
        ("BYPASS_URMA_LIB".to_string(), "/nonexistent/liburma.so.0".to_string()),
        ("CAPI_COMM_TYPE".to_string(), "UBC".to_string()),
        ("BYPASS_CAPI_LOG_LEVEL".to_string(), "1".to_string()),
    ];
    let out = c_harness::run(&exe, &["server", "41000-41100"], Run { env, timeout: Duration::from_secs(60) });
    assert_ne!(out.code, Some(0), "the server must not start: {}", out.stdout);
    let text = format!("{}{}", out.stdout, out.stderr);
    // CHECK_EQ's line: "OckRpcServerCreateWithCfg(...) == -8, expected OCK_RPC_OK == 0".
    assert!(text.contains("OckRpcServerCreateWithCfg") && text.contains("== -8,"), "RDMA_NOT_ENABLE: {text}");
    assert!(
        text.contains("BYPASS_URMA_LIB") && text.contains("urma"),
        "the log line names what to set: {text}"
    );
}
