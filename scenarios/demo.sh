#!/usr/bin/env bash
# `make demo`: the paper's case study (scenarios/ramp.yaml) on this machine:
# real servers, real eBPF feedback, the knobs this machine has; then where
# the plots are and how to run the same on the simulated node or with
# client feedback.
set -euo pipefail
cd "$(dirname "$0")/.."
QOSD=${QOSD:-target/release/qosd}
OUT=${OUT:-out/ramp}
DURATION=${DURATION:-60}
echo "== qosd caps (what this machine lets qosd turn)"
"$QOSD" caps
echo
echo "== qosd replay scenarios/ramp.yaml --feedback ebpf --duration $DURATION --out $OUT"
echo "   (calibrates each server first: capacity and knee on this machine)"
"$QOSD" replay scenarios/ramp.yaml --feedback ebpf --duration "$DURATION" --out "$OUT"
echo
echo "Plots: $OUT/timeline.png and $OUT/timeline.svg (load, p99 vs target with the"
echo "client and eBPF lines, cores/frequency/ways over time); data: $OUT/timeline.csv,"
echo "$OUT/summary.json."
echo
echo "The same on a simulated 16-core node (seconds, deterministic for a seed):"
echo "  $QOSD replay scenarios/ramp.yaml --sim --out out/ramp-sim"
echo "With the load generator's latency as the feedback instead of eBPF:"
echo "  $QOSD replay scenarios/ramp.yaml --feedback client --duration $DURATION --out out/ramp-client"
echo "  $QOSD compare $OUT out/ramp-client"
echo "The same ramp with search served over gRPC (multiplexed calls, eBPF uprobes):"
echo "  $QOSD replay scenarios/grpc.yaml --duration $DURATION --out out/grpc"
echo "Follow any server live:  $QOSD trace --pid \$(pidof -s memcached) --json"
