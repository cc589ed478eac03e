//! The `bypass-perf` binary end to end: short runs print a table or JSON lines, bad arguments
//! give one error line and the usage (exit 2), never a panic.

use std::io::BufRead;
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;

/// One run at a time: every run spins two or more threads, and this machine may have two CPUs.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn perf(args: &[&str]) -> Output {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    Command::new(env!("CARGO_BIN_EXE_bypass-perf")).args(args).output().expect("run bypass-perf")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn ok(args: &[&str]) -> String {
    let o = perf(args);
    assert!(o.status.success(), "bypass-perf {args:?} failed: {}\n{}", stderr(&o), stdout(&o));
    assert!(!stderr(&o).contains("panicked"), "{}", stderr(&o));
    stdout(&o)
}

/// The table's rows for `level` and `test`: their columns.
fn rows<'a>(out: &'a str, level: &str, test: &str) -> Vec<Vec<&'a str>> {
    out.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|c| c.len() > 2 && c[0] == level && c[1] == test)
        .collect()
}

fn number(s: &str) -> f64 {
    s.parse().unwrap_or_else(|_| panic!("not a number: {s}"))
}

#[test]
fn rpc_latency_table() {
    let out = ok(&["--level", "rpc", "-t", "lat", "-s", "64", "-n", "2000"]);
    assert!(out.contains("bare cache-line bounce between two threads"), "{out}");
    assert!(out.contains("2 CPUs") || out.contains("1 CPUs") || out.contains(" CPUs"), "{out}");
    let header = out.lines().find(|l| l.starts_with("level")).expect("a table header");
    for col in ["bytes", "iters", "p50", "p90", "p99", "p99.9", "max", "mean"] {
        assert!(header.split_whitespace().any(|c| c == col), "column {col} missing: {header}");
    }
    let r = rows(&out, "rpc", "lat");
    assert_eq!(r.len(), 1, "{out}");
    let r = &r[0];
    assert_eq!((r[2], r[3], r[4]), ("wait", "64", "2000"));
    let p: Vec<f64> = r[5..11].iter().map(|s| number(s)).collect();
    assert!(p[0] > 0.0, "{out}");
    assert!(p.windows(2).take(4).all(|w| w[0] <= w[1]), "percentiles must not decrease: {out}");
    assert!(out.contains("0 timeouts") && out.contains("0 contexts in use"), "{out}");
}

#[test]
fn rpc_json_lines_parse() {
    let out =
        ok(&["--level", "rpc", "-t", "lat,rate", "--mode", "wait,ack", "-s", "64", "-n", "2000", "--json"]);
    let objs: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert_eq!(objs[0]["test"], "bounce", "{out}");
    assert!(objs[0]["round_trip_us"].as_f64().unwrap() > 0.0);
    assert!(objs[0]["cpus"].as_u64().unwrap() >= 1);
    let results = &objs[1..];
    assert_eq!(results.len(), 4, "lat and rate for two modes: {out}");
    for r in results {
        assert_eq!(r["level"], "rpc");
        assert_eq!(r["backend"], "sim");
        assert_eq!(r["engine"], "inline");
        assert_eq!(r["size"], 64);
        assert_eq!(r["iters"], 2000);
        match r["test"].as_str().unwrap() {
            "lat" => {
                let p50 = r["p50_us"].as_f64().unwrap();
                assert!(p50 > 0.0 && p50 <= r["p99_us"].as_f64().unwrap());
                assert!(r["p999_us"].as_f64().unwrap() <= r["max_us"].as_f64().unwrap());
            }
            "rate" => {
                assert!(r["msgs_per_sec"].as_f64().unwrap() > 0.0);
                assert_eq!(r["window"], 32);
            }
            t => panic!("unexpected test {t}"),
        }
    }
    let modes: Vec<&str> = results.iter().map(|r| r["mode"].as_str().unwrap()).collect();
    assert_eq!(modes, ["wait", "ack", "wait", "ack"]);
}

