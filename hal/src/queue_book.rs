//! A queue's bookkeeping that does not depend on the library under it, common to the verbs and
//! URMA backends: the checks of a configuration and of a batch, the side rings and free-slot
//! accounting that make batches all-or-nothing, the tracked state, and the epoch that hides
//! completions of a queue's earlier incarnation.
//!
//! Two halves, as in [`crate::side_ring`]: the [`Rings`] a queue's CQ pollers see (in the
//! backend's shared part of the queue, [`HasRings`]) and the poster's [`QueueBook`] (its epoch
//! and heads, in the queue handle). How the epoch, the ring and the slot are carried in what the
//! library sees (a `wr_id`, a `user_ctx`) and where epochs come from are the backend's business.

use crate::shared_slots::SharedSlots;
use crate::side_ring::{self, pack, pack_state, state_of, Done, SideRing};
use crate::{DeviceCaps, Error, QueueConfig, QueueState, RecvWr, Result, SendWr};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

/// What a queue's pollers see of it, whatever the backend.
pub(crate) struct Rings {
    pub(crate) send: SideRing,
    pub(crate) recv: SideRing,
    /// `epoch << 8 | state`.
    state: AtomicU32,
    alive: AtomicBool,
    /// The slot table of the shared receive queue the queue takes its receives from.
    pub(crate) srq: Option<Arc<SharedSlots>>,
}

impl Rings {
    /// Rings of `send_depth` and `recv_depth` slots in incarnation `epoch`, the queue in RESET.
    pub(crate) fn new(send_depth: u32, recv_depth: u32, epoch: u16, srq: Option<Arc<SharedSlots>>) -> Self {
        Rings {
            send: SideRing::new(send_depth, epoch),
            recv: SideRing::new(recv_depth, epoch),
            state: AtomicU32::new(pack_state(epoch, QueueState::Reset)),
            alive: AtomicBool::new(true),
            srq,
        }
    }

    pub(crate) fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }

    /// The queue is gone (or unusable): its CQs' pollers stop mapping completions to it.
    pub(crate) fn kill(&self) {
        self.alive.store(false, Ordering::Release);
    }

    /// The tracked state.
    pub(crate) fn state(&self) -> QueueState {
        state_of(self.state.load(Ordering::Acquire))
    }

    /// Poller side: resolves the completion of slot `index` of the send or receive ring issued
    /// in `epoch`; `None` if it belongs to an earlier incarnation of the queue. Retires the
    /// slot(s) and, for an error, moves the tracked state to ERROR (the device has).
    pub(crate) fn retire(&self, epoch: u16, recv: bool, index: u32, success: bool) -> Option<Done> {
        let ring = if recv { &self.recv } else { &self.send };
        side_ring::retire(ring, &self.state, epoch, index, success)
    }

    /// Poller side: a shared receive this queue took, slot `slot` of the shared queue numbered
    /// `id`; `None` for a slot that is not outstanding. With `to_error` (the backend's call for
    /// a failed receive) the tracked state moves to ERROR.
    pub(crate) fn retire_shared(&self, id: u64, slot: usize, to_error: bool) -> Option<Done> {
        let done = self.srq.as_ref()?.retire(id, slot)?;
        if to_error {
            self.device_error();
        }
        Some(done)
    }

    /// The device moved the queue to ERROR (an async event said so).
    pub(crate) fn device_error(&self) {
        side_ring::device_error(&self.state);
    }
}

/// A backend's shared part of a queue, as the CQ's pollers and the poster see it.
pub(crate) trait HasRings {
    fn rings(&self) -> &Rings;
}

/// The poster's side of a queue: its shared part, its current epoch and its heads (slots
/// posted on each ring).
pub(crate) struct QueueBook<S> {
    pub(crate) shared: Arc<S>,
    epoch: u16,
    send_head: u32,
    recv_head: u32,
}

impl<S: HasRings> QueueBook<S> {
    /// The book of a new queue whose rings are in incarnation `epoch`.
    pub(crate) fn new(shared: Arc<S>, epoch: u16) -> Self {
        QueueBook { shared, epoch, send_head: 0, recv_head: 0 }
    }

    fn rings(&self) -> &Rings {
        self.shared.rings()
    }

    pub(crate) fn epoch(&self) -> u16 {
        self.epoch
    }

