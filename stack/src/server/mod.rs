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

use crate::conn::endpoint::Endpoint;
use crate::conn::shared_pool::{self, SharedPool};
use crate::conn::sizes::{buffer_bytes, fit_window, validate_queue_config, validate_sizes, Sizes};
use crate::control::liveness::{self, CloseReason, Keepalive, Live};
use crate::control::{self, ServerHello, CONTROL_VERSION};
use crate::core::tx_ctx::{CallMode, Event, FailReason, TxHandle};
use crate::error::bad_field;
use crate::hal::trace::{self, Arg, Track};
use crate::hal::{self, Completion, CompletionQueue, Device, QueueConfig};
use crate::limits::{DEFAULT_SHARED_RECV_BUFFERS, MAX_SHARED_RECV_BUFFERS};
use crate::limits::{MAX_REPOST_BATCH, MAX_WINDOW, MIN_MSG_SIZE};
use crate::sync::lock;
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

mod events;
mod monitor;
mod recovery;
pub use events::{Connection, ConnectionEvents};

const POLL_BATCH: usize = 16;

mod rndv;
pub use rndv::RndvStats;

/// A request handler. It owns the [`Request`]: reply before returning, or move it to another
/// thread and reply there later. Dropping it without replying drops the request cleanly.
///
/// A handler that panics fails only its own request: the worker catches the panic and goes on
/// serving, [`ServerStats::handler_panics`] counts it, and a request the handler still held
/// (dropped by the unwinding) is answered SERVER_DECLINE, which the caller sees as
/// [`RpcError::Status`]`(`[`Status::ServerDecline`]`)`. A reply already made stands; a request
/// already handed to another thread stays valid there.
pub type Handler<D> = Arc<dyn Fn(Request<D>) + Send + Sync + 'static>;

/// The function table: function id → handler.
pub struct Functions<D: Device + Clone> {
    map: HashMap<u64, Handler<D>>,
    /// Where rendezvous arguments and staged responses live (`None`: a pool per connection).
    rndv_alloc: Option<Arc<dyn crate::conn::rndv::RndvAllocator<D::Region>>>,
}

impl<D: Device + Clone> Default for Functions<D> {
    fn default() -> Self {
        Functions { map: HashMap::new(), rndv_alloc: None }
    }
}

impl<D: Device + Clone> std::fmt::Debug for Functions<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut ids: Vec<_> = self.map.keys().map(|&k| FunctionId::from_raw(k)).collect();
        ids.sort_by_key(|id| id.as_ref().map(|i| i.raw()).unwrap_or(0));
        f.debug_struct("Functions").field("ids", &ids).finish()
    }
}

impl<D: Device + Clone> Functions<D> {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `handler` for `id` (replacing an earlier one).
    pub fn register(
        &mut self,
        id: FunctionId,
        handler: impl Fn(Request<D>) + Send + Sync + 'static,
    ) -> &mut Self {
        self.map.insert(id.raw(), Arc::new(handler));
        self
    }

    /// Takes the memory for rendezvous arguments (the READ targets) and for staged large
    /// responses from `alloc` instead of the server's own pool (e.g. the C API's
    /// `OckRpcRndvMemAllocate` / `OckRpcRndvMemFree` hooks). Its regions must be registered on
    /// the server's device with `LOCAL_WRITE`. Every connection still charges what it takes
    /// against [`ServerConfig::rndv_memory_limit`].
    pub fn rndv_allocator(
        &mut self,
        alloc: Arc<dyn crate::conn::rndv::RndvAllocator<D::Region>>,
    ) -> &mut Self {
        self.rndv_alloc = Some(alloc);
        self
    }

    fn get(&self, id: FunctionId) -> Option<&Handler<D>> {
        self.map.get(&id.raw())
    }
}

/// How a [`Server`] is set up.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The server's name; clients must name it to connect.
    pub name: String,
    /// Largest message in bytes, header included.
    pub msg_size: usize,
    /// Largest window (receive buffers per queue) granted to a client.
    pub max_window: u32,
    /// Most queues one client may ask for.
    pub max_queues: usize,
    /// Polling threads. 0: none; the application calls [`Server::poll`] (e.g. in tests that step
    /// a simulated fabric by hand).
    pub workers: usize,
    /// How the workers poll: [`PollMode::Adaptive`] by default (spin for `spin` after the last
    /// completion, then sleep on the CQs' event fds); [`PollMode::Busy`] never sleeps.
    pub mode: PollMode,
    /// [`PollMode::Adaptive`]: how long a worker spins after its last completion before it
    /// sleeps (default [`crate::DEFAULT_SPIN`]).
    pub spin: Duration,
    /// CPUs to pin the workers to (empty: no pinning).
    pub pin: Vec<usize>,
    /// Limit for one client's handshake: its hello must arrive within it, and the answer be
    /// written within another. Handshakes run concurrently: a slow or silent client delays no
    /// other and is dropped when its time is up ([`ServerStats::handshake_timeouts`]).
    pub handshake_timeout: Duration,
    /// Most bytes of registered buffer memory per connection: queues × (send contexts + receive
    /// buffers per queue) × `msg_size`, with 3 × window and window + min(16, window) per queue
    /// (no receive buffers with the shared receive pool, [`RecvBuffers::Shared`], whose size
    /// this also caps).
    /// A client's window is scaled down until its connection fits; a client whose queues do not
    /// fit even at a window of 1 is refused with a reason naming this field, and a config whose
    /// single queue does not fit is refused by [`Server::bind`]. Default
    /// [`DEFAULT_MEMORY_LIMIT`](crate::DEFAULT_MEMORY_LIMIT) (256 MiB).
    pub memory_limit: u64,
    /// Most bytes of rendezvous memory one connection may hold at once: gathered arguments
    /// being READ or handled, and staged large responses being written. A request whose
    /// arguments exceed it alone is answered REMOTE_LEN_ERR without any allocation; one that
    /// fits but finds the memory held by the connection's other requests waits for it. 0
    /// disables rendezvous (every such request gets REMOTE_LEN_ERR); otherwise at least 4096.
    /// Default [`DEFAULT_RNDV_MEMORY_LIMIT`](crate::DEFAULT_RNDV_MEMORY_LIMIT) (256 MiB).
    pub rndv_memory_limit: u64,
    /// Where requests are received: by default into one pool of
    /// [`DEFAULT_SHARED_RECV_BUFFERS`] buffers shared by every connection
    /// ([`RecvBuffers::Shared`]), so an idle connection holds no receive buffer; or into
    /// buffers of each connection's own ([`RecvBuffers::PerConnection`], `window + min(16,
    /// window)` per queue). A device without shared receive queues
    /// ([`DeviceCaps::max_shared_recv`](hal::DeviceCaps::max_shared_recv) 0, e.g. `urma`) always
    /// uses per-connection buffers. See [`RecvBuffers`].
    pub recv_buffers: RecvBuffers,
    /// Transport settings of the queues. The depths and SGE limits are replaced by the stack's
    /// own (derived from the window), but zero is refused. An ACK timeout of exponent 0
    /// ([`hal::AckTimeout::NONE`]) means no retransmission timer, as on hardware (see
    /// [`ChannelConfig::queue_config`](crate::ChannelConfig::queue_config)).
    pub queue_config: QueueConfig,
    /// TLS 1.3 on the control connections, required of every client (mutual: each client must
    /// present a certificate the CA bundle vouches for; it needs a certificate chain and key of
    /// its own). `None`: plain TCP, and TLS clients are refused ([`crate::control::tls`]).
    pub tls: Option<crate::control::tls::TlsConfig>,
    /// Keepalive (see [`Keepalive`]): once a client has sent its first keepalive probe (which
    /// announces its own settings), a connection that received nothing for the larger of
    /// `interval × misses` and the client's `interval × (misses + 1)` is closed as broken
    /// ([`CloseReason::KeepaliveTimeout`]). The server answers probes whatever this is. `None`:
    /// only the control stream's closure (and queue errors) end connections. Default 1 s × 5.
    /// The data path must be polled for traffic to count: with `workers: 0`, call
    /// [`Server::poll`] more often than that.
    pub keepalive: Option<Keepalive>,
}

