//! The one support module of the manager's integration tests (each test
//! file has `mod support;` and `use support::*;`): the `qosd` binary and
//! the repo, free loopback ports, polling, children killed on drop, real
//! servers from Debian's packages (nginx, memcached) started on loopback,
//! and readers of a process's CPUs and cgroups. Submodules: `clients`
//! (bounded loads that time every request), `daemon` (`qosd run` as a
//! child, its API, Prometheus), `dashboard` (a Grafana dashboard's
//! panels and their PromQL), `trace` (`qosd trace` as a child), `fake`
//! (fake /sys and /proc trees, shared with the actuators' tests),
//! `deploy` (`make install`, the systemd unit), `grpc` (gRPC fixtures),
//! `hostile` (misbehaving raw-socket clients of the daemon's API),
//! `loaded` (the fixture near its capacity, traced),
//! `netns` (network namespaces and `qosd net` for the net tests),
//! `pipelined` (redis, a pre-fork server, nginx over TLS, pipelining
//! clients),
//! `replay` (calibration, scenarios and timelines of the replay tests).
#![allow(dead_code, unused_imports)]

pub mod clients;
pub mod daemon;
pub mod dashboard;
pub mod deploy;
#[path = "../../../actuators/tests/common/mod.rs"]
pub mod fake;
pub mod grpc;
pub mod hostile;
pub mod kube;
pub mod loaded;
pub mod netns;
pub mod pipelined;
pub mod replay;
pub mod trace;

/// How long to wait for qosd to come up (load and attach its BPF programs,
/// open its API): `base`, or four times it in the kernel matrix's guests
/// (`QOSD_KERNEL_MATRIX`), which run under software emulation on some hosts
/// (docs/kernels.md) where the verifier alone can take most of 20 s. A wait
/// for readiness, not a bound on speed.
pub fn patience(base: std::time::Duration) -> std::time::Duration {
    if std::env::var_os("QOSD_KERNEL_MATRIX").is_some() {
        base * 4
    } else {
        base
    }
}

pub use clients::*;
pub use daemon::*;
pub use deploy::*;
pub use fake::*;
pub use pipelined::*;
pub use trace::*;

use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub const QOSD: &str = env!("CARGO_BIN_EXE_qosd");

/// The repository's root (the workspace).
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("repo root")
        .to_owned()
}

/// `qosd ARGS...` run to completion (in the test's working directory, the
/// manager crate).
pub fn qosd<S: AsRef<OsStr>>(args: &[S]) -> Output {
    Command::new(QOSD)
        .args(args)
        .output()
        .expect("running qosd")
}

