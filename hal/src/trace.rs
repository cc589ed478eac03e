//! An event recorder for debugging: what the driver, the device, the wires and the RPC stack did
//! and when, written as a [Chrome trace event] JSON file that opens in <https://ui.perfetto.dev>
//! or `chrome://tracing` as a timeline (client, NIC, wire, NIC, server).
//!
//! The recorder is process-wide and off by default. Every emit site is guarded by
//! [`is_enabled`], a relaxed load of a process-wide flag, so recording off costs that load (two
//! in a position-independent binary: the flag's address comes from the GOT), a test and a branch
//! never taken; the recording functions are out of line. Recording on takes a mutex per event
//! and stores it in memory (at most [`MAX_EVENTS`]; later ones are counted in [`dropped`]): a
//! debugging aid, not something to leave on in a benchmark.
//!
//! ```no_run
//! use bypass_hal::trace::{self, Track};
//!
//! trace::start();                                       // or: trace::start_from_env()
//! if trace::is_enabled() {
//!     trace::instant(Track::Nic(0), "doorbell sq", &[("qpn", 3u32.into()), ("pi", 17u32.into())]);
//! }
//! let t0 = trace::stamp();                             // 0 when not recording
//! // ... work ...
//! if t0 != 0 {
//!     trace::span(Track::Thread("server"), "request", t0, &[("req_id", 5u32.into())]);
//! }
//! let events = trace::finish(std::path::Path::new("run.json"))?;
//! # Ok::<(), std::io::Error>(())
//! ```
//!
//! Keep the guarded block cold: inside `if is_enabled()` call only the out-of-line functions
//! here (or a `#[cold]` helper of your own), and take a slice's start with [`stamp`], not
//! [`now`]. LLVM cannot tell that the branch is rarely taken unless the block calls a cold
//! function; an inlined clock read behind the flag in three hot functions (the inbox push, the
//! device run, the server's dispatch) made the one-thread round trip of `rpc_bench` about 5 %
//! slower, while the same sites through [`stamp`] measure no difference.
//!
//! A binary that should record when asked calls [`start_from_env`] at the top of `main` (the
//! environment variable [`ENV_VAR`], `BYPASS_TRACE`, names the output file) and [`finish`] at the
//! end.
//!
//! Timestamps are real time (`std::time::Instant`), in nanoseconds since [`start`]; the JSON
//! carries microseconds with three decimals. A simulator running on virtual time (the Stepped
//! engine) records its clock separately, as events of its own.
//!
//! [Chrome trace event]: https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU

use std::cell::Cell;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::Instant;

/// Most events one recording keeps; later events are counted in [`dropped`] and not stored.
/// An event takes about 240 bytes in memory (so a full recording about 240 MB).
pub const MAX_EVENTS: usize = 1_000_000;

/// Most arguments one event carries (extra ones are ignored).
pub const MAX_ARGS: usize = 4;

/// The environment variable [`start_from_env`] reads: the path of the trace file to write.
pub const ENV_VAR: &str = "BYPASS_TRACE";

/// The timeline row an event belongs to.
///
/// In the JSON file each NIC and each wire is a process of its own with one row, and each
/// [`Track::Thread`] group is a process with one row per thread that recorded into it. Processes
/// are numbered (and given sort indices) in the order client groups, NICs with the wires between
/// them, server groups: NICs in the order they first put a packet on a wire (in an RPC run the
/// client's NIC speaks first), and a group whose name starts with `"server"` below the NICs, every
/// other group above them. `chrome://tracing` honours this order; Perfetto orders processes by
/// activity (pin the rows you want together).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Track {
    /// A NIC, by its address: doorbells, WQE fetches, CQEs, transport events, device runs.
    Nic(u32),
    /// The wire from one NIC to another: packets in flight.
    Wire {
        /// Sending NIC's address.
        from: u32,
        /// Receiving NIC's address.
        to: u32,
    },
    /// The calling thread, in a named group (`"client"`, `"server"`): one row per thread.
    Thread(&'static str),
}

/// An argument value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Value {
    /// A number (written as a JSON number up to 2^53, as a hex string above).
    U64(u64),
    /// A fixed string.
    Str(&'static str),
    /// A flag.
    Bool(bool),
}

impl Value {
    /// The number, if this is one.
    pub fn as_u64(self) -> Option<u64> {
        match self {
            Value::U64(v) => Some(v),
            _ => None,
        }
    }
}

impl From<u64> for Value {
    fn from(v: u64) -> Self {
        Value::U64(v)
    }
}

