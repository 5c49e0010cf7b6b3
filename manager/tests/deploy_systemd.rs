//! The install path and the systemd unit: `make install` into a temp
//! DESTDIR lays out what README says, and `systemd-analyze verify` accepts
//! the installed unit. The unit's command lines run with only its
//! capabilities in `deploy_systemd_caps.rs`. Needs root and the Debian
//! packages `systemd`, `make`.

mod support;

use std::process::Command;

use support::*;

#[test]
fn make_install_lays_out_every_file() {
    let d = tempfile::tempdir().unwrap();
    let out = make_install(d.path(), &[]);
    let i = |p: &str| d.path().join(p.trim_start_matches('/'));
    let same = |installed: &str, src: &str| {
        assert_eq!(
            std::fs::read(i(installed)).unwrap(),
            std::fs::read(repo().join(src)).unwrap(),
            "{installed} differs from {src}"
        );
    };
    same("/usr/local/bin/qosd", QOSD);
    same("/etc/qosd/config.yaml", "config.yaml");
    for e in std::fs::read_dir(repo().join("policies")).unwrap() {
        let name = e.unwrap().file_name().into_string().unwrap();
        same(
            &format!("/etc/qosd/policies/{name}"),
            &format!("policies/{name}"),
        );
    }
    assert!(i("/run/qosd").is_dir());
    // The installed config is the one `qosd check` (the unit's
    // ExecStartPre) validates, policy found relative to it.
    let chk = Command::new(QOSD)
        .arg("check")
        .arg(i("/etc/qosd/config.yaml"))
        .output()
        .unwrap();
    assert!(chk.status.success(), "{}", text(&chk.stderr));
    assert!(text(&chk.stdout).contains("/etc/qosd/policies/parties.yaml"));
    // Unit, man pages, completions.
    same(
        "/usr/local/lib/systemd/system/qosd.service",
        "deploy/systemd/qosd.service",
    );
    let man = i("/usr/local/share/man/man1");
    for page in [
        "qosd.1",
        "qosd-check.1",
        "qosd-restore.1",
        "qosd-completions.1",
    ] {
        let roff = std::fs::read_to_string(man.join(page)).unwrap();
        assert!(roff.starts_with(".ie \\n(.g .ds Aq"), "{page} is not roff");
        assert!(roff.contains(".SH NAME"), "{page}");
    }
    let bash =
        std::fs::read_to_string(i("/usr/local/share/bash-completion/completions/qosd")).unwrap();
    assert!(bash.contains("complete -F _qosd"), "bash completion");
    let zsh = std::fs::read_to_string(i("/usr/local/share/zsh/site-functions/_qosd")).unwrap();
    assert!(zsh.starts_with("#compdef qosd"));
    let fish =
        std::fs::read_to_string(i("/usr/local/share/fish/vendor_completions.d/qosd.fish")).unwrap();
    assert!(fish.contains("complete -c qosd"));
    assert!(text(&out.stdout).contains("systemctl start qosd"));
}

#[test]
fn make_install_keeps_an_edited_config_and_honours_prefix() {
    let d = tempfile::tempdir().unwrap();
    let conf = d.path().join("etc/qosd/config.yaml");
    std::fs::create_dir_all(conf.parent().unwrap()).unwrap();
    std::fs::write(&conf, "# edited by the operator\napps: []\n").unwrap();
    let out = make_install(d.path(), &["PREFIX=/usr"]);
    assert_eq!(
        std::fs::read_to_string(&conf).unwrap(),
        "# edited by the operator\napps: []\n"
    );
    assert_eq!(
        std::fs::read(d.path().join("etc/qosd/config.yaml.new")).unwrap(),
        std::fs::read(repo().join("config.yaml")).unwrap()
    );
    assert!(text(&out.stdout).contains("kept "), "{}", text(&out.stdout));
    // PREFIX=/usr: binary and unit under /usr, unit rewritten to match.
    assert!(d.path().join("usr/bin/qosd").is_file());
    let unit = d.path().join("usr/lib/systemd/system/qosd.service");
    let s = unit_settings(&unit);
    assert_eq!(exec_argv(&s, "ExecStart")[0], "/usr/bin/qosd");
    assert_eq!(exec_argv(&s, "ExecStopPost")[0], "/usr/bin/qosd");
    // Uninstall removes what install put, keeps the config unless PURGE=1.
    let un = Command::new("make")
        .current_dir(repo())
        .args(["--no-print-directory", "uninstall", "PREFIX=/usr"])
        .arg(format!("DESTDIR={}", d.path().display()))
        .output()
        .unwrap();
    assert!(un.status.success(), "{}", text(&un.stderr));
    assert!(!d.path().join("usr/bin/qosd").exists());
    assert!(!unit.exists());
    assert!(!d.path().join("usr/share/man/man1/qosd.1").exists());
    assert!(conf.exists());
}

/// `systemd-analyze verify` with the installed tree as root: it checks
/// every key, that each Exec binary exists and is executable, and the
/// man page named in Documentation=. Warnings fail the test too.
#[test]
fn systemd_analyze_verifies_the_installed_unit() {
    let d = tempfile::tempdir().unwrap();
    make_install(d.path(), &[]);
    // verify loads the unit's dependencies (sysinit.target, ...) from the
    // root: give it the distribution's units.
    let units = d.path().join("usr/lib/systemd");
    std::fs::create_dir_all(&units).unwrap();
    let cp = Command::new("cp")
        .args(["-a", "/usr/lib/systemd/system"])
        .arg(&units)
        .status()
        .unwrap();
    assert!(cp.success());
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(format!("--root={}", d.path().display()))
        .arg("qosd.service")
        .env("MANPATH", d.path().join("usr/local/share/man"))
        .output()
        .expect("systemd-analyze (apt-get install systemd)");
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        text(&out.stdout),
        text(&out.stderr)
    );
    // The same unit with a typo'd key does produce a complaint, so the
    // empty stderr above means something.
    let unit = d.path().join("usr/local/lib/systemd/system/qosd.service");
    let s = std::fs::read_to_string(&unit).unwrap();
    std::fs::write(&unit, s.replace("ProtectHome=", "ProtectHomes=")).unwrap();
    let bad = Command::new("systemd-analyze")
        .arg("verify")
        .arg(format!("--root={}", d.path().display()))
        .arg("qosd.service")
        .env("MANPATH", d.path().join("usr/local/share/man"))
        .output()
        .unwrap();
    assert!(
        text(&bad.stderr).contains("Unknown key 'ProtectHomes'"),
        "{}",
        text(&bad.stderr)
    );
}
