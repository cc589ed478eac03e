//! # guard: a truncated segment is an error on its connections, not a SIGBUS
//!
//! A segment is a file under `/dev/shm` that any process of the user may truncate (a careless
//! `truncate -s 0`, a hostile peer, or a full tmpfs that cannot back a page). Touching a mapped
//! page that no longer lies inside the file raises SIGBUS, whose default action kills the
//! process, with every connection of every NIC in it. Checking the file's size before each access
//! cannot prevent that (the file can shrink between the check and the access) and would put a
//! system call on the data path; [`Segment::open`](super::Segment::open) checks it once, so a
//! segment that is already short is refused with its sizes.
//!
//! What real systems do: a Wayland compositor maps its clients' shared-memory buffers and must
//! survive a client that shrinks one; libwayland-server installs a SIGBUS handler that, for a
//! fault inside such a buffer, maps private zero pages over it (`mmap` with `MAP_FIXED`), marks
//! the client as failed and returns, so the faulting access completes on the zero pages. (With
//! memfd seals, `F_SEAL_SHRINK`, a sender can promise never to shrink; our segments are named
//! `/dev/shm` files, on which seals cannot be set.) This module does the same for segments:
//!
//! - every mapped segment (ours and peers') is registered in a fixed table of address ranges that
//!   the handler reads with atomics only;
//! - the first registration installs the handler, process-wide, keeping the one it replaces;
//! - a SIGBUS inside a registered range replaces that whole mapping with private zero pages,
//!   marks it broken ([`Registration::broken`]) and writes one line to stderr; a zeroed segment
//!   carries no frames, so the connections through it fail by their transport's retry limit, and
//!   a new connection re-opens the file and is refused with its size;
//! - a SIGBUS anywhere else goes to the handler installed before ours, or (none) to the default
//!   action, which kills the process as before.
//!
//! The handler calls only `mmap`, `write` and `sigaction` and reads atomics; it allocates nothing
//! and takes no lock.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::OnceLock;

/// Segments one process can have guarded at once (its NICs and the peers' it sends to). A
/// segment beyond it is mapped unguarded, as before this module.
const SLOTS: usize = 1024;

struct Entry {
    start: AtomicUsize,
    len: AtomicUsize,
    broken: AtomicBool,
}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: Entry =
    Entry { start: AtomicUsize::new(0), len: AtomicUsize::new(0), broken: AtomicBool::new(false) };

static TABLE: [Entry; SLOTS] = [EMPTY; SLOTS];

/// The SIGBUS action in place before ours (set once, before the handler is installed).
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();

/// A registered mapping; dropping it unregisters the range (before the mapping goes away).
#[derive(Debug)]
pub(crate) struct Registration {
    slot: usize,
}

impl Registration {
    /// Whether a SIGBUS inside the mapping replaced it with zero pages: the file was truncated.
    pub(crate) fn broken(&self) -> bool {
        TABLE[self.slot].broken.load(Ordering::Acquire)
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let e = &TABLE[self.slot];
        e.len.store(0, Ordering::Release);
        e.broken.store(false, Ordering::Relaxed);
        e.start.store(0, Ordering::Release);
    }
}

/// Registers the mapping `[start, start + len)`; `None` if the table is full or the handler
/// could not be installed (the mapping is then unguarded).
pub(crate) fn register(start: *mut u8, len: usize) -> Option<Registration> {
    if start.is_null() || len == 0 || !install() {
        return None;
    }
    let start = start as usize;
    for (slot, e) in TABLE.iter().enumerate() {
        if e.start.compare_exchange(0, start, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
            e.broken.store(false, Ordering::Relaxed);
            e.len.store(len, Ordering::Release);
            return Some(Registration { slot });
        }
    }
    None
}

/// Installs the handler once; whether it is in place.
fn install() -> bool {
    static INSTALLED: OnceLock<bool> = OnceLock::new();
    *INSTALLED.get_or_init(|| {
        // SAFETY: zeroed `sigaction` structs are valid (empty mask, no flags); sigaction(2) reads
        // `act` and writes `old`, both live locals; the handler has the SA_SIGINFO signature.
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = on_sigbus as extern "C" fn(c_int, *mut libc::siginfo_t, *mut c_void) as usize;
            act.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut act.sa_mask);
            // Read the current action first, so PREVIOUS is set before our handler can run.
            if libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut old) != 0 {
                return false;
            }
            let _ = PREVIOUS.set(old);
            libc::sigaction(libc::SIGBUS, &act, std::ptr::null_mut()) == 0
        }
    })
}

extern "C" fn on_sigbus(sig: c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    // SAFETY: the kernel passes a valid siginfo for a SA_SIGINFO handler.
    let addr = unsafe { (*info).si_addr() } as usize;
    for e in TABLE.iter() {
        let start = e.start.load(Ordering::Acquire);
        let len = e.len.load(Ordering::Acquire);
        if start == 0 || addr < start || addr - start >= len {
            continue;
        }
        // SAFETY: `[start, start + len)` is a live mapping of a segment (registered until just
        // before it is unmapped); replacing it with private anonymous pages of the same size
        // keeps every reference into it valid, now reading zeros.
        let p = unsafe {
            libc::mmap(
                start as *mut c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            break;
        }
        if !e.broken.swap(true, Ordering::AcqRel) {
            const MSG: &[u8] = b"bypass-sim: a shared-memory segment (/dev/shm/bypass-sim.*) was truncated \
                under this process; its connections fail and new ones are refused\n";
            // SAFETY: write(2) is async-signal-safe; MSG is a static buffer.
            let _ = unsafe { libc::write(2, MSG.as_ptr().cast(), MSG.len()) };
        }
        return;
    }
    chain(sig, info, ctx);
}

/// Hands a SIGBUS that is not ours to the action in place before ours.
fn chain(sig: c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    let prev = PREVIOUS.get().map_or(libc::SIG_DFL, |p| p.sa_sigaction);
    let flags = PREVIOUS.get().map_or(0, |p| p.sa_flags);
    if prev == libc::SIG_DFL || prev == libc::SIG_IGN {
        // Back to the default action: returning re-runs the faulting access, which now kills the
        // process as it would have without us (ignoring a fault would loop forever).
        // SAFETY: signal(2) with SIG_DFL is async-signal-safe.
        unsafe { libc::signal(sig, libc::SIG_DFL) };
        return;
    }
    if flags & libc::SA_SIGINFO != 0 {
        // SAFETY: the previous action was installed with SA_SIGINFO: a three-argument handler.
        let f: extern "C" fn(c_int, *mut libc::siginfo_t, *mut c_void) = unsafe { std::mem::transmute(prev) };
        f(sig, info, ctx);
    } else {
        // SAFETY: a handler installed without SA_SIGINFO takes the signal number only.
        let f: extern "C" fn(c_int) = unsafe { std::mem::transmute(prev) };
        f(sig);
    }
}
