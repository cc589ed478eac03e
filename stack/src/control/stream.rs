//! The byte stream of a control connection: plain TCP, or TLS 1.3 over it (crate feature
//! `tls`), behind one type for the whole life of the connection — the handshake frames, then
//! the monitoring of closure (and whatever later control messages are added).
//!
//! TLS is chosen by the client ([`connect_with`] with a [`TlsConfig`]) and required by a server
//! that has one ([`Handshake::with_tls`](super::Handshake::with_tls)). The server looks at the
//! first byte a client sends: [`TLS_HANDSHAKE_BYTE`] opens a TLS ClientHello, anything else is a
//! plaintext frame (`B` of `BYPC`). A mismatch in either direction is refused with a
//! [`Reject`](super::Reject) of code [`RejectCode::Tls`](super::RejectCode::Tls) sent in
//! plaintext, so each side can say what happened ([`TlsError::ServerRequiresTls`] /
//! [`TlsError::PlaintextClient`], [`TlsError::ServerWithoutTls`] / [`TlsError::TlsClient`]).

use std::fmt;
use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use super::{
    check_timeout, finish_stream, open, say_hello, ClientHello, ControlError, Deadline, ServerHello,
};
#[cfg(feature = "tls")]
use crate::control::tls::Role;
#[cfg(feature = "tls")]
use crate::control::tls::TlsError;
use crate::control::tls::{TlsConfig, TLS_HANDSHAKE_BYTE};

/// What the control plane's reads and writes need of a stream: bytes both ways, and the TCP
/// socket under it (for timeouts and shutdown). Implemented by [`TcpStream`] and
/// [`ControlStream`].
pub trait ControlIo: Read + Write {
    /// The TCP socket the bytes travel on.
    fn tcp(&self) -> &TcpStream;
}

impl ControlIo for TcpStream {
    fn tcp(&self) -> &TcpStream {
        self
    }
}

/// A control connection's stream: plain TCP or TLS. It reads and writes like a socket (TLS
/// records are decrypted and encrypted on the way); in non-blocking mode a TLS handshake makes
/// progress inside `read`/`write`/`flush`, which return [`io::ErrorKind::WouldBlock`] when the
/// socket does.
///
/// One `ControlStream` is one TLS session: it cannot be cloned. To shut a connection down from
/// another thread, keep a [`TcpStream::try_clone`] of [`ControlIo::tcp`] and shut that down: a
/// thread blocked reading the `ControlStream` then sees the end of the stream. (A thread that
/// wants to read and write it at the same time — heartbeats — needs it behind a lock with
/// non-blocking reads, or one thread that polls its socket.)
pub enum ControlStream {
    /// Plain TCP.
    Plain(TcpStream),
    /// The client side of a TLS session.
    #[cfg(feature = "tls")]
    TlsClient(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
    /// The server side of a TLS session.
    #[cfg(feature = "tls")]
    TlsServer(Box<rustls::StreamOwned<rustls::ServerConnection, TcpStream>>),
}

impl ControlStream {
    /// Whether the bytes travel in TLS.
    pub fn is_tls(&self) -> bool {
        !matches!(self, ControlStream::Plain(_))
    }

    /// Whether TLS output is waiting for the socket (the stream should be polled for writing).
    pub fn wants_write(&self) -> bool {
        match self {
            ControlStream::Plain(_) => false,
            #[cfg(feature = "tls")]
            ControlStream::TlsClient(s) => s.conn.wants_write(),
            #[cfg(feature = "tls")]
            ControlStream::TlsServer(s) => s.conn.wants_write(),
        }
    }

    /// Decrypted bytes already waiting inside the TLS session (0 for plain TCP): a reader that
    /// polls the socket must look here first, since those bytes will not make it readable again.
    /// A session that cannot process what it holds reports 1, so that the next read surfaces the
    /// error.
    pub fn buffered(&mut self) -> usize {
        match self {
            ControlStream::Plain(_) => 0,
            #[cfg(feature = "tls")]
            ControlStream::TlsClient(s) => {
                s.conn.process_new_packets().map_or(1, |st| st.plaintext_bytes_to_read())
            }
            #[cfg(feature = "tls")]
            ControlStream::TlsServer(s) => {
                s.conn.process_new_packets().map_or(1, |st| st.plaintext_bytes_to_read())
            }
        }
    }

