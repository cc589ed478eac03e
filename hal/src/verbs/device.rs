//! The device: an opened `ibv_context` with one protection domain, the port and GID chosen when it
//! was opened, and the factory of the other verbs objects.

use super::cq::{ChannelInner, VerbsChannel, VerbsCq};
use super::mr::VerbsRegion;
use super::qp::VerbsQueue;
use super::srq::VerbsSharedRecv;
use super::tables::{self, errno, verb_error};
use crate::{Access, AsyncEvent, Device, DeviceCaps, DeviceConfig, Error, QueueConfig, Result};
use rdma_sys::*;
use std::collections::HashMap;
use std::ffi::CStr;
use std::os::fd::{BorrowedFd, RawFd};
use std::os::raw::{c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

// Exported by libibverbs (rdma-core ≥ 32) but outside rdma-sys's `ibv_.*` allowlist: the `static
// inline ibv_query_gid_ex` of verbs.h calls it. Linked through rdma-sys's libibverbs.
extern "C" {
    fn _ibv_query_gid_ex(
        context: *mut ibv_context,
        port_num: u32,
        gid_index: u32,
        entry: *mut ibv_gid_entry,
        flags: u32,
        entry_size: usize,
    ) -> c_int;
}

/// `struct ibv_async_event` with the event type read as a plain integer (rdma-sys makes it a Rust
/// enum, which a value unknown to it would make undefined behaviour).
#[repr(C)]
struct RawAsyncEvent {
    element: RawAsyncElement,
    event_type: u32,
}

#[repr(C)]
union RawAsyncElement {
    ptr: *mut c_void,
    port_num: c_int,
}

/// `link_layer` of `ibv_port_attr` for Ethernet (RoCE); InfiniBand is 1 (0 = unspecified = IB).
const LINK_LAYER_ETHERNET: u8 = 2;

/// Inline sizes tried when a device is first opened (largest first): libibverbs does not report
/// the limit, so creating a QP is the only way to learn it.
const INLINE_PROBE: [u32; 7] = [1024, 512, 256, 128, 64, 32, 0];

/// What an opened device is: the context, the PD, and what was chosen at open time. Every other
/// verbs object holds an `Arc` of it, so the context outlives them all whatever the drop order.
pub(crate) struct Context {
    pub(crate) ctx: *mut ibv_context,
    pub(crate) pd: *mut ibv_pd,
    pub(crate) name: String,
    pub(crate) port: u8,
    pub(crate) gid_index: u8,
    pub(crate) gid: [u8; 16],
    pub(crate) lid: u16,
    /// RoCE (Ethernet link layer): address by GID; InfiniBand: by LID.
    pub(crate) roce: bool,
    /// The path MTU connects use (the configured one capped at the port's active MTU).
    pub(crate) path_mtu: ibv_mtu::Type,
    pub(crate) traffic_class: u8,
    /// Linux's Soft-RoCE (`rdma_rxe`, vendor id 0xFFFFFF): it reads a transport `retry_cnt` of 7
    /// as "retry forever" (`rxe_comp.c`), where IBTA means seven retries, so connects give it 6.
    pub(crate) soft_roce: bool,
    pub(crate) caps: DeviceCaps,
    /// Live registrations by lkey → (addr, len): INLINE payloads are copied by the CPU from the
    /// SGE addresses, so a post checks them here, holding the read lock across `ibv_post_send`;
    /// a region leaves the map (write lock) before it is deregistered and freed.
    pub(crate) regions: RwLock<HashMap<u32, (u64, u64)>>,
    next_cq_id: AtomicU64,
}

// SAFETY: libibverbs contexts and PDs may be used from any thread (the library locks internally);
// the Rust-side fields are immutable after open or synchronised (RwLock, atomics).
unsafe impl Send for Context {}
// SAFETY: as above.
unsafe impl Sync for Context {}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("name", &self.name)
            .field("port", &self.port)
            .field("gid_index", &self.gid_index)
            .field("gid", &std::net::Ipv6Addr::from(self.gid))
            .field("lid", &self.lid)
            .field("roce", &self.roce)
            .field("path_mtu", &tables::mtu_bytes(self.path_mtu))
            .finish_non_exhaustive()
    }
}

