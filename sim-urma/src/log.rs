//! Error reporting to C: `errno`, and log lines to the callback `urma_register_log_func`
//! installed (or stderr), filtered by `urma_log_set_level`.

use std::ffi::{c_char, c_int, CString};
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};

/// `urma_log_cb_t`: `void (*)(int level, char *message)`.
pub type LogCb = unsafe extern "C" fn(c_int, *mut c_char);

/// Syslog levels, as `urma_vlog_level_t`.
pub(crate) const ERR: i32 = 3;
/// Warnings.
pub(crate) const WARNING: i32 = 4;
/// Informational.
pub(crate) const INFO: i32 = 6;

static LEVEL: AtomicI32 = AtomicI32::new(WARNING);
static CALLBACK: AtomicUsize = AtomicUsize::new(0);

pub(crate) fn set_level(level: i32) {
    LEVEL.store(level.clamp(0, 7), Ordering::Relaxed);
}

pub(crate) fn set_callback(cb: Option<LogCb>) {
    CALLBACK.store(cb.map_or(0, |f| f as usize), Ordering::Release);
}

/// Logs `msg` at `level` if the level lets it through.
pub(crate) fn log(level: i32, msg: &str) {
    if level > LEVEL.load(Ordering::Relaxed) {
        return;
    }
    let cb = CALLBACK.load(Ordering::Acquire);
    if cb == 0 {
        eprintln!("liburma (bypass-sim): {msg}");
        return;
    }
    // SAFETY: only `set_callback` stores a non-zero value, and it stores a `LogCb`.
    let f: LogCb = unsafe { std::mem::transmute::<usize, LogCb>(cb) };
    let line = CString::new(format!("liburma (bypass-sim): {msg}\n").replace('\0', " ")).unwrap_or_default();
    // SAFETY: the callback gets a NUL-terminated string that lives for the call, as liburma's
    // own logger passes it.
    unsafe { f(level, line.as_ptr() as *mut c_char) };
}

/// Logs an error.
pub(crate) fn err(msg: &str) {
    log(ERR, msg);
}

/// Sets the calling thread's `errno`.
pub(crate) fn set_errno(e: i32) {
    // SAFETY: `__errno_location` returns the calling thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}
