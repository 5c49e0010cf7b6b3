//! The hedge knob run by the daemon and by `qosd set hedge`, in network
//! namespaces each test makes (`qh27-<tag>-*` from `qosd_hedge::topo`:
//! a client namespace whose holder process is the app, a service and a
//! replica namespace with real chaos servers, veths only, routes checked):
//! a rule policy turns hedging on for the app that has a `hedge:`
//! section, its counters move in `/metrics`
//! and `GET /v1/apps/{name}`, and every TC filter, qdisc and veth is gone
//! after SIGTERM and after SIGKILL + `qosd restore`; an app whose requests
//! carry no id is refused (log, API note, `refused` event) and stays
//! unhedged. Needs root.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use qosd_hedge::chaos::ChaosArgs;
use qosd_hedge::client::{self, Mode, RunArgs, Sample};
use qosd_hedge::route::in_netns;
use qosd_hedge::topo::Topo;
use serde_json::Value;

const QOSD: &str = env!("CARGO_BIN_EXE_qosd");
const PORT: u16 = 7127;

fn chaos(slow_permille: u32, slow_us: u64) -> ChaosArgs {
    ChaosArgs {
        exit_after_s: 120,
        ..ChaosArgs::on_port(PORT, 500, slow_permille, slow_us, 5)
    }
}

/// `n` requests from the client namespace (ids from `first`).
fn requests(topo: &Topo, first: u64, n: u64) -> Vec<Sample> {
    let args = RunArgs {
        service: Topo::service(PORT).into(),
        mode: Mode::Plain,
        first_id: first,
        nr_requests: n,
        streams: 2,
        payload_len: 64,
        timeout: Duration::from_secs(1),
        drain: Duration::from_millis(300),
    };
    in_netns(&topo.client().unwrap(), || client::run(&args)).unwrap()
}

/// What qosd could leave in the client namespace: delay-line links,
/// qdiscs and filters of its interfaces.
fn leftovers(topo: &Topo) -> String {
    let ns = &topo.ns()[0];
    let run = |a: &[&str]| {
        let o = Command::new("ip")
            .args(["netns", "exec", ns])
            .args(a)
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let links = run(&["ip", "-o", "link", "show"]);
    let mut out = String::new();
    for l in links
        .lines()
        .filter(|l| l.contains("qh27-") || l.contains("qhd-"))
    {
        let name = l.split(": ").nth(1).unwrap().split('@').next().unwrap();
        out += &format!("link {name}\n");
        out += &run(&["tc", "qdisc", "show", "dev", name]);
        for dir in ["ingress", "egress"] {
            out += &run(&["tc", "filter", "show", "dev", name, dir]);
        }
    }
    out
}

fn assert_clean(topo: &Topo, when: &str) {
    let left = leftovers(topo);
    assert!(
        !left.contains("qhd-") && !left.contains("clsact") && !left.contains("bpf"),
        "{when}: left behind: {left}"
    );
}

fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: qosd\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut r = String::new();
    s.read_to_string(&mut r).ok()?;
    let (head, body) = r.split_once("\r\n\r\n")?;
    Some((head.split(' ').nth(1)?.parse().ok()?, body.to_owned()))
}