/// Where a server's connections receive their requests ([`ServerConfig::recv_buffers`]).
///
/// With a shared pool, credits stay per connection (each client's window), but the buffers are
/// not reserved: when more requests arrive at once than the pool has buffers posted, the
/// server's NIC answers "receiver not ready" (RNR) and the client's NIC resends after the
/// server's `queue_config.min_rnr_timer` (default about 100 µs), as often as the client's
/// `queue_config.rnr_retry` allows. With the default `rnr_retry = 7` that is forever, so a burst
/// only waits; a client configured with a finite `rnr_retry = n` fails the queue
/// (`RnrRetryExceeded`, then recovery) if buffers stay short for more than `n` timer periods.
/// Size the pool for the requests that are in progress at once (received and not yet answered,
/// including those a handler keeps), not for the sum of the windows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecvBuffers {
    /// One pool of `buffers` buffers of `msg_size` bytes for all connections (1..=2^20; scaled
    /// down to what fits [`ServerConfig::memory_limit`], the device's largest shared receive
    /// queue and its largest registration). [`Server::stats`] reports the pool's size and how
    /// often it ran dry.
    Shared {
        /// Buffers in the pool.
        buffers: u32,
    },
    /// Each connection's queues get buffers of their own: `window + min(16, window)` each.
    PerConnection,
}

impl Default for RecvBuffers {
    fn default() -> Self {
        RecvBuffers::Shared { buffers: DEFAULT_SHARED_RECV_BUFFERS }
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            name: String::new(),
            msg_size: 4096,
            max_window: 128,
            max_queues: 64,
            workers: 1,
            mode: PollMode::default(),
            spin: crate::worker::DEFAULT_SPIN,
            pin: Vec::new(),
            handshake_timeout: Duration::from_secs(5),
            memory_limit: crate::limits::DEFAULT_MEMORY_LIMIT,
            rndv_memory_limit: crate::limits::DEFAULT_RNDV_MEMORY_LIMIT,
            recv_buffers: RecvBuffers::default(),
            queue_config: QueueConfig::default(),
            tls: None,
            keepalive: Some(Keepalive::default()),
        }
    }
}

impl ServerConfig {
    /// Defaults, with this name.
    pub fn new(name: impl Into<String>) -> Self {
        ServerConfig { name: name.into(), ..Default::default() }
    }

    /// Checks every field against the protocol's limits and the device's `caps`, as
    /// [`Server::bind`] does before it binds. The error ([`RpcError::InvalidArgument`]) names
    /// the field, e.g. `ServerConfig.max_window is 0: ...`. A single-queue connection at
    /// `max_window` must fit the device; a client asking for more queues than the device can
    /// serve at its window is refused when it connects, with the reason.
    pub fn validate(&self, caps: &hal::DeviceCaps) -> Result<(), RpcError> {
        const C: &str = "ServerConfig";
        let field = |name: &str| format!("{C}.{name}");
        if self.name.len() > control::MAX_NAME_LEN {
            return Err(bad_field(
                &field("name"),
                format_args!("is {} bytes: at most {}", self.name.len(), control::MAX_NAME_LEN),
            ));
        }
        if self.msg_size < MIN_MSG_SIZE || self.msg_size as u64 > u64::from(caps.max_msg_size) {
            return Err(bad_field(
                &field("msg_size"),
                format_args!(
                    "is {}: use {MIN_MSG_SIZE}..={} (the smallest a client accepts, and the device's largest \
                     message; the header is included)",
                    self.msg_size, caps.max_msg_size
                ),
            ));
        }
        if !(1..=MAX_WINDOW).contains(&self.max_window) {
            return Err(bad_field(
                &field("max_window"),
                format_args!("is {}: use 1..={MAX_WINDOW}", self.max_window),
            ));
        }
        if !(1..=control::MAX_QUEUES).contains(&self.max_queues) {
            return Err(bad_field(
                &field("max_queues"),
                format_args!("is {}: use 1..={}", self.max_queues, control::MAX_QUEUES),
            ));
        }
        let cpus = crate::os::MAX_CPUS;
        if let Some(&cpu) = self.pin.iter().find(|&&c| c >= cpus) {
            return Err(bad_field(&field("pin"), format_args!("names CPU {cpu}: CPUs are 0..{cpus}")));
        }
        if self.handshake_timeout.is_zero() {
            return Err(bad_field(
                &field("handshake_timeout"),
                "is zero (every client would be refused): use a positive duration",
            ));
        }
        if self.rndv_memory_limit != 0 && self.rndv_memory_limit < 4096 {
            return Err(bad_field(
                &field("rndv_memory_limit"),
                format_args!("is {}: use 0 (no rendezvous) or at least 4096", self.rndv_memory_limit),
            ));
        }
        if let RecvBuffers::Shared { buffers } = self.recv_buffers {
            if !(1..=MAX_SHARED_RECV_BUFFERS).contains(&buffers) {
                return Err(bad_field(
                    &field("recv_buffers"),
                    format_args!(
                        "is Shared {{ buffers: {buffers} }}: use 1..={MAX_SHARED_RECV_BUFFERS} buffers, \
                         or RecvBuffers::PerConnection"
                    ),
                ));
            }
        }
        validate_queue_config(&field("queue_config"), &self.queue_config, caps)?;
        if self.tls.as_ref().is_some_and(|t| !t.has_identity()) {
            return Err(bad_field(
                &field("tls"),
                "has no certificate chain and private key: a TLS server must present one \
                 (TlsConfigBuilder::cert_chain, private_key)",
            ));
        }
        if let Some(k) = &self.keepalive {
            k.validate(&field("keepalive"))?;
        }
        // The device's limits apply to `max_window`; the memory limit may scale it down.
        self.fitted_window(1, self.max_window, self.shared_buffers(caps).is_some())?;
        let (send, recv, _) = server_depths(self.max_window);
        validate_sizes(
            "use a smaller ServerConfig.max_window or ServerConfig.msg_size",
            1,
            send,
            recv,
            self.msg_size,
            caps,
        )
    }
}

