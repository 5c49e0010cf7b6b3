#!/usr/bin/env bash
# eBPF request sensor: stats engine speed (criterion) and the overhead of
# `qosd trace` on a saturated memcached (interleaved A/B), and the BPF run time
# per program (kernel.bpf_stats_enabled; BPF_STATS=0 skips it; needs root and
# bpftool).
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build -q --release -p qosd-manager --bin qosd
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
cargo run -q --release -p qosd-manager --example trace_overhead -- 10 3 8

# What tracing one process costs every other process: CPU time per syscall
# of dd (1-byte read + write, untraced) without / with `qosd trace` attached
# to an idle pid, alternating. Syscall tracepoints put every task on the
# kernel's syscall slow path, whatever the programs do.
QOSD=${QOSD:-target/release/qosd}
sleep 600 & idle=$!
dd_ns() {
  local TIMEFORMAT='%U %S'
  { time dd if=/dev/zero of=/dev/null bs=1 count=1000000 2>/dev/null; } 2>&1 |
    awk '{ printf "%.0f\n", ($1 + $2) * 1e9 / 2e6 }'
}
a=() b=()
for _ in 1 2 3 4 5; do
  a+=("$(dd_ns)")
  "$QOSD" trace --pid "$idle" --interval 1 --json >/dev/null 2>&1 &
  t=$!
  sleep 1.5
  b+=("$(dd_ns)")
  kill "$t"; wait "$t" 2>/dev/null || true
done
kill "$idle"
med() { printf '%s\n' "$@" | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
echo "Untraced processes: \`dd bs=1\` (read + write of one byte), CPU ns per syscall, median of 5"
echo "alternating runs without / with \`qosd trace\` attached to an idle pid: $(med "${a[@]}") -> $(med "${b[@]}") ns"
echo "(+$(( $(med "${b[@]}") - $(med "${a[@]}") )) ns per syscall of every process on the node while tracing)."
echo
