//! A real replay's node: the scenario's servers on this machine, driven by
//! our load generators, measured by the eBPF request sensor (every pid of
//! each server merged, as the daemon does) and the client's reports, and
//! actuated by the daemon's [`Actuation`]. Latency windows are the
//! daemon's ([`Recent`]: the last decision interval's worth of monitoring
//! ticks), started again whenever a plan is applied so that what the
//! policy sees after an action was measured after it. A best-effort app
//! may be a batch job instead of a server: no load and no latency, its
//! throughput (ops/s) and CPU time are its figures.

use std::collections::BTreeMap;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;

use qosd_core::control::{AppInterval, Applied, Node, Sensed, Tick};
use qosd_core::slo::{SloSide, TargetFrom};
use qosd_core::{Allocations, AppState, Feedback, Limits, NodeCaps, Plan, QosTarget};
use qosd_scenarios::batch::BatchJob;
use qosd_scenarios::load::IntervalReport;
use qosd_scenarios::scenario::AppSpec;
use qosd_sensors::ebpf::RequestTracer;
use qosd_sensors::procfs::Procfs;
use qosd_sensors::stats::LogHistogram;

use super::actuate::Actuation;
use super::latency::{from_tracer, Recent};
use super::power::{process_tree, RunPower};

/// One app of the replay.
pub struct ReplayApp {
    pub spec: AppSpec,
    /// Every process of the app's server or job (its pid and descendants).
    pub pids: Vec<i32>,
    /// Its load generator's reports (one per monitoring tick); `None` for
    /// a batch job, which takes no load.
    pub reports: Option<Receiver<IntervalReport>>,
    /// A best-effort app's batch job (`job:` in the scenario).
    pub job: Option<BatchJob>,
    /// The target the client latency is scored against, µs.
    pub client_target_us: Option<f64>,
    /// The eBPF side of the SLO: the client target less the calibrated
    /// client/server gap, refreshed from this run's client samples.
    pub slo: Option<SloSide>,
}

struct Meter {
    client: Recent,
    ebpf: Recent,
    /// The decision interval so far: client and eBPF latencies, ns.
    iv_client: LogHistogram,
    iv_ebpf: LogHistogram,
    offered_rps: f64,
    completed: u64,
    /// The batch job was seen gone (said once).
    job_gone: bool,
}

/// The real replay's node. Build it once the servers run, the targets are
/// traced and every app is admitted.
pub struct ReplayNode {
    apps: Vec<ReplayApp>,
    meters: Vec<Meter>,
    act: Actuation,
    tracer: Option<Arc<RequestTracer>>,
    power: Option<RunPower>,
    feedback: Feedback,
    interval_start_ms: u64,
    window_start_ms: u64,
    /// A load generator ended (its channel closed): the run is over.
    pub ended: bool,
    /// Lines for stderr (failed applies).
    pub notes: Vec<String>,
}

impl ReplayNode {
    /// `nr_slots`: monitoring ticks per decision interval (the window).
    pub fn new(
        apps: Vec<ReplayApp>,
        act: Actuation,
        tracer: Option<Arc<RequestTracer>>,
        power: Option<RunPower>,
        feedback: Feedback,
        nr_slots: usize,
    ) -> Self {
        let meters = apps
            .iter()
            .map(|_| Meter {
                client: Recent::new(nr_slots),
                ebpf: Recent::new(nr_slots),
                iv_client: LogHistogram::new(),
                iv_ebpf: LogHistogram::new(),
                offered_rps: 0.0,
                completed: 0,
                job_gone: false,
            })
            .collect();
        ReplayNode {
            apps,
            meters,
            act,
            tracer,
            power,
            feedback,
            interval_start_ms: 0,
            window_start_ms: 0,
            ended: false,
            notes: Vec::new(),
        }
    }

    /// The actuation back, to restore the knobs at the end, and the batch
    /// jobs (killed when dropped: after the restore, as the servers are).
    pub fn into_parts(self) -> (Actuation, Vec<BatchJob>) {
        let jobs = self.apps.into_iter().filter_map(|a| a.job).collect();
        (self.act, jobs)
    }

