//! Polling threads: a [`WorkerGroup`] polls channels and server connections.
//!
//! Each worker owns a list of [`Pollable`]s (new ones are spread round-robin over the workers)
//! and loops over them. In [`PollMode::Busy`] it never sleeps: lowest latency, one core per
//! worker. In [`PollMode::Event`] a worker that found nothing to do for 64 rounds arms every
//! completion queue it serves, polls once more (a completion that arrived before the arm raises
//! no event), and sleeps in `poll(2)` on the CQs' event file descriptors until one fires.
//! [`PollMode::Adaptive`], the default, does the same after spinning for
//! [`WorkerConfig::spin`] ([`DEFAULT_SPIN`]) since the last completion: back-to-back traffic is
//! served at busy-polling latency, and an idle worker costs no CPU; the first message after an
//! idle spell pays for the wake-up. A sleeping worker also wakes when a target is added or the
//! group stops (its own eventfd), and at the latest after 10 ms (so the deadline of a call the
//! worker delivers is noticed at most that late). [`WorkerGroup::stats`] counts
//! the sleeps and wake-ups.

use crate::os::{self, WakeFd};
use crate::sync::lock;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Something a worker polls: a client channel or a server connection.
pub trait Pollable: Send + Sync {
    /// Processes what completed; returns how many completions were handled.
    fn poll(&self) -> usize;
    /// Lets a software device run (see [`crate::hal::Device::progress`]).
    fn progress(&self);
    /// Whether it is closed and has nothing left to collect (the worker then forgets it).
    fn is_closed(&self) -> bool;
    /// Arms its completion queues for one event each; false if that failed.
    fn arm(&self) -> bool;
    /// Appends the event file descriptors of its completion queues.
    fn event_fds(&self, out: &mut Vec<RawFd>);
    /// Consumes pending events after a wake-up.
    fn ack_events(&self);
}

/// Busy polling, sleeping on completion events, or spinning briefly and then sleeping.
///
/// The trade-off is the latency of the first message after an idle spell against the CPU an
/// idle worker burns. A sleeping worker is woken by the CQ's event fd: the first completion after
/// a sleep pays for the interrupt/eventfd wake-up and the thread being scheduled again (a few to
/// tens of microseconds, more on a loaded machine); messages that follow while the worker spins
/// pay nothing extra.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PollMode {
    /// Spin on the completion queues and never sleep (lowest latency, even after idle spells;
    /// the worker uses a whole core as long as it has anything to poll).
    Busy,
    /// Sleep on the completion queues' event fds after 64 empty rounds (least CPU; nearly every
    /// message after a pause pays for a wake-up).
    Event,
    /// The default: spin for [`WorkerConfig::spin`] (and at least 64 empty rounds) after the
    /// last completion, then arm the CQs, poll once more and sleep on their event fds. Back-to-
    /// back traffic stays within the spin phase and sees busy-polling latency; an idle worker
    /// sleeps.
    #[default]
    Adaptive,
}

/// How long an [`PollMode::Adaptive`] worker spins after its last completion before it sleeps.
pub const DEFAULT_SPIN: Duration = Duration::from_millis(1);

/// Longest a sleeping worker stays in `poll(2)` before it looks again (new targets and shutdown
/// wake it at once through its own event fd; this bounds the wait for anything else: a target
/// whose CQ could not be armed, and the deadlines of callback and future calls a worker delivers,
/// which it checks when it polls — so such a call's `Timeout` comes at most this late).
const MAX_SLEEP_MS: libc::c_int = 10;

/// How a [`WorkerGroup`] is set up.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// Number of threads (at least 1).
    pub threads: usize,
    /// Busy, event or adaptive mode.
    pub mode: PollMode,
    /// [`PollMode::Adaptive`]: how long to spin after the last completion before sleeping
    /// (default [`DEFAULT_SPIN`]). Ignored by the other modes.
    pub spin: Duration,
    /// CPUs to pin the threads to: thread `i` goes to `pin[i % pin.len()]`; empty: no pinning.
    pub pin: Vec<usize>,
    /// Thread name prefix.
    pub name: String,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            threads: 1,
            mode: PollMode::default(),
            spin: DEFAULT_SPIN,
            pin: Vec::new(),
            name: String::new(),
        }
    }
}

/// Counters of a [`WorkerGroup`] (all its threads).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkerStats {
    /// Times a worker went to sleep in `poll(2)` (after arming its CQs and finding nothing).
    pub sleeps: u64,
    /// Sleeps ended by an event fd: a completion event, or the group's own wake-up (a new target,
    /// shutdown).
    pub wakeups: u64,
    /// Sleeps that ended at their time limit with no event.
    pub sleep_timeouts: u64,
    /// Times a worker armed its CQs but found a completion on its last look, so did not sleep
    /// (a completion that arrived just before the arm).
    pub sleeps_avoided: u64,
}

