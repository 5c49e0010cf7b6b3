//! Issue 15, item 8: two `qosd run` on one node with another port and
//! another state file but the same app name would write the same
//! `qosd-<app>` group. The second one refuses to start (exit 2, naming the
//! group and the first daemon's pid), changes nothing, and starts once the
//! first has gone (its lock goes with it, even on SIGKILL).

mod support;

use std::process::Command;
use std::time::Duration;

use support::daemon::{write_config, AppSpec, Daemon};
use support::*;

fn config(dir: &std::path::Path, port: u16, name: &str, pid: u32) -> std::path::PathBuf {
    write_config(
        dir,
        port,
        &[AppSpec {
            name,
            matcher: format!("{{ pid: {pid} }}"),
            target_us: None,
            feedback: "client",
            resources: "{ initial: { nr_cores: 1 } }",
        }],
    )
}

#[test]
fn a_second_daemon_with_the_same_app_refuses_to_start() {
    let app = Killed::sleeper(120);
    let name = format!("twice-{}", app.pid());
    let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (p1, p2) = (free_port(), free_port());
    let cpus = cpus_allowed(app.pid());
    let first = Daemon::start(&config(d1.path(), p1, &name, app.pid()), p1, &[]);
    let daemon_pid = first.child.id();
    // The first daemon puts the app in its group (where cgroup2 has cpuset).
    let grouped = wait_for(Duration::from_secs(5), || {
        cgroups(app.pid()).contains(&name)
    });
    let during = cpus_allowed(app.pid());

    let c2 = config(d2.path(), p2, &name, app.pid());
    let out = Command::new(QOSD)
        .args(["run", "--config"])
        .arg(&c2)
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&format!(
            "group qosd-{name} is managed by another running qosd"
        )) && err.contains(&format!("pid {daemon_pid}")),
        "{err}"
    );
    assert!(
        !d2.path().join("state.json").exists(),
        "the second changed nothing"
    );
    assert_eq!(cpus_allowed(app.pid()), during);
    if grouped {
        assert!(
            cgroups(app.pid()).contains(&name),
            "the app stays in the first's group"
        );
    }
    // A dry run changes nothing, so it may look on beside the first.
    let dry = Daemon::start(&c2, p2, &["--dry-run"]);
    drop(dry);

    // SIGKILL the first: the lock goes with it; `qosd restore` puts its
    // changes back, and a new daemon for the app starts.
    let mut first = first;
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    let out = qosd(&[
        "restore",
        "--state-file",
        d1.path().join("state.json").to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(wait_for(Duration::from_secs(5), || cpus_allowed(app.pid()) == cpus));
    let second = Daemon::start(&c2, p2, &[]);
    drop(second);
}
