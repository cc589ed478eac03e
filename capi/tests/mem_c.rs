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
/// valgrind, which replaces malloc itself.
#[test]
fn alloc_count_sync_call() {
    if !c_harness::runner().is_empty() {
        eprintln!("alloc_count_sync_call: skipped under CAPI_C_RUNNER (the program interposes malloc)");
        return;
    }
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("bench");
    let exe = c_harness::compile_from(&dir, "capi_bench.c");
    let out = run(&exe, &["-n", "5000", "-s", "64", "--check-zero-alloc"], Run::default());
    out.expect_ok("capi_bench --check-zero-alloc");
    assert!(
        out.stdout.contains("heap allocations during 5000 sync calls: 0 on the calling thread"),
        "{}",
        out.stdout
    );
}

#[test]
fn alloc_rndv() {
    let exe = compile("alloc_rndv.c");
    run(&exe, &[], Run::default()).expect_ok("alloc_rndv");
}
