//! RoCEv2: the simulator's packets as the bytes a RoCEv2 reliable-connected (RC) NIC puts on the
//! wire, so that a capture opens in Wireshark and (later) a byte wire can talk to Linux's
//! Soft-RoCE. The layout follows `shared/reference/rocev2.md` (rxe and Wireshark) and
//! `docs/sim.md` section "Frames on the wire (RoCEv2)", which has the byte tables.
//!
//! Two levels:
//!
//! - the **UDP payload** — BTH, extension headers (RETH, AETH, ImmDt), payload, pad, ICRC — what
//!   a UDP wire sends in one datagram: [`encode_udp`] / [`decode_udp`]. The ICRC covers the IPv4
//!   and UDP headers too, so both sides name the [`Endpoints`] (addresses and ports); the IPv4
//!   header it is computed over has ID 0 and DF set (what [`encode_ethernet`] sends);
//! - the **Ethernet frame** — Ethernet II, IPv4, UDP to port 4791, then the above — for captures:
//!   [`encode_ethernet`] / [`decode_ethernet`]. Its ICRC is over the frame's own IPv4 and UDP
//!   headers, so frames from real NICs (any IP ID, TOS, TTL) decode as well.
//!
//! Encoding never allocates: it writes into the caller's buffer. Decoding never panics: every
//! malformed input is a [`FrameError`], and the decoded [`Frame`] borrows its payload from the
//! input.
//!
//! **What a frame does not carry**, compared with [`PacketHeader`]: the NIC addresses (they are
//! the IPv4 addresses, or the byte wire's own addressing), the sending queue number (the
//! receiving queue knows its peer), the byte offset of a middle or last segment and, on WRITE
//! middle and last segments, the RETH (the receiving queue keeps them from the first segment),
//! the upper 8 bits of the sim's 32-bit PSN, the immediate data and the solicited flag of
//! segments other than the last, and the exact RNR wait (it is sent as a 5-bit RNR timer code).
//! [`Frame::to_header`] rebuilds a `PacketHeader` from a frame and what the receiver supplies in
//! an [`RxContext`].

mod frame;
pub mod icrc;

pub use frame::{
    decode_ethernet, decode_udp, decode_udp_any_id, encode_ethernet, encode_udp, encode_udp_with,
    ethernet_len, udp_icrc, udp_len, EthFrame, Link,
};

use crate::packet::{PacketHeader, PacketKind, Syndrome};
use std::fmt;

/// The UDP destination port of RoCEv2 (IANA), on every packet including responses.
pub const ROCE_PORT: u16 = 4791;
/// Length of the Base Transport Header.
pub const BTH_LEN: usize = 12;
/// Length of the RDMA Extended Transport Header (WRITE first/only, READ request).
pub const RETH_LEN: usize = 16;
/// Length of the ACK Extended Transport Header (ACK, READ response first/last/only).
pub const AETH_LEN: usize = 4;
/// Length of the immediate data header.
pub const IMMDT_LEN: usize = 4;
/// Length of the Reliable Datagram Extended Transport Header (EE context): RD packets.
pub const RDETH_LEN: usize = 4;
/// Length of the Datagram Extended Transport Header (Q_Key, source QP): UD packets.
pub const DETH_LEN: usize = 8;
/// The Q_Key the simulator's datagrams carry (receivers do not check it: the simulated device
/// has no Q_Key per queue; UB's UM jetties are guarded by their token instead).
pub const SIM_QKEY: u32 = 0x8001_0000;
/// Bytes of an AtomicETH.
pub const ATOMIC_ETH_LEN: usize = 28;
/// Bytes of an AtomicAckETH.
pub const ATOMIC_ACK_ETH_LEN: usize = 8;
/// Length of the invariant CRC that ends every packet.
pub const ICRC_LEN: usize = 4;
/// Ethernet II header (no VLAN tag, no FCS).
pub const ETH_LEN: usize = 14;
/// IPv4 header without options.
pub const IPV4_LEN: usize = 20;
/// UDP header.
pub const UDP_LEN: usize = 8;
/// The largest UDP payload one IPv4 datagram holds (65,535 − 20 − 8).
pub const MAX_UDP_PAYLOAD: usize = 65_535 - IPV4_LEN - UDP_LEN;
/// The default partition key (full membership), the only one the sim sends.
pub const DEFAULT_PKEY: u16 = 0xFFFF;
/// The AETH syndrome of a plain ACK: credit code 31, "unlimited" (the sim has no credits; rxe
/// sends the same).
pub const ACK_UNLIMITED: u8 = 0x1F;

