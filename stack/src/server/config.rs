//! A server's configuration ([`ServerConfig`], [`RecvBuffers`]), validated against the device.

#![forbid(unsafe_code)]

use super::*;

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
    /// Most bytes of memory one connection may commit: its buffers, queues × (send contexts +
    /// receive buffers per queue) × `msg_size`, with 3 × window and window + min(16, window)
    /// per queue (no receive buffers with the shared receive pool, [`RecvBuffers::Shared`],
    /// whose size this also caps), and its queues' rings and completion queues (counted at 128
    /// bytes per send ring entry, 64 per receive ring entry and per completion; every send
    /// ring holds all the connection's send contexts, so this part grows with the square of
    /// the queue count: 64 queues at a window of 128 would need 268 MiB of send rings alone).
    /// A client's window is scaled down until its connection fits; a client whose queues do not
    /// fit even at a window of 1 is refused with a reason naming this field, and a config whose
    /// single queue does not fit is refused by [`Server::bind`]. Default
    /// [`DEFAULT_MEMORY_LIMIT`](crate::DEFAULT_MEMORY_LIMIT) (256 MiB).
    pub memory_limit: u64,
    /// Most connections open at once. A client past it is refused in the handshake with a
    /// reason naming this field (the client's `Channel::connect` fails with
    /// `RpcError::Control(ControlError::Rejected(reason))`); a connection counts until it is
    /// closed and let go of. At least 1; default
    /// [`DEFAULT_MAX_CONNECTIONS`](crate::DEFAULT_MAX_CONNECTIONS) (1024).
    pub max_connections: usize,
    /// Most bytes of memory all connections together may commit (each counted as in
    /// `memory_limit`), the shared receive pool included: on a NIC that memory is pinned. A new
    /// connection's window is scaled down to what is left; a client that does not fit even at a
    /// window of 1 is refused in the handshake with a reason naming this field. A connection's
    /// memory is given back when it is closed and let go of ([`Server::committed_bytes`]).
    /// Default [`DEFAULT_MAX_MEMORY`](crate::DEFAULT_MAX_MEMORY) (1 GiB).
    pub max_memory: u64,
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
    /// Most queue resets (a client recovering a failed queue, [`Recovery`](crate::Recovery)) one
    /// connection may ask for per queue within [`QUEUE_RESET_WINDOW`](crate::QUEUE_RESET_WINDOW)
    /// (a minute): a connection of `n` queues gets `n × max_queue_resets` per window. Past it
    /// a reset is refused, without any work, with a reason naming this field (the client's
    /// recovery fails and spends its own budget). Each reset fails, drains and reconnects a
    /// queue, so this bounds what one peer can make the server do. 0: every reset is refused.
    /// Default 10 (a client's default recovery budget is 3 per queue per minute).
    pub max_queue_resets: u32,
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
            max_connections: crate::limits::DEFAULT_MAX_CONNECTIONS,
            max_memory: crate::limits::DEFAULT_MAX_MEMORY,
            rndv_memory_limit: crate::limits::DEFAULT_RNDV_MEMORY_LIMIT,
            recv_buffers: RecvBuffers::default(),
            queue_config: QueueConfig::default(),
            tls: None,
            keepalive: Some(Keepalive::default()),
            max_queue_resets: 10,
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
        if self.name.contains('\0') {
            return Err(bad_field(
                &field("name"),
                format_args!(
                    "contains a NUL byte: a server name is text without NUL (it names the worker threads)"
                ),
            ));
        }
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
        if self.max_connections == 0 {
            return Err(bad_field(
                &field("max_connections"),
                "is 0 (every client would be refused): use at least 1",
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
        // The device's limits apply to `max_window`; the memory limits may scale it down.
        let shared = self.shared_buffers(caps).is_some();
        if self.fitted_window(1, self.max_window, shared, self.max_memory).is_none() {
            return Err(bad_field(
                "ServerConfig.max_memory",
                format_args!(
                    "is {} bytes, less than one connection of one queue needs ({} bytes): raise it",
                    self.max_memory,
                    conn_bytes(1, 1, self.msg_size, shared)
                ),
            ));
        }
        self.fitted_window(1, self.max_window, shared, self.memory_limit)
            .ok_or_else(|| self.over_memory_limit(1, shared))?;
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
    pub(super) fn shared_buffers(&self, caps: &hal::DeviceCaps) -> Option<u32> {
        match self.recv_buffers {
            RecvBuffers::Shared { buffers } if caps.max_shared_recv > 0 => {
                Some(shared_pool::fitted_buffers(buffers, self.msg_size, self.memory_limit, caps))
            }
            _ => None,
        }
    }

    /// The window for a connection of `queues` queues asking for `window` (already clamped to
    /// `max_window`), scaled down until what it commits ([`conn_bytes`]; only send buffers when
    /// it receives from a `shared` pool) fits `limit` bytes; `None` when not even a window of 1
    /// does.
    pub(super) fn fitted_window(&self, queues: usize, window: u32, shared: bool, limit: u64) -> Option<u32> {
        fit_window_by(window, |w| conn_bytes(queues, w, self.msg_size, shared) <= limit)
    }

    /// The error for `queues` queues that do not fit `memory_limit` even at a window of 1.
    pub(super) fn over_memory_limit(&self, queues: usize, shared: bool) -> RpcError {
        bad_field(
            "ServerConfig.memory_limit",
            format_args!(
                "is {} bytes, but {queues} queue(s) of {}-byte messages need {} bytes of registered buffers \
                 and queue rings even at a window of 1: raise ServerConfig.memory_limit, or use a smaller \
                 ServerConfig.msg_size (or fewer queues)",
                self.memory_limit,
                self.msg_size,
                conn_bytes(queues, 1, self.msg_size, shared)
            ),
        )
    }
}

/// Per queue: the server's send contexts, receive buffers and re-post batch for `window`. The
/// server sends at most one ACK and one response per outstanding request, plus credit grants:
/// three windows of send contexts; it receives at most `window` requests, plus re-post slack.
pub(super) fn server_depths(window: u32) -> (u32, u32, usize) {
    let repost_batch = MAX_REPOST_BATCH.min(window as usize);
    (3 * window, window + repost_batch as u32, repost_batch)
}
