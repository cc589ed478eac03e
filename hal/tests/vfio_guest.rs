//! The virtio-net driver against a real (QEMU) device, in the project's VFIO guest:
//!
//! ```sh
//! cargo test -p bypass-hal --features vfio --test vfio_guest --no-run   # prints the binary
//! hw-tests/vm/run --vfio target/debug/deps/vfio_guest-<hash>
//! ```
//!
//! `--vfio` boots q35 with an emulated Intel IOMMU and two modern virtio-net NICs on one QEMU hub:
//! NIC A bound to vfio-pci (`BYPASS_VFIO_NIC`), NIC B on the kernel's virtio_net with
//! `BYPASS_VFIO_PEER_IP` and MAC `BYPASS_VFIO_PEER_MAC`. Without those variables (on any other
//! machine) each test says it was skipped and passes.
#![cfg(feature = "vfio")]

use bypass_hal::l2::{L2Port, Mac};
use bypass_hal::vfio::VirtioNet;
use std::time::{Duration, Instant};

struct Guest {
    nic: String,
    peer_ip: [u8; 4],
    peer_mac: Mac,
}

fn guest() -> Option<Guest> {
    let nic = std::env::var("BYPASS_VFIO_NIC").ok()?;
    let ip = std::env::var("BYPASS_VFIO_PEER_IP").expect("BYPASS_VFIO_PEER_IP");
    let mac = std::env::var("BYPASS_VFIO_PEER_MAC").expect("BYPASS_VFIO_PEER_MAC");
    let peer_ip: Vec<u8> = ip.split('.').map(|p| p.parse().expect("an IPv4 address")).collect();
    let peer_mac: Vec<u8> =
        mac.split(':').map(|p| u8::from_str_radix(p, 16).expect("a MAC address")).collect();
    Some(Guest { nic, peer_ip: peer_ip.try_into().unwrap(), peer_mac: peer_mac.try_into().unwrap() })
}

const MY_IP: [u8; 4] = [10, 29, 0, 1];

/// The guest has one VFIO NIC, and a device opens once at a time ("busy: ... already open"):
/// the tests of this binary take it in turn, whatever `--test-threads` says.
static NIC: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn take_nic() -> std::sync::MutexGuard<'static, ()> {
    NIC.lock().unwrap_or_else(|e| e.into_inner())
}

fn arp_request(mac: Mac, target: [u8; 4]) -> Vec<u8> {
    let mut f = Vec::with_capacity(60);
    f.extend_from_slice(&[0xff; 6]);
    f.extend_from_slice(&mac);
    f.extend_from_slice(&[0x08, 0x06]); // ARP
    f.extend_from_slice(&[0, 1, 0x08, 0x00, 6, 4, 0, 1]); // Ethernet/IPv4, request
    f.extend_from_slice(&mac);
    f.extend_from_slice(&MY_IP);
    f.extend_from_slice(&[0; 6]);
    f.extend_from_slice(&target);
    f.resize(60, 0); // the minimum Ethernet frame; the port pads nothing
    f
}

/// The sender MAC of an ARP reply from `ip` to us, if `f` is one.
fn arp_reply_from(f: &[u8], ip: [u8; 4], mac: Mac) -> Option<Mac> {
    let ok = f.len() >= 42
        && f[..6] == mac
        && f[12..14] == [0x08, 0x06]
        && f[20..22] == [0, 2]
        && f[28..32] == ip
        && f[38..42] == MY_IP;
    ok.then(|| f[22..28].try_into().unwrap())
}

