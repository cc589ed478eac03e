//! Queue recovery on the server (see [`crate::recovery`]).

use super::Conn;
use crate::control::{QueueReset, QueueResetDone};
use crate::hal::Device;

impl<D: Device + Clone> Conn<D> {
    /// Resets and reconnects the queue a client's [`QueueReset`] names (monitor thread).
    pub(super) fn reset_queue(&self, r: &QueueReset) -> QueueResetDone {
        QueueResetDone { seq: r.seq, queue: r.queue, result: Err("queue recovery is not supported".into()) }
    }
}
