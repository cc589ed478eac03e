//! The driver's side of a virtio 1.x split virtqueue: descriptor table, available ring, used ring.
//!
//! The queue's memory is device-visible and reached only through [`QueueMemory`] (volatile
//! accesses into a DMA mapping in the driver; loom cells in the models of `loom-tests/`), so the
//! logic here is safe code and the same code runs against QEMU, against the software device of
//! [`soft_device`](super::soft_device) and under loom.
//!
//! The publication discipline (virtio 1.x, 2.7.13):
//!
//! 1. [`SplitQueue::add`] writes a chain's descriptors, then its head into the next available-ring
//!    slot; nothing is visible to the device yet (the available index is a shadow).
//! 2. [`SplitQueue::publish`] issues a release fence, then stores the available index once for the
//!    whole batch, then a full fence and reads the device's notification suppression (the
//!    `VIRTQ_USED_F_NO_NOTIFY` flag, or `avail_event` with `VIRTIO_F_EVENT_IDX`), and says whether
//!    the caller must notify: at most one notification per batch.
//! 3. [`SplitQueue::pop_used`] loads the used index, issues an acquire fence, then reads the used
//!    elements it covers and frees their chains. Used elements may come in any order.
//!
//! The free list and the chain lengths are kept in driver-private shadows, never read back from
//! device-writable memory, so a misbehaving device cannot corrupt them: a used element naming a
//! descriptor that is not the head of an outstanding chain is an error, not a double free.

use crate::sync::{fence, Ordering};
use crate::{Error, Result};

/// `VIRTQ_DESC_F_NEXT`: the chain continues at `next`.
pub const DESC_F_NEXT: u16 = 1;
/// `VIRTQ_DESC_F_WRITE`: the device writes this buffer (otherwise it reads it).
pub const DESC_F_WRITE: u16 = 2;
/// `VIRTQ_USED_F_NO_NOTIFY`: the device asks not to be notified (without event index).
pub const USED_F_NO_NOTIFY: u16 = 1;
/// `VIRTQ_AVAIL_F_NO_INTERRUPT`: the driver asks not to be interrupted (without event index).
pub const AVAIL_F_NO_INTERRUPT: u16 = 1;

/// One entry of the descriptor table (16 bytes on the wire, little-endian).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Descriptor {
    /// Device (IO virtual) address of the buffer.
    pub addr: u64,
    /// Length in bytes.
    pub len: u32,
    /// `DESC_F_NEXT`, `DESC_F_WRITE`.
    pub flags: u16,
    /// The next descriptor of the chain, if `DESC_F_NEXT`.
    pub next: u16,
}

/// One element of the used ring: which chain the device finished, and how many bytes it wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UsedElem {
    /// Head descriptor of the chain.
    pub id: u32,
    /// Bytes the device wrote into the chain's device-writable buffers.
    pub len: u32,
}

/// A buffer a chain hands to the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Buffer {
    /// Device address.
    pub addr: u64,
    /// Length in bytes.
    pub len: u32,
    /// True if the device writes it (receive), false if it reads it (transmit).
    pub device_writes: bool,
}

