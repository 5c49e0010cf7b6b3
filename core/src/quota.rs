//! CPU bandwidth (CFS quota) in the policy's terms, and the rule for how it
//! combines with cores. A quota is a ceiling on CPU time per period, counted
//! in thousandths of a CPU ("milli-CPUs": 300 = 0.3 CPU); cores (a cpuset)
//! say which CPUs an app may run on. The two multiply nothing: an app runs
//! at most `min(cores held, quota)` CPUs' worth ([`effective_milli`]).
//!
//! The rule policies keep ([`check`], [`ceiling_milli`]):
//!
//! 1. **Quota ≤ cores held.** A quota above the app's cores buys nothing,
//!    so a step there is wasted. Where the node has no cores knob, an app's
//!    cores are all of the node's CPUs.
//! 2. **Sum of quotas ≤ the node's CPUs where apps share CPUs** (no cores
//!    knob): each quota is then a share the app can count on, never an
//!    oversubscription. Where cores are partitioned, rule 1 bounds each app
//!    by its own cores, so the sum is bounded too. A quota at its ceiling
//!    (all the CPUs the app may run on) caps nothing and reserves nothing,
//!    so it is left out of the sum, like no quota: that is how an uncapped
//!    latency-critical app sits beside capped best-effort work.
//!
//! A share's quota of 0 means "no quota" (the app runs on all its cores).

use crate::policy::{Allocations, NodeCaps, Share};
use crate::resources::Resource;

/// Milli-CPUs in one CPU.
pub const MILLI_PER_CPU: u32 = 1000;

/// The CPUs an app may use under the cores knob, in milli-CPUs: its cores
/// when cores are actuated, else every CPU of the node. `None` when the
/// node has no quota knob (then nothing bounds it here).
fn cores_milli(share: &Share, node: &NodeCaps) -> Option<u32> {
    let q = node.quota?;
    if node.has(Resource::Cores) && share.nr_cores > 0 {
        Some(
            share
                .nr_cores
                .saturating_mul(MILLI_PER_CPU)
                .min(q.max_milli),
        )
    } else {
        Some(q.max_milli)
    }
}

/// Rule 1: the most quota `share` may hold on `node`.
pub fn ceiling_milli(share: &Share, node: &NodeCaps) -> Option<u32> {
    cores_milli(share, node)
}

/// The CPU time an app can use, in milli-CPUs: `min(cores, quota)`. With
/// no quota set (0) or no quota knob, its cores (or all CPUs where there
/// is no cores knob: `node_cpus_milli`).
pub fn effective_milli(share: &Share, node: &NodeCaps, node_cpus_milli: u32) -> u32 {
    let cores = if node.has(Resource::Cores) && share.nr_cores > 0 {
        share.nr_cores.saturating_mul(MILLI_PER_CPU)
    } else {
        node_cpus_milli
    };
    if node.quota.is_some() && share.cpu_quota_milli > 0 {
        cores.min(share.cpu_quota_milli)
    } else {
        cores
    }
}

/// A breach of the rule, for messages and tests.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuotaError {
    #[error(
        "app {app}: quota {quota_milli} m-CPU is above the {ceiling_milli} m-CPU of its cores"
    )]
    AboveCores {
        app: String,
        quota_milli: u32,
        ceiling_milli: u32,
    },
    #[error("quotas sum to {sum_milli} m-CPU, above the node's {max_milli} m-CPU of shared CPUs")]
    AboveNode { sum_milli: u32, max_milli: u32 },
}

/// Checks both rules over every app's share (apps with quota 0 have none).
pub fn check(allocs: &Allocations, node: &NodeCaps) -> Result<(), QuotaError> {
    let Some(q) = node.quota else {
        return Ok(());
    };
    let mut sum = 0u32;
    for (app, s) in allocs {
        if s.cpu_quota_milli == 0 {
            continue;
        }
        let ceiling = ceiling_milli(s, node).unwrap_or(q.max_milli);
        if s.cpu_quota_milli > ceiling {
            return Err(QuotaError::AboveCores {
                app: app.clone(),
                quota_milli: s.cpu_quota_milli,
                ceiling_milli: ceiling,
            });
        }
        if s.cpu_quota_milli < ceiling {
            sum = sum.saturating_add(s.cpu_quota_milli);
        }
    }
    if !node.has(Resource::Cores) && sum > q.max_milli {
        return Err(QuotaError::AboveNode {
            sum_milli: sum,
            max_milli: q.max_milli,
        });
    }
    Ok(())
}

