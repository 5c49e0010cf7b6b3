//! `trace_overhead`'s BPF cost runs: with the kernel's run-time statistics
//! on, each program's runs and run time per request, for the tracer on the
//! server, for the tracer attached with nothing to trace (every run leaves
//! at its first check: what each run on an untraced socket — the loopback
//! client's — costs), and for the floor's empty programs.

use std::collections::BTreeMap;
use std::process::{Child, Command};

use qosd_sensors::bpfstats::{self, RunStat, StatsOn};

use crate::rounds::Side;
use crate::{floor_hooks, med, run_load, start_trace, Setup};

/// BPF statistics off for the A/B rounds: on, they add two clock reads to
/// every run of every program (~0.4 µs per traced get, server and client,
/// in a profile here), so a sysctl left at 1 by another bench turns into
/// tracing overhead. The sysctl's own reference is dropped here; one held
/// by a process (BPF_ENABLE_STATS) cannot be, and does not show in the
/// sysctl: each traced round checks whether its programs were timed.
pub fn stats_off() -> &'static str {
    if !bpfstats::clear_leftover_sysctl() {
        return "";
    }
    " (kernel.bpf_stats_enabled was found at 1, left on by another bench: set to 0)"
}

/// The sentence on BPF statistics during the rounds, for the output.
pub fn stats_note(found_on: &str, timed_rounds: usize) -> String {
    if timed_rounds == 0 {
        return format!("BPF statistics were off during the rounds{found_on}.");
    }
    format!(
        "**BPF statistics were on in {timed_rounds} traced round(s)** (held by another \
         process): every BPF run paid two clock reads there; the figures overstate the \
         overhead{found_on}."
    )
}

/// What a cost run attaches.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Variant {
    /// `qosd trace --pid <memcached>`.
    Traced,
    /// `qosd trace --pid <an idle process>`: the programs run everywhere,
    /// trace nothing.
    Idle,
    /// The floor's empty programs.
    Floor,
    /// The scoped floor's.
    CgroupFloor,
}

impl Variant {
    fn label(self) -> &'static str {
        match self {
            Variant::Traced => "`qosd trace` on memcached (server and client runs)",
            Variant::Idle => {
                "`qosd trace` on an idle process (every run leaves at its first check)"
            }
            Variant::Floor => "floor (empty programs)",
            Variant::CgroupFloor => {
                "scoped floor (empty cgroup_skb on memcached's cgroup + sock_recv_length)"
            }
        }
    }
}

/// The stats of `progs` taken away from `before` (the floor's programs
/// stay loaded between runs; counts are cumulative).
fn minus(after: Vec<RunStat>, before: &[RunStat]) -> Vec<RunStat> {
    after
        .into_iter()
        .map(|mut r| {
            if let Some(b) = before.iter().find(|b| b.name == r.name) {
                r.runs -= b.runs.min(r.runs);
                r.run_time_ns -= b.run_time_ns.min(r.run_time_ns);
            }
            r
        })
        .filter(|r| r.runs > 0)
        .collect()
}

/// One run of `v` with the statistics on: its programs' figures and the
/// requests served.
fn cost_run(setup: &mut Setup, v: Variant) -> Result<(Vec<RunStat>, u64), String> {
    let (load, secs) = (setup.load, setup.load.secs);
    let (rows, run) = match v {
        Variant::Traced | Variant::Idle => {
            let mut idle: Option<Child> = (v == Variant::Idle).then(|| {
                Command::new("sleep")
                    .arg("600")
                    .spawn()
                    .expect("running sleep")
            });
            let pid = idle.as_ref().map_or(load.server, Child::id);
            let mut t = start_trace(&setup.qosd, pid);
            let run = run_load(&load, secs, None);
            let rows = bpfstats::held_by(t.id());
            let _ = t.kill();
            let _ = t.wait();
            if let Some(c) = idle.as_mut() {
                let _ = c.kill();
                let _ = c.wait();
            }
            (rows.into_iter().filter(|r| r.runs > 0).collect(), run)
        }
        Variant::Floor | Variant::CgroupFloor => {
            let side = if v == Variant::Floor {
                Side::Floor
            } else {
                Side::CgroupFloor
            };
            let hooks = floor_hooks(side, setup.cgroup.as_deref());
            let f = setup.floor.as_mut().ok_or("no floor loaded")?;
            let before = bpfstats::run_stats(f.progs());
            f.attach(hooks).map_err(|e| e.to_string())?;
            let run = run_load(&load, secs, None);
            f.detach();
            (minus(bpfstats::run_stats(f.progs()), &before), run)
        }
    };
    if rows.is_empty() {
        return Err(format!("no run counts for {}", v.label()));
    }
    Ok((rows, run.requests.max(1)))
}

