#!/usr/bin/env bash
# Runs capi's C test programs under valgrind memcheck: an invalid read or write, a jump on
# uninitialised memory, or a definite leak makes a program exit 99 and the stage fail.
#
#   capi/tests/memcheck.sh
#
# 1. The memory side's drivers (tests/mem_c.rs) prefix every program with $CAPI_C_RUNNER; this
#    script sets it to valgrind and runs them (the allocation counter, which interposes malloc
#    itself, is skipped under it).
# 2. The foundation's programs (tests/c_api.rs, tests/c_tls.rs build them into
#    target/release/capi-c-tests/) are built by a normal run of those drivers, then each
#    single-process one is run here under valgrind with the arguments and environment its
#    driver gives it.
# 3. The two-process program (proc.c, both processes) and the TLS program (tls.c) need their
#    drivers' orchestration (ports, certificates): those drivers honour $CAPI_C_RUNNER, and
#    this script runs just those two tests under it.
# 4. The URMA backend (type UBC on sim-urma's liburma.so, tests/c_urma.rs, which honours
#    $CAPI_C_RUNNER too): basic.c and onesided_local.c in one process, onesided_procs.c's two
#    processes on sim-urma's shared-memory wire.
# 5. The programs shaped like the real callers (tests/callers.rs: libcomm, NDP, CBB MES), every
#    one of them: one process and two (shm, UDP), on the simulator and on UBC.
set -euo pipefail
cd "$(dirname "$0")/../.."
if ! command -v valgrind >/dev/null 2>&1; then
    echo "memcheck.sh: valgrind is not installed (Debian: apt-get install valgrind)" >&2
    exit 1
fi
supp="$PWD/capi/tests/valgrind.supp"
vg=(valgrind --quiet --error-exitcode=99 --leak-check=full --show-leak-kinds=definite
    --errors-for-leak-kinds=definite --child-silent-after-fork=yes --fair-sched=yes
    --suppressions="$supp")
started=$SECONDS

echo "== memcheck: the memory side's C tests under valgrind"
# One program at a time: valgrind runs a program's threads one by one, and there are 2 cores.
CAPI_C_RUNNER="${vg[*]}" cargo test -p bypass-capi --release --quiet --test mem_c -- --test-threads=1

echo "== memcheck: the foundation's single-process C tests under valgrind ($((SECONDS - started)) s)"
cargo test -p bypass-capi --release --quiet --test c_api >/dev/null
bin=target/release/capi-c-tests
# The library where `cargo test` left it (deps/), or where `cargo build` puts it.
lib="$PWD/target/release/deps"
[ -e "$lib/libhcom4db.so" ] || lib="$PWD/target/release"
verbs=none
run() {
    local name=$1
    shift
    echo "-- $name"
    if ! timeout 300 "$@" >"target/memcheck-$name.log" 2>&1; then
        echo "memcheck.sh: $name failed under valgrind; its output:" >&2
        cat "target/memcheck-$name.log" >&2
        exit 1
    fi
}
run layout "${vg[@]}" "$bin/layout"
run basic env BYPASS_CAPI_LOG_LEVEL=2 "${vg[@]}" "$bin/basic"
run badinput env BYPASS_CAPI_LOG_LEVEL=4 "${vg[@]}" "$bin/badinput" "$verbs"
run dlopen_cbb env OCK_RPC_LIB_PATH="$lib" "${vg[@]}" "$bin/dlopen_cbb"

echo "== memcheck: two processes (proc.c) and TLS (tls.c) under valgrind ($((SECONDS - started)) s)"
CAPI_C_RUNNER="${vg[*]}" cargo test -p bypass-capi --release --quiet --test c_api --test c_tls -- \
    --test-threads=1 --exact two_processes_talk_over_the_tcp_type tls_through_the_three_callbacks

echo "== memcheck: the URMA backend (UBC on sim-urma) under valgrind ($((SECONDS - started)) s)"
CAPI_C_RUNNER="${vg[*]}" cargo test -p bypass-capi --release --quiet --test c_urma -- \
    --test-threads=1 --exact every_function_in_one_process_on_urma \
    one_sided_read_and_write_in_one_process_on_urma one_sided_between_two_processes_over_the_ubc_type

echo "== memcheck: the callers' shapes (libcomm, NDP, MES) under valgrind ($((SECONDS - started)) s)"
CAPI_C_RUNNER="${vg[*]}" cargo test -p bypass-capi --release --quiet --test callers -- --test-threads=1
echo "== memcheck: done ($((SECONDS - started)) s)"
