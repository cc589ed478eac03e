//! The UDP wire's receive handoff: who reads a NIC's socket, and when (docs/sim.md, "The UDP
//! wire", "Receiving").
//!
//! Reading is the device's: [`UdpPort::drain`](crate::udp) runs under the NIC's device lock, so
//! one thread at a time reads and packets are handled in the socket's order. Whether datagrams
//! wait cannot be told without a system call, so reads are *asked for*, and the device reads
//! while a read is asked for and not yet found the socket empty:
//!
//! - every poll of the NIC's CQs asks (a busy-polling user reads the socket itself, with no
//!   thread in between);
//! - the port's receive thread asks when datagrams arrive while nobody polls (it then waits on
//!   the socket), and has the device run.
//!
//! Two counters make the handoff ([`RxHandoff::ask`], [`RxHandoff::read`]): `want`, raised by
//! each ask, and `took`, the value of `want` a drain read *before* it found the socket empty.
//! A read is pending while they differ. An ask made after a datagram arrived is therefore never
//! lost: either the drain that found the socket empty read `want` after the ask (so it ran its
//! read after the arrival, and saw the datagram), or `took` stays behind `want` and the device
//! reads again.
//!
//! The receive thread sleeps without watching the socket while the user polls (no wake-ups at
//! all then), so a user that goes to sleep must make it watch: arming a CQ calls
//! [`RxHandoff::attention`], which rings the thread's bell if it is sleeping on its tick, and
//! the thread raises its `ticking` flag before it looks at the armed count
//! ([`RxHandoff::may_tick`]). Each side fences between its store and its load, so at least one
//! sees the other: the lost wake-up (the thread decides to tick just as the user arms and
//! sleeps, and a packet waits a tick or forever) cannot happen. The loom models in
//! `loom-tests/tests/udp_handoff.rs` check both protocols, each with its broken twin.

use crate::sync::{fence, AtomicBool, AtomicU64, Ordering};

/// See the module docs.
#[derive(Debug, Default)]
pub(crate) struct RxHandoff {
    /// Reads asked for (polls, the receive thread on arrivals).
    want: AtomicU64,
    /// The value of `want` read by the last drain that found the socket empty, before it read.
    took: AtomicU64,
    /// The receive thread sleeps on its tick, not watching the socket.
    ticking: AtomicBool,
}

impl RxHandoff {
    /// Asks the device to read the socket (it reads while [`pending`](Self::pending)).
    #[inline]
    pub(crate) fn ask(&self) {
        self.want.fetch_add(1, Ordering::AcqRel);
    }

    /// A read was asked for since the socket was last found empty: two loads.
    #[inline]
    pub(crate) fn pending(&self) -> bool {
        self.want.load(Ordering::Acquire) != self.took.load(Ordering::Relaxed)
    }

    /// The device's read (under the device lock, the only reader): `read` takes what waits on
    /// the socket and returns true if it found it empty (or failed as a read would fail again),
    /// which satisfies every ask made before this read began.
    #[inline]
    pub(crate) fn read<R>(&self, read: impl FnOnce() -> (bool, R)) -> R {
        #[cfg(loom)]
        if crate::sync::mutation::active(crate::sync::mutation::Mutant::UdpWantAfterRead) {
            let (empty, r) = read();
            if empty {
                self.took.store(self.want.load(Ordering::Acquire), Ordering::Release);
            }
            return r;
        }
        let want = self.want.load(Ordering::Acquire);
        let (empty, r) = read();
        if empty {
            self.took.store(want, Ordering::Release);
        }
        r
    }

    /// The receive thread is about to sleep on its tick, without watching the socket: true if it
    /// may (`armed`, which loads the NIC's count of armed CQs, says none is); false if a user is
    /// going to sleep, and it must watch.
    /// A CQ armed after this look rings the bell ([`attention`](Self::attention)).
    pub(crate) fn may_tick(&self, armed: impl FnOnce() -> bool) -> bool {
        self.ticking.store(true, Ordering::Relaxed);
        #[cfg(loom)]
        let fenced =
            !crate::sync::mutation::active(crate::sync::mutation::Mutant::UdpNoFenceBeforeArmedCheck);
        #[cfg(not(loom))]
        let fenced = true;
        if fenced {
            fence(Ordering::SeqCst);
        }
        if armed() {
            self.ticking.store(false, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// The receive thread's tick is over.
    pub(crate) fn end_tick(&self) {
        self.ticking.store(false, Ordering::Relaxed);
    }

    /// A CQ was armed (its count raised before this call): true if the receive thread sleeps on
    /// its tick and must be rung so that it watches the socket from now on.
    pub(crate) fn attention(&self) -> bool {
        fence(Ordering::SeqCst);
        self.ticking.load(Ordering::Relaxed)
    }
}
