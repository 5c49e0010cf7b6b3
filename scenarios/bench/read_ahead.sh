#!/usr/bin/env bash
# Read-ahead servers near saturation (docs/requests.md, "Replies"): qosd's
# fixture (a reader thread per connection hands requests to a writer
# thread, so it reads requests while earlier replies are still being
# computed) pinned to one CPU, its capacity measured (CPU time per request
# at a light load: X_sat = 1 / D), then loaded open-loop by `qosd load` on
# 8 pipelining keep-alive connections at SHARES of that capacity, traced
# in each aggregation mode. Prints, per step, the client's p99 (all the
# server adds to a request is in it) and qosd's eBPF p99 over the same
# requests, and their ratio. QOSD=path picks the binary (e.g. one built
# from an older tree, for an A/B). Needs root.
set -euo pipefail
cd "$(dirname "$0")/../.."
QOSD=${QOSD:-target/release/qosd}
SHARES=${SHARES:-0.6 0.8 0.95 1.05}
MODES=${MODES:-records kernel}
SECS=${SECS:-6}
WORK_US=${WORK_US:-1000}
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
ncpu=$(nproc)
server_cpu=$((ncpu - 1))
client_cpu=0

"$QOSD" fixture --work-us "$WORK_US" --exit-after-s 900 >"$tmp/fx" &
fx=$!
pids+=("$fx")
for _ in $(seq 100); do grep -q ':' "$tmp/fx" 2>/dev/null && break; sleep 0.1; done
port=$(head -1 "$tmp/fx" | sed 's/.*://')
taskset -pc "$server_cpu" "$fx" >/dev/null

cpu_s() { awk -v t="$(getconf CLK_TCK)" '{ sub(/.*\) /, ""); print ($12 + $13) / t }' "/proc/$1/stat"; }
load() { # rps secs -> the load's JSON report
  taskset -c "$client_cpu" "$QOSD" load --protocol http --target "127.0.0.1:$port" \
    --rps "$1" --duration "$2" --keepalive --connections 8 --json | grep achieved_rps | tail -1
}
c0=$(cpu_s "$fx")
light=$(load 200 3)
c1=$(cpu_s "$fx")
cap=$(python3 -c "import json,sys; d=json.loads(sys.argv[1]); print(round(d['completed'] / ($c1 - $c0)))" "$light")
echo "fixture: work ${WORK_US} us, capacity ${cap} rps on CPU ${server_cpu} ($QOSD)"
printf '%-6s %-8s %7s %9s %12s %10s %7s\n' share mode rps answered client_p99_ms ebpf_p99_ms ratio
for share in $SHARES; do
  for mode in $MODES; do
    rps=$(python3 -c "print(round($share * $cap))")
    "$QOSD" trace --json --interval 0.2 --pid "$fx" --aggregate "$mode" >"$tmp/trace" 2>/dev/null &
    tr=$!
    pids+=("$tr")
    for _ in $(seq 200); do [ "$(wc -l <"$tmp/trace")" -ge 2 ] && break; sleep 0.1; done
    r=$(load "$rps" "$SECS")
    kill -INT "$tr"
    wait "$tr" || true
    python3 - "$share" "$mode" "$rps" "$r" "$tmp/trace" "$fx" <<'PY'
import json, sys
share, mode, rps, r, path, pid = sys.argv[1:]
r = json.loads(r)
s = [json.loads(l) for l in open(path) if l.startswith('{')]
s = [v for v in s if v.get('summary') and v.get('pid') == int(pid)][-1]
c = r['latency_us']['p99'] / 1e3
e = (s['p99_us'] or 0) / 1e3
print(f"{share:<6} {mode:<8} {rps:>7} {r['completed']:>4}/{r['scheduled']:<4} {c:>12.2f} {e:>10.2f} {e / c:>7.2f}"
      f"   (eBPF counted {s['requests']}, by turns {s.get('counted_by_turns')}, timed by turns {s.get('timed_by_turns', '-')})")
PY
    # Let a saturated step's backlog drain before the next.
    sleep 3
  done
done
