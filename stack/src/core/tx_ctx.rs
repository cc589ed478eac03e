//! # tx_ctx: send contexts and their double release
//!
//! Every message the stack posts (a request, an ACK, a response) owns a *send context* from a
//! fixed-size [`TxSlab`] sized to the queue's send depth. A context may go back to the slab only
//! when nothing can touch it any more: its send completion has been polled (the device no longer
//! reads the send buffer) **and** every peer message the call mode waits for has arrived, in any
//! order, possibly on different threads. Error, timeout and flush paths must release it exactly
//! once too, and whatever reports an event for a context that has already been released (a late
//! timer, a flush after the response, a duplicate response) must be rejected, never applied to
//! the slot's next user. URPC does this with a 1-bit flag under the request slot's mutex; this
//! module does it lock-free, with one compare-exchange per event, so that loom can check this
//! exact code (`loom-tests`, built with `--cfg loom` through the crate-internal `sync` shim).
//!
//! ## Events per call mode
//!
//! | mode                         | peer sends    | required events before release |
//! |------------------------------|---------------|--------------------------------|
//! | [`CallMode::EarlyRsp`]       | nothing       | `SendCqe`                      |
//! | [`CallMode::WaitRsp`]        | RSP           | `SendCqe`, `Rsp`               |
//! | [`CallMode::Ack`]            | ACK, then RSP | `SendCqe`, `Ack`, `Rsp`        |
//! | [`CallMode::AckEarlyRsp`]    | ACK           | `SendCqe`, `Ack`               |
//!
//! Server responses (freed by their send completion alone) use [`CallMode::EarlyRsp`]. A peer
//! `ACK_AND_RSP` message is reported as `Ack` then `Rsp` (in `Ack` mode) or as `Rsp` alone (in
//! `WaitRsp` mode).
//!
//! ## State word
//!
//! Each slot has one `AtomicU64`: the slot's **generation** in the high 32 bits and these flags in
//! the low bits. Every transition is a single compare-exchange of the whole word, so the
//! generation check (stale handle?) and the state change are one atomic step.
//!
//! | bits | name         | meaning                                                              |
//! |------|--------------|----------------------------------------------------------------------|
//! | 0    | `SEND`       | send completion still pending                                        |
//! | 1    | `ACK`        | peer ACK still pending                                               |
//! | 2    | `RSP`        | peer RSP still pending                                               |
//! | 3    | `TERMINATED` | a terminal path ran: pending peer events are waived                  |
//! | 4    | `CLAIMED`    | the caller's completion has been claimed ([`TxSlab::claim_completion`]) |
//! | 5    | `LIVE`       | handed out by [`TxSlab::get`] and not yet released                   |
//! | 6    | `HELD`       | the claim winner still needs the slot ([`TxSlab::end_claim`] clears it) |
//! | 8-9  | mode         | the [`CallMode`] (to tell a duplicate from an unexpected event)      |
//!
//! ## Transitions
//!
//! A report carries a [`TxHandle`] `{index, generation}`; if the slot's word does not hold that
//! generation with `LIVE` set, the report is rejected with [`TxError::Stale`] and changes nothing.
//!
//! | report                              | precondition (else rejected)    | effect on flags             |
//! |-------------------------------------|---------------------------------|-----------------------------|
//! | `complete(SendCqe)`                 | `SEND` set                      | clear `SEND`                |
//! | `complete(Ack)` / `complete(Rsp)`   | required by mode, bit still set | clear that bit              |
//! | `fail(SendError)` / `fail(Flushed)` | `SEND` set                      | clear `SEND`, set `TERMINATED` |
//! | `fail(Timeout)` / `fail(Cancelled)` | `TERMINATED` clear              | set `TERMINATED`            |
//! | `claim_completion`                  | none                            | set `CLAIMED` and `HELD` (first wins) |
//! | `end_claim`                         | `HELD` set                      | clear `HELD`                |
//!
//! After computing the new flags, the **release condition** is
//!
//! ```text
//! SEND clear  AND  HELD clear  AND  (ACK and RSP clear  OR  TERMINATED)
//! ```
//!
//! If it holds, the same compare-exchange writes `generation + 1` with all flags clear (FREE)
//! instead of the new flags. Only one compare-exchange can move a word from generation `g` to
//! `g + 1`, so exactly one report releases the context, and from that instant every handle with
//! generation `g` is stale. The releasing call then reads the context's token, pushes the slot on
//! the free list itself and returns [`Outcome::Released`]; callers never put contexts back.
//!
//! ```text
//!                 get(mode, token)
//!   FREE(g) ───────────────────────────► LIVE(g): pending = required(mode)
//!      ▲                                   │   complete(ev):  pending -= ev
//!      │                                   │   fail(Timeout|Cancelled): TERMINATED
//!      │                                   │   fail(SendError|Flushed): pending -= SEND, TERMINATED
//!      │                                   │   claim_completion: CLAIMED (once)
//!      │                                   ▼
//!      │                 SEND done AND (peer events done OR TERMINATED)?
//!      │                         │ no: store new flags, Outcome::Pending
//!      │                         │ yes: same CAS stores FREE(g+1)
//!      │   push on free list     ▼
//!   FREE(g+1) ◄──────────── releaser ──► Outcome::Released { token }
//!
//!   any report with generation g after this point ──► TxError::Stale (counted, no effect)
//! ```
//!
//! **Why the send completion is never waived.** Until its send completion the device may still
//! read the send buffer, so a context released early could be reused while in flight. Every posted
//! send yields exactly one completion (success, error, or flush when the queue enters ERROR), so
//! waiting for it cannot leak. A timeout (or cancellation) therefore only waives the *peer*
//! events; an error or flushed send completion is both the send event and the terminal event.
//!
//! ## Delivering the caller's completion exactly once
//!
//! Releasing the context and completing the call are separate questions: a timeout may complete
//! the call while the send is still in flight, and a response may complete it while a flush is
//! still to come. [`TxSlab::claim_completion`] sets `CLAIMED` for the first caller only. Every
//! path that may complete the call claims **before** reporting its event:
//!
//! | path                                 | claims, then reports                    |
//! |--------------------------------------|-----------------------------------------|
//! | send completion, `EarlyRsp`          | `claim_completion`, `complete(SendCqe)` |
//! | ACK, `AckEarlyRsp`                   | `claim_completion`, `complete(Ack)`     |
//! | RSP, `WaitRsp` / `Ack`               | `claim_completion`, `complete(Rsp)`     |
//! | send completion with error / flush   | `claim_completion`, `fail(SendError)` or `fail(Flushed)` |
//! | timer, channel broken                | `claim_completion`, `fail(Timeout)` or `fail(Cancelled)` |
//!
//! (Which event completes the call in each mode is the stack's policy; the rows above are one
//! choice. The rule is only that a path claims before it reports.) With that order the context
//! cannot be released before some path has claimed it, so exactly one path delivers. A claim on an
//! already released context returns [`TxError::Stale`], which the caller treats like `Ok(false)`:
//! somebody else delivered.
//!
//! **A won claim holds the context.** The winner usually has more to do than report: it takes
//! the call's state (its sink, its request id) out of whatever the stack indexes by the slot.
//! Meanwhile the other events may arrive — a timer that won can see the send completion and the
//! response come in; a response that won can see a flush — and without a hold they would release
//! the context and let `get` hand the slot to the next call while the winner is still reading
//! it (loom-tests found exactly this). So `claim_completion` also sets `HELD`, the release
//! condition requires it clear, and the winner calls [`TxSlab::end_claim`] once it has taken what
//! it needs — the full protocol for a winner is *claim, take, `end_claim`, report*. `end_claim`
//! is itself a report: it releases the context if everything else is already done.
//!
//! ## Slab
//!
//! Free slots form the crate's lock-free free list (`free_list`): a Treiber stack of indices whose
//! head packs a 32-bit tag with the index, so a pop cannot succeed against a head that was popped
//! and pushed again in between (ABA). The slab allocates once, in [`TxSlab::new`]; `get` and the
//! releasing report take no lock and allocate nothing.
//!
//! Generations are 32 bits: a handle held across 2^32 reuses of the same slot would be taken for
//! current. Nothing holds a handle that long.

