//! The client object behind an `OckRpcClient` handle: a channel this process opened
//! (`OckRpcClientConnectWithCfg`), or a server-side connection (what the new/break handlers and
//! `OckRpcGetClient` give).
//!
//! For the memory side: [`lookup`] a handle; [`ClientObj::channel`] is the connection for
//! one-sided READ/WRITE, [`ClientObj::server`] the server whose device (and regions) it uses,
//! [`ClientObj::timeout`] the per-client deadline.

use crate::config::Settings;
use crate::handle::{Handle, HandleTable};
use crate::server::{ServerObj, STACK_NAME};
use crate::types::*;
use bypass::backend::{AnyChannel, AnyConnection, Channels, Nic};
use bypass::{Channel, ChannelConfig, Keepalive};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// What a client handle is.
#[derive(Debug)]
pub enum ClientKind {
    /// A channel to a server.
    Out(AnyChannel),
    /// A client's connection on one of our servers.
    In(AnyConnection),
}

/// An `OckRpcClient`.
#[derive(Debug)]
pub struct ClientObj {
    /// Channel or connection.
    pub kind: ClientKind,
    /// Per-client timeout in ms (negative: never).
    timeout_ms: AtomicI64,
    /// The server of this process whose device the channel uses (`None` for a connection whose
    /// server is gone).
    server: Option<Arc<ServerObj>>,
    /// The break handler of a channel.
    pub on_break: OckRpcClientHandler,
    /// The worker thread polling the channel (kept while the client lives, even if its server
    /// is destroyed first).
    #[allow(dead_code)] // held for its lifetime, never read
    workers: Option<Arc<bypass::WorkerGroup>>,
}

/// Every live client handle.
pub static CLIENTS: HandleTable<ClientObj> = HandleTable::new(0xC1);

/// The client behind `h`.
pub fn lookup(h: Handle) -> Option<Arc<ClientObj>> {
    CLIENTS.get(h)
}

impl ClientObj {
    /// A new object.
    pub fn new(kind: ClientKind, server: Option<Arc<ServerObj>>, on_break: OckRpcClientHandler) -> Arc<Self> {
        Arc::new(ClientObj { kind, timeout_ms: AtomicI64::new(-1), server, on_break, workers: None })
    }

    /// The channel (for calls and one-sided I/O); `None` for a server-side connection.
    pub fn channel(&self) -> Option<&AnyChannel> {
        match &self.kind {
            ClientKind::Out(c) => Some(c),
            ClientKind::In(_) => None,
        }
    }

    /// The server whose device and regions this client uses.
    pub fn server(&self) -> Option<&Arc<ServerObj>> {
        self.server.as_ref()
    }

    /// Sets the timeout (ms; negative: never; 0: immediate).
    pub fn set_timeout(&self, ms: i64) {
        self.timeout_ms.store(ms, Ordering::Relaxed);
    }

    /// The deadline of a call: never (`Duration::MAX`), immediate (1 ns) or the milliseconds set.
    pub fn timeout(&self) -> Duration {
        match self.timeout_ms.load(Ordering::Relaxed) {
            ms if ms < 0 => Duration::MAX,
            0 => Duration::from_nanos(1),
            ms => Duration::from_millis(ms as u64),
        }
    }

    /// The per-client context (`OckRpcSetUpCtx`).
    pub fn set_context(&self, v: u64) {
        match &self.kind {
            ClientKind::Out(c) => bypass::match_any!(c, c => c.set_context(v)),
            ClientKind::In(c) => bypass::match_any!(c, c => c.set_context(v)),
        }
    }

    /// The per-client context.
    pub fn context(&self) -> u64 {
        match &self.kind {
            ClientKind::Out(c) => bypass::match_any!(c, c => c.context()),
            ClientKind::In(c) => bypass::match_any!(c, c => c.context()),
        }
    }

    /// Closes the channel or connection.
    pub fn close(&self) {
        match &self.kind {
            ClientKind::Out(c) => bypass::match_any!(c, c => c.close()),
            ClientKind::In(c) => bypass::match_any!(c, c => c.close()),
        }
    }
}

/// The server of this process named `name` (the client uses its device).
pub fn server_named(name: &str) -> Option<Arc<ServerObj>> {
    crate::server::SERVERS.snapshot().into_iter().map(|(_, s)| s).find(|s| s.settings.name == name)
}

/// Connects to `addr` on `server`'s device; returns the new handle.
pub fn connect(
    addr: std::net::SocketAddr,
    s: &Settings,
    server: Arc<ServerObj>,
) -> Result<Handle, OckRpcStatus> {
    let tls = match &s.tls {
        None => None,
        Some(cb) => Some(crate::tls::build(cb)?),
    };
    let segsize = server.settings.segsize;
    let channel = bypass::match_any!(server.dev(), d => connect_on(d, addr, s, segsize, tls));
    let channel = channel.map_err(|e| {
        crate::log!(crate::log::ERROR, "OckRpcClientConnectWithCfg: connecting to {addr} failed: {e}");
        OCK_RPC_ERR_CONN_UNCONNECTED
    })?;
    let pollable = bypass::match_any!(&channel, c => c.pollable());
    let workers = match server.client_workers() {
        Ok(w) => {
            w.add(pollable);
            w
        }
        Err(e) => {
            crate::log!(
                crate::log::ERROR,
                "OckRpcClientConnectWithCfg: cannot start the client worker thread: {e}"
            );
            return Err(OCK_RPC_ERR);
        }
    };
    let on_break = s.on_break;
    let info = std::ffi::CString::new(s.client_info.replace('\0', "")).unwrap_or_default();
    let obj = Arc::new(ClientObj {
        kind: ClientKind::Out(channel),
        timeout_ms: AtomicI64::new(-1),
        server: Some(server),
        on_break,
        workers: Some(workers),
    });
    let h = CLIENTS.insert(obj.clone());
    if let Some(f) = on_break {
        let cb = move |_reason| {
            let ctx = lookup(h).map_or(0, |c| c.context());
            // SAFETY: the caller's OckRpcClientHandler; the payload lives across the call.
            unsafe { f(h, ctx, info.as_ptr()) };
        };
        if let ClientKind::Out(c) = &obj.kind {
            bypass::match_any!(c, c => c.set_break_callback(cb));
        }
    }
    Ok(h)
}

fn connect_on<D: Nic>(
    dev: &D,
    addr: std::net::SocketAddr,
    s: &Settings,
    segsize: usize,
    tls: Option<bypass::tls::TlsConfig>,
) -> Result<AnyChannel, bypass::RpcError> {
    let mut cfg = ChannelConfig::new(STACK_NAME);
    cfg.client_info = s.client_info.clone();
    cfg.msg_size = crate::server::eager_size(segsize, dev.caps().max_msg_size);
    cfg.timeout = None;
    cfg.self_poll = s.self_polling;
    cfg.keepalive = Some(Keepalive { interval: Duration::from_secs(s.heartbeat_idle), misses: 5 });
    cfg.tls = tls;
    Channel::connect(dev, addr, cfg).map(D::wrap::<Channels>)
}
