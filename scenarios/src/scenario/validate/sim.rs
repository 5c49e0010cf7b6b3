//! The checks of a simulated node and of an app's service model: a
//! scenario's `node:` and `apps[i].sim`, and the same parts of a model file
//! fitted by `qosd calibrate --model`.

use super::{check, Fail};
use crate::scenario::{Seg, SimModelSpec, SimNode};

/// The most cache ways a simulated node may have (real last-level caches
/// have 11 to 20; a capacity bit mask has at most 32 bits).
pub const MAX_WAYS: u32 = 64;

/// The simulated node's values, under `base` (`node` in a scenario, a
/// model file's `node`): at least one core per app, sane ranges.
pub(crate) fn node_ok(n: &SimNode, nr_apps: usize, base: &[Seg]) -> Result<(), Fail> {
    let k = |key: &str| {
        let mut v = base.to_vec();
        v.push(Seg::Key(key.into()));
        v
    };
    check(
        n.nr_cores as usize >= nr_apps && n.nr_cores <= 1024,
        k("nr_cores"),
        || {
            format!(
                "{}: need at least one core per app ({nr_apps} apps), at most 1024",
                n.nr_cores,
            )
        },
    )?;
    check(
        n.freq_min_mhz > 0 && n.freq_min_mhz <= n.freq_max_mhz,
        k("freq_min_mhz"),
        || {
            format!(
                "{}..{} MHz: need 0 < min <= max",
                n.freq_min_mhz, n.freq_max_mhz
            )
        },
    )?;
    check(n.freq_step_mhz > 0, k("freq_step_mhz"), || {
        "must be > 0".into()
    })?;
    check(
        n.nr_ways == 0 || n.nr_ways as usize >= nr_apps && n.nr_ways <= MAX_WAYS,
        k("nr_ways"),
        || {
            format!(
                "{}: 0 (no cache partitioning) or at least one way per app, at most {MAX_WAYS}",
                n.nr_ways
            )
        },
    )?;
    check(n.freq_max_mhz <= 10_000, k("freq_max_mhz"), || {
        format!("{} MHz: at most 10000", n.freq_max_mhz)
    })?;
    check(
        n.quota_step_milli == 0
            || (10..=1000).contains(&n.quota_step_milli) && n.quota_step_milli < n.nr_cores * 1000,
        k("quota_step_milli"),
        || {
            format!(
                "{}: 0 (no quota knob) or 10..=1000 milli-CPUs, below the node's CPUs",
                n.quota_step_milli
            )
        },
    )?;
    check(
        (1_000..=1_000_000).contains(&n.cfs_period_us),
        k("cfs_period_us"),
        || format!("{}: must be 1000 to 1000000 (1 ms to 1 s)", n.cfs_period_us),
    )?;
    check(n.cfs_burst_pct <= 100, k("cfs_burst_pct"), || {
        format!("{}: must be 0 to 100 (% of the quota)", n.cfs_burst_pct)
    })?;
    for (key, v) in [
        ("idle_w", n.idle_w),
        ("core_busy_w", n.core_busy_w),
        ("core_idle_w", n.core_idle_w),
    ] {
        check(v.is_finite() && v >= 0.0, k(key), || {
            format!("{v}: must be >= 0")
        })?;
    }
    Ok(())
}

/// Overrides of an app's service model, under `base` (`apps[i].sim` in a
/// scenario, `apps.<name>` in a model file).
pub(crate) fn sim_spec_ok(m: &SimModelSpec, base: &[Seg]) -> Result<(), Fail> {
    let sp = |key: &str| {
        let mut v = base.to_vec();
        v.push(Seg::Key(key.into()));
        v
    };
    if let Some(v) = m.service_us {
        check(v > 0.0 && v <= 1e7, sp("service_us"), || {
            format!("{v}: must be in (0, 1e7]")
        })?;
    }
    if let Some(v) = m.service_cv {
        check(v > 0.0 && v <= 1.0, sp("service_cv"), || {
            format!("{v}: must be in (0, 1]")
        })?;
    }
    for (k, v) in [("freq_sensitivity", m.freq_sensitivity), ("noise", m.noise)] {
        if let Some(v) = v {
            check((0.0..=1.0).contains(&v), sp(k), || {
                format!("{v}: must be in [0, 1]")
            })?;
        }
    }
    for (k, v) in [
        ("cache_slowdown", m.cache_slowdown),
        ("fixed_us", m.fixed_us),
        ("network_ms", m.network_ms),
        ("network_tau_s", m.network_tau_s),
    ] {
        if let Some(v) = v {
            check(v.is_finite() && v >= 0.0, sp(k), || {
                format!("{v}: must be >= 0")
            })?;
        }
    }
    if let Some(v) = m.network_capacity_x {
        check(v > 0.0, sp("network_capacity_x"), || {
            format!("{v}: must be > 0")
        })?;
    }
    if let Some(v) = m.parallelism {
        check(v >= 1, sp("parallelism"), || "must be >= 1".into())?;
    }
    if let Some(v) = m.ways_needed {
        check(v >= 1, sp("ways_needed"), || "must be >= 1".into())?;
    }
    if let Some(v) = m.ops_per_cpu_s {
        check(v.is_finite() && v > 0.0, sp("ops_per_cpu_s"), || {
            format!("{v}: must be > 0")
        })?;
    }
    Ok(())
}