/// The device-visible memory of one split virtqueue and of the buffers its descriptors point to,
/// as both sides access it. Ring slots are already reduced modulo the queue size.
///
/// The `store_*`/`load_*` fields are the ones the other side polls while this side writes them
/// (indices, flags, event indices): each is one access of the field's width. The ordering between
/// them and the plain `write_*`/`read_*` accesses comes from the fences of [`SplitQueue`] and
/// [`SoftDevice`](super::soft_device::SoftDevice), not from the memory.
pub trait QueueMemory {
    /// Writes descriptor `index`.
    fn write_desc(&self, index: u16, desc: Descriptor);
    /// Reads descriptor `index`.
    fn read_desc(&self, index: u16) -> Descriptor;
    /// Writes available-ring slot `slot`.
    fn write_avail(&self, slot: u16, head: u16);
    /// Reads available-ring slot `slot`.
    fn read_avail(&self, slot: u16) -> u16;
    /// Stores the available ring's flags (`AVAIL_F_NO_INTERRUPT`).
    fn store_avail_flags(&self, flags: u16);
    /// Loads the available ring's flags.
    fn load_avail_flags(&self) -> u16;
    /// Stores the available index (the driver's publication).
    fn store_avail_idx(&self, idx: u16);
    /// Loads the available index.
    fn load_avail_idx(&self) -> u16;
    /// Stores `used_event` (the driver's interrupt suppression, event-index mode).
    fn store_used_event(&self, value: u16);
    /// Loads `used_event`.
    fn load_used_event(&self) -> u16;
    /// Writes used-ring slot `slot`.
    fn write_used(&self, slot: u16, elem: UsedElem);
    /// Reads used-ring slot `slot`.
    fn read_used(&self, slot: u16) -> UsedElem;
    /// Stores the used index (the device's publication).
    fn store_used_idx(&self, idx: u16);
    /// Loads the used index.
    fn load_used_idx(&self) -> u16;
    /// Stores the used ring's flags (`USED_F_NO_NOTIFY`).
    fn store_used_flags(&self, flags: u16);
    /// Loads the used ring's flags.
    fn load_used_flags(&self) -> u16;
    /// Stores `avail_event` (the device's notification suppression, event-index mode).
    fn store_avail_event(&self, value: u16);
    /// Loads `avail_event`.
    fn load_avail_event(&self) -> u16;
    /// Copies `src` into the buffer memory at device address `addr`.
    fn write_buf(&self, addr: u64, src: &[u8]);
    /// Copies buffer memory at device address `addr` into `dst`.
    fn read_buf(&self, addr: u64, dst: &mut [u8]);
}

impl<T: QueueMemory + ?Sized> QueueMemory for std::sync::Arc<T> {
    fn write_desc(&self, index: u16, desc: Descriptor) {
        (**self).write_desc(index, desc)
    }
    fn read_desc(&self, index: u16) -> Descriptor {
        (**self).read_desc(index)
    }
    fn write_avail(&self, slot: u16, head: u16) {
        (**self).write_avail(slot, head)
    }
    fn read_avail(&self, slot: u16) -> u16 {
        (**self).read_avail(slot)
    }
    fn store_avail_flags(&self, flags: u16) {
        (**self).store_avail_flags(flags)
    }
    fn load_avail_flags(&self) -> u16 {
        (**self).load_avail_flags()
    }
    fn store_avail_idx(&self, idx: u16) {
        (**self).store_avail_idx(idx)
    }
    fn load_avail_idx(&self) -> u16 {
        (**self).load_avail_idx()
    }
    fn store_used_event(&self, value: u16) {
        (**self).store_used_event(value)
    }
    fn load_used_event(&self) -> u16 {
        (**self).load_used_event()
    }
    fn write_used(&self, slot: u16, elem: UsedElem) {
        (**self).write_used(slot, elem)
    }
    fn read_used(&self, slot: u16) -> UsedElem {
        (**self).read_used(slot)
    }
    fn store_used_idx(&self, idx: u16) {
        (**self).store_used_idx(idx)
    }
    fn load_used_idx(&self) -> u16 {
        (**self).load_used_idx()
    }
    fn store_used_flags(&self, flags: u16) {
        (**self).store_used_flags(flags)
    }
    fn load_used_flags(&self) -> u16 {
        (**self).load_used_flags()
    }
    fn store_avail_event(&self, value: u16) {
        (**self).store_avail_event(value)
    }
    fn load_avail_event(&self) -> u16 {
        (**self).load_avail_event()
    }
    fn write_buf(&self, addr: u64, src: &[u8]) {
        (**self).write_buf(addr, src)
    }
    fn read_buf(&self, addr: u64, dst: &mut [u8]) {
        (**self).read_buf(addr, dst)
    }
}

/// `vring_need_event`: with event index, whether moving an index from `old` to `new` crosses the
/// other side's `event` (all three wrap at 2^16).
#[inline]
pub fn need_event(event: u16, new: u16, old: u16) -> bool {
    new.wrapping_sub(event).wrapping_sub(1) < new.wrapping_sub(old)
}

/// A chain the device has finished with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Used {
    /// The chain's head descriptor (what [`SplitQueue::add`] returned).
    pub head: u16,
    /// Bytes the device wrote.
    pub len: u32,
}

