//! What a run on this machine (a real replay, a calibration, a model fit)
//! starts from: its scenario, the knobs it may turn, actuators that
//! journal to the run's own state file, and the commands of this binary
//! that its fixture servers and batch jobs run.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context;
use qosd_core::Resource;
use qosd_scenarios::scenario::{Scenario, SimNode};

use super::actuate::Actuation;
use crate::usage;

pub fn read_scenario(path: &Path) -> anyhow::Result<Scenario> {
    Scenario::from_file(path).map_err(|e| usage!("{e}"))
}

pub fn parse_resource(s: &str) -> Result<Resource, String> {
    serde_yaml_ng::from_str::<Resource>(s.trim()).map_err(|_| {
        let names: Vec<&str> = Resource::ALL.iter().map(|r| r.name()).collect();
        format!("{s:?}: one of {}", names.join(", "))
    })
}

/// The knobs a real replay may turn: `--resources`, else the scenario's
/// `resources:`, else all of them (those the machine lacks stay off).
pub fn resources(scenario: &Scenario, arg: Option<&[Resource]>) -> anyhow::Result<Vec<Resource>> {
    let list = arg
        .map(<[Resource]>::to_vec)
        .or_else(|| scenario.resources.clone())
        .unwrap_or_else(|| Resource::ALL.to_vec());
    if list.is_empty() {
        return Err(usage!("--resources: name at least one knob"));
    }
    if let Some(r) = list
        .iter()
        .enumerate()
        .find_map(|(i, r)| list[..i].contains(r).then_some(r))
    {
        return Err(usage!("--resources: {r} appears twice"));
    }
    Ok(list)
}

/// What summary.json records of the run's making: the qosd version and
/// the policy with every parameter (as parsed, defaults filled in).
pub fn run_meta(scenario: &Scenario, arg: Option<&str>) -> BTreeMap<String, serde_json::Value> {
    let mut m = BTreeMap::new();
    m.insert("qosd_version".into(), env!("CARGO_PKG_VERSION").into());
    let policy = match arg {
        Some("static") => serde_json::json!("static"),
        _ => arg
            .map(PathBuf::from)
            .or_else(|| scenario.policy_path())
            .and_then(|p| {
                let text = crate::yamlfile::read(&p).ok()?;
                crate::policy::PolicyFile::parse(&p, &text).ok()
            })
            .and_then(|f| serde_json::to_value(f).ok())
            .unwrap_or(serde_json::Value::Null),
    };
    m.insert("policy".into(), policy);
    m
}

/// A command that runs this binary's subcommand `sub` (the hidden
/// `fixture` server, a `batch` job).
fn own_command(sub: &str) -> anyhow::Result<Vec<String>> {
    let exe = std::env::current_exe().context("locating the qosd binary")?;
    Ok(vec![exe.display().to_string(), sub.into()])
}

/// The command that starts the fixture server.
pub fn fixture_cmd() -> anyhow::Result<Vec<String>> {
    own_command("fixture")
}

/// The command that runs a batch job.
pub fn batch_cmd() -> anyhow::Result<Vec<String>> {
    own_command("batch")
}

/// The actuators with their defaults but journalling to `state` (the
/// replay's own state file, not the daemon's), behind the daemon's
/// actuation. Knobs the machine lacks are simply absent from the node.
/// Quotas are enforced over the scenario's CFS period, with its burst
/// (`node.cfs_period_us`, `node.cfs_burst_pct`): what its sim models.
pub fn start_actuation(
    state: &Path,
    enabled: &[Resource],
    node: &SimNode,
) -> anyhow::Result<Actuation> {
    let cfg = qosd_actuators::Config {
        state_file: Some(state.to_owned()),
        cpu_quota_period_us: Some(node.cfs_period_us),
        cpu_quota_burst_pct: node.cfs_burst_pct,
        ..Default::default()
    };
    let (act, leftovers) = qosd_actuators::Actuators::start(&cfg)
        .map_err(crate::exit::to_anyhow)
        .with_context(|| format!("starting the actuators (state file {})", state.display()))?;
    if !leftovers.is_empty() {
        eprintln!(
            "put back {} setting(s) a previous run left in {}",
            leftovers.len(),
            state.display()
        );
    }
    eprintln!(
        "actuator state: {} (if this replay is killed: qosd restore --state-file {})",
        state.display(),
        state.display()
    );
    // Knobs outside `enabled` are absent from the node the policy sees, so
    // its cycle skips them and admission leaves them as found.
    let mut act = Actuation::new(act, enabled).context("reading the CPU topology")?;
    // Groups `qosd-replay<PID>-<app>`: never a daemon's `qosd-<app>`, nor
    // another replay's with the same app names.
    act.set_group_prefix(&format!("replay{}-", std::process::id()));
    Ok(act)
}

/// Puts every knob of a run back and releases its state file: the lock
/// goes too once nothing is left in the journal (the lock file is all
/// that is left of it then; it is not an output). A failed restore names
/// the command that finishes it.
pub fn finish_actuation(mut act: Actuation, state: &Path) {
    match act.restore_all() {
        Ok(ch) if !ch.is_empty() => eprintln!("restored {} setting(s)", ch.len()),
        Ok(_) => {}
        Err(e) => eprintln!(
            "restoring the knobs: {e} (run `qosd restore --state-file {}`)",
            state.display()
        ),
    }
    // Dropping `act` releases the state file's lock.
    drop(act);
    if !state.exists() {
        let _ = std::fs::remove_file(state.with_extension("lock"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scenario(resources: &str) -> Scenario {
        let text = format!(
            "name: t\nduration_s: 10\n{resources}\napps:\n  - name: a\n    class: lc\n    \
             server:\n      kind: fixture\n    protocol: http\n    target:\n      ms: 1\n"
        );
        Scenario::parse(Path::new("t.yaml"), &text).unwrap()
    }

    #[test]
    fn knobs_come_from_the_flag_then_the_scenario_then_all() {
        let all = scenario("");
        assert_eq!(resources(&all, None).unwrap(), Resource::ALL.to_vec());
        let quota = scenario("resources: [cpu_quota]");
        assert_eq!(resources(&quota, None).unwrap(), vec![Resource::CpuQuota]);
        let flag = [Resource::Cores, Resource::CpuQuota];
        assert_eq!(resources(&quota, Some(&flag)).unwrap(), flag.to_vec());
        assert!(resources(&quota, Some(&[])).is_err(), "an empty list");
        assert_eq!(parse_resource("quota"), Ok(Resource::CpuQuota));
        assert!(parse_resource("turbo").unwrap_err().contains("turbo"));
    }
}
