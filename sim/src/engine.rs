//! The engine: which thread runs a NIC's device work, and when (docs/sim.md, section 7).
//!
//! Every decision that depends on the engine is made here: what a doorbell, a poll, an idle
//! poller, an armed CQ and the end of a burst do; the Threaded engine's device thread; what a
//! wire port's own thread may do for its NIC ([`WireHost`]); the clock. The rest of the crate
//! calls these hooks and never matches on [`Engine`] itself; the mechanism they use (the work
//! flag, the combining `run_inline`, `run_all`) is the NIC's (`nic.rs`).

use crate::clock::{Clock, NEVER};
use crate::fabric::FabricShared;
use crate::nic::Nic;
use crate::sync::Ordering;
use crate::wire::WireHost;
use std::time::Duration;

/// How device work gets run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// No device threads: device work runs on the application's threads. A doorbell runs the
    /// ringing NIC's device; a NIC that receives packets runs on its own user's thread at that
    /// user's next poll or doorbell — or on the sender's thread when the receiver's or the
    /// sender's user is about to sleep (an armed CQ). A thread driving several NICs calls
    /// [`Fabric::progress`](crate::Fabric::progress); pollers that keep finding nothing (1,024
    /// empty polls) do the same, and polls run due timers. Fastest; the default for benchmarks.
    Inline,
    /// One device thread per NIC: it spins briefly after work, then parks until the next doorbell
    /// or packet, so an idle NIC uses no CPU. Real asynchrony between driver and device; a poll
    /// that finds work flagged runs it itself rather than wait for the device thread.
    Threaded,
    /// Nothing moves until [`Fabric::step`](crate::Fabric::step) is called. Time is virtual
    /// ([`Fabric::advance`](crate::Fabric::advance)), and each step runs one ready unit of device
    /// work chosen by a generator seeded with `seed`, so a failing interleaving replays exactly
    /// from its seed.
    Stepped {
        /// Seed of the scheduler (and of initial sequence numbers).
        seed: u64,
    },
}

impl Engine {
    /// The fabric's clock and the seed of its scheduler and initial PSNs.
    pub(crate) fn clock(self) -> (Clock, u64) {
        match self {
            Engine::Stepped { seed } => (Clock::Virtual(Default::default()), seed),
            Engine::Inline | Engine::Threaded => (Clock::real(), 0x5EED),
        }
    }

    /// Only the test moves the fabric (`Fabric::step`): nothing a waiting thread does helps.
    pub(crate) fn is_stepped(self) -> bool {
        matches!(self, Engine::Stepped { .. })
    }

    /// Each NIC has a device thread.
    pub(crate) fn has_device_threads(self) -> bool {
        self == Engine::Threaded
    }
}

impl FabricShared {
    /// `Fabric::progress` and `Device::progress`: the Inline engine runs, on the calling thread,
    /// every NIC with work pending or a timer due; the others have nothing to do (Threaded runs
    /// by itself; Stepped moves only on `step`).
    pub(crate) fn progress(&self) {
        if self.config.engine == Engine::Inline {
            self.help();
        }
    }
}

impl Nic {
    /// A doorbell rang or a packet arrived: make sure the device will look.
    #[inline]
    pub(crate) fn kick(&self) {
        self.work.store(true, Ordering::SeqCst);
        match self.fabric.config.engine {
            Engine::Inline => {
                self.run_inline();
            }
            Engine::Threaded => {
                if self.sleeping.load(Ordering::SeqCst) {
                    if let Some(t) = self.thread.get() {
                        t.unpark();
                    }
                }
            }
            Engine::Stepped { .. } => {}
        }
    }

