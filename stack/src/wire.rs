//! # URPC wire format, version 1
//!
//! Byte-for-byte encoding and decoding of the three URPC headers — request (20 bytes),
//! acknowledgement (12 bytes) and response (16 bytes) — plus the 16-byte DMA descriptors that may
//! follow a request header. All multi-byte fields are little-endian. Nothing here allocates:
//! `encode` writes into a caller's buffer, `decode` and [`parse`] read from a borrowed slice and
//! hand back views into it. No input makes any function here panic; malformed bytes come back as
//! a [`WireError`] naming what was wrong.
//!
//! Byte 0 of every message carries the message type in bits 0-3 ([`MsgType`]: REQ 0, ACK 1,
//! RSP 2, ACK_AND_RSP 3) and the protocol version in bits 4-7 (always [`VERSION`] = 1).
//!
//! ## Request: header, DMA descriptors, inline arguments
//!
//! | bytes | field |
//! |---|---|
//! | 0 | bits 0-3 type (0 = REQ), bits 4-7 version |
//! | 1 | bits 0-4 `arg_dma_count`, bit 5 no response expected (bypass; reserved in URPC), bit 6 the last descriptor is the response buffer (bypass; reserved in URPC), bit 7 ack requested |
//! | 2-7 | function id, 48 bits ([`FunctionId`]) |
//! | 8-11 | `req_total_size`: every byte of the message, header and descriptors included |
//! | 12-15 | `req_id` |
//! | 16-18 | channel id, 24 bits |
//! | 19 | `function_defined` (0 = plain) |
//! | 20.. | `arg_dma_count` × [`DmaDescriptor`] (16 bytes each), then the inline arguments |
//!
//! A DMA descriptor is bytes 0-3 size (u32), 4-11 address (u64), 12-15 token (u32).
//!
//! ## Acknowledgement
//!
//! | bytes | field |
//! |---|---|
//! | 0 | type 1 (ACK) \| version << 4 |
//! | 1 | reserved (0) |
//! | 2-3 | `req_id_range` (1) |
//! | 4-7 | `req_id` |
//! | 8-10 | channel id, 24 bits |
//! | 11 | reserved (0) |
//!
//! ## Response: header, then return data
//!
//! | bytes | field |
//! |---|---|
//! | 0 | type 2 (RSP) or 3 (ACK_AND_RSP) \| version << 4 |
//! | 1 | status ([`Status`]) |
//! | 2-3 | `req_id_range` (1) |
//! | 4-7 | `req_id` |
//! | 8-10 | channel id, 24 bits |
//! | 11 | `function_defined` |
//! | 12-15 | `response_total_size`: every byte of the message, header included |
//!
//! ## Function id (48 bits)
//!
//! | bits | field |
//! |---|---|
//! | 0-22 | method |
//! | 23 | P: 1 = user-defined method |
//! | 24-35 | sub class |
//! | 36-47 | device class |
//!
//! ## Validation rules
//!
//! - A version other than 1 is [`WireError::BadVersion`] (URPC only defines version 1; 0 is
//!   rejected as well as 2..=15). The version is checked before the type.
//! - A type nibble of 4..=15 is [`WireError::UnknownType`]; an unknown status byte is
//!   [`WireError::BadStatus`].
//! - A header's total size smaller than the header itself (plus, for a request, its DMA
//!   descriptors) is [`WireError::TotalSizeTooSmall`], both when decoding and when encoding, so
//!   `encode` never writes a header that `decode` would refuse.
//! - [`parse`] takes one whole received message: its length must equal the header's total size
//!   (exactly 12 for an ACK). A shorter receive (truncated) or a longer one (trailing bytes) is
//!   [`WireError::LengthMismatch`]: lengths that do not add up are a protocol error.
//! - The header-level `decode` functions read only the header at the front of the slice and ignore
//!   whatever follows; use [`parse`] for a complete message.
//! - Reserved bits are written as 0 and ignored when decoding. `req_id_range` is carried as is
//!   (URPC always sends 1, see [`REQ_ID_RANGE_SINGLE`]); it is not validated.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

use core::fmt;
use core::slice::ChunksExact;

/// The only protocol version this module speaks (bits 4-7 of byte 0).
pub const VERSION: u8 = 1;

/// Largest channel id that fits the 24-bit channel field.
pub const MAX_CHANNEL_ID: u32 = (1 << 24) - 1;

/// Most DMA descriptors a request can carry (`arg_dma_count` is 5 bits).
pub const MAX_DMA_DESCRIPTORS: usize = 31;

/// Length of the prefix of a response to a request with
/// [`RequestHeader::response_descriptor`] set: a little-endian u32, the number of response bytes
/// the server RDMA-wrote at the start of the client's response buffer (0: the response data, if
/// any, follow the prefix inline).
pub const RNDV_PREFIX_LEN: usize = 4;

/// The `req_id_range` value URPC always sends: the message covers exactly one request id.
pub const REQ_ID_RANGE_SINGLE: u16 = 1;

/// Everything that can be wrong with bytes on the wire, or with a header about to be encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The buffer is shorter than what must be read from or written to it.
    #[error("buffer too short: need {need} bytes, got {got}")]
    Short {
        /// Bytes needed.
        need: usize,
        /// Bytes available.
        got: usize,
    },
    /// The version nibble is not [`VERSION`].
    #[error("unsupported URPC protocol version {0} (only version 1 is known)")]
    BadVersion(u8),
    /// The type nibble is not one of REQ 0, ACK 1, RSP 2, ACK_AND_RSP 3.
    #[error("unknown URPC message type {0} (known: 0 REQ, 1 ACK, 2 RSP, 3 ACK_AND_RSP)")]
    UnknownType(u8),
    /// A valid message type, but not the one the decoder was asked for.
    #[error("expected {expected} header, found a message of type {got}")]
    UnexpectedType {
        /// What the decoder accepts.
        expected: &'static str,
        /// What byte 0 says.
        got: MsgType,
    },
    /// The status byte of a response is not a known [`Status`].
    #[error("unknown URPC response status {0} (known: 0..=6)")]
    BadStatus(u8),
    /// The header's total size is smaller than the header (and DMA descriptors) it describes.
    #[error("header declares a total size of {declared} bytes, less than the {min} bytes its header and DMA descriptors take")]
    TotalSizeTooSmall {
        /// The total size field.
        declared: u32,
        /// The smallest total size consistent with the header.
        min: usize,
    },
    /// The received message is not as long as its header says.
    #[error(
        "length mismatch: the header declares a {expected}-byte message but {actual} bytes were received"
    )]
    LengthMismatch {
        /// Message length declared by the header (fixed 12 for an ACK).
        expected: usize,
        /// Length of the received message.
        actual: usize,
    },
    /// More DMA descriptors than the 5-bit `arg_dma_count` can express.
    #[error("{count} DMA descriptors do not fit a request header (at most 31)")]
    TooManyDescriptors {
        /// The descriptor count asked for.
        count: usize,
    },
    /// A channel id at or above 2^24.
    #[error("channel id {0:#x} does not fit in 24 bits")]
    ChannelOutOfRange(u32),
    /// A function id at or above 2^48.
    #[error("function id {0:#x} does not fit in 48 bits")]
    FunctionIdOutOfRange(u64),
    /// A message longer than the 32-bit total size field can describe.
    #[error("a {len}-byte message does not fit the 32-bit total size field")]
    MessageTooLarge {
        /// Length of the message that was to be encoded.
        len: usize,
    },
}

/// Message type: bits 0-3 of byte 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum MsgType {
    /// A request (20-byte header).
    Req = 0,
    /// A standalone acknowledgement (12-byte header).
    Ack = 1,
    /// A response (16-byte header).
    Rsp = 2,
    /// A response that also acknowledges the request (16-byte header).
    AckAndRsp = 3,
}

impl MsgType {
    /// The type for a wire value, or [`WireError::UnknownType`].
    pub const fn from_u8(value: u8) -> Result<Self, WireError> {
        match value {
            0 => Ok(Self::Req),
            1 => Ok(Self::Ack),
            2 => Ok(Self::Rsp),
            3 => Ok(Self::AckAndRsp),
            other => Err(WireError::UnknownType(other)),
        }
    }

    /// The wire value.
    pub const fn as_u8(self) -> u8 {
        self as u8
    }
}

impl TryFrom<u8> for MsgType {
    type Error = WireError;

    fn try_from(value: u8) -> Result<Self, WireError> {
        Self::from_u8(value)
    }
}

impl fmt::Display for MsgType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Req => "REQ",
            Self::Ack => "ACK",
            Self::Rsp => "RSP",
            Self::AckAndRsp => "ACK_AND_RSP",
        })
    }
}

