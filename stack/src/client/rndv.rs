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
//! with it (it replies only after its READs completed, and posts its WRITEs before the RSP). A
//! call that ends any other way (deadline, queue failure, close) may still have the server
//! reading or writing: its regions are then not reused but dropped (deregistered), so a late
//! transfer fails at the NIC instead of landing in another call's buffer.

use super::{ChannelInner, LocalRange};
use crate::conn::rndv::{token_of, RegionPool, RndvAllocator, RndvMem};
use crate::core::tx_ctx::{CallMode, TxHandle};
use crate::hal::{Access, Device, MemoryRegion};
use crate::sync::lock;
use crate::wire::{DmaDescriptor, RequestHeader, ResponseHeader, MAX_DMA_DESCRIPTORS, RNDV_PREFIX_LEN};
use crate::{CallOptions, RpcError};
use std::sync::atomic::{AtomicBool, Ordering};
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
        // SAFETY: the server posted its WRITEs into this buffer before the RSP, and RC delivers
        // the RSP only after they were placed; nothing writes the buffer any more (the server is
        // done with this call), and the buffer is ours until `self` drops.
        Ok(unsafe { mem.bytes(written) })
    }

    /// The call ended without a response: the server may still be moving data.
    pub(crate) fn poison(&mut self) {
        self.args.iter_mut().chain(self.response.iter_mut()).for_each(RndvMem::poison);
    }
}

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
        }
    }

    /// Bytes of rendezvous memory held by calls right now (0 when idle: nothing leaked).
    pub(crate) fn in_use(&self) -> u64 {
        self.pool.in_use()
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
        Ok(plan)
    }

    /// Allocates and fills the call's memory, writes its descriptors into `descs` and keeps the
    /// memory in context `h`'s slot. Returns the descriptor count and whether the last one is
    /// the response buffer.
    pub(crate) fn rndv_prepare(
        &self,
        h: TxHandle,
        opts: &CallOptions,
        plan: Plan,
        args: &Args<'_, '_, D::Region>,
        descs: &mut [DmaDescriptor; MAX_DMA_DESCRIPTORS],
    ) -> Result<(usize, bool), RpcError> {
        let len = args.len();
        let want_rsp = plan.response;
        let mut call = CallRndv { args: None, held: Vec::new(), response: None, response_cap: 0 };
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
        match args {
            Args::Bytes(bytes) if plan.args => {
                // With a response buffer too, one region serves both: a bypass server writes the
                // response only after it has READ every argument (it replies once its READs
                // completed), so the response may overwrite the argument copy. That halves the
                // memory (and the page faults) of large echo-like calls.
                let mem = RndvMem::allocate(&self.rndv.alloc, len.max(cap))
                    .ok_or(RpcError::WouldBlock("could not register memory for the rendezvous arguments"))?;
                // SAFETY: freshly allocated and not posted: ours alone.
                unsafe { mem.bytes_mut(len) }.copy_from_slice(bytes);
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

    /// Takes the rendezvous memory of context `h`'s call, if it has any (one load otherwise).
    pub(crate) fn rndv_take(&self, h: TxHandle) -> Option<CallRndv<D::Region>> {
        let slot = self.rndv.slots.get(h.index as usize)?;
        if !slot.active.load(Ordering::Acquire) || !slot.active.swap(false, Ordering::AcqRel) {
            return None;
        }
        lock(&slot.data).take()
    }
}
