//! # session: the control frames exchanged after the handshake (control protocol version 3 and
//! later)
//!
//! Once a connection is up, its TCP stream carries only these frames, in the common 12-byte
//! frame header (magic `BYPC`, type, reserved 0, sender's version, body length):
//!
//! ### Queue reset (type 4), client → server
//!
//! | field | encoding |
//! |---|---|
//! | `seq` | u32: the client's number for this exchange, echoed in the answer |
//! | `queue` | u16: index of the queue in the connection (as in the hellos' queue lists) |
//! | `info` | one queue info ([`QueueInfo::encode`]): the client queue after its reset |
//!
//! ### Queue reset answer (type 5), server → client
//!
//! | field | encoding |
//! |---|---|
//! | `seq` | u32: the request's `seq` |
//! | `queue` | u16: the request's `queue` |
//! | `status` | u8: 0 = done (the server queue is READY, connected to `info` of the request), 1 = refused |
//! | `info` | one queue info: the server queue after its reset (all zero when refused) |
//! | `reason` | string ([`MAX_REASON_LEN`] bytes): why it was refused, else empty |
//!
//! A frame of another type or version after the handshake, or one that does not parse, is a
//! protocol error: the reader closes the connection.
//!
//! All reading and writing of the stream after the handshake goes through this module, so that a
//! different stream (TLS) changes only it: `SessionReader` (frames read on the control loop as
//! their bytes arrive, never blocking: the server's queue resets and the client's answers to
//! them) and `write_frame_now` (a frame the socket must take at once).

use super::{
    build_frame, malformed, open_frame, put_str, ControlError, MsgType, CONTROL_VERSION, MAX_REASON_LEN,
};
use bypass_hal::QueueInfo;

/// The client asks the server to reset its end of queue `queue` and connect it to `info`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueReset {
    /// The client's number for this exchange (echoed in the answer).
    pub seq: u32,
    /// The queue's index in the connection.
    pub queue: u16,
    /// The client's queue after its reset.
    pub info: QueueInfo,
}

/// The server's answer to a [`QueueReset`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueResetDone {
    /// The request's `seq`.
    pub seq: u32,
    /// The request's `queue`.
    pub queue: u16,
    /// `Ok(info)`: the server's queue is READY and connected, `info` describes it; `Err(reason)`:
    /// refused.
    pub result: Result<QueueInfo, String>,
}

/// A frame read after the handshake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionFrame {
    /// A [`QueueReset`] (to a server).
    QueueReset(QueueReset),
    /// A [`QueueResetDone`] (to a client).
    QueueResetDone(QueueResetDone),
}

fn zero_info() -> QueueInfo {
    QueueInfo::default()
}

impl QueueReset {
    /// The whole frame.
    pub fn encode(&self) -> Result<Vec<u8>, ControlError> {
        build_frame(MsgType::QueueReset, CONTROL_VERSION, |out| {
            out.extend_from_slice(&self.seq.to_le_bytes());
            out.extend_from_slice(&self.queue.to_le_bytes());
            out.extend_from_slice(&self.info.encode());
            Ok(())
        })
    }

    /// Decodes one whole frame as written by [`encode`](Self::encode).
    pub fn decode(frame: &[u8]) -> Result<Self, ControlError> {
        let (_, mut body) = open_frame(frame, MsgType::QueueReset)?;
        let seq = body.u32("seq")?;
        let queue = body.u16("queue")?;
        let info = body.queue_info()?;
        body.finish()?;
        Ok(QueueReset { seq, queue, info })
    }
}

