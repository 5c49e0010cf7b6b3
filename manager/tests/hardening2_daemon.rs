//! Issue 21, the daemon (root, real cgroups, real processes): a SIGTERM
//! right after the first change is applied still restores (the handlers
//! are in place before anything is touched); a `qosd-<app>` group removed
//! under the daemon and a second daemon managing the same process are each
//! logged; a token file replaced, deleted or made untrusted is read again
//! (the new token writes, the old one is refused, an untrusted file refuses
//! every write); a log written to a file has
//! no colour codes; a dry run's stop says nothing was put back; no eBPF
//! program is attached when every app is client-fed. Run alone:
//! `cargo test --release -p qosd-manager --test hardening2_daemon`.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use support::*;

/// A config managing `pid` with one core through a cgroup v1 cpuset group
/// and client feedback (`extra` appended at the top level).
fn config(dir: &Path, port: u16, app: &str, pid: u32, extra: &str) -> PathBuf {
    let p = dir.join("config.yaml");
    std::fs::write(
        &p,
        format!(
            "apps:\n  - name: {app}\n    match: {{ pid: {pid} }}\n    class: lc\n    \
             target: {{ p99: 2ms }}\n    feedback: client\n    \
             resources: {{ initial: {{ nr_cores: 1 }} }}\n\
             policy: {}\nstate_file: {}\n\
             actuators:\n  enabled: [cores]\n  cores_backend: cgroup1\n\
             api:\n  listen: 127.0.0.1:{port}\n  token_file: {}\n{extra}",
            parties().display(),
            dir.join("state.json").display(),
            dir.join("api.token").display(),
        ),
    )
    .unwrap();
    p
}

/// The daemon with its stderr written to `dir/stderr.log`.
fn start_logged(cfg: &Path, port: u16, dir: &Path, extra: &[&str]) -> Daemon {
    let log = std::fs::File::create(dir.join("stderr.log")).unwrap();
    Daemon::start_with(cfg, port, extra, |c| {
        c.stderr(Stdio::from(log));
    })
}

fn stderr_of(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("stderr.log")).unwrap_or_default()
}

#[test]
fn hardening2_sigterm_right_after_the_first_change_restores() {
    for round in 0..3 {
        let sleeper = Killed::sleeper(120);
        let pid = sleeper.pid();
        let before = (cgroups(pid), thread_cpus(pid));
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let app = format!("hst{round}-{pid}");
        let cfg = config(dir.path(), port, &app, pid, "");
        let state = dir.path().join("state.json");
        let child = Command::new(QOSD)
            .args(["run", "--config"])
            .arg(&cfg)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // The state file is written just before the first change: the
        // signal lands in the start-up window the old daemon died in.
        let t0 = Instant::now();
        while !state.exists() && t0.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_micros(200));
        }
        assert!(state.exists(), "no state file within 20 s");
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            Signal::SIGTERM,
        )
        .unwrap();
        let out = child.wait_with_output().unwrap();
        let stdout = text(&out.stdout);
        assert!(
            out.status.success(),
            "round {round}: {} {stdout}",
            out.status
        );
        assert!(stdout.contains("stopping (SIGTERM)"), "{stdout}");
        assert_eq!(
            (cgroups(pid), thread_cpus(pid)),
            before,
            "round {round}: {stdout}"
        );
        assert!(!Path::new("/sys/fs/cgroup/cpuset")
            .join(format!("qosd-{app}"))
            .exists());
    }
}

