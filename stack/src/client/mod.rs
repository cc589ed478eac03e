//! The client: a [`Channel`] to one server, and the call path.
//!
//! A call (see `docs/protocol.md` for the diagrams):
//!
//! 1. picks a READY queue round-robin (or the one the caller names);
//! 2. takes a credit on it — one of the server's receive buffers — or fails with
//!    [`RpcError::WouldBlock`] / waits, as the caller chose;
//! 3. takes a send context (`tx_ctx`) and, unless the call is `EARLY_RSP`, a request-table slot
//!    that maps the `req_id` back to the context;
//! 4. writes the 20-byte URPC header and the arguments straight into the context's registered
//!    send buffer and posts one signaled SEND.
//!
//! Completions (send CQ and receive CQ) are processed by whoever polls: the calling thread
//! itself (self-polling, the default), a [`WorkerGroup`](crate::WorkerGroup), or the
//! application calling [`Channel::poll`]. Every path that may finish a call — the response, the
//! ACK, the send completion, a timeout, a queue failure, the connection closing — first claims
//! the call's context ([`crate::core::tx_ctx::TxSlab::claim_completion`]); only the winner delivers.

use crate::client::delivery::{Oneshot, Sink};
use crate::conn::endpoint::Endpoint;
use crate::conn::sizes::{buffer_bytes, fit_window, validate_queue_config, validate_sizes, Sizes};
use crate::control::liveness::{CloseReason, Keepalive, Live};
use crate::control::{self, ClientHello, ControlIo, CONTROL_VERSION};
use crate::core::credits::Credits;
use crate::core::req_table::ReqTable;
use crate::core::tx_ctx::{CallMode, Event, FailReason, TxHandle};
use crate::error::bad_field;
use crate::hal::trace::{self, Track};
use crate::hal::{self, Completion, CompletionQueue, Device, QueueConfig};
use crate::limits::{MAX_REPOST_BATCH, MAX_WINDOW, MIN_MSG_SIZE};
use crate::sync::lock;
use crate::wire::{self, FunctionId, Parsed, RequestHeader, ResponseView};
use crate::worker::Pollable;
use crate::RpcError;
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

mod batch;
mod deferred;
pub(crate) mod delivery;
pub use batch::CallBatch;
pub use delivery::{CallFuture, Callback};
mod monitor;
mod one_sided;
mod recovery;
mod rndv;
pub use one_sided::{LocalRange, OpFuture, OpOptions, MAX_SGES};

const NO_DEADLINE: u64 = u64::MAX;
const POLL_BATCH: usize = 16;

/// How a [`Channel`] is set up.
#[derive(Debug, Clone)]
pub struct ChannelConfig {
    /// The name the server must have (checked during the handshake).
    pub server_name: String,
    /// Free-form text given to the server (the server's handlers can read it).
    pub client_info: String,
    /// Queue pairs in the channel (1..=256). Calls are spread over them round-robin.
    pub queues: usize,
    /// Calls outstanding per queue at most (the credit window the client asks for; the server
    /// may grant fewer).
    pub window: u32,
    /// Largest message in bytes, header included (both directions; the smaller of the client's
    /// and the server's applies to requests).
    pub msg_size: usize,
    /// Request-table slots (a power of two).
    pub table_size: usize,
    /// Deadline of a call that does not set its own (`None`: no deadline; `Some(0)` is refused;
    /// a duration too large for the clock, e.g. `Duration::MAX`, is a deadline that never comes).
    pub timeout: Option<Duration>,
    /// Limit for the whole of [`Channel::connect`]: creating and registering the endpoint, the
    /// TCP connection and handshake, and connecting the queues. Registration cannot be
    /// interrupted; the deadline is checked after it, and a connect that runs out fails with
    /// [`RpcError::Control`]`(Io)` of kind `TimedOut` naming the step that was slow.
    pub connect_timeout: Duration,
    /// Most bytes of registered buffer memory for this channel: `queues` × (send contexts +
    /// receive buffers per queue) × `msg_size`. The per-queue counts grow with the window
    /// (2 × window and 4 × window + min(16, window)), so for large messages the window is
    /// scaled down until they fit ([`Channel::window`] tells the window used). A channel that
    /// does not fit even at a window of 1 is refused, naming this field. Default
    /// [`DEFAULT_MEMORY_LIMIT`](crate::DEFAULT_MEMORY_LIMIT) (256 MiB).
    pub memory_limit: u64,
    /// Whether a blocking call polls the channel itself (true), or sleeps until a worker group
    /// the channel was added to delivers (false).
    pub self_poll: bool,
    /// Transport settings of the queues. The depths and SGE limits are replaced by the stack's
    /// own (derived from `window`), but zero is refused. An ACK timeout of
    /// exponent 0 ([`hal::AckTimeout::NONE`]) means no retransmission timer, as on hardware: a
    /// lost packet is then never retransmitted, and a call waiting for it ends only at its own
    /// deadline (`timeout` here or [`CallOptions::timeout`]; with no deadline it may wait forever).
    pub queue_config: QueueConfig,
    /// TLS 1.3 on the control connection (mutual: this side's certificate is presented, the
    /// server's checked against the CA bundle). `None`: plain TCP. It must match the server:
    /// a TLS server refuses a plaintext client and the reverse ([`crate::control::tls`]).
    pub tls: Option<crate::control::tls::TlsConfig>,
    /// Keepalive (see [`Keepalive`]): a channel that received nothing for `interval` is probed,
    /// and one that received nothing for `interval × misses` is broken. `None`: no probes; only
    /// the control stream's closure (and queue errors) end the connection. Default 1 s × 5.
    pub keepalive: Option<Keepalive>,
    /// Queue recovery (see [`Recovery`](crate::Recovery)): a queue that fails is reset and
    /// re-exchanged with the server over the control stream, and serves calls again; a queue
    /// failing past the budget closes the channel. `None`: a failed queue stays failed, and the
    /// channel closes when none is left. Default 3 recoveries per queue per 60 s.
    pub recovery: Option<crate::Recovery>,
}

impl Default for ChannelConfig {
    fn default() -> Self {
        ChannelConfig {
            server_name: String::new(),
            client_info: String::new(),
            queues: 1,
            window: 32,
            msg_size: 4096,
            table_size: crate::core::req_table::DEFAULT_CAPACITY,
            timeout: Some(Duration::from_secs(10)),
            connect_timeout: Duration::from_secs(5),
            memory_limit: crate::limits::DEFAULT_MEMORY_LIMIT,
            self_poll: true,
            queue_config: QueueConfig::default(),
            tls: None,
            keepalive: Some(Keepalive::default()),
            recovery: Some(crate::Recovery::default()),
        }
    }
}

impl ChannelConfig {
    /// Defaults, for a server with this name.
    pub fn new(server_name: impl Into<String>) -> Self {
        ChannelConfig { server_name: server_name.into(), ..Default::default() }
    }

    /// Checks every field against the protocol's limits and the device's `caps`, as
    /// [`Channel::connect`] does before any network I/O. The error
    /// ([`RpcError::InvalidArgument`]) names the field, e.g. `ChannelConfig.window is 0: ...`.
    pub fn validate(&self, caps: &hal::DeviceCaps) -> Result<(), RpcError> {
        const C: &str = "ChannelConfig";
        let field = |name: &str| format!("{C}.{name}");
        if self.server_name.len() > control::MAX_NAME_LEN {
            return Err(bad_field(
                &field("server_name"),
                format_args!("is {} bytes: at most {}", self.server_name.len(), control::MAX_NAME_LEN),
            ));
        }
        if self.client_info.len() > control::MAX_INFO_LEN {
            return Err(bad_field(
                &field("client_info"),
                format_args!("is {} bytes: at most {}", self.client_info.len(), control::MAX_INFO_LEN),
            ));
        }
        if !(1..=control::MAX_QUEUES).contains(&self.queues) {
            return Err(bad_field(
                &field("queues"),
                format_args!("is {}: use 1..={}", self.queues, control::MAX_QUEUES),
            ));
        }
        if !(1..=MAX_WINDOW).contains(&self.window) {
            return Err(bad_field(
                &field("window"),
                format_args!("is {}: use 1..={MAX_WINDOW}", self.window),
            ));
        }
        if self.msg_size < MIN_MSG_SIZE || self.msg_size as u64 > u64::from(caps.max_msg_size) {
            return Err(bad_field(
                &field("msg_size"),
                format_args!(
                    "is {}: use {MIN_MSG_SIZE}..={} (the smallest a server accepts, and the device's largest \
                     message; the header is included)",
                    self.msg_size, caps.max_msg_size
                ),
            ));
        }
        if !self.table_size.is_power_of_two() || self.table_size > crate::core::req_table::MAX_CAPACITY {
            return Err(bad_field(
                &field("table_size"),
                format_args!(
                    "is {}: use a power of two up to {}",
                    self.table_size,
                    crate::core::req_table::MAX_CAPACITY
                ),
            ));
        }
        if self.timeout == Some(Duration::ZERO) {
            return Err(bad_field(
                &field("timeout"),
                "is zero (every call would time out at once): use None for no deadline, or a positive duration",
            ));
        }
        if self.connect_timeout.is_zero() {
            return Err(bad_field(&field("connect_timeout"), "is zero: use a positive duration"));
        }
        validate_queue_config(&field("queue_config"), &self.queue_config, caps)?;
        if let Some(k) = &self.keepalive {
            k.validate(&field("keepalive"))?;
        }
        if let Some(r) = &self.recovery {
            r.validate(&field("recovery"))?;
        }
        // The device's limits apply to the window asked for; the memory limit may scale it down.
        self.fitted_window()?;
        let (send, recv, _) = client_depths(self.window);
        validate_sizes(
            "use fewer ChannelConfig.queues, a smaller ChannelConfig.window or a smaller ChannelConfig.msg_size",
            self.queues,
            send,
            recv,
            self.msg_size,
            caps,
        )
    }
}

