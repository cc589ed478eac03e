//! The process's control-plane event loop: one thread (`bypass-ctl`) watches the control stream
//! of every client channel and every server connection in the process and runs their keepalive
//! timers, so a connection costs no thread of its own.
//!
//! It waits in `epoll_wait(2)` (level-triggered) on every watched stream's socket and on its own
//! eventfd, with a timeout to the earliest timer (a binary heap of deadlines, stale entries
//! skipped). What a watched connection does on each event is its [`Watch`] implementation
//! (`client::monitor`, `server::monitor`); everything it does on the loop is bounded local work
//! that never waits on a peer and runs no application code: judging a closed stream, a
//! keepalive look (polling the channel, starting a probe call).
//!
//! Application code — completion and break callbacks, a server's connection events, a custom
//! rendezvous allocator — never runs on the loop, where one callback that blocked would stall
//! every connection. A connection the loop finds closed (its stream ended, keepalive gave up) is
//! closed *aside* (below), where its callbacks run; a callback call the loop itself finishes
//! while polling an idle channel has its outcome copied and delivered aside
//! (`client::deferred`); [`on_loop`] tells the code underneath where it runs. The exception is
//! a connection the loop lets go of ([`Watch::abandon`]) — its handling panicked, the loop
//! itself panicked, or no aside thread could be started for it in time: that one is closed, and
//! its callbacks run, on the loop.
//!
//! The rare exchanges that block on a peer — a client's queue recovery, a server answering a
//! queue reset — are run *aside*: the loop stops watching the stream and hands the connection to
//! a short-lived thread (`bypass-ctl-aside`, at most 16 at once: more connections aside wait
//! their turn), which does the exchange with ordinary blocking reads and writes (TLS included)
//! and then gives the connection back to the loop. Other connections are never stalled by one
//! peer. The loop never runs that work itself: if no aside thread can be started (the process
//! is out of threads or memory) the connection waits in the aside queue, and the loop tries
//! again every [`ASIDE_RETRY`]; after [`ASIDE_GIVE_UP`] without any thread the waiting
//! connections are closed ([`CloseReason::ControlLost`](crate::CloseReason::ControlLost), the
//! error on stderr).
//!
//! The loop starts with the first watched connection and ends when none is left (including none
//! in the queue of new ones, and none waiting for an aside thread to be started); the next one
//! starts it again. A panic inside one connection's handling is contained: that connection is
//! no longer watched (its stream is dropped, which the peer sees as closure), the others go on.
//! A panic of the loop's own code closes every connection it held (see [`run`]); the next
//! connection starts a new loop.

use crate::os::{self, WakeFd};
use crate::sync::lock;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::os::fd::{OwnedFd, RawFd};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};
use std::time::Instant;

thread_local! {
    /// Set for good on the loop's thread (see [`on_loop`]).
    static ON_LOOP: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether the calling thread is the control loop, where no application code may run (the
/// module documentation says what is done instead).
pub(crate) fn on_loop() -> bool {
    ON_LOOP.with(std::cell::Cell::get)
}

/// What the loop does with a connection after one of its events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Go on watching it.
    Keep,
    /// Stop watching it (closed, or gone): it is dropped, and its stream with it.
    Done,
    /// Run [`Watch::aside`] on a short-lived thread, then watch it again if that says so.
    Aside,
}

/// A connection the loop watches: its control stream's socket and its timers.
pub(crate) trait Watch: Send + 'static {
    /// The socket to wait on (readable, or hung up).
    fn fd(&self) -> RawFd;
    /// Whether bytes already wait inside the stream (decrypted TLS records) that will not make
    /// the socket readable again. Asked whenever the connection is (re)registered.
    fn has_buffered(&mut self) -> bool;
    /// The socket is readable or hung up (or [`has_buffered`](Self::has_buffered) said so).
    fn on_readable(&mut self) -> Step;
    /// Its [`deadline`](Self::deadline) passed.
    fn on_timer(&mut self, now: Instant) -> Step;
    /// Someone called [`wake`]: look whether there is work (a queue to recover, a closed
    /// connection). Also asked when the connection is (re)registered.
    fn on_wake(&mut self) -> Step;
    /// When [`on_timer`](Self::on_timer) should run next (`None`: no timer).
    fn deadline(&self) -> Option<Instant>;
    /// The blocking part, off the loop; returns whether the loop should watch it again.
    fn aside(&mut self) -> bool;
    /// The loop lets go of it without its having said [`Step::Done`]: one of its methods
    /// panicked, it could not be registered, no thread could be started for its
    /// [`aside`](Self::aside) work, or the loop itself is going away. Its stream is
    /// not the connection's only handle on the socket, so dropping it tells nobody: close the
    /// connection here, so that its calls end and its peer sees the close.
    fn abandon(&mut self);
}

