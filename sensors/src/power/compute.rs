//! One interval's arithmetic, with no I/O: differences of the sched
//! program's cumulative counters, socket power from RAPL energy or the
//! model, eq. (1)-(2) attribution, and the per-process sums.

use std::collections::HashMap;

use qosd_core::PowerSource;

use super::attrib::{attribute, split, SocketUse};
use super::config::PowerConfig;
use super::model;
use super::rapl::SocketEnergy;
use super::sample::{NodePower, PowerSample, ProcessPower, SocketPower, ThreadPower, Weight};
use super::sched::{CpuCum, SchedCounters, SchedReading, ThreadCum};
use super::topology::CpuPackages;

/// Node energy for the interval.
#[derive(Debug, Clone, PartialEq)]
pub enum EnergyInput {
    /// Measured energy per socket (index = socket index).
    Rapl(Vec<SocketEnergy>),
    /// No measurement: the model, with each CPU's frequency ratio.
    Model { freq: Vec<Option<f64>> },
}

/// The cumulative figures an interval is measured from.
#[derive(Debug, Clone, Default)]
pub struct Baseline {
    pub now_ns: u64,
    pub threads: HashMap<u32, ThreadCum>,
    pub cpu_busy_ns: Vec<u64>,
    pub counters: SchedCounters,
}

fn slot(t: &ThreadCum, cpu: u32) -> CpuCum {
    t.per_cpu
        .iter()
        .find(|(c, _)| *c == cpu)
        .map_or_else(CpuCum::default, |(_, v)| *v)
}

/// Next baseline: the reading, without exited threads, keeping per slot the
/// larger of the two (a reading can miss part of an open slice; see
/// `Sched::read`), so nothing is ever counted twice.
pub fn advance(prev: &Baseline, cur: &SchedReading) -> Baseline {
    let mut threads = HashMap::with_capacity(cur.threads.len());
    for (tid, t) in cur.threads.iter().filter(|(_, t)| !t.exited) {
        let mut t = t.clone();
        if let Some(p) = prev.threads.get(tid).filter(|p| p.tgid == t.tgid) {
            for (cpu, c) in &mut t.per_cpu {
                let p = slot(p, *cpu);
                c.on_ns = c.on_ns.max(p.on_ns);
                c.sib_busy_ns = c.sib_busy_ns.max(p.sib_busy_ns);
                c.cycles = c.cycles.max(p.cycles);
            }
        }
        threads.insert(*tid, t);
    }
    let cpu_busy_ns = cur
        .cpu_busy_ns
        .iter()
        .enumerate()
        .map(|(i, b)| (*b).max(prev.cpu_busy_ns.get(i).copied().unwrap_or(0)))
        .collect();
    Baseline {
        now_ns: cur.now_ns.max(prev.now_ns),
        threads,
        cpu_busy_ns,
        counters: cur.counters,
    }
}