impl QueueResetDone {
    /// The whole frame (a refusal's reason is clipped to [`MAX_REASON_LEN`] bytes).
    pub fn encode(&self) -> Result<Vec<u8>, ControlError> {
        build_frame(MsgType::QueueResetDone, CONTROL_VERSION, |out| {
            out.extend_from_slice(&self.seq.to_le_bytes());
            out.extend_from_slice(&self.queue.to_le_bytes());
            let (status, info, reason) = match &self.result {
                Ok(info) => (0u8, *info, ""),
                Err(reason) => (1u8, zero_info(), super::clip(reason, MAX_REASON_LEN)),
            };
            out.push(status);
            out.extend_from_slice(&info.encode());
            put_str(out, reason, MAX_REASON_LEN, "queue reset reason")
        })
    }

    /// Decodes one whole frame as written by [`encode`](Self::encode).
    pub fn decode(frame: &[u8]) -> Result<Self, ControlError> {
        let (_, mut body) = open_frame(frame, MsgType::QueueResetDone)?;
        let seq = body.u32("seq")?;
        let queue = body.u16("queue")?;
        let status = body.u8("status")?;
        let info = body.queue_info()?;
        let reason = body.string(MAX_REASON_LEN, "reason")?;
        body.finish()?;
        let result = match status {
            0 => Ok(info),
            1 => Err(reason),
            n => return Err(malformed(format!("queue reset answer with unknown status {n}"))),
        };
        Ok(QueueResetDone { seq, queue, result })
    }
}

impl super::Body<'_> {
    fn queue_info(&mut self) -> Result<QueueInfo, ControlError> {
        let (info, used) =
            QueueInfo::decode(self.rest).map_err(|e| malformed(format!("{} queue info: {e}", self.what)))?;
        self.take(used, "queue info")?;
        Ok(info)
    }
}

/// What [`SessionReader::read`] reached.
#[cfg(not(loom))] // the reader's users (client, server) are not built under loom
#[derive(Debug)]
pub(crate) enum ReadStep {
    /// The socket has no more bytes now; the frame (if one was begun) is incomplete.
    Pending,
    /// A whole frame, decoded (or why it is not a session frame).
    Frame(Result<SessionFrame, ControlError>),
    /// The peer closed the stream (or it failed).
    Closed,
}

/// Reads session frames from a non-blocking stream a few bytes at a time, as they arrive, so
/// that an event loop can watch many streams and a peer that sends half a frame delays nobody
/// but itself. It remembers when the frame being read began ([`SessionReader::begun`]); the
/// caller gives up on a peer whose frame does not complete in time. A body is allocated only
/// once its header parsed (at most [`MAX_BODY_LEN`](super::MAX_BODY_LEN) bytes).
#[cfg(not(loom))]
#[derive(Debug, Default)]
pub(crate) struct SessionReader {
    head: [u8; super::HEADER_LEN],
    got: usize,
    frame: Vec<u8>,
    header: Option<super::Header>,
    begun: Option<std::time::Instant>,
}

#[cfg(not(loom))]
impl SessionReader {
    /// When the first byte of the frame being read arrived (`None`: between frames).
    pub(crate) fn begun(&self) -> Option<std::time::Instant> {
        self.begun
    }

