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
//! | 6-7 | control protocol version of the sender (u16, [`CONTROL_VERSION`] = 4) |
//! | 8-11 | body length in bytes (u32), at most [`MAX_BODY_LEN`] (64 KiB) |
//! | 12.. | body |
//!
//! Body fields use three encodings:
//!
//! - a *string* is a u16 length followed by that many bytes of UTF-8;
//! - a *queue list* is a u16 count followed by `count` queue infos, each as
//!   [`QueueInfo::encode`] writes it: a version byte (1), a body length byte (35; a reader skips
//!   what follows the fields it knows), then gid 16, qpn u32, psn u32, lid u16, uasid u32,
//!   token u32 — room for a verbs GID/QPN/PSN/LID and a URMA EID/jetty id/uasid/token — and
//!   `responder_resources` u8 (since control version 4: the queue's `max_dest_rd_atomic`; each
//!   side keeps its queues' initiator depth at or below the peer's, as rdma_cm negotiates);
//! - integers are fixed-size, little-endian.
//!
//! ### Client hello (type 1)
//!
//! | field | encoding | limit |
//! |---|---|---|
//! | `window` | u32 | |
//! | `max_msg` | u32 | |
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

#[cfg(not(loom))]
pub(crate) mod liveness;
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
/// Version 5 added the client's keepalive settings to its hello, so a server judges a client's
/// silence from the start instead of from the client's first probe (a busy client that froze
/// before it ever had to probe was never found). Version 4 added `responder_resources` to every queue info (the 35-byte body): both sides
/// connect with an initiator depth of at most the peer's responder resources, so a client whose
/// `max_rd_atomic` is above the server's `max_dest_rd_atomic` (or the other way round) no longer
/// has READs outstanding that the responder has no resource for. Version 3 added the frames
/// exchanged after the handshake (queue reset and its answer, for queue recovery; see
/// [`session`]); versions 1 and 2 allowed no byte after it. A server refuses a client of another
/// version with a *version* reject, as before.
pub const CONTROL_VERSION: u16 = 5;

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

/// What a client sends first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientHello {
    /// The client's control protocol version (normally [`CONTROL_VERSION`]); carried in the
    /// frame header.
    pub version: u16,
    /// The name the client expects the server to have (at most [`MAX_NAME_LEN`] bytes).
    pub server_name: String,
    /// Free-form text from the client, handed to the server (at most [`MAX_INFO_LEN`] bytes).
    pub client_info: String,
    /// Messages the client keeps outstanding per queue; the server sizes its receive side from it.
    pub window: u32,
    /// Largest message, in bytes, the client will send.
    pub max_msg: u32,
    /// The client's keepalive as `(interval in ms, misses)`, or `None` when it has none: the
    /// server judges the client's silence against it from the start. On the wire: the two as
    /// u32, `(0, 0)` for none.
    pub keepalive: Option<(u32, u32)>,
    /// The client's queues (at most [`MAX_QUEUES`]).
    pub queues: Vec<QueueInfo>,
}

/// What a server answers when it accepts a client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerHello {
    /// The server's control protocol version (normally [`CONTROL_VERSION`]); carried in the
    /// frame header.
    pub version: u16,
    /// The server's name (at most [`MAX_NAME_LEN`] bytes).
    pub server_name: String,
    /// The 24-bit id the server assigned to this connection (at most [`MAX_CHANNEL_ID`]).
    pub channel_id: u32,
    /// Receive buffers the server posted per queue for this client.
    pub credits: u32,
    /// Largest message, in bytes, the server accepts and may send.
    pub max_msg: u32,
    /// The server's queues: as many as the client's, in the same order.
    pub queues: Vec<QueueInfo>,
}

/// Why a server turned a client away (the first byte of a [`Reject`] body).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RejectCode {
    /// The client's protocol version is not the server's (wire value 1).
    Version,
    /// The client asked for another server name (wire value 2).
    WrongName,
    /// The server's `accept` callback refused (wire value 3).
    Refused,
    /// The client's hello did not parse (wire value 4).
    Malformed,
    /// The client and the server disagree on TLS (wire value 5): the server requires it and the
    /// client sent plaintext, or the server does not use it and the client opened a TLS
    /// handshake. Always sent in plaintext.
    Tls,
    /// A code this version does not know (from a newer peer); treated like [`RejectCode::Refused`].
    /// Encoding `Other(n)` writes `n` as is.
    Other(u8),
}

impl RejectCode {
    /// The wire value.
    pub const fn to_u8(self) -> u8 {
        match self {
            RejectCode::Version => 1,
            RejectCode::WrongName => 2,
            RejectCode::Refused => 3,
            RejectCode::Malformed => 4,
            RejectCode::Tls => 5,
            RejectCode::Other(n) => n,
        }
    }

    /// The code for a wire value; unknown values become [`RejectCode::Other`].
    pub const fn from_u8(value: u8) -> Self {
        match value {
            1 => RejectCode::Version,
            2 => RejectCode::WrongName,
            3 => RejectCode::Refused,
            4 => RejectCode::Malformed,
            5 => RejectCode::Tls,
            n => RejectCode::Other(n),
        }
    }
}

impl fmt::Display for RejectCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RejectCode::Version => f.write_str("version"),
            RejectCode::WrongName => f.write_str("wrong server name"),
            RejectCode::Refused => f.write_str("refused"),
            RejectCode::Malformed => f.write_str("malformed"),
            RejectCode::Tls => f.write_str("TLS mismatch"),
            RejectCode::Other(n) => write!(f, "unknown code {n}"),
        }
    }
}

/// A server's refusal, sent instead of a [`ServerHello`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reject {
    /// The rejecting server's protocol version; carried in the frame header.
    pub version: u16,
    /// Why.
    pub code: RejectCode,
    /// The server's own name (at most [`MAX_NAME_LEN`] bytes).
    pub server_name: String,
    /// Readable explanation (at most [`MAX_REASON_LEN`] bytes).
    pub reason: String,
}

/// Frame message types (byte 4 of the header).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MsgType {
    ClientHello = 1,
    ServerHello = 2,
    Reject = 3,
    /// After the handshake, client → server: re-exchange one queue (`session.rs`).
    QueueReset = 4,
    /// After the handshake, server → client: the answer to a [`MsgType::QueueReset`].
    QueueResetDone = 5,
}

impl MsgType {
    fn from_u8(value: u8) -> Option<Self> {
        match value {
            1 => Some(MsgType::ClientHello),
            2 => Some(MsgType::ServerHello),
            3 => Some(MsgType::Reject),
            4 => Some(MsgType::QueueReset),
            5 => Some(MsgType::QueueResetDone),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            MsgType::ClientHello => "client hello",
            MsgType::ServerHello => "server hello",
            MsgType::Reject => "reject",
            MsgType::QueueReset => "queue reset",
            MsgType::QueueResetDone => "queue reset answer",
        }
    }
}

/// A parsed frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Header {
    kind: MsgType,
    version: u16,
    body_len: usize,
}

fn malformed(text: impl Into<String>) -> ControlError {
    ControlError::Malformed(text.into())
}

/// Parses the 12 header bytes: magic, known type, reserved 0, body length within the cap.
fn parse_header(b: &[u8; HEADER_LEN]) -> Result<Header, ControlError> {
    let [m0, m1, m2, m3, kind, reserved, v0, v1, l0, l1, l2, l3] = *b;
    if [m0, m1, m2, m3] != MAGIC {
        return Err(malformed(format!(
            "bad magic {:02x?}, expected {:02x?} (\"BYPC\"): not a control frame",
            [m0, m1, m2, m3],
            MAGIC
        )));
    }
    let kind = MsgType::from_u8(kind).ok_or_else(|| {
        malformed(format!("unknown message type {kind} (known: 1 client hello, 2 server hello, 3 reject, 4 queue reset, 5 queue reset answer)"))
    })?;
    if reserved != 0 {
        return Err(malformed(format!("reserved header byte is {reserved}, must be 0")));
    }
    let declared = u32::from_le_bytes([l0, l1, l2, l3]);
    let body_len = usize::try_from(declared).unwrap_or(usize::MAX);
    if body_len > MAX_BODY_LEN {
        return Err(malformed(format!(
            "{} frame declares a {declared}-byte body, over the {MAX_BODY_LEN}-byte limit",
            kind.name()
        )));
    }
    Ok(Header { kind, version: u16::from_le_bytes([v0, v1]), body_len })
}

/// Checks a whole frame (header, then exactly `body_len` bytes) of the `expected` type and
/// returns its header and a reader over its body.
fn open_frame(frame: &[u8], expected: MsgType) -> Result<(Header, Body<'_>), ControlError> {
    let (head, body) = match frame.split_first_chunk::<HEADER_LEN>() {
        Some(split) => split,
        None => {
            return Err(malformed(format!(
                "a {}-byte frame is shorter than the {HEADER_LEN}-byte header",
                frame.len()
            )))
        }
    };
    let header = parse_header(head)?;
    if header.kind != expected {
        return Err(malformed(format!("expected a {} frame, got a {}", expected.name(), header.kind.name())));
    }
    if body.len() < header.body_len {
        return Err(malformed(format!(
            "truncated {}: the header declares a {}-byte body, only {} bytes follow",
            header.kind.name(),
            header.body_len,
            body.len()
        )));
    }
    if body.len() > header.body_len {
        return Err(malformed(format!(
            "{} trailing bytes after the {}-byte body of a {}",
            body.len() - header.body_len,
            header.body_len,
            header.kind.name()
        )));
    }
    Ok((header, Body { rest: body, what: expected.name() }))
}

/// A bounds-checked reader over a frame body.
struct Body<'a> {
    rest: &'a [u8],
    what: &'static str,
}

impl<'a> Body<'a> {
    fn take(&mut self, n: usize, field: &str) -> Result<&'a [u8], ControlError> {
        if self.rest.len() < n {
            return Err(malformed(format!(
                "{} body truncated in {field}: needs {n} more bytes, {} left",
                self.what,
                self.rest.len()
            )));
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }

    fn array<const N: usize>(&mut self, field: &str) -> Result<[u8; N], ControlError> {
        let bytes = self.take(N, field)?;
        <[u8; N]>::try_from(bytes).map_err(|_| malformed(format!("{} body: bad {field}", self.what)))
    }

    fn u8(&mut self, field: &str) -> Result<u8, ControlError> {
        Ok(u8::from_le_bytes(self.array(field)?))
    }

    fn u16(&mut self, field: &str) -> Result<u16, ControlError> {
        Ok(u16::from_le_bytes(self.array(field)?))
    }

    fn u32(&mut self, field: &str) -> Result<u32, ControlError> {
        Ok(u32::from_le_bytes(self.array(field)?))
    }

