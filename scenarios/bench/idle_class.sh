#!/usr/bin/env bash
# Sharing a CPU (issue 20): an LC server (qosd's HTTP fixture, 1 ms of CPU
# per request, at 50 % of the rate it completes alone when offered its
# nominal capacity nproc/1 ms: on a loaded machine that is less) beside a batch
# job that wants every CPU (`qosd batch`, one hashing thread per CPU).
# Client p99 (`qosd load`, Poisson arrivals) in three cases, interleaved in
# ROUNDS rounds: the job stopped (alone), the job in the idle class
# (`qosd set priority --class idle`: its group's cpu.idle, the knob's real
# path, undone by `qosd restore`), and the job at normal weight. Medians
# over rounds. Prints a markdown section on stdout.
# Usage: scenarios/bench/idle_class.sh [QOSD]   (root; ROUNDS=3 SECS=8 by default)
set -euo pipefail
cd "$(dirname "$0")/../.."
QOSD=${1:-target/release/qosd}
FIXTURE=${FIXTURE:-target/release/qosd-fixture}
ROUNDS=${ROUNDS:-3}
SECS=${SECS:-8}
[ "$(id -u)" = 0 ] || { echo "idle_class: needs root (cgroups)" >&2; exit 1; }
[ -x "$FIXTURE" ] || { echo "idle_class: $FIXTURE missing (cargo build --release)" >&2; exit 1; }
ncpu=$(nproc)
work_us=1000
nominal=$(( ncpu * 1000000 / work_us ))
port=$(( 20000 + RANDOM % 20000 ))
st=$(mktemp -d)
srv= job=
cleanup() {
  [ -n "$job" ] && { kill -CONT "$job" 2>/dev/null; kill "$job" 2>/dev/null; wait "$job" 2>/dev/null || true; }
  "$QOSD" restore --state-file "$st/state.json" >/dev/null 2>&1 || true
  [ -n "$srv" ] && { kill "$srv" 2>/dev/null; wait "$srv" 2>/dev/null || true; }
  rm -rf "$st"
}
trap cleanup EXIT
wait_port() { for _ in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/$1) 2>/dev/null && return; sleep 0.1; done; }
field() { grep -o "\"$2\":{[^}]*}" <<<"$1" | grep -o "\"$3\":[0-9.e+-]*" | cut -d: -f2; }
median() { sort -n | awk '{v[NR]=$1} END {print (NR%2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }

"$FIXTURE" --listen "127.0.0.1:$port" --work-us "$work_us" --exit-after-s 900 >/dev/null &
srv=$!
wait_port "$port"
"$QOSD" batch --threads "$ncpu" --report-ms 1000 --exit-after-s 900 >/dev/null &
job=$!
kill -STOP "$job"
# The capacity this machine gives the server now (other work takes its
# share): the completion rate under an offered load of the nominal capacity.
top() { grep -o "\"$2\":[0-9.e+-]*" <<<"$1" | head -1 | cut -d: -f2; }
j=$("$QOSD" load --target "127.0.0.1:$port" --protocol http --rps "$nominal" --arrival poisson \
    --connections 8 --keepalive --duration 4 --json)
cap=$(top "$j" achieved_rps); cap=${cap%.*}
rps=$(( cap / 2 ))
sleep 2

declare -A p99s
cases=(alone idle normal)
for r in $(seq 0 $(( ROUNDS - 1 ))); do
  for k in 0 1 2; do
    c=${cases[$(( (k + r) % 3 ))]}
    case $c in
      alone) kill -STOP "$job" ;;
      idle) "$QOSD" set --state-file "$st/state.json" priority --pid "$job" --class idle >/dev/null
            kill -CONT "$job" ;;
      normal) "$QOSD" restore --state-file "$st/state.json" >/dev/null 2>&1 || true
              kill -CONT "$job" ;;
    esac
    sleep 0.5
    j=$("$QOSD" load --target "127.0.0.1:$port" --protocol http --rps "$rps" --arrival poisson \
        --connections 8 --keepalive --duration "$SECS" --json)
    p99s[$c]+="$(field "$j" latency_us p99) "
  done
done
kill -STOP "$job"
"$QOSD" restore --state-file "$st/state.json" >/dev/null 2>&1 || true

med() { tr ' ' '\n' <<<"${p99s[$1]}" | grep . | median; }
a=$(med alone); i=$(med idle); n=$(med normal)
ratio() { awk -v x="$1" -v y="$2" 'BEGIN { printf "%.2f", x / y }'; }
cat <<MD
## Sharing a CPU: an LC server beside a batch job in the idle class

\`scenarios/bench/idle_class.sh\`: qosd's HTTP fixture (${work_us} µs of CPU per request) at ${rps} rps
(50 % of the ${cap} rps it completed when offered its nominal capacity, ${nominal} rps on $ncpu CPUs, alone), Poisson arrivals, 8 keep-alive connections, ${SECS} s per
run, beside \`qosd batch --threads $ncpu\` (a hashing thread per CPU). Cases interleaved in ${ROUNDS}
rounds; medians over rounds of the client p99. Load average at the end: $(cut -d" " -f1-3 /proc/loadavg)
(other work on the machine competes with the server in every case).

| batch job | client p99 µs (per round) | median | vs alone |
| --- | --- | --- | --- |
| stopped (alone) | ${p99s[alone]}| $a | 1.00× |
| idle class (\`qosd set priority --class idle\`) | ${p99s[idle]}| $i | $(ratio "$i" "$a")× |
| normal weight | ${p99s[normal]}| $n | $(ratio "$n" "$a")× |

Goal (issue 20): idle class within 1.2× of alone.

MD
