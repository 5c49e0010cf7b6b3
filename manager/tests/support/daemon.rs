//! `qosd run` as a child process with its stdout collected, its API
//! through ureq, a config writer, and a real Prometheus scraping it.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{Killed, QOSD};

pub fn parties() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies/parties.yaml")
}

/// `qosd run` as a child: stdout lines kept, SIGTERM + wait on drop.
pub struct Daemon {
    pub child: Child,
    pub port: u16,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Daemon {
    /// Starts `qosd run --config CONFIG EXTRA...` and waits (20 s at most)
    /// for its API to answer.
    pub fn start(config: &Path, port: u16, extra: &[&str]) -> Daemon {
        Daemon::start_with(config, port, extra, |_| {})
    }

    /// [`Daemon::start`], with `setup` applied to the command first (e.g.
    /// a `pre_exec` that lowers a resource limit).
    pub fn start_with(
        config: &Path,
        port: u16,
        extra: &[&str],
        setup: impl FnOnce(&mut Command),
    ) -> Daemon {
        let mut cmd = Command::new(QOSD);
        cmd.arg("run")
            .arg("--config")
            .arg(config)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        setup(&mut cmd);
        let mut child = cmd.spawn().expect("running qosd run");
        let out = child.stdout.take().unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let l2 = lines.clone();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                eprintln!("qosd| {l}");
                l2.lock().unwrap().push(l);
            }
        });
        let mut d = Daemon { child, port, lines };
        let deadline = Instant::now() + super::patience(Duration::from_secs(20));
        loop {
            if d.try_get("/v1/status").is_some() {
                break;
            }
            if let Some(st) = d.child.try_wait().unwrap() {
                panic!("qosd run exited at start: {st}; output: {:?}", d.output());
            }
            assert!(
                Instant::now() < deadline,
                "qosd API not up in time (20 s, x4 in the kernel matrix)"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        d
    }

    pub fn output(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    pub fn try_get(&self, path: &str) -> Option<Value> {
        let mut r = agent().get(&self.url(path)).call().ok()?;
        r.body_mut().read_json().ok()
    }

    /// GET, expecting `status`; the JSON body.
    pub fn get_status(&self, path: &str, status: u16) -> Value {
        let mut r = agent().get(&self.url(path)).call().expect("GET");
        assert_eq!(r.status().as_u16(), status, "GET {path}");
        r.body_mut().read_json().expect("JSON body")
    }

    pub fn get(&self, path: &str) -> Value {
        self.get_status(path, 200)
    }

    pub fn get_text(&self, path: &str) -> (String, String) {
        let mut r = agent().get(&self.url(path)).call().expect("GET");
        assert_eq!(r.status().as_u16(), 200, "GET {path}");
        let ct = r
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        (ct, r.body_mut().read_to_string().unwrap())
    }

    /// The file holding the API's write token, as the daemon announced it.
    pub fn token_path(&self) -> PathBuf {
        let find = || {
            self.output()
                .iter()
                .find_map(|l| l.split_once("the token in ").map(|(_, r)| r.to_owned()))
        };
        // The API may answer before the reader thread has the line.
        super::wait_for(Duration::from_secs(5), || find().is_some());
        let line = find().unwrap_or_else(|| panic!("no token line in {:?}", self.output()));
        PathBuf::from(line.rsplit_once(" (").map_or(line.as_str(), |(p, _)| p))
    }

    /// The API's write token (the daemon runs as root, like the tests).
    pub fn token(&self) -> String {
        let p = self.token_path();
        std::fs::read_to_string(&p)
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
            .trim()
            .to_owned()
    }

    /// POST with the write token.
    pub fn post(&self, path: &str, body: &str) -> (u16, Value) {
        self.post_auth(path, body, Some(&format!("Bearer {}", self.token())))
    }

    /// POST with `authorization` as the Authorization header (or none).
    pub fn post_auth(&self, path: &str, body: &str, authorization: Option<&str>) -> (u16, Value) {
        let mut req = agent()
            .post(&self.url(path))
            .header("content-type", "application/json");
        if let Some(a) = authorization {
            req = req.header("authorization", a);
        }
        let mut r = req.send(body).expect("POST");
        (
            r.status().as_u16(),
            r.body_mut().read_json().expect("JSON body"),
        )
    }

    /// SIGTERM, then the exit status (30 s at most).
    pub fn stop(mut self) -> (std::process::ExitStatus, Vec<String>) {
        signal(self.child.id(), nix::sys::signal::Signal::SIGTERM);
        let st = wait(&mut self.child, Duration::from_secs(30));
        // Let the reader thread drain the last lines.
        std::thread::sleep(Duration::from_millis(200));
        (st, self.output())
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            signal(self.child.id(), nix::sys::signal::Signal::SIGTERM);
            let _ = wait_opt(&mut self.child, Duration::from_secs(20));
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn signal(pid: u32, s: nix::sys::signal::Signal) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), s);
}

fn wait_opt(c: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Ok(Some(st)) = c.try_wait() {
            return Some(st);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

fn wait(c: &mut Child, limit: Duration) -> std::process::ExitStatus {
    wait_opt(c, limit).expect("qosd did not exit after SIGTERM")
}

pub fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(5)))
        .http_status_as_error(false)
        .build()
        .into()
}

/// A config for one app in a temp dir: returns its path.
pub struct AppSpec<'a> {
    pub name: &'a str,
    pub matcher: String,
    pub target_us: Option<f64>,
    pub feedback: &'a str,
    pub resources: &'a str,
}

pub fn write_config(dir: &Path, port: u16, apps: &[AppSpec<'_>]) -> PathBuf {
    let mut y = String::from("apps:\n");
    for a in apps {
        y += &format!("  - name: {}\n    match: {}\n", a.name, a.matcher);
        match a.target_us {
            Some(t) => y += &format!("    class: lc\n    target: {{ p99: {t:.0}us }}\n"),
            None => y += "    class: be\n",
        }
        y += &format!(
            "    feedback: {}\n    resources: {}\n",
            a.feedback, a.resources
        );
    }
    y += &format!(
        "policy: {}\napi:\n  listen: 127.0.0.1:{port}\n  token_file: {}\nstate_file: {}\n",
        parties().display(),
        dir.join("api.token").display(),
        dir.join("state.json").display()
    );
    let p = dir.join("config.yaml");
    std::fs::write(&p, y).unwrap();
    p
}

/// Prometheus (Debian's package) scraping `127.0.0.1:target` every second,
/// its files in `dir`; killed on drop.
pub struct Prometheus {
    _proc: Killed,
    pub port: u16,
}

impl Prometheus {
    pub fn start(dir: &Path, target: u16) -> Prometheus {
        let port = super::free_port();
        let cfg = dir.join("prometheus.yml");
        std::fs::write(
            &cfg,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
                 scrape_configs:\n  - job_name: qosd\n    static_configs:\n      - targets: ['127.0.0.1:{target}']\n"
            ),
        )
        .unwrap();
        let proc = Command::new("prometheus")
            .arg(format!("--config.file={}", cfg.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting prometheus (apt-get install prometheus)");
        Prometheus {
            _proc: Killed(proc),
            port,
        }
    }

    /// The answer to an instant query (Null until Prometheus answers).
    pub fn query(&self, q: &str) -> Value {
        let url = format!("http://127.0.0.1:{}/api/v1/query", self.port);
        match agent().get(&url).query("query", q).call() {
            Ok(mut r) => r.body_mut().read_json().unwrap_or(Value::Null),
            Err(_) => Value::Null,
        }
    }
}