impl ChannelConfig {
    /// The window the channel uses: `window`, scaled down until its buffers fit `memory_limit`.
    fn fitted_window(&self) -> Result<u32, RpcError> {
        let depths = |w| {
            let (s, r, _) = client_depths(w);
            (s, r)
        };
        fit_window(self.window, self.queues, self.msg_size, self.memory_limit, depths).ok_or_else(|| {
            bad_field(
                "ChannelConfig.memory_limit",
                format_args!(
                    "is {} bytes, but {} queue(s) of {}-byte messages need {} bytes of registered buffers even at \
                     a window of 1: raise ChannelConfig.memory_limit, or use a smaller ChannelConfig.msg_size or \
                     fewer ChannelConfig.queues",
                    self.memory_limit,
                    self.queues,
                    self.msg_size,
                    buffer_bytes(self.queues, depths(1), self.msg_size)
                ),
            )
        })
    }
}

/// Per queue: the client's send contexts, receive buffers and re-post batch for `window`.
///
/// Send contexts: a request's context lives until its send completion, which may come after its
/// response has returned the credit, so allow two windows in flight. Receive buffers: per
/// outstanding request at most an ACK and a response, plus credit grants.
fn client_depths(window: u32) -> (u32, u32, usize) {
    let repost_batch = MAX_REPOST_BATCH.min(window as usize);
    (2 * window, 4 * window + repost_batch as u32, repost_batch)
}

/// Per-call choices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallOptions {
    /// The call mode: what the server sends back and when the call completes.
    pub mode: CallMode,
    /// Deadline for this call; `None` uses the channel's [`ChannelConfig::timeout`]. A duration
    /// too large for the clock (e.g. `Duration::MAX`) saturates: a deadline that never comes.
    pub timeout: Option<Duration>,
    /// Send on this queue instead of picking one round-robin.
    pub queue: Option<usize>,
    /// When the chosen queue has no credit: wait (polling) for one instead of failing with
    /// [`RpcError::WouldBlock`]. The wait ends at the call's deadline.
    pub wait_for_credit: bool,
    /// Send non-empty arguments by rendezvous (DMA descriptors the server RDMA READs) even if
    /// they fit the eager message. Arguments that do not fit go by rendezvous anyway.
    pub rendezvous: bool,
    /// The largest response expected. Above what fits inline in a response message, the call
    /// names a registered response buffer of this size, which the server RDMA-WRITEs a large
    /// response into (rendezvous response). 0 (the default): responses must fit inline; a
    /// larger one comes back as REMOTE_LEN_ERR.
    pub max_response: usize,
}

impl Default for CallOptions {
    fn default() -> Self {
        CallOptions {
            mode: CallMode::WaitRsp,
            timeout: None,
            queue: None,
            wait_for_credit: true,
            rendezvous: false,
            max_response: 0,
        }
    }
}

impl CallOptions {
    /// Defaults with this call mode.
    pub fn mode(mode: CallMode) -> Self {
        CallOptions { mode, ..Default::default() }
    }
}

/// What a completed blocking call saw besides its response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallInfo {
    /// The server acknowledged the request (ACK modes; a response implies the ACK).
    pub acked: bool,
}

/// Counters of a channel.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChannelStats {
    /// Calls started (posted).
    pub calls: u64,
    /// Calls that ended with a timeout.
    pub timeouts: u64,
    /// Responses or ACKs that matched no outstanding call (stale, duplicate or late), dropped.
    pub stale: u64,
    /// Messages from the server that did not parse or made no sense, dropped.
    pub protocol_errors: u64,
    /// Send contexts in use right now (0 when nothing is outstanding: nothing leaked).
    pub tx_in_use: usize,
    /// Request-table slots in use right now.
    pub table_in_use: usize,
    /// Credits available on each queue right now, summed.
    pub credits: u64,
    /// Queues still READY.
    pub ready_queues: usize,
    /// Bytes of registered send and receive buffers so far (at most [`ChannelConfig::memory_limit`]):
    /// the receive buffers and the send buffers of the chunks of 8 send contexts used yet.
    pub registered_bytes: u64,
    /// Completion callbacks ([`Channel::call_callback`]) that panicked. Each panic was contained:
    /// its call counts as finished and its send context was released; the first one per channel
    /// is also reported on stderr.
    pub callback_panics: u64,
    /// Keepalive probes sent (not counted in `calls`).
    pub keepalive_probes: u64,
    /// Queues recovered (brought back from ERROR to READY).
    pub recoveries: u64,
    /// Closes (the server went away) that waited for replies another thread had already taken
    /// from the completion queue, so that those calls ended with their reply rather than with
    /// the close's error.
    pub close_waits: u64,
}

struct Pending {
    sink: Sink,
    req_id: u32,
    queue: usize,
    function: FunctionId,
    mode: CallMode,
    deadline: u64,
    /// When the call started on the trace clock, if recording ([`trace::now`]); else 0.
    traced_at: u64,
    /// A one-sided operation (not a call): a queue failure leaves it to its own completion.
    one_sided: bool,
}

/// The row of the client's trace events: the calling or completing thread, in group "client".
const TRACK: Track = Track::Thread("client");

/// Longest a close waits for replies another thread is delivering ([`ChannelInner::collect_arrived`]).
const COLLECT_LIMIT: Duration = Duration::from_secs(2);

fn mode_name(mode: CallMode) -> &'static str {
    match mode {
        CallMode::EarlyRsp => "EARLY_RSP",
        CallMode::WaitRsp => "WAIT_RSP",
        CallMode::Ack => "ACK",
        CallMode::AckEarlyRsp => "ACK_EARLY_RSP",
    }
}

/// Records a call's start (just before its request is posted); returns the trace clock.
#[cold]
fn trace_call_start(function: FunctionId, req_id: u32, mode: CallMode, queue: usize) -> u64 {
    let args = [
        ("function", function.raw().into()),
        ("req_id", req_id.into()),
        ("mode", mode_name(mode).into()),
        ("queue", queue.into()),
    ];
    trace::instant(TRACK, "call start", &args);
    trace::now()
}

/// Records a call's end (before its outcome is delivered), and the whole call as a slice.
#[cold]
fn trace_call_end(p: &Pending, ok: bool) {
    let args = [
        ("function", p.function.raw().into()),
        ("req_id", p.req_id.into()),
        ("mode", mode_name(p.mode).into()),
        ("ok", ok.into()),
    ];
    if p.traced_at != 0 {
        trace::async_span(TRACK, "call", p.traced_at, &args);
    }
    trace::instant(TRACK, "call complete", &args);
}

struct CallSlot {
    pending: Mutex<Option<Pending>>,
    /// The handle of the call that last used this slot (`TxHandle::to_u64`).
    handle: AtomicU64,
    /// Its deadline in device nanoseconds (`NO_DEADLINE`: none, or finished).
    deadline: AtomicU64,
}

#[derive(Default)]
struct Counters {
    calls: AtomicU64,
    timeouts: AtomicU64,
    stale: AtomicU64,
    protocol_errors: AtomicU64,
    callback_panics: AtomicU64,
    close_waits: AtomicU64,
}

pub(crate) struct ChannelInner<D: Device + Clone> {
    ep: Endpoint<D>,
    table: ReqTable,
    credits: Box<[Credits]>,
    slots: Box<[CallSlot]>,
    /// Per send context: the local regions a one-sided operation keeps alive until its work
    /// request completed (only one-sided operations touch these).
    held: Box<[Mutex<one_sided::Held<D::Region>>]>,
    /// Per send context: the memory of a rendezvous call (only rendezvous calls touch it).
    rndv: rndv::State<D>,
    channel_id: u32,
    max_request: usize,
    rr: AtomicUsize,
    next_scan: AtomicU64,
    polls: AtomicU32,
    /// `Channel` handles alive (a worker group's reference does not count).
    handles: AtomicUsize,
    config: ChannelConfig,
    counters: Counters,
    server_name: String,
    control: Mutex<Option<TcpStream>>,
    /// Keepalive state, close reason and the application's context.
    live: Live,
    /// The break callback, and the reason once the channel closed.
    on_break: Mutex<BreakSlot>,
    /// Queues waiting for recovery.
    recovery: recovery::State,
    /// Callback deliveries the control loop finished and hands to the aside thread.
    deferred: deferred::DeferredList,
}

