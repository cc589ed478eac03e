//! Running tshark (Wireshark's command-line dissector) on a capture, for the tests that check
//! the sim's RoCEv2 frames against an independent decoder. Skipped, with a message, where tshark
//! is not installed (Debian package `tshark`).

use std::path::Path;
use std::process::Command;

/// True if `tshark` runs; otherwise says that the Wireshark check is skipped.
pub fn available(test: &str) -> bool {
    match Command::new("tshark").arg("--version").output() {
        Ok(o) if o.status.success() => true,
        _ => {
            eprintln!(
                "{test}: tshark is not on PATH (Debian package `tshark`): skipping the Wireshark check"
            );
            false
        }
    }
}

/// The options every run uses: RoCEv2 on UDP 4791 (Wireshark's default, made explicit), IPv4
/// and UDP checksum validation on, and the RPC-over-RDMA heuristic off (it claims small SEND
/// payloads and flags them as malformed RPCoRDMA).
fn base(file: &Path) -> Command {
    let mut c = Command::new("tshark");
    c.arg("-r").arg(file).args([
        "-n",
        "--disable-heuristic",
        "rpcrdma_infiniband",
        "-o",
        "infiniband.rroce.port:4791",
        "-o",
        "ip.check_checksum:TRUE",
        "-o",
        "udp.check_checksum:TRUE",
    ]);
    c
}

fn run(mut c: Command) -> String {
    let out = c.output().expect("run tshark");
    assert!(out.status.success(), "tshark failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("tshark prints UTF-8")
}

/// `tshark -V`: the full dissection as text.
pub fn verbose(file: &Path) -> String {
    let mut c = base(file);
    c.arg("-V");
    run(c)
}

/// `tshark -T fields`: one row per frame with the given fields (empty where absent).
pub fn fields(file: &Path, names: &[&str]) -> Vec<Vec<String>> {
    let mut c = base(file);
    c.args(["-T", "fields", "-E", "separator=|", "-E", "occurrence=f"]);
    for n in names {
        c.args(["-e", n]);
    }
    run(c).lines().map(|l| l.split('|').map(str::to_string).collect()).collect()
}

/// A number as tshark prints it: decimal, or hex with 0x.
pub fn num(s: &str) -> Option<u64> {
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

/// Checks the verbose dissection of `frames` frames: no malformed packet, no error or warning
/// from the expert system, every IPv4 header checksum validated good.
pub fn assert_clean(text: &str, frames: usize) {
    let lines: Vec<&str> = text.lines().collect();
    for bad in
        ["Malformed", "Expert Info (Error", "Expert Info (Warning", "Bad checksum", "[Packet size limited"]
    {
        if let Some(i) = lines.iter().position(|l| l.contains(bad)) {
            panic!(
                "tshark reports {bad:?}:\n{}",
                lines[i.saturating_sub(60)..(i + 5).min(lines.len())].join("\n")
            );
        }
    }
    assert_eq!(
        text.matches("[Header checksum status: Good]").count(),
        frames,
        "IPv4 checksums validated good"
    );
    assert_eq!(
        lines.iter().filter(|l| **l == "InfiniBand").count(),
        frames,
        "every frame dissected as InfiniBand"
    );
}
