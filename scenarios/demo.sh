#!/usr/bin/env bash
# `make demo`: the loop moving CPU on this machine. scenarios/demo.yaml
# (search ramped beside a best-effort batch job) replayed on real servers
# with eBPF feedback, first under PARTIES, then under the static even
# split from the same start, and the two compared: search's client-side
# violations while its load is at most / above 80 % of capacity, and the
# batch job's throughput and CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
QOSD=${QOSD:-target/release/qosd}
OUT=${OUT:-out/demo}
# Default: the scenario's own length (100 s per run).
DURATION_ARGS=()
if [ -n "${DURATION:-}" ]; then DURATION_ARGS=(--duration "$DURATION"); fi
# On 2 CPUs each app would hold one core (its minimum) and no core could
# move: CPU quota alone (the scenario's `resources`). With more CPUs,
# cores move too.
RES_ARGS=()
if [ "$(nproc)" -gt 2 ]; then RES_ARGS=(--resources cores,cpu_quota); fi

echo "== qosd caps (what this machine lets qosd turn)"
"$QOSD" caps
echo
echo "== 1/2: PARTIES: qosd replay scenarios/demo.yaml ${RES_ARGS[*]} ${DURATION_ARGS[*]} --out $OUT/parties"
echo "   (calibrates search first: its capacity and knee on this machine)"
"$QOSD" replay scenarios/demo.yaml "${RES_ARGS[@]}" "${DURATION_ARGS[@]}" --out "$OUT/parties"
echo
echo "== 2/2: the static even split, same calibration and start:"
echo "   qosd replay scenarios/demo.yaml --policy static ${RES_ARGS[*]} --out $OUT/static"
"$QOSD" replay scenarios/demo.yaml --policy static "${RES_ARGS[@]}" "${DURATION_ARGS[@]}" \
  --calibration "$OUT/parties/calibration.json" --out "$OUT/static"
echo
echo "== qosd compare $OUT/parties $OUT/static"
"$QOSD" compare "$OUT/parties" "$OUT/static" --out "$OUT" | tee "$OUT/compare.txt"
echo
echo "Plots: $OUT/parties/timeline.png and $OUT/static/timeline.png (load, p99 vs"
echo "target, CPU quota per app, the batch job's ops/s); $OUT/compare.png overlays them."
echo
echo "More:"
echo "  $QOSD replay scenarios/ramp.yaml --sim --out out/ramp-sim      the paper's ramp on a simulated 16-core node"
echo "  $QOSD replay scenarios/demo.yaml --feedback client --out out/demo-client"
echo "  $QOSD trace --pid \$(pidof -s memcached) --json                 follow any server live"
# Last, where it is read: whether the target the table is scored against
# rests on a calibration whose knee did not repeat (qosd compare's line).
if grep -q '^calibration:' "$OUT/compare.txt"; then
  echo
  grep '^calibration:' "$OUT/compare.txt"
fi
