//! A split virtqueue laid out in a [`DmaRegion`]: the [`QueueMemory`] the driver uses with a real
//! device (and, in tests, with the software device over the same mapping).
//!
//! Layout (virtio 1.x, 2.7): descriptor table (16 bytes a descriptor, 16-aligned), then the
//! available ring (`flags`, `idx`, `ring[size]`, `used_event`; 2-aligned), then the used ring
//! (`flags`, `idx`, `ring[size]` of 8-byte elements, `avail_event`; 4-aligned). Each field is read
//! and written with one volatile access of its width.

use super::dma::DmaRegion;
use super::virtqueue::{Descriptor, QueueMemory, UsedElem};
use std::sync::Arc;

/// Where one queue's three parts lie in its region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueLayout {
    /// Descriptors in the queue.
    pub size: u16,
    /// Offset of the descriptor table.
    pub desc: usize,
    /// Offset of the available ring.
    pub avail: usize,
    /// Offset of the used ring.
    pub used: usize,
    /// First byte after the queue.
    pub end: usize,
}

impl QueueLayout {
    /// The layout of a `size`-descriptor queue starting at `start` (rounded up to 4 KiB).
    pub fn new(size: u16, start: usize) -> QueueLayout {
        let n = usize::from(size);
        let desc = start.next_multiple_of(4096);
        let avail = desc + 16 * n;
        let used = (avail + 6 + 2 * n).next_multiple_of(4);
        let end = used + 6 + 8 * n;
        QueueLayout { size, desc, avail, used, end }
    }
}

/// A split virtqueue's memory inside a shared [`DmaRegion`]; buffers are any bytes of that region.
#[derive(Debug, Clone)]
pub struct DmaQueue {
    region: Arc<DmaRegion>,
    layout: QueueLayout,
}

impl DmaQueue {
    /// The queue laid out as `layout` in `region` (whose bytes there must be zero).
    pub fn new(region: Arc<DmaRegion>, layout: QueueLayout) -> DmaQueue {
        assert!(layout.end <= region.len(), "queue layout past the DMA region's end");
        DmaQueue { region, layout }
    }

    /// Device addresses of the descriptor table, available ring and used ring (for the device's
    /// `queue_desc`, `queue_driver`, `queue_device` registers).
    pub fn iovas(&self) -> (u64, u64, u64) {
        let base = self.region.iova();
        let l = self.layout;
        (base + l.desc as u64, base + l.avail as u64, base + l.used as u64)
    }

    fn buf_off(&self, addr: u64, len: usize) -> usize {
        self.region.offset_of(addr, len).unwrap_or_else(|| {
            panic!("buffer at device address {addr:#x}+{len} outside the queue's DMA region")
        })
    }
}

impl QueueMemory for DmaQueue {
    fn write_desc(&self, index: u16, d: Descriptor) {
        let off = self.layout.desc + 16 * usize::from(index);
        self.region.write_u64(off, d.addr);
        self.region.write_u32(off + 8, d.len);
        self.region.write_u16(off + 12, d.flags);
        self.region.write_u16(off + 14, d.next);
    }
    fn read_desc(&self, index: u16) -> Descriptor {
        let off = self.layout.desc + 16 * usize::from(index);
        Descriptor {
            addr: self.region.read_u64(off),
            len: self.region.read_u32(off + 8),
            flags: self.region.read_u16(off + 12),
            next: self.region.read_u16(off + 14),
        }
    }
    fn write_avail(&self, slot: u16, head: u16) {
        self.region.write_u16(self.layout.avail + 4 + 2 * usize::from(slot), head)
    }
    fn read_avail(&self, slot: u16) -> u16 {
        self.region.read_u16(self.layout.avail + 4 + 2 * usize::from(slot))
    }
    fn store_avail_flags(&self, flags: u16) {
        self.region.write_u16(self.layout.avail, flags)
    }
    fn load_avail_flags(&self) -> u16 {
        self.region.read_u16(self.layout.avail)
    }
    fn store_avail_idx(&self, idx: u16) {
        self.region.write_u16(self.layout.avail + 2, idx)
    }
    fn load_avail_idx(&self) -> u16 {
        self.region.read_u16(self.layout.avail + 2)
    }
    fn store_used_event(&self, value: u16) {
        self.region.write_u16(self.layout.avail + 4 + 2 * usize::from(self.layout.size), value)
    }
    fn load_used_event(&self) -> u16 {
        self.region.read_u16(self.layout.avail + 4 + 2 * usize::from(self.layout.size))
    }
    fn write_used(&self, slot: u16, e: UsedElem) {
        let off = self.layout.used + 4 + 8 * usize::from(slot);
        self.region.write_u32(off, e.id);
        self.region.write_u32(off + 4, e.len);
    }
    fn read_used(&self, slot: u16) -> UsedElem {
        let off = self.layout.used + 4 + 8 * usize::from(slot);
        UsedElem { id: self.region.read_u32(off), len: self.region.read_u32(off + 4) }
    }
    fn store_used_idx(&self, idx: u16) {
        self.region.write_u16(self.layout.used + 2, idx)
    }
    fn load_used_idx(&self) -> u16 {
        self.region.read_u16(self.layout.used + 2)
    }
    fn store_used_flags(&self, flags: u16) {
        self.region.write_u16(self.layout.used, flags)
    }
    fn load_used_flags(&self) -> u16 {
        self.region.read_u16(self.layout.used)
    }
    fn store_avail_event(&self, value: u16) {
        self.region.write_u16(self.layout.used + 4 + 8 * usize::from(self.layout.size), value)
    }
    fn load_avail_event(&self) -> u16 {
        self.region.read_u16(self.layout.used + 4 + 8 * usize::from(self.layout.size))
    }
    fn write_buf(&self, addr: u64, src: &[u8]) {
        let off = self.buf_off(addr, src.len());
        self.region.write_bytes(off, src)
    }
    fn read_buf(&self, addr: u64, dst: &mut [u8]) {
        let off = self.buf_off(addr, dst.len());
        self.region.read_bytes(off, dst)
    }
}
