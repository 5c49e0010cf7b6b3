#!/usr/bin/env bash
# A process's CPU time two ways over the same 1 s intervals: `/proc/PID/stat`
# (utime + stime, two 10 ms clock-tick fields, each truncated) and the
# process's CPU clock (`clock_gettime` on its `clock_getcpuclockid` clock:
# the scheduler's nanoseconds). The process is qosd's fixture burning
# WORK_US of CPU per request under a paced load of RATE requests/s on one
# keep-alive connection (daemon_oa's set-up: 150 x 2 ms = 0.3 CPU); each
# interval's CPU time / requests is D, printed against the fixture's work.
# Usage: scenarios/bench/cpu_clock.sh [SECONDS]   (default 60; QOSD=PATH: a
# built qosd, not rebuilt)
set -euo pipefail
cd "$(dirname "$0")/../.."
. scenarios/bench/lib/quiet.sh
if [ -z "${QOSD:-}" ]; then
  build_quiet -p qosd-manager --bin qosd
  QOSD=$PWD/target/release/qosd
fi
SECS=${1:-60}
RATE=${RATE:-150}
WORK_US=${WORK_US:-2000}

work=$(mktemp -d)
fx=
cleanup() {
  [ -n "$fx" ] && kill "$fx" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

"$QOSD" fixture --work-us "$WORK_US" --exit-after-s $((SECS + 30)) >"$work/fx.out" &
fx=$!
for _ in $(seq 50); do grep -q listening "$work/fx.out" 2>/dev/null && break; sleep 0.1; done
port=$(sed -n 's/.*:\([0-9]*\)$/\1/p' "$work/fx.out" | head -1)

cat >"$work/measure.py" <<'EOF'
import socket, statistics, sys, threading, time
pid, port, rate, secs, work_us = (int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]),
                                  int(sys.argv[4]), float(sys.argv[5]))
TCK = 100.0  # USER_HZ
clock = ((~pid) << 3) | 2  # MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED)

def stat_s():
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / TCK

done = [0]
def load():
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    t0, n = time.monotonic(), 0
    while n < rate * (secs + 2) and time.monotonic() - t0 < secs + 5:
        time.sleep(max(0.0, t0 + n / rate - time.monotonic()))
        s.sendall(b"GET / HTTP/1.1\r\nHost: qosd\r\n\r\n")
        buf = b""
        while b"\r\n\r\n" not in buf:
            buf += s.recv(4096)
        head, body = buf.split(b"\r\n\r\n", 1)
        length = int([l.split(b":")[1] for l in head.split(b"\r\n")
                      if l.lower().startswith(b"content-length")][0])
        while len(body) < length:
            body += s.recv(4096)
        n += 1
        done[0] = n
threading.Thread(target=load, daemon=True).start()
time.sleep(1.0)
prev = (time.clock_gettime(clock), stat_s(), done[0])
rows = []
for i in range(secs):
    time.sleep(1.0)
    cur = (time.clock_gettime(clock), stat_s(), done[0])
    dc, ds, dn = cur[0] - prev[0], cur[1] - prev[1], cur[2] - prev[2]
    prev = cur
    if dn == 0:
        continue
    w = dn * work_us * 1e-6
    rows.append((dc, ds, dn, dc / w, ds / w))
    print(f"{i:3d} clock {dc*1e3:7.2f} ms  stat {ds*1e3:4.0f} ms  diff {(ds-dc)*1e3:+6.2f} ms  "
          f"{dn} req  D/work clock {dc/w:.3f} stat {ds/w:.3f}")
def summ(k, name):
    v = [r[k] for r in rows]
    print(f"{name}: mean {statistics.mean(v):.3f} min {min(v):.3f} max {max(v):.3f} "
          f"sd {statistics.pstdev(v):.3f}")
print(f"{len(rows)} intervals of 1 s, {rate:.0f} req/s x {work_us:.0f} us")
summ(3, "D/work by the CPU clock")
summ(4, "D/work by stat's ticks")
diff = [(r[1] - r[0]) * 1e3 for r in rows]
print(f"stat - clock per interval, ms: mean {statistics.mean(diff):+.2f} "
      f"min {min(diff):+.2f} max {max(diff):+.2f}")
tot_c, tot_s = sum(r[0] for r in rows), sum(r[1] for r in rows)
print(f"over all intervals: clock {tot_c:.3f} s, stat {tot_s:.3f} s "
      f"(stat/clock {tot_s / tot_c:.4f})")
EOF
measured python3 "$work/measure.py" "$fx" "$port" "$RATE" "$SECS" "$WORK_US"
