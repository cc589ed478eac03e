//! The urma backend's translation tables, each in one place: `urma_cr_status_t` → [`Status`],
//! a failed call's `urma_status_t` or `errno` → [`Error`], and async event types → [`AsyncEvent`].

use crate::{AsyncEvent, Error, Status};
use bypass_urma_abi::consts::*;
use bypass_urma_abi::status::*;

/// The hal status of a completion record. Every `urma_cr_status_t` maps to one [`Status`]:
///
/// | urma_cr_status_t | Status |
/// |---|---|
/// | SUCCESS | Success |
/// | UNSUPPORTED_OPCODE_ERR, LOC_OPERATION_ERR | LocalQueueOperation |
/// | LOC_LEN_ERR | LocalLength |
/// | LOC_ACCESS_ERR | LocalProtection |
/// | REM_RESP_LEN_ERR, REM_UNSUPPORTED_REQ_ERR | RemoteInvalidRequest |
/// | REM_OPERATION_ERR | RemoteOperation |
/// | REM_ACCESS_ABORT_ERR | RemoteAccess |
/// | ACK_TIMEOUT_ERR | RetryExceeded |
/// | RNR_RETRY_CNT_EXC_ERR | RnrRetryExceeded |
/// | WR_FLUSH_ERR, WR_FLUSH_ERR_DONE, WR_SUSPEND_DONE, WR_UNHANDLED | Flushed |
/// | LOC_DATA_POISON, REM_DATA_POISON, anything else | General |
pub(crate) fn cr_status(s: u32) -> Status {
    match s {
        URMA_CR_SUCCESS => Status::Success,
        URMA_CR_UNSUPPORTED_OPCODE_ERR | URMA_CR_LOC_OPERATION_ERR => Status::LocalQueueOperation,
        URMA_CR_LOC_LEN_ERR => Status::LocalLength,
        URMA_CR_LOC_ACCESS_ERR => Status::LocalProtection,
        URMA_CR_REM_RESP_LEN_ERR | URMA_CR_REM_UNSUPPORTED_REQ_ERR => Status::RemoteInvalidRequest,
        URMA_CR_REM_OPERATION_ERR => Status::RemoteOperation,
        URMA_CR_REM_ACCESS_ABORT_ERR => Status::RemoteAccess,
        URMA_CR_ACK_TIMEOUT_ERR => Status::RetryExceeded,
        URMA_CR_RNR_RETRY_CNT_EXC_ERR => Status::RnrRetryExceeded,
        URMA_CR_WR_FLUSH_ERR | URMA_CR_WR_FLUSH_ERR_DONE | URMA_CR_WR_SUSPEND_DONE | URMA_CR_WR_UNHANDLED => {
            Status::Flushed
        }
        _ => Status::General,
    }
}

/// What a failed call's return code means for the caller: `urma_status_t` values and the errno a
/// pointer-returning call left (both are errno numbers). `call` names the function, `what` what
/// was being done.
pub(crate) fn status_error(call: &str, rc: i32, what: &str) -> Error {
    let name = match status_name(rc) {
        Some(n) => n.to_owned(),
        None => std::io::Error::from_raw_os_error(rc).to_string(),
    };
    let base = format!("{call} failed ({what}): {name} ({rc})");
    match rc {
        URMA_ENOMEM => Error::OutOfResources(format!("{base}; the device or memory is exhausted")),
        URMA_EINVAL => Error::InvalidArgument(format!(
            "{base}; a parameter is outside what the device accepts (compare with urma_admin show / the \
             device caps)"
        )),
        URMA_ENOPERM => Error::InvalidArgument(format!(
            "{base}; not permitted: both ends must be RC jettys with the same order type, and the token \
             must match"
        )),
        URMA_EAGAIN => Error::OutOfResources(format!("{base}; the resource is busy, retry")),
        URMA_EEXIST => Error::InvalidArgument(format!("{base}; it already exists")),
        URMA_ETIMEOUT => Error::Device(format!("{base}; the device did not answer in time")),
        URMA_EINPROGRESS => Error::Device(format!("{base}; still in progress")),
        URMA_FAIL => Error::Device(format!("{base}; the provider or the kernel refused (check dmesg)")),
        // ENODEV, EIO, ENXIO
        19 | 5 | 6 => {
            Error::Device(format!("{base}; the device is gone or failed (check /sys/class/ubcore and dmesg)"))
        }
        // EOPNOTSUPP, ENOSYS
        95 | 38 => Error::Unsupported(base),
        _ => Error::Device(base),
    }
}

