//! Wires: how packets get from one NIC to another.
//!
//! A NIC sends through a [`Wire`], a one-call trait, so other wires (shared memory between
//! processes, TCP between hosts) and middleware (fault injection, tracing) can wrap or replace the
//! in-process one without touching the device model. The in-process wire delivers straight into
//! the destination NIC's inbox: a fixed ring of MTU-sized packet slots, and nothing allocates.
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

    /// A byte wire's receiver offers a packet that came from outside the process: like
    /// [`push`](Self::push), but a full inbox records no waiter (the sender is not a NIC here
    /// to kick); the caller retries after letting the device drain the inbox.
    pub(crate) fn push_external(&self, hdr: &PacketHeader, fill: &mut dyn FnMut(&mut [u8])) -> bool {
        self.inbox.push(hdr, fill, false)
    }

    /// Receiver side: true if a packet is queued (a push racing with this may be missed; its
    /// sender flags the NIC afterwards, so it is looked at again).
    pub(crate) fn maybe_nonempty(&self) -> bool {
        self.inbox.nonempty()
    }
}
