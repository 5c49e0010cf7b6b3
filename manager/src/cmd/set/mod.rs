//! `qosd set cores|freq|ways|mb|quota|priority|hedge`: one knob by hand
//! (hedge: [`hedge`]); `qosd set level KNOB`: any knob but cores by its
//! name and a level, from the knob table (a new knob needs no subcommand
//! of its own to be set by hand). One-shot: the change
//! stays after qosd exits, its original is recorded in the state file and
//! `qosd restore` puts it back (or `--hold` keeps it until Ctrl-C/SIGTERM
//! and restores it then).

use std::path::PathBuf;

use clap::{Args as ClapArgs, Subcommand};
use qosd_actuators::{
    signals, Actuators, Allocation, AppTarget, Change, Config, CoresBackend, FreqBackend,
    QuotaBackend, WaysBackend,
};
use qosd_core::{cpulist, knobs, Resource};

use crate::exit::to_anyhow;

pub mod hedge;

#[derive(ClapArgs, Debug)]
#[command(after_help = "Examples:\n  \
    qosd set cores --pid $(pidof memcached) --cpus 1      run every thread of memcached on CPU 1\n  \
    qosd set cores --pid 1234 --cpus 0-1 --backend affinity\n  \
    qosd set freq --cpus 0-3 --mhz 1800                   DVFS: 1.8 GHz on CPUs 0-3\n  \
    qosd set ways --pid 1234 --ways 4                     4 LLC ways (resctrl group qosd-pid1234)\n  \
    qosd set mb --pid 1234 --percent 50                   memory bandwidth ceiling 50%\n  \
    qosd set quota --pid 1234 --quota 0.3                 CPU bandwidth: 0.3 CPU (cgroup qosd-pid1234)\n  \
    qosd set quota --pid 1234 --quota 0.5 --period-us 10000 --burst-pct 0   0.5 CPU per 10 ms, no burst\n  \
    qosd set priority --pid 1234 --class idle             idle scheduling class (cpu.idle, else lowest weight, else SCHED_IDLE)\n  \
    qosd set priority --pid 1234 --class realtime --rt-budget-us 800000   SCHED_FIFO 1, group RT budget 0.8 s/s per CPU\n  \
    qosd set level cpu_quota --pid 1234 --level 300       any knob but cores, a level in its unit (here milli-CPUs)\n  \
    qosd set hedge --pid 1234 --service 10.0.0.5:53 --replica 10.0.0.6:53 --t-hedge-ms 10 --id-len 2\n  \
    qosd set --dry-run cores --pid 1234 --cpus 1          print what would change\n  \
    qosd set --hold cores --pid 1234 --cpus 1             keep it until Ctrl-C, then restore\n  \
    qosd restore                                          put back everything qosd set changed\n\n\
    `qosd caps` says which knobs and backends this machine has.")]
pub struct Args {
    #[command(subcommand)]
    pub knob: Knob,
    /// Root prefix for /sys, /proc, cgroup and resctrl paths (tests use a fake tree).
    #[arg(long, value_name = "DIR", default_value = "/", global = true)]
    pub root: PathBuf,
    /// Where originals are recorded; default <root>/run/qosd/state.json.
    #[arg(long, value_name = "PATH", global = true)]
    pub state_file: Option<PathBuf>,
    /// Print each change that would be made; make none.
    #[arg(long, global = true)]
    pub dry_run: bool,
    /// Keep the change until SIGINT/SIGTERM/SIGHUP, then restore it.
    #[arg(long, global = true)]
    pub hold: bool,
    /// Change init (pid 1) too: its setting is the whole node's.
    #[arg(long, global = true)]
    pub force: bool,
    /// Realtime only: the RT budget of the app's cpu group
    /// (`cpu.rt_runtime_us`), µs of every 1 s period per CPU, 1-1000000
    /// (the daemon's is `realtime.budget_us` in its config). Default 900000.
    #[arg(long, value_name = "US", global = true)]
    pub rt_budget_us: Option<u64>,
}

