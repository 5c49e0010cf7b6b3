//! The real node's pieces, shared by `qosd run` (the daemon's node, in
//! [`crate::daemon::control`]) and a real `qosd replay` ([`replay`]): the
//! actuation of plans ([`actuate`], CPUs through [`coremap`]), an app's
//! latency window merged over all its pids ([`latency`]) and the power
//! sensor ([`power`]). Both nodes are driven by the one control loop,
//! [`qosd_core::control::ControlLoop`].

pub mod actuate;
pub mod coremap;
pub mod latency;
pub mod power;
pub mod replay;
