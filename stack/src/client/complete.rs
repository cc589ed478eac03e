//! Completing calls: polling the completion queues, the response, the ACK and the send
//! completion of a call (each reported to its send context, which says when the call is done),
//! delivering the outcome exactly once, timeouts, a failed queue, and closing the channel.

use super::*;
use crate::conn::bufs::{RecvBuf, TxToken};
use crate::conn::polled::Polled;
use std::mem::MaybeUninit;

impl<D: Device + Clone> ChannelInner<D> {
    /// Delivers a call's outcome (recording its end first, if recording). A completion callback
    /// that panics is contained by the sink; it is counted and reported here, and the caller goes
    /// on to release the call's context as if the callback had returned.
    /// On the control loop a callback is not run but handed on (`deferred`).
    pub(super) fn deliver(&self, p: Pending, result: Result<&[u8], RpcError>) {
        if trace::is_enabled() {
            trace_call_end(&p, result.is_ok());
        }
        let function = p.function;
        if matches!(p.sink, Sink::Callback(_)) && crate::control::reactor::on_loop() {
            let result = result.map(<[u8]>::to_vec);
            return self.deferred.push(deferred::Deferred::Call { sink: p.sink, function, result });
        }
        if p.sink.deliver(result) {
            self.callback_panicked(function);
        }
    }

    /// Runs the deliveries the control loop handed on, in order (on the calling thread, which
    /// is not the loop, except when the loop lets go of the channel after a panic of its own).
    pub(crate) fn run_deferred(&self) {
        for d in self.deferred.take() {
            match d {
                deferred::Deferred::Call { sink, function, result } => {
                    let (bytes, result) = match result {
                        Ok(bytes) => (bytes, Ok(())),
                        Err(e) => (Vec::new(), Err(e)),
                    };
                    if sink.deliver(result.map(|()| &bytes[..])) {
                        self.callback_panicked(function);
                    }
                }
                deferred::Deferred::Break(cb, reason) => run_break_callback(self.channel_id, cb, reason),
            }
        }
    }

    /// Whether the control loop has handed on deliveries that wait to be run.
    pub(crate) fn has_deferred(&self) -> bool {
        self.deferred.pending()
    }

    #[cold]
    pub(super) fn callback_panicked(&self, function: FunctionId) {
        let n = self.counters.callback_panics.fetch_add(1, Ordering::Relaxed);
        if n == 0 {
            eprintln!(
                "bypass: a completion callback of channel {} (function {function}) panicked; the panic was \
                 contained: that call is finished, its resources are released and other calls are unaffected. \
                 Further callback panics on this channel are only counted (ChannelStats::callback_panics)",
                self.channel_id
            );
        }
    }

    /// Undoes a started call whose request could not be posted: if no other path (close, queue
    /// failure) claimed it meanwhile, returns its pending call for the caller to report (else
    /// that path delivered). Its context, request id and credit are released either way — the
    /// credit only while the queue is still in the life the call was started in (a recovery
    /// refilled the credits of the new one).
    pub(super) fn unpost(&self, s: &batch::Staged, tx: TxToken) -> Option<Pending> {
        let claimed = self.ep.tx.claim_completion(s.h) == Ok(true);
        if claimed {
            drop(self.rndv_take(s.h));
        }
        let pending = if claimed { self.take_pending(s.h) } else { None };
        if s.mode != CallMode::EarlyRsp {
            self.table.cancel(s.req_id);
        }
        let _ = self.ep.discard_tx(tx);
        if self.ep.queues[s.q].epoch.load(Ordering::Acquire) == s.life {
            let _ = self.credits[s.q].give(1);
        }
        pending
    }

    /// Releases a context that was never posted, and its credit.
    pub(super) fn abandon(&self, tx: TxToken, q: usize) {
        let _ = self.ep.discard_tx(tx);
        let _ = self.credits[q].give(1);
    }

    /// Takes the call of context `h` after a successful claim, then ends the claim's hold on the
    /// context: until here the context cannot be released, so its slot (and `pending`) cannot
    /// pass to the next call while the winner is on its way to it.
    pub(super) fn take_pending(&self, h: TxHandle) -> Option<Pending> {
        self.take_pending_and(h, None)
    }

