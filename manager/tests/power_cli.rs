//! `qosd power` end to end. Tests named `root_*` load BPF (need root); run
//! them alone with `cargo test -p qosd-manager --test power_cli`.

mod support;

use std::fs;
use std::path::Path;

use support::Killed;

/// `qosd power ARGS...`.
fn power(args: &[&str]) -> std::process::Output {
    support::qosd(&[&["power"], args].concat())
}

fn json_lines(out: &[u8]) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

#[test]
fn power_cli_unknown_pid_is_a_usage_error() {
    let o = power(&["--pid", "2147483000", "--duration", "1"]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("--pid 2147483000: no such process"), "{err}");
}

#[test]
fn root_power_cli_json_model_figures_are_flagged() {
    let busy = Killed::busy();
    let pid = busy.pid().to_string();
    let o = power(&[
        "--source",
        "model",
        "--json",
        "--pid",
        &pid,
        "--duration",
        "2",
        "--interval",
        "1",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let lines = json_lines(&o.stdout);
    assert_eq!(lines.len(), 2);
    for v in &lines {
        assert_eq!(v["source"], "model");
        assert_eq!(v["energy_is_estimate"], true);
        let p = &v["processes"][0];
        assert_eq!(p["tgid"], busy.pid());
        assert!(p["power_w"].as_f64().unwrap() > 0.0);
        let threads = v["threads"].as_array().unwrap();
        assert!(threads.iter().all(|t| t["tgid"] == busy.pid()));
    }
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("ESTIMATE"), "{err}");
}

#[test]
fn root_power_cli_text_marks_every_estimate() {
    let busy = Killed::busy();
    let pid = busy.pid().to_string();
    let o = power(&[
        "--source",
        "model",
        "--pid",
        &pid,
        "--duration",
        "2",
        "--interval",
        "1",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8_lossy(&o.stdout);
    let intervals: Vec<&str> = out
        .lines()
        .filter(|l| l.contains("s  source model"))
        .collect();
    assert_eq!(intervals.len(), 2, "{out}");
    assert!(intervals.iter().all(|l| l.contains("ESTIMATE")), "{out}");
    let total = out.lines().last().unwrap();
    assert!(
        total.starts_with("total over") && total.contains("(ESTIMATE)"),
        "{total}"
    );
    assert!(total.contains(&format!("pid {pid} ")), "{total}");
    assert!(out.contains(&format!("{pid:>8} sh")), "{out}");
}

/// A fake root: this machine's CPU topology and one RAPL package zone.
fn fake_rapl_root() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    let src = Path::new("/sys/devices/system/cpu");
    let dst = d.path().join("sys/devices/system/cpu");
    fs::create_dir_all(&dst).unwrap();
    fs::copy(src.join("possible"), dst.join("possible")).unwrap();
    for e in fs::read_dir(src).unwrap().flatten() {
        let topo = e.path().join("topology");
        if !e.file_name().to_string_lossy().starts_with("cpu") || !topo.is_dir() {
            continue;
        }
        let t = dst.join(e.file_name()).join("topology");
        fs::create_dir_all(&t).unwrap();
        for f in ["physical_package_id", "thread_siblings_list"] {
            fs::copy(topo.join(f), t.join(f)).unwrap();
        }
    }
    let z = d.path().join("sys/class/powercap/intel-rapl:0");
    fs::create_dir_all(&z).unwrap();
    fs::write(z.join("name"), "package-0\n").unwrap();
    fs::write(z.join("max_energy_range_uj"), "262143328850\n").unwrap();
    fs::write(z.join("energy_uj"), "1000\n").unwrap();
    d
}

#[test]
fn root_power_cli_fake_rapl_is_labelled_rapl() {
    let root = fake_rapl_root();
    let o = power(&[
        "--root",
        root.path().to_str().unwrap(),
        "--json",
        "--duration",
        "1",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v = &json_lines(&o.stdout)[0];
    assert_eq!(v["source"], "rapl");
    assert_eq!(v["energy_is_estimate"], false);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("source rapl (powercap: package-0)"), "{err}");
}
