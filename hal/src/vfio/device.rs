//! [`VirtioNet`]: a virtio-net device owned through VFIO, brought up and driven as an
//! [`L2Port`](crate::l2::L2Port).
//!
//! Bring-up (the sequence that exchanged frames in the project's guest, `shared/reference/vfio.md`):
//! check the host (IOMMU, vfio-pci binding, group viability, locked-memory limit) with messages
//! that say what to do; open a Type1v2 container, the group and the device; walk the virtio-pci
//! capabilities in config space; map the BAR(s) holding them; reset → ACKNOWLEDGE|DRIVER →
//! negotiate → FEATURES_OK (read back) → map one DMA region into the IOMMU → set up the receive
//! and transmit queues → DRIVER_OK. Dropping the port resets the device before its DMA memory is
//! unmapped and freed.

use super::dma::{DmaRegion, IommuMapping};
use super::mmio::Bar;
use super::net::{NetEngine, NetLayout, Notify, MAX_MTU, RX_QUEUE, TX_QUEUE};
use super::pci::{parse_virtio_caps, PciAddress, VirtioCaps};
use super::virtio_pci::{feature, negotiate, status, CommonCfg, NO_VECTOR};
use crate::l2::{L2Port, Mac};
use crate::{Error, Result};
use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use vfio_ioctls::{VfioContainer, VfioDevice, VfioError};
use vmm_sys_util::eventfd::EventFd;

/// `VFIO_PCI_CONFIG_REGION_INDEX`.
const CONFIG_REGION: u32 = 7;
/// PCI command register: memory space enable.
const PCI_COMMAND_MEMORY: u16 = 1 << 1;
/// PCI command register: bus master enable.
const PCI_COMMAND_MASTER: u16 = 1 << 2;
/// `VFIO_REGION_INFO_FLAG_MMAP`.
const REGION_FLAG_MMAP: u32 = 1 << 2;
/// `VFIO_PCI_MSIX_IRQ_INDEX`.
const MSIX_IRQ_INDEX: u32 = 2;
/// The MSI-X vector of the receive queue (the only interrupt the driver asks for).
const RX_VECTOR: u16 = 0;

/// How to open a [`VirtioNet`].
#[derive(Debug, Clone)]
pub struct VirtioNetOptions {
    /// Receive queue size (a power of two; capped by the device's maximum).
    pub rx_depth: u16,
    /// Transmit queue size (a power of two; capped by the device's maximum).
    pub tx_depth: u16,
    /// The IO virtual address of the driver's DMA region (1 GiB by default: below the 4 GiB
    /// boundary, clear of the x86 interrupt window at 0xfee00000).
    pub iova: u64,
    /// Where sysfs is mounted (tests point it at a fake tree).
    pub sysfs: PathBuf,
    /// Where the VFIO device nodes are.
    pub dev_vfio: PathBuf,
    /// Receive interrupts: MSI-X vector 0 of the device signals an eventfd
    /// ([`L2Port::event_fd`]) when a frame arrives after [`L2Port::arm`]. Off (or on a device
    /// without MSI-X) the port can only be polled.
    pub interrupts: bool,
}

impl Default for VirtioNetOptions {
    fn default() -> Self {
        VirtioNetOptions {
            rx_depth: 256,
            tx_depth: 256,
            iova: 0x4000_0000,
            sysfs: PathBuf::from("/sys"),
            dev_vfio: PathBuf::from("/dev/vfio"),
            interrupts: true,
        }
    }
}

/// Notifies a queue by a 16-bit write of its index at its notify address.
#[derive(Debug)]
struct BarNotify {
    bar: Arc<Bar>,
    rx: usize,
    tx: usize,
}

impl Notify for BarNotify {
    fn notify(&mut self, queue: u16) {
        let off = if queue == RX_QUEUE { self.rx } else { self.tx };
        // The queue's entries were published with a release fence by `SplitQueue::publish`, and
        // the device's read of them is ordered after this store by the device itself (MMIO on
        // x86 is not reordered with earlier stores).
        self.bar.write16(off, queue);
    }
}

