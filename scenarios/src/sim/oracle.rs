//! The oracle baseline of a simulated run: for each decision interval, the
//! least allocation that meets every app's client-side target by the model
//! (the one yardstick), knowing the load in advance. Its core·s is the
//! lower bound a policy can reach on the same load and model.
//!
//! It sees the model as the simulated node runs it, tick by tick (the same
//! load at the same instants, the same lagging network queue), without
//! noise. Frequency is the highest (it costs no cores); cache ways are
//! split among the apps to need the fewest cores. An interval that no
//! allocation of the node meets is charged the whole node and counted:
//! the share of such intervals is the least violation any policy can
//! reach. Load past what the node can serve leaves a backlog, as on the
//! simulated node: the oracle carries it (drained on the most the other
//! apps leave), and the intervals whose percentile the draining backlog
//! still pushes over the target count as unmet too, the same ones any
//! policy violates after an overload (`infeasible_t_s` lists them all).

use serde::{Deserialize, Serialize};

use qosd_core::Share;

use super::model::{percentile, Queue, Sample, SimModel};
use super::MAX_BACKLOG_S;
use crate::calibrate::{network_load, network_queue_ms, Calibration};
use crate::scenario::{AppSpec, Scenario, SimNode};

/// What the oracle needed over a run (`summary.json`'s `oracle`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Oracle {
    /// Σ the least cores that meet every target × interval, core·s.
    pub core_seconds: f64,
    pub mean_cores: f64,
    pub intervals: u64,
    /// Intervals no allocation of the node meets (charged the whole node).
    pub infeasible_intervals: u64,
    /// `infeasible_intervals / intervals`: the least violation fraction
    /// any policy can reach on this load.
    pub violation_fraction: f64,
    /// When each infeasible interval ended, s of the run (a timeline
    /// row's `t_s`): `qosd compare` counts a run's violations beyond them.
    #[serde(default)]
    pub infeasible_t_s: Vec<f64>,
    /// The run's core·s over the oracle's: how far the policy is from the
    /// least allocation (filled in by the run's summary).
    #[serde(default)]
    pub policy_ratio: f64,
}

/// How the simulated run was clocked (as [`super::run_with`] drives it).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Clock {
    pub monitor_ms: u64,
    pub ticks_per_interval: u64,
    pub nr_intervals: u64,
    /// Scenario seconds per run second.
    pub scale: f64,
}

/// One app as the oracle sees it.
struct App<'a> {
    spec: &'a AppSpec,
    model: SimModel,
    /// Client-side target, µs (`None`: the app only needs its floor).
    target_us: Option<f64>,
    percentile: f64,
    capacity_rps: f64,
    net_q_ms: f64,
    /// Requests still queued from an overload, carried between intervals.
    backlog: f64,
}

/// The least allocation of every interval (`None`: no allocation of the
/// node meets every target), in scenario app order.
pub fn least_allocations(
    sc: &Scenario,
    cal: &Calibration,
    clock: Clock,
) -> Vec<Option<Vec<(String, Share)>>> {
    let mut apps: Vec<App> = sc
        .apps
        .iter()
        .map(|a| App {
            spec: a,
            model: SimModel::of(a),
            target_us: cal.target_us(a),
            percentile: a.target.as_ref().map_or(99.0, |t| t.percentile),
            capacity_rps: cal.apps.get(&a.name).map_or(1.0, |c| c.capacity_rps),
            net_q_ms: 0.0,
            backlog: 0.0,
        })
        .collect();
    let node = &sc.node;
    let dt = clock.monitor_ms as f64 / 1000.0;
    let per = clock.ticks_per_interval.max(1);
    let mut out = Vec::with_capacity(clock.nr_intervals as usize);
    for iv in 0..clock.nr_intervals {
        // Each app's arrival rate (per s) and client network delay (µs)
        // on every tick of the interval, as the simulated node has them.
        let ticks: Vec<Vec<(f64, f64)>> = apps
            .iter_mut()
            .map(|a| {
                (1..=per)
                    .map(|k| {
                        let now_s = ((iv * per + k) * clock.monitor_ms) as f64 / 1000.0;
                        let level = a.spec.load.level_at((now_s - dt / 2.0) * clock.scale);
                        let tau = a.model.network_tau_s.max(1e-6);
                        let rps = level * a.capacity_rps;
                        let target = network_queue_ms(&a.model, network_load(&a.model, rps, node));
                        a.net_q_ms += (target - a.net_q_ms) * (1.0 - (-dt / tau).exp());
                        (rps, (a.model.network_ms + a.net_q_ms) * 1000.0)
                    })
                    .collect()
            })
            .collect();
        let least = least_for_interval(&apps, &ticks, &sc.node, dt);
        carry_backlogs(&mut apps, &ticks, least.as_deref(), &sc.node, dt);
        out.push(least);
    }
    out
}

