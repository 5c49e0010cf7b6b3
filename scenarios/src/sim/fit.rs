//! Fitting an app's sim model to runs on a real machine (`qosd calibrate
//! --model`): pure functions of measured points, so that they are tested on
//! synthetic points with a known answer.
//!
//! A server, from load steps at a few allocations (CPUs, CPU quota):
//! - `service_us`: the CPUs of each allocation over the best rate reached
//!   there when a step saturated the server (median over allocations), so
//!   that the model's capacity is the measured one; else CPU time per
//!   request (the server's CPU seconds over its completed requests, median
//!   over the busier unsaturated steps: at light load wake-ups inflate it);
//! - `parallelism`: the threads that did work in the saturated steps
//!   (threads that used at least [`BUSY_THREAD_SHARE`] of a CPU);
//! - `network_ms`: the client/server gap (client − eBPF percentile) of the
//!   unsaturated steps, each divided by the model's load growth of the
//!   network term at that step, median: measured, not traded against the
//!   service time's spread. A step whose eBPF figure is above the client's
//!   is left out (a request cannot take longer on the server than at the
//!   client that waited for it: such a figure counts another step's
//!   backlog, or is a sensor fault);
//! - `service_cv`: with that network term, the grid point whose
//!   steady-state queue (the sim's own, [`super::model::Queue`]) best
//!   matches the measured client and (kept) server-side percentiles of the
//!   unsaturated steps (least squares on log latency).
//!
//! How capacity scales with cores and quota is the model's rule
//! (`min(CPUs, parallelism, quota)` over the service time); the fit checks
//! it against the best throughput measured at each allocation
//! ([`FitCheck`]) rather than bending it. A batch job: operations per
//! CPU-second (its ops/s over the CPUs it used), checked the same way.

use qosd_core::measure::median;
use qosd_core::Share;

use super::fitted::FitCheck;
use super::model::{percentile, Shifts, SimModel};
use crate::calibrate::{network_load, network_queue_ms};
use crate::scenario::{SimModelSpec, SimNode};

/// A thread counts towards parallelism when it used this share of a CPU
/// over a saturated step.
pub const BUSY_THREAD_SHARE: f64 = 0.02;

/// One load step of a server at one allocation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ServerPoint {
    /// CPUs it ran on (its cpuset).
    pub nr_cores: u32,
    /// CPU quota, milli-CPUs (0: none).
    pub quota_milli: u32,
    pub offered_rps: f64,
    pub achieved_rps: f64,
    /// Client latency at the target percentile, µs.
    pub client_us: f64,
    /// Server-side (eBPF, from arrival) latency at the percentile, µs.
    pub ebpf_us: Option<f64>,
    /// The server's CPU time over the step, s.
    pub cpu_s: f64,
    /// Length of the step, s.
    pub wall_s: f64,
    /// Threads that used at least [`BUSY_THREAD_SHARE`] of a CPU.
    pub busy_threads: u32,
}

impl ServerPoint {
    fn saturated(&self) -> bool {
        self.achieved_rps < 0.9 * self.offered_rps
    }
    fn share(&self) -> Share {
        Share {
            nr_cores: self.nr_cores,
            cpu_quota_milli: self.quota_milli,
            ..Default::default()
        }
    }
}

/// One run of a batch job at one allocation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct JobPoint {
    pub nr_cores: u32,
    pub quota_milli: u32,
    pub ops_per_s: f64,
    /// CPUs the job used on average (CPU seconds per second).
    pub cpus_used: f64,
}

/// The model's steady-state latency at a point, µs: (client, server side).
fn predict(m: &SimModel, p: &ServerPoint, pct: f64, node: &SimNode) -> (f64, f64) {
    let a = p.share();
    let cap = m.capacity_rps(&a, node);
    let lambda = p.achieved_rps.min(cap);
    let at = Shifts {
        shift_us: m.fixed_us,
        network_us: (m.network_ms + network_queue_ms(m, network_load(m, lambda, node))) * 1000.0,
        noise: 1.0,
        weight: 1.0,
    };
    let sample = m.sample(&a, node, lambda, 1.0, at);
    (
        percentile(&[sample], pct, true).unwrap_or(f64::INFINITY),
        percentile(&[sample], pct, false).unwrap_or(f64::INFINITY),
    )
}

