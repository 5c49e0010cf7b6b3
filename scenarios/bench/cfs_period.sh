#!/usr/bin/env bash
# The CFS period (issue 20 item 2): an LC server whose own CPU quota is
# below what its bursts need is run for a slice of each period and then
# throttled; a request that arrives in the throttled part waits for the
# next period. qosd's HTTP fixture (1 ms of CPU per request) under a quota
# of QUOTA CPU (`qosd set quota --period-us P`, the knob's real path, undone
# by `qosd restore`), offered LOADS % of what that quota allows
# (QUOTA / 1 ms; 50 and 80 by default), Poisson arrivals. Cases: no quota, periods 5, 10, 20 and
# 100 ms without burst, and 20 / 100 ms with `--burst-pct 100` (one
# period's quota may be banked: `cpu.cfs_burst_us`, v2 `cpu.max.burst`). Interleaved in ROUNDS
# rounds (the case order rotates); client p50 and p99 per round, medians
# and quartiles over rounds, and the group's throttled periods from
# `cpu.stat`. The server's group and the load generator run at the
# largest CPU weight (`cpu.shares` 262144, v2 `cpu.weight` 10000), so that
# on a shared machine the quota, not the other work, limits the server.
# Prints a markdown section on stdout.
# Usage: scenarios/bench/cfs_period.sh [QOSD]   (root; ROUNDS=3 SECS=6 QUOTA=0.5 LOADS="50 80")
set -euo pipefail
cd "$(dirname "$0")/../.."
QOSD=${1:-target/release/qosd}
FIXTURE=${FIXTURE:-target/release/qosd-fixture}
ROUNDS=${ROUNDS:-3}
LOADS=${LOADS:-50 80}
SECS=${SECS:-6}
QUOTA=${QUOTA:-0.5}
[ "$(id -u)" = 0 ] || { echo "cfs_period: needs root (cgroups)" >&2; exit 1; }
[ -x "$FIXTURE" ] || { echo "cfs_period: $FIXTURE missing (cargo build --release)" >&2; exit 1; }
work_us=1000
# Requests per second at $1 % of what the quota allows.
rps_at() { awk -v q="$QUOTA" -v w="$work_us" -v l="$1" 'BEGIN { printf "%d", q * 1e6 / w * l / 100 }'; }
port=$(( 20000 + RANDOM % 20000 ))
st=$(mktemp -d)
srv=
# The cpu controller: cgroup2 with cpu, else the v1 cpu hierarchy.
if grep -qw cpu /sys/fs/cgroup/cgroup.controllers 2>/dev/null; then
  cpumnt=/sys/fs/cgroup weight_file=cpu.weight weight=10000
elif grep -qw cpu /sys/fs/cgroup/unified/cgroup.controllers 2>/dev/null; then
  cpumnt=/sys/fs/cgroup/unified weight_file=cpu.weight weight=10000
else
  cpumnt=/sys/fs/cgroup/cpu weight_file=cpu.shares weight=262144
fi
# Our own group at the largest weight: the load generator, and the server
# when no quota (no qosd group) holds it.
boost=$cpumnt/qosd-test-cfs-period-$$
mkdir "$boost"
echo "$weight" >"$boost/$weight_file"
cleanup() {
  "$QOSD" restore --state-file "$st/state.json" >/dev/null 2>&1 || true
  [ -n "$srv" ] && { kill "$srv" 2>/dev/null; wait "$srv" 2>/dev/null || true; }
  for p in $(cat "$boost/cgroup.procs" 2>/dev/null); do echo "$p" >"$cpumnt/cgroup.procs" 2>/dev/null || true; done
  rmdir "$boost" 2>/dev/null || true
  rm -rf "$st"
}
trap cleanup EXIT
wait_port() { for _ in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/$1) 2>/dev/null && return; sleep 0.1; done; }
field() { grep -o "\"$2\":{[^}]*}" <<<"$1" | grep -o "\"$3\":[0-9.e+-]*" | cut -d: -f2; }
# Median and quartiles of the numbers on stdin (linear interpolation).
quart() {
  sort -g | awk '{v[NR]=$1} END {
    q = "";
    for (i = 1; i <= 3; i++) { p = (NR - 1) * i / 4 + 1; lo = int(p); f = p - lo;
      x = (lo < NR) ? v[lo] + f * (v[lo + 1] - v[lo]) : v[lo]; q = q sprintf("%.0f ", x) }
    print q }'
}

"$FIXTURE" --listen "127.0.0.1:$port" --work-us "$work_us" --exit-after-s 1800 >/dev/null &
srv=$!
echo "$srv" >"$boost/cgroup.procs"
wait_port "$port"

