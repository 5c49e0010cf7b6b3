//! `qosd run` with a best-effort app whose batch job the daemon runs
//! (root, real cgroups, real processes): beside an idle memcached (a
//! latency-critical app with slack to give), PARTIES moves CPU quota from
//! memcached to the job, and the job's throughput in `/metrics`
//! (`qosd_app_be_ops_per_second`) rises with it; when memcached violates
//! its target the quota is taken back and the throughput falls. A job
//! killed is started again. On SIGTERM the job is
//! stopped and every group qosd made is gone; after a SIGKILL the job
//! dies with the daemon and `qosd restore` removes the groups. Run alone:
//! `cargo test --release -p qosd-manager --test daemon_be`.

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::*;

/// A config: memcached (`pid`) as an lc app with client feedback holding
/// 1.9 CPU of quota, the job 0.02 CPU; only the quota knob, deciding every
/// 500 ms, PARTIES moving 0.2 CPU a step. The job starts far below what
/// it would get anyway on a busy machine (CFS shares the CPUs with
/// everything else), so its quota is what limits it.
///
/// PARTIES as published: `downsize_below_util` off. That rule gives an LC
/// app's unused CPU back inside the hysteresis band, and this memcached,
/// serving nothing, is at U 0.00 there (its CPU clock reads its few µs of
/// housekeeping), so it would give quota to the job in phase 1; this test
/// is about slack (in the band: nothing moves; idle: the job gets it).
fn config(dir: &Path, port: u16, lc: &str, be: &str, pid: u32) -> std::path::PathBuf {
    let policy = std::fs::read_to_string(parties())
        .unwrap()
        .replace("cpu_quota_milli: 0", "cpu_quota_milli: 200")
        .replace("downsize_below_util: 0.5", "downsize_below_util: null");
    assert!(policy.contains("cpu_quota_milli: 200"));
    assert!(policy.contains("downsize_below_util: null"));
    std::fs::write(dir.join("policy.yaml"), policy).unwrap();
    let y = format!(
        "apps:
  - name: {lc}
    match: {{ pid: {pid} }}
    class: lc
    target: {{ p99: 1ms }}
    feedback: client
    resources: {{ initial: {{ cpu_quota_milli: 1900 }}, min: {{ cpu_quota_milli: 100 }} }}
  - name: {be}
    class: be
    job: {{ kind: hash, threads: 1 }}
    resources: {{ initial: {{ cpu_quota_milli: 20 }} }}
policy: policy.yaml
monitor_interval_ms: 100
decide_interval_ms: 500
actuators:
  enabled: [cpu_quota]
  cpu_quota_unit_milli: 10
api:
  listen: 127.0.0.1:{port}
  token_file: {dir}/api.token
state_file: {dir}/state.json
",
        dir = dir.display(),
    );
    let p = dir.join("config.yaml");
    std::fs::write(&p, y).unwrap();
    p
}

/// `qosd_app_be_ops_per_second{app="APP"}` in a /metrics text.
fn be_ops(metrics: &str, app: &str) -> Option<f64> {
    let prefix = format!("qosd_app_be_ops_per_second{{app=\"{app}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.parse().ok())
}

/// The groups named `group` in any cgroup hierarchy (v1 controllers and
/// the unified one).
fn groups_named(group: &str) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/sys/fs/cgroup").unwrap().flatten() {
        let p = e.path().join(group);
        if p.is_dir() {
            out.push(p.display().to_string());
        }
    }
    out
}

/// True once `pid` is gone or a zombie (its parent, the dead daemon, can
/// no longer reap it; a container's init may not either).
fn dead(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(s) => s
            .rsplit_once(')')
            .and_then(|(_, r)| r.split_whitespace().next())
            .is_some_and(|st| st == "Z" || st == "X"),
    }
}

