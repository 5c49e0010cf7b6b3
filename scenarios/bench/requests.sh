#!/usr/bin/env bash
# Request counting in the kernel (bpf/count.h): BPF run time per request
# served, with and without it, on memcached and redis, plain (one request
# per turn) and pipelined (16 per write). "Without" is a qosd built before
# it (QOSD_BEFORE=path; skipped when unset). Each figure is the sum of the
# tracer's programs' run_time_ns (kernel.bpf_stats_enabled) over one load,
# divided by the requests the server itself counted; the median of RUNS
# (default 3) interleaved before/after runs; ROWS (default
# "mc:1 mc:16 rd:1 rd:16") picks the rows. Needs root, bpftool,
# memcached, redis-server, redis-benchmark, perl.
set -euo pipefail
cd "$(dirname "$0")/../.."
QOSD=${QOSD:-target/release/qosd}
BEFORE=${QOSD_BEFORE:-}
RUNS=${RUNS:-3}
N=${N:-40000}
ROWS=${ROWS:-mc:1 mc:16 rd:1 rd:16}
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  [ -n "${knob:-}" ] && echo "$knob" >/proc/sys/kernel/bpf_stats_enabled
  rm -rf "$tmp"
}
trap cleanup EXIT
knob=$(cat /proc/sys/kernel/bpf_stats_enabled)
echo 1 >/proc/sys/kernel/bpf_stats_enabled

free_port() { perl -MIO::Socket::INET -e 'print IO::Socket::INET->new(Listen=>1,LocalAddr=>"127.0.0.1:0")->sockport'; }
mc_port=$(free_port)
memcached -u nobody -l 127.0.0.1 -p "$mc_port" -t 2 -c 4096 & pids+=($!); mc=$!
rd_port=$(free_port)
redis-server --bind 127.0.0.1 --port "$rd_port" --save '' --appendonly no >/dev/null & pids+=($!); rd=$!
sleep 0.5

# memcached commands served (cmd_get + cmd_set) and redis commands processed.
mc_served() {
  perl -MIO::Socket::INET -e '$s=IO::Socket::INET->new("127.0.0.1:'"$mc_port"'") or die;
    print $s "stats\r\n"; $n=0; while(<$s>){ last if /^END/; $n+=$1 if /^STAT cmd_(?:get|set) (\d+)/ } print "$n\n"'
}
rd_served() { redis-cli -p "$rd_port" info stats | awk -F: '/^total_commands_processed/ { print $2 + 0 }'; }

# memcached load: 4 connections, N/4 gets each, DEPTH per write.
mc_load() {
  perl -MIO::Socket::INET -e '
    my ($port, $n, $depth) = @ARGV; my @kids;
    for my $c (1..4) { my $pid = fork; if (!$pid) {
      my $s = IO::Socket::INET->new("127.0.0.1:$port") or die; $s->autoflush(1);
      my $batch = "get qosd-bench\r\n" x $depth;
      for (1 .. $n / 4 / $depth) { print $s $batch; for (1..$depth) { my $l = <$s>; } }
      exit 0 } push @kids, $pid }
    waitpid($_, 0) for @kids' "$mc_port" "$N" "$1"
}
rd_load() { redis-benchmark -h 127.0.0.1 -p "$rd_port" -c 4 -n "$N" -P "$1" -t get -q >/dev/null; }

# ns of BPF per request served: $1 qosd, $2 server pid, $3 served fn, rest: load.
bpf_per_request() {
  local q=$1 srv=$2 served=$3; shift 3
  # A fresh file per run: the background job truncates its output only
  # once it runs, so waiting on a reused file could see the last run's
  # lines and read the programs before this tracer had loaded any (the
  # runs printed as 0).
  local out; out=$(mktemp -p "$tmp" trace.XXXXXX)
  "$q" trace --pid "$srv" --json --interval 1 >"$out" 2>/dev/null & local t=$!
  local ids=
  for _ in $(seq 1 300); do
    if [ "$(wc -l <"$out")" -ge 2 ]; then
      ids=$(grep -sh '^prog_id:' /proc/$t/fdinfo/* | awk '{ print $2 }' | sort -u | paste -sd, - || true)
      [ -n "$ids" ] && break
    fi
    sleep 0.1
  done
  if [ -z "$ids" ]; then
    echo "requests.sh: $q trace (pid $t) showed no BPF programs within 30 s" >&2
    kill -INT "$t" 2>/dev/null || true
    return 1
  fi
  local sum="import json,sys; ids={$ids}; print(sum(p.get('run_time_ns',0) for p in json.load(sys.stdin) if p['id'] in ids))"
  local ns0 s0; bpftool -j prog show >"$out.p0"; ns0=$(python3 -c "$sum" <"$out.p0"); s0=$($served)
  "$@"
  local ns1 s1; bpftool -j prog show >"$out.p1"; ns1=$(python3 -c "$sum" <"$out.p1"); s1=$($served)
  kill -INT "$t"; wait "$t" || true
  [ -n "${PER_PROG:-}" ] && per_prog "$out.p0" "$out.p1" "$ids" $((s1 - s0 - 1)) >&2
  awk -v a="$ns0" -v b="$ns1" -v r0="$s0" -v r1="$s1" 'BEGIN { printf "%.0f\n", (b - a) / (r1 - r0 - 1) }'
}
# PER_PROG=1: each program's runs and ns per request served, on stderr.
per_prog() {
  python3 - "$@" <<'PY'
import json, sys
a, b, ids, served = sys.argv[1], sys.argv[2], {int(i) for i in sys.argv[3].split(',')}, int(sys.argv[4])
p0 = {p['id']: p for p in json.load(open(a))}
rows = []
for p in json.load(open(b)):
    if p['id'] not in ids:
        continue
    q = p0.get(p['id'], {})
    ns = p.get('run_time_ns', 0) - q.get('run_time_ns', 0)
    n = p.get('run_cnt', 0) - q.get('run_cnt', 0)
    if n:
        rows.append(f"{p.get('name', p['id'])} {n / served:.2f} runs {ns / served:.0f} ns ({ns / n:.0f}/run)")
print('  per request: ' + '; '.join(rows))
PY
}
med() { printf '%s\n' "$@" | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

echo "### Request counting in the kernel: BPF ns per request served"
echo
echo "Median of $RUNS interleaved runs of $N requests, 4 connections; all the tracer's programs"
echo "(server and client socket events), kernel.bpf_stats_enabled; $(date -u '+%Y-%m-%d %H:%M UTC')."
echo
echo "| server, load | without counting | with counting |"
echo "|---|---|---|"
for row in "memcached get:mc:1" "memcached get, 16 per write:mc:16" "redis GET (redis-benchmark -P 1):rd:1" "redis GET (redis-benchmark -P 16):rd:16"; do
  IFS=: read -r name kind depth <<<"$row"
  [[ " $ROWS " == *" $kind:$depth "* ]] || continue
  if [ "$kind" = mc ]; then srv=$mc served=mc_served load=mc_load; else srv=$rd served=rd_served load=rd_load; fi
  a=() b=()
  for _ in $(seq 1 "$RUNS"); do
    [ -n "$BEFORE" ] && a+=("$(bpf_per_request "$BEFORE" "$srv" "$served" "$load" "$depth")")
    b+=("$(bpf_per_request "$QOSD" "$srv" "$served" "$load" "$depth")")
  done
  before=-; [ -n "$BEFORE" ] && before="$(med "${a[@]}") ns (${a[*]})"
  echo "| $name | $before | $(med "${b[@]}") ns (${b[*]}) |"
done
echo
