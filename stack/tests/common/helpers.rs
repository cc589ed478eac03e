//! Small pieces several test binaries share: an echo service, bounded waits, polling a future
//! by hand (part of [`super`], `mod common;`).

use super::ids::{ECHO, HOLD};
use bypass::sim::SimNic;
use bypass::{FunctionId, Functions, Request, Status};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

/// Longest any single wait may take before the test gives up.
pub const WAIT_LIMIT: Duration = Duration::from_secs(30);

/// A service whose function `id` answers with its arguments.
pub fn echo_functions(id: FunctionId) -> Functions<SimNic> {
    let mut f = Functions::new();
    f.register(id, |req| {
        let _ = req.reply_with(Status::Success, |args, out| {
            out.get_mut(..args.len()).ok_or(args.len())?.copy_from_slice(args);
            Ok(args.len())
        });
    });
    f
}

/// Waits (at most [`WAIT_LIMIT`]) until `cond` holds, calling `drive` between looks; panics
/// naming `what` and how many rounds it looked.
pub fn until(what: &str, mut drive: impl FnMut(), mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    let mut rounds = 0u64;
    while !cond() {
        assert!(start.elapsed() < WAIT_LIMIT, "gave up waiting for {what} after {rounds} rounds");
        drive();
        std::thread::yield_now();
        rounds += 1;
    }
}

/// [`until`] with nothing to drive: something else (a worker, a device thread) makes progress.
pub fn wait_for(what: &str, cond: impl FnMut() -> bool) {
    until(what, || {}, cond)
}

/// Polls a future once with a waker that does nothing; `None` while it is pending.
pub fn poll_once<F: Future + Unpin>(f: &mut F) -> Option<F::Output> {
    struct Noop;
    impl Wake for Noop {
        fn wake(self: Arc<Self>) {}
    }
    let waker = Waker::from(Arc::new(Noop));
    match Pin::new(f).poll(&mut Context::from_waker(&waker)) {
        Poll::Ready(v) => Some(v),
        Poll::Pending => None,
    }
}

/// Requests a HOLD handler keeps, in arrival order, until the test answers or drops them.
pub type Held = Arc<Mutex<Vec<Request<SimNic>>>>;

/// A service with ECHO (answers its arguments, from a copy: `Request::reply`) and HOLD (keeps
/// the request in `held`).
pub fn echo_and_hold(held: &Held) -> Functions<SimNic> {
    let mut f = Functions::new();
    f.register(ECHO, |req| {
        let args = req.args().to_vec();
        let _ = req.reply(&args);
    });
    let h = held.clone();
    f.register(HOLD, move |req| h.lock().unwrap_or_else(|e| e.into_inner()).push(req));
    f
}
