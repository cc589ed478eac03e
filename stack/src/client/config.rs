//! A channel's configuration ([`ChannelConfig`]: validated against the device, the window
//! fitted to the memory limit) and the per-call choices ([`CallOptions`]).

#![forbid(unsafe_code)]

use super::*;

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
    /// `max_dest_rd_atomic` 0 (no READ served) and `max_rd_atomic` 0 (no READ issued) are
    /// accepted; what needs them is refused at the call, naming the field: rendezvous
    /// arguments (the server READs them) and one-sided READs respectively.
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
    pub(super) fn fitted_window(&self) -> Result<u32, RpcError> {
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
pub(super) fn client_depths(window: u32) -> (u32, u32, usize) {
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
