//! The evaluation of paper 003 (§4, Table 4.2, Fig. 4.2), reproducible:
//! in namespaces made by [`Topo`], a deterministic-chaos service and a
//! healthy replica, and three contenders over the same ids: the baseline
//! client, the application-level hedging client and the baseline client
//! with the kernel hedger on (through the actuator, journal and all).
//! Also an unrelated UDP flow's throughput with and without the hedger
//! attached (interleaved runs). Output: a P50/P95/P99/max table, a CDF
//! plot (SVG and PNG) and JSON.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use plotters::prelude::*;
use qosd_actuators::journal::Journal;
use qosd_actuators::{Ctx, Root};
use serde::Serialize;

use crate::actuator::Hedges;
use crate::bpf::Counters;
use crate::chaos::ChaosArgs;
use crate::client::{self, Mode, RunArgs, Sample, Summary};
use crate::delay::DelayStats;
use crate::flow;
use crate::route::in_netns;
use crate::stall::{self, Stall, StallWatch};
use crate::topo::Topo;
use crate::{HedgeSpec, IdRule};

/// Parameters of one evaluation.
#[derive(Debug, Clone, Serialize)]
pub struct EvalArgs {
    pub nr_requests: u64,
    pub streams: u64,
    pub t_hedge_ms: f64,
    pub base_us: u64,
    pub slow_us: u64,
    pub slow_permille: u32,
    pub budget_permille: u32,
    pub seed: u64,
    /// Interleaved rounds of the unrelated-flow throughput check.
    pub flow_rounds: u32,
    pub flow_requests: u64,
}

/// One contender's result.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub contender: String,
    #[serde(flatten)]
    pub summary: Summary,
    /// Requests answered more than once at the client.
    pub duplicates: usize,
    /// The slowest answered request: its id and whether the chaos server
    /// made it slow (a hedged request) or not (a fast one held up).
    pub slowest: Option<(u64, bool)>,
    /// The slowest request's send time (CLOCK_REALTIME ns) and latency, µs.
    pub slowest_at: Option<(u64, f64)>,
    /// The largest stall of each CPU ([`crate::stall`]) during the slowest
    /// request: (cpu, µs).
    pub slowest_stalls: Vec<(u32, f64)>,
    /// Stalls over [`STALL_MIN`] during the contender's run, its largest
    /// (µs), and the steal time the kernel counted meanwhile (ms).
    pub nr_stalls: usize,
    pub stall_max_us: f64,
    pub steal_ms: Option<u64>,
}

/// Wake-ups of the stall watch later than this count as stalls.
pub const STALL_MIN: Duration = Duration::from_micros(500);

/// One contender's samples and what the stall watch saw meanwhile.
struct Watched {
    samples: Vec<Sample>,
    stalls: Vec<Stall>,
    steal_ms: Option<u64>,
}

/// Runs one contender under a stall watch.
fn watched(topo: &Topo, args: &RunArgs) -> Result<Watched> {
    let w = StallWatch::start(STALL_MIN);
    let samples = run_client(topo, args);
    let (stalls, steal_ms) = w.stop();
    Ok(Watched {
        samples: samples?,
        stalls,
        steal_ms,
    })
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub args: EvalArgs,
    pub rows: Vec<Row>,
    pub kernel_counters: Counters,
    /// P99 of the baseline's requests that were not slow, ms.
    pub no_fault_p99_ms: f64,
    /// The thread delay line's figures (absent with netem).
    pub delay: Option<DelayStats>,
    /// The largest stall of each CPU while the delay line's latest clone
    /// was late: (cpu, µs).
    pub delay_stalls: Vec<(u32, f64)>,
    /// Unrelated flow, requests/s, per round: (without, with) the hedger.
    pub flow_rps: Vec<(f64, f64)>,
    /// The programs' cost on the unrelated flow (kernel bpf_stats):
    /// (program, runs, total ns).
    pub flow_bpf: Vec<(String, u64, u64)>,
    #[serde(skip)]
    pub cdf: Vec<(String, Vec<f64>)>,
}

const PORT: u16 = 27_027;

fn chaos(port: u16, base_us: u64, slow_permille: u32, slow_us: u64, seed: u64) -> ChaosArgs {
    ChaosArgs {
        listen: std::net::SocketAddr::from(([0, 0, 0, 0], port)),
        base_us,
        slow_permille,
        slow_us,
        seed,
        // The replica is another server: no anti-replay memory (it would
        // also make a contender fast on ids the previous one just sent).
        repeat_fast_ms: 0,
        id_offset: 0,
        id_len: 8,
        log: None,
        exit_after_s: 3600,
    }
}

