//! The shared-memory rings between driver and device: work rings (send and receive queues,
//! written by the driver, read by the device) and completion rings (the reverse).
//!
//! A work ring is `depth` WQEs of `stride` bytes, stored as 64-byte blocks. The driver writes
//! entries, then rings the ring's doorbell with the new producer index (release fence, then the
//! store); the device loads the index with acquire ordering and only then reads entries below it.
//! The driver reuses a slot only after the device reported it done through a completion.
//!
//! A completion ring is `depth` 64-byte CQEs. The device writes a CQE's body, then its head word
//! (with the owner bit for this pass) with release ordering; the driver loads the head with
//! acquire ordering and reads the body only if the owner bit says the entry is from the current
//! pass. After a batch the driver publishes its consumer index (the "CI record"), which is how the
//! device knows a slot is free to overwrite.

use crate::layout::{self, Cqe, BLOCK};
#[cfg(loom)]
use crate::sync::mutation::{self, Mutant};
use crate::sync::{AtomicU32, Ordering, UnsafeCell};
use bypass_hal::doorbell::{self, MemoryDoorbell};

/// A send or receive work ring with its doorbell register.
#[derive(Debug)]
pub(crate) struct WorkRing {
    blocks: Box<[UnsafeCell<[u8; BLOCK]>]>,
    log2_depth: u32,
    blocks_per_wqe: usize,
    doorbell: MemoryDoorbell,
}

impl WorkRing {
    /// A ring of `depth` (a power of two) entries of `stride` bytes (a multiple of 64).
    pub(crate) fn new(depth: u32, stride: usize) -> Self {
        debug_assert!(depth.is_power_of_two() && stride % BLOCK == 0 && stride <= layout::MAX_WQE);
        let blocks_per_wqe = stride / BLOCK;
        let blocks = (0..depth as usize * blocks_per_wqe).map(|_| UnsafeCell::new([0u8; BLOCK])).collect();
        WorkRing {
            blocks,
            log2_depth: depth.trailing_zeros(),
            blocks_per_wqe,
            doorbell: MemoryDoorbell::new(),
        }
    }

    /// Number of entries.
    pub(crate) fn depth(&self) -> u32 {
        1 << self.log2_depth
    }

    /// Bytes per entry.
    pub(crate) fn stride(&self) -> usize {
        self.blocks_per_wqe * BLOCK
    }

    /// The owner bit entries at `index` carry: 1 on the first pass, flipping every wrap, so a
    /// never-written (zeroed) slot can never pass for a valid entry.
    pub(crate) fn owner(&self, index: u32) -> u8 {
        layout::owner_bit(index, self.log2_depth) ^ 1
    }

    fn first_block(&self, index: u32) -> usize {
        (index & (self.depth() - 1)) as usize * self.blocks_per_wqe
    }

    /// Driver side: copies the entry in `wqe` (the used part of one stride, a whole number of
    /// blocks) into slot `index`. Blocks past it keep stale bytes the device never reads.
    ///
    /// # Safety
    /// The caller is the ring's only producer, and the device is done with the entry that last
    /// used this slot (`index - depth` was reported complete, or the slot was never used).
    pub(crate) unsafe fn write(&self, index: u32, wqe: &[u8]) {
        debug_assert!(wqe.len() <= self.stride() && wqe.len() % BLOCK == 0);
        let first = self.first_block(index);
        for (i, chunk) in wqe.chunks_exact(BLOCK).enumerate() {
            // SAFETY: by the contract, no one else accesses this slot's blocks now.
            self.blocks[first + i].with_mut(|b| unsafe { (*b).copy_from_slice(chunk) });
        }
    }

    /// Driver side: publishes entries below `producer_index` (release fence, then the store).
    pub(crate) fn ring_doorbell(&self, producer_index: u32) {
        doorbell::ring(&self.doorbell, producer_index);
    }

    /// Device side: the producer index last rung (acquire: entries below it are visible).
    pub(crate) fn producer(&self) -> u32 {
        self.doorbell.load_acquire()
    }

