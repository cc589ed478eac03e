//! Blocking frame I/O on a control stream under one deadline: whole frames read and written,
//! timeouts and I/O errors mapped to [`ControlError`].

use super::*;

/// An I/O error as a control error: the peer going away is [`ControlError::Closed`], a timeout
/// is an [`io::ErrorKind::TimedOut`] error whatever the platform reports.
pub(super) fn from_io(err: io::Error) -> ControlError {
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

pub(super) fn timed_out() -> ControlError {
    ControlError::Io(io::Error::new(
        io::ErrorKind::TimedOut,
        "the control handshake did not complete within the timeout",
    ))
}

/// One timeout budget for several reads or writes.
#[derive(Debug, Clone, Copy)]
pub(super) struct Deadline {
    /// `None` when `now + timeout` does not fit an `Instant` (then each operation gets `timeout`).
    pub(super) end: Option<Instant>,
    pub(super) timeout: Duration,
}

impl Deadline {
    pub(super) fn after(timeout: Duration) -> Self {
        Deadline { end: Instant::now().checked_add(timeout), timeout }
    }

    /// Time left, or a timeout error when none is.
    pub(super) fn left(&self) -> Result<Duration, ControlError> {
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
pub(super) fn read_exact_by(
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
pub(super) fn read_frame(
    stream: &mut impl ControlIo,
    deadline: Deadline,
) -> Result<(Header, Vec<u8>), ControlError> {
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

pub(super) fn write_by(
    stream: &mut impl ControlIo,
    frame: &[u8],
    deadline: Deadline,
) -> Result<(), ControlError> {
    stream.tcp().set_write_timeout(Some(deadline.left()?))?;
    stream.write_all(frame).and_then(|()| stream.flush()).map_err(from_io)
}

/// Back to a plain blocking stream for after the handshake.
pub(super) fn finish_stream(stream: &TcpStream) -> Result<(), ControlError> {
    stream.set_read_timeout(None)?;
    stream.set_write_timeout(None)?;
    stream.set_nodelay(true)?;
    Ok(())
}

pub(super) fn check_timeout(timeout: Duration) -> Result<(), ControlError> {
    if timeout.is_zero() {
        return Err(ControlError::Io(io::Error::new(
            io::ErrorKind::InvalidInput,
            "the control handshake timeout must not be zero",
        )));
    }
    Ok(())
}
