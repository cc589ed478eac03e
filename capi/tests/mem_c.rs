//! Runs the C tests of the memory API (`tests/c/alloc_*.c`, `mem_*.c`, `onesided_*.c`): each is
//! compiled with the system C compiler against `include/hcom4db.h` and linked to the
//! `libhcom4db.so` this build produced, then run with a bounded wait. A program passes when it
//! exits 0; its output is shown on failure.
//!
//! `CAPI_C_RUNNER` (e.g. `valgrind --error-exitcode=99 --leak-check=full`) prefixes every run:
//! `tests/memcheck.sh` uses it to put the same programs under a memory checker.

mod c_harness;

use c_harness::{compile, run, Run};

#[test]
fn alloc_basic() {
    let exe = compile("alloc_basic.c");
    run(&exe, &[], Run::default()).expect_ok("alloc_basic");
}

#[test]
fn alloc_threads() {
    let exe = compile("alloc_threads.c");
    run(&exe, &[], Run::default()).expect_ok("alloc_threads");
}

#[test]
fn mem_layout() {
    let exe = compile("mem_layout.c");
    run(&exe, &[], Run::default()).expect_ok("mem_layout");
}

#[test]
fn onesided_local() {
    let exe = compile("onesided_local.c");
    run(&exe, &[], Run::default()).expect_ok("onesided_local");
}

/// Two processes over the "TCP" type: the server prints its port, the client reads and writes
/// its region, then tells it to quit.
#[test]
fn onesided_procs() {
    let exe = compile("onesided_procs.c");
    let how = Run::default();
    let served = c_harness::serve(c_harness::spawn(&exe, &["server"], &how), "port ");
    let (server, port, reader) = (served.child, served.value, served.stdout);
    let client = run(&exe, &["client", &port], Run::default());
    let out = c_harness::finish(server, how.timeout);
    let server_stdout = reader.join().unwrap_or_default();
    client.expect_ok("onesided_procs client");
    assert!(
        out.code == Some(0) && server_stdout.contains("server: ok"),
        "onesided_procs server failed (exit {:?}):\n--- stdout\n{server_stdout}\n--- stderr\n{}",
        out.code,
        out.stderr
    );
}

/// A synchronous 64 B call with caller-provided buffers allocates nothing on the calling thread
/// in steady state, counted by the benchmark's own malloc family (see capi/bench/capi_bench.c;
/// it also prints the whole process's count, the server's worker included). Not under
/// valgrind, which replaces malloc itself. On failure the message says where the calling thread
/// allocated: the program's backtraces of the first allocations, with the library's frames named
/// by addr2line.
#[test]
fn alloc_count_sync_call() {
    if !c_harness::runner().is_empty() {
        eprintln!("alloc_count_sync_call: skipped under CAPI_C_RUNNER (the program interposes malloc)");
        return;
    }
    // 5000 calls take about 2 s on an idle machine, but the program busy-polls with two threads
    // (its caller and its server's worker), which another busy process on 2 cores slows to
    // about 12 ms a call (60 s measured beside two `yes` loops): a generous bound, so that load
    // does not fail the test by time (the message says which it was).
    let how = Run { timeout: std::time::Duration::from_secs(300), ..Run::default() };
    let out = run(&capi_bench(), &["-n", "5000", "-s", "64", "--check-zero-alloc"], how);
    let wanted = "heap allocations during 5000 sync calls: 0 on the calling thread";
    assert!(
        out.code == Some(0) && out.stdout.contains(wanted),
        "capi_bench --check-zero-alloc (exit {:?}, timed out: {}):\n--- stdout\n{}\n--- stderr, with the \
         library's frames named\n{}",
        out.code,
        out.timed_out,
        out.stdout,
        symbolize(&out.stderr)
    );
}

/// The failure report of `alloc_count_sync_call` names the allocation: one sync call lets the
/// library malloc its reply, and the report gives that call's number and a backtrace through the
/// library's reply path.
#[test]
fn alloc_count_reports_where_it_allocated() {
    if !c_harness::runner().is_empty() {
        eprintln!("alloc_count_reports_where_it_allocated: skipped under CAPI_C_RUNNER");
        return;
    }
    let args = ["-n", "2000", "-s", "64", "--check-zero-alloc", "--malloc-reply-at", "1234"];
    let out = run(&capi_bench(), &args, Run::default());
    assert_eq!(out.code, Some(1), "the allocation is found:\n{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stderr
            .contains("allocation 1 of the calling thread: 64 bytes in sync call 1234 of the measured ones"),
        "{}",
        out.stderr
    );
    let named = symbolize(&out.stderr);
    // The backtrace goes through the exported entry point and, named by addr2line, the
    // library's internals that copy the reply into a malloc'ed buffer.
    assert!(named.contains("OckRpcClientCall"), "{named}");
    assert!(named.contains("hcom4db::"), "the library's own frames are named:\n{named}");
}

fn capi_bench() -> std::path::PathBuf {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("bench");
    c_harness::compile_from(&dir, "capi_bench.c")
}

/// `text` with every backtrace line of the library's internals (`.../libhcom4db.so(+0xOFF)
/// [...]`, as backtrace_symbols_fd prints a frame without an exported symbol) followed by the
/// function, file and line addr2line finds there. Without addr2line (binutils), `text` as is.
fn symbolize(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        out.push_str(line);
        out.push('\n');
        let Some((path, rest)) = line.split_once("(+0x") else { continue };
        let Some((hex, _)) = rest.split_once(')') else { continue };
        let Ok(off) = u64::from_str_radix(hex, 16) else { continue };
        if !path.ends_with(".so") {
            continue;
        }
        // A return address: the call is the byte before it.
        let named = std::process::Command::new("addr2line")
            .args(["-f", "-C", "-i", "-e", path])
            .arg(format!("{:#x}", off.saturating_sub(1)))
            .output();
        if let Ok(o) = named {
            for l in String::from_utf8_lossy(&o.stdout).lines() {
                out.push_str("        ");
                out.push_str(l);
                out.push('\n');
            }
        }
    }
    out
}

#[test]
fn alloc_rndv() {
    let exe = compile("alloc_rndv.c");
    run(&exe, &[], Run::default()).expect_ok("alloc_rndv");
}
