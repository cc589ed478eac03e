//! `OckRpcCreateConfig` → [`Settings`]: every key of `hcom4db.h`, with the defaults of
//! docs/capi.md. Unknown keys are accepted and ignored (logged at debug); a bad value is
//! refused with the reference's status (`OCK_RPC_ERR_INVALID_PARAM`, or `OCK_RPC_ERR` for the
//! client's segment keys) and a log line naming the key and what it accepts. Strings are read
//! only up to their documented limit: a value without a terminator within it is refused, not
//! over-read.
//!
//! A server reads every key; a client ([`Role::Client`]) reads only the keys a client uses
//! (name, payload, self-polling, heartbeat, TLS, its break handler) and checks `segsize` / `segcount` with the
//! reference's client bounds (its CallWithParam pool: `segcount` 0 means none), ignoring the
//! server-only keys as the reference does.

use crate::backend::CommType;
use crate::types::*;
use std::ffi::{c_char, CStr};

/// Longest key read.
const MAX_KEY: usize = 128;

/// The server's largest `server.create.segsize`: 1 GiB.
pub const MAX_SEGSIZE: u64 = 1 << 30;

/// TLS callbacks (all three set).
#[derive(Debug, Clone, Copy)]
pub struct TlsCallbacks {
    /// CA, CRL, verify.
    pub get_ca_and_verify:
        unsafe extern "C" fn(*mut *const c_char, *mut *const c_char, *mut OckRpcTlsCertVerify),
    /// Certificate.
    pub get_cert: unsafe extern "C" fn(*mut *const c_char),
    /// Private key.
    pub get_pri_key: unsafe extern "C" fn(*mut *const c_char, *mut *mut c_char, *mut OckRpcTlsKeypassErase),
}

/// Who reads a config: the keys and bounds differ (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// `OckRpcServerCreateWithCfg`.
    Server,
    /// `OckRpcClientConnectWithCfg`.
    Client,
}

/// The client's largest `server.create.segsize` (the reference's bound for its CallWithParam
/// pool, 900 MiB).
pub const CLIENT_MAX_SEGSIZE: u64 = 943_718_400;
/// The client's largest `server.create.segcount` (the reference's bound).
pub const CLIENT_MAX_SEGCOUNT: u64 = 65_535;

/// Parsed configuration (server and client keys).
#[derive(Debug, Clone)]
pub struct Settings {
    /// `server.create.name`.
    pub name: String,
    /// `server.create.range`.
    pub range: (u16, u16),
    /// `server.create.type`.
    pub kind: CommType,
    /// `server.create.segsize`.
    pub segsize: usize,
    /// `server.create.segcount`.
    pub segcount: usize,
    /// `server.client.new`.
    pub on_new: OckRpcClientHandler,
    /// `server.client.break`.
    pub on_break: OckRpcClientHandler,
    /// `worker.thread.groups`: threads per group.
    pub groups: Vec<usize>,
    /// `worker.thread.cpuset`: per group a CPU range, or `None` ("na").
    pub cpusets: Vec<Option<(usize, usize)>>,
    /// `worker.poll.enable`.
    pub busy_poll: bool,
    /// `server.rndv.enable`.
    pub rndv: bool,
    /// `server.rndv.malloc`.
    pub rndv_malloc: OckRpcRndvMemAllocate,
    /// `server.rndv.mfree`.
    pub rndv_free: OckRpcRndvMemFree,
    /// `server.heartbeat.idle`, seconds.
    pub heartbeat_idle: u64,
    /// `server.tls.enable` together with the mask and callbacks: TLS is on.
    pub tls: Option<TlsCallbacks>,
    /// `client.create.info`.
    pub client_info: String,
    /// `client.enable.selfpolling`.
    pub self_polling: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            name: "service".into(),
            range: (4000, 5000),
            kind: CommType::Rdma,
            segsize: 65536,
            segcount: 1024,
            on_new: None,
            on_break: None,
            groups: vec![1],
            cpusets: Vec::new(),
            busy_poll: false,
            rndv: false,
            rndv_malloc: None,
            rndv_free: None,
            heartbeat_idle: 1,
            tls: None,
            client_info: "hello".into(),
            self_polling: true,
        }
    }
}

impl Settings {
    /// Worker threads: the sum of the groups.
    pub fn workers(&self) -> usize {
        self.groups.iter().sum::<usize>().max(1)
    }

