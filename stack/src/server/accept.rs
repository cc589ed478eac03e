//! Accepting clients: the server's accept loop (non-blocking handshakes, a bound on those in
//! progress) and opening a connection for a client the handshake admitted.

#![forbid(unsafe_code)]

use super::*;

/// How long a server shutdown or an application's close of a connection waits, at most, for
/// the replies already posted to be acknowledged (the client's NIC has them) before the queues
/// are failed. Zero extra time when nothing is outstanding; a dead client costs at most this.
pub(super) const LINGER: Duration = Duration::from_millis(500);

/// Most handshakes in progress at once. Past it the acceptor stops accepting for a while, and
/// new connections wait in the kernel's listen backlog until a pending handshake ends (answered,
/// refused, or timed out).
pub(super) const MAX_PENDING_HANDSHAKES: usize = 1024;

/// A handshake in progress, and the connection its `decide` step opened (closed again if the
/// answer cannot be delivered).
pub(super) struct PendingHandshake<D: Device + Clone> {
    pub(super) hs: control::Handshake,
    pub(super) made: Option<Arc<Conn<D>>>,
}

/// The control-plane loop of a server: one thread runs every handshake at once over
/// non-blocking sockets, waiting in `poll(2)` on the listening socket and on each pending
/// stream, so a client that connects and sends nothing (or trickles its hello) delays nobody; it
/// is dropped when its `handshake_timeout` runs out. Opening a connection's endpoint (queues,
/// registration) runs on this thread too: it is bounded local work, not a wait on a peer.
pub(super) fn accept_loop<D: Device + Clone>(listener: TcpListener, server: Weak<ServerInner<D>>) {
    use std::os::fd::AsRawFd;
    let mut pending: Vec<PendingHandshake<D>> = Vec::new();
    let mut pfds: Vec<crate::os::pollfd> = Vec::new();
    // Out of file descriptors: the listener stays readable while accept(2) keeps failing, so it
    // is left out of the poll set until this instant instead of spinning on it.
    let mut accept_paused_until: Option<std::time::Instant> = None;
    loop {
        if accept_paused_until.is_some_and(|t| std::time::Instant::now() >= t) {
            accept_paused_until = None;
        }
        let listening = pending.len() < MAX_PENDING_HANDSHAKES && accept_paused_until.is_none();
        pfds.clear();
        pfds.push(crate::os::pollfd {
            fd: if listening { listener.as_raw_fd() } else { -1 },
            events: libc::POLLIN,
            revents: 0,
        });
        for p in &pending {
            let events = if p.hs.wants_write() { libc::POLLOUT } else { libc::POLLIN };
            pfds.push(crate::os::pollfd { fd: p.hs.fd(), events, revents: 0 });
        }
        // Until the first handshake expires (rounded up to a whole millisecond) or accepting
        // resumes, at most 1 s.
        let resume = accept_paused_until.map(|t| t.saturating_duration_since(std::time::Instant::now()));
        let wait =
            pending.iter().map(|p| p.hs.time_left()).chain(resume).min().unwrap_or(Duration::from_secs(1));
        let wait_ms = wait.as_micros().div_ceil(1000).clamp(1, 1000) as libc::c_int;
        let rc = crate::os::poll(&mut pfds, wait_ms);
        if rc < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            eprintln!(
                "bypass: the server's control loop failed in poll(2): {}",
                std::io::Error::last_os_error()
            );
            return;
        }
        let Some(inner) = server.upgrade() else { return };
        if inner.shutdown.load(Ordering::Acquire) {
            for p in pending.drain(..) {
                if let Some(c) = p.made {
                    c.close();
                }
            }
            return;
        }
        // Streams that became ready (walking backwards: `swap_remove` brings in one already seen).
        for i in (0..pending.len().min(pfds.len() - 1)).rev() {
            if rc > 0 && pfds[i + 1].revents != 0 {
                if let Some(ok) = inner.drive(&mut pending[i]) {
                    inner.finish(pending.swap_remove(i), ok);
                }
            }
        }
        // Handshakes out of time: dropping the stream closes it.
        pending.retain_mut(|p| {
            if !p.hs.time_left().is_zero() {
                return true;
            }
            bump(&inner.counters.handshake_timeouts);
            if let Some(c) = p.made.take() {
                c.close();
            }
            false
        });
        if rc > 0 && pfds[0].revents != 0 {
            while pending.len() < MAX_PENDING_HANDSHAKES {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let Ok(hs) = control::Handshake::with_tls(
                            stream,
                            inner.config.handshake_timeout,
                            inner.config.tls.as_ref(),
                        ) else {
                            continue;
                        };
                        let mut p = PendingHandshake { hs, made: None };
                        // Its hello may be there already.
                        match inner.drive(&mut p) {
                            None => pending.push(p),
                            Some(ok) => inner.finish(p, ok),
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                        // Out of descriptors: pause accepting (the kernel keeps the backlog)
                        // until handshakes end or 100 ms pass, rather than spin on poll(2).
                        bump(&inner.counters.accept_pauses);
                        accept_paused_until = Some(std::time::Instant::now() + Duration::from_millis(100));
                        break;
                    }
                    // WouldBlock: nothing more to accept now. Other errors (a connection reset
                    // while queued) concern one connection.
                    Err(_) => break,
                }
            }
        }
    }
}

