//! The server side of rendezvous (`docs/protocol.md` §15).
//!
//! A request with DMA descriptors is not handed to its handler at once. The server checks the
//! descriptors, charges their total against the connection's
//! [`ServerConfig::rndv_memory_limit`](crate::ServerConfig::rndv_memory_limit) (a request that
//! does not fit even alone is answered REMOTE_LEN_ERR; one that fits but finds the memory in use
//! waits for it), takes memory from the allocator, and RDMA READs every descriptor into it, one
//! contiguous buffer, in chunks of at most [`MAX_CHUNK`](crate::conn::rndv) bytes. Only when every READ
//! has completed does the handler run, with the gathered bytes as [`Request::args`] and the
//! descriptors' parts as [`Request::segments`].
//!
//! Work requests wait in a per-queue FIFO: at most `max_rd_atomic` READs (the queue's
//! `QueueConfig::max_rd_atomic`, clamped to the device's and to the client's responder
//! resources, its `QueueInfo::responder_resources`) and at most `window` one-sided
//! operations are outstanding per queue, and each takes a send context, so the send ring never
//! overflows and replies always find contexts. A large response is written the same way (WRITE
//! chunks into the client's response buffer), followed in the same FIFO by the RSP, so RC
//! ordering places the data before the client sees the response.
//!
//! Completions come back through the connection's send CQ (`wr_id` tagged with [`RNDV_TAG`]).
//! A READ or WRITE that fails fails its queue (RC); its request is answered HDR_ERR (which
//! cannot reach the client on the failed queue) and every byte it held is freed.

use super::{bump, Conn, Request};
use crate::conn::bufs::{TxToken, Unposted};
use crate::conn::rndv::{chunk_size, chunks, RegionPool, RndvAllocator, RndvMem};
use crate::core::tx_ctx::CallMode;
use crate::hal::{self, Device, MemoryRegion, RemoteAddr, RemoteKey, SendOp, Sge};
use crate::wire::{self, DmaDescriptor, ResponseHeader, Status, RNDV_PREFIX_LEN};
use crate::RpcError;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::sync::lock;

/// Set in the `wr_id` of the server's rendezvous READs and WRITEs (bit 31 of the index half).
pub(crate) const RNDV_TAG: u64 = 1 << 31;

/// Counters of the server's rendezvous (all connections).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RndvStats {
    /// Requests with DMA descriptors received.
    pub requests: u64,
    /// Bytes pulled with RDMA READ.
    pub bytes_read: u64,
    /// Bytes of responses written with RDMA WRITE into clients' response buffers.
    pub bytes_written: u64,
    /// Requests refused before any READ: descriptors that make no sense (HDR_ERR), a total above
    /// the per-connection limit (REMOTE_LEN_ERR), or no memory from the allocator
    /// (SERVER_DECLINE).
    pub refused: u64,
    /// READs or WRITEs that failed (the queue failed with them).
    pub failed: u64,
    /// Requests that had to wait for rendezvous memory held by other requests.
    pub waited: u64,
    /// Most READs ever outstanding at once on one queue (at most its `max_rd_atomic`).
    pub peak_reads: u64,
    /// Bytes of rendezvous memory held right now, over all open connections (0 when idle).
    pub bytes_in_use: u64,
}

#[derive(Default)]
pub(crate) struct Counters {
    requests: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    refused: AtomicU64,
    failed: AtomicU64,
    waited: AtomicU64,
    peak_reads: AtomicU64,
}

impl Counters {
    pub(crate) fn snapshot(&self, bytes_in_use: u64) -> RndvStats {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        RndvStats {
            requests: l(&self.requests),
            bytes_read: l(&self.bytes_read),
            bytes_written: l(&self.bytes_written),
            refused: l(&self.refused),
            failed: l(&self.failed),
            waited: l(&self.waited),
            peak_reads: l(&self.peak_reads),
            bytes_in_use,
        }
    }
}

/// What a rendezvous request carries besides its header: the gathered arguments and the
/// client's response buffer.
pub(crate) struct ReqRndv<R: 'static> {
    /// The gathered arguments (`None`: no argument descriptors, or moved into a response).
    mem: Option<RndvMem<R>>,
    /// Total argument bytes.
    total: usize,
    /// `(offset, len)` of each argument descriptor's part in `mem`.
    parts: Vec<(usize, usize)>,
    /// The client's response buffer.
    response: Option<DmaDescriptor>,
}

