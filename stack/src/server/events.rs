//! Connection events on the server: the new-connection and break callbacks, and the
//! [`Connection`] handle they (and [`Request::connection`](crate::Request::connection)) give.

#![forbid(unsafe_code)]

use super::Conn;
use crate::conn::liveness::CloseReason;
use crate::hal::Device;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The new-connection callback: `Ok(())` accepts, `Err(reason)` refuses.
pub type ConnectHook<D> = Arc<dyn Fn(&Connection<D>) -> Result<(), String> + Send + Sync>;

/// The break callback: the connection and why it ended.
pub type BreakHook<D> = Arc<dyn Fn(&Connection<D>, CloseReason) + Send + Sync>;

/// Callbacks a server runs on connection events ([`Server::bind_with`](crate::Server::bind_with)).
///
/// - **on_connect** runs on the server's control thread once a client's hello has passed the
///   checks (version, name) and its connection is set up, before the client hears back and
///   before any of its requests is served. It sees the client's info string
///   ([`Connection::client_info`]) and may set the connection's context. `Err(reason)` refuses
///   the client: it gets [`ControlError::Rejected`](crate::control::ControlError::Rejected) with
///   `reason` (at most 1024 bytes of it) from `Channel::connect`. A panic refuses the client too.
///   It holds up other handshakes while it runs: keep it short.
/// - **on_break** runs once for every connection that on_connect accepted, when it ends: the
///   client closed it or went away ([`CloseReason::PeerClosed`]), keepalive found it silent
///   ([`CloseReason::KeepaliveTimeout`]), its queues failed, or the server closed it
///   ([`CloseReason::Local`], e.g. [`Server::shutdown`](crate::Server::shutdown)). It runs on the
///   thread that noticed (a worker, the one shutting down, or — for a client that closed or went
///   silent — a short-lived `bypass-ctl-aside` thread, never the process's shared control loop
///   itself); a panic in it is contained.
pub struct ConnectionEvents<D: Device + Clone> {
    pub(super) on_connect: Option<ConnectHook<D>>,
    pub(super) on_break: Option<BreakHook<D>>,
}

impl<D: Device + Clone> Default for ConnectionEvents<D> {
    fn default() -> Self {
        ConnectionEvents { on_connect: None, on_break: None }
    }
}

impl<D: Device + Clone> std::fmt::Debug for ConnectionEvents<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectionEvents")
            .field("on_connect", &self.on_connect.is_some())
            .field("on_break", &self.on_break.is_some())
            .finish()
    }
}

impl<D: Device + Clone> ConnectionEvents<D> {
    /// No callbacks: every valid client is accepted.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the new-connection callback.
    pub fn on_connect(
        mut self,
        f: impl Fn(&Connection<D>) -> Result<(), String> + Send + Sync + 'static,
    ) -> Self {
        self.on_connect = Some(Arc::new(f));
        self
    }

    /// Sets the break callback.
    pub fn on_break(mut self, f: impl Fn(&Connection<D>, CloseReason) + Send + Sync + 'static) -> Self {
        self.on_break = Some(Arc::new(f));
        self
    }
}

/// One client's connection on the server, as the application sees it. Cheap to clone; holding
/// one keeps the connection's memory (not the connection) alive after it closed. An
/// application that keeps handles (e.g. in a map the callbacks share) should drop them in
/// `on_break`: a handle kept in the callbacks' own captures forever would keep the connection's
/// memory, and the callbacks, alive with it.
pub struct Connection<D: Device + Clone> {
    pub(super) conn: Arc<Conn<D>>,
}

impl<D: Device + Clone> Clone for Connection<D> {
    fn clone(&self) -> Self {
        Connection { conn: self.conn.clone() }
    }
}

impl<D: Device + Clone> std::fmt::Debug for Connection<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("channel_id", &self.conn.channel_id)
            .field("client_info", &self.conn.client_info)
            .field("closed", &self.is_closed())
            .finish()
    }
}

impl<D: Device + Clone> Connection<D> {
    /// The 24-bit channel id the server gave the connection.
    pub fn channel_id(&self) -> u32 {
        self.conn.channel_id
    }

    /// The info string the client sent in its hello.
    pub fn client_info(&self) -> &str {
        &self.conn.client_info
    }

    /// Stores the application's value for this connection (0 until set), as `OckRpcSetUpCtx`
    /// does; [`Request::context`](crate::Request::context) reads it on every request.
    pub fn set_context(&self, value: u64) {
        self.conn.live.context.store(value, Ordering::Release);
    }

    /// The value stored by [`Connection::set_context`].
    pub fn context(&self) -> u64 {
        self.conn.live.context.load(Ordering::Acquire)
    }

    /// Whether the connection is closed.
    pub fn is_closed(&self) -> bool {
        self.conn.ep.is_closed()
    }

    /// Why the connection closed (`None` while it is open).
    pub fn close_reason(&self) -> Option<CloseReason> {
        if self.is_closed() {
            self.conn.live.reason()
        } else {
            None
        }
    }

    /// Closes the connection (the client sees the server close it; the break callback runs with
    /// [`CloseReason::Local`]). Replies already posted are first given up to half a second to be
    /// acknowledged, so they reach the client; a handler may answer and then close its own
    /// connection. The call blocks for that wait: from a new-connection callback, which runs on
    /// the server's control thread, it holds up the server's other handshakes for as long.
    pub fn close(&self) {
        self.conn.close_gracefully(std::time::Instant::now() + super::LINGER);
    }

    /// Test hook: with `true`, keepalive probes on this connection are dropped unanswered, as by
    /// a frozen server (the client stops hearing from it when idle).
    #[doc(hidden)]
    pub fn ignore_probes_for_tests(&self, ignore: bool) {
        self.conn.live.ignore_probes.store(ignore, Ordering::Release);
    }

    /// Test hook: with `true`, the server side of this connection does not judge silence.
    #[doc(hidden)]
    pub fn freeze_keepalive_for_tests(&self, frozen: bool) {
        self.conn.live.frozen.store(frozen, Ordering::Release);
    }
}

fn contain<R>(what: &str, channel_id: u32, f: impl FnOnce() -> R) -> Option<R> {
    // AssertUnwindSafe: the callback gets a handle whose state is consistent whatever it did.
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => Some(r),
        Err(payload) => {
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(payload)));
            eprintln!("bypass: the {what} callback panicked (channel {channel_id}); the panic was contained");
            None
        }
    }
}

impl<D: Device + Clone> Conn<D> {
    /// Runs the new-connection callback; on success the connection counts as accepted.
    pub(super) fn run_on_connect(self: &Arc<Self>) -> Result<(), String> {
        if let Some(cb) = &self.events.on_connect {
            let handle = Connection { conn: self.clone() };
            match contain("new-connection", self.channel_id, || cb(&handle)) {
                Some(Ok(())) => {}
                Some(Err(reason)) => return Err(reason),
                None => return Err("the server's new-connection callback failed".into()),
            }
        }
        self.accepted.store(true, Ordering::Release);
        Ok(())
    }

    /// Runs the break callback once (the caller won the close).
    pub(super) fn fire_break(&self, reason: CloseReason) {
        let (Some(cb), Some(conn)) = (&self.events.on_break, self.me.upgrade()) else { return };
        let handle = Connection { conn };
        contain("break", self.channel_id, || cb(&handle, reason));
    }
}
