//! `qosd-hedge-eval`: paper 003's evaluation (Table 4.2, Fig. 4.2) in
//! network namespaces it makes and removes: baseline, application-level
//! and kernel hedging over the same deterministic-chaos ids. Needs root.

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use qosd_hedge::eval::{run, EvalArgs};

#[derive(Parser)]
#[command(name = "qosd-hedge-eval")]
struct Cli {
    /// Requests per contender.
    #[arg(long, default_value_t = 10_000)]
    requests: u64,
    /// Parallel sequential client streams.
    #[arg(long, default_value_t = 4)]
    streams: u64,
    /// Hedge delay, ms.
    #[arg(long, default_value_t = 10.0)]
    t_hedge_ms: f64,
    /// Service time of every request, µs.
    #[arg(long, default_value_t = 2000)]
    base_us: u64,
    /// Extra delay of a slow request, µs.
    #[arg(long, default_value_t = 400_000)]
    slow_us: u64,
    /// Slow requests per 1000.
    #[arg(long, default_value_t = 20)]
    slow_permille: u32,
    /// Hedges allowed per 1000 requests.
    #[arg(long, default_value_t = 50)]
    budget_permille: u32,
    #[arg(long, default_value_t = 3)]
    seed: u64,
    /// Interleaved off/on rounds of the unrelated-flow check.
    #[arg(long, default_value_t = 20)]
    flow_rounds: u32,
    /// Requests per unrelated-flow round (~1-2 s at this machine's rate).
    #[arg(long, default_value_t = 100_000)]
    flow_requests: u64,
    /// Output directory (table, JSON, CDF plot).
    #[arg(long, default_value = "target/bench/hedge")]
    out: PathBuf,
}

fn main() -> anyhow::Result<()> {
    let c = Cli::parse();
    let args = EvalArgs {
        nr_requests: c.requests,
        streams: c.streams,
        t_hedge_ms: c.t_hedge_ms,
        base_us: c.base_us,
        slow_us: c.slow_us,
        slow_permille: c.slow_permille,
        budget_permille: c.budget_permille,
        seed: c.seed,
        flow_rounds: c.flow_rounds,
        flow_requests: c.flow_requests,
    };
    std::fs::create_dir_all(&c.out).with_context(|| format!("creating {}", c.out.display()))?;
    let report = run(&args, &c.out.join("state.json"))?;
    let table = report.table();
    print!("{table}");
    std::fs::write(c.out.join("hedge.md"), &table)?;
    std::fs::write(
        c.out.join("hedge.json"),
        serde_json::to_string_pretty(&report)?,
    )?;
    report.plot(&c.out.join("hedge-cdf"))?;
    println!(
        "wrote {}/hedge.{{md,json}} and hedge-cdf.{{svg,png}}",
        c.out.display()
    );
    Ok(())
}