impl ServerConfig {
    /// The size of the shared receive pool this config asks for on a device with `caps`
    /// (fitted, see [`RecvBuffers::Shared`]), or `None` for per-connection buffers.
    fn shared_buffers(&self, caps: &hal::DeviceCaps) -> Option<u32> {
        match self.recv_buffers {
            RecvBuffers::Shared { buffers } if caps.max_shared_recv > 0 => {
                Some(shared_pool::fitted_buffers(buffers, self.msg_size, self.memory_limit, caps))
            }
            _ => None,
        }
    }

    /// The window for a connection of `queues` queues asking for `window` (already clamped to
    /// `max_window`), scaled down until its buffers fit `memory_limit` (only send buffers when
    /// it receives from a `shared` pool).
    fn fitted_window(&self, queues: usize, window: u32, shared: bool) -> Result<u32, RpcError> {
        let depths = |w| {
            let (s, r, _) = server_depths(w);
            (s, if shared { 0 } else { r })
        };
        fit_window(window, queues, self.msg_size, self.memory_limit, depths).ok_or_else(|| {
            bad_field(
                "ServerConfig.memory_limit",
                format_args!(
                    "is {} bytes, but {queues} queue(s) of {}-byte messages need {} bytes of registered buffers \
                     even at a window of 1: raise ServerConfig.memory_limit, or use a smaller \
                     ServerConfig.msg_size (or fewer queues)",
                    self.memory_limit,
                    self.msg_size,
                    buffer_bytes(queues, depths(1), self.msg_size)
                ),
            )
        })
    }
}

/// Per queue: the server's send contexts, receive buffers and re-post batch for `window`. The
/// server sends at most one ACK and one response per outstanding request, plus credit grants:
/// three windows of send contexts; it receives at most `window` requests, plus re-post slack.
fn server_depths(window: u32) -> (u32, u32, usize) {
    let repost_batch = MAX_REPOST_BATCH.min(window as usize);
    (3 * window, window + repost_batch as u32, repost_batch)
}

/// Counters of a server (all connections).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServerStats {
    /// Connections accepted.
    pub connections: u64,
    /// Requests received.
    pub requests: u64,
    /// Responses sent.
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

thread_local! {
    /// The connection this thread's worker is dispatching (its address), 0 if none. While it is
    /// set, that connection's ACKs, responses and credit grants are collected and posted at the
    /// end of the worker's pass, one doorbell per queue instead of one per message.
    static IN_DISPATCH: Cell<usize> = const { Cell::new(0) };
}

/// Sends collected during a worker pass.
struct Outbox {
    items: [(TxHandle, u32); MAX_REPOST_BATCH],
    len: usize,
}

impl Default for Outbox {
    fn default() -> Self {
        Outbox { items: [(TxHandle::from_u64(0), 0); MAX_REPOST_BATCH], len: 0 }
    }
}

/// One client's connection on the server.
pub(crate) struct Conn<D: Device + Clone> {
    ep: Endpoint<D>,
    channel_id: u32,
    client_info: String,
    client_msg: usize,
    functions: Arc<Functions<D>>,
    counters: Arc<Counters>,
    grants: Box<[AtomicU32]>,
    outbox: Box<[Mutex<Outbox>]>,
    window: u32,
    control: Mutex<Option<TcpStream>>,
    /// Keepalive state, close reason and the application's context.
    live: Live,
    /// This connection (for the connection events, which get a [`Connection`]).
    me: Weak<Conn<D>>,
    events: Arc<ConnectionEvents<D>>,
    /// The new-connection callback accepted it (so the break callback runs when it closes).
    accepted: AtomicBool,
    rndv: rndv::ConnRndv<D>,
}

/// A request being handled. Read its arguments with [`Request::args`]; answer with
/// [`Request::reply`] (or [`Request::reply_with`], [`Request::reply_status`]) on any thread.
/// Dropped without a reply, it is dropped cleanly: its buffer is re-posted and its credit
/// returned, and a client waiting for a response gets it only as a timeout.
pub struct Request<D: Device + Clone> {
    conn: Arc<Conn<D>>,
    buf: u32,
    queue: usize,
    /// The queue's life it arrived in (a request of an earlier life gets no reply).
    epoch: u32,
    args: (u32, u32),
    header: RequestHeader,
    done: bool,
    /// Rendezvous state: gathered arguments, the client's response buffer (`None`: eager).
    rndv: Option<Box<rndv::ReqRndv<D::Region>>>,
}

impl<D: Device + Clone> std::fmt::Debug for Request<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request")
            .field("function", &self.header.function)
            .field("req_id", &self.header.req_id)
            .field("channel", &self.header.channel)
            .field("args", &(self.args.1 as usize))
            .finish()
    }
}

impl<D: Device + Clone> Request<D> {
    /// The function called.
    pub fn function(&self) -> FunctionId {
        self.header.function
    }

    /// The request id (unique among the client's outstanding calls).
    pub fn req_id(&self) -> u32 {
        self.header.req_id
    }

    /// The client's channel id.
    pub fn channel_id(&self) -> u32 {
        self.conn.channel_id
    }

    /// The info string the client sent when it connected.
    pub fn client_info(&self) -> &str {
        &self.conn.client_info
    }

    /// The connection's context value ([`Connection::set_context`]; 0 until set).
    pub fn context(&self) -> u64 {
        self.conn.live.context.load(Ordering::Acquire)
    }

    /// The connection the request came on (e.g. to read or set its context, or close it).
    pub fn connection(&self) -> Connection<D> {
        Connection { conn: self.conn.clone() }
    }

