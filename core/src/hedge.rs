//! What hedging one app's requests means ([`HedgeSpec`]: service, replica,
//! `T_hedge`, the request id rule, the budget), shared by the hedge
//! actuator, the actuators' config and the daemon's config. The hedger
//! itself is the `qosd-hedge` crate (docs/hedging.md).

use std::net::SocketAddrV4;

use serde::{Deserialize, Serialize};

/// Where a request's id sits: payload bytes `[offset, offset + len)`,
/// big-endian, in the request and at the same place in its answer (the
/// answer echoes it). DNS's id is `offset: 0, len: 2`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdRule {
    /// Offset of the id in the UDP payload, bytes.
    pub offset: u16,
    /// Length of the id, bytes (1 to 8).
    pub len: u8,
}

impl Default for IdRule {
    fn default() -> Self {
        IdRule { offset: 0, len: 8 }
    }
}

/// Largest UDP payload of one unfragmented IPv4 packet on a 1500-byte MTU.
pub const MAX_PAYLOAD: u32 = 1472;

/// What hedging one app's requests means.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HedgeSpec {
    /// The service the app sends requests to.
    pub service: SocketAddrV4,
    /// Where hedges go (may equal `service`: a second try at the same
    /// address).
    pub replica: SocketAddrV4,
    /// How long a request waits for its answer before it is hedged, µs.
    pub t_hedge_us: u64,
    #[serde(default)]
    pub id: IdRule,
    /// Hedges allowed per 1000 requests (50 = 5 % extra requests at most).
    #[serde(default = "default_budget")]
    pub budget_permille: u32,
    /// Hedges the budget may save up during quiet times.
    #[serde(default = "default_burst")]
    pub burst: u32,
    /// Requests without an id the programs must count, with none that
    /// carries one, before the app is refused (hedging turned off): one
    /// odd short packet to the service must not turn hedging off.
    #[serde(default = "default_min_no_id")]
    pub min_no_id: u32,
}

/// Hedges per 1000 requests unless set: 5 % extra load at most.
pub fn default_budget() -> u32 {
    50
}

/// Hedges the budget saves up unless set.
pub fn default_burst() -> u32 {
    10
}

/// Requests without an id before an app is refused, unless set.
pub fn default_min_no_id() -> u32 {
    16
}

/// Bounds of `min_no_id`.
pub const MIN_NO_ID_RANGE: std::ops::RangeInclusive<u32> = 1..=1_000_000;

/// Bounds of `t_hedge_us`: netem's resolution below, a request timeout above.
pub const T_HEDGE_US_RANGE: std::ops::RangeInclusive<u64> = 100..=10_000_000;

impl HedgeSpec {
    /// Checks the ranges; the message names the field and what is allowed.
    pub fn validate(&self) -> Result<(), String> {
        if !T_HEDGE_US_RANGE.contains(&self.t_hedge_us) {
            return Err(format!(
                "t_hedge_us: {} is out of range ({}..={})",
                self.t_hedge_us,
                T_HEDGE_US_RANGE.start(),
                T_HEDGE_US_RANGE.end()
            ));
        }
        if !(1..=8).contains(&self.id.len) {
            return Err(format!("id.len: {} is out of range (1..=8)", self.id.len));
        }
        if u32::from(self.id.offset) + u32::from(self.id.len) > MAX_PAYLOAD {
            return Err(format!(
                "id.offset: {} + id.len {} is past the largest payload ({MAX_PAYLOAD} bytes)",
                self.id.offset, self.id.len
            ));
        }
        if !(1..=1000).contains(&self.budget_permille) {
            return Err(format!(
                "budget_permille: {} is out of range (1..=1000)",
                self.budget_permille
            ));
        }
        if !(1..=100_000).contains(&self.burst) {
            return Err(format!(
                "burst: {} is out of range (1..=100000)",
                self.burst
            ));
        }
        if !MIN_NO_ID_RANGE.contains(&self.min_no_id) {
            return Err(format!(
                "min_no_id: {} is out of range ({}..={})",
                self.min_no_id,
                MIN_NO_ID_RANGE.start(),
                MIN_NO_ID_RANGE.end()
            ));
        }
        if self.service.port() == 0 || self.replica.port() == 0 {
            return Err("service and replica need a port".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> HedgeSpec {
        HedgeSpec {
            service: "10.0.0.1:9000".parse().unwrap(),
            replica: "10.0.0.2:9000".parse().unwrap(),
            t_hedge_us: 10_000,
            id: IdRule::default(),
            budget_permille: 50,
            burst: 10,
            min_no_id: 16,
        }
    }

    #[test]
    fn validation_names_the_field() {
        spec().validate().unwrap();
        type Case = (fn(&mut HedgeSpec), &'static str);
        let cases: [Case; 6] = [
            (|s| s.t_hedge_us = 5, "t_hedge_us"),
            (|s| s.id.len = 9, "id.len"),
            (|s| s.id.offset = 1470, "id.offset"),
            (|s| s.budget_permille = 0, "budget_permille"),
            (|s| s.burst = 0, "burst"),
            (|s| s.min_no_id = 0, "min_no_id"),
        ];
        for (f, key) in cases {
            let mut s = spec();
            f(&mut s);
            let e = s.validate().unwrap_err();
            assert!(e.starts_with(key), "{e}");
        }
    }

    #[test]
    fn spec_yaml_rejects_unknown_keys() {
        let e = serde_json::from_str::<HedgeSpec>(
            r#"{"service":"10.0.0.1:1","replica":"10.0.0.2:1","t_hedge_us":1000,"budget":5}"#,
        )
        .unwrap_err();
        assert!(e.to_string().contains("budget"), "{e}");
    }
}
