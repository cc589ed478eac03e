//! Starting a call: picking a queue, taking a credit and a send context (waiting or refusing
//! to block), writing the request into the context's buffer and posting it, then arming the
//! call's deadline.

use super::*;
use crate::conn::bufs::{TxToken, Unposted};

impl<D: Device + Clone> ChannelInner<D> {
    pub(super) fn pick_queue(&self, named: Option<usize>) -> Result<usize, RpcError> {
        let n = self.ep.queues.len();
        if let Some(q) = named {
            if q >= n {
                return Err(RpcError::InvalidArgument(format!("queue {q} of {n}")));
            }
            if !self.ep.queues[q].ready.load(Ordering::Acquire) {
                return Err(RpcError::Queue(hal::Status::Flushed));
            }
            return Ok(q);
        }
        let start = if n == 1 { 0 } else { self.rr.fetch_add(1, Ordering::Relaxed) };
        (0..n).map(|k| (start + k) % n).find(|&q| self.ep.queues[q].ready.load(Ordering::Acquire)).ok_or_else(
            // None READY on an open channel: its queues are being recovered.
            || if self.ep.is_closed() { RpcError::Closed } else { RpcError::Queue(hal::Status::Flushed) },
        )
    }

    pub(super) fn deadline_of(&self, opts: &CallOptions) -> u64 {
        self.deadline_from(opts, || self.ep.device.now())
    }

    /// The deadline of a call with `opts` started at the clock reading `now` gives (read only if
    /// the call has a timeout).
    pub(super) fn deadline_from(&self, opts: &CallOptions, now: impl FnOnce() -> Duration) -> u64 {
        match opts.timeout.or(self.config.timeout) {
            // Saturates: a timeout too large to add to the clock (`Duration::MAX`) is a deadline
            // that never comes, not an overflow.
            Some(t) => now()
                .checked_add(t)
                .map_or(NO_DEADLINE - 1, |d| d.as_nanos().min(u128::from(NO_DEADLINE - 1)) as u64),
            None => NO_DEADLINE,
        }
    }

    pub(super) fn take_credit(&self, q: usize, opts: &CallOptions, deadline: u64) -> Result<(), RpcError> {
        let mut spins = 0u32;
        loop {
            if self.credits[q].try_take(1).is_ok() {
                return Ok(());
            }
            if !opts.wait_for_credit {
                return Err(RpcError::WouldBlock(
                    "no credit: every receive buffer the server posted for this queue is in use",
                ));
            }
            if !self.ep.queues[q].ready.load(Ordering::Acquire) {
                return Err(RpcError::Queue(hal::Status::Flushed));
            }
            if self.config.self_poll && self.poll() > 0 {
                continue;
            }
            self.idle_turn(&mut spins, deadline)?;
        }
    }

    /// Fails a blocking operation (`what`) on a device that only a test's stepping moves: the
    /// wait would never end (see [`Channel::call_with`]).
    pub(crate) fn refuse_to_block(&self, what: &str) -> Result<(), RpcError> {
        if !self.ep.device.externally_stepped() {
            return Ok(());
        }
        Err(RpcError::InvalidArgument(format!(
            "{what} would block forever: the device moves only when a test steps it (the simulator's \
             Stepped engine), and its virtual clock, which deadlines are measured on, stands still while \
             this thread waits; use Channel::call_future or a callback (Channel::call_callback, \
             read_future/write_future for one-sided operations), CallOptions::wait_for_credit = false, \
             and drive the fabric (Fabric::step, run_until_idle, advance) until the call is done"
        )))
    }

    /// One empty turn of a wait loop: fails if the channel closed, or (checked every 64th turn,
    /// together with the device's `progress` and a yield) if the deadline passed. On a device that
    /// only a test's stepping moves, fails at once (the wait would never end).
    pub(super) fn idle_turn(&self, spins: &mut u32, deadline: u64) -> Result<(), RpcError> {
        if self.ep.is_closed() {
            return Err(RpcError::Closed);
        }
        self.refuse_to_block("waiting for a credit or a send context")?;
        *spins += 1;
        if *spins % 64 == 0 {
            self.ep.device.progress();
            if deadline != NO_DEADLINE && self.ep.device.now().as_nanos() as u64 >= deadline {
                return Err(RpcError::Timeout);
            }
            std::thread::yield_now();
        }
        Ok(())
    }

