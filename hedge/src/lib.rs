//! qosd hedge: kernel-level hedged UDP requests (paper 003) as an actuator.
//!
//! TC programs (`bpf/hedge.bpf.c`, loaded by [`bpf`]) clone an app's UDP
//! requests to a service into a delay line (a veth pair with netem), send
//! the clones still unanswered after `T_hedge` to a replica within a
//! budget, and let at most one answer per request id through.
//! [`actuator::Hedges`] turns it on and off per app through the actuators'
//! journal, so every TC filter, qdisc and veth is removed on exit and by
//! `qosd restore` after a SIGKILL. [`chaos`] is the deterministic-chaos
//! UDP server and [`client`] the clients of the evaluation.

pub mod actuator;
pub mod bpf;
pub mod chaos;
pub mod client;
pub mod delay;
pub mod drain;
pub mod eval;
pub mod flow;
pub mod knob;
pub mod route;
pub mod stall;
pub mod topo;
pub mod wait;

pub use qosd_core::hedge::{HedgeSpec, IdRule, MAX_PAYLOAD, T_HEDGE_US_RANGE};