    /// Device side: SGE `i` of entry `index` (the device re-reads gather lists from the ring).
    ///
    /// # Safety
    /// As for [`read_at`](Self::read_at).
    pub(crate) unsafe fn sge(&self, index: u32, i: usize) -> bypass_hal::Sge {
        let mut b = [0u8; layout::WQE_SGE];
        // SAFETY: forwarded contract.
        unsafe { self.read_at(index, layout::WQE_HEADER + i * layout::WQE_SGE, &mut b) };
        layout::decode_sge(&b)
    }

    /// Device side: reads bytes `off..off+out.len()` of entry `index` — the device's DMA read of a
    /// WQE (or of an inline payload).
    ///
    /// # Safety
    /// `index` is below a producer index read with [`producer`](Self::producer) and the device has
    /// not yet reported it complete, so the driver does not write the slot concurrently.
    pub(crate) unsafe fn read_at(&self, index: u32, off: usize, out: &mut [u8]) {
        let mut pos = 0;
        let first = self.first_block(index);
        while pos < out.len() {
            let (blk, within) = ((off + pos) / BLOCK, (off + pos) % BLOCK);
            let n = (BLOCK - within).min(out.len() - pos);
            // SAFETY: by the contract, the driver wrote this slot before the doorbell we acquired and will
            // not touch it until we complete it.
            self.blocks[first + blk]
                .with(|b| out[pos..pos + n].copy_from_slice(unsafe { &(&*b)[within..within + n] }));
            pos += n;
        }
    }
}

// SAFETY: the blocks are only accessed under the ring protocol documented above (one producer,
// one consumer, ownership handed over by the doorbell and by completions).
unsafe impl Sync for WorkRing {}
// SAFETY: the ring owns its memory; moving it between threads is fine.
unsafe impl Send for WorkRing {}

/// One 64-byte completion queue entry.
#[cfg_attr(not(loom), repr(C, align(64)))]
#[derive(Debug)]
struct CqeSlot {
    head: AtomicU32,
    body: UnsafeCell<[u8; 60]>,
}

#[cfg(not(loom))]
const _: () = assert!(std::mem::size_of::<CqeSlot>() == 64);

// SAFETY: the body is written only by the producer while the slot is free (per the CI record) and
// read only by the consumer after it acquires the head word, so accesses never overlap.
unsafe impl Sync for CqeSlot {}

/// A completion ring.
#[derive(Debug)]
pub(crate) struct CqRing {
    slots: Box<[CqeSlot]>,
    log2_depth: u32,
    /// The driver's consumer index, published after each poll batch.
    ci_record: AtomicU32,
}

impl CqRing {
    /// A ring of `depth` (a power of two) CQEs.
    pub(crate) fn new(depth: u32) -> Self {
        debug_assert!(depth.is_power_of_two());
        let slots =
            (0..depth).map(|_| CqeSlot { head: AtomicU32::new(0), body: UnsafeCell::new([0; 60]) }).collect();
        CqRing { slots, log2_depth: depth.trailing_zeros(), ci_record: AtomicU32::new(0) }
    }

    /// Number of entries.
    pub(crate) fn depth(&self) -> u32 {
        1 << self.log2_depth
    }

    fn slot(&self, index: u32) -> &CqeSlot {
        &self.slots[(index & (self.depth() - 1)) as usize]
    }

    fn owner_for(&self, index: u32) -> u32 {
        u32::from(layout::owner_bit(index, self.log2_depth)) ^ 1
    }

