//! qosd scenarios: the open-loop load generator ([`load`]), scenario files,
//! and the simulated node that replays them with the daemon's policy code.

pub mod fixture;
pub mod load;
