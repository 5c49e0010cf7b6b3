//! `qosd net` in network namespaces each test makes (`qosd-test-net26-*`,
//! a veth pair between two of them, static neighbours so no ARP frame is
//! in the way): a UDP stream of N packets of S bytes counts exactly N
//! packets and N × (S + 42) bytes (Ethernet 14 + IPv4 20 + UDP 8) for the
//! peer (and S + 62 over IPv6), and an app's listening port counts exactly what it received; a
//! burst of K packets inside one millisecond bin is one bin of K; LRU
//! evictions are counted; the TC programs are removed after SIGTERM and
//! after SIGKILL + `qosd restore`, a clsact qdisc that was there
//! before stays, and so does one qosd made that another tool's filter
//! joined. Needs root.

use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV4, SocketAddrV6, UdpSocket};
use std::os::fd::AsFd;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const QOSD: &str = env!("CARGO_BIN_EXE_qosd");
/// Ethernet + IPv4 + UDP headers of one packet.
const HEADERS: u64 = 14 + 20 + 8;

fn sh(args: &[&str]) -> String {
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap();
    assert!(
        out.status.success(),
        "{}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Two namespaces `a` and `b` joined by veths `va`/`vb`, 10.226.<net>.1
/// and .2, each side's neighbour entry static.
struct Pair {
    a: String,
    b: String,
    va: String,
    net: u8,
}

impl Pair {
    fn new(tag: &str, net: u8) -> Pair {
        let id = std::process::id() % 10000;
        let p = Pair {
            a: format!("qosd-test-net26-{tag}{id}-a"),
            b: format!("qosd-test-net26-{tag}{id}-b"),
            va: format!("qn26{tag}{id}a"),
            net,
        };
        let vb = format!("qn26{tag}{id}b");
        let _ = Command::new("ip").args(["netns", "del", &p.a]).output();
        let _ = Command::new("ip").args(["netns", "del", &p.b]).output();
        sh(&["ip", "netns", "add", &p.a]);
        sh(&["ip", "netns", "add", &p.b]);
        sh(&[
            "ip", "link", "add", &p.va, "netns", &p.a, "type", "veth", "peer", "name", &vb,
            "netns", &p.b,
        ]);
        for (ns, dev, me) in [(&p.a, &p.va, 1), (&p.b, &vb, 2)] {
            sh(&[
                "ip",
                "-n",
                ns,
                "addr",
                "add",
                &format!("10.226.{net}.{me}/24"),
                "dev",
                dev,
            ]);
            let v6 = format!("fd26:{net:x}::{me}/64");
            sh(&["ip", "-n", ns, "addr", "add", &v6, "dev", dev, "nodad"]);
            sh(&["ip", "-n", ns, "link", "set", dev, "up"]);
        }
        let mac = |ns: &str, dev: &str| {
            let j: Value =
                serde_json::from_str(&sh(&["ip", "-j", "-n", ns, "link", "show", dev])).unwrap();
            j[0]["address"].as_str().unwrap().to_owned()
        };
        let (mac_a, mac_b) = (mac(&p.a, &p.va), mac(&p.b, &vb));
        for (ns, dev, other, m) in [(&p.a, &p.va, 2, &mac_b), (&p.b, &vb, 1, &mac_a)] {
            for ip in [
                format!("10.226.{net}.{other}"),
                format!("fd26:{net:x}::{other}"),
            ] {
                sh(&[
                    "ip",
                    "-n",
                    ns,
                    "neigh",
                    "replace",
                    &ip,
                    "lladdr",
                    m,
                    "dev",
                    dev,
                    "nud",
                    "permanent",
                ]);
            }
        }
        // Traffic only into our own veth.
        for to in [p.ip(2).to_string(), p.ip6(2).to_string()] {
            let route = sh(&["ip", "-n", &p.a, "route", "get", &to]);
            assert!(route.contains(&format!("dev {}", p.va)), "{route}");
        }
        p
    }

    fn ip(&self, host: u8) -> Ipv4Addr {
        Ipv4Addr::new(10, 226, self.net, host)
    }

    fn ip6(&self, host: u16) -> Ipv6Addr {
        Ipv6Addr::new(0xfd26, u16::from(self.net), 0, 0, 0, 0, 0, host)
    }

    /// Runs `f` in a thread inside namespace `ns`.
    fn within<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> T {
        let file = std::fs::File::open(format!("/run/netns/{ns}")).unwrap();
        std::thread::scope(|s| {
            s.spawn(move || {
                nix::sched::setns(file.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
                f()
            })
            .join()
            .unwrap()
        })
    }

    /// `tc` output of `va`'s qdiscs and filters (both hooks).
    fn tc(&self) -> String {
        let mut s = sh(&[
            "ip", "netns", "exec", &self.a, "tc", "qdisc", "show", "dev", &self.va,
        ]);
        for dir in ["ingress", "egress"] {
            let argv = [
                "ip", "netns", "exec", &self.a, "tc", "filter", "show", "dev", &self.va, dir,
            ];
            s += &sh(&argv);
        }
        s
    }

    /// `qosd net` in namespace `a` on `va`, once it has attached.
    fn qosd(&self, state: &std::path::Path, extra: &[&str]) -> Running {
        let mut c = Command::new("ip")
            .args([
                "netns", "exec", &self.a, QOSD, "net", "--iface", &self.va, "--json",
            ])
            .arg("--state-file")
            .arg(state)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stderr = BufReader::new(c.stderr.take().unwrap());
        let mut seen = String::new();
        // libbpf may say first that the clsact qdisc exists already.
        while !seen.contains("counting on") {
            let mut line = String::new();
            if stderr.read_line(&mut line).unwrap() == 0 {
                panic!("qosd net did not start: {seen}");
            }
            seen += &line;
        }
        let stdout = BufReader::new(c.stdout.take().unwrap());
        Running {
            child: c,
            stdout,
            _stderr: stderr,
        }
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.a]).output();
        let _ = Command::new("ip").args(["netns", "del", &self.b]).output();
    }
}

struct Running {
    child: Child,
    stdout: BufReader<ChildStdout>,
    /// Kept open: qosd reports the restore on stderr at exit.
    _stderr: BufReader<std::process::ChildStderr>,
}

impl Running {
    /// Windows printed until one starting after CLOCK_MONOTONIC second
    /// `after` (so every packet sent before `after` is in), bounded.
    fn windows_past(&mut self, after: u64) -> Vec<Value> {
        let mut out = Vec::new();
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(20) {
            let mut line = String::new();
            if self.stdout.read_line(&mut line).unwrap() == 0 {
                break;
            }
            let w: Value = serde_json::from_str(&line).unwrap();
            let done = w["window"].as_u64().unwrap() > after;
            out.push(w);
            if done {
                return out;
            }
        }
        panic!("no window past {after} within 20 s: {out:?}");
    }

    fn signal(&mut self, sig: nix::sys::signal::Signal) -> std::process::ExitStatus {
        // `ip netns exec` execs qosd: the child's pid is qosd's.
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, sig).unwrap();
        self.child.wait().unwrap()
    }
}

