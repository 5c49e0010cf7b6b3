//! `qosd fixture` (hidden): the fixture HTTP server used by scenarios and
//! tests, so that a replay needs no binary besides `qosd`.

pub use qosd_scenarios::fixture::FixtureArgs as Args;

pub fn run(args: Args) -> anyhow::Result<()> {
    qosd_scenarios::fixture::serve(args)
}
