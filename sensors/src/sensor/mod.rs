//! Sensors as plugins: a [`Sensor`] names itself, says what it measures
//! and samples the apps ([`Target`]s) over one tick into [`Measurements`];
//! everything else has a default. A node holds its plugins in one
//! [`Sensors`] set (lightswitch's `Vec<Box<dyn Trait + Send>>`): a plugin
//! that fails is logged and skipped for that tick, never fatal, and its
//! last error is kept for the API. Plugins: [`ebpf`] (server-side request
//! latency), [`client`] (latency reported by a load generator), [`procfs`]
//! (CPU time), [`power`] (RAPL or the model), [`net`] (TC packet counters
//! per port and peer) and [`NullSensor`] for tests.

pub mod client;
pub mod ebpf;
pub mod net;
pub mod power;
pub mod procfs;

use qosd_core::control::Tick;
use qosd_core::AppPower;

use crate::stats::LogHistogram;

/// What a sensor can measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Quantity {
    /// Request latency as the clients see it (a load generator's reports).
    ClientLatency,
    /// Request latency seen at the server (eBPF).
    ServerLatency,
    /// CPU time of the apps' processes and the node's utilisation.
    CpuTime,
    /// Power of the node and of the apps.
    Power,
    /// Packets and bytes per app (its ports) and per peer.
    Network,
}

impl Quantity {
    pub fn as_str(self) -> &'static str {
        match self {
            Quantity::ClientLatency => "client latency",
            Quantity::ServerLatency => "server latency",
            Quantity::CpuTime => "cpu time",
            Quantity::Power => "power",
            Quantity::Network => "network",
        }
    }
}

/// One app as the sensors see it.
#[derive(Debug, Clone, Copy)]
pub struct Target<'a> {
    pub name: &'a str,
    /// Every process of the app (empty while it does not run).
    pub pids: &'a [i32],
    /// The listening ports its requests arrive on (none: every port).
    pub ports: &'a [u16],
    /// It serves requests (a server, not a batch job).
    pub serves: bool,
}

/// Latencies of the requests that completed in one tick (ns) and the
/// latency of the last of them; `ended`: the same requests with the
/// instant each ended, where the sensor knows it (to file them by it:
/// [`crate::filed`]), else empty.
#[derive(Debug, Clone, Default)]
pub struct LatencyTick {
    pub hist: LogHistogram,
    pub latest_ns: Option<u64>,
    pub ended: crate::filed::Ended,
}

/// What a client reported over one tick: its latencies, and where a load
/// generator of ours drives the app, the load it offered and the replies
/// it completed.
#[derive(Debug, Clone, Default)]
pub struct ClientTick {
    pub latency: LatencyTick,
    /// Offered load at the end of the tick, rps (a load generator's).
    pub offered_rps: Option<f64>,
    /// Replies completed in the tick.
    pub completed: u64,
}

/// What the sensors measured of one app over one tick; a quantity no
/// sensor measured stays `None`.
#[derive(Debug, Clone, Default)]
pub struct AppReading {
    pub client: Option<ClientTick>,
    /// Server-side latencies, `[latency from arrival, service from the
    /// first read]` (see [`crate::ebpf::Figure`]), from the same requests.
    pub server: Option<[LatencyTick; 2]>,
    /// CPU seconds its processes used since the previous reading.
    pub cpu_s: Option<f64>,
    /// The same per pid, for the pids read before too (a pid seen for the
    /// first time counts from now on): per-process figures.
    pub cpu_by_pid: Option<Vec<(i32, f64)>>,
    /// Its power since the previous reading (`energy_per_request_j` is
    /// left to the caller, who knows its throughput).
    pub power: Option<AppPower>,
    /// Its ports' traffic over the windows completed in the tick.
    pub net: Option<net::NetTick>,
}

/// One sample of every target (in the order of the targets given) and of
/// the node.
#[derive(Debug, Clone, Default)]
pub struct Measurements {
    pub apps: Vec<AppReading>,
    pub node_power_w: Option<f64>,
    /// Share of the node's CPU time that was busy since the previous
    /// reading, 0..=1.
    pub node_cpu_util: Option<f64>,
    /// A source of load ended (a replay's load generator): the run is over.
    pub ended: bool,
    /// The node's last complete traffic window, when one completed.
    pub net: Option<net::NetNode>,
}