    fn string(&mut self, max: usize, field: &str) -> Result<String, ControlError> {
        let len = usize::from(self.u16(field)?);
        if len > max {
            return Err(malformed(format!(
                "{} {field} is {len} bytes long, over the {max}-byte limit",
                self.what
            )));
        }
        let bytes = self.take(len, field)?;
        match std::str::from_utf8(bytes) {
            Ok(text) => Ok(text.to_owned()),
            Err(e) => Err(malformed(format!("{} {field} is not valid UTF-8: {e}", self.what))),
        }
    }

    fn queues(&mut self) -> Result<Vec<QueueInfo>, ControlError> {
        let count = usize::from(self.u16("queue count")?);
        if count > MAX_QUEUES {
            return Err(malformed(format!(
                "{} carries {count} queues, over the limit of {MAX_QUEUES}",
                self.what
            )));
        }
        let mut queues = Vec::with_capacity(count);
        for i in 0..count {
            let (info, used) = QueueInfo::decode(self.rest)
                .map_err(|e| malformed(format!("{} queue info {i}: {e}", self.what)))?;
            self.take(used, "queue info")?;
            queues.push(info);
        }
        Ok(queues)
    }

    fn finish(self) -> Result<(), ControlError> {
        if self.rest.is_empty() {
            Ok(())
        } else {
            Err(malformed(format!(
                "{} trailing bytes after the last field of the {} body",
                self.rest.len(),
                self.what
            )))
        }
    }
}

/// Builds a frame: header with a placeholder length, the body written by `body`, then the length.
fn build_frame(
    kind: MsgType,
    version: u16,
    body: impl FnOnce(&mut Vec<u8>) -> Result<(), ControlError>,
) -> Result<Vec<u8>, ControlError> {
    let mut out = Vec::with_capacity(128);
    out.extend_from_slice(&MAGIC);
    out.push(kind as u8);
    out.push(0);
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    body(&mut out)?;
    let body_len = out.len().saturating_sub(HEADER_LEN);
    let declared = match u32::try_from(body_len) {
        Ok(len) if body_len <= MAX_BODY_LEN => len,
        _ => {
            return Err(ControlError::Unencodable(format!(
                "a {body_len}-byte {} body is over the {MAX_BODY_LEN}-byte limit",
                kind.name()
            )))
        }
    };
    if let Some(slot) = out.get_mut(8..HEADER_LEN) {
        slot.copy_from_slice(&declared.to_le_bytes());
    }
    Ok(out)
}

fn put_u32(out: &mut Vec<u8>, value: u32) {
    out.extend_from_slice(&value.to_le_bytes());
}

fn put_str(out: &mut Vec<u8>, text: &str, max: usize, field: &str) -> Result<(), ControlError> {
    let len = match u16::try_from(text.len()) {
        Ok(len) if text.len() <= max => len,
        _ => {
            return Err(ControlError::Unencodable(format!(
                "{field} is {} bytes long, over the {max}-byte limit",
                text.len()
            )))
        }
    };
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(text.as_bytes());
    Ok(())
}

fn put_queues(out: &mut Vec<u8>, queues: &[QueueInfo]) -> Result<(), ControlError> {
    let count = match u16::try_from(queues.len()) {
        Ok(count) if queues.len() <= MAX_QUEUES => count,
        _ => {
            return Err(ControlError::Unencodable(format!(
                "{} queues, over the limit of {MAX_QUEUES}",
                queues.len()
            )))
        }
    };
    out.extend_from_slice(&count.to_le_bytes());
    for queue in queues {
        out.extend_from_slice(&queue.encode());
    }
    Ok(())
}

impl ClientHello {
    /// Encodes the whole frame (header and body). [`ControlError::Unencodable`] if a string is
    /// over its limit or there are more than [`MAX_QUEUES`] queues.
    pub fn encode(&self) -> Result<Vec<u8>, ControlError> {
        build_frame(MsgType::ClientHello, self.version, |out| {
            put_u32(out, self.window);
            put_u32(out, self.max_msg);
            let (ms, misses) = self.keepalive.unwrap_or((0, 0));
            put_u32(out, ms);
            put_u32(out, misses);
            put_str(out, &self.server_name, MAX_NAME_LEN, "server name")?;
            put_str(out, &self.client_info, MAX_INFO_LEN, "client info")?;
            put_queues(out, &self.queues)
        })
    }

    /// Decodes one whole frame as written by [`encode`](Self::encode). Any version is accepted
    /// (it is returned in `version`); everything else that does not match the format exactly —
    /// including a short frame or trailing bytes — is [`ControlError::Malformed`].
    pub fn decode(frame: &[u8]) -> Result<ClientHello, ControlError> {
        let (header, mut body) = open_frame(frame, MsgType::ClientHello)?;
        let window = body.u32("window")?;
        let max_msg = body.u32("max_msg")?;
        let keepalive = match (body.u32("keepalive interval")?, body.u32("keepalive misses")?) {
            (0, 0) => None,
            (ms, misses) if ms > 0 && misses > 0 => Some((ms, misses)),
            (ms, misses) => {
                return Err(ControlError::Malformed(format!(
                    "keepalive of {ms} ms x {misses} misses: both are 0 (none) or neither"
                )))
            }
        };
        let server_name = body.string(MAX_NAME_LEN, "server name")?;
        let client_info = body.string(MAX_INFO_LEN, "client info")?;
        let queues = body.queues()?;
        body.finish()?;
        Ok(ClientHello {
            version: header.version,
            server_name,
            client_info,
            window,
            max_msg,
            keepalive,
            queues,
        })
    }
}

impl ServerHello {
    /// Encodes the whole frame (header and body). [`ControlError::Unencodable`] if the name is
    /// over [`MAX_NAME_LEN`], there are more than [`MAX_QUEUES`] queues, or `channel_id` is over
    /// [`MAX_CHANNEL_ID`].
    pub fn encode(&self) -> Result<Vec<u8>, ControlError> {
        if self.channel_id > MAX_CHANNEL_ID {
            return Err(ControlError::Unencodable(format!(
                "channel id {:#x} does not fit in 24 bits",
                self.channel_id
            )));
        }
        build_frame(MsgType::ServerHello, self.version, |out| {
            put_u32(out, self.channel_id);
            put_u32(out, self.credits);
            put_u32(out, self.max_msg);
            put_str(out, &self.server_name, MAX_NAME_LEN, "server name")?;
            put_queues(out, &self.queues)
        })
    }

    /// Decodes one whole frame as written by [`encode`](Self::encode); see
    /// [`ClientHello::decode`] for what is accepted.
    pub fn decode(frame: &[u8]) -> Result<ServerHello, ControlError> {
        let (header, mut body) = open_frame(frame, MsgType::ServerHello)?;
        let channel_id = body.u32("channel id")?;
        if channel_id > MAX_CHANNEL_ID {
            return Err(malformed(format!(
                "server hello channel id {channel_id:#x} does not fit in 24 bits"
            )));
        }
        let credits = body.u32("credits")?;
        let max_msg = body.u32("max_msg")?;
        let server_name = body.string(MAX_NAME_LEN, "server name")?;
        let queues = body.queues()?;
        body.finish()?;
        Ok(ServerHello { version: header.version, server_name, channel_id, credits, max_msg, queues })
    }
}

impl Reject {
    /// Encodes the whole frame. [`ControlError::Unencodable`] if the name or the reason is over
    /// its limit.
    pub fn encode(&self) -> Result<Vec<u8>, ControlError> {
        build_frame(MsgType::Reject, self.version, |out| {
            out.push(self.code.to_u8());
            put_str(out, &self.server_name, MAX_NAME_LEN, "server name")?;
            put_str(out, &self.reason, MAX_REASON_LEN, "reject reason")
        })
    }

    /// Decodes one whole frame as written by [`encode`](Self::encode), of any version.
    pub fn decode(frame: &[u8]) -> Result<Reject, ControlError> {
        let (header, mut body) = open_frame(frame, MsgType::Reject)?;
        let code = RejectCode::from_u8(body.u8("code")?);
        let server_name = body.string(MAX_NAME_LEN, "server name")?;
        let reason = body.string(MAX_REASON_LEN, "reason")?;
        body.finish()?;
        Ok(Reject { version: header.version, code, server_name, reason })
    }
}

/// Longest prefix of `text` that fits `max` bytes and ends at a character boundary.
fn clip(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.get(..end).unwrap_or("")
}

/// An I/O error as a control error: the peer going away is [`ControlError::Closed`], a timeout
/// is an [`io::ErrorKind::TimedOut`] error whatever the platform reports.
fn from_io(err: io::Error) -> ControlError {
    if let Some(tls) = err.get_ref().and_then(|inner| inner.downcast_ref::<TlsError>()) {
        return ControlError::Tls(tls.clone());
    }
    match err.kind() {
        io::ErrorKind::UnexpectedEof
        | io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionAborted
        | io::ErrorKind::BrokenPipe => ControlError::Closed,
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => timed_out(),
        _ => ControlError::Io(err),
    }
}

fn timed_out() -> ControlError {
    ControlError::Io(io::Error::new(
        io::ErrorKind::TimedOut,
        "the control handshake did not complete within the timeout",
    ))
}

/// One timeout budget for several reads or writes.
#[derive(Debug, Clone, Copy)]
struct Deadline {
    /// `None` when `now + timeout` does not fit an `Instant` (then each operation gets `timeout`).
    end: Option<Instant>,
    timeout: Duration,
}

impl Deadline {
    fn after(timeout: Duration) -> Self {
        Deadline { end: Instant::now().checked_add(timeout), timeout }
    }

    /// Time left, or a timeout error when none is.
    fn left(&self) -> Result<Duration, ControlError> {
        let left = match self.end {
            Some(end) => end.saturating_duration_since(Instant::now()),
            None => self.timeout,
        };
        if left.is_zero() {
            Err(timed_out())
        } else {
            Ok(left)
        }
    }
}

/// Fills `buf` from the stream before `deadline` (a slow peer cannot stretch the budget by
/// trickling bytes). End of stream is [`ControlError::Closed`].
fn read_exact_by(
    stream: &mut impl ControlIo,
    buf: &mut [u8],
    deadline: Deadline,
) -> Result<(), ControlError> {
    let mut filled = 0;
    while let Some(rest) = buf.get_mut(filled..).filter(|rest| !rest.is_empty()) {
        stream.tcp().set_read_timeout(Some(deadline.left()?))?;
        match stream.read(rest) {
            Ok(0) => return Err(ControlError::Closed),
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(from_io(e)),
        }
    }
    Ok(())
}

