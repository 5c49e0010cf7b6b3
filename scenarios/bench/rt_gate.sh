#!/usr/bin/env bash
# How fast qosd's real-time gate turns real time off when load rises (issue
# 20, docs/sharing-rt.md "The gate"). The bench's fixture (1 ms of CPU per
# request) beside `qosd batch` in the idle class, managed by a `qosd run`
# daemon with `initial: { cpu_priority: 3 }` and only the priority knob (the
# +lcqosd case of idle_class.sh); once the gate has made it real-time, a
# load of LOAD_PCT % of its capacity (measured alone) starts at once. Per
# round it reports: the time from the load's start to the gate's first
# "off" decision (the daemon's /v1/decisions, wall clock) and the reading
# it gave, the client p99 of the load's first INTERVAL_MS intervals and of
# the whole run, the fixture's CPU use per 100 ms (its threads'
# /proc/PID/task/*/schedstat; mean, spread and the share of samples above
# the gate's off bound) and its threads' classes mid-run, and RT
# throttling of its group (`rt_throttled` of every `rt_rq[N]:/qosd-fixture`
# in /sys/kernel/debug/sched/debug, sampled every 100 ms; debugfs is
# mounted for the run and unmounted after if it was not mounted).
# Usage: scenarios/bench/rt_gate.sh [QOSD]   (root; ROUNDS=2 SECS=6 LOAD_PCT=80
# INTERVAL_MS=250 OFF_ABOVE=0.7 by default; OFF_ABOVE only labels the samples)
set -euo pipefail
cd "$(dirname "$0")/../.."
QOSD=${1:-target/release/qosd}
FIXTURE=${FIXTURE:-target/release/qosd-fixture}
ROUNDS=${ROUNDS:-2}
SECS=${SECS:-6}
LOAD_PCT=${LOAD_PCT:-80}
INTERVAL_MS=${INTERVAL_MS:-250}
OFF_ABOVE=${OFF_ABOVE:-0.7}
[[ $LOAD_PCT =~ ^[0-9]+$ ]] && (( LOAD_PCT >= 1 && LOAD_PCT <= 100 )) ||
  { echo "rt_gate: LOAD_PCT=$LOAD_PCT: expected 1..100" >&2; exit 2; }
[[ $ROUNDS =~ ^[0-9]+$ && $SECS =~ ^[0-9]+$ && $INTERVAL_MS =~ ^[0-9]+$ ]] && (( ROUNDS >= 1 && SECS >= 2 && SECS <= 60 && INTERVAL_MS >= 100 )) ||
  { echo "rt_gate: ROUNDS >= 1, SECS in 2..60, INTERVAL_MS >= 100 expected" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "rt_gate: needs root (cgroups, real time)" >&2; exit 1; }
[ -x "$FIXTURE" ] || { echo "rt_gate: $FIXTURE missing (cargo build --release)" >&2; exit 1; }
ncpu=$(nproc)
work_us=1000
nominal=$(( ncpu * 1000000 / work_us ))
port=$(( 20000 + RANDOM % 20000 ))
api="127.0.0.1:$(( port + 1 ))"
st=$(mktemp -d)
srv= job= qd= smp= mounted=
. scenarios/bench/lib/lcqosd.sh
cleanup() {
  [ -n "$smp" ] && { kill "$smp" 2>/dev/null; wait "$smp" 2>/dev/null || true; }
  stop_daemon
  [ -n "$job" ] && { kill -CONT "$job" 2>/dev/null; kill "$job" 2>/dev/null; wait "$job" 2>/dev/null || true; }
  "$QOSD" restore --state-file "$st/state.json" >/dev/null 2>&1 || true
  [ -n "$srv" ] && { chrt -a -o -p 0 "$srv" >/dev/null 2>&1; kill "$srv" 2>/dev/null; wait "$srv" 2>/dev/null || true; }
  [ -n "$mounted" ] && umount /sys/kernel/debug 2>/dev/null
  rm -rf "$st"
}
trap cleanup EXIT
wait_port() { for _ in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/$1) 2>/dev/null && return; sleep 0.1; done; }
top() { grep -o "\"$2\":[0-9.e+-]*" <<<"$1" | head -1 | cut -d: -f2; }

if [ ! -e /sys/kernel/debug/sched/debug ]; then
  mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null && mounted=1 || true
fi
dbg=/sys/kernel/debug/sched/debug
[ -r "$dbg" ] || dbg=

"$FIXTURE" --listen "127.0.0.1:$port" --work-us "$work_us" --exit-after-s 900 >/dev/null &
srv=$!
wait_port "$port"
"$QOSD" batch --threads "$ncpu" --report-ms 200 --exit-after-s 900 >"$st/job.out" &
job=$!
for _ in $(seq 50); do [ -s "$st/job.out" ] && break; sleep 0.1; done
kill -STOP "$job"
j=$("$QOSD" load --target "127.0.0.1:$port" --protocol http --rps "$nominal" --arrival poisson \
    --connections 8 --keepalive --duration 4 --json)