impl<R: MemoryRegion + 'static> ReqRndv<R> {
    fn args(&self) -> &[u8] {
        match &self.mem {
            // The request is reachable (here) only once every READ into `mem` completed.
            Some(m) => m.bytes(self.total),
            None => &[],
        }
    }
}

/// A READ or WRITE waiting in a queue's FIFO or outstanding, or the RSP that follows WRITEs.
enum Op<D: Device + Clone> {
    Read { job: Arc<ReadJob<D>>, sge: Sge, remote: RemoteAddr, q: usize },
    Write { job: Arc<WriteJob<D>>, sge: Sge, remote: RemoteAddr, q: usize },
    Rsp { job: Arc<WriteJob<D>> },
}

struct ReadJob<D: Device + Clone> {
    request: Mutex<Option<Request<D>>>,
    unfinished: AtomicUsize,
    failed: AtomicBool,
}

struct WriteJob<D: Device + Clone> {
    /// The memory the WRITEs read (freed when the last WRITE completed).
    src: Mutex<Option<RndvMem<D::Region>>>,
    unfinished: AtomicUsize,
    header: ResponseHeader,
    written: u32,
}

#[derive(Default)]
struct QueueOps<D: Device + Clone> {
    fifo: VecDeque<Op<D>>,
    reads: u32,
    inflight: u32,
}

enum Done<D: Device + Clone> {
    Read(Arc<ReadJob<D>>),
    Write(Arc<WriteJob<D>>),
}

/// The rendezvous state of one connection.
pub(crate) struct ConnRndv<D: Device + Clone> {
    alloc: Arc<dyn RndvAllocator<D::Region>>,
    limit: u64,
    in_use: Arc<AtomicU64>,
    chunk: usize,
    rd_limit: u32,
    op_limit: u32,
    queues: Box<[Mutex<QueueOps<D>>]>,
    /// The operation of each send context that is outstanding as a rendezvous READ or WRITE.
    slots: Box<[Mutex<Option<Op<D>>>]>,
    /// Ops wait in some FIFO (checked on every send-CQ poll: one load).
    pending: AtomicUsize,
    /// READs and WRITEs posted and not completed yet, over all queues: while there are some,
    /// the connection is moving its own data and keepalive does not judge the client's silence
    /// (see [`crate::conn::liveness`]). Each op in `slots` is counted once, and uncounted by
    /// whoever takes it out.
    posted: AtomicUsize,
    waiting: Mutex<VecDeque<(Request<D>, DescList)>>,
    any_waiting: AtomicBool,
}

/// The descriptors of a request, copied out of its receive buffer.
pub(super) type DescList = Vec<DmaDescriptor>;

impl<D: Device + Clone> ConnRndv<D> {
    pub(crate) fn new(
        device: &D,
        alloc: Option<Arc<dyn RndvAllocator<D::Region>>>,
        limit: u64,
        initiator_depth: u8,
        queues: usize,
        window: u32,
        tx_capacity: usize,
    ) -> Self {
        let caps = device.caps();
        let alloc = alloc.unwrap_or_else(|| {
            Arc::new(RegionPool::new(device, hal::Access::LOCAL_WRITE, limit, limit))
                as Arc<dyn RndvAllocator<D::Region>>
        });
        ConnRndv {
            alloc,
            limit,
            in_use: Arc::new(AtomicU64::new(0)),
            chunk: chunk_size(caps.max_msg_size),
            rd_limit: u32::from(initiator_depth.min(caps.max_rd_atomic)),
            op_limit: window.max(1),
            queues: (0..queues)
                .map(|_| Mutex::new(QueueOps { fifo: VecDeque::new(), reads: 0, inflight: 0 }))
                .collect(),
            slots: (0..tx_capacity).map(|_| Mutex::new(None)).collect(),
            pending: AtomicUsize::new(0),
            posted: AtomicUsize::new(0),
            waiting: Mutex::new(VecDeque::new()),
            any_waiting: AtomicBool::new(false),
        }
    }

    /// Rendezvous bytes held by this connection.
    pub(crate) fn in_use(&self) -> u64 {
        self.in_use.load(Ordering::Acquire)
    }

