//! Types shared by every qosd crate: what a sensor measures, which
//! resources exist, and the policy interface (snapshot → plan) that the
//! daemon and the simulator both drive. Kept tiny so that sensors and
//! actuators stay independent.

pub mod measure;
pub mod policy;

pub use measure::{Feedback, LatencySummary};
pub use policy::{
    Allocation, Allocations, AppClass, AppState, Decision, DecisionKind, FreqRange, Limits,
    MbRange, NodeCaps, Plan, Policy, QosTarget, Resource, Snapshot,
};