/// The journal and context of an evaluation or test: a private state file.
pub fn context(state: &Path) -> Result<Ctx> {
    let j = Journal::open(Root::default(), Some(state.to_owned()), false)?;
    Ok(Ctx::new(Root::default(), false, j))
}

fn run_client(topo: &Topo, args: &RunArgs) -> Result<Vec<Sample>> {
    in_netns(&topo.client()?, || client::run(args))
}

fn row(name: &str, w: &Watched, a: &EvalArgs) -> Row {
    let s = &w.samples;
    let top = s
        .iter()
        .filter_map(|x| Some((x.latency_us?, x)))
        .max_by(|x, y| x.0.total_cmp(&y.0));
    let slowest_at = top.map(|(lat, x)| (x.sent_ns, lat));
    Row {
        contender: name.into(),
        summary: client::summarize(s),
        duplicates: s.iter().filter(|x| x.answers > 1).count(),
        slowest: top.map(|(_, x)| (x.id, crate::chaos::is_slow(a.seed, a.slow_permille, x.id))),
        slowest_at,
        slowest_stalls: slowest_at.map_or_else(Vec::new, |(at, lat)| {
            stall::during(&w.stalls, at, at + (lat * 1000.0) as u64)
        }),
        nr_stalls: w.stalls.len(),
        stall_max_us: w.stalls.iter().map(|x| x.late_us).fold(0.0, f64::max),
        steal_ms: w.steal_ms,
    }
}

/// Runs the evaluation; `state` is the journal's state file.
pub fn run(a: &EvalArgs, state: &Path) -> Result<Report> {
    let mut topo = Topo::new("ev")?;
    let svc = topo.serve(
        false,
        chaos(PORT, a.base_us, a.slow_permille, a.slow_us, a.seed),
    )?;
    topo.keep(svc);
    let rep = topo.serve(true, chaos(PORT, a.base_us, 0, 0, a.seed))?;
    topo.keep(rep);
    // The unrelated flow's server on a CPU of its own (see [`flow`]).
    let flow_srv = flow::on_cpu(flow::flow_cpus().map(|c| c.1), || {
        topo.serve(false, chaos(flow::PORT, 0, 0, 0, a.seed))
    })?;
    topo.keep(flow_srv);
    let t_hedge = Duration::from_secs_f64(a.t_hedge_ms / 1000.0);
    let base = RunArgs {
        service: Topo::service(PORT).into(),
        mode: Mode::Plain,
        first_id: 1,
        nr_requests: a.nr_requests,
        streams: a.streams,
        payload_len: 64,
        timeout: Duration::from_secs(1),
        drain: Duration::from_micros(a.slow_us + 200_000),
    };
    let spec = HedgeSpec {
        service: Topo::service(PORT),
        replica: Topo::replica(PORT),
        t_hedge_us: (a.t_hedge_ms * 1000.0) as u64,
        id: IdRule::default(),
        budget_permille: a.budget_permille,
        burst: 10,
        min_no_id: qosd_core::hedge::default_min_no_id(),
    };
    let mut ctx = context(state)?;
    let mut hedges = Hedges::default();
    let app = topo.app("eval-client");
    let mut rows = Vec::new();
    let mut cdf = Vec::new();
    // Every contender meets the same ids, hence the same slow requests.
    let baseline = watched(&topo, &base)?;
    let app_args = RunArgs {
        mode: Mode::AppHedged {
            replica: Topo::replica(PORT).into(),
            t_hedge,
        },
        ..base.clone()
    };
    let app_hedged = watched(&topo, &app_args)?;
    hedges.enable(&mut ctx, &app, &spec)?;
    let kernel = watched(&topo, &base);
    let counters = hedges.counters(&app.name).unwrap_or_default();
    // The no-fault p99: the baseline's requests that were not slow.
    let fast: Vec<Sample> = baseline
        .samples
        .iter()
        .filter(|s| !crate::chaos::is_slow(a.seed, a.slow_permille, s.id))
        .copied()
        .collect();
    let no_fault_p99_ms = client::summarize(&fast).p99_ms;
    let delay = hedges.delay_stats(&app.name);
    let (_, errs) = hedges.disable(&mut ctx, &app.name);
    let kernel = kernel?;
    let delay_stalls = delay.as_ref().map_or_else(Vec::new, |d| {
        let from = d
            .late_max_at_ns
            .saturating_sub((d.late_max_us * 1000.0) as u64);
        stall::during(&kernel.stalls, from, d.late_max_at_ns)
    });
    if let Some(e) = errs.into_iter().next() {
        return Err(e).context("turning the hedger off");
    }
    for (name, s) in [
        ("baseline", &baseline),
        ("app-hedged", &app_hedged),
        ("kernel-hedged", &kernel),
    ] {
        rows.push(row(name, s, a));
        cdf.push((name.to_owned(), client::sorted_ms(&s.samples)));
    }
    let (flow_rps, flow_bpf) = flow::rounds(
        a.flow_rounds,
        a.flow_requests,
        &topo,
        &mut ctx,
        &mut hedges,
        &app,
        &spec,
    )?;
    Ok(Report {
        args: a.clone(),
        rows,
        kernel_counters: counters,
        no_fault_p99_ms,
        delay,
        delay_stalls,
        flow_rps,
        flow_bpf,
        cdf,
    })
}

