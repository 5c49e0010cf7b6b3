//! `qosd run` closing the loop on a real process (root): memcached starts
//! on 1 CPU, a load the test drives violates its p99 target, the daemon
//! gives it the second CPU (seen in every thread's Cpus_allowed_list), and
//! takes it back when the load stops; SIGTERM puts everything back. Once
//! with eBPF feedback, once with the test's client reporting latencies to
//! the API. Run alone: `cargo test -p qosd-manager --test daemon_real`.

mod support;

use std::time::Duration;

use support::*;

/// The closed loop on memcached with `feedback`; returns the daemon's
/// decisions seen while it ran.
fn closed_loop(feedback: &str) {
    let mc = support::memcached(4);
    let pid = mc.pid();
    let orig_cpus = thread_cpus(pid);
    let orig_cg = cgroups(pid);
    // A target the loaded server cannot meet on one CPU: the median of an
    // unloaded, one-request-at-a-time run (client-side, so it is above
    // the server-side median too).
    let target_us = percentile(&sequential_latencies(mc.port, 2000), 50.0).max(20.0);
    eprintln!("target p99 {target_us:.0} us");

    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let name = format!("mc-{feedback}-{pid}");
    let cfg = write_config(
        dir.path(),
        port,
        &[AppSpec {
            name: &name,
            matcher: format!("{{ pid: {pid} }}"),
            target_us: Some(target_us),
            feedback,
            resources: "{ initial: { nr_cores: 1 }, min: { nr_cores: 1 }, max: { nr_cores: 2 } }",
        }],
    );
    let d = Daemon::start(&cfg, port, &[]);
    assert!(
        wait_for(Duration::from_secs(10), || thread_cpus(pid)
            .iter()
            .all(|c| count_cpus(c) == 1)),
        "memcached not on 1 CPU: {:?}",
        thread_cpus(pid)
    );
    let app = d.get(&format!("/v1/apps/{name}"));
    assert_eq!(app["allocation"]["cores"], 1, "{app}");
    assert_eq!(app["feedback"], feedback);

    let report = (feedback == "client").then(|| (port, name.clone(), d.token()));
    let load = Load::start(mc.port, 8, Duration::from_secs(60), report);
    let upsized = wait_for(Duration::from_secs(40), || {
        thread_cpus(pid).iter().all(|c| count_cpus(c) == 2)
    });
    let during = d.get(&format!("/v1/apps/{name}"));
    let counts = load.stop();
    eprintln!("load: {counts:?}; app during load: {during}");
    assert!(
        upsized,
        "not moved to 2 CPUs under load: {:?}",
        thread_cpus(pid)
    );
    assert!(during["latency"]["rps"].as_f64().unwrap() > 0.0, "{during}");
    assert_eq!(during["allocation"]["cores"], 2, "{during}");
    if feedback == "client" {
        assert!(
            during["client_latencies_total"].as_u64().unwrap() > 0,
            "{during}"
        );
    }

    assert!(
        wait_for(Duration::from_secs(40), || thread_cpus(pid)
            .iter()
            .all(|c| count_cpus(c) == 1)),
        "not back to 1 CPU after the load: {:?}",
        thread_cpus(pid)
    );
    let dec = d.get(&format!("/v1/decisions?app={name}"));
    let list = dec["decisions"].as_array().unwrap();
    let up = list
        .iter()
        .find(|x| x["kind"] == "upsize" && x["resource"] == "cores")
        .unwrap_or_else(|| panic!("no upsize in {dec}"));
    assert_eq!(
        (up["from"].as_u64(), up["to"].as_u64()),
        (Some(1), Some(2)),
        "{up}"
    );
    assert_eq!(up["applied"], true, "{up}");
    assert!(up["reason"].as_str().unwrap().contains("slack"), "{up}");
    let down = list
        .iter()
        .rfind(|x| x["kind"] == "downsize" && x["resource"] == "cores")
        .unwrap_or_else(|| panic!("no downsize in {dec}"));
    assert_eq!(
        (down["from"].as_u64(), down["to"].as_u64()),
        (Some(2), Some(1))
    );
    let metrics = d.get_text("/metrics").1;
    assert!(
        metrics.contains(&format!(
            "qosd_decisions_total{{app=\"{name}\",resource=\"cores\",kind=\"upsize\"}}"
        )),
        "{metrics}"
    );

    let (st, out) = d.stop();
    assert!(st.success(), "qosd run: {st}; {out:?}");
    assert!(out.iter().any(|l| l.starts_with("restored ")), "{out:?}");
    assert_eq!(thread_cpus(pid), orig_cpus, "affinity not restored");
    assert_eq!(cgroups(pid), orig_cg, "cgroup not restored");
    let group = format!("/sys/fs/cgroup/cpuset/qosd-{name}");
    assert!(
        !std::path::Path::new(&group).exists(),
        "{group} left behind"
    );
    assert!(
        !dir.path().join("state.json").exists(),
        "state file left behind"
    );
}

