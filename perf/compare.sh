#!/usr/bin/env bash
# perf/compare.sh: bypass-perf against what a user would run instead, on this machine, in one
# invocation. Rounds alternate bypass and a peer (bypass, UCX shm, bypass, UCX tcp, bypass, plain
# TCP, bypass, busy-polled TCP, and again), so a change of the host's state hits both sides alike;
# the table gives the median over all runs of each, the spread, and the ratios bypass / peer.
#
#   perf/compare.sh [-r ROUNDS] [-l LAT_ITERS] [-m RATE_ITERS]
#
# Peers:
#   ucx_perftest (Debian package ucx-utils, installed with apt-get when missing): UCP tag
#     matching between two processes over localhost, UCX_TLS=shm (shared memory) and UCX_TLS=tcp;
#     tag_lat for the round trip, tag_bw for the message rate (UCX's own defaults otherwise).
#   bypass-perf --level tcp: a plain loopback TCP ping-pong and a one-way stream (TCP_NODELAY),
#     with blocking sockets (what a plain TCP program does) and with --busy-poll (non-blocking
#     sockets both threads spin on, as UCX's tcp transport and every bypass test do).
# bypass itself: bypass-perf --level rpc (blocking calls, WAIT_RSP; echo calls with 32 in flight)
# and --level hal (send/recv ping-pong; one-way sends, window 32, batch 32), simulator, Inline
# engine, client and server on two threads; and the same RPC tests with client and server in two
# processes (bypass-perf --server / --client) over the simulator's byte wires: shared memory
# (sim+shm) and UDP over loopback (sim+udp://127.0.0.1:0).
#
# ucx_perftest reports half the round trip of a ping-pong ("latency" = one-way) and its 50th
# percentile over the last 2048 iterations; the table doubles it. All other figures are medians
# over the whole run.

set -euo pipefail

ROUNDS=3
LAT_N=100000
RATE_N=500000
usage() { echo "usage: perf/compare.sh [-r ROUNDS (3)] [-l LAT_ITERS (100000)] [-m RATE_ITERS (500000)]"; }
while getopts "r:l:m:h" opt; do
    case $opt in
    r) ROUNDS=$OPTARG ;;
    l) LAT_N=$OPTARG ;;
    m) RATE_N=$OPTARG ;;
    h) usage; exit 0 ;;
    *) usage >&2; exit 2 ;;
    esac
done
for v in "$ROUNDS" "$LAT_N" "$RATE_N"; do
    [[ $v =~ ^[1-9][0-9]*$ ]] || { echo "compare.sh: '$v' is not a positive number" >&2; usage >&2; exit 2; }
done

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
echo "building bypass-perf ..." >&2
cargo build --release -q -p bypass-perf
BIN="$root/target/release/bypass-perf"

if ! command -v ucx_perftest >/dev/null 2>&1; then
    echo "installing ucx-utils (ucx_perftest) with apt-get ..." >&2
    if ! apt-get install -y -q ucx-utils >/dev/null 2>&1; then
        apt-get update -q >/dev/null
        apt-get install -y -q ucx-utils >/dev/null
    fi
fi
# UCX_TLS=shm means UCX's shared-memory transports (posix, sysv, cma, ...); tcp must list lo.
transports=$(ucx_info -d 2>/dev/null | awk '/Transport:/ {print $3}' | sort -u | tr '\n' ' ')
grep -Eq '(posix|sysv)' <<<"$transports" || { echo "compare.sh: UCX lists no shared-memory transport ($transports)" >&2; exit 1; }
grep -q 'tcp' <<<"$transports" || { echo "compare.sh: UCX lists no tcp transport ($transports)" >&2; exit 1; }

tmp=$(mktemp -d)
server_pid=
cleanup() {
    if [[ -n $server_pid ]]; then kill "$server_pid" 2>/dev/null || true; fi
    rm -rf "$tmp"
}
trap cleanup EXIT

# Appends one sample to the series $1.
sample() { echo "$2" >>"$tmp/$1"; }
# The value of JSON field $2 in the line of $1 (bypass-perf --json) whose "test" is $3.
field() { grep "\"test\":\"$3\"" <<<"$1" | head -1 | sed -E "s/.*\"$2\":([-0-9.e+]+).*/\\1/"; }

# The machine's state right before a peer's runs (bypass-perf measures it before its own).
bounce() { sample "$1_bounce" "$(field "$("$BIN" --bounce-only --json)" round_trip_us bounce)"; }

