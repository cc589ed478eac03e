//! The one error type of the RPC API.

use crate::hal;
use crate::wire::{self, FunctionId};

/// Why a call (or setting up a channel or server) failed. Every call completes exactly once:
/// with its response, or with one of these.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RpcError {
    /// The call's deadline passed before its response (or ACK) arrived. The request may or may
    /// not have run on the server.
    #[error("the call timed out (no response within its deadline)")]
    Timeout,
    /// The server has no handler for the function id (it answered FUNCTION_ERR).
    #[error("the server has no function {0}")]
    FunctionNotFound(FunctionId),
    /// The server answered with an error status other than FUNCTION_ERR.
    #[error("the server answered with status {0:?}")]
    Status(wire::Status),
    /// The queue the call used failed (its send completed with this status, or the queue entered
    /// ERROR while the call was outstanding). Other queues of the channel may still work.
    #[error("the call's queue failed ({0:?}); the call was not confirmed")]
    Queue(hal::Status),
    /// A one-sided READ or WRITE was refused by the peer's NIC: a wrong or stale remote key, a
    /// range outside the remote region, a missing REMOTE_READ / REMOTE_WRITE right (status
    /// `RemoteAccess`), or another remote error. On a reliable connection the queue it used is
    /// failed by this (see [`Channel::write`](crate::Channel::write)).
    #[error("the peer refused the remote memory access ({0:?}): check the remote region descriptor, offset and length")]
    RemoteAccess(hal::Status),
    /// The local NIC refused a one-sided operation's local memory (a key of another device, a
    /// range outside the region, a missing right). The queue it used is failed by this.
    #[error("the local NIC refused the operation's local memory ({0:?})")]
    LocalAccess(hal::Status),
    /// The connection is closed: the peer closed it, the control connection broke, this side
    /// closed it, or no queue of the channel is usable any more.
    #[error("the connection is closed")]
    Closed,
    /// The connection broke: the peer stopped answering (keepalive: nothing was received from it
    /// for the configured `interval × misses`, as with a frozen process or a cut link), or a
    /// queue kept failing past its recovery budget. Calls outstanding at that moment fail with
    /// this; the channel is closed, later calls get [`RpcError::Closed`], and the break callback
    /// runs once ([`CloseReason`](crate::CloseReason) says which).
    #[error("the connection is broken ({0})")]
    ConnectionBroken(crate::CloseReason),
    /// Nothing can be sent now without waiting (no credit left on the chosen queue, request
    /// table full, all send contexts busy). Retry after some calls complete, or call with
    /// `wait_for_credit` set.
    #[error("would block: {0}")]
    WouldBlock(&'static str),
    /// The message does not fit the negotiated message size. `msg_size` counts the header, so
    /// at most `max - header` bytes of arguments (or response data) fit; sending more needs a
    /// larger `msg_size` on *both* sides (the smaller of the client's and the server's applies).
    #[error(
        "the message needs {len} bytes ({header}-byte header included) but the largest message is {max} bytes: \
         at most {fit} bytes of arguments (or response data) fit, because msg_size includes the header; \
         to send more, raise msg_size on both the client (ChannelConfig) and the server (ServerConfig)",
        fit = .max.saturating_sub(*.header)
    )]
    TooLarge {
        /// Bytes needed, header included.
        len: usize,
        /// The largest message, header included: the smaller of the two sides' `msg_size`.
        max: usize,
        /// Bytes of `len` and `max` taken by the header (20 for a request, 16 for a response).
        header: usize,
    },
    /// An argument was invalid (a queue index out of range, a bad configuration).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The device refused an operation while setting up or posting.
    #[error("device error: {0}")]
    Device(#[from] hal::Error),
    /// Connection setup failed (nothing listening, version mismatch, wrong server name, refused).
    #[error("connection setup failed: {0}")]
    Control(#[from] crate::control::ControlError),
}

impl RpcError {
    /// Whether retrying later may succeed without changing anything ([`RpcError::WouldBlock`]).
    pub fn is_would_block(&self) -> bool {
        matches!(self, RpcError::WouldBlock(_))
    }
}

/// `Result` with [`RpcError`].
pub type Result<T, E = RpcError> = std::result::Result<T, E>;

/// An [`RpcError::InvalidArgument`] naming the configuration field `field`.
pub(crate) fn bad_field(field: &str, why: impl std::fmt::Display) -> RpcError {
    RpcError::InvalidArgument(format!("{field} {why}"))
}
