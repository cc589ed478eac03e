//! `bypass-perf`: perftest-style latency (`lat`), bandwidth (`bw`) and message-rate (`rate`)
//! tests of the bypass stack, at the RPC level (`Channel` and `Server`, every call mode), at the
//! HAL level (raw queue pairs: send, write, write-imm, read) and, as a baseline, over plain
//! loopback TCP. `docs/perf.md` explains every option and how to read the output.
//!
//! ```text
//! cargo run --release -p bypass-perf                        # RPC lat + rate, 64 B / 1 KiB / 4 KiB
//! cargo run --release -p bypass-perf -- --level hal -t lat,bw --op all -s 64
//! cargo run --release -p bypass-perf -- -t rate --mode all -w 64 --json
//! ```

mod affinity;
mod cli;
mod hal;
mod progress;
mod report;
mod rpc;
mod samples;
mod stats;
mod tcp;

use bypass::hal::Device;
use bypass::{Backend, WithDevices};
use clap::{CommandFactory, Parser};
use cli::{Args, EngineArg, Level, Plan};
use progress::Progress;
use report::Report;

/// Round trips of the bare cache-line bounce measured first, and its time limit.
const BOUNCE_ITERS: u64 = 500_000;
const BOUNCE_LIMIT: std::time::Duration = std::time::Duration::from_millis(300);

fn main() {
    affinity::save_original();
    let args = Args::try_parse().unwrap_or_else(|e| usage_error(e));
    let plan = match cli::plan(&args).and_then(|p| check_pins(&p).and_then(|()| check_trace(&p)).map(|()| p))
    {
        Ok(p) => p,
        Err(e) => usage_error(Args::command().error(clap::error::ErrorKind::ValueValidation, e)),
    };
    if let Err(e) = run(&plan) {
        eprintln!("bypass-perf: error: {e}");
        std::process::exit(1);
    }
}

fn run(plan: &Plan) -> Result<(), String> {
    let mut report = Report::new(plan.json);
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let engine_name = plan.engine.map_or("-", EngineArg::name);
    let place = match (plan.pin, plan.one_thread) {
        (_, true) => "client and server driven by one thread".to_string(),
        ((None, None), false) => "client and server on two threads, unpinned".to_string(),
        ((Some(c), None), false) => format!("client and server on two threads, client pinned to CPU {c}"),
        ((c, s), false) => format!(
            "client and server on two threads, pinned to CPUs {} (client) and {} (server)",
            c.map_or("-".into(), |c| c.to_string()),
            s.map_or("-".into(), |s| s.to_string())
        ),
    };
    let nic = match plan.level {
        Level::Tcp => None,
        _ => Some(open_backend(plan)?),
    };
    let backend = match (&nic, plan.level) {
        (_, Level::Tcp) if plan.busy_poll => "loopback TCP sockets (no NIC), busy-polled".to_string(),
        (_, Level::Tcp) => "loopback TCP sockets (no NIC), blocking".to_string(),
        (Some(b), _) if plan.backend == "sim" => {
            let _ = b;
            format!("backend sim (the software NIC, in this process), engine {engine_name}")
        }
        (Some(b), _) => format!("backend {}", b.describe()),
        (None, _) => unreachable!("a NIC backend is opened for every level but tcp"),
    };
    report.note(&format!(
        "bypass-perf {}: level {}, {backend}, {cpus} CPUs, {place}",
        env!("CARGO_PKG_VERSION"),
        plan.level.name()
    ));
    if plan.bounce && !matches!(plan.peer, Some(cli::Peer::Server(_))) {
        report.bounce(stats::bounce(BOUNCE_ITERS, BOUNCE_LIMIT), cpus);
        if plan.bounce_only {
            return Ok(());
        }
    }
    // The client is this thread (after the bounce, which runs unpinned).
    if let Some(cpu) = plan.pin.0 {
        bypass::pin_current_thread(cpu).map_err(|e| format!("--pin: CPU {cpu}: {e}"))?;
    }
    if plan.trace.is_some() {
        bypass::hal::trace::start();
    }
    let result = measure_all(plan, nic.as_ref(), &mut report);
    if let Some(path) = &plan.trace {
        let n = bypass::hal::trace::finish(path)
            .map_err(|e| format!("--trace: write {}: {e}", path.display()))?;
        eprintln!(
            "trace: {n} events written to {}; open it in https://ui.perfetto.dev (or chrome://tracing)",
            path.display()
        );
    }
    result
}

