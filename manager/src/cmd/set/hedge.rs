//! `qosd set hedge`: kernel-level hedged UDP requests for one process's
//! requests to a service (paper 003; `qosd_hedge`). Every TC filter, qdisc
//! and veth is journalled in the state file first. Where the kernel has
//! netem the hedger works on its own and the change stays (one-shot, like
//! the other knobs; `qosd restore` removes it); where the delay line is a
//! qosd thread (no netem, e.g. this project's VMs) qosd holds until
//! SIGINT/SIGTERM/SIGHUP and removes everything then.

use std::net::SocketAddrV4;
use std::path::Path;
use std::time::Duration;

use clap::Args as ClapArgs;
use qosd_actuators::journal::Journal;
use qosd_actuators::{signals, AppTarget, Ctx, Root};
use qosd_hedge::actuator::Hedges;
use qosd_hedge::{HedgeSpec, IdRule};

use crate::exit::to_anyhow;

#[derive(ClapArgs, Debug)]
pub struct HedgeArgs {
    /// The client process whose requests are hedged (its network namespace).
    #[arg(long)]
    pub pid: i32,
    /// The service's IPv4 address and UDP port the requests go to.
    #[arg(long, value_name = "IP:PORT")]
    pub service: SocketAddrV4,
    /// Where hedges go (another replica, or the service itself).
    #[arg(long, value_name = "IP:PORT")]
    pub replica: SocketAddrV4,
    /// Hedge a request still unanswered after this many ms.
    #[arg(long, value_name = "MS")]
    pub t_hedge_ms: f64,
    /// Request id: payload offset, bytes (the answer carries it at the same place).
    #[arg(long, default_value_t = 0)]
    pub id_offset: u16,
    /// Request id: length, bytes (1-8, big-endian). DNS: --id-offset 0 --id-len 2.
    #[arg(long, default_value_t = 8)]
    pub id_len: u8,
    /// Hedges allowed per 1000 requests.
    #[arg(long, default_value_t = 50)]
    pub budget_permille: u32,
    /// Hedges the budget may save up.
    #[arg(long, default_value_t = 10)]
    pub burst: u32,
    /// Requests without an id (and none with one) before the app is refused.
    #[arg(long, default_value_t = qosd_core::hedge::default_min_no_id())]
    pub min_no_id: u32,
}

impl HedgeArgs {
    fn spec(&self) -> anyhow::Result<HedgeSpec> {
        let t = self.t_hedge_ms;
        if !t.is_finite() || t <= 0.0 {
            return Err(crate::usage!(
                "--t-hedge-ms: {t} is not a positive number of ms"
            ));
        }
        let spec = HedgeSpec {
            service: self.service,
            replica: self.replica,
            t_hedge_us: (t * 1000.0).round() as u64,
            id: IdRule {
                offset: self.id_offset,
                len: self.id_len,
            },
            budget_permille: self.budget_permille,
            burst: self.burst,
            min_no_id: self.min_no_id,
        };
        spec.validate().map_err(|m| crate::usage!("hedge: {m}"))?;
        Ok(spec)
    }
}

/// Runs `qosd set hedge` with the state file `state` under `root`.
pub fn run(
    h: &HedgeArgs,
    root: &Path,
    state: &Path,
    dry_run: bool,
    hold: bool,
) -> anyhow::Result<()> {
    let spec = h.spec()?;
    let sigs = signals::block_termination().map_err(to_anyhow)?;
    let root = Root::new(root);
    let journal =
        Journal::open(root.clone(), Some(state.to_owned()), dry_run).map_err(to_anyhow)?;
    let mut ctx = Ctx::new(root, dry_run, journal);
    let mut hedges = Hedges::default();
    let app = AppTarget::from_pid(h.pid);
    let changes = hedges.enable(&mut ctx, &app, &spec).map_err(to_anyhow)?;
    for c in &changes {
        crate::outln!("{} {c}", if dry_run { "would change" } else { "changed" })?;
    }
    if dry_run {
        return Ok(());
    }
    let threaded = hedges.delay_stats(&app.name).is_some();
    if !threaded && !hold {
        crate::outln!(
            "hedging on (netem delay line); recorded in {}; `qosd restore` removes it",
            state.display()
        )?;
        return Ok(());
    }
    if threaded {
        crate::outln!("the kernel has no netem: the delay line is this process's thread")?;
    }
    crate::outln!("hedging on; holding; SIGINT/SIGTERM turns it off")?;
    // A client whose requests carry no id is refused once it has sent some.
    std::thread::sleep(Duration::from_secs(1));
    let refused = hedges.check(&mut ctx, &app.name);
    let sig = match &refused {
        Ok(()) => Some(sigs.wait().map_err(to_anyhow)?),
        Err(_) => None,
    };
    if let Some(c) = hedges.counters(&app.name) {
        let pairs: Vec<String> = c.pairs().iter().map(|(k, v)| format!("{k} {v}")).collect();
        crate::outln!("hedge counters: {}", pairs.join(", "))?;
    }
    let (restored, errs) = hedges.disable_all(&mut ctx);
    for c in &restored {
        crate::outln!("restored {c}")?;
    }
    if let Some(e) = errs.into_iter().next() {
        return Err(to_anyhow(e));
    }
    refused.map_err(to_anyhow)?;
    if let Some(sig) = sig {
        crate::outln!("restored on {sig}")?;
    }
    Ok(())
}
