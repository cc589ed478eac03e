//! The client side of rendezvous (`docs/protocol.md` §15).
//!
//! A call whose arguments do not fit the eager message (or that sets
//! [`CallOptions::rendezvous`]) sends DMA descriptors instead of the bytes: the arguments are
//! copied into a registered region from the channel's pool (or, with
//! [`Channel::call_segments_with`](crate::Channel::call_segments_with), named where they already
//! are, up to 31 registered ranges), and the server pulls them with RDMA READ. A call with
//! [`CallOptions::max_response`] above the eager size also names a registered response buffer of
//! that size (the last descriptor, flagged by REQ byte 1 bit 6); the server RDMA-WRITEs a large
//! response into it, then sends the RSP, whose 4-byte prefix says how many bytes it wrote.
//!
//! The memory stays with the call until its outcome: the response proves the server is done
//! with it (it replies only after its READs completed, and posts its WRITEs before the RSP).
//!
//! **Quarantine.** A call that ends at its deadline may still have the server reading its
//! arguments or writing its response buffer: a server waiting for rendezvous memory READs late,
//! a handler replies late. Deregistering the memory then would turn that late READ or WRITE into
//! a remote access error, which fails the RC queue and with it every other call on it (and a
//! queue recovery from the budget). So a timed-out call's memory is *quarantined*: kept
//! registered, and not reused, until the server can no longer touch it —
//!
//! - the response to that request arrives (late, counted stale): the server is done, and the
//!   memory goes back to the pool for reuse;
//! - its queue fails (ERROR answers no READ or WRITE) or is recovered into a new life, or the
//!   channel closes: the memory is dropped (deregistered), never reused;
//! - no answer within [`QUARANTINE`] (60 s of the device's clock; a request its handler dropped
//!   is never answered, nor touched again): dropped (deregistered) too.
//!
//! Quarantined bytes count against [`ChannelConfig::memory_limit`](crate::ChannelConfig) together
//! with the channel's registered buffers: while they exceed it, a new rendezvous call fails with
//! [`RpcError::WouldBlock`] (eager calls are unaffected); [`Channel::fail_queue`](crate::Channel::fail_queue)
//! frees a queue's quarantine at the cost of that queue's outstanding calls.
//! [`Channel::rndv_quarantined`](crate::Channel::rndv_quarantined) tells how many bytes are held.
//!
//! A call that ends any other way (queue failure, close) has no queue left the server could use:
//! its regions are dropped (deregistered) at once, not reused, so a late transfer fails at the
//! NIC instead of landing in another call's buffer.

use super::{ChannelInner, LocalRange};
use crate::conn::rndv::{token_of, RegionPool, RndvAllocator, RndvMem};
use crate::core::tx_ctx::{CallMode, TxHandle};
use crate::hal::{Access, Device, MemoryRegion};
use crate::sync::lock;
use crate::wire::{DmaDescriptor, RequestHeader, ResponseHeader, MAX_DMA_DESCRIPTORS, RNDV_PREFIX_LEN};
use crate::{CallOptions, RpcError};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Idle regions the client's pools keep for reuse, each (bytes).
const CLIENT_CACHE: u64 = 256 << 20;

/// Largest part of a copied argument one descriptor describes (a descriptor's size is a u32).
const MAX_DESC_BYTES: usize = 1 << 31;

/// The arguments of a call: bytes to send (eager, or copied for rendezvous), or registered
/// ranges to be READ where they are.
pub(crate) enum Args<'a, 'r, R> {
    Bytes(&'a [u8]),
    Segments(&'a [LocalRange<'r, R>]),
}

impl<R> Args<'_, '_, R> {
    fn len(&self) -> usize {
        match self {
            Args::Bytes(b) => b.len(),
            Args::Segments(s) => s.iter().map(|l| l.len).sum(),
        }
    }
}

