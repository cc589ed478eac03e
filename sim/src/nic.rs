//! One simulated NIC: its device state behind the device lock, its inbox (receive port), its
//! wire port if its fabric reaches beyond the process, and the mechanism the engine (`engine.rs`)
//! uses to run it: the work flag, the combining `run_inline`, `run_all`.

use crate::clock::{Nanos, NEVER};
use crate::device::{Bells, DeviceState, Unit};
use crate::events::AsyncEvents;
use crate::fabric::FabricShared;
use crate::fault::DelayTimer;
use crate::sync::{self, AtomicBool, AtomicU32, AtomicU64, AtomicU8, Mutex, Ordering};
use crate::wire::{Port, Wire, WirePort};
use bypass_hal::trace::{self, Track};
use bypass_hal::{DeviceCaps, QueueInfo};
use std::sync::{Arc, OnceLock};

pub(crate) use crate::wake::{HELD, HELD_NONE, HELD_POLLED};

/// A NIC's count of armed CQs (`Nic::armed_cqs`, `CqShared::nic_armed`), alone on its cache
/// line: the peer's device reads it on every burst and every pass that could hold an ACK, and a
/// small `Arc` allocation would otherwise share its line with whatever the allocator put beside
/// it, which the other thread may be writing.
#[derive(Debug, Default)]
#[repr(align(64))]
pub(crate) struct ArmedCount(AtomicU32);

