//! Benchmark: what `qosd trace` costs a saturated memcached on loopback.
//!
//! Rounds of back-to-back pairs, each side a closed-loop get load from N
//! connections for a fixed time: untraced vs `qosd trace` attached (a
//! separate process; the order alternates by round), untraced vs untraced
//! (the A/A control: how far two identical runs differ, i.e. what this
//! bench can resolve; `AA=0` skips it), and with `FLOOR=1` untraced vs the
//! floor (empty programs on the same hooks: what the attach points alone
//! cost). Prints a markdown section with the median [q1, q3] of the
//! per-pair throughput and CPU-per-request ratios (server + client threads,
//! from schedstat: less disturbed than throughput by other load on a shared
//! machine). memcached (`-t 1`) and the client's threads are pinned to CPUs
//! of their own (`PIN=S,C`, default `1,0`; `PIN=off`: unpinned, `-t 2`).
//! Then BPF_STATS runs of each variant (default 1; 0: none) with the
//! kernel's BPF run-time statistics on give each program's runs and run
//! time per request. ROUNDS 0 measures the statistics alone. Run by
//! `make bench`.
//!
//! Usage: trace_overhead [ROUNDS] [SECS_PER_RUN] [CONNECTIONS]

mod cost;
mod dispatch;
mod rounds;

use std::io::{BufRead, BufReader, Write};
use std::mem::MaybeUninit;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use qosd_sensors::bpfstats;
use qosd_sensors::ebpf::floor::{Floor, FloorHooks};
use qosd_sensors::stats::LogHistogram;

use rounds::{Rounds, Side};

