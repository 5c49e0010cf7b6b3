//! Types shared by every qosd crate: what a sensor measures, which
//! resources exist and what an app is given of each, and the policy
//! interface (snapshot → plan), the one reader of `/proc` and `/sys`
//! ([`sys`], under one root prefix), the [`control::Node`] interface and the
//! one control loop that the daemon, real replays and the simulator all
//! drive, and the YAML file reader whose errors name `file:line:col` and
//! the key (config, policies and scenarios alike). Kept small so that
//! sensors and actuators stay independent.

pub mod admit;
pub mod clock;
pub mod control;
pub mod cpulist;
pub mod hedge;
pub mod knobs;
pub mod measure;
pub mod oa;
pub mod plan;
pub mod policy;
pub mod power;
pub mod quota;
pub mod resources;
pub mod slo;
pub mod sys;
pub mod yamlfile;

pub use knobs::{knob, Knob, KNOBS};
pub use measure::{Feedback, LatencyFrom, LatencySummary};
pub use policy::{
    Allocations, AppClass, AppState, Decision, DecisionKind, FreqRange, Limits, MbRange, NodeCaps,
    Plan, Policy, QosTarget, Share, Skipped, Snapshot, Unmet,
};
pub use power::{AppPower, PowerSource};
pub use resources::{Allocation, QuotaRange, Resource};
