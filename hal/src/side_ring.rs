//! What the verbs and urma backends share to map a completion back to its work request: the
//! side ring (slot → user `wr_id` and operation, since a failed completion carries no opcode and
//! both libraries return only the `wr_id`/`user_ctx` the backend chose) and the packing of an
//! epoch with a counter or a queue state into one atomic word (so a queue that reuses a queue
//! number, or a reset queue, never takes a stale completion for its own).

use crate::{CqOpcode, QueueState};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};

/// `epoch` in the high half, `low` in the low half.
pub(crate) fn pack(epoch: u16, low: u32) -> u64 {
    (u64::from(epoch) << 32) | u64::from(low)
}

/// The inverse of [`pack`].
pub(crate) fn unpack(v: u64) -> (u16, u32) {
    ((v >> 32) as u16, v as u32)
}

/// A queue state with its epoch, in one word.
pub(crate) fn pack_state(epoch: u16, s: QueueState) -> u32 {
    let code = match s {
        QueueState::Reset => 0,
        QueueState::Ready => 1,
        QueueState::Error => 2,
    };
    (u32::from(epoch) << 8) | code
}

/// The state of a [`pack_state`] word.
pub(crate) fn state_of(code: u32) -> QueueState {
    match code & 0xff {
        1 => QueueState::Ready,
        2 => QueueState::Error,
        _ => QueueState::Reset,
    }
}

/// The kind of a work request, kept next to its user `wr_id` (failed completions carry no opcode).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Send = 0,
    Write = 1,
    Read = 2,
    Recv = 3,
    CompareSwap = 4,
    FetchAdd = 5,
}

impl Op {
    fn from_u8(v: u8) -> Op {
        match v {
            1 => Op::Write,
            2 => Op::Read,
            3 => Op::Recv,
            4 => Op::CompareSwap,
            5 => Op::FetchAdd,
            _ => Op::Send,
        }
    }

    /// The completion opcode of a successful request of this kind.
    pub(crate) fn opcode(self) -> CqOpcode {
        match self {
            Op::Send => CqOpcode::Send,
            Op::Write => CqOpcode::Write,
            Op::Read => CqOpcode::Read,
            Op::Recv => CqOpcode::Recv,
            Op::CompareSwap => CqOpcode::CompareSwap,
            Op::FetchAdd => CqOpcode::FetchAdd,
        }
    }
}

/// One side ring: slot → (user `wr_id`, op). Written by the poster before the post (release),
/// read by the poller after the completion (acquire), so the two never race.
pub(crate) struct SideRing {
    wr_ids: Box<[AtomicU64]>,
    ops: Box<[AtomicU8]>,
    mask: u32,
    /// Slots the queue may have outstanding (the configured depth).
    depth: u32,
    /// `epoch << 32 | slots retired`, advanced by the poller.
    pub(crate) retired: AtomicU64,
}

impl SideRing {
    pub(crate) fn new(depth: u32, epoch: u16) -> Self {
        let n = depth.next_power_of_two();
        SideRing {
            wr_ids: (0..n).map(|_| AtomicU64::new(0)).collect(),
            ops: (0..n).map(|_| AtomicU8::new(0)).collect(),
            mask: n - 1,
            depth,
            retired: AtomicU64::new(pack(epoch, 0)),
        }
    }

    pub(crate) fn set(&self, index: u32, wr_id: u64, op: Op) {
        let i = (index & self.mask) as usize;
        self.ops[i].store(op as u8, Ordering::Relaxed);
        self.wr_ids[i].store(wr_id, Ordering::Release);
    }

    pub(crate) fn get(&self, index: u32) -> (u64, Op) {
        let i = (index & self.mask) as usize;
        let wr_id = self.wr_ids[i].load(Ordering::Acquire);
        (wr_id, Op::from_u8(self.ops[i].load(Ordering::Relaxed)))
    }

    /// Free slots for a poster whose head is `head`.
    pub(crate) fn free(&self, head: u32) -> u32 {
        let (_, retired) = unpack(self.retired.load(Ordering::Acquire));
        self.depth.saturating_sub(head.wrapping_sub(retired))
    }
}

/// A completion resolved against the side ring.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Done {
    pub(crate) user_wr_id: u64,
    pub(crate) op: Op,
}

/// Poller side: resolves the completion of slot `index` of `ring` issued in `epoch`; `None` if
/// it belongs to an earlier incarnation of the queue (a reset moved the epoch on). Retires the
/// slot(s) and, for an error, moves the tracked `state` to ERROR (the device has).
pub(crate) fn retire(
    ring: &SideRing,
    state: &AtomicU32,
    epoch: u16,
    index: u32,
    success: bool,
) -> Option<Done> {
    let cur = ring.retired.load(Ordering::Acquire);
    let (cur_epoch, retired) = unpack(cur);
    if cur_epoch != epoch {
        return None;
    }
    let (user_wr_id, op) = ring.get(index);
    let next = index.wrapping_add(1);
    // Completions of one side arrive in order; never move the count backwards. Either way the
    // epoch is checked again after reading the side ring: a reset in between makes the entry
    // read a stale one.
    let moved = if (next.wrapping_sub(retired) as i32) > 0 {
        ring.retired.compare_exchange(cur, pack(epoch, next), Ordering::AcqRel, Ordering::Acquire).is_err()
    } else {
        unpack(ring.retired.load(Ordering::Acquire)).0 != epoch
    };
    if moved {
        return None;
    }
    if !success {
        let _ = state.compare_exchange(
            pack_state(epoch, QueueState::Ready),
            pack_state(epoch, QueueState::Error),
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }
    Some(Done { user_wr_id, op })
}

/// The device moved the queue to ERROR (an async event said so): READY → ERROR in `state`,
/// keeping its epoch.
pub(crate) fn device_error(state: &AtomicU32) {
    let cur = state.load(Ordering::Acquire);
    if state_of(cur) == QueueState::Ready {
        let epoch = (cur >> 8) as u16;
        let _ = state.compare_exchange(
            cur,
            pack_state(epoch, QueueState::Error),
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }
}