impl Context {
    pub(crate) fn next_cq_id(&self) -> u64 {
        self.next_cq_id.fetch_add(1, Ordering::Relaxed)
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: every object created on the PD and context holds an Arc of this context, so all
        // of them are destroyed by now; the pointers are the ones open() created.
        unsafe {
            ibv_dealloc_pd(self.pd);
            ibv_close_device(self.ctx);
        }
    }
}

/// Whether `qp` is in the ERR state now (cold: only on a fatal async event).
fn qp_in_error(qp: *mut ibv_qp) -> bool {
    // SAFETY: plain-old-data out-structs, zero is a valid initial value.
    let mut attr: ibv_qp_attr = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let mut init: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
    // SAFETY: the QP is alive until its async event is acknowledged (the caller has not yet);
    // the out-structs are valid.
    let rc = unsafe { ibv_query_qp(qp, &mut attr, ibv_qp_attr_mask::IBV_QP_STATE.0 as i32, &mut init) };
    rc == 0 && attr.qp_state == ibv_qp_state::IBV_QPS_ERR
}

/// The vendor id Soft-RoCE reports (`RXE_VENDOR_ID` in the kernel's `rxe_param.h`).
const SOFT_ROCE_VENDOR_ID: u32 = 0x00FF_FFFF;

/// Sets `O_NONBLOCK` on a descriptor libibverbs owns.
pub(crate) fn set_nonblocking(fd: RawFd, verb: &str) -> Result<()> {
    // SAFETY: fcntl on a descriptor the caller holds open; F_GETFL/F_SETFL touch only flags.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(verb_error("fcntl(O_NONBLOCK)", errno(), verb));
    }
    Ok(())
}

/// The device list of libibverbs, freed on drop.
struct DeviceList {
    list: *mut *mut ibv_device,
    len: usize,
}

impl DeviceList {
    fn get() -> Result<Self> {
        let mut n: c_int = 0;
        // SAFETY: `n` is a valid out-pointer; the list is freed in Drop.
        let list = unsafe { ibv_get_device_list(&mut n) };
        if list.is_null() {
            let e = errno();
            return Err(match e {
                libc::ENOSYS => Error::Device(
                    "ibv_get_device_list failed: the kernel has no uverbs support (load ib_uverbs and a \
                     driver; for Soft-RoCE: modprobe rdma_rxe; rdma link add rxe0 type rxe netdev <if>)"
                        .into(),
                ),
                e => verb_error("ibv_get_device_list", e, "list RDMA devices"),
            });
        }
        Ok(DeviceList { list, len: n.max(0) as usize })
    }

    fn devices(&self) -> impl Iterator<Item = (*mut ibv_device, String)> + '_ {
        (0..self.len).map(move |i| {
            // SAFETY: `i < len` entries of the list are valid device pointers while it lives.
            let dev = unsafe { *self.list.add(i) };
            // SAFETY: a listed device has a NUL-terminated name owned by libibverbs.
            let name = unsafe { CStr::from_ptr(ibv_get_device_name(dev)) }.to_string_lossy().into_owned();
            (dev, name)
        })
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: the list came from ibv_get_device_list; opened contexts stay valid after this.
        unsafe { ibv_free_device_list(self.list) };
    }
}

/// The names of the RDMA devices present (empty if none, or if libibverbs finds no kernel
/// support).
pub fn device_names() -> Vec<String> {
    DeviceList::get().map(|l| l.devices().map(|(_, n)| n).collect()).unwrap_or_default()
}

/// An RDMA device opened through libibverbs: a [`crate::Device`].
///
/// Cloning is cheap and shares the context. Everything created from it keeps the context (and the
/// objects it was created from: a queue its CQs, a CQ its channel) alive, so handles may be
/// dropped in any order.
#[derive(Debug, Clone)]
pub struct VerbsDevice {
    pub(crate) ctx: Arc<Context>,
}

