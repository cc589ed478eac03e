//! The in-process wire: the destination NIC itself. Its addresses (the `bsm\x02` GID), how a
//! queue connects over it, and its [`Wire`]: delivery straight into the destination NIC's inbox,
//! by copy or by reference (docs/sim.md, section 6). It is the wire of a fabric with no
//! [`WirePort`](crate::wire::WirePort).

use crate::nic::Nic;
use crate::packet::PacketHeader;
use crate::wire::{PayloadRef, Transmit, Wire};
use bypass_hal::trace::{self, Track};
use bypass_hal::QueueInfo;
use std::sync::Arc;

/// Magic prefix of an in-process sim NIC's GID in a [`QueueInfo`]. The GID is this prefix
/// (bytes 0..4), the fabric's host-and-process tag (4..8), the fabric's number in its process
/// (8..12) and the NIC's address on it (12..16), little-endian. The tag lets `connect` refuse,
/// with a reason, a peer that an in-process wire cannot reach (another process or host) instead
/// of "connecting" and timing out.
pub(crate) const GID_MAGIC: [u8; 4] = *b"bsm\x02";

/// The GID and lid of `nic`'s queues.
pub(crate) fn endpoint(nic: &Nic) -> ([u8; 16], u16) {
    let mut gid = [0u8; 16];
    gid[..4].copy_from_slice(&GID_MAGIC);
    gid[4..8].copy_from_slice(&crate::fabric::process_tag().to_le_bytes());
    gid[8..12].copy_from_slice(&nic.fabric.id.to_le_bytes());
    gid[12..].copy_from_slice(&nic.addr.to_le_bytes());
    (gid, 0)
}

/// The route from queue `qpn` of `nic` to the NIC `peer` names on the same fabric, and that
/// NIC's address (its source id), or why there is none.
pub(crate) fn connect(nic: &Nic, qpn: u32, peer: &QueueInfo) -> Result<(Arc<dyn Wire>, u32), String> {
    if let Some(e) = crate::wires::mismatch("in-process", peer) {
        return Err(e);
    }
    if peer.gid[..4] != GID_MAGIC {
        return Err("the peer's QueueInfo is not from a simulated NIC (of this version): a sim NIC \
                    connects only to sim NICs"
            .into());
    }
    let at = |o: usize| u32::from_le_bytes([peer.gid[o], peer.gid[o + 1], peer.gid[o + 2], peer.gid[o + 3]]);
    if at(4) != crate::fabric::process_tag() {
        return Err("the peer's queue is on a simulated NIC in another process or on another host, which \
                    the in-process wire cannot reach: run both ends on one Fabric in one process"
            .into());
    }
    let fabric = at(8);
    if fabric != nic.fabric.id {
        return Err(format!(
            "the peer's queue is on fabric {fabric}, this one on fabric {}: NICs of different fabrics \
             cannot reach each other",
            nic.fabric.id
        ));
    }
    let addr = at(12);
    let wire = nic
        .fabric
        .route(nic.addr, qpn, addr)
        .ok_or_else(|| format!("no NIC with address {addr} on this fabric"))?;
    Ok((wire, addr))
}

impl Wire for Nic {
    /// Delivery straight into this NIC's inbox.
    fn transmit(&self, hdr: &PacketHeader, fill: &mut dyn FnMut(&mut [u8])) -> Transmit {
        if hdr.payload_len > self.fabric.config.mtu {
            return Transmit::Dropped;
        }
        let taken = self.port.push(hdr, fill);
        if !taken {
            if trace::is_enabled() {
                trace_full(hdr, self.addr);
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
                trace_full(hdr, self.addr);
            }
            return Transmit::Busy;
        }
        Transmit::Sent
    }

    /// The sender finished a burst to this NIC: the engine decides who runs the receiver
    /// ([`Nic::on_burst`]).
    fn flush(&self, eager: bool) {
        self.on_burst(eager);
    }

    /// Yes unless this NIC's user is about to sleep on an event fd (`Nic::run_all` reads it
    /// again after publishing that it holds ACKs, against `Nic::on_arm`: `wake::publish_hold`).
    fn holds_acks(&self) -> bool {
        crate::wake::peer_may_wait(&self.armed_cqs)
    }
}

#[cold]
fn trace_full(hdr: &PacketHeader, to: u32) {
    let args = [("packet", hdr.name().into()), ("psn", hdr.psn.into())];
    trace::instant(Track::Wire { from: hdr.src_nic, to }, "inbox full", &args);
}