/// The driver's side of one split virtqueue.
#[derive(Debug)]
pub struct SplitQueue<M> {
    mem: M,
    size: u16,
    event_idx: bool,
    /// Shadow of each descriptor's `next`: the free list's links and the chains' links.
    next: Vec<u16>,
    /// Per head descriptor: the length of its outstanding chain; 0 when it heads none.
    chain_len: Vec<u16>,
    free_head: u16,
    num_free: u16,
    /// The next available index (written to the device only by `publish`).
    avail_idx: u16,
    /// The available index the device last saw.
    published: u16,
    /// The next used index to consume.
    last_used: u16,
}

impl<M: QueueMemory> SplitQueue<M> {
    /// A queue of `size` descriptors (a power of two up to 32768) over `mem`, whose rings must be
    /// zeroed. `event_idx`: `VIRTIO_F_EVENT_IDX` was negotiated.
    pub fn new(mem: M, size: u16, event_idx: bool) -> Result<SplitQueue<M>> {
        if size == 0 || !size.is_power_of_two() || size > 32768 {
            return Err(Error::InvalidArgument(format!(
                "virtqueue size {size}: a split virtqueue has a power-of-two size from 1 to 32768"
            )));
        }
        let next = (0..size).map(|i| i.wrapping_add(1)).collect();
        // Interrupts off until asked for: a polling driver wants none.
        if event_idx {
            mem.store_used_event(u16::MAX);
        } else {
            mem.store_avail_flags(AVAIL_F_NO_INTERRUPT);
        }
        Ok(SplitQueue {
            mem,
            size,
            event_idx,
            next,
            chain_len: vec![0; usize::from(size)],
            free_head: 0,
            num_free: size,
            avail_idx: 0,
            published: 0,
            last_used: 0,
        })
    }

    /// Asks the device for an interrupt at its next used element (`AVAIL_F_NO_INTERRUPT` cleared,
    /// or `used_event` set to the next used index), then looks again: returns true if used
    /// elements are already waiting (the interrupt for them may never come: poll instead).
    pub fn enable_interrupts(&mut self) -> bool {
        if self.event_idx {
            self.mem.store_used_event(self.last_used);
        } else {
            self.mem.store_avail_flags(0);
        }
        // The request must be visible before we look at the used index, or an element published
        // in between would go unannounced.
        fence(Ordering::SeqCst);
        self.has_used()
    }

    /// Asks the device not to interrupt (best effort, as virtio allows: an interrupt already on
    /// its way still comes). With event index, the request set by
    /// [`enable_interrupts`](Self::enable_interrupts) fires once, so there is nothing to undo.
    pub fn disable_interrupts(&mut self) {
        if !self.event_idx {
            self.mem.store_avail_flags(AVAIL_F_NO_INTERRUPT);
        }
    }

    /// The queue's size (descriptors).
    pub fn size(&self) -> u16 {
        self.size
    }

    /// Free descriptors.
    pub fn num_free(&self) -> u16 {
        self.num_free
    }

    /// The memory (the device side of tests reaches it through a clone).
    pub fn memory(&self) -> &M {
        &self.mem
    }

    /// Queues `chain` (device-readable buffers first, then device-writable ones) and returns its
    /// head descriptor, or `Ok(None)` when too few descriptors are free. Invisible to the device
    /// until [`publish`](Self::publish).
    pub fn add(&mut self, chain: &[Buffer]) -> Result<Option<u16>> {
        let n = u16::try_from(chain.len()).unwrap_or(u16::MAX);
        if n == 0 || n > self.size {
            return Err(Error::InvalidArgument(format!(
                "a chain of {} buffers on a {}-descriptor virtqueue: give 1 to {}",
                chain.len(),
                self.size,
                self.size
            )));
        }
        if n > self.num_free {
            return Ok(None);
        }
        let head = self.free_head;
        let slot = self.avail_idx & (self.size - 1);
        // loom only: the broken twin that publishes the chain before writing its descriptors.
        #[cfg(loom)]
        if crate::sync::mutation::active(crate::sync::mutation::Mutant::VirtqAvailBeforeDesc) {
            self.mem.write_avail(slot, head);
            fence(Ordering::Release);
            self.published = self.avail_idx.wrapping_add(1);
            self.mem.store_avail_idx(self.published);
        }
        let mut i = head;
        for (k, b) in chain.iter().enumerate() {
            let last = k + 1 == chain.len();
            let mut flags = if b.device_writes { DESC_F_WRITE } else { 0 };
            let next = self.next[usize::from(i)];
            if !last {
                flags |= DESC_F_NEXT;
            }
            self.mem.write_desc(
                i,
                Descriptor { addr: b.addr, len: b.len, flags, next: if last { 0 } else { next } },
            );
            if !last {
                i = next;
            }
        }
        self.free_head = self.next[usize::from(i)];
        self.num_free -= n;
        self.chain_len[usize::from(head)] = n;
        self.mem.write_avail(slot, head);
        self.avail_idx = self.avail_idx.wrapping_add(1);
        Ok(Some(head))
    }

