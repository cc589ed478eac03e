//! Completions and the completion queue.

use crate::Result;
use std::mem::MaybeUninit;
use std::os::fd::RawFd;

/// The outcome of a work request. Maps 1:1 from `ibv_wc_status` and `urma_cr_status_t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Status {
    /// It worked.
    #[default]
    Success,
    /// A receive buffer was too small for the inbound message, or a message exceeds the limits.
    LocalLength,
    /// The local queue was in an invalid state or the request was malformed.
    LocalQueueOperation,
    /// A local key was wrong, deregistered, out of bounds, or lacks the needed right.
    LocalProtection,
    /// The peer reported an invalid request (e.g. an unsupported operation, or a message larger
    /// than it accepts).
    RemoteInvalidRequest,
    /// The peer refused the access: wrong rkey, range out of bounds, or a missing access right.
    RemoteAccess,
    /// The peer failed to carry out the operation.
    RemoteOperation,
    /// The peer did not acknowledge within the retry budget (transport timeout).
    RetryExceeded,
    /// The peer kept answering "receiver not ready" past the RNR retry budget.
    RnrRetryExceeded,
    /// The queue went to ERROR before this request finished; it was not carried out (or not
    /// confirmed).
    Flushed,
    /// The peer answered with something unexpected.
    BadResponse,
    /// Any other error.
    General,
}

impl Status {
    /// True for [`Status::Success`].
    pub fn is_ok(self) -> bool {
        self == Status::Success
    }
}

/// What kind of work request completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum CqOpcode {
    /// A SEND or SEND_IMM finished on the sender.
    #[default]
    Send,
    /// A WRITE or WRITE_IMM finished on the sender.
    Write,
    /// A READ finished on the requester.
    Read,
    /// A compare-and-swap finished on the requester (the old value is in its SGE).
    CompareSwap,
    /// A fetch-and-add finished on the requester (the old value is in its SGE).
    FetchAdd,
    /// A receive consumed by an inbound SEND or SEND_IMM.
    Recv,
    /// A receive consumed by an inbound WRITE_IMM (the data went to the written region).
    RecvWriteImm,
}

/// One completion, copied out of the completion queue by [`CompletionQueue::poll`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Completion {
    /// The `wr_id` of the work request.
    pub wr_id: u64,
    /// Success or the specific error.
    pub status: Status,
    /// What completed: valid on every completion, including errors and flushes.
    pub opcode: CqOpcode,
    /// Bytes received (receives) or transferred (READ); undefined for failed requests.
    pub byte_len: u32,
    /// Immediate data of a SEND_IMM or WRITE_IMM, on the receiver.
    pub imm: Option<u32>,
    /// Queue number of the queue the request belonged to.
    pub qpn: u32,
}

/// Which completions wake an armed completion queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ArmMode {
    /// The next completion of any kind.
    Any,
    /// The next receive completion of a SOLICITED message, or any error completion.
    Solicited,
}

/// A completion queue: a ring the device fills and the application polls.
pub trait CompletionQueue: Send {
    /// Number of entries the queue holds.
    fn depth(&self) -> u32;

    /// An id unique among the live CQs of its device: what [`crate::EventChannel::take_events`]
    /// reports for this CQ.
    fn id(&self) -> u64;

    /// Moves up to `out.len()` completions into `out`, oldest first, and returns how many. Never
    /// blocks. Returns [`crate::Error::CqOverflow`] once the device had to drop a completion.
    fn poll(&mut self, out: &mut [Completion]) -> Result<usize>;

    /// [`poll`](Self::poll) into slots that need not be initialised, returning the completions
    /// it wrote (a prefix of `out`): a poller's stack array then costs nothing to set up. The
    /// provided version initialises `out` and calls `poll`; a backend that writes only the slots
    /// it fills overrides it.
    fn poll_uninit<'a>(&mut self, out: &'a mut [MaybeUninit<Completion>]) -> Result<&'a [Completion]> {
        for slot in out.iter_mut() {
            slot.write(Completion::default());
        }
        // SAFETY: every slot was initialised just above, and `MaybeUninit<T>` has `T`'s layout.
        let out = unsafe { &mut *(out as *mut [MaybeUninit<Completion>] as *mut [Completion]) };
        let n = self.poll(out)?;
        Ok(&out[..n])
    }

    /// Asks for one event on [`event_fd`](Self::event_fd) when a matching completion arrives.
    ///
    /// A matching completion already in the queue (not yet polled) when it is armed: hardware
    /// that arms against the consumer index raises the event at once (mlx5's and UDMA's arm
    /// doorbells carry the consumer index, and the device signals if completions lie past it;
    /// the simulator does the same), while rxe raises none (its `req_notify_cq` only reports
    /// missed events to kernel callers that ask, which the user-space verbs path never does).
    /// So an event may or may not follow for a completion queued before arming, and portable
    /// code polls once after arming before it sleeps: a completion is never lost either way.
    fn arm(&mut self, mode: ArmMode) -> Result<()>;

    /// A file descriptor that becomes readable when an armed queue gets a completion; wait on it
    /// with poll/epoll, then call [`ack_events`](Self::ack_events), poll, and re-arm. A CQ on a
    /// shared channel ([`crate::Device::create_cq_on`]) returns the channel's fd.
    fn event_fd(&self) -> RawFd;

    /// Consumes this CQ's pending events and returns how many there were (0 if none). On a shared
    /// channel events are taken with [`crate::EventChannel::take_events`] instead, and this
    /// returns 0.
    fn ack_events(&mut self) -> Result<u64>;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CQ that hands out the completions it holds, oldest first.
    struct Fixed(Vec<Completion>);

    impl CompletionQueue for Fixed {
        fn depth(&self) -> u32 {
            16
        }
        fn id(&self) -> u64 {
            0
        }
        fn poll(&mut self, out: &mut [Completion]) -> Result<usize> {
            let n = out.len().min(self.0.len());
            for (slot, c) in out.iter_mut().zip(self.0.drain(..n)) {
                *slot = c;
            }
            Ok(n)
        }
        fn arm(&mut self, _: ArmMode) -> Result<()> {
            Ok(())
        }
        fn event_fd(&self) -> RawFd {
            -1
        }
        fn ack_events(&mut self) -> Result<u64> {
            Ok(0)
        }
    }

    /// The provided `poll_uninit` returns exactly what `poll` wrote, and nothing more.
    #[test]
    fn poll_uninit_returns_the_completions_written() {
        let c = |wr_id| Completion { wr_id, byte_len: 8, ..Completion::default() };
        let mut cq = Fixed(vec![c(1), c(2), c(3)]);
        let mut slots = [MaybeUninit::uninit(); 2];
        let got: Vec<u64> = cq.poll_uninit(&mut slots).unwrap().iter().map(|c| c.wr_id).collect();
        assert_eq!(got, [1, 2]);
        let mut slots = [MaybeUninit::uninit(); 4];
        let got: Vec<u64> = cq.poll_uninit(&mut slots).unwrap().iter().map(|c| c.wr_id).collect();
        assert_eq!(got, [3]);
        assert!(cq.poll_uninit(&mut slots).unwrap().is_empty());
    }
}
