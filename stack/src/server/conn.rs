//! One client's connection on the server: its endpoint, the dispatch of received requests to
//! the handlers, the outbox that batches a worker pass's sends into one doorbell per queue, send
//! completions, credit grants, and closing.

use super::*;
use crate::conn::bufs::{RecvBuf, SendList, TxToken, Unposted};
use crate::conn::polled::Polled;
use std::mem::MaybeUninit;

thread_local! {
    /// The connection this thread's worker is dispatching (its address), 0 if none. While it is
    /// set, that connection's ACKs, responses and credit grants are collected and posted at the
    /// end of the worker's pass, one doorbell per queue instead of one per message.
    static IN_DISPATCH: Cell<usize> = const { Cell::new(0) };
}

/// Sends collected during a worker pass.
pub(super) type Outbox = SendList;

/// One client's connection on the server.
pub(crate) struct Conn<D: Device + Clone> {
    pub(super) ep: Endpoint<D>,
    pub(super) channel_id: u32,
    pub(super) client_info: String,
    pub(super) client_msg: usize,
    pub(super) functions: Arc<Functions<D>>,
    pub(super) counters: Arc<Counters>,
    pub(super) grants: Box<[AtomicU32]>,
    pub(super) outbox: Box<[SpinLock<Outbox>]>,
    pub(super) window: u32,
    pub(super) control: Mutex<Option<TcpStream>>,
    /// Keepalive state, close reason and the application's context.
    pub(super) live: Live,
    /// This connection (for the connection events, which get a [`Connection`]).
    pub(super) me: Weak<Conn<D>>,
    pub(super) events: Arc<ConnectionEvents<D>>,
    /// The new-connection callback accepted it (so the break callback runs when it closes).
    pub(super) accepted: AtomicBool,
    pub(super) rndv: rndv::ConnRndv<D>,
    /// The server's list of open connections, which this one leaves when it closes.
    pub(super) list: Weak<ConnList<D>>,
    /// Its count against the server-wide limits, given back when it is dropped.
    pub(super) _admitted: Admitted,
}

impl<D: Device + Clone> Conn<D> {
    /// Re-posts receive buffer `buf` (of a request that came on queue `q`); with `grant`, its
    /// credit goes back in a credit grant.
    pub(super) fn release(&self, q: usize, buf: RecvBuf, grant: bool) {
        self.ep.repost(buf);
        if grant {
            self.grants[q].fetch_add(1, Ordering::AcqRel);
            if !self.dispatching() {
                self.flush_grants(q);
            }
        }
    }

    pub(super) fn flush_grants(&self, q: usize) {
        // Every worker pass flushes, and most have nothing to grant: a load says so without a
        // locked swap. A grant added after this load is flushed by its adder or the next pass.
        if self.grants[q].load(Ordering::Acquire) == 0 {
            return;
        }
        let n = self.grants[q].swap(0, Ordering::AcqRel);
        if n == 0 {
            return;
        }
        if trace::is_enabled() {
            trace(
                "grant",
                &[("credits", n.into()), ("queue", q.into()), ("now", (!self.dispatching()).into())],
            );
        }
        if self.send_small(q, |out| AckHeader::credit_grant(n, self.channel_id).encode(out)).is_ok() {
            bump(&self.counters.grants);
        } else if !self.ep.is_closed() {
            self.grants[q].fetch_add(n, Ordering::AcqRel);
        }
    }

    /// Sends a message built by `encode` on queue `q`.
    pub(super) fn send_small(
        &self,
        q: usize,
        encode: impl FnOnce(&mut [u8]) -> Result<usize, wire::WireError>,
    ) -> Result<(), RpcError> {
        let mut tx = self.acquire_tx()?;
        let len = match encode(self.ep.send_buf(&mut tx)) {
            Ok(len) => len,
            Err(e) => {
                self.drop_tx(tx);
                return Err(RpcError::InvalidArgument(e.to_string()));
            }
        };
        self.send(q, tx, len)
    }

    pub(super) fn dispatching(&self) -> bool {
        IN_DISPATCH.with(Cell::get) == self as *const Self as usize
    }