impl VerbsDevice {
    /// Opens the device called `name` (`None`: the first device libibverbs lists) with the port,
    /// GID, MTU and traffic class of `config`. Errors say which verb failed and what to check.
    pub fn open(name: Option<&str>, config: &DeviceConfig) -> Result<Self> {
        let list = DeviceList::get()?;
        let present: Vec<_> = list.devices().collect();
        if present.is_empty() {
            return Err(Error::Device(
                "no RDMA device: is a driver loaded? for Soft-RoCE: modprobe rdma_rxe; rdma link add rxe0 \
                 type rxe netdev <if>"
                    .into(),
            ));
        }
        let (dev, dev_name) = match name {
            None => present[0].clone(),
            Some(want) => present.iter().find(|(_, n)| n == want).cloned().ok_or_else(|| {
                let names: Vec<_> = present.iter().map(|(_, n)| n.as_str()).collect();
                Error::InvalidArgument(format!(
                    "no RDMA device named {want:?}; present: {}",
                    names.join(", ")
                ))
            })?,
        };
        // SAFETY: `dev` is a listed device and the list is alive.
        let ctx = unsafe { ibv_open_device(dev) };
        if ctx.is_null() {
            return Err(verb_error("ibv_open_device", errno(), &format!("open {dev_name}")));
        }
        drop(list);
        // From here `guard` closes the context on every error path.
        let guard = OpenGuard { ctx, pd: std::ptr::null_mut() };
        Self::setup(guard, dev_name, config)
    }

    /// Opens from a backend spec: `""` (the first device), `"rxe0"`, or `"rxe0,gid=1,port=1,mtu=1024,tc=0"`
    /// (the part after `verbs:` in the stack's backend string).
    pub fn open_spec(spec: &str) -> Result<Self> {
        let (name, config) = parse_spec(spec)?;
        Self::open(name.as_deref(), &config)
    }

    fn setup(mut guard: OpenGuard, name: String, config: &DeviceConfig) -> Result<Self> {
        let ctx = guard.ctx;
        // SAFETY: plain-old-data out-structs, zero is a valid initial value.
        let mut dattr: ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: `ctx` is an open context; `dattr` is a valid out-pointer.
        let rc = unsafe { ibv_query_device(ctx, &mut dattr) };
        if rc != 0 {
            return Err(verb_error("ibv_query_device", rc, &format!("query {name}")));
        }
        let port = config.port;
        if port == 0 || i32::from(port) > i32::from(dattr.phys_port_cnt) {
            return Err(Error::InvalidArgument(format!(
                "{name} has port(s) 1..={}, not {port}",
                dattr.phys_port_cnt
            )));
        }
        // SAFETY: as above.
        let mut pattr: ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: `ctx` is open, `pattr` a valid out-pointer of the size the helper passes.
        let rc = unsafe { ___ibv_query_port(ctx, port, &mut pattr) };
        if rc != 0 {
            return Err(verb_error("ibv_query_port", rc, &format!("query port {port} of {name}")));
        }
        if pattr.state != ibv_port_state::IBV_PORT_ACTIVE {
            return Err(Error::Device(format!(
                "port {port} of {name} is not ACTIVE (state {}): check the link (`ibv_devinfo -d {name}`, \
                 `rdma link show`; for rxe the netdev must be up)",
                port_state_name(pattr.state)
            )));
        }
        let roce = pattr.link_layer == LINK_LAYER_ETHERNET;
        let (gid_index, gid) = choose_gid(ctx, &name, port, pattr.gid_tbl_len, roce, config.gid_index)?;
        let active = pattr.active_mtu;
        let path_mtu = match config.path_mtu {
            None => active,
            Some(b) => {
                let m = tables::mtu_from_bytes(b).ok_or_else(|| {
                    Error::InvalidArgument(format!("path MTU {b} is not one of 256, 512, 1024, 2048, 4096"))
                })?;
                m.min(active)
            }
        };
        // SAFETY: `ctx` is open.
        let pd = unsafe { ibv_alloc_pd(ctx) };
        if pd.is_null() {
            return Err(verb_error("ibv_alloc_pd", errno(), &format!("allocate a PD on {name}")));
        }
        guard.pd = pd;
        // SAFETY: `ctx` is open; its async_fd stays open until ibv_close_device.
        let async_fd = unsafe { (*ctx).async_fd };
        set_nonblocking(async_fd, "the async event fd")?;
        let max_inline = probe_inline(ctx, pd, &name)?;
        let positive = |v: c_int| v.max(0) as u32;
        let max_sge = match dattr.max_sge_rd {
            // Some devices take fewer SGEs in a READ than in a SEND; the hal has one send limit.
            rd if rd > 0 => positive(dattr.max_sge.min(rd)),
            _ => positive(dattr.max_sge),
        };
        let mut caps = DeviceCaps::new(
            positive(dattr.max_qp_wr),
            positive(dattr.max_cqe),
            max_sge,
            positive(dattr.max_sge),
            max_inline,
            pattr.max_msg_sz,
            dattr.max_mr_size,
        );
        // Requester depth (initiator) and responder depth, in verbs' names.
        caps.max_rd_atomic = dattr.max_qp_init_rd_atom.clamp(0, 255) as u8;
        caps.max_dest_rd_atomic = dattr.max_qp_rd_atom.clamp(0, 255) as u8;
        caps.max_shared_recv = positive(dattr.max_srq);
        caps.max_shared_recv_depth = positive(dattr.max_srq_wr);
        // HCA (atomic with respect to this NIC's operations) or GLOB (also to other NICs and
        // the CPU); rxe reports HCA.
        caps.atomics = dattr.atomic_cap != ibv_atomic_cap::IBV_ATOMIC_NONE;
        let context = Context {
            ctx,
            pd,
            name,
            port,
            gid_index,
            gid,
            lid: pattr.lid,
            roce,
            path_mtu,
            traffic_class: config.traffic_class,
            soft_roce: dattr.vendor_id == SOFT_ROCE_VENDOR_ID,
            caps,
            regions: RwLock::new(HashMap::new()),
            next_cq_id: AtomicU64::new(1),
        };
        std::mem::forget(guard);
        Ok(VerbsDevice { ctx: Arc::new(context) })
    }

