//! Issue 15, the command line: durations that used to panic, kernel
//! threads that `set` changed and `trace` accepted, and `load` against a
//! closed port. Each case runs the real binary and checks the exit code,
//! the message, and that nothing changed.

mod support;

use std::process::Output;

use support::*;

fn err(out: &Output) -> String {
    text(&out.stderr)
}

/// Exit 2 with one line naming `want`; never a panic (101).
fn usage_error(args: &[&str], want: &str) {
    let out = qosd(args);
    let e = err(&out);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {e}");
    assert!(e.contains(want), "{args:?}: {e}");
    assert!(!e.contains("panicked"), "{args:?}: {e}");
}

#[test]
fn huge_durations_and_intervals_are_usage_errors_not_panics() {
    let me = std::process::id().to_string();
    for (cmd, flag, v) in [
        ("trace", "--duration", "1e20"),
        ("trace", "--duration", "1e19"),
        ("trace", "--interval", "1e20"),
        ("trace", "--duration", "NaN"),
        ("trace", "--duration", "0"),
        ("power", "--duration", "1e19"),
        ("power", "--duration", "inf"),
        ("power", "--interval", "1e20"),
    ] {
        usage_error(
            &[cmd, "--pid", &me, flag, v],
            &format!("{flag} {}: expected seconds in", v.parse::<f64>().unwrap()),
        );
    }
    usage_error(
        &[
            "load",
            "--target",
            "127.0.0.1:9",
            "--protocol",
            "http",
            "--rps",
            "1",
            "--duration",
            "1e20",
        ],
        "--duration 100000000000000000000: expected seconds in (0, 86400]",
    );
    // An interval that wrapped to zero in ns: reported forever, sent nothing.
    usage_error(
        &[
            "load",
            "--target",
            "127.0.0.1:9",
            "--protocol",
            "http",
            "--rps",
            "1",
            "--duration",
            "1",
            "--intervals",
            "--interval-ms",
            "18446744073709551615",
        ],
        "--interval-ms 18446744073709551615: expected 1 to 3600000 ms",
    );
}

/// Pids of kernel threads on this machine: kthreadd and a ksoftirqd.
fn kernel_threads() -> Vec<(String, String)> {
    let mut v = vec![("2".to_owned(), "kthreadd".to_owned())];
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
        if name.parse::<u32>().is_ok() && comm.starts_with("ksoftirqd/") {
            v.push((name, comm.trim().to_owned()));
            break;
        }
    }
    assert_eq!(v.len(), 2, "no ksoftirqd thread found");
    v
}

#[test]
fn kernel_threads_are_refused_by_set_and_trace() {
    let d = tempfile::tempdir().unwrap();
    let state = d.path().join("s.json");
    let s = state.to_str().unwrap();
    for (pid, comm) in kernel_threads() {
        let before = cpus_allowed(pid.parse().unwrap());
        let want = format!("pid {pid} ({comm}) is a kernel thread");
        for backend in ["affinity", "auto"] {
            let out = qosd(&[
                "set",
                "--state-file",
                s,
                "cores",
                "--pid",
                &pid,
                "--cpus",
                "0",
                "--backend",
                backend,
            ]);
            if out.status.success() {
                // Old behaviour: put the kernel's thread back before failing.
                qosd(&["restore", "--state-file", s]);
            }
            let e = err(&out);
            assert_eq!(out.status.code(), Some(2), "set --pid {pid}: {e}");
            assert!(e.contains(&want), "{e}");
            assert!(!e.contains("rolling back"), "{e}");
        }
        assert_eq!(
            cpus_allowed(pid.parse().unwrap()),
            before,
            "{comm} untouched"
        );
        assert!(!state.exists(), "nothing recorded");
        usage_error(&["trace", "--pid", &pid, "--duration", "1"], &want);
    }
}

#[test]
fn load_with_no_listener_exits_2_naming_the_target_for_every_protocol() {
    // A port nothing listens on (bound, then closed).
    let port = free_port();
    let target = format!("127.0.0.1:{port}");
    for protocol in ["http", "memcache", "grpc"] {
        for extra in [&[][..], &["--keepalive"][..]] {
            let mut args = vec![
                "load",
                "--target",
                &target,
                "--protocol",
                protocol,
                "--rps",
                "50",
                "--duration",
                "0.5",
            ];
            args.extend_from_slice(extra);
            let out = qosd(&args);
            let e = err(&out);
            assert_eq!(out.status.code(), Some(2), "{protocol} {extra:?}: {e}");
            assert!(e.contains(&target), "{protocol} {extra:?}: {e}");
        }
    }
}