    pub(crate) fn send_head(&self) -> u32 {
        self.send_head
    }

    pub(crate) fn recv_head(&self) -> u32 {
        self.recv_head
    }

    /// The state as tracked (what the backend did and the pollers and async events saw).
    pub(crate) fn tracked(&self) -> QueueState {
        self.rings().state()
    }

    pub(crate) fn set_tracked(&self, s: QueueState) {
        self.rings().state.store(pack_state(self.epoch, s), Ordering::Release);
    }

    /// The state `Queue::state` reports: the tracked one, unless it is READY and the device
    /// (asked with `query`) has the queue in ERROR, which the tracked state then learns.
    pub(crate) fn state(&self, query: impl FnOnce() -> Option<QueueState>) -> QueueState {
        let s = self.tracked();
        if s == QueueState::Ready && query() == Some(QueueState::Error) {
            self.rings().device_error();
            return QueueState::Error;
        }
        s
    }

    /// `connect` needs a queue in RESET.
    pub(crate) fn need_reset(&self, op: &'static str) -> Result<()> {
        match self.tracked() {
            QueueState::Reset => Ok(()),
            state => Err(Error::BadState { state, op, needs: "RESET" }),
        }
    }

    /// Posting (and `set_error`) needs a queue out of RESET.
    pub(crate) fn need_ready_or_error(&self, op: &'static str) -> Result<()> {
        match self.tracked() {
            QueueState::Reset => {
                Err(Error::BadState { state: QueueState::Reset, op, needs: "READY or ERROR" })
            }
            _ => Ok(()),
        }
    }

    /// A reset: incarnation `epoch` begins, with empty rings, the queue in RESET. Completions of
    /// the old incarnation that still arrive are dropped by epoch.
    pub(crate) fn new_incarnation(&mut self, epoch: u16) {
        self.epoch = epoch;
        self.send_head = 0;
        self.recv_head = 0;
        self.rings().send.retired.store(pack(epoch, 0), Ordering::Release);
        self.rings().recv.retired.store(pack(epoch, 0), Ordering::Release);
        self.set_tracked(QueueState::Reset);
    }