/// Response status: byte 1 of a response header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Status {
    /// The function ran; the return data follows.
    Success = 0,
    /// The server declined the request.
    ServerDecline = 1,
    /// No such function on the server.
    FunctionErr = 2,
    /// A length the server received did not add up.
    RemoteLenErr = 3,
    /// The request timed out.
    Timeout = 4,
    /// The server does not speak the request's protocol version.
    VersionErr = 5,
    /// The server could not parse the request header.
    HdrErr = 6,
}

impl Status {
    /// Every status, in wire order.
    pub const ALL: [Status; 7] = [
        Self::Success,
        Self::ServerDecline,
        Self::FunctionErr,
        Self::RemoteLenErr,
        Self::Timeout,
        Self::VersionErr,
        Self::HdrErr,
    ];

    /// The status for a wire value, or [`WireError::BadStatus`].
    pub const fn from_u8(value: u8) -> Result<Self, WireError> {
        match value {
            0 => Ok(Self::Success),
            1 => Ok(Self::ServerDecline),
            2 => Ok(Self::FunctionErr),
            3 => Ok(Self::RemoteLenErr),
            4 => Ok(Self::Timeout),
            5 => Ok(Self::VersionErr),
            6 => Ok(Self::HdrErr),
            other => Err(WireError::BadStatus(other)),
        }
    }

    /// The wire value.
    pub const fn as_u8(self) -> u8 {
        self as u8
    }
}

impl TryFrom<u8> for Status {
    type Error = WireError;

    fn try_from(value: u8) -> Result<Self, WireError> {
        Self::from_u8(value)
    }
}

/// A 48-bit URPC function id: `device_class:12 | sub_class:12 | P:1 | method:23`, method in the
/// low bits. Always below 2^48 by construction.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FunctionId(u64);

impl FunctionId {
    /// Largest raw value (2^48 - 1).
    pub const MAX_RAW: u64 = (1 << 48) - 1;
    /// Largest device class (12 bits).
    pub const MAX_DEVICE_CLASS: u16 = 0xFFF;
    /// Largest sub class (12 bits).
    pub const MAX_SUB_CLASS: u16 = 0xFFF;
    /// Largest method number (23 bits).
    pub const MAX_METHOD: u32 = (1 << 23) - 1;
    /// The keepalive function id, `0x002001000005` (device class 2, sub class 1, method 5).
    pub const KEEPALIVE: FunctionId = FunctionId(0x0020_0100_0005);

    const METHOD_MASK: u64 = (1 << 23) - 1;
    const USER_BIT: u64 = 1 << 23;
    const SUB_SHIFT: u32 = 24;
    const DEVICE_SHIFT: u32 = 36;
    const CLASS_MASK: u64 = 0xFFF;

    /// Packs the four fields; `None` if a field does not fit its width (12, 12 and 23 bits).
    pub const fn new(device_class: u16, sub_class: u16, user_defined: bool, method: u32) -> Option<Self> {
        if device_class > Self::MAX_DEVICE_CLASS
            || sub_class > Self::MAX_SUB_CLASS
            || method > Self::MAX_METHOD
        {
            return None;
        }
        let user = if user_defined { Self::USER_BIT } else { 0 };
        Some(Self(
            (device_class as u64) << Self::DEVICE_SHIFT
                | (sub_class as u64) << Self::SUB_SHIFT
                | user
                | method as u64,
        ))
    }

    /// Wraps a raw 48-bit value; [`WireError::FunctionIdOutOfRange`] if it is 2^48 or more.
    pub const fn from_raw(raw: u64) -> Result<Self, WireError> {
        if raw > Self::MAX_RAW {
            Err(WireError::FunctionIdOutOfRange(raw))
        } else {
            Ok(Self(raw))
        }
    }

    /// The raw 48-bit value.
    pub const fn raw(self) -> u64 {
        self.0
    }

    /// Device class, bits 36-47.
    pub const fn device_class(self) -> u16 {
        ((self.0 >> Self::DEVICE_SHIFT) & Self::CLASS_MASK) as u16
    }

    /// Sub class, bits 24-35.
    pub const fn sub_class(self) -> u16 {
        ((self.0 >> Self::SUB_SHIFT) & Self::CLASS_MASK) as u16
    }

    /// The P bit (bit 23): a user-defined method.
    pub const fn is_user_defined(self) -> bool {
        self.0 & Self::USER_BIT != 0
    }

    /// Method number, bits 0-22.
    pub const fn method(self) -> u32 {
        (self.0 & Self::METHOD_MASK) as u32
    }

    fn to_le_bytes(self) -> [u8; 6] {
        let b = self.0.to_le_bytes();
        [b[0], b[1], b[2], b[3], b[4], b[5]]
    }

    fn from_le_bytes(b: [u8; 6]) -> Self {
        Self(u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], 0, 0]))
    }
}

impl fmt::Debug for FunctionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "FunctionId({:#014x}: class {:#05x}, sub {:#05x}, P {}, method {})",
            self.0,
            self.device_class(),
            self.sub_class(),
            u8::from(self.is_user_defined()),
            self.method()
        )
    }
}

impl fmt::Display for FunctionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#014x}", self.0)
    }
}

impl TryFrom<u64> for FunctionId {
    type Error = WireError;

    fn try_from(raw: u64) -> Result<Self, WireError> {
        Self::from_raw(raw)
    }
}

impl From<FunctionId> for u64 {
    fn from(id: FunctionId) -> u64 {
        id.0
    }
}

/// Reads byte 0 of a message and returns its type, checking the version first.
///
/// Errors: [`WireError::Short`] on an empty slice, [`WireError::BadVersion`],
/// [`WireError::UnknownType`].
pub fn peek_type(bytes: &[u8]) -> Result<MsgType, WireError> {
    match bytes.first() {
        Some(&b0) => type_of(b0),
        None => Err(WireError::Short { need: 1, got: 0 }),
    }
}

fn type_of(b0: u8) -> Result<MsgType, WireError> {
    let version = b0 >> 4;
    if version != VERSION {
        return Err(WireError::BadVersion(version));
    }
    MsgType::from_u8(b0 & 0x0F)
}

const fn type_byte(ty: MsgType) -> u8 {
    ty.as_u8() | VERSION << 4
}

fn read_chunk<const N: usize>(bytes: &[u8]) -> Result<&[u8; N], WireError> {
    bytes.first_chunk::<N>().ok_or(WireError::Short { need: N, got: bytes.len() })
}

fn write_chunk<const N: usize>(out: &mut [u8]) -> Result<&mut [u8; N], WireError> {
    let got = out.len();
    out.first_chunk_mut::<N>().ok_or(WireError::Short { need: N, got })
}

fn channel_bytes(channel: u32) -> Result<[u8; 3], WireError> {
    if channel > MAX_CHANNEL_ID {
        return Err(WireError::ChannelOutOfRange(channel));
    }
    let b = channel.to_le_bytes();
    Ok([b[0], b[1], b[2]])
}

fn channel_from(b: [u8; 3]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], 0])
}

/// One DMA descriptor following a request header: a remote buffer the server may access.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct DmaDescriptor {
    /// Buffer length in bytes (bytes 0-3).
    pub size: u32,
    /// Buffer address (bytes 4-11).
    pub address: u64,
    /// Access token / remote key (bytes 12-15).
    pub token: u32,
}

impl DmaDescriptor {
    /// Encoded length.
    pub const LEN: usize = 16;

    /// Writes the descriptor to the front of `out`; returns [`Self::LEN`].
    pub fn encode(&self, out: &mut [u8]) -> Result<usize, WireError> {
        *write_chunk::<{ Self::LEN }>(out)? = self.to_array();
        Ok(Self::LEN)
    }

    /// Reads a descriptor from the front of `bytes` (trailing bytes are ignored).
    pub fn decode(bytes: &[u8]) -> Result<Self, WireError> {
        Ok(Self::from_array(read_chunk::<{ Self::LEN }>(bytes)?))
    }

    fn to_array(self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0..4].copy_from_slice(&self.size.to_le_bytes());
        b[4..12].copy_from_slice(&self.address.to_le_bytes());
        b[12..16].copy_from_slice(&self.token.to_le_bytes());
        b
    }

    fn from_array(b: &[u8; Self::LEN]) -> Self {
        Self {
            size: u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            address: u64::from_le_bytes([b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11]]),
            token: u32::from_le_bytes([b[12], b[13], b[14], b[15]]),
        }
    }
}

/// The 20-byte request header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RequestHeader {
    /// Number of DMA descriptors after the header (0..=31, 5 bits).
    pub arg_dma_count: u8,
    /// Bit 7 of byte 1: the client asks for an ACK.
    pub ack_requested: bool,
    /// Bit 5 of byte 1 (reserved in URPC, a bypass extension): the client expects no response
    /// (`EARLY_RSP` and `ACK | EARLY_RSP` calls). URPC peers write 0 here and ignore it on read,
    /// so a URPC client's requests all read as "response expected".
    pub no_response: bool,
    /// Bit 6 of byte 1 (reserved in URPC, a bypass extension): the last of the `arg_dma_count`
    /// descriptors is not an argument but the client's registered response buffer, which the
    /// server may RDMA WRITE the response data into (rendezvous response, see `docs/protocol.md`).
    /// The response to such a request starts with a 4-byte written length ([`RNDV_PREFIX_LEN`]).
    pub response_descriptor: bool,
    /// The function to call.
    pub function: FunctionId,
    /// `req_total_size`: every byte of the message, header and descriptors included. At least
    /// [`Self::min_total_size`].
    pub total_size: u32,
    /// Request id, matched by the response.
    pub req_id: u32,
    /// Channel id (24 bits).
    pub channel: u32,
    /// `function_defined` byte (0 = plain).
    pub function_defined: u8,
}

