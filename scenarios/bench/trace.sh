#!/usr/bin/env bash
# eBPF request sensor: stats engine speed (criterion) and the overhead of
# `qosd trace` on a saturated memcached (interleaved A/B), and the BPF run time
# per program (kernel.bpf_stats_enabled, medians of BPF_STATS runs, default
# 5; BPF_STATS=0 skips it; needs root and bpftool).
set -euo pipefail
cd "$(dirname "$0")/../.."
# Everything it runs is built first, at the lowest priority (lib/quiet.sh):
# the `cargo run`s and `cargo bench` below then compile nothing.
. scenarios/bench/lib/quiet.sh
build_quiet -p qosd-manager --bin qosd --example trace_overhead --example trace_accuracy
build_quiet_bench -p qosd-sensors --bench stats
echo "## Stats engine (criterion, \`cargo bench -p qosd-sensors --bench stats\`)"
echo
log=$(mktemp)
cargo bench -q -p qosd-sensors --bench stats -- --warm-up-time 1 --measurement-time 3 >"$log" 2>&1
echo "| benchmark | median time | throughput |"
echo "|---|---|---|"
awk '/^(ingest|query)\//{name=$0} /time:/{t=$4" "$5} /thrpt:/{th=$4" "$5} /time:|thrpt:/{ if (name!="" && (/thrpt:/ || name ~ /^query/)) {print "| " name " | " t " | " (name ~ /^ingest/ ? th : "-") " |"; name=""} }' "$log"
echo
echo "Goals: >= 20 M records/s ingested on one core; <= 1 µs for any percentile of a 100k window."
echo
# The saturated-memcached A/B and bpf_stats, on each kernel path (the
# socket tracepoints, the default; the syscall fallback, the "before").
# Each with an A/A control (untraced pairs: the bench's resolution); the
# socket path also with its floors (FLOOR=both: empty programs on its hooks,
# and on hooks scoped to memcached's cgroup).
for hooks in sockets syscalls; do
  echo "### Saturated memcached, \`--hooks $hooks\`"
  echo
  floor=0
  [ "$hooks" = sockets ] && floor=both
  # BPF_STATS=5: per-program medians over 5 traced runs (one run is noisy).
  QOSD_HOOKS=$hooks FLOOR=$floor BPF_STATS=${BPF_STATS:-5} cargo run -q --release -p qosd-manager --example trace_overhead -- 20 3 8
done

# eBPF p99 (arrival, service) against the client's at 50/80/95 % of
# capacity and beside a CPU hog; BPF cost on untraced sockets.
cargo run -q --release -p qosd-manager --example trace_accuracy -- 3 sockets

# What tracing one process costs every other process: CPU time per syscall
# of dd (1-byte read + write, untraced) with nothing attached / `qosd trace`
# on the socket hooks / on the syscall hooks, attached to an idle pid,
# interleaved. Syscall tracepoints put every task on the kernel's syscall
# slow path, whatever the programs do; socket tracepoints only cost sockets.
QOSD=${QOSD:-target/release/qosd}
sleep 600 & idle=$!
dd_ns() {
  local TIMEFORMAT='%U %S'
  { time dd if=/dev/zero of=/dev/null bs=1 count=1000000 2>/dev/null; } 2>&1 |
    awk '{ printf "%.0f\n", ($1 + $2) * 1e9 / 2e6 }'
}
traced_dd() {
  "$QOSD" trace --hooks "$1" --pid "$idle" --interval 1 --json >/dev/null 2>&1 &
  local t=$!
  sleep 1.5
  dd_ns
  kill "$t"; wait "$t" 2>/dev/null || true
}
a=() b=() c=()
for _ in 1 2 3 4 5 6 7; do
  a+=("$(dd_ns)")
  b+=("$(traced_dd sockets)")
  c+=("$(traced_dd syscalls)")
done
kill "$idle"
med() { printf '%s\n' "$@" | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
ma=$(med "${a[@]}") mb=$(med "${b[@]}") mc=$(med "${c[@]}")
echo "Untraced processes: \`dd bs=1\` (read + write of one byte), CPU ns per syscall, median of 7"
echo "interleaved runs with nothing attached / \`qosd trace\` on an idle pid with the socket hooks /"
echo "with the syscall hooks: $ma / $mb / $mc ns per syscall"
echo "(sockets $(awk -v a="$ma" -v b="$mb" 'BEGIN { printf "%+.1f %%", 100 * (b - a) / a }'),"
echo "syscalls $(awk -v a="$ma" -v c="$mc" 'BEGIN { printf "%+.1f %%", 100 * (c - a) / a }'); goal <= +2 %)."
echo
