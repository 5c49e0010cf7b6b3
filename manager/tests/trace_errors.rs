//! Bad input and missing kernel features: one clear line, the right exit
//! code, nothing loaded. (Root: the kernel features are hidden in a private
//! mount namespace; privileges are dropped with setpriv.)

mod support;

use std::process::Command;

use support::*;

fn stderr_of(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn unknown_pid_is_a_usage_error_naming_it() {
    let out = qosd(&["trace", "--pid", "999999999"]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr_of(&out);
    assert!(err.contains("no such process: pid 999999999"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

#[test]
fn bad_arguments_are_usage_errors() {
    for args in [
        &["trace"][..],
        &["trace", "--pid", "1", "--mode", "sometimes"],
        &["trace", "--pid", "1", "--interval", "0"],
        &["trace", "--pid", "1", "--ringbuf-kib", "3"],
        &["trace", "--pid", "notapid"],
    ] {
        let out = qosd(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr_of(&out));
    }
}

#[test]
fn without_privileges_it_says_root_is_needed() {
    // uid 0 but no capabilities at all: what an unprivileged run looks like
    // to the kernel.
    let out = Command::new("setpriv")
        .args(["--bounding-set=-all", "--inh-caps=-all", "--"])
        .args([QOSD, "trace", "--pid", &std::process::id().to_string()])
        .output()
        .expect("setpriv (util-linux)");
    assert_eq!(out.status.code(), Some(1), "{}", stderr_of(&out));
    let err = stderr_of(&out);
    assert!(
        err.contains("needs root") && err.contains("CAP_BPF"),
        "{err}"
    );
}

fn in_private_mounts(hide: &str) -> std::process::Output {
    let script = format!(
        "for d in {hide}; do [ -d $d ] && mount -t tmpfs qosd-test $d; done; exec \"$0\" trace --pid $$"
    );
    Command::new("unshare")
        .args([
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            &script,
            QOSD,
        ])
        .output()
        .expect("unshare (util-linux)")
}

#[test]
fn missing_tracefs_is_reported_with_the_fix() {
    let out = in_private_mounts("/sys/kernel/tracing /sys/kernel/debug");
    assert_eq!(out.status.code(), Some(1), "{}", stderr_of(&out));
    let err = stderr_of(&out);
    assert!(
        err.contains("tracefs is not mounted") && err.contains("mount -t tracefs"),
        "{err}"
    );
}

#[test]
fn missing_btf_is_reported() {
    let out = in_private_mounts("/sys/kernel/btf");
    assert_eq!(out.status.code(), Some(1), "{}", stderr_of(&out));
    let err = stderr_of(&out);
    assert!(err.contains("/sys/kernel/btf/vmlinux is missing"), "{err}");
}
