//! `qosd compare`: a table and an overlay plot of several replays (e.g.
//! `--feedback ebpf` against `--feedback client`, or two policies).

use std::path::PathBuf;

use clap::Args as ClapArgs;

use crate::usage;

#[derive(ClapArgs, Debug)]
#[command(after_help = "Examples:\n  \
    qosd replay scenarios/ramp.yaml --sim --feedback ebpf\n  \
    qosd replay scenarios/ramp.yaml --sim --feedback client\n  \
    qosd compare out/ramp-sim-ebpf out/ramp-sim-client    writes out/compare.svg and .png\n  \
    qosd replay scenarios/ramp.yaml --sim --seeds 5 --out out/ramp5\n  \
    qosd compare out/ramp5 out/ramp-sim-client            mean ± 95 % CI over the 5 seeds")]
pub struct Args {
    /// Output folders of `qosd replay` (each with summary.json and
    /// timeline.csv), or of `qosd replay --seeds N` (with seeds.json): its
    /// figures are the mean ± 95 % confidence interval over the seeds.
    #[arg(required = true, num_args = 1..)]
    pub runs: Vec<PathBuf>,
    /// Where to write compare.svg and compare.png.
    #[arg(long, value_name = "DIR", default_value = "out")]
    pub out: PathBuf,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    for r in &args.runs {
        let run = r.join("summary.json").is_file() && r.join("timeline.csv").is_file();
        if !run && !r.join("seeds.json").is_file() {
            return Err(usage!(
                "{}: not a replay output folder (no summary.json and timeline.csv, nor seeds.json)",
                r.display()
            ));
        }
    }
    let table = qosd_scenarios::output::compare(&args.runs, &args.out)?;
    crate::out!("{table}")?;
    crate::outln!("\nwrote {}/compare.svg and compare.png", args.out.display())?;
    Ok(())
}