/// Computes the sample of the interval from `prev` to `cur`.
pub fn compute(
    cfg: &PowerConfig,
    topo: &CpuPackages,
    weight: Weight,
    prev: &Baseline,
    cur: &SchedReading,
    energy: &EnergyInput,
) -> PowerSample {
    let dt_ns = cur.now_ns.saturating_sub(prev.now_ns).max(1);
    let dt_s = dt_ns as f64 / 1e9;
    let (busy, socket_busy) = busy_fractions(topo, prev, cur, dt_ns);
    let (rows, uses) = thread_rows(topo, weight, prev, cur);
    let (source, mut sockets) = socket_power(cfg, topo, energy, &busy, &socket_busy, dt_s);

    // Eq. (2).
    let active: Vec<f64> = sockets.iter().map(|s| s.active_w).collect();
    let a = attribute(&active, &uses, cfg.ht_ratio);
    for (s, sp) in sockets.iter_mut().enumerate() {
        sp.active_w = a.socket_attributed_w[s];
        sp.idle_w = (sp.package_w + sp.dram_w.unwrap_or(0.0) - sp.active_w).max(0.0);
    }
    let total_w: f64 = sockets
        .iter()
        .map(|s| s.package_w + s.dram_w.unwrap_or(0.0))
        .sum();
    let active_w: f64 = sockets.iter().map(|s| s.active_w).sum();
    let dram: Vec<f64> = sockets.iter().filter_map(|s| s.dram_w).collect();
    let node = NodePower {
        total_w,
        active_w,
        idle_w: (total_w - active_w).max(0.0),
        dram_w: (!dram.is_empty()).then(|| dram.iter().sum()),
    };
    let share = |w: f64| if active_w > 0.0 { w / active_w } else { 0.0 };

    let mut threads: Vec<ThreadPower> = rows
        .iter()
        .enumerate()
        .map(|(i, r)| ThreadPower {
            tid: r.tid,
            tgid: r.tgid,
            on_cpu_ns: r.on_ns,
            cpu_fraction: (r.on_ns as f64 / dt_ns as f64).min(1.0),
            sib_busy_ns: r.sib_ns,
            cycles: (weight == Weight::Cycles).then_some(r.cycles),
            weighted: a.thread_weight[i],
            share: share(a.thread_w[i]),
            power_w: a.thread_w[i],
            energy_j: a.thread_w[i] * dt_s,
            exited: r.exited,
        })
        .collect();
    threads.sort_by(|x, y| y.power_w.total_cmp(&x.power_w).then(x.tid.cmp(&y.tid)));
    let processes = by_process(&threads, dt_ns, share);

    let c = &cur.counters;
    let pc = &prev.counters;
    PowerSample {
        interval_s: dt_s,
        source,
        energy_is_estimate: source.is_estimate(),
        weight,
        ht_ratio: cfg.ht_ratio,
        node,
        sockets,
        threads,
        processes,
        counters: SchedCounters {
            switches: c.switches.saturating_sub(pc.switches),
            table_full: c.table_full.saturating_sub(pc.table_full),
            cycles_err: c.cycles_err.saturating_sub(pc.cycles_err),
            unmatched: c.unmatched.saturating_sub(pc.unmatched),
            no_clock: c.no_clock.saturating_sub(pc.no_clock),
        },
    }
}

/// Busy fraction of each CPU over the interval, and the mean of each
/// socket's online CPUs.
fn busy_fractions(
    topo: &CpuPackages,
    prev: &Baseline,
    cur: &SchedReading,
    dt_ns: u64,
) -> (Vec<f64>, Vec<f64>) {
    let busy: Vec<f64> = cur
        .cpu_busy_ns
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let p = prev.cpu_busy_ns.get(i).copied().unwrap_or(0);
            (b.saturating_sub(p) as f64 / dt_ns as f64).clamp(0.0, 1.0)
        })
        .collect();
    let mut socket_busy = vec![0.0; topo.sockets.len().max(1)];
    for (cpu, c) in topo.cpus.iter().enumerate().filter(|(_, c)| c.online) {
        socket_busy[c.socket] += busy.get(cpu).copied().unwrap_or(0.0);
    }
    for (s, n) in topo.cpus_per_socket().iter().enumerate() {
        socket_busy[s] /= (*n).max(1) as f64;
    }
    (busy, socket_busy)
}

/// One thread's differences over the interval.
struct Row {
    tid: u32,
    tgid: u32,
    on_ns: u64,
    sib_ns: u64,
    cycles: u64,
    exited: bool,
}

