//! The config's semantic checks: what types alone cannot say (one way to
//! find each app, an `lc` app has a target, min ≤ initial ≤ max, intervals
//! that tick together). Each error carries the key it is about.

use std::collections::HashSet;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path};

use qosd_core::{AppClass, Resource};

use super::{amount_key, AppConfig, Config};
use crate::yamlfile::{Invalid, KeyPath};

/// Longest `/proc/PID/comm` (TASK_COMM_LEN − 1): a longer name never matches.
const COMM_MAX: usize = 15;
/// Longest app name: it becomes a cgroup and resctrl group name
/// (`qosd-<app>`, 255 bytes at most), an API path and a metric label.
pub const MAX_APP_NAME: usize = 64;
/// Slowest measurement tick (a minute) and decision tick (an hour): beyond
/// them the daemon would look idle, and u64::MAX ms never ticks at all.
const MAX_MONITOR_MS: u64 = 60_000;
const MAX_DECIDE_MS: u64 = 3_600_000;

impl Config {
    /// Checks the config beyond its types. The policy file is checked by
    /// [`Config::load`].
    pub fn validate(&self) -> Result<(), Invalid> {
        let root = KeyPath::root();
        if self.apps.is_empty() {
            return Err(Invalid::new(root.key("apps"), "needs at least one app"));
        }
        let mut names = HashSet::with_capacity(self.apps.len());
        for (i, app) in self.apps.iter().enumerate() {
            let at = root.key("apps").index(i);
            // Validated first: the duplicate message quotes a checked name.
            app.validate(&at)?;
            if !names.insert(app.name.as_str()) {
                return Err(Invalid::new(
                    at.key("name"),
                    format!("`{}` is used by an earlier app", app.name),
                ));
            }
        }
        self.validate_intervals(&root)?;
        if self.policy.as_os_str().is_empty() {
            return Err(Invalid::new(root.key("policy"), "must name a policy file"));
        }
        self.validate_actuators(&root.key("actuators"))?;
        self.validate_sensors(&root.key("sensors"))?;
        if let Err(qosd_sensors::power::PowerError::Config { key, reason }) = self.power.validate()
        {
            let path = key.split('.').fold(KeyPath::root(), |k, seg| k.key(seg));
            return Err(Invalid::new(path, reason));
        }
        self.api.validate(&root.key("api"))?;
        if let Some(k) = &self.kubernetes {
            k.validate(&root.key("kubernetes"))?;
        }
        if let Some(p) = &self.state_file {
            file_path_ok(p).map_err(|m| Invalid::new(root.key("state_file"), m))?;
        }
        let used = self.apps.iter().any(AppConfig::wants_realtime);
        self.realtime
            .validate(&root.key("realtime"), &self.actuators.root, used)?;
        Ok(())
    }

    /// The monitoring tick and the decision interval, a whole number of
    /// ticks.
    fn validate_intervals(&self, root: &KeyPath) -> Result<(), Invalid> {
        if !(10..=MAX_MONITOR_MS).contains(&self.monitor_interval_ms) {
            return Err(Invalid::new(
                root.key("monitor_interval_ms"),
                format!("must be from 10 to {MAX_MONITOR_MS} ms"),
            ));
        }
        if self.decide_interval_ms > MAX_DECIDE_MS {
            return Err(Invalid::new(
                root.key("decide_interval_ms"),
                format!("must be at most {MAX_DECIDE_MS} ms"),
            ));
        }
        if self.decide_interval_ms < self.monitor_interval_ms
            || !self
                .decide_interval_ms
                .is_multiple_of(self.monitor_interval_ms)
        {
            return Err(Invalid::new(
                root.key("decide_interval_ms"),
                format!(
                    "must be a multiple of monitor_interval_ms ({} ms), e.g. {} ms",
                    self.monitor_interval_ms,
                    self.monitor_interval_ms * 5
                ),
            ));
        }
        Ok(())
    }