#[derive(Subcommand, Debug)]
pub enum Knob {
    /// CPUs every thread of a process may run on.
    Cores {
        /// Process to move (all its threads, and threads it creates later).
        #[arg(long, required = true)]
        pid: Vec<i32>,
        /// CPU list, e.g. 0-3,8.
        #[arg(long, value_name = "LIST")]
        cpus: String,
        #[arg(long, value_enum, default_value = "auto")]
        backend: CoresArg,
    },
    /// Frequency of a CPU list (DVFS).
    Freq {
        /// CPU list, e.g. 0-3.
        #[arg(long, value_name = "LIST")]
        cpus: String,
        /// Frequency in MHz (rounded down to an available step).
        #[arg(long, allow_negative_numbers = true)]
        mhz: u32,
        #[arg(long, value_enum, default_value = "auto")]
        backend: FreqArg,
    },
    /// Last-level-cache ways of a process (contiguous, its own).
    Ways {
        #[arg(long, required = true)]
        pid: Vec<i32>,
        /// Number of ways.
        #[arg(long)]
        ways: u32,
        #[arg(long, value_enum, default_value = "auto")]
        backend: WaysArg,
    },
    /// Memory bandwidth ceiling of a process (resctrl MB).
    Mb {
        #[arg(long, required = true)]
        pid: Vec<i32>,
        /// Percent of the memory bandwidth, 1-100 (rounded up to the granularity).
        #[arg(long)]
        percent: u32,
    },
    /// CPU bandwidth of a process (CFS quota), in CPUs: how much CPU time
    /// per period it may use, on whichever CPUs it runs.
    Quota {
        #[arg(long, required = true)]
        pid: Vec<i32>,
        /// CPUs' worth of time, e.g. 0.3 or 1.5 (at most the online CPUs;
        /// rounded to 0.001).
        #[arg(long, allow_negative_numbers = true, value_name = "CPUS")]
        quota: String,
        /// The CFS period to enforce it over, µs (1000-1000000): a
        /// throttled process waits at most the rest of one period.
        /// Default: the group's own (the kernel's 100000).
        #[arg(long, value_name = "US")]
        period_us: Option<u64>,
        /// CFS burst, % of the quota (0-100): how much of a period's
        /// unused quota may be spent later (where the kernel has burst).
        #[arg(long, value_name = "PCT", default_value_t = qosd_actuators::quota::DEFAULT_BURST_PCT)]
        burst_pct: u32,
        #[arg(long, value_enum, default_value = "auto")]
        backend: QuotaArg,
    },
    /// Kernel-level hedged UDP requests of a process to a service
    /// (docs/hedging.md).
    Hedge(hedge::HedgeArgs),
    /// CPU priority of a process's group: the idle class (best-effort
    /// work that yields the CPU to everything else at once) or normal.
    Priority {
        #[arg(long, required = true)]
        pid: Vec<i32>,
        #[arg(long, value_enum)]
        class: PriorityArg,
    },
    /// Any knob but cores, by its name and a level in its unit, as a
    /// config's `resources:` gives it (`qosd caps` lists the knobs).
    Level {
        /// The knob: frequency, cache_ways, memory_bandwidth, cpu_quota,
        /// cpu_priority, hedge (or an alias: freq, ways, mb, quota,
        /// priority).
        #[arg(value_name = "KNOB", value_parser = parse_knob)]
        knob: Resource,
        #[arg(long, required = true)]
        pid: Vec<i32>,
        /// The level, in the knob's unit (cpu_quota: milli-CPUs;
        /// cpu_priority: 1 idle, 2 normal; hedge: 1 off, 2 on).
        #[arg(long, allow_negative_numbers = true)]
        level: u32,
    },
}

/// A knob's name or alias, as a config names it.
fn parse_knob(s: &str) -> Result<Resource, String> {
    serde_json::from_value(serde_json::Value::String(s.to_owned())).map_err(|_| {
        let names: Vec<&str> = Resource::ALL
            .iter()
            .filter(|r| **r != Resource::Cores)
            .map(|r| r.name())
            .collect();
        format!(
            "{s:?} is not a knob set by a level: one of {} (cores: `qosd set cores`)",
            names.join(", ")
        )
    })
}

/// `qosd set level`'s knob and level, checked against the knob table
/// before anything is opened.
fn check_level(r: Resource, level: u32) -> anyhow::Result<()> {
    let k = knobs::knob(r);
    if k.level_alloc.is_none() {
        return Err(crate::usage!(
            "{}: not set by a level (a CPU list): {}",
            k.name,
            k.set_usage
        ));
    }
    let (lo, hi, what) = k.config_range;
    if !(lo..=hi).contains(&level) {
        return Err(crate::usage!(
            "--level: {level} is not {what} ({}, {})",
            k.name,
            k.unit
        ));
    }
    Ok(())
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum PriorityArg {
    /// `cpu.idle` 1 (else `cpu.weight` 1 / `cpu.shares` 2).
    Idle,
    /// `cpu.idle` 0 (else the default weight).
    Normal,
    /// Every thread `SCHED_FIFO` 1 (inherited by threads made later), in
    /// the app's group with an RT budget (`cpu.rt_runtime_us`,
    /// `--rt-budget-us`) where the kernel has one.
    Realtime,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum QuotaArg {
    Auto,
    Cgroup2,
    Cgroup1,
}

/// `--quota 0.3` in milli-CPUs.
fn parse_quota(s: &str) -> anyhow::Result<u32> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| crate::usage!("--quota: {s:?} is not a number of CPUs (e.g. 0.3)"))?;
    let milli = (v * 1000.0).round();
    if !v.is_finite() || milli < 1.0 {
        return Err(crate::usage!(
            "--quota: {s} is not a positive number of CPUs (at least 0.001)"
        ));
    }
    if milli > u32::MAX as f64 {
        return Err(crate::usage!(
            "--quota: {s} CPUs is more than this machine's online CPUs"
        ));
    }
    Ok(milli as u32)
}

