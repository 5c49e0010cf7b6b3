//! The service model of one app on the simulated node: an M/M/c queue whose
//! servers are the app's cores (up to its parallelism) and whose service
//! time depends on frequency and cache ways; plus a backlog that carries
//! overload from one sample to the next, and a network term only the client
//! sees (its queue follows the load with a lag, as in the paper's Fig. 11).
//! A CPU quota is CFS bandwidth control per period ([`Throttle`]): the app
//! runs at full speed until it has used its quota, then waits for the next
//! period. A best-effort batch job is no queue: its throughput is the CPUs
//! it gets times its operations per CPU-second ([`SimModel::job_ops_per_s`]).

use qosd_core::Share;
use serde::{Deserialize, Serialize};

use crate::scenario::{AppSpec, JobSpec, Server, SimModelSpec, SimNode};

/// Bytes per second one CPU hashes in `qosd batch` (FNV-1a, one byte per
/// multiply): about 450 MB/s on the development VM. Only the default of an
/// unfitted model; `qosd calibrate --model` measures it.
const HASH_BYTES_PER_CPU_S: f64 = 450e6;

/// Resolved service model of one app (defaults of its server kind, then the
/// scenario's `sim:` overrides). Field meanings as in [`SimModelSpec`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SimModel {
    pub service_us: f64,
    pub service_cv: f64,
    pub parallelism: u32,
    pub freq_sensitivity: f64,
    pub cache_slowdown: f64,
    pub ways_needed: u32,
    pub fixed_us: f64,
    pub network_ms: f64,
    pub network_capacity_x: f64,
    pub network_tau_s: f64,
    pub noise: f64,
    /// A batch job's operations per CPU-second (unused for servers).
    pub ops_per_cpu_s: f64,
}

impl SimModel {
    /// The model of an app: its server kind's defaults, then overrides.
    pub fn of(app: &AppSpec) -> SimModel {
        // Defaults: memcached spends ~10 µs in the server and ~0.1 ms on the
        // network; vSwarm-like HTTP services ~0.75 ms (paper 000, §IV-A).
        let Some(server) = &app.server else {
            // A batch job takes no requests: its threads bound the CPUs
            // it can use, and its rate per CPU is what it gains.
            let base = match &app.job {
                Some(JobSpec::Hash { threads, op_kib }) => SimModel {
                    parallelism: *threads,
                    ops_per_cpu_s: HASH_BYTES_PER_CPU_S / (f64::from(*op_kib).max(1.0) * 1024.0),
                    ..SimModel::generic()
                },
                None => SimModel::generic(),
            };
            return base.with(&app.sim);
        };
        let base = match server {
            Server::Memcached { threads, .. } => SimModel {
                service_us: 12.0,
                parallelism: *threads,
                freq_sensitivity: 0.6,
                cache_slowdown: 0.5,
                ways_needed: 6,
                fixed_us: 0.0,
                network_ms: 0.1,
                ..SimModel::generic()
            },
            Server::Nginx { workers } => SimModel {
                service_us: 60.0,
                parallelism: *workers,
                ..SimModel::generic()
            },
            Server::Fixture { work_us, delay_us } => SimModel {
                service_us: (*work_us as f64).max(1.0),
                // One thread per connection; the work is a fixed CPU spin.
                parallelism: app.connections as u32,
                service_cv: 0.3,
                fixed_us: *delay_us as f64,
                ..SimModel::generic()
            },
            Server::Grpc { work_us } => SimModel {
                // HTTP/2 framing and protobuf add ~30 µs of CPU per call to
                // the spin; a goroutine per stream, so cores bound it.
                service_us: *work_us as f64 + 30.0,
                service_cv: 0.3,
                ..SimModel::generic()
            },
            Server::Command { .. } => SimModel::generic(),
        };
        base.with(&app.sim)
    }