    /// `actuators:`: the knobs listed once, the quota's unit and period,
    /// the root prefix.
    fn validate_actuators(&self, act: &KeyPath) -> Result<(), Invalid> {
        for (j, r) in self.actuators.enabled.iter().enumerate() {
            if self.actuators.enabled[..j].contains(r) {
                return Err(Invalid::new(
                    act.key("enabled").index(j),
                    format!("{r} is listed twice"),
                ));
            }
        }
        if !(10..=1000).contains(&self.actuators.cpu_quota_unit_milli) {
            return Err(Invalid::new(
                act.key("cpu_quota_unit_milli"),
                "must be 10 to 1000 (0.01 to 1 CPU)",
            ));
        }
        if let Some(p) = self.actuators.cpu_quota_period_us {
            if !qosd_actuators::config::PERIOD_RANGE_US.contains(&p) {
                return Err(Invalid::new(
                    act.key("cpu_quota_period_us"),
                    "must be 1000 to 1000000 (1 ms to 1 s)",
                ));
            }
        }
        if self.actuators.cpu_quota_burst_pct > 100 {
            return Err(Invalid::new(
                act.key("cpu_quota_burst_pct"),
                "must be 0 to 100 (% of the quota)",
            ));
        }
        if !self.actuators.root.is_absolute() {
            return Err(Invalid::new(act.key("root"), "must be an absolute path"));
        }
        Ok(())
    }

    /// `sensors:`: the ring buffer, the latency window, the net sensor.
    fn validate_sensors(&self, at: &KeyPath) -> Result<(), Invalid> {
        let s = &self.sensors;
        let max_kib = qosd_sensors::ebpf::MAX_RINGBUF_BYTES / 1024;
        if !(4..=max_kib).contains(&s.ring_buffer_kib) || !s.ring_buffer_kib.is_power_of_two() {
            return Err(Invalid::new(
                at.key("ring_buffer_kib"),
                format!("must be a power of two from 4 to {max_kib} (KiB)"),
            ));
        }
        if s.window_requests == 0 {
            return Err(Invalid::new(
                at.key("window_requests"),
                "must be at least 1",
            ));
        }
        if let Some(n) = &s.net {
            n.validate(&at.key("net"))?;
        }
        Ok(())
    }
}

/// Whether `p` is where a cgroup hierarchy is mounted (its root group),
/// from this machine's mount table.
fn is_cgroup_root(p: &Path) -> bool {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let want = p.components().collect::<Vec<_>>();
    mounts.lines().any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() >= 3
            && (f[2] == "cgroup" || f[2] == "cgroup2")
            && Path::new(f[1]).components().collect::<Vec<_>>() == want
    })
}

/// A path with no NUL byte or control character in it (a NUL cuts the
/// path the kernel sees; a newline forges output lines).
pub(super) fn plain_path(p: &Path) -> Result<(), String> {
    if p.as_os_str()
        .as_bytes()
        .iter()
        .any(|b| b.is_ascii_control())
    {
        return Err(format!(
            "{:?}: a path has no NUL byte or control character (newline, tab, ...)",
            p
        ));
    }
    Ok(())
}

/// A file qosd writes and reads back (state file, token file): an
/// absolute, plain path naming a file, and, if something is there
/// already, a regular file (not `/`, a directory or `/dev/null`): what
/// `run` would refuse, refused by `check` too.
pub(super) fn file_path_ok(p: &Path) -> Result<(), String> {
    if !p.is_absolute() {
        return Err("must be an absolute path".into());
    }
    plain_path(p)?;
    if p.file_name().is_none() || p.as_os_str().as_bytes().ends_with(b"/") {
        return Err(format!("{}: names a directory, not a file", p.display()));
    }
    match std::fs::symlink_metadata(p) {
        Ok(m) if m.is_dir() => Err(format!("{}: is a directory, not a file", p.display())),
        Ok(m) if !m.is_file() => Err(format!(
            "{}: exists and is not a regular file (a device, FIFO, socket or symlink)",
            p.display()
        )),
        _ => Ok(()),
    }
}

impl AppConfig {
    fn validate(&self, at: &KeyPath) -> Result<(), Invalid> {
        self.validate_name(at)?;
        self.validate_match(at)?;
        self.validate_target(at)?;
        if self.ports.contains(&0) {
            return Err(Invalid::new(
                at.key("ports"),
                "port 0 is not a listening port",
            ));
        }
        if let Some(h) = &self.hedge {
            h.validate(&at.key("hedge"))?;
        }
        self.validate_resources(&at.key("resources"))
    }

