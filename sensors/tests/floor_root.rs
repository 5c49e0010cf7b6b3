//! The floor programs (`bpf/floor.bpf.c`) against the real kernel (needs
//! root: loads BPF). Run alone with
//! `cargo test --release -p qosd-sensors --test floor_root`.
//!
//! What the bench's floor rounds rest on: attached, the empty programs run
//! on this process's own loopback socket events; detached (and attached
//! again, which once reused a stale skeleton link), they do not. Run counts
//! need the kernel's statistics on, taken by reference for the test's
//! few hundred milliseconds.

use std::io::{Read, Write};
use std::mem::MaybeUninit;
use std::net::{TcpListener, TcpStream};

use qosd_sensors::bpfstats::{self, RunStat, StatsOn};
use qosd_sensors::ebpf::floor::{Floor, FloorHooks};

/// `n` request/reply exchanges over one loopback connection.
fn exchanges(n: usize) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (mut s, _) = l.accept().unwrap();
    let mut buf = [0u8; 4];
    for _ in 0..n {
        c.write_all(b"ping").unwrap();
        s.read_exact(&mut buf).unwrap();
        s.write_all(b"pong").unwrap();
        c.read_exact(&mut buf).unwrap();
    }
}

fn runs(stats: &[RunStat], name: &str) -> u64 {
    stats.iter().find(|r| r.name == name).map_or(0, |r| r.runs)
}

#[test]
fn the_floor_runs_on_socket_events_only_while_attached() {
    let mut storage = MaybeUninit::uninit();
    let mut floor = Floor::load(&mut storage).expect("loading the floor (root?)");
    let _on = StatsOn::take().expect("BPF statistics");
    for attempt in 0..2 {
        floor.attach(FloorHooks::Tracepoints).unwrap();
        let before = bpfstats::run_stats(floor.progs());
        exchanges(50);
        let after = bpfstats::run_stats(floor.progs());
        floor.detach();
        // Each side sends 50 times and reads 50 times: at least 100 runs
        // each (other sockets on the node may add more).
        for prog in ["floor_recv", "floor_send", "floor_ready"] {
            let n = runs(&after, prog) - runs(&before, prog);
            assert!(n >= 100, "attach {attempt}: {prog} ran {n} times");
        }
        // The cgroup programs were not attached.
        assert_eq!(runs(&after, "floor_ingress"), 0);
        let idle = bpfstats::run_stats(floor.progs());
        exchanges(50);
        let still = bpfstats::run_stats(floor.progs());
        assert_eq!(idle, still, "attach {attempt}: detached programs ran");
    }
}
