//! Packets: what travels on a wire between two NICs. Headers only carry numbers (queue numbers,
//! sequence numbers, remote addresses and keys) — never a pointer into another host's memory.

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
}

impl PacketKind {
    /// True for packets a requester sends (and a responder handles).
    pub fn is_request(self) -> bool {
        matches!(self, PacketKind::Send | PacketKind::Write | PacketKind::ReadRequest)
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
    /// Sending queue.
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
    /// Packet sequence number.
    pub psn: u32,
    /// Immediate data.
    pub imm: u32,
    /// Byte offset of this segment's payload in its message.
    pub offset: u32,
    /// WRITE: where this segment's bytes go; READ request: where to read from.
    pub remote_addr: u64,
    /// Remote key for WRITE and READ.
    pub rkey: u32,
    /// Whole-message length (WRITE, READ request).
    pub dma_len: u32,
    /// ACK/NAK meaning.
    pub syndrome: Syndrome,
    /// Payload bytes that follow the header.
    pub payload_len: u32,
}

impl PacketHeader {
    /// What the packet is, in a word or two ("SEND", "ACK", "RNR NAK", ...): its name in traces.
    pub fn name(&self) -> &'static str {
        match self.kind {
            PacketKind::Send => "SEND",
            PacketKind::Write => "WRITE",
            PacketKind::ReadRequest => "READ request",
            PacketKind::ReadResponse => "READ response",
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
