//! Every raw system call the stack makes, each behind a safe function: epoll (the control
//! loop), eventfd (waking a sleeping worker or loop), poll(2) (a worker's and a server's
//! accept loop's sleep), a one-byte `MSG_PEEK` recv (a monitor's look at a control stream) and
//! CPU affinity. The rest of the crate holds no `unsafe` for system calls.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

pub(crate) use libc::{epoll_event, pollfd};

/// Number of CPUs a thread can be pinned to (the size of the affinity set).
pub(crate) const MAX_CPUS: usize = 8 * std::mem::size_of::<libc::cpu_set_t>();

/// A new epoll instance (close-on-exec).
pub(crate) fn epoll_create() -> std::io::Result<OwnedFd> {
    // SAFETY: epoll_create1 takes no pointers; the flag is valid.
    let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by epoll_create1, is open, and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `epoll_ctl(op)` of `fd` on `epoll`, watching readability and peer hang-up, reported with
/// `key`. A stale `fd` is refused by the kernel (EBADF), never undefined.
pub(crate) fn epoll_ctl(epoll: &OwnedFd, op: libc::c_int, fd: RawFd, key: u64) -> std::io::Result<()> {
    let mut ev = libc::epoll_event { events: (libc::EPOLLIN | libc::EPOLLRDHUP) as u32, u64: key };
    // SAFETY: `ev` is a valid epoll_event for the call; the epoll fd is open (borrowed from an
    // OwnedFd) and the kernel checks `fd`.
    let rc = unsafe { libc::epoll_ctl(epoll.as_raw_fd(), op, fd, &mut ev) };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Waits on `epoll` for up to `timeout_ms` (-1: forever), filling `events`; the number filled.
pub(crate) fn epoll_wait(
    epoll: &OwnedFd,
    events: &mut [epoll_event],
    timeout_ms: libc::c_int,
) -> std::io::Result<usize> {
    let len = events.len().min(libc::c_int::MAX as usize) as libc::c_int;
    // SAFETY: `events` is a valid, writable array of at least `len` epoll_event structs.
    let n = unsafe { libc::epoll_wait(epoll.as_raw_fd(), events.as_mut_ptr(), len, timeout_ms) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// poll(2) of `fds` for up to `timeout_ms`: its return value as is (negative on an error, then
/// in `std::io::Error::last_os_error()`).
pub(crate) fn poll(fds: &mut [pollfd], timeout_ms: libc::c_int) -> libc::c_int {
    // SAFETY: `fds` is a valid array of `fds.len()` pollfd structs for the whole call.
    unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) }
}

/// Pins the calling thread to `cpu`.
pub(crate) fn pin_current_thread(cpu: usize) -> std::io::Result<()> {
    if cpu >= MAX_CPUS {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("no CPU {cpu}")));
    }
    // SAFETY: cpu_set_t is plain data; all-zero is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` is within the set (checked above).
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: pid 0 is the calling thread; `set` is a valid cpu_set_t of the size passed.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// A non-blocking eventfd a worker or the control loop sleeps on besides its other fds.
pub(crate) struct WakeFd(OwnedFd);

impl WakeFd {
    pub(crate) fn new() -> std::io::Result<Self> {
        // SAFETY: eventfd takes no pointers; the flags are valid.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by eventfd, is open, and nothing else owns it.
        Ok(WakeFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    pub(crate) fn raw(&self) -> RawFd {
        self.0.as_raw_fd()
    }

    pub(crate) fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to an eventfd we own. A full counter (EAGAIN)
        // already means "wake up".
        let _ = unsafe { libc::write(self.raw(), (&one as *const u64).cast(), 8) };
    }

    pub(crate) fn clear(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64 from a non-blocking eventfd we own.
        let _ = unsafe { libc::read(self.raw(), (&mut v as *mut u64).cast(), 8) };
    }
}
