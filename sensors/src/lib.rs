//! qosd sensors. The heart is [`ebpf`]: per-request, server-side latency and
//! throughput of a process, observed from syscalls with no change to the
//! application. [`stats`] is the windowed statistics engine behind it;
//! [`procfs`] reads CPU utilisation per process and node.

pub mod ebpf;
pub mod procfs;
pub mod stats;
