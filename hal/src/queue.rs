//! Queues (a send side and a receive side, connected to one peer), their states, and what a peer
//! needs to connect.

use crate::{AckTimeout, RecvWr, Result, RnrTimer, SendWr};
use std::time::Duration;

/// The state of a queue. RESET → READY (on [`Queue::connect`]) → ERROR (on a transport or
/// protection error, or [`Queue::set_error`]) → RESET (on [`Queue::reset`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QueueState {
    /// Not connected; posting is refused.
    Reset,
    /// Connected; work requests execute.
    Ready,
    /// Failed; every outstanding work request is (or will be) flushed exactly once, and so is
    /// every request posted from now on, until the queue is reset and connected again.
    Error,
}

/// Queue parameters chosen at creation. Start from [`QueueConfig::default`] and set fields (the
/// struct grows as backends need more).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueueConfig {
    /// Send-queue slots (outstanding send-side work requests).
    pub send_depth: u32,
    /// Receive-queue slots. A queue on a [`crate::SharedRecv`] has no receive queue of its own:
    /// hardware backends ignore it, the simulator bounds with it the receives the queue took from
    /// the shared queue whose completions are not yet polled (beyond them it answers RNR).
    pub recv_depth: u32,
    /// Most SGEs in one send-side work request.
    pub max_send_sge: u32,
    /// Most SGEs in one receive (on a [`crate::SharedRecv`], the shared queue's limit applies).
    pub max_recv_sge: u32,
    /// Most bytes of one INLINE work request.
    pub max_inline: u32,
    /// Transport timeout: how long to wait for an acknowledgement before retransmitting
    /// ([`AckTimeout::NONE`]: never).
    pub timeout: AckTimeout,
    /// Retransmissions after a timeout before the request fails with `RetryExceeded` (0..=7).
    pub retry_count: u8,
    /// Retries after a receiver-not-ready NAK before `RnrRetryExceeded` (0..=7; 7 = forever).
    pub rnr_retry: u8,
    /// How long a sender waits after this queue answered RNR before it retries (advertised in
    /// the NAK).
    pub min_rnr_timer: RnrTimer,
    /// Most READs this queue keeps outstanding as requester; further ones wait their turn
    /// (clamped to [`crate::DeviceCaps::max_rd_atomic`]).
    pub max_rd_atomic: u8,
    /// Most READs this queue serves in flight as responder (clamped to
    /// [`crate::DeviceCaps::max_dest_rd_atomic`]).
    pub max_dest_rd_atomic: u8,
}

impl Default for QueueConfig {
    fn default() -> Self {
        QueueConfig {
            send_depth: 128,
            recv_depth: 128,
            max_send_sge: 4,
            max_recv_sge: 4,
            max_inline: 64,
            // 2^15 × 4.096 µs = 134 ms.
            timeout: AckTimeout::at_least(Duration::from_millis(100)),
            retry_count: 7,
            rnr_retry: 7,
            // 120 µs.
            min_rnr_timer: RnrTimer::at_least(Duration::from_micros(100)),
            max_rd_atomic: 4,
            max_dest_rd_atomic: 4,
        }
    }
}

impl QueueConfig {
    /// The same configuration with `send` send slots and `recv` receive slots.
    pub fn with_depths(mut self, send: u32, recv: u32) -> Self {
        self.send_depth = send;
        self.recv_depth = recv;
        self
    }
}

