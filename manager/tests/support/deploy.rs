//! Shared by the deployment tests: `make install` into a temp DESTDIR, the
//! systemd unit's settings read from the installed file, and a runner that
//! executes a unit's command line the way systemd would here: in a private
//! mount namespace where the installed tree is bound over /etc/qosd,
//! /usr/local/bin and /run/qosd, with only the unit's capabilities.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use super::{repo, text, QOSD};

/// `make install DESTDIR=dest QOSD_BIN=<the binary cargo test built>` plus
/// `extra` make variables; panics with make's output on failure.
pub fn make_install(dest: &Path, extra: &[&str]) -> Output {
    let out = Command::new("make")
        .current_dir(repo())
        .args(["--no-print-directory", "install"])
        .arg(format!("DESTDIR={}", dest.display()))
        .arg(format!("QOSD_BIN={QOSD}"))
        .args(extra)
        .output()
        .expect("running make (apt-get install make)");
    assert!(
        out.status.success(),
        "make install failed\nstdout:\n{}\nstderr:\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    out
}

/// The `[Service]` (and other) settings of a unit file: key → values in
/// file order. Only the syntax the shipped unit uses is accepted; anything
/// else (quotes, specifiers, continuation lines) fails the test rather
/// than being parsed wrongly.
pub fn unit_settings(path: &Path) -> BTreeMap<String, Vec<String>> {
    let s = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (n, line) in s.lines().enumerate() {
        let l = line.trim();
        if l.is_empty() || l.starts_with('#') || l.starts_with(';') || l.starts_with('[') {
            continue;
        }
        assert!(
            !l.ends_with('\\') && !l.contains('"') && !l.contains('%') && !l.contains('$'),
            "{}:{}: syntax this test's parser does not handle: {l}",
            path.display(),
            n + 1
        );
        let (k, v) = l
            .split_once('=')
            .unwrap_or_else(|| panic!("{}:{}: not KEY=VALUE", path.display(), n + 1));
        out.entry(k.to_owned()).or_default().push(v.to_owned());
    }
    out
}

/// One `Exec*=` command line split into argv (no `-@+!:` prefixes are
/// used by the shipped unit; one would fail here).
pub fn exec_argv(settings: &BTreeMap<String, Vec<String>>, key: &str) -> Vec<String> {
    let v = settings
        .get(key)
        .unwrap_or_else(|| panic!("the unit has no {key}="));
    assert_eq!(v.len(), 1, "one {key}= line expected");
    let argv: Vec<String> = v[0].split_whitespace().map(str::to_owned).collect();
    assert!(
        argv[0].starts_with('/'),
        "{key}: {} is not an absolute path without prefix",
        argv[0]
    );
    argv
}

/// `CapabilityBoundingSet=CAP_BPF CAP_X` → `-all,+bpf,+x` for setpriv.
pub fn bounding_set(settings: &BTreeMap<String, Vec<String>>) -> String {
    let caps = settings
        .get("CapabilityBoundingSet")
        .expect("the unit sets CapabilityBoundingSet");
    let mut out = String::from("-all");
    for c in caps.iter().flat_map(|l| l.split_whitespace()) {
        let name = c
            .strip_prefix("CAP_")
            .unwrap_or_else(|| panic!("capability {c}"));
        out.push_str(&format!(",+{}", name.to_ascii_lowercase()));
    }
    out
}

/// Mount points the namespace binds over; created (empty) on the host if
/// missing and removed again on drop, so the host is left as found.
pub struct UnitNs {
    pub inst: PathBuf,
    caps: String,
    /// The unit's LimitNOFILE, applied with prlimit.
    nofile: Option<String>,
    created: Vec<PathBuf>,
    // Tests of one binary run in parallel; they share the mount points.
    _one_at_a_time: std::sync::MutexGuard<'static, ()>,
}

static NS_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// (installed path under DESTDIR, host path it is bound over)
const BINDS: [(&str, &str); 3] = [
    ("etc/qosd", "/etc/qosd"),
    ("usr/local/bin", "/usr/local/bin"),
    ("run/qosd", "/run/qosd"),
];

impl UnitNs {
    pub fn new(inst: &Path, settings: &BTreeMap<String, Vec<String>>) -> UnitNs {
        let guard = NS_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let mut created = Vec::new();
        for (_, host) in BINDS {
            let p = Path::new(host);
            if !p.exists() {
                std::fs::create_dir_all(p).unwrap_or_else(|e| panic!("mkdir {host}: {e}"));
                created.push(p.to_owned());
            }
        }
        UnitNs {
            inst: inst.to_owned(),
            caps: bounding_set(settings),
            nofile: settings.get("LimitNOFILE").and_then(|v| v.last().cloned()),
            created,
            _one_at_a_time: guard,
        }
    }

    /// `argv` run as the unit would run it: in its own mount namespace
    /// with the installed files in place, `NoNewPrivileges`, root limited
    /// to the unit's bounding set, and its LimitNOFILE.
    pub fn command(&self, argv: &[String]) -> Command {
        let mut script = String::from("set -e\n");
        for (i, (_, host)) in BINDS.iter().enumerate() {
            script.push_str(&format!("mount --bind \"${}\" {host}\n", i + 1));
        }
        // prlimit execs its command (no fork): the pid stays the daemon's.
        let limit = self
            .nofile
            .as_ref()
            .map_or(String::new(), |n| format!("prlimit --nofile={n}:{n} "));
        script.push_str(&format!(
            "shift {}\nexec {limit}setpriv --no-new-privs --inh-caps=-all --bounding-set={} -- \"$@\"\n",
            BINDS.len(),
            self.caps
        ));
        let mut c = Command::new("unshare");
        c.args(["--mount", "--propagation", "private", "--", "sh", "-c"])
            .arg(script)
            .arg("sh");
        for (inst, _) in BINDS {
            c.arg(self.inst.join(inst));
        }
        c.args(argv);
        c
    }
}

impl Drop for UnitNs {
    fn drop(&mut self) {
        for p in self.created.iter().rev() {
            let _ = std::fs::remove_dir(p);
        }
    }
}
