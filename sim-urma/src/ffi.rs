//! The rules every exported function follows: no panic crosses the boundary, and every failure is
//! logged with what to do and returned the way liburma returns it (a status, NULL plus `errno`, or
//! -1 plus `errno`).

use crate::log;
use bypass_urma_abi::status::{UrmaStatus, URMA_EAGAIN, URMA_EINVAL, URMA_ENOMEM, URMA_FAIL};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Why a call failed: the code it returns (a status, or the `errno` of a NULL / -1 return) and
/// the message logged.
#[derive(Debug)]
pub(crate) struct Fail {
    pub code: i32,
    pub msg: String,
}

/// Shorthand for the result of an entry point's body.
pub(crate) type Res<T> = Result<T, Fail>;

/// A bad argument (EINVAL / `URMA_EINVAL`).
pub(crate) fn inval(msg: impl Into<String>) -> Fail {
    Fail { code: URMA_EINVAL, msg: msg.into() }
}

/// A failure with an explicit code.
pub(crate) fn fail(code: i32, msg: impl Into<String>) -> Fail {
    Fail { code, msg: msg.into() }
}

impl From<bypass_hal::Error> for Fail {
    fn from(e: bypass_hal::Error) -> Fail {
        use bypass_hal::Error as E;
        let code = match &e {
            E::WouldBlock { .. } => URMA_EAGAIN,
            E::InvalidArgument(_) | E::BadState { .. } | E::Unsupported(_) => URMA_EINVAL,
            E::OutOfResources(_) => URMA_ENOMEM,
            _ => URMA_FAIL,
        };
        Fail { code, msg: e.to_string() }
    }
}

fn report(name: &str, f: &Fail) {
    log::err(&format!("{name}: {}", f.msg));
}

fn panicked(name: &str) -> Fail {
    fail(
        URMA_FAIL,
        format!("{name}: internal error (a panic was caught at the C boundary); please report it"),
    )
}

/// Runs an entry point that returns `urma_status_t`.
pub(crate) fn status(name: &str, body: impl FnOnce() -> Res<()>) -> UrmaStatus {
    let r = catch_unwind(AssertUnwindSafe(body)).unwrap_or_else(|_| Err(panicked(name)));
    match r {
        Ok(()) => 0,
        Err(f) => {
            // URMA_EEXIST from bind is success to its callers (perftest): not an error line.
            if f.code == bypass_urma_abi::status::URMA_EEXIST {
                log::log(log::INFO, &format!("{name}: {}", f.msg));
            } else {
                report(name, &f);
            }
            f.code
        }
    }
}

/// Runs an entry point that returns a pointer: NULL and `errno` on failure.
pub(crate) fn pointer<T>(name: &str, body: impl FnOnce() -> Res<*mut T>) -> *mut T {
    let r = catch_unwind(AssertUnwindSafe(body)).unwrap_or_else(|_| Err(panicked(name)));
    match r {
        Ok(p) => p,
        Err(f) => {
            report(name, &f);
            log::set_errno(if f.code == URMA_FAIL { libc::EIO } else { f.code });
            std::ptr::null_mut()
        }
    }
}

/// Runs an entry point that returns a count: -1 and `errno` on failure.
pub(crate) fn count(name: &str, body: impl FnOnce() -> Res<i32>) -> i32 {
    let r = catch_unwind(AssertUnwindSafe(body)).unwrap_or_else(|_| Err(panicked(name)));
    match r {
        Ok(n) => n,
        Err(f) => {
            report(name, &f);
            log::set_errno(if f.code == URMA_FAIL { libc::EIO } else { f.code });
            -1
        }
    }
}

/// Runs an entry point that returns nothing.
pub(crate) fn unit(name: &str, body: impl FnOnce() -> Res<()>) {
    let r = catch_unwind(AssertUnwindSafe(body)).unwrap_or_else(|_| Err(panicked(name)));
    if let Err(f) = r {
        report(name, &f);
    }
}

/// Zero bytes of a C struct.
///
/// # Safety
/// `T` must be a C struct for which all-zero bytes are a valid value (integers, arrays, raw
/// pointers, unions of those), as every `bypass_urma_abi` struct is.
pub(crate) unsafe fn zeroed<T>() -> T {
    // SAFETY: forwarded contract.
    unsafe { std::mem::zeroed() }
}

/// Copies a C struct from a pointer C handed in, after a NULL check.
///
/// # Safety
/// A non-NULL `p` must point to a readable `T` (the C API's contract for an input struct).
pub(crate) unsafe fn read_in<T: Copy>(p: *const T, what: &str) -> Res<T> {
    if p.is_null() {
        return Err(inval(format!("{what} is NULL")));
    }
    // SAFETY: non-NULL, and the caller vouches it points to a `T`; read_unaligned because C
    // may hand in a packed or misaligned copy.
    Ok(unsafe { p.read_unaligned() })
}
