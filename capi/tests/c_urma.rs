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

use c_harness::{compile, Run};
use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// sim-urma's `liburma.so`, built by cargo with these tests (a dev-dependency): next to the
/// library, in `target/<profile>/deps/`, or in `target/<profile>/`.
fn sim_liburma() -> PathBuf {
    let profile = c_harness::profile_dir();
    [profile.join("deps/liburma.so"), profile.join("liburma.so")]
        .into_iter()
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("sim-urma's liburma.so is in neither {0}/deps nor {0}", profile.display()))
}

/// The environment of a program on sim-urma: `wire` is `BYPASS_SIM_URMA` (None: in-process).
fn urma_env(wire: Option<&str>, extra: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut env = vec![
        ("BYPASS_URMA_LIB".to_string(), sim_liburma().display().to_string()),
        ("BYPASS_CAPI_LOG_LEVEL".to_string(), "2".to_string()),
    ];
    if let Some(w) = wire {
        env.push(("BYPASS_SIM_URMA".into(), w.into()));
    }
    env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    env
}

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

/// proc.c's two processes with `env`: the server prints its port and serves until its stdin
/// closes, the client calls, sends 100 one-way messages, calls with an iovec.
fn proc_pair(env: &[(String, String)]) {
    let exe = compile("proc.c");
    let base = 31000 + (std::process::id() % 9000);
    let range = format!("{base}-{}", base + 200);
    let mut server = c_harness::command(&exe)
        .args(["server", &range])
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the server process");
    let mut stderr = server.stderr.take().unwrap();
    let err_t = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let stdout = server.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut r = BufReader::new(stdout);
        let mut line = String::new();
        while r.read_line(&mut line).map(|n| n > 0).unwrap_or(false) {
            if let Some(p) = line.trim().strip_prefix("PORT ") {
                let _ = tx.send(p.to_string());
                break;
            }
            line.clear();
        }
        let mut rest = String::new();
        let _ = r.read_to_string(&mut rest);
        let _ = tx.send(rest);
    });
    let port = match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(p) => p,
        Err(e) => {
            let _ = server.kill();
            let _ = server.wait();
            panic!(
                "the server process printed no port within 60 s ({e}):\n{}",
                err_t.join().unwrap_or_default()
            );
        }
    };
    let client =
        c_harness::run(&exe, &["client", &port], Run { env: env.to_vec(), timeout: Duration::from_secs(90) });
    drop(server.stdin.take()); // the server exits when its stdin closes
    let deadline = Instant::now() + Duration::from_secs(30);
    while server.try_wait().unwrap().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    if server.try_wait().unwrap().is_none() {
        let _ = server.kill();
    }
    let status = server.wait().unwrap();
    let server_err = err_t.join().unwrap_or_default();
    client.expect_ok("proc client");
    assert!(client.stdout.contains("client ok"), "{}", client.stdout);
    assert!(status.success(), "the server process failed: {status}\n{server_err}");
    let rest = rx.recv_timeout(Duration::from_secs(10)).unwrap_or_default();
    assert!(rest.contains("COUNT 100"), "the server got every one-way message: {rest}");
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
    let mut server = c_harness::spawn(&exe, &["server"], &how);
    let stdout = server.stdout.take().expect("piped stdout");
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        let mut rest = String::new();
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.starts_with("port ") {
                let _ = tx.send(line.clone());
            }
            rest.push_str(&line);
            rest.push('\n');
        }
        rest
    });
    let port = match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(line) => line["port ".len()..].trim().to_string(),
        Err(_) => {
            let out = c_harness::finish(server, Duration::from_secs(1));
            panic!(
                "the server printed no port within 60 s:\n{}\n{}",
                reader.join().unwrap_or_default(),
                out.stderr
            );
        }
    };
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