/// The RC opcodes the simulator sends (BTH byte 0, transport class RC = 0x00).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Opcode {
    /// First segment of a multi-packet SEND.
    SendFirst = 0x00,
    /// A segment of a SEND that is neither first nor last.
    SendMiddle = 0x01,
    /// Last segment of a multi-packet SEND.
    SendLast = 0x02,
    /// Last segment of a multi-packet SEND with immediate (ImmDt).
    SendLastWithImmediate = 0x03,
    /// A single-packet SEND.
    SendOnly = 0x04,
    /// A single-packet SEND with immediate (ImmDt).
    SendOnlyWithImmediate = 0x05,
    /// First segment of a multi-packet WRITE (RETH).
    RdmaWriteFirst = 0x06,
    /// A middle segment of a WRITE.
    RdmaWriteMiddle = 0x07,
    /// Last segment of a multi-packet WRITE.
    RdmaWriteLast = 0x08,
    /// Last segment of a multi-packet WRITE with immediate (ImmDt).
    RdmaWriteLastWithImmediate = 0x09,
    /// A single-packet WRITE (RETH).
    RdmaWriteOnly = 0x0A,
    /// A single-packet WRITE with immediate (RETH, ImmDt).
    RdmaWriteOnlyWithImmediate = 0x0B,
    /// An RDMA READ request (RETH, no payload).
    RdmaReadRequest = 0x0C,
    /// First segment of a multi-packet READ response (AETH).
    RdmaReadResponseFirst = 0x0D,
    /// A middle segment of a READ response.
    RdmaReadResponseMiddle = 0x0E,
    /// Last segment of a multi-packet READ response (AETH).
    RdmaReadResponseLast = 0x0F,
    /// A single-packet READ response (AETH).
    RdmaReadResponseOnly = 0x10,
    /// ACK, NAK or RNR NAK (AETH, no payload).
    Acknowledge = 0x11,
    /// The answer to an atomic (AETH, AtomicAckETH: the word's old value).
    AtomicAcknowledge = 0x12,
    /// Atomic compare-and-swap request (AtomicETH).
    CompareSwap = 0x13,
    /// Atomic fetch-and-add request (AtomicETH).
    FetchAdd = 0x14,
    /// RD class, used for the datagram service's WRITE (RDETH, DETH, RETH): RoCEv2 has no
    /// unreliable memory operation, and RD's is the nearest layout that names the source queue.
    RdRdmaWriteOnly = 0x4A,
    /// RD WRITE with immediate (RDETH, DETH, RETH, ImmDt).
    RdRdmaWriteOnlyWithImmediate = 0x4B,
    /// RD READ request (RDETH, DETH, RETH).
    RdRdmaReadRequest = 0x4C,
    /// RD READ response, single packet (RDETH, AETH).
    RdRdmaReadResponseOnly = 0x50,
    /// RD ACKNOWLEDGE (RDETH, AETH): the answer of the reliable datagram service (RM).
    RdAcknowledge = 0x51,
    /// UD: a datagram (DETH), the only UD opcode besides the next.
    UdSendOnly = 0x64,
    /// UD: a datagram with immediate (DETH, ImmDt).
    UdSendOnlyWithImmediate = 0x65,
}

impl Opcode {
    /// The two unreliable-datagram opcodes the simulator sends (UM datagrams).
    pub const UD: [Opcode; 2] = [Opcode::UdSendOnly, Opcode::UdSendOnlyWithImmediate];

    /// Every RC opcode, in numeric order.
    pub const ALL: [Opcode; 21] = [
        Opcode::SendFirst,
        Opcode::SendMiddle,
        Opcode::SendLast,
        Opcode::SendLastWithImmediate,
        Opcode::SendOnly,
        Opcode::SendOnlyWithImmediate,
        Opcode::RdmaWriteFirst,
        Opcode::RdmaWriteMiddle,
        Opcode::RdmaWriteLast,
        Opcode::RdmaWriteLastWithImmediate,
        Opcode::RdmaWriteOnly,
        Opcode::RdmaWriteOnlyWithImmediate,
        Opcode::RdmaReadRequest,
        Opcode::RdmaReadResponseFirst,
        Opcode::RdmaReadResponseMiddle,
        Opcode::RdmaReadResponseLast,
        Opcode::RdmaReadResponseOnly,
        Opcode::Acknowledge,
        Opcode::AtomicAcknowledge,
        Opcode::CompareSwap,
        Opcode::FetchAdd,
    ];

    /// The opcode of BTH byte `b`, or why it is not one the sim handles: another transport class
    /// (UC, RD, UD other than SEND_ONLY, CNP, vendor), an RC opcode the sim does not implement
    /// (SEND with invalidate, FLUSH, ATOMIC WRITE), or a reserved value.
    pub fn from_byte(b: u8) -> Result<Opcode, FrameError> {
        match b {
            0x4A => return Ok(Opcode::RdRdmaWriteOnly),
            0x4B => return Ok(Opcode::RdRdmaWriteOnlyWithImmediate),
            0x4C => return Ok(Opcode::RdRdmaReadRequest),
            0x50 => return Ok(Opcode::RdRdmaReadResponseOnly),
            0x51 => return Ok(Opcode::RdAcknowledge),
            0x64 => return Ok(Opcode::UdSendOnly),
            0x65 => return Ok(Opcode::UdSendOnlyWithImmediate),
            _ => {}
        }
        if b & 0xE0 != 0 {
            return Err(FrameError::NotRc(b));
        }
        match b {
            0x00..=0x14 => Ok(Opcode::ALL[b as usize]),
            0x16 | 0x17 | 0x1C | 0x1D => Err(FrameError::UnsupportedOpcode(b)),
            _ => Err(FrameError::UnknownOpcode(b)),
        }
    }

    /// The opcode byte.
    pub const fn byte(self) -> u8 {
        self as u8
    }

