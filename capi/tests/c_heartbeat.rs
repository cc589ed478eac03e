//! Heartbeat detection from C, both ways, with `server.heartbeat.idle` = 1 s:
//!
//! - a dead server (`tests/c/heartbeat.c` against a `proc.c` server process): the server is
//!   frozen (SIGSTOP: its sockets stay open, only the heartbeat can tell) or killed (SIGKILL),
//!   and the client must see its break handler run once and its outstanding and later calls
//!   fail with OCK_RPC_ERR_CONN_BROKEN, within a bound; over type TCP and over type UBC (the
//!   URMA backend on sim-urma's shared-memory wire);
//! - a frozen client (`tests/c/frozen_client.c`, both sides): the server's break handler runs
//!   once within a bound, the server frees the client's handle and serves a second client
//!   normally, and the thawed client's calls fail with OCK_RPC_ERR_CONN_BROKEN instead of
//!   hanging.

mod c_harness;

use c_harness::compile;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

/// The lines a child prints, sent one by one.
fn lines_of(child: &mut Child) -> Receiver<String> {
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Waits at most `limit` for a line starting with `prefix`; returns the rest of it.
fn expect_line(rx: &Receiver<String>, prefix: &str, limit: Duration, what: &str) -> String {
    let deadline = Instant::now() + limit;
    let mut seen = String::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                if let Some(rest) = line.strip_prefix(prefix) {
                    return rest.trim().to_string();
                }
                seen.push_str(&line);
                seen.push('\n');
            }
            Err(e) => panic!("{what}: no line {prefix:?} within {limit:?} ({e}); it printed:\n{seen}"),
        }
    }
}

