//! The sensing layer against test plugins: the policy's snapshot, the
//! interval rows, and apps added and removed at run time.

use super::*;
use qosd_core::slo::{SloSide, TargetFrom};
use qosd_sensors::sensor::{ClientTick, NullSensor, Sensor};

/// Every tick, 10 client replies of 2 ms per target; on decision
/// ticks, 0.5 s of CPU time per target.
struct Steady;

impl Sensor for Steady {
    fn name(&self) -> &str {
        "steady"
    }
    fn measures(&self) -> &'static [Quantity] {
        &[Quantity::ClientLatency, Quantity::CpuTime]
    }
    fn sample(&mut self, tick: &Tick, targets: &[Target<'_>]) -> anyhow::Result<Measurements> {
        let mut m = Measurements::empty(targets.len());
        for r in &mut m.apps {
            let mut c = ClientTick {
                completed: 10,
                ..Default::default()
            };
            for _ in 0..10 {
                c.latency.hist.record(2_000_000);
            }
            r.client = Some(c);
            r.cpu_s = tick.decide.then_some(0.5);
        }
        Ok(m)
    }
}

/// Manages every app but `c`, two CPUs each.
struct TwoCpus;

impl Holdings for TwoCpus {
    fn managed(&self, app: &str) -> bool {
        app != "c"
    }
    fn nr_cpus(&self, _: &str) -> usize {
        2
    }
    fn cpus_held(&self, _: &str) -> Option<f64> {
        Some(2.0)
    }
}

fn app(name: &str, feedback: Feedback) -> SenseApp {
    SenseApp {
        name: name.into(),
        class: AppClass::Lc,
        feedback,
        figure: Figure::Latency,
        limits: Limits::default(),
        percentile: 99.0,
        client_target_us: Some(1000.0),
        // A calibrated gap of 500 µs at any load.
        slo: Some(SloSide::new(
            1000.0,
            qosd_core::slo::GapModel::fit(vec![qosd_core::slo::GapPoint {
                rps: 0.0,
                gap_us: 500.0,
            }]),
        )),
        ports: Vec::new(),
        driven: false,
        serves: true,
    }
}

fn tick(k: u64) -> Tick {
    Tick {
        now_ms: k * 100,
        dt_s: 0.1,
        decide: k.is_multiple_of(5),
    }
}

#[test]
fn builds_the_policy_snapshot_from_the_plugins() {
    let sensors = Sensors::new(vec![Box::new(NullSensor), Box::new(Steady)]);
    let apps = vec![
        app("c", Feedback::Client),
        app("b", Feedback::Ebpf),
        app("a", Feedback::Client),
    ];
    let mut s = Sensing::new(sensors, apps, 5);
    let mut last = None;
    for k in 1..=5 {
        last = Some(s.sense(&tick(k), &TwoCpus));
    }
    let (sensed, readings) = last.unwrap();
    assert_eq!(readings.len(), 3);
    let names: Vec<&str> = sensed
        .snapshot
        .apps
        .iter()
        .map(|a| a.name.as_str())
        .collect();
    assert_eq!(names, ["a", "b"], "managed apps only, by name");
    let a = &sensed.snapshot.apps[0];
    assert!((a.latency_us.unwrap() - 2000.0).abs() < 10.0, "{a:?}");
    assert!((a.rps - 100.0).abs() < 1e-6, "{a:?}");
    assert_eq!(a.target.unwrap().value_us, 1000.0);
    // 0.5 CPU-s over 0.5 s on 2 CPUs.
    assert!((a.cpu_util - 0.5).abs() < 1e-9, "{a:?}");
    // b is fed by eBPF, which no plugin measures: idle, its eBPF target.
    let b = &sensed.snapshot.apps[1];
    assert_eq!((b.latency_us, b.rps), (None, 0.0));
    assert_eq!(b.target.unwrap().value_us, 500.0);
    // The interval's rows: every app, its client latency whatever fed it.
    assert_eq!(sensed.interval.len(), 3);
    let row_a = &sensed.interval[2];
    assert!((row_a.achieved_rps - 100.0).abs() < 1e-6, "{row_a:?}");
    assert!(row_a.client_us.is_some() && row_a.ebpf_us.is_none());
    assert_eq!(sensed.interval[1].client_us, row_a.client_us);
    assert_eq!(sensed.snapshot.since_ms, Some(0));
    // After a plan: only what was measured under it.
    s.restart(500);
    let (sensed, _) = s.sense(&tick(6), &TwoCpus);
    assert_eq!(sensed.snapshot.since_ms, Some(500));
    assert!((sensed.snapshot.apps[0].rps - 100.0).abs() < 1e-6);
}

