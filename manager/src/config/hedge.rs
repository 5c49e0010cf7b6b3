//! An app's `hedge:` section: kernel-level hedging of its UDP requests to
//! a service (docs/hedging.md), and whether it starts on. Rule policies
//! (`{ resource: hedge, change: +1 }`) and PARTIES (a last resort) turn it
//! on and off afterwards, within these settings.

use std::net::SocketAddrV4;

use qosd_core::hedge::{default_budget, default_burst, default_min_no_id, HedgeSpec, IdRule};
use qosd_core::knobs::{HEDGE_OFF, HEDGE_ON};
use serde::{Deserialize, Serialize};

use crate::yamlfile::{Invalid, KeyPath};

/// `apps[].hedge`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HedgeConfig {
    /// The service (IPv4 address and UDP port) the app sends requests to.
    pub service: SocketAddrV4,
    /// Where hedges go: another replica, or the service itself.
    pub replica: SocketAddrV4,
    /// A request still unanswered after this long is hedged, ms (0.1 to
    /// 10000).
    pub t_hedge_ms: f64,
    /// Where the request id sits in the payload (`{ offset, len }`,
    /// bytes, big-endian; default offset 0, len 8; DNS: 0 and 2).
    #[serde(default)]
    pub id: IdRule,
    /// Hedges allowed per 1000 requests (1 to 1000; default 50 = 5 %).
    #[serde(default = "default_budget")]
    pub budget_permille: u32,
    /// Hedges the budget may save up (1 to 100000; default 10).
    #[serde(default = "default_burst")]
    pub burst: u32,
    /// Requests without an id (and none with one) before the app is
    /// refused (1 to 1000000; default 16): one odd packet is not enough.
    #[serde(default = "default_min_no_id")]
    pub min_no_id: u32,
    /// `on` (default): hedged from the start; `off`: only once a policy
    /// turns it on.
    #[serde(default)]
    pub start: HedgeStart,
}

/// Whether an app starts hedged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HedgeStart {
    #[default]
    On,
    Off,
}

impl HedgeConfig {
    /// The hedger's spec (checked by [`HedgeConfig::validate`] first).
    pub fn spec(&self) -> HedgeSpec {
        HedgeSpec {
            service: self.service,
            replica: self.replica,
            t_hedge_us: (self.t_hedge_ms * 1000.0).round() as u64,
            id: self.id,
            budget_permille: self.budget_permille,
            burst: self.burst,
            min_no_id: self.min_no_id,
        }
    }

    /// The knob level the app starts with.
    pub fn start_level(&self) -> u32 {
        match self.start {
            HedgeStart::On => HEDGE_ON,
            HedgeStart::Off => HEDGE_OFF,
        }
    }

    /// Checks the ranges; `at` is the `hedge` key.
    pub fn validate(&self, at: &KeyPath) -> Result<(), Invalid> {
        let t = self.t_hedge_ms;
        if !(t.is_finite() && (0.1..=10_000.0).contains(&t)) {
            return Err(Invalid::new(
                at.key("t_hedge_ms"),
                format!("{t} is out of range (0.1 to 10000 ms)"),
            ));
        }
        // The spec's own checks name their field first ("id.len: ...").
        self.spec().validate().map_err(|msg| {
            let field = msg.split(':').next().unwrap_or_default();
            let key = match field {
                "id.len" => at.key("id").key("len"),
                "id.offset" => at.key("id").key("offset"),
                "budget_permille" | "burst" | "min_no_id" => at.key(field),
                _ => at.clone(),
            };
            Invalid::new(key, msg)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(y: &str) -> HedgeConfig {
        serde_yaml_ng::from_str(y).unwrap()
    }

    #[test]
    fn defaults_and_spec() {
        let h = parse("{ service: 10.0.0.1:53, replica: 10.0.0.2:53, t_hedge_ms: 10 }");
        let s = h.spec();
        assert_eq!(s.t_hedge_us, 10_000);
        assert_eq!((s.budget_permille, s.burst, s.min_no_id), (50, 10, 16));
        assert_eq!(h.start_level(), HEDGE_ON);
        h.validate(&KeyPath::root()).unwrap();
    }

    #[test]
    fn bad_values_name_their_key() {
        for (y, key) in [
            ("t_hedge_ms: 0", "t_hedge_ms"),
            ("t_hedge_ms: .nan", "t_hedge_ms"),
            ("t_hedge_ms: 5, id: { offset: 0, len: 9 }", "len"),
            ("t_hedge_ms: 5, budget_permille: 0", "budget_permille"),
            ("t_hedge_ms: 5, min_no_id: 0", "min_no_id"),
        ] {
            let h = parse(&format!(
                "{{ service: 10.0.0.1:53, replica: 10.0.0.2:53, {y} }}"
            ));
            let e = h.validate(&KeyPath::root().key("hedge")).unwrap_err();
            assert!(format!("{e:?}").contains(key), "{y}: {e:?}");
        }
    }
}
