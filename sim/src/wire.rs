//! Wires: how packets get from one NIC to another — the seam between the device and whatever
//! carries its packets.
//!
//! Two traits make the seam:
//!
//! - a [`Wire`] is one direction of one link: the device offers it packets and flushes bursts.
//!   Middleware (fault injection, capture) wraps any wire;
//! - a `WirePort` is a NIC's attachment to a wire that reaches outside the fabric (UDP, shared
//!   memory; next, an L2 port): what goes in the GID its queues advertise, how a queue connects
//!   (it returns the [`Wire`] to send on), its receive side (packets it takes itself, from the
//!   NIC's run loop and poll path, or from its own thread through the NIC's `WireHost`
//!   handle), and its counters. The device and the driver know only these traits; the wires'
//!   catalogue (`wires.rs`) says which ports exist.
//!
//! The in-process wire (`inproc.rs`) is the NIC itself: it delivers straight into the
//! destination NIC's inbox, a fixed ring of MTU-sized packet slots, and nothing allocates.
//!
//! A payload that lies in one registration of the sender (a SEND or WRITE segment from one SGE,
//! a READ response) is offered by reference ([`Wire::transmit_ref`]): the in-process wire puts
//! the reference in the slot, and the receiving device copies the bytes straight from the
//! sender's memory into its own when it places the packet, so the payload is copied once, as a
//! NIC's DMA engines do. If the sender's registration is deregistered while the packet waits,
//! the packet is lost on the wire (see `source.rs`): the requester's retransmission then meets
//! the missing registration, as on hardware. Other payloads (INLINE data, several SGEs, small
//! payloads below `BY_REF_MIN`) are copied into the slot and out again. Byte wires (shared memory,
//! UDP) and middleware (faults, pcap) copy every payload through `transmit`'s `fill`.

use crate::inbox::Inbox;
use crate::packet::PacketHeader;
pub use crate::source::PayloadRef;
use bypass_hal::QueueInfo;
use std::sync::{Arc, Weak};
use std::time::Duration;

/// Payloads shorter than this are copied into the inbox slot even when they could go by
/// reference: for a few cache lines two copies cost less than the reader count's two atomics
/// (64-byte SENDs by reference lost about 6 % of their message rate, docs/BENCHMARKS.md).
pub(crate) const BY_REF_MIN: usize = 1024;

/// The outcome of offering a packet to a wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transmit {
    /// The wire took the packet.
    Sent,
    /// The wire is full; nothing was taken. The sender keeps the packet and is kicked once the
    /// receiver has made room (the fabric is lossless, like UB or a PFC-enabled RoCE network).
    Busy,
    /// The wire dropped the packet (unknown destination, or a fault); retransmission recovers.
    Dropped,
}

/// Carries packets from a NIC towards the NIC named in each header.
pub trait Wire: Send + Sync {
    /// Offers one packet. `fill` writes its `hdr.payload_len` payload bytes into the wire's buffer
    /// and is called at most once, only if the packet is taken.
    fn transmit(&self, hdr: &PacketHeader, fill: &mut dyn FnMut(&mut [u8])) -> Transmit;

    /// Offers one packet whose `hdr.payload_len` payload bytes are `src`, a range of one of the
    /// sender's registrations. A wire that carries bytes copies them out (this default, through
    /// [`transmit`](Self::transmit)); the in-process wire keeps the reference for the receiver.
    fn transmit_ref(&self, hdr: &PacketHeader, src: PayloadRef<'_>) -> Transmit {
        self.transmit(hdr, &mut |buf: &mut [u8]| src.copy_to(buf))
    }

    /// Tells the far end that the packets offered so far are complete: the sender calls it once
    /// after a burst rather than per packet, so the receiver can take the burst in one go.
    /// `eager` asks for the burst to be taken now rather than when convenient (the sender's user
    /// is about to sleep and cannot help the receiver along later).
    fn flush(&self, eager: bool);

    /// Whether the sender's device may hold plain ACKs for this wire's far end back until its
    /// next pass (`DeviceState::run_all`'s `hold`). The in-process wire says yes unless the
    /// receiving NIC's user is about to sleep (a CQ armed); the fault and capture middleware
    /// answer as the wire under them; other wires, no (the UDP wire holds ACKs itself, in its
    /// flush).
    fn holds_acks(&self) -> bool {
        false
    }
}

