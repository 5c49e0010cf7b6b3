//! `qosd-udp-chaos`: the deterministic-chaos UDP server of
//! [`qosd_hedge::chaos`] as its own process.

use clap::Parser;

/// UDP echo server whose slow requests are chosen by a seeded hash of the
/// request id (paper 003's deterministic chaos).
#[derive(Parser)]
#[command(name = "qosd-udp-chaos")]
struct Cli {
    #[command(flatten)]
    args: qosd_hedge::chaos::ChaosArgs,
}

fn main() -> std::process::ExitCode {
    match qosd_hedge::chaos::serve(Cli::parse().args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("qosd-udp-chaos: error: {e:#}");
            std::process::ExitCode::from(1)
        }
    }
}