use crate::core::free_list::FreeList;
#[cfg(loom)]
use crate::sync::mutation::{self, Mutant};
use crate::sync::{AtomicU64, Ordering};

/// Largest capacity [`TxSlab::new`] accepts (16 Mi contexts).
pub const MAX_CAPACITY: usize = 1 << 24;

const SEND: u64 = 1 << 0;
const ACK: u64 = 1 << 1;
const RSP: u64 = 1 << 2;
const PEER: u64 = ACK | RSP;
const TERMINATED: u64 = 1 << 3;
const CLAIMED: u64 = 1 << 4;
const LIVE: u64 = 1 << 5;
const HELD: u64 = 1 << 6;
const MODE_SHIFT: u32 = 8;
const MODE_MASK: u64 = 0b11 << MODE_SHIFT;
const FLAGS: u64 = 0xFFFF_FFFF;
const GEN_SHIFT: u32 = 32;

/// The four URPC call modes, as far as the send context is concerned: which peer messages the
/// context waits for before it goes back to the slab.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CallMode {
    /// The call completes on the local send completion; the peer sends nothing.
    EarlyRsp,
    /// The peer sends a response; released after the send completion and the RSP.
    WaitRsp,
    /// The peer sends an ACK, then a response; released after the send completion, ACK and RSP.
    Ack,
    /// The peer sends an ACK only; released after the send completion and the ACK.
    AckEarlyRsp,
}

impl CallMode {
    /// All four modes, for tests and tables.
    pub const ALL: [CallMode; 4] =
        [CallMode::EarlyRsp, CallMode::WaitRsp, CallMode::Ack, CallMode::AckEarlyRsp];

    /// The events this mode waits for before the context is released, in their usual order.
    pub const fn required_events(self) -> &'static [Event] {
        match self {
            CallMode::EarlyRsp => &[Event::SendCqe],
            CallMode::WaitRsp => &[Event::SendCqe, Event::Rsp],
            CallMode::Ack => &[Event::SendCqe, Event::Ack, Event::Rsp],
            CallMode::AckEarlyRsp => &[Event::SendCqe, Event::Ack],
        }
    }

    /// Whether this mode waits for `event`.
    pub const fn requires(self, event: Event) -> bool {
        self.mask() & event.bit() != 0
    }

    const fn mask(self) -> u64 {
        match self {
            CallMode::EarlyRsp => SEND,
            CallMode::WaitRsp => SEND | RSP,
            CallMode::Ack => SEND | ACK | RSP,
            CallMode::AckEarlyRsp => SEND | ACK,
        }
    }

    const fn code(self) -> u64 {
        match self {
            CallMode::EarlyRsp => 0,
            CallMode::WaitRsp => 1,
            CallMode::Ack => 2,
            CallMode::AckEarlyRsp => 3,
        }
    }

    const fn from_flags(flags: u64) -> CallMode {
        match (flags & MODE_MASK) >> MODE_SHIFT {
            0 => CallMode::EarlyRsp,
            1 => CallMode::WaitRsp,
            2 => CallMode::Ack,
            _ => CallMode::AckEarlyRsp,
        }
    }
}

/// A normal event in a send context's life, reported with [`TxSlab::complete`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Event {
    /// The send completion of the context's message, with a success status. (An error or flush
    /// status is reported with [`TxSlab::fail`].)
    SendCqe,
    /// The peer's ACK for this request (or the ACK half of an `ACK_AND_RSP`).
    Ack,
    /// The peer's response for this request.
    Rsp,
}

impl Event {
    const fn bit(self) -> u64 {
        match self {
            Event::SendCqe => SEND,
            Event::Ack => ACK,
            Event::Rsp => RSP,
        }
    }
}

/// A terminal path, reported with [`TxSlab::fail`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailReason {
    /// The send completion arrived with an error status; no peer message is coming. Counts as the
    /// send event and waives the peer events, so it releases the context.
    SendError,
    /// The send completion arrived flushed (the queue entered ERROR). Same effect as
    /// [`FailReason::SendError`]; a flush after the response was delivered releases once and
    /// delivers nothing.
    Flushed,
    /// The request's timer fired. Waives the peer events; the context is released at once if the
    /// send completion was already seen, else by the send completion when it comes.
    Timeout,
    /// The call was abandoned for another reason (connection broken, channel closed). Same effect
    /// as [`FailReason::Timeout`].
    Cancelled,
}

/// Names one use of one slab slot. `Copy`; a handle whose context has been released is *stale*
/// and every report made with it is rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TxHandle {
    /// Slot index in the slab (`0..capacity`); suitable as a `wr_id` together with the generation.
    pub index: u32,
    /// The slot's generation when it was handed out; bumped by every release.
    pub generation: u32,
}

crate::core::handle::generational_handle!(TxHandle, "tx_ctx");

/// What a successful report did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[must_use = "a Released outcome carries the token whose resources must be freed"]
pub enum Outcome {
    /// The report was applied; the context still waits for other events.
    Pending,
    /// This report released the context: it is already back in the slab (the handle is now
    /// stale). `token` is the value given to [`TxSlab::get`]; free whatever it names.
    Released {
        /// The token stored by [`TxSlab::get`].
        token: u64,
    },
}

impl Outcome {
    /// Whether this report released the context.
    pub const fn is_released(&self) -> bool {
        matches!(self, Outcome::Released { .. })
    }
}

/// Why a slab operation was refused. Reports that are refused change nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TxError {
    /// [`TxSlab::new`] was asked for an empty or oversized slab.
    #[error("tx_ctx slab capacity {capacity} is out of range: use 1..={max} (the queue's send depth)")]
    InvalidCapacity {
        /// The capacity asked for.
        capacity: usize,
        /// [`MAX_CAPACITY`].
        max: usize,
    },
    /// The handle's index is outside the slab: it came from another slab or was corrupted.
    #[error("{handle} does not name a slot of this slab (capacity {capacity}); the report was dropped")]
    InvalidHandle {
        /// The rejected handle.
        handle: TxHandle,
        /// The slab's capacity.
        capacity: usize,
    },
    /// The context was already released (and may have been reused): a late timer, a flush after
    /// release, a response for a finished call. Nothing was changed.
    #[error("{handle} is stale: that context was already released and may be in use again; the report was dropped")]
    Stale {
        /// The rejected handle.
        handle: TxHandle,
    },
    /// [`TxSlab::end_claim`] on a context that no won claim holds (or whose hold already ended).
    #[error("{handle} is not held by a claim; end_claim dropped")]
    NotHeld {
        /// The rejected handle.
        handle: TxHandle,
    },
    /// The event was already reported for this context; it is not counted twice.
    #[error("duplicate {event:?} for {handle}: already reported, dropped")]
    Duplicate {
        /// The context.
        handle: TxHandle,
        /// The repeated event.
        event: Event,
    },
    /// The context's call mode does not wait for this event (e.g. an ACK for a `WaitRsp` call).
    #[error("{event:?} is not expected for {handle} in mode {mode:?}; dropped")]
    Unexpected {
        /// The context.
        handle: TxHandle,
        /// The unexpected event.
        event: Event,
        /// The context's call mode.
        mode: CallMode,
    },
    /// A second timeout or cancellation for a context that is already terminated.
    #[error("{handle} is already terminated; the {reason:?} was dropped")]
    AlreadyTerminated {
        /// The context.
        handle: TxHandle,
        /// The repeated terminal reason.
        reason: FailReason,
    },
}