/// `qosd ARGS...` run from the repo root (for the shipped relative paths
/// such as `scenarios/ramp.yaml`).
pub fn qosd_in_repo<S: AsRef<OsStr>>(args: &[S]) -> Output {
    Command::new(QOSD)
        .current_dir(repo())
        .args(args)
        .output()
        .expect("running qosd")
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

pub fn free_port() -> u16 {
    qosd_scenarios::servers::free_port().expect("a free loopback port")
}

/// Polls `f` every 50 ms for at most `limit`.
pub fn wait_for(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    f()
}

/// A child process killed (and reaped) on drop.
pub struct Killed(pub Child);

impl Killed {
    pub fn spawn(cmd: &mut Command) -> Killed {
        Killed(
            cmd.spawn()
                .unwrap_or_else(|e| panic!("starting {cmd:?}: {e}")),
        )
    }

    /// `sleep SECS`: a process for configs to match.
    pub fn sleeper(secs: u32) -> Killed {
        Killed::spawn(Command::new("sleep").arg(secs.to_string()))
    }

    /// A shell spinning on a CPU.
    pub fn busy() -> Killed {
        Killed::spawn(
            Command::new("sh")
                .args(["-c", "while :; do :; done"])
                .stdout(Stdio::null()),
        )
    }

    pub fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A server on loopback, killed (and reaped) on drop.
pub struct Server {
    pub child: Child,
    pub port: u16,
    _dir: Option<tempfile::TempDir>,
}

impl Server {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // A server started in a process group of its own (nginx_master)
        // goes with all its processes: its workers outlive a killed master.
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        if nix::unistd::getpgid(Some(pid)) == Ok(pid) {
            let _ = nix::sys::signal::killpg(pid, nix::sys::signal::Signal::SIGKILL);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits (10 s at most) until `port` accepts connections; panics if the
/// child exits first.
pub fn wait_listening(port: u16, child: &mut Child, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        if let Ok(Some(st)) = child.try_wait() {
            panic!("{what} exited at start: {st}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("{what} did not listen on 127.0.0.1:{port} within 10 s");
}

/// nginx (Debian's nginx-light) as one process (no master), serving a fixed
/// body on 127.0.0.1.
pub fn nginx() -> Server {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let d = dir.path().display();
    let conf = format!(
        "daemon off; master_process off; worker_processes 1;\n\
         error_log {d}/error.log; pid {d}/nginx.pid;\n\
         events {{ worker_connections 4096; }}\n\
         http {{ access_log off; keepalive_requests 1000000;\n\
           client_body_temp_path {d}; proxy_temp_path {d}; fastcgi_temp_path {d};\n\
           uwsgi_temp_path {d}; scgi_temp_path {d};\n\
           server {{ listen 127.0.0.1:{port}; location / {{ return 200 \"hello from nginx\\n\"; }} }} }}\n"
    );
    let path = dir.path().join("nginx.conf");
    std::fs::write(&path, conf).unwrap();
    let mut child = Command::new("nginx")
        .arg("-c")
        .arg(&path)
        .arg("-p")
        .arg(dir.path())
        .stdin(Stdio::null())
        .spawn()
        .expect("starting nginx (apt-get install nginx-light)");
    wait_listening(port, &mut child, "nginx");
    Server {
        child,
        port,
        _dir: Some(dir),
    }
}

/// nginx as a master with `workers` worker processes (what a distribution
/// runs), serving `/` from a file of `file_bytes` bytes, with `sendfile`
/// on or off. The master accepts nothing: its workers do.
pub fn nginx_master(workers: u32, file_bytes: usize, sendfile: bool) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let d = dir.path().display();
    std::fs::create_dir_all(dir.path().join("www")).unwrap();
    std::fs::write(dir.path().join("www/index.html"), vec![b'x'; file_bytes]).unwrap();
    let sf = if sendfile { "on" } else { "off" };
    let conf = format!(
        "daemon off; master_process on; worker_processes {workers};\n\
         error_log {d}/error.log; pid {d}/nginx.pid;\n\
         events {{ worker_connections 4096; }}\n\
         http {{ access_log off; keepalive_requests 1000000; sendfile {sf};\n\
           client_body_temp_path {d}; proxy_temp_path {d}; fastcgi_temp_path {d};\n\
           uwsgi_temp_path {d}; scgi_temp_path {d};\n\
           server {{ listen 127.0.0.1:{port}; root {d}/www; }} }}\n"
    );
    let path = dir.path().join("nginx.conf");
    std::fs::write(&path, conf).unwrap();
    let mut child = Command::new("nginx")
        .arg("-c")
        .arg(&path)
        .arg("-p")
        .arg(dir.path())
        .stdin(Stdio::null())
        // Its own process group, so that Server's drop takes the workers.
        .process_group(0)
        .spawn()
        .expect("starting nginx (apt-get install nginx-light)");
    wait_listening(port, &mut child, "nginx");
    Server {
        child,
        port,
        _dir: Some(dir),
    }
}

/// The child processes of `pid` (from /proc/*/stat).
pub fn children_of(pid: u32) -> Vec<u32> {
    let mut v: Vec<u32> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/stat"))
                .ok()
                .and_then(|s| {
                    let (_, r) = s.rsplit_once(')')?;
                    r.split_whitespace().nth(1)?.parse::<u32>().ok()
                })
                == Some(pid)
        })
        .collect();
    v.sort_unstable();
    v
}

/// memcached with `threads` worker threads on 127.0.0.1.
pub fn memcached(threads: u32) -> Server {
    let port = free_port();
    let argv = qosd_scenarios::servers::memcached_argv(port, threads, 64);
    let mut child = Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(Stdio::null())
        .spawn()
        .expect("starting memcached (apt-get install memcached)");
    wait_listening(port, &mut child, "memcached");
    Server {
        child,
        port,
        _dir: None,
    }
}

/// `Cpus_allowed_list` of every thread of `pid`.
pub fn thread_cpus(pid: u32) -> Vec<String> {
    let mut v = Vec::new();
    let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return v;
    };
    for t in rd.flatten() {
        let s = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
        if let Some(l) = s.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")) {
            v.push(l.trim().to_owned());
        }
    }
    v
}

/// Every thread of `pid` with its scheduling policy as /proc shows it
/// (`/proc/PID/task/TID/stat` field 41: 0 other, 3 batch, 5 idle, ...).
pub fn thread_policies(pid: u32) -> Vec<(u32, u32)> {
    let mut v = Vec::new();
    let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return v;
    };
    for t in rd.flatten() {
        let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
        let policy = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(41 - 3))
            .and_then(|f| f.parse().ok());
        if let (Some(tid), Some(p)) = (t.file_name().to_str().and_then(|n| n.parse().ok()), policy)
        {
            v.push((tid, p));
        }
    }
    v.sort_unstable();
    v
}

