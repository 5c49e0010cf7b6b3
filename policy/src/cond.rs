//! Conditions of rule policies, written as `"<metric> <op> <value>"`
//! strings (`"slack < 0.05"`, `"latency > 20ms"`, `"cpu_util >= 0.8"`),
//! parsed once at load time (a bad one is reported with its line and key)
//! and evaluated against one app of a snapshot.

use std::fmt;

use qosd_core::{AppState, Resource, Snapshot};
use serde::{Deserialize, Serialize};

/// What a condition measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Metric {
    /// (target − latency) / target; latency-critical apps with requests only.
    Slack,
    /// Latency at the target's percentile, in µs (`20ms`, `500us` accepted).
    Latency,
    /// Requests per second.
    Rps,
    /// CPU utilisation of the app's cores, 0..1.
    CpuUtil,
    /// Power attributed to the app, W (only where a power sensor runs).
    PowerW,
    /// Node power, W (measured or estimated).
    NodePowerW,
    /// Current allocation of a resource (cores, ways, freq_mhz, mb_percent).
    Alloc(Resource),
    /// Operational analysis (paper 001, [`qosd_core::oa`]): utilisation
    /// U = X·D / c of the app's CPUs, 0..1 (above 1: past saturation).
    Util,
    /// 1 − X / X_sat: the share of its CPUs' capacity left.
    Headroom,
    /// Service demand D, CPU ms per request.
    DemandMs,
    /// Saturation throughput X_sat = c / D, requests/s.
    XSatRps,
}

const METRICS: &[(&str, Metric)] = &[
    ("slack", Metric::Slack),
    ("latency", Metric::Latency),
    ("rps", Metric::Rps),
    ("cpu_util", Metric::CpuUtil),
    ("power_w", Metric::PowerW),
    ("node_power_w", Metric::NodePowerW),
    ("util", Metric::Util),
    ("headroom", Metric::Headroom),
    ("demand_ms", Metric::DemandMs),
    ("x_sat_rps", Metric::XSatRps),
];

/// Every metric a condition may test: the measurements above, then each
/// knob's allocation under its [`qosd_core::Knob::rule_metric`] name.
fn metrics() -> impl Iterator<Item = (&'static str, Metric)> {
    let allocs = qosd_core::KNOBS
        .iter()
        .filter_map(|k| Some((k.rule_metric?, Metric::Alloc(k.resource))));
    METRICS.iter().copied().chain(allocs)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Lt,
    Le,
    Gt,
    Ge,
}

impl Op {
    fn as_str(self) -> &'static str {
        match self {
            Op::Lt => "<",
            Op::Le => "<=",
            Op::Gt => ">",
            Op::Ge => ">=",
        }
    }
}

/// One parsed condition. Serialised back as the string it came from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Condition {
    pub metric: Metric,
    pub op: Op,
    /// Threshold in the metric's base unit (µs for latency).
    pub value: f64,
    text: String,
}

impl TryFrom<String> for Condition {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
    }
}

impl From<Condition> for String {
    fn from(c: Condition) -> String {
        c.text
    }
}

impl fmt::Display for Condition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::str::FromStr for Condition {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        // Two-character operators first, so "<=" is not read as "<".
        let (pos, op) = [("<=", Op::Le), (">=", Op::Ge), ("<", Op::Lt), (">", Op::Gt)]
            .iter()
            .find_map(|(t, op)| s.find(t).map(|p| ((p, t.len()), *op)))
            .ok_or_else(|| {
                format!("`{s}`: expected `<metric> <op> <value>` with op one of < <= > >=")
            })?;
        let name = s[..pos.0].trim();
        let rhs = s[pos.0 + pos.1..].trim();
        let metric = metrics()
            .find(|(n, _)| *n == name)
            .map(|(_, m)| m)
            .ok_or_else(|| {
                let known: Vec<&str> = metrics().map(|(n, _)| n).collect();
                format!(
                    "`{s}`: unknown metric `{name}`; known: {}",
                    known.join(", ")
                )
            })?;
        let value = parse_value(metric, rhs).map_err(|e| format!("`{s}`: {e}"))?;
        Ok(Condition {
            metric,
            op,
            value,
            text: format!("{name} {} {rhs}", op.as_str()),
        })
    }
}

