//! Rule policies: "when these conditions hold for an app, change this
//! resource", with priorities and cool-downs, written in YAML instead of
//! Rust. Each decision walks the rules by priority and the apps by urgency
//! (least slack first) and applies at most `max_actions` changes.

use std::collections::{BTreeMap, BTreeSet};

use qosd_core::{Allocations, AppClass, AppState, NodeCaps, Plan, Policy, Resource, Snapshot};
use serde::{Deserialize, Serialize};

use super::alloc::{Editor, Moves, Victim};
use super::cond::Condition;
use super::parties::{slack_in_range, validate_victims, Steps};
use qosd_core::yamlfile::{short, Invalid, KeyPath};

/// Settings of a rule policy (section `settings:`), all optional.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RuleSettings {
    /// Changes per decision at most (PARTIES makes one).
    pub max_actions: u32,
    /// One unit of each resource; an action's `change` counts these.
    pub step: Steps,
    /// Where a raise of cores or ways takes its units from, in order.
    pub victims: Vec<Victim>,
    /// A latency-critical victim must have more slack than this.
    pub victim_min_slack: f64,
    /// Freed cores/ways go to the best-effort app holding the fewest
    /// (true) or back to the free pool (false).
    pub freed_to_best_effort: bool,
}

impl Default for RuleSettings {
    fn default() -> Self {
        RuleSettings {
            max_actions: 1,
            step: Steps::default(),
            victims: vec![Victim::FreePool, Victim::BestEffort, Victim::MostSlackLc],
            victim_min_slack: 0.05,
            freed_to_best_effort: true,
        }
    }
}

/// Which apps a rule looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClassSel {
    /// Latency-critical apps only.
    #[default]
    Lc,
    /// Best-effort apps only.
    Be,
    /// Every app.
    Any,
}

/// One change: `change` steps of `resource` (+ raises, − lowers).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Action {
    pub resource: Resource,
    /// Signed number of steps (see `settings.step`), not zero.
    pub change: i32,
}

/// One rule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// Shown in the reason of every decision the rule makes.
    pub name: String,
    /// Higher priorities are tried first; equal ones in file order.
    #[serde(default)]
    pub priority: i32,
    /// Which class of apps the rule applies to (default `lc`).
    #[serde(default)]
    pub class: ClassSel,
    /// Only these apps (config names); empty: every app of the class.
    #[serde(default)]
    pub apps: Vec<String>,
    /// Conditions that must all hold, e.g. `"slack < 0.05"`,
    /// `"latency > 20ms"`, `"rps < 10"`, `"cpu_util > 0.8"`,
    /// `"power_w > 15"`, `"node_power_w > 100"`, `"cores > 1"`,
    /// `"freq_mhz > 1200"`. Empty: always.
    #[serde(default)]
    pub when: Vec<Condition>,
    /// Actions tried in order; the first one that can be applied is (one
    /// per firing). E.g. lower frequency, and only if it is at its minimum,
    /// take a core.
    pub then: Vec<Action>,
    /// After firing for an app, the rule leaves that app alone this long, ms.
    #[serde(default)]
    pub cooldown_ms: u64,
    /// Where this rule's raises of cores/ways take units from, instead of
    /// `settings.victims` (e.g. `[free_pool]` for best-effort growth).
    #[serde(default)]
    pub victims: Option<Vec<Victim>>,
}

impl RuleSettings {
    pub fn validate(&self, at: &KeyPath) -> Result<(), Invalid> {
        if self.max_actions == 0 {
            return Err(Invalid::new(at.key("max_actions"), "must be at least 1"));
        }
        self.step.validate(&at.key("step"))?;
        slack_in_range(&at.key("victim_min_slack"), self.victim_min_slack)?;
        validate_victims(&self.victims, &at.key("victims"))
    }
}

/// Checks a list of rules; `at` is the path of the `rules:` list.
pub fn validate_rules(rules: &[Rule], at: &KeyPath) -> Result<(), Invalid> {
    if rules.is_empty() {
        return Err(Invalid::new(at.clone(), "needs at least one rule"));
    }
    let mut names = std::collections::HashSet::new();
    for (i, r) in rules.iter().enumerate() {
        let here = at.index(i);
        if r.name.trim().is_empty() {
            return Err(Invalid::new(here.key("name"), "must not be empty"));
        }
        if !names.insert(r.name.as_str()) {
            return Err(Invalid::new(
                here.key("name"),
                format!("`{}` is used twice", short(&r.name)),
            ));
        }
        if let Some(v) = &r.victims {
            validate_victims(v, &here.key("victims"))?;
        }
        if r.then.is_empty() {
            return Err(Invalid::new(here.key("then"), "needs at least one action"));
        }
        for (j, a) in r.then.iter().enumerate() {
            if a.change == 0 {
                return Err(Invalid::new(
                    here.key("then").index(j).key("change"),
                    "must not be 0",
                ));
            }
        }
    }
    Ok(())
}

