//! What the kernel must offer before we load anything, each checked with a
//! message that names what is missing and how to fix it.

use std::path::Path;

use super::TraceError;

const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

const BTF: &str = "/sys/kernel/btf/vmlinux";
const TRACEFS: [&str; 2] = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

/// Privileges, BTF and tracefs: everything the tracer needs from the node.
pub fn check_environment() -> Result<(), TraceError> {
    let caps = qosd_core::sys::effective_caps().unwrap_or(0);
    let has = |c: u32| caps & (1 << c) != 0;
    if !(has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON))) {
        return Err(TraceError::Environment(
            "loading eBPF programs needs root (CAP_BPF and CAP_PERFMON, or CAP_SYS_ADMIN); \
             run qosd as root"
                .into(),
        ));
    }
    if !Path::new(BTF).exists() {
        return Err(TraceError::Environment(format!(
            "{BTF} is missing: this kernel exposes no BTF (CONFIG_DEBUG_INFO_BTF), \
             which the CO-RE programs need"
        )));
    }
    if !TRACEFS
        .iter()
        .any(|d| Path::new(d).join("events/syscalls").is_dir())
    {
        return Err(TraceError::Environment(format!(
            "tracefs is not mounted ({}/events is missing); libbpf needs it for \
             tracepoint ids: mount -t tracefs tracefs {}",
            TRACEFS[0], TRACEFS[0]
        )));
    }
    Ok(())
}
