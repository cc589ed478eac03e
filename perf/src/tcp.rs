//! The plain TCP baseline (`--level tcp`): what the same exchange costs over loopback sockets,
//! two threads in this process, `TCP_NODELAY` on.
//!
//! - `lat`: ping-pong; the client writes `size` bytes, the server reads them all and writes them
//!   back.
//! - `bw` and `rate`: the client writes messages back to back, `batch` per `write()` (default 1:
//!   one system call per message); the server reads until the client shuts its side down and
//!   answers with the byte count it got. The clock stops at that answer. There is no window:
//!   TCP's own flow control paces the sender.
//!
//! Warm-up and the measurement use separate connections.
//!
//! By default the sockets block, as a plain TCP program's do: a thread waiting for data sleeps
//! and is woken by the kernel, which on an idle VM costs tens of microseconds per wake-up. With
//! `--busy-poll` the sockets are non-blocking and both threads spin on them (no sleeping, as
//! UCX's tcp transport does), like every other test here.

use crate::cli::{Spec, Test};
use crate::progress::{time_round_trips, Progress};
use crate::stats::{Budget, Clock, Latency, Measured, Throughput};
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::time::Instant;

type Res<T> = Result<T, String>;

const TICK: u64 = 4096;

fn io(what: &'static str) -> impl Fn(std::io::Error) -> String {
    move |e| format!("tcp {what}: {e}")
}

/// Runs one TCP measurement.
pub fn run(
    spec: &Spec,
    batch: usize,
    spin: bool,
    server_cpu: Option<usize>,
    mut progress: Progress,
) -> Res<Measured> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(io("bind"))?;
    let addr = listener.local_addr().map_err(io("bind"))?;
    let phases = if spec.warmup > 0 { 2 } else { 1 };
    let (test, size) = (spec.test, spec.size);
    let server = std::thread::Builder::new()
        .name("perf-tcp-server".into())
        .spawn(move || -> Res<()> {
            crate::affinity::place_server_thread(server_cpu)?;
            for _ in 0..phases {
                let (s, _) = listener.accept().map_err(io("accept"))?;
                s.set_nodelay(true).map_err(io("nodelay"))?;
                s.set_nonblocking(spin).map_err(io("nonblocking"))?;
                let s = Sock(s);
                if test == Test::Lat {
                    echo(s, size)?;
                } else {
                    sink(s)?;
                }
            }
            Ok(())
        })
        .map_err(|e| format!("spawn the TCP server thread: {e}"))?;
    let connect = || -> Res<Sock> {
        let s = TcpStream::connect(addr).map_err(io("connect"))?;
        s.set_nodelay(true).map_err(io("nodelay"))?;
        s.set_nonblocking(spin).map_err(io("nonblocking"))?;
        Ok(Sock(s))
    };
    let result = (|| -> Res<Measured> {
        let mut none = Progress::off();
        let m = match test {
            Test::Lat => {
                if spec.warmup > 0 {
                    latency(connect()?, size, Budget::Iters(spec.warmup), &mut none)?;
                }
                Measured::Lat(latency(connect()?, size, spec.budget, &mut progress)?)
            }
            Test::Bw | Test::Rate => {
                if spec.warmup > 0 {
                    stream(connect()?, size, batch, Budget::Iters(spec.warmup), &mut none)?;
                }
                Measured::Thru(stream(connect()?, size, batch, spec.budget, &mut progress)?)
            }
            Test::Echo | Test::Oneway => return Err("-t echo and -t oneway are RPC tests".into()),
        };
        progress.finish();
        Ok(m)
    })();
    // On an error the server thread may still wait in accept(): leave it (the process ends).
    let m = result?;
    server.join().map_err(|_| "the TCP server thread panicked".to_string())??;
    Ok(m)
}

/// A socket whose reads and writes spin when it is non-blocking and not ready.
struct Sock(TcpStream);

impl Sock {
    /// Reads some bytes; 0 at the end of the stream.
    fn read_some(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            match self.0.read(buf) {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == ErrorKind::WouldBlock => std::hint::spin_loop(),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Fills `buf`; `Ok(false)` at the end of the stream before the first byte.
    fn read_exact(&mut self, buf: &mut [u8]) -> Res<bool> {
        let mut got = 0;
        while got < buf.len() {
            match self.read_some(&mut buf[got..]).map_err(io("read"))? {
                0 if got == 0 => return Ok(false),
                0 => return Err("tcp read: the stream ended inside a message".into()),
                n => got += n,
            }
        }
        Ok(true)
    }

    fn write_all(&mut self, mut buf: &[u8]) -> Res<()> {
        while !buf.is_empty() {
            match self.0.write(buf) {
                Ok(0) => return Err("tcp write: the peer closed".into()),
                Ok(n) => buf = &buf[n..],
                Err(e) if e.kind() == ErrorKind::WouldBlock => std::hint::spin_loop(),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(io("write")(e)),
            }
        }
        Ok(())
    }
}

fn echo(mut s: Sock, size: usize) -> Res<()> {
    let mut buf = vec![0u8; size];
    while s.read_exact(&mut buf)? {
        s.write_all(&buf)?;
    }
    Ok(())
}

fn sink(mut s: Sock) -> Res<()> {
    let mut buf = vec![0u8; 256 << 10];
    let mut total = 0u64;
    loop {
        match s.read_some(&mut buf).map_err(io("read"))? {
            0 => break,
            n => total += n as u64,
        }
    }
    s.write_all(&total.to_le_bytes())
}

fn latency(mut s: Sock, size: usize, budget: Budget, progress: &mut Progress) -> Res<Latency> {
    let out = vec![0xA5u8; size];
    let mut back = vec![0u8; size];
    let latency = time_round_trips(budget, progress, || {
        s.write_all(&out)?;
        if !s.read_exact(&mut back)? {
            return Err("tcp read: the server closed".to_string());
        }
        Ok(())
    })?;
    let _ = s.0.shutdown(Shutdown::Write);
    Ok(latency)
}

fn stream(
    mut s: Sock,
    size: usize,
    batch: usize,
    budget: Budget,
    progress: &mut Progress,
) -> Res<Throughput> {
    let buf = vec![0xA5u8; size * batch];
    let clock = Clock::start(budget);
    let mut sent = 0u64;
    let mut next_tick = TICK;
    while clock.more(sent, Some(Instant::now())) {
        let k = match budget {
            Budget::Iters(n) => (n - sent).min(batch as u64),
            Budget::Time(_) => batch as u64,
        };
        s.write_all(&buf[..k as usize * size])?;
        sent += k;
        if sent >= next_tick {
            next_tick += TICK;
            progress.tick(&clock, sent);
        }
    }
    s.0.shutdown(Shutdown::Write).map_err(io("shutdown"))?;
    let mut got = [0u8; 8];
    if !s.read_exact(&mut got)? {
        return Err("tcp read: the server closed without its byte count".into());
    }
    let secs = clock.start.elapsed().as_secs_f64();
    let bytes = sent * size as u64;
    if u64::from_le_bytes(got) != bytes {
        return Err(format!("tcp: the server got {} bytes of {bytes}", u64::from_le_bytes(got)));
    }
    Ok(Throughput { msgs: sent, bytes, secs })
}
