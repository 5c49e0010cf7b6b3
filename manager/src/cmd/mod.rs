//! One module per `qosd` subcommand: an `Args` (clap) and a `run`.

pub mod caps;
pub mod check;
pub mod completions;
pub mod metrics;
pub mod restore;
pub mod run;
pub mod set;
pub mod trace;