impl std::ops::Deref for ArmedCount {
    type Target = AtomicU32;
    fn deref(&self) -> &AtomicU32 {
        &self.0
    }
}

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
    /// Whether the device holds plain ACKs back for its next pass (`DeviceState::acks_held`,
    /// published after each run): [`HELD_NONE`], [`HELD`], or [`HELD_POLLED`] once a poll of one
    /// of its CQs came up empty; the next empty poll sends them, as does any NIC's CQ being
    /// armed or an idle poller (`engine.rs`).
    pub acks_held: AtomicU8,
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
    pub armed_cqs: Arc<ArmedCount>,
    pub caps: DeviceCaps,
    /// How long (ns) a device pass may hold plain ACKs back for the next one; 0: not at all.
    /// Only the Inline engine holds (its passes run on the users' polls and doorbells, so the
    /// next pass of a responder is usually the one that sends its response), and not while
    /// this NIC's user is about to sleep (`run_all`).
    pub ack_hold: Nanos,
    /// Asynchronous events (also reachable from the device state, which pushes them).
    pub events: Arc<AsyncEvents>,
    /// The NIC's attachment to a wire beyond the fabric (UDP, shared memory), if its fabric
    /// has one; `None` on the in-process wire.
    pub wire_port: OnceLock<Arc<dyn WirePort>>,
    /// The same port, if the device takes packets from it in place (it asks
    /// [`WirePort::pending`] on polls and in its run loop).
    pub polled_port: OnceLock<Arc<dyn WirePort>>,
    /// The NIC was killed (`Fabric::kill_nic`): its control path fails.
    pub killed: AtomicBool,
    /// Packets its fault wires hold for a time (`FaultPlan::delay_ppm`), delivered when due as
    /// a timer of this NIC.
    pub delays: Arc<DelayTimer>,
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
            acks_held: AtomicU8::new(HELD_NONE),
            unblocked: AtomicBool::new(false),
            deadline: AtomicU64::new(NEVER),
            sleeping: AtomicBool::new(false),
            polled: AtomicBool::new(false),
            thread: OnceLock::new(),
            armed_cqs: Arc::new(ArmedCount::default()),
            ack_hold: if fabric.config.engine == crate::engine::Engine::Inline {
                fabric.config.ack_hold.as_nanos().min(u128::from(u64::MAX / 4)) as Nanos
            } else {
                0
            },
            caps,
            fabric,
            wire_port: OnceLock::new(),
            polled_port: OnceLock::new(),
            killed: AtomicBool::new(false),
            delays: Arc::new(DelayTimer::default()),
        }
    }

    pub(crate) fn now(&self) -> Nanos {
        self.fabric.clock.now()
    }

    /// Packets may wait at this NIC's wire port for the device to take them in place (one
    /// load, for the shared-memory wire: no lock, no system call).
    #[inline]
    pub(crate) fn port_pending(&self) -> bool {
        self.polled_port.get().is_some_and(|p| p.pending())
    }

    /// A CQ of this NIC is polled: whether its wire port wants the device to run
    /// ([`WirePort::poll`]).
    #[inline]
    pub(crate) fn port_poll(&self) -> bool {
        self.polled_port.get().is_some_and(|p| p.poll())
    }

    /// Attaches the NIC's wire port (once, when the NIC is added).
    pub(crate) fn attach(&self, port: Arc<dyn WirePort>) {
        if port.polled() {
            let _ = self.polled_port.set(port.clone());
        }
        let _ = self.wire_port.set(port);
    }

    /// The `gid` and `lid` this NIC's queues advertise.
    pub(crate) fn endpoint(&self) -> ([u8; 16], u16) {
        match self.wire_port.get() {
            Some(p) => p.endpoint(),
            None => crate::inproc::endpoint(self),
        }
    }

    /// The wire from queue `qpn` of this NIC to the queue `peer` describes, and the peer's
    /// source id — behind a capture wire when `BYPASS_PCAP` is set (unless the port captures its
    /// own packets) and a fault wire when the fabric has a fault plan — or why the peer cannot be
    /// reached.
    pub(crate) fn link(&self, qpn: u32, peer: &QueueInfo) -> Result<(Arc<dyn Wire>, u32), String> {
        match self.wire_port.get() {
            Some(p) => {
                if !p.accepts(peer) {
                    return Err(crate::wires::refuse(p.name(), p.backend_hint(), peer));
                }
                if p.loops_back() && (peer.gid, peer.lid) == p.endpoint() {
                    // A queue of this same NIC: looped back inside the NIC (the inbox), behind
                    // the fabric's capture and fault wires like any in-process link.
                    let link = self
                        .fabric
                        .route(self.addr, qpn, self.addr)
                        .ok_or_else(|| format!("NIC {} is not on its fabric any more", self.addr))?;
                    return Ok((link, self.addr));
                }
                let (link, id) = p.clone().connect(peer)?;
                let link = if p.captures_itself() {
                    self.fabric.with_faults(link, self.addr, qpn, id)
                } else {
                    self.fabric.wrap_link(link, self.addr, qpn, id)
                };
                Ok((link, id))
            }
            None => crate::inproc::connect(self, qpn, peer),
        }
    }

    /// Kills the NIC (`Fabric::kill_nic`; the fabric's fault wires already lose its packets):
    /// every queue to ERROR with its work flushed, `DeviceFatal` raised, the control path closed.
    pub(crate) fn kill(&self) {
        if self.killed.swap(true, Ordering::AcqRel) {
            return;
        }
        sync::lock(&self.dev).fail_all(self.now());
        self.events.push(bypass_hal::AsyncEvent::DeviceFatal);
        self.kick();
    }

    /// `Err` if the NIC was killed: what its control path answers.
    pub(crate) fn check_alive(&self) -> bypass_hal::Result<()> {
        if self.killed.load(Ordering::Acquire) {
            return Err(bypass_hal::Error::Device(format!(
                "simulated NIC {} is dead (killed by Fabric::kill_nic): its queues are in ERROR; \
                 use another device",
                self.addr
            )));
        }
        Ok(())
    }

    /// Runs the device if work is flagged or a timer is due (Inline engine: an idle poller helps).
    pub(crate) fn run_if_flagged(&self) {
        let d = self.deadline.load(Ordering::Relaxed);
        if self.work.load(Ordering::SeqCst) || (d != NEVER && d <= self.now()) || self.port_pending() {
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
        // `wake.rs`; loom model `loom-tests/tests/wake.rs`.
        crate::wake::run_flagged(&self.dev, &self.work, |dev| self.run_all(dev))
    }

    /// The earliest of the device's timers and the delayed packets' release.
    fn next_deadline(&self, dev: &DeviceState) -> Nanos {
        dev.deadline().min(self.delays.due())
    }

    /// A wire this NIC waited on has room: blocked queues and delayed packets may go.
    fn take_unblocked(&self, dev: &mut DeviceState) {
        if self.unblocked.load(Ordering::Relaxed) && self.unblocked.swap(false, Ordering::AcqRel) {
            dev.unblock();
            self.delays.unblock();
        }
    }

    /// Runs every ready unit and publishes the next deadline. The caller holds the device lock.
    pub(crate) fn run_all(&self, dev: &mut DeviceState) {
        let traced = if trace::is_enabled() { trace_run_begin() } else { None };
        self.take_unblocked(dev);
        let now = self.now();
        // Delayed packets due by now leave before what this run sends.
        if self.delays.due() <= now {
            self.delays.release(now);
        }
        let rx = self.polled_port.get().map(|p| &**p);
        let armed = self.armed_cqs.load(Ordering::Relaxed) > 0;
        let hold = if armed { 0 } else { self.ack_hold };
        let cut = dev.run_all(now, &self.port, rx, &self.bells, hold, &mut |w| self.fabric.kick_waiter(w));
        if dev.acks_held != (self.acks_held.load(Ordering::Relaxed) != HELD_NONE) {
            if dev.acks_held {
                // Published, fenced, then the peers' armed counts read again
                // (`held_acks_wanted`): an arm counted before the fence is seen by that read; one
                // counted after it sees the flag in its scan (`FabricShared::release_held_acks`,
                // behind the arm's fence). Either way the ACK of a sleeper's message is not held
                // (`wake.rs`; loom model `loom-tests/tests/wake.rs`).
                if crate::wake::publish_hold(&self.acks_held, || dev.held_acks_wanted()) {
                    dev.send_responses();
                    self.acks_held.store(HELD_NONE, Ordering::Relaxed);
                }
            } else {
                self.acks_held.store(HELD_NONE, Ordering::Relaxed);
            }
        }
        self.publish_deadline(self.next_deadline(dev));
        // `armed` as read before the pass: a CQ armed during it has its own ways to get what
        // the wires hold (the arm's `release_held_acks` and wire `attention`, the receiver's
        // armed count in `on_burst`); a second read here is not needed.
        dev.flush_wires(armed);
        if cut {
            // Packets still wait at the port: go round (`run_inline` swaps the flag again).
            self.work.store(true, Ordering::SeqCst);
        }
        if let Some(t) = traced {
            self.trace_run(t, now, "all");
        }
    }

    /// Sends the ACKs the device holds back, if any (an arm of any NIC's CQ, an idle poller, or
    /// the second empty poll of this NIC's CQs).
    #[inline]
    pub(crate) fn release_held_acks(&self) {
        if self.acks_held.load(Ordering::Relaxed) != HELD_NONE {
            self.work.store(true, Ordering::SeqCst);
            self.run_inline();
        }
    }

    /// Sends the ACKs the device holds back, on the caller's thread, which holds the device
    /// lock: before a queue's state changes or it goes (`SimQueue::control`, its `Drop`), the
    /// ACKs of what it already took leave, as a NIC's hardware would have sent them; a change
    /// that dropped them would make the requester retransmit into a queue that no longer takes
    /// it. The flush may run a peer's device on this thread, and what that sends back to this
    /// NIC waits behind the work flag: the caller runs it once the lock is free
    /// (`Nic::after_control`).
    pub(crate) fn send_held_acks_locked(&self, dev: &mut DeviceState) {
        if dev.acks_held {
            dev.send_responses();
            dev.flush_wires(true);
            self.acks_held.store(HELD_NONE, Ordering::Relaxed);
        }
    }

    /// A CQ of this NIC came up empty while the device may hold ACKs: the first such poll only
    /// counts (a user that has just taken a response often polls its other CQ before it sends
    /// the next request, which the ACK should ride with); the second sends them.
    #[inline]
    pub(crate) fn empty_poll_with_held_acks(&self) {
        match self.acks_held.load(Ordering::Relaxed) {
            HELD_NONE => {}
            HELD => {
                // Not a store: the device may have sent them meanwhile (on another thread).
                let _ =
                    self.acks_held.compare_exchange(HELD, HELD_POLLED, Ordering::Relaxed, Ordering::Relaxed);
            }
            _ => self.release_held_acks(),
        }
    }

    /// Runs one unit (the Stepped engine). The caller holds the device lock.
    pub(crate) fn run_unit(&self, dev: &mut DeviceState, unit: Unit) -> bool {
        let traced = if trace::is_enabled() { trace_run_begin() } else { None };
        let now = self.now();
        let did = match unit {
            Unit::Delayed => self.delays.release(now),
            _ => dev.run_unit(unit, now, &self.port, &mut |w| self.fabric.kick_waiter(w)),
        };
        self.publish_deadline(self.next_deadline(dev));
        dev.flush_wires(self.armed_cqs.load(Ordering::Relaxed) > 0);
        if let Some(t) = traced {
            let name = match unit {
                Unit::Rx => "Rx",
                Unit::Tx => "Tx",
                Unit::Send(_) => "Send",
                Unit::Timer(_) => "Timer",
                Unit::Delayed => "Delayed",
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
        self.take_unblocked(dev);
        let inbox_has = self.port.maybe_nonempty();
        let now = self.now();
        dev.ready_units(&self.bells, inbox_has, now, tag, out);
        if self.delays.due() <= now {
            out.push((tag, Unit::Delayed));
        }
    }
}

/// Where a traced device run begins: the trace clock and the events offered so far.
#[cold]
#[inline(never)]
fn trace_run_begin() -> Option<(u64, u64)> {
    Some((trace::now(), trace::offered()))
}
