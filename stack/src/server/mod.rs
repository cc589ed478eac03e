//! The server: a function table, per-client connections, and replying.
//!
//! A [`Server`] listens on TCP. Each client that connects gets a connection of its own: as many
//! queue pairs as the client asked for, `window` credits per queue, and a 24-bit channel id. The
//! requests land in the server's shared receive pool ([`RecvBuffers::Shared`], the default where
//! the device has shared receive queues; `crate::conn::shared_pool`), or in `window` receive buffers
//! posted on each queue plus slack for batched re-posting ([`RecvBuffers::PerConnection`]).
//! Workers poll the connections (a shared-pool completion arrives on its connection's receive
//! CQ); for every request they
//!
//! 1. send the standalone ACK if the client asked for one (ACK modes), before the handler runs;
//! 2. look the function up and run its handler with a [`Request`], or answer FUNCTION_ERR;
//! 3. when the handler replies (at once, or later from another thread), re-post the request's
//!    receive buffer **before** posting the response — the response returns the client's credit,
//!    so the buffer must be back first — on the queue the request came from (or to the pool).
//!
//! Requests that get no response (`EARLY_RSP` and `ACK | EARLY_RSP`, a handler that drops its
//! request, a malformed message) return their credit with a credit grant (an ACK with
//! `req_id_range` 0 carrying the count), sent at the end of the worker's pass or at once when a
//! request is dropped on another thread.
//!
//! Messages made while a worker dispatches a connection (ACKs, inline replies, grants) are
//! posted together at the end of the pass, one doorbell per queue; a reply from another thread
//! first posts whatever the worker collected for that queue, so an ACK never trails its response.

// No `unsafe` here: the buffer views this module uses are conn/'s safe ones (their ownership
// is carried by `conn::bufs`'s tokens and by `RndvMem`).
#![forbid(unsafe_code)]

use crate::conn::endpoint::Endpoint;
use crate::conn::liveness::{self, CloseReason, Keepalive, Live};
use crate::conn::shared_pool::{self, SharedPool};
use crate::conn::sizes::{buffer_bytes, fit_window_by, validate_queue_config, validate_sizes, Sizes};
use crate::control::{self, ServerHello, CONTROL_VERSION};
use crate::core::tx_ctx::{CallMode, Event, FailReason, TxHandle};
use crate::error::bad_field;
use crate::hal::trace::{self, Arg, Track};
use crate::hal::{self, Completion, CompletionQueue, Device, QueueConfig};
use crate::limits::{DEFAULT_SHARED_RECV_BUFFERS, MAX_SHARED_RECV_BUFFERS};
use crate::limits::{MAX_REPOST_BATCH, MAX_WINDOW, MIN_MSG_SIZE};
use crate::sync::{lock, SpinLock};
use crate::wire::{self, AckHeader, FunctionId, Parsed, RequestHeader, ResponseHeader, Status};
use crate::worker::{PollMode, Pollable, WorkerConfig, WorkerGroup};
use crate::RpcError;
use std::cell::Cell;
use std::collections::HashMap;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

mod accept;
mod admission;
mod config;
mod conn;
mod events;
mod functions;
mod request;
#[allow(unused_imports)]
use accept::*;
use admission::{conn_bytes, Admission, Admitted};
pub use config::*;
use conn::*;
pub use functions::*;
pub use request::*;
mod monitor;
mod recovery;
pub use events::{Connection, ConnectionEvents};

const POLL_BATCH: usize = 16;

mod rndv;
pub use rndv::RndvStats;