impl<D: Device + Clone> ServerInner<D> {
    /// Moves one handshake on as far as its socket allows; its outcome once it is over (then
    /// hand it to [`ServerInner::finish`]).
    pub(super) fn drive(&self, p: &mut PendingHandshake<D>) -> Option<bool> {
        let made = &mut p.made;
        match p.hs.advance(&self.config.name, |hello, stream| self.decide(hello, stream, made)) {
            control::HandshakeStep::Pending => None,
            control::HandshakeStep::Done(Err(control::ControlError::Tls(e))) => {
                self.tls_refusals.record(p.hs.stream().peer_addr().ok(), e);
                Some(false)
            }
            control::HandshakeStep::Done(result) => Some(result.is_ok()),
        }
    }

    /// Ends a handshake: a connection whose answer went out is watched from now on; one whose
    /// answer could not be delivered is closed again.
    pub(super) fn finish(&self, p: PendingHandshake<D>, ok: bool) {
        let Some(conn) = p.made else { return };
        if ok && self.watch(p.hs, &conn).is_ok() {
            bump(&self.counters.connections);
        } else {
            conn.close();
        }
    }

    /// Hands the client's stream to the process's control loop, which watches it (its closure
    /// closes `conn`; it carries queue resets) and runs keepalive.
    pub(super) fn watch(&self, hs: control::Handshake, conn: &Arc<Conn<D>>) -> Result<(), RpcError> {
        let stream = hs.into_stream()?;
        let weak = Arc::downgrade(conn);
        let w = monitor::ConnWatch::new(
            stream,
            weak,
            self.config.keepalive,
            self.config.queue_config.timeout.duration().is_some(),
            conn.ep.queues.len(),
            self.config.max_queue_resets,
        )
        .map_err(control::ControlError::from)?;
        crate::control::reactor::watch(Box::new(w)).map_err(control::ControlError::from)?;
        Ok(())
    }