/// A snapshot of the slab's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TxStats {
    /// Slots in the slab.
    pub capacity: usize,
    /// Contexts handed out and not yet released. Zero when idle: anything else is a leak.
    pub in_use: usize,
    /// Successful [`TxSlab::get`] calls.
    pub allocated: u64,
    /// [`TxSlab::get`] calls that found the slab empty.
    pub exhausted: u64,
    /// Contexts released (returned to the slab).
    pub released: u64,
    /// Terminal reports ([`TxSlab::fail`]) applied.
    pub failed: u64,
    /// Reports rejected because the handle was stale or invalid.
    pub stale: u64,
    /// Reports rejected as duplicates (same event twice, second timeout).
    pub duplicate: u64,
    /// Reports rejected because the mode does not wait for that event.
    pub unexpected: u64,
}

#[derive(Debug)]
struct Slot {
    /// `generation << 32 | flags`; see the module documentation.
    state: AtomicU64,
    /// Caller's token, written by `get`, read by the releaser.
    token: AtomicU64,
}

#[derive(Debug)]
struct Counters {
    allocated: AtomicU64,
    exhausted: AtomicU64,
    released: AtomicU64,
    failed: AtomicU64,
    stale: AtomicU64,
    duplicate: AtomicU64,
    unexpected: AtomicU64,
}

/// Why a state change was refused (internal; mapped to [`TxError`] with the handle).
enum Reject {
    Duplicate(Event),
    Unexpected(Event, CallMode),
    AlreadyTerminated(FailReason),
    NotHeld,
}

/// A fixed-capacity slab of send contexts with lock-free `get` and exactly-once release.
///
/// See the [module documentation](self) for the state machine and the protocol callers follow.
#[derive(Debug)]
pub struct TxSlab {
    slots: Box<[Slot]>,
    /// Indices of the free slots.
    free: FreeList,
    counters: Counters,
}

const fn pack(generation: u32, flags: u64) -> u64 {
    ((generation as u64) << GEN_SHIFT) | (flags & FLAGS)
}

const fn generation_of(word: u64) -> u32 {
    (word >> GEN_SHIFT) as u32
}

/// The release condition: send completion seen, and the peer events done or waived.
const fn releasable(flags: u64) -> bool {
    flags & SEND == 0 && flags & HELD == 0 && (flags & PEER == 0 || flags & TERMINATED != 0)
}

impl TxSlab {
    /// Creates a slab of `capacity` free contexts (normally the queue's send depth).
    pub fn new(capacity: usize) -> Result<TxSlab, TxError> {
        if capacity == 0 || capacity > MAX_CAPACITY {
            return Err(TxError::InvalidCapacity { capacity, max: MAX_CAPACITY });
        }
        let slots: Box<[Slot]> =
            (0..capacity).map(|_| Slot { state: AtomicU64::new(0), token: AtomicU64::new(0) }).collect();
        // MAX_CAPACITY is far below the free list's limit, so this never fails.
        let free = FreeList::new(capacity).ok_or(TxError::InvalidCapacity { capacity, max: MAX_CAPACITY })?;
        Ok(TxSlab {
            slots,
            free,
            counters: Counters {
                allocated: AtomicU64::new(0),
                exhausted: AtomicU64::new(0),
                released: AtomicU64::new(0),
                failed: AtomicU64::new(0),
                stale: AtomicU64::new(0),
                duplicate: AtomicU64::new(0),
                unexpected: AtomicU64::new(0),
            },
        })
    }

    /// Number of contexts in the slab.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Contexts handed out and not yet released.
    ///
    /// Counted as handed out less released (one counter each, so `get` and the release each
    /// make one atomic read-modify-write, not two). Read as `released` first (Acquire: it then
    /// sees the allocation of every release it counts), so it is never negative; like any
    /// snapshot of a slab in use it may be stale by the time it is read.
    pub fn in_use(&self) -> usize {
        let released = self.counters.released.load(Ordering::Acquire);
        let allocated = self.counters.allocated.load(Ordering::Relaxed);
        allocated.saturating_sub(released) as usize
    }

    /// A snapshot of the counters (each read individually; exact when the slab is quiescent).
    pub fn stats(&self) -> TxStats {
        let c = &self.counters;
        TxStats {
            capacity: self.slots.len(),
            in_use: self.in_use(),
            allocated: c.allocated.load(Ordering::Relaxed),
            exhausted: c.exhausted.load(Ordering::Relaxed),
            released: c.released.load(Ordering::Relaxed),
            failed: c.failed.load(Ordering::Relaxed),
            stale: c.stale.load(Ordering::Relaxed),
            duplicate: c.duplicate.load(Ordering::Relaxed),
            unexpected: c.unexpected.load(Ordering::Relaxed),
        }
    }

