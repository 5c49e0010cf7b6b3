//! Values with units in config files: QoS targets written `p99: 25ms`
//! (percentile in the key, latency with a unit in the value).

use std::collections::BTreeMap;
use std::fmt;

use qosd_core::QosTarget;
use serde::{Deserialize, Serialize};
use serde_yaml_ng::Value;

/// The largest latency target: an hour, in µs.
pub const MAX_TARGET_US: f64 = 3.6e9;

/// Parses a latency such as `25ms`, `500us`, `500µs`, `1.5s` into µs.
/// A bare number is rejected: the unit is not guessed.
pub fn parse_latency_us(s: &str) -> Result<f64, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = (s[..split].trim(), s[split..].trim());
    let v: f64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a latency like 25ms, 500us or 1s"))?;
    let scale = match unit {
        "us" | "µs" => 1.0,
        "ms" => 1e3,
        "s" => 1e6,
        "" => return Err(format!("`{s}` needs a unit: us, ms or s (e.g. {s}ms)")),
        u => return Err(format!("`{s}`: unknown unit `{u}` (us, ms or s)")),
    };
    if v <= 0.0 || !v.is_finite() {
        return Err(format!("`{s}`: a target must be greater than 0"));
    }
    let us = v * scale;
    // Below a microsecond no latency is measured (and `{:.0}` prints 0).
    if us < 1.0 {
        return Err(format!("`{s}`: a target must be at least 1us"));
    }
    // Beyond an hour the slack arithmetic loses meaning (1e303s: NaN) and
    // no request-serving app has such a target.
    if us > MAX_TARGET_US {
        return Err(format!("`{s}`: a target must be at most 3600s"));
    }
    Ok(us)
}

/// Parses a percentile key: `p99`, `p99.9`, `p50`.
pub fn parse_percentile(key: &str) -> Result<f64, String> {
    let p: f64 = key
        .strip_prefix('p')
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| format!("`{key}` is not a percentile like p99 or p99.9"))?;
    if !(p > 0.0 && p <= 100.0) {
        return Err(format!("`{key}`: the percentile must be in (0, 100]"));
    }
    Ok(p)
}

/// A QoS target as written in a config: a one-entry map `{ p99: 25ms }`.
/// Kept as written and parsed by [`Target::parse`] in the validation pass,
/// so that an error names the exact key (`apps[0].target.p99`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Target(pub BTreeMap<String, Value>);

impl Target {
    /// The target, or the key at fault (None: the whole map) and why.
    pub fn parse(&self) -> Result<QosTarget, (Option<String>, String)> {
        let mut it = self.0.iter();
        let (Some((k, v)), None) = (it.next(), it.next()) else {
            return Err((
                None,
                "a target is one percentile and a latency, e.g. `p99: 25ms`".to_owned(),
            ));
        };
        let at = |m: String| (Some(k.clone()), m);
        let text = match v {
            Value::String(s) => s.clone(),
            // A bare number: say that the unit is missing, not "expected a string".
            Value::Number(n) => n.to_string(),
            _ => return Err(at("expected a latency like 25ms".to_owned())),
        };
        Ok(QosTarget::new(
            parse_percentile(k).map_err(at)?,
            parse_latency_us(&text).map_err(at)?,
        ))
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.parse() {
            Ok(t) => write!(
                f,
                "p{} <= {}",
                t.percentile,
                crate::policy::alloc::fmt_us(t.value_us)
            ),
            Err(_) => f.write_str("(invalid target)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latencies_need_a_known_unit_and_a_positive_value() {
        assert_eq!(parse_latency_us("25ms"), Ok(25_000.0));
        assert_eq!(parse_latency_us("500us"), Ok(500.0));
        assert_eq!(parse_latency_us("500µs"), Ok(500.0));
        assert_eq!(parse_latency_us("1.5 s"), Ok(1_500_000.0));
        assert!(parse_latency_us("25").unwrap_err().contains("needs a unit"));
        assert!(parse_latency_us("25 hours")
            .unwrap_err()
            .contains("unknown unit"));
        assert!(parse_latency_us("0ms")
            .unwrap_err()
            .contains("greater than 0"));
        assert!(parse_latency_us("fast")
            .unwrap_err()
            .contains("not a latency"));
    }

    #[test]
    fn percentiles() {
        assert_eq!(parse_percentile("p99"), Ok(99.0));
        assert_eq!(parse_percentile("p99.9"), Ok(99.9));
        assert!(parse_percentile("99").is_err());
        assert!(parse_percentile("p0").is_err());
        assert!(parse_percentile("p101").is_err());
    }

    #[test]
    fn targets_parse_with_the_key_at_fault() {
        let t: Target = serde_yaml_ng::from_str("{ p99.9: 2ms }").unwrap();
        assert_eq!(t.parse(), Ok(QosTarget::new(99.9, 2000.0)));
        assert_eq!(t.to_string(), "p99.9 <= 2.00 ms");
        let two: Target = serde_yaml_ng::from_str("{ p99: 1ms, p50: 1ms }").unwrap();
        assert_eq!(two.parse().unwrap_err().0, None);
        let bare: Target = serde_yaml_ng::from_str("{ p99: 25 }").unwrap();
        let (k, m) = bare.parse().unwrap_err();
        assert_eq!(k.as_deref(), Some("p99"));
        assert!(m.contains("needs a unit"), "{m}");
    }
}
