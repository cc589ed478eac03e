//! # control: the TCP control plane handshake
//!
//! Before a client and a server can exchange RPCs over queue pairs, each needs the other's
//! [`QueueInfo`]s (queue number, GID, PSN, ...) and a few connection parameters. They agree on
//! them over an ordinary TCP connection: the client sends a [`ClientHello`], the server answers
//! with a [`ServerHello`] or refuses with a [`Reject`]. After a successful handshake the data path
//! runs on the queues, and the TCP stream stays open: **its closure means the connection is
//! closed**. Since version 3 it also carries the [`session`] frames (queue reset and its answer,
//! for queue recovery) and nothing else; the process's control loop on each side watches it.
//!
//! The stream may be TLS 1.3 ([`ControlStream`], [`connect_with`], [`Handshake::with_tls`];
//! see [`crate::control::tls`]): then a TLS handshake comes first and every frame below travels inside
//! the TLS session. A server that requires TLS refuses a plaintext client, and a plaintext
//! server a TLS client, with a plaintext reject of code 5 ([`RejectCode::Tls`]).
//!
//! ## Frames
//!
//! Every message is one frame: a 12-byte header, then a body. All multi-byte integers are
//! little-endian.
//!
//! | bytes | field |
//! |---|---|
//! | 0-3 | magic `"BYPC"` (`42 59 50 43`) |
//! | 4 | message type: 1 = client hello, 2 = server hello, 3 = reject, 4 = queue reset, 5 = queue reset answer ([`session`]) |
//! | 5 | reserved, must be 0 |
//! | 6-7 | control protocol version of the sender (u16, [`CONTROL_VERSION`] = 6) |
//! | 8-11 | body length in bytes (u32), at most [`MAX_BODY_LEN`] (64 KiB) |
//! | 12.. | body |
//!
//! Body fields use three encodings:
//!
//! - a *string* is a u16 length followed by that many bytes of UTF-8;
//! - a *queue list* is a u16 count followed by `count` queue infos, each as
//!   [`QueueInfo::encode`] writes it: a version byte (1), a body length byte (37; a reader skips
//!   what follows the fields it knows), then gid 16, qpn u32, psn u32, lid u16, uasid u32,
//!   token u32 — room for a verbs GID/QPN/PSN/LID and a URMA EID/jetty id/uasid/token — and
//!   `responder_resources` u8 (since control version 4: the queue's `max_dest_rd_atomic`; each
//!   side keeps its queues' initiator depth at or below the peer's, as rdma_cm negotiates),
//!   `requester_depth` u8 (its `max_rd_atomic`) and a u8 saying which of the two are known
//!   (bit 0, bit 1; since control version 6, so that a known 0 is told from "unknown");
//! - integers are fixed-size, little-endian.
//!
//! ### Client hello (type 1)
//!
//! | field | encoding | limit |
//! |---|---|---|
//! | `window` | u32 | |
//! | `max_msg` | u32 | |
//! | `keepalive_ms` | u32: the client's keepalive interval, 0 for none (since version 5) | |
//! | `keepalive_misses` | u32: probes missed before it gives up, 0 for none (since version 5) | |
//! | `server_name` | string | [`MAX_NAME_LEN`] bytes |
//! | `client_info` | string | [`MAX_INFO_LEN`] bytes |
//! | `queues` | queue list | [`MAX_QUEUES`] entries |
//!
//! ### Server hello (type 2)
//!
//! | field | encoding | limit |
//! |---|---|---|
//! | `channel_id` | u32 | below 2^24 ([`MAX_CHANNEL_ID`]) |
//! | `credits` | u32 | |
//! | `max_msg` | u32 | |
//! | `server_name` | string | [`MAX_NAME_LEN`] bytes |
//! | `queues` | queue list | [`MAX_QUEUES`] entries, as many as the client sent |
//!
//! ### Reject (type 3)
//!
//! | field | encoding | limit |
//! |---|---|---|
//! | `code` | u8: 1 = version, 2 = wrong server name, 3 = refused, 4 = malformed, 5 = TLS mismatch | |
//! | `server_name` | string: the server's own name | [`MAX_NAME_LEN`] bytes |
//! | `reason` | string: readable text | [`MAX_REASON_LEN`] bytes |
//!
//! The reject layout is the same in every protocol version, so a peer that speaks another
//! version can still read why it was turned away. The header's version field of a reject is the
//! rejecting server's version.
//!
//! ## Handshake
//!
//! 1. The client opens a TCP connection ([`connect`]), trying each address `addr` resolves to.
//! 2. The client sends its [`ClientHello`].
//! 3. The server ([`accept`]) reads it and checks, in this order:
//!    - the header's version equals [`CONTROL_VERSION`], else it rejects with code *version*
//!      (the body is not parsed: another version may lay it out differently);
//!    - the frame parses, else it rejects with code *malformed*;
//!    - `server_name` equals the server's name, else it rejects with code *wrong server name*;
//!    - its `accept` callback agrees, else it rejects with code *refused* and the callback's reason.
//! 4. The server sends its [`ServerHello`]: one queue per client queue, in the same order.
//! 5. The client checks the answer's version, server name and queue count.
//!
//! Both sides then connect their queues to the peer's. After that only the [`session`] frames
//! travel on the stream (version 3): the client's [`QueueReset`] and the server's
//! [`QueueResetDone`], which re-exchange one queue's [`QueueInfo`] when that queue is recovered
//! from ERROR. Anything else after the handshake is a protocol error that closes the connection
//! (the stack's control loop; [`wait_closed`] is the plain form that treats any byte as
//! closure).
//!
//! ## Errors
//!
//! Every failure is a [`ControlError`]. A rejection reaches the client as the same error the
//! server returns: [`ControlError::VersionMismatch`] (each side with its own version as `ours`),
//! [`ControlError::WrongServerName`] (same fields on both sides), [`ControlError::Rejected`]
//! (the callback's reason). A peer that closes or resets the stream before the handshake is done is
//! [`ControlError::Closed`]; bytes that do not parse are [`ControlError::Malformed`], naming what
//! was wrong; a message this side cannot encode (a name over the limit, too many queues) is
//! [`ControlError::Unencodable`] — nothing is ever truncated to fit, except a reject's free-form
//! reason. Decoding never panics and never allocates more than the frame it was given; reading
//! from a socket never allocates more than [`MAX_BODY_LEN`] plus the header, whatever a length
//! field claims.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

