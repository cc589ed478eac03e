//! Byte layouts of the simulated NIC's work queue entries (WQEs) and completion queue entries
//! (CQEs), shared by the driver (which writes WQEs and reads CQEs) and the device (which does the
//! opposite). All fields are little-endian. `docs/sim.md` has the same tables for hardware folk.
//!
//! WQE, `stride` bytes (a multiple of 64 chosen per queue from its SGE and inline limits):
//!
//! | bytes | field |
//! |---|---|
//! | 0 | opcode ([`WqeOp`]) |
//! | 1 | flags (`WrFlags` bits: SIGNALED 1, INLINE 2, FENCE 4, SOLICITED 8) |
//! | 2 | SGE count |
//! | 3 | owner: `((index >> log2(depth)) & 1) ^ 1` — 1 on the first pass, flips every wrap |
//! | 4..8 | immediate data |
//! | 8..16 | remote address |
//! | 16..20 | remote key |
//! | 20..24 | inline byte count |
//! | 24..28 | WQE index (low 32 bits of the producer index) |
//! | 28..32 | datagram queues: the address handle (the destination); reserved otherwise |
//! | 32.. | SGEs, 16 bytes each (addr u64, len u32, lkey u32), or inline data |
//!
//! An atomic WQE has exactly one SGE (the 8-byte result buffer); the place of a second SGE,
//! bytes 48..64, holds its operands: swap (compare-and-swap) or addend (fetch-and-add) at 48,
//! compare at 56.
//!
//! CQE, 64 bytes: a 32-bit head word written last with release ordering, then the body.
//!
//! | bytes | field |
//! |---|---|
//! | 0 | owner bit (bit 0), SOLICITED (bit 1), RECV side (bit 2), HAS_IMM (bit 3) |
//! | 1 | status ([`status_code`]) |
//! | 2 | opcode ([`cq_opcode_code`]) |
//! | 3 | reserved |
//! | 4..8 | queue number |
//! | 8..12 | WQE index the completion is for |
//! | 12..16 | byte count |
//! | 16..20 | immediate data |
//! | 20..24 | queue epoch |
//! | 24..28 | datagram receive: the sending queue's number |
//! | 28..32 | datagram receive: the sending NIC's source id (as the receiving NIC's wire names it) |
//! | 32..64 | reserved |

use bypass_hal::{CqOpcode, Sge, Status, WrFlags};

/// Size of the fixed part of a WQE.
pub const WQE_HEADER: usize = 32;
/// Size of one SGE in a WQE.
pub const WQE_SGE: usize = 16;
/// The ring's basic block: WQEs are whole numbers of blocks.
pub const BLOCK: usize = 64;
/// Largest WQE the device accepts.
pub const MAX_WQE: usize = 512;
/// Most SGEs per work request the device supports.
pub const MAX_SGE: usize = 16;
/// Most inline bytes the device supports.
pub const MAX_INLINE: usize = 256;

/// WQE opcodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum WqeOp {
    /// SEND.
    Send = 0,
    /// SEND with immediate.
    SendImm = 1,
    /// RDMA WRITE.
    Write = 2,
    /// RDMA WRITE with immediate.
    WriteImm = 3,
    /// RDMA READ.
    Read = 4,
    /// Atomic compare-and-swap (operands in bytes 48..64).
    CompareSwap = 5,
    /// Atomic fetch-and-add (the addend in bytes 48..56).
    FetchAdd = 6,
    /// A receive-queue entry.
    Recv = 0x10,
}