    /// Posts `tx` (its first `len` bytes) on queue `q`: at once, or at the end of the worker's
    /// pass if this thread is dispatching this connection. On error the context is released.
    pub(super) fn send(&self, q: usize, tx: TxToken, len: usize) -> Result<(), RpcError> {
        if self.ep.is_closed() {
            // Marked closed (`Server::connections` no longer counts it) but its queues may not
            // be failed yet: a post would still be taken, and the reply would report a success
            // nobody will receive.
            self.drop_tx(tx);
            return Err(RpcError::Closed);
        }
        if !self.dispatching() {
            // What the worker collected for this queue (an ACK of this very request, perhaps)
            // goes first.
            self.flush_outbox(q);
            return self.ep.post_send(q, tx, len).map_err(|Unposted { tx, error }| {
                self.drop_tx(tx);
                error
            });
        }
        let full = {
            let mut out = lock(&self.outbox[q]);
            out.push(tx, len as u32);
            out.is_full()
        };
        if full {
            self.flush_outbox(q);
        }
        Ok(())
    }

    pub(super) fn flush_outbox(&self, q: usize) {
        // Copies the list (264 bytes) out only when there is more than one send: most worker
        // passes leave nothing (the reply was posted directly) or a single reply.
        let mut out = lock(&self.outbox[q]);
        if out.len() <= 1 {
            let Some((tx, len)) = out.pop() else { return };
            drop(out);
            if let Err(Unposted { tx, .. }) = self.ep.post_send(q, tx, len as usize) {
                self.unposted(tx);
            }
            return;
        }
        let mut list = std::mem::take(&mut *out);
        drop(out);
        if self.ep.post_sends(q, &mut list).is_err() {
            for (tx, _) in list.drain() {
                self.unposted(tx);
            }
        }
    }

    /// A send of a flush that was not posted: its context goes back (nothing of it reached the
    /// device), counted as a failed reply.
    fn unposted(&self, tx: TxToken) {
        self.drop_tx(tx);
        bump(&self.counters.failed_replies);
    }

    /// A send context; if all are in flight, collects send completions until one comes back.
    ///
    /// If the device refuses to register a new chunk of send buffers, the connection makes do
    /// with the contexts it has: this waits for one of them like it waits when every context is
    /// in flight, rather than fail a reply (whose client would then wait out its deadline for a
    /// response that never comes). Either way, what this thread's worker pass collected for the
    /// connection is posted first: those contexts come back only once posted.
    pub(super) fn acquire_tx(&self) -> Result<TxToken, RpcError> {
        let mut spins = 0u32;
        let mut refused = false;
        loop {
            // Reap before a new chunk of send buffers is registered on the reply path.
            if self.ep.tx_would_grow() && self.poll_send_with(true) > 0 {
                continue;
            }
            let got = if refused {
                self.ep.get_registered_tx(CallMode::EarlyRsp, 0)
            } else {
                match self.ep.get_tx(CallMode::EarlyRsp, 0) {
                    Ok(got) => got,
                    Err(e) => {
                        refused = true;
                        self.registration_refused(&e);
                        None
                    }
                }
            };
            if let Some(tx) = got {
                return Ok(tx);
            }
            if self.ep.is_closed() {
                return Err(RpcError::Closed);
            }
            if self.dispatching() {
                for q in 0..self.outbox.len() {
                    self.flush_outbox(q);
                }
            }
            if self.poll_send() == 0 {
                spins += 1;
                if spins % 64 == 0 {
                    self.ep.device.progress();
                    std::thread::yield_now();
                }
            }
        }
    }

    /// The device refused to register a chunk of send buffers (the reply waits for a context
    /// of the registered ones instead): counted, and said the first times.
    fn registration_refused(&self, e: &RpcError) {
        let n = self.counters.send_registrations_refused.fetch_add(1, Ordering::Relaxed);
        if n < 4 || n.is_power_of_two() {
            eprintln!(
                "bypass: channel {}: could not register more send buffers ({e}); replies wait for \
                 the {} registered send contexts; {} refusals so far",
                self.channel_id,
                self.ep.send_ready(),
                n + 1
            );
        }
    }

    /// Releases a context that was never posted.
    pub(super) fn drop_tx(&self, tx: TxToken) {
        let _ = self.ep.discard_tx(tx);
    }

    pub(super) fn poll_send(&self) -> usize {
        self.poll_send_with(false)
    }