    /// Whether the client waits for a response (`WAIT_RSP` and `ACK` modes). For the other
    /// modes a reply sends nothing.
    pub fn wants_response(&self) -> bool {
        !self.header.no_response
    }

    /// Largest response data: what fits the client's message size, or the client's response
    /// buffer if it named a larger one (rendezvous response).
    pub fn max_response(&self) -> usize {
        self.inline_max().max(self.response_capacity().unwrap_or(0))
    }

    /// Largest response data sent inline (after the rendezvous prefix, if the request has one).
    fn inline_max(&self) -> usize {
        self.conn.client_msg.min(self.conn.ep.msg_size) - ResponseHeader::LEN - self.prefix_len()
    }

    fn prefix_len(&self) -> usize {
        if self.header.response_descriptor {
            wire::RNDV_PREFIX_LEN
        } else {
            0
        }
    }

    /// The arguments: inline, borrowed from the receive buffer (no copy), or for a rendezvous
    /// request the gathered bytes the server READ (see [`Request::segments`]).
    pub fn args(&self) -> &[u8] {
        if let Some(a) = self.rndv_args() {
            return a;
        }
        self.inline_args()
    }

    /// The inline arguments (after the descriptors) of the request message.
    pub fn inline_args(&self) -> &[u8] {
        let (off, len) = self.args;
        // SAFETY: this request owns receive buffer `buf` until it is re-posted, which happens
        // only when the request is consumed (reply or drop), after every borrow of `self` ends.
        let bytes = unsafe { self.conn.ep.recv_bytes(self.buf, (off + len) as usize) };
        &bytes[off as usize..]
    }

    /// Replies SUCCESS with `data`.
    pub fn reply(self, data: &[u8]) -> Result<(), RpcError> {
        self.reply_status(Status::Success, data)
    }

    /// Replies with `status` and `data`.
    pub fn reply_status(self, status: Status, data: &[u8]) -> Result<(), RpcError> {
        if self.wants_large_reply(data.len()) {
            return rndv::reply_large(self, status, rndv::Source::Copy(data));
        }
        self.reply_with(status, |_, out| {
            out.get_mut(..data.len()).map(|o| o.copy_from_slice(data)).map(|()| data.len()).ok_or(data.len())
        })
    }

    /// Replies with `status` and data written by `fill(args, out)` straight into the send buffer
    /// (no intermediate copy): `fill` returns the bytes written, or `Err(needed)` if `out` is too
    /// small, which sends REMOTE_LEN_ERR instead and returns [`RpcError::TooLarge`].
    ///
    /// If `fill` panics, the request is answered SERVER_DECLINE (its buffer and send context go
    /// back as for any reply) and the panic then continues.
    pub fn reply_with(
        mut self,
        status: Status,
        fill: impl FnOnce(&[u8], &mut [u8]) -> Result<usize, usize>,
    ) -> Result<(), RpcError> {
        self.respond(status, fill)
    }

    /// Every reply, and the SERVER_DECLINE of a request dropped by a panic. Marks the request
    /// done first: it is consumed exactly once.
    fn respond(
        &mut self,
        status: Status,
        fill: impl FnOnce(&[u8], &mut [u8]) -> Result<usize, usize>,
    ) -> Result<(), RpcError> {
        self.done = true;
        let conn = &self.conn;
        if self.stale() {
            // Its queue was recovered since: the client failed this call already, and the
            // buffer (but no credit) belongs to the queue's new life.
            conn.release(self.queue, self.buf, false);
            bump(&conn.counters.failed_replies);
            return Err(RpcError::Queue(hal::Status::Flushed));
        }
        if self.header.no_response {
            conn.release(self.queue, self.buf, true);
            return Ok(());
        }
        let tx = match conn.acquire_tx() {
            Ok(tx) => tx,
            Err(e) => {
                conn.release(self.queue, self.buf, true);
                bump(&conn.counters.failed_replies);
                return Err(e);
            }
        };
        let prefix = self.prefix_len();
        let limit = self.inline_max() + ResponseHeader::LEN;
        // SAFETY: `tx` is live, ours, not posted; no other reference to its buffer exists.
        let out = unsafe { conn.ep.send_buf(tx) };
        let out = &mut out[..limit + prefix];
        let (header_bytes, body) = out.split_at_mut(ResponseHeader::LEN);
        // A rendezvous request's response starts with the written length: 0, the data is inline.
        let (prefix_bytes, body) = body.split_at_mut(prefix);
        prefix_bytes.fill(0);
        // `fill` is the caller's code: if it panics, the context and the buffer must still go
        // back, so the panic is held until the request has been answered. AssertUnwindSafe:
        // after a panic `body` is not read (the response carries no data).
        let args = self.args();
        let filled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| fill(args, body)));
        let mut panicked = None;
        let (status, len, result) = match filled {
            Ok(Ok(n)) if n <= limit - ResponseHeader::LEN => (status, n, Ok(())),
            Ok(Ok(n) | Err(n)) => (
                Status::RemoteLenErr,
                0,
                Err(RpcError::TooLarge {
                    len: n + ResponseHeader::LEN,
                    max: limit,
                    header: ResponseHeader::LEN,
                }),
            ),
            Err(payload) => {
                panicked = Some(payload);
                (Status::ServerDecline, 0, Ok(()))
            }
        };
        let header = ResponseHeader {
            ack: false,
            status,
            req_id_range: wire::REQ_ID_RANGE_SINGLE,
            req_id: self.header.req_id,
            channel: conn.channel_id,
            function_defined: self.header.function_defined,
            total_size: (ResponseHeader::LEN + prefix + len) as u32,
        };
        let sent = if let Err(e) = header.encode(header_bytes) {
            conn.release(self.queue, self.buf, true);
            conn.drop_tx(tx);
            Err(RpcError::InvalidArgument(format!("cannot encode the response: {e}")))
        } else {
            // The response returns the credit: the buffer must be posted again first.
            conn.release(self.queue, self.buf, false);
            if trace::is_enabled() {
                let args = [
                    ("req_id", self.header.req_id.into()),
                    ("status", status_name(status).into()),
                    ("len", len.into()),
                    ("now", (!conn.dispatching()).into()),
                ];
                trace("reply", &args);
            }
            match conn.send(self.queue, tx, ResponseHeader::LEN + prefix + len) {
                Ok(()) => {
                    bump(&conn.counters.responses);
                    result
                }
                Err(e) => {
                    bump(&conn.counters.failed_replies);
                    Err(e)
                }
            }
        };
        if let Some(payload) = panicked {
            std::panic::resume_unwind(payload);
        }
        sent
    }
}

