//! PCI addresses and the virtio-pci capabilities found in a device's config space.

use crate::{Error, Result};
use std::fmt;

/// A PCI function address, `DDDD:BB:DD.F` (the domain may be omitted: `00:03.0`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PciAddress {
    /// Domain (segment).
    pub domain: u16,
    /// Bus.
    pub bus: u8,
    /// Device (0..32).
    pub device: u8,
    /// Function (0..8).
    pub function: u8,
}

impl PciAddress {
    /// Parses `0000:00:03.0` or `00:03.0` (hexadecimal, as `lspci -D` prints it).
    pub fn parse(s: &str) -> Result<PciAddress> {
        let bad = || {
            Error::InvalidArgument(format!(
                "'{s}' is not a PCI address: write it as lspci -D prints it, DDDD:BB:DD.F \
                 (hexadecimal, e.g. 0000:00:03.0)"
            ))
        };
        let (rest, function) = s.rsplit_once('.').ok_or_else(bad)?;
        let parts: Vec<&str> = rest.split(':').collect();
        let (domain, bus, device) = match parts[..] {
            [d, b, v] if d.len() == 4 => (d, b, v),
            [b, v] => ("0000", b, v),
            _ => return Err(bad()),
        };
        let hex = |t: &str, max_len: usize| {
            if t.is_empty() || t.len() > max_len {
                return Err(bad());
            }
            u16::from_str_radix(t, 16).map_err(|_| bad())
        };
        let a = PciAddress {
            domain: hex(domain, 4)?,
            bus: hex(bus, 2)? as u8,
            device: hex(device, 2)? as u8,
            function: hex(function, 1)? as u8,
        };
        if a.device >= 32 || a.function >= 8 {
            return Err(bad());
        }
        Ok(a)
    }
}

impl fmt::Display for PciAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:04x}:{:02x}:{:02x}.{:x}", self.domain, self.bus, self.device, self.function)
    }
}

/// Red Hat's vendor id, which virtio devices use.
pub const VIRTIO_VENDOR: u16 = 0x1af4;
/// virtio-net's modern (1.0+) device id, and the transitional one.
pub const VIRTIO_NET_IDS: [u16; 2] = [0x1041, 0x1000];

/// Where one virtio structure lies: in which BAR, at which offset, how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VirtioRegion {
    /// BAR index (0..6).
    pub bar: u8,
    /// Offset in the BAR.
    pub offset: u32,
    /// Length in bytes.
    pub length: u32,
}

/// The four virtio-pci structures a driver needs (virtio 1.x, 4.1.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VirtioCaps {
    /// Common configuration (`VIRTIO_PCI_CAP_COMMON_CFG`).
    pub common: VirtioRegion,
    /// Notification area (`VIRTIO_PCI_CAP_NOTIFY_CFG`).
    pub notify: VirtioRegion,
    /// `notify_off_multiplier`: a queue's notify address is `notify.offset + queue_notify_off * this`.
    pub notify_multiplier: u32,
    /// ISR status (`VIRTIO_PCI_CAP_ISR_CFG`).
    pub isr: VirtioRegion,
    /// Device-specific configuration (`VIRTIO_PCI_CAP_DEVICE_CFG`).
    pub device: VirtioRegion,
}

fn u16_at(c: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([c[o], c[o + 1]])
}

fn u32_at(c: &[u8], o: usize) -> u32 {
    u32::from_le_bytes([c[o], c[o + 1], c[o + 2], c[o + 3]])
}