/// A NIC's attachment to a wire that reaches beyond its fabric (see the module docs). One per
/// NIC, made when the NIC is added (`wires::open`); it lives as long as the NIC.
///
/// Receiving: the device takes a port's packets in place. [`poll`](Self::poll) is asked on every
/// poll of the NIC's CQs and [`pending`](Self::pending) in the device's run loop (so both must be
/// a load or so: no lock, no system call), and [`drain`](Self::drain) runs under the device lock
/// when they said yes, so it is the port's only reader. A port's own thread (if any) only has
/// the device run ([`WireHost::take_now`]) when nobody polls.
pub(crate) trait WirePort: Send + Sync + std::fmt::Debug {
    /// The wire's name in messages ("UDP", "shared-memory").
    fn name(&self) -> &'static str;

    /// How to open the other end on this wire too, for messages ("sim+shm").
    fn backend_hint(&self) -> &'static str;

    /// The `gid` and `lid` every queue of this NIC advertises in its [`QueueInfo`].
    fn endpoint(&self) -> ([u8; 16], u16);

    /// Whether `peer`'s GID is an address on this wire. A peer it does not accept is refused
    /// before [`connect`](Self::connect), with a reason naming the peer's wire (`wires::refuse`).
    fn accepts(&self, peer: &QueueInfo) -> bool;

    /// A queue connects to `peer` (one this port [`accepts`](Self::accepts)): the link that
    /// reaches it and the peer's source id (what [`PacketHeader::src_nic`] of its packets will
    /// be), or why it cannot be reached. Not on a data path (it may block, e.g. for a
    /// reachability check).
    fn connect(self: Arc<Self>, peer: &QueueInfo) -> Result<(Arc<dyn Wire>, u32), String>;

    /// Whether a queue of this NIC connecting to a queue of the same NIC (a peer whose `gid` and
    /// `lid` are this port's [`endpoint`](Self::endpoint)) is looped back inside the NIC, as a
    /// RoCE NIC does: its packets go straight into the NIC's inbox, as an in-process packet
    /// does, and never reach the wire. Their source id is then the NIC's fabric address (what
    /// the device writes in [`PacketHeader::src_nic`] and what the inbox kicks when it has room
    /// again), so a port that says yes never gives that id to a peer of its own.
    fn loops_back(&self) -> bool {
        false
    }

    /// Whether the port writes its own links' packets to the capture (`BYPASS_PCAP`), with
    /// addresses of its own (the UDP wire: its real IPv4 addresses and ports). Otherwise its
    /// links go behind the capture wire, which writes them with the sim's NIC numbering.
    fn captures_itself(&self) -> bool {
        false
    }

    /// Starts the port's own thread, if it has one, for the NIC `host`; the fabric joins it at
    /// shutdown. Called once, after the port is attached to its NIC.
    fn start(
        self: Arc<Self>,
        host: Weak<dyn WireHost>,
    ) -> std::io::Result<Option<std::thread::JoinHandle<()>>>;

    /// Whether the device must ask [`pending`](Self::pending) and call [`drain`](Self::drain).
    /// Decided once, when the port is attached.
    fn polled(&self) -> bool {
        false
    }

    /// Packets may wait for [`drain`](Self::drain). Called in the device's run loop and by idle
    /// pollers: cheap, lock-free.
    #[inline]
    fn pending(&self) -> bool {
        false
    }

    /// A CQ of the NIC is being polled: whether the device should run now to take packets from
    /// the port. Called on every poll: cheap, lock-free. A port that can tell only by a system
    /// call (a socket) answers true and makes [`pending`](Self::pending) true until its next
    /// [`drain`](Self::drain) has looked, so each poll reads it once.
    #[inline]
    fn poll(&self) -> bool {
        self.pending()
    }

    /// Under the NIC's device lock (NIC `nic`): hands every packet waiting (up to a budget the
    /// port chooses; it must then answer [`pending`](Self::pending) true again) to `recv`, with
    /// its payload, which `recv` copies out before it returns.
    fn drain(&self, nic: u32, recv: &mut dyn FnMut(&PacketHeader, &[u8])) {
        let _ = (nic, recv);
    }

