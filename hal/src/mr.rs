//! Registered memory: regions, their keys and access rights, and scatter/gather entries.
//!
//! # Safety model
//!
//! Registered memory is *owned by its region*: [`crate::Device::register`] allocates it and
//! dropping the region deregisters it (the keys stop working) *before* the memory is freed.
//! [`crate::Device::register_external`] registers memory the caller owns instead; it is `unsafe`
//! because the caller then promises what ownership guarantees otherwise (the memory outlives the
//! registration and is not moved). A NIC
//! translates every address of every work request through its key table at the moment it moves
//! data, so a work request naming a stale key, a wrong key or an out-of-bounds range fails with a
//! protection or access error completion; it can never reach freed or foreign memory. That is why
//! building an [`Sge`] or a [`RemoteRegion`] from raw numbers is safe: the device checks them.
//!
//! The bytes of a region are shared with the device, exactly like DMA memory: the NIC may write a
//! range while a receive or an inbound WRITE is outstanding. [`MemoryRegion::read`] and
//! [`MemoryRegion::write`] copy; only read a range after the completion that filled it. `write`
//! takes `&mut self`, so two threads cannot race on a region's bytes from safe code even though a
//! region is `Sync`; owners that hand disjoint parts of one region to several threads (the stack's
//! buffer pools) use the `unsafe` [`MemoryRegion::write_shared`] and uphold its contract.

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
        /// A peer may do atomics (compare-and-swap, fetch-and-add) on the region's 8-byte words
        /// (requires `LOCAL_WRITE`, as on verbs).
        const REMOTE_ATOMIC = 1 << 3;
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

/// The key a peer presents to reach a region: opaque bytes whose meaning the backend defines.
///
/// A verbs `rkey` is 32 bits; a URMA target segment is named by the owner's EID, its uasid, a
/// token id and a token value (the peer imports it before use). Both fit in this fixed-size key,
/// so remote region descriptors have one shape on every backend and can travel in an RPC
/// ([`RemoteRegion::encode`]). Backends that use a 32-bit key put it in the first four bytes,
/// little-endian ([`RemoteKey::from_rkey`]), and leave the rest zero.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RemoteKey([u8; RemoteKey::LEN]);

impl RemoteKey {
    /// Size of a key in bytes.
    pub const LEN: usize = 32;

    /// A key from its raw bytes (as a backend, or [`RemoteKey::as_bytes`], produced them).
    pub const fn from_bytes(bytes: [u8; Self::LEN]) -> Self {
        RemoteKey(bytes)
    }

    /// The key of a backend whose remote keys are 32 bits (verbs `rkey`, the simulator).
    pub const fn from_rkey(rkey: u32) -> Self {
        let mut b = [0u8; Self::LEN];
        let k = rkey.to_le_bytes();
        b[0] = k[0];
        b[1] = k[1];
        b[2] = k[2];
        b[3] = k[3];
        RemoteKey(b)
    }

    /// The first four bytes as a 32-bit key (what verbs and the simulator put on the wire).
    pub const fn rkey(&self) -> u32 {
        u32::from_le_bytes([self.0[0], self.0[1], self.0[2], self.0[3]])
    }

    /// True when only the first four bytes can be non-zero (a 32-bit key).
    pub fn is_rkey(&self) -> bool {
        self.0[4..].iter().all(|&b| b == 0)
    }

    /// The raw bytes.
    pub const fn as_bytes(&self) -> &[u8; Self::LEN] {
        &self.0
    }
}

impl std::fmt::Debug for RemoteKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_rkey() {
            write!(f, "RemoteKey(rkey {:#x})", self.rkey())
        } else {
            write!(f, "RemoteKey(")?;
            for b in self.0 {
                write!(f, "{b:02x}")?;
            }
            write!(f, ")")
        }
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
    pub key: RemoteKey,
}

impl RemoteRegion {
    /// Size of the encoded form: version 1, then addr (8), len (8) and the key (32), little-endian.
    pub const ENCODED_LEN: usize = 1 + 8 + 8 + RemoteKey::LEN;
    const VERSION: u8 = 1;

    /// The remote address `offset` bytes into the region, for a WRITE or READ work request.
    pub fn at(&self, offset: u64) -> RemoteAddr {
        RemoteAddr { addr: self.addr.wrapping_add(offset), key: self.key }
    }