/// A virtio-net NIC driven from userspace through VFIO.
pub struct VirtioNet {
    engine: NetEngine<BarNotify>,
    /// Signalled by VFIO on the receive queue's MSI-X vector (`None`: polling only).
    irq: Option<EventFd>,
    common: Arc<Bar>,
    common_off: usize,
    _mapping: IommuMapping,
    _bars: Vec<Arc<Bar>>,
    _device: VfioDevice,
    _container: Arc<VfioContainer>,
    address: PciAddress,
}

impl std::fmt::Debug for VirtioNet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VirtioNet")
            .field("address", &self.address)
            .field("mac", &self.engine.mac())
            .field("mtu", &self.engine.mtu())
            .finish_non_exhaustive()
    }
}

impl VirtioNet {
    /// Opens the virtio-net device at PCI address `pci` (`0000:00:03.0`) with default options.
    pub fn open(pci: &str) -> Result<VirtioNet> {
        VirtioNet::open_with(pci, &VirtioNetOptions::default())
    }

    /// Opens the device at `pci` with `opts`.
    pub fn open_with(pci: &str, opts: &VirtioNetOptions) -> Result<VirtioNet> {
        let address = PciAddress::parse(pci)?;
        let layout = NetLayout::new(opts.rx_depth, opts.tx_depth);
        let sysfs_dev = preflight(address, opts, layout.len)?;
        let container = Arc::new(VfioContainer::new(None).map_err(|e| vfio_error(e, address, opts))?);
        let device = VfioDevice::new(&sysfs_dev, container.clone(), false)
            .map_err(|e| vfio_error(e, address, opts))?;

        let mut config = [0u8; 256];
        device.region_read(CONFIG_REGION, &mut config, 0);
        let caps = parse_virtio_caps(&config)?;
        // Memory space and bus mastering on (PCI command register): vfio-pci leaves bus
        // mastering off, and a device without it does no DMA at all.
        let command = u16::from_le_bytes([config[4], config[5]]) | PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER;
        device.region_write(CONFIG_REGION, &command.to_le_bytes(), 4);
        let mut bars: Vec<(u8, Arc<Bar>)> = Vec::new();
        for r in [caps.common, caps.notify, caps.device] {
            if bars.iter().any(|(b, _)| *b == r.bar) {
                continue;
            }
            let index = u32::from(r.bar);
            if device.get_region_flags(index) & REGION_FLAG_MMAP == 0 {
                return Err(Error::Unsupported(format!(
                    "{address}: BAR {index} (virtio structures) cannot be mmap'ed through VFIO"
                )));
            }
            let size = device.get_region_size(index) as usize;
            let bar = Bar::map(device.as_raw_fd(), device.get_region_offset(index), size)?;
            bars.push((r.bar, Arc::new(bar)));
        }
        let bar_of = |n: u8| bars.iter().find(|(b, _)| *b == n).map(|(_, a)| a.clone()).unwrap();
        let common_bar = bar_of(caps.common.bar);
        let common_off = caps.common.offset as usize;
        let common = CommonCfg::new(&common_bar, common_off);
        let fail = |e: Error| {
            common.set_status(status::FAILED);
            e
        };

        common.reset()?;
        common.set_status(status::ACKNOWLEDGE);
        common.set_status(status::ACKNOWLEDGE | status::DRIVER);
        let accepted = negotiate(common.device_features()).map_err(fail)?;
        common.set_driver_features(accepted);
        common.set_status(status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK);
        if common.status() & status::FEATURES_OK == 0 {
            return Err(fail(Error::Device(format!(
                "{address}: the device refused features {accepted:#x} (FEATURES_OK not set)"
            ))));
        }
        if common.num_queues() < 2 {
            return Err(fail(Error::Device(format!("{address}: fewer than 2 virtqueues"))));
        }
        let (mac, mtu) = read_net_config(&bar_of(caps.device.bar), &caps, accepted, address);
        if mtu > MAX_MTU {
            return Err(fail(Error::Unsupported(format!(
                "{address}: MTU {mtu} is above the {MAX_MTU} this driver's buffers carry"
            ))));
        }

        // Queue sizes: what was asked, capped by the device.
        let mut sizes = [opts.rx_depth, opts.tx_depth];
        for (q, size) in [RX_QUEUE, TX_QUEUE].into_iter().zip(sizes.iter_mut()) {
            let max = common.select(q);
            if max == 0 {
                return Err(fail(Error::Device(format!("{address}: queue {q} is not available"))));
            }
            *size = (*size).min(max);
            if !size.is_power_of_two() {
                return Err(fail(Error::InvalidArgument(format!(
                    "queue depth {size}: use a power of two (the device allows up to {max})"
                ))));
            }
        }
        // MSI-X on at the PCI level (VFIO programs the table and the enable bit) before any
        // vector is given to the device: virtio-pci takes vectors before DRIVER_OK.
        let irq = if opts.interrupts { enable_msix(&device, address).map_err(fail)? } else { None };
        let layout = NetLayout::new(sizes[0], sizes[1]);
        let region = Arc::new(DmaRegion::new(layout.len, opts.iova)?);
        let mapping = region.map_dma(&container).map_err(|e| fail(vfio_error(e, address, opts)))?;

        let notify_bar = bar_of(caps.notify.bar);
        let mut notify_at = [0usize; 2];
        for (i, (q, ql)) in [(RX_QUEUE, layout.rx), (TX_QUEUE, layout.tx)].into_iter().enumerate() {
            common.select(q);
            let base = region.iova();
            let off = common.setup_queue(
                ql.size,
                base + ql.desc as u64,
                base + ql.avail as u64,
                base + ql.used as u64,
            );
            notify_at[i] = caps.notify.offset as usize + usize::from(off) * caps.notify_multiplier as usize;
            let vector = if irq.is_some() && q == RX_QUEUE { RX_VECTOR } else { NO_VECTOR };
            let kept = common.set_queue_vector(vector);
            if kept != vector {
                return Err(fail(Error::Device(format!(
                    "{address}: queue {q} refused MSI-X vector {vector} (read back {kept:#x}); \
                     open with interrupts off to poll"
                ))));
            }
            common.enable_queue();
        }
        common.set_config_vector(NO_VECTOR);
        let event_idx = accepted & feature::RING_EVENT_IDX != 0;
        common.set_status(status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK | status::DRIVER_OK);
        if common.status() & status::DEVICE_NEEDS_RESET != 0 {
            return Err(fail(Error::Device(format!(
                "{address}: the device set DEVICE_NEEDS_RESET during setup"
            ))));
        }
        let notify = BarNotify { bar: notify_bar, rx: notify_at[0], tx: notify_at[1] };
        let engine = NetEngine::new(region, layout, event_idx, mac, mtu, notify).map_err(fail)?;
        Ok(VirtioNet {
            engine,
            irq,
            common: common_bar.clone(),
            common_off,
            _mapping: mapping,
            _bars: bars.into_iter().map(|(_, b)| b).collect(),
            _device: device,
            _container: container,
            address,
        })
    }

