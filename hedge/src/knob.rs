//! The hedge knob as the actuator registry holds it (its row in
//! `qosd_core::KNOBS` and in the actuators' `DETECTORS`): the level
//! (`HEDGE_OFF`/`HEDGE_ON`) a plan gives an app turns [`Hedges`] off or on
//! with the spec the config gives that app, inside the registry's change,
//! so caps, dry runs, the journal and restore are the same code as every
//! knob's. The binary links [`detect`] in with [`link`].

use std::collections::BTreeMap;

use qosd_actuators::caps::{Detected, Probe};
use qosd_actuators::{
    Actuator, Allocation, AppTarget, BackendProbe, Ctx, Error, KnobCaps, KnobRequest, Resource,
    Result,
};
use qosd_core::knobs::{HEDGE_OFF, HEDGE_ON};

use crate::actuator::Hedges;
use crate::HedgeSpec;

/// The backend's name in `qosd caps`.
const BACKEND: &str = "tc-bpf";

/// Links the hedge knob into the actuators' detection (call once at start).
pub fn link() {
    qosd_actuators::detect::link_hedge(detect);
}

/// What hedging needs here: the real network (no fake root), root, and
/// `ip`, `tc` and `nsenter` on PATH.
fn probe(p: &Probe) -> std::result::Result<(), String> {
    if !p.root.is_real() {
        return Err("hedging acts on the real network, not under a fake root".into());
    }
    if !nix::unistd::geteuid().is_root() {
        return Err("loading TC programs needs root".into());
    }
    for tool in ["ip", "tc", "nsenter"] {
        if qosd_actuators::tool::which(tool).is_none() {
            return Err(format!("`{tool}` is not on PATH"));
        }
    }
    Ok(())
}

/// The hedge knob's detection: available where [`probe`] passes.
pub fn detect(p: &Probe) -> Detected {
    let (probe, ok) = BackendProbe::of(BACKEND, probe(p), |_| {
        "TC eBPF programs; delay line netem where the kernel has it, else a qosd thread".into()
    });
    let caps = KnobCaps::choose(vec![probe], |_| true);
    let plugin = ok.filter(|_| caps.available).map(|()| {
        Box::new(HedgeKnob {
            specs: p.cfg.hedge.clone(),
            hedges: Hedges::default(),
            refused: BTreeMap::new(),
        }) as Box<dyn Actuator>
    });
    (caps, plugin)
}

/// The hedge knob: the config's specs by app name, and the hedged apps.
pub struct HedgeKnob {
    specs: BTreeMap<String, HedgeSpec>,
    hedges: Hedges,
    /// Times each app was refused by [`Hedges::check`] (its `refused`
    /// event).
    refused: BTreeMap<String, u64>,
}

impl HedgeKnob {
    /// The hedged apps (the daemon's API shows their specs).
    pub fn hedges(&self) -> &Hedges {
        &self.hedges
    }
}

impl Actuator for HedgeKnob {
    fn resource(&self) -> Resource {
        Resource::Hedge
    }

    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn apply(&mut self, ctx: &mut Ctx, plan: &KnobRequest<'_>) -> Result<()> {
        let name = &plan.app.name;
        match plan.want.hedge {
            None => Ok(()),
            Some(HEDGE_ON) => {
                let spec = self.specs.get(name).ok_or_else(|| {
                    Error::Invalid(format!(
                        "hedge for {name}: the config gives the app no `hedge:` section"
                    ))
                })?;
                self.hedges.turn_on(ctx, plan.app, spec)
            }
            Some(HEDGE_OFF) => match self.hedges.disable(ctx, name).1.into_iter().next() {
                Some(e) => Err(e),
                None => Ok(()),
            },
            Some(v) => Err(Error::Invalid(format!(
                "hedge for {name}: level {v} is neither {HEDGE_OFF} (off) nor {HEDGE_ON} (on)"
            ))),
        }
    }

    fn read(&self, _ctx: &Ctx, app: &AppTarget) -> Result<Allocation> {
        let on = self.hedges.enabled().any(|(a, _)| a == app.name);
        Ok(Allocation {
            hedge: Some(if on { HEDGE_ON } else { HEDGE_OFF }),
            ..Allocation::default()
        })
    }

    fn offer(&self, _probe: &Probe, node: &mut qosd_core::NodeCaps) {
        node.hedge = true;
    }

    fn counters(&self, app: &str) -> Vec<(&'static str, u64)> {
        let refused = self.refused.get(app).copied();
        let Some(c) = self.hedges.counters(app) else {
            return refused.map(|n| vec![("refused", n)]).unwrap_or_default();
        };
        let mut out = c.pairs().to_vec();
        out.push(("refused", refused.unwrap_or(0)));
        out
    }

    fn check(&mut self, ctx: &mut Ctx, app: &str) -> Result<()> {
        let r = self.hedges.check(ctx, app);
        if r.is_err() {
            *self.refused.entry(app.to_owned()).or_default() += 1;
        }
        r
    }

    fn quiesce(&mut self, ctx: &mut Ctx) {
        for e in self.hedges.disable_all(ctx).1 {
            tracing::warn!("hedge: turning off on exit: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fake_root_offers_no_hedging() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = qosd_actuators::Config {
            root: dir.path().to_owned(),
            ..Default::default()
        };
        let p = Probe {
            root: qosd_actuators::Root::new(dir.path()),
            cfg: &cfg,
            topo: Err("none".into()),
        };
        let (caps, plugin) = detect(&p);
        assert!(!caps.available && plugin.is_none());
        assert!(caps.reason.contains("fake root"), "{}", caps.reason);
    }
}