/// Everything a peer needs to connect to a queue, on any backend:
///
/// | field | verbs | URMA | sim |
/// |---|---|---|---|
/// | `gid` | port GID | EID | fabric id + NIC address |
/// | `qpn` | QP number | jetty id | queue number |
/// | `psn` | first PSN | (unused) | first PSN |
/// | `lid` | LID (InfiniBand) | (unused) | 0 |
/// | `uasid` | 0 | the jetty's uasid | 0 |
/// | `token` | 0 | the jetty's token value | 0 |
/// | `responder_resources` | the QP's `max_dest_rd_atomic` | (unknown) | the queue's `max_dest_rd_atomic` |
/// | `requester_depth` | the QP's `max_rd_atomic` | (unknown) | the queue's `max_rd_atomic` |
///
/// The control plane carries it as [`encode`](Self::encode) writes it: a version byte, a length
/// byte and the fields, so a later version can append fields that older readers skip.
///
/// `responder_resources` is what rdma_cm's connection request carries: how many READs and
/// atomics the queue serves in flight as responder. [`Queue::connect`] keeps the connecting
/// queue's initiator depth (its `max_rd_atomic`) at or below it, so a requester never has more
/// READs outstanding than its peer has resources for (over that, a responder may NAK them or, as
/// rxe does, drop the duplicate of a READ whose response was lost, and the request fails).
/// `requester_depth` is the other direction: how many READs the queue may have outstanding as
/// requester, so that a peer learns at connect that this side will never READ from it.
///
/// Both are `Some(0)` for a queue that serves, or issues, no READ at all: what needs one is
/// then refused up front, with a clear error, instead of failing the queue when tried.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub struct QueueInfo {
    /// Port GID, EID or simulated NIC address.
    pub gid: [u8; 16],
    /// Queue (QP / jetty) number.
    pub qpn: u32,
    /// First packet sequence number the queue will send.
    pub psn: u32,
    /// InfiniBand LID (0 where unused).
    pub lid: u16,
    /// URMA user address-space id of the queue's owner (0 where unused).
    pub uasid: u32,
    /// Access token of the queue (URMA; 0 where unused).
    pub token: u32,
    /// READs and atomics the queue serves in flight as responder (its `max_dest_rd_atomic`,
    /// clamped to the device's); `Some(0)`: it serves none. `None`: not known (an encoding from
    /// before this field, or a backend without the notion): the connecting queue keeps its own
    /// `max_rd_atomic`.
    pub responder_resources: Option<u8>,
    /// READs and atomics the queue may have outstanding as requester (its `max_rd_atomic`,
    /// clamped to the device's, before [`Queue::connect`] lowers it to the peer's responder
    /// resources); `Some(0)`: it issues none. `None`: not known.
    pub requester_depth: Option<u8>,
}

/// Why bytes are not a [`QueueInfo`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum QueueInfoError {
    /// Fewer bytes than the header or the length it announces.
    #[error("queue info is truncated: {have} byte(s), {need} needed")]
    Truncated {
        /// Bytes available.
        have: usize,
        /// Bytes needed.
        need: usize,
    },
    /// A version this build does not read.
    #[error("queue info version {0} (this build reads version {v})", v = QueueInfo::VERSION)]
    Version(u8),
    /// The announced body is shorter than this version's fields.
    #[error("queue info body of {0} bytes is shorter than version 1's {b}", b = QueueInfo::BODY_LEN)]
    Short(usize),
}

impl QueueInfo {
    /// The encoding version this build writes.
    pub const VERSION: u8 = 1;
    /// Bytes of version 1's first fields (gid .. token), which every reader needs.
    const BODY_LEN: usize = 16 + 4 + 4 + 2 + 4 + 4;
    /// Bytes of the fields this build writes: version 1's, then `responder_resources` (u8),
    /// `requester_depth` (u8) and which of the two are known (u8: bit 0, bit 1), appended later.
    /// A body of 34 bytes has neither; one of 35 or 36 bytes (control versions 4 and 5) has
    /// `responder_resources` alone, 0 meaning not known.
    const BODY_LEN_WRITTEN: usize = Self::BODY_LEN + 3;
    /// Bit of the known-fields byte: `responder_resources` is known.
    const KNOWN_RESPONDER: u8 = 1;
    /// Bit of the known-fields byte: `requester_depth` is known.
    const KNOWN_REQUESTER: u8 = 2;
    /// Size of the encoded form this build writes: version, length, fields.
    pub const ENCODED_LEN: usize = 2 + Self::BODY_LEN_WRITTEN;

    /// The initiator depth a queue configured with `max_rd_atomic` (already clamped to its
    /// device) uses towards this peer: `max_rd_atomic`, lowered to the peer's responder
    /// resources when they are known (to 0 for a peer that serves no READ).
    pub fn initiator_depth(&self, max_rd_atomic: u8) -> u8 {
        match self.responder_resources {
            None => max_rd_atomic,
            Some(r) => max_rd_atomic.min(r),
        }
    }

    /// A queue's info from its GID, number and first PSN (the other fields zero).
    pub fn new(gid: [u8; 16], qpn: u32, psn: u32) -> Self {
        QueueInfo { gid, qpn, psn, ..Default::default() }
    }

