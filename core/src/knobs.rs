//! The knob table: one [`Knob`] row per [`Resource`], holding everything
//! that differs from knob to knob (names, unit, which [`Share`] and
//! [`Allocation`] field holds it, what the node offers of it, how
//! `/metrics` and the API show it, which amounts a config may give it).
//! Code that handles "every knob" iterates [`KNOBS`] instead of matching on
//! `Resource`; adding a knob is a variant, its fields and one row here
//! (then its actuator: a row of `actuators/src/detect.rs`; see
//! `docs/extending.md`).

use crate::policy::AppClass;
use crate::resources::{Allocation, NodeCaps, Resource, Share};

/// [`Resource::CpuPriority`]: the idle class (best-effort work).
pub const PRIORITY_IDLE: u32 = 1;
/// [`Resource::CpuPriority`]: normal weight.
pub const PRIORITY_NORMAL: u32 = 2;
/// [`Resource::CpuPriority`]: a latency-critical app's threads real-time
/// (`SCHED_FIFO` 1 with reset-on-fork) inside an RT budget for its group;
/// see docs/sharing-rt.md. Opt-in: no class defaults to it, and the
/// policy's range stops at normal (the gate that asks for it is the
/// loop's, issue 20); a config or `qosd set` may give it.
pub const PRIORITY_REALTIME: u32 = 3;

/// [`Resource::Hedge`]: requests not hedged.
pub const HEDGE_OFF: u32 = 1;
/// [`Resource::Hedge`]: requests hedged (the app's `hedge:` spec).
pub const HEDGE_ON: u32 = 2;

/// How `/metrics` exports a knob's level per app (a gauge).
#[derive(Debug, Clone, Copy)]
pub struct MetricSpec {
    /// The family name, e.g. `qosd_app_cores`.
    pub name: &'static str,
    pub help: &'static str,
    /// Factor from the [`Share`] unit to the metric's base unit (MHz → Hz).
    pub scale: f64,
}