use std::fmt;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use bypass_hal::QueueInfo;

mod frame;
mod frame_io;
mod handshake;
#[cfg(not(loom))]
pub(crate) mod reactor;
pub mod session;
mod stream;
pub mod tls;
pub use session::{QueueReset, QueueResetDone};
pub use stream::{connect_with, ControlIo, ControlStream};

use crate::control::tls::{TlsConfig, TlsError};

/// The control protocol version this module speaks.
///
/// Version 6 made both READ limits of every queue info known or explicitly unknown: besides
/// `responder_resources` it carries `requester_depth` (the queue's `max_rd_atomic`) and a byte
/// saying which of the two are known (the 37-byte body), so a side whose peer serves no READ, or
/// issues none, is told at connect and refuses what would need one at the call, instead of
/// failing a queue when it is tried (a known 0 used to look like "unknown").
/// Version 5 added the client's keepalive settings to its hello, so a server judges a client's
/// silence from the start instead of from the client's first probe (a busy client that froze
/// before it ever had to probe was never found). Version 4 added `responder_resources` to every queue info (the 35-byte body): both sides
/// connect with an initiator depth of at most the peer's responder resources, so a client whose
/// `max_rd_atomic` is above the server's `max_dest_rd_atomic` (or the other way round) no longer
/// has READs outstanding that the responder has no resource for. Version 3 added the frames
/// exchanged after the handshake (queue reset and its answer, for queue recovery; see
/// [`session`]); versions 1 and 2 allowed no byte after it. A server refuses a client of another
/// version with a *version* reject, as before.
pub const CONTROL_VERSION: u16 = 6;