/// CPU time of every thread of `pid` so far (ns), from schedstat (exact,
/// unlike the tick-rounded utime/stime).
fn process_cpu_ns(pid: u32) -> u64 {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| std::fs::read_to_string(e.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// CPU time of the calling thread so far (ns).
pub fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// The node's (steal, all) jiffies so far, from /proc/stat: a guest's
/// CPUs taken by the host show as steal.
fn steal_jiffies() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let f: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    (f.get(7).copied().unwrap_or(0), f.iter().take(8).sum())
}

/// Iterations of the speed probe's dependent multiply-add chain (~5 ms).
const PROBE_ITERS: u64 = 4_000_000;

/// The CPU's speed now, as this thread's CPU time (ns, schedstat) for a
/// fixed chain of work on `cpu` (None: where it lands). A guest cannot
/// see the host's frequency or a busy hyperthread sibling, and steal
/// does not count them; this does, so CPU time per request can be taken
/// in units of this work.
fn speed_probe(cpu: Option<usize>) -> f64 {
    std::thread::spawn(move || {
        if let Some(c) = cpu {
            pin_thread(c);
        }
        let t0 = thread_cpu_ns();
        let mut x = 1u64;
        for _ in 0..PROBE_ITERS {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
        std::hint::black_box(x);
        (thread_cpu_ns() - t0) as f64
    })
    .join()
    .expect("speed probe")
}

/// The mean probe over the server's and the client's CPUs.
fn speed(pin: Option<Pin>) -> f64 {
    match pin {
        Some(p) => (speed_probe(Some(p.server)) + speed_probe(Some(p.client))) / 2.0,
        None => speed_probe(None),
    }
}

/// Where the server and the client run.
#[derive(Clone, Copy)]
struct Pin {
    server: usize,
    client: usize,
}

/// `PIN`: "S,C" (default "1,0") or "off".
fn pin_from_env() -> Option<Pin> {
    let v = std::env::var("PIN").unwrap_or_else(|_| "1,0".into());
    if v == "off" || v == "0" {
        return None;
    }
    let (s, c) = v.split_once(',').expect("PIN: S,C (CPU numbers) or off");
    Some(Pin {
        server: s.trim().parse().expect("PIN: server CPU"),
        client: c.trim().parse().expect("PIN: client CPU"),
    })
}

/// Pins the calling thread to `cpu`.
pub fn pin_thread(cpu: usize) {
    let mut set = nix::sched::CpuSet::new();
    set.set(cpu).expect("PIN: CPU number out of range");
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set)
        .expect("pinning a client thread");
}

/// One closed-loop run.
pub struct Run {
    rps: f64,
    p50_us: f64,
    /// Server + client CPU time per request (µs).
    cpu_us: f64,
    /// The tracer process's CPU time per request (µs; 0 untraced).
    tracer_us: f64,
    /// Share of the node's CPU time the host took (steal).
    steal: f64,
    /// The speed probe's ns around the run (mean of before and after).
    probe_ns: f64,
    requests: u64,
}

/// One client connection's closed loop until `deadline`: (gets, their
/// latencies, the thread's CPU time).
fn client(port: u16, c: usize, deadline: Instant, pin: Option<Pin>) -> (u64, LogHistogram, u64) {
    if let Some(p) = pin {
        pin_thread(p.client);
    }
    let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_nodelay(true).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut r = BufReader::new(s);
    let key = format!("bench{c}");
    r.get_mut()
        .write_all(format!("set {key} 0 0 32\r\n{}\r\n", "x".repeat(32)).as_bytes())
        .unwrap();
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    let get = format!("get {key}\r\n");
    let mut h = LogHistogram::new();
    let mut n = 0u64;
    // Bounded by time and by count.
    while Instant::now() < deadline && n < 50_000_000 {
        let t0 = Instant::now();
        r.get_mut().write_all(get.as_bytes()).unwrap();
        loop {
            line.clear();
            r.read_line(&mut line).unwrap();
            if line == "END\r\n" {
                break;
            }
        }
        h.record(t0.elapsed().as_nanos() as u64);
        n += 1;
    }
    // A new thread: its CPU time is this run's.
    (n, h, thread_cpu_ns())
}

/// The load the bench puts on memcached.
#[derive(Clone, Copy)]
pub struct Load {
    port: u16,
    conns: usize,
    secs: f64,
    server: u32,
    pin: Option<Pin>,
}

/// A closed-loop run; `tracer`: the pid of the `qosd trace` attached.
pub fn run_load(l: &Load, secs: f64, tracer: Option<u32>) -> Run {
    let server_cpu0 = process_cpu_ns(l.server);
    let tracer_cpu0 = tracer.map_or(0, process_cpu_ns);
    let probe0 = speed(l.pin);
    let steal0 = steal_jiffies();
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let threads: Vec<_> = (0..l.conns)
        .map(|c| {
            let (port, pin) = (l.port, l.pin);
            std::thread::spawn(move || client(port, c, deadline, pin))
        })
        .collect();
    let (mut total, mut cpu_ns, mut all) = (0, 0, LogHistogram::new());
    for t in threads {
        let (n, h, cpu) = t.join().unwrap();
        total += n;
        cpu_ns += cpu;
        all.merge(&h);
    }
    let steal1 = steal_jiffies();
    let probe_ns = (probe0 + speed(l.pin)) / 2.0;
    cpu_ns += process_cpu_ns(l.server).saturating_sub(server_cpu0);
    let tracer_ns = tracer.map_or(0, |t| process_cpu_ns(t).saturating_sub(tracer_cpu0));
    let per_req = |ns: u64| ns as f64 / 1e3 / total.max(1) as f64;
    Run {
        tracer_us: per_req(tracer_ns),
        rps: total as f64 / secs,
        p50_us: all.percentile(50.0).unwrap_or(0) as f64 / 1e3,
        cpu_us: per_req(cpu_ns),
        steal: (steal1.0 - steal0.0) as f64 / (steal1.1 - steal0.1).max(1) as f64,
        probe_ns,
        requests: total,
    }
}

/// The server goes away with the benchmark, even when it panics.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `qosd trace --pid pid`, attached once its first line is out.
pub fn start_trace(qosd: &str, pid: u32) -> Child {
    let mut c = Command::new(qosd)
        .args([
            "trace",
            "--pid",
            &pid.to_string(),
            "--interval",
            "1",
            "--json",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("running qosd");
    // Wait for the first line: the programs are attached by then.
    let mut first = String::new();
    BufReader::new(c.stdout.as_mut().unwrap())
        .read_line(&mut first)
        .unwrap();
    c
}

/// memcached on loopback, pinned with `pin`, started inside `cgroup` (v2)
/// if given (its listening socket, and so every socket it accepts, belongs
/// there).
fn start_memcached(port: u16, pin: Option<Pin>, cgroup: Option<&Path>) -> KillOnDrop {
    let threads = if pin.is_some() { 1 } else { 2 };
    let mut argv: Vec<String> = vec![];
    if let Some(p) = pin {
        argv.extend(["taskset".into(), "-c".into(), p.server.to_string()]);
    }
    argv.extend(qosd_scenarios::servers::memcached_argv(port, threads, 64));
    let mut cmd = match cgroup {
        // The shell joins the group, then becomes memcached.
        Some(dir) => {
            let mut c = Command::new("sh");
            c.arg("-c")
                .arg("echo $$ > \"$0/cgroup.procs\" && exec \"$@\"")
                .arg(dir)
                .args(&argv);
            c
        }
        None => {
            let mut c = Command::new(&argv[0]);
            c.args(&argv[1..]);
            c
        }
    };
    let mc = KillOnDrop(cmd.spawn().expect("memcached"));
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        std::thread::sleep(Duration::from_millis(20));
    }
    mc
}

/// A cgroup (v2) of this bench's own, removed on drop (once empty).
struct Group(PathBuf);

impl Group {
    /// A new group under the cgroup2 mount (None: no cgroup2 here).
    fn new() -> Option<Group> {
        let mounts = std::fs::read_to_string("/proc/mounts").ok()?;
        let root = mounts
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .find(|f| f.get(2) == Some(&"cgroup2"))?[1]
            .to_string();
        let dir = Path::new(&root).join(format!("qosd-test-req25f-floor-{}", std::process::id()));
        std::fs::create_dir(&dir).ok()?;
        Some(Group(dir))
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// The hooks of a floor side; `cgroup`: memcached's.
pub fn floor_hooks(side: Side, cgroup: Option<&Path>) -> FloorHooks<'_> {
    match (side, cgroup) {
        (Side::CgroupFloor, Some(dir)) => FloorHooks::Cgroup(dir),
        _ => FloorHooks::Tracepoints,
    }
}

/// What the bench measures beside the untraced server.
pub struct Setup<'f, 'o> {
    qosd: String,
    load: Load,
    floor: Option<&'f mut Floor<'o>>,
    /// memcached's own cgroup (v2), for the scoped floor.
    cgroup: Option<PathBuf>,
}

impl Setup<'_, '_> {
    /// One run of `side` (the floor attached, or a tracer started, for it
    /// alone); whether the tracer's programs were timed by BPF statistics.
    fn run(&mut self, side: Side) -> (Run, bool) {
        match side {
            Side::Off => (run_load(&self.load, self.load.secs, None), false),
            Side::Floor | Side::CgroupFloor => {
                let hooks = floor_hooks(side, self.cgroup.as_deref());
                let f = self.floor.as_mut().expect("FLOOR loaded the floor");
                f.attach(hooks).expect("attaching the floor");
                let r = run_load(&self.load, self.load.secs, None);
                f.detach();
                (r, false)
            }
            Side::Traced => {
                let mut t = start_trace(&self.qosd, self.load.server);
                let r = run_load(&self.load, self.load.secs, Some(t.id()));
                let timed = bpfstats::timed(&bpfstats::held_by(t.id()));
                let _ = t.kill();
                let _ = t.wait();
                (r, timed)
            }
        }
    }
}

/// The median of v (NaN: empty).
pub fn med(v: &[f64]) -> f64 {
    qosd_core::measure::median(v.to_vec()).unwrap_or(f64::NAN)
}

fn env_flag(name: &str, default: bool) -> bool {
    std::env::var(name).map_or(default, |v| v == "1")
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let rounds: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(5);
    let secs: f64 = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(4.0);
    let conns: usize = args.get(3).and_then(|a| a.parse().ok()).unwrap_or(8);
    let pin = pin_from_env();
    let port = qosd_scenarios::servers::free_port().expect("a free loopback port");
    // FLOOR: 1 (the tracepoints' floor), cgroup (the scoped one) or both.
    let floor_env = std::env::var("FLOOR").unwrap_or_default();
    let floors: Vec<Side> = match floor_env.as_str() {
        "1" => vec![Side::Floor],
        "cgroup" => vec![Side::CgroupFloor],
        "both" => vec![Side::Floor, Side::CgroupFloor],
        _ => vec![],
    };
    let group = floors
        .contains(&Side::CgroupFloor)
        .then(|| Group::new().expect("FLOOR=cgroup: no cgroup2 mount, or mkdir failed"));
    let mc = start_memcached(port, pin, group.as_ref().map(|g| g.0.as_path()));
    if let Some(p) = pin {
        // The main thread (this bench's bookkeeping) stays off the server's CPU.
        pin_thread(p.client);
    }
    let mut storage = MaybeUninit::uninit();
    let mut floor = (!floors.is_empty())
        .then(|| Floor::load(&mut storage).expect("loading the floor programs"));
    let mut setup = Setup {
        qosd: std::env::var("QOSD").unwrap_or_else(|_| "target/release/qosd".into()),
        load: Load {
            port,
            conns,
            secs,
            server: mc.0.id(),
            pin,
        },
        floor: floor.as_mut(),
        cgroup: group.as_ref().map(|g| g.0.clone()),
    };
    let found_on = cost::stats_off();
    run_load(&setup.load, 1.0, None); // warm-up
    let mut sides = vec![Side::Traced];
    if env_flag("AA", true) {
        sides.push(Side::Off);
    }
    sides.extend(&floors);
    let mut r = Rounds::new(&sides);
    for round in 0..rounds {
        for &side in &sides {
            // Alternate which goes first so drift hits both sides alike.
            let order = if round % 2 == 0 {
                [Side::Off, side]
            } else {
                [side, Side::Off]
            };
            let mut res = order.map(|s| setup.run(s));
            if round % 2 == 1 {
                res.swap(0, 1);
            }
            let [(a, _), (b, timed)] = res;
            r.push(round, side, &a, &b, timed);
        }
    }
    let stats_runs: usize = std::env::var("BPF_STATS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let dispatch = dispatch::all(&mut setup, &floors, pin.map(|p| p.client));
    let stats = (stats_runs > 0).then(|| cost::bpf_stats(&mut setup, &floors, stats_runs));
    drop(mc);
    drop(group);
    if rounds > 0 {
        r.print_table(rounds, secs, conns, pin.map(|p| (p.server, p.client)));
        println!("{}\n", cost::stats_note(found_on, r.timed_rounds));
    }
    for d in dispatch {
        match d {
            Ok(text) => println!("{text}"),
            Err(e) => println!("Dispatch not measured: {e}\n"),
        }
    }
    match stats {
        Some(Ok(text)) => println!("{text}"),
        Some(Err(e)) => println!("BPF run-time statistics not measured: {e}\n"),
        None => {}
    }
}
