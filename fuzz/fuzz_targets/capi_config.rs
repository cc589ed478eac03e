//! Fuzz target: the C library's configuration parser (`hcom4db::config::parse`, what
//! `OckRpcServerCreateWithCfg` and `OckRpcClientConnectWithCfg` call on the caller's
//! `OckRpcCreateConfig`).
//!
//! Besides "never panics", two properties a caller relies on:
//! - the last value of a key wins: dropping every pair a later pair of the same key overrides
//!   changes nothing (an accepted configuration stays accepted, with the same settings);
//! - accepted settings are what they say: written back as a configuration (the canonical form of
//!   each key), they parse to the same settings.
//!
//! Input: byte 0 chooses the mask (key/value pairs on unless bits 0-1 are both 0; the TLS
//! callback bit from bit 2, and the three callbacks present from bit 3) and the role (bit 4: a
//! client's connect, else a server's create; each reads its own keys). The rest is lines; a
//! line's first byte picks one of the library's keys (or, past the list, the line is `key=value`
//! with a made-up key), the rest of the line is the value. Strings are NUL-terminated as the C
//! contract requires; a NUL inside a value ends it, as it would in C.
#![no_main]

use hcom4db::config::{parse, Role, Settings};
use hcom4db::types::*;
use libfuzzer_sys::fuzz_target;
use std::ffi::{c_char, c_int};

const KEYS: &[&str] = &[
    "server.create.name",
    "server.create.range",
    "server.create.type",
    "server.create.segsize",
    "server.create.segcount",
    "worker.thread.groups",
    "worker.thread.cpuset",
    "worker.poll.enable",
    "server.rndv.enable",
    "server.heartbeat.idle",
    "server.tls.enable",
    "client.create.info",
    "client.enable.selfpolling",
    "server.client.new",
    "server.client.break",
    "server.rndv.malloc",
    "server.rndv.mfree",
];

unsafe extern "C" fn on_client(_: Handle, _: u64, _: *const c_char) -> c_int {
    0
}
unsafe extern "C" fn rndv_alloc(_: u64, _: *mut usize, _: *mut u32) -> c_int {
    0
}
unsafe extern "C" fn rndv_free(_: usize) -> c_int {
    0
}
unsafe extern "C" fn get_ca(_: *mut *const c_char, _: *mut *const c_char, _: *mut OckRpcTlsCertVerify) {}
unsafe extern "C" fn get_cert(_: *mut *const c_char) {}
unsafe extern "C" fn get_key(_: *mut *const c_char, _: *mut *mut c_char, _: *mut OckRpcTlsKeypassErase) {}
unsafe extern "C" fn quiet(_: c_int, _: *const c_char) {}

/// One key/value pair as C sees it: NUL-terminated bytes, or a function's address.
#[derive(Clone)]
enum Value {
    Text(Vec<u8>),
    Pointer(*const c_char),
}

#[derive(Clone)]
struct Pair {
    key: Vec<u8>,
    value: Value,
}

fn c_bytes(b: &[u8]) -> Vec<u8> {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    let mut v = b[..end].to_vec();
    v.push(0);
    v
}

fn is_function_key(key: &str) -> bool {
    key.starts_with("server.client.") || key.starts_with("server.rndv.m")
}

fn function_value(key: &str, pick: u8) -> *const c_char {
    if pick & 1 == 0 {
        return std::ptr::null();
    }
    match key {
        "server.client.new" | "server.client.break" => on_client as *const c_char,
        "server.rndv.malloc" => rndv_alloc as *const c_char,
        _ => rndv_free as *const c_char,
    }
}

fn pairs_of(lines: &[u8]) -> Vec<Pair> {
    let mut out = Vec::new();
    for line in lines.split(|&b| b == b'\n') {
        let Some((&pick, value)) = line.split_first() else { continue };
        match KEYS.get(usize::from(pick) % (KEYS.len() + 1)) {
            Some(&key) if is_function_key(key) => {
                let p = function_value(key, value.first().copied().unwrap_or(0));
                out.push(Pair { key: c_bytes(key.as_bytes()), value: Value::Pointer(p) })
            }
            Some(&key) => out.push(Pair { key: c_bytes(key.as_bytes()), value: Value::Text(c_bytes(value)) }),
            None => {
                let (k, v) = match value.iter().position(|&b| b == b'=') {
                    Some(at) => (&value[..at], &value[at + 1..]),
                    None => (value, &[][..]),
                };
                let key = c_bytes(k);
                // A made-up key that spells a function key still gets a function (or NULL): the
                // C contract, which the parser cannot check, says that key's value is one.
                let value =
                    match KEYS.iter().find(|f| is_function_key(f) && f.as_bytes() == &key[..key.len() - 1]) {
                        Some(f) => Value::Pointer(function_value(f, v.first().copied().unwrap_or(0))),
                        None => Value::Text(c_bytes(v)),
                    };
                out.push(Pair { key, value })
            }
        }
    }
    out
}