/// Reads one frame: header first (checked, so a bad length is refused before any allocation),
/// then exactly the declared body. Returns the header and the whole frame's bytes.
fn read_frame(stream: &mut impl ControlIo, deadline: Deadline) -> Result<(Header, Vec<u8>), ControlError> {
    let mut head = [0u8; HEADER_LEN];
    read_exact_by(stream, &mut head, deadline)?;
    let header = parse_header(&head)?;
    let mut frame = vec![0u8; HEADER_LEN + header.body_len];
    if let Some(slot) = frame.get_mut(..HEADER_LEN) {
        slot.copy_from_slice(&head);
    }
    if let Some(body) = frame.get_mut(HEADER_LEN..) {
        read_exact_by(stream, body, deadline)?;
    }
    Ok((header, frame))
}

fn write_by(stream: &mut impl ControlIo, frame: &[u8], deadline: Deadline) -> Result<(), ControlError> {
    stream.tcp().set_write_timeout(Some(deadline.left()?))?;
    stream.write_all(frame).and_then(|()| stream.flush()).map_err(from_io)
}

/// Back to a plain blocking stream for after the handshake.
fn finish_stream(stream: &TcpStream) -> Result<(), ControlError> {
    stream.set_read_timeout(None)?;
    stream.set_write_timeout(None)?;
    stream.set_nodelay(true)?;
    Ok(())
}

fn check_timeout(timeout: Duration) -> Result<(), ControlError> {
    if timeout.is_zero() {
        return Err(ControlError::Io(io::Error::new(
            io::ErrorKind::InvalidInput,
            "the control handshake timeout must not be zero",
        )));
    }
    Ok(())
}

/// Client side of the handshake.
///
/// Resolves `addr` and tries each address in turn, each with `timeout` to connect; then sends
/// `hello` and reads the server's answer, the two together within another `timeout`. On success
/// returns the open stream — read and write timeouts cleared, `TCP_NODELAY` on — and the
/// server's hello. The stream must stay open for as long as the connection lives; dropping it
/// closes the connection.
///
/// Errors: [`ControlError::Connect`] when no address accepts the connection (it names the socket
/// addresses `addr` resolved to; `addr` needs only `ToSocketAddrs`, e.g. a `(host, port)` tuple);
/// [`ControlError::Unencodable`] for a `hello` that does not fit the format (checked before
/// connecting); [`ControlError::VersionMismatch`], [`ControlError::WrongServerName`] or
/// [`ControlError::Rejected`] when the server rejects (or answers with another version or name);
/// [`ControlError::QueueCountMismatch`] when the answer's queue count is not `hello`'s;
/// [`ControlError::Malformed`], [`ControlError::Closed`] or [`ControlError::Io`] (timeouts
/// included) when the exchange itself fails. A zero `timeout` is an [`io::ErrorKind::InvalidInput`]
/// error.
pub fn connect(
    addr: impl ToSocketAddrs,
    hello: &ClientHello,
    timeout: Duration,
) -> Result<(TcpStream, ServerHello), ControlError> {
    exchange(addr, hello, timeout, None)
}

/// Like [`connect`], but `timeout` bounds the whole of it: the TCP connection attempts and the
/// exchange together.
pub fn connect_within(
    addr: impl ToSocketAddrs,
    hello: &ClientHello,
    timeout: Duration,
) -> Result<(TcpStream, ServerHello), ControlError> {
    exchange(addr, hello, timeout, Some(Deadline::after(timeout)))
}

/// [`connect`] (`total` = `None`: each step gets `timeout`) or [`connect_within`].
fn exchange(
    addr: impl ToSocketAddrs,
    hello: &ClientHello,
    timeout: Duration,
    total: Option<Deadline>,
) -> Result<(TcpStream, ServerHello), ControlError> {
    check_timeout(timeout)?;
    let frame = hello.encode()?;
    let mut stream = open(&addr, timeout, total)?;
    let deadline = total.unwrap_or_else(|| Deadline::after(timeout));
    stream.set_nodelay(true)?;
    let server = say_hello(&mut stream, hello, &frame, deadline)?;
    finish_stream(&stream)?;
    Ok((stream, server))
}

/// Sends the client's hello (`frame`, encoded from `hello`) and reads and checks the answer.
fn say_hello(
    stream: &mut impl ControlIo,
    hello: &ClientHello,
    frame: &[u8],
    deadline: Deadline,
) -> Result<ServerHello, ControlError> {
    write_by(stream, frame, deadline)?;
    let (header, answer) = read_frame(stream, deadline)?;
    let server = match header.kind {
        MsgType::Reject => return Err(rejected(hello, &Reject::decode(&answer)?)),
        MsgType::ClientHello | MsgType::QueueReset | MsgType::QueueResetDone => {
            return Err(malformed(format!(
                "expected a server hello or a reject, got a {}",
                header.kind.name()
            )))
        }
        MsgType::ServerHello if header.version != hello.version => {
            return Err(ControlError::VersionMismatch { ours: hello.version, theirs: header.version })
        }
        MsgType::ServerHello => ServerHello::decode(&answer)?,
    };
    if server.server_name != hello.server_name {
        return Err(ControlError::WrongServerName {
            expected: hello.server_name.clone(),
            actual: server.server_name,
        });
    }
    if server.queues.len() != hello.queues.len() {
        return Err(ControlError::QueueCountMismatch {
            client: hello.queues.len(),
            server: server.queues.len(),
        });
    }
    Ok(server)
}

/// Opens the TCP connection, trying every address `addr` resolves to. `ToSocketAddrs` is all
/// that is asked of `addr` (a `(host, port)` tuple has no `Display`), so errors describe it by
/// the socket addresses it resolved to.
fn open(
    addr: &impl ToSocketAddrs,
    timeout: Duration,
    total: Option<Deadline>,
) -> Result<TcpStream, ControlError> {
    let addrs: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|source| ControlError::Connect {
            addr: "the given address (it does not resolve)".into(),
            source,
        })?
        .collect();
    let described = describe_addrs(&addrs);
    let mut last = io::Error::new(io::ErrorKind::InvalidInput, "the address resolves to no socket address");
    for sock_addr in &addrs {
        let timeout = match total.map(|d| d.left()) {
            None => timeout,
            Some(Ok(left)) => left,
            Some(Err(_)) => {
                last = io::Error::new(io::ErrorKind::TimedOut, "the connect timeout ran out");
                break;
            }
        };
        match TcpStream::connect_timeout(sock_addr, timeout) {
            Ok(stream) => return Ok(stream),
            Err(e) => last = e,
        }
    }
    Err(ControlError::Connect { addr: described, source: last })
}

/// `a`, `a or b`, `a, b or c`; "an address that resolves to nothing" for none.
fn describe_addrs(addrs: &[SocketAddr]) -> String {
    match addrs {
        [] => "an address that resolves to nothing".into(),
        [one] => one.to_string(),
        [rest @ .., last] => {
            let rest: Vec<String> = rest.iter().map(SocketAddr::to_string).collect();
            format!("{} or {last}", rest.join(", "))
        }
    }
}

/// The client's error for a server's reject.
fn rejected(hello: &ClientHello, reject: &Reject) -> ControlError {
    match reject.code {
        RejectCode::Version => ControlError::VersionMismatch { ours: hello.version, theirs: reject.version },
        RejectCode::WrongName => ControlError::WrongServerName {
            expected: hello.server_name.clone(),
            actual: reject.server_name.clone(),
        },
        RejectCode::Malformed => {
            malformed(format!("the server could not parse our client hello: {}", reject.reason))
        }
        // Only a server that requires TLS says so to a plaintext client (a TLS client never
        // parses a plaintext reject: `connect_with` recognises the frame's magic instead).
        RejectCode::Tls => ControlError::Tls(TlsError::ServerRequiresTls),
        RejectCode::Refused | RejectCode::Other(_) => ControlError::Rejected(reject.reason.clone()),
    }
}

/// Server side of the handshake, on a freshly accepted stream.
///
/// Reads the [`ClientHello`] within `timeout`, then validates it: the version must be
/// [`CONTROL_VERSION`], the frame must parse, and its `server_name` must be `our_name`. On
/// success it calls `decide`, which returns the [`ServerHello`] to send (with
/// [`CONTROL_VERSION`], `our_name` and as many queues as the client sent) or the reason to refuse.
/// The answer is sent within another `timeout`. On success the stream's timeouts are cleared and
/// `TCP_NODELAY` is set, and the client's hello is returned; keep the stream open for as long as
/// the connection lives.
///
/// Every failure after the client's hello (or a broken one) has been read is reported to the
/// client with a [`Reject`] (best effort) and returned: [`ControlError::VersionMismatch`]
/// (`ours` = [`CONTROL_VERSION`]), [`ControlError::Malformed`], [`ControlError::WrongServerName`]
/// (`expected` = what the client asked for, `actual` = `our_name`), [`ControlError::Rejected`]
/// (with `decide`'s reason; the client receives at most [`MAX_REASON_LEN`] bytes of it). An answer
/// from `decide` with the wrong queue count is [`ControlError::QueueCountMismatch`], one with
/// another name or version or that cannot be encoded is [`ControlError::Unencodable`]; the client
/// is then rejected as refused. `decide` is not called when validation fails. An `our_name` over
/// [`MAX_NAME_LEN`] is [`ControlError::Unencodable`] before anything is read. Dropping the stream
/// after an error closes the connection.
pub fn accept(
    stream: &mut TcpStream,
    our_name: &str,
    timeout: Duration,
    decide: impl FnOnce(&ClientHello) -> Result<ServerHello, String>,
) -> Result<ClientHello, ControlError> {
    check_timeout(timeout)?;
    if our_name.len() > MAX_NAME_LEN {
        return Err(ControlError::Unencodable(format!(
            "our server name is {} bytes long, over the {MAX_NAME_LEN}-byte limit",
            our_name.len()
        )));
    }
    let (header, frame) = match read_frame(stream, Deadline::after(timeout)) {
        Ok(read) => read,
        Err(e @ ControlError::Malformed(_)) => {
            let reply = reject_frame(our_name, RejectCode::Malformed, &e.to_string());
            // Best effort: the error returned to our caller is the one that matters.
            let _ = write_by(stream, &reply, Deadline::after(timeout));
            return Err(e);
        }
        Err(e) => return Err(e),
    };
    let (reply, result) = respond(&header, &frame, our_name, decide);
    match (&result, write_by(stream, &reply, Deadline::after(timeout))) {
        (Ok(_), Err(e)) => return Err(e),
        (Ok(_), Ok(())) => finish_stream(stream)?,
        (Err(_), _) => {} // a reject, sent best effort
    }
    result
}

