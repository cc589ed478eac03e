#!/usr/bin/env bash
# Runs capi's C test programs under valgrind memcheck: an invalid read or write, a jump on
# uninitialised memory, or a definite leak makes the program exit 99 and its test fail.
#
#   capi/tests/memcheck.sh [cargo test filter...]
#
# The Rust drivers that compile and run the C programs prefix every run with $CAPI_C_RUNNER;
# this script sets it to valgrind and runs the drivers. Programs that cannot run under valgrind
# (the allocation counter interposes malloc itself) are run without it by their driver.
set -euo pipefail
cd "$(dirname "$0")/../.."
if ! command -v valgrind >/dev/null 2>&1; then
    echo "memcheck.sh: valgrind is not installed (Debian: apt-get install valgrind)" >&2
    exit 1
fi
supp="$PWD/capi/tests/valgrind.supp"
export CAPI_C_RUNNER="valgrind --quiet --error-exitcode=99 --exit-on-first-error=no \
--leak-check=full --show-leak-kinds=definite --errors-for-leak-kinds=definite \
--child-silent-after-fork=yes --fair-sched=yes --suppressions=$supp"
# One program at a time: valgrind runs a program's threads one by one anyway, and the machine
# has two cores.
cargo build -p bypass-capi --release --quiet
cargo test -p bypass-capi --release --test '*' --quiet -- --test-threads=1 "$@"