/// Counters of a server (all connections).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServerStats {
    /// Connections accepted.
    pub connections: u64,
    /// Requests received (keepalive probes, the stack's own, not counted).
    pub requests: u64,
    /// Responses sent (answers to keepalive probes not counted).
    pub responses: u64,
    /// ACKs sent.
    pub acks: u64,
    /// Requests for unknown functions (answered FUNCTION_ERR).
    pub unknown_functions: u64,
    /// Requests a handler dropped without replying (their credit went back in a grant).
    pub dropped: u64,
    /// Credit-grant messages sent.
    pub grants: u64,
    /// Malformed or nonsensical messages from clients, dropped.
    pub protocol_errors: u64,
    /// Replies that could not be sent (queue failed, connection closed, response too large).
    pub failed_replies: u64,
    /// Times the device refused to register another chunk of a connection's send buffers on the
    /// reply path. Nothing failed: the reply waited for one of the connection's registered send
    /// contexts instead, so a refusal costs throughput, not calls.
    pub send_registrations_refused: u64,
    /// Handlers that panicked. Each panic was contained on the worker: a request the handler
    /// still held was answered SERVER_DECLINE, and the worker went on serving.
    pub handler_panics: u64,
    /// TCP connections dropped because their handshake did not complete within
    /// [`ServerConfig::handshake_timeout`] (e.g. a client that connected and sent nothing).
    pub handshake_timeouts: u64,
    /// Buffers of the shared receive pool ([`RecvBuffers::Shared`]); 0 when every connection
    /// has its own.
    pub shared_recv_buffers: u64,
    /// Requests that took the shared pool's last posted buffer: each time, requests arriving
    /// meanwhile waited at the client's NIC (RNR retries) until buffers came back. Counted
    /// without a lock, so close rather than exact under concurrency.
    pub shared_recv_dry: u64,
    /// Times accepting paused for 100 ms because the process ran out of file descriptors
    /// (`EMFILE`/`ENFILE`); the kernel kept the waiting connections in its backlog.
    pub accept_pauses: u64,
    /// Closes by the application (shutdown, [`Connection::close`]) that waited for replies
    /// already posted to be acknowledged before failing the queues.
    pub lingers: u64,
    /// Of those, closes whose replies were not all acknowledged within the wait (half a
    /// second; e.g. a client that stopped): those replies were discarded unsent.
    pub linger_timeouts: u64,
}

#[derive(Default)]
struct Counters {
    connections: AtomicU64,
    requests: AtomicU64,
    responses: AtomicU64,
    acks: AtomicU64,
    unknown_functions: AtomicU64,
    dropped: AtomicU64,
    grants: AtomicU64,
    protocol_errors: AtomicU64,
    failed_replies: AtomicU64,
    send_registrations_refused: AtomicU64,
    lingers: AtomicU64,
    linger_timeouts: AtomicU64,
    handler_panics: AtomicU64,
    handshake_timeouts: AtomicU64,
    accept_pauses: AtomicU64,
    rndv: rndv::Counters,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// The row of the server's trace events: the dispatching or replying thread, in group "server".
const TRACK: Track = Track::Thread("server");

#[cold]
fn trace(name: &'static str, args: &[Arg]) {
    trace::instant(TRACK, name, args);
}

fn status_name(s: Status) -> &'static str {
    match s {
        Status::Success => "SUCCESS",
        Status::ServerDecline => "SERVER_DECLINE",
        Status::FunctionErr => "FUNCTION_ERR",
        Status::RemoteLenErr => "REMOTE_LEN_ERR",
        Status::Timeout => "TIMEOUT",
        Status::VersionErr => "VERSION_ERR",
        Status::HdrErr => "HDR_ERR",
    }
}

/// The server's open connections, copy-on-write (see [`ServerInner::conns`]). A connection
/// takes itself out when it closes ([`Conn::close_with`]).
type ConnList<D> = SpinLock<Arc<Vec<Arc<Conn<D>>>>>;

struct ServerInner<D: Device + Clone> {
    device: D,
    config: ServerConfig,
    /// The shared receive pool of every connection (`None`: per-connection buffers).
    pool: Option<Arc<SharedPool<D>>>,
    functions: Arc<Functions<D>>,
    /// The open connections, copy-on-write: [`Server::poll`] takes a snapshot with one `Arc`
    /// clone (no allocation per poll); accepting a connection copies the list only while a
    /// poll holds the previous snapshot.
    conns: Arc<ConnList<D>>,
    /// The open connections and the memory they commit, against the server-wide limits.
    admission: Arc<Admission>,
    counters: Arc<Counters>,
    next_channel: AtomicU32,
    shutdown: AtomicBool,
    addr: SocketAddr,
    workers: Option<WorkerGroup>,
    /// Handshakes refused for TLS reasons (see [`Server::tls_refusals`]).
    tls_refusals: crate::control::tls::RefusalLog,
    events: Arc<ConnectionEvents<D>>,
}

