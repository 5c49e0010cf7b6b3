//! Power sensor against the real kernel (needs root: loads BPF). Run alone
//! with `cargo test -p qosd-sensors --test power_root`.
//!
//! Busy processes are forked children pinned to a CPU with a known duty
//! cycle; each gets its own autogroup and nice -20 so that other load on
//! the machine cannot take their CPU away. The high duty is 90%, not 100%:
//! a plain busy loop gets less than all of its CPU whenever anything else
//! runs there, whatever its priority, while a process that regulates its
//! own CPU time to 90% of each period gets exactly that under moderate load. RAPL is a fake powercap tree in a
//! temp dir (this machine has none), read by the very same code.
//!
//! Host steal: the program times slices on the rq clock, which runs on
//! while the hypervisor has taken the vCPU away (steal); the children's
//! duty cycles and `schedstat` count CPU time without it
//! (CONFIG_PARAVIRT_TIME_ACCOUNTING). A child on a CPU that lost a share
//! `s` of the interval to steal is seen on the CPU up to `s` longer, so the
//! bounds below widen by the steal the kernel counted on that CPU meanwhile
//! (`/proc/stat`, [`Steal`]). Seen on a CI machine: B at 0.288 of the time
//! for a duty of 0.25 (about 13 % steal), where this one has ~0.3 %.

use std::fs;
use std::path::Path;
use std::time::Duration;

use qosd_core::PowerSource;
use qosd_sensors::power::{PowerConfig, PowerSample, PowerSensor, SourceChoice};

/// Tests that pin busy children to CPUs take turns: two at once would
/// share those CPUs and halve each other's duty cycle.
static PINNED: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn pinned() -> std::sync::MutexGuard<'static, ()> {
    PINNED.lock().unwrap_or_else(|e| e.into_inner())
}

/// Forked busy-loop children, killed when dropped (also on panic).
struct Children(Vec<libc::pid_t>);

impl Drop for Children {
    fn drop(&mut self) {
        for &pid in &self.0 {
            // SAFETY: plain syscalls on our own children.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, std::ptr::null_mut(), 0);
            }
        }
    }
}

/// Every CPU's steal time so far, seconds (`/proc/stat`'s per-CPU
/// lines, 8th field, in USER_HZ ticks).
struct Steal(Vec<f64>);

impl Steal {
    fn now() -> Steal {
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        let stat = fs::read_to_string("/proc/stat").unwrap();
        Steal(
            stat.lines()
                .filter(|l| l.starts_with("cpu") && !l.starts_with("cpu "))
                .map(|l| {
                    let steal = l.split_whitespace().nth(8).unwrap_or("0");
                    steal.parse::<f64>().unwrap() / hz
                })
                .collect(),
        )
    }

    /// The share of `interval_s` that `cpu` lost to steal since `self`,
    /// plus one tick for the counter's resolution.
    fn share_since(&self, cpu: usize, interval_s: f64) -> f64 {
        // SAFETY: as above.
        let tick = 1.0 / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        (Steal::now().0[cpu] - self.0[cpu] + tick) / interval_s
    }
}

