//! Handles: what the C caller holds instead of pointers.
//!
//! A handle is `tag << 56 | generation << 32 | (index + 1)` in a `uintptr_t`. The library never
//! dereferences an integer it was given: it looks the handle up in the table of its kind, which
//! checks the tag (a client handle passed as a server is refused), the index (garbage is
//! refused) and the generation (a destroyed handle whose slot was reused is refused). Handle 0
//! is never valid. Lookups take a read lock (readers do not block each other); only creating
//! and destroying a handle writes.

use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// A handle as C sees it.
pub type Handle = usize;

const GEN_MASK: u32 = 0x00FF_FFFF;

struct Slot<T> {
    generation: u32,
    value: Option<Arc<T>>,
}

struct Inner<T> {
    slots: Vec<Slot<T>>,
    free: Vec<u32>,
}

/// A table of live objects of one kind.
pub struct HandleTable<T> {
    tag: u8,
    inner: RwLock<Inner<T>>,
}

impl<T> std::fmt::Debug for HandleTable<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HandleTable").field("tag", &self.tag).finish()
    }
}

impl<T> HandleTable<T> {
    /// An empty table whose handles carry `tag` (one per kind of object).
    pub const fn new(tag: u8) -> Self {
        HandleTable { tag, inner: RwLock::new(Inner { slots: Vec::new(), free: Vec::new() }) }
    }

    fn read(&self) -> RwLockReadGuard<'_, Inner<T>> {
        self.inner.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, Inner<T>> {
        self.inner.write().unwrap_or_else(|e| e.into_inner())
    }

    fn split(&self, h: Handle) -> Option<(usize, u32)> {
        let h = h as u64;
        if (h >> 56) as u8 != self.tag {
            return None;
        }
        let index = (h & 0xFFFF_FFFF) as usize;
        let generation = ((h >> 32) as u32) & GEN_MASK;
        index.checked_sub(1).map(|i| (i, generation))
    }

    fn join(&self, index: usize, generation: u32) -> Handle {
        ((u64::from(self.tag) << 56) | (u64::from(generation) << 32) | (index as u64 + 1)) as Handle
    }

    /// Stores `value`; returns its new handle.
    pub fn insert(&self, value: Arc<T>) -> Handle {
        let mut t = self.write();
        if let Some(i) = t.free.pop() {
            let slot = &mut t.slots[i as usize];
            slot.value = Some(value);
            return self.join(i as usize, slot.generation);
        }
        let i = t.slots.len();
        t.slots.push(Slot { generation: 1, value: Some(value) });
        self.join(i, 1)
    }

    /// The object behind `h`, if `h` is a live handle of this table.
    pub fn get(&self, h: Handle) -> Option<Arc<T>> {
        let (i, generation) = self.split(h)?;
        let t = self.read();
        let slot = t.slots.get(i)?;
        if slot.generation != generation {
            return None;
        }
        slot.value.clone()
    }

    /// Ends `h` (later lookups of it fail); returns the object if `h` was live.
    pub fn remove(&self, h: Handle) -> Option<Arc<T>> {
        let (i, generation) = self.split(h)?;
        let mut t = self.write();
        let slot = t.slots.get_mut(i)?;
        if slot.generation != generation || slot.value.is_none() {
            return None;
        }
        let value = slot.value.take();
        slot.generation = (slot.generation % GEN_MASK) + 1;
        t.free.push(i as u32);
        value
    }

    /// Every live object with its handle (a snapshot).
    pub fn snapshot(&self) -> Vec<(Handle, Arc<T>)> {
        let t = self.read();
        t.slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.value.clone().map(|v| (self.join(i, s.generation), v)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_foreign_and_garbage_handles_are_refused() {
        let a: HandleTable<u32> = HandleTable::new(1);
        let b: HandleTable<u32> = HandleTable::new(2);
        let h = a.insert(Arc::new(7));
        assert_eq!(a.get(h).as_deref(), Some(&7));
        assert!(b.get(h).is_none(), "another kind's handle");
        for garbage in [0usize, 1, usize::MAX, h + 1, h ^ (1 << 40)] {
            assert!(a.get(garbage).is_none(), "{garbage:#x}");
        }
        assert_eq!(a.remove(h).as_deref(), Some(&7));
        assert!(a.get(h).is_none(), "use after destroy");
        assert!(a.remove(h).is_none(), "double destroy");
        let h2 = a.insert(Arc::new(8));
        assert_ne!(h, h2, "the reused slot has a new generation");
        assert!(a.get(h).is_none());
        assert_eq!(a.get(h2).as_deref(), Some(&8));
    }
}
