//! An echo server and client on the simulator: the control plane runs over real TCP, the data path
//! over simulated NICs — in one process (two NICs on the in-process wire), or as two processes
//! (or hosts) whose NICs talk RoCEv2 over the UDP wire.
//!
//! ```text
//! cargo run --release -p bypass --example echo
//! cargo run --release -p bypass --example echo -- --engine threaded
//! BYPASS_TRACE=echo.json cargo run --release -p bypass --example echo   # + a Chrome trace
//!
//! # two processes: the server prints its address, the client takes it
//! cargo run --release -p bypass --example echo -- --server 127.0.0.1:7100 --wire udp://127.0.0.1:0
//! cargo run --release -p bypass --example echo -- --client 127.0.0.1:7100 --wire udp://127.0.0.1:0
//! ```
//!
//! Across two hosts, give each side its own address in `--wire` (the one the other host reaches it
//! at) and the client the server host's address in `--client`.
//!
//! It shows a handler that replies at once (`echo`), one that hands its request to another
//! thread which replies later (`upper`), and the three ways to wait for a call: blocking, a
//! callback, and a `Future` (driven here by a ten-line executor, since the core has no runtime).
//! With `BYPASS_TRACE=<file>` the run is recorded (`bypass_hal::trace`) and written to the file as
//! a Chrome trace: open it in <https://ui.perfetto.dev> (docs/sim.md, "Tracing").

use bypass::{
    CallMode, CallOptions, Channel, ChannelConfig, FunctionId, Functions, PollMode, Server, ServerConfig,
    WorkerConfig, WorkerGroup,
};
use bypass_sim::{Engine, Fabric, FabricConfig, WireConfig};
use std::future::Future;
use std::sync::{mpsc, Arc};
use std::task::{Context, Poll, Wake, Waker};

const ECHO: FunctionId = match FunctionId::new(0x100, 1, true, 1) {
    Some(f) => f,
    None => panic!("invalid function id"),
};
const UPPER: FunctionId = match FunctionId::new(0x100, 1, true, 2) {
    Some(f) => f,
    None => panic!("invalid function id"),
};

/// Runs a future to completion on this thread, parking between polls.
fn block_on<F: Future>(fut: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut fut = std::pin::pin!(fut);
    loop {
        if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park();
    }
}

/// What the command line asked for.
struct Opts {
    engine: Engine,
    wire: WireConfig,
    /// Serve at this address (and run no client).
    serve: Option<String>,
    /// Connect to a server at this address (and run no server).
    connect: Option<String>,
}

fn opts() -> Result<Opts, String> {
    let mut o = Opts { engine: Engine::Inline, wire: WireConfig::InProcess, serve: None, connect: None };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--engine" => {
                o.engine = match value()?.as_str() {
                    "inline" => Engine::Inline,
                    "threaded" => Engine::Threaded,
                    e => return Err(format!("--engine {e}: use inline or threaded")),
                }
            }
            "--wire" => o.wire = WireConfig::parse(&value()?)?,
            "--server" => o.serve = Some(value()?),
            "--client" => o.connect = Some(value()?),
            _ => {
                return Err(format!(
                    "unknown argument {a}: use [--engine inline|threaded] [--wire udp://IP:0] [--server ADDR | --client ADDR]"
                ))
            }
        }
    }
    if (o.serve.is_some() || o.connect.is_some()) && o.wire == WireConfig::InProcess {
        return Err("--server/--client run the two sides in two processes: give --wire udp://IP:0 too".into());
    }
    Ok(o)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let trace_file = bypass::hal::trace::start_from_env();
    let o = opts()?;
    let fabric = Fabric::try_with_config(FabricConfig { wire: o.wire, ..FabricConfig::new(o.engine) })?;
    if let Some(addr) = &o.connect {
        client(&fabric.try_add_nic()?, addr)?;
    } else {
        let server_nic = fabric.try_add_nic()?;
        let (server, replier) = server(&server_nic, o.serve.as_deref().unwrap_or("127.0.0.1:0"))?;
        if o.serve.is_some() {
            println!("serving until stdin closes (Ctrl-D) or the process is killed");
            let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut Vec::new());
        } else {
            client(&fabric.try_add_nic()?, &server.local_addr().to_string())?;
        }
        let s = server.stats();
        println!(
            "server: {} requests, {} responses, {} unknown functions",
            s.requests, s.responses, s.unknown_functions
        );
        drop(server);
        replier.join().map_err(|_| "replier thread panicked")?;
    }
    if let Some(path) = trace_file {
        let n = bypass::hal::trace::finish(&path)?;
        println!("trace: {n} events written to {} (open it in https://ui.perfetto.dev)", path.display());
    }
    Ok(())
}

