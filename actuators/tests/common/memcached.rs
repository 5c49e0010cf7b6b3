//! A real memcached for the tests that act on a live process's threads:
//! started on a free loopback port, and made to create a thread on demand
//! (its LRU crawler, stopped and started again).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Memcached {
    pub child: Child,
    pub port: u16,
}

impl Drop for Memcached {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn start_memcached() -> Memcached {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    // The one memcached command line (4 threads, memcached's default 64 MB).
    let argv = qosd_scenarios::servers::memcached_argv(port, 4, 64);
    let child = Command::new(&argv[0])
        .args(&argv[1..])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("memcached must be installed (apt install memcached)");
    let mc = Memcached { child, port };
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "memcached did not start on port {port}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    mc
}

/// Sends one text command and reads the one-line reply.
pub fn command(port: u16, cmd: &str) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(format!("{cmd}\r\n").as_bytes()).unwrap();
    let mut buf = [0u8; 256];
    let n = s.read(&mut buf).unwrap();
    String::from_utf8_lossy(&buf[..n]).trim().to_owned()
}

pub fn tids(pid: u32) -> Vec<i32> {
    let mut v: Vec<i32> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    v.sort();
    v
}

/// memcached's LRU crawler thread is stopped and started again: a thread
/// created after the change. Returns its tid.
pub fn new_thread(mc: &Memcached) -> i32 {
    let pid = mc.child.id();
    assert_eq!(command(mc.port, "lru_crawler disable"), "OK");
    let before = tids(pid);
    // `disable` answers before the crawler thread has exited; until it
    // has, `enable` answers "ERROR failed to start lru crawler thread".
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let r = command(mc.port, "lru_crawler enable");
        if r == "OK" {
            break;
        }
        assert!(Instant::now() < deadline, "lru_crawler enable: {r}");
        std::thread::sleep(Duration::from_millis(20));
    }
    loop {
        if let Some(t) = tids(pid).into_iter().find(|t| !before.contains(t)) {
            return t;
        }
        assert!(Instant::now() < deadline, "memcached made no new thread");
        std::thread::sleep(Duration::from_millis(20));
    }
}