/// A reject frame from this server (a reason over [`MAX_REASON_LEN`] is clipped).
fn reject_frame(our_name: &str, code: RejectCode, reason: &str) -> Vec<u8> {
    let reject = Reject {
        version: CONTROL_VERSION,
        code,
        server_name: our_name.to_owned(),
        reason: clip(reason, MAX_REASON_LEN).to_owned(),
    };
    // `our_name` was checked against its limit and the reason is clipped: this encodes.
    reject.encode().unwrap_or_default()
}

/// The server's decision on a whole client frame, without I/O: the frame to send back (a server
/// hello, or a reject) and the outcome [`accept`] returns.
fn respond(
    header: &Header,
    frame: &[u8],
    our_name: &str,
    decide: impl FnOnce(&ClientHello) -> Result<ServerHello, String>,
) -> (Vec<u8>, Result<ClientHello, ControlError>) {
    let fail = |code: RejectCode, e: ControlError| (reject_frame(our_name, code, &e.to_string()), Err(e));
    if header.kind != MsgType::ClientHello {
        let e = malformed(format!("expected a client hello, got a {}", header.kind.name()));
        return fail(RejectCode::Malformed, e);
    }
    if header.version != CONTROL_VERSION {
        return fail(
            RejectCode::Version,
            ControlError::VersionMismatch { ours: CONTROL_VERSION, theirs: header.version },
        );
    }
    let hello = match ClientHello::decode(frame) {
        Ok(hello) => hello,
        Err(e) => return fail(RejectCode::Malformed, e),
    };
    if hello.server_name != our_name {
        let e = ControlError::WrongServerName {
            expected: hello.server_name.clone(),
            actual: our_name.to_owned(),
        };
        return fail(RejectCode::WrongName, e);
    }
    let answer = match decide(&hello) {
        Ok(answer) => answer,
        Err(reason) => {
            return (
                reject_frame(our_name, RejectCode::Refused, &reason),
                Err(ControlError::Rejected(reason)),
            )
        }
    };
    let checked = if answer.queues.len() != hello.queues.len() {
        Err(ControlError::QueueCountMismatch { client: hello.queues.len(), server: answer.queues.len() })
    } else if answer.version != CONTROL_VERSION || answer.server_name != our_name {
        Err(ControlError::Unencodable(format!(
            "the accept callback answered as server {:?} version {}, but this is server {our_name:?} \
             version {CONTROL_VERSION}",
            answer.server_name, answer.version
        )))
    } else {
        answer.encode()
    };
    match checked {
        Ok(reply) => (reply, Ok(hello)),
        Err(e) => (reject_frame(our_name, RejectCode::Refused, &format!("server error: {e}")), Err(e)),
    }
}

/// What [`Handshake::advance`] reached.
#[derive(Debug)]
pub enum HandshakeStep {
    /// Waiting for the socket: poll [`Handshake::fd`] for reading, or for writing when
    /// [`Handshake::wants_write`] (for at most [`Handshake::time_left`]), and call `advance`
    /// again.
    Pending,
    /// Finished: the client's hello, or why the handshake failed (the client was sent a reject
    /// where [`accept`] would send one). On success the stream is ready for
    /// [`Handshake::into_stream`].
    Done(Result<ClientHello, ControlError>),
}

enum HsState {
    /// Reading the client's frame: the header, then (once it parsed) the body.
    Reading { head: [u8; HEADER_LEN], got: usize, frame: Vec<u8>, header: Option<Header> },
    /// Writing our answer; `result` is what the handshake ends with once it is out.
    Writing { frame: Vec<u8>, sent: usize, result: Option<Result<ClientHello, ControlError>> },
}

/// The server side of one handshake on a non-blocking stream, for an event loop that runs many
/// at once (`poll(2)` over their [`fd`](Handshake::fd)s): the same checks, answers and errors
/// as [`accept`], but no call ever blocks, so a silent or slow client delays no other. The
/// client's frame must arrive within the timeout, and the answer must then be written within
/// another; the loop enforces them with [`Handshake::time_left`] (an expired handshake is simply dropped,
/// which closes the stream, as [`accept`] does on a timeout).
///
/// With [`Handshake::with_tls`] the server requires TLS: the handshake looks at the client's
/// first byte, runs the TLS handshake over the non-blocking socket (inside the same `advance`
/// calls, bounded by the same timeout) and then reads the hello through it.
pub struct Handshake {
    stream: ControlStream,
    timeout: Duration,
    deadline: Deadline,
    state: HsState,
    /// What the server requires: `Some` TLS (until the client's first byte decides), `None`
    /// plaintext.
    tls: Option<TlsConfig>,
    /// Whether the client's first byte is still to be looked at.
    detect: bool,
    /// The server requires TLS and the client sent plaintext: read its frame, then refuse.
    refuse_plain: bool,
}

impl fmt::Debug for Handshake {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state {
            HsState::Reading { .. } => "reading",
            HsState::Writing { .. } => "writing",
        };
        f.debug_struct("Handshake")
            .field("peer", &self.stream.tcp().peer_addr().ok())
            .field("state", &state)
            .field("tls", &self.stream.is_tls())
            .finish()
    }
}

impl Handshake {
    /// Starts the handshake on a freshly accepted stream (made non-blocking here) with
    /// `timeout` for the client's hello. A zero `timeout` is an [`io::ErrorKind::InvalidInput`]
    /// error.
    pub fn new(stream: TcpStream, timeout: Duration) -> Result<Self, ControlError> {
        Self::with_tls(stream, timeout, None)
    }

    /// Like [`Handshake::new`]; with `tls`, the server requires TLS 1.3 with a client
    /// certificate. A client that opens a TLS handshake on a server without `tls`, or sends
    /// plaintext to one with it, is sent a plaintext [`Reject`] of code [`RejectCode::Tls`] and
    /// the handshake ends with [`TlsError::TlsClient`] / [`TlsError::PlaintextClient`].
    pub fn with_tls(
        stream: TcpStream,
        timeout: Duration,
        tls: Option<&TlsConfig>,
    ) -> Result<Self, ControlError> {
        check_timeout(timeout)?;
        stream.set_nonblocking(true)?;
        Ok(Handshake {
            stream: ControlStream::Plain(stream),
            timeout,
            deadline: Deadline::after(timeout),
            state: HsState::Reading { head: [0; HEADER_LEN], got: 0, frame: Vec::new(), header: None },
            tls: tls.cloned(),
            detect: true,
            refuse_plain: false,
        })
    }

    /// The stream's file descriptor, to poll.
    pub fn fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        self.stream.tcp().as_raw_fd()
    }

    /// Whether the handshake waits to write (else it waits to read): its answer, or TLS output
    /// the socket did not take yet.
    pub fn wants_write(&self) -> bool {
        matches!(self.state, HsState::Writing { .. }) || self.stream.wants_write()
    }

    /// Time left before the handshake times out (zero once it has).
    pub fn time_left(&self) -> Duration {
        self.deadline.left().unwrap_or(Duration::ZERO)
    }

    /// The TCP stream (e.g. to clone it while `decide` runs, as a handle to shut it down).
    pub fn stream(&self) -> &TcpStream {
        self.stream.tcp()
    }

    /// Looks at the client's first byte (without consuming it): a TLS ClientHello on a server
    /// that requires TLS starts the TLS session; one on a plaintext server is refused at once;
    /// plaintext on a TLS server is read to the end of its frame, then refused. `None` once
    /// decided, else the step to return.
    fn detect(&mut self, our_name: &str) -> Option<HandshakeStep> {
        let mut first = [0u8; 1];
        loop {
            match self.stream.tcp().peek(&mut first) {
                Ok(0) => return Some(HandshakeStep::Done(Err(ControlError::Closed))),
                Ok(_) => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Some(HandshakeStep::Pending),
                Err(e) => return Some(HandshakeStep::Done(Err(from_io(e)))),
            }
        }
        self.detect = false;
        match (stream::opens_tls(first[0]), self.tls.take()) {
            (true, Some(tls)) => {
                let tcp = match self.stream.tcp().try_clone() {
                    Ok(tcp) => tcp,
                    Err(e) => return Some(HandshakeStep::Done(Err(e.into()))),
                };
                match ControlStream::accept_tls(tcp, &tls) {
                    Ok(tls_stream) => self.stream = tls_stream,
                    Err(e) => return Some(HandshakeStep::Done(Err(e))),
                }
            }
            (true, None) => {
                stream::drain(self.stream.tcp());
                let e = ControlError::Tls(TlsError::TlsClient);
                let reply = reject_frame(our_name, RejectCode::Tls, &e.to_string());
                self.deadline = Deadline::after(self.timeout);
                self.state = HsState::Writing { frame: reply, sent: 0, result: Some(Err(e)) };
            }
            (false, Some(_)) => self.refuse_plain = true,
            (false, None) => {}
        }
        None
    }

    /// Reads and writes what the socket allows without blocking, and decides once the client's
    /// whole frame is in (validation, then `decide`, exactly as [`accept`]; `decide` runs at most
    /// once per handshake, and `our_name` must be the same on every call).
    pub fn advance(
        &mut self,
        our_name: &str,
        decide: impl FnOnce(&ClientHello, &TcpStream) -> Result<ServerHello, String>,
    ) -> HandshakeStep {
        if self.detect {
            if let Some(step) = self.detect(our_name) {
                return step;
            }
        }
        if let HsState::Reading { head, got, frame, header } = &mut self.state {
            let whole = loop {
                let buf: &mut [u8] = match header {
                    None => &mut head[*got..],
                    Some(_) => &mut frame[*got..],
                };
                if buf.is_empty() {
                    match header {
                        Some(h) => break Ok((*h, std::mem::take(frame))),
                        None => match parse_header(head) {
                            Ok(h) => {
                                *frame = vec![0u8; HEADER_LEN + h.body_len];
                                frame[..HEADER_LEN].copy_from_slice(head);
                                *got = HEADER_LEN;
                                *header = Some(h);
                                continue;
                            }
                            Err(e) => break Err(e),
                        },
                    }
                }
                match self.stream.read(buf) {
                    Ok(0) => return HandshakeStep::Done(Err(stream::closed_early(&self.stream))),
                    Ok(n) => *got += n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return HandshakeStep::Pending,
                    Err(e) => {
                        // A failed TLS handshake: rustls sent its alert; let the peer read it.
                        stream::drain(self.stream.tcp());
                        return HandshakeStep::Done(Err(match from_io(e) {
                            ControlError::Closed => stream::closed_early(&self.stream),
                            other => other,
                        }));
                    }
                }
            };
            let (reply, result) = match whole {
                _ if self.refuse_plain => {
                    let e = ControlError::Tls(TlsError::PlaintextClient);
                    (reject_frame(our_name, RejectCode::Tls, &e.to_string()), Err(e))
                }
                Ok((h, frame)) => {
                    let stream = self.stream.tcp();
                    respond(&h, &frame, our_name, |hello| decide(hello, stream))
                }
                Err(e) => (reject_frame(our_name, RejectCode::Malformed, &e.to_string()), Err(e)),
            };
            self.deadline = Deadline::after(self.timeout);
            self.state = HsState::Writing { frame: reply, sent: 0, result: Some(result) };
        }
        let HsState::Writing { frame, sent, .. } = &mut self.state else {
            return HandshakeStep::Pending;
        };
        while *sent < frame.len() {
            match self.stream.write(&frame[*sent..]) {
                Ok(0) => return self.finish_write(Err(ControlError::Closed)),
                Ok(n) => *sent += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return HandshakeStep::Pending,
                Err(e) => return self.finish_write(Err(from_io(e))),
            }
        }
        // TLS output (the records of the answer) may still wait for the socket.
        match self.stream.flush() {
            Ok(()) => self.finish_write(Ok(())),
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => {
                HandshakeStep::Pending
            }
            Err(e) => self.finish_write(Err(from_io(e))),
        }
    }

    /// The write ended (`written`): a failed reject still returns the reject's error; a failed
    /// server hello returns the write's error.
    fn finish_write(&mut self, written: Result<(), ControlError>) -> HandshakeStep {
        let HsState::Writing { result, .. } = &mut self.state else { return HandshakeStep::Pending };
        let result = result.take().unwrap_or(Err(ControlError::Closed));
        HandshakeStep::Done(match (result, written) {
            (Ok(_), Err(e)) => Err(e),
            (result, _) => result,
        })
    }

    /// The stream of a finished handshake, back in blocking mode with no timeouts and
    /// `TCP_NODELAY` on; keep it open for as long as the connection lives.
    pub fn into_stream(self) -> Result<ControlStream, ControlError> {
        self.stream.tcp().set_nonblocking(false)?;
        finish_stream(self.stream.tcp())?;
        Ok(self.stream)
    }
}

