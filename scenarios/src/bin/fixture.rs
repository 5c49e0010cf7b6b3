//! `qosd-fixture`: the fixture HTTP server of [`qosd_scenarios::fixture`]
//! as its own process, for tests and scenarios.

use clap::Parser;

/// HTTP/1.1 test server with an injected delay, CPU work, a stall and
/// deterministic slow requests (GET /r/<id>). Loopback only.
#[derive(Parser)]
#[command(name = "qosd-fixture")]
struct Cli {
    #[command(flatten)]
    args: qosd_scenarios::fixture::FixtureArgs,
}

fn main() -> std::process::ExitCode {
    match qosd_scenarios::fixture::serve(Cli::parse().args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("qosd-fixture: error: {e:#}");
            std::process::ExitCode::from(1)
        }
    }
}
