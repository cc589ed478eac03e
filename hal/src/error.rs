//! The one error type of the hal control and data path.

use crate::QueueState;

/// What went wrong in a hal call. Every variant says what failed and, where it helps, what to do.
///
/// Errors of *work requests* (a bad remote key, a receive buffer that is too small, …) are not
/// reported here: they arrive later as a [`crate::Completion`] with an error [`crate::Status`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The work queue has no room for the whole batch; nothing was posted. Poll completions (which
    /// frees slots) and post again.
    #[error("{side} queue full: {free} free slot(s) for a batch of {wanted}; nothing was posted, poll completions and retry")]
    WouldBlock {
        /// `"send"` or `"receive"`.
        side: &'static str,
        /// Slots free when the post was attempted.
        free: u32,
        /// Work requests in the rejected batch.
        wanted: usize,
    },
    /// The queue is not in a state that allows the operation.
    #[error("queue is {state:?}: {op} needs {needs}")]
    BadState {
        /// The state the queue was in.
        state: QueueState,
        /// The operation that was refused.
        op: &'static str,
        /// The state(s) the operation needs.
        needs: &'static str,
    },
    /// An argument is outside what the call or the device accepts.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The completion queue overflowed: the device had a completion to write and no free slot, so
    /// completions were lost. The CQ is unusable; size CQs for every outstanding work request.
    #[error("completion queue overflowed (depth {depth}): completions were lost; size the CQ for every outstanding work request")]
    CqOverflow {
        /// The CQ's depth.
        depth: u32,
    },
    /// The device ran out of a resource (queue numbers, keys, memory).
    #[error("out of resources: {0}")]
    OutOfResources(String),
    /// The object is still in use by another (a shared receive queue by a queue: verbs `EBUSY`);
    /// release the users first.
    #[error("busy: {0}")]
    Busy(String),
    /// The operation is not supported by this device or backend.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The device (or its driver library) failed or is gone.
    #[error("device failure: {0}")]
    Device(String),
    /// An operating-system call failed.
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
}

/// A copy, for reporting one failure to several parties (every call of a refused batch). An
/// [`Error::Io`] is rebuilt from its OS error code when it has one (else from its kind and
/// message), since `std::io::Error` cannot be cloned.
impl Clone for Error {
    fn clone(&self) -> Self {
        match self {
            Error::WouldBlock { side, free, wanted } => {
                Error::WouldBlock { side, free: *free, wanted: *wanted }
            }
            Error::BadState { state, op, needs } => Error::BadState { state: *state, op, needs },
            Error::InvalidArgument(m) => Error::InvalidArgument(m.clone()),
            Error::CqOverflow { depth } => Error::CqOverflow { depth: *depth },
            Error::OutOfResources(m) => Error::OutOfResources(m.clone()),
            Error::Busy(m) => Error::Busy(m.clone()),
            Error::Unsupported(m) => Error::Unsupported(m.clone()),
            Error::Device(m) => Error::Device(m.clone()),
            Error::Io(e) => Error::Io(match e.raw_os_error() {
                Some(code) => std::io::Error::from_raw_os_error(code),
                None => std::io::Error::new(e.kind(), e.to_string()),
            }),
        }
    }
}

impl Error {
    /// True for [`Error::WouldBlock`]: retrying later (after polling completions) can succeed.
    pub fn is_would_block(&self) -> bool {
        matches!(self, Error::WouldBlock { .. })
    }
}

/// Shorthand for `Result<T, bypass_hal::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::Error;

    #[test]
    fn a_clone_says_the_same() {
        let errors = [
            Error::WouldBlock { side: "send", free: 1, wanted: 4 },
            Error::BadState { state: crate::QueueState::Reset, op: "post_send", needs: "RTS or ERROR" },
            Error::InvalidArgument("x".into()),
            Error::CqOverflow { depth: 8 },
            Error::OutOfResources("keys".into()),
            Error::Busy("srq".into()),
            Error::Unsupported("atomics".into()),
            Error::Device("gone".into()),
            Error::Io(std::io::Error::from_raw_os_error(12)),
            Error::Io(std::io::Error::new(std::io::ErrorKind::TimedOut, "slow")),
        ];
        for e in &errors {
            let c = e.clone();
            assert_eq!(c.to_string(), e.to_string());
            assert_eq!(std::mem::discriminant(&c), std::mem::discriminant(e));
        }
        let Error::Io(io) = Error::Io(std::io::Error::from_raw_os_error(12)).clone() else { unreachable!() };
        assert_eq!(io.raw_os_error(), Some(12), "the OS error code survives");
    }
}
