//! The starting share of an app that appears (at start or later). Pooled
//! resources (cores, cache ways) must fit beside the apps already managed:
//! the configured `initial` amount, or when unset everything free, within
//! the app's min/max; when the free pool is short, other apps give units
//! above their own minimum (best-effort apps first, then the one holding
//! most). An app whose minimum cannot be met is not managed (it is still
//! monitored) until units free up. Levels (frequency, memory bandwidth,
//! CPU quota) start at `initial`, or as found (0) when unset; a quota is
//! then lowered to the app's cores (the rule of `qosd_core::quota`).

use std::collections::BTreeMap;

use crate::policy::{Allocations, AppClass, Decision, DecisionKind, Limits, NodeCaps, Share};
use crate::resources::Resource;

/// Class and limits of the apps already managed, by name.
pub type Peers = BTreeMap<String, (AppClass, Limits)>;

/// The share `app` starts with and what was taken from others for it
/// (applied to `current` already), or why it cannot be managed yet.
pub fn admit(
    node: &NodeCaps,
    current: &mut Allocations,
    peers: &Peers,
    app: &str,
    initial: Share,
    limits: Limits,
) -> Result<(Share, Vec<Decision>), String> {
    let mut share = Share::default();
    let mut taken = Vec::new();
    let mut next = current.clone();
    for r in Resource::ALL {
        let Some((nlo, nhi)) = node.range(r) else {
            continue; // the node cannot actuate it: left as found
        };
        let lo = nlo.max(limits.min.get(r)).min(nhi);
        let hi = nhi.min(limits.max.get(r)).max(lo);
        let Some(pool) = node.pool(r) else {
            // A level: as configured (clamped), else left as found.
            let v = initial.get(r);
            share.set(r, if v == 0 { 0 } else { v.clamp(lo, hi) });
            continue;
        };
        let used = |a: &Allocations| a.values().map(|s| s.get(r)).sum::<u32>();
        let want = match initial.get(r) {
            0 => pool.saturating_sub(used(&next)).clamp(lo, hi),
            v => v.clamp(lo, hi),
        };
        while pool.saturating_sub(used(&next)) < want {
            // The peer with the most units above its minimum, best-effort
            // apps first; ties go to the first name.
            let donor = next
                .iter()
                .filter_map(|(n, s)| {
                    let (class, l) = peers.get(n)?;
                    let spare = s.get(r).saturating_sub(l.min.get(r).max(1));
                    (spare > 0).then_some((n.clone(), *class == AppClass::Be, spare))
                })
                .max_by(|a, b| {
                    (a.1, a.2, std::cmp::Reverse(&a.0)).cmp(&(b.1, b.2, std::cmp::Reverse(&b.0)))
                });
            let Some((donor, _, _)) = donor else { break };
            let Some(s) = next.get_mut(&donor) else { break };
            let from = s.get(r);
            s.set(r, from - 1);
            taken.push(Decision {
                app: donor,
                resource: r,
                kind: DecisionKind::Reclaim,
                from,
                to: from - 1,
                reason: format!("for {app}, which started"),
            });
        }
        let free = pool.saturating_sub(used(&next));
        if free < lo {
            return Err(format!(
                "{r}: needs at least {lo} {}, {free} free and no app can give more",
                r.unit()
            ));
        }
        share.set(r, want.min(free));
    }
    if let Some(c) = crate::quota::ceiling_milli(&share, node) {
        share.cpu_quota_milli = share.cpu_quota_milli.min(c);
    }
    *current = next;
    Ok((share, taken))
}