    /// Checks a send batch before anything is built: each request against the configuration
    /// (and `extra`, the backend's own check), then room for all of them.
    pub(crate) fn check_send(
        &self,
        wrs: &[SendWr<'_>],
        c: &QueueConfig,
        atomics: bool,
        mut extra: impl FnMut(&SendWr<'_>) -> Result<()>,
    ) -> Result<()> {
        for wr in wrs {
            if wr.sges.len() > c.max_send_sge as usize {
                return Err(invalid(format!(
                    "{} SGEs exceed the queue's max_send_sge {}",
                    wr.sges.len(),
                    c.max_send_sge
                )));
            }
            crate::check_send_wr(wr, c.max_inline, c.max_send_sge, atomics)?;
            extra(wr)?;
        }
        let free = self.rings().send.free(self.send_head);
        if wrs.len() > free as usize {
            return Err(Error::WouldBlock { side: "send", free, wanted: wrs.len() });
        }
        Ok(())
    }

    /// Checks a receive batch before anything is built: SGE counts, then room for all of it.
    pub(crate) fn check_recv(&self, wrs: &[RecvWr<'_>], max_sge: usize) -> Result<()> {
        if let Some(wr) = wrs.iter().find(|w| w.sges.len() > max_sge) {
            return Err(invalid(format!("{} SGEs exceed the queue's max_recv_sge {max_sge}", wr.sges.len())));
        }
        let free = self.rings().recv.free(self.recv_head);
        if wrs.len() > free as usize {
            return Err(Error::WouldBlock { side: "receive", free, wanted: wrs.len() });
        }
        Ok(())
    }

    /// The library took `n` sends (all of a batch, or those before a refused one).
    pub(crate) fn posted_send(&mut self, n: usize) {
        self.send_head = self.send_head.wrapping_add(n as u32);
    }

    /// The library took `n` receives.
    pub(crate) fn posted_recv(&mut self, n: usize) {
        self.recv_head = self.recv_head.wrapping_add(n as u32);
    }
}

pub(crate) fn invalid(msg: impl Into<String>) -> Error {
    Error::InvalidArgument(msg.into())
}

/// Checks a queue configuration against the device's caps; `sge_limit` caps the SGE counts
/// further (a library field narrower than the caps).
pub(crate) fn check_config(caps: &DeviceCaps, name: &str, c: &QueueConfig, sge_limit: u32) -> Result<()> {
    let depth_ok = |d: u32| (1..=caps.max_queue_depth).contains(&d);
    if !depth_ok(c.send_depth) || !depth_ok(c.recv_depth) {
        return Err(invalid(format!("queue depths must be in 1..={} on {name}", caps.max_queue_depth)));
    }
    let max_send_sge = caps.max_send_sge.min(sge_limit);
    if c.max_send_sge == 0 || c.max_send_sge > max_send_sge {
        return Err(invalid(format!("max_send_sge must be in 1..={max_send_sge} on {name}")));
    }
    let max_recv_sge = caps.max_recv_sge.min(sge_limit);
    if c.max_recv_sge == 0 || c.max_recv_sge > max_recv_sge {
        return Err(invalid(format!("max_recv_sge must be in 1..={max_recv_sge} on {name}")));
    }
    if c.max_inline > caps.max_inline {
        return Err(invalid(format!("max_inline {} exceeds {name}'s {}", c.max_inline, caps.max_inline)));
    }
    if c.retry_count > 7 || c.rnr_retry > 7 {
        return Err(invalid("retry_count and rnr_retry are 0..=7"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::side_ring::Op;
    use crate::Sge;

    struct Shared(Rings);

    impl HasRings for Shared {
        fn rings(&self) -> &Rings {
            &self.0
        }
    }

    #[test]
    fn a_reset_hides_the_old_incarnation_and_empties_the_rings() {
        let mut b = QueueBook::new(Arc::new(Shared(Rings::new(2, 2, 9, None))), 9);
        assert!(b.need_reset("connect").is_ok());
        assert!(b.need_ready_or_error("post_send").is_err());
        b.set_tracked(QueueState::Ready);
        let sge = [Sge::default()];
        let wrs = [SendWr::send(1, &sge), SendWr::send(2, &sge)];
        let c = QueueConfig { send_depth: 2, ..QueueConfig::default() };
        b.check_send(&wrs, &c, false, |_| Ok(())).unwrap();
        for i in 0..2 {
            b.shared.0.send.set(i, 100 + u64::from(i), Op::Send);
        }
        b.posted_send(2);
        assert!(matches!(b.check_send(&wrs[..1], &c, false, |_| Ok(())), Err(Error::WouldBlock { .. })));
        // A completion of slot 0 frees one slot.
        assert_eq!(b.shared.0.retire(9, false, 0, true).map(|d| d.user_wr_id), Some(100));
        b.check_send(&wrs[..1], &c, false, |_| Ok(())).unwrap();
        b.new_incarnation(10);
        assert_eq!((b.tracked(), b.send_head()), (QueueState::Reset, 0));
        assert!(b.shared.0.retire(9, false, 1, false).is_none(), "the old epoch is invisible");
        assert_eq!(b.tracked(), QueueState::Reset, "and moves no state");
        b.check_send(&wrs, &c, false, |_| Ok(())).unwrap();
    }

    #[test]
    fn state_asks_the_device_only_when_ready() {
        let b = QueueBook::new(Arc::new(Shared(Rings::new(1, 1, 1, None))), 1);
        assert_eq!(b.state(|| panic!("not asked in RESET")), QueueState::Reset);
        b.set_tracked(QueueState::Ready);
        assert_eq!(b.state(|| Some(QueueState::Ready)), QueueState::Ready);
        assert_eq!(b.state(|| Some(QueueState::Error)), QueueState::Error);
        assert_eq!(b.tracked(), QueueState::Error, "the tracked state learnt it");
    }

    #[test]
    fn configs_are_checked_against_the_caps() {
        let caps = DeviceCaps::new(1024, 1024, 300, 300, 256, 1 << 30, 1 << 40);
        let c = QueueConfig { max_send_sge: 256, ..QueueConfig::default() };
        assert!(check_config(&caps, "d", &c, u32::MAX).is_ok());
        let e = check_config(&caps, "d", &c, 255).unwrap_err().to_string();
        assert!(e.contains("max_send_sge must be in 1..=255 on d"), "{e}");
        let c = QueueConfig { retry_count: 8, ..QueueConfig::default() };
        assert!(check_config(&caps, "d", &c, u32::MAX).is_err());
    }
}