/// A channel's break callback (until it ran) and the reason it closed (once it did).
#[derive(Default)]
struct BreakSlot {
    callback: Option<Box<dyn FnOnce(CloseReason) + Send>>,
    fired: Option<CloseReason>,
}

/// A client's connection to one server: several queue pairs, one request table, and the calls.
/// Cheap to clone (a handle); usable from many threads at once. The connection closes when the
/// last handle is dropped, when [`Channel::close`] is called, or when the server goes away.
pub struct Channel<D: Device + Clone> {
    inner: Arc<ChannelInner<D>>,
}

impl<D: Device + Clone> Clone for Channel<D> {
    fn clone(&self) -> Self {
        self.inner.handles.fetch_add(1, Ordering::Relaxed);
        Channel { inner: self.inner.clone() }
    }
}

impl<D: Device + Clone> Drop for Channel<D> {
    /// The last handle closes the channel, even if a worker group still polls it.
    fn drop(&mut self) {
        if self.inner.handles.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.inner.close();
        }
    }
}

impl<D: Device + Clone> std::fmt::Debug for Channel<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Channel")
            .field("channel_id", &self.inner.channel_id)
            .field("server", &self.inner.server_name)
            .field("closed", &self.is_closed())
            .finish()
    }
}

fn protocol_error(counters: &Counters, what: &dyn std::fmt::Display) {
    let n = counters.protocol_errors.fetch_add(1, Ordering::Relaxed);
    if n < 16 || n.is_power_of_two() {
        eprintln!("bypass: dropped a malformed message from the server ({what}); {} so far", n + 1);
    }
}

