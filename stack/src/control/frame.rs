//! The handshake's frames: the 12-byte header, the client hello, the server hello and the
//! reject, each encoded and decoded with every field checked (see the module docs of
//! [`control`](super) for the layout).

use super::*;

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
pub(super) enum MsgType {
    ClientHello = 1,
    ServerHello = 2,
    Reject = 3,
    /// After the handshake, client → server: re-exchange one queue (`session.rs`).
    QueueReset = 4,
    /// After the handshake, server → client: the answer to a [`MsgType::QueueReset`].
    QueueResetDone = 5,
}

impl MsgType {
    pub(super) fn from_u8(value: u8) -> Option<Self> {
        match value {
            1 => Some(MsgType::ClientHello),
            2 => Some(MsgType::ServerHello),
            3 => Some(MsgType::Reject),
            4 => Some(MsgType::QueueReset),
            5 => Some(MsgType::QueueResetDone),
            _ => None,
        }
    }

    pub(super) fn name(self) -> &'static str {
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
pub(super) struct Header {
    pub(super) kind: MsgType,
    pub(super) version: u16,
    pub(super) body_len: usize,
}

pub(super) fn malformed(text: impl Into<String>) -> ControlError {
    ControlError::Malformed(text.into())
}

/// Parses the 12 header bytes: magic, known type, reserved 0, body length within the cap.
pub(super) fn parse_header(b: &[u8; HEADER_LEN]) -> Result<Header, ControlError> {
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
pub(super) fn open_frame(frame: &[u8], expected: MsgType) -> Result<(Header, Body<'_>), ControlError> {
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
pub(super) struct Body<'a> {
    pub(super) rest: &'a [u8],
    pub(super) what: &'static str,
}

impl<'a> Body<'a> {
    pub(super) fn take(&mut self, n: usize, field: &str) -> Result<&'a [u8], ControlError> {
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

    pub(super) fn array<const N: usize>(&mut self, field: &str) -> Result<[u8; N], ControlError> {
        let bytes = self.take(N, field)?;
        <[u8; N]>::try_from(bytes).map_err(|_| malformed(format!("{} body: bad {field}", self.what)))
    }

    pub(super) fn u8(&mut self, field: &str) -> Result<u8, ControlError> {
        Ok(u8::from_le_bytes(self.array(field)?))
    }

    pub(super) fn u16(&mut self, field: &str) -> Result<u16, ControlError> {
        Ok(u16::from_le_bytes(self.array(field)?))
    }

    pub(super) fn u32(&mut self, field: &str) -> Result<u32, ControlError> {
        Ok(u32::from_le_bytes(self.array(field)?))
    }

    pub(super) fn string(&mut self, max: usize, field: &str) -> Result<String, ControlError> {
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

    pub(super) fn queues(&mut self) -> Result<Vec<QueueInfo>, ControlError> {
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

    pub(super) fn finish(self) -> Result<(), ControlError> {
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
pub(super) fn build_frame(
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

pub(super) fn put_u32(out: &mut Vec<u8>, value: u32) {
    out.extend_from_slice(&value.to_le_bytes());
}

pub(super) fn put_str(out: &mut Vec<u8>, text: &str, max: usize, field: &str) -> Result<(), ControlError> {
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

pub(super) fn put_queues(out: &mut Vec<u8>, queues: &[QueueInfo]) -> Result<(), ControlError> {
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
pub(super) fn clip(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.get(..end).unwrap_or("")
}
