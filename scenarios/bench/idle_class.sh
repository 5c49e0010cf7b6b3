#!/usr/bin/env bash
# Sharing a CPU (issue 20): an LC server (qosd's HTTP fixture, 1 ms of CPU
# per request, at LOAD_PCT (50) % of the rate it completes alone when offered its
# nominal capacity nproc/1 ms: on a loaded machine that is less) beside a batch
# job that wants every CPU (`qosd batch`, one hashing thread per CPU).
# Client p99 (`qosd load`, Poisson arrivals) in three cases, interleaved in
# ROUNDS rounds: the job stopped (alone), the job in the idle class
# (`qosd set priority --class idle`: its group's cpu.idle, the knob's real
# path, undone by `qosd restore`), and the job at normal weight. Medians
# over rounds. Prints a markdown section on stdout.
# It also prints where the time goes, per case (lib/sched_decomp.sh, read
# inside each run; DECOMPOSE=0 skips it): the server's and the client's
# run-queue wait and CPU time per request, timeslices, steal, the batch
# job's CPUs and others' niced CPUs. TRACE=1 also runs lib/wake_wait.bt
# (bpftrace) in each run: waits by kind, what the other CPU ran while they
# lasted, wake-up placement, pulls of waiting threads by load balancing;
# raw outputs in $OUT (default target/idle_class).
# CASES (default "alone idle normal") picks the cases: alone, idle or normal,
# each optionally followed by "+" modifiers applied to the job on top:
#   +sidle      SCHED_IDLE on every thread of the job (chrt; besides cpu.idle)
#   +qCPUSpMS   a BE cap: \`qosd set quota --quota CPUS --period-us MS*1000
#               --burst-pct 0\` (e.g. idle+q0.6p10: 0.6 CPU per 10 ms period)
#   +cpusLIST   the job's CPUs: \`qosd set cores --cpus LIST\` (e.g. idle+cpus1)
# and "+" modifiers applied to the LC server instead (also with alone):
#   +lcfifo     SCHED_FIFO priority 1 on every thread of the server (chrt -a;
#   +lcrr       SCHED_RR 1) its per-connection threads, spawned by its accept
#               thread, inherit the policy (no reset-on-fork)
#   +lcqosd     qosd itself: a \`qosd run\` daemon managing the server as an LC
#               app with \`initial: { cpu_priority: 3 }\` (only the priority knob
#               enabled), so its real-time gate makes the server's threads
#               fifo:1 in a group with an RT budget while its CPU
#               use allows (connection threads made later inherit it);
#               the daemon is stopped (SIGTERM: restore) after the
#               run. The output gives the server threads' classes mid-run.
#   +lcback     the server made real-time and then normal again by hand
#               (\`qosd set priority --class realtime\`, then \`--class normal\`,
#               as the gate does when the app's CPU use rises): where that
#               leaves it (its own group, or back where it was found)
# e.g. CASES="alone idle idle+sidle idle+q0.6p100 alone+lcfifo idle+lcfifo". Each
# run starts from \`qosd restore\` (and SCHED_OTHER for the job's and the server's
# threads) and applies its case; the
# job's ops/s is read from its progress lines during each run.
# KEEPALIVE=0 sends each request on a new connection (the fixture makes two
# threads per connection, so every request runs on new threads).
# Usage: scenarios/bench/idle_class.sh [QOSD]   (root; ROUNDS=3 SECS=8 LOAD_PCT=50 KEEPALIVE=1 by default)
set -euo pipefail
cd "$(dirname "$0")/../.."
QOSD=${1:-target/release/qosd}
FIXTURE=${FIXTURE:-target/release/qosd-fixture}
ROUNDS=${ROUNDS:-3}
SECS=${SECS:-8}
LOAD_PCT=${LOAD_PCT:-50}
[[ $LOAD_PCT =~ ^[0-9]+$ ]] && (( LOAD_PCT >= 1 && LOAD_PCT <= 100 )) ||
  { echo "idle_class: LOAD_PCT=$LOAD_PCT: expected 1..100 (% of the capacity measured alone)" >&2; exit 2; }
