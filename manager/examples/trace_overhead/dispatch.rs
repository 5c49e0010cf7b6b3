//! The dispatch of the socket hooks, priced without memcached's noise: one
//! thread sends a datagram to itself over loopback UDP and reads it back
//! (each round trip fires `sock_send_length`, `sk_data_ready` and
//! `sock_recv_length` once), with the floor's empty programs attached or
//! not, in interleaved pairs; the CPU time per round trip differs by what
//! the kernel spends reaching three empty programs.

use std::net::UdpSocket;

use qosd_sensors::bpfstats::{self, StatsOn};
use qosd_sensors::ebpf::floor::{Floor, FloorHooks};

use crate::{med, pin_thread, thread_cpu_ns};

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
fn runs_per_trip(floor: &mut Floor, a: &UdpSocket, b: &UdpSocket) -> Result<f64, String> {
    let _on = StatsOn::take().map_err(|e| e.to_string())?;
    floor
        .attach(FloorHooks::Tracepoints)
        .map_err(|e| e.to_string())?;
    let sum = |f: &Floor| -> u64 { bpfstats::run_stats(f.progs()).iter().map(|r| r.runs).sum() };
    let before = sum(floor);
    trip_ns(a, b);
    let n = sum(floor) - before;
    floor.detach();
    Ok(n as f64 / TRIPS as f64)
}

/// `pairs` interleaved pairs (without, with the floor), on `cpu`: a
/// markdown paragraph.
pub fn measure(floor: &mut Floor, pairs: usize, cpu: Option<usize>) -> Result<String, String> {
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
                floor
                    .attach(FloorHooks::Tracepoints)
                    .map_err(|e| e.to_string())?;
            }
            pair[usize::from(with)] = trip_ns(&a, &b);
            floor.detach();
        }
        off.push(pair[0]);
        on.push(pair[1]);
        delta.push(pair[1] - pair[0]);
    }
    let runs = runs_per_trip(floor, &a, &b)?;
    let d = med(&delta);
    Ok(format!(
        "Dispatch of the socket hooks (loopback UDP round trips by one thread, {TRIPS} a run, \
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