    /// The peer's certificate chain (DER, leaf first), once a TLS handshake has verified it;
    /// `None` for plain TCP or before then.
    pub fn peer_certificates(&self) -> Option<Vec<Vec<u8>>> {
        #[cfg(feature = "tls")]
        let der =
            |c: &[rustls::pki_types::CertificateDer<'_>]| c.iter().map(|d| d.as_ref().to_vec()).collect();
        match self {
            ControlStream::Plain(_) => None,
            #[cfg(feature = "tls")]
            ControlStream::TlsClient(s) => s.conn.peer_certificates().map(der),
            #[cfg(feature = "tls")]
            ControlStream::TlsServer(s) => s.conn.peer_certificates().map(der),
        }
    }

    /// The server side of a TLS session on `tcp`, whose handshake runs as the stream is read.
    #[cfg(feature = "tls")]
    pub(crate) fn accept_tls(tcp: TcpStream, tls: &TlsConfig) -> Result<Self, ControlError> {
        let conn = crate::control::tls::server_connection(tls)?;
        Ok(ControlStream::TlsServer(Box::new(rustls::StreamOwned::new(conn, tcp))))
    }

    /// Without TLS support no `TlsConfig` exists (its type is uninhabited).
    #[cfg(not(feature = "tls"))]
    pub(crate) fn accept_tls(_tcp: TcpStream, _tls: &TlsConfig) -> Result<Self, ControlError> {
        Err(no_tls())
    }
}

impl ControlIo for ControlStream {
    fn tcp(&self) -> &TcpStream {
        match self {
            ControlStream::Plain(s) => s,
            #[cfg(feature = "tls")]
            ControlStream::TlsClient(s) => s.get_ref(),
            #[cfg(feature = "tls")]
            ControlStream::TlsServer(s) => s.get_ref(),
        }
    }
}

impl fmt::Debug for ControlStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self {
            ControlStream::Plain(_) => "Plain",
            #[cfg(feature = "tls")]
            ControlStream::TlsClient(_) => "TlsClient",
            #[cfg(feature = "tls")]
            ControlStream::TlsServer(_) => "TlsServer",
        };
        f.debug_struct("ControlStream")
            .field("kind", &kind)
            .field("peer", &self.tcp().peer_addr().ok())
            .finish()
    }
}

impl Read for ControlStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            ControlStream::Plain(s) => s.read(buf),
            #[cfg(feature = "tls")]
            ControlStream::TlsClient(s) => {
                s.read(buf).map_err(|e| crate::control::tls::wrap_io(e, Role::Server))
            }
            #[cfg(feature = "tls")]
            ControlStream::TlsServer(s) => {
                s.read(buf).map_err(|e| crate::control::tls::wrap_io(e, Role::Client))
            }
        }
    }
}

impl Write for ControlStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            ControlStream::Plain(s) => s.write(buf),
            #[cfg(feature = "tls")]
            ControlStream::TlsClient(s) => {
                s.write(buf).map_err(|e| crate::control::tls::wrap_io(e, Role::Server))
            }
            #[cfg(feature = "tls")]
            ControlStream::TlsServer(s) => {
                s.write(buf).map_err(|e| crate::control::tls::wrap_io(e, Role::Client))
            }
        }
    }

    /// Also hands all pending TLS output to the socket ([`io::ErrorKind::WouldBlock`] if a
    /// non-blocking socket cannot take it all yet).
    fn flush(&mut self) -> io::Result<()> {
        match self {
            ControlStream::Plain(s) => s.flush(),
            #[cfg(feature = "tls")]
            ControlStream::TlsClient(s) => {
                s.flush().map_err(|e| crate::control::tls::wrap_io(e, Role::Server))
            }
            #[cfg(feature = "tls")]
            ControlStream::TlsServer(s) => {
                s.flush().map_err(|e| crate::control::tls::wrap_io(e, Role::Client))
            }
        }
    }
}

/// Client side of the handshake, in plaintext (`tls` = `None`) or TLS 1.3: like
/// [`connect_within`](super::connect_within) — `timeout` bounds the whole of it, the TCP
/// connection attempts, the TLS handshake and the hello exchange — but returns the
/// [`ControlStream`] to keep for the life of the connection.
///
/// Besides [`connect_within`](super::connect_within)'s errors: [`ControlError::Tls`] with
/// [`TlsError::ServerRequiresTls`] (plaintext to a TLS server), [`TlsError::ServerWithoutTls`]
/// (TLS to a plaintext server), [`TlsError::PeerCertificate`] (the server's certificate was
/// refused here, and why), [`TlsError::RefusedByPeer`] (the server refused ours, and why) or
/// [`TlsError::Handshake`].
pub fn connect_with(
    addr: impl ToSocketAddrs,
    hello: &ClientHello,
    timeout: Duration,
    tls: Option<&TlsConfig>,
) -> Result<(ControlStream, ServerHello), ControlError> {
    check_timeout(timeout)?;
    let frame = hello.encode()?;
    let deadline = Deadline::after(timeout);
    let tcp = open(&addr, timeout, Some(deadline))?;
    tcp.set_nodelay(true)?;
    let mut stream = match tls {
        None => ControlStream::Plain(tcp),
        Some(tls) => tls_client(tcp, tls, deadline)?,
    };
    let server = say_hello(&mut stream, hello, &frame, deadline)?;
    finish_stream(stream.tcp())?;
    Ok((stream, server))
}