    /// CPUs to pin the workers to, thread by thread; empty if any group is "na" or no cpuset.
    pub fn pin(&self) -> Vec<usize> {
        if self.cpusets.is_empty() || self.cpusets.iter().any(Option::is_none) {
            return Vec::new();
        }
        let mut pin = Vec::new();
        for (threads, set) in self.groups.iter().zip(&self.cpusets) {
            let (lo, hi) = set.unwrap_or((0, 0));
            let cpus: Vec<usize> = (lo..=hi).collect();
            for t in 0..*threads {
                pin.push(cpus[t % cpus.len()]);
            }
        }
        pin
    }
}

/// A refused value: the key and why.
fn bad(key: &str, why: impl std::fmt::Display) -> OckRpcStatus {
    crate::log!(crate::log::ERROR, "config key {key:?}: {why}");
    OCK_RPC_ERR_INVALID_PARAM
}

/// Reads a C string of at most `max` bytes; `None` if there is no terminator within `max + 1`.
///
/// # Safety
/// `p` is NULL or points to at least `max + 1` readable bytes or a terminated string.
pub unsafe fn bounded_str(p: *const c_char, max: usize) -> Option<String> {
    if p.is_null() {
        return None;
    }
    // SAFETY: the caller's contract; strnlen reads at most `max + 1` bytes.
    let n = unsafe { libc::strnlen(p, max + 1) };
    if n > max {
        return None;
    }
    // SAFETY: a terminator lies at `n`, within what strnlen read.
    let s = unsafe { CStr::from_ptr(p) };
    Some(s.to_string_lossy().into_owned())
}

fn yes_no(key: &str, v: &str) -> Result<bool, OckRpcStatus> {
    match v {
        "yes" => Ok(true),
        "no" => Ok(false),
        _ => Err(bad(key, format_args!("{v:?} is neither \"yes\" nor \"no\""))),
    }
}

fn number(key: &str, v: &str, min: u64, max: u64) -> Result<u64, OckRpcStatus> {
    number_or(key, v, min, max, OCK_RPC_ERR_INVALID_PARAM)
}

/// [`number`], refused with `status`.
fn number_or(key: &str, v: &str, min: u64, max: u64, status: OckRpcStatus) -> Result<u64, OckRpcStatus> {
    match v.trim().parse::<u64>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        _ => {
            bad(key, format_args!("{v:?} is not a number in {min}..={max}"));
            Err(status)
        }
    }
}

fn parse_range(key: &str, v: &str) -> Result<(u16, u16), OckRpcStatus> {
    let parsed = v
        .split_once('-')
        .and_then(|(a, b)| Some((a.trim().parse::<u16>().ok()?, b.trim().parse::<u16>().ok()?)));
    match parsed {
        Some((lo, hi)) if lo >= 1024 && lo <= hi => Ok((lo, hi)),
        _ => Err(bad(
            key,
            format_args!("{v:?} is not a port range LOW-HIGH with 1024 <= LOW <= HIGH <= 65535"),
        )),
    }
}

fn parse_groups(key: &str, v: &str) -> Result<Vec<usize>, OckRpcStatus> {
    let groups: Option<Vec<usize>> =
        v.split(',').map(|g| g.trim().parse::<usize>().ok().filter(|&n| (1..=256).contains(&n))).collect();
    groups.ok_or_else(|| {
        bad(key, format_args!("{v:?} is not a list of thread counts 1..256 like \"4\" or \"1,2,3\""))
    })
}

fn parse_cpusets(key: &str, v: &str) -> Result<Vec<Option<(usize, usize)>>, OckRpcStatus> {
    let cpus = 8 * std::mem::size_of::<libc::cpu_set_t>();
    let sets: Option<Vec<Option<(usize, usize)>>> = v
        .split(',')
        .map(|s| {
            let s = s.trim();
            if s == "na" {
                return Some(None);
            }
            let (a, b) = s.split_once('-')?;
            let (a, b) = (a.trim().parse::<usize>().ok()?, b.trim().parse::<usize>().ok()?);
            (a <= b && b < cpus).then_some(Some((a, b)))
        })
        .collect();
    sets.ok_or_else(|| {
        bad(key, format_args!("{v:?} is not a list of CPU ranges like \"1-4\" or \"1-1,2-3,na\""))
    })
}

