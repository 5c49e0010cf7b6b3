//! The real node's pieces, shared by `qosd run` (the daemon's node, in
//! [`crate::daemon::control`]) and a real `qosd replay` ([`replay`]): the
//! actuation of plans ([`actuate`], CPUs through [`coremap`]), the one
//! sensing layer that turns every sensor plugin's readings into the
//! policy's snapshot ([`sensing`]), an app's latency window ([`latency`])
//! and the replay's power sensor ([`power`]). Both nodes are driven by the
//! one control loop, [`qosd_core::control::ControlLoop`].
//!
//! Runs on this machine are set up here too, so that `cmd/` only reads
//! arguments: what they start from ([`setup`]), the real replay
//! ([`real_replay`]), calibrating real servers ([`sweep`]) and fitting the
//! simulated node to this machine ([`fit`], reading the server's CPU over
//! each load step with [`step_cpu`]).

pub mod actuate;
pub mod coremap;
pub mod fit;
pub mod latency;
pub mod power;
pub mod real_replay;
pub mod replay;
pub mod sensing;
pub mod setup;
pub mod step_cpu;
pub mod sweep;