#[test]
fn hardening2_a_removed_group_is_logged_and_a_changed_token_file_is_read_again() {
    let sleeper = Killed::sleeper(120);
    let pid = sleeper.pid();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let app = format!("hrm-{pid}");
    let cfg = config(dir.path(), port, &app, pid, "");
    let d = start_logged(&cfg, port, dir.path(), &[]);
    let group = Path::new("/sys/fs/cgroup/cpuset").join(format!("qosd-{app}"));
    assert!(wait_for(Duration::from_secs(10), || cgroups(pid)
        .contains(&format!("qosd-{app}"))));
    // Someone moves the process out and removes qosd's group.
    std::fs::write("/sys/fs/cgroup/cpuset/cgroup.procs", pid.to_string()).unwrap();
    std::fs::remove_dir(&group).unwrap();
    assert!(
        wait_for(Duration::from_secs(10), || stderr_of(dir.path())
            .contains("was removed while qosd managed it")),
        "no log line for the removed group: {}",
        stderr_of(dir.path())
    );
    assert!(wait_for(Duration::from_secs(10), || group.exists()));
    // The token file replaced: the new token is the one writes need.
    let token = dir.path().join("api.token");
    let old = std::fs::read_to_string(&token).unwrap().trim().to_owned();
    let new = dir.path().join("new.token");
    let fresh = "0123456789abcdef0123456789abcdef";
    std::fs::write(&new, format!("{fresh}\n")).unwrap();
    std::fs::set_permissions(&new, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    std::fs::rename(&new, &token).unwrap();
    let said = |what: &str| {
        d.output()
            .iter()
            .any(|l| l.contains("token file") && l.contains(what))
    };
    assert!(
        wait_for(Duration::from_secs(10), || said("was replaced")),
        "{:?}",
        d.output()
    );
    let path = format!("/v1/apps/{app}/latency");
    let body = r#"{"latencies_us": [100]}"#;
    let status = |t: &str| d.post_auth(&path, body, Some(&format!("Bearer {t}"))).0;
    assert_eq!(status(&old), 401, "the replaced token still writes");
    assert_eq!(status(fresh), 200, "the new token is refused");
    // Deleted: qosd makes a new token, as at start; the last one is refused.
    std::fs::remove_file(&token).unwrap();
    assert!(
        wait_for(Duration::from_secs(10), || said("was deleted")),
        "{:?}",
        d.output()
    );
    let made = std::fs::read_to_string(&token).unwrap().trim().to_owned();
    assert_ne!(made, fresh);
    assert_eq!(status(fresh), 401);
    assert_eq!(status(&made), 200);
    // Readable by others: no token is trusted, every write refused.
    std::fs::set_permissions(&token, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    assert!(
        wait_for(Duration::from_secs(10), || said("writes are refused")),
        "{:?}",
        d.output()
    );
    assert_eq!(status(&made), 401);
    let (st, _) = d.stop();
    assert!(st.success());
    // Logged to a file: no colour codes.
    let log = stderr_of(dir.path());
    assert!(!log.contains('\u{1b}'), "ANSI codes in a file log: {log:?}");
    assert!(!group.exists(), "{} left behind", group.display());
}

#[test]
fn hardening2_a_second_daemon_on_the_same_process_warns() {
    // The first daemon puts the process in a cgroup, or only sets its
    // affinity (no group to tell by): the second sees it either way.
    for backend in ["cgroup1", "affinity"] {
        let sleeper = Killed::sleeper(120);
        let pid = sleeper.pid();
        let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (p1, p2) = (free_port(), free_port());
        let cfg1 = config(d1.path(), p1, &format!("hone-{pid}"), pid, "");
        let text = std::fs::read_to_string(&cfg1).unwrap();
        std::fs::write(
            &cfg1,
            text.replace(
                "cores_backend: cgroup1",
                &format!("cores_backend: {backend}"),
            ),
        )
        .unwrap();
        let first = Daemon::start(&cfg1, p1, &[]);
        assert!(
            wait_for(Duration::from_secs(10), || first
                .output()
                .iter()
                .any(|l| l.contains(&format!("pids [{pid}]")))),
            "{backend}: {:?}",
            first.output()
        );
        let second = Daemon::start(
            &config(d2.path(), p2, &format!("htwo-{pid}"), pid, ""),
            p2,
            &[],
        );
        let warned = || {
            second.output().iter().any(|l| {
                l.contains("WARNING")
                    && l.contains(&format!("pid {pid} is managed by another running qosd"))
                    && l.contains(&format!("app hone-{pid}"))
            })
        };
        assert!(
            wait_for(Duration::from_secs(10), warned),
            "{backend}: {:?}",
            second.output()
        );
        let (s2, _) = second.stop();
        let (s1, _) = first.stop();
        assert!(s1.success() && s2.success());
        // Each claim went with its daemon.
        assert!(!Path::new(&format!("/run/qosd/pids/{pid}.lock")).exists());
    }
}

#[test]
fn hardening2_client_fed_dry_run_attaches_no_ebpf_and_restores_nothing() {
    let sleeper = Killed::sleeper(120);
    let pid = sleeper.pid();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let cfg = config(dir.path(), port, &format!("hdry-{pid}"), pid, "");
    let d = Daemon::start(&cfg, port, &["--dry-run"]);
    let out = d.output();
    assert!(
        out.iter().any(|l| l.starts_with("ebpf: not started")),
        "{out:?}"
    );
    assert_eq!(d.get("/v1/status")["run"]["ebpf"], false);
    let (st, out) = d.stop();
    assert!(st.success());
    assert!(
        out.iter()
            .any(|l| l.starts_with("dry run: nothing to put back")),
        "{out:?}"
    );
    assert!(!out.iter().any(|l| l.starts_with("restored ")), "{out:?}");
}