/// The running loop's wake-up and new connections.
struct Shared {
    epoll: OwnedFd,
    wake: WakeFd,
}

struct State {
    /// The running loop (`None`: no thread; the next [`watch`] starts one).
    running: Option<Arc<Shared>>,
    /// Connections handed over and not yet taken by the loop.
    new: Vec<Box<dyn Watch>>,
    /// [`wake`] was called: every connection is to be asked [`Watch::on_wake`].
    scan: bool,
}

static STATE: Mutex<State> = Mutex::new(State { running: None, new: Vec::new(), scan: false });

/// The epoll data of the loop's own eventfd.
const WAKE_KEY: u64 = u64::MAX;

/// Hands `w` to the loop (starting it if none runs). On error (no thread or epoll instance could
/// be made) `w` is dropped.
pub(crate) fn watch(w: Box<dyn Watch>) -> std::io::Result<()> {
    let mut st = lock(&STATE);
    let shared = match &st.running {
        Some(s) => s.clone(),
        None => {
            let started = Shared::new().map(Arc::new).and_then(|s| {
                let t = s.clone();
                std::thread::Builder::new().name("bypass-ctl".into()).spawn(move || run(t))?;
                Ok(s)
            });
            match started {
                Ok(s) => {
                    st.running = Some(s.clone());
                    s
                }
                Err(e) => {
                    drop(st);
                    abandon(w);
                    return Err(e);
                }
            }
        }
    };
    st.new.push(w);
    drop(st);
    shared.wake.signal();
    Ok(())
}

/// Makes the loop ask every connection [`Watch::on_wake`] (a queue waits for recovery).
pub(crate) fn wake() {
    let mut st = lock(&STATE);
    if let Some(s) = &st.running {
        s.wake.signal();
        st.scan = true;
    }
}

impl Shared {
    fn new() -> std::io::Result<Self> {
        let epoll = os::epoll_create()?;
        let wake = WakeFd::new()?;
        let s = Shared { epoll, wake };
        s.ctl(libc::EPOLL_CTL_ADD, s.wake.raw(), WAKE_KEY)?;
        Ok(s)
    }

    fn ctl(&self, op: libc::c_int, fd: RawFd, key: u64) -> std::io::Result<()> {
        os::epoll_ctl(&self.epoll, op, fd, key)
    }
}

/// A watched connection in the loop's table.
struct Entry {
    w: Box<dyn Watch>,
    /// The deadline in the heap for it (`None`: none), and its generation (older heap items
    /// for this slot are stale).
    scheduled: Option<Instant>,
    gen: u64,
}

/// The loop's own table: slots of entries and the timer heap. Every connection the loop holds
/// is in it (in `slots`, or in `incoming` until registered), so that a panic of the loop can
/// close them all ([`run`]).
struct Table {
    slots: Vec<Option<Entry>>,
    free: Vec<usize>,
    live: usize,
    timers: BinaryHeap<Reverse<(Instant, usize, u64)>>,
    next_gen: u64,
    /// New connections taken from [`State::new`] and not registered yet.
    incoming: std::collections::VecDeque<Box<dyn Watch>>,
}

impl Table {
    fn insert(&mut self, shared: &Shared, w: Box<dyn Watch>) {
        let idx = self.free.pop().unwrap_or_else(|| {
            self.slots.push(None);
            self.slots.len() - 1
        });
        // In its slot before anything of it runs: should that panic, the loop still holds it.
        self.slots[idx] = Some(Entry { w, scheduled: None, gen: 0 });
        self.live += 1;
        let fd = self.slots[idx].as_ref().map_or(-1, |e| e.w.fd());
        if let Err(e) = shared.ctl(libc::EPOLL_CTL_ADD, fd, idx as u64) {
            let e = self.remove_unregistered(idx, e);
            abandon(e.w);
            return;
        }
        let step = guarded(self.slots[idx].as_mut(), |e| {
            if e.w.has_buffered() {
                e.w.on_readable()
            } else {
                e.w.on_wake()
            }
        });
        self.apply(shared, idx, step);
    }

    /// Carries out `step` for slot `idx` (and reschedules its timer if it stays).
    fn apply(&mut self, shared: &Shared, idx: usize, step: Step) {
        let Some(e) = self.slots[idx].as_mut() else { return };
        match step {
            Step::Keep => {
                let d = e.w.deadline();
                if d != e.scheduled {
                    self.next_gen += 1;
                    e.gen = self.next_gen;
                    e.scheduled = d;
                    if let Some(d) = d {
                        self.timers.push(Reverse((d, idx, e.gen)));
                    }
                }
            }
            Step::Done | Step::Aside => {
                let e = self.remove(shared, idx);
                if step == Step::Aside {
                    run_aside(e.w);
                }
            }
        }
    }

