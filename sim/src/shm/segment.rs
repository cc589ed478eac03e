//! A shared-memory segment: one file under `/dev/shm` per receiving NIC, holding a header, the
//! doorbell block and `RINGS` inbound rings (layout in `docs/sim.md`, "Shared-memory wire").
//!
//! The owner creates it under a temporary name, writes the header, then renames it into place, so
//! a peer that opens the name always finds a complete header. Everything read from a segment is
//! validated: a wrong magic, version or layout, or a file shorter than its layout says, is an error
//! naming the file, never an out-of-bounds access. A file truncated after it was mapped breaks
//! the mapping's connections instead of the process ([`guard`]).

mod guard;

use super::ring::{Bell, RingCtl, Slots};
use memmap2::MmapRaw;
use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::path::{Path, PathBuf};

/// First 8 bytes of every segment.
pub(crate) const MAGIC: [u8; 8] = *b"BYPSSHM\x01";
/// Layout version.
pub(crate) const VERSION: u32 = 1;
/// Inbound rings per segment: how many producer NICs can send to one NIC at once.
pub(crate) const RINGS: u32 = 32;
/// Bytes of the header, including the doorbell block (64..128).
pub(crate) const HEADER_LEN: usize = 128;
/// Offset of the doorbell block in the header.
const BELL_OFFSET: usize = 64;
/// Bytes of a ring's control block.
pub(crate) const CTL_LEN: usize = std::mem::size_of::<RingCtl>();
/// Where segments live.
pub(crate) const DIR: &str = "/dev/shm";
/// File name prefix of every segment.
pub(crate) const PREFIX: &str = "bypass-sim.";

/// Who a segment or a ring belongs to: a NIC of a fabric of a process (that started at `start`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Identity {
    pub pid: u32,
    pub start: u64,
    pub fabric: u32,
    pub nic: u32,
}

/// Where the segment of NIC `nic` of fabric `fabric` of process `pid` lives.
pub(crate) fn path_of(pid: u32, fabric: u32, nic: u32) -> PathBuf {
    Path::new(DIR).join(format!("{PREFIX}{pid}.{fabric}.{nic}"))
}

/// The start time of process `pid` (field 22 of `/proc/<pid>/stat`, clock ticks since boot), or
/// `None` if no such process runs.
pub(crate) fn process_start(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces or ')': skip past the last.
    let rest = &stat[stat.rfind(')')? + 1..];
    // Fields from 3 (state) on; starttime is field 22.
    rest.split_whitespace().nth(22 - 3)?.parse().ok()
}

/// This process's start time.
pub(crate) fn own_start() -> u64 {
    static START: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *START.get_or_init(|| process_start(std::process::id()).unwrap_or(0))
}

/// Whether the process that `pid` and `start` name still runs (same pid, same start time: a
/// reused pid is a different process).
pub(crate) fn alive(pid: u32, start: u64) -> bool {
    process_start(pid) == Some(start)
}

/// The sizes that shape a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Layout {
    pub rings: u32,
    pub depth: u32,
    pub slot_size: u32,
}

impl Layout {
    /// A layout for frames of up to `max_frame` bytes, `depth` per ring.
    pub(crate) fn new(depth: u32, max_frame: usize) -> Layout {
        let slot = (super::ring::LEN_BYTES + max_frame).div_ceil(64) * 64;
        Layout { rings: RINGS, depth: depth.clamp(2, 1 << 14).next_power_of_two(), slot_size: slot as u32 }
    }

    /// Bytes of one ring: its control block, then its slots.
    pub(crate) fn ring_stride(&self) -> usize {
        CTL_LEN + self.depth as usize * self.slot_size as usize
    }

    /// Bytes of the whole segment.
    pub(crate) fn total(&self) -> usize {
        HEADER_LEN + self.rings as usize * self.ring_stride()
    }

    /// Checks sizes read from a header; an error says which is wrong.
    fn check(&self, ring_stride: u32, total: u64) -> Result<(), String> {
        if self.rings == 0 || self.rings > 64 {
            return Err(format!("{} rings (1 to 64 expected)", self.rings));
        }
        if !self.depth.is_power_of_two() || self.depth > 1 << 14 {
            return Err(format!("ring depth {} (a power of two up to 16384 expected)", self.depth));
        }
        if self.slot_size < 64 || self.slot_size > 1 << 20 || self.slot_size % 64 != 0 {
            return Err(format!("slot size {}", self.slot_size));
        }
        if ring_stride as usize != self.ring_stride() || total != self.total() as u64 {
            return Err(format!("ring stride {ring_stride} / size {total} do not match the ring sizes"));
        }
        Ok(())
    }
}