bypass_rpc() {
    local out
    out=$("$BIN" --level rpc -t lat -s 64 -n "$LAT_N" --json --no-progress)
    sample rpc_bounce "$(field "$out" round_trip_us bounce)"
    sample rpc_lat "$(field "$out" p50_us lat)"
    out=$("$BIN" --level rpc -t rate -s 64 -n "$RATE_N" --json --no-progress --no-bounce)
    sample rpc_rate "$(awk "BEGIN {print $(field "$out" msgs_per_sec rate) / 1e6}")"
}

bypass_hal() {
    local out
    out=$("$BIN" --level hal -t lat -s 64 -n "$LAT_N" --json --no-progress)
    sample hal_bounce "$(field "$out" round_trip_us bounce)"
    sample hal_lat "$(field "$out" p50_us lat)"
    out=$("$BIN" --level hal -t rate -s 64 -n "$RATE_N" --json --no-progress --no-bounce)
    sample hal_rate "$(awk "BEGIN {print $(field "$out" msgs_per_sec rate) / 1e6}")"
}

bypass() {
    bypass_rpc
    bypass_hal
}

# bypass RPC with client and server in two processes on wire $1 (shm or udp), series $2.
bypass_xproc() {
    local backend=sim+shm out addr line
    [[ $1 == udp ]] && backend=sim+udp://127.0.0.1:0
    "$BIN" --backend "$backend" --server 127.0.0.1:0 --no-bounce >"$tmp/server.out" 2>&1 &
    server_pid=$!
    for _ in $(seq 200); do
        grep -q "serving at" "$tmp/server.out" 2>/dev/null && break
        sleep 0.05
    done
    addr=$(sed -n 's/.*serving at \([0-9.:]*\).*/\1/p' "$tmp/server.out")
    [[ -n $addr ]] || { cat "$tmp/server.out" >&2; echo "compare.sh: the $1 server did not start" >&2; exit 1; }
    bounce "$2"
    out=$(timeout 600 "$BIN" --backend "$backend" --client "$addr" -t lat -s 64 -n "$LAT_N" --json --no-progress --no-bounce)
    sample "${2}_lat" "$(field "$out" p50_us lat)"
    out=$(timeout 600 "$BIN" --backend "$backend" --client "$addr" -t rate -s 64 -n "$RATE_N" --json --no-progress --no-bounce)
    sample "${2}_rate" "$(awk "BEGIN {print $(field "$out" msgs_per_sec rate) / 1e6}")"
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
    server_pid=
}

port=$((20000 + $$ % 20000))
# ucx_perftest with UCX_TLS=$1, test $2, $3 iterations: prints its final line (8 numbers:
# iterations, latency 50%ile / average / overall in us, MB/s average / overall, msg/s average /
# overall).
ucx_run() {
    local tls=$1 test=$2 n=$3 out= i
    port=$((port + 1))
    UCX_TLS=$tls ucx_perftest -p "$port" >/dev/null 2>&1 &
    server_pid=$!
    for i in $(seq 100); do
        if out=$(UCX_TLS=$tls timeout 300 ucx_perftest 127.0.0.1 -p "$port" -t "$test" -s 64 -n "$n" -f 2>&1); then
            break
        fi
        out=
        sleep 0.1
    done
    wait "$server_pid" 2>/dev/null || true
    server_pid=
    [[ -n $out ]] || { echo "compare.sh: ucx_perftest -t $test with UCX_TLS=$tls failed" >&2; exit 1; }
    awk 'NF == 8 && $1 ~ /^[0-9]+$/ {line = $0} END {print line}' <<<"$out"
}

ucx() {
    local tls=$1 name=$2 line
    bounce "$name"
    line=$(ucx_run "$tls" tag_lat "$LAT_N")
    sample "${name}_lat" "$(awk '{print 2 * $2}' <<<"$line")"
    line=$(ucx_run "$tls" tag_bw "$RATE_N")
    sample "${name}_rate" "$(awk '{print $8 / 1e6}' <<<"$line")"
}

tcp() {
    local out poll=() key=tcp
    if [[ $1 == busy ]]; then poll=(--busy-poll); key=tcp_busy; fi
    bounce "$key"
    out=$("$BIN" --level tcp "${poll[@]}" -t lat -s 64 -n "$LAT_N" --json --no-progress --no-bounce)
    sample "${key}_lat" "$(field "$out" p50_us lat)"
    out=$("$BIN" --level tcp "${poll[@]}" -t rate -s 64 -n "$RATE_N" --json --no-progress --no-bounce)
    sample "${key}_rate" "$(awk "BEGIN {print $(field "$out" msgs_per_sec rate) / 1e6}")"
}