impl WqeOp {
    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0 => WqeOp::Send,
            1 => WqeOp::SendImm,
            2 => WqeOp::Write,
            3 => WqeOp::WriteImm,
            4 => WqeOp::Read,
            5 => WqeOp::CompareSwap,
            6 => WqeOp::FetchAdd,
            0x10 => WqeOp::Recv,
            _ => return None,
        })
    }
    /// True for operations that carry an immediate.
    pub fn has_imm(self) -> bool {
        matches!(self, WqeOp::SendImm | WqeOp::WriteImm)
    }
    /// True for the atomics.
    pub fn is_atomic(self) -> bool {
        matches!(self, WqeOp::CompareSwap | WqeOp::FetchAdd)
    }
    /// True for operations whose responses bring data back (READ, atomics): they count against
    /// `max_rd_atomic` and a FENCE waits for them.
    pub fn reads_back(self) -> bool {
        self == WqeOp::Read || self.is_atomic()
    }
}

/// The decoded fixed part of a WQE (what the device keeps after fetching it). The SGE list stays
/// in the ring, where the device reads it again whenever it moves data (as hardware re-reads a
/// gather list), so a fetched WQE is small to keep and to copy.
#[derive(Debug, Clone, Copy)]
pub struct Wqe {
    /// Operation.
    pub op: WqeOp,
    /// Work-request flags.
    pub flags: WrFlags,
    /// Immediate data.
    pub imm: u32,
    /// Remote address (WRITE, READ).
    pub remote_addr: u64,
    /// Remote key (WRITE, READ).
    pub rkey: u32,
    /// Ring index the WQE was fetched from.
    pub index: u32,
    /// Datagram queues: the address handle naming the destination.
    pub ah: u32,
    /// Number of SGEs (0 for INLINE).
    pub nsge: u8,
    /// Inline payload bytes.
    pub inline_len: u32,
    /// Payload length: the inline length, or the sum of the SGE lengths.
    pub len: u64,
    /// The first SGE (when `nsge > 0`), kept from the fetch like a NIC's WQE cache: most
    /// messages have one, and the device then never re-reads the ring for it.
    pub sge0: Sge,
    /// Atomics: [swap or addend, compare].
    pub atomic: [u64; 2],
}

impl Wqe {
    /// SGE `i`: the cached first one, or a re-read of the ring through `read`.
    #[inline]
    pub fn sge(&self, i: usize, read: impl FnOnce(usize) -> Sge) -> Sge {
        if i == 0 {
            self.sge0
        } else {
            read(i)
        }
    }
}

/// The WQE stride (bytes) for a queue allowing `max_sge` SGEs and `max_inline` inline bytes.
pub fn wqe_stride(max_sge: u32, max_inline: u32) -> usize {
    let data = (max_sge as usize * WQE_SGE).max(max_inline as usize);
    (WQE_HEADER + data).next_power_of_two().max(BLOCK)
}

/// The owner bit of ring index `index` in a ring of `2^log2_depth` entries.
#[inline]
pub fn owner_bit(index: u32, log2_depth: u32) -> u8 {
    ((index >> log2_depth) & 1) as u8
}

/// Writes an INLINE payload into the WQE's data area and returns its length.
pub type InlineFill<'a> = &'a mut dyn FnMut(&mut [u8]) -> u32;

/// Encodes a send or receive WQE into `buf` (which is the WQE's full stride). `inline` is the
/// payload of an INLINE WQE (gathered by the driver at post time).
#[allow(clippy::too_many_arguments)]
pub fn encode_wqe(
    buf: &mut [u8],
    op: WqeOp,
    flags: WrFlags,
    owner: u8,
    imm: u32,
    remote_addr: u64,
    rkey: u32,
    index: u32,
    sges: &[Sge],
    inline: Option<InlineFill<'_>>,
) {
    buf[0] = op as u8;
    buf[1] = flags.bits() as u8;
    buf[3] = owner;
    buf[4..8].copy_from_slice(&imm.to_le_bytes());
    buf[8..16].copy_from_slice(&remote_addr.to_le_bytes());
    buf[16..20].copy_from_slice(&rkey.to_le_bytes());
    buf[24..28].copy_from_slice(&index.to_le_bytes());
    match inline {
        Some(fill) => {
            buf[2] = 0;
            let n = fill(&mut buf[WQE_HEADER..]);
            buf[20..24].copy_from_slice(&n.to_le_bytes());
        }
        None => {
            buf[2] = sges.len() as u8;
            buf[20..24].copy_from_slice(&0u32.to_le_bytes());
            for (i, s) in sges.iter().enumerate() {
                let o = WQE_HEADER + i * WQE_SGE;
                buf[o..o + 8].copy_from_slice(&s.addr.to_le_bytes());
                buf[o + 8..o + 12].copy_from_slice(&s.len.to_le_bytes());
                buf[o + 12..o + 16].copy_from_slice(&s.lkey.to_le_bytes());
            }
        }
    }
}

