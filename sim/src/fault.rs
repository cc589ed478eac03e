//! Fault injection: a [`Wire`] that wraps another and, by a seeded plan, loses, duplicates,
//! reorders, delays or corrupts packets, and the fabric-wide controls behind it: cut links, dead
//! NICs and refused registrations. Like a middlebox on the link, it needs nothing from the device
//! model: the transport must cope (retransmission, duplicate detection, sequence NAKs, retry
//! exhaustion).
//!
//! Installed per connection when [`FabricConfig::faults`](crate::FabricConfig::faults) is not
//! [`FaultPlan::NONE`]. The generator of each connection is seeded from the plan's seed and the
//! connection's endpoints, so a Stepped run with faults still replays exactly from its seeds.
//! This path copies every payload once more (it must be able to deliver a packet twice or later)
//! and is meant for tests, not benchmarks.
//!
//! Corruption is judged as a receiving RoCE NIC judges it: the packet is encoded as the RoCEv2
//! bytes a byte wire would carry (BTH … ICRC), one seeded bit is flipped, and the frame is decoded
//! again, ICRC first. A frame the decoder refuses is dropped and counted as caught; one it accepts
//! (a flip in a bit the ICRC and the receiver both ignore) is delivered as sent if it decodes to
//! the same packet, and counted as missed (and dropped) otherwise.

use crate::clock::{Clock, Nanos, NEVER};
use crate::packet::{PacketHeader, PacketKind};
use crate::roce::{self, Endpoints, Frame};
use crate::wire::{Transmit, Wire};
use bypass_hal::trace::{self, Track};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

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
    /// Packets held for a seeded time of up to [`delay_max`](Self::delay_max) on the fabric's
    /// clock (virtual with the Stepped engine), then delivered at that time: the sending NIC's
    /// engine runs it as a timer, as it runs a retransmission timer, so a delayed packet arrives
    /// when due even on a link that sends nothing more (or before the next packet of its link,
    /// if that comes first).
    pub delay_ppm: u32,
    /// The longest delay of a delayed packet.
    pub delay_max: Duration,
    /// Packets with one seeded bit flipped on the wire: the receiver's ICRC check drops them
    /// (module docs).
    pub corrupt_ppm: u32,
    /// Packets that cut their link (both directions between the two NICs, every queue) for
    /// [`cut_for`](Self::cut_for): the packet and everything after it on that link is lost until
    /// the cut heals.
    pub cut_ppm: u32,
    /// How long a cut lasts on the fabric's clock; `None`: forever (until
    /// [`Fabric::heal_links`](crate::Fabric::heal_links)).
    pub cut_for: Option<Duration>,
    /// Seeded share of memory registrations refused with
    /// [`Error::OutOfResources`](bypass_hal::Error::OutOfResources), as a device out of
    /// translation entries or pinnable memory refuses them.
    pub register_fail_ppm: u32,
    /// Wraps every link in a fault wire even when every rate above is 0, so that
    /// [`Fabric::set_faults`](crate::Fabric::set_faults), [`Fabric::cut_link`](crate::Fabric::cut_link)
    /// and [`Fabric::kill_nic`](crate::Fabric::kill_nic) can act on the fabric later.
    pub controls: bool,
    /// Seed of every link's generator.
    pub seed: u64,
}

impl FaultPlan {
    /// No faults: links are not wrapped at all.
    pub const NONE: FaultPlan = FaultPlan {
        drop_ppm: 0,
        duplicate_ppm: 0,
        reorder_ppm: 0,
        ack_drop_ppm: 0,
        delay_ppm: 0,
        delay_max: Duration::ZERO,
        corrupt_ppm: 0,
        cut_ppm: 0,
        cut_for: None,
        register_fail_ppm: 0,
        controls: false,
        seed: 0,
    };

    /// True if the plan does nothing (and asks for no controls): links are left unwrapped.
    pub fn is_none(&self) -> bool {
        !self.controls && self.is_quiet()
    }

