//! The evaluation of paper 003 (§4, Table 4.2, Fig. 4.2), reproducible:
//! in namespaces made by [`Topo`], a deterministic-chaos service and a
//! healthy replica, and three contenders over the same ids: the baseline
//! client, the application-level hedging client and the baseline client
//! with the kernel hedger on (through the actuator, journal and all).
//! Also an unrelated UDP flow's throughput with and without the hedger
//! attached (interleaved runs). Output: a P50/P95/P99/max table, a CDF
//! plot (SVG and PNG) and JSON; the text is written in `report`, the plot
//! drawn in `plot`.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
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

mod plot;
mod report;

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
        ChaosArgs::on_port(PORT, a.base_us, a.slow_permille, a.slow_us, a.seed),
    )?;
    topo.keep(svc);
    let rep = topo.serve(true, ChaosArgs::on_port(PORT, a.base_us, 0, 0, a.seed))?;
    topo.keep(rep);
    // The unrelated flow's server on a CPU of its own (see [`flow`]).
    let flow_srv = flow::on_cpu(flow::flow_cpus().map(|c| c.1), || {
        topo.serve(false, ChaosArgs::on_port(flow::PORT, 0, 0, 0, a.seed))
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