    /// [`take_pending`](Self::take_pending), ending the claim together with the winner's own
    /// `event` (one report instead of two). An `event` the context refuses (duplicate,
    /// unexpected) is left unreported and the claim ended alone.
    pub(super) fn take_pending_and(&self, h: TxHandle, event: Option<Event>) -> Option<Pending> {
        let slot = &self.slots[h.index as usize];
        slot.deadline.store(NO_DEADLINE, Ordering::Relaxed);
        let pending = lock(&slot.pending).take();
        match event.map(|ev| self.ep.tx.end_claim_and_complete(h, ev)) {
            None | Some(Err(TxError::Duplicate { .. } | TxError::Unexpected { .. })) => {
                let _ = self.ep.tx.end_claim(h);
            }
            Some(_) => {}
        }
        pending
    }

    pub(crate) fn poll(&self) -> usize {
        let n = self.poll_recv(false) + self.poll_send();
        // Timeouts are checked every 32nd poll: reading the clock on every poll costs more than
        // a poll of an empty CQ. A deadline is therefore honoured to within about 32 polls. The
        // count is a plain load and store, not a read-modify-write (a locked instruction on
        // every poll): pollers on several threads may lose each other's increments, which only
        // shifts when the next check comes; each poller's own polls still advance it.
        let polls = self.polls.load(Ordering::Relaxed);
        self.polls.store(polls.wrapping_add(1), Ordering::Relaxed);
        if polls % 32 == 0 {
            self.check_timeouts();
        }
        n
    }

    /// Polls the receive CQ if no other thread is polling it; `wait`: waits for the thread
    /// that is (see [`collect_arrived`](Self::collect_arrived)).
    pub(super) fn poll_recv(&self, wait: bool) -> usize {
        let mut wc = [MaybeUninit::uninit(); POLL_BATCH];
        let (done, polled, _in_flight) = self.ep.poll_recv_tracked(&mut wc, wait);
        let n = done.len();
        if !done.is_empty() {
            self.live.mark_heard();
        }
        for (c, buf) in done {
            self.on_recv(c, buf, polled);
        }
        n
    }

    pub(super) fn poll_send(&self) -> usize {
        self.poll_send_with(false)
    }

    /// [`poll_send`](Self::poll_send); with `wait`, a thread polling the send CQ is waited for
    /// rather than passed by: what a caller about to register a new chunk of send buffers does,
    /// so a poller preempted with the CQ's lock does not make it register one (the completions
    /// it would have reaped were already there).
    pub(super) fn poll_send_with(&self, wait: bool) -> usize {
        let mut wc = [MaybeUninit::uninit(); POLL_BATCH];
        let (done, polled) = self.ep.poll_send(&mut wc, wait);
        for c in done {
            self.ep.unsignaled_before(c, |p| self.on_send(p, polled));
            self.on_send(c, polled);
        }
        done.len()
    }

    /// A receive completion, and the buffer it hands over if it names one of ours; `polled`
    /// says when its batch was polled (a failure from a queue's earlier life fails nothing).
    pub(super) fn on_recv(&self, c: &Completion, buf: Option<RecvBuf>, polled: Polled) {
        let Some(buf) = buf else {
            if let Some(q) = crate::conn::recovery::drain_queue(c.wr_id) {
                return self.ep.mark_drained(q, true);
            }
            protocol_error(
                &self.counters,
                &format_args!("a receive completion with unknown wr_id {}", c.wr_id),
            );
            return;
        };
        let q = self.ep.queue_of_buf(buf.index());
        if !c.status.is_ok() {
            self.queue_failed(q, c.status, Some(polled));
            // Kept for the queue's recovery (or re-posted, if it was recovered meanwhile).
            return self.ep.park(buf);
        }
        let bytes = self.ep.recv_bytes(&buf, c.byte_len as usize);
        match wire::parse(bytes) {
            Ok(Parsed::Response(r)) if r.header.channel == self.channel_id => self.on_response(q, &r),
            Ok(Parsed::Ack(a)) if a.channel == self.channel_id => {
                if trace::is_enabled() {
                    let (name, arg) = if a.is_credit_grant() {
                        ("grant received", "credits")
                    } else {
                        ("ack received", "req_id")
                    };
                    trace::instant(TRACK, name, &[(arg, a.req_id.into()), ("queue", q.into())]);
                }
                if a.is_credit_grant() {
                    if self.credits[q].give(a.req_id).is_err() {
                        protocol_error(&self.counters, &"a credit grant beyond the window");
                    }
                } else {
                    self.on_ack(a.req_id);
                }
            }
            Ok(Parsed::Request(_)) => protocol_error(&self.counters, &"a request sent to a client"),
            Ok(other) => {
                protocol_error(&self.counters, &format_args!("a {:?} for another channel", other.msg_type()))
            }
            Err(e) => protocol_error(&self.counters, &e),
        }
        self.ep.repost(buf);
    }