    /// Called on every CQ poll of this NIC. The Inline engine has no thread of its own: polls run
    /// work flagged for this NIC (and packets waiting at its wire port) and, every few polls, its
    /// due timers (other NICs' timers are run by idle pollers through
    /// [`FabricShared::help`]). The Threaded engine's polls run flagged work too (timers stay
    /// with the device thread).
    #[inline]
    pub(crate) fn on_poll(&self, check_timers: bool) {
        match self.fabric.config.engine {
            Engine::Inline => {}
            Engine::Threaded => {
                // A poller that finds work flagged runs it (unless the device thread is at it):
                // its spin would otherwise wait for the device thread to be scheduled, which on
                // a machine with more spinning threads than cores costs a time slice per hop.
                // It also tells the device thread that someone polls (written only when clear,
                // so the line stays shared while the poller spins).
                if !self.polled.load(Ordering::Relaxed) {
                    self.polled.store(true, Ordering::Relaxed);
                }
                if self.port_poll() || self.work.load(Ordering::Relaxed) {
                    self.work.store(true, Ordering::SeqCst);
                    self.run_inline();
                }
                return;
            }
            Engine::Stepped { .. } => return,
        }
        let due = check_timers && {
            let d = self.deadline.load(Ordering::Relaxed);
            d != NEVER && d <= self.now()
        };
        if due {
            // A timer is due: perhaps a retransmission, for want of an ACK another NIC holds back
            // for its next pass. Those leave first, so a held ACK never costs a retransmission
            // (its hold, 20 µs by default, may outlast a short ACK timeout).
            self.fabric.release_held_acks();
        }
        // The port is asked on every poll, even when other work makes the device run anyway: a
        // socket port counts the polls to know its user is polling (and reads only when asked).
        let port = self.port_poll();
        if due || port || self.work.load(Ordering::Relaxed) {
            self.work.store(true, Ordering::SeqCst);
            self.run_inline();
        }
    }

    /// A call outside the device loop (a queue's state change or destruction) held the device
    /// lock. Inline engine: runs what was flagged meanwhile, since a run that found the lock
    /// taken left its work to the holder, and this holder does not look at the flag again (the
    /// device loop's holders do, `wake::run_flagged`). Without it, work flagged during the call
    /// (a peer's packet; what the call's own flush of held ACKs made a peer send back) would
    /// wait for the next poll, and a user that arms its CQ and sleeps would wait for a
    /// retransmission. Other engines: their device threads or the test's steps run it.
    pub(crate) fn after_control(&self) {
        if self.fabric.config.engine == Engine::Inline {
            self.run_if_flagged();
        }
    }

    /// A CQ of this NIC came up empty many times in a row (the driver's `HELP_AFTER_IDLE_POLLS`).
    pub(crate) fn on_idle_polls(&self) {
        match self.fabric.config.engine {
            Engine::Inline => self.fabric.help(),
            // A poller spinning on an empty CQ may be what keeps a device thread off the CPU
            // (more spinning threads than cores): let it run.
            Engine::Threaded => std::thread::yield_now(),
            Engine::Stepped { .. } => {}
        }
    }

    /// A CQ of this NIC came up empty. The Inline engine sends the ACKs this NIC's device holds
    /// back at the second such poll: its user has taken what the last pass delivered and is
    /// not answering it yet.
    #[inline]
    pub(crate) fn on_empty_poll(&self) {
        if self.fabric.config.engine == Engine::Inline {
            self.empty_poll_with_held_acks();
        }
    }

    /// A CQ of this NIC was armed: its user is about to sleep on the event fd.
    pub(crate) fn on_arm(&self) {
        // Inline engine: a NIC holding back the ACK this user may be about to wait for must not
        // wait for its own user's next pass (`Nic::run_all` pairs with this).
        if self.fabric.config.engine == Engine::Inline {
            crate::wake::arm_fence();
            self.fabric.release_held_acks();
        }
        // Threaded engine: a device thread backing off because this NIC was being polled must
        // now do the work itself, since the poller is about to sleep (`device_thread`).
        if self.fabric.config.engine == Engine::Threaded {
            if let Some(t) = self.thread.get() {
                t.unpark();
            }
        }
        // A wire port whose thread sleeps may have to raise a flag now.
        if let Some(p) = self.wire_port.get() {
            p.attention();
        }
    }

    /// Receive WQEs were posted. The device reads the receive ring when a message arrives; it
    /// needs a kick only if the queue is not READY (in ERROR they are flushed at once), or to
    /// let a device thread look.
    pub(crate) fn on_recv_doorbell(&self, queue_ready: bool) {
        if self.fabric.config.engine != Engine::Inline || !queue_ready {
            self.kick();
        }
    }

    /// A sender finished a burst to this NIC (the in-process wire's flush). With the Inline
    /// engine the receiving device normally runs on its own user's thread, at that user's next
    /// poll or doorbell, so each thread mostly touches only its own NIC. The caller runs it right here instead when the receiver's user is going
    /// to sleep on an event fd (one of its CQs is armed) or the sender's own user is (`eager`).
    /// A receiver whose user simply is not polling is picked up by `Fabric::progress` or by idle
    /// pollers.
    ///
    /// (Running the receiver also when its previous burst was still unclaimed looked like a
    /// cheap progress guarantee, but in a ping-pong an ACK and a reply arrive back to back, so
    /// it fired constantly: both threads ended up running both NICs, 3.1 µs round trips instead
    /// of 1.1 µs.)
    #[inline]
    pub(crate) fn on_burst(&self, eager: bool) {
        match self.fabric.config.engine {
            Engine::Inline => {
                self.work.store(true, Ordering::SeqCst);
                if eager || self.armed_cqs.load(Ordering::SeqCst) > 0 {
                    self.run_inline();
                }
            }
            Engine::Threaded | Engine::Stepped { .. } => self.kick(),
        }
    }
}