cap=$(top "$j" achieved_rps); cap=${cap%.*}
rps=$(( cap * LOAD_PCT / 100 ))
"$QOSD" set --state-file "$st/state.json" priority --pid "$job" --class idle >/dev/null
kill -CONT "$job"
sleep 1

lcqosd_config "$api"

# Every 100 ms until killed (bounded by the run): wall ns, the fixture's CPU
# ns so far (all threads), its FIFO threads, and its group's throttled rt_rqs.
sampler() {
  local end=$(( $(date +%s) + SECS + 5 ))
  while (( $(date +%s) < end )); do
    local t a b cpu ff thr="- -"
    # The read's own time (it can wait for a CPU: the server is real-time).
    a=$(date +%s%N)
    cpu=$(cat /proc/"$srv"/task/*/schedstat 2>/dev/null | awk '{s += $1} END {print s + 0}')
    b=$(date +%s%N) t=$(( (a + b) / 2 ))
    ff=$(ps -L -o cls= -p "$srv" | awk '/FF/ {f++} END {print f + 0 "/" NR}')
    [ -n "$dbg" ] && thr=$(awk '/^rt_rq\[[0-9]+\]:\/qosd-fixture$/ {g = 1; next} /^rt_rq|^cfs_rq|^dl_rq/ {g = 0}
      g && /\.rt_throttled/ {n += $3} g && /\.rt_time/ && $3 > m {m = $3} END {print n + 0, m + 0}' "$dbg")
    echo "$t $cpu $ff $thr"
    sleep 0.1
  done
}

echo "## The real-time gate's reaction: fixture at $rps rps ($LOAD_PCT % of $cap), $SECS s, $(date -u +%FT%TZ)"
echo
echo "| round | load start → off decision | its reading | p99 first ${INTERVAL_MS} ms intervals, µs | p99 run, µs | CPUs used per 100 ms (mean ± sd, min–max, > $OFF_ABOVE of $ncpu) | FF threads mid-run | samples with a throttled rt_rq |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
gates=
for r in $(seq 1 "$ROUNDS"); do
  start_daemon rt_gate
  sleep 1
  sampler >"$st/samples" & smp=$!
  sleep 0.3
  t0=$(date +%s%N)
  "$QOSD" load --target "127.0.0.1:$port" --protocol http --rps "$rps" --arrival poisson \
    --connections 8 --keepalive --duration "$SECS" --json --intervals --interval-ms "$INTERVAL_MS" >"$st/load.json"
  t1=$(date +%s%N)
  sleep 0.3
  kill "$smp" 2>/dev/null; wait "$smp" 2>/dev/null || true; smp=
  curl -s "http://$api/v1/decisions?app=fixture&limit=200" >"$st/dec.json"
  stop_daemon
  off=$(jq -r --argjson t0 "$(( t0 / 1000000 ))" '[.decisions[] | select(.resource == "cpu_priority"
          and .to == 2 and .unix_ms >= $t0)] | first // empty
          | "\(.unix_ms - $t0) ms|\(.reason | sub("realtime gate: "; ""))"' "$st/dec.json" 2>/dev/null || true)
  gates+="round $r: $(jq -r --argjson t0 "$(( t0 / 1000000 ))" '[.decisions[] | select(.resource == "cpu_priority")
          | "\((.unix_ms - $t0) / 1000 | . * 100 | round / 100) s \(.from)→\(.to)"] | join(", ")' "$st/dec.json" 2>/dev/null || true)"$'\n'
  [ -n "$off" ] || off="none|–"
  firsts=$(grep '"interval_s"' "$st/load.json" | head -4 | grep -o '"p99_us":[0-9.]*' | cut -d: -f2 | awk '{printf "%s%.0f", (NR > 1 ? " " : ""), $1}' || true)
  p99=$(tail -1 "$st/load.json" | grep -o '"latency_us":{[^}]*}' | grep -o '"p99":[0-9.]*' | cut -d: -f2)
  use=$(awk -v a="$t0" -v b="$t1" -v off="$OFF_ABOVE" -v n="$ncpu" '
    NR > 1 && $1 > a + 1e8 && $1 <= b { u = ($2 - c) / ($1 - t); k++; s += u; q += u * u;
      if (k == 1 || u < lo) lo = u; if (u > hi) hi = u; if (u > off * n) o++ }
    { t = $1; c = $2 }
    END { m = s / k; printf "%.2f ± %.2f, %.2f–%.2f, %d of %d", m, sqrt(q / k - m * m), lo, hi, o, k }' "$st/samples")
  mid=$(awk -v a="$t0" -v b="$t1" '$1 > (a + b) / 2 {print $3; exit}' "$st/samples")
  thr=$(awk -v a="$t0" -v b="$t1" '$1 >= a && $1 <= b && $4 != "-" {k++; if ($4 > 0) n++; if ($5 > m) m = $5}
    END {print (k ? sprintf("%d of %d (rt_time max %.0f ms)", n, k, m) : "not readable")}' "$st/samples")
  echo "| $r | ${off%%|*} | ${off#*|} | $firsts | ${p99%.*} | $use | ${mid:-?} | $thr |"
done
echo
echo "The gate's decisions (s from the load's start, level from→to; 3 real time, 2 normal):"
echo "$gates"
