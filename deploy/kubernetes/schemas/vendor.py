#!/usr/bin/env python3
"""Vendor the few Kubernetes JSON schemas deploy/kubernetes/ needs.

GitHub (kubeconform's default schema source) is not reachable from the
machines this project builds on; the PyPI package `kubernetes-validate`
ships the same schemas, generated from the Kubernetes OpenAPI spec, in a
"local" layout: each kind's file points into one shared _definitions.json.
kubeconform wants one self-contained file per kind, so this script copies
each kind's schema and only the definitions it reaches (transitively) into
its own `$defs`, with every `$ref` rewritten to `#/$defs/NAME`. Descriptions
are dropped to keep the files small; nothing else changes.

Run once per Kubernetes version bump (a developer step, not a build step):

    pip download --no-deps -d /tmp/kv kubernetes-validate
    unzip -q /tmp/kv/kubernetes_validate-*.whl -d /tmp/kv/x
    python3 deploy/kubernetes/schemas/vendor.py \
        /tmp/kv/x/kubernetes_validate/kubernetes-json-schema/v1.32.0-local-strict \
        deploy/kubernetes/schemas/v1.32.0-standalone-strict
"""

import json
import os
import sys

# The kinds the manifests use, named as kubeconform looks them up
# ({{ .ResourceKind }}{{ .KindSuffix }}.json).
KINDS = [
    "daemonset-apps-v1",
    "configmap-v1",
    "service-v1",
    "serviceaccount-v1",
    "namespace-v1",
    "clusterrole-rbac-v1",
    "clusterrolebinding-rbac-v1",
]
# Kind files point into _definitions.json; definitions point at each other.
PREFIXES = ("/api/_definitions.json#/$defs/", "#/$defs/")


def strip(node, reached):
    """Copy of `node` without descriptions, refs made local; collects names."""
    if isinstance(node, dict):
        out = {}
        for k, v in node.items():
            if k == "description":
                continue
            if k == "$ref" and isinstance(v, str):
                p = next((p for p in PREFIXES if v.startswith(p)), None)
                if p is None:
                    raise SystemExit(f"unexpected $ref {v}")
                name = v[len(p):]
                reached.add(name)
                out[k] = "#/$defs/" + name
            else:
                out[k] = strip(v, reached)
        return out
    if isinstance(node, list):
        return [strip(v, reached) for v in node]
    return node


def main(src, dst):
    with open(os.path.join(src, "_definitions.json")) as f:
        defs = json.load(f)["$defs"]
    os.makedirs(dst, exist_ok=True)
    for kind in KINDS:
        with open(os.path.join(src, kind + ".json")) as f:
            schema = json.load(f)
        reached = set()
        out = strip(schema, reached)
        local, todo = {}, list(reached)
        while todo:
            name = todo.pop()
            if name in local:
                continue
            more = set()
            local[name] = strip(defs[name], more)
            todo.extend(more - local.keys())
        out["$defs"] = dict(sorted(local.items()))
        with open(os.path.join(dst, kind + ".json"), "w") as f:
            json.dump(out, f, indent=1, sort_keys=True)
            f.write("\n")
        print(f"{kind}.json: {len(local)} definitions")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    main(sys.argv[1], sys.argv[2])
