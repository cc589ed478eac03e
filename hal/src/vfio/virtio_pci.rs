//! The modern virtio-pci transport: common configuration registers, feature negotiation, queue
//! setup (virtio 1.x, 4.1.4.3). Every register is read and written at its own width through a
//! [`Bar`]; 64-bit queue addresses as two 32-bit halves, low first (4.1.3.1).

use super::mmio::Bar;
use crate::{Error, Result};

/// Device status bits (2.1).
pub mod status {
    /// The guest has found the device.
    pub const ACKNOWLEDGE: u8 = 1;
    /// The guest knows how to drive it.
    pub const DRIVER: u8 = 2;
    /// The driver is ready.
    pub const DRIVER_OK: u8 = 4;
    /// Feature negotiation is complete.
    pub const FEATURES_OK: u8 = 8;
    /// The device hit an error and needs a reset.
    pub const DEVICE_NEEDS_RESET: u8 = 64;
    /// The driver gave up.
    pub const FAILED: u8 = 128;
}

/// Feature bits this driver knows.
pub mod feature {
    /// `VIRTIO_NET_F_MTU`: the device reports its MTU.
    pub const NET_MTU: u64 = 1 << 3;
    /// `VIRTIO_NET_F_MAC`: the device has a MAC address.
    pub const NET_MAC: u64 = 1 << 5;
    /// `VIRTIO_RING_F_EVENT_IDX`.
    pub const RING_EVENT_IDX: u64 = 1 << 29;
    /// `VIRTIO_F_VERSION_1`: a modern device.
    pub const VERSION_1: u64 = 1 << 32;
    /// `VIRTIO_F_ACCESS_PLATFORM`: the device's DMA goes through the IOMMU.
    pub const ACCESS_PLATFORM: u64 = 1 << 33;
}

/// The features this driver accepts out of those `offered`, or why it refuses the device.
/// Required: `VERSION_1` and `ACCESS_PLATFORM` (without it the device would take our IOVAs as
/// physical addresses). Taken if offered: `MAC`, `MTU`, `EVENT_IDX`. Everything else (checksum
/// and segmentation offloads, mergeable buffers, control queue, multiqueue…) is declined.
pub fn negotiate(offered: u64) -> Result<u64> {
    use feature::*;
    if offered & VERSION_1 == 0 {
        return Err(Error::Unsupported(
            "the device does not offer VIRTIO_F_VERSION_1: it is a legacy virtio device; start \
             QEMU with -device virtio-net-pci,disable-legacy=on,iommu_platform=on"
                .into(),
        ));
    }
    if offered & ACCESS_PLATFORM == 0 {
        return Err(Error::Unsupported(
            "the device does not offer VIRTIO_F_ACCESS_PLATFORM: its DMA would bypass the IOMMU \
             and take this driver's IO addresses as physical ones; start QEMU with \
             -device virtio-net-pci,...,iommu_platform=on"
                .into(),
        ));
    }
    Ok(offered & (VERSION_1 | ACCESS_PLATFORM | NET_MAC | NET_MTU | RING_EVENT_IDX))
}

// Common configuration offsets (4.1.4.3).
const DEVICE_FEATURE_SELECT: usize = 0x00;
const DEVICE_FEATURE: usize = 0x04;
const DRIVER_FEATURE_SELECT: usize = 0x08;
const DRIVER_FEATURE: usize = 0x0c;
const MSIX_CONFIG: usize = 0x10;
const NUM_QUEUES: usize = 0x12;
const DEVICE_STATUS: usize = 0x14;
const CONFIG_GENERATION: usize = 0x15;
const QUEUE_SELECT: usize = 0x16;
const QUEUE_SIZE: usize = 0x18;
const QUEUE_MSIX_VECTOR: usize = 0x1a;
const QUEUE_ENABLE: usize = 0x1c;
const QUEUE_NOTIFY_OFF: usize = 0x1e;
const QUEUE_DESC: usize = 0x20;
const QUEUE_DRIVER: usize = 0x28;
const QUEUE_DEVICE: usize = 0x30;
/// `VIRTIO_MSI_NO_VECTOR`.
pub const NO_VECTOR: u16 = 0xffff;

/// The common configuration structure at `base` in a BAR.
#[derive(Debug, Clone, Copy)]
pub struct CommonCfg<'a> {
    bar: &'a Bar,
    base: usize,
}

