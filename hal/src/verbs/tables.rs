//! The verbs backend's translation tables, each in one place: `ibv_wc_status` → [`Status`], the
//! errno of a failed verb → [`Error`], QP states, path MTUs and async event codes.

use crate::{AsyncEvent, Error, QueueState, Status};
use rdma_sys::{ibv_mtu, ibv_qp_state, ibv_wc_status};

/// The status of a work completion. Every `ibv_wc_status` not named here is [`Status::General`].
pub(crate) fn wc_status(s: ibv_wc_status::Type) -> Status {
    use ibv_wc_status::*;
    match s {
        IBV_WC_SUCCESS => Status::Success,
        IBV_WC_LOC_LEN_ERR => Status::LocalLength,
        IBV_WC_LOC_QP_OP_ERR => Status::LocalQueueOperation,
        IBV_WC_LOC_PROT_ERR => Status::LocalProtection,
        IBV_WC_WR_FLUSH_ERR => Status::Flushed,
        IBV_WC_REM_INV_REQ_ERR => Status::RemoteInvalidRequest,
        IBV_WC_REM_ACCESS_ERR => Status::RemoteAccess,
        IBV_WC_REM_OP_ERR => Status::RemoteOperation,
        IBV_WC_RETRY_EXC_ERR => Status::RetryExceeded,
        IBV_WC_RNR_RETRY_EXC_ERR => Status::RnrRetryExceeded,
        IBV_WC_BAD_RESP_ERR => Status::BadResponse,
        _ => Status::General,
    }
}

/// What a failed verb's errno means for the caller, naming the verb and, where it helps, what to
/// check. `what` says what was being done ("create a queue of 128/128 slots").
pub(crate) fn verb_error(verb: &str, errno: i32, what: &str) -> Error {
    let os = std::io::Error::from_raw_os_error(errno);
    let base = format!("{verb} failed ({what}): {os}");
    match errno {
        libc::ENOMEM => Error::OutOfResources(format!(
            "{base}; the device or the locked-memory limit is exhausted (check `ulimit -l`)"
        )),
        libc::EINVAL | libc::ERANGE => Error::InvalidArgument(format!(
            "{base}; a parameter is outside what the device accepts (compare with `ibv_devinfo -v`)"
        )),
        libc::EPERM | libc::EACCES => Error::Device(format!(
            "{base}; no permission: check access to /dev/infiniband/uverbs* and RLIMIT_MEMLOCK"
        )),
        libc::EOPNOTSUPP | libc::ENOSYS => Error::Unsupported(base),
        libc::ENODEV | libc::EIO | libc::ENXIO => {
            Error::Device(format!("{base}; the device is gone or failed (check `rdma link show`, dmesg)"))
        }
        libc::EAGAIN | libc::EBUSY => Error::OutOfResources(format!("{base}; the resource is busy")),
        libc::ENOSPC | libc::EMFILE | libc::ENFILE => Error::OutOfResources(base),
        _ => Error::Device(base),
    }
}

/// The thread's errno after a verb that reports failure by returning NULL or -1.
pub(crate) fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
}

/// A hardware QP state as seen by the hal: ERR and SQE are ERROR; everything below RTS that a
/// connected queue is not expected to be in is reported as what the backend tracked.
pub(crate) fn qp_state(s: ibv_qp_state::Type) -> Option<QueueState> {
    use ibv_qp_state::*;
    match s {
        IBV_QPS_RESET => Some(QueueState::Reset),
        IBV_QPS_RTS => Some(QueueState::Ready),
        IBV_QPS_ERR | IBV_QPS_SQE => Some(QueueState::Error),
        _ => None,
    }
}

/// `ibv_mtu` from bytes; `None` for a size verbs has no code for.
pub(crate) fn mtu_from_bytes(bytes: u32) -> Option<ibv_mtu::Type> {
    use ibv_mtu::*;
    Some(match bytes {
        256 => IBV_MTU_256,
        512 => IBV_MTU_512,
        1024 => IBV_MTU_1024,
        2048 => IBV_MTU_2048,
        4096 => IBV_MTU_4096,
        _ => return None,
    })
}

/// Bytes of an `ibv_mtu` code (0 for an unknown code).
pub(crate) fn mtu_bytes(mtu: ibv_mtu::Type) -> u32 {
    if (1..=5).contains(&mtu) {
        128 << mtu
    } else {
        0
    }
}

/// `enum ibv_event_type` values (read as integers: a value this table does not know must not be
/// turned into a Rust enum).
pub(crate) mod event {
    pub const CQ_ERR: u32 = 0;
    pub const QP_FATAL: u32 = 1;
    pub const QP_REQ_ERR: u32 = 2;
    pub const QP_ACCESS_ERR: u32 = 3;
    pub const DEVICE_FATAL: u32 = 8;
    pub const PORT_ACTIVE: u32 = 9;
    pub const PORT_ERR: u32 = 10;
    pub const QP_LAST_WQE_REACHED: u32 = 16;

