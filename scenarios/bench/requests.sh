#!/usr/bin/env bash
# Request counting in the kernel (bpf/count.h, bpf/agg.h): BPF run time per
# request served on memcached, redis and nginx, plain (one request per
# turn) and pipelined (16 per write); nginx's rows price the reply parse
# too (bpf/replies.h), for this qosd and optionally one built before
# (QOSD_BEFORE=path, or a wrapper that sets QOSD_AGGREGATE). From the
# tracer's programs' run_time_ns (kernel.bpf_stats_enabled) over one load:
#   all     every run of the programs, divided by the requests the server
#           counted (the figure printed before the server side was split);
#   server  the server's share: all, less the runs the load generator's own
#           sockets caused (on loopback the client's socket events run the
#           same programs, which leave at the port test). The client counts
#           its runs itself (its writes, its reads and the data segments its
#           sockets received, TCP_INFO), and each costs what a run that
#           leaves at the port test costs: measured per program and per
#           qosd under the same load sent to an untraced server ("floor");
#   >=      a lower bound of server: every run at the floor but those of the
#           server that can do work (one per data segment each way), so
#           other processes' socket events on this node are left out too.
# The median of RUNS (default 3) interleaved runs; ROWS (default
# "mc:1 mc:16 rd:1 rd:16"; ht:1 and ht:16 add nginx) picks the rows. Needs
# root, bpftool, memcached, redis-server, nginx, curl, perl, python3.
set -euo pipefail
cd "$(dirname "$0")/../.."
QOSD=${QOSD:-target/release/qosd}
BEFORE=${QOSD_BEFORE:-}
RUNS=${RUNS:-3}
N=${N:-40000}
ROWS=${ROWS:-mc:1 mc:16 rd:1 rd:16}
tmp=$(mktemp -d)
pids=()
. scenarios/bench/lib/bpf_stats.sh
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  bpf_stats_off
  rm -rf "$tmp"
}
trap cleanup EXIT
bpf_stats_on

free_port() { perl -MIO::Socket::INET -e 'print IO::Socket::INET->new(Listen=>1,LocalAddr=>"127.0.0.1:0")->sockport'; }
mc_port=$(free_port)
memcached -u nobody -l 127.0.0.1 -p "$mc_port" -t 2 -c 4096 & pids+=($!); mc=$!
# The floor's server: the same load, sent where no tracer looks.
mc0_port=$(free_port)
memcached -u nobody -l 127.0.0.1 -p "$mc0_port" -t 2 -c 4096 & pids+=($!)
rd_port=$(free_port)
redis-server --bind 127.0.0.1 --port "$rd_port" --save '' --appendonly no >/dev/null & pids+=($!); rd=$!
ht_port=$(free_port)
cat >"$tmp/nginx.conf" <<NGX
daemon off; master_process off; worker_processes 1;
error_log $tmp/nginx.err; pid $tmp/nginx.pid;
events { worker_connections 1024; }
http { access_log off; keepalive_requests 1000000;
  client_body_temp_path $tmp; proxy_temp_path $tmp; fastcgi_temp_path $tmp;
  uwsgi_temp_path $tmp; scgi_temp_path $tmp;
  server { listen 127.0.0.1:$ht_port;
    location / { return 200 "hello from nginx\n"; }
    location = /status { stub_status; } } }
NGX
nginx -c "$tmp/nginx.conf" -p "$tmp" </dev/null & pids+=($!); ht=$!
sleep 0.5

# memcached commands served (cmd_get + cmd_set) and redis commands processed.
mc_served() {
  perl -MIO::Socket::INET -e '$s=IO::Socket::INET->new("127.0.0.1:'"$mc_port"'") or die;
    print $s "stats\r\n"; $n=0; while(<$s>){ last if /^END/; $n+=$1 if /^STAT cmd_(?:get|set) (\d+)/ } print "$n\n"'
}
# nginx's requests (its status page counts itself: one, like the others).
ht_served() { curl -s "http://127.0.0.1:$ht_port/status" | awk 'NR == 3 { print $3 }'; }
rd_served() { redis-cli -p "$rd_port" info stats | awk -F: '/^total_commands_processed/ { print $2 + 0 }'; }

