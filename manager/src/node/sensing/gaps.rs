//! The client/server gap kept current: the SLO step of a decision tick,
//! the one place it is done (real replays and the daemon alike). Each
//! app's last decision intervals of client and eBPF latencies, widened
//! until both sides hold enough requests for the percentile.

use qosd_core::slo::{Load, SloSide};
use qosd_sensors::stats::LogHistogram;

use super::{Sensing, WIDEST_INTERVALS};
use crate::node::latency::Recent;

/// One app's last decision intervals, client and server side: at least
/// `enough` requests on each side (over up to [`WIDEST_INTERVALS`]
/// intervals for a low-rate app) before a gap is read off them.
pub(super) struct GapWindows {
    client: Recent,
    server: Recent,
    enough: u64,
}

impl GapWindows {
    /// `enough`: the requests each side needs for the app's percentile.
    pub(super) fn new(enough: u64) -> Self {
        let window = || Recent::widening(1, enough, WIDEST_INTERVALS);
        GapWindows {
            client: window(),
            server: window(),
            enough,
        }
    }

    /// Adds one decision interval (`iv_s` long) of both sides' latencies.
    fn push(&mut self, client: &LogHistogram, server: &LogHistogram, iv_s: f64) {
        self.client.push(client.clone(), iv_s, None);
        self.server.push(server.clone(), iv_s, None);
    }

    /// The server's rate and both sides' `percentile` (µs) over the
    /// window, once both hold enough requests.
    fn measured(&self, percentile: f64) -> Option<(f64, f64, f64)> {
        let (c, e) = (&self.client, &self.server);
        if c.requests() < self.enough || e.requests() < self.enough {
            return None;
        }
        Some((
            e.rps(),
            c.percentile_us(percentile)?,
            e.percentile_us(percentile)?,
        ))
    }
}

impl Sensing {
    /// Where an app's client latencies (a load generator's, or POSTed to
    /// the daemon's API) and its eBPF ones cover the same last intervals,
    /// and both hold enough requests for the percentile, the measured gap
    /// corrects its eBPF-side target.
    pub(super) fn refresh_gaps(&mut self, now_ms: u64) {
        let iv_s = (now_ms.saturating_sub(self.interval_start_ms) as f64 / 1000.0).max(1e-9);
        for (a, m) in self.apps.iter_mut().zip(&mut self.meters) {
            m.gap.push(&m.iv_client, &m.iv_server, iv_s);
            let Some(slo) = a.slo.as_mut() else {
                continue;
            };
            if let Some((rps, client_us, ebpf_us)) = m.gap.measured(a.percentile) {
                let load = Load {
                    rps,
                    cpus: m.cpus_held,
                };
                slo.refresh(load, client_us, ebpf_us);
            }
        }
    }

    /// App `i`'s SLO as it stands (the eBPF side's target and gap).
    pub fn slo(&self, i: usize) -> Option<&SloSide> {
        self.apps[i].slo.as_ref()
    }
}
