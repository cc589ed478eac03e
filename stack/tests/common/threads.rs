//! This process's threads by name, and a bounded wait that prints them when it gives up: for the
//! binaries that count the control loop's threads (`bypass-ctl`). Such a binary holds one test
//! function, since the thread list is the whole process's. Include with
//! `#[path = "common/threads.rs"] mod threads;`.
#![allow(dead_code)]

use bypass::sim::Fabric;
use std::time::{Duration, Instant};

/// Longest one wait may take: thread starts and ends on a loaded two-core machine.
pub const WAIT_LIMIT: Duration = Duration::from_secs(60);

/// The names of this process's threads (`/proc/self/task/*/comm`), sorted.
pub fn thread_names() -> Vec<String> {
    let mut names = Vec::new();
    for t in std::fs::read_dir("/proc/self/task").expect("/proc/self/task").flatten() {
        if let Ok(n) = std::fs::read_to_string(t.path().join("comm")) {
            names.push(n.trim().to_owned());
        }
    }
    names.sort();
    names
}

/// How many of `names` start with `prefix`.
pub fn count(names: &[String], prefix: &str) -> usize {
    names.iter().filter(|n| n.starts_with(prefix)).count()
}

/// Drives `fabric` until `cond` holds; fails the test, naming `what` and listing the threads,
/// after [`WAIT_LIMIT`].
pub fn until(what: &str, fabric: &Fabric, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < WAIT_LIMIT, "gave up waiting for {what}; threads: {:?}", thread_names());
        fabric.progress();
        std::thread::sleep(Duration::from_millis(2));
    }
}