/// Longest server name, in bytes of UTF-8.
pub const MAX_NAME_LEN: usize = 255;

/// Longest client info string, in bytes of UTF-8.
pub const MAX_INFO_LEN: usize = 4096;

/// Longest reject reason, in bytes of UTF-8. [`accept`] shortens a longer reason from its
/// callback (at a character boundary) before sending it; the server still returns it whole.
pub const MAX_REASON_LEN: usize = 1024;

/// Most queue infos one hello can carry.
pub const MAX_QUEUES: usize = 256;

/// Largest channel id a server hello can carry (channel ids are 24 bits).
pub const MAX_CHANNEL_ID: u32 = (1 << 24) - 1;

/// Size of the frame header.
pub const HEADER_LEN: usize = 12;

/// Largest body a frame may declare. A larger length field is [`ControlError::Malformed`], refused
/// before anything is allocated for it.
pub const MAX_BODY_LEN: usize = 64 * 1024;

/// The four bytes every frame starts with.
const MAGIC: [u8; 4] = *b"BYPC";

/// Everything that can go wrong in the control plane.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ControlError {
    /// No TCP connection could be opened to `addr` (nothing listens, no route, timeout, or the
    /// address does not resolve). `source` is the error of the last address tried.
    #[error("{}", connect_message(.addr, .source))]
    Connect {
        /// The socket addresses the caller's address resolved to (or, if it did not resolve,
        /// a text saying so).
        addr: String,
        /// Why the (last) attempt failed.
        source: io::Error,
    },
    /// Reading or writing the stream failed (a timeout is an error of kind
    /// [`io::ErrorKind::TimedOut`]).
    #[error("control connection I/O failed: {0}")]
    Io(#[from] io::Error),
    /// The two sides speak different control protocol versions.
    #[error(
        "control protocol version mismatch: this side speaks version {ours}, the peer speaks version {theirs}"
    )]
    VersionMismatch {
        /// This side's version.
        ours: u16,
        /// The peer's version.
        theirs: u16,
    },
    /// The client asked for a server by a name the server does not have. Both sides report the
    /// same fields: `expected` is what the client asked for, `actual` is the server's name.
    #[error("wrong server name: the client expected {expected:?}, but the server is {actual:?}")]
    WrongServerName {
        /// The name the client expected.
        expected: String,
        /// The server's actual name.
        actual: String,
    },
    /// The server refused the connection; the text is its reason.
    #[error("the server refused the connection: {0}")]
    Rejected(String),
    /// The peer's bytes do not form a valid control message; the text says what was wrong.
    #[error("malformed control message: {0}")]
    Malformed(String),
    /// The peer closed (or reset) the stream before the handshake finished.
    #[error("the peer closed the control connection before the handshake finished")]
    Closed,
    /// The server answered with a different number of queues than the client offered (the server
    /// returns this when its `accept` callback built such an answer; it rejects the client).
    #[error("queue count mismatch: the client offered {client} queues, the server answered with {server}")]
    QueueCountMismatch {
        /// Queues in the client hello.
        client: usize,
        /// Queues in the server hello.
        server: usize,
    },
    /// A message this side was asked to send does not fit the format (a string over its limit,
    /// too many queues, a channel id over 24 bits, ...). Nothing was sent for it.
    #[error("cannot encode control message: {0}")]
    Unencodable(String),
    /// TLS failed or was refused: the two sides disagree on using it, a certificate was refused
    /// (the error says whose and why), or the TLS material could not be loaded.
    #[error("{0}")]
    Tls(#[from] TlsError),
}

/// The readable text of [`ControlError::Connect`].
fn connect_message(addr: &str, err: &io::Error) -> String {
    match err.kind() {
        io::ErrorKind::ConnectionRefused => format!("nothing listens at {addr} (connection refused)"),
        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => {
            format!("no answer from {addr} within the connect timeout ({err})")
        }
        _ => format!("cannot connect to {addr}: {err}"),
    }
}

pub use frame::*;
#[allow(unused_imports)]
use frame_io::*;
pub use handshake::*;

#[cfg(all(test, not(loom)))]
mod tests;
