//! The evaluation's side check (issue 27): an unrelated UDP flow on the
//! hedged client's interface, with the hedger off and on, interleaved.
//! The flow is a ping-pong of `streams` sequential senders, so its rate is
//! set by wake-ups and the scheduler as much as by the programs (~0.3 µs a
//! request/answer pair): short rounds with threads free to wander between
//! the CPUs swung 0.3-1.5x from round to round. So the flow's client
//! streams and its server each run on a CPU of their own (when there are
//! two), every round is long (`flow_requests`, ~1-2 s), and the verdict is
//! the median of many rounds' on/off ratios, shown with its quartiles.

use std::time::{Duration, Instant};

use anyhow::Result;
use qosd_actuators::{AppTarget, Ctx};
use qosd_sensors::bpfstats::RunStat;

use crate::actuator::Hedges;
use crate::client::{self, Mode, RunArgs};
use crate::route::in_netns;
use crate::topo::Topo;
use crate::HedgeSpec;

/// Per round (without, with) req/s; per program (name, runs, ns).
pub type FlowResult = (Vec<(f64, f64)>, Vec<(String, u64, u64)>);

/// The CPUs of the flow's two ends: (client streams, server), or `None`
/// on a one-CPU machine (nothing to separate).
pub fn flow_cpus() -> Option<(u32, u32)> {
    let cpus = qosd_actuators::proc::get_affinity(0).ok()?;
    match cpus.as_slice() {
        [a, b, ..] => Some((*a, *b)),
        _ => None,
    }
}

/// Runs `f` with the calling thread bound to `cpu` (threads `f` starts
/// inherit it and keep it), then puts the thread's CPUs back.
pub fn on_cpu<T>(cpu: Option<u32>, f: impl FnOnce() -> T) -> T {
    let Some(cpu) = cpu else {
        return f();
    };
    let before = qosd_actuators::proc::get_affinity(0).ok();
    if let Err(e) = qosd_actuators::proc::set_affinity(0, &[cpu]) {
        tracing::warn!("not pinning the unrelated flow to CPU {cpu}: {e}");
    }
    let out = f();
    if let Some(b) = before {
        let _ = qosd_actuators::proc::set_affinity(0, &b);
    }
    out
}

/// The unrelated flow's port on the service's host (the hedged service is
/// on another).
pub const PORT: u16 = 27_028;

/// The unrelated flow ([`PORT`] on the service's host) with the hedger off
/// and on, interleaved (off/on, then on/off, ...: neither side always
/// runs first); the client streams on the first of [`flow_cpus`] (the
/// server was started on the second).
pub fn rounds(
    nr_rounds: u32,
    nr_requests: u64,
    topo: &Topo,
    ctx: &mut Ctx,
    hedges: &mut Hedges,
    app: &AppTarget,
    spec: &HedgeSpec,
) -> Result<FlowResult> {
    let args = RunArgs {
        service: Topo::service(PORT).into(),
        mode: Mode::Plain,
        first_id: 1,
        nr_requests,
        // Enough parallel streams to keep a CPU busy: throughput, not one
        // stream's round-trip time.
        streams: 8,
        payload_len: 64,
        timeout: Duration::from_secs(1),
        drain: Duration::from_millis(1),
    };
    let cpu = flow_cpus().map(|c| c.0);
    let rate = || -> Result<f64> {
        let t = Instant::now();
        let s = on_cpu(cpu, || in_netns(&topo.client()?, || client::run(&args)))?;
        let secs = t.elapsed().as_secs_f64();
        let answered = s.iter().filter(|x| x.latency_us.is_some()).count();
        // A lost request stalls its stream for the timeout: say so, it
        // weighs on the rate far more than the programs' time.
        let sum = client::summarize(&s);
        eprintln!(
            "unrelated flow: {answered} answered, {} lost in {secs:.3} s, p99 {:.2} ms, max {:.2} ms",
            sum.lost, sum.p99_ms, sum.max_ms
        );
        Ok(answered as f64 / secs)
    };
    // The stats cost two clock reads per program run: off in the
    // measured rounds, on for one more on-round that gives the cost.
    qosd_sensors::bpfstats::clear_leftover_sysctl();
    let on_round = |hedges: &mut Hedges, ctx: &mut Ctx| -> Result<(f64, Vec<RunStat>)> {
        hedges.enable(ctx, app, spec)?;
        let on = rate();
        let stats = hedges.run_stats(&app.name);
        let (_, errs) = hedges.disable(ctx, &app.name);
        let on = on?;
        if let Some(e) = errs.into_iter().next() {
            return Err(e.into());
        }
        Ok((on, stats))
    };
    let mut out = Vec::new();
    for round in 0..nr_rounds {
        let off_first = round % 2 == 0;
        let off_before = if off_first { Some(rate()?) } else { None };
        let (on, _) = on_round(hedges, ctx)?;
        let off = match off_before {
            Some(off) => off,
            None => rate()?,
        };
        out.push((off, on));
    }
    let stats = {
        // A reference, not the sysctl: off again when dropped, whatever
        // happens (bpfstats::StatsOn).
        let _on = qosd_sensors::bpfstats::StatsOn::take().ok();
        on_round(hedges, ctx)?.1
    };
    let cost = stats
        .into_iter()
        .map(|s| (s.name, s.runs, s.run_time_ns))
        .collect();
    Ok((out, cost))
}

/// Lower quartile, median and upper quartile of `v` (linear between
/// ranks, as Python's `statistics.quantiles(..., method="inclusive")`, the
/// other benches' method); NaN when empty.
pub fn quartiles(v: &[f64]) -> [f64; 3] {
    [0.25, 0.5, 0.75].map(|p| qosd_core::measure::quantile(v, p).unwrap_or(f64::NAN))
}

/// The on/off ratio of each round.
pub fn ratios(rps: &[(f64, f64)]) -> Vec<f64> {
    rps.iter().map(|(off, on)| on / off).collect()
}

/// The flow's lines of the report: the rates' and ratios' medians and
/// quartiles, and every round's ratio (the spread is part of the result).
pub fn summary(rps: &[(f64, f64)], nr_requests: u64) -> String {
    let off: Vec<f64> = rps.iter().map(|r| r.0).collect();
    let on: Vec<f64> = rps.iter().map(|r| r.1).collect();
    let [q1, m, q3] = quartiles(&ratios(rps));
    let pinned = match flow_cpus() {
        Some((c, s)) => format!("client streams on CPU {c}, server on CPU {s}"),
        None => "one CPU".to_owned(),
    };
    let each: Vec<String> = ratios(rps).iter().map(|r| format!("{r:.3}")).collect();
    format!(
        "unrelated flow: {} interleaved rounds of {nr_requests} requests ({pinned}): \
         median {:.0} req/s without, {:.0} with the hedger; on/off ratio median {m:.3}, \
         quartiles {q1:.3}-{q3:.3}; per round: {}\n",
        rps.len(),
        quartiles(&off)[1],
        quartiles(&on)[1],
        each.join(" ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quartiles_interpolate_between_ranks() {
        assert_eq!(quartiles(&[4.0, 1.0, 3.0, 2.0, 5.0]), [2.0, 3.0, 4.0]);
        assert_eq!(quartiles(&[1.0, 2.0, 3.0, 4.0]), [1.75, 2.5, 3.25]);
        assert_eq!(quartiles(&[7.0]), [7.0, 7.0, 7.0]);
        assert!(quartiles(&[])[1].is_nan());
    }
}