impl Measurements {
    /// Nothing measured yet, for `nr_targets` targets.
    pub fn empty(nr_targets: usize) -> Self {
        Measurements {
            apps: vec![AppReading::default(); nr_targets],
            ..Default::default()
        }
    }

    /// Adds what another sensor measured (its figures win where both
    /// measured the same thing).
    pub fn absorb(&mut self, other: Measurements) {
        for (a, b) in self.apps.iter_mut().zip(other.apps) {
            a.client = b.client.or(a.client.take());
            a.server = b.server.or(a.server.take());
            a.cpu_s = b.cpu_s.or(a.cpu_s);
            a.cpu_by_pid = b.cpu_by_pid.or(a.cpu_by_pid.take());
            a.power = b.power.or(a.power.take());
            a.net = b.net.or(a.net.take());
        }
        self.net = other.net.or(self.net.take());
        self.node_power_w = other.node_power_w.or(self.node_power_w);
        self.node_cpu_util = other.node_cpu_util.or(self.node_cpu_util);
        self.ended |= other.ended;
    }
}

/// A sensor plugin. Two things are required of it besides its name:
/// saying what it measures and sampling the targets.
pub trait Sensor {
    /// Short name for logs and the API ("ebpf", "power", ...).
    fn name(&self) -> &str;

    /// What it fills in [`Measurements`].
    fn measures(&self) -> &'static [Quantity];