    /// The device's PCI address.
    pub fn address(&self) -> PciAddress {
        self.address
    }

    /// The device status and both queues' indices, for a test's failure message.
    pub fn diagnostics(&self) -> String {
        let st = CommonCfg::new(&self.common, self.common_off).status();
        format!("device status {st:#x}; {}", self.engine.diagnostics())
    }

    /// Received frames dropped as malformed (shorter than a header, longer than a buffer).
    pub fn rx_dropped(&self) -> u64 {
        self.engine.rx_dropped()
    }

    /// The MSI-X capability's message control word as the device's config space holds it
    /// (bit 15 enable, bit 14 function mask; `None` if the device has no MSI-X capability), for
    /// a test's failure message.
    pub fn msix_control(&self) -> Option<u16> {
        let mut config = [0u8; 256];
        self._device.region_read(CONFIG_REGION, &mut config, 0);
        msix_control(&config)
    }
}

/// Creates the receive eventfd and has VFIO route the device's MSI-X vector 0 to it; `None`
/// (the port polls) if the device has no MSI-X.
fn enable_msix(device: &VfioDevice, address: PciAddress) -> Result<Option<EventFd>> {
    if device.get_irq_info(MSIX_IRQ_INDEX).map_or(0, |i| i.count) == 0 {
        return Ok(None);
    }
    let fd = EventFd::new(libc::EFD_NONBLOCK | libc::EFD_CLOEXEC)
        .map_err(|e| Error::OutOfResources(format!("eventfd for {address}'s interrupts: {e}")))?;
    device.enable_msix(vec![&fd]).map_err(|e| {
        Error::Device(format!("{address}: VFIO refused MSI-X ({e}); open with interrupts off to poll"))
    })?;
    Ok(Some(fd))
}