/// Parses `pairs` under `mask` (with the TLS callbacks when `callbacks`) as `role` reads them.
fn run(mask: u64, callbacks: bool, role: Role, pairs: &[Pair]) -> Result<Settings, OckRpcStatus> {
    let mut raw: Vec<RpcConfigPair> = pairs
        .iter()
        .map(|p| RpcConfigPair {
            key: p.key.as_ptr().cast(),
            value: match &p.value {
                Value::Text(t) => t.as_ptr().cast(),
                Value::Pointer(f) => *f,
            },
        })
        .collect();
    let cfg = OckRpcCreateConfig {
        mask,
        configs: RpcConfigs { size: raw.len() as c_int, pairs: raw.as_mut_ptr() },
        server_ctx_builder: None,
        server_ctx_cleanup: None,
        get_ca_and_verify: if callbacks { Some(get_ca) } else { None },
        get_cert: if callbacks { Some(get_cert) } else { None },
        get_pri_key: if callbacks { Some(get_key) } else { None },
    };
    // SAFETY: `cfg` and every key and value it points to (terminated strings, or the addresses
    // of functions of the documented types) live until parse returns.
    unsafe { parse(&cfg, role) }
}

/// The canonical configuration of `s`: every key written as the documentation spells it.
fn render(s: &Settings) -> Vec<Pair> {
    let text =
        |k: &str, v: String| Pair { key: c_bytes(k.as_bytes()), value: Value::Text(c_bytes(v.as_bytes())) };
    let ptr = |k: &str, f: Option<usize>| Pair {
        key: c_bytes(k.as_bytes()),
        value: Value::Pointer(f.map_or(std::ptr::null(), |a| a as *const c_char)),
    };
    let yes = |b: bool| if b { "yes" } else { "no" }.to_string();
    let join = |v: Vec<String>| v.join(",");
    vec![
        text("server.create.name", s.name.clone()),
        text("server.create.range", format!("{}-{}", s.range.0, s.range.1)),
        text("server.create.type", format!("{:?}", s.kind).to_uppercase()),
        text("server.create.segsize", s.segsize.to_string()),
        text("server.create.segcount", s.segcount.to_string()),
        text("worker.thread.groups", join(s.groups.iter().map(|g| g.to_string()).collect())),
        text(
            "worker.thread.cpuset",
            join(s.cpusets.iter().map(|c| c.map_or("na".into(), |(a, b)| format!("{a}-{b}"))).collect()),
        ),
        text("worker.poll.enable", yes(s.busy_poll)),
        text("server.rndv.enable", yes(s.rndv)),
        text("server.heartbeat.idle", s.heartbeat_idle.to_string()),
        text("client.create.info", s.client_info.clone()),
        text("client.enable.selfpolling", yes(s.self_polling)),
        ptr("server.client.new", s.on_new.map(|f| f as usize)),
        ptr("server.client.break", s.on_break.map(|f| f as usize)),
        ptr("server.rndv.malloc", s.rndv_malloc.map(|f| f as usize)),
        ptr("server.rndv.mfree", s.rndv_free.map(|f| f as usize)),
    ]
    .into_iter()
    // An empty cpuset list is the default (no pinning), which no value spells.
    .filter(|p| !(s.cpusets.is_empty() && p.key.starts_with(b"worker.thread.cpuset")))
    // An absent function is spelled by leaving its key out: a NULL value is refused.
    .filter(|p| !matches!(p.value, Value::Pointer(f) if f.is_null()))
    .collect()
}

fuzz_target!(|data: &[u8]| {
    static QUIET: std::sync::Once = std::sync::Once::new();
    QUIET.call_once(|| hcom4db::log::set(Some(quiet)));
    let Some((&m, lines)) = data.split_first() else { return };
    let mut mask = 0;
    if m & 3 != 0 {
        mask |= OCK_RPC_CONFIG_USE_RPC_CONFIGS;
    }
    if m & 4 != 0 {
        mask |= OCK_RPC_CONFIG_USE_SSL_CALLBACK;
    }
    let callbacks = m & 8 != 0;
    let role = if m & 16 != 0 { Role::Client } else { Role::Server };
    let pairs = pairs_of(lines);
    let Ok(s) = run(mask, callbacks, role, &pairs) else { return };

    // Invariants of accepted settings.
    assert!(s.cpusets.is_empty() || s.cpusets.len() == s.groups.len());
    assert!(s.workers() >= 1);
    let pin = s.pin();
    assert!(pin.is_empty() || pin.len() == s.groups.iter().sum::<usize>());

    // The last value wins.
    let mut last: Vec<Pair> = Vec::new();
    for p in pairs.iter().rev() {
        if !last.iter().any(|q| q.key == p.key) {
            last.push(p.clone());
        }
    }
    last.reverse();
    let dedup = run(mask, callbacks, role, &last).expect("the pairs that are in effect are refused alone");
    assert_eq!(format!("{dedup:?}"), format!("{s:?}"), "dropping overridden pairs changed the settings");

    // Settings → canonical configuration → the same settings.
    let canon = render(&s);
    let mask =
        OCK_RPC_CONFIG_USE_RPC_CONFIGS | if s.tls.is_some() { OCK_RPC_CONFIG_USE_SSL_CALLBACK } else { 0 };
    match run(mask, s.tls.is_some(), role, &canon) {
        Ok(again) => assert_eq!(format!("{again:?}"), format!("{s:?}"), "settings → config → settings"),
        // A name or info read with invalid UTF-8 was widened by U+FFFD past its limit.
        Err(_) if s.name.contains('\u{FFFD}') || s.client_info.contains('\u{FFFD}') => {}
        Err(e) => panic!("the canonical form of accepted settings is refused ({e}): {s:?}"),
    }
});
