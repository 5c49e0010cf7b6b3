//! The output of a replay, real or simulated: one row per app per interval
//! (`timeline.csv`) and the summary per app and in total (`summary.json`).
//! Floats are written with fixed decimals so that a deterministic run gives
//! byte-identical files.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::sim::oracle::Oracle;

/// Columns of `timeline.csv`, in order.
pub const COLUMNS: &str = "t_s,app,offered_rps,achieved_rps,client_p99_ms,ebpf_p99_ms,target_ms,violation,cores,freq_mhz,llc_ways,mb_percent,power_w,ebpf_target_ms,fed_violation,cpu_quota_milli,be_ops_per_s,client_slack,ebpf_slack,ebpf_target_from,util,headroom,demand_ms,x_sat_rps";

/// Columns of timelines written before the operational figures: still read.
const COLUMNS_BEFORE_OA: usize = 20;

/// One app over one interval; `None` where a figure does not exist (no
/// target, no such knob on this machine, no request seen).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// End of the interval, seconds since the start.
    pub t_s: f64,
    pub app: String,
    pub offered_rps: f64,
    pub achieved_rps: f64,
    pub client_p99_ms: Option<f64>,
    pub ebpf_p99_ms: Option<f64>,
    /// The client-side target (at the calibrated knee, or as written).
    pub target_ms: Option<f64>,
    /// The client's latency exceeded the client-side target: what users
    /// see, whatever fed the policy (one yardstick for every run).
    pub violation: Option<bool>,
    pub cores: Option<u32>,
    pub freq_mhz: Option<u32>,
    pub llc_ways: Option<u32>,
    pub mb_percent: Option<u32>,
    /// Power attributed to the app, W.
    pub power_w: Option<f64>,
    /// The eBPF-side target: the client's less the client/server gap at
    /// the interval's load; the client's where no gap is known.
    pub ebpf_target_ms: Option<f64>,
    /// The latency that fed the policy exceeded its own target (the
    /// policy's view of the interval).
    pub fed_violation: Option<bool>,
    /// CPU quota in force, milli-CPUs (none: no quota knob or no quota).
    pub cpu_quota_milli: Option<u32>,
    /// Throughput of a best-effort app's batch job over the interval,
    /// operations per second (`None` for apps without a job).
    pub be_ops_per_s: Option<f64>,
    /// (client target − client latency) / client target.
    pub client_slack: Option<f64>,
    /// (eBPF target − eBPF latency) / client target: the same meaning as
    /// the client's ([`qosd_core::slo`]).
    pub ebpf_slack: Option<f64>,
    /// Where the eBPF-side target came from (`client`, `calibrated_gap`,
    /// `refreshed_gap`).
    pub ebpf_target_from: Option<String>,
    /// Operational analysis of the interval ([`qosd_core::oa`]): U = X·D
    /// on the CPUs it held.
    pub util: Option<f64>,
    /// 1 − X / X_sat.
    pub headroom: Option<f64>,
    /// Service demand D, CPU milliseconds per request.
    pub demand_ms: Option<f64>,
    /// Saturation throughput X_sat = c / D, requests/s.
    pub x_sat_rps: Option<f64>,
}

fn f(v: Option<f64>, decimals: usize) -> String {
    v.filter(|x| x.is_finite())
        .map_or(String::new(), |x| format!("{x:.decimals$}"))
}
fn u(v: Option<u32>) -> String {
    v.map_or(String::new(), |x| x.to_string())
}

impl Row {
    pub fn csv(&self) -> String {
        format!(
            "{:.3},{},{:.1},{:.1},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
            self.t_s,
            self.app,
            self.offered_rps,
            self.achieved_rps,
            f(self.client_p99_ms, 3),
            f(self.ebpf_p99_ms, 3),
            f(self.target_ms, 3),
            self.violation
                .map_or(String::new(), |v| (v as u8).to_string()),
            u(self.cores),
            u(self.freq_mhz),
            u(self.llc_ways),
            u(self.mb_percent),
            f(self.power_w, 2),
            f(self.ebpf_target_ms, 3),
            self.fed_violation
                .map_or(String::new(), |v| (v as u8).to_string()),
            u(self.cpu_quota_milli),
            f(self.be_ops_per_s, 1),
            f(self.client_slack, 4),
            f(self.ebpf_slack, 4),
            self.ebpf_target_from.as_deref().unwrap_or(""),
            f(self.util, 4),
            f(self.headroom, 4),
            f(self.demand_ms, 6),
            f(self.x_sat_rps, 1),
        )
    }

