#!/usr/bin/env bash
# The procfs sensor's cost per monitoring tick: since session 12 it reads
# every managed pid's CPU clock each tick (100 ms). One target holding 1,
# 10, 100 and 1000 processes (`sleep`s the measuring program starts and
# kills), the sizes interleaved round by round; prints a markdown section
# on stdout (bench.sh appends it to BENCHMARKS.md).
# Usage: scenarios/bench/procfs.sh [ROUNDS] [PAUSE_MS]   (default 100, 20;
# TICK_BIN=PATH: a built procfs_tick example, not rebuilt)
set -euo pipefail
cd "$(dirname "$0")/../.."
. scenarios/bench/lib/quiet.sh
if [ -z "${TICK_BIN:-}" ]; then
  build_quiet -p qosd-sensors --example procfs_tick
  TICK_BIN=target/release/examples/procfs_tick
fi
echo "## procfs sensor: cost per monitoring tick (\`scenarios/bench/procfs.sh\`)"
echo
echo "One \`ProcfsSensor::sample\` (each pid's CPU clock: \`clock_getcpuclockid\` +"
echo "\`clock_gettime\`) of one target holding N processes, the sizes interleaved"
echo "round by round, ticks apart by a pause; the CPU figure is the sampling"
echo "thread's CPU clock, the wall figure includes any wait for a CPU."
echo "$(nproc) CPUs, $(uname -r), $(date -u +%FT%H:%MZ)."
echo
measured "$TICK_BIN" "${1:-100}" "${2:-20}"
