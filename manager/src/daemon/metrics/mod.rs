//! `/metrics` in the Prometheus text format (version 0.0.4), encoded by
//! `prometheus-client` (the Prometheus org's crate: names, label escaping,
//! number formatting). Naming follows Prometheus: base units (seconds,
//! hertz, watts), `_total` for counters, `_ratio` for 0..1 fractions, one
//! `app` label per managed app (and `namespace`, `pod`, `container` when
//! the app is one pod's container, Kepler's and Beyla's names, so a
//! cluster Prometheus can aggregate by them).
//!
//! Every scrape builds a [`Registry`] with one collector holding that
//! moment's families, split by idea: [`apps`], [`knobs`], [`sensors`],
//! [`node`]. The figures live in the daemon's shared state, not in
//! long-lived metric objects, so a collector (the crate's way to export
//! values owned elsewhere) is the natural fit.

mod apps;
mod knobs;
mod node;
mod sensors;

use std::collections::BTreeMap;

use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use super::state::Shared;

/// The content type Prometheus expects for this format.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// Labels of one series, in the order they are written.
type Labels = Vec<(&'static str, String)>;

/// One metric family of this scrape.
#[derive(Debug)]
struct Family {
    /// The exposed name (a counter's with its `_total`).
    name: &'static str,
    help: &'static str,
    kind: MetricType,
    samples: Vec<(Labels, f64)>,
}

impl Family {
    /// Adds a series.
    fn sample(&mut self, labels: &[(&'static str, &str)], v: f64) -> &mut Self {
        let l = labels.iter().map(|(k, v)| (*k, (*v).to_owned())).collect();
        self.samples.push((l, v));
        self
    }

    /// Adds the series of one app (`extra` labels after `app`).
    fn app(&mut self, app: &str, extra: &[(&'static str, &str)], v: f64) -> &mut Self {
        let mut l: Labels = vec![("app", app.to_owned())];
        l.extend(extra.iter().map(|(k, v)| (*k, (*v).to_owned())));
        self.samples.push((l, v));
        self
    }
}

/// The families of one scrape, in the order they are declared, and the
/// pod labels of each app that is one container.
#[derive(Debug, Default)]
struct Exposition {
    families: Vec<Family>,
    pods: BTreeMap<String, [String; 3]>,
}

impl Exposition {
    fn family(&mut self, name: &'static str, kind: MetricType, help: &'static str) -> &mut Family {
        self.families.push(Family {
            name,
            help,
            kind,
            samples: Vec::new(),
        });
        self.families.last_mut().expect("just pushed")
    }

    fn gauge(&mut self, name: &'static str, help: &'static str) -> &mut Family {
        self.family(name, MetricType::Gauge, help)
    }

    /// `name` ends in `_total`.
    fn counter(&mut self, name: &'static str, help: &'static str) -> &mut Family {
        debug_assert!(name.ends_with("_total"), "{name}");
        self.family(name, MetricType::Counter, help)
    }

    /// The text of every family.
    fn encode(self) -> String {
        let mut reg = Registry::default();
        reg.register_collector(Box::new(self));
        let mut out = String::with_capacity(8192);
        // Writing into a String cannot fail, and neither can our collector.
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &reg);
        out
    }
}

/// A value as Prometheus prints it: whole numbers without a fraction
/// (`7`, not `7.0`), others in full precision.
fn whole(v: f64) -> Option<i64> {
    (v.fract() == 0.0 && v.abs() < 9.0e15).then_some(v as i64)
}

impl prometheus_client::collector::Collector for Exposition {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for f in &self.families {
            // The crate adds a counter's `_total` itself.
            let name = match f.kind {
                MetricType::Counter => f.name.strip_suffix("_total").unwrap_or(f.name),
                _ => f.name,
            };
            let mut m = enc.encode_descriptor(name, f.help, None, f.kind)?;
            for (labels, v) in &f.samples {
                // Series that name their pod themselves keep theirs.
                let pod = match labels.first() {
                    Some(("app", app)) if !labels.iter().any(|(k, _)| *k == "pod") => {
                        self.pods.get(app)
                    }
                    _ => None,
                };
                let mut all = labels.clone();
                for (k, val) in ["namespace", "pod", "container"]
                    .into_iter()
                    .zip(pod.into_iter().flatten())
                {
                    all.push((k, val.clone()));
                }
                let s = m.encode_family(&all)?;
                match (f.kind, whole(*v)) {
                    (MetricType::Counter, Some(n)) if n >= 0 => {
                        ConstCounter::new(n as u64).encode(s)?
                    }
                    (MetricType::Counter, _) => ConstCounter::new(*v).encode(s)?,
                    (_, Some(n)) => ConstGauge::new(n).encode(s)?,
                    (_, None) => ConstGauge::new(*v).encode(s)?,
                }
            }
        }
        Ok(())
    }
}

/// The whole exposition. `dropped`: records the eBPF ring buffer lost
/// (`None` when the tracer does not run).
pub fn render(sh: &Shared, dropped: Option<u64>) -> String {
    let one_pod = sh.apps.values().filter_map(|a| match a.pods.as_slice() {
        [p] => Some((
            a.name.clone(),
            [p.namespace.clone(), p.pod.clone(), p.container.clone()],
        )),
        _ => None,
    });
    let mut o = Exposition {
        families: Vec::new(),
        pods: one_pod.collect(),
    };
    node::build(&mut o, sh);
    knobs::in_use(&mut o, sh);
    apps::build(&mut o, sh);
    knobs::allocations(&mut o, sh);
    knobs::events(&mut o, sh);
    sensors::build(&mut o, sh, dropped);
    knobs::decisions(&mut o, sh);
    node::ticks(&mut o, sh);
    o.encode()
}

/// Per traced pid, both eBPF figures over the tracer's window.
pub fn render_traced(t: &qosd_sensors::ebpf::RequestTracer, apps: &[(String, Vec<i32>)]) -> String {
    let mut o = Exposition::default();
    sensors::traced(&mut o, t, apps);
    o.encode()
}

#[cfg(test)]
mod tests;
