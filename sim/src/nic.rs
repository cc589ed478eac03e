//! One simulated NIC: its device state behind the device lock, its inbox (receive port), and the
//! glue that lets the engine run it.

use crate::clock::{Nanos, NEVER};
use crate::device::{DeviceState, Unit};
use crate::fabric::{Engine, FabricShared};
use crate::packet::PacketHeader;
use crate::sync::{self, AtomicBool, AtomicU32, AtomicU64, Mutex, Ordering};
use crate::wire::{Inbox, Transmit, Wire};
use bypass_hal::DeviceCaps;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

#[derive(Debug)]
pub(crate) struct Nic {
    pub addr: u32,
    pub fabric: Arc<FabricShared>,
    pub dev: Mutex<DeviceState>,
    pub inbox: Mutex<Inbox>,
    /// Something may be ready (a doorbell rang or a packet arrived).
    pub work: AtomicBool,
    /// A wire this NIC waited on has room again.
    pub unblocked: AtomicBool,
    /// Earliest timer deadline, published after each run.
    pub deadline: AtomicU64,
    /// Threaded engine: the device thread is (about to be) parked.
    pub sleeping: AtomicBool,
    pub thread: OnceLock<std::thread::Thread>,
    /// How many of this NIC's CQs are armed (their user is about to sleep on an event fd).
    pub armed_cqs: Arc<AtomicU32>,
    pub caps: DeviceCaps,
}

