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

impl Error {
    /// True for [`Error::WouldBlock`]: retrying later (after polling completions) can succeed.
    pub fn is_would_block(&self) -> bool {
        matches!(self, Error::WouldBlock { .. })
    }
}

/// Shorthand for `Result<T, bypass_hal::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;
