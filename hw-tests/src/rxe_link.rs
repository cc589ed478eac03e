//! A Soft-RoCE link on a kernel netdev, for the tests that put rxe on a wire of their own
//! (`tests/rxe_interop.rs`, `tests/vfio_suites.rs`): who may build one, and bringing it up.

use crate::shell::{sh, wait_until};
use std::net::Ipv4Addr;
use std::time::Duration;

/// Whether this run may build networks: `BYPASS_HW` names a Soft-RoCE device (`verbs:rxe…`) and
/// the process is root (the QEMU guest). `None` after printing why `test` skips.
pub fn should_run(test: &str) -> Option<()> {
    let spec = crate::verbs::requested_spec(test)?;
    if !spec.starts_with("rxe") {
        crate::skip(test, &format!("BYPASS_HW=verbs:{spec} is no Soft-RoCE device (verbs:rxe0)"));
        return None;
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        crate::skip(test, "needs root to build a network (run it in hw-tests/vm/run)");
        return None;
    }
    Some(())
}

/// `rdma link add <name> type rxe netdev <netdev>`, then waits (bounded by `within`) for port 1
/// to be ACTIVE and for the RoCE v2 GID of `ip` (`::ffff:<ip>`), which the device picks at open.
pub fn add(name: &str, netdev: &str, ip: Ipv4Addr, within: Duration) {
    sh(&["rdma", "link", "add", name, "type", "rxe", "netdev", netdev]);
    let port = format!("/sys/class/infiniband/{name}/ports/1");
    wait_until(&format!("{name} port 1 ACTIVE"), within, || {
        std::fs::read_to_string(format!("{port}/state")).is_ok_and(|s| s.contains("ACTIVE"))
    });
    let o = ip.octets();
    let gid = format!("0000:0000:0000:0000:0000:ffff:{:02x}{:02x}:{:02x}{:02x}", o[0], o[1], o[2], o[3]);
    wait_until(&format!("{name}'s GID ::ffff:{ip}"), within, || {
        (0..16).any(|i| std::fs::read_to_string(format!("{port}/gids/{i}")).is_ok_and(|g| g.trim() == gid))
    });
}

/// What rxe `name` counted that is not zero, as `counter=value` words (for a failure's report).
pub fn nonzero_counters(name: &str) -> String {
    let dir = format!("/sys/class/infiniband/{name}/ports/1/hw_counters");
    let mut counters: Vec<String> = std::fs::read_dir(&dir)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter_map(|e| {
            let v = std::fs::read_to_string(e.path()).ok()?;
            let v = v.trim();
            (v != "0").then(|| format!("{}={v}", e.file_name().to_string_lossy()))
        })
        .collect();
    counters.sort();
    counters.join(" ")
}
