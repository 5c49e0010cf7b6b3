//! gRPC fixtures for the real tests: the Go fixture server (three builds),
//! the Ruby (C-core with symbols) and Python (pip grpcio) servers, and the
//! Go load client, built by `scenarios/fixtures/grpc-server/build.sh`.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::{free_port, repo, Server, QOSD};

fn fixture_src() -> PathBuf {
    repo().join("scenarios/fixtures/grpc-server")
}

/// Where build.sh puts its output: beside the profile directory of the
/// qosd under test (target/grpc-fixture).
pub fn fixture_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let target = Path::new(QOSD)
            .ancestors()
            .nth(2)
            .expect("target dir")
            .to_path_buf();
        let out = target.join("grpc-fixture");
        let st = Command::new("bash")
            .arg(fixture_src().join("build.sh"))
            .arg(&out)
            .status()
            .expect("running build.sh");
        assert!(
            st.success(),
            "building the gRPC fixtures failed (needs Go and pip): {st}"
        );
        out
    })
}

/// Which gRPC fixture server to start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stack {
    /// grpc-go >= 1.69 (`writeStatus`).
    Go,
    /// grpc-go 1.68 (`WriteStatus`).
    Go168,
    /// The Go fixture without a symbol table.
    GoStripped,
    /// Ruby's grpc gem on Debian's libgrpc.so (C-core with symbols).
    RubyCcore,
    /// Python's grpcio wheel from PyPI (C-core linked in, stripped).
    PythonWheel,
}

/// Starts a fixture server on a free loopback port; returns once it says it
/// is listening.
pub fn grpc_server(stack: Stack, work_us: u32) -> Server {
    let dir = fixture_dir();
    let port = free_port();
    let (p, w) = (port.to_string(), work_us.to_string());
    let mut cmd = match stack {
        Stack::Go | Stack::Go168 | Stack::GoStripped => {
            let bin = match stack {
                Stack::Go => "grpc-fixture-server",
                Stack::Go168 => "grpc-fixture-server-grpc1.68",
                _ => "grpc-fixture-server-stripped",
            };
            let mut c = Command::new(dir.join(bin));
            c.args(["-port", &p, "-work-us", &w]);
            c
        }
        Stack::RubyCcore => {
            let mut c = Command::new("ruby");
            c.arg(fixture_src().join("ruby/server.rb"));
            c.args(["--port", &p, "--work-us", &w, "--workers", "64"]);
            c
        }
        Stack::PythonWheel => {
            let mut c = Command::new("python3");
            c.env("PYTHONPATH", dir.join("pip-grpcio")).arg("-s");
            c.arg(fixture_src().join("python/server.py"));
            c.args(["--port", &p, "--work-us", &w, "--workers", "64"]);
            c
        }
    };
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting the {stack:?} gRPC server: {e}"));
    // The first line is "listening on ...", printed once it serves.
    let out = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(out).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx.recv_timeout(Duration::from_secs(20)).unwrap_or_default();
    let srv = Server {
        child,
        port,
        _dir: None,
    };
    assert!(
        line.starts_with("listening on"),
        "{stack:?} server did not start: {line:?}"
    );
    srv
}

/// How the load client spreads its calls.
#[derive(Debug, Clone, Copy)]
pub enum Conns {
    /// One connection; `concurrency` calls in flight on it as HTTP/2 streams.
    Shared,
    /// A new connection for every call.
    PerCall,
}

/// `calls` closed-loop calls with `concurrency` in flight. Returns the load
/// client's summary and every call's latency.
pub fn grpc_load(
    port: u16,
    calls: usize,
    concurrency: usize,
    conns: Conns,
) -> (serde_json::Value, Vec<Duration>) {
    let lat_file = tempfile::NamedTempFile::new().unwrap();
    let mut cmd = Command::new(fixture_dir().join("grpc-load"));
    cmd.args(["-target", &format!("127.0.0.1:{port}")])
        .args([
            "-calls",
            &calls.to_string(),
            "-concurrency",
            &concurrency.to_string(),
        ])
        .args(["-duration", "120s", "-latencies"])
        .arg(lat_file.path());
    if matches!(conns, Conns::PerCall) {
        cmd.arg("-per-call");
    }
    let t0 = Instant::now();
    let out = cmd.output().expect("running grpc-load");
    let text = String::from_utf8_lossy(&out.stdout);
    let summary: serde_json::Value = serde_json::from_str(text.trim()).unwrap_or_else(|_| {
        panic!(
            "grpc-load printed {text:?}; stderr {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert!(
        out.status.success(),
        "grpc-load failed after {:?}: {summary}",
        t0.elapsed()
    );
    assert_eq!(summary["ok"], calls as u64, "{summary}");
    let lat: Vec<Duration> = std::fs::read_to_string(lat_file.path())
        .unwrap()
        .lines()
        .map(|l| Duration::from_secs_f64(l.parse::<f64>().unwrap() / 1e6))
        .collect();
    assert_eq!(lat.len(), calls);
    (summary, lat)
}