impl Nic {
    pub(crate) fn new(addr: u32, fabric: Arc<FabricShared>, caps: DeviceCaps) -> Self {
        let (mtu, depth) = (fabric.config.mtu, fabric.config.inbox_depth);
        Nic {
            addr,
            dev: Mutex::new(DeviceState::new(addr, mtu, caps)),
            inbox: Mutex::new(Inbox::new(depth as usize, mtu as usize)),
            work: AtomicBool::new(false),
            unblocked: AtomicBool::new(false),
            deadline: AtomicU64::new(NEVER),
            sleeping: AtomicBool::new(false),
            thread: OnceLock::new(),
            armed_cqs: Arc::new(AtomicU32::new(0)),
            caps,
            fabric,
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
            Engine::Inline => self.run_inline(),
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

    /// Called on every CQ poll. The Inline engine has no thread of its own, so polls drive its
    /// timers: any NIC of the fabric whose timer is due runs here (a sender waiting out an RNR
    /// NAK must retry even if only the receiver's CQ is being polled).
    #[inline]
    pub(crate) fn on_poll(&self, check_timers: bool) {
        if self.fabric.config.engine != Engine::Inline {
            return;
        }
        if self.work.load(Ordering::Relaxed) {
            self.work.store(true, Ordering::SeqCst);
            self.run_inline();
        }
        // Reading the clock costs more than the rest of an idle poll: only do it while some NIC
        // of the fabric has a timer armed, and not on every poll.
        if check_timers && self.fabric.armed_nics.load(Ordering::Relaxed) > 0 {
            let now = self.now();
            if self.fabric.next_deadline.load(Ordering::Relaxed) <= now {
                self.fabric.run_due_timers(now);
            }
        }
    }

    /// Runs the device if work is flagged (Inline engine: a poller with nothing to do helps).
    pub(crate) fn run_if_flagged(&self) {
        if self.work.load(Ordering::SeqCst) {
            self.run_inline();
        }
    }

    /// Runs the device now if its timer is due (Inline engine).
    pub(crate) fn run_if_due(&self, now: Nanos) {
        if self.deadline.load(Ordering::Acquire) <= now {
            self.work.store(true, Ordering::SeqCst);
            self.run_inline();
        }
    }

    /// Publishes this NIC's earliest deadline, here and in the fabric-wide minimum.
    fn publish_deadline(&self, d: Nanos) {
        let was = self.deadline.swap(d, Ordering::AcqRel);
        if d != NEVER {
            self.fabric.next_deadline.fetch_min(d, Ordering::AcqRel);
        }
        match (was == NEVER, d == NEVER) {
            (true, false) => {
                self.fabric.armed_nics.fetch_add(1, Ordering::AcqRel);
            }
            (false, true) => {
                self.fabric.armed_nics.fetch_sub(1, Ordering::AcqRel);
            }
            _ => {}
        }
    }

    /// Runs the device on this thread unless another thread is running it, in which case that
    /// thread sees `work` and goes round again.
    fn run_inline(&self) {
        loop {
            let Some(mut dev) = sync::try_lock(&self.dev) else { return };
            while self.work.swap(false, Ordering::SeqCst) {
                self.run_all(&mut dev);
            }
            drop(dev);
            if !self.work.load(Ordering::SeqCst) {
                return;
            }
        }
    }

    /// Runs every ready unit and publishes the next deadline. The caller holds the device lock.
    pub(crate) fn run_all(&self, dev: &mut DeviceState) {
        if self.unblocked.swap(false, Ordering::AcqRel) {
            dev.unblock();
        }
        let now = self.now();
        dev.run_all(now, &self.inbox, &mut |w| self.fabric.kick_waiter(w));
        self.publish_deadline(dev.deadline());
        dev.flush_wires(self.armed_cqs.load(Ordering::Relaxed) > 0);
    }

    /// Runs one unit (the Stepped engine). The caller holds the device lock.
    pub(crate) fn run_unit(&self, dev: &mut DeviceState, unit: Unit) -> bool {
        let now = self.now();
        let did = dev.run_unit(unit, now, &self.inbox, &mut |w| self.fabric.kick_waiter(w));
        self.publish_deadline(dev.deadline());
        dev.flush_wires(self.armed_cqs.load(Ordering::Relaxed) > 0);
        did
    }

    /// The units ready now (the Stepped engine). The caller holds the device lock.
    pub(crate) fn ready_units(&self, dev: &mut DeviceState, tag: usize, out: &mut Vec<(usize, Unit)>) {
        if self.unblocked.swap(false, Ordering::AcqRel) {
            dev.unblock();
        }
        let inbox_has = !sync::lock(&self.inbox).is_empty();
        dev.ready_units(inbox_has, self.now(), tag, out);
    }
}

impl Wire for Nic {
    /// The in-process wire: delivery straight into this NIC's inbox.
    fn transmit(&self, hdr: &PacketHeader, fill: &mut dyn FnMut(&mut [u8])) -> Transmit {
        if hdr.payload_len > self.fabric.config.mtu {
            return Transmit::Dropped;
        }
        let taken = sync::lock(&self.inbox).push(hdr, fill);
        if !taken {
            return Transmit::Busy;
        }
        Transmit::Sent
    }

    /// The sender finished a burst to this NIC. With the Inline engine the receiving device
    /// normally runs on its own user's thread, at that user's next poll or doorbell, so each
    /// thread mostly touches only its own NIC. The sender runs it right here instead when the
    /// receiver cannot be counted on: one of its CQs is armed (its user is going to sleep on the
    /// event fd), or the work flagged by the previous burst is still unclaimed (its user is not
    /// polling), or the sender's own user is about to sleep (`eager`).
    fn flush(&self, eager: bool) {
        match self.fabric.config.engine {
            Engine::Inline => {
                let unclaimed = self.work.swap(true, Ordering::SeqCst);
                if eager || unclaimed || self.armed_cqs.load(Ordering::SeqCst) > 0 {
                    self.run_inline();
                }
            }
            _ => self.kick(),
        }
    }
}

/// Body of a Threaded-engine device thread: run while there is work, spin briefly when idle, then
/// park until a doorbell or packet (or the next timer) so an idle NIC burns no CPU.
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
        if n.work.swap(false, Ordering::SeqCst) || due || n.unblocked.load(Ordering::Relaxed) {
            let mut dev = sync::lock(&n.dev);
            n.run_all(&mut dev);
            idle = 0;
            continue;
        }
        if idle < SPINS {
            idle += 1;
            std::hint::spin_loop();
            continue;
        }
        n.sleeping.store(true, Ordering::SeqCst);
        if n.work.load(Ordering::SeqCst) {
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