    /// The opcode's name as the InfiniBand specification (and `ib_pack.h`) spells it.
    pub const fn name(self) -> &'static str {
        match self {
            Opcode::SendFirst => "SEND_FIRST",
            Opcode::SendMiddle => "SEND_MIDDLE",
            Opcode::SendLast => "SEND_LAST",
            Opcode::SendLastWithImmediate => "SEND_LAST_WITH_IMMEDIATE",
            Opcode::SendOnly => "SEND_ONLY",
            Opcode::SendOnlyWithImmediate => "SEND_ONLY_WITH_IMMEDIATE",
            Opcode::RdmaWriteFirst => "RDMA_WRITE_FIRST",
            Opcode::RdmaWriteMiddle => "RDMA_WRITE_MIDDLE",
            Opcode::RdmaWriteLast => "RDMA_WRITE_LAST",
            Opcode::RdmaWriteLastWithImmediate => "RDMA_WRITE_LAST_WITH_IMMEDIATE",
            Opcode::RdmaWriteOnly => "RDMA_WRITE_ONLY",
            Opcode::RdmaWriteOnlyWithImmediate => "RDMA_WRITE_ONLY_WITH_IMMEDIATE",
            Opcode::RdmaReadRequest => "RDMA_READ_REQUEST",
            Opcode::RdmaReadResponseFirst => "RDMA_READ_RESPONSE_FIRST",
            Opcode::RdmaReadResponseMiddle => "RDMA_READ_RESPONSE_MIDDLE",
            Opcode::RdmaReadResponseLast => "RDMA_READ_RESPONSE_LAST",
            Opcode::RdmaReadResponseOnly => "RDMA_READ_RESPONSE_ONLY",
            Opcode::Acknowledge => "ACKNOWLEDGE",
            Opcode::AtomicAcknowledge => "ATOMIC_ACKNOWLEDGE",
            Opcode::CompareSwap => "COMPARE_SWAP",
            Opcode::FetchAdd => "FETCH_ADD",
            Opcode::RdRdmaWriteOnly => "RD_RDMA_WRITE_ONLY",
            Opcode::RdRdmaWriteOnlyWithImmediate => "RD_RDMA_WRITE_ONLY_WITH_IMMEDIATE",
            Opcode::RdRdmaReadRequest => "RD_RDMA_READ_REQUEST",
            Opcode::RdRdmaReadResponseOnly => "RD_RDMA_READ_RESPONSE_ONLY",
            Opcode::RdAcknowledge => "RD_ACKNOWLEDGE",
            Opcode::UdSendOnly => "UD_SEND_ONLY",
            Opcode::UdSendOnlyWithImmediate => "UD_SEND_ONLY_WITH_IMMEDIATE",
        }
    }

    /// What kind of sim packet this opcode is.
    pub const fn kind(self) -> PacketKind {
        match self as u8 {
            0x00..=0x05 | 0x64 | 0x65 => PacketKind::Send,
            0x06..=0x0B | 0x4A | 0x4B => PacketKind::Write,
            0x0C | 0x4C => PacketKind::ReadRequest,
            0x0D..=0x10 | 0x50 => PacketKind::ReadResponse,
            0x12 => PacketKind::AtomicAck,
            0x13 | 0x14 => PacketKind::AtomicRequest,
            _ => PacketKind::Ack,
        }
    }

    /// The first packet of its message (FIRST or ONLY; a READ request and an ACK count as both
    /// first and last).
    pub const fn is_first(self) -> bool {
        matches!(
            self,
            Opcode::SendFirst
                | Opcode::SendOnly
                | Opcode::SendOnlyWithImmediate
                | Opcode::RdmaWriteFirst
                | Opcode::RdmaWriteOnly
                | Opcode::RdmaWriteOnlyWithImmediate
                | Opcode::RdmaReadRequest
                | Opcode::RdmaReadResponseFirst
                | Opcode::RdmaReadResponseOnly
                | Opcode::Acknowledge
                | Opcode::AtomicAcknowledge
                | Opcode::CompareSwap
                | Opcode::FetchAdd
                | Opcode::UdSendOnly
                | Opcode::UdSendOnlyWithImmediate
                | Opcode::RdRdmaWriteOnly
                | Opcode::RdRdmaWriteOnlyWithImmediate
                | Opcode::RdRdmaReadRequest
                | Opcode::RdRdmaReadResponseOnly
                | Opcode::RdAcknowledge
        )
    }

    /// The last packet of its message (LAST or ONLY, a READ request, an ACK).
    pub const fn is_last(self) -> bool {
        matches!(
            self,
            Opcode::SendLast
                | Opcode::SendLastWithImmediate
                | Opcode::SendOnly
                | Opcode::SendOnlyWithImmediate
                | Opcode::RdmaWriteLast
                | Opcode::RdmaWriteLastWithImmediate
                | Opcode::RdmaWriteOnly
                | Opcode::RdmaWriteOnlyWithImmediate
                | Opcode::RdmaReadRequest
                | Opcode::RdmaReadResponseLast
                | Opcode::RdmaReadResponseOnly
                | Opcode::Acknowledge
                | Opcode::AtomicAcknowledge
                | Opcode::CompareSwap
                | Opcode::FetchAdd
                | Opcode::UdSendOnly
                | Opcode::UdSendOnlyWithImmediate
                | Opcode::RdRdmaWriteOnly
                | Opcode::RdRdmaWriteOnlyWithImmediate
                | Opcode::RdRdmaReadRequest
                | Opcode::RdRdmaReadResponseOnly
                | Opcode::RdAcknowledge
        )
    }

    /// Carries a DETH (Q_Key, source QP): the UD opcodes.
    pub const fn has_deth(self) -> bool {
        matches!(
            self,
            Opcode::UdSendOnly
                | Opcode::UdSendOnlyWithImmediate
                | Opcode::RdRdmaWriteOnly
                | Opcode::RdRdmaWriteOnlyWithImmediate
                | Opcode::RdRdmaReadRequest
        )
    }

    /// Carries an RDETH (EE context): the RD opcodes.
    pub const fn has_rdeth(self) -> bool {
        matches!(
            self,
            Opcode::RdRdmaWriteOnly
                | Opcode::RdRdmaWriteOnlyWithImmediate
                | Opcode::RdRdmaReadRequest
                | Opcode::RdRdmaReadResponseOnly
                | Opcode::RdAcknowledge
        )
    }

    /// Carries a RETH: WRITE first/only, READ request.
    pub const fn has_reth(self) -> bool {
        matches!(
            self,
            Opcode::RdmaWriteFirst
                | Opcode::RdmaWriteOnly
                | Opcode::RdmaWriteOnlyWithImmediate
                | Opcode::RdmaReadRequest
                | Opcode::RdRdmaWriteOnly
                | Opcode::RdRdmaWriteOnlyWithImmediate
                | Opcode::RdRdmaReadRequest
        )
    }

    /// Carries an AETH: ACKNOWLEDGE, ATOMIC_ACKNOWLEDGE and READ response first/last/only.
    pub const fn has_aeth(self) -> bool {
        matches!(
            self,
            Opcode::Acknowledge
                | Opcode::AtomicAcknowledge
                | Opcode::RdmaReadResponseFirst
                | Opcode::RdmaReadResponseLast
                | Opcode::RdmaReadResponseOnly
                | Opcode::RdRdmaReadResponseOnly
                | Opcode::RdAcknowledge
        )
    }

    /// Carries an AtomicETH (VA, R_Key, swap or add, compare): the atomic requests.
    pub const fn has_atomic_eth(self) -> bool {
        matches!(self, Opcode::CompareSwap | Opcode::FetchAdd)
    }

    /// Carries an AtomicAckETH (the original value): ATOMIC_ACKNOWLEDGE.
    pub const fn has_atomic_ack_eth(self) -> bool {
        matches!(self, Opcode::AtomicAcknowledge)
    }

    /// Carries ImmDt: the `..._WITH_IMMEDIATE` opcodes.
    pub const fn has_imm(self) -> bool {
        matches!(
            self,
            Opcode::SendLastWithImmediate
                | Opcode::SendOnlyWithImmediate
                | Opcode::RdmaWriteLastWithImmediate
                | Opcode::RdmaWriteOnlyWithImmediate
                | Opcode::UdSendOnlyWithImmediate
                | Opcode::RdRdmaWriteOnlyWithImmediate
        )
    }

    /// May carry payload bytes (everything but READ request, the ACKNOWLEDGEs and the atomic
    /// requests).
    pub const fn has_payload(self) -> bool {
        !matches!(
            self,
            Opcode::RdmaReadRequest
                | Opcode::RdRdmaReadRequest
                | Opcode::Acknowledge
                | Opcode::RdAcknowledge
                | Opcode::AtomicAcknowledge
                | Opcode::CompareSwap
                | Opcode::FetchAdd
        )
    }

    /// Bytes of BTH plus extension headers.
    pub const fn header_len(self) -> usize {
        BTH_LEN
            + if self.has_rdeth() { RDETH_LEN } else { 0 }
            + if self.has_deth() { DETH_LEN } else { 0 }
            + if self.has_reth() { RETH_LEN } else { 0 }
            + if self.has_aeth() { AETH_LEN } else { 0 }
            + if self.has_imm() { IMMDT_LEN } else { 0 }
            + if self.has_atomic_eth() { ATOMIC_ETH_LEN } else { 0 }
            + if self.has_atomic_ack_eth() { ATOMIC_ACK_ETH_LEN } else { 0 }
    }

    /// The opcode of a sim packet: its kind, whether it is the first and/or last segment of its
    /// message, and (on the last segment of a SEND or WRITE) whether it carries an immediate.
    pub const fn of(hdr: &PacketHeader) -> Opcode {
        let (first, last, imm) = (hdr.first, hdr.last, hdr.has_imm && hdr.last);
        if hdr.datagram {
            return match hdr.kind {
                PacketKind::Write if hdr.has_imm => Opcode::RdRdmaWriteOnlyWithImmediate,
                PacketKind::Write => Opcode::RdRdmaWriteOnly,
                PacketKind::ReadRequest => Opcode::RdRdmaReadRequest,
                PacketKind::ReadResponse => Opcode::RdRdmaReadResponseOnly,
                PacketKind::Ack => Opcode::RdAcknowledge,
                _ if hdr.has_imm => Opcode::UdSendOnlyWithImmediate,
                _ => Opcode::UdSendOnly,
            };
        }
        match hdr.kind {
            PacketKind::Send => match (first, last, imm) {
                (true, true, false) => Opcode::SendOnly,
                (true, true, true) => Opcode::SendOnlyWithImmediate,
                (true, false, _) => Opcode::SendFirst,
                (false, false, _) => Opcode::SendMiddle,
                (false, true, false) => Opcode::SendLast,
                (false, true, true) => Opcode::SendLastWithImmediate,
            },
            PacketKind::Write => match (first, last, imm) {
                (true, true, false) => Opcode::RdmaWriteOnly,
                (true, true, true) => Opcode::RdmaWriteOnlyWithImmediate,
                (true, false, _) => Opcode::RdmaWriteFirst,
                (false, false, _) => Opcode::RdmaWriteMiddle,
                (false, true, false) => Opcode::RdmaWriteLast,
                (false, true, true) => Opcode::RdmaWriteLastWithImmediate,
            },
            PacketKind::ReadRequest => Opcode::RdmaReadRequest,
            PacketKind::ReadResponse => match (first, last) {
                (true, true) => Opcode::RdmaReadResponseOnly,
                (true, false) => Opcode::RdmaReadResponseFirst,
                (false, false) => Opcode::RdmaReadResponseMiddle,
                (false, true) => Opcode::RdmaReadResponseLast,
            },
            PacketKind::Ack => Opcode::Acknowledge,
            PacketKind::AtomicRequest if hdr.has_imm => Opcode::FetchAdd,
            PacketKind::AtomicRequest => Opcode::CompareSwap,
            PacketKind::AtomicAck => Opcode::AtomicAcknowledge,
        }
    }
}

impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// RDMA Extended Transport Header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Reth {
    /// Virtual address: where the WRITE's bytes go, or where the READ reads from.
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// DMA length: the whole message's length (WRITE), or the bytes to read.
    pub len: u32,
}

/// Datagram Extended Transport Header (UD): the Q_Key and the sending queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Deth {
    /// Q_Key ([`SIM_QKEY`] from the simulator).
    pub qkey: u32,
    /// Source QP (24 bits).
    pub src_qp: u32,
}

/// Atomic Extended Transport Header: the word an atomic works on and its operands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AtomicEth {
    /// Virtual address of the 8-byte word.
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// Compare-and-swap: the new value; fetch-and-add: the addend.
    pub swap_add: u64,
    /// Compare-and-swap: the value the word must have (0 for fetch-and-add).
    pub compare: u64,
}

/// ACK Extended Transport Header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Aeth {
    /// The syndrome byte: 0x00–0x1F ACK (low 5 bits: credit code), 0x20–0x3F RNR NAK (low 5
    /// bits: RNR timer code), 0x60–0x63 NAK (sequence error, invalid request, remote access,
    /// remote operational error).
    pub syndrome: u8,
    /// Message sequence number, 24 bits. The sim keeps no MSN and sends 0.
    pub msn: u32,
}