/// Checks that config space `config` (at least the first 256 bytes) is a virtio-net device and
/// finds its modern virtio-pci capabilities. The first capability of each type wins.
pub fn parse_virtio_caps(config: &[u8]) -> Result<VirtioCaps> {
    if config.len() < 256 {
        return Err(Error::Device(format!("config space of {} bytes, want 256", config.len())));
    }
    let (vendor, device) = (u16_at(config, 0), u16_at(config, 2));
    if vendor != VIRTIO_VENDOR || !VIRTIO_NET_IDS.contains(&device) {
        return Err(Error::Unsupported(format!(
            "PCI device {vendor:04x}:{device:04x} is not a virtio-net NIC (1af4:1041, or \
             1af4:1000 with modern capabilities); this driver drives only virtio-net"
        )));
    }
    let mut found: [Option<(VirtioRegion, u32)>; 5] = [None; 5];
    if config[6] & 0x10 != 0 {
        let mut p = usize::from(config[0x34] & 0xfc);
        // At most 48 capabilities fit in 192 bytes: a longer walk is a loop.
        for _ in 0..48 {
            if p < 0x40 || p + 16 > 256 {
                break;
            }
            let (id, next) = (config[p], config[p + 1]);
            if id == 0x09 && config[p + 2] >= 16 {
                let cfg_type = config[p + 3];
                let region = VirtioRegion {
                    bar: config[p + 4],
                    offset: u32_at(config, p + 8),
                    length: u32_at(config, p + 12),
                };
                let mult = if cfg_type == 2 && p + 20 <= 256 { u32_at(config, p + 16) } else { 0 };
                if (1..=4).contains(&cfg_type) && region.bar < 6 {
                    found[usize::from(cfg_type)].get_or_insert((region, mult));
                }
            }
            p = usize::from(next & 0xfc);
            if p == 0 {
                break;
            }
        }
    }
    let get = |t: usize, name: &str| {
        found[t].ok_or_else(|| {
            Error::Unsupported(format!(
                "this virtio-net device has no {name} capability: it is a legacy device; start \
                 QEMU with -device virtio-net-pci,disable-legacy=on,iommu_platform=on"
            ))
        })
    };
    let (common, _) = get(1, "common configuration")?;
    let (notify, notify_multiplier) = get(2, "notification")?;
    let (isr, _) = get(3, "ISR")?;
    let (device, _) = get(4, "device configuration")?;
    Ok(VirtioCaps { common, notify, notify_multiplier, isr, device })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pci_addresses_parse_with_or_without_domain_and_refuse_the_rest() {
        let a = PciAddress::parse("0000:00:03.0").unwrap();
        assert_eq!(a, PciAddress { domain: 0, bus: 0, device: 3, function: 0 });
        assert_eq!(PciAddress::parse("1a:1f.7").unwrap().to_string(), "0000:1a:1f.7");
        for bad in ["", "00:03", "0000:00:20.0", "00:03.8", "0:00:03.0", "zz:03.0", "00:03.0.1"] {
            let err = PciAddress::parse(bad).unwrap_err();
            assert!(matches!(&err, Error::InvalidArgument(m) if m.contains("DDDD:BB:DD.F")), "{bad}");
        }
    }

    /// Config space of QEMU's modern virtio-net as seen in the guest: caps in BAR 4 at 0x0
    /// (common), 0x1000 (ISR), 0x2000 (device), 0x3000 (notify, multiplier 4), plus an MSI-X cap.
    pub(crate) fn qemu_config() -> Vec<u8> {
        let mut c = vec![0u8; 256];
        c[0..2].copy_from_slice(&0x1af4u16.to_le_bytes());
        c[2..4].copy_from_slice(&0x1041u16.to_le_bytes());
        c[6] = 0x10;
        c[0x34] = 0x98;
        // MSI-X (id 0x11) first, then the vendor caps.
        c[0x98] = 0x11;
        c[0x99] = 0x84;
        let caps = [
            (0x84, 1u8, 0x0u32, 0x1000u32, 0x70),
            (0x70, 3, 0x1000, 0x1000, 0x5c),
            (0x5c, 4, 0x2000, 0x1000, 0x48),
            (0x48, 2, 0x3000, 0x1000, 0xb0),
        ];
        for (p, t, off, len, next) in caps {
            let p = p as usize;
            c[p] = 0x09;
            c[p + 1] = next;
            c[p + 2] = if t == 2 { 20 } else { 16 };
            c[p + 3] = t;
            c[p + 4] = 4;
            c[p + 8..p + 12].copy_from_slice(&off.to_le_bytes());
            c[p + 12..p + 16].copy_from_slice(&len.to_le_bytes());
            if t == 2 {
                c[p + 16..p + 20].copy_from_slice(&4u32.to_le_bytes());
            }
        }
        // 0xb0: a PCI cfg access cap (type 5), ignored; ends the list.
        c[0xb0] = 0x09;
        c[0xb2] = 20;
        c[0xb3] = 5;
        c
    }

    #[test]
    fn the_capability_walk_finds_qemus_virtio_structures() {
        let caps = parse_virtio_caps(&qemu_config()).unwrap();
        let r = |offset| VirtioRegion { bar: 4, offset, length: 0x1000 };
        assert_eq!(
            caps,
            VirtioCaps {
                common: r(0),
                notify: r(0x3000),
                notify_multiplier: 4,
                isr: r(0x1000),
                device: r(0x2000)
            }
        );
    }

    #[test]
    fn a_legacy_device_a_foreign_device_and_a_looping_list_are_refused() {
        let mut legacy = qemu_config();
        legacy[6] = 0; // no capability list
        let err = parse_virtio_caps(&legacy).unwrap_err();
        assert!(err.to_string().contains("disable-legacy=on"), "{err}");
        let mut e1000e = qemu_config();
        e1000e[0..4].copy_from_slice(&[0x86, 0x80, 0xd3, 0x10]);
        let err = parse_virtio_caps(&e1000e).unwrap_err();
        assert!(err.to_string().contains("8086:10d3 is not a virtio-net"), "{err}");
        let mut looping = qemu_config();
        looping[0x99] = 0x98; // MSI-X points at itself
        assert!(parse_virtio_caps(&looping).is_err());
    }
}