    /// Events whose element is a QP (the others that carry one are informational).
    pub fn has_qp(t: u32) -> bool {
        // COMM_EST 4, SQ_DRAINED 5, PATH_MIG 6, PATH_MIG_ERR 7 name a QP too.
        matches!(t, 1..=7 | QP_LAST_WQE_REACHED)
    }

    /// The QP events that mean the queue went to ERROR.
    pub fn is_fatal_for_qp(t: u32) -> bool {
        matches!(t, QP_FATAL | QP_REQ_ERR | QP_ACCESS_ERR)
    }

    /// Events whose element is a port number.
    pub fn has_port(t: u32) -> bool {
        // PORT_ACTIVE 9, PORT_ERR 10, LID_CHANGE 11, PKEY_CHANGE 12, SM_CHANGE 13,
        // CLIENT_REREGISTER 17, GID_CHANGE 18.
        matches!(t, 9..=13 | 17 | 18)
    }
}

/// An async event as the hal names it; `qpn` and `port` are the element when the event has one.
pub(crate) fn async_event(t: u32, qpn: u32, port: u8) -> AsyncEvent {
    match t {
        event::QP_FATAL => AsyncEvent::QueueFatal { qpn },
        event::QP_ACCESS_ERR => AsyncEvent::QueueAccessError { qpn },
        event::QP_REQ_ERR => AsyncEvent::QueueRequestError { qpn },
        event::QP_LAST_WQE_REACHED => AsyncEvent::LastWqeReached { qpn },
        event::CQ_ERR => AsyncEvent::CqError,
        event::PORT_ACTIVE => AsyncEvent::PortActive { port },
        event::PORT_ERR => AsyncEvent::PortDown { port },
        event::DEVICE_FATAL => AsyncEvent::DeviceFatal,
        other => AsyncEvent::Other(other as i32),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_one_to_one() {
        use ibv_wc_status::*;
        let named = [
            (IBV_WC_SUCCESS, Status::Success),
            (IBV_WC_LOC_LEN_ERR, Status::LocalLength),
            (IBV_WC_LOC_QP_OP_ERR, Status::LocalQueueOperation),
            (IBV_WC_LOC_PROT_ERR, Status::LocalProtection),
            (IBV_WC_WR_FLUSH_ERR, Status::Flushed),
            (IBV_WC_REM_INV_REQ_ERR, Status::RemoteInvalidRequest),
            (IBV_WC_REM_ACCESS_ERR, Status::RemoteAccess),
            (IBV_WC_REM_OP_ERR, Status::RemoteOperation),
            (IBV_WC_RETRY_EXC_ERR, Status::RetryExceeded),
            (IBV_WC_RNR_RETRY_EXC_ERR, Status::RnrRetryExceeded),
            (IBV_WC_BAD_RESP_ERR, Status::BadResponse),
        ];
        for (code, status) in named {
            assert_eq!(wc_status(code), status, "ibv_wc_status {code}");
        }
        assert_eq!(wc_status(IBV_WC_GENERAL_ERR), Status::General);
        assert_eq!(wc_status(IBV_WC_MW_BIND_ERR), Status::General);
        assert_eq!(wc_status(9999), Status::General);
    }

    #[test]
    fn mtus_round_trip() {
        for b in [256, 512, 1024, 2048, 4096] {
            assert_eq!(mtu_bytes(mtu_from_bytes(b).unwrap()), b);
        }
        assert_eq!(mtu_from_bytes(1500), None);
        assert_eq!(mtu_bytes(0), 0);
    }

    #[test]
    fn errnos_name_the_verb() {
        let e = verb_error("ibv_create_qp", libc::ENOMEM, "a queue");
        assert!(matches!(e, Error::OutOfResources(ref m) if m.contains("ibv_create_qp")), "{e}");
        assert!(matches!(verb_error("ibv_reg_mr", libc::EINVAL, "x"), Error::InvalidArgument(_)));
        assert!(
            matches!(verb_error("ibv_open_device", libc::EACCES, "x"), Error::Device(ref m) if m.contains("uverbs"))
        );
    }

    #[test]
    fn async_events() {
        assert_eq!(async_event(event::QP_FATAL, 7, 0), AsyncEvent::QueueFatal { qpn: 7 });
        assert_eq!(async_event(event::PORT_ERR, 0, 1), AsyncEvent::PortDown { port: 1 });
        assert_eq!(async_event(77, 0, 0), AsyncEvent::Other(77));
        assert!(event::has_qp(event::QP_ACCESS_ERR) && !event::has_qp(event::CQ_ERR));
        assert!(event::has_port(event::PORT_ACTIVE) && !event::has_port(event::DEVICE_FATAL));
    }
}
