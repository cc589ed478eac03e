//! Polling threads: a [`WorkerGroup`] polls channels and server connections.
//!
//! Each worker owns a list of [`Pollable`]s (new ones are spread round-robin over the workers)
//! and loops over them. In [`PollMode::Busy`] it never sleeps: lowest latency, one core per
//! worker. In [`PollMode::Event`] a worker that found nothing to do for a while arms every
//! completion queue it serves, polls once more (a completion that arrived before the arm raises
//! no event), and sleeps in `poll(2)` on the CQs' event file descriptors until one fires (or
//! 10 ms pass, to pick up new connections and notice shutdown).

use crate::endpoint::lock;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

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

/// Busy polling or sleeping on completion events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PollMode {
    /// Spin on the completion queues (lowest latency; the worker uses a whole core).
    #[default]
    Busy,
    /// Sleep on the completion queues' event fds when idle.
    Event,
}

/// How a [`WorkerGroup`] is set up.
#[derive(Debug, Clone, Default)]
pub struct WorkerConfig {
    /// Number of threads (at least 1).
    pub threads: usize,
    /// Busy or event mode.
    pub mode: PollMode,
    /// CPUs to pin the threads to: thread `i` goes to `pin[i % pin.len()]`; empty: no pinning.
    pub pin: Vec<usize>,
    /// Thread name prefix.
    pub name: String,
}

struct Slot {
    list: Mutex<Vec<Arc<dyn Pollable>>>,
    version: AtomicU64,
}

struct Shared {
    stop: AtomicBool,
    slots: Vec<Slot>,
    next: AtomicUsize,
}

/// A set of polling threads. Dropping it stops and joins them.
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
        let n = config.threads.max(1);
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            slots: (0..n)
                .map(|_| Slot { list: Mutex::new(Vec::new()), version: AtomicU64::new(0) })
                .collect(),
            next: AtomicUsize::new(0),
        });
        let mut threads = Vec::with_capacity(n);
        for i in 0..n {
            let shared = shared.clone();
            let cpu = (!config.pin.is_empty()).then(|| config.pin[i % config.pin.len()]);
            let mode = config.mode;
            let name = if config.name.is_empty() { "bypass-worker" } else { &config.name };
            threads.push(
                std::thread::Builder::new()
                    .name(format!("{name}-{i}"))
                    .spawn(move || run(&shared, i, mode, cpu))?,
            );
        }
        Ok(WorkerGroup { shared, threads })
    }

    /// Hands `target` to one of the workers (round-robin).
    pub fn add(&self, target: Arc<dyn Pollable>) {
        let i = self.shared.next.fetch_add(1, Ordering::Relaxed) % self.shared.slots.len();
        let slot = &self.shared.slots[i];
        lock(&slot.list).push(target);
        slot.version.fetch_add(1, Ordering::Release);
    }

    /// Number of worker threads.
    pub fn threads(&self) -> usize {
        self.threads.len()
    }
}

impl Drop for WorkerGroup {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        for t in self.threads.drain(..) {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

/// Starts a named thread running `f` and returns once it runs, so that its start-up (and any
/// failure to start) happens before the caller goes on, not in the middle of later work.
pub(crate) fn spawn_started(name: String, f: impl FnOnce() + Send + 'static) -> std::io::Result<()> {
    let (started, wait) = std::sync::mpsc::sync_channel::<()>(1);
    std::thread::Builder::new().name(name).spawn(move || {
        let _ = started.send(());
        f();
    })?;
    let _ = wait.recv();
    Ok(())
}

/// Pins the calling thread to `cpu`.
pub fn pin_current_thread(cpu: usize) -> std::io::Result<()> {
    // SAFETY: cpu_set_t is plain data; all-zero is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    if cpu >= 8 * std::mem::size_of::<libc::cpu_set_t>() {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("no CPU {cpu}")));
    }
    // SAFETY: `cpu` is within the set (checked above).
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: pid 0 is the calling thread; `set` is a valid cpu_set_t of the size passed.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn run(shared: &Shared, i: usize, mode: PollMode, cpu: Option<usize>) {
    if let Some(cpu) = cpu {
        if let Err(e) = pin_current_thread(cpu) {
            eprintln!("bypass: worker {i} could not be pinned to CPU {cpu}: {e}; running unpinned");
        }
    }
    let slot = &shared.slots[i];
    let mut seen = u64::MAX;
    let mut targets: Vec<Arc<dyn Pollable>> = Vec::new();
    let mut fds: Vec<RawFd> = Vec::new();
    let mut idle = 0u32;
    while !shared.stop.load(Ordering::Acquire) {
        let v = slot.version.load(Ordering::Acquire);
        if v != seen {
            let mut list = lock(&slot.list);
            list.retain(|t| !t.is_closed());
            targets.clone_from(&list);
            seen = slot.version.load(Ordering::Acquire);
        }
        let mut n = 0;
        for t in &targets {
            n += t.poll();
        }
        if n > 0 {
            idle = 0;
            continue;
        }
        idle += 1;
        if idle % 64 == 0 {
            for t in &targets {
                t.progress();
            }
        }
        if idle % 1024 == 0 {
            // Forget closed targets now and then.
            if targets.iter().any(|t| t.is_closed()) {
                lock(&slot.list).retain(|t| !t.is_closed());
                slot.version.fetch_add(1, Ordering::Release);
            }
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
                sleep_on_events(&targets, &mut fds);
            }
            PollMode::Event => std::hint::spin_loop(),
        }
    }
}

fn sleep_on_events(targets: &[Arc<dyn Pollable>], fds: &mut Vec<RawFd>) {
    if !targets.iter().all(|t| t.arm()) {
        return;
    }
    // Completions that arrived before arming raise no event: look once more.
    if targets.iter().map(|t| t.poll()).sum::<usize>() > 0 {
        return;
    }
    fds.clear();
    for t in targets {
        t.event_fds(fds);
    }
    let mut pfds: Vec<libc::pollfd> =
        fds.iter().map(|&fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 }).collect();
    // SAFETY: `pfds` is a valid array of `pfds.len()` pollfd structs for the whole call.
    let _ = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, 10) };
    for t in targets {
        t.ack_events();
    }
}