/// The rule engine. Build it with [`Rules::new`].
#[derive(Debug, Clone)]
pub struct Rules {
    name: String,
    settings: RuleSettings,
    /// Rules in the order they are tried.
    rules: Vec<Rule>,
    /// (rule index, app) → the rule may fire for the app again from then.
    cooling: BTreeMap<(usize, String), u64>,
}

impl Rules {
    /// An engine for validated `rules`. Rules have no randomness: the
    /// same inputs give the same plans.
    pub fn new(name: &str, settings: RuleSettings, rules: Vec<Rule>) -> Rules {
        let mut rules = rules;
        // Stable: equal priorities keep their file order.
        rules.sort_by_key(|r| std::cmp::Reverse(r.priority));
        Rules {
            name: name.to_owned(),
            settings,
            rules,
            cooling: BTreeMap::new(),
        }
    }

    fn selects(rule: &Rule, class: AppClass, name: &str) -> bool {
        let class_ok = match rule.class {
            ClassSel::Lc => class == AppClass::Lc,
            ClassSel::Be => class == AppClass::Be,
            ClassSel::Any => true,
        };
        class_ok && (rule.apps.is_empty() || rule.apps.iter().any(|a| a == name))
    }

    /// Applies the first applicable action of `rule` to `app`.
    fn fire(&self, ed: &mut Editor<'_>, rule: &Rule, app: &str, why: &str) -> bool {
        let moves = Moves {
            victims: rule.victims.as_deref().unwrap_or(&self.settings.victims),
            victim_min_slack: self.settings.victim_min_slack,
            freed_to_best_effort: self.settings.freed_to_best_effort,
        };
        let snap = ed.snap;
        let slack_of = |n: &str| snap.app(n).and_then(|a| a.slack());
        for a in &rule.then {
            // A step of 0 is the node's unit (the CPU quota's default).
            let step = self
                .settings
                .step
                .on(a.resource, ed.node)
                .saturating_mul(a.change.unsigned_abs());
            let reason = format!("rule `{}`: {why}", rule.name);
            let done = if a.change > 0 {
                ed.upsize(app, a.resource, step, &moves, &slack_of, reason)
                    .is_some()
            } else {
                ed.downsize(app, a.resource, step, &moves, reason)
            };
            if done {
                return true;
            }
        }
        false
    }
}

impl Policy for Rules {
    fn name(&self) -> &str {
        &self.name
    }

    fn decide(
        &mut self,
        now_ms: u64,
        snap: &Snapshot,
        current: &Allocations,
        node: &NodeCaps,
    ) -> Plan {
        let mut ed = Editor::new(node, snap, current);
        // Most urgent first: least slack, apps without a slack last, then name.
        let mut apps: Vec<(&AppState, Option<f64>)> = snap
            .apps
            .iter()
            .filter(|a| current.contains_key(&a.name))
            .map(|a| (a, a.slack()))
            .collect();
        apps.sort_by(|x, y| match (x.1, y.1) {
            (Some(a), Some(b)) => a.total_cmp(&b).then(x.0.name.cmp(&y.0.name)),
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (None, None) => x.0.name.cmp(&y.0.name),
        });
        let mut acted: BTreeSet<String> = BTreeSet::new();
        let mut fired = Vec::new();
        'rules: for (ri, rule) in self.rules.iter().enumerate() {
            for &(app, _) in &apps {
                if acted.len() as u32 >= self.settings.max_actions {
                    break 'rules;
                }
                let name = app.name.as_str();
                if acted.contains(name) || !Self::selects(rule, app.class, name) {
                    continue;
                }
                if self
                    .cooling
                    .get(&(ri, name.to_owned()))
                    .is_some_and(|&t| now_ms < t)
                {
                    continue;
                }
                let alloc = |r: Resource| ed.value(name, r);
                // The CPUs it holds, as operational analysis counts them
                // everywhere else.
                let cpus = qosd_core::oa::cpus_held(Some(&ed.alloc(name)), ed.node);
                // Reasons are formatted only for rules that fire.
                if !rule.when.iter().all(|c| c.eval(app, snap, &alloc, cpus).0) {
                    continue;
                }
                let why: Vec<String> = rule
                    .when
                    .iter()
                    .filter_map(|c| {
                        c.eval(app, snap, &alloc, cpus)
                            .1
                            .map(|v| format!("{c} (is {v:.3})"))
                    })
                    .collect();
                let why = if why.is_empty() {
                    "always".to_owned()
                } else {
                    why.join(", ")
                };
                if self.fire(&mut ed, rule, name, &why) {
                    acted.insert(name.to_owned());
                    fired.push((ri, name.to_owned()));
                }
            }
        }
        for (ri, name) in fired {
            let cd = self.rules[ri].cooldown_ms;
            if cd > 0 {
                self.cooling.insert((ri, name), now_ms + cd);
            }
        }
        ed.finish()
    }
}

#[cfg(test)]
mod tests;