    /// Takes a free context for a call in `mode`, storing `token` (returned by the report that
    /// releases it). Returns `None` when every context is in use: the caller fails the call with
    /// an EAGAIN/`WouldBlock`-style error. Lock-free; allocates nothing.
    pub fn get(&self, mode: CallMode, token: u64) -> Option<TxHandle> {
        let Some(index) = self.free.pop() else {
            self.counters.exhausted.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        // `pop` only returns indices below `capacity`; `?` instead of indexing keeps this
        // panic-free even if that invariant were broken.
        let slot = self.slots.get(index as usize)?;
        // The slot is exclusively ours until the store below publishes it as LIVE: it is off the
        // free list and reports with an older generation fail their compare-exchange.
        slot.token.store(token, Ordering::Relaxed);
        let generation = generation_of(slot.state.load(Ordering::Relaxed));
        self.counters.allocated.fetch_add(1, Ordering::Relaxed);
        let flags = LIVE | (mode.code() << MODE_SHIFT) | mode.mask();
        slot.state.store(pack(generation, flags), Ordering::Release);
        Some(TxHandle { index, generation })
    }

    /// Reports a normal event. Exactly one report per context returns
    /// [`Outcome::Released`]; that call has already put the context back in the slab.
    ///
    /// Rejected (and counted, with no effect): a stale or invalid handle, an event already
    /// reported ([`TxError::Duplicate`]), an event the mode does not wait for
    /// ([`TxError::Unexpected`]). An `Ack`/`Rsp` arriving after a timeout but before the send
    /// completion is accepted and simply clears its bit.
    pub fn complete(&self, handle: TxHandle, event: Event) -> Result<Outcome, TxError> {
        let bit = event.bit();
        self.update(handle, |flags| {
            let mode = CallMode::from_flags(flags);
            if mode.mask() & bit == 0 {
                Err(Reject::Unexpected(event, mode))
            } else if flags & bit == 0 {
                Err(Reject::Duplicate(event))
            } else {
                Ok(flags & !bit)
            }
        })
    }

    /// Reports a terminal path: an error or flushed send completion, a timeout, a cancellation.
    /// Releases the context if the send completion is (now) done, otherwise leaves the release
    /// to the send completion; see [`FailReason`] for each reason's effect.
    ///
    /// Rejected (and counted, with no effect): a stale or invalid handle, an error/flush send
    /// completion after the send completion was already reported ([`TxError::Duplicate`]), a
    /// second timeout/cancellation ([`TxError::AlreadyTerminated`]).
    pub fn fail(&self, handle: TxHandle, reason: FailReason) -> Result<Outcome, TxError> {
        let outcome = self.update(handle, |flags| match reason {
            FailReason::SendError | FailReason::Flushed => {
                if flags & SEND == 0 {
                    Err(Reject::Duplicate(Event::SendCqe))
                } else {
                    Ok((flags & !SEND) | TERMINATED)
                }
            }
            FailReason::Timeout | FailReason::Cancelled => {
                if flags & TERMINATED != 0 {
                    Err(Reject::AlreadyTerminated(reason))
                } else {
                    Ok(flags | TERMINATED)
                }
            }
        })?;
        self.counters.failed.fetch_add(1, Ordering::Relaxed);
        Ok(outcome)
    }

    /// Claims the right to deliver the call's completion (success or error) to the caller.
    /// Returns `Ok(true)` to exactly one claimant per context and `Ok(false)` to later ones.
    /// `Err(Stale)` means the context is already released, so somebody else claimed it: treat it
    /// like `Ok(false)`.
    ///
    /// Claim *before* reporting the event that may release the context (see the module
    /// documentation), otherwise the claim can find the context already released.
    pub fn claim_completion(&self, handle: TxHandle) -> Result<bool, TxError> {
        let slot = self.slot(handle)?;
        let mut cur = slot.state.load(Ordering::Acquire);
        loop {
            if !Self::is_current(cur, handle) {
                return Err(self.stale(handle));
            }
            if cur & CLAIMED != 0 {
                return Ok(false);
            }
            // MUTANT (loom twin only, see `sync::mutation`): store instead of compare-exchange.
            #[cfg(loom)]
            if mutation::enabled(Mutant::TxClaimLoadStore) {
                slot.state.store(cur | CLAIMED | HELD, Ordering::Release);
                return Ok(true);
            }
            match slot.state.compare_exchange(cur, cur | CLAIMED | HELD, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Ok(true),
                Err(actual) => cur = actual,
            }
        }
    }

    /// Ends the hold that a won [`TxSlab::claim_completion`] put on the context: the winner calls
    /// it once it no longer needs the context (it has taken the call's state out of whatever is
    /// indexed by the slot). Until then the context is not released, whatever else is reported,
    /// so the slot cannot be reused under the winner's feet. Releases the context if everything
    /// else was already reported.
    ///
    /// Rejected (counted, no effect): a stale handle, or a context that is not held
    /// ([`TxError::NotHeld`]: no claim won, or the hold already ended).
    pub fn end_claim(&self, handle: TxHandle) -> Result<Outcome, TxError> {
        self.update(handle, |flags| if flags & HELD == 0 { Err(Reject::NotHeld) } else { Ok(flags & !HELD) })
    }

    /// [`TxSlab::end_claim`] and [`TxSlab::complete`]`(event)` in one compare-exchange: what a
    /// claim winner whose own event is `event` (a response, in `WaitRsp` mode) does once it has
    /// taken the call's state, saving one atomic read-modify-write per call. Exactly the two
    /// reports back to back, with nothing in between.
    ///
    /// Rejected (counted, no effect): a stale handle, a context that is not held
    /// ([`TxError::NotHeld`]), and — *the hold then stays*: call [`TxSlab::end_claim`] — an
    /// `event` the mode does not wait for ([`TxError::Unexpected`]) or already reported
    /// ([`TxError::Duplicate`]).
    pub fn end_claim_and_complete(&self, handle: TxHandle, event: Event) -> Result<Outcome, TxError> {
        let bit = event.bit();
        self.update(handle, |flags| {
            let mode = CallMode::from_flags(flags);
            if flags & HELD == 0 {
                Err(Reject::NotHeld)
            } else if mode.mask() & bit == 0 {
                Err(Reject::Unexpected(event, mode))
            } else if flags & bit == 0 {
                Err(Reject::Duplicate(event))
            } else {
                Ok(flags & !(HELD | bit))
            }
        })
    }

    /// The call mode of a live context (e.g. for the send-completion path to decide whether it
    /// completes the call). `Err(Stale)` if it was released.
    pub fn mode(&self, handle: TxHandle) -> Result<CallMode, TxError> {
        let slot = self.slot(handle)?;
        let cur = slot.state.load(Ordering::Acquire);
        if Self::is_current(cur, handle) {
            Ok(CallMode::from_flags(cur))
        } else {
            Err(self.stale(handle))
        }
    }

    /// Whether `handle` names a live context whose send completion is still pending (no
    /// `complete(SendCqe)` or `fail(SendError | Flushed)` yet). Read-only; a stale handle is
    /// `false` and is not counted as stale. The send event of a posted context is reported only
    /// by whoever polls the send CQ, so to that poller the answer cannot change under it.
    pub fn send_pending(&self, handle: TxHandle) -> bool {
        self.slots.get(handle.index as usize).is_some_and(|slot| {
            let cur = slot.state.load(Ordering::Acquire);
            Self::is_current(cur, handle) && cur & SEND != 0
        })
    }

    fn slot(&self, handle: TxHandle) -> Result<&Slot, TxError> {
        match self.slots.get(handle.index as usize) {
            Some(slot) => Ok(slot),
            None => {
                self.counters.stale.fetch_add(1, Ordering::Relaxed);
                Err(TxError::InvalidHandle { handle, capacity: self.slots.len() })
            }
        }
    }

    fn stale(&self, handle: TxHandle) -> TxError {
        self.counters.stale.fetch_add(1, Ordering::Relaxed);
        TxError::Stale { handle }
    }

    const fn is_current(word: u64, handle: TxHandle) -> bool {
        generation_of(word) == handle.generation && word & LIVE != 0
    }

    /// The one compare-exchange loop every report goes through: check the generation, compute
    /// the new flags, and either store them or — if the release condition holds — store the
    /// next generation, FREE, and release.
    fn update(&self, handle: TxHandle, f: impl Fn(u64) -> Result<u64, Reject>) -> Result<Outcome, TxError> {
        let slot = self.slot(handle)?;
        let mut cur = slot.state.load(Ordering::Acquire);
        loop {
            if !Self::is_current(cur, handle) {
                return Err(self.stale(handle));
            }
            let new_flags = match f(cur & FLAGS) {
                Ok(flags) => flags,
                Err(reject) => return Err(self.reject(handle, reject)),
            };
            let release = releasable(new_flags);
            // MUTANT (loom twin only, see `sync::mutation`): a won claim does not hold the context.
            #[cfg(loom)]
            let release =
                release || (mutation::enabled(Mutant::TxClaimNoHold) && releasable(new_flags & !HELD));
            let new = if release {
                pack(handle.generation.wrapping_add(1), 0)
            } else {
                pack(handle.generation, new_flags)
            };
            // AcqRel: the releaser must see everything every earlier reporter did to the context
            // (their reports are releases in this word's modification order), and `get` must see
            // the new generation before reuse (via the free list's release/acquire).
            // MUTANT (loom twin only, see `sync::mutation`): store instead of compare-exchange.
            #[cfg(loom)]
            if mutation::enabled(Mutant::TxReportLoadStore) {
                slot.state.store(new, Ordering::Release);
                return Ok(if release { self.release(handle.index, slot) } else { Outcome::Pending });
            }
            match slot.state.compare_exchange(cur, new, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) if release => return Ok(self.release(handle.index, slot)),
                Ok(_) => return Ok(Outcome::Pending),
                Err(actual) => cur = actual,
            }
        }
    }

    fn reject(&self, handle: TxHandle, reject: Reject) -> TxError {
        match reject {
            Reject::Duplicate(event) => {
                self.counters.duplicate.fetch_add(1, Ordering::Relaxed);
                TxError::Duplicate { handle, event }
            }
            Reject::AlreadyTerminated(reason) => {
                self.counters.duplicate.fetch_add(1, Ordering::Relaxed);
                TxError::AlreadyTerminated { handle, reason }
            }
            Reject::NotHeld => {
                self.counters.duplicate.fetch_add(1, Ordering::Relaxed);
                TxError::NotHeld { handle }
            }
            Reject::Unexpected(event, mode) => {
                self.counters.unexpected.fetch_add(1, Ordering::Relaxed);
                TxError::Unexpected { handle, event, mode }
            }
        }
    }

