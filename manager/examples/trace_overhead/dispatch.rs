//! The dispatch of the socket hooks, priced without memcached's noise: one
//! thread sends a datagram to itself over loopback UDP and reads it back
//! (each round trip fires `sock_send_length`, `sk_data_ready` and
//! `sock_recv_length` once), with the floor's empty programs attached or
//! not, in interleaved pairs; the CPU time per round trip differs by what
//! the kernel spends reaching three empty programs. With the scoped floor
//! the bench joins memcached's cgroup for the pairs (its sockets then run
//! the `cgroup_skb` programs: egress on the send, ingress on the receive,
//! and `sock_recv_length`) and goes back to the root cgroup after.

use std::net::UdpSocket;
use std::path::Path;

use qosd_sensors::bpfstats::{self, StatsOn};
use qosd_sensors::ebpf::floor::{Floor, FloorHooks};

use crate::rounds::Side;
use crate::{med, pin_thread, thread_cpu_ns, Setup};

/// Round trips per run.
const TRIPS: u64 = 200_000;

/// CPU ns per round trip over `TRIPS` round trips.
fn trip_ns(a: &UdpSocket, b: &UdpSocket) -> f64 {
    let mut buf = [0u8; 16];
    let t0 = thread_cpu_ns();
    for _ in 0..TRIPS {
        a.send(b"x").expect("send");
        b.recv(&mut buf).expect("recv");
    }
    (thread_cpu_ns() - t0) as f64 / TRIPS as f64
}

/// Hook runs per round trip (with the statistics on; a separate pass, so
/// that their clock reads stay out of the timed pairs).
fn runs_per_trip(
    floor: &mut Floor,
    hooks: FloorHooks,
    a: &UdpSocket,
    b: &UdpSocket,
) -> Result<f64, String> {
    let _on = StatsOn::take().map_err(|e| e.to_string())?;
    floor.attach(hooks).map_err(|e| e.to_string())?;
    let sum = |f: &Floor| -> u64 { bpfstats::run_stats(f.progs()).iter().map(|r| r.runs).sum() };
    let before = sum(floor);
    trip_ns(a, b);
    let n = sum(floor) - before;
    floor.detach();
    Ok(n as f64 / TRIPS as f64)
}

/// Moves this process into the cgroup (v2) `dir` (its `cgroup.procs`).
fn join(dir: &Path) -> Result<(), String> {
    std::fs::write(dir.join("cgroup.procs"), std::process::id().to_string())
        .map_err(|e| format!("joining {}: {e}", dir.display()))
}

/// The scoped floor's dispatch: the pairs run from inside `dir`, which
/// the process leaves for its parent (the cgroup2 root) afterwards.
pub fn measure_scoped(
    floor: &mut Floor,
    pairs: usize,
    cpu: Option<usize>,
    dir: &Path,
) -> Result<String, String> {
    join(dir)?;
    let r = measure(floor, pairs, cpu, FloorHooks::Cgroup(dir));
    let back = join(dir.parent().ok_or("a cgroup with no parent")?);
    let text = r?;
    back?;
    Ok(text)
}

/// `pairs` interleaved pairs (without, with the floor on `hooks`), on
/// `cpu`: a markdown paragraph.
pub fn measure(
    floor: &mut Floor,
    pairs: usize,
    cpu: Option<usize>,
    hooks: FloorHooks,
) -> Result<String, String> {
    if let Some(c) = cpu {
        pin_thread(c);
    }
    let a = UdpSocket::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let b = UdpSocket::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    a.connect(b.local_addr().unwrap())
        .map_err(|e| e.to_string())?;
    trip_ns(&a, &b); // warm-up
    let (mut off, mut on, mut delta) = (vec![], vec![], vec![]);
    for i in 0..pairs {
        let mut pair = [0.0; 2];
        for with in if i % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        } {
            if with {
                floor.attach(hooks).map_err(|e| e.to_string())?;
            }
            pair[usize::from(with)] = trip_ns(&a, &b);
            floor.detach();
        }
        off.push(pair[0]);
        on.push(pair[1]);
        delta.push(pair[1] - pair[0]);
    }
    let runs = runs_per_trip(floor, hooks, &a, &b)?;
    let d = med(&delta);
    let what = match hooks {
        FloorHooks::Tracepoints => "the socket hooks",
        FloorHooks::Cgroup(_) => "the scoped hooks (cgroup_skb in/egress + sock_recv_length)",
    };
    Ok(format!(
        "Dispatch of {what} (loopback UDP round trips by one thread, {TRIPS} a run, \
         {pairs} interleaved pairs without / with the floor's empty programs): {:.0} / {:.0} ns \
         of CPU per round trip (medians), **+{d:.0} ns** (median of the per-pair deltas; \
         spread {:.0} to {:.0}) for {runs:.2} hook runs per round trip: **{:.0} ns per run** \
         of dispatch alone.\n",
        med(&off),
        med(&on),
        delta.iter().cloned().fold(f64::INFINITY, f64::min),
        delta.iter().cloned().fold(f64::NEG_INFINITY, f64::max),
        d / runs.max(1e-9),
    ))
}

/// The dispatch of each floor in `floors`, on `cpu`: `DISPATCH` pairs
/// each (default 10; 0: none).
pub fn all(setup: &mut Setup, floors: &[Side], cpu: Option<usize>) -> Vec<Result<String, String>> {
    let pairs: usize = std::env::var("DISPATCH")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let mut out = vec![];
    let Some(f) = setup.floor.as_mut() else {
        return out;
    };
    if pairs == 0 {
        return out;
    }
    if floors.contains(&Side::Floor) {
        out.push(measure(f, pairs, cpu, FloorHooks::Tracepoints));
    }
    if let (Some(dir), true) = (&setup.cgroup, floors.contains(&Side::CgroupFloor)) {
        out.push(measure_scoped(f, pairs, cpu, dir));
    }
    out
}
