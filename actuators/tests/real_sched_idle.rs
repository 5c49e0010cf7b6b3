//! The CPU priority knob's last backend on this machine's real scheduler
//! (root): where the kernel offers no cpu group (forced here with
//! `QOSD_PRETEND_NO_PRIORITY_CGROUP=1`, as this machine has one), every
//! thread of a running `memcached -t 4` goes to `SCHED_IDLE`, a thread it
//! makes later and that runs at the normal policy is caught by the next
//! apply (what the daemon's reassert does), and restore puts every thread
//! back exactly (a thread made later: the main thread's original). Run
//! alone with `cargo test --release -p qosd-actuators --test real_sched_idle`.

mod common;

use common::memcached::{new_thread, start_memcached, tids};
use qosd_actuators::{schedpolicy, Actuators, Allocation, AppTarget, Config, Resource};
use qosd_core::knobs::PRIORITY_IDLE;

fn policies(pid: u32) -> Vec<(i32, String)> {
    tids(pid)
        .into_iter()
        // The policy part: the nice is the runner's (19 under `heavy`).
        .map(|t| {
            let p = schedpolicy::get(t).unwrap();
            (t, schedpolicy::policy_part(&p).to_owned())
        })
        .collect()
}

#[test]
fn real_sched_idle_fallback_covers_every_thread_and_restores_exactly() {
    // The only test of this binary: the variable reaches no other test.
    std::env::set_var(qosd_actuators::priority::PRETEND_NO_GROUPS_ENV, "1");
    let mc = start_memcached();
    let pid = mc.child.id();
    let original = policies(pid);
    assert!(original.len() >= 5, "memcached -t 4 has at least 5 threads");
    let d = tempfile::tempdir().unwrap();
    let state = d.path().join("s.json");
    let cfg = Config {
        state_file: Some(state.clone()),
        ..Config::default()
    };
    let mut a = Actuators::new(&cfg).unwrap();
    let caps = a.caps().get(Resource::CpuPriority);
    assert_eq!(caps.backend.as_deref(), Some("sched_idle"), "{caps:?}");

    let app = AppTarget::new("memcached", vec![pid as i32]);
    let idle = Allocation {
        cpu_priority: Some(PRIORITY_IDLE),
        ..Default::default()
    };
    a.apply(&app, &idle).unwrap();
    for (t, p) in policies(pid) {
        assert_eq!(p, schedpolicy::IDLE, "thread {t}");
    }
    assert_eq!(a.read(&app).unwrap().cpu_priority, Some(PRIORITY_IDLE));
    let journal = std::fs::read_to_string(&state).unwrap();
    assert!(journal.contains("\"sched\""), "{journal}");

    // A thread made later, at the normal policy (as an app that sets its
    // own threads' policy would): the next apply catches it.
    let t = new_thread(&mc);
    schedpolicy::set(t, schedpolicy::OTHER).unwrap();
    a.apply(&app, &idle).unwrap();
    assert_eq!(
        schedpolicy::policy_part(&schedpolicy::get(t).unwrap()),
        schedpolicy::IDLE,
        "new thread {t}"
    );

    a.restore_all().unwrap();
    let main_orig = original.iter().find(|(t, _)| *t == pid as i32).unwrap();
    for (t, p) in policies(pid) {
        let want = original.iter().find(|(o, _)| *o == t).unwrap_or(main_orig);
        assert_eq!(p, want.1, "thread {t} restored");
    }
    assert!(!state.exists(), "the state file goes with the last entry");
}