    /// CPU seconds each batch job has used so far (`/proc/PID/stat`, every
    /// thread), by app; a job whose process is gone is left out.
    pub fn job_cpu_s(&self) -> BTreeMap<String, f64> {
        let procfs = Procfs::new("/");
        self.apps
            .iter()
            .filter_map(|a| {
                let pid = a.job.as_ref()?.pid as i32;
                let s = procfs.process_cpu_s(pid).ok().flatten()?;
                Some((a.spec.name.clone(), s))
            })
            .collect()
    }

    /// The power sensor failed during the run (its figures are dropped).
    pub fn power_failed(&self) -> bool {
        self.power.as_ref().is_some_and(|p| p.failed)
    }

    fn pids(&self) -> BTreeMap<String, Vec<i32>> {
        self.apps
            .iter()
            .map(|a| (a.spec.name.clone(), a.pids.clone()))
            .collect()
    }

    /// The latency the policy is fed for app `i`, µs: the one place that
    /// chooses between the client's and the eBPF figure.
    fn fed_latency_us(&self, i: usize, pct: f64) -> Option<f64> {
        let m = &self.meters[i];
        match self.feedback {
            Feedback::Client => m.client.percentile_us(pct),
            Feedback::Ebpf => m.ebpf.percentile_us(pct),
        }
    }

    /// Requests behind [`Self::fed_latency_us`].
    fn fed_samples(&self, i: usize) -> u64 {
        let m = &self.meters[i];
        match self.feedback {
            Feedback::Client => m.client.requests(),
            Feedback::Ebpf => m.ebpf.requests(),
        }
    }

    /// App `i`'s batch job throughput since the previous decision (`None`
    /// for a server); a job that ended is said once in the notes.
    fn job_ops_per_s(&mut self, i: usize) -> Option<f64> {
        let job = self.apps[i].job.as_mut()?;
        let v = job.ops_per_s();
        if v.is_none() && !job.running() && !self.meters[i].job_gone {
            self.meters[i].job_gone = true;
            self.notes.push(format!(
                "the batch job of {} (pid {}) ended before the run did",
                job.name, job.pid
            ));
        }
        v
    }

    /// The target of the side that feeds the policy; an eBPF-side one
    /// at the load eBPF counts, its slack a fraction of the client's.
    fn fed_target(&self, i: usize, pct: f64) -> Option<QosTarget> {
        match self.feedback {
            Feedback::Client => self.apps[i]
                .client_target_us
                .map(|v| QosTarget::new(pct, v)),
            Feedback::Ebpf => self.ebpf_target(i).map(|(v, _)| QosTarget {
                slo_us: self.apps[i].slo.as_ref().map(|s| s.client_target_us),
                ..QosTarget::new(pct, v)
            }),
        }
    }

    /// App `i`'s eBPF-side target at its current eBPF-counted load.
    fn ebpf_target(&self, i: usize) -> Option<(f64, TargetFrom)> {
        let s = self.apps[i].slo.as_ref()?;
        Some(s.ebpf_target_us(self.meters[i].ebpf.rps()))
    }
}

impl Node for ReplayNode {
    fn caps(&self) -> NodeCaps {
        *self.act.node()
    }

    fn current(&self) -> &Allocations {
        self.act.current()
    }