impl Aeth {
    /// The AETH of a sim ACK/NAK: RNR waits become the shortest RNR timer code at least as long;
    /// MSN 0.
    pub fn of(syndrome: Syndrome) -> Aeth {
        let syndrome = match syndrome {
            Syndrome::Ack => ACK_UNLIMITED,
            Syndrome::RnrNak(ns) => 0x20 | rnr_code(ns),
            Syndrome::NakSequence => 0x60,
            Syndrome::NakInvalidRequest => 0x61,
            Syndrome::NakRemoteAccess => 0x62,
            Syndrome::NakRemoteOperation => 0x63,
        };
        Aeth { syndrome, msn: 0 }
    }

    /// The sim's meaning of the syndrome byte; `None` for reserved values (0x40–0x5F, 0x64–0x7F,
    /// and anything with bit 7 set). An RNR NAK's wait is its timer code's duration.
    pub fn meaning(&self) -> Option<Syndrome> {
        match self.syndrome {
            0x00..=0x1F => Some(Syndrome::Ack),
            0x20..=0x3F => Some(Syndrome::RnrNak(rnr_nanos(self.syndrome & 0x1F))),
            0x60 => Some(Syndrome::NakSequence),
            0x61 => Some(Syndrome::NakInvalidRequest),
            0x62 => Some(Syndrome::NakRemoteAccess),
            0x63 => Some(Syndrome::NakRemoteOperation),
            _ => None,
        }
    }
}

/// The RNR timer code for a wait of `ns` nanoseconds: the shortest code whose duration is at
/// least that (`RnrTimer::at_least`, after rounding up to whole microseconds); waits beyond
/// 491.52 ms get code 0, 655.36 ms, the longest there is.
pub fn rnr_code(ns: u64) -> u8 {
    let us = ns.div_ceil(1000);
    bypass_hal::RnrTimer::at_least(std::time::Duration::from_micros(us)).code()
}

/// The wait an RNR timer code stands for, in nanoseconds (`code` is taken modulo 32).
pub fn rnr_nanos(code: u8) -> u64 {
    bypass_hal::RnrTimer::from_code(code & 0x1F).map_or(0, |t| t.duration().as_nanos() as u64)
}

/// The addresses and ports of a packet's IPv4/UDP headers, which its ICRC covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Endpoints {
    /// Sender's IPv4 address.
    pub src_ip: [u8; 4],
    /// Receiver's IPv4 address.
    pub dst_ip: [u8; 4],
    /// UDP source port.
    pub src_port: u16,
    /// UDP destination port ([`ROCE_PORT`]).
    pub dst_port: u16,
}

impl Endpoints {
    /// The endpoints of a sim packet: NIC `n` is IPv4 address 10.0.0.0 + n ([`ip_of_nic`]), the
    /// source port is rxe's hash of the two queue numbers ([`udp_source_port`]), the destination
    /// port 4791. `None` if a NIC address does not fit in 24 bits.
    pub fn of_packet(hdr: &PacketHeader) -> Option<Endpoints> {
        Some(Endpoints {
            src_ip: ip_of_nic(hdr.src_nic)?,
            dst_ip: ip_of_nic(hdr.dst_nic)?,
            src_port: udp_source_port(hdr.src_qpn, hdr.dst_qpn),
            dst_port: ROCE_PORT,
        })
    }
}

/// The IPv4 address of sim NIC `nic`: 10.0.0.0/8 plus the address, so NIC 1 is 10.0.0.1 and NIC
/// 258 is 10.0.1.2. `None` for addresses of 2^24 and above.
pub const fn ip_of_nic(nic: u32) -> Option<[u8; 4]> {
    if nic > 0x00FF_FFFF {
        return None;
    }
    Some([10, (nic >> 16) as u8, (nic >> 8) as u8, nic as u8])
}

/// The sim NIC of an IPv4 address: the inverse of [`ip_of_nic`] (`None` outside 10.0.0.0/8).
pub const fn nic_of_ip(ip: [u8; 4]) -> Option<u32> {
    if ip[0] != 10 {
        return None;
    }
    Some((ip[1] as u32) << 16 | (ip[2] as u32) << 8 | ip[3] as u32)
}

/// The Ethernet address of NIC `nic` of fabric `fabric`: locally administered unicast
/// `02:FF:FF:NN:NN:NN`, with the low 16 bits of the fabric id and the low 24 bits of the NIC
/// address, so captures of several fabrics in one file stay apart.
pub const fn mac_of_nic(fabric: u32, nic: u32) -> [u8; 6] {
    [0x02, (fabric >> 8) as u8, fabric as u8, (nic >> 16) as u8, (nic >> 8) as u8, nic as u8]
}

/// The UDP source port rxe uses for an RC queue pair (`rdma_get_udp_sport` with flow label 0):
/// a hash of the local and remote queue numbers in 0xC000–0xFFFF, the same from both ends, so a
/// connection's requests and responses share one port. QPNs 0x11 and 0x12 give 0xC132.
pub const fn udp_source_port(lqpn: u32, rqpn: u32) -> u16 {
    let mut fl = lqpn as u64 * rqpn as u64;
    fl ^= fl >> 20;
    fl ^= fl >> 40;
    let fl = (fl & 0xF_FFFF) as u32;
    0xC000 | ((fl & 0x3FFF) ^ ((fl & 0xF_C000) >> 14)) as u16
}

/// The 32-bit PSN whose low 24 bits are `psn24` and which is nearest to `near` (within ±2^23):
/// how a receiver that tracks 32-bit sequence numbers, as the sim's transport does, widens the
/// 24-bit PSN of a frame.
pub const fn extend_psn(psn24: u32, near: u32) -> u32 {
    let diff = (psn24.wrapping_sub(near) << 8) as i32 >> 8; // sign-extended 24-bit difference
    near.wrapping_add(diff as u32)
}