    /// The name names API paths, metric labels and the app's cgroup.
    fn validate_name(&self, at: &KeyPath) -> Result<(), Invalid> {
        let name_ok = !self.name.is_empty()
            && self
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
        if !name_ok {
            return Err(Invalid::new(
                at.key("name"),
                "use letters, digits, `_`, `-` or `.` (it appears in API paths and metric labels)",
            ));
        }
        if self.name.len() > MAX_APP_NAME {
            return Err(Invalid::new(
                at.key("name"),
                format!("at most {MAX_APP_NAME} characters (it names the app's cgroup)"),
            ));
        }
        Ok(())
    }

    /// Exactly one way to find the app's processes (none for a job qosd
    /// starts), and none that would take the whole node by mistake.
    fn validate_match(&self, at: &KeyPath) -> Result<(), Invalid> {
        let m = &self.matcher;
        let mat = at.key("match");
        let set = [
            m.pid.is_some(),
            m.comm.is_some(),
            m.cgroup.is_some(),
            m.pod.is_some(),
        ];
        let nr_set = set.iter().filter(|b| **b).count();
        if self.job.is_some() {
            self.validate_job(at)?;
            if nr_set > 0 {
                return Err(Invalid::new(
                    mat,
                    "an app with a `job` is the job's process, which qosd starts: drop `match`",
                ));
            }
        } else if nr_set != 1 {
            return Err(Invalid::new(
                mat,
                "needs exactly one of `pid`, `comm`, `cgroup` or `pod` (or, for a best-effort \
                 app, a `job` that qosd runs)",
            ));
        }
        if let Some(p) = &m.pod {
            p.validate(&mat.key("pod"))?;
        }
        if m.pid.is_some_and(|p| p <= 0) {
            return Err(Invalid::new(
                mat.key("pid"),
                "must be a positive process id",
            ));
        }
        if m.pid == Some(1) && !m.force {
            return Err(Invalid::new(
                mat.key("pid"),
                "pid 1 is init: its cores and quota are the whole node's; add `force: true` \
                 to `match` if that is meant",
            ));
        }
        if let Some(c) = &m.comm {
            if c.chars().any(char::is_control) {
                return Err(Invalid::new(
                    mat.key("comm"),
                    "a command name has no control characters (newline, tab, ...)",
                ));
            }
            if c.is_empty() || c.len() > COMM_MAX {
                return Err(Invalid::new(
                    mat.key("comm"),
                    format!(
                        "`{c}`: a command name is 1 to {COMM_MAX} bytes (the kernel truncates \
                         /proc/PID/comm), e.g. `{}`",
                        truncate(c, COMM_MAX)
                    ),
                ));
            }
        }
        if let Some(p) = &m.cgroup {
            if !p.is_absolute() {
                return Err(Invalid::new(mat.key("cgroup"), "must be an absolute path"));
            }
            plain_path(p).map_err(|m| Invalid::new(mat.key("cgroup"), m))?;
            if !m.force && is_cgroup_root(p) {
                return Err(Invalid::new(
                    mat.key("cgroup"),
                    format!(
                        "{} is the root of a cgroup hierarchy: every process on the node \
                         (qosd among them); add `force: true` to `match` if that is meant",
                        p.display()
                    ),
                ));
            }
            if p.components().any(|c| c == Component::ParentDir) {
                return Err(Invalid::new(
                    mat.key("cgroup"),
                    "must not contain `..` (it would leave the cgroup tree)",
                ));
            }
        }
        Ok(())
    }

    /// A latency-critical app has a target that parses; a best-effort app
    /// has none.
    fn validate_target(&self, at: &KeyPath) -> Result<(), Invalid> {
        if let Some(t) = &self.target {
            t.parse().map_err(|(k, msg)| {
                let key = at.key("target");
                Invalid::new(k.map_or(key.clone(), |k| key.key(&k)), msg)
            })?;
        }
        match (self.class, &self.target) {
            (AppClass::Lc, None) => {
                return Err(Invalid::new(
                    at.key("target"),
                    "a latency-critical app needs a target, e.g. `target: { p99: 25ms }`",
                ))
            }
            (AppClass::Be, Some(_)) => {
                return Err(Invalid::new(
                    at.key("target"),
                    "a best-effort app has no target (use class: lc)",
                ))
            }
            _ => {}
        }
        Ok(())
    }

