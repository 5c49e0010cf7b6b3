//! The `hedge` actuator: per app, off or on with a [`HedgeSpec`]. Turning
//! it on, in the app's network namespace (that of its first pid): a delay
//! line (veth pair `qhd-XXXXXXXX`/`…p`, netem delaying by `T_hedge` on the
//! first), the programs on the service's interface (egress and ingress),
//! on the replica's (ingress) and on the delay line's exit. Every object is
//! journalled through the actuators' [`Ctx`] *before* it is made, with the
//! `ip`/`tc` command that removes it, so turning it off, a SIGTERM and
//! `qosd restore` after a SIGKILL all take the same path.
//!
//! Limits: IPv4 only; one hedged app per network namespace (the filters
//! share one TC priority, so a restore removes exactly qosd's).

use std::collections::BTreeMap;
use std::time::Instant;

use qosd_actuators::netns::{NetnsRef, DELAY_PREFIX, TC_PREF};
use qosd_actuators::{AppTarget, Change, Ctx, Error, Result};

use crate::bpf::{Counters, Hook, Programs, Wiring};
use crate::delay::{DelayStats, ThreadLine};
use crate::route::{in_netns, link, route_get};
use crate::HedgeSpec;

/// The knob's name in the journal and in changes.
pub const KNOB: &str = "hedge";
const R: &str = KNOB;

pub(crate) struct Active {
    pub(crate) spec: HedgeSpec,
    netns: NetnsRef,
    pub(crate) wired: Option<Wired>,
}

/// What runs for one hedged app (none in a dry run).
pub(crate) struct Wired {
    pub(crate) programs: Programs,
    /// The thread delay line, where the kernel has no netem.
    pub(crate) thread: Option<ThreadLine>,
}

/// A hedged app being turned off: its answer filters stay until
/// `deadline` or until nothing is in flight.
pub(crate) struct Draining {
    pub(crate) active: Active,
    pub(crate) deadline: Instant,
}

/// The hedged apps.
#[derive(Default)]
pub struct Hedges {
    pub(crate) apps: BTreeMap<String, Active>,
    /// Apps being turned off, until their hedges in flight settle
    /// (`drain.rs`).
    pub(crate) draining: BTreeMap<String, Draining>,
    /// The counters of apps no longer hedged, as they were at the end.
    pub(crate) last: BTreeMap<String, Counters>,
}

fn sv(s: &[&str]) -> Vec<String> {
    s.iter().map(|a| (*a).to_owned()).collect()
}

fn other(e: anyhow::Error) -> Error {
    Error::Command {
        command: "hedge".into(),
        message: format!("{e:#}"),
    }
}

/// The delay line's device names for `app` (stable, ≤ 15 bytes).
pub fn delay_devs(app: &str) -> (String, String) {
    // FNV-1a: a short stable tag; the names are journalled, so only
    // uniqueness within one namespace matters.
    let h = app.bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    let a = format!("{DELAY_PREFIX}{h:08x}");
    (a.clone(), a + "p")
}

pub(crate) fn key_prefix(app: &str) -> String {
    format!("hedge:{app}:")
}

impl Hedges {
    /// The apps hedged now and their specs.
    pub fn enabled(&self) -> impl Iterator<Item = (&str, &HedgeSpec)> {
        self.apps.iter().map(|(k, a)| (k.as_str(), &a.spec))
    }

    /// Turns hedging on for `app` (or changes its spec), as one change
    /// of its own. Nothing stays behind when it fails midway.
    pub fn enable(
        &mut self,
        ctx: &mut Ctx,
        app: &AppTarget,
        spec: &HedgeSpec,
    ) -> Result<Vec<Change>> {
        ctx.begin();
        match self.turn_on(ctx, app, spec) {
            Ok(()) => Ok(ctx.commit()),
            Err(e) => Err(ctx.rollback(e)),
        }
    }

    /// [`Hedges::enable`] inside a change the caller began (the actuator
    /// registry's `apply`): a failure leaves the rollback to the caller.
    pub fn turn_on(&mut self, ctx: &mut Ctx, app: &AppTarget, spec: &HedgeSpec) -> Result<()> {
        spec.validate()
            .map_err(|m| Error::Invalid(format!("hedge for {}: {m}", app.name)))?;
        if self.apps.get(&app.name).is_some_and(|a| &a.spec == spec) {
            return Ok(());
        }
        if self.apps.contains_key(&app.name) {
            let (_, mut errs) = self.disable(ctx, &app.name);
            if !errs.is_empty() {
                return Err(errs.remove(0));
            }
        }
        // The last programs' answer filters go before new ones take
        // their place (bounded: `T_hedge` + DRAIN_RTT).
        let (_, mut errs) = self.wait_drained(ctx, Some(&app.name));
        if !errs.is_empty() {
            return Err(errs.remove(0));
        }
        let pid = *app.pids.first().ok_or_else(|| {
            Error::Invalid(format!("hedge for {}: the app has no process", app.name))
        })?;
        let netns = NetnsRef::of_pid(pid)?;
        let wired = self.wire(ctx, &app.name, &netns, spec)?;
        self.apps.insert(
            app.name.clone(),
            Active {
                spec: spec.clone(),
                netns,
                wired,
            },
        );
        Ok(())
    }

