//! The rounds' figures and the markdown table `trace_overhead` prints:
//! per-pair ratios of each variant against its untraced partner, and the
//! untraced-vs-untraced pairs that say what the bench can resolve.

use crate::{med as median, Run};

/// What runs beside the untraced server in one side of a pair.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Side {
    /// Nothing: untraced (as the second side of a pair: the A/A control).
    Off,
    /// `qosd trace --pid` attached.
    Traced,
    /// Empty programs on the tracer's hooks (`bpf/floor.bpf.c`).
    Floor,
    /// Empty programs on hooks scoped to memcached's cgroup, and on
    /// `sock_recv_length`.
    CgroupFloor,
}

impl Side {
    fn label(self) -> &'static str {
        match self {
            Side::Off => "A/A: untraced vs untraced (the bench's resolution)",
            Side::Traced => "`qosd trace` attached",
            Side::Floor => "floor: empty programs on the same hooks",
            Side::CgroupFloor => {
                "scoped floor: empty cgroup_skb in/egress on memcached's cgroup + sock_recv_length"
            }
        }
    }
}

/// The pairs of one variant: its runs and their untraced partners.
#[derive(Default)]
struct Pairs {
    ratios: Vec<f64>,
    cpu_ratios: Vec<f64>,
    /// CPU per request in units of the speed probe's work.
    work_ratios: Vec<f64>,
    p50_deltas: Vec<f64>,
    base_rps: Vec<f64>,
    rps: Vec<f64>,
    base_cpu: Vec<f64>,
    cpu: Vec<f64>,
    tracer_cpu: Vec<f64>,
    tracer_ratios: Vec<f64>,
}

/// Every pair of every variant, in the order of `sides`.
pub struct Rounds {
    sides: Vec<(Side, Pairs)>,
    /// Traced runs whose programs BPF statistics timed (held elsewhere).
    pub timed_rounds: usize,
    /// The largest steal share of any run.
    max_steal: f64,
}

/// The p-quantile of v (linear interpolation; NaN when empty).
fn quantile(v: &[f64], p: f64) -> f64 {
    qosd_core::measure::quantile(v, p).unwrap_or(f64::NAN)
}

/// "median [q1, q3]" of v.
fn spread(v: &[f64]) -> String {
    format!(
        "**{:.3}** [{:.3}, {:.3}]",
        median(v),
        quantile(v, 0.25),
        quantile(v, 0.75)
    )
}

impl Rounds {
    pub fn new(sides: &[Side]) -> Self {
        Rounds {
            sides: sides.iter().map(|&s| (s, Pairs::default())).collect(),
            timed_rounds: 0,
            max_steal: 0.0,
        }
    }

    /// One pair: `a` untraced, `b` the variant `side`.
    pub fn push(&mut self, round: usize, side: Side, a: &Run, b: &Run, timed: bool) {
        eprintln!(
            "round {round} {side:?}: off {:.0} rps p50 {:.1} µs cpu {:.2} µs/req | {:.0} rps p50 {:.1} µs cpu {:.2} µs/req, tracer {:.2} µs/req, steal {:.1}/{:.1} %, probe {:.2}/{:.2} ms",
            a.rps, a.p50_us, a.cpu_us, b.rps, b.p50_us, b.cpu_us, b.tracer_us,
            a.steal * 100.0, b.steal * 100.0, a.probe_ns / 1e6, b.probe_ns / 1e6
        );
        self.timed_rounds += usize::from(timed);
        self.max_steal = self.max_steal.max(a.steal).max(b.steal);
        let Some((_, p)) = self.sides.iter_mut().find(|(s, _)| *s == side) else {
            return;
        };
        p.ratios.push(b.rps / a.rps);
        p.cpu_ratios.push(b.cpu_us / a.cpu_us);
        p.work_ratios
            .push((b.cpu_us / b.probe_ns) / (a.cpu_us / a.probe_ns));
        p.p50_deltas.push(b.p50_us - a.p50_us);
        p.base_rps.push(a.rps);
        p.rps.push(b.rps);
        p.base_cpu.push(a.cpu_us);
        p.cpu.push(b.cpu_us);
        p.tracer_cpu.push(b.tracer_us);
        p.tracer_ratios.push(b.tracer_us / a.cpu_us);
    }

