//! The library's global state: `urma_init` builds a fabric of simulated NICs from
//! [`crate::config`], one `urma_device_t` per NIC; `urma_uninit` retires them. Also the device
//! list, EID list and device queries, and the EID string helpers.

use crate::config::Config;
use crate::ffi::{self, fail, inval, Res};
use crate::ident;
use crate::registry::{self, Kind};
use bypass_hal::Device as _;
use bypass_sim::{Fabric, FabricConfig, SimNic};
use bypass_urma_abi as abi;
use bypass_urma_abi::status::*;
use std::cell::UnsafeCell;
use std::collections::HashSet;
use std::ffi::{c_char, c_int, CStr};
use std::sync::{Arc, Mutex};

/// One simulated device as C sees it (`urma_device_t` first).
#[repr(C)]
pub(crate) struct Dev {
    pub c: UnsafeCell<abi::UrmaDevice>,
    pub index: usize,
    pub nic: SimNic,
    pub eid: [u8; 16],
    pub uasid: u32,
    /// The least `err_timeout` exponent a jetty gets (`config::Config::ack_timeout_floor`).
    pub ack_timeout_floor: u8,
    /// The senders of UM datagrams this device knows (`um.rs`).
    pub senders: crate::um::Senders,
}

// SAFETY: the C struct is written once, before the handle is published, and only read after;
// the rest is Send + Sync.
unsafe impl Send for Dev {}
// SAFETY: as above.
unsafe impl Sync for Dev {}

impl Dev {
    pub(crate) fn name(&self) -> String {
        format!("bypass_sim{}", self.index)
    }

    pub(crate) fn ptr(&self) -> *mut abi::UrmaDevice {
        self.c.get()
    }
}

struct Runtime {
    _fabric: Fabric,
    devs: Vec<Arc<Dev>>,
    /// `stats` was configured: print the devices' counters when the runtime goes.
    stats: bool,
}

impl Runtime {
    /// The `stats` option: one line per device to stderr (not the log callback: it is for the
    /// person running the program, whatever the program does with liburma's log).
    fn print_stats(&self) {
        use std::io::Write;
        if !self.stats {
            return;
        }
        let mut err = std::io::stderr().lock();
        for d in &self.devs {
            let s = d.nic.stats();
            let _ = writeln!(
                err,
                "liburma (bypass-sim) stats {}: tx_packets {} rx_packets {} retransmits {} timeouts {} \
                 rnr_naks_sent {} rnr_naks_received {} seq_naks_received {} duplicates {} queue_errors {} \
                 datagrams_dropped {} tx_wire_busy {}",
                d.name(),
                s.tx_packets,
                s.rx_packets,
                s.retransmits,
                s.timeouts,
                s.rnr_naks_sent,
                s.rnr_naks_received,
                s.seq_naks_received,
                s.duplicates,
                s.queue_errors,
                s.datagrams_dropped,
                s.tx_wire_busy
            );
        }
    }
}

/// `atexit` hook of the `stats` option: prints the counters of a runtime `urma_uninit` did not
/// end.
extern "C" fn print_stats_at_exit() {
    let _ = std::panic::catch_unwind(|| {
        if let Ok(rt) = RT.try_lock() {
            if let Some(rt) = &*rt {
                rt.print_stats();
            }
        }
    });
}

static RT: Mutex<Option<Runtime>> = Mutex::new(None);

/// Arrays handed to C (device and EID lists) that only our free functions may free.
static LISTS: Mutex<Option<HashSet<usize>>> = Mutex::new(None);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn devices() -> Res<Vec<Arc<Dev>>> {
    match &*lock(&RT) {
        Some(rt) => Ok(rt.devs.clone()),
        None => Err(fail(libc::ENODEV, "liburma is not initialised: call urma_init first")),
    }
}