    /// READs and WRITEs of this connection posted and not completed (see `posted`).
    pub(crate) fn posted(&self) -> usize {
        self.posted.load(Ordering::Relaxed)
    }

    /// No rendezvous in progress: no memory held (so no READ or WRITE outstanding), nothing
    /// queued, no request waiting for memory. Then the send CQ holds only reply completions,
    /// which the worker may reap lazily (`Conn::poll`).
    pub(super) fn is_quiet(&self) -> bool {
        self.in_use() == 0
            && self.pending.load(Ordering::Acquire) == 0
            && !self.any_waiting.load(Ordering::Acquire)
    }

    fn try_charge(&self, bytes: u64) -> bool {
        self.in_use
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                u.checked_add(bytes).filter(|&t| t <= self.limit)
            })
            .is_ok()
    }
}

impl<D: Device + Clone> Request<D> {
    /// The gathered arguments of a rendezvous request with argument descriptors, else `None`
    /// (the arguments are inline).
    pub(super) fn rndv_args(&self) -> Option<&[u8]> {
        self.rndv.as_ref().filter(|r| r.mem.is_some()).map(|r| r.args())
    }

    /// The descriptors' parts of the arguments: one slice per argument descriptor, in order (the
    /// gathered buffer cut at the descriptors' boundaries, no copy). An eager request has one
    /// part, its inline arguments (none if they are empty).
    pub fn segments(&self) -> impl Iterator<Item = &[u8]> + '_ {
        let gathered = self.rndv.as_ref().filter(|r| r.mem.is_some());
        let (args, parts): (&[u8], &[(usize, usize)]) = match gathered {
            Some(r) => (r.args(), &r.parts),
            None => (self.args(), &[]),
        };
        let eager = gathered.is_none() && !args.is_empty();
        parts.iter().map(move |&(o, l)| args.get(o..o + l).unwrap_or(&[])).chain(eager.then_some(args))
    }

    /// Whether the arguments came by rendezvous (RDMA READ from the client's memory).
    pub fn is_rendezvous(&self) -> bool {
        self.rndv_args().is_some()
    }

    /// The gathered rendezvous arguments, writable in place (e.g. to transform them and answer
    /// with [`Request::reply_args`] without a copy); `None` for an eager request.
    pub fn args_mut(&mut self) -> Option<&mut [u8]> {
        let r = self.rndv.as_mut()?;
        let total = r.total;
        // Every READ into the memory completed before the handler got the request.
        Some(r.mem.as_mut()?.bytes_mut(total))
    }

    /// The size of the client's response buffer, if it named one (the most a rendezvous
    /// response may carry).
    pub fn response_capacity(&self) -> Option<usize> {
        self.rndv.as_ref().and_then(|r| r.response).map(|d| d.size as usize)
    }

    /// Replies SUCCESS with the first `len` bytes of the arguments. For a rendezvous request
    /// whose client named a response buffer, the bytes are RDMA-written from the gathered
    /// buffer itself (no copy: an echo costs one READ and one WRITE); otherwise as
    /// [`Request::reply`].
    pub fn reply_args(mut self, len: usize) -> Result<(), RpcError> {
        let zero_copy =
            self.rndv.as_ref().is_some_and(|r| r.response.is_some() && r.mem.is_some() && len <= r.total);
        if zero_copy && len > self.inline_max() {
            let mem = self.rndv.as_mut().and_then(|r| r.mem.take());
            if let Some(mem) = mem {
                return reply_large(self, Status::Success, Source::Mem(mem, len));
            }
        }
        let args = self.rndv.as_mut().and_then(|r| r.mem.take());
        let Some(mem) = args else {
            // Eager: copied from the receive buffer into the send buffer, no allocation.
            return self.reply_with(Status::Success, |args, out| {
                let src = args.get(..len).ok_or(len)?;
                out.get_mut(..len).ok_or(len)?.copy_from_slice(src);
                Ok(len)
            });
        };
        let r = self.reply_status(Status::Success, mem.bytes(len));
        drop(mem);
        r
    }

    /// Whether a reply of `len` bytes goes by RDMA WRITE into the client's response buffer.
    pub(super) fn wants_large_reply(&self, len: usize) -> bool {
        len > self.inline_max() && self.response_capacity().is_some()
    }
}