    /// The markdown section of BENCHMARKS.md, from the rounds' figures.
    pub fn print_table(&self, rounds: usize, secs: f64, conns: usize, pin: Option<(usize, usize)>) {
        println!("## Request tracing overhead (memcached at saturation)\n");
        println!(
            "Command: `cargo run --release -p qosd-manager --example trace_overhead -- {rounds} {secs} {conns}`\n"
        );
        let placement = match pin {
            Some((s, c)) => {
                format!("memcached -t 1 pinned to CPU {s}, the client's threads to CPU {c}")
            }
            None => "memcached -t 2 and the client unpinned".into(),
        };
        println!(
            "{placement}, loopback, closed-loop `get` from {conns} connections; {rounds} rounds, \
             each a back-to-back pair of {secs} s runs per variant: untraced vs the variant \
             (the order alternates by round). CPU per request is the CPU time (schedstat) of \
             memcached's threads and the client's threads over the run, divided by the \
             requests: unlike throughput it does not count time lost to other load. CPU per \
             work unit divides that by a speed probe's CPU time for a fixed chain of work \
             on the same CPUs just before and after the run (the host's frequency and a busy \
             hyperthread sibling slow both alike; a guest sees neither). Ratios are median \
             [q1, q3] of the per-pair ratios.\n"
        );
        println!("| variant | untraced req/s | variant req/s | throughput ratio | CPU per request, µs (untraced / variant) | CPU-per-request ratio | CPU per work unit ratio | client p50 delta |");
        println!("|---|---|---|---|---|---|---|---|");
        for (side, p) in &self.sides {
            if p.ratios.is_empty() {
                continue;
            }
            println!(
                "| {} | {:.0} | {:.0} | {} | {:.2} / {:.2} | {} | {} | {:+.1} µs |",
                side.label(),
                median(&p.base_rps),
                median(&p.rps),
                spread(&p.ratios),
                median(&p.base_cpu),
                median(&p.cpu),
                spread(&p.cpu_ratios),
                spread(&p.work_ratios),
                median(&p.p50_deltas),
            );
        }
        if let Some((_, p)) = self.sides.iter().find(|(s, _)| *s == Side::Traced) {
            println!(
                "\nThe `qosd trace` process itself (ring buffer reader, statistics; not in the \
                 rows above, which carry the BPF programs' time): {:.2} µs per request, {:.3} of \
                 the untraced server + client's (medians).",
                median(&p.tracer_cpu),
                median(&p.tracer_ratios),
            );
        }
        self.print_resolution();
        println!("\nGoal: ratio >= 0.99 (lower quartile >= 0.97) and <= +1 µs p50.\n");
    }

    /// What the A/A pairs say about the bench's resolution.
    fn print_resolution(&self) {
        let freq = if std::path::Path::new("/sys/devices/system/cpu/cpu0/cpufreq").exists() {
            "cpufreq is there (check its governor)"
        } else {
            "no cpufreq in this guest: the host's frequency cannot be seen or fixed from here"
        };
        println!(
            "\nLargest steal share of any run: {:.2} %; {freq}.",
            self.max_steal * 100.0
        );
        let Some((_, aa)) = self.sides.iter().find(|(s, _)| *s == Side::Off) else {
            return;
        };
        if aa.ratios.len() < 2 {
            return;
        }
        let half = |v: &[f64]| (quantile(v, 0.75) - quantile(v, 0.25)) / 2.0 * 100.0;
        let (t, c, w) = (
            half(&aa.ratios),
            half(&aa.cpu_ratios),
            half(&aa.work_ratios),
        );
        let verdict = |h: f64| {
            if h > 1.0 {
                "wider than ±1 %: a 1 % goal on this figure cannot be resolved here"
            } else {
                "within ±1 %"
            }
        };
        println!(
            "A/A spread (half the q1–q3 width of untraced-vs-untraced pairs): throughput \
             ±{t:.1} % ({}), CPU per request ±{c:.1} % ({}), CPU per work unit ±{w:.1} % ({}).",
            verdict(t),
            verdict(c),
            verdict(w)
        );
    }
}
