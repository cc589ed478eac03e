//! Packets: what travels on a wire between two NICs. Headers only carry numbers (queue numbers,
//! sequence numbers, remote addresses and keys) — never a pointer into another host's memory.
//! (The in-process wire may leave a payload in the sender's registered memory and put a pointer
//! to it in the inbox slot beside the header, guarded by the registration's liveness: `wire.rs`.)

/// Packet sequence numbers are 24 bits, as in the InfiniBand BTH, and wrap around.
pub const PSN_MASK: u32 = 0x00FF_FFFF;

/// At most this many PSNs may be unacknowledged at once: half the sequence space, so every
/// comparison of two live PSNs has one answer (IBTA 9.7.1 allows 2^23 outstanding).
pub(crate) const PSN_WINDOW: u32 = 1 << 23;

/// `a + n` in sequence space.
#[inline]
pub(crate) const fn psn_add(a: u32, n: u32) -> u32 {
    a.wrapping_add(n) & PSN_MASK
}

/// `a - b` in sequence space, as a signed distance (negative: `a` is before `b`).
#[inline]
pub(crate) const fn psn_diff(a: u32, b: u32) -> i32 {
    (a.wrapping_sub(b) << 8) as i32 >> 8
}

/// How far `psn` is past `first` (0..2^24), e.g. a segment's index in its message.
#[inline]
pub(crate) const fn psn_offset(psn: u32, first: u32) -> u32 {
    psn.wrapping_sub(first) & PSN_MASK
}

/// The queue number meaning "not carried": frames from a byte wire do not name the sending
/// queue (the BTH has only the destination), so the receiver accepts any source queue of its
/// connected peer NIC, as a RoCE NIC does.
pub const ANY_QPN: u32 = u32::MAX;

/// What a packet is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PacketKind {
    /// A segment of a SEND (or SEND_IMM when `has_imm`).
    #[default]
    Send,
    /// A segment of a WRITE (or WRITE_IMM when `has_imm`).
    Write,
    /// An RDMA READ request for `dma_len` bytes at `remote_addr`.
    ReadRequest,
    /// A segment of a READ response.
    ReadResponse,
    /// An acknowledgement or negative acknowledgement (see `syndrome`).
    Ack,
    /// An atomic request on the 8-byte word at `remote_addr` (`rkey`): compare-and-swap
    /// (`atomic = [swap, compare]`, `has_imm` false) or fetch-and-add (`atomic[0]` = the
    /// addend, `has_imm` true — the flag is reused, an atomic carries no immediate).
    AtomicRequest,
    /// The answer to an atomic request: an ACK (syndrome Ack) with the word's old value in
    /// `atomic[0]`.
    AtomicAck,
}

impl PacketKind {
    /// True for packets a requester sends (and a responder handles).
    pub fn is_request(self) -> bool {
        matches!(
            self,
            PacketKind::Send | PacketKind::Write | PacketKind::ReadRequest | PacketKind::AtomicRequest
        )
    }
}

/// The meaning of an [`PacketKind::Ack`] packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Syndrome {
    /// Everything up to and including `psn` arrived.
    #[default]
    Ack,
    /// Receiver not ready at `psn` (no receive posted); retry after the given nanoseconds.
    RnrNak(u64),
    /// Sequence error: the responder expected `psn`; resend from there.
    NakSequence,
    /// The request at `psn` was invalid (e.g. too long for the receive buffer).
    NakInvalidRequest,
    /// The request at `psn` violated the responder's memory protection.
    NakRemoteAccess,
    /// The responder could not carry out the request at `psn`.
    NakRemoteOperation,
}

/// A packet header (the in-process wire passes it by value; a byte wire serializes it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PacketHeader {
    /// Sending NIC.
    pub src_nic: u32,
    /// Receiving NIC.
    pub dst_nic: u32,
    /// Sending queue ([`ANY_QPN`] when the wire does not carry it).
    pub src_qpn: u32,
    /// Receiving queue.
    pub dst_qpn: u32,
    /// What the packet is.
    pub kind: PacketKind,
    /// First segment of its message.
    pub first: bool,
    /// Last segment of its message.
    pub last: bool,
    /// The message carries an immediate (in `imm`, on its last segment).
    pub has_imm: bool,
    /// The sender asked for a solicited event.
    pub solicited: bool,
    /// Packet sequence number (24 bits, [`PSN_MASK`]).
    pub psn: u32,
    /// Immediate data.
    pub imm: u32,
    /// Byte offset of this segment's payload in its message (for traces: a responder derives
    /// it from the PSN, since RoCE frames do not carry it).
    pub offset: u32,
    /// WRITE: where this segment's bytes go; READ request: where to read from. A responder
    /// reads it (with `rkey` and `dma_len`) only from the first segment of a WRITE, as a RETH.
    pub remote_addr: u64,
    /// Remote key for WRITE and READ.
    pub rkey: u32,
    /// Whole-message length (WRITE, READ request).
    pub dma_len: u32,
    /// ACK/NAK meaning.
    pub syndrome: Syndrome,
    /// Payload bytes that follow the header.
    pub payload_len: u32,
    /// Atomic request: [swap or addend, compare]; atomic ACK: [old value, 0].
    pub atomic: [u64; 2],
    /// A datagram of the unreliable datagram service (UB's UM, verbs' UD): a single-packet
    /// SEND that names its sending queue (a DETH on a byte wire), is never acknowledged and is
    /// taken by the receiving queue from any sender (`device/datagram.rs`).
    pub datagram: bool,
}

impl PacketHeader {
    /// What the packet is, in a word or two ("SEND", "ACK", "RNR NAK", ...): its name in traces.
    pub fn name(&self) -> &'static str {
        match self.kind {
            PacketKind::Send => "SEND",
            PacketKind::Write => "WRITE",
            PacketKind::ReadRequest => "READ request",
            PacketKind::ReadResponse => "READ response",
            PacketKind::AtomicRequest if self.has_imm => "FETCH_ADD",
            PacketKind::AtomicRequest => "COMPARE_SWAP",
            PacketKind::AtomicAck => "ATOMIC ACK",
            PacketKind::Ack => match self.syndrome {
                Syndrome::Ack => "ACK",
                Syndrome::RnrNak(_) => "RNR NAK",
                Syndrome::NakSequence => "NAK sequence",
                Syndrome::NakInvalidRequest => "NAK invalid request",
                Syndrome::NakRemoteAccess => "NAK remote access",
                Syndrome::NakRemoteOperation => "NAK remote operation",
            },
        }
    }
}