    /// Device side: writes `cqe` at producer index `pi` if the slot is free. Returns false (and
    /// writes nothing) when the ring is full: a CQ overflow.
    ///
    /// # Safety
    /// The caller is the ring's only producer (it holds the device lock).
    pub(crate) unsafe fn write(&self, pi: u32, cqe: &Cqe) -> bool {
        if pi.wrapping_sub(self.ci_record.load(Ordering::Acquire)) >= self.depth() {
            // loom only: the broken twin that overwrites unconsumed entries (`sync::mutation`).
            #[cfg(loom)]
            if !mutation::active(Mutant::CqFullCheckSkipped) {
                return false;
            }
            #[cfg(not(loom))]
            return false;
        }
        let slot = self.slot(pi);
        // loom only: the broken twin that publishes the head word first (`sync::mutation`).
        #[cfg(loom)]
        if mutation::active(Mutant::CqeHeadBeforeBody) {
            slot.head.store(layout::cqe_head(cqe) | self.owner_for(pi), Ordering::Release);
        }
        let mut body = [0u8; 60];
        layout::encode_cqe_body(cqe, &mut body);
        // SAFETY: the driver released this slot (ci_record > pi - depth, acquired above) and reads
        // a body only after seeing this pass's owner bit, which we store below, after the body.
        slot.body.with_mut(|b| unsafe { *b = body });
        // loom only: broken twins (`sync::mutation`): head already stored, or stored relaxed.
        #[cfg(loom)]
        if mutation::active(Mutant::CqeHeadBeforeBody) {
            return true;
        }
        #[cfg(loom)]
        if mutation::active(Mutant::CqeHeadRelaxed) {
            slot.head.store(layout::cqe_head(cqe) | self.owner_for(pi), Ordering::Relaxed);
            return true;
        }
        slot.head.store(layout::cqe_head(cqe) | self.owner_for(pi), Ordering::Release);
        true
    }

    /// Driver side: the CQE at consumer index `ci`, if the device has written it.
    ///
    /// # Safety
    /// The caller is the ring's only consumer.
    pub(crate) unsafe fn read(&self, ci: u32) -> Option<Cqe> {
        let slot = self.slot(ci);
        let head = slot.head.load(Ordering::Acquire);
        if head & layout::cqe_flags::OWNER != self.owner_for(ci) {
            return None;
        }
        // SAFETY: the owner bit (acquired) shows the device finished writing this body, and it
        // will not write the slot again until we publish a consumer index past `ci`.
        let body = slot.body.with(|b| unsafe { *b });
        Some(layout::decode_cqe(head, &body))
    }

    /// Driver side: tells the device every entry below `ci` is consumed.
    pub(crate) fn release(&self, ci: u32) {
        // loom only: the broken twin with a relaxed store (`sync::mutation`).
        #[cfg(loom)]
        if mutation::active(Mutant::CiRecordRelaxed) {
            self.ci_record.store(ci, Ordering::Relaxed);
            return;
        }
        self.ci_record.store(ci, Ordering::Release);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use bypass_hal::{CqOpcode, Status};

    #[test]
    fn cq_ring_owner_bit_flips_each_pass_and_detects_full() {
        let ring = CqRing::new(4);
        let mk = |i: u32| Cqe {
            qpn: 1,
            wqe_index: i,
            status: Status::Success,
            opcode: CqOpcode::Send,
            ..Default::default()
        };
        let mut ci = 0;
        for pi in 0..40u32 {
            // SAFETY: single-threaded test: we are both the only producer and the only consumer.
            unsafe {
                assert!(ring.write(pi, &mk(pi)));
                if pi % 4 == 3 {
                    assert!(!ring.write(pi + 1, &mk(pi + 1)), "a full ring refuses");
                    while let Some(c) = ring.read(ci) {
                        assert_eq!(c.wqe_index, ci);
                        ci += 1;
                    }
                    assert_eq!(ci, pi + 1, "every entry of the pass is read, no stale one");
                    ring.release(ci);
                }
            }
        }
    }

    #[test]
    fn work_ring_reads_what_was_written() {
        let ring = WorkRing::new(8, 128);
        let wqe: Vec<u8> = (0..128).map(|i| i as u8).collect();
        // SAFETY: single-threaded test; the slot is unused.
        unsafe { ring.write(13, &wqe) };
        ring.ring_doorbell(14);
        assert_eq!(ring.producer(), 14);
        let mut out = [0u8; 128];
        // SAFETY: index 13 is below the producer index and not completed.
        unsafe { ring.read_at(13, 0, &mut out) };
        assert_eq!(&out[..], &wqe[..]);
        let mut part = [0u8; 70];
        // SAFETY: as above.
        unsafe { ring.read_at(13, 40, &mut part) };
        assert_eq!(&part[..], &wqe[40..110]);
    }
}