/// Header offsets (see `docs/sim.md`).
mod off {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 8;
    pub const HEADER_LEN: usize = 12;
    pub const RINGS: usize = 16;
    pub const DEPTH: usize = 20;
    pub const SLOT_SIZE: usize = 24;
    pub const RING_STRIDE: usize = 28;
    pub const OWNER_PID: usize = 32;
    pub const OWNER_FABRIC: usize = 36;
    pub const OWNER_NIC: usize = 40;
    pub const OWNER_START: usize = 48;
    pub const TOTAL: usize = 56;
}

/// What a segment's header says, read from its first 64 bytes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HeaderInfo {
    pub owner: Identity,
    pub layout: Layout,
}

/// Parses and validates a header.
fn parse_header(h: &[u8; 64]) -> Result<HeaderInfo, String> {
    let u32_at = |o: usize| u32::from_le_bytes([h[o], h[o + 1], h[o + 2], h[o + 3]]);
    let u64_at = |o: usize| u64::from(u32_at(o)) | u64::from(u32_at(o + 4)) << 32;
    if h[off::MAGIC..off::MAGIC + 8] != MAGIC {
        return Err("no bypass shared-memory segment (bad magic)".into());
    }
    if u32_at(off::VERSION) != VERSION {
        return Err(format!("layout version {} (this build speaks {VERSION})", u32_at(off::VERSION)));
    }
    if u32_at(off::HEADER_LEN) as usize != HEADER_LEN {
        return Err(format!("header of {} bytes", u32_at(off::HEADER_LEN)));
    }
    let layout =
        Layout { rings: u32_at(off::RINGS), depth: u32_at(off::DEPTH), slot_size: u32_at(off::SLOT_SIZE) };
    layout.check(u32_at(off::RING_STRIDE), u64_at(off::TOTAL))?;
    let owner = Identity {
        pid: u32_at(off::OWNER_PID),
        start: u64_at(off::OWNER_START),
        fabric: u32_at(off::OWNER_FABRIC),
        nic: u32_at(off::OWNER_NIC),
    };
    Ok(HeaderInfo { owner, layout })
}

fn header_bytes(owner: &Identity, l: &Layout) -> [u8; 64] {
    let mut h = [0u8; 64];
    let mut put = |o: usize, b: &[u8]| h[o..o + b.len()].copy_from_slice(b);
    put(off::MAGIC, &MAGIC);
    put(off::VERSION, &VERSION.to_le_bytes());
    put(off::HEADER_LEN, &(HEADER_LEN as u32).to_le_bytes());
    put(off::RINGS, &l.rings.to_le_bytes());
    put(off::DEPTH, &l.depth.to_le_bytes());
    put(off::SLOT_SIZE, &l.slot_size.to_le_bytes());
    put(off::RING_STRIDE, &(l.ring_stride() as u32).to_le_bytes());
    put(off::OWNER_PID, &owner.pid.to_le_bytes());
    put(off::OWNER_FABRIC, &owner.fabric.to_le_bytes());
    put(off::OWNER_NIC, &owner.nic.to_le_bytes());
    put(off::OWNER_START, &owner.start.to_le_bytes());
    put(off::TOTAL, &(l.total() as u64).to_le_bytes());
    h
}

/// Reads and validates the header of the segment file at `path`.
pub(crate) fn read_header(path: &Path) -> io::Result<HeaderInfo> {
    let mut f = File::open(path)?;
    let mut h = [0u8; 64];
    f.read_exact(&mut h)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("short header: {e}")))?;
    parse_header(&h).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// A mapped segment (ours or a peer's).
#[derive(Debug)]
pub(crate) struct Segment {
    /// Declared before `map`: the range is unregistered before it is unmapped.
    guard: Option<guard::Registration>,
    map: MmapRaw,
    pub path: PathBuf,
    pub owner: Identity,
    pub layout: Layout,
    /// Ours: unlinked when dropped.
    owned: bool,
}