    pub(super) fn on_response(&self, q: usize, r: &ResponseView<'_>) {
        // Every response ends the server's use of one request buffer: one credit back.
        if self.credits[q].give(1).is_err() {
            protocol_error(&self.counters, &"a response beyond the credit window");
        }
        let Some(v) = self.table.complete(r.header.req_id) else {
            // A late response may free the quarantined memory of a call that timed out.
            return self.rndv_answered(q, r.header.req_id);
        };
        let h = TxHandle::from_u64(v);
        let Ok(mode) = self.ep.tx.mode(h) else {
            self.counters.stale.fetch_add(1, Ordering::Relaxed);
            return;
        };
        // A WAIT_RSP call's winning response ends its claim and reports itself in one step.
        let merged = mode == CallMode::WaitRsp;
        let mut reported = false;
        if self.ep.tx.claim_completion(h) == Ok(true) {
            let rndv = self.rndv_take(h);
            reported = merged;
            if let Some(p) = self.take_pending_and(h, merged.then_some(Event::Rsp)) {
                if mode.requires(Event::Ack) {
                    p.sink.acked(); // the response implies the ACK, even if that is still on its way
                }
                let result = match r.header.status {
                    wire::Status::Success => match &rndv {
                        Some(x) => x.response(r.data),
                        None => Ok(r.data),
                    },
                    wire::Status::FunctionErr => Err(RpcError::FunctionNotFound(p.function)),
                    s => Err(RpcError::Status(s)),
                };
                self.deliver(p, result);
            }
            // The server is done with the call's memory: back to the pools.
            drop(rndv);
        }
        // A response implies the ACK (in ACK mode the ACK may be processed after the response by
        // another poller); a duplicate ACK report is refused by the slab and harmless.
        if mode.requires(Event::Ack) {
            let _ = self.ep.tx.complete(h, Event::Ack);
        }
        if mode.requires(Event::Rsp) && !reported {
            let _ = self.ep.tx.complete(h, Event::Rsp);
        }
    }

    pub(super) fn on_ack(&self, req_id: u32) {
        let Some(v) = self.table.peek(req_id) else { return self.count_stale() };
        let h = TxHandle::from_u64(v);
        match self.ep.tx.mode(h) {
            Ok(CallMode::Ack) => {
                if let Some(p) = lock(&self.slots[h.index as usize].pending).as_ref() {
                    if p.req_id == req_id {
                        p.sink.acked();
                    }
                }
                let _ = self.ep.tx.complete(h, Event::Ack);
            }
            Ok(CallMode::AckEarlyRsp) => {
                if self.table.complete(req_id) != Some(v) {
                    return; // counted by the table
                }
                if self.ep.tx.claim_completion(h) == Ok(true) {
                    if let Some(p) = self.take_pending(h) {
                        p.sink.acked();
                        self.deliver(p, Ok(&[]));
                    }
                }
                let _ = self.ep.tx.complete(h, Event::Ack);
            }
            Ok(_) => protocol_error(&self.counters, &"an ACK for a call that did not ask for one"),
            Err(_) => self.count_stale(),
        }
    }

