//! Output: a readable table (default) or one JSON object per result line (`--json`).

use crate::cli::{Level, Plan, Spec, What};
use crate::stats::{Latency, Measured, Throughput};
use serde_json::{json, Map, Value};
use std::io::Write;

/// `println!` that ends the program quietly when the reader has gone (`bypass-perf | head`)
/// instead of panicking, and with an error for any other failure to write.
macro_rules! out {
    ($($arg:tt)*) => {
        emit(format_args!($($arg)*))
    };
}

fn emit(line: std::fmt::Arguments<'_>) {
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = stdout.write_fmt(line).and_then(|()| stdout.write_all(b"\n")) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("bypass-perf: error: writing the results: {e}");
        std::process::exit(1);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Lat,
    Thru,
    Echo,
}

/// Prints results as they come.
#[derive(Debug)]
pub struct Report {
    json: bool,
    last: Option<Kind>,
}

impl Report {
    pub fn new(json: bool) -> Report {
        Report { json, last: None }
    }

    /// A line of context before the results (table mode only).
    pub fn note(&self, line: &str) {
        if !self.json {
            out!("{line}");
        }
    }

    /// The bare cache-line bounce.
    pub fn bounce(&self, ns: f64, cpus: usize) {
        if self.json {
            out!("{}", json!({ "test": "bounce", "round_trip_us": us(ns), "cpus": cpus }));
        } else {
            out!(
                "bare cache-line bounce between two threads: {:.3} us round trip (the floor of every two-thread figure below)",
                ns / 1e3
            );
        }
    }

    pub fn row(&mut self, plan: &Plan, spec: &Spec, m: &Measured) {
        if self.json {
            out!("{}", Value::Object(json_row(plan, spec, m)));
            return;
        }
        let kind = match m {
            Measured::Lat(_) => Kind::Lat,
            Measured::Thru(_) => Kind::Thru,
            Measured::Echo(_) => Kind::Echo,
        };
        if self.last != Some(kind) {
            out!("");
            match kind {
                Kind::Lat => {
                    out!("{}", lat_title(plan.level));
                    out!(
                        "{:<5} {:<4} {:<9} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
                        "level",
                        "test",
                        what_header(plan.level),
                        "bytes",
                        "iters",
                        "p50",
                        "p90",
                        "p99",
                        "p99.9",
                        "max",
                        "mean"
                    );
                }
                Kind::Echo => {
                    out!("blocking echo calls (arguments and response of the same size; oneway: arguments in registered memory, empty reply), and a plain memcpy of that size in the same run; MiB/s of arguments, moved: both ways");
                    out!(
                        "{:<5} {:<4} {:<9} {:>8} {:>9} {:>10} {:>12} {:>6} {:>11} {:>6}",
                        "level",
                        "test",
                        what_header(plan.level),
                        "bytes",
                        "iters",
                        "MiB/s",
                        "memcpy MiB/s",
                        "ratio",
                        "moved MiB/s",
                        "ratio"
                    );
                }
                Kind::Thru => {
                    out!("{}", thru_title(plan.level));
                    out!(
                        "{:<5} {:<4} {:<9} {:>8} {:>9} {:>6} {:>5} {:>9} {:>10}",
                        "level",
                        "test",
                        what_header(plan.level),
                        "bytes",
                        "iters",
                        "window",
                        "batch",
                        "M msg/s",
                        "MiB/s"
                    );
                }
            }
            self.last = Some(kind);
        }
        let head = format!(
            "{:<5} {:<4} {:<9} {:>8}",
            plan.level.name(),
            spec.test.name(),
            spec.what.name(),
            spec.size
        );
        match m {
            Measured::Lat(l) => out!(
                "{head} {:>9} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>9.3}",
                l.iters,
                l.p50 / 1e3,
                l.p90 / 1e3,
                l.p99 / 1e3,
                l.p999 / 1e3,
                l.max / 1e3,
                l.mean / 1e3
            ),
            Measured::Echo(e) => {
                let (rpc, copy, moved) = (e.mib_per_sec(), e.memcpy_mib_per_sec(), e.moved_mib_per_sec());
                let ratio = |x: f64| if copy > 0.0 { x / copy } else { 0.0 };
                out!(
                    "{head} {:>9} {:>10.1} {:>12.1} {:>6.3} {:>11.1} {:>6.3}",
                    e.iters,
                    rpc,
                    copy,
                    ratio(rpc),
                    moved,
                    ratio(moved)
                );
            }
            Measured::Thru(t) => {
                let window = if plan.level == Level::Tcp { "-".to_string() } else { plan.window.to_string() };
                out!(
                    "{head} {:>9} {:>6} {:>5} {:>9.3} {:>10.1}",
                    t.msgs,
                    window,
                    plan.batch,
                    t.msgs_per_sec() / 1e6,
                    t.mib_per_sec()
                );
            }
        }
    }
}