KEEPALIVE=${KEEPALIVE:-1}
[[ $KEEPALIVE =~ ^[01]$ ]] || { echo "idle_class: KEEPALIVE=$KEEPALIVE: expected 0 or 1" >&2; exit 2; }
conns=(--keepalive) conn_text="8 keep-alive connections"
[ "$KEEPALIVE" = 0 ] && conns=() conn_text="a new connection per request (at most 8 open)"
TRACE=${TRACE:-0}
DECOMPOSE=${DECOMPOSE:-1}
[ "$TRACE" = 1 ] && DECOMPOSE=1
OUT=${OUT:-target/idle_class}
read -ra cases <<<"${CASES:-alone idle normal}"
for c in "${cases[@]}"; do
  [[ $c =~ ^(alone|idle|normal)(\+(sidle|q[0-9]+(\.[0-9]+)?p[0-9]+|cpus[0-9,-]+|lcfifo|lcrr|lcqosd|lcback))*$ ]] ||
    { echo "idle_class: bad case '$c' in CASES: alone|idle|normal, then +sidle, +qCPUSpMS (e.g. +q0.6p10), +cpusLIST, +lcfifo, +lcrr, +lcqosd, +lcback" >&2; exit 2; }
  if [[ $c == alone+* && ! $c =~ ^alone(\+lc(fifo|rr|qosd|back))+$ ]]; then
    echo "idle_class: bad case '$c' in CASES: alone takes only the server's modifiers (+lcfifo, +lcrr, +lcqosd, +lcback)" >&2; exit 2
  fi
