//! Clients that misbehave on purpose, over raw sockets (the issue's
//! python reproductions, in Rust), and the config the hardening tests
//! run the daemon with.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::parties;

/// A config managing `pid` (one core from the start, so there is a knob to
/// restore), client feedback, with `api_extra` lines under `api:`.
pub fn hardening_config(dir: &Path, port: u16, name: &str, pid: u32, api_extra: &str) -> PathBuf {
    let p = dir.join("config.yaml");
    std::fs::write(
        &p,
        format!(
            "apps:\n  - name: {name}\n    match: {{ pid: {pid} }}\n    class: lc\n    \
             target: {{ p99: 2ms }}\n    feedback: client\n    \
             resources: {{ initial: {{ nr_cores: 1 }} }}\n\
             policy: {}\nstate_file: {}\n\
             api:\n  listen: 127.0.0.1:{port}\n  token_file: {}\n{api_extra}",
            parties().display(),
            dir.join("state.json").display(),
            dir.join("api.token").display(),
        ),
    )
    .unwrap();
    p
}

pub fn connect(port: u16) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", port)).expect("connect to the API");
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s
}

/// Reads until the server closes; how long that took (None: still open
/// after the socket's read timeout) and what it sent.
pub fn until_closed(mut s: TcpStream) -> (Option<Duration>, String) {
    let t0 = Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return (Some(t0.elapsed()), String::from_utf8_lossy(&got).into()),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                return (Some(t0.elapsed()), String::from_utf8_lossy(&got).into())
            }
            Err(_) => return (None, String::from_utf8_lossy(&got).into()),
        }
    }
}

/// The four kinds of client that held the old daemon's shutdown (45 s for
/// headers, 13 s for a body): half a request head, a head and half its
/// body, an idle keep-alive connection after a full exchange, and one that
/// never sends a byte.
pub fn hostile_clients(port: u16, token: &str) -> Vec<TcpStream> {
    let mut head = connect(port);
    head.write_all(b"GET /v1/status HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    let mut body = connect(port);
    body.write_all(
        format!(
            "POST /v1/apps/x/latency HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\
             Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{\"latencies_us\":[1,"
        )
        .as_bytes(),
    )
    .unwrap();
    let mut idle = connect(port);
    idle.write_all(b"GET /v1/status HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut buf = [0u8; 512];
    let n = idle.read(&mut buf).unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "{:?}", &buf[..n]);
    let silent = connect(port);
    vec![head, body, idle, silent]
}