    /// A batch job: best-effort, takes no requests, its own fields valid
    /// (the scenarios' checks).
    fn validate_job(&self, at: &KeyPath) -> Result<(), Invalid> {
        let Some(j) = &self.job else { return Ok(()) };
        if self.class != AppClass::Be {
            return Err(Invalid::new(
                at.key("job"),
                "a batch job is for best-effort apps (class: be)",
            ));
        }
        if !self.ports.is_empty() {
            return Err(Invalid::new(
                at.key("ports"),
                "a batch job takes no requests: drop `ports`",
            ));
        }
        j.check()
            .map_err(|(k, msg)| Invalid::new(at.key("job").key(k), msg))
    }

    fn validate_resources(&self, at: &KeyPath) -> Result<(), Invalid> {
        let r = &self.resources;
        for res in Resource::ALL {
            let key = amount_key(res);
            let (ini, min, max) = (r.initial.get(res), r.min.get(res), r.max.get(res));
            for (which, v) in [("initial", ini), ("min", min), ("max", max)] {
                let Some(v) = v else { continue };
                if res == Resource::CpuPriority && v == qosd_core::knobs::PRIORITY_REALTIME {
                    if self.class == AppClass::Be {
                        return Err(Invalid::new(
                            at.key(which).key(key),
                            "real time (3) is for latency-critical apps (class: lc)",
                        ));
                    }
                    if which != "initial" {
                        return Err(Invalid::new(
                            at.key(which).key(key),
                            "real time is asked for with `initial: { cpu_priority: 3 }` \
                             (the loop's gate decides when it applies)",
                        ));
                    }
                }
                let (lo, hi, range) = qosd_core::knob(res).config_range;
                if !(lo..=hi).contains(&v) {
                    return Err(Invalid::new(
                        at.key(which).key(key),
                        format!("must be {range}"),
                    ));
                }
            }
            if let (Some(lo), Some(hi)) = (min, max) {
                if lo > hi {
                    return Err(Invalid::new(
                        at.key("min").key(key),
                        format!("min {lo} is above max {hi}"),
                    ));
                }
            }
            if let Some(v) = ini {
                if min.is_some_and(|lo| v < lo) || max.is_some_and(|hi| v > hi) {
                    return Err(Invalid::new(
                        at.key("initial").key(key),
                        format!(
                            "initial {v} is outside [{}, {}]",
                            min.map_or("-".to_owned(), |x| x.to_string()),
                            max.map_or("-".to_owned(), |x| x.to_string())
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
}

fn truncate(s: &str, n: usize) -> &str {
    let mut end = n.min(s.len());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

impl super::NetConfig {
    fn validate(&self, at: &KeyPath) -> Result<(), Invalid> {
        let opts = qosd_sensors::net::NetOptions {
            bin_ms: self.bin_ms,
            ..Default::default()
        };
        if opts.validate().is_err() {
            return Err(Invalid::new(
                at.key("bin_ms"),
                "must divide 1000 (1, 2, 4, 5, 10, ..., 1000) so bins tile the 1 s window",
            ));
        }
        if !(1..=super::NET_TOP_N_MAX).contains(&self.top_n) {
            return Err(Invalid::new(
                at.key("top_n"),
                format!("must be from 1 to {} peers", super::NET_TOP_N_MAX),
            ));
        }
        for (i, name) in self.ifaces.iter().enumerate() {
            // IFNAMSIZ − 1, no '/' or whitespace: what the kernel accepts.
            let bad = name.is_empty()
                || name.len() > 15
                || name.chars().any(|c| c == '/' || c.is_whitespace());
            if bad {
                return Err(Invalid::new(
                    at.key("ifaces").index(i),
                    format!("`{name}` is not an interface name (1-15 characters, no `/` or space)"),
                ));
            }
        }
        Ok(())
    }
}