/// A zeroed C array of `n` `T`s from `calloc`, remembered so only our free functions free it.
pub(crate) fn alloc_list<T>(n: usize) -> Res<*mut T> {
    // SAFETY: calloc with a non-zero count; the result is checked for NULL.
    let p = unsafe { libc::calloc(n.max(1), std::mem::size_of::<T>()) } as *mut T;
    if p.is_null() {
        return Err(fail(libc::ENOMEM, "out of memory"));
    }
    lock(&LISTS).get_or_insert_with(HashSet::new).insert(p as usize);
    Ok(p)
}

pub(crate) fn free_list<T>(p: *mut T, what: &str) -> Res<()> {
    if p.is_null() {
        return Ok(());
    }
    if !lock(&LISTS).get_or_insert_with(HashSet::new).remove(&(p as usize)) {
        return Err(inval(format!(
            "{what} {p:p} was not returned by this library (or was freed already); not freed"
        )));
    }
    // SAFETY: `p` came from `alloc_list` (calloc) and was not freed since (it was in LISTS).
    unsafe { libc::free(p.cast()) };
    Ok(())
}

fn new_dev(index: usize, nic: SimNic, uasid: u32, ack_timeout_floor: u8) -> Arc<Dev> {
    let (gid, lid) = nic.endpoint();
    // SAFETY: UrmaDevice is plain C data; all-zero is valid.
    let mut c: abi::UrmaDevice = unsafe { ffi::zeroed() };
    for (d, s) in c.name.iter_mut().zip(format!("bypass_sim{index}").bytes()) {
        *d = s as c_char;
    }
    c.type_ = abi::consts::URMA_TRANSPORT_UB;
    let (eid, uasid) = ident::eid_of(gid, lid, uasid);
    Arc::new(Dev {
        c: UnsafeCell::new(c),
        index,
        nic,
        eid,
        uasid,
        ack_timeout_floor,
        senders: Default::default(),
    })
}

/// `urma_init`.
#[no_mangle]
pub unsafe extern "C" fn urma_init(conf: *mut abi::UrmaInitAttr) -> UrmaStatus {
    ffi::status("urma_init", || {
        let mut rt = lock(&RT);
        if rt.is_some() {
            return Err(fail(URMA_EEXIST, "liburma is already initialised (urma_init called twice)"));
        }
        // SAFETY: a non-NULL `conf` points to an init attr (the API's contract).
        let uasid = if conf.is_null() { 0 } else { unsafe { ffi::read_in(conf, "conf")? }.uasid };
        let uasid = if uasid != 0 { uasid } else { std::process::id().max(1) };
        let cfg = Config::from_env().map_err(|e| fail(URMA_FAIL, e))?;
        let fabric = Fabric::try_with_config(FabricConfig {
            wire: cfg.wire,
            ack_timeout_backoff: cfg.ack_timeout_backoff(),
            ..FabricConfig::new(cfg.engine)
        })
        .map_err(|e| fail(URMA_FAIL, format!("{}: {e}", crate::config::ENV)))?;
        let mut devs = Vec::with_capacity(cfg.devices);
        for i in 0..cfg.devices {
            let nic = fabric.try_add_nic().map_err(|e| {
                fail(
                    URMA_FAIL,
                    format!("cannot open simulated device bypass_sim{i} ({}): {e}", cfg.describe()),
                )
            })?;
            let dev = new_dev(i, nic, uasid, cfg.ack_timeout_floor());
            registry::insert(Kind::Device, dev.clone());
            devs.push(dev);
        }
        crate::log::log(crate::log::INFO, &format!("initialised: {}", cfg.describe()));
        if cfg.stats {
            static AT_EXIT: std::sync::Once = std::sync::Once::new();
            // SAFETY: registers a plain `extern "C" fn()` that catches its own panics.
            AT_EXIT.call_once(|| unsafe {
                libc::atexit(print_stats_at_exit);
            });
        }
        *rt = Some(Runtime { _fabric: fabric, devs, stats: cfg.stats });
        Ok(())
    })
}