/// An RPC server on one device: listens on TCP for clients and serves their requests with the
/// function table. Dropping it (or [`Server::shutdown`]) closes every connection.
pub struct Server<D: Device + Clone> {
    inner: Arc<ServerInner<D>>,
    acceptor: Option<JoinHandle<()>>,
}

impl<D: Device + Clone> std::fmt::Debug for Server<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("name", &self.inner.config.name)
            .field("addr", &self.inner.addr)
            .finish()
    }
}

impl<D: Device + Clone> Server<D> {
    /// Binds `addr` (port 0 picks a free port; see [`Server::local_addr`]) and starts accepting
    /// clients and serving `functions` on `device`.
    pub fn bind(
        device: &D,
        addr: impl ToSocketAddrs,
        config: ServerConfig,
        functions: Functions<D>,
    ) -> Result<Self, RpcError> {
        Self::bind_with(device, addr, config, functions, ConnectionEvents::new())
    }

    /// [`Server::bind`] with connection callbacks: `events` decides on new connections (it sees
    /// the client's info string and may refuse, with a reason the client receives) and hears of
    /// connections that end (see [`ConnectionEvents`]).
    pub fn bind_with(
        device: &D,
        addr: impl ToSocketAddrs,
        config: ServerConfig,
        functions: Functions<D>,
        events: ConnectionEvents<D>,
    ) -> Result<Self, RpcError> {
        let caps = device.caps();
        config.validate(&caps)?;
        let pool = match config.shared_buffers(&caps) {
            Some(buffers) => match SharedPool::new(device, buffers, config.msg_size) {
                Ok(p) => Some(Arc::new(p)),
                // The caps said yes but the device has none left to give: as without them.
                Err(hal::Error::Unsupported(_)) => None,
                Err(e) => return Err(shared_pool::pool_error(e)),
            },
            None => None,
        };
        let admission = Admission::new(&config, pool.as_ref().map_or(0, |p| p.registered()));
        let listener = TcpListener::bind(addr).map_err(control::ControlError::from)?;
        let local = listener.local_addr().map_err(control::ControlError::from)?;
        // The control loop polls it with the pending handshakes and accepts until it would block.
        listener.set_nonblocking(true).map_err(control::ControlError::from)?;
        let workers = if config.workers == 0 {
            None
        } else {
            Some(
                WorkerGroup::new(WorkerConfig {
                    threads: config.workers,
                    mode: config.mode,
                    spin: config.spin,
                    pin: config.pin.clone(),
                    name: format!("bypass-{}", config.name),
                })
                .map_err(control::ControlError::from)?,
            )
        };
        let inner = Arc::new(ServerInner {
            device: device.clone(),
            config,
            pool,
            functions: Arc::new(functions),
            conns: Arc::new(SpinLock::new(Arc::new(Vec::new()))),
            admission: Arc::new(admission),
            counters: Arc::new(Counters::default()),
            next_channel: AtomicU32::new(1),
            shutdown: AtomicBool::new(false),
            addr: local,
            workers,
            tls_refusals: Default::default(),
            events: Arc::new(events),
        });
        let weak = Arc::downgrade(&inner);
        let acceptor = std::thread::Builder::new()
            .name("bypass-accept".into())
            .spawn(move || accept_loop(listener, weak))
            .map_err(control::ControlError::from)?;
        Ok(Server { inner, acceptor: Some(acceptor) })
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.inner.addr
    }

    /// Polls every connection once (for servers with `workers: 0`); returns completions handled.
    pub fn poll(&self) -> usize {
        let conns = Arc::clone(&lock(&self.inner.conns));
        conns.iter().map(|c| c.poll()).sum()
    }

    /// Connections currently open.
    pub fn connections(&self) -> usize {
        lock(&self.inner.conns).iter().filter(|c| !c.ep.is_closed()).count()
    }

