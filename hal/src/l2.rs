//! An L2 port: an Ethernet NIC that sends and receives whole frames, with nothing above it.
//!
//! The simulator's RC transport speaks RoCEv2 byte for byte; put an Ethernet/IPv4/UDP layer (and
//! ARP) under it and any NIC that moves raw frames carries it. An [`L2Port`] is that NIC as the
//! layer above sees it: a batch of frames out, a batch of frames in, its MAC address and MTU, and
//! optionally an fd to sleep on. Drivers implement it (a virtio-net or e1000e device owned through
//! VFIO, a raw `AF_PACKET` socket, an in-memory pair for tests); the simulator's L2 wire uses it.
//!
//! The contract, which every port meets:
//!
//! - A frame is a whole Ethernet II frame as it goes on the wire minus the FCS: destination MAC,
//!   source MAC, EtherType, payload. A port pads nothing and checks nothing above L2; frames shorter
//!   than 14 bytes or with a payload above [`L2Port::mtu`] are refused by `send` with
//!   [`Error::InvalidArgument`](crate::Error::InvalidArgument), and nothing of the batch is sent.
//! - `send` takes frames in order and returns how many it took (fewer than offered when its
//!   transmit ring is full: the caller keeps the rest and offers them again later). It copies what
//!   it took (or has finished with it) before it returns, so the caller may reuse its buffers. One
//!   `send` is at most one doorbell.
//! - `recv` hands received frames to its callback in arrival order; the slice lives only for that
//!   call. It never blocks.
//! - Sleeping: [`L2Port::arm`] asks for a wake-up on the next frame and says whether frames are
//!   already waiting (then the caller must `recv` instead of sleeping: a frame that arrived before
//!   the arm is never left unannounced). The wake-up makes [`L2Port::event_fd`] readable; the
//!   caller reads it (an eventfd's 8-byte counter) before it arms again.
//! - A port is used by one thread at a time (`&mut self`); it may move between threads.

use crate::Result;
use std::os::fd::RawFd;

/// An Ethernet MAC address.
pub type Mac = [u8; 6];

/// Length of an Ethernet II header (two MACs and the EtherType).
pub const ETH_HEADER_LEN: usize = 14;

/// An Ethernet NIC seen as frames in and out. See the [module docs](self) for the contract.
pub trait L2Port: Send {
    /// The port's own MAC address (the source of every frame it sends).
    fn mac(&self) -> Mac;

    /// The largest payload (bytes after the 14-byte Ethernet header) a frame may carry: the
    /// port's MTU, 1500 on most links.
    fn mtu(&self) -> usize;

    /// Sends `frames` in order; returns how many were taken (the first `n`). Refuses the whole
    /// batch, sending nothing, if any frame is malformed or too long.
    fn send(&mut self, frames: &[&[u8]]) -> Result<usize>;

    /// Hands up to `max` received frames to `each`, in arrival order, and returns how many it
    /// handed. Returns 0 at once when no frame waits.
    fn recv(&mut self, max: usize, each: &mut dyn FnMut(&[u8])) -> Result<usize>;

    /// An fd that becomes readable when a frame arrives after [`arm`](L2Port::arm); `None` for a
    /// port that can only be polled.
    fn event_fd(&self) -> Option<RawFd> {
        None
    }

    /// Asks for a wake-up (through [`event_fd`](L2Port::event_fd)) at the next received frame.
    /// Returns `true` if frames are already waiting: the caller must poll rather than sleep. A
    /// port without an event fd returns `true` (it can only be polled).
    fn arm(&mut self) -> Result<bool> {
        Ok(true)
    }
}
