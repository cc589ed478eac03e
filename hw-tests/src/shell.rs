//! Commands and bounded waits for the tests that build a network in the QEMU guest
//! (`tests/rxe_interop.rs`, `tests/vfio_suites.rs`).

use std::process::Command;
use std::time::{Duration, Instant};

/// Runs a setup command; panics with its output if it fails.
#[track_caller]
pub fn sh(args: &[&str]) {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {args:?}: {e} (iproute2 installed?)"));
    assert!(
        out.status.success(),
        "{args:?} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs a command whose failure does not matter (tearing down what may not exist).
pub fn sh_quiet(args: &[&str]) {
    let _ = Command::new(args[0]).args(&args[1..]).output();
}

/// Waits until `cond` holds, polling every few milliseconds; panics (naming `what`) after
/// `within`.
#[track_caller]
pub fn wait_until(what: &str, within: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}
