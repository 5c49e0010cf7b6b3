//! Descriptions for the daemon's banner and each app's starting entry in
//! the API's state.

use qosd_core::{AppClass, Feedback, QosTarget, Share};

use super::DaemonNode;
use crate::config::AppConfig;

impl DaemonNode {
    /// "1 core (CPU 0)", "2 cores (CPUs 0-1), 4 ways", or "as found".
    pub fn describe(&self, app: &str) -> String {
        let Some(s) = self.act.current().get(app) else {
            return "nothing managed".into();
        };
        let mut parts = Vec::new();
        if s.nr_cores > 0 {
            let cpus = self.act.cpus(app).unwrap_or_default();
            let list = qosd_core::cpulist::format(&cpus);
            let (c, p) = if s.nr_cores == 1 {
                ("core", "CPU")
            } else {
                ("cores", "CPUs")
            };
            let p = if cpus.len() == 1 { "CPU" } else { p };
            parts.push(format!("{} {c} ({p} {list})", s.nr_cores));
        }
        if s.nr_ways > 0 {
            parts.push(format!("{} LLC ways", s.nr_ways));
        }
        if s.freq_mhz > 0 {
            parts.push(format!("{} MHz", s.freq_mhz));
        }
        if s.mb_percent > 0 {
            parts.push(format!("{} % memory bandwidth", s.mb_percent));
        }
        if s.cpu_quota_milli > 0 {
            let cpus = f64::from(s.cpu_quota_milli) / 1000.0;
            parts.push(format!("{cpus:.2} CPU of quota"));
        }
        if parts.is_empty() {
            "its resources as found".into()
        } else {
            parts.join(", ")
        }
    }
}

/// The starting live entry of a configured app.
pub fn live_entry(
    a: &AppConfig,
    feedback: Feedback,
    nr_slots: usize,
) -> crate::daemon::state::AppLive {
    crate::daemon::state::AppLive {
        name: a.name.clone(),
        class: a.class,
        feedback,
        target: a.qos_target().filter(|_| a.class == AppClass::Lc),
        pids: Vec::new(),
        pods: Vec::new(),
        share: None::<Share>,
        cpus: None,
        recent: crate::node::latency::Recent::new(nr_slots),
        figure: crate::config::figure_of(a.latency),
        ebpf: std::array::from_fn(|_| crate::node::latency::Recent::new(nr_slots)),
        inbox: Default::default(),
        cpu_util: 0.0,
        cpu_seconds_total: 0.0,
        be_ops_per_s: None,
        power_w: None,
        power: None,
        note: Some("not running".into()),
        apply_errors_total: 0,
        cannot_meet: None,
        cannot_meet_total: 0,
        oa: None,
        pid_oa: Default::default(),
        slo: None,
        net: None,
        knob_counters: Vec::new(),
    }
}

/// For the start-up banner: "p99 ≤ 1 ms".
pub fn describe_target(t: Option<QosTarget>) -> String {
    match t {
        Some(t) => format!(
            "p{} <= {}",
            t.percentile,
            crate::policy::alloc::fmt_us(t.value_us)
        ),
        None => "no target".into(),
    }
}
