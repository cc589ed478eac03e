//! Events: completion event channels shared by several CQs, and the device's asynchronous events.
//!
//! A CQ raises a completion event once per [`crate::CompletionQueue::arm`]. A CQ made with
//! [`crate::Device::create_cq`] has a channel of its own; CQs made with
//! [`crate::Device::create_cq_on`] share one, so a thread serving many queues waits on one fd
//! (verbs: one `ibv_comp_channel`; URMA: one jfce). Asynchronous events report what no completion
//! can: a queue that failed with nothing outstanding, a port that went down.

use crate::Result;
use std::os::fd::AsFd;

/// A completion event channel: an fd (non-blocking, readable when an armed CQ on it got a
/// completion) and the list of CQs that fired.
pub trait EventChannel: AsFd + Send + Sync {
    /// Takes the pending events without blocking and writes the [`id`](crate::CompletionQueue::id)s
    /// of the CQs that raised them into `out` (a CQ may appear more than once); returns how many.
    /// The events are acknowledged: poll those CQs, then re-arm them. Events that did not fit
    /// stay pending (and the fd readable).
    fn take_events(&self, out: &mut [u64]) -> Result<usize>;
}

/// An asynchronous event of a device (verbs: `ibv_get_async_event`; URMA: `urma_get_async_event`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum AsyncEvent {
    /// The queue went to ERROR because of an error no work request of its own reports (verbs
    /// `QP_FATAL`), e.g. a transport error on the responder side.
    QueueFatal {
        /// The queue's number.
        qpn: u32,
    },
    /// An inbound request broke the queue's access rules (verbs `QP_ACCESS_ERR`: a bad rkey or
    /// range in a peer's WRITE or READ); the queue is in ERROR.
    QueueAccessError {
        /// The queue's number.
        qpn: u32,
    },
    /// An inbound request was invalid (verbs `QP_REQ_ERR`); the queue is in ERROR.
    QueueRequestError {
        /// The queue's number.
        qpn: u32,
    },
    /// A queue in ERROR has no receive left to flush (verbs `QP_LAST_WQE_REACHED`).
    LastWqeReached {
        /// The queue's number.
        qpn: u32,
    },
    /// A completion queue failed (overrun); its completions are lost.
    CqError,
    /// The port came up.
    PortActive {
        /// The port number.
        port: u8,
    },
    /// The port went down: connected queues will fail their next requests.
    PortDown {
        /// The port number.
        port: u8,
    },
    /// The device failed; every resource on it is unusable.
    DeviceFatal,
    /// An event this version does not name, with the backend's code.
    Other(i32),
}

impl AsyncEvent {
    /// The queue the event is about, if it is about one.
    pub fn qpn(&self) -> Option<u32> {
        match *self {
            AsyncEvent::QueueFatal { qpn }
            | AsyncEvent::QueueAccessError { qpn }
            | AsyncEvent::QueueRequestError { qpn }
            | AsyncEvent::LastWqeReached { qpn } => Some(qpn),
            _ => None,
        }
    }
}
