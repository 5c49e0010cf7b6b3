//! The daemon's net sensor (`sensors.net`) in network namespaces the
//! test makes (`qosd-test-net26-*`): it counts an app's port and the top
//! peers exactly, serves them on the API, and its TC programs are removed
//! after SIGTERM and after SIGKILL + `qosd restore`; an app without
//! `ports:` is counted on the ports its processes listen on. Needs root.

mod support;

use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use support::netns::*;
use support::QOSD;

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
    let what = "the daemon's net sensor";
    read_until(&mut out, "net: counting on", Some("net: not started"), what);
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
    while !(50..400).contains(&((qosd_core::clock::monotonic_ns() / 1_000_000) % 1000)) {
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
    restore(&dir.path().join("state.json"));
    let tc = p.tc();
    assert!(
        !tc.contains("clsact") && !tc.contains("net_"),
        "left behind: {tc}"
    );
}

#[test]
fn daemon_discovers_an_apps_ports_from_its_sockets_when_the_config_gives_none() {
    let p = Pair::new("p", 66);
    sh(&["ip", "-n", &p.a, "link", "set", "lo", "up"]);
    let (api, port) = (19266u16, 7266u16);
    // The app: a process in `a` bound to a UDP port (no `ports:` for it).
    let bind = format!(
        "import socket,time; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); \
         s.bind(('{}', {port})); print('bound', flush=True); time.sleep(60)",
        p.ip(1)
    );
    let mut app = Command::new("ip")
        .args(["netns", "exec", &p.a, "python3", "-c", &bind])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(app.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "bound");
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("config.yaml");
    let policy = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies/parties.yaml");
    std::fs::write(
        &cfg,
        format!(
            "apps:\n  - name: portapp\n    match: {{ pid: {} }}\n    class: lc\n    \
             target: {{ p99: 1ms }}\n    feedback: client\n\
             policy: {}\napi:\n  listen: 127.0.0.1:{api}\n  token_file: {}\n\
             state_file: {}\nactuators: {{ enabled: [] }}\n\
             sensors:\n  power: false\n  net: {{ ifaces: [{}] }}\n",
            app.id(),
            policy.display(),
            dir.path().join("api.token").display(),
            dir.path().join("state.json").display(),
            p.va
        ),
    )
    .unwrap();
    let mut d = daemon(&p, &cfg);
    let n = 50u64;
    let to = SocketAddrV4::new(p.ip(1), port);
    Pair::within(&p.b, || {
        let sock = UdpSocket::bind((p.ip(2), 0)).unwrap();
        for _ in 0..n {
            sock.send_to(&[1u8; 100], to).unwrap();
        }
    });
    let want = format!("qosd_app_net_packets_total{{app=\"portapp\",direction=\"ingress\"}} {n}\n");
    let t0 = Instant::now();
    let mut m = String::new();
    while t0.elapsed() < Duration::from_secs(10) && !m.contains(&want) {
        std::thread::sleep(Duration::from_millis(200));
        m = http_get(&p.a, api, "/metrics").1;
    }
    let (_, net) = http_get(&p.a, api, "/v1/net");
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(d.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = d.wait();
    let _ = app.kill();
    let _ = app.wait();
    assert!(m.contains(&want), "{want}\n{m}");
    let v: Value = serde_json::from_str(&net).unwrap();
    assert_eq!(
        v["apps"]["portapp"]["ports"],
        serde_json::json!([port]),
        "{v}"
    );
    assert_eq!(v["apps"]["portapp"]["ports_from"], "discovered", "{v}");
}
