#!/usr/bin/env bash
# What hurts the demo's LC app at its peak (issue 20): qosd's HTTP fixture
# (1 ms of CPU per request, 8 keep-alive connections, as search in
# scenarios/demo.yaml) at a fixed rate RPS (default 970: the demo's peak, its
# calibrated 1-CPU capacity) beside `qosd batch --threads 2`, in cases
# interleaved over ROUNDS rounds of SECS s:
#   alone    the job stopped
#   idle     the job's group in the idle class, no quota
#   idle-q1  ... and a quota of 1.0 CPU     idle-q05  ... 0.5 CPU
#   normal   the job at normal weight
#   trace    the job idle, and qosd's eBPF sensor (`qosd trace`) on the server
# Per case: the share of 0.5 s intervals whose client p99 is above TARGET_MS
# (the demo's calibrated target), the median and worst per-interval p99, the
# whole run's p99, the load generator's send lag p99 (its own lateness) and
# the job's ops/s. Prints a markdown table on stdout.
# With kernel.sched_autogroup_enabled (Debian's default) every session's
# tasks in the root cgroup share one autogroup of weight 1024, so other
# sessions' `nice -n 19` builds still take their autogroup's full share from
# the server: ISOLATE=1 (the default) sets this session's autogroup to nice
# -20 for the run, which gives the fixture, the load generator and a job at
# normal weight the CPUs a quiet machine would; a job in the idle class
# stays below everything, as on any node.
# Usage: scenarios/bench/peak.sh [QOSD]   (root; RPS=970 SECS=15 ROUNDS=2
#        TARGET_MS=7.46 ISOLATE=1 CASES="alone idle idle-q1 idle-q05 normal trace")
set -euo pipefail
cd "$(dirname "$0")/../.."
QOSD=${1:-target/release/qosd}
FIXTURE=${FIXTURE:-target/release/qosd-fixture}
RPS=${RPS:-970}
SECS=${SECS:-15}
ROUNDS=${ROUNDS:-2}
TARGET_MS=${TARGET_MS:-7.46}
CONNS=${CONNS:-8}
read -r -a cases <<<"${CASES:-alone idle idle-q1 idle-q05 normal trace}"
[ "$(id -u)" = 0 ] || { echo "peak: needs root (cgroups)" >&2; exit 1; }
[ -x "$FIXTURE" ] || { echo "peak: $FIXTURE missing (cargo build --release)" >&2; exit 1; }
port=$(( 20000 + RANDOM % 20000 ))
st=$(mktemp -d -t qosd-peak.XXXXXX)
srv= job= tr=
cleanup() {
  [ -n "$tr" ] && { kill "$tr" 2>/dev/null || true; wait "$tr" 2>/dev/null || true; }
  [ -n "$job" ] && { kill -CONT "$job" 2>/dev/null; kill "$job" 2>/dev/null || true; wait "$job" 2>/dev/null || true; }
  "$QOSD" restore --state-file "$st/state.json" >/dev/null 2>&1 || true
  [ -n "$srv" ] && { kill "$srv" 2>/dev/null || true; wait "$srv" 2>/dev/null || true; }
  rm -rf "$st"
  [ -w "$ag" ] && echo 0 >"$ag"
}
trap cleanup EXIT
ag=/proc/$$/autogroup
if [ "${ISOLATE:-1}" = 1 ] && [ -w "$ag" ]; then echo -20 >"$ag"; fi
wait_port() { for _ in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/$1) 2>/dev/null && return; sleep 0.1; done; }
ops() { tail -1 "$st/job.out" | awk '{print $2 + 0, $3 + 0}'; }

"$FIXTURE" --listen "127.0.0.1:$port" --work-us 1000 --exit-after-s 1800 >/dev/null &
srv=$!
wait_port "$port"
# The file exists before the job starts: the job may be stopped before its
# own shell has opened it.
: >"$st/job.out"
"$QOSD" batch --threads 2 --report-ms 200 --exit-after-s 1800 >>"$st/job.out" &
job=$!
kill -STOP "$job"
set_q() { "$QOSD" set --state-file "$st/state.json" "$@" >/dev/null; }

