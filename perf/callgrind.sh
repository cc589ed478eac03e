#!/usr/bin/env bash
# Instructions per call of the RPC layer, counted by callgrind (immune to this VM's speed states).
#
# For each level (hal, rpc) and shape (lat: one blocking round trip; rate: window 32, batch 32),
# bypass-perf runs twice on one thread (--one-thread), with N1 and N2 iterations; the difference
# of the two totals divided by N2 - N1 is the cost of one iteration, free of start-up and
# tear-down. The same difference taken per function (callgrind_annotate, self and inclusive)
# gives the per-call breakdown; self costs are also summed per area (client, server, core, wire,
# simulated NIC, ...), which splits the RPC layer's cost between client and server even though
# both run on one thread.
#
#   perf/callgrind.sh                      # build (release) and count everything
#   BIN=/tmp/old-bypass-perf perf/callgrind.sh   # count another binary (before/after)
#   perf/callgrind.sh lat                  # only the latency shape
#   TOP=40 perf/callgrind.sh rate          # longer function lists
#
# Environment: BIN (binary; default target/release/bypass-perf, built if missing), N1, N2
# (iterations, default 2000 and 12000), TOP (functions listed, default 25), OUT (directory for
# the callgrind files, default a fresh temporary one, kept). Needs valgrind and python3.
set -euo pipefail

cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/bypass-perf}
N1=${N1:-2000}
N2=${N2:-12000}
TOP=${TOP:-25}
OUT=${OUT:-$(mktemp -d /tmp/bypass-callgrind.XXXXXX)}
SHAPES=${*:-lat rate}

command -v valgrind >/dev/null || { echo "callgrind.sh: valgrind is not installed (apt-get install valgrind)" >&2; exit 1; }
command -v callgrind_annotate >/dev/null || { echo "callgrind.sh: callgrind_annotate is missing (it comes with valgrind)" >&2; exit 1; }
if [ ! -x "$BIN" ]; then
    if [ "$BIN" = target/release/bypass-perf ]; then
        cargo build --release -p bypass-perf >&2
    else
        echo "callgrind.sh: $BIN is not an executable" >&2
        exit 1
    fi
fi
mkdir -p "$OUT"

run() { # level shape iters -> callgrind file
    local level=$1 shape=$2 n=$3 f="$OUT/$1-$2-$3.out"
    valgrind --tool=callgrind --callgrind-out-file="$f" "$BIN" --level "$level" -t "$shape" -s 64 \
        -n "$n" --one-thread --no-bounce --no-progress --warmup 0 >"$f.log" 2>&1 ||
        { echo "callgrind.sh: $BIN --level $level -t $shape -n $n failed; see $f.log" >&2; exit 1; }
    echo "$f"
}

annotate() { # file inclusive(yes|no) -> "count<TAB>function" lines
    callgrind_annotate --inclusive="$2" --threshold=100 --auto=no --tree=none "$1" 2>/dev/null |
        awk '/^ *[0-9,]+ \(/ && !/PROGRAM TOTALS/ { print }' |
        sed -E 's/^ *([0-9,]+) +(\([^)]*\) +)?/\1\t/; s/,//g'
}

total() { # file -> total instructions
    callgrind_annotate "$1" 2>/dev/null | awk '/PROGRAM TOTALS/ && !done { gsub(",", "", $1); print $1; done = 1 }'
}

report() { # shape
    local shape=$1 level a b per
    declare -A perc
    for level in hal rpc; do
        a=$(run "$level" "$shape" "$N1")
        b=$(run "$level" "$shape" "$N2")
        per=$(( ($(total "$b") - $(total "$a")) / (N2 - N1) ))
        perc[$level]=$per
        printf '%-4s %-4s %8d instructions per %s\n' "$level" "$shape" "$per" \
            "$([ "$shape" = lat ] && echo 'round trip' || echo 'message/call')"
        if [ "$level" = rpc ]; then
            annotate "$a" no >"$OUT/rpc-$shape-a.self"; annotate "$b" no >"$OUT/rpc-$shape-b.self"
            annotate "$a" yes >"$OUT/rpc-$shape-a.incl"; annotate "$b" yes >"$OUT/rpc-$shape-b.incl"
        fi
    done
    printf 'rpc - hal: %d per call (rpc / hal = %s)\n' $(( perc[rpc] - perc[hal] )) \
        "$(python3 -c "print(f'{${perc[rpc]}/${perc[hal]}:.2f}')")"
    python3 - "$OUT/rpc-$shape" $((N2 - N1)) "$TOP" <<'EOF'
import re, sys
base, dn, top = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])

def load(path, incl):
    # A function inlined from several files has one line per file: its self cost is their sum;
    # its inclusive cost (each line counting everything it calls) is the largest.
    d = {}
    for line in open(path):
        cnt, _, fn = line.rstrip("\n").partition("\t")
        fn = re.sub(r" \[[^]]*\]$", "", fn)
        fn = re.sub(r"^[^ :]*\.(rs|S|c|h):|^\?\?\?:", "", fn)
        d[fn] = max(d.get(fn, 0), int(cnt)) if incl else d.get(fn, 0) + int(cnt)
    return d

def area(fn):
    for pat, name in [
        (r"bypass::client::", "client (stack/src/client)"),
        (r"bypass::server::|bypass::worker", "server (stack/src/server, worker)"),
        (r"bypass::core::", "core (tx_ctx, req_table, credits, buf_pool)"),
        (r"bypass::conn::", "conn (endpoint, liveness)"),
        (r"bypass::wire", "wire codec"),
        (r"bypass_sim::|bypass_hal::", "simulated NIC (sim, hal)"),
        (r"bypass_perf::", "benchmark loop (perf)"),
        (r"bypass::", "stack, other"),
        (r"mem(cpy|move|set|cmp)|__memcpy|__memmove", "libc memcpy/memset"),
        (r"clock_gettime|Instant::now|vdso|Timespec", "clock reads"),
        (r"pthread|futex|__lll|std::sync|std::thread", "std sync / threads"),
    ]:
        if re.search(pat, fn):
            return name
    return "other (std, libc)"

for kind in ("self", "incl"):
    a, b = (load(f"{base}-{r}.{kind}", kind == "incl") for r in "ab")
    diff = {fn: (b.get(fn, 0) - a.get(fn, 0)) / dn for fn in set(a) | set(b)}
    rows = sorted(((v, fn) for fn, v in diff.items() if v >= 1), reverse=True)
    print(f"\n  top functions of the rpc run, {'self' if kind == 'self' else 'inclusive'} instructions per call:")
    for v, fn in rows[:top]:
        print(f"  {v:8.0f}  {fn[:150]}")
    if kind == "self":
        areas = {}
        for fn, v in diff.items():
            areas[area(fn)] = areas.get(area(fn), 0) + v
        print("\n  self instructions per call by area:")
        for name, v in sorted(areas.items(), key=lambda x: -x[1]):
            if abs(v) >= 1:
                print(f"  {v:8.0f}  {name}")
EOF
}

echo "binary: $BIN ($(git rev-parse --short HEAD 2>/dev/null || echo '?')); iterations $N1 and $N2; callgrind files in $OUT"
for shape in $SHAPES; do
    echo
    report "$shape"
done
