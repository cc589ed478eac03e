//! The Inline engine's wake-up handshake with a user about to sleep, for held ACKs (docs/sim.md,
//! "Held ACKs"), and the device lock / work-flag loop by which any thread reaches a device
//! another thread may be running. A user that arms a CQ and blocks on its event fd runs nothing
//! until the event fires, so an ACK it waits for must not stay where only a peer's next pass
//! would send it.
//!
//! - **Held ACKs.** A device pass that keeps its ACK back for the next pass (only while
//!   [`peer_may_wait`]: the ACK's receiver has no CQ armed) [`publish_hold`]s: it stores
//!   `acks_held`, fences, and asks again whether the peer may wait; if not, it sends at once.
//!   Arming (any CQ of the fabric) raises the NIC's armed count (`CqShared::arm`),
//!   [`arm_fence`]s, and scans every NIC with [`holds_acks`]; a NIC that holds is made to send
//!   (`Nic::release_held_acks`). A store-buffer (Dekker) pair: each side stores, fences, then
//!   loads what the other stores, so at least one side sees the other.
//! - **Reaching a device another thread runs.** Whoever must run a device (an arm that saw a
//!   NIC holding ACKs, a sender that must deliver now) raises its work flag and
//!   [`run_flagged`]s: the device lock is only tried, and its holder looks at the flag again
//!   after unlocking. (A SeqCst store and `try_lock` against an unlock and a SeqCst load: on x86
//!   every one of them is a locked instruction, and on AArch64 a release store is never passed
//!   by a later acquire load, so one side sees the other; the C++ model alone would not promise
//!   it, the failed `try_lock` being a relaxed read. loom, which gives a SeqCst load the latest
//!   SeqCst store, checks the loop's logic, not that point.)
//!
//! The production code calls these functions, and the loom models in
//! `loom-tests/tests/wake.rs` call the same functions (through `loom_api`), each with broken
//! twins: the mutants below take out one fence, the hold's second look, or the loop's.
//!
//! Fences rather than SeqCst loads and stores carry the ordering on the holder's side: the C++
//! model would order a SeqCst store before a SeqCst load as well, but loom models SeqCst only on
//! fences (it treats SeqCst accesses as acquire/release), so only the fenced form can be
//! checked. On x86 the cost is the same (`mov` + `mfence` instead of `xchg`).

use crate::sync::{self, fence, AtomicBool, AtomicU32, AtomicU8, Mutex, Ordering};

/// `Nic::acks_held`: the device holds no ACK back.
pub(crate) const HELD_NONE: u8 = 0;
/// `Nic::acks_held`: the device holds ACKs back.
pub(crate) const HELD: u8 = 1;
/// `Nic::acks_held`: the device holds ACKs back and a poll of the NIC's CQs came up empty.
pub(crate) const HELD_POLLED: u8 = 2;

/// Arming side (`Nic::on_arm`), after the NIC's armed count was raised (`CqShared::arm`) and
/// before it looks at the NICs holding ACKs.
#[inline]
pub(crate) fn arm_fence() {
    #[cfg(loom)]
    if crate::sync::mutation::active(crate::sync::mutation::Mutant::ArmNoFence) {
        return;
    }
    fence(Ordering::SeqCst);
}

/// Whether a plain ACK to a NIC whose armed count is `armed` may be held back
/// (`Wire::holds_acks` of the in-process wire): its user is not about to sleep.
#[inline]
pub(crate) fn peer_may_wait(armed: &AtomicU32) -> bool {
    armed.load(Ordering::SeqCst) == 0
}

/// Holder (`Nic::run_all`, device lock held), when its pass kept ACKs back: publishes that in
/// `flag` (`Nic::acks_held`), then asks `wanted_now` (which reads the peers' armed counts
/// again, [`peer_may_wait`]) whether they must go at once. True: the caller sends them and
/// clears `flag`. An arm counted before the fence is seen by `wanted_now`; one counted after
/// it sees `flag` in its scan ([`holds_acks`], behind its [`arm_fence`]).
#[inline]
pub(crate) fn publish_hold(flag: &AtomicU8, wanted_now: impl FnOnce() -> bool) -> bool {
    flag.store(HELD, Ordering::Relaxed);
    #[cfg(loom)]
    {
        use crate::sync::mutation::{active, Mutant};
        if active(Mutant::HoldNoRecheck) {
            return false;
        }
        if active(Mutant::HoldNoFence) {
            return wanted_now();
        }
    }
    fence(Ordering::SeqCst);
    wanted_now()
}

/// Arming side's scan (`FabricShared::release_held_acks`, after [`arm_fence`]): whether the NIC
/// whose flag this is holds ACKs back.
#[inline]
pub(crate) fn holds_acks(flag: &AtomicU8) -> bool {
    flag.load(Ordering::SeqCst) != HELD_NONE
}

/// Runs `pass` on the device behind `dev` on this thread while `work` is raised, unless another
/// thread holds the device, in which case that thread runs it: the holder reads `work` again
/// after unlocking, so a flag raised while it held the lock (by a thread whose `try_lock`
/// failed) is not lost. Returns false if it never got the lock. (`Nic::run_inline`.)
#[inline]
pub(crate) fn run_flagged<T>(dev: &Mutex<T>, work: &AtomicBool, mut pass: impl FnMut(&mut T)) -> bool {
    let mut got = false;
    loop {
        let Some(mut d) = sync::try_lock(dev) else { return got };
        got = true;
        while take_flag(work) {
            pass(&mut d);
        }
        drop(d);
        #[cfg(loom)]
        if crate::sync::mutation::active(crate::sync::mutation::Mutant::RunNoRecheck) {
            return true;
        }
        if !work.load(Ordering::SeqCst) {
            return true;
        }
    }
}

/// Lowers `work` and says whether it was raised (`run_flagged`'s loop): a load, and a swap only
/// if it reads raised.
///
/// A bare swap would do the same for the loop (swapping a lowered flag changes nothing, and a
/// flag raised after either look is caught by the SeqCst load after the unlock) and measured
/// the same (two-thread HAL and RPC round trips and rates, 7 rounds alternated), but loom cannot
/// check it: its RMW-atomicity bug (tokio-rs/loom#254: a store may slip between an RMW's read
/// and its write) reports a lost release the C++ model forbids. With a compare-exchange loom
/// passed the model but no longer caught `RunNoRecheck` (it never ran the other side's store
/// after a failed exchange), so it would not be checking the loop.
#[inline]
fn take_flag(work: &AtomicBool) -> bool {
    work.load(Ordering::Relaxed) && work.swap(false, Ordering::SeqCst)
}
