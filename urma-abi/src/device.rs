//! Identities, devices and contexts: `urma_eid_t`, `urma_jetty_id_t`, `urma_device_t`,
//! `urma_context_t`, `urma_device_attr_t` and friends (urma-abi.md §3.1).

use core::ffi::{c_char, c_int, c_void};

/// Opaque `pthread_mutex_t` (glibc x86_64: 40 bytes, align 8). Only the library touches it.
pub type OpaqueMutex = [u64; 5];
/// Opaque `pthread_cond_t` (glibc x86_64: 48 bytes, align 8). Only the library touches it.
pub type OpaqueCond = [u64; 6];

/// `urma_eid_t` (16 bytes, align 8): a union of `raw[16]`, `in4{reserved u64, prefix u32,
/// addr u32}` and `in6{subnet_prefix u64, interface_id u64}`. Declared as the raw bytes with the
/// union's alignment; the accessors read the other views.
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct UrmaEid {
    /// The 16 bytes of the EID, in memory order.
    pub raw: [u8; 16],
}

impl UrmaEid {
    /// The `in4.addr` view (bytes 12..16, native endian, as the C union reads it).
    pub fn in4_addr(&self) -> u32 {
        u32::from_ne_bytes([self.raw[12], self.raw[13], self.raw[14], self.raw[15]])
    }
    /// The `in4.prefix` view (bytes 8..12, native endian).
    pub fn in4_prefix(&self) -> u32 {
        u32::from_ne_bytes([self.raw[8], self.raw[9], self.raw[10], self.raw[11]])
    }
    /// The `in6.subnet_prefix` view (bytes 0..8, native endian).
    pub fn subnet_prefix(&self) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.raw[0..8]);
        u64::from_ne_bytes(b)
    }
    /// The `in6.interface_id` view (bytes 8..16, native endian).
    pub fn interface_id(&self) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.raw[8..16]);
        u64::from_ne_bytes(b)
    }
}

/// `urma_token_t` (4 bytes): the token value guarding a segment, JFR or jetty.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct UrmaToken {
    /// The token value.
    pub token: u32,
}

/// `urma_init_attr_t` (16 bytes), the argument of `urma_init` (NULL is allowed).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct UrmaInitAttr {
    /// Token (unused by the core today).
    pub token: u64,
    /// Requested UASID; 0 lets the library choose.
    pub uasid: u32,
}

/// `urma_eid_info_t` (24 bytes): one entry of `urma_get_eid_list`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct UrmaEidInfo {
    /// The EID.
    pub eid: UrmaEid,
    /// Index to pass to `urma_create_context`.
    pub eid_index: u32,
}

/// `urma_jetty_id_t` (24 bytes); `urma_jfs_id_t`, `urma_jfr_id_t` and `urma_jfc_id_t` are the same
/// type.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct UrmaJettyId {
    /// EID of the owning context.
    pub eid: UrmaEid,
    /// UASID of the owning process.
    pub uasid: u32,
    /// Object id.
    pub id: u32,
}

/// `urma_jfs_id_t`.
pub type UrmaJfsId = UrmaJettyId;
/// `urma_jfr_id_t`.
pub type UrmaJfrId = UrmaJettyId;
/// `urma_jfc_id_t`.
pub type UrmaJfcId = UrmaJettyId;

/// Length of `urma_device_t::name`.
pub const URMA_MAX_NAME: usize = 64;
/// Length of `urma_device_t::path`.
pub const URMA_MAX_PATH: usize = 4096;
/// Number of entries in `urma_device_attr_t::port_attr`.
pub const URMA_MAX_PORT_CNT: usize = 8;
/// Number of entries in `urma_device_cap_t::priority_info`.
pub const URMA_MAX_PRIORITY_CNT: usize = 16;