    /// Called by the one report whose compare-exchange moved the slot to the next generation:
    /// the slot is exclusively ours until it is on the free list again.
    fn release(&self, index: u32, slot: &Slot) -> Outcome {
        let token = slot.token.load(Ordering::Relaxed);
        // Release: pairs with `in_use`'s Acquire load (this slot's allocation, counted before
        // the state store `get` published and this report's compare-exchange acquired, is then
        // visible to the reader).
        self.counters.released.fetch_add(1, Ordering::Release);
        // Release (inside `push`): publishes the new generation and the token read to the popper.
        self.free.push(index);
        Outcome::Released { token }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool as StdBool, AtomicU32 as StdU32, AtomicU64 as StdU64};
    use std::sync::{Arc, Barrier, Mutex, RwLock};

    use crate::test_rng::Rng;

    fn permutations<T: Copy>(items: &[T]) -> Vec<Vec<T>> {
        if items.len() <= 1 {
            return vec![items.to_vec()];
        }
        let mut out = Vec::new();
        for i in 0..items.len() {
            let mut rest = items.to_vec();
            let first = rest.remove(i);
            for mut tail in permutations(&rest) {
                tail.insert(0, first);
                out.push(tail);
            }
        }
        out
    }

    fn slab(capacity: usize) -> TxSlab {
        TxSlab::new(capacity).expect("valid capacity")
    }

    /// The peer events a mode waits for, in wire order.
    fn peer_events(mode: CallMode) -> Vec<Event> {
        mode.required_events().iter().copied().filter(|e| *e != Event::SendCqe).collect()
    }

    /// The event whose path completes the call in the normal case.
    fn completing_event(mode: CallMode) -> Event {
        match mode {
            CallMode::EarlyRsp => Event::SendCqe,
            CallMode::WaitRsp | CallMode::Ack => Event::Rsp,
            CallMode::AckEarlyRsp => Event::Ack,
        }
    }

    #[test]
    fn every_event_order_releases_on_the_last_event() {
        for mode in CallMode::ALL {
            for order in permutations(mode.required_events()) {
                let s = slab(1);
                let h = s.get(mode, 42).expect("free slot");
                for (k, ev) in order.iter().enumerate() {
                    let out = s.complete(h, *ev).expect("expected event");
                    if k + 1 == order.len() {
                        assert_eq!(out, Outcome::Released { token: 42 }, "{mode:?} {order:?}");
                    } else {
                        assert_eq!(out, Outcome::Pending, "{mode:?} {order:?} at {k}");
                    }
                }
                assert_eq!(s.in_use(), 0);
                let st = s.stats();
                assert_eq!((st.allocated, st.released, st.stale, st.duplicate), (1, 1, 0, 0));
            }
        }
    }

    /// The merged report ends the hold and reports the event at once: it releases when the send
    /// completion came first, waits for it otherwise, and a refused event leaves the hold in
    /// place (the context is not released under the winner) until `end_claim`.
    #[test]
    fn end_claim_and_complete_is_end_claim_then_complete_in_one_step() {
        for send_first in [true, false] {
            let s = slab(1);
            let h = s.get(CallMode::WaitRsp, 9).expect("free slot");
            if send_first {
                assert_eq!(s.complete(h, Event::SendCqe), Ok(Outcome::Pending));
            }
            assert_eq!(s.claim_completion(h), Ok(true));
            let out = s.end_claim_and_complete(h, Event::Rsp);
            if send_first {
                assert_eq!(out, Ok(Outcome::Released { token: 9 }));
            } else {
                assert_eq!(out, Ok(Outcome::Pending));
                assert_eq!(s.end_claim(h), Err(TxError::NotHeld { handle: h }), "the hold ended");
                assert_eq!(
                    s.complete(h, Event::Rsp),
                    Err(TxError::Duplicate { handle: h, event: Event::Rsp })
                );
                assert_eq!(s.complete(h, Event::SendCqe), Ok(Outcome::Released { token: 9 }));
            }
            assert_eq!(s.in_use(), 0);
        }
        // Refused: an event the mode does not wait for; the hold stays.
        let s = slab(1);
        let h = s.get(CallMode::WaitRsp, 5).expect("free slot");
        assert_eq!(s.complete(h, Event::SendCqe), Ok(Outcome::Pending));
        assert_eq!(s.claim_completion(h), Ok(true));
        assert_eq!(
            s.end_claim_and_complete(h, Event::Ack),
            Err(TxError::Unexpected { handle: h, event: Event::Ack, mode: CallMode::WaitRsp })
        );
        assert_eq!(s.complete(h, Event::Rsp), Ok(Outcome::Pending), "held: not released under the winner");
        assert_eq!(s.end_claim(h), Ok(Outcome::Released { token: 5 }));
        // Not held: refused.
        let h = s.get(CallMode::WaitRsp, 6).expect("free slot");
        assert_eq!(s.end_claim_and_complete(h, Event::Rsp), Err(TxError::NotHeld { handle: h }));
    }

    #[test]
    fn duplicate_events_are_rejected_not_double_counted() {
        for mode in CallMode::ALL {
            for order in permutations(mode.required_events()) {
                let s = slab(1);
                let h = s.get(mode, 7).expect("free slot");
                for (k, ev) in order.iter().enumerate() {
                    let out = s.complete(h, *ev).expect("first report");
                    let again = s.complete(h, *ev);
                    if k + 1 == order.len() {
                        assert!(out.is_released());
                        assert_eq!(again, Err(TxError::Stale { handle: h }));
                    } else {
                        assert_eq!(out, Outcome::Pending);
                        assert_eq!(again, Err(TxError::Duplicate { handle: h, event: *ev }));
                    }
                }
                assert_eq!(s.in_use(), 0);
                let st = s.stats();
                assert_eq!(st.released, 1);
                assert_eq!(st.duplicate as usize, order.len() - 1);
                assert_eq!(st.stale, 1);
            }
        }
    }

    #[test]
    fn events_outside_the_mode_are_rejected() {
        let cases = [
            (CallMode::EarlyRsp, Event::Ack),
            (CallMode::EarlyRsp, Event::Rsp),
            (CallMode::WaitRsp, Event::Ack),
            (CallMode::AckEarlyRsp, Event::Rsp),
        ];
        for (mode, event) in cases {
            assert!(!mode.requires(event));
            let s = slab(1);
            let h = s.get(mode, 0).expect("free slot");
            assert_eq!(s.complete(h, event), Err(TxError::Unexpected { handle: h, event, mode }));
            assert_eq!(s.stats().unexpected, 1);
            // Nothing changed: the mode's own events still release it.
            let mut last = Outcome::Pending;
            for ev in mode.required_events() {
                last = s.complete(h, *ev).expect("required event");
            }
            assert!(last.is_released());
        }
    }

    #[test]
    fn stale_handle_after_release_is_rejected_and_reuse_is_unaffected() {
        let s = slab(1);
        let old = s.get(CallMode::EarlyRsp, 1).expect("free slot");
        assert_eq!(s.complete(old, Event::SendCqe), Ok(Outcome::Released { token: 1 }));
        let new = s.get(CallMode::WaitRsp, 2).expect("slot came back");
        assert_eq!(new.index, old.index);
        assert_eq!(new.generation, old.generation.wrapping_add(1));

        assert_eq!(s.complete(old, Event::SendCqe), Err(TxError::Stale { handle: old }));
        assert_eq!(s.fail(old, FailReason::Flushed), Err(TxError::Stale { handle: old }));
        assert_eq!(s.fail(old, FailReason::Timeout), Err(TxError::Stale { handle: old }));
        assert_eq!(s.claim_completion(old), Err(TxError::Stale { handle: old }));
        assert_eq!(s.mode(old), Err(TxError::Stale { handle: old }));
        assert_eq!(s.stats().stale, 5);

        // The new user of the slot saw none of it.
        assert_eq!(s.mode(new), Ok(CallMode::WaitRsp));
        assert_eq!(s.complete(new, Event::SendCqe), Ok(Outcome::Pending));
        assert_eq!(s.claim_completion(new), Ok(true));
        assert_eq!(s.end_claim(new), Ok(Outcome::Pending));
        assert_eq!(s.complete(new, Event::Rsp), Ok(Outcome::Released { token: 2 }));
        assert_eq!(s.in_use(), 0);
    }