/// The MSI-X message control word of a config space, found by walking the capability list.
fn msix_control(config: &[u8; 256]) -> Option<u16> {
    if config[6] & 0x10 == 0 {
        return None;
    }
    let mut at = usize::from(config[0x34] & 0xfc);
    for _ in 0..48 {
        if at < 0x40 || at + 4 > config.len() {
            return None;
        }
        if config[at] == 0x11 {
            return Some(u16::from_le_bytes([config[at + 2], config[at + 3]]));
        }
        at = usize::from(config[at + 1] & 0xfc);
    }
    None
}

impl Drop for VirtioNet {
    fn drop(&mut self) {
        // Stop the device's DMA before the IOMMU mapping and the memory go (fields drop after).
        let _ = CommonCfg::new(&self.common, self.common_off).reset();
    }
}

impl L2Port for VirtioNet {
    fn mac(&self) -> Mac {
        self.engine.mac()
    }
    fn mtu(&self) -> usize {
        self.engine.mtu()
    }
    fn send(&mut self, frames: &[&[u8]]) -> Result<usize> {
        self.engine.send(frames)
    }
    fn recv(&mut self, max: usize, each: &mut dyn FnMut(&[u8])) -> Result<usize> {
        self.engine.recv(max, each)
    }
    fn event_fd(&self) -> Option<RawFd> {
        self.irq.as_ref().map(|e| e.as_raw_fd())
    }
    fn arm(&mut self) -> Result<bool> {
        if self.irq.is_none() {
            return Ok(true);
        }
        Ok(self.engine.arm_rx())
    }
}

/// MAC (from the device, or a locally administered one made up if it has none) and MTU (from
/// the device if it reports one, else 1500), read consistently across a config generation.
fn read_net_config(bar: &Bar, caps: &VirtioCaps, features: u64, addr: PciAddress) -> (Mac, usize) {
    let base = caps.device.offset as usize;
    let common = CommonCfg::new(bar, caps.common.offset as usize);
    loop {
        let gen = common.config_generation();
        let mut mac = [0u8; 6];
        if features & feature::NET_MAC != 0 {
            for (i, b) in mac.iter_mut().enumerate() {
                *b = bar.read8(base + i);
            }
        } else {
            // Locally administered, unicast, derived from the PCI address.
            mac = [0x02, 0x00, addr.bus, addr.device, addr.function, 0x01];
        }
        let mtu = if features & feature::NET_MTU != 0 { usize::from(bar.read16(base + 10)) } else { 1500 };
        if common.config_generation() == gen {
            return (mac, mtu);
        }
    }
}