    fn remove(&mut self, shared: &Shared, idx: usize) -> Entry {
        if let Some(e) = self.slots[idx].as_ref() {
            let _ = shared.ctl(libc::EPOLL_CTL_DEL, e.w.fd(), 0);
        }
        let e = self.slots[idx].take().expect("a live slot");
        self.free.push(idx);
        self.live -= 1;
        e
    }

    /// Takes back the entry of slot `idx`, which epoll refused to watch (`e`).
    fn remove_unregistered(&mut self, idx: usize, e: std::io::Error) -> Entry {
        eprintln!("bypass: the control loop cannot watch a control stream (epoll_ctl: {e}); closing it");
        let entry = self.slots[idx].take().expect("the slot just filled");
        self.free.push(idx);
        self.live -= 1;
        entry
    }
}

/// Runs `f` on the entry; a panic is reported, the connection abandoned ([`Watch::abandon`]),
/// and counts as [`Step::Done`].
fn guarded(e: Option<&mut Entry>, f: impl FnOnce(&mut Entry) -> Step) -> Step {
    let Some(e) = e else { return Step::Done };
    match catch_unwind(AssertUnwindSafe(|| f(e))) {
        Ok(step) => step,
        Err(payload) => {
            let _ = catch_unwind(AssertUnwindSafe(move || drop(payload)));
            eprintln!(
                "bypass: the control loop's handling of a connection panicked; that connection is closed"
            );
            let _ = catch_unwind(AssertUnwindSafe(|| e.w.abandon()));
            Step::Done
        }
    }
}

/// Lets go of `w` with [`Watch::abandon`], containing a panic in it.
fn abandon(mut w: Box<dyn Watch>) {
    if catch_unwind(AssertUnwindSafe(|| w.abandon())).is_err() {
        eprintln!("bypass: closing a connection the control loop let go of panicked");
    }
    let _ = catch_unwind(AssertUnwindSafe(move || drop(w)));
}

/// Most aside threads at once; connections beyond wait in [`ASIDE`]'s queue for one to be free
/// (a recovery storm — every channel of a failed NIC — does not start a thread per channel).
const MAX_ASIDE_THREADS: usize = 16;

/// How often the loop tries again to start an aside thread while connections wait for one and
/// none runs (the last start failed).
const ASIDE_RETRY: std::time::Duration = std::time::Duration::from_millis(10);

/// How long connections wait for an aside thread that cannot be started before they are
/// closed: by then the process has been out of threads (or memory) for a while, and a
/// connection whose recovery cannot run is better closed, with a reason, than left hanging.
const ASIDE_GIVE_UP: std::time::Duration = std::time::Duration::from_secs(1);

/// Aside threads running, and connections waiting for one.
struct Aside {
    threads: usize,
    queue: std::collections::VecDeque<Box<dyn Watch>>,
    /// Connections wait and no aside thread runs, since no thread could be started: since when,
    /// and when the loop tries again (`None`: not stuck).
    stuck: Option<(Instant, Instant)>,
}

static ASIDE: Mutex<Aside> =
    Mutex::new(Aside { threads: 0, queue: std::collections::VecDeque::new(), stuck: None });

/// Runs `w.aside()` off the loop, on a short-lived thread (at most [`MAX_ASIDE_THREADS`]; each
/// takes the waiting connections one after another before it ends), then hands it back to the
/// loop. Never runs it here, on the loop: if no thread can be started, `w` waits in the queue
/// for the loop's next try ([`retry_aside`]), or for an aside thread started meanwhile.
fn run_aside(w: Box<dyn Watch>) {
    {
        let mut a = lock(&ASIDE);
        a.queue.push_back(w);
        if a.threads >= MAX_ASIDE_THREADS {
            return;
        }
        a.threads += 1;
    }
    start_aside_thread();
}

/// Starts an aside thread (its count already taken). On failure the count is given back; if
/// then no aside thread runs while connections wait, the queue is *stuck* until the loop's
/// [`retry_aside`] succeeds or gives up.
fn start_aside_thread() {
    let err = match spawn_aside() {
        Ok(()) => {
            lock(&ASIDE).stuck = None;
            return;
        }
        Err(e) => e,
    };
    let first = {
        let mut a = lock(&ASIDE);
        a.threads -= 1;
        if a.threads > 0 || a.queue.is_empty() {
            // A running thread takes the waiting ones before it ends.
            return;
        }
        let now = Instant::now();
        let first = a.stuck.is_none();
        let since = a.stuck.map_or(now, |(since, _)| since);
        a.stuck = Some((since, now + ASIDE_RETRY));
        first
    };
    if first {
        eprintln!(
            "bypass: the control loop cannot start a thread for a connection's blocking control exchange \
             ({err}); it tries again for {ASIDE_GIVE_UP:?}, then closes the connection"
        );
    }
}

