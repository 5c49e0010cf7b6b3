#!/usr/bin/env bash
# gRPC uprobes: what tracing costs a saturated grpc-go server. Interleaved
# rounds of three arms on the Go fixture, closed loop, 32 streams on one
# connection, with no CPU work per call (the probes' worst case) and with
# 200 µs per call:
#   none   no tracing;
#   turn   `qosd trace --mode turn` (syscall tracepoints only);
#   grpc   `qosd trace --mode grpc` (tracepoints + two uprobes per call).
# Prints a markdown section: median calls/s per arm, the ratios, and the CPU
# time per call the uprobes add (from the throughputs: all CPUs are busy).
# Usage: grpc.sh [ROUNDS] [SECS_PER_RUN]
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-5}
secs=${2:-4}
qosd=${QOSD:-target/release/qosd}
fx=target/grpc-fixture
[ -x "$qosd" ] || cargo build -q --release -p qosd-manager
bash scenarios/fixtures/grpc-server/build.sh "$fx" >&2
ncpu=$(nproc)
srv=
trace=
cleanup() {
  [ -n "$trace" ] && kill "$trace" 2>/dev/null || true
  [ -n "$srv" ] && kill "$srv" 2>/dev/null || true
  wait 2>/dev/null || true
}
trap cleanup EXIT

start_server() { # WORK_US
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  "$fx/grpc-fixture-server" -port "$port" -work-us "$1" >/dev/null &
  srv=$!
  for _ in $(seq 50); do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && return
    sleep 0.1
  done
  echo "grpc.sh: the fixture server did not start" >&2
  exit 1
}

# One run: prints calls/s.
run() {
  "$fx/grpc-load" -target "127.0.0.1:$port" -duration "${secs}s" -concurrency 32 |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["calls_per_s"])'
}
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{v[NR]=$1} END {print (NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2)}'; }

grpc_version=$(sed -n 's/^\tgoogle.golang.org\/grpc \(v[^ ]*\).*/\1/p' scenarios/fixtures/grpc-server/go.mod)
echo "## gRPC uprobes on a saturated grpc-go server (\`scenarios/bench/grpc.sh $rounds $secs\`)"
echo
echo "Go fixture (grpc-go $grpc_version), \`grpc-load\` closed loop with 32 concurrent streams on one"
echo "connection, $secs s per run, $rounds interleaved rounds per arm; client, server and qosd share this"
echo "machine's $ncpu CPUs. Ratios are medians of calls/s against no tracing."
echo
echo "| CPU work per call | no tracing | \`--mode turn\` (syscall tracepoints) | \`--mode grpc\` (+ 2 uprobes per call) | grpc vs turn | uprobe CPU per call |"
echo "|---|---|---|---|---|---|"
for work in 0 200; do
  start_server "$work"
  declare -A res=()
  for r in $(seq "$rounds"); do
    for arm in none turn grpc; do
      if [ "$arm" != none ]; then
        "$qosd" trace --pid "$srv" --mode "$arm" --interval 1 --json >/dev/null 2>&1 &
        trace=$!
        sleep 1.5 # loaded and attached
      fi
      res[$arm]="${res[$arm]:-} $(run)"
      if [ -n "$trace" ]; then
        kill -INT "$trace"
        wait "$trace" || true
        trace=
      fi
    done
    echo "work ${work} µs, round $r (none/turn/grpc calls/s):${res[none]##* }${res[turn]##* }${res[grpc]##* }" >&2
  done
  kill "$srv"; wait "$srv" 2>/dev/null || true; srv=
  mn=$(echo "${res[none]}" | median)
  mt=$(echo "${res[turn]}" | median)
  mg=$(echo "${res[grpc]}" | median)
  awk -v w="$work" -v n="$mn" -v t="$mt" -v g="$mg" -v c="$ncpu" 'BEGIN {
    printf "| %d µs | %.0f calls/s | %.0f (%.3f) | %.0f (%.3f) | %.3f | %.1f µs |\n",
      w, n, t, t / n, g, g / n, g / t, (c / g - c / t) * 1e6
  }'
done
echo
echo "\"uprobe CPU per call\" is $ncpu CPUs / grpc calls/s − $ncpu CPUs / turn calls/s: the CPU time the two uprobe"
echo "hits (and their records) add to each call while every CPU is busy. A uprobe hit is a breakpoint trap"
echo "plus a single-step, so its cost depends on the machine (much more in a VM than on bare metal)."
