#!/usr/bin/env bash
# `qosd trace` start-up: seconds from its start to its first line (the BPF
# objects loaded, checked by the verifier and attached), for this qosd and
# optionally one built before (QOSD_BEFORE=path), RUNS (default 5)
# interleaved runs each against a memcached. The verifier's share is what
# changes with the BPF code (bpf/count.h). Needs root, memcached, perl.
set -euo pipefail
cd "$(dirname "$0")/../.."
QOSD=${QOSD:-target/release/qosd}
BEFORE=${QOSD_BEFORE:-}
RUNS=${RUNS:-5}
tmp=$(mktemp -d)
port=$(perl -MIO::Socket::INET -e 'print IO::Socket::INET->new(Listen=>1,LocalAddr=>"127.0.0.1:0")->sockport')
memcached -u nobody -l 127.0.0.1 -p "$port" -t 1 & mc=$!
trap 'kill $mc 2>/dev/null || true; rm -rf "$tmp"' EXIT
sleep 0.3

# Seconds until $1's trace printed its first line.
startup() {
  local out=$tmp/out t0 t
  : >"$out"
  t0=$(date +%s.%N)
  "$1" trace --pid "$mc" --interval 1 >"$out" 2>&1 & t=$!
  for _ in $(seq 1 3000); do
    [ -s "$out" ] && break
    sleep 0.01
  done
  local t1; t1=$(date +%s.%N)
  kill -INT "$t" 2>/dev/null || true
  wait "$t" 2>/dev/null || true
  grep -q . "$out" || { echo "trace_startup.sh: $1 printed nothing in 30 s" >&2; return 1; }
  awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f\n", b - a }'
}
med() { printf '%s\n' "$@" | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

a=() b=()
for _ in $(seq 1 "$RUNS"); do
  [ -n "$BEFORE" ] && a+=("$(startup "$BEFORE")")
  b+=("$(startup "$QOSD")")
done
echo "### \`qosd trace\` start-up (\`scenarios/bench/trace_startup.sh\`)"
echo
echo "Seconds from start to the first line, median of $RUNS interleaved runs; $(date -u '+%Y-%m-%d %H:%M UTC')."
echo
echo "| before | this |"
echo "|---|---|"
before=-; [ -n "$BEFORE" ] && before="$(med "${a[@]}") s (${a[*]})"
echo "| $before | $(med "${b[@]}") s (${b[*]}) |"
echo