#[test]
fn the_kernel_nic_answers_an_arp_request_sent_through_the_driver() {
    let Some(g) = guest() else {
        eprintln!("skipped: BYPASS_VFIO_NIC is unset (run this binary under hw-tests/vm/run --vfio)");
        return;
    };
    let _nic = take_nic();
    let t0 = Instant::now();
    let mut port = VirtioNet::open(&g.nic).unwrap_or_else(|e| panic!("open {}: {e}", g.nic));
    eprintln!("opened {port:?} in {:?}", t0.elapsed());
    assert_eq!(port.mtu(), 1500);
    let mac = port.mac();
    let request = arp_request(mac, g.peer_ip);
    // Bounded: TCG took 3.5-20 ms for the round trip in the trial; allow for a loaded host.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut next_send = Instant::now();
    let mut sent = 0;
    let mut seen = 0;
    let reply = loop {
        assert!(
            Instant::now() < deadline,
            "no ARP reply after {sent} requests, {seen} frames seen; {}",
            port.diagnostics()
        );
        if Instant::now() >= next_send {
            assert_eq!(port.send(&[&request]).unwrap(), 1);
            sent += 1;
            next_send = Instant::now() + Duration::from_millis(500);
        }
        let mut got = None;
        port.recv(16, &mut |f| {
            seen += 1;
            got = got.or(arp_reply_from(f, g.peer_ip, mac));
        })
        .unwrap();
        if let Some(m) = got {
            break m;
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    assert_eq!(reply, g.peer_mac, "the reply comes from NIC B");
    eprintln!("ARP reply after {sent} request(s), {:?} since open", t0.elapsed());
}

/// Waits up to `timeout` for `fd` to become readable; true if it did.
fn readable_within(fd: i32, timeout: Duration) -> bool {
    let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        // SAFETY: one live pollfd; poll writes only its revents.
        let n = unsafe { libc::poll(&mut p, 1, left.as_millis().min(i32::MAX as u128) as i32) };
        if n > 0 {
            return true;
        }
        if n == 0 || Instant::now() >= deadline {
            return false;
        }
    }
}

/// Reads (clears) an eventfd's counter; 0 if it was not signalled.
fn take_eventfd(fd: i32) -> u64 {
    let mut n = 0u64;
    // SAFETY: reads at most 8 bytes into a live u64; the fd is a non-blocking eventfd.
    let r = unsafe { libc::read(fd, (&mut n as *mut u64).cast(), 8) };
    if r == 8 {
        n
    } else {
        0
    }
}

/// The guest's interrupt lines of vfio devices, and the MSI-X state, for a failure message.
fn irq_state(port: &VirtioNet) -> String {
    let lines: Vec<String> = std::fs::read_to_string("/proc/interrupts")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("vfio"))
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    format!(
        "MSI-X control {:?}; {}; /proc/interrupts: {lines:?}",
        port.msix_control().map(|c| format!("{c:#06x}")),
        port.diagnostics()
    )
}

#[test]
fn an_armed_port_wakes_on_its_event_fd_for_the_arp_reply_and_a_disarmed_one_does_not() {
    let Some(g) = guest() else {
        eprintln!("skipped: BYPASS_VFIO_NIC is unset (run this binary under hw-tests/vm/run --vfio)");
        return;
    };
    let _nic = take_nic();
    let mut port = VirtioNet::open(&g.nic).unwrap_or_else(|e| panic!("open {}: {e}", g.nic));
    let fd = port.event_fd().expect("the port has an event fd (interrupts are on by default)");
    let mac = port.mac();
    let request = arp_request(mac, g.peer_ip);
    eprintln!("after open: {}", irq_state(&port));
    while port.recv(64, &mut |_| {}).unwrap() > 0 {}
    assert!(!port.arm().unwrap(), "nothing waits right after open and a drain");
    take_eventfd(fd);

    // Armed: the reply wakes the fd, and is then there to take.
    let t0 = Instant::now();
    assert_eq!(port.send(&[&request]).unwrap(), 1);
    let woke = readable_within(fd, Duration::from_secs(20));
    let waited = t0.elapsed();
    let mut got = None;
    port.recv(16, &mut |f| got = got.or(arp_reply_from(f, g.peer_ip, mac))).unwrap();
    assert!(
        woke,
        "no interrupt within 20 s of the ARP request (reply polled: {got:?}); {}",
        irq_state(&port)
    );
    eprintln!("woken {waited:?} after the request; {}", irq_state(&port));
    assert!(take_eventfd(fd) >= 1);
    assert_eq!(got, Some(g.peer_mac), "the wake-up announced the reply");

    // Disarmed (recv turned interrupts off): a reply comes, found by polling, with no wake-up.
    assert_eq!(port.send(&[&request]).unwrap(), 1);
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut got = None;
    while got.is_none() {
        assert!(Instant::now() < deadline, "no second ARP reply within 20 s; {}", port.diagnostics());
        port.recv(16, &mut |f| got = got.or(arp_reply_from(f, g.peer_ip, mac))).unwrap();
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(take_eventfd(fd), 0, "a disarmed port was not woken; {}", irq_state(&port));
}
