//! Network namespaces for the net tests (`qosd net` and the daemon's net
//! sensor): a veth pair between two namespaces each test makes
//! (`qosd-test-net26-*`), `qosd net` run inside one, the windows it
//! prints, and `qosd restore` after a SIGKILL.

use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::os::fd::AsFd;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::QOSD;

/// Ethernet + IPv4 + UDP headers of one packet.
pub const HEADERS: u64 = 14 + 20 + 8;

pub fn sh(args: &[&str]) -> String {
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
pub struct Pair {
    pub a: String,
    pub b: String,
    pub va: String,
    pub net: u8,
}

impl Pair {
    pub fn new(tag: &str, net: u8) -> Pair {
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

    pub fn ip(&self, host: u8) -> Ipv4Addr {
        Ipv4Addr::new(10, 226, self.net, host)
    }

    pub fn ip6(&self, host: u16) -> Ipv6Addr {
        Ipv6Addr::new(0xfd26, u16::from(self.net), 0, 0, 0, 0, 0, host)
    }

    /// Runs `f` in a thread inside namespace `ns`.
    pub fn within<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> T {
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
    pub fn tc(&self) -> String {
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
    pub fn qosd(&self, state: &std::path::Path, extra: &[&str]) -> Running {
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
        // libbpf may say first that the clsact qdisc exists already.
        read_until(&mut stderr, "counting on", None, "qosd net");
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

pub struct Running {
    pub child: Child,
    pub stdout: BufReader<ChildStdout>,
    /// Kept open: qosd reports the restore on stderr at exit.
    pub _stderr: BufReader<std::process::ChildStderr>,
}

impl Running {
    /// Windows printed until one starting after CLOCK_MONOTONIC second
    /// `after` (so every packet sent before `after` is in), bounded.
    pub fn windows_past(&mut self, after: u64) -> Vec<Value> {
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

    pub fn signal(&mut self, sig: nix::sys::signal::Signal) -> std::process::ExitStatus {
        // `ip netns exec` execs qosd: the child's pid is qosd's.
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, sig).unwrap();
        self.child.wait().unwrap()
    }
}

pub fn mono_s() -> u64 {
    qosd_core::clock::monotonic_ns() / 1_000_000_000
}

/// Sum of one key's figures over `windows`: peers whose addr/proto/dir
/// match, or ports (`port` set).
pub fn total(windows: &[Value], list: &str, m: impl Fn(&Value) -> bool) -> (u64, u64) {
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

/// `qosd restore --state-file STATE`, which must succeed.
pub fn restore(state: &std::path::Path) {
    let out = Command::new(QOSD)
        .args(["restore", "--state-file"])
        .arg(state)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Reads `r` until a line holding `want` (a line holding `fail`, or the
/// end, panics naming `what` and all that was read).
pub fn read_until(r: &mut impl BufRead, want: &str, fail: Option<&str>, what: &str) {
    let mut seen = String::new();
    while !seen.contains(want) {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap() == 0 || fail.is_some_and(|f| line.contains(f)) {
            panic!("{what} did not start: {seen}{line}");
        }
        seen += &line;
    }
}