/// Offset of an atomic WQE's operands (the place of its second SGE).
const ATOMIC_OPERANDS: usize = WQE_HEADER + WQE_SGE;

/// Writes an atomic WQE's operands (after [`encode_wqe`] with its one SGE).
pub fn encode_atomic(buf: &mut [u8], operands: [u64; 2]) {
    buf[ATOMIC_OPERANDS..ATOMIC_OPERANDS + 8].copy_from_slice(&operands[0].to_le_bytes());
    buf[ATOMIC_OPERANDS + 8..ATOMIC_OPERANDS + 16].copy_from_slice(&operands[1].to_le_bytes());
}

/// Why a fetched WQE was rejected by the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WqeFault {
    /// Unknown opcode or an impossible field: a driver bug or corrupted ring.
    Malformed,
    /// The owner bit does not match the ring pass: the device read a stale entry.
    StaleOwner,
}

/// Decodes the fixed part of a WQE fetched from ring index `index`. `buf` holds the first block
/// (a shorter buffer is `Malformed`); `stride` is the queue's WQE size. The returned `len` is the inline length; for SGE
/// WQEs the caller adds up the SGEs (see [`decode_sge`]).
pub fn decode_wqe(buf: &[u8], stride: usize, expect_owner: u8, index: u32) -> Result<Wqe, WqeFault> {
    if buf.len() < BLOCK {
        return Err(WqeFault::Malformed);
    }
    let u32_at = |o: usize| u32::from_le_bytes([buf[o], buf[o + 1], buf[o + 2], buf[o + 3]]);
    let u64_at = |o: usize| u64::from(u32_at(o)) | (u64::from(u32_at(o + 4)) << 32);
    if buf[3] != expect_owner || u32_at(24) != index {
        return Err(WqeFault::StaleOwner);
    }
    let op = WqeOp::from_u8(buf[0]).ok_or(WqeFault::Malformed)?;
    let flags = WrFlags::from_bits(u32::from(buf[1])).ok_or(WqeFault::Malformed)?;
    let nsge = buf[2];
    let inline_len = u32_at(20);
    if usize::from(nsge) > MAX_SGE
        || WQE_HEADER + usize::from(nsge) * WQE_SGE > stride
        || WQE_HEADER + inline_len as usize > stride
    {
        return Err(WqeFault::Malformed);
    }
    Ok(Wqe {
        op,
        flags,
        imm: u32_at(4),
        remote_addr: u64_at(8),
        rkey: u32_at(16),
        index,
        ah: u32_at(28),
        nsge,
        inline_len,
        len: u64::from(inline_len),
        sge0: if nsge > 0 {
            decode_sge(buf[WQE_HEADER..WQE_HEADER + WQE_SGE].try_into().expect("16 bytes"))
        } else {
            Sge::default()
        },
        atomic: if op.is_atomic() {
            if nsge != 1 {
                return Err(WqeFault::Malformed);
            }
            [u64_at(ATOMIC_OPERANDS), u64_at(ATOMIC_OPERANDS + 8)]
        } else {
            [0; 2]
        },
    })
}