/// `qosd ... | head`: a reader that goes away ends qosd as it ends any
/// Unix tool, by SIGPIPE and silently, never with a panic; a real replay
/// would put its knobs back first (the command returns before it dies).
#[test]
fn a_closed_stdout_ends_quietly_by_sigpipe() {
    use std::os::unix::process::ExitStatusExt;
    use std::process::{Command, Stdio};
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("r");
    let out = out.to_str().unwrap();
    let cases: [&[&str]; 6] = [
        &["replay", "scenarios/ramp.yaml", "--sim", "--out", out],
        &[
            "replay",
            "scenarios/ramp.yaml",
            "--sim",
            "--duration",
            "10",
            "--seeds",
            "2",
            "--out",
            out,
        ],
        &["caps"],
        &["check", "config.yaml", "policies/parties.yaml"],
        &["compare", &format!("{out}/seed-1"), "--out", out],
        &["trace", "--pid", "1", "--duration", "2"],
    ];
    for args in cases {
        let child = Command::new(QOSD)
            .current_dir(repo())
            .args(args)
            .stdout(Stdio::from(reader_gone_pipe()))
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let o = child.wait_with_output().unwrap();
        let stderr = text(&o.stderr);
        assert_eq!(
            o.status.signal(),
            Some(libc::SIGPIPE),
            "qosd {args:?}: {:?}\n{stderr}",
            o.status
        );
        assert!(
            !stderr.contains("panicked") && !stderr.contains("error"),
            "qosd {args:?}: {stderr}"
        );
    }
}

/// The writing end of a pipe whose reading end is closed everywhere: in
/// this process at once, and in any child another test thread forked
/// meanwhile once it has exec'd (close-on-exec), which poll's POLLERR on
/// the writing end tells.
fn reader_gone_pipe() -> std::os::fd::OwnedFd {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let mut fds = [0; 2];
    // SAFETY: a two-int array for pipe2 to fill.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: both fds were just made by pipe2 and are owned here.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    drop(r);
    let gone = wait_for(std::time::Duration::from_secs(5), || {
        let mut p = libc::pollfd {
            fd: w.as_raw_fd(),
            events: 0,
            revents: 0,
        };
        // SAFETY: one valid pollfd, zero timeout.
        unsafe { libc::poll(&mut p, 1, 0) == 1 && p.revents & libc::POLLERR != 0 }
    });
    assert!(gone, "the pipe's reading end stayed open");
    w
}

/// A negative number reaches the value's own check (exit 2 naming the
/// range), not clap's "unexpected argument '-5'"; nothing is changed and
/// no state file is written.
#[test]
fn negative_numbers_are_named_with_their_range() {
    let sleeper = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .expect("sleep");
    let pid = sleeper.id().to_string();
    let dir = std::env::temp_dir().join(format!("qosd-neg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp");
    let state = dir.join("state.json");
    let sf = state.to_str().expect("utf-8");
    // Each case as typed ({pid}: a live process; {sf}: a state file that
    // must not appear) and what its error must say.
    let secs = "expected seconds in";
    let cases = [
        ("trace --pid {pid} --duration -5", "--duration -5: expected seconds in (0,"),
        ("trace --pid {pid} --interval -1", secs),
        ("power --pid {pid} --duration -5", secs),
        ("power --pid {pid} --interval -1", secs),
        ("net --duration -5", secs),
        ("load --target 127.0.0.1:9 --protocol http --rps -5", "rps -5 must be in (0,"),
        (
            "load --target 127.0.0.1:9 --protocol http --rps 5 --duration -1",
            "--duration -1: expected seconds in (0, 86400]",
        ),
        (
            "set --state-file {sf} quota --pid {pid} --quota -1",
            "--quota: -1 is not a positive number of CPUs",
        ),
        (
            "set --state-file {sf} quota --pid {pid} --quota 1e9",
            "--quota: 1e9 CPUs is more than this machine's online CPUs",
        ),
        (
            "set --state-file {sf} level cpu_quota --pid {pid} --level -5",
            "-5 is not in 0..=",
        ),
        ("set --state-file {sf} freq --cpus 0 --mhz -5", "-5 is not in 0..="),
        // A config resource name given as a knob: the knobs set by a level
        // are listed.
        (
            "set --state-file {sf} level nr_cores --pid {pid} --level 1",
            "is not a knob set by a level: one of frequency, cache_ways, memory_bandwidth, cpu_quota",
        ),
    ];
    let cgroup_before = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).expect("cgroup");
    for (line, want) in cases {
        let line = line.replace("{pid}", &pid).replace("{sf}", sf);
        let args: Vec<&str> = line.split_whitespace().collect();
        // Each flag's own check, not clap's "unexpected argument '-5'".
        usage_error(&args, want);
    }
    let cgroup_after = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).expect("cgroup");
    let mut sleeper = sleeper;
    sleeper.kill().ok();
    sleeper.wait().ok();
    assert!(!state.exists(), "a refused set wrote {}", state.display());
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(
        cgroup_before, cgroup_after,
        "a refused set moved the process"
    );
}
