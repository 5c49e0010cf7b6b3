#!/usr/bin/env bash
# `make bench`: runs every scenarios/bench/*.sh (each prints a markdown
# section on stdout) and writes BENCHMARKS.md with the machine's description.
# These machines are noisy: each section interleaves its A/B runs and reports
# medians and ratios.
set -euo pipefail
cd "$(dirname "$0")/.."
out=BENCHMARKS.md
tmp=$(mktemp)
{
  echo "# qosd benchmarks"
  echo
  echo "Written by \`make bench\` ($(date -u +%Y-%m-%dT%H:%MZ)); every figure below was measured by the"
  echo "script named in its section, on this machine:"
  echo
  echo "- CPU: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) CPUs; memory: $(free -h | awk '/^Mem:/{print $2}')"
  echo "- kernel: $(uname -r); $(. /etc/os-release && echo "$PRETTY_NAME"); $(rustc --version)"
  echo
} >"$tmp"
for s in scenarios/bench/*.sh; do
  echo ">> $s" >&2
  if ! bash "$s" >>"$tmp"; then
    echo "## $(basename "$s" .sh): FAILED (see the make bench log)" >>"$tmp"
  fi
  echo >>"$tmp"
done
mv "$tmp" "$out"
echo "wrote $out" >&2