impl<D: Device + Clone> Drop for Request<D> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        if std::thread::panicking() {
            // Dropped by a panic (its handler's, or that of a thread it was handed to): answer
            // SERVER_DECLINE now rather than let the caller wait out its deadline. Nothing here
            // panics, so this is safe during unwinding.
            if trace::is_enabled() {
                trace("request declined (panic)", &[("req_id", self.header.req_id.into())]);
            }
            let _ = self.respond(Status::ServerDecline, |_, _| Ok(0));
            return;
        }
        if trace::is_enabled() {
            trace("request dropped", &[("req_id", self.header.req_id.into())]);
        }
        bump(&self.conn.counters.dropped);
        let grant = !self.stale();
        self.conn.release(self.queue, self.buf, grant);
    }
}

impl<D: Device + Clone> Request<D> {
    /// Whether the request's queue was recovered since it arrived.
    fn stale(&self) -> bool {
        self.conn.ep.queues[self.queue].epoch.load(Ordering::Acquire) != self.epoch
    }
}

impl<D: Device + Clone> Conn<D> {
    /// Re-posts receive buffer `buf` (of a request that came on queue `q`); with `grant`, its
    /// credit goes back in a credit grant.
    fn release(&self, q: usize, buf: u32, grant: bool) {
        self.ep.repost(buf);
        if grant {
            self.grants[q].fetch_add(1, Ordering::AcqRel);
            if !self.dispatching() {
                self.flush_grants(q);
            }
        }
    }

    fn flush_grants(&self, q: usize) {
        let n = self.grants[q].swap(0, Ordering::AcqRel);
        if n == 0 {
            return;
        }
        if trace::is_enabled() {
            trace(
                "grant",
                &[("credits", n.into()), ("queue", q.into()), ("now", (!self.dispatching()).into())],
            );
        }
        if self.send_small(q, |out| AckHeader::credit_grant(n, self.channel_id).encode(out)).is_ok() {
            bump(&self.counters.grants);
        } else if !self.ep.is_closed() {
            self.grants[q].fetch_add(n, Ordering::AcqRel);
        }
    }

    /// Sends a message built by `encode` on queue `q`.
    fn send_small(
        &self,
        q: usize,
        encode: impl FnOnce(&mut [u8]) -> Result<usize, wire::WireError>,
    ) -> Result<(), RpcError> {
        let tx = self.acquire_tx()?;
        // SAFETY: `tx` is live, ours, not posted; no other reference to its buffer exists.
        let out = unsafe { self.ep.send_buf(tx) };
        let len = match encode(out) {
            Ok(len) => len,
            Err(e) => {
                self.drop_tx(tx);
                return Err(RpcError::InvalidArgument(e.to_string()));
            }
        };
        self.send(q, tx, len)
    }

    fn dispatching(&self) -> bool {
        IN_DISPATCH.with(Cell::get) == self as *const Self as usize
    }

    /// Posts `tx` (its first `len` bytes) on queue `q`: at once, or at the end of the worker's
    /// pass if this thread is dispatching this connection. On error the context is released.
    fn send(&self, q: usize, tx: TxHandle, len: usize) -> Result<(), RpcError> {
        if !self.dispatching() {
            // What the worker collected for this queue (an ACK of this very request, perhaps)
            // goes first.
            self.flush_outbox(q);
            return self.ep.post_send(q, tx, len).inspect_err(|_| self.drop_tx(tx));
        }
        let full = {
            let mut out = lock(&self.outbox[q]);
            let n = out.len;
            out.items[n] = (tx, len as u32);
            out.len += 1;
            out.len == MAX_REPOST_BATCH
        };
        if full {
            self.flush_outbox(q);
        }
        Ok(())
    }

    fn flush_outbox(&self, q: usize) {
        let (items, n) = {
            let mut out = lock(&self.outbox[q]);
            (out.items, std::mem::take(&mut out.len))
        };
        let posted = match n {
            0 => return,
            1 => self.ep.post_send(q, items[0].0, items[0].1 as usize),
            _ => self.ep.post_sends(q, &items[..n]),
        };
        if posted.is_err() {
            for &(tx, _) in &items[..n] {
                self.drop_tx(tx);
                bump(&self.counters.failed_replies);
            }
        }
    }

    /// A send context; if all are in flight, collects send completions until one comes back.
    fn acquire_tx(&self) -> Result<TxHandle, RpcError> {
        let mut spins = 0u32;
        loop {
            // Reap before a new chunk of send buffers is registered on the reply path.
            if self.ep.tx_would_grow() && self.poll_send() > 0 {
                continue;
            }
            if let Some(tx) = self.ep.get_tx(CallMode::EarlyRsp, 0)? {
                return Ok(tx);
            }
            if self.ep.is_closed() {
                return Err(RpcError::Closed);
            }
            if self.poll_send() == 0 {
                spins += 1;
                if spins % 64 == 0 {
                    self.ep.device.progress();
                    std::thread::yield_now();
                }
            }
        }
    }

    /// Releases a context that was never posted.
    fn drop_tx(&self, tx: TxHandle) {
        let _ = self.ep.tx.fail(tx, FailReason::SendError);
    }

    fn poll_send(&self) -> usize {
        let mut wc = [Completion::default(); POLL_BATCH];
        let n = self.ep.poll_send(&mut wc);
        for c in &wc[..n] {
            let tx = TxHandle::from_u64(c.wr_id & !rndv::RNDV_TAG);
            if c.wr_id & rndv::RNDV_TAG != 0 {
                self.rndv_completed(tx.index, c.status);
            }
            if c.status.is_ok() {
                let _ = self.ep.tx.complete(tx, Event::SendCqe);
            } else if let Some(q) = crate::conn::recovery::drain_queue(c.wr_id) {
                self.ep.mark_drained(q, false);
            } else {
                let reason = if c.status == hal::Status::Flushed {
                    FailReason::Flushed
                } else {
                    FailReason::SendError
                };
                let _ = self.ep.tx.fail(tx, reason);
                if let Some(q) = self.ep.queue_index(c.qpn) {
                    self.queue_failed(q);
                }
            }
        }
        self.rndv_poll();
        n
    }

    fn protocol_error(&self, what: &dyn std::fmt::Display) {
        let n = self.counters.protocol_errors.fetch_add(1, Ordering::Relaxed);
        if n < 16 || n.is_power_of_two() {
            eprintln!(
                "bypass: dropped a malformed message on channel {} ({what}); {} so far",
                self.channel_id,
                n + 1
            );
        }
    }