#[derive(Default)]
struct StatCounters {
    sleeps: AtomicU64,
    wakeups: AtomicU64,
    sleep_timeouts: AtomicU64,
    sleeps_avoided: AtomicU64,
}

struct Slot {
    list: Mutex<Vec<Arc<dyn Pollable>>>,
    version: AtomicU64,
    /// Written by [`WorkerGroup::add`] and by shutdown, so a sleeping worker looks at once.
    wake: WakeFd,
}

struct Shared {
    stop: AtomicBool,
    slots: Vec<Slot>,
    next: AtomicUsize,
    stats: StatCounters,
}

/// A set of polling threads. Dropping it stops and joins them (all but the calling thread, when
/// one of them drops it: that one ends once it returns to its loop).
pub struct WorkerGroup {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for WorkerGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerGroup").field("threads", &self.threads.len()).finish()
    }
}

impl WorkerGroup {
    /// Starts `config.threads` workers.
    pub fn new(config: WorkerConfig) -> std::io::Result<Self> {
        if config.name.contains('\0') {
            // `std::thread::Builder::name` would panic on it.
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "WorkerConfig.name contains a NUL byte: a thread name prefix is text without NUL",
            ));
        }
        let n = config.threads.max(1);
        let slots = (0..n)
            .map(|_| {
                Ok(Slot { list: Mutex::new(Vec::new()), version: AtomicU64::new(0), wake: WakeFd::new()? })
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            slots,
            next: AtomicUsize::new(0),
            stats: StatCounters::default(),
        });
        let mut group = WorkerGroup { shared: shared.clone(), threads: Vec::with_capacity(n) };
        for i in 0..n {
            let shared = shared.clone();
            let cpu = (!config.pin.is_empty()).then(|| config.pin[i % config.pin.len()]);
            let (mode, spin) = (config.mode, config.spin);
            let name = if config.name.is_empty() { "bypass-worker" } else { &config.name };
            // On failure, dropping `group` stops and joins the threads already started.
            group.threads.push(
                std::thread::Builder::new()
                    .name(format!("{name}-{i}"))
                    .spawn(move || run(&shared, i, mode, spin, cpu))?,
            );
        }
        Ok(group)
    }

    /// Hands `target` to one of the workers (round-robin), waking it if it sleeps.
    pub fn add(&self, target: Arc<dyn Pollable>) {
        let i = self.shared.next.fetch_add(1, Ordering::Relaxed) % self.shared.slots.len();
        let slot = &self.shared.slots[i];
        lock(&slot.list).push(target);
        slot.version.fetch_add(1, Ordering::Release);
        slot.wake.signal();
    }

    /// Number of worker threads.
    pub fn threads(&self) -> usize {
        self.threads.len()
    }

    /// The counters of all the group's threads.
    pub fn stats(&self) -> WorkerStats {
        let s = &self.shared.stats;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        WorkerStats {
            sleeps: l(&s.sleeps),
            wakeups: l(&s.wakeups),
            sleep_timeouts: l(&s.sleep_timeouts),
            sleeps_avoided: l(&s.sleeps_avoided),
        }
    }
}

impl Drop for WorkerGroup {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        for slot in &self.shared.slots {
            slot.wake.signal();
        }
        let me = std::thread::current().id();
        for t in self.threads.drain(..) {
            t.thread().unpark();
            if t.thread().id() == me {
                // Dropped by one of its own workers (a handler that drops its `Server`): that
                // thread cannot wait for itself to end. It is detached instead and ends on its
                // own, seeing `stop` as soon as the handler returns.
                continue;
            }
            let _ = t.join();
        }
    }
}

/// Pins the calling thread to `cpu`.
pub fn pin_current_thread(cpu: usize) -> std::io::Result<()> {
    crate::os::pin_current_thread(cpu)
}