impl RequestHeader {
    /// Encoded header length (without descriptors).
    pub const LEN: usize = 20;

    const DMA_COUNT_MASK: u8 = 0x1F;
    const ACK_BIT: u8 = 0x80;
    const NO_RSP_BIT: u8 = 0x20;
    const RSP_DESC_BIT: u8 = 0x40;

    /// Header plus descriptors: the smallest `total_size` consistent with `arg_dma_count`.
    pub const fn min_total_size(&self) -> usize {
        Self::LEN + self.arg_dma_count as usize * DmaDescriptor::LEN
    }

    /// Writes the header to the front of `out`; returns [`Self::LEN`]. Nothing is written on
    /// error.
    ///
    /// Errors: [`WireError::TooManyDescriptors`], [`WireError::ChannelOutOfRange`],
    /// [`WireError::TotalSizeTooSmall`], [`WireError::Short`].
    pub fn encode(&self, out: &mut [u8]) -> Result<usize, WireError> {
        if usize::from(self.arg_dma_count) > MAX_DMA_DESCRIPTORS {
            return Err(WireError::TooManyDescriptors { count: self.arg_dma_count.into() });
        }
        self.check_total()?;
        let channel = channel_bytes(self.channel)?;
        let b = write_chunk::<{ Self::LEN }>(out)?;
        b[0] = type_byte(MsgType::Req);
        b[1] = self.arg_dma_count
            | if self.ack_requested { Self::ACK_BIT } else { 0 }
            | if self.no_response { Self::NO_RSP_BIT } else { 0 }
            | if self.response_descriptor { Self::RSP_DESC_BIT } else { 0 };
        b[2..8].copy_from_slice(&self.function.to_le_bytes());
        b[8..12].copy_from_slice(&self.total_size.to_le_bytes());
        b[12..16].copy_from_slice(&self.req_id.to_le_bytes());
        b[16..19].copy_from_slice(&channel);
        b[19] = self.function_defined;
        Ok(Self::LEN)
    }

    /// Reads a request header from the front of `bytes` (what follows is not looked at).
    ///
    /// Errors: [`WireError::Short`], [`WireError::BadVersion`], [`WireError::UnknownType`],
    /// [`WireError::UnexpectedType`], [`WireError::TotalSizeTooSmall`].
    pub fn decode(bytes: &[u8]) -> Result<Self, WireError> {
        let b = read_chunk::<{ Self::LEN }>(bytes)?;
        match type_of(b[0])? {
            MsgType::Req => {}
            got => return Err(WireError::UnexpectedType { expected: "a REQ", got }),
        }
        let header = Self {
            arg_dma_count: b[1] & Self::DMA_COUNT_MASK,
            ack_requested: b[1] & Self::ACK_BIT != 0,
            no_response: b[1] & Self::NO_RSP_BIT != 0,
            response_descriptor: b[1] & Self::RSP_DESC_BIT != 0,
            function: FunctionId::from_le_bytes([b[2], b[3], b[4], b[5], b[6], b[7]]),
            total_size: u32::from_le_bytes([b[8], b[9], b[10], b[11]]),
            req_id: u32::from_le_bytes([b[12], b[13], b[14], b[15]]),
            channel: channel_from([b[16], b[17], b[18]]),
            function_defined: b[19],
        };
        header.check_total()?;
        Ok(header)
    }

    fn check_total(&self) -> Result<(), WireError> {
        let min = self.min_total_size();
        if (self.total_size as usize) < min {
            return Err(WireError::TotalSizeTooSmall { declared: self.total_size, min });
        }
        Ok(())
    }
}

/// The 12-byte standalone acknowledgement header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AckHeader {
    /// `req_id_range` (URPC sends [`REQ_ID_RANGE_SINGLE`]).
    pub req_id_range: u16,
    /// The acknowledged request id.
    pub req_id: u32,
    /// Channel id (24 bits).
    pub channel: u32,
}

impl AckHeader {
    /// Encoded length; an ACK message is exactly this long.
    pub const LEN: usize = 12;

    /// An ACK for one request (`req_id_range` = 1).
    pub const fn new(req_id: u32, channel: u32) -> Self {
        Self { req_id_range: REQ_ID_RANGE_SINGLE, req_id, channel }
    }

    /// A credit grant (a bypass extension): `req_id_range` = 0 acknowledges no request, and
    /// `req_id` carries the number of receive buffers the server re-posted for requests that get
    /// no response (`EARLY_RSP`, `ACK | EARLY_RSP`, or a handler that dropped its request).
    pub const fn credit_grant(credits: u32, channel: u32) -> Self {
        Self { req_id_range: 0, req_id: credits, channel }
    }

    /// Whether this is a credit grant ([`Self::credit_grant`]) rather than an ACK of a request.
    pub const fn is_credit_grant(&self) -> bool {
        self.req_id_range == 0
    }

    /// Writes the header to the front of `out`; returns [`Self::LEN`]. Nothing is written on
    /// error.
    ///
    /// Errors: [`WireError::ChannelOutOfRange`], [`WireError::Short`].
    pub fn encode(&self, out: &mut [u8]) -> Result<usize, WireError> {
        let channel = channel_bytes(self.channel)?;
        let b = write_chunk::<{ Self::LEN }>(out)?;
        b[0] = type_byte(MsgType::Ack);
        b[1] = 0;
        b[2..4].copy_from_slice(&self.req_id_range.to_le_bytes());
        b[4..8].copy_from_slice(&self.req_id.to_le_bytes());
        b[8..11].copy_from_slice(&channel);
        b[11] = 0;
        Ok(Self::LEN)
    }

    /// Reads an ACK header from the front of `bytes`; reserved bytes are ignored.
    ///
    /// Errors: [`WireError::Short`], [`WireError::BadVersion`], [`WireError::UnknownType`],
    /// [`WireError::UnexpectedType`].
    pub fn decode(bytes: &[u8]) -> Result<Self, WireError> {
        let b = read_chunk::<{ Self::LEN }>(bytes)?;
        match type_of(b[0])? {
            MsgType::Ack => {}
            got => return Err(WireError::UnexpectedType { expected: "an ACK", got }),
        }
        Ok(Self {
            req_id_range: u16::from_le_bytes([b[2], b[3]]),
            req_id: u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
            channel: channel_from([b[8], b[9], b[10]]),
        })
    }
}

/// The 16-byte response header (type RSP or ACK_AND_RSP).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ResponseHeader {
    /// `true`: type ACK_AND_RSP (the response also acknowledges the request); `false`: RSP.
    pub ack: bool,
    /// Outcome of the call.
    pub status: Status,
    /// `req_id_range` (URPC sends [`REQ_ID_RANGE_SINGLE`]).
    pub req_id_range: u16,
    /// The request id this answers.
    pub req_id: u32,
    /// Channel id (24 bits).
    pub channel: u32,
    /// `function_defined` byte.
    pub function_defined: u8,
    /// `response_total_size`: every byte of the message, header included; at least [`Self::LEN`].
    pub total_size: u32,
}

impl ResponseHeader {
    /// Encoded header length.
    pub const LEN: usize = 16;

    /// [`MsgType::AckAndRsp`] or [`MsgType::Rsp`], from [`Self::ack`].
    pub const fn msg_type(&self) -> MsgType {
        if self.ack {
            MsgType::AckAndRsp
        } else {
            MsgType::Rsp
        }
    }

    /// Writes the header to the front of `out`; returns [`Self::LEN`]. Nothing is written on
    /// error.
    ///
    /// Errors: [`WireError::ChannelOutOfRange`], [`WireError::TotalSizeTooSmall`],
    /// [`WireError::Short`].
    pub fn encode(&self, out: &mut [u8]) -> Result<usize, WireError> {
        self.check_total()?;
        let channel = channel_bytes(self.channel)?;
        let b = write_chunk::<{ Self::LEN }>(out)?;
        b[0] = type_byte(self.msg_type());
        b[1] = self.status.as_u8();
        b[2..4].copy_from_slice(&self.req_id_range.to_le_bytes());
        b[4..8].copy_from_slice(&self.req_id.to_le_bytes());
        b[8..11].copy_from_slice(&channel);
        b[11] = self.function_defined;
        b[12..16].copy_from_slice(&self.total_size.to_le_bytes());
        Ok(Self::LEN)
    }