/// Exits with clap's one-line error, always followed by the usage (clap leaves the usage out of
/// some errors, such as an invalid value); `--help` and `--version` print as usual.
fn usage_error(e: clap::Error) -> ! {
    use clap::error::ErrorKind;
    if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
        e.exit()
    }
    let mut text = e.render().to_string();
    if !text.contains("Usage:") {
        let usage = Args::command().render_usage().to_string();
        text = match text.find("\nFor more information") {
            Some(i) => format!("{}\n{usage}\n{}", &text[..i], &text[i..]),
            None => format!("{}\n{usage}\n", text.trim_end()),
        };
    }
    eprint!("{text}");
    std::process::exit(2)
}

/// Checks that the CPUs of `--pin` exist and may be used, each on a scratch thread, so that a
/// bad number is an argument error rather than a failure (or a worker's warning) later.
fn check_pins(plan: &Plan) -> Result<(), String> {
    for cpu in [plan.pin.0, plan.pin.1].into_iter().flatten() {
        std::thread::spawn(move || bypass::pin_current_thread(cpu))
            .join()
            .map_err(|_| "--pin: the check thread panicked".to_string())?
            .map_err(|e| format!("--pin: CPU {cpu}: {e}"))?;
    }
    Ok(())
}

/// Checks that `--trace`'s file can be written before anything runs, rather than failing after
/// the whole measurement.
fn check_trace(plan: &Plan) -> Result<(), String> {
    match &plan.trace {
        Some(path) => std::fs::File::create(path)
            .map(drop)
            .map_err(|e| format!("--trace: cannot write {}: {e}", path.display())),
        None => Ok(()),
    }
}

/// Opens `--backend` (for the simulator, with `--engine`).
fn open_backend(plan: &Plan) -> Result<Backend, String> {
    let spec = match (plan.backend.as_str(), plan.engine) {
        ("sim", Some(EngineArg::Threaded)) => "sim:threaded".to_string(),
        ("sim", _) => "sim:inline".to_string(),
        (options, engine) if options.starts_with("sim,") => {
            format!("sim:{}{}", engine.unwrap_or(EngineArg::Inline).name(), &options[3..])
        }
        (wire, Some(EngineArg::Threaded)) if wire.starts_with("sim+") => {
            format!("sim:threaded{}", &wire[3..])
        }
        (other, _) => other.to_string(),
    };
    Backend::open(&spec).map_err(|e| format!("--backend {}: {e}", plan.backend))
}

fn label(plan: &Plan, spec: &cli::Spec) -> String {
    format!("{} {} {} {} B", plan.level.name(), spec.test.name(), spec.what.name(), spec.size)
}

/// The HAL and RPC levels, generic over the backend's device type.
struct Measure<'a> {
    plan: &'a Plan,
    report: &'a mut Report,
}

impl WithDevices for Measure<'_> {
    type Output = Result<(), String>;

    fn run<D: Device + Clone>(self, server: &D, client: &D) -> Result<(), String> {
        let Measure { plan, report } = self;
        match plan.level {
            Level::Hal => {
                for spec in &plan.specs {
                    let progress = Progress::new(plan.progress, label(plan, spec));
                    let m = hal::run(client, server, spec, plan, progress)
                        .map_err(|e| format!("{}: {e}", label(plan, spec)))?;
                    report.row(plan, spec, &m);
                }
            }
            Level::Rpc => {
                let rig = match &plan.peer {
                    Some(cli::Peer::Server(addr)) => return rpc::serve(server, addr, plan, report),
                    Some(cli::Peer::Client(addr)) => rpc::Rig::connect(client, addr, plan)?,
                    None => rpc::Rig::new(server, client, plan)?,
                };
                for spec in &plan.specs {
                    let progress = Progress::new(plan.progress, label(plan, spec));
                    let m =
                        rig.run(spec, plan, progress).map_err(|e| format!("{}: {e}", label(plan, spec)))?;
                    report.row(plan, spec, &m);
                }
                report.note("");
                report.note(&rig.summary());
            }
            Level::Tcp => unreachable!("the TCP level has no NIC"),
        }
        Ok(())
    }
}

fn measure_all(plan: &Plan, nic: Option<&Backend>, report: &mut Report) -> Result<(), String> {
    match (plan.level, nic) {
        (Level::Hal | Level::Rpc, Some(backend)) => backend.run(Measure { plan, report })?,
        (Level::Hal | Level::Rpc, None) => unreachable!("opened in run()"),
        (Level::Tcp, _) => {
            for spec in &plan.specs {
                let progress = Progress::new(plan.progress, label(plan, spec));
                let m = tcp::run(spec, plan.batch, plan.busy_poll, plan.pin.1, progress)
                    .map_err(|e| format!("{}: {e}", label(plan, spec)))?;
                report.row(plan, spec, &m);
            }
        }
    }
    Ok(())
}
