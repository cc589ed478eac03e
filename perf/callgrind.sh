#!/usr/bin/env bash
# Instructions per call of the RPC layer, counted by callgrind (immune to this VM's speed states).
#
# For each level (hal, rpc) and shape (lat: one blocking round trip; rate: window 32, batch 32),
# bypass-perf runs twice on one thread (--one-thread), with N1 and N2 iterations; the difference
# of the two totals divided by N2 - N1 is the cost of one iteration, free of start-up and
# tear-down. The same difference taken per function (callgrind_annotate, self and inclusive)
# gives the per-call breakdown; self costs are also summed per area (client, server, core, wire,
# simulated NIC, ...), which splits the RPC layer's cost between client and server even though
# both run on one thread. It also counts the locked read-modify-writes per iteration (x86
# `lock`-prefixed instructions and `xchg` with memory, found in the binary's disassembly and
# weighted by callgrind's per-instruction counts), in total and per function: each costs ~20
# cycles or more where a plain instruction costs one, so they weigh in wall-clock time far more
# than in the instruction count.
#
#   perf/callgrind.sh                      # build (release) and count everything
#   BIN=/tmp/old-bypass-perf perf/callgrind.sh   # count another binary (before/after)
#   perf/callgrind.sh lat                  # only the latency shape
#   TOP=40 perf/callgrind.sh rate          # longer function lists
#
# Environment: BIN (binary; default target/release/bypass-perf, built if missing), N1, N2
# (iterations, default 2000 and 12000), TOP (functions listed, default 25), OUT (directory for
# the callgrind files, default a fresh temporary one, kept). Needs valgrind, python3 and
# objdump/nm (binutils).
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
    valgrind --tool=callgrind --dump-instr=yes --compress-pos=no --compress-strings=no \
        --callgrind-out-file="$f" "$BIN" --level "$level" -t "$shape" -s 64 \
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

locked() { # a.out b.out -> locked read-modify-writes per iteration: the total, then by function
    python3 - "$BIN" "$1" "$2" $((N2 - N1)) "$TOP" <<'EOF'
import collections, re, subprocess, sys
binp, fa, fb, dn, top = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
obj = binp.split("/")[-1]

def load(path):
    # --dump-instr=yes --compress-pos=no --compress-strings=no: cost lines are "addr line count";
    # the line after a calls= line is the call's inclusive cost, not an instruction's.
    costs, fnof, ob, fn, skip, entry = collections.Counter(), {}, None, None, False, None
    for line in open(path):
        if skip:
            skip = False
        elif line.startswith("ob="):
            ob = line[3:].strip()
        elif line.startswith("fn="):
            fn = line[3:].strip()
        elif line.startswith("calls="):
            skip = True
        else:
            m = re.match(r"^(0x[0-9a-f]+)\s+\d+\s+(\d+)", line)
            if m and ob and ob.split("/")[-1] == obj:
                a = int(m.group(1), 16)
                costs[a] += int(m.group(2))
                fnof[a] = fn
                if fn == "main" and (entry is None or a < entry):
                    entry = a
    return costs, fnof, entry

(ca, fa_, _), (cb, fb_, entry) = load(fa), load(fb)
syms = subprocess.run(["nm", binp], capture_output=True, text=True).stdout.splitlines()
main = next(int(l.split()[0], 16) for l in syms if l.endswith(" T main"))
off = entry - main  # where the (position-independent) binary was loaded
dis = subprocess.run(["objdump", "-d", "--no-show-raw-insn", binp], capture_output=True, text=True).stdout
total, per = 0.0, collections.Counter()
for l in dis.splitlines():
    m = re.match(r"^\s*([0-9a-f]+):\s+(.*)$", l)
    if not m or not (m.group(2).startswith("lock ") or re.match(r"xchg\w*\s.*\(", m.group(2))):
        continue
    a = int(m.group(1), 16) + off
    d = (cb.get(a, 0) - ca.get(a, 0)) / dn
    if d > 0:
        total += d
        per[fb_.get(a) or fa_.get(a) or "?"] += d
print(f"{total:.1f}")
for fn, v in per.most_common(top):
    if v >= 0.1:
        print(f"  {v:8.2f}  {fn[:150]}")
EOF
}

report() { # shape
    local shape=$1 level a b per lk
    declare -A perc
    for level in hal rpc; do
        a=$(run "$level" "$shape" "$N1")
        b=$(run "$level" "$shape" "$N2")
        per=$(( ($(total "$b") - $(total "$a")) / (N2 - N1) ))
        perc[$level]=$per
        locked "$a" "$b" >"$OUT/$level-$shape.locked"
        lk=$(head -1 "$OUT/$level-$shape.locked")
        printf '%-4s %-4s %8d instructions, %5s locked read-modify-writes per %s\n' "$level" "$shape" "$per" "$lk" \
            "$([ "$shape" = lat ] && echo 'round trip' || echo 'message/call')"
        if [ "$level" = rpc ]; then
            annotate "$a" no >"$OUT/rpc-$shape-a.self"; annotate "$b" no >"$OUT/rpc-$shape-b.self"
            annotate "$a" yes >"$OUT/rpc-$shape-a.incl"; annotate "$b" yes >"$OUT/rpc-$shape-b.incl"
        fi
    done
    printf 'rpc - hal: %d per call (rpc / hal = %s)\n' $(( perc[rpc] - perc[hal] )) \
        "$(python3 -c "print(f'{${perc[rpc]}/${perc[hal]}:.2f}')")"
    echo
    echo "  locked read-modify-writes per call of the rpc run, by function:"
    tail -n +2 "$OUT/rpc-$shape.locked"
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