#[test]
fn apps_added_and_removed_at_run_time_keep_their_own_figures() {
    use qosd_sensors::sensor::client::ClientSensor;
    let client = ClientSensor::new([]);
    let feeds = client.feeds();
    let sensors = Sensors::new(vec![Box::new(client)]);
    let mut s = Sensing::new(sensors, vec![app("a", Feedback::Client)], 5);
    let mut inbox_a = feeds.inbox("a");
    s.add_app(app("b", Feedback::Client));
    let mut inbox_b = feeds.inbox("b");
    inbox_a.record_us(&[100.0; 10]).unwrap();
    inbox_b.record_us(&[300.0; 10]).unwrap();
    let (sensed, _) = s.sense(&tick(1), &TwoCpus);
    let lat: Vec<_> = sensed.snapshot.apps.iter().map(|a| a.latency_us).collect();
    assert!((lat[0].unwrap() - 100.0).abs() < 1.0, "{lat:?}");
    assert!((lat[1].unwrap() - 300.0).abs() < 2.0, "{lat:?}");
    // a goes: b keeps its figures, now at index 0.
    s.remove_app(0);
    feeds.disconnect("a");
    inbox_b.record_us(&[300.0; 10]).unwrap();
    let (sensed, _) = s.sense(&tick(2), &TwoCpus);
    assert_eq!(sensed.snapshot.apps.len(), 1);
    let b = &sensed.snapshot.apps[0];
    assert_eq!((b.name.as_str(), b.nr_samples), ("b", 20), "{b:?}");
    // A report to the removed app reaches nobody.
    assert!(inbox_a.record_us(&[1.0]).is_ok());
    let (sensed, _) = s.sense(&tick(3), &TwoCpus);
    assert_eq!(sensed.snapshot.apps[0].nr_samples, 20);
}

/// Every tick, `n` requests seen by both sides: the server's at 400 µs,
/// the client's at 900 µs (a 500 µs gap).
struct BothSides(u64);

impl Sensor for BothSides {
    fn name(&self) -> &str {
        "both"
    }
    fn measures(&self) -> &'static [Quantity] {
        &[Quantity::ClientLatency, Quantity::ServerLatency]
    }
    fn sample(&mut self, _: &Tick, targets: &[Target<'_>]) -> anyhow::Result<Measurements> {
        let mut m = Measurements::empty(targets.len());
        for r in &mut m.apps {
            let mut c = ClientTick::default();
            let mut e = LatencyTick::default();
            for _ in 0..self.0 {
                c.latency.hist.record(900_000);
                e.hist.record(400_000);
            }
            r.client = Some(c);
            r.server = Some([e.clone(), e]);
        }
        Ok(m)
    }
}

/// The eBPF-side target of an uncalibrated eBPF-fed app after `ticks`
/// monitoring ticks of `n` requests each.
fn ebpf_target_after(n: u64, ticks: u64) -> (f64, TargetFrom) {
    let sensors = Sensors::new(vec![Box::new(BothSides(n))]);
    let mut a = app("b", Feedback::Ebpf);
    a.slo = Some(SloSide::new(1000.0, None));
    let mut s = Sensing::new(sensors, vec![a], 5);
    for k in 1..=ticks {
        s.sense(&tick(k), &TwoCpus);
    }
    s.slo(0)
        .unwrap()
        .ebpf_target_us(qosd_core::slo::Load::rps(0.0))
}