/// Starts a thread running [`aside_thread`].
fn spawn_aside() -> std::io::Result<()> {
    #[cfg(test)]
    if tests::refuse_spawn() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::WouldBlock,
            "the test refuses to start a thread",
        ));
    }
    std::thread::Builder::new().name("bypass-ctl-aside".into()).spawn(aside_thread).map(drop)
}

/// The loop's turn on a stuck aside queue (see [`start_aside_thread`]): tries again to start a
/// thread when it is time, closes the waiting connections after [`ASIDE_GIVE_UP`]. Returns when
/// to look again (`None`: not stuck).
fn retry_aside(now: Instant) -> Option<Instant> {
    let given_up = {
        let mut a = lock(&ASIDE);
        let (since, at) = a.stuck?;
        if a.threads > 0 || a.queue.is_empty() {
            a.stuck = None;
            return None;
        }
        if now < at {
            return Some(at);
        }
        if now.duration_since(since) < ASIDE_GIVE_UP {
            a.threads += 1;
            None
        } else {
            a.stuck = None;
            Some(std::mem::take(&mut a.queue))
        }
    };
    match given_up {
        None => {
            start_aside_thread();
            lock(&ASIDE).stuck.map(|(_, at)| at)
        }
        Some(waiting) => {
            eprintln!(
                "bypass: no thread could be started for {ASIDE_GIVE_UP:?} to run the blocking control exchange \
                 of {} connection(s) (queue recovery); they are closed",
                waiting.len()
            );
            waiting.into_iter().for_each(abandon);
            None
        }
    }
}

/// The connections of a stuck aside queue, taken out (the loop that would retry is gone).
fn take_stuck_aside() -> std::collections::VecDeque<Box<dyn Watch>> {
    let mut a = lock(&ASIDE);
    if a.stuck.take().is_none() || a.threads > 0 {
        return Default::default();
    }
    std::mem::take(&mut a.queue)
}

/// Takes waiting connections until none is left.
fn aside_thread() {
    loop {
        let next = {
            let mut a = lock(&ASIDE);
            let next = a.queue.pop_front();
            if next.is_none() {
                a.threads -= 1;
            }
            next
        };
        let Some(mut w) = next else { return };
        match catch_unwind(AssertUnwindSafe(|| w.aside())) {
            Ok(true) => {
                // On failure `watch` has abandoned it.
                let _ = watch(w);
            }
            Ok(false) => {}
            Err(_) => {
                eprintln!("bypass: the control loop's aside work on a connection panicked; that connection is closed");
                abandon(w);
            }
        }
    }
}

/// The loop thread: runs [`run_loop`]; should it panic (outside [`guarded`]), the connections
/// it held (registered, or taken from the queue of new ones and not registered yet), the new
/// ones waiting for it and those waiting for it to start an aside thread are abandoned — closed
/// with [`CloseReason::ControlLost`](crate::CloseReason::ControlLost), after the unwind, not
/// during it, since closing runs callbacks — and the next [`watch`] starts a new loop, instead
/// of handing connections to a loop that is gone.
fn run(shared: Arc<Shared>) {
    ON_LOOP.with(|on| on.set(true));
    let mut table = Table {
        slots: Vec::new(),
        free: Vec::new(),
        live: 0,
        timers: BinaryHeap::new(),
        next_gen: 0,
        incoming: Default::default(),
    };
    if catch_unwind(AssertUnwindSafe(|| run_loop(&shared, &mut table))).is_ok() {
        return;
    }
    eprintln!("bypass: the control loop panicked; its connections are closed");
    let waiting = {
        let mut st = lock(&STATE);
        st.running = None;
        st.scan = false;
        std::mem::take(&mut st.new)
    };
    table.slots.drain(..).flatten().for_each(|e| abandon(e.w));
    table.incoming.drain(..).for_each(abandon);
    TAKEN.store(0, std::sync::atomic::Ordering::Release);
    waiting.into_iter().for_each(abandon);
    take_stuck_aside().into_iter().for_each(abandon);
}