    /// The device's name (`rxe0`, `mlx5_0`).
    pub fn name(&self) -> &str {
        &self.ctx.name
    }

    /// The port in use.
    pub fn port(&self) -> u8 {
        self.ctx.port
    }

    /// The GID table index in use and the GID (what [`crate::QueueInfo::gid`] carries).
    pub fn gid(&self) -> (u8, [u8; 16]) {
        (self.ctx.gid_index, self.ctx.gid)
    }

    /// The port's LID (InfiniBand; 0 on RoCE).
    pub fn lid(&self) -> u16 {
        self.ctx.lid
    }

    /// The path MTU connects use, in bytes.
    pub fn path_mtu(&self) -> u32 {
        tables::mtu_bytes(self.ctx.path_mtu)
    }
}

/// Closes what `open` made so far if setting up fails.
struct OpenGuard {
    ctx: *mut ibv_context,
    pd: *mut ibv_pd,
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        // SAFETY: the pointers were created by open/setup and nothing else refers to them yet.
        unsafe {
            if !self.pd.is_null() {
                ibv_dealloc_pd(self.pd);
            }
            ibv_close_device(self.ctx);
        }
    }
}

fn port_state_name(s: ibv_port_state::Type) -> &'static str {
    use ibv_port_state::*;
    match s {
        IBV_PORT_NOP => "NOP",
        IBV_PORT_DOWN => "DOWN",
        IBV_PORT_INIT => "INIT",
        IBV_PORT_ARMED => "ARMED",
        IBV_PORT_ACTIVE => "ACTIVE",
        IBV_PORT_ACTIVE_DEFER => "ACTIVE_DEFER",
        _ => "unknown",
    }
}

/// One GID table entry, or `None` for an empty slot.
fn query_gid(ctx: *mut ibv_context, port: u8, index: u32) -> Option<([u8; 16], u32)> {
    // SAFETY: plain-old-data out-struct.
    let mut entry: ibv_gid_entry = unsafe { std::mem::zeroed() };
    // SAFETY: `ctx` is open; `entry` is a valid out-pointer of the size passed.
    let rc = unsafe {
        _ibv_query_gid_ex(ctx, u32::from(port), index, &mut entry, 0, std::mem::size_of::<ibv_gid_entry>())
    };
    if rc != 0 {
        return None;
    }
    // SAFETY: every bit pattern of the union is a valid `[u8; 16]`.
    let raw = unsafe { entry.gid.raw };
    (raw != [0; 16]).then_some((raw, entry.gid_type))
}