/// Lowers each quota above its app's cores to the cores (rule 1), as a
/// policy must after taking cores away. Returns the apps changed.
pub fn clamp_to_cores(allocs: &mut Allocations, node: &NodeCaps) -> Vec<String> {
    let mut changed = Vec::new();
    for (app, s) in allocs.iter_mut() {
        let Some(c) = ceiling_milli(s, node) else {
            continue;
        };
        if s.cpu_quota_milli > c {
            s.cpu_quota_milli = c;
            changed.push(app.clone());
        }
    }
    changed
}

/// True when `share`'s quota caps it below its ceiling (rule 2 counts it).
pub fn capped(share: &Share, node: &NodeCaps) -> bool {
    share.cpu_quota_milli > 0
        && ceiling_milli(share, node).is_some_and(|c| share.cpu_quota_milli < c)
}

/// Quota left for one more app where apps share CPUs (rule 2): the node's
/// CPUs minus what the others hold below their ceilings. `None` without a
/// quota knob.
pub fn free_shared_milli(allocs: &Allocations, node: &NodeCaps, except: &str) -> Option<u32> {
    let q = node.quota?;
    let held: u32 = allocs
        .iter()
        .filter(|(a, s)| a.as_str() != except && capped(s, node))
        .map(|(_, s)| s.cpu_quota_milli)
        .sum();
    Some(q.max_milli.saturating_sub(held))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::QuotaRange;

    fn node(cores: u32, cpus: u32) -> NodeCaps {
        NodeCaps {
            nr_cores: cores,
            nr_ways: 0,
            freq: None,
            mb: None,
            quota: Some(QuotaRange {
                step_milli: 100,
                max_milli: cpus * MILLI_PER_CPU,
            }),
            ..Default::default()
        }
    }

    fn share(cores: u32, quota: u32) -> Share {
        Share {
            nr_cores: cores,
            cpu_quota_milli: quota,
            ..Default::default()
        }
    }

    #[test]
    fn effective_cpus_are_the_lesser_of_cores_and_quota() {
        let n = node(4, 4);
        assert_eq!(effective_milli(&share(2, 300), &n, 4000), 300);
        assert_eq!(effective_milli(&share(2, 3500), &n, 4000), 2000);
        assert_eq!(
            effective_milli(&share(2, 0), &n, 4000),
            2000,
            "0 = no quota"
        );
        // No cores knob: all CPUs are the app's cores.
        let n = node(0, 2);
        assert_eq!(effective_milli(&share(0, 700), &n, 2000), 700);
        assert_eq!(effective_milli(&share(0, 0), &n, 2000), 2000);
        // No quota knob: the quota field is ignored.
        let mut n = node(4, 4);
        n.quota = None;
        assert_eq!(effective_milli(&share(1, 300), &n, 4000), 1000);
    }

    #[test]
    fn quota_above_cores_breaks_rule_one_and_is_clamped() {
        let n = node(4, 4);
        let mut a = Allocations::new();
        a.insert("search".into(), share(1, 1500));
        a.insert("be".into(), share(3, 2000));
        let e = check(&a, &n).unwrap_err();
        assert!(
            matches!(e, QuotaError::AboveCores { ref app, quota_milli: 1500, ceiling_milli: 1000 } if app == "search"),
            "{e}"
        );
        assert_eq!(clamp_to_cores(&mut a, &n), vec!["search".to_string()]);
        assert_eq!(a["search"].cpu_quota_milli, 1000);
        assert_eq!(check(&a, &n), Ok(()));
    }

    #[test]
    fn shared_cpus_bound_the_sum_of_quotas() {
        // 2 CPUs, no cores knob: 1.5 + 0.7 CPUs oversubscribes.
        let n = node(0, 2);
        let mut a = Allocations::new();
        a.insert("search".into(), share(0, 1500));
        a.insert("be".into(), share(0, 700));
        assert_eq!(
            check(&a, &n),
            Err(QuotaError::AboveNode {
                sum_milli: 2200,
                max_milli: 2000
            })
        );
        assert_eq!(free_shared_milli(&a, &n, "be"), Some(500));
        a.get_mut("be").unwrap().cpu_quota_milli = 500;
        assert_eq!(check(&a, &n), Ok(()));
        // A quota at the ceiling (2 CPUs of 2) caps nothing: not counted.
        a.get_mut("search").unwrap().cpu_quota_milli = 2000;
        a.get_mut("be").unwrap().cpu_quota_milli = 1900;
        assert_eq!(check(&a, &n), Ok(()));
        assert_eq!(free_shared_milli(&a, &n, "search"), Some(100));
        assert_eq!(free_shared_milli(&a, &n, "be"), Some(2000));
        // With partitioned cores the sum is bounded by rule 1 alone.
        let n = node(2, 2);
        let mut a = Allocations::new();
        a.insert("search".into(), share(1, 1000));
        a.insert("be".into(), share(1, 1000));
        assert_eq!(check(&a, &n), Ok(()));
    }
}