/// One knob.
#[derive(Debug, Clone, Copy)]
pub struct Knob {
    pub resource: Resource,
    /// The snake_case name in JSON, YAML and messages.
    pub name: &'static str,
    /// The unit a [`Share`] counts it in.
    pub unit: &'static str,
    /// Partitioned from a node-wide pool (what one app has, another cannot).
    pub pooled: bool,
    /// Its key in a config's `resources: {initial, min, max}` and in a
    /// [`Share`]'s JSON.
    pub share_key: &'static str,
    /// Its key in the daemon's `/v1/apps` allocation object.
    pub api_key: &'static str,
    /// The amounts a config may give it (inclusive) and how to say so.
    pub config_range: (u32, u32, &'static str),
    /// Its name in rule conditions (`cores <= 1`), if rules may test it.
    pub rule_metric: Option<&'static str>,
    pub metric: MetricSpec,
    /// `qosd set` syntax, for help and docs.
    pub set_usage: &'static str,
    pub share: fn(&Share) -> u32,
    pub set_share: fn(&mut Share, u32),
    /// True when an [`Allocation`] sets it.
    pub in_alloc: fn(&Allocation) -> bool,
    /// Copies its field from the second allocation into the first.
    pub copy_alloc: fn(&mut Allocation, &Allocation),
    /// Puts a [`Share`] level into an [`Allocation`] as is; `None` for
    /// cores, whose CPU list the manager's core map chooses.
    pub level_alloc: Option<fn(&mut Allocation, u32)>,
    /// The node can actuate it.
    pub has: fn(&NodeCaps) -> bool,
    /// Lowest and highest value for one app (asked only when `has`).
    pub range: fn(&NodeCaps) -> Option<(u32, u32)>,
    /// One unit of the node's own granularity.
    pub step: fn(&NodeCaps) -> u32,
    /// Marks it absent (the config leaves it out of `enabled`).
    pub disable: fn(&mut NodeCaps),
    /// The level an app of this class starts with where nothing is
    /// configured (0: as found).
    pub class_default: fn(AppClass) -> u32,
    /// What a level never set (0, as found) counts as in a plan: the
    /// node's highest (a core unthrottled, at full speed) or, for a lever
    /// that is off until turned on, its lowest.
    pub found_at_max: bool,
}

/// Every knob, in [`Resource::ALL`] order (a test checks).
pub static KNOBS: [Knob; 7] = [
    Knob {
        resource: Resource::Cores,
        name: "cores",
        unit: "cores",
        pooled: true,
        share_key: "nr_cores",
        api_key: "cores",
        config_range: (1, u32::MAX, "at least 1"),
        rule_metric: Some("cores"),
        metric: MetricSpec {
            name: "qosd_app_cores",
            help: "Physical cores given to the app.",
            scale: 1.0,
        },
        set_usage: "qosd set cores --pid PID --cpus LIST [--backend cgroup2|cgroup1|affinity]",
        share: |s| s.nr_cores,
        set_share: |s, v| s.nr_cores = v,
        in_alloc: |a| a.cpus.is_some(),
        copy_alloc: |d, s| d.cpus.clone_from(&s.cpus),
        level_alloc: None,
        has: |n| n.nr_cores > 0,
        range: |n| Some((1, n.nr_cores)),
        step: |_| 1,
        disable: |n| n.nr_cores = 0,
        class_default: |_| 0,
        found_at_max: true,
    },
    Knob {
        resource: Resource::Frequency,
        name: "frequency",
        unit: "MHz",
        pooled: false,
        share_key: "freq_mhz",
        api_key: "frequency_mhz",
        config_range: (1, u32::MAX, "at least 1"),
        rule_metric: Some("freq_mhz"),
        metric: MetricSpec {
            name: "qosd_app_frequency_hertz",
            help: "Frequency set on the app's cores.",
            scale: 1e6,
        },
        set_usage: "qosd set freq --cpus LIST --mhz MHZ [--backend cpufreq|cpupower]",
        share: |s| s.freq_mhz,
        set_share: |s, v| s.freq_mhz = v,
        in_alloc: |a| a.freq_mhz.is_some(),
        copy_alloc: |d, s| d.freq_mhz = s.freq_mhz,
        level_alloc: Some(|a, v| a.freq_mhz = Some(v)),
        has: |n| n.freq.is_some_and(|f| f.max_mhz > f.min_mhz),
        range: |n| n.freq.map(|f| (f.min_mhz, f.max_mhz)),
        step: |n| n.freq.map_or(1, |f| f.step_mhz.max(1)),
        disable: |n| n.freq = None,
        class_default: |_| 0,
        found_at_max: true,
    },
    Knob {
        resource: Resource::CacheWays,
        name: "cache_ways",
        unit: "ways",
        pooled: true,
        share_key: "nr_ways",
        api_key: "llc_ways",
        config_range: (1, u32::MAX, "at least 1"),
        rule_metric: Some("ways"),
        metric: MetricSpec {
            name: "qosd_app_llc_ways",
            help: "Last-level-cache ways given to the app.",
            scale: 1.0,
        },
        set_usage: "qosd set ways --pid PID --ways N [--backend resctrl|pqos]",
        share: |s| s.nr_ways,
        set_share: |s, v| s.nr_ways = v,
        in_alloc: |a| a.llc_ways.is_some(),
        copy_alloc: |d, s| d.llc_ways = s.llc_ways,
        level_alloc: Some(|a, v| a.llc_ways = Some(v)),
        has: |n| n.nr_ways > 0,
        range: |n| Some((1, n.nr_ways)),
        step: |_| 1,
        disable: |n| n.nr_ways = 0,
        class_default: |_| 0,
        found_at_max: true,
    },
    Knob {
        resource: Resource::MemoryBandwidth,
        name: "memory_bandwidth",
        unit: "%",
        pooled: false,
        share_key: "mb_percent",
        api_key: "memory_bandwidth_percent",
        config_range: (1, 100, "1 to 100"),
        rule_metric: Some("mb_percent"),
        metric: MetricSpec {
            name: "qosd_app_memory_bandwidth_ratio",
            help: "Memory-bandwidth throttle of the app (0..1).",
            scale: 0.01,
        },
        set_usage: "qosd set mb --pid PID --percent P",
        share: |s| s.mb_percent,
        set_share: |s, v| s.mb_percent = v,
        in_alloc: |a| a.mb_percent.is_some(),
        copy_alloc: |d, s| d.mb_percent = s.mb_percent,
        level_alloc: Some(|a, v| a.mb_percent = Some(v)),
        has: |n| n.mb.is_some_and(|m| m.min_percent < 100),
        range: |n| n.mb.map(|m| (m.min_percent, 100)),
        step: |n| n.mb.map_or(1, |m| m.step_percent.max(1)),
        disable: |n| n.mb = None,
        class_default: |_| 0,
        found_at_max: true,
    },
    Knob {
        resource: Resource::CpuQuota,
        name: "cpu_quota",
        unit: "m-CPU",
        pooled: false,
        share_key: "cpu_quota_milli",
        api_key: "cpu_quota_milli",
        config_range: (10, u32::MAX, "at least 10 (0.01 CPU)"),
        rule_metric: None,
        metric: MetricSpec {
            name: "qosd_app_cpu_quota_cpus",
            help: "CPU bandwidth (CFS quota) of the app, in CPUs.",
            scale: 0.001,
        },
        set_usage: "qosd set quota --pid PID --quota CPUS [--backend cgroup2|cgroup1]",
        share: |s| s.cpu_quota_milli,
        set_share: |s, v| s.cpu_quota_milli = v,
        in_alloc: |a| a.cpu_quota_milli.is_some(),
        copy_alloc: |d, s| d.cpu_quota_milli = s.cpu_quota_milli,
        level_alloc: Some(|a, v| a.cpu_quota_milli = Some(v)),
        has: |n| n.quota.is_some_and(|q| q.max_milli > q.step_milli),
        range: |n| n.quota.map(|q| (q.step_milli, q.max_milli)),
        step: |n| n.quota.map_or(1, |q| q.step_milli.max(1)),
        disable: |n| n.quota = None,
        class_default: |_| 0,
        found_at_max: true,
    },
    Knob {
        resource: Resource::CpuPriority,
        name: "cpu_priority",
        unit: "class",
        pooled: false,
        share_key: "cpu_priority",
        api_key: "cpu_priority",
        config_range: (
            PRIORITY_IDLE,
            PRIORITY_REALTIME,
            "1 (idle), 2 (normal) or 3 (realtime)",
        ),
        rule_metric: None,
        metric: MetricSpec {
            name: "qosd_app_cpu_priority",
            help: "CPU priority class of the app: 1 idle class (best-effort), 2 normal weight, 3 realtime (SCHED_FIFO 1 in an RT budget).",
            scale: 1.0,
        },
        set_usage: "qosd set priority --pid PID --class idle|normal|realtime",
        share: |s| s.cpu_priority,
        set_share: |s, v| s.cpu_priority = v,
        in_alloc: |a| a.cpu_priority.is_some(),
        copy_alloc: |d, s| d.cpu_priority = s.cpu_priority,
        level_alloc: Some(|a, v| a.cpu_priority = Some(v)),
        has: |n| n.cpu_priority,
        range: |_| Some((PRIORITY_IDLE, PRIORITY_NORMAL)),
        step: |_| 1,
        disable: |n| n.cpu_priority = false,
        // Best-effort work yields the CPU to latency-critical threads at
        // once; latency-critical apps keep the weight they were found at.
        class_default: |c| match c {
            AppClass::Be => PRIORITY_IDLE,
            AppClass::Lc => 0,
        },
        found_at_max: true,
    },
    Knob {
        resource: Resource::Hedge,
        name: "hedge",
        unit: "state",
        pooled: false,
        share_key: "hedge",
        api_key: "hedge",
        config_range: (HEDGE_OFF, HEDGE_ON, "1 (off) or 2 (on)"),
        rule_metric: Some("hedge"),
        metric: MetricSpec {
            name: "qosd_app_hedge_state",
            help: "Hedging of the app's UDP requests: 1 off, 2 on.",
            scale: 1.0,
        },
        set_usage: "qosd set hedge --pid PID --service IP:PORT --replica IP:PORT --t-hedge-ms MS",
        share: |s| s.hedge,
        set_share: |s, v| s.hedge = v,
        in_alloc: |a| a.hedge.is_some(),
        copy_alloc: |d, s| d.hedge = s.hedge,
        level_alloc: Some(|a, v| a.hedge = Some(v)),
        has: |n| n.hedge,
        range: |_| Some((HEDGE_OFF, HEDGE_ON)),
        step: |_| 1,
        disable: |n| n.hedge = false,
        // Only the config's `hedge:` spec (its `start`) turns it on.
        class_default: |_| 0,
        found_at_max: false,
    },
];

/// The row of `r`.
pub fn knob(r: Resource) -> &'static Knob {
    &KNOBS[r as usize]
}