/// `urma_uninit`: the devices disappear from the list; objects still open keep working until
/// they are deleted.
#[no_mangle]
pub unsafe extern "C" fn urma_uninit() -> UrmaStatus {
    ffi::status("urma_uninit", || {
        let Some(rt) = lock(&RT).take() else {
            return Err(fail(URMA_FAIL, "liburma is not initialised"));
        };
        for d in &rt.devs {
            registry::remove::<Dev, _>(Kind::Device, Arc::as_ptr(d));
        }
        rt.print_stats();
        Ok(())
    })
}

/// `urma_get_device_list`.
#[no_mangle]
pub unsafe extern "C" fn urma_get_device_list(num_devices: *mut c_int) -> *mut *mut abi::UrmaDevice {
    ffi::pointer("urma_get_device_list", || {
        if num_devices.is_null() {
            return Err(inval("num_devices is NULL"));
        }
        let devs = devices()?;
        let list = alloc_list::<*mut abi::UrmaDevice>(devs.len() + 1)?;
        for (i, d) in devs.iter().enumerate() {
            // SAFETY: `list` has room for len + 1 pointers.
            unsafe { *list.add(i) = d.ptr() };
        }
        // SAFETY: checked non-NULL above; the caller passes a writable int.
        unsafe { *num_devices = devs.len() as c_int };
        Ok(list)
    })
}

/// `urma_free_device_list`: frees the array only.
#[no_mangle]
pub unsafe extern "C" fn urma_free_device_list(device_list: *mut *mut abi::UrmaDevice) {
    ffi::unit("urma_free_device_list", || free_list(device_list, "device list"))
}

/// `urma_get_device_by_name`.
#[no_mangle]
pub unsafe extern "C" fn urma_get_device_by_name(dev_name: *mut c_char) -> *mut abi::UrmaDevice {
    ffi::pointer("urma_get_device_by_name", || {
        if dev_name.is_null() {
            return Err(inval("dev_name is NULL"));
        }
        // SAFETY: a NUL-terminated string, per the API.
        let name = unsafe { CStr::from_ptr(dev_name) }.to_string_lossy().into_owned();
        let devs = devices()?;
        devs.iter().find(|d| d.name() == name).map(|d| d.ptr()).ok_or_else(|| {
            let names: Vec<String> = devs.iter().map(|d| d.name()).collect();
            fail(
                libc::ENODEV,
                format!(
                    "no device {name:?}: this library simulates {} (set {}=devices=N for more)",
                    names.join(", "),
                    crate::config::ENV
                ),
            )
        })
    })
}

/// `urma_get_device_by_eid` (the EID by value).
#[no_mangle]
pub unsafe extern "C" fn urma_get_device_by_eid(
    eid: abi::UrmaEid,
    type_: abi::consts::UrmaTransportType,
) -> *mut abi::UrmaDevice {
    ffi::pointer("urma_get_device_by_eid", || {
        if type_ != abi::consts::URMA_TRANSPORT_UB {
            return Err(fail(
                libc::ENODEV,
                format!("the simulated devices are UB (type 0), not type {type_}"),
            ));
        }
        let devs = devices()?;
        devs.iter()
            .find(|d| d.eid == eid.raw)
            .map(|d| d.ptr())
            .ok_or_else(|| fail(libc::ENODEV, "no simulated device has this EID"))
    })
}

pub(crate) fn dev_of(p: *const abi::UrmaDevice) -> Res<Arc<Dev>> {
    registry::get::<Dev, _>(Kind::Device, p).ok_or_else(|| {
        inval(format!("{p:p} is not a device of this library (NULL, unknown, or from before urma_uninit)"))
    })
}