    /// Opens the connection a valid hello asks for and puts it in service (with the workers)
    /// before the client hears back: its first request may follow the answer at once.
    pub(super) fn decide(
        &self,
        hello: &control::ClientHello,
        stream: &TcpStream,
        made: &mut Option<Arc<Conn<D>>>,
    ) -> Result<ServerHello, String> {
        let conn = self.open(hello).map_err(|e| e.to_string())?;
        // The application's say (it may set the connection's context); a refused connection
        // was never served and gets no break callback.
        if let Err(reason) = conn.run_on_connect() {
            conn.close();
            return Err(reason);
        }
        let reply = ServerHello {
            version: CONTROL_VERSION,
            server_name: self.config.name.clone(),
            channel_id: conn.channel_id,
            credits: conn.window,
            max_msg: conn.ep.msg_size as u32,
            queues: conn.ep.infos(),
        };
        // A handle to shut the stream down when the connection closes.
        let ctl = stream.try_clone().map_err(|e| format!("cannot clone the control stream: {e}"))?;
        *lock(&conn.control) = Some(ctl);
        {
            let mut guard = lock(&self.conns);
            let conns = Arc::make_mut(&mut guard);
            conns.retain(|c| !c.ep.is_closed());
            conns.push(conn.clone());
        }
        if let Some(w) = &self.workers {
            w.add(Arc::new(ConnHandle(conn.clone())));
        }
        *made = Some(conn);
        Ok(reply)
    }
}

impl<D: Device + Clone> ServerInner<D> {
    pub(super) fn open(&self, hello: &control::ClientHello) -> Result<Arc<Conn<D>>, RpcError> {
        let n = hello.queues.len();
        if n == 0 || n > self.config.max_queues {
            return Err(RpcError::InvalidArgument(format!(
                "{n} queues asked for; this server allows 1..={}",
                self.config.max_queues
            )));
        }
        if (hello.max_msg as usize) < MIN_MSG_SIZE {
            return Err(RpcError::InvalidArgument(format!(
                "client message size {} < {MIN_MSG_SIZE}",
                hello.max_msg
            )));
        }
        let shared = self.pool.is_some();
        let room = self.admission.room(self.config.memory_limit).map_err(RpcError::InvalidArgument)?;
        let Some(window) =
            self.config.fitted_window(n, hello.window.clamp(1, self.config.max_window), shared, room)
        else {
            return Err(if room < self.config.memory_limit {
                let needs = conn_bytes(n, 1, self.config.msg_size, shared);
                RpcError::InvalidArgument(self.admission.full(self.admission.committed(), needs))
            } else {
                self.config.over_memory_limit(n, shared)
            });
        };
        let admitted = self
            .admission
            .admit(conn_bytes(n, window, self.config.msg_size, shared))
            .map_err(RpcError::InvalidArgument)?;
        let (send_depth, recv_depth, repost_batch) = server_depths(window);
        let sizes = Sizes {
            queues: n,
            send_depth,
            recv_depth,
            msg_size: self.config.msg_size,
            repost_batch,
            queue_config: self.config.queue_config,
        };
        let ep = Endpoint::with_recv(&self.device, sizes, self.pool.as_ref())?;
        ep.connect(&hello.queues)?;
        let channel_id = self.next_channel.fetch_add(1, Ordering::Relaxed) & wire::MAX_CHANNEL_ID;
        let rndv = rndv::ConnRndv::new(
            &self.device,
            self.functions.rndv_alloc.clone(),
            self.config.rndv_memory_limit,
            // The queues' initiator depth: at most the client's responder resources.
            hello.queues.iter().fold(self.config.queue_config.max_rd_atomic, |d, q| q.initiator_depth(d)),
            n,
            window,
            ep.tx.capacity(),
        );
        let live = Live::new();
        if let Some(k) = hello.keepalive {
            live.announce(k);
        }
        Ok(Arc::new_cyclic(|me| Conn {
            rndv,
            ep,
            channel_id,
            client_info: hello.client_info.clone(),
            client_msg: hello.max_msg as usize,
            functions: self.functions.clone(),
            counters: self.counters.clone(),
            grants: (0..n).map(|_| AtomicU32::new(0)).collect(),
            outbox: (0..n).map(|_| SpinLock::default()).collect(),
            control: Mutex::new(None),
            window,
            live,
            me: me.clone(),
            events: self.events.clone(),
            accepted: AtomicBool::new(false),
            list: Arc::downgrade(&self.conns),
            _admitted: admitted,
        }))
    }
}