fn mono_s() -> u64 {
    qosd_sensors::net::now_ns() / 1_000_000_000
}

/// Sum of one key's figures over `windows`: peers whose addr/proto/dir
/// match, or ports (`port` set).
fn total(windows: &[Value], list: &str, m: impl Fn(&Value) -> bool) -> (u64, u64) {
    let mut t = (0, 0);
    for w in windows {
        for e in w[list].as_array().unwrap() {
            if m(&e[0]) {
                t.0 += e[1]["packets"].as_u64().unwrap();
                t.1 += e[1]["bytes"].as_u64().unwrap();
            }
        }
    }
    t
}

#[test]
fn udp_stream_and_an_apps_port_count_exactly_and_sigterm_removes_everything() {
    let p = Pair::new("s", 61);
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.json");
    assert!(!p.tc().contains("clsact"));
    let top = ["--top", "100"];
    let mut q = p.qosd(&state, &top);
    assert!(p.tc().contains("net_ingress") && p.tc().contains("net_egress"));
    let (n, s, m, port) = (1000u64, 200usize, 500u64, 7261u16);
    // The app in `a` listens on `port`; `b` sends it m packets.
    let a_addr = SocketAddrV4::new(p.ip(1), port);
    let received = std::thread::scope(|sc| {
        let app = sc.spawn(|| {
            Pair::within(&p.a, || {
                let sock = UdpSocket::bind(a_addr).unwrap();
                sock.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
                let mut buf = [0u8; 2048];
                let mut got = 0u64;
                while got < m && sock.recv(&mut buf).is_ok() {
                    got += 1;
                }
                got
            })
        });
        std::thread::sleep(Duration::from_millis(200));
        Pair::within(&p.b, || {
            let sock = UdpSocket::bind("0.0.0.0:0").unwrap();
            for i in 0..m {
                assert_eq!(sock.send_to(&[7u8; 100], a_addr).unwrap(), 100);
                if i % 50 == 49 {
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
        });
        app.join().unwrap()
    });
    assert_eq!(
        received, m,
        "the app must get every packet for an exact count"
    );
    // `a` sends n packets of s bytes to `b`.
    let to = SocketAddrV4::new(p.ip(2), 9);
    Pair::within(&p.a, || {
        let sock = UdpSocket::bind("0.0.0.0:0").unwrap();
        for i in 0..n {
            assert_eq!(sock.send_to(&vec![1u8; s], to).unwrap(), s);
            if i % 100 == 99 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    });
    // And n6 of them over IPv6: 14 + 40 + 8 bytes of headers each.
    let n6 = 100u64;
    let to6 = SocketAddrV6::new(p.ip6(2), 9, 0, 0);
    Pair::within(&p.a, || {
        let sock = UdpSocket::bind("[::]:0").unwrap();
        for _ in 0..n6 {
            assert_eq!(sock.send_to(&vec![1u8; s], to6).unwrap(), s);
        }
    });
    let windows = q.windows_past(mono_s());
    let status = q.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(status.success(), "{status}");
    let peer = |e: &Value, ip: Ipv4Addr, dir: &str| {
        e["addr"] == ip.to_string() && e["proto"] == 17 && e["dir"] == dir
    };
    let out = total(&windows, "peers", |e| peer(e, p.ip(2), "egress"));
    assert_eq!(out, (n, n * (s as u64 + HEADERS)), "{windows:?}");
    let out6 = total(&windows, "peers", |e| {
        e["addr"] == p.ip6(2).to_string() && e["proto"] == 17 && e["dir"] == "egress"
    });
    assert_eq!(out6, (n6, n6 * (s as u64 + 14 + 40 + 8)), "{windows:?}");
    let inb = total(&windows, "peers", |e| peer(e, p.ip(2), "ingress"));
    assert_eq!(inb, (m, m * (100 + HEADERS)));
    let app = total(&windows, "ports", |e| {
        e["port"] == port && e["proto"] == 17 && e["dir"] == "ingress"
    });
    assert_eq!(app, (m, m * (100 + HEADERS)));
    let tc = p.tc();
    assert!(
        !tc.contains("clsact") && !tc.contains("net_"),
        "left behind: {tc}"
    );
    assert!(!state.exists(), "the state file is removed once restored");
}

#[test]
fn a_burst_inside_one_bin_is_one_bin_of_k() {
    let p = Pair::new("b", 62);
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.json");
    let k = 40u64;
    let over = (k - 1).to_string();
    let mut q = p.qosd(&state, &["--bin-ms", "1", "--over-packets", &over]);
    let to = SocketAddrV4::new(p.ip(2), 9);
    // Deterministic burst: one sender thread pinned to one CPU (the egress
    // hook runs in the sender's context, so one CPU's bins see it all)
    // starts right after a millisecond boundary of the kernel's clock and
    // sends k small packets back to back (~k µs on this machine). A burst
    // that a preemption still splits over two bins shows as a peak < k in
    // its window; each burst has a window of its own and at least one of
    // three must be whole.
    let mut last = 0;
    Pair::within(&p.a, || {
        let mut cpus = nix::sched::CpuSet::new();
        cpus.set(0).unwrap();
        nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &cpus).unwrap();
        let sock = UdpSocket::bind("0.0.0.0:0").unwrap();
        for _ in 0..3 {
            // The start of the next second, then the next ms boundary.
            let next = (qosd_sensors::net::now_ns() / 1_000_000_000 + 1) * 1_000_000_000;
            std::thread::sleep(Duration::from_nanos(
                next.saturating_sub(qosd_sensors::net::now_ns()) + 100_000,
            ));
            let t0 = Instant::now();
            loop {
                let now = qosd_sensors::net::now_ns();
                if now % 1_000_000 < 30_000 || t0.elapsed() > Duration::from_millis(50) {
                    break;
                }
            }
            for _ in 0..k {
                sock.send_to(&[3u8; 32], to).unwrap();
            }
            last = mono_s();
        }
    });
    let windows = q.windows_past(last);
    q.signal(nix::sys::signal::Signal::SIGINT);
    let mut peaks = Vec::new();
    for w in &windows {
        for e in w["peers"].as_array().unwrap() {
            if e[0]["addr"] == p.ip(2).to_string() && e[0]["dir"] == "egress" {
                assert_eq!(e[1]["packets"], k, "one burst per window: {w}");
                let peak = e[1]["peak_packets"].as_u64().unwrap();
                let over = e[1]["bins_over"].as_u64().unwrap();
                assert_eq!(over, u64::from(peak == k), "{w}");
                peaks.push(peak);
            }
        }
    }
    assert_eq!(peaks.len(), 3, "{windows:?}");
    assert!(
        peaks.contains(&k),
        "no burst stayed inside one 1 ms bin: peaks {peaks:?}"
    );
}

#[test]
fn lru_evictions_are_counted_and_sigkill_then_restore_removes_only_qosds_filters() {
    let p = Pair::new("e", 63);
    // A clsact qdisc that was there before qosd: it must stay.
    sh(&[
        "ip", "netns", "exec", &p.a, "tc", "qdisc", "add", "dev", &p.va, "clsact",
    ]);
    let route = format!("10.226.{}.0/24", 163);
    sh(&[
        "ip",
        "-n",
        &p.a,
        "route",
        "add",
        &route,
        "via",
        &p.ip(2).to_string(),
    ]);
    let r = sh(&["ip", "-n", &p.a, "route", "get", "10.226.163.7"]);
    assert!(r.contains(&format!("dev {}", p.va)), "{r}");
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.json");
    let mut q = p.qosd(&state, &["--peers-max", "16"]);
    let peers = 40u8;
    Pair::within(&p.a, || {
        let sock = UdpSocket::bind("0.0.0.0:0").unwrap();
        for h in 1..=peers {
            sock.send_to(&[5u8; 10], (Ipv4Addr::new(10, 226, 163, h), 9))
                .unwrap();
        }
    });
    let windows = q.windows_past(mono_s());
    let last = windows.last().unwrap();
    let inserts = last["counters"]["peer_inserts"].as_u64().unwrap();
    let live = last["live_peers"].as_u64().unwrap();
    let evicted = last["evicted_peers"].as_u64().unwrap();
    assert!(inserts >= u64::from(peers), "{last}");
    assert!(live <= 16, "{last}");
    assert_eq!(evicted, inserts - live, "{last}");
    assert!(evicted >= u64::from(peers) - 16, "{last}");
    // SIGKILL: nothing of qosd runs; the state file knows what to remove.
    q.signal(nix::sys::signal::Signal::SIGKILL);
    assert!(p.tc().contains("net_ingress"));
    let out = Command::new(QOSD)
        .args(["restore", "--state-file"])
        .arg(&state)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tc = p.tc();
    assert!(!tc.contains("net_"), "qosd's filters left behind: {tc}");
    assert!(
        tc.contains("clsact"),
        "the clsact qdisc that was there before is gone: {tc}"
    );
}

/// `tc filter add` of another tool's filter on `va`'s ingress (priority 7,
/// not one of qosd's; `u32`, which this kernel has, unlike `matchall`).
fn add_other_tools_filter(p: &Pair) {
    sh(&[
        "ip", "netns", "exec", &p.a, "tc", "filter", "add", "dev", &p.va, "ingress", "pref", "7",
        "protocol", "all", "u32", "match", "u32", "0", "0",
    ]);
}

#[test]
fn another_tools_filter_on_the_clsact_qosd_made_survives_sigterm_and_sigkill_restore() {
    use nix::sys::signal::Signal;
    let p = Pair::new("s", 65);
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.json");
    for sig in [Signal::SIGTERM, Signal::SIGKILL] {
        assert!(!p.tc().contains("clsact"), "{}", p.tc());
        // qosd makes the clsact qdisc; then another tool hooks a filter on it.
        let mut q = p.qosd(&state, &[]);
        add_other_tools_filter(&p);
        q.signal(sig);
        if sig == Signal::SIGKILL {
            let out = Command::new(QOSD)
                .args(["restore", "--state-file"])
                .arg(&state)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let tc = p.tc();
        assert!(!tc.contains("net_"), "{sig}: qosd's filters left: {tc}");
        assert!(
            tc.contains("clsact") && tc.contains("pref 7 u32"),
            "{sig}: the other tool's filter went with qosd: {tc}"
        );
        sh(&[
            "ip", "netns", "exec", &p.a, "tc", "qdisc", "del", "dev", &p.va, "clsact",
        ]);
    }
}

#[test]
fn usage_errors_exit_2_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.json");
    for (args, says) in [
        (&["--bin-ms", "3"][..], "--bin-ms 3"),
        (&["--iface", "qosd-no-such-net26"][..], "no such interface"),
        (&["--iface", "lo"][..], "Ethernet"),
        (&["--peers-max", "0"][..], "--peers-max"),
        (&["--top", "0"][..], "--top"),
        (&["--duration", "0"][..], "--duration"),
        (&["--duration", "1e20"][..], "expected seconds in"),
        (&["--duration", "NaN"][..], "expected seconds in"),
    ] {
        let out = Command::new(QOSD)
            .arg("net")
            .args(args)
            .arg("--state-file")
            .arg(&state)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(!state.exists(), "{args:?} journalled something");
    }
}

/// `GET path` from inside namespace `ns` (the daemon's API listens on its
/// loopback there): status and body.
fn http_get(ns: &str, port: u16, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    Pair::within(ns, || {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: qosd\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut r = String::new();
        s.read_to_string(&mut r).unwrap();
        let (head, body) = r.split_once("\r\n\r\n").unwrap();
        let code = head.split(' ').nth(1).unwrap().parse().unwrap();
        (code, body.to_owned())
    })
}

/// `qosd run` in namespace `a` with the net sensor on `va`, once it counts.
fn daemon(p: &Pair, cfg: &std::path::Path) -> Child {
    let mut c = Command::new("ip")
        .args(["netns", "exec", &p.a, QOSD, "run", "--config"])
        .arg(cfg)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(c.stdout.take().unwrap());
    let mut seen = String::new();
    while !seen.contains("net: counting on") {
        let mut line = String::new();
        if out.read_line(&mut line).unwrap() == 0 || line.contains("net: not started") {
            panic!("the daemon's net sensor did not start: {seen}{line}");
        }
        seen += &line;
    }
    // Keep reading (the daemon must never block on a full pipe).
    std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
    c
}

#[test]
fn daemon_net_sensor_counts_an_apps_port_and_top_peers_and_is_removed_on_sigterm_and_sigkill() {
    use nix::sys::signal::{kill, Signal};
    let p = Pair::new("d", 64);
    sh(&["ip", "-n", &p.a, "link", "set", "lo", "up"]);
    // A second sender address in `b`: two peers, and top_n 1 makes one `other`.
    let vb = format!("{}b", p.va.trim_end_matches('a'));
    sh(&[
        "ip",
        "-n",
        &p.b,
        "addr",
        "add",
        "10.226.64.3/24",
        "dev",
        &vb,
    ]);
    let dir = tempfile::tempdir().unwrap();
    let (api, port) = (19264u16, 7264u16);
    let cfg = dir.path().join("config.yaml");
    let policy = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies/parties.yaml");
    std::fs::write(
        &cfg,
        format!(
            "apps:\n  - name: udpapp\n    match: {{ comm: qd-never-runs }}\n    class: lc\n    \
             target: {{ p99: 1ms }}\n    feedback: client\n    ports: [{port}]\n\
             policy: {}\napi:\n  listen: 127.0.0.1:{api}\n  token_file: {}\n\
             state_file: {}\nactuators: {{ enabled: [] }}\n\
             sensors:\n  power: false\n  net: {{ ifaces: [{}], bin_ms: 1, top_n: 1 }}\n",
            policy.display(),
            dir.path().join("api.token").display(),
            dir.path().join("state.json").display(),
            p.va
        ),
    )
    .unwrap();
    let mut d = daemon(&p, &cfg);
    let tc = p.tc();
    assert!(
        tc.contains("net_ingress") && tc.contains("pref 20036"),
        "{tc}"
    );

    // 200 packets from .2 and 100 from .3 to the app's port, all inside
    // one 1 s window (sent early in a second, without pauses).
    let (from2, from3, size) = (200u64, 100u64, 100usize);
    let to = SocketAddrV4::new(p.ip(1), port);
    let _app = Pair::within(&p.a, || UdpSocket::bind(to).unwrap());
    while !(50..400).contains(&((qosd_sensors::net::now_ns() / 1_000_000) % 1000)) {
        std::thread::sleep(Duration::from_millis(5));
    }
    Pair::within(&p.b, || {
        for (src, n) in [(p.ip(2), from2), (Ipv4Addr::new(10, 226, 64, 3), from3)] {
            let sock = UdpSocket::bind((src, 0)).unwrap();
            for _ in 0..n {
                assert_eq!(sock.send_to(&vec![3u8; size], to).unwrap(), size);
            }
        }
    });
    let sent_in = mono_s();
    let pkt = size as u64 + HEADERS;
    // The window of the burst, as /v1/net shows it while it is the latest.
    let t0 = Instant::now();
    let mut node = Value::Null;
    while t0.elapsed() < Duration::from_secs(10) {
        let (code, body) = http_get(&p.a, api, "/v1/net");
        if code == 200 {
            let v: Value = serde_json::from_str(&body).unwrap();
            if v["node"]["window"].as_u64() == Some(sent_in) {
                node = v["node"].clone();
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let ingress: Vec<&Value> = node["peers"]
        .as_array()
        .unwrap_or_else(|| panic!("no window {sent_in} seen: {node}"))
        .iter()
        .filter(|r| r["dir"] == "ingress")
        .collect();
    assert_eq!(ingress[0]["peer"]["addr"], p.ip(2).to_string(), "{node}");
    assert_eq!(ingress[0]["figures"]["packets"], from2, "{node}");
    assert_eq!(ingress[0]["figures"]["bytes"], from2 * pkt, "{node}");
    let other = ingress.iter().find(|r| r["peer"].is_null()).expect("other");
    assert!(
        other["figures"]["bytes"].as_u64() >= Some(from3 * pkt),
        "{node}"
    );
    assert!(ingress.len() == 2, "top 1 and other only: {node}");

    // The app's totals, exact, in /metrics.
    let want = format!(
        "qosd_app_net_packets_total{{app=\"udpapp\",direction=\"ingress\"}} {}",
        from2 + from3
    );
    let want_bytes = format!(
        "qosd_app_net_bytes_total{{app=\"udpapp\",direction=\"ingress\"}} {}",
        (from2 + from3) * pkt
    );
    let t0 = Instant::now();
    let mut m = String::new();
    while t0.elapsed() < Duration::from_secs(10) && !m.contains(&want) {
        std::thread::sleep(Duration::from_millis(200));
        m = http_get(&p.a, api, "/metrics").1;
    }
    assert!(m.contains(&want) && m.contains(&want_bytes), "{want}\n{m}");
    for family in [
        "# TYPE qosd_net_peer_bytes_per_second gauge",
        "# TYPE qosd_net_peer_peak_bytes_per_second gauge",
        "# TYPE qosd_app_net_peak_bytes_per_second gauge",
    ] {
        assert!(m.contains(family), "{family}\n{m}");
    }

    // SIGTERM: every TC object goes.
    kill(nix::unistd::Pid::from_raw(d.id() as i32), Signal::SIGTERM).unwrap();
    assert!(d.wait().unwrap().success());
    let tc = p.tc();
    assert!(
        !tc.contains("clsact") && !tc.contains("net_"),
        "left behind: {tc}"
    );

    // SIGKILL: `qosd restore` removes them from the state file.
    let mut d = daemon(&p, &cfg);
    assert!(p.tc().contains("net_ingress"));
    kill(nix::unistd::Pid::from_raw(d.id() as i32), Signal::SIGKILL).unwrap();
    let _ = d.wait();
    assert!(p.tc().contains("net_ingress"), "SIGKILL removes nothing");
    let out = Command::new(QOSD)
        .args(["restore", "--state-file"])
        .arg(dir.path().join("state.json"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tc = p.tc();
    assert!(
        !tc.contains("clsact") && !tc.contains("net_"),
        "left behind: {tc}"
    );
}