/// `urma_get_eid_list`: one EID per simulated device, index 0.
#[no_mangle]
pub unsafe extern "C" fn urma_get_eid_list(
    dev: *mut abi::UrmaDevice,
    cnt: *mut u32,
) -> *mut abi::UrmaEidInfo {
    ffi::pointer("urma_get_eid_list", || {
        let d = dev_of(dev)?;
        if cnt.is_null() {
            return Err(inval("cnt is NULL"));
        }
        let list = alloc_list::<abi::UrmaEidInfo>(1)?;
        // SAFETY: `list` has room for one entry; `cnt` is non-NULL and writable per the API.
        unsafe {
            (*list).eid.raw = d.eid;
            (*list).eid_index = 0;
            *cnt = 1;
        }
        Ok(list)
    })
}

/// `urma_free_eid_list`.
#[no_mangle]
pub unsafe extern "C" fn urma_free_eid_list(eid_list: *mut abi::UrmaEidInfo) {
    ffi::unit("urma_free_eid_list", || free_list(eid_list, "EID list"))
}

/// `urma_query_device`: the simulated NIC's limits in URMA terms.
#[no_mangle]
pub unsafe extern "C" fn urma_query_device(
    dev: *mut abi::UrmaDevice,
    dev_attr: *mut abi::UrmaDeviceAttr,
) -> UrmaStatus {
    ffi::status("urma_query_device", || {
        let d = dev_of(dev)?;
        if dev_attr.is_null() {
            return Err(inval("dev_attr is NULL"));
        }
        let caps = d.nic.caps();
        // SAFETY: plain C data.
        let mut a: abi::UrmaDeviceAttr = unsafe { ffi::zeroed() };
        a.guid = d.eid;
        let c = &mut a.dev_cap;
        c.max_jfc = 1 << 16;
        c.max_jfs = 1 << 16;
        c.max_jfr = 1 << 16;
        c.max_jetty = 1 << 16;
        c.max_jfc_depth = caps.max_cq_depth;
        c.max_jfs_depth = caps.max_queue_depth;
        c.max_jfr_depth = caps.max_queue_depth;
        c.max_jfs_inline_len = caps.max_inline;
        c.max_jfs_sge = caps.max_send_sge;
        c.max_jfs_rsge = 1;
        c.max_jfr_sge = caps.max_recv_sge;
        c.max_msg_size = u64::from(caps.max_msg_size);
        c.max_read_size = caps.max_msg_size;
        c.max_write_size = caps.max_msg_size;
        c.trans_mode = (abi::consts::URMA_TM_RM | abi::consts::URMA_TM_RC | abi::consts::URMA_TM_UM) as u16;
        c.max_eid_cnt = 1;
        c.page_size_cap = 4096;
        // RC runs over a reliable transport (RTP) in order (OL, what `create_jetty` picks by
        // default), at every priority: one service level per priority, all RTP, which is
        // what URPC looks for when it picks a priority.
        c.rc_tp_cap = abi::consts::TP_TYPE_RTP;
        c.rc_order_cap = abi::consts::ORDER_CAP_OL;
        // UM runs over an unreliable transport (UTP), unordered (the sim's datagram queues).
        c.um_tp_cap = abi::consts::TP_TYPE_UTP;
        // RM runs over a reliable transport (RTP: the sim's reliable datagram queues, one
        // message in flight per jetty, so completions keep posting order: OL).
        c.rm_tp_cap = abi::consts::TP_TYPE_RTP;
        c.rm_order_cap = abi::consts::ORDER_CAP_OL;
        for (i, p) in c.priority_info.iter_mut().enumerate() {
            *p = abi::UrmaPriorityInfo { sl: i as u32, tp_type: abi::consts::TP_TYPE_RTP };
        }
        a.port_cnt = 1;
        a.port_attr[0] = abi::UrmaPortAttr {
            max_mtu: abi::consts::URMA_MTU_4096,
            state: PORT_ACTIVE,
            active_width: 1,
            active_speed: 0,
            active_mtu: abi::consts::URMA_MTU_4096,
        };
        // SAFETY: non-NULL; the caller passes a writable attr (over-allocated by careful callers).
        unsafe { dev_attr.write_unaligned(a) };
        Ok(())
    })
}

