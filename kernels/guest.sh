#!/usr/bin/env bash
# Runs inside a kernel-matrix guest (virtme-ng over the host's root, read-only
# with writable overlays) as root: the suites named in $SUITES_FILE, each test
# binary with one thread and a time limit, then the cgroup v2 enforcement
# checks. Writes one line per suite to $OUT/results.tsv:
#   suite <TAB> passed|failed|skipped <TAB> detail
# and each suite's log to $OUT/<suite>.log.
set -u
OUT=$1
SUITES_FILE=$2
SUITE_TIMEOUT=${SUITE_TIMEOUT:-1200}
mkdir -p "$OUT"
: > "$OUT/results.tsv"
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:$PATH
export QOSD_KERNEL_MATRIX=1

[ -d /sys/kernel/tracing/events ] || mount -t tracefs tracefs /sys/kernel/tracing
ulimit -n 65536 2>/dev/null || true
ip link set lo up 2>/dev/null || true

facts() {
  echo "kernel	$(uname -r)"
  echo "cgroup	$(stat -f -c %T /sys/fs/cgroup) controllers: $(cat /sys/fs/cgroup/cgroup.controllers 2>/dev/null)"
  local tp=/sys/kernel/tracing/events/sock
  local have=""
  for t in inet_sock_set_state sk_data_ready sock_recv_length sock_send_length; do
    [ -d "$tp/$t" ] && have="$have $t"
  done
  echo "sock tracepoints	${have:- none}"
}
facts > "$OUT/facts.tsv"

record() { printf '%s\t%s\t%s\n' "$1" "$2" "$3" >> "$OUT/results.tsv"; }

while IFS=$'\t' read -r suite bin filter env; do
  [ -z "$suite" ] && continue
  case "$suite" in \#*) continue ;; esac
  [ "$filter" = - ] && filter=""
  log="$OUT/$suite.log"
  # shellcheck disable=SC2086
  env $env timeout "$SUITE_TIMEOUT" "$bin" --test-threads=1 --show-output $filter > "$log" 2>&1
  rc=$?
  res=$(grep -a '^test result:' "$log" | tail -n 1)
  skips=$(grep -a -o 'SKIP: .*' "$log" | sort -u | paste -sd ';' -)
  if [ $rc = 124 ]; then
    record "$suite" failed "timed out after ${SUITE_TIMEOUT}s"
  elif [ $rc = 0 ]; then
    n=$(echo "$res" | sed -n 's/.* \([0-9]*\) passed.*/\1/p')
    if [ -n "$skips" ]; then record "$suite" passed "$n tests; skipped parts: $skips"
    else record "$suite" passed "$n tests"; fi
  else
    failed=$(grep -a -E '^    [a-z_0-9:]+$' "$log" | tr -d ' ' | paste -sd ',' -)
    record "$suite" failed "${res:-exit $rc}; ${failed}"
  fi
done < "$SUITES_FILE"

# cgroup v2 enforced, measured (only on a unified hierarchy).
if [ "$(stat -f -c %T /sys/fs/cgroup)" = cgroup2fs ]; then
  bash "$(dirname "$0")/v2_enforced.sh" "$OUT" >> "$OUT/results.tsv" 2> "$OUT/v2_enforced.log"
fi
sync