    /// A send context. Contexts often wait only for send completions that are already in the
    /// send CQ (a response can overtake its request's send completion), so an empty slab, or
    /// one whose registered contexts are all in use ([`Endpoint::tx_would_grow`]), first reaps
    /// them; with `wait_for_credit` it keeps reaping until one is free or the deadline.
    pub(super) fn take_tx(&self, opts: &CallOptions, deadline: u64) -> Result<TxToken, RpcError> {
        let mut spins = 0u32;
        loop {
            // Reap before a new chunk of send buffers is registered on the call path.
            if self.ep.tx_would_grow() && self.poll_send_with(true) > 0 {
                continue;
            }
            if let Some(tx) = self.ep.get_tx(opts.mode, 0)? {
                return Ok(tx);
            }
            if self.poll_send() > 0 {
                continue;
            }
            if !opts.wait_for_credit {
                return Err(RpcError::WouldBlock("every send context is in use"));
            }
            self.idle_turn(&mut spins, deadline)?;
        }
    }

    pub(super) fn start(
        &self,
        opts: &CallOptions,
        function: FunctionId,
        args: &[u8],
        sink: Sink,
    ) -> Result<(), RpcError> {
        self.start_args(opts, function, rndv::Args::Bytes(args), sink, None, None)
    }

    /// Starts a call. `blocking` names a blocking API (refused on an externally stepped device).
    /// With `staging` (a [`CallBatch`]) its request is staged there instead of
    /// posted; the batch posts it with the others. A call that would have to wait for a credit
    /// or a send context first posts what is staged (their responses are what frees them).
    pub(super) fn start_args(
        &self,
        opts: &CallOptions,
        function: FunctionId,
        args: rndv::Args<'_, '_, D::Region>,
        sink: Sink,
        blocking: Option<&'static str>,
        mut staging: Option<&mut batch::Staging>,
    ) -> Result<(), RpcError> {
        if self.ep.is_closed() {
            return Err(RpcError::Closed);
        }
        let plan = self.rndv_wanted(opts, &args)?;
        let inline: &[u8] = match args {
            rndv::Args::Bytes(b) if !plan.args => b,
            _ => &[],
        };
        let len = RequestHeader::LEN + inline.len();
        if len > self.max_request {
            return Err(RpcError::TooLarge { len, max: self.max_request, header: RequestHeader::LEN });
        }
        // A batch's calls share one clock reading (see `CallBatch`).
        let deadline = match staging.as_deref_mut() {
            Some(st) => self.deadline_from(opts, || st.clock(self)),
            None => self.deadline_of(opts),
        };
        let q = self.pick_queue(opts.queue)?;
        // After the checks that need no waiting, so a blocking call gets the same errors for bad
        // arguments on every engine.
        if let Some(what) = blocking {
            self.refuse_to_block(what)?;
        }
        if let Some(st) = staging.as_deref_mut() {
            st.before_start(self, q);
        }
        self.take_credit(q, opts, deadline)?;
        let mut tx = match self.take_tx(opts, deadline) {
            Ok(tx) => tx,
            Err(e) => {
                let _ = self.credits[q].give(1);
                return Err(e);
            }
        };
        let h = tx.handle();
        let req_id = if opts.mode == CallMode::EarlyRsp {
            self.table.take_id()
        } else {
            match self.table.allocate(h.to_u64()) {
                Ok(id) => id,
                Err(_) => {
                    self.abandon(tx, q);
                    return Err(RpcError::WouldBlock("the request table is full"));
                }
            }
        };
        // Only a rendezvous call fills descriptors: an eager one does not zero the array.
        let mut descs_buf;
        let (descs, response_descriptor): (&[wire::DmaDescriptor], bool) = if plan.any() {
            descs_buf = [wire::DmaDescriptor::default(); wire::MAX_DMA_DESCRIPTORS];
            match self.rndv_prepare(h, q, opts, plan, &args, &mut descs_buf) {
                Ok((n, rd)) => (&descs_buf[..n], rd),
                Err(e) => {
                    drop(self.rndv_take(h));
                    if opts.mode != CallMode::EarlyRsp {
                        self.table.cancel(req_id);
                    }
                    self.abandon(tx, q);
                    return Err(e);
                }
            }
        } else {
            (&[], false)
        };
        let header = RequestHeader {
            arg_dma_count: 0,
            ack_requested: matches!(opts.mode, CallMode::Ack | CallMode::AckEarlyRsp),
            no_response: matches!(opts.mode, CallMode::EarlyRsp | CallMode::AckEarlyRsp),
            response_descriptor,
            function,
            total_size: 0,
            req_id,
            channel: self.channel_id,
            function_defined: 0,
        };
        let len = match wire::encode_request(self.ep.send_buf(&mut tx), &header, descs, inline) {
            Ok(len) => len,
            Err(e) => {
                drop(self.rndv_take(h));
                if opts.mode != CallMode::EarlyRsp {
                    self.table.cancel(req_id);
                }
                self.abandon(tx, q);
                return Err(RpcError::InvalidArgument(format!("cannot encode the request: {e}")));
            }
        };
        let slot = &self.slots[h.index as usize];
        let traced_at =
            if trace::is_enabled() { trace_call_start(function, req_id, opts.mode, q) } else { 0 };
        *lock(&slot.pending) = Some(Pending {
            sink,
            req_id,
            queue: q,
            function,
            mode: opts.mode,
            deadline,
            traced_at,
            one_sided: false,
        });
        slot.handle.store(h.to_u64(), Ordering::Release);
        let life = self.ep.queues[q].epoch.load(Ordering::Acquire);
        let staged = batch::Staged { h, len: len as u32, q, req_id, mode: opts.mode, life };
        if let Some(st) = staging {
            self.armed(function, h, deadline);
            st.push(self, staged, tx);
            return Ok(());
        }
        if let Err(Unposted { tx, error: e }) = self.ep.post_send(q, tx, len) {
            // Nothing was posted. If no other path (close, queue failure) claimed the call in
            // the meantime, undo it and report the error here; else that path delivered.
            return match self.unpost(&staged, tx) {
                Some(pending) => {
                    if trace::is_enabled() {
                        trace_call_end(&pending, false);
                    }
                    drop(pending);
                    Err(e)
                }
                None => Ok(()),
            };
        }
        self.armed(function, h, deadline);
        Ok(())
    }

    /// A started call's request is posted (or staged): counts it and arms its deadline.
    pub(super) fn armed(&self, function: FunctionId, h: TxHandle, deadline: u64) {
        if !crate::conn::liveness::is_probe(function) {
            self.counters.calls.fetch_add(1, Ordering::Relaxed);
        }
        if deadline != NO_DEADLINE {
            self.slots[h.index as usize].deadline.store(deadline, Ordering::SeqCst);
            self.lower_next_scan(deadline);
        }
    }

    /// Makes the next timeout scan come no later than `deadline` (whose slot's deadline the
    /// caller stored, SeqCst, just before). Calls usually start in deadline order, so the scan is
    /// mostly due already: a load then, not a read-modify-write. A scan that reset `next_scan`
    /// after this load saw the slot's deadline (both SeqCst: the slot store precedes the load,
    /// which precedes the reset, which precedes the scan's slot loads) and re-lowers it itself.
    pub(super) fn lower_next_scan(&self, deadline: u64) {
        if self.next_scan.load(Ordering::SeqCst) > deadline {
            self.next_scan.fetch_min(deadline, Ordering::SeqCst);
        }
    }
}
