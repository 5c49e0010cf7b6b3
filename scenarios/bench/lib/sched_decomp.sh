# Where a request's time goes on a shared CPU (issue 20), read from /proc
# around one load run: a process's threads' run-queue wait (schedstat
# field 2, run_delay ns), time on CPU (field 1, ns; excludes steal with
# paravirt time accounting) and timeslices (field 3), summed over the
# threads alive at each read; the node's steal and idle ticks from
# /proc/stat. Threads that exit between two reads lose their figures, so
# read inside a window where the process's threads live (the fixture's
# per-connection threads live as long as the client's connections).
# Usage: . scenarios/bench/lib/sched_decomp.sh; a=$(sched_snap PID); ...;
#        b=$(sched_snap PID); sched_delta "$a" "$b" -> "exec_ns delay_ns slices"

# "exec_ns run_delay_ns slices" summed over /proc/PID/task/*/schedstat.
sched_snap() {
  cat /proc/"$1"/task/*/schedstat 2>/dev/null |
    awk '{e += $1; d += $2; s += $3} END {printf "%.0f %.0f %.0f\n", e, d, s}'
}

# "steal idle total nice" ticks (USER_HZ) of the node, from the `cpu` line
# (nice: CPU time of niced tasks, e.g. other sessions' nice-19 builds).
node_ticks() {
  awk '/^cpu / {t = 0; for (i = 2; i <= NF; i++) t += $i; print $9, $5 + $6, t, $3; exit}' /proc/stat
}

# utime + stime ticks of a whole process (exited threads included).
proc_ticks() { awk '{print $14 + $15}' /proc/"$1"/stat 2>/dev/null || echo 0; }

# Field-wise difference of two snapshots of the same shape.
sched_delta() {
  awk -v a="$1" -v b="$2" 'BEGIN {
    n = split(a, x, " "); split(b, y, " ");
    for (i = 1; i <= n; i++) printf "%s%.0f", (i > 1 ? " " : ""), y[i] - x[i];
    print "" }'
}