fn now(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: fills `ts`.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Forks a process pinned to `cpu` that is busy `duty` of every 10 ms
/// period (by its own CPU time, so waiting for the CPU does not count as
/// work), for at most 60 s.
fn spawn_duty(cpu: usize, duty: f64) -> libc::pid_t {
    spawn_duty_at(cpu, duty, now(libc::CLOCK_MONOTONIC), 0)
}

/// As [`spawn_duty`], with periods starting at `epoch` (CLOCK_MONOTONIC ns)
/// and the busy part of each starting `offset_ns` into it.
fn spawn_duty_at(cpu: usize, duty: f64, epoch: u64, offset_ns: u64) -> libc::pid_t {
    const PERIOD_NS: u64 = 10_000_000;
    // Prepared before fork: the child only makes syscalls.
    let autogroup = c"/proc/self/autogroup";
    let nice = b"-20";
    // SAFETY: the child runs only async-signal-safe syscalls and _exit, so
    // forking a multi-threaded test process is sound.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid > 0 {
        return pid;
    }
    let sleep_until = |t: u64| {
        let ts = libc::timespec {
            tv_sec: (t / 1_000_000_000) as libc::time_t,
            tv_nsec: (t % 1_000_000_000) as libc::c_long,
        };
        // SAFETY: `ts` is valid; no remainder is asked for.
        unsafe {
            libc::clock_nanosleep(
                libc::CLOCK_MONOTONIC,
                libc::TIMER_ABSTIME,
                &ts,
                std::ptr::null_mut(),
            )
        };
    };
    // SAFETY: syscalls on the child itself, on valid local buffers.
    unsafe {
        libc::setsid(); // a new autogroup ...
        let fd = libc::open(autogroup.as_ptr(), libc::O_WRONLY);
        if fd >= 0 {
            libc::write(fd, nice.as_ptr().cast(), nice.len()); // ... of weight nice -20
            libc::close(fd);
        }
        libc::setpriority(libc::PRIO_PROCESS, 0, -20);
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
    let end = epoch + 60_000_000_000;
    let busy_ns = (duty * PERIOD_NS as f64) as u64;
    let mut t0 = epoch;
    while t0 < end {
        sleep_until(t0 + offset_ns);
        let c0 = now(libc::CLOCK_THREAD_CPUTIME_ID);
        let next = t0 + PERIOD_NS;
        while now(libc::CLOCK_THREAD_CPUTIME_ID) - c0 < busy_ns && now(libc::CLOCK_MONOTONIC) < next
        {
        }
        sleep_until(next);
        t0 = next;
    }
    // SAFETY: ends the child without running the parent's destructors.
    unsafe { libc::_exit(0) }
}

/// The kernel's own CPU time of a process (schedstat sum_exec_runtime), ns.
fn schedstat_ns(pid: libc::pid_t) -> u64 {
    let s = fs::read_to_string(format!("/proc/{pid}/schedstat")).unwrap();
    s.split_whitespace().next().unwrap().parse().unwrap()
}

/// A fake root with this machine's CPU topology, for the RAPL files.
fn fake_root_with_real_cpus() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    let src = Path::new("/sys/devices/system/cpu");
    let dst = d.path().join("sys/devices/system/cpu");
    fs::create_dir_all(&dst).unwrap();
    fs::copy(src.join("possible"), dst.join("possible")).unwrap();
    for e in fs::read_dir(src).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let topo = e.path().join("topology");
        if !name.starts_with("cpu") || !topo.is_dir() {
            continue;
        }
        let t = dst.join(&name).join("topology");
        fs::create_dir_all(&t).unwrap();
        for f in ["physical_package_id", "thread_siblings_list"] {
            fs::copy(topo.join(f), t.join(f)).unwrap();
        }
    }
    d
}

fn zone(root: &Path, rel: &str, name: &str, range: u64) {
    let z = root.join("sys/class/powercap").join(rel);
    fs::create_dir_all(&z).unwrap();
    fs::write(z.join("name"), format!("{name}\n")).unwrap();
    fs::write(z.join("max_energy_range_uj"), format!("{range}\n")).unwrap();
}

fn set_uj(root: &Path, rel: &str, uj: u64) {
    let z = root.join("sys/class/powercap").join(rel);
    fs::write(z.join("energy_uj"), format!("{uj}\n")).unwrap();
}

fn cpu_fraction(s: &PowerSample, pid: libc::pid_t) -> f64 {
    s.process(pid as u32).map_or(0.0, |p| p.cpus_used)
}

fn nr_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

