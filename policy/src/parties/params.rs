//! The parameters of a PARTIES policy file (`parties:` section), with the
//! paper's values as defaults and a validation pass that names the key.

use qosd_core::Resource;
use serde::{Deserialize, Serialize};

use crate::alloc::Victim;
use qosd_core::yamlfile::{Invalid, KeyPath};

/// One unit of each resource, as moved by a single decision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Steps {
    /// Cores per decision (PARTIES: 1).
    pub nr_cores: u32,
    /// LLC ways per decision (PARTIES: 1).
    pub nr_ways: u32,
    /// MHz per decision (PARTIES: 100).
    pub freq_mhz: u32,
    /// Memory-bandwidth percent per decision (resctrl's granularity is
    /// usually 10).
    pub mb_percent: u32,
    /// CPU quota per decision, milli-CPUs; 0 (the default) takes the
    /// node's unit (`actuators.cpu_quota_unit_milli`, 100 = 0.1 CPU).
    pub cpu_quota_milli: u32,
}

impl Default for Steps {
    fn default() -> Self {
        Steps {
            nr_cores: 1,
            nr_ways: 1,
            freq_mhz: 100,
            mb_percent: 10,
            cpu_quota_milli: 0,
        }
    }
}

impl Steps {
    /// The step of `r` on `node`: the configured one, or for a quota
    /// step of 0 the node's own unit.
    pub fn on(&self, r: Resource, node: &qosd_core::NodeCaps) -> u32 {
        match self.get(r) {
            0 => node.granularity(r),
            v => v,
        }
    }

    pub fn get(&self, r: Resource) -> u32 {
        match r {
            Resource::Cores => self.nr_cores,
            Resource::CacheWays => self.nr_ways,
            Resource::Frequency => self.freq_mhz,
            Resource::MemoryBandwidth => self.mb_percent,
            Resource::CpuQuota => self.cpu_quota_milli,
            // Knobs outside PARTIES' cycle (`Resource::CYCLE`) take no
            // step: the CPU priority is a class, hedging is on or off
            // (PARTIES turns it on only as a last resort,
            // `parties::last_resort`). A new knob lands here until it
            // joins the cycle with a step of its own.
            _ => 0,
        }
    }

    pub fn validate(&self, at: &KeyPath) -> Result<(), Invalid> {
        for (k, v) in [
            ("nr_cores", self.nr_cores),
            ("nr_ways", self.nr_ways),
            ("freq_mhz", self.freq_mhz),
            ("mb_percent", self.mb_percent),
        ] {
            if v == 0 {
                return Err(Invalid::new(at.key(k), "a step must be at least 1"));
            }
        }
        Ok(())
    }
}