type Nic = bypass_sim::SimNic;

/// The server: `echo` replies inline; `upper` is answered later by another thread.
fn server(
    nic: &Nic,
    addr: &str,
) -> Result<(Server<Nic>, std::thread::JoinHandle<()>), Box<dyn std::error::Error>> {
    let (to_replier, requests) = mpsc::channel::<bypass::Request<_>>();
    let replier = std::thread::spawn(move || {
        for req in requests {
            let text = req.args().to_ascii_uppercase();
            if let Err(e) = req.reply(&text) {
                eprintln!("reply failed: {e}");
            }
        }
    });
    let mut functions = Functions::new();
    functions.register(ECHO, |req| {
        let _ = req.reply_with(bypass::Status::Success, |args, out| {
            out[..args.len()].copy_from_slice(args);
            Ok(args.len())
        });
    });
    let to_replier = std::sync::Mutex::new(to_replier);
    functions.register(UPPER, move |req| {
        let _ = to_replier.lock().map(|tx| tx.send(req));
    });
    let server = Server::bind(nic, addr, ServerConfig::new("echo-server"), functions)?;
    match nic.udp_addr() {
        Some(udp) => {
            println!("server 'echo-server' listening on {} (data path: UDP {udp})", server.local_addr())
        }
        None => println!("server 'echo-server' listening on {}", server.local_addr()),
    }
    Ok((server, replier))
}

/// The client: blocking, ACK-mode, callback and future calls.
fn client(client_nic: &Nic, addr: &str) -> Result<(), Box<dyn std::error::Error>> {
    // The client: two queues; blocking calls poll the channel themselves.
    let config =
        ChannelConfig { queues: 2, client_info: "echo example".into(), ..ChannelConfig::new("echo-server") };
    let channel = Channel::connect(client_nic, addr, config)?;
    println!("connected: channel {} to '{}'", channel.channel_id(), channel.server_name());

    let mut response = Vec::new();
    channel.call(ECHO, b"hello, bypass", &mut response)?;
    println!("blocking echo      -> {:?}", String::from_utf8_lossy(&response));

    let info = channel.call_with(&CallOptions::mode(CallMode::Ack), UPPER, b"ack first", &mut response)?;
    println!(
        "ACK-mode upper     -> {:?} (acked before the response: {})",
        String::from_utf8_lossy(&response),
        info.acked
    );

    let unknown = FunctionId::new(0x100, 1, true, 99).ok_or("id")?;
    match channel.call(unknown, b"?", &mut response) {
        Err(e) => println!("unknown function   -> error: {e}"),
        Ok(()) => println!("unknown function   -> unexpectedly answered"),
    }

    // Callbacks and futures need someone to poll the channel: a worker group.
    let workers = WorkerGroup::new(WorkerConfig { threads: 1, mode: PollMode::Event, ..Default::default() })?;
    workers.add(channel.pollable());
    let (done_tx, done_rx) = mpsc::channel();
    channel.call_callback(&CallOptions::default(), ECHO, b"by callback", move |r| {
        let _ = done_tx.send(r.map(|d| String::from_utf8_lossy(d).into_owned()).map_err(|e| e.to_string()));
    })?;
    println!("callback echo      -> {:?}", done_rx.recv()?);
    let fut = channel.call_future(&CallOptions::default(), UPPER, b"by future")?;
    println!("future upper       -> {:?}", String::from_utf8_lossy(&block_on(fut)?));

    drop(workers);
    drop(channel);
    Ok(())
}
