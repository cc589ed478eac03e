//! A global allocator that counts allocations while counting is on: for the tests that prove a
//! path allocates nothing. Each such test is its own binary, so no other test's allocations mix
//! in. Include with `#[path = "common/counting_alloc.rs"] mod counting_alloc;`.
//!
//! A count alone does not say what to fix, so the first [`KEPT`] counted allocations also record
//! where they happened: the thread's name, the size and a backtrace. [`report`] formats them for
//! the assertion message. Recording allocates; a thread-local flag keeps those allocations out of
//! the count and out of the recording itself.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

pub struct Counting;

pub static COUNTING: AtomicBool = AtomicBool::new(false);
pub static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

/// How many counted allocations keep their backtrace.
const KEPT: usize = 3;

static SITES: Mutex<Vec<String>> = Mutex::new(Vec::new());

thread_local! {
    /// True while this thread records a site: its allocations are the recording's own.
    static RECORDING: Cell<bool> = const { Cell::new(false) };
}

fn count(size: usize) {
    if !COUNTING.load(Ordering::Relaxed) {
        return;
    }
    // `try_with`: a thread being torn down has no thread-locals left; count without a site.
    let recording = RECORDING.try_with(|r| r.replace(true)).unwrap_or(true);
    if recording {
        return;
    }
    let n = ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    if (n as usize) < KEPT {
        let thread = std::thread::current();
        let site = format!(
            "allocation {} of {} bytes on thread {:?}:\n{}",
            n + 1,
            size,
            thread.name().unwrap_or("<unnamed>"),
            std::backtrace::Backtrace::force_capture()
        );
        SITES.lock().unwrap_or_else(|e| e.into_inner()).push(site);
    }
    let _ = RECORDING.try_with(|r| r.set(false));
}

/// Where the first counted allocations happened, for a failing assertion's message.
pub fn report() -> String {
    SITES.lock().unwrap_or_else(|e| e.into_inner()).join("\n")
}

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size);
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;
