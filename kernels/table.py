#!/usr/bin/env python3
"""Prints the kernel-matrix table (markdown) from the guests' results.

Usage: table.py RESULTS_DIR KERNEL...; each RESULTS_DIR/KERNEL holds
results.tsv (suite, passed|failed|skipped, detail) and facts.tsv.
"""
import os
import sys

root, kernels = sys.argv[1], sys.argv[2:]
results, facts, suites = {}, {}, []
for k in kernels:
    results[k] = {}
    path = os.path.join(root, k, "results.tsv")
    if os.path.exists(path):
        for line in open(path, encoding="utf-8", errors="replace"):
            parts = line.rstrip("\n").split("\t")
            if len(parts) < 2:
                continue
            suite, status, detail = parts[0], parts[1], parts[2] if len(parts) > 2 else ""
            results[k][suite] = (status, detail)
            if suite not in suites:
                suites.append(suite)
    fpath = os.path.join(root, k, "facts.tsv")
    facts[k] = dict(
        l.rstrip("\n").split("\t", 1) for l in open(fpath) if "\t" in l
    ) if os.path.exists(fpath) else {}

print("| suite | " + " | ".join(kernels) + " |")
print("|---|" + "---|" * len(kernels))
for f in ("cgroup", "sock tracepoints"):
    print(f"| _{f}_ | " + " | ".join(facts[k].get(f, "no result (guest did not finish)") for k in kernels) + " |")
notes = []
for s in suites:
    cells = []
    for k in kernels:
        status, detail = results[k].get(s, ("not run", ""))
        cells.append(status)
        if status != "passed" or "skipped" in detail:
            notes.append(f"- {s} on {k}: {status}: {detail}")
    print(f"| {s} | " + " | ".join(cells) + " |")
if notes:
    print()
    print("\n".join(notes))
failed = any(r[0] == "failed" for k in kernels for r in results[k].values())
sys.exit(1 if failed else 0)
