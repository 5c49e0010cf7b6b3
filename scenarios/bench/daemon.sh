#!/usr/bin/env bash
# `qosd run` overhead: CPU time and memory of the daemon itself while it
# monitors 4 memcached instances (eBPF-traced) every 100 ms and decides every
# 500 ms, with /metrics scraped every second as Prometheus would. CPU from
# /proc/PID/stat (utime + stime, all threads) over a fixed span; RSS from
# /proc/PID/status. Three runs; prints a markdown section on stdout.
set -euo pipefail
cd "$(dirname "$0")/../.."
. scenarios/bench/lib/quiet.sh
build_quiet -p qosd-manager --bin qosd
QOSD=$PWD/target/release/qosd
RUNS=${RUNS:-3}
SPAN_S=${SPAN_S:-20}
WARMUP_S=3
RATE=${RATE:-200} # requests per second per instance

work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# A paced client: every 1/RATE s one `get` on each instance, for DUR s.
cat >"$work/load.py" <<'EOF'
import socket, sys, time
rate, dur, ports = float(sys.argv[1]), float(sys.argv[2]), [int(p) for p in sys.argv[3:]]
socks = []
for p in ports:
    s = socket.create_connection(("127.0.0.1", p)); s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    socks.append(s)
t0 = time.monotonic(); n = 0
while time.monotonic() - t0 < dur and n < rate * dur * 2:
    for s in socks:
        s.sendall(b"get bench\r\n")
        buf = b""
        while not buf.endswith(b"END\r\n"):
            b = s.recv(4096)
            if not b:
                sys.exit(0)  # the server is gone
            buf += b
    n += 1
    nxt = t0 + n / rate
    d = nxt - time.monotonic()
    if d > 0: time.sleep(d)
EOF

mb() { awk -v k="$1" 'BEGIN { printf "%.1f", k / 1024 }'; }
ticks() { awk '{ split($0, a, ") "); split(a[2], f, " "); print f[12] + f[13] }' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)

results=()
for run in $(seq 1 "$RUNS"); do
  ports=()
  mc=()
  for i in 1 2 3 4; do
    p=$(free_port)
    memcached -u nobody -l 127.0.0.1 -p "$p" -t 2 -U 0 &
    mc+=($!)
    pids+=($!)
    ports+=("$p")
  done
  for p in "${ports[@]}"; do
    for _ in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/"$p") 2>/dev/null && break; sleep 0.1; done
  done
  api=$(free_port)
  {
    echo "apps:"
    for i in 0 1 2 3; do
      echo "  - name: mc$i"
      echo "    match: { pid: ${mc[$i]} }"
      echo "    class: lc"
      echo "    target: { p99: 5ms }"
      echo "    resources: { initial: { nr_cores: 1 } }"
    done
    echo "policy: $PWD/policies/parties.yaml"
    echo "api: { listen: 127.0.0.1:$api }"
    echo "state_file: $work/state.json"
  } >"$work/config.yaml"
  "$QOSD" run --config "$work/config.yaml" >"$work/run$run.log" 2>&1 &
  q=$!
  pids+=($q)
  up=0
  for _ in $(seq 300); do curl -sf "127.0.0.1:$api/v1/status" >/dev/null && { up=1; break; }; sleep 0.1; done
  [ "$up" = 1 ] || { echo "qosd run did not answer in 30 s; log:" >&2; cat "$work/run$run.log" >&2; exit 1; }
  python3 "$work/load.py" "$RATE" $((SPAN_S + WARMUP_S + 2)) "${ports[@]}" &
  lp=$!
  pids+=($lp)
  sleep "$WARMUP_S"
  c0=$(ticks "$q")
  t0=$(date +%s.%N)
  for _ in $(seq "$SPAN_S"); do
    curl -sf "127.0.0.1:$api/metrics" >/dev/null
    sleep 1
  done
  c1=$(ticks "$q")
  t1=$(date +%s.%N)
  rss=$(awk '/^VmRSS:/{print $2}' "/proc/$q/status")
  hwm=$(awk '/^VmHWM:/{print $2}' "/proc/$q/status")
  status=$(curl -sf "127.0.0.1:$api/v1/status")
  reqs=$(curl -sf "127.0.0.1:$api/v1/apps" | python3 -c 'import json,sys; print(sum(a["requests_total"] for a in json.load(sys.stdin)))')
  managed=$(curl -sf "127.0.0.1:$api/v1/apps" | python3 -c 'import json,sys; print(sum(1 for a in json.load(sys.stdin) if a["managed"]))')
  if [ "$reqs" = 0 ]; then
    echo "run $run: no request traced; qosd log:" >&2
    cat "$work/run$run.log" >&2
    exit 1
  fi
  kill -TERM "$q"
  wait "$q" || { echo "qosd run failed; log:" >&2; cat "$work/run$run.log" >&2; exit 1; }
  kill "$lp" 2>/dev/null || true
  for p in "${mc[@]}"; do kill "$p" 2>/dev/null || true; done
  wait "$lp" "${mc[@]}" 2>/dev/null || true
  read -r cpu_pct ticks_m ticks_d missed <<<"$(python3 -c "
import json,sys
s=json.loads(sys.argv[1]); t=s['ticks']
print('%.2f' % (100.0*($c1-$c0)/$hz/($t1-$t0)), t['monitor'], t['decide'], t['missed'])" "$status")"
  results+=("$cpu_pct $rss $hwm $ticks_m $ticks_d $missed $reqs $managed")
done

echo "## Daemon overhead (\`scenarios/bench/daemon.sh\`)"
echo
echo "\`qosd run\` (release build) with 4 memcached instances (\`-t 2\`), each traced by eBPF and"
echo "loaded with $RATE requests/s, monitoring every 100 ms and deciding every 500 ms (PARTIES,"
echo "cores knob live: 2 of the 4 apps fit on this machine's 2 cores and are managed, the"
echo "others monitored), \`/metrics\` fetched every second. CPU = utime + stime of all qosd"
echo "threads over ${SPAN_S} s after a ${WARMUP_S} s warm-up."
echo
echo "| run | CPU (% of one core) | RSS (MB) | peak RSS (MB) | monitor / decide ticks | missed ticks | requests traced | apps managed |"
echo "|---|---|---|---|---|---|---|---|"
i=0
cpus=()
rsss=()
for r in "${results[@]}"; do
  i=$((i + 1))
  read -r cpu rss hwm tm td missed reqs managed <<<"$r"
  cpus+=("$cpu")
  rsss+=("$hwm")
  printf '| %d | %s | %s | %s | %s / %s | %s | %s | %s |\n' "$i" "$cpu" "$(mb "$rss")" "$(mb "$hwm")" "$tm" "$td" "$missed" "$reqs" "$managed"
done
med_cpu=$(printf '%s\n' "${cpus[@]}" | sort -g | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}')
max_rss=$(printf '%s\n' "${rsss[@]}" | sort -g | tail -1)
echo
printf 'Median CPU %s %% of one core (goal <= 1 %%; PARTIES'"'"' own runtime used 15 %%); peak RSS %s MB (goal <= 30 MB).\n' "$med_cpu" "$(mb "$max_rss")"