    /// Makes the delay line and attaches the programs (journalled first).
    fn wire(
        &self,
        ctx: &mut Ctx,
        app: &str,
        ns: &NetnsRef,
        spec: &HedgeSpec,
    ) -> Result<Option<Wired>> {
        let svc = route_get(ns, *spec.service.ip()).map_err(other)?;
        let rep = route_get(ns, *spec.replica.ip()).map_err(other)?;
        let busy = ns.run(&sv(&[
            "tc",
            "filter",
            "show",
            "dev",
            &svc.dev,
            "egress",
            "pref",
            &TC_PREF.to_string(),
        ]))?;
        if !busy.trim().is_empty() {
            return Err(Error::Invalid(format!(
                "hedge for {app}: another app is already hedged through {} in this network namespace",
                svc.dev
            )));
        }
        let (d0, d1) = delay_devs(app);
        let netem = delay_line(ctx, app, ns, spec, &d0, &d1)?;
        let mut hooks = vec![
            (svc.dev.clone(), Hook::Egress),
            (svc.dev.clone(), Hook::Ingress),
        ];
        if rep.dev != svc.dev {
            hooks.push((rep.dev.clone(), Hook::Ingress));
        }
        for (dev, hook) in &hooks {
            ctx.tc_hook(R, ns, &key_prefix(app), dev, hook.direction(), TC_PREF)?;
        }
        if ctx.dry_run {
            return Ok(None);
        }
        let svc_link = link(ns, &svc.dev).map_err(other)?;
        let wiring = Wiring {
            replica_src: rep.src,
            delay_ifindex: link(ns, &d0).map_err(other)?.ifindex,
            replica_ifindex: link(ns, &rep.dev).map_err(other)?.ifindex,
            svc_ifindex: svc_link.ifindex,
            svc_mac: svc_link.mac,
        };
        let programs = Programs::load(spec, &wiring).map_err(other)?;
        attach(ns, spec, programs, &wiring, netem, &d1, &hooks).map(Some)
    }

    /// The counters of `app`'s programs: live while hedged or draining,
    /// then as they ended (`None`: never hedged here, or a dry run).
    pub fn counters(&self, app: &str) -> Option<Counters> {
        let live = self
            .apps
            .get(app)
            .or_else(|| self.draining.get(app).map(|d| &d.active));
        match live {
            Some(a) => a.wired.as_ref()?.programs.counters().ok(),
            None => self.last.get(app).copied(),
        }
    }

    /// Run counts and times of `app`'s programs (see [`Programs::run_stats`]).
    pub fn run_stats(&self, app: &str) -> Vec<qosd_sensors::bpfstats::RunStat> {
        self.apps
            .get(app)
            .and_then(|a| a.wired.as_ref())
            .map(|w| w.programs.run_stats())
            .unwrap_or_default()
    }

    /// The thread delay line's figures (`None`: netem, or not hedged).
    pub fn delay_stats(&self, app: &str) -> Option<DelayStats> {
        Some(self.apps.get(app)?.wired.as_ref()?.thread.as_ref()?.stats())
    }

    /// Checks what the kernel saw: an app whose requests carry no id under
    /// the rule (every request too short, at least `min_no_id` of them) is
    /// refused: hedging is turned off and the error says why. Call after
    /// the app has sent requests.
    /// Also finishes the drains that are done ([`Hedges::reap`]).
    pub fn check(&mut self, ctx: &mut Ctx, app: &str) -> Result<()> {
        for e in self.reap(ctx).1 {
            tracing::warn!("hedge: finishing a drain: {e}");
        }
        if !self.apps.contains_key(app) {
            return Ok(());
        }
        let Some(c) = self.counters(app) else {
            return Ok(());
        };
        let spec = self.apps[app].spec.clone();
        if !refuse(&c, spec.min_no_id) {
            return Ok(());
        }
        let (_, errs) = self.disable(ctx, app);
        if let Some(e) = errs.into_iter().next() {
            tracing::warn!("hedge for {app}: turning off: {e}");
        }
        Err(Error::Invalid(format!(
            "hedge for {app}: refused: its {} requests to {} carry no id (payload shorter than \
             id.offset {} + id.len {}); hedging is off",
            c.no_id, spec.service, spec.id.offset, spec.id.len
        )))
    }

