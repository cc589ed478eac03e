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

// No `unsafe` here: the buffer views this module uses are conn/'s safe ones (their ownership
// is carried by `conn::bufs`'s tokens and by `RndvMem`).
#![forbid(unsafe_code)]

use crate::client::delivery::{Oneshot, Sink};
use crate::conn::endpoint::Endpoint;
use crate::conn::liveness::{CloseReason, Keepalive, Live};
use crate::conn::sizes::{buffer_bytes, fit_window, validate_queue_config, validate_sizes, Sizes};
use crate::control::{self, ClientHello, ControlIo, CONTROL_VERSION};
use crate::core::credits::Credits;
use crate::core::req_table::ReqTable;
use crate::core::tx_ctx::{CallMode, Event, FailReason, TxError, TxHandle};
use crate::error::bad_field;
use crate::hal::trace::{self, Track};
use crate::hal::{self, Completion, CompletionQueue, Device, QueueConfig};
use crate::limits::{MAX_REPOST_BATCH, MAX_WINDOW, MIN_MSG_SIZE};
use crate::sync::{lock, SpinLock};
use crate::wire::{self, FunctionId, Parsed, RequestHeader, ResponseView};
use crate::worker::Pollable;
use crate::RpcError;
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

mod batch;
mod complete;
mod config;
mod start;
#[allow(unused_imports)]
use complete::*;
pub use config::*;
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
    pending: SpinLock<Option<Pending>>,
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
    /// The server's queues' READ limits from its hello, the lowest of them (`None`: not
    /// known): READs it serves in flight (`responder_resources`) and READs it may issue
    /// (`requester_depth`). A known 0 refuses one-sided READs and rendezvous arguments
    /// respectively at the call.
    server_reads: (Option<u8>, Option<u8>),
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
                pending: SpinLock::new(None),
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
            // `None < Some(_)`: one queue of unknown limits makes them unknown.
            server_reads: (
                server.queues.iter().map(|q| q.responder_resources).min().flatten(),
                server.queues.iter().map(|q| q.requester_depth).min().flatten(),
            ),
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
        let watch =
            monitor::ChannelWatch::new(stream, weak, keepalive).map_err(control::ControlError::from)?;
        crate::control::reactor::watch(Box::new(watch)).map_err(control::ControlError::from)?;
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

    /// Bytes of rendezvous memory (included in [`rndv_in_use`](Self::rndv_in_use)) held for
    /// calls that timed out while the server may still READ or WRITE it: kept registered until
    /// the server answers them or their queue fails, is recovered or the channel closes. It
    /// counts against [`ChannelConfig::memory_limit`]: while it fills the limit, new rendezvous
    /// calls fail with [`RpcError::WouldBlock`]. See `docs/protocol.md` §15.
    pub fn rndv_quarantined(&self) -> u64 {
        self.inner.rndv.quarantined()
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
        self.inner.queue_failed(queue, hal::Status::Flushed, None);
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