#[test]
fn root_power_duty_cycles_match_on_cpu_shares() {
    assert!(nr_cpus() >= 2, "this test pins to CPUs 0 and 1");
    let _turn = pinned();
    let kids = Children(vec![spawn_duty(0, 0.9), spawn_duty(1, 0.25)]);
    let (a, b) = (kids.0[0], kids.0[1]);
    let mut sensor =
        PowerSensor::open(&PowerConfig::default(), Path::new("/")).expect("open (root)");
    std::thread::sleep(Duration::from_millis(300)); // children settle
                                                    // The kernel's figures at the time of a sample: the mean of a read just
                                                    // before and one just after it (a sample can take milliseconds).
    let around = |sensor: &mut PowerSensor| {
        let before = (schedstat_ns(a), schedstat_ns(b));
        let s = sensor.sample().unwrap();
        let after = (schedstat_ns(a), schedstat_ns(b));
        (s, ((before.0 + after.0) / 2, (before.1 + after.1) / 2))
    };
    let (_, k0) = around(&mut sensor);
    let steal = Steal::now();
    std::thread::sleep(Duration::from_secs(2));
    let (s, k1) = around(&mut sensor);
    eprintln!("{:?}", s.counters);
    let dt = s.interval_s * 1e9;
    let (fa, fb) = (cpu_fraction(&s, a), cpu_fraction(&s, b));
    let (ka, kb) = ((k1.0 - k0.0) as f64 / dt, (k1.1 - k0.1) as f64 / dt);
    let (sa, sb) = (
        steal.share_since(0, s.interval_s),
        steal.share_since(1, s.interval_s),
    );
    eprintln!(
        "interval {:.3}s  A: bpf {fa:.4} kernel {ka:.4} steal {sa:.3}  \
         B: bpf {fb:.4} kernel {kb:.4} steal {sb:.3}",
        s.interval_s
    );
    // Against the kernel's own accounting of the same processes (the
    // program's slices include what the host stole meanwhile).
    assert!(
        (fa - ka).abs() < 0.01 + sa,
        "A: bpf {fa} vs schedstat {ka}, steal {sa}"
    );
    assert!(
        (fb - kb).abs() < 0.01 + sb,
        "B: bpf {fb} vs schedstat {kb}, steal {sb}"
    );
    // Against the duty cycles they were given.
    assert!(
        (fa - 0.9).abs() < 0.03 + sa,
        "A ran {fa} of the time, duty 90%, steal {sa}"
    );
    assert!(
        (fb - 0.25).abs() < 0.03 + sb,
        "B ran {fb} of the time, duty 25%, steal {sb}"
    );
    // No SMT here: the weighted shares are the on-CPU times.
    let (pa, pb) = (s.process(a as u32).unwrap(), s.process(b as u32).unwrap());
    assert!((pb.power_w / pa.power_w - fb / fa).abs() < 0.01);
    assert!(s.counters.switches > 0);
}