/// Decodes one 16-byte SGE.
pub fn decode_sge(b: &[u8; WQE_SGE]) -> Sge {
    let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
    Sge { addr: u64::from(u32_at(0)) | (u64::from(u32_at(4)) << 32), len: u32_at(8), lkey: u32_at(12) }
}

/// CQE head-word bits.
pub mod cqe_flags {
    /// Owner bit.
    pub const OWNER: u32 = 1;
    /// The message was sent SOLICITED.
    pub const SOLICITED: u32 = 1 << 1;
    /// A receive-side completion (look the WQE index up in the receive side table).
    pub const RECV: u32 = 1 << 2;
    /// The immediate field is valid.
    pub const HAS_IMM: u32 = 1 << 3;
}

/// A decoded CQE.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cqe {
    pub flags: u32,
    pub status: Status,
    pub opcode: CqOpcode,
    pub qpn: u32,
    pub wqe_index: u32,
    pub byte_len: u32,
    pub imm: u32,
    /// The queue's epoch when the CQE was written (a reset bumps it; the driver drops CQEs of an
    /// earlier epoch, as hardware purges them).
    pub epoch: u32,
    /// A datagram receive: the sending queue (0 otherwise).
    pub src_qpn: u32,
    /// A datagram receive: the sending NIC's source id (0 otherwise).
    pub src_nic: u32,
}

/// Wire code of a completion status.
pub fn status_code(s: Status) -> u8 {
    match s {
        Status::Success => 0,
        Status::LocalLength => 1,
        Status::LocalQueueOperation => 2,
        Status::LocalProtection => 3,
        Status::RemoteInvalidRequest => 4,
        Status::RemoteAccess => 5,
        Status::RemoteOperation => 6,
        Status::RetryExceeded => 7,
        Status::RnrRetryExceeded => 8,
        Status::Flushed => 9,
        Status::BadResponse => 10,
        _ => 11,
    }
}

/// Inverse of [`status_code`].
pub fn status_from_code(c: u8) -> Status {
    match c {
        0 => Status::Success,
        1 => Status::LocalLength,
        2 => Status::LocalQueueOperation,
        3 => Status::LocalProtection,
        4 => Status::RemoteInvalidRequest,
        5 => Status::RemoteAccess,
        6 => Status::RemoteOperation,
        7 => Status::RetryExceeded,
        8 => Status::RnrRetryExceeded,
        9 => Status::Flushed,
        10 => Status::BadResponse,
        _ => Status::General,
    }
}

/// Wire code of a completion opcode.
pub fn cq_opcode_code(o: CqOpcode) -> u8 {
    match o {
        CqOpcode::Send => 0,
        CqOpcode::Write => 1,
        CqOpcode::Read => 2,
        CqOpcode::Recv => 3,
        CqOpcode::RecvWriteImm => 4,
        CqOpcode::CompareSwap => 5,
        CqOpcode::FetchAdd => 6,
    }
}

/// Inverse of [`cq_opcode_code`].
pub fn cq_opcode_from_code(c: u8) -> CqOpcode {
    match c {
        1 => CqOpcode::Write,
        2 => CqOpcode::Read,
        3 => CqOpcode::Recv,
        4 => CqOpcode::RecvWriteImm,
        5 => CqOpcode::CompareSwap,
        6 => CqOpcode::FetchAdd,
        _ => CqOpcode::Send,
    }
}

/// Head word of a CQE, without the owner bit.
pub fn cqe_head(c: &Cqe) -> u32 {
    (c.flags & !cqe_flags::OWNER)
        | (u32::from(status_code(c.status)) << 8)
        | (u32::from(cq_opcode_code(c.opcode)) << 16)
}

