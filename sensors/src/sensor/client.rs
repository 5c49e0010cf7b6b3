//! Client feedback as a plugin: latency reported by the clients (the
//! classic PARTIES feedback). Reports arrive on one channel per app,
//! whoever sends them: a replay's load generator, or the daemon's HTTP
//! API through a [`ClientInbox`] that validates each report first.

use std::collections::BTreeMap;
use std::sync::mpsc::{channel, Receiver, Sender, TryRecvError};
use std::sync::{Arc, Mutex};

use qosd_core::control::Tick;

use super::{ClientTick, LatencyTick, Measurements, Quantity, Sensor};

/// One report of a client: the latencies of replies it completed.
#[derive(Debug, Clone, Default)]
pub struct ClientReport {
    pub latency: LatencyTick,
    /// Load offered when the report was made, rps (load generators).
    pub offered_rps: Option<f64>,
    /// Replies completed (every latency of `latency`, or more where the
    /// sender counts replies it kept no latency of).
    pub completed: u64,
}

/// Most latencies one report may carry.
pub const MAX_REPORT: usize = 1_000_000;

/// Largest latency a report may carry, µs: one hour. A request slower than
/// that is a client bug or a unit mistake (ns sent as µs), not a latency a
/// QoS target can be compared with; refusing it keeps every figure exact
/// (the histogram holds values up to about 73 minutes at 0.4 %).
pub const MAX_LATENCY_US: f64 = 3_600_000_000.0;

impl ClientReport {
    /// A report of latencies in µs, in the order they completed. Refuses
    /// the whole report if any value is negative, not a number, or above
    /// [`MAX_LATENCY_US`].
    pub fn from_us(latencies_us: &[f64]) -> Result<ClientReport, String> {
        if latencies_us.len() > MAX_REPORT {
            return Err(format!(
                "{} latencies in one report: at most {MAX_REPORT}",
                latencies_us.len()
            ));
        }
        if let Some((i, v)) = latencies_us
            .iter()
            .enumerate()
            .find(|(_, v)| !(v.is_finite() && (0.0..=MAX_LATENCY_US).contains(*v)))
        {
            return Err(format!(
                "latencies_us[{i}] = {v}: a latency is a number of microseconds \
                 from 0 to {MAX_LATENCY_US:.0} (one hour)"
            ));
        }
        let mut r = ClientReport {
            completed: latencies_us.len() as u64,
            ..Default::default()
        };
        // A POST says nothing of when its requests ended: they are filed
        // by when it arrived.
        let now = qosd_core::clock::monotonic_ns();
        for &v in latencies_us {
            let ns = (v * 1e3).round() as u64;
            r.latency.hist.record(ns);
            r.latency.ended.push(now, ns);
        }
        r.latency.latest_ns = latencies_us.last().map(|v| (v * 1e3).round() as u64);
        Ok(r)
    }
}

/// Where the daemon's API puts an app's client reports: checked, counted
/// and handed to the app's [`ClientSensor`] channel (dropped while no
/// sensor listens).
#[derive(Debug, Default)]
pub struct ClientInbox {
    tx: Option<Sender<ClientReport>>,
    /// Latencies accepted since the daemon started.
    pub accepted_total: u64,
}

impl ClientInbox {
    /// An inbox and the receiving end for the sensor.
    pub fn connected() -> (ClientInbox, Receiver<ClientReport>) {
        let (tx, rx) = channel();
        (
            ClientInbox {
                tx: Some(tx),
                accepted_total: 0,
            },
            rx,
        )
    }

    /// Adds reported latencies (µs); see [`ClientReport::from_us`].
    pub fn record_us(&mut self, latencies_us: &[f64]) -> Result<usize, String> {
        let r = ClientReport::from_us(latencies_us)?;
        if let Some(tx) = &self.tx {
            // The sensor gone (the loop ended): nothing left to feed.
            let _ = tx.send(r);
        }
        self.accepted_total += latencies_us.len() as u64;
        Ok(latencies_us.len())
    }
}

/// The client channels of a [`ClientSensor`], by app name: shared with
/// whoever adds and removes apps while the sensor runs (the daemon's
/// config reload and pod watch).
pub struct ClientFeeds<R = ClientReport>(Arc<Mutex<BTreeMap<String, Receiver<R>>>>);

impl<R> Clone for ClientFeeds<R> {
    fn clone(&self) -> Self {
        ClientFeeds(Arc::clone(&self.0))
    }
}

impl<R> ClientFeeds<R> {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Receiver<R>>> {
        // A panic elsewhere while holding it leaves a map still whole.
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// App `name`'s reports arrive on `rx` from now on (replacing any
    /// earlier channel of that name).
    pub fn connect(&self, name: &str, rx: Receiver<R>) {
        self.lock().insert(name.to_owned(), rx);
    }

    /// App `name` has no client reports any more.
    pub fn disconnect(&self, name: &str) {
        self.lock().remove(name);
    }
}

impl ClientFeeds<ClientReport> {
    /// A new inbox whose reports feed app `name`.
    pub fn inbox(&self, name: &str) -> ClientInbox {
        let (inbox, rx) = ClientInbox::connected();
        self.connect(name, rx);
        inbox
    }
}

/// Client-reported latency: drains each app's channel every tick. A
/// channel whose senders are all gone (a load generator that finished)
/// marks the measurements `ended`.
pub struct ClientSensor<R = ClientReport> {
    feeds: ClientFeeds<R>,
}

impl<R: Into<ClientReport>> ClientSensor<R> {
    /// `feeds`: each app's channel, by app name (an app without one has
    /// no client reports).
    pub fn new(feeds: impl IntoIterator<Item = (String, Receiver<R>)>) -> Self {
        ClientSensor {
            feeds: ClientFeeds(Arc::new(Mutex::new(feeds.into_iter().collect()))),
        }
    }

