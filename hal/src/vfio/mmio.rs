//! A device BAR mapped from the VFIO device fd: registers read and written with one volatile access
//! of their exact width (QEMU takes each access as one register write; byte-wide stores into a
//! 64-bit queue address corrupted it in the trial recorded in `shared/reference/vfio.md`). Never
//! a memcpy into BAR space, never a Rust reference into it.

use memmap2::{MmapMut, MmapOptions};
use std::fmt;
use std::os::fd::RawFd;
use std::ptr::NonNull;

/// One mapped BAR (or the part of it the driver uses).
pub struct Bar {
    base: NonNull<u8>,
    len: usize,
    _map: MmapMut,
}

// SAFETY: device memory reached only through volatile accesses of raw pointers; the mapping is
// owned by the `Bar` and lives as long as it.
unsafe impl Send for Bar {}
// SAFETY: every access takes `&self` and is a single volatile load or store; there is no
// Rust-visible state to race on (ordering between registers is the caller's, with fences).
unsafe impl Sync for Bar {}

impl fmt::Debug for Bar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Bar").field("len", &self.len).finish()
    }
}

impl Bar {
    /// Maps `len` bytes of the device fd at `offset` (a VFIO region's offset).
    pub fn map(fd: RawFd, offset: u64, len: usize) -> std::io::Result<Bar> {
        // SAFETY: the fd is a VFIO device fd and the range one of its mmap-able regions; the
        // mapping is device memory we only reach through volatile raw-pointer accesses below, so
        // memmap2's concern (another party changing a file under a Rust slice) cannot arise.
        let mut map = unsafe { MmapOptions::new().offset(offset).len(len).map_mut(fd)? };
        let base = NonNull::new(map.as_mut_ptr()).expect("mmap never returns null");
        Ok(Bar { base, len, _map: map })
    }

    /// Length of the mapping.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false; for clippy.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn at<T>(&self, off: usize) -> *mut T {
        let size = std::mem::size_of::<T>();
        assert!(
            off.checked_add(size).is_some_and(|e| e <= self.len),
            "register access at {off:#x}+{size} outside a {:#x}-byte BAR mapping",
            self.len
        );
        assert_eq!(off % size, 0, "misaligned {size}-byte register access at {off:#x}");
        // SAFETY: `off + size <= len` (checked above).
        unsafe { self.base.as_ptr().add(off).cast() }
    }

    /// One 8-bit register read.
    pub fn read8(&self, off: usize) -> u8 {
        // SAFETY: `at` checked bounds and alignment; the mapping lives as long as `self`.
        unsafe { self.at::<u8>(off).read_volatile() }
    }
    /// One 16-bit register read (virtio registers are little-endian).
    pub fn read16(&self, off: usize) -> u16 {
        // SAFETY: as in `read8`.
        u16::from_le(unsafe { self.at::<u16>(off).read_volatile() })
    }
    /// One 32-bit register read.
    pub fn read32(&self, off: usize) -> u32 {
        // SAFETY: as in `read8`.
        u32::from_le(unsafe { self.at::<u32>(off).read_volatile() })
    }
    /// One 8-bit register write.
    pub fn write8(&self, off: usize, v: u8) {
        // SAFETY: as in `read8`.
        unsafe { self.at::<u8>(off).write_volatile(v) }
    }
    /// One 16-bit register write.
    pub fn write16(&self, off: usize, v: u16) {
        // SAFETY: as in `read8`.
        unsafe { self.at::<u16>(off).write_volatile(v.to_le()) }
    }
    /// One 32-bit register write.
    pub fn write32(&self, off: usize, v: u32) {
        // SAFETY: as in `read8`.
        unsafe { self.at::<u32>(off).write_volatile(v.to_le()) }
    }
}