impl From<u32> for Value {
    fn from(v: u32) -> Self {
        Value::U64(u64::from(v))
    }
}

impl From<u16> for Value {
    fn from(v: u16) -> Self {
        Value::U64(u64::from(v))
    }
}

impl From<u8> for Value {
    fn from(v: u8) -> Self {
        Value::U64(u64::from(v))
    }
}

impl From<usize> for Value {
    fn from(v: usize) -> Self {
        Value::U64(v as u64)
    }
}

impl From<bool> for Value {
    fn from(v: bool) -> Self {
        Value::Bool(v)
    }
}

impl From<&'static str> for Value {
    fn from(v: &'static str) -> Self {
        Value::Str(v)
    }
}

/// A named argument of an event.
pub type Arg = (&'static str, Value);

/// What kind of event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A point in time (Chrome phase `i`).
    Instant,
    /// A slice of its row (phase `X`): slices of one row nest, they never overlap partially.
    Span {
        /// Its length.
        dur_ns: u64,
    },
    /// A slice that may overlap others (phases `b`/`e`): a packet in flight, a call outstanding.
    Async {
        /// Its length.
        dur_ns: u64,
    },
}

/// One recorded event.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TraceEvent {
    /// The row.
    pub track: Track,
    /// Instant or slice.
    pub kind: Kind,
    /// What happened.
    pub name: &'static str,
    /// When (a slice: when it began), in nanoseconds since [`start`].
    pub ts_ns: u64,
    /// The recording thread (a small number; its name is in the JSON).
    pub thread: u32,
    args: [Arg; MAX_ARGS],
    nargs: u8,
}

impl TraceEvent {
    /// The arguments.
    pub fn args(&self) -> &[Arg] {
        &self.args[..usize::from(self.nargs)]
    }

    /// The argument named `key`.
    pub fn arg(&self, key: &str) -> Option<Value> {
        self.args().iter().find(|(k, _)| *k == key).map(|&(_, v)| v)
    }

    /// When it ended (an instant: when it happened).
    pub fn end_ns(&self) -> u64 {
        match self.kind {
            Kind::Instant => self.ts_ns,
            Kind::Span { dur_ns } | Kind::Async { dur_ns } => self.ts_ns + dur_ns,
        }
    }
}

struct State {
    events: Vec<TraceEvent>,
    dropped: u64,
    /// Names of the threads that recorded, by id − 1 (kept across recordings, like the ids).
    threads: Vec<String>,
}

static ENABLED: AtomicBool = AtomicBool::new(false);
/// [`now`] at the last [`start`].
static EPOCH: AtomicU64 = AtomicU64::new(0);
static BASE: OnceLock<Instant> = OnceLock::new();
static NEXT_THREAD: AtomicU32 = AtomicU32::new(1);
/// Events offered since the last [`start`] (stored or dropped).
static OFFERED: AtomicU64 = AtomicU64::new(0);
/// [`MAX_EVENTS`], lowered by the unit tests.
static CAP: AtomicUsize = AtomicUsize::new(MAX_EVENTS);
static STATE: Mutex<State> = Mutex::new(State { events: Vec::new(), dropped: 0, threads: Vec::new() });

thread_local! {
    /// This thread's id in traces (0: not assigned yet).
    static THREAD: Cell<u32> = const { Cell::new(0) };
}

fn state() -> MutexGuard<'static, State> {
    // A panic while holding the lock leaves the state consistent (pushes and clears only).
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether events are being recorded. One relaxed load: call it at every emit site, before
/// building the event. Always false in a `--cfg loom` build (models record nothing).
#[inline(always)]
pub fn is_enabled() -> bool {
    !cfg!(loom) && ENABLED.load(Ordering::Relaxed)
}

