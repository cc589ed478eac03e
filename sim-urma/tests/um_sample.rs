//! `c/um_sample.c`, written only against `include/urma_api.h`, compiled with the system `cc` and
//! run on the built library as two processes over the shared-memory and the UDP wire, in UM and in
//! RM mode: connectionless jettys (one jetty sending to two targets in one WR list, `wr->tjetty`
//! per send, WRITE and READ, receive records naming the sender, a reply to the sender), the
//! refusals around them (bind, no target, a target of the other mode) and, in RM, a SEND posted
//! before its target has a receive, which RM must deliver (UM drops it).

mod common;

use common::*;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

fn build(dir: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"));
    let exe = dir.join("um_sample");
    let out = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(["-std=gnu11", "-O1", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(src.join("include"))
        .arg(src.join("c/um_sample.c"))
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

fn two_processes(wire: &str, tag: &str, mode: &str) {
    let dir = lib_dir(tag);
    let exe = build(&dir);
    let mut server =
        with_lib(Command::new(&exe), &dir).args(["server", mode]).env("BYPASS_SIM_URMA", wire).spawn().unwrap();
    let mut line = String::new();
    let mut so = BufReader::new(server.stdout.take().unwrap());
    so.read_line(&mut line).unwrap();
    let port =
        line.trim().strip_prefix("PORT ").unwrap_or_else(|| panic!("server said {line:?}")).to_string();
    let client = with_lib(Command::new(&exe), &dir)
        .args(["client", &port, mode])
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
        "client on {wire} ({mode}):\n{cs}\n{}",
        String::from_utf8_lossy(&c.stderr)
    );
    assert!(
        s.status.success() && rest.contains("server: all checks passed"),
        "server on {wire} ({mode}):\n{rest}\n{}",
        String::from_utf8_lossy(&s.stderr)
    );
}

#[test]
fn um_jettys_send_to_two_targets_and_name_the_sender_on_the_shm_wire() {
    two_processes("shm,engine=threaded", "um-shm", "um");
}

#[test]
fn um_jettys_send_to_two_targets_and_name_the_sender_on_the_udp_wire() {
    two_processes("udp://127.0.0.1:0,engine=threaded", "um-udp", "um");
}

#[test]
fn rm_jettys_deliver_a_send_posted_before_its_receive_on_the_shm_wire() {
    two_processes("shm,engine=threaded", "rm-shm", "rm");
}

#[test]
fn rm_jettys_deliver_a_send_posted_before_its_receive_on_the_udp_wire() {
    two_processes("udp://127.0.0.1:0,engine=threaded", "rm-udp", "rm");
}
