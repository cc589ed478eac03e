//! The queues attached to one completion queue, keyed by queue-table slot.
//!
//! A CQ's poller maps each CQE's queue number to the queue's side tables. Indexing a plain
//! vector by slot made every CQ's table as long as the highest slot attached to it, so with one
//! CQ per connection memory grew with the square of the open queues. This table is a compact
//! vector of the attached queues plus an open-addressed index (linear probing, at most half
//! full) from slot to position in it: its size follows the queues attached to this CQ, lookup is
//! O(1), and neither lookup nor a copy into an equally large table allocates.

/// Slot → value, sized by the entries it holds (see the module doc).
#[derive(Debug)]
pub(crate) struct AttachTable<V> {
    /// The entries, in no particular order (removal swaps the last one in).
    entries: Vec<(usize, V)>,
    /// Open-addressed index: 0 is empty, `i + 1` is `entries[i]`. Its length is 0 or a power of
    /// two at least twice `entries.len()`.
    index: Vec<u32>,
}

/// The smallest index a non-empty table has.
const MIN_INDEX: usize = 8;

impl<V> Default for AttachTable<V> {
    fn default() -> Self {
        AttachTable { entries: Vec::new(), index: Vec::new() }
    }
}

impl<V: Clone> Clone for AttachTable<V> {
    fn clone(&self) -> Self {
        AttachTable { entries: self.entries.clone(), index: self.index.clone() }
    }

    /// Reuses this table's allocations (the poller refreshes its copy this way).
    fn clone_from(&mut self, source: &Self) {
        self.entries.clone_from(&source.entries);
        self.index.clone_from(&source.index);
    }
}

