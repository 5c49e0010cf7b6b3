//! Node and daemon families: build, loop ticks, node CPU, and what this
//! process itself uses under the standard `process_` names.

use super::Exposition;
use crate::daemon::state::Shared;

pub(super) fn build(o: &mut Exposition, sh: &Shared) {
    let info = &sh.info;
    o.gauge("qosd_build_info", "qosd's version and policy (value 1).")
        .sample(&[("version", info.version), ("policy", &info.policy)], 1.0);
    if let Some(u) = sh.node_cpu_util {
        o.gauge(
            "qosd_node_cpu_utilization_ratio",
            "Busy share of all the node's CPUs over the last decision interval (0..1).",
        )
        .sample(&[], u);
    }
}

pub(super) fn ticks(o: &mut Exposition, sh: &Shared) {
    o.counter("qosd_ticks_total", "Control-loop ticks by kind.")
        .sample(&[("kind", "monitor")], sh.monitor_ticks_total as f64)
        .sample(&[("kind", "decide")], sh.decide_ticks_total as f64);
    o.counter(
        "qosd_missed_ticks_total",
        "Monitoring ticks skipped because the previous one overran.",
    )
    .sample(&[], sh.missed_ticks_total as f64);
    process(o);
}

fn process(o: &mut Exposition) {
    let me = std::process::id() as i32;
    if let Ok(Some(cpu_s)) = qosd_sensors::procfs::Procfs::new("/").process_cpu_s(me) {
        o.counter(
            "process_cpu_seconds_total",
            "CPU time qosd used (user and system), seconds.",
        )
        .sample(&[], cpu_s);
    }
    // statm: size resident ... in pages.
    let rss_pages = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<f64>().ok());
    if let Some(p) = rss_pages {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as f64;
        o.gauge(
            "process_resident_memory_bytes",
            "Resident memory of qosd, bytes.",
        )
        .sample(&[], p * page);
    }
}