/// Moves each app's backlog on over the interval's ticks: under its
/// least allocation, or where none meets every target under the most the
/// others leave it (their least cores on one way, or one core each).
fn carry_backlogs(
    apps: &mut [App],
    ticks: &[Vec<(f64, f64)>],
    least: Option<&[(String, Share)]>,
    node: &SimNode,
    dt: f64,
) {
    let others_least: Vec<u32> = apps
        .iter()
        .zip(ticks)
        .map(|(a, t)| least_cores(a, t, node, 1.min(node.nr_ways), dt).unwrap_or(1))
        .collect();
    let n = apps.len() as u32;
    for (i, (a, t)) in apps.iter_mut().zip(ticks).enumerate() {
        let share = match least {
            Some(shares) => shares[i].1,
            None => Share {
                nr_cores: node
                    .nr_cores
                    .saturating_sub(
                        others_least
                            .iter()
                            .enumerate()
                            .filter(|(j, _)| *j != i)
                            .map(|(_, c)| c)
                            .sum(),
                    )
                    .max(1),
                nr_ways: node.nr_ways.saturating_sub(n - 1).max(1).min(node.nr_ways),
                freq_mhz: node.freq_max_mhz,
                ..Default::default()
            },
        };
        let (servers, s_us) = (
            a.model.servers(&share, node),
            a.model.service_time_us(&share, node),
        );
        a.backlog = drain(a.backlog, t, servers as f64 * 1e6 / s_us, dt).1;
    }
}

/// The backlog over the ticks at `lambda`s per s against a capacity of
/// `cap` requests/s, from `b0` requests, as the simulated node keeps it
/// (clients give up past `MAX_BACKLOG_S`): each tick's mean wait from the
/// backlog, µs, and what is left at the end.
fn drain(b0: f64, ticks: &[(f64, f64)], cap: f64, dt: f64) -> (Vec<f64>, f64) {
    let mut b = b0;
    let waits = ticks
        .iter()
        .map(|&(lambda, _)| {
            let before = b;
            let served = (b + lambda * dt).min(cap * dt);
            b = (b + lambda * dt - served).min(cap * MAX_BACKLOG_S);
            0.5 * (before + b) / cap * 1e6
        })
        .collect();
    (waits, b)
}

/// The oracle's figures over a run.
pub fn baseline(sc: &Scenario, cal: &Calibration, clock: Clock) -> Oracle {
    let iv_s = clock.ticks_per_interval.max(1) as f64 * clock.monitor_ms as f64 / 1000.0;
    let mut o = Oracle::default();
    for least in least_allocations(sc, cal, clock) {
        o.intervals += 1;
        let cores = match least {
            Some(shares) => shares.iter().map(|(_, s)| s.nr_cores).sum(),
            None => {
                o.infeasible_intervals += 1;
                o.infeasible_t_s.push(o.intervals as f64 * iv_s);
                sc.node.nr_cores
            }
        };
        o.core_seconds += cores as f64 * iv_s;
    }
    if o.intervals > 0 {
        o.mean_cores = o.core_seconds / (o.intervals as f64 * iv_s);
        o.violation_fraction = o.infeasible_intervals as f64 / o.intervals as f64;
    }
    o
}

