//! Choosing and opening the device of a server: the communication type, or `BYPASS_BACKEND`.
//!
//! | `server.create.type` | backend spec |
//! |---|---|
//! | `RDMA` (default) | `verbs` (the first RDMA device; feature `verbs`) |
//! | `UBC` | `urma` (the first URMA device liburma lists; liburma from `$BYPASS_URMA_LIB`, else `liburma.so.0`; feature `urma`) |
//! | `HCCS` (libcomm's default) | `urma`, as `UBC`: HCCS is Huawei's chip-to-chip link, which UB and its URMA API succeed; there is no HCCS verbs or socket device to open |
//! | `TCP` | `sim+udp://IP:0`: the simulated NIC on the UDP wire, bound to the server's IP |
//!
//! `BYPASS_BACKEND` (any spec `bypass::Backend::open` takes: `sim`, `sim+shm`,
//! `sim+udp://10.0.0.5:0`, `verbs:rxe0`, `urma:bypass_sim0,lib=/path/liburma.so`, ...) replaces
//! the choice for every server of the process. Opened backends are shared by spec while a server uses them, so that servers and
//! clients of one process on the in-process simulator share its fabric.

use crate::types::*;
use bypass::backend::AnyDevice;
use bypass::Backend;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

/// The communication type of `server.create.type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommType {
    /// `"TCP"`.
    Tcp,
    /// `"RDMA"`.
    Rdma,
    /// `"UBC"`.
    Ubc,
    /// `"HCCS"`: opened as [`CommType::Ubc`] (see the module doc).
    Hccs,
}

/// An opened backend and a device on it; the server keeps it alive.
#[derive(Debug)]
pub struct Opened {
    /// The backend (for a simulator, its fabric).
    pub backend: Arc<Backend>,
    /// The device the server and its process's clients use.
    pub dev: AnyDevice,
    /// The spec it was opened from.
    pub spec: String,
}

fn cache() -> &'static Mutex<HashMap<String, Weak<Backend>>> {
    static CACHE: std::sync::OnceLock<Mutex<HashMap<String, Weak<Backend>>>> = std::sync::OnceLock::new();
    CACHE.get_or_init(Default::default)
}

/// The spec for `kind` on a server bound to `ip` (`BYPASS_BACKEND` wins).
pub fn spec_for(kind: CommType, ip: &str) -> String {
    if let Ok(s) = std::env::var("BYPASS_BACKEND") {
        if !s.trim().is_empty() {
            return s.trim().to_string();
        }
    }
    match kind {
        CommType::Rdma => "verbs".into(),
        CommType::Ubc | CommType::Hccs => "urma".into(),
        CommType::Tcp => format!("sim+udp://{ip}:0"),
    }
}

/// Opens (or shares) the backend for `kind` and `ip`. Failure: the status and a log line that
/// says what to install or set.
pub fn open(kind: CommType, ip: &str) -> Result<Opened, OckRpcStatus> {
    let spec = spec_for(kind, ip);
    let backend = {
        let mut c = cache().lock().unwrap_or_else(|e| e.into_inner());
        c.retain(|_, w| w.strong_count() > 0);
        match c.get(&spec).and_then(Weak::upgrade) {
            Some(b) => b,
            None => match Backend::open(&spec) {
                Ok(b) => {
                    let b = Arc::new(b);
                    c.insert(spec.clone(), Arc::downgrade(&b));
                    b
                }
                Err(e) => {
                    let hint = match kind {
                        _ if std::env::var_os("BYPASS_BACKEND").is_some() => {
                            "check BYPASS_BACKEND (e.g. BYPASS_BACKEND=sim runs on the simulated NIC)"
                        }
                        CommType::Rdma => {
                            "install rdma-core with an RDMA device (or rxe: `rdma link add rxe0 type rxe netdev eth0`) \
                             and build libhcom4db with `--features verbs`, or set BYPASS_BACKEND=sim to run on the \
                             simulated NIC"
                        }
                        CommType::Ubc | CommType::Hccs if !cfg!(feature = "urma") => {
                            "this libhcom4db was built without the URMA backend: build it with `--features urma`, \
                             or use type RDMA or TCP, or set BYPASS_BACKEND=sim to run on the simulated NIC"
                        }
                        CommType::Ubc | CommType::Hccs => {
                            "install UMDK's liburma.so.0 with a UB device, or point BYPASS_URMA_LIB at a liburma \
                             (sim-urma's liburma.so runs on the simulated NIC); choose the device with \
                             BYPASS_BACKEND=urma:<device>[,lib=<path>]; or set BYPASS_BACKEND=sim to run on the \
                             simulated NIC"
                        }
                        CommType::Tcp => "the server IP must be an IPv4 address of this host (TCP runs the simulated NIC on UDP)",
                    };
                    crate::log!(
                        crate::log::ERROR,
                        "OckRpcServerCreateWithCfg: cannot open backend {spec:?} for type {kind:?}: {e}; {hint}"
                    );
                    return Err(OCK_RPC_ERR_RDMA_NOT_ENABLE);
                }
            },
        }
    };
    let dev = match backend.device() {
        Ok(dev) => dev,
        // An L2 fabric has one NIC per port (a second server on one AF_PACKET or VFIO port), a
        // UDP socket may fail to bind: a status and a line, not a panic.
        Err(e) => {
            crate::log!(crate::log::ERROR, "OckRpcServerCreateWithCfg: on backend {spec:?}: {e}");
            return Err(OCK_RPC_ERR_RDMA_NOT_ENABLE);
        }
    };
    crate::log!(crate::log::INFO, "server device: {} (spec {spec:?})", backend.describe());
    Ok(Opened { backend, dev, spec })
}
