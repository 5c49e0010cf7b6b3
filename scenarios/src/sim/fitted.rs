//! Model files: the simulated node and each app's service model as fitted
//! to a machine by `qosd calibrate --model FILE` ([`super::fit`]), read by
//! `qosd replay --sim --model FILE` and validated by `qosd check`. The
//! node replaces the scenario's `node:`; each app's fitted values override
//! its `sim:` (and so its server kind's defaults). Errors name
//! `file:line:col` and the key, like every other YAML file of qosd.
//!
//! ```yaml
//! source: real (host, 2 CPUs)
//! node: {nr_cores: 2, freq_min_mhz: 3000, freq_max_mhz: 3000, nr_ways: 0, quota_step_milli: 100}
//! apps:
//!   search: {service_us: 980, service_cv: 0.35, parallelism: 16, network_ms: 0.2}
//!   batch: {parallelism: 2, ops_per_cpu_s: 27000}
//! checks:   # what the fit saw, per app and allocation (for people)
//!   search: [{nr_cores: 1, quota_milli: 500, measured: 480.0, model: 510.0, unit: rps}]
//! ```

use std::collections::BTreeMap;
use std::path::Path;

use qosd_core::yamlfile::{self, FileError, Invalid, KeyPath, Seg};
use serde::{Deserialize, Serialize};

use crate::scenario::{Scenario, SimModelSpec, SimNode};

/// A fitted model of a machine and its apps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelFile {
    /// Where and when it was fitted, for people.
    #[serde(default)]
    pub source: String,
    /// The machine as the simulated node (its CPUs, knobs and power).
    pub node: SimNode,
    /// Per app name, its service model (the keys of a scenario's `sim:`).
    pub apps: BTreeMap<String, SimModelSpec>,
    /// Per app, the fit against what was measured (not read by the sim).
    #[serde(default)]
    pub checks: BTreeMap<String, Vec<FitCheck>>,
}

/// One allocation the fit was checked at: capacity (rps) of a server, or
/// throughput (ops/s) of a batch job, measured and as the model has it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FitCheck {
    pub nr_cores: u32,
    /// CPU quota, milli-CPUs (0: none).
    pub quota_milli: u32,
    pub measured: f64,
    pub model: f64,
    /// `rps` or `ops/s`.
    pub unit: String,
}

impl ModelFile {
    /// Reads, parses and validates a model file.
    pub fn from_file(path: &Path) -> Result<ModelFile, FileError> {
        let text = yamlfile::read(path)?;
        Self::parse(path, &text)
    }

    /// Parses and validates `text`, the contents of `path`.
    pub fn parse(path: &Path, text: &str) -> Result<ModelFile, FileError> {
        let m: ModelFile = yamlfile::parse_doc(path, text, yamlfile::Doc::Model)?;
        m.validate()
            .map_err(|(key, msg)| yamlfile::invalid(path, text, Invalid::new(KeyPath(key), msg)))?;
        Ok(m)
    }

    fn validate(&self) -> Result<(), (Vec<Seg>, String)> {
        let key = |k: &str| vec![Seg::Key(k.into())];
        if self.apps.is_empty() {
            return Err((key("apps"), "no app: nothing was fitted".into()));
        }
        // Printed by `check` and in summaries: no forged lines.
        if self.source.chars().any(char::is_control) {
            return Err((
                key("source"),
                "no control character (newline, tab, ...)".into(),
            ));
        }
        crate::scenario::validate::node_ok(&self.node, 1, &key("node"))?;
        for (name, spec) in &self.apps {
            let base = vec![Seg::Key("apps".into()), Seg::Key(name.clone())];
            if name.chars().any(char::is_control) {
                return Err((base, "an app name has no control character".into()));
            }
            crate::scenario::validate::sim_spec_ok(spec, &base)?;
        }
        Ok(())
    }

    /// Puts the model into a scenario: its node, and each app's fitted
    /// values over the scenario's `sim:`. Every app of the scenario must
    /// be in the file (a sim of a half-fitted scenario would compare
    /// nothing); the message names the missing one.
    pub fn apply(&self, sc: &mut Scenario) -> Result<(), String> {
        for a in &sc.apps {
            if !self.apps.contains_key(&a.name) {
                let have: Vec<&str> = self.apps.keys().map(String::as_str).collect();
                return Err(format!(
                    "app {} of scenario {} is not in the model (it has: {}); fit it with `qosd calibrate --model`",
                    a.name,
                    sc.name,
                    have.join(", ")
                ));
            }
        }
        if !self.node.shared_cpus && (self.node.nr_cores as usize) < sc.apps.len() {
            return Err(format!(
                "the model's node has {} cores for {} apps (one core each at least)",
                self.node.nr_cores,
                sc.apps.len()
            ));
        }
        sc.node = self.node.clone();
        for a in &mut sc.apps {
            overlay(&mut a.sim, &self.apps[&a.name]);
        }
        Ok(())
    }
}