/// Fits a server's model; `base` holds what is not fitted (its server
/// kind's defaults: fixed delay, cache and frequency terms). Returns the
/// fitted values and the capacity check per allocation; `None` without
/// a usable unsaturated step.
pub fn fit_server(
    points: &[ServerPoint],
    pct: f64,
    base: &SimModel,
    node: &SimNode,
) -> Option<(SimModelSpec, Vec<FitCheck>)> {
    let ok: Vec<&ServerPoint> = points
        .iter()
        .filter(|p| !p.saturated() && p.achieved_rps > 0.0 && p.wall_s > 0.0)
        .collect();
    if ok.is_empty() {
        return None;
    }
    let mut m = SimModel {
        service_us: service_time_us(points, &ok)?,
        parallelism: parallelism(points, base),
        noise: 0.0,
        ..base.clone()
    };
    m.network_ms = fit_network_ms(&m, &ok, node).unwrap_or(base.network_ms);
    m.service_cv = fit_cv(&mut m, &ok, pct, node);
    let checks = capacity_checks(points, &m, node);
    Some((
        SimModelSpec {
            service_us: Some(round3(m.service_us)),
            service_cv: Some(round3(m.service_cv)),
            parallelism: Some(m.parallelism),
            network_ms: Some(round3(m.network_ms)),
            ..Default::default()
        },
        checks,
    ))
}

/// The service time of one request, µs, from the steps (`ok`: those that
/// did not saturate the server).
fn service_time_us(points: &[ServerPoint], ok: &[&ServerPoint]) -> Option<f64> {
    // Capacity is what the sim's loads are fractions of, so the service
    // time comes from it where a step saturated the server: the CPUs of
    // the allocation over the best rate reached there (this also charges
    // what a request costs outside the server's own threads, e.g. the
    // loopback stack in softirq). CPU time per request where none did.
    let saturated_at: Vec<f64> = allocations(points.iter().map(|p| (p.nr_cores, p.quota_milli)))
        .into_iter()
        .filter_map(|(c, q)| {
            let at: Vec<&ServerPoint> = points
                .iter()
                .filter(|p| (p.nr_cores, p.quota_milli) == (c, q))
                .collect();
            if !at.iter().any(|p| p.saturated()) {
                return None;
            }
            let best = at.iter().map(|p| p.achieved_rps).fold(0.0, f64::max);
            let cpus = f64::from(c).min(if q == 0 {
                f64::MAX
            } else {
                f64::from(q) / 1000.0
            });
            (best > 0.0).then(|| (c, cpus * 1e6 / best))
        })
        .map(|(_, s)| s)
        .collect();
    let top = ok.iter().map(|p| p.achieved_rps).fold(0.0, f64::max);
    let cpu_per_req = median(
        ok.iter()
            .filter(|p| p.achieved_rps >= 0.5 * top && p.cpu_s > 0.0)
            .map(|p| p.cpu_s / (p.achieved_rps * p.wall_s) * 1e6)
            .collect(),
    );
    median(saturated_at).or(cpu_per_req)
}

/// How many of the server's threads work at once.
fn parallelism(points: &[ServerPoint], base: &SimModel) -> u32 {
    let busy = |sat: bool| {
        points
            .iter()
            .filter(|p| p.saturated() == sat)
            .map(|p| p.busy_threads)
            .max()
            .unwrap_or(0)
    };
    // Saturated steps show how many threads can work at once; without
    // one, the busiest step is a lower bound.
    let threads = match busy(true) {
        0 => busy(false),
        n => n,
    };
    if threads == 0 {
        base.parallelism
    } else {
        threads
    }
}

/// A server-side figure above the client's by more than this share is not
/// the same requests' (see the module's header) and is not fitted.
const EBPF_OVER_CLIENT: f64 = 1.1;

/// The step's eBPF percentile, if it can be the same requests' as the
/// client's.
fn kept_ebpf(p: &ServerPoint) -> Option<f64> {
    p.ebpf_us
        .filter(|e| *e > 0.0 && *e <= EBPF_OVER_CLIENT * p.client_us)
}

