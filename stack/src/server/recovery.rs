//! Queue recovery on the server (see [`crate::conn::recovery`]): the client asks, the connection's
//! watch resets its end of the queue and answers (aside from the control loop, on a short-lived
//! thread).

#![forbid(unsafe_code)]

use super::Conn;
use crate::control::{QueueReset, QueueResetDone};
use crate::hal::{Device, QueueInfo};
use crate::RpcError;
use std::sync::atomic::Ordering;
use std::time::Instant;

impl<D: Device + Clone> Conn<D> {
    /// Resets and reconnects the queue a client's [`QueueReset`] names (aside from the control loop).
    pub(super) fn reset_queue(&self, r: &QueueReset) -> QueueResetDone {
        let result =
            self.try_reset_queue(r).map_err(|e| format!("the server could not reset queue {}: {e}", r.queue));
        QueueResetDone { seq: r.seq, queue: r.queue, result }
    }

    fn try_reset_queue(&self, r: &QueueReset) -> Result<QueueInfo, RpcError> {
        let q = usize::from(r.queue);
        if q >= self.ep.queues.len() {
            return Err(RpcError::InvalidArgument(format!("queue {q} of {}", self.ep.queues.len())));
        }
        // Fail it (if it has not failed already), then wait for the worker to collect every
        // completion of its old life.
        self.ep.fail_queue(q);
        let deadline = Instant::now() + super::monitor::FRAME_TIMEOUT;
        // The worker (or the application's `Server::poll`) collects the receive side; the send
        // side is safe to poll here too (no handler runs there).
        self.ep.drain(q, deadline, || {
            if self.poll_send() == 0 {
                self.ep.device.progress();
            }
        })?;
        // Credits owed on the old queue: the client refills its own to the window.
        self.grants[q].store(0, Ordering::Release);
        let info = self.ep.reset_queue(q)?;
        self.ep.reconnect_queue(q, &r.info)?;
        Ok(info)
    }
}