    /// The model of a server of unknown kind.
    pub fn generic() -> SimModel {
        SimModel {
            service_us: 100.0,
            service_cv: 0.5,
            parallelism: 64,
            freq_sensitivity: 0.8,
            cache_slowdown: 0.3,
            ways_needed: 4,
            fixed_us: 0.0,
            network_ms: 0.75,
            network_capacity_x: 1.3,
            network_tau_s: 3.0,
            noise: 0.05,
            ops_per_cpu_s: 1000.0,
        }
    }

    fn with(mut self, o: &SimModelSpec) -> SimModel {
        macro_rules! set {
            ($($f:ident),*) => { $( if let Some(v) = o.$f { self.$f = v; } )* };
        }
        crate::scenario::sim_model_fields!(set);
        self
    }

    /// Mean service time under an allocation, µs.
    pub fn service_time_us(&self, a: &Share, node: &SimNode) -> f64 {
        // 0: no frequency knob (the node runs at its highest frequency).
        let f = match a.freq_mhz {
            0 => node.freq_max_mhz as f64,
            f => (f as f64).min(node.freq_max_mhz as f64),
        };
        let fs = self.freq_sensitivity;
        let freq = (1.0 - fs) + fs * node.freq_max_mhz as f64 / f;
        let cache = if node.nr_ways == 0 {
            1.0 // no partitioning: the app shares the whole cache
        } else {
            let need = self.ways_needed.max(1) as f64;
            1.0 + self.cache_slowdown * (1.0 - (a.nr_ways as f64).min(need) / need)
        };
        self.service_us * freq * cache
    }

    /// Servers of the queue: the CPUs the app may run on (its cores, or
    /// every CPU of a node whose apps share them), up to its parallelism.
    pub fn servers(&self, a: &Share, node: &SimNode) -> u32 {
        let cpus = if node.shared_cpus {
            node.nr_cores
        } else {
            a.nr_cores
        };
        cpus.min(self.parallelism).max(1)
    }

    /// CPUs' worth of time the app can use: its servers, or its CPU quota
    /// when that is lower (`cpu_quota_milli` 0 = no quota). The quota
    /// bounds the CPU time of all threads together, so it caps cores and
    /// parallelism alike.
    pub fn effective_cpus(&self, a: &Share, node: &SimNode) -> f64 {
        let c = self.servers(a, node) as f64;
        if a.cpu_quota_milli == 0 {
            c
        } else {
            c.min(a.cpu_quota_milli as f64 / qosd_core::quota::MILLI_PER_CPU as f64)
        }
    }

    /// Throughput at which the app saturates under `a`, requests/s:
    /// `min(cores, parallelism, quota)` CPUs over the per-request CPU time.
    pub fn capacity_rps(&self, a: &Share, node: &SimNode) -> f64 {
        self.effective_cpus(a, node) * 1e6 / self.service_time_us(a, node)
    }

    /// The app's latency in one sample at `lambda` requests/s (served up to
    /// its capacity): its queue at full speed, the throttling its quota
    /// causes, and the given shifts. `slow` ≥ 1 stretches service times
    /// (CPUs shared with best-effort work at normal weight).
    pub fn sample(&self, a: &Share, node: &SimNode, lambda: f64, slow: f64, at: Shifts) -> Sample {
        let s_us = self.service_time_us(a, node) * slow.max(1.0);
        let c = self.servers(a, node);
        let cap = self.effective_cpus(a, node) * 1e6 / s_us;
        let lambda = lambda.min(cap);
        Sample {
            queue: Queue::new(c, s_us, self.service_cv, lambda * 1e-6),
            // Throttling counts CPU time, which sharing does not stretch.
            throttle: self.throttle(a, node, lambda, self.service_time_us(a, node)),
            shift_us: at.shift_us,
            network_us: at.network_us,
            noise: at.noise,
            weight: at.weight,
        }
    }