/// The least cores `app` needs with `ways` ways at the highest frequency
/// to meet its target over the interval's ticks, or `None` if no number
/// of the node's cores does.
fn least_cores(app: &App, ticks: &[(f64, f64)], node: &SimNode, ways: u32, dt: f64) -> Option<u32> {
    let Some(target) = app.target_us else {
        return Some(1);
    };
    let meets = |c: u32| {
        let a = Share {
            nr_cores: c,
            nr_ways: ways,
            freq_mhz: node.freq_max_mhz,
            ..Default::default()
        };
        let s_us = app.model.service_time_us(&a, node);
        let servers = app.model.servers(&a, node);
        let cap = servers as f64 * 1e6 / s_us;
        // Below capacity on every tick, or a backlog builds up.
        if ticks.iter().any(|&(lambda, _)| lambda >= cap) {
            return false;
        }
        // A backlog carried in from an overload waits ahead of the queue.
        let (waits, _) = drain(app.backlog, ticks, cap, dt);
        let samples: Vec<Sample> = ticks
            .iter()
            .zip(waits)
            .map(|(&(lambda, net_us), wait_us)| Sample {
                queue: Queue::new(servers, s_us, app.model.service_cv, lambda * 1e-6),
                throttle: None,
                shift_us: app.model.fixed_us + wait_us,
                network_us: net_us,
                noise: 1.0,
                weight: (lambda * dt).max(1e-9),
            })
            .collect();
        percentile(&samples, app.percentile, true).is_some_and(|p| p <= target)
    };
    // Latency falls with cores (up to the app's parallelism): bisect.
    let most = node.nr_cores.max(1);
    if !meets(most) {
        return None;
    }
    let (mut lo, mut hi) = (0, most); // meets(hi), !meets(lo) or lo = 0
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if meets(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Some(hi)
}

/// The least allocation of one interval: the ways split among the apps
/// (each at least one, where the node partitions its cache) so that the
/// cores they need together are fewest.
fn least_for_interval(
    apps: &[App],
    ticks: &[Vec<(f64, f64)>],
    node: &SimNode,
    dt: f64,
) -> Option<Vec<(String, Share)>> {
    let share = |cores: u32, ways: u32| Share {
        nr_cores: cores,
        nr_ways: ways,
        freq_mhz: node.freq_max_mhz,
        ..Default::default()
    };
    if node.nr_ways == 0 {
        let mut shares = Vec::with_capacity(apps.len());
        for (a, t) in apps.iter().zip(ticks) {
            shares.push((
                a.spec.name.clone(),
                share(least_cores(a, t, node, 0, dt)?, 0),
            ));
        }
        let total: u32 = shares.iter().map(|(_, s)| s.nr_cores).sum();
        return (total <= node.nr_cores).then_some(shares);
    }
    let w_max = node.nr_ways as usize;
    // best[w]: the fewest cores of the apps so far using w ways in all,
    // with each app's (cores, ways).
    type Best = Vec<Option<(u32, Vec<(u32, u32)>)>>;
    let mut best: Best = vec![None; w_max + 1];
    best[0] = Some((0, Vec::new()));
    for (a, t) in apps.iter().zip(ticks) {
        // Ways beyond what the app's model needs buy nothing.
        let useful = a.model.ways_needed.clamp(1, node.nr_ways);
        let need: Vec<Option<u32>> = (1..=useful)
            .map(|w| least_cores(a, t, node, w, dt))
            .collect();
        let mut next: Best = vec![None; w_max + 1];
        for (used, b) in best.iter().enumerate() {
            let Some((cores, picks)) = b else { continue };
            for (i, n) in need.iter().enumerate() {
                let (w, Some(n)) = (i + 1, n) else { continue };
                if used + w > w_max {
                    break;
                }
                let total = cores + n;
                if next[used + w].as_ref().is_none_or(|(c, _)| total < *c) {
                    let mut p = picks.clone();
                    p.push((*n, w as u32));
                    next[used + w] = Some((total, p));
                }
            }
        }
        best = next;
    }
    let (total, picks) = best.into_iter().flatten().min_by_key(|(c, _)| *c)?;
    (total <= node.nr_cores).then(|| {
        apps.iter()
            .zip(picks)
            .map(|(a, (c, w))| (a.spec.name.clone(), share(c, w)))
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calibrate;

    /// 100 ms ticks, 500 ms intervals, on the scenario's own time axis.
    fn clock(nr_intervals: u64) -> Clock {
        Clock {
            monitor_ms: 100,
            ticks_per_interval: 5,
            nr_intervals,
            scale: 1.0,
        }
    }

    fn scenario(yaml: &str) -> Scenario {
        Scenario::parse(std::path::Path::new("t.yaml"), yaml).unwrap()
    }

    /// One app at a constant load: once the network queue has settled,
    /// the oracle's cores are the least for which the model's client p99,
    /// computed here from the model directly, meets the target.
    #[test]
    fn constant_load_gets_the_least_cores_that_meet_the_target() {
        for target_ms in [3.5, 4.0, 6.0] {
            let sc = scenario(&format!(
                "name: c\nduration_s: 60\nnode: {{nr_cores: 16, nr_ways: 0}}\napps:\n  - name: s\n    class: lc\n    server: {{kind: fixture, work_us: 1000}}\n    protocol: http\n    connections: 16\n    target: {{percentile: 99, ms: {target_ms}}}\n    load: {{kind: constant, level: 0.5}}\n"
            ));
            let cal = calibrate::sim(&sc);
            let clock = clock(120);
            let last = least_allocations(&sc, &cal, clock).pop().unwrap().unwrap();
            let got = last[0].1.nr_cores;
            let m = SimModel::of(&sc.apps[0]);
            let lambda = 0.5 * cal.apps["s"].capacity_rps;
            let net_us = (m.network_ms + network_queue_ms(&m, 0.5)) * 1000.0;
            let p99 = |c: u32| {
                let a = Share {
                    nr_cores: c,
                    freq_mhz: sc.node.freq_max_mhz,
                    ..Default::default()
                };
                let s_us = m.service_time_us(&a, &sc.node);
                if lambda >= m.servers(&a, &sc.node) as f64 * 1e6 / s_us {
                    return f64::INFINITY;
                }
                let q = Queue::new(m.servers(&a, &sc.node), s_us, m.service_cv, lambda * 1e-6);
                let s = Sample {
                    queue: q,
                    throttle: None,
                    shift_us: m.fixed_us,
                    network_us: net_us,
                    noise: 1.0,
                    weight: 1.0,
                };
                percentile(&[s], 99.0, true).unwrap()
            };
            let want = (1..=16).find(|&c| p99(c) <= target_ms * 1000.0);
            let want =
                want.unwrap_or_else(|| panic!("{:?}", (1..=16).map(p99).collect::<Vec<_>>()));
            assert_eq!(got, want, "target {target_ms} ms");
            assert!(want > 1, "the target needs more than one core");
            assert!(p99(got - 1) > target_ms * 1000.0);
            let o = baseline(&sc, &cal, clock);
            assert_eq!(o.infeasible_intervals, 0);
            assert!(o.mean_cores <= want as f64 + 1e-9, "{o:?}");
        }
    }

    /// An overload leaves a backlog: the intervals after the load falls
    /// back, until it has drained, are unmet too (no allocation ends
    /// them), and then the oracle meets the target again.
    #[test]
    fn an_overloads_backlog_keeps_the_following_intervals_unmet() {
        let sc = scenario(
            "name: c\nduration_s: 20\nnode: {nr_cores: 16, nr_ways: 0}\napps:\n  - name: s\n    class: lc\n    server: {kind: fixture, work_us: 1000}\n    protocol: http\n    connections: 16\n    target: {percentile: 99, knee_factor: 1.0}\n    load: {kind: ramp, from: 0.3, to: 1.2, start_s: 2, over_s: 0.5, hold_s: 4, back_s: 0.5}\n",
        );
        let cal = calibrate::sim(&sc);
        let o = baseline(&sc, &cal, clock(40));
        let level = |t: f64| sc.apps[0].load.level_at(t - 0.25);
        let after: Vec<f64> = o
            .infeasible_t_s
            .iter()
            .copied()
            .filter(|t| level(*t) < 0.31)
            .collect();
        // 2 s of clients' patience at 16 000 req/s, drained at 0.7 of it.
        assert!(after.len() >= 3, "{:?}", o.infeasible_t_s);
        assert!(after.iter().all(|t| *t > 6.5 && *t < 12.0), "{after:?}");
        assert_eq!(o.infeasible_intervals as usize, o.infeasible_t_s.len());
        assert!(!o.infeasible_t_s.contains(&20.0), "drained by the end");
    }

    /// A target no allocation meets is an infeasible interval charged the
    /// whole node; the ways go where they save the most cores.
    #[test]
    fn infeasible_intervals_and_the_ways_split() {
        let sc = scenario(
            "name: c\nduration_s: 10\nnode: {nr_cores: 8, nr_ways: 4}\napps:\n  - name: a\n    class: lc\n    server: {kind: fixture, work_us: 1000}\n    protocol: http\n    connections: 8\n    target: {percentile: 99, ms: 0.5}\n    load: {kind: constant, level: 0.5}\n",
        );
        let cal = calibrate::sim(&sc);
        let clock = clock(20);
        let o = baseline(&sc, &cal, clock);
        assert_eq!((o.intervals, o.infeasible_intervals), (20, 20));
        assert!((o.mean_cores - 8.0).abs() < 1e-9 && (o.violation_fraction - 1.0).abs() < 1e-12);
        let sc = scenario(&format!(
            "name: c\nduration_s: 60\nnode: {{nr_cores: 16, nr_ways: 6}}\napps:\n{}",
            ["a", "b"]
                .map(|n| format!("  - name: {n}\n    class: lc\n    server: {{kind: memcached, threads: 8}}\n    protocol: memcache\n    connections: 8\n    target: {{percentile: 99, knee_factor: 1.0}}\n    load: {{kind: constant, level: 0.6}}\n"))
                .concat()
        ));
        let cal = calibrate::sim(&sc);
        let clock = Clock {
            nr_intervals: 120,
            ..clock
        };
        let least = least_allocations(&sc, &cal, clock).pop().unwrap().unwrap();
        let ways: u32 = least.iter().map(|(_, s)| s.nr_ways).sum();
        assert!(
            ways <= 6 && least.iter().all(|(_, s)| s.nr_ways >= 1),
            "{least:?}"
        );
        // The split is the best of all splits: brute force over them.
        let m = SimModel::of(&sc.apps[0]);
        let lambda = 0.6 * cal.apps["a"].capacity_rps;
        let net_us = (m.network_ms + network_queue_ms(&m, 0.6)) * 1000.0;
        let ticks = vec![(lambda, net_us); 5]; // settled by the last interval
        let app = |i: usize| App {
            spec: &sc.apps[i],
            model: SimModel::of(&sc.apps[i]),
            target_us: cal.target_us(&sc.apps[i]),
            percentile: 99.0,
            capacity_rps: cal.apps[&sc.apps[i].name].capacity_rps,
            net_q_ms: 0.0,
            backlog: 0.0,
        };
        let (a, b) = (app(0), app(1));
        let brute = (1..6)
            .filter_map(|w| {
                Some(
                    least_cores(&a, &ticks, &sc.node, w, 0.1)?
                        + least_cores(&b, &ticks, &sc.node, 6 - w, 0.1)?,
                )
            })
            .min()
            .unwrap();
        assert_eq!(least[0].1.nr_cores + least[1].1.nr_cores, brute);
        assert!(
            least_cores(&a, &ticks, &sc.node, 1, 0.1) > least_cores(&a, &ticks, &sc.node, 5, 0.1),
            "ways matter to this model"
        );
    }
}