/// Test hook ([`panic_control_loop_for_tests`]): the loop panics before it registers the next
/// new connection.
static PANIC_ON_REGISTER: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Test hook: the process's control loop panics, outside any one connection's handling, when it
/// next registers a new connection (as if its own code had failed there). The loop's recovery
/// from that is what is tested: every connection it held is closed
/// ([`CloseReason::ControlLost`](crate::CloseReason::ControlLost)) and the next connection
/// starts a new loop.
#[doc(hidden)]
pub fn panic_control_loop_for_tests() {
    PANIC_ON_REGISTER.store(true, std::sync::atomic::Ordering::Release);
}

/// How many connections the loop has taken from [`State::new`] and not yet registered (set
/// under the [`STATE`] lock as it takes them): with `new`, what [`control_loop_settled_for_tests`]
/// reads.
static TAKEN: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Test hook: true once the process's control loop has registered every connection handed to it
/// (so the allocations of setting a connection up are over: `tests/alloc.rs` waits for this
/// before it counts).
#[doc(hidden)]
pub fn control_loop_settled_for_tests() -> bool {
    let st = lock(&STATE);
    st.new.is_empty() && TAKEN.load(std::sync::atomic::Ordering::Acquire) == 0
}

/// The loop itself.
fn run_loop(shared: &Shared, table: &mut Table) {
    let mut events = vec![os::epoll_event { events: 0, u64: 0 }; 256];
    loop {
        // Only this thread makes the aside queue stuck (its `run_aside`), so `None` here stays
        // true until the loop ends below.
        let retry = retry_aside(Instant::now());
        let scan = {
            let mut st = lock(&STATE);
            if st.new.is_empty() && table.live == 0 && retry.is_none() {
                st.running = None;
                st.scan = false;
                return;
            }
            table.incoming.extend(st.new.drain(..));
            TAKEN.store(table.incoming.len(), std::sync::atomic::Ordering::Release);
            std::mem::take(&mut st.scan)
        };
        if scan {
            // Before the new ones (which are asked on registration anyway).
            for idx in 0..table.slots.len() {
                if table.slots[idx].is_some() {
                    let step = guarded(table.slots[idx].as_mut(), |e| e.w.on_wake());
                    table.apply(shared, idx, step);
                }
            }
        }
        while !table.incoming.is_empty() {
            if PANIC_ON_REGISTER.swap(false, std::sync::atomic::Ordering::AcqRel) {
                panic!("the control loop panics (test hook)");
            }
            if let Some(w) = table.incoming.pop_front() {
                table.insert(shared, w);
            }
        }
        TAKEN.store(0, std::sync::atomic::Ordering::Release);
        // Registering or scanning may have sent a connection aside with no thread to take it.
        let retry = retry.or_else(|| lock(&ASIDE).stuck.map(|(_, at)| at));
        if table.live == 0 && retry.is_none() {
            continue; // look at the queue of new ones again (and end if it is empty)
        }
        let next = match (table.timers.peek(), retry) {
            (Some(Reverse((d, _, _))), Some(r)) => Some((*d).min(r)),
            (Some(Reverse((d, _, _))), None) => Some(*d),
            (None, r) => r,
        };
        let timeout = match next {
            None => -1,
            Some(d) => {
                d.saturating_duration_since(Instant::now()).as_micros().div_ceil(1000).min(i32::MAX as u128)
                    as libc::c_int
            }
        };
        let n = match os::epoll_wait(&shared.epoll, &mut events, timeout) {
            Ok(n) => n,
            Err(e) => {
                if e.kind() != std::io::ErrorKind::Interrupted {
                    // Not expected (the arguments are valid); give the CPU back rather than spin.
                    eprintln!("bypass: the control loop's epoll_wait failed: {e}");
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                continue;
            }
        };
        for ev in &events[..n] {
            let key = ev.u64;
            if key == WAKE_KEY {
                // New connections or a scan to do: taken at the top of the loop.
                shared.wake.clear();
                continue;
            }
            let idx = key as usize;
            let step = guarded(table.slots.get_mut(idx).and_then(Option::as_mut), |e| e.w.on_readable());
            if table.slots.get(idx).is_some_and(Option::is_some) {
                table.apply(shared, idx, step);
            }
        }
        let now = Instant::now();
        while let Some(&Reverse((d, idx, gen))) = table.timers.peek() {
            if d > now {
                break;
            }
            table.timers.pop();
            let current = table.slots[idx].as_ref().is_some_and(|e| e.gen == gen && e.scheduled == Some(d));
            if !current {
                continue; // stale: rescheduled or removed since
            }
            if let Some(e) = table.slots[idx].as_mut() {
                e.scheduled = None;
            }
            let step = guarded(table.slots[idx].as_mut(), |e| e.w.on_timer(now));
            table.apply(shared, idx, step);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::mpsc;
    use std::time::Duration;

    const LIMIT: Duration = Duration::from_secs(30);

    /// Aside threads [`spawn_aside`] still refuses to start (`usize::MAX`: all).
    static REFUSE_SPAWNS: AtomicUsize = AtomicUsize::new(0);

    /// The tests that send connections aside share the aside queue and the refusals: one at a time.
    static ASIDE_TESTS: Mutex<()> = Mutex::new(());

    pub(super) fn refuse_spawn() -> bool {
        REFUSE_SPAWNS.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1)).is_ok()
    }

    /// Refuses the next `n` aside threads until dropped.
    struct Refusing;

    impl Refusing {
        fn next(n: usize) -> Refusing {
            REFUSE_SPAWNS.store(n, Ordering::Release);
            Refusing
        }
    }

    impl Drop for Refusing {
        fn drop(&mut self) {
            REFUSE_SPAWNS.store(0, Ordering::Release);
        }
    }

    fn until(what: &str, cond: impl Fn() -> bool) {
        let start = Instant::now();
        while !cond() {
            assert!(start.elapsed() < LIMIT, "gave up waiting for {what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// A test connection: counts its events; goes aside once when asked, blocking there until
    /// released; ends when its socket turns readable.
    struct Probe {
        sock: UnixStream,
        ticks: Arc<AtomicUsize>,
        wakes: Arc<AtomicUsize>,
        go_aside: Arc<AtomicBool>,
        release: Option<mpsc::Receiver<()>>,
        dropped: Arc<AtomicBool>,
        next: Option<Instant>,
        every: Option<Duration>,
    }

    impl Drop for Probe {
        fn drop(&mut self) {
            self.dropped.store(true, Ordering::Release);
        }
    }

    impl Watch for Probe {
        fn fd(&self) -> RawFd {
            self.sock.as_raw_fd()
        }
        fn has_buffered(&mut self) -> bool {
            false
        }
        fn on_readable(&mut self) -> Step {
            Step::Done
        }
        fn on_timer(&mut self, now: Instant) -> Step {
            self.ticks.fetch_add(1, Ordering::Relaxed);
            self.next = self.every.map(|e| now + e);
            Step::Keep
        }
        fn abandon(&mut self) {}
        fn on_wake(&mut self) -> Step {
            self.wakes.fetch_add(1, Ordering::Relaxed);
            if self.go_aside.swap(false, Ordering::AcqRel) {
                Step::Aside
            } else {
                Step::Keep
            }
        }
        fn deadline(&self) -> Option<Instant> {
            self.next
        }
        fn aside(&mut self) -> bool {
            if let Some(r) = self.release.take() {
                let _ = r.recv_timeout(LIMIT);
            }
            true
        }
    }

    struct Handles {
        peer: UnixStream,
        ticks: Arc<AtomicUsize>,
        wakes: Arc<AtomicUsize>,
        go_aside: Arc<AtomicBool>,
        dropped: Arc<AtomicBool>,
    }

    fn probe(every: Option<Duration>, release: Option<mpsc::Receiver<()>>) -> (Box<Probe>, Handles) {
        let (sock, peer) = UnixStream::pair().unwrap();
        let h = Handles {
            peer,
            ticks: Arc::default(),
            wakes: Arc::default(),
            go_aside: Arc::default(),
            dropped: Arc::default(),
        };
        let p = Probe {
            sock,
            ticks: h.ticks.clone(),
            wakes: h.wakes.clone(),
            go_aside: h.go_aside.clone(),
            release,
            dropped: h.dropped.clone(),
            next: every.map(|e| Instant::now() + e),
            every,
        };
        (Box::new(p), h)
    }

    #[test]
    fn a_connection_aside_does_not_stall_the_others_and_comes_back() {
        let _one = lock(&ASIDE_TESTS);
        let (tx, rx) = mpsc::channel();
        let (slow, slow_h) = probe(None, Some(rx));
        let (busy, busy_h) = probe(Some(Duration::from_millis(1)), None);
        watch(slow).unwrap();
        watch(busy).unwrap();
        until("the slow one registered", || slow_h.wakes.load(Ordering::Relaxed) >= 1);
        slow_h.go_aside.store(true, Ordering::Release);
        wake();
        until("the slow one to go aside", || !slow_h.go_aside.load(Ordering::Acquire));
        let at = busy_h.ticks.load(Ordering::Relaxed);
        until("the other's timer to keep firing", || busy_h.ticks.load(Ordering::Relaxed) >= at + 20);
        let wakes = slow_h.wakes.load(Ordering::Relaxed);
        tx.send(()).unwrap();
        // Back in the loop: its registration asks it on_wake again.
        until("the slow one to be watched again", || slow_h.wakes.load(Ordering::Relaxed) > wakes);
        // A peer that closes ends each watch (dropped, its socket with it).
        drop(slow_h.peer);
        drop(busy_h.peer);
        until("both watches to end", || {
            slow_h.dropped.load(Ordering::Acquire) && busy_h.dropped.load(Ordering::Acquire)
        });
    }

    /// A storm of connections going aside at once (every channel of a failed NIC recovering)
    /// runs on at most `MAX_ASIDE_THREADS` threads; every one comes back.
    #[test]
    fn asides_share_a_bounded_set_of_threads() {
        let _one = lock(&ASIDE_TESTS);
        let h = StuckHandles::default();
        let n = MAX_ASIDE_THREADS + 4;
        let mut peers = Vec::new();
        for _ in 0..n {
            let (w, peer) = stuck_with(&h);
            peers.push(peer);
            watch(w).unwrap();
        }
        until("the thread limit to be reached", || h.inside.load(Ordering::Acquire) >= MAX_ASIDE_THREADS);
        h.release.store(true, Ordering::Release);
        until("every connection to come back", || h.back.load(Ordering::Acquire) == n);
        assert!(
            h.most.load(Ordering::Acquire) <= MAX_ASIDE_THREADS,
            "at most {MAX_ASIDE_THREADS} aside at once"
        );
        drop(peers);
    }

    #[test]
    fn a_panic_in_one_connection_closes_only_it() {
        struct Panics(UnixStream, Arc<AtomicBool>, Arc<AtomicBool>);
        impl Drop for Panics {
            fn drop(&mut self) {
                self.1.store(true, Ordering::Release);
            }
        }
        impl Watch for Panics {
            fn fd(&self) -> RawFd {
                self.0.as_raw_fd()
            }
            fn has_buffered(&mut self) -> bool {
                false
            }
            fn on_readable(&mut self) -> Step {
                panic!("on_readable panics (contained)")
            }
            fn on_timer(&mut self, _: Instant) -> Step {
                Step::Keep
            }
            fn on_wake(&mut self) -> Step {
                Step::Keep
            }
            fn deadline(&self) -> Option<Instant> {
                None
            }
            fn abandon(&mut self) {
                self.2.store(true, Ordering::Release);
            }
            fn aside(&mut self) -> bool {
                false
            }
        }
        let (sock, mut peer) = UnixStream::pair().unwrap();
        let gone = Arc::new(AtomicBool::new(false));
        let abandoned = Arc::new(AtomicBool::new(false));
        watch(Box::new(Panics(sock, gone.clone(), abandoned.clone()))).unwrap();
        let (other, other_h) = probe(Some(Duration::from_millis(1)), None);
        watch(other).unwrap();
        std::io::Write::write_all(&mut peer, b"x").unwrap();
        until("the panicking watch to be dropped", || gone.load(Ordering::Acquire));
        assert!(abandoned.load(Ordering::Acquire), "told to close its connection before it was dropped");
        let at = other_h.ticks.load(Ordering::Relaxed);
        until("the loop to go on for the other", || other_h.ticks.load(Ordering::Relaxed) >= at + 5);
        drop(other_h.peer);
        until("the other to end", || other_h.dropped.load(Ordering::Acquire));
    }

    /// A connection that goes aside once, at registration; its aside work blocks until released
    /// (or until more than `MAX_ASIDE_THREADS` are inside at once, the failure a test looks for).
    struct Stuck {
        sock: UnixStream,
        entered: Arc<AtomicBool>,
        inside: Arc<AtomicUsize>,
        most: Arc<AtomicUsize>,
        release: Arc<AtomicBool>,
        back: Arc<AtomicUsize>,
        abandoned: Arc<AtomicBool>,
        dropped: Arc<AtomicBool>,
        went: bool,
    }

    impl Drop for Stuck {
        fn drop(&mut self) {
            self.dropped.store(true, Ordering::Release);
        }
    }

    impl Watch for Stuck {
        fn fd(&self) -> RawFd {
            self.sock.as_raw_fd()
        }
        fn has_buffered(&mut self) -> bool {
            false
        }
        fn on_readable(&mut self) -> Step {
            Step::Done
        }
        fn on_timer(&mut self, _: Instant) -> Step {
            Step::Keep
        }
        fn on_wake(&mut self) -> Step {
            if self.went {
                self.back.fetch_add(1, Ordering::AcqRel);
                return Step::Keep;
            }
            self.went = true;
            Step::Aside
        }
        fn deadline(&self) -> Option<Instant> {
            None
        }
        fn abandon(&mut self) {
            self.abandoned.store(true, Ordering::Release);
        }
        fn aside(&mut self) -> bool {
            self.entered.store(true, Ordering::Release);
            let now = self.inside.fetch_add(1, Ordering::AcqRel) + 1;
            self.most.fetch_max(now, Ordering::AcqRel);
            until("the release", || self.release.load(Ordering::Acquire) || now > MAX_ASIDE_THREADS);
            self.inside.fetch_sub(1, Ordering::AcqRel);
            true
        }
    }

    /// What the test sees of one or more [`Stuck`] connections (shared by all made from it).
    #[derive(Default)]
    struct StuckHandles {
        entered: Arc<AtomicBool>,
        /// How many are in their aside work now, and the most that ever were at once.
        inside: Arc<AtomicUsize>,
        most: Arc<AtomicUsize>,
        release: Arc<AtomicBool>,
        back: Arc<AtomicUsize>,
        abandoned: Arc<AtomicBool>,
        dropped: Arc<AtomicBool>,
    }

    fn stuck() -> (Box<Stuck>, StuckHandles, UnixStream) {
        let h = StuckHandles::default();
        let (w, peer) = stuck_with(&h);
        (w, h, peer)
    }

    fn stuck_with(h: &StuckHandles) -> (Box<Stuck>, UnixStream) {
        let (sock, peer) = UnixStream::pair().unwrap();
        let w = Stuck {
            sock,
            entered: h.entered.clone(),
            inside: h.inside.clone(),
            most: h.most.clone(),
            release: h.release.clone(),
            back: h.back.clone(),
            abandoned: h.abandoned.clone(),
            dropped: h.dropped.clone(),
            went: false,
        };
        (Box::new(w), peer)
    }

    /// No aside thread can be started at first (the process is out of threads): the connection
    /// waits, the loop goes on with the others and tries again; once a thread starts, the work
    /// runs there (never on the loop) and the connection comes back.
    #[test]
    fn aside_work_waits_for_a_thread_instead_of_blocking_the_loop() {
        let _one = lock(&ASIDE_TESTS);
        let refusing = Refusing::next(3);
        let (busy, busy_h) = probe(Some(Duration::from_millis(1)), None);
        watch(busy).unwrap();
        let (w, h, peer) = stuck();
        watch(w).unwrap();
        until("the aside work to start", || h.entered.load(Ordering::Acquire));
        assert_eq!(REFUSE_SPAWNS.load(Ordering::Acquire), 0, "started after the loop's retries");
        drop(refusing);
        // Its aside work blocks: the loop, not running it, still runs the other's timer.
        let at = busy_h.ticks.load(Ordering::Relaxed);
        until("the loop to go on while the work blocks", || busy_h.ticks.load(Ordering::Relaxed) >= at + 20);
        h.release.store(true, Ordering::Release);
        until("the connection to be watched again", || h.back.load(Ordering::Acquire) == 1);
        assert!(!h.abandoned.load(Ordering::Acquire));
        drop(peer);
        drop(busy_h.peer);
        until("both watches to end", || {
            h.dropped.load(Ordering::Acquire) && busy_h.dropped.load(Ordering::Acquire)
        });
    }

    /// No aside thread can ever be started: after `ASIDE_GIVE_UP` the waiting connection is
    /// closed (abandoned) rather than left hanging, its work never having run; the loop and
    /// the other connections are not held up meanwhile.
    #[test]
    fn aside_work_that_never_gets_a_thread_closes_its_connection() {
        let _one = lock(&ASIDE_TESTS);
        let _refusing = Refusing::next(usize::MAX);
        let (busy, busy_h) = probe(Some(Duration::from_millis(1)), None);
        watch(busy).unwrap();
        let (w, h, peer) = stuck();
        h.release.store(true, Ordering::Release);
        let start = Instant::now();
        watch(w).unwrap();
        let at = busy_h.ticks.load(Ordering::Relaxed);
        until("the loop to go on for the other", || busy_h.ticks.load(Ordering::Relaxed) >= at + 20);
        until("the waiting connection to be closed", || h.abandoned.load(Ordering::Acquire));
        assert!(start.elapsed() >= ASIDE_GIVE_UP, "closed only after {ASIDE_GIVE_UP:?} of tries");
        until("it to be dropped", || h.dropped.load(Ordering::Acquire));
        assert!(!h.entered.load(Ordering::Acquire), "its blocking work never ran (on the loop or anywhere)");
        assert!(lock(&ASIDE).queue.is_empty());
        let at = busy_h.ticks.load(Ordering::Relaxed);
        until("the loop to go on", || busy_h.ticks.load(Ordering::Relaxed) >= at + 5);
        drop(peer);
        drop(busy_h.peer);
        until("the other to end", || busy_h.dropped.load(Ordering::Acquire));
    }
}
