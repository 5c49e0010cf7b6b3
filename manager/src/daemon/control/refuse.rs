//! Knobs that refuse an app after seeing it (the hedger, when the app's
//! requests carry no id under its rule): checked at every decision tick,
//! before the policy decides, so the plan already has the knob at its
//! lowest level and the app's limits keep it there. The reason stays in
//! the app's note (API), goes to the log (a line on stdout), and the
//! knob's `refused` event counts it in `/metrics`.

use qosd_core::knobs::knob;

use super::{DaemonNode, Events};

impl DaemonNode {
    /// Runs the knobs' checks for every managed app; lines to log.
    pub(super) fn check_knobs(&mut self) -> Events {
        let mut ev = Events::new();
        for i in 0..self.apps.len() {
            let name = self.apps[i].cfg.name.clone();
            if self.apps[i].pids.is_empty() || !self.act.current().contains_key(&name) {
                continue;
            }
            for (r, why) in self.act.check(&name) {
                let lowest = (knob(r).range)(self.act.node()).map_or(0, |(lo, _)| lo);
                let a = &mut self.apps[i];
                a.limits.max.set(r, lowest);
                a.limits.min.set(r, a.limits.min.get(r).min(lowest));
                self.sensing.app_mut(i).limits = a.limits;
                ev.push(format!("{name}: {why}"));
                a.refused = Some(why);
            }
        }
        ev
    }
}