    /// Its channels, to connect apps added later.
    pub fn feeds(&self) -> ClientFeeds<R> {
        self.feeds.clone()
    }
}

impl<R: Into<ClientReport>> Sensor for ClientSensor<R> {
    fn name(&self) -> &str {
        "client"
    }

    fn measures(&self) -> &'static [Quantity] {
        &[Quantity::ClientLatency]
    }

    fn sample(
        &mut self,
        _tick: &Tick,
        targets: &[super::Target<'_>],
    ) -> anyhow::Result<Measurements> {
        let mut m = Measurements::empty(targets.len());
        let feeds = self.feeds.lock();
        for (out, target) in m.apps.iter_mut().zip(targets) {
            let Some(rx) = feeds.get(target.name) else {
                continue;
            };
            let mut t = ClientTick::default();
            loop {
                match rx.try_recv() {
                    Ok(r) => {
                        let mut r: ClientReport = r.into();
                        t.latency.hist.merge(&r.latency.hist);
                        t.latency.ended.append(&mut r.latency.ended);
                        t.latency.latest_ns = r.latency.latest_ns.or(t.latency.latest_ns);
                        t.offered_rps = r.offered_rps.or(t.offered_rps);
                        t.completed += r.completed;
                    }
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        m.ended = true;
                        break;
                    }
                }
            }
            out.client = Some(t);
        }
        drop(feeds);
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Any report: refused whole (nothing recorded) if a value is out
        /// of [0, one hour] or not a number, else recorded with the exact
        /// mean, and never a figure above the largest value reported.
        #[test]
        fn a_report_is_taken_whole_or_not_at_all(
            values in prop::collection::vec(
                prop_oneof![
                    0.0f64..=MAX_LATENCY_US,
                    any::<f64>(),
                    Just(MAX_LATENCY_US),
                    Just(1e16),
                ],
                1..50,
            ),
        ) {
            let (mut i, rx) = ClientInbox::connected();
            let ok = values.iter().all(|v| (0.0..=MAX_LATENCY_US).contains(v));
            prop_assert_eq!(i.record_us(&values).is_ok(), ok);
            let got = rx.try_recv();
            if !ok {
                prop_assert!(got.is_err());
                prop_assert_eq!(i.accepted_total, 0);
                return Ok(());
            }
            let h = got.unwrap().latency.hist;
            let ns: Vec<f64> = values.iter().map(|v| (v * 1e3).round()).collect();
            let mean = ns.iter().sum::<f64>() / ns.len() as f64;
            prop_assert!((h.mean().unwrap() - mean).abs() <= 1e-9 * mean.max(1.0));
            let max = ns.iter().cloned().fold(0.0, f64::max);
            prop_assert!(h.percentile(100.0).unwrap() as f64 <= max * (1.0 + 1.0 / 128.0) + 1.0);
        }
    }

    fn tick() -> Tick {
        Tick {
            now_ms: 100,
            dt_s: 0.1,
            decide: false,
        }
    }

    #[test]
    fn the_inbox_validates_and_the_sensor_merges() {
        let (mut i, rx) = ClientInbox::connected();
        let mut s = ClientSensor::new([("a".to_owned(), rx)]);
        let t = [
            super::super::Target {
                name: "a",
                pids: &[],
                ports: &[],
                serves: true,
            },
            super::super::Target {
                name: "b",
                pids: &[],
                ports: &[],
                serves: true,
            },
        ];
        assert_eq!(i.record_us(&[100.0, 250.5]).unwrap(), 2);
        let e = i.record_us(&[1.0, -3.0]).unwrap_err();
        assert!(e.contains("latencies_us[1]"), "{e}");
        assert!(i.record_us(&[f64::NAN]).is_err());
        // The reproduction (1e16 µs) and anything above an hour are
        // refused whole; an hour is fine.
        let e = i.record_us(&[5.0, 1e16, 1e16]).unwrap_err();
        assert!(
            e.contains("latencies_us[1]") && e.contains("one hour"),
            "{e}"
        );
        assert!(i.record_us(&[MAX_LATENCY_US + 1.0]).is_err());
        assert!(i.record_us(&[f64::INFINITY]).is_err());
        assert_eq!(i.record_us(&[MAX_LATENCY_US]).unwrap(), 1);
        let m = s.sample(&tick(), &t).unwrap();
        let c = m.apps[0].client.as_ref().unwrap();
        assert_eq!((c.latency.hist.len(), c.completed), (3, 3));
        assert_eq!(c.latency.latest_ns, Some(3_600_000_000_000));
        assert_eq!(i.accepted_total, 3);
        assert!(m.apps[1].client.is_none() && !m.ended);
        let m = s.sample(&tick(), &t).unwrap();
        let c = m.apps[0].client.as_ref().unwrap();
        assert!(c.latency.hist.is_empty() && c.latency.latest_ns.is_none());
        // The sender gone: the load ended.
        drop(i);
        assert!(s.sample(&tick(), &t).unwrap().ended);
    }
}