start=$(date +%s)
for r in $(seq "$ROUNDS"); do
    echo "round $r of $ROUNDS: bypass, ucx shm, bypass, ucx tcp, bypass, tcp, bypass, tcp busy-poll, bypass two processes (shm, udp) ..." >&2
    bypass
    ucx shm ucx_shm
    bypass
    ucx tcp ucx_tcp
    bypass
    tcp blocking
    bypass
    tcp busy
    bypass
    bypass_xproc shm xp_shm
    bypass_xproc udp xp_udp
done

# median, min and max of a series
stats() {
    sort -g "$tmp/$1" | awk '{v[NR] = $1}
        END {m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; print m, v[1], v[NR]}'
}
med() { stats "$1" | cut -d' ' -f1; }
ratio() { awk "BEGIN {printf \"%.2f\", $1 / $2}"; }
spread() { printf "%.3f (%.3f..%.3f)" "$1" "$2" "$3"; }

row() {
    local label=$1 key=$2 lm lmin lmax rm rmin rmax ratios=""
    read -r lm lmin lmax < <(stats "${key}_lat")
    local bounce_med
    bounce_med=$(printf "%.3f" "$(med "${key}_bounce")")
    read -r rm rmin rmax < <(stats "${key}_rate")
    if [[ $key != rpc && $key != hal && $key != xp_* ]]; then
        ratios=$(printf "%-12s %s" "$(ratio "$(med rpc_lat)" "$lm") $(ratio "$(med rpc_rate)" "$rm")" \
            "$(ratio "$(med hal_lat)" "$lm") $(ratio "$(med hal_rate)" "$rm")")
    fi
    printf "%-42s %-7s %-24s %-24s %s\n" "$label" "$bounce_med" "$(spread "$lm" "$lmin" "$lmax")" \
        "$(spread "$rm" "$rmin" "$rmax")" "$ratios"
}

table() {
    echo
    echo "bypass-perf against its peers on this machine ($(nproc) CPUs, $(uname -m)), $ROUNDS rounds in $(($(date +%s) - start)) s;"
    echo "64-byte messages; medians over all runs (min..max); round trips in us, message rates in M/s."
    echo "bounce: the bare cache-line bounce between two threads (us) measured right before each run, median:"
    echo "the machine's state (about 0.065 or 0.32 on the 2-vCPU VM); compare rows whose bounces agree."
    echo
    printf "%-42s %-7s %-24s %-24s %-12s %s\n" "" "bounce" "round trip (us)" "message rate (M/s)" "RPC/peer" "HAL/peer"
    printf "%-42s %-7s %-24s %-24s %-12s %s\n" "" "" "" "" "lat   rate" "lat   rate"
    row "bypass RPC (sim, Inline, WAIT_RSP call)" rpc
    row "bypass HAL (sim, Inline, send/recv)" hal
    row "UCX tag, shared memory (UCX_TLS=shm)" ucx_shm
    row "UCX tag, TCP over loopback (UCX_TLS=tcp)" ucx_tcp
    row "plain TCP, blocking (--level tcp)" tcp
    row "plain TCP, busy-polled (--busy-poll)" tcp_busy
    row "bypass RPC, two processes, sim+shm" xp_shm
    row "bypass RPC, two processes, sim+udp (loopback)" xp_udp
    echo
    echo "Two processes / one process (two threads), bypass RPC: shm $(ratio "$(med xp_shm_lat)" "$(med rpc_lat)") round trip,"
    echo "$(ratio "$(med xp_shm_rate)" "$(med rpc_rate)") rate; udp $(ratio "$(med xp_udp_lat)" "$(med rpc_lat)") round trip, $(ratio "$(med xp_udp_rate)" "$(med rpc_rate)") rate."
    echo "bypass RPC over UDP / UCX tcp: $(ratio "$(med xp_udp_lat)" "$(med ucx_tcp_lat)") round trip, $(ratio "$(med xp_udp_rate)" "$(med ucx_tcp_rate)") rate; / busy-polled TCP: $(ratio "$(med xp_udp_lat)" "$(med tcp_busy_lat)") round trip."
    echo
    echo "Ratios are bypass / peer: for the round trip below 1 means bypass is faster, for the rate above 1."
    echo "Rates: bypass RPC counts echo calls (request and response, 32 in flight); the others count one-way"
    echo "messages (bypass HAL: window 32, batch 32; UCX tag_bw: its defaults; TCP: one write() per message)."
    echo "UCX round trips are twice its reported (one-way) 50th percentile of the last 2048 iterations."
}
table | sed 's/[[:space:]]*$//'
