//! The control loop's body, one call per tick: find the apps' processes,
//! measure (latency from each app's feedback source, RPS, CPU
//! utilisation), hand the snapshot to the policy, and on decision ticks
//! put the policy's plan in force. Apps that appear are admitted with
//! their initial share; apps whose processes all exit are released and
//! their knobs restored.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use qosd_core::{AppState, Feedback, Limits, Policy, Snapshot};
use qosd_sensors::ebpf::{RequestTracer, TargetOptions};
use qosd_sensors::power::PowerSensor;
use qosd_sensors::procfs::{CpuMeter, NodeCpu, Procfs};
use qosd_sensors::stats::LogHistogram;

use super::actuate::Actuation;
use super::admit::Peers;
use super::discover::Finder;
use super::latency::from_tracer;
use super::state::SharedState;
use crate::config::AppConfig;

/// One configured app and what the loop keeps about it.
struct AppRt {
    cfg: AppConfig,
    feedback: Feedback,
    limits: Limits,
    pids: Vec<i32>,
    /// Why it is not managed, or its last failure to apply.
    note: Option<String>,
    cpu: CpuMeter,
    /// Seconds since its CPU time was last read.
    cpu_span_s: f64,
    /// Share of its CPUs it used over the last decision interval.
    cpu_util: f64,
}

/// Something worth a line on stdout.
pub type Events = Vec<String>;

pub struct Controller {
    apps: Vec<AppRt>,
    policy: Box<dyn Policy + Send>,
    act: Actuation,
    tracer: Option<Arc<RequestTracer>>,
    power: Option<PowerSensor>,
    shared: SharedState,
    finder: Finder,
    procfs: Procfs,
    node_cpu: Option<NodeCpu>,
    dry_run: bool,
}

mod report;
pub use report::{describe_target, live_entry};

