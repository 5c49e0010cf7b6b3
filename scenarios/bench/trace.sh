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