/// A number, with a time unit for latency (`us`, `µs`, `ms`, `s`; bare
/// numbers are µs) and an optional `W` for power.
fn parse_value(metric: Metric, rhs: &str) -> Result<f64, String> {
    let split = rhs
        .find(|c: char| !(c.is_ascii_digit() || matches!(c, '.' | '-' | '+' | 'e' | 'E')))
        .unwrap_or(rhs.len());
    let (num, unit) = (rhs[..split].trim(), rhs[split..].trim());
    let v: f64 = num
        .parse()
        .map_err(|_| format!("`{rhs}` is not a number"))?;
    if !v.is_finite() {
        return Err(format!("`{rhs}` is not a finite number"));
    }
    let scale = match (metric, unit) {
        (_, "") => 1.0,
        (Metric::Latency, "us" | "µs") => 1.0,
        (Metric::Latency, "ms") => 1e3,
        (Metric::Latency, "s") => 1e6,
        (Metric::PowerW | Metric::NodePowerW, "W") => 1.0,
        (Metric::Latency, u) => return Err(format!("unknown time unit `{u}` (us, ms, s)")),
        (_, u) => return Err(format!("unexpected unit `{u}`")),
    };
    // `1e308ms` is finite as written but not in µs.
    let v = v * scale;
    if !v.is_finite() {
        return Err(format!("`{rhs}` is out of range"));
    }
    Ok(v)
}

impl Metric {
    /// The metric's value for `app`, which holds `alloc(r)` of each
    /// resource and `cpus` CPUs ([`qosd_core::oa::cpus_held`]); `None` when
    /// unknown (no requests, no power sensor, a BE app's slack), which
    /// makes a condition false.
    pub fn value(
        self,
        app: &AppState,
        snap: &Snapshot,
        alloc: &dyn Fn(Resource) -> u32,
        cpus: Option<f64>,
    ) -> Option<f64> {
        match self {
            Metric::Slack => app.slack(),
            Metric::Latency => app.latency_us,
            Metric::Rps => Some(app.rps),
            Metric::CpuUtil => Some(app.cpu_util),
            Metric::PowerW => app.power_w,
            Metric::NodePowerW => snap.node_power_w,
            Metric::Alloc(r) => Some(f64::from(alloc(r))),
            Metric::Util | Metric::Headroom | Metric::DemandMs | Metric::XSatRps => {
                let oa = qosd_core::oa::Oa::of(app.rps, app.cpus_used?, cpus?)?;
                Some(match self {
                    Metric::Util => oa.util,
                    Metric::Headroom => oa.headroom,
                    Metric::DemandMs => oa.demand_s * 1e3,
                    _ => oa.x_sat_rps,
                })
            }
        }
    }
}

