//! Doorbells: how a driver tells a device that new work queue entries are ready.
//!
//! The order matters: the entries must be visible to the device *before* it sees the new producer
//! index. So ringing is always "release fence, then store". On real hardware the store is a
//! volatile write into a mapped device page ([`MmioDoorbell`]); in the simulator the register is
//! ordinary memory that a device thread reads, so it is an atomic (which also lets loom see it).
//! Both go through [`ring`], so the fence cannot be forgotten.

use crate::sync::{fence, AtomicU32, Ordering};
use std::ptr::NonNull;
use volatile::VolatilePtr;

/// A 32-bit doorbell register that a producer index is written to.
pub trait DoorbellRegister {
    /// Stores `value` into the register. Callers use [`ring`], which fences first.
    fn store(&self, value: u32);
}

/// Rings a doorbell: a release fence (every earlier write of a work queue entry happens before
/// the device's read of the new index), then the store of the producer index.
#[inline]
pub fn ring<R: DoorbellRegister + ?Sized>(register: &R, producer_index: u32) {
    // loom only: the broken twin without the fence (`sync::mutation`).
    #[cfg(loom)]
    if crate::sync::mutation::active(crate::sync::mutation::Mutant::DoorbellNoFence) {
        register.store(producer_index);
        return;
    }
    fence(Ordering::Release);
    register.store(producer_index);
}

/// A doorbell register in a memory-mapped device page (a BAR mapped through vfio, or a doorbell
/// page a provider library maps).
#[derive(Debug)]
pub struct MmioDoorbell {
    register: NonNull<u32>,
}

// SAFETY: the register is device memory, not Rust-owned data; volatile stores to it from any thread
// are what the hardware expects (the mapping outlives the doorbell by `MmioDoorbell::new`'s contract).
unsafe impl Send for MmioDoorbell {}
// SAFETY: `store` takes `&self` and performs a single volatile write; there is no Rust-visible state.
unsafe impl Sync for MmioDoorbell {}

impl MmioDoorbell {
    /// Wraps a doorbell register.
    ///
    /// # Safety
    /// `register` must point to a 4-byte-aligned doorbell register inside a device mapping that
    /// stays mapped for the lifetime of the returned value.
    pub unsafe fn new(register: NonNull<u32>) -> Self {
        MmioDoorbell { register }
    }
}

impl DoorbellRegister for MmioDoorbell {
    #[inline]
    fn store(&self, value: u32) {
        // SAFETY: `new`'s contract: the pointer is an aligned, mapped register for our lifetime.
        let ptr = unsafe { VolatilePtr::new(self.register) };
        ptr.write(value);
    }
}

/// A doorbell register in ordinary memory, read by a (simulated) device on another thread.
#[derive(Debug, Default)]
pub struct MemoryDoorbell {
    value: AtomicU32,
}

impl MemoryDoorbell {
    /// A register holding 0.
    pub fn new() -> Self {
        Self::default()
    }

    /// The device side: reads the producer index. Pairs with [`ring`]'s release fence through
    /// the acquire here, so entries written before the ring are visible after this load.
    #[inline]
    pub fn load_acquire(&self) -> u32 {
        // loom only: the broken twin with a relaxed load (`sync::mutation`).
        #[cfg(loom)]
        if crate::sync::mutation::active(crate::sync::mutation::Mutant::DoorbellLoadRelaxed) {
            return self.value.load(Ordering::Relaxed);
        }
        self.value.load(Ordering::Acquire)
    }
}

impl DoorbellRegister for MemoryDoorbell {
    #[inline]
    fn store(&self, value: u32) {
        self.value.store(value, Ordering::Relaxed);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn mmio_doorbell_writes_the_register() {
        let mut reg: u32 = 0;
        {
            // SAFETY: `reg` is an aligned u32 that outlives the doorbell (dropped at the brace).
            let db = unsafe { MmioDoorbell::new(NonNull::from(&mut reg)) };
            ring(&db, 42);
            ring(&db, 43);
        }
        assert_eq!(reg, 43);
    }

    #[test]
    fn memory_doorbell_round_trips() {
        let db = MemoryDoorbell::new();
        ring(&db, 7);
        assert_eq!(db.load_acquire(), 7);
    }
}
