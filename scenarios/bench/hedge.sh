#!/usr/bin/env bash
# Kernel-level hedged UDP requests (paper 003, issue 27): the deterministic-
# chaos evaluation in network namespaces it makes (qh27-ev-*): baseline,
# application-level hedging and kernel hedging over the same 10 000 ids,
# then an unrelated UDP flow with the hedger off and on, interleaved.
# Needs root. HEDGE_REQUESTS / HEDGE_ROUNDS (default 20) shrink it.
# BENCH_LOCK=FILE: the evaluation (not the build before it) holds that lock.
set -euo pipefail
cd "$(dirname "$0")/../.."
. scenarios/bench/lib/quiet.sh
build_quiet -p qosd-hedge --bin qosd-hedge-eval
out=target/bench/hedge
mkdir -p "$out"
load0=$(cut -d' ' -f1-3 /proc/loadavg)
measured target/release/qosd-hedge-eval --requests "${HEDGE_REQUESTS:-10000}" \
  --flow-rounds "${HEDGE_ROUNDS:-20}" --out "$out" >/dev/null 2>"$out.log" ||
  { cat "$out.log" >&2; exit 1; }
cp "$out/hedge-cdf.png" docs/hedge-cdf.png
echo "## Kernel-level hedged requests (\`scenarios/bench/hedge.sh\`)"
echo
echo "Paper 003's Table 4.2 on this machine: a chaos server (2 % of ids slow by 400 ms,"
echo "seeded), a healthy replica, T_hedge 10 ms, budget 5 %, 4 client streams, each"
echo "contender over the same ids. The unrelated flow: 8 ping-pong streams on one CPU, its server on"
echo "the other, ${HEDGE_ROUNDS:-20} interleaved rounds of 100 000 requests. Load average at the start $load0,"
echo "at the end $(cut -d' ' -f1-3 /proc/loadavg) (other work, e.g. builds at nice 19, counts in it)."
echo
cat "$out/hedge.md"
echo
echo "CDF: docs/hedge-cdf.png (raw: $out/hedge.json)."