/// The parameters of `policies/parties.yaml` (section `parties:`).
/// Defaults are the paper's values.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PartiesParams {
    /// Upsize the least-slack latency-critical app when its slack is below
    /// this (PARTIES: 0.05); if nothing can be given to it, the next
    /// violating app. Slack = (target − latency) / target.
    pub upsize_below_slack: f64,
    /// Otherwise downsize the most-slack app (not in cool-down) when its
    /// slack is above this (PARTIES: 0.20); if it cannot give anything (at
    /// its floor), the next most-slack one. Between the two: no change.
    pub downsize_above_slack: f64,
    /// Order in which each app tries resources; those the node lacks are
    /// skipped. Each app starts at a seeded position in this cycle.
    pub cycle: Vec<Resource>,
    /// One unit of each resource.
    pub step: Steps,
    /// An upsize helped when the app's latency fell (below its value at
    /// the decision) in more than this fraction of the following samples
    /// (0.5: the majority). Helped → same resource next; else the next one.
    pub helped_fraction: f64,
    /// After a downsize pushed any app below `upsize_below_slack`, it is
    /// reverted and the downsized app is not downsized again for this
    /// long, in ms (PARTIES: 30 s).
    pub downsize_cooldown_ms: u64,
    /// Each further harmful downsize of the same app in a row doubles its
    /// cool-down, up to this, ms (0: no doubling, every cool-down is
    /// `downsize_cooldown_ms`). A downsize that holds starts it over.
    pub downsize_cooldown_max_ms: u64,
    /// Slack assumed for a latency-critical app that served no request in
    /// the sensor window (idle: safe to downsize); `null` leaves such apps
    /// alone.
    pub idle_slack: Option<f64>,
    /// Where an upsize of cores or ways takes the unit from, in order.
    pub victims: Vec<Victim>,
    /// A latency-critical app is a victim only while its slack is above
    /// this. Default: the downsize threshold (0.20), so that a victim is an
    /// app that would be downsized anyway and does not take the unit back
    /// at the next decision (PARTIES' code uses its downsize threshold).
    pub victim_min_slack: f64,
    /// Freed cores/ways go to the best-effort app holding the fewest
    /// (true), or back to the free pool (false).
    pub freed_to_best_effort: bool,
    /// Slack is the lower of the current one and its moving average over
    /// this many monitoring samples (0: the current one only; PARTIES'
    /// code checks both).
    pub average_samples: u32,
    /// A downsize is reverted when the `first` sample after it finds an app
    /// below `upsize_below_slack`, only when the `majority` do (PARTIES'
    /// code: a majority vote), or on `evidence`: most requests measured
    /// since, and enough for the percentile, were in samples below it.
    pub revert_vote: RevertVote,
    /// When an app turns (upsize after downsize, or back), its resource
    /// wheel restarts at a seeded random position (PARTIES' code), instead
    /// of where it was.
    pub restart_wheel_on_turn: bool,
    /// While no action waits to be judged, decide this often, ms, at
    /// monitoring ticks between the decision intervals (0: only at the
    /// decision interval; PARTIES' code: 100).
    pub idle_decide_ms: u64,
    /// Operational analysis (paper 001) in the loop: a downsize whose
    /// predicted utilisation U = X·D / c on the smaller allocation exceeds
    /// this is not tried (logged in the plan's `skipped`), and an app
    /// whose utilisation already exceeds it is upsized before any other
    /// app is downsized. `null`: no such check (PARTIES).
    pub max_util: Option<f64>,
    /// Operational analysis again, for the tail: a downsize is not tried
    /// when the app's slack predicted on the smaller allocation falls
    /// below this. The prediction is its slack now less the growth of the
    /// target percentile's queueing wait that M/M/c (Erlang C) gives for
    /// the fewer CPUs at the same X and D ([`qosd_core::oa::wait_quantile_s`]),
    /// as a fraction of the SLO. A small pool queues long before
    /// `max_util`: 4 → 3 cores at U 0.59 adds ~4 ms to a p99 of 1 ms
    /// requests. `null`: no such check.
    pub min_predicted_slack: Option<f64>,
    /// Upsize also an app whose slack is predicted to fall below
    /// `upsize_below_slack` at the next decision interval's load: its
    /// throughput X's trend (least squares over this many decision
    /// intervals, rising only) gives the next interval's X, and the slack
    /// now less the growth of the percentile's queueing wait at that X on
    /// the same CPUs (M/M/c, [`qosd_core::oa::Oa::wait_growth_at`]) is the
    /// prediction. PARTIES upsizes only once slack is below the line, and
    /// the unit helps from the next interval on: on a climbing load the
    /// interval in between violates. `null`: only on measured slack.
    pub trend_upsize_intervals: Option<u32>,
    /// An app in the hysteresis band (slack between the two thresholds)
    /// also gives back one unit of CPU (cores or CPU quota) when its
    /// predicted utilisation on the smaller allocation stays below this:
    /// idle CPUs do not shorten a tail that queueing does not make, so
    /// slack alone would keep them forever. `null`: never (PARTIES).
    pub downsize_below_util: Option<f64>,
    /// Where apps share the CPUs (a quota knob and no cores knob), move the
    /// best-effort apps' quota (their cap) first: a latency-critical app
    /// stays uncapped and is capped only for another LC app, since a cap
    /// throttles it for the rest of each CFS period (not in PARTIES,
    /// which had no quota knob: false by default).
    pub quota_be_first: bool,
}

/// How a downsize is found harmful.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RevertVote {
    /// The first sample with an app below the upsize threshold.
    First,
    /// More than half of the samples since the downsize.
    Majority,
    /// More than half of the requests measured since the downsize (in
    /// samples below the threshold), and at least
    /// [`qosd_core::measure::samples_for_percentile`] of them: a sample of
    /// a few requests weighs little, one sample never decides.
    Evidence,
}

impl Default for PartiesParams {
    fn default() -> Self {
        PartiesParams {
            upsize_below_slack: 0.05,
            downsize_above_slack: 0.20,
            cycle: Resource::CYCLE.to_vec(),
            step: Steps::default(),
            helped_fraction: 0.5,
            downsize_cooldown_ms: 30_000,
            downsize_cooldown_max_ms: 0,
            idle_slack: Some(1.0),
            victims: vec![Victim::FreePool, Victim::BestEffort, Victim::MostSlackLc],
            victim_min_slack: 0.20,
            freed_to_best_effort: true,
            average_samples: 0,
            revert_vote: RevertVote::First,
            restart_wheel_on_turn: false,
            idle_decide_ms: 0,
            max_util: None,
            min_predicted_slack: None,
            trend_upsize_intervals: None,
            downsize_below_util: None,
            quota_be_first: false,
        }
    }
}