/// `runs` cost runs of every variant there is, as markdown.
pub fn bpf_stats(setup: &mut Setup, floors: &[Side], runs: usize) -> Result<String, String> {
    let on = StatsOn::take().map_err(|e| format!("turning BPF statistics on: {e}"))?;
    let mut variants = vec![Variant::Traced, Variant::Idle];
    for f in floors {
        variants.push(if *f == Side::Floor {
            Variant::Floor
        } else {
            Variant::CgroupFloor
        });
    }
    let mut out = String::new();
    let mut summary = String::from(
        "| variant (cost runs) | runs per get | ns per get (median; every run) |\n|---|---|---|\n",
    );
    for v in variants {
        let mut results = vec![];
        for _ in 0..runs {
            results.push(cost_run(setup, v)?);
        }
        let (table, line) = table(v, &results, runs, setup.load.secs);
        out += &table;
        summary += &line;
    }
    drop(on);
    Ok(format!(
        "BPF run time with kernel.bpf_stats_enabled (the statistics' own clock reads add to \
         the figures; on loopback the client's socket events run the programs too):\n\n\
         {summary}\n{out}"
    ))
}

/// The per-program table of one variant and its summary line.
fn table(v: Variant, results: &[(Vec<RunStat>, u64)], runs: usize, secs: f64) -> (String, String) {
    // Per program, per run: (runs per request, ns per request).
    let mut per: BTreeMap<String, (Vec<f64>, Vec<f64>)> = BTreeMap::new();
    let (mut total_runs, mut total_ns, mut requests) = (vec![], vec![], vec![]);
    for (rows, req) in results {
        let req = *req as f64;
        requests.push(req);
        total_runs.push(rows.iter().map(|r| r.runs).sum::<u64>() as f64 / req);
        total_ns.push(rows.iter().map(|r| r.run_time_ns).sum::<u64>() as f64 / req);
        for r in rows {
            let e = per.entry(r.name.clone()).or_default();
            e.0.push(r.runs as f64 / req);
            e.1.push(r.run_time_ns as f64 / req);
        }
    }
    let mut rows: Vec<(String, f64, f64)> = per
        .into_iter()
        .map(|(name, (r, n))| (name, med(&r), med(&n)))
        .collect();
    rows.sort_by(|a, b| b.2.total_cmp(&a.2));
    let mut s = format!(
        "{}: median of {runs} run(s) of {secs} s, {:.0} requests each (median):\n\n\
         | program | runs per request | ns per run | ns per request |\n|---|---|---|---|\n",
        v.label(),
        med(&requests)
    );
    let per_run = |runs: f64, ns: f64| if runs > 0.0 { ns / runs } else { 0.0 };
    for (name, r, n) in &rows {
        s += &format!("| {name} | {r:.2} | {:.0} | {n:.0} |\n", per_run(*r, *n));
    }
    let (r, n) = (med(&total_runs), med(&total_ns));
    let mut sorted = total_ns.clone();
    sorted.sort_by(f64::total_cmp);
    let every = sorted
        .iter()
        .map(|v| format!("{v:.0}"))
        .collect::<Vec<_>>()
        .join(", ");
    s += &format!(
        "| **all** | {r:.2} | {:.0} | **{n:.0}** (runs: {every}) |\n\n",
        per_run(r, n)
    );
    (
        s,
        format!("| {} | {r:.2} | {n:.0} ({every}) |\n", v.label()),
    )
}
