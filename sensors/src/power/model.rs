//! The node power model used where there is no RAPL (see
//! [`ModelConfig`](super::ModelConfig) for the formula): idle and dynamic
//! power per socket from each CPU's busy fraction and frequency. Everything
//! it produces is an estimate and is labelled so by the sensor.

use std::path::Path;

use super::config::ModelConfig;
use super::topology::{read_trimmed, CpuPackages};

/// Current ÷ maximum frequency of each CPU from cpufreq
/// (`scaling_cur_freq` / `cpuinfo_max_freq`), `None` where cpufreq is
/// missing or unreadable.
pub fn freq_ratios(root: &Path, topo: &CpuPackages) -> Vec<Option<f64>> {
    let base = root.join("sys/devices/system/cpu");
    (0..topo.cpus.len())
        .map(|cpu| {
            let d = base.join(format!("cpu{cpu}/cpufreq"));
            let khz = |f: &str| -> Option<f64> {
                read_trimmed(&d.join(f))
                    .ok()?
                    .parse::<f64>()
                    .ok()
                    .filter(|v| *v > 0.0)
            };
            let cur = khz("scaling_cur_freq")?;
            let max = khz("cpuinfo_max_freq")?;
            Some((cur / max).clamp(0.0, 1.5))
        })
        .collect()
}

/// Model power of one socket over an interval, W.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ModelSocket {
    /// Share of `base_w` plus `idle_w_per_cpu` for each online CPU.
    pub idle_w: f64,
    /// The dynamic terms: what eq. (2) attributes to threads.
    pub active_w: f64,
}

/// Evaluates the model per socket. `busy[c]` is CPU c's busy fraction
/// (0..=1), `freq[c]` its frequency ratio (`None`: taken as 1).
/// `base_w` is split evenly between sockets.
pub fn evaluate(
    cfg: &ModelConfig,
    topo: &CpuPackages,
    busy: &[f64],
    freq: &[Option<f64>],
) -> Vec<ModelSocket> {
    let n = topo.sockets.len().max(1);
    let mut out = vec![
        ModelSocket {
            idle_w: cfg.base_w / n as f64,
            active_w: 0.0,
        };
        n
    ];
    for (cpu, c) in topo.cpus.iter().enumerate().filter(|(_, c)| c.online) {
        let u = busy.get(cpu).copied().unwrap_or(0.0).clamp(0.0, 1.0);
        let f = freq.get(cpu).copied().flatten().unwrap_or(1.0);
        let s = &mut out[c.socket];
        s.idle_w += cfg.idle_w_per_cpu;
        s.active_w += cfg.dynamic_w_per_cpu * u * f.powf(cfg.freq_exponent);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::power::topology::tests::fake_cpus;
    use std::fs;

    #[test]
    fn formula_term_by_term() {
        let d = tempfile::tempdir().unwrap();
        fake_cpus(d.path(), 2, 2, 1); // CPUs 0,1 on socket 0; 2,3 on socket 1
        let topo = CpuPackages::read(&qosd_core::sys::Root::new(d.path())).unwrap();
        let cfg = ModelConfig {
            base_w: 20.0,
            idle_w_per_cpu: 2.0,
            dynamic_w_per_cpu: 8.0,
            freq_exponent: 2.0,
        };
        let busy = [1.0, 0.5, 0.25, 0.0];
        let freq = [Some(1.0), Some(0.5), None, Some(0.8)];
        let m = evaluate(&cfg, &topo, &busy, &freq);
        // socket 0: 10 + 2·2 idle; 8·1·1 + 8·0.5·0.25 dynamic
        assert_eq!(m[0].idle_w, 14.0);
        assert_eq!(m[0].active_w, 8.0 + 1.0);
        // socket 1: 10 + 2·2 idle; 8·0.25·1 (no cpufreq: ratio 1) + 0
        assert_eq!(m[1].idle_w, 14.0);
        assert_eq!(m[1].active_w, 2.0);
    }

    #[test]
    fn cpufreq_ratios_from_sysfs() {
        let d = tempfile::tempdir().unwrap();
        fake_cpus(d.path(), 1, 2, 1);
        let f = d.path().join("sys/devices/system/cpu/cpu1/cpufreq");
        fs::create_dir_all(&f).unwrap();
        fs::write(f.join("scaling_cur_freq"), "1200000\n").unwrap();
        fs::write(f.join("cpuinfo_max_freq"), "2400000\n").unwrap();
        let topo = CpuPackages::read(&qosd_core::sys::Root::new(d.path())).unwrap();
        assert_eq!(freq_ratios(d.path(), &topo), vec![None, Some(0.5)]);
    }
}
