//! One module per `qosd` subcommand: an `Args` (clap) and a `run`.

pub mod load;
pub mod trace;