    fn poll(self: &Arc<Self>) -> usize {
        let mut wc = [Completion::default(); POLL_BATCH];
        let n = self.ep.poll_recv(&mut wc);
        if n > 0 {
            self.live.mark_heard();
            let outer = IN_DISPATCH.with(|d| d.replace(Arc::as_ptr(self) as usize));
            for c in &wc[..n] {
                self.on_recv(c);
            }
            for q in 0..self.grants.len() {
                self.flush_grants(q);
                self.flush_outbox(q);
            }
            IN_DISPATCH.with(|d| d.set(outer));
        }
        n + self.poll_send()
    }

    fn on_recv(self: &Arc<Self>, c: &Completion) {
        if !self.ep.is_buf(c.wr_id) {
            if let Some(q) = crate::conn::recovery::drain_queue(c.wr_id) {
                return self.ep.mark_drained(q, true);
            }
            return self.protocol_error(&format_args!("a receive completion with unknown wr_id {}", c.wr_id));
        }
        let buf = c.wr_id as u32;
        let Some(queue) = self.ep.recv_queue(c) else {
            // A qpn of none of our queues (shared path): the buffer is ours all the same.
            self.protocol_error(&format_args!("a receive completion from unknown queue {}", c.qpn));
            return self.ep.repost(buf);
        };
        if !c.status.is_ok() {
            self.queue_failed(queue);
            // Kept for the queue's recovery.
            return self.ep.park(buf);
        }
        // SAFETY: the completion hands `buf` to us; it is re-posted (by `release` or by the
        // `Request` built below) only after `bytes` is last used.
        let bytes = unsafe { self.ep.recv_bytes(buf, c.byte_len as usize) };
        let view = match wire::parse(bytes) {
            Ok(Parsed::Request(v)) if v.header.channel == self.channel_id => v,
            Ok(Parsed::Request(v)) => {
                self.protocol_error(&format_args!("a request for channel {}", v.header.channel));
                return self.release(queue, buf, true);
            }
            Ok(other) => {
                self.protocol_error(&format_args!("a {:?} sent to a server", other.msg_type()));
                return self.release(queue, buf, true);
            }
            Err(e) => {
                self.protocol_error(&e);
                return self.release(queue, buf, true);
            }
        };
        bump(&self.counters.requests);
        let header = view.header;
        let traced_at = trace::stamp();
        if header.ack_requested {
            if traced_at != 0 {
                trace("ack", &[("req_id", header.req_id.into()), ("queue", queue.into())]);
            }
            let ack = AckHeader::new(header.req_id, self.channel_id);
            if self.send_small(queue, |out| ack.encode(out)).is_ok() {
                bump(&self.counters.acks);
            }
        }
        let args = ((bytes.len() - view.args.len()) as u32, view.args.len() as u32);
        let epoch = self.ep.queues[queue].epoch.load(Ordering::Acquire);
        let request =
            Request { conn: self.clone(), buf, queue, epoch, args, header, done: false, rndv: None };
        if liveness::is_probe(header.function) {
            return self.on_probe(request);
        }
        if header.arg_dma_count > 0 {
            // Rendezvous: the handler runs once the arguments are pulled (`rndv.rs`).
            return self.rndv_start(request, view.descriptors);
        }
        self.dispatch(request);
        if traced_at != 0 && trace::is_enabled() {
            let args = [
                ("function", header.function.raw().into()),
                ("req_id", header.req_id.into()),
                ("channel", self.channel_id.into()),
                ("queue", queue.into()),
            ];
            trace::span(TRACK, "request", traced_at, &args);
        }
    }

    /// Runs the handler of `request` (or answers FUNCTION_ERR).
    fn dispatch(self: &Arc<Self>, request: Request<D>) {
        let header = request.header;
        match self.functions.get(header.function) {
            Some(handler) => {
                // A panicking handler must not take the worker (and every connection on it)
                // down. AssertUnwindSafe: the request is the only state the handler gets from
                // us, and it is consistent whatever the handler did with it — still held (its
                // drop during the unwind answers SERVER_DECLINE), replied to, or moved away.
                // No cost unless it panics.
                if let Err(payload) =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| handler(request)))
                {
                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(payload)));
                    self.handler_panicked(&header);
                }
            }
            None => {
                bump(&self.counters.unknown_functions);
                let _ = request.reply_status(Status::FunctionErr, &[]);
            }
        }
    }

    #[cold]
    fn handler_panicked(&self, header: &RequestHeader) {
        let n = self.counters.handler_panics.fetch_add(1, Ordering::Relaxed);
        if n < 16 || n.is_power_of_two() {
            eprintln!(
                "bypass: the handler of function {} panicked (request {} on channel {}); contained: a request \
                 it still held was answered SERVER_DECLINE and the worker goes on; {} so far",
                header.function,
                header.req_id,
                self.channel_id,
                n + 1
            );
        }
    }

    /// A keepalive probe: the stack answers it (its arguments announce the client's settings).
    #[cold]
    fn on_probe(&self, request: Request<D>) {
        self.live.on_probe(request.args());
        if self.live.ignore_probes.load(Ordering::Relaxed) {
            return drop(request); // test hook: a peer that stops answering
        }
        let _ = request.reply(&[]);
    }

    /// A queue failed. The connection stays open even with no queue left: the client recovers
    /// its queues (a queue reset on the control stream) or closes the connection.
    fn queue_failed(&self, q: usize) {
        self.ep.fail_queue(q);
    }

    fn close(&self) {
        self.close_with(CloseReason::Local);
    }

    /// A close the application asked for (server shutdown, [`Connection::close`]): replies
    /// already posted are given until `deadline` to be acknowledged by the client before the
    /// queues are failed, so a handler that answers and then shuts the server down is heard.
    /// (Failing a queue discards what it has not sent, as destroying a QP does.)
    /// [`ServerStats::lingers`] and [`ServerStats::linger_timeouts`] count them.
    ///
    /// Replies a handler on this thread has produced but the pass has not posted yet (the
    /// outbox: a handler that answers and then closes its own connection) are posted first.
    /// The wait polls send completions only: it runs no handler for requests that arrive
    /// meanwhile, so a busy connection's close is not held up by its own traffic.
    fn close_gracefully(self: &Arc<Self>, deadline: Instant) {
        if !self.ep.is_closed() {
            for q in 0..self.grants.len() {
                self.flush_grants(q);
                self.flush_outbox(q);
            }
        }
        let waiting = || self.ep.tx.in_use() > 0 && !self.ep.is_closed();
        if waiting() {
            bump(&self.counters.lingers);
            while waiting() && Instant::now() < deadline {
                if self.poll_send() == 0 {
                    self.ep.device.progress();
                    std::thread::yield_now();
                }
            }
            if waiting() {
                bump(&self.counters.linger_timeouts);
            }
        }
        self.close();
    }

    /// Closes the connection for `reason` (the first close's reason stands); the break callback
    /// runs once, for a connection the new-connection callback accepted.
    fn close_with(&self, reason: CloseReason) {
        // Before the connection is marked closed, so that a closed connection always tells why
        // (`close_reason` reads it only once it is closed); the first reason stands.
        let reason = self.live.set_reason(reason);
        if !self.ep.mark_closed() {
            return;
        }
        for q in 0..self.ep.queues.len() {
            self.ep.fail_queue(q);
        }
        // Shared path: requests still in the receive CQ give their buffers back to the pool now
        // (the rest, if another thread is polling, when the endpoint is dropped).
        self.ep.reclaim_shared();
        if let Some(s) = lock(&self.control).take() {
            let _ = s.shutdown(Shutdown::Both);
        }
        self.rndv_close();
        if self.accepted.load(Ordering::Acquire) {
            self.fire_break(reason);
        }
    }
}