    /// CFS bandwidth control over one period P: the work W (CPU time) that
    /// arrives in a period is Poisson-many service times, about normal with
    /// mean λPs and variance λPs²(1 + cv²). Served as it comes, it uses up
    /// the quota qP at the fraction qP/W of the period once W > qP; the app
    /// is then throttled for P(1 − qP/W), and a request that arrives then
    /// waits for the next period. CFS burst (`node.cfs_burst_pct` of qP)
    /// adds what earlier periods left unused: the bank is full while the
    /// mean work is a standard deviation or more under the quota, empty
    /// at or over it, and in between in proportion. `None` when no quota
    /// caps the servers.
    pub fn throttle(&self, a: &Share, node: &SimNode, lambda: f64, s_us: f64) -> Option<Throttle> {
        let q = self.effective_cpus(a, node);
        if a.cpu_quota_milli == 0 || q >= self.servers(a, node) as f64 || lambda <= 0.0 {
            return None;
        }
        let p_us = node.cfs_period_us as f64;
        let n = lambda * p_us * 1e-6; // requests per period
        let mean = n * s_us;
        let sd = (n * (1.0 + self.service_cv.powi(2))).sqrt() * s_us;
        let quota = q * p_us;
        let bank = f64::from(node.cfs_burst_pct) / 100.0 * quota;
        let budget = quota + bank * ((quota - mean) / sd.max(1e-9)).clamp(0.0, 1.0);
        // E[(1 − B/W)+] and P(W > B) on a grid over ±5 standard deviations.
        let (mut frac, mut over, mut total) = (0.0, 0.0, 0.0);
        const K: i32 = 80;
        for k in -K..=K {
            let z = 5.0 * f64::from(k) / f64::from(K);
            let w = (-0.5 * z * z).exp();
            let work = mean + z * sd;
            total += w;
            if work > budget {
                frac += w * (1.0 - budget / work);
                over += w;
            }
        }
        if frac <= 0.0 {
            return None;
        }
        let (frac, over) = (frac / total, over / total);
        Some(Throttle {
            p: frac,
            // The mean throttled span given a throttled period.
            span_us: p_us * frac / over.max(1e-12),
        })
    }

    /// A batch job under `a`: the CPUs it runs on and its operations per
    /// second. It can use `min(CPUs it may run on, threads, quota)`; where
    /// apps share the node's CPUs, no more than `free_cpus` (what the
    /// latency-critical apps leave: they are not slowed by the job, the
    /// job gets the rest). Frequency scales it like a server's CPU time.
    pub fn job_ops_per_s(&self, a: &Share, node: &SimNode, free_cpus: f64) -> (f64, f64) {
        let mut cpus = self.effective_cpus(a, node);
        if node.shared_cpus {
            cpus = cpus.min(free_cpus.max(0.0));
        }
        let fmax = node.freq_max_mhz.max(1) as f64;
        let f = match a.freq_mhz {
            0 => fmax,
            f => (f as f64).min(fmax),
        };
        let fs = self.freq_sensitivity;
        let slow = (1.0 - fs) + fs * fmax / f.max(1.0);
        (cpus, cpus * self.ops_per_cpu_s / slow)
    }
}

/// Steady-state response time of a c-server queue, in µs: P(T > t).
///
/// Service times are a fixed part plus an exponential part, so their
/// coefficient of variation `cv` is below 1 as for real request handlers
/// (cv = 1 is M/M/c). Waiting follows M/M/c (Erlang C) with the wait
/// scaled by Allen–Cunneen's (1 + cv²)/2.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Queue {
    /// Probability of waiting (Erlang C).
    pub wait_p: f64,
    /// Rate of the exponential part of the service time, per µs.
    pub mu: f64,
    /// Decay rate of the waiting time, per µs.
    pub delta: f64,
    /// Fixed part of the service time, µs.
    pub det_us: f64,
}