    /// Reads a response header from the front of `bytes` (what follows is not looked at).
    ///
    /// Errors: [`WireError::Short`], [`WireError::BadVersion`], [`WireError::UnknownType`],
    /// [`WireError::UnexpectedType`], [`WireError::BadStatus`], [`WireError::TotalSizeTooSmall`].
    pub fn decode(bytes: &[u8]) -> Result<Self, WireError> {
        let b = read_chunk::<{ Self::LEN }>(bytes)?;
        let ack = match type_of(b[0])? {
            MsgType::Rsp => false,
            MsgType::AckAndRsp => true,
            got => return Err(WireError::UnexpectedType { expected: "an RSP or ACK_AND_RSP", got }),
        };
        let header = Self {
            ack,
            status: Status::from_u8(b[1])?,
            req_id_range: u16::from_le_bytes([b[2], b[3]]),
            req_id: u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
            channel: channel_from([b[8], b[9], b[10]]),
            function_defined: b[11],
            total_size: u32::from_le_bytes([b[12], b[13], b[14], b[15]]),
        };
        header.check_total()?;
        Ok(header)
    }

    fn check_total(&self) -> Result<(), WireError> {
        if (self.total_size as usize) < Self::LEN {
            return Err(WireError::TotalSizeTooSmall { declared: self.total_size, min: Self::LEN });
        }
        Ok(())
    }
}

/// A borrowed run of encoded DMA descriptors inside a received request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Descriptors<'a> {
    bytes: &'a [u8],
}

impl<'a> Descriptors<'a> {
    /// Number of descriptors.
    pub fn len(&self) -> usize {
        self.bytes.len() / DmaDescriptor::LEN
    }

    /// `true` if the request carries no descriptor.
    pub fn is_empty(&self) -> bool {
        self.bytes.len() < DmaDescriptor::LEN
    }

    /// The descriptor at `index`, if there is one.
    pub fn get(&self, index: usize) -> Option<DmaDescriptor> {
        let start = index.checked_mul(DmaDescriptor::LEN)?;
        self.bytes.get(start..)?.first_chunk::<{ DmaDescriptor::LEN }>().map(DmaDescriptor::from_array)
    }

    /// Iterates over the descriptors in order.
    pub fn iter(&self) -> DescriptorIter<'a> {
        DescriptorIter { chunks: self.bytes.chunks_exact(DmaDescriptor::LEN) }
    }

    /// The raw encoded descriptors (a multiple of 16 bytes).
    pub fn as_bytes(&self) -> &'a [u8] {
        self.bytes
    }
}

impl<'a> IntoIterator for Descriptors<'a> {
    type Item = DmaDescriptor;
    type IntoIter = DescriptorIter<'a>;

    fn into_iter(self) -> DescriptorIter<'a> {
        self.iter()
    }
}

/// Iterator over [`Descriptors`], decoding each as it goes.
#[derive(Debug, Clone)]
pub struct DescriptorIter<'a> {
    chunks: ChunksExact<'a, u8>,
}

impl Iterator for DescriptorIter<'_> {
    type Item = DmaDescriptor;

    fn next(&mut self) -> Option<DmaDescriptor> {
        self.chunks.next()?.first_chunk::<{ DmaDescriptor::LEN }>().map(DmaDescriptor::from_array)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.chunks.size_hint()
    }
}

impl ExactSizeIterator for DescriptorIter<'_> {}

/// A parsed request: header, DMA descriptors and inline arguments, borrowed from the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestView<'a> {
    /// The request header.
    pub header: RequestHeader,
    /// The `arg_dma_count` descriptors after the header.
    pub descriptors: Descriptors<'a>,
    /// The inline arguments: everything after the descriptors.
    pub args: &'a [u8],
}

/// A parsed response: header and return data, borrowed from the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResponseView<'a> {
    /// The response header.
    pub header: ResponseHeader,
    /// The return data: everything after the header.
    pub data: &'a [u8],
}

/// One whole received message, checked and split by [`parse`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parsed<'a> {
    /// A REQ message.
    Request(RequestView<'a>),
    /// A standalone ACK.
    Ack(AckHeader),
    /// An RSP or ACK_AND_RSP message.
    Response(ResponseView<'a>),
}

impl Parsed<'_> {
    /// The message type.
    pub fn msg_type(&self) -> MsgType {
        match self {
            Self::Request(_) => MsgType::Req,
            Self::Ack(_) => MsgType::Ack,
            Self::Response(r) => r.header.msg_type(),
        }
    }
}

/// Parses one whole received message (`bytes` is exactly what arrived).
///
/// Besides the header checks, the message length must equal the header's total size (exactly
/// [`AckHeader::LEN`] for an ACK): a truncated message or one with trailing bytes is
/// [`WireError::LengthMismatch`].
pub fn parse(bytes: &[u8]) -> Result<Parsed<'_>, WireError> {
    match peek_type(bytes)? {
        MsgType::Req => {
            let header = RequestHeader::decode(bytes)?;
            check_length(header.total_size as usize, bytes.len())?;
            let desc_end = header.min_total_size();
            let mismatch =
                WireError::LengthMismatch { expected: header.total_size as usize, actual: bytes.len() };
            let descriptors = bytes.get(RequestHeader::LEN..desc_end).ok_or(mismatch)?;
            let args = bytes.get(desc_end..).ok_or(mismatch)?;
            Ok(Parsed::Request(RequestView { header, descriptors: Descriptors { bytes: descriptors }, args }))
        }
        MsgType::Ack => {
            let header = AckHeader::decode(bytes)?;
            check_length(AckHeader::LEN, bytes.len())?;
            Ok(Parsed::Ack(header))
        }
        MsgType::Rsp | MsgType::AckAndRsp => {
            let header = ResponseHeader::decode(bytes)?;
            check_length(header.total_size as usize, bytes.len())?;
            let data = bytes.get(ResponseHeader::LEN..).ok_or(WireError::LengthMismatch {
                expected: header.total_size as usize,
                actual: bytes.len(),
            })?;
            Ok(Parsed::Response(ResponseView { header, data }))
        }
    }
}

fn check_length(expected: usize, actual: usize) -> Result<(), WireError> {
    if expected != actual {
        return Err(WireError::LengthMismatch { expected, actual });
    }
    Ok(())
}

fn total_u32(len: usize) -> Result<u32, WireError> {
    u32::try_from(len).map_err(|_| WireError::MessageTooLarge { len })
}

/// Writes a whole request — header, `descriptors`, `args` — to the front of `out` and returns its
/// length. The header's `arg_dma_count` and `total_size` are not taken from `header` but computed
/// from `descriptors` and `args`; its other fields are written as given. Nothing is written on
/// error.
///
/// Errors: [`WireError::TooManyDescriptors`], [`WireError::MessageTooLarge`], the errors of
/// [`RequestHeader::encode`], [`WireError::Short`] if `out` cannot hold the message.
pub fn encode_request(
    out: &mut [u8],
    header: &RequestHeader,
    descriptors: &[DmaDescriptor],
    args: &[u8],
) -> Result<usize, WireError> {
    if descriptors.len() > MAX_DMA_DESCRIPTORS {
        return Err(WireError::TooManyDescriptors { count: descriptors.len() });
    }
    let desc_end = RequestHeader::LEN + descriptors.len() * DmaDescriptor::LEN;
    let len = desc_end.checked_add(args.len()).ok_or(WireError::MessageTooLarge { len: usize::MAX })?;
    let header = RequestHeader {
        // Cannot truncate: checked against MAX_DMA_DESCRIPTORS (31) above.
        arg_dma_count: descriptors.len() as u8,
        total_size: total_u32(len)?,
        ..*header
    };
    if out.len() < len {
        return Err(WireError::Short { need: len, got: out.len() });
    }
    // Header first: it validates the remaining fields before anything else is written.
    header.encode(out)?;
    let short = WireError::Short { need: len, got: out.len() };
    let desc_out = out.get_mut(RequestHeader::LEN..desc_end).ok_or(short)?;
    for (d, chunk) in descriptors.iter().zip(desc_out.chunks_exact_mut(DmaDescriptor::LEN)) {
        d.encode(chunk)?;
    }
    out.get_mut(desc_end..len).ok_or(short)?.copy_from_slice(args);
    Ok(len)
}

