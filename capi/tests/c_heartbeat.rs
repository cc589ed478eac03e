//! Heartbeat detection from C (`tests/c/heartbeat.c`): a client with `server.heartbeat.idle` = 1 s
//! and a break handler talks to a `proc.c` server process; the server is then frozen (SIGSTOP:
//! its sockets stay open, only the heartbeat can tell) or killed (SIGKILL), and the client must
//! see the break handler run once and its outstanding and later calls fail with
//! OCK_RPC_ERR_CONN_BROKEN, within a bound.

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

/// Returns the seconds the client took to see the break.
fn peer_dies(death: Death) -> f64 {
    let server_exe = compile("proc.c");
    let client_exe = compile("heartbeat.c");
    let base = 33000 + (std::process::id() % 9000) + if matches!(death, Death::Frozen) { 0 } else { 300 };
    let range = format!("{base}-{}", base + 200);
    let mut server = c_harness::command(&server_exe)
        .args(["server", &range])
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
    let t = peer_dies(Death::Frozen);
    // Its sockets stay open: only missed heartbeats (5 × 1 s) can tell, so not at once, and
    // well before the client's 20 s bound.
    assert!((2.0..=20.0).contains(&t), "detected after {t} s");
    eprintln!("frozen server detected after {t:.2} s");
}

#[test]
fn a_killed_server_is_detected() {
    let t = peer_dies(Death::Killed);
    assert!(t <= 20.0, "detected after {t} s");
    eprintln!("killed server detected after {t:.2} s");
}