/// Where a large response's bytes are.
pub(super) enum Source<'a, R: 'static> {
    Copy(&'a [u8]),
    Mem(RndvMem<R>, usize),
}

/// Replies with a large response: WRITEs into the client's response buffer, then the RSP.
pub(super) fn reply_large<D: Device + Clone>(
    mut req: Request<D>,
    status: Status,
    src: Source<'_, D::Region>,
) -> Result<(), RpcError> {
    let conn = req.conn.clone();
    let rndv = &conn.rndv;
    let desc = req.rndv.as_ref().and_then(|r| r.response).unwrap_or_default();
    let len = match &src {
        Source::Copy(d) => d.len(),
        Source::Mem(_, l) => *l,
    };
    if req.header.no_response {
        return req.reply_status(status, &[]);
    }
    if len > desc.size as usize {
        let max = desc.size as usize;
        let _ = req.reply_status(Status::RemoteLenErr, &[]);
        return Err(RpcError::TooLarge { len, max, header: 0 });
    }
    let mem = match src {
        Source::Mem(m, _) => m,
        Source::Copy(data) => {
            let fp = rndv.alloc.footprint(len) as u64;
            let mem = if rndv.try_charge(fp) {
                match RndvMem::allocate(&rndv.alloc, len) {
                    Some(m) => Some(m.charged(&rndv.in_use, fp)),
                    None => {
                        rndv.in_use.fetch_sub(fp, Ordering::AcqRel);
                        None
                    }
                }
            } else {
                None
            };
            let Some(mut mem) = mem else {
                bump(&conn.counters.rndv.refused);
                let _ = req.reply_status(Status::ServerDecline, &[]);
                return Err(RpcError::WouldBlock(
                    "no rendezvous memory for the response (ServerConfig.rndv_memory_limit)",
                ));
            };
            // Freshly allocated, not posted anywhere yet.
            mem.copy_in(data);
            mem
        }
    };
    req.done = true;
    let q = req.queue;
    let remote_key = RemoteKey::from_rkey(desc.token);
    let parts: Vec<(usize, usize)> = chunks(len, rndv.chunk).collect();
    let sges: Result<Vec<Sge>, _> =
        parts.iter().map(|&(o, l)| mem.region().sge(mem.offset() + o, l)).collect();
    let Ok(sges) = sges else {
        req.give_back(true);
        return Err(RpcError::InvalidArgument("rendezvous response out of its buffer".into()));
    };
    let job = Arc::new(WriteJob {
        src: Mutex::new(Some(mem)),
        unfinished: AtomicUsize::new(parts.len()),
        header: ResponseHeader {
            ack: false,
            status,
            req_id_range: wire::REQ_ID_RANGE_SINGLE,
            req_id: req.header.req_id,
            channel: conn.channel_id,
            function_defined: req.header.function_defined,
            total_size: (ResponseHeader::LEN + RNDV_PREFIX_LEN) as u32,
        },
        written: len as u32,
    });
    // The response returns the credit: the request's buffer goes back first.
    req.give_back(false);
    {
        let mut st = lock(&rndv.queues[q]);
        for (&(o, _), sge) in parts.iter().zip(sges) {
            let remote = RemoteAddr { addr: desc.address.wrapping_add(o as u64), key: remote_key };
            st.fifo.push_back(Op::Write { job: job.clone(), sge, remote, q });
        }
        st.fifo.push_back(Op::Rsp { job });
        rndv.pending.fetch_add(parts.len() + 1, Ordering::AcqRel);
    }
    conn.counters.rndv.bytes_written.fetch_add(len as u64, Ordering::Relaxed);
    conn.rndv_pump(q);
    Ok(())
}

impl<D: Device + Clone> Conn<D> {
    /// A request with DMA descriptors arrived (its ACK, if asked for, is already on its way).
    pub(super) fn rndv_start(&self, mut request: Request<D>, mut descs: DescList) {
        bump(&self.counters.rndv.requests);
        let response = if request.header.response_descriptor { descs.pop() } else { None };
        let bad = |why: &str| -> Option<String> { Some(why.to_string()) };
        let problem = if request.header.response_descriptor && response.is_none() {
            bad("a response descriptor flag with no descriptor")
        } else if descs
            .iter()
            .chain(response.iter())
            .any(|d| d.address.checked_add(u64::from(d.size)).is_none())
        {
            bad("a descriptor whose range overflows")
        } else if descs.iter().any(|d| d.size == 0) {
            bad("an empty argument descriptor")
        } else {
            None
        };
        if let Some(why) = problem {
            self.protocol_error(&format_args!("rendezvous request {}: {why}", request.header.req_id));
            bump(&self.counters.rndv.refused);
            let _ = request.reply_status(Status::HdrErr, &[]);
            return;
        }
        let total: u64 = descs.iter().map(|d| u64::from(d.size)).sum();
        let fp = self.rndv.alloc.footprint(total.try_into().unwrap_or(usize::MAX)) as u64;
        if total > self.rndv.limit || total > usize::MAX as u64 || fp > self.rndv.limit {
            bump(&self.counters.rndv.refused);
            let _ = request.reply_status(Status::RemoteLenErr, &[]);
            return;
        }
        if !descs.is_empty() && self.rndv.rd_limit == 0 {
            // Its arguments would be READ, but this connection's queues may have no READ
            // outstanding (the server's max_rd_atomic, its device's cap or the client's
            // responder resources are 0: the client was told at connect and should not have
            // asked). A READ would fail the queue or wait forever: declined instead.
            self.protocol_error(&format_args!(
                "rendezvous request {}: its arguments would be READ, but this connection may issue no \
                 READ (ServerConfig.queue_config.max_rd_atomic, the device's cap or the client's \
                 max_dest_rd_atomic is 0); declined",
                request.header.req_id
            ));
            bump(&self.counters.rndv.refused);
            let _ = request.reply_status(Status::ServerDecline, &[]);
            return;
        }
        request.rndv =
            Some(Box::new(ReqRndv { mem: None, total: total as usize, parts: Vec::new(), response }));
        if descs.is_empty() {
            // Only a response buffer: nothing to pull.
            let conn = request.conn.clone();
            return conn.dispatch(request);
        }
        if !self.rndv_begin(request, &descs, false) {
            // Not enough memory right now: it waits for other requests to give theirs back.
            bump(&self.counters.rndv.waited);
        }
    }

