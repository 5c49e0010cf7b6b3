//! Where the kubelet puts a container's processes. Two cgroup drivers
//! name the same tree differently (QoS class under `kubepods`, then the
//! pod by uid, then the container by its runtime id):
//!
//! - `cgroupfs`: `kubepods/burstable/pod<uid>/<id>` (guaranteed pods sit
//!   directly under `kubepods`; CRI-O names the container `crio-<id>`);
//! - `systemd`: `kubepods.slice/kubepods-burstable.slice/
//!   kubepods-burstable-pod<uid with _>.slice/cri-containerd-<id>.scope`
//!   (`crio-<id>.scope`, `docker-<id>.scope`).
//!
//! The tree lies under the kubelet's `--cgroup-root` in the unified
//! hierarchy (cgroup v2 at `/sys/fs/cgroup`, or `/sys/fs/cgroup/unified`
//! on a hybrid host) or in each v1 hierarchy: the first directory that
//! exists is the container's.

use std::path::{Path, PathBuf};

use super::{ContainerId, QosClass};

/// cgroup mounts searched, in order: v2, hybrid v2, then v1 hierarchies
/// that every kubelet populates.
const MOUNTS: [&str; 6] = [
    "/sys/fs/cgroup",
    "/sys/fs/cgroup/unified",
    "/sys/fs/cgroup/systemd",
    "/sys/fs/cgroup/pids",
    "/sys/fs/cgroup/memory",
    "/sys/fs/cgroup/cpu,cpuacct",
];

fn qos_dir(q: QosClass) -> Option<&'static str> {
    match q {
        QosClass::Guaranteed => None,
        QosClass::Burstable => Some("burstable"),
        QosClass::BestEffort => Some("besteffort"),
    }
}

/// The container's directory relative to the cgroup root, for both
/// drivers: `[cgroupfs, systemd]`.
pub fn relative_paths(uid: &str, qos: QosClass, c: &ContainerId) -> [PathBuf; 2] {
    let mut fs = PathBuf::from("kubepods");
    if let Some(q) = qos_dir(qos) {
        fs.push(q);
    }
    fs.push(format!("pod{uid}"));
    fs.push(match c.runtime.as_str() {
        "cri-o" => format!("crio-{}", c.id),
        _ => c.id.clone(),
    });

    // systemd unit names cannot hold `-` inside a name part: the uid's
    // dashes become underscores.
    let u = uid.replace('-', "_");
    let mut sd = PathBuf::from("kubepods.slice");
    let pod_slice = match qos_dir(qos) {
        Some(q) => {
            sd.push(format!("kubepods-{q}.slice"));
            format!("kubepods-{q}-pod{u}.slice")
        }
        None => format!("kubepods-pod{u}.slice"),
    };
    sd.push(pod_slice);
    let scope = match c.runtime.as_str() {
        "cri-o" => "crio",
        "docker" => "docker",
        _ => "cri-containerd",
    };
    sd.push(format!("{scope}-{}.scope", c.id));
    [fs, sd]
}

/// The container's cgroup directory on this host (absolute, without the
/// root prefix), or None while the kubelet has not made it.
pub fn find(
    root: &Path,
    cgroup_root: &Path,
    uid: &str,
    qos: QosClass,
    c: &ContainerId,
) -> Option<PathBuf> {
    let rel = cgroup_root.strip_prefix("/").unwrap_or(cgroup_root);
    for m in MOUNTS {
        for p in relative_paths(uid, qos, c) {
            let abs = Path::new(m).join(rel).join(p);
            let on_host = root.join(abs.strip_prefix("/").unwrap_or(&abs));
            if on_host.join("cgroup.procs").is_file() {
                return Some(abs);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(rt: &str) -> ContainerId {
        ContainerId {
            runtime: rt.into(),
            id: "abc123".into(),
        }
    }

    #[test]
    fn both_drivers_every_qos_class_and_runtime() {
        let uid = "1f2e-33";
        let [fs, sd] = relative_paths(uid, QosClass::Burstable, &id("containerd"));
        assert_eq!(fs, Path::new("kubepods/burstable/pod1f2e-33/abc123"));
        assert_eq!(
            sd,
            Path::new(
                "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1f2e_33.slice/\
                 cri-containerd-abc123.scope"
            )
        );
        let [fs, sd] = relative_paths(uid, QosClass::Guaranteed, &id("cri-o"));
        assert_eq!(fs, Path::new("kubepods/pod1f2e-33/crio-abc123"));
        assert_eq!(
            sd,
            Path::new("kubepods.slice/kubepods-pod1f2e_33.slice/crio-abc123.scope")
        );
        let [fs, sd] = relative_paths(uid, QosClass::BestEffort, &id("docker"));
        assert_eq!(fs, Path::new("kubepods/besteffort/pod1f2e-33/abc123"));
        assert!(sd.ends_with("kubepods-besteffort-pod1f2e_33.slice/docker-abc123.scope"));
    }

    #[test]
    fn finds_the_directory_in_v1_or_v2_under_the_cgroup_root() {
        let d = tempfile::tempdir().unwrap();
        let c = id("containerd");
        let none = find(d.path(), Path::new("/"), "u-1", QosClass::Burstable, &c);
        assert_eq!(none, None);
        // A v1 host (cgroupfs driver): only the pids hierarchy has it here.
        let v1 = "sys/fs/cgroup/pids/node1/kubepods/burstable/podu-1/abc123";
        std::fs::create_dir_all(d.path().join(v1)).unwrap();
        std::fs::write(d.path().join(v1).join("cgroup.procs"), "").unwrap();
        let got = find(
            d.path(),
            Path::new("/node1"),
            "u-1",
            QosClass::Burstable,
            &c,
        );
        assert_eq!(got, Some(PathBuf::from("/").join(v1)));
        // The unified hierarchy comes first (systemd driver).
        let v2 = "sys/fs/cgroup/unified/node1/kubepods.slice/kubepods-burstable.slice/\
                  kubepods-burstable-podu_1.slice/cri-containerd-abc123.scope";
        std::fs::create_dir_all(d.path().join(v2)).unwrap();
        std::fs::write(d.path().join(v2).join("cgroup.procs"), "").unwrap();
        let got = find(
            d.path(),
            Path::new("/node1"),
            "u-1",
            QosClass::Burstable,
            &c,
        );
        assert_eq!(got, Some(PathBuf::from("/").join(v2)));
    }
}