#[test]
fn client_samples_set_the_gap_one_interval_at_a_time() {
    // Without client samples: the target as written.
    assert_eq!(ebpf_target_after(0, 50), (1000.0, TargetFrom::Client));
    // 1000 requests an interval: the first decision measures the gap.
    assert_eq!(ebpf_target_after(200, 4), (1000.0, TargetFrom::Client));
    let (t, from) = ebpf_target_after(200, 5);
    assert_eq!(from, TargetFrom::RefreshedGap);
    assert!((t - 500.0).abs() < 10.0, "{t}");
    // 100 an interval put one request beyond a p99: enough, at once.
    let (t, from) = ebpf_target_after(20, 5);
    assert_eq!(from, TargetFrom::RefreshedGap);
    assert!((t - 500.0).abs() < 10.0, "{t}");
    // 95 an interval: that p99 is each interval's maximum; never read.
    assert_eq!(ebpf_target_after(19, 100).1, TargetFrom::Client);
}

/// A stall (one interval whose client p99 is 50 ms above the server's)
/// gives one residual, however many requests each interval holds: windows
/// widened to a p99's 1000 requests carried it into the next 7 too.
#[test]
fn one_stall_gives_one_residual() {
    let hist = |ns: u64, n: u64| {
        let mut h = LogHistogram::new();
        (0..n).for_each(|_| h.record(ns));
        h
    };
    let mut slo = SloSide::new(100_000.0, None);
    let mut gaps = Vec::new();
    for k in 0..20 {
        // 150 requests an interval (300 rps at 500 ms): 300 µs of gap,
        // 50 ms in interval 3.
        let client = hist(if k == 3 { 51_000_000 } else { 1_300_000 }, 150);
        let server = hist(1_000_000, 150);
        let (rps, c, e) = gaps::interval_gap(&client, &server, 0.5, 99.0).expect("enough");
        assert!((rps - 300.0).abs() < 1e-9);
        gaps.push(c - e);
        slo.refresh(qosd_core::slo::Load::rps(rps), c, e);
    }
    assert_eq!(gaps.iter().filter(|&&g| g > 1000.0).count(), 1, "{gaps:?}");
    let gap = slo.gap_us(qosd_core::slo::Load::rps(300.0));
    assert!((gap - 300.0).abs() < 20.0, "{gap}");
    // Fewer requests than a p99 needs on either side: no residual.
    assert!(gaps::interval_gap(&hist(1, 99), &hist(1, 150), 0.5, 99.0).is_none());
    assert!(gaps::interval_gap(&hist(1, 150), &hist(1, 99), 0.5, 99.0).is_none());
    assert_eq!(gaps::min_interval_requests(99.0), 100);
    assert_eq!(gaps::min_interval_requests(90.0), 10);
}

/// The two sides tell of the same requests at different ticks (the eBPF
/// side one tick late, as a ring buffer read late or a turn's record
/// left at the next request does): filed by when each ended and cut at
/// the same instant, an interval holds the same requests on both sides.
/// A sensor that gives no end instants goes into the interval at once.
#[test]
fn both_sides_file_a_request_into_the_interval_it_ended_in() {
    use qosd_sensors::filed::Ended;
    let mut m = meter::Meter::new(5, 99.0);
    let one = |end_ns: u64, ns: u64| {
        let mut h = LogHistogram::new();
        h.record(ns);
        let mut e = Ended::default();
        e.push(end_ns, ns);
        (h, e)
    };
    // Requests k = 1..=10 end at k·100 ms, k ms long; the client tells
    // of each at its tick, eBPF at the next.
    let req = |k: u64| one(k * 100_000_000, k * 1_000_000);
    let none = || (LogHistogram::new(), Ended::default());
    for k in 1..=10u64 {
        let (ch, mut ce) = req(k);
        let (sh, mut se) = if k > 1 { req(k - 1) } else { none() };
        m.file((&ch, &mut ce), (&sh, &mut se));
        if k == 5 || k == 10 {
            // The interval ends at tick k, cut one tick back (the lag).
            m.close_files((k - 1) * 100_000_000);
            assert_eq!(m.iv_client.len(), m.iv_server.len(), "tick {k}");
            assert_eq!(
                m.iv_client.percentile(100.0),
                m.iv_server.percentile(100.0),
                "tick {k}"
            );
            assert_eq!(m.iv_client.len(), if k == 5 { 4 } else { 5 });
            m.iv_client.clear();
            m.iv_server.clear();
        }
    }
    // A sensor that gives no end instants: into the interval at once.
    let (h, _) = req(1);
    m.file((&h, &mut Ended::default()), (&h, &mut Ended::default()));
    assert_eq!((m.iv_client.len(), m.iv_server.len()), (1, 1));
}