    /// Makes every chain added since the last call visible to the device (release fence, then one
    /// store of the available index) and returns whether the device wants a notification for
    /// them. Returns false when nothing was added.
    pub fn publish(&mut self) -> bool {
        let old = self.published;
        let new = self.avail_idx;
        if old == new {
            return false;
        }
        // loom only: the broken twin without the release fence.
        #[cfg(loom)]
        let skip = crate::sync::mutation::active(crate::sync::mutation::Mutant::VirtqNoFence);
        #[cfg(not(loom))]
        let skip = false;
        if !skip {
            // Descriptors and ring slots written by `add` happen before the device's read of the
            // new index.
            fence(Ordering::Release);
        }
        self.mem.store_avail_idx(new);
        self.published = new;
        // The index store must be visible before we read the device's suppression state, or we
        // could skip a notification the device (going to sleep) still needs.
        fence(Ordering::SeqCst);
        if self.event_idx {
            need_event(self.mem.load_avail_event(), new, old)
        } else {
            self.mem.load_used_flags() & USED_F_NO_NOTIFY == 0
        }
    }

    /// True if the device has published used elements this side has not consumed.
    pub fn has_used(&self) -> bool {
        self.mem.load_used_idx() != self.last_used
    }

    /// Takes the next used element, frees its chain and returns it; `Ok(None)` if there is none.
    /// A used element that does not name the head of an outstanding chain is a device error.
    pub fn pop_used(&mut self) -> Result<Option<Used>> {
        let used_idx = self.mem.load_used_idx();
        if used_idx == self.last_used {
            return Ok(None);
        }
        let outstanding = self.size - self.num_free;
        if used_idx.wrapping_sub(self.last_used) > self.size {
            return Err(Error::Device(format!(
                "virtqueue: the device's used index {used_idx} is more than the queue size ({}) \
                 ahead of the driver's {}; reset the device",
                self.size, self.last_used
            )));
        }
        // loom only: the broken twin that reads the element without the acquire fence.
        #[cfg(loom)]
        let skip = crate::sync::mutation::active(crate::sync::mutation::Mutant::VirtqUsedNoAcquire);
        #[cfg(not(loom))]
        let skip = false;
        if !skip {
            // Everything the device wrote before publishing `used_idx` (the element, the buffer
            // bytes) happens before our reads below.
            fence(Ordering::Acquire);
        }
        let elem = self.mem.read_used(self.last_used & (self.size - 1));
        let head = match u16::try_from(elem.id) {
            Ok(h) if h < self.size && self.chain_len[usize::from(h)] != 0 => h,
            _ => {
                return Err(Error::Device(format!(
                    "virtqueue: the device returned descriptor {} which heads no outstanding chain \
                     ({outstanding} outstanding); reset the device",
                    elem.id
                )))
            }
        };
        self.last_used = self.last_used.wrapping_add(1);
        // Free the chain: walk the shadow links to its tail, splice the chain onto the free list.
        let n = self.chain_len[usize::from(head)];
        self.chain_len[usize::from(head)] = 0;
        let mut tail = head;
        for _ in 1..n {
            tail = self.next[usize::from(tail)];
        }
        self.next[usize::from(tail)] = self.free_head;
        self.free_head = head;
        self.num_free += n;
        Ok(Some(Used { head, len: elem.len }))
    }
}