/// `Pollable` for a connection (a worker holds `Arc<ConnHandle>`).
struct ConnHandle<D: Device + Clone>(Arc<Conn<D>>);

impl<D: Device + Clone> Pollable for ConnHandle<D> {
    fn poll(&self) -> usize {
        self.0.poll()
    }

    fn progress(&self) {
        self.0.ep.device.progress();
    }

    fn is_closed(&self) -> bool {
        self.0.ep.is_closed()
    }

    fn arm(&self) -> bool {
        let send = lock(&self.0.ep.send_cq).arm(hal::ArmMode::Any).is_ok();
        let recv = lock(&self.0.ep.recv_cq).arm(hal::ArmMode::Any).is_ok();
        send && recv
    }

    fn event_fds(&self, out: &mut Vec<RawFd>) {
        out.push(lock(&self.0.ep.send_cq).event_fd());
        out.push(lock(&self.0.ep.recv_cq).event_fd());
    }

    fn ack_events(&self) {
        let _ = lock(&self.0.ep.send_cq).ack_events();
        let _ = lock(&self.0.ep.recv_cq).ack_events();
    }
}

struct ServerInner<D: Device + Clone> {
    device: D,
    config: ServerConfig,
    /// The shared receive pool of every connection (`None`: per-connection buffers).
    pool: Option<Arc<SharedPool<D>>>,
    functions: Arc<Functions<D>>,
    /// The open connections, copy-on-write: [`Server::poll`] takes a snapshot with one `Arc`
    /// clone (no allocation per poll); accepting a connection copies the list only while a
    /// poll holds the previous snapshot.
    conns: Mutex<Arc<Vec<Arc<Conn<D>>>>>,
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
            conns: Mutex::new(Arc::new(Vec::new())),
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

/// How long a server shutdown or an application's close of a connection waits, at most, for
/// the replies already posted to be acknowledged (the client's NIC has them) before the queues
/// are failed. Zero extra time when nothing is outstanding; a dead client costs at most this.
const LINGER: Duration = Duration::from_millis(500);

/// Most handshakes in progress at once. Past it the acceptor stops accepting for a while, and
/// new connections wait in the kernel's listen backlog until a pending handshake ends (answered,
/// refused, or timed out).
const MAX_PENDING_HANDSHAKES: usize = 1024;

/// A handshake in progress, and the connection its `decide` step opened (closed again if the
/// answer cannot be delivered).
struct PendingHandshake<D: Device + Clone> {
    hs: control::Handshake,
    made: Option<Arc<Conn<D>>>,
}

/// The control-plane loop of a server: one thread runs every handshake at once over
/// non-blocking sockets, waiting in `poll(2)` on the listening socket and on each pending
/// stream, so a client that connects and sends nothing (or trickles its hello) delays nobody; it
/// is dropped when its `handshake_timeout` runs out. Opening a connection's endpoint (queues,
/// registration) runs on this thread too: it is bounded local work, not a wait on a peer.
fn accept_loop<D: Device + Clone>(listener: TcpListener, server: Weak<ServerInner<D>>) {
    use std::os::fd::AsRawFd;
    let mut pending: Vec<PendingHandshake<D>> = Vec::new();
    let mut pfds: Vec<crate::os::pollfd> = Vec::new();
    // Out of file descriptors: the listener stays readable while accept(2) keeps failing, so it
    // is left out of the poll set until this instant instead of spinning on it.
    let mut accept_paused_until: Option<std::time::Instant> = None;
    loop {
        if accept_paused_until.is_some_and(|t| std::time::Instant::now() >= t) {
            accept_paused_until = None;
        }
        let listening = pending.len() < MAX_PENDING_HANDSHAKES && accept_paused_until.is_none();
        pfds.clear();
        pfds.push(crate::os::pollfd {
            fd: if listening { listener.as_raw_fd() } else { -1 },
            events: libc::POLLIN,
            revents: 0,
        });
        for p in &pending {
            let events = if p.hs.wants_write() { libc::POLLOUT } else { libc::POLLIN };
            pfds.push(crate::os::pollfd { fd: p.hs.fd(), events, revents: 0 });
        }
        // Until the first handshake expires (rounded up to a whole millisecond) or accepting
        // resumes, at most 1 s.
        let resume = accept_paused_until.map(|t| t.saturating_duration_since(std::time::Instant::now()));
        let wait =
            pending.iter().map(|p| p.hs.time_left()).chain(resume).min().unwrap_or(Duration::from_secs(1));
        let wait_ms = wait.as_micros().div_ceil(1000).clamp(1, 1000) as libc::c_int;
        let rc = crate::os::poll(&mut pfds, wait_ms);
        if rc < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            eprintln!(
                "bypass: the server's control loop failed in poll(2): {}",
                std::io::Error::last_os_error()
            );
            return;
        }
        let Some(inner) = server.upgrade() else { return };
        if inner.shutdown.load(Ordering::Acquire) {
            for p in pending.drain(..) {
                if let Some(c) = p.made {
                    c.close();
                }
            }
            return;
        }
        // Streams that became ready (walking backwards: `swap_remove` brings in one already seen).
        for i in (0..pending.len().min(pfds.len() - 1)).rev() {
            if rc > 0 && pfds[i + 1].revents != 0 {
                if let Some(ok) = inner.drive(&mut pending[i]) {
                    inner.finish(pending.swap_remove(i), ok);
                }
            }
        }
        // Handshakes out of time: dropping the stream closes it.
        pending.retain_mut(|p| {
            if !p.hs.time_left().is_zero() {
                return true;
            }
            bump(&inner.counters.handshake_timeouts);
            if let Some(c) = p.made.take() {
                c.close();
            }
            false
        });
        if rc > 0 && pfds[0].revents != 0 {
            while pending.len() < MAX_PENDING_HANDSHAKES {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let Ok(hs) = control::Handshake::with_tls(
                            stream,
                            inner.config.handshake_timeout,
                            inner.config.tls.as_ref(),
                        ) else {
                            continue;
                        };
                        let mut p = PendingHandshake { hs, made: None };
                        // Its hello may be there already.
                        match inner.drive(&mut p) {
                            None => pending.push(p),
                            Some(ok) => inner.finish(p, ok),
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                        // Out of descriptors: pause accepting (the kernel keeps the backlog)
                        // until handshakes end or 100 ms pass, rather than spin on poll(2).
                        bump(&inner.counters.accept_pauses);
                        accept_paused_until = Some(std::time::Instant::now() + Duration::from_millis(100));
                        break;
                    }
                    // WouldBlock: nothing more to accept now. Other errors (a connection reset
                    // while queued) concern one connection.
                    Err(_) => break,
                }
            }
        }
    }
}