fn what_header(level: Level) -> &'static str {
    match level {
        Level::Hal => "op",
        Level::Rpc => "mode",
        Level::Tcp => "socket",
    }
}

fn lat_title(level: Level) -> &'static str {
    match level {
        Level::Rpc => "round trip of a blocking call, in us (client sends arguments, server echoes them)",
        Level::Hal => "round trip in us (send, write-imm: ping-pong; write, read: post to completion)",
        Level::Tcp => "round trip in us (loopback TCP ping-pong, TCP_NODELAY)",
    }
}

fn thru_title(level: Level) -> &'static str {
    match level {
        Level::Rpc => "calls per second with a window of calls in flight (rate: echo; bw: empty responses)",
        Level::Hal => "one-way messages per second and payload bandwidth (window of work requests in flight)",
        Level::Tcp => "one-way messages per second over loopback TCP (batch: messages per write())",
    }
}

fn us(ns: f64) -> f64 {
    (ns * 1e-3 * 1e4).round() / 1e4
}

fn json_row(plan: &Plan, spec: &Spec, m: &Measured) -> Map<String, Value> {
    let mut o = Map::new();
    o.insert("level".into(), plan.level.name().into());
    o.insert("test".into(), spec.test.name().into());
    match spec.what {
        What::Op(op) => {
            o.insert("op".into(), op.name().into());
        }
        What::Mode(_) => {
            o.insert("mode".into(), spec.what.name().into());
        }
        What::Tcp(_) => {
            o.insert("socket".into(), spec.what.name().into());
        }
    }
    let backend = if plan.level == Level::Tcp { Value::Null } else { plan.backend.as_str().into() };
    o.insert("backend".into(), backend);
    o.insert("engine".into(), plan.engine.map_or(Value::Null, |e| e.name().into()));
    o.insert("threads".into(), (if plan.one_thread { 1 } else { 2 }).into());
    o.insert("size".into(), spec.size.into());
    o.insert("warmup".into(), spec.warmup.into());
    match m {
        Measured::Lat(Latency { iters, secs, min, p50, p90, p99, p999, max, mean }) => {
            o.insert("iters".into(), (*iters).into());
            o.insert("secs".into(), (*secs).into());
            for (k, v) in [
                ("min_us", min),
                ("p50_us", p50),
                ("p90_us", p90),
                ("p99_us", p99),
                ("p999_us", p999),
                ("max_us", max),
                ("mean_us", mean),
            ] {
                o.insert(k.into(), us(*v).into());
            }
        }
        Measured::Echo(e) => {
            o.insert("iters".into(), e.iters.into());
            o.insert("secs".into(), e.secs.into());
            o.insert("mib_per_sec".into(), ((e.mib_per_sec() * 100.0).round() / 100.0).into());
            o.insert("memcpy_mib_per_sec".into(), ((e.memcpy_mib_per_sec() * 100.0).round() / 100.0).into());
            o.insert("moved_mib_per_sec".into(), ((e.moved_mib_per_sec() * 100.0).round() / 100.0).into());
        }
        Measured::Thru(t @ Throughput { msgs, secs, .. }) => {
            o.insert("iters".into(), (*msgs).into());
            o.insert("secs".into(), (*secs).into());
            let window = if plan.level == Level::Tcp { Value::Null } else { plan.window.into() };
            o.insert("window".into(), window);
            o.insert("batch".into(), plan.batch.into());
            if plan.level == Level::Rpc {
                o.insert("queues".into(), plan.queues.into());
            }
            o.insert("msgs_per_sec".into(), t.msgs_per_sec().round().into());
            o.insert("mib_per_sec".into(), ((t.mib_per_sec() * 100.0).round() / 100.0).into());
        }
    }
    o
}
