//! One module per `qosd` subcommand: an `Args` (clap) and a `run`.

pub mod power;
pub mod trace;
