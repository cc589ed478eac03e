//! Event delivery beyond one CQ's own eventfd: completion channels that several CQs share, and
//! the NIC's asynchronous events (a queue that failed on the responder side, where no work
//! request of its own reports it).

use crate::eventfd::EventFd;
use crate::sync::{self, Mutex};
use bypass_hal::{AsyncEvent, EventChannel, Result};
use std::collections::VecDeque;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;

/// A completion channel: the ids of CQs that raised an event, and an eventfd that is readable
/// while the list is not empty.
#[derive(Debug)]
pub(crate) struct ChannelShared {
    event: EventFd,
    fired: Mutex<VecDeque<u64>>,
}

impl ChannelShared {
    /// Device side: CQ `id` raised its event (the CQ's arm is already consumed).
    pub(crate) fn fire(&self, id: u64) {
        sync::lock(&self.fired).push_back(id);
        self.event.signal();
    }

    pub(crate) fn fd(&self) -> std::os::fd::RawFd {
        self.event.raw()
    }
}

/// A completion event channel of a simulated NIC (the sim's `ibv_comp_channel`).
#[derive(Debug, Clone)]
pub struct SimChannel {
    pub(crate) shared: Arc<ChannelShared>,
    pub(crate) nic: u32,
}

impl SimChannel {
    pub(crate) fn new(nic: u32) -> Result<Self> {
        Ok(SimChannel {
            shared: Arc::new(ChannelShared { event: EventFd::new()?, fired: Mutex::new(VecDeque::new()) }),
            nic,
        })
    }
}

impl AsFd for SimChannel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the eventfd is owned by `shared`, which lives at least as long as `self`.
        unsafe { BorrowedFd::borrow_raw(self.shared.fd()) }
    }
}

impl EventChannel for SimChannel {
    fn take_events(&self, out: &mut [u64]) -> Result<usize> {
        let mut fired = sync::lock(&self.shared.fired);
        // Drain the counter first: a fire after this point adds to the list and signals again.
        self.shared.event.drain()?;
        let n = out.len().min(fired.len());
        for (slot, id) in out.iter_mut().zip(fired.drain(..n)) {
            *slot = id;
        }
        if !fired.is_empty() {
            // What did not fit stays pending, and the fd stays readable.
            self.shared.event.signal();
        }
        Ok(n)
    }
}

/// A NIC's asynchronous events, in order, with an eventfd readable while any is pending.
#[derive(Debug)]
pub(crate) struct AsyncEvents {
    event: EventFd,
    pending: Mutex<VecDeque<AsyncEvent>>,
}

impl AsyncEvents {
    pub(crate) fn new() -> std::io::Result<Self> {
        Ok(AsyncEvents { event: EventFd::new()?, pending: Mutex::new(VecDeque::new()) })
    }

    /// Most events kept for a user who never reads them; beyond it the oldest are dropped.
    const MAX_PENDING: usize = 1024;

    /// Device side (cold: only on errors).
    pub(crate) fn push(&self, e: AsyncEvent) {
        let mut pending = sync::lock(&self.pending);
        if pending.len() >= Self::MAX_PENDING {
            pending.pop_front();
        }
        pending.push_back(e);
        drop(pending);
        self.event.signal();
    }

    pub(crate) fn pop(&self) -> Result<Option<AsyncEvent>> {
        let mut pending = sync::lock(&self.pending);
        self.event.drain()?;
        let e = pending.pop_front();
        if !pending.is_empty() {
            self.event.signal();
        }
        Ok(e)
    }

    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the eventfd lives as long as `self`.
        unsafe { BorrowedFd::borrow_raw(self.event.raw()) }
    }
}
