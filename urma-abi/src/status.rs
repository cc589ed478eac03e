//! `urma_status_t` and the return conventions (urma-abi.md §2).
//!
//! - Functions returning `urma_status_t` return 0 or a positive errno number (or [`URMA_FAIL`];
//!   provider and ioctl codes may pass through unchanged).
//! - Functions returning a pointer return NULL and set `errno` (EINVAL bad argument or missing
//!   op, ENODEV from `get_device_*`, EIO when `create_context` / `get_eid_list` fail, ENOMEM).
//! - `urma_poll_jfc` returns the number of records, or a negative value (-1 bad arguments).
//! - `urma_wait_jfc` returns the number of JFCs, 0 on timeout (and on a signal, with errno
//!   [`crate::consts::ERESTARTSYS`]: retry), -1 on error.
//! - `urma_init` returns [`URMA_EEXIST`] when called twice, [`URMA_FAIL`] when no provider loaded.
//! - `urma_bind_jetty` returns [`URMA_EEXIST`] when already bound (callers treat it as success)
//!   and [`URMA_ENOPERM`] when a side is not RC or the two order types differ.
//! - `bad_wr` of the post calls must not be NULL ([`URMA_EINVAL`]).

/// `urma_status_t` (a C `int`).
pub type UrmaStatus = i32;

/// Success.
pub const URMA_SUCCESS: UrmaStatus = 0;
/// EPERM: not permitted (bind across modes or order types).
pub const URMA_ENOPERM: UrmaStatus = 1;
/// EAGAIN: try again (queue full).
pub const URMA_EAGAIN: UrmaStatus = 11;
/// ENOMEM.
pub const URMA_ENOMEM: UrmaStatus = 12;
/// EEXIST: already initialised / already bound.
pub const URMA_EEXIST: UrmaStatus = 17;
/// EINVAL: bad argument.
pub const URMA_EINVAL: UrmaStatus = 22;
/// ETIMEDOUT.
pub const URMA_ETIMEOUT: UrmaStatus = 110;
/// EINPROGRESS.
pub const URMA_EINPROGRESS: UrmaStatus = 115;
/// Generic failure (0x1000), e.g. `urma_init` with no provider.
pub const URMA_FAIL: UrmaStatus = 0x1000;

/// The C name of a documented status value, or `None` for a pass-through code.
pub fn status_name(s: UrmaStatus) -> Option<&'static str> {
    Some(match s {
        URMA_SUCCESS => "URMA_SUCCESS",
        URMA_ENOPERM => "URMA_ENOPERM",
        URMA_EAGAIN => "URMA_EAGAIN",
        URMA_ENOMEM => "URMA_ENOMEM",
        URMA_EEXIST => "URMA_EEXIST",
        URMA_EINVAL => "URMA_EINVAL",
        URMA_ETIMEOUT => "URMA_ETIMEOUT",
        URMA_EINPROGRESS => "URMA_EINPROGRESS",
        URMA_FAIL => "URMA_FAIL",
        _ => return None,
    })
}
