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
    let src = Path::new(env!("CARGO_MANIFEST_DIR"));
    let exe = dir.join("urpc_patterns");
    let out = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(["-std=gnu11", "-O1", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(src.join("include"))
        .arg(src.join("c/urpc_patterns.c"))
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

fn one_process(what: &str) {
    let dir = lib_dir(what);
    let exe = build(&dir);
    let child = with_lib(Command::new(&exe), &dir)
        .arg(what)
        .env("BYPASS_SIM_URMA", "inproc,devices=2")
        .spawn()
        .unwrap();
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