/// `urma_device_t` (4184 bytes), owned by the library.
#[repr(C)]
#[derive(Debug)]
pub struct UrmaDevice {
    /// NUL-terminated device name (e.g. `udma0`).
    pub name: [c_char; URMA_MAX_NAME],
    /// NUL-terminated sysfs path.
    pub path: [c_char; URMA_MAX_PATH],
    /// `urma_transport_type_t`.
    pub type_: crate::consts::UrmaTransportType,
    /// Provider ops (`urma_provider_ops_t *`).
    pub ops: *mut c_void,
    /// Private sysfs device (`urma_sysfs_dev_t *`).
    pub sysfs_dev: *mut c_void,
}

/// `urma_context_t` (104 bytes), owned by the library. A caller reads `dev`, `eid`, `eid_index`
/// and `uasid`.
#[repr(C)]
#[derive(Debug)]
pub struct UrmaContext {
    /// The device the context is open on.
    pub dev: *mut UrmaDevice,
    /// Data-path ops (`urma_ops_t *`).
    pub ops: *mut c_void,
    /// Char-device fd (-1 for userspace-only devices).
    pub dev_fd: c_int,
    /// Async-event fd.
    pub async_fd: c_int,
    /// Library mutex.
    pub mutex: OpaqueMutex,
    /// Local EID.
    pub eid: UrmaEid,
    /// EID index the context was created with.
    pub eid_index: u32,
    /// Local UASID.
    pub uasid: u32,
    /// Reference count (`atomic_ulong`).
    pub ref_: u64,
    /// Aggregation (bonding) mode; 4 bytes declared, the C field may be narrower (read the low
    /// byte only when it matters).
    pub aggr_mode: u32,
}

/// `urma_port_attr_t` (20 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct UrmaPortAttr {
    /// `urma_mtu_t`.
    pub max_mtu: u32,
    /// `urma_port_state_t`.
    pub state: u32,
    /// Link width.
    pub active_width: u32,
    /// Link speed.
    pub active_speed: u32,
    /// `urma_mtu_t`.
    pub active_mtu: u32,
}

/// One entry of `urma_device_cap_t::priority_info`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct UrmaPriorityInfo {
    /// Service level.
    pub sl: u32,
    /// `union urma_tp_type_en`: a bit set (`consts::TP_TYPE_RTP` 1, `TP_TYPE_CTP` 2,
    /// `TP_TYPE_UTP` 4), not a `urma_tp_type_t`; URPC takes a priority whose set is RTP alone.
    pub tp_type: u32,
}

/// `urma_device_cap_t` (304 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct UrmaDeviceCap {
    /// Feature bits (`consts::FEATURE_*`).
    pub feature: u32,
    /// Max JFCs.
    pub max_jfc: u32,
    /// Max JFSs.
    pub max_jfs: u32,
    /// Max JFRs.
    pub max_jfr: u32,
    /// Max jettys.
    pub max_jetty: u32,
    /// Max jetty groups.
    pub max_jetty_grp: u32,
    /// Max jettys in a group.
    pub max_jetty_in_jetty_grp: u32,
    /// Max JFC depth.
    pub max_jfc_depth: u32,
    /// Max JFS depth.
    pub max_jfs_depth: u32,
    /// Max JFR depth.
    pub max_jfr_depth: u32,
    /// Max inline bytes in a JFS WR.
    pub max_jfs_inline_len: u32,
    /// Max SGEs in a JFS WR.
    pub max_jfs_sge: u32,
    /// Max remote SGEs in a JFS WR.
    pub max_jfs_rsge: u32,
    /// Max SGEs in a JFR WR.
    pub max_jfr_sge: u32,
    /// Max message size.
    pub max_msg_size: u64,
    /// Max READ size.
    pub max_read_size: u32,
    /// Max WRITE size.
    pub max_write_size: u32,
    /// Max CAS size.
    pub max_cas_size: u32,
    /// Max SWAP size.
    pub max_swap_size: u32,
    /// Max fetch-and-add size.
    pub max_fetch_and_add_size: u32,
    /// Max fetch-and-sub size.
    pub max_fetch_and_sub_size: u32,
    /// Max fetch-and-and size.
    pub max_fetch_and_and_size: u32,
    /// Max fetch-and-or size.
    pub max_fetch_and_or_size: u32,
    /// Max fetch-and-xor size.
    pub max_fetch_and_xor_size: u32,
    /// Atomic feature bits.
    pub atomic_feat: u32,
    /// Supported transport modes (`consts::URMA_TM_*` bits).
    pub trans_mode: u16,
    /// Reserved.
    pub reserved: u16,
    /// Congestion-control algorithms.
    pub congestion_ctrl_alg: u16,
    /// Completion event queues.
    pub ceq_cnt: u32,
    /// Max TPs in a TP group.
    pub max_tp_in_tpg: u32,
    /// Max EIDs.
    pub max_eid_cnt: u32,
    /// Page sizes supported.
    pub page_size_cap: u64,
    /// Max out-of-order count.
    pub max_oor_cnt: u32,
    /// mn.
    pub mn: u32,
    /// Max network addresses.
    pub max_netaddr_cnt: u32,
    /// RM order capabilities.
    pub rm_order_cap: u32,
    /// RC order capabilities.
    pub rc_order_cap: u32,
    /// RM TP capabilities.
    pub rm_tp_cap: u32,
    /// RC TP capabilities.
    pub rc_tp_cap: u32,
    /// UM TP capabilities.
    pub um_tp_cap: u32,
    /// TP feature bits.
    pub tp_feature: u32,
    /// Per-priority info.
    pub priority_info: [UrmaPriorityInfo; URMA_MAX_PRIORITY_CNT],
}