    fn sense(&mut self, tick: &Tick) -> Sensed {
        for (a, m) in self.apps.iter().zip(&mut self.meters) {
            let mut hist = LogHistogram::new();
            while let Some(reports) = &a.reports {
                match reports.try_recv() {
                    Ok(r) => {
                        hist.merge(&r.histogram);
                        m.offered_rps = r.offered_rps;
                        m.completed += r.completed;
                    }
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        self.ended = true;
                        break;
                    }
                }
            }
            m.iv_client.merge(&hist);
            m.client.push(hist, tick.dt_s, None);
            let (eh, latest) = match &self.tracer {
                Some(t) if a.job.is_none() => {
                    from_tracer(t, &a.pids, crate::config::figure_of(a.spec.latency))
                }
                _ => (LogHistogram::new(), None),
            };
            m.iv_ebpf.merge(&eh);
            m.ebpf.push(eh, tick.dt_s, latest);
        }
        let mut sensed = Sensed::default();
        sensed.snapshot.since_ms = Some(self.window_start_ms);
        let sample = if tick.decide {
            self.power.as_mut().and_then(RunPower::sample)
        } else {
            None
        };
        sensed.snapshot.node_power_w = sample.as_ref().map(|s| s.node.total_w);
        let iv_s = (tick.now_ms.saturating_sub(self.interval_start_ms) as f64 / 1000.0).max(1e-9);
        for i in 0..self.apps.len() {
            let be_ops_per_s = if tick.decide {
                self.job_ops_per_s(i)
            } else {
                None
            };
            let a = &self.apps[i];
            let pct = a.spec.target.as_ref().map_or(99.0, |t| t.percentile);
            let rps = self.meters[i].client.rps();
            let tree: Vec<u32> = a.pids.iter().map(|&p| p as u32).collect();
            let app_power = sample.as_ref().map(|s| s.app(&tree, Some(rps)));
            let power_w = app_power.as_ref().map(|p| p.power_w);
            // CPU time over the interval ÷ the CPUs it holds, as the daemon
            // computes it (rule policies such as cpu-util.yaml read it).
            let cpu_util = app_power.as_ref().map_or(0.0, |p| {
                let held = self
                    .act
                    .cpus(&a.spec.name)
                    .map_or(self.act.nr_online_cpus(), |c| c.len());
                (p.cpus_used / held.max(1) as f64).clamp(0.0, 1.0)
            });
            sensed.snapshot.apps.push(AppState {
                name: a.spec.name.clone(),
                class: a.spec.class,
                target: self.fed_target(i, pct),
                latency_us: self.fed_latency_us(i, pct),
                rps,
                nr_samples: self.fed_samples(i),
                cpu_util,
                cpus_used: app_power.as_ref().map(|p| p.cpus_used),
                power_w,
                limits: Limits::default(),
            });
            if tick.decide {
                let m = &mut self.meters[i];
                let ns = |h: &LogHistogram| h.percentile(pct).map(|v| v as f64 / 1e3);
                // Both sides measured the same requests this interval:
                // the gap estimate follows what was seen, where the
                // interval holds enough requests for the percentile.
                let enough = qosd_core::measure::samples_for_percentile(pct);
                if let (Some(slo), Some(c), Some(e)) = (
                    self.apps[i].slo.as_mut(),
                    ns(&m.iv_client).filter(|_| m.iv_client.len() >= enough),
                    ns(&m.iv_ebpf).filter(|_| m.iv_ebpf.len() >= enough),
                ) {
                    slo.refresh(m.iv_ebpf.len() as f64 / iv_s, c, e);
                }
                let a = &self.apps[i];
                let ebpf_target = a
                    .slo
                    .as_ref()
                    .map(|s| s.ebpf_target_us(m.iv_ebpf.len() as f64 / iv_s));
                sensed.interval.push(AppInterval {
                    app: a.spec.name.clone(),
                    offered_rps: a.reports.as_ref().map(|_| m.offered_rps),
                    achieved_rps: m.completed as f64 / iv_s,
                    client_us: ns(&m.iv_client),
                    ebpf_us: ns(&m.iv_ebpf),
                    client_target_us: a.client_target_us,
                    ebpf_target_us: ebpf_target.map(|t| t.0),
                    ebpf_target_from: ebpf_target.map(|t| t.1),
                    power_w,
                    be_ops_per_s,
                    cpus_used: app_power.as_ref().map(|p| p.cpus_used),
                });
                m.iv_client.clear();
                m.iv_ebpf.clear();
                m.completed = 0;
            }
        }
        if tick.decide {
            self.interval_start_ms = tick.now_ms;
        }
        sensed.snapshot.apps.sort_by(|x, y| x.name.cmp(&y.name));
        sensed
    }

    fn apply(&mut self, tick: &Tick, plan: &Plan) -> Applied {
        let pids = self.pids();
        let errors = match self.act.set(&plan.allocations, &pids, false) {
            Ok(out) => out
                .into_iter()
                .filter_map(|a| a.error.map(|e| format!("{}: {e}", a.app)))
                .collect(),
            Err(e) => vec![format!("plan not applied: {e}")],
        };
        for e in &errors {
            self.notes
                .push(format!("applying {e} (it keeps the previous allocation)"));
        }
        // What the policy sees next was measured under the new plan.
        for m in &mut self.meters {
            m.client.restart();
            m.ebpf.restart();
        }
        self.window_start_ms = tick.now_ms;
        Applied {
            in_force: self.act.current().clone(),
            errors,
        }
    }
}

/// The pids of a server: it and its descendants, as `i32`.
pub fn server_pids(pid: u32) -> Vec<i32> {
    process_tree(pid).into_iter().map(|p| p as i32).collect()
}
