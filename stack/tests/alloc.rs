//! A steady loop of blocking 64-byte calls allocates nothing: not on the calling thread, not on
//! the server's worker, not in the simulated NICs. Counted with a global allocator, so the
//! result is deterministic (no timing involved).

use bypass::sim::{Engine, Fabric};
use bypass::{Channel, ChannelConfig, FunctionId, Functions, Server, ServerConfig, Status};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn blocking_64_byte_calls_do_not_allocate_in_steady_state() {
    let fabric = Fabric::new(Engine::Inline);
    let (snic, cnic) = (fabric.add_nic(), fabric.add_nic());
    let echo = FunctionId::new(1, 1, true, 1).unwrap();
    let mut functions = Functions::new();
    functions.register(echo, |req| {
        let _ = req.reply_with(Status::Success, |args, out| {
            out[..args.len()].copy_from_slice(args);
            Ok(args.len())
        });
    });
    let server = Server::bind(&snic, "127.0.0.1:0", ServerConfig::new("alloc"), functions).unwrap();
    let channel = Channel::connect(&cnic, server.local_addr(), ChannelConfig::new("alloc")).unwrap();
    let args = [0x5Au8; 64];
    let mut response = Vec::new();
    for _ in 0..2_000 {
        channel.call(echo, &args, &mut response).unwrap();
    }
    COUNTING.store(true, Ordering::SeqCst);
    for _ in 0..10_000 {
        channel.call(echo, &args, &mut response).unwrap();
    }
    COUNTING.store(false, Ordering::SeqCst);
    assert_eq!(response, args);
    let n = ALLOCATIONS.load(Ordering::SeqCst);
    assert_eq!(n, 0, "{n} heap allocations in 10,000 blocking 64-byte calls (all threads)");
}