/// The thread's errno after a call that reported failure by returning NULL or -1 (EIO if none).
pub(crate) fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().filter(|&e| e != 0).unwrap_or(5)
}

/// An async event as the hal names it; `qpn` and `port` are its element where it has one.
pub(crate) fn async_event(t: u32, qpn: u32, port: u8) -> AsyncEvent {
    match t {
        URMA_EVENT_JETTY_ERR | URMA_EVENT_JFS_ERR => AsyncEvent::QueueFatal { qpn },
        URMA_EVENT_JFC_ERR => AsyncEvent::CqError,
        URMA_EVENT_PORT_ACTIVE => AsyncEvent::PortActive { port },
        URMA_EVENT_PORT_DOWN => AsyncEvent::PortDown { port },
        URMA_EVENT_DEV_FATAL => AsyncEvent::DeviceFatal,
        other => AsyncEvent::Other(other as i32),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_cr_status_maps() {
        let want = [
            (URMA_CR_SUCCESS, Status::Success),
            (URMA_CR_UNSUPPORTED_OPCODE_ERR, Status::LocalQueueOperation),
            (URMA_CR_LOC_LEN_ERR, Status::LocalLength),
            (URMA_CR_LOC_OPERATION_ERR, Status::LocalQueueOperation),
            (URMA_CR_LOC_ACCESS_ERR, Status::LocalProtection),
            (URMA_CR_REM_RESP_LEN_ERR, Status::RemoteInvalidRequest),
            (URMA_CR_REM_UNSUPPORTED_REQ_ERR, Status::RemoteInvalidRequest),
            (URMA_CR_REM_OPERATION_ERR, Status::RemoteOperation),
            (URMA_CR_REM_ACCESS_ABORT_ERR, Status::RemoteAccess),
            (URMA_CR_ACK_TIMEOUT_ERR, Status::RetryExceeded),
            (URMA_CR_RNR_RETRY_CNT_EXC_ERR, Status::RnrRetryExceeded),
            (URMA_CR_WR_FLUSH_ERR, Status::Flushed),
            (URMA_CR_WR_SUSPEND_DONE, Status::Flushed),
            (URMA_CR_WR_FLUSH_ERR_DONE, Status::Flushed),
            (URMA_CR_WR_UNHANDLED, Status::Flushed),
            (URMA_CR_LOC_DATA_POISON, Status::General),
            (URMA_CR_REM_DATA_POISON, Status::General),
        ];
        assert_eq!(want.len(), 17, "every value 0..=16");
        for (code, status) in want {
            assert_eq!(cr_status(code), status, "{:?}", cr_status_name(code));
        }
        assert_eq!(cr_status(17), Status::General);
    }

    #[test]
    fn statuses_become_errors_naming_the_call() {
        let e = status_error("urma_create_jetty", URMA_ENOMEM, "a jetty");
        assert!(
            matches!(e, Error::OutOfResources(ref m) if m.contains("urma_create_jetty") && m.contains("URMA_ENOMEM")),
            "{e}"
        );
        assert!(matches!(status_error("x", URMA_EINVAL, "y"), Error::InvalidArgument(_)));
        let e = status_error("urma_bind_jetty", URMA_ENOPERM, "bind");
        assert!(matches!(e, Error::InvalidArgument(ref m) if m.contains("order type")), "{e}");
        assert!(matches!(status_error("x", URMA_FAIL, "y"), Error::Device(ref m) if m.contains("URMA_FAIL")));
        assert!(matches!(status_error("x", 19, "y"), Error::Device(ref m) if m.contains("ubcore")));
        assert!(matches!(status_error("x", 95, "y"), Error::Unsupported(_)));
        assert!(matches!(status_error("x", 12345, "y"), Error::Device(_)));
    }

    #[test]
    fn async_events() {
        assert_eq!(async_event(URMA_EVENT_JETTY_ERR, 5, 0), AsyncEvent::QueueFatal { qpn: 5 });
        assert_eq!(async_event(URMA_EVENT_PORT_DOWN, 0, 1), AsyncEvent::PortDown { port: 1 });
        assert_eq!(async_event(URMA_EVENT_JFC_ERR, 0, 0), AsyncEvent::CqError);
        assert_eq!(async_event(URMA_EVENT_ELR_DONE, 0, 0), AsyncEvent::Other(12));
    }
}