/// Parses `cfg` for `role`. A NULL `cfg`, or a NULL pair array or negative count with
/// `OCK_RPC_CONFIG_USE_RPC_CONFIGS`, is refused as the reference refuses it.
///
/// # Safety
/// `cfg` is NULL or points to a readable `OckRpcCreateConfig` whose pairs are readable.
pub unsafe fn parse(cfg: *const OckRpcCreateConfig, role: Role) -> Result<Settings, OckRpcStatus> {
    let mut s = Settings::default();
    if cfg.is_null() {
        return Err(bad(
            "configs",
            "the OckRpcCreateConfig pointer is NULL: pass a config (mask 0 for all defaults)",
        ));
    }
    // SAFETY: the caller's contract.
    let cfg = unsafe { &*cfg };
    let mut tls_value = true;
    let client = role == Role::Client;
    if cfg.mask & OCK_RPC_CONFIG_USE_RPC_CONFIGS != 0 {
        let n = cfg.configs.size;
        if n < 0 || cfg.configs.pairs.is_null() {
            return Err(bad(
                "configs",
                format_args!(
                    "size {n} with pairs {:p}: with OCK_RPC_CONFIG_USE_RPC_CONFIGS give a pair array and a count >= 0",
                    cfg.configs.pairs
                ),
            ));
        }
        for i in 0..n as usize {
            // SAFETY: `pairs` holds `size` pairs (the caller's contract).
            let pair = unsafe { *cfg.configs.pairs.add(i) };
            // SAFETY: a key is a C string (bounded read).
            let Some(key) = (unsafe { bounded_str(pair.key, MAX_KEY) }) else {
                return Err(bad("configs", format_args!("pair {i} has a NULL or unterminated key")));
            };
            let ptr = pair.value as usize;
            let k = key.as_str();
            if ptr == 0 {
                return Err(bad(k, "the value is NULL: give a value (function-pointer keys: the function)"));
            }
            if client
                && !matches!(
                    k,
                    "server.create.name"
                        | "server.client.break"
                        | "server.create.segsize"
                        | "server.create.segcount"
                        | "server.heartbeat.idle"
                        | "server.tls.enable"
                        | "client.create.info"
                        | "client.enable.selfpolling"
                )
            {
                crate::log!(crate::log::DEBUG, "config key {k:?} is not read by a client; ignored");
                continue;
            }
            // Function-pointer keys: the value is the pointer.
            match k {
                "server.client.new" | "server.client.break" => {
                    // SAFETY: the documented contract: the value is an OckRpcClientHandler.
                    let f: OckRpcClientHandler =
                        unsafe { std::mem::transmute::<usize, OckRpcClientHandler>(ptr) };
                    if k.ends_with("new") {
                        s.on_new = f;
                    } else {
                        s.on_break = f;
                    }
                    continue;
                }
                "server.rndv.malloc" => {
                    // SAFETY: the documented contract: an OckRpcRndvMemAllocate.
                    s.rndv_malloc = unsafe { std::mem::transmute::<usize, OckRpcRndvMemAllocate>(ptr) };
                    continue;
                }
                "server.rndv.mfree" => {
                    // SAFETY: the documented contract: an OckRpcRndvMemFree.
                    s.rndv_free = unsafe { std::mem::transmute::<usize, OckRpcRndvMemFree>(ptr) };
                    continue;
                }
                _ => {}
            }
            let limit = match k {
                "worker.thread.cpuset" => 128,
                "server.create.range" => 16,
                _ => 64,
            };
            let known = matches!(
                k,
                "server.create.name"
                    | "server.create.range"
                    | "server.create.type"
                    | "server.create.segsize"
                    | "server.create.segcount"
                    | "worker.thread.groups"
                    | "worker.thread.cpuset"
                    | "worker.poll.enable"
                    | "server.rndv.enable"
                    | "server.heartbeat.idle"
                    | "server.tls.enable"
                    | "client.create.info"
                    | "client.enable.selfpolling"
            );
            if !known {
                crate::log!(crate::log::DEBUG, "config key {k:?} is not used by this library; ignored");
                continue;
            }
            // SAFETY: a value is a C string (bounded read).
            let Some(v) = (unsafe { bounded_str(pair.value, limit) }) else {
                return Err(bad(k, format_args!("the value is NULL or longer than {limit} characters")));
            };
            match k {
                "server.create.name" => {
                    if v.is_empty() {
                        return Err(bad(k, "the name is empty"));
                    }
                    s.name = v
                }
                "server.create.range" => s.range = parse_range(k, &v)?,
                "server.create.type" => {
                    s.kind = match v.as_str() {
                        "TCP" => CommType::Tcp,
                        "RDMA" => CommType::Rdma,
                        "UBC" => CommType::Ubc,
                        "HCCS" => CommType::Hccs,
                        _ => {
                            return Err(bad(
                                k,
                                format_args!("{v:?} is not \"TCP\", \"RDMA\", \"UBC\" or \"HCCS\""),
                            ))
                        }
                    }
                }
                // The client's pair (the reference's CallWithParam pool): refused with OCK_RPC_ERR.
                "server.create.segsize" if client => {
                    s.segsize = number_or(k, &v, 0, CLIENT_MAX_SEGSIZE, OCK_RPC_ERR)? as usize
                }
                "server.create.segcount" if client => {
                    s.segcount = number_or(k, &v, 0, CLIENT_MAX_SEGCOUNT, OCK_RPC_ERR)? as usize
                }
                "server.create.segsize" => s.segsize = number(k, &v, 256, MAX_SEGSIZE)? as usize,
                "server.create.segcount" => s.segcount = number(k, &v, 0, 1 << 20)? as usize,
                "worker.thread.groups" => s.groups = parse_groups(k, &v)?,
                "worker.thread.cpuset" => s.cpusets = parse_cpusets(k, &v)?,
                "worker.poll.enable" => s.busy_poll = yes_no(k, &v)?,
                "server.rndv.enable" => s.rndv = yes_no(k, &v)?,
                "server.heartbeat.idle" => s.heartbeat_idle = number(k, &v, 1, 3600)?,
                "server.tls.enable" => tls_value = yes_no(k, &v)?,
                "client.create.info" => s.client_info = v,
                "client.enable.selfpolling" => s.self_polling = yes_no(k, &v)?,
                _ => {}
            }
        }
    }
    if !s.cpusets.is_empty() && s.cpusets.len() != s.groups.len() {
        return Err(bad(
            "worker.thread.cpuset",
            format_args!(
                "{} CPU sets for {} worker groups: give one per group (\"na\": no pinning)",
                s.cpusets.len(),
                s.groups.len()
            ),
        ));
    }
    if s.rndv && !client {
        let missing = match (s.rndv_malloc.is_none(), s.rndv_free.is_none()) {
            (true, true) => Some("server.rndv.malloc and server.rndv.mfree"),
            (true, false) => Some("server.rndv.malloc"),
            (false, true) => Some("server.rndv.mfree"),
            (false, false) => None,
        };
        if let Some(m) = missing {
            return Err(bad(
                "server.rndv.enable",
                format_args!(
                    "\"yes\" needs both hooks, server.rndv.malloc and server.rndv.mfree: {m} not set \
                     (or set server.rndv.enable to \"no\")"
                ),
            ));
        }
    }
    if cfg.mask & OCK_RPC_CONFIG_USE_SSL_CALLBACK != 0 && tls_value {
        match (cfg.get_ca_and_verify, cfg.get_cert, cfg.get_pri_key) {
            (Some(a), Some(c), Some(k)) => {
                s.tls = Some(TlsCallbacks { get_ca_and_verify: a, get_cert: c, get_pri_key: k })
            }
            // The reference refuses a server so configured; it never reads TLS on a client.
            _ if !client => {
                return Err(bad(
                    "server.tls.enable",
                    "OCK_RPC_CONFIG_USE_SSL_CALLBACK is set and TLS is not \"no\", but not all three TLS \
                     callbacks (getCaAndVerify, getCert, getPriKey) are: set them, or set server.tls.enable to \"no\"",
                ))
            }
            _ => crate::log!(
                crate::log::WARN,
                "OCK_RPC_CONFIG_USE_SSL_CALLBACK is set but not all three TLS callbacks are: TLS is off"
            ),
        }
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_and_cpusets_make_the_pin_list() {
        let s =
            Settings { groups: vec![1, 2], cpusets: vec![Some((3, 3)), Some((4, 5))], ..Settings::default() };
        assert_eq!(s.workers(), 3);
        assert_eq!(s.pin(), vec![3, 4, 5]);
        let na = Settings { groups: vec![1, 2], cpusets: vec![Some((3, 3)), None], ..Settings::default() };
        assert!(na.pin().is_empty(), "\"na\" turns pinning off");
        assert!(Settings::default().pin().is_empty());
        assert_eq!(parse_range("k", "4000-5000"), Ok((4000, 5000)));
        assert_eq!(parse_cpusets("k", "1-1,2-3,na"), Ok(vec![Some((1, 1)), Some((2, 3)), None]));
        assert_eq!(parse_groups("k", "1,2,3"), Ok(vec![1, 2, 3]));
    }
}
