#!/usr/bin/env bash
# The C API against the Rust API, in one run, on the simulator in this process (BYPASS_BACKEND=sim:
# the Inline engine, the backend bypass-perf uses by default):
#   capi_bench            sync 64 B OckRpcClientCall round trips; async one-way sends
#   bypass-perf -t lat    blocking Channel::call_with round trips of 64 B (the Rust API)
#   bypass-perf -t bw     callback calls with empty responses, 32 in flight (closest to one-way)
#
#   capi/bench/run.sh [ITERS]      (default 100000)
set -euo pipefail
cd "$(dirname "$0")/../.."
n="${1:-100000}"
cargo build --release -q -p bypass-capi -p bypass-perf
lib=target/release
out=$lib/capi-c
mkdir -p "$out"
cc -std=c11 -D_GNU_SOURCE -O2 -g -Wall -Wextra -Werror -pedantic -I capi/include capi/bench/capi_bench.c \
    -o "$out/capi_bench" -L "$lib" -Wl,-rpath,"$PWD/$lib" -lhcom4db -lpthread
echo "== load: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) CPUs"
echo "== C API (libhcom4db.so, BYPASS_BACKEND=sim)"
BYPASS_BACKEND=sim BYPASS_CAPI_LOG_LEVEL=2 "$out/capi_bench" -n "$n" -s 64 -w 32
echo "== Rust API (bypass-perf, same backend)"
"$lib/bypass-perf" -t lat -s 64 -n "$n" --no-bounce --no-progress
"$lib/bypass-perf" -t bw -s 64 -n "$n" --no-bounce --no-progress