    /// Parses a line written by [`Row::csv`].
    pub fn parse(line: &str) -> Option<Row> {
        let mut c: Vec<&str> = line.split(',').collect();
        let n = COLUMNS.split(',').count();
        if c.len() == COLUMNS_BEFORE_OA {
            c.resize(n, "");
        }
        if c.len() != n {
            return None;
        }
        let of = |s: &str| {
            if s.is_empty() {
                None
            } else {
                s.parse::<f64>().ok()
            }
        };
        let ou = |s: &str| {
            if s.is_empty() {
                None
            } else {
                s.parse::<u32>().ok()
            }
        };
        Some(Row {
            t_s: c[0].parse().ok()?,
            app: c[1].to_owned(),
            offered_rps: c[2].parse().ok()?,
            achieved_rps: c[3].parse().ok()?,
            client_p99_ms: of(c[4]),
            ebpf_p99_ms: of(c[5]),
            target_ms: of(c[6]),
            violation: ou(c[7]).map(|v| v != 0),
            cores: ou(c[8]),
            freq_mhz: ou(c[9]),
            llc_ways: ou(c[10]),
            mb_percent: ou(c[11]),
            power_w: of(c[12]),
            ebpf_target_ms: of(c[13]),
            fed_violation: ou(c[14]).map(|v| v != 0),
            cpu_quota_milli: ou(c[15]),
            be_ops_per_s: of(c[16]),
            client_slack: of(c[17]),
            ebpf_slack: of(c[18]),
            ebpf_target_from: (!c[19].is_empty()).then(|| c[19].to_owned()),
            util: of(c[20]),
            headroom: of(c[21]),
            demand_ms: of(c[22]),
            x_sat_rps: of(c[23]),
        })
    }
}

/// A whole run.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Timeline {
    pub scenario: String,
    /// `sim` or `real`.
    pub mode: String,
    pub feedback: String,
    pub policy: String,
    pub seed: u64,
    pub interval_s: f64,
    /// Apps in scenario order.
    pub apps: Vec<String>,
    pub rows: Vec<Row>,
    /// Node power per interval, W (same order as the intervals).
    pub node_power_w: Vec<f64>,
    /// Power figures are a model, not a measurement.
    pub energy_is_estimate: bool,
    /// Plans the node put in force only in part or not at all.
    pub rejected_plans: u64,
    /// Changes the policy reverted (a downsize that hurt).
    #[serde(default)]
    pub reverts: u64,
    /// "Cannot meet QoS" events: a violating app nothing could be given to.
    #[serde(default)]
    pub cannot_meet: u64,
    /// What the run was made with, for whoever reads its summary later:
    /// `qosd_version`, `policy` (the parsed policy file, every parameter),
    /// `calibration`, and on the simulated node `model` (each app's).
    #[serde(default)]
    pub meta: BTreeMap<String, serde_json::Value>,
    /// The oracle baseline of a simulated run (none on real servers).
    #[serde(default)]
    pub oracle: Option<Oracle>,
}

impl Timeline {
    pub fn write_csv(&self, path: &Path) -> std::io::Result<()> {
        let mut w = std::io::BufWriter::new(std::fs::File::create(path)?);
        writeln!(w, "{COLUMNS}")?;
        for r in &self.rows {
            writeln!(w, "{}", r.csv())?;
        }
        w.flush()
    }

    /// Reads a `timeline.csv` back (for `qosd compare`).
    pub fn read_csv(path: &Path) -> anyhow::Result<Vec<Row>> {
        let text = qosd_core::yamlfile::read_kind(path, qosd_core::yamlfile::Kind::Timeline)?;
        let mut lines = text.lines();
        if lines.next() != Some(COLUMNS) {
            anyhow::bail!("{}: not a qosd timeline (header differs)", path.display());
        }
        lines
            .enumerate()
            .map(|(i, l)| {
                Row::parse(l)
                    .ok_or_else(|| anyhow::anyhow!("{}:{}: bad row", path.display(), i + 2))
            })
            .collect()
    }