fn job_pid(d: &Daemon, be: &str) -> u32 {
    let mut pid = 0;
    assert!(
        wait_for(Duration::from_secs(10), || {
            let a = d.get(&format!("/v1/apps/{be}"));
            pid = a["pids"][0].as_u64().unwrap_or(0) as u32;
            pid > 0 && a["managed"] == true
        }),
        "the job never ran managed: {:?}",
        d.output()
    );
    pid
}

fn quota(d: &Daemon, app: &str) -> u64 {
    let a: Value = d.get(&format!("/v1/apps/{app}"));
    a["allocation"]["cpu_quota_milli"].as_u64().unwrap_or(0)
}

#[test]
fn freed_quota_goes_to_the_batch_job_and_its_throughput_rises() {
    let mc = memcached(1);
    let pid = mc.pid();
    let orig_cg = cgroups(pid);
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let (lc, be) = (format!("idle-{pid}"), format!("batch-{pid}"));
    let cfg = config(dir.path(), port, &lc, &be, pid);
    let d = Daemon::start(&cfg, port, &[]);
    let job = job_pid(&d, &be);
    let group = format!("qosd-{be}");
    assert!(cgroups(job).contains(&group), "{}", cgroups(job));

    // Phase 1, 3 s: memcached reports 0.9 ms against its 1 ms target
    // (slack 0.1, inside PARTIES' band): nothing moves, the job keeps its
    // 0.02 CPU. Phase 2: the reports stop, memcached is idle (slack 1),
    // each decision takes 0.2 CPU from it and frees it to the job.
    let token = d.token();
    let auth = format!("Bearer {token}");
    let mut low = Vec::new();
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(3) {
        let body = format!("{{\"latencies_us\": [{}]}}", ["900"; 20].join(","));
        let (code, v) = d.post_auth(&format!("/v1/apps/{lc}/latency"), &body, Some(&auth));
        assert_eq!(code, 200, "{v}");
        low.push(be_ops(&d.get_text("/metrics").1, &be));
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        quota(&d, &be),
        20,
        "nothing moves while memcached meets its target"
    );
    // Figures of the last 1.5 s (the job's start-up is over by then).
    let low: Vec<f64> = low[low.len() - 15..].iter().flatten().copied().collect();
    let low_max = low.iter().copied().fold(0.0, f64::max);
    let mut high = Vec::new();
    let mut last = None;
    let t1 = Instant::now();
    while t1.elapsed() < Duration::from_secs(20) && high.len() < 4 {
        let ops = be_ops(&d.get_text("/metrics").1, &be);
        // Figures read after the job held 0.4 CPU for a whole interval.
        if quota(&d, &be) >= 420 {
            if last.is_none() {
                last = Some(Instant::now());
            }
            if last.is_some_and(|t| t.elapsed() > Duration::from_millis(600)) {
                if let Some(v) = ops.filter(|v| high.last() != Some(v)) {
                    high.push(v);
                }
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let app = d.get(&format!("/v1/apps/{be}"));
    let decisions = d.get("/v1/decisions");
    eprintln!("ops/s at 0.02 CPU: {low:.0?}\nops/s at >= 0.42 CPU: {high:.0?}\nbe app: {app}");
    assert_eq!(high.len(), 4, "the job never held 0.42 CPU: {decisions}");
    let grants: Vec<&Value> = decisions["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|x| x["app"] == be.as_str() && x["kind"] == "grant" && x["applied"] == true)
        .collect();
    assert!(grants.len() >= 2, "{decisions}");
    assert_eq!(grants[0]["from"], 20, "{decisions}");
    // The LC app gave its quota to the job: at most 1.5 CPU, or uncapped
    // (its quota at the node's 2 CPUs: BE quota first lifts an LC app's
    // cap, and a cap at the ceiling takes nothing from the pool).
    let q = quota(&d, &lc);
    assert!(q <= 1500 || q >= 2000, "{q}");
    let mut sorted = high.clone();
    sorted.sort_by(f64::total_cmp);
    let high_median = (sorted[1] + sorted[2]) / 2.0;
    eprintln!(
        "batch job: at most {low_max:.0} ops/s at 0.02 CPU, median {high_median:.0} ops/s at {} \
         milli-CPU ({:.1}x)",
        quota(&d, &be),
        high_median / low_max
    );
    assert!(low_max > 0.0, "no progress measured at 0.02 CPU: {low:?}");
    assert!(
        high_median >= 3.0 * low_max,
        "throughput did not follow the quota: {low:?} then {high:?}"
    );
    // The CPU it got, from the kernel's count.
    assert!(app["cpu_seconds_total"].as_f64().unwrap() > 0.1, "{app}");

    // Phase 3: memcached reports 5 ms against its 1 ms target; PARTIES
    // upsizes it with quota taken from the best-effort job first, and the
    // job's throughput falls with it.
    let mut taken = Vec::new();
    let mut low_at = None;
    let t2 = Instant::now();
    while t2.elapsed() < Duration::from_secs(25) && taken.len() < 3 {
        let body = format!("{{\"latencies_us\": [{}]}}", ["5000"; 20].join(","));
        let (code, v) = d.post_auth(&format!("/v1/apps/{lc}/latency"), &body, Some(&auth));
        assert_eq!(code, 200, "{v}");
        let ops = be_ops(&d.get_text("/metrics").1, &be);
        if quota(&d, &be) <= 100 {
            let since = *low_at.get_or_insert_with(Instant::now);
            if since.elapsed() > Duration::from_millis(600) {
                if let Some(v) = ops.filter(|v| taken.last() != Some(v)) {
                    taken.push(v);
                }
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let decisions = d.get("/v1/decisions?limit=100");
    eprintln!("ops/s after memcached took the quota back: {taken:.0?}");
    assert_eq!(taken.len(), 3, "the job kept its quota: {decisions}");
    assert!(
        decisions["decisions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x["app"] == be.as_str() && x["kind"] == "reclaim"),
        "{decisions}"
    );
    taken.sort_by(f64::total_cmp);
    assert!(
        taken[1] * 3.0 <= high_median,
        "throughput did not fall with the quota: {high:?} then {taken:?}"
    );

    // A job that dies is started again (after 1 s) and admitted again.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(job as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let mut again = 0;
    assert!(
        wait_for(Duration::from_secs(10), || {
            let a = d.get(&format!("/v1/apps/{be}"));
            again = a["pids"][0].as_u64().unwrap_or(0) as u32;
            again != 0 && again != job && a["managed"] == true
        }),
        "the job was not restarted: {:?}",
        d.output()
    );
    assert!(cgroups(again).contains(&group), "{}", cgroups(again));
    assert!(
        d.output()
            .iter()
            .any(|l| l.contains(&format!("its job (pid {job}) ended after"))),
        "{:?}",
        d.output()
    );
    let job = again;

    // SIGTERM: the job is stopped and reaped, the groups are gone, and
    // memcached is back where it was.
    let (st, out) = d.stop();
    assert!(st.success(), "{st}: {out:?}");
    assert!(
        out.iter().any(|l| l.contains("stopped its batch job")),
        "{out:?}"
    );
    assert!(dead(job), "the job outlived the daemon");
    assert_eq!(groups_named(&group), Vec::<String>::new());
    assert_eq!(groups_named(&format!("qosd-{lc}")), Vec::<String>::new());
    assert_eq!(cgroups(pid), orig_cg);

    // SIGKILL: the job dies with the daemon; `qosd restore` puts the
    // rest back from the state file.
    let mut d = Daemon::start(&cfg, port, &[]);
    let job = job_pid(&d, &be);
    assert!(!groups_named(&group).is_empty());
    d.child.kill().unwrap();
    d.child.wait().unwrap();
    assert!(
        wait_for(Duration::from_secs(5), || dead(job)),
        "the job outlived a SIGKILLed daemon"
    );
    let out = qosd(&["restore", "--config", cfg.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(groups_named(&group), Vec::<String>::new());
    assert_eq!(cgroups(pid), orig_cg);
}