#[test]
fn hal_bandwidth_every_op() {
    let out = ok(&["--level", "hal", "-t", "bw", "--op", "all", "-s", "4k", "-n", "2000", "--no-bounce"]);
    assert!(!out.contains("bare cache-line bounce"));
    let r = rows(&out, "hal", "bw");
    let ops: Vec<&str> = r.iter().map(|c| c[2]).collect();
    assert_eq!(ops, ["send", "write", "write-imm", "read"], "{out}");
    for c in &r {
        assert_eq!((c[3], c[4]), ("4096", "2000"));
        assert!(number(c[7]) > 0.0 && number(c[8]) > 0.0, "{out}");
    }
}

#[test]
fn hal_latency_and_rate_one_thread() {
    let out = ok(&[
        "--level",
        "hal",
        "-t",
        "lat,rate",
        "--op",
        "send,read",
        "-s",
        "64",
        "-n",
        "2000",
        "--one-thread",
    ]);
    assert!(out.contains("driven by one thread"), "{out}");
    assert_eq!(rows(&out, "hal", "lat").len(), 2, "{out}");
    assert_eq!(rows(&out, "hal", "rate").len(), 2, "{out}");
}

#[test]
fn rpc_every_mode_and_bandwidth() {
    let out =
        ok(&["-t", "lat,bw", "--mode", "all", "-s", "1k", "-n", "1000", "-w", "8", "--no-bounce", "--json"]);
    let objs: Vec<serde_json::Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(objs.len(), 8, "{out}");
    for o in objs.iter().filter(|o| o["test"] == "bw") {
        assert_eq!(o["window"], 8);
        assert_eq!(o["batch"], 8);
        assert!(o["mib_per_sec"].as_f64().unwrap() > 0.0);
    }
}

#[test]
fn the_sweep_crosses_the_eager_limit_into_rendezvous_sizes() {
    // 4096-byte messages leave 4076 bytes of arguments: the sweep passes that edge and goes on
    // by rendezvous.
    let out = ok(&["-t", "lat", "-a", "--msg-size", "4096", "--max-size", "16k", "-n", "200", "--no-bounce"]);
    let sizes: Vec<&str> = rows(&out, "rpc", "lat").iter().map(|c| c[3]).collect();
    assert_eq!(sizes.first(), Some(&"2"));
    assert_eq!(sizes[11..], ["4076", "4096", "8192", "16384"], "{out}");
    // Echo against memcpy, forced rendezvous.
    let out = ok(&["-t", "echo", "--rendezvous", "-s", "64k", "-n", "20", "--no-bounce"]);
    let row = &rows(&out, "rpc", "echo")[0];
    assert_eq!(row[3], "65536", "{out}");
    assert!(row[5].parse::<f64>().unwrap() > 0.0 && row[6].parse::<f64>().unwrap() > 0.0, "{out}");
}

#[test]
fn tcp_baseline_and_duration() {
    let out = ok(&["--level", "tcp", "-t", "lat,rate", "-s", "64", "-D", "0.2", "--no-bounce"]);
    assert_eq!(rows(&out, "tcp", "lat").len(), 1, "{out}");
    assert_eq!(rows(&out, "tcp", "rate")[0][2], "blocking", "{out}");
    let out = ok(&["--level", "tcp", "--busy-poll", "-t", "lat,bw", "-s", "1k", "-n", "2000", "--json"]);
    let objs: Vec<serde_json::Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(objs.len(), 3, "bounce, lat, bw: {out}");
    assert!(objs[1..].iter().all(|o| o["socket"] == "busy-poll" && o["iters"] == 2000 && o["size"] == 1024));
}

#[test]
fn threaded_engine() {
    let out = ok(&["--engine", "threaded", "-t", "lat", "-s", "64", "-n", "200", "--no-bounce", "--json"]);
    let o: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(o["engine"], "threaded");
}

