//! The actuator registry: [`Actuators`], the knob plugins the manager holds, built from a
//! [`Config`] after probing the machine. `apply` changes an app's
//! allocation whole or not at all; everything is restored on
//! `restore_all`, on drop (which also runs when a panic unwinds), and from
//! the state file after a SIGKILL.

use crate::caps::{BackendProbe, Caps, KnobCaps};
use crate::config::{allowed, Config};
use crate::cores::{probe_affinity, probe_cgroup1, probe_cgroup2, CoresActuator, CoresImpl};
use crate::error::{Error, Result};
use crate::freq::{probe_cpupower, probe_sysfs, FreqActuator, FreqVia};
use crate::journal::Journal;
use crate::pqos::PqosWays;
use crate::resctrl::{probe_l3, probe_mb, ResctrlMb, ResctrlWays};
use crate::topology::Topology;
use crate::{proc, Actuator, Allocation, AppTarget, Apps, Change, Ctx, KnobPlan, Resource, Root};

fn probe<T>(
    name: &str,
    r: std::result::Result<T, String>,
    ok: impl FnOnce(&T) -> String,
) -> (BackendProbe, Option<T>) {
    match r {
        Ok(v) => (
            BackendProbe {
                name: name.into(),
                available: true,
                reason: ok(&v),
            },
            Some(v),
        ),
        Err(reason) => (
            BackendProbe {
                name: name.into(),
                available: false,
                reason,
            },
            None,
        ),
    }
}

type Plugins = [Option<Box<dyn Actuator>>; 5];

/// Probes the machine: what `qosd caps` shows, and the chosen plugins.
pub fn detect(cfg: &Config) -> Result<(Caps, Plugins)> {
    let root = Root::new(&cfg.root);
    let topo = Topology::read(&root);
    let nr_cpus = topo.as_ref().ok().map(|t| t.cpus.len() as u32);

    // Cores.
    let (p2, c2) = probe("cgroup2", probe_cgroup2(&root), |m| {
        format!("cpuset cgroup per app under {}", root.show(m))
    });
    let (p1, c1) = probe("cgroup1", probe_cgroup1(&root), |m| {
        format!("cgroup v1 cpuset per app under {}", root.show(m))
    });
    let (pa, ca) = probe("affinity", probe_affinity(&root), |_| {
        "sched_setaffinity on every thread in /proc/PID/task (new threads inherit it)".into()
    });
    let mut cores = KnobCaps::choose(vec![p2, p1, pa], |n| allowed(cfg.cores_backend, n));
    let cores_plugin: Option<Box<dyn Actuator>> = match (&cores.backend, topo) {
        (Some(b), Ok(topo)) => {
            let imp = match b.as_str() {
                "cgroup2" => c2.map(|mount| CoresImpl::Cgroup { v2: true, mount }),
                "cgroup1" => c1.map(|mount| CoresImpl::Cgroup { v2: false, mount }),
                _ => ca.map(|_| CoresImpl::Affinity),
            };
            imp.map(|imp| Box::new(CoresActuator { imp, topo }) as Box<dyn Actuator>)
        }
        (Some(_), Err(e)) => {
            cores.available = false;
            cores.backend = None;
            cores.reason = format!("cannot read the CPU topology: {e}");
            None
        }
        (None, _) => None,
    };

    // Frequency.
    let (ps, ss) = probe("cpufreq", probe_sysfs(&root), |s| {
        format!("cpufreq sysfs: {}", s.describe())
    });
    let (pc, sc) = probe("cpupower", probe_cpupower(&root), |s| {
        format!("cpupower frequency-set: {}", s.describe())
    });
    let frequency = KnobCaps::choose(vec![ps, pc], |n| allowed(cfg.frequency_backend, n));
    let freq_plugin: Option<Box<dyn Actuator>> = match frequency.backend.as_deref() {
        Some("cpufreq") => ss.map(|style| {
            Box::new(FreqActuator {
                style,
                via: FreqVia::Sysfs,
            }) as Box<dyn Actuator>
        }),
        Some("cpupower") => sc.map(|style| {
            Box::new(FreqActuator {
                style,
                via: FreqVia::Cpupower,
            }) as Box<dyn Actuator>
        }),
        _ => None,
    };

    // Cache ways.
    let (pr, wr) = probe("resctrl", probe_l3(&root), |a| {
        format!(
            "resctrl L3 groups: cbm_mask {:x} ({} ways), min_cbm_bits {}",
            a.cbm_mask,
            a.nr_ways(),
            a.min_cbm_bits
        )
    });
    let (pq, wq) = probe("pqos", crate::pqos::probe(&root, cfg.pqos_cbm_bits), |a| {
        format!(
            "pqos classes of service, {} ways, CPUs associated",
            a.nr_ways()
        )
    });
    let cache_ways = KnobCaps::choose(vec![pr, pq], |n| allowed(cfg.cache_ways_backend, n));
    let ways_plugin: Option<Box<dyn Actuator>> = match cache_ways.backend.as_deref() {
        Some("resctrl") => wr.map(|alloc| Box::new(ResctrlWays { alloc }) as Box<dyn Actuator>),
        Some("pqos") => wq.map(|alloc| Box::new(PqosWays::new(alloc)) as Box<dyn Actuator>),
        _ => None,
    };

    // Memory bandwidth.
    let (pm, m) = probe("resctrl", probe_mb(&root), |(g, min)| {
        format!("resctrl MB lines: granularity {g}%, minimum {min}%")
    });
    let memory_bandwidth = KnobCaps::choose(vec![pm], |_| true);
    let mb_plugin: Option<Box<dyn Actuator>> = m.map(|(gran_percent, min_percent)| {
        Box::new(ResctrlMb {
            gran_percent,
            min_percent,
        }) as Box<dyn Actuator>
    });

    // CPU quota.
    let (cpu_quota, q) = crate::quota::detect(&root, cfg.cpu_quota_backend, nr_cpus);
    let quota_plugin = q.map(|mut q| {
        q.period_us = cfg.cpu_quota_period_us;
        Box::new(q) as Box<dyn Actuator>
    });

    Ok((
        Caps {
            cores,
            frequency,
            cache_ways,
            memory_bandwidth,
            cpu_quota,
        },
        [
            cores_plugin,
            freq_plugin,
            ways_plugin,
            mb_plugin,
            quota_plugin,
        ],
    ))
}