impl WireHost for Nic {
    fn is_shut_down(&self) -> bool {
        self.fabric.is_shut_down()
    }

    fn idle(&self) {
        if self.fabric.config.engine == Engine::Inline {
            self.run_if_flagged();
        }
    }

    fn take_now(&self) {
        self.kick();
    }

    fn unblocked(&self) {
        self.unblocked.store(true, Ordering::Release);
        self.kick();
    }

    fn armed(&self) -> bool {
        self.armed_cqs.load(Ordering::SeqCst) > 0
    }

    fn sleepy(&self) -> bool {
        self.armed() || (self.fabric.config.engine != Engine::Inline && self.sleeping.load(Ordering::SeqCst))
    }

    fn next_timer(&self) -> Option<Duration> {
        let d = self.deadline.load(Ordering::Acquire);
        (d != NEVER).then(|| Duration::from_nanos(d.saturating_sub(self.now())))
    }
}

/// How long a device thread whose NIC is being polled stays away before it looks again.
const POLLED_BACKOFF: Duration = Duration::from_millis(1);

/// Body of a Threaded-engine device thread: run while there is work, spin briefly when idle, then
/// park until a doorbell or packet (or the next timer) so an idle NIC burns no CPU.
///
/// While the NIC's CQs are being polled (and none is armed), the pollers run its flagged work
/// (`Nic::on_poll`) and the device thread stays off the CPU: it parks for [`POLLED_BACKOFF`] (or
/// until its next timer), runs due timers, and resumes only when a backoff passed with no poll
/// or a CQ was armed (`SimCq::arm` unparks it). A device thread that competed with its pollers
/// for the work kept four threads spinning on two cores and was preempted holding the device
/// lock, so whole runs went slow (docs/BENCHMARKS.md, issue 14). It never blocks on the device
/// lock and never clears the work flag without holding it: whoever holds the lock sees the flag.
pub(crate) fn device_thread(nic: std::sync::Weak<Nic>) {
    const SPINS: u32 = 20_000;
    let mut idle = 0u32;
    loop {
        let Some(n) = nic.upgrade() else { return };
        if n.fabric.is_shut_down() {
            return;
        }
        let now = n.now();
        let due = n.deadline.load(Ordering::Acquire) <= now;
        let polled = n.polled.load(Ordering::Relaxed) && n.armed_cqs.load(Ordering::SeqCst) == 0;
        if polled {
            n.polled.store(false, Ordering::Relaxed);
            if due || n.unblocked.load(Ordering::Relaxed) {
                n.work.store(true, Ordering::SeqCst);
                n.run_inline();
            }
            let d = n.deadline.load(Ordering::Acquire);
            let wait = Duration::from_nanos(d.saturating_sub(n.now())).min(POLLED_BACKOFF);
            drop(n);
            std::thread::park_timeout(wait);
            idle = 0;
            continue;
        }
        if n.work.load(Ordering::SeqCst) || due || n.unblocked.load(Ordering::Relaxed) || n.port_pending() {
            n.work.store(true, Ordering::SeqCst);
            if n.run_inline() {
                idle = 0;
            } else {
                // A poller holds the device (and will see the flag): do not spin against it
                // while it may be the one waiting for a CPU.
                std::thread::yield_now();
            }
            continue;
        }
        if idle < SPINS {
            idle += 1;
            if idle % 64 == 0 {
                // On a machine with more spinning threads than cores (two cores, an application
                // thread and two device threads), let whoever has work run.
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
            continue;
        }
        n.sleeping.store(true, Ordering::SeqCst);
        if n.work.load(Ordering::SeqCst) || n.port_pending() {
            n.sleeping.store(false, Ordering::SeqCst);
            continue;
        }
        let d = n.deadline.load(Ordering::Acquire);
        let wait =
            if d == NEVER { Duration::from_millis(100) } else { Duration::from_nanos(d.saturating_sub(now)) };
        drop(n);
        std::thread::park_timeout(wait);
        if let Some(n) = nic.upgrade() {
            n.sleeping.store(false, Ordering::SeqCst);
        }
        idle = 0;
    }
}
