//! loom model of the split virtqueue's index publication (`bypass_hal::vfio::virtqueue`): the
//! production `SplitQueue` (driver) and `SoftDevice` (device) on two threads, over a
//! `QueueMemory` whose descriptors, ring slots, used elements and buffer bytes are loom
//! `UnsafeCell`s and whose indices and suppression fields are loom atomics accessed `Relaxed`, so
//! every ordering comes from the queue's own fences, as with a real device.
//!
//! [`three_chains_through_a_two_slot_queue`]: the driver sends three chains (two buffers, then
//! one, then one) through a 2-descriptor queue, waiting for used elements when the ring is full;
//! the device takes each chain, checks its bytes, and returns it. Each chain reaches the device
//! once, in order, whole; each used element reaches the driver once; the queue ends empty.
//!
//! Broken twins (`bypass_hal::mutation`): the available index stored without the release fence
//! (`VirtqNoFence`), the index published before the descriptors are written
//! (`VirtqAvailBeforeDesc`), the used element read without the acquire fence
//! (`VirtqUsedNoAcquire`). loom reports each as a causality violation on a descriptor, ring slot
//! or used element cell.
#![cfg(loom)]

use bypass_hal::mutation::Mutant;
use bypass_hal::vfio::soft_device::SoftDevice;
use bypass_hal::vfio::virtqueue::{Buffer, Descriptor, QueueMemory, SplitQueue, UsedElem};
use bypass_loom_tests::{check, check_hal_mutant, Bound};
use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicU16, Ordering::Relaxed};
use loom::sync::Arc;
use loom::thread;

const SIZE: u16 = 2;
/// Device address of buffer 0; buffer `i` is at `BUF_BASE + i * BUF_STRIDE`.
const BUF_BASE: u64 = 0x1000;
const BUF_STRIDE: u64 = 0x100;
const BUF_LEN: usize = 2;
const BUFS: usize = 4;

/// A split virtqueue's memory as loom sees it.
struct LoomQueue {
    desc: Vec<UnsafeCell<Descriptor>>,
    avail: Vec<UnsafeCell<u16>>,
    avail_flags: AtomicU16,
    avail_idx: AtomicU16,
    used_event: AtomicU16,
    used: Vec<UnsafeCell<UsedElem>>,
    used_idx: AtomicU16,
    used_flags: AtomicU16,
    avail_event: AtomicU16,
    bufs: Vec<UnsafeCell<[u8; BUF_LEN]>>,
}

// SAFETY: the cells are loom's, which check every access for a happens-before order and report
// a race as a causality violation; sharing them between the model's threads is the point.
unsafe impl Sync for LoomQueue {}

impl LoomQueue {
    fn new() -> LoomQueue {
        LoomQueue {
            desc: (0..SIZE).map(|_| UnsafeCell::new(Descriptor::default())).collect(),
            avail: (0..SIZE).map(|_| UnsafeCell::new(0)).collect(),
            avail_flags: AtomicU16::new(0),
            avail_idx: AtomicU16::new(0),
            used_event: AtomicU16::new(0),
            used: (0..SIZE).map(|_| UnsafeCell::new(UsedElem::default())).collect(),
            used_idx: AtomicU16::new(0),
            used_flags: AtomicU16::new(0),
            avail_event: AtomicU16::new(0),
            bufs: (0..BUFS).map(|_| UnsafeCell::new([0; BUF_LEN])).collect(),
        }
    }

    fn buf(&self, addr: u64, len: usize) -> &UnsafeCell<[u8; BUF_LEN]> {
        let i = ((addr - BUF_BASE) / BUF_STRIDE) as usize;
        assert_eq!(addr, BUF_BASE + i as u64 * BUF_STRIDE, "a buffer address off its slot");
        assert!(len <= BUF_LEN);
        &self.bufs[i]
    }
}

/// Shared by the driver and the device thread.
#[derive(Clone)]
struct Mem(Arc<LoomQueue>);

