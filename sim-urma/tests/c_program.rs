//! The C programs of `sim-urma/c/`, written only against `include/urma_api.h`, compiled with the
//! system `cc` and run on the built library: the bad-input table in one process, and UMDK's RC
//! sequence as two processes over the shared-memory and the UDP wire.

mod common;

use common::*;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

fn build(dir: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"));
    let exe = dir.join("rc_sample");
    let out = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(["-std=gnu11", "-O1", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(src.join("include"))
        .arg(src.join("c/rc_sample.c"))
        .arg(src.join("c/badinput.c"))
        .arg("-L")
        .arg(dir)
        .arg("-lurma")
        .arg("-o")
        .arg(&exe)
        .output()
        .expect("run cc (the system C compiler)");
    assert!(out.status.success(), "cc failed:\n{}", String::from_utf8_lossy(&out.stderr));
    exe
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
    let mut server =
        with_lib(Command::new(&exe), &dir).arg("server").env("BYPASS_SIM_URMA", wire).spawn().unwrap();
    let mut line = String::new();
    let mut so = BufReader::new(server.stdout.take().unwrap());
    so.read_line(&mut line).unwrap();
    let port =
        line.trim().strip_prefix("PORT ").unwrap_or_else(|| panic!("server said {line:?}")).to_string();
    let client = with_lib(Command::new(&exe), &dir)
        .args(["client", &port])
        .env("BYPASS_SIM_URMA", wire)
        .spawn()
        .unwrap();
    let c = wait_bounded(client, Duration::from_secs(60), "the client");
    let mut rest = String::new();
    server.stdout = None;
    let s = wait_bounded(server, Duration::from_secs(30), "the server");
    so.read_to_string(&mut rest).unwrap();
    let cs = String::from_utf8_lossy(&c.stdout);
    assert!(
        c.status.success() && cs.contains("client: all checks passed"),
        "client on {wire}:\n{cs}\n{}",
        String::from_utf8_lossy(&c.stderr)
    );
    assert!(
        s.status.success() && rest.contains("server: all checks passed"),
        "server on {wire}:\n{rest}\n{}",
        String::from_utf8_lossy(&s.stderr)
    );
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