done
. scenarios/bench/lib/sched_decomp.sh
[ "$(id -u)" = 0 ] || { echo "idle_class: needs root (cgroups)" >&2; exit 1; }
[ "$TRACE" = 1 ] && ! command -v bpftrace >/dev/null && { echo "idle_class: TRACE=1 needs bpftrace (apt-get install bpftrace)" >&2; exit 2; }
[ -x "$FIXTURE" ] || { echo "idle_class: $FIXTURE missing (cargo build --release)" >&2; exit 1; }
ncpu=$(nproc)
work_us=1000
nominal=$(( ncpu * 1000000 / work_us ))
port=$(( 20000 + RANDOM % 20000 ))
st=$(mktemp -d)
srv= job= qd=
# The +lcqosd daemon (lib/lcqosd.sh): started per run, stopped after.
. scenarios/bench/lib/lcqosd.sh
cleanup() {
  stop_daemon
  # A bpftrace left attached (TRACE=1, the bench stopped mid-run) would tax
  # every context switch of the node until killed.
  [ -n "${BT_PID:-}" ] && { kill -INT "$BT_PID" 2>/dev/null; sleep 1; kill "$BT_PID" 2>/dev/null; wait "$BT_PID" 2>/dev/null || true; }
  [ -n "$job" ] && { kill -CONT "$job" 2>/dev/null; kill "$job" 2>/dev/null; wait "$job" 2>/dev/null || true; }
  "$QOSD" restore --state-file "$st/state.json" >/dev/null 2>&1 || true
  [ -n "$srv" ] && { chrt -a -o -p 0 "$srv" >/dev/null 2>&1; kill "$srv" 2>/dev/null; wait "$srv" 2>/dev/null || true; }
  rm -rf "$st"
}
trap cleanup EXIT
wait_port() { for _ in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/$1) 2>/dev/null && return; sleep 0.1; done; }
field() { grep -o "\"$2\":{[^}]*}" <<<"$1" | grep -o "\"$3\":[0-9.e+-]*" | cut -d: -f2; }
median() { sort -n | awk '{v[NR]=$1} END {print (NR%2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }

"$FIXTURE" --listen "127.0.0.1:$port" --work-us "$work_us" --exit-after-s 900 >/dev/null &
srv=$!
wait_port "$port"
"$QOSD" batch --threads "$ncpu" --report-ms 200 --exit-after-s 900 >"$st/job.out" &
job=$!
# Stop it once it runs (its first progress line): stopped earlier, the
# forked shell would not have opened job.out nor become qosd yet.
for _ in $(seq 50); do [ -s "$st/job.out" ] && break; sleep 0.1; done
kill -STOP "$job"
# The capacity this machine gives the server now (other work takes its
# share): the completion rate under an offered load of the nominal capacity.
top() { grep -o "\"$2\":[0-9.e+-]*" <<<"$1" | head -1 | cut -d: -f2; }
j=$("$QOSD" load --target "127.0.0.1:$port" --protocol http --rps "$nominal" --arrival poisson \
    --connections 8 --keepalive --duration 4 --json)
cap=$(top "$j" achieved_rps); cap=${cap%.*}
rps=$(( cap * LOAD_PCT / 100 ))
sleep 2

declare -A p99s dec niced opss
# The CPUs of a "qCPUSpMS" modifier.
qcpus() { local x=${1#q}; echo "${x%p*}"; }
# The job's "ops COUNT ELAPSED_US" progress, last line.
ops() { tail -1 "$st/job.out" | awk '{print $2 + 0, $3 + 0}'; }
# Put the job back as it started (the root groups, SCHED_OTHER, stopped) and
# the server's threads at SCHED_OTHER, then apply case $1.
apply_case() {
  local m base=${1%%+*} mods=
  [[ $1 == *+* ]] && mods=${1#*+}
  kill -STOP "$job"
  stop_daemon
  "$QOSD" restore --state-file "$st/state.json" >/dev/null 2>&1 || true
  chrt -a -o -p 0 "$job" >/dev/null
  chrt -a -o -p 0 "$srv" >/dev/null
  if [[ +$mods+ == *+lcfifo+* ]]; then chrt -a -f -p 1 "$srv" >/dev/null; fi
  if [[ +$mods+ == *+lcrr+* ]]; then chrt -a -r -p 1 "$srv" >/dev/null; fi
  if [[ +$mods+ == *+lcqosd+* ]]; then start_daemon idle_class; fi
  if [[ +$mods+ == *+lcback+* ]]; then
    "$QOSD" set --state-file "$st/state.json" priority --pid "$srv" --class realtime >/dev/null
    "$QOSD" set --state-file "$st/state.json" priority --pid "$srv" --class normal >/dev/null
  fi
  [ "$base" = alone ] && return
  [ "$base" = idle ] && "$QOSD" set --state-file "$st/state.json" priority --pid "$job" --class idle >/dev/null
  local IFS=+
  for m in $mods; do
    case $m in
      sidle) chrt -a -i -p 0 "$job" >/dev/null ;;
      q*) "$QOSD" set --state-file "$st/state.json" quota --pid "$job" --quota "$(qcpus "$m")" \
            --period-us "$(( ${m##*p} * 1000 ))" --burst-pct 0 >/dev/null ;;
      cpus*) "$QOSD" set --state-file "$st/state.json" cores --pid "$job" --cpus "${m#cpus}" >/dev/null ;;
    esac
  done
  kill -CONT "$job"
}
lcqosd_config "127.0.0.1:$(( port + 1 ))"
# The server threads' classes now, e.g. "FF:9 TS:1".
classes() { ps -L -o cls= -p "$srv" | sort | uniq -c | awk '{printf "%s%s:%s", (NR > 1 ? " " : ""), $2, $1}'; }
declare -A cls
[ "$TRACE" = 1 ] && { [ "$ncpu" = 2 ] || { echo "idle_class: TRACE=1 needs 2 CPUs" >&2; exit 1; }
                      mkdir -p "$OUT"; }
# One load run of case $1 (round $2): its JSON in $LOAD_JSON. With DECOMPOSE,
# the /proc figures of the run's middle (the client's connections and the
# server's per-connection threads live then) go to dec[$1] as one
# "delay_fx exec_fx slices_fx delay_cl exec_cl steal% be_cpus mean nice_cpus"
# row (nice_cpus: CPUs' worth of niced work, others' nice-19 builds).
run_load() {
  local args=(--target "127.0.0.1:$port" --protocol http --rps "$rps" --arrival poisson
              --connections 8 "${conns[@]}" --duration "$SECS" --json)
  if [ "$DECOMPOSE" != 1 ]; then LOAD_JSON=$("$QOSD" load "${args[@]}"); return; fi
  local f="$st/load.json" cl bt= start; start=$(date +%s%N)
  "$QOSD" load "${args[@]}" >"$f" & cl=$!
  if [ "$TRACE" = 1 ]; then
    bpftrace "scenarios/bench/lib/wake_wait.bt" "$srv" "$cl" "$job" >"$OUT/$1-$2.txt" 2>&1 & bt=$! BT_PID=$!
    for _ in $(seq 100); do grep -q '^ready' "$OUT/$1-$2.txt" && break; sleep 0.1; done
  fi
  sleep 1
  local t0 f0 c0 n0 b0 t1 f1 c1 n1 b1
  t0=$(date +%s%N) f0=$(sched_snap "$srv") c0=$(sched_snap "$cl") n0=$(node_ticks) b0=$(proc_ticks "$job")
  sleep "$(awk -v s="$start" -v t="$t0" -v d="$SECS" 'BEGIN {x = (s + (d - 1) * 1e9 - t) / 1e9; print (x > 0.5 ? x : 0.5)}')"
  t1=$(date +%s%N) f1=$(sched_snap "$srv") c1=$(sched_snap "$cl") n1=$(node_ticks) b1=$(proc_ticks "$job")
  [ -n "$bt" ] && { kill -INT "$bt"; wait "$bt" || true; BT_PID=; }
  wait "$cl"
  local j; j=$(cat "$f"); LOAD_JSON=$j
  local reqs; reqs=$(awk -v r="$(top "$j" achieved_rps)" -v t="$(( t1 - t0 ))" 'BEGIN {print r * t / 1e9}')
  [ -n "$bt" ] && awk -v r="$(top "$j" achieved_rps)" '/^elapsed_ms/ {print "requests", r * $2 / 1e3}' \
    "$OUT/$1-$2.txt" >>"$OUT/$1-$2.txt"
  dec[$1]+=$(awk -v fx="$(sched_delta "$f0" "$f1")" -v cl="$(sched_delta "$c0" "$c1")" \
      -v n="$(sched_delta "$n0" "$n1")" -v be="$(( b1 - b0 ))" -v q="$reqs" -v t="$(( t1 - t0 ))" \
      -v mean="$(field "$j" latency_us mean)" -v hz="$(getconf CLK_TCK)" 'BEGIN {
        split(fx, a, " "); split(cl, b, " "); split(n, s, " ");
        printf "%.0f/%.0f/%.2f/%.0f/%.0f/%.2f/%.2f/%.0f/%.2f ", a[2] / q / 1e3, a[1] / q / 1e3, a[3] / q,
          b[2] / q / 1e3, b[1] / q / 1e3, 100 * s[1] / s[3], be / hz / (t / 1e9), mean,
          s[4] / hz / (t / 1e9) }')
}

nc=${#cases[@]}
for r in $(seq 0 $(( ROUNDS - 1 ))); do
  for k in $(seq 0 $(( nc - 1 ))); do
    c=${cases[$(( (k + r) % nc ))]}
    apply_case "$c"
    sleep 0.5
    t0=$(date +%s%N) n0=$(node_ticks) o0=$(ops)
    sp=
    [[ $c == *+lcqosd* ]] && { (sleep "$(( SECS / 2 ))"; classes >"$st/cls") & sp=$!; }
    run_load "$c" "$r"; j=$LOAD_JSON
    [ -n "$sp" ] && { wait "$sp"; cls[$c]+="$(cat "$st/cls"); "; }
    p99s[$c]+="$(field "$j" latency_us p99) "
    # The job's ops/s during the run (its progress lines, 200 ms apart).
    opss[$c]+="$(awk -v a="$o0" -v b="$(ops)" 'BEGIN {split(a, x, " "); split(b, y, " ");
      d = y[2] - x[2]; printf "%.0f", (d > 0) ? (y[1] - x[1]) / d * 1e6 : 0}') "
    # Others' niced work (nice-19 builds) during the run, in CPUs: what
    # "quiet" means, measured (0 on a quiet machine).
    niced[$c]+="$(awk -v a="$n0" -v b="$(node_ticks)" -v t="$(( $(date +%s%N) - t0 ))" -v hz="$(getconf CLK_TCK)" \
      'BEGIN {split(a, x, " "); split(b, y, " "); printf "%.2f", (y[4] - x[4]) / hz / (t / 1e9)}') "
  done
done
apply_case alone

med() { tr ' ' '\n' <<<"${p99s[$1]}" | grep . | median; }
# Lower and upper quartiles of case $1's p99s (linear interpolation).
quart() { tr ' ' '\n' <<<"${p99s[$1]}" | grep . | sort -n | awk '{v[NR] = $1}
  function q(p,  h, l) { h = (NR - 1) * p + 1; l = int(h); return v[l] + (h - l) * (v[l + 1 < NR ? l + 1 : NR] - v[l]) }
  END {printf "%.0f–%.0f", q(0.25), q(0.75)}'; }
ratio() { [ -n "$2" ] && awk -v x="$1" -v y="$2" 'BEGIN { printf "%.2f×", x / y }' || echo "–"; }
a=
[[ " ${cases[*]} " == *" alone "* ]] && a=$(med alone)
label() {
  local base=${1%%+*} mods= out
  [[ $1 == *+* ]] && mods=${1#*+}
  case $base in
    alone) out="stopped (alone)" ;;
    idle) out="idle class (\`qosd set priority --class idle\`)" ;;
    normal) out="normal weight" ;;
  esac
  local IFS=+ m
  for m in $mods; do
    case $m in
      sidle) out+=" + SCHED_IDLE threads" ;;
      q*) out+=" + quota $(qcpus "$m") CPU / ${m##*p} ms" ;;
      cpus*) out+=" + CPUs ${m#cpus}" ;;
      lcfifo) out+=" + server SCHED_FIFO 1" ;;
      lcrr) out+=" + server SCHED_RR 1" ;;
      lcqosd) out+=" + server real-time by \`qosd run\` (cpu_priority 3)" ;;
      lcback) out+=" + server set realtime, then normal" ;;
    esac
  done
  echo "$out"
}
cat <<MD
## Sharing a CPU: an LC server beside a batch job in the idle class