impl<D: Device + Clone> Channel<D> {
    /// Connects to the server listening at `addr` over TCP, sets up `config.queues` queue pairs
    /// on `device`, and returns when calls can be made. `addr` is anything
    /// [`ToSocketAddrs`](std::net::ToSocketAddrs) takes, as for [`Server::bind`](crate::Server::bind):
    /// a `SocketAddr`, `"host:port"`, `("host", port)`, ...; errors name the addresses it resolved to.
    ///
    /// Errors: [`RpcError::InvalidArgument`] for a bad configuration, naming the field
    /// ([`ChannelConfig::validate`], checked first, before any I/O); [`RpcError::Control`] (nothing
    /// listens there, version mismatch, wrong server name, refused); [`RpcError::Device`].
    pub fn connect(device: &D, addr: impl ToSocketAddrs, config: ChannelConfig) -> Result<Self, RpcError> {
        let started = std::time::Instant::now();
        config.validate(&device.caps())?;
        let window = config.fitted_window()?;
        let (send_depth, recv_depth, repost_batch) = client_depths(window);
        let sizes = Sizes {
            queues: config.queues,
            send_depth,
            recv_depth,
            msg_size: config.msg_size,
            repost_batch,
            queue_config: config.queue_config,
        };
        let ep = Endpoint::new(device, sizes)?;
        // What is left of the connect timeout after `step`, or a timeout error naming it.
        let left = |step: &str| -> Result<Duration, RpcError> {
            let spent = started.elapsed();
            config.connect_timeout.checked_sub(spent).filter(|d| !d.is_zero()).ok_or_else(|| {
                RpcError::Control(control::ControlError::Io(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!(
                        "Channel::connect ran out of its ChannelConfig.connect_timeout ({:?}) after {step} \
                         ({spent:?} so far)",
                        config.connect_timeout
                    ),
                )))
            })
        };
        let remaining = left(&format!(
            "creating the endpoint and registering {} bytes of buffers ({} queue(s), window {window}, \
             {}-byte messages)",
            ep.registered(),
            config.queues,
            config.msg_size
        ))?;
        let hello = ClientHello {
            version: CONTROL_VERSION,
            server_name: config.server_name.clone(),
            client_info: config.client_info.clone(),
            window,
            max_msg: config.msg_size as u32,
            keepalive: config.keepalive.map(|k| k.announced()),
            queues: ep.infos(),
        };
        let (stream, server) = control::connect_with(addr, &hello, remaining, config.tls.as_ref())?;
        if server.credits == 0 || (server.max_msg as usize) < MIN_MSG_SIZE {
            return Err(RpcError::InvalidArgument(format!(
                "the server granted {} credits and a message size of {} bytes; need at least 1 and {MIN_MSG_SIZE}",
                server.credits, server.max_msg
            )));
        }
        ep.connect(&server.queues)?;
        left("connecting the queues and posting the receive buffers")?;
        let credits = server.credits.min(window);
        let table = ReqTable::new(config.table_size)
            .map_err(|e| RpcError::InvalidArgument(format!("request table: {e}")))?;
        let slots = (0..ep.tx.capacity())
            .map(|_| CallSlot {
                pending: Mutex::new(None),
                handle: AtomicU64::new(u64::MAX),
                deadline: AtomicU64::new(NO_DEADLINE),
            })
            .collect();
        // One-sided wr_ids tag bit 31 of the context index (see `one_sided`): indexes must stay below.
        if ep.tx.capacity() as u64 >= one_sided::ONE_SIDED_TAG {
            return Err(RpcError::InvalidArgument(format!(
                "{} send contexts: at most 2^31",
                ep.tx.capacity()
            )));
        }
        let held = (0..ep.tx.capacity()).map(|_| Mutex::new(Default::default())).collect();
        // The channel's watch in the process's control loop owns the stream (TLS or not): it
        // alone reads and writes it after the handshake (queue re-exchange, aside); a clone of
        // its socket shuts it down, which the loop sees.
        let shutdown = stream.tcp().try_clone().map_err(control::ControlError::from)?;
        let keepalive = config.keepalive;
        let recovery_state = recovery::State::new(config.queues);
        let rndv = rndv::State::new(device, ep.tx.capacity());
        let inner = Arc::new(ChannelInner {
            table,
            credits: (0..config.queues)
                .map(|_| Credits::with_limit(credits, credits))
                .collect::<Result<_, _>>()
                .map_err(|e| RpcError::InvalidArgument(e.to_string()))?,
            slots,
            held,
            rndv,
            channel_id: server.channel_id,
            max_request: config.msg_size.min(server.max_msg as usize),
            rr: AtomicUsize::new(0),
            next_scan: AtomicU64::new(NO_DEADLINE),
            polls: AtomicU32::new(0),
            handles: AtomicUsize::new(1),
            counters: Counters::default(),
            server_name: server.server_name,
            control: Mutex::new(Some(shutdown)),
            config,
            ep,
            live: Live::new(),
            on_break: Mutex::default(),
            recovery: recovery_state,
            deferred: deferred::DeferredList::default(),
        });
        let weak = Arc::downgrade(&inner);
        crate::control::reactor::watch(Box::new(monitor::ChannelWatch::new(stream, weak, keepalive)))
            .map_err(control::ControlError::from)?;
        Ok(Channel { inner })
    }

    /// The 24-bit id the server gave this channel.
    pub fn channel_id(&self) -> u32 {
        self.inner.channel_id
    }

    /// The server's name.
    pub fn server_name(&self) -> &str {
        &self.inner.server_name
    }

    /// The credit window per queue in use: [`ChannelConfig::window`], scaled down to fit
    /// [`ChannelConfig::memory_limit`], and limited by what the server granted.
    pub fn window(&self) -> u32 {
        self.inner.credits.first().map_or(0, Credits::limit)
    }

    /// Number of queues (READY or not).
    pub fn queues(&self) -> usize {
        self.inner.ep.queues.len()
    }

    /// Bytes of rendezvous memory (argument copies and response buffers) held by calls right
    /// now; 0 when no rendezvous call is outstanding (nothing leaked).
    pub fn rndv_in_use(&self) -> u64 {
        self.inner.rndv.in_use()
    }

    /// A blocking call whose arguments are `segments`, registered ranges on this channel's
    /// device (with [`Access::REMOTE_READ`](crate::Access::REMOTE_READ)), which the server RDMA
    /// READs where they are (no copy; at most 31 non-empty segments, 30 with a response buffer),
    /// gathered in order into the arguments its handler sees ([`Request::args`](crate::Request::args),
    /// [`Request::segments`](crate::Request::segments)). The regions are kept alive until the
    /// call's outcome. Only `WAIT_RSP` and `ACK` modes.
    pub fn call_segments_with(
        &self,
        opts: &CallOptions,
        function: FunctionId,
        segments: &[LocalRange<'_, D::Region>],
        response: &mut Vec<u8>,
    ) -> Result<CallInfo, RpcError> {
        self.blocking(opts, function, rndv::Args::Segments(segments), "Channel::call_segments_with", response)
    }

    /// Largest request arguments in bytes (the message size less the 20-byte header).
    pub fn max_request_args(&self) -> usize {
        self.inner.max_request - RequestHeader::LEN
    }

    /// Whether the channel is closed (every call fails with [`RpcError::Closed`]).
    pub fn is_closed(&self) -> bool {
        self.inner.ep.is_closed()
    }

    /// Counters, and how many contexts, table slots and credits are in use.
    pub fn stats(&self) -> ChannelStats {
        let i = &self.inner;
        let t = i.table.stats();
        ChannelStats {
            calls: i.counters.calls.load(Ordering::Relaxed),
            timeouts: i.counters.timeouts.load(Ordering::Relaxed),
            stale: i.counters.stale.load(Ordering::Relaxed)
                + t.stale_responses
                + t.duplicates
                + t.late_responses,
            protocol_errors: i.counters.protocol_errors.load(Ordering::Relaxed),
            tx_in_use: i.ep.tx.in_use(),
            table_in_use: t.outstanding,
            credits: i.credits.iter().map(|c| u64::from(c.available())).sum(),
            ready_queues: i.ep.ready_queues(),
            registered_bytes: i.ep.registered(),
            callback_panics: i.counters.callback_panics.load(Ordering::Relaxed),
            keepalive_probes: i.live.probes.load(Ordering::Relaxed),
            recoveries: i.recovery.recovered.load(Ordering::Relaxed),
            close_waits: i.counters.close_waits.load(Ordering::Relaxed),
        }
    }

    /// A blocking `WAIT_RSP` call with the channel's defaults: sends `args` to `function` and
    /// waits for the response, which replaces the contents of `response`.
    pub fn call(&self, function: FunctionId, args: &[u8], response: &mut Vec<u8>) -> Result<(), RpcError> {
        self.call_with(&CallOptions::default(), function, args, response).map(|_| ())
    }

    /// A blocking call with explicit options. `response` receives the response bytes (empty for
    /// the modes without a response); on any error it is left empty. With `self_poll` the calling
    /// thread polls the channel while it waits; otherwise it sleeps until a worker delivers.
    ///
    /// On a device that moves only when a test steps it (the simulator's Stepped engine, see
    /// `hal::Device::externally_stepped`) every blocking call — this one, [`Channel::call`],
    /// [`Channel::call_segments_with`], [`Channel::read`], [`Channel::write`] — fails at once with
    /// [`RpcError::InvalidArgument`] saying so, rather than wait for work and a deadline that
    /// nothing would ever advance: use [`Channel::call_future`] or [`Channel::call_callback`] and
    /// drive the fabric (`Fabric::step`, `run_until_idle`, `advance`) until the call is done. A
    /// call that would wait for a credit or a send context fails the same way.
    pub fn call_with(
        &self,
        opts: &CallOptions,
        function: FunctionId,
        args: &[u8],
        response: &mut Vec<u8>,
    ) -> Result<CallInfo, RpcError> {
        self.blocking(opts, function, rndv::Args::Bytes(args), "Channel::call", response)
    }

    /// The blocking calls' one body: starts the call (`name` is the caller's, for the error a
    /// Stepped device gets), waits, and moves the response into `response`, left empty on error.
    fn blocking(
        &self,
        opts: &CallOptions,
        function: FunctionId,
        args: rndv::Args<'_, '_, D::Region>,
        name: &'static str,
        response: &mut Vec<u8>,
    ) -> Result<CallInfo, RpcError> {
        let shot = delivery::blocking_shot();
        let start = self.inner.start_args(opts, function, args, Sink::Shot(shot.clone()), Some(name), None);
        let result = start.and_then(|()| {
            self.wait(&shot);
            shot.take_into(response).unwrap_or(Err(RpcError::Closed))
        });
        let acked = shot.is_acked();
        delivery::recycle_shot(shot);
        if result.is_err() {
            // Never leave an earlier response's bytes behind for a caller that ignores the error.
            response.clear();
        }
        result.map(|()| CallInfo { acked })
    }

    /// Starts a call whose outcome is passed to `callback`, run once on the thread that
    /// completes the call (a poller; or this thread, if the call fails before it is sent — then
    /// this returns the error instead and `callback` is not run).
    ///
    /// A callback that panics is contained: the panic does not reach the polling thread (or the
    /// unrelated call whose poll ran it), the call's resources are released as if the callback
    /// had returned, [`ChannelStats::callback_panics`] counts it, and the first one per channel is
    /// reported on stderr (after the standard panic message, which the panic hook prints).
    ///
    /// It never runs on the process's shared control loop (`bypass-ctl`): when the loop finishes
    /// a call — the peer closed the connection, a keepalive look polled an idle channel — the
    /// callback runs on a short-lived `bypass-ctl-aside` thread instead, so a slow callback
    /// delays no other connection's keepalive or close. It still delays whatever else that
    /// thread delivers, so hand long work to a thread of your own.
    pub fn call_callback(
        &self,
        opts: &CallOptions,
        function: FunctionId,
        args: &[u8],
        callback: impl FnOnce(Result<&[u8], RpcError>) + Send + 'static,
    ) -> Result<(), RpcError> {
        let cb: Callback = Box::new(callback);
        self.inner.start(opts, function, args, Sink::Callback(cb))
    }

    /// Starts a call and returns a `Future` of its outcome (see [`CallFuture`]).
    pub fn call_future(
        &self,
        opts: &CallOptions,
        function: FunctionId,
        args: &[u8],
    ) -> Result<CallFuture, RpcError> {
        let shot = Arc::new(Oneshot::default());
        self.inner.start(opts, function, args, Sink::Shot(shot.clone()))?;
        Ok(CallFuture { shot })
    }

    /// A blocking one-sided RDMA WRITE: gathers `local` (in order) into the peer's region
    /// `remote` at `remote_offset`, and returns once the peer's NIC has placed the bytes (see
    /// the `one_sided` section of the crate docs for getting `remote` and for the errors).
    pub fn write(
        &self,
        local: &[LocalRange<'_, D::Region>],
        remote: &hal::RemoteRegion,
        remote_offset: u64,
        opts: &OpOptions,
    ) -> Result<(), RpcError> {
        self.op_blocking(one_sided::OpKind::Write, local, remote, remote_offset, opts)
    }

    /// A blocking one-sided RDMA READ of the peer's region `remote` at `remote_offset`,
    /// scattered into `local` (in order; the regions need [`hal::Access::LOCAL_WRITE`]). The
    /// bytes are in `local` when this returns `Ok`.
    pub fn read(
        &self,
        local: &[LocalRange<'_, D::Region>],
        remote: &hal::RemoteRegion,
        remote_offset: u64,
        opts: &OpOptions,
    ) -> Result<(), RpcError> {
        self.op_blocking(one_sided::OpKind::Read, local, remote, remote_offset, opts)
    }

    /// [`Channel::write`] whose outcome is passed to `callback` on the thread that completes it
    /// (as for [`Channel::call_callback`]; if this returns an error, `callback` is not run).
    pub fn write_callback(
        &self,
        local: &[LocalRange<'_, D::Region>],
        remote: &hal::RemoteRegion,
        remote_offset: u64,
        opts: &OpOptions,
        callback: impl FnOnce(Result<(), RpcError>) + Send + 'static,
    ) -> Result<(), RpcError> {
        self.op_callback(one_sided::OpKind::Write, local, remote, remote_offset, opts, callback)
    }

    /// [`Channel::read`] whose outcome is passed to `callback` (see [`Channel::write_callback`]).
    pub fn read_callback(
        &self,
        local: &[LocalRange<'_, D::Region>],
        remote: &hal::RemoteRegion,
        remote_offset: u64,
        opts: &OpOptions,
        callback: impl FnOnce(Result<(), RpcError>) + Send + 'static,
    ) -> Result<(), RpcError> {
        self.op_callback(one_sided::OpKind::Read, local, remote, remote_offset, opts, callback)
    }

    /// Starts a [`Channel::write`] and returns a `Future` of its outcome ([`OpFuture`]).
    pub fn write_future(
        &self,
        local: &[LocalRange<'_, D::Region>],
        remote: &hal::RemoteRegion,
        remote_offset: u64,
        opts: &OpOptions,
    ) -> Result<OpFuture, RpcError> {
        self.op_future(one_sided::OpKind::Write, local, remote, remote_offset, opts)
    }

    /// Starts a [`Channel::read`] and returns a `Future` of its outcome ([`OpFuture`]).
    pub fn read_future(
        &self,
        local: &[LocalRange<'_, D::Region>],
        remote: &hal::RemoteRegion,
        remote_offset: u64,
        opts: &OpOptions,
    ) -> Result<OpFuture, RpcError> {
        self.op_future(one_sided::OpKind::Read, local, remote, remote_offset, opts)
    }

    fn op_blocking(
        &self,
        kind: one_sided::OpKind,
        local: &[LocalRange<'_, D::Region>],
        remote: &hal::RemoteRegion,
        remote_offset: u64,
        opts: &OpOptions,
    ) -> Result<(), RpcError> {
        let what = match kind {
            one_sided::OpKind::Read => "Channel::read",
            one_sided::OpKind::Write => "Channel::write",
        };
        let shot = delivery::blocking_shot();
        let start = self.inner.start_op(
            kind,
            local,
            remote,
            remote_offset,
            opts,
            Sink::Shot(shot.clone()),
            Some(what),
        );
        let result = start.and_then(|()| {
            self.wait(&shot);
            shot.take_into(&mut Vec::new()).unwrap_or(Err(RpcError::Closed))
        });
        delivery::recycle_shot(shot);
        result
    }

    fn op_future(
        &self,
        kind: one_sided::OpKind,
        local: &[LocalRange<'_, D::Region>],
        remote: &hal::RemoteRegion,
        remote_offset: u64,
        opts: &OpOptions,
    ) -> Result<OpFuture, RpcError> {
        let shot = Arc::new(Oneshot::default());
        self.inner.start_op(kind, local, remote, remote_offset, opts, Sink::Shot(shot.clone()), None)?;
        Ok(OpFuture(CallFuture { shot }))
    }

    fn op_callback(
        &self,
        kind: one_sided::OpKind,
        local: &[LocalRange<'_, D::Region>],
        remote: &hal::RemoteRegion,
        remote_offset: u64,
        opts: &OpOptions,
        callback: impl FnOnce(Result<(), RpcError>) + Send + 'static,
    ) -> Result<(), RpcError> {
        let cb: Callback = Box::new(move |r: Result<&[u8], RpcError>| callback(r.map(drop)));
        self.inner.start_op(kind, local, remote, remote_offset, opts, Sink::Callback(cb), None)
    }

    fn wait(&self, shot: &Oneshot) {
        let inner = &self.inner;
        let mut spins = 0u32;
        while !shot.is_done() {
            if inner.config.self_poll {
                // Polling our CQs runs our (simulated) NIC; the device-wide `progress` and the
                // clock are only needed now and then (reading other NICs' state every spin would
                // bounce their cache lines between cores).
                if inner.poll() == 0 {
                    spins += 1;
                    if spins % 64 == 0 {
                        inner.ep.device.progress();
                        inner.check_timeouts();
                    }
                    if spins % 1024 == 0 {
                        std::thread::yield_now();
                    }
                }
            } else if shot.register_thread() {
                std::thread::park_timeout(Duration::from_millis(1));
                inner.check_timeouts();
            }
        }
    }

    /// Processes completions (responses, ACKs, credit grants, send completions) and fires due
    /// timeouts. Returns the number of completions handled. Needed when nothing else polls: no
    /// self-polling blocking call in progress and no worker group.
    pub fn poll(&self) -> usize {
        self.inner.poll()
    }

    /// Only the receive side of [`Channel::poll`]: responses, ACKs and credit grants.
    /// Together with [`Channel::poll_send_completions`] and [`Channel::check_timeouts`] it lets a
    /// test choose the order in which a call's events are seen.
    pub fn poll_responses(&self) -> usize {
        self.inner.poll_recv(false)
    }

    /// Only the send side of [`Channel::poll`]: send completions.
    pub fn poll_send_completions(&self) -> usize {
        self.inner.poll_send()
    }

    /// Fails the calls whose deadline has passed (by the device's clock) with
    /// [`RpcError::Timeout`]; returns how many.
    pub fn check_timeouts(&self) -> usize {
        self.inner.check_timeouts()
    }

    /// Moves queue `queue` to ERROR as if the NIC had failed it: its outstanding calls fail with
    /// [`RpcError::Queue`] and later calls use the other queues. With
    /// [`ChannelConfig::recovery`] the queue is then recovered (READY again after a round trip
    /// on the control stream; [`ChannelStats::recoveries`] counts it) until its budget is spent;
    /// without, it stays failed and the channel closes once no queue is left. For tests and
    /// operators.
    pub fn fail_queue(&self, queue: usize) -> Result<(), RpcError> {
        if queue >= self.queues() {
            return Err(RpcError::InvalidArgument(format!("queue {queue} of {}", self.queues())));
        }
        self.inner.queue_failed(queue, hal::Status::Flushed);
        Ok(())
    }

    /// Closes the channel: outstanding calls fail with [`RpcError::Closed`], the server sees
    /// the connection close.
    pub fn close(&self) {
        self.inner.close();
    }

    /// The channel as something a [`WorkerGroup`](crate::WorkerGroup) can poll.
    pub fn pollable(&self) -> Arc<dyn Pollable> {
        self.inner.clone()
    }

    /// Sets the callback that runs once when the channel closes, with the reason: the peer went
    /// away (closed, or stopped answering keepalive probes), the queues failed past recovery, or
    /// this side closed it. It runs on the thread that closes the channel (a short-lived
    /// `bypass-ctl-aside` thread for a peer that closed or stopped answering — never the shared
    /// control loop itself —, a recovery thread, a poller, or the one calling
    /// [`Channel::close`] or dropping the last handle), after every
    /// outstanding call got its outcome; if the channel is closed already, it runs at once on
    /// this thread. A panic in it is contained. Replaces a callback set earlier that has not run.
    pub fn set_break_callback(&self, callback: impl FnOnce(CloseReason) + Send + 'static) {
        let mut slot = lock(&self.inner.on_break);
        match slot.fired {
            Some(reason) => {
                drop(slot);
                run_break_callback(self.inner.channel_id, Box::new(callback), reason);
            }
            None => slot.callback = Some(Box::new(callback)),
        }
    }

    /// Why the channel closed (`None` while it is open).
    pub fn close_reason(&self) -> Option<CloseReason> {
        if self.is_closed() {
            self.inner.live.reason()
        } else {
            None
        }
    }

    /// Stores the application's value for this channel (0 until set), as `OckRpcSetUpCtx` does.
    pub fn set_context(&self, value: u64) {
        self.inner.live.context.store(value, Ordering::Release);
    }

    /// The value stored by [`Channel::set_context`].
    pub fn context(&self) -> u64 {
        self.inner.live.context.load(Ordering::Acquire)
    }

    /// Test hook: with `true`, this channel's keepalive neither probes nor judges, as if its
    /// process were frozen (the server stops hearing from it; the TCP stream stays open).
    #[doc(hidden)]
    pub fn freeze_keepalive_for_tests(&self, frozen: bool) {
        self.inner.live.frozen.store(frozen, Ordering::Release);
    }
}

impl<D: Device + Clone> ChannelInner<D> {
    fn pick_queue(&self, named: Option<usize>) -> Result<usize, RpcError> {
        let n = self.ep.queues.len();
        if let Some(q) = named {
            if q >= n {
                return Err(RpcError::InvalidArgument(format!("queue {q} of {n}")));
            }
            if !self.ep.queues[q].ready.load(Ordering::Acquire) {
                return Err(RpcError::Queue(hal::Status::Flushed));
            }
            return Ok(q);
        }
        let start = if n == 1 { 0 } else { self.rr.fetch_add(1, Ordering::Relaxed) };
        (0..n).map(|k| (start + k) % n).find(|&q| self.ep.queues[q].ready.load(Ordering::Acquire)).ok_or_else(
            // None READY on an open channel: its queues are being recovered.
            || if self.ep.is_closed() { RpcError::Closed } else { RpcError::Queue(hal::Status::Flushed) },
        )
    }

    fn deadline_of(&self, opts: &CallOptions) -> u64 {
        match opts.timeout.or(self.config.timeout) {
            // Saturates: a timeout too large to add to the clock (`Duration::MAX`) is a deadline
            // that never comes, not an overflow.
            Some(t) => self
                .ep
                .device
                .now()
                .checked_add(t)
                .map_or(NO_DEADLINE - 1, |d| d.as_nanos().min(u128::from(NO_DEADLINE - 1)) as u64),
            None => NO_DEADLINE,
        }
    }

    fn take_credit(&self, q: usize, opts: &CallOptions, deadline: u64) -> Result<(), RpcError> {
        let mut spins = 0u32;
        loop {
            if self.credits[q].try_take(1).is_ok() {
                return Ok(());
            }
            if !opts.wait_for_credit {
                return Err(RpcError::WouldBlock(
                    "no credit: every receive buffer the server posted for this queue is in use",
                ));
            }
            if !self.ep.queues[q].ready.load(Ordering::Acquire) {
                return Err(RpcError::Queue(hal::Status::Flushed));
            }
            if self.config.self_poll && self.poll() > 0 {
                continue;
            }
            self.idle_turn(&mut spins, deadline)?;
        }
    }

    /// Fails a blocking operation (`what`) on a device that only a test's stepping moves: the
    /// wait would never end (see [`Channel::call_with`]).
    pub(crate) fn refuse_to_block(&self, what: &str) -> Result<(), RpcError> {
        if !self.ep.device.externally_stepped() {
            return Ok(());
        }
        Err(RpcError::InvalidArgument(format!(
            "{what} would block forever: the device moves only when a test steps it (the simulator's \
             Stepped engine), and its virtual clock, which deadlines are measured on, stands still while \
             this thread waits; use Channel::call_future or a callback (Channel::call_callback, \
             read_future/write_future for one-sided operations), CallOptions::wait_for_credit = false, \
             and drive the fabric (Fabric::step, run_until_idle, advance) until the call is done"
        )))
    }

    /// One empty turn of a wait loop: fails if the channel closed, or (checked every 64th turn,
    /// together with the device's `progress` and a yield) if the deadline passed. On a device that
    /// only a test's stepping moves, fails at once (the wait would never end).
    fn idle_turn(&self, spins: &mut u32, deadline: u64) -> Result<(), RpcError> {
        if self.ep.is_closed() {
            return Err(RpcError::Closed);
        }
        self.refuse_to_block("waiting for a credit or a send context")?;
        *spins += 1;
        if *spins % 64 == 0 {
            self.ep.device.progress();
            if deadline != NO_DEADLINE && self.ep.device.now().as_nanos() as u64 >= deadline {
                return Err(RpcError::Timeout);
            }
            std::thread::yield_now();
        }
        Ok(())
    }

    /// A send context. Contexts often wait only for send completions that are already in the
    /// send CQ (a response can overtake its request's send completion), so an empty slab, or
    /// one whose registered contexts are all in use ([`Endpoint::tx_would_grow`]), first reaps
    /// them; with `wait_for_credit` it keeps reaping until one is free or the deadline.
    fn take_tx(&self, opts: &CallOptions, deadline: u64) -> Result<TxHandle, RpcError> {
        let mut spins = 0u32;
        loop {
            // Reap before a new chunk of send buffers is registered on the call path.
            if self.ep.tx_would_grow() && self.poll_send() > 0 {
                continue;
            }
            if let Some(h) = self.ep.get_tx(opts.mode, 0)? {
                return Ok(h);
            }
            if self.poll_send() > 0 {
                continue;
            }
            if !opts.wait_for_credit {
                return Err(RpcError::WouldBlock("every send context is in use"));
            }
            self.idle_turn(&mut spins, deadline)?;
        }
    }

    fn start(
        &self,
        opts: &CallOptions,
        function: FunctionId,
        args: &[u8],
        sink: Sink,
    ) -> Result<(), RpcError> {
        self.start_args(opts, function, rndv::Args::Bytes(args), sink, None, None)
    }

    /// Starts a call. `blocking` names a blocking API (refused on an externally stepped device).
    /// With `staging` (a [`CallBatch`]) its request is staged there instead of
    /// posted; the batch posts it with the others. A call that would have to wait for a credit
    /// or a send context first posts what is staged (their responses are what frees them).
    fn start_args(
        &self,
        opts: &CallOptions,
        function: FunctionId,
        args: rndv::Args<'_, '_, D::Region>,
        sink: Sink,
        blocking: Option<&'static str>,
        mut staging: Option<&mut batch::Staging>,
    ) -> Result<(), RpcError> {
        if self.ep.is_closed() {
            return Err(RpcError::Closed);
        }
        let plan = self.rndv_wanted(opts, &args)?;
        let inline: &[u8] = match args {
            rndv::Args::Bytes(b) if !plan.args => b,
            _ => &[],
        };
        let len = RequestHeader::LEN + inline.len();
        if len > self.max_request {
            return Err(RpcError::TooLarge { len, max: self.max_request, header: RequestHeader::LEN });
        }
        let deadline = self.deadline_of(opts);
        let q = self.pick_queue(opts.queue)?;
        // After the checks that need no waiting, so a blocking call gets the same errors for bad
        // arguments on every engine.
        if let Some(what) = blocking {
            self.refuse_to_block(what)?;
        }
        if let Some(st) = staging.as_deref_mut() {
            st.before_start(self, q);
        }
        self.take_credit(q, opts, deadline)?;
        let h = match self.take_tx(opts, deadline) {
            Ok(h) => h,
            Err(e) => {
                let _ = self.credits[q].give(1);
                return Err(e);
            }
        };
        let req_id = if opts.mode == CallMode::EarlyRsp {
            self.table.take_id()
        } else {
            match self.table.allocate(h.to_u64()) {
                Ok(id) => id,
                Err(_) => {
                    self.abandon(h, q);
                    return Err(RpcError::WouldBlock("the request table is full"));
                }
            }
        };
        let mut descs = [wire::DmaDescriptor::default(); wire::MAX_DMA_DESCRIPTORS];
        let (ndesc, response_descriptor) = if plan.any() {
            match self.rndv_prepare(h, opts, plan, &args, &mut descs) {
                Ok(x) => x,
                Err(e) => {
                    drop(self.rndv_take(h));
                    if opts.mode != CallMode::EarlyRsp {
                        self.table.cancel(req_id);
                    }
                    self.abandon(h, q);
                    return Err(e);
                }
            }
        } else {
            (0, false)
        };
        let header = RequestHeader {
            arg_dma_count: 0,
            ack_requested: matches!(opts.mode, CallMode::Ack | CallMode::AckEarlyRsp),
            no_response: matches!(opts.mode, CallMode::EarlyRsp | CallMode::AckEarlyRsp),
            response_descriptor,
            function,
            total_size: 0,
            req_id,
            channel: self.channel_id,
            function_defined: 0,
        };
        // SAFETY: `h` is live and ours and not posted yet; nothing else references its buffer.
        let buf = unsafe { self.ep.send_buf(h) };
        let len = match wire::encode_request(buf, &header, &descs[..ndesc], inline) {
            Ok(len) => len,
            Err(e) => {
                drop(self.rndv_take(h));
                if opts.mode != CallMode::EarlyRsp {
                    self.table.cancel(req_id);
                }
                self.abandon(h, q);
                return Err(RpcError::InvalidArgument(format!("cannot encode the request: {e}")));
            }
        };
        let slot = &self.slots[h.index as usize];
        let traced_at =
            if trace::is_enabled() { trace_call_start(function, req_id, opts.mode, q) } else { 0 };
        *lock(&slot.pending) = Some(Pending {
            sink,
            req_id,
            queue: q,
            function,
            mode: opts.mode,
            deadline,
            traced_at,
            one_sided: false,
        });
        slot.handle.store(h.to_u64(), Ordering::Release);
        let life = self.ep.queues[q].epoch.load(Ordering::Acquire);
        let staged = batch::Staged { h, len: len as u32, q, req_id, mode: opts.mode, life };
        if let Some(st) = staging {
            self.armed(function, h, deadline);
            st.push(self, staged);
            return Ok(());
        }
        if let Err(e) = self.ep.post_send(q, h, len) {
            // Nothing was posted. If no other path (close, queue failure) claimed the call in
            // the meantime, undo it and report the error here; else that path delivered.
            return match self.unpost(&staged) {
                Some(pending) => {
                    if trace::is_enabled() {
                        trace_call_end(&pending, false);
                    }
                    drop(pending);
                    Err(e)
                }
                None => Ok(()),
            };
        }
        self.armed(function, h, deadline);
        Ok(())
    }

    /// A started call's request is posted (or staged): counts it and arms its deadline.
    fn armed(&self, function: FunctionId, h: TxHandle, deadline: u64) {
        if !crate::control::liveness::is_probe(function) {
            self.counters.calls.fetch_add(1, Ordering::Relaxed);
        }
        if deadline != NO_DEADLINE {
            self.slots[h.index as usize].deadline.store(deadline, Ordering::SeqCst);
            self.next_scan.fetch_min(deadline, Ordering::SeqCst);
        }
    }

    /// Delivers a call's outcome (recording its end first, if recording). A completion callback
    /// that panics is contained by the sink; it is counted and reported here, and the caller goes
    /// on to release the call's context as if the callback had returned.
    /// On the control loop a callback is not run but handed on (`deferred`).
    fn deliver(&self, p: Pending, result: Result<&[u8], RpcError>) {
        if trace::is_enabled() {
            trace_call_end(&p, result.is_ok());
        }
        let function = p.function;
        if matches!(p.sink, Sink::Callback(_)) && crate::control::reactor::on_loop() {
            let result = result.map(<[u8]>::to_vec);
            return self.deferred.push(deferred::Deferred::Call { sink: p.sink, function, result });
        }
        if p.sink.deliver(result) {
            self.callback_panicked(function);
        }
    }

    /// Runs the deliveries the control loop handed on, in order (on the calling thread, which
    /// is not the loop, except when the loop lets go of the channel after a panic of its own).
    pub(crate) fn run_deferred(&self) {
        for d in self.deferred.take() {
            match d {
                deferred::Deferred::Call { sink, function, result } => {
                    let (bytes, result) = match result {
                        Ok(bytes) => (bytes, Ok(())),
                        Err(e) => (Vec::new(), Err(e)),
                    };
                    if sink.deliver(result.map(|()| &bytes[..])) {
                        self.callback_panicked(function);
                    }
                }
                deferred::Deferred::Break(cb, reason) => run_break_callback(self.channel_id, cb, reason),
            }
        }
    }

    /// Whether the control loop has handed on deliveries that wait to be run.
    pub(crate) fn has_deferred(&self) -> bool {
        self.deferred.pending()
    }

    #[cold]
    fn callback_panicked(&self, function: FunctionId) {
        let n = self.counters.callback_panics.fetch_add(1, Ordering::Relaxed);
        if n == 0 {
            eprintln!(
                "bypass: a completion callback of channel {} (function {function}) panicked; the panic was \
                 contained: that call is finished, its resources are released and other calls are unaffected. \
                 Further callback panics on this channel are only counted (ChannelStats::callback_panics)",
                self.channel_id
            );
        }
    }

    /// Undoes a started call whose request could not be posted: if no other path (close, queue
    /// failure) claimed it meanwhile, returns its pending call for the caller to report (else
    /// that path delivered). Its context, request id and credit are released either way — the
    /// credit only while the queue is still in the life the call was started in (a recovery
    /// refilled the credits of the new one).
    fn unpost(&self, s: &batch::Staged) -> Option<Pending> {
        let claimed = self.ep.tx.claim_completion(s.h) == Ok(true);
        if claimed {
            drop(self.rndv_take(s.h));
        }
        let pending = if claimed { self.take_pending(s.h) } else { None };
        if s.mode != CallMode::EarlyRsp {
            self.table.cancel(s.req_id);
        }
        let _ = self.ep.tx.fail(s.h, FailReason::SendError);
        if self.ep.queues[s.q].epoch.load(Ordering::Acquire) == s.life {
            let _ = self.credits[s.q].give(1);
        }
        pending
    }

    /// Releases a context that was never posted, and its credit.
    fn abandon(&self, h: TxHandle, q: usize) {
        let _ = self.ep.tx.fail(h, FailReason::SendError);
        let _ = self.credits[q].give(1);
    }

    /// Takes the call of context `h` after a successful claim, then ends the claim's hold on the
    /// context: until here the context cannot be released, so its slot (and `pending`) cannot
    /// pass to the next call while the winner is on its way to it.
    fn take_pending(&self, h: TxHandle) -> Option<Pending> {
        let slot = &self.slots[h.index as usize];
        slot.deadline.store(NO_DEADLINE, Ordering::Relaxed);
        let pending = lock(&slot.pending).take();
        let _ = self.ep.tx.end_claim(h);
        pending
    }

    pub(crate) fn poll(&self) -> usize {
        let n = self.poll_recv(false) + self.poll_send();
        // Timeouts are checked every 32nd poll: reading the clock on every poll costs more than
        // a poll of an empty CQ. A deadline is therefore honoured to within 32 polls.
        if self.polls.fetch_add(1, Ordering::Relaxed) % 32 == 0 {
            self.check_timeouts();
        }
        n
    }

    /// Polls the receive CQ if no other thread is polling it; `wait`: waits for the thread
    /// that is (see [`collect_arrived`](Self::collect_arrived)).
    fn poll_recv(&self, wait: bool) -> usize {
        let mut wc = [Completion::default(); POLL_BATCH];
        let (n, _in_flight) = self.ep.poll_recv_tracked(&mut wc, wait);
        if n > 0 {
            self.live.mark_heard();
        }
        for c in &wc[..n] {
            self.on_recv(c);
        }
        n
    }

    fn poll_send(&self) -> usize {
        let mut wc = [Completion::default(); POLL_BATCH];
        let n = self.ep.poll_send(&mut wc);
        for c in &wc[..n] {
            self.on_send(c);
        }
        n
    }

    fn on_recv(&self, c: &Completion) {
        if !self.ep.is_buf(c.wr_id) {
            if let Some(q) = crate::conn::recovery::drain_queue(c.wr_id) {
                return self.ep.mark_drained(q, true);
            }
            protocol_error(
                &self.counters,
                &format_args!("a receive completion with unknown wr_id {}", c.wr_id),
            );
            return;
        }
        let buf = c.wr_id as u32;
        let q = self.ep.queue_of_buf(buf);
        if !c.status.is_ok() {
            self.queue_failed(q, c.status);
            // Kept for the queue's recovery.
            return self.ep.park(buf);
        }
        // SAFETY: the completion hands `buf` to us; we re-post it only after the last use of
        // `bytes` below.
        let bytes = unsafe { self.ep.recv_bytes(buf, c.byte_len as usize) };
        match wire::parse(bytes) {
            Ok(Parsed::Response(r)) if r.header.channel == self.channel_id => self.on_response(q, &r),
            Ok(Parsed::Ack(a)) if a.channel == self.channel_id => {
                if trace::is_enabled() {
                    let (name, arg) = if a.is_credit_grant() {
                        ("grant received", "credits")
                    } else {
                        ("ack received", "req_id")
                    };
                    trace::instant(TRACK, name, &[(arg, a.req_id.into()), ("queue", q.into())]);
                }
                if a.is_credit_grant() {
                    if self.credits[q].give(a.req_id).is_err() {
                        protocol_error(&self.counters, &"a credit grant beyond the window");
                    }
                } else {
                    self.on_ack(a.req_id);
                }
            }
            Ok(Parsed::Request(_)) => protocol_error(&self.counters, &"a request sent to a client"),
            Ok(other) => {
                protocol_error(&self.counters, &format_args!("a {:?} for another channel", other.msg_type()))
            }
            Err(e) => protocol_error(&self.counters, &e),
        }
        self.ep.repost(buf);
    }

    fn on_response(&self, q: usize, r: &ResponseView<'_>) {
        // Every response ends the server's use of one request buffer: one credit back.
        if self.credits[q].give(1).is_err() {
            protocol_error(&self.counters, &"a response beyond the credit window");
        }
        let Some(v) = self.table.complete(r.header.req_id) else { return };
        let h = TxHandle::from_u64(v);
        let Ok(mode) = self.ep.tx.mode(h) else {
            self.counters.stale.fetch_add(1, Ordering::Relaxed);
            return;
        };
        if self.ep.tx.claim_completion(h) == Ok(true) {
            let rndv = self.rndv_take(h);
            if let Some(p) = self.take_pending(h) {
                if mode.requires(Event::Ack) {
                    p.sink.acked(); // the response implies the ACK, even if that is still on its way
                }
                let result = match r.header.status {
                    wire::Status::Success => match &rndv {
                        Some(x) => x.response(r.data),
                        None => Ok(r.data),
                    },
                    wire::Status::FunctionErr => Err(RpcError::FunctionNotFound(p.function)),
                    s => Err(RpcError::Status(s)),
                };
                self.deliver(p, result);
            }
            // The server is done with the call's memory: back to the pools.
            drop(rndv);
        }
        // A response implies the ACK (in ACK mode the ACK may be processed after the response by
        // another poller); a duplicate ACK report is refused by the slab and harmless.
        if mode.requires(Event::Ack) {
            let _ = self.ep.tx.complete(h, Event::Ack);
        }
        if mode.requires(Event::Rsp) {
            let _ = self.ep.tx.complete(h, Event::Rsp);
        }
    }

    fn on_ack(&self, req_id: u32) {
        let Some(v) = self.table.peek(req_id) else { return self.count_stale() };
        let h = TxHandle::from_u64(v);
        match self.ep.tx.mode(h) {
            Ok(CallMode::Ack) => {
                if let Some(p) = lock(&self.slots[h.index as usize].pending).as_ref() {
                    if p.req_id == req_id {
                        p.sink.acked();
                    }
                }
                let _ = self.ep.tx.complete(h, Event::Ack);
            }
            Ok(CallMode::AckEarlyRsp) => {
                if self.table.complete(req_id) != Some(v) {
                    return; // counted by the table
                }
                if self.ep.tx.claim_completion(h) == Ok(true) {
                    if let Some(p) = self.take_pending(h) {
                        p.sink.acked();
                        self.deliver(p, Ok(&[]));
                    }
                }
                let _ = self.ep.tx.complete(h, Event::Ack);
            }
            Ok(_) => protocol_error(&self.counters, &"an ACK for a call that did not ask for one"),
            Err(_) => self.count_stale(),
        }
    }

    fn count_stale(&self) {
        self.counters.stale.fetch_add(1, Ordering::Relaxed);
    }

    fn on_send(&self, c: &Completion) {
        if !c.status.is_ok() {
            if let Some(q) = crate::conn::recovery::drain_queue(c.wr_id) {
                return self.ep.mark_drained(q, false);
            }
        }
        let (h, one_sided) = one_sided::split_wr_id(c.wr_id);
        if one_sided {
            // The device is done with the operation's local memory (before the context can pass
            // to another user below).
            self.release_held(h.index);
        }
        if c.status.is_ok() {
            if self.ep.tx.mode(h) == Ok(CallMode::EarlyRsp) && self.ep.tx.claim_completion(h) == Ok(true) {
                if let Some(p) = self.take_pending(h) {
                    self.deliver(p, Ok(&[]));
                }
            }
            let _ = self.ep.tx.complete(h, Event::SendCqe);
            return;
        }
        let err = if one_sided && c.status != hal::Status::Flushed {
            // The operation's own error names its cause even if the channel closed because of it.
            one_sided::error_of(c.status)
        } else if self.ep.is_closed() {
            RpcError::Closed
        } else {
            RpcError::Queue(c.status)
        };
        self.finish_claimed(h, err, None);
        let reason =
            if c.status == hal::Status::Flushed { FailReason::Flushed } else { FailReason::SendError };
        let _ = self.ep.tx.fail(h, reason);
        if let Some(q) = self.ep.queue_index(c.qpn) {
            self.queue_failed(q, c.status);
        }
    }

    /// If `h`'s call can be claimed (and `pred` accepts it), delivers `err` to it and frees its
    /// table slot. Returns whether it did.
    fn finish_claimed(&self, h: TxHandle, err: RpcError, pred: Option<&dyn Fn(&Pending) -> bool>) -> bool {
        let slot = &self.slots[h.index as usize];
        if let Some(pred) = pred {
            match lock(&slot.pending).as_ref() {
                Some(p) if pred(p) => {}
                _ => return false,
            }
        }
        if self.ep.tx.claim_completion(h) != Ok(true) {
            return false;
        }
        // The server may still READ or WRITE a rendezvous call's memory: never reuse it.
        let mut rndv = self.rndv_take(h);
        if let Some(x) = rndv.as_mut() {
            x.poison();
        }
        let Some(p) = self.take_pending(h) else { return false };
        if p.mode != CallMode::EarlyRsp {
            self.table.cancel(p.req_id);
        }
        self.deliver(p, Err(err));
        drop(rndv);
        true
    }

    /// Fails every outstanding call `pred` accepts with the error `make` builds; returns how many.
    fn fail_calls(
        &self,
        pred: &dyn Fn(&Pending) -> bool,
        make: &dyn Fn() -> RpcError,
        reason: FailReason,
    ) -> usize {
        let mut n = 0;
        for slot in self.slots.iter() {
            let h = TxHandle::from_u64(slot.handle.load(Ordering::Acquire));
            if h.to_u64() == u64::MAX {
                continue;
            }
            if self.finish_claimed(h, make(), Some(pred)) {
                let _ = self.ep.tx.fail(h, reason);
                n += 1;
            }
        }
        n
    }

    pub(crate) fn check_timeouts(&self) -> usize {
        let now = self.ep.device.now().as_nanos() as u64;
        if now < self.next_scan.load(Ordering::SeqCst) {
            return 0;
        }
        self.next_scan.store(NO_DEADLINE, Ordering::SeqCst);
        let mut n = 0;
        for slot in self.slots.iter() {
            let d = slot.deadline.load(Ordering::SeqCst);
            if d == NO_DEADLINE {
                continue;
            }
            if d > now {
                self.next_scan.fetch_min(d, Ordering::SeqCst);
                continue;
            }
            let h = TxHandle::from_u64(slot.handle.load(Ordering::Acquire));
            if self.finish_claimed(h, RpcError::Timeout, Some(&|p: &Pending| p.deadline <= now)) {
                let _ = self.ep.tx.fail(h, FailReason::Timeout);
                self.counters.timeouts.fetch_add(1, Ordering::Relaxed);
                n += 1;
            } else if slot.deadline.load(Ordering::SeqCst) == d {
                // Finished meanwhile by another path that has not cleared the deadline yet, or
                // reused: look again at the next scan.
                self.next_scan.fetch_min(d.max(now + 1), Ordering::SeqCst);
            }
        }
        n
    }

    fn queue_failed(&self, q: usize, status: hal::Status) {
        let was_ready = self.ep.queues[q].ready.swap(false, Ordering::AcqRel);
        self.ep.fail_queue(q);
        if !was_ready {
            return;
        }
        let closed = self.ep.is_closed();
        let make = || if closed { RpcError::Closed } else { RpcError::Queue(status) };
        // One-sided operations are left to their own completions: the queue is in ERROR, so the
        // device completes each (the culprit with its error, the others flushed), which names
        // the cause rather than whichever completion happened to be polled first.
        self.fail_calls(&|p: &Pending| p.queue == q && !p.one_sided, &make, FailReason::Cancelled);
        if self.config.recovery.is_some() && !self.ep.is_closed() {
            // The control loop brings it back, aside (or closes the channel past the budget).
            return self.recovery.request(q);
        }
        if self.ep.ready_queues() == 0 {
            self.close_with(CloseReason::QueuesFailed);
        }
    }

    pub(crate) fn close(&self) {
        self.close_with(CloseReason::Local);
    }

    /// Polls until the device has nothing more to give (bounded): completions that arrived
    /// before the channel closed are handled as usual. A reply another thread (a worker, a
    /// caller's own poll) already took from the CQ is waited for until that thread has delivered
    /// it, so the close does not fail a call whose reply is in hand; the wait is bounded by
    /// [`COLLECT_LIMIT`], since that thread may be running a slow callback of an earlier call.
    /// Runs aside (on a `bypass-ctl-aside` thread), never on a thread that is itself handling
    /// receive completions: it would wait for itself until the limit.
    fn collect_arrived(&self) {
        let limit = std::time::Instant::now() + COLLECT_LIMIT;
        let (mut idle, mut waited) = (0, false);
        while std::time::Instant::now() < limit {
            if self.poll_recv(true) + self.poll_send() > 0 {
                idle = 0;
                continue;
            }
            // The CQ was empty with its lock held: what earlier polls took is now either
            // handled or still counted in flight.
            if self.ep.recv_in_flight() {
                if !waited {
                    waited = true;
                    self.counters.close_waits.fetch_add(1, Ordering::Relaxed);
                }
                std::thread::yield_now();
                continue;
            }
            idle += 1;
            if idle == 3 {
                return;
            }
            self.ep.device.progress();
        }
    }

    /// Closes the channel for `reason` (the first close's reason stands): outstanding calls fail
    /// with `reason`'s error, then the break callback runs, once.
    pub(crate) fn close_with(&self, reason: CloseReason) {
        // Before the channel is marked closed, so that a closed channel always tells why
        // (`close_reason` reads it only once the channel is closed); the first reason stands.
        let reason = self.live.set_reason(reason);
        if !self.ep.mark_closed() {
            return;
        }
        if reason == CloseReason::PeerClosed {
            // A peer that answers and then closes: its answers reached our NIC before its close
            // reached us (the control stream closes after the queues). Deliver them first.
            self.collect_arrived();
        }
        // One-sided operations are left to their own completions (collected below: failing the
        // queues completes every work request, with its error or flushed), so an operation whose
        // error closed the channel still reports that error; flushed ones end `Closed`.
        self.fail_calls(&|p| !p.one_sided, &|| reason.call_error(), FailReason::Cancelled);
        for q in 0..self.ep.queues.len() {
            self.ep.fail_queue(q);
        }
        if let Some(s) = lock(&self.control).take() {
            let _ = s.shutdown(Shutdown::Both);
        }
        // Collect the flushed send completions so every context goes back to the slab.
        for _ in 0..10_000 {
            if self.ep.tx.in_use() == 0 {
                break;
            }
            if self.poll() == 0 {
                self.ep.device.progress();
                std::thread::yield_now();
            }
        }
        // Whatever is still waiting for its own completion ends now, exactly once.
        self.fail_calls(&|_| true, &|| reason.call_error(), FailReason::Cancelled);
        self.fire_break(reason);
    }

    /// Runs the break callback (if one is set) once, contained like a completion callback.
    /// On the control loop it is handed on (`deferred`), after the calls' outcomes.
    fn fire_break(&self, reason: CloseReason) {
        let callback = {
            let mut slot = lock(&self.on_break);
            slot.fired = Some(reason);
            slot.callback.take()
        };
        if let Some(cb) = callback {
            if crate::control::reactor::on_loop() {
                return self.deferred.push(deferred::Deferred::Break(cb, reason));
            }
            run_break_callback(self.channel_id, cb, reason);
        }
    }
}

/// Runs a break callback; a panic in it is contained (and reported on stderr).
fn run_break_callback(channel_id: u32, cb: Box<dyn FnOnce(CloseReason) + Send>, reason: CloseReason) {
    // AssertUnwindSafe: the callback is consumed; nothing of it is used after a panic.
    if let Err(payload) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || cb(reason))) {
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(payload)));
        eprintln!("bypass: the break callback of channel {channel_id} panicked; the panic was contained");
    }
}

impl<D: Device + Clone> Drop for ChannelInner<D> {
    fn drop(&mut self) {
        self.close();
        // Dropped on the loop (its watch held the last reference): nobody else is left to run
        // what it handed on.
        self.run_deferred();
    }
}

impl<D: Device + Clone> Pollable for ChannelInner<D> {
    fn poll(&self) -> usize {
        ChannelInner::poll(self)
    }

    fn progress(&self) {
        self.ep.device.progress();
    }

    fn is_closed(&self) -> bool {
        self.ep.is_closed() && self.ep.tx.in_use() == 0
    }

    fn arm(&self) -> bool {
        let send = lock(&self.ep.send_cq).arm(hal::ArmMode::Any).is_ok();
        let recv = lock(&self.ep.recv_cq).arm(hal::ArmMode::Any).is_ok();
        send && recv
    }

    fn event_fds(&self, out: &mut Vec<RawFd>) {
        out.push(lock(&self.ep.send_cq).event_fd());
        out.push(lock(&self.ep.recv_cq).event_fd());
    }

    fn ack_events(&self) {
        let _ = lock(&self.ep.send_cq).ack_events();
        let _ = lock(&self.ep.recv_cq).ack_events();
    }
}