    /// True if no packet or registration is touched at random (controls may still be on).
    pub fn is_quiet(&self) -> bool {
        self.drop_ppm == 0
            && self.duplicate_ppm == 0
            && self.reorder_ppm == 0
            && self.ack_drop_ppm == 0
            && self.delay_ppm == 0
            && self.corrupt_ppm == 0
            && self.cut_ppm == 0
            && self.register_fail_ppm == 0
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
    /// Packets held for a time (`FaultPlan::delay_ppm`).
    pub delayed: u64,
    /// Packets with a bit flipped on the wire.
    pub corrupted: u64,
    /// Corrupted packets the receiver's ICRC (or frame checks) refused and dropped.
    pub corrupt_caught: u64,
    /// Corrupted packets that decoded as the packet sent (the flip hit a bit nobody reads) and
    /// were delivered.
    pub corrupt_harmless: u64,
    /// Corrupted packets that decoded as a different packet: a corruption the checks missed
    /// (dropped, never delivered; should stay 0).
    pub corrupt_missed: u64,
    /// Link cuts that began (seeded, or [`Fabric::cut_link`](crate::Fabric::cut_link)).
    pub cuts: u64,
    /// Packets lost to a cut link.
    pub cut_dropped: u64,
    /// Packets lost because their sending or receiving NIC was killed.
    pub dead_dropped: u64,
    /// Registrations refused by the plan.
    pub registrations_refused: u64,
}

#[derive(Debug, Default)]
pub(crate) struct FaultCounters {
    packets: AtomicU64,
    dropped: AtomicU64,
    duplicated: AtomicU64,
    reordered: AtomicU64,
    delayed: AtomicU64,
    corrupted: AtomicU64,
    corrupt_caught: AtomicU64,
    corrupt_harmless: AtomicU64,
    corrupt_missed: AtomicU64,
    cuts: AtomicU64,
    cut_dropped: AtomicU64,
    dead_dropped: AtomicU64,
    registrations_refused: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

impl FaultCounters {
    pub(crate) fn add_to(&self, s: &mut FaultStats) {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        s.packets += l(&self.packets);
        s.dropped += l(&self.dropped);
        s.duplicated += l(&self.duplicated);
        s.reordered += l(&self.reordered);
        s.delayed += l(&self.delayed);
        s.corrupted += l(&self.corrupted);
        s.corrupt_caught += l(&self.corrupt_caught);
        s.corrupt_harmless += l(&self.corrupt_harmless);
        s.corrupt_missed += l(&self.corrupt_missed);
        s.cuts += l(&self.cuts);
        s.cut_dropped += l(&self.cut_dropped);
        s.dead_dropped += l(&self.dead_dropped);
        s.registrations_refused += l(&self.registrations_refused);
    }
}

/// A cut between two NICs (both directions), until a time on the fabric's clock.
#[derive(Debug, Clone, Copy)]
struct Cut {
    a: u32,
    b: u32,
    until: Nanos,
}

/// What the fabric's controls say about links and NICs beyond the per-packet plan.
#[derive(Debug, Default)]
struct Links {
    cuts: Vec<Cut>,
    dead: Vec<u32>,
}

/// The fault state a fabric shares with all its fault wires: the plan in force (it can change
/// while the fabric runs), the counters, cut links, dead NICs and the registration generator.
#[derive(Debug)]
pub(crate) struct FaultControl {
    plan: RwLock<FaultPlan>,
    pub(crate) counters: FaultCounters,
    /// Some cut or dead NIC is recorded (checked per packet before taking the lock).
    any_links: AtomicBool,
    links: Mutex<Links>,
    /// SplitMix64 state for registration refusals.
    register_rng: Mutex<u64>,
    clock: Arc<Clock>,
}

impl FaultControl {
    pub(crate) fn new(plan: FaultPlan, clock: Arc<Clock>) -> Self {
        FaultControl {
            plan: RwLock::new(plan),
            counters: FaultCounters::default(),
            any_links: AtomicBool::new(false),
            links: Mutex::new(Links::default()),
            register_rng: Mutex::new(plan.seed ^ 0x5245_4749_5354_4552),
            clock,
        }
    }