impl Controller {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        apps: &[AppConfig],
        feedback_override: Option<Feedback>,
        policy: Box<dyn Policy + Send>,
        act: Actuation,
        tracer: Option<Arc<RequestTracer>>,
        shared: SharedState,
        root: &std::path::Path,
        dry_run: bool,
    ) -> Self {
        let apps = apps
            .iter()
            .map(|a| AppRt {
                feedback: feedback_override.unwrap_or(a.feedback),
                limits: a.limits(),
                cfg: a.clone(),
                pids: Vec::new(),
                note: None,
                cpu: CpuMeter::default(),
                cpu_span_s: 0.0,
                cpu_util: 0.0,
            })
            .collect();
        Controller {
            apps,
            policy,
            act,
            tracer,
            power: None,
            shared,
            finder: Finder::new(root),
            procfs: Procfs::new(root),
            node_cpu: None,
            dry_run,
        }
    }

    /// Samples `power` on every decision tick from now on.
    pub fn set_power(&mut self, power: PowerSensor) {
        self.power = Some(power);
    }

    pub fn actuation(&self) -> &Actuation {
        &self.act
    }

    pub fn actuation_mut(&mut self) -> &mut Actuation {
        &mut self.act
    }

    /// The configured feedback of app `i` after the CLI override.
    pub fn feedback(&self, name: &str) -> Option<Feedback> {
        self.apps
            .iter()
            .find(|a| a.cfg.name == name)
            .map(|a| a.feedback)
    }

    /// One tick. `scan`: look for new processes (a pass over /proc);
    /// otherwise only check that known ones live. `decide`: ask the policy
    /// for a plan and apply it.
    pub fn tick(&mut self, now_ms: u64, dt_s: f64, scan: bool, decide: bool) -> Events {
        let mut ev = self.discover(now_ms, scan);
        if decide {
            self.sample_power();
        }
        let snap = self.measure(dt_s, decide);
        self.policy.observe(now_ms, &snap);
        if decide {
            let plan = self
                .policy
                .decide(now_ms, &snap, self.act.current(), self.act.node());
            let pids = self.managed_pids();
            match self.act.set(&plan.allocations, &pids, true) {
                Ok(applied) => {
                    ev.extend(self.record(now_ms, &plan.decisions, &applied, None));
                }
                Err(e) => {
                    let e = format!("policy {}: plan not applied: {e}", self.policy.name());
                    ev.extend(self.record(now_ms, &plan.decisions, &[], Some(&e)));
                }
            }
        }
        self.publish(decide);
        ev
    }

    /// Pids of the managed apps.
    fn managed_pids(&self) -> BTreeMap<String, Vec<i32>> {
        self.apps
            .iter()
            .filter(|a| self.act.current().contains_key(&a.cfg.name) && !a.pids.is_empty())
            .map(|a| (a.cfg.name.clone(), a.pids.clone()))
            .collect()
    }

    fn discover(&mut self, now_ms: u64, scan: bool) -> Events {
        let mut ev = Events::new();
        let found: Vec<Vec<i32>> = if scan {
            let matchers: Vec<_> = self.apps.iter().map(|a| &a.cfg.matcher).collect();
            let known: Vec<&[i32]> = self.apps.iter().map(|a| a.pids.as_slice()).collect();
            self.finder.find_all(&matchers, &known)
        } else {
            self.apps
                .iter()
                .map(|a| {
                    a.pids
                        .iter()
                        .copied()
                        .filter(|&p| self.finder.alive(p))
                        .collect()
                })
                .collect()
        };
        let mut changed = false;
        for (i, pids) in found.into_iter().enumerate() {
            if pids == self.apps[i].pids {
                continue;
            }
            changed = true;
            let old = std::mem::replace(&mut self.apps[i].pids, pids.clone());
            let name = self.apps[i].cfg.name.clone();
            self.follow(i, &old, &pids);
            let managed = self.act.current().contains_key(&name);
            if pids.is_empty() {
                self.apps[i].note = None;
                let msg = match self.act.release(&name, &old) {
                    Ok(c) if c.is_empty() => String::new(),
                    Ok(c) => format!(", {} settings put back", c.len()),
                    Err(e) => format!(", putting its settings back failed: {e}"),
                };
                ev.push(format!("app {name}: exited (pids {old:?}): released{msg}"));
            } else if !managed {
                ev.extend(self.admit(now_ms, i));
            } else {
                ev.push(format!("app {name}: processes now {pids:?}"));
            }
        }
        if scan {
            // Running apps left out for want of units: units may be free now.
            for i in 0..self.apps.len() {
                let name = &self.apps[i].cfg.name;
                if !self.apps[i].pids.is_empty() && !self.act.current().contains_key(name) {
                    let before = self.apps[i].note.clone();
                    let e = self.admit(now_ms, i);
                    if self.apps[i].note != before {
                        ev.extend(e);
                    }
                }
            }
        }
        if changed {
            // New processes of managed apps get their app's settings.
            let pids = self.managed_pids();
            let current = self.act.current().clone();
            if let Ok(applied) = self.act.set(&current, &pids, false) {
                ev.extend(self.record(now_ms, &[], &applied, None));
            }
        }
        ev
    }

    /// Adds and removes the app's pids in the eBPF tracer.
    fn follow(&mut self, i: usize, old: &[i32], new: &[i32]) {
        let Some(t) = &self.tracer else { return };
        let a = &self.apps[i];
        let (old, new): (BTreeSet<i32>, BTreeSet<i32>) =
            (old.iter().copied().collect(), new.iter().copied().collect());
        for p in old.difference(&new) {
            if t.connections(*p as u32) == Some(0) {
                tracing::warn!(
                    "app {}: pid {p} left having served no connection while traced \
                     (check its match: and ports:)",
                    a.cfg.name
                );
            }
            let _ = t.remove_target(*p as u32);
        }
        for p in new.difference(&old) {
            let opts = TargetOptions {
                ports: a.cfg.ports.clone(),
                // A matched pre-fork master brings its workers.
                follow_children: true,
                ..Default::default()
            };
            if let Err(e) = t.add_target(*p as u32, opts) {
                tracing::warn!("app {}: tracing pid {p}: {e}", a.cfg.name);
            }
        }
    }

    /// An app whose processes appeared: its starting share, applied.
    fn admit(&mut self, now_ms: u64, i: usize) -> Events {
        let name = self.apps[i].cfg.name.clone();
        let pids = self.apps[i].pids.clone();
        let peers: Peers = self
            .apps
            .iter()
            .filter(|a| self.act.current().contains_key(&a.cfg.name))
            .map(|a| (a.cfg.name.clone(), (a.cfg.class, a.limits)))
            .collect();
        let initial = self.apps[i].cfg.initial_share();
        let limits = self.apps[i].limits;
        let (plan, taken) = match self.act.admit(&name, initial, limits, &peers) {
            Ok(x) => x,
            Err(why) => {
                self.apps[i].note = Some(format!("monitored, not managed: {why}"));
                return vec![format!(
                    "app {name}: found pids {pids:?}; monitored, not managed: {why}"
                )];
            }
        };
        self.apps[i].note = None;
        let mut all = self.managed_pids();
        all.insert(name.clone(), pids.clone());
        let mut ev = Vec::new();
        match self.act.set(&plan, &all, false) {
            Ok(applied) => {
                ev.extend(self.record(now_ms, &taken, &applied, None));
                let failed = applied.iter().find(|a| a.app == name && a.error.is_some());
                match failed {
                    Some(a) => ev.push(format!(
                        "app {name}: found pids {pids:?}; applying its start allocation failed: {}",
                        a.error.as_deref().unwrap_or("")
                    )),
                    None => ev.push(format!(
                        "app {name}: found pids {pids:?}; starts with {}",
                        self.describe(&name)
                    )),
                }
            }
            Err(e) => {
                self.apps[i].note = Some(format!("monitored, not managed: {e}"));
                ev.push(format!("app {name}: found pids {pids:?}; not managed: {e}"));
            }
        }
        ev
    }

    /// Feeds each app's latencies of this tick in and builds the snapshot
    /// of the managed apps. CPU time is read on decision ticks only: the
    /// kernel counts it in 10 ms ticks, too coarse for 100 ms anyway.
    fn measure(&mut self, dt_s: f64, decide: bool) -> Snapshot {
        let mut ticks: Vec<(LogHistogram, Option<u64>)> = Vec::with_capacity(self.apps.len());
        for a in &self.apps {
            ticks.push(match (a.feedback, &self.tracer) {
                (Feedback::Ebpf, Some(t)) => {
                    from_tracer(t, &a.pids, crate::config::figure_of(a.cfg.latency))
                }
                _ => (LogHistogram::new(), None),
            });
        }
        for a in &mut self.apps {
            a.cpu_span_s += dt_s;
            if !decide {
                continue;
            }
            let used = a.cpu.delta_s(&self.procfs, &a.pids);
            let nr_cpus = self
                .act
                .cpus(&a.cfg.name)
                .map_or(self.act.nr_online_cpus(), |c| c.len());
            let secs = std::mem::take(&mut a.cpu_span_s);
            if secs > 0.0 {
                a.cpu_util = (used / (secs * nr_cpus.max(1) as f64)).clamp(0.0, 1.0);
            }
        }
        let mut snap = Snapshot::default();
        let mut sh = self.shared.lock();
        for (a, (hist, latest)) in self.apps.iter().zip(ticks) {
            let util = a.cpu_util;
            let Some(live) = sh.apps.get_mut(&a.cfg.name) else {
                continue;
            };
            let (hist, latest) = match a.feedback {
                Feedback::Client => live.inbox.take(),
                Feedback::Ebpf => (hist, latest),
            };
            live.recent.push(hist, dt_s, latest);
            live.cpu_util = util;
            if self.act.current().contains_key(&a.cfg.name) {
                snap.apps.push(AppState {
                    name: a.cfg.name.clone(),
                    class: a.cfg.class,
                    target: live.target,
                    latency_us: live.target_latency_us(),
                    rps: live.recent.rps(),
                    cpu_util: util,
                    power_w: live.power_w,
                    limits: a.limits,
                });
            }
        }
        snap.node_power_w = sh.node_power_w;
        snap
    }

    /// Copies allocations, processes and node figures to the shared state.
    fn publish(&mut self, decided: bool) {
        let node = decided.then(|| self.procfs.node_cpu().ok()).flatten();
        let mut sh = self.shared.lock();
        if let Some(n) = node {
            if let Some(before) = self.node_cpu.replace(n) {
                sh.node_cpu_util = Some(n.utilisation_since(&before));
            }
        }
        sh.monitor_ticks_total += 1;
        if decided {
            sh.decide_ticks_total += 1;
        }
        for a in &self.apps {
            let share = self.act.current().get(&a.cfg.name).copied();
            let cpus = self.act.cpus(&a.cfg.name);
            if let Some(live) = sh.apps.get_mut(&a.cfg.name) {
                live.pids.clone_from(&a.pids);
                live.note = if a.pids.is_empty() {
                    Some("not running".to_owned())
                } else {
                    a.note.clone()
                };
                live.share = share;
                live.cpus = cpus;
            }
        }
    }
}