    /// Charges and allocates the memory of `request` and queues its READs. Returns false (and
    /// parks the request in `waiting`: at the back for a new one, at the front for one that came
    /// from there, `retried`) when the memory is in use by others.
    fn rndv_begin(&self, mut request: Request<D>, descs: &[DmaDescriptor], retried: bool) -> bool {
        let rndv = &self.rndv;
        let total = request.rndv.as_ref().map_or(0, |r| r.total);
        let fp = rndv.alloc.footprint(total) as u64;
        {
            let mut w = lock(&rndv.waiting);
            if (!retried && !w.is_empty()) || !rndv.try_charge(fp) {
                if retried {
                    w.push_front((request, descs.to_vec()));
                } else {
                    w.push_back((request, descs.to_vec()));
                }
                rndv.any_waiting.store(true, Ordering::Release);
                return false;
            }
        }
        let Some(mem) = RndvMem::allocate(&rndv.alloc, total) else {
            rndv.in_use.fetch_sub(fp, Ordering::AcqRel);
            bump(&self.counters.rndv.refused);
            let _ = request.reply_status(Status::ServerDecline, &[]);
            return true;
        };
        let mem = mem.charged(&rndv.in_use, fp);
        // One READ per chunk of each descriptor, into consecutive offsets of `mem`.
        let mut ops = Vec::new();
        let mut parts = Vec::with_capacity(descs.len());
        let mut at = 0usize;
        for d in descs {
            let len = d.size as usize;
            parts.push((at, len));
            for (o, l) in chunks(len, rndv.chunk) {
                let Ok(sge) = mem.region().sge(mem.offset() + at + o, l) else {
                    bump(&self.counters.rndv.refused);
                    let _ = request.reply_status(Status::ServerDecline, &[]);
                    return true;
                };
                let remote = RemoteAddr { addr: d.address + o as u64, key: RemoteKey::from_rkey(d.token) };
                ops.push((sge, remote));
            }
            at += len;
        }
        if let Some(r) = request.rndv.as_mut() {
            r.mem = Some(mem);
            r.parts = parts;
        }
        self.counters.rndv.bytes_read.fetch_add(total as u64, Ordering::Relaxed);
        let q = request.queue;
        let job = Arc::new(ReadJob {
            request: Mutex::new(Some(request)),
            unfinished: AtomicUsize::new(ops.len()),
            failed: AtomicBool::new(false),
        });
        {
            let mut st = lock(&rndv.queues[q]);
            rndv.pending.fetch_add(ops.len(), Ordering::AcqRel);
            for (sge, remote) in ops {
                st.fifo.push_back(Op::Read { job: job.clone(), sge, remote, q });
            }
        }
        self.rndv_pump(q);
        true
    }