    /// [`poll_send`](Self::poll_send); with `wait`, a thread polling the send CQ is waited for
    /// rather than passed by (before a new chunk of send buffers would be registered).
    pub(super) fn poll_send_with(&self, wait: bool) -> usize {
        let mut wc = [MaybeUninit::uninit(); POLL_BATCH];
        let (done, polled) = self.ep.poll_send(&mut wc, wait);
        for c in done {
            self.ep.unsignaled_before(c, |p| {
                let _ = self.ep.tx.complete(TxHandle::from_u64(p.wr_id), Event::SendCqe);
            });
            let tx = TxHandle::from_u64(c.wr_id & !rndv::RNDV_TAG);
            if c.wr_id & rndv::RNDV_TAG != 0 {
                self.rndv_completed(tx.index, c.status);
            }
            if c.status.is_ok() {
                let _ = self.ep.tx.complete(tx, Event::SendCqe);
            } else if let Some(q) = crate::conn::recovery::drain_queue(c.wr_id) {
                self.ep.mark_drained(q, false);
            } else {
                let reason = if c.status == hal::Status::Flushed {
                    FailReason::Flushed
                } else {
                    FailReason::SendError
                };
                let _ = self.ep.tx.fail(tx, reason);
                if let Some(q) = self.ep.queue_index(c.qpn) {
                    self.queue_failed(q, Some(polled));
                }
            }
        }
        let n = done.len();
        self.rndv_poll();
        n
    }

    pub(super) fn protocol_error(&self, what: &dyn std::fmt::Display) {
        let n = self.counters.protocol_errors.fetch_add(1, Ordering::Relaxed);
        if n < 16 || n.is_power_of_two() {
            eprintln!(
                "bypass: dropped a malformed message on channel {} ({what}); {} so far",
                self.channel_id,
                n + 1
            );
        }
    }

    pub(super) fn poll(self: &Arc<Self>) -> usize {
        let mut wc = [MaybeUninit::uninit(); POLL_BATCH];
        let (done, polled) = self.ep.poll_recv(&mut wc);
        let n = done.len();
        if n > 0 {
            self.live.mark_heard();
            let outer = IN_DISPATCH.with(|d| d.replace(Arc::as_ptr(self) as usize));
            for (c, buf) in done {
                self.on_recv(c, buf, polled);
            }
            for q in 0..self.grants.len() {
                self.flush_grants(q);
                self.flush_outbox(q);
            }
            IN_DISPATCH.with(|d| d.set(outer));
        }
        if n == 1 && self.reap_later() {
            return n;
        }
        n + self.poll_send()
    }

    /// Whether a pass that handled one request may leave the send CQ for a later pass: its
    /// completions only free reply contexts (no call waits for them on the server), so they are
    /// reaped in bulk — on the next pass that receives nothing or several requests, or once half
    /// the registered contexts are in flight — instead of one CQ poll per request. A pass with
    /// several requests reaps as before: its poll is shared by them, and reaping at once keeps
    /// few contexts (and send buffers) cycling, which measured faster for pipelined calls. Not while a rendezvous is in progress (its
    /// READs and WRITEs complete there) or the connection is closed (the flush is collected).
    fn reap_later(&self) -> bool {
        self.ep.tx_mostly_free() && self.rndv.is_quiet() && !self.ep.is_closed()
    }