    pub(crate) fn plan(&self) -> FaultPlan {
        *self.plan.read().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn set_plan(&self, plan: FaultPlan) {
        *self.register_rng.lock().unwrap_or_else(|e| e.into_inner()) = plan.seed ^ 0x5245_4749_5354_4552;
        *self.plan.write().unwrap_or_else(|e| e.into_inner()) = plan;
    }

    /// Cuts the link between NICs `a` and `b` (both directions) for `for_` (`None`: until healed).
    pub(crate) fn cut(&self, a: u32, b: u32, for_: Option<Duration>) {
        let until = match for_ {
            Some(d) => self.clock.now().saturating_add(d.as_nanos().min(u128::from(u64::MAX)) as u64),
            None => u64::MAX,
        };
        let mut l = self.links.lock().unwrap_or_else(|e| e.into_inner());
        l.cuts.retain(|c| !((c.a, c.b) == (a, b) || (c.a, c.b) == (b, a)));
        l.cuts.push(Cut { a, b, until });
        self.any_links.store(true, Ordering::Release);
        bump(&self.counters.cuts);
    }

    /// Heals every cut link.
    pub(crate) fn heal(&self) {
        let mut l = self.links.lock().unwrap_or_else(|e| e.into_inner());
        l.cuts.clear();
        self.any_links.store(!l.dead.is_empty(), Ordering::Release);
    }

    /// Marks NIC `addr` dead: packets from and to it are lost from now on.
    pub(crate) fn kill(&self, addr: u32) {
        let mut l = self.links.lock().unwrap_or_else(|e| e.into_inner());
        if !l.dead.contains(&addr) {
            l.dead.push(addr);
        }
        self.any_links.store(true, Ordering::Release);
    }

    /// Why a packet from `src` to `dst` cannot pass now, if it cannot: a dead NIC or a cut link.
    fn blocked(&self, src: u32, dst: u32) -> Option<Blocked> {
        if !self.any_links.load(Ordering::Acquire) {
            return None;
        }
        let mut l = self.links.lock().unwrap_or_else(|e| e.into_inner());
        if l.dead.contains(&src) || l.dead.contains(&dst) {
            return Some(Blocked::Dead);
        }
        if l.cuts.is_empty() {
            return None;
        }
        let now = self.clock.now();
        l.cuts.retain(|c| c.until > now);
        let cut = l.cuts.iter().any(|c| (c.a, c.b) == (src, dst) || (c.a, c.b) == (dst, src));
        if l.cuts.is_empty() && l.dead.is_empty() {
            self.any_links.store(false, Ordering::Release);
        }
        cut.then_some(Blocked::Cut)
    }

    /// Whether the plan refuses the next registration (seeded; one draw per registration).
    pub(crate) fn refuse_registration(&self) -> bool {
        let ppm = self.plan().register_fail_ppm;
        if ppm == 0 {
            return false;
        }
        let mut rng = self.register_rng.lock().unwrap_or_else(|e| e.into_inner());
        let refused = splitmix_ppm(&mut rng) < ppm;
        if refused {
            bump(&self.counters.registrations_refused);
        }
        refused
    }
}

/// The timer of one sending NIC's delayed packets: which of its fault wires hold some, and when
/// the first is due. The NIC folds [`due`](Self::due) into the deadline it publishes, so each
/// engine runs [`release`](Self::release) when that time comes, exactly as it runs a queue's
/// retransmission timer: an Inline poller or `Fabric::progress`, a Threaded device thread
/// parked until then, a Stepped `Fabric::step` once virtual time reaches it (a unit of its own,
/// so the seeded scheduler orders it among the others and a run replays).
#[derive(Debug)]
pub(crate) struct DelayTimer {
    /// Earliest due time of a listed wire's delayed packets ([`NEVER`]: none). It may be early
    /// (a release then finds nothing due and recomputes it), never late.
    next: AtomicU64,
    /// A due packet found its wire full: nothing is due until the receiver makes room (the
    /// wire's waiter mark kicks this NIC, which calls [`unblock`](Self::unblock)).
    blocked: AtomicBool,
    /// Wires holding delayed packets, each once (a wire dropped meanwhile is pruned at the next
    /// release; its packets were lost with its queue).
    wires: Mutex<Vec<Weak<FaultWire>>>,
}

impl Default for DelayTimer {
    fn default() -> Self {
        DelayTimer {
            next: AtomicU64::new(NEVER),
            blocked: AtomicBool::new(false),
            wires: Mutex::new(Vec::new()),
        }
    }
}

impl DelayTimer {
    /// When [`release`](Self::release) must run next ([`NEVER`]: nothing held, or held behind a
    /// full wire).
    pub(crate) fn due(&self) -> Nanos {
        if self.blocked.load(Ordering::Acquire) {
            return NEVER;
        }
        self.next.load(Ordering::Acquire)
    }