/// The trace clock: nanoseconds on a process-wide monotonic clock. Take it where a [`span`] or
/// [`async_span`] begins and pass it when the slice ends.
#[inline]
pub fn now() -> u64 {
    BASE.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// [`now`] if recording, else 0: where a slice may begin on a hot path (the reading is out of
/// line, so recording off costs what [`is_enabled`] costs).
#[inline(always)]
pub fn stamp() -> u64 {
    if is_enabled() {
        cold_now()
    } else {
        0
    }
}

#[cold]
#[inline(never)]
fn cold_now() -> u64 {
    now().max(1)
}

/// Clears the recorder and starts recording.
pub fn start() {
    let mut st = state();
    st.events.clear();
    st.dropped = 0;
    OFFERED.store(0, Ordering::Relaxed);
    EPOCH.store(now(), Ordering::Relaxed);
    ENABLED.store(true, Ordering::SeqCst);
}

/// Starts recording if the environment variable [`ENV_VAR`] (`BYPASS_TRACE`) is set and not
/// empty, and returns its value: the path to give [`finish`].
pub fn start_from_env() -> Option<PathBuf> {
    let path = std::env::var_os(ENV_VAR).filter(|v| !v.is_empty())?;
    start();
    Some(PathBuf::from(path))
}

/// Stops recording; the events stay until [`take`], [`finish`] or the next [`start`].
pub fn stop() {
    let _st = state();
    ENABLED.store(false, Ordering::SeqCst);
}

/// Events offered to the recorder since [`start`], stored or dropped: a cheap way (no lock) for an
/// emitter to tell whether anything was recorded while it worked. Not exact under concurrency:
/// other threads' events count too.
pub fn offered() -> u64 {
    OFFERED.load(Ordering::Relaxed)
}

/// Events not stored by the current (or last) recording because it had [`MAX_EVENTS`] already.
pub fn dropped() -> u64 {
    state().dropped
}

/// A copy of the events recorded so far, in the order they were recorded (recording goes on).
pub fn snapshot() -> Vec<TraceEvent> {
    state().events.clone()
}

/// Stops recording and takes the events, in the order they were recorded.
pub fn take() -> Vec<TraceEvent> {
    let mut st = state();
    ENABLED.store(false, Ordering::SeqCst);
    std::mem::take(&mut st.events)
}

/// Stops recording and writes the events to `path` as Chrome trace event JSON. Returns the
/// number of events written (not counting the metadata that names processes and threads).
pub fn finish(path: &Path) -> io::Result<usize> {
    let events = take();
    let mut out = io::BufWriter::new(std::fs::File::create(path)?);
    write_json(&mut out, &events)?;
    out.flush()?;
    Ok(events.len())
}

/// A point event on `track`. Call after [`is_enabled`] (it checks again, out of line).
#[cold]
#[inline(never)]
pub fn instant(track: Track, name: &'static str, args: &[Arg]) {
    record(track, name, None, false, args);
}

/// A slice of `track` from `start` (a [`now`] reading) to now. Slices of one row must nest:
/// use it for work that one thread (or one lock holder) does from start to end.
#[cold]
#[inline(never)]
pub fn span(track: Track, name: &'static str, start: u64, args: &[Arg]) {
    record(track, name, Some(start), false, args);
}

/// A slice of `track` from `start` (a [`now`] reading) to now that may overlap other slices of
/// the row: a packet in flight, a call outstanding.
#[cold]
#[inline(never)]
pub fn async_span(track: Track, name: &'static str, start: u64, args: &[Arg]) {
    record(track, name, Some(start), true, args);
}

fn record(track: Track, name: &'static str, start: Option<u64>, overlapping: bool, args: &[Arg]) {
    if !is_enabled() {
        return;
    }
    let end = now();
    let thread = THREAD.try_with(Cell::get).unwrap_or(0);
    let mut st = state();
    if !ENABLED.load(Ordering::Relaxed) {
        return; // stopped meanwhile: nothing may trail into a taken trace
    }
    OFFERED.fetch_add(1, Ordering::Relaxed);
    if st.events.len() >= CAP.load(Ordering::Relaxed) {
        st.dropped += 1;
        return;
    }
    let thread = if thread != 0 { thread } else { register_thread(&mut st) };
    let epoch = EPOCH.load(Ordering::Relaxed);
    let begin = start.unwrap_or(end).clamp(epoch, end.max(epoch));
    let dur_ns = end.saturating_sub(begin);
    let kind = match (start, overlapping) {
        (None, _) => Kind::Instant,
        (Some(_), false) => Kind::Span { dur_ns },
        (Some(_), true) => Kind::Async { dur_ns },
    };
    let mut ev = TraceEvent {
        track,
        kind,
        name,
        ts_ns: begin - epoch,
        thread,
        args: [("", Value::U64(0)); MAX_ARGS],
        nargs: 0,
    };
    let n = args.len().min(MAX_ARGS);
    ev.args[..n].copy_from_slice(&args[..n]);
    ev.nargs = n as u8;
    st.events.push(ev);
}

/// Gives the calling thread its trace id and records its name (under the state lock).
fn register_thread(st: &mut State) -> u32 {
    let id = NEXT_THREAD.fetch_add(1, Ordering::Relaxed);
    let name = std::thread::current().name().map_or_else(|| format!("thread {id}"), str::to_owned);
    let i = id as usize - 1;
    if st.threads.len() <= i {
        st.threads.resize(i + 1, String::new());
    }
    st.threads[i] = name;
    let _ = THREAD.try_with(|t| t.set(id));
    id
}

/// A process of the JSON file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Proc {
    Group(&'static str),
    Nic(u32),
    Wire(u32, u32),
}

fn proc_of(track: Track) -> Proc {
    match track {
        Track::Nic(a) => Proc::Nic(a),
        Track::Wire { from, to } => Proc::Wire(from, to),
        Track::Thread(g) => Proc::Group(g),
    }
}

/// Process ids in display order (see [`Track`]).
fn layout(events: &[TraceEvent]) -> Vec<Proc> {
    let mut procs: Vec<(Proc, u64)> = Vec::new(); // (process, first appearance)
    let mut nics: Vec<(u32, u64)> = Vec::new(); // (address, first packet sent; MAX if none)
    let add_nic = |nics: &mut Vec<(u32, u64)>, a: u32, sent: u64| match nics.iter_mut().find(|n| n.0 == a) {
        Some(n) => n.1 = n.1.min(sent),
        None => nics.push((a, sent)),
    };
    for e in events {
        let p = proc_of(e.track);
        match procs.iter_mut().find(|(q, _)| *q == p) {
            Some((_, t)) => *t = (*t).min(e.ts_ns),
            None => procs.push((p, e.ts_ns)),
        }
        match e.track {
            Track::Nic(a) => add_nic(&mut nics, a, u64::MAX),
            Track::Wire { from, to } => {
                add_nic(&mut nics, from, e.ts_ns);
                add_nic(&mut nics, to, u64::MAX);
            }
            Track::Thread(_) => {}
        }
    }
    nics.sort_by_key(|&(a, sent)| (sent, a));
    let rank = |a: u32| nics.iter().position(|n| n.0 == a).unwrap_or(usize::MAX) as u64;
    let key = |&(p, first): &(Proc, u64)| match p {
        Proc::Group(g) => (u8::from(g.starts_with("server")) * 2, first, 0, 0, 0),
        Proc::Nic(a) => (1, rank(a), 0, 0, 0),
        Proc::Wire(f, t) => {
            let (rf, rt) = (rank(f), rank(t));
            (1, rf.min(rt), 1, rf.max(rt), u64::from(rf > rt))
        }
    };
    procs.sort_by_key(key);
    procs.into_iter().map(|(p, _)| p).collect()
}

/// Writes `events` as Chrome trace event JSON: `{"traceEvents":[...]}` with one object per
/// event (phases `i`, `X`, `b`/`e`) and `M` metadata naming every process and thread.
pub fn write_json(out: &mut dyn Write, events: &[TraceEvent]) -> io::Result<()> {
    let threads = state().threads.clone();
    let thread_name = |id: u32| -> &str {
        threads.get((id as usize).wrapping_sub(1)).map_or("unknown thread", String::as_str)
    };
    let procs = layout(events);
    let pid = |p: Proc| procs.iter().position(|&q| q == p).map_or(0, |i| i + 1);
    // Rows: NICs and wires have one (tid 1); groups one per thread (tid = thread id).
    let tid = |e: &TraceEvent| match e.track {
        Track::Thread(_) => e.thread,
        _ => 1,
    };
    let mut order: Vec<usize> = (0..events.len()).collect();
    order.sort_by_key(|&i| (events[i].ts_ns, u8::from(events[i].kind == Kind::Instant)));

    out.write_all(b"{\"displayTimeUnit\":\"ns\",\"otherData\":{\"recorder\":\"bypass\",\"dropped_events\":")?;
    write!(out, "{},\"os_pid\":{}", dropped(), std::process::id())?;
    out.write_all(b"},\"traceEvents\":[\n")?;
    let mut first = true;
    let mut sep = |out: &mut dyn Write| -> io::Result<()> {
        if !std::mem::take(&mut first) {
            out.write_all(b",\n")?;
        }
        Ok(())
    };
    // Metadata: names and sort order.
    let mut rows: Vec<(usize, u32)> = Vec::new();
    for (i, &p) in procs.iter().enumerate() {
        // Each process writes its own file; the suffix tells files of a two-process run apart
        // when they are opened side by side.
        let os_pid = std::process::id();
        let name = match p {
            Proc::Group(g) => format!("{g} [pid {os_pid}]"),
            Proc::Nic(a) => format!("NIC {a} [pid {os_pid}]"),
            Proc::Wire(f, t) => format!("wire {f}\u{2192}{t} [pid {os_pid}]"),
        };
        for (key, arg, value) in
            [("process_name", "name", None), ("process_sort_index", "sort_index", Some(i))]
        {
            sep(out)?;
            write!(
                out,
                "{{\"name\":\"{key}\",\"ph\":\"M\",\"pid\":{},\"tid\":0,\"args\":{{\"{arg}\":",
                i + 1
            )?;
            match value {
                None => write_str(out, &name)?,
                Some(v) => write!(out, "{v}")?,
            }
            out.write_all(b"}}")?;
        }
        if !matches!(p, Proc::Group(_)) {
            rows.push((i + 1, 1));
            meta_thread(&mut sep, out, i + 1, 1, &name, 0)?;
        }
    }
    for e in events {
        if let Track::Thread(g) = e.track {
            let row = (pid(Proc::Group(g)), e.thread);
            if !rows.contains(&row) {
                rows.push(row);
                meta_thread(&mut sep, out, row.0, row.1, thread_name(e.thread), e.thread as usize)?;
            }
        }
    }
    // The events.
    for (n, &i) in order.iter().enumerate() {
        let e = &events[i];
        let (p, t) = (pid(proc_of(e.track)), tid(e));
        let cat = match e.track {
            Track::Nic(_) => "nic",
            Track::Wire { .. } => "wire",
            Track::Thread(g) => g,
        };
        let ph = match e.kind {
            Kind::Instant => "i",
            Kind::Span { .. } => "X",
            Kind::Async { .. } => "b",
        };
        sep(out)?;
        out.write_all(b"{\"name\":")?;
        write_str(out, e.name)?;
        out.write_all(b",\"cat\":")?;
        write_str(out, cat)?;
        write!(out, ",\"ph\":\"{ph}\",\"ts\":")?;
        write_us(out, e.ts_ns)?;
        write!(out, ",\"pid\":{p},\"tid\":{t}")?;
        match e.kind {
            Kind::Instant => out.write_all(b",\"s\":\"t\"")?,
            Kind::Span { dur_ns } => {
                out.write_all(b",\"dur\":")?;
                write_us(out, dur_ns)?;
            }
            Kind::Async { .. } => write!(out, ",\"id\":{}", n + 1)?,
        }
        out.write_all(b",\"args\":{")?;
        let mut comma = false;
        if !matches!(e.track, Track::Thread(_)) {
            out.write_all(b"\"thread\":")?;
            write_str(out, thread_name(e.thread))?;
            comma = true;
        }
        for &(k, v) in e.args() {
            if std::mem::replace(&mut comma, true) {
                out.write_all(b",")?;
            }
            write_str(out, k)?;
            out.write_all(b":")?;
            match v {
                Value::U64(x) if x <= 1 << 53 => write!(out, "{x}")?,
                Value::U64(x) => write!(out, "\"{x:#x}\"")?,
                Value::Str(s) => write_str(out, s)?,
                Value::Bool(b) => write!(out, "{b}")?,
            }
        }
        out.write_all(b"}}")?;
        if let Kind::Async { dur_ns } = e.kind {
            out.write_all(b",\n{\"name\":")?;
            write_str(out, e.name)?;
            out.write_all(b",\"cat\":")?;
            write_str(out, cat)?;
            out.write_all(b",\"ph\":\"e\",\"ts\":")?;
            write_us(out, e.ts_ns + dur_ns)?;
            write!(out, ",\"pid\":{p},\"tid\":{t},\"id\":{}}}", n + 1)?;
        }
    }
    out.write_all(b"\n]}\n")
}

fn meta_thread(
    sep: &mut dyn FnMut(&mut dyn Write) -> io::Result<()>,
    out: &mut dyn Write,
    pid: usize,
    tid: u32,
    name: &str,
    sort: usize,
) -> io::Result<()> {
    sep(out)?;
    write!(out, "{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":{pid},\"tid\":{tid},\"args\":{{\"name\":")?;
    write_str(out, name)?;
    out.write_all(b"}}")?;
    sep(out)?;
    write!(
        out,
        "{{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":{pid},\"tid\":{tid},\"args\":{{\"sort_index\":{sort}}}}}"
    )
}

/// Nanoseconds as microseconds with three decimals.
fn write_us(out: &mut dyn Write, ns: u64) -> io::Result<()> {
    write!(out, "{}.{:03}", ns / 1000, ns % 1000)
}

/// A JSON string literal.
fn write_str(out: &mut dyn Write, s: &str) -> io::Result<()> {
    out.write_all(b"\"")?;
    let mut rest = s;
    while let Some(i) = rest.find(|c: char| c == '"' || c == '\\' || c < ' ') {
        out.write_all(&rest.as_bytes()[..i])?;
        let c = rest.as_bytes()[i];
        match c {
            b'"' => out.write_all(b"\\\"")?,
            b'\\' => out.write_all(b"\\\\")?,
            b'\n' => out.write_all(b"\\n")?,
            b'\r' => out.write_all(b"\\r")?,
            b'\t' => out.write_all(b"\\t")?,
            _ => write!(out, "\\u{c:04x}")?,
        }
        rest = &rest[i + 1..];
    }
    out.write_all(rest.as_bytes())?;
    out.write_all(b"\"")
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// The recorder is process-wide: its tests take turns.
    static SERIAL: Mutex<()> = Mutex::new(());

    fn serial() -> MutexGuard<'static, ()> {
        SERIAL.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn json(events: &[TraceEvent]) -> String {
        let mut v = Vec::new();
        write_json(&mut v, events).unwrap();
        String::from_utf8(v).unwrap()
    }

    #[test]
    fn strings_are_escaped() {
        let mut v = Vec::new();
        write_str(&mut v, "a\"b\\c\nd\u{1}e\u{2192}").unwrap();
        assert_eq!(String::from_utf8(v).unwrap(), "\"a\\\"b\\\\c\\nd\\u0001e\u{2192}\"");
    }

    #[test]
    fn off_records_nothing_and_on_records_in_order() {
        let _g = serial();
        let _ = take();
        instant(Track::Nic(0), "ignored", &[]);
        assert!(take().is_empty(), "recording is off");
        assert_eq!(stamp(), 0, "no clock reading while off");

        start();
        assert!(is_enabled());
        let t0 = stamp();
        assert_ne!(t0, 0);
        instant(Track::Nic(1), "doorbell sq", &[("qpn", 3u32.into()), ("kind", "SEND".into())]);
        async_span(Track::Wire { from: 1, to: 0 }, "SEND", t0, &[("psn", 7u32.into())]);
        span(Track::Thread("server"), "request", t0, &[("ok", true.into())]);
        let ev = take();
        assert!(!is_enabled());
        assert_eq!(ev.len(), 3);
        assert_eq!(ev[0].arg("qpn"), Some(Value::U64(3)));
        assert_eq!(ev[0].arg("kind"), Some(Value::Str("SEND")));
        assert!(matches!(ev[1].kind, Kind::Async { .. }));
        assert!(ev[1].ts_ns <= ev[0].ts_ns, "the slice began before the instant");
        assert!(ev[2].end_ns() >= ev[0].ts_ns);

        let text = json(&ev);
        for needle in [
            "\"traceEvents\":[",
            "\"process_name\"",
            "\"NIC 1 [pid ",
            "\"wire 1\u{2192}0 [pid ",
            "\"server [pid ",
            "\"os_pid\":",
            "\"ph\":\"b\"",
            "\"ph\":\"e\"",
            "\"ph\":\"X\"",
            "\"kind\":\"SEND\"",
            "\"ok\":true",
        ] {
            assert!(text.contains(needle), "{needle} missing from {text}");
        }
        // The NIC that sent first is listed before the other one.
        assert!(text.find("\"NIC 1 [pid ").unwrap() < text.find("\"wire 1\u{2192}0 [pid ").unwrap());
    }

    #[test]
    fn the_cap_counts_drops() {
        let _g = serial();
        CAP.store(3, Ordering::Relaxed);
        start();
        for _ in 0..3 {
            instant(Track::Nic(0), "fits", &[]);
        }
        instant(Track::Nic(0), "one too many", &[]);
        assert_eq!(dropped(), 1);
        assert_eq!(take().len(), 3);
        CAP.store(MAX_EVENTS, Ordering::Relaxed);
        start();
        assert_eq!(dropped(), 0, "start clears");
        stop();
    }

    #[test]
    fn large_numbers_are_strings() {
        let _g = serial();
        start();
        instant(Track::Thread("client"), "big", &[("id", u64::MAX.into()), ("small", 5u64.into())]);
        let ev = take();
        let text = json(&ev);
        assert!(text.contains("\"id\":\"0xffffffffffffffff\""), "{text}");
        assert!(text.contains("\"small\":5"), "{text}");
    }
}