    pub fn rows_of<'a>(&'a self, app: &'a str) -> impl Iterator<Item = &'a Row> + 'a {
        self.rows.iter().filter(move |r| r.app == app)
    }

    pub fn summary(&self) -> Summary {
        let dt = self.interval_s;
        let client = self.feedback == "client";
        let mut apps = BTreeMap::new();
        for name in &self.apps {
            let rows: Vec<&Row> = self.rows_of(name).collect();
            apps.insert(name.clone(), app_summary(&rows, dt, client));
        }
        let all: Vec<&Row> = self.rows.iter().collect();
        let mut total = app_summary(&all, dt, client);
        // Per interval, not per row: an interval is violated if any app is.
        let n = self.rows.len() / self.apps.len().max(1);
        let violated = |get: fn(&Row) -> Option<bool>| {
            let k = (0..n)
                .filter(|&i| {
                    self.rows[i * self.apps.len()..(i + 1) * self.apps.len()]
                        .iter()
                        .any(|r| get(r) == Some(true))
                })
                .count();
            if n > 0 {
                k as f64 / n as f64
            } else {
                0.0
            }
        };
        total.violation_fraction = violated(|r| r.violation);
        total.violation_fraction_fed = violated(|r| r.fed_violation);
        total.mean_cores = if n > 0 {
            total.core_seconds / (n as f64 * dt)
        } else {
            0.0
        };
        // `+ 0.0`: an empty float sum is -0.0, printed "-0".
        total.energy_j = (!self.node_power_w.is_empty())
            .then(|| self.node_power_w.iter().sum::<f64>() * dt + 0.0);
        total.time_to_recover_s = Vec::new();
        let oracle = self.oracle.clone().map(|o| Oracle {
            policy_ratio: total.core_seconds / o.core_seconds.max(1e-9),
            ..o
        });
        Summary {
            scenario: self.scenario.clone(),
            mode: self.mode.clone(),
            feedback: self.feedback.clone(),
            policy: self.policy.clone(),
            seed: self.seed,
            duration_s: n as f64 * dt,
            energy_is_estimate: self.energy_is_estimate,
            rejected_plans: self.rejected_plans,
            reverts: self.reverts,
            cannot_meet: self.cannot_meet,
            meta: self.meta.clone(),
            oracle,
            calibration_doubts: Vec::new(),
            apps,
            total,
        }
    }
}

/// Figures of one app (or of the whole node in `total`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct AppSummary {
    /// Intervals in violation / intervals with a target, scored on the
    /// client's latency against the client-side target (what users see),
    /// whatever fed the policy: the one yardstick every run is scored on.
    pub violation_fraction: f64,
    /// Same, scored on the latency that fed the policy against its own
    /// target (the policy's view).
    #[serde(default)]
    pub violation_fraction_fed: f64,
    /// Scored on each latency source against its own side's target.
    pub violation_fraction_client: Option<f64>,
    pub violation_fraction_ebpf: Option<f64>,
    /// Σ cores × interval, core·s.
    pub core_seconds: f64,
    pub mean_cores: f64,
    /// Σ CPU quota in force × interval, CPU·s: the allocation of a run
    /// that moves quota (where apps share CPUs core·s reads 0); `None`
    /// when no interval had a quota.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota_cpu_seconds: Option<f64>,
    /// Σ power × interval, J (the app's share; node total in `total`);
    /// `None` when the run had no power figure (not a zero).
    pub energy_j: Option<f64>,
    /// Highest p99 of the latency the policy was fed, ms.
    pub p99_max_ms: Option<f64>,
    /// Length of each violation episode until the first good interval, s.
    pub time_to_recover_s: Vec<f64>,
    /// Mean throughput of the best-effort batch job(s) over the intervals
    /// that report one, ops/s (summed over jobs in `total`); `None` when no
    /// app runs a job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub be_ops_per_s_mean: Option<f64>,
}