/// Per-thread differences and their per-socket uses (eq. (1) inputs), for
/// the threads that ran.
fn thread_rows(
    topo: &CpuPackages,
    weight: Weight,
    prev: &Baseline,
    cur: &SchedReading,
) -> (Vec<Row>, Vec<Vec<SocketUse>>) {
    let mut rows = Vec::new();
    let mut uses: Vec<Vec<SocketUse>> = Vec::new();
    for (tid, t) in &cur.threads {
        let p = prev.threads.get(tid).filter(|p| p.tgid == t.tgid);
        let mut row = Row {
            tid: *tid,
            tgid: t.tgid,
            on_ns: 0,
            sib_ns: 0,
            cycles: 0,
            exited: t.exited,
        };
        let mut u: Vec<SocketUse> = Vec::new();
        for (cpu, c) in &t.per_cpu {
            let b = p.map(|p| slot(p, *cpu)).unwrap_or_default();
            let on = c.on_ns.saturating_sub(b.on_ns);
            let sib = c.sib_busy_ns.saturating_sub(b.sib_busy_ns).min(on);
            let cyc = c.cycles.saturating_sub(b.cycles);
            if on == 0 && cyc == 0 {
                continue;
            }
            row.on_ns += on;
            row.sib_ns += sib;
            row.cycles += cyc;
            let (alone, overlap) = match weight {
                Weight::Cycles => split(cyc as f64, on, sib),
                Weight::Time => ((on - sib) as f64, sib as f64),
            };
            let socket = topo.socket_of(*cpu as usize);
            match u.iter_mut().find(|x| x.socket == socket) {
                Some(x) => {
                    x.alone += alone;
                    x.overlap += overlap;
                }
                None => u.push(SocketUse {
                    socket,
                    alone,
                    overlap,
                }),
            }
        }
        if row.on_ns > 0 {
            rows.push(row);
            uses.push(u);
        }
    }
    (rows, uses)
}

/// Each socket's power over the interval: measured (RAPL), or modelled.
fn socket_power(
    cfg: &PowerConfig,
    topo: &CpuPackages,
    energy: &EnergyInput,
    busy: &[f64],
    socket_busy: &[f64],
    dt_s: f64,
) -> (PowerSource, Vec<SocketPower>) {
    let socket_id = |s: usize| topo.sockets.get(s).copied().unwrap_or(0);
    match energy {
        EnergyInput::Rapl(e) => (
            PowerSource::Rapl,
            (0..socket_busy.len())
                .map(|s| {
                    let e = e.get(s).copied().unwrap_or_default();
                    let package_w = e.package_j / dt_s;
                    let core_w = e.core_j.map(|j| j / dt_s);
                    SocketPower {
                        socket: socket_id(s),
                        package_w,
                        core_w,
                        dram_w: e.dram_j.map(|j| j / dt_s),
                        active_w: core_w.unwrap_or(package_w * socket_busy[s]),
                        idle_w: 0.0,
                        busy_fraction: socket_busy[s],
                    }
                })
                .collect(),
        ),
        EnergyInput::Model { freq } => (
            PowerSource::Model,
            model::evaluate(&cfg.model, topo, busy, freq)
                .iter()
                .enumerate()
                .map(|(s, m)| SocketPower {
                    socket: socket_id(s),
                    package_w: m.idle_w + m.active_w,
                    core_w: None,
                    dram_w: None,
                    active_w: m.active_w,
                    idle_w: 0.0,
                    busy_fraction: socket_busy[s],
                })
                .collect(),
        ),
    }
}

/// The threads' figures summed per process, highest power first.
fn by_process(
    threads: &[ThreadPower],
    dt_ns: u64,
    share: impl Fn(f64) -> f64,
) -> Vec<ProcessPower> {
    let dt_s = dt_ns as f64 / 1e9;
    let mut by_tgid: HashMap<u32, ProcessPower> = HashMap::new();
    for t in threads {
        let p = by_tgid.entry(t.tgid).or_insert(ProcessPower {
            tgid: t.tgid,
            nr_threads: 0,
            on_cpu_ns: 0,
            cpus_used: 0.0,
            share: 0.0,
            power_w: 0.0,
            energy_j: 0.0,
        });
        p.nr_threads += 1;
        p.on_cpu_ns += t.on_cpu_ns;
        p.power_w += t.power_w;
    }
    let mut processes: Vec<ProcessPower> = by_tgid
        .into_values()
        .map(|mut p| {
            p.cpus_used = p.on_cpu_ns as f64 / dt_ns as f64;
            p.share = share(p.power_w);
            p.energy_j = p.power_w * dt_s;
            p
        })
        .collect();
    processes.sort_by(|x, y| y.power_w.total_cmp(&x.power_w).then(x.tgid.cmp(&y.tgid)));
    processes
}

#[cfg(test)]
#[path = "compute_tests.rs"]
mod tests;