impl PartiesParams {
    /// Checks ranges; `at` is the path of the `parties:` section.
    pub fn validate(&self, at: &KeyPath) -> Result<(), Invalid> {
        slack_in_range(&at.key("upsize_below_slack"), self.upsize_below_slack)?;
        slack_in_range(&at.key("downsize_above_slack"), self.downsize_above_slack)?;
        slack_in_range(&at.key("victim_min_slack"), self.victim_min_slack)?;
        if self.upsize_below_slack >= self.downsize_above_slack {
            return Err(Invalid::new(
                at.key("downsize_above_slack"),
                format!(
                    "must be above upsize_below_slack ({}) or every app oscillates",
                    self.upsize_below_slack
                ),
            ));
        }
        if self.downsize_above_slack >= 1.0 {
            return Err(Invalid::new(
                at.key("downsize_above_slack"),
                "must be below 1.0 (slack never exceeds 1)",
            ));
        }
        if self.cycle.is_empty() {
            return Err(Invalid::new(at.key("cycle"), "needs at least one resource"));
        }
        for (i, r) in self.cycle.iter().enumerate() {
            if self.cycle[..i].contains(r) {
                return Err(Invalid::new(
                    at.key("cycle").index(i),
                    format!("{r} is listed twice"),
                ));
            }
        }
        self.step.validate(&at.key("step"))?;
        if !(0.0..1.0).contains(&self.helped_fraction) {
            return Err(Invalid::new(at.key("helped_fraction"), "must be in [0, 1)"));
        }
        if let Some(s) = self.idle_slack {
            slack_in_range(&at.key("idle_slack"), s)?;
        }
        if self.average_samples > 1000 {
            return Err(Invalid::new(
                at.key("average_samples"),
                "must be at most 1000",
            ));
        }
        if self.downsize_cooldown_max_ms != 0
            && self.downsize_cooldown_max_ms < self.downsize_cooldown_ms
        {
            return Err(Invalid::new(
                at.key("downsize_cooldown_max_ms"),
                format!(
                    "must be 0 (no doubling) or at least downsize_cooldown_ms ({})",
                    self.downsize_cooldown_ms
                ),
            ));
        }
        if self.idle_decide_ms > 3_600_000 {
            return Err(Invalid::new(
                at.key("idle_decide_ms"),
                "must be at most 3600000 (an hour)",
            ));
        }
        if let Some(u) = self.max_util {
            if !(u > 0.0 && u <= 1.0) {
                return Err(Invalid::new(
                    at.key("max_util"),
                    format!("{u}: a utilisation bound must be in (0, 1]"),
                ));
            }
        }
        if let Some(s) = self.min_predicted_slack {
            slack_in_range(&at.key("min_predicted_slack"), s)?;
        }
        if let Some(k) = self.trend_upsize_intervals {
            if k < 2 {
                return Err(Invalid::new(
                    at.key("trend_upsize_intervals"),
                    format!("{k}: a trend needs at least 2 intervals (null: off)"),
                ));
            }
        }
        if let Some(u) = self.downsize_below_util {
            if !(u > 0.0 && u <= self.max_util.unwrap_or(1.0)) {
                return Err(Invalid::new(
                    at.key("downsize_below_util"),
                    format!("{u}: must be in (0, max_util] (max_util or 1)"),
                ));
            }
        }
        validate_victims(&self.victims, &at.key("victims"))?;
        Ok(())
    }
}

/// A slack threshold: slack is (target − latency) / target, at most 1; a
/// threshold below −1 (latency twice the target) or a non-finite one makes
/// the controller never act, so it is refused.
pub(crate) fn slack_in_range(at: &KeyPath, v: f64) -> Result<(), Invalid> {
    if (-1.0..=1.0).contains(&v) {
        Ok(())
    } else {
        Err(Invalid::new(at.clone(), format!("{v}: must be in [-1, 1]")))
    }
}

/// A list of victims (PARTIES' or a rule policy's): at least one, none twice.
pub(crate) fn validate_victims(victims: &[Victim], at: &KeyPath) -> Result<(), Invalid> {
    if victims.is_empty() {
        return Err(Invalid::new(at.clone(), "needs at least one source"));
    }
    for (i, v) in victims.iter().enumerate() {
        if victims[..i].contains(v) {
            return Err(Invalid::new(at.index(i), "listed twice"));
        }
    }
    Ok(())
}
