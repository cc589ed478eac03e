//! One simulated NIC: its device state behind the device lock, its inbox (receive port), and the
//! glue that lets the engine run it.

use crate::clock::{Nanos, NEVER};
use crate::device::{Bells, DeviceState, Unit};
use crate::events::AsyncEvents;
use crate::fabric::{Engine, FabricShared};
use crate::packet::PacketHeader;
use crate::sync::{self, AtomicBool, AtomicU32, AtomicU64, Mutex, Ordering};
use crate::wire::{PayloadRef, Port, Transmit, Wire};
use bypass_hal::trace::{self, Track};
use bypass_hal::DeviceCaps;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

#[derive(Debug)]
pub(crate) struct Nic {
    pub addr: u32,
    pub fabric: Arc<FabricShared>,
    pub dev: Mutex<DeviceState>,
    pub port: Port,
    /// The doorbell list (which queues rang since the device last looked).
    pub bells: Bells,
    /// Something may be ready (a doorbell rang or a packet arrived).
    pub work: AtomicBool,
    /// A wire this NIC waited on has room again.
    pub unblocked: AtomicBool,
    /// Earliest timer deadline, published after each run.
    pub deadline: AtomicU64,
    /// Threaded engine: the device thread is (about to be) parked until a kick unparks it.
    pub sleeping: AtomicBool,
    /// Threaded engine: a CQ of this NIC was polled since the device thread last cleared this
    /// (its pollers run the flagged work, so the device thread backs off).
    pub polled: AtomicBool,
    pub thread: OnceLock<std::thread::Thread>,
    /// How many of this NIC's CQs are armed (their user is about to sleep on an event fd).
    pub armed_cqs: Arc<AtomicU32>,
    pub caps: DeviceCaps,
    /// Asynchronous events (also reachable from the device state, which pushes them).
    pub events: Arc<AsyncEvents>,
    /// The NIC's UDP endpoint, on a fabric whose wire is UDP.
    pub udp: OnceLock<Arc<crate::udp::UdpPort>>,
    /// The NIC's shared-memory endpoint (its segment), on a fabric whose wire is shared memory.
    pub shm: OnceLock<Arc<crate::shm::ShmPort>>,
}

impl Nic {
    pub(crate) fn new(addr: u32, fabric: Arc<FabricShared>, caps: DeviceCaps) -> Self {
        let (mtu, depth) = (fabric.config.mtu, fabric.config.inbox_depth);
        let events = Arc::new(AsyncEvents::new().expect("an eventfd for the NIC's async events"));
        Nic {
            addr,
            dev: Mutex::new(DeviceState::new(addr, mtu, caps, events.clone())),
            events,
            port: Port::new(depth as usize, mtu as usize),
            bells: Bells::new(),
            work: AtomicBool::new(false),
            unblocked: AtomicBool::new(false),
            deadline: AtomicU64::new(NEVER),
            sleeping: AtomicBool::new(false),
            polled: AtomicBool::new(false),
            thread: OnceLock::new(),
            armed_cqs: Arc::new(AtomicU32::new(0)),
            caps,
            fabric,
            udp: OnceLock::new(),
            shm: OnceLock::new(),
        }
    }

    pub(crate) fn now(&self) -> Nanos {
        self.fabric.clock.now()
    }

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

    /// A byte wire's receiver put packets in the inbox: the same notification as the
    /// in-process wire's [`flush`](Wire::flush) (the NIC's user takes them at its next poll, or
    /// the caller runs the device now when that user is about to sleep).
    pub(crate) fn deliver(&self) {
        Wire::flush(self, false);
    }

    /// Called on every CQ poll of this NIC. The Inline engine has no thread of its own: polls run
    /// work flagged for this NIC and, every few polls, its due timers (other NICs' timers are run
    /// by idle pollers through [`FabricShared::help`](crate::fabric::FabricShared::help)). The
    /// Threaded engine's polls run flagged work too (timers stay with the device thread).
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
                if self.work.load(Ordering::Relaxed) || self.shm_pending() {
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
        if due || self.work.load(Ordering::Relaxed) || self.shm_pending() {
            self.work.store(true, Ordering::SeqCst);
            self.run_inline();
        }
    }

    /// Shared-memory wire: frames may wait in this NIC's inbound rings (one load of the
    /// segment's pending mask: no lock, no system call).
    #[inline]
    pub(crate) fn shm_pending(&self) -> bool {
        self.shm.get().is_some_and(|s| s.pending())
    }

    /// Runs the device if work is flagged or a timer is due (Inline engine: an idle poller helps).
    pub(crate) fn run_if_flagged(&self) {
        let d = self.deadline.load(Ordering::Relaxed);
        if self.work.load(Ordering::SeqCst) || (d != NEVER && d <= self.now()) || self.shm_pending() {
            self.work.store(true, Ordering::SeqCst);
            self.run_inline();
        }
    }

    /// Publishes this NIC's earliest deadline (only a change is written: the line stays shared).
    fn publish_deadline(&self, d: Nanos) {
        if self.deadline.load(Ordering::Relaxed) != d {
            self.deadline.store(d, Ordering::Release);
        }
    }

    /// Runs the device on this thread unless another thread is running it, in which case that
    /// thread sees `work` and goes round again.
    /// Returns false if it never got the lock (another thread held it throughout).
    pub(crate) fn run_inline(&self) -> bool {
        let mut got = false;
        loop {
            let Some(mut dev) = sync::try_lock(&self.dev) else { return got };
            got = true;
            while self.work.swap(false, Ordering::SeqCst) {
                self.run_all(&mut dev);
            }
            drop(dev);
            if !self.work.load(Ordering::SeqCst) {
                return true;
            }
        }
    }