impl Condition {
    /// True when the metric is known and compares as written; also returns
    /// the measured value for the decision's reason.
    pub fn eval(
        &self,
        app: &AppState,
        snap: &Snapshot,
        alloc: &dyn Fn(Resource) -> u32,
        cpus: Option<f64>,
    ) -> (bool, Option<f64>) {
        let Some(v) = self.metric.value(app, snap, alloc, cpus) else {
            return (false, None);
        };
        let holds = match self.op {
            Op::Lt => v < self.value,
            Op::Le => v <= self.value,
            Op::Gt => v > self.value,
            Op::Ge => v >= self.value,
        };
        (holds, Some(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::{lc, snap};

    fn c(s: &str) -> Condition {
        s.parse().unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn parses_metrics_ops_and_units() {
        assert_eq!(
            (c("slack < 0.05").metric, c("slack < 0.05").op),
            (Metric::Slack, Op::Lt)
        );
        assert_eq!(c("latency>20ms").value, 20_000.0);
        assert_eq!(c("latency >= 1.5 s").value, 1_500_000.0);
        assert_eq!(c("latency <= 800").value, 800.0);
        assert_eq!(c("node_power_w > 40W").value, 40.0);
        assert_eq!(c("cores <= 1").metric, Metric::Alloc(Resource::Cores));
        assert_eq!(c("slack<-0.1").value, -0.1);
        assert_eq!(c("slack<-0.1").to_string(), "slack < -0.1");
    }

    #[test]
    fn rejects_bad_conditions_with_the_reason() {
        let e = "lat < 3".parse::<Condition>().unwrap_err();
        assert!(
            e.contains("unknown metric `lat`") && e.contains("latency"),
            "{e}"
        );
        let e = "latency < 3 hours".parse::<Condition>().unwrap_err();
        assert!(e.contains("unknown time unit"), "{e}");
        let e = "slack = 3".parse::<Condition>().unwrap_err();
        assert!(e.contains("op one of"), "{e}");
        let e = "rps > lots".parse::<Condition>().unwrap_err();
        assert!(e.contains("not a number"), "{e}");
        let e = "rps > 5ms".parse::<Condition>().unwrap_err();
        assert!(e.contains("unexpected unit"), "{e}");
    }

    #[test]
    fn evaluates_against_an_app() {
        let s = snap(vec![lc("a", Some(0.02)), lc("idle", None)]);
        let alloc = |_: Resource| 2;
        let a = s.app("a").unwrap();
        assert!(c("slack < 0.05").eval(a, &s, &alloc, None).0);
        assert!(!c("slack > 0.05").eval(a, &s, &alloc, None).0);
        assert!(c("latency > 0.97ms").eval(a, &s, &alloc, None).0);
        assert!(c("cores >= 2").eval(a, &s, &alloc, None).0);
        // Unknown values make every comparison false.
        let idle = s.app("idle").unwrap();
        assert_eq!(
            c("slack < 0.05").eval(idle, &s, &alloc, None),
            (false, None)
        );
        assert_eq!(
            c("slack >= 0.05").eval(idle, &s, &alloc, None),
            (false, None)
        );
        assert!(!c("node_power_w > 1").eval(a, &s, &alloc, None).0);
    }

    #[test]
    fn operational_analysis_metrics() {
        // 1000 req/s on 2 cores using 1.5 CPUs: D 1.5 ms, U 0.75.
        let mut app = lc("a", Some(0.3));
        app.cpus_used = Some(1.5);
        let s = snap(vec![app]);
        let a = s.app("a").unwrap();
        let two = |r: Resource| u32::from(r == Resource::Cores) * 2;
        assert_eq!(
            c("util > 0.7").eval(a, &s, &two, Some(2.0)),
            (true, Some(0.75))
        );
        assert!(c("headroom < 0.3").eval(a, &s, &two, Some(2.0)).0);
        assert!(c("demand_ms >= 1.5").eval(a, &s, &two, Some(2.0)).0);
        let (_, x) = c("x_sat_rps > 1000").eval(a, &s, &two, Some(2.0));
        assert!((x.unwrap() - 1333.333).abs() < 0.01, "{x:?}");
        // On 1.6 CPUs (a quota below the cores: `oa::cpus_held`).
        let (_, u) = c("util > 0").eval(a, &s, &two, Some(1.6));
        assert!((u.unwrap() - 0.9375).abs() < 1e-9);
        // CPUs unknown: unknown.
        assert_eq!(c("util > 0").eval(a, &s, &two, None), (false, None));
        // No CPU time measured: unknown, the condition is false.
        let s = snap(vec![lc("b", Some(0.3))]);
        assert_eq!(
            c("util > 0").eval(s.app("b").unwrap(), &s, &two, Some(2.0)),
            (false, None)
        );
    }
}