    /// Retries requests waiting for memory, in order, as far as the memory allows.
    fn rndv_retry_waiting(&self) {
        if !self.rndv.any_waiting.load(Ordering::Acquire) {
            return;
        }
        loop {
            let next = {
                let mut w = lock(&self.rndv.waiting);
                let fits = w.front().is_some_and(|(r, _)| {
                    let total = r.rndv.as_ref().map_or(0, |x| x.total);
                    let fp = self.rndv.alloc.footprint(total) as u64;
                    self.rndv.in_use() + fp <= self.rndv.limit
                });
                let next = if fits { w.pop_front() } else { None };
                self.rndv.any_waiting.store(!w.is_empty(), Ordering::Release);
                next
            };
            let Some((request, descs)) = next else { return };
            if !self.rndv_begin(request, &descs, true) {
                return;
            }
        }
    }

    /// Posts what queue `q`'s FIFO holds, as far as the limits and free send contexts allow.
    pub(super) fn rndv_pump(&self, q: usize) {
        let rndv = &self.rndv;
        let mut done = Vec::new();
        {
            let mut st = lock(&rndv.queues[q]);
            loop {
                if st.fifo.is_empty() {
                    break;
                }
                if self.ep.check_ready(q).is_err() {
                    // The queue failed: nothing in its FIFO can be sent any more.
                    while let Some(op) = st.fifo.pop_front() {
                        rndv.pending.fetch_sub(1, Ordering::AcqRel);
                        if let Some(d) = abandon(op) {
                            done.push(d);
                        }
                    }
                    break;
                }
                let is_read = matches!(st.fifo.front(), Some(Op::Read { .. }));
                let is_rsp = matches!(st.fifo.front(), Some(Op::Rsp { .. }));
                if !is_rsp && (st.inflight >= rndv.op_limit || (is_read && st.reads >= rndv.rd_limit)) {
                    break;
                }
                let Ok(Some(tx)) = self.ep.get_tx(CallMode::EarlyRsp, 0) else { break };
                let Some(op) = st.fifo.pop_front() else {
                    self.drop_tx(tx);
                    break;
                };
                rndv.pending.fetch_sub(1, Ordering::AcqRel);
                match op {
                    Op::Rsp { job } => {
                        let ok = self.send_rndv_rsp(q, tx, &job);
                        if !ok {
                            bump(&self.counters.failed_replies);
                        }
                    }
                    Op::Read { ref sge, ref remote, .. } | Op::Write { ref sge, ref remote, .. } => {
                        let (sge, remote) = (*sge, *remote);
                        let kind = if is_read { SendOp::Read(remote) } else { SendOp::Write(remote) };
                        let index = tx.handle().index as usize;
                        // Counted before the op is in its slot: whoever takes it out of the slot
                        // (its completion, a failed post, the close) takes the count back.
                        rndv.posted.fetch_add(1, Ordering::Relaxed);
                        *lock(&rndv.slots[index]) = Some(op);
                        if let Err(Unposted { tx, .. }) = self.ep.post_op(q, tx, RNDV_TAG, kind, &[sge]) {
                            self.drop_tx(tx);
                            if let Some(op) = lock(&rndv.slots[index]).take() {
                                rndv.posted.fetch_sub(1, Ordering::Relaxed);
                                if let Some(d) = abandon(op) {
                                    done.push(d);
                                }
                            }
                        } else {
                            st.inflight += 1;
                            if is_read {
                                st.reads += 1;
                                self.counters
                                    .rndv
                                    .peak_reads
                                    .fetch_max(u64::from(st.reads), Ordering::Relaxed);
                            }
                        }
                    }
                }
            }
        }
        for d in done {
            self.rndv_finish(d);
        }
    }