/// The knobs of one machine, for the manager.
pub struct Actuators {
    pub(crate) ctx: Ctx,
    caps: Caps,
    plugins: Plugins,
    pub(crate) apps: Apps,
    /// What the policy may hand out (see [`crate::manage`]).
    pub(crate) node: qosd_core::NodeCaps,
    /// The frequency backend again, for per-CPU changes.
    freq: Option<FreqActuator>,
    restore_on_drop: bool,
}

impl Actuators {
    /// Probes the machine and opens the state file (taking its lock).
    /// Entries a killed run left in the state file are kept and restored
    /// by the next `restore_all` (see [`Actuators::start`]).
    pub fn new(cfg: &Config) -> Result<Self> {
        cfg.validate()?;
        let (caps, plugins) = detect(cfg)?;
        let freq = match plugins[1].as_ref().map(|p| p.backend()) {
            Some(b) => Some(FreqActuator {
                style: probe_sysfs(&Root::new(&cfg.root)).map_err(|reason| Error::Unavailable {
                    resource: Resource::Frequency,
                    reason,
                })?,
                via: if b == "cpupower" {
                    FreqVia::Cpupower
                } else {
                    FreqVia::Sysfs
                },
            }),
            None => None,
        };
        let root = Root::new(&cfg.root);
        let node = crate::capacities::node_caps(&root, &caps, cfg);
        let journal = Journal::open(root.clone(), Some(cfg.state_path()), cfg.dry_run)?;
        Ok(Actuators {
            ctx: Ctx::new(root, cfg.dry_run, journal),
            caps,
            plugins,
            apps: Apps::new(),
            node,
            freq,
            restore_on_drop: cfg.restore_on_drop,
        })
    }

    /// For the daemon and replays: [`Actuators::new`], then put back what
    /// a previous run that was killed left changed.
    pub fn start(cfg: &Config) -> Result<(Self, Vec<Change>)> {
        let mut a = Self::new(cfg)?;
        let leftovers = if a.ctx.journal().entries().is_empty() {
            Vec::new()
        } else {
            tracing::warn!(
                "restoring what a previous qosd left in {}",
                cfg.state_path().display()
            );
            a.restore_all()?
        };
        Ok((a, leftovers))
    }

    pub fn caps(&self) -> &Caps {
        &self.caps
    }

    pub fn root(&self) -> &Root {
        &self.ctx.root
    }

    fn plugin(&self, r: Resource) -> Option<&dyn Actuator> {
        self.plugins[Self::slot(r)].as_deref()
    }

    fn slot(r: Resource) -> usize {
        match r {
            Resource::Cores => 0,
            Resource::Frequency => 1,
            Resource::CacheWays => 2,
            Resource::MemoryBandwidth => 3,
            Resource::CpuQuota => 4,
        }
    }

    /// Leave changes in place when dropped (one-shot `qosd set`); the
    /// state file still holds the originals for `qosd restore`.
    pub fn keep_changes(&mut self) {
        self.restore_on_drop = false;
    }