impl<D: Device + Clone> ServerInner<D> {
    /// Moves one handshake on as far as its socket allows; its outcome once it is over (then
    /// hand it to [`ServerInner::finish`]).
    fn drive(&self, p: &mut PendingHandshake<D>) -> Option<bool> {
        let made = &mut p.made;
        match p.hs.advance(&self.config.name, |hello, stream| self.decide(hello, stream, made)) {
            control::HandshakeStep::Pending => None,
            control::HandshakeStep::Done(Err(control::ControlError::Tls(e))) => {
                self.tls_refusals.record(p.hs.stream().peer_addr().ok(), e);
                Some(false)
            }
            control::HandshakeStep::Done(result) => Some(result.is_ok()),
        }
    }

    /// Ends a handshake: a connection whose answer went out is watched from now on; one whose
    /// answer could not be delivered is closed again.
    fn finish(&self, p: PendingHandshake<D>, ok: bool) {
        let Some(conn) = p.made else { return };
        if ok && self.watch(p.hs, &conn).is_ok() {
            bump(&self.counters.connections);
        } else {
            conn.close();
        }
    }

    /// Hands the client's stream to the process's control loop, which watches it (its closure
    /// closes `conn`; it carries queue resets) and runs keepalive.
    fn watch(&self, hs: control::Handshake, conn: &Arc<Conn<D>>) -> Result<(), RpcError> {
        let stream = hs.into_stream()?;
        let weak = Arc::downgrade(conn);
        crate::control::reactor::watch(Box::new(monitor::ConnWatch::new(
            stream,
            weak,
            self.config.keepalive,
        )))
        .map_err(control::ControlError::from)?;
        Ok(())
    }

    /// Opens the connection a valid hello asks for and puts it in service (with the workers)
    /// before the client hears back: its first request may follow the answer at once.
    fn decide(
        &self,
        hello: &control::ClientHello,
        stream: &TcpStream,
        made: &mut Option<Arc<Conn<D>>>,
    ) -> Result<ServerHello, String> {
        let conn = self.open(hello).map_err(|e| e.to_string())?;
        // The application's say (it may set the connection's context); a refused connection
        // was never served and gets no break callback.
        if let Err(reason) = conn.run_on_connect() {
            conn.close();
            return Err(reason);
        }
        let reply = ServerHello {
            version: CONTROL_VERSION,
            server_name: self.config.name.clone(),
            channel_id: conn.channel_id,
            credits: conn.window,
            max_msg: conn.ep.msg_size as u32,
            queues: conn.ep.infos(),
        };
        // A handle to shut the stream down when the connection closes.
        let ctl = stream.try_clone().map_err(|e| format!("cannot clone the control stream: {e}"))?;
        *lock(&conn.control) = Some(ctl);
        {
            let mut guard = lock(&self.conns);
            let conns = Arc::make_mut(&mut guard);
            conns.retain(|c| !c.ep.is_closed());
            conns.push(conn.clone());
        }
        if let Some(w) = &self.workers {
            w.add(Arc::new(ConnHandle(conn.clone())));
        }
        *made = Some(conn);
        Ok(reply)
    }
}

impl<D: Device + Clone> ServerInner<D> {
    fn open(&self, hello: &control::ClientHello) -> Result<Arc<Conn<D>>, RpcError> {
        let n = hello.queues.len();
        if n == 0 || n > self.config.max_queues {
            return Err(RpcError::InvalidArgument(format!(
                "{n} queues asked for; this server allows 1..={}",
                self.config.max_queues
            )));
        }
        if (hello.max_msg as usize) < MIN_MSG_SIZE {
            return Err(RpcError::InvalidArgument(format!(
                "client message size {} < {MIN_MSG_SIZE}",
                hello.max_msg
            )));
        }
        let window = self.config.fitted_window(
            n,
            hello.window.clamp(1, self.config.max_window),
            self.pool.is_some(),
        )?;
        let (send_depth, recv_depth, repost_batch) = server_depths(window);
        let sizes = Sizes {
            queues: n,
            send_depth,
            recv_depth,
            msg_size: self.config.msg_size,
            repost_batch,
            queue_config: self.config.queue_config,
        };
        let ep = Endpoint::with_recv(&self.device, sizes, self.pool.as_ref())?;
        ep.connect(&hello.queues)?;
        let channel_id = self.next_channel.fetch_add(1, Ordering::Relaxed) & wire::MAX_CHANNEL_ID;
        let rndv = rndv::ConnRndv::new(
            &self.device,
            self.functions.rndv_alloc.clone(),
            self.config.rndv_memory_limit,
            // The queues' initiator depth: at most the client's responder resources.
            hello.queues.iter().fold(self.config.queue_config.max_rd_atomic, |d, q| q.initiator_depth(d)),
            n,
            window,
            ep.tx.capacity(),
        );
        let live = Live::new();
        if let Some(k) = hello.keepalive {
            live.announce(k);
        }
        Ok(Arc::new_cyclic(|me| Conn {
            rndv,
            ep,
            channel_id,
            client_info: hello.client_info.clone(),
            client_msg: hello.max_msg as usize,
            functions: self.functions.clone(),
            counters: self.counters.clone(),
            grants: (0..n).map(|_| AtomicU32::new(0)).collect(),
            outbox: (0..n).map(|_| Mutex::default()).collect(),
            control: Mutex::new(None),
            window,
            live,
            me: me.clone(),
            events: self.events.clone(),
            accepted: AtomicBool::new(false),
        }))
    }
}
