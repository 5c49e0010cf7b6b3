#!/usr/bin/env bash
# `qosd net` (paper 004, issue 26): iperf3 TCP and UDP throughput across a
# veth pair between two network namespaces this script makes
# (qosd-bench-net26-*), with and without qosd's TC programs on the client's
# veth (ingress + egress, 1 ms bins), interleaved (off/on, then on/off, ...):
# median and quartiles of on/off ratios over ROUNDS (default 10) rounds of
# SECS (default 3) s. Also checks the counters against the kernel's: the
# UDP runs' bytes qosd counted on the veth's egress vs the veth's own
# tx_bytes (/proc/net/dev) over the same run, and bytes per packet vs
# iperf3's 1400-byte payload (1442 = + Ethernet 14, IPv4 20, UDP 8).
# BPF cost per packet from the kernel's bpf_stats, in one extra on-run
# per protocol after the rounds: the stats cost two clock reads per
# program run, so they are off during the measured rounds (a sysctl left
# at 1 by another bench is set to 0; the on-run takes them by reference,
# lib/bpf_stats.sh), summed over the programs on this script's veth only
# (by id, not by name: another `qosd net` may run). IPv6 is off on the
# veths so no router solicitation or MLD frame muddles the byte check.
# Needs root, iperf3, bpftool, python3.
set -euo pipefail
trap 'echo "net.sh: failed at line $LINENO" >&2' ERR
cd "$(dirname "$0")/../.."
QOSD=${QOSD:-target/release/qosd}
ROUNDS=${ROUNDS:-10}
# FLOOR=1: also UDP runs with a no-op TC program on the same two hooks (the
# cost of the TC hook itself, which bpf_stats does not see), compiled here.
FLOOR=${FLOOR:-0}
# QOSD_OLD=path: also UDP runs with another qosd binary (e.g. main's before
# a change to the programs) in every round, and its own cost run: a
# before/after pair measured in the same conditions.
QOSD_OLD=${QOSD_OLD:-}
SECS=${SECS:-3}
A=qosd-bench-net26-a B=qosd-bench-net26-b VA=qb26a VB=qb26b
PORT=5226
tmp=$(mktemp -d)
. scenarios/bench/lib/bpf_stats.sh
# The sysctl is off during the rounds (the statistics cost time per run)
# and back at what it was after: another session's setting is its own.
stats_was=$(cat /proc/sys/kernel/bpf_stats_enabled)
cleanup() {
  bpf_stats_off
  echo "$stats_was" >/proc/sys/kernel/bpf_stats_enabled
  ip netns pids "$A" 2>/dev/null | xargs -r kill 2>/dev/null || true
  ip netns pids "$B" 2>/dev/null | xargs -r kill 2>/dev/null || true
  ip netns del "$A" 2>/dev/null || true
  ip netns del "$B" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
cleanup
tmp=$(mktemp -d)
if [ "$FLOOR" = 1 ]; then
  printf '%s\n' '#define SEC(n) __attribute__((section(n), used))' 'struct __sk_buff;' \
    'SEC("tc") int noop(struct __sk_buff *skb) { return 0; }' \
    'char LICENSE[] SEC("license") = "GPL";' >"$tmp/noop.bpf.c"
  clang -O2 -target bpf -c "$tmp/noop.bpf.c" -o "$tmp/noop.o"
fi
echo 0 >/proc/sys/kernel/bpf_stats_enabled
ip netns add "$A"
ip netns add "$B"
ip link add "$VA" netns "$A" type veth peer name "$VB" netns "$B"
ip -n "$A" addr add 10.227.0.1/24 dev "$VA"
ip -n "$B" addr add 10.227.0.2/24 dev "$VB"
ip netns exec "$A" sysctl -qw "net.ipv6.conf.$VA.disable_ipv6=1"
ip netns exec "$B" sysctl -qw "net.ipv6.conf.$VB.disable_ipv6=1"
ip -n "$A" link set "$VA" up
ip -n "$B" link set "$VB" up
ip -n "$A" route get 10.227.0.2 | grep -q "dev $VA" || { echo "route does not lead into $VA" >&2; exit 1; }
# The sender and the receiver each on a CPU of their own (fewer
# migrations, steadier rounds); one CPU: both on it.
CPU_C=0 CPU_S=$(( $(nproc) > 1 ? 1 : 0 ))
load0=$(cut -d' ' -f1-3 /proc/loadavg)
ip netns exec "$B" iperf3 -s -A "$CPU_S" -B 10.227.0.2 -p "$PORT" >"$tmp/iperf3-s.log" 2>&1 &
for _ in $(seq 50); do ip netns exec "$B" ss -ltn | grep -q ":$PORT " && break; sleep 0.1; done
ip netns exec "$B" ss -ltn | grep -q ":$PORT " || { cat "$tmp/iperf3-s.log" >&2; exit 1; }

tx_bytes() { ip netns exec "$A" cat "/sys/class/net/$VA/statistics/tx_bytes"; }

# prog_stats PROTO MODE ROUND: every program's statistics, and the ids of
# the programs on this script's veth: the cost is summed over those ids
# only, since another `qosd net` on this machine loads programs of the
# same names.
prog_stats() {
  bpftool -j prog show >"$tmp/p-$1-$2-$3.json"
  ip netns exec "$A" bpftool -j net show dev "$VA" >"$tmp/n-$1-$2-$3.json"
}

# run PROTO MODE ROUND: one iperf3 run; MODE on starts qosd net first.
run() {
  local proto=$1 mode=$2 r=$3 extra=() qpid=
  [ "$proto" = udp ] && extra=(-u -b 0 -l 1400)
  local before; before=$(tx_bytes)
  if [ "$mode" = noop ]; then
    ip netns exec "$A" tc qdisc add dev "$VA" clsact
    for d in ingress egress; do
      ip netns exec "$A" tc filter add dev "$VA" "$d" bpf da obj "$tmp/noop.o" sec tc
    done
  fi
  if [ "$mode" = on ] || [ "$mode" = old ]; then
    local bin=$QOSD
    [ "$mode" = old ] && bin=$QOSD_OLD
    # A log of its own per run: a shared one could still show the last
    # run's "counting on" before the shell truncates it for this one.
    local log="$tmp/q-$proto-$mode-$r.log" out="$tmp/q-$proto-$r.json"
    [ "$mode" = old ] && out="$tmp/q-$proto-old-$r.json"
    ip netns exec "$A" "$bin" net --iface "$VA" --json --top 5 --state-file "$tmp/state.json" \
      >"$out" 2>"$log" &
    qpid=$!
    for _ in $(seq 50); do grep -qs "counting on" "$log" && break; sleep 0.1; done
    grep -q "counting on" "$log" || { echo "qosd net did not start:" >&2; cat "$log" >&2; exit 1; }
  fi
  ip netns exec "$A" timeout $((SECS + 20)) iperf3 -c 10.227.0.2 -A "$CPU_C" -p "$PORT" -t "$SECS" -J "${extra[@]}" \
    >"$tmp/i-$proto-$mode-$r.json"
  if [ -n "$qpid" ]; then
    sleep 1.1 # the last window completes
    [ "$r" = cost ] && prog_stats "$proto" "$mode" "$r"
    kill -TERM "$qpid"
    wait "$qpid"
  fi
  if [ "$mode" = noop ]; then
    [ "$r" = cost ] && prog_stats "$proto" "$mode" "$r"
    ip netns exec "$A" tc qdisc del dev "$VA" clsact
  fi
  echo $(($(tx_bytes) - before)) >"$tmp/tx-$proto-$mode-$r"
}

for r in $(seq "$ROUNDS"); do
  for proto in tcp udp; do
    if [ $((r % 2)) = 1 ]; then run "$proto" off "$r"; run "$proto" on "$r"; else run "$proto" on "$r"; run "$proto" off "$r"; fi
  done
  # The floor's runs beside the round's UDP pair, before or after it by turns.
  [ "$FLOOR" = 1 ] && run udp noop "$r"
  [ -n "$QOSD_OLD" ] && run udp old "$r"
done
bpf_stats_on
for proto in tcp udp; do run "$proto" on cost; done
[ -n "$QOSD_OLD" ] && run udp old cost
# What bpf_stats reads for a program that does nothing: its own clock
# reads and the call, the part of every figure above that is not ours.
[ "$FLOOR" = 1 ] && run udp noop cost
bpf_stats_off
if ip netns exec "$A" tc filter show dev "$VA" egress | grep -q net_; then
  echo "qosd net left a filter behind" >&2
  exit 1
fi

python3 - "$tmp" "$ROUNDS" "$SECS" "$CPU_C,$CPU_S" "$load0" "$(cut -d' ' -f1-3 /proc/loadavg)" "$FLOOR" "$QOSD_OLD" <<'PY'
import json, statistics, sys
tmp, rounds, secs = sys.argv[1], int(sys.argv[2]), sys.argv[3]
pin, load0, load1 = sys.argv[4].split(","), sys.argv[5], sys.argv[6]
floor = sys.argv[7] == "1"
old = sys.argv[8]

def gbps(proto, mode, r):
    j = json.load(open(f"{tmp}/i-{proto}-{mode}-{r}.json"))
    e = j["end"]
    s = e["sum_received"] if proto == "tcp" else e["sum"]
    return s["bits_per_second"] / 1e9

def q(v):
    v = sorted(v)
    qs = statistics.quantiles(v, n=4, method="inclusive") if len(v) > 1 else [v[0]] * 3
    return qs

print("## Network counters: `qosd net` (`scenarios/bench/net.sh`, issue 26)")
print()
print(f"iperf3 (Debian) across a veth pair between two network namespaces, {secs} s per run, with and")
print("without `qosd net`'s TC programs (ingress + egress of the client's veth, 1 ms bins),")
print(f"interleaved over {rounds} rounds (off/on, then on/off), iperf3's client on CPU {pin[0]} and its server on")
print(f"CPU {pin[1]} (`-A`); the ratio is of the runs of one round. Goal: median ≥ 0.99×. Load average at the")
print(f"start {load0}, at the end {load1} (other work, e.g. builds at nice 19, counts in it).")
print()
print("| traffic | off Gbit/s (median) | on Gbit/s (median) | on/off ratio: median | lower quartile | upper quartile |")
print("| --- | --- | --- | --- | --- | --- |")
each = {}
for proto, label in [("tcp", "TCP"), ("udp", "UDP, 1400-byte payload, -b 0")]:
    off = [gbps(proto, "off", r) for r in range(1, rounds + 1)]
    on = [gbps(proto, "on", r) for r in range(1, rounds + 1)]
    ratio = [b / a for a, b in zip(off, on)]
    lo, med, hi = q(ratio)
    print(f"| {label} | {statistics.median(off):.2f} | {statistics.median(on):.2f} | "
          f"{med:.3f}× | {lo:.3f}× | {hi:.3f}× |")
    each[label] = " ".join(f"{x:.3f}" for x in ratio)
extra = []
if floor:
    extra.append(("noop", "UDP, a no-op TC program on both hooks instead (the hook's floor)"))
if old:
    extra.append(("old", f"UDP, the other binary's programs ({old})"))
for mode, label in extra:
    off = [gbps("udp", "off", r) for r in range(1, rounds + 1)]
    other = [gbps("udp", mode, r) for r in range(1, rounds + 1)]
    ratio = [b / a for a, b in zip(off, other)]
    lo, med, hi = q(ratio)
    print(f"| {label} | {statistics.median(off):.2f} | {statistics.median(other):.2f} | "
          f"{med:.3f}× | {lo:.3f}× | {hi:.3f}× |")
    each[label] = " ".join(f"{x:.3f}" for x in ratio)
if floor:
    # What is left above the hook's floor is the programs' own: per round,
    # (with qosd net) / (with the no-op program).
    r_on = [gbps("udp", "on", r) / gbps("udp", "noop", r) for r in range(1, rounds + 1)]
    lo, med, hi = q(r_on)
    print(f"\nUDP with `qosd net` / with the no-op program, same round: median {med:.3f}× "
          f"[{lo:.3f}, {hi:.3f}] (the programs' own cost above the TC hook's).")
print()
for label, e in each.items():
    print(f"Per round, {label}: {e}.")
print()
# Counter check on the UDP runs with qosd on.
rows = []
for r in range(1, rounds + 1):
    pk = by = 0
    for line in open(f"{tmp}/q-udp-{r}.json"):
        w = json.loads(line)
        for k, f in w["peers"]:
            if k["dir"] == "egress":
                pk += f["packets"]; by += f["bytes"]
    tx = int(open(f"{tmp}/tx-udp-on-{r}").read())
    udp = [(f["bytes"], f["packets"]) for line in open(f"{tmp}/q-udp-{r}.json")
           for k, f in json.loads(line)["peers"] if k["dir"] == "egress" and k["proto"] == 17]
    ub = sum(b for b, _ in udp); up = sum(p for _, p in udp)
    rows.append((by, tx, ub / up if up else 0, max(
        (f["peak_bytes"] * 8 * 1000 / 1e9 for line in open(f"{tmp}/q-udp-{r}.json")
         for k, f in json.loads(line)["peers"] if k["dir"] == "egress" and k["proto"] == 17), default=0)))
exact = sum(1 for by, tx, _, _ in rows if by == tx)
print(f"Counters vs the kernel's: in {exact} of {rounds} UDP runs the egress bytes `qosd net` counted "
      f"equal the veth's tx_bytes over the run exactly"
      + ("" if exact == rounds else " (the others: " + ", ".join(
          f"{by} vs {tx}" for by, tx, _, _ in rows if by != tx) + ")") + ".")
bpp = sorted(set(round(x, 1) for _, _, x, _ in rows))
print(f"UDP bytes per packet counted: {', '.join(str(b) for b in bpp)} (1400-byte payload + 42 bytes of "
      "Ethernet, IPv4 and UDP headers = 1442; paper 004 reports 8.16 Gbit/s for 8 Gbit/s of payload).")
peak = statistics.median(p for *_, p in rows)
print(f"Median of the runs' peak 1 ms bin on UDP egress: {peak:.2f} Gbit/s.")
print()
print(f"BPF cost (bpf_stats, one {secs} s on-run per protocol after the rounds; the stats are off "
      "in the rounds): ", end="")
cost = []
runs = [("tcp", "on"), ("udp", "on")] + ([("udp", "old")] if old else [])
runs += [("udp", "noop")] if floor else []
for proto, mode in runs:
    own = {t["id"] for e in json.load(open(f"{tmp}/n-{proto}-{mode}-cost.json"))
           for t in e.get("tc", [])}
    for name in ["net_ingress", "net_egress"] if mode != "noop" else ["noop"]:
        t = n = 0
        for p in json.load(open(f"{tmp}/p-{proto}-{mode}-cost.json")):
            if p.get("id") in own and p.get("name") == name:
                t += p.get("run_time_ns", 0); n += p.get("run_cnt", 0)
        tag = proto.upper() + {"old": " (other binary)", "noop": " no-op program, both hooks"}.get(mode, "")
        cost.append(f"{tag} {name} {t / n:.0f} ns per run over {n} runs" if n else
                    f"{tag} {name}: no runs")
print("; ".join(cost) + ". A run is one skb: a TCP GSO skb carries many segments.")
PY