    fn send_rndv_rsp(&self, q: usize, mut tx: TxToken, job: &WriteJob<D>) -> bool {
        let out = self.ep.send_buf(&mut tx);
        if job.header.encode(out).is_err() {
            self.drop_tx(tx);
            return false;
        }
        out[ResponseHeader::LEN..ResponseHeader::LEN + RNDV_PREFIX_LEN]
            .copy_from_slice(&job.written.to_le_bytes());
        match self.send(q, tx, ResponseHeader::LEN + RNDV_PREFIX_LEN) {
            Ok(()) => {
                bump(&self.counters.responses);
                true
            }
            Err(_) => false,
        }
    }

    /// A send completion of a tagged READ or WRITE (its context is already released).
    pub(super) fn rndv_completed(&self, index: u32, status: hal::Status) {
        let rndv = &self.rndv;
        if !status.is_ok() && status != hal::Status::Flushed {
            // Counted even if the connection closed meanwhile (the queue failed with it).
            bump(&self.counters.rndv.failed);
        }
        let Some(op) = rndv.slots.get(index as usize).and_then(|s| lock(s).take()) else { return };
        let (q, is_read) = match &op {
            Op::Read { q, .. } => (*q, true),
            Op::Write { q, .. } => (*q, false),
            Op::Rsp { .. } => return,
        };
        rndv.posted.fetch_sub(1, Ordering::Relaxed);
        let done = complete(op, status);
        {
            let mut st = lock(&rndv.queues[q]);
            st.inflight = st.inflight.saturating_sub(1);
            if is_read {
                st.reads = st.reads.saturating_sub(1);
            }
        }
        if let Some(d) = done {
            self.rndv_finish(d);
        }
        // Queues are pumped by `rndv_poll` after the completion batch.
    }

    fn rndv_finish(&self, d: Done<D>) {
        match d {
            Done::Read(job) => {
                let Some(request) = lock(&job.request).take() else { return };
                if job.failed.load(Ordering::Acquire) {
                    // The queue failed with the READ; the answer cannot reach the client there,
                    // but it releases everything the request holds.
                    let _ = request.reply_status(Status::HdrErr, &[]);
                } else {
                    let conn = request.conn.clone();
                    conn.dispatch(request);
                }
            }
            Done::Write(job) => drop(lock(&job.src).take()),
        }
        self.rndv_retry_waiting();
    }

    /// Every send-CQ poll: ops waiting for a free context (one load when there are none).
    pub(super) fn rndv_poll(&self) {
        if self.rndv.pending.load(Ordering::Acquire) > 0 {
            for q in 0..self.rndv.queues.len() {
                self.rndv_pump(q);
            }
        }
        self.rndv_retry_waiting();
    }

    /// The connection closed: drops every waiting request and queued operation (their memory
    /// goes back; outstanding work requests complete flushed, or never if nobody polls).
    pub(super) fn rndv_close(&self) {
        let waiting: Vec<_> = lock(&self.rndv.waiting).drain(..).collect();
        self.rndv.any_waiting.store(false, Ordering::Release);
        let mut ops = Vec::new();
        for m in self.rndv.queues.iter() {
            let mut st = lock(m);
            ops.extend(st.fifo.drain(..));
        }
        for s in self.rndv.slots.iter() {
            if let Some(op) = lock(s).take() {
                // Their completions find no op in the slot and take nothing back.
                self.rndv.posted.fetch_sub(1, Ordering::Relaxed);
                ops.push(op);
            }
        }
        self.rndv.pending.store(0, Ordering::Release);
        drop(ops);
        drop(waiting);
    }
}

/// An operation that will never be posted (or whose post failed).
fn abandon<D: Device + Clone>(op: Op<D>) -> Option<Done<D>> {
    complete(op, hal::Status::Flushed)
}

/// An operation ended with `status`; the job it finished, if it was the last one.
fn complete<D: Device + Clone>(op: Op<D>, status: hal::Status) -> Option<Done<D>> {
    match op {
        Op::Read { job, .. } => {
            if !status.is_ok() {
                job.failed.store(true, Ordering::Release);
            }
            (job.unfinished.fetch_sub(1, Ordering::AcqRel) == 1).then_some(Done::Read(job))
        }
        Op::Write { job, .. } => {
            (job.unfinished.fetch_sub(1, Ordering::AcqRel) == 1).then_some(Done::Write(job))
        }
        // An RSP that will not be sent: its WRITEs release the memory.
        Op::Rsp { .. } => None,
    }
}