fn is_ipv4_mapped(gid: &[u8; 16]) -> bool {
    gid[..10].iter().all(|&b| b == 0) && gid[10] == 0xff && gid[11] == 0xff
}

/// The GID to use: the configured index (checked), else the first RoCE v2 IPv4-mapped GID, else
/// the first non-zero one. On InfiniBand ports the GID is informational (connects use the LID).
fn choose_gid(
    ctx: *mut ibv_context,
    name: &str,
    port: u8,
    table_len: c_int,
    roce: bool,
    want: Option<u8>,
) -> Result<(u8, [u8; 16])> {
    let len = table_len.clamp(0, 256) as u32;
    if let Some(i) = want {
        if u32::from(i) >= len {
            return Err(Error::InvalidArgument(format!(
                "GID index {i} is out of range: port {port} of {name} has {len} GID entries (list them with \
                 `ibv_devinfo -v -d {name}`)"
            )));
        }
        return match query_gid(ctx, port, u32::from(i)) {
            Some((gid, _)) => Ok((i, gid)),
            None => Err(Error::InvalidArgument(format!(
                "GID index {i} of {name} port {port} is empty (for RoCE the netdev needs an IP address; list \
                 the table with `ibv_devinfo -v -d {name}`)"
            ))),
        };
    }
    let entries: Vec<(u32, [u8; 16], u32)> =
        (0..len).filter_map(|i| query_gid(ctx, port, i).map(|(g, t)| (i, g, t))).collect();
    let pick = if roce {
        entries
            .iter()
            .find(|(_, g, t)| *t == IBV_GID_TYPE_ROCE_V2 && is_ipv4_mapped(g))
            .or_else(|| entries.first())
    } else {
        entries.first()
    };
    match pick {
        Some(&(i, gid, _)) => Ok((i as u8, gid)),
        None if !roce => Ok((0, [0; 16])),
        None => Err(Error::Device(format!(
            "port {port} of {name} has no usable GID (for RoCE the netdev needs an IP address; for rxe: ip \
             link set <if> up and give it an address)"
        ))),
    }
}

/// The largest INLINE size a QP on this device accepts, found by creating QPs (once per device
/// name and process).
fn probe_inline(ctx: *mut ibv_context, pd: *mut ibv_pd, name: &str) -> Result<u32> {
    static CACHE: OnceLock<Mutex<HashMap<String, u32>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(&v) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(name) {
        return Ok(v);
    }
    // SAFETY: `ctx` is open; no channel, no context pointer.
    let cq = unsafe { ibv_create_cq(ctx, 2, std::ptr::null_mut(), std::ptr::null_mut(), 0) };
    if cq.is_null() {
        return Err(verb_error("ibv_create_cq", errno(), &format!("probe the INLINE limit of {name}")));
    }
    let mut found = 0;
    for size in INLINE_PROBE {
        // SAFETY: plain-old-data in-struct.
        let mut attr: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        attr.send_cq = cq;
        attr.recv_cq = cq;
        attr.qp_type = ibv_qp_type::IBV_QPT_RC;
        attr.cap = ibv_qp_cap {
            max_send_wr: 1,
            max_recv_wr: 1,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: size,
        };
        // SAFETY: `pd` and `cq` are live and of this context; `attr` is a valid in/out pointer.
        let qp = unsafe { ibv_create_qp(pd, &mut attr) };
        if !qp.is_null() {
            // SAFETY: created just above, never posted to.
            unsafe { ibv_destroy_qp(qp) };
            found = size;
            break;
        }
    }
    // SAFETY: the probe QPs are destroyed; nothing else uses this CQ.
    unsafe { ibv_destroy_cq(cq) };
    cache.lock().unwrap_or_else(|e| e.into_inner()).insert(name.to_owned(), found);
    Ok(found)
}