/// Polls `GET path` until `done` holds for its body (at most 20 s).
fn until(port: u16, path: &str, done: impl Fn(&str) -> bool) -> String {
    let t0 = Instant::now();
    let mut last = String::new();
    while t0.elapsed() < Duration::from_secs(20) {
        if let Some((200, body)) = http_get(port, path) {
            if done(&body) {
                return body;
            }
            last = body;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let decisions = http_get(port, "/v1/decisions").map(|r| r.1);
    panic!("GET {path}: not there within 20 s: {last}\ndecisions: {decisions:?}");
}

/// A daemon that a failing test does not leave running.
struct Daemon(Child);

impl Daemon {
    fn signal(&mut self, sig: Signal) -> std::process::ExitStatus {
        kill(nix::unistd::Pid::from_raw(self.0.id() as i32), sig).unwrap();
        self.0.wait().unwrap()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = self.signal(Signal::SIGTERM);
        }
    }
}

/// A daemon on `cfg`; its log lines go to `daemon.out` beside it.
fn daemon(cfg: &std::path::Path) -> Daemon {
    let out = std::fs::File::create(cfg.with_file_name("daemon.out")).unwrap();
    Daemon(
        Command::new(QOSD)
            .args(["run", "--config"])
            .arg(cfg)
            .stdout(out)
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    )
}

/// The daemon's config (and a rule policy that turns hedging on at every
/// decision) in `dir`: one app `name` matched by `pid`, hedged to the
/// topology's replica with `hedge` as the rest of its hedge settings.
fn write_config(
    dir: &std::path::Path,
    name: &str,
    pid: i32,
    api: u16,
    hedge: &str,
) -> std::path::PathBuf {
    let policy = dir.join("rules.yaml");
    std::fs::write(
        &policy,
        "name: hedge-on\nrules:\n  - name: hedge-it\n    when: [\"hedge < 2\"]\n    \
         then: [{ resource: hedge, change: +1 }]\n",
    )
    .unwrap();
    let cfg = dir.join("config.yaml");
    std::fs::write(
        &cfg,
        format!(
            "apps:\n  - name: {name}\n    match: {{ pid: {pid} }}\n    class: lc\n    \
             target: {{ p99: 50ms }}\n    feedback: client\n    \
             hedge: {{ service: {}, replica: {}, t_hedge_ms: 10, {hedge} }}\n\
             policy: {}\napi:\n  listen: 127.0.0.1:{api}\n  token_file: {}\n\
             state_file: {}\nactuators: {{ enabled: [hedge] }}\nsensors: {{ power: false }}\n",
            Topo::service(PORT),
            Topo::replica(PORT),
            policy.display(),
            dir.join("api.token").display(),
            dir.join("state.json").display(),
        ),
    )
    .unwrap();
    cfg
}

/// The app is hedged and its programs count (read at a decision after
/// the knob was applied, so every filter is attached by then).
fn hedged(body: &str) -> bool {
    serde_json::from_str::<Value>(body).is_ok_and(|v| {
        v["allocation"]["hedge"] == 2 && v["knob_counters"]["hedge"]["requests"].is_u64()
    })
}

#[test]
fn the_daemon_hedges_an_app_counts_in_metrics_and_restores_after_sigterm_and_sigkill() {
    let mut topo = Topo::new("n2d").unwrap();
    // 10 % of the service's answers take 200 ms; the replica is healthy.
    topo.keep(topo.serve(false, chaos(100, 200_000)).unwrap());
    topo.keep(topo.serve(true, chaos(0, 0)).unwrap());
    let pid = topo.app("client").pids[0];
    let dir = tempfile::tempdir().unwrap();
    let api = 19327u16;
    // The app starts unhedged; a rule turns hedging on (PARTIES leaves
    // an idle app's hedging as it is).
    let cfg = write_config(
        dir.path(),
        "client",
        pid,
        api,
        "budget_permille: 1000, burst: 50, start: off",
    );
    let mut d = daemon(&cfg);
    until(api, "/v1/apps/client", hedged);
    let samples = requests(&topo, 1, 300);
    for s in &samples {
        assert_eq!(s.answers, 1, "id {} got {} answers", s.id, s.answers);
    }
    let want = |e: &str| {
        format!("qosd_app_knob_events_total{{app=\"client\",resource=\"hedge\",event=\"{e}\"}} ")
    };
    let positive = |m: &str, e: &str| {
        m.lines()
            .find_map(|l| l.strip_prefix(&want(e)))
            .and_then(|v| v.parse::<u64>().ok())
            .is_some_and(|v| v > 0)
    };
    let events = ["requests", "hedges_sent", "hedges_won", "dups_dropped"];
    let m = until(api, "/metrics", |m| events.iter().all(|e| positive(m, e)));
    assert!(
        m.contains("qosd_app_hedge_state{app=\"client\"} 2\n"),
        "{m}"
    );
    // The counters are read at each decision: wait for the one after the
    // last request.
    let all_counted = |b: &str| {
        hedged(b)
            && serde_json::from_str::<Value>(b)
                .is_ok_and(|v| v["knob_counters"]["hedge"]["requests"].as_u64() >= Some(300))
    };
    let app: Value = serde_json::from_str(&until(api, "/v1/apps/client", all_counted)).unwrap();
    let c = &app["knob_counters"]["hedge"];
    assert!(c["requests"].as_u64() >= Some(300), "{app}");
    assert!(
        c["hedges_won"].as_u64() > Some(0) && c["hedges_sent"].as_u64() >= c["hedges_won"].as_u64(),
        "{app}"
    );

    assert!(d.signal(Signal::SIGTERM).success());
    assert_clean(&topo, "after SIGTERM");

    let mut d = daemon(&cfg);
    until(api, "/v1/apps/client", hedged);
    assert!(leftovers(&topo).contains("qhd-"), "hedging is on again");
    d.signal(Signal::SIGKILL);
    assert!(leftovers(&topo).contains("qhd-"), "SIGKILL removes nothing");
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
    assert_clean(&topo, "after SIGKILL + restore");
}

#[test]
fn the_daemon_refuses_an_app_whose_requests_carry_no_id() {
    let mut topo = Topo::new("n2r").unwrap();
    topo.keep(topo.serve(false, chaos(0, 0)).unwrap());
    topo.keep(topo.serve(true, chaos(0, 0)).unwrap());
    let pid = topo.app("noid").pids[0];
    let dir = tempfile::tempdir().unwrap();
    let api = 19328u16;
    // Its own app name: two daemons of this binary would share the group
    // lock of one name.
    // Hedged from the start, with a rule that would turn it on again. The
    // id rule wants bytes 100..104; the client's requests have 64.
    let cfg = write_config(
        dir.path(),
        "noid",
        pid,
        api,
        "id: { offset: 100, len: 4 }, start: on",
    );
    let mut d = daemon(&cfg);
    until(api, "/v1/apps/noid", hedged);
    // 20: past the default min_no_id (16).
    let samples = requests(&topo, 1, 20);
    assert!(samples.iter().all(|s| s.answers == 1), "{samples:?}");
    let refused = |b: &str| {
        serde_json::from_str::<Value>(b).is_ok_and(|v| {
            v["allocation"]["hedge"] == 1 && v["note"].as_str().is_some_and(|n| n.contains("no id"))
        })
    };
    let app: Value = serde_json::from_str(&until(api, "/v1/apps/noid", refused)).unwrap();
    let note = app["note"].as_str().unwrap();
    assert!(
        note.contains("refused") && note.contains("id.offset 100 + id.len 4"),
        "{note}"
    );
    assert_clean(&topo, "after the refusal");
    let m = until(api, "/metrics", |m| {
        m.contains("app=\"noid\",resource=\"hedge\",event=\"refused\"} 1\n")
    });
    assert!(m.contains("qosd_app_hedge_state{app=\"noid\"} 1\n"), "{m}");
    // The rule asks for hedging at every decision; the refusal holds.
    let decided = |b: &str| {
        serde_json::from_str::<Value>(b).map_or(0, |v| v["ticks"]["decide"].as_u64().unwrap_or(0))
    };
    let t0 = decided(&http_get(api, "/v1/status").unwrap().1);
    until(api, "/v1/status", |b| decided(b) >= t0 + 3);
    let app: Value = serde_json::from_str(&http_get(api, "/v1/apps/noid").unwrap().1).unwrap();
    assert_eq!(app["allocation"]["hedge"], 1, "{app}");
    assert_clean(&topo, "three decisions later");
    assert!(d.signal(Signal::SIGTERM).success());
    let log = std::fs::read_to_string(dir.path().join("daemon.out")).unwrap();
    assert!(log.contains("noid: hedge for noid: refused"), "{log}");
}

#[test]
fn qosd_set_hedge_holds_until_sigterm_and_then_removes_everything() {
    let mut topo = Topo::new("n2s").unwrap();
    topo.keep(topo.serve(false, chaos(100, 200_000)).unwrap());
    topo.keep(topo.serve(true, chaos(0, 0)).unwrap());
    let pid = topo.app("client").pids[0];
    let dir = tempfile::tempdir().unwrap();
    let mut c = Command::new(QOSD)
        .args(["set", "--hold", "--state-file"])
        .arg(dir.path().join("state.json"))
        .args(["hedge", "--pid", &pid.to_string()])
        .args(["--service", &Topo::service(PORT).to_string()])
        .args(["--replica", &Topo::replica(PORT).to_string()])
        .args(["--t-hedge-ms", "10", "--budget-permille", "1000"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(c.stdout.take().unwrap());
    let mut seen = String::new();
    while !seen.contains("holding") {
        let mut line = String::new();
        if out.read_line(&mut line).unwrap() == 0 {
            panic!("qosd set hedge did not hold: {seen}");
        }
        seen += &line;
    }
    assert!(leftovers(&topo).contains("qhd-"), "{seen}");
    let samples = requests(&topo, 1000, 200);
    assert!(samples.iter().all(|s| s.answers == 1));
    kill(nix::unistd::Pid::from_raw(c.id() as i32), Signal::SIGTERM).unwrap();
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    assert!(c.wait().unwrap().success(), "{seen}{rest}");
    assert!(
        rest.contains("hedges_sent") && rest.contains("restored on"),
        "{rest}"
    );
    assert_clean(&topo, "after SIGTERM");
}
