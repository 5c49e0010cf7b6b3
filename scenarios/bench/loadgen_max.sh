#!/usr/bin/env bash
# Load generator: the highest open-loop rate `qosd load` holds on one core,
# against memcached and against the gRPC fixture server (each pinned to
# another CPU). "Holds" means: every scheduled request sent (send rate
# within 1 % of offered), no errors, achieved rate within 1 %, and p99 send
# lag under 1 ms. With 2 CPUs the server's core can be the limit, not the
# generator's: the send lag column tells them apart (a generator that falls
# behind shows lag; a server that does shows latency). Prints markdown
# sections on stdout. Usage: scenarios/bench/loadgen_max.sh [QOSD]
set -euo pipefail
cd "$(dirname "$0")/../.."
QOSD=${1:-target/release/qosd}
GRPC_SERVER=${GRPC_SERVER:-target/grpc-fixture/grpc-fixture-server}
command -v memcached >/dev/null || { echo "loadgen_max: memcached not installed (apt-get install memcached)" >&2; exit 1; }
[ -x "$GRPC_SERVER" ] || { echo "loadgen_max: $GRPC_SERVER missing (make fixtures)" >&2; exit 1; }
ncpu=$(nproc)
gen_cpu=0
srv_cpu=$(( ncpu > 1 ? 1 : 0 ))
srv=
trap '[ -n "$srv" ] && { kill $srv 2>/dev/null; wait $srv 2>/dev/null || true; }' EXIT
field() { grep -o "\"$2\":{[^}]*}" <<<"$1" | grep -o "\"$3\":[0-9.e+-]*" | cut -d: -f2; }
top() { grep -o "\"$2\":[0-9.e+-]*" <<<"$1" | head -1 | cut -d: -f2; }
wait_port() { for _ in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/$1) 2>/dev/null && return; sleep 0.1; done; }

# sweep TITLE SETUP RATES -- LOAD-ARGS...: one section.
sweep() {
  local title=$1 setup=$2 rates=$3; shift 4
  local rows="" best=0 rps j send ach lag99 p99 errs ok
  for rps in $rates; do
    j=$(taskset -c "$gen_cpu" "$QOSD" load --target "127.0.0.1:$port" --rps "$rps" \
        --duration 5 --arrival uniform --json "$@")
    send=$(top "$j" send_rps); ach=$(top "$j" achieved_rps)
    lag99=$(field "$j" send_lag_us p99); p99=$(field "$j" latency_us p99)
    errs=$(grep -o '"errors":{[^}]*}' <<<"$j" | grep -o '[0-9]\+' | awk '{s+=$1} END {print s+0}')
    ok=$(awk -v r="$rps" -v s="$send" -v a="$ach" -v l="$lag99" -v e="$errs" \
         'BEGIN { print (s >= 0.99*r && a >= 0.99*r && l < 1000 && e == 0) ? "yes" : "no" }')
    rows+="| $rps | ${send%.*} | ${ach%.*} | ${lag99} | ${p99} | $errs | $ok |"$'\n'
    if [ "$ok" = yes ]; then best=$rps; else break; fi
  done
  cat <<MD
## Load generator: open-loop rate on one core ($title)

Generator pinned to CPU $gen_cpu, $setup, uniform arrivals, 5 s per step.
Machine: $ncpu CPUs, $(uname -r), load average at the end $(cut -d" " -f1-3 /proc/loadavg)
(other work on the machine shows up as send lag and latency). The last row is the first rate not held
(or the end of the sweep).

| offered rps | sent rps | achieved rps | send lag p99 us | latency p99 us | errors | held |
| --- | --- | --- | --- | --- | --- | --- |
${rows}
Highest rate held: **${best} rps**.

MD
}

port=$(( 20000 + RANDOM % 20000 ))
user=(); [ "$(id -u)" = 0 ] && user=(-u root)
taskset -c "$srv_cpu" memcached -l 127.0.0.1 -p "$port" -U 0 -t 1 -m 64 -c 4096 "${user[@]}" &
srv=$!
wait_port "$port"
sweep "\`qosd load\` vs memcached" \
  "memcached (1 thread) to CPU $srv_cpu, keep-alive with 8 pipelined connections, 10 % sets" \
  "10000 20000 40000 60000 80000 100000 130000 160000 200000 250000 300000" \
  -- --protocol memcache --keepalive --connections 8
kill $srv; wait $srv 2>/dev/null || true

port=$(( 20000 + RANDOM % 20000 ))
taskset -c "$srv_cpu" "$GRPC_SERVER" -port "$port" -work-us 0 >/dev/null &
srv=$!
wait_port "$port"
sweep "\`qosd load --protocol grpc\` vs the grpc-go fixture" \
  "the grpc-go fixture server (no work per call) to CPU $srv_cpu, calls multiplexed on 1 HTTP/2 connection" \
  "2000 5000 10000 15000 20000 30000 40000 60000 80000" \
  -- --protocol grpc --keepalive --connections 1