for r in $(seq 0 $(( ROUNDS - 1 ))); do
  for k in $(seq 0 $(( ${#cases[@]} - 1 ))); do
    c=${cases[$(( (k + r) % ${#cases[@]} ))]}
    "$QOSD" restore --state-file "$st/state.json" >/dev/null 2>&1 || true
    kill -CONT "$job"
    case $c in
      alone) kill -STOP "$job" ;;
      idle) set_q priority --pid "$job" --class idle ;;
      idle-q1) set_q priority --pid "$job" --class idle; set_q quota --pid "$job" --quota 1.0 ;;
      idle-q05) set_q priority --pid "$job" --class idle; set_q quota --pid "$job" --quota 0.5 ;;
      normal) ;;
      trace) set_q priority --pid "$job" --class idle
             "$QOSD" trace --pid "$srv" --interval 0.5 --duration $(( SECS + 3 )) --json >/dev/null 2>&1 &
             tr=$!; sleep 1.5 ;;
      *) echo "peak: unknown case $c" >&2; exit 2 ;;
    esac
    sleep 0.5
    o0=$(ops)
    "$QOSD" load --target "127.0.0.1:$port" --protocol http --rps "$RPS" --arrival poisson \
      --connections "$CONNS" --keepalive --duration "$SECS" --intervals --interval-ms 500 --json \
      >"$st/$c.$r.json"
    o1=$(ops)
    [ -n "$tr" ] && { kill "$tr" 2>/dev/null || true; wait "$tr" 2>/dev/null || true; tr=; }
    kill -STOP "$job"
    awk -v a="$o0" -v b="$o1" 'BEGIN { split(a, x, " "); split(b, y, " ");
      d = y[2] - x[2]; print (d > 0) ? (y[1] - x[1]) / d * 1e6 : 0 }' >"$st/$c.$r.ops"
  done
done
"$QOSD" restore --state-file "$st/state.json" >/dev/null 2>&1 || true

# One row per case, the rounds pooled: intervals over the target, median and
# worst interval p99, the runs' p99s, the send lag p99s and the job's ops/s.
row() {
  local c=$1
  cat "$st/$c".*.json | grep '"interval_s"' | grep -o '"p99_us":[0-9.e+-]*' | cut -d: -f2 | sort -g |
    awk -v t="$TARGET_MS" '{ v = $1 / 1000; n++; p[n] = v; if (v > t) over++ }
      END { printf "%d/%d (%.0f %%) | %.2f | %.2f", over, n, 100 * over / n, p[int((n + 1) / 2)], p[n] }'
  printf " | "
  for f in "$st/$c".*.json; do
    tail -1 "$f" | grep -o '"latency_us":{[^}]*}' | grep -o '"p99":[0-9.]*' | awk -F: '{printf "%.2f ", $2 / 1000}'
  done
  printf "| "
  for f in "$st/$c".*.json; do
    tail -1 "$f" | grep -o '"send_lag_us":{[^}]*}' | grep -o '"p99":[0-9.]*' | awk -F: '{printf "%.2f ", $2 / 1000}'
  done
  printf "| "
  cat "$st/$c".*.ops | awk '{printf "%.0f ", $1}'
  printf "|\n"
}
cat <<MD
## The demo's peak: what hurts the LC app

\`scenarios/bench/peak.sh\`: qosd's HTTP fixture (1 ms of CPU per request) at ${RPS} rps, Poisson,
${CONNS} keep-alive connections, beside \`qosd batch --threads 2\`; ${ROUNDS} interleaved rounds of ${SECS} s
per case. Target ${TARGET_MS} ms. This session's autogroup: $(cat "$ag" 2>/dev/null || echo none). Load average at the end: $(cut -d" " -f1-3 /proc/loadavg).

| case | 0.5 s intervals over target | median interval p99 ms | worst | run p99 ms (per round) | send lag p99 ms | batch ops/s |
| --- | --- | --- | --- | --- | --- | --- |
MD
for c in "${cases[@]}"; do printf "| %s | " "$c"; row "$c"; done