fn run(shared: &Shared, i: usize, mode: PollMode, spin: Duration, cpu: Option<usize>) {
    if let Some(cpu) = cpu {
        if let Err(e) = pin_current_thread(cpu) {
            eprintln!("bypass: worker {i} could not be pinned to CPU {cpu}: {e}; running unpinned");
        }
    }
    let slot = &shared.slots[i];
    let mut seen = u64::MAX;
    let mut targets: Vec<Arc<dyn Pollable>> = Vec::new();
    let mut sleeper = Sleeper::default();
    let mut idle = 0u32;
    // Adaptive: when the current idle spell began (set at its 64th empty round).
    let mut idle_since: Option<Instant> = None;
    while !shared.stop.load(Ordering::Acquire) {
        let v = slot.version.load(Ordering::Acquire);
        if v != seen {
            let mut list = lock(&slot.list);
            list.retain(|t| !t.is_closed());
            targets.clone_from(&list);
            seen = slot.version.load(Ordering::Acquire);
            sleeper.prepare(slot, &targets);
        }
        let mut n = 0;
        for t in &targets {
            n += t.poll();
        }
        if n > 0 {
            idle = 0;
            idle_since = None;
            continue;
        }
        idle = idle.wrapping_add(1);
        if idle % 64 == 0 {
            for t in &targets {
                t.progress();
            }
        }
        if idle % 1024 == 0 {
            // Forget closed targets now and then.
            forget_closed(slot, &targets);
        }
        match mode {
            PollMode::Busy => {
                if targets.is_empty() {
                    std::thread::park_timeout(std::time::Duration::from_millis(1));
                } else if idle % 64 == 0 {
                    std::thread::yield_now();
                }
            }
            PollMode::Event if idle >= 64 => {
                idle = 0;
                if !forget_closed(slot, &targets) {
                    sleeper.sleep(shared, slot, &targets);
                }
            }
            PollMode::Adaptive if idle % 64 == 0 => {
                // Read the clock only every 64 empty rounds (the spin phase costs no syscall but
                // a yield, as in busy mode, so a thread sharing the CPU — often the caller whose
                // next request we wait for — gets to run).
                let since = *idle_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= spin {
                    idle = 0;
                    idle_since = None;
                    if !forget_closed(slot, &targets) {
                        sleeper.sleep(shared, slot, &targets);
                    }
                } else {
                    std::thread::yield_now();
                }
            }
            PollMode::Event | PollMode::Adaptive => std::hint::spin_loop(),
        }
    }
}

/// Takes closed targets out of the worker's list (the worker lets go of its copies at its next
/// round); whether there were any. Asked before every sleep: a sleeping worker (whose idle count
/// starts over at each sleep, so never reaches the busy mode's 1024 rounds) would otherwise hold
/// a closed connection, and all its memory, until a new one is added.
fn forget_closed(slot: &Slot, targets: &[Arc<dyn Pollable>]) -> bool {
    if !targets.iter().any(|t| t.is_closed()) {
        return false;
    }
    lock(&slot.list).retain(|t| !t.is_closed());
    slot.version.fetch_add(1, Ordering::Release);
    true
}

/// The buffers of a worker's sleeps, reused from one to the next.
#[derive(Default)]
struct Sleeper {
    fds: Vec<RawFd>,
    pfds: Vec<os::pollfd>,
}

impl Sleeper {
    /// Sizes the buffers for `targets`, when the target list changes: so that the first sleep
    /// of a steady state, which may come long after the list changed (a busy worker never
    /// sleeps), does not allocate.
    fn prepare(&mut self, slot: &Slot, targets: &[Arc<dyn Pollable>]) {
        self.fill_fds(slot, targets);
        self.pfds.reserve(self.fds.len());
    }

    fn fill_fds(&mut self, slot: &Slot, targets: &[Arc<dyn Pollable>]) {
        self.fds.clear();
        for t in targets {
            t.event_fds(&mut self.fds);
        }
        self.fds.push(slot.wake.raw());
    }

    /// Arms every target's CQs, looks once more, and sleeps on their event fds and the worker's
    /// wake-up fd until one fires or [`MAX_SLEEP_MS`] pass.
    fn sleep(&mut self, shared: &Shared, slot: &Slot, targets: &[Arc<dyn Pollable>]) {
        if !targets.iter().all(|t| t.arm()) {
            return;
        }
        // Completions that arrived before arming may raise no event (the hal's contract, as on
        // rxe): look once more, after the arm, so none is left behind while we sleep.
        if targets.iter().map(|t| t.poll()).sum::<usize>() > 0 {
            shared.stats.sleeps_avoided.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.fill_fds(slot, targets);
        self.pfds.clear();
        self.pfds.extend(self.fds.iter().map(|&fd| os::pollfd { fd, events: libc::POLLIN, revents: 0 }));
        shared.stats.sleeps.fetch_add(1, Ordering::Relaxed);
        let rc = os::poll(&mut self.pfds, MAX_SLEEP_MS);
        if rc > 0 {
            shared.stats.wakeups.fetch_add(1, Ordering::Relaxed);
        } else if rc == 0 {
            shared.stats.sleep_timeouts.fetch_add(1, Ordering::Relaxed);
        }
        slot.wake.clear();
        for t in targets {
            t.ack_events();
        }
    }
}