/// `urma_device_attr_t` (496 bytes), filled by `urma_query_device`. Older libraries write fewer
/// bytes with a different layout ([`crate::legacy`]); pass a zeroed buffer.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct UrmaDeviceAttr {
    /// Device GUID.
    pub guid: [u8; 16],
    /// Capabilities.
    pub dev_cap: UrmaDeviceCap,
    /// Number of valid `port_attr` entries.
    pub port_cnt: u8,
    /// Per-port attributes.
    pub port_attr: [UrmaPortAttr; URMA_MAX_PORT_CNT],
    /// Lowest reserved jetty id.
    pub reserved_jetty_id_min: u32,
    /// Highest reserved jetty id.
    pub reserved_jetty_id_max: u32,
}

/// The `element` union of `urma_async_event_t` (8 bytes): the object the event is about.
#[repr(C)]
#[derive(Clone, Copy)]
pub union UrmaAsyncElement {
    /// For JFC events.
    pub jfc: *mut crate::UrmaJfc,
    /// For JFS events.
    pub jfs: *mut c_void,
    /// For JFR events.
    pub jfr: *mut crate::UrmaJfr,
    /// For jetty events.
    pub jetty: *mut crate::UrmaJetty,
    /// For jetty-group events.
    pub jetty_grp: *mut c_void,
    /// For port events.
    pub port_id: u32,
    /// For EID-change events.
    pub eid_idx: u32,
}

impl core::fmt::Debug for UrmaAsyncElement {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        // SAFETY: every variant is plain data of at most 8 bytes; reading the pointer view of an
        // initialised union only reinterprets its bits.
        let p = unsafe { self.jfc };
        write!(f, "UrmaAsyncElement({p:p})")
    }
}

/// `urma_async_event_t` (32 bytes), filled by `urma_get_async_event`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct UrmaAsyncEvent {
    /// Context the event belongs to.
    pub urma_ctx: *mut UrmaContext,
    /// The object concerned.
    pub element: UrmaAsyncElement,
    /// `urma_async_event_type_t` (`consts::URMA_EVENT_*`).
    pub event_type: u32,
    /// Library private.
    pub priv_: *mut c_void,
}

/// `urma_user_ctl_in_t` (16 bytes): a driver-specific control request.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct UrmaUserCtlIn {
    /// Input buffer.
    pub addr: u64,
    /// Its length.
    pub len: u32,
    /// Driver-defined opcode.
    pub opcode: u32,
}

/// `urma_user_ctl_out_t` (16 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct UrmaUserCtlOut {
    /// Output buffer.
    pub addr: u64,
    /// Its length.
    pub len: u32,
    /// Reserved.
    pub reserved: u32,
}