    /// The namespace an app is hedged in.
    pub fn netns(&self, app: &str) -> Option<&NetnsRef> {
        self.apps.get(app).map(|a| &a.netns)
    }
}

/// True when the counters since hedging was turned on show an app whose
/// requests carry no id: `min_no_id` of them at least, and not one with
/// an id (a single short packet, or one app that mixes both, is not
/// refused).
fn refuse(c: &Counters, min_no_id: u32) -> bool {
    c.requests == 0 && c.no_id >= u64::from(min_no_id)
}

/// Makes the delay line `d0`→`d1` (journalled first) and, where the
/// kernel has netem, its `T_hedge` qdisc; true when netem keeps the time.
fn delay_line(
    ctx: &mut Ctx,
    app: &str,
    ns: &NetnsRef,
    spec: &HedgeSpec,
    d0: &str,
    d1: &str,
) -> Result<bool> {
    let add = sv(&["ip", "link", "add", d0, "type", "veth", "peer", "name", d1]);
    let key = format!("{}delay", key_prefix(app));
    ctx.net(R, ns, Some(&add), &key, sv(&["ip", "link", "del", d0]))?;
    if ctx.dry_run {
        return Ok(false);
    }
    ns.run(&sv(&["ip", "link", "set", d0, "up"]))?;
    ns.run(&sv(&["ip", "link", "set", d1, "up"]))?;
    let delay = format!("{}us", spec.t_hedge_us);
    let q = sv(&[
        "tc", "qdisc", "add", "dev", d0, "root", "netem", "delay", &delay, "limit", "100000",
    ]);
    match ns.run(&q) {
        Ok(_) => Ok(true),
        Err(e) => {
            crate::delay::netem_missing(&e).map_err(other)?;
            tracing::info!(
                "hedge for {app}: the kernel has no netem (`tc qdisc add ... netem`: qdisc kind \
                 is unknown): the delay line is a qosd thread, whose lateness adds to T_hedge"
            );
            Ok(false)
        }
    }
}

/// Starts the thread delay line where netem is missing and attaches the
/// programs: the decision at the delay line's exit, the others on `hooks`.
fn attach(
    ns: &NetnsRef,
    spec: &HedgeSpec,
    programs: Programs,
    wiring: &Wiring,
    netem: bool,
    d1: &str,
    hooks: &[(String, Hook)],
) -> Result<Wired> {
    let exit = link(ns, d1).map_err(other)?.ifindex;
    // netem: clones leave the line at d1. Thread: the thread takes them
    // at d1 and writes them back there, so they come out at d0.
    let decide_at = if netem { exit } else { wiring.delay_ifindex };
    let thread = if netem {
        None
    } else {
        let sock = in_netns(ns, || crate::delay::packet_socket(exit)).map_err(other)?;
        let t = std::time::Duration::from_micros(spec.t_hedge_us);
        Some(ThreadLine::start(sock, t).map_err(other)?)
    };
    let devs: Vec<(u32, Hook)> = hooks
        .iter()
        .map(|(dev, hook)| Ok((link(ns, dev)?.ifindex, *hook)))
        .collect::<anyhow::Result<_>>()
        .map_err(other)?;
    in_netns(ns, || {
        programs.attach(Hook::Delay, decide_at)?;
        for (ifindex, hook) in devs {
            programs.attach(hook, ifindex)?;
        }
        Ok(())
    })
    .map_err(other)?;
    Ok(Wired { programs, thread })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_app_is_refused_only_past_the_minimum_and_with_no_id_at_all() {
        let c = |requests, no_id| Counters {
            requests,
            no_id,
            ..Counters::default()
        };
        assert!(!refuse(&c(0, 0), 16));
        assert!(!refuse(&c(0, 1), 16), "one odd packet");
        assert!(!refuse(&c(0, 15), 16));
        assert!(refuse(&c(0, 16), 16));
        assert!(refuse(&c(0, 1), 1));
        assert!(!refuse(&c(1, 1000), 16), "some requests carry an id");
    }

    #[test]
    fn delay_devs_are_short_and_distinct() {
        let (a, b) = delay_devs("a-rather-long-application-name");
        assert!(a.len() <= 15 && b.len() <= 15, "{a} {b}");
        assert!(a.starts_with(DELAY_PREFIX) && b == format!("{a}p"));
        assert_ne!(delay_devs("web").0, delay_devs("db").0);
        qosd_actuators::netns::check_undo(&sv(&["ip", "link", "del", &a])).unwrap();
    }
}
