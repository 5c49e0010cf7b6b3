//! What a policy returns: a [`Plan`] (the allocation it wants for every
//! app), the [`Decision`]s that explain it (one change each, for the
//! decision log and `/metrics`) and the apps it could not help ([`Unmet`]).

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::policy::Allocations;
use crate::resources::Resource;

/// What a decision did to one app's resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DecisionKind {
    /// More of a resource for an app short of slack.
    Upsize,
    /// Less of a resource for an app with slack to spare.
    Downsize,
    /// Undo of an earlier downsize that hurt an app.
    Revert,
    /// Taken from a victim to pay for another app's upsize.
    Reclaim,
    /// Freed resources handed to a best-effort app.
    Grant,
    /// Not a change: a violating app nothing could be given to (a
    /// driver's decision log shows [`Unmet`] entries as this kind).
    CannotMeet,
}

/// One change in a plan, with the reason a person can read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    pub app: String,
    pub resource: Resource,
    pub kind: DecisionKind,
    /// Value before, in the resource's unit.
    pub from: u32,
    /// Value after, in the resource's unit.
    pub to: u32,
    /// Why, e.g. "slack 0.01 < 0.05 (p99 24.8 ms vs 25 ms)".
    pub reason: String,
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {:?} {}: {} -> {} {} ({})",
            self.app,
            self.kind,
            self.resource,
            self.from,
            self.to,
            self.resource.unit(),
            self.reason
        )
    }
}

/// A policy's answer: the allocation it wants for every app, and what it
/// changed and why. An empty `decisions` means "keep everything".
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Plan {
    pub allocations: Allocations,
    pub decisions: Vec<Decision>,
    /// Apps that violate their target and that nothing could be given to
    /// (every resource at its limit, no victim): the node cannot meet
    /// their QoS. Logged, counted and shown by every driver.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cannot_meet: Vec<Unmet>,
    /// Changes the policy considered and did not make, and why (e.g. a
    /// downsize predicted to push utilisation past its bound).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<Skipped>,
}

/// A change a policy did not try, and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Skipped {
    pub app: String,
    pub resource: Resource,
    pub kind: DecisionKind,
    pub reason: String,
}

/// A violating app the policy could not give anything to, and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Unmet {
    pub app: String,
    pub reason: String,
}

impl Plan {
    /// A plan that changes nothing.
    pub fn keep(current: &Allocations) -> Plan {
        Plan {
            allocations: current.clone(),
            decisions: Vec::new(),
            cannot_meet: Vec::new(),
            skipped: Vec::new(),
        }
    }
}