/// `URMA_PORT_ACTIVE` of `urma_port_state_t`.
const PORT_ACTIVE: u32 = 4;

/// `urma_str_to_eid`: an IPv6 address (or an IPv4 one, mapped) in text.
#[no_mangle]
pub unsafe extern "C" fn urma_str_to_eid(buf: *const c_char, eid: *mut abi::UrmaEid) -> c_int {
    ffi::count("urma_str_to_eid", || {
        if buf.is_null() || eid.is_null() {
            return Err(inval("buf or eid is NULL"));
        }
        // SAFETY: a NUL-terminated string, per the API.
        let s = unsafe { CStr::from_ptr(buf) }.to_string_lossy().into_owned();
        let raw = if let Ok(v6) = s.parse::<std::net::Ipv6Addr>() {
            v6.octets()
        } else if let Ok(v4) = s.parse::<std::net::Ipv4Addr>() {
            v4.to_ipv6_mapped().octets()
        } else {
            return Err(inval(format!("{s:?} is not an EID (an IPv6 or IPv4 address)")));
        };
        // SAFETY: non-NULL, writable per the API.
        unsafe { (*eid).raw = raw };
        Ok(0)
    })
}

/// `urma_u32_to_eid`: the IPv4-mapped EID of `ipv4` (host order).
#[no_mangle]
pub unsafe extern "C" fn urma_u32_to_eid(ipv4: u32, eid: *mut abi::UrmaEid) {
    ffi::unit("urma_u32_to_eid", || {
        if eid.is_null() {
            return Err(inval("eid is NULL"));
        }
        // SAFETY: non-NULL, writable per the API.
        unsafe { (*eid).raw = std::net::Ipv4Addr::from(ipv4).to_ipv6_mapped().octets() };
        Ok(())
    })
}

/// `urma_register_log_func`.
#[no_mangle]
pub unsafe extern "C" fn urma_register_log_func(func: abi::fns::UrmaLogCb) -> UrmaStatus {
    ffi::status("urma_register_log_func", || {
        crate::log::set_callback(func);
        Ok(())
    })
}

/// `urma_unregister_log_func`: log lines go to stderr again (liburma's default is syslog).
#[no_mangle]
pub unsafe extern "C" fn urma_unregister_log_func() -> UrmaStatus {
    ffi::status("urma_unregister_log_func", || {
        crate::log::set_callback(None);
        Ok(())
    })
}

/// `urma_user_ctl`: driver-specific requests. The simulated device has none, so every opcode is
/// refused with `URMA_ENOPERM`, which is what UDMA's driver answers for an opcode it lacks (and
/// what liburma passes through without calling it a failure); NULL arguments are `URMA_EINVAL`.
#[no_mangle]
pub unsafe extern "C" fn urma_user_ctl(
    ctx: *mut abi::UrmaContext,
    in_: *mut abi::UrmaUserCtlIn,
    out: *mut abi::UrmaUserCtlOut,
) -> UrmaStatus {
    let st = ffi::status("urma_user_ctl", || {
        crate::context::ctx_of(ctx)?;
        // SAFETY: a non-NULL `in` points to a user_ctl_in (the API's contract).
        let i = unsafe { ffi::read_in(in_, "in")? };
        if out.is_null() {
            return Err(inval("out is NULL"));
        }
        crate::log::log(
            crate::log::INFO,
            &format!(
                "urma_user_ctl opcode {:#x}: the simulated device has no driver-specific operations \
                 (URMA_ENOPERM, as UDMA answers an opcode it lacks)",
                i.opcode
            ),
        );
        Ok(())
    });
    if st != URMA_SUCCESS {
        return st;
    }
    URMA_ENOPERM
}

/// `urma_log_set_level`.
#[no_mangle]
pub unsafe extern "C" fn urma_log_set_level(level: u32) {
    ffi::unit("urma_log_set_level", || {
        crate::log::set_level(level.min(7) as i32);
        Ok(())
    })
}