/// `initial` with each knob's start level for an app of `class`
/// ([`Knob::class_default`]) where `initial` sets none: what every node
/// admits an app with (the daemon, real replays and the simulator alike).
pub fn with_class_defaults(mut initial: Share, class: AppClass) -> Share {
    for k in &KNOBS {
        if (k.share)(&initial) == 0 {
            (k.set_share)(&mut initial, (k.class_default)(class));
        }
    }
    initial
}

/// The knob whose [`Knob::share_key`] is `key`.
pub fn by_share_key(key: &str) -> Option<&'static Knob> {
    KNOBS.iter().find(|k| k.share_key == key)
}

// What the vocabulary types of `resources.rs` know of each knob, read
// from the table: here, so that the types sit below the table that
// names them.

impl Resource {
    /// The snake_case name used in JSON, YAML and messages.
    pub fn name(self) -> &'static str {
        knob(self).name
    }

    /// True for resources partitioned from a node-wide pool (cores, ways):
    /// what one app gets, another cannot have. Frequency, memory
    /// bandwidth and CPU quota are per-app levels (how quota is bounded by
    /// cores and by the node: [`crate::quota`]).
    pub fn is_pooled(self) -> bool {
        knob(self).pooled
    }

    /// The unit a [`Share`] counts this resource in.
    pub fn unit(self) -> &'static str {
        knob(self).unit
    }
}