/// The host checks before any ioctl: each refusal says what to do. Returns the device's sysfs
/// directory.
pub(crate) fn preflight(addr: PciAddress, opts: &VirtioNetOptions, dma_bytes: usize) -> Result<PathBuf> {
    let dev = opts.sysfs.join("bus/pci/devices").join(addr.to_string());
    if !dev.exists() {
        return Err(Error::InvalidArgument(format!(
            "no PCI device {addr} ({} does not exist); `lspci -D` lists the devices",
            dev.display()
        )));
    }
    if !opts.dev_vfio.join("vfio").exists() {
        return Err(Error::Unsupported(format!(
            "{}/vfio does not exist: load the driver (`modprobe vfio-pci`) and enable an IOMMU \
             (intel_iommu=on or amd_iommu=on on the kernel command line; in QEMU: -machine q35 \
             -device intel-iommu,intremap=on)",
            opts.dev_vfio.display()
        )));
    }
    let driver = link_name(&dev.join("driver"));
    if driver.as_deref() != Some("vfio-pci") {
        let unbind = match &driver {
            Some(d) => format!("\n  echo {addr} > /sys/bus/pci/drivers/{d}/unbind"),
            None => String::new(),
        };
        return Err(Error::Unsupported(format!(
            "PCI device {addr} is bound to {}, not vfio-pci; as root:{unbind}\n  echo vfio-pci > \
             /sys/bus/pci/devices/{addr}/driver_override\n  echo {addr} > \
             /sys/bus/pci/drivers_probe",
            driver.as_deref().unwrap_or("no driver")
        )));
    }
    let Some(group) = link_name(&dev.join("iommu_group")) else {
        return Err(Error::Unsupported(format!(
            "PCI device {addr} has no IOMMU group: the kernel runs without an IOMMU for it; \
             enable one (intel_iommu=on or amd_iommu=on; in QEMU: -device intel-iommu) — this \
             driver does not use VFIO's unsafe no-IOMMU mode"
        )));
    };
    if !opts.dev_vfio.join(&group).exists() {
        return Err(Error::Unsupported(format!(
            "{}/{group} does not exist although {addr} is bound to vfio-pci; reload vfio-pci",
            opts.dev_vfio.display()
        )));
    }
    let others = group_blockers(&opts.sysfs, &group, addr);
    if !others.is_empty() {
        return Err(not_viable(addr, &group, &others));
    }
    check_memlock(dma_bytes)?;
    Ok(dev)
}

fn link_name(p: &Path) -> Option<String> {
    Some(std::fs::read_link(p).ok()?.file_name()?.to_string_lossy().into_owned())
}

/// Devices of IOMMU group `group` (other than `addr`) bound to a driver that makes the group
/// non-viable: anything but vfio-pci, pci-stub or a PCIe port driver.
fn group_blockers(sysfs: &Path, group: &str, addr: PciAddress) -> Vec<(String, String)> {
    let dir = sysfs.join("kernel/iommu_groups").join(group).join("devices");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == addr.to_string() {
            continue;
        }
        if let Some(d) = link_name(&entry.path().join("driver")) {
            if !["vfio-pci", "pci-stub", "pcieport"].contains(&d.as_str()) {
                out.push((name, d));
            }
        }
    }
    out.sort();
    out
}

fn not_viable(addr: PciAddress, group: &str, others: &[(String, String)]) -> Error {
    let list: Vec<String> = others.iter().map(|(d, drv)| format!("{d} (bound to {drv})")).collect();
    Error::Unsupported(format!(
        "IOMMU group {group} of {addr} is not viable: every device in it must be bound to \
         vfio-pci or to no driver; also bind or unbind {}",
        list.join(", ")
    ))
}

/// Refuses early when RLIMIT_MEMLOCK is too low for the DMA region: VFIO pins it and counts it
/// against the limit unless the process has CAP_IPC_LOCK (read from `/proc/self`).
fn check_memlock(bytes: usize) -> Result<()> {
    match (memlock_limit(), has_ipc_lock()) {
        (Some(limit), false) if u128::from(limit) < bytes as u128 => Err(memlock_error(Some(limit), bytes)),
        _ => Ok(()),
    }
}

/// The soft RLIMIT_MEMLOCK in bytes; `None` if unlimited or unknown.
fn memlock_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max locked memory"))?;
    line["Max locked memory".len()..].split_whitespace().next()?.parse().ok()
}

/// Whether the effective capabilities include CAP_IPC_LOCK (bit 14).
fn has_ipc_lock() -> bool {
    let Ok(st) = std::fs::read_to_string("/proc/self/status") else { return false };
    st.lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << 14) != 0)
}

fn memlock_error(limit: Option<u64>, bytes: usize) -> Error {
    let kib = bytes.div_ceil(1024);
    let limit = limit.map_or("too low".to_string(), |l| format!("{l} bytes"));
    Error::OutOfResources(format!(
        "the locked-memory limit (RLIMIT_MEMLOCK) is {limit} and this driver pins {bytes} \
         bytes of DMA memory: raise it (`ulimit -l {kib}` or more, in KiB; LimitMEMLOCK= for a \
         systemd service) or run with CAP_IPC_LOCK"
    ))
}