    /// The counters of the server's worker threads (sleeps and wake-ups); all zero with
    /// `workers: 0`.
    pub fn worker_stats(&self) -> crate::WorkerStats {
        self.inner.workers.as_ref().map(WorkerGroup::stats).unwrap_or_default()
    }

    /// Bytes of registered buffers over all open connections (each at most
    /// [`ServerConfig::memory_limit`]), plus the shared receive pool's if there is one.
    pub fn registered_bytes(&self) -> u64 {
        let pool = self.inner.pool.as_ref().map_or(0, |p| p.registered());
        pool + lock(&self.inner.conns)
            .iter()
            .filter(|c| !c.ep.is_closed())
            .map(|c| c.ep.registered())
            .sum::<u64>()
    }

    /// Bytes of memory committed now, as counted against [`ServerConfig::max_memory`]: the
    /// shared receive pool's, and what each connection not yet let go of commits (its buffers,
    /// all of them, and its queue rings; see [`ServerConfig::memory_limit`]). Back to the pool's
    /// alone once every connection is closed and no handler holds one of their requests.
    pub fn committed_bytes(&self) -> u64 {
        self.inner.admission.committed()
    }

    /// Rendezvous counters, and the rendezvous memory held over all open connections.
    pub fn rndv_stats(&self) -> RndvStats {
        let in_use = lock(&self.inner.conns).iter().map(|c| c.rndv.in_use()).sum();
        self.inner.counters.rndv.snapshot(in_use)
    }

    /// Send contexts in use over all open connections (0 when idle: nothing leaked).
    pub fn tx_in_use(&self) -> usize {
        lock(&self.inner.conns).iter().map(|c| c.ep.tx.in_use()).sum()
    }

    /// The most recent (up to 64) client connections refused for TLS reasons: a plaintext
    /// client on a TLS server or the reverse, a client certificate refused (and why), a TLS
    /// handshake that failed. Each is also reported on stderr (the first 16, then every power
    /// of two); none contains a secret.
    pub fn tls_refusals(&self) -> Vec<crate::control::tls::TlsRefusal> {
        self.inner.tls_refusals.recent()
    }

    /// The counters.
    pub fn stats(&self) -> ServerStats {
        let c = &self.inner.counters;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ServerStats {
            connections: l(&c.connections),
            requests: l(&c.requests),
            responses: l(&c.responses),
            acks: l(&c.acks),
            unknown_functions: l(&c.unknown_functions),
            dropped: l(&c.dropped),
            grants: l(&c.grants),
            protocol_errors: l(&c.protocol_errors),
            failed_replies: l(&c.failed_replies),
            send_registrations_refused: l(&c.send_registrations_refused),
            handler_panics: l(&c.handler_panics),
            handshake_timeouts: l(&c.handshake_timeouts),
            accept_pauses: l(&c.accept_pauses),
            lingers: l(&c.lingers),
            linger_timeouts: l(&c.linger_timeouts),
            shared_recv_buffers: self.inner.pool.as_ref().map_or(0, |p| u64::from(p.buffers())),
            shared_recv_dry: self.inner.pool.as_ref().map_or(0, |p| p.dry()),
        }
    }

    /// Closes every connection (clients' outstanding calls fail with connection-closed), stops
    /// accepting and stops the workers.
    pub fn shutdown(&mut self) {
        if self.inner.shutdown.swap(true, Ordering::AcqRel) {
            return;
        }
        // Wake the control loop waiting in poll(2).
        let _ = TcpStream::connect_timeout(&self.inner.addr, Duration::from_secs(1));
        if let Some(t) = self.acceptor.take() {
            let _ = t.join();
        }
        // Closed outside the lock: each close runs the break callback.
        let conns = std::mem::take(&mut *lock(&self.inner.conns));
        let deadline = Instant::now() + LINGER;
        for c in conns.iter() {
            c.close_gracefully(deadline);
        }
    }
}

impl<D: Device + Clone> Drop for Server<D> {
    fn drop(&mut self) {
        self.shutdown();
    }
}
