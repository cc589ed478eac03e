//! Shared receive queues: the [`SharedRecv`] trait and its contract.

use crate::{Error, RecvWr, Result};

/// A shared receive queue: one pool of receives that several queues of a device take from.
///
/// A server with many connections would otherwise keep a full receive queue per connection,
/// mostly idle. With a [`SharedRecv`] (verbs: SRQ; URMA: a JFR shared by several jettys; sim: a
/// receive ring shared by several QPs of one NIC) it posts one pool of buffers and every queue
/// created with [`Device::create_queue_on_shared`](crate::Device::create_queue_on_shared) takes
/// the next receive from it when a message (a SEND, or a WRITE with immediate) arrives.
///
/// What every backend does, as real hardware does:
///
/// - A receive completion of such a queue arrives on **the queue's** receive CQ, with the
///   queue's `qpn` and the `wr_id` posted to the shared queue: the qpn says which connection
///   the message came from. Receives are taken in the order they were posted.
/// - [`Queue::post_recv`](crate::Queue::post_recv) on a queue that uses a shared queue is
///   refused ([`Error::InvalidArgument`](crate::Error::InvalidArgument)); post to the shared
///   queue instead. The queue's `recv_depth` and `max_recv_sge` are the shared queue's business
///   (the simulator alone uses `recv_depth`, see `docs/sim.md`).
/// - An empty shared queue is a receiver that is not ready: the sender gets RNR NAKs and retries
///   as its `rnr_retry` allows (forever with 7); the message lands once a receive is posted.
/// - A queue that goes to ERROR (or is reset) does not flush the shared queue: its receives
///   belong to the shared queue and serve the other queues. Only a receive the failing queue had
///   already taken for a message in progress completes on it, `Flushed`.
/// - [`SharedRecv::destroy`] of a shared queue that a live queue still uses is refused
///   ([`Error::Busy`](crate::Error::Busy); verbs `EBUSY`). Dropping the handle instead is always
///   allowed: the shared queue then lives, unpostable, until the last queue using it is
///   dropped (what a device creates keeps what it needs alive).
/// - Dropping or destroying a shared queue discards its posted receives without completions
///   (as `ibv_destroy_srq` does).
/// - A receive a queue took whose completion was not polled before that queue was destroyed is
///   never delivered, and its place in the shared queue comes back (conformance scenario
///   `shared_recv_slots_come_back_from_a_destroyed_queue`: the sim, verbs on rxe). Where the
///   device purges a destroyed queue's completions (mlx5; the simulated NIC under sim-urma) the
///   verbs and urma backends cannot see such a receive, and its place is lost for the shared
///   queue's life: poll a queue's receive CQ before destroying it.
/// - The limit event (verbs `IBV_EVENT_SRQ_LIMIT_REACHED`, a low-watermark warning) is not part
///   of the contract: poster code counts its own posted receives against their completions.
///
/// Posting takes a batch and rings the doorbell once, with the rules of
/// [`Queue::post_recv`](crate::Queue::post_recv): all-or-nothing, `WouldBlock` when the batch
/// does not fit (slots come back as the queues' receive completions are polled), more SGEs than
/// the shared queue's `max_sge` → `InvalidArgument`.
pub trait SharedRecv: Send {
    /// Receive slots (at least the depth asked for).
    fn depth(&self) -> u32;
    /// Most SGEs per receive.
    fn max_sge(&self) -> u32;
    /// Posts receives that any queue created on this shared queue may take.
    fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> Result<()>;
    /// Destroys the shared queue, discarding its posted receives; refused with
    /// [`Error::Busy`], handing the shared queue back, while a queue created on it is alive.
    fn destroy(self) -> Result<(), (Self, Error)>
    where
        Self: Sized;
}