# The load: 4 connections to port $1, $2 gets in all, $3 per write, $4 mc
# or rd (a GET of a missing key: one line back each) or ht (an HTTP GET:
# a reply counted by its status line, kept whole across reads). Prints the client's
# own socket events: writes, reads, data segments received and sent.
load() {
  perl -MIO::Socket::INET -e '
    my ($port, $n, $depth, $proto) = @ARGV; my @kids;
    pipe(my $rd, my $wr) or die;
    my $req = $proto eq "mc" ? "get qosd-bench\r\n" : $proto eq "ht" ? "GET / HTTP/1.1\r\nHost: qosd\r\n\r\n" : "*2\r\n\$3\r\nGET\r\n\$10\r\nqosd-bench\r\n";
    for my $c (1..4) { my $pid = fork; if (!$pid) {
      my $s = IO::Socket::INET->new("127.0.0.1:$port") or die;
      my ($w, $r) = (0, 0); my $batch = $req x $depth;
      for (1 .. $n / 4 / $depth) {
        syswrite($s, $batch) == length $batch or die; $w++;
        my ($got, $buf, $acc) = (0, "", "");
        while ($got < $depth) { sysread($s, $buf, 65536) or die; $r++;
          if ($proto eq "ht") { $acc .= $buf; $got++ while $acc =~ s/^.*?HTTP\/1\.1 200//s }
          else { $got += ($buf =~ tr/\n//) } }
      }
      # TCP_INFO: tcpi_data_segs_in, tcpi_data_segs_out.
      my ($in, $out) = unpack("L L", substr(getsockopt($s, 6, 11), 152, 8));
      syswrite($wr, "$w $r $in $out\n"); exit 0 } push @kids, $pid }
    close $wr; waitpid($_, 0) for @kids;
    my @t = (0) x 4; while (<$rd>) { my @v = split; $t[$_] += $v[$_] for 0..3 } print "@t\n"' "$@"
}

# One load under a tracer: $1 qosd, $2 traced server pid, $3 served fn
# (counts the traced server's requests), rest: load's (port, requests,
# depth, proto). Writes the program snapshots before/after, the requests served and
# the client's counts to $out.{p0,p1,served,client}; prints $out.
traced_load() {
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
  echo "$ids" >"$out.ids"
  local s0; bpftool -j prog show >"$out.p0"; s0=$($served)
  load "$@" >"$out.client"
  bpftool -j prog show >"$out.p1"; echo "$s0 $($served)" >"$out.served"
  kill -INT "$t"; wait "$t" || true
  echo "$out"
}

# The arithmetic (python): `floor OUT` prints {program: ns per run} of a
# load sent to an untraced server; `split OUT FLOOR` prints "all server
# low" ns per request served (and with PER_PROG=1 each program's share on
# stderr).
calc() {
  python3 - "$@" <<'PY'
import json, sys
def runs(out):
    ids = {int(i) for i in open(out + '.ids').read().strip().split(',')}
    p0 = {p['id']: p for p in json.load(open(out + '.p0'))}
    d = {}
    for p in json.load(open(out + '.p1')):
        if p['id'] in ids:
            q = p0.get(p['id'], {})
            d[p.get('name', str(p['id']))] = (p.get('run_time_ns', 0) - q.get('run_time_ns', 0),
                                              p.get('run_cnt', 0) - q.get('run_cnt', 0))
    return d
if sys.argv[1] == 'floor':
    print(json.dumps({k: ns / n for k, (ns, n) in runs(sys.argv[2]).items() if n}))
    sys.exit()
out, floor = sys.argv[2], json.loads(open(sys.argv[3]).read())
s0, s1 = map(int, open(out + '.served').read().split())
served = s1 - s0 - 1  # the stats query itself
w, r, segs_in, segs_out = map(int, open(out + '.client').read().split())
client = {'qosd_send': w, 'qosd_recv': r, 'qosd_data_ready': segs_in}
# The server's runs that can do work: a data_ready per data segment the
# client sent, a read per segment at least, a send per segment it got.
# Every other run (the client's, other processes' sockets on this node,
# the server's reads that found nothing) leaves at the first tests.
working = {'qosd_data_ready': segs_out, 'qosd_recv': segs_out, 'qosd_send': segs_in,
           'qosd_fork': 0, 'qosd_exit': 0, 'qosd_set_state': 0}
total = server = low = 0
rows = []
for name, (ns, n) in runs(out).items():
    f = floor.get(name, 0)
    c = min(client.get(name, 0), n)
    srv = ns - c * f
    lo = ns - max(0, n - working.get(name, n)) * f
    total += ns
    server += srv
    low += lo
    if n:
        rows.append(f"{name} {n / served:.2f} runs ({c / served:.2f} client) {ns / served:.0f} ns, server {srv / served:.0f} (>= {lo / served:.0f})")
if len(sys.argv) > 4:
    print('  per request: ' + '; '.join(rows), file=sys.stderr)
    print('  floor ns/run: ' + ', '.join(f"{k} {v:.0f}" for k, v in floor.items() if k in client), file=sys.stderr)
print(f"{total / served:.0f} {server / served:.0f} {low / served:.0f}")
PY
}

# "all server low" ns per request: $1 qosd, $2 floor file, rest: traced_load's.
bpf_per_request() {
  local q=$1 floor=$2; shift 2
  local out; out=$(traced_load "$q" "$@") || return 1
  calc split "$out" "$floor" ${PER_PROG:+per_prog}
}

# The floor of $1: its programs' ns per run under a load that only meets
# the port test (sent to an untraced memcached while it traces another).
floor_of() {
  local out; out=$(traced_load "$1" "$mc" mc_served "$mc0_port" "$N" 1 mc) || return 1
  calc floor "$out" >"$2"
}

med() { printf '%s\n' "$@" | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
# Column $1 of each "all server low" triple in the rest.
col() { local i=$1; shift; for p in "$@"; do echo "$p" | cut -d' ' -f"$i"; done; }
cell() { local a sv lo; a=$(col 1 "$@"); sv=$(col 2 "$@"); lo=$(col 3 "$@")
  echo "$(med $sv) ns ($(echo $sv)), >= $(med $lo); all $(med $a)"; }

echo "### Request counting in the kernel: BPF ns per request served"
echo
echo "Median of $RUNS interleaved runs of $N requests, 4 connections, kernel.bpf_stats_enabled;"
echo "server side: all the tracer's programs' runs less those the client's sockets caused, each at"
echo "the floor (a run that leaves at the port test, measured per qosd); \">=\": less every run but"
echo "the server's that can do work (other sockets' events on this node too); $(date -u '+%Y-%m-%d %H:%M UTC')."
echo
fa=$tmp/floor.before fb=$tmp/floor.after
[ -n "$BEFORE" ] && floor_of "$BEFORE" "$fa"
floor_of "$QOSD" "$fb"
for f in ${BEFORE:+"$fa"} "$fb"; do echo "floor ns/run ($f): $(cat "$f")" >&2; done
echo "| server, load | before: server side (runs); all | this: server side (runs); all |"
echo "|---|---|---|"
for row in "memcached get:mc:1" "memcached get, 16 per write:mc:16" "redis GET:rd:1" "redis GET, 16 per write:rd:16" "nginx GET:ht:1" "nginx GET, 16 per write:ht:16"; do
  IFS=: read -r name kind depth <<<"$row"
  [[ " $ROWS " == *" $kind:$depth "* ]] || continue
  case $kind in
    mc) srv=$mc served=mc_served port=$mc_port ;;
    rd) srv=$rd served=rd_served port=$rd_port ;;
    *) srv=$ht served=ht_served port=$ht_port ;;
  esac
  a=() b=()
  for _ in $(seq 1 "$RUNS"); do
    [ -n "$BEFORE" ] && a+=("$(bpf_per_request "$BEFORE" "$fa" "$srv" "$served" "$port" "$N" "$depth" "$kind")")
    b+=("$(bpf_per_request "$QOSD" "$fb" "$srv" "$served" "$port" "$N" "$depth" "$kind")")
  done
  before=-; [ -n "$BEFORE" ] && before=$(cell "${a[@]}")
  echo "| $name | $before | $(cell "${b[@]}") |"
done
echo