    #[test]
    fn invalid_handles_and_capacities_are_errors() {
        let s = slab(2);
        let bogus = TxHandle { index: 5, generation: 0 };
        assert_eq!(
            s.complete(bogus, Event::SendCqe),
            Err(TxError::InvalidHandle { handle: bogus, capacity: 2 })
        );
        assert!(s.fail(TxHandle::from_u64(u64::MAX), FailReason::Timeout).is_err());
        assert!(s.claim_completion(bogus).is_err());
        // A never-handed-out slot is stale, not live.
        let never = TxHandle { index: 1, generation: 0 };
        assert_eq!(s.complete(never, Event::SendCqe), Err(TxError::Stale { handle: never }));
        assert_eq!(s.stats().stale, 4);

        assert!(matches!(TxSlab::new(0), Err(TxError::InvalidCapacity { capacity: 0, .. })));
        assert!(matches!(TxSlab::new(MAX_CAPACITY + 1), Err(TxError::InvalidCapacity { .. })));
        let msg = TxError::Stale { handle: never }.to_string();
        assert!(msg.contains("stale") && msg.contains("#1"), "{msg}");
    }

    #[test]
    fn handle_round_trips_through_u64() {
        let h = TxHandle { index: 0xDEAD, generation: 0xBEEF_0001 };
        assert_eq!(TxHandle::from_u64(h.to_u64()), h);
        assert_eq!(TxHandle::from(u64::from(h)), h);
    }

    #[test]
    fn timeout_before_response() {
        // Send still in flight: the timeout completes the call but cannot release the context.
        let s = slab(1);
        let h = s.get(CallMode::WaitRsp, 9).expect("free slot");
        assert_eq!(s.claim_completion(h), Ok(true));
        assert_eq!(s.end_claim(h), Ok(Outcome::Pending));
        assert_eq!(s.fail(h, FailReason::Timeout), Ok(Outcome::Pending));
        assert_eq!(s.claim_completion(h), Ok(false)); // the late response does not deliver
        assert_eq!(s.complete(h, Event::Rsp), Ok(Outcome::Pending));
        assert_eq!(s.complete(h, Event::SendCqe), Ok(Outcome::Released { token: 9 }));
        assert_eq!(s.in_use(), 0);

        // Send already completed: the timeout releases at once; the late response is stale.
        let h = s.get(CallMode::WaitRsp, 10).expect("free slot");
        assert_eq!(s.complete(h, Event::SendCqe), Ok(Outcome::Pending));
        assert_eq!(s.claim_completion(h), Ok(true));
        assert_eq!(s.end_claim(h), Ok(Outcome::Pending));
        assert_eq!(s.fail(h, FailReason::Timeout), Ok(Outcome::Released { token: 10 }));
        assert_eq!(s.claim_completion(h), Err(TxError::Stale { handle: h }));
        assert_eq!(s.complete(h, Event::Rsp), Err(TxError::Stale { handle: h }));
        // The send completion is never waived: a timeout before it, then a flush, releases once.
        let h = s.get(CallMode::Ack, 11).expect("free slot");
        assert_eq!(s.fail(h, FailReason::Timeout), Ok(Outcome::Pending));
        assert_eq!(s.fail(h, FailReason::Flushed), Ok(Outcome::Released { token: 11 }));
        let st = s.stats();
        assert_eq!((st.in_use, st.released, st.failed), (0, 3, 4));
    }

    #[test]
    fn a_won_claim_holds_the_context_until_end_claim() {
        let s = slab(1);
        // The timer wins; the send completion and the response come in before it is done.
        let h = s.get(CallMode::WaitRsp, 7).expect("free slot");
        assert_eq!(s.claim_completion(h), Ok(true));
        assert_eq!(s.complete(h, Event::SendCqe), Ok(Outcome::Pending));
        assert_eq!(s.complete(h, Event::Rsp), Ok(Outcome::Pending), "held: not released");
        assert_eq!(s.get(CallMode::WaitRsp, 8), None, "the slot is not handed out again");
        assert_eq!(s.end_claim(h), Ok(Outcome::Released { token: 7 }));
        assert_eq!(s.fail(h, FailReason::Timeout), Err(TxError::Stale { handle: h }));
        // A response wins; a flush comes before it ends its hold.
        let h = s.get(CallMode::WaitRsp, 9).expect("free slot");
        assert_eq!(s.claim_completion(h), Ok(true));
        assert_eq!(s.fail(h, FailReason::Flushed), Ok(Outcome::Pending));
        assert_eq!(s.end_claim(h), Ok(Outcome::Released { token: 9 }));
        // end_claim without a won claim, or twice, is refused.
        let h = s.get(CallMode::WaitRsp, 10).expect("free slot");
        assert_eq!(s.end_claim(h), Err(TxError::NotHeld { handle: h }));
        assert_eq!(s.claim_completion(h), Ok(true));
        assert_eq!(s.end_claim(h), Ok(Outcome::Pending));
        assert_eq!(s.end_claim(h), Err(TxError::NotHeld { handle: h }));
        assert_eq!(s.fail(h, FailReason::Flushed), Ok(Outcome::Released { token: 10 }));
        assert_eq!(s.in_use(), 0);
    }

    #[test]
    fn timeout_after_response() {
        let s = slab(1);
        // Response before the send completion, then the timer fires before the send completes.
        let h = s.get(CallMode::WaitRsp, 1).expect("free slot");
        assert_eq!(s.claim_completion(h), Ok(true));
        assert_eq!(s.end_claim(h), Ok(Outcome::Pending));
        assert_eq!(s.complete(h, Event::Rsp), Ok(Outcome::Pending));
        assert_eq!(s.claim_completion(h), Ok(false));
        assert_eq!(s.fail(h, FailReason::Timeout), Ok(Outcome::Pending));
        assert_eq!(s.complete(h, Event::SendCqe), Ok(Outcome::Released { token: 1 }));
        // Everything done before the timer: the timer finds a stale handle.
        let h = s.get(CallMode::WaitRsp, 2).expect("free slot");
        assert_eq!(s.complete(h, Event::SendCqe), Ok(Outcome::Pending));
        assert_eq!(s.claim_completion(h), Ok(true));
        assert_eq!(s.end_claim(h), Ok(Outcome::Pending));
        assert!(s.complete(h, Event::Rsp).expect("rsp").is_released());
        assert_eq!(s.claim_completion(h), Err(TxError::Stale { handle: h }));
        assert_eq!(s.fail(h, FailReason::Timeout), Err(TxError::Stale { handle: h }));
        assert_eq!(s.in_use(), 0);
    }

    #[test]
    fn flush_after_response_releases_exactly_once() {
        let s = slab(1);
        let h = s.get(CallMode::WaitRsp, 5).expect("free slot");
        assert_eq!(s.claim_completion(h), Ok(true));
        assert_eq!(s.end_claim(h), Ok(Outcome::Pending));
        assert_eq!(s.complete(h, Event::Rsp), Ok(Outcome::Pending));
        assert_eq!(s.claim_completion(h), Ok(false)); // the flush path does not deliver again
        assert_eq!(s.fail(h, FailReason::Flushed), Ok(Outcome::Released { token: 5 }));
        assert_eq!(s.fail(h, FailReason::Flushed), Err(TxError::Stale { handle: h }));
        let st = s.stats();
        assert_eq!((st.in_use, st.released), (0, 1));
    }

