//! Registered memory: regions, their keys and access rights, and scatter/gather entries.
//!
//! # Safety model
//!
//! Registered memory is *owned by its region*: [`crate::Device::register`] allocates it and
//! dropping the region deregisters it (the keys stop working) *before* the memory is freed. A NIC
//! translates every address of every work request through its key table at the moment it moves
//! data, so a work request naming a stale key, a wrong key or an out-of-bounds range fails with a
//! protection or access error completion; it can never reach freed or foreign memory. That is why
//! building an [`Sge`] or a [`RemoteRegion`] from raw numbers is safe: the device checks them.
//!
//! The bytes of a region are shared with the device, exactly like DMA memory: the NIC may write a
//! range while a receive or an inbound WRITE is outstanding. [`MemoryRegion::read`] and
//! [`MemoryRegion::write`] copy; only read a range after the completion that filled it.

use crate::Result;

bitflags::bitflags! {
    /// Access rights of a memory region. Local read access is always granted.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct Access: u32 {
        /// The local NIC may write the region (receive buffers, READ targets).
        const LOCAL_WRITE = 1 << 0;
        /// A peer may RDMA READ from the region.
        const REMOTE_READ = 1 << 1;
        /// A peer may RDMA WRITE into the region (requires `LOCAL_WRITE`).
        const REMOTE_WRITE = 1 << 2;
    }
}

/// One scatter/gather entry: `len` bytes at `addr`, inside the region named by `lkey`.
///
/// Build it with [`MemoryRegion::sge`], which checks bounds; [`Sge::new`] takes raw values and is
/// still safe because the device validates the key and range when it uses them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sge {
    /// Device address of the first byte (as returned by [`MemoryRegion::addr`] plus an offset).
    pub addr: u64,
    /// Length in bytes.
    pub len: u32,
    /// Local key of the region holding the range.
    pub lkey: u32,
}

impl Sge {
    /// An entry from raw values (the device checks them when it moves data).
    pub const fn new(addr: u64, len: u32, lkey: u32) -> Self {
        Sge { addr, len, lkey }
    }
}

/// What a peer needs to access a region remotely: its address range and remote key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RemoteRegion {
    /// Device address of the first byte.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// Remote key.
    pub rkey: u32,
}

impl RemoteRegion {
    /// The remote address `offset` bytes into the region, for a WRITE or READ work request.
    pub fn at(&self, offset: u64) -> RemoteAddr {
        RemoteAddr { addr: self.addr.wrapping_add(offset), rkey: self.rkey }
    }
}

/// A remote address for one-sided operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RemoteAddr {
    /// Device address in the peer's region.
    pub addr: u64,
    /// The peer region's remote key.
    pub rkey: u32,
}

/// A registered memory region. Dropping it deregisters it, then frees its memory.
pub trait MemoryRegion: Send + Sync {
    /// Length in bytes.
    fn len(&self) -> usize;
    /// True for a zero-length region.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Device address of the first byte (what SGEs and remote addresses use).
    fn addr(&self) -> u64;
    /// Local key, for SGEs of local work requests.
    fn lkey(&self) -> u32;
    /// Remote key, for peers' READ and WRITE.
    fn rkey(&self) -> u32;
    /// The region's access rights.
    fn access(&self) -> Access;
    /// Pointer to the first byte, for zero-copy use. Reading or writing through it while the NIC
    /// may be moving data into the same range is a data race; see the module docs.
    fn as_ptr(&self) -> *mut u8;

    /// Copies `dst.len()` bytes at `offset` out of the region.
    fn read(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        check_range(self.len(), offset, dst.len())?;
        // SAFETY: the range was checked to lie inside the region, which stays allocated while
        // `self` is borrowed; `dst` is a distinct Rust buffer so the two do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(self.as_ptr().add(offset), dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    /// Copies `src` into the region at `offset`.
    fn write(&self, offset: usize, src: &[u8]) -> Result<()> {
        check_range(self.len(), offset, src.len())?;
        // SAFETY: as in `read`; the region owns its memory and the range is in bounds.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.as_ptr().add(offset), src.len()) };
        Ok(())
    }

    /// An SGE for `len` bytes at `offset`, bounds-checked.
    fn sge(&self, offset: usize, len: usize) -> Result<Sge> {
        check_range(self.len(), offset, len)?;
        let len = u32::try_from(len).map_err(|_| {
            crate::Error::InvalidArgument(format!("SGE length {len} does not fit in 32 bits"))
        })?;
        Ok(Sge { addr: self.addr() + offset as u64, len, lkey: self.lkey() })
    }

    /// What a peer needs to READ or WRITE this region.
    fn remote(&self) -> RemoteRegion {
        RemoteRegion { addr: self.addr(), len: self.len() as u64, rkey: self.rkey() }
    }
}

fn check_range(len: usize, offset: usize, n: usize) -> Result<()> {
    match offset.checked_add(n) {
        Some(end) if end <= len => Ok(()),
        _ => Err(crate::Error::InvalidArgument(format!(
            "range {offset}..{offset}+{n} is outside the region of {len} bytes"
        ))),
    }
}
