#!/usr/bin/env bash
# Cost of the power sensor's sched_switch BPF program per context switch.
#
# A context-switch-heavy microbenchmark (stress-ng --switch: two processes
# ping-pong over a pipe, pinned to one CPU so every message is a switch) runs
# alternately without (A) and with (B) `qosd power` attached, in ABBA order
# so that drift of a shared machine hits both sides alike. Two figures per
# run: stress-ng's wall-clock ns per context switch, and CPU ns per message
# (usr+sys time / messages), which does not count time spent waiting for a
# CPU that other load holds, so it stays meaningful on a busy machine. The
# result is the median B/A ratio of each.
#
# Then, separately (its own timing adds cost), the kernel's BPF run-time
# statistics (kernel.bpf_stats_enabled) give the program's mean run time
# per invocation directly, independent of load on the machine.
#
# Usage: scenarios/bench/power.sh [BENCHMARKS.md]   (appends; default stdout)
# Env:   QOSD (default target/release/qosd), ROUNDS (default 10, even),
#        SECS per run (default 2), CPU to pin to (default: the last one).
# Needs root (BPF), stress-ng and bpftool.
set -euo pipefail

OUT=${1:-/dev/stdout}
QOSD=${QOSD:-target/release/qosd}
ROUNDS=${ROUNDS:-10}
SECS=${SECS:-2}
CPU=${CPU:-$(( $(nproc) - 1 ))}

[ "$(id -u)" = 0 ] || { echo "power.sh: needs root (loads BPF)" >&2; exit 1; }
command -v stress-ng >/dev/null || { echo "power.sh: stress-ng missing (make deps)" >&2; exit 1; }
command -v bpftool >/dev/null || { echo "power.sh: bpftool missing (make deps)" >&2; exit 1; }
[ -x "$QOSD" ] || { echo "power.sh: $QOSD not built (make build)" >&2; exit 1; }

tmp=$(mktemp -d)
qpid=
. "$(dirname "$0")/lib/bpf_stats.sh"
cleanup() {
  if [ -n "$qpid" ]; then kill -INT "$qpid" 2>/dev/null || true; wait "$qpid" 2>/dev/null || true; fi
  bpf_stats_off
  rm -rf "$tmp"
}
trap cleanup EXIT

# "WALL_NS CPU_NS" of one stress-ng run, in its own autogroup at nice -20 so
# that other load on a shared machine disturbs it less.
switch_run() {
  setsid bash -c 'echo -20 >/proc/self/autogroup; exec nice -n -20 "$@"' _ \
    stress-ng --switch 1 --taskset "$CPU" -t "$SECS" --metrics-brief 2>&1 |
    awk '/metrc:.* switch +[0-9]+ / { cpu = 1e9 / $NF }
         /nanosecs per context switch/ { for (i = 1; i <= NF; i++) if ($i == "nanosecs") wall = $(i-1) }
         END { printf "%.1f %.1f\n", wall, cpu }'
}

attach() {
  "$QOSD" power --json --interval 1 >/dev/null 2>"$tmp/qosd.err" &
  qpid=$!
  # Attached once the capabilities header is printed.
  for _ in $(seq 100); do
    grep -q '^qosd power:' "$tmp/qosd.err" 2>/dev/null && return 0
    kill -0 "$qpid" 2>/dev/null || break
    sleep 0.1
  done
  echo "power.sh: qosd power did not start:" >&2
  cat "$tmp/qosd.err" >&2
  exit 1
}

detach() {
  kill -INT "$qpid"
  wait "$qpid" || true
  qpid=
}

measure_b() { attach; switch_run; detach; }

load_start=$(cut -d' ' -f1 /proc/loadavg)
aw=() ac=() bw=() bc=()
for r in $(seq "$ROUNDS"); do
  if (( r % 2 )); then
    read -r w c < <(switch_run); aw+=("$w"); ac+=("$c")
    read -r w c < <(measure_b); bw+=("$w"); bc+=("$c")
  else
    read -r w c < <(measure_b); bw+=("$w"); bc+=("$c")
    read -r w c < <(switch_run); aw+=("$w"); ac+=("$c")
  fi
  echo "round $r: wall ${aw[-1]} -> ${bw[-1]} ns/switch, cpu ${ac[-1]} -> ${bc[-1]} ns/msg" >&2
