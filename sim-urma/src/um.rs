//! UM (unreliable message) jetties on the simulator's datagram queues: who sent a datagram.
//!
//! A UM jetty is a `bypass_sim` datagram queue (docs/sim.md, "Datagram queues"): it is READY from
//! creation, binds to no one, and each send names its target jetty in `wr->tjetty`. A receive
//! record must say which jetty sent it (`urma_cr_t.remote_id`), but a datagram carries only the
//! sending queue's number (the DETH's source QP) and the receiving NIC knows the sending NIC only
//! as a source id of its wire. This table turns those back into a jetty id: importing a UM
//! target jetty records its NIC's EID and uasid, and its full id (generation bits included),
//! under the source id the wire gave its NIC.

use bypass_sim::Source;
use bypass_urma_abi as abi;
use std::collections::HashMap;
use std::sync::Mutex;

/// The senders a device knows (one table per device: source ids are per NIC).
#[derive(Default)]
pub(crate) struct Senders {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Source id → the NIC's EID and uasid.
    nics: HashMap<u32, (abi::UrmaEid, u32)>,
    /// (source id, queue number) → the jetty's full id.
    jetties: HashMap<(u32, u32), u32>,
}

impl Senders {
    /// Records an imported UM jetty `jid`, whose NIC is `source` on this device's wire.
    pub(crate) fn learn(&self, source: u32, jid: &abi::UrmaJettyId) {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        g.nics.insert(source, (jid.eid, jid.uasid));
        g.jetties.insert((source, crate::ident::qpn_of(jid.id)), jid.id);
    }

    /// The jetty a datagram came from. A sender never imported on this device (its NIC known
    /// because another of its jettys was) gets its queue number as its id; a NIC never
    /// imported cannot deliver (the wire drops its datagrams).
    pub(crate) fn remote_id(&self, from: Source) -> abi::UrmaJettyId {
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let (eid, uasid) = g.nics.get(&from.nic).copied().unwrap_or_default();
        let id = g.jetties.get(&(from.nic, from.qpn)).copied().unwrap_or(from.qpn);
        abi::UrmaJettyId { eid, uasid, id }
    }
}

/// A UM target as a jetty's destination table knows it: its queue number, GID and port.
pub(crate) type DestKey = (u32, [u8; 16], u16);