/// `base` with every value `top` has.
fn overlay(base: &mut SimModelSpec, top: &SimModelSpec) {
    macro_rules! set {
        ($($f:ident),*) => { $( if top.$f.is_some() { base.$f = top.$f; } )* };
    }
    crate::scenario::sim_model_fields!(set);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<ModelFile, String> {
        ModelFile::parse(Path::new("m.yaml"), text).map_err(|e| e.to_string())
    }

    const GOOD: &str = "source: test\nnode: {nr_cores: 2, freq_min_mhz: 3000, freq_max_mhz: 3000, nr_ways: 0, quota_step_milli: 100}\napps:\n  search: {service_us: 900, service_cv: 0.4, parallelism: 16}\n  batch: {parallelism: 2, ops_per_cpu_s: 25000}\n";

    #[test]
    fn a_good_file_parses_and_round_trips() {
        let m = parse(GOOD).unwrap();
        assert_eq!(m.node.nr_cores, 2);
        assert_eq!(m.node.quota_step_milli, 100);
        assert_eq!(m.apps["search"].service_us, Some(900.0));
        assert_eq!(m.apps["batch"].ops_per_cpu_s, Some(25000.0));
        let again = parse(&serde_yaml_ng::to_string(&m).unwrap()).unwrap();
        assert_eq!(again, m);
    }

    #[test]
    fn errors_name_file_line_col_and_key() {
        for (text, want) in [
            (
                GOOD.replace("service_cv: 0.4", "service_cv: 1.5"),
                "m.yaml:4:29: apps.search.service_cv: 1.5: must be in (0, 1]",
            ),
            (
                GOOD.replace("ops_per_cpu_s: 25000", "ops_per_cpu_s: -1"),
                "m.yaml:5:27: apps.batch.ops_per_cpu_s: -1: must be > 0",
            ),
            (
                GOOD.replace("quota_step_milli: 100", "quota_step_milli: 5000"),
                "m.yaml:2:73: node.quota_step_milli: 5000: 0 (no quota knob) or 10..=1000",
            ),
            (
                GOOD.replace("parallelism: 16", "paralelism: 16"),
                "m.yaml:4:",
            ),
            (GOOD.replace("apps:\n", "aps:\n"), "m.yaml:"),
            ("node: {}\napps: {}\n".into(), "m.yaml:2:1: apps: no app"),
            ("node: [1]\napps: {}\n".into(), "m.yaml:1:"),
        ] {
            let e = parse(&text).unwrap_err();
            assert!(e.starts_with(want), "{e}\n  wanted it to start with {want}");
        }
        let e = parse(&GOOD.replace("parallelism: 16", "paralelism: 16")).unwrap_err();
        assert!(e.contains("paralelism"), "{e}");
    }

    #[test]
    fn apply_overrides_the_scenario_and_names_a_missing_app() {
        let m = parse(GOOD).unwrap();
        let sc_text = "name: t\nduration_s: 10\napps:\n  - name: search\n    class: lc\n    server: {kind: fixture, work_us: 500}\n    protocol: http\n    target: {ms: 5}\n    load: {kind: constant, level: 0.5}\n    sim: {service_us: 500, network_ms: 0.3}\n";
        let mut sc = Scenario::parse(Path::new("t.yaml"), sc_text).unwrap();
        m.apply(&mut sc).unwrap();
        assert_eq!(sc.node.nr_cores, 2);
        assert_eq!(sc.apps[0].sim.service_us, Some(900.0), "the fit wins");
        assert_eq!(sc.apps[0].sim.network_ms, Some(0.3), "unfitted stays");
        let other = ModelFile {
            apps: [("memcached".to_string(), SimModelSpec::default())].into(),
            ..m
        };
        let mut sc = Scenario::parse(Path::new("t.yaml"), sc_text).unwrap();
        let e = other.apply(&mut sc).unwrap_err();
        assert!(
            e.starts_with("app search of scenario t is not in the model (it has: memcached)"),
            "{e}"
        );
    }
}
