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
