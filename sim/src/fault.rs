//! Fault injection: a [`Wire`] that wraps another and, by a seeded plan, loses, duplicates or
//! reorders packets. Like a middlebox on the link, it needs nothing from the device model: the
//! transport must cope (retransmission, duplicate detection, sequence NAKs).
//!
//! Installed per connection when [`FabricConfig::faults`](crate::FabricConfig::faults) is not
//! [`FaultPlan::NONE`]. The generator of each connection is seeded from the plan's seed and the
//! connection's endpoints, so a Stepped run with faults still replays exactly from its seeds.
//! This path copies every payload once more (it must be able to deliver a packet twice or later)
//! and is meant for tests, not benchmarks.

use crate::packet::{PacketHeader, PacketKind};
use crate::wire::{Transmit, Wire};
use bypass_hal::trace::{self, Track};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// What to do to packets, in parts per million of packets on each link.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FaultPlan {
    /// Packets silently lost.
    pub drop_ppm: u32,
    /// Packets delivered twice.
    pub duplicate_ppm: u32,
    /// Packets held back and delivered after the next packet on the same link (or at the end of
    /// the sender's burst).
    pub reorder_ppm: u32,
    /// Transport acknowledgements (ACK/NAK packets) lost, on top of `drop_ppm`. With 1,000,000 no
    /// request is ever acknowledged: its data arrives and is answered, but its send completion
    /// waits for a retransmission (a timeout) or a flush — how tests make a response overtake
    /// the send completion of its own request.
    pub ack_drop_ppm: u32,
    /// Seed of every link's generator.
    pub seed: u64,
}

impl FaultPlan {
    /// No faults: links are not wrapped at all.
    pub const NONE: FaultPlan =
        FaultPlan { drop_ppm: 0, duplicate_ppm: 0, reorder_ppm: 0, ack_drop_ppm: 0, seed: 0 };

    /// True if the plan does nothing.
    pub fn is_none(&self) -> bool {
        self.drop_ppm == 0 && self.duplicate_ppm == 0 && self.reorder_ppm == 0 && self.ack_drop_ppm == 0
    }
}

/// What the fault wires of a fabric did (see [`Fabric::fault_stats`](crate::Fabric::fault_stats)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FaultStats {
    /// Packets offered to fault wires.
    pub packets: u64,
    /// Packets lost.
    pub dropped: u64,
    /// Packets delivered twice.
    pub duplicated: u64,
    /// Packets delivered out of order.
    pub reordered: u64,
}

#[derive(Debug, Default)]
pub(crate) struct FaultCounters {
    packets: AtomicU64,
    dropped: AtomicU64,
    duplicated: AtomicU64,
    reordered: AtomicU64,
}

impl FaultCounters {
    pub(crate) fn add_to(&self, s: &mut FaultStats) {
        s.packets += self.packets.load(Ordering::Relaxed);
        s.dropped += self.dropped.load(Ordering::Relaxed);
        s.duplicated += self.duplicated.load(Ordering::Relaxed);
        s.reordered += self.reordered.load(Ordering::Relaxed);
    }
}

#[derive(Debug)]
struct LinkState {
    rng: u64,
    /// The packet held back for reordering.
    held: Option<(PacketHeader, Vec<u8>)>,
    /// Where the current packet's payload is materialized.
    buf: Vec<u8>,
}

impl LinkState {
    /// SplitMix64, in parts per million.
    fn roll(&mut self) -> u32 {
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) % 1_000_000) as u32
    }
}

/// A fault on the packet's wire row.
#[cold]
fn trace_fault(what: &'static str, hdr: &PacketHeader) {
    let args = [("packet", hdr.name().into()), ("psn", hdr.psn.into())];
    trace::instant(Track::Wire { from: hdr.src_nic, to: hdr.dst_nic }, what, &args);
}

/// A faulty link in front of another wire.
pub(crate) struct FaultWire {
    inner: Arc<dyn Wire>,
    plan: FaultPlan,
    state: Mutex<LinkState>,
    counters: Arc<FaultCounters>,
}

impl std::fmt::Debug for FaultWire {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultWire").field("plan", &self.plan).finish_non_exhaustive()
    }
}

impl FaultWire {
    /// Wraps `inner`; `link_seed` distinguishes this link from others under the same plan.
    pub(crate) fn new(
        inner: Arc<dyn Wire>,
        plan: FaultPlan,
        link_seed: u64,
        counters: Arc<FaultCounters>,
    ) -> Self {
        let state = LinkState {
            rng: plan.seed ^ link_seed.wrapping_mul(0xA24B_AED4_963E_E407),
            held: None,
            buf: Vec::new(),
        };
        FaultWire { inner, plan, state: Mutex::new(state), counters }
    }

    fn deliver(&self, hdr: &PacketHeader, payload: &[u8]) -> Transmit {
        self.inner.transmit(hdr, &mut |b: &mut [u8]| b.copy_from_slice(payload))
    }

    /// Delivers the held packet, if any (it stays held if the wire is busy).
    fn release_held(&self, st: &mut LinkState) {
        if let Some((h, p)) = st.held.take() {
            if self.deliver(&h, &p) == Transmit::Busy {
                st.held = Some((h, p));
            } else {
                self.counters.reordered.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

impl Wire for FaultWire {
    fn transmit(&self, hdr: &PacketHeader, fill: &mut dyn FnMut(&mut [u8])) -> Transmit {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let st = &mut *st;
        let roll = st.roll();
        let (drop, dup, reorder) = (self.plan.drop_ppm, self.plan.duplicate_ppm, self.plan.reorder_ppm);
        st.buf.resize(hdr.payload_len as usize, 0);
        if roll < drop
            || (self.plan.ack_drop_ppm > 0
                && hdr.kind == PacketKind::Ack
                && st.roll() < self.plan.ack_drop_ppm)
        {
            fill(&mut st.buf);
            self.counters.packets.fetch_add(1, Ordering::Relaxed);
            self.counters.dropped.fetch_add(1, Ordering::Relaxed);
            if trace::is_enabled() {
                trace_fault("lost", hdr);
            }
            return Transmit::Sent; // lost on the way: the sender cannot tell
        }
        if roll < drop + reorder && st.held.is_none() {
            let mut copy = vec![0u8; hdr.payload_len as usize];
            fill(&mut copy);
            st.held = Some((*hdr, copy));
            self.counters.packets.fetch_add(1, Ordering::Relaxed);
            if trace::is_enabled() {
                trace_fault("held back", hdr);
            }
            return Transmit::Sent;
        }
        fill(&mut st.buf);
        let buf = std::mem::take(&mut st.buf);
        let result = self.deliver(hdr, &buf);
        if result != Transmit::Busy {
            self.counters.packets.fetch_add(1, Ordering::Relaxed);
            if roll >= drop + reorder
                && roll < drop + reorder + dup
                && self.deliver(hdr, &buf) != Transmit::Busy
            {
                self.counters.duplicated.fetch_add(1, Ordering::Relaxed);
                if trace::is_enabled() {
                    trace_fault("duplicated", hdr);
                }
            }
            self.release_held(st);
        }
        st.buf = buf;
        result
    }

    fn flush(&self, eager: bool) {
        {
            let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
            self.release_held(&mut st);
        }
        self.inner.flush(eager);
    }
}
