//! The logger: `OckRpcSetExternalLogger` (and its alias `Hcom4dbSetLogFunc`) installs the
//! caller's sink; by default lines go to stdout. Levels 0..3 are debug, info, warn, error. The
//! default sink prints info and above; `BYPASS_CAPI_LOG_LEVEL=0..3` changes that.

use crate::types::OckRpcLogHandler;
use std::ffi::{c_int, CString};
use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

/// Debug.
pub const DEBUG: c_int = 0;
/// Info.
pub const INFO: c_int = 1;
/// Warning.
pub const WARN: c_int = 2;
/// Error.
pub const ERROR: c_int = 3;

/// The external sink as a function address (0: the default, stdout).
static SINK: AtomicUsize = AtomicUsize::new(0);

/// Installs `h` (NULL: back to stdout).
pub fn set(h: OckRpcLogHandler) {
    SINK.store(h.map_or(0, |f| f as usize), Ordering::Release);
}

fn default_level() -> c_int {
    static LEVEL: OnceLock<c_int> = OnceLock::new();
    *LEVEL.get_or_init(|| {
        std::env::var("BYPASS_CAPI_LOG_LEVEL").ok().and_then(|v| v.trim().parse().ok()).unwrap_or(INFO)
    })
}

/// Logs `msg` at `level`.
pub fn log(level: c_int, msg: &str) {
    let sink = SINK.load(Ordering::Acquire);
    if sink == 0 {
        if level >= default_level() {
            let name = ["DEBUG", "INFO", "WARN", "ERROR"].get(level as usize).copied().unwrap_or("?");
            let _ = writeln!(std::io::stdout().lock(), "[hcom4db {name}] {msg}");
        }
        return;
    }
    let text = CString::new(msg.replace('\0', "\\0")).unwrap_or_default();
    // SAFETY: `sink` is the address of an `OckRpcLogHandler` the caller installed with
    // OckRpcSetExternalLogger (never anything else is stored); `text` lives across the call.
    unsafe {
        let f: unsafe extern "C" fn(c_int, *const std::ffi::c_char) = std::mem::transmute(sink);
        f(level, text.as_ptr());
    }
}

/// Logs a formatted line: `log!(level, "...", args)`.
#[macro_export]
macro_rules! log {
    ($level:expr, $($arg:tt)*) => {
        $crate::log::log($level, &format!($($arg)*))
    };
}