\`scenarios/bench/idle_class.sh\`: qosd's HTTP fixture (${work_us} µs of CPU per request) at ${rps} rps
(${LOAD_PCT} % of the ${cap} rps it completed when offered its nominal capacity, ${nominal} rps on $ncpu CPUs, alone), Poisson arrivals, ${conn_text}, ${SECS} s per
run, beside \`qosd batch --threads $ncpu\` (a hashing thread per CPU). Cases interleaved in ${ROUNDS}
rounds; medians over rounds of the client p99. Load average at the end: $(cut -d" " -f1-3 /proc/loadavg)
(other work on the machine competes with the server in every case; "others' niced CPUs" is the
CPU time niced tasks, such as other sessions' nice-19 builds, used during each run: 0 when quiet;
the bench runs at normal priority).

| batch job | client p99 µs (per round) | median | quartiles | vs alone | batch ops/s (median) | others' niced CPUs (per round) |
| --- | --- | --- | --- | --- | --- | --- |
$(for c in "${cases[@]}"; do
  echo "| $(label "$c") | ${p99s[$c]}| $(med "$c") | $(quart "$c") | $(ratio "$(med "$c")" "$a") | $(tr ' ' '\n' <<<"${opss[$c]}" | grep . | median) | ${niced[$c]}|"
done)

Goal (issue 20): idle class within 1.2× of alone.
$(for c in "${cases[@]}"; do [ -n "${cls[$c]:-}" ] && echo "
Server threads' classes in the middle of each +lcqosd run, $c: ${cls[$c]}"; done)

MD
[ "$DECOMPOSE" = 1 ] || exit 0
# Column k's median over the rounds of case $1 ("a/b/c/..." per round).
dmed() { tr ' ' '\n' <<<"${dec[$1]}" | grep . | cut -d/ -f"$2" | median; }
row() { local k out=; for k in 8 1 2 3 4 5 6 7 9; do out+=" $(dmed "$1" "$k") |"; done; echo "$out"; }
cat <<MD
### Where the time goes (medians over rounds, read in each run's middle $(( SECS - 2 )) s)

Server = the fixture's threads, client = \`qosd load\`'s; per request: sums over
their threads of /proc/TID/schedstat (run_delay, time on CPU, timeslices)
divided by the requests answered in the window. Steal: % of all node ticks.
Niced CPUs: CPUs' worth of niced work meanwhile (other sessions' nice-19
builds): 0 on a quiet machine.

| batch job | mean latency µs | server run-queue wait µs/req | server CPU µs/req | server slices/req | client run-queue wait µs/req | client CPU µs/req | steal % | batch job CPUs | niced CPUs |
| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |
$(for c in "${cases[@]}"; do echo "| $c |$(row "$c")"; done)

MD
[ "$TRACE" = 1 ] || exit 0
# wake_wait.bt's sums over a case's rounds, per request: waits by kind,
# and what the other CPU ran while they lasted.
cat <<MD
### Run-queue waits by kind (TRACE=1, lib/wake_wait.bt; all rounds summed, per request; raw in $OUT)

"Other CPU ..." is the part of the waits during which the other CPU was idle,
ran the batch job, or ran others' nice-19 work: time a waiting thread could
have run there. Placement: server wake-ups put on a CPU busy with other work
while the other CPU was idle or ran only the batch job / nice-19 work.

| batch job | who | wait kind | waits/req | mean µs | wait µs/req | other CPU idle µs/req | other CPU ran batch µs/req | other CPU ran nice 19 µs/req |
| --- | --- | --- | --- | --- | --- | --- | --- | --- |
MD
for c in "${cases[@]}"; do
  cat "$OUT/$c"-*.txt | awk -v c="$c" '
    function key() { gsub(/[@a-z_0-9]*\[|\]:|,|count|average|total/, " ") }
    /^@wait_ns\[/ { key(); n[$1" "$2] += $3; t[$1" "$2] += $5 }
    /^@other_idle_ns\[/ { key(); oi[$1" "$2] += $3 }
    /^@other_be_ns\[/ { key(); ob[$1" "$2] += $3 }
    /^@other_nice19_ns\[/ { key(); on[$1" "$2] += $3 }
    /^requests/ { q += $2 }
    END { split("server client", who, " "); split("woken preempted", kind, " ");
      for (w = 1; w <= 2; w++) for (k = 1; k <= 2; k++) { i = w" "k;
        if (n[i]) printf "| %s | %s | %s | %.2f | %.0f | %.0f | %.0f | %.0f | %.0f |\n", c, who[w], kind[k],
          n[i] / q, t[i] / n[i] / 1e3, t[i] / q / 1e3, oi[i] / q / 1e3, ob[i] / q / 1e3, on[i] / q / 1e3 } }'
done
echo
for c in "${cases[@]}"; do
  cat "$OUT/$c"-*.txt | awk -v c="$c" '
    /^@placement\[1, / { gsub(/@placement\[|\]:|,/, " "); all += $4; if ($2 == 2 && $3 != 2) bad += $4 }
    END { printf "Placement, %s: %d of %d server wake-ups (%.1f %%) onto a busy CPU while the other was idle or ran background work.\n", c, bad, all, all ? 100 * bad / all : 0 }'
done
echo
echo "Server wake-ups by what their CPU ran at wake-up: waits, mean wait µs, waits over 1 ms (of which another server/client thread ran on that CPU first)."
echo
for c in "${cases[@]}"; do
  cat "$OUT/$c"-*.txt | awk -v c="$c" '
    /^@woken_wait_by_target_ns\[1, / { gsub(/@[a-z_]*\[|\]:|,|count|average|total/, " ");
      n[$2] += $3; t[$2] += $5 }
    /^@woken_over_1ms_by_target\[1, / { gsub(/@[a-z_0-9]*\[|\]:|,/, " "); s[$2] += $3 }
    /^@woken_over_1ms_behind_lc\[1, / { gsub(/@[a-z_0-9]*\[|\]:|,/, " "); b[$2] += $3 }
    END { split("idle batch other nice-19", k, " "); printf "- %s:", c;
      for (i = 0; i < 4; i++) if (n[i]) printf " %s %d, %.0f µs, %d over 1 ms (%d behind the app'"'"'s own threads);",
        k[i + 1], n[i], t[i] / n[i] / 1e3, s[i], b[i]; print "" }'
done
echo
# The cause, per case: all waits of the server and client summed (per
# request), the part the other CPU spent running only the batch job or
# idle, and the pulls of waiting threads by load balancing (per 1000
# requests) by what the pulling CPU ran: a CPU in the idle class never runs
# new-idle balancing, so its pulls come from its periodic balance.
declare -A tot
for c in "${cases[@]}"; do
  tot[$c]=$(cat "$OUT/$c"-*.txt | awk '
    function key() { gsub(/[@a-z_0-9]*\[|\]:|,|count|average|total/, " ") }
    /^@wait_ns\[/ { key(); w += $5 }
    /^@other_idle_ns\[/ { key(); oi += $3 }
    /^@other_be_ns\[/ { key(); ob += $3 }
    /^@pulled\[/ { gsub(/@pulled\[|\]:|,/, " "); p[$3] += $5 }
    /^requests/ { q += $2 }
    END { printf "%.0f %.0f %.0f %.1f %.1f %.1f", w / q / 1e3, oi / q / 1e3, ob / q / 1e3,
      1e3 * p[0] / q, 1e3 * p[1] / q, 1e3 * (p[2] + p[3]) / q }')
done
cat <<MD
The cause (server and client waits together, µs per request; "could have
run": the part of the waits during which the other CPU sat idle or ran only
the job, and its growth over alone as a share of the extra wait; pulls of a
waiting thread to the other CPU per 1000 requests, by what that CPU ran):

| batch job | wait µs/req | extra vs alone | other CPU idle | other CPU ran only the job | could have run | its growth, share of the extra | pulls by an idle CPU | by a CPU running the job | by a CPU whose normal task just ran |
| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |
$(for c in "${cases[@]}"; do
  awk -v c="$c" -v x="${tot[$c]}" -v a="${tot[alone]:-}" 'BEGIN { split(x, v, " "); split(a, b, " ");
    e = (a != "") ? v[1] - b[1] : 0; g = (a != "") ? v[2] + v[3] - b[2] - b[3] : 0;
    printf "| %s | %.0f | %s | %.0f | %.0f | %.0f | %s | %.1f | %.1f | %.1f |\n", c, v[1],
      (a != "") ? sprintf("%+.0f", e) : "–", v[2], v[3], v[2] + v[3],
      (e > 0) ? sprintf("%+.0f, %.0f %%", g, 100 * g / e) : "–", v[4], v[5], v[6] }'
done)

MD