    /// Measures `targets` over the tick that just ended. The result has
    /// one entry per target, in order (see [`Measurements::empty`]).
    fn sample(&mut self, tick: &Tick, targets: &[Target<'_>]) -> anyhow::Result<Measurements>;

    /// Sampled on decision ticks only (figures too coarse, or too costly,
    /// for every monitoring tick).
    fn decision_ticks_only(&self) -> bool {
        false
    }

    /// The target's processes changed from `old` to `target.pids`
    /// (e.g. start or stop tracing them); returns lines worth logging.
    fn follow(&mut self, _target: &Target<'_>, _old: &[i32]) -> Vec<String> {
        Vec::new()
    }
}

/// Measures nothing: for tests, and a node without sensors.
#[derive(Debug, Clone, Copy, Default)]
pub struct NullSensor;

impl Sensor for NullSensor {
    fn name(&self) -> &str {
        "null"
    }

    fn measures(&self) -> &'static [Quantity] {
        &[]
    }

    fn sample(&mut self, _tick: &Tick, targets: &[Target<'_>]) -> anyhow::Result<Measurements> {
        Ok(Measurements::empty(targets.len()))
    }
}

/// A boxed plugin.
pub type BoxedSensor = Box<dyn Sensor + Send>;

/// A node's sensors. A plugin whose sample fails is skipped for that tick
/// (logged when it starts failing) and tried again on the next.
#[derive(Default)]
pub struct Sensors {
    list: Vec<BoxedSensor>,
    /// Per plugin: its last error (`None` after a good sample).
    errors: Vec<Option<String>>,
    /// Per plugin: it failed at least once.
    failed: Vec<bool>,
}

impl Sensors {
    pub fn new(list: Vec<BoxedSensor>) -> Self {
        let n = list.len();
        Sensors {
            list,
            errors: vec![None; n],
            failed: vec![false; n],
        }
    }

    /// Adds a plugin.
    pub fn push(&mut self, s: BoxedSensor) {
        self.list.push(s);
        self.errors.push(None);
        self.failed.push(false);
    }

    /// Some plugin measures `q`.
    pub fn measures(&self, q: Quantity) -> bool {
        self.list.iter().any(|s| s.measures().contains(&q))
    }

    /// Every plugin due on this tick, merged in the order they were given.
    pub fn sample(&mut self, tick: &Tick, targets: &[Target<'_>]) -> Measurements {
        let mut out = Measurements::empty(targets.len());
        for (i, s) in self.list.iter_mut().enumerate() {
            if s.decision_ticks_only() && !tick.decide {
                continue;
            }
            match s.sample(tick, targets) {
                Ok(m) => {
                    self.errors[i] = None;
                    out.absorb(m);
                }
                Err(e) => {
                    let e = format!("{e:#}");
                    if self.errors[i].is_none() {
                        tracing::warn!("sensor {}: {e}; skipped until it recovers", s.name());
                    }
                    self.errors[i] = Some(e);
                    self.failed[i] = true;
                }
            }
        }
        out
    }

    /// Tells every plugin that a target's processes changed.
    pub fn follow(&mut self, target: &Target<'_>, old: &[i32]) -> Vec<String> {
        self.list
            .iter_mut()
            .flat_map(|s| s.follow(target, old))
            .collect()
    }

    /// The last error of the plugin named `name`, if its last sample failed.
    pub fn error(&self, name: &str) -> Option<&str> {
        self.index(name).and_then(|i| self.errors[i].as_deref())
    }

    /// The plugin named `name` failed at least once.
    pub fn failed(&self, name: &str) -> bool {
        self.index(name).is_some_and(|i| self.failed[i])
    }

    fn index(&self, name: &str) -> Option<usize> {
        self.list.iter().position(|s| s.name() == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fails on odd ticks, else reports one request of 1 ms per target.
    struct Flaky(u32);

    impl Sensor for Flaky {
        fn name(&self) -> &str {
            "flaky"
        }
        fn measures(&self) -> &'static [Quantity] {
            &[Quantity::ClientLatency]
        }
        fn sample(&mut self, _: &Tick, targets: &[Target<'_>]) -> anyhow::Result<Measurements> {
            self.0 += 1;
            anyhow::ensure!(self.0.is_multiple_of(2), "odd tick {}", self.0);
            let mut m = Measurements::empty(targets.len());
            for a in &mut m.apps {
                let mut t = ClientTick::default();
                t.latency.hist.record(1_000_000);
                t.completed = 1;
                a.client = Some(t);
            }
            Ok(m)
        }
    }

    fn tick(decide: bool) -> Tick {
        Tick {
            now_ms: 100,
            dt_s: 0.1,
            decide,
        }
    }

    #[test]
    fn a_failing_plugin_is_skipped_and_tried_again() {
        let mut s = Sensors::new(vec![Box::new(NullSensor), Box::new(Flaky(0))]);
        assert!(s.measures(Quantity::ClientLatency) && !s.measures(Quantity::Power));
        let t = [Target {
            name: "a",
            pids: &[1],
            ports: &[],
            serves: true,
        }];
        let m = s.sample(&tick(false), &t);
        assert!(m.apps[0].client.is_none());
        assert_eq!(s.error("flaky"), Some("odd tick 1"));
        let m = s.sample(&tick(false), &t);
        assert_eq!(m.apps[0].client.as_ref().map(|c| c.completed), Some(1));
        assert_eq!(s.error("flaky"), None);
        assert!(s.failed("flaky") && !s.failed("null"));
    }

    /// Counts its samples.
    struct Slow(u32);

    impl Sensor for Slow {
        fn name(&self) -> &str {
            "slow"
        }
        fn measures(&self) -> &'static [Quantity] {
            &[Quantity::Power]
        }
        fn sample(&mut self, _: &Tick, targets: &[Target<'_>]) -> anyhow::Result<Measurements> {
            self.0 += 1;
            Ok(Measurements {
                node_power_w: Some(f64::from(self.0)),
                ..Measurements::empty(targets.len())
            })
        }
        fn decision_ticks_only(&self) -> bool {
            true
        }
    }

    #[test]
    fn decision_only_plugins_wait_for_decision_ticks() {
        let mut s = Sensors::new(vec![Box::new(Slow(0))]);
        assert_eq!(s.sample(&tick(false), &[]).node_power_w, None);
        assert_eq!(s.sample(&tick(true), &[]).node_power_w, Some(1.0));
    }
}