impl QueueMemory for Mem {
    fn write_desc(&self, index: u16, desc: Descriptor) {
        // SAFETY: loom checks this write against every other access of the cell.
        self.0.desc[usize::from(index)].with_mut(|p| unsafe { *p = desc })
    }
    fn read_desc(&self, index: u16) -> Descriptor {
        // SAFETY: loom checks this read against every write of the cell.
        self.0.desc[usize::from(index)].with(|p| unsafe { *p })
    }
    fn write_avail(&self, slot: u16, head: u16) {
        // SAFETY: as in `write_desc`.
        self.0.avail[usize::from(slot)].with_mut(|p| unsafe { *p = head })
    }
    fn read_avail(&self, slot: u16) -> u16 {
        // SAFETY: as in `read_desc`.
        self.0.avail[usize::from(slot)].with(|p| unsafe { *p })
    }
    fn store_avail_flags(&self, flags: u16) {
        self.0.avail_flags.store(flags, Relaxed)
    }
    fn load_avail_flags(&self) -> u16 {
        self.0.avail_flags.load(Relaxed)
    }
    fn store_avail_idx(&self, idx: u16) {
        self.0.avail_idx.store(idx, Relaxed)
    }
    fn load_avail_idx(&self) -> u16 {
        self.0.avail_idx.load(Relaxed)
    }
    fn store_used_event(&self, value: u16) {
        self.0.used_event.store(value, Relaxed)
    }
    fn load_used_event(&self) -> u16 {
        self.0.used_event.load(Relaxed)
    }
    fn write_used(&self, slot: u16, elem: UsedElem) {
        // SAFETY: as in `write_desc`.
        self.0.used[usize::from(slot)].with_mut(|p| unsafe { *p = elem })
    }
    fn read_used(&self, slot: u16) -> UsedElem {
        // SAFETY: as in `read_desc`.
        self.0.used[usize::from(slot)].with(|p| unsafe { *p })
    }
    fn store_used_idx(&self, idx: u16) {
        self.0.used_idx.store(idx, Relaxed)
    }
    fn load_used_idx(&self) -> u16 {
        self.0.used_idx.load(Relaxed)
    }
    fn store_used_flags(&self, flags: u16) {
        self.0.used_flags.store(flags, Relaxed)
    }
    fn load_used_flags(&self) -> u16 {
        self.0.used_flags.load(Relaxed)
    }
    fn store_avail_event(&self, value: u16) {
        self.0.avail_event.store(value, Relaxed)
    }
    fn load_avail_event(&self) -> u16 {
        self.0.avail_event.load(Relaxed)
    }
    fn write_buf(&self, addr: u64, src: &[u8]) {
        // SAFETY: as in `write_desc`.
        self.0.buf(addr, src.len()).with_mut(|p| unsafe { (&mut *p)[..src.len()].copy_from_slice(src) })
    }
    fn read_buf(&self, addr: u64, dst: &mut [u8]) {
        let n = dst.len();
        // SAFETY: as in `read_desc`.
        self.0.buf(addr, n).with(|p| dst.copy_from_slice(unsafe { &(&*p)[..n] }))
    }
}

fn addr(i: u64) -> u64 {
    BUF_BASE + i * BUF_STRIDE
}

/// The chains the driver sends: (buffer index, bytes) per buffer.
const CHAINS: [&[(u64, [u8; BUF_LEN])]; 3] = [&[(0, [1, 2]), (1, [3, 4])], &[(2, [5, 6])], &[(3, [7, 8])]];

fn three_chains_through_a_two_slot_queue() {
    let mem = Mem(Arc::new(LoomQueue::new()));
    let driver_mem = mem.clone();
    let driver = thread::spawn(move || {
        let mut q = SplitQueue::new(driver_mem.clone(), SIZE, false).unwrap();
        let mut used = 0;
        for chain in CHAINS {
            let bufs: Vec<Buffer> = chain
                .iter()
                .map(|&(i, bytes)| {
                    driver_mem.write_buf(addr(i), &bytes);
                    Buffer { addr: addr(i), len: BUF_LEN as u32, device_writes: false }
                })
                .collect();
            loop {
                if q.add(&bufs).unwrap().is_some() {
                    break;
                }
                // Ring full: wait for the device to return a chain.
                match q.pop_used().unwrap() {
                    Some(_) => used += 1,
                    None => thread::yield_now(),
                }
            }
            q.publish();
        }
        while used < CHAINS.len() {
            match q.pop_used().unwrap() {
                Some(_) => used += 1,
                None => thread::yield_now(),
            }
        }
        assert_eq!(q.num_free(), SIZE, "every descriptor back on the free list");
        assert_eq!(q.pop_used().unwrap(), None, "no used element twice");
    });
    let device = thread::spawn(move || {
        let mut dev = SoftDevice::new(mem, SIZE, false);
        for chain in CHAINS {
            let c = loop {
                match dev.pop().unwrap() {
                    Some(c) => break c,
                    None => thread::yield_now(),
                }
            };
            let want: Vec<u8> = chain.iter().flat_map(|(_, b)| *b).collect();
            assert_eq!(dev.read(&c), want, "a chain's bytes");
            dev.complete(c.head, 0);
            dev.publish();
        }
        assert_eq!(dev.pop().unwrap(), None, "no chain twice");
    });
    driver.join().unwrap();
    device.join().unwrap();
}

#[test]
fn chains_and_used_elements_cross_whole_through_a_full_queue() {
    check(Bound::Env, three_chains_through_a_two_slot_queue);
}

#[test]
#[should_panic(expected = "Causality violation")]
fn twin_available_index_without_release_fence() {
    check_hal_mutant(Mutant::VirtqNoFence, Bound::Env, three_chains_through_a_two_slot_queue);
}

#[test]
#[should_panic(expected = "Causality violation")]
fn twin_available_index_before_descriptors() {
    check_hal_mutant(Mutant::VirtqAvailBeforeDesc, Bound::Env, three_chains_through_a_two_slot_queue);
}

#[test]
#[should_panic(expected = "Causality violation")]
fn twin_used_element_without_acquire_fence() {
    check_hal_mutant(Mutant::VirtqUsedNoAcquire, Bound::Env, three_chains_through_a_two_slot_queue);
}