impl<'a> CommonCfg<'a> {
    /// The structure at `base` of `bar`.
    pub fn new(bar: &'a Bar, base: usize) -> CommonCfg<'a> {
        CommonCfg { bar, base }
    }

    /// Device status.
    pub fn status(&self) -> u8 {
        self.bar.read8(self.base + DEVICE_STATUS)
    }

    /// Sets the device status.
    pub fn set_status(&self, s: u8) {
        self.bar.write8(self.base + DEVICE_STATUS, s)
    }

    /// Config generation (changes when the device configuration changes).
    pub fn config_generation(&self) -> u8 {
        self.bar.read8(self.base + CONFIG_GENERATION)
    }

    /// Resets the device and waits (a bounded number of reads) until it reads back 0.
    pub fn reset(&self) -> Result<()> {
        self.set_status(0);
        for _ in 0..100_000 {
            if self.status() == 0 {
                return Ok(());
            }
            std::hint::spin_loop();
        }
        Err(Error::Device("the virtio device did not complete its reset".into()))
    }

    /// The 64 feature bits the device offers.
    pub fn device_features(&self) -> u64 {
        self.bar.write32(self.base + DEVICE_FEATURE_SELECT, 0);
        let lo = self.bar.read32(self.base + DEVICE_FEATURE);
        self.bar.write32(self.base + DEVICE_FEATURE_SELECT, 1);
        let hi = self.bar.read32(self.base + DEVICE_FEATURE);
        u64::from(lo) | u64::from(hi) << 32
    }

    /// Writes the features the driver accepts.
    pub fn set_driver_features(&self, f: u64) {
        self.bar.write32(self.base + DRIVER_FEATURE_SELECT, 0);
        self.bar.write32(self.base + DRIVER_FEATURE, f as u32);
        self.bar.write32(self.base + DRIVER_FEATURE_SELECT, 1);
        self.bar.write32(self.base + DRIVER_FEATURE, (f >> 32) as u32);
    }

    /// Number of queues the device has.
    pub fn num_queues(&self) -> u16 {
        self.bar.read16(self.base + NUM_QUEUES)
    }

    /// Routes configuration-change interrupts to MSI-X vector `v` ([`NO_VECTOR`]: none) and
    /// returns what the device kept: it answers [`NO_VECTOR`] to a vector it refuses.
    pub fn set_config_vector(&self, v: u16) -> u16 {
        self.bar.write16(self.base + MSIX_CONFIG, v);
        self.bar.read16(self.base + MSIX_CONFIG)
    }

    /// Routes the selected queue's interrupts to MSI-X vector `v` ([`NO_VECTOR`]: none) and
    /// returns what the device kept: it answers [`NO_VECTOR`] to a vector it refuses (one beyond
    /// its MSI-X table, or while MSI-X is off at the PCI level).
    pub fn set_queue_vector(&self, v: u16) -> u16 {
        self.bar.write16(self.base + QUEUE_MSIX_VECTOR, v);
        self.bar.read16(self.base + QUEUE_MSIX_VECTOR)
    }

    /// Selects queue `q` for the queue registers below; returns its maximum size (0: absent).
    pub fn select(&self, q: u16) -> u16 {
        self.bar.write16(self.base + QUEUE_SELECT, q);
        self.bar.read16(self.base + QUEUE_SIZE)
    }

    /// Sets up the selected queue: its size and the three parts' device addresses; returns its
    /// `queue_notify_off`. The queue is not enabled yet; its vector is set apart
    /// ([`set_queue_vector`](Self::set_queue_vector)).
    pub fn setup_queue(&self, size: u16, desc: u64, driver: u64, device: u64) -> u16 {
        let b = self.base;
        self.bar.write16(b + QUEUE_SIZE, size);
        for (off, addr) in [(QUEUE_DESC, desc), (QUEUE_DRIVER, driver), (QUEUE_DEVICE, device)] {
            self.bar.write32(b + off, addr as u32);
            self.bar.write32(b + off + 4, (addr >> 32) as u32);
        }
        self.bar.read16(b + QUEUE_NOTIFY_OFF)
    }

    /// Enables the selected queue.
    pub fn enable_queue(&self) {
        self.bar.write16(self.base + QUEUE_ENABLE, 1)
    }
}

#[cfg(test)]
mod tests {
    use super::feature::*;
    use super::*;

    #[test]
    fn negotiation_takes_what_the_driver_implements_and_refuses_unsafe_devices() {
        // QEMU's virtio-net with iommu_platform=on offers much more (offloads, ctrl vq, ...).
        let qemu = VERSION_1 | ACCESS_PLATFORM | NET_MAC | NET_MTU | RING_EVENT_IDX | 0x07ff_ffc7;
        assert_eq!(
            negotiate(qemu).unwrap(),
            VERSION_1 | ACCESS_PLATFORM | NET_MAC | NET_MTU | RING_EVENT_IDX
        );
        assert_eq!(negotiate(VERSION_1 | ACCESS_PLATFORM).unwrap(), VERSION_1 | ACCESS_PLATFORM);
        let legacy = negotiate(NET_MAC).unwrap_err();
        assert!(legacy.to_string().contains("disable-legacy=on"), "{legacy}");
        let no_iommu = negotiate(VERSION_1 | NET_MAC).unwrap_err();
        assert!(no_iommu.to_string().contains("iommu_platform=on"), "{no_iommu}");
    }
}