// SAFETY: the mapping is only accessed through atomics (control blocks, doorbell) and through the
// ring protocol, which gives each slot one writer at a time; the pointer stays valid while the
// `MmapRaw` lives, whichever thread holds it.
unsafe impl Send for Segment {}
// SAFETY: as for Send: shared access goes through atomics and the ring protocol.
unsafe impl Sync for Segment {}

impl Segment {
    /// Creates the segment of NIC `owner`, replacing a stale file of the same name (a dead
    /// process whose pid this one reuses).
    pub(crate) fn create(owner: Identity, layout: Layout) -> io::Result<Segment> {
        let path = path_of(owner.pid, owner.fabric, owner.nic);
        let tmp = PathBuf::from(format!("{}.tmp", path.display()));
        let _ = std::fs::remove_file(&tmp);
        let file = OpenOptions::new().read(true).write(true).create_new(true).open(&tmp).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot create the shared-memory segment {}: {e}", tmp.display()),
            )
        })?;
        let setup = || -> io::Result<MmapRaw> {
            file.set_len(layout.total() as u64)?;
            let map = MmapRaw::map_raw(&file)?;
            let h = header_bytes(&owner, &layout);
            // SAFETY: the mapping is `layout.total()` ≥ 128 bytes long and nobody else has it yet
            // (the file is still under its temporary name).
            unsafe { std::ptr::copy_nonoverlapping(h.as_ptr(), map.as_mut_ptr(), h.len()) };
            map.flush()?;
            std::fs::rename(&tmp, &path)?;
            Ok(map)
        };
        let map = setup().map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            io::Error::new(
                e.kind(),
                format!("cannot set up the shared-memory segment {}: {e}", path.display()),
            )
        })?;
        let guard = guard::register(map.as_mut_ptr(), map.len());
        Ok(Segment { guard, map, path, owner, layout, owned: true })
    }

    /// Maps the segment at `path` after validating its header and its size.
    pub(crate) fn open(path: &Path) -> io::Result<Segment> {
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        let mut h = [0u8; 64];
        (&file)
            .read_exact(&mut h)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("short header: {e}")))?;
        let info = parse_header(&h).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        let len = file.metadata()?.len();
        if len < info.layout.total() as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("the file is {len} bytes, its layout needs {}", info.layout.total()),
            ));
        }
        let map = MmapRaw::map_raw(&file)?;
        if map.len() < info.layout.total() {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "the mapping is shorter than the layout"));
        }
        let guard = guard::register(map.as_mut_ptr(), map.len());
        Ok(Segment {
            guard,
            map,
            path: path.to_path_buf(),
            owner: info.owner,
            layout: info.layout,
            owned: false,
        })
    }

    /// Whether the file was truncated under the mapping, which now reads as zeros and carries no
    /// frames ([`guard`]): its links must not be reused.
    pub(crate) fn broken(&self) -> bool {
        self.guard.as_ref().is_some_and(guard::Registration::broken)
    }

    /// The doorbell block.
    pub(crate) fn bell(&self) -> &Bell {
        // SAFETY: bytes 64..128 of the mapping (which is at least `HEADER_LEN` long, checked at
        // create/open) hold the doorbell block; the mapping is page-aligned so the offset is
        // 64-aligned; a `Bell` is atomics only, for which any bit pattern is valid, and all access
        // goes through them. The reference lives no longer than `self`, hence the mapping.
        unsafe { &*(self.map.as_ptr().add(BELL_OFFSET) as *const Bell) }
    }

    /// Ring `i` (`i < layout.rings`): its control block and its slots.
    pub(crate) fn ring(&self, i: u32) -> (&RingCtl, MappedSlots<'_>) {
        assert!(i < self.layout.rings, "ring {i} of {}", self.layout.rings);
        let base = HEADER_LEN + i as usize * self.layout.ring_stride();
        // SAFETY: `base + ring_stride ≤ layout.total() ≤ map.len()` (checked at create/open);
        // `base` is a multiple of 64 (HEADER_LEN, CTL_LEN and slot sizes are) in a page-aligned
        // mapping; a `RingCtl` is atomics and padding only, valid for any bytes.
        let ctl = unsafe { &*(self.map.as_ptr().add(base) as *const RingCtl) };
        // SAFETY: as above: the slots follow the control block inside the mapping.
        let slots = unsafe { self.map.as_mut_ptr().add(base + CTL_LEN) };
        (
            ctl,
            MappedSlots {
                base: slots,
                depth: self.layout.depth,
                slot_size: self.layout.slot_size as usize,
                _seg: self,
            },
        )
    }

    /// Removes the file now (the mapping stays valid until dropped).
    pub(crate) fn unlink(&self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        if self.owned {
            // Only if the file is still ours (a later process with our pid may have replaced it).
            if read_header(&self.path).is_ok_and(|h| h.owner == self.owner) {
                self.unlink();
            }
        }
    }
}

