#!/usr/bin/env bash
# Actuator latency: how long `qosd set cores` and `qosd restore` take on a
# running `memcached -t 4` (10 threads), per cores backend available here.
# Whole-command times (process start, probing, state file) — what an
# operator sees; the daemon pays only the apply part each tick.
# Prints a markdown section on stdout (bench.sh collects it). Needs root.
set -euo pipefail
QOSD=${QOSD:-target/release/qosd}
N=${N:-30}
PORT=$((20000 + RANDOM % 20000))
STATE=$(mktemp -d)/state.json
memcached -u root -t 4 -U 0 -l 127.0.0.1 -p "$PORT" & MC=$!
trap 'kill $MC 2>/dev/null || true' EXIT
for _ in $(seq 50); do [ "$(ls /proc/$MC/task | wc -l)" -ge 5 ] && break; sleep 0.1; done
CPU=$(cut -d- -f2 /sys/devices/system/cpu/online | cut -d, -f1)
ms() { awk -v ns="$1" 'BEGIN { printf "%.2f", ns / 1e6 }'; }
{
  echo
  echo "## Actuators: qosd set cores / qosd restore ($(date -u +%Y-%m-%d), $(nproc) CPUs, $N runs each)"
  echo
  echo "| backend | set cores (mean ms) | restore (mean ms) |"
  echo "| --- | --- | --- |"
}
for b in affinity cgroup1 cgroup2; do
  if ! "$QOSD" caps | grep -Eq "^  $b +yes"; then
    echo "| $b | unavailable here | |"; continue
  fi
  set_ns=0; rest_ns=0
  for _ in $(seq "$N"); do
    t0=$(date +%s%N); "$QOSD" set --state-file "$STATE" cores --pid "$MC" --cpus "$CPU" --backend "$b" >/dev/null
    t1=$(date +%s%N); "$QOSD" restore --state-file "$STATE" >/dev/null
    t2=$(date +%s%N)
    set_ns=$((set_ns + t1 - t0)); rest_ns=$((rest_ns + t2 - t1))
  done
  echo "| $b | $(ms $((set_ns / N))) | $(ms $((rest_ns / N))) |"
done