    /// Runs every ready unit and publishes the next deadline. The caller holds the device lock.
    pub(crate) fn run_all(&self, dev: &mut DeviceState) {
        let traced = if trace::is_enabled() { trace_run_begin() } else { None };
        if self.unblocked.load(Ordering::Relaxed) && self.unblocked.swap(false, Ordering::AcqRel) {
            dev.unblock();
        }
        let now = self.now();
        let shm = self.shm.get().map(|s| &**s);
        dev.run_all(now, &self.port, shm, &self.bells, &mut |w| self.fabric.kick_waiter(w));
        self.publish_deadline(dev.deadline());
        dev.flush_wires(self.armed_cqs.load(Ordering::Relaxed) > 0);
        if let Some(t) = traced {
            self.trace_run(t, now, "all");
        }
    }

    /// Runs one unit (the Stepped engine). The caller holds the device lock.
    pub(crate) fn run_unit(&self, dev: &mut DeviceState, unit: Unit) -> bool {
        let traced = if trace::is_enabled() { trace_run_begin() } else { None };
        let now = self.now();
        let did = dev.run_unit(unit, now, &self.port, &mut |w| self.fabric.kick_waiter(w));
        self.publish_deadline(dev.deadline());
        dev.flush_wires(self.armed_cqs.load(Ordering::Relaxed) > 0);
        if let Some(t) = traced {
            let name = match unit {
                Unit::Rx => "Rx",
                Unit::Tx => "Tx",
                Unit::Send(_) => "Send",
                Unit::Timer(_) => "Timer",
            };
            self.trace_run(t, now, name);
        }
        did
    }

    /// A "device run" slice on this NIC's row, if the run recorded anything (runs that did
    /// nothing visible are left out). `now` is the fabric's clock (virtual for Stepped).
    #[cold]
    fn trace_run(&self, (start, offered): (u64, u64), now: Nanos, units: &'static str) {
        if trace::offered() != offered {
            trace::span(
                Track::Nic(self.addr),
                "device run",
                start,
                &[("units", units.into()), ("clock_ns", now.into())],
            );
        }
    }

    /// The units ready now (the Stepped engine). The caller holds the device lock.
    pub(crate) fn ready_units(&self, dev: &mut DeviceState, tag: usize, out: &mut Vec<(usize, Unit)>) {
        if self.unblocked.load(Ordering::Relaxed) && self.unblocked.swap(false, Ordering::AcqRel) {
            dev.unblock();
        }
        let inbox_has = self.port.maybe_nonempty();
        dev.ready_units(&self.bells, inbox_has, self.now(), tag, out);
    }
}

impl Wire for Nic {
    /// The in-process wire: delivery straight into this NIC's inbox.
    fn transmit(&self, hdr: &PacketHeader, fill: &mut dyn FnMut(&mut [u8])) -> Transmit {
        if hdr.payload_len > self.fabric.config.mtu {
            return Transmit::Dropped;
        }
        let taken = self.port.push(hdr, fill);
        if !taken {
            if trace::is_enabled() {
                let args = [("packet", hdr.name().into()), ("psn", hdr.psn.into())];
                trace::instant(Track::Wire { from: hdr.src_nic, to: self.addr }, "inbox full", &args);
            }
            return Transmit::Busy;
        }
        Transmit::Sent
    }

    /// By reference: the slot keeps a pointer into the sender's registration, and the receiving
    /// device copies the bytes from there when it places the packet (one copy per transfer).
    fn transmit_ref(&self, hdr: &PacketHeader, src: PayloadRef<'_>) -> Transmit {
        if hdr.payload_len > self.fabric.config.mtu {
            return Transmit::Dropped;
        }
        if src.is_empty() {
            return self.transmit(hdr, &mut |buf: &mut [u8]| src.copy_to(buf));
        }
        if !self.port.push_ref(hdr, &src) {
            if trace::is_enabled() {
                let args = [("packet", hdr.name().into()), ("psn", hdr.psn.into())];
                trace::instant(Track::Wire { from: hdr.src_nic, to: self.addr }, "inbox full", &args);
            }
            return Transmit::Busy;
        }
        Transmit::Sent
    }

    /// The sender finished a burst to this NIC. With the Inline engine the receiving device
    /// normally runs on its own user's thread, at that user's next poll or doorbell, so each
    /// thread mostly touches only its own NIC. The sender runs it right here instead when the
    /// receiver's user is going to sleep on an event fd (one of its CQs is armed) or the sender's
    /// own user is (`eager`). A receiver whose user simply is not polling is picked up by
    /// `Fabric::progress` or by idle pollers.
    ///
    /// (Running the receiver also when its previous burst was still unclaimed looked like a
    /// cheap progress guarantee, but in a ping-pong an ACK and a reply arrive back to back, so
    /// it fired constantly: both threads ended up running both NICs, 3.1 µs round trips instead
    /// of 1.1 µs.)
    fn flush(&self, eager: bool) {
        match self.fabric.config.engine {
            Engine::Inline => {
                self.work.store(true, Ordering::SeqCst);
                if eager || self.armed_cqs.load(Ordering::SeqCst) > 0 {
                    self.run_inline();
                }
            }
            _ => self.kick(),
        }
    }
}

/// Where a traced device run begins: the trace clock and the events offered so far.
#[cold]
#[inline(never)]
fn trace_run_begin() -> Option<(u64, u64)> {
    Some((trace::now(), trace::offered()))
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
        if n.work.load(Ordering::SeqCst) || due || n.unblocked.load(Ordering::Relaxed) || n.shm_pending() {
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
        if n.work.load(Ordering::SeqCst) || n.shm_pending() {
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