impl Allocation {
    /// True when no resource is set.
    pub fn is_empty(&self) -> bool {
        self.resources().is_empty()
    }

    /// The resources this allocation sets.
    pub fn resources(&self) -> Vec<Resource> {
        Resource::ALL
            .into_iter()
            .filter(|&r| (knob(r).in_alloc)(self))
            .collect()
    }

    /// True when this allocation sets `r`.
    pub fn sets(&self, r: Resource) -> bool {
        (knob(r).in_alloc)(self)
    }

    /// Copies `src`'s setting of `r` over this one's, when `src` sets it.
    pub fn take(&mut self, src: &Allocation, r: Resource) {
        if src.sets(r) {
            (knob(r).copy_alloc)(self, src);
        }
    }

    /// This allocation with every setting `over` makes laid over it.
    pub fn merged(&self, over: &Allocation) -> Allocation {
        let mut out = self.clone();
        for r in Resource::ALL {
            out.take(over, r);
        }
        out
    }
}

impl Share {
    /// The value of one resource (cores, ways, MHz or percent).
    pub fn get(&self, r: Resource) -> u32 {
        (knob(r).share)(self)
    }

    /// Sets the value of one resource.
    pub fn set(&mut self, r: Resource, value: u32) {
        (knob(r).set_share)(self, value)
    }

