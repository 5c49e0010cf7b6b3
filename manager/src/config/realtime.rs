//! `realtime:`: when the loop's real-time gate gives real time to the
//! latency-critical apps that ask for it (`resources: { initial: {
//! cpu_priority: 3 } }`) and takes it back (docs/sharing-rt.md, "The
//! gate"). Node-wide, not per app: the bounds guard what the node's fair
//! class keeps (the batch job, qosd, sshd) and the node's one RT budget.
//! `budget_us` is that budget: the realtime app's group's RT time per
//! period, the one source of it for the daemon (`qosd set` takes
//! `--rt-budget-us`).

use qosd_actuators::realtime::{self, DEFAULT_BUDGET_US};
use qosd_core::control::rtgate::{RT_OFF_ABOVE, RT_ON_BELOW};
use serde::{Deserialize, Serialize};

use crate::yamlfile::{Invalid, KeyPath};

/// `realtime:` (every key optional).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RealtimeConfig {
    /// Real time is given while the app's CPU use is below this share of
    /// the CPUs it holds (its cores, its quota, else the node's), judged
    /// on decisions; in (0, 1), below `off_above` (default 0.6).
    #[serde(default = "default_on_below")]
    pub on_below: f64,
    /// ... and taken back within a monitoring tick once a tick's use is
    /// above this share, or a tick gives no reading; in (0, 1], above
    /// `on_below` (default 0.7).
    #[serde(default = "default_off_above")]
    pub off_above: f64,
    /// The RT budget of a realtime app's `qosd-<app>` cpu group
    /// (`cpu.rt_runtime_us`, cgroup v1 with RT group scheduling), µs of
    /// every 1 s period per CPU, 1..=1000000 and at most the root group's
    /// where that can be read (default 900000: docs/sharing-rt.md).
    #[serde(default = "default_budget_us")]
    pub budget_us: u64,
}

fn default_on_below() -> f64 {
    RT_ON_BELOW
}
fn default_off_above() -> f64 {
    RT_OFF_ABOVE
}
fn default_budget_us() -> u64 {
    DEFAULT_BUDGET_US
}

impl Default for RealtimeConfig {
    fn default() -> Self {
        RealtimeConfig {
            on_below: RT_ON_BELOW,
            off_above: RT_OFF_ABOVE,
            budget_us: DEFAULT_BUDGET_US,
        }
    }
}

impl RealtimeConfig {
    /// Both bounds shares of a CPU count, `on_below` < `off_above` (the
    /// hysteresis that keeps one noisy reading from flapping the class);
    /// the budget in range and, when an app asks for real time (`used`)
    /// and the cpu hierarchy under `root` (the actuators' root) has one,
    /// at most its root group's budget (the kernel's bound; a config with
    /// no realtime app does not fail on a node whose bound is lower).
    pub fn validate(
        &self,
        at: &KeyPath,
        root: &std::path::Path,
        used: bool,
    ) -> Result<(), Invalid> {
        realtime::check_budget(self.budget_us).map_err(|m| Invalid::new(at.key("budget_us"), m))?;
        let root = qosd_actuators::Root::new(root);
        let parent = used.then(|| realtime::parent_budget_us(&root)).flatten();
        if let Some((parent, file)) = parent {
            if self.budget_us > parent {
                return Err(Invalid::new(
                    at.key("budget_us"),
                    format!(
                        "{} µs is above this machine's root cpu group's RT budget, {parent} µs \
                         ({}): the kernel would refuse it",
                        self.budget_us,
                        root.show(&file)
                    ),
                ));
            }
        }
        for (key, v) in [("on_below", self.on_below), ("off_above", self.off_above)] {
            if !(v > 0.0 && v <= 1.0) {
                return Err(Invalid::new(
                    at.key(key),
                    format!("{v} is not a share of the app's CPUs in (0, 1]"),
                ));
            }
        }
        if self.on_below >= self.off_above {
            return Err(Invalid::new(
                at.key("on_below"),
                format!(
                    "{} must be below off_above ({}): real time is given below one \
                     bound and taken back above the other",
                    self.on_below, self.off_above
                ),
            ));
        }
        Ok(())
    }

    /// The gate for the apps named in `wants` with these bounds.
    pub fn gate(&self, wants: impl IntoIterator<Item = String>) -> qosd_core::control::RtGate {
        qosd_core::control::RtGate::with_bounds(wants, self.on_below, self.off_above)
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::config::Config;

    /// An LC app asking for real time, the actuators' root at `root`, and
    /// `realtime:` as given (line 8).
    fn config(root: &Path, realtime: &str) -> String {
        format!(
            "apps:\n  - name: web\n    match: {{ comm: nginx }}\n    class: lc\n    \
             target: {{ p99: 20ms }}\n    resources: {{ initial: {{ cpu_priority: 3 }} }}\n\
             actuators: {{ root: {} }}\n{realtime}\n",
            root.display()
        )
    }

    /// A fake v1 `cpu` hierarchy whose root group's budget is `parent`.
    fn tree(parent: &str) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        let cpu = d.path().join("sys/fs/cgroup/cpu");
        std::fs::create_dir_all(&cpu).unwrap();
        std::fs::write(cpu.join("cgroup.procs"), "").unwrap();
        std::fs::write(cpu.join("cpu.rt_runtime_us"), parent).unwrap();
        d
    }

    #[test]
    fn the_budget_is_a_key_checked_against_the_range_and_the_root_groups_budget() {
        let parse = |t: &str| Config::parse(Path::new("c.yaml"), t);
        let none = tempfile::tempdir().unwrap();
        let c = parse(&config(none.path(), "")).unwrap();
        assert_eq!(c.realtime.budget_us, 900_000);
        let c = parse(&config(none.path(), "realtime: { budget_us: 800000 }")).unwrap();
        assert_eq!(c.realtime.budget_us, 800_000);
        let root = tree("950000\n");
        // No root group's budget to read: only the range bounds it.
        assert!(parse(&config(none.path(), "realtime: { budget_us: 1000000 }")).is_ok());
        for (root, budget, msg) in [
            (none.path(), "0", "1..=1000000"),
            (none.path(), "1000001", "1..=1000000"),
            (
                root.path(),
                "960000",
                "root cpu group's RT budget, 950000 µs",
            ),
        ] {
            let text = config(root, &format!("realtime: {{ budget_us: {budget} }}"));
            let e = parse(&text).unwrap_err();
            assert_eq!((e.line, e.key.as_str()), (8, "realtime.budget_us"), "{e}");
            assert!(e.col > 1 && e.msg.contains(msg), "{e}");
        }
        let e = parse(&config(root.path(), "realtime: { budget_us: 960000 }")).unwrap_err();
        assert!(
            e.msg.contains("/sys/fs/cgroup/cpu/cpu.rt_runtime_us"),
            "{e}"
        );
        // At the root's budget: the kernel takes it (the children's sum
        // may equal the parent's). RT throttling off (-1): no bound.
        assert!(parse(&config(root.path(), "realtime: { budget_us: 950000 }")).is_ok());
        let off = tree("-1\n");
        assert!(parse(&config(off.path(), "realtime: { budget_us: 1000000 }")).is_ok());
        // No app asks for real time: the node's bound is not checked.
        let text = config(root.path(), "realtime: { budget_us: 960000 }").replace(
            "resources: { initial: { cpu_priority: 3 } }",
            "resources: {}",
        );
        assert!(parse(&text).is_ok());
    }
}
