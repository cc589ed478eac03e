//! DMA memory: a few large anonymous mappings a device reads and writes behind the CPU's back.
//!
//! A [`DmaRegion`] is one anonymous mapping with the IOVA the driver chose for it. Once a device
//! may touch it, no Rust reference into it may exist (the device writes at any time, so `&`/`&mut`
//! would be undefined behaviour): every access here goes through the raw base pointer, as one
//! volatile access of the field's exact width for ring fields, or a raw copy for buffer bytes the
//! virtqueue protocol has handed to the CPU. Every access is bounds- and alignment-checked, so the
//! rest of the driver is safe code. This module and `mmio` are the only `unsafe` of the driver.

use memmap2::{MmapMut, MmapOptions};
use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;
use vfio_ioctls::VfioContainer;

/// One anonymous mapping shared with a device, at a driver-chosen IO virtual address.
pub struct DmaRegion {
    base: NonNull<u8>,
    len: usize,
    iova: u64,
    /// Keeps the mapping alive; never dereferenced after `new` (only `base` is used).
    _map: MmapMut,
}

// SAFETY: the region is plain memory reached only through raw pointers with volatile or copy
// accesses; the mapping is owned by the region and lives as long as it, whichever thread holds it.
unsafe impl Send for DmaRegion {}
// SAFETY: every method takes `&self` and does one raw access; concurrent users (the driver and a
// software device in tests) order their accesses with the virtqueue's fences, as a real device does.
unsafe impl Sync for DmaRegion {}

impl fmt::Debug for DmaRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DmaRegion").field("len", &self.len).field("iova", &self.iova).finish()
    }
}

impl DmaRegion {
    /// Maps `len` bytes of zeroed anonymous memory (rounded up to 4 KiB) for a device to see at
    /// `iova`. The caller maps it into the IOMMU (`VfioContainer::vfio_dma_map`) itself.
    pub fn new(len: usize, iova: u64) -> std::io::Result<DmaRegion> {
        let len = len.max(1).next_multiple_of(4096);
        let mut map = MmapOptions::new().len(len).map_anon()?;
        // The only use of the `MmapMut` itself: take its base pointer before any device sees it.
        let base = NonNull::new(map.as_mut_ptr()).expect("mmap never returns null");
        Ok(DmaRegion { base, len, iova, _map: map })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false (a region has at least one page); for clippy's `len_without_is_empty`.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The IO virtual address of byte 0 (what the device is given).
    pub fn iova(&self) -> u64 {
        self.iova
    }

    /// Maps the whole region into `container`'s IOMMU at its IOVA (`VFIO_IOMMU_MAP_DMA`); the
    /// mapping lasts until the returned guard is dropped.
    pub(crate) fn map_dma(
        self: &Arc<DmaRegion>,
        container: &Arc<VfioContainer>,
    ) -> Result<IommuMapping, vfio_ioctls::VfioError> {
        // SAFETY: vfio-ioctls' contract: until unmapped, the range may only be reached through
        // raw pointers with volatile/atomic accesses or copies, never a Rust reference — which is
        // how `DmaRegion` reaches it, and the only way it does. The guard keeps the region alive
        // until the IOMMU mapping is gone.
        unsafe { container.vfio_dma_map(self.iova, self.len, self.base.as_ptr())? };
        Ok(IommuMapping { region: self.clone(), container: container.clone() })
    }

    /// The offset of the `len` bytes at device address `iova`, if they lie inside the region.
    pub fn offset_of(&self, iova: u64, len: usize) -> Option<usize> {
        let off = usize::try_from(iova.checked_sub(self.iova)?).ok()?;
        (off.checked_add(len)? <= self.len).then_some(off)
    }

    fn at<T>(&self, off: usize) -> *mut T {
        let size = std::mem::size_of::<T>();
        assert!(
            off.checked_add(size).is_some_and(|end| end <= self.len),
            "DMA access at {off}+{size} outside a {}-byte region",
            self.len
        );
        assert_eq!(off % std::mem::align_of::<T>(), 0, "misaligned DMA access at {off}");
        // SAFETY: `off + size <= len` (checked above), so the pointer stays inside the mapping.
        unsafe { self.base.as_ptr().add(off).cast() }
    }

    /// One volatile 16-bit load (little-endian field) at `off`.
    pub fn read_u16(&self, off: usize) -> u16 {
        // SAFETY: `at` checked bounds and alignment; the mapping lives as long as `self`; a volatile
        // read of plain memory the device may be writing returns some value and creates no reference.
        u16::from_le(unsafe { self.at::<u16>(off).read_volatile() })
    }

    /// One volatile 16-bit store at `off`.
    pub fn write_u16(&self, off: usize, v: u16) {
        // SAFETY: as in `read_u16`; a volatile store into our own mapping.
        unsafe { self.at::<u16>(off).write_volatile(v.to_le()) }
    }

    /// One volatile 32-bit load at `off`.
    pub fn read_u32(&self, off: usize) -> u32 {
        // SAFETY: as in `read_u16`.
        u32::from_le(unsafe { self.at::<u32>(off).read_volatile() })
    }

    /// One volatile 32-bit store at `off`.
    pub fn write_u32(&self, off: usize, v: u32) {
        // SAFETY: as in `write_u16`.
        unsafe { self.at::<u32>(off).write_volatile(v.to_le()) }
    }

    /// One volatile 64-bit load at `off`.
    pub fn read_u64(&self, off: usize) -> u64 {
        // SAFETY: as in `read_u16`.
        u64::from_le(unsafe { self.at::<u64>(off).read_volatile() })
    }

    /// One volatile 64-bit store at `off`.
    pub fn write_u64(&self, off: usize, v: u64) {
        // SAFETY: as in `write_u16`.
        unsafe { self.at::<u64>(off).write_volatile(v.to_le()) }
    }

    /// Copies `src` into the region at `off`. Only for bytes the CPU owns at the moment (a buffer
    /// not posted to the device, or not yet published).
    pub fn write_bytes(&self, off: usize, src: &[u8]) {
        if src.is_empty() {
            return;
        }
        let dst = self.at::<u8>(off);
        assert!(off + src.len() <= self.len, "DMA copy past the region's end");
        // SAFETY: `dst..dst+len` is inside the mapping (checked); `src` is a Rust slice, which
        // cannot overlap the DMA mapping (no reference into it exists); u8 needs no alignment.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) }
    }

    /// Copies region bytes at `off` into `dst`. Only for bytes the device has handed back (a used
    /// buffer, read after the acquire that follows the used index).
    pub fn read_bytes(&self, off: usize, dst: &mut [u8]) {
        if dst.is_empty() {
            return;
        }
        let src = self.at::<u8>(off);
        assert!(off + dst.len() <= self.len, "DMA copy past the region's end");
        // SAFETY: as in `write_bytes`, the other way round.
        unsafe { std::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), dst.len()) }
    }
}

/// A [`DmaRegion`] mapped into an IOMMU; unmapped (before the memory can be freed) when dropped.
pub(crate) struct IommuMapping {
    region: Arc<DmaRegion>,
    container: Arc<VfioContainer>,
}

impl fmt::Debug for IommuMapping {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IommuMapping").field("region", &self.region).finish()
    }
}

impl Drop for IommuMapping {
    fn drop(&mut self) {
        // Nothing to do on failure: the pages stay pinned by the kernel until the container
        // closes, and our memory stays mapped while `region` lives.
        let _ = self.container.vfio_dma_unmap(self.region.iova, self.region.len);
    }
}