/// The slots of one ring of a mapped segment.
#[derive(Debug)]
pub(crate) struct MappedSlots<'a> {
    base: *mut u8,
    depth: u32,
    slot_size: usize,
    _seg: &'a Segment,
}

impl Slots for MappedSlots<'_> {
    fn depth(&self) -> u32 {
        self.depth
    }

    unsafe fn with_slot_mut<R>(&self, i: u32, f: impl FnOnce(&mut [u8]) -> R) -> R {
        let i = (i & (self.depth - 1)) as usize;
        // SAFETY: slot `i < depth` lies inside this ring's part of the mapping (see
        // `Segment::ring`); the caller (the ring's only producer) holds it exclusively by the ring
        // protocol.
        let s = unsafe { std::slice::from_raw_parts_mut(self.base.add(i * self.slot_size), self.slot_size) };
        f(s)
    }

    unsafe fn with_slot<R>(&self, i: u32, f: impl FnOnce(&[u8]) -> R) -> R {
        let i = (i & (self.depth - 1)) as usize;
        // SAFETY: as for `with_slot_mut`; the caller (the ring's only consumer) reads a published
        // slot the producer leaves alone until it is released.
        let s = unsafe { std::slice::from_raw_parts(self.base.add(i * self.slot_size), self.slot_size) };
        f(s)
    }
}

/// Removes segments under [`DIR`] whose owner process is gone (dead pid, or a pid now used by a
/// process with another start time). Returns how many were removed.
pub(crate) fn clean_stale() -> usize {
    let Ok(dir) = std::fs::read_dir(DIR) else { return 0 };
    let mut removed = 0;
    for e in dir.flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(rest) = name.strip_prefix(PREFIX) else { continue };
        let Some(pid) = rest.split('.').next().and_then(|p| p.parse::<u32>().ok()) else { continue };
        let path = e.path();
        let stale = if name.ends_with(".tmp") {
            process_start(pid).is_none()
        } else {
            match read_header(&path) {
                Ok(h) => h.owner.pid != pid || !alive(pid, h.owner.start),
                // Unreadable: stale only if no process with that pid runs.
                Err(_) => process_start(pid).is_none(),
            }
        };
        if stale && std::fs::remove_file(&path).is_ok() {
            removed += 1;
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    /// Issue 30, defect 9: truncating a segment that processes have mapped killed them with
    /// SIGBUS at their next access (here the whole test binary would die).
    #[test]
    fn a_truncated_segment_breaks_its_mappings_not_the_process() {
        let me = Identity { pid: std::process::id(), start: own_start(), fabric: 0x7E57_0009, nic: 9 };
        let layout = Layout::new(4, 1024);
        let owner = Segment::create(me, layout).expect("create a segment");
        let peer = Segment::open(&owner.path).expect("open it as a peer");
        peer.bell().doorbell.store(7, Ordering::Release);
        assert_eq!(owner.bell().doorbell.load(Ordering::Acquire), 7, "one file, two mappings");
        assert!(!owner.broken() && !peer.broken());

        OpenOptions::new().write(true).open(&owner.path).and_then(|f| f.set_len(0)).expect("truncate");

        // Every access after the truncation lands past the end of the file.
        let (ctl, _) = peer.ring(layout.rings - 1);
        assert_eq!(ctl.owner.load(Ordering::Acquire), 0, "a broken mapping reads as zeros");
        assert!(peer.broken(), "the peer's mapping is marked broken");
        assert_eq!(owner.bell().doorbell.load(Ordering::Acquire), 0);
        assert!(owner.broken(), "so is the owner's");
        owner.bell().pending.store(1, Ordering::Release); // writes land in private pages

        // A new connection re-opens the file and is told what is wrong with it.
        let err = Segment::open(&owner.path).expect_err("a truncated segment is refused");
        assert!(err.to_string().contains("short header"), "{err}");
        let _ = std::fs::remove_file(&owner.path);
    }
}
