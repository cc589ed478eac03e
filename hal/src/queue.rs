//! Queues (a send side and a receive side, connected to one peer), their states, and what a peer
//! needs to connect.

use crate::{RecvWr, Result, SendWr};
use std::time::Duration;

/// The state of a queue. RESET → READY (on [`Queue::connect`]) → ERROR (on a transport or
/// protection error, or [`Queue::set_error`]) → RESET (on [`Queue::reset`], which from READY
/// passes through ERROR so that nothing outstanding is lost without a completion).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QueueState {
    /// Not connected; posting is refused.
    Reset,
    /// Connected; work requests execute.
    Ready,
    /// Failed; every outstanding work request is (or will be) flushed exactly once, and posting is
    /// refused until the queue is reset and connected again.
    Error,
}

/// Queue parameters chosen at creation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueConfig {
    /// Send-queue slots (outstanding send-side work requests).
    pub send_depth: u32,
    /// Receive-queue slots.
    pub recv_depth: u32,
    /// Most SGEs in one send-side work request.
    pub max_send_sge: u32,
    /// Most SGEs in one receive.
    pub max_recv_sge: u32,
    /// Most bytes of one INLINE work request.
    pub max_inline: u32,
    /// Transport timeout: how long to wait for an acknowledgement before retransmitting.
    pub timeout: Duration,
    /// Retransmissions after a timeout before the request fails with `RetryExceeded` (0..=7).
    pub retry_count: u8,
    /// Retries after a receiver-not-ready NAK before `RnrRetryExceeded` (0..=7; 7 = forever).
    pub rnr_retry: u8,
    /// How long the sender waits after an RNR NAK before retrying (the receiver advertises it).
    pub min_rnr_timer: Duration,
}

impl Default for QueueConfig {
    fn default() -> Self {
        QueueConfig {
            send_depth: 128,
            recv_depth: 128,
            max_send_sge: 4,
            max_recv_sge: 4,
            max_inline: 64,
            timeout: Duration::from_millis(100),
            retry_count: 7,
            rnr_retry: 7,
            min_rnr_timer: Duration::from_micros(100),
        }
    }
}

/// Everything a peer needs to connect to a queue. The same shape serves every backend:
/// `gid` is the port GID (verbs), the EID (URMA) or the NIC address (sim).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct QueueInfo {
    /// Port GID, EID or simulated NIC address.
    pub gid: [u8; 16],
    /// Queue (QP / jetty) number.
    pub qpn: u32,
    /// First packet sequence number the queue will send.
    pub psn: u32,
    /// InfiniBand LID (0 where unused).
    pub lid: u16,
    /// Access token (URMA; 0 where unused).
    pub token: u32,
}

impl QueueInfo {
    /// Size of the encoded form.
    pub const ENCODED_LEN: usize = 30;

    /// Encodes as little-endian bytes for a control-plane exchange.
    pub fn encode(&self) -> [u8; Self::ENCODED_LEN] {
        let mut b = [0u8; Self::ENCODED_LEN];
        b[0..16].copy_from_slice(&self.gid);
        b[16..20].copy_from_slice(&self.qpn.to_le_bytes());
        b[20..24].copy_from_slice(&self.psn.to_le_bytes());
        b[24..26].copy_from_slice(&self.lid.to_le_bytes());
        b[26..30].copy_from_slice(&self.token.to_le_bytes());
        b
    }

    /// Decodes what [`encode`](Self::encode) wrote; `None` if `b` has the wrong length.
    pub fn decode(b: &[u8]) -> Option<Self> {
        if b.len() != Self::ENCODED_LEN {
            return None;
        }
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[0..16]);
        Some(QueueInfo {
            gid,
            qpn: u32_at(16),
            psn: u32_at(20),
            lid: u16::from_le_bytes([b[24], b[25]]),
            token: u32_at(26),
        })
    }
}

/// A reliable-connected queue: a send side and a receive side bound to one peer queue.
///
/// Posting takes a batch and rings the doorbell once per batch. A batch is all-or-nothing: when
/// the queue lacks room for every request, nothing is posted and [`crate::Error::WouldBlock`] says
/// so. Completions go to the CQs given at creation.
pub trait Queue: Send {
    /// This queue's number.
    fn qpn(&self) -> u32;
    /// What a peer needs to [`connect`](Self::connect) to this queue.
    fn info(&self) -> QueueInfo;
    /// The current state (the device may move a READY queue to ERROR at any time).
    fn state(&self) -> QueueState;
    /// Connects a RESET queue to the peer described by `peer`; the queue becomes READY.
    fn connect(&mut self, peer: &QueueInfo) -> Result<()>;
    /// Moves the queue to ERROR; every outstanding work request is flushed exactly once.
    fn set_error(&mut self) -> Result<()>;
    /// Moves the queue to RESET. Anything still outstanding is flushed first (as by
    /// [`set_error`](Self::set_error)); flush completions already queued stay pollable.
    fn reset(&mut self) -> Result<()>;
    /// Posts send-side work requests and rings the doorbell once.
    ///
    /// Refused at post time, with nothing posted: a queue not READY ([`crate::Error::BadState`]),
    /// no room for the whole batch ([`crate::Error::WouldBlock`]; slots come back as completions
    /// are polled), more SGEs than `max_send_sge` or an INLINE payload above `max_inline`
    /// ([`crate::Error::InvalidArgument`]). Everything checked by the device — keys, bounds,
    /// rights, a message above `max_msg_size` — comes back as an error completion instead.
    fn post_send(&mut self, wrs: &[SendWr<'_>]) -> Result<()>;
    /// Posts receives and rings the receive doorbell once.
    fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> Result<()>;
}