    /// Reads what the stream has, up to the end of one frame, without blocking (the stream must
    /// be non-blocking).
    pub(crate) fn read(&mut self, stream: &mut impl super::ControlIo) -> ReadStep {
        loop {
            let buf: &mut [u8] = match self.header {
                None => &mut self.head[self.got..],
                Some(_) => &mut self.frame[self.got..],
            };
            if buf.is_empty() {
                match self.header {
                    Some(h) => return ReadStep::Frame(self.finish(h)),
                    None => match super::parse_header(&self.head) {
                        Ok(h) => {
                            self.frame.clear();
                            self.frame.resize(super::HEADER_LEN + h.body_len, 0);
                            self.frame[..super::HEADER_LEN].copy_from_slice(&self.head);
                            self.header = Some(h);
                            continue;
                        }
                        Err(e) => {
                            self.reset();
                            return ReadStep::Frame(Err(e));
                        }
                    },
                }
            }
            match stream.read(buf) {
                Ok(0) => return ReadStep::Closed,
                Ok(n) => {
                    self.got += n;
                    self.begun.get_or_insert_with(std::time::Instant::now);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return ReadStep::Pending,
                Err(_) => return ReadStep::Closed,
            }
        }
    }

    fn finish(&mut self, header: super::Header) -> Result<SessionFrame, ControlError> {
        let frame = std::mem::take(&mut self.frame);
        self.reset();
        decode(header, &frame)
    }

    fn reset(&mut self) {
        self.got = 0;
        self.header = None;
        self.begun = None;
    }
}

/// A whole session frame whose header parsed, decoded.
#[cfg(not(loom))]
fn decode(header: super::Header, frame: &[u8]) -> Result<SessionFrame, ControlError> {
    if header.version != CONTROL_VERSION {
        return Err(ControlError::VersionMismatch { ours: CONTROL_VERSION, theirs: header.version });
    }
    match header.kind {
        MsgType::QueueReset => Ok(SessionFrame::QueueReset(QueueReset::decode(frame)?)),
        MsgType::QueueResetDone => Ok(SessionFrame::QueueResetDone(QueueResetDone::decode(frame)?)),
        other => Err(malformed(format!("a {} after the handshake", other.name()))),
    }
}

/// Writes one whole frame to a non-blocking stream, now: a frame the socket does not take at
/// once (the peer is not reading its side) is an [`io::ErrorKind::WouldBlock`] error, and the
/// stream is then unusable (part of the frame may be out).
///
/// [`io::ErrorKind::WouldBlock`]: std::io::ErrorKind::WouldBlock
#[cfg(not(loom))]
pub(crate) fn write_frame_now(stream: &mut impl super::ControlIo, frame: &[u8]) -> Result<(), ControlError> {
    let mut sent = 0;
    while sent < frame.len() {
        match stream.write(&frame[sent..]) {
            Ok(0) => return Err(ControlError::Closed),
            Ok(n) => sent += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(super::from_io(e)),
        }
    }
    loop {
        match stream.flush() {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(super::from_io(e)),
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn info(n: u8) -> QueueInfo {
        let mut q = QueueInfo::new([n; 16], 0x100 + u32::from(n), 0x00AB_0000 | u32::from(n));
        q.token = 0xC0DE_0000 | u32::from(n);
        q
    }

    #[test]
    fn queue_reset_round_trip_and_bytes() {
        let r = QueueReset { seq: 0x0102_0304, queue: 0x0506, info: info(7) };
        let frame = r.encode().unwrap();
        assert_eq!(&frame[..12], &[0x42, 0x59, 0x50, 0x43, 4, 0, 6, 0, 45, 0, 0, 0]);
        assert_eq!(&frame[12..18], &[0x04, 0x03, 0x02, 0x01, 0x06, 0x05]);
        assert_eq!(QueueReset::decode(&frame).unwrap(), r);
    }

    #[test]
    fn queue_reset_answer_round_trip() {
        for result in [Ok(info(3)), Err("no such queue".to_owned())] {
            let a = QueueResetDone { seq: 9, queue: 1, result };
            assert_eq!(QueueResetDone::decode(&a.encode().unwrap()).unwrap(), a);
        }
    }

    #[test]
    fn bad_session_frames_are_malformed() {
        let mut frame = QueueResetDone { seq: 1, queue: 0, result: Ok(info(1)) }.encode().unwrap();
        frame[18] = 7; // status
        assert!(matches!(QueueResetDone::decode(&frame), Err(ControlError::Malformed(_))));
        let frame = QueueReset { seq: 1, queue: 0, info: info(1) }.encode().unwrap();
        assert!(matches!(QueueReset::decode(&frame[..frame.len() - 1]), Err(ControlError::Malformed(_))));
        assert!(matches!(QueueResetDone::decode(&frame), Err(ControlError::Malformed(_))));
    }
}