    /// The descriptor as bytes, for an application to send to its peer (in an RPC, say).
    pub fn encode(&self) -> [u8; Self::ENCODED_LEN] {
        let mut b = [0u8; Self::ENCODED_LEN];
        b[0] = Self::VERSION;
        b[1..9].copy_from_slice(&self.addr.to_le_bytes());
        b[9..17].copy_from_slice(&self.len.to_le_bytes());
        b[17..].copy_from_slice(self.key.as_bytes());
        b
    }

    /// Decodes what [`encode`](Self::encode) wrote; says what is wrong with anything else.
    pub fn decode(b: &[u8]) -> Result<Self> {
        if b.len() != Self::ENCODED_LEN {
            return Err(crate::Error::InvalidArgument(format!(
                "a remote region descriptor is {} bytes, got {}",
                Self::ENCODED_LEN,
                b.len()
            )));
        }
        if b[0] != Self::VERSION {
            return Err(crate::Error::InvalidArgument(format!(
                "remote region descriptor version {} (this build reads version {})",
                b[0],
                Self::VERSION
            )));
        }
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        let mut key = [0u8; RemoteKey::LEN];
        key.copy_from_slice(&b[17..]);
        Ok(RemoteRegion { addr: u64_at(1), len: u64_at(9), key: RemoteKey::from_bytes(key) })
    }
}

/// A remote address for one-sided operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RemoteAddr {
    /// Device address in the peer's region.
    pub addr: u64,
    /// The peer region's remote key.
    pub key: RemoteKey,
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
    fn remote_key(&self) -> RemoteKey;
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

    /// Copies `src` into the region at `offset`. `&mut self` makes this the only writer (and
    /// reader) on the CPU side, so safe code cannot race on the bytes; the NIC's own accesses
    /// follow the DMA rule of the module docs.
    fn write(&mut self, offset: usize, src: &[u8]) -> Result<()> {
        // SAFETY: `&mut self` excludes every other CPU access through this region.
        unsafe { self.write_shared(offset, src) }
    }

    /// Copies `src` into the region at `offset` through a shared reference, for owners that
    /// split one region among several users (a buffer pool hands out disjoint slices of it).
    ///
    /// # Safety
    /// No other thread may read or write `offset..offset + src.len()` of this region while the
    /// copy runs (through this or any other handle, [`as_ptr`](Self::as_ptr) included), and no
    /// posted work request may be writing it (a receive or READ target, or a range a peer may
    /// WRITE). Bounds are still checked.
    unsafe fn write_shared(&self, offset: usize, src: &[u8]) -> Result<()> {
        check_range(self.len(), offset, src.len())?;
        // SAFETY: the range is in bounds of memory the region keeps alive; the caller guarantees
        // no concurrent access to it; `src` is a distinct Rust buffer.
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
        RemoteRegion { addr: self.addr(), len: self.len() as u64, key: self.remote_key() }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_region_round_trips_and_refuses_bad_bytes() {
        let mut key = [0u8; RemoteKey::LEN];
        key[..4].copy_from_slice(&0x1234_5678u32.to_le_bytes());
        key[20] = 0xee; // a URMA-style key: more than the first four bytes
        let r = RemoteRegion { addr: 0x7f00_0000_1000, len: 4096, key: RemoteKey::from_bytes(key) };
        let b = r.encode();
        assert_eq!(b.len(), RemoteRegion::ENCODED_LEN);
        assert_eq!((b[0], &b[1..9]), (1, &0x7f00_0000_1000u64.to_le_bytes()[..]));
        assert_eq!(RemoteRegion::decode(&b).unwrap(), r);
        assert!(RemoteRegion::decode(&b[..48]).unwrap_err().to_string().contains("49 bytes"));
        let mut v2 = b;
        v2[0] = 2;
        assert!(RemoteRegion::decode(&v2).unwrap_err().to_string().contains("version 2"));
        assert_eq!(r.at(16).addr, 0x7f00_0000_1010);
        assert!(!r.key.is_rkey());
        let k = RemoteKey::from_rkey(0xabcd);
        assert!(k.is_rkey());
        assert_eq!(k.rkey(), 0xabcd);
        assert_eq!(format!("{k:?}"), "RemoteKey(rkey 0xabcd)");
    }
}
