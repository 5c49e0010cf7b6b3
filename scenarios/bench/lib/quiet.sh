# A bench's build and its measurement, kept apart: the build runs at the
# lowest CPU priority (so that it cannot slow another bench's measurement
# on this machine), and the measurement alone holds $BENCH_LOCK when the
# caller names one (`flock -o`: the measured programs do not inherit it),
# so that benches started by several people never measure at once and
# nobody builds while holding the lock.
# Usage: . scenarios/bench/lib/quiet.sh; build_quiet -p CRATE --bin BIN; measured CMD...
# (build_quiet_bench -p CRATE --bench NAME: a criterion bench's build, which
# `cargo bench` then runs without compiling.)
build_quiet() {
  nice -n 19 cargo build -q --release "$@"
}
build_quiet_bench() {
  nice -n 19 cargo bench -q --no-run "$@"
}
measured() {
  if [ -n "${BENCH_LOCK:-}" ]; then
    flock -o "$BENCH_LOCK" "$@"
  else
    "$@"
  fi
}