    /// A CQ of the NIC was armed: its user is about to sleep on an event fd, so packets must
    /// not wait for its polls (a port with a thread that sleeps may need to change how it does).
    fn attention(&self) {}

    /// What the port counted, merged into the NIC's counters.
    fn stats(&self) -> WireStats {
        WireStats::default()
    }

    /// The fabric shuts down: wake the port's thread so it sees that, and stop peers from
    /// connecting to this NIC.
    fn shut_down(&self) {}

    /// The UDP socket address, on a port that has one.
    fn socket_addr(&self) -> Option<std::net::SocketAddrV4> {
        None
    }

    /// The shared-memory segment, on a port that has one.
    fn segment_path(&self) -> Option<&std::path::Path> {
        None
    }
}

/// Counters a `WirePort` keeps, merged into `NicStats`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct WireStats {
    /// Frames that were not valid RoCEv2 packets of ours, dropped (`NicStats::rx_malformed`).
    pub rx_malformed: u64,
    /// Frames from senders no queue is connected to, dropped unread (`NicStats::rx_ignored`).
    pub rx_ignored: u64,
    /// Packets the wire would not take and lost (`NicStats::tx_wire_dropped`).
    pub tx_dropped: u64,
    /// Wake-ups issued to sleeping receivers (`NicStats::tx_wakeups`).
    pub tx_wakeups: u64,
    /// System calls that sent frames (`NicStats::tx_wire_sends`).
    pub tx_sends: u64,
}

/// What a wire port's own thread may ask of its NIC (the NIC implements it; the engine decides
/// what each call does, `engine.rs`). The port holds it weakly: [`Weak::upgrade`] failing means
/// the NIC is gone and the thread ends.
#[cfg_attr(loom, allow(dead_code))] // only the shared-memory wire, absent under loom, uses some
pub(crate) trait WireHost: Send + Sync {
    /// The fabric is shutting down: the thread ends.
    fn is_shut_down(&self) -> bool;

    /// The port's thread found nothing for a while: run the NIC's due timers if its engine has
    /// no thread of its own (so a queue whose peer died still times out).
    fn idle(&self);

    /// Packets wait in the port and the NIC must take them now (its user sleeps, or left them
    /// untaken): flag the device work and have it run.
    fn take_now(&self);

    /// A receiver this NIC waited on has room again: blocked queues retry.
    fn unblocked(&self);

    /// A CQ of the NIC is armed: its user is about to sleep on an event fd.
    fn armed(&self) -> bool;

    /// Nobody will take packets soon without being woken: a CQ is armed, or the NIC's device
    /// thread is parked.
    fn sleepy(&self) -> bool;

    /// Time until the NIC's next timer, if it has one.
    fn next_timer(&self) -> Option<Duration>;
}

/// A NIC's receive port: its inbox, a lock-free ring of packet slots ([`Inbox`]) filled by
/// senders and drained by the NIC's device.
#[derive(Debug)]
pub(crate) struct Port {
    pub inbox: Inbox,
}

impl Port {
    pub(crate) fn new(depth: usize, mtu: usize) -> Self {
        Port { inbox: Inbox::new(depth, mtu) }
    }

    /// Sender side: offers a packet; a full inbox records `hdr.src_nic` to be kicked when there
    /// is room, and returns false.
    pub(crate) fn push(&self, hdr: &PacketHeader, fill: &mut dyn FnMut(&mut [u8])) -> bool {
        self.inbox.push(hdr, fill, true)
    }

    /// Like [`push`](Self::push), with the payload left in the sender's memory.
    pub(crate) fn push_ref(&self, hdr: &PacketHeader, src: &PayloadRef<'_>) -> bool {
        self.inbox.push_ref(hdr, src, true)
    }

    /// Receiver side: true if a packet is queued (a push racing with this may be missed; its
    /// sender flags the NIC afterwards, so it is looked at again).
    pub(crate) fn maybe_nonempty(&self) -> bool {
        self.inbox.nonempty()
    }
}