/// `--period-us` within the kernel's range of CFS periods.
fn check_period(p: Option<u64>) -> anyhow::Result<()> {
    match p {
        Some(p) if !qosd_actuators::config::PERIOD_RANGE_US.contains(&p) => Err(crate::usage!(
            "--period-us: {p} is not in 1000-1000000 (1 ms to 1 s)"
        )),
        _ => Ok(()),
    }
}

/// `--rt-budget-us` in range, and given only where it counts: a set to
/// realtime (a budget that would be ignored is refused, not dropped).
fn check_rt_budget(args: &Args) -> anyhow::Result<()> {
    let Some(b) = args.rt_budget_us else {
        return Ok(());
    };
    qosd_actuators::realtime::check_budget(b).map_err(|m| crate::usage!("--rt-budget-us: {m}"))?;
    let realtime = match &args.knob {
        Knob::Priority { class, .. } => matches!(class, PriorityArg::Realtime),
        Knob::Level { knob, level, .. } => {
            *knob == Resource::CpuPriority && *level == knobs::PRIORITY_REALTIME
        }
        _ => false,
    };
    if !realtime {
        return Err(crate::usage!(
            "--rt-budget-us: only a set to realtime gives a group an RT budget \
             (`priority --class realtime`, `level cpu_priority --level 3`)"
        ));
    }
    Ok(())
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum CoresArg {
    Auto,
    Cgroup2,
    Cgroup1,
    Affinity,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum FreqArg {
    Auto,
    Cpufreq,
    Cpupower,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum WaysArg {
    Auto,
    Resctrl,
    Pqos,
}

fn parse_cpus(s: &str) -> anyhow::Result<Vec<u32>> {
    let v = cpulist::parse(s).map_err(|e| crate::usage!("--cpus: {e}"))?;
    if v.is_empty() {
        return Err(crate::usage!("--cpus: empty CPU list"));
    }
    Ok(v)
}

fn app(pids: &[i32]) -> AppTarget {
    let mut a = AppTarget::from_pid(pids[0]);
    a.pids = pids.to_vec();
    a
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let pids = match &args.knob {
        Knob::Cores { pid, .. }
        | Knob::Ways { pid, .. }
        | Knob::Mb { pid, .. }
        | Knob::Quota { pid, .. }
        | Knob::Priority { pid, .. }
        | Knob::Level { pid, .. } => pid.as_slice(),
        Knob::Hedge(h) => std::slice::from_ref(&h.pid),
        Knob::Freq { .. } => &[],
    };
    if pids.contains(&1) && !args.force {
        return Err(crate::usage!(
            "--pid 1 is init: its setting is the whole node's; add --force if that is meant"
        ));
    }
    let cfg = config(&args);
    if let Knob::Hedge(h) = &args.knob {
        return hedge::run(h, &args.root, &cfg.state_path(), args.dry_run, args.hold);
    }
    // Parse before anything is opened: bad input changes nothing.
    let quota = match &args.knob {
        Knob::Quota {
            quota,
            period_us,
            burst_pct,
            ..
        } => {
            check_period(*period_us)?;
            if *burst_pct > 100 {
                return Err(crate::usage!(
                    "--burst-pct: {burst_pct} is not in 0-100 (% of the quota)"
                ));
            }
            Some(parse_quota(quota)?)
        }
        _ => None,
    };
    if let Knob::Level { knob, level, .. } = &args.knob {
        check_level(*knob, *level)?;
    }
    check_rt_budget(&args)?;
    // Block the termination signals before changing anything, so that
    // with --hold a signal arriving mid-change waits and then restores.
    let sigs = if args.hold {
        Some(signals::block_termination().map_err(to_anyhow)?)
    } else {
        None
    };
    let mut acts = Actuators::new(&cfg).map_err(to_anyhow)?;
    let changes = apply(&mut acts, &args.knob, quota)?;
    print_changes(&changes, args.dry_run)?;
    let state = cfg.state_path();
    match sigs {
        Some(set) if !args.dry_run => {
            crate::outln!("holding; SIGINT/SIGTERM (any terminating signal) restores")?;
            let sig = signals::name(set.wait().map_err(to_anyhow)?);
            let restored = acts.restore_all().map_err(to_anyhow)?;
            for c in &restored {
                crate::outln!("restored {c}")?;
            }
            crate::outln!("restored on {sig}")?;
        }
        _ if !args.dry_run && !changes.is_empty() => {
            acts.keep_changes();
            crate::outln!(
                "originals recorded in {}; `qosd restore` puts them back",
                state.display()
            )?;
        }
        _ => acts.keep_changes(),
    }
    Ok(())
}

/// The actuators' config for one knob: the backend the user chose.
fn config(args: &Args) -> Config {
    let mut cfg = Config {
        root: args.root.clone(),
        dry_run: args.dry_run,
        state_file: args.state_file.clone(),
        restore_on_drop: false,
        rt_budget_us: args
            .rt_budget_us
            .unwrap_or(qosd_actuators::realtime::DEFAULT_BUDGET_US),
        ..Config::default()
    };
    match &args.knob {
        Knob::Cores { backend, .. } => {
            cfg.cores_backend = match backend {
                CoresArg::Auto => CoresBackend::Auto,
                CoresArg::Cgroup2 => CoresBackend::Cgroup2,
                CoresArg::Cgroup1 => CoresBackend::Cgroup1,
                CoresArg::Affinity => CoresBackend::Affinity,
            }
        }
        Knob::Freq { backend, .. } => {
            cfg.frequency_backend = match backend {
                FreqArg::Auto => FreqBackend::Auto,
                FreqArg::Cpufreq => FreqBackend::Cpufreq,
                FreqArg::Cpupower => FreqBackend::Cpupower,
            }
        }
        Knob::Ways { backend, .. } => {
            cfg.cache_ways_backend = match backend {
                WaysArg::Auto => WaysBackend::Auto,
                WaysArg::Resctrl => WaysBackend::Resctrl,
                WaysArg::Pqos => WaysBackend::Pqos,
            }
        }
        Knob::Quota {
            backend,
            period_us,
            burst_pct,
            ..
        } => {
            cfg.cpu_quota_period_us = *period_us;
            cfg.cpu_quota_burst_pct = *burst_pct;
            cfg.cpu_quota_backend = match backend {
                QuotaArg::Auto => QuotaBackend::Auto,
                QuotaArg::Cgroup2 => QuotaBackend::Cgroup2,
                QuotaArg::Cgroup1 => QuotaBackend::Cgroup1,
            }
        }
        Knob::Mb { .. } | Knob::Priority { .. } | Knob::Hedge(_) | Knob::Level { .. } => {}
    }
    cfg
}

/// Puts the one knob in force; the changes made.
fn apply(acts: &mut Actuators, knob: &Knob, quota: Option<u32>) -> anyhow::Result<Vec<Change>> {
    match knob {
        Knob::Cores { pid, cpus, .. } => acts.apply(
            &app(pid),
            &Allocation {
                cpus: Some(parse_cpus(cpus)?),
                ..Default::default()
            },
        ),
        Knob::Freq { cpus, mhz, .. } => acts.set_cpu_freq(&parse_cpus(cpus)?, *mhz),
        Knob::Ways { pid, ways, .. } => acts.apply(
            &app(pid),
            &Allocation {
                llc_ways: Some(*ways),
                ..Default::default()
            },
        ),
        Knob::Mb { pid, percent, .. } => acts.apply(
            &app(pid),
            &Allocation {
                mb_percent: Some(*percent),
                ..Default::default()
            },
        ),
        Knob::Quota { pid, .. } => acts.apply(
            &app(pid),
            &Allocation {
                cpu_quota_milli: quota,
                ..Default::default()
            },
        ),
        Knob::Priority { pid, class } => acts.apply(
            &app(pid),
            &Allocation {
                cpu_priority: Some(match class {
                    PriorityArg::Idle => qosd_core::knobs::PRIORITY_IDLE,
                    PriorityArg::Normal => qosd_core::knobs::PRIORITY_NORMAL,
                    PriorityArg::Realtime => qosd_core::knobs::PRIORITY_REALTIME,
                }),
                ..Default::default()
            },
        ),
        Knob::Level { knob, pid, level } => {
            let mut want = Allocation::default();
            if let Some(put) = knobs::knob(*knob).level_alloc {
                put(&mut want, *level);
            }
            acts.apply(&app(pid), &want)
        }
        // Handled by `run` before any actuator is set up.
        Knob::Hedge(_) => Ok(Vec::new()),
    }
    .map_err(to_anyhow)
}

fn print_changes(changes: &[Change], dry_run: bool) -> anyhow::Result<()> {
    if changes.is_empty() {
        crate::outln!("nothing to change: already in force")?;
    }
    for c in changes {
        if dry_run {
            crate::outln!("would change {c}")?;
        } else {
            crate::outln!("changed {c}")?;
        }
    }
    Ok(())
}