/// Encodes the body (bytes 4..64) of a CQE.
pub fn encode_cqe_body(c: &Cqe, body: &mut [u8; 60]) {
    body[0..4].copy_from_slice(&c.qpn.to_le_bytes());
    body[4..8].copy_from_slice(&c.wqe_index.to_le_bytes());
    body[8..12].copy_from_slice(&c.byte_len.to_le_bytes());
    body[12..16].copy_from_slice(&c.imm.to_le_bytes());
    body[16..20].copy_from_slice(&c.epoch.to_le_bytes());
    body[20..24].copy_from_slice(&c.src_qpn.to_le_bytes());
    body[24..28].copy_from_slice(&c.src_nic.to_le_bytes());
}

/// Decodes a CQE from its head word and body.
pub fn decode_cqe(head: u32, body: &[u8; 60]) -> Cqe {
    let u32_at = |o: usize| u32::from_le_bytes([body[o], body[o + 1], body[o + 2], body[o + 3]]);
    Cqe {
        flags: head & 0xff,
        status: status_from_code((head >> 8) as u8),
        opcode: cq_opcode_from_code((head >> 16) as u8),
        qpn: u32_at(0),
        wqe_index: u32_at(4),
        byte_len: u32_at(8),
        imm: u32_at(12),
        epoch: u32_at(16),
        src_qpn: u32_at(20),
        src_nic: u32_at(24),
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn wqe_round_trips() {
        let mut buf = [0u8; 128];
        let sges = [Sge::new(0x1000, 64, 7), Sge::new(0x2000, 1, 9)];
        encode_wqe(
            &mut buf,
            WqeOp::WriteImm,
            WrFlags::SIGNALED,
            1,
            0xabcd,
            0xdead_beef_0000,
            42,
            5,
            &sges,
            None,
        );
        let w = decode_wqe(&buf, 128, 1, 5).unwrap();
        assert_eq!(w.op, WqeOp::WriteImm);
        assert_eq!(w.nsge, 2);
        for (i, s) in sges.iter().enumerate() {
            let o = WQE_HEADER + i * WQE_SGE;
            assert_eq!(decode_sge(buf[o..o + WQE_SGE].try_into().unwrap()), *s);
        }
        assert_eq!((w.imm, w.remote_addr, w.rkey), (0xabcd, 0xdead_beef_0000, 42));
        assert_eq!(decode_wqe(&buf, 128, 0, 5).unwrap_err(), WqeFault::StaleOwner);
        assert_eq!(decode_wqe(&buf, 128, 1, 6).unwrap_err(), WqeFault::StaleOwner);
        assert_eq!(decode_wqe(&buf, 32, 1, 5).unwrap_err(), WqeFault::Malformed, "SGEs past the stride");
        buf[0] = 0x77;
        assert_eq!(decode_wqe(&buf, 128, 1, 5).unwrap_err(), WqeFault::Malformed);
    }

    #[test]
    fn a_short_buffer_is_malformed_not_a_panic() {
        for len in [0, 1, 31, 63] {
            assert_eq!(decode_wqe(&vec![0u8; len], 64, 1, 0).unwrap_err(), WqeFault::Malformed);
        }
    }

    #[test]
    fn strides_are_whole_blocks() {
        assert_eq!(wqe_stride(1, 0), 64);
        assert_eq!(wqe_stride(2, 32), 64);
        assert_eq!(wqe_stride(4, 64), 128);
        assert_eq!(wqe_stride(16, 256), 512);
    }

    #[test]
    fn cqe_round_trips() {
        let c = Cqe {
            flags: cqe_flags::RECV | cqe_flags::HAS_IMM,
            status: Status::RemoteAccess,
            opcode: CqOpcode::RecvWriteImm,
            qpn: 3,
            wqe_index: 99,
            byte_len: 4096,
            imm: 0x1234,
            epoch: 3,
            src_qpn: 0x42,
            src_nic: 7,
        };
        let mut body = [0u8; 60];
        encode_cqe_body(&c, &mut body);
        assert_eq!(decode_cqe(cqe_head(&c) | cqe_flags::OWNER, &body), Cqe { flags: c.flags | 1, ..c });
    }
}
