//! One module per `qosd` subcommand: an `Args` (clap) and a `run`.

pub mod batch;
pub mod calibrate;
pub mod caps;
pub mod check;
pub mod compare;
pub mod completions;
pub mod fixture;
pub mod load;
pub mod metrics;
pub mod net;
pub mod power;
pub mod replay;
pub mod restore;
pub mod run;
pub mod set;
pub mod trace;