/// A vfio-ioctls error as a refusal that says what to do.
fn vfio_error(e: VfioError, addr: PciAddress, opts: &VirtioNetOptions) -> Error {
    match e {
        VfioError::OpenContainer(io) | VfioError::OpenGroup(io, _)
            if io.raw_os_error() == Some(libc::EBUSY) =>
        {
            busy(addr)
        }
        VfioError::OpenContainer(io) | VfioError::OpenGroup(io, _)
            if io.raw_os_error() == Some(libc::EACCES) =>
        {
            Error::Unsupported(format!(
                "permission denied on {}: run as root, or give this user the group's device node",
                opts.dev_vfio.display()
            ))
        }
        VfioError::GroupGetDeviceFD(ref s) if s.errno() == libc::EBUSY => busy(addr),
        VfioError::GroupViable => {
            let group =
                link_name(&opts.sysfs.join("bus/pci/devices").join(addr.to_string()).join("iommu_group"))
                    .unwrap_or_default();
            not_viable(addr, &group, &group_blockers(&opts.sysfs, &group, addr))
        }
        VfioError::VfioExtension | VfioError::VfioInvalidType => {
            Error::Unsupported("the kernel's VFIO has no Type1v2 IOMMU backend: load vfio_iommu_type1".into())
        }
        VfioError::IommuDmaMap(ref s) if s.errno() == libc::ENOMEM => {
            memlock_error(memlock_limit(), NetLayout::new(opts.rx_depth, opts.tx_depth).len)
        }
        other => Error::Device(format!("{addr}: VFIO: {other}")),
    }
}

