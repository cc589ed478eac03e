//! An [`L2Port`] on a Linux `AF_PACKET` raw socket: the frames of one network interface (a
//! veth, a tap, a NIC the kernel drives), sent and received whole. It needs `CAP_NET_RAW`.
//!
//! This is the L2 wire without VFIO: the kernel still moves every frame (one system call per
//! batch), so it says nothing about speed; it lets the sim's transport meet a kernel rxe device
//! on a veth pair with no VM. The socket ignores its own outgoing frames
//! (`PACKET_IGNORE_OUTGOING`, Linux 4.20) and offers no eventfd: the L2 wire polls it (every
//! millisecond while the NIC's user sleeps).

use bypass_hal::l2::{L2Port, Mac, ETH_HEADER_LEN};
use bypass_hal::{Error, Result};
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// `PACKET_IGNORE_OUTGOING` (linux/if_packet.h), not in every libc release.
const PACKET_IGNORE_OUTGOING: libc::c_int = 23;
/// Frames one `sendmmsg` takes at most.
const BATCH: usize = 32;

/// A raw socket bound to one interface (see the module docs).
#[derive(Debug)]
pub struct PacketPort {
    fd: OwnedFd,
    ifname: String,
    mac: Mac,
    mtu: usize,
    buf: Vec<u8>,
}

fn ifreq_for(name: &str) -> io::Result<libc::ifreq> {
    // SAFETY: an all-zero ifreq is a valid plain C struct.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes.len() >= req.ifr_name.len() || bytes.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{name:?} is no interface name (1 to 15 bytes, no NUL)"),
        ));
    }
    for (d, &s) in req.ifr_name.iter_mut().zip(bytes) {
        *d = s as libc::c_char;
    }
    Ok(req)
}

impl PacketPort {
    /// Opens a raw socket on interface `ifname`. Errors say what to do: no such interface, no
    /// `CAP_NET_RAW`.
    pub fn open(ifname: &str) -> io::Result<PacketPort> {
        let mut req = ifreq_for(ifname)?;
        let cname =
            CString::new(ifname).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in name"))?;
        // SAFETY: if_nametoindex reads the NUL-terminated string.
        let index = unsafe { libc::if_nametoindex(cname.as_ptr()) };
        if index == 0 {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("no network interface {ifname:?} on this host (see `ip link`)"),
            ));
        }
        let proto = (libc::ETH_P_ALL as u16).to_be();
        // SAFETY: socket has no memory-safety preconditions; the result is checked.
        let raw = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                proto.into(),
            )
        };
        if raw < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::PermissionDenied {
                return Err(io::Error::new(
                    e.kind(),
                    format!(
                        "an AF_PACKET socket on {ifname} needs CAP_NET_RAW: run as root, or grant it with \
                         `setcap cap_net_raw+ep <binary>` ({e})"
                    ),
                ));
            }
            return Err(io::Error::new(e.kind(), format!("cannot open an AF_PACKET socket: {e}")));
        }
        // SAFETY: `raw` is a fresh descriptor nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: an all-zero sockaddr_ll is a valid plain C struct; we fill the fields bind reads.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = proto;
        sll.sll_ifindex = index as i32;
        // SAFETY: bind reads `size_of::<sockaddr_ll>()` bytes from a live sockaddr_ll.
        let r = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&sll as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(
                e.kind(),
                format!("cannot bind an AF_PACKET socket to {ifname}: {e}"),
            ));
        }
        let one: libc::c_int = 1;
        // SAFETY: setsockopt reads a live c_int. Failing (before Linux 4.20) only means the
        // socket also sees its own frames, which the L2 wire drops as not addressed to it.
        unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_PACKET,
                PACKET_IGNORE_OUTGOING,
                (&one as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as u32,
            )
        };
        // SAFETY: SIOCGIFHWADDR and SIOCGIFMTU read the name and write the union of a live ifreq.
        let mac = unsafe {
            if libc::ioctl(fd.as_raw_fd(), libc::SIOCGIFHWADDR, &mut req) < 0 {
                return Err(io::Error::last_os_error());
            }
            let sa = req.ifr_ifru.ifru_hwaddr.sa_data;
            [sa[0] as u8, sa[1] as u8, sa[2] as u8, sa[3] as u8, sa[4] as u8, sa[5] as u8]
        };
        let mut req = ifreq_for(ifname)?;
        // SAFETY: as above.
        let mtu = unsafe {
            if libc::ioctl(fd.as_raw_fd(), libc::SIOCGIFMTU, &mut req) < 0 {
                return Err(io::Error::last_os_error());
            }
            req.ifr_ifru.ifru_mtu as usize
        };
        Ok(PacketPort { fd, ifname: ifname.to_owned(), mac, mtu, buf: vec![0; ETH_HEADER_LEN + mtu + 64] })
    }

    /// The interface's name.
    pub fn ifname(&self) -> &str {
        &self.ifname
    }
}

