//! One module per `qosd` subcommand: an `Args` (clap) and a `run`.

pub mod caps;
pub mod check;
pub mod completions;
pub mod restore;
pub mod set;
pub mod trace;