/// How a call uses rendezvous.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Plan {
    /// The arguments go as descriptors.
    pub(crate) args: bool,
    /// The call names a response buffer.
    pub(crate) response: bool,
}

impl Plan {
    pub(crate) fn any(self) -> bool {
        self.args || self.response
    }
}

/// What a rendezvous call holds until its outcome.
pub(crate) struct CallRndv<R: 'static> {
    args: Option<RndvMem<R>>,
    /// Caller's regions a segmented call names (kept alive while the server may READ them).
    held: Vec<Arc<R>>,
    response: Option<RndvMem<R>>,
    response_cap: usize,
    /// The queue the call was started on, and that queue's life then (its epoch).
    queue: usize,
    life: u32,
    /// The bytes the server may move for the call, counted in the channel's
    /// [`State::moving`] until the call's memory is let go of.
    moving: Moving,
}

/// A call's share of [`State::moving`]: added when the call names its memory, taken back when
/// the call's rendezvous state is dropped (its outcome, or the end of its quarantine).
struct Moving {
    counter: Option<Arc<AtomicU64>>,
    bytes: u64,
}

impl Moving {
    const NONE: Moving = Moving { counter: None, bytes: 0 };

    fn new(counter: &Arc<AtomicU64>, bytes: u64) -> Self {
        counter.fetch_add(bytes, Ordering::Relaxed);
        Moving { counter: Some(counter.clone()), bytes }
    }
}

impl Drop for Moving {
    fn drop(&mut self) {
        if let Some(c) = self.counter.take() {
            c.fetch_sub(self.bytes, Ordering::Relaxed);
        }
    }
}

impl<R: MemoryRegion + 'static> CallRndv<R> {
    /// The call's response data, from the RSP's `data` (its prefix, then inline bytes) and the
    /// response buffer.
    pub(crate) fn response<'a>(&'a self, data: &'a [u8]) -> Result<&'a [u8], RpcError> {
        let Some(mem) = &self.response else { return Ok(data) };
        let malformed =
            || RpcError::InvalidArgument("a malformed rendezvous response from the server".into());
        let (prefix, inline) = data.split_first_chunk::<RNDV_PREFIX_LEN>().ok_or_else(malformed)?;
        let written = u32::from_le_bytes(*prefix) as usize;
        if written == 0 {
            return Ok(inline);
        }
        if written > self.response_cap || !inline.is_empty() {
            return Err(malformed());
        }
        // The server posted its WRITEs into this buffer before the RSP, and RC delivers the RSP
        // only after they were placed: the server is done with it (see `RndvMem`).
        Ok(mem.bytes(written))
    }

    /// The call ended without a response: the server may still be moving data.
    pub(crate) fn poison(&mut self) {
        self.args.iter_mut().chain(self.response.iter_mut()).for_each(RndvMem::poison);
    }

    /// Bytes of rendezvous memory the call holds (argument copy and response buffer; a caller's
    /// own segments are not counted).
    fn bytes(&self) -> u64 {
        self.args.iter().chain(self.response.iter()).map(|m| m.len() as u64).sum()
    }
}

/// A timed-out call's memory, kept registered until the server can no longer touch it.
struct Quarantined<R: 'static> {
    req_id: u32,
    bytes: u64,
    /// When the quarantine ends anyway (device clock, ns): see [`QUARANTINE`].
    until: u64,
    call: CallRndv<R>,
}

/// Longest a timed-out call's memory stays quarantined without an answer from the server. A
/// server answers every request it READ or WRITEs for, unless its handler dropped the request
/// (which answers nothing: the memory is then never touched again) or holds it for longer than
/// this; past it the memory is dropped (deregistered), and a server that still touches it fails
/// the queue, as a stale key would.
pub(crate) const QUARANTINE: std::time::Duration = std::time::Duration::from_secs(60);

struct Slot<R: 'static> {
    active: AtomicBool,
    data: Mutex<Option<CallRndv<R>>>,
}