    /// Every resource at `value` (e.g. `u32::MAX`: no ceiling on any knob).
    pub fn filled(value: u32) -> Share {
        let mut s = Share::default();
        for r in Resource::ALL {
            s.set(r, value);
        }
        s
    }
}

impl NodeCaps {
    /// True when the node can actuate this resource.
    pub fn has(&self, r: Resource) -> bool {
        (knob(r).has)(self)
    }

    /// The lowest and highest value of a resource for one app, before the
    /// app's own limits; `None` when the node lacks it.
    pub fn range(&self, r: Resource) -> Option<(u32, u32)> {
        if !self.has(r) {
            return None;
        }
        (knob(r).range)(self)
    }

    /// The node's own granularity of a resource (1 core, 1 way, the
    /// cpufreq step, the MBA granularity).
    pub fn granularity(&self, r: Resource) -> u32 {
        (knob(r).step)(self)
    }

    /// Total of a pooled resource on the node (cores, ways); `None` for
    /// per-app levels.
    pub fn pool(&self, r: Resource) -> Option<u32> {
        let k = knob(r);
        k.pooled.then(|| (k.range)(self).map_or(0, |(_, hi)| hi))
    }

    /// The node as a policy sees it when `r` is turned off (the config's
    /// `enabled` list leaves it out).
    pub fn disable(&mut self, r: Resource) {
        (knob(r).disable)(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_in_resource_order_and_names_match_serde() {
        assert_eq!(KNOBS.len(), Resource::ALL.len());
        for (k, r) in KNOBS.iter().zip(Resource::ALL) {
            assert_eq!(k.resource, r);
            assert_eq!(
                r as usize,
                Resource::ALL.iter().position(|x| *x == r).unwrap()
            );
            assert_eq!(
                serde_json::to_string(&r).unwrap(),
                format!("\"{}\"", k.name)
            );
        }
    }

    #[test]
    fn share_fields_round_trip_and_keys_match_serde() {
        let mut s = Share::default();
        for (i, k) in KNOBS.iter().enumerate() {
            (k.set_share)(&mut s, i as u32 + 3);
        }
        let json = serde_json::to_value(s).unwrap();
        for (i, k) in KNOBS.iter().enumerate() {
            assert_eq!((k.share)(&s), i as u32 + 3);
            assert_eq!(json[k.share_key], i as u32 + 3, "{}", k.share_key);
            assert_eq!(
                by_share_key(k.share_key).map(|x| x.resource),
                Some(k.resource)
            );
        }
    }

    #[test]
    fn best_effort_apps_start_in_the_idle_class() {
        let be = with_class_defaults(Share::default(), AppClass::Be);
        assert_eq!(be.cpu_priority, PRIORITY_IDLE);
        let lc = with_class_defaults(Share::default(), AppClass::Lc);
        assert_eq!(lc, Share::default());
        let set = Share {
            cpu_priority: PRIORITY_NORMAL,
            ..Share::default()
        };
        assert_eq!(with_class_defaults(set, AppClass::Be), set);
    }

    #[test]
    fn copy_alloc_copies_exactly_its_field() {
        let full = Allocation {
            cpus: Some(vec![1]),
            freq_mhz: Some(2),
            llc_ways: Some(3),
            mb_percent: Some(4),
            cpu_quota_milli: Some(5),
            cpu_priority: Some(1),
            hedge: Some(2),
        };
        for k in &KNOBS {
            let mut a = Allocation::default();
            (k.copy_alloc)(&mut a, &full);
            assert_eq!(a.resources(), vec![k.resource]);
        }
    }
}
