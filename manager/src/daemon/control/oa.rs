//! Operational figures per traced process for the API (`/v1/pids/{pid}`):
//! each pid's requests (the tracer's counts) and CPU time over the last
//! decision interval, read against the allocation of the app that holds
//! it. The app's own figures come from the same laws ([`qosd_core::oa`]).

use std::collections::{BTreeMap, HashMap};

use qosd_core::oa::Oa;
use qosd_sensors::ebpf::RequestTracer;

/// One app's per-pid request counts between decision intervals.
#[derive(Debug, Default)]
pub(super) struct PidMeter {
    /// The tracer's request total per pid at the last interval's end.
    requests: HashMap<i32, u64>,
    /// Per pid over the last interval: (CPUs busy, requests/s).
    last: Vec<(i32, f64, f64)>,
}

impl PidMeter {
    /// The interval of `secs` that just ended: `cpu` is each pid's CPU
    /// seconds in it. Pids the tracer does not follow get no figures.
    pub(super) fn update(&mut self, cpu: &[(i32, f64)], tracer: Option<&RequestTracer>, secs: f64) {
        let Some(t) = tracer.filter(|_| secs > 0.0) else {
            self.last.clear();
            return;
        };
        let mut next = HashMap::with_capacity(cpu.len());
        self.last = cpu
            .iter()
            .filter_map(|&(pid, used)| {
                // Not traced yet: its count starts from 0 when it is.
                let total = t.requests(pid as u32);
                next.insert(pid, total.unwrap_or(0));
                // A pid seen for the first time has no interval yet.
                let (total, before) = (total?, *self.requests.get(&pid)?);
                Some((pid, used / secs, total.saturating_sub(before) as f64 / secs))
            })
            .collect();
        self.requests = next;
    }

    /// Each pid's figures on the app's `cpus`.
    pub(super) fn figures(&self, cpus: Option<f64>) -> BTreeMap<i32, Oa> {
        let Some(c) = cpus else {
            return BTreeMap::new();
        };
        self.last
            .iter()
            .filter_map(|&(pid, used, x)| Some((pid, Oa::of(x, used, c)?)))
            .collect()
    }
}
