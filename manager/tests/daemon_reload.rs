//! Config reload without a restart: on SIGHUP and when the config file
//! changes the way a Kubernetes ConfigMap update changes it (the `..data`
//! symlink swapped to a new directory). An invalid file is refused with
//! its file:line:col and changes nothing; a valid one releases only the
//! apps that left, adds the new ones and leaves the others as they were.
//! Real processes, real cgroups (the CPU quota knob).
//!
//! `cargo test --release -p qosd-manager --test daemon_reload` (root).

mod support;

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use support::*;

fn yaml(dir: &Path, port: u16, apps: &[(&str, u32)]) -> String {
    let mut y = String::from("apps:\n");
    for (name, pid) in apps {
        y += &format!(
            "  - name: {name}\n    class: be\n    match: {{ pid: {pid} }}\n    \
             resources: {{ initial: {{ cpu_quota_milli: 300 }} }}\n"
        );
    }
    y += &format!(
        "actuators: {{ enabled: [cpu_quota] }}\npolicy: {}\napi:\n  listen: 127.0.0.1:{port}\n  \
         token_file: {}\nstate_file: {}\n",
        parties().display(),
        dir.join("api.token").display(),
        dir.join("state.json").display()
    );
    y
}

/// A ConfigMap volume's layout: `config.yaml -> ..data/config.yaml`,
/// `..data -> <version dir>`; [`swap`] publishes a new version.
fn publish(dir: &Path, version: &str, text: &str) {
    let v = dir.join(version);
    std::fs::create_dir_all(&v).unwrap();
    std::fs::write(v.join("config.yaml"), text).unwrap();
    let tmp = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    symlink(version, &tmp).unwrap();
    std::fs::rename(&tmp, dir.join("..data")).unwrap();
}

fn app(d: &Daemon, name: &str) -> Option<Value> {
    d.try_get(&format!("/v1/apps/{name}"))
        .filter(|v| v.get("name").is_some())
}

fn managed(d: &Daemon, name: &str, pid: u32) -> bool {
    app(d, name).is_some_and(|a| a["managed"] == true && a["pids"][0] == pid)
}

#[test]
fn reload_keeps_everything_on_an_invalid_file_and_releases_only_apps_that_left() {
    let (s1, s2, s3) = (
        Killed::sleeper(120),
        Killed::sleeper(120),
        Killed::sleeper(120),
    );
    let me = std::process::id();
    let (a, b, c) = (
        format!("keep-{me}"),
        format!("leave-{me}"),
        format!("join-{me}"),
    );
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let port = free_port();
    publish(
        dir,
        "v1",
        &yaml(dir, port, &[(&a, s1.pid()), (&b, s2.pid())]),
    );
    let cfg: PathBuf = dir.join("config.yaml");
    symlink("..data/config.yaml", &cfg).unwrap();
    let d = Daemon::start(&cfg, port, &[]);
    assert!(
        wait_for(Duration::from_secs(20), || managed(&d, &a, s1.pid())
            && managed(&d, &b, s2.pid())),
        "{:?}",
        d.output()
    );
    assert!(cgroups(s2.pid()).contains(&format!("qosd-{b}")));

    // Invalid (a misspelt key on line 3): refused with file:line:col, by
    // SIGHUP and by the file change alike; nothing released.
    let bad = yaml(dir, port, &[(&a, s1.pid())]).replacen("    class: be", "    clas: be", 1);
    publish(dir, "v2", &bad);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(d.child.id() as i32),
        nix::sys::signal::Signal::SIGHUP,
    )
    .unwrap();
    let refused = |d: &Daemon| {
        d.output()
            .iter()
            .filter(|l| {
                l.contains("refused, everything kept as it is") && l.contains("config.yaml:3:5")
            })
            .count()
    };
    assert!(
        wait_for(Duration::from_secs(10), || refused(&d) >= 1),
        "{:?}",
        d.output()
    );
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        managed(&d, &a, s1.pid()) && managed(&d, &b, s2.pid()),
        "{:?}",
        d.output()
    );
    assert!(
        cgroups(s2.pid()).contains(&format!("qosd-{b}")),
        "nothing released"
    );

    // Valid, by the ConfigMap's symlink swap alone: b leaves, c joins, a
    // stays as it was.
    let before = app(&d, &a).unwrap()["allocation"].clone();
    publish(
        dir,
        "v3",
        &yaml(dir, port, &[(&a, s1.pid()), (&c, s3.pid())]),
    );
    assert!(
        wait_for(Duration::from_secs(15), || app(&d, &b).is_none()
            && managed(&d, &c, s3.pid())),
        "{:?}",
        d.output()
    );
    assert!(
        !cgroups(s2.pid()).contains(&format!("qosd-{b}")),
        "{b} released: {}",
        cgroups(s2.pid())
    );
    assert!(cgroups(s3.pid()).contains(&format!("qosd-{c}")));
    assert!(managed(&d, &a, s1.pid()));
    assert_eq!(app(&d, &a).unwrap()["allocation"], before, "{a} untouched");
    assert!(d
        .output()
        .iter()
        .any(|l| l.contains(&format!("app {b}: left the config: released"))));
    let (status, out) = d.stop();
    assert!(status.success(), "{out:?}");
}
