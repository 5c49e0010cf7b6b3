//! `qosd trace`: live per-interval RPS and latency of processes.
use clap::Args as ClapArgs;

#[derive(ClapArgs, Debug)]
pub struct Args {
    #[arg(long, required = true)]
    pub pid: Vec<i32>,
}

pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("work in progress")
}
