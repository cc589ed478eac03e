//! Wires: how packets get from one NIC to another.
//!
//! A NIC sends through a [`Wire`], a one-call trait, so other wires (shared memory between
//! processes, TCP between hosts) and middleware (fault injection, tracing) can wrap or replace the
//! in-process one without touching the device model. The in-process wire delivers straight into
//! the destination NIC's inbox: a fixed ring of MTU-sized packet slots, so the payload is
//! copied exactly twice (sender's memory → wire slot → receiver's memory) and nothing allocates.

use crate::packet::PacketHeader;
use bypass_hal::trace;

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

    /// Tells the far end that the packets offered so far are complete: the sender calls it once
    /// after a burst rather than per packet, so the receiver can take the burst in one go.
    /// `eager` asks for the burst to be taken now rather than when convenient (the sender's user
    /// is about to sleep and cannot help the receiver along later).
    fn flush(&self, eager: bool);
}

/// A NIC's receive port: its inbox behind a lock, plus a lock-free count of queued packets so
/// a device with nothing to receive does not touch the lock (whose cache line senders write).
#[derive(Debug)]
pub(crate) struct Port {
    pub inbox: crate::sync::Mutex<Inbox>,
    pub queued: crate::sync::AtomicU32,
}

impl Port {
    pub(crate) fn new(depth: usize, mtu: usize) -> Self {
        Port {
            inbox: crate::sync::Mutex::new(Inbox::new(depth, mtu)),
            queued: crate::sync::AtomicU32::new(0),
        }
    }

    /// Sender side: offers a packet (see [`Inbox::push`]).
    pub(crate) fn push(&self, hdr: &PacketHeader, fill: &mut dyn FnMut(&mut [u8])) -> bool {
        let taken = crate::sync::lock(&self.inbox).push(hdr, fill);
        if taken {
            self.queued.fetch_add(1, crate::sync::Ordering::Release);
        }
        taken
    }

    /// A byte wire's receiver offers a packet that came from outside the process: like
    /// [`push`](Self::push), but a full inbox records no waiter (the sender is not a NIC here
    /// to kick); the caller retries after letting the device drain the inbox.
    pub(crate) fn push_external(&self, hdr: &PacketHeader, fill: &mut dyn FnMut(&mut [u8])) -> bool {
        let taken = crate::sync::lock(&self.inbox).push_with(hdr, fill, false);
        if taken {
            self.queued.fetch_add(1, crate::sync::Ordering::Release);
        }
        taken
    }

    /// Receiver side: true if a packet may be queued (a push racing with this may be missed;
    /// its sender flags the NIC afterwards, so it is looked at again).
    pub(crate) fn maybe_nonempty(&self) -> bool {
        self.queued.load(crate::sync::Ordering::Acquire) != 0
    }
}

/// One packet slot of an inbox.
#[derive(Debug)]
struct Slot {
    hdr: PacketHeader,
    buf: Box<[u8]>,
    /// When the packet went in ([`bypass_hal::trace::now`]), if recording; else 0.
    sent_at: u64,
}

/// A NIC's receive port: a fixed ring of packet slots, filled by senders and drained by the
/// NIC's device.
#[derive(Debug)]
pub(crate) struct Inbox {
    slots: Box<[Slot]>,
    head: usize,
    len: usize,
    /// NICs that found the inbox full and wait to be kicked.
    waiters: Vec<u32>,
}

impl Inbox {
    pub(crate) fn new(depth: usize, mtu: usize) -> Self {
        let slots = (0..depth)
            .map(|_| Slot { hdr: PacketHeader::default(), buf: vec![0u8; mtu].into(), sent_at: 0 })
            .collect();
        Inbox { slots, head: 0, len: 0, waiters: Vec::with_capacity(8) }
    }

    /// Appends a packet, or records `hdr.src_nic` as a waiter and returns false when full.
    pub(crate) fn push(&mut self, hdr: &PacketHeader, fill: &mut dyn FnMut(&mut [u8])) -> bool {
        self.push_with(hdr, fill, true)
    }

    /// [`push`](Self::push), recording the sender as a waiter when full only if `wait`.
    fn push_with(&mut self, hdr: &PacketHeader, fill: &mut dyn FnMut(&mut [u8]), wait: bool) -> bool {
        if self.len == self.slots.len() {
            if wait && !self.waiters.contains(&hdr.src_nic) {
                self.waiters.push(hdr.src_nic);
            }
            return false;
        }
        let n = self.slots.len();
        let slot = &mut self.slots[(self.head + self.len) % n];
        let len = hdr.payload_len as usize;
        debug_assert!(len <= slot.buf.len(), "packet larger than the MTU");
        slot.hdr = *hdr;
        slot.sent_at = trace::stamp();
        fill(&mut slot.buf[..len]);
        self.len += 1;
        true
    }

    /// The oldest packet, if any.
    pub(crate) fn front(&self) -> Option<(&PacketHeader, &[u8])> {
        (self.len > 0).then(|| {
            let s = &self.slots[self.head];
            (&s.hdr, &s.buf[..s.hdr.payload_len as usize])
        })
    }

    /// When the oldest packet went in, on the trace clock (0: not recording then, or no packet).
    pub(crate) fn front_sent_at(&self) -> u64 {
        if self.len > 0 {
            self.slots[self.head].sent_at
        } else {
            0
        }
    }

    /// Removes the oldest packet.
    pub(crate) fn pop(&mut self) {
        if self.len > 0 {
            self.head = (self.head + 1) % self.slots.len();
            self.len -= 1;
        }
    }

    /// Takes the list of NICs waiting for room (called after a pop made room).
    pub(crate) fn take_waiter(&mut self) -> Option<u32> {
        self.waiters.pop()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn inbox_is_fifo_and_reports_full() {
        let mut ib = Inbox::new(2, 16);
        let mut h = PacketHeader { src_nic: 5, payload_len: 3, ..Default::default() };
        for psn in 0..2 {
            h.psn = psn;
            assert!(ib.push(&h, &mut |b: &mut [u8]| b.copy_from_slice(&[psn as u8; 3])));
        }
        assert!(!ib.push(&h, &mut |_: &mut [u8]| unreachable!("a full inbox never calls fill")));
        assert_eq!(ib.take_waiter(), Some(5));
        let (hdr, p) = ib.front().unwrap();
        assert_eq!((hdr.psn, p), (0, &[0u8; 3][..]));
        ib.pop();
        assert_eq!(ib.front().unwrap().0.psn, 1);
        ib.pop();
        assert!(ib.front().is_none());
    }
}
