//! The device: a `urma_context` on one EID of one URMA device, the backend spec that chooses it,
//! and the factory of the other objects.

use super::cq::{ChannelInner, UrmaChannel, UrmaCq};
use super::loader::{self, Lib};
use super::mr::{LocalSeg, UrmaRegion};
use super::queue::UrmaQueue;
use super::srq::UrmaSharedRecv;
use super::tables::{self, errno, status_error};
use crate::{Access, AsyncEvent, Device, DeviceCaps, Error, QueueConfig, Result};
use bypass_urma_abi as abi;
use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

/// How to open a URMA device, beyond its name (the options of `urma:<device>,opt=value`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct UrmaConfig {
    /// The liburma to load (`None`: `$BYPASS_URMA_LIB`, else `liburma.so.0`).
    pub lib: Option<String>,
    /// Index into the device's EID list (`None`: the first entry).
    pub eid_index: Option<u32>,
}

/// Parses `"udma0,lib=/path/liburma.so.0,eid=1"` (every part optional; an empty or absent name
/// is the first device liburma lists) into a device name and a [`UrmaConfig`].
pub fn parse_spec(spec: &str) -> Result<(Option<String>, UrmaConfig)> {
    let mut config = UrmaConfig::default();
    let mut parts = spec.split(',').map(str::trim).peekable();
    let name = match parts.peek() {
        Some(p) if !p.is_empty() && !p.contains('=') => parts.next().map(str::to_owned),
        _ => None,
    };
    for part in parts.filter(|p| !p.is_empty()) {
        let (k, v) = part.split_once('=').ok_or_else(|| {
            Error::InvalidArgument(format!("urma option {part:?} is not key=value (lib, eid)"))
        })?;
        match k {
            "lib" if !v.is_empty() => config.lib = Some(v.to_owned()),
            "lib" => return Err(Error::InvalidArgument("urma option lib= needs a path".into())),
            "eid" => {
                config.eid_index = Some(v.parse().map_err(|_| {
                    Error::InvalidArgument(format!(
                        "urma option eid={v}: an index into the device's EID list"
                    ))
                })?)
            }
            _ => {
                return Err(Error::InvalidArgument(format!("urma option {k}={v}: unknown option (lib, eid)")))
            }
        }
    }
    Ok((name, config))
}

/// What an opened device is. Every other object holds an `Arc` of it, so the context outlives them
/// all whatever the drop order.
pub(crate) struct Context {
    pub(crate) lib: &'static Lib,
    pub(crate) ctx: *mut abi::UrmaContext,
    pub(crate) name: String,
    pub(crate) eid: abi::UrmaEid,
    pub(crate) eid_index: u32,
    pub(crate) uasid: u32,
    pub(crate) caps: DeviceCaps,
    /// The token every jetty (its JFR) of this device is guarded with; peers learn it from
    /// [`crate::QueueInfo::token`].
    pub(crate) jetty_token: u32,
    /// Live registrations by lkey. A post holds the read lock while the library may read the
    /// target-segment pointers it looked up; a region leaves the map (write lock) before it is
    /// unregistered.
    pub(crate) regions: RwLock<RegionMap>,
    /// A one-page segment registered LOCAL_ONLY for the context's life: the SGE of an lkey that
    /// names no live region points at it, so the device reports a local access error when it
    /// checks the range (the hal's "a stale lkey fails as a completion") instead of the library
    /// dereferencing a freed segment.
    pub(crate) poison: LocalSeg,
    /// The memory under the poison segment (only kept alive; never read).
    _poison_mem: Box<[u8]>,
    next_lkey: AtomicU32,
    next_cq_id: AtomicU64,
}

// SAFETY: liburma contexts may be used from any thread (the library locks internally); the Rust
// fields are immutable after open or synchronised (RwLock, atomics).
unsafe impl Send for Context {}
// SAFETY: as above.
unsafe impl Sync for Context {}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("lib", &self.lib.name)
            .field("name", &self.name)
            .field("eid", &std::net::Ipv6Addr::from(self.eid.raw))
            .field("eid_index", &self.eid_index)
            .field("uasid", &self.uasid)
            .finish_non_exhaustive()
    }
}

/// Live registrations by lkey, hashed by [`LkeyHasher`].
pub(crate) type RegionMap = HashMap<u32, LocalSeg, std::hash::BuildHasherDefault<LkeyHasher>>;

/// lkeys are this backend's own sequence numbers (no peer chooses them), so one multiplication
/// spreads them; SipHash cost a measurable share of every post.
#[derive(Default)]
pub(crate) struct LkeyHasher(u64);