impl Report {
    /// The Markdown table of Table 4.2, the counters and the flow check.
    pub fn table(&self) -> String {
        let mut s = String::from(
            "| contender | requests | lost | P50 ms | P95 ms | P99 ms | max ms | duplicates | slowest request |\n\
             | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n",
        );
        for r in &self.rows {
            let m = &r.summary;
            s += &format!(
                "| {} | {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {} | {} |\n",
                r.contender,
                m.requests,
                m.lost,
                m.p50_ms,
                m.p95_ms,
                m.p99_ms,
                m.max_ms,
                r.duplicates,
                match r.slowest {
                    Some((id, true)) => format!("id {id} (a slow id)"),
                    Some((id, false)) => format!("id {id} (a fast id)"),
                    None => "-".into(),
                }
            );
        }
        s += &self.stall_lines();
        let c = &self.kernel_counters;
        s += &format!(
            "\nkernel hedger: {}\n",
            c.pairs()
                .iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        s +=
            &match &self.delay {
                Some(d) => {
                    format!(
                "delay line: qosd thread ({}, sleeps to {} µs before a due time, then spins; \
                 {:.0} ms of CPU), {} clones held, {} partial checksums completed, \
                 late p50 {:.0} µs, p99 {:.0} µs, max {:.0} µs at {} (longest send {:.0} µs; \
                 stalls of the whole CPU meanwhile: {})\n",
                if d.realtime { "SCHED_FIFO" } else { "normal class" },
                crate::delay::SPIN_NS / 1000,
                d.cpu_ms,
                d.held,
                d.csum_completed,
                d.late_p50_us,
                d.late_p99_us,
                d.late_max_us,
                clock_of(d.late_max_at_ns),
                d.send_max_us,
                stall::describe(&self.delay_stalls),
            )
                }
                None => "delay line: netem\n".to_owned(),
            };
        let extra = 100.0 * c.hedges_sent as f64 / c.requests.max(1) as f64;
        s += &format!(
            "extra requests {extra:.2} % (budget {:.1} %)\n",
            f64::from(self.args.budget_permille) / 10.0
        );
        s += &flow::summary(&self.flow_rps, self.args.flow_requests);
        for (name, n, ns) in &self.flow_bpf {
            s += &format!(
                "unrelated flow, {name}: {n} runs, {:.0} ns per packet (bpf_stats, one more \
                 on-round after the measured ones, which run without the stats)\n",
                *ns as f64 / (*n).max(1) as f64
            );
        }
        s + "\n" + &self.goals()
    }

    /// Per contender: when its slowest request was sent and which stalls
    /// of a whole CPU ([`crate::stall`]) it met, and its run's stalls and
    /// steal time.
    fn stall_lines(&self) -> String {
        let mut s = format!(
            "\nstalls (a SCHED_FIFO watch thread per CPU woke > {} µs late: the CPU ran nothing else \
             it could preempt for) and steal time (/proc/stat):\n",
            STALL_MIN.as_micros()
        );
        for r in &self.rows {
            let at = r.slowest_at.map_or("-".into(), |(t, lat)| {
                format!("sent {}, {:.2} ms", clock_of(t), lat / 1000.0)
            });
            s += &format!(
                "- {}: slowest request {at}; stalls during it: {}; in the run: {} stalls, largest \
                 {:.2} ms, steal {}\n",
                r.contender,
                stall::describe(&r.slowest_stalls),
                r.nr_stalls,
                r.stall_max_us / 1000.0,
                r.steal_ms.map_or("unknown".into(), |m| format!("{m} ms")),
            );
        }
        s
    }

    /// The goals, each with the figures it compares.
    pub fn goals(&self) -> String {
        let get = |name: &str| {
            self.rows
                .iter()
                .find(|r| r.contender == name)
                .map(|r| r.summary)
        };
        let (Some(app), Some(kernel)) = (get("app-hedged"), get("kernel-hedged")) else {
            return String::new();
        };
        let verdict = |ok: bool| if ok { "met" } else { "NOT met" };
        let bound = self.args.t_hedge_ms + 2.0 * self.no_fault_p99_ms;
        let c = &self.kernel_counters;
        let extra = c.hedges_sent as f64 * 1000.0 / c.requests.max(1) as f64;
        let [q1, median, q3] = flow::quartiles(&flow::ratios(&self.flow_rps));
        format!(
            "- p99 kernel-hedged {:.2} ms <= T_hedge + 2 x no-fault p99 = {:.2} + 2 x {:.2} = {bound:.2} ms: {}\n\
             - max kernel-hedged {:.2} ms <= max app-hedged {:.2} ms over {} requests: {}\n\
             - extra requests {extra:.1} per 1000 <= budget {}: {}\n\
             - unrelated flow, median ratio with/without the hedger {median:.3} \
             (quartiles {q1:.3}-{q3:.3}) >= 0.99: {}\n",
            kernel.p99_ms,
            self.args.t_hedge_ms,
            self.no_fault_p99_ms,
            verdict(kernel.p99_ms <= bound),
            kernel.max_ms,
            app.max_ms,
            kernel.requests,
            verdict(kernel.max_ms <= app.max_ms),
            self.args.budget_permille,
            verdict(extra <= f64::from(self.args.budget_permille)),
            verdict(median >= 0.99),
        )
    }

    /// CDF of latency (log x), one line per contender, as SVG and PNG.
    pub fn plot(&self, stem: &Path) -> Result<()> {
        let svg = stem.with_extension("svg");
        let png = stem.with_extension("png");
        draw(
            &SVGBackend::new(&svg, (900, 520)).into_drawing_area(),
            &self.cdf,
        )?;
        draw(
            &BitMapBackend::new(&png, (900, 520)).into_drawing_area(),
            &self.cdf,
        )?;
        Ok(())
    }
}

/// A CLOCK_REALTIME stamp as UTC time of day, to the µs.
fn clock_of(ns: u64) -> String {
    let day_us = (ns / 1000) % 86_400_000_000;
    let (h, m) = (day_us / 3_600_000_000, day_us / 60_000_000 % 60);
    format!("{h:02}:{m:02}:{:09.6}", (day_us % 60_000_000) as f64 / 1e6)
}

fn draw<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    cdf: &[(String, Vec<f64>)],
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let err = |e: &dyn std::fmt::Display| anyhow::anyhow!("plotting: {e}");
    area.fill(&WHITE).map_err(|e| err(&e))?;
    let lo = cdf
        .iter()
        .filter_map(|(_, v)| v.first())
        .copied()
        .fold(f64::INFINITY, f64::min);
    let hi = cdf
        .iter()
        .filter_map(|(_, v)| v.last())
        .copied()
        .fold(0.0, f64::max);
    let (lo, hi) = (lo.max(0.01) * 0.8, hi.max(lo.max(0.01) * 2.0) * 1.2);
    let mut chart = ChartBuilder::on(area)
        .caption(
            "Latency CDF (paper 003 Fig. 4.2), deterministic chaos",
            ("sans-serif", 20),
        )
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d((lo..hi).log_scale(), 0.0..1.0)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc("latency, ms (log)")
        .y_desc("fraction of requests")
        .draw()
        .map_err(|e| err(&e))?;
    let colors = [
        RGBColor(214, 39, 40),
        RGBColor(31, 119, 180),
        RGBColor(44, 160, 44),
    ];
    for (i, (name, v)) in cdf.iter().enumerate() {
        let n = v.len().max(1) as f64;
        let color = colors[i % colors.len()];
        chart
            .draw_series(LineSeries::new(
                v.iter().enumerate().map(|(k, x)| (*x, (k + 1) as f64 / n)),
                color.stroke_width(2),
            ))
            .map_err(|e| err(&e))?
            .label(name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(&e))?;
    area.present().map_err(|e| err(&e))?;
    Ok(())
}
