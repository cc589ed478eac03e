//! The handshake itself: the client's blocking [`connect`], the server's blocking [`accept`] and
//! non-blocking [`Handshake`] (driven by the accept loop), and [`wait_closed`].

use super::*;

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
pub(super) fn exchange(
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
pub(super) fn say_hello(
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
pub(super) fn open(
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
pub(super) fn describe_addrs(addrs: &[SocketAddr]) -> String {
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
pub(super) fn rejected(hello: &ClientHello, reject: &Reject) -> ControlError {
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
pub(super) fn reject_frame(our_name: &str, code: RejectCode, reason: &str) -> Vec<u8> {
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
pub(super) fn respond(
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

pub(super) enum HsState {
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
    pub(super) stream: ControlStream,
    pub(super) timeout: Duration,
    pub(super) deadline: Deadline,
    pub(super) state: HsState,
    /// What the server requires: `Some` TLS (until the client's first byte decides), `None`
    /// plaintext.
    pub(super) tls: Option<TlsConfig>,
    /// Whether the client's first byte is still to be looked at.
    pub(super) detect: bool,
    /// The server requires TLS and the client sent plaintext: read its frame, then refuse.
    pub(super) refuse_plain: bool,
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
    pub(super) fn detect(&mut self, our_name: &str) -> Option<HandshakeStep> {
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
    pub(super) fn finish_write(&mut self, written: Result<(), ControlError>) -> HandshakeStep {
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