#[test]
fn trace_writes_a_file() {
    let path = std::env::temp_dir().join(format!("bypass-perf-trace-{}.json", std::process::id()));
    let p = path.to_str().unwrap();
    let o = perf(&["--trace", p, "-t", "lat", "-s", "64", "-n", "100000", "--no-bounce", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let row: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert_eq!(row["iters"], 100, "trace runs are capped at 100 iterations");
    assert!(stderr(&o).contains("ui.perfetto.dev"), "{}", stderr(&o));
    let trace: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    assert!(!trace["traceEvents"].as_array().unwrap().is_empty());
    let _ = std::fs::remove_file(&path);
}

#[test]
fn a_reader_that_goes_away_is_not_a_panic() {
    // `bypass-perf ... | head -1`: the rows after the first meet a closed pipe.
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let mut child = Command::new(env!("CARGO_BIN_EXE_bypass-perf"))
        .args(["-t", "lat", "-a", "-n", "200", "--json", "--no-bounce"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run bypass-perf");
    let mut first = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut first).unwrap();
    assert!(first.starts_with('{'), "{first}");
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!stderr(&o).contains("panicked"), "{}", stderr(&o));
}

#[test]
fn bad_arguments_give_one_error_line_and_the_usage() {
    for args in [
        &["-w", "0"][..],
        &["-s", "5000", "--msg-size", "4096"],
        &["-t", "latency"],
        &["--bogus"],
        &["-b", "64", "-w", "32"],
        &["-n", "0"],
        &["--backend", "verbs"],
        &["--server", "0.0.0.0:18515"],
        &["--client", "127.0.0.1:18515"],
        &["--level", "hal", "--mode", "ack"],
        &["--pin", "100000"],
        &["-s", "lots"],
        &["--trace", "/nonexistent-dir/bypass-trace.json"],
    ] {
        let o = perf(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        let err = stderr(&o);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(stdout(&o).is_empty(), "{args:?}: nothing on stdout");
        let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
        assert_eq!(errors.len(), 1, "{args:?}: one error line: {err}");
        assert!(err.contains("Usage: bypass-perf") || err.contains("--help"), "{args:?}: {err}");
    }
    let o = perf(&["--server", "0.0.0.0:18515"]);
    assert!(stderr(&o).contains("in-process wire cannot reach another process"), "{}", stderr(&o));
    let o = perf(&["--backend", "verbs"]);
    assert!(stderr(&o).contains("not compiled in"), "{}", stderr(&o));
    let o = perf(&["--trace", "/nonexistent-dir/bypass-trace.json"]);
    assert!(
        stderr(&o).contains("--trace: cannot write /nonexistent-dir/bypass-trace.json"),
        "{}",
        stderr(&o)
    );
}

/// `--server` in one process, `--client` in another, on the simulator's UDP wire: the client
/// prints the same table as a one-process run.
#[test]
fn two_processes_on_the_udp_wire() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    // Port 0: the server takes a free port and says which.
    let mut server = Command::new(env!("CARGO_BIN_EXE_bypass-perf"))
        .args(["--backend", "sim+udp://127.0.0.2:0", "--server", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the server");
    let mut line = String::new();
    let mut out = std::io::BufReader::new(server.stdout.take().unwrap());
    while !line.contains("serving at") {
        line.clear();
        if out.read_line(&mut line).unwrap() == 0 {
            let _ = server.kill();
            panic!("the server exited before serving: {}", stderr(&server.wait_with_output().unwrap()));
        }
    }
    let addr = line.split_whitespace().nth(2).expect("serving at ADDR").to_string();
    let client = Command::new(env!("CARGO_BIN_EXE_bypass-perf"))
        .args([
            "--backend",
            "sim+udp://127.0.0.3:0",
            "--client",
            &addr,
            "-s",
            "64",
            "-n",
            "2000",
            "--no-bounce",
        ])
        .output()
        .expect("run the client");
    let _ = server.kill();
    let _ = server.wait();
    let text = stdout(&client);
    assert!(client.status.success(), "{}\n{text}", stderr(&client));
    assert!(text.contains("UDP wire at 127.0.0.3:0"), "{text}");
    for test in ["lat", "rate"] {
        let r = rows(&text, "rpc", test);
        assert_eq!(r.len(), 1, "{test}: {text}");
        assert_eq!((r[0][2], r[0][3], r[0][4]), ("wait", "64", "2000"), "{text}");
    }
    assert!(text.contains("server: in another process") && text.contains("0 timeouts"), "{text}");
}
