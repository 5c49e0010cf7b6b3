#!/usr/bin/env bash
# Sim vs real: fits the simulator to this machine (`qosd calibrate --model`),
# replays the scenario on the real servers and on the fitted sim (same
# calibration, so the same offered load and targets), and compares them per
# app. Prints a markdown section on stdout (scenarios/bench.sh appends it
# to BENCHMARKS.md).
# Usage: scenarios/bench/sim_real.sh [SCENARIO] [QOSD]
#   SCENARIO default: scenarios/demo.yaml, then scenarios/share-spike.yaml
#   (two shared-CPU scenarios of different load shapes); env SIM_REAL_DURATION (s, default
#   the scenario's), SIM_REAL_STEP_S (fit's load steps, default 1), SIM_REAL_OUT (where the
#   fit's log, model and calibration and both runs are kept, default
#   target/sim_real/<scenario>-<UTC time>: a mismatch can be examined afterwards).
set -euo pipefail
cd "$(dirname "$0")/../.."
# No scenario given (`make bench`): both shared-CPU scenarios, one section each.
if [[ $# -eq 0 ]]; then
  for sc in scenarios/demo.yaml scenarios/share-spike.yaml; do
    bash scenarios/bench/sim_real.sh "$sc"
  done
  exit 0
fi
SC=$1
QOSD=${2:-target/release/qosd}
STEP=${SIM_REAL_STEP_S:-1}
tmp=${SIM_REAL_OUT:-target/sim_real/$(basename "$SC" .yaml)-$(date -u +%Y%m%dT%H%M%S)}
mkdir -p "$tmp"
echo "sim_real: keeping the fit, the model and both runs in $tmp" >&2
dur=()
[[ -n ${SIM_REAL_DURATION:-} ]] && dur=(--duration "$SIM_REAL_DURATION")
# The knobs the scenario's real replay turns (`resources: [..]`) are the
# knobs of the fitted node.
res=$(sed -n 's/^resources: *\[\(.*\)\] *$/\1/p' "$SC" | tr -d ' ')
resarg=()
[[ -n $res ]] && resarg=(--resources "$res")

t0=$(date +%s)
"$QOSD" calibrate "$SC" --model "$tmp/model.yaml" --step-s "$STEP" "${resarg[@]}" >"$tmp/fit.log" 2>&1 \
  || { cat "$tmp/fit.log" >&2; exit 1; }
t1=$(date +%s)
"$QOSD" replay "$SC" "${dur[@]}" --out "$tmp/real" >"$tmp/real.log" 2>&1 \
  || { cat "$tmp/real.log" >&2; exit 1; }
t2=$(date +%s)
"$QOSD" replay "$SC" --sim --model "$tmp/model.yaml" --calibration "$tmp/real/calibration.json" \
  "${dur[@]}" --out "$tmp/sim" >"$tmp/sim.log" 2>&1 || { cat "$tmp/sim.log" >&2; exit 1; }

python3 - "$tmp/real/timeline.csv" "$tmp/sim/timeline.csv" >"$tmp/table.md" <<'PY'
import csv, statistics, sys
def load(p):
    rows = list(csv.DictReader(open(p)))
    iv = None
    ts = sorted({float(r["t_s"]) for r in rows})
    iv = ts[1] - ts[0] if len(ts) > 1 else 0.5
    by = {}
    for r in rows:
        by.setdefault(r["app"], {})[r["t_s"]] = r
    return by, iv
real, iv = load(sys.argv[1])
sim, _ = load(sys.argv[2])
def num(r, k):
    v = r.get(k, "")
    return float(v) if v not in ("", None) else None
def viol(rows):
    v = [r["violation"] for r in rows.values() if r["violation"] != ""]
    return 100.0 * sum(x == "1" for x in v) / len(v) if v else None
def alloc(rows, k, scale):
    return sum((num(r, k) or 0.0) * scale * iv for r in rows.values())
def pct(a, b):
    return None if a in (None, 0) or b is None else 100.0 * (b - a) / a
def f(x, fmt="{:.1f}"):
    return "-" if x is None else fmt.format(x)
ok = True
print("| app | violations real / sim | Δ pp | p99 per interval, median abs err | core·s real / sim | Δ | quota CPU·s real / sim | Δ | BE ops/s real / sim | Δ |")
print("|---|---|---|---|---|---|---|---|---|---|")
for app in real:
    r, s = real[app], sim.get(app, {})
    vr, vs = viol(r), viol(s)
    dpp = None if vr is None or vs is None else vs - vr
    errs = [abs(num(s[t], "client_p99_ms") - num(r[t], "client_p99_ms")) / num(r[t], "client_p99_ms") * 100
            for t in r if t in s and num(r[t], "client_p99_ms") and num(s[t], "client_p99_ms") is not None]
    p99 = statistics.median(errs) if errs else None
    cr, cs = alloc(r, "cores", 1), alloc(s, "cores", 1)
    qr, qs = alloc(r, "cpu_quota_milli", 1e-3), alloc(s, "cpu_quota_milli", 1e-3)
    be = [statistics.mean([num(x, "be_ops_per_s") for x in d.values() if num(x, "be_ops_per_s") is not None] or [0]) for d in (r, s)]
    has_be = any(num(x, "be_ops_per_s") is not None for x in r.values())
    dc, dq = pct(cr, cs), pct(qr, qs)
    if dpp is not None and abs(dpp) > 5: ok = False
    for d in (dc, dq):
        if d is not None and abs(d) > 10: ok = False
    print(f"| {app} | {f(vr)} % / {f(vs)} % | {f(dpp, '{:+.1f}')} | {f(p99, '{:.0f}')} % | {cr:.0f} / {cs:.0f} | {f(dc, '{:+.0f}')} % "
          f"| {qr:.0f} / {qs:.0f} | {f(dq, '{:+.0f}')} % | {f(be[0] if has_be else None, '{:.0f}')} / {f(be[1] if has_be else None, '{:.0f}')} "
          f"| {f(pct(be[0], be[1]) if has_be else None, '{:+.0f}')} % |")
print()
print("Goal (violations within 5 pp, allocation-seconds within 10 %):", "**met**" if ok else "**not met**")
PY

# The same runs by load band (what `make demo` reports).
"$QOSD" compare "$tmp/real" "$tmp/sim" --out "$tmp/compare" >"$tmp/compare.md" 2>&1 || true
fitline=$(grep -c '' "$tmp/model.yaml" || true)
cat <<MD
## Simulator vs real runs (\`qosd calibrate --model\`, \`qosd replay --sim --model\`)

Scenario \`$SC\`$( [[ ${#dur[@]} -gt 0 ]] && echo ", compressed to ${SIM_REAL_DURATION} s" ). The sim is fitted to this machine by
\`qosd calibrate --model\` ($((t1 - t0)) s: load steps of ${STEP} s at each allocation in the file's \`checks\`;
the batch job's ops per CPU-second), then the scenario is replayed for real ($((t2 - t1)) s, its own
calibration) and on the fitted sim with that same calibration (same offered load, same targets).
Violations are the client-side yardstick (client p99 over the client target, % of intervals);
p99 error is |sim − real| / real per interval, median; allocation-seconds sum each app's cores
and its CPU quota over the run. Machine: $(nproc) CPUs, $(uname -r), load average at the end
$(cut -d" " -f1-3 /proc/loadavg) (other work on this machine lands in the real run's latency, not in the sim's).

$(cat "$tmp/table.md")

By load band (\`qosd compare REAL SIM\`, first run real, second sim):

\`\`\`
$(sed -n '/viol\. ≤80%/,/^(viol/p' "$tmp/compare.md" | sed '$d')
\`\`\`

Kept in \`$tmp\` (fit.log, model.yaml, real/, sim/, compare/).

Fitted model (${fitline} lines):

\`\`\`yaml
$(cat "$tmp/model.yaml")
\`\`\`

What the sim cannot model: interference between apps beyond CPU time (cache, memory-bandwidth
contention, a wake-up's wait behind a running job's slice, and the load generator's own CPU on a
small machine are absent), and the cost of a change (a quota write takes effect at once, with no
cold cache). CFS bandwidth is modelled per period (run, then throttled until the period ends) and
a best-effort job in the idle class only gets what the latency-critical apps leave
(\`node.be_idle\`, \`node.cfs_period_us\`; docs/sharing.md).

MD