/// The network term (ms) from the steps' client/server gaps: at each step
/// the model's gap is `network_ms · (1 + its queue factor at that load)`,
/// so each step gives one estimate; their median stands (a step the
/// machine stalled in moves a mean, not a median). A gap at or under zero
/// (the two percentiles within their noise) counts as zero. `None`
/// without a step with both figures.
fn fit_network_ms(m: &SimModel, ok: &[&ServerPoint], node: &SimNode) -> Option<f64> {
    let unit = SimModel {
        network_ms: 1.0,
        ..m.clone()
    };
    let est: Vec<f64> = ok
        .iter()
        .filter_map(|p| {
            let e = kept_ebpf(p)?;
            let grow = 1.0 + network_queue_ms(&unit, network_load(m, p.achieved_rps, node));
            Some(((p.client_us - e) / 1000.0).max(0.0) / grow)
        })
        .collect();
    // The grid's floor (2 µs): a zero term is a model without a network.
    median(est).map(|v| v.max(0.002))
}

/// The service time's coefficient of variation that fits the steps'
/// client (and kept eBPF) latencies best, the network term fixed: least
/// squares on log latency over a grid. `m` is left at the last point of
/// the grid tried.
fn fit_cv(m: &mut SimModel, ok: &[&ServerPoint], pct: f64, node: &SimNode) -> f64 {
    let mut best = (f64::INFINITY, m.service_cv);
    for i in 1..=20 {
        let cv = i as f64 * 0.05;
        m.service_cv = cv;
        let mut err = 0.0;
        for p in ok {
            let (client, server) = predict(m, p, pct, node);
            err += (client / p.client_us).ln().powi(2);
            if let Some(e) = kept_ebpf(p) {
                err += (server / e).ln().powi(2);
            }
        }
        if err < best.0 {
            best = (err, cv);
        }
    }
    best.1
}

/// The model's capacity against the best rate measured, per allocation.
fn capacity_checks(points: &[ServerPoint], m: &SimModel, node: &SimNode) -> Vec<FitCheck> {
    allocations(points.iter().map(|p| (p.nr_cores, p.quota_milli)))
        .into_iter()
        .map(|(c, q)| {
            let at = points
                .iter()
                .filter(|p| (p.nr_cores, p.quota_milli) == (c, q));
            FitCheck {
                nr_cores: c,
                quota_milli: q,
                measured: round3(at.map(|p| p.achieved_rps).fold(0.0, f64::max)),
                model: round3(m.capacity_rps(
                    &Share {
                        nr_cores: c,
                        cpu_quota_milli: q,
                        ..Default::default()
                    },
                    node,
                )),
                unit: "rps".into(),
            }
        })
        .collect()
}

/// Fits a batch job's operations per CPU-second; `threads` is its spec's.
pub fn fit_job(
    points: &[JobPoint],
    threads: u32,
    node: &SimNode,
) -> Option<(SimModelSpec, Vec<FitCheck>)> {
    let rate = median(
        points
            .iter()
            .filter(|p| p.cpus_used > 0.05)
            .map(|p| p.ops_per_s / p.cpus_used)
            .collect(),
    )?;
    let m = SimModel {
        parallelism: threads.max(1),
        ops_per_cpu_s: rate,
        freq_sensitivity: 0.0,
        ..SimModel::generic()
    };
    let checks = points
        .iter()
        .map(|p| {
            let a = Share {
                nr_cores: p.nr_cores,
                cpu_quota_milli: p.quota_milli,
                ..Default::default()
            };
            FitCheck {
                nr_cores: p.nr_cores,
                quota_milli: p.quota_milli,
                measured: round3(p.ops_per_s),
                model: round3(m.job_ops_per_s(&a, node, f64::INFINITY).1),
                unit: "ops/s".into(),
            }
        })
        .collect();
    Some((
        SimModelSpec {
            parallelism: Some(m.parallelism),
            ops_per_cpu_s: Some(round3(rate)),
            ..Default::default()
        },
        checks,
    ))
}

/// Distinct allocations in first-seen order.
fn allocations(it: impl Iterator<Item = (u32, u32)>) -> Vec<(u32, u32)> {
    let mut v = Vec::new();
    for a in it {
        if !v.contains(&a) {
            v.push(a);
        }
    }
    v
}

/// Three significant digits: a model file for people to read.
fn round3(x: f64) -> f64 {
    if x == 0.0 || !x.is_finite() {
        return x;
    }
    let mag = 10f64.powi(2 - x.abs().log10().floor() as i32);
    (x * mag).round() / mag
}

#[cfg(test)]
#[path = "fit_tests.rs"]
mod tests;
