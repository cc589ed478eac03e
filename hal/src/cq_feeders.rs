//! The queues feeding a completion queue, common to the verbs and URMA backends.
//!
//! A CQ's poller maps each completion to the queue that issued it. Queues are created and
//! dropped on any thread while the CQ's owner polls, so the list has two halves: the shared
//! [`Feeders`] (behind a mutex, changed when a queue is created on the CQ or dropped, with a
//! flag the poller reads once per poll) and the poller's own [`FeederCache`] (a plain vector it
//! refreshes from the shared list only when the flag is up or a completion names a queue it
//! does not know, so a poll takes no lock).
//!
//! The shared half also keeps the slot tables of the shared receive queues its queues took
//! receives from, after those queues die: a receive completion of a destroyed queue (still in
//! the CQ) then still frees its slot ([`Feeders::retire_orphan`]).
//!
//! What a backend's queue shows here is its [`Rings`](crate::queue_book::Rings) ([`HasRings`]): whether it is alive and
//! which slot table it takes shared receives from. How a completion names its queue (a QP
//! number, a tag, a peer) is the backend's predicate, given to [`FeederCache::find`].

use crate::queue_book::HasRings;
use crate::shared_slots::SharedSlots;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// The shared half: the queues created on a CQ and the slot tables they took receives from.
pub(crate) struct Feeders<Q> {
    /// Queues created on this CQ (or dropped) since the poller last looked.
    attach: Mutex<Vec<Arc<Q>>>,
    pending: AtomicBool,
    /// The slot tables of the shared receive queues its queues took receives from, kept after
    /// those queues die: a receive completion of a destroyed queue still frees its slot.
    srqs: Mutex<Vec<Weak<SharedSlots>>>,
}

impl<Q: HasRings> Feeders<Q> {
    pub(crate) fn new() -> Self {
        Feeders {
            attach: Mutex::new(Vec::new()),
            pending: AtomicBool::new(false),
            srqs: Mutex::new(Vec::new()),
        }
    }

    /// Adds a queue to the list the poller maps completions with (dropping dead entries).
    pub(crate) fn attach(&self, q: &Arc<Q>) {
        let mut list = self.attach.lock().unwrap_or_else(|e| e.into_inner());
        list.retain(|x| x.rings().is_alive());
        if !list.iter().any(|x| Arc::ptr_eq(x, q)) {
            list.push(q.clone());
        }
        if let Some(s) = &q.rings().srq {
            let mut srqs = self.srqs.lock().unwrap_or_else(|e| e.into_inner());
            srqs.retain(|w| w.strong_count() > 0);
            if !srqs.iter().any(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(s))) {
                srqs.push(Arc::downgrade(s));
            }
        }
        self.pending.store(true, Ordering::Release);
    }

    /// Tells the poller a queue died (so it prunes its cache).
    pub(crate) fn detach_later(&self) {
        self.pending.store(true, Ordering::Release);
    }

    /// Frees slot `slot` of the shared receive queue numbered `id`, for a receive completion
    /// whose queue is gone (cold).
    #[cold]
    pub(crate) fn retire_orphan(&self, id: u64, slot: usize) {
        let srqs = self.srqs.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = srqs.iter().filter_map(Weak::upgrade).find(|s| s.id == id) {
            let _ = s.retire(id, slot);
        }
    }
}

/// The poller's half: its copy of the live queues, and the one the last completion named (the
/// next one usually names it again).
pub(crate) struct FeederCache<Q> {
    queues: Vec<Arc<Q>>,
    last: usize,
}

impl<Q: HasRings> FeederCache<Q> {
    pub(crate) fn new() -> Self {
        FeederCache { queues: Vec::new(), last: 0 }
    }

    /// How many queues the cache holds.
    pub(crate) fn len(&self) -> usize {
        self.queues.len()
    }

    /// Refreshes the cache if a queue was created on the CQ or dropped since the last look (one
    /// atomic load; the start of every poll).
    pub(crate) fn refresh_if_changed(&mut self, feeders: &Feeders<Q>) {
        if feeders.pending.load(Ordering::Acquire) {
            self.refresh(feeders);
        }
    }

    /// Refreshes the local list of queues from the shared one (cold: after a create or a drop).
    #[cold]
    fn refresh(&mut self, feeders: &Feeders<Q>) {
        feeders.pending.store(false, Ordering::Relaxed);
        let list = feeders.attach.lock().unwrap_or_else(|e| e.into_inner());
        self.queues.clear();
        self.queues.extend(list.iter().filter(|q| q.rings().is_alive()).cloned());
        self.last = 0;
    }

    /// The live queue `hit` accepts: the last one found if it still does, else the first in the
    /// cache, else (after a refresh) the first in the shared list; `None` if no queue does.
    pub(crate) fn find(&mut self, feeders: &Feeders<Q>, hit: impl Fn(&Q) -> bool) -> Option<&Arc<Q>> {
        let ok = |q: &Arc<Q>| hit(q) && q.rings().is_alive();
        if !self.queues.get(self.last).is_some_and(ok) {
            self.last = match self.queues.iter().position(ok) {
                Some(i) => i,
                None => {
                    self.refresh(feeders);
                    self.queues.iter().position(ok)?
                }
            };
        }
        Some(&self.queues[self.last])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue_book::Rings;

    struct Q {
        n: u32,
        rings: Rings,
    }

    impl HasRings for Q {
        fn rings(&self) -> &Rings {
            &self.rings
        }
    }

    fn queue(n: u32, srq: Option<&Arc<SharedSlots>>) -> Arc<Q> {
        Arc::new(Q { n, rings: Rings::new(4, 4, 1, srq.cloned()) })
    }

    #[test]
    fn the_cache_sees_new_queues_and_forgets_dead_ones() {
        let f = Feeders::new();
        let mut c = FeederCache::new();
        let (a, b) = (queue(1, None), queue(2, None));
        f.attach(&a);
        f.attach(&a);
        assert!(c.find(&f, |q| q.n == 1).is_some(), "a queue attached after the last refresh");
        assert_eq!(c.len(), 1, "attached once");
        f.attach(&b);
        c.refresh_if_changed(&f);
        assert_eq!(c.find(&f, |q| q.n == 2).map(|q| q.n), Some(2));
        assert_eq!(c.find(&f, |q| q.n == 1).map(|q| q.n), Some(1));
        a.rings.kill();
        f.detach_later();
        assert!(c.find(&f, |q| q.n == 1).is_none(), "a dead queue is never found");
        c.refresh_if_changed(&f);
        assert_eq!(c.len(), 1);
        assert!(c.find(&f, |q| q.n == 3).is_none());
    }

    #[test]
    fn an_orphaned_shared_receive_still_frees_its_slot() {
        let slots = Arc::new(SharedSlots::new(5, 2));
        let mut poster = crate::shared_slots::SlotPoster::new(2);
        poster.check_room(&slots, 2).unwrap();
        let slot = poster.take(&slots, 0, 77);
        poster.finish(&slots, 1, 1);
        let f = Feeders::new();
        let q = queue(1, Some(&slots));
        f.attach(&q);
        q.rings.kill();
        drop(q);
        f.retire_orphan(4, slot as usize);
        assert!(poster.check_room(&slots, 2).is_err(), "another shared queue's id frees nothing");
        f.retire_orphan(5, slot as usize);
        poster.check_room(&slots, 2).expect("the slot came back");
        assert!(slots.retire(5, slot as usize).is_none(), "and retired once");
    }
}
