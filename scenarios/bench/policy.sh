#!/usr/bin/env bash
# Policy decision cost: prints a markdown section on stdout (bench.sh appends
# it to BENCHMARKS.md). Pure CPU work on synthetic snapshots, no root needed.
set -euo pipefail
cd "$(dirname "$0")/../.."
CARGO=${CARGO:-cargo}
echo "## Policy decision cost"
echo
echo "One decision = 4 monitoring samples (\`observe\`) + \`decide\`, on synthetic"
echo "snapshots whose latencies swing around the target so the policy keeps acting;"
echo "3/4 of the apps latency-critical. $(nproc) CPUs, $(uname -r), $(date -u +%F)."
echo
"$CARGO" run --quiet --release -p qosd-manager --example policy_decide -- "${1:-100000}"
echo
