#!/usr/bin/env bash
# make test-kernels: the root integration suites of the sensors and actuators
# on a matrix of real kernels, each booted in a guest with the unified cgroup
# v2 hierarchy (cgroup_no_v1=all), plus this host's kernel as it runs.
#
# Kernels: Debian's linux-image-amd64 of each suite in $KERNEL_SUITES
# (default: bookworm = 6.1, trixie = 6.12), fetched with apt into
# target/kernels (a private apt state: the host's sources are not touched).
# Guests: virtme-ng (from PyPI, into target/kernels/venv) over the host's root
# filesystem, read-only with writable overlays; results come back through a
# shared directory. Prints one table: kernel x suite -> passed/failed/skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
K=$PWD/target/kernels
SUITES=${SUITES:-kernels/suites.tsv}
KERNEL_SUITES=${KERNEL_SUITES:-bookworm trixie}
HOST_ROW=${HOST_ROW:-1}
mkdir -p "$K"

need_pkgs() {
  local missing=""
  for p in "$@"; do dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q 'install ok installed' || missing="$missing $p"; done
  if [ -n "$missing" ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
  fi
}
need_pkgs qemu-system-x86 kmod busybox-static bc python3-venv

# virtme-ng, pinned, in a venv of its own.
if [ ! -x "$K/venv/bin/vng" ]; then
  python3 -m venv "$K/venv"
  "$K/venv/bin/pip" install -q 'virtme-ng==1.42'
fi

# vng runs virtme-run by name: the venv's bin first on PATH.
export PATH="$K/venv/bin:$PATH"

# Debian kernels through a private apt state.
APT=(-o Dir::Etc::SourceList="$K/apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
     -o Dir::State::Lists="$K/apt/lists" -o Dir::Cache="$K/apt/cache" -o Debug::NoLocking=1)
mkdir -p "$K/apt/lists/partial" "$K/apt/cache/archives/partial"
: > "$K/apt/sources.list"
for s in $KERNEL_SUITES; do
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian $s main" >> "$K/apt/sources.list"
done
apt-get "${APT[@]}" update -qq
kernels=()
for s in $KERNEL_SUITES; do
  pkg=$(apt-cache "${APT[@]}" depends "linux-image-amd64/$s" 2>/dev/null | sed -n 's/^ *Depends: \(linux-image-[^ ]*\)$/\1/p' | head -n 1)
  [ -n "$pkg" ] || { echo "no linux-image-amd64 in $s" >&2; exit 1; }
  kver=${pkg#linux-image-}
  if [ ! -f "$K/$kver/boot/vmlinuz-$kver" ]; then
    (cd "$K" && apt-get "${APT[@]}" download "$pkg" >/dev/null 2>&1 && dpkg-deb -x "${pkg}"_*.deb "$kver" && rm -f "${pkg}"_*.deb)
    # virtme-ng looks for modules under <root>/lib/modules (trixie ships them in usr/lib).
    [ -d "$K/$kver/lib" ] || ln -s usr/lib "$K/$kver/lib"
  fi
  kernels+=("$kver")
done

# The test binaries the suites name, and only those, built on the host (the
# guests share its filesystem). Each suite's test binary once, as `--test`;
# `--workspace` keeps the features, and so the binaries, of `make test`'s build.
make --no-print-directory fixtures >/dev/null
suite_rows=() tests=()
while IFS=$'\t' read -r suite test filter env; do
  case "$suite" in ''|\#*) continue ;; esac
  [ -n "$test" ] || { echo "suite $suite names no test binary ($SUITES)" >&2; exit 1; }
  suite_rows+=("$suite"$'\t'"$test"$'\t'"${filter:-}"$'\t'"${env:-}")
  case " ${tests[*]} " in *" --test $test "*) ;; *) tests+=(--test "$test") ;; esac
done < "$SUITES"
[ ${#tests[@]} -gt 0 ] || { echo "no suites in $SUITES" >&2; exit 1; }
if ! cargo test --release --workspace --no-run "${tests[@]}" --message-format=json \
    > "$K/build.json" 2> "$K/build.log"; then
  tail -n 20 "$K/build.log" >&2
  exit 1
fi
python3 -c '
import json, sys
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["target"]["name"] + "\t" + m["executable"])
' < "$K/build.json" > "$K/binaries.tsv"
resolved="$K/suites.resolved.tsv"
: > "$resolved"
for row in "${suite_rows[@]}"; do
  IFS=$'\t' read -r suite test filter env <<< "$row"
  bin=$(awk -F'\t' -v t="$test" '$1 == t { print $2 }' "$K/binaries.tsv")
  [ -n "$bin" ] || { echo "no test binary '$test' (suite $suite)" >&2; exit 1; }
  printf '%s\t%s\t%s\t%s\n' "$suite" "$bin" "${filter:-}" "${env:-}" >> "$resolved"
done

# Why the guests run under TCG here, when they do: this host's KVM is PVM
# (kvm_pvm), which boots only PVM-enabled guest kernels; Debian's hang at once.
accel=()
if [ ! -w /dev/kvm ] || [ -d /sys/module/kvm_pvm ]; then
  accel=(--disable-kvm)
  echo "guests run under TCG (software emulation): $( [ -d /sys/module/kvm_pvm ] && echo 'this KVM is PVM, which boots only PVM guest kernels' || echo 'no usable /dev/kvm')"
fi

# The guests run side by side (each is two vCPU threads on the host).
rows=()
for kver in "${kernels[@]}"; do
  out="$K/results/$kver"
  rm -rf "$out"; mkdir -p "$out"
  echo "== $kver: booting (cgroup_no_v1=all) =="
  timeout "${GUEST_TIMEOUT:-5400}" "$K/venv/bin/vng" -r "$K/$kver/boot/vmlinuz-$kver" "${accel[@]}" \
    --cpus 2 --memory 4G --rwdir="$out" --append cgroup_no_v1=all \
    --exec "$PWD/kernels/guest.sh $out $resolved" > "$out/console.log" 2>&1 &
  rows+=("$kver")
done
wait

if [ "$HOST_ROW" = 1 ]; then
  kver="host-$(uname -r)"
  out="$K/results/$kver"
  rm -rf "$out"; mkdir -p "$out"
  echo "== $kver: on the host (its own cgroup layout) =="
  bash kernels/guest.sh "$out" "$resolved" || true
  rows+=("$kver")
fi

python3 kernels/table.py "$K/results" "${rows[@]}" | tee "$K/table.md"
