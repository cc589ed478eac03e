//! The C programs of `sim-urma/c/`, written only against `include/urma_api.h`, compiled with the
//! system `cc` and run on the built library: the bad-input table in one process, and UMDK's RC
//! sequence as two processes over the shared-memory and the UDP wire.

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

fn build(dir: &Path) -> PathBuf {
    build_c(dir, "rc_sample", &["rc_sample.c", "badinput.c"])
}

#[test]
fn bad_input_table_from_c_gets_the_documented_errors() {
    let dir = lib_dir("bad");
    let exe = build(&dir);
    let child =
        with_lib(Command::new(&exe), &dir).arg("badinput").env("BYPASS_SIM_URMA", "inproc").spawn().unwrap();
    let out = wait_bounded(child, Duration::from_secs(60), "badinput");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "bad-input rows failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("97 of 97 rows as documented"), "{stdout}");
}

fn two_processes(wire: &str, tag: &str) {
    let dir = lib_dir(tag);
    let exe = build(&dir);
    server_and_client(&exe, &dir, wire, &[], &[], "the RC sequence");
}

#[test]
fn umdk_rc_sequence_runs_as_two_processes_on_the_shm_wire() {
    two_processes("shm", "shm");
}

#[test]
fn umdk_rc_sequence_runs_as_two_processes_on_the_udp_wire() {
    two_processes("udp://127.0.0.1:0", "udp");
}

#[test]
fn only_urma_symbols_are_exported_and_the_soname_is_liburma_so_0() {
    let lib = library();
    let out =
        Command::new("readelf").args(["--dyn-syms", "-d", "-W"]).arg(&lib).stdout(Stdio::piped()).output();
    let Ok(out) = out else {
        eprintln!("readelf not installed: skipping the symbol check");
        return;
    };
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Library soname: [liburma.so.0]"), "{text}");
    let exported: Vec<&str> = text
        .lines()
        .filter(|l| l.contains(" GLOBAL ") && l.contains(" DEFAULT ") && !l.contains(" UND "))
        .filter_map(|l| l.split_whitespace().last())
        .collect();
    assert!(exported.len() >= 49, "{exported:?}");
    assert!(exported.iter().all(|s| s.starts_with("urma_")), "{exported:?}");
}