fn busy(addr: PciAddress) -> Error {
    Error::Busy(format!(
        "PCI device {addr} is already open (by another process, or another port of this one); \
         close it first"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn the_msix_control_word_is_found_behind_other_capabilities() {
        let mut config = [0u8; 256];
        assert_eq!(msix_control(&config), None, "no capability list");
        config[6] = 0x10; // status: capability list
        config[0x34] = 0x40;
        config[0x40..0x42].copy_from_slice(&[0x09, 0x50]); // vendor capability, next 0x50
        config[0x50..0x54].copy_from_slice(&[0x11, 0x00, 0x03, 0x80]); // MSI-X: enabled, 4 vectors
        assert_eq!(msix_control(&config), Some(0x8003));
        config[0x50] = 0x05; // MSI, not MSI-X; end of the list
        assert_eq!(msix_control(&config), None);
        config[0x51] = 0x40; // a loop ends too
        assert_eq!(msix_control(&config), None);
    }

    /// A fake sysfs and /dev/vfio: device 0000:00:03.0 bound to `driver`, in IOMMU group 5 (if
    /// `group`), with `others` (address, driver) in the same group.
    struct Host {
        root: PathBuf,
        opts: VirtioNetOptions,
    }

    impl Host {
        fn new(name: &str, driver: Option<&str>, group: bool, others: &[(&str, &str)]) -> Host {
            let root = std::env::temp_dir().join(format!("bypass-vfio-{}-{name}", std::process::id()));
            let _ = std::fs::remove_dir_all(&root);
            let sysfs = root.join("sys");
            let dev_vfio = root.join("dev/vfio");
            std::fs::create_dir_all(&dev_vfio).unwrap();
            std::fs::write(dev_vfio.join("vfio"), b"").unwrap();
            std::fs::write(dev_vfio.join("5"), b"").unwrap();
            let groups = sysfs.join("kernel/iommu_groups/5/devices");
            std::fs::create_dir_all(&groups).unwrap();
            let mut devs = vec![("0000:00:03.0", driver)];
            devs.extend(others.iter().map(|(a, d)| (*a, Some(*d))));
            for (a, d) in devs {
                let dev = sysfs.join("bus/pci/devices").join(a);
                std::fs::create_dir_all(&dev).unwrap();
                if let Some(d) = d {
                    let drv = sysfs.join("bus/pci/drivers").join(d);
                    std::fs::create_dir_all(&drv).unwrap();
                    symlink(&drv, dev.join("driver")).unwrap();
                }
                if group {
                    symlink(sysfs.join("kernel/iommu_groups/5"), dev.join("iommu_group")).unwrap();
                    symlink(&dev, groups.join(a)).unwrap();
                }
            }
            let opts = VirtioNetOptions { sysfs, dev_vfio, ..VirtioNetOptions::default() };
            Host { root, opts }
        }

        fn open(&self, addr: &str) -> Error {
            let a = PciAddress::parse(addr).unwrap();
            preflight(a, &self.opts, 4096).unwrap_err()
        }
    }

    impl Drop for Host {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }

    #[test]
    fn a_malformed_or_absent_address_is_refused_with_the_expected_form() {
        let err = VirtioNet::open("00:03").unwrap_err();
        assert!(matches!(&err, Error::InvalidArgument(m) if m.contains("0000:00:03.0")), "{err}");
        let host = Host::new("absent", Some("vfio-pci"), true, &[]);
        let err = host.open("0000:00:09.0");
        assert!(err.to_string().contains("no PCI device 0000:00:09.0"), "{err}");
        assert!(err.to_string().contains("lspci -D"), "{err}");
    }

    #[test]
    fn no_dev_vfio_says_load_vfio_pci_and_enable_an_iommu() {
        let host = Host::new("novfio", Some("vfio-pci"), true, &[]);
        std::fs::remove_file(host.opts.dev_vfio.join("vfio")).unwrap();
        let err = host.open("0000:00:03.0").to_string();
        assert!(err.contains("modprobe vfio-pci") && err.contains("intel-iommu"), "{err}");
    }

    #[test]
    fn a_device_on_another_driver_gets_the_lines_that_bind_it() {
        let host = Host::new("bound", Some("virtio-pci"), true, &[]);
        let err = host.open("0000:00:03.0").to_string();
        assert!(err.contains("bound to virtio-pci, not vfio-pci"), "{err}");
        assert!(err.contains("echo 0000:00:03.0 > /sys/bus/pci/drivers/virtio-pci/unbind"), "{err}");
        assert!(err.contains("echo vfio-pci > /sys/bus/pci/devices/0000:00:03.0/driver_override"), "{err}");
        assert!(err.contains("echo 0000:00:03.0 > /sys/bus/pci/drivers_probe"), "{err}");
        let host = Host::new("unbound", None, true, &[]);
        let err = host.open("0000:00:03.0").to_string();
        assert!(err.contains("bound to no driver") && !err.contains("unbind"), "{err}");
    }

    #[test]
    fn no_iommu_group_says_enable_an_iommu() {
        let host = Host::new("nogroup", Some("vfio-pci"), false, &[]);
        let err = host.open("0000:00:03.0").to_string();
        assert!(err.contains("no IOMMU group") && err.contains("intel_iommu=on"), "{err}");
    }

    #[test]
    fn a_group_with_a_device_on_a_kernel_driver_is_not_viable_and_names_it() {
        let others = [("0000:00:04.0", "e1000e"), ("0000:00:05.0", "vfio-pci")];
        let host = Host::new("viable", Some("vfio-pci"), true, &others);
        let err = host.open("0000:00:03.0").to_string();
        assert!(err.contains("IOMMU group 5 of 0000:00:03.0 is not viable"), "{err}");
        assert!(err.contains("0000:00:04.0 (bound to e1000e)"), "{err}");
        assert!(!err.contains("0000:00:05.0"), "a vfio-pci sibling is fine: {err}");
        let host = Host::new("viable-ok", Some("vfio-pci"), true, &[("0000:00:05.0", "vfio-pci")]);
        let dev = preflight(PciAddress::parse("00:03.0").unwrap(), &host.opts, 4096).unwrap();
        assert!(dev.ends_with("0000:00:03.0"));
    }

    #[test]
    fn too_little_locked_memory_says_how_much_and_how_to_raise_it() {
        let err = memlock_error(Some(65536), 1_200_000).to_string();
        assert!(err.contains("65536 bytes") && err.contains("1200000 bytes"), "{err}");
        assert!(err.contains("ulimit -l 1172"), "{err}");
    }
}