impl L2Port for PacketPort {
    fn mac(&self) -> Mac {
        self.mac
    }

    fn mtu(&self) -> usize {
        self.mtu
    }

    fn send(&mut self, frames: &[&[u8]]) -> Result<usize> {
        for f in frames {
            if f.len() < ETH_HEADER_LEN || f.len() - ETH_HEADER_LEN > self.mtu {
                return Err(Error::InvalidArgument(format!(
                    "a {}-byte frame does not fit {}: frames are 14 to {} bytes (MTU {})",
                    f.len(),
                    self.ifname,
                    ETH_HEADER_LEN + self.mtu,
                    self.mtu
                )));
            }
        }
        let mut done = 0;
        while done < frames.len() {
            let n = (frames.len() - done).min(BATCH);
            let mut iovs = [libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; BATCH];
            // SAFETY: an all-zero mmsghdr is a valid (empty) plain C struct.
            let mut msgs: [libc::mmsghdr; BATCH] = unsafe { std::mem::zeroed() };
            for i in 0..n {
                let f = frames[done + i];
                iovs[i] = libc::iovec { iov_base: f.as_ptr() as *mut libc::c_void, iov_len: f.len() };
                msgs[i].msg_hdr.msg_iov = &mut iovs[i];
                msgs[i].msg_hdr.msg_iovlen = 1;
            }
            // SAFETY: msgs[..n] point at iovecs of this frame describing the caller's frames,
            // which the kernel only reads; the socket is bound, so no address is needed.
            let r = unsafe {
                libc::sendmmsg(self.fd.as_raw_fd(), msgs.as_mut_ptr(), n as u32, libc::MSG_DONTWAIT)
            };
            if r > 0 {
                done += r as usize;
                continue;
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => continue,
                // The interface's queue is full: the caller keeps the rest.
                io::ErrorKind::WouldBlock => break,
                _ if e.raw_os_error() == Some(libc::ENOBUFS) => break,
                _ => return Err(Error::Device(format!("AF_PACKET send on {}: {e}", self.ifname))),
            }
        }
        Ok(done)
    }

    fn recv(&mut self, max: usize, each: &mut dyn FnMut(&[u8])) -> Result<usize> {
        let mut n = 0;
        while n < max {
            // SAFETY: recv writes at most `buf.len()` bytes into the live buffer.
            let r = unsafe {
                libc::recv(
                    self.fd.as_raw_fd(),
                    self.buf.as_mut_ptr().cast(),
                    self.buf.len(),
                    libc::MSG_DONTWAIT | libc::MSG_TRUNC,
                )
            };
            if r < 0 {
                let e = io::Error::last_os_error();
                match e.kind() {
                    io::ErrorKind::Interrupted => continue,
                    io::ErrorKind::WouldBlock => break,
                    _ => return Err(Error::Device(format!("AF_PACKET recv on {}: {e}", self.ifname))),
                }
            }
            let len = r as usize;
            if len > self.buf.len() {
                continue; // longer than the MTU (a GRO'd or offloaded frame): not one of ours
            }
            each(&self.buf[..len]);
            n += 1;
        }
        Ok(n)
    }
}