/// Waits at most `limit` for `child` to exit; kills it past that.
fn wait_exit(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(s) = child.try_wait().expect("try_wait") {
            return Some(s);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[derive(Clone, Copy, Debug)]
enum Death {
    Frozen,
    Killed,
}

/// Ports of the server processes: `slot` 0, 1, … keeps concurrent tests of this binary apart
/// (a taken port only moves the server to the next of its range).
fn port_range(slot: u32) -> String {
    let base = 33000 + (std::process::id() % 9000) + 250 * slot;
    format!("{base}-{}", base + 200)
}

/// Returns the seconds the client took to see the break. `env` goes to both processes.
fn peer_dies(death: Death, env: &[(String, String)], slot: u32) -> f64 {
    let server_exe = compile("proc.c");
    let client_exe = compile("heartbeat.c");
    let range = port_range(slot);
    let mut server = c_harness::command(&server_exe)
        .args(["server", &range])
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the server process");
    let server_pid = server.id() as libc::pid_t;
    let server_lines = lines_of(&mut server);
    let port = expect_line(&server_lines, "PORT ", Duration::from_secs(60), "the server");

    // The client waits at most 20 s for the break (5 missed 1 s heartbeats: about 5 s).
    let mut client = c_harness::command(&client_exe)
        .args([port.as_str(), "1", "20"])
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the client process");
    let client_lines = lines_of(&mut client);
    expect_line(&client_lines, "READY", Duration::from_secs(60), "the client");

    let signal = match death {
        Death::Frozen => libc::SIGSTOP,
        Death::Killed => libc::SIGKILL,
    };
    // SAFETY: signals a child process of this test, which has not been reaped (no wait yet).
    assert_eq!(unsafe { libc::kill(server_pid, signal) }, 0, "signal the server");
    if matches!(death, Death::Frozen) {
        wait_stopped(server.id(), Duration::from_secs(10));
    }
    client.stdin.as_mut().expect("piped stdin").write_all(b"GO\n").expect("tell the client");

    let detected = std::panic::catch_unwind(|| {
        expect_line(&client_lines, "DETECTED ", Duration::from_secs(40), "the client").parse::<f64>().unwrap()
    });
    let status = wait_exit(&mut client, Duration::from_secs(30));
    let mut stderr = String::new();
    if let Some(mut e) = client.stderr.take() {
        use std::io::Read;
        let _ = e.read_to_string(&mut stderr);
    }
    // The server: thawed and ended (a killed one is only reaped).
    if matches!(death, Death::Frozen) {
        // SAFETY: as above; the child is still unreaped.
        unsafe { libc::kill(server_pid, libc::SIGCONT) };
        let _ = server.kill();
    }
    let _ = wait_exit(&mut server, Duration::from_secs(10));

    let detected = detected.unwrap_or_else(|e| {
        eprintln!("client stderr:\n{stderr}");
        std::panic::resume_unwind(e)
    });
    assert!(status.is_some_and(|s| s.success()), "{death:?}: the client failed ({status:?}):\n{stderr}");
    let rest: Vec<String> = client_lines.try_iter().collect();
    assert!(rest.iter().any(|l| l == "heartbeat ok"), "{death:?}: {rest:?}\n{stderr}");
    detected
}

#[test]
fn a_frozen_server_is_detected_by_the_heartbeat() {
    let t = peer_dies(Death::Frozen, &[], 0);
    // Its sockets stay open: only missed heartbeats (5 × 1 s) can tell, so not at once, and
    // well before the client's 20 s bound.
    assert!((2.0..=20.0).contains(&t), "detected after {t} s");
    eprintln!("frozen server detected after {t:.2} s");
}

#[test]
fn a_killed_server_is_detected() {
    let t = peer_dies(Death::Killed, &[], 1);
    assert!(t <= 20.0, "detected after {t} s");
    eprintln!("killed server detected after {t:.2} s");
}

/// Both processes on the URMA backend: type UBC, sim-urma's `liburma.so` on its shared-memory
/// wire (as tests/c_urma.rs runs proc.c).
#[cfg(feature = "urma")]
fn ubc_env() -> Vec<(String, String)> {
    c_harness::urma_env(Some("shm"), &[("CAPI_COMM_TYPE", "UBC")])
}

#[cfg(feature = "urma")]
#[test]
fn a_frozen_server_is_detected_by_the_heartbeat_over_ubc() {
    let t = peer_dies(Death::Frozen, &ubc_env(), 2);
    assert!((2.0..=20.0).contains(&t), "detected after {t} s");
    eprintln!("frozen server (UBC) detected after {t:.2} s");
}

#[cfg(feature = "urma")]
#[test]
fn a_killed_server_is_detected_over_ubc() {
    let t = peer_dies(Death::Killed, &ubc_env(), 3);
    assert!(t <= 20.0, "detected after {t} s");
    eprintln!("killed server (UBC) detected after {t:.2} s");
}

/// Waits (at most `limit`) until every thread of process `pid` is stopped. SIGSTOP does not stop
/// a process at once: the thread the signal was given to starts the group stop when it next runs,
/// and until then the others go on (on a loaded machine, long enough for a frozen server to
/// acknowledge and serve a request sent after the kill returned).
fn wait_stopped(pid: u32, limit: Duration) {
    let deadline = Instant::now() + limit;
    let stopped = || -> Option<bool> {
        let mut all = true;
        for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
            let stat = std::fs::read_to_string(task.ok()?.path().join("stat")).ok()?;
            // "pid (comm) S ...": the state follows the last ')'.
            let state = stat.rsplit_once(')')?.1.trim_start().chars().next()?;
            all &= matches!(state, 'T' | 't');
        }
        Some(all)
    };
    while stopped() != Some(true) {
        assert!(Instant::now() < deadline, "process {pid} did not stop within {limit:?} of SIGSTOP");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Sends a signal to a child process of this test that has not been reaped.
fn signal(child: &Child, sig: libc::c_int) {
    // SAFETY: `child` is ours and unreaped (no wait has returned its status), so its pid names it.
    assert_eq!(unsafe { libc::kill(child.id() as libc::pid_t, sig) }, 0, "signal {sig} to {}", child.id());
}

/// Everything a child printed after the lines already taken, once its stdout closed (at most
/// `limit`).
fn rest_of(rx: &Receiver<String>, limit: Duration) -> Vec<String> {
    let deadline = Instant::now() + limit;
    let mut lines = Vec::new();
    while let Ok(line) = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        lines.push(line);
    }
    lines
}

/// A client frozen by SIGSTOP (its sockets stay open) is found by the server's keepalive.
/// Returns the seconds from the freeze to the server's break handler.
///
/// The bound: once the client's first probe announced its 1 s × 5 misses, the server declares
/// it gone after the larger of its own `idle × 5` and the client's `idle × (5 + 1)` of silence
/// (docs/protocol.md §13): 6 s from the last probe the client sent, which is at most about
/// 1.25 s before the freeze. The test allows 20 s (a loaded machine), and requires more than
/// 2 s (only missed heartbeats can tell, so not at once).
///
/// `quiet` is how long the client stays silent before the freeze: 3 s lets it send its first
/// probe; 0 freezes it before it ever probed.
fn client_freezes(env: &[(String, String)], slot: u32, quiet: u32) -> f64 {
    let exe = compile("frozen_client.c");
    let proc_exe = compile("proc.c");
    let range = port_range(slot);
    let mut server = c_harness::command(&exe)
        .args(["server", &range, "1"])
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the server process");
    let server_lines = lines_of(&mut server);
    let port = expect_line(&server_lines, "PORT ", Duration::from_secs(60), "the server");

    let mut client = c_harness::command(&exe)
        .args(["client", port.as_str(), "1", "20", &quiet.to_string()])
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the client process");
    let client_lines = lines_of(&mut client);

    // Everything below runs under catch_unwind so that a failure still ends both processes
    // (a frozen child would otherwise outlive the test) and shows their stderr.
    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        assert_eq!(expect_line(&server_lines, "NEW ", Duration::from_secs(60), "the server"), "1");
        // READY comes after `quiet` (3 s: the client sent its first probe meanwhile).
        expect_line(&client_lines, "READY", Duration::from_secs(60), "the client");

        signal(&client, libc::SIGSTOP);
        let frozen_at = Instant::now();
        wait_stopped(client.id(), Duration::from_secs(10));
        let which = expect_line(
            &server_lines,
            "BREAK ",
            Duration::from_secs(20),
            "the server (no break for the frozen client: did its first keepalive probe go out \
             before the freeze?)",
        );
        let detected = frozen_at.elapsed().as_secs_f64();
        assert_eq!(which, "1", "the break handler ran for the frozen client");

        // The server freed the frozen client's handle...
        server.stdin.as_mut().expect("piped stdin").write_all(b"freed 1\n").expect("tell the server");
        assert_eq!(expect_line(&server_lines, "FREED ", Duration::from_secs(10), "the server"), "1");
        // ...and serves a second client normally (proc.c's calls, 100 one-way sends, an iovec).
        let second = c_harness::run(
            &proc_exe,
            &["client", &port],
            c_harness::Run { env: env.to_vec(), timeout: Duration::from_secs(90) },
        );
        second.expect_ok("the second client (proc.c)");
        assert!(second.stdout.contains("client ok"), "{}", second.stdout);
        assert_eq!(expect_line(&server_lines, "NEW ", Duration::from_secs(10), "the server"), "2");

        // The frozen client, thawed, finds its connection broken instead of hanging.
        signal(&client, libc::SIGCONT);
        client.stdin.as_mut().expect("piped stdin").write_all(b"GO\n").expect("tell the client");
        let broken: f64 = expect_line(&client_lines, "BROKEN ", Duration::from_secs(30), "the thawed client")
            .parse()
            .expect("seconds");
        let status = wait_exit(&mut client, Duration::from_secs(30));
        assert!(status.is_some_and(|s| s.success()), "the thawed client failed ({status:?})");
        assert!(rest_of(&client_lines, Duration::from_secs(5)).iter().any(|l| l == "client ok"));

        // The server ends: each client's break handler ran exactly once (the second client's
        // at its disconnect), and it served all of the second client's one-way messages.
        drop(server.stdin.take());
        let status = wait_exit(&mut server, Duration::from_secs(30));
        let rest = rest_of(&server_lines, Duration::from_secs(5));
        assert!(status.is_some_and(|s| s.success()), "the server failed ({status:?}): {rest:?}");
        assert!(rest.iter().any(|l| l == "BREAKS 1 1"), "one break per client: {rest:?}");
        assert!(rest.iter().any(|l| l == "COUNT 100"), "{rest:?}");
        assert!(rest.iter().any(|l| l == "server ok"), "{rest:?}");
        eprintln!("thawed client saw CONN_BROKEN after {broken:.2} s");
        detected
    }));
    for child in [&mut client, &mut server] {
        if child.try_wait().ok().flatten().is_none() {
            signal(child, libc::SIGCONT);
            let _ = child.kill();
        }
        let _ = child.wait();
    }
    run.unwrap_or_else(|e| {
        for (name, child) in [("client", &mut client), ("server", &mut server)] {
            let mut stderr = String::new();
            if let Some(mut e) = child.stderr.take() {
                use std::io::Read;
                let _ = e.read_to_string(&mut stderr);
            }
            eprintln!("{name} stderr:\n{stderr}");
        }
        std::panic::resume_unwind(e)
    })
}

#[test]
fn a_frozen_client_is_detected_by_the_server() {
    let t = client_freezes(&[], 4, 3);
    assert!((2.0..=20.0).contains(&t), "detected after {t} s");
    eprintln!("frozen client detected by the server after {t:.2} s");
}

#[cfg(feature = "urma")]
#[test]
fn a_frozen_client_is_detected_by_the_server_over_ubc() {
    let t = client_freezes(&ubc_env(), 5, 3);
    assert!((2.0..=20.0).contains(&t), "detected after {t} s");
    eprintln!("frozen client (UBC) detected by the server after {t:.2} s");
}

/// A client frozen before its first keepalive probe (one that heard from the server more often
/// than every `idle` until then, as a busy client does) is detected too: its hello announced
/// its keepalive, so the server has a limit from the start (docs/protocol.md §13).
#[test]
fn a_client_frozen_before_its_first_probe_is_detected_by_the_server() {
    let t = client_freezes(&[], 6, 0);
    assert!((2.0..=20.0).contains(&t), "detected after {t} s");
}