#[cfg(not(feature = "tls"))]
fn tls_client(_tcp: TcpStream, _tls: &TlsConfig, _deadline: Deadline) -> Result<ControlStream, ControlError> {
    Err(no_tls())
}

/// Unreachable in practice: without the feature no `TlsConfig` can be built.
#[cfg(not(feature = "tls"))]
fn no_tls() -> ControlError {
    crate::control::tls::TlsError::Config(
        "this build of bypass has no TLS support (crate feature `tls`)".into(),
    )
    .into()
}

/// The client's TLS handshake, blocking, within `deadline`. The first bytes the server sends
/// are kept: a plaintext server answers a ClientHello with a `BYPC` reject frame, which tells
/// "the server does not use TLS" apart from a TLS failure.
#[cfg(feature = "tls")]
fn tls_client(tcp: TcpStream, tls: &TlsConfig, deadline: Deadline) -> Result<ControlStream, ControlError> {
    let mut conn = crate::control::tls::client_connection(tls, tcp.peer_addr()?)?;
    let mut io = Recorder { sock: &tcp, first: Vec::new() };
    while conn.is_handshaking() {
        let left = deadline.left()?;
        tcp.set_read_timeout(Some(left))?;
        tcp.set_write_timeout(Some(left))?;
        if let Err(e) = conn.complete_io(&mut io) {
            if io.first.starts_with(&super::MAGIC) {
                return Err(TlsError::ServerWithoutTls.into());
            }
            // rustls sent its alert; read what the server sent meanwhile, so that closing sends
            // a FIN after the alert rather than a reset that may overtake it.
            if tcp.set_nonblocking(true).is_ok() {
                drain(&tcp);
            }
            return Err(super::from_io(crate::control::tls::wrap_io(e, Role::Server)));
        }
    }
    Ok(ControlStream::TlsClient(Box::new(rustls::StreamOwned::new(conn, tcp))))
}

/// The socket, keeping a copy of the first bytes read from it.
#[cfg(feature = "tls")]
struct Recorder<'a> {
    sock: &'a TcpStream,
    first: Vec<u8>,
}

#[cfg(feature = "tls")]
impl Read for Recorder<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.sock.read(buf)?;
        let keep = n.min(super::HEADER_LEN.saturating_sub(self.first.len()));
        self.first.extend_from_slice(&buf[..keep]);
        Ok(n)
    }
}

#[cfg(feature = "tls")]
impl Write for Recorder<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.sock.write(buf)
    }

    /// rustls writes its queued records in one vectored write (and its last write after an
    /// error, the alert, is one call): the default would write only the first buffer.
    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        self.sock.write_vectored(bufs)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.sock.flush()
    }
}

/// The error of a client that closed before its hello was in: [`ControlError::Closed`], or,
/// during a TLS handshake, a TLS failure (a client that refused our certificate may close
/// without its alert reaching us).
pub(super) fn closed_early(stream: &ControlStream) -> ControlError {
    match stream {
        #[cfg(feature = "tls")]
        ControlStream::TlsServer(s) if s.conn.is_handshaking() => TlsError::Handshake {
            peer: Role::Client,
            detail: "the client closed the connection during the TLS handshake (it may have refused this \
                     server's certificate)"
                .into(),
        }
        .into(),
        _ => ControlError::Closed,
    }
}

/// Whether the first byte of a client's stream opens a TLS handshake.
pub(super) fn opens_tls(first: u8) -> bool {
    first == TLS_HANDSHAKE_BYTE
}

/// Reads and discards what a non-blocking stream has (at most 64 KiB), so closing it right
/// after an answer sends a FIN rather than a reset that could overtake the answer.
pub(super) fn drain(mut tcp: &TcpStream) {
    let mut scratch = [0u8; 4096];
    for _ in 0..16 {
        match tcp.read(&mut scratch) {
            Ok(n) if n > 0 => {}
            _ => return,
        }
    }
}