#[test]
fn root_power_exited_thread_leaves_the_maps() {
    let mut sensor =
        PowerSensor::open(&PowerConfig::default(), Path::new("/")).expect("open (root)");
    let (tx, rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let h = std::thread::spawn(move || {
        // SAFETY: gettid has no preconditions.
        tx.send(unsafe { libc::gettid() } as u32).unwrap();
        // Run, sleep (a switch out: the entry is made), and wait to exit.
        let t = std::time::Instant::now();
        while t.elapsed() < Duration::from_millis(30) {}
        go_rx.recv().unwrap();
    });
    let tid = rx.recv().unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let s = sensor.sample().unwrap();
    assert!(
        sensor.tracks_thread(tid),
        "running thread {tid} is in the map"
    );
    assert!(s
        .threads
        .iter()
        .any(|t| t.tid == tid && !t.exited && t.on_cpu_ns > 0));
    go_tx.send(()).unwrap();
    h.join().unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let s = sensor.sample().unwrap();
    assert!(
        s.threads.iter().any(|t| t.tid == tid && t.exited),
        "the last interval reports the thread as exited"
    );
    assert!(
        !sensor.tracks_thread(tid),
        "exited thread {tid} left the map"
    );
    let s = sensor.sample().unwrap();
    assert!(s.threads.iter().all(|t| t.tid != tid));
}

#[test]
fn root_power_fake_rapl_is_exact_and_split_by_sched_shares() {
    assert!(nr_cpus() >= 2);
    let _turn = pinned();
    let root = fake_root_with_real_cpus();
    let r = root.path();
    let range = 65_532_610_987u64;
    zone(r, "intel-rapl:0", "package-0", range);
    zone(r, "intel-rapl:0/intel-rapl:0:0", "core", range);
    set_uj(r, "intel-rapl:0", range - 3_000_000); // 3 J below the wrap
    set_uj(r, "intel-rapl:0/intel-rapl:0:0", 1_000_000);
    let kids = Children(vec![spawn_duty(0, 0.9), spawn_duty(1, 0.25)]);
    let (a, b) = (kids.0[0], kids.0[1]);
    let cfg = PowerConfig {
        source: SourceChoice::Powercap,
        ..PowerConfig::default()
    };
    let mut sensor = PowerSensor::open(&cfg, r).expect("open (root)");
    assert_eq!(sensor.caps().source, PowerSource::Rapl);
    assert_eq!(sensor.caps().domains, vec!["package-0", "package-0/core"]);
    std::thread::sleep(Duration::from_millis(300));
    sensor.sample().unwrap();
    let steal = Steal::now();
    // 45 J on the package through the wrap, 30 J on the cores.
    std::thread::sleep(Duration::from_millis(1500));
    set_uj(r, "intel-rapl:0", 42_000_000);
    set_uj(r, "intel-rapl:0/intel-rapl:0:0", 31_000_000);
    let s = sensor.sample().unwrap();
    let close = |x: f64, y: f64| (x - y).abs() <= 1e-9 * y.abs().max(1.0);
    assert!(!s.energy_is_estimate);
    assert!(close(s.node.total_w * s.interval_s, 45.0), "{:?}", s.node);
    assert!(close(s.node.active_w * s.interval_s, 30.0), "{:?}", s.node);
    assert!(close(s.node.idle_w * s.interval_s, 15.0));
    let sum: f64 = s.threads.iter().map(|t| t.power_w).sum();
    assert!(
        close(sum, s.node.active_w),
        "Σ threads {sum} vs active {}",
        s.node.active_w
    );
    // Each thread's power is the active power times its weighted share.
    let total_weight: f64 = s.threads.iter().map(|t| t.weighted).sum();
    for t in &s.threads {
        assert!(close(
            t.power_w,
            s.node.active_w * t.weighted / total_weight
        ));
    }
    let (pa, pb) = (s.process(a as u32).unwrap(), s.process(b as u32).unwrap());
    eprintln!(
        "A {:.3} W ({:.3} CPU)  B {:.3} W ({:.3} CPU)",
        pa.power_w, pa.cpus_used, pb.power_w, pb.cpus_used
    );
    // Steal on either CPU moves the ratio by up to about its share.
    let stolen = steal.share_since(0, s.interval_s) + steal.share_since(1, s.interval_s);
    let ratio = pb.power_w / pa.power_w;
    assert!(
        (ratio - 0.25 / 0.9).abs() < 0.04 + stolen,
        "B/A = {ratio}, duty ratio 0.278, steal {stolen}"
    );
    let app = s.app(&[a as u32], Some(1000.0));
    assert!(close(
        app.energy_per_request_j.unwrap(),
        pa.power_w / 1000.0
    ));
    assert!(!app.energy_is_estimate);
}

#[test]
fn root_power_without_rapl_the_model_is_flagged() {
    let root = fake_root_with_real_cpus(); // no powercap, no perf power PMU
    let mut sensor = PowerSensor::open(&PowerConfig::default(), root.path()).expect("open (root)");
    let caps = sensor.caps().clone();
    assert_eq!(caps.source, PowerSource::Model);
    assert_eq!(caps.backend, "model");
    assert!(
        caps.notes.iter().any(|n| n.contains("ESTIMATE")),
        "{:?}",
        caps.notes
    );
    let _turn = pinned();
    let kids = Children(vec![spawn_duty(0, 0.5)]);
    std::thread::sleep(Duration::from_millis(500));
    let s = sensor.sample().unwrap();
    assert!(s.energy_is_estimate);
    assert_eq!(s.source, PowerSource::Model);
    let app = s.app(&[kids.0[0] as u32], Some(10.0));
    assert!(app.energy_is_estimate && app.source == PowerSource::Model);
    // base + idle per CPU + dynamic × busy fraction (no cpufreq: f = f_max).
    let m = PowerConfig::default().model;
    let busy: f64 = s.sockets.iter().map(|x| x.busy_fraction).sum::<f64>() * caps.nr_cpus as f64
        / s.sockets.len() as f64;
    let want = m.base_w + m.idle_w_per_cpu * caps.nr_cpus as f64 + m.dynamic_w_per_cpu * busy;
    assert!(
        (s.node.total_w - want).abs() < 1e-6,
        "{} vs {want}",
        s.node.total_w
    );
    let json = serde_json::to_value(&s).unwrap();
    assert_eq!(json["energy_is_estimate"], true);
    assert_eq!(json["source"], "model");
}

/// The fake topology declares CPUs 0 and 1 hyperthreads of one core, so the
/// real program splits each thread's time by whether the other CPU was busy.
/// A is busy the first 9 ms of every 10 ms on CPU 0; B the 2.5 ms from
/// 2 ms into the same periods on CPU 1, so all of B's time is beside A:
/// B must see its sibling busy all the time, and A must see at least B's
/// time as overlap (plus whatever else ran on CPU 1). Eq. (1) must weigh
/// the overlap HT_r / 2.
#[test]
fn root_power_sibling_overlap_is_measured_by_the_program() {
    assert!(nr_cpus() >= 2);
    let _turn = pinned();
    let root = fake_root_with_real_cpus();
    for cpu in [0, 1] {
        let t = root
            .path()
            .join(format!("sys/devices/system/cpu/cpu{cpu}/topology"));
        fs::write(t.join("thread_siblings_list"), "0-1\n").unwrap();
        fs::write(t.join("physical_package_id"), "0\n").unwrap();
    }
    let epoch = now(libc::CLOCK_MONOTONIC) + 20_000_000;
    let kids = Children(vec![
        spawn_duty_at(0, 0.9, epoch, 0),
        spawn_duty_at(1, 0.25, epoch, 2_000_000),
    ]);
    let (a, b) = (kids.0[0], kids.0[1]);
    let cfg = PowerConfig {
        ht_ratio: 1.2,
        ..PowerConfig::default()
    };
    let mut sensor = PowerSensor::open(&cfg, root.path()).expect("open (root)");
    assert!(sensor.caps().smt);
    std::thread::sleep(Duration::from_millis(300));
    sensor.sample().unwrap();
    let steal = Steal::now();
    std::thread::sleep(Duration::from_secs(2));
    let s = sensor.sample().unwrap();
    let sb = steal.share_since(1, s.interval_s);
    let thread_of = |pid: libc::pid_t| s.threads.iter().find(|t| t.tid == pid as u32).unwrap();
    let (ta, tb) = (thread_of(a), thread_of(b));
    let fb = tb.sib_busy_ns as f64 / tb.on_cpu_ns as f64;
    let a_over_b = ta.sib_busy_ns as f64 / tb.on_cpu_ns as f64;
    eprintln!(
        "A on {} ns, sibling busy {} ns; B on {} ns, sibling busy {fb:.3} of it",
        ta.on_cpu_ns, ta.sib_busy_ns, tb.on_cpu_ns
    );
    assert!(
        (tb.cpu_fraction - 0.25).abs() < 0.03 + sb,
        "B ran {}, steal {sb}",
        tb.cpu_fraction
    );
    assert!(fb > 0.95, "B ran beside A all the time, measured {fb}");
    assert!(a_over_b > 0.95, "A's overlap {a_over_b} of B's time");
    assert!(ta.sib_busy_ns <= ta.on_cpu_ns);
    // eq. (1) on what the program measured.
    for t in [ta, tb] {
        let want = (t.on_cpu_ns - t.sib_busy_ns) as f64 + 0.6 * t.sib_busy_ns as f64;
        assert!(
            (t.weighted - want).abs() < 1e-6 * want,
            "{} vs {want}",
            t.weighted
        );
    }
}