/// The starting share replays ask for (real and simulated alike): app
/// `i` of `n` gets its even part of each pooled resource (the first
/// `total % n` apps one more), the highest frequency, and memory bandwidth
/// as found. CPU quota: none (all its cores) where cores are partitioned;
/// where apps share the CPUs (quota knob, no cores knob), its even part of
/// the node's CPUs in whole quota units, so that the quotas start within
/// the node (quota rule 2) and a policy has quota to move.
/// [`admit`] then fits it beside the apps admitted before it.
pub fn even_share(node: &NodeCaps, n: usize, i: usize) -> Share {
    let n = n.max(1) as u32;
    let i = i as u32;
    let part = |total: u32| total / n + u32::from(i < total % n);
    let quota = match node.quota {
        Some(q) if node.has(Resource::CpuQuota) && !node.has(Resource::Cores) => {
            let step = q.step_milli.max(1);
            part(q.max_milli / step) * step
        }
        _ => 0,
    };
    Share {
        nr_cores: part(node.nr_cores),
        nr_ways: part(node.nr_ways),
        freq_mhz: node.range(Resource::Frequency).map_or(0, |(_, hi)| hi),
        cpu_quota_milli: quota,
        ..Share::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(cores: u32) -> NodeCaps {
        NodeCaps {
            nr_cores: cores,
            nr_ways: 0,
            freq: None,
            mb: None,
            quota: None,
            ..Default::default()
        }
    }

    fn cores(n: u32) -> Share {
        Share {
            nr_cores: n,
            ..Default::default()
        }
    }

    fn limits(min: u32, max: u32) -> Limits {
        let mut l = Limits::default();
        l.min.nr_cores = min;
        l.max.nr_cores = max;
        l
    }

    #[test]
    fn initial_or_everything_free_within_limits() {
        let mut cur = Allocations::new();
        let peers = Peers::new();
        let (s, t) = admit(&node(4), &mut cur, &peers, "a", cores(1), Limits::default()).unwrap();
        assert_eq!((s.nr_cores, t.len()), (1, 0));
        cur.insert("a".into(), s);
        // Unset: all 3 free cores, but max 2.
        let (s, _) = admit(&node(4), &mut cur, &peers, "b", cores(0), limits(1, 2)).unwrap();
        assert_eq!(s.nr_cores, 2);
        // Levels the node lacks stay 0 (as found).
        assert_eq!((s.nr_ways, s.freq_mhz, s.mb_percent), (0, 0, 0));
    }

    #[test]
    fn short_pool_takes_from_best_effort_first_then_refuses() {
        let mut cur = Allocations::new();
        cur.insert("lc".into(), cores(2));
        cur.insert("be".into(), cores(2));
        let mut peers = Peers::new();
        peers.insert("lc".into(), (AppClass::Lc, Limits::default()));
        peers.insert("be".into(), (AppClass::Be, Limits::default()));
        let (s, t) = admit(
            &node(4),
            &mut cur,
            &peers,
            "new",
            cores(1),
            Limits::default(),
        )
        .unwrap();
        assert_eq!(s.nr_cores, 1);
        assert_eq!(t.len(), 1);
        assert_eq!((t[0].app.as_str(), t[0].from, t[0].to), ("be", 2, 1));
        assert_eq!(cur["be"].nr_cores, 1);
        cur.insert("new".into(), s);
        peers.insert("new".into(), (AppClass::Lc, Limits::default()));
        // Now lc (2) gives one: be and new are at their minimum of 1.
        let (s, t) = admit(&node(4), &mut cur, &peers, "x", cores(1), Limits::default()).unwrap();
        assert_eq!((s.nr_cores, t[0].app.as_str()), (1, "lc"));
        cur.insert("x".into(), s);
        peers.insert("x".into(), (AppClass::Lc, Limits::default()));
        // Everyone at 1 of 4: a fifth app cannot be managed.
        let before = cur.clone();
        let e = admit(&node(4), &mut cur, &peers, "y", cores(1), Limits::default()).unwrap_err();
        assert!(e.contains("cores: needs at least 1"), "{e}");
        assert_eq!(cur, before, "a refusal takes nothing");
    }

    #[test]
    fn even_share_splits_quota_only_where_apps_share_cpus() {
        let q = |cores: u32| NodeCaps {
            quota: Some(crate::QuotaRange {
                step_milli: 300,
                max_milli: 2000,
            }),
            ..node(cores)
        };
        // 2 shared CPUs in 0.3-CPU units: 6 whole units (0.2 CPU left
        // free), 2 + 2 + 2 for 3 apps, 3 + 3 for 2.
        let got: Vec<u32> = (0..3)
            .map(|i| even_share(&q(0), 3, i).cpu_quota_milli)
            .collect();
        assert_eq!(got, vec![600, 600, 600]);
        let got: Vec<u32> = (0..2)
            .map(|i| even_share(&q(0), 2, i).cpu_quota_milli)
            .collect();
        assert_eq!(got, vec![900, 900]);
        // Partitioned cores: no quota (each app runs on its own cores).
        assert_eq!(even_share(&q(2), 2, 0).cpu_quota_milli, 0);
        assert_eq!(even_share(&node(0), 2, 0).cpu_quota_milli, 0);
    }

    #[test]
    fn initial_quota_is_a_level_kept_within_the_cores_held() {
        let mut n = node(2);
        n.quota = Some(crate::QuotaRange {
            step_milli: 100,
            max_milli: 2000,
        });
        let peers = Peers::new();
        let q = |cores: u32, quota: u32| Share {
            nr_cores: cores,
            cpu_quota_milli: quota,
            ..Default::default()
        };
        let mut cur = Allocations::new();
        let (s, _) = admit(&n, &mut cur, &peers, "a", q(1, 700), Limits::default()).unwrap();
        assert_eq!((s.nr_cores, s.cpu_quota_milli), (1, 700));
        // 1.5 CPU on one core: lowered to the core (quota <= cores held).
        let mut cur = Allocations::new();
        let (s, _) = admit(&n, &mut cur, &peers, "a", q(1, 1500), Limits::default()).unwrap();
        assert_eq!(s.cpu_quota_milli, 1000);
        // Unset stays unset (no quota), and without the knob nothing is set.
        let (s, _) = admit(&n, &mut cur, &peers, "b", q(1, 0), Limits::default()).unwrap();
        assert_eq!(s.cpu_quota_milli, 0);
        let mut cur = Allocations::new();
        let (s, _) = admit(
            &node(2),
            &mut cur,
            &peers,
            "c",
            q(1, 700),
            Limits::default(),
        )
        .unwrap();
        assert_eq!(s.cpu_quota_milli, 0);
    }
}
