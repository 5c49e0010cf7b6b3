# BPF run-time statistics for a shell bench, held by reference: a helper
# process takes a BPF_ENABLE_STATS fd (bpf(2) command 32, type 0 =
# BPF_STATS_RUN_TIME; x86-64 syscall 321) and keeps it until stopped, or
# until the bench that started it is gone. Unlike writing
# kernel.bpf_stats_enabled and restoring the value read before, references
# stack: two benches cannot leave the statistics on for every later
# measurement (bpfstats::StatsOn is the Rust side).
# Usage: . scenarios/bench/lib/bpf_stats.sh; bpf_stats_on; ...; bpf_stats_off
bpf_stats_on() {
  [ -n "${BPF_STATS_HOLDER:-}" ] && return 0
  local fifo line
  fifo=$(mktemp -u) && mkfifo "$fifo"
  perl -MIO::Handle -e '
    my $parent = getppid();
    my $attr = pack("L", 0);
    my $fd = syscall(321, 32, $attr, 4);
    if ($fd < 0) { print "error $!\n"; exit 1 }
    print "on\n"; STDOUT->flush;
    sleep 1 while getppid() == $parent;' >"$fifo" &
  BPF_STATS_HOLDER=$!
  read -r line <"$fifo"; rm -f "$fifo"
  if [ "$line" != on ]; then
    echo "BPF statistics: $line" >&2; BPF_STATS_HOLDER=; return 1
  fi
}
bpf_stats_off() {
  [ -z "${BPF_STATS_HOLDER:-}" ] && return 0
  kill "$BPF_STATS_HOLDER" 2>/dev/null || true
  wait "$BPF_STATS_HOLDER" 2>/dev/null || true
  BPF_STATS_HOLDER=
}
