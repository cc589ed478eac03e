//! Fuzz target: backend strings (`bypass::Backend::open`, what `bypass-perf --backend` and the C
//! library's configuration hand it).
//!
//! The fuzz build has the simulator only (no verbs, no URMA: a made-up `urma:...,lib=<path>`
//! would dlopen whatever that path is), so the grammar is the simulator's rows of the table in
//! `stack/src/backend.rs`: `sim`, `sim:inline`, `sim:threaded`, each optionally followed by `+shm`
//! or `+udp://IPv4:PORT`. Besides "never panics": `open` succeeds exactly for those strings, says
//! why for every other one (a UDP address it refuses, it names), and describes what it opened
//! with the wire it was asked for.
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
    let (sim, wire) = match spec.split_once('+') {
        Some((s, w)) => (s, Some(w)),
        None => (spec, None),
    };
    if !matches!(sim, "sim" | "sim:inline" | "sim:threaded") {
        return None;
    }
    match wire {
        None => Some(WireConfig::InProcess),
        Some("shm") => Some(WireConfig::Shm),
        Some(w) => {
            let addr = w.strip_prefix("udp://")?.parse::<std::net::SocketAddrV4>().ok()?;
            Some(WireConfig::Udp(addr))
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(spec) = std::str::from_utf8(data) else { return };
    let want = expected(spec);
    if want == Some(WireConfig::Shm) {
        let wire = spec.split_once('+').map(|(_, w)| w).unwrap_or_default();
        assert_eq!(WireConfig::parse(wire), Ok(WireConfig::Shm));
        return;
    }
    match (Backend::open(spec), want) {
        (Ok(b), Some(wire)) => {
            let text = b.describe();
            match wire {
                WireConfig::Udp(at) => {
                    assert!(text.contains(&at.to_string()), "{spec:?} described as {text:?}")
                }
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