/// Blocks until the peer closes the stream: a read returns end of stream or an error. Clears the
/// stream's read timeout first, so it waits as long as it takes.
///
/// Nothing may be sent on the stream after the handshake, so bytes from the peer are a protocol
/// error and count as closure too: the stream is then shut down in both directions (which the
/// peer sees as closure, and any clone of the stream as well) and the function returns. Meant for
/// a monitor thread holding a [`TcpStream::try_clone`] of the connection's stream.
pub fn wait_closed(stream: &mut impl ControlIo) {
    let _ = stream.tcp().set_read_timeout(None);
    let mut buf = [0u8; 64];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return,
            Ok(_) => {
                let _ = stream.tcp().shutdown(Shutdown::Both);
                return;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::test_rng::Rng;
    use std::net::TcpListener;
    use std::thread::{self, JoinHandle};

    /// Generous: the tests never wait for it except in the timeout tests.
    const T: Duration = Duration::from_secs(20);

    fn queue(n: u8) -> QueueInfo {
        let mut q = QueueInfo::new([n; 16], 0x100 + u32::from(n), 0x00AB_0000 | u32::from(n));
        q.lid = u16::from(n);
        q.uasid = 0x5A00 | u32::from(n);
        q.token = 0xC0DE_0000 | u32::from(n);
        q
    }

    fn client_hello(name: &str, queues: u8) -> ClientHello {
        ClientHello {
            version: CONTROL_VERSION,
            server_name: name.to_owned(),
            client_info: "pid=42 host=tester ünïcode".to_owned(),
            window: 16,
            max_msg: 8192,
            keepalive: Some((1000, 5)),
            queues: (0..queues).map(queue).collect(),
        }
    }

    fn server_hello(name: &str, queues: u8) -> ServerHello {
        ServerHello {
            version: CONTROL_VERSION,
            server_name: name.to_owned(),
            channel_id: 0x12_3456,
            credits: 64,
            max_msg: 4096,
            queues: (0..queues).map(|n| queue(n.wrapping_add(100))).collect(),
        }
    }

    fn malformed_text(r: Result<impl fmt::Debug, ControlError>) -> String {
        match r {
            Err(ControlError::Malformed(text)) => text,
            other => panic!("expected Malformed, got {other:?}"),
        }
    }

    /// Rewrites the body-length field of `frame` to match what follows the header.
    fn fix_len(frame: &mut [u8]) {
        let len = u32::try_from(frame.len() - HEADER_LEN).unwrap();
        frame[8..12].copy_from_slice(&len.to_le_bytes());
    }

    // ---- encoding and decoding ----

    #[test]
    fn client_hello_round_trip() {
        for hello in [
            client_hello("alpha", 3),
            client_hello("", 0),
            ClientHello {
                version: 7,
                server_name: "é".repeat(MAX_NAME_LEN / 2) + "x",
                client_info: "i".repeat(MAX_INFO_LEN),
                window: u32::MAX,
                max_msg: 0,
                keepalive: None,
                queues: (0..=255).map(queue).collect(),
            },
            ClientHello { keepalive: Some((u32::MAX, 1)), ..client_hello("k", 1) },
        ] {
            let frame = hello.encode().unwrap();
            assert_eq!(ClientHello::decode(&frame).unwrap(), hello);
        }
    }

    /// A keepalive with one of its two numbers 0 is neither "none" nor a limit: refused by name.
    #[test]
    fn half_a_keepalive_is_malformed() {
        for bad in [(0, 5), (1000, 0)] {
            let mut frame = client_hello("k", 1).encode().unwrap();
            // The keepalive follows the header, window and max_msg.
            frame[HEADER_LEN + 8..HEADER_LEN + 12].copy_from_slice(&u32::to_le_bytes(bad.0));
            frame[HEADER_LEN + 12..HEADER_LEN + 16].copy_from_slice(&u32::to_le_bytes(bad.1));
            let text = malformed_text(ClientHello::decode(&frame));
            assert!(text.contains("keepalive"), "{text}");
        }
    }

    #[test]
    fn largest_client_hello_fits_the_body_cap() {
        let hello = ClientHello {
            version: CONTROL_VERSION,
            server_name: "n".repeat(MAX_NAME_LEN),
            client_info: "i".repeat(MAX_INFO_LEN),
            window: 1,
            max_msg: 1,
            keepalive: Some((1000, 5)),
            queues: vec![queue(1); MAX_QUEUES],
        };
        let frame = hello.encode().unwrap();
        assert!(frame.len() - HEADER_LEN <= MAX_BODY_LEN);
        assert_eq!(ClientHello::decode(&frame).unwrap(), hello);
    }

    #[test]
    fn server_hello_round_trip() {
        for hello in [
            server_hello("alpha", 3),
            server_hello("", 0),
            ServerHello { channel_id: MAX_CHANNEL_ID, credits: u32::MAX, ..server_hello("b", 255) },
        ] {
            let frame = hello.encode().unwrap();
            assert_eq!(ServerHello::decode(&frame).unwrap(), hello);
        }
    }

    #[test]
    fn reject_round_trip() {
        for code in [
            RejectCode::Version,
            RejectCode::WrongName,
            RejectCode::Refused,
            RejectCode::Malformed,
            RejectCode::Tls,
            RejectCode::Other(0),
            RejectCode::Other(200),
        ] {
            let reject = Reject { version: 3, code, server_name: "srv".into(), reason: "because".into() };
            assert_eq!(Reject::decode(&reject.encode().unwrap()).unwrap(), reject);
            assert_eq!(RejectCode::from_u8(code.to_u8()), code);
        }
    }

    #[test]
    fn golden_client_hello() {
        let hello = ClientHello {
            version: 1,
            server_name: "srv".into(),
            client_info: "hi".into(),
            window: 8,
            max_msg: 4096,
            keepalive: Some((1000, 5)),
            queues: vec![{
                let gid = [
                    0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, 0x19, 0x1a, 0x1b, 0x1c, 0x1d, 0x1e,
                    0x1f,
                ];
                let mut q = QueueInfo::new(gid, 0x0203, 0x00AB_CDEF);
                q.lid = 0x0405;
                q.uasid = 0x0607;
                q.token = 0xDEAD_BEEF;
                q.responder_resources = 2;
                q
            }],
        };
        #[rustfmt::skip]
        let expected: &[u8] = &[
            // header: magic, type 1, reserved, version 1, body length 64
            0x42, 0x59, 0x50, 0x43, 0x01, 0x00, 0x01, 0x00, 0x40, 0x00, 0x00, 0x00,
            // window 8, max_msg 4096
            0x08, 0x00, 0x00, 0x00, 0x00, 0x10, 0x00, 0x00,
            // keepalive 1000 ms x 5
            0xe8, 0x03, 0x00, 0x00, 0x05, 0x00, 0x00, 0x00,
            // server name "srv"
            0x03, 0x00, 0x73, 0x72, 0x76,
            // client info "hi"
            0x02, 0x00, 0x68, 0x69,
            // one queue: info version 1, 35 bytes: gid, qpn, psn, lid, uasid, token,
            // responder_resources
            0x01, 0x00,
            0x01, 0x23,
            0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, 0x19, 0x1a, 0x1b, 0x1c, 0x1d, 0x1e, 0x1f,
            0x03, 0x02, 0x00, 0x00, 0xef, 0xcd, 0xab, 0x00, 0x05, 0x04, 0x07, 0x06, 0x00, 0x00,
            0xef, 0xbe, 0xad, 0xde, 0x02,
        ];
        assert_eq!(hello.encode().unwrap(), expected);
        assert_eq!(ClientHello::decode(expected).unwrap(), hello);
    }

    #[test]
    fn golden_server_hello_and_reject() {
        let hello = ServerHello {
            version: 1,
            server_name: "s".into(),
            channel_id: 0x00AB_CDEF,
            credits: 32,
            max_msg: 0x0001_0000,
            queues: vec![],
        };
        #[rustfmt::skip]
        let expected: &[u8] = &[
            0x42, 0x59, 0x50, 0x43, 0x02, 0x00, 0x01, 0x00, 0x11, 0x00, 0x00, 0x00,
            0xef, 0xcd, 0xab, 0x00, 0x20, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00,
            0x01, 0x00, 0x73,
            0x00, 0x00,
        ];
        assert_eq!(hello.encode().unwrap(), expected);
        assert_eq!(ServerHello::decode(expected).unwrap(), hello);

        let reject =
            Reject { version: 1, code: RejectCode::Refused, server_name: "s".into(), reason: "no".into() };
        #[rustfmt::skip]
        let expected: &[u8] = &[
            0x42, 0x59, 0x50, 0x43, 0x03, 0x00, 0x01, 0x00, 0x08, 0x00, 0x00, 0x00,
            0x03, 0x01, 0x00, 0x73, 0x02, 0x00, 0x6e, 0x6f,
        ];
        assert_eq!(reject.encode().unwrap(), expected);
        assert_eq!(Reject::decode(expected).unwrap(), reject);
    }

    #[test]
    fn bad_magic() {
        let mut frame = client_hello("a", 1).encode().unwrap();
        frame[0] = b'X';
        assert!(malformed_text(ClientHello::decode(&frame)).contains("magic"));
        // Entirely foreign bytes, e.g. an HTTP request.
        let http = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n";
        assert!(malformed_text(ClientHello::decode(http)).contains("magic"));
    }

    #[test]
    fn unknown_type_and_reserved_byte() {
        let frame = client_hello("a", 1).encode().unwrap();
        for kind in [0u8, 6, 0x7f, 0xff] {
            let mut bad = frame.clone();
            bad[4] = kind;
            let text = malformed_text(ClientHello::decode(&bad));
            assert!(text.contains(&format!("unknown message type {kind}")), "{text}");
            malformed_text(ServerHello::decode(&bad));
            malformed_text(Reject::decode(&bad));
        }
        let mut bad = frame.clone();
        bad[5] = 1;
        assert!(malformed_text(ClientHello::decode(&bad)).contains("reserved"));
    }

    #[test]
    fn wrong_frame_type_for_the_decoder() {
        let client = client_hello("a", 1).encode().unwrap();
        let server = server_hello("a", 1).encode().unwrap();
        assert!(malformed_text(ServerHello::decode(&client)).contains("got a client hello"));
        assert!(malformed_text(ClientHello::decode(&server)).contains("got a server hello"));
        malformed_text(Reject::decode(&client));
    }

    #[test]
    fn every_truncation_is_malformed() {
        let frames = [
            client_hello("alpha", 2).encode().unwrap(),
            server_hello("alpha", 2).encode().unwrap(),
            Reject { version: 1, code: RejectCode::Refused, server_name: "a".into(), reason: "r".into() }
                .encode()
                .unwrap(),
        ];
        for frame in &frames {
            for cut in 0..frame.len() {
                let prefix = &frame[..cut];
                // As received: the header's length no longer matches.
                assert!(matches!(ClientHello::decode(prefix), Err(ControlError::Malformed(_))));
                assert!(matches!(ServerHello::decode(prefix), Err(ControlError::Malformed(_))));
                assert!(matches!(Reject::decode(prefix), Err(ControlError::Malformed(_))));
                // With the length field rewritten to match: the body parser must notice.
                if cut >= HEADER_LEN {
                    let mut consistent = prefix.to_vec();
                    fix_len(&mut consistent);
                    assert!(matches!(ClientHello::decode(&consistent), Err(ControlError::Malformed(_))));
                    assert!(matches!(ServerHello::decode(&consistent), Err(ControlError::Malformed(_))));
                    assert!(matches!(Reject::decode(&consistent), Err(ControlError::Malformed(_))));
                }
            }
        }
    }

    #[test]
    fn oversize_length_is_malformed() {
        let mut frame = client_hello("a", 1).encode().unwrap();
        for declared in [MAX_BODY_LEN as u32 + 1, u32::MAX] {
            frame[8..12].copy_from_slice(&declared.to_le_bytes());
            let text = malformed_text(ClientHello::decode(&frame));
            assert!(text.contains("over the 65536-byte limit"), "{text}");
        }
        // Exactly at the cap is a length the header accepts (the body is then checked).
        let mut head = frame[..HEADER_LEN].to_vec();
        head[8..12].copy_from_slice(&(MAX_BODY_LEN as u32).to_le_bytes());
        assert!(parse_header(&head.try_into().unwrap()).is_ok());
    }

    #[test]
    fn bad_utf8_is_malformed() {
        // Server name "srv" sits at body offset 18..21 of the client hello, client info after it.
        let base = ClientHello { client_info: "hi".into(), ..client_hello("srv", 1) };
        let frame = base.encode().unwrap();
        let mut bad = frame.clone();
        bad[HEADER_LEN + 18] = 0xff;
        assert!(malformed_text(ClientHello::decode(&bad)).contains("server name is not valid UTF-8"));
        let mut bad = frame.clone();
        bad[HEADER_LEN + 23] = 0xc3; // a lone lead byte followed by 'i'
        assert!(malformed_text(ClientHello::decode(&bad)).contains("client info is not valid UTF-8"));

        let reject =
            Reject { version: 1, code: RejectCode::Refused, server_name: "s".into(), reason: "ok".into() };
        let mut bad = reject.encode().unwrap();
        let last = bad.len() - 1;
        bad[last] = 0x80;
        assert!(malformed_text(Reject::decode(&bad)).contains("reason is not valid UTF-8"));
    }

    #[test]
    fn trailing_bytes_are_malformed() {
        let frame = client_hello("a", 1).encode().unwrap();
        // Past the declared length.
        let mut longer = frame.clone();
        longer.push(0);
        assert!(malformed_text(ClientHello::decode(&longer)).contains("trailing"));
        // Inside the declared length, after the last field.
        fix_len(&mut longer);
        assert!(malformed_text(ClientHello::decode(&longer)).contains("trailing"));

        let mut server = server_hello("a", 1).encode().unwrap();
        server.extend_from_slice(&[1, 2, 3]);
        fix_len(&mut server);
        assert!(malformed_text(ServerHello::decode(&server)).contains("3 trailing bytes"));
    }

    #[test]
    fn too_many_queues() {
        let mut hello = client_hello("a", 0);
        hello.queues = vec![queue(1); MAX_QUEUES + 1];
        assert!(matches!(hello.encode(), Err(ControlError::Unencodable(_))));
        let mut server = server_hello("a", 0);
        server.queues = vec![queue(1); MAX_QUEUES + 1];
        assert!(matches!(server.encode(), Err(ControlError::Unencodable(_))));

        // A hand-made frame declaring 257 queues (with all their bytes present).
        hello.queues.truncate(MAX_QUEUES);
        let mut frame = hello.encode().unwrap();
        let count_at = HEADER_LEN + 4 + 4 + 8 + 2 + 1 + 2 + hello.client_info.len();
        assert_eq!(frame[count_at..count_at + 2], [0x00, 0x01]);
        frame[count_at..count_at + 2].copy_from_slice(&257u16.to_le_bytes());
        frame.extend_from_slice(&queue(1).encode());
        fix_len(&mut frame);
        assert!(malformed_text(ClientHello::decode(&frame)).contains("257 queues"));
        // A count of u16::MAX with no queue bytes behind it fails without reserving that much.
        frame.truncate(count_at + 2);
        frame[count_at..count_at + 2].copy_from_slice(&u16::MAX.to_le_bytes());
        fix_len(&mut frame);
        malformed_text(ClientHello::decode(&frame));
    }

    #[test]
    fn overlong_strings_are_refused_not_truncated() {
        let mut hello = client_hello(&"n".repeat(MAX_NAME_LEN + 1), 1);
        let err = hello.encode().unwrap_err();
        assert!(err.to_string().contains("server name is 256 bytes"), "{err}");
        // 128 two-byte characters: 256 bytes although only 128 characters.
        hello.server_name = "é".repeat(128);
        assert!(matches!(hello.encode(), Err(ControlError::Unencodable(_))));
        hello.server_name = "ok".into();
        hello.client_info = "i".repeat(MAX_INFO_LEN + 1);
        assert!(matches!(hello.encode(), Err(ControlError::Unencodable(_))));
        let server = server_hello(&"n".repeat(MAX_NAME_LEN + 1), 0);
        assert!(matches!(server.encode(), Err(ControlError::Unencodable(_))));
        let reject = Reject {
            version: 1,
            code: RejectCode::Refused,
            server_name: "s".into(),
            reason: "r".repeat(MAX_REASON_LEN + 1),
        };
        assert!(matches!(reject.encode(), Err(ControlError::Unencodable(_))));

        // A frame declaring a 256-byte name (with the bytes present) does not decode.
        let mut frame = client_hello("x", 0).encode().unwrap();
        let name_at = HEADER_LEN + 16;
        frame.splice(name_at..name_at + 3, [0x00, 0x01].into_iter().chain([b'n'; 256]));
        fix_len(&mut frame);
        assert!(malformed_text(ClientHello::decode(&frame)).contains("256 bytes long"));
    }

    #[test]
    fn channel_id_is_24_bits() {
        let hello = ServerHello { channel_id: MAX_CHANNEL_ID + 1, ..server_hello("a", 0) };
        assert!(matches!(hello.encode(), Err(ControlError::Unencodable(_))));
        let mut frame = server_hello("a", 0).encode().unwrap();
        frame[HEADER_LEN + 3] = 0x01;
        assert!(malformed_text(ServerHello::decode(&frame)).contains("24 bits"));
    }

    #[test]
    fn clip_keeps_char_boundaries() {
        assert_eq!(clip("abc", 5), "abc");
        assert_eq!(clip("abc", 2), "ab");
        assert_eq!(clip("éé", 3), "é");
        assert_eq!(clip("é", 1), "");
    }

    #[test]
    fn fuzzed_frames_never_panic() {
        let seeds = [
            client_hello("alpha", 2).encode().unwrap(),
            server_hello("alpha", 2).encode().unwrap(),
            Reject { version: 1, code: RejectCode::Version, server_name: "a".into(), reason: "r".into() }
                .encode()
                .unwrap(),
        ];
        let mut rng = Rng(0x00C0_FFEE);
        for round in 0..30_000 {
            let mut frame = seeds[round % seeds.len()].clone();
            match rng.below(4) {
                0 => {
                    for _ in 0..=rng.below(4) {
                        let at = rng.below(frame.len());
                        frame[at] = rng.next() as u8;
                    }
                }
                1 => frame.truncate(rng.below(frame.len() + 1)),
                2 => {
                    let mut tail = vec![0u8; rng.below(40)];
                    rng.fill(&mut tail);
                    frame.extend_from_slice(&tail);
                    if rng.percent(50) {
                        fix_len(&mut frame);
                    }
                }
                _ => {
                    // Keep a valid-looking header, randomize the body and its length.
                    let mut body = vec![0u8; rng.below(200)];
                    rng.fill(&mut body);
                    frame.truncate(HEADER_LEN);
                    frame.extend_from_slice(&body);
                    fix_len(&mut frame);
                }
            }
            let _ = ClientHello::decode(&frame);
            let _ = ServerHello::decode(&frame);
            let _ = Reject::decode(&frame);
        }
    }

    #[test]
    fn error_messages_name_what_is_wrong() {
        let e = ControlError::VersionMismatch { ours: 1, theirs: 2 };
        assert!(e.to_string().contains("version 1") && e.to_string().contains("version 2"));
        let e = ControlError::WrongServerName { expected: "a".into(), actual: "b".into() };
        assert_eq!(e.to_string(), "wrong server name: the client expected \"a\", but the server is \"b\"");
        assert!(ControlError::Rejected("full".into()).to_string().ends_with("full"));
        assert!(ControlError::Closed.to_string().contains("closed"));
        let e = ControlError::Connect {
            addr: "10.0.0.1:9".into(),
            source: io::Error::new(io::ErrorKind::TimedOut, "timed out"),
        };
        assert!(e.to_string().contains("no answer from 10.0.0.1:9"), "{e}");
    }

    // ---- over real sockets ----

    type ServerResult = (Result<ClientHello, ControlError>, TcpStream);

    /// Accepts one connection on 127.0.0.1 and runs [`accept`] on it in a thread.
    fn spawn_server<F>(name: &'static str, decide: F) -> (SocketAddr, JoinHandle<ServerResult>)
    where
        F: FnOnce(&ClientHello) -> Result<ServerHello, String> + Send + 'static,
    {
        spawn_raw(move |mut stream| {
            let result = accept(&mut stream, name, T, decide);
            (result, stream)
        })
    }

    /// Accepts one connection on 127.0.0.1 and hands it to `f` in a thread.
    fn spawn_raw<R: Send + 'static>(
        f: impl FnOnce(TcpStream) -> R + Send + 'static,
    ) -> (SocketAddr, JoinHandle<R>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let handle = thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            f(stream)
        });
        (addr, handle)
    }

    /// Reads one whole frame with plain blocking reads.
    fn read_raw_frame(stream: &mut TcpStream) -> Vec<u8> {
        let mut frame = vec![0u8; HEADER_LEN];
        stream.read_exact(&mut frame).unwrap();
        let len = u32::from_le_bytes(frame[8..12].try_into().unwrap()) as usize;
        frame.resize(HEADER_LEN + len, 0);
        stream.read_exact(&mut frame[HEADER_LEN..]).unwrap();
        frame
    }

    /// A raw client: connects, writes `bytes`, reads the server's whole answer.
    fn raw_client(addr: SocketAddr, bytes: &[u8]) -> Vec<u8> {
        let mut stream = TcpStream::connect(addr).unwrap();
        stream.write_all(bytes).unwrap();
        read_raw_frame(&mut stream)
    }

    fn answer_for(hello: &ClientHello, name: &str) -> ServerHello {
        ServerHello {
            version: CONTROL_VERSION,
            server_name: name.into(),
            channel_id: 0x00_0042,
            credits: hello.window * 2,
            max_msg: hello.max_msg.min(4096),
            queues: (0..hello.queues.len() as u8).map(|n| queue(n.wrapping_add(200))).collect(),
        }
    }

    #[test]
    fn handshake_succeeds_and_both_sides_see_the_other() {
        let (addr, server) = spawn_server("alpha", |hello| Ok(answer_for(hello, "alpha")));
        let hello = client_hello("alpha", 3);
        let (client_stream, answer) = connect(addr, &hello, T).unwrap();
        let (got, mut server_stream) = server.join().unwrap();
        let got = got.unwrap();

        assert_eq!(got, hello);
        assert_eq!(got.client_info, "pid=42 host=tester ünïcode");
        assert_eq!(answer, answer_for(&hello, "alpha"));
        assert_eq!(answer.queues, vec![queue(200), queue(201), queue(202)]);
        assert_eq!(answer.credits, 32);
        for stream in [&client_stream, &server_stream] {
            assert_eq!(stream.read_timeout().unwrap(), None);
            assert_eq!(stream.write_timeout().unwrap(), None);
            assert!(stream.nodelay().unwrap());
        }

        // The stream stays open: the monitor returns only once the client drops its end.
        let monitor = thread::spawn(move || {
            wait_closed(&mut server_stream);
            server_stream
        });
        assert!(!monitor.is_finished());
        drop(client_stream);
        monitor.join().unwrap();
    }

    #[test]
    fn handshake_with_no_queues() {
        let (addr, server) = spawn_server("alpha", |hello| Ok(answer_for(hello, "alpha")));
        let (_stream, answer) = connect(addr, &client_hello("alpha", 0), T).unwrap();
        assert!(answer.queues.is_empty());
        assert!(server.join().unwrap().0.unwrap().queues.is_empty());
    }

    #[test]
    fn wrong_server_name_on_both_sides() {
        let (addr, server) = spawn_server("beta", |_| panic!("accept callback must not run"));
        let client = connect(addr, &client_hello("alpha", 1), T);
        let (server_result, _stream) = server.join().unwrap();
        for result in [client.map(|_| ()), server_result.map(|_| ())] {
            match result {
                Err(ControlError::WrongServerName { expected, actual }) => {
                    assert_eq!((expected.as_str(), actual.as_str()), ("alpha", "beta"));
                }
                other => panic!("expected WrongServerName, got {other:?}"),
            }
        }
    }

    #[test]
    fn version_mismatch_on_both_sides() {
        let (addr, server) = spawn_server("alpha", |_| panic!("accept callback must not run"));
        // A version-1 client (before queue infos were versioned) meets a version-5 server.
        let hello = ClientHello { version: 1, ..client_hello("alpha", 1) };
        match connect(addr, &hello, T) {
            Err(ControlError::VersionMismatch { ours: 1, theirs: 5 }) => {}
            other => panic!("client: expected VersionMismatch {{ 1, 5 }}, got {other:?}"),
        }
        match server.join().unwrap().0 {
            Err(ControlError::VersionMismatch { ours: 5, theirs: 1 }) => {}
            other => panic!("server: expected VersionMismatch {{ 5, 1 }}, got {other:?}"),
        }
    }

    #[test]
    fn a_version_3_client_is_refused_by_a_version_5_server() {
        // Version 3 queue infos had no responder resources: a version-3 peer would connect with
        // an initiator depth the other side may have no resources for.
        let (addr, server) = spawn_server("alpha", |_| panic!("accept callback must not run"));
        let hello = ClientHello { version: 3, ..client_hello("alpha", 1) };
        match connect(addr, &hello, T) {
            Err(e @ ControlError::VersionMismatch { ours: 3, theirs: CONTROL_VERSION }) => {
                assert!(e.to_string().contains("version 5"), "the error names both versions: {e}");
            }
            other => panic!("client: expected VersionMismatch, got {other:?}"),
        }
        assert!(matches!(
            server.join().unwrap().0,
            Err(ControlError::VersionMismatch { ours: 5, theirs: 3 })
        ));
    }

    #[test]
    fn a_version_2_client_is_refused_by_a_version_3_server() {
        // Version 2 allowed no frame after the handshake; version 3 has queue resets.
        let (addr, server) = spawn_server("alpha", |_| panic!("accept callback must not run"));
        let hello = ClientHello { version: 2, ..client_hello("alpha", 1) };
        match connect(addr, &hello, T) {
            Err(ControlError::VersionMismatch { ours: 2, theirs: CONTROL_VERSION }) => {}
            other => panic!("client: expected VersionMismatch, got {other:?}"),
        }
        assert!(matches!(server.join().unwrap().0, Err(ControlError::VersionMismatch { .. })));
    }

    #[test]
    fn callback_refusal_reaches_the_client() {
        let (addr, server) = spawn_server("alpha", |hello| {
            assert_eq!(hello.window, 16);
            Err("full".to_owned())
        });
        match connect(addr, &client_hello("alpha", 1), T) {
            Err(ControlError::Rejected(reason)) => assert_eq!(reason, "full"),
            other => panic!("expected Rejected(\"full\"), got {other:?}"),
        }
        match server.join().unwrap().0 {
            Err(ControlError::Rejected(reason)) => assert_eq!(reason, "full"),
            other => panic!("expected Rejected(\"full\"), got {other:?}"),
        }
    }

    #[test]
    fn overlong_refusal_reason_is_clipped_for_the_wire_only() {
        let long = "é".repeat(MAX_REASON_LEN);
        let sent = long.clone();
        let (addr, server) = spawn_server("alpha", move |_| Err(sent));
        match connect(addr, &client_hello("alpha", 1), T) {
            Err(ControlError::Rejected(reason)) => {
                assert_eq!(reason.len(), MAX_REASON_LEN);
                assert!(long.starts_with(&reason));
            }
            other => panic!("expected Rejected, got {other:?}"),
        }
        match server.join().unwrap().0 {
            Err(ControlError::Rejected(reason)) => assert_eq!(reason, long),
            other => panic!("expected Rejected, got {other:?}"),
        }
    }

    #[test]
    fn callback_answer_with_wrong_queue_count_is_refused() {
        let (addr, server) = spawn_server("alpha", |_| Ok(server_hello("alpha", 1)));
        match connect(addr, &client_hello("alpha", 2), T) {
            Err(ControlError::Rejected(reason)) => assert!(reason.contains("queue count"), "{reason}"),
            other => panic!("expected Rejected, got {other:?}"),
        }
        match server.join().unwrap().0 {
            Err(ControlError::QueueCountMismatch { client: 2, server: 1 }) => {}
            other => panic!("expected QueueCountMismatch, got {other:?}"),
        }
    }

    #[test]
    fn callback_answer_with_another_name_is_refused() {
        let (addr, server) = spawn_server("alpha", |hello| Ok(answer_for(hello, "gamma")));
        assert!(matches!(connect(addr, &client_hello("alpha", 1), T), Err(ControlError::Rejected(_))));
        assert!(matches!(server.join().unwrap().0, Err(ControlError::Unencodable(_))));
    }

    #[test]
    fn connect_where_nothing_listens() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        match connect(addr, &client_hello("alpha", 1), T) {
            Err(e @ ControlError::Connect { .. }) => {
                let text = e.to_string();
                assert_eq!(text, format!("nothing listens at {addr} (connection refused)"));
                let ControlError::Connect { addr: named, source } = e else { unreachable!() };
                assert_eq!(named, addr.to_string());
                assert_eq!(source.kind(), io::ErrorKind::ConnectionRefused);
            }
            other => panic!("expected Connect, got {other:?}"),
        }
    }

    #[test]
    fn connect_to_an_unresolvable_name() {
        match connect("no-such-host.invalid:1", &client_hello("alpha", 1), T) {
            Err(e @ ControlError::Connect { .. }) => {
                assert!(e.to_string().contains("does not resolve"), "{e}")
            }
            other => panic!("expected Connect, got {other:?}"),
        }
        match connect(("no-such-host.invalid", 1), &client_hello("alpha", 1), T) {
            Err(e @ ControlError::Connect { .. }) => {
                assert!(e.to_string().contains("does not resolve"), "{e}")
            }
            other => panic!("expected Connect, got {other:?}"),
        }
    }

    /// Several socket addresses, and no `Display`: `connect` takes any `ToSocketAddrs`.
    struct Addrs(Vec<SocketAddr>);

    impl ToSocketAddrs for Addrs {
        type Iter = std::vec::IntoIter<SocketAddr>;
        fn to_socket_addrs(&self) -> io::Result<Self::Iter> {
            Ok(self.0.clone().into_iter())
        }
    }

    #[test]
    fn connect_error_describes_the_resolved_addresses() {
        let a: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let b: SocketAddr = "127.0.0.2:2".parse().unwrap();
        let c: SocketAddr = "[::1]:3".parse().unwrap();
        assert_eq!(describe_addrs(&[a]), "127.0.0.1:1");
        assert_eq!(describe_addrs(&[a, b]), "127.0.0.1:1 or 127.0.0.2:2");
        assert_eq!(describe_addrs(&[a, b, c]), "127.0.0.1:1, 127.0.0.2:2 or [::1]:3");
    }

    #[test]
    fn connect_tries_each_address() {
        let dead = {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap()
        };
        let (live, server) = spawn_server("alpha", |hello| Ok(answer_for(hello, "alpha")));
        let (_stream, answer) = connect(Addrs(vec![dead, live]), &client_hello("alpha", 1), T).unwrap();
        assert_eq!(answer.server_name, "alpha");
        server.join().unwrap().0.unwrap();

        match connect(Addrs(vec![dead, dead]), &client_hello("alpha", 1), T) {
            Err(e @ ControlError::Connect { .. }) => {
                assert!(e.to_string().contains(&format!("{dead} or {dead}")), "{e}")
            }
            other => panic!("expected Connect, got {other:?}"),
        }
        match connect(Addrs(vec![]), &client_hello("alpha", 1), T) {
            Err(ControlError::Connect { source, .. }) => {
                assert_eq!(source.kind(), io::ErrorKind::InvalidInput)
            }
            other => panic!("expected Connect, got {other:?}"),
        }
    }

    #[test]
    fn unencodable_hello_fails_before_connecting() {
        // Nothing listens there; the encode error must come first.
        let hello = client_hello(&"n".repeat(MAX_NAME_LEN + 1), 1);
        assert!(matches!(connect("127.0.0.1:1", &hello, T), Err(ControlError::Unencodable(_))));
    }

    #[test]
    fn zero_timeout_is_invalid() {
        match connect("127.0.0.1:1", &client_hello("a", 0), Duration::ZERO) {
            Err(ControlError::Io(e)) => assert_eq!(e.kind(), io::ErrorKind::InvalidInput),
            other => panic!("expected Io(InvalidInput), got {other:?}"),
        }
    }

    #[test]
    fn server_closes_after_reading_the_hello() {
        let (addr, server) = spawn_raw(|mut stream| {
            read_raw_frame(&mut stream);
        });
        let result = connect(addr, &client_hello("alpha", 1), T);
        assert!(matches!(result, Err(ControlError::Closed)), "{result:?}");
        server.join().unwrap();
    }

    #[test]
    fn server_closes_without_reading() {
        // Unread data makes the close a reset, or the client's write may fail: both are Closed.
        let (addr, server) = spawn_raw(drop);
        let result = connect(addr, &client_hello("alpha", 1), T);
        assert!(matches!(result, Err(ControlError::Closed)), "{result:?}");
        server.join().unwrap();
    }

    #[test]
    fn server_closes_in_the_middle_of_its_answer() {
        for cut in [1, HEADER_LEN - 1, HEADER_LEN, HEADER_LEN + 7] {
            let (addr, server) = spawn_raw(move |mut stream| {
                read_raw_frame(&mut stream);
                let answer = server_hello("alpha", 1).encode().unwrap();
                stream.write_all(&answer[..cut]).unwrap();
            });
            let result = connect(addr, &client_hello("alpha", 1), T);
            assert!(matches!(result, Err(ControlError::Closed)), "cut {cut}: {result:?}");
            server.join().unwrap();
        }
    }

    #[test]
    fn client_closes_before_sending_everything() {
        let hello = client_hello("alpha", 1).encode().unwrap();
        for cut in [0, 3, HEADER_LEN, hello.len() - 1] {
            let (addr, server) = spawn_server("alpha", |_| panic!("accept callback must not run"));
            let mut stream = TcpStream::connect(addr).unwrap();
            stream.write_all(&hello[..cut]).unwrap();
            drop(stream);
            let result = server.join().unwrap().0;
            assert!(matches!(result, Err(ControlError::Closed)), "cut {cut}: {result:?}");
        }
    }

    fn assert_rejected_as_malformed(answer: &[u8], server: JoinHandle<ServerResult>, needle: &str) {
        let reject = Reject::decode(answer).unwrap();
        assert_eq!(reject.code, RejectCode::Malformed);
        assert_eq!(reject.server_name, "alpha");
        assert!(reject.reason.contains(needle), "{}", reject.reason);
        let text = malformed_text(server.join().unwrap().0);
        assert!(text.contains(needle), "{text}");
    }

    #[test]
    fn server_rejects_garbage() {
        let (addr, server) = spawn_server("alpha", |_| panic!("accept callback must not run"));
        let answer = raw_client(addr, b"GET / HTTP/1.1\r\n");
        assert_rejected_as_malformed(&answer, server, "magic");
    }

    #[test]
    fn server_refuses_an_oversize_length_without_reading_it() {
        let (addr, server) = spawn_server("alpha", |_| panic!("accept callback must not run"));
        let mut head = client_hello("alpha", 0).encode().unwrap();
        head.truncate(HEADER_LEN);
        head[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        let answer = raw_client(addr, &head);
        assert_rejected_as_malformed(&answer, server, "limit");
    }

    #[test]
    fn server_rejects_a_bad_body_and_a_wrong_frame_type() {
        let (addr, server) = spawn_server("alpha", |_| panic!("accept callback must not run"));
        let mut frame = client_hello("alpha", 1).encode().unwrap();
        frame.push(0);
        fix_len(&mut frame);
        let answer = raw_client(addr, &frame);
        assert_rejected_as_malformed(&answer, server, "trailing");

        let (addr, server) = spawn_server("alpha", |_| panic!("accept callback must not run"));
        let answer = raw_client(addr, &server_hello("alpha", 1).encode().unwrap());
        assert_rejected_as_malformed(&answer, server, "got a server hello");
    }

    #[test]
    fn client_checks_the_servers_answer() {
        type Case = (ServerHello, fn(&ControlError) -> bool);
        let cases: [Case; 3] = [
            (server_hello("beta", 2), |e| {
                let ControlError::WrongServerName { expected, actual } = e else { return false };
                expected == "alpha" && actual == "beta"
            }),
            (server_hello("alpha", 1), |e| {
                matches!(e, ControlError::QueueCountMismatch { client: 2, server: 1 })
            }),
            (ServerHello { version: 7, ..server_hello("alpha", 2) }, |e| {
                matches!(e, ControlError::VersionMismatch { ours: CONTROL_VERSION, theirs: 7 })
            }),
        ];
        for (answer, expected) in cases {
            let frame = answer.encode().unwrap();
            let (addr, server) = spawn_raw(move |mut stream| {
                read_raw_frame(&mut stream);
                stream.write_all(&frame).unwrap();
                wait_closed(&mut stream);
            });
            let err = connect(addr, &client_hello("alpha", 2), T).unwrap_err();
            assert!(expected(&err), "unexpected {err:?}");
            server.join().unwrap();
        }
    }

    #[test]
    fn client_maps_unusual_answers() {
        type Case = (Vec<u8>, fn(&ControlError) -> bool);
        let answers: [Case; 3] = [
            (
                client_hello("alpha", 1).encode().unwrap(),
                |e| matches!(e, ControlError::Malformed(t) if t.contains("got a client hello")),
            ),
            (
                Reject {
                    version: 1,
                    code: RejectCode::Other(99),
                    server_name: "alpha".into(),
                    reason: "newer".into(),
                }
                .encode()
                .unwrap(),
                |e| matches!(e, ControlError::Rejected(r) if r == "newer"),
            ),
            (
                Reject {
                    version: 1,
                    code: RejectCode::Malformed,
                    server_name: "alpha".into(),
                    reason: "bad".into(),
                }
                .encode()
                .unwrap(),
                |e| {
                    let ControlError::Malformed(text) = e else { return false };
                    text.contains("could not parse our client hello: bad")
                },
            ),
        ];
        for (frame, expected) in answers {
            let (addr, server) = spawn_raw(move |mut stream| {
                read_raw_frame(&mut stream);
                stream.write_all(&frame).unwrap();
                wait_closed(&mut stream);
            });
            let err = connect(addr, &client_hello("alpha", 1), T).unwrap_err();
            assert!(expected(&err), "unexpected {err:?}");
            server.join().unwrap();
        }
    }

    #[test]
    fn server_times_out_on_a_silent_client() {
        let (addr, server) = spawn_raw(|mut stream| {
            accept(&mut stream, "alpha", Duration::from_millis(100), |_| panic!("must not run"))
        });
        // Connected but silent until the server gives up; kept open so only the timeout can end it.
        let client = TcpStream::connect(addr).unwrap();
        match server.join().unwrap() {
            Err(ControlError::Io(e)) => assert_eq!(e.kind(), io::ErrorKind::TimedOut),
            other => panic!("expected a timeout, got {other:?}"),
        }
        drop(client);
    }

    #[test]
    fn client_times_out_on_a_silent_server() {
        let (addr, server) = spawn_raw(|mut stream| {
            read_raw_frame(&mut stream);
            wait_closed(&mut stream); // never answers; returns once the client gives up
        });
        match connect(addr, &client_hello("alpha", 1), Duration::from_millis(100)) {
            Err(ControlError::Io(e)) => assert_eq!(e.kind(), io::ErrorKind::TimedOut),
            other => panic!("expected a timeout, got {other:?}"),
        }
        server.join().unwrap();
    }

    #[test]
    fn wait_closed_returns_when_the_peer_drops_its_stream() {
        let (addr, monitor) = spawn_raw(|mut stream| {
            wait_closed(&mut stream);
        });
        let client = TcpStream::connect(addr).unwrap();
        drop(client);
        monitor.join().unwrap();
    }

    #[test]
    fn wait_closed_treats_stray_bytes_as_closure_and_shuts_down() {
        let (addr, monitor) = spawn_raw(|mut stream| {
            wait_closed(&mut stream);
        });
        let mut client = TcpStream::connect(addr).unwrap();
        client.write_all(b"x").unwrap();
        monitor.join().unwrap();
        // The monitor shut the stream down: the client sees end of stream (or a reset).
        let mut buf = [0u8; 1];
        match client.read(&mut buf) {
            Ok(0) => {}
            Err(e) => assert_eq!(e.kind(), io::ErrorKind::ConnectionReset),
            Ok(n) => panic!("read {n} bytes from a shut-down stream"),
        }
    }
}