    /// The NIC was told a wire it waited on has room: a release may get through again.
    pub(crate) fn unblock(&self) {
        if self.blocked.load(Ordering::Relaxed) {
            self.blocked.store(false, Ordering::Release);
        }
    }

    /// A packet was delayed on `wire` until `due` (`wire` given if it is not listed yet).
    fn add(&self, wire: Option<Weak<FaultWire>>, due: Nanos) {
        let mut wires = self.wires.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(w) = wire {
            wires.push(w);
        }
        self.next.fetch_min(due, Ordering::AcqRel);
    }

    /// Delivers every delayed packet due at `now` on each listed wire (in due order per link)
    /// and flushes those wires; returns whether any packet was delivered. Wires left with no
    /// delayed packet are unlisted; the next due time is recomputed from those left.
    pub(crate) fn release(&self, now: Nanos) -> bool {
        let mut wires = self.wires.lock().unwrap_or_else(|e| e.into_inner());
        let (mut next, mut delivered, mut busy) = (NEVER, false, false);
        wires.retain(|w| {
            let Some(wire) = w.upgrade() else { return false };
            let r = wire.release_timed(now);
            delivered |= r.delivered;
            busy |= r.busy;
            next = next.min(r.next);
            r.next != NEVER
        });
        self.next.store(next, Ordering::Release);
        if busy {
            self.blocked.store(true, Ordering::Release);
        }
        delivered
    }
}

/// What releasing one wire's due packets did.
struct Released {
    delivered: bool,
    /// A due packet found the wire full and waits.
    busy: bool,
    /// When its first remaining delayed packet is due ([`NEVER`]: none left).
    next: Nanos,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Blocked {
    Cut,
    Dead,
}

/// SplitMix64, in parts per million.
fn splitmix_ppm(state: &mut u64) -> u32 {
    (splitmix(state) % 1_000_000) as u32
}

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[derive(Debug)]
struct LinkState {
    rng: u64,
    /// The packet held back for reordering.
    held: Option<(PacketHeader, Vec<u8>)>,
    /// Packets held for a time and when each is due, earliest first (packets due at the same
    /// time in the order they were held).
    delayed: Vec<(Nanos, PacketHeader, Vec<u8>)>,
    /// The link is on its NIC's [`DelayTimer`] list.
    listed: bool,
    /// Where the current packet's payload is materialized.
    buf: Vec<u8>,
    /// Where a corrupted packet is encoded.
    frame: Vec<u8>,
}

impl LinkState {
    /// SplitMix64, in parts per million.
    fn roll(&mut self) -> u32 {
        splitmix_ppm(&mut self.rng)
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
    control: Arc<FaultControl>,
    /// The sending NIC's timer for delayed packets.
    timer: Arc<DelayTimer>,
    /// This wire, for the timer's list.
    this: Weak<FaultWire>,
    /// The link's two ends (NIC addresses; on a byte wire, `dst` is the peer's source id).
    src: u32,
    dst: u32,
    state: Mutex<LinkState>,
}

impl std::fmt::Debug for FaultWire {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultWire").field("src", &self.src).field("dst", &self.dst).finish_non_exhaustive()
    }
}

/// What the ICRC check of a receiving NIC makes of a packet with one bit flipped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Corruption {
    /// Refused (bad ICRC or a malformed frame): dropped.
    Caught,
    /// The frame decodes as the packet sent: delivered.
    Harmless,
    /// The frame decodes as another packet: no check caught it.
    Missed,
}

/// Encodes `hdr` and `payload` as RoCEv2 bytes into `frame`, flips bit `bit` (modulo the frame's
/// length) and decodes the frame as a receiving NIC would.
fn corrupt(hdr: &PacketHeader, payload: &[u8], bit: u64, frame: &mut Vec<u8>) -> Corruption {
    let Some(ep) = Endpoints::of_packet(hdr) else { return Corruption::Caught };
    frame.resize(roce::udp_len(hdr), 0);
    let Ok(n) = roce::encode_udp(hdr, payload, &ep, frame) else { return Corruption::Caught };
    let bit = (bit % (n as u64 * 8)) as usize;
    frame[bit / 8] ^= 1 << (bit % 8);
    match roce::decode_udp(&frame[..n], &ep) {
        Err(_) => Corruption::Caught,
        Ok(got) if got == Frame::of_packet(hdr, payload) => Corruption::Harmless,
        Ok(_) => Corruption::Missed,
    }
}

impl FaultWire {
    /// Wraps `inner`, the link from NIC `src` (queue `src_qpn`) to `dst`; `timer` is NIC `src`'s
    /// timer for delayed packets.
    pub(crate) fn new(
        inner: Arc<dyn Wire>,
        control: Arc<FaultControl>,
        timer: Arc<DelayTimer>,
        src: u32,
        src_qpn: u32,
        dst: u32,
    ) -> Arc<Self> {
        let link_seed = u64::from(src) << 40 ^ u64::from(src_qpn) << 16 ^ u64::from(dst);
        let state = LinkState {
            rng: control.plan().seed ^ link_seed.wrapping_mul(0xA24B_AED4_963E_E407),
            held: None,
            delayed: Vec::new(),
            listed: false,
            buf: Vec::new(),
            frame: Vec::new(),
        };
        Arc::new_cyclic(|this| FaultWire {
            inner,
            control,
            timer,
            this: this.clone(),
            src,
            dst,
            state: Mutex::new(state),
        })
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
                bump(&self.control.counters.reordered);
            }
        }
    }