# Where the knob's group is: the v2 cpu controller, else the v1 cpu hierarchy.
group=
burst_file=
set_case() { # $1: case name
  local c=$1 period burst=0
  "$QOSD" restore --state-file "$st/state.json" >/dev/null 2>&1 || true
  [ "$c" = none ] && { group=; return; }
  period=${c%b}
  [ "$period" != "$c" ] && burst=1
  # Burst: one period's quota may be banked (--burst-pct 100), or none.
  "$QOSD" set --state-file "$st/state.json" quota --pid "$srv" --quota "$QUOTA" \
    --period-us $(( period * 1000 )) --burst-pct $(( burst * 100 )) >/dev/null
  group=$cpumnt/qosd-pid$srv
  # qosd's group is new, at the default weight: the largest, as the server's had.
  echo "$weight" >"$group/$weight_file"
  if [ "$burst" = 1 ]; then
    for f in cpu.cfs_burst_us cpu.max.burst; do [ -f "$group/$f" ] && burst_file=$f; done
    [ -n "$burst_file" ] || { echo "cfs_period: this kernel has no CFS burst file" >&2; exit 1; }
    [ "$(cat "$group/$burst_file")" -gt 0 ] || { echo "cfs_period: qosd wrote no burst" >&2; exit 1; }
  fi
}
throttled() { [ -n "$group" ] && awk '$1=="nr_throttled"{t=$2} $1=="nr_periods"{p=$2} END {print t+0, p+0}' "$group/cpu.stat" || echo "0 0"; }

cases=(none 5 10 20 100 20b 100b)
declare -A p50s p99s thr
for r in $(seq 0 $(( ROUNDS - 1 ))); do
  for k in $(seq 0 $(( ${#cases[@]} - 1 ))); do
    c=${cases[$(( (k + r) % ${#cases[@]} ))]}
    set_case "$c"
    for l in $LOADS; do
      sleep 0.3
      read -r t0 n0 < <(throttled)
      j=$(sh -c 'echo $$ >"$0/cgroup.procs"; shift; exec "$@"' "$boost" _ "$QOSD" load --target "127.0.0.1:$port" --protocol http --rps "$(rps_at "$l")" \
          --arrival poisson --connections 8 --keepalive --duration "$SECS" --seed $(( r + 1 )) \
          --json | tail -1)
      read -r t1 n1 < <(throttled)
      p50s[$l:$c]+="$(field "$j" latency_us p50) "
      p99s[$l:$c]+="$(field "$j" latency_us p99) "
      thr[$l:$c]+="$(awk -v a=$((t1 - t0)) -v b=$((n1 - n0)) 'BEGIN { printf "%.0f", b ? 100 * a / b : 0 }') "
    done
  done
done
"$QOSD" restore --state-file "$st/state.json" >/dev/null 2>&1 || true

row() { # load:case label
  local c=$1 l=$2 p50 p99 t
  read -r _ p50 _ < <(tr ' ' '\n' <<<"${p50s[$c]}" | grep . | quart)
  p99=$(tr ' ' '\n' <<<"${p99s[$c]}" | grep . | quart)
  read -r _ t _ < <(tr ' ' '\n' <<<"${thr[$c]}" | grep . | quart)
  read -r q1 m q3 <<<"$p99"
  echo "| ${c%%:*} % | $l | $p50 | $m | $q1 – $q3 | ${p99s[$c]}| $t % |"
}
table() {
  for l in $LOADS; do
    row "$l:none" "no quota"
    row "$l:5" "period 5 ms"
    row "$l:10" "period 10 ms"
    row "$l:20" "period 20 ms"
    row "$l:100" "period 100 ms (the kernel's default)"
    row "$l:20b" "period 20 ms + burst"
    row "$l:100b" "period 100 ms + burst"
  done
}
cat <<MD
## CFS period (\`scenarios/bench/cfs_period.sh\`, issue 20)

qosd's HTTP fixture (${work_us} µs of CPU per request) under its own CPU quota of ${QUOTA} CPU
(\`qosd set quota --quota ${QUOTA} --period-us P\`), offered $(for l in $LOADS; do printf "%s %% (%s rps) " "$l" "$(rps_at "$l")"; done)of
what the quota allows (${QUOTA} CPU / ${work_us} µs), Poisson arrivals, 8 keep-alive connections, ${SECS} s per run. Cases
interleaved in ${ROUNDS} rounds (order rotated); client latency in µs, median over rounds of each
round's p50, and of each round's p99 with its quartiles; "throttled" is the median share of
periods in which the group was throttled (\`cpu.stat\`). The server's group and the load
generator run at the largest CPU weight (\`$weight_file\` $weight), so that other work on the machine
takes little of their CPU and the quota is what limits the server. Burst: one period's quota may be
banked (\`--burst-pct 100\`: \`${burst_file:-cpu.cfs_burst_us}\`); the other cases have none (\`--burst-pct 0\`). Machine: $(nproc) CPUs, $(uname -r), load average at the end
$(cut -d" " -f1-3 /proc/loadavg) (other work on the machine competes with the server in every case).

| load | case | p50 µs | p99 µs (median) | p99 quartiles | p99 per round | throttled |
| --- | --- | --- | --- | --- | --- | --- |
$(table)

MD