impl std::hash::Hasher for LkeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 << 8 | u64::from(*b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.0 = u64::from(n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

impl Context {
    pub(crate) fn next_cq_id(&self) -> u64 {
        self.next_cq_id.fetch_add(1, Ordering::Relaxed)
    }

    pub(crate) fn next_lkey(&self) -> u32 {
        // 0 is never handed out (it is the poison segment's).
        loop {
            let k = self.next_lkey.fetch_add(1, Ordering::Relaxed);
            if k != 0 {
                return k;
            }
        }
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: every object created on the context holds an Arc of it, so all of them are
        // gone; the poison segment and the context are the ones open() created.
        unsafe {
            (self.lib.unregister_seg)(self.poison.tseg);
            (self.lib.delete_context)(self.ctx);
        }
        // `_poison_mem` is freed after this, with the other fields: the segment over it is gone.
    }
}

/// A random 32-bit value (tokens): from the kernel, falling back to the clock.
pub(crate) fn random_u32() -> u32 {
    let mut b = [0u8; 4];
    // SAFETY: `b` is a valid 4-byte buffer.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), 4, 0) };
    if n == 4 {
        return u32::from_ne_bytes(b) | 1;
    }
    let t =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(7);
    ((t as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as u32 | 1
}

/// A URMA device opened through liburma: a [`crate::Device`].
///
/// Cloning is cheap and shares the context. Everything created from it keeps the context alive,
/// so handles may be dropped in any order.
#[derive(Debug, Clone)]
pub struct UrmaDevice {
    pub(crate) ctx: Arc<Context>,
}

/// The names of the URMA devices the liburma `config` chooses lists (an error if it cannot be
/// loaded).
pub fn device_names(config: &UrmaConfig) -> Result<Vec<String>> {
    let lib = loader::load(&loader::library_name(config.lib.as_deref()))?;
    Ok(list_devices(lib)?.into_iter().map(|(_, n)| n).collect())
}

fn list_devices(lib: &Lib) -> Result<Vec<(*mut abi::UrmaDevice, String)>> {
    let mut n: libc::c_int = 0;
    // SAFETY: `n` is a valid out-pointer; the array is freed below (the devices stay valid).
    let list = unsafe { (lib.get_device_list)(&mut n) };
    if list.is_null() {
        let e = errno();
        if e == 19 {
            return Ok(Vec::new());
        }
        return Err(status_error("urma_get_device_list", e, "list URMA devices"));
    }
    let out = (0..n.max(0) as usize)
        .map(|i| {
            // SAFETY: entries 0..n of the array are valid device pointers.
            let dev = unsafe { *list.add(i) };
            // SAFETY: a device's name is a NUL-terminated array inside it.
            let name = unsafe { CStr::from_ptr((*dev).name.as_ptr()) }.to_string_lossy().into_owned();
            (dev, name)
        })
        .collect();
    // SAFETY: frees the array only (urma-abi.md §2); the device pointers stay valid.
    unsafe { (lib.free_device_list)(list) };
    Ok(out)
}

impl UrmaDevice {
    /// Opens the device called `name` (`None`: the first device liburma lists) on the EID
    /// `config` chooses. Errors say which call failed and what to check.
    pub fn open(name: Option<&str>, config: &UrmaConfig) -> Result<Self> {
        let lib = loader::load(&loader::library_name(config.lib.as_deref()))?;
        let devices = list_devices(lib)?;
        let (dev, dev_name) = match name {
            None => devices.first().cloned().ok_or_else(|| {
                Error::Device(format!(
                    "{} lists no URMA device: on UB hardware check the ubcore/uburma modules and \
                     /sys/class/ubcore; for the simulated liburma, configure its devices (see docs/urma.md)",
                    lib.name
                ))
            })?,
            Some(want) => {
                let c = CString::new(want).map_err(|_| {
                    Error::InvalidArgument(format!("device name {want:?} contains a NUL byte"))
                })?;
                // SAFETY: `c` is NUL-terminated and outlives the call.
                let dev = unsafe { (lib.get_device_by_name)(c.as_ptr().cast_mut()) };
                if dev.is_null() {
                    let names: Vec<_> = devices.iter().map(|(_, n)| n.as_str()).collect();
                    return Err(Error::InvalidArgument(format!(
                        "no URMA device named {want:?} in {}; present: [{}]",
                        lib.name,
                        names.join(", ")
                    )));
                }
                (dev, want.to_owned())
            }
        };
        // Over-allocated and zeroed: an older library writes a shorter structure (urma-abi.md
        // §3.7), and the loader already refused those, so the extra bytes are only a margin.
        let mut attr = Box::new([abi::UrmaDeviceAttr::default(); 2]);
        // SAFETY: `dev` is a live device; `attr` has room for (twice) the structure.
        let rc = unsafe { (lib.query_device)(dev, attr.as_mut_ptr()) };
        if rc != 0 {
            return Err(status_error("urma_query_device", rc, &format!("query {dev_name}")));
        }
        let cap = attr[0].dev_cap;
        let mut cnt: u32 = 0;
        // SAFETY: `dev` is live; `cnt` is a valid out-pointer; the list is freed below.
        let eids = unsafe { (lib.get_eid_list)(dev, &mut cnt) };
        if eids.is_null() || cnt == 0 {
            return Err(Error::Device(format!(
                "{dev_name} has no EID (urma_get_eid_list: {}); an EID must be configured on the device \
                 (urma_admin / the UB fabric manager)",
                if eids.is_null() {
                    std::io::Error::from_raw_os_error(errno()).to_string()
                } else {
                    "empty".into()
                }
            )));
        }
        // SAFETY: `eids` holds `cnt` entries until freed.
        let list: Vec<abi::UrmaEidInfo> = (0..cnt as usize).map(|i| unsafe { *eids.add(i) }).collect();
        // SAFETY: the list came from urma_get_eid_list and is freed once.
        unsafe { (lib.free_eid_list)(eids) };
        let entry = match config.eid_index {
            None => list[0],
            Some(i) => *list.iter().find(|e| e.eid_index == i).ok_or_else(|| {
                let have: Vec<_> = list.iter().map(|e| e.eid_index.to_string()).collect();
                Error::InvalidArgument(format!(
                    "{dev_name} has no EID index {i}; its EID indices: {}",
                    have.join(", ")
                ))
            })?,
        };
        // SAFETY: `dev` is live; the index is one the device listed.
        let ctx = unsafe { (lib.create_context)(dev, entry.eid_index) };
        if ctx.is_null() {
            return Err(status_error(
                "urma_create_context",
                errno(),
                &format!("open {dev_name} on EID index {} (check access to /dev/uburma)", entry.eid_index),
            ));
        }
        // SAFETY: the context was just created; eid and uasid are public fields at stable offsets.
        let (eid, uasid) = unsafe { ((*ctx).eid, (*ctx).uasid) };
        let max_depth = cap.max_jfs_depth.min(cap.max_jfr_depth);
        let mut caps = DeviceCaps::new(
            max_depth,
            cap.max_jfc_depth,
            cap.max_jfs_sge,
            cap.max_jfr_sge,
            cap.max_jfs_inline_len,
            u32::try_from(cap.max_msg_size).unwrap_or(u32::MAX),
            // URMA reports no segment-size limit; registration itself refuses what it cannot pin.
            isize::MAX as u64,
        );
        // A shared receive queue is a JFR (every queue has one of its own as well).
        caps.max_shared_recv = cap.max_jfr;
        caps.max_shared_recv_depth = cap.max_jfr_depth;
        let mut poison_mem = vec![0u8; 4096].into_boxed_slice();
        let poison = match register_raw(
            lib,
            ctx,
            poison_mem.as_mut_ptr(),
            4096,
            abi::consts::URMA_ACCESS_LOCAL_ONLY,
            random_u32(),
        ) {
            Ok(tseg) => LocalSeg { tseg, addr: poison_mem.as_ptr() as u64, len: 4096 },
            Err(e) => {
                // SAFETY: nothing else was created on the context.
                unsafe { (lib.delete_context)(ctx) };
                return Err(e);
            }
        };
        let context = Context {
            lib,
            ctx,
            name: dev_name,
            eid,
            eid_index: entry.eid_index,
            uasid,
            caps,
            jetty_token: random_u32(),
            regions: RwLock::new(RegionMap::default()),
            poison,
            _poison_mem: poison_mem,
            next_lkey: AtomicU32::new(1),
            next_cq_id: AtomicU64::new(1),
        };
        Ok(UrmaDevice { ctx: Arc::new(context) })
    }

    /// Opens from a backend spec: `""` (the first device), `"udma0"`, or
    /// `"udma0,lib=/path/liburma.so.0,eid=0"` (the part after `urma:` in the stack's backend
    /// string).
    pub fn open_spec(spec: &str) -> Result<Self> {
        let (name, config) = parse_spec(spec)?;
        Self::open(name.as_deref(), &config)
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        &self.ctx.name
    }

    /// The EID in use (what [`crate::QueueInfo::gid`] carries) and its index.
    pub fn eid(&self) -> ([u8; 16], u32) {
        (self.ctx.eid.raw, self.ctx.eid_index)
    }

    /// The context's UASID.
    pub fn uasid(&self) -> u32 {
        self.ctx.uasid
    }

    /// The liburma this device was opened through (path or soname).
    pub fn library(&self) -> &str {
        &self.ctx.lib.name
    }
}

/// Registers `len` bytes at `ptr` with URMA access value `access` and token `token`.
pub(crate) fn register_raw(
    lib: &Lib,
    ctx: *mut abi::UrmaContext,
    ptr: *mut u8,
    len: usize,
    access: u32,
    token: u32,
) -> Result<*mut abi::UrmaTargetSeg> {
    use abi::consts::*;
    let mut cfg = abi::UrmaSegCfg {
        va: ptr as u64,
        len: len as u64,
        token_id: std::ptr::null_mut(),
        token_value: abi::UrmaToken { token },
        flag: (URMA_TOKEN_PLAIN_TEXT & REG_SEG_TOKEN_POLICY_MASK) | (access << REG_SEG_ACCESS_SHIFT),
        user_ctx: 0,
        iova: 0,
    };
    // SAFETY: the context is live; `cfg` is a valid configuration of memory the caller keeps
    // registered-lifetime valid.
    let tseg = unsafe { (lib.register_seg)(ctx, &mut cfg) };
    if tseg.is_null() {
        return Err(status_error("urma_register_seg", errno(), &format!("register {len} bytes")));
    }
    Ok(tseg)
}

fn invalid(msg: impl Into<String>) -> Error {
    Error::InvalidArgument(msg.into())
}

impl Device for UrmaDevice {
    type Region = UrmaRegion;
    type Cq = UrmaCq;
    type Queue = UrmaQueue;
    type Channel = UrmaChannel;
    type SharedRecv = UrmaSharedRecv;

    fn caps(&self) -> DeviceCaps {
        self.ctx.caps
    }

    fn register(&self, len: usize, access: Access) -> Result<UrmaRegion> {
        UrmaRegion::allocate(&self.ctx, len, access)
    }

    unsafe fn register_external(&self, ptr: *mut u8, len: usize, access: Access) -> Result<UrmaRegion> {
        // SAFETY: the caller upholds register_external's contract for `ptr..ptr + len`.
        unsafe { UrmaRegion::external(&self.ctx, ptr, len, access) }
    }

    fn create_cq(&self, depth: u32) -> Result<UrmaCq> {
        let channel = ChannelInner::new(&self.ctx)?;
        UrmaCq::new(&self.ctx, depth, channel, true)
    }

    fn create_channel(&self) -> Result<UrmaChannel> {
        Ok(UrmaChannel { inner: ChannelInner::new(&self.ctx)? })
    }

    fn create_cq_on(&self, depth: u32, channel: &UrmaChannel) -> Result<UrmaCq> {
        if !Arc::ptr_eq(&channel.inner.ctx, &self.ctx) {
            return Err(invalid("the event channel belongs to another device (context)"));
        }
        UrmaCq::new(&self.ctx, depth, channel.inner.clone(), false)
    }

    fn create_queue(&self, config: &QueueConfig, send_cq: &UrmaCq, recv_cq: &UrmaCq) -> Result<UrmaQueue> {
        UrmaQueue::new(&self.ctx, config, send_cq, recv_cq)
    }

    fn create_shared_recv(&self, depth: u32, max_sge: u32) -> Result<UrmaSharedRecv> {
        UrmaSharedRecv::new(&self.ctx, depth, max_sge)
    }

    fn create_queue_on_shared(
        &self,
        config: &QueueConfig,
        send_cq: &UrmaCq,
        recv_cq: &UrmaCq,
        shared: &UrmaSharedRecv,
    ) -> Result<UrmaQueue> {
        if !Arc::ptr_eq(shared.obj.ctx(), &self.ctx) {
            return Err(invalid("the shared receive queue belongs to another device (context)"));
        }
        UrmaQueue::new_on_shared(&self.ctx, config, send_cq, recv_cq, shared)
    }

    fn async_event_fd(&self) -> Option<BorrowedFd<'_>> {
        // SAFETY: the context is live while `self` is borrowed; async_fd is a public field.
        let fd = unsafe { (*self.ctx.ctx).async_fd };
        // SAFETY: the fd belongs to the context and stays open until delete_context.
        (fd >= 0).then(|| unsafe { BorrowedFd::borrow_raw(fd) })
    }

    fn poll_async_event(&self) -> Result<Option<AsyncEvent>> {
        let Some(fd) = self.async_event_fd() else { return Ok(None) };
        // urma_get_async_event blocks on the fd: only call it when the fd is readable.
        let mut p =
            libc::pollfd { fd: std::os::fd::AsRawFd::as_raw_fd(&fd), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd, zero timeout.
        let r = unsafe { libc::poll(&mut p, 1, 0) };
        if r <= 0 || p.revents & libc::POLLIN == 0 {
            return Ok(None);
        }
        // SAFETY: plain data; zero is a valid value for every field (null pointers, 0 type).
        let mut ev: abi::UrmaAsyncEvent = unsafe { std::mem::zeroed() };
        // SAFETY: the context is live; `ev` is a valid out-structure.
        let rc = unsafe { (self.ctx.lib.get_async_event)(self.ctx.ctx, &mut ev) };
        if rc != 0 {
            return match rc {
                abi::status::URMA_EAGAIN => Ok(None),
                rc => Err(status_error("urma_get_async_event", rc, "read the device's async events")),
            };
        }
        let t = ev.event_type;
        let (mut qpn, mut port) = (0, 0);
        use abi::consts::*;
        match t {
            URMA_EVENT_JETTY_ERR => {
                // SAFETY: for jetty events the element is the jetty, alive until the ack below
                // (its queue waits for acknowledged events before deleting it).
                let jetty = unsafe { ev.element.jetty };
                if !jetty.is_null() {
                    // SAFETY: as above.
                    qpn = unsafe { (*jetty).jetty_id.id };
                    // SAFETY: as above; user_ctx of the jetty config is the queue's shared part,
                    // which the queue keeps alive until after it deletes the jetty.
                    let shared = unsafe { (*jetty).jetty_cfg.user_ctx } as *const super::queue::QueueShared;
                    if !shared.is_null() {
                        // SAFETY: see above.
                        unsafe { (*shared).device_error() };
                    }
                }
            }
            URMA_EVENT_JFC_ERR => {
                // SAFETY: the element is the JFC, alive until the ack below.
                let jfc = unsafe { ev.element.jfc };
                if !jfc.is_null() {
                    // SAFETY: as above.
                    unsafe { super::cq::mark_overflow(jfc) };
                }
            }
            URMA_EVENT_PORT_ACTIVE | URMA_EVENT_PORT_DOWN => {
                // SAFETY: for port events the element is the port id.
                port = unsafe { ev.element.port_id }.min(255) as u8;
            }
            _ => {}
        }
        // SAFETY: acknowledges the event just read, exactly once.
        unsafe { (self.ctx.lib.ack_async_event)(&mut ev) };
        Ok(Some(tables::async_event(t, qpn, port)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse() {
        let (n, c) = parse_spec("udma0,lib=/opt/liburma.so.0,eid=2").unwrap();
        assert_eq!(n.as_deref(), Some("udma0"));
        assert_eq!((c.lib.as_deref(), c.eid_index), (Some("/opt/liburma.so.0"), Some(2)));
        assert_eq!(parse_spec("").unwrap(), (None, UrmaConfig::default()));
        let (n, c) = parse_spec("lib=x.so").unwrap();
        assert_eq!((n, c.lib.as_deref()), (None, Some("x.so")));
        let text = |s: &str| parse_spec(s).unwrap_err().to_string();
        assert!(text("udma0,eid=x").contains("EID list"), "{}", text("udma0,eid=x"));
        assert!(text("udma0,gid=1").contains("unknown option (lib, eid)"));
        assert!(text("udma0,lib=").contains("needs a path"));
        assert!(text("udma0,eid").contains("not key=value"));
    }

    #[test]
    fn open_without_liburma_names_what_is_missing() {
        let c = UrmaConfig { lib: Some("/nonexistent/dir/liburma.so.0".into()), ..Default::default() };
        let e = UrmaDevice::open(None, &c).unwrap_err().to_string();
        assert!(e.contains("liburma not found") && e.contains("BYPASS_URMA_LIB"), "{e}");
        let e = UrmaDevice::open_spec("udma0,lib=/nonexistent/dir/liburma.so.0").unwrap_err().to_string();
        assert!(e.contains("/nonexistent/dir/liburma.so.0"), "{e}");
    }
}