/// Parses `"rxe0,gid=1,port=1,mtu=1024,tc=0"` (every part optional; an empty name is the first
/// device) into a device name and a [`DeviceConfig`].
pub fn parse_spec(spec: &str) -> Result<(Option<String>, DeviceConfig)> {
    let mut config = DeviceConfig::default();
    let mut parts = spec.split(',').map(str::trim);
    let name = parts.next().filter(|n| !n.is_empty() && !n.contains('=')).map(str::to_owned);
    let rest: Vec<&str> = if name.is_some() {
        parts.collect()
    } else {
        spec.split(',').map(str::trim).filter(|p| !p.is_empty()).collect()
    };
    for part in rest {
        let (k, v) = part.split_once('=').ok_or_else(|| {
            Error::InvalidArgument(format!("verbs option {part:?} is not key=value (gid, port, mtu, tc)"))
        })?;
        let bad = |what: &str| Error::InvalidArgument(format!("verbs option {k}={v}: {what}"));
        match k {
            "gid" => config.gid_index = Some(v.parse().map_err(|_| bad("a GID index is 0..=255"))?),
            "port" => config.port = v.parse().map_err(|_| bad("a port number is 1..=255"))?,
            "mtu" => {
                let b: u32 = v.parse().map_err(|_| bad("an MTU in bytes"))?;
                tables::mtu_from_bytes(b).ok_or_else(|| bad("one of 256, 512, 1024, 2048, 4096"))?;
                config.path_mtu = Some(b);
            }
            "tc" => config.traffic_class = v.parse().map_err(|_| bad("a traffic class is 0..=255"))?,
            _ => return Err(bad("unknown option (gid, port, mtu, tc)")),
        }
    }
    Ok((name, config))
}

fn invalid(msg: impl Into<String>) -> Error {
    Error::InvalidArgument(msg.into())
}

impl Device for VerbsDevice {
    type Region = VerbsRegion;
    type Cq = VerbsCq;
    type Queue = VerbsQueue;
    type Channel = VerbsChannel;
    type SharedRecv = VerbsSharedRecv;

    fn caps(&self) -> DeviceCaps {
        self.ctx.caps
    }

    fn register(&self, len: usize, access: Access) -> Result<VerbsRegion> {
        VerbsRegion::allocate(&self.ctx, len, access)
    }

    unsafe fn register_external(&self, ptr: *mut u8, len: usize, access: Access) -> Result<VerbsRegion> {
        // SAFETY: the caller upholds register_external's contract for `ptr..ptr + len`.
        unsafe { VerbsRegion::external(&self.ctx, ptr, len, access) }
    }

    fn create_cq(&self, depth: u32) -> Result<VerbsCq> {
        let channel = ChannelInner::new(&self.ctx)?;
        VerbsCq::new(&self.ctx, depth, channel, true)
    }

    fn create_channel(&self) -> Result<VerbsChannel> {
        Ok(VerbsChannel { inner: ChannelInner::new(&self.ctx)? })
    }

    fn create_cq_on(&self, depth: u32, channel: &VerbsChannel) -> Result<VerbsCq> {
        if !Arc::ptr_eq(&channel.inner.ctx, &self.ctx) {
            return Err(invalid("the event channel belongs to another device (context)"));
        }
        VerbsCq::new(&self.ctx, depth, channel.inner.clone(), false)
    }

    fn create_queue(&self, config: &QueueConfig, send_cq: &VerbsCq, recv_cq: &VerbsCq) -> Result<VerbsQueue> {
        VerbsQueue::new(&self.ctx, config, send_cq, recv_cq, None)
    }

    fn create_shared_recv(&self, depth: u32, max_sge: u32) -> Result<VerbsSharedRecv> {
        VerbsSharedRecv::new(&self.ctx, depth, max_sge)
    }

    fn create_queue_on_shared(
        &self,
        config: &QueueConfig,
        send_cq: &VerbsCq,
        recv_cq: &VerbsCq,
        shared: &VerbsSharedRecv,
    ) -> Result<VerbsQueue> {
        VerbsQueue::new(&self.ctx, config, send_cq, recv_cq, Some(shared))
    }