/// Writes a whole response — header, then `data` — to the front of `out` and returns its length.
/// The header's `total_size` is not taken from `header` but computed from `data`. Nothing is
/// written on error.
///
/// Errors: [`WireError::MessageTooLarge`], the errors of [`ResponseHeader::encode`],
/// [`WireError::Short`] if `out` cannot hold the message.
pub fn encode_response(out: &mut [u8], header: &ResponseHeader, data: &[u8]) -> Result<usize, WireError> {
    let len =
        ResponseHeader::LEN.checked_add(data.len()).ok_or(WireError::MessageTooLarge { len: usize::MAX })?;
    let header = ResponseHeader { total_size: total_u32(len)?, ..*header };
    let short = WireError::Short { need: len, got: out.len() };
    if out.len() < len {
        return Err(short);
    }
    header.encode(out)?;
    out.get_mut(ResponseHeader::LEN..len).ok_or(short)?.copy_from_slice(data);
    Ok(len)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOLDEN_REQ: [u8; 20] = [
        0x10, 0x80, 0x04, 0x00, 0x00, 0x01, 0x28, 0x00, 0x64, 0x00, 0x00, 0x00, 0xdd, 0xcc, 0xbb, 0xaa, 0x56,
        0x34, 0x12, 0x00,
    ];
    const GOLDEN_RSP: [u8; 16] =
        [0x12, 0x00, 0x01, 0x00, 0xdd, 0xcc, 0xbb, 0xaa, 0x56, 0x34, 0x12, 0x00, 0x3c, 0x00, 0x00, 0x00];

    fn golden_req() -> RequestHeader {
        RequestHeader {
            arg_dma_count: 0,
            ack_requested: true,
            no_response: false,
            response_descriptor: false,
            function: FunctionId::from_raw(0x0028_0100_0004).unwrap(),
            total_size: 100,
            req_id: 0xAABB_CCDD,
            channel: 0x12_3456,
            function_defined: 0,
        }
    }

    fn golden_rsp() -> ResponseHeader {
        ResponseHeader {
            ack: false,
            status: Status::Success,
            req_id_range: 1,
            req_id: 0xAABB_CCDD,
            channel: 0x12_3456,
            function_defined: 0,
            total_size: 60,
        }
    }

    // ---- golden vectors ----

    #[test]
    fn request_response_descriptor_bit_is_bit_6_of_byte_1() {
        let mut out = [0u8; 20];
        let h = RequestHeader { response_descriptor: true, arg_dma_count: 1, total_size: 36, ..golden_req() };
        h.encode(&mut out).unwrap();
        assert_eq!(out[1], 0x80 | 0x40 | 1);
        assert_eq!(RequestHeader::decode(&out).unwrap(), h);
        let mut out = [0u8; 20];
        golden_req().encode(&mut out).unwrap();
        assert_eq!(out[1] & 0x40, 0, "bit 6 stays 0 unless set");
    }

    #[test]
    fn golden_request_encodes_exactly() {
        let mut out = [0xEEu8; 24];
        assert_eq!(golden_req().encode(&mut out), Ok(20));
        assert_eq!(out[..20], GOLDEN_REQ);
        assert_eq!(out[20..], [0xEE; 4], "encode wrote past the header");
    }

    #[test]
    fn golden_request_decodes_to_fields() {
        let h = RequestHeader::decode(&GOLDEN_REQ).unwrap();
        assert_eq!(h, golden_req());
        assert_eq!(h.function.raw(), 0x0028_0100_0004);
        assert!(h.ack_requested);
        assert_eq!(h.arg_dma_count, 0);
        assert_eq!(h.total_size, 100);
        assert_eq!(h.req_id, 0xAABB_CCDD);
        assert_eq!(h.channel, 0x12_3456);
        assert_eq!(h.function_defined, 0);
        assert_eq!(peek_type(&GOLDEN_REQ), Ok(MsgType::Req));
    }

    #[test]
    fn golden_response_encodes_exactly() {
        let mut out = [0xEEu8; 16];
        assert_eq!(golden_rsp().encode(&mut out), Ok(16));
        assert_eq!(out, GOLDEN_RSP);
    }

    #[test]
    fn golden_response_decodes_to_fields() {
        let h = ResponseHeader::decode(&GOLDEN_RSP).unwrap();
        assert_eq!(h, golden_rsp());
        assert_eq!(h.msg_type(), MsgType::Rsp);
        assert_eq!(peek_type(&GOLDEN_RSP), Ok(MsgType::Rsp));
    }

    #[test]
    fn golden_vectors_parse_as_whole_messages() {
        let mut req = [0u8; 100];
        req[..20].copy_from_slice(&GOLDEN_REQ);
        req[20..].iter_mut().enumerate().for_each(|(i, b)| *b = i as u8);
        match parse(&req).unwrap() {
            Parsed::Request(v) => {
                assert_eq!(v.header, golden_req());
                assert!(v.descriptors.is_empty());
                assert_eq!(v.args.len(), 80);
                assert_eq!(v.args, &req[20..]);
            }
            other => panic!("expected a request, got {other:?}"),
        }
        let mut rsp = [0u8; 60];
        rsp[..16].copy_from_slice(&GOLDEN_RSP);
        match parse(&rsp).unwrap() {
            Parsed::Response(v) => {
                assert_eq!(v.header, golden_rsp());
                assert_eq!(v.data.len(), 44);
            }
            other => panic!("expected a response, got {other:?}"),
        }
    }

    // ---- ACK ----

    // Derived by hand from the spec: byte 0 = 1 | 1 << 4 = 0x11; byte 1 reserved; req_id_range 1
    // LE; req_id 0x01020304 LE; channel 0xABCDEF LE (3 bytes); byte 11 reserved.
    const HAND_ACK: [u8; 12] = [0x11, 0x00, 0x01, 0x00, 0x04, 0x03, 0x02, 0x01, 0xef, 0xcd, 0xab, 0x00];

    #[test]
    fn ack_round_trips_through_hand_checked_bytes() {
        let ack = AckHeader::new(0x0102_0304, 0xAB_CDEF);
        let mut out = [0xEEu8; 12];
        assert_eq!(ack.encode(&mut out), Ok(12));
        assert_eq!(out, HAND_ACK);
        assert_eq!(AckHeader::decode(&HAND_ACK), Ok(ack));
        assert_eq!(parse(&HAND_ACK), Ok(Parsed::Ack(ack)));
        assert_eq!(parse(&HAND_ACK).unwrap().msg_type(), MsgType::Ack);
    }

    #[test]
    fn ack_reserved_bytes_are_ignored_on_decode_and_zeroed_on_encode() {
        let mut bytes = HAND_ACK;
        bytes[1] = 0xFF;
        bytes[11] = 0x5A;
        let ack = AckHeader::decode(&bytes).unwrap();
        assert_eq!(ack, AckHeader::new(0x0102_0304, 0xAB_CDEF));
        let mut out = [0u8; 12];
        ack.encode(&mut out).unwrap();
        assert_eq!(out, HAND_ACK);
    }

    #[test]
    fn ack_message_must_be_exactly_twelve_bytes() {
        let mut long = [0u8; 13];
        long[..12].copy_from_slice(&HAND_ACK);
        assert_eq!(parse(&long), Err(WireError::LengthMismatch { expected: 12, actual: 13 }));
        // Header-level decode only reads the front.
        assert!(AckHeader::decode(&long).is_ok());
    }

    #[test]
    fn ack_and_rsp_type_round_trips() {
        let h = ResponseHeader { ack: true, ..golden_rsp() };
        let mut out = [0u8; 16];
        h.encode(&mut out).unwrap();
        assert_eq!(out[0], 0x13);
        assert_eq!(peek_type(&out), Ok(MsgType::AckAndRsp));
        assert_eq!(ResponseHeader::decode(&out), Ok(h));
    }

    // ---- status codes and message types ----

    #[test]
    fn every_status_code() {
        let expected = [
            (0, Status::Success),
            (1, Status::ServerDecline),
            (2, Status::FunctionErr),
            (3, Status::RemoteLenErr),
            (4, Status::Timeout),
            (5, Status::VersionErr),
            (6, Status::HdrErr),
        ];
        assert_eq!(Status::ALL.len(), expected.len());
        for (value, status) in expected {
            assert_eq!(Status::from_u8(value), Ok(status));
            assert_eq!(Status::try_from(value), Ok(status));
            assert_eq!(status.as_u8(), value);
            let h = ResponseHeader { status, ..golden_rsp() };
            let mut out = [0u8; 16];
            h.encode(&mut out).unwrap();
            assert_eq!(out[1], value);
            assert_eq!(ResponseHeader::decode(&out), Ok(h));
        }
        for value in 7..=u8::MAX {
            assert_eq!(Status::from_u8(value), Err(WireError::BadStatus(value)));
            let mut bytes = GOLDEN_RSP;
            bytes[1] = value;
            assert_eq!(ResponseHeader::decode(&bytes), Err(WireError::BadStatus(value)));
        }
    }

    #[test]
    fn every_message_type() {
        for (value, ty) in [(0, MsgType::Req), (1, MsgType::Ack), (2, MsgType::Rsp), (3, MsgType::AckAndRsp)]
        {
            assert_eq!(MsgType::from_u8(value), Ok(ty));
            assert_eq!(MsgType::try_from(value), Ok(ty));
            assert_eq!(ty.as_u8(), value);
            assert_eq!(peek_type(&[value | 0x10]), Ok(ty));
        }
        for value in 4..=u8::MAX {
            assert_eq!(MsgType::from_u8(value), Err(WireError::UnknownType(value)));
        }
    }

    // ---- function id ----

    #[test]
    fn keepalive_function_id_decomposes() {
        let k = FunctionId::KEEPALIVE;
        assert_eq!(k.raw(), 0x0020_0100_0005);
        assert_eq!(k.device_class(), 0x002);
        assert_eq!(k.sub_class(), 0x001);
        assert!(!k.is_user_defined());
        assert_eq!(k.method(), 5);
        assert_eq!(FunctionId::new(2, 1, false, 5), Some(k));
    }

    #[test]
    fn golden_function_id_decomposes() {
        let f = FunctionId::from_raw(0x0028_0100_0004).unwrap();
        assert_eq!(f.device_class(), 0x002);
        assert_eq!(f.sub_class(), 0x801);
        assert!(!f.is_user_defined());
        assert_eq!(f.method(), 4);
        assert_eq!(FunctionId::new(0x002, 0x801, false, 4), Some(f));
        assert_eq!(f.to_string(), "0x002801000004");
        assert_eq!(u64::from(f), 0x0028_0100_0004);
    }

    #[test]
    fn function_id_field_packing() {
        let f = FunctionId::new(0xABC, 0xDEF, true, 0x12_3456).unwrap();
        assert_eq!(f.raw(), 0xABC << 36 | 0xDEF << 24 | 1 << 23 | 0x12_3456);
        assert_eq!(
            (f.device_class(), f.sub_class(), f.is_user_defined(), f.method()),
            (0xABC, 0xDEF, true, 0x12_3456)
        );
        // Each field alone lands in its own bits.
        assert_eq!(FunctionId::new(0, 0, false, FunctionId::MAX_METHOD).unwrap().raw(), 0x7F_FFFF);
        assert_eq!(FunctionId::new(0, 0, true, 0).unwrap().raw(), 0x80_0000);
        assert_eq!(FunctionId::new(0, 0xFFF, false, 0).unwrap().raw(), 0xFFF << 24);
        assert_eq!(FunctionId::new(0xFFF, 0, false, 0).unwrap().raw(), 0xFFF << 36);
        let max = FunctionId::new(0xFFF, 0xFFF, true, FunctionId::MAX_METHOD).unwrap();
        assert_eq!(max.raw(), FunctionId::MAX_RAW);
        // Fields that do not fit.
        assert_eq!(FunctionId::new(0x1000, 0, false, 0), None);
        assert_eq!(FunctionId::new(0, 0x1000, false, 0), None);
        assert_eq!(FunctionId::new(0, 0, false, 1 << 23), None);
        assert_eq!(FunctionId::new(u16::MAX, u16::MAX, true, u32::MAX), None);
    }

    #[test]
    fn function_id_rejects_values_of_48_bits_or_more() {
        assert_eq!(FunctionId::from_raw(FunctionId::MAX_RAW).map(FunctionId::raw), Ok(FunctionId::MAX_RAW));
        for raw in [1 << 48, (1 << 48) + 1, u64::MAX] {
            assert_eq!(FunctionId::from_raw(raw), Err(WireError::FunctionIdOutOfRange(raw)));
            assert_eq!(FunctionId::try_from(raw), Err(WireError::FunctionIdOutOfRange(raw)));
        }
    }

    #[test]
    fn function_id_is_bytes_two_to_eight_of_a_request() {
        let h = RequestHeader { function: FunctionId::MAX_RAW.try_into().unwrap(), ..golden_req() };
        let mut out = [0u8; 20];
        h.encode(&mut out).unwrap();
        assert_eq!(out[2..8], [0xFF; 6]);
        assert_eq!(out[8], 100, "function id spilled into total size");
        assert_eq!(RequestHeader::decode(&out).unwrap().function, h.function);
    }

    // ---- descriptors ----

    #[test]
    fn dma_descriptor_layout() {
        let d = DmaDescriptor { size: 0x0403_0201, address: 0x0C0B_0A09_0807_0605, token: 0x100F_0E0D };
        let mut out = [0u8; 16];
        assert_eq!(d.encode(&mut out), Ok(16));
        assert_eq!(out, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]);
        assert_eq!(DmaDescriptor::decode(&out), Ok(d));
        for len in 0..16 {
            assert_eq!(DmaDescriptor::decode(&out[..len]), Err(WireError::Short { need: 16, got: len }));
            let mut short = vec![0u8; len];
            assert_eq!(d.encode(&mut short), Err(WireError::Short { need: 16, got: len }));
        }
    }

    #[test]
    fn request_with_descriptors_and_args_round_trips() {
        let descs = [
            DmaDescriptor { size: 4096, address: 0x7f00_0000_1000, token: 0x11 },
            DmaDescriptor { size: 1 << 20, address: 0x7f00_0010_0000, token: 0x22 },
            DmaDescriptor { size: 8, address: 0, token: u32::MAX },
        ];
        let args = b"hello, server";
        let mut buf = [0u8; 128];
        let len = encode_request(&mut buf, &golden_req(), &descs, args).unwrap();
        assert_eq!(len, 20 + 3 * 16 + args.len());
        assert_eq!(buf[1], 0x80 | 3);
        let Parsed::Request(v) = parse(&buf[..len]).unwrap() else { panic!("not a request") };
        assert_eq!(v.header.arg_dma_count, 3);
        assert_eq!(v.header.total_size as usize, len);
        assert_eq!(v.descriptors.len(), 3);
        assert_eq!(v.descriptors.iter().len(), 3);
        assert!(v.descriptors.iter().eq(descs.iter().copied()));
        assert!(v.descriptors.into_iter().eq(descs.iter().copied()));
        assert_eq!(v.descriptors.get(1), Some(descs[1]));
        assert_eq!(v.descriptors.get(3), None);
        assert_eq!(v.descriptors.get(usize::MAX), None);
        assert_eq!(v.descriptors.as_bytes().len(), 48);
        assert_eq!(v.args, args);
    }

    #[test]
    fn request_bit_6_only_sets_the_response_descriptor_flag() {
        // Bit 6 was URPC's last reserved bit of byte 1; bypass gives it to rendezvous responses.
        let mut bytes = GOLDEN_REQ;
        bytes[1] |= 0x40;
        assert_eq!(
            RequestHeader::decode(&bytes),
            Ok(RequestHeader { response_descriptor: true, ..golden_req() })
        );
    }

    #[test]
    fn request_no_response_bit_is_bit_5_of_byte_1() {
        let mut out = [0u8; 20];
        RequestHeader { no_response: true, ..golden_req() }.encode(&mut out).unwrap();
        let mut expect = GOLDEN_REQ;
        expect[1] |= 0x20;
        assert_eq!(out, expect);
        assert!(RequestHeader::decode(&out).unwrap().no_response);
        assert!(!RequestHeader::decode(&GOLDEN_REQ).unwrap().no_response);
    }

    #[test]
    fn credit_grant_is_an_ack_with_range_zero() {
        let mut out = [0u8; 12];
        AckHeader::credit_grant(5, 0x12_3456).encode(&mut out).unwrap();
        assert_eq!(out, [0x11, 0, 0, 0, 5, 0, 0, 0, 0x56, 0x34, 0x12, 0]);
        let h = AckHeader::decode(&out).unwrap();
        assert!(h.is_credit_grant());
        assert!(!AckHeader::new(5, 1).is_credit_grant());
    }

    #[test]
    fn encode_response_fills_total_size() {
        let mut buf = [0u8; 64];
        let len =
            encode_response(&mut buf, &ResponseHeader { total_size: 0, ..golden_rsp() }, &[7; 44]).unwrap();
        assert_eq!(len, 60);
        assert_eq!(buf[..16], GOLDEN_RSP);
        let Parsed::Response(v) = parse(&buf[..len]).unwrap() else { panic!("not a response") };
        assert_eq!(v.data, &[7; 44]);
        let mut small = [0u8; 59];
        assert_eq!(
            encode_response(&mut small, &golden_rsp(), &[7; 44]),
            Err(WireError::Short { need: 60, got: 59 })
        );
        assert_eq!(small, [0; 59], "nothing written on error");
    }

    // ---- error paths ----

    #[test]
    fn short_buffers_at_every_length_below_the_header() {
        let mut out = [0u8; 20];
        for len in 0..20 {
            let err = WireError::Short { need: 20, got: len };
            assert_eq!(RequestHeader::decode(&GOLDEN_REQ[..len]), Err(err));
            assert_eq!(golden_req().encode(&mut out[..len]), Err(err));
            if len > 0 {
                assert_eq!(parse(&GOLDEN_REQ[..len]), Err(err));
            }
        }
        for len in 0..16 {
            let err = WireError::Short { need: 16, got: len };
            assert_eq!(ResponseHeader::decode(&GOLDEN_RSP[..len]), Err(err));
            assert_eq!(golden_rsp().encode(&mut out[..len]), Err(err));
            if len > 0 {
                assert_eq!(parse(&GOLDEN_RSP[..len]), Err(err));
            }
        }
        for len in 0..12 {
            let err = WireError::Short { need: 12, got: len };
            assert_eq!(AckHeader::decode(&HAND_ACK[..len]), Err(err));
            assert_eq!(AckHeader::new(1, 2).encode(&mut out[..len]), Err(err));
            if len > 0 {
                assert_eq!(parse(&HAND_ACK[..len]), Err(err));
            }
        }
        assert_eq!(peek_type(&[]), Err(WireError::Short { need: 1, got: 0 }));
        assert_eq!(parse(&[]), Err(WireError::Short { need: 1, got: 0 }));
    }

    #[test]
    fn encode_writes_nothing_on_error() {
        let mut out = [0xEEu8; 19];
        assert!(golden_req().encode(&mut out).is_err());
        assert_eq!(out, [0xEE; 19]);
        let mut out = [0xEEu8; 20];
        assert!(RequestHeader { channel: 1 << 24, ..golden_req() }.encode(&mut out).is_err());
        assert_eq!(out, [0xEE; 20]);
    }

    #[test]
    fn bad_versions_are_rejected() {
        for version in (0..=15u8).filter(|&v| v != VERSION) {
            for (ty, bytes) in [(0u8, &GOLDEN_REQ[..]), (1, &HAND_ACK[..]), (2, &GOLDEN_RSP[..])] {
                let mut b = bytes.to_vec();
                b[0] = ty | version << 4;
                let err = Err(WireError::BadVersion(version));
                assert_eq!(peek_type(&b), err);
                assert_eq!(parse(&b).map(|p| p.msg_type()), err);
                match ty {
                    0 => assert_eq!(RequestHeader::decode(&b).map(|_| ()), err.map(|_| ())),
                    1 => assert_eq!(AckHeader::decode(&b).map(|_| ()), err.map(|_| ())),
                    _ => assert_eq!(ResponseHeader::decode(&b).map(|_| ()), err.map(|_| ())),
                }
            }
        }
    }

    #[test]
    fn unknown_types_are_rejected() {
        for ty in 4..=15u8 {
            let mut b = GOLDEN_REQ;
            b[0] = ty | 0x10;
            let err = WireError::UnknownType(ty);
            assert_eq!(peek_type(&b), Err(err));
            assert_eq!(parse(&b), Err(err));
            assert_eq!(RequestHeader::decode(&b), Err(err));
            assert_eq!(AckHeader::decode(&b), Err(err));
            assert_eq!(ResponseHeader::decode(&b), Err(err));
        }
    }

    #[test]
    fn decoders_refuse_the_other_types() {
        let e = RequestHeader::decode(&[0x11; 20]).unwrap_err();
        assert_eq!(e, WireError::UnexpectedType { expected: "a REQ", got: MsgType::Ack });
        assert_eq!(e.to_string(), "expected a REQ header, found a message of type ACK");
        assert!(matches!(
            AckHeader::decode(&GOLDEN_REQ),
            Err(WireError::UnexpectedType { got: MsgType::Req, .. })
        ));
        assert!(matches!(
            ResponseHeader::decode(&GOLDEN_REQ),
            Err(WireError::UnexpectedType { got: MsgType::Req, .. })
        ));
        assert!(matches!(RequestHeader::decode(&GOLDEN_RSP), Err(WireError::Short { .. })));
        let mut rsp20 = [0u8; 20];
        rsp20[..16].copy_from_slice(&GOLDEN_RSP);
        assert!(matches!(
            RequestHeader::decode(&rsp20),
            Err(WireError::UnexpectedType { got: MsgType::Rsp, .. })
        ));
    }

    #[test]
    fn request_lengths_that_do_not_add_up() {
        // total_size below the header.
        for total in 0..20u32 {
            let h = RequestHeader { total_size: total, ..golden_req() };
            let mut b = GOLDEN_REQ;
            b[8..12].copy_from_slice(&total.to_le_bytes());
            let err = WireError::TotalSizeTooSmall { declared: total, min: 20 };
            assert_eq!(RequestHeader::decode(&b), Err(err));
            assert_eq!(parse(&b), Err(err));
            assert_eq!(h.encode(&mut [0u8; 20]), Err(err));
        }
        // total_size covers the header but not its two descriptors.
        let h = RequestHeader { arg_dma_count: 2, total_size: 51, ..golden_req() };
        assert_eq!(h.encode(&mut [0u8; 20]), Err(WireError::TotalSizeTooSmall { declared: 51, min: 52 }));
        let mut b = [0u8; 51];
        b[..20].copy_from_slice(&GOLDEN_REQ);
        b[1] = 0x82;
        b[8..12].copy_from_slice(&51u32.to_le_bytes());
        assert_eq!(parse(&b), Err(WireError::TotalSizeTooSmall { declared: 51, min: 52 }));
        // Received message shorter or longer than total_size.
        let mut buf = [0u8; 101];
        buf[..20].copy_from_slice(&GOLDEN_REQ);
        for len in [20, 50, 99, 101] {
            assert_eq!(parse(&buf[..len]), Err(WireError::LengthMismatch { expected: 100, actual: len }));
        }
        assert!(parse(&buf[..100]).is_ok());
        // Descriptors declared but the message ends inside them.
        let mut b = [0u8; 36];
        b[..20].copy_from_slice(&GOLDEN_REQ);
        b[1] = 0x81;
        b[8..12].copy_from_slice(&36u32.to_le_bytes());
        assert!(parse(&b).is_ok());
        assert_eq!(parse(&b[..35]), Err(WireError::LengthMismatch { expected: 36, actual: 35 }));
    }

    #[test]
    fn response_lengths_that_do_not_add_up() {
        for total in 0..16u32 {
            let mut b = GOLDEN_RSP;
            b[12..16].copy_from_slice(&total.to_le_bytes());
            let err = WireError::TotalSizeTooSmall { declared: total, min: 16 };
            assert_eq!(ResponseHeader::decode(&b), Err(err));
            assert_eq!(parse(&b), Err(err));
            let h = ResponseHeader { total_size: total, ..golden_rsp() };
            assert_eq!(h.encode(&mut [0u8; 16]), Err(err));
        }
        let mut buf = [0u8; 61];
        buf[..16].copy_from_slice(&GOLDEN_RSP);
        for len in [16, 59, 61] {
            assert_eq!(parse(&buf[..len]), Err(WireError::LengthMismatch { expected: 60, actual: len }));
        }
        assert!(parse(&buf[..60]).is_ok());
        // A total size of exactly the header is a response with no data.
        let mut b = GOLDEN_RSP;
        b[12] = 16;
        let Parsed::Response(v) = parse(&b).unwrap() else { panic!("not a response") };
        assert!(v.data.is_empty());
    }

    #[test]
    fn too_many_descriptors() {
        for count in [32u8, 33, 0x7F, u8::MAX] {
            let h = RequestHeader { arg_dma_count: count, total_size: u32::MAX, ..golden_req() };
            assert_eq!(h.encode(&mut [0u8; 20]), Err(WireError::TooManyDescriptors { count: count.into() }));
        }
        let h = RequestHeader { arg_dma_count: 31, total_size: 20 + 31 * 16, ..golden_req() };
        let mut out = [0u8; 20];
        assert_eq!(h.encode(&mut out), Ok(20));
        assert_eq!(out[1], 0x80 | 31);
        let descs = [DmaDescriptor::default(); 32];
        let mut buf = [0u8; 1024];
        assert_eq!(
            encode_request(&mut buf, &golden_req(), &descs, &[]),
            Err(WireError::TooManyDescriptors { count: 32 })
        );
        assert_eq!(encode_request(&mut buf, &golden_req(), &descs[..31], &[]), Ok(20 + 31 * 16));
    }

    #[test]
    fn channel_out_of_range() {
        let mut out = [0u8; 20];
        for channel in [1 << 24, (1 << 24) + 1, u32::MAX] {
            let err = Err(WireError::ChannelOutOfRange(channel));
            assert_eq!(RequestHeader { channel, ..golden_req() }.encode(&mut out), err);
            assert_eq!(AckHeader::new(0, channel).encode(&mut out), err);
            assert_eq!(ResponseHeader { channel, ..golden_rsp() }.encode(&mut out), err);
        }
        let h = RequestHeader { channel: MAX_CHANNEL_ID, ..golden_req() };
        h.encode(&mut out).unwrap();
        assert_eq!(out[16..20], [0xFF, 0xFF, 0xFF, 0x00]);
        assert_eq!(RequestHeader::decode(&out), Ok(h));
    }

    #[test]
    fn error_messages_say_what_was_wrong() {
        let cases = [
            (WireError::Short { need: 20, got: 3 }, "need 20 bytes, got 3"),
            (WireError::BadVersion(2), "version 2"),
            (WireError::UnknownType(9), "message type 9"),
            (WireError::BadStatus(7), "status 7"),
            (
                WireError::TotalSizeTooSmall { declared: 4, min: 20 },
                "total size of 4 bytes, less than the 20",
            ),
            (WireError::LengthMismatch { expected: 100, actual: 99 }, "100-byte message but 99 bytes"),
            (WireError::TooManyDescriptors { count: 40 }, "40 DMA descriptors"),
            (WireError::ChannelOutOfRange(0x100_0000), "channel id 0x1000000"),
            (WireError::FunctionIdOutOfRange(1 << 48), "function id 0x1000000000000"),
            (WireError::MessageTooLarge { len: 5_000_000_000 }, "5000000000-byte message"),
        ];
        for (err, needle) in cases {
            let msg = err.to_string();
            assert!(msg.contains(needle), "{msg:?} does not contain {needle:?}");
        }
    }

    // ---- fuzz-style: seeded, no extra dependency ----

    use crate::test_rng::Rng;

    fn decode_everything(bytes: &[u8]) {
        let _ = peek_type(bytes);
        let _ = RequestHeader::decode(bytes);
        let _ = AckHeader::decode(bytes);
        let _ = ResponseHeader::decode(bytes);
        let _ = DmaDescriptor::decode(bytes);
        if let Ok(p) = parse(bytes) {
            // Whatever parses must be internally consistent.
            match p {
                Parsed::Request(v) => {
                    assert_eq!(v.header.total_size as usize, bytes.len());
                    assert_eq!(v.descriptors.len(), v.header.arg_dma_count as usize);
                    assert_eq!(v.descriptors.iter().count(), v.descriptors.len());
                    assert_eq!(20 + v.descriptors.as_bytes().len() + v.args.len(), bytes.len());
                }
                Parsed::Ack(_) => assert_eq!(bytes.len(), 12),
                Parsed::Response(v) => {
                    assert_eq!(v.header.total_size as usize, bytes.len());
                    assert_eq!(16 + v.data.len(), bytes.len());
                }
            }
        }
    }

    #[test]
    fn decode_never_panics_on_random_bytes() {
        let mut rng = Rng(0x5EED_0001_D15C_0A11);
        let mut buf = [0u8; 600];
        for _ in 0..100_000 {
            let len = rng.below_u64(buf.len() as u64 + 1) as usize;
            rng.fill(&mut buf[..len]);
            // Bias towards valid first bytes so the deeper checks are reached too.
            if len > 0 && rng.below_u64(4) != 0 {
                buf[0] = 0x10 | rng.below_u64(4) as u8;
            }
            if len >= 12 && rng.below_u64(2) == 0 {
                // Make the declared total size agree with the length half of the time.
                match buf[0] & 0x0F {
                    0 if len >= 20 => buf[8..12].copy_from_slice(&(len as u32).to_le_bytes()),
                    2 | 3 if len >= 16 => buf[12..16].copy_from_slice(&(len as u32).to_le_bytes()),
                    _ => {}
                }
            }
            decode_everything(&buf[..len]);
        }
    }

    #[test]
    fn decode_never_panics_on_every_first_two_bytes() {
        // Exhaustive over the type/version byte and the byte after it, at every short length.
        let mut buf = [0u8; 100];
        buf[..20].copy_from_slice(&GOLDEN_REQ);
        for len in [0, 1, 2, 11, 12, 15, 16, 19, 20, 100] {
            for b0 in 0..=u8::MAX {
                for b1 in 0..=u8::MAX {
                    buf[0] = b0;
                    buf[1] = b1;
                    decode_everything(&buf[..len]);
                }
            }
        }
    }

    #[test]
    fn single_bit_flips_of_valid_messages_never_panic() {
        let mut buf = [0u8; 100];
        let len = encode_request(
            &mut buf,
            &golden_req(),
            &[DmaDescriptor { size: 1, address: 2, token: 3 }; 2],
            &[9; 20],
        )
        .unwrap();
        for bit in 0..len * 8 {
            let mut m = buf;
            m[bit / 8] ^= 1 << (bit % 8);
            decode_everything(&m[..len]);
        }
        for bit in 0..16 * 8 {
            let mut m = GOLDEN_RSP;
            m[bit / 8] ^= 1 << (bit % 8);
            decode_everything(&m);
        }
    }

    fn random_request(rng: &mut Rng) -> RequestHeader {
        let arg_dma_count = rng.below_u64(32) as u8;
        let min = 20 + u64::from(arg_dma_count) * 16;
        RequestHeader {
            arg_dma_count,
            ack_requested: rng.below_u64(2) == 1,
            no_response: rng.below_u64(2) == 1,
            response_descriptor: rng.below_u64(2) == 1,
            function: FunctionId::from_raw(rng.next() & FunctionId::MAX_RAW).unwrap(),
            total_size: (min + rng.below_u64(u64::from(u32::MAX) - min + 1)) as u32,
            req_id: rng.next() as u32,
            channel: rng.next() as u32 & MAX_CHANNEL_ID,
            function_defined: rng.next() as u8,
        }
    }

    fn random_response(rng: &mut Rng) -> ResponseHeader {
        ResponseHeader {
            ack: rng.below_u64(2) == 1,
            status: Status::ALL[rng.below_u64(7) as usize],
            req_id_range: rng.next() as u16,
            req_id: rng.next() as u32,
            channel: rng.next() as u32 & MAX_CHANNEL_ID,
            function_defined: rng.next() as u8,
            total_size: (16 + rng.below_u64(u64::from(u32::MAX) - 15)) as u32,
        }
    }

    #[test]
    fn encode_decode_round_trips_for_random_valid_headers() {
        let mut rng = Rng(0x0BAD_5EED_CAFE_F00D);
        for _ in 0..20_000 {
            let mut out = [0u8; 20];
            let req = random_request(&mut rng);
            assert_eq!(req.encode(&mut out), Ok(20));
            assert_eq!(RequestHeader::decode(&out), Ok(req));
            assert_eq!(peek_type(&out), Ok(MsgType::Req));

            let rsp = random_response(&mut rng);
            assert_eq!(rsp.encode(&mut out), Ok(16));
            assert_eq!(ResponseHeader::decode(&out), Ok(rsp));
            assert_eq!(peek_type(&out), Ok(rsp.msg_type()));

            let ack = AckHeader {
                req_id_range: rng.next() as u16,
                req_id: rng.next() as u32,
                channel: rng.next() as u32 & MAX_CHANNEL_ID,
            };
            assert_eq!(ack.encode(&mut out), Ok(12));
            assert_eq!(AckHeader::decode(&out), Ok(ack));

            let d = DmaDescriptor { size: rng.next() as u32, address: rng.next(), token: rng.next() as u32 };
            assert_eq!(d.encode(&mut out), Ok(16));
            assert_eq!(DmaDescriptor::decode(&out), Ok(d));

            let (dc, sc, p, m) = (
                rng.below_u64(0x1000) as u16,
                rng.below_u64(0x1000) as u16,
                rng.below_u64(2) == 1,
                rng.below_u64(1 << 23) as u32,
            );
            let f = FunctionId::new(dc, sc, p, m).unwrap();
            assert_eq!((f.device_class(), f.sub_class(), f.is_user_defined(), f.method()), (dc, sc, p, m));
            assert_eq!(FunctionId::from_raw(f.raw()), Ok(f));
        }
    }

    #[test]
    fn encode_parse_round_trips_for_random_messages() {
        let mut rng = Rng(0x1234_5678_9ABC_DEF1);
        let mut buf = [0u8; 20 + 31 * 16 + 256];
        let mut descs = [DmaDescriptor::default(); 31];
        let mut payload = [0u8; 256];
        for _ in 0..5_000 {
            let header = random_request(&mut rng);
            let n = rng.below_u64(32) as usize;
            for d in &mut descs[..n] {
                *d = DmaDescriptor { size: rng.next() as u32, address: rng.next(), token: rng.next() as u32 };
            }
            let args_len = rng.below_u64(257) as usize;
            rng.fill(&mut payload[..args_len]);
            let len = encode_request(&mut buf, &header, &descs[..n], &payload[..args_len]).unwrap();
            let Parsed::Request(v) = parse(&buf[..len]).unwrap() else { panic!("not a request") };
            let expect = RequestHeader { arg_dma_count: n as u8, total_size: len as u32, ..header };
            assert_eq!(v.header, expect);
            assert!(v.descriptors.iter().eq(descs[..n].iter().copied()));
            assert_eq!(v.args, &payload[..args_len]);

            let header = random_response(&mut rng);
            let len = encode_response(&mut buf, &header, &payload[..args_len]).unwrap();
            let Parsed::Response(v) = parse(&buf[..len]).unwrap() else { panic!("not a response") };
            assert_eq!(v.header, ResponseHeader { total_size: len as u32, ..header });
            assert_eq!(v.data, &payload[..args_len]);
        }
    }
}