#[inline]
fn home(key: usize, mask: usize) -> usize {
    // Fibonacci hashing: spreads runs of neighbouring slots over the index.
    ((key as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as usize & mask
}

impl<V> AttachTable<V> {
    /// Number of entries.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Memory held, in entries and index cells (for tests of the bound).
    #[cfg(test)]
    pub(crate) fn footprint(&self) -> (usize, usize) {
        (self.entries.capacity(), self.index.capacity())
    }

    /// Position in `index` of `key`'s cell, if present.
    #[inline]
    fn position(&self, key: usize) -> Option<usize> {
        if self.index.is_empty() {
            return None;
        }
        let mask = self.index.len() - 1;
        let mut p = home(key, mask);
        loop {
            match self.index[p] {
                0 => return None,
                e if self.entries[e as usize - 1].0 == key => return Some(p),
                _ => p = (p + 1) & mask,
            }
        }
    }

    /// The value at `key`.
    #[inline]
    pub(crate) fn get(&self, key: usize) -> Option<&V> {
        let p = self.position(key)?;
        Some(&self.entries[self.index[p] as usize - 1].1)
    }

    /// Sets `key` to `value`, replacing any value it had.
    pub(crate) fn insert(&mut self, key: usize, value: V) {
        if let Some(p) = self.position(key) {
            self.entries[self.index[p] as usize - 1].1 = value;
            return;
        }
        if (self.entries.len() + 1) * 2 > self.index.len() {
            self.rebuild((self.index.len() * 2).max(MIN_INDEX));
        }
        self.entries.push((key, value));
        let e = self.entries.len() as u32;
        self.place(key, e);
    }

    /// Removes `key` if `remove` says its value should go; returns the value removed.
    pub(crate) fn remove_if(&mut self, key: usize, remove: impl FnOnce(&V) -> bool) -> Option<V> {
        let p = self.position(key)?;
        let ei = self.index[p] as usize - 1;
        if !remove(&self.entries[ei].1) {
            return None;
        }
        // Backward-shift deletion: later cells of the probe run move into the hole when their
        // home is not between the hole and where they are.
        let mask = self.index.len() - 1;
        let (mut hole, mut j) = (p, p);
        loop {
            j = (j + 1) & mask;
            let e = self.index[j];
            if e == 0 {
                break;
            }
            let h = home(self.entries[e as usize - 1].0, mask);
            if (j.wrapping_sub(h) & mask) >= (j.wrapping_sub(hole) & mask) {
                self.index[hole] = e;
                hole = j;
            }
        }
        self.index[hole] = 0;
        let last = self.entries.len() - 1;
        let (_, value) = self.entries.swap_remove(ei);
        if ei != last {
            // The former last entry is now at `ei`: repoint its cell.
            let moved = self.entries[ei].0;
            let mut q = home(moved, mask);
            while self.index[q] as usize != last + 1 {
                q = (q + 1) & mask;
            }
            self.index[q] = ei as u32 + 1;
        }
        // Give memory back once the table is mostly empty (hysteresis: no flapping).
        if self.entries.is_empty() {
            *self = Self::default();
        } else {
            if self.entries.len() * 8 <= self.index.len() && self.index.len() > MIN_INDEX {
                self.rebuild(self.index.len() / 2);
            }
            if self.entries.len() * 4 <= self.entries.capacity() {
                self.entries.shrink_to(self.entries.len() * 2);
            }
        }
        Some(value)
    }

    /// Puts entry number `e` (1-based) for `key` into the index (`key` is not there).
    fn place(&mut self, key: usize, e: u32) {
        let mask = self.index.len() - 1;
        let mut p = home(key, mask);
        while self.index[p] != 0 {
            p = (p + 1) & mask;
        }
        self.index[p] = e;
    }

    /// Rebuilds the index with `cells` cells (a power of two above twice the entries).
    fn rebuild(&mut self, cells: usize) {
        self.index = vec![0; cells];
        for i in 0..self.entries.len() {
            self.place(self.entries[i].0, i as u32 + 1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::AttachTable;
    use std::collections::HashMap;

    /// Many queues attached to many CQs then mostly detached: every table stays proportional to
    /// what it holds (a slot-indexed table would hold the highest slot for each CQ), and lookups
    /// agree with a reference map throughout.
    #[test]
    fn many_queues_on_many_cqs_stay_bounded() {
        const CQS: usize = 200;
        const QUEUES: usize = 10_000;
        let mut cqs: Vec<AttachTable<u32>> = (0..CQS).map(|_| AttachTable::default()).collect();
        let mut model: Vec<HashMap<usize, u32>> = vec![HashMap::new(); CQS];
        // Each queue (slot 2..) on two CQs, as a queue's send and receive CQs.
        for q in 0..QUEUES {
            let slot = q + 2;
            for cq in [q % CQS, (q * 7 + 3) % CQS] {
                cqs[cq].insert(slot, q as u32);
                model[cq].insert(slot, q as u32);
            }
        }
        let check = |cqs: &[AttachTable<u32>], model: &[HashMap<usize, u32>]| {
            let mut cells = 0;
            for (t, m) in cqs.iter().zip(model) {
                assert_eq!(t.len(), m.len());
                let (e, i) = t.footprint();
                // Shrinking lags growing by a factor of two (hysteresis), hence 4× and 8×.
                let n = m.len().max(4);
                assert!(e <= 4 * n && i <= 8 * n, "{e} entries, {i} index cells for {} queues", m.len());
                cells += e + i;
                for slot in 0..QUEUES + 4 {
                    assert_eq!(t.get(slot), m.get(&slot), "slot {slot}");
                }
            }
            cells
        };
        let full = check(&cqs, &model);
        // 2 × 10,000 attachments: a few cells each, not CQS × QUEUES (2,000,000).
        assert!(full <= 20 * 2 * QUEUES, "{full} cells for {} attachments", 2 * QUEUES);
        // Detach 90% of each CQ's queues (all but one round of ten), in an order unlike the
        // attach order.
        for q in (0..QUEUES).rev().filter(|q| (q / CQS) % 10 != 0) {
            let slot = q + 2;
            for cq in [q % CQS, (q * 7 + 3) % CQS] {
                let gone = cqs[cq].remove_if(slot, |&v| v == q as u32);
                assert_eq!(gone, model[cq].remove(&slot));
            }
        }
        let left = check(&cqs, &model);
        assert!(left <= full / 3, "{left} cells left of {full} after detaching 90%");
        // A remove that does not match leaves the entry.
        assert_eq!(cqs[0].remove_if(2, |&v| v == 12345), None);
        assert_eq!(cqs[0].get(2), Some(&0));
        for (cq, m) in model.iter().enumerate() {
            for (&slot, &v) in m {
                assert_eq!(cqs[cq].remove_if(slot, |_| true), Some(v));
            }
            assert_eq!(cqs[cq].footprint(), (0, 0));
        }
    }

    /// The poller's copy reuses its allocations when the source has not grown.
    #[test]
    fn clone_from_keeps_the_copy_in_sync() {
        let mut a = AttachTable::default();
        for s in 2..50 {
            a.insert(s, s * 3);
        }
        let mut b = AttachTable::default();
        b.clone_from(&a);
        a.remove_if(10, |_| true);
        a.insert(10, 99);
        b.clone_from(&a);
        assert_eq!(b.get(10), Some(&99));
        assert_eq!(b.get(11), Some(&33));
        assert_eq!(b.get(50), None);
    }
}
