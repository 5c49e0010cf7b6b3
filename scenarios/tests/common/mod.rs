//! Real servers started by the tests on loopback, on a free port, killed on
//! drop: the fixture server, memcached and nginx from Debian.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Server {
    child: Child,
    pub addr: String,
    _dir: Option<tempfile::TempDir>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Real-server tests of one binary run one at a time: on a 2-CPU machine two
/// load generators and two servers at once would measure each other.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

pub fn free_port() -> u16 {
    qosd_scenarios::servers::free_port().expect("a free loopback port")
}

fn wait_ready(addr: &str) {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(10) {
        if TcpStream::connect(addr).is_ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("server at {addr} did not start within 10 s");
}

/// The fixture server with the given extra arguments.
pub fn fixture(args: &[&str]) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_qosd-fixture"))
        .args(["--listen", "127.0.0.1:0", "--exit-after-s", "300"])
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .expect("start qosd-fixture");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .expect("fixture prints its address")
        .to_owned();
    Server {
        child,
        addr,
        _dir: None,
    }
}

pub fn memcached(threads: u32) -> Server {
    let port = free_port();
    let argv = qosd_scenarios::servers::memcached_argv(port, threads, 64);
    let child = Command::new(&argv[0])
        .args(&argv[1..])
        .spawn()
        .expect("memcached from Debian (apt-get install memcached)");
    let addr = format!("127.0.0.1:{port}");
    wait_ready(&addr);
    Server {
        child,
        addr,
        _dir: None,
    }
}

/// nginx serving a small static page; `keepalive_requests` as given.
pub fn nginx(keepalive_requests: u32) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let www = dir.path().join("www");
    std::fs::create_dir(&www).unwrap();
    std::fs::write(www.join("index.html"), "hello from nginx\n").unwrap();
    let d = dir.path().display();
    let conf = format!(
        "daemon off; master_process off; worker_processes 1; pid {d}/nginx.pid;\n\
         error_log {d}/error.log;\n\
         events {{ worker_connections 4096; }}\n\
         http {{ access_log off; keepalive_requests {keepalive_requests}; keepalive_timeout 60s;\n\
           server {{ listen 127.0.0.1:{port}; root {www}; }} }}\n",
        www = www.display()
    );
    let conf_path: PathBuf = dir.path().join("nginx.conf");
    std::fs::write(&conf_path, conf).unwrap();
    let child = Command::new("nginx")
        .args(["-p", &d.to_string(), "-c", &conf_path.display().to_string()])
        .spawn()
        .expect("nginx from Debian (apt-get install nginx-light)");
    let addr = format!("127.0.0.1:{port}");
    wait_ready(&addr);
    Server {
        child,
        addr,
        _dir: Some(dir),
    }
}