done
load_end=$(cut -d' ' -f1 /proc/loadavg)

# Mean run time of the program per invocation, from the kernel's stats.
bpf_stats_on
attach
switch_run >/dev/null
read -r run_ns run_cnt < <(bpftool prog show name qosd_sched_switch |
  awk '{ for (i = 1; i < NF; i++) { if ($i == "run_time_ns") t = $(i+1); if ($i == "run_cnt") c = $(i+1) } }
       END { print t + 0, c + 0 }')
detach
bpf_stats_off
echo "bpf stats: $run_cnt runs, $run_ns ns" >&2

# "median q1 q3" of the arguments.
quartiles() {
  printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 }
    function q(p,  i) { i = 1 + (NR - 1) * p; return v[int(i)] + (i - int(i)) * (v[int(i) + 1] - v[int(i)]) }
    END { printf "%.3f %.3f %.3f\n", q(0.5), q(0.25), q(0.75) }'
}
ratios() { local -n x=$1 y=$2; for i in "${!x[@]}"; do awk -v a="${x[$i]}" -v b="${y[$i]}" 'BEGIN { printf "%.3f\n", b / a }'; done; }
mapfile -t rw < <(ratios aw bw)
mapfile -t rc < <(ratios ac bc)
read -r mw qw1 qw3 < <(quartiles "${rw[@]}")
read -r mc qc1 qc3 < <(quartiles "${rc[@]}")
read -r maw _ _ < <(quartiles "${aw[@]}")
read -r mbw _ _ < <(quartiles "${bw[@]}")
read -r mac _ _ < <(quartiles "${ac[@]}")
read -r mbc _ _ < <(quartiles "${bc[@]}")

summary=$(awk -v maw="$maw" -v mbw="$mbw" -v mac="$mac" -v mbc="$mbc" \
  -v mw="$mw" -v qw1="$qw1" -v qw3="$qw3" -v mc="$mc" -v qc1="$qc1" -v qc3="$qc3" \
  -v rt="$run_ns" -v rcnt="$run_cnt" -v n="$ROUNDS" 'BEGIN {
  printf "| wall ns per switch, median without -> with | %.0f -> %.0f |\n", maw, mbw
  printf "| wall ratio with/without, median [q1, q3] of %d rounds | %.3f [%.3f, %.3f] |\n", n, mw, qw1, qw3
  printf "| CPU ns per message, median without -> with | %.0f -> %.0f |\n", mac, mbc
  printf "| CPU ratio with/without, median [q1, q3] of %d rounds | %.3f [%.3f, %.3f] |\n", n, mc, qc1, qc3
  if (rcnt > 0) printf "| program run time per invocation (bpf_stats, %d runs) | %.0f ns |\n", rcnt, rt / rcnt
  spread = qc3 - qc1
  if (spread > 0.10) verdict = sprintf("inconclusive: CPU ratios spread %.2f (busy machine)", spread)
  else verdict = sprintf("%s (%+.1f%% CPU per message)", (mc <= 1.05 ? "met" : "NOT met"), (mc - 1) * 100)
  printf "| goal: slowdown <= 5%% | %s |\n", verdict
}')

{
  echo
  echo "## Power sensor: cost per context switch"
  echo
  echo "stress-ng --switch 1 pinned to CPU $CPU, ${SECS} s per run, A/B interleaved (ABBA),"
  echo "B = \`qosd power\` attached (tp_btf/sched_switch program); $(uname -r), $(nproc) CPUs,"
  echo "load average $load_start -> $load_end, $(date -u +%Y-%m-%d). One stress-ng message"
  echo "is two context switches (two program runs). bpf_stats timing adds its own"
  echo "clock reads to the program's run time."
  echo
  echo "| measure | value |"
  echo "| --- | --- |"
  echo "$summary"
} >>"$OUT"