    /// Puts `alloc` in force for `app`: every set field, all or nothing (a
    /// failure rolls back what was already changed). Fields left `None`
    /// keep what the app had. Returns the changes made.
    pub fn apply(&mut self, app: &AppTarget, alloc: &Allocation) -> Result<Vec<Change>> {
        if app.pids.is_empty() {
            return Err(Error::Invalid(format!("app {} has no pid", app.name)));
        }
        for &pid in &app.pids {
            proc::check_pid(&self.ctx.root, pid)?;
        }
        for r in alloc.resources() {
            if self.plugin(r).is_none() {
                return Err(Error::Unavailable {
                    resource: r,
                    reason: self.caps.get(r).reason.clone(),
                });
            }
        }
        // The new allocation merged over what the app already has.
        let mut merged = self
            .apps
            .get(&app.name)
            .map(|(_, a)| a.clone())
            .unwrap_or_default();
        for (dst, src) in [
            (&mut merged.freq_mhz, alloc.freq_mhz),
            (&mut merged.llc_ways, alloc.llc_ways),
            (&mut merged.mb_percent, alloc.mb_percent),
            (&mut merged.cpu_quota_milli, alloc.cpu_quota_milli),
        ] {
            if src.is_some() {
                *dst = src;
            }
        }
        if alloc.cpus.is_some() {
            merged.cpus = alloc.cpus.clone();
        }
        let mut all = self.apps.clone();
        all.insert(app.name.clone(), (app.clone(), merged.clone()));

        let cpus = match &merged.cpus {
            Some(c) => c.clone(),
            None => proc::cpus_allowed(&self.ctx.root, app.pids[0])?,
        };
        self.ctx.begin();
        for r in Resource::ALL {
            // Only the knobs this call sets (a knob not asked for stays).
            let want = match r {
                Resource::Cores if alloc.cpus.is_some() => &merged,
                Resource::Frequency if alloc.freq_mhz.is_some() => &merged,
                Resource::CacheWays if alloc.llc_ways.is_some() => &merged,
                Resource::MemoryBandwidth if alloc.mb_percent.is_some() => &merged,
                Resource::CpuQuota if alloc.cpu_quota_milli.is_some() => &merged,
                _ => continue,
            };
            let plan = KnobPlan {
                app,
                want,
                cpus: &cpus,
                all: &all,
            };
            let Some(p) = self.plugins[Self::slot(r)].as_mut() else {
                continue;
            };
            if let Err(e) = p.apply(&mut self.ctx, &plan) {
                return Err(self.ctx.rollback(e));
            }
        }
        self.apps = all;
        Ok(self.ctx.commit())
    }

    /// What is in force for `app`, for every available knob.
    pub fn read(&self, app: &AppTarget) -> Result<Allocation> {
        let mut out = Allocation::default();
        for r in Resource::ALL {
            if let Some(p) = self.plugin(r) {
                let a = p.read(&self.ctx, app)?;
                out.cpus = out.cpus.or(a.cpus);
                out.freq_mhz = out.freq_mhz.or(a.freq_mhz);
                out.llc_ways = out.llc_ways.or(a.llc_ways);
                out.mb_percent = out.mb_percent.or(a.mb_percent);
                out.cpu_quota_milli = out.cpu_quota_milli.or(a.cpu_quota_milli);
            }
        }
        Ok(out)
    }

    /// Sets the frequency of a CPU list directly (`qosd set freq --cpus`).
    pub fn set_cpu_freq(&mut self, cpus: &[u32], mhz: u32) -> Result<Vec<Change>> {
        let act = self.freq.clone().ok_or_else(|| Error::Unavailable {
            resource: Resource::Frequency,
            reason: self.caps.frequency.reason.clone(),
        })?;
        if cpus.is_empty() {
            return Err(Error::Invalid("empty CPU list".into()));
        }
        self.ctx.begin();
        if let Err(e) = crate::freq::apply_to_cpus(&act, &mut self.ctx, cpus, mhz) {
            return Err(self.ctx.rollback(e));
        }
        Ok(self.ctx.commit())
    }

    /// Forgets an app that exited (its knobs stay recorded for restore).
    pub fn remove_app(&mut self, name: &str) {
        self.apps.remove(name);
    }

    /// Puts back every original recorded (this run's and a killed run's),
    /// newest first, and empties the state file. Keeps going past
    /// failures; what failed stays in the state file and is returned.
    pub fn restore_all(&mut self) -> Result<Vec<Change>> {
        let (changes, mut errors) = self.ctx.restore(None);
        self.apps.clear();
        match errors.len() {
            0 => Ok(changes),
            1 => Err(errors.remove(0)),
            n => Err(Error::Invalid(format!(
                "{n} restores failed: {}",
                errors
                    .iter()
                    .map(|e| e.to_string())
                    .collect::<Vec<_>>()
                    .join("; ")
            ))),
        }
    }
}

impl Drop for Actuators {
    fn drop(&mut self) {
        if !self.restore_on_drop {
            return;
        }
        match self.restore_all() {
            Ok(c) if !c.is_empty() => tracing::info!("restored {} settings", c.len()),
            Ok(_) => {}
            Err(e) => tracing::error!("restoring on exit: {e}"),
        }
    }
}
