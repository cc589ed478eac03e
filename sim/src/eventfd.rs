//! A Linux eventfd: the completion channel's file descriptor for event mode.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// A non-blocking eventfd counter.
#[derive(Debug)]
pub(crate) struct EventFd(OwnedFd);

impl EventFd {
    pub(crate) fn new() -> io::Result<Self> {
        // SAFETY: eventfd has no memory-safety preconditions; we check the result.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        Ok(EventFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Adds one event. A full counter (2^64 - 2 pending events) cannot happen in practice and
    /// would only mean the waiter is already woken, so the result is ignored.
    pub(crate) fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our own descriptor.
        let _ = unsafe { libc::write(self.0.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Takes all pending events; 0 when there were none.
    pub(crate) fn drain(&self) -> io::Result<u64> {
        let mut n: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64 from our own descriptor.
        let r = unsafe { libc::read(self.0.as_raw_fd(), (&mut n as *mut u64).cast(), 8) };
        if r == 8 {
            return Ok(n);
        }
        let err = io::Error::last_os_error();
        if err.kind() == io::ErrorKind::WouldBlock {
            Ok(0)
        } else {
            Err(err)
        }
    }

    pub(crate) fn raw(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}