    /// A receive completion, and the buffer it hands over if it names one of ours; `polled`
    /// says when its batch was polled (a failure from a queue's earlier life fails nothing).
    pub(super) fn on_recv(self: &Arc<Self>, c: &Completion, buf: Option<RecvBuf>, polled: Polled) {
        let Some(buf) = buf else {
            if let Some(q) = crate::conn::recovery::drain_queue(c.wr_id) {
                return self.ep.mark_drained(q, true);
            }
            return self.protocol_error(&format_args!("a receive completion with unknown wr_id {}", c.wr_id));
        };
        let Some(queue) = self.ep.recv_queue(c) else {
            // A qpn of none of our queues (shared path): the buffer is ours all the same.
            self.protocol_error(&format_args!("a receive completion from unknown queue {}", c.qpn));
            return self.ep.repost(buf);
        };
        if !c.status.is_ok() {
            self.queue_failed(queue, Some(polled));
            // Kept for the queue's recovery (or re-posted, if it was recovered meanwhile).
            return self.ep.park(buf);
        }
        let bytes = self.ep.recv_bytes(&buf, c.byte_len as usize);
        let view = match wire::parse(bytes) {
            Ok(Parsed::Request(v)) if v.header.channel == self.channel_id => v,
            Ok(Parsed::Request(v)) => {
                self.protocol_error(&format_args!("a request for channel {}", v.header.channel));
                return self.release(queue, buf, true);
            }
            Ok(other) => {
                self.protocol_error(&format_args!("a {:?} sent to a server", other.msg_type()));
                return self.release(queue, buf, true);
            }
            Err(e) => {
                self.protocol_error(&e);
                return self.release(queue, buf, true);
            }
        };
        let header = view.header;
        // Keepalive probes are the stack's own traffic: not counted as requests (nor their
        // answers as responses), so the counters do not depend on how long a test or an idle
        // spell lasted.
        let probe = liveness::is_probe(header.function);
        if !probe {
            bump(&self.counters.requests);
        }
        let traced_at = trace::stamp();
        if header.ack_requested {
            if traced_at != 0 {
                trace("ack", &[("req_id", header.req_id.into()), ("queue", queue.into())]);
            }
            let ack = AckHeader::new(header.req_id, self.channel_id);
            if self.send_small(queue, |out| ack.encode(out)).is_ok() {
                bump(&self.counters.acks);
            }
        }
        let args = ((bytes.len() - view.args.len()) as u32, view.args.len() as u32);
        // Copied out before the request takes the buffer (rendezvous only, which keeps them).
        let descs = (header.arg_dma_count > 0).then(|| view.descriptors.iter().collect::<rndv::DescList>());
        let epoch = self.ep.queues[queue].epoch.load(Ordering::Acquire);
        let request = Request {
            conn: self.clone(),
            buf: Some(buf),
            queue,
            epoch,
            args,
            header,
            done: false,
            rndv: None,
        };
        if probe {
            return self.on_probe(request);
        }
        if let Some(descs) = descs {
            // Rendezvous: the handler runs once the arguments are pulled (`rndv.rs`).
            return self.rndv_start(request, descs);
        }
        self.dispatch(request);
        if traced_at != 0 && trace::is_enabled() {
            let args = [
                ("function", header.function.raw().into()),
                ("req_id", header.req_id.into()),
                ("channel", self.channel_id.into()),
                ("queue", queue.into()),
            ];
            trace::span(TRACK, "request", traced_at, &args);
        }
    }