    #[test]
    fn send_error_releases_at_once_and_only_once() {
        let s = slab(1);
        let h = s.get(CallMode::Ack, 3).expect("free slot");
        assert_eq!(s.claim_completion(h), Ok(true));
        assert_eq!(s.end_claim(h), Ok(Outcome::Pending));
        assert_eq!(s.fail(h, FailReason::SendError), Ok(Outcome::Released { token: 3 }));
        assert_eq!(s.complete(h, Event::Ack), Err(TxError::Stale { handle: h }));

        // An error completion after a successful one is a duplicate send event.
        let h = s.get(CallMode::WaitRsp, 4).expect("free slot");
        assert_eq!(s.complete(h, Event::SendCqe), Ok(Outcome::Pending));
        assert_eq!(
            s.fail(h, FailReason::SendError),
            Err(TxError::Duplicate { handle: h, event: Event::SendCqe })
        );
        // A second timeout is rejected; the first one released (the send was done).
        assert_eq!(s.fail(h, FailReason::Cancelled), Ok(Outcome::Released { token: 4 }));
        let h = s.get(CallMode::WaitRsp, 5).expect("free slot");
        assert_eq!(s.fail(h, FailReason::Timeout), Ok(Outcome::Pending));
        assert_eq!(
            s.fail(h, FailReason::Timeout),
            Err(TxError::AlreadyTerminated { handle: h, reason: FailReason::Timeout })
        );
        assert!(s.complete(h, Event::SendCqe).expect("send").is_released());
        let st = s.stats();
        assert_eq!((st.in_use, st.released, st.duplicate), (0, 3, 2));
    }

    #[test]
    fn exhaustion_returns_none_until_a_release() {
        let s = slab(3);
        let hs: Vec<TxHandle> = (0..3).map(|i| s.get(CallMode::EarlyRsp, i).expect("free slot")).collect();
        let mut idx: Vec<u32> = hs.iter().map(|h| h.index).collect();
        idx.sort_unstable();
        assert_eq!(idx, [0, 1, 2]);
        assert_eq!(s.get(CallMode::WaitRsp, 9), None);
        assert_eq!(s.get(CallMode::WaitRsp, 9), None);
        let st = s.stats();
        assert_eq!((st.in_use, st.exhausted), (3, 2));
        assert_eq!(s.complete(hs[1], Event::SendCqe), Ok(Outcome::Released { token: 1 }));
        let again = s.get(CallMode::WaitRsp, 9).expect("released slot");
        assert_eq!(again.index, hs[1].index);
        assert_eq!(s.get(CallMode::WaitRsp, 9), None);
    }

    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Action {
        Send { ok: bool },
        Peer(Event),
        Timeout,
    }

    /// Runs one action with the documented claim-then-report protocol. Returns (released, claimed).
    fn run_action(
        s: &TxSlab,
        h: TxHandle,
        mode: CallMode,
        a: Action,
        rng: &mut Rng,
    ) -> Result<(bool, bool), String> {
        // A winner takes its state, then ends its hold (which may release the context if every
        // other event came meanwhile), then reports its own event.
        let mut hold_released = false;
        let mut claim = |s: &TxSlab| match s.claim_completion(h) {
            Ok(true) => match s.end_claim(h) {
                Ok(out) => {
                    hold_released = out.is_released();
                    Ok(true)
                }
                Err(e) => Err(format!("end_claim: {e}")),
            },
            Ok(false) => Ok(false),
            Err(TxError::Stale { .. }) => Ok(false),
            Err(e) => Err(format!("claim: {e}")),
        };
        let (claimed, result) = match a {
            Action::Send { ok: true } => {
                let won = if mode == CallMode::EarlyRsp { claim(s)? } else { false };
                (won, s.complete(h, Event::SendCqe))
            }
            Action::Send { ok: false } => {
                let won = claim(s)?;
                let reason = if rng.percent(50) { FailReason::SendError } else { FailReason::Flushed };
                let r = s.fail(h, reason);
                // It releases unless another path's claim still holds the context (then that
                // path's end_claim releases it).
                if won && r.map(|o| o.is_released()) != Ok(true) {
                    return Err(format!("error send completion must release, got {r:?}"));
                }
                (won, r)
            }
            Action::Peer(ev) => {
                let won = if ev == completing_event(mode) { claim(s)? } else { false };
                (won, s.complete(h, ev))
            }
            Action::Timeout => {
                let won = claim(s)?;
                (won, s.fail(h, FailReason::Timeout))
            }
        };
        match result {
            Ok(out) => Ok((out.is_released() || hold_released, claimed)),
            Err(TxError::Stale { .. }) if hold_released => Ok((true, claimed)),
            // Only peer events and timers may find the context gone: the send completion is
            // never waived, so nothing can release before it.
            Err(TxError::Stale { .. }) if !matches!(a, Action::Send { .. }) => Ok((false, claimed)),
            Err(e) => Err(format!("{a:?}: {e}")),
        }
    }

    #[test]
    fn every_order_of_every_path_releases_and_claims_once() {
        let mut rng = Rng(0x7C7C);
        let s = slab(1);
        let mut scenarios = 0;
        for mode in CallMode::ALL {
            let peers = peer_events(mode);
            for send_ok in [true, false] {
                for timeout in [false, true] {
                    for delivered_mask in 0..(1u32 << peers.len()) {
                        let mut actions = vec![Action::Send { ok: send_ok }];
                        let mut all_delivered = true;
                        for (i, ev) in peers.iter().enumerate() {
                            if delivered_mask & (1 << i) != 0 {
                                actions.push(Action::Peer(*ev));
                            } else {
                                all_delivered = false;
                            }
                        }
                        if timeout {
                            actions.push(Action::Timeout);
                        }
                        let terminates = !send_ok || timeout || all_delivered;
                        for order in permutations(&actions) {
                            scenarios += 1;
                            let h = s.get(mode, 77).expect("free slot");
                            let (mut releases, mut claims) = (0, 0);
                            for a in &order {
                                let (r, c) = run_action(&s, h, mode, *a, &mut rng)
                                    .unwrap_or_else(|e| panic!("{mode:?} {order:?}: {e}"));
                                releases += usize::from(r);
                                claims += usize::from(c);
                            }
                            if terminates {
                                assert_eq!((releases, claims), (1, 1), "{mode:?} {order:?}");
                                assert_eq!(s.in_use(), 0, "{mode:?} {order:?}");
                            } else {
                                // Nobody terminated the call: it must stay live, not be freed.
                                assert_eq!(releases, 0, "{mode:?} {order:?}");
                                assert_eq!(s.in_use(), 1);
                                assert_eq!(
                                    s.fail(h, FailReason::Cancelled).map(|o| o.is_released()),
                                    Ok(true)
                                );
                            }
                        }
                    }
                }
            }
        }
        let st = s.stats();
        assert_eq!((st.duplicate, st.unexpected, st.in_use), (0, 0, 0));
        assert!(scenarios > 100, "{scenarios}");
    }

    #[derive(Debug, Clone, Copy)]
    struct Job {
        handle: TxHandle,
        mode: CallMode,
        send_ok: bool,
        /// Which of the mode's peer events (in wire order) the peer delivers.
        delivered: [bool; 2],
        timeout: bool,
        token: u64,
    }

    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Role {
        Send,
        Peer,
        Timer,
    }

    struct Shared {
        slab: TxSlab,
        jobs: RwLock<Vec<Job>>,
        start: Barrier,
        end: Barrier,
        stop: StdBool,
        released: Vec<StdU32>,
        claimed: Vec<StdU32>,
        token: Vec<StdU64>,
        errors: Mutex<Vec<String>>,
    }