    /// Encodes for a control-plane exchange: version, body length, then gid (16), qpn, psn, lid
    /// (u16), uasid, token, responder_resources (u8), requester_depth (u8), known (u8: bit 0
    /// responder_resources, bit 1 requester_depth; an unknown value is written 0),
    /// little-endian.
    pub fn encode(&self) -> [u8; Self::ENCODED_LEN] {
        let mut b = [0u8; Self::ENCODED_LEN];
        b[0] = Self::VERSION;
        b[1] = Self::BODY_LEN_WRITTEN as u8;
        b[2..18].copy_from_slice(&self.gid);
        b[18..22].copy_from_slice(&self.qpn.to_le_bytes());
        b[22..26].copy_from_slice(&self.psn.to_le_bytes());
        b[26..28].copy_from_slice(&self.lid.to_le_bytes());
        b[28..32].copy_from_slice(&self.uasid.to_le_bytes());
        b[32..36].copy_from_slice(&self.token.to_le_bytes());
        b[36] = self.responder_resources.unwrap_or(0);
        b[37] = self.requester_depth.unwrap_or(0);
        b[38] = if self.responder_resources.is_some() { Self::KNOWN_RESPONDER } else { 0 }
            | if self.requester_depth.is_some() { Self::KNOWN_REQUESTER } else { 0 };
        b
    }

    /// Decodes one encoded info from the front of `b`; returns it and the bytes it took. A body
    /// of version 1's first 34 bytes (an earlier writer) knows neither READ limit; one of 35 or
    /// 36 bytes knows `responder_resources` if it is not 0; a longer one than this build writes
    /// (a later writer's extra fields) is accepted and the rest skipped, as are unknown bits of
    /// the known-fields byte.
    pub fn decode(b: &[u8]) -> Result<(Self, usize), QueueInfoError> {
        if b.len() < 2 {
            return Err(QueueInfoError::Truncated { have: b.len(), need: 2 });
        }
        if b[0] != Self::VERSION {
            return Err(QueueInfoError::Version(b[0]));
        }
        let body = usize::from(b[1]);
        if body < Self::BODY_LEN {
            return Err(QueueInfoError::Short(body));
        }
        if b.len() < 2 + body {
            return Err(QueueInfoError::Truncated { have: b.len(), need: 2 + body });
        }
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[2..18]);
        let info = QueueInfo {
            gid,
            qpn: u32_at(18),
            psn: u32_at(22),
            lid: u16::from_le_bytes([b[26], b[27]]),
            uasid: u32_at(28),
            token: u32_at(32),
            responder_resources: None,
            requester_depth: None,
        };
        let extra = &b[2 + Self::BODY_LEN..2 + body];
        let info = match *extra {
            [] => info,
            [r] | [r, _] => QueueInfo { responder_resources: (r != 0).then_some(r), ..info },
            [r, d, known, ..] => QueueInfo {
                responder_resources: (known & Self::KNOWN_RESPONDER != 0).then_some(r),
                requester_depth: (known & Self::KNOWN_REQUESTER != 0).then_some(d),
                ..info
            },
        };
        Ok((info, 2 + body))
    }
}