fn app_summary(rows: &[&Row], dt: f64, client: bool) -> AppSummary {
    let judged: Vec<&&Row> = rows.iter().filter(|r| r.violation.is_some()).collect();
    let frac = |n: usize, d: usize| if d > 0 { n as f64 / d as f64 } else { 0.0 };
    let by = |get: fn(&Row) -> Option<f64>, target: fn(&Row) -> Option<f64>| {
        let with: Vec<(f64, f64)> = rows
            .iter()
            .filter_map(|r| Some((get(r)?, target(r)?)))
            .collect();
        (!with.is_empty()).then(|| frac(with.iter().filter(|(l, t)| l > t).count(), with.len()))
    };
    let mut episodes = Vec::new();
    let mut start: Option<f64> = None;
    for r in rows {
        match (r.violation, start) {
            (Some(true), None) => start = Some(r.t_s - dt),
            (Some(false), Some(s)) => {
                episodes.push(((r.t_s - dt - s) * 1000.0).round() / 1000.0);
                start = None;
            }
            _ => {}
        }
    }
    let core_seconds: f64 = rows.iter().map(|r| r.cores.unwrap_or(0) as f64 * dt).sum();
    let fed = |r: &Row| {
        if client {
            r.client_p99_ms
        } else {
            r.ebpf_p99_ms
        }
    };
    AppSummary {
        violation_fraction: frac(
            judged.iter().filter(|r| r.violation == Some(true)).count(),
            judged.len(),
        ),
        violation_fraction_fed: {
            let fed: Vec<bool> = rows.iter().filter_map(|r| r.fed_violation).collect();
            frac(fed.iter().filter(|v| **v).count(), fed.len())
        },
        violation_fraction_client: by(|r| r.client_p99_ms, |r| r.target_ms),
        violation_fraction_ebpf: by(|r| r.ebpf_p99_ms, |r| r.ebpf_target_ms.or(r.target_ms)),
        core_seconds,
        quota_cpu_seconds: rows.iter().any(|r| r.cpu_quota_milli.is_some()).then(|| {
            rows.iter()
                .filter_map(|r| r.cpu_quota_milli)
                .map(|q| f64::from(q) / 1000.0 * dt)
                .sum::<f64>()
        }),
        mean_cores: if rows.is_empty() {
            0.0
        } else {
            core_seconds / (rows.len() as f64 * dt)
        },
        energy_j: rows.iter().any(|r| r.power_w.is_some()).then(|| {
            rows.iter()
                .map(|r| r.power_w.unwrap_or(0.0) * dt)
                .sum::<f64>()
                + 0.0
        }),
        p99_max_ms: rows.iter().filter_map(|r| fed(r)).reduce(f64::max),
        time_to_recover_s: episodes,
        be_ops_per_s_mean: be_mean(rows),
    }
}

/// Mean ops/s per interval: the jobs' throughput summed within each
/// interval (`t_s`), averaged over the intervals with a figure.
fn be_mean(rows: &[&Row]) -> Option<f64> {
    let mut by_t: BTreeMap<u64, f64> = BTreeMap::new();
    for r in rows {
        if let Some(v) = r.be_ops_per_s.filter(|v| v.is_finite()) {
            *by_t.entry((r.t_s * 1000.0).round() as u64).or_default() += v;
        }
    }
    (!by_t.is_empty()).then(|| by_t.values().sum::<f64>() / by_t.len() as f64)
}

/// `summary.json`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Summary {
    pub scenario: String,
    pub mode: String,
    pub feedback: String,
    pub policy: String,
    pub seed: u64,
    pub duration_s: f64,
    pub energy_is_estimate: bool,
    pub rejected_plans: u64,
    /// Changes reverted by the policy over the run.
    #[serde(default)]
    pub reverts: u64,
    /// "Cannot meet QoS" events over the run (per app per decision).
    #[serde(default)]
    pub cannot_meet: u64,
    /// What the run was made with (see [`Timeline::meta`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub meta: BTreeMap<String, serde_json::Value>,
    /// On the simulated node: the least allocation that meets every
    /// target, interval by interval, and the run's core·s against it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oracle: Option<Oracle>,
    /// Why the run's calibration should not be trusted, one line per app
    /// ([`crate::calibrate::check::doubts`]); empty: nothing to say.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub calibration_doubts: Vec<String>,
    pub apps: BTreeMap<String, AppSummary>,
    pub total: AppSummary,
}

#[cfg(test)]
mod tests;
