#!/usr/bin/env bash
# Builds kube-apiserver from the Go module proxy into $OUT (default
# target/tools/kube-apiserver) for the Kubernetes tests: Debian ships etcd and
# kubectl but no API server.
#
# Why the replace list: k8s.io/kubernetes's go.mod replaces every k8s.io/*
# staging module with ./staging/src/..., and those folders are separate
# modules, so they are not inside the k8s.io/kubernetes module zip. A small
# wrapper module requires k8s.io/kubernetes and replaces each staging module
# with its published twin (v0.MINOR.PATCH for v1.MINOR.PATCH).
set -euo pipefail
VERSION=${KUBE_VERSION:-v1.32.4}
OUT=${1:-target/tools/kube-apiserver}
GO=${GO:-$(command -v go || echo /usr/local/go/bin/go)}
OUT=$(realpath -m "$OUT")
WORK="$(dirname "$OUT")/kube-apiserver-src"
mkdir -p "$WORK"
cd "$WORK"
# Its own module and build caches, removed when done: Kubernetes' modules and
# objects take ~3 GB that nothing else reuses, and CI's disk is small (a fresh
# `make test` once ran out of space).
CACHE="$(dirname "$OUT")/kube-apiserver-cache"
export GOMODCACHE="$CACHE/mod" GOCACHE="$CACHE/build"
export GOFLAGS="-modcacherw"
trap 'rm -rf "$CACHE"' EXIT

staging_version="v0.${VERSION#v1.}"
modfile=$("$GO" mod download -json "k8s.io/kubernetes@$VERSION" | sed -n 's/.*"GoMod": "\(.*\)",*/\1/p')
[ -f "$modfile" ] || { echo "build-kube-apiserver: no go.mod for k8s.io/kubernetes@$VERSION" >&2; exit 1; }

{
  echo "module qosd.test/kube-apiserver"
  echo
  sed -n 's/^go \(.*\)/go \1/p' "$modfile"
  echo
  echo "require k8s.io/kubernetes $VERSION"
  echo
  echo "replace ("
  # Every module the upstream go.mod points at ./staging, at its tag.
  sed -n 's|^\s*\(k8s.io/[a-z0-9-]*\) => ./staging/.*|\t\1 => \1 '"$staging_version"'|p' "$modfile"
  echo ")"
} > go.mod
cat > main.go <<'GO'
// Package main is kube-apiserver, built from k8s.io/kubernetes as a module.
package main

import (
	"os"

	_ "k8s.io/component-base/logs/json/register"
	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() {
	os.Exit(cli.Run(app.NewAPIServerCommand()))
}
GO
GOFLAGS="-mod=mod -modcacherw" "$GO" mod tidy >/dev/null
# The version kubectl and /version report (a module build has no git tag).
minor=${VERSION#v1.}; minor=${minor%%.*}
v=k8s.io/component-base/version
ldflags="-s -X $v.gitVersion=$VERSION -X $v.gitMajor=1 -X $v.gitMinor=$minor -X $v.gitTreeState=clean"
CGO_ENABLED=0 GOFLAGS="-mod=mod -modcacherw" "$GO" build -trimpath -ldflags="$ldflags" -o "$OUT.tmp" .
mv "$OUT.tmp" "$OUT"
echo "built $OUT ($("$OUT" --version))"
