//! Types shared by every qosd crate: what a sensor measures and which
//! resources exist. Kept tiny so that sensors and actuators stay independent.

pub mod measure;
pub mod power;

pub use measure::{Feedback, LatencySummary};
pub use power::{AppPower, PowerSource};