/// What a receiver knows about a frame that the frame does not carry (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RxContext {
    /// Sending NIC (from the source IPv4 address, [`nic_of_ip`], or the byte wire).
    pub src_nic: u32,
    /// Receiving NIC.
    pub dst_nic: u32,
    /// The sending queue: the receiving queue's connected peer.
    pub src_qpn: u32,
    /// A 32-bit PSN near the frame's (the receiver's expected PSN), to widen the 24-bit one.
    pub near_psn: u32,
    /// Byte offset of this segment in its message (0 on FIRST and ONLY packets).
    pub offset: u32,
    /// For WRITE middle and last segments: the RETH of the message's first segment (`va` the
    /// message's start). The segment's address becomes `va + offset`.
    pub write: Option<Reth>,
}

impl RxContext {
    /// What a wire port knows of a frame it received from NIC `src_nic` for NIC `dst_nic`: not
    /// the sending queue ([`ANY_QPN`](crate::packet::ANY_QPN)), the frame's own PSN to widen
    /// near, no segment offset and no first-segment RETH (the UDP, shm and L2 ports alike).
    pub fn from_wire(src_nic: u32, dst_nic: u32, psn: u32) -> Self {
        RxContext { src_nic, dst_nic, src_qpn: crate::packet::ANY_QPN, near_psn: psn, offset: 0, write: None }
    }
}

/// A decoded RoCEv2 RC packet (BTH onwards), or one about to be encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame<'a> {
    /// BTH opcode.
    pub opcode: Opcode,
    /// BTH SE: solicited event (set on the last packet of a SEND or WRITE with immediate whose
    /// work request asked for it).
    pub solicited: bool,
    /// BTH AckReq: the requester asks for an acknowledgement (set on the last packet of each
    /// SEND and WRITE, and on READ requests).
    pub ack_req: bool,
    /// BTH P_Key.
    pub pkey: u16,
    /// BTH DestQP (24 bits).
    pub dest_qp: u32,
    /// BTH PSN (24 bits).
    pub psn: u32,
    /// RDETH (the EE context, 24 bits; the simulator sends 0), on the RD opcodes.
    pub rdeth: Option<u32>,
    /// DETH, on the UD opcodes and the RD requests.
    pub deth: Option<Deth>,
    /// RETH, on the opcodes that carry one.
    pub reth: Option<Reth>,
    /// AETH, on the opcodes that carry one.
    pub aeth: Option<Aeth>,
    /// ImmDt, on the `..._WITH_IMMEDIATE` opcodes (big-endian on the wire).
    pub imm: Option<u32>,
    /// AtomicETH, on the atomic requests.
    pub atomic: Option<AtomicEth>,
    /// AtomicAckETH (the word's original value), on ATOMIC_ACKNOWLEDGE.
    pub atomic_ack: Option<u64>,
    /// Payload, without the pad bytes.
    pub payload: &'a [u8],
}

impl<'a> Frame<'a> {
    /// The frame of sim packet `hdr` with its `payload`:
    /// - opcode from kind, first/last and (on the last segment) `has_imm` ([`Opcode::of`]);
    /// - RETH on WRITE first/only (`remote_addr`, `rkey`, `dma_len`) and on the READ request;
    /// - AETH on ACKs ([`Aeth::of`]) and READ response first/last/only (0x1F, MSN 0);
    /// - ImmDt only on the last segment; SE only on the last segment of a SEND or a WRITE with
    ///   immediate; AckReq on the last segment of a SEND or WRITE and on READ requests;
    /// - PSN and DestQP truncated to 24 bits; P_Key 0xFFFF.
    ///
    /// `payload` must be `hdr.payload_len` bytes (checked when encoding).
    pub fn of_packet(hdr: &PacketHeader, payload: &'a [u8]) -> Frame<'a> {
        let opcode = Opcode::of(hdr);
        let rdeth = opcode.has_rdeth().then_some(0);
        let deth = opcode.has_deth().then_some(Deth { qkey: SIM_QKEY, src_qp: hdr.src_qpn & 0x00FF_FFFF });
        let reth =
            opcode.has_reth().then_some(Reth { va: hdr.remote_addr, rkey: hdr.rkey, len: hdr.dma_len });
        let atomic = opcode.has_atomic_eth().then_some(AtomicEth {
            va: hdr.remote_addr,
            rkey: hdr.rkey,
            swap_add: hdr.atomic[0],
            compare: hdr.atomic[1],
        });
        let atomic_ack = opcode.has_atomic_ack_eth().then_some(hdr.atomic[0]);
        let aeth = opcode.has_aeth().then(|| match hdr.kind {
            PacketKind::Ack => Aeth::of(hdr.syndrome),
            _ => Aeth { syndrome: ACK_UNLIMITED, msn: 0 },
        });
        let solicited = hdr.solicited
            && hdr.last
            && (hdr.kind == PacketKind::Send || (hdr.kind == PacketKind::Write && hdr.has_imm));
        let ack_req = match hdr.kind {
            PacketKind::Send | PacketKind::Write => hdr.last && !hdr.datagram,
            PacketKind::ReadRequest | PacketKind::AtomicRequest => !hdr.datagram,
            PacketKind::ReadResponse | PacketKind::Ack | PacketKind::AtomicAck => false,
        };
        Frame {
            opcode,
            solicited,
            ack_req,
            pkey: DEFAULT_PKEY,
            dest_qp: hdr.dst_qpn & 0x00FF_FFFF,
            psn: hdr.psn & 0x00FF_FFFF,
            rdeth,
            deth,
            reth,
            aeth,
            imm: opcode.has_imm().then_some(hdr.imm),
            atomic,
            atomic_ack,
            payload,
        }
    }

    /// The pad count: bytes after the payload that bring it to a multiple of 4.
    pub fn pad(&self) -> usize {
        self.payload.len().wrapping_neg() & 3
    }

    /// Bytes of the UDP payload: headers, payload, pad, ICRC.
    pub fn udp_len(&self) -> usize {
        self.opcode.header_len() + self.payload.len() + self.pad() + ICRC_LEN
    }

    /// The sim packet header of this frame, with what the frame does not carry taken from `rx`.
    /// For every header `h` the sim sends, `Frame::of_packet(&h, p).to_header(&rx)` gives `h`
    /// back, given the right `rx`, except for what the wire does not carry: `has_imm`, `imm` and
    /// `solicited` on segments other than the last (false, 0, false), `first`/`last` of READ
    /// requests (both true) and ACKs (both false), and RNR waits (the code's duration).
    pub fn to_header(&self, rx: &RxContext) -> PacketHeader {
        let op = self.opcode;
        let kind = op.kind();
        let mut h = PacketHeader {
            src_nic: rx.src_nic,
            dst_nic: rx.dst_nic,
            src_qpn: rx.src_qpn,
            dst_qpn: self.dest_qp,
            kind,
            first: op.is_first(),
            last: op.is_last(),
            has_imm: self.imm.is_some(),
            solicited: self.solicited,
            psn: extend_psn(self.psn, rx.near_psn),
            imm: self.imm.unwrap_or(0),
            offset: rx.offset,
            payload_len: self.payload.len() as u32,
            ..PacketHeader::default()
        };
        if let Some(d) = self.deth {
            h.src_qpn = d.src_qp;
        }
        h.datagram = self.deth.is_some() || self.rdeth.is_some();
        match kind {
            PacketKind::Write | PacketKind::ReadRequest => {
                let r = self.reth.or(rx.write).unwrap_or_default();
                let off = if self.reth.is_some() { 0 } else { u64::from(rx.offset) };
                h.remote_addr = r.va.wrapping_add(off);
                h.rkey = r.rkey;
                h.dma_len = r.len;
            }
            PacketKind::Ack => {
                h.first = false;
                h.last = false;
                h.syndrome = self.aeth.and_then(|a| a.meaning()).unwrap_or_default();
            }
            PacketKind::AtomicRequest => {
                let a = self.atomic.unwrap_or_default();
                h.remote_addr = a.va;
                h.rkey = a.rkey;
                h.dma_len = 8;
                h.atomic = [a.swap_add, a.compare];
                h.has_imm = op == Opcode::FetchAdd; // the sim's fetch-and-add flag
            }
            PacketKind::AtomicAck => {
                h.first = false;
                h.last = false;
                h.atomic = [self.atomic_ack.unwrap_or_default(), 0];
            }
            PacketKind::Send | PacketKind::ReadResponse => {}
        }
        h
    }
}

/// Why a packet could not be encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EncodeError {
    /// The output buffer is shorter than the frame.
    BufferTooSmall {
        /// Bytes the frame needs.
        need: usize,
        /// Bytes the buffer has.
        have: usize,
    },
    /// The frame would not fit in one IPv4 UDP datagram.
    TooLong(usize),
    /// The payload slice is not `payload_len` bytes long, or payload was given for a READ
    /// request or an ACK.
    PayloadLength {
        /// Bytes expected.
        expected: usize,
        /// Bytes given.
        got: usize,
    },
    /// A NIC address has no IPv4 address (2^24 or above).
    NicAddress(u32),
    /// A hand-built [`Frame`] lacks a header its opcode needs, or has one it must not carry.
    Inconsistent(Opcode),
}

