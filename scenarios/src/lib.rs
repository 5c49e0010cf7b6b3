//! qosd scenarios: the open-loop load generator ([`load`]), scenario files
//! ([`scenario`]), calibration ([`calibrate`]), the simulated node that
//! replays scenarios with the daemon's policy code ([`sim`]), and the
//! outputs of a replay ([`timeline`], [`record`]); best-effort batch jobs
//! ([`batch`]); violations by load band and what best-effort apps got
//! ([`bands`]).

pub mod bands;
pub mod batch;
pub mod calibrate;
pub mod fixture;
pub mod load;
pub mod output;
pub mod plot;
pub mod record;
pub mod scenario;
pub mod seeds;
pub mod servers;
pub mod sim;
pub mod sweep;
pub mod timeline;
