//! The client/server gap kept current: the SLO step of a decision tick,
//! the one place it is done (real replays and the daemon alike). Each
//! decision interval with enough requests on both sides gives one
//! residual, read off that interval's own requests.

use qosd_core::slo::{Load, SloSide};
use qosd_sensors::stats::LogHistogram;

use super::Sensing;

/// Requests each side needs in an interval for its residual: enough to
/// put at least one request beyond the percentile (100 for a p99), else
/// both figures are that interval's maximum. One interval's percentile is
/// noisy, but both sides hold the same requests (filed by when each
/// ended) and [`qosd_core::slo::SloSide::refresh`] takes the median of the
/// last 20 residuals. Windows widened to a p99's 1000 requests (up to 8
/// intervals) had one stall lift every window that held it, so one stall
/// moved up to 8 of the 20 residuals instead of 1.
pub(super) fn min_interval_requests(percentile: f64) -> u64 {
    // Less a hair: 1 / (1 - 0.9) is 10.000000000000002 in floating point.
    (1.0 / (1.0 - percentile / 100.0).max(1e-4) - 1e-9).ceil() as u64
}

/// One interval's server rate and both sides' `percentile`, µs, when
/// each side holds enough requests for it (`iv_s`: the interval, s).
pub(super) fn interval_gap(
    client: &LogHistogram,
    server: &LogHistogram,
    iv_s: f64,
    percentile: f64,
) -> Option<(f64, f64, f64)> {
    let enough = min_interval_requests(percentile);
    if client.len() < enough || server.len() < enough {
        return None;
    }
    let us = |h: &LogHistogram| h.percentile(percentile).map(|v| v as f64 / 1e3);
    Some((server.len() as f64 / iv_s, us(client)?, us(server)?))
}

impl Sensing {
    /// Where an app's client latencies (a load generator's, or POSTed to
    /// the daemon's API) and its eBPF ones cover the same interval with
    /// enough requests, the interval's gap corrects its eBPF-side target.
    pub(super) fn refresh_gaps(&mut self, now_ms: u64) {
        let iv_s = (now_ms.saturating_sub(self.interval_start_ms) as f64 / 1000.0).max(1e-9);
        for (a, m) in self.apps.iter_mut().zip(&self.meters) {
            let Some(slo) = a.slo.as_mut() else {
                continue;
            };
            if let Some((rps, client_us, ebpf_us)) =
                interval_gap(&m.iv_client, &m.iv_server, iv_s, a.percentile)
            {
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