#[test]
fn daemon_real_ebpf_feedback_upsizes_and_downsizes_memcached() {
    closed_loop("ebpf");
}

#[test]
fn daemon_real_client_feedback_upsizes_and_downsizes_memcached() {
    closed_loop("client");
}

/// An app matched by command name that starts after the daemon is picked
/// up and given its start allocation; when it exits it is released (its
/// cpuset group removed) while the daemon goes on.
#[test]
fn daemon_real_picks_up_a_late_app_and_releases_it_when_it_exits() {
    let dir = tempfile::tempdir().unwrap();
    let comm = format!("qdsleep{}", std::process::id() % 100_000);
    let exe = dir.path().join(&comm);
    std::fs::copy("/bin/sleep", &exe).unwrap();
    let port = free_port();
    let name = format!("late-{}", std::process::id());
    let cfg = write_config(
        dir.path(),
        port,
        &[AppSpec {
            name: &name,
            matcher: format!("{{ comm: {comm} }}"),
            target_us: None,
            feedback: "client",
            resources: "{ initial: { nr_cores: 1 } }",
        }],
    );
    let d = Daemon::start(&cfg, port, &[]);
    let a = d.get(&format!("/v1/apps/{name}"));
    assert_eq!(
        (a["running"].as_bool(), a["managed"].as_bool()),
        (Some(false), Some(false)),
        "{a}"
    );

    let mut child = std::process::Command::new(&exe).arg("60").spawn().unwrap();
    let pid = child.id();
    assert!(
        wait_for(Duration::from_secs(10), || {
            d.get(&format!("/v1/apps/{name}"))["managed"] == true
                && thread_cpus(pid).iter().all(|c| count_cpus(c) == 1)
        }),
        "late app not picked up: {} {:?}",
        d.get(&format!("/v1/apps/{name}")),
        thread_cpus(pid)
    );
    let a = d.get(&format!("/v1/apps/{name}"));
    assert_eq!(a["pids"][0].as_u64(), Some(u64::from(pid)), "{a}");
    let group = format!("/sys/fs/cgroup/cpuset/qosd-{name}");
    let had_group = std::path::Path::new(&group).exists();

    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        wait_for(Duration::from_secs(10), || d
            .get(&format!("/v1/apps/{name}"))["running"]
            == false),
        "exit not noticed"
    );
    assert!(
        wait_for(Duration::from_secs(5), || !std::path::Path::new(&group)
            .exists()),
        "{group} not removed after the app exited"
    );
    let a = d.get(&format!("/v1/apps/{name}"));
    assert_eq!(a["managed"], false, "{a}");
    let (st, out) = d.stop();
    assert!(st.success(), "{out:?}");
    assert!(out.iter().any(|l| l.contains("found pids")), "{out:?}");
    assert!(
        out.iter()
            .any(|l| l.contains("exited") && l.contains("released")),
        "{out:?}"
    );
    eprintln!("cpuset group was used: {had_group}");
}