/// A reliable-connected queue: a send side and a receive side bound to one peer queue.
///
/// Posting takes a batch and rings the doorbell once per batch. A batch is all-or-nothing: when
/// the queue lacks room for every request, nothing is posted and [`crate::Error::WouldBlock`] says
/// so. Completions go to the CQs given at creation.
///
/// Dropping a queue destroys it, as `ibv_destroy_qp` and `urma_delete_jetty` do: work still
/// outstanding on it (posted sends and receives) is discarded **without completions**. Code that
/// must account for every request (buffers lent to receives, calls waiting for a send) moves the
/// queue to ERROR first ([`Queue::set_error`], or an error does it), polls the flush completions,
/// then drops it.
pub trait Queue: Send {
    /// This queue's number.
    fn qpn(&self) -> u32;
    /// What a peer needs to [`connect`](Self::connect) to this queue.
    fn info(&self) -> QueueInfo;
    /// The current state (the device may move a READY queue to ERROR at any time).
    fn state(&self) -> QueueState;
    /// Connects a RESET queue to the peer described by `peer`; the queue becomes READY.
    fn connect(&mut self, peer: &QueueInfo) -> Result<()>;
    /// Moves the queue to ERROR; every outstanding work request is flushed exactly once. The
    /// flush completions arrive asynchronously (as on hardware): poll for them.
    fn set_error(&mut self) -> Result<()>;
    /// Moves the queue to RESET, discarding what it still holds: outstanding work requests and
    /// its completions not yet polled are dropped without being reported (mlx5-class NICs purge
    /// the CQ on RESET; Soft-RoCE drops unflushed work). To account for every request, call
    /// [`set_error`](Self::set_error), poll until each has its flush completion, then reset.
    /// After a reset, no completion of the queue's earlier life is ever delivered.
    fn reset(&mut self) -> Result<()>;
    /// Posts send-side work requests and rings the doorbell once.
    ///
    /// Refused at post time, with nothing posted: a queue in RESET ([`crate::Error::BadState`]),
    /// no room for the whole batch ([`crate::Error::WouldBlock`]; slots come back as completions
    /// are polled), more SGEs than `max_send_sge` or an INLINE payload above `max_inline`
    /// ([`crate::Error::InvalidArgument`]). A batch is all-or-nothing on every backend: verbs and
    /// URMA post everything before a bad request, so their backends check room and limits
    /// themselves before they call the provider. Everything checked by the device — keys,
    /// bounds, rights, a message above `max_msg_size` — comes back as an error completion. A
    /// queue in ERROR accepts posts, as hardware does, and flushes them.
    fn post_send(&mut self, wrs: &[SendWr<'_>]) -> Result<()>;
    /// Posts receives and rings the receive doorbell once; the same rules as
    /// [`post_send`](Self::post_send). A queue that takes its receives from a
    /// [`crate::SharedRecv`] refuses it ([`crate::Error::InvalidArgument`]): post to the shared
    /// queue.
    fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> Result<()>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_info_golden_bytes() {
        let mut info = QueueInfo::new([0xaa; 16], 0x0102_0304, 0x00ab_cdef);
        info.lid = 0x1234;
        info.uasid = 7;
        info.token = 0xdead_beef;
        info.responder_resources = Some(3);
        info.requester_depth = Some(0);
        let b = info.encode();
        let mut want = vec![1u8, 37];
        want.extend([0xaa; 16]);
        want.extend([4, 3, 2, 1, 0xef, 0xcd, 0xab, 0, 0x34, 0x12, 7, 0, 0, 0, 0xef, 0xbe, 0xad, 0xde]);
        want.extend([3, 0, 0b11]);
        assert_eq!(b.to_vec(), want);
        assert_eq!(QueueInfo::decode(&b), Ok((info, QueueInfo::ENCODED_LEN)));
        // Nothing known: both values 0, no bit.
        let unknown = QueueInfo { responder_resources: None, requester_depth: None, ..info };
        assert_eq!(unknown.encode()[36..], [0, 0, 0]);
        assert_eq!(QueueInfo::decode(&unknown.encode()), Ok((unknown, QueueInfo::ENCODED_LEN)));
        // An earlier writer's 34-byte body: no READ limit known.
        let mut old = want[..36].to_vec();
        old[1] = 34;
        old.push(0x77); // the next entry's first byte, not ours
        assert_eq!(QueueInfo::decode(&old), Ok((unknown, 36)));
        // Control versions 4 and 5: a 35-byte body, the responder resources alone, 0 not known.
        for (r, known) in [(3, Some(3)), (0, None)] {
            let mut v5 = want[..36].to_vec();
            v5[1] = 35;
            v5.push(r);
            let want_v5 = QueueInfo { responder_resources: known, ..unknown };
            assert_eq!(QueueInfo::decode(&v5), Ok((want_v5, 37)));
        }
    }

    #[test]
    fn initiator_depth_is_clamped_to_the_peers_responder_resources() {
        let mut peer = QueueInfo::new([0; 16], 2, 0);
        assert_eq!(peer.initiator_depth(4), 4, "unknown resources: our own depth");
        peer.responder_resources = Some(1);
        assert_eq!(peer.initiator_depth(4), 1);
        peer.responder_resources = Some(16);
        assert_eq!(peer.initiator_depth(4), 4);
        peer.responder_resources = Some(0);
        assert_eq!(peer.initiator_depth(4), 0, "a peer that serves no READ: none may be issued");
    }

    #[test]
    fn queue_info_refuses_bad_bytes_and_skips_later_fields() {
        let b = QueueInfo::new([1; 16], 9, 10).encode();
        assert_eq!(QueueInfo::decode(&b[..1]), Err(QueueInfoError::Truncated { have: 1, need: 2 }));
        assert_eq!(QueueInfo::decode(&b[..20]), Err(QueueInfoError::Truncated { have: 20, need: 39 }));
        let mut v2 = b.to_vec();
        v2[0] = 2;
        assert_eq!(QueueInfo::decode(&v2), Err(QueueInfoError::Version(2)));
        let mut short = b.to_vec();
        short[1] = 10;
        assert_eq!(QueueInfo::decode(&short), Err(QueueInfoError::Short(10)));
        let mut longer = b.to_vec();
        longer[1] += 3;
        longer.extend([0xff; 3]);
        longer.push(0x55);
        assert_eq!(QueueInfo::decode(&longer), Ok((QueueInfo::new([1; 16], 9, 10), 42)));
        // Unknown bits of the known-fields byte are skipped.
        let mut bits = b.to_vec();
        bits[38] = 0xfc;
        assert_eq!(QueueInfo::decode(&bits), Ok((QueueInfo::new([1; 16], 9, 10), 39)));
    }
}
