//! Fuzz target: backend strings (`bypass::Backend::open`, what `bypass-perf --backend` and the C
//! library's configuration hand it).
//!
//! The fuzz build has the simulator only (no verbs, no URMA: a made-up `urma:...,lib=<path>`
//! would dlopen whatever that path is), so the grammar is the simulator's rows of the table in
//! `stack/src/backend.rs`: `sim`, `sim:inline`, `sim:threaded`, each optionally followed by `+shm`,
//! `+udp://IPv4:PORT` or `+l2:pair` (with an optional `,loss_ppm=N`, N below a million); after
//! a wire's name, any number of `,ack_timeout_backoff=V` (V `off`, `0` or a `u8` in 1..=31) may
//! stand among its options. Besides
//! "never panics": `open` succeeds exactly for those strings, says why for every other one (a UDP
//! address it refuses, it names), and describes what it opened with the wire it was asked for.
//!
//! `+packet://IFNAME` is a backend string too but is never opened here: it opens a raw socket on
//! a real interface of the host, not something a fuzz loop may do.
//!
//! A valid `+shm` string is checked through `WireConfig::parse` and not opened: opening a
//! shared-memory fabric scans `/dev/shm` for stale segments, too slow for a fuzz loop (opening
//! creates no segment; adding a NIC does, which this target never does).
#![no_main]

use bypass::sim::WireConfig;
use bypass::Backend;
use libfuzzer_sys::fuzz_target;

/// What the documented grammar says about `spec`: `None` if it is not a backend string of this
/// build, else its wire.
fn expected(spec: &str) -> Option<WireConfig> {
    let (head, wire) = match spec.split_once('+') {
        Some((h, w)) => (h, Some(w)),
        None => (spec, None),
    };
    let (sim, options) = match head.split_once(',') {
        Some((s, o)) => (s, Some(o)),
        None => (head, None),
    };
    if !matches!(sim, "sim" | "sim:inline" | "sim:threaded") {
        return None;
    }
    let Some(wire) = wire else {
        // The in-process wire takes `ack_hold=` only, and only where something holds ACKs: the
        // Inline engine.
        let Some(options) = options else { return Some(WireConfig::InProcess) };
        let all_holds = options.split(',').all(|o| o.strip_prefix("ack_hold=").is_some_and(ack_hold));
        return (all_holds && sim != "sim:threaded").then_some(WireConfig::InProcess);
    };
    if options.is_some() {
        return None;
    }
    let wire = without_wire_options(wire)?;
    match wire.as_str() {
        "shm" => Some(WireConfig::Shm),
        w if w.starts_with("l2:") => l2_pair(&w["l2:".len()..]),
        w => {
            let addr = w.strip_prefix("udp://")?.parse::<std::net::SocketAddrV4>().ok()?;
            Some(WireConfig::Udp(addr))
        }
    }
}

/// Whether `v` is a value `ack_hold=` takes: `off`, `0` or whole microseconds in 1..=1000.
fn ack_hold(v: &str) -> bool {
    matches!(v, "off" | "0") || v.parse::<u64>().is_ok_and(|us| (1..=1000).contains(&us))
}

/// `wire` without the options every wire takes after its name (`ack_timeout_backoff=`, and
/// `ack_hold=` on the UDP wire), or `None` if one of them has a value the grammar refuses or
/// stands where it means nothing.
fn without_wire_options(wire: &str) -> Option<String> {
    let Some((name, options)) = wire.split_once(',') else { return Some(wire.to_string()) };
    let mut kept = vec![name];
    for opt in options.split(',') {
        if let Some(v) = opt.strip_prefix("ack_timeout_backoff=") {
            if !(matches!(v, "off" | "0") || v.parse::<u8>().is_ok_and(|n| (1..=31).contains(&n))) {
                return None;
            }
        } else if let Some(v) = opt.strip_prefix("ack_hold=") {
            if !(ack_hold(v) && name.starts_with("udp://")) {
                return None;
            }
        } else {
            kept.push(opt);
        }
    }
    Some(kept.join(","))
}

/// `pair` followed by any number of `,loss_ppm=N` (the last one counts), N a `u32` below a
/// million: the in-memory cable's grammar (`bypass_sim::l2`).
fn l2_pair(rest: &str) -> Option<WireConfig> {
    let mut opts = rest.split(',');
    if opts.next() != Some("pair") {
        return None;
    }
    for opt in opts {
        let ppm = opt.strip_prefix("loss_ppm=")?.parse::<u32>().ok()?;
        if ppm >= 1_000_000 {
            return None;
        }
    }
    Some(WireConfig::L2)
}

fuzz_target!(|data: &[u8]| {
    let Ok(spec) = std::str::from_utf8(data) else { return };
    if spec.split_once('+').is_some_and(|(_, w)| w.starts_with("packet://")) {
        return;
    }
    let want = expected(spec);
    if want == Some(WireConfig::Shm) {
        let wire = spec.split_once('+').map(|(_, w)| w).unwrap_or_default();
        assert_eq!(without_wire_options(wire).as_deref().map(WireConfig::parse), Some(Ok(WireConfig::Shm)));
        return;
    }
    match (Backend::open(spec), want) {
        (Ok(b), Some(wire)) => {
            let text = b.describe();
            match wire {
                WireConfig::Udp(at) => {
                    assert!(text.contains(&at.to_string()), "{spec:?} described as {text:?}")
                }
                WireConfig::L2 => assert!(text.contains("L2 wire"), "{spec:?} described as {text:?}"),
                _ => assert!(text.contains("in this process"), "{spec:?} described as {text:?}"),
            }
        }
        (Err(e), None) => {
            let text = e.to_string();
            assert!(!text.is_empty());
        }
        // Opening may check the address (one the host does not own cannot carry traffic); a
        // refusal must then name it.
        (Err(e), Some(WireConfig::Udp(at))) => {
            let text = e.to_string();
            assert!(
                text.contains(&at.ip().to_string()),
                "{spec:?} refused without naming its address: {text}"
            );
        }
        (Ok(b), None) => panic!("{spec:?} is not a backend string, yet it opened {}", b.describe()),
        (Err(e), Some(_)) => panic!("{spec:?} is a backend string, yet it was refused: {e}"),
    }
});
