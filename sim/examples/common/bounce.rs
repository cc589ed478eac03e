//! Shared by the benchmark examples (included with `#[path]`): the bare cost of moving one cache
//! line between two threads, printed before two-thread figures because on a shared VM it changes
//! when the host moves the vCPUs, and every two-thread round trip moves with it.

use std::time::Instant;

/// The machine's floor: one cache line bounced between two threads (an `AtomicU64` each side
/// waits on). Two-thread figures on a shared VM move with it. Returns ns per round trip.
pub fn bounce(iters: u64) -> f64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    let line = std::sync::Arc::new(AtomicU64::new(0));
    let peer = line.clone();
    let t = std::thread::spawn(move || {
        for i in 0..iters {
            while peer.load(Ordering::Acquire) != 2 * i + 1 {
                std::hint::spin_loop();
            }
            peer.store(2 * i + 2, Ordering::Release);
        }
    });
    let start = Instant::now();
    for i in 0..iters {
        line.store(2 * i + 1, Ordering::Release);
        while line.load(Ordering::Acquire) != 2 * i + 2 {
            std::hint::spin_loop();
        }
    }
    let ns = start.elapsed().as_nanos() as f64 / iters as f64;
    t.join().expect("bounce thread");
    ns
}
