//! qosd sensors. The heart is [`ebpf`]: per-request, server-side latency and
//! throughput of a process, observed from syscalls with no change to the
//! application. [`stats`] is the windowed statistics engine behind it;
//! [`procfs`] reads CPU utilisation per process and node. [`power`]
//! attributes node power (RAPL, or a labelled model) to threads and apps
//! from a `sched_switch` BPF program. [`net`] counts packets and bytes per
//! peer and local port in millisecond bins from TC programs (`qosd net`).
//! [`sensor`] is the plugin interface every node samples them through;
//! [`bpfstats`] reads any program's run count and time; [`percpu`] sums
//! the per-CPU counters programs keep.

pub mod bpfstats;
pub mod ebpf;
pub mod filed;
pub mod net;
pub mod percpu;
pub mod power;
pub mod procfs;
pub mod sensor;
pub mod stats;