    fn worker(sh: &Shared, role: Role, seed: u64) {
        let mut rng = Rng(seed);
        loop {
            sh.start.wait();
            if sh.stop.load(std::sync::atomic::Ordering::SeqCst) {
                return;
            }
            {
                let jobs = sh.jobs.read().unwrap_or_else(|e| e.into_inner());
                let mut order: Vec<usize> = (0..jobs.len()).collect();
                match rng.below(3) {
                    0 => {}
                    1 => order.reverse(),
                    _ => rng.shuffle(&mut order),
                }
                for i in order {
                    let job = jobs[i];
                    let actions: Vec<Action> = match role {
                        Role::Send => vec![Action::Send { ok: job.send_ok }],
                        Role::Peer => peer_events(job.mode)
                            .into_iter()
                            .zip(job.delivered)
                            .filter(|(_, d)| *d)
                            .map(|(ev, _)| Action::Peer(ev))
                            .collect(),
                        Role::Timer if job.timeout => vec![Action::Timeout],
                        Role::Timer => vec![],
                    };
                    for a in actions {
                        match run_action(&sh.slab, job.handle, job.mode, a, &mut rng) {
                            Ok((released, claimed)) => {
                                let k = job.handle.index as usize;
                                if released {
                                    sh.released[k].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                    sh.token[k].store(job.token, std::sync::atomic::Ordering::Relaxed);
                                }
                                if claimed {
                                    sh.claimed[k].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                }
                            }
                            Err(e) => sh
                                .errors
                                .lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .push(format!("{job:?}: {e}")),
                        }
                    }
                }
            }
            sh.end.wait();
        }
    }

    #[test]
    fn stress_send_response_timeout_race_exactly_once() {
        const ROUNDS: usize = 1000;
        const BATCH: usize = 256;
        const SEED: u64 = 0x00C0_FFEE_D00D;
        let sh = Arc::new(Shared {
            slab: slab(BATCH),
            jobs: RwLock::new(Vec::new()),
            start: Barrier::new(4),
            end: Barrier::new(4),
            stop: StdBool::new(false),
            released: (0..BATCH).map(|_| StdU32::new(0)).collect(),
            claimed: (0..BATCH).map(|_| StdU32::new(0)).collect(),
            token: (0..BATCH).map(|_| StdU64::new(0)).collect(),
            errors: Mutex::new(Vec::new()),
        });
        let workers: Vec<_> = [Role::Send, Role::Peer, Role::Timer]
            .into_iter()
            .enumerate()
            .map(|(i, role)| {
                let sh = Arc::clone(&sh);
                std::thread::spawn(move || worker(&sh, role, SEED ^ ((i as u64 + 1) * 0x1000_0001)))
            })
            .collect();

        let mut rng = Rng(SEED);
        let mut failures = Vec::new();
        for round in 0..ROUNDS {
            let mut jobs = Vec::with_capacity(BATCH);
            for i in 0..BATCH {
                let mode = CallMode::ALL[rng.below(4)];
                let token = ((round as u64) << 32) | i as u64;
                let Some(handle) = sh.slab.get(mode, token) else {
                    failures.push(format!("round {round}: slab exhausted at {i}: a context leaked"));
                    break;
                };
                let n_peer = peer_events(mode).len();
                let delivered = [rng.percent(80), rng.percent(80)];
                let all = delivered[..n_peer].iter().all(|d| *d);
                jobs.push(Job {
                    handle,
                    mode,
                    send_ok: rng.percent(85),
                    delivered,
                    timeout: !all || rng.percent(30),
                    token,
                });
            }
            if !failures.is_empty() {
                break;
            }
            for k in 0..BATCH {
                sh.released[k].store(0, std::sync::atomic::Ordering::Relaxed);
                sh.claimed[k].store(0, std::sync::atomic::Ordering::Relaxed);
            }
            *sh.jobs.write().unwrap_or_else(|e| e.into_inner()) = jobs.clone();
            sh.start.wait();
            sh.end.wait();
            for job in &jobs {
                let k = job.handle.index as usize;
                let r = sh.released[k].load(std::sync::atomic::Ordering::Relaxed);
                let c = sh.claimed[k].load(std::sync::atomic::Ordering::Relaxed);
                let t = sh.token[k].load(std::sync::atomic::Ordering::Relaxed);
                if r != 1 || c != 1 || t != job.token {
                    failures
                        .push(format!("round {round} {job:?}: released {r}x, claimed {c}x, token {t:#x}"));
                }
            }
            if sh.slab.in_use() != 0 {
                failures.push(format!("round {round}: {} contexts leaked", sh.slab.in_use()));
            }
            if !failures.is_empty() || !sh.errors.lock().unwrap_or_else(|e| e.into_inner()).is_empty() {
                break;
            }
        }
        sh.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        sh.start.wait();
        for w in workers {
            w.join().expect("worker panicked");
        }
        let errors = sh.errors.lock().unwrap_or_else(|e| e.into_inner()).clone();
        assert!(errors.is_empty(), "seed {SEED:#x}: {:?}", &errors[..errors.len().min(5)]);
        assert!(failures.is_empty(), "seed {SEED:#x}: {:?}", &failures[..failures.len().min(5)]);
        let st = sh.slab.stats();
        assert_eq!(st.in_use, 0);
        assert_eq!(st.released, (ROUNDS * BATCH) as u64);
        assert_eq!(st.allocated, st.released);
        assert_eq!((st.duplicate, st.unexpected), (0, 0));
    }

    #[test]
    fn stress_get_and_release_never_hands_out_a_slot_twice() {
        use std::sync::atomic::Ordering as O;
        const THREADS: usize = 4;
        const ITERS: usize = 400_000;
        const CAPACITY: usize = 4;
        let s = Arc::new(slab(CAPACITY));
        let owner: Arc<Vec<StdU32>> = Arc::new((0..CAPACITY).map(|_| StdU32::new(0)).collect());
        let start = Arc::new(Barrier::new(THREADS));
        let threads: Vec<_> = (0..THREADS)
            .map(|t| {
                let (s, owner, start) = (Arc::clone(&s), Arc::clone(&owner), Arc::clone(&start));
                std::thread::spawn(move || -> Result<usize, String> {
                    let me = t as u32 + 1;
                    let mut rng = Rng(0xABA0 + t as u64);
                    let mut previous: Option<TxHandle> = None;
                    let mut held: Vec<(TxHandle, u64)> = Vec::with_capacity(2);
                    let mut got = 0;
                    start.wait();
                    for i in 0..ITERS {
                        // Hold one or two contexts and release them in either order: a pop
                        // interrupted by "pop A, pop B, push A" elsewhere is the ABA case.
                        let want = 1 + rng.below(2);
                        for j in 0..want {
                            let token = ((t as u64) << 40) | ((i as u64) << 1) | j as u64;
                            let Some(h) = s.get(CallMode::EarlyRsp, token) else { break };
                            got += 1;
                            if let Err(other) =
                                owner[h.index as usize].compare_exchange(0, me, O::AcqRel, O::Acquire)
                            {
                                return Err(format!(
                                    "slot {} handed to {me} while owned by {other}",
                                    h.index
                                ));
                            }
                            held.push((h, token));
                        }
                        if held.len() == 2 && rng.percent(50) {
                            held.swap(0, 1);
                        }
                        // A report with an old handle must bounce off the reused slot.
                        if let Some(p) = previous {
                            if rng.percent(20)
                                && s.complete(p, Event::SendCqe) != Err(TxError::Stale { handle: p })
                            {
                                return Err(format!("stale {p} was not rejected"));
                            }
                        }
                        for (h, token) in held.drain(..) {
                            owner[h.index as usize].store(0, O::Release);
                            match s.complete(h, Event::SendCqe) {
                                Ok(Outcome::Released { token: back }) if back == token => {}
                                other => return Err(format!("release of {h} gave {other:?}")),
                            }
                            previous = Some(h);
                        }
                    }
                    Ok(got)
                })
            })
            .collect();
        let mut total = 0;
        for t in threads {
            total += t.join().expect("thread panicked").expect("ownership violated");
        }
        let st = s.stats();
        assert_eq!(st.in_use, 0);
        assert_eq!(st.allocated as usize, total);
        assert_eq!(st.released as usize, total);
        assert_eq!(st.duplicate, 0);
    }
}