    pub(super) fn count_stale(&self) {
        self.counters.stale.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn on_send(&self, c: &Completion, polled: Polled) {
        if !c.status.is_ok() {
            if let Some(q) = crate::conn::recovery::drain_queue(c.wr_id) {
                return self.ep.mark_drained(q, false);
            }
        }
        let (h, one_sided) = one_sided::split_wr_id(c.wr_id);
        if one_sided {
            // The device is done with the operation's local memory (before the context can pass
            // to another user below).
            self.release_held(h.index);
        }
        if c.status.is_ok() {
            if self.ep.tx.mode(h) == Ok(CallMode::EarlyRsp) && self.ep.tx.claim_completion(h) == Ok(true) {
                if let Some(p) = self.take_pending(h) {
                    self.deliver(p, Ok(&[]));
                }
            }
            let _ = self.ep.tx.complete(h, Event::SendCqe);
            return;
        }
        let err = if one_sided && c.status != hal::Status::Flushed {
            // The operation's own error names its cause even if the channel closed because of it.
            one_sided::error_of(c.status)
        } else if self.ep.is_closed() {
            RpcError::Closed
        } else {
            RpcError::Queue(c.status)
        };
        self.finish_claimed(h, err, None);
        let reason =
            if c.status == hal::Status::Flushed { FailReason::Flushed } else { FailReason::SendError };
        let _ = self.ep.tx.fail(h, reason);
        if let Some(q) = self.ep.queue_index(c.qpn) {
            self.queue_failed(q, c.status, Some(polled));
        }
    }

    /// If `h`'s call can be claimed (and `pred` accepts it), delivers `err` to it and frees its
    /// table slot. Returns whether it did.
    pub(super) fn finish_claimed(
        &self,
        h: TxHandle,
        err: RpcError,
        pred: Option<&dyn Fn(&Pending) -> bool>,
    ) -> bool {
        let slot = &self.slots[h.index as usize];
        if let Some(pred) = pred {
            match lock(&slot.pending).as_ref() {
                Some(p) if pred(p) => {}
                _ => return false,
            }
        }
        if self.ep.tx.claim_completion(h) != Ok(true) {
            return false;
        }
        // The server may still READ or WRITE a rendezvous call's memory: never reuse it. After
        // a deadline the queue still serves the server, so the memory stays registered
        // (quarantined) until it is done; otherwise the queue is failing and it is dropped.
        let mut rndv = self.rndv_take(h);
        if let Some(x) = rndv.as_mut() {
            x.poison();
        }
        let Some(p) = self.take_pending(h) else { return false };
        if p.mode != CallMode::EarlyRsp {
            self.table.cancel(p.req_id);
        }
        let (timed_out, req_id) = (matches!(err, RpcError::Timeout), p.req_id);
        self.deliver(p, Err(err));
        if let (Some(x), true) = (rndv, timed_out) {
            self.rndv_quarantine(x, req_id);
        }
        true
    }

    /// Fails every outstanding call `pred` accepts with the error `make` builds; returns how many.
    pub(super) fn fail_calls(
        &self,
        pred: &dyn Fn(&Pending) -> bool,
        make: &dyn Fn() -> RpcError,
        reason: FailReason,
    ) -> usize {
        let mut n = 0;
        for slot in self.slots.iter() {
            let h = TxHandle::from_u64(slot.handle.load(Ordering::Acquire));
            if h.to_u64() == u64::MAX {
                continue;
            }
            if self.finish_claimed(h, make(), Some(pred)) {
                let _ = self.ep.tx.fail(h, reason);
                n += 1;
            }
        }
        n
    }

    pub(crate) fn check_timeouts(&self) -> usize {
        let now = self.ep.device.now().as_nanos() as u64;
        self.rndv_expire(now);
        if now < self.next_scan.load(Ordering::SeqCst) {
            return 0;
        }
        self.next_scan.store(NO_DEADLINE, Ordering::SeqCst);
        let mut n = 0;
        for slot in self.slots.iter() {
            let d = slot.deadline.load(Ordering::SeqCst);
            if d == NO_DEADLINE {
                continue;
            }
            if d > now {
                self.next_scan.fetch_min(d, Ordering::SeqCst);
                continue;
            }
            let h = TxHandle::from_u64(slot.handle.load(Ordering::Acquire));
            if self.finish_claimed(h, RpcError::Timeout, Some(&|p: &Pending| p.deadline <= now)) {
                let _ = self.ep.tx.fail(h, FailReason::Timeout);
                self.counters.timeouts.fetch_add(1, Ordering::Relaxed);
                n += 1;
            } else if slot.deadline.load(Ordering::SeqCst) == d {
                // Finished meanwhile by another path that has not cleared the deadline yet, or
                // reused: look again at the next scan.
                self.next_scan.fetch_min(d.max(now + 1), Ordering::SeqCst);
            }
        }
        n
    }

    /// Queue `q` failed with `status`, seen in a completion of the batch `polled` (None: not
    /// seen in a completion). A completion from an earlier life of the queue, polled before a
    /// recovery and handled after it, is no failure of the queue's current life: ignored.
    pub(super) fn queue_failed(&self, q: usize, status: hal::Status, polled: Option<Polled>) {
        let Some(was_ready) = self.ep.fail_queue_polled(q, polled) else { return };
        // The queue answers no READ or WRITE any more: timed-out calls' memory can go.
        self.rndv_release_queue(q);
        if !was_ready {
            return;
        }
        let closed = self.ep.is_closed();
        let make = || if closed { RpcError::Closed } else { RpcError::Queue(status) };
        // One-sided operations are left to their own completions: the queue is in ERROR, so the
        // device completes each (the culprit with its error, the others flushed), which names
        // the cause rather than whichever completion happened to be polled first.
        self.fail_calls(&|p: &Pending| p.queue == q && !p.one_sided, &make, FailReason::Cancelled);
        if self.config.recovery.is_some() && !self.ep.is_closed() {
            // The control loop brings it back, aside (or closes the channel past the budget).
            return self.recovery.request(q);
        }
        if self.ep.ready_queues() == 0 {
            self.close_with(CloseReason::QueuesFailed);
        }
    }

    pub(crate) fn close(&self) {
        self.close_with(CloseReason::Local);
    }

    /// Polls until the device has nothing more to give (bounded): completions that arrived
    /// before the channel closed are handled as usual. A reply another thread (a worker, a
    /// caller's own poll) already took from the CQ is waited for until that thread has delivered
    /// it, so the close does not fail a call whose reply is in hand; the wait is bounded by
    /// [`COLLECT_LIMIT`], since that thread may be running a slow callback of an earlier call.
    /// Runs aside (on a `bypass-ctl-aside` thread), never on a thread that is itself handling
    /// receive completions: it would wait for itself until the limit.
    pub(super) fn collect_arrived(&self) {
        let limit = std::time::Instant::now() + COLLECT_LIMIT;
        let (mut idle, mut waited) = (0, false);
        while std::time::Instant::now() < limit {
            if self.poll_recv(true) + self.poll_send() > 0 {
                idle = 0;
                continue;
            }
            // The CQ was empty with its lock held: what earlier polls took is now either
            // handled or still counted in flight.
            if self.ep.recv_in_flight() {
                if !waited {
                    waited = true;
                    self.counters.close_waits.fetch_add(1, Ordering::Relaxed);
                }
                std::thread::yield_now();
                continue;
            }
            idle += 1;
            if idle == 3 {
                return;
            }
            self.ep.device.progress();
        }
    }

    /// Closes the channel for `reason` (the first close's reason stands): outstanding calls fail
    /// with `reason`'s error, then the break callback runs, once.
    pub(crate) fn close_with(&self, reason: CloseReason) {
        // Before the channel is marked closed, so that a closed channel always tells why
        // (`close_reason` reads it only once the channel is closed); the first reason stands.
        let reason = self.live.set_reason(reason);
        if !self.ep.mark_closed() {
            return;
        }
        if reason == CloseReason::PeerClosed {
            // A peer that answers and then closes: its answers reached our NIC before its close
            // reached us (the control stream closes after the queues). Deliver them first.
            self.collect_arrived();
        }
        // One-sided operations are left to their own completions (collected below: failing the
        // queues completes every work request, with its error or flushed), so an operation whose
        // error closed the channel still reports that error; flushed ones end `Closed`.
        self.fail_calls(&|p| !p.one_sided, &|| reason.call_error(), FailReason::Cancelled);
        for q in 0..self.ep.queues.len() {
            self.ep.fail_queue(q);
            self.rndv_release_queue(q);
        }
        if let Some(s) = lock(&self.control).take() {
            let _ = s.shutdown(Shutdown::Both);
        }
        // Collect the flushed send completions so every context goes back to the slab.
        for _ in 0..10_000 {
            if self.ep.tx.in_use() == 0 {
                break;
            }
            if self.poll() == 0 {
                self.ep.device.progress();
                std::thread::yield_now();
            }
        }
        // Whatever is still waiting for its own completion ends now, exactly once.
        self.fail_calls(&|_| true, &|| reason.call_error(), FailReason::Cancelled);
        self.fire_break(reason);
    }

    /// Runs the break callback (if one is set) once, contained like a completion callback.
    /// On the control loop it is handed on (`deferred`), after the calls' outcomes.
    pub(super) fn fire_break(&self, reason: CloseReason) {
        let callback = {
            let mut slot = lock(&self.on_break);
            slot.fired = Some(reason);
            slot.callback.take()
        };
        if let Some(cb) = callback {
            if crate::control::reactor::on_loop() {
                return self.deferred.push(deferred::Deferred::Break(cb, reason));
            }
            run_break_callback(self.channel_id, cb, reason);
        }
    }
}

/// Runs a break callback; a panic in it is contained (and reported on stderr).
pub(super) fn run_break_callback(
    channel_id: u32,
    cb: Box<dyn FnOnce(CloseReason) + Send>,
    reason: CloseReason,
) {
    // AssertUnwindSafe: the callback is consumed; nothing of it is used after a panic.
    if let Err(payload) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || cb(reason))) {
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(payload)));
        eprintln!("bypass: the break callback of channel {channel_id} panicked; the panic was contained");
    }
}
