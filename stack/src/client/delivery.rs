//! Delivering a call's outcome to its caller: blocking, callback or `Future`.
//!
//! Exactly one path completes a call (the tx_ctx `claim_completion` decides which, see
//! [`crate::core::tx_ctx`]); that path takes the call's [`Sink`] and delivers into it once. A blocking
//! caller and a [`CallFuture`] share a [`Oneshot`] with the delivering thread; a callback is run
//! on the delivering thread.
//!
//! A blocking caller reuses a few `Oneshot`s per thread (and the response `Vec` it swaps with the
//! caller's), so a steady loop of blocking calls allocates nothing.

#![forbid(unsafe_code)]

use crate::sync::lock;
use crate::RpcError;
use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::thread::Thread;

/// The callback type of [`Channel::call_callback`](crate::Channel::call_callback): it gets the
/// response bytes (borrowed from the receive buffer, valid during the call) or the error.
pub type Callback = Box<dyn FnOnce(Result<&[u8], RpcError>) + Send + 'static>;

/// Where a call's outcome goes.
pub(crate) enum Sink {
    Shot(Arc<Oneshot>),
    Callback(Callback),
}

impl Sink {
    /// Delivers the outcome. A callback that panics is contained here: the panic does not
    /// unwind into the stack (which still has to release the call's send context) or into the
    /// unrelated caller whose poll happened to deliver it. Returns whether the callback panicked.
    pub(crate) fn deliver(self, result: Result<&[u8], RpcError>) -> bool {
        match self {
            Sink::Shot(shot) => {
                shot.deliver(result);
                false
            }
            Sink::Callback(cb) => {
                // AssertUnwindSafe: the callback owns everything it captured and is consumed;
                // after a panic nothing of it is used again. No cost unless it panics.
                match std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || cb(result))) {
                    Ok(()) => false,
                    Err(payload) => {
                        // Dropping the payload could itself panic (a payload with a panicking
                        // Drop); contain that too.
                        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(payload)));
                        true
                    }
                }
            }
        }
    }

    /// The server acknowledged the request (ACK mode): observable before the response.
    pub(crate) fn acked(&self) {
        if let Sink::Shot(shot) = self {
            shot.acked.store(true, Ordering::Release);
            if let Some(w) = lock(&shot.inner).waker.as_ref() {
                w.wake_by_ref();
            }
        }
    }
}

#[derive(Default)]
struct Inner {
    result: Option<Result<(), RpcError>>,
    data: Vec<u8>,
    waker: Option<Waker>,
    thread: Option<Thread>,
}

/// A one-time slot shared by the caller and the delivering thread.
#[derive(Default)]
pub(crate) struct Oneshot {
    done: AtomicBool,
    acked: AtomicBool,
    inner: Mutex<Inner>,
}

impl Oneshot {
    fn deliver(&self, result: Result<&[u8], RpcError>) {
        let (waker, thread) = {
            let mut inner = lock(&self.inner);
            inner.data.clear();
            inner.result = Some(match result {
                Ok(bytes) => {
                    inner.data.extend_from_slice(bytes);
                    Ok(())
                }
                Err(e) => Err(e),
            });
            self.done.store(true, Ordering::Release);
            (inner.waker.take(), inner.thread.take())
        };
        if let Some(w) = waker {
            w.wake();
        }
        if let Some(t) = thread {
            t.unpark();
        }
    }

    pub(crate) fn is_done(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }

    pub(crate) fn is_acked(&self) -> bool {
        self.acked.load(Ordering::Acquire)
    }

    /// Registers the current thread to be unparked on delivery; false if already delivered.
    pub(crate) fn register_thread(&self) -> bool {
        let mut inner = lock(&self.inner);
        if inner.result.is_some() {
            return false;
        }
        if inner.thread.is_none() {
            inner.thread = Some(std::thread::current());
        }
        true
    }

    /// Takes the outcome, swapping the response bytes into `out` (no copy, no allocation).
    pub(crate) fn take_into(&self, out: &mut Vec<u8>) -> Option<Result<(), RpcError>> {
        let mut inner = lock(&self.inner);
        let result = inner.result.take()?;
        if result.is_ok() {
            std::mem::swap(out, &mut inner.data);
        }
        inner.data.clear();
        Some(result)
    }

    fn reset(&self) {
        self.done.store(false, Ordering::Relaxed);
        self.acked.store(false, Ordering::Relaxed);
        let mut inner = lock(&self.inner);
        inner.result = None;
        inner.waker = None;
        inner.thread = None;
    }
}

/// Oneshots kept per thread for blocking calls. A delivering thread drops its reference just
/// after the caller sees the outcome, so the one used last may still be shared when the next call
/// starts; with a few in rotation the next call practically always finds a free one and a steady
/// loop of blocking calls allocates nothing.
const SHOTS_PER_THREAD: usize = 3;

thread_local! {
    static SHOTS: RefCell<Vec<Arc<Oneshot>>> = const { RefCell::new(Vec::new()) };
}

/// A cleared `Oneshot` for a blocking call on this thread, reused when no other thread still
/// holds it.
pub(crate) fn blocking_shot() -> Arc<Oneshot> {
    SHOTS.with(|s| {
        let mut shots = s.borrow_mut();
        if shots.is_empty() {
            shots.extend((0..SHOTS_PER_THREAD).map(|_| Arc::new(Oneshot::default())));
        }
        match shots.iter().position(|shot| Arc::strong_count(shot) == 1) {
            Some(i) => {
                let shot = shots.swap_remove(i);
                shot.reset();
                shot
            }
            None => Arc::new(Oneshot::default()),
        }
    })
}

/// Gives a blocking call's `Oneshot` back for the next call on this thread.
pub(crate) fn recycle_shot(shot: Arc<Oneshot>) {
    SHOTS.with(|s| {
        let mut shots = s.borrow_mut();
        if shots.len() < SHOTS_PER_THREAD {
            shots.push(shot);
        }
    });
}

/// The pending result of [`Channel::call_future`](crate::Channel::call_future): a
/// runtime-agnostic `Future` resolving to the response bytes or the error.
///
/// Something must poll the channel for it to resolve: a [`WorkerGroup`](crate::WorkerGroup) the
/// channel was added to, or a thread calling [`Channel::poll`](crate::Channel::poll). Dropping
/// the future does not cancel the call; its outcome is discarded when it arrives (or at its
/// deadline).
#[must_use = "a call future does nothing useful unless awaited or polled"]
pub struct CallFuture {
    pub(crate) shot: Arc<Oneshot>,
}

impl CallFuture {
    /// Whether the server has acknowledged the request (ACK modes): may turn true before the
    /// response arrives.
    pub fn is_acked(&self) -> bool {
        self.shot.is_acked()
    }

    /// Whether the outcome has arrived (polling the future will return `Ready`).
    pub fn is_done(&self) -> bool {
        self.shot.is_done()
    }
}

impl std::fmt::Debug for CallFuture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallFuture").field("acked", &self.is_acked()).field("done", &self.is_done()).finish()
    }
}

impl Future for CallFuture {
    type Output = Result<Vec<u8>, RpcError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut inner = lock(&self.shot.inner);
        if let Some(result) = inner.result.take() {
            let data = std::mem::take(&mut inner.data);
            return Poll::Ready(result.map(|()| data));
        }
        match &inner.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            _ => inner.waker = Some(cx.waker().clone()),
        }
        Poll::Pending
    }
}
