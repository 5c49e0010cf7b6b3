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
. scenarios/bench/lib/quiet.sh
[ -x "$qosd" ] || build_quiet -p qosd-manager
nice -n 19 bash scenarios/fixtures/grpc-server/build.sh "$fx" >&2
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

# The cost of one uprobe hit, by where it sits: on a `push` (emulated by the
# kernel: one trap; where qosd puts its probes) and on a `mov` (executed out
# of line: a trap and a single-step). A C loop calling a function 2 M times,
# with a plain tracefs uprobe (name unique to this run, removed after).
hit_cost() {
  local dir ev T=/sys/kernel/tracing
  dir=$(mktemp -d)
  ev="qosd_bench_$$"
  cat >"$dir/loop.c" <<'C'
#include <stdio.h>
#include <time.h>
__attribute__((noinline)) long f(long x) { return x * 3 + 1; }
int main(void) {
  long n = 2000000, s = 0; struct timespec a, b;
  clock_gettime(CLOCK_MONOTONIC, &a);
  for (long i = 0; i < n; i++) s += f(i);
  clock_gettime(CLOCK_MONOTONIC, &b);
  printf("%.2f\n", ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / n / 1e3 + 0 * s);
  return 0;
}
C
  clang -O0 -fcf-protection=none -o "$dir/loop" "$dir/loop.c"
  local base f push mov
  base=$("$dir/loop")
  f=$(nm "$dir/loop" | awk '$3 == "f" {print $1}')
  # -O0: f starts with push %rbp (1 byte), then mov %rsp,%rbp.
  for at in 0 1; do
    echo "p:$ev $dir/loop:0x$(printf '%x' $((16#$f + at)))" >>"$T/uprobe_events"
    echo 1 >"$T/events/uprobes/$ev/enable"
    if [ "$at" = 0 ]; then push=$("$dir/loop"); else mov=$("$dir/loop"); fi
    echo 0 >"$T/events/uprobes/$ev/enable"
    echo "-:$ev" >>"$T/uprobe_events"
  done
  rm -rf "$dir"
  echo "One uprobe hit on this machine (a C loop, 2 M calls, tracefs uprobe): on a \`push\` $(awk -v a="$push" -v b="$base" 'BEGIN{printf "%.2f", a-b}') µs,"
  echo "on a \`mov\` $(awk -v a="$mov" -v b="$base" 'BEGIN{printf "%.2f", a-b}') µs. qosd puts each gRPC probe on the function's first \`push\` (past Go's"
  echo "stack check, past an \`endbr64\`), which the kernel emulates instead of single-stepping."
}

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
echo "hits (and their records) add to each call while every CPU is busy (noisy where the calls are few)."
echo
hit_cost
