//! `qosd batch` (hidden): the best-effort batch job of scenarios and
//! tests (`qosd_scenarios::batch`), so a co-runner needs no binary besides
//! `qosd`. Prints `ops COUNT ELAPSED_US` every `--report-ms`.

pub use qosd_scenarios::batch::BatchArgs as Args;

pub fn run(args: Args) -> anyhow::Result<()> {
    args.validate().map_err(|e| crate::usage!("{e}"))?;
    qosd_scenarios::batch::run_job(args)
}