    /// Runs the handler of `request` (or answers FUNCTION_ERR).
    pub(super) fn dispatch(self: &Arc<Self>, request: Request<D>) {
        let header = request.header;
        match self.functions.get(header.function) {
            Some(handler) => {
                // A panicking handler must not take the worker (and every connection on it)
                // down. AssertUnwindSafe: the request is the only state the handler gets from
                // us, and it is consistent whatever the handler did with it — still held (its
                // drop during the unwind answers SERVER_DECLINE), replied to, or moved away.
                // No cost unless it panics.
                if let Err(payload) =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| handler(request)))
                {
                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(payload)));
                    self.handler_panicked(&header);
                }
            }
            None => {
                bump(&self.counters.unknown_functions);
                let _ = request.reply_status(Status::FunctionErr, &[]);
            }
        }
    }

    #[cold]
    pub(super) fn handler_panicked(&self, header: &RequestHeader) {
        let n = self.counters.handler_panics.fetch_add(1, Ordering::Relaxed);
        if n < 16 || n.is_power_of_two() {
            eprintln!(
                "bypass: the handler of function {} panicked (request {} on channel {}); contained: a request \
                 it still held was answered SERVER_DECLINE and the worker goes on; {} so far",
                header.function,
                header.req_id,
                self.channel_id,
                n + 1
            );
        }
    }

    /// A keepalive probe: the stack answers it (its arguments announce the client's settings).
    #[cold]
    pub(super) fn on_probe(&self, request: Request<D>) {
        self.live.on_probe(request.args());
        if self.live.ignore_probes.load(Ordering::Relaxed) {
            return drop(request); // test hook: a peer that stops answering
        }
        let _ = request.reply(&[]);
    }

    /// A queue failed, seen in a completion of the batch `polled`. The connection stays open
    /// even with no queue left: the client recovers its queues (a queue reset on the control
    /// stream) or closes the connection. A completion from an earlier life of the queue (polled
    /// before the client had it recovered, handled after) is ignored: it fails nothing.
    pub(super) fn queue_failed(&self, q: usize, polled: Option<Polled>) {
        let _ = self.ep.fail_queue_polled(q, polled);
    }

    pub(super) fn close(&self) {
        self.close_with(CloseReason::Local);
    }

    /// A close the application asked for (server shutdown, [`Connection::close`]): replies
    /// already posted are given until `deadline` to be acknowledged by the client before the
    /// queues are failed, so a handler that answers and then shuts the server down is heard.
    /// (Failing a queue discards what it has not sent, as destroying a QP does.)
    /// [`ServerStats::lingers`] and [`ServerStats::linger_timeouts`] count them.
    ///
    /// Replies a handler on this thread has produced but the pass has not posted yet (the
    /// outbox: a handler that answers and then closes its own connection) are posted first.
    /// The wait polls send completions only: it runs no handler for requests that arrive
    /// meanwhile, so a busy connection's close is not held up by its own traffic.
    pub(super) fn close_gracefully(self: &Arc<Self>, deadline: Instant) {
        if !self.ep.is_closed() {
            for q in 0..self.grants.len() {
                self.flush_grants(q);
                self.flush_outbox(q);
            }
        }
        let waiting = || self.ep.tx.in_use() > 0 && !self.ep.is_closed();
        if waiting() {
            bump(&self.counters.lingers);
            while waiting() && Instant::now() < deadline {
                if self.poll_send() == 0 {
                    self.ep.device.progress();
                    std::thread::yield_now();
                }
            }
            if waiting() {
                bump(&self.counters.linger_timeouts);
            }
        }
        self.close();
    }

    /// Closes the connection for `reason` (the first close's reason stands); the break callback
    /// runs once, for a connection the new-connection callback accepted.
    pub(super) fn close_with(&self, reason: CloseReason) {
        // Before the connection is marked closed, so that a closed connection always tells why
        // (`close_reason` reads it only once it is closed); the first reason stands.
        let reason = self.live.set_reason(reason);
        if !self.ep.mark_closed() {
            return;
        }
        for q in 0..self.ep.queues.len() {
            self.ep.fail_queue(q);
        }
        // Shared path: requests still in the receive CQ give their buffers back to the pool now
        // (the rest, if another thread is polling, when the endpoint is dropped).
        self.ep.reclaim_shared();
        if let Some(s) = lock(&self.control).take() {
            let _ = s.shutdown(Shutdown::Both);
        }
        self.leave_list();
        self.rndv_close();
        if self.accepted.load(Ordering::Acquire) {
            self.fire_break(reason);
        }
    }
}

impl<D: Device + Clone> Conn<D> {
    /// Takes the closed connections (this one and any other) out of the server's list, so that
    /// they are dropped, and their memory given back, once their worker and handlers let go of
    /// them (a closed connection left in the list held all its memory until the next client
    /// connected). Those the list held last are dropped here, after the list's lock is released.
    fn leave_list(&self) {
        let Some(list) = self.list.upgrade() else { return };
        let gone: Vec<Arc<Conn<D>>> = {
            let mut guard = lock(&list);
            if !guard.iter().any(|c| c.ep.is_closed()) {
                return;
            }
            let (closed, open): (Vec<_>, Vec<_>) = guard.iter().cloned().partition(|c| c.ep.is_closed());
            *guard = Arc::new(open);
            closed
        };
        drop(gone);
    }
}

/// `Pollable` for a connection (a worker holds `Arc<ConnHandle>`).
pub(super) struct ConnHandle<D: Device + Clone>(pub(super) Arc<Conn<D>>);

impl<D: Device + Clone> Pollable for ConnHandle<D> {
    fn poll(&self) -> usize {
        self.0.poll()
    }

    fn progress(&self) {
        self.0.ep.device.progress();
    }

    fn is_closed(&self) -> bool {
        self.0.ep.is_closed()
    }

    fn arm(&self) -> bool {
        let send = lock(&self.0.ep.send_cq).arm(hal::ArmMode::Any).is_ok();
        let recv = lock(&self.0.ep.recv_cq).arm(hal::ArmMode::Any).is_ok();
        send && recv
    }

    fn event_fds(&self, out: &mut Vec<RawFd>) {
        out.push(lock(&self.0.ep.send_cq).event_fd());
        out.push(lock(&self.0.ep.recv_cq).event_fd());
    }

    fn ack_events(&self) {
        let _ = lock(&self.0.ep.send_cq).ack_events();
        let _ = lock(&self.0.ep.recv_cq).ack_events();
    }
}