    fn async_event_fd(&self) -> Option<BorrowedFd<'_>> {
        // SAFETY: the context (and so its async_fd) stays open while `self` is borrowed.
        Some(unsafe { BorrowedFd::borrow_raw((*self.ctx.ctx).async_fd) })
    }

    fn poll_async_event(&self) -> Result<Option<AsyncEvent>> {
        let mut ev = RawAsyncEvent { element: RawAsyncElement { ptr: std::ptr::null_mut() }, event_type: 0 };
        // SAFETY: the context is open; `ev` has the layout of `struct ibv_async_event` (a pointer-
        // sized union and a C enum), so libibverbs writes it in bounds; the async fd is
        // non-blocking, so this returns at once.
        let rc = unsafe { ibv_get_async_event(self.ctx.ctx, (&mut ev as *mut RawAsyncEvent).cast()) };
        if rc != 0 {
            return match errno() {
                libc::EAGAIN | libc::EINTR => Ok(None),
                e => Err(verb_error("ibv_get_async_event", e, "read the device's async events")),
            };
        }
        let t = ev.event_type;
        let mut qpn = 0;
        let mut port = 0;
        if tables::event::has_qp(t) {
            // SAFETY: for QP events the element is the QP, which libibverbs keeps alive until the
            // event is acknowledged below (ibv_destroy_qp waits for that).
            let qp = unsafe { ev.element.ptr }.cast::<ibv_qp>();
            if !qp.is_null() {
                // SAFETY: as above.
                qpn = unsafe { (*qp).qp_num };
                // SAFETY: as above; the QP's context pointer is the queue's shared state, which the
                // queue keeps alive until after it destroys the QP.
                let shared = unsafe { (*qp).qp_context }.cast::<super::qp::QueueShared>();
                // Only the fatal kinds move a queue to ERROR (COMM_EST, SQ_DRAINED, PATH_MIG and
                // LAST_WQE_REACHED are informational), and only if the QP really is in ERR now: an
                // event of a queue's earlier life, read after a reset and reconnect, must not
                // mark the new one failed.
                if !shared.is_null() && tables::event::is_fatal_for_qp(t) && qp_in_error(qp) {
                    // SAFETY: see above.
                    unsafe { (*shared).device_error() };
                }
            }
        } else if t == tables::event::CQ_ERR {
            // SAFETY: for CQ events the element is the CQ, alive until the ack below.
            unsafe { super::cq::mark_overflow(ev.element.ptr.cast()) };
        } else if tables::event::has_port(t) {
            // SAFETY: for port events the element is the port number.
            port = unsafe { ev.element.port_num }.clamp(0, 255) as u8;
        }
        // SAFETY: acknowledges the event just read, exactly once.
        unsafe { ibv_ack_async_event((&mut ev as *mut RawAsyncEvent).cast()) };
        Ok(Some(tables::async_event(t, qpn, port)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse() {
        let (n, c) = parse_spec("rxe0,gid=1,mtu=1024").unwrap();
        assert_eq!(n.as_deref(), Some("rxe0"));
        assert_eq!((c.gid_index, c.path_mtu, c.port), (Some(1), Some(1024), 1));
        let (n, c) = parse_spec("").unwrap();
        assert_eq!((n, c), (None, DeviceConfig::default()));
        let (n, c) = parse_spec("gid=3").unwrap();
        assert_eq!((n, c.gid_index), (None, Some(3)));
        assert!(parse_spec("rxe0,mtu=1500").is_err());
        assert!(parse_spec("rxe0,speed=9").is_err());
        assert!(parse_spec("rxe0,gid").is_err());
    }

    #[test]
    fn ipv4_mapped_gids() {
        let mut g = [0u8; 16];
        g[10] = 0xff;
        g[11] = 0xff;
        g[12..].copy_from_slice(&[127, 0, 0, 1]);
        assert!(is_ipv4_mapped(&g));
        g[0] = 0xfe;
        assert!(!is_ipv4_mapped(&g));
    }

    #[test]
    fn open_without_devices_says_what_to_check() {
        // This host may or may not have an RDMA device; without one the error must say what to do.
        if device_names().is_empty() {
            let e = VerbsDevice::open(None, &DeviceConfig::default()).unwrap_err().to_string();
            assert!(e.contains("RDMA device") || e.contains("uverbs"), "{e}");
        }
    }
}