/// A channel's rendezvous state: per send context, the call's memory; the pools.
pub(crate) struct State<D: Device> {
    slots: Box<[Slot<D::Region>]>,
    pool: Arc<RegionPool<D>>,
    alloc: Arc<dyn RndvAllocator<D::Region>>,
    /// Whether the device's keys fit URPC's 32-bit descriptor token.
    pub(crate) supported: bool,
    /// Timed-out calls' memory the server may still READ or WRITE (see the module docs).
    quarantine: Mutex<Vec<Quarantined<D::Region>>>,
    /// Bytes in `quarantine`.
    quarantined: AtomicU64,
    /// Entries in `quarantine` (read without the lock: 0 on the common path).
    entries: AtomicUsize,
    /// The earliest `until` of the entries (`u64::MAX`: none).
    next_expiry: AtomicU64,
    /// Bytes the server may still READ from or WRITE into this channel's memory: argument bytes
    /// and response capacity of outstanding and quarantined rendezvous calls. Keepalive gives
    /// the server's answers that much longer (they may wait behind the transfer on its send
    /// queue: [`crate::conn::liveness`]). Relaxed: a hint read by the control loop.
    moving: Arc<AtomicU64>,
}

impl<D: Device + Clone> State<D> {
    pub(crate) fn new(device: &D, contexts: usize) -> Self {
        // Argument copies are READ by the server, response buffers written by it, and a call
        // with both uses one region for both (see `rndv_prepare`): one pool serves all.
        let access = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
        let pool = Arc::new(RegionPool::new(device, access, CLIENT_CACHE, u64::MAX));
        // A registration tells whether keys are 32-bit; do it without allocating: look at a tiny
        // region once.
        let supported = device
            .register(64, Access::REMOTE_READ)
            .map(|r| token_of(&r.remote_key()).is_some())
            .unwrap_or(false);
        State {
            slots: (0..contexts)
                .map(|_| Slot { active: AtomicBool::new(false), data: Mutex::new(None) })
                .collect(),
            alloc: pool.clone(),
            pool,
            supported,
            quarantine: Mutex::new(Vec::new()),
            quarantined: AtomicU64::new(0),
            entries: AtomicUsize::new(0),
            next_expiry: AtomicU64::new(u64::MAX),
            moving: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Bytes the server may still move for this channel's rendezvous calls (see `moving`).
    pub(crate) fn moving(&self) -> u64 {
        self.moving.load(Ordering::Relaxed)
    }

    /// Bytes of rendezvous memory held by calls right now, quarantined ones included (0 when
    /// idle: nothing leaked).
    pub(crate) fn in_use(&self) -> u64 {
        self.pool.in_use()
    }

    /// Bytes of timed-out calls' memory held in quarantine right now.
    pub(crate) fn quarantined(&self) -> u64 {
        self.quarantined.load(Ordering::Acquire)
    }

    /// Takes the entries `pick` chooses out of the quarantine (to be dropped by the caller,
    /// outside the lock: dropping deregisters or returns memory to the allocator).
    fn take_quarantined(
        &self,
        pick: impl Fn(&Quarantined<D::Region>) -> bool,
    ) -> Vec<Quarantined<D::Region>> {
        if self.entries.load(Ordering::Acquire) == 0 {
            return Vec::new();
        }
        let mut list = lock(&self.quarantine);
        let mut out = Vec::new();
        let mut i = 0;
        while i < list.len() {
            if pick(&list[i]) {
                let e = list.swap_remove(i);
                self.quarantined.fetch_sub(e.bytes, Ordering::AcqRel);
                self.entries.fetch_sub(1, Ordering::AcqRel);
                out.push(e);
            } else {
                i += 1;
            }
        }
        let next = list.iter().map(|e| e.until).min().unwrap_or(u64::MAX);
        self.next_expiry.store(next, Ordering::Release);
        out
    }
}

impl<D: Device + Clone> ChannelInner<D> {
    /// Largest response data a response carries inline.
    fn inline_response(&self, prefix: bool) -> usize {
        self.max_request.saturating_sub(ResponseHeader::LEN + if prefix { RNDV_PREFIX_LEN } else { 0 })
    }

    /// Whether the call's arguments go by rendezvous, and whether it names a response buffer;
    /// refuses what cannot.
    pub(crate) fn rndv_wanted<R>(
        &self,
        opts: &CallOptions,
        args: &Args<'_, '_, R>,
    ) -> Result<Plan, RpcError> {
        let len = args.len();
        let big_args = len > 0
            && (opts.rendezvous
                || RequestHeader::LEN + len > self.max_request
                || matches!(args, Args::Segments(_)));
        let no_response = matches!(opts.mode, CallMode::EarlyRsp | CallMode::AckEarlyRsp);
        // A call without a response has no use for a response buffer.
        let big_rsp = !no_response && opts.max_response > self.inline_response(false);
        let plan = Plan { args: big_args, response: big_rsp };
        if !big_args && !big_rsp {
            return Ok(plan);
        }
        if no_response {
            // Only a response tells the client that the server is done with its memory.
            if matches!(args, Args::Bytes(_)) && RequestHeader::LEN + len > self.max_request {
                // As before rendezvous: too large for the message (checked by the caller).
                return Ok(Plan { args: false, response: false });
            }
            return Err(RpcError::InvalidArgument(format!(
                "a rendezvous call ({len} bytes of arguments) needs a response that tells when the server \
                 is done with the memory: use CallMode::WaitRsp or CallMode::Ack"
            )));
        }
        if !self.rndv.supported {
            return Err(RpcError::InvalidArgument(
                "this device's remote keys do not fit URPC's 32-bit DMA descriptor token: no rendezvous"
                    .into(),
            ));
        }
        if plan.args {
            // The server READs the arguments from this channel's queues, which answer READs only
            // with responder resources; without, every such READ would fail the queue.
            let ours = self.config.queue_config.max_dest_rd_atomic;
            let cap = self.ep.device.caps().max_dest_rd_atomic;
            if ours.min(cap) == 0 {
                return Err(RpcError::InvalidArgument(format!(
                    "rendezvous arguments ({len} bytes) are READ by the server, but this channel's queues serve \
                     no READ: ChannelConfig.queue_config.max_dest_rd_atomic is {ours} (device cap {cap}); set it to \
                     at least 1, or keep the arguments eager (at most {} bytes)",
                    self.max_request.saturating_sub(RequestHeader::LEN)
                )));
            }
            if self.server_reads.1 == Some(0) {
                return Err(RpcError::InvalidArgument(format!(
                    "rendezvous arguments ({len} bytes) are READ by the server, but its queues issue no READ: \
                     the server announced an initiator depth of 0 (its ServerConfig.queue_config.max_rd_atomic, \
                     or its device's cap, is 0); set it to at least 1 on the server, or keep the arguments \
                     eager (at most {} bytes)",
                    self.max_request.saturating_sub(RequestHeader::LEN)
                )));
            }
        }
        Ok(plan)
    }

    /// Allocates and fills the call's memory, writes its descriptors into `descs` and keeps the
    /// memory in context `h`'s slot. Returns the descriptor count and whether the last one is
    /// the response buffer.
    pub(crate) fn rndv_prepare(
        &self,
        h: TxHandle,
        q: usize,
        opts: &CallOptions,
        plan: Plan,
        args: &Args<'_, '_, D::Region>,
        descs: &mut [DmaDescriptor; MAX_DMA_DESCRIPTORS],
    ) -> Result<(usize, bool), RpcError> {
        let len = args.len();
        let want_rsp = plan.response;
        self.rndv_room()?;
        let life = self.ep.queues[q].epoch.load(Ordering::Acquire);
        let mut call = CallRndv {
            args: None,
            held: Vec::new(),
            response: None,
            response_cap: 0,
            queue: q,
            life,
            moving: Moving::NONE,
        };
        let mut n = 0usize;
        let room = MAX_DMA_DESCRIPTORS - usize::from(want_rsp);
        let mut push = |d: DmaDescriptor, n: &mut usize| -> Result<(), RpcError> {
            if *n >= room {
                return Err(RpcError::InvalidArgument(format!(
                    "a rendezvous call takes at most {room} argument descriptors{}",
                    if want_rsp { " (one of the 31 names the response buffer)" } else { "" }
                )));
            }
            descs[*n] = d;
            *n += 1;
            Ok(())
        };
        let token = |r: &D::Region| {
            token_of(&r.remote_key())
                .ok_or_else(|| RpcError::InvalidArgument("a remote key wider than 32 bits".into()))
        };
        let cap = if want_rsp {
            u32::try_from(opts.max_response).map_err(|_| {
                RpcError::InvalidArgument(format!("max_response {} is above 4 GiB - 1", opts.max_response))
            })? as usize
        } else {
            0
        };
        // What the server READs and WRITEs (a shared region is moved both ways).
        let moved = (if plan.args { len as u64 } else { 0 }) + cap as u64;
        call.moving = Moving::new(&self.rndv.moving, moved);
        match args {
            Args::Bytes(bytes) if plan.args => {
                // With a response buffer too, one region serves both: a bypass server writes the
                // response only after it has READ every argument (it replies once its READs
                // completed), so the response may overwrite the argument copy. That halves the
                // memory (and the page faults) of large echo-like calls.
                let mut mem = RndvMem::allocate(&self.rndv.alloc, len.max(cap))
                    .ok_or(RpcError::WouldBlock("could not register memory for the rendezvous arguments"))?;
                // Freshly allocated, not named in any descriptor yet.
                mem.copy_in(bytes);
                let base = mem.region().addr() + mem.offset() as u64;
                let tok = token(mem.region())?;
                for (o, l) in crate::conn::rndv::chunks(len, MAX_DESC_BYTES) {
                    push(DmaDescriptor { size: l as u32, address: base + o as u64, token: tok }, &mut n)?;
                }
                call.args = Some(mem);
            }
            Args::Bytes(_) => {}
            Args::Segments(segs) => {
                for (i, s) in segs.iter().enumerate() {
                    if !s.region.access().contains(Access::REMOTE_READ) {
                        return Err(RpcError::InvalidArgument(format!(
                            "argument segment {i} is in a region without REMOTE_READ access"
                        )));
                    }
                    if s.len == 0 {
                        continue;
                    }
                    let sge = s
                        .region
                        .sge(s.offset, s.len)
                        .map_err(|e| RpcError::InvalidArgument(format!("argument segment {i}: {e}")))?;
                    push(
                        DmaDescriptor { size: sge.len, address: sge.addr, token: token(s.region)? },
                        &mut n,
                    )?;
                    call.held.push(Arc::clone(s.region));
                }
            }
        }
        if want_rsp {
            let mem = match call.args.take() {
                Some(shared) => shared,
                None => RndvMem::allocate(&self.rndv.alloc, cap)
                    .ok_or(RpcError::WouldBlock("could not register memory for the rendezvous response"))?,
            };
            descs[n] = DmaDescriptor {
                size: cap as u32,
                address: mem.region().addr() + mem.offset() as u64,
                token: token(mem.region())?,
            };
            n += 1;
            call.response = Some(mem);
            call.response_cap = cap;
        }
        let need = RequestHeader::LEN + n * DmaDescriptor::LEN;
        if need > self.max_request {
            return Err(RpcError::TooLarge { len: need, max: self.max_request, header: RequestHeader::LEN });
        }
        let slot = &self.rndv.slots[h.index as usize];
        *lock(&slot.data) = Some(call);
        slot.active.store(true, Ordering::Release);
        Ok((n, want_rsp))
    }

    /// Refuses a new rendezvous call while quarantined memory fills the channel's memory limit.
    fn rndv_room(&self) -> Result<(), RpcError> {
        let held = self.rndv.quarantined();
        if held != 0 && self.ep.registered().saturating_add(held) > self.config.memory_limit {
            return Err(RpcError::WouldBlock(
                "the rendezvous memory of timed-out calls, which the server may still access, fills \
                 ChannelConfig.memory_limit together with the channel's buffers: it is freed when the server \
                 answers those calls or their queue is reset (Channel::fail_queue); eager calls still work",
            ));
        }
        Ok(())
    }

    /// A call that timed out: its memory stays registered until the server can no longer touch
    /// it (the response to `req_id`, or the end of the queue's life; see the module docs). If
    /// the call's queue life is over already, the memory is dropped at once.
    pub(crate) fn rndv_quarantine(&self, mut call: CallRndv<D::Region>, req_id: u32) {
        let bytes = call.bytes();
        if bytes == 0 && call.held.is_empty() {
            return;
        }
        call.poison();
        let mut list = lock(&self.rndv.quarantine);
        // Under the lock: a queue failure marks the queue not READY before it takes the lock to
        // empty its quarantine, so an entry is either seen by it or not added.
        let slot = &self.ep.queues[call.queue];
        if !slot.ready.load(Ordering::Acquire) || slot.epoch.load(Ordering::Acquire) != call.life {
            drop(list);
            return drop(call);
        }
        let now = self.ep.device.now();
        let until = now.saturating_add(QUARANTINE).as_nanos().min(u128::from(u64::MAX - 1)) as u64;
        self.rndv.quarantined.fetch_add(bytes, Ordering::AcqRel);
        self.rndv.entries.fetch_add(1, Ordering::AcqRel);
        self.rndv.next_expiry.fetch_min(until, Ordering::AcqRel);
        list.push(Quarantined { req_id, bytes, until, call });
    }

    /// The response to `req_id` on queue `q` matched no outstanding call: if it answers a
    /// quarantined call, the server is done with that memory, which goes back to the pool.
    pub(crate) fn rndv_answered(&self, q: usize, req_id: u32) {
        for mut e in self.rndv.take_quarantined(|e| e.req_id == req_id && e.call.queue == q) {
            e.call.args.iter_mut().chain(e.call.response.iter_mut()).for_each(RndvMem::unpoison);
        }
    }

    /// Drops the quarantined memory whose [`QUARANTINE`] is over at `now` (device clock, ns).
    /// One load while nothing is due.
    pub(crate) fn rndv_expire(&self, now: u64) {
        if now < self.rndv.next_expiry.load(Ordering::Acquire) {
            return;
        }
        let expired = self.rndv.take_quarantined(|e| e.until <= now);
        if !expired.is_empty() {
            eprintln!(
                "bypass: channel {}: dropped the rendezvous memory of {} timed-out call(s) the server did not \
                 answer within {QUARANTINE:?} (if it still accesses it, the queue fails)",
                self.channel_id,
                expired.len()
            );
        }
    }

    /// Queue `q` failed (it answers no READ or WRITE any more; it must be marked not READY
    /// first): its quarantined memory is dropped, never reused.
    pub(crate) fn rndv_release_queue(&self, q: usize) {
        drop(self.rndv.take_quarantined(|e| e.call.queue == q));
    }

    /// Takes the rendezvous memory of context `h`'s call, if it has any (one load otherwise).
    pub(crate) fn rndv_take(&self, h: TxHandle) -> Option<CallRndv<D::Region>> {
        let slot = self.rndv.slots.get(h.index as usize)?;
        if !slot.active.load(Ordering::Acquire) || !slot.active.swap(false, Ordering::AcqRel) {
            return None;
        }
        lock(&slot.data).take()
    }
}
