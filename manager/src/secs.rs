//! Durations given on the command line as seconds (`--duration`,
//! `--interval`): one check for every flag, so NaN, infinities, negatives and
//! values too large for a `Duration` or a deadline (`1e20` used to panic in
//! `Duration::from_secs_f64`, `1e19` in `Instant + Duration`) are all usage
//! errors (exit 2) that name the flag and the range.

use std::time::Duration;

use crate::usage;

/// The longest run any command accepts: a year. Far below what an
/// `Instant` deadline or a `Duration` can hold, far above any real use.
pub const MAX_SECS: f64 = 366.0 * 86_400.0;

/// `v` seconds as a `Duration` when `min <= v <= max` (and `v > 0`), else a
/// usage error such as `--duration 1e20: expected seconds in (0, 31622400]`.
pub fn secs(flag: &str, v: f64, min: f64, max: f64) -> anyhow::Result<Duration> {
    let max = max.min(MAX_SECS);
    let ok = v.is_finite() && v > 0.0 && v >= min && v <= max;
    match Duration::try_from_secs_f64(v) {
        Ok(d) if ok && !d.is_zero() => Ok(d),
        _ if min > 0.0 => Err(usage!("{flag} {v}: expected seconds in [{min}, {max}]")),
        _ => Err(usage!("{flag} {v}: expected seconds in (0, {max}]")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_range_and_rejects_the_rest_as_usage_errors() {
        assert_eq!(
            secs("--interval", 0.5, 0.01, 3600.0).unwrap(),
            Duration::from_millis(500)
        );
        assert_eq!(
            secs("--duration", MAX_SECS, 0.0, f64::INFINITY).unwrap(),
            Duration::from_secs(MAX_SECS as u64)
        );
        for v in [
            0.0,
            -1.0,
            1e-12,
            1e19,
            1e20,
            f64::NAN,
            f64::INFINITY,
            3601.0,
        ] {
            let e = secs("--interval", v, 0.01, 3600.0).unwrap_err();
            assert!(e.chain().any(|c| c.is::<crate::exit::UsageError>()));
            assert!(e.to_string().starts_with("--interval "), "{e}");
        }
        let e = secs("--duration", 1e20, 0.0, f64::INFINITY).unwrap_err();
        assert_eq!(
            e.to_string(),
            "--duration 100000000000000000000: expected seconds in (0, 31622400]"
        );
        assert!(secs("--duration", 1e-300, 0.0, 10.0).is_err());
    }
}