    /// Delivers the delayed packets that are due, earliest due first (packets due at the same
    /// time in the order they were held); one that finds the wire busy, and those after it, wait
    /// for the next chance. Returns whether it delivered any and whether one found the wire busy.
    fn release_due(&self, st: &mut LinkState) -> (bool, bool) {
        if st.delayed.is_empty() {
            return (false, false);
        }
        let now = self.control.clock.now();
        let mut sent = 0;
        let mut busy = false;
        for (due, h, p) in &st.delayed {
            if *due > now {
                break;
            }
            if self.deliver(h, p) == Transmit::Busy {
                busy = true;
                break;
            }
            sent += 1;
        }
        st.delayed.drain(..sent);
        (sent > 0, busy)
    }

    /// The sending NIC's delay timer fired: delivers what is due on this link and flushes it
    /// (nothing else may come to end the burst). A cut link or dead NIC loses the due packets, as
    /// it loses every packet that reaches it.
    fn release_timed(&self, now: Nanos) -> Released {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let (mut delivered, mut busy) = (false, false);
        if let Some(why) = self.control.blocked(self.src, self.dst) {
            let counters = &self.control.counters;
            let before = st.delayed.len();
            st.delayed.retain(|d| d.0 > now);
            for _ in st.delayed.len()..before {
                bump(if why == Blocked::Cut { &counters.cut_dropped } else { &counters.dead_dropped });
            }
        } else {
            (delivered, busy) = self.release_due(&mut st);
        }
        let next = st.delayed.first().map_or(NEVER, |d| d.0);
        st.listed = next != NEVER;
        drop(st);
        if delivered {
            self.inner.flush(false);
        }
        Released { delivered, busy, next }
    }
}

impl Wire for FaultWire {
    fn transmit(&self, hdr: &PacketHeader, fill: &mut dyn FnMut(&mut [u8])) -> Transmit {
        let mut guard = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let st = &mut *guard;
        let plan = self.control.plan();
        let counters = &self.control.counters;
        st.buf.resize(hdr.payload_len as usize, 0);
        if let Some(why) = self.control.blocked(self.src, self.dst) {
            fill(&mut st.buf);
            bump(&counters.packets);
            bump(if why == Blocked::Cut { &counters.cut_dropped } else { &counters.dead_dropped });
            if trace::is_enabled() {
                trace_fault(if why == Blocked::Cut { "lost (link cut)" } else { "lost (NIC dead)" }, hdr);
            }
            return Transmit::Sent; // the sender cannot tell
        }
        self.release_due(st);
        let roll = st.roll();
        let (drop, dup, reorder) = (plan.drop_ppm, plan.duplicate_ppm, plan.reorder_ppm);
        if roll < drop
            || (plan.ack_drop_ppm > 0 && hdr.kind == PacketKind::Ack && st.roll() < plan.ack_drop_ppm)
        {
            fill(&mut st.buf);
            bump(&counters.packets);
            bump(&counters.dropped);
            if trace::is_enabled() {
                trace_fault("lost", hdr);
            }
            return Transmit::Sent; // lost on the way: the sender cannot tell
        }
        if roll < drop + reorder && st.held.is_none() {
            let mut copy = vec![0u8; hdr.payload_len as usize];
            fill(&mut copy);
            st.held = Some((*hdr, copy));
            bump(&counters.packets);
            if trace::is_enabled() {
                trace_fault("held back", hdr);
            }
            return Transmit::Sent;
        }
        // The rarer kinds draw their own numbers, so a plan with only these keeps the draws of
        // the kinds above unchanged.
        if plan.cut_ppm > 0 && st.roll() < plan.cut_ppm {
            fill(&mut st.buf);
            self.control.cut(self.src, self.dst, plan.cut_for);
            bump(&counters.packets);
            bump(&counters.cut_dropped);
            if trace::is_enabled() {
                trace_fault("link cut", hdr);
            }
            return Transmit::Sent;
        }
        if plan.corrupt_ppm > 0 && st.roll() < plan.corrupt_ppm {
            fill(&mut st.buf);
            bump(&counters.packets);
            bump(&counters.corrupted);
            let bit = splitmix(&mut st.rng);
            let buf = std::mem::take(&mut st.buf);
            let verdict = corrupt(hdr, &buf, bit, &mut st.frame);
            let result = match verdict {
                Corruption::Caught => {
                    bump(&counters.corrupt_caught);
                    Transmit::Sent
                }
                Corruption::Missed => {
                    bump(&counters.corrupt_missed);
                    Transmit::Sent
                }
                Corruption::Harmless => {
                    bump(&counters.corrupt_harmless);
                    self.deliver(hdr, &buf)
                }
            };
            st.buf = buf;
            if trace::is_enabled() {
                trace_fault("corrupted", hdr);
            }
            return result;
        }
        if plan.delay_ppm > 0 && st.roll() < plan.delay_ppm {
            let mut copy = vec![0u8; hdr.payload_len as usize];
            fill(&mut copy);
            let max = plan.delay_max.as_nanos().min(u128::from(u64::MAX)) as u64;
            let wait = if max == 0 { 0 } else { splitmix(&mut st.rng) % (max + 1) };
            let due = self.control.clock.now().saturating_add(wait);
            // Kept in due order (after those due at the same time).
            let at = st.delayed.partition_point(|d| d.0 <= due);
            st.delayed.insert(at, (due, *hdr, copy));
            let list = !std::mem::replace(&mut st.listed, true);
            bump(&counters.packets);
            bump(&counters.delayed);
            if trace::is_enabled() {
                trace_fault("delayed", hdr);
            }
            // The timer's lock is never taken with a link's state held (its release takes them
            // the other way round).
            std::mem::drop(guard);
            self.timer.add(list.then(|| self.this.clone()), due);
            return Transmit::Sent;
        }
        fill(&mut st.buf);
        let buf = std::mem::take(&mut st.buf);
        let result = self.deliver(hdr, &buf);
        if result != Transmit::Busy {
            bump(&counters.packets);
            if roll >= drop + reorder
                && roll < drop + reorder + dup
                && self.deliver(hdr, &buf) != Transmit::Busy
            {
                bump(&counters.duplicated);
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
            if self.control.blocked(self.src, self.dst).is_none() {
                self.release_held(&mut st);
                self.release_due(&mut st);
            }
        }
        self.inner.flush(eager);
    }

    /// As the wire under it: the faults apply to the ACK when it leaves, held or not.
    fn holds_acks(&self) -> bool {
        self.inner.holds_acks()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// Every single-bit flip anywhere in a frame is caught by the receiver's checks or touches
    /// only a bit nobody reads: none turns into another packet.
    #[test]
    fn no_single_bit_flip_gets_past_the_icrc() {
        let send = PacketHeader {
            src_nic: 1,
            dst_nic: 2,
            src_qpn: 0x11,
            dst_qpn: 0x12,
            kind: PacketKind::Send,
            first: true,
            last: true,
            psn: 77,
            payload_len: 5,
            ..PacketHeader::default()
        };
        let write =
            PacketHeader { kind: PacketKind::Write, remote_addr: 0x1000, rkey: 0x0102, dma_len: 5, ..send };
        let ack = PacketHeader { kind: PacketKind::Ack, payload_len: 0, ..send };
        let mut frame = Vec::new();
        for (hdr, payload) in [(send, &b"hello"[..]), (write, &b"world"[..]), (ack, &b""[..])] {
            let n = roce::udp_len(&hdr) as u64;
            let (mut caught, mut harmless) = (0, 0);
            for bit in 0..n * 8 {
                match corrupt(&hdr, payload, bit, &mut frame) {
                    Corruption::Caught => caught += 1,
                    Corruption::Harmless => harmless += 1,
                    Corruption::Missed => panic!("flipping bit {bit} of {hdr:?} was not caught"),
                }
            }
            assert!(caught > harmless * 4, "most flips are caught: {caught} caught, {harmless} harmless");
        }
    }

    /// A wire that records what reaches it, and when (on a virtual clock), and can be full.
    struct Recorder {
        clock: Arc<Clock>,
        got: Mutex<Vec<(u32, Nanos)>>,
        full: AtomicBool,
        flushes: AtomicU64,
    }

    impl Wire for Recorder {
        fn transmit(&self, hdr: &PacketHeader, fill: &mut dyn FnMut(&mut [u8])) -> Transmit {
            if self.full.load(Ordering::Relaxed) {
                return Transmit::Busy;
            }
            fill(&mut vec![0; hdr.payload_len as usize]);
            self.got.lock().unwrap().push((hdr.psn, self.clock.now()));
            Transmit::Sent
        }
        fn flush(&self, _eager: bool) {
            self.flushes.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A link that delays every packet by up to 1 ms, in front of a recorder, on a virtual clock.
    fn delaying_link() -> (Arc<Clock>, Arc<Recorder>, Arc<DelayTimer>, Arc<FaultWire>) {
        let clock = Arc::new(Clock::Virtual(Default::default()));
        let plan = FaultPlan {
            delay_ppm: 1_000_000,
            delay_max: Duration::from_millis(1),
            seed: 9,
            ..FaultPlan::NONE
        };
        let control = Arc::new(FaultControl::new(plan, clock.clone()));
        let rec = Arc::new(Recorder {
            clock: clock.clone(),
            got: Mutex::new(Vec::new()),
            full: AtomicBool::new(false),
            flushes: AtomicU64::new(0),
        });
        let timer = Arc::new(DelayTimer::default());
        let wire = FaultWire::new(rec.clone(), control, timer.clone(), 1, 2, 3);
        (clock, rec, timer, wire)
    }

    fn send(wire: &FaultWire, psn: u32) {
        let hdr = PacketHeader { src_nic: 1, dst_nic: 3, psn, payload_len: 8, ..PacketHeader::default() };
        assert_eq!(wire.transmit(&hdr, &mut |b: &mut [u8]| b.fill(psn as u8)), Transmit::Sent);
    }

    /// The due times of the packets the link holds, by sequence number.
    fn due_times(wire: &FaultWire) -> Vec<(u32, Nanos)> {
        wire.state.lock().unwrap().delayed.iter().map(|(due, h, _)| (h.psn, *due)).collect()
    }

    /// Delayed packets on a link that sends nothing more are delivered by their NIC's timer at
    /// their due times, earliest due first, each burst flushed; the timer then has nothing left.
    #[test]
    fn delayed_packets_leave_at_their_due_times_in_due_order_on_an_idle_link() {
        let (clock, rec, timer, wire) = delaying_link();
        for psn in 0..6 {
            send(&wire, psn);
        }
        let mut want = due_times(&wire);
        assert_eq!(want.len(), 6, "every packet is delayed");
        want.sort_by_key(|&(psn, due)| (due, psn));
        assert!(want.windows(2).any(|w| w[0].0 > w[1].0), "the seed makes some overtake others: {want:?}");
        assert!(rec.got.lock().unwrap().is_empty());
        // Run the timer as an engine does: when it is due, and only then.
        while timer.due() != NEVER {
            let due = timer.due();
            assert!(due >= clock.now());
            clock.advance(due - clock.now());
            let flushes = rec.flushes.load(Ordering::Relaxed);
            assert!(timer.release(clock.now()), "a release at the due time {due} delivers");
            assert_eq!(rec.flushes.load(Ordering::Relaxed), flushes + 1, "the burst is flushed");
        }
        assert_eq!(*rec.got.lock().unwrap(), want, "each at its due time, in due order");
        assert!(timer.wires.lock().unwrap().is_empty(), "the idle link is off the timer's list");
    }

    /// A due packet that finds its wire full stays held, its timer stops asking until the wire
    /// has room (no spinning on a full receiver), and it leaves once the NIC is told so. A
    /// packet sent on the link after a delayed one fell due follows it.
    #[test]
    fn a_delayed_packet_behind_a_full_wire_waits_for_room_then_leaves_first() {
        let (clock, rec, timer, wire) = delaying_link();
        send(&wire, 1);
        let [(_, due)] = due_times(&wire)[..] else { panic!("one packet held") };
        clock.advance(due + 1);
        rec.full.store(true, Ordering::Relaxed);
        assert!(!timer.release(clock.now()), "nothing gets onto a full wire");
        assert_eq!(timer.due(), NEVER, "the timer waits for room, not for time");
        assert_eq!(due_times(&wire), vec![(1, due)], "the packet is still held");
        rec.full.store(false, Ordering::Relaxed);
        timer.unblock();
        assert_eq!(timer.due(), due, "room again: the packet is due");
        // The next packet of the link (delayed itself) is sent before the timer runs: the due
        // one goes first.
        send(&wire, 2);
        assert_eq!(rec.got.lock().unwrap()[..], [(1, clock.now())]);
        let [(2, due2)] = due_times(&wire)[..] else { panic!("packet 2 held") };
        assert!(timer.due() <= due2);
    }
}