impl fmt::Display for EncodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            EncodeError::BufferTooSmall { need, have } => {
                write!(f, "frame needs {need} bytes, buffer has {have}")
            }
            EncodeError::TooLong(n) => write!(f, "a {n}-byte RoCEv2 packet does not fit in a UDP datagram"),
            EncodeError::PayloadLength { expected, got } => {
                write!(f, "payload is {got} bytes, the header says {expected}")
            }
            EncodeError::NicAddress(n) => write!(f, "NIC address {n} has no IPv4 address (above 2^24)"),
            EncodeError::Inconsistent(op) => write!(f, "{op}: extension headers do not match the opcode"),
        }
    }
}

impl std::error::Error for EncodeError {}

/// Why bytes are not a valid RoCEv2 RC frame. Each variant is one reason, so a receiver can
/// count them apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameError {
    /// Shorter than the headers it must have.
    TooShort {
        /// Bytes there are.
        len: usize,
        /// Bytes at least needed.
        need: usize,
    },
    /// Longer than one IPv4 UDP datagram can be.
    TooLong(usize),
    /// The invariant CRC does not match (the frame was damaged, or the endpoints are not the
    /// ones it was sent with).
    BadIcrc {
        /// The ICRC the frame carries.
        sent: u32,
        /// The ICRC of its contents.
        computed: u32,
    },
    /// BTH TVer is not 0.
    BadVersion(u8),
    /// The opcode belongs to another transport class (UC, RD, UD, CNP, vendor-specific).
    NotRc(u8),
    /// An RC opcode the sim does not implement (atomics, SEND with invalidate, FLUSH, ATOMIC
    /// WRITE).
    UnsupportedOpcode(u8),
    /// A reserved RC opcode.
    UnknownOpcode(u8),
    /// The P_Key is not the default partition (its low 15 bits are not 0x7FFF).
    BadPartition(u16),
    /// The pad count is larger than the bytes after the headers, or not 0 where there is no
    /// payload.
    BadPad(u8),
    /// Payload plus pad is not a multiple of 4 bytes.
    Unaligned(usize),
    /// A READ request or ACK with bytes after its headers.
    UnexpectedPayload(Opcode),
    /// A reserved AETH syndrome, or a NAK syndrome on a READ response.
    BadSyndrome(u8),
    /// Ethernet level: the EtherType is not IPv4 (0x0800).
    NotIpv4(u16),
    /// Ethernet level: the IPv4 header is not version 4 with 20 bytes (options are not
    /// supported: the ICRC is defined over a 20-byte header).
    BadIpHeader(u8),
    /// Ethernet level: the IPv4 header checksum is wrong.
    BadIpChecksum,
    /// Ethernet level: an IPv4 fragment.
    Fragmented,
    /// Ethernet level: IPv4 protocol is not UDP.
    NotUdp(u8),
    /// Ethernet level: the UDP destination port is not 4791.
    NotRoce(u16),
    /// Ethernet level: IPv4 total length and UDP length disagree with each other or the frame.
    BadLength,
    /// Ethernet level: a non-zero UDP checksum is wrong.
    BadUdpChecksum,
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            FrameError::TooShort { len, need } => write!(f, "frame of {len} bytes, headers need {need}"),
            FrameError::TooLong(n) => write!(f, "frame of {n} bytes is longer than a UDP datagram"),
            FrameError::BadIcrc { sent, computed } => {
                write!(f, "bad ICRC: frame carries {sent:#010x}, contents give {computed:#010x}")
            }
            FrameError::BadVersion(v) => write!(f, "BTH transport version {v}, not 0"),
            FrameError::NotRc(op) => write!(f, "opcode {op:#04x} is not a reliable-connected one"),
            FrameError::UnsupportedOpcode(op) => write!(f, "RC opcode {op:#04x} is not implemented"),
            FrameError::UnknownOpcode(op) => write!(f, "RC opcode {op:#04x} is reserved"),
            FrameError::BadPartition(p) => write!(f, "P_Key {p:#06x} is not the default partition"),
            FrameError::BadPad(p) => write!(f, "pad count {p} does not fit the packet"),
            FrameError::Unaligned(n) => write!(f, "payload plus pad is {n} bytes, not a multiple of 4"),
            FrameError::UnexpectedPayload(op) => write!(f, "{op} carries payload bytes"),
            FrameError::BadSyndrome(s) => write!(f, "AETH syndrome {s:#04x} is reserved or out of place"),
            FrameError::NotIpv4(t) => write!(f, "EtherType {t:#06x} is not IPv4"),
            FrameError::BadIpHeader(b) => {
                write!(f, "IPv4 version/IHL byte {b:#04x}: not a 20-byte IPv4 header")
            }
            FrameError::BadIpChecksum => f.write_str("bad IPv4 header checksum"),
            FrameError::Fragmented => f.write_str("IPv4 fragment"),
            FrameError::NotUdp(p) => write!(f, "IPv4 protocol {p} is not UDP"),
            FrameError::NotRoce(p) => write!(f, "UDP destination port {p} is not RoCEv2's 4791"),
            FrameError::BadLength => f.write_str("IPv4 and UDP lengths disagree with the frame"),
            FrameError::BadUdpChecksum => f.write_str("bad UDP checksum"),
        }
    }
}

