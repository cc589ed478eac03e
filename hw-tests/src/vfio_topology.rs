//! The VFIO topology of `hw-tests/vm/run --vfio` as a test finds it: NIC A on vfio-pci for the
//! userspace driver, NIC B under the kernel (docs/vfio.md, hw-tests/vm/README.md).

use std::net::Ipv4Addr;

/// Where the two NICs are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VfioTopology {
    /// NIC A's PCI address (`BYPASS_VFIO_NIC`), bound to vfio-pci.
    pub nic: String,
    /// NIC B's kernel netdev, found by its MAC (`BYPASS_VFIO_PEER_MAC`).
    pub netdev: String,
    /// NIC B's address (`BYPASS_VFIO_PEER_IP`, 10.29.0.2/24).
    pub peer_ip: Ipv4Addr,
}

impl VfioTopology {
    /// The VFIO NIC's address on NIC B's subnet, for `vfio:<nic>,ip=…/24`.
    pub const OUR_IP: &'static str = "10.29.0.1";

    /// The topology, or `None` (after printing why `test` skips) outside `--vfio`. Panics if
    /// `BYPASS_VFIO_NIC` is set but the rest of the topology is not there.
    pub fn from_env(test: &str) -> Option<Self> {
        let Ok(nic) = std::env::var("BYPASS_VFIO_NIC") else {
            crate::skip(test, "BYPASS_VFIO_NIC is unset (run it under hw-tests/vm/run --vfio)");
            return None;
        };
        let mac = std::env::var("BYPASS_VFIO_PEER_MAC").expect("BYPASS_VFIO_PEER_MAC with BYPASS_VFIO_NIC");
        let peer_ip = std::env::var("BYPASS_VFIO_PEER_IP").expect("BYPASS_VFIO_PEER_IP with BYPASS_VFIO_NIC");
        let peer_ip: Ipv4Addr = peer_ip.parse().expect("BYPASS_VFIO_PEER_IP is an IPv4 address");
        let netdev = std::fs::read_dir("/sys/class/net")
            .expect("/sys/class/net")
            .filter_map(Result::ok)
            .find(|e| {
                std::fs::read_to_string(e.path().join("address"))
                    .is_ok_and(|a| a.trim().eq_ignore_ascii_case(&mac))
            })
            .unwrap_or_else(|| panic!("no kernel netdev has NIC B's MAC {mac}"))
            .file_name()
            .to_string_lossy()
            .into_owned();
        Some(VfioTopology { nic, netdev, peer_ip })
    }

    /// The `vfio:` backend string of NIC A at [`OUR_IP`](Self::OUR_IP)/24.
    pub fn backend(&self) -> String {
        format!("vfio:{},ip={}/24", self.nic, Self::OUR_IP)
    }
}