impl Queue {
    /// `c` servers with mean service time `s_us` and coefficient of
    /// variation `cv` at arrival rate `lambda` (per µs); utilisation is
    /// capped just below 1 (overload goes to the backlog).
    pub fn new(c: u32, s_us: f64, cv: f64, lambda: f64) -> Queue {
        let c = c.max(1);
        let cv = cv.clamp(0.01, 1.0);
        let rho = (lambda * s_us / c as f64).clamp(0.0, 0.98);
        let wait_p = qosd_core::oa::erlang_c(c, rho * c as f64);
        let delta = c as f64 / s_us * (1.0 - rho) * 2.0 / (1.0 + cv * cv);
        Queue {
            wait_p,
            mu: 1.0 / (cv * s_us),
            delta,
            det_us: (1.0 - cv) * s_us,
        }
    }

    /// P(T > t), t in µs: the fixed part, then no wait with 1 − C, else an
    /// Exp(δ) wait plus the Exp(μ) part (hypoexponential).
    pub fn ccdf(&self, t: f64) -> f64 {
        let t = t - self.det_us;
        if t <= 0.0 {
            return 1.0;
        }
        let s = (-self.mu * t).exp();
        let both = if (self.delta - self.mu).abs() < 1e-12 * self.mu {
            (1.0 + self.mu * t) * s
        } else {
            (self.delta * s - self.mu * (-self.delta * t).exp()) / (self.delta - self.mu)
        };
        (1.0 - self.wait_p) * s + self.wait_p * both
    }
}

/// Quota throttling in a sample: the fraction `p` of requests that arrive
/// while the app is throttled and wait up to `span_us` (uniformly: the
/// rest of the throttled span) before it runs again.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Throttle {
    pub p: f64,
    pub span_us: f64,
}

/// What shifts and weighs a sample beside its queue (see [`Sample`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shifts {
    pub shift_us: f64,
    pub network_us: f64,
    pub noise: f64,
    pub weight: f64,
}

/// One sample of one app: a steady-state queue (and its quota throttling)
/// shifted by the backlog wait, the fixed delay and (for the client) the
/// network, scaled by noise.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    pub queue: Queue,
    pub throttle: Option<Throttle>,
    /// Added to every request's latency on the server, µs.
    pub shift_us: f64,
    /// Added on the client side only, µs.
    pub network_us: f64,
    /// Multiplicative noise.
    pub noise: f64,
    /// Requests completed in the sample (its weight in a mixture).
    pub weight: f64,
}

impl Sample {
    fn ccdf(&self, t: f64, client: bool) -> f64 {
        let net = if client { self.network_us } else { 0.0 };
        let t = t / self.noise - self.shift_us - net;
        let Some(th) = self.throttle else {
            return self.queue.ccdf(t);
        };
        // A throttled arrival waits U(0, span): average over its wait.
        const K: u32 = 8;
        let waited: f64 = (0..K)
            .map(|k| {
                self.queue
                    .ccdf(t - th.span_us * (f64::from(k) + 0.5) / f64::from(K))
            })
            .sum::<f64>()
            / f64::from(K);
        (1.0 - th.p) * self.queue.ccdf(t) + th.p * waited
    }
}

/// The `p`-th percentile (µs) of the mixture of samples, weighted by their
/// completed requests; `None` if nothing completed. Bisection on the CCDF.
pub fn percentile(samples: &[Sample], p: f64, client: bool) -> Option<f64> {
    let total: f64 = samples.iter().map(|s| s.weight).sum();
    if total <= 0.0 {
        return None;
    }
    let tail = (1.0 - p / 100.0).max(1e-9);
    let exceed = |t: f64| {
        samples
            .iter()
            .map(|s| s.weight * s.ccdf(t, client))
            .sum::<f64>()
            / total
    };
    let mut hi = 1.0;
    while exceed(hi) > tail && hi < 1e12 {
        hi *= 2.0;
    }
    let mut lo = 0.0;
    for _ in 0..60 {
        let mid = 0.5 * (lo + hi);
        if exceed(mid) > tail {
            lo = mid;
        } else {
            hi = mid;
        }
        if hi - lo < 1e-3 * hi {
            break;
        }
    }
    Some(hi)
}

#[cfg(test)]
mod tests;
