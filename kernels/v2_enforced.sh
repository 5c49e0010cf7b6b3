#!/usr/bin/env bash
# cgroup v2 enforced for real (in a matrix guest, unified hierarchy at
# /sys/fs/cgroup): cpuset.cpus pins a spinner, cpu.max caps one within 5 %,
# cpu.idle and cpu.weight change what a competing spinner gets. Prints
# result lines (suite TAB passed|failed TAB detail) on stdout.
set -u
CG=/sys/fs/cgroup
P=$CG/qk-v2
ok() { printf 'v2-%s\tpassed\t%s\n' "$1" "$2"; }
bad() { printf 'v2-%s\tfailed\t%s\n' "$1" "$2"; }

# Delegation as a real node has it: the controllers enabled from the root.
for c in cpuset cpu; do echo "+$c" > "$CG/cgroup.subtree_control"; done
mkdir -p "$P"
for c in cpuset cpu; do echo "+$c" > "$P/cgroup.subtree_control"; done

spin() { # spin GROUP: a busy loop started inside GROUP; prints its pid
  # Its stdout is not the caller's: $(spin ...) would wait for it forever.
  bash -c "echo \$\$ > $1/cgroup.procs; exec sh -c 'while :; do :; done'" > /dev/null 2>&1 &
  echo $!
}
usage() { sed -n 's/^usage_usec //p' "$1/cpu.stat"; }
now_us() { echo $(( $(date +%s%N) / 1000 )); }
# share GROUP SECONDS: CPU the group used over SECONDS of wall time, in CPUs
share() {
  local u0 t0 u1 t1
  u0=$(usage "$1"); t0=$(now_us); sleep "$2"; u1=$(usage "$1"); t1=$(now_us)
  echo "scale=3; ($u1 - $u0) / ($t1 - $t0)" | bc
}

# 1. cpuset.cpus pins the spinner to CPU 1.
mkdir -p "$P/pin"; echo 1 > "$P/pin/cpuset.cpus"
pid=$(spin "$P/pin"); sleep 1
allowed=$(sed -n 's/^Cpus_allowed_list:\t*//p' "/proc/$pid/status")
on=$(awk '{print $39}' "/proc/$pid/stat")
kill "$pid"; wait "$pid" 2>/dev/null
if [ "$allowed" = 1 ] && [ "$on" = 1 ]; then ok cpuset "spinner allowed on CPU $allowed, ran on CPU $on"
else bad cpuset "allowed '$allowed', ran on CPU $on (want 1)"; fi

# 2. cpu.max 30000/100000 caps the spinner at 0.3 CPU (within 5 %).
mkdir -p "$P/cap"; echo "30000 100000" > "$P/cap/cpu.max"
pid=$(spin "$P/cap"); sleep 1
got=$(share "$P/cap" 8)
kill "$pid"; wait "$pid" 2>/dev/null
if echo "$got >= 0.285 && $got <= 0.315" | bc | grep -q 1; then ok cpu.max "0.3 CPU quota: used $got CPU over 8 s"
else bad cpu.max "0.3 CPU quota: used $got CPU over 8 s (want 0.285-0.315)"; fi

# 3. cpu.idle and cpu.weight: two spinners on CPU 0, one group demoted.
compete() { # compete FILE VALUE: the normal group's fraction of the CPU time both used
  mkdir -p "$P/lc" "$P/be"
  echo 0 > "$P/lc/cpuset.cpus"; echo 0 > "$P/be/cpuset.cpus"
  echo "$2" > "$P/be/$1"
  local a b la ba lb bb
  a=$(spin "$P/lc"); b=$(spin "$P/be"); sleep 1
  # A fraction of what both used, not of wall time: under emulation the
  # host takes time from the guest's CPUs (steal), and both lose it alike.
  la=$(usage "$P/lc"); ba=$(usage "$P/be"); sleep 4
  lb=$(usage "$P/lc"); bb=$(usage "$P/be")
  kill "$a" "$b"; wait "$a" "$b" 2>/dev/null
  echo "scale=3; ($lb - $la) / ($lb - $la + $bb - $ba)" | bc
  rmdir "$P/lc" "$P/be"
}
if [ -e "$P/cpu.idle" ]; then
  got=$(compete cpu.idle 1)
  if echo "$got >= 0.9" | bc | grep -q 1; then ok cpu.idle "a normal spinner beside an idle-class one on one CPU got $got of their CPU time"
  else bad cpu.idle "a normal spinner beside an idle-class one got $got of their CPU time (want >= 0.9)"; fi
else
  printf 'v2-cpu.idle\tskipped\tno cpu.idle in this kernel\n'
fi
got=$(compete cpu.weight 1)
if echo "$got >= 0.9" | bc | grep -q 1; then ok cpu.weight "a spinner at weight 100 beside one at weight 1 on one CPU got $got of their CPU time"
else bad cpu.weight "a spinner at weight 100 beside one at weight 1 got $got of their CPU time (want >= 0.9)"; fi

rmdir "$P/pin" "$P/cap" 2>/dev/null; rmdir "$P" 2>/dev/null