/// The affinity list of `pid` (its main thread) as /proc shows it.
pub fn cpus_allowed(pid: u32) -> String {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .expect("Cpus_allowed_list")
        .trim()
        .to_owned()
}

/// True once every thread of `pid` may run on exactly `cpus` (a list like "0-1").
pub fn all_threads_on(pid: u32, cpus: &str) -> bool {
    let v = thread_cpus(pid);
    !v.is_empty() && v.iter().all(|c| c == cpus)
}

/// Number of CPUs in a list like "0-1,3".
pub fn count_cpus(list: &str) -> usize {
    list.split(',')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('-') {
            Some((a, b)) => b.parse::<usize>().unwrap() - a.parse::<usize>().unwrap() + 1,
            None => 1,
        })
        .sum()
}

/// The process's cgroup lines (`/proc/PID/cgroup`); empty once it is gone.
pub fn cgroups(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default()
}

/// Nearest-rank percentile of `v`.
pub fn percentile(v: &[f64], p: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let rank = ((p / 100.0) * s.len() as f64).ceil() as usize;
    s[rank.clamp(1, s.len()) - 1]
}

/// A two-CPU cpufreq tree under `root`: acpi-cpufreq style (`setspeed`)
/// or intel_pstate style (only `scaling_max_freq`).
pub fn cpufreq_tree(root: &Path, setspeed: bool) {
    put(root, "/sys/devices/system/cpu/online", "0-1\n");
    for c in 0..2 {
        put(
            root,
            &format!("/sys/devices/system/cpu/cpu{c}/topology/thread_siblings_list"),
            &format!("{c}\n"),
        );
        let d = format!("/sys/devices/system/cpu/cpu{c}/cpufreq");
        put(root, &format!("{d}/cpuinfo_min_freq"), "800000\n");
        put(root, &format!("{d}/cpuinfo_max_freq"), "2400000\n");
        put(root, &format!("{d}/scaling_max_freq"), "2400000\n");
        if setspeed {
            put(
                root,
                &format!("{d}/scaling_available_frequencies"),
                "2400000 2000000 1600000 1200000 800000 \n",
            );
            put(
                root,
                &format!("{d}/scaling_available_governors"),
                "ondemand userspace performance\n",
            );
            put(root, &format!("{d}/scaling_governor"), "ondemand\n");
            put(root, &format!("{d}/scaling_setspeed"), "<unsupported>\n");
        } else {
            put(
                root,
                &format!("{d}/scaling_available_governors"),
                "performance powersave\n",
            );
            put(root, &format!("{d}/scaling_governor"), "powersave\n");
        }
    }
}

/// Starts `qosd set --hold ...` and waits until the change is made. The
/// caller signals and waits for the returned child.
#[allow(clippy::zombie_processes)]
pub fn hold(args: &[&str]) -> (Child, BufReader<std::process::ChildStdout>) {
    let mut child = Command::new(QOSD)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    loop {
        line.clear();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "qosd exited before holding"
        );
        if line.starts_with("holding") {
            return (child, out);
        }
    }
}

pub fn kill(child: &Child, sig: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), sig).unwrap();
}

/// Where the cpu controller is: the v1 `cpu` hierarchy (this machine kind),
/// else the cgroup2 mount that lists `cpu` in cgroup.controllers (a unified
/// layout: the kernel matrix's guests), with `true` for cgroup2. `None`:
/// neither.
pub fn cpu_mount() -> Option<(String, bool)> {
    if Path::new("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").exists() {
        return Some(("/sys/fs/cgroup/cpu".into(), false));
    }
    ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
        .into_iter()
        .find(|m| {
            std::fs::read_to_string(format!("{m}/cgroup.controllers"))
                .is_ok_and(|s| s.split_whitespace().any(|c| c == "cpu"))
        })
        .map(|m| (m.to_owned(), true))
}

/// The cgroup `pid` is in where the cpu controller is ([`cpu_mount`]), and
/// that group's `file` (trimmed; empty if it has none).
pub fn cpu_file_of(pid: &str, file: &str) -> (String, String) {
    let (mount, v2) = cpu_mount().expect("a cpu controller");
    let path = cgroups(pid.parse().unwrap())
        .lines()
        .find_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, c, p) = (f.next()?, f.next()?, f.next()?);
            let cpu = if v2 {
                c.is_empty()
            } else {
                c.split(',').any(|x| x == "cpu")
            };
            cpu.then(|| p.to_owned())
        })
        .expect("in the cpu hierarchy");
    let v = std::fs::read_to_string(format!("{mount}{path}/{file}")).unwrap_or_default();
    (path, v.trim().to_owned())
}