impl std::error::Error for FrameError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opcode_bytes_classify() {
        for (i, op) in Opcode::ALL.iter().enumerate() {
            assert_eq!(op.byte() as usize, i);
            assert_eq!(Opcode::from_byte(i as u8), Ok(*op));
        }
        for b in 0u8..=255 {
            let r = Opcode::from_byte(b);
            match b {
                0x00..=0x14 | 0x4A..=0x4C | 0x50 | 0x51 | 0x64 | 0x65 => assert!(r.is_ok()),
                0x16 | 0x17 | 0x1C | 0x1D => {
                    assert_eq!(r, Err(FrameError::UnsupportedOpcode(b)))
                }
                0x15 | 0x18..=0x1B | 0x1E | 0x1F => assert_eq!(r, Err(FrameError::UnknownOpcode(b))),
                _ => assert_eq!(r, Err(FrameError::NotRc(b))),
            }
        }
    }

    #[test]
    fn rnr_codes_round_up() {
        assert_eq!(rnr_code(100_000), 7); // 100 µs → 120 µs
        assert_eq!(rnr_nanos(7), 120_000);
        assert_eq!(rnr_code(120_000), 7);
        assert_eq!(rnr_code(120_001), 8); // a nanosecond more needs the next code (160 µs)
        assert_eq!(rnr_code(0), 1);
        assert_eq!(rnr_code(10_000), 1);
        assert_eq!(rnr_code(491_520_000), 31);
        assert_eq!(rnr_code(491_520_001), 0); // 655.36 ms
        assert_eq!(rnr_nanos(0), 655_360_000);
        for code in 0..32u8 {
            assert_eq!(rnr_code(rnr_nanos(code)), code);
        }
    }

    #[test]
    fn addresses_and_ports() {
        assert_eq!(ip_of_nic(1), Some([10, 0, 0, 1]));
        assert_eq!(ip_of_nic(258), Some([10, 0, 1, 2]));
        assert_eq!(ip_of_nic(1 << 24), None);
        assert_eq!(nic_of_ip([10, 0, 1, 2]), Some(258));
        assert_eq!(nic_of_ip([192, 168, 0, 1]), None);
        assert_eq!(mac_of_nic(0x1234, 0x05), [0x02, 0x12, 0x34, 0, 0, 5]);
        // rocev2.md §6: QPNs 0x11 and 0x12 give 0xC132, from either end.
        assert_eq!(udp_source_port(0x11, 0x12), 0xC132);
        assert_eq!(udp_source_port(0x12, 0x11), 0xC132);
        assert_eq!(udp_source_port(0, 0), 0xC000);
    }

    #[test]
    fn psn_widening() {
        assert_eq!(extend_psn(5, 3), 5);
        assert_eq!(extend_psn(0x00FF_FFFF, 0x0100_0001), 0x00FF_FFFF);
        assert_eq!(extend_psn(0x0000_0002, 0x00FF_FFFE), 0x0100_0002);
        assert_eq!(extend_psn(0x00AB_CDEF, 0xFFAB_CDEF), 0xFFAB_CDEF);
        assert_eq!(extend_psn(0x0000_0001, 0xFFFF_FFFF), 0x0000_0001); // across 2^32
        for near in [0u32, 0x7F_FFFF, 0x80_0000, 0xFFFF_FFFF, 0x1234_5678] {
            for d in [-0x7F_FFFFi32, -1, 0, 1, 0x7F_FFFF] {
                let psn = near.wrapping_add(d as u32);
                assert_eq!(extend_psn(psn & 0xFF_FFFF, near), psn);
            }
        }
    }
}
